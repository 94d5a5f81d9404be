//! Tombstones: upstream hosts a consumer must not send new requests to, for
//! a while, whatever the registry says. All of a process's tombstones live
//! in one shared-data value ([`TOMBSTONES`](crate::shared::keys::TOMBSTONES)): shared data has no delete,
//! so per-host keys would grow without bound under host churn, while one
//! value holding at most `max_tombstones` entries stays bounded.
//!
//! # Transition table (per address)
//!
//! "Written" is what reaches shared data: [`Tombstones::worth_writing`]
//! reads the cached list first and skips the write when the observation
//! could not change anything, or when a repeated mark would only add less
//! than [`EXTEND_GRANULARITY_US`] (1 s) of life (otherwise every marked
//! response of a closing host would be a write).
//!
//! Each entry stores when its cause was last confirmed ("confirmed"
//! below): the last closing mark written for a closing tombstone, the last
//! refusal written for a connect-failure one. Steering orders tombstones by
//! it ([`crate::consumer::steering::plan()`]); it is stored, not estimated
//! from the expiry, because a refusal extends a closing host's expiry by
//! the failure TTL without confirming that it is closing.
//!
//! | tombstone for the address | observation                        | result                                       | written |
//! |---------------------------|------------------------------------|----------------------------------------------|---------|
//! | none or expired           | closing (instance I or unknown)    | new: expires now + ttl, confirmed now (evicted) | yes  |
//! | none or expired           | connect failure                    | new: expires now + failure ttl, confirmed now (evicted) | yes |
//! | none or expired           | answered                           | none                                         | no      |
//! | live, instance I          | closing, instance I or unknown     | expiry pushed to now + ttl if later, confirmed now | if ≥ 1 s later |
//! | live, instance I          | closing, instance J ≠ I            | replaced by J's, now + ttl, confirmed now, off trial (evicted) | yes |
//! | live, connect failure     | closing (instance I or unknown)    | cause closing, instance learned, confirmed now, expiry as above (extended) | yes |
//! | live, on trial            | closing (instance I or unknown)    | off trial, confirmed now, expiry as above (extended) | yes |
//! | live, connect failure     | connect failure                    | expiry pushed to now + failure ttl if later, confirmed now | if ≥ 1 s later |
//! | live, closing             | connect failure                    | expiry pushed to now + failure ttl if later; confirmed kept (a refusal says nothing of closing) | if ≥ 1 s later |
//! | live, instance I          | answered by instance J ≠ I         | removed (readmitted: a new instance)         | yes     |
//! | live, instance unknown    | answered by any instance           | removed (readmitted: it answers again)       | yes     |
//! | live, instance I          | answered by I, or without an id    | kept                                         | no      |
//!
//! # Announced tombstones (the front-proxy role)
//!
//! A host with no sidecar tells a front Envoy it is closing
//! ([`Tombstones::announce`], docs/design/front-proxy-drain.md §2). Such a
//! host answers without an instance id while it drains, so no answer may
//! lift its tombstone: only the host's own `serving`
//! ([`Tombstones::lift_announced`]) or the expiry does.
//!
//! | tombstone for the address | event                              | result                                       | written |
//! |---------------------------|------------------------------------|----------------------------------------------|---------|
//! | none or expired           | announced until U                  | new: cause announced, expires U, confirmed now (evicted) | yes |
//! | live, closing or connect failure | announced until U           | cause announced, off trial, expires at the later of its own and U, confirmed now (extended) | yes |
//! | live, announced           | announced until U                  | expiry pushed to U if later, confirmed now   | if ≥ 1 s later |
//! | live, announced           | closing (any instance, or unknown) | cause kept; expiry pushed to now + ttl if later, confirmed now | if ≥ 1 s later |
//! | live, announced           | connect failure                    | cause kept; expiry pushed to now + failure ttl if later; confirmed kept | if ≥ 1 s later |
//! | live, announced           | answered (any instance, new or not, or without an id; a probe's answer too) | kept | no |
//! | live, announced           | lifted (`serving`)                 | removed                                      | yes     |
//! | live, closing or connect failure | lifted                      | kept (only announced tombstones are lifted)  | no      |
//!
//! An announced tombstone is never probed ([`crate::consumer::steering::probe_targets`]:
//! nothing a probe answers could lift it) and never put on trial
//! ([`Tombstones::vouch`] takes closing tombstones only; the panic floor
//! only refused ones).
//!
//! After every change, expired entries are dropped, and if more than
//! `max_tombstones` remain, those expiring first are dropped.
//!
//! # Trials of a restarted generation ([`Tombstones::vouch`])
//!
//! With no acceptable host in a cluster, steering lists every tombstoned
//! member but those confirmed last (the last resort). When one of them that
//! said closing answers as a new instance, its generation restarted, and
//! it took at most `span` (its last closing mark to that answer) to come
//! back: every other closing tombstone of the cluster confirmed before the
//! newest (the rest of what the last resort listed) goes on trial from its
//! own confirmation + `span` (at once if that has passed), so a host is
//! tried no sooner after its last mark than its sibling took to restart.
//! Steering tries a host on trial first in an override list of its own,
//! acceptable hosts after it, until it answers.
//!
//! | tombstone of the cluster, when a last resort's answer readmits `r` (a host that said closing) | result |
//! |---|---|
//! | live, closing, confirmed before the cluster's newest | on trial from max(now, confirmed + now − r's confirmed) |
//! | live, closing, confirmed with the newest | unchanged (it just said closing) |
//! | live, connect failure, or on trial already | unchanged (the panic floor tries refused ones) |
//!
//! A trial ends with the host's next answer: a new instance readmits it, a
//! closing mark takes it off trial (confirmed now, so it is the newest); a
//! refusal leaves it on trial (whatever answered closing there has exited).
//!
//! # Warming (with `readmit_slow_start`)
//!
//! A readmission then leaves a [`Warming`] entry beside the tombstones: the
//! host is no longer tombstoned, and steering ramps its share over the
//! window ([`crate::consumer::steering::plan()`]).
//!
//! | warming entry for the address | observation | result |
//! |---|---|---|
//! | none | a tombstone removed by a new instance's answer | new: since now, until now + window |
//! | live | closing or connect failure (a new tombstone) | removed: the tombstone stands |
//! | live | answered | kept |
//! | past its end | any | dropped at the next change |

use std::time::Duration;

use crate::shared::duration::micros;

/// A repeated closing mark or connect failure extends a live tombstone in
/// shared data only when that adds at least this much life (µs).
pub const EXTEND_GRANULARITY_US: u64 = 1_000_000;

/// The list's layout: version 1 holds only the empty list (what every build
/// reads and writes for none), version 2 every other.
const VERSION_EMPTY: u8 = 1;
const VERSION: u8 = 2;
/// Bit of an entry's cause byte: on trial (its start follows, u64 LE).
const TRIAL_BIT: u8 = 0x80;
/// Bounds on stored strings: an `ip:port`, an instance id, a cluster name.
const MAX_ADDRESS: usize = 64;
const MAX_INSTANCE: usize = 128;
const MAX_CLUSTER: usize = 255;

/// Why a host was tombstoned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// It answered with a closing mark.
    Closing,
    /// Connecting to it failed, or the connection dropped before a response.
    ConnectFailure,
    /// The host told this front Envoy it is closing (the front-proxy role):
    /// no answer lifts it, only [`Tombstones::lift_announced`] or expiry.
    Announced,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tombstone {
    /// `ip:port`, as Envoy's `upstream.address` and override_host spell it.
    pub address: String,
    /// The cluster the host was reached through (for probes).
    pub cluster: String,
    /// The instance id that announced closing; empty if unknown.
    pub instance: String,
    /// µs on the host's monotonic clock.
    pub expires_us: u64,
    /// When `cause` was last confirmed (µs, same clock): the last closing
    /// mark written, or the last refusal for a connect failure.
    pub confirmed_us: u64,
    pub cause: Cause,
    /// On trial from this time (µs): a last resort that listed it
    /// readmitted another host of its cluster, and steering tries it from
    /// then until it answers ([`Tombstones::vouch`]).
    pub trial: Option<u64>,
}

/// What a response (or a failed attempt) said about a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observation<'a> {
    Closing {
        cluster: &'a str,
        address: &'a str,
        instance: Option<&'a str>,
    },
    ConnectFailure {
        cluster: &'a str,
        address: &'a str,
    },
    Answered {
        address: &'a str,
        instance: Option<&'a str>,
    },
}

impl Observation<'_> {
    /// The host it is about.
    pub fn address(&self) -> &str {
        match self {
            Observation::Closing { address, .. }
            | Observation::ConnectFailure { address, .. }
            | Observation::Answered { address, .. } => address,
        }
    }
}

/// What an observation changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Unchanged,
    /// A new tombstone (a host newly evicted).
    Evicted,
    /// An existing tombstone now lasts longer, or learned the closing
    /// instance (a connect-failure tombstone that then answered closing).
    Extended,
    /// A tombstone was removed because a new instance answered.
    Readmitted,
}

/// How long new entries live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ttls {
    pub closing: Duration,
    pub failure: Duration,
    /// A readmitted host's slow-start window; None: readmission leaves no
    /// warming entry.
    pub warming: Option<Duration>,
}

/// A readmitted host whose share is still ramping up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warming {
    pub address: String,
    /// The cluster its tombstone was written for.
    pub cluster: String,
    /// When it was readmitted (µs on the host's monotonic clock).
    pub since_us: u64,
    /// When its window ends.
    pub until_us: u64,
}

/// Truncates to `max` bytes on a char boundary (inputs come from the
/// network and must not grow the shared value without bound).
fn bounded(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// The tombstone list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tombstones {
    entries: Vec<Tombstone>,
    /// Readmitted hosts still ramping up (none without
    /// `readmit_slow_start`); never an address with a live tombstone.
    warming: Vec<Warming>,
}

impl Tombstones {
    pub fn entries(&self) -> &[Tombstone] {
        &self.entries
    }

    /// Warming entries whose window has not ended at `now_us`.
    pub fn warming(&self, now_us: u64) -> impl Iterator<Item = &Warming> {
        self.warming.iter().filter(move |w| w.until_us > now_us)
    }

    /// The latest end of any entry, tombstone or warming (0 with none):
    /// until then steering may have something to do.
    pub fn latest_end(&self) -> u64 {
        let tombstones = self.entries.iter().map(|t| t.expires_us);
        let warming = self.warming.iter().map(|w| w.until_us);
        tombstones.chain(warming).max().unwrap_or(0)
    }

    /// The latest expiry of an announced tombstone (0: none).
    pub fn announced_end(&self) -> u64 {
        self.entries
            .iter()
            .filter(|t| t.cause == Cause::Announced)
            .map(|t| t.expires_us)
            .max()
            .unwrap_or(0)
    }

    /// Live tombstones at `now_us`.
    pub fn live(&self, now_us: u64) -> impl Iterator<Item = &Tombstone> {
        self.entries.iter().filter(move |t| t.expires_us > now_us)
    }

    pub fn live_count(&self, now_us: u64) -> usize {
        self.live(now_us).count()
    }

    /// The live tombstone for `address`, if any.
    pub fn get_live(&self, address: &str, now_us: u64) -> Option<&Tombstone> {
        self.live(now_us).find(|t| t.address == address)
    }

    /// False when applying `obs` could not change anything worth a write
    /// (the module table's "written" column): checked on the cached list
    /// before the read-modify-write, so the common cases (an answer from a
    /// host that is not tombstoned, a closing mark already recorded) cost
    /// none.
    pub fn worth_writing(&self, obs: &Observation, ttls: &Ttls, now_us: u64) -> bool {
        // Only an extension by at least this much is written.
        let extends = |t: &Tombstone, ttl: Duration| {
            now_us.saturating_add(micros(ttl)) > t.expires_us.saturating_add(EXTEND_GRANULARITY_US)
        };
        match obs {
            Observation::Answered { address, instance } => {
                self.get_live(address, now_us).is_some_and(|t| {
                    t.cause != Cause::Announced
                        && instance.is_some_and(|i| t.instance.is_empty() || t.instance != i)
                })
            }
            Observation::Closing { address, .. }
                if self
                    .get_live(address, now_us)
                    .is_some_and(|t| t.cause == Cause::Announced) =>
            {
                // The cause stays announced: only more life is news.
                self.get_live(address, now_us)
                    .is_some_and(|t| extends(t, ttls.closing))
            }
            Observation::Closing {
                address, instance, ..
            } => self.get_live(address, now_us).is_none_or(|t| {
                // A closing mark on a connect-failure tombstone changes its
                // cause; on a host on trial, it ends the trial.
                let new_instance =
                    instance.is_some_and(|i| t.instance != i) || t.cause != Cause::Closing;
                new_instance || t.trial.is_some() || extends(t, ttls.closing)
            }),
            Observation::ConnectFailure { address, .. } => self
                .get_live(address, now_us)
                .is_none_or(|t| extends(t, ttls.failure)),
        }
    }

    /// Applies an observation (see the module's table); `max` bounds the
    /// number of entries kept.
    pub fn observe(&mut self, obs: &Observation, ttls: &Ttls, now_us: u64, max: usize) -> Change {
        let address = obs.address();
        let live = self
            .entries
            .iter()
            .position(|t| t.address == address && t.expires_us > now_us);
        let change = match (live, obs) {
            (None, Observation::Answered { .. }) => Change::Unchanged,
            (
                None,
                Observation::Closing {
                    cluster, instance, ..
                },
            ) => {
                self.entries.retain(|t| t.address != address);
                self.warming.retain(|w| w.address != address);
                self.entries.push(Tombstone {
                    address: bounded(address, MAX_ADDRESS),
                    cluster: bounded(cluster, MAX_CLUSTER),
                    instance: bounded(instance.unwrap_or(""), MAX_INSTANCE),
                    expires_us: now_us.saturating_add(micros(ttls.closing)),
                    confirmed_us: now_us,
                    cause: Cause::Closing,
                    trial: None,
                });
                Change::Evicted
            }
            (None, Observation::ConnectFailure { cluster, .. }) => {
                self.entries.retain(|t| t.address != address);
                self.warming.retain(|w| w.address != address);
                self.entries.push(Tombstone {
                    address: bounded(address, MAX_ADDRESS),
                    cluster: bounded(cluster, MAX_CLUSTER),
                    instance: String::new(),
                    expires_us: now_us.saturating_add(micros(ttls.failure)),
                    confirmed_us: now_us,
                    cause: Cause::ConnectFailure,
                    trial: None,
                });
                Change::Evicted
            }
            (Some(i), obs) => self.observe_live(i, obs, ttls, now_us),
        };
        if change != Change::Unchanged {
            self.compact(now_us, max);
        }
        change
    }

    /// [`Tombstones::observe`] for an address with a live tombstone, the
    /// `i`-th entry (the module's tables: every row but "none or expired").
    fn observe_live(&mut self, i: usize, obs: &Observation, ttls: &Ttls, now_us: u64) -> Change {
        let Some(t) = self.entries.get_mut(i) else {
            return Change::Unchanged;
        };
        match obs {
            // An announced tombstone keeps its cause whatever the
            // host answers; a mark confirms it and may extend it.
            Observation::Closing { .. } if t.cause == Cause::Announced => {
                let change = extend(t, now_us.saturating_add(micros(ttls.closing)));
                if change != Change::Unchanged {
                    t.confirmed_us = now_us;
                }
                change
            }
            Observation::Answered { .. } if t.cause == Cause::Announced => Change::Unchanged,
            Observation::Closing {
                instance: Some(j), ..
            } if !t.instance.is_empty() && t.instance != *j => {
                t.instance = bounded(j, MAX_INSTANCE);
                t.expires_us = now_us.saturating_add(micros(ttls.closing));
                t.confirmed_us = now_us;
                t.cause = Cause::Closing;
                t.trial = None;
                Change::Evicted
            }
            Observation::Closing { instance, .. } => {
                // Learning the instance or that the host is closing
                // (not just unreachable), or ending a trial, is a
                // change worth storing even when the expiry stays.
                let mut learned = t.cause != Cause::Closing || t.trial.is_some();
                if t.instance.is_empty() {
                    t.instance = bounded(instance.unwrap_or(""), MAX_INSTANCE);
                    learned |= !t.instance.is_empty();
                }
                t.cause = Cause::Closing;
                t.trial = None;
                let change = match extend(t, now_us.saturating_add(micros(ttls.closing))) {
                    Change::Unchanged if learned => Change::Extended,
                    change => change,
                };
                if change != Change::Unchanged {
                    t.confirmed_us = now_us;
                }
                change
            }
            Observation::ConnectFailure { .. } => {
                let change = extend(t, now_us.saturating_add(micros(ttls.failure)));
                // A refusal confirms a refusal, not a closing mark.
                if change != Change::Unchanged && t.cause == Cause::ConnectFailure {
                    t.confirmed_us = now_us;
                }
                change
            }
            Observation::Answered { instance, .. } => {
                let new_instance = match instance {
                    Some(j) => t.instance.is_empty() || t.instance != *j,
                    None => false,
                };
                if new_instance {
                    let t = self.entries.remove(i);
                    if let Some(window) = ttls.warming {
                        self.warming.retain(|w| w.address != t.address);
                        self.warming.push(Warming {
                            since_us: now_us,
                            until_us: now_us.saturating_add(micros(window)),
                            address: t.address,
                            cluster: t.cluster,
                        });
                    }
                    Change::Readmitted
                } else {
                    Change::Unchanged
                }
            }
        }
    }

    /// A last resort of `cluster` (no acceptable host) had a host that said
    /// closing, last confirmed at `readmitted_confirmed_us`, answer as a
    /// new instance at `now_us`: puts on trial every other live closing
    /// tombstone of the cluster confirmed before its newest (what that last
    /// resort listed beside it), each from its own confirmation plus the
    /// time that host took to come back. Returns how many went on trial
    /// (0: nothing changed). See the module's table.
    pub fn vouch(&mut self, cluster: &str, readmitted_confirmed_us: u64, now_us: u64) -> usize {
        let of_cluster = |t: &&Tombstone| t.cluster == cluster && t.expires_us > now_us;
        let Some(newest) = self
            .entries
            .iter()
            .filter(of_cluster)
            .map(|t| t.confirmed_us)
            .max()
        else {
            return 0;
        };
        let span = now_us.saturating_sub(readmitted_confirmed_us);
        let mut put = 0;
        for t in &mut self.entries {
            if t.cluster == cluster
                && t.expires_us > now_us
                && t.cause == Cause::Closing
                && t.confirmed_us < newest
                && t.trial.is_none()
            {
                t.trial = Some(t.confirmed_us.saturating_add(span).max(now_us));
                put += 1;
            }
        }
        put
    }

    /// The host at `address` (reached through `cluster`) told this front
    /// it is closing: tombstones it with the announced cause until
    /// `until_us` (see the module's announced table); `max` bounds the
    /// entries kept. [`Change::Unchanged`]: nothing worth a write.
    pub fn announce(
        &mut self,
        cluster: &str,
        address: &str,
        now_us: u64,
        until_us: u64,
        max: usize,
    ) -> Change {
        let live = self
            .entries
            .iter_mut()
            .find(|t| t.address == address && t.expires_us > now_us);
        let change = match live {
            None => {
                self.entries.retain(|t| t.address != address);
                self.warming.retain(|w| w.address != address);
                self.entries.push(Tombstone {
                    address: bounded(address, MAX_ADDRESS),
                    cluster: bounded(cluster, MAX_CLUSTER),
                    instance: String::new(),
                    expires_us: until_us,
                    confirmed_us: now_us,
                    cause: Cause::Announced,
                    trial: None,
                });
                Change::Evicted
            }
            Some(t) if t.cause == Cause::Announced => {
                if until_us > t.expires_us.saturating_add(EXTEND_GRANULARITY_US) {
                    t.expires_us = until_us;
                    t.confirmed_us = now_us;
                    Change::Extended
                } else {
                    Change::Unchanged
                }
            }
            Some(t) => {
                // What the host said of itself outranks a mark or a refusal:
                // from now on no answer lifts it.
                t.cause = Cause::Announced;
                t.trial = None;
                t.expires_us = t.expires_us.max(until_us);
                t.confirmed_us = now_us;
                Change::Extended
            }
        };
        if change != Change::Unchanged {
            self.compact(now_us, max);
        }
        change
    }

    /// Removes the live announced tombstones whose address `is_lifted`
    /// accepts (the host said `serving`, or came back); tombstones of other
    /// causes stay. Returns how many were removed (0: nothing to write).
    pub fn lift_announced(&mut self, now_us: u64, is_lifted: impl Fn(&str) -> bool) -> usize {
        let before = self.entries.len();
        self.entries.retain(|t| {
            !(t.cause == Cause::Announced && t.expires_us > now_us && is_lifted(&t.address))
        });
        let lifted = before - self.entries.len();
        if lifted > 0 {
            // As after every change: what expired goes (nothing is over max).
            self.compact(now_us, usize::MAX);
        }
        lifted
    }

    /// Drops expired entries, then the earliest-expiring ones beyond `max`
    /// (tombstones and warming entries bounded apart: `max` each).
    pub fn compact(&mut self, now_us: u64, max: usize) {
        self.entries.retain(|t| t.expires_us > now_us);
        if self.entries.len() > max {
            self.entries
                .sort_by_key(|t| std::cmp::Reverse(t.expires_us));
            self.entries.truncate(max);
        }
        self.warming.retain(|w| w.until_us > now_us);
        if self.warming.len() > max {
            self.warming.sort_by_key(|w| std::cmp::Reverse(w.until_us));
            self.warming.truncate(max);
        }
    }

    /// Layout: version u8 (2), count u32 LE, then per entry: expires_us and
    /// confirmed_us (u64 LE), the cause u8 (1 closing, 2 connect failure,
    /// 3 announced; bit 0x80 set: on trial, from the u64 LE that follows), then
    /// address, instance (u8 length +
    /// bytes each) and cluster (u8 length + bytes). Then, only if there
    /// are warming entries: their count u32 LE, and per entry since_us and
    /// until_us (u64 LE), address and cluster (u8 length + bytes). The
    /// empty list is version 1's `[1, 0, 0, 0, 0]`, as every build writes
    /// it. A build from before version 2 reads any other list as
    /// unreadable (and keeps its cached one), as a build from before
    /// `readmit_slow_start` reads one with warming entries, and one from
    /// before the announced cause one holding an announced tombstone (the
    /// layout is otherwise the same, so the version stays 2: every copy in
    /// one Envoy runs one build, and an older one would read either form
    /// as unreadable alike).
    pub fn encode(&self) -> Vec<u8> {
        if self.entries.is_empty() && self.warming.is_empty() {
            return vec![VERSION_EMPTY, 0, 0, 0, 0];
        }
        let mut out = Vec::with_capacity(5 + self.entries.len() * 56);
        out.push(VERSION);
        out.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for t in &self.entries {
            out.extend_from_slice(&t.expires_us.to_le_bytes());
            out.extend_from_slice(&t.confirmed_us.to_le_bytes());
            let cause = match t.cause {
                Cause::Closing => 1,
                Cause::ConnectFailure => 2,
                Cause::Announced => 3,
            };
            match t.trial {
                Some(from) => {
                    out.push(cause | TRIAL_BIT);
                    out.extend_from_slice(&from.to_le_bytes());
                }
                None => out.push(cause),
            }
            for s in [&t.address, &t.instance, &t.cluster] {
                // Lengths are bounded at insertion, well under 256.
                out.push(s.len() as u8);
                out.extend_from_slice(s.as_bytes());
            }
        }
        if !self.warming.is_empty() {
            out.extend_from_slice(&(self.warming.len() as u32).to_le_bytes());
            for w in &self.warming {
                out.extend_from_slice(&w.since_us.to_le_bytes());
                out.extend_from_slice(&w.until_us.to_le_bytes());
                for s in [&w.address, &w.cluster] {
                    // Taken from a tombstone's, bounded there.
                    out.push(s.len() as u8);
                    out.extend_from_slice(s.as_bytes());
                }
            }
        }
        out
    }

    /// None for anything [`Tombstones::encode`] did not write.
    pub fn decode(bytes: &[u8]) -> Option<Tombstones> {
        if bytes == [VERSION_EMPTY, 0, 0, 0, 0] {
            return Some(Tombstones::default());
        }
        let mut r = Reader(bytes);
        if r.u8()? != VERSION {
            return None;
        }
        let count = u32::from_le_bytes(r.take(4)?.try_into().ok()?) as usize;
        let mut entries = Vec::with_capacity(count.min(bytes.len() / 20));
        for _ in 0..count {
            let expires_us = u64::from_le_bytes(r.take(8)?.try_into().ok()?);
            let confirmed_us = u64::from_le_bytes(r.take(8)?.try_into().ok()?);
            let byte = r.u8()?;
            let cause = match byte & !TRIAL_BIT {
                1 => Cause::Closing,
                2 => Cause::ConnectFailure,
                3 => Cause::Announced,
                _ => return None,
            };
            let trial = if byte & TRIAL_BIT != 0 {
                Some(u64::from_le_bytes(r.take(8)?.try_into().ok()?))
            } else {
                None
            };
            let address = r.string()?;
            let instance = r.string()?;
            let cluster = r.string()?;
            entries.push(Tombstone {
                address,
                cluster,
                instance,
                expires_us,
                confirmed_us,
                cause,
                trial,
            });
        }
        let mut warming = Vec::new();
        if !r.0.is_empty() {
            let count = u32::from_le_bytes(r.take(4)?.try_into().ok()?) as usize;
            // Written only when there is one.
            if count == 0 {
                return None;
            }
            warming.reserve(count.min(r.0.len() / 18));
            for _ in 0..count {
                let since_us = u64::from_le_bytes(r.take(8)?.try_into().ok()?);
                let until_us = u64::from_le_bytes(r.take(8)?.try_into().ok()?);
                let address = r.string()?;
                let cluster = r.string()?;
                warming.push(Warming {
                    address,
                    cluster,
                    since_us,
                    until_us,
                });
            }
        }
        // Version 2 holds something (the empty list is version 1's).
        let canonical = r.0.is_empty() && !(entries.is_empty() && warming.is_empty());
        canonical.then_some(Tombstones { entries, warming })
    }
}

fn extend(t: &mut Tombstone, expires_us: u64) -> Change {
    if expires_us > t.expires_us {
        t.expires_us = expires_us;
        Change::Extended
    } else {
        Change::Unchanged
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn string(&mut self) -> Option<String> {
        let len = usize::from(self.u8()?);
        String::from_utf8(self.take(len)?.to_vec()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;
    const TTLS: Ttls = Ttls {
        closing: Duration::from_secs(30),
        failure: Duration::from_secs(5),
        warming: None,
    };

    fn closing<'a>(address: &'a str, instance: Option<&'a str>) -> Observation<'a> {
        Observation::Closing {
            cluster: "svc",
            address,
            instance,
        }
    }

    fn failure(address: &str) -> Observation<'_> {
        Observation::ConnectFailure {
            cluster: "svc",
            address,
        }
    }

    fn answered<'a>(address: &'a str, instance: Option<&'a str>) -> Observation<'a> {
        Observation::Answered { address, instance }
    }

    #[test]
    fn closing_evicts_for_the_ttl() {
        let mut t = Tombstones::default();
        assert_eq!(
            t.observe(&closing("10.0.0.1:80", Some("a")), &TTLS, 0, 8),
            Change::Evicted
        );
        assert!(t.get_live("10.0.0.1:80", 30 * S - 1).is_some());
        assert!(
            t.get_live("10.0.0.1:80", 30 * S).is_none(),
            "expires at exactly the TTL"
        );
        assert_eq!(t.live_count(0), 1);
    }

    #[test]
    fn connect_failure_evicts_for_the_failure_ttl() {
        let mut t = Tombstones::default();
        assert_eq!(
            t.observe(&failure("10.0.0.1:80"), &TTLS, S, 8),
            Change::Evicted
        );
        let ts = t.get_live("10.0.0.1:80", S).unwrap();
        assert_eq!((ts.cause, ts.expires_us), (Cause::ConnectFailure, 6 * S));
    }

    #[test]
    fn repeated_closing_extends_and_never_shortens() {
        let mut t = Tombstones::default();
        t.observe(&closing("h:1", Some("a")), &TTLS, 0, 8);
        assert_eq!(
            t.observe(&closing("h:1", Some("a")), &TTLS, 10 * S, 8),
            Change::Extended
        );
        assert_eq!(t.get_live("h:1", 0).unwrap().expires_us, 40 * S);
        assert_eq!(
            t.observe(&failure("h:1"), &TTLS, 11 * S, 8),
            Change::Unchanged,
            "failure TTL is shorter"
        );
        assert_eq!(t.get_live("h:1", 0).unwrap().expires_us, 40 * S);
    }

    #[test]
    fn closing_after_a_connect_failure_upgrades_the_tombstone() {
        let mut t = Tombstones::default();
        t.observe(&failure("h:1"), &TTLS, 0, 8);
        assert_eq!(
            t.observe(&closing("h:1", Some("a")), &TTLS, S, 8),
            Change::Extended
        );
        let ts = t.get_live("h:1", S).unwrap();
        assert_eq!(
            (ts.cause, ts.instance.as_str(), ts.expires_us),
            (Cause::Closing, "a", 31 * S)
        );
    }

    #[test]
    fn a_closing_mark_on_a_longer_failure_tombstone_is_recorded() {
        // failure TTL above the closing TTL: the expiry stays, but what the
        // tombstone says changes, so the change must be stored.
        let ttls = Ttls {
            closing: Duration::from_secs(5),
            failure: Duration::from_secs(30),
            warming: None,
        };
        let mut t = Tombstones::default();
        t.observe(&failure("h:1"), &ttls, 0, 8);
        assert_eq!(
            t.observe(&closing("h:1", Some("a")), &ttls, S, 8),
            Change::Extended
        );
        let ts = t.get_live("h:1", S).unwrap();
        assert_eq!(
            (ts.cause, ts.instance.as_str(), ts.expires_us),
            (Cause::Closing, "a", 30 * S)
        );
        assert_eq!(
            t.observe(&closing("h:1", Some("a")), &ttls, 2 * S, 8),
            Change::Unchanged,
            "nothing new the second time"
        );
    }

    #[test]
    fn each_entry_stores_when_its_cause_was_last_confirmed() {
        let ttls = Ttls {
            failure: Duration::from_secs(60),
            ..TTLS
        };
        let mut t = Tombstones::default();
        t.observe(&closing("h:1", Some("a")), &ttls, S, 8);
        t.observe(&closing("h:1", Some("a")), &ttls, 5 * S, 8);
        assert_eq!(t.get_live("h:1", 0).unwrap().confirmed_us, 5 * S);
        // A refusal outlives the mark but confirms nothing about closing.
        assert_eq!(
            t.observe(&failure("h:1"), &ttls, 6 * S, 8),
            Change::Extended
        );
        let ts = t.get_live("h:1", 0).unwrap();
        assert_eq!(
            (ts.cause, ts.expires_us, ts.confirmed_us),
            (Cause::Closing, 66 * S, 5 * S)
        );
        // A refusal's own tombstone is confirmed by the next refusal.
        t.observe(&failure("r:1"), &ttls, S, 8);
        t.observe(&failure("r:1"), &ttls, 3 * S, 8);
        assert_eq!(t.get_live("r:1", 0).unwrap().confirmed_us, 3 * S);
        assert_eq!(Tombstones::decode(&t.encode()), Some(t));
    }

    #[test]
    fn a_vouched_generation_is_on_trial_until_each_host_answers() {
        let mut t = Tombstones::default();
        for (i, h) in ["a:1", "b:1", "c:1", "d:1"].into_iter().enumerate() {
            t.observe(&closing(h, Some("old")), &TTLS, i as u64 * S, 8);
        }
        t.observe(&failure("e:1"), &TTLS, S, 8);
        t.observe(&closing("x:1", Some("old")), &TTLS, 0, 8);
        if let Some(x) = t.entries.iter_mut().find(|e| e.address == "x:1") {
            x.cluster = "other".into();
        }
        // b:1 (confirmed at 1 s) answers a last resort as a new instance at
        // 4 s: it took 3 s to come back.
        t.observe(&answered("b:1", Some("new")), &TTLS, 4 * S, 8);
        assert_eq!(t.vouch("svc", S, 4 * S), 2);
        let on_trial: Vec<(&str, Option<u64>)> = t
            .entries()
            .iter()
            .filter(|e| e.trial.is_some())
            .map(|e| (e.address.as_str(), e.trial))
            .collect();
        assert_eq!(
            on_trial,
            [("a:1", Some(4 * S)), ("c:1", Some(5 * S))],
            "a at once, c 3 s after its mark; not d (confirmed last), e (refused) or another \
             cluster's"
        );
        assert_eq!(t.vouch("svc", S, 4 * S), 0, "nothing more");
        assert_eq!(Tombstones::decode(&t.encode()), Some(t.clone()));
        // A refusal keeps the trial; a closing mark ends it, even one that
        // adds no life, and is written.
        t.observe(&failure("a:1"), &TTLS, 5 * S, 8);
        assert!(t.get_live("a:1", 5 * S).unwrap().trial.is_some());
        assert!(t.worth_writing(&closing("a:1", Some("old")), &TTLS, 5 * S));
        assert_eq!(
            t.observe(&closing("a:1", Some("old")), &TTLS, 5 * S, 8),
            Change::Extended
        );
        let a = t.get_live("a:1", 5 * S).unwrap();
        assert_eq!((a.trial, a.confirmed_us), (None, 5 * S));
        // A new instance readmits as ever.
        assert_eq!(
            t.observe(&answered("c:1", Some("new")), &TTLS, 5 * S, 8),
            Change::Readmitted
        );
    }

    /// `address` announced at `now` for 120 s.
    fn announce(t: &mut Tombstones, address: &str, now: u64) -> Change {
        t.announce("svc", address, now, now + 120 * S, 8)
    }

    #[test]
    fn no_answer_lifts_an_announced_tombstone() {
        let mut t = Tombstones::default();
        assert_eq!(announce(&mut t, "h:1", 0), Change::Evicted);
        for obs in [
            answered("h:1", Some("new")),
            answered("h:1", Some("other")),
            answered("h:1", None),
        ] {
            assert!(!t.worth_writing(&obs, &TTLS, S), "{obs:?}");
            assert_eq!(t.observe(&obs, &TTLS, S, 8), Change::Unchanged, "{obs:?}");
        }
        let ts = t.get_live("h:1", S).unwrap();
        assert_eq!((ts.cause, ts.expires_us), (Cause::Announced, 120 * S));
        assert!(t.get_live("h:1", 120 * S).is_none(), "expiry ends it");
    }

    #[test]
    fn a_mark_or_a_refusal_on_an_announced_tombstone_keeps_its_cause() {
        let ttls = Ttls {
            closing: Duration::from_secs(300),
            failure: Duration::from_secs(400),
            warming: None,
        };
        let mut t = Tombstones::default();
        announce(&mut t, "h:1", 0);
        // Within the announced expiry: nothing new, nothing written.
        assert!(!t.worth_writing(&closing("h:1", Some("i")), &TTLS, S));
        assert_eq!(
            t.observe(&closing("h:1", Some("i")), &TTLS, S, 8),
            Change::Unchanged
        );
        // Past it: extended, still announced, no instance learned.
        assert!(t.worth_writing(&closing("h:1", Some("i")), &ttls, S));
        assert_eq!(
            t.observe(&closing("h:1", Some("i")), &ttls, S, 8),
            Change::Extended
        );
        let ts = t.get_live("h:1", S).unwrap().clone();
        assert_eq!(
            (
                ts.cause,
                ts.expires_us,
                ts.confirmed_us,
                ts.instance.as_str()
            ),
            (Cause::Announced, 301 * S, S, "")
        );
        assert_eq!(
            t.observe(&failure("h:1"), &ttls, 2 * S, 8),
            Change::Extended
        );
        let ts = t.get_live("h:1", 2 * S).unwrap();
        assert_eq!(
            (ts.cause, ts.expires_us, ts.confirmed_us),
            (Cause::Announced, 402 * S, S),
            "a refusal confirms nothing"
        );
        assert_eq!(Tombstones::decode(&t.encode()), Some(t));
    }

    #[test]
    fn announcing_takes_over_a_tombstone_of_another_cause_and_repeats_only_by_a_second() {
        let mut t = Tombstones::default();
        t.observe(&closing("h:1", Some("i")), &TTLS, 0, 8);
        t.observe(&failure("r:1"), &TTLS, 0, 8);
        assert_eq!(announce(&mut t, "h:1", S), Change::Extended);
        assert_eq!(announce(&mut t, "r:1", S), Change::Extended);
        for a in ["h:1", "r:1"] {
            let ts = t.get_live(a, S).unwrap();
            assert_eq!(
                (ts.cause, ts.expires_us, ts.confirmed_us),
                (Cause::Announced, 121 * S, S)
            );
        }
        assert_eq!(
            t.get_live("h:1", S).unwrap().instance,
            "i",
            "the instance is kept"
        );
        assert_eq!(announce(&mut t, "h:1", S + S / 2), Change::Unchanged);
        assert_eq!(announce(&mut t, "h:1", 3 * S), Change::Extended);
        assert_eq!(t.get_live("h:1", 0).unwrap().expires_us, 123 * S);
        // A new instance answering is still no readmission.
        assert_eq!(
            t.observe(&answered("h:1", Some("new")), &TTLS, 4 * S, 8),
            Change::Unchanged
        );
    }

    #[test]
    fn only_lifting_removes_announced_tombstones_and_only_those() {
        let mut t = Tombstones::default();
        announce(&mut t, "10.0.0.1:80", 0);
        announce(&mut t, "10.0.0.1:81", 0);
        announce(&mut t, "10.0.0.2:80", 0);
        t.observe(&closing("10.0.0.1:82", Some("i")), &TTLS, 0, 8);
        let at_1 = |a: &str| a.starts_with("10.0.0.1:");
        assert_eq!(t.lift_announced(S, at_1), 2);
        let left: Vec<&str> = t.live(S).map(|e| e.address.as_str()).collect();
        assert_eq!(
            left,
            ["10.0.0.2:80", "10.0.0.1:82"],
            "the closing mark stays"
        );
        assert_eq!(t.lift_announced(S, at_1), 0, "nothing left to lift");
    }

    #[test]
    fn an_announced_tombstone_is_never_put_on_trial() {
        let mut t = Tombstones::default();
        announce(&mut t, "a:1", 0);
        t.observe(&closing("b:1", Some("old")), &TTLS, S, 8);
        t.observe(&closing("c:1", Some("old")), &TTLS, 2 * S, 8);
        t.observe(&closing("d:1", Some("old")), &TTLS, 3 * S, 8);
        t.observe(&answered("b:1", Some("new")), &TTLS, 4 * S, 8);
        assert_eq!(t.vouch("svc", S, 4 * S), 1, "c:1 only");
        assert_eq!(t.get_live("a:1", 4 * S).unwrap().trial, None);
    }

    #[test]
    fn announced_tombstones_round_trip_and_cause_3_is_the_only_new_byte() {
        let mut t = Tombstones::default();
        announce(&mut t, "h:1", 0);
        let bytes = t.encode();
        assert_eq!((bytes[0], bytes[5 + 16]), (2, 3));
        assert_eq!(Tombstones::decode(&bytes), Some(t));
        let mut unknown = bytes;
        unknown[5 + 16] = 4;
        assert_eq!(Tombstones::decode(&unknown), None);
    }

    #[test]
    fn the_empty_list_is_version_1_and_every_other_version_2() {
        assert_eq!(Tombstones::default().encode(), [1, 0, 0, 0, 0]);
        assert_eq!(Tombstones::decode(&[2, 0, 0, 0, 0]), None, "not canonical");
        let mut t = Tombstones::default();
        t.observe(&closing("h:1", None), &TTLS, 0, 8);
        assert_eq!(t.encode()[0], 2);
        // What a build before stored confirmations wrote for one entry.
        let mut v1 = vec![1, 1, 0, 0, 0];
        v1.extend_from_slice(&(30 * S).to_le_bytes());
        v1.extend_from_slice(&[1, 3, b'h', b':', b'1', 0, 3, b's', b'v', b'c']);
        assert_eq!(Tombstones::decode(&v1), None, "read as unreadable");
    }

    #[test]
    fn a_new_instance_answering_readmits_at_once() {
        let mut t = Tombstones::default();
        t.observe(&closing("h:1", Some("old")), &TTLS, 0, 8);
        assert_eq!(
            t.observe(&answered("h:1", Some("old")), &TTLS, S, 8),
            Change::Unchanged
        );
        assert_eq!(
            t.observe(&answered("h:1", None), &TTLS, S, 8),
            Change::Unchanged
        );
        assert_eq!(
            t.observe(&answered("h:1", Some("new")), &TTLS, S, 8),
            Change::Readmitted
        );
        assert!(t.get_live("h:1", S).is_none());
    }

    #[test]
    fn a_new_instance_that_is_closing_too_replaces_the_tombstone() {
        let mut t = Tombstones::default();
        t.observe(&closing("h:1", Some("old")), &TTLS, 0, 8);
        assert_eq!(
            t.observe(&closing("h:1", Some("new")), &TTLS, 5 * S, 8),
            Change::Evicted
        );
        assert_eq!(t.get_live("h:1", 0).unwrap().instance, "new");
        assert_eq!(t.get_live("h:1", 0).unwrap().expires_us, 35 * S);
    }

    #[test]
    fn a_host_tombstoned_for_failure_is_readmitted_when_it_answers() {
        let mut t = Tombstones::default();
        t.observe(&failure("h:1"), &TTLS, 0, 8);
        assert_eq!(
            t.observe(&answered("h:1", Some("x")), &TTLS, S, 8),
            Change::Readmitted
        );
    }

    #[test]
    fn answers_from_unknown_hosts_change_nothing() {
        let mut t = Tombstones::default();
        assert_eq!(
            t.observe(&answered("h:1", Some("x")), &TTLS, 0, 8),
            Change::Unchanged
        );
        assert!(t.entries().is_empty());
    }

    #[test]
    fn an_expired_tombstone_is_replaced_not_extended() {
        let mut t = Tombstones::default();
        t.observe(&closing("h:1", Some("a")), &TTLS, 0, 8);
        assert_eq!(
            t.observe(&closing("h:1", Some("a")), &TTLS, 31 * S, 8),
            Change::Evicted
        );
        assert_eq!(t.entries().len(), 1, "no duplicate entry for the address");
    }

    #[test]
    fn the_list_stays_bounded_under_churn() {
        let mut t = Tombstones::default();
        for i in 0..10_000u64 {
            let addr = format!("10.{}.{}.{}:8080", i / 65536, (i / 256) % 256, i % 256);
            t.observe(&closing(&addr, Some("i")), &TTLS, i, 16);
            assert!(t.entries().len() <= 16);
        }
        assert_eq!(t.entries().len(), 16);
        // The 16 kept are the latest (they expire last).
        assert!(t.get_live("10.0.39.15:8080", 0).is_some(), "host 9999 kept");
        assert!(t.encode().len() < 16 * 64, "{} bytes", t.encode().len());
    }

    #[test]
    fn network_strings_are_bounded() {
        let mut t = Tombstones::default();
        let long = "x".repeat(1000);
        t.observe(
            &Observation::Closing {
                cluster: &long,
                address: "h:1",
                instance: Some(&long),
            },
            &TTLS,
            0,
            8,
        );
        let ts = &t.entries()[0];
        assert_eq!((ts.cluster.len(), ts.instance.len()), (255, 128));
        assert_eq!(Tombstones::decode(&t.encode()), Some(t.clone()));
        let mut t = Tombstones::default();
        let multibyte = "é".repeat(100);
        t.observe(&closing("h:1", Some(&multibyte)), &TTLS, 0, 8);
        assert_eq!(t.entries()[0].instance.len(), 128);
        assert_eq!(Tombstones::decode(&t.encode()), Some(t));
    }

    const WARMING: Ttls = Ttls {
        warming: Some(Duration::from_secs(10)),
        ..TTLS
    };

    #[test]
    fn with_slow_start_a_readmission_leaves_a_warming_entry_until_the_window_ends() {
        let mut t = Tombstones::default();
        t.observe(&closing("h:1", Some("old")), &WARMING, 0, 8);
        assert_eq!(
            t.observe(&answered("h:1", Some("new")), &WARMING, 2 * S, 8),
            Change::Readmitted
        );
        assert!(t.get_live("h:1", 2 * S).is_none(), "no longer tombstoned");
        assert_eq!(t.live_count(2 * S), 0);
        let w: Vec<&Warming> = t.warming(2 * S).collect();
        assert_eq!(
            w,
            [&Warming {
                address: "h:1".into(),
                cluster: "svc".into(),
                since_us: 2 * S,
                until_us: 12 * S,
            }]
        );
        assert_eq!(t.latest_end(), 12 * S, "steering lasts the window");
        assert_eq!(t.warming(12 * S).count(), 0, "over at its end");
        assert_eq!(Tombstones::decode(&t.encode()), Some(t.clone()));
        // Answers while warming change nothing.
        assert_eq!(
            t.observe(&answered("h:1", Some("new")), &WARMING, 3 * S, 8),
            Change::Unchanged
        );
        // Closing again: a tombstone, and the warming entry goes.
        assert_eq!(
            t.observe(&closing("h:1", Some("new")), &WARMING, 4 * S, 8),
            Change::Evicted
        );
        assert_eq!(t.warming(4 * S).count(), 0);
        assert!(t.get_live("h:1", 4 * S).is_some());
        // Without slow start a readmission leaves nothing.
        let mut t = Tombstones::default();
        t.observe(&closing("h:1", Some("old")), &TTLS, 0, 8);
        t.observe(&answered("h:1", Some("new")), &TTLS, S, 8);
        assert_eq!((t.warming(S).count(), t.latest_end()), (0, 0));
    }

    #[test]
    fn warming_entries_are_bounded_and_dropped_when_over() {
        let mut t = Tombstones::default();
        for i in 0..5u64 {
            let a = format!("h:{i}");
            t.observe(&closing(&a, Some("old")), &WARMING, 0, 3);
            t.observe(&answered(&a, Some("new")), &WARMING, i * S, 3);
        }
        let left: Vec<&str> = t.warming(4 * S).map(|w| w.address.as_str()).collect();
        assert_eq!(left, ["h:4", "h:3", "h:2"], "the last 3 to end kept");
        t.compact(14 * S, 3);
        assert_eq!(t.warming(0).count(), 0, "ended entries dropped");
    }

    #[test]
    fn encoding_round_trips() {
        let mut t = Tombstones::default();
        t.observe(&closing("10.0.0.1:80", Some("a")), &TTLS, 0, 8);
        t.observe(&failure("[::1]:80"), &TTLS, 0, 8);
        assert_eq!(Tombstones::decode(&t.encode()), Some(t.clone()));
        assert_eq!(
            Tombstones::decode(&Tombstones::default().encode()),
            Some(Tombstones::default())
        );
    }

    #[test]
    fn decode_refuses_truncated_or_foreign_values() {
        let mut t = Tombstones::default();
        t.observe(&closing("10.0.0.1:80", Some("a")), &TTLS, 0, 8);
        let bytes = t.encode();
        for cut in 0..bytes.len() {
            assert_eq!(Tombstones::decode(&bytes[..cut]), None, "cut at {cut}");
        }
        let mut extra = bytes.clone();
        extra.push(0);
        assert_eq!(Tombstones::decode(&extra), None);
        let mut bad = bytes;
        bad[0] = 9;
        assert_eq!(Tombstones::decode(&bad), None);
        assert_eq!(
            Tombstones::decode(&[1, 0xff, 0xff, 0xff, 0xff]),
            None,
            "a huge count does not allocate"
        );
    }
}
