//! The choice file: per bucket the chosen profile with the measurements and the reason behind
//! it. Every rank serialises the same value to the same bytes; the ranks agree on the sha256 of
//! those bytes (`Runtime::agree_on`) before anyone writes.

use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{BucketDecision, Policy};
use crate::files::write_atomically;
use crate::package::PackageId;

/// The choice format this tool writes and reads. 3: with the route of messages above the
/// largest bucket (`above_ladder`). 2: every candidate is timed at its bucket's smallest and
/// largest message, with figures per size and a slowdown (1: at the largest only).
pub const CHOICE_FORMAT_VERSION: u32 = 3;

/// How the choice was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Tuning {
    /// Timed on the machine.
    Runtime,
    /// Each bucket's default, nothing timed.
    Static,
}

/// A choice for every bucket of a package on one machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "prepare collective choice")]
pub struct Choice {
    /// The choice format.
    pub format_version: u32,
    /// The tool that made it.
    pub tool_version: String,
    /// The package identity (sha256 of its manifest, which records the ladder's collective
    /// and dtype, so a choice is never taken for another collective's package).
    pub package: String,
    /// The ladder's name.
    pub ladder: String,
    /// Ranks.
    pub world_size: u32,
    /// The cache key it is stored under: sha256 of every rank's fingerprint key, in rank order.
    pub fingerprint: String,
    /// Whether peer kernels were allowed, and if not why.
    pub topology: String,
    /// Runtime timing or static defaults.
    pub tuning: Tuning,
    /// The decision policy.
    pub policy: Policy,
    /// Every bucket's decision, in ladder order.
    pub buckets: Vec<BucketChoice>,
    /// How messages above the largest bucket are all-reduced.
    pub above_ladder: AboveLadder,
}

/// How messages above the largest bucket are all-reduced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AboveLadderRoute {
    /// NCCL on the whole message.
    Nccl,
    /// In consecutive pieces of the largest bucket's largest message (the last one shorter),
    /// each all-reduced by the winner of the bucket covering its size; NCCL still takes a
    /// message whose output partly overlaps its input.
    Pieces,
}

/// The route of messages above the largest bucket and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AboveLadder {
    /// The route.
    pub route: AboveLadderRoute,
    /// Why, in a sentence.
    pub reason: String,
    /// When both routes were timed: at twice the largest bucket's largest message, NCCL (the
    /// baseline) against the pieces, named by the largest bucket's winner, decided as a bucket
    /// is (its index is the number of buckets).
    pub decision: Option<BucketDecision>,
}

/// One bucket's choice. (Unknown fields are not refused here: serde cannot combine that with
/// the flattened decision.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BucketChoice {
    /// The smallest message this bucket covers, bytes.
    pub min_bytes: u64,
    /// The largest message this bucket covers, bytes.
    pub max_bytes: u64,
    /// The decision and its measurements.
    #[serde(flatten)]
    pub decision: BucketDecision,
}

impl AboveLadder {
    /// The candidate of the largest bucket that takes every whole piece, when the route is
    /// pieces.
    pub fn pieces_winner(&self) -> Option<&str> {
        match (self.route, &self.decision) {
            (AboveLadderRoute::Pieces, Some(decision)) => Some(&decision.winner),
            _ => None,
        }
    }
}

/// Why a choice could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum ChoiceError {
    /// The ranks' choices differ.
    #[error("the ranks disagree on the choice: rank {rank}'s sha256 is {theirs}, this rank's is {ours}; nothing was written")]
    Disagreement {
        /// The first rank whose digest differs.
        rank: u32,
        /// Its digest.
        theirs: String,
        /// This rank's digest.
        ours: String,
    },
    /// A file operation failed.
    #[error("{path}", path = path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A file is not a choice this tool reads.
    #[error("{path} is not a valid choice: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A choice made for another package.
    #[error(
        "{path} is a choice for package {found}, not for {package} (identity {expected}): a choice belongs to the one package it was made for"
    )]
    OtherPackage {
        /// The choice file.
        path: PathBuf,
        /// The package identity the choice names.
        found: String,
        /// The package directory.
        package: PathBuf,
        /// That package's identity.
        expected: String,
    },
}

impl Choice {
    /// Why `profile` cannot be forced onto bucket `bucket` under this choice's policy: the
    /// exact policy refuses a candidate whose output differed from the reference sum when the
    /// choice was made (its record says `exact: false`). `None` when the policy allows it, or
    /// the choice does not record the candidate.
    pub fn force_refusal(&self, bucket: usize, profile: &str) -> Option<String> {
        let decision = &self.buckets.get(bucket)?.decision;
        let candidate = decision
            .candidates
            .iter()
            .find(|candidate| candidate.profile == profile)?;
        (self.policy.exact_only && !candidate.exact).then(|| {
            format!(
                "{profile} in bucket {bucket} of {} cannot be forced: its output differs from the \
                 reference sum on these ranks, and the policy is exact (a handle started with \
                 allow_inexact can force it)",
                self.ladder
            )
        })
    }

    /// The bytes every rank writes: pretty JSON with a trailing newline.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = serde_json::to_vec_pretty(self).expect("a choice always serialises");
        bytes.push(b'\n');
        bytes
    }

    /// sha256 of [`Choice::to_bytes`].
    pub fn digest(&self) -> [u8; 32] {
        Sha256::digest(self.to_bytes()).into()
    }

    /// Reads a choice file.
    pub fn read(path: &Path) -> Result<Choice, ChoiceError> {
        let bytes = crate::files::read_limited(path, crate::files::CHOICE).map_err(|source| {
            ChoiceError::Io {
                path: path.to_path_buf(),
                source,
            }
        })?;
        Choice::from_bytes(path, &bytes)
    }

    /// Parses a choice file's bytes; `path` names it in errors.
    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Choice, ChoiceError> {
        let invalid = |message: String| ChoiceError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|error| invalid(error.to_string()))?;
        // Any number is reported as the version it claims, however large: only a missing or
        // non-numeric field is "missing".
        match value.get("format_version") {
            Some(serde_json::Value::Number(version))
                if version.as_u64() == Some(u64::from(CHOICE_FORMAT_VERSION)) => {}
            Some(serde_json::Value::Number(version)) => {
                return Err(invalid(format!(
                    "format_version {version} is not known to prepare {} (it reads {CHOICE_FORMAT_VERSION})",
                    crate::TOOL_VERSION
                )))
            }
            Some(other) => {
                return Err(invalid(format!(
                    "format_version is {other}, not a number"
                )))
            }
            None => return Err(invalid("format_version is missing".to_owned())),
        }
        serde_json::from_value(value).map_err(|error| invalid(error.to_string()))
    }

    /// Checks that the choice, read from `path`, was made for `package`: the same identity,
    /// then one entry per bucket covering the package's bucket's range.
    pub fn check_package(&self, path: &Path, package: PackageId<'_>) -> Result<(), ChoiceError> {
        if self.package != package.identity {
            return Err(ChoiceError::OtherPackage {
                path: path.to_path_buf(),
                found: self.package.clone(),
                package: package.dir.to_path_buf(),
                expected: package.identity.to_owned(),
            });
        }
        let invalid = |message: String| ChoiceError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        let buckets = package.buckets;
        if self.buckets.len() != buckets.len() {
            return Err(invalid(format!(
                "/buckets: {} buckets, but its package has {}",
                self.buckets.len(),
                buckets.len()
            )));
        }
        for (position, (ours, theirs)) in self.buckets.iter().zip(buckets).enumerate() {
            if (ours.decision.index, ours.min_bytes, ours.max_bytes)
                != (theirs.index, theirs.min_bytes, theirs.max_bytes)
            {
                return Err(invalid(format!(
                    "/buckets/{position}: bucket {} covers {}-{} bytes, but its package's bucket {} covers {}-{}",
                    ours.decision.index,
                    ours.min_bytes,
                    ours.max_bytes,
                    theirs.index,
                    theirs.min_bytes,
                    theirs.max_bytes
                )));
            }
            let winner = &ours.decision.winner;
            if !theirs
                .candidates
                .iter()
                .any(|candidate| &candidate.profile == winner)
            {
                let candidates: Vec<&str> = theirs
                    .candidates
                    .iter()
                    .map(|candidate| candidate.profile.as_str())
                    .collect();
                return Err(invalid(format!(
                    "/buckets/{position}/decision/winner: `{winner}` is not one of bucket {}'s \
                     candidates ({})",
                    theirs.index,
                    candidates.join(", ")
                )));
            }
        }
        Ok(())
    }
}

/// Writes `DIR/choice.rank<r>.json` atomically.
pub fn write_choice(dir: &Path, rank: u32, choice: &Choice) -> Result<PathBuf, ChoiceError> {
    let path = dir.join(format!("choice.rank{rank}.json"));
    let io = |source| ChoiceError::Io {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    write_atomically(&path, &choice.to_bytes()).map_err(io)?;
    Ok(path)
}
