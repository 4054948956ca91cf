//! The validation pipeline: JSON syntax, JSON Schema, typed parsing, semantic rules.

/// Placeholder.
#[derive(Debug)]
pub struct Diagnostic;
/// Placeholder.
#[derive(Debug)]
pub struct Rule;
/// Placeholder.
#[derive(Debug)]
pub struct Stage;
/// Placeholder.
#[derive(Debug)]
pub struct ValidationReport;
/// Placeholder.
pub fn validate_ladder_text() {}
/// Placeholder.
pub fn validate_ladder_file() {}
