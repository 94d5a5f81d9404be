//! The tombstone list under arbitrary observations with arbitrary strings
//! and TTLs: never a panic, never more than `max` entries after a change,
//! one entry per address, "unchanged" means unchanged, never a host both
//! tombstoned and warming, and the list always round-trips through its
//! encoding.
#![no_main]

use std::time::Duration;

use graceful_core::consumer::tombstone::{Change, Observation, Tombstones, Ttls};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Obs {
    Closing {
        cluster: String,
        address: String,
        instance: Option<String>,
    },
    Failure {
        cluster: String,
        address: String,
    },
    Answered {
        address: String,
        instance: Option<String>,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    closing_ttl_ms: u32,
    failure_ttl_ms: u32,
    /// `readmit_slow_start`'s window, when set.
    warming_ms: Option<u32>,
    max: u8,
    steps: Vec<(u32, Obs)>,
}

fuzz_target!(|input: Input| {
    let ttls = Ttls {
        closing: Duration::from_millis(u64::from(input.closing_ttl_ms)),
        failure: Duration::from_millis(u64::from(input.failure_ttl_ms)),
        warming: input
            .warming_ms
            .map(|ms| Duration::from_millis(u64::from(ms))),
    };
    let max = usize::from(input.max).max(1);
    let mut list = Tombstones::default();
    let mut now: u64 = 0;
    for (dt, obs) in &input.steps {
        now = now.saturating_add(u64::from(*dt));
        let o = match obs {
            Obs::Closing {
                cluster,
                address,
                instance,
            } => Observation::Closing {
                cluster,
                address,
                instance: instance.as_deref(),
            },
            Obs::Failure { cluster, address } => Observation::ConnectFailure { cluster, address },
            Obs::Answered { address, instance } => Observation::Answered {
                address,
                instance: instance.as_deref(),
            },
        };
        let before = list.clone();
        let change = list.observe(&o, &ttls, now, max);
        if change == Change::Unchanged {
            assert_eq!(list, before, "{o:?} said unchanged");
        } else {
            assert!(list.entries().len() <= max);
        }
        for (i, t) in list.entries().iter().enumerate() {
            assert!(t.address.len() <= 64 && t.instance.len() <= 128 && t.cluster.len() <= 255);
            assert!(!list.entries()[..i].iter().any(|u| u.address == t.address));
        }
        for w in list.warming(now) {
            assert!(
                list.get_live(&w.address, now).is_none(),
                "{} both tombstoned and warming",
                w.address
            );
        }
        assert!(list.warming(0).count() <= max || change == Change::Unchanged);
        assert_eq!(Tombstones::decode(&list.encode()), Some(list.clone()));
    }
});
