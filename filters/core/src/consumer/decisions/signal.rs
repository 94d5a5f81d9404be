//! The change signal and the cached shared values: a VM copy reads shared
//! data only when `graceful_consumer_generation` moved (see the module doc
//! of [`super`]), and tells the others of its writes by bumping it.

use super::{Consumer, Effect, Exchange, Level};
use crate::consumer::steering::Membership;
use crate::consumer::tombstone::Tombstones;
use crate::shared::keys;
use crate::shared::metrics::Metric;
use crate::shared::store::{self, add_bounded, SharedStore};

/// Upstream responses that carry [`crate::shared::headers::SIGNAL`] after each
/// tombstone write of a copy: enough that each worker's listener sees one
/// soon (its first retried request brings it), few enough that the header
/// costs nothing once every copy knows.
pub const SIGNAL_HINTS: u8 = 32;

/// A shared-data value decoded once per change of its generation key,
/// whose generation key is read only when the change signal moved (or
/// when a caller outside the request path asks for a check).
pub(super) struct Cached<T> {
    pub(super) gen: Option<u64>,
    /// The generation key was read since the change signal last moved.
    checked: bool,
    pub(super) value: T,
    /// With [`Cached::keeping_bytes`]: the bytes `value` was read from (or
    /// written as), so that reading the same bytes again decodes nothing.
    bytes: Option<Vec<u8>>,
    keep_bytes: bool,
}

impl<T: Default> Cached<T> {
    pub(super) fn new() -> Self {
        Cached {
            gen: None,
            checked: false,
            value: T::default(),
            bytes: None,
            keep_bytes: false,
        }
    }

    /// A cache that also keeps its value's bytes: for a value this copy
    /// writes itself (its next read is then its own write, not decoded
    /// again), bounded as the value is.
    pub(super) fn keeping_bytes() -> Self {
        Cached {
            keep_bytes: true,
            ..Cached::new()
        }
    }

    /// This copy wrote `value` as `bytes`: the cache holds them, and the
    /// next refresh reads the generation key (it moved) and finds these
    /// bytes unless another copy wrote since.
    pub(super) fn wrote(&mut self, value: T, bytes: Vec<u8>) {
        self.value = value;
        if self.keep_bytes {
            self.bytes = Some(bytes);
        }
        self.checked = false;
    }

    /// Takes the value and the bytes it was read from (when kept) out, to
    /// change the value without a copy; [`Cached::wrote`] or
    /// [`Cached::put_back`] returns them.
    pub(super) fn take(&mut self) -> (T, Option<Vec<u8>>) {
        (std::mem::take(&mut self.value), self.bytes.take())
    }

    /// Returns what [`Cached::take`] took, unchanged.
    pub(super) fn put_back(&mut self, value: T, bytes: Option<Vec<u8>>) {
        self.value = value;
        self.bytes = bytes;
    }

    /// Makes the next [`Cached::refresh`] read the generation key.
    pub(super) fn stale(&mut self) {
        self.checked = false;
    }

    /// Reads the generation key unless checked since the signal moved, and
    /// decodes the value again if it moved; true if it did. Unreadable or
    /// foreign bytes read as "nothing yet" (the filter fails open).
    pub(super) fn refresh(
        &mut self,
        store: &dyn SharedStore,
        gen_key: &str,
        key: &str,
        decode: fn(&[u8]) -> Option<T>,
    ) -> bool {
        if self.checked {
            return false;
        }
        self.checked = true;
        let gen = store
            .get(gen_key)
            .ok()
            .flatten()
            .and_then(|(b, _)| store::read_u64(&b))
            .unwrap_or(0);
        if self.gen == Some(gen) {
            return false;
        }
        let read = store.get(key).ok().flatten().map(|(b, _)| b);
        self.gen = Some(gen);
        if self.keep_bytes && read.is_some() && read == self.bytes {
            return true;
        }
        self.value = read.as_deref().and_then(decode).unwrap_or_default();
        if self.keep_bytes {
            self.bytes = read;
        }
        true
    }
}

impl Consumer {
    /// Takes the change signal (`graceful_consumer_generation`, read before
    /// any shared data): if it moved, or cannot be read, the cached values
    /// check their generation keys when next used.
    pub fn sync(&mut self, signal: Option<u64>) {
        let own = std::mem::take(&mut self.own_bumps);
        let unchanged = self.signal.and_then(|s| s.checked_add(own));
        if signal.is_some() && signal == unchanged {
            self.signal = signal;
            return;
        }
        self.signal = signal;
        self.tombstones.stale();
        self.members.stale();
        self.shared_observed.stale();
    }

    /// Tells this copy's stats scope of a tombstone write whose bump it
    /// has not seen, so its other copies read the list at their next
    /// request: on Envoy 1.36 the upstream instance's stats live in the
    /// cluster's scope (`cluster.<name>.wasmcustom.*`), so its bumps never
    /// move the listener's signal (on 1.40 both share one scope). The glue
    /// calls this on every tick with the signal just read; a copy whose
    /// signal moved reads the list when next used anyway. Returns the bump
    /// to carry out, if any.
    pub fn notice_unannounced(
        &mut self,
        store: &dyn SharedStore,
        signal: Option<u64>,
    ) -> Vec<Effect> {
        let unmoved =
            signal.is_some() && self.signal.and_then(|s| s.checked_add(self.own_bumps)) == signal;
        self.sync(signal);
        if !unmoved {
            return Vec::new();
        }
        let before = self.tombstones.gen;
        self.tombstones.stale();
        self.refresh_tombstones(store);
        if self.tombstones.gen != before {
            return self.announce();
        }
        Vec::new()
    }

    /// Whether an upstream response should carry
    /// [`headers::SIGNAL`](crate::shared::headers::SIGNAL) (counted: each write
    /// hints [`SIGNAL_HINTS`] responses of this copy).
    pub fn take_signal_hint(&mut self) -> bool {
        let hint = self.signal_hints_left > 0;
        self.signal_hints_left = self.signal_hints_left.saturating_sub(1);
        hint
    }

    /// An upstream response carried [`crate::shared::headers::SIGNAL`]: the
    /// upstream instance wrote tombstones that this scope's signal may not
    /// show. Reads the list now, and moves the signal once per generation
    /// of the list this copy was signalled (whatever the signal did since:
    /// a move for another write may have come before this one, and the
    /// copies that synced with it would not look again).
    pub fn signalled(&mut self, store: &dyn SharedStore, signal: Option<u64>) -> Vec<Effect> {
        self.sync(signal);
        self.tombstones.stale();
        self.refresh_tombstones(store);
        let gen = self.tombstones.gen;
        if gen.is_none() || gen == self.signalled_gen {
            return Vec::new();
        }
        self.signalled_gen = gen;
        self.announce()
    }

    /// Moves the change signal for a write another instance made (its
    /// generation key moved already).
    pub(super) fn announce(&mut self) -> Vec<Effect> {
        self.own_bumps = self.own_bumps.saturating_add(1);
        vec![Effect::Add(Metric::ConsumerGeneration, 1)]
    }

    /// Bumps a generation key, then the change signal (whatever the key's
    /// bump did: the other copies then at least look); a failure is logged
    /// once per VM copy.
    pub(super) fn bump(&mut self, store: &dyn SharedStore, gen_key: &str) -> Vec<Effect> {
        if gen_key == keys::TOMBSTONES_GEN.name {
            self.signal_hints_left = SIGNAL_HINTS;
        }
        let mut effects = Vec::new();
        if let Err(e) = add_bounded(store, gen_key, 1, u64::MAX) {
            if !std::mem::replace(&mut self.bump_warned, true) {
                effects.push(Effect::Log(
                    Level::Warn,
                    format!(
                        "{gen_key} not bumped ({e:?}): other VM copies keep their cached value until the next change (logged once per VM copy)"
                    ),
                ));
            }
        }
        effects.extend(self.announce());
        effects
    }

    /// Brings the cached admin membership up to date (reads only if
    /// stale); true if it changed.
    pub(super) fn refresh_members(&mut self, store: &dyn SharedStore) -> bool {
        let changed = self.members.refresh(
            store,
            keys::MEMBERS_GEN.name,
            keys::MEMBERS.name,
            Membership::decode,
        );
        if changed {
            self.members_draining = self.members.value.any_draining();
        }
        changed
    }

    /// Brings the cached tombstones up to date (reads only if stale).
    pub(super) fn refresh_tombstones(&mut self, store: &dyn SharedStore) {
        let changed = self.tombstones.refresh(
            store,
            keys::TOMBSTONES_GEN.name,
            keys::TOMBSTONES.name,
            Tombstones::decode,
        );
        if changed {
            // Warming entries too: while a readmitted host ramps up, its
            // cluster is steered.
            self.live_until = self.tombstones.value.latest_end();
            self.announced_until = self.tombstones.value.announced_end();
        }
    }

    /// [`Consumer::may_be_live`] for announced tombstones (the watch's).
    pub(super) fn may_be_announced(&mut self, x: &mut dyn Exchange) -> bool {
        if self.announced_until == 0 {
            return false;
        }
        if x.now() >= self.announced_until {
            self.announced_until = 0;
            return false;
        }
        true
    }

    /// Whether the cached list may hold a live tombstone; reads the clock
    /// only if it has an entry not yet seen expired.
    pub(super) fn may_be_live(&mut self, x: &mut dyn Exchange) -> bool {
        if self.live_until == 0 {
            return false;
        }
        if x.now() >= self.live_until {
            self.live_until = 0;
            return false;
        }
        true
    }
}
