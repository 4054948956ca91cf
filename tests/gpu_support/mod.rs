//! Shared by the GPU tests: find enough GPUs or skip (failing instead when
//! `PREPARE_REQUIRE_GPU=1`, so a GPU run cannot pass by finding none), and compile test
//! kernels with NVRTC.
#![allow(dead_code, clippy::print_stderr)]

use prepare::gpu::driver::{visible_devices, Device, Driver, DriverError};

/// Whether this run must find GPUs.
pub fn gpu_required() -> bool {
    std::env::var("PREPARE_REQUIRE_GPU").is_ok_and(|value| value == "1")
}

/// The verdict on a probe of the driver: `Ok(true)` to run, `Ok(false)` to skip, `Err` to fail.
pub fn verdict(
    required: bool,
    needed: usize,
    probe: &Result<usize, DriverError>,
) -> Result<bool, String> {
    let missing = match probe {
        Ok(count) if *count >= needed => return Ok(true),
        Ok(count) => format!("the driver sees {count} GPU(s), {needed} needed"),
        Err(error) => format!("no usable driver: {error}"),
    };
    if required {
        Err(format!("PREPARE_REQUIRE_GPU=1 but {missing}"))
    } else {
        eprintln!("skipped: {missing}");
        Ok(false)
    }
}

/// `needed` GPUs opened, or `None` (skip) when there are fewer and GPUs are not required.
pub fn gpus(needed: usize) -> Option<(Driver, Vec<Device>)> {
    let probe = visible_devices();
    match verdict(gpu_required(), needed, &probe) {
        Ok(true) => {}
        Ok(false) => return None,
        Err(message) => panic!("{message}"),
    }
    let driver = Driver::open().expect("the driver opened for the probe");
    let devices = (0..needed)
        .map(|ordinal| driver.open_device(ordinal).expect("opening a visible GPU"))
        .collect();
    Some((driver, devices))
}

/// Compiles CUDA source to PTX for `arch` (`sm_90`) with NVRTC, panicking with its log (cudarc
/// panics with the names it searched when `libnvrtc.so.13` is not on the loader path).
pub fn compile_ptx(source: &str, arch: &'static str) -> String {
    let options = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        options: vec!["--std=c++17".to_owned()],
        ..Default::default()
    };
    match cudarc::nvrtc::compile_ptx_with_opts(source, options) {
        Ok(ptx) => ptx.to_src(),
        Err(cudarc::nvrtc::CompileError::CompileError { log, options, .. }) => panic!(
            "NVRTC refused the test kernels with {options:?}:\n{}",
            log.to_string_lossy()
        ),
        Err(other) => panic!("NVRTC failed: {other}"),
    }
}

/// A reproducible stream of 64-bit values (splitmix64), for test inputs that are never zeros.
#[derive(Debug, Clone)]
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut value = self.0;
        value = (value ^ (value >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        value = (value ^ (value >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        value ^ (value >> 31)
    }

    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }
}
