//! Startup selection on real GPUs: `prepare tune` on both H200 TP2 packages writes
//! byte-identical choice files on both ranks; a second run hits the cache and times nothing; a
//! changed `NCCL_*` setting misses it; `--retune` and static tuning; a rank killed or stopped
//! during timing ends the others within the timeout with nothing written, at the test world
//! (`PREPARE_TEST_WORLD`, 2 by default); a cache directory one rank cannot write fails both
//! before any timing; and the library handle serving from a server's own graphs
//! (examples/serve.rs).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::support::{
    export, free_port, gpu_tests, h200_ladder, h200_tp2_packages, launch_on_two_gpus, prepare_bin,
    printed, require_gpus, require_world, start_ranks, survivors_name_the_victim,
};

/// Runs `prepare tune` on GPUs 0 and 1 with `args`, extra environment `env`; returns whether it
/// succeeded and its output.
fn tune(package: &Path, args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut command = Command::new(prepare_bin());
    command
        .args(["tune", "--gpus", "0,1", "--timeout", "30", "--package"])
        .arg(package)
        .args(args);
    for (name, value) in env {
        command.env(name, value);
    }
    let output = command.output().unwrap();
    (output.status.success(), printed(&output))
}

/// Both ranks' choice files in `dir`, which must be byte-identical.
fn identical_choices(dir: &Path) -> Vec<u8> {
    let first = std::fs::read(dir.join("choice.rank0.json")).unwrap();
    let second = std::fs::read(dir.join("choice.rank1.json")).unwrap();
    assert_eq!(first, second, "the ranks' choice files differ");
    first
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    match std::fs::read_dir(dir) {
        Ok(read) => read.map(|entry| entry.unwrap().path()).collect(),
        Err(_) => Vec::new(),
    }
}

#[test]
#[ignore = "needs GPUs"]
fn tune_agrees_caches_and_misses_on_a_changed_nccl_setting() {
    require_gpus!(2);
    for (name, _package_dir, package) in h200_tp2_packages() {
        let scratch = tempfile::tempdir().unwrap();
        let cache = scratch.path().join("cache");
        let cache_arg = cache.to_str().unwrap();
        // `prepare tune` with the cache, `--out` a folder named for the run, `flags` and `env`
        // set; it must succeed. Returns its output and the choice, byte-identical on both ranks.
        let run = |run: &str, flags: &[&str], env: &[(&str, &str)]| -> (String, Vec<u8>) {
            let out = scratch.path().join(run);
            let mut args = vec!["--cache-dir", cache_arg, "--out", out.to_str().unwrap()];
            args.extend_from_slice(flags);
            let started = Instant::now();
            let (ok, text) = tune(&package, &args, env);
            eprintln!(
                "{name}, {run} run ({:?}, {flags:?}, {env:?}):\n{text}",
                started.elapsed()
            );
            assert!(ok, "{name}: the {run} run of tune failed");
            (text, identical_choices(&out))
        };

        let (text, first) = run("first", &[], &[]);
        assert!(text.contains("[rank 0] selected in"), "{text}");
        assert_eq!(entries(&cache).len(), 1, "one cache entry");

        let (text, second) = run("second", &[], &[]);
        assert!(
            text.contains("[rank 0] cache hit on every rank: nothing timed"),
            "{text}"
        );
        assert!(!text.contains("timing:"), "{text}");
        assert_eq!(second, first, "the cached choice");

        let (text, changed) = run("changed", &[], &[("NCCL_DEBUG_SUBSYS", "INIT")]);
        assert!(
            text.contains("[rank 0] selected in"),
            "a changed NCCL setting must miss: {text}"
        );
        assert_ne!(changed, first, "another fingerprint");
        assert_eq!(entries(&cache).len(), 2);

        let (text, _) = run("retune", &["--retune"], &[]);
        assert!(
            text.contains("[rank 0] selected in"),
            "--retune times again: {text}"
        );

        // The exact policy is the default; allowing inexact candidates is another policy, so
        // another cache entry. `--exact-only` changes nothing (a cache hit) and says so once.
        let policy = |choice: &[u8]| {
            serde_json::from_slice::<serde_json::Value>(choice).unwrap()["policy"]["exact_only"]
                .clone()
        };
        assert_eq!(policy(&first), true);
        let (text, inexact) = run("inexact", &["--allow-inexact"], &[]);
        assert!(
            text.contains("[rank 0] selected in"),
            "another policy must miss: {text}"
        );
        assert_eq!(policy(&inexact), false);
        let (text, exact_only) = run("exact-only", &["--exact-only"], &[]);
        assert_eq!(
            text.matches("note: --exact-only is the default").count(),
            1,
            "{text}"
        );
        assert!(text.contains("[rank 0] cache hit on every rank"), "{text}");
        assert_eq!(policy(&exact_only), true);

        let (text, choice) = run("static", &["--collective-tuning", "static"], &[]);
        assert!(
            !text.contains("timing:"),
            "static tuning times nothing: {text}"
        );
        let choice: serde_json::Value = serde_json::from_slice(&choice).unwrap();
        assert_eq!(choice["tuning"], "static");

        let shown = Command::new(prepare_bin())
            .arg("show")
            .arg(&package)
            .arg("--choice")
            .arg(scratch.path().join("first/choice.rank0.json"))
            .output()
            .unwrap();
        eprintln!("{}", String::from_utf8_lossy(&shown.stdout));
        assert!(shown.status.success());
    }
}

/// Ranks 0 to N - 1 of the test world tune its H200 ladder's package; the last is sent
/// `signal` while rank 0 times: every other rank must exit naming it, with nothing written.
fn fault_during_timing(signal: Signal) {
    let world = require_world!();
    let port = free_port();
    let (_dir, package) = export(&h200_ladder(world));
    let scratch = tempfile::tempdir().unwrap();
    let cache = scratch.path().join("cache");
    let out = scratch.path().join("out");
    // Enough rounds that timing lasts long after the fault.
    let args = [
        "--timeout",
        "5",
        "--rounds",
        "10000",
        "--package",
        package.to_str().unwrap(),
        "--cache-dir",
        cache.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    let ranks = start_ranks(world, "tune", 0..world as u32, port, &args);
    ranks[0].wait_for("timing:", Duration::from_secs(120));
    survivors_name_the_victim(ranks, signal, "timing");
    assert!(
        entries(&out).is_empty(),
        "a choice was written: {:?}",
        entries(&out)
    );
    assert!(
        entries(&cache).is_empty(),
        "the cache was written: {:?}",
        entries(&cache)
    );
}

gpu_tests! {
    a_rank_killed_during_timing_ends_the_other_within_the_timeout_writing_nothing =>
        fault_during_timing(Signal::SIGKILL);
    a_rank_stopped_during_timing_ends_the_other_within_the_timeout_writing_nothing =>
        fault_during_timing(Signal::SIGSTOP);
}

/// The `serve` example: carried next to the tests on the GPU machine, else this build's.
fn serve_bin() -> PathBuf {
    std::env::var_os("PREPARE_SERVE").map_or_else(
        || {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("target")
                .join(if cfg!(debug_assertions) {
                    "debug"
                } else {
                    "release"
                })
                .join("examples")
                .join("serve")
        },
        PathBuf::from,
    )
}

#[test]
#[ignore = "needs GPUs"]
fn a_server_selects_then_serves_exact_sums_from_its_own_graphs() {
    require_gpus!(2);
    let (_dir, package) = export("h200_nvlink_tp2.json");
    let cache = tempfile::tempdir().unwrap();
    for run in ["cold", "cached"] {
        let (launched, lines) = launch_on_two_gpus(
            serve_bin(),
            vec![package.clone().into(), cache.path().into()],
            Vec::new(),
        );
        launched.unwrap_or_else(|error| panic!("{run}: {error}"));
        for rank in 0..2 {
            let served = format!("[rank {rank}] served ");
            assert!(
                lines.iter().any(|line| line.starts_with(&served)
                    && line.ends_with(" graph replays, every one exact")),
                "{run}: {lines:#?}"
            );
            let hit = run == "cached";
            assert!(
                lines
                    .iter()
                    .any(|line| line
                        .starts_with(&format!("[rank {rank}] selected: cache hit {hit},"))),
                "{run}: {lines:#?}"
            );
        }
    }
}

#[test]
#[ignore = "needs GPUs"]
fn a_named_cache_directory_one_rank_cannot_write_fails_every_rank_before_any_timing() {
    use prepare::runtime::{RankSetup, Rendezvous, Runtime};
    use prepare::select::SelectOptions;
    use prepare::serve::Handle;

    require_gpus!(2);
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ladders/valid/minimal.json");
    let (_dir, package_dir) = super::support::export_file(&fixture);
    let scratch = tempfile::tempdir().unwrap();
    let writable = scratch.path().join("cache");
    // Nobody, root included, makes a directory under a regular file.
    std::fs::write(scratch.path().join("file"), b"").unwrap();
    let blocked = scratch.path().join("file").join("sub");
    let id = prepare::gpu::nccl::UniqueId::new().unwrap().to_bytes();
    let ranks: Vec<_> = [writable.clone(), blocked.clone()]
        .into_iter()
        .enumerate()
        .map(|(rank, cache_dir)| {
            let package_dir = package_dir.clone();
            std::thread::spawn(move || {
                let package = prepare::package::open_package_retrying(&package_dir).unwrap();
                let setup = RankSetup {
                    rank: rank as u32,
                    world: 2,
                    gpu: rank,
                    timeout: Duration::from_secs(30),
                    rendezvous: Rendezvous::UniqueId(Box::new(id)),
                    host: "one".to_owned(),
                };
                let runtime = Runtime::start(&setup).unwrap();
                let options = SelectOptions {
                    cache_dir: Some(cache_dir),
                    ..SelectOptions::default()
                };
                let silent = prepare::progress::Silent;
                Handle::select(runtime, &[package], &options, &silent)
                    .map(|_| ())
                    .unwrap_err()
                    .to_string()
            })
        })
        .collect();
    for (rank, thread) in ranks.into_iter().enumerate() {
        let error = thread.join().unwrap();
        eprintln!("rank {rank}: {error}");
        assert!(error.starts_with(&format!("rank {rank}: ")), "{error}");
        assert!(
            error.contains(&format!(
                "the cache directory {} given to rank 1 cannot be written",
                blocked.display()
            )),
            "{error}"
        );
    }
    // Nothing was timed, so nothing was stored where rank 0 could write.
    let stored: Vec<_> = std::fs::read_dir(&writable).unwrap().collect();
    assert!(stored.is_empty(), "{stored:?}");
}
