//! The store contract on the memory store, on a manual clock.

use crate::common;

use std::sync::Arc;

use sluice::algorithm::SECOND;
use sluice::clock::ManualClock;
use sluice::store::MemoryStore;

common::contract::store_contract!(MemoryStore::new(
    Arc::new(ManualClock::new(1_000 * SECOND)),
    1000
));
