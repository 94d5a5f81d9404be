//! Malformed input to the real `.wasm` files: huge, empty, non-UTF-8 and
//! duplicated headers and trailers, odd properties, garbage `/clusters`
//! and other HTTP-call answers, garbage in every shared-data key. The
//! filters must not trap (any trap fails the test at once, a Rust panic
//! inside the module included) and the in-flight counts must come back to
//! where they were.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Duration;

use graceful_core::consumer::tombstone::Tombstones;
use graceful_core::drain::record;
use graceful_core::shared::keys::{self, Owner};
use graceful_emulated_host::{CallAnswer, Filter, Host, Level, StreamId, Vm};

type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

fn pairs(list: &[(&[u8], &[u8])]) -> Pairs {
    list.iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect()
}

const DRAIN: &str = r#"{"consumer_update_wait":"1s","quiet_window":"100ms","step_timeout":"1s","timeout":"3s","admin_cluster":"envoy_admin"}"#;
const CONSUMER: &str =
    r#"{"tombstone_ttl":"30s","admin_cluster":"envoy_admin","membership_refresh":"1s"}"#;

/// A whole sidecar process: drain + provider inbound, consumer outbound,
/// on the main thread and two workers.
struct Proc {
    host: Host,
    inbound: [[Vm; 2]; 2],
    outbound: [Vm; 2],
}

fn process() -> Proc {
    process_with(|_| {})
}

/// `before` runs before any VM copy starts (to plant shared data).
fn process_with(before: impl FnOnce(&mut Host)) -> Proc {
    let mut host = Host::new();
    before(&mut host);
    host.add_cluster("providers");
    host.respond("envoy_admin", |call| {
        Some(if call.path() == "/ready" {
            CallAnswer::new(200, &[("content-type", "text/plain")], "LIVE\n")
        } else {
            CallAnswer::new(200, &[("content-type", "application/json")], ADMIN_JSON)
        })
    });
    host.start_vm(Filter::Drain, DRAIN);
    host.start_vm(Filter::Provider, "");
    host.start_vm(Filter::Consumer, CONSUMER);
    let mut inbound = Vec::new();
    let mut outbound = Vec::new();
    for _ in 0..2 {
        let d = host.start_vm(Filter::Drain, DRAIN);
        let p = host.start_vm(Filter::Provider, "");
        inbound.push([d, p]);
        outbound.push(host.start_vm(Filter::Consumer, CONSUMER));
    }
    Proc {
        host,
        inbound: [inbound[0], inbound[1]],
        outbound: [outbound[0], outbound[1]],
    }
}

const ADMIN_JSON: &str = r#"{"cluster_statuses":[{"name":"providers","host_statuses":[
    {"address":{"socket_address":{"address":"10.0.0.1","port_value":8080}}},
    {"address":{"socket_address":{"address":"10.0.0.2","port_value":8080}}}]}]}"#;

/// In-flight counts in shared data and gauges, all zero; no VM copy lost.
fn assert_counts_zero(p: &Proc, case: &str) {
    let h = &p.host;
    let inbound = h.metric("graceful_provider_inflight") as u64;
    let outbound = h.metric("graceful_consumer_inflight") as u64;
    // (Both counts are Envoy stats, moved by every request.)
    assert_eq!((inbound, outbound), (0, 0), "{case}: in-flight counts");
    let panics: Vec<_> = h
        .logs()
        .into_iter()
        .filter(|l| l.level == Level::Critical)
        .collect();
    assert!(panics.is_empty(), "{case}: {panics:?}");
}

/// A request with these exact headers through an inbound chain; answered
/// by the app if it gets there; the stream ends.
fn inbound(p: &mut Proc, worker: usize, headers: &Pairs) -> StreamId {
    let s = p.host.stream_through(&p.inbound[worker]);
    p.host.request_headers(s, headers, true);
    if p.host.reached_upstream(s) {
        p.host
            .response_headers(s, &[(":status", "200"), ("content-length", "0")], true);
    }
    p.host.log(s);
    s
}

fn huge(n: usize) -> Vec<u8> {
    (0..n).map(|i| b'a' + (i % 26) as u8).collect()
}

fn request_header_cases() -> Vec<(&'static str, Pairs)> {
    let many: Pairs = (0..5000)
        .map(|i| (format!("x-h-{i}").into_bytes(), b"v".to_vec()))
        .chain([
            (b":method".to_vec(), b"GET".to_vec()),
            (b":path".to_vec(), b"/".to_vec()),
        ])
        .collect();
    let mut long_path = b"/graceful/status?".to_vec();
    long_path.extend(huge(1 << 20));
    vec![
        ("no headers at all", vec![]),
        (
            "empty names and values",
            pairs(&[(b"", b""), (b":method", b""), (b":path", b"")]),
        ),
        ("5000 headers", many),
        (
            "1 MiB path",
            vec![
                (b":method".to_vec(), b"GET".to_vec()),
                (b":path".to_vec(), long_path),
            ],
        ),
        (
            "1 MiB header value",
            vec![
                (b":method".to_vec(), b"GET".to_vec()),
                (b":path".to_vec(), b"/".to_vec()),
                (b"x-graceful-override-host".to_vec(), huge(1 << 20)),
            ],
        ),
        (
            "non-UTF-8 path",
            pairs(&[(b":method", b"GET"), (b":path", b"/graceful/\xff\xfe")]),
        ),
        (
            "non-UTF-8 method",
            pairs(&[(b":method", b"G\xe9T"), (b":path", b"/graceful/ready")]),
        ),
        (
            "non-UTF-8 name",
            pairs(&[(b":method", b"GET"), (b":path", b"/"), (b"x-\xff", b"\xff")]),
        ),
        (
            "duplicated method and path",
            pairs(&[
                (b":method", b"GET"),
                (b":method", b"POST"),
                (b":path", b"/graceful/ready"),
                (b":path", b"/graceful/closing"),
            ]),
        ),
        (
            "wait not UTF-8",
            pairs(&[
                (b":method", b"GET"),
                (b":path", b"/graceful/drained?wait=\xff"),
            ]),
        ),
        (
            "wait huge number",
            pairs(&[
                (b":method", b"GET"),
                (
                    b":path",
                    b"/graceful/drained?wait=99999999999999999999999999h",
                ),
            ]),
        ),
        (
            "wait negative",
            pairs(&[
                (b":method", b"GET"),
                (b":path", b"/graceful/drained?wait=-1s"),
            ]),
        ),
        (
            "wait twice",
            pairs(&[
                (b":method", b"GET"),
                (b":path", b"/graceful/drained?wait=1ms&wait=0s&wait="),
            ]),
        ),
        (
            "query only",
            pairs(&[(b":method", b"GET"), (b":path", b"?")]),
        ),
        (
            "closing with garbage forwarded-for",
            pairs(&[
                (b":method", b"POST"),
                (b":path", b"/graceful/closing"),
                (b"x-forwarded-for", b"\xff, ,,:::, 127.0.0.1:40001"),
            ]),
        ),
        (
            "gRPC health without content-type",
            pairs(&[
                (b":method", b"POST"),
                (b":path", b"/grpc.health.v1.Health/Check"),
            ]),
        ),
        (
            "gRPC content-type garbage",
            pairs(&[
                (b":method", b"POST"),
                (b":path", b"/x"),
                (b"content-type", b"application/grpc\xff\x00"),
            ]),
        ),
    ]
}

#[test]
fn it_survives_malformed_request_headers() {
    let mut p = process();
    for (i, (case, headers)) in request_header_cases().into_iter().enumerate() {
        inbound(&mut p, i % 2, &headers);
        // Outbound too: the consumer reads its own headers and the cluster.
        let s = p.host.stream(p.outbound[i % 2]);
        p.host.set_cluster(s, "providers");
        p.host.request_headers(s, &headers, true);
        assert!(
            p.host
                .request_headers_map(s)
                .get("x-graceful-override-host")
                .is_none(),
            "{case}: the client's override header is always removed"
        );
        p.host.set_upstream(s, "10.0.0.1:8080");
        p.host.response_headers(s, &[(":status", "200")], true);
        p.host.log(s);
        assert_counts_zero(&p, case);
    }
}

#[test]
fn it_survives_odd_stream_properties() {
    let mut p = process();
    let odd: Vec<&[u8]> = vec![
        b"",
        b"\xff\xfe",
        b"not-an-address",
        b"1.2.3.4",
        b"[::1]",
        b"::1",
        b"1.2.3.4:99999",
        b"127.0.0.1:0",
        b"127.0.0.1:80\0",
    ];
    let big = huge(10_000);
    for value in odd.iter().copied().chain([big.as_slice()]) {
        let case = format!(
            "property value {:?}",
            String::from_utf8_lossy(&value[..value.len().min(20)])
        );
        // Drain reads source and destination addresses.
        let s = p.host.stream_through(&p.inbound[0]);
        p.host.set_property(s, "source.address", value);
        p.host.set_property(s, "destination.address", value);
        p.host.request_headers(
            s,
            &[(":method", "POST"), (":path", "/graceful/closing")],
            true,
        );
        assert_eq!(p.host.local_reply(s).unwrap().status, 403, "{case}");
        p.host.log(s);
        let s = p.host.stream_through(&p.inbound[1]);
        p.host.set_property(s, "destination.address", value);
        p.host
            .request_headers(s, &[(":method", "GET"), (":path", "/graceful/ready")], true);
        assert_eq!(p.host.response(s).status(), 200, "{case}");
        p.host.log(s);
        // Consumer reads the cluster, the upstream address and the flags.
        for flags in [
            value.to_vec(),
            vec![0x20, 0, 0],
            vec![0xff; 8],
            vec![0x20; 16],
        ] {
            let s = p.host.stream(p.outbound[0]);
            p.host.set_property(s, "xds.cluster_name", value);
            p.host
                .request_headers(s, &[(":method", "GET"), (":path", "/")], true);
            p.host.set_property(s, "upstream.address", value);
            p.host.set_property(s, "response.flags", flags);
            p.host.response_headers(
                s,
                &[(":status", "503"), ("x-graceful-closing", "true")],
                true,
            );
            p.host.log(s);
        }
        assert_counts_zero(&p, &case);
    }
    assert_eq!(
        p.host.with_store(|s| record::read(s).unwrap()).phase,
        record::Phase::Serving,
        "no odd source address was trusted"
    );
    assert_bounded_tombstones(&p);
}

/// The tombstone list decodes and stays small whatever the input.
fn assert_bounded_tombstones(p: &Proc) {
    if let Some(bytes) = p
        .host
        .shared_data(graceful_core::shared::keys::TOMBSTONES.name)
    {
        let list = Tombstones::decode(&bytes).expect("tombstones decode");
        for t in list.entries() {
            assert!(t.address.len() <= 64 && t.instance.len() <= 128 && t.cluster.len() <= 255);
        }
        assert!(bytes.len() < 8 * 1024, "{} bytes", bytes.len());
    }
}

fn response_cases() -> Vec<(&'static str, Pairs, Option<Pairs>)> {
    let status = |extra: &[(&[u8], &[u8])]| {
        let mut v = pairs(&[(b":status", b"200")]);
        v.extend(pairs(extra));
        v
    };
    let many_trailers: Pairs = (0..5000)
        .map(|i| (format!("t-{i}").into_bytes(), huge(10)))
        .collect();
    vec![
        (
            "closing empty",
            status(&[(b"x-graceful-closing", b"")]),
            None,
        ),
        (
            "closing not UTF-8",
            status(&[(b"x-graceful-closing", b"tru\xff")]),
            None,
        ),
        (
            "closing huge",
            vec![
                (b":status".to_vec(), b"200".to_vec()),
                (b"closing".to_vec(), huge(1 << 20)),
            ],
            None,
        ),
        (
            "closing false then true",
            status(&[
                (b"x-graceful-closing", b"false"),
                (b"x-graceful-closing", b"true"),
            ]),
            None,
        ),
        (
            "instance huge",
            vec![
                (b":status".to_vec(), b"200".to_vec()),
                (b"x-graceful-instance".to_vec(), huge(100_000)),
                (b"x-graceful-closing".to_vec(), b"true".to_vec()),
            ],
            None,
        ),
        (
            "instance not UTF-8",
            status(&[
                (b"x-graceful-instance", b"\xff\xfe"),
                (b"closing", b" TRUE "),
            ]),
            None,
        ),
        (
            "status garbage",
            pairs(&[(b":status", b"\xff5\x000")]),
            None,
        ),
        ("no status", vec![], None),
        (
            "5000 trailers",
            status(&[(b"content-type", b"application/grpc")]),
            Some(many_trailers),
        ),
        (
            "trailers not UTF-8",
            status(&[(b"content-type", b"application/grpc")]),
            Some(pairs(&[
                (b"grpc-status", b"\xff"),
                (b"x-graceful-closing", b"\xfftrue"),
                (b"\xff", b""),
            ])),
        ),
        (
            "duplicated trailers",
            status(&[(b"content-type", b"application/grpc")]),
            Some(pairs(&[
                (b"grpc-status", b"0"),
                (b"grpc-status", b"13"),
                (b"x-graceful-closing", b"true"),
                (b"x-graceful-closing", b"true"),
            ])),
        ),
        (
            "empty trailers",
            status(&[(b"content-type", b"application/grpc")]),
            Some(vec![]),
        ),
    ]
}

#[test]
fn it_survives_malformed_response_headers_and_trailers() {
    let mut p = process();
    // Closing, so that the provider writes its marks everywhere it can.
    let s = p.host.stream_through(&p.inbound[0]);
    p.host.request_headers(
        s,
        &[(":method", "POST"), (":path", "/graceful/closing")],
        true,
    );
    p.host.log(s);
    for (i, (case, headers, trailers)) in response_cases().into_iter().enumerate() {
        // Inbound: the app's response through provider and drain.
        let s = p.host.stream_through(&p.inbound[i % 2]);
        p.host
            .request_headers(s, &[(":method", "GET"), (":path", "/app")], true);
        let eos = trailers.is_none();
        p.host.response_headers(s, &headers, eos);
        if let Some(t) = &trailers {
            p.host.response_body(s, b"\0\0\0\0\0", false);
            p.host.response_trailers(s, t);
            assert_eq!(
                p.host
                    .response(s)
                    .trailers
                    .unwrap()
                    .get_all("x-graceful-closing")[0],
                b"true",
                "{case}: the mark replaces the first entry"
            );
        }
        assert_eq!(
            p.host.response_header(s, "x-graceful-closing").as_deref(),
            Some("true"),
            "{case}"
        );
        p.host.log(s);
        // Outbound: the same from a provider, seen by the consumer.
        let s = p.host.stream(p.outbound[i % 2]);
        p.host.set_cluster(s, "providers");
        p.host
            .request_headers(s, &[(":method", "GET"), (":path", "/")], true);
        p.host.set_upstream(s, &format!("10.1.0.{i}:8080"));
        p.host.response_headers(s, &headers, eos);
        if let Some(t) = &trailers {
            p.host.response_body(s, b"\0\0\0\0\0", false);
            p.host.response_trailers(s, t);
        }
        p.host.log(s);
        assert_counts_zero(&p, case);
    }
    assert_bounded_tombstones(&p);
    // Envoy returns the first of duplicated headers: "false, true" is not
    // a closing mark; the huge, untrimmed and non-UTF-8 ones are not either.
    let evicted: Vec<String> = Tombstones::decode(
        &p.host
            .shared_data(graceful_core::shared::keys::TOMBSTONES.name)
            .unwrap(),
    )
    .unwrap()
    .entries()
    .iter()
    .map(|t| t.address.clone())
    .collect();
    assert!(
        !evicted.contains(&"10.1.0.3:8080".to_string()),
        "{evicted:?}"
    );
    assert!(
        evicted.contains(&"10.1.0.4:8080".to_string()),
        "huge instance, still closing: {evicted:?}"
    );
}

#[test]
fn it_ignores_garbage_admin_clusters_answers() {
    let mut host = Host::new();
    let answers: Rc<RefCell<VecDeque<Option<CallAnswer>>>> = Rc::default();
    let queue = answers.clone();
    host.respond("envoy_admin", move |_| {
        queue.borrow_mut().pop_front().flatten()
    });
    let config = r#"{"admin_cluster":"envoy_admin","membership_refresh":"1s","probe_path":""}"#;
    host.start_vm(Filter::Consumer, config);
    let w0 = host.start_vm(Filter::Consumer, config);
    // A tombstone, so that refreshes happen; then one good answer.
    let s = host.stream(w0);
    host.set_cluster(s, "providers");
    host.request_headers(s, &[(":method", "GET"), (":path", "/")], true);
    host.set_upstream(s, "10.0.0.1:8080");
    host.response_headers(s, &[(":status", "200"), ("closing", "true")], true);
    host.log(s);
    let json = |body: Vec<u8>| {
        Some(CallAnswer::new(
            200,
            &[("content-type", "application/json")],
            body,
        ))
    };
    answers.borrow_mut().push_back(json(ADMIN_JSON.into()));
    host.advance(Duration::from_secs(1));
    let good = host
        .shared_data(graceful_core::shared::keys::MEMBERS.name)
        .expect("membership stored");

    let mut deep = vec![b'['; 100_000];
    deep.extend(vec![b']'; 100_000]);
    let garbage: Vec<(&str, Option<CallAnswer>)> = vec![
        ("empty", json(vec![])),
        ("truncated", json(b"{".to_vec())),
        ("null", json(b"null".to_vec())),
        ("not UTF-8", json(b"\xff\xfe{}".to_vec())),
        ("wrong type", json(br#"{"cluster_statuses":5}"#.to_vec())),
        ("name not a string", json(br#"{"cluster_statuses":[{"name":5}]}"#.to_vec())),
        ("port out of range", json(br#"{"cluster_statuses":[{"name":"providers","host_statuses":[{"address":{"socket_address":{"address":"10.0.0.9","port_value":70000}}}]}]}"#.to_vec())),
        ("deep nesting", json(deep)),
        ("status 500", Some(CallAnswer::new(500, &[("x", "y")], "oops"))),
        ("status not a number", Some(CallAnswer::new(200, &[(":status", "abc")], ADMIN_JSON))),
    ];
    for (case, answer) in garbage {
        answers.borrow_mut().push_back(answer);
        host.advance(Duration::from_secs(1));
        assert_eq!(
            host.shared_data(graceful_core::shared::keys::MEMBERS.name)
                .unwrap(),
            good,
            "{case}: membership kept"
        );
    }
    // A failed call (no headers at all) changes nothing either.
    host.advance(Duration::from_secs(1));
    for c in host.pending_calls() {
        host.fail_call(c.id);
    }
    assert_eq!(
        host.shared_data(graceful_core::shared::keys::MEMBERS.name)
            .unwrap(),
        good
    );
    assert!(host.logs_containing("unreadable admin answer").len() >= 8);

    // Valid JSON with odd content is taken for what it says, no trap.
    // (serde reads a struct from an array too: `[]` is an empty list.)
    let odd = [
        r#"[]"#,
        r#"{"cluster_statuses":[]}"#,
        r#"{}"#,
        r#"{"cluster_statuses":[{"name":"providers","host_statuses":[{"address":{"pipe":{"path":"/x"}}},{"address":{"socket_address":{"address":"host.local","port_value":1}}},{}]}]}"#,
        r#"{"cluster_statuses":[{"name":"providers","host_statuses":[{"address":{"socket_address":{"address":"10.0.0.2","port_value":8080}},"health_status":{"eds_health_status":"WEIRD"}}]},{"name":"providers"}]}"#,
    ];
    for body in odd {
        answers.borrow_mut().push_back(json(body.into()));
        host.advance(Duration::from_secs(1));
    }
    let mut many = String::from(r#"{"cluster_statuses":[{"name":"providers","host_statuses":["#);
    for i in 0..5000 {
        if i > 0 {
            many.push(',');
        }
        many.push_str(&format!(
            r#"{{"address":{{"socket_address":{{"address":"10.{}.{}.{}","port_value":8080}}}}}}"#,
            i / 65536,
            i / 256 % 256,
            i % 256
        ));
    }
    many.push_str("]}]}");
    answers.borrow_mut().push_back(json(many.into_bytes()));
    host.advance(Duration::from_secs(1));
    let members = host
        .shared_data(graceful_core::shared::keys::MEMBERS.name)
        .unwrap();
    assert!(
        members.len() < 40 * 1024,
        "bounded: {} bytes",
        members.len()
    );
    let s = host.stream(w0);
    host.set_cluster(s, "providers");
    host.request_headers(s, &[(":method", "GET"), (":path", "/")], true);
    let list = host.request_header(s, "x-graceful-override-host").unwrap();
    assert_eq!(list.split(',').count(), 8, "at most 8 hosts named");

    // An answer over 4 MiB is Envoy before 1.38 listing every cluster: the
    // next refresh reads the config dump, garbage there changes nothing,
    // and a dump's members are taken.
    let mut over_limit = b"{\"cluster_statuses\":[".to_vec();
    over_limit.extend(vec![b' '; 5 << 20]);
    over_limit.extend(b"]}");
    answers.borrow_mut().push_back(json(over_limit));
    host.advance(Duration::from_secs(1));
    assert_eq!(
        host.shared_data(graceful_core::shared::keys::MEMBERS.name)
            .unwrap(),
        members,
        "over 4 MiB: membership kept"
    );
    assert_eq!(host.logs_containing("/config_dump from now on").len(), 1);
    for garbage in [&b"{"[..], br#"{"configs":5}"#, b"\xff"] {
        answers.borrow_mut().push_back(json(garbage.to_vec()));
        host.advance(Duration::from_secs(1));
        assert_eq!(
            host.shared_data(graceful_core::shared::keys::MEMBERS.name)
                .unwrap(),
            members
        );
    }
    let paths: Vec<String> = host
        .http_calls()
        .iter()
        .filter(|c| c.cluster == "envoy_admin")
        .map(|c| c.path())
        .collect();
    assert!(
        paths
            .last()
            .is_some_and(|p| p.starts_with("/config_dump?include_eds&")),
        "{paths:?}"
    );
    let dump = r#"{"configs":[{"dynamic_endpoint_configs":[{"endpoint_config":{"cluster_name":"providers","endpoints":[{"lb_endpoints":[
        {"endpoint":{"address":{"socket_address":{"address":"10.0.0.7","port_value":8080}}},"health_status":"HEALTHY"}]}]}}]}]}"#;
    answers.borrow_mut().push_back(json(dump.into()));
    host.advance(Duration::from_secs(1));
    let s = host.stream(w0);
    host.set_cluster(s, "providers");
    host.request_headers(s, &[(":method", "GET"), (":path", "/")], true);
    assert_eq!(
        host.request_header(s, "x-graceful-override-host")
            .as_deref(),
        Some("10.0.0.7:8080")
    );
}

/// Every shared-data key the filters use (the core's registry) that
/// belongs to `owner`.
fn keys_of(owner: Owner) -> Vec<&'static str> {
    keys::ALL
        .iter()
        .filter(|k| k.owner == owner)
        .map(|k| k.name)
        .collect()
}

fn garbage_values() -> Vec<Vec<u8>> {
    let mut random = vec![0u8; 64 << 10];
    let mut x: u32 = 12345;
    for b in random.iter_mut() {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
        *b = (x >> 16) as u8;
    }
    vec![
        vec![],
        vec![1],
        vec![0xff; 7],
        vec![0xff; 8],
        vec![0xff; 9],
        vec![1; 40],
        vec![0xff; 40],
        vec![1, 0xff, 0xff, 0xff, 0xff],
        b"x-graceful-instance\nbad id".to_vec(),
        random,
    ]
}

/// Requests, endpoints, ticks, tombstones and steering: everything that
/// reads shared data. Its own streams all end; the inbound count in shared
/// data must then be `inbound` and the consumer's in-flight gauge (the
/// outbound count itself) `outbound`, and the provider's in-flight gauge, a
/// view of its count set on graceful_drain's ticks (every 50 ms, after the
/// streams ended), the same.
fn exercise(p: &mut Proc, case: &str, inbound: u64, outbound: u64) {
    let mut open = Vec::new();
    for w in 0..2 {
        let app = p.host.stream_through(&p.inbound[w]);
        p.host
            .request_headers(app, &[(":method", "GET"), (":path", "/app")], true);
        for path in ["/graceful/status", "/graceful/ready", "/graceful/drained"] {
            let s = p.host.stream_through(&p.inbound[w]);
            p.host
                .request_headers(s, &[(":method", "GET"), (":path", path)], true);
            p.host.log(s);
        }
        let poll = p.host.stream_through(&p.inbound[w]);
        p.host.request_headers(
            poll,
            &[
                (":method", "GET"),
                (":path", "/graceful/drained?wait=100ms"),
            ],
            true,
        );
        let out = p.host.stream(p.outbound[w]);
        p.host.set_cluster(out, "providers");
        p.host
            .request_headers(out, &[(":method", "GET"), (":path", "/")], true);
        open.push((app, poll, out));
    }
    // Long-polls run out; then the consumer's refresh (1 s) and probes.
    p.host.advance(Duration::from_millis(150));
    for (app, poll, out) in open {
        p.host.set_upstream(out, "10.0.0.1:8080");
        p.host.response_headers(
            out,
            &[(":status", "200"), ("x-graceful-closing", "true")],
            true,
        );
        p.host.log(out);
        if p.host.reached_upstream(app) {
            p.host.response_headers(app, &[(":status", "200")], true);
        }
        p.host.log(app);
        p.host.log(poll);
    }
    p.host.advance(Duration::from_millis(900));
    let h = &p.host;
    let counts = (
        h.metric("graceful_provider_inflight") as u64,
        h.metric("graceful_consumer_inflight") as u64,
    );
    assert_eq!(
        counts,
        (inbound, outbound),
        "{case}: counts after the exercise"
    );
    let gauges = (
        h.metric("graceful_provider_inflight"),
        h.metric("graceful_consumer_inflight"),
    );
    let want = (inbound as i64, outbound as i64);
    assert_eq!(gauges, want, "{case}: in-flight gauges after the exercise");
}

/// Plants each garbage value in each of `keys`, before start-up and while
/// streams are in flight, and exercises every filter.
fn garbage_in(keys: &[&str]) {
    for key in keys {
        for value in garbage_values() {
            let case = format!("{key} = {} bytes", value.len());
            // Planted before start-up...
            let planted = value.clone();
            let mut p = process_with(|h| h.set_shared_data(key, &planted));
            exercise(&mut p, &case, 0, 0);
            assert_counts_zero(&p, &case);
            // ...and while running, with streams in flight.
            let mut p = process();
            let s = p.host.stream_through(&p.inbound[0]);
            p.host
                .request_headers(s, &[(":method", "GET"), (":path", "/app")], true);
            let out = p.host.stream(p.outbound[1]);
            p.host
                .request_headers(out, &[(":method", "GET"), (":path", "/")], true);
            p.host.set_shared_data(key, &value);
            // Both counts are Envoy stats: no shared-data key touches them.
            let inbound = 1;
            let outbound = 1;
            exercise(&mut p, &case, inbound, outbound);
            p.host.response_headers(s, &[(":status", "200")], true);
            p.host.log(s);
            p.host.reset(out);
            assert_counts_zero(&p, &case);
        }
    }
}

// One test per owner, so they run in parallel; `Owner` has no other
// variant, so together they cover every key in the registry.
#[test]
fn it_survives_garbage_in_the_provider_keys() {
    garbage_in(&keys_of(Owner::Provider));
}

#[test]
fn it_survives_garbage_in_the_drain_keys() {
    garbage_in(&keys_of(Owner::Drain));
}

#[test]
fn it_survives_garbage_in_the_consumer_keys() {
    garbage_in(&keys_of(Owner::Consumer));
}

#[test]
fn it_survives_garbage_http_call_answers() {
    // Drain's admin poll and consumer probes, answered with garbage.
    let mut host = Host::new();
    let answers: Rc<RefCell<VecDeque<CallAnswer>>> = Rc::default();
    let queue = answers.clone();
    host.respond("envoy_admin", move |_| queue.borrow_mut().pop_front());
    let d = host.start_vm(Filter::Drain, DRAIN);
    let garbage = [
        CallAnswer::new(503, &[("x", "y")], huge(10 << 20)),
        CallAnswer::new(503, &[("x", "y")], b"\xff\xfeDRAINING".to_vec()),
        CallAnswer::new(200, &[(":status", "2\u{0}0")], "DRAINING"),
        CallAnswer::default(),
        CallAnswer::new(503, &[("x", "y")], "DRAININ"),
    ];
    for a in garbage {
        answers.borrow_mut().push_back(a);
        host.advance(Duration::from_secs(1));
        assert_eq!(
            host.with_store(|s| record::read(s).unwrap()).phase,
            record::Phase::Serving
        );
    }
    assert!(!host.is_dead(d));

    let mut host = Host::new();
    host.add_cluster("providers");
    let c = host.start_vm(Filter::Consumer, r#"{"membership_refresh":"1s"}"#);
    let s = host.stream(c);
    host.set_cluster(s, "providers");
    host.request_headers(s, &[(":method", "GET"), (":path", "/")], true);
    host.set_upstream(s, "10.0.0.1:8080");
    host.response_headers(
        s,
        &[
            (":status", "200"),
            ("x-graceful-closing", "true"),
            ("x-graceful-instance", "a1"),
        ],
        true,
    );
    host.log(s);
    let probes: Vec<CallAnswer> = vec![
        CallAnswer::new(200, &[("x-graceful-address", "10.0.0.1:8080\u{0}")], ""),
        CallAnswer::new(
            200,
            &[
                ("x-graceful-address", "10.0.0.1:8080"),
                ("x-graceful-instance", "a b"),
            ],
            "",
        ),
        CallAnswer {
            headers: graceful_emulated_host::HeaderMap::from_pairs(&[
                (&b":status"[..], &b"200"[..]),
                (b"x-graceful-address", b"10.0.0.1:8080"),
                (b"x-graceful-instance", b"\xff\xfe"),
            ]),
            ..CallAnswer::default()
        },
        CallAnswer::new(
            200,
            &[
                ("x-graceful-address", "10.0.0.1:8080"),
                ("x-graceful-instance", ""),
            ],
            "",
        ),
        CallAnswer::new(
            299,
            &[
                ("x-graceful-address", "10.0.0.1:8080"),
                ("x-graceful-instance", "a2"),
            ],
            "",
        ),
        CallAnswer::default(),
    ];
    for answer in probes {
        host.advance(Duration::from_secs(1));
        let pending = host.pending_calls();
        assert_eq!(pending.len(), 1, "{pending:?}");
        host.answer_call(pending[0].id, answer);
        let t = Tombstones::decode(
            &host
                .shared_data(graceful_core::shared::keys::TOMBSTONES.name)
                .unwrap(),
        )
        .unwrap();
        assert_eq!(t.entries().len(), 1, "still tombstoned");
    }
    assert_eq!(host.metric("graceful_consumer_readmitted"), 0);
}
