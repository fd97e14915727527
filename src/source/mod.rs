//! Policy sources. Each builds a complete compiled policy and swaps it in whole; the
//! request path only ever loads the current `Arc<Policy>` (no lock).

pub mod file;
