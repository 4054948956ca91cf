//! The integration tests: one binary, its tests grouped by what they need. `cpu` needs neither
//! NVRTC nor a GPU (a C and a C++ compiler for some); `nvrtc` compiles kernels with NVRTC and
//! skips without it unless `PREPARE_REQUIRE_NVRTC=1`; `gpu` is ignored by default and runs on a
//! machine with GPUs (scripts/gpu-tests.sh). Filter by group or module:
//! `cargo test --test integration nvrtc::` or `cargo test --test integration cpu::cli_show`.

mod cpu;
mod gpu;
mod nvrtc;
mod support;
