//! Property tests of the shared-data encodings and the consumer's admin
//! parsing: every decoder is total (never panics on arbitrary bytes),
//! accepts only what its encoder writes (decode then encode gives the same
//! bytes), and every encoder's output decodes back to the value.

// Test code: a panic is how a property fails (clippy's in-test allowances
// do not reach the strategy helpers outside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use graceful_core::consumer::front::{
    host_ip, Event, FrontHosts, Health, Limits, ENTRY_LEN, MAX_HOSTS_CEILING,
};
use graceful_core::consumer::steering::{
    admin_clusters_path, AdminSource, ClusterSet, Membership, MAX_CLUSTERS, MAX_MEMBERS,
};
use graceful_core::consumer::tombstone::{Observation, Tombstones, Ttls};
use graceful_core::drain::record::{InstanceRecord, Phase, RECORD_LEN};
use graceful_core::shared::instance::{decode_identity, encode_identity, generate, is_valid};
use proptest::prelude::*;
use serde_json::{json, Value};

mod common;
use common::config;

/// `cases` per property; `PROPTEST_CASES=n` runs n instead (deeper runs).
/// When the observed members were seen (µs on the host's monotonic clock).
const SEEN_AT: u64 = 1_800_000_000_000_000;

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..max)
}

/// Bytes that start like a value of `len` bytes with `version` and are
/// mutated in a few places: closer to valid than plain random bytes.
fn near(valid: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let len = valid.len();
    (
        prop::collection::vec((0..len.max(1), any::<u8>()), 0..4),
        prop::option::of(0..len + 2),
    )
        .prop_map(move |(flips, cut)| {
            let mut b = valid.clone();
            for (i, v) in flips {
                if let Some(x) = b.get_mut(i) {
                    *x = v;
                }
            }
            if let Some(cut) = cut {
                b.resize(cut, 0);
            }
            b
        })
}

fn any_record() -> impl Strategy<Value = InstanceRecord> {
    (
        prop::sample::select(vec![Phase::Serving, Phase::Closing, Phase::Drained]),
        any::<[bool; 2]>(),
        any::<[u64; 2]>(),
    )
        .prop_map(
            |(phase, [forced, admission_stopped], [c, d])| InstanceRecord {
                phase,
                forced,
                admission_stopped,
                closing_since_us: c,
                drained_at_us: d,
            },
        )
}

/// Network-ish strings: short addresses, long junk, multi-byte text.
fn net_string() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => (any::<[u8; 4]>(), any::<u16>()).prop_map(|(ip, p)| SocketAddr::from((ip, p)).to_string()),
        1 => (any::<u128>(), any::<u16>()).prop_map(|(ip, p)| SocketAddr::from((Ipv6Addr::from(ip), p)).to_string()),
        1 => ".{0,12}",
        // Past every stored bound, in one- and two-byte characters.
        1 => (0usize..300, prop::sample::select(vec!["x", "é", "ab"])).prop_map(|(n, c)| c.repeat(n)),
    ]
}

/// An observation (kinds 0-2), or the front's announce (3) or lift (4).
fn observation() -> impl Strategy<Value = (u8, String, String, Option<String>)> {
    (
        0u8..5,
        net_string(),
        net_string(),
        prop::option::of(net_string()),
    )
}

/// With `readmit_slow_start`'s window: readmissions leave warming entries.
const TTLS: Ttls = Ttls {
    closing: Duration::from_secs(30),
    failure: Duration::from_secs(5),
    warming: Some(Duration::from_secs(10)),
};

fn observe_all(list: &[(u8, String, String, Option<String>)], max: usize) -> Tombstones {
    let mut t = Tombstones::default();
    for (i, (kind, address, cluster, instance)) in list.iter().enumerate() {
        let now = i as u64 * 1_000_000;
        match kind {
            3 => {
                t.announce(cluster, address, now, now + 120_000_000, max);
                continue;
            }
            4 => {
                t.lift_announced(now, |a| a == address);
                continue;
            }
            _ => {}
        }
        let obs = match kind {
            0 => Observation::Closing {
                cluster,
                address,
                instance: instance.as_deref(),
            },
            1 => Observation::ConnectFailure { cluster, address },
            _ => Observation::Answered {
                address,
                instance: instance.as_deref(),
            },
        };
        t.observe(&obs, &TTLS, now, max);
    }
    t
}

/// An event about one of a few hosts (IPv4 and IPv6), and the µs since
/// the one before.
fn front_event() -> impl Strategy<Value = (u8, Event, u64)> {
    let event = prop_oneof![
        Just(Event::Closing),
        Just(Event::Serving),
        prop::sample::select(vec![Health::Healthy, Health::Draining, Health::Other])
            .prop_map(Event::Listed),
        Just(Event::Left),
        any::<u16>().prop_map(|epoch| Event::Steered { epoch }),
        Just(Event::Unsteerable),
        (
            prop::option::of(prop_oneof![3 => Just(0u32), 2 => 1u32..5, 1 => any::<u32>()]),
            any::<bool>()
        )
            .prop_map(|(active, guard_clear)| Event::Read {
                active,
                guard_clear
            }),
        Just(Event::Attempt),
    ];
    (0u8..6, event, prop_oneof![0u64..200_000, 0u64..200_000_000])
}

fn front_ip(n: u8) -> Ipv6Addr {
    if n.is_multiple_of(2) {
        host_ip(IpAddr::V4(Ipv4Addr::new(10, 0, 0, n)))
    } else {
        Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, u16::from(n))
    }
}

fn front_limits(max_hosts: usize) -> Limits {
    Limits {
        closing_ttl: Duration::from_secs(120),
        poll: Duration::from_millis(100),
        max_hosts,
    }
}

fn apply_all(list: &[(u8, Event, u64)], max_hosts: usize) -> FrontHosts {
    let mut t = FrontHosts::default();
    let mut now = SEEN_AT;
    for (n, event, step) in list {
        now += step;
        t.apply(front_ip(*n), *event, now, &front_limits(max_hosts));
    }
    t
}

fn ip_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<u32>().prop_map(|b| Ipv4Addr::from(b).to_string()),
        any::<u128>().prop_map(|b| Ipv6Addr::from(b).to_string()),
        "[a-z0-9.:]{0,12}",
    ]
}

/// One host of an admin `/clusters?format=json` answer, and what the
/// membership should make of it: its `ip:port` if it has an IP socket
/// address, whether Envoy's load balancer would use it, and whether it is
/// `DRAINING`.
fn admin_host() -> impl Strategy<Value = (Value, Option<(String, bool, bool)>)> {
    (
        ip_text(),
        any::<u16>(),
        prop::option::of(prop::sample::select(vec![
            "HEALTHY", "DEGRADED", "UNKNOWN", "UNHEALTHY", "DRAINING", "TIMEOUT",
        ])),
        any::<[bool; 5]>(),
        0u8..4,
    )
        .prop_map(|(ip, port, eds, flags, shape)| {
            let mut health = serde_json::Map::new();
            if let Some(eds) = eds {
                health.insert("eds_health_status".into(), json!(eds));
            }
            let names = [
                "failed_active_health_check",
                "failed_outlier_check",
                "pending_dynamic_removal",
                "excluded_via_immediate_hc_fail",
                "active_hc_timeout",
            ];
            for (name, on) in names.iter().zip(flags) {
                if on {
                    health.insert((*name).into(), json!(true));
                }
            }
            let usable = matches!(eds, None | Some("HEALTHY" | "DEGRADED" | "UNKNOWN"))
                && !flags.iter().any(|f| *f);
            let draining = eds == Some("DRAINING");
            let parsed = ip.parse::<IpAddr>().ok();
            match shape {
                // An IP socket address.
                0 | 1 => (
                    json!({"address": {"socket_address": {"address": ip, "port_value": port}}, "health_status": health, "weight": 1}),
                    parsed.map(|ip| (SocketAddr::new(ip, port).to_string(), usable, draining)),
                ),
                // A pipe, or no address at all: skipped.
                2 => (
                    json!({"address": {"pipe": {"path": "/tmp/x"}}, "health_status": health}),
                    None,
                ),
                _ => (json!({"health_status": health}), None),
            }
        })
}

fn cluster_name() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z_]{1,8}",
        1 => "[ -~]{1,20}",
        1 => ".{1,12}",
    ]
}

proptest! {
    #![proptest_config(config(256))]

    // ---- instance record -------------------------------------------------

    #[test]
    fn record_round_trips(r in any_record()) {
        let bytes = r.encode();
        prop_assert_eq!(bytes.len(), RECORD_LEN);
        prop_assert_eq!(InstanceRecord::decode(&bytes), Some(r));
    }

    #[test]
    fn record_decodes_only_what_encode_writes(b in bytes(60)) {
        // The last 16 bytes held counters an older build wrote: ignored
        // when read, written as zero.
        if let Some(r) = InstanceRecord::decode(&b) {
            prop_assert_eq!(&r.encode()[..24], &b[..24]);
            prop_assert_eq!(&r.encode()[24..], &[0u8; 16][..]);
        }
    }

    #[test]
    fn record_decodes_only_what_encode_writes_near_valid_values(
        b in any_record().prop_flat_map(|r| near(r.encode().to_vec()))
    ) {
        // The last 16 bytes held counters an older build wrote: ignored
        // when read, written as zero.
        if let Some(r) = InstanceRecord::decode(&b) {
            prop_assert_eq!(&r.encode()[..24], &b[..24]);
            prop_assert_eq!(&r.encode()[24..], &[0u8; 16][..]);
        }
    }

    // ---- tombstones ------------------------------------------------------

    #[test]
    fn tombstones_decode_never_panics_and_accepts_only_what_encode_writes(b in bytes(200)) {
        if let Some(t) = Tombstones::decode(&b) {
            prop_assert_eq!(t.encode(), b);
        }
    }

    #[test]
    fn tombstones_from_any_observations_round_trip(
        list in prop::collection::vec(observation(), 0..24),
        max in 1usize..8,
    ) {
        let t = observe_all(&list, max);
        prop_assert_eq!(Tombstones::decode(&t.encode()), Some(t));
    }

    #[test]
    fn tombstones_decode_accepts_only_what_encode_writes_near_valid_values(
        b in (prop::collection::vec(observation(), 1..6), 1usize..8)
            .prop_flat_map(|(list, max)| near(observe_all(&list, max).encode()))
    ) {
        if let Some(t) = Tombstones::decode(&b) {
            prop_assert_eq!(t.encode(), b);
        }
    }

    // ---- the front's host table ------------------------------------------

    #[test]
    fn front_hosts_decode_never_panics_and_accepts_only_what_encode_writes(b in bytes(400)) {
        if let Some(t) = FrontHosts::decode(&b) {
            prop_assert_eq!(t.encode(), b);
        }
    }

    #[test]
    fn front_hosts_from_any_events_round_trip_within_the_bound(
        list in prop::collection::vec(front_event(), 0..40),
        max_hosts in 1usize..5,
    ) {
        let t = apply_all(&list, max_hosts);
        let bytes = t.encode();
        prop_assert!(t.hosts().len() <= max_hosts);
        prop_assert_eq!(bytes.len(), 3 + ENTRY_LEN * t.hosts().len());
        prop_assert_eq!(FrontHosts::decode(&bytes), Some(t));
    }

    #[test]
    fn front_hosts_decode_accepts_only_what_encode_writes_near_valid_values(
        b in (prop::collection::vec(front_event(), 1..20), 1usize..5)
            .prop_flat_map(|(list, max)| near(apply_all(&list, max).encode()))
    ) {
        if let Some(t) = FrontHosts::decode(&b) {
            prop_assert_eq!(t.encode(), b);
            prop_assert!(t.hosts().len() <= MAX_HOSTS_CEILING);
        }
    }

    // ---- membership and cluster set ---------------------------------------

    #[test]
    fn membership_decode_never_panics_and_is_canonical_within_bounds(b in bytes(200)) {
        if let Some(m) = Membership::decode(&b) {
            // Decoding allows more clusters (u16) than encode writes, so
            // only values within the bound re-encode to the same bytes (200
            // bytes cannot hold more than MAX_MEMBERS hosts).
            let clusters = usize::from(u16::from_le_bytes([b[1], b[2]]));
            if clusters <= MAX_CLUSTERS {
                prop_assert_eq!(m.encode(), b);
            } else {
                prop_assert_eq!(Membership::decode(&m.encode()).map(|d| d.encode()), Some(m.encode()));
            }
        }
    }

    #[test]
    fn membership_built_by_saw_round_trips_and_stays_bounded(
        adds in prop::collection::vec((cluster_name(), net_string()), 0..40),
    ) {
        let mut m = Membership::default();
        for (cluster, address) in &adds {
            let was = m.cluster(cluster).is_some_and(|ms| ms.iter().any(|x| &x.address == address));
            let added = m.saw(cluster, address, SEEN_AT);
            if added {
                prop_assert!(!was);
                prop_assert!(m.cluster(cluster).unwrap().iter().any(|x| &x.address == address && x.usable));
            }
            if !was && cluster.len() <= 255 && address.len() <= 255 {
                prop_assert!(added, "{cluster:?} {address:?} not added");
            }
        }
        let bytes = m.encode();
        prop_assert_eq!(Membership::decode(&bytes), Some(m.clone()));
    }

    #[test]
    fn admin_json_never_panics_on_arbitrary_bytes(b in bytes(300)) {
        let _ = Membership::from_admin_json(&b, &["svc", ""]);
    }

    #[test]
    fn admin_json_never_panics_on_arbitrary_json(v in arbitrary_json()) {
        let body = serde_json::to_vec(&v).unwrap();
        let _ = Membership::from_admin_json(&body, &["svc"]);
        let wrapped = serde_json::to_vec(&json!({"cluster_statuses": [{"name": "svc", "host_statuses": [v]}]})).unwrap();
        let _ = Membership::from_admin_json(&wrapped, &["svc"]);
    }

    #[test]
    fn config_dump_json_never_panics(b in bytes(300), v in arbitrary_json()) {
        let _ = AdminSource::ConfigDump.read(&b, &["svc", ""]);
        let body = serde_json::to_vec(&v).unwrap();
        let _ = AdminSource::ConfigDump.read(&body, &["svc"]);
        let wrapped = serde_json::to_vec(&json!({"configs": [{"dynamic_endpoint_configs": [
            {"endpoint_config": {"cluster_name": "svc", "endpoints": [{"lb_endpoints": [v]}]}}]}]})).unwrap();
        let _ = AdminSource::ConfigDump.read(&wrapped, &["svc"]);
    }

    #[test]
    fn admin_json_yields_the_wanted_clusters_ip_hosts_and_their_usability(
        clusters in prop::collection::vec(
            (prop::sample::select(vec!["svc", "other", "admin", "svc2"]), prop::collection::vec(admin_host(), 0..6)),
            0..5,
        ),
        extra_field in any::<bool>(),
    ) {
        let wanted = ["svc", "svc2"];
        let statuses: Vec<Value> = clusters
            .iter()
            .map(|(name, hosts)| {
                let hosts: Vec<Value> = hosts.iter().map(|(v, _)| v.clone()).collect();
                let mut c = json!({"name": name, "host_statuses": hosts});
                if extra_field {
                    c["added_via_api"] = json!(true);
                }
                c
            })
            .collect();
        let body = serde_json::to_vec(&json!({"cluster_statuses": statuses})).unwrap();
        let m = Membership::from_admin_json(&body, &wanted).unwrap();
        for name in ["other", "admin"] {
            prop_assert!(m.cluster(name).is_none());
        }
        for name in wanted {
            // The first entry of a name is the one found.
            let Some((_, hosts)) = clusters.iter().find(|(n, _)| *n == name) else {
                prop_assert!(m.cluster(name).is_none());
                continue;
            };
            let expected: Vec<(String, bool, bool)> = hosts.iter().filter_map(|(_, e)| e.clone()).collect();
            let got: Vec<(String, bool, bool)> = m
                .cluster(name)
                .unwrap()
                .iter()
                .map(|x| (x.address.clone(), x.usable, x.draining))
                .collect();
            prop_assert_eq!(got, expected);
        }
        prop_assert_eq!(Membership::decode(&m.encode()), Some(m));
    }

    #[test]
    fn cluster_set_decode_never_panics_and_accepts_only_what_encode_writes(b in bytes(120)) {
        if let Some(s) = ClusterSet::decode(&b) {
            prop_assert_eq!(s.encode(), b);
        }
    }

    #[test]
    fn admin_clusters_path_is_plain_ascii_and_decodes_back_to_the_names(
        names in prop::collection::vec(".{1,16}", 1..6),
    ) {
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let path = admin_clusters_path(&refs);
        let query = path.strip_prefix("/clusters?format=json&filter=").unwrap();
        prop_assert!(query.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~%".contains(&b)), "{query}");
        let regex = String::from_utf8(percent_decode(query)).unwrap();
        let inner = regex.strip_prefix("^(").and_then(|r| r.strip_suffix(")$")).unwrap();
        prop_assert_eq!(split_unescaped(inner), names);
    }

    // ---- instance identity -----------------------------------------------

    #[test]
    fn generated_instance_ids_are_valid_16_hex_digits(now in any::<u64>(), entropy in any::<u64>()) {
        let id = generate(now, entropy);
        prop_assert_eq!(id.len(), 16);
        prop_assert!(id.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        prop_assert!(is_valid(id.as_bytes()));
    }

    #[test]
    fn identity_round_trips(header in "[a-z0-9!#$%&'*+.^_`|~-]{1,40}", id in "[!-~]{1,128}") {
        let bytes = encode_identity(&header, &id);
        prop_assert_eq!(decode_identity(&bytes), Some((header, id)));
    }

    #[test]
    fn identity_decode_never_panics_and_accepts_only_what_encode_writes(b in bytes(160)) {
        if let Some((header, id)) = decode_identity(&b) {
            prop_assert_eq!(encode_identity(&header, &id), b);
            prop_assert!(is_valid(id.as_bytes()));
        }
    }

    #[test]
    fn instance_id_validity_is_printable_ascii_up_to_128(b in bytes(140)) {
        let expected = !b.is_empty() && b.len() <= 128 && b.iter().all(|c| (0x21..=0x7e).contains(c));
        prop_assert_eq!(is_valid(&b), expected);
    }
}

// Slower properties (thousands of inserts per case): fewer cases.
proptest! {
    #![proptest_config(config(32))]

    #[test]
    fn membership_keeps_the_newest_members_past_the_bound(extra in 1usize..20) {
        let mut m = Membership::default();
        let n = MAX_MEMBERS + extra;
        for h in 0..n {
            let address = format!("h{h}");
            prop_assert!(m.saw("svc", &address, SEEN_AT + h as u64 * 1_000_000));
        }
        let kept = m.cluster("svc").unwrap();
        prop_assert_eq!(kept.len(), MAX_MEMBERS);
        prop_assert_eq!(kept.first().map(|x| x.address.clone()), Some(format!("h{extra}")));
        prop_assert_eq!(kept.last().map(|x| x.address.clone()), Some(format!("h{}", n - 1)));
    }

    #[test]
    fn cluster_set_round_trips_and_refuses_duplicates_empty_and_overflow(
        names in prop::collection::vec(prop_oneof![3 => cluster_name(), 1 => Just(String::new()), 1 => (250usize..260).prop_map(|n| "n".repeat(n))], 0..80),
    ) {
        let mut set = ClusterSet::default();
        let mut model: Vec<String> = Vec::new();
        for n in &names {
            let fits = !n.is_empty() && n.len() <= 255 && model.len() < MAX_CLUSTERS && !model.contains(n);
            prop_assert_eq!(set.insert(n), fits, "{:?}", n);
            if fits {
                model.push(n.clone());
            }
        }
        prop_assert_eq!(set.names().map(str::to_string).collect::<Vec<_>>(), model);
        prop_assert_eq!(ClusterSet::decode(&set.encode()), Some(set));
    }

    #[test]
    fn membership_saw_bounds_clusters_and_members(
        clusters in 1usize..80,
        members in 1usize..40,
    ) {
        let mut m = Membership::default();
        for c in 0..clusters {
            for h in 0..members {
                m.saw(&format!("c{c}"), &format!("10.0.{}.{}:80", h / 256, h % 256), SEEN_AT);
            }
        }
        let known = (0..clusters).filter(|c| m.cluster(&format!("c{c}")).is_some()).count();
        prop_assert_eq!(known, clusters.min(MAX_CLUSTERS));
        prop_assert_eq!(Membership::decode(&m.encode()), Some(m));
    }
}

fn arbitrary_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        prop::sample::select(vec![
            "address",
            "socket_address",
            "port_value",
            "host_statuses",
            "cluster_statuses",
            "name",
            "svc",
            "127.0.0.1",
            "::1",
            "HEALTHY",
        ])
        .prop_map(|s| json!(s)),
        ".{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec(
                (
                    prop::sample::select(vec![
                        "cluster_statuses",
                        "name",
                        "host_statuses",
                        "address",
                        "socket_address",
                        "port_value",
                        "health_status",
                        "eds_health_status",
                        "failed_outlier_check",
                        "x",
                    ]),
                    inner
                ),
                0..6
            )
            .prop_map(|kv| Value::Object(
                kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
            )),
        ]
    })
}

fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
            out.push(u8::from_str_radix(hex, 16).unwrap());
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// Splits a regex alternation on unescaped `|` and removes the escapes.
fn split_unescaped(s: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.last_mut().unwrap().push(chars.next().unwrap()),
            '|' => out.push(String::new()),
            c => {
                assert!(
                    !"\\.^$|?*+()[]{}".contains(c),
                    "unescaped metacharacter {c:?} in {s:?}"
                );
                out.last_mut().unwrap().push(c)
            }
        }
    }
    out
}
