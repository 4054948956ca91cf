//! Properties of the decision over generated matrices: invariance under the order of ranks
//! and rounds, the winner's guarantees against the best candidate, and, with one size timed,
//! equality with the rule of one median per candidate.

use prepare::tune::{
    decide, decide_bucket, p_value_less, BucketSamples, CandidateSamples, DecisionReason, Policy,
};
use proptest::prelude::*;

use super::decision::{bucket, bucket_at, median_of, slowdown_of, timed, timed_at, EDGES, LARGEST};

/// The rule of one median per candidate, written out as it was before buckets were timed at
/// both edges: per round the slowest rank, the median over rounds, the lowest median fastest
/// (the earlier on ties), the baseline replaced only when the fastest's median is lower by
/// more than the margin and significantly. Every sample must be valid.
fn one_median_rule(bucket: &BucketSamples, policy: &Policy) -> (String, DecisionReason) {
    let figures: Vec<Vec<f64>> = bucket
        .candidates
        .iter()
        .map(|candidate| {
            let at_size = &candidate.samples[0];
            let mut figures: Vec<f64> = (0..at_size[0].len())
                .map(|round| {
                    at_size
                        .iter()
                        .map(|rank| rank[round].unwrap())
                        .fold(f64::NEG_INFINITY, f64::max)
                })
                .collect();
            figures.sort_by(f64::total_cmp);
            figures
        })
        .collect();
    let medians: Vec<f64> = figures
        .iter()
        .map(|figures| {
            let middle = figures.len() / 2;
            if figures.len() % 2 == 1 {
                figures[middle]
            } else {
                f64::midpoint(figures[middle - 1], figures[middle])
            }
        })
        .collect();
    let name = |index: usize| bucket.candidates[index].profile.clone();
    let baseline = bucket
        .candidates
        .iter()
        .position(|candidate| candidate.profile == bucket.default)
        .unwrap();
    let fastest = (0..medians.len()).fold(0, |best, index| {
        if medians[index] < medians[best] {
            index
        } else {
            best
        }
    });
    let ratio = medians[fastest] / medians[baseline];
    if fastest == baseline || medians[fastest] >= medians[baseline] {
        (name(baseline), DecisionReason::BaselineFastest)
    } else if medians[fastest] >= medians[baseline] * (1.0 - policy.margin) {
        (
            name(baseline),
            DecisionReason::WithinMargin {
                fastest: name(fastest),
                ratio,
            },
        )
    } else {
        let p_value = p_value_less(&figures[fastest], &figures[baseline]).unwrap_or(1.0);
        let tested_bytes = bucket.sizes[0];
        if p_value < policy.significance {
            (
                name(fastest),
                DecisionReason::Faster {
                    ratio,
                    tested_bytes,
                    p_value,
                },
            )
        } else {
            (
                name(baseline),
                DecisionReason::NotSignificant {
                    fastest: name(fastest),
                    ratio,
                    tested_bytes,
                    p_value,
                },
            )
        }
    }
}

/// Candidates `p0`, `p1`, ... around `centers` (microseconds at the smallest and the largest
/// message) and NCCL around 8 and 10 us, with +-`jitter` relative noise, on `ranks` ranks,
/// `rounds` each: timed at both edges when `two_sizes`, else at the largest message alone.
/// Candidate `index` is timed from seed `seeds.0 ^ index`, NCCL from `seeds.1`. Returns the sizes
/// timed and the candidates.
fn generated(
    centers: &[(f64, f64)],
    two_sizes: bool,
    jitter: f64,
    ranks: usize,
    rounds: usize,
    seeds: (u64, u64),
) -> (&'static [u64], Vec<CandidateSamples>) {
    let at_sizes = |(smallest, largest): (f64, f64)| {
        if two_sizes {
            vec![smallest, largest]
        } else {
            vec![largest]
        }
    };
    let mut candidates: Vec<CandidateSamples> = centers
        .iter()
        .enumerate()
        .map(|(index, center)| {
            let profile = format!("p{index}");
            let seed = seeds.0 ^ index as u64;
            timed_at(&profile, &at_sizes(*center), jitter, ranks, rounds, seed)
        })
        .collect();
    let nccl = at_sizes((8.0, 10.0));
    candidates.push(timed_at("nccl", &nccl, jitter, ranks, rounds, seeds.1));
    let sizes: &'static [u64] = if two_sizes { &EDGES } else { &[LARGEST] };
    (sizes, candidates)
}

proptest! {
    /// Permuting ranks, and permuting rounds (the same way on every rank and at every size, as
    /// rounds are aligned), gives byte-identical decisions, with one size timed or two.
    #[test]
    fn rank_and_round_order_do_not_change_the_decision(
        seed in any::<u64>(),
        ranks in 2_usize..=8,
        rounds in 1_usize..40,
        rank_shift in 0_usize..8,
        round_shift in 0_usize..40,
        two_sizes in any::<bool>(),
        centers in proptest::collection::vec((1.0_f64..20.0, 1.0_f64..20.0), 1..5),
    ) {
        let (sizes, candidates) =
            generated(&centers, two_sizes, 0.2, ranks, rounds, (seed, seed.rotate_left(7)));
        let original = vec![bucket_at("nccl", sizes, candidates.clone())];
        let permuted: Vec<CandidateSamples> = candidates
            .into_iter()
            .map(|mut candidate| {
                for at_size in &mut candidate.samples {
                    at_size.rotate_left(rank_shift % ranks);
                    at_size.reverse();
                    for rank in at_size {
                        rank.rotate_left(round_shift % rounds);
                    }
                }
                candidate
            })
            .collect();
        let permuted = vec![bucket_at("nccl", sizes, permuted)];
        let policy = Policy::default();
        let left = serde_json::to_vec(&decide(&original, ranks, &policy).unwrap()).unwrap();
        let right = serde_json::to_vec(&decide(&permuted, ranks, &policy).unwrap()).unwrap();
        prop_assert_eq!(left, right);
    }

    /// The winner is never slower than the baseline, and a replaced baseline lost by more
    /// than the margin: in medians with one size, in slowdowns with two. Unless the fastest's
    /// gain was not significant, the winner's slowdown is within the margin of the lowest.
    #[test]
    fn the_winner_never_loses_to_the_baseline(
        seed in any::<u64>(),
        two_sizes in any::<bool>(),
        centers in proptest::collection::vec((1.0_f64..20.0, 1.0_f64..20.0), 1..5),
        rounds in 1_usize..30,
    ) {
        let (sizes, candidates) =
            generated(&centers, two_sizes, 0.3, 2, rounds, (seed, seed.rotate_left(9)));
        let policy = Policy::default();
        let decision = decide_bucket(&bucket_at("nccl", sizes, candidates), 2, &policy).unwrap();
        if !two_sizes {
            let winner = median_of(&decision, &decision.winner);
            let baseline = median_of(&decision, &decision.baseline);
            prop_assert!(winner <= baseline);
            if decision.winner != decision.baseline {
                prop_assert!(winner < baseline * (1.0 - policy.margin));
            }
        }
        let winner = slowdown_of(&decision, &decision.winner);
        let baseline = slowdown_of(&decision, &decision.baseline);
        prop_assert!(winner <= baseline);
        if decision.winner != decision.baseline {
            prop_assert!(winner < baseline * (1.0 - policy.margin));
        }
        let lowest = decision
            .candidates
            .iter()
            .map(|candidate| slowdown_of(&decision, &candidate.profile))
            .fold(f64::INFINITY, f64::min);
        prop_assert!(lowest >= 1.0);
        if !matches!(decision.reason, DecisionReason::NotSignificant { .. }) {
            prop_assert!(winner * (1.0 - policy.margin) <= lowest * (1.0 + 1e-12));
        }
    }

    /// With one size timed the decision is exactly the rule of one median per candidate:
    /// the same winner, reason, ratio and p-value, to the bit.
    #[test]
    fn one_size_is_the_rule_of_one_median(
        seed in any::<u64>(),
        ranks in 1_usize..=4,
        rounds in 1_usize..30,
        jitter in 0.0_f64..0.3,
        default in 0_usize..5,
        centers in proptest::collection::vec(5.0_f64..15.0, 1..5),
    ) {
        let mut candidates: Vec<CandidateSamples> = centers
            .iter()
            .enumerate()
            .map(|(index, center)| timed(&format!("p{index}"), *center, jitter, ranks, rounds, seed ^ index as u64))
            .collect();
        candidates.push(timed("nccl", 10.0, jitter, ranks, rounds, seed.rotate_left(11)));
        let default = candidates[default % candidates.len()].profile.clone();
        let samples = bucket(&default, candidates);
        let policy = Policy::default();
        let decision = decide_bucket(&samples, ranks, &policy).unwrap();
        let (winner, reason) = one_median_rule(&samples, &policy);
        prop_assert_eq!(decision.winner, winner);
        prop_assert_eq!(decision.reason, reason);
    }
}
