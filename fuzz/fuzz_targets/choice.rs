//! The choice reader on any bytes within the choice size limit: never a panic.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() as u64 <= prepare::files::CHOICE.bytes {
        let _ = prepare::tune::choice::Choice::from_bytes(Path::new("choice.json"), data);
    }
});
