//! The kernels' own bodies, as embedded in the binary, run on the host against the reference
//! sum: every rank at once, one OS thread per CUDA thread, only the inline-PTX primitives
//! replaced by C++ atomics and barriers (tests/host_emulation). This checks indices, tails,
//! scratch layouts, barriers, epochs, cluster exchanges and the timeout path without a GPU;
//! the memory model of the real hardware is left to the GPU tests. Needs a C++20 compiler
//! (`CXX`, else `c++`).
//!
//! Every planted mutation (tests/support/mutations.rs) must give a wrong sum here too, in every
//! kernel it touches. The invariance mode (tests/host_emulation/invariance.h) checks that a
//! row's sum is the same bytes in every message and kernel, and must catch a sum order that
//! depends on the message size.

// Each mutation's failures are reported on stderr for the test log.
#![allow(clippy::print_stderr)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Instant;

use prepare::kernels::{all_kernels, headers, scratch_layouts, source, KernelSpec};
use prepare::ladder::{validate_ladder_file, Dtype};

use crate::support::mutations::{apply, Mutation};
use crate::support::repository::root;

/// Removes the definition of `name` (a `__device__ __forceinline__` function ending with a `}`
/// line, a template's `template <...>` line above it included) from `text`.
fn drop_function(text: &str, name: &str) -> String {
    let call = format!(" {name}(");
    let position = text
        .find(&call)
        .unwrap_or_else(|| panic!("{name} not found"));
    let mut start = text[..position]
        .rfind("\n__device__")
        .expect("a definition")
        + 1;
    if let Some(line) = text[..start - 1].rfind('\n') {
        if text[line + 1..start].starts_with("template <") {
            start = line + 1;
        }
    }
    let end = position + text[position..].find("\n}\n").expect("an end") + 3;
    format!("{}{}", &text[..start], &text[end..])
}

/// The kernel sources and headers, with `mutation` planted when given, their inline PTX
/// replaced by the host versions.
fn write_emulated_sources(directory: &Path, mutation: Option<Mutation>) {
    let replaced: [(&str, &[&str], &str); 4] = [
        (
            "prepare_sync.cuh",
            &[
                "global_timer_ns",
                "spin_until",
                "end_deadline",
                "deadline_ended",
                "spin_until_ended",
                "store_release_system",
                "load_acquire_system",
                "load_relaxed_device",
                "record_abort",
                "store_line_volatile",
                "load_line_volatile",
                "wait_for_previous_grid",
                "allow_next_grid",
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
            "prepare_element.cuh",
            &[
                "add_round_nearest",
                "fp16_bits_to_float",
                "float_to_fp16_bits",
            ],
            "host_element_prims.h",
        ),
        (
            "prepare_norm.cuh",
            &[
                "mul_round_nearest",
                "div_round_nearest",
                "sqrt_round_nearest",
                "shuffle_xor",
            ],
            "host_norm_prims.h",
        ),
    ];
    let mut files: Vec<(String, String)> = headers()
        .iter()
        .map(|(name, text)| ((*name).to_owned(), (*text).to_owned()))
        .collect();
    for spec in all_kernels(Dtype::Bf16, 2) {
        if !files.iter().any(|(name, _)| name == spec.source) {
            files.push((spec.source.to_owned(), source(&spec).to_owned()));
        }
    }
    for (file, patched) in mutation.map(apply).unwrap_or_default() {
        for (name, text) in &mut files {
            if *name == file {
                text.clone_from(&patched);
            }
        }
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
                "__shared__ BlockFlags flags;",
                "BlockFlags& flags = emu_shared<BlockFlags>(0);",
            )
            .replace(
                "__shared__ ClusterFlags flags;",
                "ClusterFlags& flags = emu_shared<ClusterFlags>(0);",
            )
            .replace(
                "__shared__ int outcome;",
                "int& outcome = emu_shared<int>(1);",
            )
            .replace(
                "__shared__ NormShared norm_shared;",
                "NormShared& norm_shared = emu_shared<NormShared>(1);",
            );
        // The harness's late rank waits before its first store of data (stalls.h): a plain
        // store of a vector or an element, or a line that carries data (the `ll` protocol's;
        // its shape lines and the zeroing of consumed lines are not data).
        let data_stores: &[&str] = match name.as_str() {
            "prepare_element.cuh" => &[
                "reinterpret_cast<Vec16*>(base)[vector] = value;",
                "reinterpret_cast<typename T::Bits*>(base)[element] = value;",
            ],
            "prepare_double_buffer.cuh" => &[
                "store_line_volatile(line_address<N>(region, 2 * v, parity, slot), low);",
                "store_line_volatile(line_address<N>(region, line, parity, slot), words);",
            ],
            _ => &[],
        };
        for store in data_stores {
            assert_eq!(
                text.matches(store).count(),
                1,
                "{name} no longer stores data once with `{store}`"
            );
            text = text.replace(store, &format!("emu_store_pause();\n    {store}"));
        }
        assert!(!text.contains("asm"), "{name} still has inline PTX");
        assert!(
            !text.contains("__shared__"),
            "{name} still has shared memory"
        );
        std::fs::write(directory.join(&name), text).unwrap();
    }
}

/// Writes `scratch_layouts.h`, the harness's `enum class Scratch`: one enumerator per scratch
/// layout of the kernel table, so a layout is named in Rust only.
fn write_scratch_layouts(directory: &Path) {
    let header = format!(
        "// Generated from prepare::kernels::scratch_layouts by the test that builds the harness.\n\
         #pragma once\n\
         enum class Scratch {{\n    {},\n}};\n",
        scratch_layouts().join(",\n    ")
    );
    std::fs::write(directory.join("scratch_layouts.h"), header).unwrap();
}

/// How a harness is compiled.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Build {
    /// Optimized: the modes that check every kernel at length.
    Checked,
    /// Optimized, with debug information (for the race reports), under ThreadSanitizer.
    Sanitized,
    /// Unoptimized, for modes whose time goes to the emulated threads' waits, not to the
    /// kernels' arithmetic: the invariance and slices modes, a mutation's harness.
    Quick,
}

/// A mutation's harness at `max_world`: the kernels instantiated for worlds 2 to `max_world`
/// only, all its modes run (the exactness mode's kernels run at worlds 2 and 3), at a
/// fraction of the compile time of every world.
fn build_mutated(directory: &Path, mutation: Mutation, max_world: u32) -> PathBuf {
    build_for(directory, Build::Quick, Some(mutation), Some(max_world))
}

fn build(directory: &Path, kind: Build, mutation: Option<Mutation>) -> PathBuf {
    build_for(directory, kind, mutation, None)
}

fn build_for(
    directory: &Path,
    kind: Build,
    mutation: Option<Mutation>,
    max_world: Option<u32>,
) -> PathBuf {
    let emulation = root().join("tests/host_emulation");
    write_emulated_sources(directory, mutation);
    write_scratch_layouts(directory);
    let binary = directory.join("harness");
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".to_owned());
    let mut command = Command::new(&compiler);
    let optimization: &[&str] = match kind {
        Build::Quick => &["-O0"],
        Build::Checked => &["-O1"],
        Build::Sanitized => &["-O1", "-g"],
    };
    command
        .args(["-std=c++20", "-pthread", "-w"])
        .args(optimization)
        .arg("-include")
        .arg(emulation.join("prelude.h"))
        .arg("-I")
        .arg(directory)
        .arg("-I")
        .arg(&emulation)
        .arg(emulation.join("harness.cc"))
        .arg("-o")
        .arg(&binary);
    if kind == Build::Sanitized {
        command.arg("-fsanitize=thread");
    }
    if let Some(world) = max_world {
        command.arg(format!("-DHARNESS_MAX_WORLD={world}"));
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

/// The unmutated harness of `kind`, built once for every test of this run that uses it (each
/// build compiles every kernel), in a directory of this process under cargo's test scratch.
fn shared(kind: Build) -> &'static Path {
    static BUILDS: [OnceLock<PathBuf>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let (slot, name) = match kind {
        Build::Checked => (0, "checked"),
        Build::Sanitized => (1, "sanitized"),
        Build::Quick => (2, "quick"),
    };
    BUILDS[slot].get_or_init(|| {
        let directory = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("host-emulation-{name}-{}", std::process::id()));
        // A directory left by an earlier process of the same id holds nothing to keep.
        let _ = std::fs::remove_dir_all(&directory);
        std::fs::create_dir_all(&directory).unwrap();
        build(&directory, kind, None)
    })
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

/// What the harness's `exactness` mode reported: each kernel's entry name and whether it gave
/// the reference sum every time, with the whole output.
fn exactness(binary: &Path) -> (BTreeMap<String, bool>, String) {
    verdicts(binary, &["exactness"], ("exact", "inexact"), |_| true)
}

/// The `exactness` mode run on `entries` only, each kernel's cases ending at its first wrong
/// sum: each entry and whether it gave the reference sum every time, with the whole output.
fn exactness_until_wrong(binary: &Path, entries: &[String]) -> (BTreeMap<String, bool>, String) {
    let mut arguments = vec!["exactness", "--stop-at-first-wrong"];
    arguments.extend(entries.iter().map(String::as_str));
    verdicts(binary, &arguments, ("exact", "inexact"), |spec| {
        entries.contains(&spec.name)
    })
}

/// What the harness's `invariance` mode reported at `boundaries` (`WORLD:BYTES`): each kernel's
/// entry name and whether every row it summed was the reference and the same bytes in every
/// message, with the whole output.
fn invariance(binary: &Path, boundaries: &[String]) -> (BTreeMap<String, bool>, String) {
    let mut arguments = vec!["invariance"];
    arguments.extend(boundaries.iter().map(String::as_str));
    // The all-reduce kernels and the epilogue's. The rank-order sum is the exact NCCL path's
    // local step, not a collective kernel a bucket runs: its sum per element in rank order at
    // every world and size is the `rank_order` mode's check; the reduce-scatter and all-gather
    // kernels are the `quick`, `full` and `exactness` modes'.
    verdicts(binary, &arguments, ("invariant", "varies"), |spec| {
        spec.name.starts_with("all_reduce_") || spec.name.starts_with("add_rms_norm_")
    })
}

/// `WORLD:BYTES` for the invariance mode at each world of `worlds`: the first bucket boundary
/// of the shipped H200 ladder of that world (bf16), so the mode's messages below and above it
/// are in different buckets of a real ladder.
fn shipped_boundaries(worlds: &[u32]) -> Vec<String> {
    worlds
        .iter()
        .map(|world| {
            let path = root().join(format!("ladders/h200_nvlink_tp{world}.json"));
            let ladder = validate_ladder_file(&path)
                .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
            assert!(
                ladder.buckets.len() > 1,
                "{} has one bucket",
                path.display()
            );
            format!("{world}:{}", ladder.buckets[0].max_bytes)
        })
        .collect()
}

/// A mode that prints one line per kernel entry, `<entry>: <pass word>` or `<entry>: <fail
/// word> (...)`, run with `arguments`: each entry and whether it passed, with the whole output.
/// Every kernel entry that `reports` must be reported, and the exit status must agree with the
/// verdicts.
fn verdicts(
    binary: &Path,
    arguments: &[&str],
    (pass, fail): (&str, &str),
    reports: impl Fn(&KernelSpec) -> bool,
) -> (BTreeMap<String, bool>, String) {
    let output = Command::new(binary).args(arguments).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let verdicts: BTreeMap<String, bool> = text
        .lines()
        .filter_map(|line| {
            let (kernel, verdict) = line.split_once(": ")?;
            let passed = verdict == pass;
            (passed || verdict.starts_with(fail)).then(|| (kernel.to_owned(), passed))
        })
        .collect();
    let mut names: Vec<String> = Dtype::ALL
        .into_iter()
        .flat_map(|dtype| all_kernels(dtype, 2))
        .filter(|spec| reports(spec))
        .map(|spec| spec.name)
        .collect();
    names.sort();
    assert_eq!(
        verdicts.keys().cloned().collect::<Vec<_>>(),
        names,
        "the harness did not report every kernel:\n{text}"
    );
    let all_passed = verdicts.values().all(|passed| *passed);
    assert_eq!(
        output.status.success(),
        all_passed,
        "the exit status disagrees with the verdicts:\n{text}"
    );
    (verdicts, text)
}

/// The entries whose verdict was a failure, sorted.
fn failed(verdicts: &BTreeMap<String, bool>) -> Vec<&str> {
    verdicts
        .iter()
        .filter(|(_, passed)| !**passed)
        .map(|(kernel, _)| kernel.as_str())
        .collect()
}

#[test]
fn kernels_give_the_reference_sum_on_every_rank() {
    let binary = shared(Build::Checked);
    run(binary, &["quick"]);
    run(binary, &["streams", "1"]);
    let (verdicts, text) = exactness(binary);
    assert!(verdicts.values().all(|exact| *exact), "{text}");
}

/// The reduce-scatter's and all-gather's kernels and the identity (rows.h `rows_large_mode`)
/// at 2047 and 2048 rows of 4096, which the quick mode's cap leaves out, at two ranks in every
/// type; the full mode takes them at every world.
#[test]
fn row_kernels_are_exact_at_2047_and_2048_rows_of_4096() {
    run(shared(Build::Checked), &["rows_large", "2"]);
}

/// The exact NCCL all-reduce's local sum (kernels/nccl_rank_order_sum.cu) at every world size
/// 2 to 8 and in every type, on data with signed zeros, subnormals, infinities and NaNs, the
/// NCCL exchange and all-gather emulated by copies: every element equals the reference sum.
#[test]
fn the_rank_order_sum_gives_the_reference_sum_at_every_world_size() {
    run(shared(Build::Checked), &["rank_order"]);
}

/// The host's slices ([`prepare::kernels::slice_of`]), by which the exact NCCL all-reduce
/// sends and gathers, are the header's (kernels/prepare_layout.cuh `slice_of`), by which its
/// kernel sums: every type, world 2 to 8, sizes around every vector and slice edge.
#[test]
fn the_host_slices_are_the_headers() {
    let binary = shared(Build::Quick);
    let output = Command::new(binary)
        .args(["slices", "2", "3", "4", "5", "6", "7", "8"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let text = String::from_utf8(output.stdout).unwrap();
    let mut checked = 0;
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let [dtype, numbers @ ..] = fields.as_slice() else {
            panic!("a line of the slices: {line}");
        };
        let dtype = Dtype::ALL
            .into_iter()
            .find(|candidate| candidate.name() == *dtype)
            .unwrap_or_else(|| panic!("a type: {line}"));
        let numbers: Vec<u64> = numbers.iter().map(|n| n.parse().unwrap()).collect();
        let [world, elements, slice, begin, end, tail_begin, tail_end] = numbers[..] else {
            panic!("seven numbers: {line}");
        };
        let host = prepare::kernels::slice_of(slice as u32, elements, dtype, world as u32);
        assert_eq!(
            (
                host.begin_vector,
                host.end_vector,
                host.tail_begin,
                host.tail_end
            ),
            (begin, end, tail_begin, tail_end),
            "{line}"
        );
        checked += 1;
    }
    // Every type, every world, every size, every slice.
    assert!(checked > 3 * 7 * 10, "{checked} slices checked:\n{text}");
}

/// Each mutation's harness is built and run in its own thread, on the kernels the mutation
/// touches only, each kernel's cases ending at its first wrong sum: every one of them must give
/// a wrong sum. The kernels it does not touch need no run here: under every mutation their
/// cubins are byte for byte the unmutated ones
/// (`nvrtc::mutations::every_mutation_builds_and_changes_exactly_the_kernels_it_touches`), and
/// the unmutated exactness run shows those exact
/// (`kernels_give_the_reference_sum_on_every_rank`). The emulation catches the missing waits
/// (start barrier, line, step, copy-engine start) in every run, however loaded the machine,
/// only because the `exactness` mode has a late rank that goes on only once every other rank
/// has stalled (`tests/host_emulation/stalls.h`): a kernel that does not wait for it has then
/// already read what it did not wait for. With every rank on time the races would show only
/// sometimes.
#[test]
fn every_planted_mutation_gives_a_wrong_sum() {
    let started = Instant::now();
    let reports: Vec<(Mutation, BTreeMap<String, bool>, String)> = std::thread::scope(|scope| {
        let runs: Vec<_> = Mutation::ALL
            .into_iter()
            .map(|mutation| {
                scope.spawn(move || {
                    let directory = tempfile::tempdir().unwrap();
                    let binary = build_mutated(directory.path(), mutation, 3);
                    let (verdicts, text) = exactness_until_wrong(&binary, &mutation.kernels());
                    (mutation, verdicts, text)
                })
            })
            .collect();
        runs.into_iter()
            .map(|run| run.join().expect("a mutation's harness ran"))
            .collect()
    });
    for (mutation, verdicts, text) in &reports {
        let wrong = failed(verdicts);
        eprintln!("{mutation}: wrong sums from {}", wrong.join(", "));
        // The verdicts are of the kernels it touches, each of them (`verdicts` holds to that).
        assert_eq!(
            wrong,
            mutation.kernels(),
            "{mutation}: some kernel it touches gave the reference sum:\n{text}"
        );
    }
    eprintln!(
        "{} mutations built and run in {:.1} s",
        reports.len(),
        started.elapsed().as_secs_f64()
    );
}

#[test]
#[ignore = "slow: every world size, then ThreadSanitizer over the stream sequences"]
fn kernels_are_exact_at_every_world_size_and_race_free() {
    run(shared(Build::Checked), &["full"]);
    let sanitized = tempfile::tempdir().unwrap();
    run(
        &build(sanitized.path(), Build::Sanitized, None),
        &["streams", "1"],
    );
}

/// Batch invariance: at 2, 4 and 8 ranks, in every type, every kernel sums rows inside
/// messages of 1 row, 3, just below and just above the first bucket boundary of the shipped
/// ladder of that world, and in pieces above a ladder ending there (the serving code's cut);
/// each row must be the reference and the same bytes in every message and kernel.
#[test]
fn every_row_is_the_same_bytes_in_every_message_and_kernel() {
    let started = Instant::now();
    let binary = shared(Build::Quick);
    let built = started.elapsed();
    let started = Instant::now();
    let (verdicts, text) = invariance(binary, &shipped_boundaries(&[2, 4, 8]));
    assert!(
        failed(&verdicts).is_empty(),
        "rows differ between messages or from the reference:\n{text}"
    );
    eprintln!(
        "invariance: built in {:.1} s, run in {:.1} s",
        built.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}

/// A kernel whose sum order depends on the message size gives a row different bytes in a
/// small and a large message: the invariance mode says so for exactly that kernel, in every
/// type, at four ranks (at two, both orders add the same two values), while the exactness
/// mode, whose messages are all below the size where the order changes, misses it.
#[test]
fn a_sum_order_that_depends_on_the_message_size_breaks_invariance() {
    let mutation = Mutation::SizeDependentOrder;
    let directory = tempfile::tempdir().unwrap();
    let binary = build_mutated(directory.path(), mutation, 4);
    let (verdicts, text) = invariance(&binary, &shipped_boundaries(&[4]));
    assert_eq!(
        failed(&verdicts),
        mutation.kernels(),
        "{mutation}: the kernels the invariance mode found varying are not those it touches:\n{text}"
    );
    // Built for worlds up to four, the harness refuses a launch at eight instead of running it
    // at another world.
    let output = Command::new(&binary)
        .args(["invariance", &shipped_boundaries(&[8])[0]])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        !output.status.success() && stdout.contains("built for worlds up to 4"),
        "a launch at eight ranks in a harness built for four:\n{stdout}"
    );
    // The exactness mode on the kernel it touches (the others are unmutated and byte-identical
    // to the kernels the unmutated harness shows exact).
    let (verdicts, text) = exactness_until_wrong(&binary, &mutation.kernels());
    assert!(
        failed(&verdicts).is_empty(),
        "{mutation}: the exactness mode caught it too, so its messages reach past the size where \
         the order changes; update the mutation's doc and this test:\n{text}"
    );
}

/// The bytes of a comma-separated list of hex element bits.
fn hex_elements(dtype: Dtype, list: &str) -> Vec<u8> {
    let size = dtype.size_bytes() as usize;
    list.split(',')
        .flat_map(|bits| u32::from_str_radix(bits, 16).unwrap().to_le_bytes()[..size].to_vec())
        .collect()
}

/// prepare's unfused residual add + RMSNorm (kernels/add_rms_norm.cu) on the host, in every
/// type: hidden sizes 8 to 16,384 and random multiples of 8, messages of 0, 1, 3 and 64 rows,
/// with a residual and without, `normed` over the input or apart, on ordinary values, signed
/// zeros, subnormals, rows of zeros, NaN, infinities and squares that overflow, each output
/// equal to the harness's mirror of the reference; a row the same bytes alone and among other
/// rows; every launch it cannot do refused. The mirror's own inputs and outputs (a line per
/// case) must be [`reference_add_rms_norm`]'s, so the mirror is the Rust reference.
#[test]
fn the_epilogue_kernel_gives_the_reference_and_its_mirror_is_the_reference() {
    use prepare::reference::{reference_add_rms_norm, EpilogueInputs};
    use prepare::shape::Shape;

    let output = Command::new(shared(Build::Checked))
        .arg("norm")
        .output()
        .unwrap();
    let text = String::from_utf8(output.stdout).unwrap();
    let failures: Vec<&str> = text
        .lines()
        .filter(|line| !line.starts_with("norm "))
        .collect();
    assert!(output.status.success(), "{}", failures.join("\n"));
    let mut checked = Vec::new();
    for line in text.lines().filter(|line| line.starts_with("norm ")) {
        let fields: Vec<&str> = line.split(' ').collect();
        let [_, dtype, hidden, rows, eps, x, residual, weight, normed, residual_out] = fields[..]
        else {
            panic!("a line of ten fields: {}", &line[..line.len().min(200)]);
        };
        let dtype = Dtype::ALL
            .into_iter()
            .find(|candidate| candidate.name() == dtype)
            .unwrap();
        let (hidden, rows): (u64, u64) = (hidden.parse().unwrap(), rows.parse().unwrap());
        let residual = (residual != "-").then(|| hex_elements(dtype, residual));
        let weight = hex_elements(dtype, weight);
        let epilogue = EpilogueInputs {
            residual: residual.as_deref(),
            weight: &weight,
            eps: f32::from_bits(u32::from_str_radix(eps, 16).unwrap()),
        };
        let shape = Shape::new(rows, hidden).unwrap();
        let reference =
            reference_add_rms_norm(dtype, shape, &hex_elements(dtype, x), &epilogue).unwrap();
        let what = format!(
            "{dtype}, {rows} x {hidden}, residual {}",
            residual.is_some()
        );
        assert!(
            reference.normed == hex_elements(dtype, normed),
            "{what}: normed"
        );
        assert!(
            reference.residual_out == hex_elements(dtype, residual_out),
            "{what}: residual_out"
        );
        checked.push((dtype, hidden, residual.is_some()));
    }
    // Every type, four hidden sizes, with a residual and without.
    assert_eq!(checked.len(), 3 * 4 * 2, "{checked:?}");
}

/// Whether the harness's `shapes` mode runs `spec`: every kernel that checks the shape but the
/// copy engines', whose start barrier is the same code (block_barrier).
fn checked_by_the_shapes_mode(spec: &KernelSpec) -> bool {
    Mutation::ShapeCheckSkipped.kernels().contains(&spec.name) && !is_copy_engine(&spec.name)
}

/// Whether `name` is a copy-engine kernel's (the all-reduce's or the all-gather's).
fn is_copy_engine(name: &str) -> bool {
    name.contains("_one_shot_copy_engine_")
}

/// Ranks that disagree on their message (one rank's rows one more, one rank's width another,
/// one rank with rows 0; an all-reduce's element count), at every world 2 to 8 and in every
/// type, for every reduce-scatter, all-gather, fused and all-reduce kernel (the cluster ones
/// included) but the copy engines': every rank ends with the shape-mismatch abort naming a
/// peer of another shape, well before the deadline. A kernel with the start barrier or the
/// cluster kernels' start exchange writes nothing (operands, their guards, the registered
/// buffer past the message, its scratch and the guard after it); a double-buffered one nothing
/// but its output (a fused one's residual) and its region.
#[test]
fn ranks_that_disagree_on_the_shape_each_abort_and_write_nothing() {
    let (verdicts, text) = verdicts(
        shared(Build::Checked),
        &["shapes"],
        ("refused", "not refused"),
        checked_by_the_shapes_mode,
    );
    assert!(failed(&verdicts).is_empty(), "{text}");
}

/// With the comparison of the shape lines planted away, the `shapes` mode says so for exactly
/// the kernels it runs that the mutation touches, each of them. Each entry ends at its first
/// failed case, under a deadline of 2 s: a double-buffered kernel that does not check waits one
/// out.
#[test]
fn a_skipped_shape_check_is_caught() {
    let mutation = Mutation::ShapeCheckSkipped;
    let directory = tempfile::tempdir().unwrap();
    let binary = build_mutated(directory.path(), mutation, 3);
    let (verdicts, text) = verdicts(
        &binary,
        &[
            "shapes",
            "--stop-at-first-wrong",
            "--deadline-ms",
            "2000",
            "2",
            "3",
        ],
        ("refused", "not refused"),
        checked_by_the_shapes_mode,
    );
    let expected: Vec<String> = mutation
        .kernels()
        .into_iter()
        .filter(|name| !is_copy_engine(name))
        .collect();
    assert_eq!(failed(&verdicts), expected, "{text}");
}
