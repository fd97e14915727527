//! Loading `--config` paths: files, and directories of `*.yaml`/`*.yml` (not
//! recursive) or, as envoyproxy/ratelimit reads its runtime directory, of every file
//! in every subdirectory ([`DirFiles`]). Names starting with `.` are skipped either
//! way: a mounted ConfigMap keeps its real files in `..2024_…` behind a `..data`
//! link, and its visible files are links through `..data`, which are followed.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use super::model::{Document, DocumentKind};
use super::parse::parse_partial;
use super::yaml::position;
use super::{compile, Policy, PolicyError};

/// Which files of a directory are policy files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirFiles {
    /// `*.yaml` and `*.yml` at its top level.
    #[default]
    Yaml,
    /// Every file, in subdirectories too, whatever its name: envoyproxy/ratelimit's
    /// runtime directory. Symlinked directories are not entered (nor are they
    /// there), so a link cannot make a file load twice.
    All,
}

/// Reads every path and compiles the result. On success also returns the documents,
/// so a caller can compile them again together with documents from elsewhere
/// (Kubernetes) without re-reading files. On failure returns every error: those of
/// each file, and conflicts between the documents that were valid.
pub fn load_paths(paths: &[PathBuf]) -> Result<(Policy, Vec<Document>), Vec<PolicyError>> {
    Snapshot::read(paths, DirFiles::Yaml).load()
}

/// Reads and parses every path without compiling: the valid documents, and the
/// errors of the rest.
pub fn read_paths(paths: &[PathBuf]) -> (Vec<Document>, Vec<PolicyError>) {
    Snapshot::read(paths, DirFiles::Yaml).parse()
}

/// The text of every file some paths stand for, each read once. A watcher tells
/// changes by its [`Snapshot::fingerprint`] and loads the same snapshot, so what it
/// marks as seen is exactly what it loaded, however the files change meanwhile.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Each file's name and text, or why it could not be read.
    files: Vec<(String, Result<String, PolicyError>)>,
    /// Paths or directory entries that could not be listed.
    errors: Vec<PolicyError>,
    /// What a user may have meant as policies and is not read.
    notes: Vec<String>,
    /// How many files each path stood for, in the order of the paths.
    per_path: Vec<usize>,
    /// The first file that could not be read for want of file descriptors or
    /// memory ([`Snapshot::starved`]).
    starved: Option<String>,
}

impl Snapshot {
    /// Lists and reads the files `paths` stand for, taking `dir_files` of each
    /// directory. A file reached twice (`p/a.yaml` and `./p/a.yaml`, or a directory
    /// and a file in it) is read once, under the name it was first reached by:
    /// read twice, each of its definitions would clash with itself.
    pub fn read(paths: &[PathBuf], dir_files: DirFiles) -> Snapshot {
        let mut listing = Listing::default();
        let mut files = Vec::new();
        let mut per_path = Vec::with_capacity(paths.len());
        let mut seen = HashSet::new();
        for path in paths {
            let found = listing.files_of(path, dir_files);
            per_path.push(found.len());
            for file in found {
                // One that cannot be resolved is read by its name, and fails there.
                let real = std::fs::canonicalize(&file).unwrap_or_else(|_| file.clone());
                if !seen.insert(real) {
                    continue;
                }
                let source = file.display().to_string();
                let text = match std::fs::read(&file) {
                    Ok(bytes) => utf8(&source, bytes),
                    Err(e) => Err(listing.unreadable(&source, &e)),
                };
                files.push((source, text));
            }
        }
        Snapshot {
            files,
            errors: listing.errors,
            notes: listing.notes,
            per_path,
            starved: listing.starved,
        }
    }

    /// Why the snapshot is incomplete through no fault of the files: a read failed
    /// for want of file descriptors or memory. Such a snapshot says nothing of the
    /// files, so a watcher tries again rather than refusing them.
    pub fn starved(&self) -> Option<&str> {
        self.starved.as_deref()
    }

    /// For each path, in order, whether it stood for at least one file.
    pub fn paths_with_files(&self) -> Vec<bool> {
        self.per_path.iter().map(|&n| n > 0).collect()
    }

    /// Directories with no policy file, and files in them that are not read (a
    /// `limits.json`, a subdirectory): worth a warning, since what is not read
    /// limits nothing.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Why `path` (one of the paths read, as displayed) could not be listed, if it
    /// could not: missing, or not readable.
    pub fn listing_error(&self, path: &str) -> Option<&PolicyError> {
        self.errors.iter().find(|e| e.file == path)
    }

    /// Whether the paths stood for no file at all (empty directories, or only
    /// files that are not policies).
    pub fn has_no_file(&self) -> bool {
        self.files.is_empty()
    }

    /// A hash of every file's name and text, and of every error.
    pub fn fingerprint(&self) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for (source, text) in &self.files {
            source.hash(&mut h);
            match text {
                Ok(text) => text.hash(&mut h),
                Err(e) => e.to_string().hash(&mut h),
            }
        }
        for e in &self.errors {
            e.to_string().hash(&mut h);
        }
        h.finish()
    }

    /// Parses every file: the valid documents, and the errors of the rest.
    pub fn parse(&self) -> (Vec<Document>, Vec<PolicyError>) {
        let mut docs = Vec::new();
        let mut errors = self.errors.clone();
        for (source, text) in &self.files {
            match text {
                Ok(text) => {
                    let (d, e) = parse_partial(source, text);
                    docs.extend(d);
                    errors.extend(e);
                }
                Err(e) => errors.push(e.clone()),
            }
        }
        errors.extend(duplicate_resources(&docs));
        (docs, errors)
    }

    /// Parses and compiles, as [`load_paths`] does.
    pub fn load(&self) -> Result<(Policy, Vec<Document>), Vec<PolicyError>> {
        let (docs, mut errors) = self.parse();
        match compile(docs.clone()) {
            Ok(policy) if errors.is_empty() => Ok((policy, docs)),
            Ok(_) => Err(errors),
            Err(more) => {
                errors.extend(more);
                Err(errors)
            }
        }
    }
}

/// Resources that share `metadata.name` and `metadata.namespace`: `kubectl apply`
/// keeps only the last of them, so loading both would make the files say one thing
/// to sluice and another to Kubernetes. Each is refused naming the first. A resource
/// without a namespace is keyed as written: it matches only others without one.
fn duplicate_resources(docs: &[Document]) -> Vec<PolicyError> {
    let mut first: HashMap<(Option<&str>, &str), &Document> = HashMap::new();
    let mut errors = Vec::new();
    for doc in docs {
        let DocumentKind::Resource { namespace, name } = &doc.kind else {
            continue;
        };
        let prev = *first
            .entry((namespace.as_deref(), name.as_str()))
            .or_insert(doc);
        if std::ptr::eq(prev, doc) {
            continue;
        }
        let at = match prev.line {
            Some(line) => format!("{}:{line}", prev.source),
            None => prev.source.clone(),
        };
        let namespace = match namespace {
            Some(ns) => format!("namespace '{ns}'"),
            None => "no namespace".to_string(),
        };
        errors.push(PolicyError {
            file: doc.source.clone(),
            line: doc.line,
            message: format!(
                "duplicate RateLimitPolicy '{name}' ({namespace}): already defined at {at}; \
                 kubectl apply would keep only the last one"
            ),
        });
    }
    errors
}

/// What listing the paths found besides their files.
#[derive(Default)]
struct Listing {
    errors: Vec<PolicyError>,
    notes: Vec<String>,
    /// The first read that failed for want of descriptors or memory.
    starved: Option<String>,
}

impl Listing {
    /// The files a path stands for, sorted by path.
    fn files_of(&mut self, path: &Path, dir_files: DirFiles) -> Vec<PathBuf> {
        let source = path.display().to_string();
        match std::fs::metadata(path) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return vec![path.to_path_buf()],
            Err(e) => {
                self.not_listed(&source, &e);
                return Vec::new();
            }
        }
        let mut found = Vec::new();
        let mut skipped = Vec::new();
        let listed = self.walk(path, dir_files, &mut found, &mut skipped);
        found.sort();
        // A directory that could not be listed has its error, not this note: it
        // may well hold policy files.
        if found.is_empty() && listed {
            self.notes.push(format!("{source} holds no policy file"));
        }
        if !skipped.is_empty() {
            skipped.sort();
            let names: Vec<String> = skipped.iter().map(|p| p.display().to_string()).collect();
            let why = match dir_files {
                DirFiles::Yaml => "only its *.yaml and *.yml files are policies",
                DirFiles::All => "linked directories and what is not a file are not read",
            };
            self.notes
                .push(format!("{source}: {why}; not read: {}", names.join(", ")));
        }
        found
    }

    /// Adds `dir`'s files to `found` (and with [`DirFiles::All`] those of its
    /// subdirectories), and what it does not read to `skipped`; false when `dir`
    /// itself could not be listed.
    fn walk(
        &mut self,
        dir: &Path,
        dir_files: DirFiles,
        found: &mut Vec<PathBuf>,
        skipped: &mut Vec<PathBuf>,
    ) -> bool {
        let source = dir.display().to_string();
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) => {
                self.not_listed(&source, &e);
                return false;
            }
        };
        for entry in entries {
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) => {
                    self.not_listed(&source, &e);
                    continue;
                }
            };
            let name = entry.file_name();
            if name.to_string_lossy().starts_with('.') {
                continue;
            }
            let file = entry.path();
            // metadata() follows symlinks; a dangling link is reported.
            let meta = match std::fs::metadata(&file) {
                Ok(meta) => meta,
                Err(e) => {
                    self.not_listed(&file.display().to_string(), &e);
                    continue;
                }
            };
            let linked = entry.file_type().is_ok_and(|t| t.is_symlink());
            match dir_files {
                DirFiles::All if meta.is_file() => found.push(file),
                DirFiles::All if meta.is_dir() && !linked => {
                    self.walk(&file, dir_files, found, skipped);
                }
                DirFiles::Yaml if meta.is_file() && is_yaml(&file) => found.push(file),
                DirFiles::Yaml | DirFiles::All => skipped.push(file),
            }
        }
        true
    }

    /// Records that `source` could not be listed.
    fn not_listed(&mut self, source: &str, e: &std::io::Error) {
        let error = self.unreadable(source, e);
        self.errors.push(error);
    }

    /// The error of `source`, which could not be read; remembered as starvation
    /// when the process, not the file, is at fault.
    fn unreadable(&mut self, source: &str, e: &std::io::Error) -> PolicyError {
        let error = PolicyError {
            file: source.to_string(),
            line: None,
            message: format!("cannot read: {e}"),
        };
        let starved = matches!(
            e.raw_os_error(),
            Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM)
        ) || e.kind() == std::io::ErrorKind::OutOfMemory;
        if starved && self.starved.is_none() {
            self.starved = Some(error.to_string());
        }
        error
    }
}

/// A file's text, or where it stops being UTF-8: an editor's legacy encoding (a
/// Latin-1 `é`) is found at its line rather than somewhere in the file.
fn utf8(source: &str, bytes: Vec<u8>) -> Result<String, PolicyError> {
    String::from_utf8(bytes).map_err(|e| {
        let bytes = e.as_bytes();
        let at = e.utf8_error().valid_up_to();
        // What precedes the bad byte is valid UTF-8.
        let (line, column) = position(std::str::from_utf8(&bytes[..at]).unwrap_or_default());
        PolicyError {
            file: source.to_string(),
            line: Some(line),
            message: format!(
                "not UTF-8: byte 0x{:02X} at column {column}; save the file as UTF-8",
                bytes[at],
            ),
        }
    })
}

fn is_yaml(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "yaml" || e == "yml")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn policy(domain: &str) -> String {
        format!("domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n")
    }

    fn domains(dir: &Path, dir_files: DirFiles) -> Vec<String> {
        let (policy, _) = Snapshot::read(&[dir.to_path_buf()], dir_files)
            .load()
            .unwrap_or_else(|e| panic!("{e:#?}"));
        let mut names: Vec<String> = policy.domains.keys().cloned().collect();
        names.sort();
        names
    }

    /// A mounted ConfigMap: the files in a dated directory, `..data` linking to it,
    /// and each visible name a link through `..data`.
    fn config_map(dir: &Path, files: &[(&str, String)]) {
        let dated = dir.join("..2024_01_01_00_00_00.000000001");
        std::fs::create_dir(&dated).unwrap();
        symlink(dated.file_name().unwrap(), dir.join("..data")).unwrap();
        for (name, text) in files {
            std::fs::write(dated.join(name), text).unwrap();
            symlink(Path::new("..data").join(name), dir.join(name)).unwrap();
        }
    }

    #[test]
    fn all_reads_every_file_in_every_subdirectory_as_envoyproxy_ratelimit_does() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("limits"), policy("plain")).unwrap();
        std::fs::create_dir_all(d.join("sub/deeper")).unwrap();
        std::fs::write(d.join("sub/x.yaml"), policy("sub")).unwrap();
        std::fs::write(d.join("sub/deeper/y.conf"), policy("deeper")).unwrap();
        std::fs::write(d.join(".hidden.yaml"), policy("hidden")).unwrap();
        std::fs::create_dir(d.join(".git")).unwrap();
        std::fs::write(d.join(".git/config"), "not a policy").unwrap();
        assert_eq!(domains(d, DirFiles::All), ["deeper", "plain", "sub"]);
        // Sluice's own default: the top level's YAML only, and a note of the rest.
        std::fs::write(d.join("top.yml"), policy("top")).unwrap();
        assert_eq!(domains(d, DirFiles::Yaml), ["top"]);
        let notes = Snapshot::read(&[d.to_path_buf()], DirFiles::Yaml)
            .notes()
            .to_vec();
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].contains("limits") && notes[0].contains("sub"),
            "{notes:?}"
        );
        assert!(!notes[0].contains("hidden"), "{notes:?}");
        assert!(Snapshot::read(&[d.to_path_buf()], DirFiles::All)
            .notes()
            .is_empty());
    }

    #[test]
    fn a_mounted_config_map_is_read_once_either_way() {
        let dir = tempfile::tempdir().unwrap();
        config_map(
            dir.path(),
            &[("a.yaml", policy("a")), ("limits", policy("b"))],
        );
        assert_eq!(domains(dir.path(), DirFiles::All), ["a", "b"]);
        assert_eq!(domains(dir.path(), DirFiles::Yaml), ["a"]);
    }

    #[test]
    fn linked_directories_are_not_entered() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("real")).unwrap();
        std::fs::write(d.join("real/x.yaml"), policy("x")).unwrap();
        symlink("real", d.join("again")).unwrap();
        assert_eq!(domains(d, DirFiles::All), ["x"]);
        let notes = Snapshot::read(&[d.to_path_buf()], DirFiles::All)
            .notes()
            .to_vec();
        assert!(notes.iter().any(|n| n.contains("again")), "{notes:?}");
    }

    /// The same file named twice, by two spellings or by its directory and itself,
    /// loads once, under the first name: not as a duplicate of itself.
    #[test]
    fn a_file_reached_twice_is_read_once() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("p")).unwrap();
        std::fs::write(d.join("p/base.yaml"), policy("base")).unwrap();
        std::fs::write(d.join("p/more.yaml"), policy("more")).unwrap();
        let base = d.join("p/base.yaml");
        for paths in [
            vec![base.clone(), d.join("p/./base.yaml")],
            vec![base.clone(), d.join("p/../p/base.yaml")],
            vec![base.clone(), d.join("p")],
            vec![d.join("p"), base.clone(), d.join("p")],
            vec![base.clone(), base.clone()],
        ] {
            let snapshot = Snapshot::read(&paths, DirFiles::Yaml);
            let (policy, docs) = snapshot
                .load()
                .unwrap_or_else(|e| panic!("{paths:?}: {e:#?}"));
            assert!(policy.domain("base").is_some(), "{paths:?}");
            let sources: Vec<&str> = docs.iter().map(|d| d.source.as_str()).collect();
            let first = paths[0].display().to_string();
            let base_source = if paths[0] == base {
                first
            } else {
                format!("{first}/base.yaml")
            };
            assert_eq!(
                sources.iter().filter(|s| s.ends_with("base.yaml")).count(),
                1,
                "{paths:?}: {sources:?}"
            );
            assert!(
                sources.contains(&base_source.as_str()),
                "{paths:?}: {sources:?}"
            );
            // Each path still stands for its files.
            assert_eq!(snapshot.paths_with_files(), vec![true; paths.len()]);
        }
        // A link to the file is the file.
        symlink(&base, d.join("link.yaml")).unwrap();
        let paths = [base.clone(), d.join("link.yaml")];
        Snapshot::read(&paths, DirFiles::Yaml)
            .load()
            .unwrap_or_else(|e| panic!("{e:#?}"));
    }

    #[test]
    fn a_directory_without_policies_is_noted() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("README.md"), "policies go here").unwrap();
        let notes = Snapshot::read(&[dir.path().to_path_buf()], DirFiles::Yaml)
            .notes()
            .to_vec();
        assert!(notes[0].ends_with("holds no policy file"), "{notes:?}");
        assert!(notes[1].contains("README.md"), "{notes:?}");
    }
}
