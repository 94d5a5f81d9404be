//! The consumer's periodic work, done by one VM copy per
//! `membership_refresh` (the lease [`keys::REFRESH_LEASE`]): refresh the
//! membership of the clusters routed to from Envoy's admin, and probe
//! tombstoned hosts for a new instance. The glue dispatches the [`Call`]s
//! and hands the answers back.

use std::time::Duration;

use super::{tombstone_gauges, Consumer, Effect, Level};
use crate::consumer::steering::{
    probe_observation, probe_targets, AdminSource, ClusterSet, Membership,
    CLUSTERS_UNANSWERED_TURN, MAX_ADMIN_BODY,
};
use crate::consumer::tombstone::Tombstones;
use crate::shared::duration::micros;
use crate::shared::headers;
use crate::shared::keys;
use crate::shared::store::{take_lease, SharedStore};

/// Timeout of every call the consumer makes (admin and probes).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// What a call is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallKind {
    /// Membership of these clusters from the admin, read as `source`.
    Admin {
        wanted: Vec<String>,
        source: AdminSource,
    },
    /// Readiness probe of a tombstoned address.
    Probe { address: String },
}

/// An HTTP call for the glue to dispatch (no body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub kind: CallKind,
    pub cluster: String,
    pub headers: Vec<(String, String)>,
    pub timeout: Duration,
}

impl Call {
    /// The headers as the hosts' call APIs take them.
    pub fn header_pairs(&self) -> Vec<(&str, &str)> {
        self.headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }

    /// The log line for a call the host refused to send.
    pub fn not_sent(&self, status: &str) -> Effect {
        match &self.kind {
            CallKind::Admin { .. } => Effect::Log(
                Level::Warn,
                format!(
                    "membership refresh from {:?} not sent: {status}",
                    self.cluster
                ),
            ),
            CallKind::Probe { address } => Effect::Log(
                Level::Debug,
                format!("probe of {address} not sent: {status}"),
            ),
        }
    }
}

impl Consumer {
    /// A tick: the copy that takes the lease refreshes membership and
    /// probes.
    pub fn tick(&mut self, store: &dyn SharedStore, now: u64) -> (Vec<Effect>, Vec<Call>) {
        let mut effects = Vec::new();
        let interval = micros(self.config.membership_refresh);
        let mut calls = Vec::new();
        if take_lease(store, keys::REFRESH_LEASE.name, now, interval).unwrap_or(false) {
            calls = self.refresh(store, now, &mut effects);
        }
        (effects, calls)
    }

    fn refresh(
        &mut self,
        store: &dyn SharedStore,
        now: u64,
        effects: &mut Vec<Effect>,
    ) -> Vec<Call> {
        // Not the request path: check the generation whatever the signal.
        self.tombstones.stale();
        self.refresh_tombstones(store);
        let tombstones = self.tombstones.value.clone();
        // Both gauges from every refresh, whichever instance wrote the list
        // (on Envoy 1.36 the upstream instance's own gauges are in the
        // cluster's stats scope).
        effects.extend(tombstone_gauges(&tombstones, now));
        let Some(admin) = &self.config.admin_cluster else {
            return self.probes(&tombstones, &Membership::default(), now);
        };
        // Membership of every cluster routed to, not only those with
        // tombstones: a new tombstone then steers from its first moment.
        // With an admin cluster, probes follow its answer, so they see the
        // membership as it is now (a restarted host is probed as soon as
        // the registry has it back).
        let mut clusters = store
            .get(keys::CLUSTERS.name)
            .ok()
            .flatten()
            .and_then(|(b, _)| ClusterSet::decode(&b))
            .unwrap_or_default();
        for t in tombstones.live(now) {
            clusters.insert(&t.cluster);
        }
        let names: Vec<&str> = clusters.names().collect();
        if self.admin_call.is_some() || names.is_empty() {
            return Vec::new();
        }
        let source = AdminSource::shared(store);
        vec![Call {
            kind: CallKind::Admin {
                wanted: names.iter().map(|n| n.to_string()).collect(),
                source,
            },
            cluster: admin.clone(),
            headers: vec![
                (headers::METHOD.into(), "GET".into()),
                (headers::PATH.into(), source.path(&names)),
                (headers::AUTHORITY.into(), headers::ADMIN_AUTHORITY.into()),
            ],
            timeout: CALL_TIMEOUT,
        }]
    }

    /// Probes of each live tombstone still in its cluster, except those
    /// already in flight.
    fn probes(&self, tombstones: &Tombstones, membership: &Membership, now: u64) -> Vec<Call> {
        let Some(probe_path) = &self.config.probe_path else {
            return Vec::new();
        };
        probe_targets(tombstones, membership, now)
            .into_iter()
            .filter(|t| !self.probes.values().any(|a| a == &t.address))
            .map(|t| Call {
                kind: CallKind::Probe {
                    address: t.address.clone(),
                },
                cluster: t.cluster.clone(),
                headers: vec![
                    (headers::METHOD.into(), "GET".into()),
                    (headers::PATH.into(), probe_path.clone()),
                    // The host's own address: a cluster name is no valid
                    // Host (Istio's `outbound|80||svc` has `|`, and the
                    // provider's sidecar answers such a probe 400).
                    (headers::AUTHORITY.into(), t.address.clone()),
                    (self.config.override_host_header.clone(), t.address.clone()),
                ],
                timeout: CALL_TIMEOUT,
            })
            .collect()
    }

    /// The host took `call` under `token`.
    pub fn sent(&mut self, token: u32, call: Call) {
        match call.kind {
            CallKind::Admin { wanted, source } => {
                self.admin_call = Some(token);
                self.admin_wanted = wanted;
                self.admin_source = source;
            }
            CallKind::Probe { address } => {
                self.probes.insert(token, address);
            }
        }
    }

    /// Which call `token` answers, forgetting it; None for a token this
    /// copy did not send.
    pub fn answer_for(&mut self, token: u32) -> Option<CallKind> {
        if self.admin_call == Some(token) {
            self.admin_call = None;
            return Some(CallKind::Admin {
                wanted: self.admin_wanted.clone(),
                source: self.admin_source,
            });
        }
        let address = self.probes.remove(&token)?;
        Some(CallKind::Probe { address })
    }

    /// Counts `/clusters` refreshes in a row with no answer in time (no
    /// `:status`: the call failed or timed out; or Envoy's 504 for a
    /// timeout) and, at [`CLUSTERS_UNANSWERED_TURN`], turns every copy to
    /// the config dump ([`AdminSource`]). Any answer resets the count.
    fn count_unanswered(
        &mut self,
        store: &dyn SharedStore,
        status: Option<&[u8]>,
        effects: &mut Vec<Effect>,
    ) {
        if !matches!(status, None | Some(b"504")) {
            self.clusters_unanswered = 0;
            return;
        }
        self.clusters_unanswered = self.clusters_unanswered.saturating_add(1);
        if self.clusters_unanswered == CLUSTERS_UNANSWERED_TURN
            && AdminSource::ConfigDump.share(store)
        {
            effects.push(Effect::Log(
                Level::Info,
                format!(
                    "/clusters gave no answer within {} s to {CLUSTERS_UNANSWERED_TURN} refreshes in a row (an Envoy before 1.38 answers it with every cluster, too slowly in a large mesh): membership is read from /config_dump from now on",
                    CALL_TIMEOUT.as_secs()
                ),
            ));
        }
    }

    /// The admin's answer for `wanted`, read as `source`: written to the
    /// shared membership when it changed, then the probes it allows.
    /// `body` is read only for a 200. An answer that shows `/clusters`'s
    /// filter ignored turns every copy to the config dump
    /// ([`AdminSource`]).
    pub fn admin_answered(
        &mut self,
        store: &dyn SharedStore,
        wanted: &[String],
        source: AdminSource,
        status: Option<&[u8]>,
        body: impl FnOnce() -> Vec<u8>,
        now: u64,
    ) -> (Vec<Effect>, Vec<Call>) {
        let tombstones = self.tombstones.value.clone();
        let mut effects = Vec::new();
        if source == AdminSource::Clusters {
            self.count_unanswered(store, status, &mut effects);
        }
        if status != Some(b"200") {
            // The config dump's refusals say why (its regex past the RE2
            // limit: see `steering::admin`); /clusters has none to tell.
            let why = match (source, status) {
                (AdminSource::ConfigDump, Some(_)) => {
                    let body = body();
                    let text = String::from_utf8_lossy(&body[..body.len().min(300)]);
                    format!(": {}", text.trim())
                }
                _ => String::new(),
            };
            effects.push(Effect::Log(
                Level::Warn,
                format!(
                    "membership refresh failed: status {:?}{why}",
                    status.map(|s| String::from_utf8_lossy(s).into_owned())
                ),
            ));
            let calls = self.probes(&tombstones, &self.members.value, now);
            return (effects, calls);
        }
        let body = body();
        let wanted: Vec<&str> = wanted.iter().map(String::as_str).collect();
        let answer = source.read(&body, &wanted);
        let ignored_filter = source == AdminSource::Clusters
            && match &answer {
                Ok(a) => a.unfiltered,
                Err(_) => body.len() >= MAX_ADMIN_BODY,
            };
        if ignored_filter && AdminSource::ConfigDump.share(store) {
            effects.push(Effect::Log(
                Level::Info,
                format!(
                    "this Envoy's /clusters ignores its filter (Envoy before 1.38): membership is read from /config_dump from now on ({} bytes answered)",
                    body.len()
                ),
            ));
        }
        let membership = match answer {
            Ok(answer) => {
                let m = answer.membership;
                // Written only when it changed: every change makes each
                // worker decode it again.
                self.members.stale();
                self.refresh_members(store);
                let changed = self.members.value != m;
                if changed && store.set(keys::MEMBERS.name, &m.encode(), 0).is_ok() {
                    effects.extend(self.bump(store, keys::MEMBERS_GEN.name));
                    self.members.stale();
                }
                m
            }
            Err(e) if !ignored_filter => {
                effects.push(Effect::Log(
                    Level::Warn,
                    format!("membership refresh: unreadable admin answer: {e}"),
                ));
                self.members.value.clone()
            }
            Err(_) => self.members.value.clone(),
        };
        let calls = self.probes(&tombstones, &membership, now);
        (effects, calls)
    }

    /// A probe's answer: `answered_at` is graceful_drain's address header,
    /// `instance` its instance header; `now` is read only if the answer
    /// says something.
    pub fn probe_answered(
        &mut self,
        store: &dyn SharedStore,
        address: &str,
        status: Option<&[u8]>,
        answered_at: Option<&[u8]>,
        instance: Option<Vec<u8>>,
        now: impl FnOnce() -> u64,
    ) -> Vec<Effect> {
        let instance = super::instance_id(instance);
        match probe_observation(address, status, answered_at, instance.as_deref()) {
            Some(obs) => self.apply(store, &obs, now()),
            None => Vec::new(),
        }
    }
}
