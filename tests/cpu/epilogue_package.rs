//! Packages of `all_reduce_add_rms_norm` written without NVRTC: every candidate says what it
//! runs (fused, or the all-reduce kernel or NCCL's, then `add_rms_norm`) in the manifest, in
//! `prepare show` and in `prepare show --json`, and a manifest that says otherwise is refused.

use std::fs;
use std::path::Path;

use prepare::ladder::Arch;
use prepare::package::{open_package, write_package, PackageError};

use crate::support::cli::run;
use crate::support::fixtures::{compilation, ladder, reseal, scratch, settings};

const LADDER: &str = include_str!("../fixtures/ladders/valid/epilogue_package.json");

/// The package of the separate-candidates fixture for sm_90, written into `out`.
fn write(out: &Path) {
    let ladder = ladder(LADDER);
    write_package(
        out,
        LADDER,
        &ladder,
        &compilation(&ladder, Arch::Sm90),
        Arch::Sm90,
        false,
    )
    .expect("the package writes");
}

#[test]
fn every_candidate_records_the_add_rms_norm_kernel_that_follows_it() {
    let (_scratch, out) = scratch();
    write(&out);
    let package = open_package(&out).expect("the package opens");
    let kernels: Vec<&str> = package
        .manifest()
        .kernels
        .iter()
        .map(|kernel| kernel.name.as_str())
        .collect();
    assert_eq!(
        kernels,
        [
            "add_rms_norm_bf16",
            "all_reduce_one_shot_pull_bf16",
            "all_reduce_rsag_push_bf16",
            "nccl_rank_order_sum_bf16"
        ]
    );
    let records: Vec<(&str, Option<&str>, Option<&str>)> = package
        .manifest()
        .buckets
        .iter()
        .flat_map(|bucket| &bucket.candidates)
        .map(|candidate| {
            (
                candidate.profile.as_str(),
                candidate.kernel.as_deref(),
                candidate.epilogue_kernel.as_deref(),
            )
        })
        .collect();
    let then = Some("add_rms_norm_bf16");
    assert_eq!(
        records,
        [
            ("one_shot_pull", Some("all_reduce_one_shot_pull_bf16"), then),
            ("nccl", None, then),
            ("nccl_rank_order", None, then),
            ("rsag_push", Some("all_reduce_rsag_push_bf16"), then),
            ("nccl", None, then),
        ]
    );
}

#[test]
fn a_manifest_that_drops_or_changes_the_epilogue_kernel_is_refused_with_its_pointer() {
    for (slot, value) in [
        (0, None),
        (1, Some("all_reduce_one_shot_pull_bf16".to_owned())),
    ] {
        let (_scratch, out) = scratch();
        write(&out);
        reseal(&out, |manifest| {
            manifest.buckets[0].candidates[slot].epilogue_kernel = value.clone();
        });
        let error = open_package(&out).unwrap_err();
        let PackageError::ManifestInconsistent { problems, .. } = &error else {
            panic!("{error}");
        };
        assert_eq!(
            problems[0].pointer,
            format!("/buckets/0/candidates/{slot}/epilogue_kernel"),
            "{error}"
        );
    }
}

#[test]
fn show_tags_each_candidate_with_what_it_runs_in_text_and_json() {
    let (_scratch, out) = scratch();
    write(&out);
    let package = out.to_str().unwrap();
    for flags in [&[][..], &["--wide"][..]] {
        let (code, stdout, stderr) = run(&[&["show", package][..], flags].concat());
        assert_eq!((code, stderr.as_str()), (0, ""));
        settings(&out).bind(|| {
            insta::assert_snapshot!(format!("show{}", flags.join("")), stdout);
        });
    }
    let (code, stdout, stderr) = run(&["show", package, "--json"]);
    assert_eq!((code, stderr.as_str()), (0, ""));
    let json: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    let candidates = &json["manifest"]["buckets"][0]["candidates"];
    for slot in 0..3 {
        assert_eq!(
            candidates[slot]["epilogue_kernel"], "add_rms_norm_bf16",
            "{candidates}"
        );
    }
    // No other collective's candidates carry the field.
    let manifest = fs::read_to_string(out.join("manifest.json")).unwrap();
    assert_eq!(manifest.matches("\"epilogue_kernel\"").count(), 5);
}
