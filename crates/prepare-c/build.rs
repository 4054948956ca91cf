//! Generates the C header `prepare.h` from `src/` with cbindgen (settings: `cbindgen.toml`), so
//! the header and the library a C user links come from one build and cannot disagree.
//!
//! The header is written to `$OUT_DIR/include/prepare.h`, the one directory Cargo lets a build
//! script write, and copied to `include/prepare.h` in the directory that holds
//! `libprepare_c.so` (`target/<profile>/`, or `target/<triple>/<profile>/` with `--target`):
//! `-I target/release/include -L target/release -lprepare_c`. Cargo gives a build script no
//! name for that directory; it is `$OUT_DIR`'s third ancestor in the layout Cargo uses for
//! both (`<profile>/build/prepare-c-<hash>/out`). The layout is checked rather than assumed:
//! where it differs (a separate `build-dir`), the copy is skipped with a warning that says
//! where the header is. Nothing is written into the source tree.

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    let crate_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("Cargo sets it"));
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("Cargo sets it"));

    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .unwrap_or_else(|error| panic!("crates/prepare-c/cbindgen.toml: {error}"));
    let bindings = cbindgen::Builder::new()
        .with_src(crate_dir.join("src/lib.rs"))
        .with_config(config)
        .generate()
        .unwrap_or_else(|error| panic!("cbindgen cannot generate prepare.h: {error}"));
    let generated = out_dir.join("include/prepare.h");
    bindings.write_to_file(&generated);

    match library_dir(&out_dir) {
        Some(dir) => {
            let copy = dir.join("include/prepare.h");
            std::fs::create_dir_all(copy.parent().expect("a file path has a parent"))
                .and_then(|()| std::fs::copy(&generated, &copy))
                .unwrap_or_else(|error| {
                    panic!("cannot copy prepare.h to {}: {error}", copy.display())
                });
        }
        None => println!(
            "cargo:warning=prepare.h is at {} only: {} is not in Cargo's usual \
             <profile>/build/<package>/out layout, so the directory of libprepare_c.so is unknown",
            generated.display(),
            out_dir.display()
        ),
    }
}

/// The directory Cargo puts this package's libraries in, from `OUT_DIR`
/// (`<dir>/build/prepare-c-<hash>/out`), or `None` where `OUT_DIR` is not in that layout.
fn library_dir(out_dir: &Path) -> Option<&Path> {
    let package = out_dir.parent().filter(|_| out_dir.ends_with("out"))?;
    let build = package.parent()?;
    let named = |path: &Path, prefix: &str| {
        path.file_name()
            .and_then(|name| name.to_str())
            .is_some_and(|name| name.starts_with(prefix))
    };
    (named(package, "prepare-c-") && build.ends_with("build"))
        .then(|| build.parent())
        .flatten()
}
