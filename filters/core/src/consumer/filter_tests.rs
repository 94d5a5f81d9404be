//! graceful_consumer's callbacks through the mock host: the request's
//! counting and steering, and what a response (or a failed attempt, or a
//! call's answer) does.

use std::cell::RefCell;

use super::*;
use crate::consumer::tombstone::Tombstones;
use crate::shared::mock::{MockAnswer, MockHost};

const CLUSTER: &str = "outbound|8080||provider";

fn filter(h: &MockHost, json: &str, upstream: bool) -> ConsumerFilter {
    match ConsumerFilter::configure(h, json.as_bytes(), upstream) {
        Ok(f) => f,
        Err(e) => panic!("configure: {e}"),
    }
}

/// One request to the cluster answered by `address` with `response`.
fn exchange(
    f: &ConsumerFilter,
    copy: &RefCell<ConsumerCopy>,
    h: &MockHost,
    address: &str,
    response: &[(&str, &str)],
) -> ConsumerStream {
    let st = ConsumerStream::default();
    h.set_map(Map::RequestHeaders, &[(":path", "/")]);
    h.set_attribute(Attribute::ClusterName, CLUSTER);
    f.request_headers(copy, &st, h);
    h.set_attribute(Attribute::UpstreamAddress, address);
    h.set_map(Map::ResponseHeaders, response);
    f.response_headers(copy, &st, h);
    f.stream_end(&st, h);
    st
}

fn live_tombstones(h: &MockHost) -> usize {
    let list = h
        .store()
        .get(crate::shared::keys::TOMBSTONES.name)
        .ok()
        .flatten();
    let list = list
        .and_then(|(b, _)| Tombstones::decode(&b))
        .unwrap_or_default();
    list.live_count(h.now_us())
}

#[test]
fn it_counts_each_request_in_and_out_once_and_drops_a_clients_override() {
    let h = MockHost::new();
    let f = filter(&h, "", false);
    let copy = RefCell::new(f.new_copy());
    let st = ConsumerStream::default();
    h.set_map(
        Map::RequestHeaders,
        &[("x-graceful-override-host", "10.9.9.9:80")],
    );
    h.set_attribute(Attribute::ClusterName, CLUSTER);
    assert_eq!(f.request_headers(&copy, &st, &h), Action::Continue);
    assert_eq!(
        h.header(Map::RequestHeaders, "x-graceful-override-host"),
        None
    );
    assert_eq!(h.metric(Metric::ConsumerInflight), 1);
    assert_eq!(h.metric(Metric::ConsumerStarted), 1);
    f.stream_end(&st, &h);
    f.stream_end(&st, &h);
    assert_eq!(h.metric(Metric::ConsumerInflight), 0);
}

#[test]
fn only_the_upstream_instance_names_this_envoy_and_no_client_value_travels() {
    let h = MockHost::new();
    let f = filter(&h, "", false);
    // The process's instance id, the one its provider would stamp.
    let stored = h
        .store()
        .get(crate::shared::keys::INSTANCE_ID.name)
        .ok()
        .flatten();
    assert_eq!(
        stored.map(|(v, _)| v),
        Some(f.identity().as_bytes().to_vec())
    );
    assert!(crate::drain::is_consumer_identity(f.identity().as_bytes()));
    // The upstream instance runs on the steered clusters only: it sets the
    // identity over a client's; the listener instance, on every outbound
    // request, drops the client's and names nobody.
    for (upstream, expected) in [(false, None), (true, Some(f.identity().to_string()))] {
        let f = filter(&h, "", upstream);
        let copy = RefCell::new(f.new_copy());
        h.set_map(Map::RequestHeaders, &[("x-graceful-consumer", "forged\"}")]);
        h.set_attribute(Attribute::ClusterName, CLUSTER);
        f.request_headers(&copy, &ConsumerStream::default(), &h);
        assert_eq!(
            h.header_text(Map::RequestHeaders, "x-graceful-consumer"),
            expected,
            "upstream: {upstream}"
        );
    }
    // "" turns it off: the header is left as the client sent it.
    for upstream in [false, true] {
        let f = filter(&h, r#"{"consumer_header": ""}"#, upstream);
        let copy = RefCell::new(f.new_copy());
        h.set_map(Map::RequestHeaders, &[("x-graceful-consumer", "mine")]);
        f.request_headers(&copy, &ConsumerStream::default(), &h);
        assert_eq!(
            h.header_text(Map::RequestHeaders, "x-graceful-consumer")
                .as_deref(),
            Some("mine"),
            "upstream: {upstream}"
        );
    }
}

#[test]
fn a_closing_answer_tombstones_its_host_and_later_requests_are_steered_away() {
    let h = MockHost::new();
    let f = filter(&h, "", false);
    let copy = RefCell::new(f.new_copy());
    for address in ["10.0.0.1:8080", "10.0.0.2:8080"] {
        exchange(&f, &copy, &h, address, &[(":status", "200")]);
    }
    let generation = h.metric(Metric::ConsumerGeneration);
    exchange(
        &f,
        &copy,
        &h,
        "10.0.0.1:8080",
        &[(":status", "200"), ("x-graceful-closing", "true")],
    );
    assert_eq!(live_tombstones(&h), 1);
    assert_eq!(h.metric(Metric::ConsumerEvictions), 1);
    assert_eq!(h.metric(Metric::ConsumerTombstones), 1);
    assert!(h.metric(Metric::ConsumerGeneration) > generation);
    // Another copy (another worker) steers away from it at once.
    let other = RefCell::new(f.new_copy());
    let st = ConsumerStream::default();
    h.set_map(Map::RequestHeaders, &[(":path", "/")]);
    f.request_headers(&other, &st, &h);
    assert_eq!(
        h.header_text(Map::RequestHeaders, "x-graceful-override-host")
            .as_deref(),
        Some("10.0.0.2:8080")
    );
    assert_eq!(h.metric(Metric::ConsumerSteered), 1);
}

#[test]
fn closing_in_trailers_counts_and_an_unmarked_answer_tombstones_nothing() {
    let h = MockHost::new();
    let f = filter(&h, "", false);
    let copy = RefCell::new(f.new_copy());
    let st = exchange(&f, &copy, &h, "10.0.0.1:8080", &[(":status", "200")]);
    assert!(st.answered());
    assert_eq!(live_tombstones(&h), 0);
    h.set_map(
        Map::ResponseTrailers,
        &[("grpc-status", "0"), ("x-graceful-closing", "true")],
    );
    f.response_trailers(&copy, &st, &h);
    assert_eq!(live_tombstones(&h), 1);
}

#[test]
fn a_local_503_for_a_connect_failure_tombstones_only_with_the_flag() {
    let h = MockHost::new();
    let f = filter(&h, "", false);
    let copy = RefCell::new(f.new_copy());
    exchange(&f, &copy, &h, "10.0.0.1:8080", &[(":status", "503")]);
    assert_eq!(live_tombstones(&h), 0);
    h.set_response_flags(crate::consumer::decisions::FLAG_UF);
    exchange(&f, &copy, &h, "10.0.0.1:8080", &[(":status", "503")]);
    assert_eq!(live_tombstones(&h), 1);
    let h = MockHost::new();
    let f = filter(&h, r#"{"evict_on_connect_failure": false}"#, false);
    let copy = RefCell::new(f.new_copy());
    h.set_response_flags(crate::consumer::decisions::FLAG_UF);
    exchange(&f, &copy, &h, "10.0.0.1:8080", &[(":status", "503")]);
    assert_eq!(live_tombstones(&h), 0);
}

#[test]
fn the_upstream_instance_counts_nothing_and_tombstones_an_attempt_that_could_not_connect() {
    let h = MockHost::new();
    let f = filter(&h, "", true);
    let copy = RefCell::new(f.new_copy());
    let st = ConsumerStream::default();
    h.set_map(
        Map::RequestHeaders,
        &[("x-graceful-override-host", "10.0.0.2:8080")],
    );
    h.set_attribute(Attribute::ClusterName, CLUSTER);
    f.request_headers(&copy, &st, &h);
    assert_eq!(
        h.header(Map::RequestHeaders, "x-graceful-override-host"),
        None
    );
    assert_eq!(h.metric(Metric::ConsumerInflight), 0);
    h.set_attribute(Attribute::UpstreamAddress, "10.0.0.1:8080");
    // Ended without a reason: nothing.
    f.attempt_done(&copy, &st, &h);
    assert_eq!(live_tombstones(&h), 0);
    h.set_attribute(
        Attribute::UpstreamTransportFailureReason,
        "delayed connect error: 111",
    );
    f.attempt_done(&copy, &st, &h);
    assert_eq!(live_tombstones(&h), 1);
    // An attempt that got an answer failed nothing.
    let h = MockHost::new();
    let copy = RefCell::new(f.new_copy());
    let st = ConsumerStream::default();
    h.set_attribute(Attribute::UpstreamAddress, "10.0.0.1:8080");
    h.set_attribute(Attribute::UpstreamTransportFailureReason, "reset");
    h.set_map(Map::ResponseHeaders, &[(":status", "200")]);
    f.response_headers(&copy, &st, &h);
    f.attempt_done(&copy, &st, &h);
    assert_eq!(live_tombstones(&h), 0);
}

#[test]
fn the_upstream_instance_tombstones_an_attempt_whose_connection_timed_out_and_nothing_else() {
    // A connect timeout leaves no transport failure reason: the pool
    // answered the attempt with no connection (Envoy 1.36 to 1.40, seen in
    // the consumer suite's silent host).
    let attempt = |answered: bool, connected: bool| {
        let h = MockHost::new();
        let f = filter(&h, "", true);
        let copy = RefCell::new(f.new_copy());
        let st = ConsumerStream::default();
        h.set_attribute(Attribute::ClusterName, CLUSTER);
        h.set_attribute(Attribute::UpstreamAddress, "10.0.0.1:8080");
        if answered {
            h.set_attribute(Attribute::UpstreamPoolAnswered, "\0\0\0\x3b\0\0\0\0");
        }
        if connected {
            h.set_attribute(Attribute::UpstreamLocalAddress, "10.0.0.9:40000");
        }
        f.attempt_done(&copy, &st, &h);
        live_tombstones(&h)
    };
    assert_eq!(attempt(true, false), 1, "timed out: tombstoned");
    assert_eq!(attempt(true, true), 0, "connected, reset before headers");
    assert_eq!(attempt(false, false), 0, "cancelled while it waited");
}

#[test]
fn the_upstream_instance_signals_its_write_in_a_response_header_the_listener_removes() {
    // Envoy 1.36 to 1.38: the upstream instance's bump of the change signal
    // lands in the cluster's stats scope, which the listener never reads.
    let h = MockHost::new();
    let listener = filter(&h, "", false);
    let upstream = filter(&h, "", true);
    let l = RefCell::new(listener.new_copy());
    let u = RefCell::new(upstream.new_copy());
    for address in ["10.0.0.1:8080", "10.0.0.2:8080"] {
        exchange(&listener, &l, &h, address, &[(":status", "200")]);
    }
    let listener_scope = h.metric(Metric::ConsumerGeneration);
    let attempt = ConsumerStream::default();
    h.set_attribute(Attribute::UpstreamAddress, "10.0.0.1:8080");
    h.set_attribute(
        Attribute::UpstreamTransportFailureReason,
        "delayed connect error: 111",
    );
    upstream.attempt_done(&u, &attempt, &h);
    assert_eq!(live_tombstones(&h), 1);
    h.metric_set(Metric::ConsumerGeneration, listener_scope);
    let steered = |h: &MockHost| {
        let st = ConsumerStream::default();
        h.set_map(Map::RequestHeaders, &[(":path", "/")]);
        listener.request_headers(&l, &st, h);
        h.header_text(Map::RequestHeaders, "x-graceful-override-host")
    };
    assert_eq!(steered(&h), None, "the listener has not seen the write");
    // The retry's attempt to another host is answered: the upstream
    // instance adds the signal, for SIGNAL_HINTS answers.
    h.set_attribute(Attribute::UpstreamTransportFailureReason, "");
    let hinted = |h: &MockHost| {
        let st = ConsumerStream::default();
        h.set_map(Map::ResponseHeaders, &[(":status", "200")]);
        upstream.response_headers(&u, &st, h);
        h.header_text(Map::ResponseHeaders, crate::shared::headers::SIGNAL)
    };
    assert_eq!(hinted(&h).as_deref(), Some("1"));
    // The listener sees that answer next: it removes the header, looks,
    // and moves its scope's signal for every copy.
    let st = ConsumerStream::default();
    h.set_attribute(Attribute::UpstreamAddress, "10.0.0.2:8080");
    listener.response_headers(&l, &st, &h);
    assert_eq!(
        h.header(Map::ResponseHeaders, crate::shared::headers::SIGNAL),
        None
    );
    assert_eq!(h.metric(Metric::ConsumerGeneration), listener_scope + 1);
    assert_eq!(steered(&h).as_deref(), Some("10.0.0.2:8080"));
    // Bounded: after its hints, the upstream instance adds nothing.
    for _ in 1..crate::consumer::decisions::SIGNAL_HINTS {
        assert!(hinted(&h).is_some());
    }
    assert_eq!(hinted(&h), None);
    // A provider's forged signal: removed, a look, nothing moves.
    h.set_map(
        Map::ResponseHeaders,
        &[(":status", "200"), ("X-Graceful-Consumer-Signal", "1")],
    );
    listener.response_headers(&l, &ConsumerStream::default(), &h);
    assert_eq!(
        h.header(Map::ResponseHeaders, crate::shared::headers::SIGNAL),
        None
    );
    assert_eq!(h.metric(Metric::ConsumerGeneration), listener_scope + 1);
}

#[test]
fn the_tick_refreshes_membership_from_the_admin_and_probes_a_tombstoned_host() {
    let h = MockHost::new();
    let f = filter(&h, r#"{"admin_cluster": "admin"}"#, false);
    let copy = RefCell::new(f.new_copy());
    exchange(
        &f,
        &copy,
        &h,
        "10.0.0.1:8080",
        &[
            (":status", "200"),
            ("x-graceful-closing", "true"),
            ("x-graceful-instance", "old"),
        ],
    );
    assert_eq!(live_tombstones(&h), 1);
    f.tick(&copy, &h);
    let calls = h.take_calls();
    let admin: Vec<_> = calls.iter().filter(|c| c.cluster == "admin").collect();
    assert_eq!(admin.len(), 1, "{calls:?}");
    let body = format!(
        r#"{{"cluster_statuses": [{{"name": "{CLUSTER}", "host_statuses": [
            {{"address": {{"socket_address": {{"address": "10.0.0.1", "port_value": 8080}}}}}},
            {{"address": {{"socket_address": {{"address": "10.0.0.2", "port_value": 8080}}}}}}]}}]}}"#
    );
    f.call_answered(&copy, &h, admin[0].token, &MockAnswer::status("200", &body));
    let probes = h.take_calls();
    assert_eq!(probes.len(), 1, "{probes:?}");
    assert_eq!(probes[0].cluster, CLUSTER);
    // A new instance answers on the address: readmitted.
    let answer = MockAnswer::status("200", "SERVING")
        .with_header(crate::shared::headers::ADDRESS, "10.0.0.1:8080")
        .with_header("x-graceful-instance", "new");
    f.call_answered(&copy, &h, probes[0].token, &answer);
    assert_eq!(live_tombstones(&h), 0);
    assert_eq!(h.metric(Metric::ConsumerReadmitted), 1);
}

#[test]
fn a_probe_with_no_answer_is_a_connect_failure_only_where_the_delivery_says_so() {
    for native in [false, true] {
        let h = MockHost::new();
        let mut f = filter(&h, r#"{"admin_cluster": "admin"}"#, false);
        if native {
            f = f.with_probe_failure_as_connect_failure();
        }
        let copy = RefCell::new(f.new_copy());
        h.set_response_flags(crate::consumer::decisions::FLAG_UF);
        exchange(&f, &copy, &h, "10.0.0.1:8080", &[(":status", "503")]);
        // The connect failure's tombstone (5 s) is near its end when the
        // probe finds the host still unreachable.
        h.advance(std::time::Duration::from_secs(4));
        f.tick(&copy, &h);
        let admin = h.take_calls();
        f.call_answered(&copy, &h, admin[0].token, &MockAnswer::failed());
        let probes = h.take_calls();
        assert_eq!(probes.len(), 1, "{probes:?}");
        f.call_answered(&copy, &h, probes[0].token, &MockAnswer::failed());
        h.advance(std::time::Duration::from_secs(3));
        assert_eq!(live_tombstones(&h), usize::from(native), "native {native}");
    }
}

#[test]
fn refused_calls_are_logged_and_the_stats_envoy_drops_refuse_the_config() {
    let h = MockHost::new();
    let f = filter(&h, r#"{"admin_cluster": "admin"}"#, false);
    let copy = RefCell::new(f.new_copy());
    exchange(&f, &copy, &h, "10.0.0.1:8080", &[(":status", "200")]);
    h.refuse_calls();
    f.tick(&copy, &h);
    assert_eq!(
        h.logs_containing("membership refresh from \"admin\" not sent")
            .len(),
        1
    );
    for m in [Metric::ConsumerInflight, Metric::ConsumerGeneration] {
        let h = MockHost::new();
        h.drop_metric(m);
        let err = ConsumerFilter::configure(&h, b"", false)
            .err()
            .unwrap_or_default();
        assert!(
            err.contains(m.name()) && err.contains("stats_matcher"),
            "{err}"
        );
    }
}
