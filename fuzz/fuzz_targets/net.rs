//! CIDRs and the `source.address` check from arbitrary bytes: never a panic;
//! a parsed range prints as text that parses back to it; a trusted peer is
//! a real `ip:port` with a port, never the last forwarded entry.
#![no_main]

use std::net::SocketAddr;

use graceful_core::shared::net::{trusted_peer_ip, Cidr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(c) = text.parse::<Cidr>() {
            assert_eq!(c.to_string().parse::<Cidr>(), Ok(c), "{text:?}");
        }
    }
    // source.address, then x-forwarded-for after the first NUL (if any).
    let (source, xff) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], Some(&data[i + 1..])),
        None => (data, None),
    };
    if let Some(ip) = trusted_peer_ip(source, xff) {
        let peer: SocketAddr = std::str::from_utf8(source).unwrap().parse().unwrap();
        assert_eq!(peer.ip(), ip);
        assert_ne!(peer.port(), 0);
    }
});
