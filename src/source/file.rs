//! The file source: `--config` files and directories, polled for changes.
//!
//! Polling the contents (rather than inotify) sees every kind of update the same way,
//! including a mounted ConfigMap's, where Kubernetes swaps the `..data` symlink and no
//! event fires on the file the user named. Policy files are small; reading them every
//! half second costs nothing next to a missed update.
//!
//! A change is loaded, or refused, only once a second read a moment later
//! ([`SETTLE`]) finds the same contents: a poll that lands mid-update (a file
//! truncated and not yet written, half copied, deleted before its copy, or a
//! ConfigMap's `..data` swapped before its stale links go) must neither serve the
//! half-written policy (a `requests_per_unit: 1000` cut to `1`) nor report a refusal
//! that pages an operator for an edit that loads a moment later.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::hub::Hub;

/// How long after a read that found changed contents they are read again, to be
/// loaded (or refused) only if they are the same; at most `--reload-interval`.
pub const SETTLE: Duration = Duration::from_millis(100);
use crate::policy::{DirFiles, PolicyError, Snapshot};
use crate::telemetry::printable::printable;
use crate::telemetry::Metrics;

/// Watches policy files and hands each good version to the [`Hub`], which compiles
/// it together with the other sources' documents and swaps the result in.
#[derive(Debug)]
pub struct FileSource {
    paths: Vec<PathBuf>,
    dir_files: DirFiles,
    interval: Duration,
    hub: Arc<Hub>,
    metrics: Arc<Metrics>,
    /// The fingerprint of the files serving now.
    loaded: u64,
    /// The fingerprint of the last files refused and the xDS version they were
    /// refused beside ([`Hub::xds_swapped`]), so that a broken edit is reported once
    /// rather than on every poll, and tried again when xDS changes.
    refused: Option<(u64, u64)>,
    /// What the last read found not worth loading ([`Snapshot::notes`]), warned
    /// about when it changes rather than on every poll.
    notes: Vec<String>,
    /// For each path, whether it held a policy file in the files serving now.
    had_files: Vec<bool>,
    /// Whether the last poll could not read the files for want of descriptors or
    /// memory (warned once, until a poll reads them again).
    starved: bool,
    /// The fingerprint of changed files read once and not acted on yet: they are
    /// loaded or refused when the next read ([`SETTLE`] later) finds them the same.
    unsettled: Option<u64>,
}

impl FileSource {
    /// Loads the files once into `hub`. Fails with every error found if they do not
    /// load.
    pub fn load(
        paths: Vec<PathBuf>,
        dir_files: DirFiles,
        interval: Duration,
        metrics: Arc<Metrics>,
        hub: Arc<Hub>,
    ) -> Result<FileSource, Vec<PolicyError>> {
        let snapshot = Snapshot::read(&paths, dir_files);
        let mut source = FileSource {
            paths,
            dir_files,
            interval,
            hub,
            metrics,
            loaded: snapshot.fingerprint(),
            refused: None,
            notes: Vec::new(),
            had_files: snapshot.paths_with_files(),
            starved: false,
            unsettled: None,
        };
        source.warn(&snapshot);
        let (compiled, docs) = snapshot.load()?;
        let (domains, rules) = (compiled.domains.len(), compiled.rule_count());
        source.hub.set_files(docs)?;
        tracing::info!(domains, rules, "policy loaded from files");
        source.metrics.policy_reload("file", true);
        Ok(source)
    }

    /// Warns of the snapshot's notes, if they are new.
    fn warn(&mut self, snapshot: &Snapshot) {
        if snapshot.notes() == self.notes {
            return;
        }
        self.notes = snapshot.notes().to_vec();
        for note in &self.notes {
            tracing::warn!("policy files: {note}");
        }
    }

    /// Polls every interval, and at once when `rereads` changes (SIGHUP), until
    /// `shutdown` resolves.
    ///
    /// Reading, parsing and compiling a large policy takes a while (seconds for
    /// tens of thousands of rules), so each poll runs on a thread of its own, off
    /// the runtime's threads, which answer requests meanwhile.
    pub async fn run(
        self,
        shutdown: impl std::future::Future<Output = ()>,
        mut rereads: watch::Receiver<()>,
    ) {
        tokio::pin!(shutdown);
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // A change read once is read again soon, not a whole (perhaps long)
        // interval later.
        let settle = self.interval.min(SETTLE);
        let Some(polls) = self.spawn_poller() else {
            return;
        };
        let mut unsettled = false;
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tick.tick() => {}
                // Without a sender (no signals here) the branch is off.
                Ok(()) = rereads.changed() => {}
                _ = tokio::time::sleep(settle), if unsettled => {}
            }
            let (done, polled) = tokio::sync::oneshot::channel();
            if polls.send(done).is_err() {
                return;
            }
            tokio::select! {
                _ = &mut shutdown => return,
                polled = polled => unsettled = polled.unwrap_or(false),
            }
        }
    }

    /// Starts the thread that polls whenever asked, until the sender is dropped.
    /// Each poll answers whether it left a change to be read again
    /// ([`FileSource::unsettled`]).
    fn spawn_poller(
        mut self,
    ) -> Option<std::sync::mpsc::Sender<tokio::sync::oneshot::Sender<bool>>> {
        let (polls, asked) = std::sync::mpsc::channel::<tokio::sync::oneshot::Sender<bool>>();
        let spawned = std::thread::Builder::new()
            .name("sluice-policy-files".into())
            .spawn(move || {
                for done in asked {
                    let check = std::panic::AssertUnwindSafe(|| self.check());
                    if std::panic::catch_unwind(check).is_err() {
                        tracing::error!(
                            "checking the policy files failed; trying again at the next poll"
                        );
                    }
                    let _ = done.send(self.unsettled.is_some());
                }
            });
        match spawned {
            Ok(_) => Some(polls),
            Err(e) => {
                tracing::error!(error = %e, "cannot start the policy file thread; the files are not reloaded");
                None
            }
        }
    }

    /// The paths that held policy files in the files serving now and hold none in
    /// `snapshot`.
    fn emptied(&self, snapshot: &Snapshot) -> Vec<String> {
        let now = snapshot.paths_with_files();
        self.paths
            .iter()
            .zip(self.had_files.iter().zip(now))
            .filter(|(_, (&had, has))| had && !has)
            .map(|(path, _)| path.display().to_string())
            .collect()
    }

    /// Reloads if anything changed; returns whether a new policy was swapped in.
    ///
    /// The files are read once: the fingerprint is taken of what is loaded, so an
    /// edit that lands between two reads is never mistaken for one already loaded.
    pub fn check(&mut self) -> bool {
        let snapshot = Snapshot::read(&self.paths, self.dir_files);
        // The process, not the files, is at fault: nothing is refused or counted,
        // and the next poll reads them again.
        if let Some(why) = snapshot.starved() {
            if !std::mem::replace(&mut self.starved, true) {
                tracing::warn!(error = %why, "policy files cannot be read for now; the last good policy keeps serving and the next poll tries again");
            }
            return false;
        }
        if std::mem::take(&mut self.starved) {
            tracing::info!("policy files can be read again");
        }
        self.warn(&snapshot);
        let seen = snapshot.fingerprint();
        if seen == self.loaded {
            self.unsettled = None;
            if self.refused.take().is_some() {
                tracing::info!(
                    "policy files are back to the policy serving; nothing is refused any more"
                );
                self.hub.clear_refusal("file");
            }
            return false;
        }
        let xds = self.hub.xds_swapped();
        if self.refused == Some((seen, xds)) {
            self.unsettled = None;
            return false;
        }
        // Changed files are acted on only when read the same twice: the first read
        // may have landed mid-update.
        if self.unsettled.replace(seen) != Some(seen) {
            return false;
        }
        self.unsettled = None;
        // Files that load alone may still clash with the xDS documents; the hub
        // refuses those as a whole.
        // A path that held policy files and now holds none is most likely mid-edit
        // (a file moved away, a delete before a copy): loading it would drop its
        // limits, even those of `closed` domains.
        let emptied = self.emptied(&snapshot);
        let loaded = if !emptied.is_empty() {
            // Said with the reason when there is one: a file deleted, a directory
            // made unreadable.
            Err(emptied
                .into_iter()
                .map(|file| {
                    let why = match snapshot.listing_error(&file) {
                        Some(e) => e.message.clone(),
                        None => "no policy file any more".to_string(),
                    };
                    PolicyError {
                        file,
                        line: None,
                        message: format!("{why}; refused, as it would lift its limits"),
                    }
                })
                .collect())
        } else {
            snapshot.load().and_then(|(p, docs)| {
                let summary = (p.domains.len(), p.rule_count());
                self.hub.set_files(docs).map(|()| summary)
            })
        };
        match loaded {
            Ok((domains, rules)) => {
                tracing::info!(domains, rules, "policy reloaded from files");
                self.metrics.policy_reload("file", true);
                self.loaded = seen;
                self.refused = None;
                self.had_files = snapshot.paths_with_files();
                true
            }
            Err(errors) => {
                for e in &errors {
                    // A policy's keys and names may hold a terminal's control sequences.
                    tracing::error!(error = %printable(&e.to_string()), "policy refused; the last good policy keeps serving");
                }
                self.metrics.policy_reload("file", false);
                let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
                self.hub.refuse("file", lines.join("\n"));
                self.refused = Some((seen, xds));
                false
            }
        }
    }
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
        let (files, hub, _) = counted_source(paths);
        (files, hub)
    }

    /// [`source`], with the metrics it counts its reloads in.
    fn counted_source(paths: Vec<PathBuf>) -> (FileSource, Arc<Hub>, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::new());
        let hub = Hub::new(&[], Defaults::default(), metrics.clone());
        let files = FileSource::load(
            paths,
            DirFiles::Yaml,
            Duration::from_millis(500),
            metrics.clone(),
            hub.clone(),
        )
        .expect("the files load");
        (files, hub, metrics)
    }

    /// Checks `files` twice, as a change is acted on only when two reads find it
    /// the same: whether the second check swapped a new policy in.
    fn settled(files: &mut FileSource) -> bool {
        assert!(!files.check(), "a change read once is not acted on yet");
        files.check()
    }

    /// Runs `files` on the current runtime until the returned sender is used or
    /// dropped; the other sender stands for SIGHUP.
    fn spawn_run(files: FileSource) -> (tokio::sync::oneshot::Sender<()>, watch::Sender<()>) {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (hup, rereads) = watch::channel(());
        let stopped = async move {
            let _ = stopped.await;
        };
        tokio::spawn(files.run(stopped, rereads));
        (stop, hup)
    }

    /// Waits up to 5 s for `hub` to serve `limit`.
    async fn serves(hub: &Hub, limit: u32) -> bool {
        for _ in 0..500 {
            if served(hub) == Some(limit) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    /// A SIGHUP (a change of `rereads`) reads the files at once, however long the
    /// reload interval.
    #[tokio::test]
    async fn a_reread_loads_an_edit_before_the_next_poll() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.yaml");
        std::fs::write(&path, policy(1)).unwrap();
        let metrics = Arc::new(Metrics::new());
        let hub = Hub::new(&[], Defaults::default(), metrics.clone());
        let hour = Duration::from_secs(3600);
        let files = FileSource::load(
            vec![path.clone()],
            DirFiles::Yaml,
            hour,
            metrics,
            hub.clone(),
        )
        .unwrap();
        // The first poll comes at once and finds this edit.
        std::fs::write(&path, policy(2)).unwrap();
        let (stop, hup) = spawn_run(files);
        assert!(serves(&hub, 2).await);
        // The next poll is an hour away: only the reread loads this one.
        std::fs::write(&path, policy(3)).unwrap();
        hup.send_replace(());
        assert!(serves(&hub, 3).await, "{:?}", served(&hub));
        let _ = stop.send(());
    }

    /// An xDS version defining `key` in domain `d`.
    fn xds(key: &str) -> Vec<crate::policy::Document> {
        let text = format!("domain: d\ndescriptors:\n  - key: {key}\n    rate_limit: {{unit: second, requests_per_unit: 9}}\n");
        crate::policy::parse_str("xds:d", &text).unwrap()
    }

    fn reloads(metrics: &Metrics, result: &str) -> String {
        let series = format!("sluice_policy_reloads_total{{result=\"{result}\",source=\"file\"}} ");
        let text = metrics.render();
        let line = text.lines().find(|l| l.starts_with(&series));
        line.map(|l| l[series.len()..].to_string())
            .unwrap_or_default()
    }

    /// A file edit that clashes with the xDS documents is refused whole and counted
    /// once; each later xDS version has it tried again at the next poll.
    #[test]
    fn an_edit_clashing_with_xds_changes_nothing_now_or_later() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.yaml");
        std::fs::write(&path, policy(1)).unwrap();
        let (mut files, hub, metrics) = counted_source(vec![path.clone()]);
        hub.set_xds(xds("x")).unwrap();

        // The edit defines `x` too, which xDS already does.
        let clash = format!(
            "{}  - key: x\n    rate_limit: {{unit: second, requests_per_unit: 3}}\n",
            policy(2)
        );
        std::fs::write(&path, clash).unwrap();
        assert!(!settled(&mut files), "the clashing edit is refused");
        assert!(!files.check(), "and refused once");
        assert_eq!(served(&hub), Some(1));
        assert_eq!(reloads(&metrics, "ok"), "1", "only the start-up load");
        assert_eq!(reloads(&metrics, "error"), "1");

        // A new xDS version that still defines `x`: the next poll tries the edit
        // again, once, and it is refused again.
        hub.set_xds(xds("x")).unwrap();
        assert!(!settled(&mut files));
        assert!(!files.check());
        assert_eq!(reloads(&metrics, "error"), "2");

        // One without `x`: the xDS swap alone does not bring the edit in, the next
        // poll does, since it fits now.
        hub.set_xds(xds("y")).unwrap();
        assert_eq!(served(&hub), Some(1), "the last good file keeps serving");
        assert!(settled(&mut files), "the refused edit is tried again");
        assert_eq!(served(&hub), Some(2));
    }

    /// A file read mid-write, empty or cut short, is neither refused nor served:
    /// only the contents two reads find the same are loaded.
    #[test]
    fn a_file_read_mid_write_is_neither_refused_nor_served() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.yaml");
        std::fs::write(&path, policy(1)).unwrap();
        let (mut files, hub, metrics) = counted_source(vec![path.clone()]);
        let full = "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1000\n";
        // Truncated, then cut mid-number: `1000` read as `10`.
        for text in ["", &full[..full.len() - 3]] {
            std::fs::write(&path, text).unwrap();
            assert!(!files.check());
            assert_eq!(served(&hub), Some(1), "{text:?} is not served");
        }
        std::fs::write(&path, full).unwrap();
        assert!(settled(&mut files));
        assert_eq!(served(&hub), Some(1000));
        assert_eq!(reloads(&metrics, "error"), "0", "nothing was refused");
        assert_eq!(reloads(&metrics, "ok"), "2", "the start and the full file");
    }

    /// Serves `script` to each reader of the FIFO at `path` in turn, then `last`
    /// forever: a file that changes between any two reads.
    #[cfg(target_os = "linux")]
    fn serve_fifo(path: &std::path::Path, script: Vec<String>, last: String) {
        use std::io::Write;
        let made = std::process::Command::new("mkfifo").arg(path).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo");
        // The readers are this process's: it has the FIFO open while one reads.
        let open_here = |path: &std::path::Path| {
            std::fs::read_dir("/proc/self/fd")
                .into_iter()
                .flatten()
                .flatten()
                .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l == path))
        };
        let path = path.to_path_buf();
        std::thread::spawn(move || {
            for text in script.into_iter().chain(std::iter::repeat(last)) {
                let Ok(mut fifo) = std::fs::OpenOptions::new().write(true).open(&path) else {
                    return;
                };
                let _ = fifo.write_all(text.as_bytes());
                drop(fifo);
                // One text per read: wait until the reader has closed the file.
                while open_here(&path) {
                    std::thread::yield_now();
                }
            }
        });
    }

    /// While a poll is stuck reading (a large file being parsed and compiled, here
    /// a FIFO nobody writes yet), the runtime keeps running its other tasks: here,
    /// the one that writes the FIFO.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_reload_does_not_hold_up_the_runtime() {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.yaml");
        std::fs::write(&path, policy(1)).unwrap();
        let (files, hub) = source(vec![path.clone()]);
        std::fs::remove_file(&path).unwrap();
        let made = std::process::Command::new("mkfifo").arg(&path).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo");

        let (served_tx, served_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let (stop, _hup) = spawn_run(files);
                // Once the poll has the FIFO open to read, write it without waiting;
                // the read after it, which confirms the edit, finds a file.
                for _ in 0..1000 {
                    let writer = std::fs::OpenOptions::new()
                        .write(true)
                        .custom_flags(libc::O_NONBLOCK)
                        .open(&path);
                    if let Ok(mut fifo) = writer {
                        let file = path.with_extension("new");
                        std::fs::write(&file, policy(2)).unwrap();
                        std::fs::rename(&file, &path).unwrap();
                        fifo.write_all(policy(2).as_bytes()).unwrap();
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                serves(&hub, 2).await;
                let _ = served_tx.send(served(&hub));
                let _ = stop.send(());
            });
        });
        let served = served_rx.recv_timeout(Duration::from_secs(10));
        assert_eq!(served, Ok(Some(2)), "the edit written meanwhile serves");
    }

    /// An edit whose good contents arrive between two reads (an editor truncating,
    /// then writing) is loaded once they are there, not taken as seen.
    #[cfg(target_os = "linux")]
    #[test]
    fn contents_that_change_between_reads_are_loaded_once_settled() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.yaml");
        std::fs::write(&path, policy(1)).unwrap();
        let (mut files, hub) = source(vec![path.clone()]);
        std::fs::remove_file(&path).unwrap();
        // The good version, then a read of the half-written file, then good again.
        serve_fifo(
            &path,
            vec![policy(2), "domain: d\ndescriptors: [".into()],
            policy(2),
        );
        for _ in 0..10 {
            files.check();
        }
        assert_eq!(served(&hub), Some(2), "the settled edit serves");
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
        assert!(settled(&mut files), "the edit is seen");
        assert_eq!(served(&hub), Some(2));
    }

    /// A directory emptied mid-edit (the file moved away, a delete before a copy)
    /// keeps the last good policy; the file back, or another, loads as usual.
    #[test]
    fn a_directory_emptied_of_policy_files_keeps_the_last_good_policy() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("policy.yaml");
        std::fs::write(&file, policy(1)).unwrap();
        let (mut files, hub) = source(vec![dir.path().to_path_buf()]);
        let aside = dir.path().join("policy.yaml.bak");
        std::fs::rename(&file, &aside).unwrap();
        assert!(!settled(&mut files), "refused");
        assert_eq!(served(&hub), Some(1), "the last good policy serves on");
        let refused = hub.status().refused;
        assert!(
            refused
                .get("file")
                .is_some_and(|r| r.contains("no policy file")),
            "{refused:?}"
        );
        std::fs::write(dir.path().join("other.yaml"), policy(2)).unwrap();
        assert!(settled(&mut files), "a policy file loads again");
        assert_eq!(served(&hub), Some(2));
    }

    /// One of several directories emptied is refused too, though the others still
    /// hold files.
    #[test]
    fn one_of_several_directories_emptied_keeps_the_last_good_policy() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        std::fs::write(a.path().join("a.yaml"), policy(1)).unwrap();
        let other = "domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
        std::fs::write(b.path().join("b.yaml"), other).unwrap();
        let (mut files, hub) = source(vec![a.path().to_path_buf(), b.path().to_path_buf()]);
        std::fs::remove_file(a.path().join("a.yaml")).unwrap();
        assert!(!settled(&mut files), "refused");
        assert_eq!(served(&hub), Some(1), "domain d keeps its limit");
        let refused = hub.status().refused;
        let why = refused.get("file").cloned().unwrap_or_default();
        assert!(why.contains(&a.path().display().to_string()), "{why}");
    }
}
