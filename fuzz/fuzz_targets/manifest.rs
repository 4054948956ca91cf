//! The manifest parser on any bytes within the manifest size limit: never a panic.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() as u64 <= prepare::files::MANIFEST.bytes {
        let _ = prepare::package::parse_manifest_bytes(Path::new("manifest.json"), data);
    }
});
