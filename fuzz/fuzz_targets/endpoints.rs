//! The drain filter's router on arbitrary `:method` and `:path` bytes
//! (split at the first NUL): never a panic; only POST reaches the closing
//! endpoint; a wait is never zero nor above an hour.
#![no_main]

use graceful_core::drain::config::Paths;
use graceful_core::drain::endpoints::{route, Endpoint, Route, MAX_WAIT};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (method, path) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&b"GET"[..], data),
    };
    match route(&Paths::default(), method, path) {
        Route::Endpoint(Endpoint::Closing) | Route::Endpoint(Endpoint::GrpcHealth) => {
            assert_eq!(method, b"POST")
        }
        Route::Endpoint(Endpoint::Drained { wait: Some(w) }) => {
            assert!(!w.is_zero() && w <= MAX_WAIT)
        }
        Route::Endpoint(_) => assert!(method == b"GET" || method == b"HEAD"),
        Route::Pass | Route::MethodNotAllowed(_) | Route::BadRequest(_) => {}
    }
});
