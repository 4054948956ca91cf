//! The validation pipeline: JSON syntax (with line and column), the format version, JSON Schema
//! on the raw value, typed parsing, then the semantic rules. Each stage runs only when the one
//! before it passed, and the report holds every problem of the first stage that failed, each
//! with its rule, JSON pointer, what was found and what would be valid.

mod collective_rules;
mod diagnostic;
mod epilogue_rules;
mod rules;
mod schema_errors;
mod source_map;

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use super::{Ladder, LADDER_FORMAT_VERSIONS};
use diagnostic::{json_string, render_value};
pub use diagnostic::{Diagnostic, Rule, Stage};
use source_map::SourceMap;

use rules::check_rules;

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
                crate::files::shorten(&map.pointer_at(offset)).into_owned(),
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

/// Adds line and column to diagnostics that lack them, shortens paths through long keys, and
/// sorts them into document order.
fn place(mut diagnostics: Vec<Diagnostic>, map: &SourceMap<'_>) -> Vec<Diagnostic> {
    for diagnostic in &mut diagnostics {
        if diagnostic.line.is_none() {
            if let Some((line, column)) = map.locate(&diagnostic.path) {
                diagnostic.line = Some(line);
                diagnostic.column = Some(column);
            }
        }
        diagnostic.path = crate::files::shorten(&diagnostic.path).into_owned();
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

#[cfg(test)]
mod tests {
    use super::*;

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
