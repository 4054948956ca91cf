//! `prepare show`: tables and JSON of a package written without NVRTC, and refusals.

mod package_support;

use std::fs;

use assert_cmd::Command;
use package_support::{compilation, ladder, scratch, settings, write_fixture, LADDER};
use prepare::device::{DropReason, Residency};
use prepare::ladder::Arch;
use prepare::package::{
    write_qualified_package, BucketQualification, CandidateQualification, Outcome, Qualification,
    QualifiedGpu,
};

fn prepare() -> Command {
    Command::cargo_bin("prepare").expect("the binary builds")
}

/// Runs `prepare` with `args` and returns exit code, stdout and stderr.
fn run(args: &[&str]) -> (i32, String, String) {
    let output = prepare().args(args).output().expect("prepare runs");
    (
        output.status.code().expect("exited"),
        String::from_utf8(output.stdout).expect("UTF-8 stdout"),
        String::from_utf8(output.stderr).expect("UTF-8 stderr"),
    )
}

#[test]
fn show_prints_header_buckets_kernels_and_peer_memory() {
    let (_scratch, out) = scratch();
    write_fixture(&out, Arch::Sm120);
    let (code, stdout, stderr) = run(&["show", out.to_str().unwrap()]);
    assert_eq!((code, stderr.as_str()), (0, ""));
    settings(&out).bind(|| {
        insta::assert_snapshot!(stdout);
    });
}

#[test]
fn show_prints_the_qualification_when_present() {
    let (_scratch, out) = scratch();
    let ladder = ladder(LADDER);
    let qualified = |profile: &str, exact| CandidateQualification {
        profile: profile.into(),
        outcome: Outcome::Qualified { exact },
    };
    let qualification = Qualification {
        gpus: (0..4)
            .map(|index| QualifiedGpu {
                name: "NVIDIA RTX PRO 6000 Blackwell Workstation Edition".into(),
                uuid: format!("GPU-{index}"),
            })
            .collect(),
        driver_version: "580.95.05".into(),
        nccl_version: "2.28.9".into(),
        buckets: vec![
            BucketQualification {
                index: 0,
                candidates: vec![
                    qualified("one_shot_push", true),
                    CandidateQualification {
                        profile: "one_shot_pull_32".into(),
                        outcome: Outcome::Dropped(DropReason::NotExact {
                            message: "rank 2 differed at element 17".into(),
                        }),
                    },
                    qualified("nccl", false),
                ],
            },
            BucketQualification {
                index: 1,
                candidates: vec![
                    qualified("one_shot_push", true),
                    CandidateQualification {
                        profile: "rsag_phased".into(),
                        outcome: Outcome::Dropped(DropReason::NotResident {
                            needed: Residency::Clusters(8),
                            resident: Residency::Clusters(6),
                        }),
                    },
                    qualified("nccl", true),
                    qualified("nccl_4cta", true),
                ],
            },
        ],
    };
    write_qualified_package(
        &out,
        LADDER,
        &ladder,
        &compilation(&ladder, Arch::Sm120),
        Arch::Sm120,
        Some(qualification),
        false,
    )
    .unwrap();
    let (code, stdout, stderr) = run(&["show", out.to_str().unwrap()]);
    assert_eq!((code, stderr.as_str()), (0, ""));
    let qualification = &stdout[stdout
        .find("Qualification")
        .expect("a qualification section")..];
    insta::assert_snapshot!(qualification);
}

#[test]
fn show_json_prints_the_identity_and_the_manifest() {
    let (_scratch, out) = scratch();
    let summary = write_fixture(&out, Arch::Sm120);
    let (code, stdout, stderr) = run(&["show", "--json", out.to_str().unwrap()]);
    assert_eq!((code, stderr.as_str()), (0, ""));
    let document: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(document["identity"], summary.identity.as_str());
    let manifest: serde_json::Value =
        serde_json::from_slice(&fs::read(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(document["manifest"], manifest);
    let schema = prepare::schema::SchemaName::Show.generate();
    let validator = jsonschema::validator_for(&schema).unwrap();
    assert!(
        validator.is_valid(&document),
        "the document fits its schema"
    );
    settings(&out).bind(|| {
        insta::assert_snapshot!(stdout.lines().take(5).collect::<Vec<_>>().join("\n"));
    });
}

#[test]
fn show_refuses_a_changed_file_naming_it() {
    let (_scratch, out) = scratch();
    write_fixture(&out, Arch::Sm120);
    let cubin = out.join("kernels/all_reduce_rsag_phased_bf16.sm_120.cubin");
    let mut bytes = fs::read(&cubin).unwrap();
    bytes[100] ^= 0x80;
    fs::write(&cubin, bytes).unwrap();
    let (code, stdout, stderr) = run(&["show", out.to_str().unwrap()]);
    assert_eq!((code, stdout.as_str()), (1, ""));
    settings(&out).bind(|| {
        insta::assert_snapshot!(stderr);
    });
}

#[test]
fn show_refuses_what_is_not_a_package() {
    let (scratch, out) = scratch();
    let (code, _, stderr) = run(&["show", out.to_str().unwrap()]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "error: cannot open the package {}: ",
            out.display()
        )),
        "{stderr}"
    );

    fs::create_dir(&out).unwrap();
    let (code, _, stderr) = run(&["show", out.to_str().unwrap()]);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(
        stderr,
        format!(
            "error: {} is not a package: it has no manifest.json\n",
            out.display()
        )
    );
    drop(scratch);
}
