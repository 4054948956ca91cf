//! The shipped reduce-scatter and all-gather catalogs with custom kernels (H200 NVLink at 2, 4
//! and 8 ranks in bf16 and fp32, GB202 PCIe all-gather at 4) are shaped as documented: the
//! all-reduce catalogs' boundaries and geometry, one-shot in every bucket beside NCCL, the
//! reduce-scatter's push only as far as its peer slots allow, defaults that static tuning keeps
//! exact, and twins in bf16 and fp32 alike.

use prepare::kernels::kernels_for_ladder;
use prepare::ladder::{Algorithm, Collective, Dtype, Ladder, Transfer};
use prepare::tune::{decide_static, Policy};

use super::shipped_ladders::{
    ladder, largest_message, named_shape, row_catalogs, static_samples, KIB, MIB, ROWS,
    SMALLEST_SERVING_MESSAGE,
};

/// The all-reduce catalog of the same machine and world, whose geometry a row catalog keeps.
fn all_reduce_twin(name: &str) -> Ladder {
    let machine = name
        .split("_reduce_scatter")
        .next()
        .and_then(|head| head.split("_all_gather").next())
        .expect("a machine prefix");
    ladder(machine)
}

/// How far a catalog's one-shot push goes: the reduce-scatter's push keeps world - 1
/// message-sized slots, so beyond two ranks it stops at 16 MiB; the all-gather's keeps one
/// message-sized region and goes everywhere.
fn push_up_to(ladder: &Ladder) -> u64 {
    if ladder.collective == Collective::ReduceScatter && ladder.world_size > 2 {
        16 * MIB
    } else {
        64 * MIB
    }
}

#[test]
fn row_catalogs_keep_the_all_reduce_s_boundaries_and_geometry_with_one_shot_and_nccl_everywhere() {
    for (name, ladder) in row_catalogs() {
        let twin = all_reduce_twin(name);
        assert_eq!(ladder.targets, twin.targets, "{name}");
        assert_eq!(
            ladder.bucket_for(SMALLEST_SERVING_MESSAGE),
            Some(0),
            "{name}"
        );
        assert_eq!(largest_message(&ladder), 64 * MIB, "{name}");
        let boundaries: Vec<u64> = ladder.buckets.iter().map(|b| b.max_bytes).collect();
        let mut expected = vec![16, 32, 64, 96, 128, 256, 512, 768];
        expected.extend([1024, 1536, 2048, 3072, 4096, 8192, 16384, 32768, 65536]);
        let expected: Vec<u64> = expected.into_iter().map(|kib| kib * KIB).collect();
        assert_eq!(boundaries, expected, "{name}");
        let sums_beyond_two =
            ladder.collective == Collective::ReduceScatter && ladder.world_size > 2;
        for (index, bucket) in ladder.buckets.iter().enumerate() {
            let at = format!("{name} bucket {index}");
            // The all-reduce catalog's bucket of the same boundary has the same geometry.
            let same = twin
                .buckets
                .iter()
                .find(|other| other.max_bytes == bucket.max_bytes)
                .expect("the all-reduce catalog has the boundary");
            assert_eq!(
                (bucket.threads, bucket.blocks),
                (same.threads, same.blocks),
                "{at}"
            );
            let profiles: Vec<_> = bucket
                .candidates
                .iter()
                .map(|id| ladder.profile(id).expect("validated"))
                .collect();
            assert!(profiles
                .iter()
                .all(|profile| matches!(profile.algorithm, Algorithm::OneShot | Algorithm::Nccl)));
            // One-shot moves (world - 1) / world of the message per rank here, as NCCL's ring:
            // a candidate at every size, unlike the all-reduce's one-shot beyond two ranks.
            for id in ["one_shot_pull", "nccl"] {
                assert!(bucket.candidates.iter().any(|c| c == id), "{at}: {id}");
            }
            let push = profiles.iter().any(|profile| {
                profile.algorithm == Algorithm::OneShot && profile.transfer == Some(Transfer::Push)
            });
            let own_push = bucket.candidates.iter().any(|id| id == "one_shot_push");
            assert_eq!(own_push, bucket.max_bytes <= push_up_to(&ladder), "{at}");
            if bucket.max_bytes > push_up_to(&ladder) {
                assert!(!push, "{at}: no push past the slots' limit");
            }
            assert_eq!(
                bucket.candidates.iter().any(|id| id == "nccl_rank_order"),
                sums_beyond_two,
                "{at}"
            );
            let wide = if name.starts_with("gb202_") {
                "one_shot_push_wide"
            } else {
                "one_shot_pull_wide"
            };
            assert_eq!(
                bucket.candidates.iter().any(|id| id == wide),
                bucket.max_bytes > MIB,
                "{at}"
            );
            // Defaults: the machine's fast transfer, wide from 8 MiB.
            let default = match (name.starts_with("gb202_"), bucket.max_bytes >= 8 * MIB) {
                (false, false) => "one_shot_pull",
                (true, false) => "one_shot_push",
                (_, true) => wide,
            };
            assert_eq!(bucket.default, default, "{at}");
            if name.starts_with("gb202_") {
                assert!(bucket.candidates.iter().any(|id| id == "nccl_4cta"), "{at}");
            }
            // The H200 catalogs try the ll push on the small buckets, as far as the TP2
            // all-reduce's ll goes.
            assert_eq!(
                bucket.candidates.iter().any(|id| id == "one_shot_push_ll"),
                name.starts_with("h200_") && bucket.max_bytes <= MIB,
                "{at}"
            );
        }
        for profile in &ladder.profiles {
            assert!(
                ladder
                    .buckets
                    .iter()
                    .any(|bucket| bucket.candidates.contains(&profile.id)),
                "{name}: {} is never a candidate",
                profile.id
            );
            // An all-gather sums nothing: no rank-order profile.
            if ladder.collective == Collective::AllGather {
                assert!(!profile.is_nccl_rank_order(), "{name}");
            }
        }
    }
}

/// Static tuning keeps every bucket's default, a custom kernel that sums in rank order, under
/// either policy, so a reduce-scatter beyond two ranks never falls back to plain NCCL.
#[test]
fn static_tuning_of_the_row_catalogs_keeps_the_exact_default() {
    for (name, ladder) in row_catalogs() {
        for exact_only in [true, false] {
            let policy = Policy {
                exact_only,
                ..Policy::default()
            };
            for index in 0..ladder.buckets.len() {
                let samples = static_samples(&ladder, index);
                let plain = samples
                    .candidates
                    .iter()
                    .find(|candidate| candidate.profile == "nccl")
                    .expect("plain NCCL is a candidate");
                let plain_exact =
                    ladder.collective == Collective::AllGather || ladder.world_size == 2;
                assert_eq!(plain.exact, plain_exact, "{name}");
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

/// Each H200 catalog ships in bf16 and fp32 with the same profiles, boundaries and defaults.
#[test]
fn the_fp32_row_catalogs_are_twins_of_the_bf16_ones() {
    for name in ROWS.iter().filter(|name| name.ends_with("_fp32")) {
        let (fp32, bf16) = (ladder(name), ladder(name.trim_end_matches("_fp32")));
        assert_eq!(
            (fp32.dtype, bf16.dtype),
            (Dtype::Fp32, Dtype::Bf16),
            "{name}"
        );
        assert_eq!(fp32.profiles, bf16.profiles, "{name}");
        assert_eq!(fp32.buckets, bf16.buckets, "{name}");
        assert_eq!(fp32.targets, bf16.targets, "{name}");
    }
    let bf16 = ROWS.iter().filter(|name| !name.ends_with("_fp32")).count();
    assert_eq!((bf16, ROWS.len() - bf16), (7, 6));
}

/// A reduce-scatter package holds its one-shot kernels and the rank-order sum (which its NCCL
/// path needs for uneven rows at any world); an all-gather package its one-shot kernels alone.
/// The one-shots are pull and push, on H200 the push with ll, and on GB202 (PCIe) the
/// all-gather's copy engine.
#[test]
fn row_packages_hold_their_collective_s_kernels() {
    for (name, ladder) in row_catalogs() {
        let (collective, dtype, _) = named_shape(name);
        let dtype = match dtype {
            Dtype::Fp32 => "fp32",
            _ => "bf16",
        };
        let mut kernels: Vec<String> = kernels_for_ladder(&ladder)
            .into_iter()
            .map(|spec| spec.name)
            .collect();
        kernels.sort();
        let forms: &[&str] = if name.starts_with("h200_") {
            &["pull", "push", "push_ll"]
        } else if name.starts_with("gb202_") {
            &["copy_engine", "pull", "push"]
        } else {
            &["pull", "push"]
        };
        let mut expected: Vec<String> = forms
            .iter()
            .map(|form| format!("{collective}_one_shot_{form}_{dtype}"))
            .collect();
        if collective == Collective::ReduceScatter {
            expected.insert(0, format!("nccl_rank_order_sum_{dtype}"));
        }
        assert_eq!(kernels, expected, "{name}");
    }
}
