//! The custom kernels: which CUDA source and entry symbol serve each profile, the sources
//! embedded in the binary, and the launch contract shared with `kernels/prepare_abi.cuh`.

use crate::ladder::{Dtype, Profile};

/// Mirror of `struct AllReduceParams` in `kernels/prepare_abi.cuh`; passed by value as the
/// kernel's only argument.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AllReduceParams {
    /// Rank r's registered buffer mapped into this process.
    pub buffers: [u64; MAX_RANKS],
    /// Rank r's signal flags mapped into this process.
    pub signals: [u64; MAX_RANKS],
    /// This rank's state words.
    pub state: u64,
    /// Where the sum goes.
    pub output: u64,
    /// Elements in the message.
    pub elements: u64,
    /// Byte offset of the scratch region in every buffer.
    pub scratch_offset: u64,
    /// Deadline for every spin, nanoseconds from the kernel's start.
    pub timeout_ns: u64,
    /// This rank.
    pub rank: u32,
    /// Ranks taking part.
    pub world: u32,
}

/// Ranks a kernel supports.
pub const MAX_RANKS: usize = 8;
/// Blocks a kernel may launch.
pub const MAX_BLOCKS: usize = 1024;
/// Barrier flag sets per rank.
pub const SIGNAL_SETS: usize = 4;
/// 64-bit signal words per rank.
pub const SIGNAL_WORDS: usize = SIGNAL_SETS * MAX_RANKS * MAX_BLOCKS;
/// 64-bit state words per rank.
pub const STATE_WORDS: usize = 1 + MAX_BLOCKS;
/// Set in the abort word when a kernel gave up.
pub const ABORT_FLAG: u64 = 1 << 63;
/// Abort reason: a peer did not arrive before the deadline.
pub const ABORT_PEER_TIMEOUT: u64 = 1;

/// A custom kernel: one entry symbol in one source file.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KernelSpec {
    /// The kernel's name, also its entry symbol (`all_reduce_rsag_phased_bf16`).
    pub name: String,
    /// The source file under `kernels/`.
    pub source: &'static str,
    /// Whether it uses cluster instructions and must launch with cluster dimensions.
    pub cluster: bool,
}

/// The kernel that runs a profile, or `None` for NCCL profiles.
pub fn kernel_for(_profile: &Profile, _dtype: Dtype) -> Option<KernelSpec> {
    None
}
