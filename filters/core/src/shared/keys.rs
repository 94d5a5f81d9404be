//! Every shared-data key the filters use, in one registry: its name, the
//! filter it belongs to, how its value is encoded and what it starts as.
//!
//! Shared data has no delete and ignores CAS on a missing key (see
//! [`crate::shared::store`]), so every key that a stream or tick updates with
//! read-modify-write must exist before any stream runs: each filter creates
//! its keys from [`crate::initial::values`] in `on_configure`. Keys written whole
//! (never read-modify-written) have no initial value and are left absent
//! until written.
//!
//! A key whose [`Key::only_with`] names a config field is created only by
//! a filter configured with that field (graceful_consumer's `front`): an
//! Envoy that does not use the role keeps none of its memory.
//!
//! The names and encodings are documented in docs/design/shared-data.md and must not
//! change. Adding a key is one entry here (and in [`ALL`]) plus the test
//! that pins the exact set.

/// The filter a key belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    Provider,
    Drain,
    Consumer,
}

/// How a key's value is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// [`crate::drain::record::InstanceRecord::encode`].
    InstanceRecord,
    /// [`crate::consumer::tombstone::Tombstones::encode`].
    Tombstones,
    /// [`crate::consumer::steering::Membership::encode`].
    Membership,
    /// [`crate::consumer::steering::ClusterSet::encode`].
    ClusterSet,
    /// A u64, little-endian, 8 bytes (a counter, a generation or a lease's
    /// due time in µs).
    U64,
    /// One byte.
    U8,
    /// [`crate::drain::report::peers::PeerTable::encode`].
    PeerTable,
    /// [`crate::drain::report::durations::DurationRing::encode`].
    DurationRing,
    /// An instance id as text ([`crate::shared::instance::is_valid`]).
    InstanceId,
    /// [`crate::shared::instance::encode_identity`]: `<header name>\n<instance id>`.
    Identity,
    /// [`crate::consumer::front::FrontHosts::encode`].
    FrontHosts,
}

/// One shared-data key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    pub name: &'static str,
    pub owner: Owner,
    pub encoding: Encoding,
    /// The filters that create it at configure time (none: written whole,
    /// so it may stay absent).
    pub created_by: &'static [Owner],
    /// The config field without which the filters in `created_by` do not
    /// create it (None: they always do).
    pub only_with: Option<&'static str>,
}

const fn key(
    name: &'static str,
    owner: Owner,
    encoding: Encoding,
    created_by: &'static [Owner],
) -> Key {
    Key {
        name,
        owner,
        encoding,
        created_by,
        only_with: None,
    }
}

/// A key graceful_consumer creates only when `front` is configured.
const fn front_key(name: &'static str, encoding: Encoding) -> Key {
    Key {
        only_with: Some(FRONT_FIELD),
        ..key(name, Consumer, encoding, &[Consumer])
    }
}

/// graceful_consumer's config field that creates the front role's keys.
pub const FRONT_FIELD: &str = "front";

use Owner::{Consumer, Drain, Provider};

/// The instance record: phase and times (the counts are Envoy stats, see
/// [`crate::shared::gate`]). graceful_drain writes it; graceful_provider creates it
/// too, as either filter may be first to start.
pub const RECORD: Key = key(
    "graceful.v1.instance",
    Provider,
    Encoding::InstanceRecord,
    &[Provider, Drain],
);
/// The process's instance id, agreed at configure time.
pub const INSTANCE_ID: Key = key(
    "graceful.v1.instance_id",
    Provider,
    Encoding::InstanceId,
    &[],
);
/// The header name and id the provider stamps on responses, so
/// graceful_drain stamps its own answers too (consumers' probes read the
/// instance id from graceful_drain's readiness answer).
pub const IDENTITY: Key = key("graceful.v1.identity", Provider, Encoding::Identity, &[]);
/// Long-polls held across the process (bounded by `max_waiters`).
pub const WAITERS: Key = key("graceful.v1.drain.waiters", Drain, Encoding::U64, &[Drain]);
/// Lease: one VM copy per second polls the admin's `/ready`.
pub const ADMIN_LEASE: Key = key(
    "graceful.v1.drain.admin_lease",
    Drain,
    Encoding::U64,
    &[Drain],
);
/// The tombstone list.
pub const TOMBSTONES: Key = key(
    "graceful.v1.consumer.tombstones",
    Consumer,
    Encoding::Tombstones,
    &[Consumer],
);
/// Bumped on every change to [`TOMBSTONES`], so workers re-read the list
/// only when it changed.
pub const TOMBSTONES_GEN: Key = key(
    "graceful.v1.consumer.tombstones.gen",
    Consumer,
    Encoding::U64,
    &[Consumer],
);
/// The admin membership of the clusters routed to.
pub const MEMBERS: Key = key(
    "graceful.v1.consumer.members",
    Consumer,
    Encoding::Membership,
    &[Consumer],
);
/// Bumped on every change to [`MEMBERS`].
pub const MEMBERS_GEN: Key = key(
    "graceful.v1.consumer.members.gen",
    Consumer,
    Encoding::U64,
    &[Consumer],
);
/// The addresses that answered, per cluster, as all VM copies saw them
/// (the membership used without an admin cluster).
pub const OBSERVED: Key = key(
    "graceful.v1.consumer.observed",
    Consumer,
    Encoding::Membership,
    &[Consumer],
);
/// Bumped on every change to [`OBSERVED`].
pub const OBSERVED_GEN: Key = key(
    "graceful.v1.consumer.observed.gen",
    Consumer,
    Encoding::U64,
    &[Consumer],
);
/// The clusters routed to, so the membership refresh knows them before any
/// of their hosts is tombstoned.
pub const CLUSTERS: Key = key(
    "graceful.v1.consumer.clusters",
    Consumer,
    Encoding::ClusterSet,
    &[Consumer],
);
/// Lease: one VM copy per `membership_refresh` refreshes membership and
/// sends probes.
pub const REFRESH_LEASE: Key = key(
    "graceful.v1.consumer.refresh_lease",
    Consumer,
    Encoding::U64,
    &[Consumer],
);
/// Where membership is read from Envoy's admin: 1 once an answer showed
/// that this Envoy ignores `/clusters`'s filter (before 1.38), so every
/// copy reads the config dump; 0: `/clusters`
/// ([`crate::consumer::steering::AdminSource`]). Written whole, but created at
/// configure like every key a tick writes.
pub const ADMIN_SOURCE: Key = key(
    "graceful.v1.consumer.admin_source",
    Consumer,
    Encoding::U8,
    &[Consumer],
);
/// Why the gate passed ([`crate::drain::record::GatePass::to_byte`]: 1 quiet, 2
/// step timeout, 3 timeout), written whole by the copy whose write passed
/// it, for the report's `forced_by`. Written whole, but created at
/// configure like every key a tick writes.
pub const PASSED_BY: Key = key("graceful.v1.drain.passed_by", Drain, Encoding::U8, &[Drain]);
/// A hash of the last configuration notice graceful_drain logged
/// ([`crate::drain::config::DrainConfig::unreachable_timeout`]): every VM
/// copy configures, one logs each notice once per Envoy, and a config with
/// another notice logs again.
pub const CONFIG_NOTICE: Key = key(
    "graceful.v1.drain.config_notice",
    Drain,
    Encoding::U64,
    &[Drain],
);
/// Who sent requests after closing began ([`crate::drain::report::peers`]):
/// graceful_provider's copies merge into it on their ticks.
pub const REPORT_PEERS: Key = key(
    "graceful.v1.provider.report.peers",
    Provider,
    Encoding::PeerTable,
    &[Provider],
);
/// Recent request durations ([`crate::drain::report::durations`]).
pub const REPORT_DURATIONS: Key = key(
    "graceful.v1.provider.report.durations",
    Provider,
    Encoding::DurationRing,
    &[Provider],
);

/// The front role's host table (docs/design/front-proxy-drain.md §7).
pub const FRONT_HOSTS: Key = front_key("graceful.v1.front.hosts", Encoding::FrontHosts);
/// Bumped after every write of [`FRONT_HOSTS`]: a copy decodes the table
/// again only when it moved.
pub const FRONT_HOSTS_GEN: Key = front_key("graceful.v1.front.hosts.gen", Encoding::U64);
/// Lease: one VM copy per `front.poll` reads `rq_active` and the admin's
/// view of the closing hosts.
pub const FRONT_POLL_LEASE: Key = front_key("graceful.v1.front.poll_lease", Encoding::U64);
/// `drained?wait=` long-polls of the front held across the process
/// (bounded by `front.max_waiters`).
pub const FRONT_WAITERS: Key = front_key("graceful.v1.front.waiters", Encoding::U64);

/// Every key, in the order filters create them.
pub const ALL: &[Key] = &[
    RECORD,
    INSTANCE_ID,
    IDENTITY,
    WAITERS,
    ADMIN_LEASE,
    TOMBSTONES,
    TOMBSTONES_GEN,
    MEMBERS,
    MEMBERS_GEN,
    OBSERVED,
    OBSERVED_GEN,
    CLUSTERS,
    REFRESH_LEASE,
    ADMIN_SOURCE,
    PASSED_BY,
    CONFIG_NOTICE,
    REPORT_PEERS,
    REPORT_DURATIONS,
    FRONT_HOSTS,
    FRONT_HOSTS_GEN,
    FRONT_POLL_LEASE,
    FRONT_WAITERS,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_versioned() {
        for (i, k) in ALL.iter().enumerate() {
            assert!(k.name.starts_with("graceful.v1."), "{}", k.name);
            assert!(
                ALL[..i].iter().all(|other| other.name != k.name),
                "{} twice",
                k.name
            );
        }
    }

    #[test]
    fn only_the_front_keys_wait_for_their_field() {
        let front: Vec<&str> = ALL
            .iter()
            .filter(|k| k.only_with == Some(FRONT_FIELD))
            .map(|k| k.name)
            .collect();
        assert_eq!(
            front,
            [
                "graceful.v1.front.hosts",
                "graceful.v1.front.hosts.gen",
                "graceful.v1.front.poll_lease",
                "graceful.v1.front.waiters"
            ]
        );
        assert!(ALL
            .iter()
            .all(|k| k.only_with.is_none() || k.owner == Consumer));
    }
}
