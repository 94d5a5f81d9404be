//! The front role through the mock host: who is answered, what the table
//! becomes, and the held long-polls.

use std::cell::RefCell;
use std::time::Duration;

use super::*;
use crate::shared::mock::{MockAnswer, MockHost, SentReply};

const FRONT: &str = r#"{"admin_cluster":"admin","front":{"serve_endpoints":true,"max_waiters":1}}"#;
const HOST: &str = "10.0.0.7";

struct Front {
    h: MockHost,
    f: ConsumerFilter,
    copy: RefCell<ConsumerCopy>,
    front: RefCell<FrontCopy>,
}

fn front(json: &str, upstream: bool) -> Front {
    let h = MockHost::new();
    let f = match ConsumerFilter::configure(&h, json.as_bytes(), upstream) {
        Ok(f) => f,
        Err(e) => panic!("configure: {e}"),
    };
    let copy = RefCell::new(f.new_copy());
    Front {
        h,
        f,
        copy,
        front: RefCell::default(),
    }
}

fn ip(text: &str) -> Ipv6Addr {
    host_ip(text.parse().unwrap())
}

impl Front {
    /// A request from `source` (`ip:port`); the reply sent, if any, and
    /// what the filter said.
    fn ask(&self, method: &str, path: &str, source: &str) -> (Option<Action>, Option<SentReply>) {
        self.h.take_replies();
        self.h
            .set_map(Map::RequestHeaders, &[(":method", method), (":path", path)]);
        self.h.set_attribute(Attribute::SourceAddress, source);
        let next = self
            .f
            .front_request_headers(&self.front, &self.copy, &self.h, || (7, ()));
        (next, self.h.take_replies().pop())
    }

    fn asked_by_host(&self, method: &str, path: &str) -> SentReply {
        match self.ask(method, path, &format!("{HOST}:41000")) {
            (Some(Action::Stop), Some(reply)) => reply,
            other => panic!("{method} {path}: {other:?}"),
        }
    }

    /// Writes `events` about `host` into the table, as a tick would.
    fn write(&self, host: &str, events: &[Event]) {
        let fc = self.f.config().front.unwrap();
        let events: Vec<(Ipv6Addr, Event)> = events.iter().map(|e| (ip(host), *e)).collect();
        write_events(self.h.store(), &events, self.h.now_us(), &fc).unwrap();
    }

    /// The table in shared data.
    fn table(&self) -> FrontHosts {
        let (bytes, _) = self.h.store().get(FRONT_HOSTS.name).unwrap().unwrap();
        FrontHosts::decode(&bytes).unwrap()
    }

    fn tick(&self) -> Vec<u32> {
        self.f
            .front_tick(&self.front, &self.copy, &self.h, |_, _| {})
            .into_iter()
            .map(|(id, ())| id)
            .collect()
    }

    /// The host as the admin lists it `DRAINING`: known to the front.
    fn draining(&self) {
        self.write(HOST, &[Event::Listed(Health::Draining)]);
    }

    /// The host closing, steered, then read idle twice a poll apart.
    fn acknowledged(&self) {
        let idle = Event::Read {
            active: Some(0),
            guard_clear: true,
        };
        self.write(
            HOST,
            &[
                Event::Listed(Health::Draining),
                Event::Steered { epoch: 0 },
                idle,
            ],
        );
        self.h.advance(Duration::from_millis(100));
        self.write(HOST, &[idle]);
    }
}

fn json(reply: &SentReply) -> serde_json::Value {
    serde_json::from_slice(&reply.body).unwrap()
}

#[test]
fn the_front_keys_exist_only_where_the_listener_instance_has_front() {
    let with = front(FRONT, false);
    assert_eq!(with.table(), FrontHosts::default());
    for key in [FRONT_HOSTS_GEN, FRONT_POLL_LEASE, FRONT_WAITERS] {
        assert!(
            with.h.store().get(key.name).unwrap().is_some(),
            "{}",
            key.name
        );
    }
    for (json, upstream) in [("", false), (FRONT, true)] {
        let without = front(json, upstream);
        assert_eq!(without.h.store().get(FRONT_HOSTS.name).unwrap(), None);
        // The upstream instance accepts `front` and ignores it: no
        // endpoint, no tick.
        assert_eq!(
            without.ask("POST", "/graceful/front/closing", "10.0.0.7:41000"),
            (None, None)
        );
        assert!(without.tick().is_empty());
        assert!(without.h.calls().is_empty());
    }
}

#[test]
fn no_endpoint_is_answered_without_serve_endpoints() {
    let f = front(r#"{"admin_cluster":"admin","front":{}}"#, false);
    for (m, p) in [
        ("POST", "/graceful/front/closing"),
        ("GET", "/graceful/front/drained?wait=1s"),
        ("POST", "/graceful/front/serving"),
        ("GET", "/graceful/front/status"),
    ] {
        assert_eq!(f.ask(m, p, "10.0.0.7:41000"), (None, None), "{m} {p}");
    }
    assert_eq!(f.h.metric(Metric::FrontRefused), 0);
}

#[test]
fn other_paths_pass_on_as_today() {
    let f = front(FRONT, false);
    for p in ["/", "/graceful/closing", "/graceful/front/x"] {
        assert_eq!(f.ask("POST", p, "10.0.0.7:41000"), (None, None), "{p}");
    }
}

#[test]
fn a_forwarded_address_a_non_member_and_another_host_are_refused_and_change_nothing() {
    let f = front(FRONT, false);
    f.draining();
    let before = f.table();
    // Port 0: Envoy took the address from x-forwarded-for.
    let forwarded = f
        .ask("POST", "/graceful/front/closing", "10.0.0.7:0")
        .1
        .unwrap();
    assert_eq!(
        (forwarded.status, json(&forwarded)["refused"].as_str()),
        (403, Some("untrusted_peer"))
    );
    // The peer equal to the last x-forwarded-for entry, port and all.
    f.h.set_attribute(Attribute::SourceAddress, "10.0.0.7:41000");
    f.h.set_request_header("x-forwarded-for", "10.0.0.7:41000");
    let spoofed =
        f.f.front_request_headers(&f.front, &f.copy, &f.h, || (7, ()));
    assert_eq!(spoofed, Some(Action::Stop));
    assert_eq!(f.h.take_replies().pop().unwrap().status, 403);
    let stranger = f
        .ask("POST", "/graceful/front/closing", "10.9.9.9:41000")
        .1
        .unwrap();
    assert_eq!(
        (stranger.status, json(&stranger)["refused"].as_str()),
        (403, Some("not_a_member"))
    );
    let other = f
        .ask(
            "POST",
            "/graceful/front/closing?host=10.0.0.8",
            "10.0.0.7:41000",
        )
        .1
        .unwrap();
    assert_eq!(
        (other.status, json(&other)["refused"].as_str()),
        (403, Some("not_your_address"))
    );
    assert_eq!(f.h.metric(Metric::FrontRefused), 4);
    assert_eq!(f.table(), before, "nothing written");
    assert_eq!(f.h.logs_containing("refused").len(), 1, "one line a minute");
}

#[test]
fn closing_from_a_known_host_answers_202_and_writes_the_table() {
    let f = front(FRONT, false);
    f.draining();
    let gen = read_key_u64(f.h.store(), FRONT_HOSTS_GEN.name);
    let reply = f.asked_by_host("POST", "/graceful/front/closing?host=10.0.0.7");
    assert_eq!(reply.status, 202);
    let body = json(&reply);
    assert_eq!(body["state"], "closing");
    assert_eq!(body["source"], serde_json::json!(["host", "draining"]));
    assert_eq!(body["late"], 0);
    let entry = f.table().get(ip(HOST)).cloned().unwrap();
    assert_eq!(
        entry.sources,
        crate::consumer::front::source::HOST | crate::consumer::front::source::DRAINING
    );
    assert!(
        read_key_u64(f.h.store(), FRONT_HOSTS_GEN.name) > gen,
        ".gen bumped"
    );
    assert_eq!(f.h.metric(Metric::FrontClosing), 1);
    // Idempotent.
    assert_eq!(
        f.asked_by_host("POST", "/graceful/front/closing").status,
        202
    );
    assert_eq!(f.table().hosts().len(), 1);
}

#[test]
fn drained_answers_409_when_serving_and_holds_until_acknowledged() {
    let f = front(FRONT, false);
    f.draining();
    let status = f.asked_by_host("GET", "/graceful/front/status");
    assert_eq!(
        (status.status, json(&status)["state"].as_str()),
        (200, Some("closing"))
    );
    // No wait: 503 with the status.
    assert_eq!(
        f.asked_by_host("GET", "/graceful/front/drained").status,
        503
    );
    let held = f.ask("GET", "/graceful/front/drained?wait=10s", "10.0.0.7:41000");
    assert_eq!(held, (Some(Action::Stop), None), "held");
    assert_eq!(f.front.borrow().held(), 1);
    assert!(f.tick().is_empty(), "not acknowledged yet");
    f.acknowledged();
    assert_eq!(f.tick(), [7]);
    f.f.front_answer_woken(&f.front, &f.h, 7);
    let reply = f.h.take_replies().pop().unwrap();
    assert_eq!(reply.status, 200);
    let body = json(&reply);
    assert_eq!(body["state"], "acknowledged");
    assert_eq!(body["inflight_at_closing"], 0);
    assert_eq!(body["steered_after_ms"], 0);
    assert_eq!(body["last_active_ms"], 0);
    assert_eq!(body["late"], 0);
    assert_eq!(read_key_u64(f.h.store(), FRONT_WAITERS.name), Some(0));
    // Acknowledged already: answered at once.
    assert_eq!(
        f.asked_by_host("GET", "/graceful/front/drained?wait=10s")
            .status,
        200
    );
}

#[test]
fn a_held_long_poll_gets_503_at_its_wait_and_429_past_max_waiters() {
    let f = front(FRONT, false);
    f.draining();
    assert_eq!(
        f.ask("GET", "/graceful/front/drained?wait=1s", "10.0.0.7:41000"),
        (Some(Action::Stop), None)
    );
    let over = f.asked_by_host("GET", "/graceful/front/drained?wait=1s");
    assert_eq!(
        (over.status, json(&over)["refused"].as_str()),
        (429, Some("too_many_waiters"))
    );
    f.h.advance(Duration::from_secs(1));
    assert_eq!(f.tick(), [7]);
    f.f.front_answer_woken(&f.front, &f.h, 7);
    let reply = f.h.take_replies().pop().unwrap();
    assert_eq!(reply.status, 503);
    // Closing, or steered if the poll found an acceptable host elsewhere.
    assert!(matches!(
        json(&reply)["state"].as_str(),
        Some("closing" | "steered")
    ));
    // A client that went away frees its slot.
    f.ask("GET", "/graceful/front/drained?wait=1s", "10.0.0.7:41000");
    f.f.front_release(&mut f.front.borrow_mut(), &f.h, 7);
    assert_eq!(read_key_u64(f.h.store(), FRONT_WAITERS.name), Some(0));
}

#[test]
fn serving_lifts_the_host_and_answers_a_held_poll_409() {
    let f = front(FRONT, false);
    f.draining();
    f.ask("GET", "/graceful/front/drained?wait=10s", "10.0.0.7:41000");
    let reply = f.asked_by_host("POST", "/graceful/front/serving");
    assert_eq!(
        (reply.status, json(&reply)["state"].as_str()),
        (202, Some("serving"))
    );
    assert_eq!(f.table(), FrontHosts::default());
    assert_eq!(f.h.metric(Metric::FrontClosing), 0);
    assert_eq!(f.tick(), [7]);
    f.f.front_answer_woken(&f.front, &f.h, 7);
    assert_eq!(f.h.take_replies().pop().unwrap().status, 409);
    // Not known any more: a non-member again.
    assert_eq!(
        f.asked_by_host("GET", "/graceful/front/drained").status,
        403
    );
}

#[test]
fn wrong_methods_and_bad_parameters_are_answered_not_forwarded() {
    let f = front(FRONT, false);
    let m = f.asked_by_host("GET", "/graceful/front/closing");
    assert_eq!((m.status, m.header("allow")), (405, Some("POST")));
    assert_eq!(
        f.asked_by_host("GET", "/graceful/front/drained?wait=10")
            .status,
        400
    );
}

#[test]
fn the_lease_holder_asks_clusters_while_a_host_is_not_acknowledged() {
    let f = front(FRONT, false);
    f.tick();
    assert!(f.h.calls().is_empty(), "nothing closing: no call");
    f.draining();
    f.h.advance(Duration::from_millis(100));
    f.tick();
    let calls = f.h.take_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].cluster, "admin");
    assert!(calls[0]
        .header(":path")
        .unwrap()
        .starts_with("/clusters?format=json"));
    // One call in flight at a time; the lease keeps the next poll a poll away.
    f.tick();
    assert!(f.h.calls().is_empty());
    let token = calls[0].token;
    let answered = f.f.front_call_answered(
        &f.front,
        &f.copy,
        &f.h,
        token,
        &MockAnswer::status("200", r#"{"cluster_statuses":[]}"#),
    );
    assert!(answered);
    assert!(!f
        .f
        .front_call_answered(&f.front, &f.copy, &f.h, token, &MockAnswer::failed()));
}

#[test]
fn a_late_read_counts_and_an_acknowledgement_is_counted_once() {
    let f = front(FRONT, false);
    let idle = Event::Read {
        active: Some(0),
        guard_clear: true,
    };
    let fc = f.f.config().front.unwrap();
    f.draining();
    let events = [(ip(HOST), Event::Steered { epoch: 0 }), (ip(HOST), idle)];
    f.f.front_write(&fc, &f.front, &f.copy, &f.h, &events, f.h.now_us())
        .unwrap();
    f.h.advance(Duration::from_millis(100));
    f.f.front_write(
        &fc,
        &f.front,
        &f.copy,
        &f.h,
        &[(ip(HOST), idle)],
        f.h.now_us(),
    )
    .unwrap();
    assert_eq!(f.h.metric(Metric::FrontAcknowledged), 1);
    let busy = Event::Read {
        active: Some(2),
        guard_clear: true,
    };
    f.f.front_write(
        &fc,
        &f.front,
        &f.copy,
        &f.h,
        &[(ip(HOST), busy)],
        f.h.now_us(),
    )
    .unwrap();
    assert_eq!(f.h.metric(Metric::FrontLate), 1);
    assert_eq!(f.table().get(ip(HOST)).unwrap().late, 1);
    assert_eq!(f.h.logs_containing("acknowledged").len(), 1);
}

const CLUSTER: &str = "outbound|8080||backend";

/// `/clusters` listing 10.0.0.7 and 10.0.0.8 in [`CLUSTER`], 10.0.0.7
/// with `active` requests in flight (absent at 0, as Envoy omits it).
fn clusters(active: u32) -> String {
    let stats = if active > 0 {
        format!(r#", "stats": [{{"name": "rq_active", "value": "{active}"}}]"#)
    } else {
        String::new()
    };
    format!(
        r#"{{"cluster_statuses": [{{"name": "{CLUSTER}", "host_statuses": [
            {{"address": {{"socket_address": {{"address": "10.0.0.7", "port_value": 8080}}}}{stats}}},
            {{"address": {{"socket_address": {{"address": "10.0.0.8", "port_value": 8080}}}}}}]}}]}}"#
    )
}

impl Front {
    /// One request routed to [`CLUSTER`]; the override list it was given.
    fn route_one(&self) -> Option<String> {
        let st = crate::consumer::filter::ConsumerStream::default();
        self.h.set_map(Map::RequestHeaders, &[(":path", "/")]);
        self.h.set_attribute(Attribute::ClusterName, CLUSTER);
        self.f.request_headers(&self.copy, &st, &self.h);
        let list = self
            .h
            .header_text(Map::RequestHeaders, "x-graceful-override-host");
        // An answer: the cluster is recorded as routed to.
        self.h
            .set_attribute(Attribute::UpstreamAddress, "10.0.0.8:8080");
        self.h.set_map(Map::ResponseHeaders, &[(":status", "200")]);
        self.f.response_headers(&self.copy, &st, &self.h);
        self.f.stream_end(&st, &self.h);
        list
    }

    /// The consumer's membership refresh, answered with [`clusters`].
    fn refresh_membership(&self) {
        self.h.advance(Duration::from_secs(1));
        self.f.tick(&self.copy, &self.h);
        let calls = self.h.take_calls();
        let admin = calls.iter().find(|c| c.cluster == "admin").unwrap();
        self.f.call_answered(
            &self.copy,
            &self.h,
            admin.token,
            &MockAnswer::status("200", &clusters(0)),
        );
    }

    /// The front's tick a poll later, its `/clusters` answered with
    /// `active` requests in flight at the host.
    fn poll(&self, active: u32) -> Vec<u32> {
        self.h.advance(Duration::from_millis(100));
        let woken = self.tick();
        for call in self.h.take_calls() {
            let answer = MockAnswer::status("200", &clusters(active));
            let f = &self.f;
            assert!(f.front_call_answered(&self.front, &self.copy, &self.h, call.token, &answer));
        }
        woken
    }
}

/// The whole role over the consumer's real decisions: a member closes,
/// every request is steered away at once, its long-poll is held while a
/// request is in flight to it, answered 200 two idle reads a poll apart.
#[test]
fn a_member_closes_is_steered_away_from_and_acknowledged_once_idle() {
    let f = front(FRONT, false);
    f.route_one();
    f.refresh_membership();
    let reply = f.asked_by_host("POST", "/graceful/front/closing");
    assert_eq!(reply.status, 202, "{}", reply.body_text());
    assert_eq!(json(&reply)["source"], serde_json::json!(["host"]));
    assert_eq!(
        f.route_one().as_deref(),
        Some("10.0.0.8:8080"),
        "steered away"
    );
    assert!(f.h.metric(Metric::ConsumerTombstones) >= 1);
    f.ask("GET", "/graceful/front/drained?wait=10s", "10.0.0.7:41000");
    assert!(f.poll(2).is_empty(), "2 in flight");
    assert_eq!(f.table().get(ip(HOST)).unwrap().state, State::Steered);
    assert!(f.poll(0).is_empty(), "one idle read");
    f.poll(0);
    let woken = f.poll(0);
    assert_eq!(woken, [7], "{:?}", f.table());
    f.f.front_answer_woken(&f.front, &f.h, 7);
    let reply = f.h.take_replies().pop().unwrap();
    assert_eq!(reply.status, 200);
    let body = json(&reply);
    assert_eq!(body["inflight_at_closing"], 2);
    assert_eq!(body["late"], 0);
    assert_eq!(f.h.metric(Metric::FrontAcknowledged), 1);
    // Serving again: readmitted, its share back.
    assert_eq!(
        f.asked_by_host("POST", "/graceful/front/serving").status,
        202
    );
    assert_eq!(f.h.metric(Metric::ConsumerReadmitted), 1);
}

#[test]
fn a_member_listed_draining_closes_without_any_request() {
    let f = front(FRONT, false);
    f.route_one();
    f.refresh_membership();
    f.h.advance(Duration::from_secs(1));
    f.f.tick(&f.copy, &f.h);
    let calls = f.h.take_calls();
    let admin = calls.iter().find(|c| c.cluster == "admin").unwrap();
    let draining = clusters(0).replace(
        r#""port_value": 8080}}}"#,
        r#""port_value": 8080}}, "health_status": {"eds_health_status": "DRAINING"}}"#,
    );
    f.f.call_answered(
        &f.copy,
        &f.h,
        admin.token,
        &MockAnswer::status("200", &draining),
    );
    f.poll(0);
    let entry = f.table().get(ip(HOST)).cloned();
    assert!(entry.is_some_and(|e| e.sources & crate::consumer::front::source::DRAINING != 0));
}

/// The upstream instance on the same Envoy (shared data and stats): its
/// filter and copy.
fn upstream_on(f: &Front, json: &str) -> (ConsumerFilter, RefCell<ConsumerCopy>) {
    let up = match ConsumerFilter::configure(&f.h, json.as_bytes(), true) {
        Ok(up) => up,
        Err(e) => panic!("configure: {e}"),
    };
    let copy = RefCell::new(up.new_copy());
    (up, copy)
}

/// One attempt of the upstream instance at `address`: what it said, and
/// the reply it sent.
fn attempt(
    f: &Front,
    up: &ConsumerFilter,
    copy: &RefCell<ConsumerCopy>,
    address: &str,
) -> (Action, Option<SentReply>) {
    f.h.take_replies();
    let st = crate::consumer::filter::ConsumerStream::default();
    f.h.set_map(Map::RequestHeaders, &[(":path", "/")]);
    f.h.set_attribute(Attribute::ClusterName, CLUSTER);
    f.h.set_attribute(Attribute::UpstreamAddress, address);
    let next = up.request_headers(copy, &st, &f.h);
    (next, f.h.take_replies().pop())
}

const UPSTREAM_FRONT: &str = r#"{"admin_cluster":"admin","front":{}}"#;

/// The upstream instance lets every attempt go (a local reply there would
/// reach the client unretried), and counts one at an acknowledged host
/// late.
#[test]
fn the_upstream_instance_lets_an_attempt_at_a_closing_host_go_and_counts_a_late_one() {
    let f = front(FRONT, false);
    f.route_one();
    f.refresh_membership();
    let (up, ucopy) = upstream_on(&f, UPSTREAM_FRONT);
    let go = (Action::Continue, None);
    assert_eq!(attempt(&f, &up, &ucopy, "10.0.0.7:8080"), go);
    assert_eq!(
        f.asked_by_host("POST", "/graceful/front/closing").status,
        202
    );
    assert_eq!(attempt(&f, &up, &ucopy, "10.0.0.7:8080"), go);
    assert_eq!(f.h.metric(Metric::FrontLate), 0, "not acknowledged yet");
    assert_eq!(f.table().get(ip(HOST)).unwrap().late, 0);
    // Acknowledged: an attempt there is late.
    let idle = Event::Read {
        active: Some(0),
        guard_clear: true,
    };
    f.write(HOST, &[Event::Steered { epoch: 1 }, idle]);
    f.h.advance(Duration::from_millis(100));
    f.write(HOST, &[idle]);
    assert_eq!(f.table().get(ip(HOST)).unwrap().state, State::Acknowledged);
    assert_eq!(attempt(&f, &up, &ucopy, "10.0.0.7:8080"), go);
    assert_eq!(f.h.metric(Metric::FrontLate), 1);
    assert_eq!(f.table().get(ip(HOST)).unwrap().late, 1);
    assert_eq!(attempt(&f, &up, &ucopy, "10.0.0.8:8080"), go);
    assert_eq!(f.h.metric(Metric::FrontLate), 1, "another host: not late");
    // Without `front` the upstream instance counts nothing.
    let (plain, pcopy) = upstream_on(&f, r#"{"admin_cluster":"admin"}"#);
    assert_eq!(attempt(&f, &plain, &pcopy, "10.0.0.7:8080"), go);
    assert_eq!(f.h.metric(Metric::FrontLate), 1);
}

#[test]
fn an_attempt_at_an_acknowledged_host_listed_draining_is_late() {
    let f = front(FRONT, false);
    f.route_one();
    let (up, ucopy) = upstream_on(&f, UPSTREAM_FRONT);
    f.h.advance(Duration::from_secs(1));
    f.f.tick(&f.copy, &f.h);
    let calls = f.h.take_calls();
    let admin = calls.iter().find(|c| c.cluster == "admin").unwrap();
    let draining = clusters(0).replacen(
        r#""port_value": 8080}}}"#,
        r#""port_value": 8080}}, "health_status": {"eds_health_status": "DRAINING"}}"#,
        1,
    );
    f.f.call_answered(
        &f.copy,
        &f.h,
        admin.token,
        &MockAnswer::status("200", &draining),
    );
    f.acknowledged();
    assert_eq!(
        attempt(&f, &up, &ucopy, "10.0.0.7:8080"),
        (Action::Continue, None)
    );
    assert_eq!(f.h.metric(Metric::FrontLate), 1);
}

impl Front {
    /// A request of the listener instance started and not answered yet.
    fn start(&self) -> crate::consumer::filter::ConsumerStream {
        let st = crate::consumer::filter::ConsumerStream::default();
        self.h.set_map(Map::RequestHeaders, &[(":path", "/")]);
        self.h.set_attribute(Attribute::ClusterName, CLUSTER);
        self.f.request_headers(&self.copy, &st, &self.h);
        st
    }

    /// Its response headers, from `address`, then its end.
    fn answer(&self, st: &crate::consumer::filter::ConsumerStream, address: &str) {
        self.h.set_attribute(Attribute::UpstreamAddress, address);
        self.h.set_map(Map::ResponseHeaders, &[(":status", "200")]);
        self.f.response_headers(&self.copy, st, &self.h);
        self.f.stream_end(st, &self.h);
    }

    fn state(&self) -> State {
        self.table().get(ip(HOST)).unwrap().state
    }
}

#[test]
fn the_acknowledgement_waits_for_the_requests_started_before_the_steering() {
    let f = front(FRONT, false);
    f.route_one();
    f.refresh_membership();
    let slow = f.start();
    assert_eq!(f.h.metric(Metric::FrontAwaiting0), 1);
    assert_eq!(
        f.asked_by_host("POST", "/graceful/front/closing").status,
        202
    );
    for _ in 0..4 {
        f.poll(0);
    }
    assert_eq!(f.state(), State::Steered, "{:?}", f.table());
    assert_eq!(f.table().get(ip(HOST)).unwrap().epoch, 1);
    assert_eq!(f.h.metric(Metric::FrontEpoch), 1);
    // A request after the steering is in the other slot: not waited for.
    let after = f.start();
    assert_eq!(f.h.metric(Metric::FrontAwaiting1), 1);
    f.answer(&slow, "10.0.0.7:8080");
    f.f.stream_end(&slow, &f.h);
    assert_eq!(f.h.metric(Metric::FrontAwaiting0), 0, "out once");
    f.poll(0);
    assert_eq!(f.state(), State::Acknowledged, "{:?}", f.table());
    f.answer(&after, "10.0.0.8:8080");
    assert_eq!(f.h.metric(Metric::FrontAwaiting1), 0);
}

#[test]
fn an_upstream_instance_does_not_make_the_acknowledgement_skip_the_grace_count() {
    let f = front(FRONT, false);
    f.route_one();
    f.refresh_membership();
    let _upstream = upstream_on(&f, UPSTREAM_FRONT);
    let slow = f.start();
    assert_eq!(
        f.asked_by_host("POST", "/graceful/front/closing").status,
        202
    );
    for _ in 0..4 {
        f.poll(0);
    }
    assert_eq!(f.state(), State::Steered, "{:?}", f.table());
    f.answer(&slow, "10.0.0.8:8080");
    f.poll(0);
    assert_eq!(f.state(), State::Acknowledged, "{:?}", f.table());
}

#[test]
fn a_sidecar_consumer_counts_no_grace() {
    let f = front(r#"{"admin_cluster":"admin"}"#, false);
    let st = f.start();
    assert_eq!(
        (
            f.h.metric(Metric::FrontAwaiting0),
            f.h.metric(Metric::FrontAwaiting1)
        ),
        (0, 0)
    );
    f.answer(&st, "10.0.0.8:8080");
}
