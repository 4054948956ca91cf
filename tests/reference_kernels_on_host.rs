//! The kernels' own bodies, as embedded in the binary, run on the host against the reference
//! sum: every rank at once, one OS thread per CUDA thread, only the inline-PTX primitives
//! replaced by C++ atomics and barriers (tests/host_emulation). This checks indices, tails,
//! scratch layouts, barriers, epochs, cluster exchanges and the timeout path without a GPU;
//! the memory model of the real hardware is left to the GPU tests. Needs a C++20 compiler
//! (`CXX`, else `c++`).

use std::path::{Path, PathBuf};
use std::process::Command;

use prepare::kernels::{all_kernels, headers, source};

/// Removes the definition of `name` (a `__device__ __forceinline__` function ending with a `}`
/// line) from `text`.
fn drop_function(text: &str, name: &str) -> String {
    let call = format!(" {name}(");
    let position = text
        .find(&call)
        .unwrap_or_else(|| panic!("{name} not found"));
    let start = text[..position]
        .rfind("\n__device__")
        .expect("a definition")
        + 1;
    let end = position + text[position..].find("\n}\n").expect("an end") + 3;
    format!("{}{}", &text[..start], &text[end..])
}

/// The kernel sources and headers with their inline PTX replaced by the host versions.
fn write_emulated_sources(directory: &Path) {
    let replaced: [(&str, &[&str], &str); 3] = [
        (
            "prepare_sync.cuh",
            &[
                "global_timer_ns",
                "store_release_system",
                "load_acquire_system",
                "load_relaxed_device",
                "record_abort",
            ],
            "host_sync_prims.h",
        ),
        (
            "prepare_cluster.cuh",
            &[
                "cluster_cta_rank",
                "cluster_cta_count",
                "cluster_index",
                "cluster_sync",
                "store_cluster_shared",
            ],
            "host_cluster_prims.h",
        ),
        (
            "prepare_bf16.cuh",
            &["add_round_nearest"],
            "host_bf16_prims.h",
        ),
    ];
    let mut files: Vec<(String, String)> = headers()
        .iter()
        .map(|(name, text)| ((*name).to_owned(), (*text).to_owned()))
        .collect();
    for spec in all_kernels() {
        files.push((spec.source.to_owned(), source(&spec).to_owned()));
    }
    for (name, mut text) in files {
        if let Some((_, functions, host)) = replaced.iter().find(|(file, _, _)| *file == name) {
            for function in *functions {
                text = drop_function(&text, function);
            }
            text = text.replacen(
                "namespace prepare {\n",
                &format!("namespace prepare {{\n#include \"{host}\"\n"),
                1,
            );
        }
        text = text
            .replace(
                "__shared__ prepare::BlockFlags flags;",
                "prepare::BlockFlags& flags = emu_shared<prepare::BlockFlags>(0);",
            )
            .replace(
                "__shared__ prepare::ClusterFlags flags;",
                "prepare::ClusterFlags& flags = emu_shared<prepare::ClusterFlags>(0);",
            )
            .replace(
                "__shared__ int outcome;",
                "int& outcome = emu_shared<int>(1);",
            );
        assert!(!text.contains("asm"), "{name} still has inline PTX");
        assert!(
            !text.contains("__shared__"),
            "{name} still has shared memory"
        );
        std::fs::write(directory.join(&name), text).unwrap();
    }
}

fn build(directory: &Path, thread_sanitizer: bool) -> PathBuf {
    let emulation = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/host_emulation");
    write_emulated_sources(directory);
    let binary = directory.join("harness");
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".to_owned());
    let mut command = Command::new(&compiler);
    command
        .args(["-std=c++20", "-O1", "-g", "-pthread", "-w", "-include"])
        .arg(emulation.join("prelude.h"))
        .arg("-I")
        .arg(directory)
        .arg("-I")
        .arg(&emulation)
        .arg(emulation.join("harness.cc"))
        .arg("-o")
        .arg(&binary);
    if thread_sanitizer {
        command.arg("-fsanitize=thread");
    }
    let output = command.output().unwrap_or_else(|error| {
        panic!("this test needs a C++20 compiler; running `{compiler}` failed: {error} (install g++ or set CXX)")
    });
    assert!(
        output.status.success(),
        "{compiler} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    binary
}

fn run(binary: &Path, arguments: &[&str]) {
    let output = Command::new(binary)
        .args(arguments)
        .env("TSAN_OPTIONS", "halt_on_error=1")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "harness {arguments:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn kernels_give_the_reference_sum_on_every_rank() {
    let directory = tempfile::tempdir().unwrap();
    let binary = build(directory.path(), false);
    run(&binary, &["quick"]);
    run(&binary, &["streams", "1"]);
}

#[test]
#[ignore = "slow: every world size, then ThreadSanitizer over the stream sequences"]
fn kernels_are_exact_at_every_world_size_and_race_free() {
    let directory = tempfile::tempdir().unwrap();
    run(&build(directory.path(), false), &["full"]);
    let sanitized = tempfile::tempdir().unwrap();
    run(&build(sanitized.path(), true), &["streams", "1"]);
}
