//! With `PREPARE_NVRTC` naming a file that does not exist, compiling fails with an error that
//! names the variable and says how to get NVRTC, instead of panicking. In a process of its
//! own, so setting the variable races with nothing.

use prepare::compile::{compile_kernels, CompileError};
use prepare::kernels::all_kernels;
use prepare::ladder::Arch;

use crate::support::process::in_own_process;
use crate::test_name;

#[test]
fn a_missing_library_gives_the_friendly_error() {
    if !in_own_process(&test_name!(a_missing_library_gives_the_friendly_error)) {
        return;
    }
    let missing = tempfile::tempdir().unwrap().path().join("libnvrtc.so.13");
    std::env::set_var("PREPARE_NVRTC", &missing);
    let error = compile_kernels(
        &all_kernels(prepare::ladder::Dtype::Bf16, 2),
        Arch::Sm90,
        &prepare::progress::Silent,
    )
    .unwrap_err();
    assert!(matches!(error, CompileError::Library(_)), "{error}");
    let message = error
        .to_string()
        .replace(&missing.display().to_string(), "<missing>");
    insta::assert_snapshot!(message, @"PREPARE_NVRTC names <missing>, which does not exist; point it at libnvrtc.so.13 or the directory holding it");
}
