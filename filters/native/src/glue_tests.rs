//! The glue's unit tests: the module's hooks driven as Envoy drives them,
//! over the fake Envoy of `fake_envoy.rs` (every ABI callback in memory).
//! What the real-Envoy suites show end to end, these show per hook: what
//! each one asks of Envoy, and that handles Envoy lends are given back
//! once.

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use graceful_core::shared::metrics::Metric;

use crate::abi::{self, ConfigModulePtr, EnvoyBuffer, FilterModulePtr, CONTINUE, STOP_ITERATION};
use crate::fake_envoy::{self, FakeConfig, FakeStream};
use crate::hooks::*;
use crate::host::METRICS;

fn buffer(text: &str) -> EnvoyBuffer {
    EnvoyBuffer {
        ptr: text.as_ptr(),
        length: text.len(),
    }
}

/// A config the module made, destroyed on drop.
struct Loaded {
    fake: Box<FakeConfig>,
    module: ConfigModulePtr,
}

impl Loaded {
    /// `config_new` for `name` with `json`; None if the module refused it.
    fn new(name: &str, json: &str) -> Option<Loaded> {
        let fake = Box::new(FakeConfig::default());
        // SAFETY: buffers valid for the call, a live fake config.
        let module = unsafe {
            envoy_dynamic_module_on_http_filter_config_new(fake.ptr(), buffer(name), buffer(json))
        };
        (!module.is_null()).then_some(Loaded { fake, module })
    }

    fn filter(&self) -> Filter {
        // SAFETY: a live config.
        let module =
            unsafe { envoy_dynamic_module_on_http_filter_new(self.module, std::ptr::null_mut()) };
        assert!(!module.is_null(), "filter_new refused");
        Filter(module)
    }

    /// One main-thread tick, as the timer's commit brings it.
    fn tick(&self) {
        // SAFETY: live fake and config.
        unsafe {
            envoy_dynamic_module_on_http_filter_config_scheduled(self.fake.ptr(), self.module, 1)
        };
    }

    fn id_of(&self, m: Metric) -> usize {
        self.fake
            .id_of(m.name())
            .unwrap_or_else(|| panic!("{} not defined", m.name()))
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        // SAFETY: made by config_new, destroyed once.
        unsafe { envoy_dynamic_module_on_http_filter_config_destroy(self.module) };
    }
}

/// A stream's filter; `destroy` gives it back (Envoy always does).
struct Filter(FilterModulePtr);

impl Filter {
    fn request_headers(&self, s: &FakeStream) -> u32 {
        // SAFETY: live fake and filter.
        unsafe { envoy_dynamic_module_on_http_filter_request_headers(s.ptr(), self.0, true) }
    }

    /// Request headers that do not end the request (an upgrade's, which
    /// Envoy raises with its stream open).
    fn request_headers_open(&self, s: &FakeStream) -> u32 {
        // SAFETY: live fake and filter.
        unsafe { envoy_dynamic_module_on_http_filter_request_headers(s.ptr(), self.0, false) }
    }

    fn response_headers(&self, s: &FakeStream) -> u32 {
        // SAFETY: live fake and filter.
        unsafe { envoy_dynamic_module_on_http_filter_response_headers(s.ptr(), self.0, true) }
    }

    fn stream_complete(&self, s: &FakeStream) {
        // SAFETY: live fake and filter.
        unsafe { envoy_dynamic_module_on_http_filter_stream_complete(s.ptr(), self.0) }
    }

    fn scheduled(&self, s: &FakeStream) {
        // SAFETY: live fake and filter.
        unsafe { envoy_dynamic_module_on_http_filter_scheduled(s.ptr(), self.0, 1) }
    }

    fn destroy(self) {
        // SAFETY: made by filter_new, destroyed once.
        unsafe { envoy_dynamic_module_on_http_filter_destroy(self.0) }
    }
}

fn get(path: &str) -> FakeStream {
    let s = FakeStream::with_request(&[(":method", "GET"), (":path", path), (":authority", "app")]);
    s.set_attribute(abi::ATTR_SOURCE_ADDRESS, "127.0.0.1:40000");
    s
}

/// The net of the gauge changes a stream made to stat `id`.
fn gauge_net(s: &FakeStream, id: usize) -> i64 {
    s.stats
        .borrow()
        .iter()
        .filter(|(_, i, _)| *i == id)
        .map(|(op, _, v)| match *op {
            "gauge+" => i64::try_from(*v).unwrap(),
            "gauge-" => -i64::try_from(*v).unwrap(),
            other => panic!("unexpected {other} on a gauge"),
        })
        .sum()
}

fn value(m: Metric) -> i64 {
    i64::try_from(METRICS.value(m)).unwrap()
}

#[test]
fn a_config_with_a_bad_field_is_refused_and_the_log_names_the_field() {
    let _world = fake_envoy::world();
    fake_envoy::take_log();
    assert!(Loaded::new("graceful_drain", r#"{"quiet_window": "soon"}"#).is_none());
    let log = fake_envoy::take_log();
    assert!(
        log.iter()
            .any(|(level, line)| *level == abi::LOG_ERROR && line.contains("quiet_window")),
        "{log:?}"
    );
    assert!(Loaded::new("graceful_nothing", "{}").is_none());
    let log = fake_envoy::take_log();
    assert!(
        log.iter().any(|(_, line)| line.contains("graceful_nothing")
            && line.contains("graceful_provider, graceful_drain")),
        "{log:?}"
    );
    assert!(
        fake_envoy::misuse().is_empty(),
        "{:?}",
        fake_envoy::misuse()
    );
}

#[test]
fn a_provider_stream_is_counted_once_and_its_stat_moves_through_its_stream() {
    let _world = fake_envoy::world();
    let provider = Loaded::new("graceful_provider", "{}").expect("configured");
    let inflight = provider.id_of(Metric::ProviderInflight);
    let before = value(Metric::ProviderInflight);

    let s = get("/orders");
    let f = provider.filter();
    assert_eq!(f.request_headers(&s), CONTINUE);
    assert_eq!(value(Metric::ProviderInflight), before + 1);
    assert_eq!(f.response_headers(&s), CONTINUE);
    f.stream_complete(&s);
    assert_eq!(value(Metric::ProviderInflight), before);
    f.destroy();
    assert_eq!(
        value(Metric::ProviderInflight),
        before,
        "destroy after stream_complete left the count twice"
    );
    assert_eq!(gauge_net(&s, inflight), 0, "{:?}", s.stats.borrow());
    assert!(
        s.stats.borrow().contains(&("gauge+", inflight, 1)),
        "the stat was not mirrored through the stream: {:?}",
        s.stats.borrow()
    );
}

#[test]
fn a_stream_destroyed_without_completing_leaves_the_count_and_the_next_stream_pays_its_stat() {
    let _world = fake_envoy::world();
    let provider = Loaded::new("graceful_provider", "{}").expect("configured");
    let inflight = provider.id_of(Metric::ProviderInflight);
    let before = value(Metric::ProviderInflight);

    let first = get("/a");
    let f = provider.filter();
    f.request_headers(&first);
    f.destroy();
    assert_eq!(value(Metric::ProviderInflight), before);
    assert_eq!(
        gauge_net(&first, inflight),
        1,
        "the destroy had no stream to write with"
    );

    let second = get("/b");
    let g = provider.filter();
    g.request_headers(&second);
    g.stream_complete(&second);
    g.destroy();
    assert_eq!(
        gauge_net(&first, inflight) + gauge_net(&second, inflight),
        0,
        "Envoy's stat disagrees with the count: {:?} then {:?}",
        first.stats.borrow(),
        second.stats.borrow()
    );
}

#[test]
fn a_kept_long_lived_stream_has_one_scheduler_deleted_once_when_it_goes() {
    let _world = fake_envoy::world();
    let provider = Loaded::new("graceful_provider", "{}").expect("configured");
    let live_before = fake_envoy::live_schedulers();

    let s = get("/chat");
    s.add_header(abi::REQUEST_HEADERS, "upgrade", "websocket");
    let f = provider.filter();
    assert_eq!(f.request_headers_open(&s), CONTINUE);
    assert_eq!(
        *s.schedulers_made.borrow(),
        1,
        "a kept stream has a scheduler"
    );
    assert_eq!(fake_envoy::live_schedulers(), live_before + 1);
    provider.tick();
    assert!(
        s.commits.lock().unwrap().is_empty(),
        "woken before the gate passed"
    );
    f.destroy();
    assert_eq!(
        fake_envoy::live_schedulers(),
        live_before,
        "scheduler not deleted"
    );
    assert!(
        fake_envoy::misuse().is_empty(),
        "{:?}",
        fake_envoy::misuse()
    );
}

#[test]
fn a_copy_a_panic_left_half_changed_is_dropped_and_rebuilt_not_reused() {
    let _world = fake_envoy::world();
    let provider = Loaded::new("graceful_provider", "{}").expect("configured");
    let live_before = fake_envoy::live_schedulers();
    fake_envoy::take_log();

    // A long-lived stream's request hook panics once its worker's copy
    // holds it (the copy's second use: its size read, then the hold),
    // before the hook is done: the copy is half changed.
    let first = get("/chat");
    first.add_header(abi::REQUEST_HEADERS, "upgrade", "websocket");
    let f = provider.filter();
    crate::copies::inject::panic_in_use(2);
    assert_eq!(f.request_headers_open(&first), CONTINUE, "failed open");
    assert!(
        fake_envoy::take_log()
            .iter()
            .any(|(_, line)| line.contains("a panic in request_headers was caught")),
        "the panic was not caught at the hook"
    );
    assert_eq!(
        fake_envoy::live_schedulers(),
        live_before + 1,
        "the half-changed copy holds the stream's scheduler"
    );

    // The next use of that copy (the tick's) drops it, with what it held,
    // and goes on with a fresh one.
    provider.tick();
    assert_eq!(
        fake_envoy::live_schedulers(),
        live_before,
        "the copy a panic left was reused: it still holds the dead stream's scheduler"
    );
    f.destroy();
    assert!(first.commits.lock().unwrap().is_empty());

    // The fresh copy serves the worker's next long-lived stream.
    let second = get("/chat");
    second.add_header(abi::REQUEST_HEADERS, "upgrade", "websocket");
    let g = provider.filter();
    assert_eq!(g.request_headers_open(&second), CONTINUE);
    assert_eq!(fake_envoy::live_schedulers(), live_before + 1);
    g.destroy();
    assert_eq!(fake_envoy::live_schedulers(), live_before);
    assert!(
        fake_envoy::misuse().is_empty(),
        "{:?}",
        fake_envoy::misuse()
    );
}

#[test]
fn a_drain_long_poll_is_woken_by_a_tick_answered_on_its_worker_and_its_scheduler_deleted() {
    let _world = fake_envoy::world();
    let drain = Loaded::new("graceful_drain", "{}").expect("configured");
    let live_before = fake_envoy::live_schedulers();

    let s = get("/graceful/drained?wait=20ms");
    let f = drain.filter();
    assert_eq!(f.request_headers(&s), STOP_ITERATION, "not held");
    assert!(s.sent.borrow().is_none());
    assert_eq!(fake_envoy::live_schedulers(), live_before + 1);

    let deadline = Instant::now() + Duration::from_secs(10);
    while s.commits.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "no tick woke the long-poll");
        drain.tick();
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(*s.commits.lock().unwrap(), [1]);
    assert_eq!(
        fake_envoy::live_schedulers(),
        live_before,
        "the woken stream's scheduler was not deleted"
    );
    f.scheduled(&s);
    let sent = s.sent.borrow().clone().expect("answered when woken");
    assert!(
        String::from_utf8_lossy(&sent.body).contains("\"phase\""),
        "{sent:?}"
    );
    f.destroy();
    assert!(
        fake_envoy::misuse().is_empty(),
        "{:?}",
        fake_envoy::misuse()
    );
}

#[test]
fn a_drain_long_poll_gone_before_its_wake_gets_no_commit_and_its_scheduler_is_deleted() {
    let _world = fake_envoy::world();
    let drain = Loaded::new("graceful_drain", "{}").expect("configured");
    let live_before = fake_envoy::live_schedulers();

    let s = get("/graceful/drained?wait=1h");
    let f = drain.filter();
    assert_eq!(f.request_headers(&s), STOP_ITERATION);
    f.destroy();
    assert_eq!(fake_envoy::live_schedulers(), live_before);
    drain.tick();
    assert!(s.commits.lock().unwrap().is_empty());
    assert!(
        fake_envoy::misuse().is_empty(),
        "{:?}",
        fake_envoy::misuse()
    );
}

#[test]
fn an_outsider_reads_no_drain_endpoint_and_holds_no_scheduler() {
    let _world = fake_envoy::world();
    let drain = Loaded::new("graceful_drain", "{}").expect("configured");
    let live_before = fake_envoy::live_schedulers();
    let s = get("/graceful/drained?wait=1h");
    s.set_attribute(abi::ATTR_SOURCE_ADDRESS, "10.1.2.3:5000");
    let f = drain.filter();
    assert_eq!(f.request_headers(&s), STOP_ITERATION);
    assert_eq!(s.sent.borrow().as_ref().map(|r| r.status), Some(403));
    assert_eq!(fake_envoy::live_schedulers(), live_before);
    f.destroy();
}

/// Writes the front's host table with `host` closing (the admin lists it
/// `DRAINING`), then, with `acknowledged`, steered and read idle twice a
/// poll apart, as the lease holder's polls would, and bumps `.gen`.
fn front_table(host: &str, acknowledged: bool) {
    use graceful_core::consumer::front::{host_ip, Event, FrontHosts, Health, Limits};
    use graceful_core::shared::keys::{FRONT_HOSTS, FRONT_HOSTS_GEN};
    use graceful_core::shared::store::{add_bounded, SharedStore};
    let limits = Limits {
        closing_ttl: Duration::from_secs(120),
        poll: Duration::from_millis(10),
        max_hosts: 256,
    };
    let ip = host_ip(host.parse().unwrap());
    let now = crate::clock::monotonic_us();
    let mut table = FrontHosts::default();
    table.apply(ip, Event::Listed(Health::Draining), now, &limits);
    if acknowledged {
        let idle = Event::Read {
            active: Some(0),
            guard_clear: true,
        };
        table.apply(ip, Event::Steered { epoch: 0 }, now, &limits);
        table.apply(ip, idle, now, &limits);
        table.apply(ip, idle, now + 10_000, &limits);
    }
    let store = &crate::host::STORE;
    store.set(FRONT_HOSTS.name, &table.encode(), 0).unwrap();
    add_bounded(store, FRONT_HOSTS_GEN.name, 1, u64::MAX).unwrap();
}

#[test]
fn a_front_long_poll_is_held_woken_by_a_tick_once_acknowledged_and_answered_200() {
    let _world = fake_envoy::world();
    let front = Loaded::new(
        "graceful_consumer",
        r#"{"admin_cluster":"envoy_admin","front":{"serve_endpoints":true,"poll":"10ms"}}"#,
    )
    .expect("configured");
    front_table("10.77.0.7", false);
    let live_before = fake_envoy::live_schedulers();
    let s = get("/graceful/front/drained?wait=30s");
    s.set_attribute(abi::ATTR_SOURCE_ADDRESS, "10.77.0.7:41000");
    let f = front.filter();
    assert_eq!(f.request_headers(&s), STOP_ITERATION);
    assert!(s.sent.borrow().is_none(), "held, not answered");
    assert_eq!(fake_envoy::live_schedulers(), live_before + 1);
    front.tick();
    assert!(
        s.commits.lock().unwrap().is_empty(),
        "woken before acknowledged"
    );

    front_table("10.77.0.7", true);
    front.tick();
    assert_eq!(*s.commits.lock().unwrap(), [1]);
    assert_eq!(
        fake_envoy::live_schedulers(),
        live_before,
        "the woken stream's scheduler was not deleted"
    );
    f.scheduled(&s);
    let sent = s.sent.borrow().clone().expect("answered when woken");
    assert_eq!(sent.status, 200);
    let body = String::from_utf8_lossy(&sent.body);
    assert!(body.contains(r#""state":"acknowledged""#), "{body}");
    assert!(body.contains(r#""late":0"#), "{body}");
    f.destroy();

    // A listener without serve_endpoints answers none of them.
    let public = Loaded::new(
        "graceful_consumer",
        r#"{"admin_cluster":"envoy_admin","front":{}}"#,
    )
    .expect("configured");
    let s = get("/graceful/front/status");
    s.set_attribute(abi::ATTR_SOURCE_ADDRESS, "10.77.0.7:41000");
    let f = public.filter();
    assert_eq!(f.request_headers(&s), CONTINUE);
    assert!(s.sent.borrow().is_none());
    f.destroy();
    assert!(
        fake_envoy::misuse().is_empty(),
        "{:?}",
        fake_envoy::misuse()
    );
}

/// A listener stream and one upstream attempt of it, sharing filter state
/// as a request's `StreamInfo` is shared.
fn request_and_attempt(host: &str) -> (FakeStream, FakeStream) {
    let listener = get("/orders");
    let attempt = listener.attempt();
    attempt.set_attribute(abi::ATTR_UPSTREAM_ADDRESS, host);
    attempt.set_cluster("orders");
    (listener, attempt)
}

#[test]
fn a_listener_stream_carries_a_token_only_once_an_upstream_instance_is_configured() {
    let _world = fake_envoy::world();
    crate::consumer::forget_upstream_instances();
    let listener = Loaded::new("graceful_consumer", "{}").expect("configured");
    let token_written = |l: &FakeStream| {
        l.filter_state
            .borrow()
            .contains_key(crate::consumer::STREAM_TOKEN.as_bytes())
    };

    let l = get("/orders");
    let lf = listener.filter();
    lf.request_headers(&l);
    assert!(!token_written(&l), "a token with no attempt to read it");
    lf.stream_complete(&l);
    lf.destroy();

    let _upstream = Loaded::new("graceful_consumer:upstream", "{}").expect("configured");
    let l = get("/orders");
    let lf = listener.filter();
    lf.request_headers(&l);
    assert!(token_written(&l), "no token for the upstream instance");
    lf.stream_complete(&l);
    lf.destroy();
}

#[test]
fn an_attempt_torn_down_unanswered_tombstones_its_host_only_while_its_request_lives() {
    let _world = fake_envoy::world();
    let listener = Loaded::new("graceful_consumer", "{}").expect("configured");
    let upstream = Loaded::new("graceful_consumer:upstream", "{}").expect("configured");
    let evictions = || value(Metric::ConsumerEvictions);

    // Failed: the attempt ends unanswered while its request goes on.
    let before = evictions();
    let (l, a) = request_and_attempt("10.9.8.7:8080");
    let (lf, af) = (listener.filter(), upstream.filter());
    lf.request_headers(&l);
    af.request_headers(&a);
    af.destroy();
    assert_eq!(
        evictions(),
        before + 1,
        "the failed attempt's host was not tombstoned"
    );
    lf.stream_complete(&l);
    lf.destroy();

    // Cancelled: the request ended first, taking its attempt with it.
    let before = evictions();
    let (l, a) = request_and_attempt("10.9.8.6:8080");
    let (lf, af) = (listener.filter(), upstream.filter());
    lf.request_headers(&l);
    af.request_headers(&a);
    lf.stream_complete(&l);
    lf.destroy();
    af.destroy();
    assert_eq!(
        evictions(),
        before,
        "a cancelled attempt tombstoned its host"
    );
}

#[test]
fn a_closing_mark_is_seen_in_a_response_of_any_size() {
    let _world = fake_envoy::world();
    let listener = Loaded::new("graceful_consumer", "{}").expect("configured");
    // Listed on the stack, and past it (on the heap), the mark last.
    for (filler, host) in [(3, "10.9.8.3:8080"), (40, "10.9.8.2:8080")] {
        let before = value(Metric::ConsumerEvictions);
        let l = get("/orders");
        l.set_cluster("orders");
        l.set_attribute(abi::ATTR_UPSTREAM_ADDRESS, host);
        let lf = listener.filter();
        lf.request_headers(&l);
        l.add_header(abi::RESPONSE_HEADERS, ":status", "200");
        for i in 0..filler {
            l.add_header(abi::RESPONSE_HEADERS, &format!("x-filler-{i}"), "v");
        }
        l.add_header(abi::RESPONSE_HEADERS, "x-graceful-closing", "true");
        lf.response_headers(&l);
        assert_eq!(
            value(Metric::ConsumerEvictions),
            before + 1,
            "{filler} headers before the mark: not seen"
        );
        lf.stream_complete(&l);
        lf.destroy();
    }
}

#[test]
fn a_client_cannot_forge_the_consumer_identity_the_attempt_carries_its_own() {
    let _world = fake_envoy::world();
    let json = r#"{"consumer_header": "x-graceful-consumer"}"#;
    let listener = Loaded::new("graceful_consumer", json).expect("configured");
    let upstream = Loaded::new("graceful_consumer:upstream", json).expect("configured");
    let (l, a) = request_and_attempt("10.9.8.5:8080");
    l.add_header(abi::REQUEST_HEADERS, "x-graceful-consumer", "forged");
    l.add_header(
        abi::REQUEST_HEADERS,
        "X-Graceful-Override-Host",
        "10.9.9.9:80",
    );
    l.add_header(abi::REQUEST_HEADERS, "x-app", "kept");
    l.add_header(abi::REQUEST_HEADERS, "x-graceful-consumer", "forged-again");
    a.add_header(abi::REQUEST_HEADERS, "x-graceful-consumer", "forged");
    let (lf, af) = (listener.filter(), upstream.filter());
    lf.request_headers(&l);
    // Every value of both, whatever their case, and nothing else (the
    // listing finds which are there, the removal takes them).
    assert_eq!(l.header(abi::REQUEST_HEADERS, "x-graceful-consumer"), None);
    assert_eq!(
        l.header(abi::REQUEST_HEADERS, "x-graceful-override-host"),
        None
    );
    assert_eq!(
        l.header(abi::REQUEST_HEADERS, "x-app").as_deref(),
        Some("kept")
    );
    af.request_headers(&a);
    let identity = a.header(abi::REQUEST_HEADERS, "x-graceful-consumer");
    assert!(
        identity
            .as_deref()
            .is_some_and(|id| !id.is_empty() && id != "forged"),
        "{identity:?}"
    );
    af.response_headers(&a);
    af.destroy();
    lf.stream_complete(&l);
    lf.destroy();
}

#[test]
fn a_tick_polls_the_admin_through_the_config_and_its_answer_comes_back_to_it() {
    let _world = fake_envoy::world();
    let drain =
        Loaded::new("graceful_drain", r#"{"admin_cluster": "envoy_admin"}"#).expect("configured");
    let deadline = Instant::now() + Duration::from_secs(10);
    let call = loop {
        drain.tick();
        if let Some(c) = drain.fake.callouts.lock().unwrap().first().cloned() {
            break c;
        }
        assert!(Instant::now() < deadline, "no admin poll");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(call.cluster, "envoy_admin");
    assert!(
        call.headers.contains(&(":path".into(), "/ready".into())),
        "{:?}",
        call.headers
    );
    let (k, v, body) = (":status", "200", "LIVE\n");
    let header = abi::EnvoyHeader {
        key_ptr: k.as_ptr(),
        key_length: k.len(),
        value_ptr: v.as_ptr(),
        value_length: v.len(),
    };
    let chunk = buffer(body);
    let phase = value(Metric::DrainPhase);
    // SAFETY: live fake and config; buffers valid for the call.
    unsafe {
        envoy_dynamic_module_on_http_filter_config_http_callout_done(
            drain.fake.ptr(),
            drain.module,
            call.id,
            0,
            &header,
            1,
            &chunk,
            1,
        );
    }
    assert_eq!(
        value(Metric::DrainPhase),
        phase,
        "a LIVE admin moved the phase"
    );
    // A live config answers on.
    let s = get("/graceful/status");
    let f = drain.filter();
    assert_eq!(f.request_headers(&s), STOP_ITERATION);
    assert_eq!(s.sent.borrow().as_ref().map(|r| r.status), Some(200));
    f.destroy();
}

#[test]
fn a_config_destroyed_stops_its_timer_at_once_and_deletes_its_scheduler() {
    let _world = fake_envoy::world();
    let live_before = fake_envoy::live_schedulers();
    let consumer =
        Loaded::new("graceful_consumer", r#"{"membership_refresh": "1h"}"#).expect("configured");
    assert_eq!(fake_envoy::live_schedulers(), live_before + 1);
    let started = Instant::now();
    drop(consumer);
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "config_destroy took {took:?}"
    );
    assert_eq!(fake_envoy::live_schedulers(), live_before);
}

#[test]
fn hooks_given_no_filter_let_the_stream_go_on() {
    let _world = fake_envoy::world();
    let s = get("/a");
    let none = Filter(std::ptr::null());
    assert_eq!(none.request_headers(&s), CONTINUE);
    assert_eq!(none.response_headers(&s), CONTINUE);
    none.stream_complete(&s);
    none.scheduled(&s);
    none.destroy();
    assert!(s.sent.borrow().is_none());
}

/// Tombstones `address` of `cluster` as announced closing (as the front's
/// `closing` does), and moves the change signal.
fn announce(cluster: &str, address: &str) {
    use graceful_core::consumer::tombstone::Tombstones;
    use graceful_core::shared::keys::{TOMBSTONES, TOMBSTONES_GEN};
    use graceful_core::shared::metrics::Metrics;
    use graceful_core::shared::store::{add_bounded, update};
    let now = crate::clock::monotonic_us();
    let store = &crate::host::STORE;
    update(store, TOMBSTONES.name, |bytes| {
        let mut list = bytes.and_then(Tombstones::decode).unwrap_or_default();
        list.announce(cluster, address, now, now + 120_000_000, 64);
        (Some(list.encode()), ())
    })
    .unwrap();
    add_bounded(store, TOMBSTONES_GEN.name, 1, u64::MAX).unwrap();
    METRICS.add(Metric::ConsumerGeneration, 1);
}

#[test]
fn the_upstream_instance_with_front_lets_an_attempt_at_a_closing_host_go() {
    let _world = fake_envoy::world();
    let json = r#"{"admin_cluster":"envoy_admin","front":{}}"#;
    let listener = Loaded::new("graceful_consumer", json).expect("configured");
    let upstream = Loaded::new("graceful_consumer:upstream", json).expect("configured");
    announce("orders", "10.77.0.9:8080");
    let awaiting = || value(Metric::FrontAwaiting0) + value(Metric::FrontAwaiting1);
    let before = awaiting();

    let (l, a) = request_and_attempt("10.77.0.9:8080");
    let (lf, af) = (listener.filter(), upstream.filter());
    lf.request_headers(&l);
    assert_eq!(
        awaiting(),
        before + 1,
        "the listener counts the request in a grace slot"
    );
    // A local reply here would reach the client unretried: the attempt
    // goes on to the closing host, which still serves it.
    assert_eq!(af.request_headers(&a), CONTINUE);
    assert!(a.sent.borrow().is_none());
    af.response_headers(&a);
    af.destroy();
    lf.response_headers(&l);
    assert_eq!(
        awaiting(),
        before,
        "out of its slot at its response headers"
    );
    lf.stream_complete(&l);
    lf.destroy();
    assert_eq!(awaiting(), before, "and only once");
    assert!(
        fake_envoy::misuse().is_empty(),
        "{:?}",
        fake_envoy::misuse()
    );
}
