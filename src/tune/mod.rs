//! Startup selection. This module holds the decision: one pure function from the gathered
//! timing matrix (rank x bucket x size x candidate x round) to each bucket's winner. Every rank
//! runs it on the same matrix, so every rank decides the same; the result depends on neither
//! the order of ranks nor the order of rounds.
//!
//! A bucket's candidates are timed at its smallest and its largest message (once when the two
//! are equal), because the best candidate can change inside a bucket. Per bucket:
//!
//! 1. per candidate and size, per round the slowest rank's time counts (the ranks wait for it;
//!    rounds where any rank failed are skipped), and the candidate's figure at that size is the
//!    median over rounds. A candidate without one valid round at some size is excluded;
//! 2. `best[s]` is the lowest median at size `s` over the timed candidates, and a candidate's
//!    **slowdown** `R = max over s of median[s] / best[s]`: how much slower than the best
//!    candidate it is at its worst size (1 when it is the best at every size);
//! 3. the **fastest** candidate is the one with the lowest slowdown; equal slowdowns go to the
//!    earlier candidate in the bucket's order;
//! 4. the **baseline** is the bucket's default if it was timed, else its first timed candidate;
//! 5. `ratio = R_fastest / R_baseline`. The baseline stays if it is the fastest or the ratio is
//!    at least 1 ([`DecisionReason::BaselineFastest`]), or if the ratio is at least
//!    `1 - margin` ([`DecisionReason::WithinMargin`]). Otherwise the fastest replaces it only if
//!    the one-sided Mann-Whitney U test of the fastest's round figures against the baseline's,
//!    at the size where the baseline's slowdown is largest (the larger size on ties), gives a
//!    p-value below the significance ([`DecisionReason::Faster`]); if not, the baseline stays
//!    ([`DecisionReason::NotSignificant`]). At that size the fastest's median is below the
//!    baseline's by at least the ratio, so the test compares where the replacement gains most.
//!
//! With one size this is the rule of one median per candidate: the fastest candidate is the
//! one with the lowest median, and the ratio is its median over the baseline's.
//!
//! What the rule gives: at every size timed, the winner is slower than the best candidate
//! there by at most its slowdown; and unless the fastest's gain was not significant, the
//! winner's slowdown is at most the fastest's over `1 - margin`. So where one candidate is the
//! best at both edges, the winner is within the margin of the best at both.

pub mod choice;
pub mod early_stop;
mod mann_whitney;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use mann_whitney::p_value_less;

/// How the winner is picked.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// A candidate replaces the baseline only when its slowdown (its worst median over the best
    /// candidate's median at a size timed) is lower than the baseline's by more than this
    /// fraction (0.03 is 3%). With one size timed: when its median is lower than the
    /// baseline's by more than this fraction of the baseline's.
    pub margin: f64,
    /// Keep candidates whose output did not equal the reference (plain NCCL beyond two ranks)
    /// out: true by default; the serving options' and the commands' `allow_inexact` make it
    /// false.
    pub exact_only: bool,
    /// The Mann-Whitney U test over rounds, at the size where the baseline's slowdown is
    /// largest, must give a p-value below this.
    pub significance: f64,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            margin: 0.03,
            exact_only: true,
            significance: 0.01,
        }
    }
}

/// Why the exact policy keeps a candidate out, as a choice records it.
pub const INEXACT_EXCLUDED: &str =
    "its output differs from the reference sum, which the exact policy keeps out";

/// One candidate's measurements in one bucket, gathered from every rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CandidateSamples {
    /// The profile id.
    pub profile: String,
    /// Why it was dropped before timing (residency, capture, exactness, peer access).
    pub dropped: Option<String>,
    /// Whether its output equalled the reference on every rank.
    pub exact: bool,
    /// Microseconds per operation, `[size][rank][round]`: one entry per size of
    /// [`BucketSamples::sizes`], in that order; `None` for a failed sample. Empty when dropped.
    pub samples: Vec<Vec<Vec<Option<f64>>>>,
}

/// One bucket's measurements: its candidates in the ladder's order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BucketSamples {
    /// The bucket's index in the ladder.
    pub index: usize,
    /// The bucket's default profile.
    pub default: String,
    /// The message sizes every candidate was timed at, bytes, strictly ascending: the bucket's
    /// smallest and largest message, or the one size when they are equal.
    pub sizes: Vec<u64>,
    /// Candidates in the bucket's order (the tie-break order).
    pub candidates: Vec<CandidateSamples>,
}

/// A timed candidate's figures at one message size: per round the slowest rank counts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SizeFigures {
    /// The message size, bytes.
    pub bytes: u64,
    /// Median over rounds, microseconds per operation.
    pub median_us: f64,
    /// Fastest round.
    pub min_us: f64,
    /// Slowest round.
    pub max_us: f64,
    /// Rounds in which every rank gave a valid sample.
    pub rounds: usize,
}

/// What happened to one candidate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum CandidateOutcome {
    /// Timed at every size of its bucket.
    Timed {
        /// Its slowdown: the largest, over the sizes timed, of its median over the lowest
        /// median of the bucket's timed candidates at that size; 1 when it has the lowest
        /// median at every size.
        #[schemars(range(min = 1.0))]
        slowdown: f64,
        /// Its figures at each size timed, smallest first.
        #[schemars(length(min = 1))]
        sizes: Vec<SizeFigures>,
    },
    /// Not timed, or without a valid round at some size, with the reason.
    Excluded {
        /// Why.
        reason: String,
    },
}

/// One candidate in a bucket's decision. (Unknown fields are not refused here: serde cannot
/// combine that with the flattened outcome.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CandidateResult {
    /// The profile id.
    pub profile: String,
    /// Whether its output equalled the reference on every rank.
    pub exact: bool,
    /// Its figures or why it was not timed.
    #[serde(flatten)]
    pub outcome: CandidateOutcome,
}

/// Why the winner won. A `ratio` is the fastest candidate's slowdown over the baseline's (with
/// one size timed: its median over the baseline's); below 1 the fastest is faster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum DecisionReason {
    /// The baseline had the lowest slowdown (with one size timed: the lowest median), or no
    /// candidate had a lower one.
    BaselineFastest,
    /// The fastest candidate was faster, but not by more than the margin.
    WithinMargin {
        /// The fastest candidate.
        fastest: String,
        /// Its slowdown over the baseline's; at least 1 - margin.
        ratio: f64,
    },
    /// The fastest candidate was faster by more than the margin, but not significantly.
    NotSignificant {
        /// The fastest candidate.
        fastest: String,
        /// Its slowdown over the baseline's; below 1 - margin.
        ratio: f64,
        /// The message size the test compared at, bytes: where the baseline's slowdown is
        /// largest (the larger size on ties).
        tested_bytes: u64,
        /// The one-sided Mann-Whitney p-value there; at least the significance.
        p_value: f64,
    },
    /// The winner beat the baseline by more than the margin, significantly.
    Faster {
        /// Its slowdown over the baseline's; below 1 - margin.
        ratio: f64,
        /// The message size the test compared at, bytes: where the baseline's slowdown is
        /// largest (the larger size on ties).
        tested_bytes: u64,
        /// The one-sided Mann-Whitney p-value there; below the significance.
        p_value: f64,
    },
}

/// One bucket's decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BucketDecision {
    /// The bucket's index in the ladder.
    pub index: usize,
    /// The chosen profile.
    pub winner: String,
    /// The candidate the winner had to beat: the default if it survived, else the first
    /// surviving candidate.
    pub baseline: String,
    /// Why the winner won.
    pub reason: DecisionReason,
    /// Whether the winner's output equals the reference sum byte for byte.
    pub bit_exact: bool,
    /// Every candidate, in the bucket's order.
    pub candidates: Vec<CandidateResult>,
}

/// Why no decision could be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecisionError {
    /// Every candidate of a bucket was excluded.
    #[error("bucket {bucket}: no candidate could be timed ({reasons})")]
    NothingTimed {
        /// The bucket index.
        bucket: usize,
        /// Each candidate's reason, joined.
        reasons: String,
    },
    /// Every candidate of a bucket was excluded, some because the exact policy keeps
    /// candidates whose output differs from the reference sum out.
    #[error(
        "bucket {bucket}: no exact candidate could be timed ({reasons}); allowing inexact \
         candidates would serve it with one whose output differs from the reference sum"
    )]
    NothingExact {
        /// The bucket index.
        bucket: usize,
        /// Each candidate's reason, joined.
        reasons: String,
    },
    /// The matrix does not have one row per rank.
    #[error("bucket {bucket}, profile {profile}: samples from {found} ranks, expected {expected}")]
    RankCount {
        /// The bucket index.
        bucket: usize,
        /// The profile.
        profile: String,
        /// Rows found.
        found: usize,
        /// The world size.
        expected: usize,
    },
    /// The sizes timed are not one or more, strictly ascending.
    #[error(
        "bucket {bucket}: the sizes timed must be one or more, strictly ascending, not {sizes:?}"
    )]
    Sizes {
        /// The bucket index.
        bucket: usize,
        /// The sizes given, bytes.
        sizes: Vec<u64>,
    },
    /// A candidate's samples do not have one entry per size timed.
    #[error("bucket {bucket}, profile {profile}: samples at {found} sizes, expected {expected}")]
    SizeCount {
        /// The bucket index.
        bucket: usize,
        /// The profile.
        profile: String,
        /// Entries found.
        found: usize,
        /// The sizes timed.
        expected: usize,
    },
}

fn valid(sample: Option<f64>) -> Option<f64> {
    sample.filter(|value| value.is_finite() && *value > 0.0)
}

/// Per round, the slowest rank's time; rounds where any rank failed are skipped.
fn round_figures(samples: &[Vec<Option<f64>>]) -> Vec<f64> {
    let rounds = samples.iter().map(Vec::len).max().unwrap_or(0);
    (0..rounds)
        .filter_map(|round| {
            samples.iter().try_fold(f64::NEG_INFINITY, |slowest, rank| {
                valid(rank.get(round).copied().flatten()).map(|value| slowest.max(value))
            })
        })
        .collect()
}

fn median(sorted: &[f64]) -> f64 {
    let middle = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[middle]
    } else {
        f64::midpoint(sorted[middle - 1], sorted[middle])
    }
}

/// `2 bytes`, `2 and 16384 bytes`, `2, 8 and 16384 bytes`.
fn sizes_text(sizes: &[u64]) -> String {
    match sizes {
        [] => String::new(),
        [one] => format!("{one} bytes"),
        [rest @ .., last] => format!(
            "{} and {last} bytes",
            rest.iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// A candidate's round figures at one size, sorted, and their median.
struct SizeTimed {
    figures: Vec<f64>,
    median: f64,
}

struct Timed {
    position: usize,
    sizes: Vec<SizeTimed>,
    slowdown: f64,
}

/// The error of a bucket whose every candidate was excluded: [`DecisionError::NothingExact`]
/// when the exact policy kept one out, else [`DecisionError::NothingTimed`].
pub fn nothing_timed(bucket: usize, results: &[CandidateResult], policy: &Policy) -> DecisionError {
    let reasons = results
        .iter()
        .map(|result| match &result.outcome {
            CandidateOutcome::Excluded { reason } => format!("{}: {reason}", result.profile),
            CandidateOutcome::Timed { .. } => result.profile.clone(),
        })
        .collect::<Vec<_>>()
        .join("; ");
    let kept_out = |result: &CandidateResult| matches!(&result.outcome, CandidateOutcome::Excluded { reason } if reason == INEXACT_EXCLUDED);
    if policy.exact_only && results.iter().any(kept_out) {
        DecisionError::NothingExact { bucket, reasons }
    } else {
        DecisionError::NothingTimed { bucket, reasons }
    }
}

/// Decides one bucket from every rank's samples (the rule is in the module's documentation).
pub fn decide_bucket(
    bucket: &BucketSamples,
    world_size: usize,
    policy: &Policy,
) -> Result<BucketDecision, DecisionError> {
    let sizes = &bucket.sizes;
    if sizes.is_empty() || sizes.windows(2).any(|pair| pair[0] >= pair[1]) {
        return Err(DecisionError::Sizes {
            bucket: bucket.index,
            sizes: sizes.clone(),
        });
    }
    // Every candidate's figures or why it is excluded; slowdowns need every candidate's medians.
    let mut excluded: Vec<Option<String>> = Vec::with_capacity(bucket.candidates.len());
    let mut timed: Vec<Timed> = Vec::new();
    for (position, candidate) in bucket.candidates.iter().enumerate() {
        if let Some(reason) = &candidate.dropped {
            excluded.push(Some(reason.clone()));
            continue;
        }
        if policy.exact_only && !candidate.exact {
            excluded.push(Some(INEXACT_EXCLUDED.to_owned()));
            continue;
        }
        if candidate.samples.len() != sizes.len() {
            return Err(DecisionError::SizeCount {
                bucket: bucket.index,
                profile: candidate.profile.clone(),
                found: candidate.samples.len(),
                expected: sizes.len(),
            });
        }
        if let Some(at_size) = candidate
            .samples
            .iter()
            .find(|at_size| at_size.len() != world_size)
        {
            return Err(DecisionError::RankCount {
                bucket: bucket.index,
                profile: candidate.profile.clone(),
                found: at_size.len(),
                expected: world_size,
            });
        }
        let figures: Vec<Vec<f64>> = candidate
            .samples
            .iter()
            .map(|at_size| {
                let mut figures = round_figures(at_size);
                figures.sort_by(f64::total_cmp);
                figures
            })
            .collect();
        let failed: Vec<u64> = sizes
            .iter()
            .zip(&figures)
            .filter(|(_, figures)| figures.is_empty())
            .map(|(&bytes, _)| bytes)
            .collect();
        if !failed.is_empty() {
            excluded.push(Some(format!(
                "no round had a valid sample from every rank at {}",
                sizes_text(&failed)
            )));
            continue;
        }
        excluded.push(None);
        timed.push(Timed {
            position,
            sizes: figures
                .into_iter()
                .map(|figures| SizeTimed {
                    median: median(&figures),
                    figures,
                })
                .collect(),
            slowdown: 1.0,
        });
    }

    // The lowest median at each size, then every timed candidate's slowdown.
    let best: Vec<f64> = (0..sizes.len())
        .map(|size| {
            timed
                .iter()
                .map(|entry| entry.sizes[size].median)
                .fold(f64::INFINITY, f64::min)
        })
        .collect();
    for entry in &mut timed {
        entry.slowdown = entry
            .sizes
            .iter()
            .zip(&best)
            .map(|(at_size, best)| at_size.median / best)
            .fold(1.0, f64::max);
    }

    let mut timed_entries = timed.iter();
    let results: Vec<CandidateResult> = bucket
        .candidates
        .iter()
        .zip(excluded)
        .map(|(candidate, reason)| CandidateResult {
            profile: candidate.profile.clone(),
            exact: candidate.exact,
            outcome: if let Some(reason) = reason {
                CandidateOutcome::Excluded { reason }
            } else {
                let entry = timed_entries
                    .next()
                    .expect("one timed entry per candidate not excluded");
                CandidateOutcome::Timed {
                    slowdown: entry.slowdown,
                    sizes: sizes
                        .iter()
                        .zip(&entry.sizes)
                        .map(|(&bytes, at_size)| SizeFigures {
                            bytes,
                            median_us: at_size.median,
                            min_us: at_size.figures[0],
                            max_us: at_size.figures[at_size.figures.len() - 1],
                            rounds: at_size.figures.len(),
                        })
                        .collect(),
                }
            },
        })
        .collect();

    let Some(first) = timed.first() else {
        return Err(nothing_timed(bucket.index, &results, policy));
    };
    let baseline = timed
        .iter()
        .find(|entry| bucket.candidates[entry.position].profile == bucket.default)
        .unwrap_or(first);
    // Strictly lower slowdowns win, so equal figures go to the earlier candidate.
    let fastest = timed.iter().fold(first, |best, entry| {
        if entry.slowdown < best.slowdown {
            entry
        } else {
            best
        }
    });
    // The size where the baseline's slowdown is largest, the larger on ties.
    let worst = (0..sizes.len()).rev().fold(sizes.len() - 1, |worst, size| {
        if baseline.sizes[size].median / best[size] > baseline.sizes[worst].median / best[worst] {
            size
        } else {
            worst
        }
    });
    let (best_there, baseline_there) = (best[worst], baseline.sizes[worst].median);

    let name = |entry: &Timed| bucket.candidates[entry.position].profile.clone();
    // R_fastest / R_baseline, with R_baseline = baseline_there / best_there. Written this way,
    // with one size (R_fastest then 1) it is exactly the fastest's median over the baseline's,
    // and the margin test below is exactly `fastest median >= baseline median x (1 - margin)`.
    let ratio = fastest.slowdown * best_there / baseline_there;
    let (winner, reason) =
        if fastest.position == baseline.position || fastest.slowdown >= baseline.slowdown {
            (baseline, DecisionReason::BaselineFastest)
        } else if fastest.slowdown * best_there >= baseline_there * (1.0 - policy.margin) {
            (
                baseline,
                DecisionReason::WithinMargin {
                    fastest: name(fastest),
                    ratio,
                },
            )
        } else {
            let p_value = p_value_less(
                &fastest.sizes[worst].figures,
                &baseline.sizes[worst].figures,
            )
            .unwrap_or(1.0);
            let tested_bytes = sizes[worst];
            if p_value < policy.significance {
                (
                    fastest,
                    DecisionReason::Faster {
                        ratio,
                        tested_bytes,
                        p_value,
                    },
                )
            } else {
                (
                    baseline,
                    DecisionReason::NotSignificant {
                        fastest: name(fastest),
                        ratio,
                        tested_bytes,
                        p_value,
                    },
                )
            }
        };
    Ok(BucketDecision {
        index: bucket.index,
        winner: name(winner),
        baseline: name(baseline),
        reason,
        bit_exact: bucket.candidates[winner.position].exact,
        candidates: results,
    })
}

/// Decides one bucket under static tuning, where nothing is timed: its default if it runs here
/// and the policy keeps it, else its first candidate that does (in the bucket's order). Under
/// the exact policy a candidate whose output differs from the reference sum is kept out; a
/// bucket with no candidate left is [`DecisionError::NothingExact`] when the policy kept one
/// out, else [`DecisionError::NothingTimed`]. `bucket.candidates` carry why each was dropped
/// and whether it is exact; their samples are not read.
pub fn decide_static(
    bucket: &BucketSamples,
    policy: &Policy,
) -> Result<BucketDecision, DecisionError> {
    let kept = |candidate: &CandidateSamples| {
        candidate.dropped.is_none() && (candidate.exact || !policy.exact_only)
    };
    let results: Vec<CandidateResult> = bucket
        .candidates
        .iter()
        .map(|candidate| CandidateResult {
            profile: candidate.profile.clone(),
            exact: candidate.exact,
            outcome: CandidateOutcome::Excluded {
                reason: match &candidate.dropped {
                    Some(reason) => reason.clone(),
                    None if !kept(candidate) => INEXACT_EXCLUDED.to_owned(),
                    None => "not timed (static tuning)".to_owned(),
                },
            },
        })
        .collect();
    let winner = bucket
        .candidates
        .iter()
        .find(|candidate| candidate.profile == bucket.default && kept(candidate))
        .or_else(|| bucket.candidates.iter().find(|candidate| kept(candidate)))
        .ok_or_else(|| nothing_timed(bucket.index, &results, policy))?;
    Ok(BucketDecision {
        index: bucket.index,
        winner: winner.profile.clone(),
        baseline: winner.profile.clone(),
        reason: DecisionReason::BaselineFastest,
        bit_exact: winner.exact,
        candidates: results,
    })
}

/// Decides every bucket.
pub fn decide(
    buckets: &[BucketSamples],
    world_size: usize,
    policy: &Policy,
) -> Result<Vec<BucketDecision>, DecisionError> {
    buckets
        .iter()
        .map(|bucket| decide_bucket(bucket, world_size, policy))
        .collect()
}
