//! Property tests of the core's text parsers and formatters: durations,
//! CIDRs, the `source.address` check, the drain endpoints' router and the
//! status JSON. Each parser must never panic on arbitrary input, and each
//! formatter's output must parse back to what was formatted.

// Test code: a panic is how a property fails (clippy's in-test allowances
// do not reach the strategy helpers outside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use graceful_core::drain::config::Paths;
use graceful_core::drain::endpoints::{route, Endpoint, Route, MAX_WAIT};
use graceful_core::drain::record::{InstanceRecord, Phase};
use graceful_core::drain::status::Status;
use graceful_core::shared::duration::{format_duration, parse_duration, MAX_DURATION};
use graceful_core::shared::gate::Traffic;
use graceful_core::shared::net::{trusted_peer_ip, Cidr};
use proptest::prelude::*;

mod common;
use common::config;

const MAX_MS: u64 = 24 * 3600 * 1000;

/// Text that looks like a duration often enough to reach every branch of
/// the parser: digits, dots, unit letters, signs, spaces, and some noise.
fn duration_like() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            4 => "[0-9]{1,14}",
            2 => Just(".".to_string()),
            3 => prop::sample::select(vec!["ms", "s", "m", "h", "d", "us", "µs", "S", "sec"])
                .prop_map(str::to_string),
            1 => "[ +\\-e,]",
            1 => any::<char>().prop_map(String::from),
        ],
        0..8,
    )
    .prop_map(|parts| parts.concat())
}

fn unit() -> impl Strategy<Value = (&'static str, u128)> {
    prop::sample::select(vec![
        ("ms", 1_000u128),
        ("s", 1_000_000),
        ("m", 60_000_000),
        ("h", 3_600_000_000),
    ])
}

fn any_ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<u32>().prop_map(|b| IpAddr::V4(Ipv4Addr::from(b))),
        any::<u128>().prop_map(|b| IpAddr::V6(Ipv6Addr::from(b))),
        // IPv4-mapped IPv6, what a dual-stack listener reports for v4 peers.
        any::<u32>().prop_map(|b| IpAddr::V6(Ipv4Addr::from(b).to_ipv6_mapped())),
    ]
}

fn ip_and_prefix() -> impl Strategy<Value = (IpAddr, u8)> {
    any_ip().prop_flat_map(|ip| {
        let max = if ip.is_ipv4() { 32u8 } else { 128 };
        (Just(ip), 0..=max)
    })
}

/// IPv4 or IPv6, never IPv4-mapped.
fn plain_ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<u32>().prop_map(|b| IpAddr::V4(Ipv4Addr::from(b))),
        any::<u128>()
            .prop_filter("not mapped", |b| Ipv6Addr::from(*b)
                .to_ipv4_mapped()
                .is_none())
            .prop_map(|b| IpAddr::V6(Ipv6Addr::from(b))),
    ]
}

/// An address and a prefix; a mapped address only with a prefix inside
/// its IPv4 part (a wider one is an IPv6 range, which by design matches
/// no IPv4 peer).
fn ip_and_narrow_prefix() -> impl Strategy<Value = (IpAddr, u8)> {
    any_ip().prop_flat_map(|ip| {
        let mapped = matches!(ip, IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some());
        let range = match ip {
            IpAddr::V4(_) => 0..=32u8,
            IpAddr::V6(_) if mapped => 96..=128,
            IpAddr::V6(_) => 0..=128,
        };
        (Just(ip), range)
    })
}

/// The top `prefix` bits of an address, family included; IPv4-mapped IPv6
/// addresses are not canonicalised (the callers skip them).
fn top_bits(ip: IpAddr, prefix: u8) -> (bool, u128) {
    match ip {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            (true, u128::from(bits & mask))
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            (false, bits & mask)
        }
    }
}

fn any_status() -> impl Strategy<Value = Status> {
    (
        prop_oneof![
            3 => prop::sample::select(vec!["serving", "closing", "drained"]).prop_map(str::to_string),
            1 => any::<String>(),
        ],
        any::<Option<u64>>(),
        any::<u64>(),
        any::<u64>(),
        any::<Option<u64>>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(
                phase,
                closing_for_ms,
                inflight_inbound,
                inflight_outbound,
                last_request_ms_ago,
                drained,
                forced,
            )| Status {
                phase,
                closing_for_ms,
                inflight_inbound,
                inflight_outbound,
                last_request_ms_ago,
                drained,
                forced,
            },
        )
}

fn any_record() -> impl Strategy<Value = InstanceRecord> {
    (
        prop::sample::select(vec![Phase::Serving, Phase::Closing, Phase::Drained]),
        any::<bool>(),
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(
            |(phase, forced, closing_since_us, drained_at_us)| InstanceRecord {
                phase,
                forced,
                admission_stopped: phase != Phase::Serving && !forced,
                closing_since_us,
                drained_at_us,
            },
        )
}

proptest! {
    #![proptest_config(config(256))]

    // ---- durations ------------------------------------------------------

    #[test]
    fn duration_parse_never_panics_and_stays_within_the_bound(text in any::<String>()) {
        if let Ok(d) = parse_duration(&text) {
            prop_assert!(d <= MAX_DURATION);
        }
    }

    #[test]
    fn duration_parse_never_panics_on_duration_like_text(text in duration_like()) {
        match parse_duration(&text) {
            Ok(d) => {
                prop_assert!(d <= MAX_DURATION);
                prop_assert!(!text.is_empty());
                prop_assert!(
                    text.bytes().all(|b| b.is_ascii_digit() || b".mhs".contains(&b)),
                    "{text:?} accepted with a character outside digits, '.' and units"
                );
            }
            Err(e) => prop_assert!(e.to_string().contains(&format!("{text:?}")), "{e}"),
        }
    }

    #[test]
    fn duration_format_then_parse_round_trips_whole_milliseconds(ms in 0..=MAX_MS) {
        let d = Duration::from_millis(ms);
        let text = format_duration(d);
        prop_assert_eq!(parse_duration(&text), Ok(d), "formatted as {:?}", text);
    }

    #[test]
    fn duration_format_drops_only_sub_millisecond_digits(us in 0..=MAX_MS * 1000) {
        let d = Duration::from_micros(us);
        let back = parse_duration(&format_duration(d));
        prop_assert_eq!(back, Ok(Duration::from_millis(us / 1000)));
    }

    #[test]
    fn duration_parse_reads_sums_of_terms_with_fractions_to_the_microsecond(
        terms in prop::collection::vec(
            ("[0-9]{1,6}", prop::option::of("[0-9]{1,8}"), unit()),
            1..5,
        )
    ) {
        let mut text = String::new();
        let mut expected_us: u128 = 0;
        for (whole, frac, (unit, unit_us)) in &terms {
            text.push_str(whole);
            let mut us = whole.parse::<u128>().unwrap() * unit_us;
            if let Some(frac) = frac {
                text.push('.');
                text.push_str(frac);
                let mut scale = *unit_us;
                for digit in frac.bytes() {
                    scale /= 10;
                    us += u128::from(digit - b'0') * scale;
                }
            }
            text.push_str(unit);
            expected_us += us;
        }
        let got = parse_duration(&text);
        if expected_us <= MAX_DURATION.as_micros() {
            prop_assert_eq!(got, Ok(Duration::from_micros(expected_us as u64)), "{}", text);
        } else {
            prop_assert!(got.is_err(), "{text:?} above 24h parsed as {got:?}");
        }
    }

    #[test]
    fn duration_of_a_concatenation_is_the_sum_of_its_parts(a in 0..=MAX_MS, b in 0..=MAX_MS) {
        let (da, db) = (Duration::from_millis(a), Duration::from_millis(b));
        let joined = format!("{}{}", format_duration(da), format_duration(db));
        let got = parse_duration(&joined);
        if da + db <= MAX_DURATION {
            prop_assert_eq!(got, Ok(da + db), "{}", joined);
        } else {
            prop_assert!(got.is_err(), "{joined:?} parsed as {got:?}");
        }
    }

    #[test]
    fn duration_with_a_sign_or_space_inserted_is_refused(
        ms in 0..=MAX_MS,
        junk in prop::sample::select(vec![" ", "-", "+", "\t", ",", "_"]),
        at in any::<prop::sample::Index>(),
    ) {
        let text = format_duration(Duration::from_millis(ms));
        let i = at.index(text.len() + 1);
        let bad = format!("{}{junk}{}", &text[..i], &text[i..]);
        prop_assert!(parse_duration(&bad).is_err(), "{bad:?} parsed");
    }

    // ---- CIDRs ----------------------------------------------------------

    #[test]
    fn cidr_parse_never_panics(text in any::<String>()) {
        let _ = text.parse::<Cidr>();
    }

    #[test]
    fn cidr_parse_never_panics_on_address_like_text(
        text in "[0-9a-fA-F:./%\\-+ ]{0,48}"
    ) {
        if let Ok(c) = text.parse::<Cidr>() {
            prop_assert_eq!(c.to_string().parse::<Cidr>(), Ok(c));
        }
    }

    #[test]
    fn cidr_display_parses_back_to_the_same_range((ip, prefix) in ip_and_prefix()) {
        let c: Cidr = format!("{ip}/{prefix}").parse().unwrap();
        prop_assert_eq!(c.to_string().parse::<Cidr>(), Ok(c));
    }

    #[test]
    fn cidr_contains_the_address_it_was_written_with((ip, prefix) in ip_and_narrow_prefix()) {
        let c: Cidr = format!("{ip}/{prefix}").parse().unwrap();
        prop_assert!(c.contains(ip), "{c} does not contain {ip}");
        let bare: Cidr = ip.to_string().parse().unwrap();
        prop_assert!(bare.contains(ip), "{bare} does not contain {ip}");
    }

    #[test]
    fn cidr_contains_exactly_the_addresses_sharing_its_prefix(
        (ip, prefix) in plain_ip().prop_flat_map(|ip| (Just(ip), 0..=if ip.is_ipv4() { 32u8 } else { 128 })),
        other in plain_ip(),
    ) {
        let c: Cidr = format!("{ip}/{prefix}").parse().unwrap();
        let same = ip.is_ipv4() == other.is_ipv4() && top_bits(ip, prefix) == top_bits(other, prefix);
        prop_assert_eq!(c.contains(other), same, "{} contains {}?", c, other);
    }

    #[test]
    fn cidr_treats_mapped_ipv6_peers_as_their_ipv4_address(v4 in any::<u32>(), prefix in 0u8..=32) {
        let v4 = Ipv4Addr::from(v4);
        let c: Cidr = format!("{v4}/{prefix}").parse().unwrap();
        prop_assert!(c.contains(IpAddr::V6(v4.to_ipv6_mapped())));
    }

    #[test]
    fn cidr_refuses_prefixes_past_the_family_width(ip in any_ip(), extra in 1u16..1000) {
        let max = if ip.is_ipv4() { 32u16 } else { 128 };
        let text = format!("{ip}/{}", max + extra);
        prop_assert!(text.parse::<Cidr>().is_err(), "{text:?} parsed");
    }

    // ---- trusted_peer_ip --------------------------------------------------

    #[test]
    fn trusted_peer_never_panics_on_arbitrary_bytes(
        source in prop::collection::vec(any::<u8>(), 0..64),
        xff in prop::option::of(prop::collection::vec(any::<u8>(), 0..128)),
    ) {
        let _ = trusted_peer_ip(&source, xff.as_deref());
    }

    #[test]
    fn trusted_peer_accepts_a_real_peer_whatever_other_entries_the_header_holds(
        ip in any_ip(),
        port in 1u16..,
        forwarded in prop::collection::vec(
            prop_oneof![
                any_ip().prop_map(|ip| ip.to_string()),
                (any_ip(), any::<u16>()).prop_map(|(ip, p)| SocketAddr::new(ip, p).to_string()),
                "[ -~]{0,20}",
            ],
            0..6,
        ),
    ) {
        let peer = SocketAddr::new(ip, port);
        let xff = forwarded.join(", ");
        let last_is_peer = forwarded
            .last()
            .is_some_and(|e| e.trim().parse::<SocketAddr>().ok() == Some(peer));
        prop_assume!(!last_is_peer);
        prop_assert_eq!(trusted_peer_ip(peer.to_string().as_bytes(), None), Some(ip));
        prop_assert_eq!(trusted_peer_ip(peer.to_string().as_bytes(), Some(xff.as_bytes())), Some(ip));
    }

    #[test]
    fn trusted_peer_refuses_addresses_taken_from_a_header(
        ip in any_ip(),
        port in any::<u16>(),
        before in prop::collection::vec(any_ip().prop_map(|ip| ip.to_string()), 0..4),
    ) {
        // Port 0: what Envoy reports for an address read from x-forwarded-for.
        let from_header = SocketAddr::new(ip, 0).to_string();
        let xff = [before.clone(), vec![ip.to_string()]].concat().join(",");
        prop_assert_eq!(trusted_peer_ip(from_header.as_bytes(), Some(xff.as_bytes())), None);
        prop_assert_eq!(trusted_peer_ip(from_header.as_bytes(), None), None);
        // A forwarded entry carrying the very ip:port, should a parser keep it.
        prop_assume!(port != 0);
        let peer = SocketAddr::new(ip, port).to_string();
        let xff = [before, vec![format!(" {peer} ")]].concat().join(",");
        prop_assert_eq!(trusted_peer_ip(peer.as_bytes(), Some(xff.as_bytes())), None);
    }

    #[test]
    fn trusted_peer_refuses_bare_ips_and_non_socket_addresses(ip in any_ip(), junk in "[ -~]{0,30}") {
        prop_assert_eq!(trusted_peer_ip(ip.to_string().as_bytes(), None), None);
        if junk.parse::<SocketAddr>().is_err() {
            prop_assert_eq!(trusted_peer_ip(junk.as_bytes(), None), None);
        }
    }

    // ---- endpoints -------------------------------------------------------

    #[test]
    fn route_never_panics_on_arbitrary_method_and_path_bytes(
        method in prop::collection::vec(any::<u8>(), 0..16),
        path in prop::collection::vec(any::<u8>(), 0..96),
    ) {
        let _ = route(&Paths::default(), &method, &path);
    }

    #[test]
    fn route_passes_every_path_that_is_not_an_endpoint(
        method in prop::sample::select(vec!["GET", "HEAD", "POST", "PUT", "DELETE", "get", ""]),
        path in "/[ -~]{0,40}",
    ) {
        let paths = Paths::default();
        let bare = path.split('?').next().unwrap_or_default();
        prop_assume!(!paths.named().iter().any(|(_, p)| p.as_str() == bare));
        prop_assert_eq!(route(&paths, method.as_bytes(), path.as_bytes()), Route::Pass);
    }

    #[test]
    fn route_answers_endpoints_only_for_their_methods(
        which in 0usize..6,
        method in prop::sample::select(vec!["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "get", "post", ""]),
        query in prop::option::of("[a-z=&0-9]{0,20}"),
    ) {
        let paths = Paths::default();
        let path = paths.named()[which].1;
        let full = match &query {
            Some(q) => format!("{path}?{q}"),
            None => path.clone(),
        };
        let got = route(&paths, method.as_bytes(), full.as_bytes());
        let read_only = method == "GET" || method == "HEAD";
        match which {
            0 if method == "POST" => prop_assert_eq!(got, Route::Endpoint(Endpoint::Closing)),
            0 => prop_assert_eq!(got, Route::MethodNotAllowed("POST")),
            4 if method == "POST" => prop_assert_eq!(got, Route::Endpoint(Endpoint::GrpcHealth)),
            4 => prop_assert_eq!(got, Route::Pass),
            5 if method == "POST" => prop_assert_eq!(got, Route::Endpoint(Endpoint::GrpcHealthWatch)),
            5 => prop_assert_eq!(got, Route::Pass),
            1 if read_only => prop_assert_eq!(got, Route::Endpoint(Endpoint::Ready)),
            2 if read_only => prop_assert_eq!(got, Route::Endpoint(Endpoint::Status)),
            3 if read_only => prop_assert!(
                matches!(got, Route::Endpoint(Endpoint::Drained { .. }) | Route::BadRequest(_)),
                "{got:?}"
            ),
            3 => prop_assert!(
                matches!(got, Route::MethodNotAllowed("GET, HEAD") | Route::BadRequest(_)),
                "{got:?}"
            ),
            _ => prop_assert_eq!(got, Route::MethodNotAllowed("GET, HEAD")),
        }
    }

    #[test]
    fn drained_wait_reads_any_formatted_duration_and_refuses_past_an_hour(
        ms in 0..=MAX_MS,
        before in "([a-z]{1,5}=[a-z0-9]{0,5}&){0,3}",
    ) {
        let d = Duration::from_millis(ms);
        let path = format!("/graceful/drained?{before}wait={}", format_duration(d));
        let got = route(&Paths::default(), b"GET", path.as_bytes());
        if d > MAX_WAIT {
            prop_assert!(matches!(got, Route::BadRequest(ref r) if r.starts_with("wait:")), "{got:?}");
        } else {
            let wait = (!d.is_zero()).then_some(d);
            prop_assert_eq!(got, Route::Endpoint(Endpoint::Drained { wait }));
        }
    }

    #[test]
    fn drained_wait_with_arbitrary_value_bytes_is_a_wait_or_a_400(
        value in prop::collection::vec(any::<u8>(), 0..24),
    ) {
        let mut path = b"/graceful/drained?wait=".to_vec();
        path.extend_from_slice(&value);
        match route(&Paths::default(), b"GET", &path) {
            Route::Endpoint(Endpoint::Drained { wait }) => {
                prop_assert!(wait.is_none_or(|w| !w.is_zero() && w <= MAX_WAIT));
            }
            Route::BadRequest(reason) => prop_assert!(reason.starts_with("wait:"), "{reason}"),
            other => prop_assert!(false, "{other:?}"),
        }
    }

    // ---- status JSON -----------------------------------------------------

    #[test]
    fn status_json_round_trips_any_status(s in any_status()) {
        let json = s.to_json();
        let back: Status = serde_json::from_str(&json).unwrap();
        prop_assert_eq!(back, s);
    }

    #[test]
    fn status_of_any_record_is_consistent_and_round_trips(
        record in any_record(),
        traffic in (any::<Option<u64>>(), any::<Option<u64>>(), any::<Option<u64>>()).prop_map(|(i, o, s)| Traffic { inflight_inbound: i, inflight_outbound: o, started: s }),
        latest in any::<u64>(),
        now_us in any::<u64>(),
    ) {
        let s = Status::new(&record, &traffic, latest, now_us);
        prop_assert_eq!(s.phase.as_str(), record.phase.name());
        prop_assert_eq!(s.drained, record.phase == Phase::Drained);
        prop_assert_eq!(s.forced, record.forced);
        prop_assert_eq!(s.closing_for_ms.is_some(), record.phase != Phase::Serving);
        prop_assert_eq!((s.inflight_inbound, s.inflight_outbound), (traffic.inflight_inbound.unwrap_or(0), traffic.inflight_outbound.unwrap_or(0)));
        prop_assert_eq!(s.last_request_ms_ago.is_some(), latest != 0);
        let back: Status = serde_json::from_str(&s.to_json()).unwrap();
        prop_assert_eq!(back, s);
    }

    #[test]
    fn status_json_parse_never_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(s) = serde_json::from_slice::<Status>(&bytes) {
            let back: Status = serde_json::from_str(&s.to_json()).unwrap();
            prop_assert_eq!(back, s);
        }
    }

    #[test]
    fn status_json_refuses_a_document_missing_any_field(s in any_status(), drop in 0usize..7) {
        let mut value: serde_json::Value = serde_json::from_str(&s.to_json()).unwrap();
        let map = value.as_object_mut().unwrap();
        let key = map.keys().nth(drop).cloned().unwrap();
        map.remove(&key);
        let parsed = serde_json::from_value::<Status>(value);
        // serde reads a missing Option field as null; every other field is required.
        match key.as_str() {
            "closing_for_ms" => prop_assert_eq!(parsed.ok(), Some(Status { closing_for_ms: None, ..s })),
            "last_request_ms_ago" => prop_assert_eq!(parsed.ok(), Some(Status { last_request_ms_ago: None, ..s })),
            _ => prop_assert!(parsed.is_err(), "{key} missing but parsed"),
        }
    }
}
