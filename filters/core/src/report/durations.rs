//! How long requests take, for the report's `request_ms` and its
//! recommended `timeout`. While serving, each copy of graceful_provider
//! times one request in [`SAMPLE_EVERY`] (two clock reads, nothing else);
//! from closing on, every request. Its tick merges the samples into the
//! shared [`DurationRing`] ([`crate::keys::REPORT_DURATIONS`]): the latest
//! [`RING`] durations, and the longest seen since closing began, so a long
//! request of the shutdown is never pushed out by many short ones.

use std::collections::VecDeque;

use super::peers::Reader;

/// Durations the shared ring keeps.
pub const RING: usize = 256;
/// While serving, one request in this many is timed (per copy).
pub const SAMPLE_EVERY: u32 = 32;
/// Most samples one copy gathers between two merges (the latest win).
pub const PENDING_MAX: usize = RING;

const VERSION: u8 = 1;

/// One copy's samples since its last merge.
#[derive(Debug, Default)]
pub struct PendingDurations {
    /// (µs, started after closing began).
    samples: VecDeque<(u32, bool)>,
}

impl PendingDurations {
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    pub fn add(&mut self, micros: u64, after_closing: bool) {
        if self.samples.len() >= PENDING_MAX {
            self.samples.pop_front();
        }
        self.samples
            .push_back((u32::try_from(micros).unwrap_or(u32::MAX), after_closing));
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

    /// Nearest-rank percentiles over the ring; the max includes the longest
    /// since closing.
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
                .into(),
        }
    }

    /// Fixed little-endian layout: version u8, next u16, max_after_closing
    /// u32, count u16, then each sample u32.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![VERSION];
        out.extend_from_slice(&self.next.to_le_bytes());
        out.extend_from_slice(&self.max_after_closing_us.to_le_bytes());
        out.extend_from_slice(&(self.samples.len() as u16).to_le_bytes());
        for s in &self.samples {
            out.extend_from_slice(&s.to_le_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<DurationRing> {
        let mut r = Reader(bytes);
        if r.u8()? != VERSION {
            return None;
        }
        let next = r.u16()?;
        let max_after_closing_us = r.u32()?;
        let n = usize::from(r.u16()?);
        if n > RING || usize::from(next) >= RING.max(1) {
            return None;
        }
        let samples = (0..n).map(|_| r.u32()).collect::<Option<Vec<_>>>()?;
        r.0.is_empty().then_some(DurationRing {
            samples,
            next,
            max_after_closing_us,
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
        assert!(ring.encode().len() <= 16 + 4 * RING);
        assert_eq!(DurationRing::decode(&ring.encode()[1..]), None);
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
