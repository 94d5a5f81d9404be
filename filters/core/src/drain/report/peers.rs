//! Who sent requests after closing began: each VM copy of graceful_provider
//! gathers its streams' peers in a [`PendingPeers`], and its tick merges them
//! into the one [`PeerTable`] in shared data ([`crate::shared::keys::REPORT_PEERS`])
//! that graceful_drain reads for the report.
//!
//! A peer is a source IP and the consumer identity its requests carried
//! (graceful_consumer's `consumer_header`). Both come from the network or
//! a client, so both are bounded before they are kept: an identity not made
//! of [`is_consumer_identity`]'s characters, or longer than
//! [`MAX_CONSUMER_LEN`] bytes, counts as none, and the table keeps at most
//! [`PEERS_KEPT`] peers. When it is full, a peer arriving with at least as
//! many requests as the smallest kept one (the least recent of those) takes
//! its place, so a caller that keeps sending stays while one-off callers
//! churn; the others are counted, not kept: exactly (by an 8-byte hash,
//! deduplicated) for the first [`DROPPED_TRACKED`], then once per merge
//! that meets them. A caller kept again after being dropped counts its
//! requests from then on.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;

use crate::shared::net::trusted_peer_ip;

/// Most peers the shared table keeps.
pub const PEERS_KEPT: usize = 128;
/// Most dropped peers counted exactly (their hashes are kept).
pub const DROPPED_TRACKED: usize = 1024;
/// Longest consumer identity kept.
pub const MAX_CONSUMER_LEN: usize = 64;

/// What a consumer identity may be made of: an instance id as
/// graceful_consumer sends it (hex), or a pod or host name. Anything else
/// (quotes, spaces, control bytes) is a client's invention.
pub fn is_consumer_identity(value: &[u8]) -> bool {
    !value.is_empty()
        && value.len() <= MAX_CONSUMER_LEN
        && value
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:".contains(b))
}
/// Most distinct peers one copy gathers between two merges; more are
/// counted as dropped peers (by hash, up to [`DROPPED_TRACKED`]). A burst of
/// 1,000 new callers within one 100 ms tick (a client pool reconnecting)
/// stays keepable: at 256, a caller that came just after such a burst
/// could not be kept, however many requests it sent before the merge.
/// Some 100 KiB per copy at most, freed at each merge.
pub const PENDING_MAX: usize = 1024;

/// 2 added `refused_late` (a table version 1 wrote still decodes, with
/// none refused: a filter update pushed mid-drain keeps the callers).
const VERSION: u8 = 2;

/// One caller.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PeerId {
    /// The source IP; None when Envoy gave no usable address.
    pub address: Option<IpAddr>,
    pub consumer: Option<String>,
}

impl PeerId {
    /// From Envoy's `source.address` (`ip:port`) and the request's consumer
    /// header. A value no graceful_consumer would send counts as none.
    pub fn new(source_address: Option<&[u8]>, consumer: Option<&[u8]>) -> PeerId {
        let consumer = consumer
            .filter(|c| is_consumer_identity(c))
            .map(|c| String::from_utf8_lossy(c).into_owned());
        PeerId {
            address: source_address.and_then(|a| trusted_peer_ip(a, None)),
            consumer,
        }
    }

    /// FNV-1a over the encoding: stable across VM copies and builds, so
    /// every copy counts a dropped peer once.
    fn hash(&self) -> u64 {
        let mut bytes = Vec::new();
        self.encode(&mut bytes);
        crate::shared::store::fnv1a(&bytes)
    }

    fn encode(&self, out: &mut Vec<u8>) {
        match self.address {
            None => out.push(0),
            Some(IpAddr::V4(a)) => {
                out.push(4);
                out.extend_from_slice(&a.octets());
            }
            Some(IpAddr::V6(a)) => {
                out.push(6);
                out.extend_from_slice(&a.octets());
            }
        }
        let consumer = self.consumer.as_deref().unwrap_or("").as_bytes();
        out.push(consumer.len() as u8);
        out.extend_from_slice(consumer);
    }

    fn decode(r: &mut Reader) -> Option<PeerId> {
        let address = match r.u8()? {
            0 => None,
            4 => Some(IpAddr::from(<[u8; 4]>::try_from(r.take(4)?).ok()?)),
            6 => Some(IpAddr::from(<[u8; 16]>::try_from(r.take(16)?).ok()?)),
            _ => return None,
        };
        let len = usize::from(r.u8()?);
        if len > MAX_CONSUMER_LEN {
            return None;
        }
        let consumer = r.take(len)?;
        let consumer = is_consumer_identity(consumer)
            .then(|| String::from_utf8(consumer.to_vec()).ok())
            .flatten();
        Some(PeerId { address, consumer })
    }
}

/// What one peer sent after closing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PeerCounts {
    pub requests: u64,
    /// Answered with the closing mark (marked responses and the drained
    /// 503s).
    pub marked: u64,
    /// Refused as late arrivals: admission had stopped (`longest_request`)
    /// while the requests in flight ended.
    pub refused_late: u64,
    /// When its latest request started (µs on the host's monotonic clock).
    pub last_start_us: u64,
}

impl PeerCounts {
    fn add(&mut self, other: &PeerCounts) {
        self.requests = self.requests.saturating_add(other.requests);
        self.marked = self.marked.saturating_add(other.marked);
        self.refused_late = self.refused_late.saturating_add(other.refused_late);
        self.last_start_us = self.last_start_us.max(other.last_start_us);
    }
}

/// One copy's peers since its last merge.
#[derive(Debug, Default)]
pub struct PendingPeers {
    peers: BTreeMap<PeerId, PeerCounts>,
    /// Requests of peers beyond [`PENDING_MAX`].
    overflow: u64,
    /// Of those, refused as late arrivals.
    overflow_refused_late: u64,
    overflow_last_us: u64,
    /// Those peers' hashes, so each is counted once as dropped (a burst of
    /// 1,000 new callers within one tick is 744 dropped peers, not one).
    overflow_peers: HashSet<u64>,
    /// Overflow peers met past [`DROPPED_TRACKED`] of them: counted as one.
    overflow_untracked: bool,
}

impl PendingPeers {
    pub fn is_empty(&self) -> bool {
        self.peers.is_empty() && self.overflow == 0
    }

    /// One request from `peer`, started at `start_us`.
    pub fn add(&mut self, peer: PeerId, marked: bool, refused_late: bool, start_us: u64) {
        let one = PeerCounts {
            requests: 1,
            marked: u64::from(marked),
            refused_late: u64::from(refused_late),
            last_start_us: start_us,
        };
        if let Some(counts) = self.peers.get_mut(&peer) {
            counts.add(&one);
        } else if self.peers.len() < PENDING_MAX {
            self.peers.insert(peer, one);
        } else {
            self.overflow += 1;
            self.overflow_refused_late += u64::from(refused_late);
            self.overflow_last_us = self.overflow_last_us.max(start_us);
            if self.overflow_peers.len() < DROPPED_TRACKED {
                self.overflow_peers.insert(peer.hash());
            } else {
                self.overflow_untracked = true;
            }
        }
    }
}

/// The shared table: every request after closing that the copies merged,
/// and the peers they came from (bounded).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PeerTable {
    pub requests: u64,
    /// Of those, refused as late arrivals (kept peers or not).
    pub refused_late: u64,
    /// When the latest of them started (µs on the host's monotonic clock; 0: none).
    pub last_start_us: u64,
    /// At most [`PEERS_KEPT`], unordered.
    pub peers: Vec<(PeerId, PeerCounts)>,
    /// Hashes of peers not kept (at most [`DROPPED_TRACKED`]).
    dropped: Vec<u64>,
    /// Peers not kept beyond those tracked (one per hash not tracked, and
    /// one per merge whose copy met more than it tracked).
    dropped_untracked: u64,
}

impl PeerTable {
    /// Peers met but not kept.
    pub fn dropped(&self) -> u64 {
        self.dropped.len() as u64 + self.dropped_untracked
    }

    /// Merges one copy's pending peers.
    pub fn merge(&mut self, pending: &PendingPeers) {
        for (peer, counts) in &pending.peers {
            self.requests = self.requests.saturating_add(counts.requests);
            self.refused_late = self.refused_late.saturating_add(counts.refused_late);
            self.last_start_us = self.last_start_us.max(counts.last_start_us);
            if let Some((_, kept)) = self.peers.iter_mut().find(|(p, _)| p == peer) {
                kept.add(counts);
            } else if self.peers.len() < PEERS_KEPT {
                self.keep(peer, counts);
            } else {
                let smallest = self
                    .peers
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, (_, c))| (c.requests, c.last_start_us))
                    .map(|(i, (_, c))| (i, c.requests));
                match smallest {
                    Some((i, least)) if counts.requests >= least => {
                        let (evicted, _) = self.peers.swap_remove(i);
                        self.drop_peer(Some(evicted.hash()));
                        self.keep(peer, counts);
                    }
                    _ => self.drop_peer(Some(peer.hash())),
                }
            }
        }
        if pending.overflow > 0 {
            self.requests = self.requests.saturating_add(pending.overflow);
            self.refused_late = self
                .refused_late
                .saturating_add(pending.overflow_refused_late);
            self.last_start_us = self.last_start_us.max(pending.overflow_last_us);
            // A kept peer that overflowed in this copy is kept, not dropped.
            let kept: HashSet<u64> = self.peers.iter().map(|(p, _)| p.hash()).collect();
            for hash in &pending.overflow_peers {
                if !kept.contains(hash) {
                    self.drop_peer(Some(*hash));
                }
            }
            if pending.overflow_untracked {
                self.drop_peer(None);
            }
        }
    }

    fn keep(&mut self, peer: &PeerId, counts: &PeerCounts) {
        let hash = peer.hash();
        self.dropped.retain(|h| *h != hash);
        self.peers.push((peer.clone(), *counts));
    }

    fn drop_peer(&mut self, hash: Option<u64>) {
        match hash {
            Some(h) if self.dropped.contains(&h) => {}
            Some(h) if self.dropped.len() < DROPPED_TRACKED => self.dropped.push(h),
            _ => self.dropped_untracked = self.dropped_untracked.saturating_add(1),
        }
    }

    /// Fixed little-endian layout: version u8; requests, last_start_us,
    /// dropped_untracked, refused_late u64; peer count u16 and each peer
    /// (address kind u8 0/4/6 and its bytes, consumer length u8 and its
    /// bytes, requests, marked, last_start_us, refused_late u64); dropped
    /// count u16 and each hash u64. Version 1 lacked both `refused_late`.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![VERSION];
        for v in [
            self.requests,
            self.last_start_us,
            self.dropped_untracked,
            self.refused_late,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&(self.peers.len() as u16).to_le_bytes());
        for (peer, c) in &self.peers {
            peer.encode(&mut out);
            for v in [c.requests, c.marked, c.last_start_us, c.refused_late] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        out.extend_from_slice(&(self.dropped.len() as u16).to_le_bytes());
        for h in &self.dropped {
            out.extend_from_slice(&h.to_le_bytes());
        }
        out
    }

    /// None for anything this version did not write, or beyond the bounds.
    pub fn decode(bytes: &[u8]) -> Option<PeerTable> {
        let mut r = Reader(bytes);
        let version = r.u8()?;
        if version != 1 && version != VERSION {
            return None;
        }
        let has_refused = version >= 2;
        // Version 1 counted no refusals.
        let refused = |r: &mut Reader| if has_refused { r.u64() } else { Some(0) };
        let (requests, last_start_us, dropped_untracked) = (r.u64()?, r.u64()?, r.u64()?);
        let refused_late = refused(&mut r)?;
        let n = usize::from(r.u16()?);
        if n > PEERS_KEPT {
            return None;
        }
        let mut peers = Vec::with_capacity(n);
        for _ in 0..n {
            let peer = PeerId::decode(&mut r)?;
            let counts = PeerCounts {
                requests: r.u64()?,
                marked: r.u64()?,
                last_start_us: r.u64()?,
                refused_late: refused(&mut r)?,
            };
            peers.push((peer, counts));
        }
        let n = usize::from(r.u16()?);
        if n > DROPPED_TRACKED {
            return None;
        }
        let dropped = (0..n).map(|_| r.u64()).collect::<Option<Vec<_>>>()?;
        r.0.is_empty().then_some(PeerTable {
            requests,
            refused_late,
            last_start_us,
            peers,
            dropped,
            dropped_untracked,
        })
    }
}

/// Reads a little-endian encoding front to back.
pub(super) struct Reader<'a>(pub(super) &'a [u8]);

impl<'a> Reader<'a> {
    pub(super) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    pub(super) fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    pub(super) fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }

    pub(super) fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    pub(super) fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(ip: &str, consumer: Option<&str>) -> PeerId {
        PeerId::new(
            Some(format!("{ip}:40000").as_bytes()),
            consumer.map(str::as_bytes),
        )
    }

    #[test]
    fn a_peer_is_its_source_ip_and_a_valid_consumer_identity_only() {
        let p = peer("10.0.0.7", Some("3f2a9c01b7d4e655"));
        assert_eq!(p.address, Some("10.0.0.7".parse().unwrap()));
        assert_eq!(p.consumer.as_deref(), Some("3f2a9c01b7d4e655"));
        let v6 = PeerId::new(Some(b"[fd00::7]:8080"), None);
        assert_eq!(v6.address, Some("fd00::7".parse().unwrap()));
        // Forged or broken identities count as none: they cannot grow the
        // table's entries or break the report's JSON.
        for bad in [
            &b"\"},{\"x\":1"[..] as &[u8],
            b"with space",
            b"\xff\xfe",
            b"",
            &[b'a'; MAX_CONSUMER_LEN + 1],
        ] {
            let p = PeerId::new(Some(b"10.0.0.7:1"), Some(bad));
            assert_eq!(p.consumer, None, "{bad:?}");
        }
        // A header-made address (port 0) or garbage is no address.
        assert_eq!(PeerId::new(Some(b"10.0.0.7:0"), None).address, None);
        assert_eq!(PeerId::new(Some(b"nonsense"), None).address, None);
    }

    #[test]
    fn merges_add_up_per_peer_and_round_trip() {
        let (a, b) = (peer("10.0.0.1", Some("c-1")), peer("fd00::2", None));
        let mut pending = PendingPeers::default();
        pending.add(a.clone(), true, false, 100);
        pending.add(a.clone(), false, false, 300);
        pending.add(b.clone(), true, false, 200);
        let mut table = PeerTable::default();
        table.merge(&pending);
        table.merge(&pending);
        assert_eq!(table.requests, 6);
        assert_eq!(table.last_start_us, 300);
        let counts = |p: &PeerId| table.peers.iter().find(|(q, _)| q == p).map(|(_, c)| *c);
        assert_eq!(
            counts(&a),
            Some(PeerCounts {
                requests: 4,
                marked: 2,
                refused_late: 0,
                last_start_us: 300
            })
        );
        assert_eq!(counts(&b).map(|c| c.requests), Some(2));
        assert_eq!(PeerTable::decode(&table.encode()), Some(table.clone()));
        assert_eq!(
            PeerTable::decode(&PeerTable::default().encode()),
            Some(PeerTable::default())
        );
        let mut long = table.encode();
        long.push(0);
        assert_eq!(PeerTable::decode(&long), None);
        assert_eq!(PeerTable::decode(&table.encode()[..20]), None);
    }

    #[test]
    fn it_stays_bounded_and_counts_each_dropped_peer_once() {
        let mut table = PeerTable::default();
        for round in 0..3 {
            // 1,000 distinct peers, merged in chunks by "several copies".
            for chunk in 0..10 {
                let mut pending = PendingPeers::default();
                for i in 0..100u32 {
                    let n = chunk * 100 + i;
                    pending.add(
                        peer(&format!("127.1.{}.{}", n / 250, n % 250), None),
                        false,
                        false,
                        u64::from(round * 1000 + n),
                    );
                }
                table.merge(&pending);
            }
        }
        assert_eq!(table.peers.len(), PEERS_KEPT);
        assert_eq!(table.dropped(), 1000 - PEERS_KEPT as u64);
        assert_eq!(table.requests, 3000);
        let bytes = table.encode();
        assert!(bytes.len() < 16 * 1024, "{}", bytes.len());
        assert_eq!(PeerTable::decode(&bytes), Some(table));
    }

    #[test]
    fn a_caller_that_keeps_sending_stays_while_one_off_callers_churn() {
        let mut table = PeerTable::default();
        let mut pending = PendingPeers::default();
        for n in 0..PEERS_KEPT as u32 {
            pending.add(
                peer(&format!("10.1.{}.{}", n / 200, n % 200), None),
                false,
                false,
                1,
            );
        }
        table.merge(&pending);
        let persistent = peer("10.9.9.9", None);
        for round in 0..20u32 {
            let mut pending = PendingPeers::default();
            pending.add(persistent.clone(), true, false, u64::from(round) + 10);
            for i in 0..5u32 {
                let n = 1000 + round * 5 + i;
                pending.add(
                    peer(&format!("10.2.{}.{}", n / 200, n % 200), None),
                    false,
                    false,
                    5,
                );
            }
            table.merge(&pending);
        }
        let kept = table.peers.iter().find(|(p, _)| *p == persistent);
        assert_eq!(kept.map(|(_, c)| c.requests), Some(20));
        assert_eq!(table.peers.len(), PEERS_KEPT);
        assert_eq!(table.dropped(), 128 + 100 + 1 - PEERS_KEPT as u64);
    }

    #[test]
    fn a_copy_gathering_more_than_its_bound_still_counts_every_request() {
        let mut pending = PendingPeers::default();
        for n in 0..(PENDING_MAX as u32 + 10) {
            pending.add(
                peer(&format!("10.9.{}.{}", n / 200, n % 200), None),
                false,
                false,
                5,
            );
        }
        let mut table = PeerTable::default();
        table.merge(&pending);
        assert_eq!(table.requests, PENDING_MAX as u64 + 10);
        assert_eq!(table.peers.len(), PEERS_KEPT);
        assert_eq!(
            table.dropped(),
            (PENDING_MAX + 10 - PEERS_KEPT) as u64,
            "each peer past the copy's bound is one dropped peer"
        );
        // A second copy's burst of the same callers counts none twice.
        let mut again = PendingPeers::default();
        for n in 0..(PENDING_MAX as u32 + 10) {
            again.add(
                peer(&format!("10.9.{}.{}", n / 200, n % 200), None),
                false,
                false,
                6,
            );
        }
        table.merge(&again);
        assert_eq!(table.dropped(), (PENDING_MAX + 10 - PEERS_KEPT) as u64);
    }
}
