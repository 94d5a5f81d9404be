//! How long requests take, for the report's `request_ms` and its
//! recommended budgets.
//!
//! - `max` is exact over the life of the provider (every request that
//!   ended since this Envoy started, those in flight at closing included;
//!   long-lived streams, which the gate does not wait for, and local
//!   replies are not requests here). A long request is rare by nature: a
//!   shorter window would forget a nightly export between two shutdowns,
//!   and the recommended `timeout` would cut it.
//! - `p50` and `p99` come from the latest [`RING`] samples: while serving,
//!   each copy samples one request in [`SAMPLE_EVERY`]; from closing on,
//!   every request.
//!
//! What it costs a request is in [`crate::provider::filter`] (a clock read
//! at its start; one at its end only when it could be the longest). A
//! copy's tick merges what it gathered into the shared [`DurationRing`]
//! ([`crate::shared::keys::REPORT_DURATIONS`]).

use std::collections::VecDeque;

use super::peers::Reader;

/// Durations the shared ring keeps.
pub const RING: usize = 256;
/// While serving, one request in this many is timed (per copy).
pub const SAMPLE_EVERY: u32 = 32;
/// Most samples one copy gathers between two merges (the latest win).
pub const PENDING_MAX: usize = RING;

/// Version 2 added the life-long longest; version 1 values still decode.
const VERSION: u8 = 2;
const VERSION_1: u8 = 1;

/// One copy's samples since its last merge.
#[derive(Debug, Default)]
pub struct PendingDurations {
    /// (µs, started after closing began).
    samples: VecDeque<(u32, bool)>,
    /// The longest request this copy timed since its last merge (µs),
    /// sampled or not; None before any.
    longest_us: Option<u32>,
}

fn saturating_u32(micros: u64) -> u32 {
    u32::try_from(micros).unwrap_or(u32::MAX)
}

impl PendingDurations {
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty() && self.longest_us.is_none()
    }

    /// A sampled request: for the percentiles and the longest.
    pub fn add(&mut self, micros: u64, after_closing: bool) {
        if self.samples.len() >= PENDING_MAX {
            self.samples.pop_front();
        }
        self.samples
            .push_back((saturating_u32(micros), after_closing));
        self.note_longest(micros);
    }

    /// A request timed for the longest only (not sampled).
    pub fn note_longest(&mut self, micros: u64) {
        self.longest_us = self.longest_us.max(Some(saturating_u32(micros)));
    }
}

/// The shared durations.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DurationRing {
    /// At most [`RING`] (µs, saturating at ~71 minutes).
    samples: Vec<u32>,
    /// Where the next sample goes once full.
    next: u16,
    /// The longest request timed since closing began (µs).
    pub max_after_closing_us: u32,
    /// The longest request that ended since the provider started (µs).
    pub longest_us: u32,
}

/// `request_ms` of the report.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Summary {
    pub count: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
}

impl DurationRing {
    pub fn merge(&mut self, pending: &PendingDurations) {
        self.longest_us = self.longest_us.max(pending.longest_us.unwrap_or(0));
        for &(us, after_closing) in &pending.samples {
            if after_closing {
                self.max_after_closing_us = self.max_after_closing_us.max(us);
            }
            if self.samples.len() < RING {
                self.samples.push(us);
            } else {
                let at = usize::from(self.next) % RING;
                self.samples[at] = us;
                self.next = ((at + 1) % RING) as u16;
            }
        }
    }

    /// Nearest-rank percentiles over the ring; the max is the longest
    /// request since the provider started.
    pub fn summary(&self) -> Summary {
        let mut sorted = self.samples.clone();
        sorted.sort_unstable();
        let rank = |p: usize| -> u64 {
            if sorted.is_empty() {
                return 0;
            }
            let i = (sorted.len() * p).div_ceil(100).clamp(1, sorted.len()) - 1;
            u64::from(sorted[i])
        };
        Summary {
            count: sorted.len() as u64,
            p50_us: rank(50),
            p99_us: rank(99),
            max_us: sorted
                .last()
                .copied()
                .unwrap_or(0)
                .max(self.max_after_closing_us)
                .max(self.longest_us)
                .into(),
        }
    }

    /// Fixed little-endian layout: version u8, next u16, max_after_closing
    /// u32, longest u32 (version 2), count u16, then each sample u32.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![VERSION];
        out.extend_from_slice(&self.next.to_le_bytes());
        out.extend_from_slice(&self.max_after_closing_us.to_le_bytes());
        out.extend_from_slice(&self.longest_us.to_le_bytes());
        out.extend_from_slice(&(self.samples.len() as u16).to_le_bytes());
        for s in &self.samples {
            out.extend_from_slice(&s.to_le_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<DurationRing> {
        let mut r = Reader(bytes);
        let version = r.u8()?;
        if version != VERSION && version != VERSION_1 {
            return None;
        }
        let next = r.u16()?;
        let max_after_closing_us = r.u32()?;
        let longest_us = if version == VERSION { r.u32()? } else { 0 };
        let n = usize::from(r.u16()?);
        if n > RING || usize::from(next) >= RING.max(1) {
            return None;
        }
        let samples = (0..n).map(|_| r.u32()).collect::<Option<Vec<_>>>()?;
        r.0.is_empty().then_some(DurationRing {
            samples,
            next,
            max_after_closing_us,
            longest_us,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_come_from_the_latest_samples_and_the_max_keeps_the_shutdowns_longest() {
        let mut ring = DurationRing::default();
        assert_eq!(ring.summary(), Summary::default());
        let mut pending = PendingDurations::default();
        for us in 1..=100u64 {
            pending.add(us * 1000, false);
        }
        ring.merge(&pending);
        let s = ring.summary();
        assert_eq!(
            (s.count, s.p50_us, s.p99_us, s.max_us),
            (100, 50_000, 99_000, 100_000)
        );
        // One long request of the shutdown, then many short ones that push
        // it out of the ring: the max still has it.
        let mut pending = PendingDurations::default();
        pending.add(2_500_000, true);
        ring.merge(&pending);
        for _ in 0..3 {
            let mut pending = PendingDurations::default();
            for _ in 0..RING {
                pending.add(700, true);
            }
            ring.merge(&pending);
        }
        let s = ring.summary();
        assert_eq!(
            (s.count, s.p50_us, s.p99_us, s.max_us),
            (RING as u64, 700, 700, 2_500_000)
        );
        assert_eq!(DurationRing::decode(&ring.encode()), Some(ring.clone()));
        assert!(ring.encode().len() <= 20 + 4 * RING);
        assert_eq!(DurationRing::decode(&ring.encode()[1..]), None);
    }

    #[test]
    fn the_max_counts_every_timed_request_sampled_or_not_and_old_values_decode() {
        let mut ring = DurationRing::default();
        let mut pending = PendingDurations::default();
        assert!(pending.is_empty());
        pending.note_longest(1_500_000);
        assert!(!pending.is_empty(), "a longest alone is worth a merge");
        for _ in 0..10 {
            pending.add(900, false);
        }
        ring.merge(&pending);
        let s = ring.summary();
        assert_eq!((s.count, s.p99_us, s.max_us), (10, 900, 1_500_000));
        // A shorter longest later does not lower it.
        let mut pending = PendingDurations::default();
        pending.note_longest(2_000);
        ring.merge(&pending);
        assert_eq!(ring.summary().max_us, 1_500_000);
        assert_eq!(DurationRing::decode(&ring.encode()), Some(ring.clone()));
        // Version 1 (no longest) as an older build wrote it.
        let mut v1 = vec![1u8];
        v1.extend_from_slice(&0u16.to_le_bytes());
        v1.extend_from_slice(&7u32.to_le_bytes());
        v1.extend_from_slice(&1u16.to_le_bytes());
        v1.extend_from_slice(&5u32.to_le_bytes());
        let old = DurationRing::decode(&v1).unwrap();
        assert_eq!((old.longest_us, old.summary().max_us), (0, 7));
    }

    #[test]
    fn a_copy_keeps_its_latest_samples_bounded() {
        let mut pending = PendingDurations::default();
        for us in 0..(PENDING_MAX as u64 * 3) {
            pending.add(us, false);
        }
        assert_eq!(pending.samples.len(), PENDING_MAX);
        assert_eq!(
            pending.samples.back().map(|s| s.0),
            Some(PENDING_MAX as u32 * 3 - 1)
        );
        pending.add(u64::MAX, false);
        assert_eq!(pending.samples.back().map(|s| s.0), Some(u32::MAX));
    }
}
