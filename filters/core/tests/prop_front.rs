//! Property tests of the front role's host table (consumer/front, the
//! design's §7) over arbitrary orders of events: a change not written
//! leaves the table as it was; each IP has at most one entry and the table
//! stays within `max_hosts`; a host is acknowledged only by a read of it,
//! while steered, with its guard clear, and either gone from `/clusters`
//! or idle on two reads at least `poll` apart; an acknowledged host's
//! figures never change, and only it counts late attempts.

// Test code: a panic is how a property fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use graceful_core::consumer::front::{
    host_ip, Change, Event, FrontHost, FrontHosts, Health, Limits, State,
};
use proptest::prelude::*;

mod common;
use common::config;

const POLL_US: u64 = 100_000;

fn limits(max_hosts: usize) -> Limits {
    Limits {
        closing_ttl: Duration::from_secs(30),
        poll: Duration::from_micros(POLL_US),
        max_hosts,
    }
}

fn ip(n: u8) -> Ipv6Addr {
    host_ip(IpAddr::V4(Ipv4Addr::new(10, 0, 0, n)))
}

/// An event about one of a few hosts, and the µs since the one before:
/// reads weighted so that acknowledgements happen.
fn event() -> impl Strategy<Value = (u8, Event, u64)> {
    let read = (
        prop::option::of(prop_oneof![4 => Just(0u32), 1 => 1u32..4]),
        prop_oneof![4 => Just(true), 1 => Just(false)],
    )
        .prop_map(|(active, guard_clear)| Event::Read {
            active,
            guard_clear,
        });
    let event = prop_oneof![
        2 => Just(Event::Closing),
        1 => Just(Event::Serving),
        1 => prop::sample::select(vec![Health::Healthy, Health::Draining, Health::Other])
            .prop_map(Event::Listed),
        1 => Just(Event::Left),
        2 => (0u16..4).prop_map(|epoch| Event::Steered { epoch }),
        1 => Just(Event::Unsteerable),
        6 => read,
        1 => Just(Event::Attempt),
    ];
    let step = prop_oneof![3 => 0u64..2 * POLL_US, 1 => 0u64..40_000_000];
    (0u8..5, event, step)
}

/// What an acknowledgement freezes.
fn figures(h: &FrontHost) -> (Option<u32>, Option<u32>, u16, [u64; 4]) {
    (
        h.inflight_at_closing,
        h.inflight_at_steering,
        h.epoch,
        [h.closing_us, h.steered_us, h.last_active_us, h.acked_us],
    )
}

/// Checks one step against the properties.
fn check_step(
    before: &FrontHosts,
    after: &FrontHosts,
    ip: Ipv6Addr,
    event: Event,
    now: u64,
    change: Change,
    max_hosts: usize,
) -> Result<(), TestCaseError> {
    if !change.written() {
        prop_assert_eq!(after, before, "{:?} -> {:?}", event, change);
    }
    prop_assert!(after.hosts().len() <= max_hosts);
    for (i, h) in after.hosts().iter().enumerate() {
        prop_assert!(after.hosts()[..i].iter().all(|o| o.ip != h.ip));
        prop_assert!(h.late == 0 || h.state == State::Acknowledged);
    }
    let was = before.get(ip);
    let is = after.get(ip);
    if change == Change::Acknowledged {
        let was = was.unwrap();
        let Event::Read {
            active,
            guard_clear,
        } = event
        else {
            panic!("acknowledged by {event:?}");
        };
        prop_assert!(guard_clear);
        prop_assert_eq!(was.state, State::Steered);
        if let Some(n) = active {
            prop_assert_eq!(n, 0);
            prop_assert!(was.zero_reads >= 1);
            prop_assert!(now >= was.last_active_us + POLL_US);
        }
    }
    if let (Some(was), Some(is)) = (was, is) {
        if was.state == State::Acknowledged && change != Change::Serving {
            prop_assert_eq!(is.state, State::Acknowledged);
            prop_assert_eq!(figures(is), figures(was));
            prop_assert!(is.late >= was.late);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn the_table_holds_its_properties_over_any_order_of_events(
        list in prop::collection::vec(event(), 0..60),
        max_hosts in 1usize..5,
    ) {
        let mut t = FrontHosts::default();
        let mut now = 1_000_000u64;
        for (n, event, step) in list {
            now += step;
            let before = t.clone();
            let change = t.apply(ip(n), event, now, &limits(max_hosts));
            check_step(&before, &t, ip(n), event, now, change, max_hosts)?;
        }
        prop_assert_eq!(FrontHosts::decode(&t.encode()), Some(t));
    }

    #[test]
    fn a_steered_host_idle_on_two_reads_a_poll_apart_is_acknowledged(
        gap in POLL_US..10 * POLL_US,
        busy in prop::collection::vec(1u32..5, 0..5),
    ) {
        let mut t = FrontHosts::default();
        let l = limits(4);
        let mut now = 1_000_000u64;
        prop_assert_eq!(t.apply(ip(1), Event::Closing, now, &l), Change::Closing);
        prop_assert_eq!(t.apply(ip(1), Event::Steered { epoch: 1 }, now, &l), Change::Updated);
        for n in &busy {
            now += POLL_US;
            t.apply(ip(1), Event::Read { active: Some(*n), guard_clear: true }, now, &l);
            prop_assert_eq!(t.get(ip(1)).unwrap().state, State::Steered);
        }
        now += POLL_US;
        let idle = Event::Read { active: Some(0), guard_clear: true };
        prop_assert_eq!(t.apply(ip(1), idle, now, &l), Change::Updated);
        prop_assert_eq!(t.apply(ip(1), idle, now + gap, &l), Change::Acknowledged);
        let status = t.status(ip(1));
        prop_assert_eq!(status.inflight_at_closing, Some(busy.first().copied().unwrap_or(0)));
        prop_assert_eq!(status.late, 0);
    }
}
