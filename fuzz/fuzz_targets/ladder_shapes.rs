//! Ladder validation on the shapes that stress the source map, built from a few fuzzed
//! parameters and kept within the ladder size limit: deep nesting, wide objects, long keys, long
//! arrays and duplicate keys, alone or around a real ladder's fields. Run with
//! `-rss_limit_mb=300`: peak memory must stay under 300 MB.
#![no_main]

use std::fmt::Write as _;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let byte = |index: usize| usize::from(data.get(index).copied().unwrap_or(0));
    let depth = byte(0) % 130;
    let key_length = (byte(1) << 8 | byte(2)) % 20_000;
    let width = (byte(3) << 8 | byte(4)) % 50_000;
    let elements = (byte(5) << 8 | byte(6)) * 8 % 500_000;
    let duplicate = byte(7) % 2 == 1;
    let limit = prepare::files::LADDER.bytes as usize;

    let mut text = String::new();
    for level in 0..depth {
        let key: String = std::iter::repeat_n(char::from(b'a' + (level % 26) as u8), key_length)
            .collect();
        let _ = write!(text, "{{\"{key}\":");
        if text.len() > limit {
            return;
        }
    }
    text.push('{');
    for member in 0..width {
        let key = if duplicate { 0 } else { member };
        let _ = write!(text, "\"k{key}\":0,");
        if text.len() > limit {
            return;
        }
    }
    text.push_str("\"array\":[");
    for element in 0..elements {
        if element > 0 {
            text.push(',');
        }
        text.push_str("[0]");
        if text.len() > limit {
            return;
        }
    }
    text.push_str("]}");
    text.push_str(&"}".repeat(depth));
    if text.len() <= limit {
        let _ = prepare::ladder::validate_ladder_text(&text);
    }
});
