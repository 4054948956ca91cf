//! Planted mutations (tests/support/mutations.rs) on real GPUs: `prepare check` must refuse a package of
//! `ladders/h200_nvlink_tp2.json` (for a race, the buckets that have the mutated kernel's
//! profile) whose kernels carry one, exiting 3 and saying which candidate `is not exact`,
//! while the same package built from the unmutated sources passes. What each run saw is
//! printed, for the GPU run's log.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use prepare::compile::SourceOverrides;
use prepare::ladder::Arch;

use super::support::{check_on_two_gpus, gpu_tests, ladder, printed, require_gpus};
use crate::support::mutations::{mutated_package, package_with_sources, Mutation};

const LADDER: &str = "h200_nvlink_tp2.json";
/// Runs of `check` for the mutation that shows only sometimes, and passes of the suite in each.
const RACE_RUNS: u32 = 10;
const RACE_REPEATS: u32 = 20;

/// How one `prepare check` ended.
struct Outcome {
    code: Option<i32>,
    output: String,
    elapsed: Duration,
}

impl Outcome {
    /// The lines that name an inexact candidate.
    fn not_exact_lines(&self) -> Vec<&str> {
        self.output
            .lines()
            .filter(|line| line.contains("is not exact"))
            .collect()
    }

    /// Exit 3 naming an inexact candidate.
    fn caught(&self) -> bool {
        self.code == Some(3) && !self.not_exact_lines().is_empty()
    }

    /// One line for the log: the exit code, the time and the first inexact candidate.
    fn summary(&self) -> String {
        format!(
            "exit {:?} after {:.1} s{}",
            self.code,
            self.elapsed.as_secs_f64(),
            self.not_exact_lines()
                .first()
                .map(|line| format!(": {}", line.trim()))
                .unwrap_or_default()
        )
    }
}

/// `prepare check` of `package` on GPUs 0 and 1, its custom candidates' exactness suite run
/// `repeat` times on fresh random data.
fn check(package: &Path, repeat: u32) -> Outcome {
    let started = Instant::now();
    let output = check_on_two_gpus(package, 20, &["--repeat", &repeat.to_string()]);
    Outcome {
        code: output.status.code(),
        output: printed(&output),
        elapsed: started.elapsed(),
    }
}

/// A deterministic mutation shows in every run: one pass of the suite must catch it.
fn caught_in_one_pass(mutation: Mutation) {
    assert!(mutation.is_deterministic());
    require_gpus!(2);
    let dir = tempfile::tempdir().unwrap();
    let package = mutated_package(mutation, &ladder(LADDER), Arch::Sm90, dir.path());
    let outcome = check(&package, 1);
    eprintln!("{mutation}: {}", outcome.summary());
    assert!(
        outcome.caught(),
        "{mutation}: prepare check should exit 3 saying `is not exact`:\n{}",
        outcome.output
    );
}

#[test]
#[ignore = "needs GPUs"]
fn the_unmutated_package_passes_three_passes_of_the_exactness_suite() {
    require_gpus!(2);
    let dir = tempfile::tempdir().unwrap();
    let package = package_with_sources(
        &ladder(LADDER),
        Arch::Sm90,
        &dir.path().join("unmutated"),
        &SourceOverrides::new(),
    );
    let outcome = check(&package, 3);
    eprintln!("unmutated: {}", outcome.summary());
    assert_eq!(outcome.code, Some(0), "{}", outcome.output);
}

gpu_tests! {
    a_skipped_peer_is_caught => caught_in_one_pass(Mutation::SkipPeer);
    truncating_instead_of_rounding_is_caught => caught_in_one_pass(Mutation::Truncate);
    a_dropped_tail_is_caught => caught_in_one_pass(Mutation::DropTail);
    a_double_counted_rank_is_caught => caught_in_one_pass(Mutation::DoubleCount);
}

/// `h200_nvlink_tp2.json` cut to the buckets where `profile` is a candidate, written into
/// `dir`. A race mutation changes one kernel alone (tests/nvrtc/mutations.rs checks that every
/// other cubin stays the same), so other buckets would only spend GPU time in each of the
/// 10 x 20 passes.
fn cut_ladder(dir: &Path, profile: &str) -> PathBuf {
    let text = std::fs::read_to_string(ladder(LADDER)).expect("the shipped ladder is readable");
    let mut value: serde_json::Value = serde_json::from_str(&text).expect("the ladder is JSON");
    let buckets = value["buckets"]
        .as_array_mut()
        .expect("the ladder has buckets");
    buckets.retain(|bucket| {
        bucket["candidates"]
            .as_array()
            .is_some_and(|candidates| candidates.iter().any(|id| id == profile))
    });
    assert!(!buckets.is_empty(), "no bucket of {LADDER} has {profile}");
    value["name"] = serde_json::Value::from(format!("h200_nvlink_tp2_{profile}_buckets"));
    let path = dir.join("ladder.json");
    std::fs::write(&path, serde_json::to_string_pretty(&value).unwrap()).unwrap();
    path
}

/// A race shows only when a peer happens to be late. Each run repeats the suite on fresh random
/// data over the buckets where `profile` (the mutated kernel's) is a candidate; at least one of
/// the runs must catch it, and none may fail any other way.
/// (`Mutation::NoStepWait` has no such test: a block sums a step only after its own next step's
/// writes have landed, so with the ranks started together the race window is small and 10 x 20
/// passes over every bucket are long; the host emulation, which starts a rank late, catches it.)
fn caught_in_some_runs(mutation: Mutation, profile: &str) {
    assert!(!mutation.is_deterministic());
    require_gpus!(2);
    let dir = tempfile::tempdir().unwrap();
    let cut = cut_ladder(dir.path(), profile);
    let package = mutated_package(mutation, &cut, Arch::Sm90, dir.path());
    let mut caught = 0;
    let mut other_failures = Vec::new();
    for run in 1..=RACE_RUNS {
        let outcome = check(&package, RACE_REPEATS);
        eprintln!(
            "{mutation}: run {run}/{RACE_RUNS} (--repeat {RACE_REPEATS}): {}",
            outcome.summary()
        );
        if outcome.caught() {
            caught += 1;
        } else if outcome.code != Some(0) {
            other_failures.push(outcome.output);
        }
    }
    eprintln!("{mutation}: caught in {caught} of {RACE_RUNS} runs of --repeat {RACE_REPEATS}");
    assert!(
        other_failures.is_empty(),
        "{mutation}: {} run(s) failed without naming an inexact candidate:\n{}",
        other_failures.len(),
        other_failures.join("\n----\n")
    );
    assert!(caught >= 1, "{mutation}: no run of {RACE_RUNS} caught it");
}

gpu_tests! {
    /// The missing start barrier: a run catches it only when a peer writes its input after this
    /// rank read it.
    a_missing_start_barrier_is_caught_in_some_runs =>
        caught_in_some_runs(Mutation::NoStartBarrier, "one_shot_pull");
    /// Lines taken without their flag: a run catches it when a line has not landed yet.
    lines_taken_without_their_flag_are_caught_in_some_runs =>
        caught_in_some_runs(Mutation::NoLineWait, "one_shot_ll");
}
