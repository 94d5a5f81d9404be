//! The status JSON that `/graceful/status`, `/graceful/drained` and
//! `/graceful/closing` answer with, and that `on_drained` posts.

use serde::{Deserialize, Serialize};

use crate::drain::record::{InstanceRecord, Phase};
use crate::shared::gate::Traffic;

/// Field names and meanings are fixed by the public contract.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Status {
    /// `serving`, `closing` or `drained`.
    pub phase: String,
    /// Time since closing started; null while serving.
    pub closing_for_ms: Option<u64>,
    pub inflight_inbound: u64,
    pub inflight_outbound: u64,
    /// Time since the latest request (inbound or outbound) started; null if
    /// none has.
    pub last_request_ms_ago: Option<u64>,
    pub drained: bool,
    /// True when a timeout, not quiet, passed the gate.
    pub forced: bool,
}

impl Status {
    /// `last_start_us`: the latest request start as the answering copy
    /// knows it (0 = none), see [`crate::shared::gate::StartWatch`].
    pub fn new(
        record: &InstanceRecord,
        traffic: &Traffic,
        last_start_us: u64,
        now_us: u64,
    ) -> Status {
        let (inbound, outbound) = traffic.inflight();
        Status {
            phase: record.phase.name().to_string(),
            closing_for_ms: record
                .phase
                .is_closing()
                .then(|| now_us.saturating_sub(record.closing_since_us) / 1000),
            inflight_inbound: inbound,
            inflight_outbound: outbound,
            last_request_ms_ago: (last_start_us != 0)
                .then(|| now_us.saturating_sub(last_start_us) / 1000),
            drained: record.phase == Phase::Drained,
            forced: record.forced,
        }
    }

    pub fn to_json(&self) -> String {
        // Serializing plain fields cannot fail; the fallback keeps the
        // no-panic rule without pretending otherwise.
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serving_status_has_nulls_for_what_has_not_happened() {
        let s = Status::new(
            &InstanceRecord::default(),
            &Traffic::default(),
            0,
            5_000_000,
        );
        assert_eq!(
            s.to_json(),
            r#"{"phase":"serving","closing_for_ms":null,"inflight_inbound":0,"inflight_outbound":0,"last_request_ms_ago":null,"drained":false,"forced":false}"#
        );
    }

    #[test]
    fn drained_status_reports_times_counts_and_forced() {
        let record = InstanceRecord {
            phase: Phase::Drained,
            forced: true,
            admission_stopped: false,
            closing_since_us: 1_000_000,
            drained_at_us: 4_000_000,
        };
        let traffic = Traffic {
            inflight_inbound: Some(2),
            inflight_outbound: Some(1),
            started: Some(9),
        };
        let s = Status::new(&record, &traffic, 3_500_000, 5_000_000);
        assert_eq!(s.phase, "drained");
        assert_eq!(s.closing_for_ms, Some(4_000));
        assert_eq!((s.inflight_inbound, s.inflight_outbound), (2, 1));
        assert_eq!(
            s.last_request_ms_ago,
            Some(1_500),
            "from the latest start the copy saw"
        );
        assert!(s.drained && s.forced);
    }

    #[test]
    fn json_round_trips() {
        let record = InstanceRecord {
            phase: Phase::Closing,
            closing_since_us: 1,
            ..Default::default()
        };
        let s = Status::new(&record, &Traffic::default(), 0, 2_000_001);
        let back: Status = serde_json::from_str(&s.to_json()).unwrap();
        assert_eq!(back, s);
    }
}
