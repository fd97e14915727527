//! Loading `--config` paths: files, and directories of `*.yaml`/`*.yml` (not
//! recursive; names starting with `.` skipped; symlinks followed, since a mounted
//! ConfigMap's files are links through `..data`).

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use super::model::Document;
use super::parse::parse_partial;
use super::{compile, Policy, PolicyError};

/// Reads every path and compiles the result. On success also returns the documents,
/// so a caller can compile them again together with documents from elsewhere
/// (Kubernetes) without re-reading files. On failure returns every error: those of
/// each file, and conflicts between the documents that were valid.
pub fn load_paths(paths: &[PathBuf]) -> Result<(Policy, Vec<Document>), Vec<PolicyError>> {
    Snapshot::read(paths).load()
}

/// Reads and parses every path without compiling: the valid documents, and the
/// errors of the rest.
pub fn read_paths(paths: &[PathBuf]) -> (Vec<Document>, Vec<PolicyError>) {
    Snapshot::read(paths).parse()
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
}

impl Snapshot {
    /// Lists and reads the files `paths` stand for.
    pub fn read(paths: &[PathBuf]) -> Snapshot {
        let mut errors = Vec::new();
        let mut files = Vec::new();
        for path in paths {
            for file in files_of(path, &mut errors) {
                let source = file.display().to_string();
                let text = std::fs::read_to_string(&file).map_err(|e| unreadable(&source, &e));
                files.push((source, text));
            }
        }
        Snapshot { files, errors }
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

/// The files a path stands for, sorted by name within a directory.
fn files_of(path: &Path, errors: &mut Vec<PolicyError>) -> Vec<PathBuf> {
    let source = path.display().to_string();
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) => {
            errors.push(unreadable(&source, &e));
            return Vec::new();
        }
    };
    if !meta.is_dir() {
        return vec![path.to_path_buf()];
    }
    let entries = match std::fs::read_dir(path) {
        Ok(entries) => entries,
        Err(e) => {
            errors.push(unreadable(&source, &e));
            return Vec::new();
        }
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                errors.push(unreadable(&source, &e));
                continue;
            }
        };
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || !(name.ends_with(".yaml") || name.ends_with(".yml")) {
            continue;
        }
        let file = entry.path();
        // metadata() follows symlinks; a dangling link is reported, a directory skipped.
        match std::fs::metadata(&file) {
            Ok(meta) if meta.is_file() => found.push(file),
            Ok(_) => {}
            Err(e) => errors.push(unreadable(&file.display().to_string(), &e)),
        }
    }
    found.sort();
    found
}

fn unreadable(source: &str, e: &std::io::Error) -> PolicyError {
    PolicyError {
        file: source.to_string(),
        line: None,
        message: format!("cannot read: {e}"),
    }
}
