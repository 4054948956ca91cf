//! Tests that compile the kernels with NVRTC, without a GPU. They skip when NVRTC is missing
//! unless `PREPARE_REQUIRE_NVRTC=1`, which scripts/test.sh sets so that a missing library fails.

mod cli_export;
mod compile;
mod epilogue_export;
mod mutations;
mod support;
