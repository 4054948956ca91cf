//! The decision from gathered timings (startup selection, step 5), on synthetic
//! matrices: noise, near-ties, margins, significance, slow ranks, failed samples, dropped
//! candidates, exact-only, and invariance under rank and round order.

// Figures are copied from the samples, never computed, so exact comparison is right.
#![allow(clippy::float_cmp)]

use prepare::tune::{
    decide, decide_bucket, BucketSamples, CandidateOutcome, CandidateSamples, DecisionError,
    DecisionReason, Policy,
};
use proptest::prelude::*;

/// A small deterministic generator so matrices are reproducible.
struct Noise(u64);

impl Noise {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 11) as f64) / ((1_u64 << 53) as f64)
    }
}

/// Samples around `center` microseconds with +-`jitter` relative noise.
fn timed(
    profile: &str,
    center: f64,
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
        samples: (0..ranks)
            .map(|_| {
                (0..rounds)
                    .map(|_| Some(center * (1.0 + jitter * (2.0 * noise.next() - 1.0))))
                    .collect()
            })
            .collect(),
    }
}

fn dropped(profile: &str, reason: &str) -> CandidateSamples {
    CandidateSamples {
        profile: profile.to_owned(),
        dropped: Some(reason.to_owned()),
        exact: true,
        samples: Vec::new(),
    }
}

fn bucket(default: &str, candidates: Vec<CandidateSamples>) -> BucketSamples {
    BucketSamples {
        index: 3,
        default: default.to_owned(),
        candidates,
    }
}

fn median_of(decision: &prepare::tune::BucketDecision, profile: &str) -> f64 {
    match &decision
        .candidates
        .iter()
        .find(|candidate| candidate.profile == profile)
        .unwrap()
        .outcome
    {
        CandidateOutcome::Timed { median_us, .. } => *median_us,
        CandidateOutcome::Excluded { reason } => panic!("{profile} excluded: {reason}"),
    }
}

#[test]
fn a_clear_win_replaces_the_default() {
    let samples = bucket(
        "nccl",
        vec![
            timed("one_shot", 6.0, 0.02, 2, 30, 1),
            timed("nccl", 10.0, 0.02, 2, 30, 2),
        ],
    );
    let decision = decide_bucket(&samples, 2, &Policy::default()).unwrap();
    assert_eq!(decision.winner, "one_shot");
    assert_eq!(decision.baseline, "nccl");
    match decision.reason {
        DecisionReason::Faster { ratio, p_value } => {
            assert!((0.55..0.65).contains(&ratio), "{ratio}");
            assert!(p_value < 1e-6, "{p_value}");
        }
        other => panic!("{other:?}"),
    }
    assert!(decision.bit_exact);
}

#[test]
fn a_near_tie_inside_the_margin_keeps_the_default() {
    let samples = bucket(
        "nccl",
        vec![
            timed("one_shot", 9.8, 0.001, 2, 30, 3),
            timed("nccl", 10.0, 0.001, 2, 30, 4),
        ],
    );
    let decision = decide_bucket(&samples, 2, &Policy::default()).unwrap();
    assert_eq!(decision.winner, "nccl");
    assert!(
        matches!(decision.reason, DecisionReason::WithinMargin { ref fastest, .. } if fastest == "one_shot")
    );
}

#[test]
fn a_win_past_the_margin_that_is_not_significant_keeps_the_default() {
    // Three rounds cannot reach p < 0.01 in a one-sided Mann-Whitney test (the least is 1/20).
    let samples = bucket(
        "nccl",
        vec![
            timed("one_shot", 8.0, 0.01, 2, 3, 5),
            timed("nccl", 10.0, 0.01, 2, 3, 6),
        ],
    );
    let decision = decide_bucket(&samples, 2, &Policy::default()).unwrap();
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
    for sample in &mut custom.samples[1] {
        *sample = Some(12.0);
    }
    let samples = bucket("nccl", vec![custom, timed("nccl", 10.0, 0.01, 2, 30, 8)]);
    let decision = decide_bucket(&samples, 2, &Policy::default()).unwrap();
    assert_eq!(median_of(&decision, "one_shot"), 12.0);
    assert_eq!(decision.winner, "nccl");
    assert_eq!(decision.reason, DecisionReason::BaselineFastest);
}

#[test]
fn failed_and_nan_samples_skip_their_round() {
    let mut custom = timed("one_shot", 6.0, 0.0, 2, 30, 9);
    // Round 0 failed on rank 0, round 1 gave NaN on rank 1, round 2 an infinite time; the
    // huge values below would move the median if those rounds counted.
    custom.samples[0][0] = None;
    custom.samples[1][0] = Some(1e9);
    custom.samples[1][1] = Some(f64::NAN);
    custom.samples[0][1] = Some(1e9);
    custom.samples[0][2] = Some(f64::INFINITY);
    custom.samples[1][2] = Some(1e9);
    let samples = bucket("nccl", vec![custom, timed("nccl", 10.0, 0.0, 2, 30, 10)]);
    let decision = decide_bucket(&samples, 2, &Policy::default()).unwrap();
    match &decision.candidates[0].outcome {
        CandidateOutcome::Timed { rounds, max_us, .. } => {
            assert_eq!(*rounds, 27);
            assert_eq!(*max_us, 6.0);
        }
        other @ CandidateOutcome::Excluded { .. } => panic!("{other:?}"),
    }
    assert_eq!(decision.winner, "one_shot");
}

#[test]
fn a_candidate_without_one_valid_round_is_excluded() {
    let mut custom = timed("one_shot", 6.0, 0.0, 2, 4, 11);
    for round in 0..4 {
        custom.samples[round % 2][round] = None;
    }
    let samples = bucket("nccl", vec![custom, timed("nccl", 10.0, 0.0, 2, 4, 12)]);
    let decision = decide_bucket(&samples, 2, &Policy::default()).unwrap();
    assert_eq!(decision.winner, "nccl");
    assert_eq!(
        decision.candidates[0].outcome,
        CandidateOutcome::Excluded {
            reason: "no round had a valid sample from every rank".to_owned()
        }
    );
}

#[test]
fn a_dropped_default_makes_the_first_survivor_the_baseline() {
    let samples = bucket(
        "rsag",
        vec![
            timed("nccl", 10.0, 0.01, 2, 30, 13),
            dropped(
                "rsag",
                "blocks cannot all be resident: needs 8 clusters, 6 fit",
            ),
            timed("one_shot", 9.9, 0.01, 2, 30, 14),
        ],
    );
    let decision = decide_bucket(&samples, 2, &Policy::default()).unwrap();
    assert_eq!(decision.baseline, "nccl");
    assert_eq!(decision.winner, "nccl");
    assert_eq!(
        decision.candidates[1].outcome,
        CandidateOutcome::Excluded {
            reason: "blocks cannot all be resident: needs 8 clusters, 6 fit".to_owned()
        }
    );
}

#[test]
fn every_custom_candidate_dropped_leaves_nccl() {
    let samples = bucket(
        "one_shot",
        vec![
            dropped("one_shot", "no peer access between GPU 0 and GPU 1"),
            dropped("rsag", "no peer access between GPU 0 and GPU 1"),
            timed("nccl", 10.0, 0.01, 4, 30, 15),
        ],
    );
    let decision = decide_bucket(&samples, 4, &Policy::default()).unwrap();
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
fn exact_only_keeps_a_non_matching_nccl_out() {
    let mut nccl = timed("nccl", 5.0, 0.01, 4, 30, 16);
    nccl.exact = false;
    let candidates = vec![timed("rsag", 10.0, 0.01, 4, 30, 17), nccl];
    let loose = decide_bucket(&bucket("rsag", candidates.clone()), 4, &Policy::default()).unwrap();
    assert_eq!(loose.winner, "nccl");
    assert!(!loose.bit_exact);
    let strict = Policy {
        exact_only: true,
        ..Policy::default()
    };
    let exact = decide_bucket(&bucket("rsag", candidates), 4, &strict).unwrap();
    assert_eq!(exact.winner, "rsag");
    assert!(exact.bit_exact);
    assert!(matches!(
        exact.candidates[1].outcome,
        CandidateOutcome::Excluded { .. }
    ));
}

#[test]
fn equal_figures_go_to_the_earlier_candidate() {
    let constant = |profile: &str| CandidateSamples {
        profile: profile.to_owned(),
        dropped: None,
        exact: true,
        samples: vec![vec![Some(4.0); 20]; 2],
    };
    let samples = bucket(
        "nccl",
        vec![
            constant("b"),
            constant("a"),
            timed("nccl", 10.0, 0.01, 2, 20, 18),
        ],
    );
    let decision = decide_bucket(&samples, 2, &Policy::default()).unwrap();
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

proptest! {
    /// Permuting ranks, and permuting rounds (the same way on every rank, as rounds are
    /// aligned), gives byte-identical decisions.
    #[test]
    fn rank_and_round_order_do_not_change_the_decision(
        seed in any::<u64>(),
        ranks in 2_usize..=8,
        rounds in 1_usize..40,
        rank_shift in 0_usize..8,
        round_shift in 0_usize..40,
        centers in proptest::collection::vec(1.0_f64..20.0, 1..5),
    ) {
        let mut candidates: Vec<CandidateSamples> = centers
            .iter()
            .enumerate()
            .map(|(index, center)| timed(&format!("p{index}"), *center, 0.2, ranks, rounds, seed ^ index as u64))
            .collect();
        candidates.push(timed("nccl", 10.0, 0.2, ranks, rounds, seed.rotate_left(7)));
        let original = vec![bucket("nccl", candidates.clone())];
        let permuted: Vec<CandidateSamples> = candidates
            .into_iter()
            .map(|mut candidate| {
                candidate.samples.rotate_left(rank_shift % ranks);
                candidate.samples.reverse();
                for rank in &mut candidate.samples {
                    rank.rotate_left(round_shift % rounds);
                }
                candidate
            })
            .collect();
        let permuted = vec![bucket("nccl", permuted)];
        let policy = Policy::default();
        let left = serde_json::to_vec(&decide(&original, ranks, &policy).unwrap()).unwrap();
        let right = serde_json::to_vec(&decide(&permuted, ranks, &policy).unwrap()).unwrap();
        prop_assert_eq!(left, right);
    }

    /// The winner is never slower than the baseline, and a replaced baseline lost by more
    /// than the margin.
    #[test]
    fn the_winner_never_loses_to_the_baseline(
        seed in any::<u64>(),
        centers in proptest::collection::vec(1.0_f64..20.0, 1..5),
        rounds in 1_usize..30,
    ) {
        let mut candidates: Vec<CandidateSamples> = centers
            .iter()
            .enumerate()
            .map(|(index, center)| timed(&format!("p{index}"), *center, 0.3, 2, rounds, seed ^ index as u64))
            .collect();
        candidates.push(timed("nccl", 10.0, 0.3, 2, rounds, seed.rotate_left(9)));
        let policy = Policy::default();
        let decision = decide_bucket(&bucket("nccl", candidates), 2, &policy).unwrap();
        let winner = median_of(&decision, &decision.winner);
        let baseline = median_of(&decision, &decision.baseline);
        prop_assert!(winner <= baseline);
        if decision.winner != decision.baseline {
            prop_assert!(winner < baseline * (1.0 - policy.margin));
        }
    }
}
