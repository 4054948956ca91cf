//! The C ABI's tests: the committed header, the C program against the built library, and the
//! version the Python package shares.

use std::path::PathBuf;

mod c_program;
mod header;
mod versions;

/// This crate's directory.
fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A file of the repository, by its path from the repository's root.
fn repository_file(relative: &str) -> PathBuf {
    crate_dir().join("../..").join(relative)
}
