//! graceful_provider's `.wasm` on the test host: exact in-flight counting
//! across workers (Envoy stats, shared by name), the closing mark on headers
//! and gRPC trailers, the instance header, and the 503 after the drain gate.
//! The drain filter's side is played here by setting its stats and record;
//! `abi_drain.rs` runs both filters together.

use std::time::Duration;

use graceful_core::drain::record::{self, GatePass, InstanceRecord, Phase};
use graceful_emulated_host::{Filter, Host, Level, StreamId, Vm};

const CLOSING: &str = "x-graceful-closing";
const INSTANCE: &str = "x-graceful-instance";
const INFLIGHT: &str = "graceful_provider_inflight";

fn record(host: &Host) -> InstanceRecord {
    host.with_store(|s| record::read(s).unwrap())
}

fn inflight(host: &Host) -> i64 {
    host.metric(INFLIGHT)
}

/// The in-flight gauge, which every worker moves, equals `n`.
fn assert_inflight(host: &Host, n: i64) {
    assert_eq!(inflight(host), n, "{INFLIGHT}");
}

fn get(host: &mut Host, vm: Vm, path: &str) -> StreamId {
    let s = host.stream(vm);
    host.request_headers(
        s,
        &[(":method", "GET"), (":path", path), (":authority", "app")],
        true,
    );
    s
}

fn grpc_call(host: &mut Host, vm: Vm) -> StreamId {
    let s = host.stream(vm);
    host.request_headers(
        s,
        &[
            (":method", "POST"),
            (":path", "/pkg.Svc/Call"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ],
        false,
    );
    host.request_body(s, b"\0\0\0\0\x02hi", true);
    s
}

fn ok(host: &mut Host, s: StreamId) {
    host.response_headers(s, &[(":status", "200"), ("content-length", "0")], true);
}

/// Closing starts now (what graceful_drain's POST does: the record, then
/// the phase gauge the provider reads).
fn start_closing(host: &mut Host) {
    let now = host.now_us();
    host.with_store(|s| record::start_closing(s, now).unwrap());
    host.set_gauge("graceful_drain_phase", 1);
}

/// The drain gate passes now (forced: what graceful_drain does when a
/// timeout runs out with requests in flight): the gate stat goes up, then
/// the record says drained.
fn pass_gate(host: &mut Host) {
    start_closing(host);
    host.set_gauge("graceful_drain_gate", 1);
    let now = host.now_us();
    host.with_store(|s| record::pass(s, GatePass::Timeout, now).unwrap());
    host.set_gauge("graceful_drain_phase", 2);
    assert_eq!(record(host).phase, Phase::Drained);
}

/// The main thread's copy configures first, then two workers.
fn process(config: &str) -> (Host, Vm, Vm) {
    let mut host = Host::new();
    host.start_vm(Filter::Provider, config);
    let w0 = host.start_vm(Filter::Provider, config);
    let w1 = host.start_vm(Filter::Provider, config);
    (host, w0, w1)
}

#[test]
fn it_counts_inflight_exactly_across_two_workers_with_resets_and_local_replies() {
    let (mut host, w0, w1) = process("");
    assert_inflight(&host, 0);

    // Interleaved streams on both workers.
    let a = get(&mut host, w0, "/a");
    let b = get(&mut host, w1, "/b");
    host.advance(Duration::from_millis(5));
    let c = get(&mut host, w0, "/c");
    let d = grpc_call(&mut host, w1);
    assert_inflight(&host, 4);
    assert_eq!(host.metric("graceful_provider_started"), 4);

    // b: the client resets before any response: on_log only.
    host.reset(b);
    assert_inflight(&host, 3);
    // c: a normal response.
    ok(&mut host, c);
    assert_inflight(&host, 3);
    host.log(c);
    assert_inflight(&host, 2);
    // a: the router's own local reply (connect failure, UF) counts out too.
    host.set_upstream(a, "10.0.0.1:8080");
    host.set_response_flags(a, 0x20);
    host.response_headers(a, &[(":status", "503")], false);
    host.response_body(a, b"upstream connect error", true);
    host.log(a);
    assert_inflight(&host, 1);
    // d: a gRPC stream that ends in trailers.
    host.response_headers(
        d,
        &[(":status", "200"), ("content-type", "application/grpc")],
        false,
    );
    host.response_body(d, b"\0\0\0\0\x00", false);
    host.response_trailers(d, &[("grpc-status", "0")]);
    host.log(d);
    assert_inflight(&host, 0);

    // A stream an earlier filter answered: the provider gets on_log only
    // (its context created for it) and counts nothing.
    let e = host.stream(w1);
    host.log(e);
    assert_inflight(&host, 0);

    // After the gate: the local 503 is not counted, in or out.
    let f = get(&mut host, w0, "/held");
    pass_gate(&mut host);
    let g = get(&mut host, w1, "/late");
    assert_eq!(host.local_reply(g).unwrap().status, 503);
    assert_inflight(&host, 1);
    host.log(g);
    assert_inflight(&host, 1);
    ok(&mut host, f);
    host.log(f);
    assert_inflight(&host, 0);
    assert!(
        host.logs_at_least(Level::Warn).is_empty(),
        "{:?}",
        host.logs()
    );
}

#[test]
fn an_ordinary_request_touches_no_shared_data_and_reads_one_header_at_most() {
    // (config, whether the request's headers end its stream, the header
    // reads): `upgrade` is read only where it can matter, on a stream its
    // headers leave open (Envoy raises an upgrade that way) and where
    // upgrades are long-lived streams.
    for (config, ends_in_headers, reads) in [
        ("", true, 0),
        ("", false, 1),
        (r#"{"long_lived_upgrades": false}"#, true, 0),
        (r#"{"long_lived_upgrades": false}"#, false, 0),
    ] {
        let (mut host, w0, _w1) = process(config);
        let before = host.trace().len();
        let s = host.stream(w0);
        host.request_headers(
            s,
            &[(":method", "POST"), (":path", "/"), (":authority", "app")],
            ends_in_headers,
        );
        if !ends_in_headers {
            host.request_body(s, b"hi", true);
        }
        ok(&mut host, s);
        host.log(s);
        let trace = host.trace()[before..].to_string();
        for call in ["get_shared_data", "set_shared_data", "get_current_time"] {
            assert!(!trace.contains(call), "{call} while serving:\n{trace}");
        }
        let header_reads: Vec<&str> = trace
            .lines()
            .filter(|l| l.contains("proxy_get_header_map_value"))
            .collect();
        assert_eq!(
            header_reads.len(),
            reads,
            "{config}, ends in headers {ends_in_headers}: {trace}"
        );
        assert!(
            header_reads.iter().all(|l| l.contains("\"upgrade\"")),
            "{trace}"
        );
        assert!(trace.contains("proxy_get_metric"), "{trace}");
        assert_eq!(host.metric("graceful_provider_started"), 1, "{trace}");
        assert_inflight(&host, 0);
    }
}

#[test]
fn it_refuses_to_start_when_envoy_drops_its_stats() {
    let mut host = Host::new();
    host.reject_stats("graceful_provider_inflight");
    let err = host
        .try_start_vm(Filter::Provider, "")
        .expect_err("configure must fail");
    assert!(format!("{err:?}").contains("on_configure"), "{err:?}");
    assert_eq!(
        host.logs_containing("does not keep the stat graceful_provider_inflight")
            .len(),
        1,
        "{:?}",
        host.logs()
    );
}

#[test]
fn it_marks_closing_on_headers_and_on_grpc_trailers() {
    let (mut host, w0, _) = process("");
    // Serving: no mark anywhere.
    let s = get(&mut host, w0, "/");
    ok(&mut host, s);
    assert_eq!(host.response_header(s, CLOSING), None);
    host.log(s);

    start_closing(&mut host);

    // Plain HTTP: the header, replacing whatever the app said.
    let s = get(&mut host, w0, "/");
    host.response_headers(s, &[(":status", "200"), (CLOSING, "false")], true);
    assert_eq!(
        host.response(s).headers.get_all(CLOSING),
        vec![&b"true"[..]]
    );
    assert_eq!(
        host.response(s).trailers,
        None,
        "no trailers invented on HTTP"
    );
    host.log(s);

    // gRPC, upstream trailers: the mark joins grpc-status there.
    let s = grpc_call(&mut host, w0);
    host.response_headers(
        s,
        &[(":status", "200"), ("content-type", "application/grpc")],
        false,
    );
    host.response_body(s, b"\0\0\0\0\x02ok", false);
    host.response_trailers(s, &[("grpc-status", "0")]);
    let r = host.response(s);
    assert_eq!(r.header(CLOSING).as_deref(), Some("true"));
    assert_eq!(r.trailer(CLOSING).as_deref(), Some("true"));
    assert_eq!(r.trailer("grpc-status").as_deref(), Some("0"));
    assert_eq!(r.body, b"\0\0\0\0\x02ok", "body untouched");
    host.log(s);

    // A "gRPC" response that ends in its body, without trailers (not valid
    // gRPC): marked in its headers; no trailers are made up for it (that
    // would need the body callback, entered for every chunk of every
    // response, which the module does not export).
    let s = grpc_call(&mut host, w0);
    host.response_headers(
        s,
        &[
            (":status", "200"),
            ("content-type", "application/grpc+proto"),
        ],
        false,
    );
    host.response_body(s, b"\0\0\0\0\x01x", true);
    assert_eq!(host.response_header(s, CLOSING).as_deref(), Some("true"));
    assert_eq!(host.response(s).trailers, None);
    host.log(s);

    // A long gRPC stream whose headers came while serving gets the mark in
    // its trailers once closing has started: see
    // `a_stream_that_outlives_serving_gets_the_mark_in_its_trailers`.

    // gRPC trailers-only: headers only, no trailer map to write to.
    let s = grpc_call(&mut host, w0);
    host.response_headers(
        s,
        &[
            (":status", "200"),
            ("content-type", "application/grpc"),
            ("grpc-status", "5"),
        ],
        true,
    );
    let r = host.response(s);
    assert_eq!(r.header(CLOSING).as_deref(), Some("true"));
    assert_eq!(r.trailers, None);
    host.log(s);

    // Each marked response counted once (trailers do not count twice), and
    // the filter never touched a map Envoy would not have given it.
    assert_eq!(host.metric("graceful_provider_closing_marked"), 4);
    assert!(!host.trace().contains("BadArgument"), "{}", host.trace());
}

#[test]
fn a_stream_that_outlives_serving_gets_the_mark_in_its_trailers() {
    let (mut host, w0, _) = process("");
    let s = grpc_call(&mut host, w0);
    host.response_headers(
        s,
        &[(":status", "200"), ("content-type", "application/grpc")],
        false,
    );
    assert_eq!(host.response_header(s, CLOSING), None, "serving");
    host.response_body(s, b"\0\0\0\0\x02ok", false);
    start_closing(&mut host);
    host.response_trailers(s, &[("grpc-status", "0")]);
    assert_eq!(host.response_trailer(s, CLOSING).as_deref(), Some("true"));
    host.log(s);
    assert_eq!(host.metric("graceful_provider_closing_marked"), 1);
}

#[test]
fn it_stamps_one_instance_id_from_every_worker() {
    let (mut host, w0, w1) = process("");
    let mut ids = Vec::new();
    for vm in [w0, w1, w0] {
        let s = get(&mut host, vm, "/");
        ok(&mut host, s);
        ids.push(host.response_header(s, INSTANCE).expect("instance header"));
        host.log(s);
    }
    assert_eq!(ids[0].len(), 16, "{ids:?}");
    assert!(
        ids.iter().all(|id| *id == ids[0]),
        "one id per process: {ids:?}"
    );
    assert_eq!(
        host.shared_data("graceful.v1.instance_id").unwrap(),
        ids[0].as_bytes()
    );

    // A configured id wins; "" turns the header off.
    let (mut host, w0, _) = process(r#"{"instance_id":"pod-7"}"#);
    let s = get(&mut host, w0, "/");
    host.response_headers(s, &[(":status", "200"), (INSTANCE, "spoofed")], true);
    assert_eq!(
        host.response(s).headers.get_all(INSTANCE),
        vec![&b"pod-7"[..]]
    );
    let (mut host, w0, _) = process(r#"{"instance_header":""}"#);
    let s = get(&mut host, w0, "/");
    ok(&mut host, s);
    assert_eq!(host.response_header(s, INSTANCE), None);
}

#[test]
fn it_rejects_new_requests_with_a_marked_503_after_the_gate() {
    let (mut host, w0, w1) = process(r#"{"instance_id":"pod-7"}"#);
    let before = get(&mut host, w1, "/slow");
    pass_gate(&mut host);

    let s = get(&mut host, w0, "/after");
    assert!(!host.reached_upstream(s), "the app never sees it");
    let reply = host.local_reply(s).expect("local reply");
    assert_eq!(reply.status, 503);
    assert_eq!(reply.header(CLOSING).as_deref(), Some("true"));
    assert_eq!(reply.header(INSTANCE).as_deref(), Some("pod-7"));
    assert_eq!(reply.text(), "instance is shutting down\n");
    // What the client gets, after the provider's own response callbacks.
    let r = host.response(s);
    assert_eq!(r.status(), 503);
    assert_eq!(r.header(CLOSING).as_deref(), Some("true"));
    assert_eq!(r.header("content-type").as_deref(), Some("text/plain"));
    assert_eq!(r.body, b"instance is shutting down\n");
    assert_eq!(host.metric("graceful_provider_rejected"), 1);
    host.log(s);

    // A gRPC request gets Envoy's trailers-only form: grpc-status 14.
    let g = grpc_call(&mut host, w1);
    let r = host.response(g);
    assert_eq!(r.status(), 200);
    assert_eq!(r.header("grpc-status").as_deref(), Some("14"));
    assert_eq!(r.header(CLOSING).as_deref(), Some("true"));
    assert!(r.body.is_empty());
    host.log(g);
    assert_eq!(host.metric("graceful_provider_rejected"), 2);

    // The request admitted before the gate still completes, marked.
    ok(&mut host, before);
    assert_eq!(
        host.response_header(before, CLOSING).as_deref(),
        Some("true")
    );
    host.log(before);
    assert_inflight(&host, 0);

    // reject_when_drained: false keeps serving (and counting) after the gate.
    let (mut host, w0, _) = process(r#"{"reject_when_drained":false}"#);
    pass_gate(&mut host);
    let s = get(&mut host, w0, "/");
    assert!(host.reached_upstream(s));
    assert_inflight(&host, 1);
}

#[test]
fn it_adds_immediate_health_check_fail_while_closing_when_configured() {
    let (mut host, w0, _) = process(r#"{"immediate_health_check_fail":true}"#);
    let s = get(&mut host, w0, "/");
    ok(&mut host, s);
    assert_eq!(
        host.response_header(s, "x-envoy-immediate-health-check-fail"),
        None
    );
    start_closing(&mut host);
    let s = get(&mut host, w0, "/");
    ok(&mut host, s);
    assert_eq!(
        host.response_header(s, "x-envoy-immediate-health-check-fail")
            .as_deref(),
        Some("true")
    );
    pass_gate(&mut host);
    let s = get(&mut host, w0, "/");
    assert_eq!(
        host.local_reply(s)
            .unwrap()
            .header("x-envoy-immediate-health-check-fail")
            .as_deref(),
        Some("true")
    );
}

#[test]
fn the_inflight_gauge_is_live_on_every_worker() {
    let (mut host, w0, w1) = process("");
    let a = get(&mut host, w0, "/a");
    let b = get(&mut host, w1, "/b");
    assert_inflight(&host, 2);
    host.log(a);
    assert_inflight(&host, 1);
    host.log(b);
    assert_inflight(&host, 0);
    assert!(
        !host.trace().contains("NEGATIVE GAUGE"),
        "no double decrement: {}",
        host.trace()
    );
}
