//! The figures of one host as the front's endpoints answer them
//! (`closing`, `drained?wait=`, `status`: docs/design/front-proxy-drain.md
//! §3 and §4). graceful-hook's front mode reads `inflight_at_closing`,
//! `steered_after_ms`, `last_active_ms` and `late` (at any depth of the
//! JSON) and `"state": "serving"` (the front does not know of the
//! closing): those names are fixed.

use serde::Serialize;

use super::{source, FrontHost, State};

/// One host's status. Times are in ms since its `closing_us`; a figure not
/// known yet (or not reached) is null.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FrontStatus {
    /// `serving` (no entry), `closing`, `steered` or `acknowledged`.
    pub state: &'static str,
    /// How the front learned: any of `host`, `draining`, `removed`.
    pub source: Vec<&'static str>,
    /// `rq_active` at the first read after closing.
    pub inflight_at_closing: Option<u32>,
    /// Closing to the generation bump that steered it away.
    pub steered_after_ms: Option<u64>,
    /// `rq_active` at the first read after the steering.
    pub inflight_at_steering: Option<u32>,
    /// Closing to the last read that saw a request in flight, or to the
    /// first zero read after it (its last request ended within a poll).
    pub last_active_ms: Option<u64>,
    /// Closing to the acknowledgement.
    pub acknowledged_after_ms: Option<u64>,
    /// Attempts seen at it after the acknowledgement: must stay 0.
    pub late: u32,
}

impl FrontStatus {
    /// The status of a host's entry (None: serving).
    pub fn of(host: Option<&FrontHost>) -> FrontStatus {
        let Some(h) = host else {
            return FrontStatus {
                state: "serving",
                source: Vec::new(),
                inflight_at_closing: None,
                steered_after_ms: None,
                inflight_at_steering: None,
                last_active_ms: None,
                acknowledged_after_ms: None,
                late: 0,
            };
        };
        let since = |us: u64| us.saturating_sub(h.closing_us) / 1000;
        let steered = matches!(h.state, State::Steered | State::Acknowledged);
        let acknowledged = h.state == State::Acknowledged;
        FrontStatus {
            state: h.state.name(),
            source: source::NAMES
                .iter()
                .filter(|(bit, _)| h.sources & bit != 0)
                .map(|(_, name)| *name)
                .collect(),
            inflight_at_closing: h.inflight_at_closing,
            steered_after_ms: steered.then(|| since(h.steered_us)),
            inflight_at_steering: h.inflight_at_steering,
            last_active_ms: Some(since(h.last_active_us)),
            acknowledged_after_ms: acknowledged.then(|| since(h.acked_us)),
            late: h.late,
        }
    }
}
