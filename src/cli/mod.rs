//! Subcommands that talk to a running sluice (or read its policy) for an operator.

pub mod connect;
pub mod explain;
pub mod probe;
pub mod top;
