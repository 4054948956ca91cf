//! The `prepare validate` and `prepare schema` commands as a user runs them: output, exit codes
//! (0 valid, 1 refused, 2 usage) and the schema they print.

use std::path::PathBuf;

use assert_cmd::Command;
use predicates::prelude::*;

use crate::support::repository::root;
use crate::support::{cli, repository};

/// `prepare`, run from the crate root.
fn prepare() -> Command {
    let mut command = cli::prepare();
    command.current_dir(root());
    command
}

/// JSON files of a folder, relative to the crate root, sorted.
fn json_files(folder: &str) -> Vec<PathBuf> {
    repository::json_files(folder)
        .into_iter()
        .map(|path| path.strip_prefix(root()).expect("inside").to_path_buf())
        .collect()
}

#[test]
fn shipped_ladders_are_valid() {
    let output = prepare()
        .arg("validate")
        .args(json_files("ladders"))
        .assert()
        .success()
        .stderr("")
        .get_output()
        .stdout
        .clone();
    insta::assert_snapshot!(String::from_utf8(output).expect("UTF-8"));
}

#[test]
fn each_invalid_fixture_exits_1_and_names_its_file() {
    let files = json_files("tests/fixtures/ladders/invalid");
    assert!(!files.is_empty());
    for file in files {
        let name = file.display().to_string();
        prepare()
            .arg("validate")
            .arg(&file)
            .assert()
            .code(1)
            .stdout(predicate::str::starts_with(format!("{name}: invalid, ")))
            .stdout(predicate::str::contains(format!("\n{name}:")))
            .stderr("error: 1 of 1 ladder is invalid\n");
    }
}

#[test]
fn a_mixed_run_reports_every_file_and_counts_the_invalid_ones() {
    let output = prepare()
        .args([
            "validate",
            "tests/fixtures/ladders/valid/minimal.json",
            "tests/fixtures/ladders/invalid/cluster_size_without_512_threads.json",
            "tests/fixtures/ladders/invalid/json_syntax__trailing_comma.json",
            "tests/fixtures/ladders/no_such_file.json",
        ])
        .assert()
        .code(1)
        .stderr("error: 3 of 4 ladders are invalid\n")
        .get_output()
        .stdout
        .clone();
    insta::assert_snapshot!(String::from_utf8(output).expect("UTF-8"));
}

#[test]
fn json_output_is_one_document_with_every_verdict() {
    let output = prepare()
        .args([
            "validate",
            "--json",
            "ladders/h200_nvlink_tp2_clustered.json",
            "tests/fixtures/ladders/invalid/unknown_field__typo.json",
            "tests/fixtures/ladders/no_such_file.json",
        ])
        .assert()
        .code(1)
        .stderr("error: 2 of 3 ladders are invalid\n")
        .get_output()
        .stdout
        .clone();
    let document: serde_json::Value = serde_json::from_slice(&output).expect("one JSON document");
    insta::assert_json_snapshot!(document);
}

#[test]
fn json_output_of_valid_ladders_exits_0() {
    prepare()
        .args(["validate", "--json", "ladders/gb202_pcie_tp4.json"])
        .assert()
        .success()
        .stdout(predicate::str::contains("\"verdict\": \"valid\""));
}

#[test]
fn validate_without_files_is_a_usage_error() {
    prepare().arg("validate").assert().code(2);
}

#[test]
fn schema_prints_the_committed_ladder_schema() {
    let committed =
        std::fs::read(root().join("schemas/ladder.schema.json")).expect("committed schema");
    prepare()
        .arg("schema")
        .assert()
        .success()
        .stdout(committed.clone());
    prepare()
        .args(["schema", "ladder"])
        .assert()
        .success()
        .stdout(committed);
}

#[test]
fn an_unknown_schema_name_is_a_usage_error() {
    prepare()
        .args(["schema", "bogus"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(format!(
            "[possible values: {}]",
            prepare::schema::SchemaName::ALL
                .iter()
                .map(|name| name.name())
                .collect::<Vec<_>>()
                .join(", ")
        )));
}
