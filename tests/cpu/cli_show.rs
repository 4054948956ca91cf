//! `prepare show`: tables and JSON of a package written without NVRTC, a choice shown with
//! its package, and refusals.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use prepare::cache::Fingerprint;
use prepare::ladder::Arch;
use prepare::package::{open_package, write_package};
use prepare::tune::choice::{write_choice, BucketChoice, Choice, Tuning, CHOICE_FORMAT_VERSION};
use prepare::tune::{decide, BucketSamples, CandidateSamples, Policy};

use crate::support::cli::run;
use crate::support::fixtures::{
    compilation, ladder, mixed_qualification, regex_escape, scratch, settings, try_write_fixture,
    write_fixture,
};
use crate::support::repository;
use crate::support::timings::Noise;

/// `prepare show PACKAGE FLAGS`, which must succeed without a word on stderr; returns stdout.
fn shown(package: &Path, flags: &[&str]) -> String {
    let mut args = vec!["show", package.to_str().unwrap()];
    args.extend_from_slice(flags);
    let (code, stdout, stderr) = run(&args);
    assert_eq!((code, stderr.as_str()), (0, ""), "{args:?}");
    stdout
}

#[test]
fn show_prints_header_buckets_kernels_and_peer_memory() {
    let (_scratch, out) = scratch();
    write_fixture(&out, Arch::Sm120);
    let stdout = shown(&out, &[]);
    settings(&out).bind(|| {
        insta::assert_snapshot!(stdout);
    });
}

/// Every line of `prepare show`'s tables, for every shipped ladder's package for each of its
/// targets, fits 100 columns; `--wide` prints each bucket on one line with every candidate.
#[test]
fn show_fits_100_columns_for_every_shipped_ladder() {
    for file in repository::json_files("ladders") {
        let text = fs::read_to_string(&file).expect("the shipped ladder reads");
        let shipped = ladder(&text);
        for &arch in &shipped.targets {
            let (_scratch, out) = scratch();
            let compilation = compilation(&shipped, arch);
            write_package(&out, &text, &shipped, &compilation, arch, false).unwrap();
            let package = out.to_str().unwrap();
            let (code, stdout, stderr) = run(&["show", package]);
            assert_eq!((code, stderr.as_str()), (0, ""), "{}", shipped.name);
            for line in stdout.lines() {
                assert!(
                    line.chars().count() <= 100,
                    "{} for {arch}: {} columns: {line}",
                    shipped.name,
                    line.chars().count()
                );
            }
            let (code, wide, _) = run(&["show", "--wide", package]);
            assert_eq!(code, 0);
            let rows: Vec<&str> = wide
                .lines()
                .skip_while(|line| *line != "Buckets")
                .skip(2)
                .take(shipped.buckets.len())
                .collect();
            for (bucket, row) in shipped.buckets.iter().zip(&rows) {
                let candidates = row.split_once("  ").map_or("", |(_, rest)| rest);
                for candidate in &bucket.candidates {
                    assert!(candidates.contains(candidate.as_str()), "{row}");
                }
            }
        }
    }
}

#[test]
fn show_wide_puts_each_bucket_and_decision_on_one_line() {
    let (scratch, out) = scratch();
    write_fixture(&out, Arch::Sm120);
    let (path, _) = write_choice_file(scratch.path(), &out, &fixture_choice(&out));
    let (code, stdout, stderr) = run(&["show", "--wide", out.to_str().unwrap(), "--choice", &path]);
    assert_eq!((code, stderr.as_str()), (0, ""));
    let buckets = &stdout[stdout.find("Buckets").unwrap()..stdout.find("\nKernels").unwrap()];
    insta::assert_snapshot!(buckets);
    assert!(
        stdout
            .lines()
            .any(|line| line.starts_with("1  (16 KiB, 96 KiB]")
                && line.ends_with("faster than rsag_phased by 17.6% (p<0.0001 at 96 KiB)")),
        "{stdout}"
    );
}

#[test]
fn show_prints_the_qualification_when_present() {
    let (_scratch, out) = scratch();
    try_write_fixture(&out, Arch::Sm120, Some(mixed_qualification()), false).unwrap();
    let stdout = shown(&out, &[]);
    let qualification = &stdout[stdout
        .find("Qualification")
        .expect("a qualification section")..];
    insta::assert_snapshot!(qualification);
}

/// How a synthetic candidate fares: timed around a median, or dropped before timing.
#[derive(Debug, Clone, Copy)]
enum Fate<'a> {
    /// Microseconds per operation around `center`, spread by `jitter` (relative).
    Timed {
        center: f64,
        jitter: f64,
        exact: bool,
    },
    /// Dropped with this reason.
    Dropped(&'a str),
}

/// A choice for the package in `dir`, decided by the library from synthetic samples (every
/// rank, 20 rounds, at each bucket's smallest and largest message) with each candidate's fate
/// given by `fate(bucket max_bytes, message bytes, profile)`; a candidate dropped at either
/// size is dropped.
fn synthetic_choice(dir: &Path, fate: impl Fn(u64, u64, &str) -> Fate<'static>) -> Choice {
    let package = open_package(dir).expect("the package opens");
    let manifest = package.manifest();
    let world_size = manifest.ladder.world_size;
    let mut noise = Noise(7);
    let samples: Vec<BucketSamples> = manifest
        .buckets
        .iter()
        .map(|bucket| {
            let mut sizes = vec![bucket.min_bytes, bucket.max_bytes];
            sizes.dedup();
            let candidates = bucket
                .candidates
                .iter()
                .map(|candidate| {
                    let profile = candidate.profile.clone();
                    let fates: Vec<Fate> = sizes
                        .iter()
                        .map(|&bytes| fate(bucket.max_bytes, bytes, &candidate.profile))
                        .collect();
                    if let Some(reason) = fates.iter().find_map(|fate| match fate {
                        Fate::Dropped(reason) => Some(*reason),
                        Fate::Timed { .. } => None,
                    }) {
                        return CandidateSamples {
                            profile,
                            dropped: Some(reason.to_owned()),
                            exact: !reason.starts_with("not exact"),
                            samples: Vec::new(),
                        };
                    }
                    let mut exact = true;
                    let samples = fates
                        .iter()
                        .map(|fate| {
                            let Fate::Timed {
                                center,
                                jitter,
                                exact: exact_here,
                            } = *fate
                            else {
                                unreachable!("dropped candidates returned above")
                            };
                            exact &= exact_here;
                            noise.samples(center, jitter, world_size as usize, 20)
                        })
                        .collect();
                    CandidateSamples {
                        profile,
                        dropped: None,
                        exact,
                        samples,
                    }
                })
                .collect();
            BucketSamples {
                index: bucket.index,
                default: bucket.default.clone(),
                sizes,
                candidates,
            }
        })
        .collect();
    let policy = Policy::default();
    let decisions =
        decide(&samples, world_size as usize, &policy).expect("every bucket has a timed candidate");
    // Above the ladder: NCCL on the whole message against the largest bucket's winner in
    // pieces, at twice its largest message, with the same fates.
    let last = decisions.last().expect("the package has a bucket");
    let largest = manifest
        .buckets
        .last()
        .expect("the package has a bucket")
        .max_bytes;
    let above_samples = |profile: &str, noise: &mut Noise| {
        let Fate::Timed {
            center,
            jitter,
            exact,
        } = fate(largest, largest, profile)
        else {
            panic!("{profile} is timed in the largest bucket")
        };
        CandidateSamples {
            profile: profile.to_owned(),
            dropped: None,
            exact,
            samples: vec![noise.samples(2.0 * center, jitter, world_size as usize, 20)],
        }
    };
    let above = prepare::tune::decide_bucket(
        &BucketSamples {
            index: manifest.buckets.len(),
            default: "nccl".to_owned(),
            sizes: vec![2 * largest],
            candidates: vec![
                above_samples("nccl", &mut noise),
                above_samples(&last.winner, &mut noise),
            ],
        },
        world_size as usize,
        &policy,
    )
    .expect("both were timed");
    let above_ladder = prepare::pieces::route_of(above, 2 * largest);
    let fingerprint = Fingerprint {
        package: package.identity().to_owned(),
        tool_version: prepare::TOOL_VERSION.to_owned(),
        gpu_names: vec!["NVIDIA H200".to_owned(); world_size as usize],
        gpu_uuids: (0..world_size).map(|rank| format!("GPU-{rank}")).collect(),
        driver_version: "580.95.05".to_owned(),
        nccl_version: "2.28.9".to_owned(),
        world_size,
        topology: "peer_kernels".to_owned(),
        nccl_settings: BTreeMap::new(),
        margin: policy.margin,
        exact_only: policy.exact_only,
    };
    Choice {
        format_version: CHOICE_FORMAT_VERSION,
        tool_version: prepare::TOOL_VERSION.to_owned(),
        package: package.identity().to_owned(),
        ladder: manifest.ladder.name.clone(),
        world_size,
        fingerprint: fingerprint.key(),
        topology: "peer_kernels".to_owned(),
        tuning: Tuning::Runtime,
        policy,
        buckets: manifest
            .buckets
            .iter()
            .zip(decisions)
            .map(|(bucket, decision)| BucketChoice {
                min_bytes: bucket.min_bytes,
                max_bytes: bucket.max_bytes,
                decision,
            })
            .collect(),
        above_ladder,
    }
}

/// The fixture package's choice: in bucket 0 the default is fastest, one kernel was not exact
/// and NCCL (at four ranks) sums in its own order; in bucket 1 one-shot push beats the
/// default, the cluster kernel, at both edges.
fn fixture_choice(dir: &Path) -> Choice {
    synthetic_choice(dir, |max_bytes, bytes, profile| {
        // Microseconds at the bucket's smallest and largest message.
        let timed = |smallest: f64, largest: f64, exact| Fate::Timed {
            center: if bytes == max_bytes {
                largest
            } else {
                smallest
            },
            jitter: 0.03,
            exact,
        };
        match (max_bytes, profile) {
            (16_384, "one_shot_push") => timed(4.1, 6.1, true),
            (16_384, "one_shot_pull_32") => {
                Fate::Dropped("not exact: rank 2 differed at element 17")
            }
            (16_384, "nccl") => timed(9.8, 10.4, false),
            (_, "one_shot_push") => timed(6.3, 9.2, true),
            (_, "rsag_phased") => timed(7.0, 11.2, true),
            (_, "nccl") => timed(10.6, 11.3, false),
            (_, "nccl_4cta") => timed(10.9, 11.6, false),
            (_, "nccl_symmetric") => timed(10.7, 11.4, false),
            other => panic!("no fate for {other:?}"),
        }
    })
}

/// Writes `choice` next to the package and returns its path and snapshot settings that also
/// hide the choice's path.
fn write_choice_file(scratch: &Path, package: &Path, choice: &Choice) -> (String, insta::Settings) {
    let path = write_choice(scratch, 0, choice).expect("the choice writes");
    let path = path.to_str().expect("a UTF-8 path").to_owned();
    let mut settings = settings(package);
    settings.add_filter(&regex_escape(&path), "[choice]");
    (path, settings)
}

/// The fixture package with its [`fixture_choice`] written beside it: the scratch directory, the
/// package, the choice, the choice file and snapshot settings that hide both paths.
fn fixture_and_choice() -> (tempfile::TempDir, PathBuf, Choice, String, insta::Settings) {
    let (scratch, out) = scratch();
    write_fixture(&out, Arch::Sm120);
    let choice = fixture_choice(&out);
    let (path, settings) = write_choice_file(scratch.path(), &out, &choice);
    (scratch, out, choice, path, settings)
}

#[test]
fn show_prints_a_choice_after_the_package() {
    let (_scratch, out, _, path, settings) = fixture_and_choice();
    let stdout = shown(&out, &["--choice", &path]);
    let plain = shown(&out, &[]);
    assert!(
        stdout.starts_with(&plain),
        "the package's tables come first, unchanged"
    );
    settings.bind(|| {
        insta::assert_snapshot!(stdout);
    });
}

/// Every bucket of the shipped H200 TP2 ladder (4 to 10 candidates each), with every kind of
/// reason: one table of decisions, one of timings with the bucket index on each bucket's first
/// row.
#[test]
fn show_prints_a_choice_for_every_shipped_bucket_readably() {
    let (scratch, out) = scratch();
    let text = fs::read_to_string(repository::root().join("ladders/h200_nvlink_tp2.json"))
        .expect("the shipped ladder reads");
    let shipped = ladder(&text);
    write_package(
        &out,
        &text,
        &shipped,
        &compilation(&shipped, Arch::Sm90),
        Arch::Sm90,
        false,
    )
    .expect("the package writes");
    // Latency plus bytes over bandwidth (bytes per microsecond), shaped like 2x H200 NV18.
    let choice = synthetic_choice(&out, |max_bytes, bytes, profile| {
        let (latency, bandwidth, jitter) = match profile {
            "one_shot_pull" => (5.3, 280_000.0, 0.02),
            "one_shot_ll" => (3.8, 78_000.0, 0.02),
            // Faster by more than the margin, but too noisy to be significant.
            "one_shot_ll_64" if max_bytes == 131_072 => (2.9, 80_000.0, 0.35),
            "one_shot_ll_64" => (3.7, 80_000.0, 0.02),
            "one_shot_ll_128" => (3.75, 82_000.0, 0.02),
            "one_shot_simple" => (5.6, 330_000.0, 0.02),
            "one_shot_simple_wide" => (6.0, 340_000.0, 0.02),
            "one_shot_simple_256" => (6.5, 350_000.0, 0.02),
            "one_shot_push" => (5.1, 270_000.0, 0.25),
            "one_shot_pull_32" if max_bytes == 65_536 => {
                return Fate::Dropped("capture failed: CUDA_ERROR_OUT_OF_MEMORY")
            }
            "one_shot_pull_32" => (5.45, 200_000.0, 0.02),
            "rsag_pull" => (7.6, 400_000.0, 0.02),
            "rsag_push" => (7.4, 380_000.0, 0.02),
            "rsag_pull_wide" => (8.2, 415_000.0, 0.02),
            "rsag_simple_256" => (9.5, 430_000.0, 0.02),
            "nccl" => (10.0, 300_000.0, 0.02),
            other => panic!("no fate for {other}"),
        };
        Fate::Timed {
            center: latency + bytes as f64 / bandwidth,
            jitter,
            exact: true,
        }
    });
    let (path, settings) = write_choice_file(scratch.path(), &out, &choice);
    let stdout = shown(&out, &["--choice", &path]);
    let section = &stdout[stdout.find("\nChoice\n").expect("a choice section") + 1..];
    for line in section.lines() {
        assert!(line.chars().count() <= 100, "{line}");
    }
    settings.bind(|| {
        insta::assert_snapshot!(section);
    });
}

#[test]
fn show_json_holds_the_choice_as_read() {
    let (_scratch, out, choice, path, settings) = fixture_and_choice();
    let stdout = shown(&out, &["--json", "--choice", &path]);
    let document: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let file: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    assert_eq!(document["choice"], file);
    let schema = prepare::schema::SchemaName::Show.generate();
    let validator = jsonschema::validator_for(&schema).unwrap();
    assert!(
        validator.is_valid(&document),
        "the document fits its schema"
    );
    let description: prepare::show::Description = serde_json::from_value(document).unwrap();
    assert_eq!(description.choice, Some(choice));
    settings.bind(|| {
        insta::assert_snapshot!(serde_json::to_string_pretty(&file).unwrap());
    });
}

#[test]
fn show_refuses_a_choice_for_another_package_naming_both() {
    let (scratch, out) = scratch();
    let shown = write_fixture(&out, Arch::Sm120);
    let other = scratch.path().join("other");
    write_fixture(&other, Arch::Sm121);
    let choice = fixture_choice(&other);
    let path = write_choice(scratch.path(), 0, &choice).unwrap();
    for json in [false, true] {
        let mut args = vec![
            "show",
            out.to_str().unwrap(),
            "--choice",
            path.to_str().unwrap(),
        ];
        if json {
            args.push("--json");
        }
        let (code, stdout, stderr) = run(&args);
        assert_eq!((code, stdout.as_str()), (1, ""), "{stderr}");
        assert_eq!(
            stderr,
            format!(
                "error: {} is a choice for package {}, not for {} (identity {}): a choice belongs to the one package it was made for\n",
                path.display(),
                choice.package,
                out.display(),
                shown.identity
            )
        );
        assert_ne!(choice.package, shown.identity);
    }
}

#[test]
fn show_refuses_an_unreadable_or_invalid_choice_naming_the_file() {
    let (scratch, out) = scratch();
    write_fixture(&out, Arch::Sm120);
    let path = scratch.path().join("choice.json");
    let file = path.display();
    // `prepare show` of the package with the choice at `path`: refused with nothing on stdout,
    // saying what starts with `start` on stderr. Returns stderr.
    let refused = |start: &str| {
        let (code, stdout, stderr) = run(&[
            "show",
            out.to_str().unwrap(),
            "--choice",
            path.to_str().unwrap(),
        ]);
        assert_eq!((code, stdout.as_str()), (1, ""), "{stderr}");
        assert!(stderr.starts_with(start), "{stderr}");
        stderr
    };

    refused(&format!("error: cannot read the choice {file}: "));

    fs::write(&path, "{ \"format_version\": 1, ").unwrap();
    refused(&format!("error: {file} is not a valid choice: "));

    let mut value = serde_json::to_value(fixture_choice(&out)).unwrap();
    value["buckets"][1]["max_bytes"] = 65_536.into();
    fs::write(&path, serde_json::to_vec(&value).unwrap()).unwrap();
    let stderr = refused(&format!("error: {file} is not a valid choice: "));
    assert_eq!(
        stderr,
        format!(
            "error: {file} is not a valid choice: /buckets/1: bucket 1 covers 16386-65536 bytes, but its package's bucket 1 covers 16386-98304\n"
        )
    );
}

#[test]
fn show_json_prints_the_identity_and_the_manifest() {
    let (_scratch, out) = scratch();
    let summary = write_fixture(&out, Arch::Sm120);
    let stdout = shown(&out, &["--json"]);
    let document: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(document["identity"], summary.identity.as_str());
    let manifest: serde_json::Value =
        serde_json::from_slice(&fs::read(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(document["manifest"], manifest);
    assert_eq!(document["manifest"]["ladder"]["collective"], "all_reduce");
    assert_eq!(document["choice"], serde_json::Value::Null);
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

#[test]
fn show_refuses_a_choice_whose_winner_is_not_a_candidate_of_its_bucket() {
    let (scratch, out) = scratch();
    write_fixture(&out, Arch::Sm120);
    let mut choice = fixture_choice(&out);
    choice.buckets[0].decision.winner = "no_such_profile".to_owned();
    let path = write_choice(scratch.path(), 0, &choice).unwrap();
    let (code, stdout, stderr) = run(&[
        "show",
        out.to_str().unwrap(),
        "--choice",
        path.to_str().unwrap(),
    ]);
    assert_eq!((code, stdout.as_str()), (1, ""), "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "error: {} is not a valid choice: /buckets/0/decision/winner: `no_such_profile` is \
             not one of bucket 0's candidates (",
            path.display()
        )),
        "{stderr}"
    );
}
