//! The validation pipeline: JSON syntax (with line and column), the format version, JSON Schema
//! on the raw value, typed parsing, then the semantic rules. Each stage runs only when the one
//! before it passed, and the report holds every problem of the first stage that failed, each
//! with its rule, JSON pointer, what was found and what would be valid.

mod rules;
mod schema_errors;
mod source_map;

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Serialize, Serializer};
use serde_json::Value;

use super::{Ladder, LADDER_FORMAT_VERSIONS};
use source_map::SourceMap;

use rules::check_rules;

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
    /// `protocol` on a profile that is not one-shot, or `ll`/`simple` on one that is not push.
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

/// Every problem of the first stage that failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ValidationReport {
    /// The stage that failed.
    pub stage: Stage,
    /// Its problems, in document order; never empty.
    pub diagnostics: Vec<Diagnostic>,
}

impl ValidationReport {
    /// One line per problem, each starting `file:line:column:` as compilers print them.
    pub fn render_for(&self, file: &Path) -> String {
        let file = file.display();
        self.diagnostics
            .iter()
            .map(|diagnostic| match (diagnostic.line, diagnostic.column) {
                (Some(line), Some(column)) => {
                    format!("{file}:{line}:{column}: {}", diagnostic.message())
                }
                _ => format!("{file}: {}", diagnostic.message()),
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// `2 problems found by the rules check`.
    pub fn summary(&self) -> String {
        let count = self.diagnostics.len();
        let noun = if count == 1 { "problem" } else { "problems" };
        format!("{count} {noun} found by the {} check", self.stage)
    }
}

impl fmt::Display for ValidationReport {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, diagnostic) in self.diagnostics.iter().enumerate() {
            if index > 0 {
                formatter.write_str("\n")?;
            }
            write!(formatter, "{diagnostic}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ValidationReport {}

/// A ladder file that could not be read or is not valid.
#[derive(Debug, thiserror::Error)]
pub enum LadderError {
    /// The file could not be read.
    #[error("cannot read ladder {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a valid ladder.
    #[error("{} is not a valid ladder: {}\n{}", path.display(), report.summary(), report.render_for(path))]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Every problem of the first stage that failed.
        report: ValidationReport,
    },
}

/// Reads and validates a ladder file.
pub fn validate_ladder_file(path: &Path) -> Result<Ladder, LadderError> {
    let bytes = crate::files::read_limited(path, crate::files::LADDER).map_err(|source| {
        LadderError::Io {
            path: path.to_path_buf(),
            source,
        }
    })?;
    validate_ladder_bytes(&bytes).map_err(|report| LadderError::Invalid {
        path: path.to_path_buf(),
        report,
    })
}

/// Validates a ladder given as bytes, refusing text that is not UTF-8 with its position.
pub fn validate_ladder_bytes(bytes: &[u8]) -> Result<Ladder, ValidationReport> {
    match std::str::from_utf8(bytes) {
        Ok(text) => validate_ladder_text(text),
        Err(error) => {
            let offset = error.valid_up_to();
            // The valid prefix keeps its offsets in the lossy text, which locates the value.
            let lossy = String::from_utf8_lossy(bytes);
            let map = SourceMap::new(&lossy);
            let (line, column) = map.line_column(offset);
            let mut diagnostic = Diagnostic::new(
                Rule::JsonSyntax,
                map.pointer_at(offset),
                format!("byte 0x{:02x}, which is not UTF-8", bytes[offset]),
                "UTF-8 text (JSON is UTF-8)",
            );
            diagnostic.line = Some(line);
            diagnostic.column = Some(column);
            Err(ValidationReport {
                stage: Stage::Syntax,
                diagnostics: vec![diagnostic],
            })
        }
    }
}

/// Validates a ladder's text through every stage and returns the typed ladder.
pub fn validate_ladder_text(text: &str) -> Result<Ladder, ValidationReport> {
    // Editors on some systems start UTF-8 files with a byte order mark; JSON parsers refuse it.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let map = SourceMap::new(text);
    let fail = |stage: Stage, diagnostics: Vec<Diagnostic>| {
        Err(ValidationReport {
            stage,
            diagnostics: place(diagnostics, &map),
        })
    };

    let value: Value = match serde_json::from_str(text) {
        Ok(value) => value,
        Err(error) => return fail(Stage::Syntax, vec![syntax_diagnostic(&error, &map, text)]),
    };
    if !map.duplicates().is_empty() {
        return fail(Stage::Syntax, duplicate_key_diagnostics(&map));
    }
    if let Some(diagnostic) = format_version_diagnostic(&value) {
        return fail(Stage::FormatVersion, vec![diagnostic]);
    }
    let diagnostics = schema_errors::schema_diagnostics(&value);
    if !diagnostics.is_empty() {
        return fail(Stage::Schema, diagnostics);
    }
    let diagnostics = schema_errors::unrepresentable_numbers(&value);
    if !diagnostics.is_empty() {
        return fail(Stage::Parse, diagnostics);
    }
    let ladder: Ladder = match serde_json::from_str(text) {
        Ok(ladder) => ladder,
        Err(error) => return fail(Stage::Parse, vec![parse_diagnostic(&error, &map, &value)]),
    };
    let diagnostics = check_rules(&ladder);
    if !diagnostics.is_empty() {
        return fail(Stage::Rules, diagnostics);
    }
    Ok(ladder)
}

/// Validates a ladder built in code (no text, so no positions): the semantic rules only,
/// since the types already hold everything the schema checks.
pub fn validate_ladder(ladder: &Ladder) -> Result<(), ValidationReport> {
    let diagnostics = check_rules(ladder);
    if diagnostics.is_empty() {
        Ok(())
    } else {
        Err(ValidationReport {
            stage: Stage::Rules,
            diagnostics,
        })
    }
}

/// Adds line and column to diagnostics that lack them and sorts them into document order.
fn place(mut diagnostics: Vec<Diagnostic>, map: &SourceMap<'_>) -> Vec<Diagnostic> {
    for diagnostic in &mut diagnostics {
        if diagnostic.line.is_none() {
            if let Some((line, column)) = map.locate(&diagnostic.path) {
                diagnostic.line = Some(line);
                diagnostic.column = Some(column);
            }
        }
    }
    // Stable: problems at one place keep the order the checks found them in.
    diagnostics.sort_by_key(|diagnostic| (diagnostic.line, diagnostic.column));
    diagnostics
}

fn syntax_diagnostic(error: &serde_json::Error, map: &SourceMap<'_>, text: &str) -> Diagnostic {
    let offset = map.offset_of_serde_position(error.line(), error.column());
    let full = error.to_string();
    let message = full
        .rsplit_once(" at line ")
        .map_or(full.as_str(), |(message, _)| message);
    let here = match text[offset..].chars().next() {
        None => "end of file".to_owned(),
        Some(character) if character.is_control() => format!("{character:?}"),
        Some(character) => format!("`{character}`"),
    };
    let (found, expected) = if let Some(expected) = message.strip_prefix("expected ") {
        let expected = match expected {
            "value" => "a value".to_owned(),
            "ident" => "`true`, `false` or `null`".to_owned(),
            other => other.to_owned(),
        };
        (here, expected)
    } else if let Some(what) = message.strip_prefix("EOF while parsing ") {
        let closing = match what {
            "a string" => "`\"` closing the string",
            "an object" => "`}` closing the object",
            "a list" => "`]` closing the array",
            _ => "the rest of the document (the file ends too early)",
        };
        ("end of file".to_owned(), closing.to_owned())
    } else {
        match message {
            "trailing comma" => (
                "a trailing comma".to_owned(),
                "another element or member (JSON allows no trailing comma)".to_owned(),
            ),
            "trailing characters" => (here, "end of file after the document".to_owned()),
            "key must be a string" => (here, "a key in double quotes".to_owned()),
            "invalid number" => (
                here,
                "a JSON number (no leading zero, no `+`, digits after a `.`)".to_owned(),
            ),
            "recursion limit exceeded" => (
                "nesting more than 128 levels deep".to_owned(),
                "at most 128 nested arrays and objects".to_owned(),
            ),
            "control character (\\u0000-\\u001F) found while parsing a string" => (
                format!("{here} inside a string"),
                "an escape such as \\n or \\t".to_owned(),
            ),
            other => (other.to_owned(), "valid JSON".to_owned()),
        }
    };
    let (line, column) = map.line_column(offset);
    let mut diagnostic = Diagnostic::new(Rule::JsonSyntax, map.pointer_at(offset), found, expected);
    diagnostic.line = Some(line);
    diagnostic.column = Some(column);
    diagnostic
}

fn duplicate_key_diagnostics(map: &SourceMap<'_>) -> Vec<Diagnostic> {
    map.duplicates()
        .iter()
        .map(|duplicate| {
            let key = duplicate
                .pointer
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .replace("~1", "/")
                .replace("~0", "~");
            let (first_line, first_column) = map.line_column(duplicate.first_offset);
            let (line, column) = map.line_column(duplicate.offset);
            let mut diagnostic = Diagnostic::new(
                Rule::DuplicateKey,
                duplicate.pointer.clone(),
                format!("the key {} again", json_string(&key)),
                format!(
                    "each key once per object (first at line {first_line}, column {first_column})"
                ),
            );
            diagnostic.line = Some(line);
            diagnostic.column = Some(column);
            diagnostic
        })
        .collect()
}

/// An unknown version is reported alone: the rest of a newer format cannot be judged.
fn format_version_diagnostic(value: &Value) -> Option<Diagnostic> {
    let version = value.get("format_version")?;
    let number = version.as_u64()?;
    if LADDER_FORMAT_VERSIONS
        .iter()
        .any(|&known| u64::from(known) == number)
    {
        return None;
    }
    let known = LADDER_FORMAT_VERSIONS
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let newer = if LADDER_FORMAT_VERSIONS
        .iter()
        .all(|&known| u64::from(known) < number)
    {
        "; a newer prepare writes it"
    } else {
        ""
    };
    Some(Diagnostic::new(
        Rule::UnknownFormatVersion,
        "/format_version",
        number.to_string(),
        format!("a format this prepare reads: {known}{newer}"),
    ))
}

/// Serde refusing what the schema and the number check accepted; kept so such a gap is still
/// reported with its place rather than as a bare message.
fn parse_diagnostic(error: &serde_json::Error, map: &SourceMap<'_>, value: &Value) -> Diagnostic {
    let offset = map.offset_of_serde_position(error.line(), error.column());
    let path = map.pointer_at(offset);
    let full = error.to_string();
    let message = full
        .rsplit_once(" at line ")
        .map_or(full.as_str(), |(message, _)| message);
    let found = value
        .pointer(&path)
        .map_or_else(|| message.to_owned(), render_value);
    let expected = match message.rsplit_once(", expected ") {
        Some((_, "u32")) => {
            "a whole number from 0 to 4294967295, written without a fraction or exponent".to_owned()
        }
        Some((_, "u64")) => {
            "a whole number from 0 to 18446744073709551615, written without a fraction or exponent"
                .to_owned()
        }
        Some((_, other)) => other.to_owned(),
        None => message.to_owned(),
    };
    Diagnostic::new(Rule::UnrepresentableValue, path, found, expected)
}

/// A value as JSON, shortened for one line of a report.
pub(crate) fn render_value(value: &Value) -> String {
    const LIMIT: usize = 60;
    let text = value.to_string();
    if text.chars().count() <= LIMIT {
        return text;
    }
    let mut short: String = text.chars().take(LIMIT).collect();
    short.push('…');
    short
}

/// A string as a JSON string literal.
pub(crate) fn json_string(text: &str) -> String {
    Value::String(text.to_owned()).to_string()
}

/// The closest of `candidates` to `word`, when it is close enough to be a likely typo.
pub(crate) fn closest<'a>(
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

    #[test]
    fn refuses_bytes_that_are_not_utf8_with_their_position() {
        let report = validate_ladder_bytes(b"{\n  \"name\": \"a\xffb\"\n}").unwrap_err();
        assert_eq!(report.stage, Stage::Syntax);
        assert_eq!(
            report.to_string(),
            "2:13: /name: found byte 0xff, which is not UTF-8, expected UTF-8 text (JSON is UTF-8) [json_syntax]"
        );
    }

    #[test]
    fn reads_the_format_version_before_anything_else() {
        let report =
            validate_ladder_text(r#"{"format_version": 2, "bogus": true, "world_size": 99}"#)
                .unwrap_err();
        assert_eq!(report.stage, Stage::FormatVersion);
        assert_eq!(
            report.to_string(),
            "1:2: /format_version: found 2, expected a format this prepare reads: 1; a newer prepare writes it [unknown_format_version]"
        );
    }
}
