//! Qualification and timing on real GPUs: `prepare export --gpus` qualifies every candidate of
//! the clustered H200 TP2 ladder in CUDA graphs and records the outcome in the manifest, which
//! `prepare show` lists; `prepare bench` times every candidate and NCCL side by side.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::support::{
    h200_tp2_packages, ladder, prepare_bin, printed, require_gpus, written_ladder,
};

fn run(args: &[&std::ffi::OsStr]) -> (bool, String) {
    let output = Command::new(prepare_bin()).args(args).output().unwrap();
    (output.status.success(), printed(&output))
}

/// `prepare export --gpus 0,1` of `ladder_file` into a fresh directory, which must succeed and
/// qualify the multi-size sequence; returns the directory and the package in it.
fn export_on_gpus(ladder_file: &Path) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("package");
    let started = std::time::Instant::now();
    let (ok, text) = run(&[
        "export".as_ref(),
        "--gpus".as_ref(),
        "0,1".as_ref(),
        "--timeout".as_ref(),
        "30".as_ref(),
        "--collective-ladder".as_ref(),
        ladder_file.as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
    ]);
    eprintln!("export --gpus 0,1 took {:?}:\n{text}", started.elapsed());
    assert!(ok, "export --gpus failed");
    // The multi-size sequence captures every candidate, one after another in one graph.
    assert!(text.contains("multi-size sequence:"), "{text}");
    (dir, out)
}

/// The package's qualification, read through `prepare show --json`: two GPUs, every candidate
/// of every bucket listed and qualified exact (on two H200s every candidate fits, and NCCL's
/// sum equals the reference at two ranks). Returns the qualified profiles.
fn every_candidate_qualified_exact(out: &Path) -> Vec<String> {
    let (ok, json) = run(&["show".as_ref(), "--json".as_ref(), out.as_os_str()]);
    assert!(ok, "{json}");
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    let qualification = &value["manifest"]["qualification"];
    assert_eq!(qualification["gpus"].as_array().unwrap().len(), 2, "{json}");
    let manifest_buckets = value["manifest"]["buckets"].as_array().unwrap();
    let buckets = qualification["buckets"].as_array().unwrap();
    assert_eq!(buckets.len(), manifest_buckets.len());
    let mut qualified = Vec::new();
    for (bucket, listed) in buckets.iter().zip(manifest_buckets) {
        let candidates = bucket["candidates"].as_array().unwrap();
        assert_eq!(
            candidates.len(),
            listed["candidates"].as_array().unwrap().len()
        );
        for candidate in candidates {
            assert_eq!(
                candidate["outcome"],
                serde_json::json!({"qualified": {"exact": true}}),
                "bucket {}: {candidate}",
                bucket["index"]
            );
            qualified.push(candidate["profile"].as_str().unwrap().to_owned());
        }
    }
    qualified
}

#[test]
#[ignore = "needs GPUs"]
fn export_on_gpus_qualifies_every_candidate_and_show_lists_them() {
    require_gpus!(2);
    let (_dir, out) = export_on_gpus(&ladder("h200_nvlink_tp2_clustered.json"));

    let (ok, shown) = run(&["show".as_ref(), out.as_os_str()]);
    eprintln!("{shown}");
    assert!(ok);
    let qualified = every_candidate_qualified_exact(&out);
    eprintln!("{} candidates qualified", qualified.len());
    assert!(shown.contains("Qualification"), "{shown}");
}

/// `prepare COMMAND` of `package` on GPUs 0 and 1 with a 30 s timeout, `--cache-dir cache`,
/// `--out out` and `extra`.
fn on_two_gpus(
    command: &str,
    package: &Path,
    cache: &Path,
    out: &Path,
    extra: &[&str],
) -> (bool, String) {
    let mut args: Vec<&std::ffi::OsStr> = vec![
        command.as_ref(),
        "--gpus".as_ref(),
        "0,1".as_ref(),
        "--timeout".as_ref(),
        "30".as_ref(),
        "--package".as_ref(),
        package.as_os_str(),
        "--cache-dir".as_ref(),
        cache.as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
    ];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    run(&args)
}

/// A bf16 TP2 ladder for sm_90 named `name`, with these profiles and buckets (JSON arrays).
fn tp2_ladder(name: &str, profiles: &str, buckets: &str) -> String {
    format!(
        r#"{{"format_version": 1, "name": "{name}", "collective": "all_reduce", "dtype": "bf16",
  "world_size": 2, "targets": ["sm_90"], "profiles": {profiles}, "buckets": {buckets}}}"#
    )
}

#[test]
#[ignore = "needs GPUs"]
fn bench_times_every_candidate_and_nccl_side_by_side() {
    require_gpus!(2);
    for (name, dir, package) in h200_tp2_packages() {
        let out = dir.path().join("bench");
        let cache = dir.path().join("cache");
        let (ok, text) = on_two_gpus(
            "bench",
            &package,
            &cache,
            &out,
            &["--sizes", "8K,256K,4M,64M"],
        );
        eprintln!("{name}:\n{text}");
        assert!(ok, "bench failed");
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("bench.json")).unwrap()).unwrap();
        assert_eq!(report["collective"], "all_reduce");
        assert!(
            text.contains("all_reduce ") && text.contains("busbw: bytes x 2(n-1)/n / time"),
            "the bench names its collective and bus bandwidth"
        );
        let rows = report["sizes"].as_array().unwrap();
        for size in [8 << 10, 256 << 10, 4 << 20, 64 << 20] {
            let at: Vec<_> = rows.iter().filter(|row| row["bytes"] == size).collect();
            assert!(
                at.iter()
                    .any(|row| row["profile"] == "nccl" && row["median_us"].is_number()),
                "{size}: NCCL not timed"
            );
            assert!(
                at.iter().all(|row| row["median_us"].is_number()),
                "{size}: a candidate was not timed: {at:?}"
            );
            assert_eq!(
                at.iter().filter(|row| row["chosen"] == true).count(),
                1,
                "{size}: one tuned choice"
            );
        }
        for plot in ["latency.svg", "bus_bandwidth.svg", "decode.svg"] {
            let svg = std::fs::read_to_string(out.join(plot)).unwrap();
            assert!(svg.starts_with("<svg"), "{plot}");
        }
        let decode = report["decode"].as_array().unwrap();
        assert_eq!(decode.len(), 7, "batches 1 to 64");
        assert!(decode
            .iter()
            .all(|row| row["tuned_us"].as_f64().unwrap() > 0.0
                && row["nccl_us"].as_f64().unwrap() > 0.0));
    }
}

/// A ladder whose large bucket has the copy-engine one-shot beside a barrier kernel and NCCL:
/// chunks of 16 MiB, so its largest message takes four.
fn copy_engine_ladder() -> String {
    tp2_ladder(
        "copy_engine_tp2",
        r#"[
    {"id": "one_shot_pull", "algorithm": "one_shot", "transfer": "pull"},
    {"id": "one_shot_copy_engine", "algorithm": "one_shot", "transfer": "copy_engine"},
    {"id": "one_shot_copy_engine_128", "algorithm": "one_shot", "transfer": "copy_engine", "blocks": 128},
    {"id": "nccl", "algorithm": "nccl"}
  ]"#,
        r#"[
    {"max_bytes": 65536, "threads": 256, "blocks": 8, "candidates": ["one_shot_pull", "one_shot_copy_engine", "nccl"], "default": "one_shot_pull"},
    {"max_bytes": 67108864, "threads": 512, "blocks": 64, "candidates": ["one_shot_pull", "one_shot_copy_engine", "one_shot_copy_engine_128", "nccl"], "default": "one_shot_pull"}
  ]"#,
    )
}

/// Writes `ladder` as `file`, exports it on GPUs 0 and 1 (every candidate qualified exact, the
/// multi-size sequence included) and asserts that `count` of the qualified candidates' profile
/// ids contain `family`. Returns the ladder's and the package's directories and the package.
fn qualified_family(
    file: &str,
    ladder: String,
    family: &str,
    count: usize,
) -> (tempfile::TempDir, tempfile::TempDir, PathBuf) {
    let (ladder_dir, ladder_file) = written_ladder(file, ladder);
    let (package_dir, out) = export_on_gpus(&ladder_file);
    let qualified = every_candidate_qualified_exact(&out);
    let found = qualified.iter().filter(|profile| profile.contains(family));
    assert_eq!(found.count(), count, "{qualified:?}");
    (ladder_dir, package_dir, out)
}

#[test]
#[ignore = "needs GPUs"]
fn copy_engine_candidates_qualify_exact_in_graphs_beside_kernels_and_nccl() {
    require_gpus!(2);
    qualified_family(
        "copy_engine_tp2.json",
        copy_engine_ladder(),
        "copy_engine",
        3,
    );
}

/// A ladder with NCCL's symmetric kernels as candidates: `nccl_symmetric` in both buckets (a
/// 4 MiB window) and `nccl_symmetric_8` (its own communicator with `max_ctas` 8 and its own
/// 4 MiB window) in the larger one, which has no plain NCCL, so start-up's timing above the
/// ladder runs `nccl_symmetric` on twice the largest message, through its window in pieces.
fn symmetric_ladder() -> String {
    tp2_ladder(
        "nccl_symmetric_tp2",
        r#"[
    {"id": "one_shot_pull", "algorithm": "one_shot", "transfer": "pull"},
    {"id": "nccl", "algorithm": "nccl"},
    {"id": "nccl_symmetric", "algorithm": "nccl", "window": "symmetric"},
    {"id": "nccl_symmetric_8", "algorithm": "nccl", "window": "symmetric", "max_ctas": 8}
  ]"#,
        r#"[
    {"max_bytes": 65536, "threads": 256, "blocks": 8, "candidates": ["one_shot_pull", "nccl", "nccl_symmetric"], "default": "one_shot_pull"},
    {"max_bytes": 3145728, "threads": 512, "blocks": 64, "candidates": ["nccl_symmetric", "one_shot_pull", "nccl_symmetric_8"], "default": "one_shot_pull"}
  ]"#,
    )
}

#[test]
#[ignore = "needs GPUs"]
fn nccl_symmetric_candidates_qualify_exact_and_are_timed_at_start_up() {
    require_gpus!(2);
    let (dir, _package_dir, out) = qualified_family(
        "nccl_symmetric_tp2.json",
        symmetric_ladder(),
        "nccl_symmetric",
        3,
    );
    let (ok, shown) = run(&["show".as_ref(), out.as_os_str()]);
    assert!(ok, "{shown}");
    assert!(shown.contains("NCCL symmetric windows 8 MiB"), "{shown}");

    let choice = dir.path().join("choice");
    let (ok, text) = on_two_gpus("tune", &out, &dir.path().join("cache"), &choice, &[]);
    eprintln!("{text}");
    assert!(ok, "tune failed");
    let read = |rank: u32| std::fs::read(choice.join(format!("choice.rank{rank}.json"))).unwrap();
    assert_eq!(read(0), read(1), "every rank writes the same choice");
    let value: serde_json::Value = serde_json::from_slice(&read(0)).unwrap();
    let timed: Vec<&str> = value["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|bucket| bucket["candidates"].as_array().unwrap())
        .filter(|candidate| candidate["status"] == "timed")
        .map(|candidate| candidate["profile"].as_str().unwrap())
        .collect();
    for profile in ["nccl_symmetric", "nccl_symmetric_8"] {
        assert!(timed.contains(&profile), "{profile} not timed: {value}");
    }
    // Above the ladder, the largest bucket's NCCL is `nccl_symmetric`: timed on 6 MiB through
    // its 4 MiB window in two pieces.
    assert!(value["above_ladder"].is_object(), "{value}");
}

/// An `all_reduce_add_rms_norm` package of separate candidates (all-reduce kernels, plain and
/// rank-order NCCL, each then add_rms_norm) qualifies every candidate exact on two GPUs: its
/// normed and residual equal `reference_epilogue` on every run, the multi-size sequence
/// included.
#[test]
#[ignore = "needs GPUs"]
fn export_on_gpus_qualifies_every_separate_epilogue_candidate_against_the_epilogue_reference() {
    require_gpus!(2);
    let fixture = crate::support::repository::root()
        .join("tests/fixtures/ladders/valid/epilogue_package.json");
    let (_dir, out) = export_on_gpus(&fixture);
    let qualified = every_candidate_qualified_exact(&out);
    assert_eq!(
        qualified,
        [
            "one_shot_pull",
            "nccl",
            "nccl_rank_order",
            "rsag_push",
            "nccl"
        ]
    );
}
