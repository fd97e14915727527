//! Builders for the stores' unit tests.

use crate::algorithm::{Algorithm, Limit, Micros, SECOND};

use super::{Fallback, Hit, Mode, Spend};

pub const HOUR: Micros = 3600 * SECOND;

/// A limit of `requests` an hour.
pub fn hourly(algorithm: Algorithm, requests: u64) -> Limit {
    Limit {
        algorithm,
        requests,
        window: HOUR,
        burst: requests,
        phase: 0,
    }
}

/// A hit of `hits` on `key` under `limit`, spent as `spend`, denied while its
/// store is away.
pub fn hit_of(key: &str, limit: Limit, hits: u64, spend: Spend) -> Hit {
    Hit {
        key: key.to_string(),
        placement: 0,
        limit,
        hits,
        mode: Mode::Enforce,
        spend,
        fallback: Fallback::Deny,
        max_delay: crate::algorithm::NO_DEADLINE,
    }
}

/// A hit on `key` with a per-minute limit of `requests`.
pub fn hit(key: &str, algorithm: Algorithm, requests: u64, hits: u64) -> Hit {
    Hit {
        key: key.to_string(),
        placement: crate::hash::stable_hash(key.as_bytes()),
        limit: Limit {
            algorithm,
            requests,
            window: 60 * SECOND,
            burst: requests,
            phase: 0,
        },
        hits,
        mode: Mode::Enforce,
        spend: Spend::IfAdmitted,
        fallback: Default::default(),
        max_delay: crate::algorithm::NO_DEADLINE,
    }
}

/// Runs `tasks` futures made by `task` (given their number) on a multi-thread
/// runtime of four workers, as several Envoy workers' calls arrive; their outputs.
/// Panics as a task did, or if they have not all finished within a minute (a
/// deadlock), waited for from outside the runtime, whose timers a deadlocked
/// worker would stop.
pub fn on_workers<T, F>(tasks: usize, task: impl Fn(usize) -> F + Send + 'static) -> Vec<T>
where
    T: Send + 'static,
    F: std::future::Future<Output = T> + Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::channel();
    let runner = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .build()
            .expect("a runtime");
        let out = runtime.block_on(async {
            let handles: Vec<_> = (0..tasks).map(|i| tokio::spawn(task(i))).collect();
            let mut out = Vec::with_capacity(tasks);
            for h in handles {
                match h.await {
                    Ok(o) => out.push(o),
                    Err(e) => std::panic::resume_unwind(e.into_panic()),
                }
            }
            out
        });
        let _ = tx.send(out);
    });
    match rx.recv_timeout(std::time::Duration::from_secs(60)) {
        Ok(out) => out,
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            std::panic::resume_unwind(runner.join().expect_err("the runner panicked"))
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("the tasks did not all finish within a minute: a deadlock")
        }
    }
}
