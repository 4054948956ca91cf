//! The kernel table: which kernel runs each profile, its source and entry symbol, how it lays
//! out its scratch and how it reads this rank's message.

use crate::ladder::{
    Algorithm, Collective, Dtype, EpilogueForm, Ladder, Profile, Protocol, Schedule, Transfer,
};

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
/// The entry of the unfused epilogue (kernels/add_rms_norm.cu).
const ADD_RMS_NORM: &str = "add_rms_norm";

/// Every kernel, sorted by name.
const KERNELS: [Kernel; 22] = [
    // prepare's unfused residual add + RMSNorm after an all-reduce kernel: local memory only.
    Kernel {
        name: ADD_RMS_NORM,
        source: "add_rms_norm.cu",
        cluster: false,
        scratch: Scratch::None,
        barriers: None,
        input: InputAccess::Local,
    },
    // The peers' rows come by the copy engines, from each owner's input region (from byte 0)
    // straight into this rank's output, until the end barrier: the output may not be that
    // region.
    Kernel {
        name: "all_gather_one_shot_copy_engine",
        source: "all_gather.cu",
        cluster: false,
        scratch: Scratch::None,
        barriers: Some([
            "all_gather_one_shot_copy_engine_start",
            "all_gather_one_shot_copy_engine_end",
        ]),
        input: InputAccess::Peers {
            output_may_alias: false,
        },
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
    // Pushed as ll lines into a region of its own: peers never read this rank's memory.
    Kernel {
        name: "all_gather_one_shot_push_ll",
        source: "all_gather_double_buffered.cu",
        cluster: false,
        scratch: Scratch::DoubleBufferedLines,
        barriers: None,
        input: InputAccess::Local,
    },
    // The fused one-shot all-reduce + residual add + RMSNorm: pushed into a region of its own,
    // so peers never read this rank's x, residual or normed.
    Kernel {
        name: "all_reduce_add_rms_norm_one_shot_push_ll",
        source: "all_reduce_add_rms_norm_one_shot.cu",
        cluster: false,
        scratch: Scratch::DoubleBufferedLines,
        barriers: None,
        input: InputAccess::Local,
    },
    Kernel {
        name: "all_reduce_add_rms_norm_one_shot_push_simple",
        source: "all_reduce_add_rms_norm_one_shot.cu",
        cluster: false,
        scratch: Scratch::DoubleBufferedMessageSlots,
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
    // Each owner's rows pushed to it as ll lines, into a region of its own; this rank reads only
    // its own input, and writes each of its own rows' elements after reading it.
    Kernel {
        name: "reduce_scatter_one_shot_push_ll",
        source: "reduce_scatter_double_buffered.cu",
        cluster: false,
        scratch: Scratch::DoubleBufferedLines,
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
        Collective::AllReduceAddRmsNorm => return epilogue_kernel_for(profile, dtype, world),
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

/// The kernel of a custom profile of `all_reduce_add_rms_norm`: for a separate one its
/// all-reduce kernel (`add_rms_norm` follows it), otherwise the fused kernel its shape names,
/// looked up by name (`None` while the table has no such kernel); `None` for NCCL profiles.
pub fn epilogue_kernel_for(profile: &Profile, dtype: Dtype, world: u32) -> Option<KernelSpec> {
    if profile.is_nccl() {
        return None;
    }
    if profile.has_separate_epilogue() {
        return kernel_for(profile, Collective::AllReduce, dtype, world);
    }
    let name = profile.fused_shape()?.kernel_name();
    KERNELS
        .iter()
        .find(|kernel| kernel.name == name)
        .map(|kernel| kernel.spec(dtype, world))
}

/// prepare's unfused residual add + RMSNorm, which every separate candidate of
/// `all_reduce_add_rms_norm` runs after its all-reduce.
pub fn add_rms_norm(dtype: Dtype, world: u32) -> KernelSpec {
    KERNELS
        .iter()
        .find(|kernel| kernel.name == ADD_RMS_NORM)
        .expect("the table has the add + RMSNorm kernel")
        .spec(dtype, world)
}

/// The kernel that runs after a candidate's all-reduce: `add_rms_norm` for the NCCL and
/// separate candidates of `all_reduce_add_rms_norm`, `None` for a fused one and for every
/// other collective.
pub fn epilogue_after(
    profile: &Profile,
    collective: Collective,
    dtype: Dtype,
    world: u32,
) -> Option<KernelSpec> {
    matches!(
        profile.epilogue_form(collective),
        Some(EpilogueForm::SeparateKernel | EpilogueForm::SeparateNccl)
    )
    .then(|| add_rms_norm(dtype, world))
}

/// The kernel of a reduce-scatter's or all-gather's profile: the one-shot, pulled or pushed,
/// with barriers, or pushed as ll lines, and the all-gather's copy engine; `None` for every
/// other profile (NCCL's, and what validation refuses for these collectives).
fn row_kernel_for(profile: &Profile, collective: Collective) -> Option<String> {
    let form = match (profile.algorithm, profile.schedule, profile.protocol) {
        (Algorithm::OneShot, None, None | Some(Protocol::Barrier)) => {
            match profile.transfer_or_default() {
                Transfer::Pull => "pull",
                Transfer::Push => "push",
                Transfer::CopyEngine if collective == Collective::AllGather => "copy_engine",
                Transfer::CopyEngine => return None,
            }
        }
        (Algorithm::OneShot, None, Some(Protocol::Ll))
            if profile.transfer_or_default() == Transfer::Push =>
        {
            "push_ll"
        }
        _ => return None,
    };
    Some(format!("{}_one_shot_{form}", collective.name()))
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
/// profiles need, the rank-order sum ([`needs_rank_order_sum`]), and for
/// `all_reduce_add_rms_norm` the add + RMSNorm kernel (every NCCL or separate candidate runs
/// it, and the fallback above the last bucket too).
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
        .chain(
            (ladder.collective == Collective::AllReduceAddRmsNorm)
                .then(|| add_rms_norm(ladder.dtype, ladder.world_size)),
        )
        .collect();
    kernels.sort();
    kernels.dedup();
    kernels
}

#[cfg(test)]
pub(super) mod tests;
