//! Every `--json` output is JSON, whatever control characters the inputs hold: file names,
//! ladder names and a manifest's `tool_version` with C0 and C1 controls and DEL anywhere.

use std::fs;

use prepare::ladder::Arch;
use proptest::prelude::*;

use crate::support::cli::run_in;
use crate::support::fixtures::{compilation, ladder, reseal, LADDER};

fn config() -> ProptestConfig {
    ProptestConfig {
        // Each case runs the binary twice.
        cases: 24,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Text of letters and control characters (NUL and `/` cannot be in a file name).
fn with_controls() -> impl Strategy<Value = String> {
    "[a-z\u{1}-\u{1f}\u{7f}-\u{9f}]{1,12}"
}

/// The document on `stdout`, which must parse and hold no raw control character but newlines.
fn parsed(stdout: &str) -> Result<serde_json::Value, TestCaseError> {
    prop_assert!(
        !stdout
            .chars()
            .any(|character| character.is_control() && character != '\n'),
        "a raw control character: {stdout:?}"
    );
    serde_json::from_str(stdout).map_err(|error| TestCaseError::fail(format!("{error}: {stdout}")))
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn validate_json_is_json(file in with_controls(), name in with_controls()) {
        let scratch = tempfile::tempdir().unwrap();
        let file = format!("{file}.json");
        let text = LADDER.replace("\"test_tp4_clustered\"", &serde_json::to_string(&name).unwrap());
        fs::write(scratch.path().join(&file), text).unwrap();
        let (_, stdout, stderr) = run_in(scratch.path(), &["validate", "--json", &file]);
        let document = parsed(&stdout)?;
        prop_assert_eq!(document["files"][0]["file"].as_str(), Some(file.as_str()), "{}", stderr);
    }

    #[test]
    fn show_json_is_json(name in with_controls(), tool_version in with_controls()) {
        // A package's ladder is valid: a name of white space only is not.
        let name = format!("n{name}");
        let scratch = tempfile::tempdir().unwrap();
        let out = scratch.path().join("pkg");
        let text = LADDER.replace("\"test_tp4_clustered\"", &serde_json::to_string(&name).unwrap());
        let ladder = ladder(&text);
        prepare::package::write_package(
            &out, &text, &ladder, &compilation(&ladder, Arch::Sm120), Arch::Sm120, false,
        )
        .unwrap();
        reseal(&out, |manifest| manifest.tool_version = tool_version.clone());
        let (code, stdout, stderr) = run_in(scratch.path(), &["show", "--json", "pkg"]);
        prop_assert_eq!(code, 0, "{}", stderr);
        let document = parsed(&stdout)?;
        prop_assert_eq!(
            document["manifest"]["tool_version"].as_str(),
            Some(tool_version.as_str())
        );
    }
}
