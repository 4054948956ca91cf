//! The kernel table's own tests, and the example ladder other modules' tests share.

use super::*;
use std::fmt::Write as _;

pub(in crate::kernels) fn ladder(json: &str) -> Ladder {
    serde_json::from_str(json).unwrap()
}

/// A world-4 ladder like the second example of docs/ladders.md, with every kind of profile.
pub(in crate::kernels) const EXAMPLE: &str = r#"{
    "format_version": 1, "name": "gb202_pcie_tp4_clustered_full", "collective": "all_reduce",
    "dtype": "bf16", "world_size": 4, "targets": ["sm_120", "sm_121"],
    "profiles": [
        { "id": "one_shot_push", "algorithm": "one_shot", "transfer": "push" },
        { "id": "rsag_pull", "algorithm": "rsag", "transfer": "pull" },
        { "id": "rsag_phased", "algorithm": "rsag", "schedule": "phased", "active_clusters": 1 },
        { "id": "full_phased", "algorithm": "full", "schedule": "phased", "active_clusters": 1 },
        { "id": "one_shot_push_again", "algorithm": "one_shot", "transfer": "push", "blocks": 8 },
        { "id": "nccl", "algorithm": "nccl" },
        { "id": "nccl_4cta", "algorithm": "nccl", "max_ctas": 4 }
    ],
    "buckets": [
        { "max_bytes": 16384, "threads": 256, "blocks": 16,
          "candidates": ["one_shot_push", "nccl"], "default": "one_shot_push" },
        { "max_bytes": 98304, "threads": 512, "blocks": 64, "cluster_size": 8,
          "candidates": ["one_shot_push", "rsag_phased", "full_phased", "nccl"], "default": "rsag_phased" },
        { "max_bytes": 1048576, "threads": 512, "blocks": 64,
          "candidates": ["nccl", "nccl_4cta"], "default": "nccl" }
    ]
}"#;

/// The kernel of that entry name (its dtype from the suffix) at `world` ranks.
pub(in crate::kernels) fn spec(name: &str, world: u32) -> KernelSpec {
    Dtype::ALL
        .into_iter()
        .flat_map(|dtype| all_kernels(dtype, world))
        .find(|spec| spec.name == name)
        .unwrap_or_else(|| panic!("no kernel {name}"))
}

#[test]
fn every_profile_shape_maps_to_its_kernel_or_none() {
    let mut table = String::new();
    for algorithm in ["one_shot", "rsag", "full", "nccl"] {
        for transfer in [None, Some("pull"), Some("push"), Some("copy_engine")] {
            for schedule in [None, Some("phased")] {
                let mut profile = serde_json::json!({ "id": "p", "algorithm": algorithm });
                if let Some(transfer) = transfer {
                    profile["transfer"] = transfer.into();
                }
                if let Some(schedule) = schedule {
                    profile["schedule"] = schedule.into();
                }
                let kernel = kernel_for(
                    &serde_json::from_value(profile).unwrap(),
                    Collective::AllReduce,
                    Dtype::Bf16,
                    2,
                );
                writeln!(
                    table,
                    "{algorithm} transfer={} schedule={} -> {}",
                    transfer.unwrap_or("-"),
                    schedule.unwrap_or("-"),
                    kernel.map_or("none".to_owned(), |spec| format!(
                        "{} ({}{})",
                        spec.name,
                        spec.source,
                        if spec.cluster { ", cluster" } else { "" }
                    ))
                )
                .unwrap();
            }
        }
    }
    insta::assert_snapshot!(table);
}

#[test]
fn the_table_serves_every_collective() {
    let ladder = ladder(EXAMPLE);
    for collective in Collective::ALL {
        let served = ladder
            .profiles
            .iter()
            .filter_map(|profile| {
                // The fused collective runs the all-reduce's kernels as separate profiles.
                let mut profile = profile.clone();
                if collective == Collective::AllReduceAddRmsNorm && !profile.is_nccl() {
                    profile.epilogue = Some(crate::ladder::Epilogue::Separate);
                }
                kernel_for(&profile, collective, Dtype::Bf16, 4)
            })
            .count();
        assert!(served > 0, "{collective}");
    }
}

#[test]
fn row_collectives_take_the_one_shot_with_barriers_the_push_ll_and_the_all_gather_copy_engine() {
    // (algorithm, transfer, protocol, schedule) -> the algorithm's kernel, or none.
    let table = [
        ("one_shot", None, None, None, Some("one_shot_pull")),
        ("one_shot", Some("pull"), None, None, Some("one_shot_pull")),
        ("one_shot", Some("push"), None, None, Some("one_shot_push")),
        (
            "one_shot",
            Some("pull"),
            Some("barrier"),
            None,
            Some("one_shot_pull"),
        ),
        (
            "one_shot",
            Some("push"),
            Some("barrier"),
            None,
            Some("one_shot_push"),
        ),
        (
            "one_shot",
            Some("push"),
            Some("ll"),
            None,
            Some("one_shot_push_ll"),
        ),
        ("one_shot", Some("pull"), Some("ll"), None, None),
        ("one_shot", None, Some("ll"), None, None),
        ("one_shot", Some("push"), Some("simple"), None, None),
        ("one_shot", Some("copy_engine"), None, None, None),
        ("one_shot", None, None, Some("phased"), None),
        ("rsag", Some("pull"), None, None, None),
        ("rsag", Some("push"), None, None, None),
        ("rsag", None, None, Some("phased"), None),
        ("full", None, None, Some("phased"), None),
        ("nccl", None, None, None, None),
    ];
    for collective in [Collective::ReduceScatter, Collective::AllGather] {
        for (algorithm, transfer, protocol, schedule, kernel) in table {
            // The all-gather has a copy engine too; the reduce-scatter none.
            let kernel = match (collective, algorithm, transfer, protocol) {
                (Collective::AllGather, "one_shot", Some("copy_engine"), None) => {
                    Some("one_shot_copy_engine")
                }
                _ => kernel,
            };
            let mut profile = serde_json::json!({ "id": "p", "algorithm": algorithm });
            for (key, value) in [
                ("transfer", transfer),
                ("protocol", protocol),
                ("schedule", schedule),
            ] {
                if let Some(value) = value {
                    profile[key] = value.into();
                }
            }
            let spec = kernel_for(
                &serde_json::from_value(profile).unwrap(),
                collective,
                Dtype::Fp32,
                5,
            );
            let expected = kernel.map(|name| format!("{collective}_{name}_fp32"));
            assert_eq!(
                spec.as_ref().map(|spec| spec.name.clone()),
                expected,
                "{collective} {algorithm} {transfer:?} {protocol:?} {schedule:?}"
            );
            if let Some(spec) = spec {
                let source = if protocol == Some("ll") {
                    format!("{}_double_buffered.cu", collective.name())
                } else {
                    format!("{}.cu", collective.name())
                };
                assert_eq!(
                    (spec.source, spec.world, spec.cluster),
                    (source.as_str(), 5, false)
                );
            }
        }
    }
    let access = |name: &str| input_access(&spec(name, 2));
    assert_eq!(
        access("reduce_scatter_one_shot_pull_bf16"),
        Some(InputAccess::Peers {
            output_may_alias: true
        })
    );
    assert_eq!(
        access("all_gather_one_shot_pull_bf16"),
        Some(InputAccess::Peers {
            output_may_alias: false
        })
    );
    for push in [
        "reduce_scatter_one_shot_push_bf16",
        "all_gather_one_shot_push_bf16",
        "reduce_scatter_one_shot_push_ll_bf16",
        "all_gather_one_shot_push_ll_bf16",
    ] {
        assert_eq!(access(push), Some(InputAccess::Local), "{push}");
    }
}

#[test]
fn a_package_holds_the_rank_order_sum_beyond_two_ranks_for_every_reduce_scatter_or_where_a_profile_names_it(
) {
    let rank_order = |json: serde_json::Value| {
        let ladder: Ladder = serde_json::from_value(json).unwrap();
        kernels_for_ladder(&ladder)
            .iter()
            .any(|spec| spec.name.starts_with(RANK_ORDER_SUM))
    };
    let of = |collective: &str, world: u32, order: bool| {
        let mut profile = serde_json::json!({ "id": "nccl", "algorithm": "nccl" });
        if order {
            profile["order"] = "rank".into();
        }
        serde_json::json!({
            "format_version": 1, "name": "n", "collective": collective, "dtype": "fp16",
            "world_size": world, "targets": ["sm_90"], "profiles": [profile],
            "buckets": [{ "max_bytes": 4096, "threads": 32, "blocks": 1,
                          "candidates": ["nccl"], "default": "nccl" }]
        })
    };
    let at = |world: u32, order: bool| of("all_reduce", world, order);
    assert!(!rank_order(at(2, false)));
    assert!(rank_order(at(2, true)));
    for world in 3..=8 {
        assert!(rank_order(at(world, false)), "{world}");
    }
    // A reduce-scatter's uneven rows always go through the sum; an all-gather sums nothing.
    for world in 2..=8 {
        assert!(rank_order(of("reduce_scatter", world, false)), "{world}");
        assert!(!rank_order(of("all_gather", world, false)), "{world}");
    }
    let spec = rank_order_sum(Dtype::Fp16, 5);
    assert_eq!(spec.name, "nccl_rank_order_sum_fp16");
    assert_eq!(spec.source, "nccl_rank_order_sum.cu");
    assert_eq!((spec.world, spec.cluster), (5, false));
    assert_eq!(input_access(&spec), Some(InputAccess::Local));
}

#[test]
fn protocols_map_to_the_double_buffered_kernels() {
    // (algorithm, transfer, protocol, kernel); validation refuses every combination that has
    // none.
    let table = [
        (
            "one_shot",
            "push",
            "barrier",
            Some("all_reduce_one_shot_push_fp16"),
        ),
        (
            "one_shot",
            "push",
            "ll",
            Some("all_reduce_one_shot_push_ll_fp16"),
        ),
        (
            "one_shot",
            "push",
            "simple",
            Some("all_reduce_one_shot_push_simple_fp16"),
        ),
        (
            "rsag",
            "push",
            "simple",
            Some("all_reduce_rsag_push_simple_fp16"),
        ),
        ("rsag", "push", "barrier", None),
        ("rsag", "push", "ll", None),
        ("rsag", "pull", "simple", None),
        ("rsag", "pull", "barrier", None),
    ];
    for (algorithm, transfer, protocol, kernel) in table {
        let profile = serde_json::json!({
            "id": "p", "algorithm": algorithm, "transfer": transfer, "protocol": protocol
        });
        let spec = kernel_for(
            &serde_json::from_value(profile).unwrap(),
            Collective::AllReduce,
            Dtype::Fp16,
            4,
        );
        assert_eq!(
            spec.map(|spec| spec.name).as_deref(),
            kernel,
            "{algorithm} {transfer} {protocol}"
        );
    }
}

#[test]
fn a_ladder_needs_its_distinct_kernels_sorted() {
    let names: Vec<String> = kernels_for_ladder(&ladder(EXAMPLE))
        .into_iter()
        .map(|spec| spec.name)
        .collect();
    assert_eq!(
        names,
        [
            "all_reduce_full_phased_bf16",
            "all_reduce_one_shot_push_bf16",
            "all_reduce_rsag_phased_bf16",
            "all_reduce_rsag_pull_bf16",
            "nccl_rank_order_sum_bf16",
        ]
    );
    for dtype in Dtype::ALL {
        let kernels = all_kernels(dtype, 3);
        assert_eq!(kernels.len(), KERNELS.len());
        assert!(kernels.windows(2).all(|pair| pair[0] < pair[1]));
        assert!(kernels
            .iter()
            .all(|spec| spec.name.ends_with(dtype.name()) && spec.world == 3));
    }
}
