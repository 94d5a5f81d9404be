//! The status JSON from arbitrary bytes: never a panic, and what parses
//! prints as JSON that parses back to the same status.
#![no_main]

use graceful_core::drain::status::Status;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = serde_json::from_slice::<Status>(data) {
        let back: Status = serde_json::from_str(&s.to_json()).unwrap();
        assert_eq!(back, s);
    }
});
