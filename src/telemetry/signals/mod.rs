//! Signals of abuse read from the traffic itself, per rule, each in bounded memory:
//! machine-regular keys ([`regular`]).

pub mod regular;
