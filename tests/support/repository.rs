//! Shared by the tests that read the repository's own files: its root and the JSON files of a
//! folder in it.

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

/// Every valid ladder file: the shipped ladders, then the valid fixtures.
pub fn valid_ladders() -> Vec<PathBuf> {
    let mut files = json_files("ladders");
    files.extend(json_files("tests/fixtures/ladders/valid"));
    files
}

/// The JSON value of a file, which may start with a byte order mark.
pub fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()));
    serde_json::from_str(text.trim_start_matches('\u{feff}'))
        .unwrap_or_else(|error| panic!("{} is not JSON: {error}", path.display()))
}
