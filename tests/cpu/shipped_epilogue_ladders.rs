//! The shipped all-reduce + residual add + RMSNorm catalogs (H200 NVLink at 2, 4 and 8 ranks in
//! bf16 and fp16) are shaped as documented: the all-reduce catalogs' boundaries and geometry
//! (buckets by rows x hidden bytes, hidden 7,168 from one decode row to prefill sizes), a fused
//! and an unfused candidate in every bucket, the fused one-shots where the all-reduce's
//! one-shots go, the fused two-shot everywhere, the all-reduce catalog's custom candidates of
//! the bucket as separate ones, NCCL exact at every world (plain at two ranks, the rank-order
//! one beyond), every candidate exact, defaults the fused form of the all-reduce's default that
//! static tuning keeps, and twins in bf16 and fp16 alike.

use prepare::kernels::kernels_for_ladder;
use prepare::ladder::{
    is_exact, Collective, Dtype, Epilogue, EpilogueForm, FusedForm, Ladder, Profile,
};
use prepare::tune::{decide_static, Policy};

use super::shipped_ladders::{
    epilogue_catalogs, ladder, largest_message, static_samples, EPILOGUE, MIB,
    SMALLEST_SERVING_MESSAGE,
};

/// Bytes of one row of hidden 7,168 in bf16 and fp16.
const ROW_BYTES: u64 = 7168 * 2;

/// The all-reduce catalog of the same machine and world, whose boundaries and geometry an
/// epilogue catalog keeps.
fn all_reduce_twin(name: &str) -> Ladder {
    ladder(
        name.split("_all_reduce_add_rms_norm")
            .next()
            .expect("a machine prefix"),
    )
}

/// The dtype and world an epilogue catalog's name says: `<machine>_tp<world>_all_reduce_add_
/// rms_norm` and `_fp16` for fp16.
fn named_shape(name: &str) -> (Dtype, u32) {
    let dtype = if name.ends_with("_fp16") {
        Dtype::Fp16
    } else {
        Dtype::Bf16
    };
    let world = name
        .split('_')
        .find_map(|part| part.strip_prefix("tp"))
        .and_then(|world| world.parse().ok())
        .expect("a world in the name");
    (dtype, world)
}

fn form(profile: &Profile) -> EpilogueForm {
    profile
        .epilogue_form(Collective::AllReduceAddRmsNorm)
        .expect("a validated profile of the collective")
}

/// How far each fused one-shot goes: `ll` to 1 MiB at every world (as the all-reduce's one-shot
/// beyond two ranks), `simple` to 3 MiB at two ranks (as the all-reduce's `simple` there) and to
/// 1 MiB beyond; the two-shot everywhere.
fn fused_up_to(fused: FusedForm, world: u32) -> u64 {
    match fused {
        FusedForm::OneShotPushSimple if world == 2 => 3 * MIB,
        FusedForm::OneShotPushLl | FusedForm::OneShotPushSimple => MIB,
        FusedForm::TwoShot => u64::MAX,
    }
}

/// The separate candidates a bucket of `max_bytes` takes: the all-reduce catalog's custom
/// candidates of the same bucket, but the double-buffered RSAG only to 16 MiB (its region beside
/// the fused two-shot's two message-sized ones would pass four times the largest message).
fn separate_expected(twin: &Ladder, index: usize) -> Vec<String> {
    let bucket = &twin.buckets[index];
    bucket
        .candidates
        .iter()
        .filter(|id| !twin.profile(id).expect("validated").is_nccl())
        .filter(|id| !(id.as_str() == "rsag_simple_256" && bucket.max_bytes > 16 * MIB))
        .cloned()
        .collect()
}

/// The fused form of an all-reduce default: `simple` for a double-buffered `simple` one-shot,
/// `ll` for any other one-shot, the two-shot for an RSAG.
fn fused_default(all_reduce_default: &str) -> &'static str {
    if all_reduce_default.starts_with("one_shot_simple") {
        "fused_simple"
    } else if all_reduce_default.starts_with("one_shot") {
        "fused_ll"
    } else {
        "fused_two_shot"
    }
}

#[test]
fn epilogue_catalogs_keep_the_all_reduce_s_buckets_with_a_fused_and_an_unfused_candidate_everywhere(
) {
    for (name, ladder) in epilogue_catalogs() {
        let twin = all_reduce_twin(name);
        let world = ladder.world_size;
        assert_eq!(ladder.targets, twin.targets, "{name}");
        assert_eq!(
            ladder.bucket_for(SMALLEST_SERVING_MESSAGE),
            Some(0),
            "{name}"
        );
        // Hidden 7,168: 64 decode rows fit the 1 MiB bucket, a prefill of 4,096 rows the last.
        assert_eq!(
            ladder
                .bucket_for(64 * ROW_BYTES)
                .map(|index| ladder.buckets[index].max_bytes),
            Some(MIB),
            "{name}"
        );
        assert!(ladder.bucket_for(4096 * ROW_BYTES).is_some(), "{name}");
        assert_eq!(largest_message(&ladder), 64 * MIB, "{name}");
        assert_eq!(ladder.buckets.len(), twin.buckets.len(), "{name}");
        for (index, bucket) in ladder.buckets.iter().enumerate() {
            let at = format!("{name} bucket {index}");
            let same = &twin.buckets[index];
            assert_eq!(
                (
                    bucket.max_bytes,
                    bucket.threads,
                    bucket.blocks,
                    bucket.cluster_size
                ),
                (same.max_bytes, same.threads, same.blocks, same.cluster_size),
                "{at}"
            );
            let profiles: Vec<&Profile> = bucket
                .candidates
                .iter()
                .map(|id| ladder.profile(id).expect("validated"))
                .collect();
            let forms: Vec<EpilogueForm> = profiles.iter().map(|profile| form(profile)).collect();
            assert!(
                forms
                    .iter()
                    .any(|form| matches!(form, EpilogueForm::Fused(_))),
                "{at}: a fused candidate"
            );
            assert!(
                forms.contains(&EpilogueForm::SeparateKernel),
                "{at}: an all-reduce kernel then add_rms_norm"
            );
            // The fused candidates first, then the separate ones, NCCL last.
            let order = |form: &EpilogueForm| match form {
                EpilogueForm::Fused(_) => 0,
                EpilogueForm::SeparateKernel => 1,
                EpilogueForm::SeparateNccl => 2,
            };
            assert!(
                forms
                    .windows(2)
                    .all(|pair| order(&pair[0]) <= order(&pair[1])),
                "{at}"
            );
            for fused in FusedForm::ALL {
                let has = forms.contains(&EpilogueForm::Fused(fused));
                assert_eq!(
                    has,
                    bucket.max_bytes <= fused_up_to(fused, world),
                    "{at}: {fused:?}"
                );
            }
            let separate: Vec<String> = profiles
                .iter()
                .filter(|profile| form(profile) == EpilogueForm::SeparateKernel)
                .map(|profile| profile.id.clone())
                .collect();
            assert_eq!(separate, separate_expected(&twin, index), "{at}");
            // NCCL exact at every world: plain at two ranks, the rank-order one beyond.
            let nccl: Vec<&str> = profiles
                .iter()
                .filter(|profile| profile.is_nccl())
                .map(|profile| profile.id.as_str())
                .collect();
            let expected = if world == 2 {
                "nccl"
            } else {
                "nccl_rank_order"
            };
            assert_eq!(nccl, [expected], "{at}");
            assert_eq!(bucket.default, fused_default(&same.default), "{at}");
        }
        // A separate profile is the all-reduce catalog's own, followed by add_rms_norm.
        for profile in &ladder.profiles {
            match form(profile) {
                EpilogueForm::SeparateKernel => {
                    let own = twin.profile(&profile.id).expect("the all-reduce's profile");
                    let unfused = Profile {
                        epilogue: None,
                        ..profile.clone()
                    };
                    assert_eq!(&unfused, own, "{name}: {}", profile.id);
                    assert_eq!(profile.epilogue, Some(Epilogue::Separate), "{name}");
                }
                EpilogueForm::SeparateNccl => {
                    assert_eq!(profile.is_nccl_rank_order(), world > 2, "{name}");
                    assert!(profile.epilogue.is_none(), "{name}");
                }
                EpilogueForm::Fused(_) => assert!(profile.epilogue.is_none(), "{name}"),
            }
            assert!(
                ladder
                    .buckets
                    .iter()
                    .any(|bucket| bucket.candidates.contains(&profile.id)),
                "{name}: {} is never a candidate",
                profile.id
            );
        }
    }
}

/// Every candidate is exact at its world (the epilogue is exact on every one, and beyond two
/// ranks NCCL sums in rank order), and static tuning keeps every bucket's default under either
/// policy.
#[test]
fn every_epilogue_candidate_is_exact_and_static_tuning_keeps_the_fused_default() {
    for (name, ladder) in epilogue_catalogs() {
        for profile in &ladder.profiles {
            assert!(
                is_exact(ladder.collective, profile, ladder.world_size),
                "{name}: {}",
                profile.id
            );
        }
        for exact_only in [true, false] {
            let policy = Policy {
                exact_only,
                ..Policy::default()
            };
            for index in 0..ladder.buckets.len() {
                let samples = static_samples(&ladder, index);
                assert!(samples.candidates.iter().all(|candidate| candidate.exact));
                let decision = decide_static(&samples, &policy).expect("a decision");
                assert_eq!(
                    (decision.winner.as_str(), decision.bit_exact),
                    (ladder.buckets[index].default.as_str(), true),
                    "{name} bucket {index}, exact {exact_only}"
                );
            }
        }
    }
}

/// Each catalog ships in bf16 and fp16 with the same profiles, boundaries and defaults; the
/// names say the collective, dtype and world.
#[test]
fn the_fp16_epilogue_catalogs_are_twins_of_the_bf16_ones() {
    for (name, ladder) in epilogue_catalogs() {
        let (dtype, world) = named_shape(name);
        assert_eq!(
            (ladder.collective, ladder.dtype, ladder.world_size),
            (Collective::AllReduceAddRmsNorm, dtype, world),
            "{name}"
        );
        assert_eq!(ladder.name, name);
    }
    for name in EPILOGUE.iter().filter(|name| name.ends_with("_fp16")) {
        let (fp16, bf16) = (ladder(name), ladder(name.trim_end_matches("_fp16")));
        assert_eq!(
            (fp16.dtype, bf16.dtype),
            (Dtype::Fp16, Dtype::Bf16),
            "{name}"
        );
        assert_eq!(fp16.profiles, bf16.profiles, "{name}");
        assert_eq!(fp16.buckets, bf16.buckets, "{name}");
        assert_eq!(fp16.targets, bf16.targets, "{name}");
    }
    let fp16 = EPILOGUE
        .iter()
        .filter(|name| name.ends_with("_fp16"))
        .count();
    assert_eq!((EPILOGUE.len() - fp16, fp16), (3, 3));
}

/// A package holds the three fused kernels, the all-reduce kernels of its separate profiles,
/// `add_rms_norm`, and beyond two ranks the rank-order sum.
#[test]
fn epilogue_packages_hold_the_fused_the_separate_and_the_norm_kernels() {
    for (name, ladder) in epilogue_catalogs() {
        let dtype = ladder.dtype.name();
        let mut expected: Vec<String> = FusedForm::ALL
            .iter()
            .map(|fused| format!("{}_{dtype}", fused.kernel_name()))
            .collect();
        expected.push(format!("add_rms_norm_{dtype}"));
        let mut all_reduce: Vec<String> = kernels_for_ladder(&all_reduce_twin(name))
            .into_iter()
            .map(|spec| spec.name.replace("_bf16", &format!("_{dtype}")))
            .collect();
        if ladder.world_size == 2 {
            assert!(!all_reduce.iter().any(|kernel| kernel.starts_with("nccl_")));
        }
        expected.append(&mut all_reduce);
        expected.sort();
        let kernels: Vec<String> = kernels_for_ladder(&ladder)
            .into_iter()
            .map(|spec| spec.name)
            .collect();
        assert_eq!(kernels, expected, "{name}");
        assert_eq!(
            kernels
                .iter()
                .any(|kernel| kernel.starts_with("nccl_rank_order_sum")),
            ladder.world_size > 2,
            "{name}"
        );
    }
}

/// Peer memory: the fused two-shot keeps two message-sized regions after the 64 MiB input
/// region, so the TP2 catalog's double-buffered RSAG stops at 16 MiB to stay within four times
/// the largest message.
#[test]
fn the_epilogue_catalogs_peer_buffers_are_as_documented() {
    let buffer = |name: &str| prepare::kernels::peer_buffer_bytes(&ladder(name)) / MIB;
    assert_eq!(buffer("h200_nvlink_tp2_all_reduce_add_rms_norm"), 248);
    assert_eq!(buffer("h200_nvlink_tp4_all_reduce_add_rms_norm"), 212);
    assert_eq!(buffer("h200_nvlink_tp8_all_reduce_add_rms_norm"), 236);
    for (name, ladder) in epilogue_catalogs() {
        assert!(
            prepare::kernels::peer_buffer_bytes(&ladder) <= 256 * MIB,
            "{name}"
        );
    }
    // With the double-buffered RSAG to 64 MiB the TP2 buffer would pass 256 MiB.
    let mut longer = ladder("h200_nvlink_tp2_all_reduce_add_rms_norm");
    for bucket in longer.buckets.iter_mut().filter(|b| b.max_bytes > 16 * MIB) {
        bucket.candidates.push("rsag_simple_256".to_owned());
    }
    assert!(prepare::kernels::peer_buffer_bytes(&longer) > 256 * MIB);
}
