//! One test per row of the module's transition table, written from the
//! table (the expected entries are spelled out, not recomputed), then the
//! encoding and the status JSON.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use super::*;

const S: u64 = 1_000_000;
const MS: u64 = 1_000;
/// Where each test's host starts closing (µs).
const T0: u64 = 50 * S;
const LIMITS: Limits = Limits {
    closing_ttl: Duration::from_secs(120),
    poll: Duration::from_millis(100),
    max_hosts: 3,
};
const HOST: u8 = source::HOST;
const DRAINING: u8 = source::DRAINING;
const REMOVED: u8 = source::REMOVED;

fn ip(n: u8) -> Ipv6Addr {
    host_ip(IpAddr::V4(Ipv4Addr::new(10, 0, 0, n)))
}

fn read(active: u32) -> Event {
    Event::Read {
        active: Some(active),
        guard_clear: true,
    }
}

const GONE: Event = Event::Read {
    active: None,
    guard_clear: true,
};

/// The entry a new closing from `sources` at T0 makes, as the table's
/// first three rows spell it.
fn fresh(sources: u8) -> FrontHost {
    FrontHost {
        ip: ip(1),
        state: State::Closing,
        sources,
        epoch: 0,
        inflight_at_closing: None,
        inflight_at_steering: None,
        late: 0,
        zero_reads: 0,
        closing_us: T0,
        steered_us: 0,
        last_active_us: T0,
        acked_us: 0,
        expires_us: T0 + 120 * S,
    }
}

fn table(h: FrontHost) -> FrontHosts {
    FrontHosts { hosts: vec![h] }
}

/// Host 1 steered at T0 + 2 ms (epoch 1), nothing read yet.
fn steered() -> FrontHost {
    FrontHost {
        state: State::Steered,
        epoch: 1,
        steered_us: T0 + 2 * MS,
        ..fresh(HOST)
    }
}

/// Host 1 acknowledged at T0 + 5.1 s: 3 in flight at closing and at the
/// steering, its first zero read at T0 + 5 s.
fn acknowledged() -> FrontHost {
    FrontHost {
        state: State::Acknowledged,
        inflight_at_closing: Some(3),
        inflight_at_steering: Some(3),
        zero_reads: 2,
        last_active_us: T0 + 5 * S,
        acked_us: T0 + 5_100 * MS,
        ..steered()
    }
}

/// Applies `event` to host 1 of `t` at `now`, checking that a change that
/// is not written leaves the table as it was.
fn apply(t: &mut FrontHosts, event: Event, now: u64) -> Change {
    let before = t.clone();
    let change = t.apply(ip(1), event, now, &LIMITS);
    if !change.written() {
        assert_eq!(*t, before, "{event:?} changed an unwritten table");
    }
    change
}

fn only(t: &FrontHosts) -> &FrontHost {
    assert_eq!(t.hosts().len(), 1, "{t:?}");
    &t.hosts()[0]
}

#[test]
fn serving_closing_from_the_host_makes_closing_host() {
    let mut t = FrontHosts::default();
    assert_eq!(apply(&mut t, Event::Closing, T0), Change::Closing);
    assert_eq!(*only(&t), fresh(HOST));
}

#[test]
fn serving_listed_draining_makes_closing_draining() {
    let mut t = FrontHosts::default();
    assert_eq!(
        apply(&mut t, Event::Listed(Health::Draining), T0),
        Change::Closing
    );
    assert_eq!(*only(&t), fresh(DRAINING));
}

#[test]
fn serving_left_membership_makes_closing_removed() {
    let mut t = FrontHosts::default();
    assert_eq!(apply(&mut t, Event::Left, T0), Change::Closing);
    assert_eq!(*only(&t), fresh(REMOVED));
}

#[test]
fn serving_any_other_event_stays_serving() {
    for event in [
        Event::Serving,
        Event::Listed(Health::Healthy),
        Event::Listed(Health::Other),
        Event::Steered { epoch: 1 },
        Event::Unsteerable,
        read(3),
        read(0),
        GONE,
        Event::Attempt,
    ] {
        let mut t = FrontHosts::default();
        assert_eq!(apply(&mut t, event, T0), Change::Unchanged, "{event:?}");
        assert_eq!(t.hosts().len(), 0);
    }
}

#[test]
fn closing_from_the_host_the_first_time_adds_its_source_and_life() {
    let mut t = table(fresh(DRAINING));
    assert_eq!(apply(&mut t, Event::Closing, T0 + 10 * S), Change::Closing);
    assert_eq!(
        *only(&t),
        FrontHost {
            sources: DRAINING | HOST,
            expires_us: T0 + 130 * S,
            ..fresh(DRAINING)
        }
    );
    // In every state; an acknowledged host stays acknowledged.
    let mut t = table(FrontHost {
        sources: REMOVED,
        ..acknowledged()
    });
    assert_eq!(apply(&mut t, Event::Closing, T0 + 10 * S), Change::Closing);
    assert_eq!(
        *only(&t),
        FrontHost {
            sources: REMOVED | HOST,
            expires_us: T0 + 130 * S,
            ..acknowledged()
        }
    );
}

#[test]
fn closing_from_the_host_again_is_written_only_a_second_later() {
    let mut t = table(steered());
    assert_eq!(
        apply(&mut t, Event::Closing, T0 + 999 * MS),
        Change::Unchanged
    );
    assert_eq!(apply(&mut t, Event::Closing, T0 + S), Change::Updated);
    assert_eq!(
        *only(&t),
        FrontHost {
            expires_us: T0 + 121 * S,
            ..steered()
        }
    );
}

#[test]
fn draining_or_left_adds_its_source_once() {
    let mut t = table(steered());
    assert_eq!(
        apply(&mut t, Event::Listed(Health::Draining), T0 + S),
        Change::Updated
    );
    assert_eq!(apply(&mut t, Event::Left, T0 + 2 * S), Change::Updated);
    assert_eq!(
        *only(&t),
        FrontHost {
            sources: HOST | DRAINING | REMOVED,
            ..steered()
        }
    );
    let mut t = table(fresh(HOST | DRAINING));
    assert_eq!(
        apply(&mut t, Event::Listed(Health::Draining), T0 + S),
        Change::Unchanged
    );
    let mut t = table(fresh(REMOVED));
    assert_eq!(apply(&mut t, Event::Left, T0 + S), Change::Unchanged);
}

#[test]
fn closing_steered_records_the_bump_and_the_epoch() {
    let mut t = table(fresh(HOST));
    assert_eq!(
        apply(&mut t, Event::Steered { epoch: 1 }, T0 + 2 * MS),
        Change::Updated
    );
    assert_eq!(*only(&t), steered());
}

#[test]
fn closing_with_no_acceptable_host_stays_closing_unwritten() {
    let mut t = table(fresh(HOST));
    assert_eq!(apply(&mut t, Event::Unsteerable, T0 + S), Change::Unchanged);
}

#[test]
fn steered_with_no_acceptable_host_goes_back_to_closing() {
    let mut t = table(FrontHost {
        inflight_at_closing: Some(3),
        inflight_at_steering: Some(2),
        zero_reads: 1,
        ..steered()
    });
    assert_eq!(apply(&mut t, Event::Unsteerable, T0 + S), Change::Updated);
    assert_eq!(
        *only(&t),
        FrontHost {
            epoch: 1,
            inflight_at_closing: Some(3),
            ..fresh(HOST)
        }
    );
}

#[test]
fn steered_or_acknowledged_steered_again_is_unchanged() {
    let mut t = table(steered());
    assert_eq!(
        apply(&mut t, Event::Steered { epoch: 2 }, T0 + S),
        Change::Unchanged
    );
    let mut t = table(acknowledged());
    assert_eq!(
        apply(&mut t, Event::Steered { epoch: 2 }, T0 + 9 * S),
        Change::Unchanged
    );
}

#[test]
fn acknowledged_with_no_acceptable_host_is_unchanged() {
    let mut t = table(acknowledged());
    assert_eq!(
        apply(&mut t, Event::Unsteerable, T0 + 9 * S),
        Change::Unchanged
    );
}

#[test]
fn closing_first_read_is_inflight_at_closing() {
    let mut t = table(fresh(HOST));
    assert_eq!(apply(&mut t, read(3), T0 + 100 * MS), Change::Updated);
    assert_eq!(
        *only(&t),
        FrontHost {
            inflight_at_closing: Some(3),
            last_active_us: T0 + 100 * MS,
            ..fresh(HOST)
        }
    );
    let mut t = table(fresh(HOST));
    assert_eq!(apply(&mut t, read(0), T0 + 100 * MS), Change::Updated);
    assert_eq!(
        *only(&t),
        FrontHost {
            inflight_at_closing: Some(0),
            ..fresh(HOST)
        }
    );
}

#[test]
fn closing_later_reads_above_zero_refresh_last_active_once_a_second() {
    let first_read = FrontHost {
        inflight_at_closing: Some(3),
        last_active_us: T0 + 100 * MS,
        ..fresh(HOST)
    };
    let mut t = table(first_read.clone());
    assert_eq!(apply(&mut t, read(2), T0 + 1_099 * MS), Change::Unchanged);
    assert_eq!(apply(&mut t, read(2), T0 + 1_100 * MS), Change::Updated);
    assert_eq!(
        *only(&t),
        FrontHost {
            last_active_us: T0 + 1_100 * MS,
            ..first_read
        }
    );
}

#[test]
fn closing_zero_reads_and_absence_do_not_count_before_the_bump() {
    let mut t = table(FrontHost {
        inflight_at_closing: Some(3),
        ..fresh(HOST)
    });
    assert_eq!(apply(&mut t, read(0), T0 + 5 * S), Change::Unchanged);
    assert_eq!(apply(&mut t, GONE, T0 + 5 * S), Change::Unchanged);
    let mut t = table(fresh(REMOVED));
    assert_eq!(apply(&mut t, GONE, T0 + 5 * S), Change::Unchanged);
}

#[test]
fn steered_read_above_zero_sets_unread_figures_and_last_active() {
    let mut t = table(steered());
    assert_eq!(apply(&mut t, read(3), T0 + 100 * MS), Change::Updated);
    let after = FrontHost {
        inflight_at_closing: Some(3),
        inflight_at_steering: Some(3),
        last_active_us: T0 + 100 * MS,
        ..steered()
    };
    assert_eq!(*only(&t), after);
    // Figures read, zero_reads 0: once per second.
    assert_eq!(apply(&mut t, read(1), T0 + 1_099 * MS), Change::Unchanged);
    assert_eq!(apply(&mut t, read(1), T0 + 1_100 * MS), Change::Updated);
    assert_eq!(
        *only(&t),
        FrontHost {
            last_active_us: T0 + 1_100 * MS,
            ..after.clone()
        }
    );
    // After a zero read: written at once, zero_reads back to 0.
    let mut t = table(FrontHost {
        zero_reads: 1,
        last_active_us: T0 + 1_200 * MS,
        ..after.clone()
    });
    assert_eq!(apply(&mut t, read(1), T0 + 1_300 * MS), Change::Updated);
    assert_eq!(
        *only(&t),
        FrontHost {
            last_active_us: T0 + 1_300 * MS,
            ..after
        }
    );
}

#[test]
fn steered_first_zero_read_is_counted_and_timed() {
    let mut t = table(steered());
    assert_eq!(apply(&mut t, read(0), T0 + 100 * MS), Change::Updated);
    assert_eq!(
        *only(&t),
        FrontHost {
            inflight_at_closing: Some(0),
            inflight_at_steering: Some(0),
            zero_reads: 1,
            last_active_us: T0 + 100 * MS,
            ..steered()
        }
    );
}

/// Steered, 3 in flight at each read until the first zero read at T0 + 5 s.
fn one_zero_read() -> FrontHost {
    FrontHost {
        inflight_at_closing: Some(3),
        inflight_at_steering: Some(3),
        zero_reads: 1,
        last_active_us: T0 + 5 * S,
        ..steered()
    }
}

#[test]
fn steered_second_zero_read_a_poll_later_with_the_guard_clear_acknowledges() {
    let mut t = table(one_zero_read());
    assert_eq!(
        apply(&mut t, read(0), T0 + 5_100 * MS),
        Change::Acknowledged
    );
    assert_eq!(*only(&t), acknowledged());
}

#[test]
fn steered_second_zero_read_too_soon_or_guarded_is_unchanged() {
    let mut t = table(one_zero_read());
    assert_eq!(apply(&mut t, read(0), T0 + 5_099 * MS), Change::Unchanged);
    let guarded = Event::Read {
        active: Some(0),
        guard_clear: false,
    };
    assert_eq!(apply(&mut t, guarded, T0 + 6 * S), Change::Unchanged);
}

#[test]
fn steered_host_gone_from_clusters_is_acknowledged_once_its_guard_is_clear() {
    let mut t = table(steered());
    let guarded = Event::Read {
        active: None,
        guard_clear: false,
    };
    assert_eq!(apply(&mut t, guarded, T0 + S), Change::Unchanged);
    assert_eq!(apply(&mut t, GONE, T0 + 2 * S), Change::Acknowledged);
    assert_eq!(
        *only(&t),
        FrontHost {
            state: State::Acknowledged,
            acked_us: T0 + 2 * S,
            ..steered()
        }
    );
}

#[test]
fn acknowledged_attempts_and_reads_above_zero_are_late() {
    let mut t = table(acknowledged());
    assert_eq!(apply(&mut t, Event::Attempt, T0 + 6 * S), Change::Late);
    assert_eq!(apply(&mut t, read(1), T0 + 7 * S), Change::Late);
    assert_eq!(
        *only(&t),
        FrontHost {
            late: 2,
            ..acknowledged()
        }
    );
}

#[test]
fn acknowledged_zero_reads_and_absence_are_unchanged() {
    let mut t = table(acknowledged());
    assert_eq!(apply(&mut t, read(0), T0 + 6 * S), Change::Unchanged);
    assert_eq!(apply(&mut t, GONE, T0 + 6 * S), Change::Unchanged);
}

#[test]
fn closing_or_steered_attempts_are_unchanged() {
    for h in [fresh(HOST), steered()] {
        let mut t = table(h);
        assert_eq!(apply(&mut t, Event::Attempt, T0 + S), Change::Unchanged);
    }
}

#[test]
fn serving_from_the_host_ends_every_state() {
    for h in [fresh(DRAINING), steered(), acknowledged()] {
        let mut t = table(h);
        assert_eq!(apply(&mut t, Event::Serving, T0 + 9 * S), Change::Serving);
        assert_eq!(t.hosts().len(), 0);
    }
}

#[test]
fn a_removed_host_listed_again_is_serving() {
    for health in [Health::Healthy, Health::Other] {
        for h in [
            fresh(REMOVED),
            FrontHost {
                sources: HOST | REMOVED,
                ..acknowledged()
            },
        ] {
            let mut t = table(h);
            assert_eq!(
                apply(&mut t, Event::Listed(health), T0 + S),
                Change::Serving
            );
            assert_eq!(t.hosts().len(), 0);
        }
    }
    // Listed DRAINING: serving, then closing(draining) afresh.
    let mut t = table(FrontHost {
        sources: HOST | REMOVED,
        ..acknowledged()
    });
    assert_eq!(
        apply(&mut t, Event::Listed(Health::Draining), T0 + 20 * S),
        Change::Serving
    );
    assert_eq!(
        *only(&t),
        FrontHost {
            closing_us: T0 + 20 * S,
            last_active_us: T0 + 20 * S,
            expires_us: T0 + 140 * S,
            ..fresh(DRAINING)
        }
    );
}

#[test]
fn listed_healthy_past_the_closing_ttl_is_serving() {
    for h in [fresh(HOST), steered(), acknowledged()] {
        let mut t = table(h);
        assert_eq!(
            apply(&mut t, Event::Listed(Health::Healthy), T0 + 120 * S),
            Change::Serving
        );
        assert_eq!(t.hosts().len(), 0);
    }
}

#[test]
fn draining_only_listed_healthy_again_is_serving() {
    let mut t = table(fresh(DRAINING));
    assert_eq!(
        apply(&mut t, Event::Listed(Health::Healthy), T0 + S),
        Change::Serving
    );
    assert_eq!(t.hosts().len(), 0);
}

#[test]
fn listed_healthy_otherwise_or_listed_other_is_unchanged() {
    for h in [fresh(HOST), fresh(HOST | DRAINING), acknowledged()] {
        let mut t = table(h);
        assert_eq!(
            apply(&mut t, Event::Listed(Health::Healthy), T0 + 120 * S - 1),
            Change::Unchanged
        );
        assert_eq!(
            apply(&mut t, Event::Listed(Health::Other), T0 + 200 * S),
            Change::Unchanged
        );
    }
}

#[test]
fn a_full_table_drops_the_entry_acknowledged_first() {
    let at = |n: u8, acked_us: u64| FrontHost {
        ip: ip(n),
        acked_us,
        ..acknowledged()
    };
    let mut t = FrontHosts {
        hosts: vec![at(2, T0 + 7 * S), at(3, T0 + 6 * S), at(4, T0 + 8 * S)],
    };
    assert_eq!(t.apply(ip(1), Event::Closing, T0, &LIMITS), Change::Closing);
    assert_eq!(
        t.hosts().to_vec(),
        [at(2, T0 + 7 * S), at(4, T0 + 8 * S), fresh(HOST)]
    );
}

#[test]
fn a_full_table_of_hosts_not_acknowledged_refuses_and_writes_nothing() {
    let at = |n: u8| FrontHost {
        ip: ip(n),
        ..steered()
    };
    let mut t = FrontHosts {
        hosts: vec![at(2), at(3), at(4)],
    };
    for event in [Event::Closing, Event::Listed(Health::Draining), Event::Left] {
        assert_eq!(apply(&mut t, event, T0), Change::Full, "{event:?}");
    }
    // The ceiling holds whatever max_hosts says.
    let huge = Limits {
        max_hosts: usize::MAX,
        ..LIMITS
    };
    let mut t = FrontHosts::default();
    for n in 0..MAX_HOSTS_CEILING as u32 {
        let ip = host_ip(IpAddr::V4(Ipv4Addr::from(n)));
        assert_eq!(t.apply(ip, Event::Closing, T0, &huge), Change::Closing);
    }
    assert_eq!(t.apply(ip(1), Event::Closing, T0, &huge), Change::Full);
    assert_eq!(FrontHosts::decode(&t.encode()), Some(t));
}

// ---- a whole drain, as the design's §3 tells it ------------------------------

#[test]
fn a_drain_from_closing_to_the_acknowledgement() {
    let mut t = FrontHosts::default();
    let steps = [
        (Event::Closing, T0, Change::Closing),
        (Event::Steered { epoch: 1 }, T0 + 2 * MS, Change::Updated),
        (read(3), T0 + 100 * MS, Change::Updated),
        (read(3), T0 + 200 * MS, Change::Unchanged),
        (read(1), T0 + 4_900 * MS, Change::Updated),
        (read(0), T0 + 5 * S, Change::Updated),
        (read(0), T0 + 5_100 * MS, Change::Acknowledged),
        (read(0), T0 + 5_200 * MS, Change::Unchanged),
    ];
    for (event, now, change) in steps {
        assert_eq!(apply(&mut t, event, now), change, "{event:?} at {now}");
    }
    assert_eq!(*only(&t), acknowledged());
    let json = serde_json::to_value(t.status(ip(1))).unwrap_or_default();
    assert_eq!(
        json,
        serde_json::json!({
            "state": "acknowledged",
            "source": ["host"],
            "inflight_at_closing": 3,
            "steered_after_ms": 2,
            "inflight_at_steering": 3,
            "last_active_ms": 5000,
            "acknowledged_after_ms": 5100,
            "late": 0,
        })
    );
}

#[test]
fn an_unknown_host_reads_as_serving_with_no_figures() {
    let json = serde_json::to_value(FrontHosts::default().status(ip(9))).unwrap_or_default();
    assert_eq!(
        json,
        serde_json::json!({
            "state": "serving",
            "source": [],
            "inflight_at_closing": null,
            "steered_after_ms": null,
            "inflight_at_steering": null,
            "last_active_ms": null,
            "acknowledged_after_ms": null,
            "late": 0,
        })
    );
    let status = table(fresh(DRAINING | REMOVED)).status(ip(1));
    assert_eq!(
        (status.state, status.source, status.steered_after_ms),
        ("closing", vec!["draining", "removed"], None)
    );
}

#[test]
fn ipv4_hosts_are_kept_mapped_and_ipv6_as_they_are() {
    let v4 = host_ip(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)));
    assert_eq!(
        v4.octets(),
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1]
    );
    let v6 = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1);
    assert_eq!(host_ip(IpAddr::V6(v6)), v6);
}

// ---- the encoding --------------------------------------------------------------

#[test]
fn the_empty_table_is_three_bytes() {
    assert_eq!(FrontHosts::default().encode(), [1, 0, 0]);
    assert_eq!(FrontHosts::decode(&[1, 0, 0]), Some(FrontHosts::default()));
}

#[test]
fn an_entry_is_76_bytes_in_the_documented_order() {
    let h = FrontHost {
        sources: HOST | REMOVED,
        epoch: 0x0102,
        inflight_at_closing: Some(7),
        inflight_at_steering: None,
        late: 9,
        zero_reads: 2,
        steered_us: 0x1112_1314_1516_1718,
        ..acknowledged()
    };
    let bytes = table(h.clone()).encode();
    assert_eq!(bytes.len(), 3 + 76);
    assert_eq!(bytes[..3], [1, 1, 0]);
    let e = &bytes[3..];
    assert_eq!(e[..16], ip(1).octets());
    assert_eq!(e[16..20], [3, 5, 0x02, 0x01]);
    assert_eq!(e[20..24], 7u32.to_le_bytes());
    assert_eq!(e[24..28], [0xff; 4], "unread");
    assert_eq!(e[28..32], 9u32.to_le_bytes());
    assert_eq!(e[32..36], 2u32.to_le_bytes());
    let times = [
        T0,
        0x1112_1314_1516_1718,
        T0 + 5 * S,
        T0 + 5_100 * MS,
        T0 + 120 * S,
    ];
    for (i, t) in times.into_iter().enumerate() {
        assert_eq!(e[36 + 8 * i..44 + 8 * i], t.to_le_bytes(), "time {i}");
    }
    assert_eq!(FrontHosts::decode(&bytes), Some(table(h)));
}

#[test]
fn the_encoding_round_trips() {
    let t = FrontHosts {
        hosts: vec![
            fresh(DRAINING),
            FrontHost {
                ip: ip(2),
                ..one_zero_read()
            },
            FrontHost {
                ip: "fd00::2".parse().unwrap_or(Ipv6Addr::LOCALHOST),
                late: 4,
                ..acknowledged()
            },
        ],
    };
    assert_eq!(FrontHosts::decode(&t.encode()), Some(t));
}

#[test]
fn decode_refuses_what_this_version_did_not_write() {
    let good = FrontHosts {
        hosts: vec![
            fresh(HOST),
            FrontHost {
                ip: ip(2),
                ..acknowledged()
            },
        ],
    }
    .encode();
    for cut in 0..good.len() {
        assert_eq!(FrontHosts::decode(&good[..cut]), None, "cut at {cut}");
    }
    let with = |at: usize, v: u8| {
        let mut b = good.clone();
        b[at] = v;
        b
    };
    let mut extra = good.clone();
    extra.push(0);
    let entry = |i: usize| 3 + 76 * i;
    let refused = [
        ("trailing byte", extra),
        ("version 0", with(0, 0)),
        ("version 2", with(0, 2)),
        ("count 3", with(1, 3)),
        ("state 0 (serving is no entry)", with(entry(0) + 16, 0)),
        ("state 4", with(entry(0) + 16, 4)),
        ("no source", with(entry(1) + 17, 0)),
        ("unknown source bit", with(entry(1) + 17, 8 | 1)),
        ("an IP twice", with(entry(1) + 15, 1)),
    ];
    for (what, bytes) in refused {
        assert_eq!(FrontHosts::decode(&bytes), None, "{what}");
    }
    // Beyond the ceiling, whatever follows.
    let count = (MAX_HOSTS_CEILING as u16 + 1).to_le_bytes();
    let mut over = vec![1, count[0], count[1]];
    over.resize(3 + 76 * (MAX_HOSTS_CEILING + 1), 0);
    assert_eq!(FrontHosts::decode(&over), None);
    assert_eq!(FrontHosts::decode(&[1, 0xff, 0xff]), None, "no allocation");
}

#[test]
fn a_read_never_stores_as_unread() {
    let mut t = table(fresh(HOST));
    t.apply(ip(1), read(u32::MAX), T0 + S, &LIMITS);
    assert_eq!(only(&t).inflight_at_closing, Some(u32::MAX - 1));
    assert_eq!(FrontHosts::decode(&t.encode()), Some(t));
}
