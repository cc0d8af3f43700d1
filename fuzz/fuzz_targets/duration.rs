//! Durations: parse never panics, and what parses formats back to the same value.
#![no_main]

use herald::model::{format_duration_ms, parse_duration_ms};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(ms) = parse_duration_ms(s) {
            assert_eq!(parse_duration_ms(&format_duration_ms(ms)), Ok(ms));
        }
    }
});
