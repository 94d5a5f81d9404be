//! What a response (or a failed attempt) says about the host that sent it:
//! tombstone writes, readmissions, and the membership observed from answers.

use super::{
    Consumer, Effect, Exchange, Level, Part, Response, FLAG_UC, FLAG_UF, OBSERVE_EVERY,
    RECORD_EVERY_US,
};
use crate::consumer::steering::{ClusterSet, Membership, MAX_MEMBERS};
use crate::consumer::tombstone::{Cause, Change, Observation, Tombstones};
use crate::shared::keys;
use crate::shared::metrics::Metric;
use crate::shared::store::{update, SharedStore};

impl Consumer {
    /// What a response's headers or trailers (`seen`, scanned by
    /// [`Response::scan`]) say about the host that sent them.
    pub fn observe_response(
        &mut self,
        store: &dyn SharedStore,
        x: &mut dyn Exchange,
        seen: &Response,
        part: Part,
    ) -> Vec<Effect> {
        if seen.closing {
            let Some(address) = x.address() else {
                return Vec::new();
            };
            let cluster = x.cluster();
            let obs = Observation::Closing {
                cluster: &cluster,
                address: &address,
                instance: seen.instance.as_deref(),
            };
            let now = x.now();
            return self.apply(store, &obs, now);
        }
        // As an upstream filter only closing marks are observed: connect
        // failures end the attempt instead (`connect_failed`), and the
        // listener's instance sees the final answer.
        if part != Part::Headers || self.upstream {
            return Vec::new();
        }
        // A local 503 for a connect failure.
        if seen.status_503
            && self.config.evict_on_connect_failure
            && x.response_flags()
                .is_some_and(|f| f & (FLAG_UF | FLAG_UC) != 0)
        {
            let Some(address) = x.address() else {
                return Vec::new();
            };
            let cluster = x.cluster();
            let obs = Observation::ConnectFailure {
                cluster: &cluster,
                address: &address,
            };
            let now = x.now();
            return self.apply(store, &obs, now);
        }
        // While tombstones may be live every response is observed (the
        // address is read anyway), and asked whether it is a tombstoned host
        // answering with a new instance id: usually not (a steered request
        // went to a host that is not tombstoned), a lookup in the cached
        // list. An answer that can ask neither is taken as an ordinary one,
        // without the address or the clock (see `steered_answer_is_ordinary`).
        let live = !self.steered_answer_is_ordinary(store, x, seen) && self.may_be_live(x);
        if !(live || self.observes_membership(store)) {
            return Vec::new();
        }
        let Some(address) = x.address() else {
            return Vec::new();
        };
        let now = x.now();
        if !live && self.recorded_lately(&address, now) {
            return Vec::new();
        }
        // What answered is membership (used until the admin's is known, and
        // always without an admin cluster); the cluster goes in the shared
        // set the admin refresh reads.
        let cluster = x.cluster();
        let mut effects = self.answered(store, &cluster, &address, now);
        self.register_cluster(store, &cluster);
        if live && self.is_tombstoned(&address, now) {
            let obs = Observation::Answered {
                address: &address,
                instance: seen.instance.as_deref(),
            };
            // A new instance where the last resort sent this request: its
            // generation restarted (see `Tombstones::vouch`).
            let vouching = self
                .steers_last_resort(&cluster)
                .then_some(cluster.as_str());
            effects.extend(self.apply_vouching(store, &obs, now, vouching));
        }
        effects
    }

    /// While tombstones may be live, whether an answer can be taken as an
    /// ordinary one (observed only as often, and not looked up in the
    /// tombstones), which spares the steered path `upstream.address` and
    /// the clock. It can when both questions a live tombstone adds have
    /// their answer already:
    ///
    /// - readmission: an answer without a valid instance id readmits
    ///   nothing (`Observation::Answered` with no instance never changes a
    ///   tombstone, so it is never written);
    /// - membership: steering takes the route's cluster's members from the
    ///   admin's membership when it lists the cluster (`members`), so what
    ///   answered there does not shape the plan; observing it as often as
    ///   an ordinary answer keeps the observed set as fresh as without
    ///   tombstones, should the admin's view drop the cluster.
    ///
    /// Without an admin cluster (or before its membership lists the
    /// route's cluster) every answer stays an observation: sampling them
    /// piled each worker's traffic onto the one host it had seen.
    /// Costs nothing on the steered path: the cluster was read for the
    /// plan, once per stream.
    fn steered_answer_is_ordinary(
        &mut self,
        store: &dyn SharedStore,
        x: &mut dyn Exchange,
        seen: &Response,
    ) -> bool {
        if self.live_until == 0 || seen.instance.is_some() || self.config.admin_cluster.is_none() {
            return false;
        }
        self.refresh_members(store);
        self.members.value.cluster(&x.cluster()).is_some()
    }

    /// As an upstream filter, whether an attempt that ended is worth asking
    /// the host about: one that got no response headers may have failed to
    /// connect, even if a retry then succeeded.
    pub fn attempt_may_have_failed(&self, answered: bool) -> bool {
        self.upstream && !answered && self.config.evict_on_connect_failure
    }

    /// An attempt to `address` failed to connect (a transport failure
    /// reason and no response).
    pub fn connect_failed(
        &mut self,
        store: &dyn SharedStore,
        x: &mut dyn Exchange,
        address: &str,
    ) -> Vec<Effect> {
        let cluster = x.cluster();
        let obs = Observation::ConnectFailure {
            cluster: &cluster,
            address,
        };
        let now = x.now();
        self.apply(store, &obs, now)
    }

    /// Adds the route's cluster to the shared set the membership refresh
    /// reads, once per VM copy and cluster.
    pub(super) fn register_cluster(&mut self, store: &dyn SharedStore, cluster: &str) {
        if self.config.admin_cluster.is_none()
            || cluster.is_empty()
            || self.registered.iter().any(|c| c == cluster)
        {
            return;
        }
        let added = update(store, keys::CLUSTERS.name, |bytes| {
            let mut set = bytes.and_then(ClusterSet::decode).unwrap_or_default();
            let new = set.insert(cluster);
            (new.then(|| set.encode()), ())
        });
        if added.is_ok() {
            self.registered.push(cluster.to_string());
        }
    }

    /// Applies an observation to the shared tombstones. Reads the list's
    /// generation first (always: this is not the request path) so the
    /// common cases (an answer from a host that is not tombstoned, a
    /// closing mark already recorded) cost no write.
    pub(super) fn apply(
        &mut self,
        store: &dyn SharedStore,
        obs: &Observation,
        now: u64,
    ) -> Vec<Effect> {
        self.apply_vouching(store, obs, now, None)
    }

    /// [`Consumer::apply`]; with `vouching` (the cluster of a last resort
    /// that sent the request), a readmission of a host that said closing
    /// also puts the rest of that last resort on trial.
    pub(super) fn apply_vouching(
        &mut self,
        store: &dyn SharedStore,
        obs: &Observation,
        now: u64,
        vouching: Option<&str>,
    ) -> Vec<Effect> {
        let max = self.config.max_tombstones as usize;
        let before = self.tombstones.gen;
        self.tombstones.stale();
        self.refresh_tombstones(store);
        if !self.tombstones.value.worth_writing(obs, &self.ttls, now) {
            // Recorded already, by a write this copy had not read: most
            // often the upstream instance's, a moment ago on this very
            // response, whose bump may not reach this scope (see
            // `notice_unannounced`). One bump more, so this scope's other
            // copies steer from their next request.
            if !self.upstream && self.tombstones.gen != before {
                return self.announce();
            }
            return Vec::new();
        }
        let ttls = self.ttls;
        let result = update(store, keys::TOMBSTONES.name, |bytes| {
            let mut list = bytes.and_then(Tombstones::decode).unwrap_or_default();
            // When the host readmitted now last said closing, if it did.
            let said_closing = list
                .get_live(obs.address(), now)
                .filter(|t| t.cause == Cause::Closing)
                .map(|t| t.confirmed_us);
            let change = list.observe(obs, &ttls, now, max);
            let tried = match (vouching, said_closing) {
                (Some(cluster), Some(confirmed)) if change == Change::Readmitted => {
                    list.vouch(cluster, confirmed, now)
                }
                _ => 0,
            };
            let live = list.live_count(now);
            let value = (change != Change::Unchanged).then(|| list.encode());
            let size = value.as_ref().map_or(0, Vec::len);
            (value, (change, live, size, tried))
        });
        let (change, live, size, tried) = match result {
            Ok(r) => r,
            Err(e) => {
                return vec![Effect::Log(
                    Level::Warn,
                    format!("tombstones not updated: {e:?}"),
                )]
            }
        };
        if change == Change::Unchanged {
            return Vec::new();
        }
        let mut effects = self.bump(store, keys::TOMBSTONES_GEN.name);
        // This copy knows its own write at once (its next response may be a
        // readmission question): two reads, on a path as rare as writes.
        self.tombstones.stale();
        self.refresh_tombstones(store);
        effects.push(Effect::Set(Metric::ConsumerTombstones, live as u64));
        effects.push(Effect::Set(Metric::ConsumerTombstoneBytes, size as u64));
        let line = match (change, obs) {
            (
                Change::Evicted,
                Observation::Closing {
                    address, instance, ..
                },
            ) => Some((
                Metric::ConsumerEvictions,
                format!(
                    "tombstoned {address} (instance {}) for {:?}: closing mark",
                    instance.unwrap_or("unknown"),
                    self.ttls.closing
                ),
            )),
            (Change::Evicted, Observation::ConnectFailure { address, .. }) => Some((
                Metric::ConsumerEvictions,
                format!(
                    "tombstoned {address} for {:?}: connect failure",
                    self.ttls.failure
                ),
            )),
            (Change::Readmitted, Observation::Answered { address, instance }) => Some((
                Metric::ConsumerReadmitted,
                format!(
                    "readmitted {address}: new instance {}{}",
                    instance.unwrap_or("unknown"),
                    if tried > 0 {
                        format!(" (a last resort's answer: {tried} more of its hosts on trial)")
                    } else {
                        String::new()
                    }
                ),
            )),
            _ => None,
        };
        if let Some((counter, line)) = line {
            effects.push(Effect::Add(counter, 1));
            effects.push(Effect::Log(Level::Info, line));
        }
        effects
    }

    /// Whether this response is a membership observation: every one while
    /// steering would take membership from observations (no admin cluster,
    /// or none of its answers read yet), so the observed set holds every
    /// host the balancer picks; else one in [`OBSERVE_EVERY`], which only
    /// registers the route's cluster for the admin refresh.
    pub(super) fn observes_membership(&mut self, store: &dyn SharedStore) -> bool {
        let sampled = self.responses.is_multiple_of(OBSERVE_EVERY);
        self.responses = self.responses.wrapping_add(1);
        sampled || !self.admin_membership_known(store)
    }

    /// An admin cluster is configured and its membership has been read.
    pub(super) fn admin_membership_known(&mut self, store: &dyn SharedStore) -> bool {
        if self.config.admin_cluster.is_none() {
            return false;
        }
        self.refresh_members(store);
        !self.members.value.is_empty()
    }

    /// True when this copy recorded `address` answering less than
    /// [`RECORD_EVERY_US`] before `now`: an observation of a known host
    /// then skips the cluster read and the record (it costs the address
    /// and the clock).
    pub(super) fn recorded_lately(&mut self, address: &str, now: u64) -> bool {
        if let Some(at) = self.recorded.get_mut(address) {
            if now.saturating_sub(*at) < RECORD_EVERY_US {
                return true;
            }
            *at = now;
            return false;
        }
        if self.recorded.len() >= MAX_MEMBERS {
            self.recorded.clear();
        }
        self.recorded.insert(address.to_string(), now);
        false
    }

    /// True if `address` has a live tombstone in the cached list.
    pub(super) fn is_tombstoned(&self, address: &str, now: u64) -> bool {
        self.tombstones.value.get_live(address, now).is_some()
    }

    /// Notes that `address` answered; tells the other copies when the
    /// shared membership lacks it or last saw it over [`SEEN_REFRESH_US`]
    /// ago (writes are as rare as new hosts, and one per host per refresh).
    pub(super) fn answered(
        &mut self,
        store: &dyn SharedStore,
        cluster: &str,
        address: &str,
        now: u64,
    ) -> Vec<Effect> {
        self.observed.record(cluster, address, now);
        self.shared_observed.refresh(
            store,
            keys::OBSERVED_GEN.name,
            keys::OBSERVED.name,
            Membership::decode,
        );
        if self
            .shared_observed
            .value
            .seen_lately(cluster, address, now)
        {
            return Vec::new();
        }
        // The cached value is moved into the write, not copied (a copy of
        // every member's address on each write): it comes back written,
        // unchanged, or, where a lost race used it up, decoded again from
        // the bytes it was read from.
        let (value, own_bytes) = self.shared_observed.take();
        let mut own = Some(value);
        let written = update(store, keys::OBSERVED.name, |bytes| {
            // The stored bytes are most often those this copy last read or
            // wrote: then its cached value is theirs, not decoded again.
            let (mut m, is_own) = match (bytes, own.take()) {
                (Some(b), Some(v)) if own_bytes.as_deref() == Some(b) => (v, true),
                (other, v) => {
                    own = v;
                    let m = other.and_then(Membership::decode).unwrap_or_default();
                    (m, false)
                }
            };
            if !m.saw(cluster, address, now) {
                return (None, ObservedWrite::Unchanged(is_own.then_some(m)));
            }
            let encoded = m.encode();
            (Some(encoded.clone()), ObservedWrite::Wrote(m, encoded))
        });
        match written {
            Ok(ObservedWrite::Wrote(m, encoded)) => {
                // Checked again when steering next needs it (this copy's own
                // write does not make its signal move); what it finds then
                // is this write, unless another copy wrote since.
                self.shared_observed.wrote(m, encoded);
                return self.bump(store, keys::OBSERVED_GEN.name);
            }
            Ok(ObservedWrite::Unchanged(Some(m))) => self.shared_observed.put_back(m, own_bytes),
            _ => {
                let value = own.unwrap_or_else(|| {
                    own_bytes
                        .as_deref()
                        .and_then(Membership::decode)
                        .unwrap_or_default()
                });
                self.shared_observed.put_back(value, own_bytes);
            }
        }
        Vec::new()
    }
}

/// What a write of the shared observed membership did: wrote the value as
/// the bytes, or changed nothing (giving back the cached value it took,
/// if it took it).
enum ObservedWrite {
    Wrote(Membership, Vec<u8>),
    Unchanged(Option<Membership>),
}
