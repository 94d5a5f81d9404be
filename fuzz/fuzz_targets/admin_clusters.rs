//! Envoy's admin `/clusters?format=json` answer from arbitrary bytes: never
//! a panic, and the membership read from it round-trips through its
//! shared-data encoding.
#![no_main]

use graceful_core::consumer::steering::{admin_clusters_path, Membership};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Membership::from_admin_json(data, &["svc", "providers", ""]) {
        assert_eq!(Membership::decode(&m.encode()), Some(m));
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let names: Vec<&str> = text.split('\n').take(8).collect();
        let path = admin_clusters_path(&names);
        assert!(path.is_ascii() && !path.contains(' '));
    }
});
