//! Ladder validation on any bytes up to the ladder size limit: never a panic, and (run with
//! `-rss_limit_mb=300`) never more than 300 MB.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() as u64 <= prepare::files::LADDER.bytes {
        let _ = prepare::ladder::validate_ladder_bytes(data);
    }
});
