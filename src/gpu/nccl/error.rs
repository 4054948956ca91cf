//! Why an NCCL call failed, with what its messages tell: the variable that names the library,
//! how to get one, and the oldest version that works.

use std::path::PathBuf;

use crate::gpu::driver::DriverError;

/// The environment variable naming the library or its directory.
pub const OVERRIDE_VARIABLE: &str = "PREPARE_NCCL";

/// What to tell someone without NCCL.
pub(super) const HOW_TO_GET: &str = "install it with `pip install nvidia-nccl-cu13` (into the \
     active virtual environment; PyTorch's CUDA 13 builds bring it), install a system package \
     that provides libnccl.so.2, or set PREPARE_NCCL to the library or the directory holding it";

/// The oldest NCCL whose `ncclConfig_t` matches the one this crate fills.
pub(super) const MIN_VERSION: (u32, u32) = (2, 28);

/// Why an NCCL call failed.
#[derive(Debug, thiserror::Error)]
pub enum NcclError {
    /// No library in any place searched.
    #[error("NCCL (libnccl.so.2) was not found; {HOW_TO_GET}. Looked in: {}", .looked.join("; "))]
    NotFound {
        /// The places searched, in order.
        looked: Vec<String>,
    },
    /// `PREPARE_NCCL` is set but does not lead to a library.
    #[error("{OVERRIDE_VARIABLE} names {}, which {problem}; point it at libnccl.so.2 or the directory holding it", .path.display())]
    BadOverride {
        /// The value of the variable.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// The library was found but the loader refused it.
    #[error("cannot load NCCL from {}: {message}; {HOW_TO_GET}", .path.display())]
    Open {
        /// The file or name opened.
        path: PathBuf,
        /// The loader's message.
        message: String,
    },
    /// The library lacks an entry point this module calls.
    #[error("NCCL at {} has no {symbol} ({message}): NCCL {}.{} or newer is needed; {HOW_TO_GET}", .path.display(), MIN_VERSION.0, MIN_VERSION.1)]
    Symbol {
        /// The library.
        path: PathBuf,
        /// The missing function.
        symbol: &'static str,
        /// The loader's message.
        message: String,
    },
    /// The library is older than the communicator config this module fills.
    #[error("NCCL at {} is version {version}; {}.{} or newer is needed; {HOW_TO_GET}", .path.display(), MIN_VERSION.0, MIN_VERSION.1)]
    TooOld {
        /// The library.
        path: PathBuf,
        /// The version it reports.
        version: String,
    },
    /// A rendezvous address that does not say where the ranks meet.
    #[error("the rendezvous address {address:?} is not valid: {message} (the forms are host:port and [ipv6]:port)")]
    Address {
        /// The address given.
        address: String,
        /// What is wrong with it.
        message: String,
    },
    /// A call returned an error.
    #[error("{call} failed on rank {rank}: {message}")]
    Call {
        /// The NCCL function.
        call: &'static str,
        /// This rank.
        rank: u32,
        /// NCCL's error string and last error.
        message: String,
    },
    /// A step did not finish before the deadline; the communicator was aborted.
    #[error("{step} did not finish within {seconds:.1} s on rank {rank}; the communicator was aborted (a peer may have died or never started)")]
    Timeout {
        /// What was waited for.
        step: &'static str,
        /// This rank.
        rank: u32,
        /// The time allowed.
        seconds: f64,
    },
    /// The stream's context could not be made current.
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// Buffers do not fit the operation.
    #[error("{call} on rank {rank}: {message}")]
    Buffers {
        /// The NCCL function.
        call: &'static str,
        /// This rank.
        rank: u32,
        /// What does not fit.
        message: String,
    },
    /// The communicator was aborted earlier, by the watchdog or after an error.
    #[error("the communicator of rank {rank} was aborted")]
    Aborted {
        /// This rank.
        rank: u32,
    },
}
