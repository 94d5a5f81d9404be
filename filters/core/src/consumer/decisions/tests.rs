use super::front::FrontHostView;
use super::*;
use crate::consumer::config::ConsumerConfig;
use crate::consumer::tombstone::Cause;
use crate::shared::keys;
use crate::shared::metrics::{Kind, Metric};
use crate::shared::store::{self, add_bounded, MemStore, SharedStore};
use std::cell::Cell;
use std::time::Duration;

/// A stream as the glue would show it: fixed headers, a cluster, the
/// answering address, flags, the clock; counts the lookups, which are
/// hostcalls in the filter.
#[derive(Default)]
struct Stream {
    cluster: String,
    address: Option<String>,
    headers: Vec<(&'static str, Vec<u8>)>,
    flags: Option<u64>,
    now: u64,
    cluster_reads: usize,
    address_reads: usize,
    clock_reads: usize,
}

impl Stream {
    fn to(cluster: &str) -> Stream {
        Stream {
            cluster: cluster.into(),
            ..Stream::default()
        }
    }

    fn with(mut self, name: &'static str, value: &str) -> Stream {
        self.headers.push((name, value.as_bytes().to_vec()));
        self
    }

    fn at(mut self, now: u64) -> Stream {
        self.now = now;
        self
    }

    /// What the glue's one read of the header map gives the core.
    fn scanned(&self, config: &ConsumerConfig) -> Response {
        Response::scan(
            config,
            self.headers
                .iter()
                .map(|(n, v)| (n.as_bytes(), v.as_slice())),
        )
    }
}

impl Exchange for Stream {
    fn cluster(&mut self) -> String {
        self.cluster_reads += 1;
        self.cluster.clone()
    }
    fn address(&mut self) -> Option<String> {
        self.address_reads += 1;
        self.address.clone()
    }
    fn response_flags(&mut self) -> Option<u64> {
        self.flags
    }
    fn now(&mut self) -> u64 {
        self.clock_reads += 1;
        self.now
    }
}

thread_local! {
    /// `graceful_consumer_generation` of the simulated process (each test
    /// runs on a thread of its own).
    static SIGNAL: Cell<u64> = const { Cell::new(0) };
}

/// Carries out the generation bumps among `fx`, as the glue does; every
/// metric effect must set a gauge or add to a counter of the consumer's.
fn carry(fx: &[Effect]) {
    for e in fx {
        if let Effect::Set(m, _) | Effect::Add(m, _) = e {
            let kind = match e {
                Effect::Set(..) => Kind::Gauge,
                _ => Kind::Counter,
            };
            assert_eq!(
                (m.owner(), m.kind()),
                (keys::Owner::Consumer, kind),
                "{e:?}"
            );
        }
        if let Effect::Add(Metric::ConsumerGeneration, n) = e {
            SIGNAL.with(|s| s.set(s.get() + n));
        }
    }
}

/// `stream`'s response from `address` at `now`, observed by `c` (as the
/// glue would: one scan of the map, then the decision).
fn observe_with(
    c: &mut Consumer,
    store: &dyn SharedStore,
    stream: &mut Stream,
    address: &str,
    part: Part,
    now: u64,
) -> Vec<Effect> {
    stream.address = Some(address.to_string());
    stream.now = now;
    let seen = stream.scanned(c.config());
    let fx = c.observe_response(store, stream, &seen, part);
    carry(&fx);
    fx
}

fn observe(
    c: &mut Consumer,
    store: &dyn SharedStore,
    mut stream: Stream,
    address: &str,
    part: Part,
    now: u64,
) -> Vec<Effect> {
    observe_with(c, store, &mut stream, address, part, now)
}

/// A request to `cluster` at `now` through `c`, with the signal as it is.
fn steer(c: &mut Consumer, store: &dyn SharedStore, cluster: &str, now: u64) -> Option<String> {
    let signal = SIGNAL.with(Cell::get);
    c.steer(store, &mut Stream::to(cluster).at(now), Some(signal))
        .map(str::to_string)
}

fn config(json: &str) -> ConsumerConfig {
    ConsumerConfig::from_json(json.as_bytes()).unwrap()
}

/// A process's store with the consumer's keys created, and `n` copies.
fn copies(json: &str, n: usize) -> (MemStore, Vec<Consumer>) {
    let store = MemStore::new();
    store::ensure_all(&store, &crate::initial::values(keys::Owner::Consumer)).unwrap();
    let copies = (0..n).map(|_| Consumer::new(config(json), false)).collect();
    (store, copies)
}

fn closing(instance: &str) -> Stream {
    Stream::to("svc")
        .with(":status", "200")
        .with("x-graceful-closing", "true")
        .with("x-graceful-instance", instance)
}

fn ok(instance: &str) -> Stream {
    Stream::to("svc")
        .with(":status", "200")
        .with("x-graceful-instance", instance)
}

fn gen(store: &MemStore, key: keys::Key) -> u64 {
    store::read_u64(&store.get(key.name).unwrap().unwrap().0).unwrap()
}

const S: u64 = 1_000_000;

#[test]
fn a_closing_mark_tombstones_and_every_copy_steers_away() {
    let (store, mut c) = copies("", 2);
    // Copy 0 sees both hosts answer, then b closing.
    for a in ["a:1", "b:1"] {
        observe(&mut c[0], &store, ok("i"), a, Part::Headers, S);
    }
    let fx = observe(&mut c[0], &store, closing("i"), "b:1", Part::Headers, S);
    assert!(
        fx.contains(&Effect::Add(Metric::ConsumerEvictions, 1)),
        "{fx:?}"
    );
    assert!(fx.contains(&Effect::Set(Metric::ConsumerTombstones, 1)));
    assert_eq!(gen(&store, keys::TOMBSTONES_GEN), 1);
    // Copy 1 never saw an answer: it steers from the shared observed set.
    let list = steer(&mut c[1], &store, "svc", 2 * S);
    assert_eq!(list.as_deref(), Some("a:1"));
    assert_eq!(
        steer(&mut c[0], &store, "other", 2 * S),
        None,
        "another cluster"
    );
}

#[test]
fn a_repeated_mark_is_written_only_when_it_adds_a_second() {
    let (store, mut c) = copies("", 1);
    observe(&mut c[0], &store, closing("i"), "b:1", Part::Headers, S);
    let cas = store.get(keys::TOMBSTONES.name).unwrap().unwrap().1;
    let fx = observe(
        &mut c[0],
        &store,
        closing("i"),
        "b:1",
        Part::Headers,
        S + S / 2,
    );
    assert!(fx.is_empty(), "{fx:?}");
    assert_eq!(
        store.get(keys::TOMBSTONES.name).unwrap().unwrap().1,
        cas,
        "no write"
    );
    observe(&mut c[0], &store, closing("i"), "b:1", Part::Headers, 3 * S);
    assert_ne!(
        store.get(keys::TOMBSTONES.name).unwrap().unwrap().1,
        cas,
        "extended"
    );
    assert_eq!(gen(&store, keys::TOMBSTONES_GEN), 2);
}

#[test]
fn a_new_instance_answering_readmits() {
    let (store, mut c) = copies("", 1);
    observe(&mut c[0], &store, closing("old"), "b:1", Part::Headers, S);
    let same = observe(&mut c[0], &store, ok("old"), "b:1", Part::Headers, 2 * S);
    assert!(!same.contains(&Effect::Add(Metric::ConsumerReadmitted, 1)));
    let fx = observe(&mut c[0], &store, ok("new"), "b:1", Part::Headers, 3 * S);
    assert!(
        fx.contains(&Effect::Add(Metric::ConsumerReadmitted, 1)),
        "{fx:?}"
    );
    assert_eq!(steer(&mut c[0], &store, "svc", 4 * S), None);
}

/// The first host of an override list.
fn first(list: &str) -> &str {
    list.split(',').next().unwrap_or_default()
}

#[test]
fn a_new_instance_answering_a_last_resort_puts_the_rest_of_its_generation_on_trial() {
    let (store, mut c) = copies(r#"{"probe_path":""}"#, 2);
    let hosts = ["a:1", "b:1", "c:1", "d:1"];
    for h in hosts {
        observe(&mut c[0], &store, ok("g1"), h, Part::Headers, S);
    }
    // The whole generation closes in turn, d last.
    for (i, h) in hosts.iter().enumerate() {
        observe(
            &mut c[0],
            &store,
            closing("g1"),
            h,
            Part::Headers,
            (2 + i as u64) * S,
        );
    }
    // No acceptable host: the last resort, every host but d.
    let list = steer(&mut c[0], &store, "svc", 7 * S).expect("the last resort");
    let tried = first(&list).to_string();
    assert!(["a:1", "b:1", "c:1"].contains(&tried.as_str()), "{list}");
    // Its new instance answers: readmitted, and the other two on trial.
    let fx = observe(&mut c[0], &store, ok("g2"), &tried, Part::Headers, 7 * S);
    assert!(
        fx.iter()
            .any(|e| matches!(e, Effect::Log(_, l) if l.contains("2 more of its hosts on trial"))),
        "{fx:?}"
    );
    // Every copy now tries each of them first in a list of its own, the
    // readmitted host after it, once it has been closing as long as the
    // readmitted host took to come back (at once for a host that said
    // closing before it); d (it said closing last) is never listed.
    let confirmed = |h: &str| (2 + hosts.iter().position(|x| *x == h).unwrap_or(0) as u64) * S;
    let span = 7 * S - confirmed(&tried);
    let firsts_at = |c: &mut Consumer, at: u64| {
        let lists: Vec<String> = (0..6)
            .map(|_| steer(c, &store, "svc", at).expect("steered"))
            .collect();
        for l in &lists {
            assert!(!l.contains("d:1"), "{lists:?}");
            if first(l) != tried {
                assert_eq!(l, &format!("{},{tried}", first(l)), "{lists:?}");
            }
        }
        let firsts: std::collections::BTreeSet<String> =
            lists.iter().map(|l| first(l).to_string()).collect();
        firsts
    };
    let started: std::collections::BTreeSet<String> = ["a:1", "b:1", "c:1"]
        .into_iter()
        .filter(|h| *h == tried || confirmed(h) < confirmed(&tried))
        .map(str::to_string)
        .collect();
    assert_eq!(firsts_at(&mut c[1], 7 * S), started);
    let all: std::collections::BTreeSet<String> = ["a:1", "b:1", "c:1"]
        .into_iter()
        .map(str::to_string)
        .collect();
    assert_eq!(firsts_at(&mut c[1], confirmed("c:1") + span), all);
    // One on trial answers closing (its old instance): off trial, never
    // listed again; the other answers as a new instance: readmitted.
    let trial: Vec<&str> = ["a:1", "b:1", "c:1"]
        .into_iter()
        .filter(|h| *h != tried)
        .collect();
    let later = 10 * S;
    observe(
        &mut c[1],
        &store,
        closing("g1"),
        trial[0],
        Part::Headers,
        later,
    );
    let fx = observe(&mut c[1], &store, ok("g2"), trial[1], Part::Headers, later);
    assert!(
        fx.iter()
            .any(|e| matches!(e, Effect::Log(_, l) if l.ends_with("new instance g2"))),
        "not a last resort's answer: nothing more on trial: {fx:?}"
    );
    let lists: std::collections::BTreeSet<String> = (0..4)
        .map(|_| steer(&mut c[0], &store, "svc", later).expect("steered"))
        .collect();
    assert!(
        lists
            .iter()
            .all(|l| !l.contains(trial[0]) && !l.contains("d:1")),
        "{lists:?}"
    );
    assert_eq!(
        lists.len(),
        2,
        "the two readmitted hosts in turn: {lists:?}"
    );
}

#[test]
fn a_readmission_with_acceptable_hosts_left_puts_nothing_on_trial() {
    let (store, mut c) = copies(r#"{"probe_path":""}"#, 1);
    for h in ["a:1", "b:1", "c:1"] {
        observe(&mut c[0], &store, ok("g1"), h, Part::Headers, S);
    }
    observe(
        &mut c[0],
        &store,
        closing("g1"),
        "a:1",
        Part::Headers,
        2 * S,
    );
    observe(
        &mut c[0],
        &store,
        closing("g1"),
        "b:1",
        Part::Headers,
        3 * S,
    );
    assert_eq!(
        steer(&mut c[0], &store, "svc", 4 * S).as_deref(),
        Some("c:1")
    );
    // a:1 answers as a new instance (a request the balancer's fallback
    // sent): readmitted, and b:1, which said closing, is still never tried.
    observe(&mut c[0], &store, ok("g2"), "a:1", Part::Headers, 4 * S);
    let lists: std::collections::BTreeSet<String> = (0..6)
        .map(|_| steer(&mut c[0], &store, "svc", 4 * S).expect("steered"))
        .collect();
    assert_eq!(lists, ["a:1,c:1".to_string(), "c:1,a:1".to_string()].into());
}

#[test]
fn with_slow_start_every_copy_ramps_a_readmitted_host_then_leaves_the_balancer_alone() {
    let (store, mut c) = copies(r#"{"readmit_slow_start":{"window":"10s"}}"#, 2);
    for a in ["a:1", "c:1"] {
        observe(&mut c[0], &store, ok("x"), a, Part::Headers, S);
    }
    observe(&mut c[0], &store, closing("old"), "b:1", Part::Headers, S);
    let fx = observe(&mut c[0], &store, ok("new"), "b:1", Part::Headers, 2 * S);
    assert!(
        fx.contains(&Effect::Add(Metric::ConsumerReadmitted, 1)),
        "{fx:?}"
    );
    assert!(
        fx.contains(&Effect::Set(Metric::ConsumerTombstones, 0)),
        "warming is not a tombstone: {fx:?}"
    );
    carry(&fx);
    // The other copy, 1 s into the window (weight 0.1: 2 slots of 42).
    let firsts: Vec<String> = (0..420)
        .map(|_| steer(&mut c[1], &store, "svc", 3 * S).expect("steered while warming"))
        .map(|list| list.split(',').next().unwrap_or_default().to_string())
        .collect();
    let b = firsts.iter().filter(|f| *f == "b:1").count();
    assert_eq!(b, 20, "b:1 first for 2 of every 42");
    assert_eq!(
        steer(&mut c[1], &store, "svc", 12 * S),
        None,
        "the window over"
    );
}

#[test]
fn connect_failures_evict_downstream_as_local_503s_and_upstream_as_failed_attempts() {
    let (store, mut c) = copies("", 1);
    let mut reply = Stream::to("svc").with(":status", "503");
    reply.flags = Some(FLAG_UF);
    let fx = observe(&mut c[0], &store, reply, "b:1", Part::Headers, S);
    assert!(
        fx.contains(&Effect::Add(Metric::ConsumerEvictions, 1)),
        "{fx:?}"
    );

    let mut up = Consumer::new(config(""), true);
    let mut reply = Stream::to("svc").with(":status", "503");
    reply.flags = Some(FLAG_UF);
    assert!(observe(&mut up, &store, reply, "c:1", Part::Headers, S).is_empty());
    assert!(up.attempt_may_have_failed(false));
    assert!(!up.attempt_may_have_failed(true), "it answered");
    let fx = up.connect_failed(&store, &mut Stream::to("svc").at(S), "c:1");
    assert!(
        fx.contains(&Effect::Add(Metric::ConsumerEvictions, 1)),
        "{fx:?}"
    );
    assert!(!c[0].attempt_may_have_failed(false), "downstream: never");
}

#[test]
fn marks_in_trailers_count_and_other_trailers_are_not_answers() {
    let (store, mut c) = copies("", 1);
    let fx = observe(&mut c[0], &store, ok("i"), "a:1", Part::Trailers, S);
    assert!(fx.is_empty());
    assert_eq!(
        store.get(keys::OBSERVED.name).unwrap().unwrap().0,
        Membership::default().encode()
    );
    let t = Stream::to("svc").with("closing", "false, TRUE");
    let fx = observe(&mut c[0], &store, t, "a:1", Part::Trailers, S);
    assert!(
        fx.contains(&Effect::Add(Metric::ConsumerEvictions, 1)),
        "{fx:?}"
    );
}

/// Counts shared-data reads and writes.
struct Counting<'a>(&'a MemStore, Cell<usize>);
impl SharedStore for Counting<'_> {
    fn get(&self, key: &str) -> Result<Option<store::Versioned>, store::StoreError> {
        self.1.set(self.1.get() + 1);
        self.0.get(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), store::StoreError> {
        self.1.set(self.1.get() + 1);
        self.0.set(key, value, cas)
    }
}

#[test]
fn an_ordinary_request_reads_no_shared_data_no_clock_and_no_cluster() {
    let (store, mut c) = copies("", 1);
    let counting = Counting(&store, 0.into());
    let mut s = Stream::to("svc");
    assert_eq!(c[0].steer(&counting, &mut s, Some(0)), None);
    let first = counting.1.get();
    assert_eq!(
        first, 2,
        "the first look: the tombstones and their generation"
    );
    assert_eq!(c[0].steer(&counting, &mut s, Some(0)), None);
    assert_eq!(counting.1.get(), first, "the signal did not move: nothing");
    assert_eq!(
        (s.cluster_reads, s.clock_reads),
        (0, 0),
        "no tombstone: neither the cluster nor the clock"
    );
    // Unreadable signal: every request checks the generation (fail open).
    c[0].steer(&counting, &mut s, None);
    c[0].steer(&counting, &mut s, None);
    assert_eq!(counting.1.get(), first + 2);
}

/// Writes the admin's membership of `svc` as the refresh would (value,
/// then its generation, then the signal).
fn admin_knows(store: &MemStore, addresses: &[&str]) {
    let hosts: Vec<String> = addresses
        .iter()
        .map(|a| {
            let (ip, port) = a.rsplit_once(':').unwrap();
            format!(
                r#"{{"address":{{"socket_address":{{"address":"{ip}","port_value":{port}}}}}}}"#
            )
        })
        .collect();
    let body = format!(
        r#"{{"cluster_statuses":[{{"name":"svc","host_statuses":[{}]}}]}}"#,
        hosts.join(",")
    );
    let m = Membership::from_admin_json(body.as_bytes(), &["svc"]).unwrap();
    store.set(keys::MEMBERS.name, &m.encode(), 0).unwrap();
    add_bounded(store, keys::MEMBERS_GEN.name, 1, u64::MAX).unwrap();
    carry(&[Effect::Add(Metric::ConsumerGeneration, 1)]);
}

/// An unmarked 200 from `address` at `now` through `c`, which must say
/// nothing; the (address, cluster, clock) reads it cost.
fn ok_reads(
    c: &mut Consumer,
    store: &dyn SharedStore,
    address: &str,
    now: u64,
) -> (usize, usize, usize) {
    let mut s = ok("i");
    let fx = observe_with(c, store, &mut s, address, Part::Headers, now);
    assert!(fx.is_empty(), "{fx:?}");
    (s.address_reads, s.cluster_reads, s.clock_reads)
}

#[test]
fn with_the_admin_membership_known_an_ordinary_response_reads_nothing_but_the_scan() {
    let (store, mut c) = copies(r#"{"admin_cluster":"admin"}"#, 1);
    let counting = Counting(&store, 0.into());
    let mut first = ok("i");
    observe_with(&mut c[0], &counting, &mut first, "a:1", Part::Headers, S);
    assert_eq!(
        (first.address_reads, first.cluster_reads),
        (1, 1),
        "the copy's first response is observed (membership, cluster set)"
    );
    let mut before_admin = ok("i");
    observe_with(
        &mut c[0],
        &counting,
        &mut before_admin,
        "a:1",
        Part::Headers,
        S,
    );
    assert_eq!(
        before_admin.address_reads, 1,
        "until the admin's membership is read, every response is observed"
    );
    admin_knows(&store, &["127.0.0.1:1", "127.0.0.2:1"]);
    steer(&mut c[0], &counting, "svc", S);
    // The signal moved: the next response reads the admin's membership.
    let reads = counting.1.get();
    let mut s = ok("i");
    observe_with(&mut c[0], &counting, &mut s, "a:1", Part::Headers, S + 2);
    assert_eq!(
        counting.1.get(),
        reads + 2,
        "its generation, then the value"
    );
    assert_eq!(s.address_reads, 0);
    let writes = counting.1.get();
    for i in 3..OBSERVE_EVERY {
        assert_eq!(
            ok_reads(&mut c[0], &counting, "a:1", S + i),
            (0, 0, 0),
            "response {i}"
        );
    }
    assert_eq!(counting.1.get(), writes, "no shared data either");
    let mut sampled = ok("i");
    observe_with(
        &mut c[0],
        &counting,
        &mut sampled,
        "b:1",
        Part::Headers,
        2 * S,
    );
    assert_eq!(sampled.address_reads, 1, "one in {OBSERVE_EVERY}");
    assert_eq!(gen(&store, keys::OBSERVED_GEN), 2, "a:1, then b:1");
}

#[test]
fn without_an_admin_every_response_is_observed_for_the_address_and_the_clock() {
    let (store, mut c) = copies("", 2);
    let counting = Counting(&store, 0.into());
    let mut first = ok("i");
    observe_with(&mut c[0], &counting, &mut first, "a:1", Part::Headers, S);
    assert_eq!(
        (first.address_reads, first.cluster_reads, first.clock_reads),
        (1, 1, 1),
        "a new address is recorded"
    );
    let writes = counting.1.get();
    let step = RECORD_EVERY_US / 100;
    for i in 1..100 {
        assert_eq!(
            ok_reads(&mut c[0], &counting, "a:1", S + i * step),
            (1, 0, 1),
            "response {i} from an address recorded lately"
        );
    }
    assert_eq!(counting.1.get(), writes, "no shared data");
    let mut again = ok("i");
    let later = S + RECORD_EVERY_US;
    observe_with(
        &mut c[0],
        &counting,
        &mut again,
        "a:1",
        Part::Headers,
        later,
    );
    assert_eq!(
        again.cluster_reads, 1,
        "recorded again after {RECORD_EVERY_US} µs"
    );
    assert_eq!(
        gen(&store, keys::OBSERVED_GEN),
        1,
        "the shared membership saw it lately: not written"
    );
    // A host first seen after thousands of responses is a member at once,
    // on every copy.
    let mut late = ok("i");
    observe_with(&mut c[0], &counting, &mut late, "b:1", Part::Headers, later);
    assert_eq!(late.cluster_reads, 1);
    observe(&mut c[1], &store, closing("i"), "a:1", Part::Headers, later);
    assert_eq!(
        steer(&mut c[1], &store, "svc", later).as_deref(),
        Some("b:1")
    );
    assert_eq!(
        steer(&mut c[0], &store, "svc", later).as_deref(),
        Some("b:1")
    );
}

#[test]
fn an_observed_member_that_stops_answering_leaves_the_steering_list() {
    let (store, mut c) = copies("", 2);
    let t = 1_000 * S;
    for (i, a) in ["a:1", "b:1", "c:1", "gone:1"].iter().enumerate() {
        observe(&mut c[i % 2], &store, ok("i"), a, Part::Headers, t);
    }
    observe(&mut c[0], &store, closing("i"), "a:1", Part::Headers, t);
    let listed = |c: &mut Consumer, now| {
        let mut hosts: Vec<String> = steer(c, &store, "svc", now)
            .unwrap_or_default()
            .split(',')
            .map(String::from)
            .collect();
        hosts.sort();
        hosts
    };
    assert_eq!(listed(&mut c[1], t), ["b:1", "c:1", "gone:1"]);
    // b and c go on answering (each copy records them again every few
    // seconds, the shared time moves every 15 s); gone:1 left the cluster.
    let mut now = t;
    while now < t + 25 * S {
        now += S;
        for (i, a) in ["b:1", "c:1"].iter().enumerate() {
            observe(&mut c[i], &store, ok("i"), a, Part::Headers, now);
        }
    }
    observe(&mut c[0], &store, closing("i"), "a:1", Part::Headers, now);
    while now < t + crate::consumer::steering::OBSERVED_WINDOW_US + 2 * S {
        now += S;
        for (i, a) in ["b:1", "c:1"].iter().enumerate() {
            observe(&mut c[i], &store, ok("i"), a, Part::Headers, now);
        }
    }
    observe(&mut c[1], &store, closing("i"), "a:1", Part::Headers, now);
    for copy in c.iter_mut() {
        assert_eq!(listed(copy, now), ["b:1", "c:1"], "gone:1 left the list");
    }
}

#[test]
fn a_write_is_seen_by_every_copy_at_its_next_request_through_the_signal() {
    let (store, mut c) = copies("", 2);
    observe(&mut c[1], &store, ok("i"), "a:1", Part::Headers, S);
    assert_eq!(steer(&mut c[1], &store, "svc", S), None);
    assert_eq!(steer(&mut c[0], &store, "svc", S), None);
    let before = SIGNAL.with(Cell::get);
    let fx = observe(&mut c[0], &store, closing("i"), "b:1", Part::Headers, S);
    // The shared write first, then the signal: the bump is among the
    // effects the glue carries out after the core returned.
    let bumps = fx
        .iter()
        .filter(|e| **e == Effect::Add(Metric::ConsumerGeneration, 1))
        .count();
    assert_eq!(bumps, 1, "{fx:?}");
    assert_eq!(SIGNAL.with(Cell::get), before + 1);
    assert_eq!(
        steer(&mut c[1], &store, "svc", 2 * S).as_deref(),
        Some("a:1")
    );
    // A copy that missed the bump (signal unchanged) keeps its cache: the
    // protocol relies on every write bumping it.
    let (store2, mut d) = copies("", 1);
    assert_eq!(
        d[0].steer(&store2, &mut Stream::to("svc").at(S), Some(5)),
        None
    );
    observe(&mut d[0], &store2, ok("i"), "a:1", Part::Headers, S);
    let mut other = Consumer::new(config(""), false);
    observe(&mut other, &store2, closing("i"), "b:1", Part::Headers, S);
    // 6: d's own bump (its observation of a:1), as if other's were lost.
    assert_eq!(
        d[0].steer(&store2, &mut Stream::to("svc").at(S), Some(6)),
        None
    );
    assert_eq!(
        d[0].steer(&store2, &mut Stream::to("svc").at(S), Some(7)),
        Some("a:1")
    );
}

#[test]
fn a_copy_skips_the_reads_its_own_bumps_would_cause_but_not_another_copys() {
    let (store, mut c) = copies("", 2);
    let counting = Counting(&store, 0.into());
    steer(&mut c[0], &counting, "svc", S);
    steer(&mut c[1], &counting, "svc", S);
    // Copy 0's first response is observed: a write and a bump.
    observe(&mut c[0], &counting, ok("i"), "a:1", Part::Headers, S);
    let reads = counting.1.get();
    steer(&mut c[0], &counting, "svc", S);
    assert_eq!(
        counting.1.get(),
        reads,
        "only its own bump: nothing to read"
    );
    steer(&mut c[1], &counting, "svc", S);
    assert_eq!(
        counting.1.get(),
        reads + 1,
        "another copy's: one generation"
    );
    // Both bump: copy 0 cannot tell, and looks.
    observe(&mut c[0], &counting, closing("i"), "b:1", Part::Headers, S);
    observe(&mut c[1], &counting, ok("i"), "c:1", Part::Headers, S);
    let list = steer(&mut c[0], &counting, "svc", 2 * S).unwrap_or_default();
    let mut hosts: Vec<&str> = list.split(',').collect();
    hosts.sort_unstable();
    assert_eq!(hosts, ["a:1", "c:1"], "another copy's observation is seen");
}

#[test]
fn the_clock_is_read_only_while_a_tombstone_may_be_live() {
    let (store, mut c) = copies(r#"{"failure_tombstone_ttl":"5s"}"#, 1);
    let mut reply = Stream::to("svc").with(":status", "503");
    reply.flags = Some(FLAG_UF);
    observe(&mut c[0], &store, reply, "b:1", Part::Headers, S);
    let signal = Some(SIGNAL.with(Cell::get));
    let mut s = Stream::to("svc").at(2 * S);
    c[0].steer(&store, &mut s, signal);
    assert!(s.clock_reads > 0, "live: the clock decides");
    // Expired (6 s): one more look at the clock, then none.
    let mut s = Stream::to("svc").at(6 * S);
    assert_eq!(c[0].steer(&store, &mut s, signal), None);
    assert_eq!(s.clock_reads, 1);
    let mut s = Stream::to("svc").at(7 * S);
    assert_eq!(c[0].steer(&store, &mut s, signal), None);
    assert_eq!((s.clock_reads, s.cluster_reads), (0, 0));
}

#[test]
fn while_live_every_response_is_observed_and_checked_for_readmission() {
    let (store, mut c) = copies(r#"{"tombstone_ttl":"30s"}"#, 1);
    observe(&mut c[0], &store, closing("old"), "b:1", Part::Headers, S);
    for i in 0..3 {
        let mut s = ok("i");
        let fx = observe_with(&mut c[0], &store, &mut s, "a:1", Part::Headers, 2 * S + i);
        assert!(fx
            .iter()
            .all(|e| *e != Effect::Add(Metric::ConsumerReadmitted, 1)));
        assert_eq!(s.address_reads, 1, "live: membership is observed");
    }
    let fx = observe(&mut c[0], &store, ok("new"), "b:1", Part::Headers, 3 * S);
    assert!(
        fx.contains(&Effect::Add(Metric::ConsumerReadmitted, 1)),
        "{fx:?}"
    );
}

/// An unmarked 200 without an instance id (what an upstream that is no
/// graceful_provider sends) to `cluster`.
fn plain(cluster: &str) -> Stream {
    Stream::to(cluster).with(":status", "200")
}

/// `n` copies whose admin lists `svc`'s three hosts, and 127.0.0.2:1
/// marked closing (instance "old") through copy 0 at `S`.
fn three_hosts_one_closing(n: usize) -> (MemStore, Vec<Consumer>) {
    let (store, mut c) = copies(r#"{"admin_cluster":"admin","tombstone_ttl":"30s"}"#, n);
    admin_knows(&store, &["127.0.0.1:1", "127.0.0.2:1", "127.0.0.3:1"]);
    observe(
        &mut c[0],
        &store,
        closing("old"),
        "127.0.0.2:1",
        Part::Headers,
        S,
    );
    (store, c)
}

#[test]
fn with_the_admin_listing_the_cluster_a_steered_answer_without_an_instance_id_is_an_ordinary_one() {
    let (store, mut c) = three_hosts_one_closing(1);
    let counting = Counting(&store, 0.into());
    let (mut addresses, mut clocks) = (0, 0);
    for i in 0..OBSERVE_EVERY {
        let mut req = Stream::to("svc").at(2 * S + i);
        let list = c[0].steer(&counting, &mut req, Some(SIGNAL.with(Cell::get)));
        assert!(list.is_some_and(|l| !l.contains("127.0.0.2:1")), "steered");
        // The glue reads the cluster once per stream: the response reuses it.
        let mut s = plain("svc");
        let fx = observe_with(
            &mut c[0],
            &counting,
            &mut s,
            "127.0.0.1:1",
            Part::Headers,
            2 * S + i,
        );
        // (the sampled one records the address in the observed set)
        assert!(
            fx.iter()
                .all(|e| matches!(e, Effect::Add(Metric::ConsumerGeneration, 1))),
            "{fx:?}"
        );
        addresses += s.address_reads;
        clocks += s.clock_reads;
    }
    assert_eq!(
        (addresses, clocks),
        (1, 1),
        "observed as often as an ordinary answer: one in {OBSERVE_EVERY}"
    );
    // A tombstoned host answering without an instance id readmits nothing
    // (it never did: `Answered` with no instance changes no tombstone).
    let fx = observe(
        &mut c[0],
        &store,
        plain("svc"),
        "127.0.0.2:1",
        Part::Headers,
        3 * S,
    );
    assert!(
        !fx.contains(&Effect::Add(Metric::ConsumerReadmitted, 1)),
        "{fx:?}"
    );
    assert!(steer(&mut c[0], &store, "svc", 3 * S).is_some_and(|l| !l.contains("127.0.0.2:1")));
    // With an instance id the address is read: a new one readmits at once,
    // the closing one changes nothing.
    let mut same = ok("old");
    let fx = observe_with(
        &mut c[0],
        &store,
        &mut same,
        "127.0.0.2:1",
        Part::Headers,
        3 * S,
    );
    assert!(fx.is_empty(), "{fx:?}");
    assert_eq!(same.address_reads, 1);
    let fx = observe(
        &mut c[0],
        &store,
        ok("new"),
        "127.0.0.2:1",
        Part::Headers,
        4 * S,
    );
    assert!(
        fx.contains(&Effect::Add(Metric::ConsumerReadmitted, 1)),
        "{fx:?}"
    );
    assert_eq!(steer(&mut c[0], &store, "svc", 5 * S), None);
}

#[test]
fn while_live_every_answer_is_observed_where_the_admin_does_not_list_the_cluster() {
    // The admin's membership is known, but not for `other`: steering there
    // takes its members from answers, so none may be skipped (sampling
    // them piled each worker's traffic onto the one host it had seen).
    let (store, mut c) = copies(r#"{"admin_cluster":"admin","tombstone_ttl":"30s"}"#, 1);
    admin_knows(&store, &["127.0.0.1:1"]);
    let mut mark = Stream::to("other")
        .with(":status", "200")
        .with("x-graceful-closing", "true");
    observe_with(&mut c[0], &store, &mut mark, "x:1", Part::Headers, S);
    for (i, address) in ["y:1", "z:1", "y:1"].into_iter().enumerate() {
        let now = 2 * S + i as u64;
        assert!(steer(&mut c[0], &store, "other", now).is_some() || i == 0);
        let mut s = plain("other");
        observe_with(&mut c[0], &store, &mut s, address, Part::Headers, now);
        assert_eq!(s.address_reads, 1, "answer {i}");
    }
    let list = steer(&mut c[0], &store, "other", 3 * S).expect("steered");
    let mut hosts: Vec<&str> = list.split(',').collect();
    hosts.sort_unstable();
    assert_eq!(hosts, ["y:1", "z:1"]);
}

#[test]
fn the_scan_finds_marks_status_and_instance_in_one_pass() {
    let cfg = config("");
    let pairs: &[(&[u8], &[u8])] = &[
        (b":status", b"503"),
        (b"X-Graceful-Instance", b"i1"),
        (b"x-graceful-instance", b"i2"),
        (b"closing", b"false"),
        (b"closing", b"true"),
    ];
    assert_eq!(
        Response::scan(&cfg, pairs.iter().copied()),
        Response {
            closing: false,
            status_503: true,
            instance: Some("i1".into()),
            signal: false,
        },
        "the first of duplicates, as Envoy's single-value lookup"
    );
    let pairs: &[(&[u8], &[u8])] = &[(b"x-graceful-closing", b"no"), (b"closing", b"false, TRUE")];
    assert!(
        Response::scan(&cfg, pairs.iter().copied()).closing,
        "either header, joined values"
    );
    let pairs: &[(&[u8], &[u8])] = &[(b":status", b"200"), (b"x-graceful-instance", b"a b")];
    assert_eq!(
        Response::scan(&cfg, pairs.iter().copied()),
        Response::default()
    );
}

#[test]
fn the_scan_passes_over_names_by_length_and_still_finds_long_ones() {
    let long = "x-".repeat(40);
    let cfg = config(&format!(
        r#"{{"closing_headers":["{long}","Shutting-Down"]}}"#
    ));
    let other = "y".repeat(long.len());
    let pairs: Vec<(&[u8], &[u8])> = vec![
        (b"content-type", b"text/plain"),
        (other.as_bytes(), b"true"),
        (b"SHUTTING-DOWN", b"TRUE"),
    ];
    assert!(
        Response::scan(&cfg, pairs.iter().copied()).closing,
        "a configured name, cased otherwise"
    );
    let upper = long.to_uppercase();
    let pairs: Vec<(&[u8], &[u8])> = vec![(other.as_bytes(), b"true"), (upper.as_bytes(), b"true")];
    assert!(
        Response::scan(&cfg, pairs.iter().copied()).closing,
        "a name of 64 bytes and more"
    );
    let pairs: Vec<(&[u8], &[u8])> = vec![(other.as_bytes(), b"true"), (b"closing", b"true")];
    assert!(
        !Response::scan(&cfg, pairs.iter().copied()).closing,
        "the same lengths, other names"
    );
}

#[test]
fn refused_stats_name_themselves_and_the_matcher() {
    assert_eq!(stats_refused(&[]), None);
    let line = stats_refused(&["graceful_consumer_inflight"]).unwrap_or_default();
    assert!(line.contains("graceful_consumer_inflight"), "{line}");
    assert!(line.contains("stats_matcher") && line.contains("wasmcustom.graceful_"));
}

/// A store whose counters refuse to move: generation bumps fail.
struct NoBumps(MemStore);
impl SharedStore for NoBumps {
    fn get(&self, key: &str) -> Result<Option<store::Versioned>, store::StoreError> {
        self.0.get(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), store::StoreError> {
        if key.ends_with(".gen") {
            return Err(store::StoreError::Host(1));
        }
        self.0.set(key, value, cas)
    }
}

#[test]
fn a_failed_generation_bump_is_logged_once_and_the_change_still_counts() {
    let (store, mut c) = copies("", 1);
    let store = NoBumps(store);
    let warns = |fx: &[Effect]| {
        fx.iter()
            .filter(|e| matches!(e, Effect::Log(Level::Warn, l) if l.contains("not bumped")))
            .count()
    };
    let fx = observe(&mut c[0], &store, closing("i"), "b:1", Part::Headers, S);
    assert_eq!(warns(&fx), 1, "{fx:?}");
    assert!(
        fx.contains(&Effect::Add(Metric::ConsumerEvictions, 1)),
        "fail open"
    );
    let fx = observe(&mut c[0], &store, closing("j"), "b:1", Part::Headers, 2 * S);
    assert_eq!(warns(&fx), 0, "once per VM copy: {fx:?}");
    assert!(fx.contains(&Effect::Add(Metric::ConsumerEvictions, 1)));
}

#[test]
fn the_refresh_asks_the_admin_then_probes_what_is_still_a_member() {
    let json = r#"{"admin_cluster":"admin","membership_refresh":"1s"}"#;
    let (store, mut c) = copies(json, 2);
    observe(&mut c[0], &store, ok("i"), "10.0.0.1:80", Part::Headers, S);
    observe(
        &mut c[0],
        &store,
        closing("i"),
        "10.0.0.2:80",
        Part::Headers,
        S,
    );
    let (fx, calls) = c[1].tick(&store, 2 * S);
    assert!(fx.contains(&Effect::Set(Metric::ConsumerTombstones, 1)));
    let [admin] = calls.as_slice() else {
        panic!("{calls:?}")
    };
    assert_eq!(admin.cluster, "admin");
    assert_eq!(
        admin.kind,
        CallKind::Admin {
            wanted: vec!["svc".into()],
            source: AdminSource::Clusters,
        }
    );
    let (_, again) = c[0].tick(&store, 2 * S);
    assert!(again.is_empty(), "the lease: one copy per interval");
    c[1].sent(7, admin.clone());
    let (_, in_flight) = c[1].tick(&store, 4 * S);
    assert!(in_flight.is_empty(), "one admin call at a time");
    let Some(CallKind::Admin { wanted, source }) = c[1].answer_for(7) else {
        panic!()
    };
    let body = br#"{"cluster_statuses":[{"name":"svc","host_statuses":[
        {"address":{"socket_address":{"address":"10.0.0.1","port_value":80}}},
        {"address":{"socket_address":{"address":"10.0.0.2","port_value":80}}}]}]}"#;
    let (fx, probes) = c[1].admin_answered(
        &store,
        &wanted,
        source,
        Some(b"200"),
        || body.to_vec(),
        4 * S,
    );
    assert_eq!(
        fx,
        [Effect::Add(Metric::ConsumerGeneration, 1)],
        "the signal moves"
    );
    assert_eq!(
        gen(&store, keys::MEMBERS_GEN),
        1,
        "the new membership is announced"
    );
    let [probe] = probes.as_slice() else {
        panic!("{probes:?}")
    };
    assert_eq!(probe.cluster, "svc");
    assert!(probe
        .headers
        .contains(&("x-graceful-override-host".into(), "10.0.0.2:80".into())));
    c[1].sent(8, probe.clone());
    let Some(CallKind::Probe { address }) = c[1].answer_for(8) else {
        panic!()
    };
    let fx = c[1].probe_answered(
        &store,
        &address,
        Some(b"200"),
        Some(b"10.0.0.2:80"),
        Some(b"new".to_vec()),
        || 5 * S,
    );
    assert!(
        fx.contains(&Effect::Add(Metric::ConsumerReadmitted, 1)),
        "{fx:?}"
    );
    assert_eq!(c[1].answer_for(8), None, "answered once");
    // The same answer again: the membership is unchanged, nothing written.
    c[1].sent(9, admin.clone());
    c[1].answer_for(9);
    c[1].admin_answered(
        &store,
        &wanted,
        source,
        Some(b"200"),
        || body.to_vec(),
        6 * S,
    );
    assert_eq!(gen(&store, keys::MEMBERS_GEN), 1);
}

#[test]
fn a_failed_admin_answer_probes_from_the_last_known_membership() {
    let json = r#"{"admin_cluster":"admin"}"#;
    let (store, mut c) = copies(json, 1);
    observe(
        &mut c[0],
        &store,
        closing("i"),
        "10.0.0.2:80",
        Part::Headers,
        S,
    );
    // The tick that sent the admin call read the tombstones the answer
    // works from.
    let (_, calls) = c[0].tick(&store, 2 * S);
    assert_eq!(calls.len(), 1);
    let mut read = false;
    let (fx, probes) = c[0].admin_answered(
        &store,
        &["svc".into()],
        AdminSource::Clusters,
        None,
        || {
            read = true;
            Vec::new()
        },
        2 * S,
    );
    assert!(!read, "no body without a 200");
    assert!(matches!(&fx[..], [Effect::Log(Level::Warn, _)]), "{fx:?}");
    assert_eq!(probes.len(), 1, "membership unknown: probe");
    let (fx, _) = c[0].admin_answered(
        &store,
        &["svc".into()],
        AdminSource::Clusters,
        Some(b"200"),
        || b"{".to_vec(),
        2 * S,
    );
    assert!(matches!(&fx[..], [Effect::Log(Level::Warn, l)] if l.contains("unreadable")));
}

/// The one call `c`'s tick at `at` sends: its membership refresh.
fn next_refresh(c: &mut Consumer, store: &MemStore, at: u64) -> Call {
    let (_, calls) = c.tick(store, at);
    let [call] = calls.as_slice() else {
        panic!("one refresh, not {calls:?}")
    };
    call.clone()
}

#[test]
fn an_admin_that_ignores_the_clusters_filter_turns_every_copy_to_the_config_dump() {
    let json = r#"{"admin_cluster":"admin","membership_refresh":"1s"}"#;
    let (store, mut c) = copies(json, 2);
    observe(&mut c[0], &store, ok("i"), "10.0.0.1:80", Part::Headers, S);
    let (_, calls) = c[0].tick(&store, 2 * S);
    let [admin] = calls.as_slice() else {
        panic!("{calls:?}")
    };
    assert!(admin
        .headers
        .iter()
        .any(|(k, v)| k == ":path" && v.starts_with("/clusters?")));
    // Envoy 1.36: every cluster, the admin's own too.
    let body = br#"{"cluster_statuses":[{"name":"admin","host_statuses":[]},{"name":"svc","host_statuses":[
        {"address":{"socket_address":{"address":"10.0.0.1","port_value":80}}}]}]}"#;
    let (fx, _) = c[0].admin_answered(
        &store,
        &["svc".into()],
        AdminSource::Clusters,
        Some(b"200"),
        || body.to_vec(),
        2 * S,
    );
    assert!(
        fx.iter()
            .any(|e| matches!(e, Effect::Log(Level::Info, l) if l.contains("/config_dump"))),
        "{fx:?}"
    );
    assert_eq!(gen(&store, keys::MEMBERS_GEN), 1, "the answer still counts");
    // The other copy's next refresh reads the config dump.
    let admin = next_refresh(&mut c[1], &store, 4 * S);
    assert!(matches!(
        &admin.kind,
        CallKind::Admin {
            source: AdminSource::ConfigDump,
            ..
        }
    ));
    assert!(
        admin
            .headers
            .iter()
            .any(|(k, v)| k == ":path" && v.starts_with("/config_dump?include_eds&")),
        "{admin:?}"
    );
    // An answer too big to read says the same.
    let store2 = MemStore::new();
    let (fx, _) = c[1].admin_answered(
        &store2,
        &["svc".into()],
        AdminSource::Clusters,
        Some(b"200"),
        || vec![b' '; MAX_ADMIN_BODY],
        4 * S,
    );
    assert!(
        fx.iter().all(|e| !matches!(e, Effect::Log(Level::Warn, _))),
        "no warning for an answer it understood: {fx:?}"
    );
    assert_eq!(AdminSource::shared(&store2), AdminSource::ConfigDump);
    // Envoy refuses a dump whose regex is past its RE2 limit: its words
    // are in the warning.
    let (fx, _) = c[1].admin_answered(
        &store2,
        &["svc".into()],
        AdminSource::ConfigDump,
        Some(b"400"),
        || b"INVALID_ARGUMENT: Error while parsing name_regex".to_vec(),
        5 * S,
    );
    assert!(
        matches!(&fx[..], [Effect::Log(Level::Warn, l)] if l.ends_with("status Some(\"400\"): INVALID_ARGUMENT: Error while parsing name_regex")),
        "{fx:?}"
    );
}

#[test]
fn clusters_unanswered_three_refreshes_in_a_row_turns_every_copy_to_the_config_dump() {
    // Envoy 1.36 in a mesh large enough that the whole /clusters answer
    // outlasts the call's timeout: no answer ever shows the filter ignored.
    let json = r#"{"admin_cluster":"admin","membership_refresh":"1s"}"#;
    let (store, mut c) = copies(json, 2);
    let unanswered = |c: &mut Consumer, status: Option<&[u8]>, at: u64| {
        c.admin_answered(
            &store,
            &["svc".into()],
            AdminSource::Clusters,
            status,
            Vec::new,
            at,
        )
        .0
    };
    let turned = |fx: &[Effect]| {
        fx.iter().any(
            |e| matches!(e, Effect::Log(Level::Info, l) if l.contains("/config_dump from now on")),
        )
    };
    // Two in a row, then an answer (a refusal still answers): the count
    // starts again, and a single busy moment never turns an Envoy.
    assert!(!turned(&unanswered(&mut c[0], None, S)));
    assert!(!turned(&unanswered(&mut c[0], Some(b"504"), 2 * S)));
    assert!(!turned(&unanswered(&mut c[0], Some(b"503"), 3 * S)));
    assert!(!turned(&unanswered(&mut c[0], None, 4 * S)));
    assert!(!turned(&unanswered(&mut c[0], None, 5 * S)));
    assert_eq!(AdminSource::shared(&store), AdminSource::Clusters);
    let fx = unanswered(&mut c[0], Some(b"504"), 6 * S);
    assert!(turned(&fx), "the third in a row turns: {fx:?}");
    assert_eq!(AdminSource::shared(&store), AdminSource::ConfigDump);
    // Every copy reads the dump from its next refresh.
    observe(
        &mut c[1],
        &store,
        ok("i"),
        "10.0.0.1:80",
        Part::Headers,
        6 * S,
    );
    assert!(matches!(
        next_refresh(&mut c[1], &store, 8 * S).kind,
        CallKind::Admin {
            source: AdminSource::ConfigDump,
            ..
        }
    ));
    // The dump's own failures count for nothing: it is the last source.
    let fx = c[1]
        .admin_answered(
            &store,
            &["svc".into()],
            AdminSource::ConfigDump,
            None,
            Vec::new,
            9 * S,
        )
        .0;
    assert!(!turned(&fx), "{fx:?}");
}

#[test]
fn without_an_admin_the_tick_probes_directly_and_skips_probes_in_flight() {
    let (store, mut c) = copies("", 1);
    observe(&mut c[0], &store, closing("i"), "b:1", Part::Headers, S);
    let (_, calls) = c[0].tick(&store, 2 * S);
    let [probe] = calls.as_slice() else {
        panic!("{calls:?}")
    };
    assert_eq!(probe.timeout, Duration::from_secs(1));
    assert!(probe.headers.contains(&(":authority".into(), "b:1".into())));
    c[0].sent(3, probe.clone());
    let (_, calls) = c[0].tick(&store, 4 * S);
    assert!(calls.is_empty(), "still in flight: {calls:?}");
    assert!(matches!(
        probe.not_sent("BadArgument"),
        Effect::Log(Level::Debug, _)
    ));
}

#[test]
fn the_vm_configuration_names_the_placement() {
    assert_eq!(upstream_from_vm_config(b""), Ok(false));
    assert_eq!(upstream_from_vm_config(b" upstream\n"), Ok(true));
    assert!(upstream_from_vm_config(b"downstream").is_err());
}

#[test]
fn header_values_and_instance_ids() {
    assert!(is_true(b"TRUE"));
    assert!(is_true(b"false, true"));
    assert!(!is_true(b"yes"));
    assert_eq!(instance_id(Some(b"abc".to_vec())).as_deref(), Some("abc"));
    assert_eq!(instance_id(Some(b"a b".to_vec())), None);
    assert_eq!(instance_id(None), None);
}

/// The upstream instance's copy, whose bumps go to another stats scope
/// (Envoy 1.36: the cluster's) and so never move the listener's signal.
fn upstream_copy(json: &str) -> Consumer {
    Consumer::new(config(json), true)
}

#[test]
fn a_mark_the_upstream_instance_recorded_in_another_stats_scope_still_steers_every_copy() {
    let (store, mut c) = copies("", 2);
    for (i, a) in ["a:1", "b:1", "c:1"].iter().enumerate() {
        observe(&mut c[i % 2], &store, ok("i"), a, Part::Headers, S);
    }
    assert_eq!(steer(&mut c[1], &store, "svc", S), None);
    let mut up = upstream_copy("");
    let mut s = closing("i");
    s.address = Some("a:1".into());
    let seen = s.scanned(up.config());
    let fx = up.observe_response(&store, &mut s, &seen, Part::Headers);
    assert!(
        fx.contains(&Effect::Add(Metric::ConsumerEvictions, 1)),
        "{fx:?}"
    );
    // Its bump is not carried into this scope's signal. The listener's copy
    // sees the same mark on the final response: recorded already, so no
    // write, but a bump for the others.
    let fx = observe(&mut c[0], &store, closing("i"), "a:1", Part::Headers, S);
    assert_eq!(fx, [Effect::Add(Metric::ConsumerGeneration, 1)]);
    let listed = steer(&mut c[1], &store, "svc", S).unwrap();
    assert!(
        !listed.contains("a:1") && listed.contains("b:1"),
        "{listed}"
    );
}

#[test]
fn a_tick_announces_a_write_whose_bump_this_scope_never_saw() {
    let (store, mut c) = copies("", 2);
    for (i, a) in ["a:1", "b:1", "c:1"].iter().enumerate() {
        observe(&mut c[i % 2], &store, ok("i"), a, Part::Headers, S);
    }
    assert_eq!(steer(&mut c[0], &store, "svc", S), None);
    assert_eq!(steer(&mut c[1], &store, "svc", S), None);
    let signal = Some(SIGNAL.with(Cell::get));
    assert!(
        c[0].notice_unannounced(&store, signal).is_empty(),
        "nothing written: nothing to announce"
    );
    // A refused connection that a retry hid: only the upstream instance
    // saw it.
    let mut up = upstream_copy("");
    up.connect_failed(&store, &mut Stream::to("svc").at(S), "b:1");
    assert_eq!(steer(&mut c[1], &store, "svc", S), None, "not told yet");
    let fx = c[0].notice_unannounced(&store, signal);
    assert_eq!(fx, [Effect::Add(Metric::ConsumerGeneration, 1)]);
    carry(&fx);
    let listed = steer(&mut c[1], &store, "svc", S).unwrap();
    assert!(!listed.contains("b:1"), "{listed}");
    // The signal moved: the next tick of the other copy has nothing to add.
    let now_signal = Some(SIGNAL.with(Cell::get));
    assert!(c[1].notice_unannounced(&store, now_signal).is_empty());
    assert!(c[0].notice_unannounced(&store, now_signal).is_empty());
}

#[test]
fn observed_membership_writes_do_not_make_a_copy_plan_again_where_the_admin_lists_the_cluster() {
    // Under load hosts are seen again some 10 times a second, each a write
    // of the observed membership that moves the signal; with the admin's
    // membership as the plan's source they change nothing in it.
    let (store, mut c) = three_hosts_one_closing(2);
    assert!(steer(&mut c[1], &store, "svc", 2 * S).is_some());
    assert_eq!(c[1].plans_made, 1);
    for (i, address) in ["127.0.0.1:1", "127.0.0.3:1", "127.0.0.9:1"]
        .into_iter()
        .enumerate()
    {
        let before = gen(&store, keys::OBSERVED_GEN);
        let fx = c[0].answered(&store, "svc", address, 3 * S + i as u64);
        carry(&fx);
        assert_eq!(
            gen(&store, keys::OBSERVED_GEN),
            before + 1,
            "{address} written"
        );
        let list = steer(&mut c[1], &store, "svc", 3 * S + i as u64).expect("steered");
        assert!(!list.contains("127.0.0.2:1"), "{list}");
    }
    assert_eq!(
        c[1].plans_made, 1,
        "the observed writes moved nothing it plans from"
    );
    // A tombstone write does.
    observe(
        &mut c[0],
        &store,
        closing("old3"),
        "127.0.0.3:1",
        Part::Headers,
        4 * S,
    );
    let list = steer(&mut c[1], &store, "svc", 4 * S).expect("steered");
    assert!(!list.contains("127.0.0.3:1"), "{list}");
    assert_eq!(c[1].plans_made, 2);
}

#[test]
fn without_an_admin_an_observed_membership_write_makes_a_copy_plan_again() {
    let (store, mut c) = copies(r#"{"tombstone_ttl":"30s"}"#, 2);
    for address in ["127.0.0.1:1", "127.0.0.2:1"] {
        carry(&c[0].answered(&store, "svc", address, S));
    }
    observe(
        &mut c[0],
        &store,
        closing("old"),
        "127.0.0.2:1",
        Part::Headers,
        S,
    );
    assert_eq!(
        steer(&mut c[1], &store, "svc", 2 * S).as_deref(),
        Some("127.0.0.1:1")
    );
    carry(&c[0].answered(&store, "svc", "127.0.0.3:1", 2 * S));
    let list = steer(&mut c[1], &store, "svc", 2 * S + 1).expect("steered");
    assert!(
        list.contains("127.0.0.3:1"),
        "the new member is listed: {list}"
    );
    assert_eq!(c[1].plans_made, 2);
}

thread_local! {
    static DECODES: Cell<usize> = const { Cell::new(0) };
}

fn counted_decode(bytes: &[u8]) -> Option<Membership> {
    DECODES.with(|d| d.set(d.get() + 1));
    Membership::decode(bytes)
}

#[test]
fn a_cache_that_keeps_bytes_decodes_only_what_another_copy_wrote() {
    let store = MemStore::new();
    let gen_key = keys::OBSERVED_GEN.name;
    let key = keys::OBSERVED.name;
    let mut ours: signal::Cached<Membership> = signal::Cached::keeping_bytes();
    // This copy writes, bumps, and reads back its own write: no decode.
    let mut m = Membership::default();
    m.saw("svc", "a:1", S);
    let bytes = m.encode();
    store.set(key, &bytes, 0).unwrap();
    add_bounded(&store, gen_key, 1, u64::MAX).unwrap();
    ours.wrote(m.clone(), bytes);
    assert!(
        ours.refresh(&store, gen_key, key, counted_decode),
        "the generation moved"
    );
    assert_eq!(DECODES.with(Cell::get), 0, "its own bytes");
    assert_eq!(ours.value, m);
    // Another copy writes: decoded.
    let mut theirs = m.clone();
    theirs.saw("svc", "b:1", S);
    store.set(key, &theirs.encode(), 0).unwrap();
    add_bounded(&store, gen_key, 1, u64::MAX).unwrap();
    ours.stale();
    assert!(ours.refresh(&store, gen_key, key, counted_decode));
    assert_eq!((DECODES.with(Cell::get), &ours.value), (1, &theirs));
}

/// Lets another copy's write of `key` land between a read and the next
/// write of it, once: that write loses its compare-and-swap.
struct RacedOnce<'a> {
    inner: &'a MemStore,
    key: &'static str,
    theirs: Vec<u8>,
    raced: Cell<bool>,
}
impl SharedStore for RacedOnce<'_> {
    fn get(&self, key: &str) -> Result<Option<store::Versioned>, store::StoreError> {
        self.inner.get(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), store::StoreError> {
        if key == self.key && !self.raced.replace(true) {
            let current = self.inner.get(key)?.map_or(0, |(_, c)| c);
            self.inner.set(key, &self.theirs, current)?;
        }
        self.inner.set(key, value, cas)
    }
}

#[test]
fn the_cached_observed_membership_is_what_was_read_or_written_whatever_a_write_met() {
    let (store, mut c) = copies("", 1);
    let stored = |store: &MemStore| {
        Membership::decode(&store.get(keys::OBSERVED.name).unwrap().unwrap().0).unwrap()
    };
    // A write: the cache is the value written.
    carry(&c[0].answered(&store, "svc", "a:1", S));
    assert_eq!(c[0].shared_observed.value, stored(&store));
    assert!(c[0].shared_observed.value.seen_lately("svc", "a:1", S));
    // Seen lately: no write, the cache given back as it was.
    let before = c[0].shared_observed.value.clone();
    carry(&c[0].answered(&store, "svc", "a:1", S + 1));
    assert_eq!(c[0].shared_observed.value, before);
    // A lost race: another copy's write lands first; the retry adds to it.
    let mut theirs = stored(&store);
    theirs.saw("svc", "z:9", S + 2);
    let raced = RacedOnce {
        inner: &store,
        key: keys::OBSERVED.name,
        theirs: theirs.encode(),
        raced: Cell::new(false),
    };
    carry(&c[0].answered(&raced, "svc", "b:1", S + 2));
    assert!(raced.raced.get(), "the race was run");
    let now = stored(&store);
    for host in ["a:1", "b:1", "z:9"] {
        assert!(now.seen_lately("svc", host, S + 2), "{host} in {now:?}");
    }
    assert_eq!(c[0].shared_observed.value, now);
}

// ---- the front-proxy role ------------------------------------------------

/// The process's shared data as the mock host holds it, with the
/// consumer's keys, and `n` copies configured with an admin cluster and
/// `front`.
fn front_copies(n: usize) -> (crate::shared::mock::MockStore, Vec<Consumer>) {
    let store = crate::shared::mock::MockStore::default();
    store::ensure_all(&store, &crate::initial::values(keys::Owner::Consumer)).unwrap();
    let json = r#"{"admin_cluster":"admin","front":{}}"#;
    let copies = (0..n).map(|_| Consumer::new(config(json), false)).collect();
    (store, copies)
}

/// Writes the admin's membership from a `/clusters` answer listing, per
/// cluster, `(ip:port, eds health)`, as the refresh would.
fn admin_lists(store: &dyn SharedStore, clusters: &[(&str, &[(&str, &str)])]) {
    let statuses: Vec<String> = clusters
        .iter()
        .map(|(name, hosts)| {
            let hosts: Vec<String> = hosts
                .iter()
                .map(|(a, health)| {
                    let (ip, port) = a.rsplit_once(':').unwrap();
                    let ip = ip.trim_start_matches('[').trim_end_matches(']');
                    format!(
                        r#"{{"address":{{"socket_address":{{"address":"{ip}","port_value":{port}}}}},"health_status":{{"eds_health_status":"{health}"}}}}"#
                    )
                })
                .collect();
            format!(r#"{{"name":"{name}","host_statuses":[{}]}}"#, hosts.join(","))
        })
        .collect();
    let body = format!(r#"{{"cluster_statuses":[{}]}}"#, statuses.join(","));
    let names: Vec<&str> = clusters.iter().map(|(n, _)| *n).collect();
    let m = Membership::from_admin_json(body.as_bytes(), &names).unwrap();
    store.set(keys::MEMBERS.name, &m.encode(), 0).unwrap();
    add_bounded(store, keys::MEMBERS_GEN.name, 1, u64::MAX).unwrap();
    carry(&[Effect::Add(Metric::ConsumerGeneration, 1)]);
}

fn ip(s: &str) -> std::net::Ipv6Addr {
    crate::consumer::front::host_ip(s.parse().unwrap())
}

const SVC_AND_OTHER: [(&str, &[(&str, &str)]); 2] = [
    (
        "svc",
        &[
            ("10.0.0.1:80", "HEALTHY"),
            ("10.0.0.2:80", "HEALTHY"),
            ("10.0.0.3:80", "HEALTHY"),
        ],
    ),
    (
        "other",
        &[("10.0.0.2:90", "HEALTHY"), ("10.0.0.4:90", "HEALTHY")],
    ),
];

#[test]
fn an_announced_host_is_steered_from_by_every_copy_until_it_says_serving() {
    let (store, mut c) = front_copies(2);
    admin_lists(&store, &SVC_AND_OTHER);
    let host = ip("10.0.0.2");
    assert_eq!(
        c[0].front_members_at(&store, host),
        [
            ("svc".to_string(), "10.0.0.2:80".to_string()),
            ("other".to_string(), "10.0.0.2:90".to_string())
        ]
    );
    assert!(c[0].front_members_at(&store, ip("10.0.0.9")).is_empty());
    let fx = c[0].announce_closing(&store, host, S, 120 * S).unwrap();
    carry(&fx);
    assert!(
        fx.contains(&Effect::Add(Metric::ConsumerGeneration, 1)),
        "{fx:?}"
    );
    assert!(
        fx.contains(&Effect::Add(Metric::ConsumerEvictions, 2)),
        "{fx:?}"
    );
    assert!(
        fx.contains(&Effect::Set(Metric::ConsumerTombstones, 2)),
        "{fx:?}"
    );
    let tombstones_gen = store.get(keys::TOMBSTONES_GEN.name).unwrap().unwrap().0;
    assert_eq!(store::read_u64(&tombstones_gen), Some(1), "one write");
    // The other copy steers away from its next request, in both clusters.
    assert_eq!(
        steer(&mut c[1], &store, "svc", 2 * S).as_deref(),
        Some("10.0.0.3:80,10.0.0.1:80")
    );
    assert_eq!(
        steer(&mut c[1], &store, "other", 2 * S).as_deref(),
        Some("10.0.0.4:90")
    );
    // No answer lifts it: not a new instance, not one without an id.
    for instance in ["new", "other"] {
        let fx = observe(
            &mut c[1],
            &store,
            ok(instance),
            "10.0.0.2:80",
            Part::Headers,
            3 * S,
        );
        assert!(
            !fx.contains(&Effect::Add(Metric::ConsumerReadmitted, 1)),
            "{fx:?}"
        );
    }
    let fx = observe(
        &mut c[1],
        &store,
        closing("old"),
        "10.0.0.2:80",
        Part::Headers,
        3 * S,
    );
    assert!(
        !fx.iter()
            .any(|e| matches!(e, Effect::Add(Metric::ConsumerEvictions, _))),
        "{fx:?}"
    );
    assert!(c[1]
        .tombstones
        .value
        .get_live("10.0.0.2:80", 3 * S)
        .is_some_and(|t| t.cause == Cause::Announced));
    // Nor is it probed.
    let members = &c[1].members.value;
    assert!(
        crate::consumer::steering::probe_targets(&c[1].tombstones.value, members, 3 * S).is_empty()
    );
    // Again within a second: nothing written.
    assert_eq!(
        c[0].announce_closing(&store, host, S + S / 2, 120 * S),
        Ok(Vec::new())
    );
    // The host says serving: lifted, every copy stops steering.
    let fx = c[0].lift_announced(&store, host, 4 * S).unwrap();
    carry(&fx);
    assert!(
        fx.contains(&Effect::Add(Metric::ConsumerReadmitted, 2)),
        "{fx:?}"
    );
    assert_eq!(steer(&mut c[1], &store, "svc", 5 * S), None);
    assert_eq!(
        c[0].lift_announced(&store, host, 5 * S),
        Ok(Vec::new()),
        "nothing left"
    );
}

#[test]
fn the_front_view_says_listed_draining_healthy_and_steerable_per_ip() {
    let (store, mut c) = front_copies(1);
    admin_lists(
        &store,
        &[
            (
                "svc",
                &[
                    ("10.0.0.1:80", "HEALTHY"),
                    ("10.0.0.2:80", "DRAINING"),
                    ("10.0.0.3:80", "HEALTHY"),
                    ("[fd00::5]:80", "UNHEALTHY"),
                ],
            ),
            ("alone", &[("10.0.0.6:80", "DRAINING")]),
        ],
    );
    let asked = [
        ip("10.0.0.1"),
        ip("10.0.0.2"),
        ip("10.0.0.3"),
        ip("fd00::5"),
        ip("10.0.0.6"),
        ip("10.0.0.9"),
    ];
    c[0].announce_closing(&store, ip("10.0.0.3"), S, 120 * S)
        .map(|fx| carry(&fx))
        .unwrap();
    let view = c[0].front_view(&store, &asked, 2 * S);
    let v = |healthy, draining, listed, steerable| FrontHostView {
        listed,
        draining,
        healthy,
        steerable,
    };
    // (healthy, draining, listed, steerable)
    assert_eq!(
        view[&ip("10.0.0.1")],
        v(true, false, true, false),
        "svc's only acceptable host"
    );
    assert_eq!(
        view[&ip("10.0.0.2")],
        v(false, true, true, true),
        "DRAINING: steered to 10.0.0.1"
    );
    assert_eq!(
        view[&ip("10.0.0.3")],
        v(true, false, true, true),
        "announced, still listed HEALTHY"
    );
    assert_eq!(
        view[&ip("fd00::5")],
        v(false, false, true, true),
        "unusable: never listed"
    );
    assert_eq!(
        view[&ip("10.0.0.6")],
        v(false, true, true, false),
        "no acceptable host in its cluster"
    );
    assert_eq!(
        view[&ip("10.0.0.9")],
        v(false, false, false, true),
        "not listed: nothing can pick it"
    );
    assert_eq!(
        c[0].front_draining(&store),
        [ip("10.0.0.2"), ip("10.0.0.6")]
    );
    // The last resort is no steering: every host of svc announced.
    for h in ["10.0.0.1", "10.0.0.2"] {
        c[0].announce_closing(&store, ip(h), 3 * S, 120 * S)
            .map(|fx| carry(&fx))
            .unwrap();
    }
    let view = c[0].front_view(&store, &asked, 4 * S);
    assert!(asked[..4].iter().all(|a| !view[a].steerable), "{view:?}");
}

#[test]
fn a_draining_member_steers_its_cluster_with_no_tombstone() {
    let (store, mut c) = front_copies(2);
    admin_lists(
        &store,
        &[(
            "svc",
            &[("10.0.0.1:80", "HEALTHY"), ("10.0.0.2:80", "DRAINING")],
        )],
    );
    // A copy reads the membership at its responses (the first is sampled
    // and reads nothing), then steers from its next request.
    assert_eq!(steer(&mut c[0], &store, "svc", S), None, "not read yet");
    for _ in 0..2 {
        observe(&mut c[0], &store, ok("i"), "10.0.0.1:80", Part::Headers, S);
    }
    assert_eq!(
        steer(&mut c[0], &store, "svc", S).as_deref(),
        Some("10.0.0.1:80")
    );
    // The front's own calls read it too.
    assert_eq!(c[1].front_draining(&store), [ip("10.0.0.2")]);
    assert_eq!(
        steer(&mut c[1], &store, "svc", S).as_deref(),
        Some("10.0.0.1:80")
    );
    // Listed HEALTHY again: the balancer decides.
    admin_lists(
        &store,
        &[(
            "svc",
            &[("10.0.0.1:80", "HEALTHY"), ("10.0.0.2:80", "HEALTHY")],
        )],
    );
    observe(
        &mut c[0],
        &store,
        ok("i"),
        "10.0.0.1:80",
        Part::Headers,
        2 * S,
    );
    assert_eq!(steer(&mut c[0], &store, "svc", 2 * S), None);
}

#[test]
fn a_sidecar_consumer_leaves_a_draining_members_cluster_to_the_balancer() {
    // The same admin and membership without `front`: as before the front
    // role, a DRAINING member is only unusable, and its cluster is
    // steered by tombstones alone, never naming it.
    let (store, mut c) = copies(r#"{"admin_cluster":"admin","max_tombstones":64}"#, 1);
    admin_lists(
        &store,
        &[(
            "svc",
            &[
                ("10.0.0.1:80", "HEALTHY"),
                ("10.0.0.2:80", "DRAINING"),
                ("10.0.0.3:80", "HEALTHY"),
            ],
        )],
    );
    for _ in 0..2 {
        observe(&mut c[0], &store, ok("i"), "10.0.0.1:80", Part::Headers, S);
    }
    assert_eq!(steer(&mut c[0], &store, "svc", S), None, "LeaveAlone");
    observe(
        &mut c[0],
        &store,
        closing("i"),
        "10.0.0.3:80",
        Part::Headers,
        S,
    );
    assert_eq!(
        steer(&mut c[0], &store, "svc", S).as_deref(),
        Some("10.0.0.1:80"),
        "a tombstone steers, the DRAINING member never named"
    );
}

#[test]
fn a_failed_announce_is_an_error_and_changes_nothing() {
    let (store, mut c) = front_copies(1);
    admin_lists(&store, &SVC_AND_OTHER);
    let refusing = Refusing(&store, keys::TOMBSTONES.name);
    let err = c[0].announce_closing(&refusing, ip("10.0.0.2"), S, 120 * S);
    assert!(err.is_err(), "{err:?}");
    assert_eq!(steer(&mut c[0], &store, "svc", S), None);
}

/// A store that refuses writes to one key.
struct Refusing<'a>(&'a dyn SharedStore, &'static str);
impl SharedStore for Refusing<'_> {
    fn get(&self, key: &str) -> Result<Option<store::Versioned>, store::StoreError> {
        self.0.get(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), store::StoreError> {
        if key == self.1 {
            return Err(store::StoreError::Host(1));
        }
        self.0.set(key, value, cas)
    }
}

#[test]
fn member_ips_are_the_fronts_host_keys_and_rq_active_is_read_per_ip() {
    for a in ["10.0.0.1:80", "[::ffff:10.0.0.1]:80", "[fd00::3]:8080"] {
        let socket: std::net::SocketAddr = a.parse().unwrap();
        assert_eq!(
            crate::consumer::steering::member_ip(a),
            Some(crate::consumer::front::host_ip(socket.ip())),
            "{a}"
        );
    }
    let body = br#"{"cluster_statuses":[{"name":"svc","host_statuses":[
        {"address":{"socket_address":{"address":"10.0.0.1","port_value":80}},"stats":[{"value":"2","name":"rq_active","type":"GAUGE"}]},
        {"address":{"socket_address":{"address":"fd00::3","port_value":80}},"stats":[{"value":"5","name":"rq_total"}]}]}]}"#;
    let active = front::parse_rq_active(body).unwrap();
    assert_eq!((active[&ip("10.0.0.1")], active[&ip("fd00::3")]), (2, 0));
    assert_eq!(front::parse_rq_active(b"not json"), None);
}
