//! Request bookkeeping: how many requests are in flight, and when the last
//! one started. Inbound requests live inside the instance record (see
//! [`crate::record`]) so admission and the drain gate are one atomic value;
//! outbound requests (made by the app through the consumer filter) have a
//! key of their own, [`OUTBOUND_KEY`].

use crate::store::{read_u64, update, SharedStore, StoreError, UpdateError};

/// Shared-data key of the outbound traffic counters.
pub const OUTBOUND_KEY: &str = crate::keys::OUTBOUND.name;

/// Encoded size of [`Traffic`].
pub const TRAFFIC_LEN: usize = 16;

/// In-flight count and the start time of the latest request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    pub inflight: u64,
    /// Microseconds since the Unix epoch; 0 = no request yet.
    pub last_start_us: u64,
}

impl Traffic {
    /// Counts a request that starts at `now_us`. The latest start never moves
    /// back: workers' clocks are read at slightly different moments.
    pub fn started(self, now_us: u64) -> Traffic {
        Traffic {
            inflight: self.inflight.saturating_add(1),
            last_start_us: self.last_start_us.max(now_us),
        }
    }

    /// Counts a request that ended. Saturates at zero rather than wrap.
    pub fn ended(self) -> Traffic {
        Traffic {
            inflight: self.inflight.saturating_sub(1),
            ..self
        }
    }

    /// Fixed little-endian layout: inflight u64, last_start_us u64.
    pub fn encode(&self) -> [u8; TRAFFIC_LEN] {
        let mut out = [0u8; TRAFFIC_LEN];
        out[..8].copy_from_slice(&self.inflight.to_le_bytes());
        out[8..].copy_from_slice(&self.last_start_us.to_le_bytes());
        out
    }

    /// None unless `bytes` is exactly [`TRAFFIC_LEN`] long.
    pub fn decode(bytes: &[u8]) -> Option<Traffic> {
        if bytes.len() != TRAFFIC_LEN {
            return None;
        }
        Some(Traffic {
            inflight: read_u64(bytes.get(..8)?)?,
            last_start_us: read_u64(bytes.get(8..)?)?,
        })
    }

    /// Microseconds since the latest start, None if nothing ever started.
    pub fn idle_us(&self, now_us: u64) -> Option<u64> {
        (self.last_start_us != 0).then(|| now_us.saturating_sub(self.last_start_us))
    }
}

/// Reads the traffic at `key`; a missing or malformed value reads as zero.
pub fn read(store: &dyn SharedStore, key: &str) -> Result<Traffic, StoreError> {
    Ok(store
        .get(key)?
        .and_then(|(bytes, _)| Traffic::decode(&bytes))
        .unwrap_or_default())
}

/// Counts a request start at `key`; returns the new totals.
pub fn record_start(
    store: &dyn SharedStore,
    key: &str,
    now_us: u64,
) -> Result<Traffic, UpdateError> {
    modify(store, key, |t| t.started(now_us))
}

/// Counts a request end at `key`; returns the new totals.
pub fn record_end(store: &dyn SharedStore, key: &str) -> Result<Traffic, UpdateError> {
    modify(store, key, Traffic::ended)
}

fn modify(
    store: &dyn SharedStore,
    key: &str,
    f: impl Fn(Traffic) -> Traffic,
) -> Result<Traffic, UpdateError> {
    update(store, key, |bytes| {
        // A malformed value (written by something else under our vm_id)
        // restarts from zero rather than wedge every later update.
        let next = f(bytes.and_then(Traffic::decode).unwrap_or_default());
        (Some(next.encode().to_vec()), next)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;

    #[test]
    fn encoding_round_trips_and_is_little_endian() {
        let t = Traffic {
            inflight: 0x0102,
            last_start_us: 7,
        };
        let bytes = t.encode();
        assert_eq!(&bytes[..2], &[0x02, 0x01]);
        assert_eq!(Traffic::decode(&bytes), Some(t));
    }

    #[test]
    fn decode_refuses_other_lengths() {
        assert_eq!(Traffic::decode(&[]), None);
        assert_eq!(Traffic::decode(&[0; 15]), None);
        assert_eq!(Traffic::decode(&[0; 17]), None);
    }

    #[test]
    fn start_and_end_count_and_keep_latest_start() {
        let store = MemStore::new();
        record_start(&store, OUTBOUND_KEY, 100).unwrap();
        record_start(&store, OUTBOUND_KEY, 90).unwrap();
        let t = read(&store, OUTBOUND_KEY).unwrap();
        assert_eq!(
            t,
            Traffic {
                inflight: 2,
                last_start_us: 100
            }
        );
        record_end(&store, OUTBOUND_KEY).unwrap();
        record_end(&store, OUTBOUND_KEY).unwrap();
        let t = record_end(&store, OUTBOUND_KEY).unwrap();
        assert_eq!(t.inflight, 0, "an extra end saturates at zero");
    }

    #[test]
    fn malformed_value_reads_as_zero_and_is_repaired_by_the_next_update() {
        let store = MemStore::new();
        store.set(OUTBOUND_KEY, b"garbage", 0).unwrap();
        assert_eq!(read(&store, OUTBOUND_KEY).unwrap(), Traffic::default());
        let t = record_start(&store, OUTBOUND_KEY, 5).unwrap();
        assert_eq!(
            t,
            Traffic {
                inflight: 1,
                last_start_us: 5
            }
        );
        assert_eq!(read(&store, OUTBOUND_KEY).unwrap(), t);
    }

    #[test]
    fn idle_is_none_before_any_request() {
        assert_eq!(Traffic::default().idle_us(10), None);
        assert_eq!(
            Traffic {
                inflight: 0,
                last_start_us: 4
            }
            .idle_us(10),
            Some(6)
        );
        assert_eq!(
            Traffic {
                inflight: 0,
                last_start_us: 14
            }
            .idle_us(10),
            Some(0)
        );
    }
}
