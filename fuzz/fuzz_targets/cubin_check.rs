//! The cubin check that guards `cuModuleLoadData` (which takes no length): any bytes, never a
//! panic or a read outside the slice.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = prepare::gpu::driver::check_cubin(data);
});
