//! The drain report (the contract's `GET /graceful/report`): what the
//! current or last shutdown saw, and what it recommends.
//! It lives in graceful_drain's room: drain writes the record and the pass it
//! is built from, and reads and answers it; graceful_provider's writes (peers,
//! durations) go through [`PendingReport`] on drain's facade.
//!
//! Who records what:
//!
//! | data | recorded by | when | kept in |
//! |---|---|---|---|
//! | closing, the pass, forced | graceful_drain | closing starts, the gate passes | [`crate::shared::keys::RECORD`] |
//! | which timeout forced it | graceful_drain (the copy whose write passed) | the gate passes | [`crate::shared::keys::PASSED_BY`] |
//! | peers after closing | graceful_provider, per stream that started once its copy knew of the closing; merged on the copy's tick | closing onwards | [`crate::shared::keys::REPORT_PEERS`] ([`peers`]) |
//! | request durations | graceful_provider: the longest of every request; for the percentiles one stream in [`durations::SAMPLE_EVERY`] per copy while serving, every stream from closing on; merged on the tick | always | [`crate::shared::keys::REPORT_DURATIONS`] ([`durations`]) |
//!
//! A provider copy learns of the closing at its next response (the phase
//! gauge it reads to mark responses) or its next tick, at most
//! [`crate::provider::filter::TICK`] later: requests it admitted before that
//! are not in the peers, and its merges lag by as much.

pub mod durations;
pub mod peers;
pub mod recommend;

use serde::Serialize;

use crate::drain::record::{GatePass, GateTimings, InstanceRecord, Phase};
use crate::shared::store::{update, SharedStore, UpdateError};

use durations::{DurationRing, PendingDurations, Summary};
use peers::{PeerTable, PendingPeers};
pub use recommend::Recommended;

/// One copy's records since its last merge.
#[derive(Debug, Default)]
pub struct PendingReport {
    pub peers: PendingPeers,
    pub durations: PendingDurations,
}

impl PendingReport {
    pub fn is_empty(&self) -> bool {
        self.peers.is_empty() && self.durations.is_empty()
    }

    /// Merges these records into shared data; the longest request the
    /// shared durations hold after it (µs; 0 if this merge had none). A
    /// merge lost to contention is dropped (the report is a measurement,
    /// never worth a blocked stream or tick).
    pub fn merge_into(self, store: &dyn SharedStore) -> Result<u64, UpdateError> {
        if !self.peers.is_empty() {
            update(store, crate::shared::keys::REPORT_PEERS.name, |bytes| {
                let mut table = bytes.and_then(PeerTable::decode).unwrap_or_default();
                table.merge(&self.peers);
                (Some(table.encode()), ())
            })?;
        }
        let mut longest = 0;
        if !self.durations.is_empty() {
            longest = update(store, crate::shared::keys::REPORT_DURATIONS.name, |bytes| {
                let mut ring = bytes.and_then(DurationRing::decode).unwrap_or_default();
                ring.merge(&self.durations);
                (Some(ring.encode()), u64::from(ring.longest_us))
            })?;
        }
        Ok(longest)
    }
}

/// One peer as the report shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PeerLine {
    pub address: Option<String>,
    pub consumer: Option<String>,
    pub requests: u64,
    pub marked: u64,
    /// Refused as late arrivals (added to the contract's peer fields).
    pub refused_late: u64,
    pub last_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestMs {
    pub count: u64,
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub max: Option<f64>,
}

/// The report; field names are the contract's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub phase: &'static str,
    pub closing_for_ms: Option<u64>,
    pub drained_after_ms: Option<u64>,
    pub forced: bool,
    pub forced_by: Option<&'static str>,
    pub requests_after_closing: u64,
    /// Of those, refused once admission stopped (`longest_request` set and
    /// `step_timeout` ran out) while the requests in flight ended.
    pub refused_late: u64,
    pub last_request_after_closing_ms: Option<u64>,
    pub peers: Vec<PeerLine>,
    pub peers_dropped: u64,
    pub request_ms: RequestMs,
    pub recommended: Option<Recommended>,
}

/// What the report is made of, as graceful_drain reads it.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    pub record: InstanceRecord,
    /// Why the gate passed; None before (or unreadable).
    pub passed_by: Option<GatePass>,
    pub peers: PeerTable,
    pub durations: DurationRing,
}

impl Inputs {
    /// Reads every input; a missing or malformed value reads as empty.
    pub fn read(store: &dyn SharedStore) -> Result<Inputs, crate::shared::store::StoreError> {
        let get = |key: &crate::shared::keys::Key| -> Result<Option<Vec<u8>>, crate::shared::store::StoreError> {
            Ok(store.get(key.name)?.map(|(v, _)| v))
        };
        Ok(Inputs {
            record: crate::drain::record::read(store)?,
            passed_by: get(&crate::shared::keys::PASSED_BY)?
                .and_then(|v| v.first().copied())
                .and_then(GatePass::from_byte),
            peers: get(&crate::shared::keys::REPORT_PEERS)?
                .and_then(|v| PeerTable::decode(&v))
                .unwrap_or_default(),
            durations: get(&crate::shared::keys::REPORT_DURATIONS)?
                .and_then(|v| DurationRing::decode(&v))
                .unwrap_or_default(),
        })
    }
}

fn ms_from(since_us: u64, at_us: u64) -> u64 {
    at_us.saturating_sub(since_us) / 1000
}

fn ms_f64(us: u64) -> f64 {
    us as f64 / 1000.0
}

impl Report {
    /// The report at `now_us`, showing at most `max_peers` peers.
    pub fn build(inputs: &Inputs, gate: &GateTimings, max_peers: usize, now_us: u64) -> Report {
        let rec = &inputs.record;
        let closing = rec.phase.is_closing();
        let since = rec.closing_since_us;
        let drained = rec.phase == Phase::Drained;
        let summary: Summary = inputs.durations.summary();
        let mut kept: Vec<PeerLine> = inputs
            .peers
            .peers
            .iter()
            .map(|(p, c)| PeerLine {
                address: p.address.map(|a| a.to_string()),
                consumer: p.consumer.clone(),
                requests: c.requests,
                marked: c.marked,
                refused_late: c.refused_late,
                last_ms: ms_from(since, c.last_start_us),
            })
            .collect();
        kept.sort_by(|a, b| {
            b.requests
                .cmp(&a.requests)
                .then(b.last_ms.cmp(&a.last_ms))
                .then(a.address.cmp(&b.address))
        });
        let recommended = closing.then(|| {
            let callers: Vec<recommend::Caller> = kept
                .iter()
                .map(|p| recommend::Caller {
                    name: peer_name(p),
                    last_ms: p.last_ms,
                })
                .collect();
            let end_us = if drained { rec.drained_at_us } else { now_us };
            let forced_by = inputs.passed_by.filter(|p| rec.forced && p.forced());
            recommend::recommend(gate, &callers, ms_from(since, end_us), &summary, forced_by)
        });
        let shown = kept.len().min(max_peers);
        let peers_dropped = (kept.len() - shown) as u64 + inputs.peers.dropped();
        kept.truncate(shown);
        let has = summary.count > 0 || summary.max_us > 0;
        Report {
            phase: rec.phase.name(),
            closing_for_ms: closing.then(|| ms_from(since, now_us)),
            drained_after_ms: drained.then(|| ms_from(since, rec.drained_at_us)),
            forced: rec.forced,
            forced_by: inputs
                .passed_by
                .filter(|_| rec.forced)
                .and_then(GatePass::forced_by),
            requests_after_closing: inputs.peers.requests,
            refused_late: inputs.peers.refused_late,
            last_request_after_closing_ms: (closing && inputs.peers.last_start_us != 0)
                .then(|| ms_from(since, inputs.peers.last_start_us)),
            peers: kept,
            peers_dropped,
            request_ms: RequestMs {
                count: summary.count,
                p50: has.then(|| ms_f64(summary.p50_us)),
                p99: has.then(|| ms_f64(summary.p99_us)),
                max: has.then(|| ms_f64(summary.max_us)),
            },
            recommended,
        }
    }

    /// Peers whose last request came after `consumer_update_wait`: they
    /// kept sending when every consumer should have known.
    pub fn late_peers(inputs: &Inputs, gate: &GateTimings) -> u64 {
        let wait_ms = gate.consumer_update_wait.as_millis() as u64;
        let since = inputs.record.closing_since_us;
        inputs
            .peers
            .peers
            .iter()
            .filter(|(_, c)| ms_from(since, c.last_start_us) > wait_ms)
            .count() as u64
    }

    pub fn to_json(&self) -> String {
        // Every string in it was validated or built here; the fallback
        // keeps the no-panic rule.
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_string())
    }
}

fn peer_name(p: &PeerLine) -> String {
    let address = p.address.as_deref().unwrap_or("unknown address");
    match &p.consumer {
        Some(c) => format!("{address} consumer {c}"),
        None => address.to_string(),
    }
}

#[cfg(test)]
mod tests;
