//! `prepare tune` and `prepare bench` refuse bad flags (exit code 2) and packages (exit code 1)
//! before starting any rank, with a message naming what is wrong (no GPU needed); with `check`
//! they take the exactness flags: `--allow-inexact`, and `--exact-only`, which is the default.

use crate::support::cli::run;

/// Runs `prepare ARGS`, which must fail with `code` before starting any rank and print nothing
/// on stdout; returns its stderr.
fn fails(code: i32, args: &[&str]) -> String {
    let (found, stdout, stderr) = run(args);
    assert_eq!((found, stdout.as_str()), (code, ""), "{args:?}: {stderr}");
    stderr
}

/// Runs a command that must fail as a usage error (exit 2) before starting any rank, saying
/// `message`.
fn usage_error(args: &[&str], message: &str) {
    let stderr = fails(2, args);
    assert!(stderr.contains(message), "{args:?}: {stderr}");
}

/// Runs a command whose input must be refused (exit 1) before starting any rank.
fn refused(args: &[&str]) -> String {
    fails(1, args)
}

#[test]
fn a_margin_outside_zero_to_a_hundred_percent_is_refused() {
    for margin in ["-1", "100", "NaN"] {
        usage_error(
            &["tune", "--package", "pkg", &format!("--margin={margin}")],
            &format!("--margin {margin} is not a percentage"),
        );
    }
}

#[test]
fn too_few_rounds_are_refused() {
    usage_error(
        &["tune", "--package", "pkg", "--rounds", "4"],
        "--rounds 4 is too few",
    );
}

#[test]
fn a_bad_timeout_is_refused() {
    usage_error(
        &["tune", "--package", "pkg", "--timeout", "0"],
        "0 is not a positive number of seconds up to 86400",
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
    usage_error(
        &["bench", "--package", "pkg", "--sizes", "8K,lots"],
        "`lots` is not a size such as 4096, 256K or 64M",
    );
}

#[test]
fn allow_inexact_with_exact_only_is_a_usage_error_on_every_command_that_selects_or_checks() {
    for command in [
        &["tune", "--package", "pkg"][..],
        &["bench", "--package", "pkg"],
        &["check"],
    ] {
        let mut args = command.to_vec();
        args.extend(["--allow-inexact", "--exact-only"]);
        usage_error(
            &args,
            "'--allow-inexact' cannot be used with '--exact-only'",
        );
    }
}

/// `--exact-only` is the default now: accepted, and said so once on stderr before the command
/// goes on (here to refuse the missing package, or the single GPU named).
#[test]
fn exact_only_is_accepted_and_said_once_to_be_the_default() {
    let scratch = tempfile::tempdir().unwrap();
    let missing = scratch.path().join("no-package");
    let missing = missing.to_str().unwrap();
    let note = "note: --exact-only is the default: candidates whose output differs from the \
                reference sum are kept out unless --allow-inexact is given";
    let runs = [
        (1, vec!["tune", "--package", missing, "--exact-only"]),
        (1, vec!["bench", "--package", missing, "--exact-only"]),
        (2, vec!["check", "--gpus", "0", "--exact-only"]),
    ];
    for (code, args) in runs {
        let stderr = fails(code, &args);
        assert_eq!(stderr.matches(note).count(), 1, "{args:?}: {stderr}");
        // Without the flag, nothing is said.
        let without: Vec<&str> = args
            .iter()
            .copied()
            .filter(|a| *a != "--exact-only")
            .collect();
        let stderr = fails(code, &without);
        assert!(!stderr.contains("note:"), "{without:?}: {stderr}");
    }
}

#[test]
fn allow_inexact_is_accepted_by_every_command_that_selects_or_checks() {
    let scratch = tempfile::tempdir().unwrap();
    let missing = scratch.path().join("no-package");
    let missing = missing.to_str().unwrap();
    for command in ["tune", "bench"] {
        let stderr = refused(&[command, "--package", missing, "--allow-inexact"]);
        assert!(stderr.contains("no-package"), "{command}: {stderr}");
    }
    usage_error(
        &["check", "--gpus", "0", "--allow-inexact"],
        "needs at least 2 GPUs",
    );
}
