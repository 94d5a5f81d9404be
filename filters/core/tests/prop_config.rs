//! Property tests of the three plugin configurations: parsing never panics
//! on arbitrary bytes or on arbitrary JSON built from the real field names;
//! whatever parses satisfies the documented bounds; every valid typed
//! configuration written as JSON parses back to itself; and a bad value in
//! any single field is reported under that field's name.

// Test code: a panic is how a property fails (clippy's in-test allowances
// do not reach the strategy helpers outside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use graceful_core::consumer::config::{
    ConsumerConfig, FrontConfig, SlowStart, MAX_FRONT_MAX_WAITERS, MAX_HOSTS_CEILING,
    MAX_MAX_TOMBSTONES,
};
use graceful_core::drain::config::{
    CloseConnections, DrainConfig, OnDrained, Paths, MAX_MAX_WAITERS, MAX_ON_DRAINED_TIMEOUT,
};
use graceful_core::drain::record::GateTimings;
use graceful_core::provider::config::{LongLivedPath, ProviderConfig, MAX_LONG_LIVED_PATHS};
use graceful_core::shared::duration::{format_duration, MAX_DURATION};
use graceful_core::shared::net::Cidr;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

mod common;
use common::config;

const MAX_MS: u64 = 24 * 3600 * 1000;

fn ms(range: std::ops::RangeInclusive<u64>) -> impl Strategy<Value = Duration> {
    range.prop_map(Duration::from_millis)
}

/// A lower-case header token.
fn header() -> impl Strategy<Value = String> {
    "[a-z0-9!#$%&'*+.^_`|~-]{1,24}"
}

/// The same name with some letters upper-cased, as a user may write it.
fn recased(name: &str, mask: u64) -> String {
    name.chars()
        .enumerate()
        .map(|(i, c)| {
            if mask >> (i % 64) & 1 == 1 {
                c.to_ascii_uppercase()
            } else {
                c
            }
        })
        .collect()
}

fn cluster() -> impl Strategy<Value = String> {
    prop_oneof!["[ -~]{1,40}", "[a-zé_ü0-9]{1,12}"]
}

fn url_path() -> impl Strategy<Value = String> {
    "/[a-zA-Z0-9._~/!$&'()*+,;=:@%-]{0,30}"
}

fn cidr() -> impl Strategy<Value = Cidr> {
    prop_oneof![
        (any::<u32>(), 0u8..=32)
            .prop_map(|(ip, p)| format!("{}/{p}", std::net::Ipv4Addr::from(ip))),
        (any::<u128>(), 0u8..=128)
            .prop_map(|(ip, p)| format!("{}/{p}", std::net::Ipv6Addr::from(ip))),
    ]
    .prop_map(|s| s.parse().unwrap())
}

// ---- valid typed configurations and their JSON ---------------------------

fn provider() -> impl Strategy<Value = ProviderConfig> {
    (
        header(),
        prop::option::of(header()),
        prop::option::of("[!-~]{1,128}"),
        any::<bool>(),
        any::<bool>(),
        // A trailing `*` writes a prefix: no exact path ends in one.
        prop::collection::vec(
            (
                url_path().prop_filter("no trailing *", |p| !p.ends_with('*')),
                any::<bool>(),
            ),
            0..4,
        ),
        any::<bool>(),
        prop::option::of(header()),
    )
        .prop_filter("instance_header must differ", |(c, i, ..)| {
            i.as_ref() != Some(c)
        })
        .prop_map(
            |(
                closing_header,
                instance_header,
                instance_id,
                ihcf,
                reject,
                paths,
                upgrades,
                consumer,
            )| {
                ProviderConfig {
                    closing_header,
                    instance_header,
                    instance_id,
                    immediate_health_check_fail: ihcf,
                    reject_when_drained: reject,
                    long_lived_paths: paths
                        .into_iter()
                        .map(|(p, prefix)| {
                            if prefix {
                                LongLivedPath::Prefix(p)
                            } else {
                                LongLivedPath::Exact(p)
                            }
                        })
                        .collect(),
                    long_lived_upgrades: upgrades,
                    consumer_header: consumer,
                }
            },
        )
}

fn provider_json(c: &ProviderConfig, mask: u64) -> Value {
    json!({
        "closing_header": recased(&c.closing_header, mask),
        "instance_header": c.instance_header.as_deref().map_or(String::new(), |h| recased(h, !mask)),
        "instance_id": c.instance_id,
        "immediate_health_check_fail": c.immediate_health_check_fail,
        "reject_when_drained": c.reject_when_drained,
        "long_lived_paths": c.long_lived_paths.iter().map(|p| match p {
            LongLivedPath::Exact(p) => p.clone(),
            LongLivedPath::Prefix(p) => format!("{p}*"),
        }).collect::<Vec<_>>(),
        "long_lived_upgrades": c.long_lived_upgrades,
        "consumer_header": c.consumer_header.as_deref().map_or(String::new(), |h| recased(h, mask)),
    })
    .as_object()
    .map(|m| {
        // instance_id: absent means "derive one"; null is refused.
        let mut m = m.clone();
        if c.instance_id.is_none() {
            m.remove("instance_id");
        }
        Value::Object(m)
    })
    .unwrap()
}

fn drain() -> impl Strategy<Value = DrainConfig> {
    let gate = (
        ms(0..=MAX_MS),
        ms(0..=MAX_MS),
        ms(0..=MAX_MS),
        ms(0..=MAX_MS),
    )
        .prop_map(|(w, q, s, t)| GateTimings {
            consumer_update_wait: w.min(t),
            quiet_window: q,
            step_timeout: s,
            timeout: w.max(t),
            longest_request: None,
        });
    let on_drained = prop::option::of((cluster(), url_path(), ms(1..=60_000)).prop_map(
        |(cluster, path, timeout)| OnDrained {
            cluster,
            path,
            timeout,
        },
    ));
    let paths = prop::collection::vec(url_path(), 7)
        .prop_filter("paths must be distinct", |p| {
            (0..p.len()).all(|i| !p[..i].contains(&p[i]))
        })
        .prop_map(|p| Paths {
            closing: p[0].clone(),
            ready: p[1].clone(),
            status: p[2].clone(),
            drained: p[3].clone(),
            grpc_health: p[4].clone(),
            grpc_health_watch: p[5].clone(),
            report: p[6].clone(),
        });
    (
        gate,
        prop::collection::vec(cidr(), 0..4),
        prop::option::of(cluster()),
        on_drained,
        0..=MAX_MAX_WAITERS as u32,
        paths,
        prop::sample::select(vec![
            CloseConnections::HealthcheckFail,
            CloseConnections::DrainListeners,
            CloseConnections::Off,
        ]),
        1..=graceful_core::drain::report::peers::PEERS_KEPT as u32,
    )
        .prop_map(
            |(
                gate,
                allowed_sources,
                admin_cluster,
                on_drained,
                max_waiters,
                paths,
                close,
                peers,
            )| {
                // Closing connections goes through the admin.
                let close_connections = if admin_cluster.is_some() {
                    close
                } else {
                    CloseConnections::Off
                };
                DrainConfig {
                    gate,
                    allowed_sources,
                    admin_cluster,
                    on_drained,
                    max_waiters,
                    paths,
                    close_connections,
                    max_report_peers: peers,
                }
            },
        )
}

fn drain_json(c: &DrainConfig) -> Value {
    let mut v = json!({
        "consumer_update_wait": format_duration(c.gate.consumer_update_wait),
        "quiet_window": format_duration(c.gate.quiet_window),
        "step_timeout": format_duration(c.gate.step_timeout),
        "timeout": format_duration(c.gate.timeout),
        "allowed_sources": c.allowed_sources.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "max_waiters": c.max_waiters,
        "paths": {
            "closing": c.paths.closing,
            "ready": c.paths.ready,
            "status": c.paths.status,
            "drained": c.paths.drained,
            "grpc_health": c.paths.grpc_health,
            "grpc_health_watch": c.paths.grpc_health_watch,
            "report": c.paths.report,
        },
        "max_report_peers": c.max_report_peers,
    });
    if let Some(a) = &c.admin_cluster {
        v["admin_cluster"] = json!(a);
    }
    v["close_connections"] = json!(match c.close_connections {
        CloseConnections::HealthcheckFail => "healthcheck_fail",
        CloseConnections::DrainListeners => "drain_listeners",
        CloseConnections::Off => "off",
    });
    if let Some(cb) = &c.on_drained {
        v["on_drained"] =
            json!({"cluster": cb.cluster, "path": cb.path, "timeout": format_duration(cb.timeout)});
    }
    v
}

fn consumer() -> impl Strategy<Value = ConsumerConfig> {
    let configs = (
        prop::collection::vec(header(), 0..4).prop_map(|mut v| {
            let mut seen = Vec::new();
            v.retain(|h| {
                let new = !seen.contains(h);
                seen.push(h.clone());
                new
            });
            v
        }),
        prop::option::of(header()),
        ms(1..=MAX_MS),
        any::<bool>(),
        ms(1..=MAX_MS),
        header(),
        prop::option::of(cluster()),
        ms(100..=3_600_000),
        1..=MAX_MAX_TOMBSTONES as u32,
        prop::option::of(url_path()),
        0u8..=100,
        prop::option::of(header()),
    )
        .prop_filter(
            "override_host_header and consumer_header must differ",
            |(closing, instance, _, _, _, over, _, _, _, _, _, consumer)| {
                !closing.contains(over)
                    && instance.as_ref() != Some(over)
                    && consumer.as_ref().is_none_or(|c| {
                        c != over && !closing.contains(c) && instance.as_ref() != Some(c)
                    })
            },
        )
        .prop_map(
            |(
                closing_headers,
                instance_header,
                tombstone_ttl,
                evict_on_connect_failure,
                failure_tombstone_ttl,
                override_host_header,
                admin_cluster,
                membership_refresh,
                max_tombstones,
                probe_path,
                panic_threshold,
                consumer_header,
            )| ConsumerConfig {
                closing_headers,
                instance_header,
                tombstone_ttl,
                evict_on_connect_failure,
                failure_tombstone_ttl,
                override_host_header,
                admin_cluster,
                membership_refresh,
                max_tombstones,
                probe_path,
                panic_threshold,
                consumer_header,
                readmit_slow_start: None,
                front: None,
            },
        );
    (
        configs,
        prop::option::of(slow_start()),
        prop::option::of(front()),
    )
        .prop_map(|(c, readmit_slow_start, front)| ConsumerConfig {
            readmit_slow_start,
            // `front` requires `admin_cluster`.
            front: front.filter(|_| c.admin_cluster.is_some()),
            ..c
        })
}

fn front() -> impl Strategy<Value = FrontConfig> {
    (
        any::<bool>(),
        ms(1..=MAX_MS),
        ms(10..=10_000),
        1..=MAX_HOSTS_CEILING,
        0..=MAX_FRONT_MAX_WAITERS as u32,
    )
        .prop_map(
            |(serve_endpoints, closing_ttl, poll, max_hosts, max_waiters)| FrontConfig {
                serve_endpoints,
                closing_ttl,
                poll,
                max_hosts,
                max_waiters,
            },
        )
}

fn slow_start() -> impl Strategy<Value = SlowStart> {
    // Hundredths: each prints and reads back as the same f64.
    (ms(1..=MAX_MS), 1u32..=1000, 0u8..=100).prop_map(|(window, a, min)| SlowStart {
        window,
        aggression: f64::from(a) / 100.0,
        min_weight_percent: min,
    })
}

fn consumer_json(c: &ConsumerConfig, mask: u64) -> Value {
    let mut v = json!({
        "closing_headers": c.closing_headers.iter().map(|h| recased(h, mask)).collect::<Vec<_>>(),
        "instance_header": c.instance_header.as_deref().map_or(String::new(), |h| recased(h, mask)),
        "tombstone_ttl": format_duration(c.tombstone_ttl),
        "evict_on_connect_failure": c.evict_on_connect_failure,
        "failure_tombstone_ttl": format_duration(c.failure_tombstone_ttl),
        "override_host_header": recased(&c.override_host_header, !mask),
        "membership_refresh": format_duration(c.membership_refresh),
        "max_tombstones": c.max_tombstones,
        "probe_path": c.probe_path.clone().unwrap_or_default(),
        "panic_threshold": c.panic_threshold,
        "consumer_header": c.consumer_header.as_deref().map_or(String::new(), |h| recased(h, mask)),
    });
    if let Some(a) = &c.admin_cluster {
        v["admin_cluster"] = json!(a);
    }
    if let Some(ss) = &c.readmit_slow_start {
        v["readmit_slow_start"] = json!({
            "window": format_duration(ss.window),
            "aggression": ss.aggression,
            "min_weight_percent": ss.min_weight_percent,
        });
    }
    if let Some(f) = &c.front {
        v["front"] = json!({
            "serve_endpoints": f.serve_endpoints,
            "closing_ttl": format_duration(f.closing_ttl),
            "poll": format_duration(f.poll),
            "max_hosts": f.max_hosts,
            "max_waiters": f.max_waiters,
        });
    }
    v
}

// ---- arbitrary JSON over the real field names -----------------------------

#[derive(Clone, Copy, Debug)]
enum Kind {
    Header,
    Id,
    Bool,
    Duration,
    Cidrs,
    Cluster,
    OnDrained,
    Count,
    Paths,
    Headers,
    Path,
    CloseConnections,
    LongLivedPaths,
    SlowStart,
}

const PROVIDER_FIELDS: &[(&str, Kind)] = &[
    ("closing_header", Kind::Header),
    ("instance_header", Kind::Header),
    ("instance_id", Kind::Id),
    ("immediate_health_check_fail", Kind::Bool),
    ("reject_when_drained", Kind::Bool),
    ("long_lived_paths", Kind::LongLivedPaths),
    ("long_lived_upgrades", Kind::Bool),
    ("consumer_header", Kind::Header),
];

const DRAIN_FIELDS: &[(&str, Kind)] = &[
    ("consumer_update_wait", Kind::Duration),
    ("quiet_window", Kind::Duration),
    ("step_timeout", Kind::Duration),
    ("timeout", Kind::Duration),
    ("allowed_sources", Kind::Cidrs),
    ("admin_cluster", Kind::Cluster),
    ("on_drained", Kind::OnDrained),
    ("max_waiters", Kind::Count),
    ("paths", Kind::Paths),
    ("close_connections", Kind::CloseConnections),
    ("max_report_peers", Kind::Count),
];

const CONSUMER_FIELDS: &[(&str, Kind)] = &[
    ("closing_headers", Kind::Headers),
    ("instance_header", Kind::Header),
    ("tombstone_ttl", Kind::Duration),
    ("evict_on_connect_failure", Kind::Bool),
    ("failure_tombstone_ttl", Kind::Duration),
    ("override_host_header", Kind::Header),
    ("admin_cluster", Kind::Cluster),
    ("membership_refresh", Kind::Duration),
    ("max_tombstones", Kind::Count),
    ("probe_path", Kind::Path),
    ("panic_threshold", Kind::Count),
    ("consumer_header", Kind::Header),
    ("readmit_slow_start", Kind::SlowStart),
];

/// Any JSON value, weighted towards strings that mean something here.
fn junk() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        prop::sample::select(vec![
            "",
            "0s",
            "5",
            "25h",
            "bad header",
            ":path",
            "relative",
            "/a?b",
            "10.0.0.0/33",
            "with\ncontrol",
            "é",
        ])
        .prop_map(|s| json!(s)),
        "[ -~]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            prop::collection::vec(("[a-z_]{1,8}", inner), 0..3)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

fn duration_text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => ms(0..=MAX_MS).prop_map(format_duration),
        2 => (0u64..5000, prop::sample::select(vec!["ms", "s", "m"])).prop_map(|(n, u)| format!("{n}{u}")),
        1 => (0u64..100, 0u64..1000).prop_map(|(a, b)| format!("{a}.{b}s")),
        1 => "[0-9.]{0,4}(ms|s|m|h|d|)",
    ]
}

/// An `on_drained` object: a cluster, and now and then a path and a timeout.
fn on_drained_json() -> impl Strategy<Value = Value> {
    (
        cluster(),
        prop::option::of(url_path()),
        prop::option::of(prop_oneof![
            ms(0..=70_000).prop_map(format_duration),
            duration_text()
        ]),
    )
        .prop_map(|(cluster, path, timeout)| {
            let mut m = Map::new();
            m.insert("cluster".into(), json!(cluster));
            if let Some(p) = path {
                m.insert("path".into(), json!(p));
            }
            if let Some(t) = timeout {
                m.insert("timeout".into(), json!(t));
            }
            Value::Object(m)
        })
}

/// A `readmit_slow_start` object: a window, and now and then an aggression
/// and a least weight.
fn slow_start_json() -> impl Strategy<Value = Value> {
    (
        duration_text(),
        prop::option::of(prop_oneof![-2.0f64..4.0, any::<f64>()]),
        prop::option::of(prop_oneof![0u64..=120, any::<u64>()]),
    )
        .prop_map(|(window, aggression, min)| {
            let mut m = Map::new();
            m.insert("window".into(), json!(window));
            if let Some(a) = aggression {
                m.insert("aggression".into(), json!(a));
            }
            if let Some(p) = min {
                m.insert("min_weight_percent".into(), json!(p));
            }
            Value::Object(m)
        })
}

/// A value for a field of `kind`: mostly well-typed and often valid, so
/// that whole documents parse and the checks after parsing run too.
fn field_value(kind: Kind) -> BoxedStrategy<Value> {
    let typed: BoxedStrategy<Value> = match kind {
        Kind::Header => prop_oneof![
            6 => (header(), any::<u64>()).prop_map(|(h, m)| json!(recased(&h, m))),
            1 => Just(json!("")),
            1 => "[ -~]{1,10}".prop_map(Value::String),
        ]
        .boxed(),
        Kind::Id => "[ -~]{0,130}".prop_map(Value::String).boxed(),
        Kind::Bool => any::<bool>().prop_map(Value::Bool).boxed(),
        Kind::Duration => duration_text().prop_map(Value::String).boxed(),
        Kind::Cidrs => prop::collection::vec(
            prop_oneof![
                4 => cidr().prop_map(|c| c.to_string()),
                1 => "[0-9a-f.:/]{0,12}",
            ],
            0..4,
        )
        .prop_map(|v| json!(v))
        .boxed(),
        Kind::Cluster => cluster().prop_map(Value::String).boxed(),
        Kind::CloseConnections => prop_oneof![
            prop::sample::select(vec!["healthcheck_fail", "drain_listeners", "off"])
                .prop_map(|m| json!(m)),
            "[ -~]{0,8}".prop_map(|m| json!(m)),
            Just(json!(true)),
        ]
        .boxed(),
        Kind::OnDrained => on_drained_json().boxed(),
        Kind::SlowStart => slow_start_json().boxed(),
        Kind::Count => prop_oneof![0u64..=70_000, any::<u64>()]
            .prop_map(|n| json!(n))
            .boxed(),
        Kind::Paths => prop::collection::vec(
            (
                prop::sample::select(vec![
                    "closing",
                    "ready",
                    "status",
                    "drained",
                    "grpc_health",
                    "grpc_health_watch",
                    "report",
                ]),
                prop_oneof![
                    4 => url_path(),
                    1 => Just("/graceful/ready".to_string()),
                    1 => "[ -~]{0,8}",
                ],
            ),
            0..5,
        )
        .prop_map(|kv| {
            Value::Object(
                kv.into_iter()
                    .map(|(k, v)| (k.to_string(), json!(v)))
                    .collect(),
            )
        })
        .boxed(),
        Kind::LongLivedPaths => prop::collection::vec(
            prop_oneof![
                4 => url_path(),
                2 => url_path().prop_map(|p| format!("{p}*")),
                1 => "[ -~]{0,8}",
            ],
            0..4,
        )
        .prop_map(|v| json!(v))
        .boxed(),
        Kind::Headers => prop::collection::vec(
            prop_oneof![
                6 => (header(), any::<u64>()).prop_map(|(h, m)| recased(&h, m)),
                1 => Just("x-graceful-override-host".to_string()),
                1 => "[ -~]{0,6}",
            ],
            0..4,
        )
        .prop_map(|v| json!(v))
        .boxed(),
        Kind::Path => prop_oneof![4 => url_path(), 1 => Just(String::new()), 1 => "[ -~]{0,8}"]
            .prop_map(Value::String)
            .boxed(),
    };
    prop_oneof![9 => typed, 1 => junk()].boxed()
}

/// A document holding a random subset of `fields`, and now and then a
/// field that does not exist.
fn document(fields: &'static [(&'static str, Kind)]) -> impl Strategy<Value = Value> {
    let per_field: Vec<BoxedStrategy<Option<(String, Value)>>> = fields
        .iter()
        .map(|&(name, kind)| {
            prop::option::weighted(
                0.5,
                field_value(kind).prop_map(move |v| (name.to_string(), v)),
            )
            .boxed()
        })
        .collect();
    (
        per_field,
        prop::option::weighted(0.05, (r"[a-z_\n\t\x07]{1,10}", junk())),
    )
        .prop_map(|(present, unknown)| {
            let mut m: Map<String, Value> = present.into_iter().flatten().collect();
            if let Some((k, v)) = unknown {
                m.insert(k, v);
            }
            Value::Object(m)
        })
}

fn is_lower_token(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 256
        && h.bytes().all(|b| {
            b.is_ascii_digit() || b.is_ascii_lowercase() || b"!#$%&'*+-.^_`|~".contains(&b)
        })
}

fn check_provider(c: &ProviderConfig) -> Result<(), TestCaseError> {
    prop_assert!(is_lower_token(&c.closing_header));
    if let Some(h) = &c.instance_header {
        prop_assert!(is_lower_token(h));
        prop_assert_ne!(h, &c.closing_header);
    }
    if let Some(id) = &c.instance_id {
        prop_assert!(graceful_core::shared::instance::is_valid(id.as_bytes()));
    }
    prop_assert!(c.long_lived_paths.len() <= MAX_LONG_LIVED_PATHS);
    for p in &c.long_lived_paths {
        let (LongLivedPath::Exact(p) | LongLivedPath::Prefix(p)) = p;
        prop_assert!(p.starts_with('/') && !p.contains('?'), "{p}");
    }
    Ok(())
}

fn check_drain(c: &DrainConfig) -> Result<(), TestCaseError> {
    let g = &c.gate;
    for d in [
        g.consumer_update_wait,
        g.quiet_window,
        g.step_timeout,
        g.timeout,
    ] {
        prop_assert!(d <= MAX_DURATION);
    }
    prop_assert!(g.timeout >= g.consumer_update_wait);
    prop_assert!(u64::from(c.max_waiters) <= MAX_MAX_WAITERS);
    let p = &c.paths;
    let all: Vec<&String> = p.named().iter().map(|(_, path)| *path).collect();
    for (i, path) in all.iter().enumerate() {
        prop_assert!(path.starts_with('/'));
        prop_assert!(!path.contains('?') && !path.contains('#'));
        prop_assert!(!all[..i].contains(path), "{path} twice");
    }
    if let Some(cb) = &c.on_drained {
        prop_assert!(!cb.timeout.is_zero() && cb.timeout <= MAX_ON_DRAINED_TIMEOUT);
        prop_assert!(!cb.cluster.is_empty() && cb.path.starts_with('/'));
    }
    if let Some(a) = &c.admin_cluster {
        prop_assert!(!a.is_empty() && !a.chars().any(char::is_control));
    }
    prop_assert!(
        c.close_connections == CloseConnections::Off || c.admin_cluster.is_some(),
        "connections are closed through the admin"
    );
    Ok(())
}

fn check_consumer(c: &ConsumerConfig) -> Result<(), TestCaseError> {
    for (i, h) in c.closing_headers.iter().enumerate() {
        prop_assert!(is_lower_token(h));
        prop_assert!(!c.closing_headers[..i].contains(h), "{h} twice");
    }
    prop_assert!(is_lower_token(&c.override_host_header));
    prop_assert!(!c.closing_headers.contains(&c.override_host_header));
    prop_assert!(c.instance_header.as_ref() != Some(&c.override_host_header));
    prop_assert!(!c.tombstone_ttl.is_zero() && !c.failure_tombstone_ttl.is_zero());
    prop_assert!(
        c.membership_refresh >= Duration::from_millis(100)
            && c.membership_refresh <= Duration::from_secs(3600)
    );
    prop_assert!(c.max_tombstones >= 1 && u64::from(c.max_tombstones) <= MAX_MAX_TOMBSTONES);
    Ok(())
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn configs_never_panic_on_arbitrary_bytes(b in prop::collection::vec(any::<u8>(), 0..128)) {
        let _ = ProviderConfig::from_json(&b);
        let _ = DrainConfig::from_json(&b);
        let _ = ConsumerConfig::from_json(&b);
    }

    #[test]
    fn configs_never_panic_on_json_like_text(text in "[{}\\[\\]\":, a-z0-9_./-]{0,80}") {
        let _ = ProviderConfig::from_json(text.as_bytes());
        let _ = DrainConfig::from_json(text.as_bytes());
        let _ = ConsumerConfig::from_json(text.as_bytes());
    }

    #[test]
    fn a_provider_config_that_parses_is_within_the_documented_bounds(v in document(PROVIDER_FIELDS)) {
        let r = ProviderConfig::from_json(&serde_json::to_vec(&v).unwrap());
        match r {
            Ok(c) => check_provider(&c)?,
            Err(e) => check_error_names_a_key(&e, &v)?,
        }
    }

    #[test]
    fn a_drain_config_that_parses_is_within_the_documented_bounds(v in document(DRAIN_FIELDS)) {
        match DrainConfig::from_json(&serde_json::to_vec(&v).unwrap()) {
            Ok(c) => check_drain(&c)?,
            Err(e) => check_error_names_a_key(&e, &v)?,
        }
    }

    #[test]
    fn a_consumer_config_that_parses_is_within_the_documented_bounds(v in document(CONSUMER_FIELDS)) {
        match ConsumerConfig::from_json(&serde_json::to_vec(&v).unwrap()) {
            Ok(c) => check_consumer(&c)?,
            Err(e) => check_error_names_a_key(&e, &v)?,
        }
    }

    #[test]
    fn whitespace_only_configuration_means_defaults(ws in "[ \t\r\n]{0,8}") {
        prop_assert_eq!(ProviderConfig::from_json(ws.as_bytes()), ProviderConfig::from_json(b"{}"));
        prop_assert_eq!(DrainConfig::from_json(ws.as_bytes()), DrainConfig::from_json(b"{}"));
        prop_assert_eq!(ConsumerConfig::from_json(ws.as_bytes()), ConsumerConfig::from_json(b"{}"));
    }

    #[test]
    fn provider_config_written_as_json_parses_back_to_itself(c in provider(), mask in any::<u64>()) {
        let json = serde_json::to_vec(&provider_json(&c, mask)).unwrap();
        prop_assert_eq!(ProviderConfig::from_json(&json), Ok(c));
    }

    #[test]
    fn drain_config_written_as_json_parses_back_to_itself(c in drain()) {
        let json = serde_json::to_vec(&drain_json(&c)).unwrap();
        prop_assert_eq!(DrainConfig::from_json(&json), Ok(c));
    }

    #[test]
    fn consumer_config_written_as_json_parses_back_to_itself(c in consumer(), mask in any::<u64>()) {
        let json = serde_json::to_vec(&consumer_json(&c, mask)).unwrap();
        prop_assert_eq!(ConsumerConfig::from_json(&json), Ok(c));
    }

    #[test]
    fn a_bad_provider_field_is_reported_under_its_name(
        c in provider(),
        which in 0usize..5,
        bad in prop::sample::select(vec![json!("bad header"), json!(7), json!(null), json!([]), json!("")]),
    ) {
        let mut v = provider_json(&c, 0);
        let field = ["closing_header", "instance_header", "instance_id", "immediate_health_check_fail", "reject_when_drained"][which];
        // "" is a valid instance_header (off); a string is a valid nothing else here.
        prop_assume!(!(field == "instance_header" && bad == json!("")));
        v[field] = bad;
        let err = ProviderConfig::from_json(&serde_json::to_vec(&v).unwrap()).unwrap_err();
        prop_assert_eq!(err.field.as_str(), field, "{}", err);
    }

    #[test]
    fn a_bad_drain_field_is_reported_under_its_name(c in drain(), which in 0usize..10, kind in 0usize..3) {
        let mut v = drain_json(&c);
        let (field, bad) = match which {
            0 => ("consumer_update_wait", [json!("5"), json!(5), json!("25h")][kind].clone()),
            1 => ("quiet_window", [json!("1 s"), json!(null), json!("-1s")][kind].clone()),
            2 => ("step_timeout", [json!("s"), json!(true), json!("1d")][kind].clone()),
            3 => ("max_waiters", [json!(MAX_MAX_WAITERS + 1), json!(-1), json!("64")][kind].clone()),
            4 => ("admin_cluster", [json!(""), json!("a\u{7}b"), json!(1)][kind].clone()),
            5 => {
                v["paths"]["ready"] = [json!("ready"), json!("/a b"), json!("/q?x")][kind].clone();
                ("paths.ready", Value::Null)
            }
            6 => {
                let n = c.allowed_sources.len();
                let mut list: Vec<Value> = c.allowed_sources.iter().map(|s| json!(s.to_string())).collect();
                list.push([json!("10.0.0.0/33"), json!("localhost"), json!(8)][kind].clone());
                v["allowed_sources"] = Value::Array(list);
                return check_field(DrainConfig::from_json(&serde_json::to_vec(&v).unwrap()).err(), &format!("allowed_sources[{n}]"));
            }
            7 => {
                v["on_drained"] = json!({"cluster": "app", "timeout": (["0s", "61s", "x"][kind])});
                ("on_drained.timeout", Value::Null)
            }
            8 => {
                if kind == 0 {
                    // Named without the admin it goes through.
                    v.as_object_mut().unwrap().remove("admin_cluster");
                    ("close_connections", json!("healthcheck_fail"))
                } else {
                    ("close_connections", [json!(""), json!("on"), json!(true)][kind].clone())
                }
            }
            _ => {
                v["paths"]["drained"] = v["paths"]["closing"].clone();
                ("paths.drained", Value::Null)
            }
        };
        if !bad.is_null() || which == 1 {
            v[field] = bad;
        }
        check_field(DrainConfig::from_json(&serde_json::to_vec(&v).unwrap()).err(), field)?;
    }

    #[test]
    fn a_bad_consumer_field_is_reported_under_its_name(c in consumer(), which in 0usize..8, kind in 0usize..2) {
        let mut v = consumer_json(&c, 0);
        let (field, bad) = match which {
            0 => ("tombstone_ttl", [json!("0s"), json!("30")][kind].clone()),
            1 => ("failure_tombstone_ttl", [json!("0ms"), json!(5)][kind].clone()),
            2 => ("membership_refresh", [json!("99ms"), json!("2h")][kind].clone()),
            3 => ("max_tombstones", [json!(0), json!(MAX_MAX_TOMBSTONES + 1)][kind].clone()),
            4 => ("override_host_header", [json!(""), json!("a:b")][kind].clone()),
            5 => ("probe_path", [json!("ready"), json!("/a#b")][kind].clone()),
            6 => ("panic_threshold", [json!(101), json!("50")][kind].clone()),
            _ => {
                let n = c.closing_headers.len();
                let mut list: Vec<Value> = c.closing_headers.iter().map(|h| json!(h)).collect();
                list.push([json!("x y"), json!(":status")][kind].clone());
                v["closing_headers"] = Value::Array(list);
                return check_field(ConsumerConfig::from_json(&serde_json::to_vec(&v).unwrap()).err(), &format!("closing_headers[{n}]"));
            }
        };
        v[field] = bad;
        check_field(ConsumerConfig::from_json(&serde_json::to_vec(&v).unwrap()).err(), field)?;
    }
}

/// Every error names a field of the document (or none, for the document
/// as a whole) and reads as one line.
fn check_error_names_a_key(
    err: &graceful_core::shared::config::ConfigError,
    doc: &Value,
) -> Result<(), TestCaseError> {
    let top = err.field.split(['.', '[']).next().unwrap_or_default();
    // A rule between two fields names the one it constrains, which may be
    // left at its default while the other one is written.
    let partners: &[&str] = match top {
        "timeout" => &["consumer_update_wait"],
        "instance_header" => &["closing_header"],
        "override_host_header" => &["closing_headers", "instance_header"],
        _ => &[],
    };
    prop_assert!(
        err.field.is_empty()
            || doc.get(top).is_some()
            || partners.iter().any(|p| doc.get(p).is_some()),
        "error names {:?}, not a key of {}: {}",
        err.field,
        doc,
        err
    );
    prop_assert!(err.to_string().starts_with("invalid configuration: "));
    prop_assert!(!err.to_string().contains('\n'), "{}", err);
    Ok(())
}

fn check_field(
    err: Option<graceful_core::shared::config::ConfigError>,
    field: &str,
) -> Result<(), TestCaseError> {
    let Some(err) = err else {
        return Err(TestCaseError::fail(format!("accepted with a bad {field}")));
    };
    prop_assert_eq!(err.field.as_str(), field, "{}", err);
    prop_assert!(
        err.to_string().contains(&format!("field \"{field}\"")),
        "{}",
        err
    );
    Ok(())
}
