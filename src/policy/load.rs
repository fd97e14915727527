//! Loading `--config` paths: files, and directories of `*.yaml`/`*.yml` (not
//! recursive; names starting with `.` skipped; symlinks followed, since a mounted
//! ConfigMap's files are links through `..data`).

use std::path::{Path, PathBuf};

use super::model::Document;
use super::parse::parse_partial;
use super::{compile, Policy, PolicyError};

/// Reads every path and compiles the result. On success also returns the documents,
/// so a caller can compile them again together with documents from elsewhere
/// (Kubernetes) without re-reading files. On failure returns every error: those of
/// each file, and conflicts between the documents that were valid.
pub fn load_paths(paths: &[PathBuf]) -> Result<(Policy, Vec<Document>), Vec<PolicyError>> {
    let (docs, mut errors) = read_paths(paths);
    match compile(docs.clone()) {
        Ok(policy) if errors.is_empty() => Ok((policy, docs)),
        Ok(_) => Err(errors),
        Err(more) => {
            errors.extend(more);
            Err(errors)
        }
    }
}

/// Reads and parses every path without compiling: the valid documents, and the
/// errors of the rest.
pub fn read_paths(paths: &[PathBuf]) -> (Vec<Document>, Vec<PolicyError>) {
    let mut docs = Vec::new();
    let mut errors = Vec::new();
    for path in paths {
        for file in files(path, &mut errors) {
            let source = file.display().to_string();
            match std::fs::read_to_string(&file) {
                Ok(text) => {
                    let (d, e) = parse_partial(&source, &text);
                    docs.extend(d);
                    errors.extend(e);
                }
                Err(e) => errors.push(unreadable(&source, &e)),
            }
        }
    }
    (docs, errors)
}

/// The files a path stands for, as [`read_paths`] reads them (unreadable entries
/// left out), so a watcher sees exactly the files that load.
pub fn policy_files(path: &Path) -> Vec<PathBuf> {
    files(path, &mut Vec::new())
}

/// The files a path stands for, sorted by name within a directory.
fn files(path: &Path, errors: &mut Vec<PolicyError>) -> Vec<PathBuf> {
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
