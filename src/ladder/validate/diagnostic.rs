//! What validation reports: the rules it checks, the stages they belong to, and one problem
//! as a diagnostic; with the text helpers every stage phrases its diagnostics with.

use std::fmt;

use serde::{Serialize, Serializer};
use serde_json::Value;

/// Defines [`Rule`]: one line per rule, its stable name and the stage that checks it.
macro_rules! rules {
    ($($(#[doc = $doc:literal])* $variant:ident => $name:literal, $stage:ident;)+) => {
        /// A check that validation makes. Its [`name`](Rule::name) is stable: tests, scripts
        /// and fixture files use it.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Rule {
            $($(#[doc = $doc])* $variant,)+
        }

        impl Rule {
            /// Every rule, in pipeline order.
            pub const ALL: &'static [Rule] = &[$(Rule::$variant,)+];

            /// The stable snake_case name (`cluster_size_without_512_threads`).
            pub fn name(self) -> &'static str {
                match self {
                    $(Rule::$variant => $name,)+
                }
            }

            /// The stage that checks this rule.
            pub fn stage(self) -> Stage {
                match self {
                    $(Rule::$variant => Stage::$stage,)+
                }
            }
        }
    };
}

rules! {
    /// The text is not JSON (or not UTF-8).
    JsonSyntax => "json_syntax", Syntax;
    /// An object has the same key twice; JSON parsers silently keep one of them.
    DuplicateKey => "duplicate_key", Syntax;
    /// `format_version` names a format this tool does not read.
    UnknownFormatVersion => "unknown_format_version", FormatVersion;
    /// A field the format does not have (often a typo).
    UnknownField => "unknown_field", Schema;
    /// A required field is absent.
    MissingField => "missing_field", Schema;
    /// A value of the wrong JSON type.
    WrongType => "wrong_type", Schema;
    /// A string that is not one of the allowed names (an algorithm, an architecture).
    UnknownValue => "unknown_value", Schema;
    /// A number below zero where only whole non-negative numbers fit.
    NumberOutOfRange => "number_out_of_range", Schema;
    /// Any other schema violation.
    SchemaViolation => "schema_violation", Schema;
    /// A number the schema allows but the types cannot hold: a whole number written with a
    /// fraction or exponent (`2.0`, `1e3`), or one too large for its field.
    UnrepresentableValue => "unrepresentable_value", Parse;
    /// `name` is empty.
    EmptyName => "empty_name", Rules;
    /// `ordinary_ladder` is present but empty.
    EmptyOrdinaryLadder => "empty_ordinary_ladder", Rules;
    /// `world_size` is not 2 to 8.
    WorldSizeOutOfRange => "world_size_out_of_range", Rules;
    /// `targets` is empty.
    EmptyTargets => "empty_targets", Rules;
    /// An architecture is listed twice in `targets`.
    DuplicateTarget => "duplicate_target", Rules;
    /// The ladder has clustered buckets and a target that cannot launch clusters.
    ClustersUnsupportedByTarget => "clusters_unsupported_by_target", Rules;
    /// A profile `id` is empty.
    EmptyProfileId => "empty_profile_id", Rules;
    /// Two profiles share an `id`.
    DuplicateProfileId => "duplicate_profile_id", Rules;
    /// `transfer` on a profile that is not one-shot or RSAG, or that has a schedule.
    TransferNotApplicable => "transfer_not_applicable", Rules;
    /// `"transfer": "copy_engine"` on a profile that is not one-shot.
    CopyEngineNotOneShot => "copy_engine_not_one_shot", Rules;
    /// `protocol` on a profile that is not one-shot or RSAG, `ll`/`simple` on one that is not
    /// push, or `barrier`/`ll` on an RSAG.
    ProtocolNotApplicable => "protocol_not_applicable", Rules;
    /// `schedule: phased` on a profile that is not RSAG or full.
    ScheduleNotApplicable => "schedule_not_applicable", Rules;
    /// A `full` profile without `schedule: phased`.
    FullWithoutPhased => "full_without_phased", Rules;
    /// A phased profile without `active_clusters`.
    MissingActiveClusters => "missing_active_clusters", Rules;
    /// `active_clusters` other than 1.
    ActiveClustersNot1 => "active_clusters_not_1", Rules;
    /// `active_clusters` on a profile that is not phased.
    ActiveClustersWithoutPhased => "active_clusters_without_phased", Rules;
    /// `max_ctas` or `min_ctas` on a profile that is not NCCL.
    CtasWithoutNccl => "ctas_without_nccl", Rules;
    /// `max_ctas` or `min_ctas` outside 1 to 64.
    CtasOutOfRange => "ctas_out_of_range", Rules;
    /// `min_ctas` above `max_ctas`.
    MinCtasAboveMaxCtas => "min_ctas_above_max_ctas", Rules;
    /// `window` on a profile that is not NCCL.
    WindowWithoutNccl => "window_without_nccl", Rules;
    /// `order` on a profile that is not NCCL.
    OrderWithoutNccl => "order_without_nccl", Rules;
    /// `order` on an NCCL profile with `window`, `max_ctas` or `min_ctas`.
    OrderWithCommunicatorSettings => "order_with_communicator_settings", Rules;
    /// A reduce-scatter or all-gather profile of an algorithm only the all-reduce has (`rsag`,
    /// `full`).
    AlgorithmNotForCollective => "algorithm_not_for_collective", Rules;
    /// `schedule` on a reduce-scatter or all-gather profile: they have no phased kernels.
    ScheduleNotForCollective => "schedule_not_for_collective", Rules;
    /// `simple` on a reduce-scatter or all-gather profile.
    ProtocolNotForCollective => "protocol_not_for_collective", Rules;
    /// `"transfer": "copy_engine"` on a reduce-scatter or all-gather profile.
    CopyEngineNotForCollective => "copy_engine_not_for_collective", Rules;
    /// `window` on a reduce-scatter, all-gather or all-reduce + RMSNorm NCCL profile.
    WindowNotForCollective => "window_not_for_collective", Rules;
    /// `order` on an all-gather NCCL profile: an all-gather sums nothing.
    OrderNotForCollective => "order_not_for_collective", Rules;
    /// `epilogue` on a profile of a ladder whose collective is not `all_reduce_add_rms_norm`.
    EpilogueNotForCollective => "epilogue_not_for_collective", Rules;
    /// `epilogue` on an NCCL profile: NCCL's all-reduce is always followed by the separate
    /// epilogue, so the field says nothing.
    EpilogueOnNccl => "epilogue_on_nccl", Rules;
    /// A custom profile of an `all_reduce_add_rms_norm` ladder that is no fused kernel's shape
    /// and has no `"epilogue": "separate"`.
    NeitherFusedNorSeparate => "neither_fused_nor_separate", Rules;
    /// `blocks` on an NCCL or phased profile.
    BlocksNotApplicable => "blocks_not_applicable", Rules;
    /// A profile's `blocks` outside 1 to 1024.
    ProfileBlocksOutOfRange => "profile_blocks_out_of_range", Rules;
    /// `buckets` is empty.
    EmptyBuckets => "empty_buckets", Rules;
    /// `max_bytes` is not a positive multiple of 16 x `world_size`.
    MaxBytesNotAligned => "max_bytes_not_aligned", Rules;
    /// `max_bytes` above the largest message a bucket may cover.
    MaxBytesTooLarge => "max_bytes_too_large", Rules;
    /// `max_bytes` not above the previous bucket's.
    BucketsNotIncreasing => "buckets_not_increasing", Rules;
    /// `threads` is not a multiple of 32 from 32 to 1024.
    ThreadsOutOfRange => "threads_out_of_range", Rules;
    /// A bucket's `blocks` outside 1 to 1024.
    BlocksOutOfRange => "blocks_out_of_range", Rules;
    /// `cluster_size` other than 8.
    ClusterSizeNot8 => "cluster_size_not_8", Rules;
    /// A clustered bucket whose `threads` is not 512.
    ClusterSizeWithout512Threads => "cluster_size_without_512_threads", Rules;
    /// A clustered bucket whose `blocks` is not 64.
    ClusterSizeWithout64Blocks => "cluster_size_without_64_blocks", Rules;
    /// `cluster_size` on a bucket of a reduce-scatter or all-gather ladder: they have no cluster
    /// kernels.
    ClusteredBucketNotForCollective => "clustered_bucket_not_for_collective", Rules;
    /// A candidate that names no profile.
    UnknownCandidate => "unknown_candidate", Rules;
    /// A profile listed twice among a bucket's candidates.
    DuplicateCandidate => "duplicate_candidate", Rules;
    /// A phased profile among the candidates of a bucket without `cluster_size`.
    PhasedProfileInUnclusteredBucket => "phased_profile_in_unclustered_bucket", Rules;
    /// A profile with its own `blocks` among the candidates of a clustered bucket.
    BlocksOverrideInClusteredBucket => "blocks_override_in_clustered_bucket", Rules;
    /// `default` is not one of the bucket's candidates.
    DefaultNotCandidate => "default_not_candidate", Rules;
    /// A bucket without an NCCL candidate.
    NoNcclCandidate => "no_nccl_candidate", Rules;
    /// A bucket whose default is plain NCCL where NCCL's own order is not the reference's (an
    /// all-reduce or reduce-scatter of more than two ranks).
    PlainNcclDefault => "plain_nccl_default", Rules;
}

impl Rule {
    /// The rule with this stable name.
    pub fn from_name(name: &str) -> Option<Rule> {
        Rule::ALL.iter().copied().find(|rule| rule.name() == name)
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.name())
    }
}

impl Serialize for Rule {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

/// The stages of validation, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// The text is UTF-8 JSON with no key twice in one object.
    Syntax,
    /// `format_version`, read before anything else, is one this tool reads.
    FormatVersion,
    /// The raw value matches the ladder's JSON Schema.
    Schema,
    /// The value fits the Rust types.
    Parse,
    /// The semantic rules hold.
    Rules,
}

impl fmt::Display for Stage {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(match self {
            Stage::Syntax => "JSON syntax",
            Stage::FormatVersion => "format version",
            Stage::Schema => "schema",
            Stage::Parse => "typed parsing",
            Stage::Rules => "rules",
        })
    }
}

/// One problem: which rule, where, what was found and what would be valid.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    /// The rule that failed.
    pub rule: Rule,
    /// JSON pointer to the value (`/buckets/3/cluster_size`); for a missing field, where it
    /// belongs; `""` is the whole document.
    pub path: String,
    /// What is there (JSON for values, `nothing` for a missing field).
    pub found: String,
    /// What would be valid.
    pub expected: String,
    /// 1-based line of the value (of its key for object members), when validating text.
    pub line: Option<usize>,
    /// 1-based column, in characters, on that line.
    pub column: Option<usize>,
}

impl Diagnostic {
    /// A diagnostic without a position; the pipeline adds it from the text.
    pub fn new(
        rule: Rule,
        path: impl Into<String>,
        found: impl Into<String>,
        expected: impl Into<String>,
    ) -> Diagnostic {
        Diagnostic {
            rule,
            path: path.into(),
            found: found.into(),
            expected: expected.into(),
            line: None,
            column: None,
        }
    }

    /// The message without the position: `/buckets/3/cluster_size: found 4, expected 8 [...]`.
    pub fn message(&self) -> String {
        let path = if self.path.is_empty() {
            "(document)"
        } else {
            &self.path
        };
        format!(
            "{path}: found {}, expected {} [{}]",
            self.found, self.expected, self.rule
        )
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let (Some(line), Some(column)) = (self.line, self.column) {
            write!(formatter, "{line}:{column}: ")?;
        }
        formatter.write_str(&self.message())
    }
}

/// A value as JSON, shortened for one line of a report.
pub(super) fn render_value(value: &Value) -> String {
    crate::files::shorten(&value.to_string()).into_owned()
}

/// A string as a JSON string literal, shortened for one line of a report.
pub(super) fn json_string(text: &str) -> String {
    render_value(&Value::String(text.to_owned()))
}

/// The closest of `candidates` to `word`, when it is close enough to be a likely typo.
pub(super) fn closest<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let limit = (word.chars().count() / 3).max(1);
    candidates
        .into_iter()
        .map(|candidate| (edit_distance(word, candidate), candidate))
        .filter(|&(distance, _)| distance <= limit)
        .min_by_key(|&(distance, _)| distance)
        .map(|(_, candidate)| candidate)
}

/// Levenshtein distance in characters.
fn edit_distance(left: &str, right: &str) -> usize {
    let right: Vec<char> = right.chars().collect();
    let mut previous: Vec<usize> = (0..=right.len()).collect();
    let mut current = vec![0; right.len() + 1];
    for (row, left_char) in left.chars().enumerate() {
        current[0] = row + 1;
        for (column, &right_char) in right.iter().enumerate() {
            let substitution = previous[column] + usize::from(left_char != right_char);
            current[column + 1] = substitution
                .min(previous[column + 1] + 1)
                .min(current[column] + 1);
        }
        std::mem::swap(&mut previous, &mut current);
    }
    previous[right.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_names_are_unique_snake_case() {
        let mut names: Vec<&str> = Rule::ALL.iter().map(|rule| rule.name()).collect();
        for name in &names {
            assert!(
                name.chars().all(|character| character.is_ascii_lowercase()
                    || character.is_ascii_digit()
                    || character == '_'),
                "{name}"
            );
            assert_eq!(Rule::from_name(name).map(Rule::name), Some(*name));
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Rule::ALL.len());
    }

    #[test]
    fn suggests_close_names_only() {
        let fields = ["threads", "blocks", "cluster_size"];
        assert_eq!(closest("treads", fields), Some("threads"));
        assert_eq!(closest("cluster", fields), None);
        assert_eq!(closest("x", fields), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
    }
}
