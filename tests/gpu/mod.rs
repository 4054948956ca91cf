//! Tests on real GPUs, ignored by default: scripts/gpu-tests.sh runs them on a machine with GPUs,
//! each module in a process of its own. `guard` is not ignored: with `PREPARE_REQUIRE_GPU=1` a
//! run that finds no GPU fails there.

// What the GPU tests saw is reported on stderr, for the GPU run's log.
#![allow(clippy::print_stderr)]

mod driver;
mod epilogue;
mod guard;
mod mutations;
mod one_gpu;
mod qualify;
mod rank_order;
mod ranks_on_one_gpu;
mod rows;
mod rows_v;
mod runtime;
mod smoke;
mod support;
mod tune;
