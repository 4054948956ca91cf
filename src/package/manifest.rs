//! The manifest: what a package holds, described and hashed. Types here are the single source
//! of `schemas/manifest.schema.json`; a field's doc comment is its schema description.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::device::DropReason;
use crate::ladder::{Algorithm, Arch, Collective, Dtype};

/// The manifest of a package: `manifest.json`. Its sha256 is the package's identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "prepare package manifest")]
pub struct Manifest {
    /// The package contract. A reader refuses a contract it does not know.
    pub format_version: u32,
    /// The version of `prepare` that wrote the package.
    pub tool_version: String,
    /// The ladder the package was exported from, stored as `ladder.json`.
    pub ladder: LadderRecord,
    /// The GPU architecture every kernel was compiled for; the package runs only there.
    pub arch: Arch,
    /// How the kernels were compiled.
    pub compiler: CompilerRecord,
    /// Every compiled kernel, sorted by name.
    pub kernels: Vec<KernelRecord>,
    /// Every bucket of the ladder, in order, with what each candidate launches.
    pub buckets: Vec<BucketRecord>,
    /// Peer-mapped memory each GPU allocates to run the package's custom kernels.
    pub peer_memory: PeerMemoryRecord,
    /// Results of qualifying every candidate on GPUs; null when exported without GPUs.
    pub qualification: Option<Qualification>,
    /// sha256 of this manifest serialized with `checksum` empty; a reader recomputes it, so a
    /// changed manifest is refused like any other changed file.
    #[schemars(regex(pattern = r"^[0-9a-f]{64}$"))]
    pub checksum: String,
}

/// The ladder a package was exported from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LadderRecord {
    /// The ladder's name.
    pub name: String,
    /// sha256 of `ladder.json`, the ladder file's bytes as given to export.
    #[schemars(regex(pattern = r"^[0-9a-f]{64}$"))]
    pub sha256: String,
    /// The collective every candidate performs.
    pub collective: Collective,
    /// The element type.
    pub dtype: Dtype,
    /// Ranks taking part.
    pub world_size: u32,
}

/// The compiler and the options every kernel was compiled with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CompilerRecord {
    /// NVRTC's version, `major.minor`.
    #[schemars(regex(pattern = r"^[0-9]+\.[0-9]+$"))]
    pub nvrtc_version: String,
    /// Options passed to NVRTC for every kernel.
    pub options: Vec<String>,
}

/// One compiled kernel and its cubin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KernelRecord {
    /// The kernel's name.
    #[schemars(regex(pattern = r"^[A-Za-z_][A-Za-z0-9_]*$"))]
    pub name: String,
    /// The cubin, relative to the package: `kernels/<name>.<arch>.cubin`.
    #[schemars(regex(pattern = r"^kernels/[A-Za-z_][A-Za-z0-9_]*\.sm_[0-9]+\.cubin$"))]
    pub file: String,
    /// The entry symbol to launch.
    pub entry: String,
    /// The CUDA source file under `kernels/` it was compiled from.
    pub source: String,
    /// Whether it uses cluster instructions and must launch with cluster dimensions.
    pub cluster: bool,
    /// sha256 of the cubin.
    #[schemars(regex(pattern = r"^[0-9a-f]{64}$"))]
    pub sha256: String,
    /// Size of the cubin in bytes.
    pub size_bytes: u64,
    /// Registers per thread.
    pub registers: u32,
    /// Static shared memory per block, bytes.
    pub shared_bytes: u32,
    /// Bytes spilled to local memory by stores.
    pub spill_store_bytes: u32,
    /// Bytes read back from spills.
    pub spill_load_bytes: u32,
    /// Stack frame per thread, bytes.
    pub stack_bytes: u32,
}

/// One bucket: a message-size range with its launch geometry and candidates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BucketRecord {
    /// Position in the ladder, from 0.
    pub index: usize,
    /// The smallest message the bucket covers, bytes.
    pub min_bytes: u64,
    /// The largest message the bucket covers, bytes.
    pub max_bytes: u64,
    /// Threads per block.
    pub threads: u32,
    /// Blocks per launch.
    pub blocks: u32,
    /// Blocks per thread-block cluster; null when the bucket is not clustered.
    pub cluster_size: Option<u32>,
    /// Candidates in the ladder's order (the order of preference on ties).
    pub candidates: Vec<CandidateRecord>,
    /// The profile used when nothing is timed.
    pub default: String,
}

/// What one candidate launches in one bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CandidateRecord {
    /// The profile id.
    pub profile: String,
    /// The profile's algorithm.
    pub algorithm: Algorithm,
    /// The kernel it launches; null for NCCL.
    pub kernel: Option<String>,
    /// Whether the kernel is a cluster kernel (uses cluster instructions).
    pub cluster_kernel: bool,
    /// Whether an ordinary kernel is launched with the bucket's cluster dimensions.
    pub cluster_scheduling: bool,
    /// Blocks it launches; null for NCCL, which picks its own.
    pub blocks: Option<u32>,
    /// The kernel that runs after it on the sum in `normed`: `add_rms_norm_<dtype>` for the
    /// NCCL and separate candidates of `all_reduce_add_rms_norm`; absent for a fused kernel,
    /// which does all, and for every other collective.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epilogue_kernel: Option<String>,
}

/// Peer-mapped memory per GPU: allocated once, shared with every peer by CUDA IPC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PeerMemoryRecord {
    /// The registered buffer: the input region (the largest message a custom candidate takes)
    /// plus the largest scratch any custom candidate needs. Zero when every candidate is NCCL.
    pub buffer_bytes: u64,
    /// The signal flags. Zero when every candidate is NCCL.
    pub signal_bytes: u64,
}

impl PeerMemoryRecord {
    /// Buffer and signal flags together; saturating, since the fields come from a file (an
    /// opened package's are checked against its ladder, so there it never saturates).
    pub fn total_bytes(&self) -> u64 {
        self.buffer_bytes.saturating_add(self.signal_bytes)
    }
}

/// Results of qualifying every candidate on GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Qualification {
    /// The GPUs it ran on, in rank order.
    pub gpus: Vec<QualifiedGpu>,
    /// The driver version (the kernel module's).
    pub driver_version: String,
    /// The NCCL version.
    pub nccl_version: String,
    /// One entry per bucket, in bucket order.
    pub buckets: Vec<BucketQualification>,
}

/// A GPU that took part in qualification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QualifiedGpu {
    /// The device name as the driver reports it.
    pub name: String,
    /// The device UUID.
    pub uuid: String,
}

/// Qualification of one bucket's candidates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BucketQualification {
    /// The bucket's index.
    pub index: usize,
    /// One entry per candidate, in the bucket's order.
    pub candidates: Vec<CandidateQualification>,
}

/// Qualification of one candidate in one bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CandidateQualification {
    /// The profile id.
    pub profile: String,
    /// Whether it may be timed, and why not.
    pub outcome: Outcome,
}

/// The result of qualifying a candidate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Outcome {
    /// Captured in a graph and run; it may be timed.
    Qualified {
        /// Whether its output equalled the reference sum byte for byte on every rank. Always
        /// true for custom kernels (an inexact one is dropped); NCCL sums in its own order and
        /// may differ beyond two ranks.
        exact: bool,
    },
    /// Removed from the bucket's candidates, with the reason.
    Dropped(DropReason),
}

impl Manifest {
    /// The manifest's bytes as written: pretty JSON in field order with a trailing newline.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut text = serde_json::to_string_pretty(self).expect("a manifest always serializes");
        text.push('\n');
        text.into_bytes()
    }

    /// The checksum this manifest's content gives (its `checksum` field left out).
    pub fn compute_checksum(&self) -> String {
        let mut unsigned = self.clone();
        unsigned.checksum = String::new();
        crate::hash::sha256_hex(&unsigned.to_bytes())
    }

    /// Sets `checksum` from the content.
    pub fn seal(&mut self) {
        self.checksum = self.compute_checksum();
    }

    /// The kernel with this name.
    pub fn kernel(&self, name: &str) -> Option<&KernelRecord> {
        self.kernels.iter().find(|kernel| kernel.name == name)
    }

    /// Whether any bucket launches with cluster dimensions.
    pub fn has_clustered_buckets(&self) -> bool {
        self.buckets
            .iter()
            .any(|bucket| bucket.cluster_size.is_some())
    }
}
