//! `sluice-bench memory`: resident memory per active key of the in-memory store, per
//! algorithm.
//!
//! Each algorithm is measured in a fresh process (this binary runs itself with
//! `--algorithm`), because an allocator keeps freed memory and would make the second
//! measurement in one process look free. The process fills a `MemoryStore` with
//! `--keys` counters shaped like the service's (`bench|client=k123`), each hit
//! `--hits` times (1 us apart), and reports the growth of its resident set
//! (`/proc/self/statm`) divided by the number of keys: the counter state, the key
//! string, the map slot and the allocator's overhead, at the map's real load factor.

use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use sluice::algorithm::{Algorithm, Limit, SECOND};
use sluice::clock::{Clock, ManualClock, SystemClock};
use sluice::store::{Hit, MemoryStore, Mode, Spend, Store};

const ALGORITHMS: [Algorithm; 5] = [
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowCounter,
    Algorithm::SlidingWindowLog,
    Algorithm::TokenBucket,
    Algorithm::LeakyBucket,
];

#[derive(Parser, Clone, Debug)]
pub struct Memory {
    /// Active keys to create.
    #[arg(long, default_value_t = 1_000_000)]
    pub keys: u64,
    /// Hits per key (sliding_window_log keeps one entry per hit timestamp).
    #[arg(long, default_value_t = 1)]
    pub hits: u64,
    /// Measure one algorithm in this process (default: each in its own process).
    #[arg(long)]
    pub algorithm: Option<String>,
    /// Print JSON lines instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Resident set size in bytes, from `/proc/self/statm` (pages) and the page size.
pub fn rss_bytes() -> anyhow::Result<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm")?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("unexpected /proc/self/statm: {statm}"))?
        .parse()?;
    Ok(pages * page_size())
}

/// The page size, from the auxiliary vector the kernel gave this process (`AT_PAGESZ`).
fn page_size() -> u64 {
    const AT_PAGESZ: u64 = 6;
    let auxv = std::fs::read("/proc/self/auxv").unwrap_or_default();
    auxv.chunks_exact(16)
        .find_map(|pair| {
            let word = |b: &[u8]| u64::from_ne_bytes(b.try_into().expect("8 bytes"));
            (word(&pair[..8]) == AT_PAGESZ).then(|| word(&pair[8..]))
        })
        .unwrap_or(4096)
}

pub fn run(m: Memory) -> anyhow::Result<()> {
    anyhow::ensure!(m.keys > 0, "--keys must be > 0");
    match &m.algorithm {
        Some(name) => {
            let algorithm = Algorithm::parse(name)
                .ok_or_else(|| anyhow::anyhow!("unknown algorithm {name}"))?;
            let r = measure(algorithm, m.keys, m.hits)?;
            println!("{}", r.json());
            Ok(())
        }
        None => {
            let exe = std::env::current_exe()?;
            if !m.json {
                println!(
                    "# in-memory store, {} keys, {} hit(s) per key, RSS growth per key",
                    m.keys, m.hits
                );
                println!(
                    "{:<24} {:>12} {:>12} {:>10}",
                    "algorithm", "bytes/key", "rss_growth", "fill_s"
                );
            }
            for a in ALGORITHMS {
                let out = std::process::Command::new(&exe)
                    .args(["memory", "--algorithm", a.as_str()])
                    .args(["--keys", &m.keys.to_string(), "--hits", &m.hits.to_string()])
                    .output()?;
                anyhow::ensure!(
                    out.status.success(),
                    "measuring {} failed: {}",
                    a.as_str(),
                    String::from_utf8_lossy(&out.stderr)
                );
                let line = String::from_utf8_lossy(&out.stdout);
                if m.json {
                    print!("{line}");
                    continue;
                }
                let v: serde_json::Value = serde_json::from_str(line.trim())?;
                println!(
                    "{:<24} {:>12} {:>12} {:>10}",
                    a.as_str(),
                    v["bytes_per_key"].to_string(),
                    v["rss_growth_bytes"].to_string(),
                    v["fill_seconds"].to_string()
                );
            }
            Ok(())
        }
    }
}

pub struct Measurement {
    algorithm: Algorithm,
    keys: u64,
    hits: u64,
    active_keys: usize,
    growth: u64,
    seconds: f64,
}

impl Measurement {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "store": "memory",
            "algorithm": self.algorithm.as_str(),
            "keys": self.keys,
            "hits_per_key": self.hits,
            "active_keys": self.active_keys,
            "rss_growth_bytes": self.growth,
            "bytes_per_key": (self.growth as f64 / self.keys as f64).round() as u64,
            "fill_seconds": (self.seconds * 100.0).round() / 100.0,
        })
    }
}

/// Fills a fresh store with `keys` counters of `algorithm`, each hit `hits` times.
pub fn measure(algorithm: Algorithm, keys: u64, hits: u64) -> anyhow::Result<Measurement> {
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    // Limits that never deny and state that outlives the fill (as in
    // benches/memory-policy.yaml): windows of an hour; buckets that refill at 1 per
    // hour with room for 300,000. The cap is above the key count so nothing is evicted.
    let bucket = matches!(algorithm, Algorithm::TokenBucket | Algorithm::LeakyBucket);
    let limit = Limit {
        algorithm,
        requests: if bucket { 1 } else { 1_000_000_000 },
        window: 3600 * SECOND,
        burst: 300_000,
        phase: 0,
    };
    // Time moves 1 us per hit, so every hit has its own timestamp: sliding_window_log
    // keeps one entry per hit (hits in the same microsecond would share one).
    let clock = ManualClock::new(SystemClock.now());
    let store = MemoryStore::new(Arc::new(clock.clone()), (keys as usize).saturating_mul(2));
    let before = rss_bytes()?;
    let started = Instant::now();
    rt.block_on(async {
        for i in 0..keys {
            let hit = Hit {
                key: format!("bench|client=k{i}"),
                placement: i,
                limit,
                hits: 1,
                mode: Mode::Enforce,
                spend: Spend::IfAdmitted,
                fallback: Default::default(),
                max_delay: sluice::algorithm::NO_DEADLINE,
            };
            for _ in 0..hits.max(1) {
                clock.advance(1);
                let v = store.decide(std::slice::from_ref(&hit)).await?;
                anyhow::ensure!(v.admitted, "fill denied at key {i}");
            }
        }
        Ok(())
    })?;
    let seconds = started.elapsed().as_secs_f64();
    let after = rss_bytes()?;
    Ok(Measurement {
        algorithm,
        keys,
        hits,
        active_keys: store.active_keys(),
        growth: after.saturating_sub(before),
        seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_is_read() {
        let rss = rss_bytes().unwrap();
        assert!(rss > 1 << 20, "{rss}");
        assert_eq!(page_size() % 4096, 0);
    }

    #[test]
    fn a_small_fill_keeps_every_key() {
        for a in ALGORITHMS {
            let m = measure(a, 2000, 2).unwrap();
            assert_eq!(m.active_keys, 2000, "{}", a.as_str());
        }
    }
}
