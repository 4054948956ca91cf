//! Shared by the tests that read the repository's own files: its root and the JSON files of a
//! folder in it.
#![allow(dead_code)]

pub mod imports;

use std::path::{Path, PathBuf};

/// The crate root.
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The JSON files of `folder` (relative to the root), as absolute paths, sorted; never empty.
pub fn json_files(folder: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join(folder))
        .unwrap_or_else(|error| panic!("cannot list {folder}: {error}"))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| {
            path.extension()
                .is_some_and(|extension| extension == "json")
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no JSON files in {folder}");
    files
}
