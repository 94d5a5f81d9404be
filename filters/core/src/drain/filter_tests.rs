//! graceful_drain's callbacks through the mock host: every endpoint, the
//! tick, and the answers to its calls.

use std::cell::RefCell;
use std::time::Duration;

use super::*;
use crate::shared::mock::{MockAnswer, MockHost};

fn drain(h: &MockHost, json: &str) -> Drain {
    match Drain::configure(h, json.as_bytes()) {
        Ok(d) => d,
        Err(e) => panic!("configure: {e}"),
    }
}

/// A request from `source` to `method path`: the mock host as that stream.
fn request(h: &MockHost, method: &str, path: &str, source: &str) {
    h.set_map(Map::RequestHeaders, &[(":method", method), (":path", path)]);
    h.set_attribute(Attribute::SourceAddress, source);
    h.set_attribute(Attribute::DestinationAddress, "10.0.0.7:8080");
}

fn call(d: &Drain, st: &RefCell<DrainCopy>, h: &MockHost, method: &str, path: &str) -> Action {
    request(h, method, path, "127.0.0.1:5000");
    d.request_headers(st, h, || (7, ()))
}

fn only_reply(h: &MockHost) -> crate::shared::mock::SentReply {
    let mut replies = h.take_replies();
    assert_eq!(replies.len(), 1, "{replies:?}");
    replies.remove(0)
}

#[test]
fn app_requests_pass_untouched() {
    let h = MockHost::new();
    let (d, st) = (drain(&h, ""), state());
    assert_eq!(call(&d, &st, &h, "GET", "/orders"), Action::Continue);
    assert_eq!(
        call(&d, &st, &h, "GET", "/graceful/other"),
        Action::Continue
    );
    assert!(h.replies().is_empty());
}

#[test]
fn closing_from_an_allowed_source_starts_closing_once() {
    let h = MockHost::new();
    let (d, st) = (drain(&h, ""), state());
    assert_eq!(call(&d, &st, &h, "POST", "/graceful/closing"), Action::Stop);
    let r = only_reply(&h);
    assert_eq!(r.status, 202);
    assert_eq!(r.details, "graceful_drain");
    assert!(
        r.body_text().contains("\"phase\":\"closing\""),
        "{}",
        r.body_text()
    );
    assert_eq!(
        r.header(crate::shared::headers::ADDRESS),
        Some("10.0.0.7:8080")
    );
    assert_eq!(h.metric(Metric::DrainPhase), 1);
    assert_eq!(
        h.logs_containing("closing started by POST from 127.0.0.1")
            .len(),
        1
    );
    call(&d, &st, &h, "POST", "/graceful/closing");
    assert_eq!(only_reply(&h).status, 202);
    assert_eq!(h.logs_containing("closing started").len(), 1);
}

#[test]
fn closing_from_elsewhere_is_forbidden_and_changes_nothing() {
    let h = MockHost::new();
    let (d, st) = (drain(&h, ""), state());
    request(&h, "POST", "/graceful/closing", "192.168.1.5:40000");
    assert_eq!(d.request_headers(&st, &h, || (1, ())), Action::Stop);
    assert_eq!(only_reply(&h).status, 403);
    assert_eq!(
        h.logs_containing("closing refused: source 192.168.1.5:40000")
            .len(),
        1
    );
    assert_eq!(record::read(h.store()).map(|r| r.phase), Ok(Phase::Serving));
}

#[test]
fn a_403_says_only_forbidden_and_names_neither_the_instance_nor_the_address() {
    let h = MockHost::new();
    let (d, st) = (drain(&h, ""), state());
    // What graceful_provider publishes for the drain's answers.
    let identity = crate::shared::instance::encode_identity("x-graceful-instance", "pod-1");
    assert!(h
        .store()
        .set(crate::shared::keys::IDENTITY.name, &identity, 0)
        .is_ok());
    for (method, path) in [
        ("POST", "/graceful/closing"),
        ("GET", "/graceful/status"),
        ("GET", "/graceful/drained?wait=1h"),
    ] {
        request(&h, method, path, "192.168.1.5:40000");
        d.request_headers(&st, &h, || (1, ()));
        let r = only_reply(&h);
        assert_eq!((r.status, r.body_text().as_str()), (403, "forbidden"));
        assert_eq!(r.header("x-graceful-instance"), None, "{method} {path}");
        assert_eq!(r.header(crate::shared::headers::ADDRESS), None);
    }
    // An allowed caller's answer is stamped with both.
    call(&d, &st, &h, "GET", "/graceful/status");
    let r = only_reply(&h);
    assert_eq!(r.header("x-graceful-instance"), Some("pod-1"));
    assert_eq!(
        r.header(crate::shared::headers::ADDRESS),
        Some("10.0.0.7:8080")
    );
}

#[test]
fn outside_allowed_sources_only_readiness_and_grpc_health_answer_and_nothing_is_held() {
    let h = MockHost::new();
    let (d, st) = (drain(&h, r#"{"max_waiters": 1}"#), state());
    let outsider = "10.1.2.3:40000";
    for (method, path) in [
        ("GET", "/graceful/status"),
        ("GET", "/graceful/report"),
        ("GET", "/graceful/drained"),
        ("GET", "/graceful/drained?wait=1h"),
        ("POST", "/graceful/closing"),
    ] {
        request(&h, method, path, outsider);
        assert_eq!(d.request_headers(&st, &h, || (1, ())), Action::Stop);
        assert_eq!(only_reply(&h).status, 403, "{method} {path}");
    }
    assert_eq!(
        st.borrow().held(),
        0,
        "an outsider's long-poll is never held"
    );
    assert_eq!(
        h.logs_containing("refused").len(),
        1,
        "only the refused closing is logged"
    );
    // Readiness answers everyone.
    request(&h, "GET", "/graceful/ready", outsider);
    d.request_headers(&st, &h, || (1, ()));
    assert_eq!(only_reply(&h).status, 200);
    // The pod's own preStop (loopback) still gets the one waiter slot.
    call(&d, &st, &h, "POST", "/graceful/closing");
    assert_eq!(only_reply(&h).status, 202);
    assert_eq!(
        call(&d, &st, &h, "GET", "/graceful/drained?wait=30s"),
        Action::Stop
    );
    assert!(h.take_replies().is_empty(), "held");
    assert_eq!(st.borrow().held(), 1);
    // A forwarded-for from an outsider names no allowed source.
    h.set_map(
        Map::RequestHeaders,
        &[
            (":method", "GET"),
            (":path", "/graceful/report"),
            ("x-forwarded-for", "127.0.0.1"),
        ],
    );
    h.set_attribute(Attribute::SourceAddress, outsider);
    d.request_headers(&st, &h, || (2, ()));
    assert_eq!(only_reply(&h).status, 403);
}

#[test]
fn ready_and_grpc_health_follow_the_phase() {
    let h = MockHost::new();
    let (d, st) = (drain(&h, ""), state());
    call(&d, &st, &h, "GET", "/graceful/ready");
    let r = only_reply(&h);
    assert_eq!((r.status, r.body_text().as_str()), (200, "SERVING\n"));
    // While serving the app's own health service answers.
    assert_eq!(
        call(&d, &st, &h, "POST", "/grpc.health.v1.Health/Check"),
        Action::Continue
    );
    call(&d, &st, &h, "POST", "/graceful/closing");
    h.take_replies();
    call(&d, &st, &h, "GET", "/graceful/ready");
    assert_eq!(only_reply(&h).status, 503);
    assert_eq!(
        call(&d, &st, &h, "POST", "/grpc.health.v1.Health/Check"),
        Action::Stop
    );
    let g = only_reply(&h);
    assert_eq!(
        (g.grpc_status, g.body_text().as_str()),
        (Some(14), "NOT_SERVING")
    );
}

#[test]
fn wrong_methods_and_bad_queries_are_refused() {
    let h = MockHost::new();
    let (d, st) = (drain(&h, ""), state());
    call(&d, &st, &h, "GET", "/graceful/closing");
    let r = only_reply(&h);
    assert_eq!((r.status, r.header("allow")), (405, Some("POST")));
    call(&d, &st, &h, "GET", "/graceful/drained?wait=forever");
    assert_eq!(only_reply(&h).status, 400);
}

#[test]
fn status_and_drained_evaluate_the_gate_and_the_pass_is_owed_to_on_drained() {
    let h = MockHost::new();
    let json =
        r#"{"consumer_update_wait": "0s", "quiet_window": "0s", "on_drained": {"cluster": "app"}}"#;
    let (d, st) = (drain(&h, json), state());
    call(&d, &st, &h, "GET", "/graceful/drained");
    assert_eq!(only_reply(&h).status, 503);
    call(&d, &st, &h, "POST", "/graceful/closing");
    h.take_replies();
    // The endpoint itself passes the gate (nothing in flight, no wait) ...
    call(&d, &st, &h, "GET", "/graceful/status");
    let r = only_reply(&h);
    assert_eq!(r.status, 200);
    assert!(
        r.body_text().contains("\"drained\":true"),
        "{}",
        r.body_text()
    );
    assert_eq!(h.logs_containing("drain gate passed").len(), 1);
    assert_eq!(h.metric(Metric::DrainPhase), 2);
    call(&d, &st, &h, "GET", "/graceful/drained");
    assert_eq!(only_reply(&h).status, 200);
    // ... and the next tick tells the app, once.
    assert!(h.calls().is_empty());
    d.tick(&st, &h, |_, _| {});
    d.tick(&st, &h, |_, _| {});
    let calls = h.take_calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].cluster, "app");
    assert_eq!(calls[0].header(":method"), Some("POST"));
    assert!(String::from_utf8_lossy(&calls[0].body).contains("\"drained\":true"));
}

#[test]
fn a_pass_on_the_tick_calls_on_drained_and_a_failed_answer_is_counted() {
    let h = MockHost::new();
    let json = r#"{"consumer_update_wait": "0s", "quiet_window": "0s", "on_drained": {"cluster": "app", "path": "/bye"}}"#;
    let (d, st) = (drain(&h, json), state());
    call(&d, &st, &h, "POST", "/graceful/closing");
    d.tick(&st, &h, |_, _| {});
    let calls = h.take_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].header(":path"), Some("/bye"));
    d.call_answered(&st, &h, calls[0].token, &MockAnswer::failed());
    assert_eq!(h.metric(Metric::DrainCallbackFailed), 1);
    assert_eq!(
        h.logs_containing("on_drained callback failed: status none (no answer)")
            .len(),
        1
    );
    // A 2xx is no failure; an unknown token is ignored.
    d.call_answered(&st, &h, 99, &MockAnswer::failed());
    assert_eq!(h.metric(Metric::DrainCallbackFailed), 1);
}

#[test]
fn an_unsendable_callback_is_counted_and_logged() {
    let h = MockHost::new();
    let json = r#"{"consumer_update_wait": "0s", "quiet_window": "0s", "on_drained": {"cluster": "missing_app"}}"#;
    let (d, st) = (drain(&h, json), state());
    call(&d, &st, &h, "POST", "/graceful/closing");
    h.refuse_calls();
    d.tick(&st, &h, |_, _| {});
    assert_eq!(h.metric(Metric::DrainCallbackFailed), 1);
    assert_eq!(
        h.logs_containing("on_drained callback to cluster \"missing_app\" not sent")
            .len(),
        1
    );
}

#[test]
fn a_forced_pass_is_counted_and_warned() {
    let h = MockHost::new();
    let json = r#"{"consumer_update_wait": "0s", "quiet_window": "0s", "timeout": "1s"}"#;
    let (d, st) = (drain(&h, json), state());
    h.metric_add(Metric::ProviderInflight, 1);
    call(&d, &st, &h, "POST", "/graceful/closing");
    d.tick(&st, &h, |_, _| {});
    assert_eq!(h.metric(Metric::DrainPhase), 1);
    h.advance(Duration::from_secs(2));
    d.tick(&st, &h, |_, _| {});
    assert_eq!(h.metric(Metric::DrainForced), 1);
    let forced = h.logs_containing("drain gate forced");
    assert_eq!(forced.len(), 1);
    assert_eq!(forced[0].0, Level::Warn);
    assert_eq!(h.metric(Metric::DrainPassedTimeout), 1);
    assert_eq!(h.metric(Metric::DrainPassedQuiet), 0);
    assert_eq!(
        h.metric(Metric::DrainDrainedAfterMs),
        2000,
        "the report's drained_after_ms"
    );
    // The report names the timeout, in the log line and at its endpoint.
    let line = h.logs_containing("drain report: {");
    assert_eq!(line.len(), 1, "{:?}", h.logs());
    assert!(
        line[0].1.contains("\"forced_by\":\"timeout\""),
        "{}",
        line[0].1
    );
    h.take_replies();
    call(&d, &st, &h, "GET", "/graceful/report");
    let r = only_reply(&h);
    let v: serde_json::Value = serde_json::from_str(&r.body_text()).unwrap();
    assert_eq!((r.status, v["phase"].as_str()), (200, Some("drained")));
    assert_eq!(v["forced_by"], "timeout");
    assert_eq!(v["drained_after_ms"], 2000);
}

#[test]
fn the_report_names_the_late_callers_and_a_quiet_pass_says_so() {
    let h = MockHost::new();
    let json = r#"{"consumer_update_wait": "1s", "quiet_window": "0s", "max_report_peers": 1}"#;
    let (d, st) = (drain(&h, json), state());
    call(&d, &st, &h, "GET", "/graceful/report");
    let v: serde_json::Value = serde_json::from_str(&only_reply(&h).body_text()).unwrap();
    assert_eq!(v["phase"], "serving");
    call(&d, &st, &h, "POST", "/graceful/closing");
    h.take_replies();
    let since = record::read(h.store()).unwrap().closing_since_us;
    // What the providers merged: one caller stopped at once, one kept on.
    let mut pending = crate::drain::report::PendingReport::default();
    let peer = |a: &str| crate::drain::report::peers::PeerId::new(Some(a.as_bytes()), None);
    pending
        .peers
        .add(peer("10.0.0.1:1"), true, false, since + 10_000);
    pending
        .peers
        .add(peer("10.0.0.2:1"), true, false, since + 1_500_000);
    pending
        .peers
        .add(peer("10.0.0.2:1"), true, false, since + 1_600_000);
    pending.merge_into(h.store()).unwrap();
    h.advance(Duration::from_secs(2));
    d.tick(&st, &h, |_, _| {});
    assert_eq!(h.metric(Metric::DrainLatePeers), 1);
    assert_eq!(h.metric(Metric::DrainPassedQuiet), 1);
    call(&d, &st, &h, "GET", "/graceful/report");
    let v: serde_json::Value = serde_json::from_str(&only_reply(&h).body_text()).unwrap();
    assert_eq!(
        (v["forced"].clone(), v["forced_by"].clone()),
        (false.into(), serde_json::Value::Null)
    );
    assert_eq!(v["requests_after_closing"], 3);
    assert_eq!(v["peers"][0]["address"], "10.0.0.2");
    assert_eq!(v["peers_dropped"], 1);
    assert!(
        v["recommended"]["basis"]["consumer_update_wait"]
            .as_str()
            .is_some_and(|b| b.contains("10.0.0.1")),
        "{v}"
    );
}

#[test]
fn a_long_poll_is_held_then_woken_once_drained() {
    let h = MockHost::new();
    let json = r#"{"consumer_update_wait": "0s", "quiet_window": "0s"}"#;
    let (d, st) = (drain(&h, json), RefCell::new(DrainCopy::<char>::default()));
    h.metric_add(Metric::ProviderInflight, 1);
    request(&h, "GET", "/graceful/drained?wait=30s", "127.0.0.1:1");
    assert_eq!(d.request_headers(&st, &h, || (5, 'w')), Action::Stop);
    assert!(h.replies().is_empty());
    assert_eq!(st.borrow().held(), 1);
    let mut woken = Vec::new();
    assert!(d.tick(&st, &h, |id, w| woken.push((id, *w))).is_empty());
    request(&h, "POST", "/graceful/closing", "127.0.0.1:1");
    d.request_headers(&st, &h, || (6, 'x'));
    h.take_replies();
    d.tick(&st, &h, |id, w| woken.push((id, *w)));
    assert!(woken.is_empty());
    h.metric_add(Metric::ProviderInflight, -1);
    let due = d.tick(&st, &h, |id, w| woken.push((id, *w)));
    assert_eq!((due, woken), (vec![(5, 'w')], vec![(5, 'w')]));
    d.answer_woken(&st, &h, 5);
    assert_eq!(only_reply(&h).status, 200);
    // Its slot was freed when woken: ending the stream frees nothing more.
    d.release(&mut st.borrow_mut(), &h, 5);
    let waiters = h.store().get(keys::WAITERS.name).ok().flatten();
    assert_eq!(waiters.map(|(v, _)| v), Some(0u64.to_le_bytes().to_vec()));
}

#[test]
fn a_long_poll_past_its_wait_is_answered_503_and_a_gone_one_frees_its_slot() {
    let h = MockHost::new();
    let json = r#"{"max_waiters": 1}"#;
    let (d, st) = (drain(&h, json), state());
    request(&h, "GET", "/graceful/drained?wait=1s", "127.0.0.1:1");
    assert_eq!(d.request_headers(&st, &h, || (1, ())), Action::Stop);
    // The second is over max_waiters.
    assert_eq!(d.request_headers(&st, &h, || (2, ())), Action::Stop);
    assert_eq!(only_reply(&h).status, 429);
    h.advance(Duration::from_secs(2));
    assert_eq!(d.tick(&st, &h, |_, _| {}), vec![(1, ())]);
    d.answer_woken(&st, &h, 1);
    assert_eq!(only_reply(&h).status, 503);
    // A held stream that goes away frees its slot.
    assert_eq!(d.request_headers(&st, &h, || (3, ())), Action::Stop);
    d.release(&mut st.borrow_mut(), &h, 3);
    assert_eq!(st.borrow().held(), 0);
    assert_eq!(d.request_headers(&st, &h, || (4, ())), Action::Stop);
    assert_eq!(st.borrow().held(), 1);
}

#[test]
fn the_admin_poll_closes_on_draining_only_and_one_copy_polls_per_second() {
    let h = MockHost::new();
    let json = r#"{"admin_cluster": "admin"}"#;
    let d = drain(&h, json);
    let (a, b) = (state(), state());
    d.tick(&a, &h, |_, _| {});
    d.tick(&b, &h, |_, _| {});
    let calls = h.take_calls();
    assert_eq!(calls.len(), 1, "one copy holds the lease: {calls:?}");
    assert_eq!(calls[0].header(":path"), Some("/ready"));
    assert_eq!(calls[0].timeout, ADMIN_POLL_TIMEOUT);
    // Start-up's 503 is not DRAINING.
    d.call_answered(
        &a,
        &h,
        calls[0].token,
        &MockAnswer::status("503", "INITIALIZING"),
    );
    assert_eq!(record::read(h.store()).map(|r| r.phase), Ok(Phase::Serving));
    h.advance(ADMIN_POLL_INTERVAL);
    d.tick(&a, &h, |_, _| {});
    let calls = h.take_calls();
    assert_eq!(calls.len(), 1);
    d.call_answered(
        &a,
        &h,
        calls[0].token,
        &MockAnswer::status("503", "DRAINING\n"),
    );
    assert_eq!(record::read(h.store()).map(|r| r.phase), Ok(Phase::Closing));
    assert_eq!(h.metric(Metric::DrainPhase), 1);
    assert_eq!(
        h.logs_containing("Envoy admin /ready says DRAINING").len(),
        1
    );
    // No polls once closing.
    h.advance(ADMIN_POLL_INTERVAL);
    d.tick(&a, &h, |_, _| {});
    assert!(h.calls().iter().all(|c| c.cluster != "admin"));
}

#[test]
fn an_unsendable_admin_poll_is_logged_once_per_copy() {
    let h = MockHost::new();
    let d = drain(&h, r#"{"admin_cluster": "missing_admin"}"#);
    let st = state();
    h.refuse_calls();
    for _ in 0..3 {
        d.tick(&st, &h, |_, _| {});
        h.advance(ADMIN_POLL_INTERVAL);
    }
    assert_eq!(
        h.logs_containing("admin poll to cluster \"missing_admin\" not sent")
            .len(),
        1
    );
}

#[test]
fn a_bad_config_is_refused_naming_the_field() {
    let h = MockHost::new();
    let err = Drain::configure(&h, br#"{"max_waiters": -1}"#)
        .err()
        .unwrap_or_default();
    assert!(err.contains("max_waiters"), "{err}");
}

const WATCH: &str = "/grpc.health.v1.Health/Watch";

#[test]
fn a_watch_held_since_serving_is_told_at_closing_and_a_new_one_at_once() {
    let h = MockHost::new();
    let (d, st) = (drain(&h, ""), state());
    // Serving: the app answers each Watch; this copy keeps them.
    request(&h, "POST", WATCH, "10.0.0.9:4000");
    assert_eq!(d.request_headers(&st, &h, || (11, ())), Action::Continue);
    assert_eq!(d.request_headers(&st, &h, || (12, ())), Action::Continue);
    // One ends by itself.
    d.release(&mut st.borrow_mut(), &h, 12);
    let mut woken = Vec::new();
    assert!(d.tick(&st, &h, |id, w| woken.push((id, *w))).is_empty());
    assert!(h.replies().is_empty());
    call(&d, &st, &h, "POST", "/graceful/closing");
    h.take_replies();
    // The next tick wakes the kept one, once.
    let due = d.tick(&st, &h, |id, w| woken.push((id, *w)));
    assert_eq!((due, woken.clone()), (vec![(11, ())], vec![(11, ())]));
    assert!(d.tick(&st, &h, |id, w| woken.push((id, *w))).is_empty());
    assert_eq!(woken.len(), 1, "woken once");
    d.answer_woken(&st, &h, 11);
    let r = only_reply(&h);
    assert_eq!(
        (r.grpc_status, r.body_text().as_str()),
        (Some(14), "NOT_SERVING")
    );
    // A new Watch after closing: NOT_SERVING at once, the app never asked.
    request(&h, "POST", WATCH, "10.0.0.9:4001");
    assert_eq!(d.request_headers(&st, &h, || (13, ())), Action::Stop);
    assert_eq!(only_reply(&h).grpc_status, Some(14));
    // Other methods on the path are the app's.
    request(&h, "GET", WATCH, "10.0.0.9:4002");
    assert_eq!(d.request_headers(&st, &h, || (14, ())), Action::Continue);
    // Not a long-poll: the slot counter never moved.
    let waiters = h.store().get(keys::WAITERS.name).ok().flatten();
    assert_eq!(waiters.map(|(v, _)| v), Some(0u64.to_le_bytes().to_vec()));
}

#[test]
fn watches_past_the_bound_go_to_the_app_unkept() {
    let h = MockHost::new();
    let (d, st) = (drain(&h, ""), state());
    request(&h, "POST", WATCH, "10.0.0.9:4000");
    for id in 0..MAX_WATCHES as u32 + 5 {
        assert_eq!(d.request_headers(&st, &h, || (id, ())), Action::Continue);
    }
    call(&d, &st, &h, "POST", "/graceful/closing");
    h.take_replies();
    assert_eq!(d.tick(&st, &h, |_, _| {}).len(), MAX_WATCHES);
}

/// The drain's calls to the admin cluster `admin` other than `/ready`.
fn close_calls(h: &MockHost) -> Vec<crate::shared::mock::SentCall> {
    h.take_calls()
        .into_iter()
        .filter(|c| c.cluster == "admin" && c.header(":path") != Some("/ready"))
        .collect()
}

#[test]
fn closing_tells_the_connections_to_close_through_the_admin_once() {
    let h = MockHost::new();
    let d = drain(&h, r#"{"admin_cluster": "admin"}"#);
    let (a, b) = (state(), state());
    call(&d, &a, &h, "POST", "/graceful/closing");
    assert_eq!(only_reply(&h).status, 202);
    // The copy that started closing calls at its next tick; another copy
    // never does.
    d.tick(&b, &h, |_, _| {});
    assert_eq!(close_calls(&h), Vec::new());
    d.tick(&a, &h, |_, _| {});
    let calls = close_calls(&h);
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].header(":method"), Some("POST"));
    assert_eq!(calls[0].header(":path"), Some("/healthcheck/fail"));
    assert_eq!(calls[0].timeout, CLOSE_CALL_TIMEOUT);
    // Nothing more while it is in flight, nor once answered.
    h.advance(CLOSE_RETRY);
    d.tick(&a, &h, |_, _| {});
    assert_eq!(close_calls(&h), Vec::new());
    d.call_answered(&a, &h, calls[0].token, &MockAnswer::status("200", "OK\n"));
    assert_eq!(
        h.logs_containing("connections told to close: admin POST /healthcheck/fail: 200")
            .len(),
        1
    );
    for _ in 0..3 {
        h.advance(CLOSE_RETRY);
        d.tick(&a, &h, |_, _| {});
        d.tick(&b, &h, |_, _| {});
    }
    assert_eq!(close_calls(&h), Vec::new());
}

#[test]
fn a_failed_close_call_is_tried_again_a_second_later_and_logged_once() {
    let h = MockHost::new();
    let d = drain(&h, r#"{"admin_cluster": "admin"}"#);
    let st = state();
    call(&d, &st, &h, "POST", "/graceful/closing");
    d.tick(&st, &h, |_, _| {});
    for answer in [MockAnswer::status("503", ""), MockAnswer::failed()] {
        let calls = close_calls(&h);
        assert_eq!(calls.len(), 1, "{calls:?}");
        d.call_answered(&st, &h, calls[0].token, &answer);
        d.tick(&st, &h, |_, _| {});
        assert_eq!(close_calls(&h), Vec::new(), "not before {CLOSE_RETRY:?}");
        h.advance(CLOSE_RETRY);
        d.tick(&st, &h, |_, _| {});
    }
    let calls = close_calls(&h);
    assert_eq!(calls.len(), 1, "{calls:?}");
    d.call_answered(&st, &h, calls[0].token, &MockAnswer::status("200", ""));
    assert_eq!(
        h.logs_containing("connections not told to close yet").len(),
        1
    );
    assert_eq!(h.logs_containing("connections told to close:").len(), 1);
    h.advance(CLOSE_RETRY);
    d.tick(&st, &h, |_, _| {});
    assert_eq!(close_calls(&h), Vec::new());
}

/// Starts closing the way the admin does (its poll answered DRAINING: Envoy's
/// `/healthcheck/fail`) or by `POST /graceful/closing`.
fn start_closing(d: &Drain, st: &RefCell<DrainCopy>, h: &MockHost, by_admin: bool) {
    if by_admin {
        d.tick(st, h, |_, _| {});
        let poll = h.take_calls();
        d.call_answered(st, h, poll[0].token, &MockAnswer::status("503", "DRAINING"));
    } else {
        call(d, st, h, "POST", "/graceful/closing");
    }
}

#[test]
fn drain_listeners_starts_a_graceful_inbound_drain_that_keeps_the_listeners() {
    for started_by_admin in [false, true] {
        let h = MockHost::new();
        let d = drain(
            &h,
            r#"{"admin_cluster": "admin", "close_connections": "drain_listeners"}"#,
        );
        let st = state();
        // Envoy's /healthcheck/fail does not drain MODIFY_ONLY listeners:
        // started by the admin, the drain is still owed.
        start_closing(&d, &st, &h, started_by_admin);
        d.tick(&st, &h, |_, _| {});
        let calls = close_calls(&h);
        assert_eq!(
            calls.len(),
            1,
            "started by admin {started_by_admin}: {calls:?}"
        );
        assert_eq!(
            calls[0].header(":path"),
            Some("/drain_listeners?graceful&skip_exit&inboundonly")
        );
    }
}

#[test]
fn no_close_call_when_off_without_an_admin_or_when_envoy_started_it() {
    // (config, closing started by the admin's DRAINING)
    let cases = [
        (
            r#"{"admin_cluster": "admin", "close_connections": "off"}"#,
            false,
        ),
        ("", false),
        // /healthcheck/fail closed the connections already.
        (r#"{"admin_cluster": "admin"}"#, true),
    ];
    for (config, by_admin) in cases {
        let h = MockHost::new();
        let d = drain(&h, config);
        let st = state();
        start_closing(&d, &st, &h, by_admin);
        assert_eq!(h.metric(Metric::DrainPhase), 1, "{config}: closing");
        for _ in 0..3 {
            d.tick(&st, &h, |_, _| {});
            h.advance(CLOSE_RETRY);
        }
        assert_eq!(h.take_calls(), Vec::new(), "{config}");
    }
}

#[test]
fn close_connections_is_refused_without_the_admin_it_goes_through() {
    let h = MockHost::new();
    for (config, reason) in [
        (
            r#"{"close_connections": "healthcheck_fail"}"#,
            "needs admin_cluster",
        ),
        (
            r#"{"admin_cluster": "admin", "close_connections": "on"}"#,
            "is not one of",
        ),
    ] {
        let err = Drain::configure(&h, config.as_bytes())
            .err()
            .unwrap_or_default();
        assert!(
            err.contains("close_connections") && err.contains(reason),
            "{config}: {err}"
        );
    }
}

fn state() -> RefCell<DrainCopy> {
    RefCell::new(DrainCopy::default())
}

#[test]
fn an_unreachable_timeout_is_named_once_per_envoy_and_again_for_another_config() {
    let h = MockHost::new();
    let unreachable = |h: &MockHost| h.logs_containing("is never reached").len();
    drain(&h, "{}");
    assert_eq!(unreachable(&h), 1, "the defaults: 60s after 3s + 3s");
    assert!(h.logs_containing("timeout 1m is never reached")[0]
        .1
        .contains("set longest_request"));
    drain(&h, "{}");
    assert_eq!(
        unreachable(&h),
        1,
        "a second copy of the same config says nothing"
    );
    drain(&h, r#"{"timeout": "10s"}"#);
    assert_eq!(unreachable(&h), 2, "another config names its own");
    drain(&h, r#"{"timeout": "6s"}"#);
    drain(&h, r#"{"longest_request": "10s"}"#);
    assert_eq!(unreachable(&h), 2, "reachable: nothing to name");
}
