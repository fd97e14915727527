//! The file source: `--config` files and directories, polled for changes.
//!
//! Polling the contents (rather than inotify) sees every kind of update the same way,
//! including a mounted ConfigMap's, where Kubernetes swaps the `..data` symlink and no
//! event fires on the file the user named. Policy files are small; reading them every
//! half second costs nothing next to a missed update.

use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::hub::Hub;
use crate::policy::{self, PolicyError};
use crate::telemetry::Metrics;

/// Watches policy files and hands each good version to the [`Hub`], which compiles
/// it together with the other sources' documents and swaps the result in.
#[derive(Debug)]
pub struct FileSource {
    paths: Vec<PathBuf>,
    interval: Duration,
    hub: Arc<Hub>,
    metrics: Arc<Metrics>,
    last: u64,
}

impl FileSource {
    /// Loads the files once into `hub`. Fails with every error found if they do not
    /// load.
    pub fn load(
        paths: Vec<PathBuf>,
        interval: Duration,
        metrics: Arc<Metrics>,
        hub: Arc<Hub>,
    ) -> Result<FileSource, Vec<PolicyError>> {
        let last = fingerprint(&paths);
        let (_compiled, docs) = policy::load_paths(&paths)?;
        hub.set_files(docs);
        metrics.policy_reload("file", true);
        Ok(FileSource {
            paths,
            interval,
            hub,
            metrics,
            last,
        })
    }

    /// Polls until `shutdown` resolves.
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tick.tick() => { self.check(); }
            }
        }
    }

    /// Reloads if anything changed; returns whether a new policy was swapped in.
    pub fn check(&mut self) -> bool {
        let now = fingerprint(&self.paths);
        if now == self.last {
            return false;
        }
        self.last = now;
        match policy::load_paths(&self.paths) {
            Ok((p, docs)) => {
                tracing::info!(
                    domains = p.domains.len(),
                    rules = p.rules.len(),
                    "policy reloaded from files"
                );
                self.hub.set_files(docs);
                self.metrics.policy_reload("file", true);
                true
            }
            Err(errors) => {
                for e in &errors {
                    tracing::error!(error = %e, "policy refused; the last good policy keeps serving");
                }
                self.metrics.policy_reload("file", false);
                false
            }
        }
    }
}

/// A hash of every policy file's name and contents (missing files count too). The
/// files are those the load reads, whatever their names' encoding.
fn fingerprint(paths: &[PathBuf]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for path in paths {
        path.hash(&mut h);
        for file in policy::policy_files(path) {
            file.hash(&mut h);
            std::fs::read(&file).ok().hash(&mut h);
        }
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Defaults;

    fn policy(n: u32) -> String {
        format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: {n}}}\n")
    }

    /// The limit served for `k` in domain `d`.
    fn served(hub: &Hub) -> Option<u32> {
        let policy = hub.policy().load_full();
        let id = policy.domain("d")?.find(&[("k", "v")])?;
        Some(policy.rule(id).requests_per_unit)
    }

    fn source(paths: Vec<PathBuf>) -> (FileSource, Arc<Hub>) {
        let metrics = Arc::new(Metrics::new());
        let hub = Hub::new(&[], Defaults::default(), metrics.clone());
        let files = FileSource::load(paths, Duration::from_millis(500), metrics, hub.clone())
            .expect("the files load");
        (files, hub)
    }

    #[cfg(unix)]
    #[test]
    fn edits_to_a_file_whose_name_is_not_utf8_are_picked_up() {
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir
            .path()
            .join(std::ffi::OsStr::from_bytes(b"limits-\xff.yaml"));
        std::fs::write(&file, policy(1)).unwrap();
        let (mut files, hub) = source(vec![dir.path().to_path_buf()]);
        assert_eq!(served(&hub), Some(1));
        std::fs::write(&file, policy(2)).unwrap();
        assert!(files.check(), "the edit is seen");
        assert_eq!(served(&hub), Some(2));
    }
}
