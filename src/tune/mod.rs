//! Startup selection. This module holds the decision: one pure function from the gathered
//! timing matrix (rank x bucket x candidate x round) to each bucket's winner. Every rank runs it
//! on the same matrix, so every rank decides the same; the result depends on neither the order
//! of ranks nor the order of rounds.

pub mod choice;
mod mann_whitney;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use mann_whitney::p_value_less;

/// How the winner is picked.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// A candidate replaces the baseline only when its median is lower by more than this
    /// fraction of the baseline's (0.03 is 3%).
    pub margin: f64,
    /// Keep candidates whose output did not equal the reference (NCCL beyond two ranks) out.
    pub exact_only: bool,
    /// The Mann-Whitney U test over rounds must give a p-value below this.
    pub significance: f64,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            margin: 0.03,
            exact_only: false,
            significance: 0.01,
        }
    }
}

/// One candidate's measurements in one bucket, gathered from every rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CandidateSamples {
    /// The profile id.
    pub profile: String,
    /// Why it was dropped before timing (residency, capture, exactness, peer access).
    pub dropped: Option<String>,
    /// Whether its output equalled the reference on every rank.
    pub exact: bool,
    /// Microseconds per operation, `[rank][round]`; `None` for a failed sample.
    pub samples: Vec<Vec<Option<f64>>>,
}

/// One bucket's measurements: its candidates in the ladder's order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BucketSamples {
    /// The bucket's index in the ladder.
    pub index: usize,
    /// The bucket's default profile.
    pub default: String,
    /// Candidates in the bucket's order (the tie-break order).
    pub candidates: Vec<CandidateSamples>,
}

/// What happened to one candidate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum CandidateOutcome {
    /// Timed: per round the slowest rank counts; figures over rounds.
    Timed {
        /// Median over rounds, microseconds per operation.
        median_us: f64,
        /// Fastest round.
        min_us: f64,
        /// Slowest round.
        max_us: f64,
        /// Rounds in which every rank gave a valid sample.
        rounds: usize,
    },
    /// Not timed, with the reason.
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

/// Why the winner won.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum DecisionReason {
    /// The baseline had the best median.
    BaselineFastest,
    /// The fastest candidate was faster, but not by more than the margin.
    WithinMargin {
        /// The fastest candidate.
        fastest: String,
        /// Its median over the baseline's.
        ratio: f64,
    },
    /// The fastest candidate was faster by more than the margin, but not significantly.
    NotSignificant {
        /// The fastest candidate.
        fastest: String,
        /// Its median over the baseline's.
        ratio: f64,
        /// The one-sided Mann-Whitney p-value.
        p_value: f64,
    },
    /// The winner beat the baseline by more than the margin, significantly.
    Faster {
        /// Its median over the baseline's.
        ratio: f64,
        /// The one-sided Mann-Whitney p-value.
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

struct Timed {
    position: usize,
    figures: Vec<f64>,
    median: f64,
}

/// Decides one bucket from every rank's samples.
pub fn decide_bucket(
    bucket: &BucketSamples,
    world_size: usize,
    policy: &Policy,
) -> Result<BucketDecision, DecisionError> {
    let mut results = Vec::with_capacity(bucket.candidates.len());
    let mut timed: Vec<Timed> = Vec::new();
    for (position, candidate) in bucket.candidates.iter().enumerate() {
        let excluded = |reason: String| CandidateResult {
            profile: candidate.profile.clone(),
            exact: candidate.exact,
            outcome: CandidateOutcome::Excluded { reason },
        };
        if let Some(reason) = &candidate.dropped {
            results.push(excluded(reason.clone()));
            continue;
        }
        if policy.exact_only && !candidate.exact {
            results.push(excluded(
                "its output differs from the reference sum and exact-only is set".to_owned(),
            ));
            continue;
        }
        if candidate.samples.len() != world_size {
            return Err(DecisionError::RankCount {
                bucket: bucket.index,
                profile: candidate.profile.clone(),
                found: candidate.samples.len(),
                expected: world_size,
            });
        }
        let mut figures = round_figures(&candidate.samples);
        if figures.is_empty() {
            results.push(excluded(
                "no round had a valid sample from every rank".to_owned(),
            ));
            continue;
        }
        figures.sort_by(f64::total_cmp);
        let median = median(&figures);
        results.push(CandidateResult {
            profile: candidate.profile.clone(),
            exact: candidate.exact,
            outcome: CandidateOutcome::Timed {
                median_us: median,
                min_us: figures[0],
                max_us: figures[figures.len() - 1],
                rounds: figures.len(),
            },
        });
        timed.push(Timed {
            position,
            figures,
            median,
        });
    }

    let Some(first) = timed.first() else {
        let reasons = results
            .iter()
            .map(|result| match &result.outcome {
                CandidateOutcome::Excluded { reason } => format!("{}: {reason}", result.profile),
                CandidateOutcome::Timed { .. } => result.profile.clone(),
            })
            .collect::<Vec<_>>()
            .join("; ");
        return Err(DecisionError::NothingTimed {
            bucket: bucket.index,
            reasons,
        });
    };
    let baseline = timed
        .iter()
        .find(|entry| bucket.candidates[entry.position].profile == bucket.default)
        .unwrap_or(first);
    // Strictly lower medians win, so equal figures go to the earlier candidate.
    let fastest = timed.iter().fold(first, |best, entry| {
        if entry.median < best.median {
            entry
        } else {
            best
        }
    });

    let name = |entry: &Timed| bucket.candidates[entry.position].profile.clone();
    let ratio = fastest.median / baseline.median;
    let (winner, reason) =
        if fastest.position == baseline.position || fastest.median >= baseline.median {
            (baseline, DecisionReason::BaselineFastest)
        } else if fastest.median >= baseline.median * (1.0 - policy.margin) {
            (
                baseline,
                DecisionReason::WithinMargin {
                    fastest: name(fastest),
                    ratio,
                },
            )
        } else {
            let p_value = p_value_less(&fastest.figures, &baseline.figures).unwrap_or(1.0);
            if p_value < policy.significance {
                (fastest, DecisionReason::Faster { ratio, p_value })
            } else {
                (
                    baseline,
                    DecisionReason::NotSignificant {
                        fastest: name(fastest),
                        ratio,
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
