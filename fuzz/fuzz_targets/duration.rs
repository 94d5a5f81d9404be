//! Durations from arbitrary text: never a panic, never past 24h, and the
//! formatted value parses back (to the millisecond).
#![no_main]

use std::time::Duration;

use graceful_core::shared::duration::{format_duration, parse_duration, MAX_DURATION};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(d) = parse_duration(text) {
        assert!(d <= MAX_DURATION);
        let whole_ms = Duration::from_millis(d.as_millis() as u64);
        assert_eq!(
            parse_duration(&format_duration(d)),
            Ok(whole_ms),
            "{text:?}"
        );
    }
});
