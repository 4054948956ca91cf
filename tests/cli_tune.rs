//! `prepare tune` and `prepare bench` refuse bad flags (exit code 2) and packages (exit code 1)
//! before starting any rank, with a message naming what is wrong (no GPU needed).

use assert_cmd::Command;

fn prepare() -> Command {
    Command::cargo_bin("prepare").unwrap()
}

/// Runs a command that must fail as a usage error (exit 2) before starting any rank.
fn usage_error(args: &[&str]) -> String {
    let output = prepare().args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(output.stdout.is_empty(), "{args:?}");
    stderr
}

fn refused(args: &[&str]) -> String {
    let output = prepare().args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
    assert!(output.stdout.is_empty(), "{args:?}");
    stderr
}

#[test]
fn a_margin_outside_zero_to_a_hundred_percent_is_refused() {
    for margin in ["-1", "100", "NaN"] {
        let stderr = usage_error(&["tune", "--package", "pkg", &format!("--margin={margin}")]);
        assert!(
            stderr.contains(&format!("--margin {margin} is not a percentage")),
            "{stderr}"
        );
    }
}

#[test]
fn too_few_rounds_are_refused() {
    let stderr = usage_error(&["tune", "--package", "pkg", "--rounds", "4"]);
    assert!(stderr.contains("--rounds 4 is too few"), "{stderr}");
}

#[test]
fn a_bad_timeout_is_refused() {
    let stderr = usage_error(&["tune", "--package", "pkg", "--timeout", "0"]);
    assert!(
        stderr.contains("0 is not a positive number of seconds up to 86400"),
        "{stderr}"
    );
}

#[test]
fn a_missing_package_is_refused_by_tune_and_bench_before_any_rank_starts() {
    let scratch = tempfile::tempdir().unwrap();
    let missing = scratch.path().join("no-package");
    for command in ["tune", "bench"] {
        let stderr = refused(&[command, "--package", missing.to_str().unwrap()]);
        assert!(stderr.contains("no-package"), "{command}: {stderr}");
    }
}

#[test]
fn bench_sizes_take_suffixes_and_refuse_nonsense() {
    let output = prepare()
        .args(["bench", "--package", "pkg", "--sizes", "8K,lots"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("`lots` is not a size such as 4096, 256K or 64M"),
        "{stderr}"
    );
}
