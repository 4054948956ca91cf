//! `prepare validate`: validates ladder files and reports every problem of each, with its file,
//! line, column, JSON path and rule; exit 1 when any file is invalid or unreadable.

use std::io::Write;
use std::path::{Path, PathBuf};

use prepare::ladder::{validate_ladder_file, Arch, Diagnostic, Ladder, LadderError, Stage};
use serde::Serialize;

use super::Failure;

/// Flags of `prepare validate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Ladder files to validate.
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Print one JSON document with every file's verdict and diagnostics.
    #[arg(long)]
    json: bool,
}

/// The JSON document `--json` prints.
#[derive(Debug, Serialize)]
struct Document {
    /// Files that are valid ladders.
    valid: usize,
    /// Files that are not, or could not be read.
    invalid: usize,
    /// One verdict per file, in the order given.
    files: Vec<FileVerdict>,
}

#[derive(Debug, Serialize)]
struct FileVerdict {
    file: String,
    #[serde(flatten)]
    verdict: Verdict,
}

#[derive(Debug, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
enum Verdict {
    Valid {
        name: String,
        profiles: usize,
        buckets: usize,
        clustered_buckets: usize,
        targets: Vec<Arch>,
    },
    Invalid {
        stage: Stage,
        diagnostics: Vec<Diagnostic>,
    },
    Unreadable {
        error: String,
    },
}

impl Verdict {
    fn of(result: Result<Ladder, LadderError>) -> Verdict {
        match result {
            Ok(ladder) => Verdict::Valid {
                name: ladder.name.clone(),
                profiles: ladder.profiles.len(),
                buckets: ladder.buckets.len(),
                clustered_buckets: ladder
                    .buckets
                    .iter()
                    .filter(|bucket| bucket.is_clustered())
                    .count(),
                targets: ladder.targets,
            },
            Err(LadderError::Invalid { report, .. }) => Verdict::Invalid {
                stage: report.stage,
                diagnostics: report.diagnostics,
            },
            Err(LadderError::Io { source, .. }) => Verdict::Unreadable {
                error: source.to_string(),
            },
        }
    }

    fn is_valid(&self) -> bool {
        matches!(self, Verdict::Valid { .. })
    }
}

/// Runs `prepare validate`.
pub fn run(args: &Args) -> Result<(), Failure> {
    let verdicts: Vec<FileVerdict> = args
        .files
        .iter()
        .map(|file| FileVerdict {
            file: file.display().to_string(),
            verdict: Verdict::of(validate_ladder_file(file)),
        })
        .collect();
    let invalid = verdicts
        .iter()
        .filter(|file| !file.verdict.is_valid())
        .count();
    let total = verdicts.len();

    let text = if args.json {
        let document = Document {
            valid: total - invalid,
            invalid,
            files: verdicts,
        };
        let mut text = serde_json::to_string_pretty(&document)
            .map_err(|error| Failure::runtime(anyhow::Error::new(error)))?;
        text.push('\n');
        text
    } else {
        verdicts.iter().map(human).collect()
    };
    // Diagnostics quote the ladder's keys and values: escaped for the terminal, in JSON's own
    // syntax inside JSON.
    let text = if args.json {
        prepare::files::escape_control_json(&text)
    } else {
        prepare::files::escape_control(&text)
    };
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .map_err(|error| {
            Failure::runtime(anyhow::Error::new(error).context("cannot write the report"))
        })?;

    if invalid == 0 {
        Ok(())
    } else {
        let ladders = if total == 1 { "ladder" } else { "ladders" };
        let verb = if invalid == 1 { "is" } else { "are" };
        Err(Failure::refused(anyhow::anyhow!(
            "{invalid} of {total} {ladders} {verb} invalid"
        )))
    }
}

/// The human report of one file, ending in a newline.
fn human(file: &FileVerdict) -> String {
    let name = &file.file;
    match &file.verdict {
        Verdict::Valid {
            profiles,
            buckets,
            targets,
            ..
        } => {
            let targets: Vec<&str> = targets.iter().map(|arch| arch.name()).collect();
            format!(
                "{name}: valid ({}, {}, targets {})\n",
                plural(*profiles, "profile"),
                plural(*buckets, "bucket"),
                targets.join(", ")
            )
        }
        Verdict::Invalid { stage, diagnostics } => {
            let report = prepare::ladder::ValidationReport {
                stage: *stage,
                diagnostics: diagnostics.clone(),
            };
            format!(
                "{name}: invalid, {}\n{}\n",
                report.summary(),
                report.render_for(Path::new(name))
            )
        }
        Verdict::Unreadable { error } => format!("{name}: cannot read: {error}\n"),
    }
}

/// `1 profile`, `8 profiles`.
fn plural(count: usize, noun: &str) -> String {
    if count == 1 {
        format!("{count} {noun}")
    } else {
        format!("{count} {noun}s")
    }
}
