//! `prepare export` of `all_reduce_add_rms_norm` ladders with NVRTC: the summary says what each
//! candidate runs, and a fused profile whose kernel the table lacks is refused by name.

use prepare::kernels::{all_kernels, epilogue_kernel_for};
use prepare::ladder::{validate_ladder_file, FusedForm};

use super::support::require_nvrtc;
use crate::support::cli::{export_args, run_in};
use crate::support::repository::root;

#[test]
fn the_export_summary_lists_the_candidates_by_what_they_run() {
    require_nvrtc!();
    let scratch = tempfile::tempdir().unwrap();
    let ladder = root().join("tests/fixtures/ladders/valid/epilogue_package.json");
    let (code, stdout, stderr) = run_in(
        scratch.path(),
        &export_args(ladder.to_str().unwrap(), "pkg", &["--arch", "sm_90"]),
    );
    assert_eq!((code, stderr.as_str()), (0, ""), "{stdout}");
    assert!(
        stdout.contains(
            "\n  the all-reduce kernel, then add_rms_norm: one_shot_pull, rsag_push\n  NCCL's \
             all-reduce, then add_rms_norm: nccl, nccl_rank_order\n"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("  kernels   4\n"), "{stdout}");
}

/// Every fused form is exported once its kernel is in the table, and refused naming its
/// profile (exit 1, nothing written) while it is not.
#[test]
fn a_fused_profile_exports_exactly_when_the_table_has_its_kernel() {
    require_nvrtc!();
    let file = root().join("tests/fixtures/ladders/valid/all_reduce_add_rms_norm.json");
    let ladder = validate_ladder_file(&file).unwrap();
    let missing: Vec<&str> = ladder
        .profiles
        .iter()
        .filter(|profile| {
            profile.fused_shape().is_some()
                && !profile.has_separate_epilogue()
                && epilogue_kernel_for(profile, ladder.dtype, ladder.world_size).is_none()
        })
        .map(|profile| profile.id.as_str())
        .collect();
    let in_table = FusedForm::ALL.iter().all(|form| {
        all_kernels(ladder.dtype, ladder.world_size)
            .iter()
            .any(|spec| spec.name == format!("{}_{}", form.kernel_name(), ladder.dtype))
    });
    assert_eq!(missing.is_empty(), in_table, "{missing:?}");
    let scratch = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = run_in(
        scratch.path(),
        &export_args(file.to_str().unwrap(), "pkg", &["--arch", "sm_90"]),
    );
    if let Some(first) = missing.first() {
        assert_eq!(code, 1, "{stdout}{stderr}");
        assert!(
            stderr.contains(&format!("no kernel implements profile `{first}` for bf16")),
            "{stderr}"
        );
        assert!(!scratch.path().join("pkg").exists());
    } else {
        assert_eq!((code, stderr.as_str()), (0, ""), "{stdout}");
        assert!(
            stdout.contains(
                "\n  fused: fused_ll, fused_simple, fused_two_shot, fused_two_shot_pull\n"
            ),
            "{stdout}"
        );
    }
}
