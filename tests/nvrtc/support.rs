//! What the NVRTC tests share: NVRTC itself, or a skip, and every kernel compiled once per test
//! run for each architecture.

use std::sync::OnceLock;

use prepare::compile::{compile_kernels_with, Compilation};
use prepare::gpu::nvrtc::Nvrtc;
use prepare::kernels::all_kernels;
use prepare::ladder::{Arch, Dtype};
use prepare::progress::Silent;

/// NVRTC, or `None` when it cannot be loaded: the caller skips, unless
/// `PREPARE_REQUIRE_NVRTC=1` makes that a failure.
pub fn nvrtc() -> Option<&'static Nvrtc> {
    match Nvrtc::load() {
        Ok(nvrtc) => Some(nvrtc),
        Err(error) if std::env::var("PREPARE_REQUIRE_NVRTC").as_deref() == Ok("1") => {
            panic!("PREPARE_REQUIRE_NVRTC=1 but {error}")
        }
        Err(error) => {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("skipped: {error}");
            }
            None
        }
    }
}

/// NVRTC for the calling test, which returns (skips) without it; see [`nvrtc`].
macro_rules! require_nvrtc {
    () => {
        match $crate::nvrtc::support::nvrtc() {
            Some(nvrtc) => nvrtc,
            None => return,
        }
    };
}
pub(crate) use require_nvrtc;

/// The architectures whose kernels the tests compile: the Hopper and both Blackwell targets of
/// the shipped ladders.
pub const ARCHES: [Arch; 3] = [Arch::Sm90, Arch::Sm120, Arch::Sm121];

/// Every kernel for bf16 at world size 2 (the element type and world of the H200 TP2 ladders)
/// compiled for `arch` (one of [`ARCHES`]) from the embedded sources: compiled by the first test
/// that asks, then shared by every test of the run.
pub fn every_kernel(nvrtc: &Nvrtc, arch: Arch) -> &'static Compilation {
    static COMPILED: [OnceLock<Compilation>; ARCHES.len()] =
        [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let index = ARCHES
        .iter()
        .position(|known| *known == arch)
        .unwrap_or_else(|| panic!("{arch} is not one of the tested architectures"));
    COMPILED[index].get_or_init(|| {
        compile_kernels_with(nvrtc, &all_kernels(Dtype::Bf16, 2), arch, &Silent)
            .unwrap_or_else(|error| panic!("compiling every kernel for {arch}: {error}"))
    })
}
