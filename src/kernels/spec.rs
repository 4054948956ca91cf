//! The kernel table: which kernel runs each profile, its source and entry symbol, how it lays
//! out its scratch and how it reads this rank's message.

use crate::ladder::{Algorithm, Collective, Dtype, Ladder, Profile, Protocol, Schedule, Transfer};

/// A custom kernel as a package compiles it: one entry symbol in one source file, instantiated
/// for one element type and world size.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KernelSpec {
    /// The kernel's name, also its entry symbol: the algorithm's name and the dtype
    /// (`all_reduce_rsag_phased_bf16`).
    pub name: String,
    /// The source file under `kernels/`.
    pub source: &'static str,
    /// Whether it uses cluster instructions and must launch with cluster dimensions.
    pub cluster: bool,
    /// The element type it sums.
    pub dtype: Dtype,
    /// The world size it is compiled for (2..=8); a launch at another is refused.
    pub world: u32,
}

impl KernelSpec {
    /// The preprocessor definitions that instantiate the kernel templates for this kernel's
    /// element type and world size (`kernels/prepare_entry.cuh`).
    pub fn defines(&self) -> Vec<String> {
        vec![
            format!("-DPREPARE_ELEMENT={}", self.dtype.element_type()),
            format!("-DPREPARE_DTYPE={}", self.dtype.name()),
            format!("-DPREPARE_WORLD={}", self.world),
        ]
    }

    /// The start and end barrier entries of a kernel whose peer traffic the host enqueues as
    /// copies (`transfer: copy_engine`), in the same source; `None` for every other kernel.
    pub fn copy_engine_barriers(&self) -> Option<[String; 2]> {
        kernel_of(self)
            .and_then(|kernel| kernel.barriers)
            .map(|barriers| barriers.map(|name| format!("{name}_{}", self.dtype.name())))
    }
}

/// How a kernel's scratch region is laid out (kernels/prepare_layout.cuh). A rank keeps no
/// slot for itself: it reads its own message where it is, so slots are one per peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scratch {
    /// No scratch.
    None,
    /// One slice-sized slot (this rank's reduced slice).
    Slice,
    /// One message-sized region, every peer's part at its place in the message (each rank's
    /// rows written by their owner alone).
    Message,
    /// One message-sized slot per peer.
    PeerMessageSlots,
    /// One slice-sized slot per peer, then one message-sized region.
    PeerSliceSlotsThenMessage,
    /// Two message-sized regions, one after the other, each owner's rows at their place in
    /// each (the fused two-shot's normed and residual_out rows, written by their owner alone).
    TwoMessages,
    /// Double-buffered (kernels/prepare_double_buffer.cuh): two halves of one slot per peer of
    /// 16-byte lines, two per vector and one per tail element; a region of its own.
    DoubleBufferedLines,
    /// Double-buffered: two halves of one message-sized slot per peer; a region of its own.
    DoubleBufferedMessageSlots,
    /// Double-buffered, two phases: two halves of one slice-sized slot per peer for the
    /// reduce-scatter, then as many for the all-gather; a region of its own.
    DoubleBufferedSliceSlotsTwice,
}

impl Scratch {
    /// Whether the kernel has no barrier and so needs a region no other kernel touches.
    pub(super) fn is_double_buffered(self) -> bool {
        matches!(
            self,
            Scratch::DoubleBufferedLines
                | Scratch::DoubleBufferedMessageSlots
                | Scratch::DoubleBufferedSliceSlotsTwice
        )
    }
}

/// Everything this module knows about one kernel.
#[derive(Debug)]
pub(super) struct Kernel {
    /// The algorithm's name; the entry symbol adds the dtype.
    name: &'static str,
    source: &'static str,
    cluster: bool,
    pub(super) scratch: Scratch,
    /// The start and end barrier entries in the same source (without the dtype), for a kernel
    /// whose peer traffic the host enqueues as copies between them.
    barriers: Option<[&'static str; 2]>,
    input: InputAccess,
}

/// How a kernel reads this rank's message, which decides what the serving handle does with a
/// caller's tensor (kernels/prepare_abi.cuh).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputAccess {
    /// Only this rank reads it, through `LaunchParams::input`, and every output element is
    /// written by the thread that read it, after reading it: any local memory will do, and the
    /// output may be the input.
    Local,
    /// Peers read it from this rank's registered buffer, from byte 0, so it must be copied there
    /// first unless it is there already. `output_may_alias`: whether the output may be that
    /// input region (false when peers may still read an element after this rank summed it).
    Peers {
        /// Whether the output may be the registered input region itself.
        output_may_alias: bool,
    },
}

/// The entry of the exact NCCL all-reduce's local sum (kernels/nccl_rank_order_sum.cu).
const RANK_ORDER_SUM: &str = "nccl_rank_order_sum";

/// Every kernel, sorted by name.
const KERNELS: [Kernel; 17] = [
    // prepare's unfused residual add + RMSNorm after an all-reduce kernel: local memory only.
    Kernel {
        name: "add_rms_norm",
        source: "add_rms_norm.cu",
        cluster: false,
        scratch: Scratch::None,
        barriers: None,
        input: InputAccess::Local,
    },
    Kernel {
        name: "all_gather_one_shot_pull",
        source: "all_gather.cu",
        cluster: false,
        scratch: Scratch::None,
        barriers: None,
        // Peers read this rank's rows from its input region, from byte 0, until the end
        // barrier, so the output may not be that region.
        input: InputAccess::Peers {
            output_may_alias: false,
        },
    },
    Kernel {
        name: "all_gather_one_shot_push",
        source: "all_gather.cu",
        cluster: false,
        scratch: Scratch::Message,
        barriers: None,
        input: InputAccess::Local,
    },
    // Peers read only their own rows of this rank's input region, before the gather barrier;
    // this rank writes its own rows of `normed` after reading them and the others' after it.
    Kernel {
        name: "all_reduce_add_rms_norm_two_shot",
        source: "all_reduce_add_rms_norm_two_shot.cu",
        cluster: false,
        scratch: Scratch::TwoMessages,
        barriers: None,
        input: InputAccess::Peers {
            output_may_alias: true,
        },
    },
    Kernel {
        name: "all_reduce_full_phased",
        source: "all_reduce_full_phased.cu",
        cluster: true,
        scratch: Scratch::PeerMessageSlots,
        barriers: None,
        input: InputAccess::Local,
    },
    Kernel {
        name: "all_reduce_one_shot_copy_engine",
        source: "all_reduce_one_shot_copy_engine.cu",
        cluster: false,
        scratch: Scratch::None,
        barriers: Some([
            "all_reduce_one_shot_copy_engine_start",
            "all_reduce_one_shot_copy_engine_end",
        ]),
        input: InputAccess::Peers {
            output_may_alias: false,
        },
    },
    Kernel {
        name: "all_reduce_one_shot_pull",
        source: "all_reduce_one_shot.cu",
        cluster: false,
        scratch: Scratch::None,
        barriers: None,
        input: InputAccess::Peers {
            output_may_alias: false,
        },
    },
    Kernel {
        name: "all_reduce_one_shot_push",
        source: "all_reduce_one_shot.cu",
        cluster: false,
        scratch: Scratch::PeerMessageSlots,
        barriers: None,
        input: InputAccess::Local,
    },
    Kernel {
        name: "all_reduce_one_shot_push_ll",
        source: "all_reduce_one_shot_double_buffered.cu",
        cluster: false,
        scratch: Scratch::DoubleBufferedLines,
        barriers: None,
        input: InputAccess::Local,
    },
    Kernel {
        name: "all_reduce_one_shot_push_simple",
        source: "all_reduce_one_shot_double_buffered.cu",
        cluster: false,
        scratch: Scratch::DoubleBufferedMessageSlots,
        barriers: None,
        input: InputAccess::Local,
    },
    Kernel {
        name: "all_reduce_rsag_phased",
        source: "all_reduce_rsag_phased.cu",
        cluster: true,
        scratch: Scratch::PeerSliceSlotsThenMessage,
        barriers: None,
        input: InputAccess::Local,
    },
    Kernel {
        name: "all_reduce_rsag_pull",
        source: "all_reduce_rsag.cu",
        cluster: false,
        scratch: Scratch::Slice,
        barriers: None,
        input: InputAccess::Peers {
            output_may_alias: true,
        },
    },
    Kernel {
        name: "all_reduce_rsag_push",
        source: "all_reduce_rsag.cu",
        cluster: false,
        scratch: Scratch::PeerSliceSlotsThenMessage,
        barriers: None,
        input: InputAccess::Local,
    },
    Kernel {
        name: "all_reduce_rsag_push_simple",
        source: "all_reduce_rsag_double_buffered.cu",
        cluster: false,
        scratch: Scratch::DoubleBufferedSliceSlotsTwice,
        barriers: None,
        input: InputAccess::Local,
    },
    // No profile names it as a custom kernel: it runs between NCCL calls, on NCCL's buffers.
    Kernel {
        name: RANK_ORDER_SUM,
        source: "nccl_rank_order_sum.cu",
        cluster: false,
        scratch: Scratch::None,
        barriers: None,
        input: InputAccess::Local,
    },
    // Peers read only their own rows of this rank's input region, and this rank writes each of
    // its own rows' elements after reading it: the output may be its rows in that region.
    Kernel {
        name: "reduce_scatter_one_shot_pull",
        source: "reduce_scatter.cu",
        cluster: false,
        scratch: Scratch::None,
        barriers: None,
        input: InputAccess::Peers {
            output_may_alias: true,
        },
    },
    Kernel {
        name: "reduce_scatter_one_shot_push",
        source: "reduce_scatter.cu",
        cluster: false,
        scratch: Scratch::PeerMessageSlots,
        barriers: None,
        input: InputAccess::Local,
    },
];

impl Kernel {
    fn spec(&self, dtype: Dtype, world: u32) -> KernelSpec {
        KernelSpec {
            name: format!("{}_{}", self.name, dtype.name()),
            source: self.source,
            cluster: self.cluster,
            dtype,
            world,
        }
    }
}

/// The table entry of a kernel; `None` for a spec that is not a kernel of this crate.
fn kernel_of(spec: &KernelSpec) -> Option<&'static Kernel> {
    KERNELS.iter().find(|kernel| {
        spec.name.strip_suffix(spec.dtype.name()) == Some(&format!("{}_", kernel.name))
    })
}

pub(super) fn kernel_named(spec: &KernelSpec) -> &'static Kernel {
    kernel_of(spec).unwrap_or_else(|| panic!("`{}` is not a kernel of this crate", spec.name))
}

/// The kernel that runs a profile of a `collective` in a package of `dtype` at `world` ranks,
/// or `None` for NCCL profiles (and for what validation refuses, such as a phased one-shot, an
/// unphased full all-reduce or a collective the table does not serve).
pub fn kernel_for(
    profile: &Profile,
    collective: Collective,
    dtype: Dtype,
    world: u32,
) -> Option<KernelSpec> {
    match collective {
        Collective::AllReduce => {}
        Collective::ReduceScatter | Collective::AllGather => {
            return row_kernel_for(profile, collective).map(|name| {
                KERNELS
                    .iter()
                    .find(|kernel| kernel.name == name)
                    .expect("the table has every row kernel")
                    .spec(dtype, world)
            });
        }
        Collective::AllReduceAddRmsNorm => {
            return epilogue_kernel_for(profile).map(|kernel| kernel.spec(dtype, world));
        }
    }
    let name = match (profile.algorithm, profile.schedule) {
        (Algorithm::OneShot, None) => match (profile.transfer_or_default(), profile.protocol) {
            (Transfer::Pull, None | Some(Protocol::Barrier)) => "all_reduce_one_shot_pull",
            (Transfer::Push, None | Some(Protocol::Barrier)) => "all_reduce_one_shot_push",
            (Transfer::Push, Some(Protocol::Ll)) => "all_reduce_one_shot_push_ll",
            (Transfer::Push, Some(Protocol::Simple)) => "all_reduce_one_shot_push_simple",
            (Transfer::CopyEngine, None | Some(Protocol::Barrier)) => {
                "all_reduce_one_shot_copy_engine"
            }
            // Validation refuses a double-buffered pull or copy-engine transfer.
            (Transfer::Pull | Transfer::CopyEngine, Some(Protocol::Ll | Protocol::Simple)) => {
                return None
            }
        },
        (Algorithm::Rsag, None) => match (profile.transfer_or_default(), profile.protocol) {
            (Transfer::Pull, None) => "all_reduce_rsag_pull",
            (Transfer::Push, None) => "all_reduce_rsag_push",
            (Transfer::Push, Some(Protocol::Simple)) => "all_reduce_rsag_push_simple",
            // Validation refuses them: only the one-shot has a copy-engine form, and the RSAG's
            // one protocol is push's simple.
            (Transfer::CopyEngine, _)
            | (Transfer::Pull, Some(_))
            | (Transfer::Push, Some(Protocol::Barrier | Protocol::Ll)) => return None,
        },
        // The phased kernels always write to their peers; `transfer` does not apply.
        (Algorithm::Rsag, Some(Schedule::Phased)) => "all_reduce_rsag_phased",
        (Algorithm::Full, Some(Schedule::Phased)) => "all_reduce_full_phased",
        (Algorithm::OneShot | Algorithm::Full | Algorithm::Nccl, _) => return None,
    };
    KERNELS
        .iter()
        .find(|kernel| kernel.name == name)
        .map(|kernel| kernel.spec(dtype, world))
}

/// The fused kernel of an `all_reduce_add_rms_norm` profile, found by name in the table: the
/// two-shot for an RSAG pulled (`transfer` absent or `pull`) with no protocol or schedule;
/// `None` for every other profile or a kernel the table lacks.
fn epilogue_kernel_for(profile: &Profile) -> Option<&'static Kernel> {
    let name = match (
        profile.algorithm,
        profile.transfer_or_default(),
        profile.protocol,
        profile.schedule,
    ) {
        (Algorithm::Rsag, Transfer::Pull, None, None) => "all_reduce_add_rms_norm_two_shot",
        _ => return None,
    };
    KERNELS.iter().find(|kernel| kernel.name == name)
}

/// The kernel of a reduce-scatter's or all-gather's profile: the one-shot, pulled or pushed,
/// with barriers; `None` for every other profile (NCCL's, and what validation refuses for these
/// collectives).
fn row_kernel_for(profile: &Profile, collective: Collective) -> Option<String> {
    let transfer = match (profile.algorithm, profile.schedule, profile.protocol) {
        (Algorithm::OneShot, None, None | Some(Protocol::Barrier)) => {
            match profile.transfer_or_default() {
                Transfer::Pull => "pull",
                Transfer::Push => "push",
                Transfer::CopyEngine => return None,
            }
        }
        _ => return None,
    };
    Some(format!("{}_one_shot_{transfer}", collective.name()))
}

/// How a kernel reads this rank's message; `None` for a name that is not a kernel of this crate.
pub fn input_access(spec: &KernelSpec) -> Option<InputAccess> {
    kernel_of(spec).map(|kernel| kernel.input)
}

/// Every custom kernel this crate has, for one element type and world size, sorted by name.
pub fn all_kernels(dtype: Dtype, world: u32) -> Vec<KernelSpec> {
    KERNELS
        .iter()
        .map(|kernel| kernel.spec(dtype, world))
        .collect()
}

/// The local sum of the exact NCCL all-reduce (`"order": "rank"`) for one element type and
/// world size.
pub fn rank_order_sum(dtype: Dtype, world: u32) -> KernelSpec {
    KERNELS
        .iter()
        .find(|kernel| kernel.name == RANK_ORDER_SUM)
        .expect("the table has the rank-order sum")
        .spec(dtype, world)
}

/// Whether a package of `ladder` holds the rank-order sum. Never an all-gather's: it sums
/// nothing. Otherwise beyond two ranks always (plain NCCL is not exact there, so every fallback
/// to NCCL needs it, whatever the ladder names), in every reduce-scatter package (rows the world
/// does not divide go through the sends, the receives and this sum, whatever the profile), and
/// wherever a profile asks for it.
pub fn needs_rank_order_sum(ladder: &Ladder) -> bool {
    if ladder.collective == Collective::AllGather {
        return false;
    }
    ladder.world_size > 2
        || ladder.collective == Collective::ReduceScatter
        || ladder
            .profiles
            .iter()
            .any(crate::ladder::Profile::is_nccl_rank_order)
}

/// The distinct kernels a package of the ladder holds, sorted by name: those its custom
/// profiles need, and the rank-order sum ([`needs_rank_order_sum`]).
pub fn kernels_for_ladder(ladder: &Ladder) -> Vec<KernelSpec> {
    let mut kernels: Vec<KernelSpec> = ladder
        .profiles
        .iter()
        .filter_map(|profile| {
            kernel_for(profile, ladder.collective, ladder.dtype, ladder.world_size)
        })
        .chain(
            needs_rank_order_sum(ladder).then(|| rank_order_sum(ladder.dtype, ladder.world_size)),
        )
        .collect();
    kernels.sort();
    kernels.dedup();
    kernels
}

#[cfg(test)]
pub(super) mod tests {
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
                .filter_map(|profile| kernel_for(profile, collective, Dtype::Bf16, 4))
                .count();
            assert!(served > 0, "{collective}");
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

    #[test]
    fn row_collectives_take_the_one_shot_with_barriers_only() {
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
            ("one_shot", Some("push"), Some("ll"), None, None),
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
                    let source = format!("{}.cu", collective.name());
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
}
