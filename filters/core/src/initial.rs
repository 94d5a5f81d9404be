//! What each shared-data key starts as: the empty value of its encoding,
//! written by the filters that create it ([`crate::shared::keys::Key::created_by`])
//! before any stream runs. Kept apart from the key registry so that
//! [`crate::shared::keys`] depends on no codec while the codecs name their keys
//! there.

use crate::consumer::front::FrontHosts;
use crate::consumer::steering::{ClusterSet, Membership};
use crate::consumer::tombstone::Tombstones;
use crate::drain::record::InstanceRecord;
use crate::drain::report::durations::DurationRing;
use crate::drain::report::peers::PeerTable;
use crate::shared::keys::{Encoding, Key, Owner, ALL};

/// The value `key` starts from, which decodes as "nothing yet"; None for
/// keys written whole.
pub fn value(key: &Key) -> Option<Vec<u8>> {
    if key.created_by.is_empty() {
        return None;
    }
    Some(match key.encoding {
        Encoding::InstanceRecord => InstanceRecord::default().encode().to_vec(),
        Encoding::Tombstones => Tombstones::default().encode(),
        Encoding::Membership => Membership::default().encode(),
        Encoding::ClusterSet => ClusterSet::default().encode(),
        Encoding::U64 => 0u64.to_le_bytes().to_vec(),
        Encoding::U8 => vec![0],
        Encoding::PeerTable => PeerTable::default().encode(),
        Encoding::DurationRing => DurationRing::default().encode(),
        Encoding::FrontHosts => FrontHosts::default().encode(),
        Encoding::InstanceId | Encoding::Identity => return None,
    })
}

/// The keys `filter` always creates in `on_configure`, with their initial
/// values, for [`crate::shared::store::ensure_all`].
pub fn values(filter: Owner) -> Vec<(&'static str, Vec<u8>)> {
    values_with(filter, None)
}

/// The keys `filter` creates when configured with `field`
/// ([`crate::shared::keys::Key::only_with`]; None: those it always creates).
pub fn values_with(filter: Owner, field: Option<&str>) -> Vec<(&'static str, Vec<u8>)> {
    ALL.iter()
        .filter(|k| k.created_by.contains(&filter) && k.only_with == field)
        .filter_map(|k| Some((k.name, value(k)?)))
        .collect()
}

/// Creates the keys `filter` updates, before any stream runs (Envoy
/// ignores CAS on a missing key: two workers creating one at once would
/// both succeed and one change be lost; see [`crate::shared::store::ensure_all`]).
pub fn create_keys(
    h: &impl crate::shared::host::Host,
    filter: crate::shared::keys::Owner,
) -> Result<(), String> {
    create_keys_with(h, filter, None)
}

/// [`create_keys`] for the keys that config `field` needs.
pub fn create_keys_with(
    h: &impl crate::shared::host::Host,
    filter: crate::shared::keys::Owner,
    field: Option<&str>,
) -> Result<(), String> {
    crate::shared::store::ensure_all(h.store(), &values_with(filter, field))
        .map_err(|(key, e)| format!("cannot initialise shared data {key:?}: {e:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::keys::Owner::{Consumer, Drain, Provider};

    #[test]
    fn initial_values_decode_as_nothing_yet() {
        for k in ALL {
            let Some(v) = value(k) else { continue };
            let empty = match k.encoding {
                Encoding::InstanceRecord => {
                    InstanceRecord::decode(&v) == Some(InstanceRecord::default())
                }
                Encoding::Tombstones => Tombstones::decode(&v) == Some(Tombstones::default()),
                Encoding::Membership => Membership::decode(&v) == Some(Membership::default()),
                Encoding::ClusterSet => ClusterSet::decode(&v) == Some(ClusterSet::default()),
                Encoding::U64 => crate::shared::store::read_u64(&v) == Some(0),
                Encoding::U8 => v == [0],
                Encoding::PeerTable => PeerTable::decode(&v) == Some(PeerTable::default()),
                Encoding::DurationRing => DurationRing::decode(&v) == Some(DurationRing::default()),
                Encoding::FrontHosts => FrontHosts::decode(&v) == Some(FrontHosts::default()),
                Encoding::InstanceId | Encoding::Identity => false,
            };
            assert!(empty, "{}", k.name);
        }
    }

    #[test]
    fn each_filter_creates_what_its_streams_update() {
        let names = |f| -> Vec<&str> { values(f).into_iter().map(|(k, _)| k).collect() };
        assert_eq!(
            names(Provider),
            [
                "graceful.v1.instance",
                "graceful.v1.provider.report.peers",
                "graceful.v1.provider.report.durations"
            ]
        );
        assert_eq!(
            names(Drain),
            [
                "graceful.v1.instance",
                "graceful.v1.drain.waiters",
                "graceful.v1.drain.admin_lease",
                "graceful.v1.drain.passed_by",
                "graceful.v1.drain.config_notice"
            ]
        );
        assert_eq!(
            names(Consumer),
            [
                "graceful.v1.consumer.tombstones",
                "graceful.v1.consumer.tombstones.gen",
                "graceful.v1.consumer.members",
                "graceful.v1.consumer.members.gen",
                "graceful.v1.consumer.observed",
                "graceful.v1.consumer.observed.gen",
                "graceful.v1.consumer.clusters",
                "graceful.v1.consumer.refresh_lease",
                "graceful.v1.consumer.admin_source",
            ]
        );
        let front: Vec<&str> = values_with(Consumer, Some(crate::shared::keys::FRONT_FIELD))
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(
            front,
            [
                "graceful.v1.front.hosts",
                "graceful.v1.front.hosts.gen",
                "graceful.v1.front.poll_lease",
                "graceful.v1.front.waiters",
            ]
        );
        assert!(values_with(Drain, Some("front")).is_empty());
    }
}
