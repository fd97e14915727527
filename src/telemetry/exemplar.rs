//! Exemplars of `sluice_decision_seconds`: per bucket, the trace id of the latest
//! sampled call that fell in it, so that a slow bucket in Grafana links to the
//! trace of one such call. Written only by traced calls that were sampled, each
//! bucket behind its own lock taken with `try_lock` (a writer that finds it taken
//! skips: any recent call is as good an example); shown only in the OpenMetrics
//! exposition, the one format that has exemplars.

use std::sync::Mutex;
use std::time::Duration;

use super::striped::{bucket_of, LATENCY_BOUNDS};

/// One example observation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Exemplar {
    pub trace_id: [u8; 16],
    pub seconds: f64,
    /// When, in seconds since the Unix epoch.
    pub at: f64,
}

/// The latest exemplar of each bucket (the last is `+Inf`).
#[derive(Debug, Default)]
pub struct Exemplars([Mutex<Option<Exemplar>>; LATENCY_BOUNDS.len() + 1]);

impl Exemplars {
    /// Keeps `trace_id` as the example of `took`'s bucket.
    pub fn offer(&self, took: Duration, trace_id: [u8; 16], at_micros: u64) {
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        if let Ok(mut slot) = self.0[bucket_of(nanos)].try_lock() {
            *slot = Some(Exemplar {
                trace_id,
                seconds: took.as_secs_f64(),
                at: at_micros as f64 / 1e6,
            });
        }
    }

    /// The exemplar of each bucket, `+Inf` last.
    pub fn get(&self) -> Vec<Option<Exemplar>> {
        self.0
            .iter()
            .map(|m| *m.lock().unwrap_or_else(|p| p.into_inner()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_bucket_keeps_its_latest_example() {
        let e = Exemplars::default();
        e.offer(Duration::from_micros(30), [1; 16], 1_000_000);
        e.offer(Duration::from_micros(40), [2; 16], 2_000_000);
        e.offer(Duration::from_millis(200), [3; 16], 3_000_000);
        let got = e.get();
        assert_eq!(got.len(), LATENCY_BOUNDS.len() + 1);
        assert_eq!(
            got[0],
            Some(Exemplar {
                trace_id: [2; 16],
                seconds: 0.00004,
                at: 2.0
            })
        );
        assert_eq!(got.last().unwrap().unwrap().trace_id, [3; 16]);
        assert!(got[1..LATENCY_BOUNDS.len()].iter().all(Option::is_none));
    }
}
