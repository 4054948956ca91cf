//! The launch contract shared with `kernels/prepare_abi.cuh`: the one parameter every custom
//! kernel takes, the limits it is written for, and the words of the signal and state memory.
//! A leaf: it names nothing else in the crate, so the ladder rules, the GPU layer and the
//! runtime can all check against it.

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
    /// Where the sum goes: local memory, `input` itself allowed (see the kernels' headers for
    /// which kernels allow it in a registered buffer).
    pub output: u64,
    /// This rank's message as the kernels that read it only locally see it: any local memory.
    /// Kernels whose peers read the message read `buffers[rank]` instead.
    pub input: u64,
    /// Elements in the message.
    pub elements: u64,
    /// Byte offset of the scratch region in every buffer; at least 2 x `elements`.
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
/// Flag sets per rank: the barriers' and the double-buffered kernels' step flags.
pub const SIGNAL_SETS: usize = 5;
/// 64-bit signal words per rank.
pub const SIGNAL_WORDS: usize = SIGNAL_SETS * MAX_RANKS * MAX_BLOCKS;
/// Bytes of signal flags per rank (peer-mapped, like the buffer).
pub const SIGNAL_BYTES: u64 = SIGNAL_WORDS as u64 * 8;
/// 64-bit state words per rank: the abort word, the blocks' epochs, the double-buffered
/// kernels' launch counter and their count of finished blocks.
pub const STATE_WORDS: usize = 3 + MAX_BLOCKS;
/// Set in the abort word when a kernel gave up.
pub const ABORT_FLAG: u64 = 1 << 63;
/// Abort reason: a peer did not arrive before the deadline (the low 32 bits name the peer).
pub const ABORT_PEER_TIMEOUT: u64 = 1;
/// Abort reason: the parameters or geometry break the contract (the low bits name this rank).
pub const ABORT_INVALID_LAUNCH: u64 = 2;
/// Every pointer in [`AllReduceParams`] and its `scratch_offset` are multiples of this.
pub const ALIGNMENT_BYTES: u64 = 16;
/// The input region and the whole buffer are rounded up to this, so scratch starts on a fresh
/// line.
pub const BUFFER_ALIGNMENT_BYTES: u64 = 256;
