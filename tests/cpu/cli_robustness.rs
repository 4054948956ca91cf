//! Bad input and faults from the command line, with real files and FIFOs: nothing a user wrote
//! is removed, no read blocks or runs out of memory, no flag panics, and every failure exits
//! with its class, naming what is wrong: 2 usage, 1 input refused, 3 runtime failure (here,
//! where no GPU driver is). No GPU or NVRTC is needed.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use assert_cmd::Command;

use prepare::ladder::Arch;

use crate::support::cli::{self, export_args};
use crate::support::fixtures;
use crate::support::fixtures::{scratch, write_fixture, LADDER};

/// Long enough for any of these commands; a read that blocks on a FIFO runs into it.
const PATIENCE: Duration = Duration::from_secs(20);

/// Runs `prepare` in `dir` with `args`, ending it after [`PATIENCE`]; returns its exit code
/// (`None` when it was ended), stdout and stderr.
fn run_bounded(dir: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    run_with(cli::prepare(), dir, &[], args)
}

/// Runs `command` in `dir` with the variables `env` and `args`, ending it after [`PATIENCE`];
/// returns its exit code (`None` when it was ended), stdout and stderr.
fn run_with(
    mut command: Command,
    dir: &Path,
    env: &[(&str, &str)],
    args: &[&str],
) -> (Option<i32>, String, String) {
    cli::finish(
        command
            .timeout(PATIENCE)
            .current_dir(dir)
            .envs(env.iter().copied())
            .args(args),
    )
}

/// Checks that a run of [`run_bounded`] exited with `code`, naming `what` on stderr.
fn assert_fails_naming(run: (Option<i32>, String, String), code: i32, what: &str) {
    let (found, _, stderr) = run;
    assert_eq!(found, Some(code), "{stderr}");
    assert!(stderr.contains(what), "{what}: {stderr}");
}

/// How the tests export the ladder they wrote: `prepare export` of `ladder.json`.
const EXPORT: [&str; 3] = ["export", "--collective-ladder", "ladder.json"];

/// A run that must fail: the exit code expected, the variables, the arguments.
type Failing<'a> = (i32, &'a [(&'a str, &'a str)], &'a [&'a str]);

/// The variables of rank 0 of two, started by hand as torchrun would.
const RANK_ZERO: [(&str, &str); 4] = [
    ("RANK", "0"),
    ("WORLD_SIZE", "2"),
    ("MASTER_ADDR", "127.0.0.1"),
    ("MASTER_PORT", "29500"),
];

#[test]
fn every_command_exits_with_the_class_of_its_failure() {
    let (scratch, out) = scratch_with_package();
    let package = out.to_str().unwrap();
    let tampered = scratch.path().join("tampered");
    fs::create_dir(&tampered).unwrap();
    fs::write(tampered.join("manifest.json"), "{}").unwrap();
    let tampered = tampered.to_str().unwrap();
    let rank_without_world = [("RANK", "0")];
    let mut rank_without_gpu = RANK_ZERO.to_vec();
    rank_without_gpu.push(("PREPARE_GPUS", "x"));
    let cases: [Failing; 14] = [
        // Usage: the flags or the launcher's variables.
        (2, &[], &["export", "--no-such-flag"]),
        (2, &[], &[&EXPORT[..], &["--out", "new"]].concat()),
        (
            2,
            &[],
            &[&EXPORT[..], &["--arch", "sm_120", "--out", "new/."]].concat(),
        ),
        (2, &[], &["check", "--gpus", "0"]),
        (2, &rank_without_world, &["check"]),
        (2, &rank_without_gpu, &["tune", "--package", package]),
        // Input refused: the ladder, the package, a choice, the output.
        (1, &[], &["validate", "absent.json"]),
        (
            1,
            &[],
            &[&EXPORT[..], &["--arch", "sm_90", "--out", "new"]].concat(),
        ),
        (1, &[], &["show", tampered]),
        (1, &[], &["tune", "--package", tampered, "--gpus", "0,1"]),
        (1, &[], &["bench", "--package", tampered, "--gpus", "0,1"]),
        // Runtime: no driver here, in the launcher or in a rank started by hand.
        (3, &[], &["check", "--gpus", "0,1"]),
        (
            3,
            &[],
            &[&EXPORT[..], &["--gpus", "0,1", "--out", "new"]].concat(),
        ),
        (3, &RANK_ZERO, &["check"]),
    ];
    for (expected, env, args) in cases {
        let (code, _, stderr) = run_with(cli::prepare(), scratch.path(), env, args);
        assert_eq!(code, Some(expected), "{env:?} {args:?}: {stderr}");
        assert!(
            stderr.lines().any(|line| line.starts_with("error: ")),
            "{env:?} {args:?}: {stderr}"
        );
    }
    assert!(!scratch.path().join("new").exists());
}

#[test]
fn a_rank_names_itself_once_per_line() {
    let (scratch, _) = scratch_with_package();
    let (code, _, stderr) = run_bounded(scratch.path(), &["check", "--gpus", "0,1"]);
    assert_eq!(code, Some(3), "{stderr}");
    // The first rank to fail ends the other, which may not have reported yet.
    let mut reported = 0;
    for rank in 0..2 {
        for line in stderr
            .lines()
            .filter(|line| line.starts_with(&format!("[rank {rank}] ")))
        {
            assert!(line.contains("] error: the CUDA driver library"), "{line}");
            assert_eq!(line.matches(&format!("rank {rank}")).count(), 1, "{line}");
            reported += 1;
        }
    }
    assert!(reported > 0, "{stderr}");
}

/// The serve example, built with the workspace's features as `cargo test --workspace`
/// (scripts/test.sh) resolves them, so that the example that run built is reused instead of
/// the library and the example being built again with the features of this package alone.
fn serve_example() -> Command {
    let status = std::process::Command::new(env!("CARGO"))
        .args(["build", "--quiet", "--workspace", "--example", "serve"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("cargo runs");
    assert!(status.success(), "the serve example builds");
    let test = std::env::current_exe().expect("the test binary's path");
    let profile = test
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps");
    Command::new(profile.join("examples/serve"))
}

#[test]
fn the_serve_example_exits_with_the_class_of_its_failure() {
    let (scratch, out) = scratch_with_package();
    let package = out.to_str().unwrap();
    let cases: [Failing; 5] = [
        (2, &RANK_ZERO, &[]),
        (2, &RANK_ZERO, &[package, "cache", "extra"]),
        (2, &[("RANK", "0")], &[package]),
        (1, &RANK_ZERO, &["absent"]),
        (3, &RANK_ZERO, &[package]),
    ];
    for (expected, env, args) in cases {
        let (code, _, stderr) = run_with(serve_example(), scratch.path(), env, args);
        assert_eq!(code, Some(expected), "{env:?} {args:?}: {stderr}");
        assert!(stderr.starts_with("error: "), "{env:?} {args:?}: {stderr}");
    }
}

/// [`run_in`] of `prepare COMMAND --package PACKAGE FLAGS`.
fn run_on_package(
    dir: &Path,
    command: &str,
    package: &Path,
    flags: &[&str],
) -> (Option<i32>, String, String) {
    let mut args = vec![command, "--package", package.to_str().unwrap()];
    args.extend_from_slice(flags);
    run_bounded(dir, &args)
}

fn mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo runs");
    assert!(status.success(), "mkfifo {}", path.display());
}

/// A scratch directory with the fixture ladder as `ladder.json` and its package as `pkg`.
fn scratch_with_package() -> (tempfile::TempDir, PathBuf) {
    let (scratch, out) = scratch();
    fs::write(scratch.path().join("ladder.json"), LADDER).unwrap();
    write_fixture(&out, Arch::Sm120);
    (scratch, out)
}

#[test]
fn force_refuses_before_compiling_a_directory_holding_files_the_package_does_not_name() {
    let (scratch, _) = scratch_with_package();
    let target = scratch.path().join("p");
    fs::create_dir_all(target.join("src")).unwrap();
    fs::write(target.join("manifest.json"), "{}").unwrap();
    fs::write(target.join("src/main.js"), "code").unwrap();
    let run = run_bounded(
        scratch.path(),
        &[&EXPORT[..], &["--arch", "sm_120", "--out", "p", "--force"]].concat(),
    );
    assert_fails_naming(run, 1, "src");
    assert_eq!(fs::read(target.join("src/main.js")).unwrap(), b"code");
}

#[test]
fn the_launcher_never_removes_an_id_file_it_did_not_write() {
    let (scratch, out) = scratch_with_package();
    let precious = scratch.path().join("notes.txt");
    fs::write(&precious, "a user's notes").unwrap();
    let run = run_on_package(
        scratch.path(),
        "tune",
        &out,
        &["--gpus", "0,1", "--id-file", precious.to_str().unwrap()],
    );
    assert_eq!(
        fs::read_to_string(&precious).ok().as_deref(),
        Some("a user's notes")
    );
    assert_fails_naming(run, 1, "notes.txt");
}

#[test]
fn a_fifo_as_ladder_manifest_or_choice_is_refused_without_blocking() {
    let (scratch, out) = scratch_with_package();
    let fifo = scratch.path().join("fifo.json");
    mkfifo(&fifo);
    let fifo = fifo.to_str().unwrap();
    let package = out.to_str().unwrap();
    let fifo_package = scratch.path().join("fifo-package");
    fs::create_dir(&fifo_package).unwrap();
    mkfifo(&fifo_package.join("manifest.json"));
    let runs: [&[&str]; 4] = [
        &["validate", fifo],
        &export_args(fifo, "new", &["--arch", "sm_120"]),
        &["show", fifo_package.to_str().unwrap()],
        &["show", package, "--choice", fifo],
    ];
    for args in runs {
        // `validate` reports each file on standard output, the rest on standard error.
        let (code, stdout, stderr) = run_bounded(scratch.path(), args);
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
        let output = stdout + &stderr;
        assert!(output.contains("not a regular file"), "{args:?}: {output}");
    }
}

/// A FIFO named where a package directory is expected (`show`, `--package`, `export --out`) is
/// refused at once: opened as a directory it would block until a writer came.
#[test]
fn a_fifo_as_a_package_directory_or_an_output_is_refused_without_blocking() {
    let (scratch, _) = scratch_with_package();
    mkfifo(&scratch.path().join("f"));
    let on_package: [(&str, &[&str]); 3] = [
        ("tune", &["--gpus", "0,1"]),
        ("check", &["--gpus", "0,1"]),
        ("bench", &["--gpus", "0,1"]),
    ];
    for (command, flags) in on_package {
        let run = run_on_package(scratch.path(), command, Path::new("f"), flags);
        assert_fails_naming(run, 1, "f is not a package directory");
    }
    assert_fails_naming(
        run_bounded(scratch.path(), &["show", "f"]),
        1,
        "error: f is not a package directory\n",
    );
    for force in [&[][..], &["--force"]] {
        let run = run_bounded(
            scratch.path(),
            &[&EXPORT[..], &["--arch", "sm_120", "--out", "f"], force].concat(),
        );
        assert_fails_naming(run, 1, "refusing to replace f: it is not a directory; ");
    }
    let fifo = fs::symlink_metadata(scratch.path().join("f")).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&fifo.file_type()));
}

#[test]
fn devices_and_huge_files_are_refused_naming_the_limit() {
    let (scratch, out) = scratch_with_package();
    let huge = scratch.path().join("huge.json");
    fs::File::create(&huge)
        .unwrap()
        .set_len(64 << 30)
        .expect("a sparse file");
    let huge = huge.to_str().unwrap();
    let (code, stdout, _) = run_bounded(scratch.path(), &["validate", huge]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stdout.contains("1 MiB"), "{stdout}");
    let (code, stdout, _) = run_bounded(scratch.path(), &["validate", "/dev/zero"]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stdout.contains("not a regular file"), "{stdout}");
    let run = run_bounded(
        scratch.path(),
        &["show", out.to_str().unwrap(), "--choice", huge],
    );
    assert_fails_naming(run, 1, "16 MiB");
}

#[test]
fn out_of_range_numbers_are_usage_errors_never_panics() {
    let (scratch, out) = scratch_with_package();
    let runs: [(&str, &[&str]); 9] = [
        ("tune", &["--gpus", "0,1", "--timeout", "1e18"]),
        ("tune", &["--gpus", "0,1", "--timeout", "inf"]),
        ("tune", &["--timeout", "0"]),
        ("tune", &["--margin", "NaN"]),
        ("tune", &["--rounds", "4"]),
        ("check", &["--gpus", "0,1", "--timeout", "1e18"]),
        ("bench", &["--gpus", "0,1", "--timeout", "1e300"]),
        ("bench", &["--batches", "18446744073709551615"]),
        ("bench", &["--sample-us", "inf"]),
    ];
    for (command, flags) in runs {
        let (code, _, stderr) = run_on_package(scratch.path(), command, &out, flags);
        assert_eq!(code, Some(2), "{command} {flags:?}: {stderr}");
    }
}

#[test]
fn a_crafted_package_is_refused_by_show() {
    let (_scratch, out) = scratch_with_package();
    fixtures::reseal(&out, |manifest| {
        manifest.peer_memory.buffer_bytes = u64::MAX;
    });
    let run = run_bounded(out.parent().unwrap(), &["show", out.to_str().unwrap()]);
    assert_fails_naming(run, 1, "/peer_memory");
}

#[test]
fn an_unwritable_out_or_cache_is_refused_before_any_rank_starts() {
    let (scratch, out) = scratch_with_package();
    let file = scratch.path().join("a-file");
    fs::write(&file, "not a directory").unwrap();
    for flag in ["--out", "--cache-dir"] {
        let (code, _, stderr) = run_on_package(
            scratch.path(),
            "tune",
            &out,
            &["--gpus", "0,1", flag, file.to_str().unwrap()],
        );
        assert_eq!(code, Some(1), "{flag}: {stderr}");
        assert!(stderr.contains(flag), "{flag}: {stderr}");
        assert!(
            !stderr.contains("[rank"),
            "{flag}: a rank started: {stderr}"
        );
    }
}

#[test]
fn the_same_gpu_twice_is_a_usage_error() {
    let (scratch, out) = scratch_with_package();
    let run = run_on_package(scratch.path(), "tune", &out, &["--gpus", "0,0"]);
    assert_fails_naming(run, 2, "GPU 0");
}

#[test]
fn an_output_that_names_no_directory_is_a_usage_error() {
    let (scratch, _) = scratch_with_package();
    for out in ["new/.", "new/..", "/"] {
        let (code, _, stderr) = run_bounded(
            scratch.path(),
            &[&EXPORT[..], &["--arch", "sm_120", "--out", out]].concat(),
        );
        assert_eq!(code, Some(2), "{out}: {stderr}");
    }
}

#[test]
fn control_characters_from_files_are_printed_escaped() {
    let (scratch, out) = scratch_with_package();
    let ladder = LADDER.replacen(
        "\"format_version\": 1,",
        "\"format_version\": 1, \"\\u001b]0;owned\\u0007\\u001b[2J\": 1,",
        1,
    );
    let bad = scratch.path().join("bad.json");
    fs::write(&bad, ladder).unwrap();
    let (code, stdout, stderr) = run_bounded(scratch.path(), &["validate", bad.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        !stdout.contains('\u{1b}') && !stderr.contains('\u{1b}'),
        "{stdout}{stderr}"
    );
    assert!(stdout.contains("\\u{1b}"), "{stdout}");

    // A choice's free text reaches `show` as written.
    let package = prepare::package::open_package(&out).unwrap();
    let choice = fixtures::defaults_choice(
        &package,
        prepare::tune::choice::Tuning::Static,
        prepare::tune::Policy::default(),
        "peer kernels\u{1b}[31m red \u{7}",
    );
    let (code, stdout, stderr) = show_with_choice(scratch.path(), &out, &choice.to_bytes());
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        !stdout.contains('\u{1b}') && !stdout.contains('\u{7}'),
        "{stdout}"
    );
    assert!(stdout.contains("\\u{1b}[31m red \\u{7}"), "{stdout}");
}

/// `prepare show PACKAGE --choice FILE`, FILE holding `choice`, in `dir`.
fn show_with_choice(dir: &Path, package: &Path, choice: &[u8]) -> (Option<i32>, String, String) {
    let file = dir.join("choice.json");
    fs::write(&file, choice).unwrap();
    run_bounded(
        dir,
        &[
            "show",
            package.to_str().unwrap(),
            "--choice",
            file.to_str().unwrap(),
        ],
    )
}

#[test]
fn a_choice_with_a_huge_format_version_is_reported_as_such() {
    let (scratch, out) = scratch_with_package();
    let package = prepare::package::open_package(&out).unwrap();
    let text = String::from_utf8(
        fixtures::defaults_choice(
            &package,
            prepare::tune::choice::Tuning::Static,
            prepare::tune::Policy::default(),
            "t",
        )
        .to_bytes(),
    )
    .unwrap();
    let version = format!(
        "\"format_version\": {},",
        prepare::tune::choice::CHOICE_FORMAT_VERSION
    );
    assert!(text.contains(&version), "{text}");
    let text = text.replacen(&version, "\"format_version\": 1180591620717411303424,", 1);
    let (code, _, stderr) = show_with_choice(scratch.path(), &out, text.as_bytes());
    assert_eq!(code, Some(1), "{stderr}");
    // serde_json holds a number this large as a float, and prints it as one.
    assert!(
        stderr.contains("format_version 1.1805916207174113e+21 is not known"),
        "{stderr}"
    );
    assert!(!stderr.contains("missing"), "{stderr}");
}
