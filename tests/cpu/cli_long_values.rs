//! Huge values a user gives (a ladder's name, a flag's value) are quoted shortened: every error
//! and diagnostic line stays short and still says what is wrong and where.

use std::fs;

use crate::support::cli;
use crate::support::fixtures::scratch;

/// The longest line these errors may print: a few quoted values of at most 120 characters,
/// escaped, and the words around them.
const LONGEST_LINE: usize = 400;

/// A name of 100,000 characters, all white space (so `empty_name` refuses it): multi-byte ones
/// and ones JSON escapes, so that a cut inside a character or an escape would show.
fn blank_name() -> String {
    "\u{2003}\n\t ".repeat(25_000)
}

/// Writes the minimal ladder named `name` to `ladder.json` in `dir`.
fn write_ladder(dir: &std::path::Path, name: &str) {
    let mut ladder: serde_json::Value =
        serde_json::from_str(include_str!("../fixtures/ladders/valid/minimal.json")).unwrap();
    ladder["name"] = serde_json::Value::String(name.to_owned());
    fs::write(dir.join("ladder.json"), ladder.to_string()).unwrap();
}

/// Checks that no line of `output` is longer than [`LONGEST_LINE`] characters.
fn assert_lines_short(output: &str) {
    for line in output.lines() {
        let length = line.chars().count();
        assert!(
            length <= LONGEST_LINE,
            "a line of {length} characters: {}",
            line.chars().take(300).collect::<String>()
        );
    }
}

#[test]
fn a_huge_ladder_name_is_quoted_short_by_validate_and_export() {
    let (scratch, _) = scratch();
    let dir = scratch.path();
    write_ladder(dir, &blank_name());
    let export = cli::export_args("ladder.json", "pkg", &["--arch", "sm_90"]);
    for args in [&["validate", "ladder.json"][..], &export] {
        let (code, stdout, stderr) = cli::run_in(dir, args);
        assert_eq!(code, 1, "{args:?}: {stderr}");
        let output = format!("{stdout}{stderr}");
        assert_lines_short(&output);
        let diagnostic = output
            .lines()
            .find(|line| line.contains("[empty_name]"))
            .unwrap_or_else(|| panic!("{args:?}: no empty_name diagnostic: {output}"));
        assert!(diagnostic.contains(": /name: found \""), "{diagnostic}");
        // The beginning and the end of the name, each escape whole, around one ellipsis.
        assert!(
            diagnostic.contains("found \"\u{2003}\\n\\t \u{2003}"),
            "{diagnostic}"
        );
        assert!(diagnostic.contains("\\n\\t \", expected"), "{diagnostic}");
        assert_eq!(diagnostic.matches('…').count(), 1, "{diagnostic}");
    }

    let (code, stdout, stderr) = cli::run_in(dir, &["validate", "--json", "ladder.json"]);
    assert_eq!(code, 1, "{stderr}");
    assert_lines_short(&stdout);
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let diagnostic = &report["files"][0]["diagnostics"][0];
    assert_eq!(diagnostic["rule"], "empty_name");
    assert_eq!(diagnostic["path"], "/name");
    let found = diagnostic["found"].as_str().unwrap();
    assert!(found.chars().count() <= 120, "{found}");
    assert!(serde_json::from_str::<String>(found).is_ok(), "{found}");
}

#[test]
fn a_huge_valid_ladder_name_is_quoted_short_when_the_export_fails() {
    let (scratch, _) = scratch();
    let dir = scratch.path();
    let name = format!("start{}end", "n".repeat(100_000));
    write_ladder(dir, &name);
    let (code, stdout, stderr) = cli::finish(
        cli::prepare()
            .current_dir(dir)
            .env("PREPARE_NVRTC", dir.join("no-such-library.so"))
            .args(cli::export_args("ladder.json", "pkg", &["--arch", "sm_90"])),
    );
    assert_eq!(code, Some(3), "{stderr}");
    assert_lines_short(&format!("{stdout}{stderr}"));
    assert!(
        stderr.contains("cannot compile the kernels of `startnnn") && stderr.contains("nnnend`"),
        "{stderr}"
    );
}

#[test]
fn a_huge_flag_value_gives_a_short_usage_error() {
    let (scratch, _) = scratch();
    let dir = scratch.path();
    let digits = format!("1{}", "0".repeat(100_000));
    let word = "z".repeat(100_000);
    let escaped = "\u{1b}]0;title\u{7}".repeat(10_000);
    let cases: [(&str, &str, &str); 9] = [
        ("tune", "--timeout", "1e300"),
        ("tune", "--timeout", &digits),
        ("tune", "--timeout", &escaped),
        ("tune", "--margin", &digits),
        ("tune", "--rounds", &digits),
        ("tune", "--collective-tuning", &word),
        ("bench", "--sizes", &digits),
        ("bench", "--sample-us", &digits),
        ("bench", "--rounds", &digits),
    ];
    for (command, flag, value) in cases {
        let (code, stdout, stderr) = cli::run_in(dir, &[command, "--package", "pkg", flag, value]);
        assert_eq!(code, 2, "{command} {flag}: {stderr}");
        assert!(stdout.is_empty(), "{stdout}");
        assert!(stderr.contains(flag), "{command} {flag}: {stderr}");
        assert!(
            !stderr.contains(['\u{1b}', '\u{7}']),
            "{command} {flag}: {stderr}"
        );
        assert_lines_short(&stderr);
        assert!(stderr.len() < 1000, "{command} {flag}: {stderr}");
    }
    let (code, _, stderr) = cli::run_in(dir, &["tune", "--package", "pkg", &format!("--{word}")]);
    assert_eq!(code, 2, "{stderr}");
    assert_lines_short(&stderr);
}
