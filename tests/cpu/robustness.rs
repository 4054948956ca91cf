//! The library under bad input and faults: `--force` replaces only what this tool wrote and
//! cleans up after killed runs, a package whose manifest was edited and resealed is refused
//! where it contradicts its own ladder, and a cache entry is re-validated before it is used.

use std::fs;

use prepare::ladder::Arch;
use prepare::package::{open_package, Manifest, Outcome, PackageError};
use prepare::select::cached_choice;
use prepare::tune::choice::{Choice, Tuning};
use prepare::tune::{CandidateOutcome, Policy};

use crate::support::fixtures::{
    self, opened_fixture, qualification, reseal, scratch, try_write_fixture, write_fixture,
};

#[test]
fn force_keeps_a_directory_holding_files_the_package_does_not_name() {
    let (_scratch, out) = scratch();
    fs::create_dir_all(out.join("src")).unwrap();
    fs::write(out.join("manifest.json"), "{}").unwrap();
    fs::write(out.join("src/main.js"), "code").unwrap();
    let error = try_write_fixture(&out, Arch::Sm120, None, true)
        .expect_err("a directory that is not a package is kept");
    assert!(error.to_string().contains("src"), "{error}");
    assert_eq!(fs::read(out.join("src/main.js")).unwrap(), b"code");
    assert_eq!(fs::read(out.join("manifest.json")).unwrap(), b"{}");
}

#[test]
fn force_keeps_a_package_with_an_extra_file_and_replaces_a_damaged_one() {
    let (_scratch, out) = scratch();
    write_fixture(&out, Arch::Sm120);
    fs::write(out.join("kernels/notes.txt"), "mine").unwrap();
    let error = try_write_fixture(&out, Arch::Sm120, None, true)
        .expect_err("a file the manifest does not name is kept");
    assert!(error.to_string().contains("kernels/notes.txt"), "{error}");
    assert_eq!(fs::read(out.join("kernels/notes.txt")).unwrap(), b"mine");

    // A package whose files no longer match their hashes is still this tool's to replace.
    fs::remove_file(out.join("kernels/notes.txt")).unwrap();
    let cubin = fs::read_dir(out.join("kernels"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    fs::write(&cubin, "damaged").unwrap();
    try_write_fixture(&out, Arch::Sm120, None, true).expect("a damaged package is replaced");
    open_package(&out).expect("the new package opens");
}

#[test]
fn leftovers_of_killed_exports_are_removed_by_the_next_export_to_the_same_place() {
    let (scratch, out) = scratch();
    write_fixture(&out, Arch::Sm120);
    for leftover in [".pkg.staging-k1ll3d", ".pkg.replaced-k1ll3d"] {
        fs::create_dir_all(scratch.path().join(leftover).join("old/kernels")).unwrap();
        fs::write(
            scratch.path().join(leftover).join("old/manifest.json"),
            "{}",
        )
        .unwrap();
    }
    // Another output's leftovers are not this export's to remove.
    fs::create_dir(scratch.path().join(".other.staging-k1ll3d")).unwrap();
    try_write_fixture(&out, Arch::Sm120, None, true).unwrap();
    assert_eq!(
        fixtures::names(scratch.path()),
        vec![".other.staging-k1ll3d".to_owned(), "pkg".to_owned()]
    );

    // A kill between the two renames of the fallback swap leaves the old package aside and
    // none in place: the next export moves it back before deciding anything.
    let aside = scratch.path().join(".pkg.replaced-k1ll3d");
    fs::create_dir(&aside).unwrap();
    fs::rename(&out, aside.join("old")).unwrap();
    let error = try_write_fixture(&out, Arch::Sm120, None, false)
        .expect_err("the restored package is there");
    assert!(matches!(error, PackageError::Exists { .. }), "{error}");
    open_package(&out).expect("the previous package is back in place");
    assert!(!aside.exists());
}

#[test]
fn a_resealed_manifest_that_contradicts_its_ladder_is_refused_at_open() {
    let changes: Vec<(&str, ManifestChange)> = vec![
        (
            "/buckets/0/candidates/0/kernel",
            Box::new(|manifest| {
                // one_shot_push launches one_shot_pull's (ordinary) kernel instead.
                let other = manifest.buckets[0].candidates[1].kernel.clone();
                manifest.buckets[0].candidates[0].kernel = other;
            }),
        ),
        (
            "/buckets/0/candidates/0/blocks",
            Box::new(|manifest| manifest.buckets[0].candidates[0].blocks = Some(1024)),
        ),
        (
            "/peer_memory/buffer_bytes",
            Box::new(|manifest| manifest.peer_memory.buffer_bytes += 16),
        ),
        (
            "/peer_memory",
            Box::new(|manifest| {
                manifest.peer_memory.buffer_bytes = u64::MAX;
                manifest.peer_memory.signal_bytes = u64::MAX;
            }),
        ),
        (
            "/kernels/0/size_bytes",
            Box::new(|manifest| manifest.kernels[0].size_bytes += 1),
        ),
        (
            "/qualification/gpus",
            Box::new(|manifest| {
                manifest.qualification = Some(qualification(3));
            }),
        ),
        (
            "/qualification/gpus",
            Box::new(|manifest| {
                manifest.qualification = Some(qualification(100_000));
            }),
        ),
    ];
    for (pointer, change) in changes {
        let (_scratch, out) = scratch();
        write_fixture(&out, Arch::Sm120);
        reseal(&out, change);
        let error = open_package(&out).expect_err(pointer);
        assert!(
            matches!(error, PackageError::ManifestInconsistent { .. }),
            "{pointer}: {error}"
        );
        assert!(error.to_string().contains(pointer), "{pointer}: {error}");
    }
}

#[test]
fn a_qualified_package_for_the_ladders_world_opens() {
    let (_scratch, out) = scratch();
    try_write_fixture(&out, Arch::Sm120, Some(qualification(4)), false).unwrap();
    open_package(&out).unwrap();
}

/// A change to a manifest that must make it refused.
type ManifestChange = Box<dyn Fn(&mut Manifest)>;

/// A change to a cache entry that must make it miss.
type ChoiceChange = Box<dyn Fn(&mut Choice)>;

#[test]
fn a_cache_entry_is_revalidated_against_the_package_and_the_options() {
    let (_scratch, package) = opened_fixture();
    let exact_only = Policy::default();
    let inexact_allowed = Policy {
        exact_only: false,
        ..Policy::default()
    };
    for policy in [exact_only, inexact_allowed] {
        let good = fixtures::defaults_choice(
            &package,
            Tuning::Runtime,
            policy,
            "peer kernels: one host, full peer access",
        );
        assert_eq!(
            cached_choice(&good.to_bytes(), &package, fixtures::CHOICE_KEY, &policy),
            Some(good.clone())
        );
    }

    let changes: Vec<(&str, Policy, ChoiceChange)> = vec![
        (
            "an excluded winner",
            inexact_allowed,
            Box::new(|choice| {
                choice.buckets[0].decision.candidates[0].outcome = CandidateOutcome::Excluded {
                    reason: "dropped on this machine".to_owned(),
                };
            }),
        ),
        (
            "a winner the entry does not list",
            inexact_allowed,
            Box::new(|choice| drop(choice.buckets[0].decision.candidates.remove(0))),
        ),
        (
            "NCCL not bit-exact under the exact policy",
            exact_only,
            Box::new(|choice| {
                let decision = &mut choice.buckets[1].decision;
                decision.winner = "nccl".to_owned();
                decision.bit_exact = false;
                decision.candidates[2].exact = false;
            }),
        ),
        (
            "a winner whose record is inexact under the exact policy",
            exact_only,
            Box::new(|choice| {
                let decision = &mut choice.buckets[1].decision;
                decision.winner = "nccl".to_owned();
                decision.candidates[2].exact = false;
            }),
        ),
    ];
    for (what, policy, change) in changes {
        let mut changed = fixtures::defaults_choice(
            &package,
            Tuning::Runtime,
            policy,
            "peer kernels: one host, full peer access",
        );
        change(&mut changed);
        assert_eq!(
            cached_choice(&changed.to_bytes(), &package, fixtures::CHOICE_KEY, &policy),
            None,
            "{what} must miss"
        );
    }
}

#[test]
fn a_cache_entry_naming_a_winner_the_package_dropped_misses() {
    let (_scratch, out) = scratch();
    let mut qualification = qualification(4);
    qualification.buckets[0].candidates[0].outcome =
        Outcome::Dropped(prepare::device::DropReason::NotExact {
            message: "rank 1 differed".to_owned(),
        });
    try_write_fixture(&out, Arch::Sm120, Some(qualification), false).unwrap();
    let package = open_package(&out).unwrap();
    let policy = Policy::default();
    let choice = fixtures::defaults_choice(
        &package,
        Tuning::Runtime,
        policy,
        "peer kernels: one host, full peer access",
    );
    assert_eq!(choice.buckets[0].decision.winner, "one_shot_push");
    assert_eq!(
        cached_choice(&choice.to_bytes(), &package, fixtures::CHOICE_KEY, &policy),
        None
    );
}
