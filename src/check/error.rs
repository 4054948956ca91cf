//! Why `prepare check` failed.

use crate::runtime::RuntimeError;

/// Why a check failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The runtime failed (driver, NCCL, a timeout naming the rank).
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// A custom candidate's output differed from the reference on some rank (or it changed
    /// its input, or wrote past the message).
    #[error("rank {rank}: {what} is not exact: {message}")]
    NotExact {
        /// This rank.
        rank: u32,
        /// The candidate and bucket.
        what: String,
        /// Which rank, size and element, as found.
        message: String,
    },
    /// A custom candidate could not be captured in a graph.
    #[error("rank {rank}: {what} could not be captured in a graph: {message}")]
    CaptureFailed {
        /// This rank.
        rank: u32,
        /// The candidate and bucket.
        what: String,
        /// The driver's message.
        message: String,
    },
    /// Device memory in use changed across graph replays: something allocated after capture.
    #[error("rank {rank}: device memory in use changed across the graph replays, from {before} to {after} bytes")]
    MemoryChanged {
        /// This rank.
        rank: u32,
        /// Bytes in use before the replays.
        before: usize,
        /// Bytes in use after them.
        after: usize,
    },
}
