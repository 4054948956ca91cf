//! Every planted mutation (tests/support/mutations.rs) compiles with NVRTC for sm_90 into a
//! package of the ladder the GPU mutation tests use, and changes the cubins of exactly the
//! kernels it touches, so a GPU run of its package tests the planted bug and nothing else. Skips when NVRTC is
//! missing unless `PREPARE_REQUIRE_NVRTC=1`, which CI sets so that a missing library fails
//! instead.

use std::collections::BTreeMap;
use std::path::Path;

use prepare::compile::{compile_kernels_with_sources, SourceOverrides};
use prepare::gpu::nvrtc::Nvrtc;
use prepare::kernels::{all_kernels, kernels_for_ladder, KernelSpec};
use prepare::ladder::{validate_ladder_file, Arch, Dtype};
use prepare::package::open_package;
use prepare::progress::Silent;

use super::support::{every_kernel, require_nvrtc};
use crate::support::mutations::{apply, mutated_package, overrides, Mutation};
use crate::support::repository;

const LADDER: &str = "ladders/h200_nvlink_tp2.json";

/// Each kernel's cubin in the package at `dir`, by kernel name.
fn package_cubins(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let package = open_package(dir).unwrap_or_else(|error| panic!("{error}"));
    package
        .kernels()
        .map(|(record, cubin)| (record.name.clone(), cubin.to_vec()))
        .collect()
}

/// The cubins of `kernels` compiled from `sources` for sm_90, by kernel name.
fn compiled_cubins(
    nvrtc: &Nvrtc,
    kernels: &[KernelSpec],
    sources: &SourceOverrides,
) -> BTreeMap<String, Vec<u8>> {
    compile_kernels_with_sources(nvrtc, kernels, Arch::Sm90, sources, &Silent)
        .unwrap_or_else(|error| panic!("{error}"))
        .kernels
        .into_iter()
        .map(|kernel| (kernel.name, kernel.cubin))
        .collect()
}

#[test]
fn every_mutation_patches_real_text_in_the_files_it_names() {
    for mutation in Mutation::ALL.into_iter().chain(Mutation::OF_THE_CHECKS) {
        let files = apply(mutation);
        assert!(!files.is_empty(), "{mutation} patches nothing");
        let names: Vec<&str> = files.iter().map(|(file, _)| file.as_str()).collect();
        let expected: &[&str] = match mutation {
            Mutation::NoStartBarrier => &["all_reduce_one_shot.cu"],
            Mutation::NoLineWait | Mutation::NoStepWait => &["prepare_double_buffer.cuh"],
            Mutation::NoCopyStart => &["prepare_copy_engine.cuh"],
            Mutation::ShapeCheckSkipped => &["prepare_sync.cuh"],
            Mutation::DropTail | Mutation::RowBoundaryOffByOne => &["prepare_layout.cuh"],
            Mutation::RowOutOfOrder => &["reduce_scatter.cu"],
            Mutation::SkipRowPeer => &["all_gather.cu"],
            Mutation::ShortRankRows => &["prepare_phases.cuh"],
            Mutation::SquaresOutOfOrder
            | Mutation::NoEps
            | Mutation::WeightSkipped
            | Mutation::ResidualBeforeRounding => &["prepare_norm.cuh"],
            _ => &["prepare_element.cuh"],
        };
        assert_eq!(names, expected, "{mutation}");
        assert_eq!(
            overrides(mutation).files().collect::<Vec<_>>(),
            expected,
            "{mutation}"
        );
    }
    let names: Vec<&str> = Mutation::ALL
        .iter()
        .map(|mutation| mutation.name())
        .collect();
    assert_eq!(
        names,
        [
            "skip_peer",
            "truncate",
            "drop_tail",
            "no_start_barrier",
            "double_count",
            "no_line_wait",
            "no_step_wait",
            "no_copy_start",
            "squares_out_of_order",
            "no_eps",
            "weight_skipped",
            "residual_before_rounding",
            "row_out_of_order",
            "skip_row_peer",
            "short_rank_rows",
            "row_boundary_off_by_one"
        ]
    );
}

#[test]
fn every_mutation_builds_and_changes_exactly_the_kernels_it_touches() {
    let nvrtc = require_nvrtc!();
    let ladder = repository::root().join(LADDER);
    let needed: Vec<String> = kernels_for_ladder(&validate_ladder_file(&ladder).unwrap())
        .into_iter()
        .map(|spec| spec.name)
        .collect();
    // Every kernel from the unmutated sources, in the compile the NVRTC tests share; those the
    // ladder does not need (the cluster kernels) are compiled on their own below.
    let original: BTreeMap<String, Vec<u8>> = every_kernel(nvrtc, Arch::Sm90)
        .kernels
        .iter()
        .map(|kernel| (kernel.name.clone(), kernel.cubin.clone()))
        .collect();
    let others: Vec<KernelSpec> = all_kernels(Dtype::Bf16, 2)
        .into_iter()
        .filter(|spec| !needed.contains(&spec.name))
        .collect();
    assert!(!others.is_empty());
    let dir = tempfile::tempdir().unwrap();

    for mutation in Mutation::ALL.into_iter().chain(Mutation::OF_THE_CHECKS) {
        let package = mutated_package(mutation, &ladder, Arch::Sm90, dir.path());
        assert_eq!(package, dir.path().join(mutation.name()));
        let mutated = package_cubins(&package);
        assert_eq!(
            mutated.keys().collect::<Vec<_>>(),
            needed.iter().collect::<Vec<_>>(),
            "{mutation}"
        );
        let touched_others: Vec<KernelSpec> = others
            .iter()
            .filter(|spec| mutation.kernels().contains(&spec.name))
            .cloned()
            .collect();
        let mutated_others = compiled_cubins(nvrtc, &touched_others, &overrides(mutation));
        for (name, cubin) in mutated.iter().chain(&mutated_others) {
            let before = &original[name];
            if mutation.kernels().contains(name) {
                assert_ne!(cubin, before, "{mutation} leaves {name}'s cubin unchanged");
            } else {
                assert_eq!(
                    cubin, before,
                    "{mutation} changes {name}, which it should not touch"
                );
            }
        }
        let checked = mutated.len() + mutated_others.len();
        assert!(
            mutation
                .kernels()
                .iter()
                .filter(|name| name.ends_with("_bf16"))
                .all(|name| mutated.contains_key(name) || mutated_others.contains_key(name)),
            "{mutation}: a kernel it touches was not compiled ({checked} were)"
        );
    }
}
