//! The process series (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
//! `process_open_fds` and the rest), read from `/proc` at each scrape, as Prometheus'
//! Go client serves them.
//!
//! The prometheus crate's collector counts CPU time in whole seconds, so a process
//! using a fraction of a core shows `rate(process_cpu_seconds_total[1m])` as steps
//! of 0 and 1/60. The Go client counts the kernel's ticks: this does too.

use prometheus::core::{Collector, Desc};
use prometheus::process_collector::ProcessCollector;
use prometheus::proto::{Counter, MetricFamily};

const CPU: &str = "process_cpu_seconds_total";

/// [`ProcessCollector`], with CPU time to the kernel's tick.
pub struct Process {
    inner: ProcessCollector,
}

impl Process {
    pub fn for_self() -> Self {
        Process {
            inner: ProcessCollector::for_self(),
        }
    }
}

impl Collector for Process {
    fn desc(&self) -> Vec<&Desc> {
        self.inner.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut families = self.inner.collect();
        let Some(seconds) = cpu_seconds() else {
            return families;
        };
        let cpu = families.iter_mut().filter(|f| f.name() == CPU);
        for metric in cpu.flat_map(|f| f.mut_metric()) {
            let mut counter = Counter::default();
            counter.set_value(seconds);
            metric.set_counter(counter);
        }
        families
    }
}

/// User and system CPU time of this process, in seconds to the tick.
fn cpu_seconds() -> Option<f64> {
    let stat = procfs::process::Process::myself().ok()?.stat().ok()?;
    let ticks = procfs::ticks_per_second();
    (ticks > 0).then(|| (stat.utime + stat.stime) as f64 / ticks as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu(process: &Process) -> f64 {
        let families = process.collect();
        let family = families.iter().find(|f| f.name() == CPU).expect("served");
        family.get_metric()[0].get_counter().get_value()
    }

    #[test]
    fn cpu_time_is_counted_to_the_tick_not_the_second() {
        let process = Process::for_self();
        let before = cpu(&process);
        // Work until the kernel has counted a few ticks: less than a second, so the
        // whole-second count would not move.
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while cpu_seconds().unwrap() < before + 0.05 && start.elapsed().as_secs() < 30 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let after = cpu(&process);
        // Counted in whole seconds, the loop would run on to the next second.
        assert!(
            after >= before + 0.05 && after < before + 0.5,
            "before {before}, after {after}"
        );
    }
}
