//! Compiles `tests/c/no_gpu.c` with the system's C compiler against the generated `prepare.h`
//! (`target/<profile>/include/`, where the build script writes it), links it to the cdylib
//! this crate builds, and runs it: the C ABI's error paths with no GPU, no driver and no
//! torchrun variables (a missing package, an invalid ladder, null arguments, counts and
//! timeouts out of range, the reduce-scatter's and all-gather's shape and dtype checks, the
//! shape rule, a failing call from a thread's exit). Running at all shows the
//! library loads on a machine without libcuda or NCCL; an empty stderr shows it printed
//! nothing there, not even for a panic it caught.

#![allow(clippy::print_stdout)]

use std::path::Path;
use std::process::Command;

use prepare::compile::Compilation;
use prepare::hash::sha256_hex;
use prepare::ladder::{Arch, Ladder};
use prepare::package::{write_package, Manifest};

use crate::{crate_dir, header_dir, library_dir, repository_file};

/// A ladder whose only candidate is NCCL (a fixture of the tool's tests): its package holds no
/// kernel, so it is written without NVRTC.
fn nccl_only_ladder() -> String {
    let path = repository_file("tests/fixtures/ladders/valid/minimal.json");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()))
}

pub(crate) fn write_nccl_only(out: &Path) {
    let text = nccl_only_ladder();
    let ladder: Ladder = serde_json::from_str(&text).expect("the ladder parses");
    let compilation = Compilation {
        nvrtc_version: (13, 0),
        options: Vec::new(),
        kernels: Vec::new(),
    };
    write_package(out, &text, &ladder, &compilation, Arch::Sm90, false)
        .expect("the package writes");
}

/// A package whose ladder.json matches the manifest's hash but breaks a ladder rule.
fn write_invalid_ladder(out: &Path) {
    write_nccl_only(out);
    let invalid = nccl_only_ladder().replace("\"world_size\": 2", "\"world_size\": 9");
    std::fs::write(out.join("ladder.json"), &invalid).unwrap();
    let mut manifest: Manifest =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    manifest.ladder.sha256 = sha256_hex(invalid.as_bytes());
    manifest.seal();
    std::fs::write(out.join("manifest.json"), manifest.to_bytes()).unwrap();
}

#[test]
fn the_c_program_sees_every_error_path_as_a_status_and_a_message() {
    let crate_dir = crate_dir();
    let scratch = tempfile::tempdir().unwrap();
    let nccl_only = scratch.path().join("nccl_only");
    let invalid = scratch.path().join("invalid_ladder");
    let missing = scratch.path().join("no_such_package");
    write_nccl_only(&nccl_only);
    write_invalid_ladder(&invalid);

    let library = library_dir();
    let program = scratch.path().join("no_gpu");
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let build = Command::new(&compiler)
        .args(["-std=c11", "-pthread", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&program)
        .arg(crate_dir.join("tests/c/no_gpu.c"))
        .arg("-I")
        .arg(header_dir())
        .arg("-L")
        .arg(&library)
        .arg(format!("-Wl,-rpath,{}", library.display()))
        .arg("-lprepare_c")
        .output()
        .unwrap_or_else(|error| panic!("cannot run the C compiler {compiler}: {error}"));
    assert!(
        build.status.success(),
        "{compiler} failed:\n{}",
        String::from_utf8_lossy(&build.stderr)
    );

    let mut run = Command::new(&program);
    // The library just built, before any other copy on the loader's path that Cargo set (an
    // older `cargo build`'s in the profile directory would otherwise shadow the rpath).
    let mut search = vec![library.clone()];
    search.extend(
        std::env::var_os("LD_LIBRARY_PATH")
            .iter()
            .flat_map(std::env::split_paths),
    );
    run.env(
        "LD_LIBRARY_PATH",
        std::env::join_paths(search).expect("library directories join"),
    );
    run.arg(env!("CARGO_PKG_VERSION"))
        .arg(&missing)
        .arg(&invalid)
        .arg(&nccl_only)
        .env("XDG_CACHE_HOME", scratch.path().join("cache"));
    for name in [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "NCCL_COMM_ID",
        // NCCL's own logging would be the host's output, not the library's.
        "NCCL_DEBUG",
    ] {
        run.env_remove(name);
    }
    let output = run.output().expect("the C program runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the C program failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    // Shown with --nocapture: every message the C side saw.
    println!("{stdout}");
    assert!(stdout.contains("every check passed"), "{stdout}\n{stderr}");
    assert!(
        stderr.is_empty(),
        "the library wrote to the host's stderr:\n{stderr}"
    );
}
