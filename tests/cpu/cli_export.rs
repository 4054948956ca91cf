//! `prepare export` refusals, which need no NVRTC: each exits with its code, says what is
//! wrong, and leaves nothing behind.

use std::fs;
use std::path::Path;

use prepare::ladder::Arch;
use prepare::package::write_qualified_package;

use crate::support::cli::{export_args, run_in};
use crate::support::fixtures::{
    compilation, files, ladder, names, qualification, write_fixture, LADDER,
};
use crate::support::repository::{json_files, root};

/// `prepare export --collective-ladder ladder.json` with `flags`, in `dir`.
fn export_ladder(dir: &Path, flags: &[&str]) -> (i32, String, String) {
    run_in(
        dir,
        &[&["export", "--collective-ladder", "ladder.json"], flags].concat(),
    )
}

/// A scratch directory holding the GB202 fixture ladder as `ladder.json`.
fn scratch_with_ladder() -> tempfile::TempDir {
    let scratch = tempfile::tempdir().expect("temporary directory");
    fs::write(scratch.path().join("ladder.json"), LADDER).unwrap();
    scratch
}

/// `prepare export` of `ladder` to `pkg` with `flags`, in `dir`: it must exit with `code`,
/// print nothing on stdout and leave `dir` as it was. Returns what it printed on stderr.
fn refused_export_in(dir: &Path, ladder: &str, flags: &[&str], code: i32) -> String {
    let before = names(dir);
    let (found, stdout, stderr) = run_in(dir, &export_args(ladder, "pkg", flags));
    assert_eq!(
        (found, stdout.as_str()),
        (code, ""),
        "{ladder} {flags:?}: {stderr}"
    );
    assert_eq!(
        names(dir),
        before,
        "{ladder} {flags:?} leaves something behind"
    );
    stderr
}

/// [`refused_export_in`] of the fixture ladder, in a scratch directory holding it alone.
fn refused_export(flags: &[&str], code: i32) -> String {
    let scratch = scratch_with_ladder();
    refused_export_in(scratch.path(), "ladder.json", flags, code)
}

#[test]
fn an_architecture_the_ladder_does_not_target_is_refused_and_leaves_nothing() {
    insta::assert_snapshot!(refused_export(&["--arch", "sm_90"], 1));
}

#[test]
fn without_an_architecture_export_says_to_name_one() {
    insta::assert_snapshot!(refused_export(&[], 2));
}

#[test]
fn gpus_without_a_driver_fail_at_run_time_and_leave_nothing() {
    insta::assert_snapshot!(refused_export(&["--gpus", "0,1"], 3));
}

#[test]
fn unknown_architectures_and_conflicting_flags_are_usage_errors() {
    let scratch = scratch_with_ladder();
    let flags: [&[&str]; 2] = [
        &["--arch", "sm_99", "--out", "pkg"],
        &["--arch", "sm_120", "--gpus", "0", "--out", "pkg"],
    ];
    for flags in flags {
        let (code, _, stderr) = export_ladder(scratch.path(), flags);
        assert_eq!(code, 2, "{flags:?}: {stderr}");
    }
    let (code, _, stderr) = run_in(
        scratch.path(),
        &["export", "--arch", "sm_120", "--out", "pkg"],
    );
    assert_eq!(code, 2, "{stderr}");
    let (_, _, stderr) = export_ladder(scratch.path(), &["--arch", "sm_99", "--out", "pkg"]);
    assert!(
        stderr.contains("unknown architecture; expected one of sm_80, sm_86, sm_89, sm_90, sm_100, sm_120, sm_121"),
        "{stderr}"
    );
    refused_export(&["--arch", "sm_120", "--gpus", "0"], 2);
    let scratch = tempfile::tempdir().unwrap();
    let (code, _, stderr) = run_in(
        scratch.path(),
        &["export", "--arch", "sm_120", "--out", "pkg"],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(names(scratch.path()).is_empty());
}

#[test]
fn an_existing_output_is_refused_before_compiling() {
    let scratch = scratch_with_ladder();
    fs::create_dir(scratch.path().join("pkg")).unwrap();
    fs::write(scratch.path().join("pkg/keep.txt"), "keep").unwrap();
    let (code, _, stderr) = export_ladder(scratch.path(), &["--arch", "sm_120", "--out", "pkg"]);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(
        stderr,
        "error: refusing to replace pkg: it holds keep.txt and no readable manifest.json (No such \
         file or directory (os error 2)); --force replaces only an empty directory or a package \
         prepare wrote, with nothing else in it\n"
    );
    assert_eq!(names(&scratch.path().join("pkg")), ["keep.txt"]);
}

#[test]
fn another_package_at_the_output_is_refused_before_compiling_naming_what_differs() {
    let scratch = scratch_with_ladder();
    let out = scratch.path().join("pkg");
    write_fixture(&out, Arch::Sm120);
    let before = files(&out);

    let (code, stdout, stderr) =
        export_ladder(scratch.path(), &["--arch", "sm_121", "--out", "pkg"]);
    assert_eq!((code, stdout.as_str()), (1, ""), "{stderr}");
    assert!(
        stderr.starts_with("error: pkg holds another package than this export writes: "),
        "{stderr}"
    );
    assert!(
        stderr.contains("it is for sm_120, this export for sm_121; "),
        "{stderr}"
    );
    assert!(
        stderr.ends_with("; pass --force to replace it\n"),
        "{stderr}"
    );

    // Another ladder: both are named, with their sha256.
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("ladders/gb202_pcie_tp4.json");
    fs::copy(shipped, scratch.path().join("ladder.json")).unwrap();
    let (code, _, stderr) = export_ladder(scratch.path(), &["--arch", "sm_120", "--out", "pkg"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("its ladder is `test_tp4_clustered` (sha256 "),
        "{stderr}"
    );
    assert!(
        stderr.contains("this export's `gb202_pcie_tp4` (sha256 "),
        "{stderr}"
    );
    assert!(!stderr.contains("it is for"), "{stderr}");
    assert_eq!(files(&out), before, "the package there stays as it was");
}

#[test]
fn a_qualified_package_is_not_the_one_an_export_without_gpus_writes() {
    let scratch = scratch_with_ladder();
    let out = scratch.path().join("pkg");
    let ladder = ladder(LADDER);
    let mut compilation = compilation(&ladder, Arch::Sm120);
    compilation.options = prepare::compile::compile_options(Arch::Sm120);
    write_qualified_package(
        &out,
        LADDER,
        &ladder,
        &compilation,
        Arch::Sm120,
        Some(qualification(4)),
        false,
    )
    .unwrap();
    let (code, _, stderr) = export_ladder(scratch.path(), &["--arch", "sm_120", "--out", "pkg"]);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(
        stderr,
        "error: pkg holds another package than this export writes: it was qualified on 4 GPUs \
         (GPU-0, GPU-1, GPU-2, GPU-3), this export qualifies on none; pass --force to replace \
         it\n"
    );
}

#[test]
fn a_missing_ladder_is_refused_naming_it() {
    let scratch = tempfile::tempdir().unwrap();
    let stderr = refused_export_in(scratch.path(), "absent.json", &["--arch", "sm_120"], 1);
    assert!(
        stderr.starts_with("error: cannot read ladder absent.json: "),
        "{stderr}"
    );
}

#[test]
fn an_invalid_ladder_is_refused_with_the_report_of_prepare_validate() {
    let root = root();
    let scratch = tempfile::tempdir().unwrap();
    for fixture in [
        "cluster_size_without_512_threads.json",
        "json_syntax__trailing_comma.json",
        "unknown_field__typo.json",
    ] {
        let ladder = root.join("tests/fixtures/ladders/invalid").join(fixture);
        let ladder = ladder.to_str().unwrap();
        let stderr = refused_export_in(scratch.path(), ladder, &["--arch", "sm_90"], 1);
        let (_, report, _) = run_in(scratch.path(), &["validate", ladder]);
        let diagnostics: Vec<&str> = report.lines().skip(1).collect();
        assert!(!diagnostics.is_empty(), "{fixture}: {report}");
        assert_eq!(
            stderr.lines().skip(1).collect::<Vec<_>>(),
            diagnostics,
            "{fixture}"
        );
        assert!(
            stderr.starts_with(&format!("error: {ladder} is not a valid ladder: ")),
            "{stderr}"
        );
    }
}

#[test]
fn a_shipped_gb202_ladder_for_sm_90_is_refused_naming_the_rule() {
    let scratch = tempfile::tempdir().unwrap();
    let gb202 = json_files("ladders").into_iter().filter(|file| {
        file.file_name()
            .and_then(|name| name.to_str())
            .is_some_and(|name| name.starts_with("gb202_"))
    });
    for file in gb202 {
        let ladder = file.file_stem().unwrap().to_str().unwrap();
        let stderr = refused_export_in(
            scratch.path(),
            file.to_str().unwrap(),
            &["--arch", "sm_90"],
            1,
        );
        assert_eq!(
            stderr,
            format!("error: ladder {ladder} targets sm_120, sm_121 only, not sm_90 [architecture_not_targeted]\n")
        );
    }
}
