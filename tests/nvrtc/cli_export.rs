//! `prepare export` and `prepare show` with NVRTC: every shipped ladder for each of its
//! targets. Skips when NVRTC is missing unless `PREPARE_REQUIRE_NVRTC=1`, which CI sets so that
//! these tests can never pass by skipping.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use prepare::kernels::kernels_for_ladder;
use prepare::ladder::{validate_ladder_file, Ladder};
use prepare::package::open_package;

use super::support::require_nvrtc;
use crate::support::cli::{export_args, prepare, run_in};
use crate::support::fixtures::{self, files, names, settings};
use crate::support::repository;

fn shipped_ladders() -> Vec<(PathBuf, Ladder)> {
    repository::json_files("ladders")
        .into_iter()
        .map(|file| {
            let ladder = validate_ladder_file(&file).unwrap();
            (file, ladder)
        })
        .collect()
}

/// `prepare export` of `ladder` for `arch` into `out` in `dir`, replacing a package there when
/// `force`; returns exit code, stdout and stderr.
fn export(dir: &Path, ladder: &Path, arch: &str, out: &str, force: bool) -> (i32, String, String) {
    let flags: &[&str] = if force {
        &["--arch", arch, "--force"]
    } else {
        &["--arch", arch]
    };
    run_in(dir, &export_args(ladder.to_str().unwrap(), out, flags))
}

/// [`export`] of the shipped ladder `name` for sm_90 into `out` in `dir`, which must succeed
/// without a word on stderr; returns stdout.
fn exported(dir: &Path, name: &str, out: &str, force: bool) -> String {
    let ladder = repository::root()
        .join("ladders")
        .join(format!("{name}.json"));
    let (code, stdout, stderr) = export(dir, &ladder, "sm_90", out, force);
    assert_eq!((code, stderr.as_str()), (0, ""), "{name} to {out}");
    stdout
}

/// Register counts and cubin sizes change with every kernel edit and are checked above; the
/// snapshots pin the rest, for the NVRTC wheel CI installs.
fn show_settings(package: &Path) -> insta::Settings {
    let mut settings = settings(package);
    settings.add_filter(
        r"(?m)^(all_reduce_\w+(?: \[cluster kernel\])?) +\d+ ",
        "$1  [registers] ",
    );
    settings.add_filter(
        r"(?m) +\d+(?:\.\d)? (?:B|KiB|MiB)  (all_reduce_\w+\.cu)$",
        "  [cubin size]  $1",
    );
    settings
}

/// Packages whose `prepare show` output is pinned by a snapshot.
const SHOWN: [(&str, &str); 2] = [
    ("h200_nvlink_tp2_clustered", "sm_90"),
    ("gb202_pcie_tp4_clustered_full", "sm_121"),
];

#[test]
fn every_shipped_ladder_exports_for_each_of_its_targets_and_shows() {
    require_nvrtc!();
    let scratch = tempfile::tempdir().unwrap();
    let mut exported = Vec::new();
    for (file, ladder) in shipped_ladders() {
        for arch in &ladder.targets {
            let out = format!("{}.{arch}", ladder.name);
            let (code, stdout, stderr) = export(scratch.path(), &file, arch.name(), &out, false);
            assert_eq!((code, stderr.as_str()), (0, ""), "{out}");

            let package = open_package(&scratch.path().join(&out)).unwrap();
            let mut summary = format!(
                "Exported `{}` for {arch} to {out}\n  identity  {}\n  kernels   {}\n  buckets   {}\n",
                ladder.name,
                package.identity(),
                package.kernels().count(),
                ladder.buckets.len()
            );
            // An all-reduce + RMSNorm ladder's profiles, by what they run.
            for (form, ids) in prepare::ladder::epilogue_forms(&ladder) {
                let _ = writeln!(summary, "  {}: {}", form.describe(), ids.join(", "));
            }
            assert_eq!(stdout, summary);
            assert_eq!(package.ladder(), &ladder);
            assert_eq!(
                fs::read(scratch.path().join(&out).join("ladder.json")).unwrap(),
                fs::read(&file).unwrap(),
                "ladder.json is the ladder file's bytes"
            );
            let expected: Vec<String> = kernels_for_ladder(&ladder)
                .into_iter()
                .map(|spec| spec.name)
                .collect();
            let found: Vec<String> = package
                .kernels()
                .map(|(record, _)| record.name.clone())
                .collect();
            assert_eq!(found, expected, "{out}");
            for (record, cubin) in package.kernels() {
                assert!(
                    cubin.starts_with(b"\x7fELF"),
                    "{out}: {} is an ELF cubin",
                    record.name
                );
                assert!(
                    record.registers > 0,
                    "{out}: {} uses registers",
                    record.name
                );
                // The kernels must fit their registers: a spill to local memory costs every
                // launch.
                assert_eq!(
                    (record.spill_store_bytes, record.spill_load_bytes),
                    (0, 0),
                    "{out}: {} spills",
                    record.name
                );
            }
            assert_eq!(package.manifest().compiler.nvrtc_version, "13.0");

            // Every line of `show` fits 100 columns with the real kernels' figures too.
            let (code, stdout, stderr) = run_in(scratch.path(), &["show", &out]);
            assert_eq!((code, stderr.as_str()), (0, ""));
            for line in stdout.lines() {
                assert!(line.chars().count() <= 100, "{out}: {line}");
            }
            if SHOWN.contains(&(ladder.name.as_str(), arch.name())) {
                show_settings(Path::new(&out)).bind(|| {
                    insta::assert_snapshot!(format!("show_{out}"), stdout);
                });
            }
            exported.push(out);
        }
    }
    exported.sort();
    assert_eq!(
        names(scratch.path()),
        exported,
        "nothing else is left behind"
    );
}

#[test]
fn export_is_deterministic_and_force_replaces_atomically() {
    require_nvrtc!();
    let scratch = tempfile::tempdir().unwrap();
    let tp2 = repository::root().join("ladders/h200_nvlink_tp2.json");
    let tp4 = repository::root().join("ladders/h200_nvlink_tp4.json");
    exported(scratch.path(), "h200_nvlink_tp2", "first", false);
    exported(scratch.path(), "h200_nvlink_tp2", "second", false);
    let first = files(&scratch.path().join("first"));
    assert_eq!(
        first,
        files(&scratch.path().join("second")),
        "same inputs, same bytes"
    );

    // The same export again is up to date: nothing is written, not even the same bytes.
    let inode = |dir: &str| {
        std::os::unix::fs::MetadataExt::ino(&fs::metadata(scratch.path().join(dir)).unwrap())
    };
    let before = inode("first");
    let (code, stdout, stderr) = export(scratch.path(), &tp2, "sm_90", "first", false);
    assert_eq!((code, stderr.as_str()), (0, ""));
    assert!(
        stdout.starts_with(
            "Up to date: `h200_nvlink_tp2` for sm_90 at first is the package this export \
             writes; nothing was written\n  identity  "
        ),
        "{stdout}"
    );
    assert_eq!(inode("first"), before, "the package was not replaced");
    assert_eq!(files(&scratch.path().join("first")), first);

    let (code, _, stderr) = export(scratch.path(), &tp4, "sm_90", "first", false);
    assert_eq!(code, 1, "{stderr}");
    let ladder_sha = |path: &Path| {
        let mut sha256 = prepare::hash::sha256_hex(&fs::read(path).unwrap());
        sha256.truncate(12);
        sha256
    };
    assert_eq!(
        stderr,
        format!(
            "error: first holds another package than this export writes: its ladder is \
             `h200_nvlink_tp2` (sha256 {}), this export's `h200_nvlink_tp4` (sha256 {}); pass \
             --force to replace it\n",
            ladder_sha(&tp2),
            ladder_sha(&tp4)
        )
    );
    assert_eq!(
        files(&scratch.path().join("first")),
        first,
        "the old package stays"
    );

    let stdout = exported(scratch.path(), "h200_nvlink_tp4", "first", true);
    assert!(
        stdout.starts_with(
            "Exported `h200_nvlink_tp4` for sm_90 to first (replaced the previous package)\n"
        ),
        "{stdout}"
    );
    let package = open_package(&scratch.path().join("first")).unwrap();
    assert_eq!(package.ladder().name, "h200_nvlink_tp4");
    assert_eq!(
        names(scratch.path()),
        ["first", "second"],
        "nothing else is left behind"
    );
}

/// A package of the same ladder, tool, architecture and options whose cubins are not the ones
/// NVRTC compiles is refused after compiling, naming the kernels.
#[test]
fn another_compilation_at_the_output_is_refused_naming_the_kernels() {
    require_nvrtc!();
    let scratch = tempfile::tempdir().unwrap();
    let ladder_file = scratch.path().join("ladder.json");
    fs::write(&ladder_file, fixtures::LADDER).unwrap();
    let ladder = fixtures::ladder(fixtures::LADDER);
    let arch = prepare::ladder::Arch::Sm120;
    let mut compilation = fixtures::compilation(&ladder, arch);
    compilation.options = prepare::compile::compile_options(arch);
    let out = scratch.path().join("pkg");
    prepare::package::write_package(&out, fixtures::LADDER, &ladder, &compilation, arch, false)
        .unwrap();
    let before = files(&out);
    let (code, stdout, stderr) = export(scratch.path(), &ladder_file, "sm_120", "pkg", false);
    assert_eq!((code, stdout.as_str()), (1, ""), "{stderr}");
    assert_eq!(
        stderr,
        "error: pkg holds another package than this export writes: its kernels differ: \
         all_reduce_one_shot_pull_bf16 (another cubin), all_reduce_one_shot_push_bf16 (another \
         cubin), all_reduce_rsag_phased_bf16 (another cubin), nccl_rank_order_sum_bf16 (another \
         cubin); pass --force to replace it\n"
    );
    assert_eq!(files(&out), before, "the package there stays as it was");
}

/// A kill at each step of `--force` (injected by `PREPARE_FAULT`, which builds with the
/// `testing` feature read, in either profile) leaves `--out` holding a whole package, the old
/// one or the new one, never nothing; the next export to the same place removes what the killed
/// one left.
#[test]
fn a_kill_at_any_step_of_force_leaves_a_whole_package_in_place() {
    require_nvrtc!();
    let scratch = tempfile::tempdir().unwrap();
    let tp4 = repository::root().join("ladders/h200_nvlink_tp4.json");
    exported(scratch.path(), "h200_nvlink_tp2", "pkg", false);
    // Each step starts from the tp2 package: written first, then by the export that cleans up.
    for (step, expected) in [
        ("staged", "h200_nvlink_tp2"),
        ("exchanged", "h200_nvlink_tp4"),
    ] {
        let output = prepare()
            .current_dir(scratch.path())
            .env("PREPARE_FAULT", step)
            .args(export_args(
                tp4.to_str().unwrap(),
                "pkg",
                &["--arch", "sm_90", "--force"],
            ))
            .output()
            .unwrap();
        assert_eq!(
            output.status.code(),
            None,
            "{step}: the export is killed there: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let package = open_package(&scratch.path().join("pkg")).unwrap();
        assert_eq!(package.ladder().name, expected, "{step}");
        assert!(
            names(scratch.path()).len() > 1,
            "{step}: the killed export leaves its staging or the old package"
        );
        exported(scratch.path(), "h200_nvlink_tp2", "pkg", true);
        assert_eq!(names(scratch.path()), ["pkg"], "{step}: leftovers removed");
    }
}

/// Exports racing to one new directory, several levels deep so that making it takes a while:
/// every round leaves the package, one export writes it and the other finds it up to date, and
/// nothing else is left behind.
#[test]
fn two_exports_to_one_new_directory_keep_one_package() {
    require_nvrtc!();
    let scratch = tempfile::tempdir().unwrap();
    let ladder = repository::root().join("tests/fixtures/ladders/valid/minimal.json");
    let binary = assert_cmd::cargo::cargo_bin("prepare");
    let rounds = 24;
    let mut lost = Vec::new();
    for round in 0..rounds {
        let out = format!("race{round}/{}pkg", "level/".repeat(200));
        let racers: Vec<_> = (0..2)
            .map(|_| {
                std::process::Command::new(&binary)
                    .current_dir(scratch.path())
                    .args(export_args(
                        ladder.to_str().unwrap(),
                        &out,
                        &["--arch", "sm_90"],
                    ))
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let outputs: Vec<_> = racers
            .into_iter()
            .map(|racer| racer.wait_with_output().unwrap())
            .collect();
        let said = || {
            outputs
                .iter()
                .map(|output| {
                    format!(
                        "{:?} {}{}",
                        output.status.code(),
                        String::from_utf8_lossy(&output.stdout).replace(&out, "OUT"),
                        String::from_utf8_lossy(&output.stderr).replace(&out, "OUT")
                    )
                })
                .collect::<Vec<_>>()
        };
        match open_package(&scratch.path().join(&out)) {
            Ok(package) => assert_eq!(package.ladder().name, "minimal"),
            Err(error) => {
                lost.push(format!("round {round}: {error}: {:?}", said()));
                continue;
            }
        }
        let mut headlines: Vec<String> = outputs
            .iter()
            .map(|output| {
                let stdout = String::from_utf8_lossy(&output.stdout);
                assert!(
                    output.status.success() && output.stderr.is_empty(),
                    "round {round}: {:?}",
                    said()
                );
                stdout
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .replace(&out, "OUT")
            })
            .collect();
        headlines.sort();
        assert_eq!(
            headlines,
            [
                "Exported `minimal` for sm_90 to OUT",
                "Up to date: `minimal` for sm_90 at OUT is the package this export writes; \
                 nothing was written",
            ],
            "round {round}"
        );
        assert_eq!(
            names(scratch.path().join(&out).parent().unwrap()),
            ["pkg"],
            "round {round}: nothing but the package is left"
        );
    }
    assert!(
        lost.is_empty(),
        "{} of {rounds} rounds left no package:\n{}",
        lost.len(),
        lost.join("\n")
    );
}

/// The path given to `--out` is printed escaped, as ladder names are, in the line that names
/// the package written and in the one that finds it up to date.
#[test]
fn an_output_with_control_characters_is_printed_escaped() {
    require_nvrtc!();
    let scratch = tempfile::tempdir().unwrap();
    let ladder = repository::root().join("tests/fixtures/ladders/valid/minimal.json");
    let out = "y\u{1b}]0;title\u{7}";
    for headline in [
        "Exported `minimal` for sm_90 to y\\u{1b}]0;title\\u{7}\n",
        "Up to date: `minimal` for sm_90 at y\\u{1b}]0;title\\u{7} is the package this export \
         writes; nothing was written\n",
    ] {
        let (code, stdout, stderr) = export(scratch.path(), &ladder, "sm_90", out, false);
        assert_eq!((code, stderr.as_str()), (0, ""));
        assert!(stdout.starts_with(headline), "{stdout:?}");
        assert!(
            !stdout.contains(['\u{1b}', '\u{7}']),
            "a raw control character: {stdout:?}"
        );
    }
    assert_eq!(names(scratch.path()), [out]);
}

/// A reduce-scatter ladder of NCCL candidates only exports end to end beyond two ranks (NVRTC
/// compiles the rank-order sum for sm_121), and `show`, in text and in `--json`, says the
/// collective.
#[test]
fn an_nccl_only_reduce_scatter_ladder_exports_and_shows_its_collective() {
    require_nvrtc!();
    let scratch = tempfile::tempdir().unwrap();
    let name = "gb10_roce_tp3_reduce_scatter_fp32";
    let ladder = repository::root()
        .join("ladders")
        .join(format!("{name}.json"));
    let (code, stdout, stderr) = export(scratch.path(), &ladder, "sm_121", "rs", false);
    assert_eq!((code, stderr.as_str()), (0, ""));
    assert!(
        stdout.starts_with(&format!("Exported `{name}` for sm_121 to rs\n")),
        "{stdout}"
    );
    let (kernels, shown) = shown_package(
        scratch.path(),
        "rs",
        &format!("{name}: reduce_scatter, fp32, 3 ranks"),
    );
    assert_eq!(kernels, ["nccl_rank_order_sum_fp32"]);
    assert_eq!(
        shown["manifest"]["ladder"]["collective"], "reduce_scatter",
        "{shown}"
    );
    assert_eq!(shown["manifest"]["ladder"]["name"], name);
}

/// The kernels of the package exported to `out` in `dir`, and its `show --json`, once its
/// `show` text has a Ladder line ending in `header`.
fn shown_package(dir: &Path, out: &str, header: &str) -> (Vec<String>, serde_json::Value) {
    let package = open_package(&dir.join(out)).unwrap();
    let kernels = package
        .kernels()
        .map(|(record, _)| record.name.clone())
        .collect();
    let (code, text, stderr) = run_in(dir, &["show", out]);
    assert_eq!((code, stderr.as_str()), (0, ""));
    assert!(
        text.lines()
            .any(|line| line.starts_with("Ladder") && line.ends_with(header)),
        "{text}"
    );
    let (code, json, stderr) = run_in(dir, &["show", "--json", out]);
    assert_eq!((code, stderr.as_str()), (0, ""));
    (kernels, serde_json::from_str(&json).unwrap())
}

/// An all-gather ladder exports its one-shot kernels, one per transfer and protocol whatever
/// the blocks, and `show`, in text and in `--json`, says the collective.
#[test]
fn an_all_gather_ladder_exports_and_shows_its_collective() {
    require_nvrtc!();
    let scratch = tempfile::tempdir().unwrap();
    let name = "h200_nvlink_tp2_all_gather";
    let stdout = exported(scratch.path(), name, "ag", false);
    assert!(
        stdout.starts_with(&format!("Exported `{name}` for sm_90 to ag\n")),
        "{stdout}"
    );
    let (kernels, shown) = shown_package(
        scratch.path(),
        "ag",
        &format!("{name}: all_gather, bf16, 2 ranks"),
    );
    assert_eq!(
        kernels,
        [
            "all_gather_one_shot_pull_bf16",
            "all_gather_one_shot_push_bf16",
            "all_gather_one_shot_push_ll_bf16"
        ]
    );
    let ladder = &shown["manifest"]["ladder"];
    assert_eq!(ladder["collective"], "all_gather", "{shown}");
    assert_eq!(ladder["name"], name);
    assert_eq!(ladder["dtype"], "bf16");
    assert_eq!(ladder["world_size"], 2);
    let shown_kernels: Vec<&str> = shown["manifest"]["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|record| record["name"].as_str().unwrap())
        .collect();
    assert_eq!(shown_kernels, kernels, "{shown}");
}
