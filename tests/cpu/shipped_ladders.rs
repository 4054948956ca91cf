//! The shipped catalogs are shaped as documented, and the device rules judge them on the
//! described devices: RTX PRO 6000 runs every GB202 catalog, GB10 only the ordinary one (the
//! refusal names it), H200 runs the H200 catalogs and no GB202 one; the GB10 reduce-scatter
//! catalogs are NCCL only, exact by default, and run on GB10 alone; the H200 and GB202
//! reduce-scatter and all-gather catalogs are one-shot kernels beside NCCL, exact by default; the
//! H200 all-reduce + RMSNorm catalogs fit an H200 with every launch resident and within the peer
//! memory rule (tests/cpu/shipped_epilogue_ladders.rs judges their shape).

use prepare::device::{
    check_candidate_residency, check_export_target, check_package_fits, required_residency,
    DeviceDescription, DeviceError, Residency,
};
use prepare::ladder::{is_exact, validate_ladder_file, Algorithm, Arch, Collective, Dtype, Ladder};
use prepare::tune::{decide_static, BucketSamples, CandidateSamples, Policy};

use crate::support::repository::{json_files, root};

pub(super) const KIB: u64 = 1024;
pub(super) const MIB: u64 = 1024 * KIB;
/// One decode row of a 7168-wide bf16 hidden state.
pub(super) const SMALLEST_SERVING_MESSAGE: u64 = 7168 * 2;
/// Blocks of 512 threads that every supported kernel can keep resident per SM.
const BLOCKS_PER_SM: u32 = 2;

const GB202: [&str; 3] = [
    "gb202_pcie_tp4",
    "gb202_pcie_tp4_clustered",
    "gb202_pcie_tp4_clustered_full",
];
const H200: [&str; 4] = [
    "h200_nvlink_tp2",
    "h200_nvlink_tp2_clustered",
    "h200_nvlink_tp4",
    "h200_nvlink_tp8",
];
/// Twins of the catalogs above in another dtype: the same profiles, boundaries and defaults.
const TWINS: [&str; 8] = [
    "gb202_pcie_tp4_fp16",
    "gb202_pcie_tp4_clustered_fp16",
    "gb202_pcie_tp4_clustered_full_fp16",
    "h200_nvlink_tp2_fp16",
    "h200_nvlink_tp2_clustered_fp16",
    "h200_nvlink_tp2_fp32",
    "h200_nvlink_tp4_fp16",
    "h200_nvlink_tp8_fp16",
];
/// GB10 hosts over RoCE, one rank each: reduce-scatter through NCCL alone.
const GB10_REDUCE_SCATTER: [&str; 2] = [
    "gb10_roce_tp2_reduce_scatter_fp32",
    "gb10_roce_tp3_reduce_scatter_fp32",
];
/// Reduce-scatter and all-gather catalogs with custom kernels: H200 at 2, 4 and 8 ranks in bf16
/// and fp32, and the GB202 all-gather (Ignition's gathers).
pub(super) const ROWS: [&str; 13] = [
    "gb202_pcie_tp4_all_gather",
    "h200_nvlink_tp2_all_gather",
    "h200_nvlink_tp2_all_gather_fp32",
    "h200_nvlink_tp2_reduce_scatter",
    "h200_nvlink_tp2_reduce_scatter_fp32",
    "h200_nvlink_tp4_all_gather",
    "h200_nvlink_tp4_all_gather_fp32",
    "h200_nvlink_tp4_reduce_scatter",
    "h200_nvlink_tp4_reduce_scatter_fp32",
    "h200_nvlink_tp8_all_gather",
    "h200_nvlink_tp8_all_gather_fp32",
    "h200_nvlink_tp8_reduce_scatter",
    "h200_nvlink_tp8_reduce_scatter_fp32",
];
/// All-reduce + residual add + RMSNorm catalogs: H200 at 2, 4 and 8 ranks in bf16 and fp16.
pub(super) const EPILOGUE: [&str; 6] = [
    "h200_nvlink_tp2_all_reduce_add_rms_norm",
    "h200_nvlink_tp2_all_reduce_add_rms_norm_fp16",
    "h200_nvlink_tp4_all_reduce_add_rms_norm",
    "h200_nvlink_tp4_all_reduce_add_rms_norm_fp16",
    "h200_nvlink_tp8_all_reduce_add_rms_norm",
    "h200_nvlink_tp8_all_reduce_add_rms_norm_fp16",
];
/// TensorFold's reduce-scatter: 2,048 x 4,096 fp32.
const TENSORFOLD_MESSAGE: u64 = 2048 * 4096 * 4;

pub(super) fn ladder(name: &str) -> Ladder {
    let path = root().join("ladders").join(format!("{name}.json"));
    validate_ladder_file(&path).unwrap_or_else(|error| panic!("{error}"))
}

/// Every shipped all-reduce catalog but the twins, by name.
fn catalogs() -> impl Iterator<Item = (&'static str, Ladder)> {
    GB202
        .into_iter()
        .chain(H200)
        .map(|name| (name, ladder(name)))
}

/// The reduce-scatter and all-gather catalogs with custom kernels, by name.
pub(super) fn row_catalogs() -> impl Iterator<Item = (&'static str, Ladder)> {
    ROWS.into_iter().map(|name| (name, ladder(name)))
}

/// The all-reduce + residual add + RMSNorm catalogs, by name.
pub(super) fn epilogue_catalogs() -> impl Iterator<Item = (&'static str, Ladder)> {
    EPILOGUE.into_iter().map(|name| (name, ladder(name)))
}

/// Every catalog with custom kernels, of every collective, by name.
fn kernel_catalogs() -> impl Iterator<Item = (&'static str, Ladder)> {
    catalogs().chain(row_catalogs()).chain(epilogue_catalogs())
}

/// The collective, dtype and world a row catalog's name says: `<machine>_tp<world>_<collective>`
/// and `_fp32` for fp32.
pub(super) fn named_shape(name: &str) -> (Collective, Dtype, u32) {
    let collective = if name.contains("_reduce_scatter") {
        Collective::ReduceScatter
    } else {
        Collective::AllGather
    };
    let dtype = if name.ends_with("_fp32") {
        Dtype::Fp32
    } else {
        Dtype::Bf16
    };
    let world = name
        .split('_')
        .find_map(|part| part.strip_prefix("tp"))
        .and_then(|world| world.parse().ok())
        .expect("a world in the name");
    (collective, dtype, world)
}

/// The largest message a ladder covers, bytes.
pub(super) fn largest_message(ladder: &Ladder) -> u64 {
    ladder
        .buckets
        .iter()
        .map(|bucket| bucket.max_bytes)
        .max()
        .unwrap()
}

/// NVIDIA RTX PRO 6000 Blackwell (GB202): sm_120, 188 SMs.
pub(super) fn rtx_pro_6000() -> DeviceDescription {
    DeviceDescription {
        name: "NVIDIA RTX PRO 6000 Blackwell".to_owned(),
        arch: Arch::Sm120,
        sm_count: 188,
        cluster_launch: true,
    }
}

/// NVIDIA GB10 (DGX Spark): sm_121, 48 SMs.
pub(super) fn gb10() -> DeviceDescription {
    DeviceDescription {
        name: "NVIDIA GB10".to_owned(),
        arch: Arch::Sm121,
        sm_count: 48,
        cluster_launch: true,
    }
}

/// NVIDIA H200: sm_90, 132 SMs.
pub(super) fn h200() -> DeviceDescription {
    DeviceDescription {
        name: "NVIDIA H200".to_owned(),
        arch: Arch::Sm90,
        sm_count: 132,
        cluster_launch: true,
    }
}

fn devices() -> [DeviceDescription; 3] {
    [rtx_pro_6000(), gb10(), h200()]
}

#[test]
fn every_catalog_covers_serving_sizes_with_nccl_everywhere() {
    for (name, ladder) in catalogs() {
        assert_eq!(ladder.format_version, 1, "{name}");
        assert_eq!(
            ladder.bucket_for(SMALLEST_SERVING_MESSAGE),
            Some(0),
            "{name}"
        );
        assert_eq!(
            ladder.buckets.last().map(|bucket| bucket.max_bytes),
            Some(64 * MIB)
        );
        for (index, bucket) in ladder.buckets.iter().enumerate() {
            let profiles: Vec<_> = bucket
                .candidates
                .iter()
                .map(|id| ladder.profile(id).expect("validated"))
                .collect();
            assert!(
                profiles.iter().any(|profile| profile.id == "nccl"),
                "{name} bucket {index}"
            );
            assert!(
                profiles
                    .iter()
                    .any(|profile| profile.algorithm == Algorithm::Rsag),
                "{name} bucket {index}: RSAG is a candidate everywhere"
            );
            // One-shot moves world x the message, RSAG 2(world-1)/world x: past 1 MiB one-shot
            // can win only at two ranks, where both move the same bytes.
            if bucket.max_bytes > MIB && ladder.world_size > 2 {
                assert!(
                    profiles
                        .iter()
                        .all(|profile| profile.algorithm != Algorithm::OneShot),
                    "{name} bucket {index}"
                );
            }
            if GB202.contains(&name) {
                assert!(
                    bucket.candidates.iter().any(|id| id == "nccl_4cta"),
                    "{name} {index}"
                );
            }
        }
        let used: Vec<&String> = ladder
            .buckets
            .iter()
            .flat_map(|bucket| &bucket.candidates)
            .collect();
        for profile in &ladder.profiles {
            assert!(
                used.contains(&&profile.id),
                "{name}: {} is never a candidate",
                profile.id
            );
        }
    }
}

#[test]
fn clustered_catalogs_cluster_16_kib_to_1_mib_with_phased_rsag() {
    for name in [
        "gb202_pcie_tp4_clustered",
        "gb202_pcie_tp4_clustered_full",
        "h200_nvlink_tp2_clustered",
    ] {
        let ladder = ladder(name);
        for bucket in &ladder.buckets {
            let expected = (16 * KIB..=MIB).contains(&bucket.max_bytes);
            assert_eq!(
                bucket.is_clustered(),
                expected,
                "{name} {}",
                bucket.max_bytes
            );
            let phased = bucket.candidates.iter().any(|id| id == "rsag_phased");
            assert_eq!(phased, expected, "{name} {}", bucket.max_bytes);
        }
    }
    for (name, ladder) in catalogs() {
        let clustered = name.contains("clustered");
        assert_eq!(ladder.has_clustered_buckets(), clustered, "{name}");
        let ordinary = name
            .trim_end_matches("_full")
            .trim_end_matches("_clustered");
        let expected = clustered.then(|| ordinary.to_owned());
        assert_eq!(ladder.ordinary_ladder, expected, "{name}");
    }
}

#[test]
fn full_all_reduce_is_a_candidate_only_where_80_kib_messages_go() {
    let ladder = ladder("gb202_pcie_tp4_clustered_full");
    let holder = ladder.bucket_for(80 * KIB).expect("a bucket holds 80 KiB");
    for (index, bucket) in ladder.buckets.iter().enumerate() {
        let full = bucket.candidates.iter().any(|id| {
            ladder
                .profile(id)
                .is_some_and(|profile| profile.algorithm == Algorithm::Full)
        });
        assert_eq!(full, index == holder, "bucket {index}");
    }
}

#[test]
fn targets_are_the_architecture_rule() {
    for name in GB202 {
        assert_eq!(
            ladder(name).targets,
            vec![Arch::Sm120, Arch::Sm121],
            "{name}"
        );
    }
    for name in H200 {
        assert_eq!(ladder(name).targets, vec![Arch::Sm90], "{name}");
    }
    for (name, ladder) in row_catalogs().chain(epilogue_catalogs()) {
        let expected = if name.starts_with("gb202_") {
            vec![Arch::Sm120, Arch::Sm121]
        } else {
            vec![Arch::Sm90]
        };
        assert_eq!(ladder.targets, expected, "{name}");
    }
    let error = check_export_target(&ladder("gb202_pcie_tp4"), Arch::Sm90).unwrap_err();
    assert_eq!(
        error.to_string(),
        "ladder gb202_pcie_tp4 targets sm_120, sm_121 only, not sm_90 [architecture_not_targeted]"
    );
    assert_eq!(
        check_export_target(&ladder("gb202_pcie_tp4"), Arch::Sm121),
        Ok(())
    );
    assert_eq!(
        check_export_target(&ladder("h200_nvlink_tp8"), Arch::Sm90),
        Ok(())
    );
    assert!(check_export_target(&ladder("h200_nvlink_tp8"), Arch::Sm100).is_err());
}

#[test]
fn rtx_pro_6000_runs_every_gb202_catalog() {
    let device = rtx_pro_6000();
    for name in GB202.into_iter().chain(["gb202_pcie_tp4_all_gather"]) {
        assert_eq!(check_package_fits(&ladder(name), &device), Ok(()), "{name}");
    }
}

#[test]
fn gb10_is_told_to_use_the_ordinary_catalog() {
    let device = gb10();
    for name in ["gb202_pcie_tp4", "gb202_pcie_tp4_all_gather"] {
        assert_eq!(check_package_fits(&ladder(name), &device), Ok(()), "{name}");
    }
    for name in ["gb202_pcie_tp4_clustered", "gb202_pcie_tp4_clustered_full"] {
        let error = check_package_fits(&ladder(name), &device).unwrap_err();
        assert!(
            matches!(error, DeviceError::TooFewSmsForClusters { .. }),
            "{error:?}"
        );
        assert_eq!(
            error.to_string(),
            format!(
                "NVIDIA GB10 (sm_121, 48 SMs) cannot run ladder {name}: its clustered buckets \
                 launch 8 clusters of 8 blocks that must all be resident at once, which needs at \
                 least 64 SMs; use the ordinary ladder gb202_pcie_tp4 [too_few_sms_for_clusters]"
            )
        );
    }
}

#[test]
fn h200_runs_the_h200_catalogs_and_no_gb202_one() {
    let device = h200();
    let h200_rows = ROWS.into_iter().filter(|name| name.starts_with("h200_"));
    for name in H200.into_iter().chain(h200_rows).chain(EPILOGUE) {
        assert_eq!(check_package_fits(&ladder(name), &device), Ok(()), "{name}");
    }
    for name in GB202.into_iter().chain(["gb202_pcie_tp4_all_gather"]) {
        let error = check_package_fits(&ladder(name), &device).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "NVIDIA H200 (sm_90, 132 SMs) cannot run ladder {name}: it targets sm_120, \
                 sm_121 only [architecture_not_targeted]"
            )
        );
    }
}

#[test]
fn a_device_without_cluster_launch_is_refused_clustered_catalogs() {
    let device = DeviceDescription {
        cluster_launch: false,
        ..h200()
    };
    assert_eq!(
        check_package_fits(&ladder("h200_nvlink_tp2"), &device),
        Ok(())
    );
    let error = check_package_fits(&ladder("h200_nvlink_tp2_clustered"), &device).unwrap_err();
    assert_eq!(
        error.to_string(),
        "NVIDIA H200 (sm_90, 132 SMs) cannot run ladder h200_nvlink_tp2_clustered: its clustered \
         buckets need thread-block cluster launch, which the device lacks; use the ordinary \
         ladder h200_nvlink_tp2 [cluster_launch_unsupported]"
    );
}

/// Every launch of every shipped catalog stays resident on every described device that the
/// package fits, assuming two blocks of 512 threads per SM (and for clusters, a cluster per
/// 8 SMs), so no candidate is dropped for residency on the machines the catalogs are for.
#[test]
fn every_launch_is_resident_on_the_devices_it_fits() {
    for (name, ladder) in kernel_catalogs() {
        for device in devices()
            .iter()
            .filter(|device| check_package_fits(&ladder, device).is_ok())
        {
            let blocks = Residency::Blocks(device.sm_count * BLOCKS_PER_SM);
            let clusters = Residency::Clusters(device.sm_count * BLOCKS_PER_SM / 8);
            for bucket in &ladder.buckets {
                for id in &bucket.candidates {
                    let profile = ladder.profile(id).expect("validated");
                    let resident = if bucket.is_clustered() {
                        clusters
                    } else {
                        blocks
                    };
                    assert_eq!(
                        check_candidate_residency(bucket, profile, resident),
                        Ok(()),
                        "{name} on {device}: {id} needs {}",
                        required_residency(bucket, Some(profile))
                    );
                }
            }
        }
    }
}

/// Peer memory per GPU: the registered buffer of every shipped catalog is at most four times its
/// largest message (`prepare show` reports the same figure). The reduce-scatter's push keeps
/// world - 1 message-sized slots, so beyond two ranks it stops at 16 MiB: at eight ranks the
/// buffer is the 64 MiB input region and seven 16 MiB slots. The H200 row catalogs' ll push, up
/// to 1 MiB, adds its own region: two halves of world - 1 slots of 2 MiB and 8 KiB of lines,
/// rounded up to 2 MiB (6, 14 and 30 MiB at two, four and eight ranks).
#[test]
fn every_catalog_needs_at_most_four_times_its_largest_message_of_peer_memory() {
    let buffer = |name: &str| prepare::kernels::peer_buffer_bytes(&ladder(name)) / MIB;
    assert_eq!(buffer("h200_nvlink_tp8_reduce_scatter"), 64 + 7 * 16 + 30);
    assert_eq!(
        buffer("h200_nvlink_tp4_reduce_scatter_fp32"),
        64 + 3 * 16 + 14
    );
    assert_eq!(buffer("h200_nvlink_tp2_reduce_scatter"), 64 + 64 + 6);
    // The all-gather's push keeps one message-sized region for every peer's rows.
    assert_eq!(buffer("h200_nvlink_tp8_all_gather"), 64 + 64 + 30);
    assert_eq!(buffer("gb202_pcie_tp4_all_gather"), 64 + 64);
    for (name, ladder) in kernel_catalogs() {
        let largest = largest_message(&ladder);
        let peer = prepare::kernels::peer_buffer_bytes(&ladder);
        assert!(
            peer <= 4 * largest,
            "{name}: {} MiB of peer memory for a largest message of {} MiB",
            peer / MIB,
            largest / MIB
        );
    }
}

/// What a served package keeps on each GPU besides its kernels, the peer buffer and its signal
/// flags and the private output buffer, is at most four times the largest message for every
/// shipped catalog; for the H200 TP2 all-reduce catalogs the private buffer is one move chunk
/// (one-shot pull, whose sum cannot go to the input region, stops at 1 MiB).
#[test]
fn every_served_catalog_keeps_at_most_four_times_its_largest_message() {
    for (name, ladder) in kernel_catalogs() {
        let largest = largest_message(&ladder);
        let private = prepare::collective::private_output_bytes(&ladder);
        let kept =
            prepare::kernels::peer_buffer_bytes(&ladder) + prepare::abi::SIGNAL_BYTES + private;
        assert!(private >= prepare::collective::MOVE_CHUNK_BYTES, "{name}");
        assert!(
            kept <= 4 * largest,
            "{name}: {} MiB kept for a largest message of {} MiB",
            kept / MIB,
            largest / MIB
        );
        if name.starts_with("h200_nvlink_tp2") && ladder.collective == Collective::AllReduce {
            assert_eq!(private, prepare::collective::MOVE_CHUNK_BYTES, "{name}");
        }
    }
}

/// Each shipped ladder is one of the lists above, so every one is judged by the tests here.
#[test]
fn every_shipped_ladder_is_named_here() {
    let mut shipped: Vec<String> = json_files("ladders")
        .iter()
        .map(|file| file.file_stem().unwrap().to_str().unwrap().to_owned())
        .collect();
    shipped.sort();
    let mut named: Vec<&str> = GB202
        .into_iter()
        .chain(H200)
        .chain(TWINS)
        .chain(GB10_REDUCE_SCATTER)
        .chain(ROWS)
        .chain(EPILOGUE)
        .collect();
    named.sort_unstable();
    assert_eq!(shipped, named);
    for (name, ladder) in catalogs() {
        assert_eq!(ladder.collective, Collective::AllReduce, "{name}");
    }
    for name in TWINS {
        assert_eq!(ladder(name).collective, Collective::AllReduce, "{name}");
    }
    for (name, ladder) in row_catalogs() {
        let (collective, dtype, world) = named_shape(name);
        assert_eq!(
            (ladder.collective, ladder.dtype, ladder.world_size),
            (collective, dtype, world),
            "{name}"
        );
    }
    for (name, ladder) in epilogue_catalogs() {
        assert_eq!(ladder.collective, Collective::AllReduceAddRmsNorm, "{name}");
    }
}

/// The GB10 reduce-scatter catalogs: fp32 at two and three ranks on sm_121, every bucket
/// timing the exact NCCL reduce-scatter (the default) against plain ncclReduceScatter, from one
/// decode row to 64 MiB with TensorFold's message inside, and nothing in peer memory.
#[test]
fn the_gb10_reduce_scatter_catalogs_are_nccl_only_with_the_exact_one_the_default() {
    for (name, world) in GB10_REDUCE_SCATTER.into_iter().zip([2, 3]) {
        let ladder = ladder(name);
        assert_eq!(
            (ladder.collective, ladder.dtype, ladder.world_size),
            (Collective::ReduceScatter, Dtype::Fp32, world),
            "{name}"
        );
        assert_eq!(ladder.targets, vec![Arch::Sm121], "{name}");
        assert_eq!(
            ladder.bucket_for(SMALLEST_SERVING_MESSAGE),
            Some(0),
            "{name}"
        );
        assert!(ladder.bucket_for(TENSORFOLD_MESSAGE).is_some(), "{name}");
        // The last boundary is the first valid one from 64 MiB on.
        let unit = 16 * u64::from(world);
        assert_eq!(
            largest_message(&ladder),
            (64 * MIB).next_multiple_of(unit),
            "{name}"
        );
        for (index, bucket) in ladder.buckets.iter().enumerate() {
            assert_eq!(
                bucket.candidates,
                ["nccl_rank_order", "nccl"],
                "{name} bucket {index}"
            );
            assert_eq!(bucket.default, "nccl_rank_order", "{name} bucket {index}");
        }
        let rank_order = ladder.profile("nccl_rank_order").expect("a profile");
        assert!(rank_order.is_nccl_rank_order(), "{name}");
        assert!(ladder.profile("nccl").expect("a profile").is_plain_nccl());
        assert_eq!(prepare::kernels::peer_buffer_bytes(&ladder), 0, "{name}");
        assert_eq!(
            prepare::collective::private_output_bytes(&ladder),
            0,
            "{name}"
        );
        // The package holds the rank-order sum and no other kernel.
        let kernels: Vec<String> = prepare::kernels::kernels_for_ladder(&ladder)
            .into_iter()
            .map(|spec| spec.name)
            .collect();
        assert_eq!(kernels, ["nccl_rank_order_sum_fp32"], "{name}");
    }
}

/// Bucket `index` of `ladder` as static tuning sees it: nothing timed, each candidate exact by
/// the exactness policy.
pub(super) fn static_samples(ladder: &Ladder, index: usize) -> BucketSamples {
    let bucket = &ladder.buckets[index];
    BucketSamples {
        index,
        default: bucket.default.clone(),
        sizes: Vec::new(),
        candidates: bucket
            .candidates
            .iter()
            .map(|id| CandidateSamples {
                profile: id.clone(),
                dropped: None,
                exact: is_exact(
                    ladder.collective,
                    ladder.profile(id).expect("validated"),
                    ladder.world_size,
                ),
                samples: Vec::new(),
            })
            .collect(),
    }
}

/// Static tuning takes the exact NCCL reduce-scatter in every bucket, exact under either
/// policy; plain ncclReduceScatter counts as exact at two ranks only.
#[test]
fn static_tuning_of_the_gb10_catalogs_is_exact() {
    for name in GB10_REDUCE_SCATTER {
        let ladder = ladder(name);
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
                assert_eq!(plain.exact, ladder.world_size == 2, "{name}");
                let decision = decide_static(&samples, &policy).expect("a decision");
                assert_eq!(
                    (decision.winner.as_str(), decision.bit_exact),
                    ("nccl_rank_order", true),
                    "{name} bucket {index}, exact {exact_only}"
                );
            }
        }
    }
}

/// NCCL launches its own kernels and the rank-order sum runs on any SM count, so the GB10
/// catalogs fit a GB10 and, by their targets, nothing else described.
#[test]
fn the_gb10_catalogs_run_on_gb10_alone() {
    for name in GB10_REDUCE_SCATTER {
        let ladder = ladder(name);
        assert_eq!(check_package_fits(&ladder, &gb10()), Ok(()), "{name}");
        for device in [rtx_pro_6000(), h200()] {
            let error = check_package_fits(&ladder, &device).unwrap_err();
            assert_eq!(
                error.to_string(),
                format!("{device} cannot run ladder {name}: it targets sm_121 only [architecture_not_targeted]")
            );
        }
        for bucket in &ladder.buckets {
            for id in &bucket.candidates {
                let profile = ladder.profile(id).expect("validated");
                assert_eq!(
                    check_candidate_residency(bucket, profile, Residency::Blocks(0)),
                    Ok(()),
                    "{name}: {id}"
                );
            }
        }
    }
}

/// The device rules judge a reduce-scatter's and an all-gather's one-shot candidates as the
/// all-reduce's: every block resident at once, NCCL always passing, and the architecture rule
/// by targets; with no clustered bucket the cluster rules never refuse them, on GB10 either.
#[test]
fn the_device_rules_judge_reduce_scatter_and_all_gather_candidates_as_the_all_reduce() {
    let fixture = |name: &str| {
        let path = root().join(format!("tests/fixtures/ladders/valid/{name}.json"));
        validate_ladder_file(&path).unwrap_or_else(|error| panic!("{error}"))
    };
    let reduce_scatter = fixture("reduce_scatter");
    assert_eq!(check_package_fits(&reduce_scatter, &gb10()), Ok(()));
    assert_eq!(check_package_fits(&reduce_scatter, &h200()), Ok(()));
    let all_gather = fixture("all_gather");
    assert_eq!(check_package_fits(&all_gather, &h200()), Ok(()));
    assert_eq!(
        check_package_fits(&all_gather, &gb10()).unwrap_err().rule(),
        "architecture_not_targeted"
    );
    let bucket = &reduce_scatter.buckets[0];
    let profile = |id: &str| reduce_scatter.profile(id).expect("a profile");
    // The bucket launches 8 blocks; one_shot_pull_32 launches its own 32.
    assert_eq!(
        check_candidate_residency(bucket, profile("one_shot_pull"), Residency::Blocks(8)),
        Ok(())
    );
    let error =
        check_candidate_residency(bucket, profile("one_shot_pull_32"), Residency::Blocks(16))
            .unwrap_err();
    assert_eq!(
        error.to_string(),
        "not resident: needs 32 blocks at once, the occupancy query allows 16 blocks"
    );
    for id in ["nccl", "nccl_rank_order"] {
        assert_eq!(
            check_candidate_residency(bucket, profile(id), Residency::Blocks(0)),
            Ok(())
        );
    }
}
