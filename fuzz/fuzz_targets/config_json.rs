//! The three plugin configurations from arbitrary bytes: never a panic, and
//! whatever parses keeps the documented bounds.
#![no_main]

use graceful_core::consumer::config::{ConsumerConfig, MAX_MAX_TOMBSTONES};
use graceful_core::drain::config::{DrainConfig, MAX_MAX_WAITERS};
use graceful_core::provider::config::ProviderConfig;
use graceful_core::shared::duration::MAX_DURATION;
use libfuzzer_sys::fuzz_target;

fn lower_token(h: &str) -> bool {
    !h.is_empty()
        && h.bytes().all(|b| {
            b.is_ascii_digit() || b.is_ascii_lowercase() || b"!#$%&'*+-.^_`|~".contains(&b)
        })
}

fuzz_target!(|data: &[u8]| {
    match ProviderConfig::from_json(data) {
        Ok(c) => {
            assert!(lower_token(&c.closing_header));
            if let Some(h) = &c.instance_header {
                assert!(lower_token(h) && *h != c.closing_header);
            }
        }
        Err(e) => assert!(!e.to_string().contains('\n')),
    }
    match DrainConfig::from_json(data) {
        Ok(c) => {
            let g = c.gate;
            assert!(g.timeout >= g.consumer_update_wait && g.timeout <= MAX_DURATION);
            assert!(u64::from(c.max_waiters) <= MAX_MAX_WAITERS);
            let p = &c.paths;
            let all = [&p.closing, &p.ready, &p.status, &p.drained, &p.grpc_health];
            for (i, path) in all.iter().enumerate() {
                assert!(path.starts_with('/') && !all[..i].contains(path));
            }
        }
        Err(e) => assert!(!e.to_string().contains('\n')),
    }
    match ConsumerConfig::from_json(data) {
        Ok(c) => {
            assert!(c.closing_headers.iter().all(|h| lower_token(h)));
            assert!(!c.closing_headers.contains(&c.override_host_header));
            assert!(!c.tombstone_ttl.is_zero() && !c.failure_tombstone_ttl.is_zero());
            assert!(c.max_tombstones >= 1 && u64::from(c.max_tombstones) <= MAX_MAX_TOMBSTONES);
        }
        Err(e) => assert!(!e.to_string().contains('\n')),
    }
});
