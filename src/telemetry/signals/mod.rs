//! Signals of abuse read from the traffic itself, per rule, each in bounded memory:
//! machine-regular keys ([`regular`]) and denials by subnet ([`subnet`]).

pub mod regular;
pub mod subnet;
