use super::*;
use crate::config::ConsumerConfig;
use crate::store::MemStore;
use std::time::Duration;

/// A stream as the glue would show it: fixed headers, a cluster, flags;
/// counts the lookups, which are hostcalls in the filter.
#[derive(Default)]
struct Stream {
    cluster: String,
    headers: Vec<(&'static str, Vec<u8>)>,
    flags: Option<u64>,
    cluster_reads: usize,
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
}

impl Exchange for Stream {
    fn cluster(&mut self) -> String {
        self.cluster_reads += 1;
        self.cluster.clone()
    }
    fn header(&mut self, name: &str) -> Option<Vec<u8>> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    }
    fn response_flags(&mut self) -> Option<u64> {
        self.flags
    }
}

fn config(json: &str) -> ConsumerConfig {
    ConsumerConfig::from_json(json.as_bytes()).unwrap()
}

/// A process's store with the consumer's keys created, and `n` copies.
fn copies(json: &str, n: usize) -> (MemStore, Vec<Consumer>) {
    let store = MemStore::new();
    store::ensure_all(&store, &keys::initial_values(keys::Owner::Consumer)).unwrap();
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
        c[0].observe_response(&store, &mut ok("i"), a, Part::Headers, S);
    }
    let fx = c[0].observe_response(&store, &mut closing("i"), "b:1", Part::Headers, S);
    assert!(fx.contains(&Effect::Add(Counter::Evictions, 1)), "{fx:?}");
    assert!(fx.contains(&Effect::Set(Gauge::Tombstones, 1)));
    assert_eq!(gen(&store, keys::TOMBSTONES_GEN), 1);
    // Copy 1 never saw an answer: it steers from the shared observed set.
    let list = c[1].steer(&store, &mut Stream::to("svc"), 2 * S);
    assert_eq!(list.as_deref(), Some("a:1"));
    assert_eq!(
        c[0].steer(&store, &mut Stream::to("other"), 2 * S),
        None,
        "another cluster"
    );
}

#[test]
fn a_repeated_mark_is_written_only_when_it_adds_a_second() {
    let (store, mut c) = copies("", 1);
    c[0].observe_response(&store, &mut closing("i"), "b:1", Part::Headers, S);
    let cas = store.get(keys::TOMBSTONES.name).unwrap().unwrap().1;
    let fx = c[0].observe_response(&store, &mut closing("i"), "b:1", Part::Headers, S + S / 2);
    assert!(fx.is_empty(), "{fx:?}");
    assert_eq!(
        store.get(keys::TOMBSTONES.name).unwrap().unwrap().1,
        cas,
        "no write"
    );
    c[0].observe_response(&store, &mut closing("i"), "b:1", Part::Headers, 3 * S);
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
    c[0].observe_response(&store, &mut closing("old"), "b:1", Part::Headers, S);
    let same = c[0].observe_response(&store, &mut ok("old"), "b:1", Part::Headers, 2 * S);
    assert!(!same.contains(&Effect::Add(Counter::Readmitted, 1)));
    let fx = c[0].observe_response(&store, &mut ok("new"), "b:1", Part::Headers, 3 * S);
    assert!(fx.contains(&Effect::Add(Counter::Readmitted, 1)), "{fx:?}");
    assert_eq!(c[0].steer(&store, &mut Stream::to("svc"), 4 * S), None);
}

#[test]
fn connect_failures_evict_downstream_as_local_503s_and_upstream_as_failed_attempts() {
    let (store, mut c) = copies("", 1);
    let mut reply = Stream::to("svc").with(":status", "503");
    reply.flags = Some(FLAG_UF);
    let fx = c[0].observe_response(&store, &mut reply, "b:1", Part::Headers, S);
    assert!(fx.contains(&Effect::Add(Counter::Evictions, 1)), "{fx:?}");

    let mut up = Consumer::new(config(""), true);
    let mut reply = Stream::to("svc").with(":status", "503");
    reply.flags = Some(FLAG_UF);
    assert!(up
        .observe_response(&store, &mut reply, "c:1", Part::Headers, S)
        .is_empty());
    assert!(up.attempt_may_have_failed(false));
    assert!(!up.attempt_may_have_failed(true), "it answered");
    let fx = up.connect_failed(&store, &mut Stream::to("svc"), "c:1", S);
    assert!(fx.contains(&Effect::Add(Counter::Evictions, 1)), "{fx:?}");
    assert!(!c[0].attempt_may_have_failed(false), "downstream: never");
}

#[test]
fn marks_in_trailers_count_and_other_trailers_are_not_answers() {
    let (store, mut c) = copies("", 1);
    let fx = c[0].observe_response(&store, &mut ok("i"), "a:1", Part::Trailers, S);
    assert!(fx.is_empty());
    assert_eq!(
        store.get(keys::OBSERVED.name).unwrap().unwrap().0,
        [1, 0, 0]
    );
    let mut t = Stream::to("svc").with("closing", "false, TRUE");
    let fx = c[0].observe_response(&store, &mut t, "a:1", Part::Trailers, S);
    assert!(fx.contains(&Effect::Add(Counter::Evictions, 1)), "{fx:?}");
}

#[test]
fn an_ordinary_request_reads_one_generation_and_no_cluster() {
    struct Counting<'a>(&'a MemStore, std::cell::Cell<usize>);
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
    let (store, mut c) = copies("", 1);
    let counting = Counting(&store, 0.into());
    let mut s = Stream::to("svc");
    c[0].steer(&counting, &mut s, S);
    let first = counting.1.get();
    c[0].steer(&counting, &mut s, S);
    assert_eq!(counting.1.get() - first, 1, "the generation only");
    assert_eq!(
        s.cluster_reads, 0,
        "no tombstone: the cluster is not needed"
    );
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
    let fx = c[0].observe_response(&store, &mut closing("i"), "b:1", Part::Headers, S);
    assert_eq!(warns(&fx), 1, "{fx:?}");
    assert!(
        fx.contains(&Effect::Add(Counter::Evictions, 1)),
        "fail open"
    );
    let fx = c[0].observe_response(&store, &mut closing("j"), "b:1", Part::Headers, 2 * S);
    assert_eq!(warns(&fx), 0, "once per VM copy: {fx:?}");
    assert!(fx.contains(&Effect::Add(Counter::Evictions, 1)));
}

#[test]
fn the_refresh_asks_the_admin_then_probes_what_is_still_a_member() {
    let json = r#"{"admin_cluster":"admin","membership_refresh":"1s"}"#;
    let (store, mut c) = copies(json, 2);
    c[0].observe_response(&store, &mut ok("i"), "10.0.0.1:80", Part::Headers, S);
    c[0].observe_response(&store, &mut closing("i"), "10.0.0.2:80", Part::Headers, S);
    let (fx, calls) = c[1].on_tick(&store, 2 * S);
    assert!(fx.contains(&Effect::Set(Gauge::Inflight, 0)));
    assert!(fx.contains(&Effect::Set(Gauge::Tombstones, 1)));
    let [admin] = calls.as_slice() else {
        panic!("{calls:?}")
    };
    assert_eq!(admin.cluster, "admin");
    assert_eq!(
        admin.kind,
        CallKind::Admin {
            wanted: vec!["svc".into()]
        }
    );
    let (_, again) = c[0].on_tick(&store, 2 * S);
    assert!(again.is_empty(), "the lease: one copy per interval");
    c[1].sent(7, admin.clone());
    let (_, in_flight) = c[1].on_tick(&store, 4 * S);
    assert!(in_flight.is_empty(), "one admin call at a time");
    let Some(CallKind::Admin { wanted }) = c[1].answer_for(7) else {
        panic!()
    };
    let body = br#"{"cluster_statuses":[{"name":"svc","host_statuses":[
        {"address":{"socket_address":{"address":"10.0.0.1","port_value":80}}},
        {"address":{"socket_address":{"address":"10.0.0.2","port_value":80}}}]}]}"#;
    let (fx, probes) = c[1].admin_answered(&store, &wanted, Some(b"200"), || body.to_vec(), 4 * S);
    assert!(fx.is_empty(), "{fx:?}");
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
    assert!(fx.contains(&Effect::Add(Counter::Readmitted, 1)), "{fx:?}");
    assert_eq!(c[1].answer_for(8), None, "answered once");
    // The same answer again: the membership is unchanged, nothing written.
    c[1].sent(9, admin.clone());
    c[1].answer_for(9);
    c[1].admin_answered(&store, &wanted, Some(b"200"), || body.to_vec(), 6 * S);
    assert_eq!(gen(&store, keys::MEMBERS_GEN), 1);
}

#[test]
fn a_failed_admin_answer_probes_from_the_last_known_membership() {
    let json = r#"{"admin_cluster":"admin"}"#;
    let (store, mut c) = copies(json, 1);
    c[0].observe_response(&store, &mut closing("i"), "10.0.0.2:80", Part::Headers, S);
    // The tick that sent the admin call read the tombstones the answer
    // works from.
    let (_, calls) = c[0].on_tick(&store, 2 * S);
    assert_eq!(calls.len(), 1);
    let mut read = false;
    let (fx, probes) = c[0].admin_answered(
        &store,
        &["svc".into()],
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
        Some(b"200"),
        || b"{".to_vec(),
        2 * S,
    );
    assert!(matches!(&fx[..], [Effect::Log(Level::Warn, l)] if l.contains("unreadable")));
}

#[test]
fn without_an_admin_the_tick_probes_directly_and_skips_probes_in_flight() {
    let (store, mut c) = copies("", 1);
    c[0].observe_response(&store, &mut closing("i"), "b:1", Part::Headers, S);
    let (_, calls) = c[0].on_tick(&store, 2 * S);
    let [probe] = calls.as_slice() else {
        panic!("{calls:?}")
    };
    assert_eq!(probe.timeout, Duration::from_secs(1));
    assert!(probe.headers.contains(&(":authority".into(), "b:1".into())));
    c[0].sent(3, probe.clone());
    let (_, calls) = c[0].on_tick(&store, 4 * S);
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
