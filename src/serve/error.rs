//! Why a serving call failed.

use crate::gpu::abort::{Abort, AbortReason};
use crate::gpu::driver::DriverError;
use crate::ladder::{Collective, Dtype};
use crate::runtime::RuntimeError;
use crate::select::SelectError;

/// Why a serving call failed. Each variant is a condition a caller can act on; the C ABI maps
/// them to its status codes.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Start-up selection failed (bootstrap, a peer missing, ranks disagreeing, a cache or
    /// choice file that could not be written).
    #[error(transparent)]
    Select(#[from] SelectError),
    /// The runtime failed (driver, NCCL).
    #[error(transparent)]
    Runtime(RuntimeError),
    /// No package was given.
    #[error(
        "rank {rank}: no package was given; give one per collective and dtype the server runs"
    )]
    NoPackage {
        /// This rank.
        rank: u32,
    },
    /// Two packages hold the same collective and dtype.
    #[error(
        "rank {rank}: packages {first} and {second} both hold {collective} {dtype}; give one \
         package per collective and dtype"
    )]
    DuplicatePackage {
        /// This rank.
        rank: u32,
        /// The collective.
        collective: Collective,
        /// The dtype.
        dtype: &'static str,
        /// The first package's ladder.
        first: String,
        /// The second package's ladder.
        second: String,
    },
    /// The packages are for different world sizes, or not for this world.
    #[error("rank {rank}: package {ladder} is for {expected} ranks, the world has {world}")]
    WorldSize {
        /// This rank.
        rank: u32,
        /// The package's ladder.
        ladder: String,
        /// Its world size.
        expected: u32,
        /// The runtime's.
        world: u32,
    },
    /// A collective and dtype no package holds.
    #[error("rank {rank}: no package holds {collective} {dtype}; this handle serves {served}")]
    NotServed {
        /// This rank.
        rank: u32,
        /// The collective asked for.
        collective: Collective,
        /// The dtype asked for.
        dtype: Dtype,
        /// The collectives and dtypes it serves (`all_reduce bf16, all_reduce fp32`).
        served: String,
    },
    /// A pointer or stream the caller gave is not usable on this rank's GPU.
    #[error("rank {rank}: {what}: {source}")]
    BadArgument {
        /// This rank.
        rank: u32,
        /// Which argument.
        what: &'static str,
        /// What the driver said.
        source: DriverError,
    },
    /// A message whose size in bytes does not fit this machine's address space.
    #[error("rank {rank}: a message of {elements} elements does not fit the address space")]
    MessageTooLarge {
        /// This rank.
        rank: u32,
        /// Elements asked for.
        elements: usize,
    },
    /// A candidate cannot be forced.
    #[error("rank {rank}: {reason}")]
    CannotForce {
        /// This rank.
        rank: u32,
        /// Why not.
        reason: String,
    },
    /// With the call check on ([`Handle::set_call_checks`](super::Handle::set_call_checks)):
    /// another rank made another call (collective, dtype or shape). Every rank refuses its
    /// call; nothing of it was enqueued on any rank, and the handle stays usable.
    #[error(
        "rank {rank}: rank {other} made another call: this rank {ours}; rank {other} {theirs}; \
         nothing was enqueued on any rank"
    )]
    CallsDisagree {
        /// This rank.
        rank: u32,
        /// The first rank whose call differs from this rank's.
        other: u32,
        /// This rank's call, in words.
        ours: String,
        /// That rank's call, in words.
        theirs: String,
    },
    /// A kernel gave up waiting for a peer: the peer is gone or stuck. The handle cannot be
    /// used again; every rank must start a new one.
    #[error(
        "rank {rank}: a collective gave up waiting for rank {peer} (dead, stopped or too slow \
         past the timeout); this handle is unusable, start a new one on every rank"
    )]
    PeerTimeout {
        /// This rank.
        rank: u32,
        /// The peer that did not arrive.
        peer: u32,
    },
    /// A kernel stopped for another reason (an invalid launch, ranks that disagree on the
    /// message's shape); the handle is unusable.
    #[error("rank {rank}: a collective stopped: {abort}; this handle is unusable")]
    Aborted {
        /// This rank.
        rank: u32,
        /// The decoded abort word.
        abort: Abort,
    },
}

impl ServeError {
    /// Whether the packages are refused for these ranks (none given, two for one collective and
    /// dtype, for another world size or architecture, none for the collective and dtype asked
    /// for), rather than
    /// something failing at run time.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            ServeError::NoPackage { .. }
                | ServeError::DuplicatePackage { .. }
                | ServeError::WorldSize { .. }
                | ServeError::NotServed { .. }
                | ServeError::Select(SelectError::Runtime(RuntimeError::WrongArchitecture { .. }))
        )
    }
}

impl From<RuntimeError> for ServeError {
    fn from(error: RuntimeError) -> ServeError {
        match error {
            RuntimeError::Aborted { rank, abort, .. } => abort_error(rank, abort),
            error => ServeError::Runtime(error),
        }
    }
}

pub(super) fn abort_error(rank: u32, abort: Abort) -> ServeError {
    match abort.reason {
        AbortReason::PeerTimeout => ServeError::PeerTimeout {
            rank,
            peer: abort.rank,
        },
        _ => ServeError::Aborted { rank, abort },
    }
}
