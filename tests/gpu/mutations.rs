//! Planted mutations (tests/support/mutations.rs) on real GPUs, at the test world
//! (`PREPARE_TEST_WORLD`, 2 by default): `prepare check` on GPUs 0 to N - 1 must refuse a
//! package of the world's H200 ladder, `ladders/h200_nvlink_tp<N>.json` (for a race, the
//! buckets that have the mutated kernel's profile) whose kernels carry one, exiting 3 and
//! saying which candidate `is not exact`, while the same package built from the unmutated
//! sources passes. What each run saw is printed, for the GPU run's log.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use prepare::compile::SourceOverrides;
use prepare::ladder::Arch;

use super::support::{
    check_on_gpus, gpu_tests, h200_ladder, ladder, printed, require_world, WORLDS,
};
use crate::support::mutations::{mutated_package, package_with_sources, Mutation};

/// The mutations that show only sometimes and that a GPU run catches, each with the profile of
/// the kernel it changes.
const RACES: [(Mutation, &str); 2] = [
    (Mutation::NoStartBarrier, "one_shot_pull"),
    (Mutation::NoLineWait, "one_shot_ll"),
];
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

/// `prepare check` of `package` on GPUs 0 to `world - 1`, its custom candidates' exactness
/// suite run `repeat` times on fresh random data.
fn check(world: usize, package: &Path, repeat: u32) -> Outcome {
    let started = Instant::now();
    let output = check_on_gpus(world, package, 20, &["--repeat", &repeat.to_string()]);
    Outcome {
        code: output.status.code(),
        output: printed(&output),
        elapsed: started.elapsed(),
    }
}

/// A deterministic mutation shows in every run: one pass of the suite must catch it.
fn caught_in_one_pass(mutation: Mutation) {
    assert!(mutation.is_deterministic());
    let world = require_world!();
    let dir = tempfile::tempdir().unwrap();
    let package = mutated_package(
        mutation,
        &ladder(&h200_ladder(world)),
        Arch::Sm90,
        dir.path(),
    );
    let outcome = check(world, &package, 1);
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
    let world = require_world!();
    let dir = tempfile::tempdir().unwrap();
    let package = package_with_sources(
        &ladder(&h200_ladder(world)),
        Arch::Sm90,
        &dir.path().join("unmutated"),
        &SourceOverrides::new(),
    );
    let outcome = check(world, &package, 3);
    eprintln!("unmutated: {}", outcome.summary());
    assert_eq!(outcome.code, Some(0), "{}", outcome.output);
}

gpu_tests! {
    a_skipped_peer_is_caught => caught_in_one_pass(Mutation::SkipPeer);
    truncating_instead_of_rounding_is_caught => caught_in_one_pass(Mutation::Truncate);
    a_dropped_tail_is_caught => caught_in_one_pass(Mutation::DropTail);
    a_double_counted_rank_is_caught => caught_in_one_pass(Mutation::DoubleCount);
}

/// A shipped ladder's JSON.
fn shipped(name: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(ladder(name)).expect("the shipped ladder is readable");
    serde_json::from_str(&text).expect("the ladder is JSON")
}

/// Whether `value`, a ladder's profile or bucket, names `profile` (as its id or a candidate).
fn names(value: &serde_json::Value, profile: &str) -> bool {
    value["id"] == profile
        || value["candidates"]
            .as_array()
            .is_some_and(|candidates| candidates.iter().any(|id| id == profile))
}

/// The H200 ladder of `world` ranks cut to the buckets where `profile` is a candidate, written
/// into `dir`. A race mutation changes one kernel alone (tests/nvrtc/mutations.rs checks that
/// every other cubin stays the same), so other buckets would only spend GPU time in each of the
/// 10 x 20 passes. A profile that ladder does not have (`one_shot_ll` beyond two ranks) is
/// taken from the TP2 ladder and made a candidate of the buckets up to the largest size where
/// the TP2 ladder has it.
pub(super) fn cut_ladder(dir: &Path, world: usize, profile: &str) -> PathBuf {
    let name = h200_ladder(world);
    let mut value = shipped(&name);
    let profiles = value["profiles"]
        .as_array_mut()
        .expect("the ladder has profiles");
    if !profiles.iter().any(|entry| names(entry, profile)) {
        let tp2 = shipped(&h200_ladder(2));
        let definition = tp2["profiles"]
            .as_array()
            .and_then(|entries| entries.iter().find(|entry| names(entry, profile)))
            .unwrap_or_else(|| panic!("neither {name} nor the TP2 ladder has {profile}"));
        profiles.push(definition.clone());
        let largest = tp2["buckets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|bucket| names(bucket, profile))
            .filter_map(|bucket| bucket["max_bytes"].as_u64())
            .max()
            .expect("the TP2 ladder has a bucket for the profile it defines");
        for bucket in value["buckets"].as_array_mut().into_iter().flatten() {
            if bucket["max_bytes"]
                .as_u64()
                .is_some_and(|bytes| bytes <= largest)
            {
                bucket["candidates"]
                    .as_array_mut()
                    .expect("a bucket has candidates")
                    .push(profile.into());
            }
        }
    }
    let buckets = value["buckets"]
        .as_array_mut()
        .expect("the ladder has buckets");
    buckets.retain(|bucket| names(bucket, profile));
    assert!(!buckets.is_empty(), "no bucket of {name} has {profile}");
    let cut = format!("{}_{profile}_buckets", name.trim_end_matches(".json"));
    value["name"] = serde_json::Value::from(cut);
    let path = dir.join("ladder.json");
    std::fs::write(&path, serde_json::to_string_pretty(&value).unwrap()).unwrap();
    path
}

/// The race ladders are valid ladders of their world, every bucket with the mutated kernel's
/// profile a candidate: so a GPU run at 4 or 8 ranks exports what it checks. Not ignored: it
/// needs no GPU.
#[test]
fn the_race_ladders_are_valid_at_every_world() {
    for world in WORLDS {
        for (mutation, profile) in RACES {
            let dir = tempfile::tempdir().unwrap();
            let path = cut_ladder(dir.path(), world, profile);
            let bytes = std::fs::read(&path).unwrap();
            let cut = prepare::ladder::validate_ladder_bytes(&bytes).unwrap_or_else(|report| {
                panic!("{mutation} at {world} ranks: not a valid ladder:\n{report}")
            });
            prepare::device::check_export_target(&cut, Arch::Sm90)
                .unwrap_or_else(|error| panic!("{mutation} at {world} ranks: {error}"));
            assert_eq!(cut.world_size as usize, world);
            assert!(!cut.buckets.is_empty(), "{mutation} at {world} ranks");
            for bucket in &cut.buckets {
                assert!(
                    bucket.candidates.iter().any(|id| id == profile),
                    "{mutation} at {world} ranks: a bucket without {profile}"
                );
            }
        }
    }
}

/// A race shows only when a peer happens to be late. Each run repeats the suite on fresh random
/// data over the buckets where the mutated kernel's profile ([`RACES`]) is a candidate; at least
/// one of the runs must catch it, and none may fail any other way.
/// (`Mutation::NoStepWait` has no such test: a block sums a step only after its own next step's
/// writes have landed, so with the ranks started together the race window is small and 10 x 20
/// passes over every bucket are long; the host emulation, which starts a rank late, catches it.)
fn caught_in_some_runs(mutation: Mutation) {
    assert!(!mutation.is_deterministic());
    let (_, profile) = RACES
        .into_iter()
        .find(|(race, _)| *race == mutation)
        .expect("a race the GPU tests catch");
    let world = require_world!();
    let dir = tempfile::tempdir().unwrap();
    let cut = cut_ladder(dir.path(), world, profile);
    let package = mutated_package(mutation, &cut, Arch::Sm90, dir.path());
    let mut caught = 0;
    let mut other_failures = Vec::new();
    for run in 1..=RACE_RUNS {
        let outcome = check(world, &package, RACE_REPEATS);
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
        caught_in_some_runs(Mutation::NoStartBarrier);
    /// Lines taken without their flag: a run catches it when a line has not landed yet.
    lines_taken_without_their_flag_are_caught_in_some_runs =>
        caught_in_some_runs(Mutation::NoLineWait);
}
