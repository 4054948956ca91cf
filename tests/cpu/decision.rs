//! The decision from gathered timings (startup selection, step 5), on synthetic
//! matrices: noise, near-ties, margins, significance, slow ranks, failed samples, dropped
//! candidates, and invariance under rank and round order; with one size timed
//! (the rule of one median per candidate) and with both edges of a bucket (slowdowns).

// Figures are copied from the samples, never computed, so exact comparison is right.
#![allow(clippy::float_cmp)]

use prepare::tune::{
    decide_bucket, p_value_less, BucketDecision, BucketSamples, CandidateOutcome, CandidateSamples,
    DecisionError, DecisionReason, Policy, SizeFigures,
};

use crate::support::timings::Noise;

/// The size the one-size tests time at: the bucket's largest message.
pub(super) const LARGEST: u64 = 16_384;

/// Samples at one size (`LARGEST`) around `center` microseconds with +-`jitter` relative noise.
pub(super) fn timed(
    profile: &str,
    center: f64,
    jitter: f64,
    ranks: usize,
    rounds: usize,
    seed: u64,
) -> CandidateSamples {
    timed_at(profile, &[center], jitter, ranks, rounds, seed)
}

/// Samples at every size, around `centers[size]` microseconds with +-`jitter` relative noise.
pub(super) fn timed_at(
    profile: &str,
    centers: &[f64],
    jitter: f64,
    ranks: usize,
    rounds: usize,
    seed: u64,
) -> CandidateSamples {
    let mut noise = Noise(seed);
    CandidateSamples {
        profile: profile.to_owned(),
        dropped: None,
        exact: true,
        samples: centers
            .iter()
            .map(|center| noise.samples(*center, jitter, ranks, rounds))
            .collect(),
    }
}

/// Exactly these round figures at each size, the same on every rank.
fn figures_at(profile: &str, figures: &[&[f64]], ranks: usize) -> CandidateSamples {
    CandidateSamples {
        profile: profile.to_owned(),
        dropped: None,
        exact: true,
        samples: figures
            .iter()
            .map(|at_size| vec![at_size.iter().copied().map(Some).collect(); ranks])
            .collect(),
    }
}

pub(super) fn dropped(profile: &str, reason: &str) -> CandidateSamples {
    CandidateSamples {
        profile: profile.to_owned(),
        dropped: Some(reason.to_owned()),
        exact: true,
        samples: Vec::new(),
    }
}

/// A bucket timed at one size, `LARGEST`.
pub(super) fn bucket(default: &str, candidates: Vec<CandidateSamples>) -> BucketSamples {
    bucket_at(default, &[LARGEST], candidates)
}

/// A bucket timed at `sizes`.
pub(super) fn bucket_at(
    default: &str,
    sizes: &[u64],
    candidates: Vec<CandidateSamples>,
) -> BucketSamples {
    BucketSamples {
        index: 3,
        default: default.to_owned(),
        sizes: sizes.to_vec(),
        candidates,
    }
}

/// A timed candidate's slowdown and figures per size.
fn timed_of<'a>(decision: &'a BucketDecision, profile: &str) -> (f64, &'a [SizeFigures]) {
    match &decision
        .candidates
        .iter()
        .find(|candidate| candidate.profile == profile)
        .unwrap()
        .outcome
    {
        CandidateOutcome::Timed { slowdown, sizes } => (*slowdown, sizes),
        CandidateOutcome::Excluded { reason } => panic!("{profile} excluded: {reason}"),
    }
}

/// A candidate's median at the one size timed.
pub(super) fn median_of(decision: &BucketDecision, profile: &str) -> f64 {
    let (_, sizes) = timed_of(decision, profile);
    assert_eq!(sizes.len(), 1, "one size timed");
    sizes[0].median_us
}

/// A candidate's slowdown.
pub(super) fn slowdown_of(decision: &BucketDecision, profile: &str) -> f64 {
    timed_of(decision, profile).0
}

/// The decision on a bucket timed at one size, `LARGEST`, among `ranks` ranks, under the default
/// policy.
fn decide_with_defaults(
    default: &str,
    candidates: Vec<CandidateSamples>,
    ranks: usize,
) -> BucketDecision {
    decide_bucket(&bucket(default, candidates), ranks, &Policy::default()).unwrap()
}

/// The decision between `one_shot` and the default, `nccl`, at two ranks.
fn against_nccl(one_shot: CandidateSamples, nccl: CandidateSamples) -> BucketDecision {
    decide_with_defaults("nccl", vec![one_shot, nccl], 2)
}

/// [`against_nccl`] with both timed at two ranks, `rounds` each, around `one_shot_us` and
/// `nccl_us` with +-`jitter` relative noise, from seeds `seed` and `seed + 1`.
fn one_shot_against_nccl(
    one_shot_us: f64,
    nccl_us: f64,
    jitter: f64,
    rounds: usize,
    seed: u64,
) -> BucketDecision {
    against_nccl(
        timed("one_shot", one_shot_us, jitter, 2, rounds, seed),
        timed("nccl", nccl_us, jitter, 2, rounds, seed + 1),
    )
}

/// The ratio, the size tested and the p-value of a decision that replaced its baseline.
fn faster(decision: &BucketDecision) -> (f64, u64, f64) {
    match decision.reason {
        DecisionReason::Faster {
            ratio,
            tested_bytes,
            p_value,
        } => (ratio, tested_bytes, p_value),
        ref other => panic!("{other:?}"),
    }
}

/// Asserts that the decision excluded its candidate `index` for `reason`.
fn assert_excluded(decision: &BucketDecision, index: usize, reason: &str) {
    assert_eq!(
        decision.candidates[index].outcome,
        CandidateOutcome::Excluded {
            reason: reason.to_owned()
        }
    );
}

#[test]
fn a_clear_win_replaces_the_default() {
    let decision = one_shot_against_nccl(6.0, 10.0, 0.02, 30, 1);
    assert_eq!(decision.winner, "one_shot");
    assert_eq!(decision.baseline, "nccl");
    let (ratio, tested_bytes, p_value) = faster(&decision);
    assert!((0.55..0.65).contains(&ratio), "{ratio}");
    assert_eq!(tested_bytes, LARGEST);
    assert!(p_value < 1e-6, "{p_value}");
    assert!(decision.bit_exact);
}

#[test]
fn a_near_tie_inside_the_margin_keeps_the_default() {
    let decision = one_shot_against_nccl(9.8, 10.0, 0.001, 30, 3);
    assert_eq!(decision.winner, "nccl");
    assert!(
        matches!(decision.reason, DecisionReason::WithinMargin { ref fastest, .. } if fastest == "one_shot")
    );
}

#[test]
fn a_win_past_the_margin_that_is_not_significant_keeps_the_default() {
    // Three rounds cannot reach p < 0.01 in a one-sided Mann-Whitney test (the least is 1/20).
    let decision = one_shot_against_nccl(8.0, 10.0, 0.01, 3, 5);
    assert_eq!(decision.winner, "nccl");
    match decision.reason {
        DecisionReason::NotSignificant {
            fastest, p_value, ..
        } => {
            assert_eq!(fastest, "one_shot");
            assert!((p_value - 0.05).abs() < 1e-12, "{p_value}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_slowest_rank_counts_in_every_round() {
    // Rank 1 runs the custom kernel slowly: per round the slower rank is what all ranks wait for.
    let mut custom = timed("one_shot", 6.0, 0.01, 2, 30, 7);
    for sample in &mut custom.samples[0][1] {
        *sample = Some(12.0);
    }
    let decision = against_nccl(custom, timed("nccl", 10.0, 0.01, 2, 30, 8));
    assert_eq!(median_of(&decision, "one_shot"), 12.0);
    assert_eq!(decision.winner, "nccl");
    assert_eq!(decision.reason, DecisionReason::BaselineFastest);
}

#[test]
fn failed_and_nan_samples_skip_their_round() {
    let mut custom = timed("one_shot", 6.0, 0.0, 2, 30, 9);
    // Round 0 failed on rank 0, round 1 gave NaN on rank 1, round 2 an infinite time; the
    // huge values below would move the median if those rounds counted.
    let at_size = &mut custom.samples[0];
    at_size[0][0] = None;
    at_size[1][0] = Some(1e9);
    at_size[1][1] = Some(f64::NAN);
    at_size[0][1] = Some(1e9);
    at_size[0][2] = Some(f64::INFINITY);
    at_size[1][2] = Some(1e9);
    let decision = against_nccl(custom, timed("nccl", 10.0, 0.0, 2, 30, 10));
    match &decision.candidates[0].outcome {
        CandidateOutcome::Timed { sizes, .. } => {
            assert_eq!(sizes.len(), 1);
            assert_eq!(sizes[0].bytes, LARGEST);
            assert_eq!(sizes[0].rounds, 27);
            assert_eq!(sizes[0].max_us, 6.0);
        }
        other @ CandidateOutcome::Excluded { .. } => panic!("{other:?}"),
    }
    assert_eq!(decision.winner, "one_shot");
}

#[test]
fn a_candidate_without_one_valid_round_is_excluded() {
    let mut custom = timed("one_shot", 6.0, 0.0, 2, 4, 11);
    for round in 0..4 {
        custom.samples[0][round % 2][round] = None;
    }
    let decision = against_nccl(custom, timed("nccl", 10.0, 0.0, 2, 4, 12));
    assert_eq!(decision.winner, "nccl");
    assert_excluded(
        &decision,
        0,
        "no round had a valid sample from every rank at 16384 bytes",
    );
}

#[test]
fn a_dropped_default_makes_the_first_survivor_the_baseline() {
    let decision = decide_with_defaults(
        "rsag",
        vec![
            timed("nccl", 10.0, 0.01, 2, 30, 13),
            dropped(
                "rsag",
                "blocks cannot all be resident: needs 8 clusters, 6 fit",
            ),
            timed("one_shot", 9.9, 0.01, 2, 30, 14),
        ],
        2,
    );
    assert_eq!(decision.baseline, "nccl");
    assert_eq!(decision.winner, "nccl");
    assert_excluded(
        &decision,
        1,
        "blocks cannot all be resident: needs 8 clusters, 6 fit",
    );
}

#[test]
fn every_custom_candidate_dropped_leaves_nccl() {
    let decision = decide_with_defaults(
        "one_shot",
        vec![
            dropped("one_shot", "no peer access between GPU 0 and GPU 1"),
            dropped("rsag", "no peer access between GPU 0 and GPU 1"),
            timed("nccl", 10.0, 0.01, 4, 30, 15),
        ],
        4,
    );
    assert_eq!(decision.winner, "nccl");
    assert_eq!(decision.baseline, "nccl");
    assert_eq!(decision.reason, DecisionReason::BaselineFastest);
}

#[test]
fn nothing_timed_is_an_error_naming_the_bucket_and_reasons() {
    let samples = bucket(
        "nccl",
        vec![
            dropped("one_shot", "capture failed"),
            dropped("nccl", "NCCL timed out"),
        ],
    );
    let error = decide_bucket(&samples, 2, &Policy::default()).unwrap_err();
    assert_eq!(
        error.to_string(),
        "bucket 3: no candidate could be timed (one_shot: capture failed; nccl: NCCL timed out)"
    );
}

#[test]
fn equal_figures_go_to_the_earlier_candidate() {
    let constant = |profile: &str| CandidateSamples {
        profile: profile.to_owned(),
        dropped: None,
        exact: true,
        samples: vec![vec![vec![Some(4.0); 20]; 2]],
    };
    let decision = decide_with_defaults(
        "nccl",
        vec![
            constant("b"),
            constant("a"),
            timed("nccl", 10.0, 0.01, 2, 20, 18),
        ],
        2,
    );
    assert_eq!(decision.winner, "b");
}

#[test]
fn a_wrong_number_of_ranks_is_an_error() {
    let samples = bucket("nccl", vec![timed("nccl", 10.0, 0.01, 3, 5, 19)]);
    assert_eq!(
        decide_bucket(&samples, 2, &Policy::default()).unwrap_err(),
        DecisionError::RankCount {
            bucket: 3,
            profile: "nccl".to_owned(),
            found: 3,
            expected: 2
        }
    );
}

/// The bucket (1.5 MiB, 2 MiB] of the H200 TP2 ladder: its smallest and largest message.
const SMALLEST_EDGE: u64 = 1_572_866;
const LARGEST_EDGE: u64 = 2_097_152;
pub(super) const EDGES: [u64; 2] = [SMALLEST_EDGE, LARGEST_EDGE];

/// As measured on 2x H200: the default `rsag_pull` within 1% of `one_shot_simple_wide` at
/// 2 MiB, but 13% slower at 1.5 MiB + 2 bytes. Timed at the largest message only, the default
/// stays; timed at both edges, the candidate best at both replaces it.
#[test]
fn a_default_within_the_margin_at_one_edge_but_slow_at_the_other_loses() {
    let candidates = vec![
        timed_at("rsag_pull", &[13.67, 15.50], 0.005, 2, 25, 31),
        timed_at("one_shot_simple", &[12.30, 15.80], 0.005, 2, 25, 32),
        timed_at("one_shot_simple_wide", &[12.09, 15.40], 0.005, 2, 25, 33),
        timed_at("nccl", &[16.90, 17.10], 0.005, 2, 25, 34),
    ];
    let policy = Policy::default();
    let decision = decide_bucket(
        &bucket_at("rsag_pull", &EDGES, candidates.clone()),
        2,
        &policy,
    )
    .unwrap();
    assert_eq!(decision.baseline, "rsag_pull");
    assert_eq!(decision.winner, "one_shot_simple_wide");
    assert_eq!(slowdown_of(&decision, "one_shot_simple_wide"), 1.0);
    let baseline_slowdown = slowdown_of(&decision, "rsag_pull");
    assert!(
        (1.12..1.14).contains(&baseline_slowdown),
        "{baseline_slowdown}"
    );
    let (ratio, tested_bytes, p_value) = faster(&decision);
    assert!((ratio - 1.0 / baseline_slowdown).abs() < 1e-12, "{ratio}");
    assert_eq!(tested_bytes, SMALLEST_EDGE, "where the default fares worst");
    assert!(p_value < policy.significance, "{p_value}");
    // Every candidate's figures at both sizes, smallest first.
    for candidate in &decision.candidates {
        let (_, sizes) = timed_of(&decision, &candidate.profile);
        let bytes: Vec<u64> = sizes.iter().map(|figures| figures.bytes).collect();
        assert_eq!(bytes, EDGES);
        assert!(sizes.iter().all(|figures| figures.rounds == 25));
    }

    // The same timings at the largest message only: within the margin, the default stays.
    let largest_only: Vec<CandidateSamples> = candidates
        .into_iter()
        .map(|mut candidate| {
            candidate.samples.remove(0);
            candidate
        })
        .collect();
    let decision = decide_bucket(
        &bucket_at("rsag_pull", &[LARGEST_EDGE], largest_only),
        2,
        &policy,
    )
    .unwrap();
    assert_eq!(decision.winner, "rsag_pull");
    assert!(matches!(
        decision.reason,
        DecisionReason::WithinMargin { ref fastest, .. } if fastest == "one_shot_simple_wide"
    ));
}

/// A candidate best at one edge but 6% slower at the other loses to one at most 2% slower at
/// either, whether the first is the default or not.
#[test]
fn a_candidate_slow_at_one_edge_loses_to_one_close_at_both() {
    // `uneven` is the best at the smallest message and 6% slower at the largest; `even` is 2%
    // slower at the smallest and the best at the largest.
    let uneven = timed_at("uneven", &[10.0, 21.2], 0.002, 2, 25, 41);
    let even = timed_at("even", &[10.2, 20.0], 0.002, 2, 25, 42);
    let nccl = timed_at("nccl", &[15.0, 30.0], 0.002, 2, 25, 43);
    let policy = Policy::default();
    for default in ["uneven", "nccl"] {
        let decision = decide_bucket(
            &bucket_at(
                default,
                &EDGES,
                vec![uneven.clone(), even.clone(), nccl.clone()],
            ),
            2,
            &policy,
        )
        .unwrap();
        assert_eq!(decision.winner, "even", "default {default}");
        let (uneven_slowdown, even_slowdown) = (
            slowdown_of(&decision, "uneven"),
            slowdown_of(&decision, "even"),
        );
        assert!(
            (1.055..1.065).contains(&uneven_slowdown),
            "{uneven_slowdown}"
        );
        assert!((1.015..1.025).contains(&even_slowdown), "{even_slowdown}");
        match decision.reason {
            DecisionReason::Faster {
                ratio,
                tested_bytes,
                p_value,
            } => {
                let baseline_slowdown = slowdown_of(&decision, default);
                assert!(
                    (ratio - even_slowdown / baseline_slowdown).abs() < 1e-12,
                    "{ratio}"
                );
                // `uneven` fares worst at the largest message; NCCL at the smallest.
                let worst = if default == "uneven" {
                    LARGEST_EDGE
                } else {
                    SMALLEST_EDGE
                };
                assert_eq!(tested_bytes, worst, "default {default}");
                assert!(p_value < policy.significance, "{p_value}");
            }
            other => panic!("default {default}: {other:?}"),
        }
    }
}

/// Figures that overlap (medians 8 and 10; one-sided p about 0.45 over 9 rounds).
const OVERLAPPING_FAST: [f64; 9] = [1.0, 2.0, 3.0, 4.0, 8.0, 30.0, 31.0, 32.0, 33.0];
const OVERLAPPING_SLOW: [f64; 9] = [5.0, 6.0, 7.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0];
/// Figures that do not overlap (medians 8 and 10; p = 1 / C(18, 9)).
const SEPARATE_FAST: [f64; 9] = [7.6, 7.7, 7.8, 7.9, 8.0, 8.1, 8.2, 8.3, 8.4];
const SEPARATE_SLOW: [f64; 9] = [9.6, 9.7, 9.8, 9.9, 10.0, 10.1, 10.2, 10.3, 10.4];
/// Figures that do not overlap, closer (medians 9 and 10).
const SEPARATE_FAST_CLOSE: [f64; 9] = [8.6, 8.7, 8.8, 8.9, 9.0, 9.1, 9.2, 9.3, 9.4];

/// The significance test compares the two candidates where the baseline's slowdown is
/// largest (the larger size on ties), even where the other size would give another verdict.
#[test]
fn the_significance_test_is_at_the_baselines_worst_size() {
    let policy = Policy::default();
    let significant =
        |fast: &[f64], slow: &[f64]| p_value_less(fast, slow).unwrap() < policy.significance;
    assert!(!significant(&OVERLAPPING_FAST, &OVERLAPPING_SLOW));
    assert!(significant(&SEPARATE_FAST, &SEPARATE_SLOW));
    assert!(significant(&SEPARATE_FAST_CLOSE, &SEPARATE_SLOW));
    let decide_with = |fast: [&[f64]; 2], slow: [&[f64]; 2]| {
        decide_bucket(
            &bucket_at(
                "nccl",
                &EDGES,
                vec![
                    figures_at("one_shot", &fast, 2),
                    figures_at("nccl", &slow, 2),
                ],
            ),
            2,
            &policy,
        )
        .unwrap()
    };

    // The baseline fares worst at the largest message (10 against 8), where the figures
    // overlap; at the smallest (10 against 9) the test would find the gain significant.
    let decision = decide_with(
        [&SEPARATE_FAST_CLOSE, &OVERLAPPING_FAST],
        [&SEPARATE_SLOW, &OVERLAPPING_SLOW],
    );
    assert_eq!(decision.winner, "nccl");
    match decision.reason {
        DecisionReason::NotSignificant {
            fastest,
            ratio,
            tested_bytes,
            p_value,
        } => {
            assert_eq!(fastest, "one_shot");
            assert_eq!(ratio, 0.8);
            assert_eq!(tested_bytes, LARGEST_EDGE);
            assert_eq!(
                Some(p_value),
                p_value_less(&OVERLAPPING_FAST, &OVERLAPPING_SLOW)
            );
        }
        other => panic!("{other:?}"),
    }

    // The other way round: worst at the smallest message, significant there only.
    let decision = decide_with(
        [&SEPARATE_FAST, &OVERLAPPING_FAST],
        [&SEPARATE_SLOW, &OVERLAPPING_SLOW.map(|value| value * 0.9)],
    );
    assert_eq!(decision.winner, "one_shot");
    let (ratio, tested_bytes, p_value) = faster(&decision);
    assert_eq!(ratio, 0.8);
    assert_eq!(tested_bytes, SMALLEST_EDGE);
    assert_eq!(Some(p_value), p_value_less(&SEPARATE_FAST, &SEPARATE_SLOW));
    assert!(!significant(
        &OVERLAPPING_FAST,
        &OVERLAPPING_SLOW.map(|value| value * 0.9)
    ));

    // Equal slowdowns (10 against 8 at both sizes): the test is at the larger size.
    for (fast, slow, winner, tested_bytes) in [
        (
            [&OVERLAPPING_FAST[..], &SEPARATE_FAST[..]],
            [&OVERLAPPING_SLOW[..], &SEPARATE_SLOW[..]],
            "one_shot",
            LARGEST_EDGE,
        ),
        (
            [&SEPARATE_FAST[..], &OVERLAPPING_FAST[..]],
            [&SEPARATE_SLOW[..], &OVERLAPPING_SLOW[..]],
            "nccl",
            LARGEST_EDGE,
        ),
    ] {
        let decision = decide_with(fast, slow);
        assert_eq!(slowdown_of(&decision, "nccl"), 1.25);
        assert_eq!(decision.winner, winner);
        match decision.reason {
            DecisionReason::Faster {
                tested_bytes: tested,
                ..
            }
            | DecisionReason::NotSignificant {
                tested_bytes: tested,
                ..
            } => assert_eq!(tested, tested_bytes),
            other => panic!("{other:?}"),
        }
    }
}

/// A candidate without one valid round at some size is excluded, naming the size, and the
/// others are decided among themselves: the best medians and slowdowns leave it out.
#[test]
fn a_candidate_without_a_valid_round_at_one_size_is_excluded() {
    // The fastest at both sizes, but rank 1 failed every round at the smallest message.
    let mut failed = timed_at("one_shot", &[4.0, 5.0], 0.01, 2, 20, 51);
    for sample in &mut failed.samples[0][1] {
        *sample = None;
    }
    let candidates = vec![
        failed.clone(),
        timed_at("rsag", &[10.0, 12.0], 0.01, 2, 20, 52),
        timed_at("nccl", &[11.0, 11.0], 0.01, 2, 20, 53),
    ];
    let decision = decide_bucket(
        &bucket_at("rsag", &EDGES, candidates),
        2,
        &Policy::default(),
    )
    .unwrap();
    assert_excluded(
        &decision,
        0,
        &format!("no round had a valid sample from every rank at {SMALLEST_EDGE} bytes"),
    );
    assert_ne!(decision.winner, "one_shot");
    assert_eq!(decision.baseline, "rsag");
    // Without `one_shot`, `rsag` is the best at the smallest message and NCCL at the largest.
    let (rsag, nccl) = (
        slowdown_of(&decision, "rsag"),
        slowdown_of(&decision, "nccl"),
    );
    assert!((1.05..1.15).contains(&rsag), "{rsag}");
    assert!((1.05..1.15).contains(&nccl), "{nccl}");
    for profile in ["rsag", "nccl"] {
        let (slowdown, sizes) = timed_of(&decision, profile);
        let best = sizes
            .iter()
            .map(|figures| figures.median_us)
            .fold(f64::INFINITY, f64::min);
        assert!(slowdown >= 1.0);
        assert!(sizes.iter().any(|figures| figures.median_us == best));
    }

    // Failed at both sizes: both named.
    for sample in &mut failed.samples[1][0] {
        *sample = None;
    }
    let decision = decide_bucket(
        &bucket_at(
            "nccl",
            &EDGES,
            vec![failed, timed_at("nccl", &[11.0, 11.0], 0.01, 2, 20, 54)],
        ),
        2,
        &Policy::default(),
    )
    .unwrap();
    let reason = format!(
        "no round had a valid sample from every rank at {SMALLEST_EDGE} and {LARGEST_EDGE} bytes"
    );
    assert_excluded(&decision, 0, &reason);
    assert_eq!(decision.winner, "nccl");
    assert_eq!(slowdown_of(&decision, "nccl"), 1.0);
}

#[test]
fn sizes_must_be_one_or_more_ascending_and_match_the_samples() {
    let policy = Policy::default();
    for sizes in [
        &[][..],
        &[LARGEST_EDGE, SMALLEST_EDGE],
        &[LARGEST_EDGE, LARGEST_EDGE],
    ] {
        let samples = bucket_at("nccl", sizes, vec![dropped("nccl", "no GPU")]);
        assert_eq!(
            decide_bucket(&samples, 2, &policy).unwrap_err(),
            DecisionError::Sizes {
                bucket: 3,
                sizes: sizes.to_vec()
            }
        );
    }
    let samples = bucket_at("nccl", &EDGES, vec![timed("nccl", 10.0, 0.01, 2, 5, 55)]);
    let error = decide_bucket(&samples, 2, &policy).unwrap_err();
    assert_eq!(
        error,
        DecisionError::SizeCount {
            bucket: 3,
            profile: "nccl".to_owned(),
            found: 1,
            expected: 2
        }
    );
    assert_eq!(
        error.to_string(),
        "bucket 3, profile nccl: samples at 1 sizes, expected 2"
    );
    // A wrong number of ranks at either size.
    let mut samples = bucket_at(
        "nccl",
        &EDGES,
        vec![timed_at("nccl", &[10.0, 11.0], 0.01, 2, 5, 56)],
    );
    samples.candidates[0].samples[1].pop();
    assert_eq!(
        decide_bucket(&samples, 2, &policy).unwrap_err(),
        DecisionError::RankCount {
            bucket: 3,
            profile: "nccl".to_owned(),
            found: 1,
            expected: 2
        }
    );
}
