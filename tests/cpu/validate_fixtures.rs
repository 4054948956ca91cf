//! The validation fixtures, one data-driven test per folder: every file in
//! `tests/fixtures/ladders/invalid` is named for the rule it breaks (`rule.json` or
//! `rule__variant.json`) and fails with that rule and a path, its whole report pinned by a
//! snapshot; every file in `valid` and every shipped ladder passes.

use std::path::Path;

use prepare::ladder::{
    validate_ladder, validate_ladder_file, validate_ladder_text, Ladder, LadderError, Rule, Stage,
};

use crate::support::repository::{json_files, root};

fn stem(path: &Path) -> String {
    path.file_stem()
        .and_then(|stem| stem.to_str())
        .expect("a UTF-8 file name")
        .to_owned()
}

/// The rule a fixture is named for.
fn rule_of(path: &Path) -> Rule {
    let stem = stem(path);
    let name = stem.split("__").next().unwrap_or_default();
    Rule::from_name(name).unwrap_or_else(|| {
        panic!(
            "{}: an invalid fixture's name starts with the rule it breaks",
            path.display()
        )
    })
}

fn relative(path: &Path) -> &Path {
    path.strip_prefix(root())
        .expect("fixtures are in the crate")
}

#[test]
fn invalid_fixtures_fail_with_the_rule_in_their_name() {
    for path in json_files("tests/fixtures/ladders/invalid") {
        let rule = rule_of(&path);
        let report = match validate_ladder_file(&path) {
            Err(LadderError::Invalid { report, .. }) => report,
            other => panic!("{}: expected a refusal, got {other:?}", path.display()),
        };
        assert_eq!(report.stage, rule.stage(), "{}: {report}", path.display());
        assert!(
            report
                .diagnostics
                .iter()
                .any(|diagnostic| diagnostic.rule == rule),
            "{}: {rule} not reported:\n{report}",
            path.display()
        );
        for diagnostic in &report.diagnostics {
            // Only a syntax error may sit outside every value (an empty or truncated file).
            if diagnostic.rule != Rule::JsonSyntax {
                assert!(
                    diagnostic.path.starts_with('/'),
                    "{}: {diagnostic}",
                    path.display()
                );
            }
            assert!(
                diagnostic.line.is_some() && diagnostic.column.is_some(),
                "{}: {diagnostic}",
                path.display()
            );
            assert!(!diagnostic.found.is_empty() && !diagnostic.expected.is_empty());
        }
        insta::assert_snapshot!(
            format!("invalid__{}", stem(&path)),
            format!(
                "{}\n{}",
                report.summary(),
                report.render_for(relative(&path))
            )
        );
    }
}

/// The schema stage's fallback for keywords the ladder schema does not use is covered by a
/// unit test of the schema-error module instead.
const RULES_WITHOUT_A_FIXTURE: &[Rule] = &[Rule::SchemaViolation];

#[test]
fn every_rule_has_an_invalid_fixture() {
    let covered: Vec<Rule> = json_files("tests/fixtures/ladders/invalid")
        .iter()
        .map(|path| rule_of(path))
        .collect();
    let missing: Vec<&str> = Rule::ALL
        .iter()
        .filter(|rule| !covered.contains(rule) && !RULES_WITHOUT_A_FIXTURE.contains(rule))
        .map(|rule| rule.name())
        .collect();
    assert!(missing.is_empty(), "rules without a fixture: {missing:?}");
}

#[test]
fn every_rule_is_documented() {
    let docs = std::fs::read_to_string(root().join("docs/ladders.md")).expect("docs/ladders.md");
    let missing: Vec<&str> = Rule::ALL
        .iter()
        .map(|rule| rule.name())
        .filter(|name| !docs.contains(&format!("`{name}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "rules missing from docs/ladders.md: {missing:?}"
    );
}

fn assert_valid(path: &Path) -> Ladder {
    let ladder = validate_ladder_file(path).unwrap_or_else(|error| panic!("{error}"));
    // What the types write back is again a valid ladder, and the same one.
    let written = serde_json::to_string_pretty(&ladder).expect("serializes");
    let again = validate_ladder_text(&written)
        .unwrap_or_else(|report| panic!("{} written back is invalid:\n{report}", path.display()));
    assert_eq!(again, ladder, "{}", path.display());
    assert_eq!(validate_ladder(&ladder), Ok(()));
    ladder
}

#[test]
fn valid_fixtures_pass() {
    for path in json_files("tests/fixtures/ladders/valid") {
        assert_valid(&path);
    }
}

#[test]
fn shipped_ladders_pass() {
    let files = json_files("ladders");
    assert_eq!(files.len(), 36, "{files:?}");
    for path in files {
        let ladder = assert_valid(&path);
        assert_eq!(ladder.name, stem(&path), "a ladder is named for its file");
        assert_eq!(
            ladder.schema.as_deref(),
            Some("../schemas/ladder.schema.json")
        );
    }
}

#[test]
fn reports_every_problem_of_the_failing_stage_in_document_order() {
    let text = r#"{
  "format_version": 1,
  "name": " ",
  "collective": "all_reduce",
  "dtype": "bf16",
  "world_size": 4,
  "targets": ["sm_120", "sm_89", "sm_120"],
  "profiles": [
    {"id": "rsag_phased", "algorithm": "rsag", "schedule": "phased", "active_clusters": 2},
    {"id": "nccl", "algorithm": "nccl", "max_ctas": 8, "min_ctas": 16},
    {"id": "nccl", "algorithm": "one_shot"}
  ],
  "buckets": [
    {"max_bytes": 16384, "threads": 256, "blocks": 64, "cluster_size": 4,
     "candidates": ["rsag_phased", "nccl"], "default": "rsag_phased"},
    {"max_bytes": 16000, "threads": 48, "blocks": 2000,
     "candidates": ["rsag_phased", "one_shot"], "default": "nccl"}
  ]
}"#;
    let report = validate_ladder_text(text).unwrap_err();
    assert_eq!(report.stage, Stage::Rules);
    insta::assert_snapshot!(report.to_string());
    insta::assert_json_snapshot!(report);
}

#[test]
fn a_schema_problem_hides_the_rules_until_it_is_fixed() {
    // world_size 99 breaks a rule, but the unknown field stops validation at the schema stage.
    let text = r#"{"format_version": 1, "name": "x", "collective": "all_reduce", "dtype": "bf16",
        "world_size": 99, "targets": ["sm_90"], "profiles": [], "buckets": [], "extra": 1}"#;
    let report = validate_ladder_text(text).unwrap_err();
    assert_eq!(report.stage, Stage::Schema);
    assert_eq!(report.diagnostics.len(), 1);
    assert_eq!(report.diagnostics[0].rule, Rule::UnknownField);
    assert_eq!(report.diagnostics[0].path, "/extra");
}

#[test]
fn an_empty_file_is_a_syntax_error_at_line_1() {
    let report = validate_ladder_text("").unwrap_err();
    assert_eq!(
        report.to_string(),
        "1:1: (document): found end of file, expected the rest of the document (the file ends too early) [json_syntax]"
    );
}

#[test]
fn a_missing_file_names_the_file() {
    let error = validate_ladder_file(Path::new("ladders/no_such_ladder.json")).unwrap_err();
    assert!(matches!(error, LadderError::Io { .. }));
    assert_eq!(
        error.to_string(),
        "cannot read ladder ladders/no_such_ladder.json"
    );
}

#[test]
fn an_invalid_file_error_names_the_file_on_every_line() {
    let path = root().join("tests/fixtures/ladders/invalid/cluster_size_not_8.json");
    let error = validate_ladder_file(&path).unwrap_err();
    let text = error
        .to_string()
        .replace(&format!("{}/", root().display()), "");
    insta::assert_snapshot!(text);
}

#[test]
fn the_documented_example_is_valid() {
    let docs = std::fs::read_to_string(root().join("docs/ladders.md")).expect("docs/ladders.md");
    let examples: Vec<&str> = docs
        .split("```json\n")
        .skip(1)
        .map(|block| block.split("```").next().unwrap_or_default())
        .collect();
    assert!(!examples.is_empty());
    for example in examples {
        if let Err(report) = validate_ladder_text(example) {
            panic!("docs/ladders.md example:\n{report}");
        }
    }
}
