//! Shared fixtures for package tests: a ladder with ordinary, clustered and NCCL candidates,
//! and a compilation with fake cubins built from the kernel table, so packages can be written
//! and read without NVRTC.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use prepare::compile::{Compilation, CompiledKernel};
use prepare::device::{DropReason, Residency};
use prepare::kernels::kernels_for_ladder;
use prepare::ladder::{Arch, Ladder};
use prepare::package::{
    open_package, write_qualified_package, BucketQualification, CandidateQualification, Manifest,
    Outcome, Package, PackageError, PackageSummary, Qualification, QualifiedGpu,
};

/// A TP4 GB202 ladder (tests/fixtures/ladders/valid/package_fixture.json): an unclustered
/// bucket (one profile with its own block count), a clustered bucket with a cluster kernel and an
/// ordinary kernel under cluster scheduling.
pub const LADDER: &str = include_str!("../fixtures/ladders/valid/package_fixture.json");

/// Parses a fixture ladder.
pub fn ladder(text: &str) -> Ladder {
    serde_json::from_str(text).expect("fixture ladders parse")
}

/// A compilation of every kernel a package of the ladder holds (`kernels_for_ladder`, as an
/// export compiles), with fake cubins that differ per kernel and architecture.
pub fn compilation(ladder: &Ladder, arch: Arch) -> Compilation {
    let mut kernels = BTreeMap::new();
    for spec in kernels_for_ladder(ladder) {
        let mut cubin = b"\x7fELF fake cubin ".to_vec();
        cubin.extend_from_slice(spec.name.as_bytes());
        cubin.extend_from_slice(arch.name().as_bytes());
        cubin.extend((0..=255u8).cycle().take(300));
        let registers = 32 + spec.name.len() as u32;
        kernels.insert(
            spec.name.clone(),
            CompiledKernel {
                name: spec.name,
                source: spec.source.to_string(),
                cluster: spec.cluster,
                arch,
                cubin,
                registers,
                shared_bytes: if spec.cluster { 16 * 1024 } else { 0 },
                spill_store_bytes: 0,
                spill_load_bytes: 0,
                stack_bytes: 8,
            },
        );
    }
    Compilation {
        nvrtc_version: (13, 0),
        options: vec![
            format!("--gpu-architecture={arch}"),
            "-std=c++17".to_string(),
            "--ptxas-options=-v".to_string(),
        ],
        kernels: kernels.into_values().collect(),
    }
}

/// Writes the fixture ladder's package for `arch` into `out`, with `qualification` in its
/// manifest when given, replacing a package there when `force`.
pub fn try_write_fixture(
    out: &Path,
    arch: Arch,
    qualification: Option<Qualification>,
    force: bool,
) -> Result<PackageSummary, PackageError> {
    let ladder = ladder(LADDER);
    write_qualified_package(
        out,
        LADDER,
        &ladder,
        &compilation(&ladder, arch),
        arch,
        qualification,
        force,
    )
}

/// Writes the fixture ladder's package for `arch` into `out`.
pub fn write_fixture(out: &Path, arch: Arch) -> PackageSummary {
    try_write_fixture(out, arch, None, false).expect("the fixture package writes")
}

/// The fixture ladder's package for sm_120, written into a scratch directory and opened.
pub fn opened_fixture() -> (tempfile::TempDir, Package) {
    let (scratch, out) = scratch();
    write_fixture(&out, Arch::Sm120);
    let package = open_package(&out).expect("the fixture package opens");
    (scratch, package)
}

/// Rewrites the manifest of the package at `dir` with `change` and reseals its checksum, as
/// someone who knows the format would.
pub fn reseal(dir: &Path, change: impl FnOnce(&mut Manifest)) {
    let path = dir.join("manifest.json");
    let mut manifest: Manifest =
        serde_json::from_slice(&std::fs::read(&path).expect("the manifest reads"))
            .expect("the manifest parses");
    change(&mut manifest);
    manifest.seal();
    std::fs::write(&path, manifest.to_bytes()).expect("the manifest writes");
}

/// A qualification of the fixture ladder on `gpus` GPUs, every candidate qualified exact.
pub fn qualification(gpus: usize) -> Qualification {
    let ladder = ladder(LADDER);
    Qualification {
        gpus: (0..gpus)
            .map(|index| QualifiedGpu {
                name: "NVIDIA RTX PRO 6000 Blackwell Workstation Edition".into(),
                uuid: format!("GPU-{index}"),
            })
            .collect(),
        driver_version: "580.95.05".into(),
        nccl_version: "2.28.9".into(),
        buckets: ladder
            .buckets
            .iter()
            .enumerate()
            .map(|(index, bucket)| BucketQualification {
                index,
                candidates: bucket
                    .candidates
                    .iter()
                    .map(|profile| CandidateQualification {
                        profile: profile.clone(),
                        outcome: Outcome::Qualified { exact: true },
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// The fixture ladder qualified on four GPUs with every kind of outcome: in bucket 0
/// `one_shot_pull_32` is dropped, not exact, and NCCL qualifies but is not exact; in bucket 1
/// `rsag_phased` is dropped, its clusters not all resident.
pub fn mixed_qualification() -> Qualification {
    let mut qualification = qualification(4);
    let buckets = &mut qualification.buckets;
    buckets[0].candidates[1].outcome = Outcome::Dropped(DropReason::NotExact {
        message: "rank 2 differed at element 17".into(),
    });
    buckets[0].candidates[2].outcome = Outcome::Qualified { exact: false };
    buckets[1].candidates[1].outcome = Outcome::Dropped(DropReason::NotResident {
        needed: Residency::Clusters(8),
        resident: Residency::Clusters(6),
    });
    qualification
}

/// Every file under `dir`, relative and `/`-separated, with its bytes.
pub fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, files: &mut BTreeMap<String, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).expect("directory lists") {
            let path = entry.expect("entry reads").path();
            if path.is_dir() {
                walk(root, &path, files);
            } else {
                let relative = path.strip_prefix(root).expect("under root");
                let relative = relative
                    .components()
                    .map(|part| part.as_os_str().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join("/");
                files.insert(relative, std::fs::read(&path).expect("file reads"));
            }
        }
    }
    let mut files = BTreeMap::new();
    walk(dir, dir, &mut files);
    files
}

/// Names in a directory, sorted.
pub fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("directory lists")
        .map(|entry| {
            entry
                .expect("entry reads")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

/// A scratch directory and a package path inside it.
pub fn scratch() -> (tempfile::TempDir, PathBuf) {
    let scratch = tempfile::tempdir().expect("temporary directory");
    let out = scratch.path().join("pkg");
    (scratch, out)
}

/// Snapshot settings for command output: the package path, every sha256 and the tool version
/// are replaced.
pub fn settings(package: &Path) -> insta::Settings {
    let mut settings = insta::Settings::clone_current();
    settings.add_filter(&regex_escape(&package.display().to_string()), "[package]");
    settings.add_filter("[0-9a-f]{64}", "[sha256]");
    settings.add_filter(&regex_escape(prepare::TOOL_VERSION), "[tool version]");
    settings
}

/// Escapes regular expression metacharacters.
pub fn regex_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for character in text.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(character) {
            escaped.push('\\');
        }
        escaped.push(character);
    }
    escaped
}

/// A fingerprint for test choices.
pub const CHOICE_KEY: &str = "5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed";

/// A candidate of choice format 1, timed at its bucket's largest message only, as a choice of
/// that format held it.
pub fn format_1_candidate(profile: &str) -> serde_json::Value {
    serde_json::json!({
        "profile": profile,
        "exact": true,
        "status": "timed",
        "median_us": 5.5,
        "min_us": 5.25,
        "max_us": 6.0,
        "rounds": 30
    })
}

/// A candidate timed at one size, at 5 us.
pub fn timed_candidate(profile: &str, bytes: u64, exact: bool) -> prepare::tune::CandidateResult {
    use prepare::tune::{CandidateOutcome, CandidateResult, SizeFigures};
    CandidateResult {
        profile: profile.to_owned(),
        exact,
        outcome: CandidateOutcome::Timed {
            slowdown: 1.0,
            sizes: vec![SizeFigures {
                bytes,
                median_us: 5.0,
                min_us: 4.0,
                max_us: 6.0,
                rounds: 25,
            }],
        },
    }
}

/// A choice of every bucket's default for the package under `CHOICE_KEY`: runtime tuning with
/// every candidate timed and exact, or static tuning with none.
pub fn defaults_choice(
    package: &prepare::package::Package,
    tuning: prepare::tune::choice::Tuning,
    policy: prepare::tune::Policy,
    topology: &str,
) -> prepare::tune::choice::Choice {
    use prepare::tune::choice::{BucketChoice, Choice, Tuning, CHOICE_FORMAT_VERSION};
    use prepare::tune::{BucketDecision, DecisionReason};
    let ladder = package.ladder();
    Choice {
        format_version: CHOICE_FORMAT_VERSION,
        tool_version: prepare::TOOL_VERSION.to_owned(),
        package: package.identity().to_owned(),
        ladder: ladder.name.clone(),
        world_size: ladder.world_size,
        fingerprint: CHOICE_KEY.to_owned(),
        topology: topology.to_owned(),
        tuning,
        policy,
        buckets: ladder
            .buckets
            .iter()
            .enumerate()
            .map(|(index, bucket)| BucketChoice {
                min_bytes: ladder.bucket_min_bytes(index),
                max_bytes: bucket.max_bytes,
                decision: BucketDecision {
                    index,
                    winner: bucket.default.clone(),
                    baseline: bucket.default.clone(),
                    reason: DecisionReason::BaselineFastest,
                    bit_exact: true,
                    candidates: match tuning {
                        Tuning::Runtime => bucket
                            .candidates
                            .iter()
                            .map(|profile| timed_candidate(profile, bucket.max_bytes, true))
                            .collect(),
                        Tuning::Static => Vec::new(),
                    },
                },
            })
            .collect(),
        above_ladder: prepare::pieces::nccl_untimed(match tuning {
            Tuning::Runtime => "the largest bucket's default was taken untimed",
            Tuning::Static => "static tuning, nothing timed",
        }),
    }
}
