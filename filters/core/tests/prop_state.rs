//! Property tests of the core's state machines: the tombstone list;
//! steering; the long-poll bookkeeping; and the shared-data helpers. (The
//! drain gate and admission: `gate_model.rs`.)

// Test code: a panic is how a property fails (clippy's in-test allowances
// do not reach the strategy helpers outside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use graceful_core::consumer::steering::{
    plan, probe_observation, probe_targets, Member, Membership, Rules, Steering,
    MAX_OVERRIDE_HOSTS, MAX_PROBES,
};
use graceful_core::consumer::tombstone::{Cause, Change, Observation, Tombstones, Ttls};
use graceful_core::drain::endpoints::Waiters;
use graceful_core::drain::record::{self, InstanceRecord};
use graceful_core::shared::store::{add_bounded, take_lease, update, MemStore, SharedStore};
use proptest::prelude::*;

mod common;
use common::config;

const S: u64 = 1_000_000;

fn us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap()
}

// ---- tombstones -------------------------------------------------------

#[derive(Debug, Clone)]
enum Obs {
    Closing(usize, Option<usize>),
    Failure(usize),
    Answered(usize, Option<usize>),
    /// The host told the front it is closing (announced, for [`ANNOUNCED_US`]).
    Announced(usize),
    /// The host said `serving`: its announced tombstone lifted.
    Lifted(usize),
}

/// How long an announced tombstone lives here (a front's `closing_ttl`).
const ANNOUNCED_US: u64 = 120 * S;

const ADDRESSES: [&str; 6] = [
    "10.0.0.1:80",
    "10.0.0.2:80",
    "10.0.0.3:80",
    "[::1]:80",
    "10.0.0.5:80",
    "10.0.0.6:80",
];
const INSTANCES: [&str; 3] = ["a", "b", "c"];

fn obs() -> impl Strategy<Value = Obs> {
    let addr = 0..ADDRESSES.len();
    let inst = prop::option::of(0..INSTANCES.len());
    prop_oneof![
        (addr.clone(), inst.clone()).prop_map(|(a, i)| Obs::Closing(a, i)),
        addr.clone().prop_map(Obs::Failure),
        (addr, inst).prop_map(|(a, i)| Obs::Answered(a, i)),
    ]
}

/// The observation `o` is; the front's events are none (see [`apply`]).
fn observation(o: &Obs) -> Observation<'static> {
    let inst = |i: &Option<usize>| i.map(|i| INSTANCES[i]);
    match o {
        Obs::Closing(a, i) => Observation::Closing {
            cluster: "svc",
            address: ADDRESSES[*a],
            instance: inst(i),
        },
        Obs::Failure(a) => Observation::ConnectFailure {
            cluster: "svc",
            address: ADDRESSES[*a],
        },
        Obs::Answered(a, i) => Observation::Answered {
            address: ADDRESSES[*a],
            instance: inst(i),
        },
        // Not observations ([`apply`] takes them apart): an answer without
        // an id stands in.
        Obs::Announced(a) | Obs::Lifted(a) => Observation::Answered {
            address: ADDRESSES[*a],
            instance: None,
        },
    }
}

fn address_of(o: &Obs) -> &'static str {
    match o {
        Obs::Closing(a, _)
        | Obs::Failure(a)
        | Obs::Answered(a, _)
        | Obs::Announced(a)
        | Obs::Lifted(a) => ADDRESSES[*a],
    }
}

/// Observations and the front's events alike.
fn event() -> impl Strategy<Value = Obs> {
    let addr = 0..ADDRESSES.len();
    prop_oneof![
        4 => obs(),
        1 => addr.clone().prop_map(Obs::Announced),
        1 => addr.prop_map(Obs::Lifted),
    ]
}

/// Applies `o` to `list` as the consumer would: an observation, or the
/// front's announce or lift (a lift that removed something is a
/// readmission here).
fn apply(list: &mut Tombstones, o: &Obs, ttls: &Ttls, now: u64, max: usize) -> Change {
    match o {
        Obs::Announced(a) => list.announce("svc", ADDRESSES[*a], now, now + ANNOUNCED_US, max),
        Obs::Lifted(a) => match list.lift_announced(now, |x| x == ADDRESSES[*a]) {
            0 => Change::Unchanged,
            _ => Change::Readmitted,
        },
        o => list.observe(&observation(o), ttls, now, max),
    }
}

fn ttls() -> impl Strategy<Value = Ttls> {
    (1..60 * S, 1..60 * S).prop_map(|(c, f)| Ttls {
        closing: Duration::from_micros(c),
        failure: Duration::from_micros(f),
        warming: None,
    })
}

/// Members, about 1 in 10 listed `DRAINING` (so not usable), 1 in 10
/// otherwise unusable.
fn members() -> impl Strategy<Value = Vec<Member>> {
    prop::collection::vec((0..ADDRESSES.len(), 0u8..10), 0..8).prop_map(|v| {
        v.into_iter()
            .map(|(a, health)| Member {
                priority: 0,
                address: ADDRESSES[a].to_string(),
                usable: health >= 2,
                draining: health == 0,
                seen_s: 0,
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn tombstones_keep_their_rules_under_any_observations(
        ttls in ttls(),
        max in 1usize..5,
        steps in prop::collection::vec((0..10 * S, event()), 1..50),
    ) {
        let mut list = Tombstones::default();
        let mut now = 0;
        for (dt, o) in &steps {
            now += dt;
            let before = list.clone();
            let address = address_of(o);
            let live_before = before.get_live(address, now).cloned();
            let change = apply(&mut list, o, &ttls, now, max);
            let after = list.get_live(address, now);
            prop_assert!(list.entries().len() <= max.max(before.entries().len()));
            if change != Change::Unchanged {
                prop_assert!(list.entries().len() <= max);
                prop_assert!(list.entries().iter().all(|t| t.expires_us > now), "expired entry kept");
            }
            for (i, t) in list.entries().iter().enumerate() {
                prop_assert!(
                    !list.entries()[..i].iter().any(|u| u.address == t.address),
                    "two entries for {}", t.address
                );
            }
            match change {
                Change::Unchanged => prop_assert_eq!(&list, &before, "{:?} said Unchanged but changed the list", o),
                Change::Readmitted => {
                    prop_assert!(matches!(o, Obs::Answered(_, Some(_)) | Obs::Lifted(_)));
                    prop_assert!(live_before.is_some() && after.is_none());
                    // Only a lift ends an announced tombstone; a lift ends
                    // nothing else.
                    let announced = live_before.as_ref().is_some_and(|t| t.cause == Cause::Announced);
                    prop_assert_eq!(announced, matches!(o, Obs::Lifted(_)), "{:?} readmitted {:?}", o, live_before);
                }
                Change::Extended => {
                    let (old, new) = (live_before.clone().unwrap(), after.unwrap());
                    let learned = (old.instance.is_empty() && !new.instance.is_empty())
                        || (old.cause != new.cause);
                    prop_assert!(
                        new.expires_us > old.expires_us || (new.expires_us == old.expires_us && learned),
                        "extended without a later expiry or anything learned"
                    );
                }
                Change::Evicted => {
                    prop_assert!(!matches!(o, Obs::Answered(..)));
                    prop_assert!(!matches!(o, Obs::Lifted(_)));
                    match after {
                        Some(t) => {
                            let ttl = match o {
                                Obs::Failure(_) => us(ttls.failure),
                                Obs::Announced(_) => ANNOUNCED_US,
                                _ => us(ttls.closing),
                            };
                            prop_assert_eq!(t.expires_us, now + ttl);
                        }
                        // Evicted but not kept: the list was full of entries
                        // expiring no earlier.
                        None => prop_assert_eq!(list.entries().len(), max),
                    }
                }
            }
            // An announced tombstone keeps its cause through any
            // observation; an announce always leaves one.
            if live_before.as_ref().is_some_and(|t| t.cause == Cause::Announced) && !matches!(o, Obs::Lifted(_)) {
                prop_assert_eq!(after.map(|t| t.cause), Some(Cause::Announced), "{:?}", o);
            }
            if matches!(o, Obs::Announced(_)) && after.is_some() {
                prop_assert_eq!(after.map(|t| (t.cause, t.trial)), Some((Cause::Announced, None)));
            }
            if let (Obs::Answered(_, None), Some(t)) = (o, &live_before) {
                prop_assert!(
                    !t.instance.is_empty() || after.is_some(),
                    "an answer without an instance id readmitted a host"
                );
            }
            prop_assert_eq!(Tombstones::decode(&list.encode()), Some(list.clone()));
        }
    }

    #[test]
    fn a_closing_host_stays_evicted_until_its_ttl_unless_a_new_instance_answers(
        ttls in ttls(),
        instance in 0..INSTANCES.len(),
        later in prop::collection::vec((0..5 * S, obs()), 0..20),
    ) {
        let mut list = Tombstones::default();
        let addr = 0;
        list.observe(&observation(&Obs::Closing(addr, Some(instance))), &ttls, 0, 16);
        let mut now = 0;
        for (dt, o) in &later {
            now += dt;
            list.observe(&observation(o), &ttls, now, 16);
            let readmitted_by_new = matches!(o, Obs::Answered(a, Some(i)) if *a == addr && *i != instance)
                || matches!(o, Obs::Closing(a, Some(i)) if *a == addr && *i != instance);
            if readmitted_by_new {
                return Ok(());
            }
            if now < us(ttls.closing) {
                prop_assert!(list.get_live(ADDRESSES[addr], now).is_some(), "readmitted early by {o:?}");
            }
        }
    }

    #[test]
    fn an_announced_host_stays_evicted_until_lifted_or_expired_whatever_it_answers(
        ttls in ttls(),
        later in prop::collection::vec((0..5 * S, obs()), 0..30),
        lift_at in prop::option::of(0usize..30),
    ) {
        let mut list = Tombstones::default();
        let addr = ADDRESSES[0];
        list.announce("svc", addr, 0, ANNOUNCED_US, 16);
        let mut now = 0;
        for (i, (dt, o)) in later.iter().enumerate() {
            now += dt;
            if lift_at == Some(i) {
                prop_assert_eq!(list.lift_announced(now, |a| a == addr), 1);
                prop_assert!(list.get_live(addr, now).is_none());
                return Ok(());
            }
            list.observe(&observation(o), &ttls, now, 16);
            // As if a last resort's answer readmitted another host.
            list.vouch("svc", 0, now);
            if now >= ANNOUNCED_US {
                return Ok(());
            }
            prop_assert!(
                probe_targets(&list, &Membership::default(), now).iter().all(|t| t.address != addr),
                "an announced host probed"
            );
            let t = list.get_live(addr, now);
            prop_assert!(t.is_some_and(|t| t.cause == Cause::Announced && t.trial.is_none()), "{:?} after {:?}", t, o);
        }
    }

    // ---- steering ---------------------------------------------------------

    #[test]
    fn steering_names_only_usable_live_members_rotating_over_all_of_them(
        members in members(),
        tomb in prop::collection::vec((0..ADDRESSES.len(), 0u8..3), 0..4),
        ask_other_cluster in any::<bool>(),
        now in 0..40 * S,
        rotation in any::<usize>(),
    ) {
        let mut list = Tombstones::default();
        for (a, cause) in &tomb {
            let ttls = Ttls { closing: Duration::from_secs(30), failure: Duration::from_secs(5), warming: None };
            let address = ADDRESSES[*a];
            match cause {
                0 => list.observe(&Observation::Closing { cluster: "svc", address, instance: Some("i") }, &ttls, 0, 64),
                1 => list.observe(&Observation::ConnectFailure { cluster: "svc", address }, &ttls, 0, 64),
                _ => list.announce("svc", address, 0, 20 * S, 64),
            };
        }
        let cluster = if ask_other_cluster { "other" } else { "svc" };
        let live: Vec<&str> = list.live(now).map(|t| t.address.as_str()).collect();
        // A member listed `DRAINING` steers its cluster as a tombstone does.
        let concerned = (!live.is_empty() && cluster == "svc")
            || members.iter().any(|m| live.contains(&m.address.as_str()) || m.draining);
        let mut acceptable: Vec<&str> = Vec::new();
        for m in &members {
            if m.usable && !live.contains(&m.address.as_str()) && !acceptable.contains(&m.address.as_str()) {
                acceptable.push(&m.address);
            }
        }
        // The panic floor off: this oracle is the plain rule (the floor's is
        // prop_consumer.rs).
        let rules = Rules { ttls: Ttls { closing: Duration::from_secs(30), failure: Duration::from_secs(5), warming: None }, panic_threshold: 0, slow_start: None, steer_draining: true };
        match plan(&members, &list, cluster, now, &rules).0.steering(rotation) {
            Steering::LeaveAlone => prop_assert!(!concerned),
            Steering::NoneLeft => prop_assert!(concerned && acceptable.is_empty()),
            Steering::Steer(header) => {
                prop_assert!(concerned);
                let named: Vec<&str> = header.split(',').collect();
                prop_assert_eq!(named.len(), acceptable.len().min(MAX_OVERRIDE_HOSTS));
                prop_assert_eq!(named[0], acceptable[rotation % acceptable.len()]);
                for (i, n) in named.iter().enumerate() {
                    prop_assert!(acceptable.contains(n), "{n} named");
                    // (An address listed twice may be usable once.)
                    prop_assert!(!members.iter().filter(|m| m.address == *n).all(|m| m.draining), "{n} is draining");
                    prop_assert!(!named[..i].contains(n), "{n} twice");
                }
            }
        }
    }

    #[test]
    fn probe_answers_count_only_from_the_probed_address_with_an_instance(
        probed in prop::sample::select(ADDRESSES.to_vec()),
        status in prop::option::of(prop_oneof![
            Just(b"200".to_vec()),
            Just(b"503".to_vec()),
            prop::collection::vec(any::<u8>(), 0..4),
        ]),
        answered_at in prop::option::of(prop_oneof![
            prop::sample::select(ADDRESSES.to_vec()).prop_map(|a| a.as_bytes().to_vec()),
            prop::collection::vec(any::<u8>(), 0..12),
        ]),
        instance in prop::option::of("[ -~]{0,8}"),
    ) {
        let got = probe_observation(probed, status.as_deref(), answered_at.as_deref(), instance.as_deref());
        let from_probed = answered_at.as_deref() == Some(probed.as_bytes());
        match got {
            None => prop_assert!(
                !from_probed || instance.is_none() || !matches!(status.as_deref(), Some(b"200" | b"503"))
            ),
            Some(Observation::Answered { address, instance: i }) => {
                prop_assert!(from_probed && status.as_deref() == Some(b"200"));
                prop_assert_eq!((address, i), (probed, instance.as_deref()));
            }
            Some(Observation::Closing { address, instance: i, .. }) => {
                prop_assert!(from_probed && status.as_deref() == Some(b"503"));
                prop_assert_eq!((address, i), (probed, instance.as_deref()));
            }
            Some(other) => prop_assert!(false, "{other:?}"),
        }
    }

    #[test]
    fn probe_targets_are_live_member_tombstones_and_bounded(
        tomb in prop::collection::vec((0..ADDRESSES.len(), 0u64..4), 0..ADDRESSES.len()),
        known in prop::option::of(prop::collection::vec(0..ADDRESSES.len(), 0..6)),
        now in 0..40 * S,
    ) {
        let mut list = Tombstones::default();
        for (a, c) in &tomb {
            let cluster = ["svc", "", "other", "svc"][*c as usize];
            if *c == 3 {
                list.announce(cluster, ADDRESSES[*a], 0, 30 * S, 64);
                continue;
            }
            list.observe(
                &Observation::Closing { cluster, address: ADDRESSES[*a], instance: Some("i") },
                &Ttls { closing: Duration::from_secs(30), failure: Duration::from_secs(5), warming: None },
                0,
                64,
            );
        }
        let mut membership = Membership::default();
        if let Some(known) = &known {
            membership.saw("svc", "placeholder:1", 1_800_000_000_000_000);
            for a in known {
                membership.saw("svc", ADDRESSES[*a], 1_800_000_000_000_000);
            }
        }
        let targets = probe_targets(&list, &membership, now);
        prop_assert!(targets.len() <= MAX_PROBES);
        for t in &targets {
            prop_assert!(t.expires_us > now && !t.cluster.is_empty());
            prop_assert!(t.cause != Cause::Announced, "an announced host probed");
            if let (Some(known), "svc") = (&known, t.cluster.as_str()) {
                prop_assert!(known.iter().any(|a| ADDRESSES[*a] == t.address));
            }
        }
        let expected = list
            .live(now)
            .filter(|t| !t.cluster.is_empty() && t.cause != Cause::Announced)
            .filter(|t| t.cluster != "svc" || known.as_ref().is_none_or(|k| k.iter().any(|a| ADDRESSES[*a] == t.address)))
            .count();
        prop_assert_eq!(targets.len(), expected.min(MAX_PROBES));
    }

    // ---- long-polls -----------------------------------------------------------

    #[test]
    fn waiters_answer_each_held_stream_exactly_once(
        ops in prop::collection::vec(
            prop_oneof![
                (0u32..8, 0u64..100).prop_map(|(id, d)| (0u8, id, d)),
                (0u32..8).prop_map(|id| (1u8, id, 0)),
                (any::<bool>(), 0u64..100).prop_map(|(drained, now)| (2u8, u32::from(drained), now)),
            ],
            0..40,
        ),
    ) {
        let mut w: Waiters = Waiters::default();
        let mut model: Vec<(u32, u64)> = Vec::new();
        for (kind, a, b) in ops {
            match kind {
                0 => {
                    w.hold(a, (), b);
                    model.push((a, b));
                }
                1 => {
                    let was = model.iter().any(|&(id, _)| id == a);
                    model.retain(|&(id, _)| id != a);
                    prop_assert_eq!(w.release(a), was);
                }
                _ => {
                    let drained = a == 1;
                    let mut due: Vec<u32> = w.take_due(drained, b).into_iter().map(|(id, ())| id).collect();
                    let mut expected: Vec<u32> = model
                        .iter()
                        .filter(|&&(_, d)| drained || b >= d)
                        .map(|&(id, _)| id)
                        .collect();
                    model.retain(|&(_, d)| !(drained || b >= d));
                    due.sort_unstable();
                    expected.sort_unstable();
                    prop_assert_eq!(due, expected);
                }
            }
            prop_assert_eq!(w.len(), model.len());
        }
    }

    // ---- shared-data helpers ------------------------------------------------

    #[test]
    fn add_bounded_never_passes_the_bound_nor_goes_below_zero(
        max in 0u64..10,
        deltas in prop::collection::vec(-3i64..4, 0..40),
    ) {
        let store = MemStore::new();
        let mut model: u64 = 0;
        for d in deltas {
            let before = store.get("n").unwrap();
            let got = add_bounded(&store, "n", d, max).unwrap();
            let next = model.saturating_add_signed(d);
            if d > 0 && next > max {
                prop_assert_eq!(got, None);
                prop_assert_eq!(store.get("n").unwrap(), before, "a refused add wrote");
            } else {
                prop_assert_eq!(got, Some(next));
                model = next;
            }
            prop_assert!(model <= max);
        }
    }

    #[test]
    fn a_lease_goes_to_one_caller_per_interval(
        calls in prop::collection::vec((0u64..300, 1u64..500), 1..60),
    ) {
        let store = MemStore::new();
        let mut now = 1;
        let mut due = 0;
        for (dt, interval) in calls {
            now += dt;
            let got = take_lease(&store, "lease", now, interval).unwrap();
            prop_assert_eq!(got, now >= due, "at {} (due {})", now, due);
            if got {
                due = now + interval;
            }
        }
    }

    #[test]
    fn garbage_in_any_key_reads_as_default_and_the_next_update_repairs_it(
        garbage in prop::collection::vec(any::<u8>(), 0..64),
        now in 1u64..u64::MAX / 2,
    ) {
        let store = MemStore::new();
        store.set(graceful_core::shared::keys::RECORD.name, &garbage, 0).unwrap();
        let rec = record::read(&store).unwrap();
        prop_assert_eq!(Some(rec), InstanceRecord::decode(&garbage).or(Some(InstanceRecord::default())));
        let (after, _) = record::start_closing(&store, now).unwrap();
        prop_assert_eq!(InstanceRecord::decode(&store.get(graceful_core::shared::keys::RECORD.name).unwrap().unwrap().0), Some(after));
        prop_assert!(after.phase.is_closing());
    }

    #[test]
    fn memstore_checks_cas_only_on_existing_keys(
        writes in prop::collection::vec((0u8..3, any::<bool>(), any::<u32>()), 1..30),
    ) {
        let store = MemStore::new();
        let mut cas_of: [Option<u32>; 3] = [None; 3];
        for (key, fresh, junk_cas) in writes {
            let k = ["a", "b", "c"][usize::from(key)];
            let stored = cas_of[usize::from(key)];
            let cas = if fresh { stored.unwrap_or(junk_cas) } else { junk_cas };
            let got = store.set(k, &[key], cas);
            let should_pass = stored.is_none() || cas == 0 || Some(cas) == stored;
            prop_assert_eq!(got.is_ok(), should_pass);
            if should_pass {
                let (_, new_cas) = store.get(k).unwrap().unwrap();
                prop_assert_ne!(new_cas, 0);
                prop_assert_ne!(Some(new_cas), stored);
                cas_of[usize::from(key)] = Some(new_cas);
            }
        }
        // update() always lands on an uncontended store.
        update(&store, "a", |_| (Some(vec![9]), ())).unwrap();
        prop_assert_eq!(store.get("a").unwrap().unwrap().0, vec![9]);
    }
}
