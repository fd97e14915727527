//! Signals of abuse read from the traffic itself, per rule, each in bounded memory:
//! machine-regular keys ([`regular`]), denials by subnet ([`subnet`]) and denial
//! spikes of sensitive rules ([`spike`]).

pub(super) mod gauges;
pub mod regular;
pub mod spike;
pub mod subnet;
