//! Property tests of the consumer's steering across VM copies: whatever
//! the membership, the closing marks and the order in which the copies
//! see answers, once every member has answered somewhere each copy steers
//! to every acceptable member (the members minus the tombstoned ones), and
//! the panic floor only ever adds members that refused a connection (never
//! one whose last answer said closing), longest confirmed first, up to its
//! size, each first in a list whose other hosts are all acceptable; with no
//! acceptable member, every tombstoned one but those confirmed last. And in
//! a front (admin membership, the front-proxy role): a host that announced
//! it is closing, or that the admin lists `DRAINING`, is never named while
//! an acceptable member is known, whatever the hosts answer.

// Test code: a panic is how a property fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::cell::Cell;
use std::collections::BTreeSet;

use graceful_core::consumer::config::ConsumerConfig;
use graceful_core::consumer::decisions::{Consumer, Effect, Exchange, Part, Response};
use graceful_core::consumer::steering::Membership;
use graceful_core::shared::keys;
use graceful_core::shared::metrics::Metric;
use graceful_core::shared::store::{self, MemStore, SharedStore};
use proptest::prelude::*;

mod common;
use common::config;

const S: u64 = 1_000_000;
const CLUSTER: &str = "svc";

fn address(host: usize) -> String {
    format!("10.0.0.{}:80", host + 1)
}

/// One stream's view: the cluster, the answering host, the clock.
struct View {
    address: String,
    now: u64,
}

impl Exchange for View {
    fn cluster(&mut self) -> String {
        CLUSTER.into()
    }
    fn address(&mut self) -> Option<String> {
        Some(self.address.clone())
    }
    fn response_flags(&mut self) -> Option<u64> {
        Some(0)
    }
    fn now(&mut self) -> u64 {
        self.now
    }
}

/// A process: the shared store, the change signal, the VM copies.
struct Process {
    store: MemStore,
    signal: Cell<u64>,
    copies: Vec<Consumer>,
}

impl Process {
    fn new(json: &str, copies: usize) -> Process {
        let store = MemStore::new();
        store::ensure_all(
            &store,
            &graceful_core::initial::values(keys::Owner::Consumer),
        )
        .unwrap();
        let config = ConsumerConfig::from_json(json.as_bytes()).unwrap();
        Process {
            store,
            signal: Cell::new(0),
            copies: (0..copies)
                .map(|_| Consumer::new(config.clone(), false))
                .collect(),
        }
    }

    fn carry(&self, effects: &[Effect]) {
        for e in effects {
            if let Effect::Add(Metric::ConsumerGeneration, n) = e {
                self.signal.set(self.signal.get() + n);
            }
        }
    }

    /// A request through `copy` and its answer from `host`: steering at
    /// request headers, then the response (closing or not).
    fn exchange(&mut self, copy: usize, host: usize, closing: bool, now: u64) {
        let kind = if closing {
            Kind::Closing
        } else {
            Kind::Answered
        };
        self.attempt(copy, host, kind, now);
    }

    /// A request through `copy` to `host`, which answers, answers closing
    /// or refuses the connection.
    fn attempt(&mut self, copy: usize, host: usize, kind: Kind, now: u64) {
        let mut view = View {
            address: address(host),
            now,
        };
        let signal = Some(self.signal.get());
        let c = &mut self.copies[copy];
        c.steer(&self.store, &mut view, signal);
        if kind == Kind::Refused {
            let effects = c.connect_failed(&self.store, &mut view, &address(host));
            self.carry(&effects);
            return;
        }
        let mut pairs: Vec<(&[u8], &[u8])> =
            vec![(b":status", b"200"), (b"x-graceful-instance", b"one")];
        if kind == Kind::Closing {
            pairs.push((b"x-graceful-closing", b"true"));
        }
        let seen = Response::scan(c.config(), pairs);
        let effects = c.observe_response(&self.store, &mut view, &seen, Part::Headers);
        self.carry(&effects);
    }

    /// The hosts `copy` would name for its next request (empty: it leaves
    /// the choice to the balancer).
    fn steered(&mut self, copy: usize, now: u64) -> BTreeSet<String> {
        self.next_list(copy, now).into_iter().collect()
    }

    /// The override list of `copy`'s next request, in order.
    fn next_list(&mut self, copy: usize, now: u64) -> Vec<String> {
        let mut view = View {
            address: String::new(),
            now,
        };
        let signal = Some(self.signal.get());
        self.copies[copy]
            .steer(&self.store, &mut view, signal)
            .map(|list| list.split(',').map(str::to_string).collect())
            .unwrap_or_default()
    }
}

impl Process {
    /// The admin's membership of the cluster, as the refresh writes it:
    /// `hosts` members, those in `draining` listed `DRAINING`.
    fn admin_lists(&self, hosts: usize, draining: &[usize]) {
        let statuses: Vec<String> = (0..hosts)
            .map(|h| {
                let health = if draining.contains(&h) { "DRAINING" } else { "HEALTHY" };
                format!(
                    r#"{{"address":{{"socket_address":{{"address":"10.0.0.{}","port_value":80}}}},"health_status":{{"eds_health_status":"{health}"}}}}"#,
                    h + 1
                )
            })
            .collect();
        let body = format!(
            r#"{{"cluster_statuses":[{{"name":"{CLUSTER}","host_statuses":[{}]}}]}}"#,
            statuses.join(",")
        );
        let m = Membership::from_admin_json(body.as_bytes(), &[CLUSTER]).unwrap();
        self.store.set(keys::MEMBERS.name, &m.encode(), 0).unwrap();
        store::add_bounded(&self.store, keys::MEMBERS_GEN.name, 1, u64::MAX).unwrap();
        self.carry(&[Effect::Add(Metric::ConsumerGeneration, 1)]);
    }

    /// `host` tells the front through `copy` that it is closing.
    fn announce(&mut self, copy: usize, host: usize, now: u64) {
        let ip = std::net::Ipv4Addr::new(10, 0, 0, host as u8 + 1).to_ipv6_mapped();
        let effects = self.copies[copy]
            .announce_closing(&self.store, ip, now, 120 * S)
            .unwrap();
        self.carry(&effects);
    }
}

/// What a host did with one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Answered,
    Closing,
    Refused,
}

/// (copy, host, closing) answers, then each host's first answer inserted
/// at a position of its own: every member answers at least once, in any
/// order among the rest.
fn script(most: usize) -> impl Strategy<Value = (usize, usize, Vec<(usize, usize, bool)>)> {
    (2usize..=8, 1usize..=3).prop_flat_map(move |(hosts, copies)| {
        let answer = (0..copies, 0..hosts, prop::bool::weighted(0.2));
        (
            Just(hosts),
            Just(copies),
            prop::collection::vec(answer, 0..most),
            prop::collection::vec((0..copies, 0usize..64), hosts),
        )
            .prop_map(|(hosts, copies, mut answers, firsts)| {
                for (host, (copy, at)) in firsts.into_iter().enumerate().rev() {
                    let at = at.min(answers.len());
                    answers.insert(at, (copy, host, false));
                }
                (hosts, copies, answers)
            })
    })
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn every_copy_steers_to_every_member_that_is_not_tombstoned((hosts, copies, answers) in script(48)) {
        let mut p = Process::new(r#"{"panic_threshold":0}"#, copies);
        for (i, &(copy, host, closing)) in answers.iter().enumerate() {
            p.exchange(copy, host, closing, S + i as u64);
        }
        let closed: BTreeSet<usize> = answers.iter().filter(|a| a.2).map(|a| a.1).collect();
        let mut expected: BTreeSet<String> =
            (0..hosts).filter(|h| !closed.contains(h)).map(address).collect();
        if expected.is_empty() {
            // The last resort: every host but the one that said closing
            // last (its first mark; repeats within 1 s are not written).
            let first_mark = |h: usize| answers.iter().position(|a| a.1 == h && a.2);
            let newest = closed.iter().filter_map(|&h| first_mark(h)).max();
            expected = closed
                .iter()
                .copied()
                .filter(|&h| first_mark(h) < newest)
                .map(address)
                .collect();
        }
        let now = S + answers.len() as u64;
        for copy in 0..copies {
            let got = p.steered(copy, now);
            if closed.is_empty() {
                prop_assert!(got.is_empty(), "copy {copy}: no tombstone, yet steered to {got:?}");
            } else {
                prop_assert_eq!(&got, &expected, "copy {}", copy);
            }
        }
    }

    #[test]
    fn the_panic_floor_tries_only_hosts_that_refused_longest_confirmed_first(
        (hosts, copies, answers) in script(24),
        kinds in prop::collection::vec(0u8..3, 24),
        threshold in 0u8..=100,
    ) {
        let json = format!(r#"{{"panic_threshold":{threshold}}}"#);
        let mut p = Process::new(&json, copies);
        // One attempt per 1.2 s: each mark or refusal confirms its
        // tombstone at a time of its own (a repeat within 1 s is not
        // written), and the whole script (at most 32 attempts) stays within
        // the minute an observed member is listed after its last answer.
        let at = |i: usize| S + 1_200_000 * i as u64;
        // Per host, the model of its tombstone: (closing, expires at,
        // confirmed at), as tombstone.rs's transition table has them.
        let mut tomb: Vec<Option<(bool, u64, u64)>> = vec![None; hosts];
        // Per host: answered unmarked at least once (observed membership).
        let mut member = vec![false; hosts];
        for (i, &(copy, host, closing)) in answers.iter().enumerate() {
            // A host's marks come from the script; of its other attempts,
            // `kinds` makes about a third refusals.
            let kind = match (closing, kinds.get(i).copied().unwrap_or(0)) {
                (true, _) => Kind::Closing,
                (false, 2) => Kind::Refused,
                _ => Kind::Answered,
            };
            let now = at(i);
            p.attempt(copy, host, kind, now);
            member[host] |= kind == Kind::Answered;
            let live = tomb[host].filter(|&(_, expires, _)| expires > now);
            // A repeat extends a live tombstone only by a second or more
            // (tombstone.rs: EXTEND_GRANULARITY_US), else it is not written
            // (and confirms nothing).
            let written = |e: u64, ttl: u64| now + ttl > e + S;
            tomb[host] = match (kind, live) {
                // A mark on a refusal's tombstone is written whatever its
                // expiry (the cause changes), and confirms it closing.
                (Kind::Closing, Some((false, e, _))) => Some((true, e.max(now + 30 * S), now)),
                (Kind::Closing, Some((true, e, t))) if !written(e, 30 * S) => Some((true, e, t)),
                (Kind::Closing, _) => Some((true, now + 30 * S, now)),
                (Kind::Refused, Some((c, e, t))) if !written(e, 5 * S) => Some((c, e, t)),
                // A refusal extends; a closing host stays closing, and a
                // refusal confirms only a refusal's tombstone.
                (Kind::Refused, Some((true, _, t))) => Some((true, now + 5 * S, t)),
                (Kind::Refused, _) => Some((false, now + 5 * S, now)),
                // The same instance ("one") answering readmits only a host
                // whose instance was unknown (one that only refused).
                (Kind::Answered, Some((true, e, t))) => Some((true, e, t)),
                (Kind::Answered, _) => None,
            };
        }
        let now = at(answers.len());
        let live = |h: usize| tomb[h].filter(|&(_, e, _)| e > now);
        // The observed membership: the hosts that answered unmarked.
        let members: Vec<usize> = (0..hosts).filter(|&h| member[h]).collect();
        let acceptable: BTreeSet<String> =
            members.iter().copied().filter(|&h| live(h).is_none()).map(address).collect();
        let floor = (members.len() * usize::from(threshold)).div_ceil(100);
        // Refused, never closing since: by the confirmation it stores.
        let mut by_age: Vec<(u64, String)> = members
            .iter()
            .filter_map(|&h| match live(h) {
                Some((false, _, t)) => Some((t, address(h))),
                _ => None,
            })
            .collect();
        by_age.sort();
        let mut trial = BTreeSet::new();
        if !acceptable.is_empty() && acceptable.len() < floor {
            trial.extend(by_age.into_iter().take(floor - acceptable.len()).map(|(_, a)| a));
        }
        // With no acceptable member, the last resort: every tombstoned
        // member but those confirmed last, by the confirmation each stores
        // (a refusal extending a closing host's expiry confirms nothing).
        let confirmed = |h: usize| live(h).map(|(_, _, t)| t);
        let newest = members.iter().filter_map(|&h| confirmed(h)).max().unwrap_or(0);
        let acceptable: BTreeSet<String> = if acceptable.is_empty() {
            members
                .iter()
                .copied()
                .filter(|&h| confirmed(h).is_some_and(|t| t < newest))
                .map(address)
                .collect()
        } else {
            acceptable
        };
        let steered = (0..hosts).any(|h| live(h).is_some()) && !acceptable.is_empty();
        for copy in 0..copies {
            let mut seen = BTreeSet::new();
            for _ in 0..(acceptable.len() + trial.len()).max(1) {
                let list = p.next_list(copy, now);
                if !steered {
                    prop_assert!(list.is_empty(), "copy {}: steered {:?}", copy, list);
                    continue;
                }
                prop_assert!(
                    list.iter().skip(1).all(|h| acceptable.contains(h)),
                    "copy {}: after the first, acceptable hosts only: {:?}", copy, list
                );
                prop_assert!(
                    list.first().is_some_and(|h| acceptable.contains(h) || trial.contains(h)),
                    "copy {}: {:?}", copy, list
                );
                seen.extend(list);
            }
            let expected: BTreeSet<String> = if steered {
                acceptable.union(&trial).cloned().collect()
            } else {
                BTreeSet::new()
            };
            prop_assert_eq!(seen, expected, "copy {}", copy);
        }
    }
    #[test]
    fn an_announced_or_draining_host_is_never_named_while_an_acceptable_one_is_known(
        hosts in 2usize..=6,
        copies in 1usize..=3,
        announced in prop::collection::btree_set(0usize..6, 0..4),
        draining in prop::collection::btree_set(0usize..6, 0..3),
        attempts in prop::collection::vec((0usize..3, 0usize..6, 0u8..6), 0..30),
        threshold in 0u8..=100,
    ) {
        let json = format!(r#"{{"admin_cluster":"admin","panic_threshold":{threshold}}}"#);
        let mut p = Process::new(&json, copies);
        let draining: Vec<usize> = draining.into_iter().filter(|&h| h < hosts).collect();
        let announced: Vec<usize> = announced.into_iter().filter(|&h| h < hosts).collect();
        p.admin_lists(hosts, &draining);
        for &h in &announced {
            p.announce(0, h, S);
        }
        let closing = |h: usize| announced.contains(&h) || draining.contains(&h);
        // Hosts never tombstoned: neither closing nor marked nor refused.
        let mut clean: BTreeSet<usize> = (0..hosts).filter(|&h| !closing(h)).collect();
        // One attempt per 1.2 s: all within the 120 s announced.
        for (i, &(copy, host, kind)) in attempts.iter().enumerate() {
            let (copy, host) = (copy % copies, host % hosts);
            // Mostly answers (an instance id an announced tombstone never
            // saw), a closing mark or a refusal now and then.
            let kind = match kind {
                4 => Kind::Closing,
                5 => Kind::Refused,
                _ => Kind::Answered,
            };
            if kind != Kind::Answered {
                clean.remove(&host);
            }
            let now = 2 * S + 1_200_000 * i as u64;
            p.attempt(copy, host, kind, now);
            for c in 0..copies {
                let list = p.next_list(c, now);
                if clean.is_empty() {
                    continue;
                }
                for h in (0..hosts).filter(|&h| closing(h)) {
                    prop_assert!(!list.contains(&address(h)), "copy {}: {:?} names closing {}", c, list, h);
                }
                if !announced.is_empty() {
                    prop_assert!(!list.is_empty(), "copy {}: announced {:?}, yet not steered", c, announced);
                }
            }
        }
    }
}
