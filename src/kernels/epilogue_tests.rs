//! The kernels of `all_reduce_add_rms_norm`: fused profiles find their kernel by name, separate
//! ones run the all-reduce's, and every package of the collective holds `add_rms_norm`.

use super::spec::{
    add_rms_norm, all_kernels, epilogue_kernel_for, input_access, kernel_for, kernel_named,
    kernels_for_ladder, InputAccess,
};
use crate::ladder::{Collective, Dtype, FusedForm, Ladder, Profile};

fn profile(json: serde_json::Value) -> Profile {
    serde_json::from_value(json).expect("a profile")
}

/// A ladder of `collective` at `world` ranks with these profiles, each a candidate of its one
/// bucket.
fn ladder(collective: Collective, world: u32, profiles: &serde_json::Value) -> Ladder {
    let ids: Vec<serde_json::Value> = profiles
        .as_array()
        .expect("a list")
        .iter()
        .map(|profile| profile["id"].clone())
        .collect();
    serde_json::from_value(serde_json::json!({
        "format_version": 1, "name": "e", "collective": collective, "dtype": "bf16",
        "world_size": world, "targets": ["sm_90"], "profiles": profiles,
        "buckets": [{ "max_bytes": 65536, "threads": 512, "blocks": 8,
                      "candidates": ids, "default": "nccl" }]
    }))
    .expect("a ladder")
}

#[test]
fn a_fused_profile_finds_its_kernel_by_name_in_the_table_or_none() {
    let shapes = [
        (
            FusedForm::OneShotPushLl,
            serde_json::json!({"id": "p", "algorithm": "one_shot", "transfer": "push", "protocol": "ll"}),
        ),
        (
            FusedForm::OneShotPushSimple,
            serde_json::json!({"id": "p", "algorithm": "one_shot", "transfer": "push", "protocol": "simple"}),
        ),
        (
            FusedForm::TwoShot,
            serde_json::json!({"id": "p", "algorithm": "rsag"}),
        ),
    ];
    for dtype in Dtype::ALL {
        for (form, json) in &shapes {
            let name = format!("{}_{}", form.kernel_name(), dtype.name());
            let in_table = all_kernels(dtype, 4)
                .into_iter()
                .find(|spec| spec.name == name);
            let profile = profile(json.clone());
            assert_eq!(epilogue_kernel_for(&profile, dtype, 4), in_table, "{name}");
            assert_eq!(
                kernel_for(&profile, Collective::AllReduceAddRmsNorm, dtype, 4),
                in_table,
                "{name}"
            );
        }
    }
}

#[test]
fn a_separate_profile_runs_the_all_reduce_kernel_of_its_shape_and_nccl_none() {
    let separate = [
        serde_json::json!({"id": "p", "algorithm": "one_shot", "epilogue": "separate"}),
        serde_json::json!({"id": "p", "algorithm": "one_shot", "transfer": "push", "protocol": "ll", "epilogue": "separate"}),
        serde_json::json!({"id": "p", "algorithm": "rsag", "epilogue": "separate"}),
        serde_json::json!({"id": "p", "algorithm": "rsag", "schedule": "phased", "active_clusters": 1, "epilogue": "separate"}),
        serde_json::json!({"id": "p", "algorithm": "one_shot", "transfer": "copy_engine", "epilogue": "separate"}),
    ];
    for json in separate {
        let profile = profile(json.clone());
        let all_reduce = kernel_for(&profile, Collective::AllReduce, Dtype::Fp16, 8);
        assert!(all_reduce.is_some(), "{json}");
        assert_eq!(
            kernel_for(&profile, Collective::AllReduceAddRmsNorm, Dtype::Fp16, 8),
            all_reduce,
            "{json}"
        );
    }
    for json in [
        serde_json::json!({"id": "n", "algorithm": "nccl"}),
        serde_json::json!({"id": "n", "algorithm": "nccl", "order": "rank"}),
    ] {
        let nccl = profile(json);
        assert_eq!(epilogue_kernel_for(&nccl, Dtype::Bf16, 2), None);
    }
    // Neither fused nor separate (validation refuses it): no kernel.
    let neither = profile(serde_json::json!({"id": "p", "algorithm": "one_shot"}));
    assert_eq!(epilogue_kernel_for(&neither, Dtype::Bf16, 2), None);
}

#[test]
fn every_package_of_the_fused_collective_holds_add_rms_norm_and_the_rank_order_sum_as_an_all_reduce_does(
) {
    let names = |ladder: &Ladder| -> Vec<String> {
        kernels_for_ladder(ladder)
            .into_iter()
            .map(|spec| spec.name)
            .collect()
    };
    let nccl_only = serde_json::json!([{"id": "nccl", "algorithm": "nccl"}]);
    let fused = ladder(Collective::AllReduceAddRmsNorm, 2, &nccl_only);
    assert_eq!(names(&fused), ["add_rms_norm_bf16"]);
    assert!(names(&ladder(Collective::AllReduce, 2, &nccl_only)).is_empty());
    for world in 3..=8 {
        let fused = ladder(Collective::AllReduceAddRmsNorm, world, &nccl_only);
        assert_eq!(
            names(&fused),
            ["add_rms_norm_bf16", "nccl_rank_order_sum_bf16"],
            "{world}"
        );
    }
    let rank_order = ladder(
        Collective::AllReduceAddRmsNorm,
        2,
        &serde_json::json!([
            {"id": "nccl", "algorithm": "nccl"},
            {"id": "exact", "algorithm": "nccl", "order": "rank"},
            {"id": "pull", "algorithm": "one_shot", "epilogue": "separate"}
        ]),
    );
    assert_eq!(
        names(&rank_order),
        [
            "add_rms_norm_bf16",
            "all_reduce_one_shot_pull_bf16",
            "nccl_rank_order_sum_bf16"
        ]
    );
    let spec = add_rms_norm(Dtype::Fp32, 6);
    assert_eq!(
        (spec.name.as_str(), spec.source, spec.world, spec.cluster),
        ("add_rms_norm_fp32", "add_rms_norm.cu", 6, false)
    );
}

#[test]
fn the_fused_one_shot_profiles_map_to_their_kernels_by_name() {
    let fused = |json: serde_json::Value| {
        let profile = serde_json::from_value(json).unwrap();
        kernel_for(&profile, Collective::AllReduceAddRmsNorm, Dtype::Bf16, 8)
    };
    for protocol in ["ll", "simple"] {
        let spec = fused(serde_json::json!({
            "id": "p", "algorithm": "one_shot", "transfer": "push", "protocol": protocol
        }))
        .unwrap();
        let name = format!("all_reduce_add_rms_norm_one_shot_push_{protocol}_bf16");
        assert_eq!((spec.name.as_str(), spec.world), (name.as_str(), 8));
        assert_eq!(spec.source, "all_reduce_add_rms_norm_one_shot.cu");
        assert_eq!(input_access(&spec), Some(InputAccess::Local));
        assert!(kernel_named(&spec).scratch.is_double_buffered());
    }
    for (transfer, protocol) in [
        ("push", "barrier"),
        ("pull", "ll"),
        ("copy_engine", "simple"),
    ] {
        let profile = serde_json::json!({
            "id": "p", "algorithm": "one_shot", "transfer": transfer, "protocol": protocol
        });
        assert_eq!(fused(profile), None, "{transfer} {protocol}");
    }
}

#[test]
fn the_fused_collective_takes_the_two_shot_for_a_pulled_rsag_alone() {
    // (algorithm, transfer, protocol, schedule) -> whether the fused two-shot runs it.
    let table = [
        ("rsag", None, None, None, true),
        ("rsag", Some("pull"), None, None, true),
        ("rsag", Some("push"), None, None, false),
        ("rsag", Some("push"), Some("simple"), None, false),
        ("rsag", None, None, Some("phased"), false),
        ("one_shot", Some("pull"), None, None, false),
        ("full", None, None, Some("phased"), false),
        ("nccl", None, None, None, false),
    ];
    for (algorithm, transfer, protocol, schedule, two_shot) in table {
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
            Collective::AllReduceAddRmsNorm,
            Dtype::Fp16,
            6,
        );
        assert_eq!(
            spec.is_some(),
            two_shot,
            "{algorithm} {transfer:?} {protocol:?} {schedule:?}"
        );
        if let Some(spec) = spec {
            assert_eq!(spec.name, "all_reduce_add_rms_norm_two_shot_fp16");
            assert_eq!(
                (spec.source, spec.world, spec.cluster),
                ("all_reduce_add_rms_norm_two_shot.cu", 6, false)
            );
            assert_eq!(
                input_access(&spec),
                Some(InputAccess::Peers {
                    output_may_alias: true
                })
            );
        }
    }
}
