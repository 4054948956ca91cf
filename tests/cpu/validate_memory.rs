//! `prepare validate` keeps its memory bounded on any ladder up to the size limit: the worst
//! shapes of the source map (deep nesting of long keys around a long array) stay under 300 MB
//! of peak resident memory. In a process of its own, so the peak of children is this one's.

use std::fmt::Write as _;

use assert_cmd::Command;
use nix::sys::resource::{getrusage, UsageWho};

use crate::support::process::in_own_process;
use crate::test_name;

/// Peak resident memory `prepare validate` may reach on a ladder within the 1 MiB limit.
const LIMIT_BYTES: i64 = 300 * 1024 * 1024;

/// `depth` objects nested under keys of `key_length` characters around an array of `elements`
/// numbers.
fn nested(depth: usize, key_length: usize, elements: usize) -> String {
    let mut text = String::new();
    for level in 0..depth {
        let key: String =
            std::iter::repeat_n(char::from(b'a' + (level % 26) as u8), key_length).collect();
        let _ = write!(text, "{{\"{key}\":");
    }
    text.push('[');
    for element in 0..elements {
        if element > 0 {
            text.push(',');
        }
        text.push('0');
    }
    text.push(']');
    text.push_str(&"}".repeat(depth));
    text
}

#[test]
fn deep_long_keys_around_a_long_array_stay_under_300_mb() {
    if !in_own_process(&test_name!(
        deep_long_keys_around_a_long_array_stay_under_300_mb
    )) {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let file = scratch.path().join("ladder.json");
    let text = nested(100, 2000, 10_000);
    assert!(text.len() <= 1 << 20, "{} bytes", text.len());
    std::fs::write(&file, text).unwrap();
    Command::cargo_bin("prepare")
        .unwrap()
        .args(["validate", file.to_str().unwrap()])
        .assert()
        .code(1);
    // ru_maxrss is in KiB on Linux.
    let peak = getrusage(UsageWho::RUSAGE_CHILDREN).unwrap().max_rss() * 1024;
    assert!(
        peak <= LIMIT_BYTES,
        "peak resident memory {} MB",
        peak / (1024 * 1024)
    );
}
