//! The C ABI's tests: the generated header, the C program against the built library, and the
//! version the Python package shares.

use std::path::{Path, PathBuf};

mod c_program;
mod environment;
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

/// The directory holding this crate's cdylib: `cargo test` leaves it beside the test binary in
/// `deps/` (the crate is also an rlib, so the test build makes it); `cargo build` puts it in
/// the profile's directory above.
fn library_dir() -> PathBuf {
    let deps = deps_dir();
    let found = [deps.as_path(), profile_dir(&deps)]
        .into_iter()
        .find(|dir| dir.join("libprepare_c.so").is_file())
        .map(Path::to_path_buf);
    found.unwrap_or_else(|| panic!("no libprepare_c.so in {} or above it", deps.display()))
}

/// Where the build script writes `prepare.h`: `include/` in the profile's directory, beside
/// the library `cargo build` makes.
fn header_dir() -> PathBuf {
    profile_dir(&deps_dir()).join("include")
}

/// `target/<profile>/deps`, the test binary's directory.
fn deps_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary has a path");
    exe.parent()
        .expect("the test binary is in target/<profile>/deps")
        .to_path_buf()
}

fn profile_dir(deps: &Path) -> &Path {
    deps.parent()
        .unwrap_or_else(|| panic!("{} has no parent", deps.display()))
}
