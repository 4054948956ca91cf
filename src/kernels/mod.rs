//! The custom kernels: which CUDA source and entry symbol serve each profile ([`KernelSpec`],
//! [`kernel_for`]), the sources embedded in the binary ([`source`], [`headers`]), the scratch
//! each kernel needs and where it lies in the registered buffer ([`scratch_bytes`],
//! [`peer_buffer_bytes`]), and the launch contract shared with `kernels/prepare_abi.cuh`
//! (re-exported from [`crate::abi`]).

#[cfg(test)]
mod epilogue_tests;
mod scratch;
mod slices;
mod sources;
mod spec;

pub use crate::abi::{
    LaunchParams, ABORT_FLAG, ABORT_INVALID_LAUNCH, ABORT_PEER_TIMEOUT, ALIGNMENT_BYTES,
    BUFFER_ALIGNMENT_BYTES, MAX_BLOCKS, MAX_RANKS, SIGNAL_BYTES, SIGNAL_SETS, SIGNAL_WORDS,
    STATE_ARRIVAL_WORDS, STATE_WORDS,
};
#[cfg(feature = "testing")]
pub use scratch::scratch_layouts;
pub use scratch::{
    copy_engine_slot_bytes, input_region_bytes, is_double_buffered, peer_buffer_bytes,
    scratch_bytes, scratch_offset_after_input, scratch_region_bytes, DOUBLE_BUFFER_CHUNK_BYTES,
    REGION_ALIGNMENT_BYTES,
};
pub use slices::{slice_of, slot_bytes, Slice};
pub use sources::{headers, source};
pub use spec::{
    add_rms_norm, all_kernels, epilogue_after, epilogue_kernel_for, input_access, kernel_for,
    kernels_for_ladder, needs_rank_order_sum, rank_order_sum, InputAccess, KernelSpec,
};
