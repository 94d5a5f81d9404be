//! Probing tombstoned hosts for a new instance.

use super::Membership;
use crate::consumer::tombstone::{Cause, Observation, Tombstone, Tombstones};

/// Response header in which graceful_drain echoes the address (`ip:port`)
/// it was reached at.
pub const ADDRESS_HEADER: &str = crate::shared::headers::ADDRESS;
/// Most probes sent per refresh.
pub const MAX_PROBES: usize = 16;

/// Live tombstones worth probing: a cluster to send through, and, when the
/// cluster's membership is known, the address still a member (otherwise
/// override_host would send the probe elsewhere). Never an announced one:
/// no answer lifts it, and a probe would be a request sent to a host that
/// said it is closing.
pub fn probe_targets<'a>(
    tombstones: &'a Tombstones,
    membership: &Membership,
    now_us: u64,
) -> Vec<&'a Tombstone> {
    tombstones
        .live(now_us)
        .filter(|t| !t.cluster.is_empty() && t.cause != Cause::Announced)
        .filter(|t| {
            membership
                .cluster(&t.cluster)
                .is_none_or(|m| m.iter().any(|m| m.address == t.address))
        })
        .take(MAX_PROBES)
        .collect()
}

/// What a probe's answer says about the probed host: None unless it came
/// from the probed address and names an instance. 200 means that instance
/// serves; 503 that it is closing.
pub fn probe_observation<'a>(
    probed: &'a str,
    status: Option<&[u8]>,
    answered_at: Option<&[u8]>,
    instance: Option<&'a str>,
) -> Option<Observation<'a>> {
    if answered_at? != probed.as_bytes() {
        return None;
    }
    let instance = Some(instance?);
    match status? {
        b"200" => Some(Observation::Answered {
            address: probed,
            instance,
        }),
        b"503" => Some(Observation::Closing {
            cluster: "",
            address: probed,
            instance,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumer::steering::testing::{tombstoned, TTLS};
    use crate::consumer::tombstone::Change;

    #[test]
    fn probes_go_to_live_tombstones_still_in_the_cluster() {
        let t = tombstoned(&["a:1", "b:1"]);
        let none = Membership::default();
        assert_eq!(
            probe_targets(&t, &none, 0).len(),
            2,
            "unknown membership: probe all"
        );
        let m = Membership::from_admin_json(
            br#"{"cluster_statuses":[{"name":"svc","host_statuses":[{"address":{"socket_address":{"address":"127.0.0.1","port_value":1}}}]}]}"#,
            &["svc"],
        )
        .unwrap();
        assert!(
            probe_targets(&t, &m, 0).is_empty(),
            "neither address is a member"
        );
        assert!(probe_targets(&t, &none, 30_000_000).is_empty(), "expired");
    }

    #[test]
    fn announced_hosts_are_never_probed_and_a_probe_answer_does_not_lift_them() {
        let mut t = tombstoned(&["a:1"]);
        t.announce("svc", "b:1", 0, 120_000_000, 64);
        let none = Membership::default();
        let targets: Vec<&str> = probe_targets(&t, &none, 0)
            .iter()
            .map(|t| t.address.as_str())
            .collect();
        assert_eq!(targets, ["a:1"]);
        let answer = probe_observation("b:1", Some(b"200"), Some(b"b:1"), Some("new"));
        assert_eq!(t.observe(&answer.unwrap(), &TTLS, 1, 64), Change::Unchanged);
        assert!(t.get_live("b:1", 1).is_some());
    }

    #[test]
    fn probe_answers_count_only_from_the_probed_address() {
        let ok = probe_observation("a:1", Some(b"200"), Some(b"a:1"), Some("new"));
        assert_eq!(
            ok,
            Some(Observation::Answered {
                address: "a:1",
                instance: Some("new")
            })
        );
        assert_eq!(
            probe_observation("a:1", Some(b"200"), Some(b"b:1"), Some("new")),
            None,
            "fallback host answered"
        );
        assert_eq!(
            probe_observation("a:1", Some(b"200"), None, Some("new")),
            None
        );
        assert_eq!(
            probe_observation("a:1", Some(b"200"), Some(b"a:1"), None),
            None
        );
        assert_eq!(
            probe_observation("a:1", None, Some(b"a:1"), Some("new")),
            None,
            "no answer"
        );
        assert_eq!(
            probe_observation("a:1", Some(b"404"), Some(b"a:1"), Some("new")),
            None
        );
        let closing = probe_observation("a:1", Some(b"503"), Some(b"a:1"), Some("old"));
        assert!(matches!(closing, Some(Observation::Closing { .. })));
        let mut t = tombstoned(&["a:1"]);
        assert_eq!(t.observe(&ok.unwrap(), &TTLS, 1, 64), Change::Readmitted);
    }
}
