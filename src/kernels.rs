//! The custom kernels: which CUDA source and entry symbol serve each profile, the sources
//! embedded in the binary, the scratch each kernel needs, and the launch contract shared with
//! `kernels/prepare_abi.cuh`.

pub use crate::abi::{
    AllReduceParams, ABORT_FLAG, ABORT_INVALID_LAUNCH, ABORT_PEER_TIMEOUT, ALIGNMENT_BYTES,
    BUFFER_ALIGNMENT_BYTES, MAX_BLOCKS, MAX_RANKS, SIGNAL_BYTES, SIGNAL_SETS, SIGNAL_WORDS,
    STATE_WORDS,
};
use crate::ladder::{Algorithm, Dtype, Ladder, Profile, Protocol, Schedule, Transfer};

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

/// How a kernel's scratch region is laid out (kernels/prepare_layout.cuh).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scratch {
    /// No scratch.
    None,
    /// One message-sized region.
    Message,
    /// One message-sized slot per rank.
    MessageSlots,
    /// One slice-sized slot per rank, then one message-sized region.
    SliceSlotsThenMessage,
    /// Double-buffered (kernels/prepare_double_buffer.cuh): two halves of one slot per rank of
    /// 16-byte lines, two per vector and one per tail element; a region of its own.
    DoubleBufferedLines,
    /// Double-buffered: two halves of one message-sized slot per rank; a region of its own.
    DoubleBufferedMessageSlots,
}

impl Scratch {
    /// Whether the kernel has no barrier and so needs a region no other kernel touches.
    fn is_double_buffered(self) -> bool {
        matches!(
            self,
            Scratch::DoubleBufferedLines | Scratch::DoubleBufferedMessageSlots
        )
    }
}

/// Everything this module knows about one kernel.
#[derive(Debug)]
struct Kernel {
    /// The algorithm's name; the entry symbol adds the dtype.
    name: &'static str,
    source: &'static str,
    cluster: bool,
    scratch: Scratch,
    /// The start and end barrier entries in the same source (without the dtype), for a kernel
    /// whose peer traffic the host enqueues as copies between them.
    barriers: Option<[&'static str; 2]>,
    input: InputAccess,
}

/// How a kernel reads this rank's message, which decides what the serving handle does with a
/// caller's tensor (kernels/prepare_abi.cuh).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputAccess {
    /// Only this rank reads it, through `AllReduceParams::input`, and every output element is
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

/// Every kernel, sorted by name.
const KERNELS: [Kernel; 9] = [
    Kernel {
        name: "all_reduce_full_phased",
        source: "all_reduce_full_phased.cu",
        cluster: true,
        scratch: Scratch::MessageSlots,
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
        scratch: Scratch::MessageSlots,
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
        scratch: Scratch::SliceSlotsThenMessage,
        barriers: None,
        input: InputAccess::Local,
    },
    Kernel {
        name: "all_reduce_rsag_pull",
        source: "all_reduce_rsag.cu",
        cluster: false,
        scratch: Scratch::Message,
        barriers: None,
        input: InputAccess::Peers {
            output_may_alias: true,
        },
    },
    Kernel {
        name: "all_reduce_rsag_push",
        source: "all_reduce_rsag.cu",
        cluster: false,
        scratch: Scratch::SliceSlotsThenMessage,
        barriers: None,
        input: InputAccess::Local,
    },
];

/// The kernel sources, by file name.
const SOURCES: [(&str, &str); 6] = [
    (
        "all_reduce_full_phased.cu",
        include_str!("../kernels/all_reduce_full_phased.cu"),
    ),
    (
        "all_reduce_one_shot.cu",
        include_str!("../kernels/all_reduce_one_shot.cu"),
    ),
    (
        "all_reduce_one_shot_copy_engine.cu",
        include_str!("../kernels/all_reduce_one_shot_copy_engine.cu"),
    ),
    (
        "all_reduce_one_shot_double_buffered.cu",
        include_str!("../kernels/all_reduce_one_shot_double_buffered.cu"),
    ),
    (
        "all_reduce_rsag.cu",
        include_str!("../kernels/all_reduce_rsag.cu"),
    ),
    (
        "all_reduce_rsag_phased.cu",
        include_str!("../kernels/all_reduce_rsag_phased.cu"),
    ),
];

/// The headers the sources include, by the name they are included as.
const HEADERS: [(&str, &str); 7] = [
    (
        "prepare_abi.cuh",
        include_str!("../kernels/prepare_abi.cuh"),
    ),
    (
        "prepare_cluster.cuh",
        include_str!("../kernels/prepare_cluster.cuh"),
    ),
    (
        "prepare_double_buffer.cuh",
        include_str!("../kernels/prepare_double_buffer.cuh"),
    ),
    (
        "prepare_element.cuh",
        include_str!("../kernels/prepare_element.cuh"),
    ),
    (
        "prepare_entry.cuh",
        include_str!("../kernels/prepare_entry.cuh"),
    ),
    (
        "prepare_layout.cuh",
        include_str!("../kernels/prepare_layout.cuh"),
    ),
    (
        "prepare_sync.cuh",
        include_str!("../kernels/prepare_sync.cuh"),
    ),
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

fn kernel_named(spec: &KernelSpec) -> &'static Kernel {
    kernel_of(spec).unwrap_or_else(|| panic!("`{}` is not a kernel of this crate", spec.name))
}

/// The kernel that runs a profile in a package of `dtype` at `world` ranks, or `None` for NCCL
/// profiles (and for combinations that validation refuses, such as a phased one-shot or an
/// unphased full all-reduce).
pub fn kernel_for(profile: &Profile, dtype: Dtype, world: u32) -> Option<KernelSpec> {
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
        (Algorithm::Rsag, None) => match profile.transfer_or_default() {
            Transfer::Pull => "all_reduce_rsag_pull",
            Transfer::Push => "all_reduce_rsag_push",
            // Validation refuses it: only the one-shot has a copy-engine form.
            Transfer::CopyEngine => return None,
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

/// The start and end barrier entries of a kernel whose peer traffic the host enqueues as copies
/// (`transfer: copy_engine`), in the same source; `None` for every other kernel (and for a name
/// that is not a kernel of this crate).
pub fn copy_engine_barriers(spec: &KernelSpec) -> Option<[&'static str; 2]> {
    KERNELS
        .iter()
        .find(|kernel| kernel.name == spec.name)
        .and_then(|kernel| kernel.barriers)
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

/// The distinct kernels a ladder's profiles need, sorted by name.
pub fn kernels_for_ladder(ladder: &Ladder) -> Vec<KernelSpec> {
    let mut kernels: Vec<KernelSpec> = ladder
        .profiles
        .iter()
        .filter_map(|profile| kernel_for(profile, ladder.dtype, ladder.world_size))
        .collect();
    kernels.sort();
    kernels.dedup();
    kernels
}

/// The CUDA source of a kernel, embedded in the binary.
pub fn source(spec: &KernelSpec) -> &'static str {
    SOURCES
        .iter()
        .find(|(file, _)| *file == spec.source)
        .map_or_else(
            || panic!("`{}` is not a kernel source of this crate", spec.source),
            |(_, text)| *text,
        )
}

/// The headers every source may include, as (include name, text), for NVRTC's named headers.
pub fn headers() -> &'static [(&'static str, &'static str)] {
    &HEADERS
}

fn round_up(value: u64, multiple: u64) -> u64 {
    value.div_ceil(multiple) * multiple
}

/// Bytes of a message-sized scratch region (kernels/prepare_layout.cuh `message_bytes`).
fn message_bytes(elements: u64, dtype: Dtype) -> u64 {
    round_up(elements * dtype.size_bytes(), ALIGNMENT_BYTES)
}

/// The chunk in which the two halves of a double-buffered region interleave
/// (kernels/prepare_double_buffer.cuh).
pub const DOUBLE_BUFFER_CHUNK_BYTES: u64 = 8192;

/// Bytes of a double-buffered region for slots of `slot_bytes`: both halves of every rank's
/// slot, each cut into whole chunks.
fn double_buffered_bytes(slot_bytes: u64, world: u64) -> u64 {
    2 * world * round_up(slot_bytes, DOUBLE_BUFFER_CHUNK_BYTES)
}

/// Lines to reserve for every message up to `elements` in the flags-in-data kernel. A message
/// takes two lines per whole vector and one per tail element (one if empty), which does not
/// grow with the message (for bf16, 15 elements take 9 lines, 16 take 4); one vector fewer and
/// the longest tail is the most any smaller message takes.
fn line_capacity(elements: u64, dtype: Dtype) -> u64 {
    2 * (elements / dtype.per_vector()) + dtype.per_vector() - 1
}

/// Bytes of one rank's slot of a slice, tail included (`slot_bytes`).
fn slice_slot_bytes(elements: u64, dtype: Dtype, world: u64) -> u64 {
    ((elements / dtype.per_vector()).div_ceil(world) + 1) * ALIGNMENT_BYTES
}

/// Scratch bytes a kernel needs for messages up to `max_bytes` at its world size; it grows with
/// the message, so the largest message sizes the region.
pub fn scratch_bytes(spec: &KernelSpec, max_bytes: u64) -> u64 {
    let dtype = spec.dtype;
    let elements = max_bytes.div_ceil(dtype.size_bytes());
    let world = u64::from(spec.world);
    match kernel_named(spec).scratch {
        Scratch::None => 0,
        Scratch::Message => message_bytes(elements, dtype),
        Scratch::MessageSlots => world * message_bytes(elements, dtype),
        Scratch::SliceSlotsThenMessage => {
            world * slice_slot_bytes(elements, dtype, world) + message_bytes(elements, dtype)
        }
        Scratch::DoubleBufferedLines => {
            double_buffered_bytes(line_capacity(elements, dtype) * ALIGNMENT_BYTES, world)
        }
        Scratch::DoubleBufferedMessageSlots => {
            double_buffered_bytes(message_bytes(elements, dtype), world)
        }
    }
}

/// Whether a kernel has no barrier and so a scratch region of its own (a peer may still be in
/// its previous launch, of any kernel, when this one writes).
pub fn is_double_buffered(spec: &KernelSpec) -> bool {
    kernel_named(spec).scratch.is_double_buffered()
}

/// Where the kernels' scratch lies after the input region: the region the barrier kernels
/// share, then one region per double-buffered kernel, in name order.
fn scratch_regions(ladder: &Ladder) -> (u64, Vec<(String, u64)>) {
    let mut shared = 0;
    let mut own: Vec<(String, u64)> = Vec::new();
    for (max_bytes, spec) in custom_bucket_kernels(ladder) {
        // Every size is a multiple of 16 bytes; a double-buffered region, of its chunk.
        let bytes = scratch_bytes(&spec, max_bytes);
        if is_double_buffered(&spec) {
            match own.iter_mut().find(|(name, _)| *name == spec.name) {
                Some((_, largest)) => *largest = (*largest).max(bytes),
                None => own.push((spec.name, bytes)),
            }
        } else {
            shared = shared.max(bytes);
        }
    }
    own.sort();
    (shared, own)
}

/// Bytes of scratch the ladder's custom candidates need after the input region: the shared
/// region plus every double-buffered kernel's own.
pub fn scratch_region_bytes(ladder: &Ladder) -> u64 {
    let (shared, own) = scratch_regions(ladder);
    shared + own.iter().map(|(_, bytes)| bytes).sum::<u64>()
}

/// Where `spec`'s scratch starts, in bytes after the end of the input region: 0 for the
/// barrier kernels, which share one region; after it, each double-buffered kernel's own.
pub fn scratch_offset_after_input(ladder: &Ladder, spec: &KernelSpec) -> u64 {
    let (shared, own) = scratch_regions(ladder);
    if !is_double_buffered(spec) {
        return 0;
    }
    let mut offset = shared;
    for (name, bytes) in &own {
        if *name == spec.name {
            return offset;
        }
        offset += bytes;
    }
    panic!("{} is not a kernel of ladder {}", spec.name, ladder.name)
}

/// The largest message any custom candidate of the ladder takes, rounded up to
/// [`BUFFER_ALIGNMENT_BYTES`]: the input region, so also every launch's `scratch_offset`.
/// Zero when only NCCL is ever a candidate.
pub fn input_region_bytes(ladder: &Ladder) -> u64 {
    custom_bucket_kernels(ladder)
        .map(|(max_bytes, _)| round_up(max_bytes, BUFFER_ALIGNMENT_BYTES))
        .max()
        .unwrap_or(0)
}

/// Bytes of the registered buffer each GPU needs for the ladder: the input region plus
/// [`scratch_region_bytes`], rounded up to [`BUFFER_ALIGNMENT_BYTES`]. The signal flags
/// ([`SIGNAL_BYTES`]) come on top.
pub fn peer_buffer_bytes(ladder: &Ladder) -> u64 {
    round_up(
        input_region_bytes(ladder) + scratch_region_bytes(ladder),
        BUFFER_ALIGNMENT_BYTES,
    )
}

/// Bytes of one peer's slot in the copy-engine candidates' private scratch: the largest message
/// of the buckets that have such a candidate, rounded up to [`ALIGNMENT_BYTES`]; `None` when
/// the ladder has none. Each GPU allocates `world_size - 1` slots, not peer-mapped.
pub fn copy_engine_slot_bytes(ladder: &Ladder) -> Option<u64> {
    custom_bucket_kernels(ladder)
        .filter(|(_, spec)| spec.copy_engine_barriers().is_some())
        .map(|(max_bytes, _)| round_up(max_bytes, ALIGNMENT_BYTES))
        .max()
}

/// Every (bucket `max_bytes`, kernel) pair where a bucket has a custom candidate.
fn custom_bucket_kernels(ladder: &Ladder) -> impl Iterator<Item = (u64, KernelSpec)> + '_ {
    ladder.buckets.iter().flat_map(move |bucket| {
        bucket.candidates.iter().filter_map(move |id| {
            let profile = ladder.profile(id)?;
            Some((
                bucket.max_bytes,
                kernel_for(profile, ladder.dtype, ladder.world_size)?,
            ))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::fmt::Write as _;

    /// `#define NAME VALUE` lines of the contract header, values as written.
    fn header_defines() -> BTreeMap<String, String> {
        include_str!("../kernels/prepare_abi.cuh")
            .lines()
            .filter_map(|line| {
                let mut words = line.strip_prefix("#define ")?.split_whitespace();
                Some((
                    words.next()?.to_owned(),
                    words.collect::<Vec<_>>().join(" "),
                ))
            })
            .collect()
    }

    fn define_value(defines: &BTreeMap<String, String>, name: &str) -> u64 {
        let text = defines
            .get(name)
            .unwrap_or_else(|| panic!("{name} missing"));
        let digits = text.trim_end_matches("ull");
        if let Some(hex) = digits.strip_prefix("0x") {
            u64::from_str_radix(hex, 16).unwrap()
        } else {
            digits.parse().unwrap()
        }
    }

    #[test]
    fn constants_match_the_contract_header() {
        let defines = header_defines();
        assert_eq!(
            define_value(&defines, "PREPARE_MAX_RANKS"),
            MAX_RANKS as u64
        );
        assert_eq!(
            define_value(&defines, "PREPARE_MAX_BLOCKS"),
            MAX_BLOCKS as u64
        );
        assert_eq!(
            define_value(&defines, "PREPARE_SIGNAL_SETS"),
            SIGNAL_SETS as u64
        );
        assert_eq!(define_value(&defines, "PREPARE_ABORT_FLAG"), ABORT_FLAG);
        assert_eq!(
            define_value(&defines, "PREPARE_ABORT_PEER_TIMEOUT"),
            ABORT_PEER_TIMEOUT
        );
        assert_eq!(
            define_value(&defines, "PREPARE_ABORT_INVALID_LAUNCH"),
            ABORT_INVALID_LAUNCH
        );
        assert_eq!(
            define_value(&defines, "PREPARE_ALIGNMENT_BYTES"),
            ALIGNMENT_BYTES
        );
        assert_eq!(
            defines["PREPARE_SIGNAL_WORDS"],
            "(PREPARE_SIGNAL_SETS * PREPARE_MAX_RANKS * PREPARE_MAX_BLOCKS)"
        );
        assert_eq!(defines["PREPARE_STATE_WORDS"], "(3 + PREPARE_MAX_BLOCKS)");
    }

    #[test]
    fn params_fields_match_the_contract_header_in_order() {
        let header = include_str!("../kernels/prepare_abi.cuh");
        let body = &header[header.find("struct AllReduceParams {").unwrap()..];
        let body = &body[..body.find("};").unwrap()];
        let fields: Vec<String> = body
            .lines()
            .map(str::trim)
            .filter(|line| !line.starts_with("//") && line.ends_with(';'))
            .map(|line| line.trim_end_matches(';').to_owned())
            .collect();
        assert_eq!(
            fields,
            [
                "unsigned char* buffers[PREPARE_MAX_RANKS]",
                "unsigned long long* signals[PREPARE_MAX_RANKS]",
                "unsigned long long* state",
                "void* output",
                "const unsigned char* input",
                "unsigned long long elements",
                "unsigned long long scratch_offset",
                "unsigned long long timeout_ns",
                "unsigned int rank",
                "unsigned int world",
            ]
        );
        // Those C fields on a 64-bit target: 8-byte pointers and u64, 4-byte u32, no padding.
        assert_eq!(std::mem::size_of::<AllReduceParams>(), 184);
        assert_eq!(std::mem::align_of::<AllReduceParams>(), 8);
        assert_eq!(std::mem::offset_of!(AllReduceParams, signals), 64);
        assert_eq!(std::mem::offset_of!(AllReduceParams, state), 128);
        assert_eq!(std::mem::offset_of!(AllReduceParams, output), 136);
        assert_eq!(std::mem::offset_of!(AllReduceParams, input), 144);
        assert_eq!(std::mem::offset_of!(AllReduceParams, elements), 152);
        assert_eq!(std::mem::offset_of!(AllReduceParams, scratch_offset), 160);
        assert_eq!(std::mem::offset_of!(AllReduceParams, timeout_ns), 168);
        assert_eq!(std::mem::offset_of!(AllReduceParams, rank), 176);
        assert_eq!(std::mem::offset_of!(AllReduceParams, world), 180);
    }

    #[test]
    fn every_kernel_is_defined_in_its_source_and_every_include_is_a_header() {
        for spec in all_kernels(Dtype::Bf16, 2) {
            let text = source(&spec);
            let base = spec.name.strip_suffix("_bf16").unwrap();
            let shape = if spec.cluster {
                "cluster_kernel"
            } else {
                "block_kernel"
            };
            assert!(
                text.contains(&format!("PREPARE_ENTRY({base}, {shape}, ")),
                "{} does not define {base} as a {shape}",
                spec.source,
            );
            let uses_cluster = text.contains("prepare_cluster.cuh");
            assert_eq!(uses_cluster, spec.cluster, "{}", spec.name);
        }
        let header_names: Vec<&str> = headers().iter().map(|(name, _)| *name).collect();
        let texts = SOURCES.iter().chain(HEADERS.iter());
        for (file, text) in texts {
            for line in text.lines() {
                if let Some(include) = line.strip_prefix("#include ") {
                    let name = include.trim_matches('"');
                    assert!(
                        header_names.contains(&name),
                        "{file} includes {name}, which is not a named header"
                    );
                }
            }
        }
    }

    fn ladder(json: &str) -> Ladder {
        serde_json::from_str(json).unwrap()
    }

    /// A world-4 ladder like the second example of docs/ladders.md, with every kind of profile.
    const EXAMPLE: &str = r#"{
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
                    let kernel =
                        kernel_for(&serde_json::from_value(profile).unwrap(), Dtype::Bf16, 2);
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

    /// The kernel of that entry name (its dtype from the suffix) at `world` ranks.
    fn spec(name: &str, world: u32) -> KernelSpec {
        Dtype::ALL
            .into_iter()
            .flat_map(|dtype| all_kernels(dtype, world))
            .find(|spec| spec.name == name)
            .unwrap_or_else(|| panic!("no kernel {name}"))
    }

    fn scratch(name: &str, world: u32, max_bytes: u64) -> u64 {
        scratch_bytes(&spec(name, world), max_bytes)
    }

    #[test]
    fn scratch_follows_each_layout() {
        // 16 KiB at 4 ranks: 8192 elements, 1024 vectors, 256 per slice.
        assert_eq!(scratch("all_reduce_one_shot_pull_bf16", 4, 16384), 0);
        assert_eq!(
            scratch("all_reduce_one_shot_push_bf16", 4, 16384),
            4 * 16384
        );
        assert_eq!(scratch("all_reduce_full_phased_bf16", 4, 16384), 4 * 16384);
        assert_eq!(scratch("all_reduce_rsag_pull_bf16", 4, 16384), 16384);
        assert_eq!(
            scratch("all_reduce_rsag_push_bf16", 4, 16384),
            4 * 257 * 16 + 16384
        );
        assert_eq!(
            scratch("all_reduce_rsag_phased_bf16", 4, 16384),
            4 * 257 * 16 + 16384
        );
        // 96 bytes at 3 ranks: 48 elements, 6 vectors, 2 per slice; slots of 3 vectors.
        assert_eq!(scratch("all_reduce_rsag_push_bf16", 3, 96), 3 * 48 + 96);
        // A message that is not whole vectors still gets whole-vector regions.
        assert_eq!(scratch("all_reduce_one_shot_push_bf16", 2, 18), 2 * 32);
        // fp32: 96 bytes are 24 elements, 6 vectors of 4, as for bf16; 16 KiB at 4 ranks the
        // same bytes; fp16 lays out exactly as bf16.
        assert_eq!(scratch("all_reduce_rsag_push_fp32", 3, 96), 3 * 48 + 96);
        assert_eq!(
            scratch("all_reduce_rsag_phased_fp32", 4, 16384),
            4 * 257 * 16 + 16384
        );
        assert_eq!(scratch("all_reduce_one_shot_push_fp32", 2, 20), 2 * 32);
        for name in ["rsag_push", "one_shot_push_ll", "one_shot_push_simple"] {
            assert_eq!(
                scratch(&format!("all_reduce_{name}_fp16"), 5, 1000),
                scratch(&format!("all_reduce_{name}_bf16"), 5, 1000)
            );
        }
    }

    /// Lines the flags-in-data kernel uses for a message (all_reduce_one_shot_double_buffered.cu).
    fn line_count(elements: u64) -> u64 {
        lines_of(elements, Dtype::Bf16)
    }

    /// Lines a message of `elements` takes in the flags-in-data kernel.
    fn lines_of(elements: u64, dtype: Dtype) -> u64 {
        let per = dtype.per_vector();
        (2 * (elements / per) + elements % per).max(1)
    }

    #[test]
    fn double_buffered_scratch_holds_both_halves_in_whole_chunks() {
        // 16 KiB at 4 ranks: 1024 vectors, room for 2048 + 7 lines of 16 bytes: 5 chunks.
        assert_eq!(
            scratch("all_reduce_one_shot_push_ll_bf16", 4, 16384),
            2 * 4 * 5 * DOUBLE_BUFFER_CHUNK_BYTES
        );
        assert_eq!(
            scratch("all_reduce_one_shot_push_simple_bf16", 4, 16384),
            2 * 4 * 16384
        );
        // 9 elements: one vector (2 lines) and one tail line; any slot takes a whole chunk.
        assert_eq!(
            scratch("all_reduce_one_shot_push_ll_bf16", 2, 18),
            2 * 2 * DOUBLE_BUFFER_CHUNK_BYTES
        );
        assert_eq!(
            scratch("all_reduce_one_shot_push_simple_bf16", 3, 18),
            2 * 3 * DOUBLE_BUFFER_CHUNK_BYTES
        );
        // An empty message still has its one line.
        assert_eq!(line_count(0), 1);
        assert_eq!(line_count(8), 2);
        assert_eq!(line_count(15), 9);
    }

    #[test]
    fn lines_reserved_for_a_bucket_hold_every_smaller_message() {
        // The largest message of a bucket need not take the most lines: near a chunk boundary
        // (4096 elements fill two chunks exactly) a few elements less take more.
        for dtype in Dtype::ALL {
            for largest in (0..40_000u64).chain((1..64).map(|k| (k << 20) / 2)) {
                for elements in largest.saturating_sub(16)..=largest {
                    assert!(
                        lines_of(elements, dtype) <= line_capacity(largest, dtype),
                        "{dtype}: {elements} of at most {largest}"
                    );
                }
            }
        }
        assert!(line_count(524_285) > line_count(524_288));
    }

    /// Two buckets where barrier and double-buffered kernels meet.
    const MIXED: &str = r#"{
        "format_version": 1, "name": "mixed", "collective": "all_reduce", "dtype": "bf16",
        "world_size": 2, "targets": ["sm_90"],
        "profiles": [
            { "id": "push", "algorithm": "one_shot", "transfer": "push" },
            { "id": "ll", "algorithm": "one_shot", "transfer": "push", "protocol": "ll" },
            { "id": "simple", "algorithm": "one_shot", "transfer": "push", "protocol": "simple" },
            { "id": "barrier", "algorithm": "one_shot", "transfer": "push", "protocol": "barrier" },
            { "id": "nccl", "algorithm": "nccl" }
        ],
        "buckets": [
            { "max_bytes": 16384, "threads": 256, "blocks": 4,
              "candidates": ["push", "ll", "simple", "nccl"], "default": "ll" },
            { "max_bytes": 65536, "threads": 256, "blocks": 4,
              "candidates": ["barrier", "simple", "nccl"], "default": "simple" }
        ]
    }"#;

    #[test]
    fn each_double_buffered_kernel_has_a_region_of_its_own_after_the_shared_one() {
        let mixed = ladder(MIXED);
        let push = spec("all_reduce_one_shot_push_bf16", 2);
        let ll = spec("all_reduce_one_shot_push_ll_bf16", 2);
        let simple = spec("all_reduce_one_shot_push_simple_bf16", 2);
        assert!(!is_double_buffered(&push));
        assert!(is_double_buffered(&ll) && is_double_buffered(&simple));
        // `protocol: barrier` is the ordinary push kernel.
        let barrier = kernel_for(mixed.profile("barrier").unwrap(), Dtype::Bf16, 2).unwrap();
        assert_eq!(barrier, push);
        // Shared: one-shot push at 64 KiB, 2 slots. Then ll (16 KiB: room for 2048 + 7 lines,
        // 5 chunks a slot) and simple (64 KiB).
        let shared = 2 * 65536;
        let ll_region = 2 * 2 * 5 * DOUBLE_BUFFER_CHUNK_BYTES;
        let simple_region = 2 * 2 * 65536;
        assert_eq!(scratch_offset_after_input(&mixed, &push), 0);
        assert_eq!(scratch_offset_after_input(&mixed, &ll), shared);
        assert_eq!(
            scratch_offset_after_input(&mixed, &simple),
            shared + ll_region
        );
        assert_eq!(
            scratch_region_bytes(&mixed),
            shared + ll_region + simple_region
        );
        assert_eq!(
            peer_buffer_bytes(&mixed),
            65536 + shared + ll_region + simple_region
        );
    }

    #[test]
    fn peer_buffer_is_sized_by_the_largest_bucket_with_custom_candidates() {
        let example = ladder(EXAMPLE);
        // The NCCL-only 1 MiB bucket does not count; the 96 KiB one does.
        assert_eq!(input_region_bytes(&example), 98304);
        // Largest scratch: one_shot_push (or full_phased) at 96 KiB, 4 slots.
        assert_eq!(peer_buffer_bytes(&example), 98304 + 4 * 98304);
        let mut nccl_only = example.clone();
        for bucket in &mut nccl_only.buckets {
            bucket.candidates = vec!["nccl".to_owned()];
        }
        assert_eq!(input_region_bytes(&nccl_only), 0);
        assert_eq!(peer_buffer_bytes(&nccl_only), 0);
    }

    #[test]
    fn copy_engine_scratch_is_sized_by_its_largest_bucket_only() {
        let mut example = ladder(EXAMPLE);
        assert_eq!(copy_engine_slot_bytes(&example), None);
        example.profiles.push(
            serde_json::from_value(serde_json::json!({
                "id": "copy", "algorithm": "one_shot", "transfer": "copy_engine"
            }))
            .unwrap(),
        );
        example.buckets[0].candidates.push("copy".to_owned());
        // Only the 16 KiB bucket has it; the 1 MiB bucket does not count.
        assert_eq!(copy_engine_slot_bytes(&example), Some(16384));
        example.buckets[2].candidates.push("copy".to_owned());
        assert_eq!(copy_engine_slot_bytes(&example), Some(1 << 20));
        let spec = kernel_for(example.profile("copy").unwrap(), Dtype::Bf16, 4).unwrap();
        assert_eq!(
            spec.copy_engine_barriers(),
            Some([
                "all_reduce_one_shot_copy_engine_start_bf16".to_owned(),
                "all_reduce_one_shot_copy_engine_end_bf16".to_owned()
            ])
        );
        // No registered scratch, and the barriers belong to no other kernel.
        assert_eq!(scratch_bytes(&spec, 1 << 20), 0);
        assert!(all_kernels(Dtype::Bf16, 4)
            .iter()
            .filter(|other| **other != spec)
            .all(|other| other.copy_engine_barriers().is_none()));
    }

    /// `slice_of` of kernels/prepare_layout.cuh for `per` elements a vector, element ranges:
    /// (vectors, tail).
    fn slice_of(slice: u64, elements: u64, world: u64, per: u64) -> ((u64, u64), (u64, u64)) {
        let vectors = elements / per;
        let per_slice = vectors.div_ceil(world);
        let last = slice == world - 1;
        let begin = (slice * per_slice).min(vectors);
        let end = if last {
            vectors
        } else {
            ((slice + 1) * per_slice).min(vectors)
        };
        let tail = if last {
            (vectors * per, elements)
        } else {
            (0, 0)
        };
        ((begin, end), tail)
    }

    proptest::proptest! {
        /// The slices cover every element once, in order, and each fits a slot of
        /// `slice_slot_bytes`, so the scratch `scratch_bytes` reports holds what the kernels
        /// write for any message up to the bucket's size.
        #[test]
        fn slices_partition_the_message_and_fit_their_slots(
            elements in 0u64..5000,
            world in 2u64..=8,
            smaller in 0u64..5000,
            dtype in proptest::sample::select(Dtype::ALL.to_vec()),
        ) {
            let per = dtype.per_vector();
            let size = dtype.size_bytes();
            let mut next = 0;
            for slice in 0..world {
                let ((begin, end), (tail_begin, tail_end)) = slice_of(slice, elements, world, per);
                proptest::prop_assert!(begin <= end);
                if begin < end {
                    proptest::prop_assert_eq!(begin * per, next);
                    next = end * per;
                }
                if tail_begin < tail_end {
                    proptest::prop_assert_eq!(tail_begin, next);
                    next = tail_end;
                }
                // The highest byte written into a slot: the last tail element, or the last vector.
                let used = if tail_begin < tail_end {
                    (tail_end - begin * per) * size
                } else {
                    (end - begin) * 16
                };
                proptest::prop_assert!(used <= slice_slot_bytes(elements, dtype, world));
            }
            proptest::prop_assert_eq!(next, elements);
            // Scratch grows with the message, so the bucket's largest message sizes it.
            let smaller = smaller.min(elements);
            for spec in all_kernels(dtype, world as u32) {
                proptest::prop_assert!(
                    scratch_bytes(&spec, smaller * size) <= scratch_bytes(&spec, elements * size)
                );
            }
        }
    }
}
