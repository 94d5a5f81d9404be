//! The grace count (docs/design/front-proxy-drain.md §3): the guard of
//! every acknowledgement (the design's fence cannot hold an attempt: an
//! upstream filter's local reply is not retried, `serve.rs`). Envoy stats
//! only, process-wide atomics: requests write no shared data.
//!
//! | who | when | does |
//! |---|---|---|
//! | a request of the listener instance (`front`) | request headers, before the generation read that steers it | [`enter`]: reads `graceful_front_epoch`, adds itself to the slot of its parity (`graceful_front_awaiting_{0,1}`) |
//! | the same request | response headers, or its end without them (once) | [`leave`]: out of its slot (after its response headers Envoy retries nothing) |
//! | the poll's lease holder | a host steered (or still waiting for its advance) | [`advance`]: the epoch + 1 once the older slot reads 0 (two-slot RCU) |
//! | the poll's lease holder | a `/clusters` answer | [`clear`]: the requests that started before a steering that advanced to `E` are over: the epoch passed `E`, or it is `E` and slot `E - 1` reads 0 |
//!
//! Why it holds: a request that is not steered read the generation before
//! the bump, so it was counted (it counts itself first) before the advance
//! that follows the bump, in one of the two slots. The advance to `E`
//! waits for slot `E - 2` (the parity of `E`) to read 0, so it is in slot
//! `E - 1` until it is answered, and the acknowledgement waits for that
//! slot (the advance past `E` waits for it too). A request that read the
//! epoch long before its add is still in one of the two slots: no re-read
//! needed. `filters/core/tests/grace_model.rs` checks
//! every interleaving of small worlds.

use crate::shared::metrics::{Metric, Metrics};

/// The gauge of the slot of `epoch`'s parity.
pub fn slot(epoch: u64) -> Metric {
    if epoch & 1 == 0 {
        Metric::FrontAwaiting0
    } else {
        Metric::FrontAwaiting1
    }
}

/// A request starts: counted in the slot of the epoch's parity, returned
/// for [`leave`]. None: the epoch cannot be read (the count is off; the
/// acknowledgement then rests on `rq_active`).
pub fn enter(m: &impl Metrics) -> Option<Metric> {
    let gauge = slot(m.get(Metric::FrontEpoch)?);
    m.add(gauge, 1);
    Some(gauge)
}

/// The request is answered (or over): out of its slot.
pub fn leave(m: &impl Metrics, gauge: Metric) {
    m.add(gauge, -1);
}

/// The steerer: the epoch advanced by one once the older slot reads 0;
/// None while it does not (or the epoch cannot be read).
pub fn advance(m: &impl Metrics) -> Option<u64> {
    let epoch = m.get(Metric::FrontEpoch)?;
    if m.get(slot(epoch.wrapping_add(1)))? != 0 {
        return None;
    }
    m.add(Metric::FrontEpoch, 1);
    Some(epoch.wrapping_add(1))
}

/// The epoch as a host entry stores it.
pub fn stored(epoch: u64) -> u16 {
    (epoch & u64::from(u16::MAX)) as u16
}

/// Whether `target` (a stored epoch) is still ahead of `epoch`: its
/// advance has not happened yet.
pub fn ahead(target: u16, epoch: u64) -> bool {
    let d = stored(epoch).wrapping_sub(target);
    d >= 0x8000
}

/// Whether the requests that started before a steering that advanced the
/// epoch to `target` are all answered, from the epoch and the slots as
/// read now. Unreadable: clear (the count is off, as in [`enter`]).
pub fn clear(m: &impl Metrics, target: u16) -> bool {
    let Some(epoch) = m.get(Metric::FrontEpoch) else {
        return true;
    };
    if ahead(target, epoch) {
        return false;
    }
    if stored(epoch) != target {
        // Advanced past it: that advance waited for slot `target - 1`.
        return true;
    }
    m.get(slot(u64::from(target).wrapping_sub(1)))
        .is_none_or(|n| n == 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[derive(Default)]
    struct M(RefCell<[i64; Metric::ALL.len()]>);
    impl Metrics for M {
        fn add(&self, metric: Metric, delta: i64) {
            self.0.borrow_mut()[metric.index()] += delta;
        }
        fn get(&self, metric: Metric) -> Option<u64> {
            u64::try_from(self.0.borrow()[metric.index()]).ok()
        }
    }

    #[test]
    fn a_steering_waits_for_the_requests_before_it_only() {
        let m = M::default();
        let before = enter(&m).unwrap();
        assert_eq!(before, Metric::FrontAwaiting0);
        let e = advance(&m).unwrap();
        assert_eq!(e, 1);
        let target = stored(e);
        let after = enter(&m).unwrap();
        assert_eq!(after, Metric::FrontAwaiting1);
        assert!(!clear(&m, target), "the request before it is in flight");
        leave(&m, before);
        assert!(clear(&m, target), "the one after it is not waited for");
        // A second steering: the older slot (0) is empty, so it advances;
        // the request after the first is before this one.
        assert!(!clear(&m, stored(2)), "target 2 not reached yet");
        assert_eq!(advance(&m), Some(2));
        assert!(
            !clear(&m, stored(2)),
            "the request after the first is in slot 1"
        );
        // A third waits for slot 1.
        assert_eq!(advance(&m), None);
        leave(&m, after);
        assert!(clear(&m, stored(2)));
        assert_eq!(advance(&m), Some(3));
        assert!(clear(&m, target), "passed: clear for good");
    }

    #[test]
    fn ahead_compares_across_the_wrap() {
        assert!(ahead(1, 0));
        assert!(!ahead(0, 0));
        assert!(!ahead(0, 1));
        assert!(ahead(0, 0xFFFF));
        assert!(!ahead(0xFFFF, 0x1_0000));
    }
}
