//! Pins the exact set of shared-data keys: their names and encodings are
//! documented in docs/design/shared-data.md and read by other copies of the filters, so a
//! change here is a deliberate one (adding a key: its registry entry in
//! `keys.rs` and a row here).

use graceful_core::shared::keys::{Encoding, Owner, ALL};

#[test]
fn the_registry_holds_exactly_the_documented_keys() {
    use Encoding::*;
    use Owner::*;
    let want: &[(&str, Owner, Encoding, &[Owner])] = &[
        (
            "graceful.v1.instance",
            Provider,
            InstanceRecord,
            &[Provider, Drain],
        ),
        ("graceful.v1.instance_id", Provider, InstanceId, &[]),
        ("graceful.v1.identity", Provider, Identity, &[]),
        ("graceful.v1.drain.waiters", Drain, U64, &[Drain]),
        ("graceful.v1.drain.admin_lease", Drain, U64, &[Drain]),
        (
            "graceful.v1.consumer.tombstones",
            Consumer,
            Tombstones,
            &[Consumer],
        ),
        (
            "graceful.v1.consumer.tombstones.gen",
            Consumer,
            U64,
            &[Consumer],
        ),
        (
            "graceful.v1.consumer.members",
            Consumer,
            Membership,
            &[Consumer],
        ),
        (
            "graceful.v1.consumer.members.gen",
            Consumer,
            U64,
            &[Consumer],
        ),
        (
            "graceful.v1.consumer.observed",
            Consumer,
            Membership,
            &[Consumer],
        ),
        (
            "graceful.v1.consumer.observed.gen",
            Consumer,
            U64,
            &[Consumer],
        ),
        (
            "graceful.v1.consumer.clusters",
            Consumer,
            ClusterSet,
            &[Consumer],
        ),
        (
            "graceful.v1.consumer.refresh_lease",
            Consumer,
            U64,
            &[Consumer],
        ),
        (
            "graceful.v1.consumer.admin_source",
            Consumer,
            U8,
            &[Consumer],
        ),
        ("graceful.v1.drain.passed_by", Drain, U8, &[Drain]),
        ("graceful.v1.drain.config_notice", Drain, U64, &[Drain]),
        (
            "graceful.v1.provider.report.peers",
            Provider,
            PeerTable,
            &[Provider],
        ),
        (
            "graceful.v1.provider.report.durations",
            Provider,
            DurationRing,
            &[Provider],
        ),
        // Created only with graceful_consumer's `front` (Key::only_with).
        ("graceful.v1.front.hosts", Consumer, FrontHosts, &[Consumer]),
        ("graceful.v1.front.hosts.gen", Consumer, U64, &[Consumer]),
        ("graceful.v1.front.poll_lease", Consumer, U64, &[Consumer]),
        ("graceful.v1.front.waiters", Consumer, U64, &[Consumer]),
    ];
    let got: Vec<(&str, Owner, Encoding, &[Owner])> = ALL
        .iter()
        .map(|k| (k.name, k.owner, k.encoding, k.created_by))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn initial_values_are_the_documented_bytes() {
    let initial: Vec<(&str, Option<Vec<u8>>)> = ALL
        .iter()
        .map(|k| (k.name, graceful_core::initial::value(k)))
        .collect();
    let zero = Some(vec![0u8; 8]);
    for (name, value) in initial {
        let want = match name {
            // phase serving, times and count zero: 40 bytes (docs/design/shared-data.md).
            "graceful.v1.instance" => Some(graceful_core::drain::record::initial().1),
            "graceful.v1.instance_id" | "graceful.v1.identity" => None,
            "graceful.v1.consumer.admin_source" | "graceful.v1.drain.passed_by" => Some(vec![0]),
            // version 2; requests, last start, untracked drops, refused
            // late 0; no peers, no hashes.
            "graceful.v1.provider.report.peers" => {
                let mut v = vec![2];
                v.extend([0u8; 32 + 2 + 2]);
                Some(v)
            }
            // version 2; next 0, max after closing 0, longest 0, no
            // samples.
            "graceful.v1.provider.report.durations" => {
                Some(vec![2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
            }
            "graceful.v1.consumer.tombstones" => Some(vec![1, 0, 0, 0, 0]),
            "graceful.v1.consumer.members" | "graceful.v1.consumer.observed" => Some(vec![3, 0, 0]),
            "graceful.v1.consumer.clusters" => Some(vec![1]),
            // version 1, no hosts.
            "graceful.v1.front.hosts" => Some(vec![1, 0, 0]),
            _ => zero.clone(),
        };
        assert_eq!(value, want, "{name}");
    }
    assert_eq!(graceful_core::drain::record::initial().1.len(), 40);
}
