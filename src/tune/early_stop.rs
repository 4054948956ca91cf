//! Stopping a bucket's timing early. Most buckets have candidates that are far apart: timing
//! them all for every round spends the startup on figures that cannot change the decision. At
//! each checkpoint the rounds so far are gathered (every rank holds the same matrix and so
//! stops the same candidates) and a candidate stops being timed when another **dominates** it:
//! at every size timed, with at least [`MIN_ROUNDS`] rounds each, every round of the other is
//! faster than every round of it by more than twice the margin
//! (`max(other) x (1 + 2 margin) < min(it)`, per round the slowest rank counting, as in the
//! decision). When at most one candidate of the bucket is not dominated, the bucket stops.
//!
//! Why the decision keeps its guarantees on the figures it then gets:
//! - domination is transitive, so every dominated candidate is dominated by one that is not;
//! - a dominated candidate's median is above its dominator's by more than `1 + 2 margin` at
//!   every size, so its slowdown is too, and it cannot be the fastest;
//! - when the baseline is dominated and the fastest wins, the fastest's slowdown is below the
//!   baseline's over `1 + 2 margin`, which is below `1 - margin` (for margins up to 1/3), and
//!   the rank test compares two sets with no overlap: with [`MIN_ROUNDS`] rounds each its
//!   p-value is at most `1 / C(16, 8)`, about 8e-5, below any significance in use.
//!
//! A candidate that is not dominated is timed for every round, so where two candidates are
//! close the decision rests on as many rounds as without early stopping.

/// Rounds a candidate must have at every size before it may dominate or be dominated.
pub const MIN_ROUNDS: usize = 8;

/// Per candidate, its figures at each size: per round the slowest rank's time, rounds where
/// a rank failed skipped. `samples` is `[size][rank][round]`.
fn figures(samples: &[Vec<Vec<Option<f64>>>]) -> Vec<(f64, f64, usize)> {
    samples
        .iter()
        .map(|at_size| {
            let figures = super::round_figures(at_size);
            let min = figures.iter().copied().fold(f64::INFINITY, f64::min);
            let max = figures.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            (min, max, figures.len())
        })
        .collect()
}

/// Which candidates go on being timed, given each candidate's samples so far
/// (`[candidate][size][rank][round]`, every candidate at the same sizes) and the margin of the
/// policy: `false` for a dominated candidate, and for every candidate once at most one is not
/// dominated (the bucket is decided).
pub fn keep_timing(candidates: &[Vec<Vec<Vec<Option<f64>>>>], margin: f64) -> Vec<bool> {
    let figures: Vec<Vec<(f64, f64, usize)>> =
        candidates.iter().map(|samples| figures(samples)).collect();
    let factor = 1.0 + 2.0 * margin;
    let dominates = |fast: &[(f64, f64, usize)], slow: &[(f64, f64, usize)]| {
        !fast.is_empty()
            && fast.len() == slow.len()
            && fast.iter().zip(slow).all(|(fast, slow)| {
                fast.2 >= MIN_ROUNDS && slow.2 >= MIN_ROUNDS && fast.1 * factor < slow.0
            })
    };
    let dominated: Vec<bool> = figures
        .iter()
        .enumerate()
        .map(|(index, slow)| {
            figures
                .iter()
                .enumerate()
                .any(|(other, fast)| other != index && dominates(fast, slow))
        })
        .collect();
    let open = dominated.iter().filter(|dominated| !**dominated).count();
    dominated
        .iter()
        .map(|dominated| !dominated && open > 1)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::{decide_bucket, BucketSamples, CandidateSamples, Policy};

    /// `rounds` samples of two ranks around `center`, spread by up to `spread` (a fraction),
    /// in a fixed pseudo-random order.
    fn rounds(center: f64, spread: f64, rounds: usize, seed: u64) -> Vec<Vec<Option<f64>>> {
        (0..2_u64)
            .map(|rank| {
                (0..rounds as u64)
                    .map(|round| {
                        let mixed = (seed * 7919 + rank * 104_729 + round * 31)
                            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                            >> 40;
                        let unit = (mixed % 1000) as f64 / 1000.0;
                        Some(center * (1.0 + spread * (unit - 0.5)))
                    })
                    .collect()
            })
            .collect()
    }

    /// A candidate's samples at two sizes with the given centers.
    fn candidate(
        centers: [f64; 2],
        spread: f64,
        count: usize,
        seed: u64,
    ) -> Vec<Vec<Vec<Option<f64>>>> {
        centers
            .iter()
            .enumerate()
            .map(|(size, &center)| rounds(center, spread, count, seed * 3 + size as u64))
            .collect()
    }

    #[test]
    fn a_candidate_far_behind_at_every_size_stops_and_then_the_bucket() {
        let keep = keep_timing(
            &[
                candidate([4.0, 20.0], 0.05, 8, 1),
                candidate([6.0, 30.0], 0.05, 8, 2),
            ],
            0.03,
        );
        assert_eq!(keep, [false, false]);
        let keep = keep_timing(
            &[
                candidate([4.0, 20.0], 0.05, 8, 1),
                candidate([6.0, 30.0], 0.05, 8, 2),
                candidate([4.1, 20.2], 0.05, 8, 3),
            ],
            0.03,
        );
        assert_eq!(keep, [true, false, true]);
    }

    #[test]
    fn close_candidates_crossing_ones_and_few_rounds_go_on() {
        // Within twice the margin.
        let close = [
            candidate([4.0, 20.0], 0.01, 8, 1),
            candidate([4.2, 21.0], 0.01, 8, 2),
        ];
        assert_eq!(keep_timing(&close, 0.03), [true, true]);
        // Each best at one size.
        let crossing = [
            candidate([4.0, 30.0], 0.01, 8, 1),
            candidate([6.0, 20.0], 0.01, 8, 2),
        ];
        assert_eq!(keep_timing(&crossing, 0.03), [true, true]);
        // Far apart, but fewer rounds than the minimum.
        let early = [
            candidate([4.0, 20.0], 0.01, MIN_ROUNDS - 1, 1),
            candidate([8.0, 40.0], 0.01, MIN_ROUNDS - 1, 2),
        ];
        assert_eq!(keep_timing(&early, 0.03), [true, true]);
        // Overlapping rounds: one slow round of the faster candidate.
        let mut overlapping = [
            candidate([4.0, 20.0], 0.01, 8, 1),
            candidate([6.0, 30.0], 0.01, 8, 2),
        ];
        overlapping[0][1][0][3] = Some(29.5);
        assert_eq!(keep_timing(&overlapping, 0.03), [true, true]);
    }

    #[test]
    fn failed_rounds_do_not_count() {
        let mut slow = candidate([6.0, 30.0], 0.01, 8, 2);
        slow[0][1][0] = None;
        let keep = keep_timing(&[candidate([4.0, 20.0], 0.01, 8, 1), slow], 0.03);
        assert_eq!(keep, [true, true], "seven valid rounds at the small size");
    }

    /// The decision on the rounds early stopping leaves equals the decision on every round,
    /// over buckets of candidates at many distances, with the default first or not.
    #[test]
    fn stopping_early_decides_as_timing_every_round() {
        let policy = Policy::default();
        let mut stopped_some = false;
        for seed in 0..300_u64 {
            let count = 2 + (seed % 4) as usize;
            let centers: Vec<[f64; 2]> = (0..count as u64)
                .map(|candidate| {
                    let step = 1.0 + ((seed * 13 + candidate * 7) % 9) as f64 * 0.04;
                    let cross = 1.0 + ((seed + candidate * 5) % 5) as f64 * 0.03;
                    [4.0 * step, 20.0 * step * cross]
                })
                .collect();
            let full: Vec<_> = centers
                .iter()
                .enumerate()
                .map(|(index, &center)| candidate(center, 0.04, 25, seed * 10 + index as u64))
                .collect();
            // Checkpoints every eight rounds, as selection runs them.
            let mut timed = vec![0_usize; count];
            let mut active = vec![true; count];
            for done in 1..=25 {
                for (rounds, &active) in timed.iter_mut().zip(&active) {
                    *rounds += usize::from(active);
                }
                if done % 8 == 0 {
                    let so_far: Vec<_> = full
                        .iter()
                        .zip(&timed)
                        .map(|(samples, &rounds)| truncated(samples, rounds))
                        .collect();
                    for (active, keep) in active.iter_mut().zip(keep_timing(&so_far, 0.03)) {
                        *active &= keep;
                    }
                }
            }
            stopped_some |= timed.iter().any(|&rounds| rounds < 25);
            let bucket = |samples: Vec<Vec<Vec<Vec<Option<f64>>>>>| BucketSamples {
                index: 0,
                default: format!("c{}", seed as usize % count),
                sizes: vec![1024, 4096],
                candidates: samples
                    .into_iter()
                    .enumerate()
                    .map(|(index, samples)| CandidateSamples {
                        profile: format!("c{index}"),
                        dropped: None,
                        exact: true,
                        samples,
                    })
                    .collect(),
            };
            let stopped: Vec<_> = full
                .iter()
                .zip(&timed)
                .map(|(samples, &rounds)| truncated(samples, rounds))
                .collect();
            let every = decide_bucket(&bucket(full), 2, &policy).expect("decides");
            let early = decide_bucket(&bucket(stopped), 2, &policy).expect("decides");
            assert_eq!(every.winner, early.winner, "seed {seed}: {centers:?}");
        }
        assert!(stopped_some, "no bucket stopped early");
    }

    fn truncated(samples: &[Vec<Vec<Option<f64>>>], rounds: usize) -> Vec<Vec<Vec<Option<f64>>>> {
        samples
            .iter()
            .map(|at_size| at_size.iter().map(|rank| rank[..rounds].to_vec()).collect())
            .collect()
    }
}
