//! Compilation of the custom kernels with NVRTC into one cubin per kernel and architecture.

use crate::ladder::{Arch, Ladder};
use crate::progress::Reporter;

/// One compiled kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledKernel {
    /// Kernel name and entry symbol.
    pub name: String,
    /// Source file it came from.
    pub source: String,
    /// Whether it is a cluster kernel.
    pub cluster: bool,
    /// The architecture it was compiled for.
    pub arch: Arch,
    /// The cubin.
    pub cubin: Vec<u8>,
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

/// Everything a compilation produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compilation {
    /// NVRTC's version (major, minor).
    pub nvrtc_version: (u32, u32),
    /// Options every kernel was compiled with.
    pub options: Vec<String>,
    /// One entry per distinct kernel, sorted by name.
    pub kernels: Vec<CompiledKernel>,
}

/// Why compilation failed.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// Placeholder until the NVRTC layer lands.
    #[error("compilation is not available")]
    Unavailable,
}

/// Compiles every custom kernel the ladder's profiles need for `arch`.
pub fn compile_ladder(
    _ladder: &Ladder,
    _arch: Arch,
    _reporter: &dyn Reporter,
) -> Result<Compilation, CompileError> {
    Err(CompileError::Unavailable)
}
