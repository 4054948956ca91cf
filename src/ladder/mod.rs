//! Ladders: the JSON catalog of collective candidates for one collective, dtype, world size
//! and set of architectures. Types here are the single source of the ladder's JSON Schema.

mod epilogue;
mod exactness;
mod validate;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use epilogue::{epilogue_forms, EpilogueForm, FusedForm};
pub use exactness::{is_exact, plain_nccl_is_exact};
pub use validate::{
    validate_ladder, validate_ladder_bytes, validate_ladder_file, validate_ladder_text, Diagnostic,
    LadderError, Rule, Stage, ValidationReport,
};

/// The ladder format versions this tool reads.
pub const LADDER_FORMAT_VERSIONS: &[u32] = &[1];

/// Every bucket boundary is a whole number of 16-byte vectors on every rank.
pub const VECTOR_BYTES: u64 = 16;

/// The only cluster size a clustered bucket may use.
pub const CLUSTER_SIZE: u32 = 8;
/// The launch geometry a clustered bucket must have.
pub const CLUSTER_THREADS: u32 = 512;
/// Blocks in a clustered bucket: eight clusters of eight.
pub const CLUSTER_BLOCKS: u32 = 64;

/// A collective catalog: profiles (named algorithms with parameters) and message-size buckets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "prepare collective ladder")]
pub struct Ladder {
    /// Optional reference to this schema, so editors check the file.
    #[serde(rename = "$schema", default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    /// The ladder format; 1 is the only one so far.
    pub format_version: u32,
    /// A non-empty name that identifies the catalog.
    pub name: String,
    /// Free text for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The collective every candidate performs: `all_reduce`, `reduce_scatter`, `all_gather` or
    /// `all_reduce_add_rms_norm`.
    pub collective: Collective,
    /// The element type of the message.
    pub dtype: Dtype,
    /// Ranks taking part, 2 to 8 (peer kernels run within one host).
    pub world_size: u32,
    /// The architectures a package may be exported for; no other is accepted.
    pub targets: Vec<Arch>,
    /// A catalog without clustered buckets to use where this one's clustered buckets cannot run
    /// (too few SMs, no cluster launch); named in the refusal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordinary_ladder: Option<String>,
    /// Named algorithms with their parameters.
    pub profiles: Vec<Profile>,
    /// Message-size ranges in strictly increasing `max_bytes`; bucket i covers
    /// (`max_bytes[i-1]`, `max_bytes[i]`]. Larger messages use NCCL.
    pub buckets: Vec<Bucket>,
}

/// A collective operation: with the dtype, the key of a package, of the kernel table and of
/// every serving call.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Collective {
    /// Every rank ends with the element-wise sum of every rank's input.
    AllReduce,
    /// Every rank ends with the sum of its own run of whole rows of the message. Takes one-shot
    /// pull and push profiles (barrier protocol), one-shot push with `ll`, and NCCL ones, plain
    /// or `"order": "rank"`.
    ReduceScatter,
    /// Every rank ends with every rank's rows, in rank order. Takes one-shot pull and push
    /// profiles (barrier protocol), one-shot push with `ll`, the one-shot copy engine
    /// (`"transfer": "copy_engine"`), and plain NCCL ones.
    AllGather,
    /// The all-reduce, then a residual added and an RMSNorm of every row (rows x hidden). Takes
    /// the all-reduce's profiles with `"epilogue": "separate"`, the fused ones
    /// ([`FusedForm`]) and NCCL ones, plain or `"order": "rank"`.
    AllReduceAddRmsNorm,
}

impl Collective {
    /// Every collective, in the order of the C enum `PrepareCollective`.
    pub const ALL: [Collective; 4] = [
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::AllReduceAddRmsNorm,
    ];

    /// The name used in ladders, packages and tables (`all_reduce`).
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::AllGather => "all_gather",
            Collective::AllReduceAddRmsNorm => "all_reduce_add_rms_norm",
        }
    }

    /// What a candidate's output is checked against, in messages (`the reference sum`).
    pub fn reference(self) -> &'static str {
        match self {
            Collective::AllReduce | Collective::ReduceScatter => "the reference sum",
            Collective::AllGather => "the inputs' bytes",
            Collective::AllReduceAddRmsNorm => "the reference epilogue",
        }
    }

    /// Parses the name.
    pub fn from_name(name: &str) -> Option<Collective> {
        Collective::ALL
            .into_iter()
            .find(|collective| collective.name() == name)
    }
}

impl std::fmt::Display for Collective {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.name())
    }
}

/// Element types. Every one is summed in fp32 in rank order; bf16 and fp16 are then rounded
/// once to nearest even (see `prepare::reference`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Dtype {
    /// bfloat16, summed in fp32 in rank order and rounded once to nearest even.
    Bf16,
    /// IEEE binary16, summed in fp32 in rank order and rounded once to nearest even (overflow
    /// to infinity).
    Fp16,
    /// IEEE binary32, summed in fp32 in rank order.
    Fp32,
}

impl Dtype {
    /// Every element type.
    pub const ALL: [Dtype; 3] = [Dtype::Bf16, Dtype::Fp16, Dtype::Fp32];

    /// Bytes per element.
    pub fn size_bytes(self) -> u64 {
        match self {
            Dtype::Bf16 | Dtype::Fp16 => 2,
            Dtype::Fp32 => 4,
        }
    }

    /// Elements per 16-byte vector, the unit the kernels move.
    pub fn per_vector(self) -> u64 {
        16 / self.size_bytes()
    }

    /// The name used in ladders, kernel symbols and tables.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bf16 => "bf16",
            Dtype::Fp16 => "fp16",
            Dtype::Fp32 => "fp32",
        }
    }

    /// The kernels' element type (`kernels/prepare_element.cuh`).
    pub fn element_type(self) -> &'static str {
        match self {
            Dtype::Bf16 => "Bf16",
            Dtype::Fp16 => "Fp16",
            Dtype::Fp32 => "Fp32",
        }
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.name())
    }
}

/// A GPU architecture, as NVRTC names it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub enum Arch {
    /// Ampere data centre (A100).
    #[serde(rename = "sm_80")]
    Sm80,
    /// Ampere (RTX 30, A10, A40).
    #[serde(rename = "sm_86")]
    Sm86,
    /// Ada (RTX 40, L4, L40).
    #[serde(rename = "sm_89")]
    Sm89,
    /// Hopper (H100, H200).
    #[serde(rename = "sm_90")]
    Sm90,
    /// Blackwell data centre (B200).
    #[serde(rename = "sm_100")]
    Sm100,
    /// Blackwell GB202 (RTX PRO 6000, RTX 5090).
    #[serde(rename = "sm_120")]
    Sm120,
    /// Blackwell GB10 (DGX Spark).
    #[serde(rename = "sm_121")]
    Sm121,
}

impl Arch {
    /// Every architecture, in order.
    pub const ALL: [Arch; 7] = [
        Arch::Sm80,
        Arch::Sm86,
        Arch::Sm89,
        Arch::Sm90,
        Arch::Sm100,
        Arch::Sm120,
        Arch::Sm121,
    ];

    /// The NVRTC name (`sm_90`).
    pub fn name(self) -> &'static str {
        match self {
            Arch::Sm80 => "sm_80",
            Arch::Sm86 => "sm_86",
            Arch::Sm89 => "sm_89",
            Arch::Sm90 => "sm_90",
            Arch::Sm100 => "sm_100",
            Arch::Sm120 => "sm_120",
            Arch::Sm121 => "sm_121",
        }
    }

    /// Parses the NVRTC name.
    pub fn from_name(name: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|arch| arch.name() == name)
    }

    /// The architecture of a compute capability (9, 0) -> sm_90.
    pub fn from_compute_capability(major: u32, minor: u32) -> Option<Arch> {
        Arch::from_name(&format!("sm_{major}{minor}"))
    }

    /// Whether the architecture launches thread-block clusters (the cluster capability table).
    pub fn supports_clusters(self) -> bool {
        matches!(self, Arch::Sm90 | Arch::Sm100 | Arch::Sm120 | Arch::Sm121)
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.name())
    }
}

/// A named algorithm with its parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Unique, non-empty identifier that buckets name as candidates.
    pub id: String,
    /// The algorithm.
    pub algorithm: Algorithm,
    /// How peers' data moves (one-shot and RSAG only): `pull` reads peers, `push` writes to them.
    /// Defaults to `pull`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer: Option<Transfer>,
    /// How a one-shot push orders its peer traffic: `barrier` (the default) starts with a barrier
    /// and uses the shared scratch; `ll` carries flags in the data (16-byte lines of 8 data bytes
    /// and two flags), `simple` raises a flag after each step of data. Both `ll` and `simple` are
    /// double-buffered and have no barrier at all (one-shot push only). An RSAG push takes
    /// `simple` alone: a flag after each step of each phase, no barrier between them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
    /// `phased` (RSAG and full only): in phase k rank r talks only to peer (r+k) mod n; a cluster
    /// kernel, allowed only in clustered buckets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Schedule>,
    /// Clusters doing work in a phased kernel: required on phased profiles, and 1 (cluster 0
    /// works, the others return at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_clusters: Option<u32>,
    /// Blocks to launch instead of the bucket's (ordinary custom profiles in unclustered buckets),
    /// 1 to 1024.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks: Option<u32>,
    /// NCCL communicator `maxCTAs` (NCCL profiles only), 1 to 64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ctas: Option<u32>,
    /// NCCL communicator `minCTAs` (NCCL profiles only), 1 to 64, at most `max_ctas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_ctas: Option<u32>,
    /// `symmetric` (NCCL profiles of an all-reduce only): NCCL sums in a buffer of its own from
    /// `ncclMemAlloc`, registered on every rank as one symmetric window (`ncclCommWindowRegister`
    /// with `NCCL_WIN_COLL_SYMMETRIC`), where it may run its symmetric-memory kernels; the message
    /// is copied in and the sum copied out around an in-place `ncclAllReduce`. The window holds
    /// the largest message of the buckets that name the profile, on its own communicator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<Window>,
    /// `rank` (NCCL profiles only, without `window`, `max_ctas` or `min_ctas`; all-reduce and
    /// reduce-scatter): the exact NCCL collective. Each rank's slice (a reduce-scatter's: its
    /// rows) of the message goes to its owner by grouped `ncclSend` and `ncclRecv`, the owner
    /// sums it in rank order with a kernel of the package (the reference sum), and for the
    /// all-reduce `ncclAllGather` gathers the sums. It touches no peer memory, so it runs between
    /// hosts too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<Order>,
    /// `separate` (custom profiles of `all_reduce_add_rms_norm` only): the profile's all-reduce
    /// kernel writes the sum into `normed`, then prepare's `add_rms_norm` kernel adds the
    /// residual and normalises. Without it a custom profile of that collective is one of the
    /// fused kernels; NCCL profiles are always separate and do not carry it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epilogue: Option<Epilogue>,
}

impl Profile {
    /// Whether NCCL runs this profile.
    pub fn is_nccl(&self) -> bool {
        self.algorithm == Algorithm::Nccl
    }

    /// Whether NCCL runs its own collective for this profile (`ncclAllReduce`,
    /// `ncclReduceScatter`, `ncclAllGather`), summing in its own order: an NCCL profile without
    /// `order`. Whether that is exact depends on the collective and world size ([`is_exact`]).
    pub fn is_plain_nccl(&self) -> bool {
        self.is_nccl() && self.order.is_none()
    }

    /// Whether this profile is the exact NCCL all-reduce or reduce-scatter (`"order": "rank"`).
    pub fn is_nccl_rank_order(&self) -> bool {
        self.is_nccl() && self.order == Some(Order::Rank)
    }

    /// Whether this profile is a cluster kernel (phased schedule).
    pub fn is_cluster_kernel(&self) -> bool {
        self.schedule == Some(Schedule::Phased)
    }

    /// Whether NCCL runs this profile in a symmetric window of its own.
    pub fn is_nccl_symmetric(&self) -> bool {
        self.is_nccl() && self.window == Some(Window::Symmetric)
    }

    /// Whether NCCL runs this profile on a communicator of its own: one with `max_ctas`,
    /// `min_ctas` or a symmetric window.
    pub fn has_own_communicator(&self) -> bool {
        self.is_nccl()
            && (self.max_ctas.is_some() || self.min_ctas.is_some() || self.window.is_some())
    }

    /// The transfer direction, with its default.
    pub fn transfer_or_default(&self) -> Transfer {
        self.transfer.unwrap_or(Transfer::Pull)
    }
}

/// What a symmetric window is rounded up to: the 2 MiB of a large page, which `ncclMemAlloc`
/// allocates at least.
pub const SYMMETRIC_WINDOW_ALIGNMENT_BYTES: u64 = 2 << 20;

/// Collective algorithms.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// Every rank reads (pull) or receives (push) every peer's whole message and sums locally;
    /// a reduce-scatter's rank its own rows of every peer's, an all-gather's every peer's rows.
    OneShot,
    /// Reduce-scatter then all-gather: rank r sums its slice, then peers gather the slices
    /// (all-reduce only).
    Rsag,
    /// Full all-reduce by whole-message exchange; phased schedule only (all-reduce only).
    Full,
    /// NCCL's collective (`ncclAllReduce`, `ncclReduceScatter`, `ncclAllGather`) on a blocking
    /// communicator.
    Nccl,
}

impl Algorithm {
    /// The name used in kernel symbols.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::OneShot => "one_shot",
            Algorithm::Rsag => "rsag",
            Algorithm::Full => "full",
            Algorithm::Nccl => "nccl",
        }
    }
}

/// Data movement direction between peers.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Transfer {
    /// Read peers' buffers.
    Pull,
    /// Write into peers' buffers.
    Push,
    /// The copy engines read peers' buffers: into local scratch, where a kernel sums locally
    /// (the one-shot all-reduce), or straight to their rows of the output (the one-shot
    /// all-gather).
    CopyEngine,
}

impl Transfer {
    /// The name used in kernel symbols.
    pub fn name(self) -> &'static str {
        match self {
            Transfer::Pull => "pull",
            Transfer::Push => "push",
            Transfer::CopyEngine => "copy_engine",
        }
    }
}

/// The memory an NCCL profile sums in.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Window {
    /// A buffer from `ncclMemAlloc` registered as a symmetric window on every rank.
    Symmetric,
}

impl Window {
    /// The name used in ladders.
    pub fn name(self) -> &'static str {
        match self {
            Window::Symmetric => "symmetric",
        }
    }
}

/// How a profile of `all_reduce_add_rms_norm` runs its epilogue when it is not fused.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Epilogue {
    /// The profile's all-reduce kernel writes the sum into `normed`, then the `add_rms_norm`
    /// kernel reads it there and writes the residual and `normed`.
    Separate,
}

impl Epilogue {
    /// The name used in ladders.
    pub fn name(self) -> &'static str {
        match self {
            Epilogue::Separate => "separate",
        }
    }
}

/// The order an NCCL profile sums in.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Order {
    /// Rank order from rank 0's value in fp32, rounded once: the reference sum, at any world
    /// size.
    Rank,
}

impl Order {
    /// The name used in ladders.
    pub fn name(self) -> &'static str {
        match self {
            Order::Rank => "rank",
        }
    }
}

/// How a kernel synchronises with its peers.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// Flag barriers between phases, the start one included; scratch shared with other kernels.
    Barrier,
    /// Flags in the data, double-buffered, no barrier; twice the bytes on the wire (one-shot push
    /// only: the all-reduce, the reduce-scatter, the all-gather).
    Ll,
    /// A flag after each step of data, double-buffered, no barrier (all-reduce only).
    Simple,
}

impl Protocol {
    /// The name used in ladders and kernel symbols.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Barrier => "barrier",
            Protocol::Ll => "ll",
            Protocol::Simple => "simple",
        }
    }
}

/// How a kernel orders its peer traffic.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    /// One peer at a time: in phase k rank r talks only to peer (r+k) mod n (all-reduce only).
    Phased,
}

/// A message-size range with its launch geometry, candidates and static default.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Bucket {
    /// The largest message in bytes this bucket covers: a positive multiple of 16 x `world_size`
    /// (whole 16-byte vectors on every rank), at most 4 GiB.
    pub max_bytes: u64,
    /// Threads per block: a multiple of 32, at most 1024.
    pub threads: u32,
    /// Blocks per launch, 1 to 1024.
    pub blocks: u32,
    /// Blocks per thread-block cluster; where present 8, with 512 threads and 64 blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_size: Option<u32>,
    /// Profile ids to time here, each once, in order of preference on ties; one must be NCCL.
    pub candidates: Vec<String>,
    /// The profile used when nothing is timed; one of the candidates.
    pub default: String,
}

impl Bucket {
    /// Whether the bucket launches with cluster dimensions.
    pub fn is_clustered(&self) -> bool {
        self.cluster_size.is_some()
    }
}

#[cfg(test)]
impl Bucket {
    /// A 64 KiB bucket of 512-thread blocks whose only candidate is NCCL, for the tests of
    /// launch geometry.
    pub(crate) fn nccl_only(blocks: u32, cluster_size: Option<u32>) -> Bucket {
        Bucket {
            max_bytes: 65536,
            threads: 512,
            blocks,
            cluster_size,
            candidates: vec!["nccl".to_owned()],
            default: "nccl".to_owned(),
        }
    }
}

impl Ladder {
    /// The profile with this id.
    pub fn profile(&self, id: &str) -> Option<&Profile> {
        self.profiles.iter().find(|profile| profile.id == id)
    }

    /// The smallest message a bucket covers, in bytes (one element above the previous bucket).
    pub fn bucket_min_bytes(&self, index: usize) -> u64 {
        if index == 0 {
            self.dtype.size_bytes()
        } else {
            self.buckets[index - 1].max_bytes + self.dtype.size_bytes()
        }
    }

    /// Bytes of the symmetric window each GPU allocates for profile `id`: the largest message of
    /// the buckets that name it, rounded up to [`SYMMETRIC_WINDOW_ALIGNMENT_BYTES`]; 0 when it is
    /// no symmetric NCCL profile or no bucket names it.
    pub fn symmetric_window_bytes(&self, id: &str) -> u64 {
        if !self.profile(id).is_some_and(Profile::is_nccl_symmetric) {
            return 0;
        }
        self.buckets
            .iter()
            .filter(|bucket| bucket.candidates.iter().any(|candidate| candidate == id))
            .map(|bucket| {
                bucket
                    .max_bytes
                    .next_multiple_of(SYMMETRIC_WINDOW_ALIGNMENT_BYTES)
            })
            .max()
            .unwrap_or(0)
    }

    /// Bytes of every symmetric window each GPU allocates (one per symmetric NCCL profile),
    /// mapped by every peer through NCCL.
    pub fn symmetric_windows_bytes(&self) -> u64 {
        self.profiles
            .iter()
            .map(|profile| self.symmetric_window_bytes(&profile.id))
            .sum()
    }

    /// The bucket's plain NCCL candidate ([`Profile::is_plain_nccl`]): one without
    /// communicator settings if it has one, else its first; `None` when it has none.
    pub fn plain_nccl(&self, bucket: usize) -> Option<&Profile> {
        let mut nccl = self.buckets[bucket]
            .candidates
            .iter()
            .filter_map(|id| self.profile(id))
            .filter(|profile| profile.is_plain_nccl());
        let first = nccl.clone().next();
        nccl.find(|profile| !profile.has_own_communicator())
            .or(first)
    }

    /// The bucket's first exact NCCL candidate (`"order": "rank"`), if it has one.
    pub fn rank_order_nccl(&self, bucket: usize) -> Option<&Profile> {
        self.buckets[bucket]
            .candidates
            .iter()
            .filter_map(|id| self.profile(id))
            .find(|profile| profile.is_nccl_rank_order())
    }

    /// The bucket that covers a message of `bytes`, or `None` when NCCL takes it.
    pub fn bucket_for(&self, bytes: u64) -> Option<usize> {
        self.buckets
            .iter()
            .position(|bucket| bytes <= bucket.max_bytes)
    }

    /// Whether any bucket is clustered.
    pub fn has_clustered_buckets(&self) -> bool {
        self.buckets.iter().any(Bucket::is_clustered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TP2 bf16 ladder whose buckets of 64 KiB, 3 MiB and 64 MiB name `symmetric` in the
    /// first two and `symmetric_ctas` in the last, beside plain NCCL everywhere.
    fn ladder_with_windows() -> Ladder {
        serde_json::from_value(serde_json::json!({
            "format_version": 1, "name": "windows", "collective": "all_reduce", "dtype": "bf16",
            "world_size": 2, "targets": ["sm_90"],
            "profiles": [
                {"id": "nccl", "algorithm": "nccl"},
                {"id": "symmetric", "algorithm": "nccl", "window": "symmetric"},
                {"id": "symmetric_ctas", "algorithm": "nccl", "window": "symmetric", "max_ctas": 8},
                {"id": "unused", "algorithm": "nccl", "window": "symmetric"}
            ],
            "buckets": [
                {"max_bytes": 65536, "threads": 512, "blocks": 64,
                 "candidates": ["nccl", "symmetric"], "default": "nccl"},
                {"max_bytes": 3_145_728, "threads": 512, "blocks": 64,
                 "candidates": ["symmetric", "nccl"], "default": "symmetric"},
                {"max_bytes": 67_108_864, "threads": 512, "blocks": 64,
                 "candidates": ["symmetric_ctas", "nccl"], "default": "nccl"}
            ]
        }))
        .expect("the ladder parses")
    }

    #[test]
    fn collective_names_are_their_json_names_in_the_c_order() {
        let names: Vec<String> = Collective::ALL
            .into_iter()
            .map(|collective| serde_json::to_value(collective).unwrap().to_string())
            .collect();
        assert_eq!(
            names,
            [
                "\"all_reduce\"",
                "\"reduce_scatter\"",
                "\"all_gather\"",
                "\"all_reduce_add_rms_norm\""
            ]
        );
        for collective in Collective::ALL {
            assert_eq!(
                names[collective as usize],
                format!("\"{collective}\""),
                "the C value is the index"
            );
            assert_eq!(Collective::from_name(collective.name()), Some(collective));
        }
        assert_eq!(Collective::from_name("all-reduce"), None);
    }

    #[test]
    fn a_symmetric_window_holds_the_largest_message_naming_it_in_2_mib_pages() {
        let ladder = ladder_with_windows();
        assert_eq!(ladder.symmetric_window_bytes("symmetric"), 4 << 20);
        assert_eq!(ladder.symmetric_window_bytes("symmetric_ctas"), 64 << 20);
        assert_eq!(ladder.symmetric_window_bytes("unused"), 0);
        assert_eq!(ladder.symmetric_window_bytes("nccl"), 0);
        assert_eq!(ladder.symmetric_windows_bytes(), 68 << 20);
    }

    #[test]
    fn a_symmetric_profile_has_its_own_communicator_and_is_no_plain_nccl() {
        let ladder = ladder_with_windows();
        let symmetric = ladder.profile("symmetric").expect("a profile");
        assert!(symmetric.is_nccl_symmetric() && symmetric.has_own_communicator());
        assert!(!ladder
            .profile("nccl")
            .expect("a profile")
            .has_own_communicator());
        // The plain NCCL candidate is the baseline even where a symmetric one comes first.
        assert_eq!(
            ladder.plain_nccl(1).map(|profile| profile.id.as_str()),
            Some("nccl")
        );
    }

    #[test]
    fn a_rank_order_profile_is_nccl_but_not_plain_and_never_the_plain_baseline() {
        let ladder: Ladder = serde_json::from_value(serde_json::json!({
            "format_version": 1, "name": "rank", "collective": "all_reduce", "dtype": "bf16",
            "world_size": 4, "targets": ["sm_90"],
            "profiles": [
                { "id": "exact", "algorithm": "nccl", "order": "rank" },
                { "id": "nccl", "algorithm": "nccl" },
                { "id": "rsag", "algorithm": "rsag" }
            ],
            "buckets": [
                { "max_bytes": 65536, "threads": 512, "blocks": 8,
                  "candidates": ["exact", "nccl"], "default": "exact" },
                { "max_bytes": 131_072, "threads": 512, "blocks": 8,
                  "candidates": ["rsag", "exact"], "default": "exact" }
            ]
        }))
        .expect("a ladder");
        let exact = ladder.profile("exact").expect("a profile");
        assert!(exact.is_nccl() && exact.is_nccl_rank_order() && !exact.is_plain_nccl());
        assert!(!exact.has_own_communicator());
        let plain = ladder.profile("nccl").expect("a profile");
        assert!(plain.is_plain_nccl() && !plain.is_nccl_rank_order());
        assert!(!ladder.profile("rsag").expect("a profile").is_plain_nccl());
        // The rank-order profile comes first but the plain one is the baseline.
        assert_eq!(ladder.plain_nccl(0).map(|p| p.id.as_str()), Some("nccl"));
        assert_eq!(
            ladder.rank_order_nccl(0).map(|p| p.id.as_str()),
            Some("exact")
        );
        assert_eq!(ladder.plain_nccl(1), None);
        assert_eq!(
            ladder.rank_order_nccl(1).map(|p| p.id.as_str()),
            Some("exact")
        );
    }
}
