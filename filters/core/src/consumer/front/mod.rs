//! Per-host state on a front (the front-proxy role of graceful_consumer,
//! docs/design/front-proxy-drain.md §7): a host is an IP (every member at
//! it: a pod leaves whole), kept IPv4-mapped in 16 bytes. All of a
//! process's hosts live in one bounded value ([`FrontHosts`], encoded by
//! [`FrontHosts::encode`]) kept in `graceful.v1.front.hosts`, which
//! graceful_consumer creates when `front` is configured. [`endpoints`]
//! says what each front endpoint answers; [`serve`] runs the role over the
//! host traits (the endpoints, the poll of `/clusters`, the held
//! long-polls), for the glue to call.
//!
//! A host with no entry is **serving**; the states stored are closing,
//! steered and acknowledged. [`FrontHosts::apply`] is the only way in: it
//! changes nothing when its [`Change`] is not [`Change::written`], so a
//! caller applies an event to the cached table and writes (with
//! [`crate::shared::store::update`]) only then.
//!
//! # Transition table (per host)
//!
//! | state | event | next | written |
//! |---|---|---|---|
//! | serving | `closing` from the host itself ([`Event::Closing`]) | closing(host): `closing_us` = `last_active_us` = now, `expires_us` = now + `closing_ttl`; the glue writes announced tombstones and bumps the generation ([`Change::Closing`]) | yes |
//! | serving | the admin lists it `DRAINING` ([`Event::Listed`]) | closing(draining), times as above | yes |
//! | serving | it leaves the admin's membership ([`Event::Left`]) | closing(removed), times as above | yes |
//! | serving | any other event | serving | no |
//! | closing, steered, acknowledged | `closing` from the host, first time | its sources gain host, `expires_us` = now + `closing_ttl` if later ([`Change::Closing`]: tombstones written) | yes |
//! | closing, steered, acknowledged | `closing` from the host again | `expires_us` = now + `closing_ttl` if later | if ≥ 1 s later |
//! | closing, steered, acknowledged, sources without removed | listed `DRAINING`, sources without draining | sources gain draining | yes |
//! | closing, steered, acknowledged | left, sources without removed | sources gain removed | yes |
//! | closing, steered, acknowledged | listed `DRAINING` / left, the bit already set (for `DRAINING`: and not removed) | unchanged | no |
//! | closing | a plan lists an acceptable host and not this one ([`Event::Steered`]) | steered: `steered_us` = now (the bump), `epoch` = the grace count's epoch this steering advanced to (the next one while the older slot is busy: a later poll advances, [`grace`]), `zero_reads` = 0 | yes |
//! | closing | no acceptable host in a cluster it is in ([`Event::Unsteerable`]) | closing: the balancer may pick it; no acknowledgement | no |
//! | steered | no acceptable host | closing: `steered_us` = 0, `inflight_at_steering` unread, `zero_reads` = 0 (withheld until steered again) | yes |
//! | steered, acknowledged | steered | unchanged | no |
//! | acknowledged | no acceptable host | unchanged (attempts at it count as late) | no |
//! | closing | an `rq_active` read ([`Event::Read`]), the first since closing | `inflight_at_closing` = it; > 0: `last_active_us` = now | yes |
//! | closing | a later read > 0 | `last_active_us` = now | once per second at most |
//! | closing | a later read of 0, or the host not listed | unchanged (only reads after the bump count) | no |
//! | steered | a read > 0 | `zero_reads` = 0, `last_active_us` = now; `inflight_at_closing` and `inflight_at_steering` set if unread | if one was unread or `zero_reads` was > 0; else once per second at most |
//! | steered | a read of 0, `zero_reads` 0 | `zero_reads` = 1, `last_active_us` = now (the first zero read), unread figures = 0 | yes |
//! | steered | a read of 0, `zero_reads` > 0, at least `poll` after the first zero read, guard clear ([`grace::clear`] for its `epoch`: the requests that started before its steering are answered) | acknowledged: `zero_reads` + 1, `acked_us` = now, figures frozen ([`Change::Acknowledged`]: waiters woken) | yes |
//! | steered | a read of 0, `zero_reads` > 0, sooner than `poll` or guard not clear | unchanged | no |
//! | steered | it left `/clusters` (read `None`), guard clear | acknowledged: `acked_us` = now, figures frozen | yes |
//! | steered | it left `/clusters`, guard not clear | unchanged | no |
//! | acknowledged | an attempt at it ([`Event::Attempt`]: the upstream instance saw one, [`crate::consumer::filter::ConsumerFilter::front_attempt_seen`]) or a read > 0 | acknowledged, `late` + 1 ([`Change::Late`]: logged) | yes |
//! | acknowledged | a read of 0 or `None` | unchanged | no |
//! | closing, steered | an attempt at it | unchanged (a retry of a request that started before the steering: the grace count waits for it) | no |
//! | closing, steered, acknowledged | `serving` from the host ([`Event::Serving`]) | serving: entry removed ([`Change::Serving`]: its announced tombstones removed) | yes |
//! | closing, steered, acknowledged, sources with removed | listed again, any health (it left membership and came back) | serving ([`Change::Serving`]); listed `DRAINING`: then at once closing(draining) afresh | yes |
//! | closing, steered, acknowledged | listed `HEALTHY` at or past `expires_us` (`closing_ttl` passed: a restart it was not told of) | serving ([`Change::Serving`]) | yes |
//! | closing, steered, acknowledged, sources draining only | listed `HEALTHY` again | serving ([`Change::Serving`]) | yes |
//! | closing, steered, acknowledged | listed `HEALTHY` otherwise, or listed neither `HEALTHY` nor `DRAINING` | unchanged | no |
//! | serving | a new entry while the table holds `max_hosts` | the acknowledged entry acknowledged first is dropped, then as above | yes |
//! | serving | a new entry while the table holds `max_hosts`, none acknowledged | serving: nothing written ([`Change::Full`]: `closing` answers 503) | no |
//!
//! Figures are frozen once acknowledged: only `late` and `sources` (and
//! `expires_us`) change after. An unread `inflight_at_*` is stored as
//! `u32::MAX`; a read is stored at most `u32::MAX - 1`.

mod codec;
pub mod endpoints;
pub mod grace;
pub mod serve;
mod status;
#[cfg(test)]
mod tests;

pub use codec::{ENTRY_LEN, MAX_HOSTS_CEILING, VERSION};
pub use serve::FrontCopy;
pub use status::FrontStatus;

use std::net::{IpAddr, Ipv6Addr};
use std::time::Duration;

use crate::shared::duration::micros;

/// `front.max_hosts` unless configured.
pub const DEFAULT_MAX_HOSTS: usize = 256;

/// A repeated `closing` from the host is written only when it adds at least
/// this much life (µs), and a read > 0 refreshes `last_active_us` in shared
/// data at most this often.
pub const WRITE_GRANULARITY_US: u64 = 1_000_000;

/// The key a host is known by: its IP, IPv4 mapped into IPv6.
pub fn host_ip(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

/// A stored host's state (serving is the absence of an entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Closing,
    Steered,
    Acknowledged,
}

impl State {
    /// The name the status JSON gives it.
    pub fn name(self) -> &'static str {
        match self {
            State::Closing => "closing",
            State::Steered => "steered",
            State::Acknowledged => "acknowledged",
        }
    }
}

/// How a front learned that a host is closing: a bitset of these.
pub mod source {
    /// `closing` from the host itself.
    pub const HOST: u8 = 1;
    /// The admin listed a member at it `DRAINING`.
    pub const DRAINING: u8 = 2;
    /// A member at it left the admin's membership.
    pub const REMOVED: u8 = 4;
    /// Every bit a source may set.
    pub const ALL: u8 = HOST | DRAINING | REMOVED;
    /// Names, in bit order, as the status JSON lists them.
    pub const NAMES: [(u8, &str); 3] =
        [(HOST, "host"), (DRAINING, "draining"), (REMOVED, "removed")];
}

/// One host that is not serving. Times are µs on the monotonic clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrontHost {
    pub ip: Ipv6Addr,
    pub state: State,
    /// [`source`] bits: every way the front learned it is closing.
    pub sources: u8,
    /// The grace count's epoch its steering advanced to.
    pub epoch: u16,
    /// `rq_active` at the first read after closing; None until read.
    pub inflight_at_closing: Option<u32>,
    /// `rq_active` at the first read after the steering; None until read.
    pub inflight_at_steering: Option<u32>,
    /// Attempts seen at it after the acknowledgement.
    pub late: u32,
    /// Zero `rq_active` reads in a row since the steering.
    pub zero_reads: u32,
    pub closing_us: u64,
    /// The generation bump that steered it (0 while closing).
    pub steered_us: u64,
    /// The last read > 0, or the first zero read after it.
    pub last_active_us: u64,
    /// When it was acknowledged (0 before).
    pub acked_us: u64,
    /// `closing_ttl` after the last `closing` (from any source): past it a
    /// host listed `HEALTHY` is serving again.
    pub expires_us: u64,
}

/// The health the admin lists a host with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    Healthy,
    Draining,
    /// Listed, neither `HEALTHY` nor `DRAINING` (unhealthy, degraded, timeout).
    Other,
}

/// What a front observed about one host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// `POST {prefix}/front/closing` from the host itself (trusted peer, a member's IP).
    Closing,
    /// `POST {prefix}/front/serving` from the host itself.
    Serving,
    /// The admin's membership lists a member at it, with this health.
    Listed(Health),
    /// Every member at it left the admin's membership.
    Left,
    /// A plan listed an acceptable host and not this one, after a generation
    /// bump that advanced the grace count's epoch to this.
    Steered { epoch: u16 },
    /// A cluster it is in has no acceptable host: the balancer may pick it.
    Unsteerable,
    /// One `rq_active` read of it from the admin's `/clusters`.
    Read {
        /// None: the host is not listed in `/clusters` (removed).
        active: Option<u32>,
        /// Its grace slot reads 0 ([`grace::clear`]).
        guard_clear: bool,
    },
    /// An attempt reached it (the upstream instance saw one).
    Attempt,
}

/// What [`FrontHosts::apply`] changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Nothing (the table is as it was): no write.
    Unchanged,
    /// A new entry, or the host's own `closing` on one that lacked it:
    /// announced tombstones to write, the generation to bump.
    Closing,
    /// Figures, sources or times changed.
    Updated,
    /// Acknowledged now: waiters to wake.
    Acknowledged,
    /// An attempt after the acknowledgement (`late` + 1).
    Late,
    /// Serving again: its announced tombstones to remove.
    Serving,
    /// The table is full of hosts not yet acknowledged: nothing written.
    Full,
}

impl Change {
    /// True when the table changed and must be written.
    pub fn written(self) -> bool {
        !matches!(self, Change::Unchanged | Change::Full)
    }
}

/// The settings the transitions read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub closing_ttl: Duration,
    /// The least time between the two zero reads an acknowledgement needs.
    pub poll: Duration,
    /// Entries kept at most (capped at [`MAX_HOSTS_CEILING`]).
    pub max_hosts: usize,
}

/// Every host a front knows is not serving.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FrontHosts {
    hosts: Vec<FrontHost>,
}

/// Stored for an unread `inflight_at_*`.
const UNREAD: u32 = u32::MAX;

/// A read as stored: below [`UNREAD`].
fn count(active: u32) -> u32 {
    active.min(UNREAD - 1)
}

impl FrontHosts {
    pub fn hosts(&self) -> &[FrontHost] {
        &self.hosts
    }

    /// The entry of `ip` (None: serving).
    pub fn get(&self, ip: Ipv6Addr) -> Option<&FrontHost> {
        self.hosts.iter().find(|h| h.ip == ip)
    }

    /// The status of `ip`, as the front's endpoints would answer it.
    pub fn status(&self, ip: Ipv6Addr) -> FrontStatus {
        FrontStatus::of(self.get(ip))
    }

    /// Applies `event` about `ip` at `now_us` (the module's table). Leaves
    /// the table as it was unless the result is [`Change::written`].
    pub fn apply(&mut self, ip: Ipv6Addr, event: Event, now_us: u64, limits: &Limits) -> Change {
        let Some(i) = self.hosts.iter().position(|h| h.ip == ip) else {
            return self.apply_serving(ip, event, now_us, limits);
        };
        if let Event::Listed(health) = event {
            return self.listed(i, health, now_us, limits);
        }
        if event == Event::Serving {
            self.hosts.remove(i);
            return Change::Serving;
        }
        let Some(h) = self.hosts.get_mut(i) else {
            return Change::Unchanged;
        };
        match event {
            Event::Closing => closing_again(h, now_us, limits),
            Event::Left => add_source(h, source::REMOVED),
            Event::Steered { epoch } => steer(h, epoch, now_us),
            Event::Unsteerable => unsteerable(h),
            Event::Read {
                active,
                guard_clear,
            } => read(h, active, guard_clear, now_us, limits),
            Event::Attempt => late(h),
            Event::Serving | Event::Listed(_) => Change::Unchanged,
        }
    }

    /// A host with no entry: only a source of closing makes one.
    fn apply_serving(
        &mut self,
        ip: Ipv6Addr,
        event: Event,
        now_us: u64,
        limits: &Limits,
    ) -> Change {
        let bit = match event {
            Event::Closing => source::HOST,
            Event::Listed(Health::Draining) => source::DRAINING,
            Event::Left => source::REMOVED,
            _ => return Change::Unchanged,
        };
        self.insert(ip, bit, now_us, limits)
    }

    /// A new closing entry, within `max_hosts`.
    fn insert(&mut self, ip: Ipv6Addr, bit: u8, now_us: u64, limits: &Limits) -> Change {
        let max = limits.max_hosts.min(MAX_HOSTS_CEILING);
        while self.hosts.len() >= max {
            let oldest = self
                .hosts
                .iter()
                .enumerate()
                .filter(|(_, h)| h.state == State::Acknowledged)
                .min_by_key(|(_, h)| h.acked_us)
                .map(|(i, _)| i);
            match oldest {
                Some(i) => {
                    self.hosts.remove(i);
                }
                None => return Change::Full,
            }
        }
        self.hosts.push(FrontHost {
            ip,
            state: State::Closing,
            sources: bit,
            epoch: 0,
            inflight_at_closing: None,
            inflight_at_steering: None,
            late: 0,
            zero_reads: 0,
            closing_us: now_us,
            steered_us: 0,
            last_active_us: now_us,
            acked_us: 0,
            expires_us: now_us.saturating_add(micros(limits.closing_ttl)),
        });
        Change::Closing
    }

    /// The admin lists the host at entry `i` with `health`.
    fn listed(&mut self, i: usize, health: Health, now_us: u64, limits: &Limits) -> Change {
        let Some(h) = self.hosts.get_mut(i) else {
            return Change::Unchanged;
        };
        let returned = h.sources & source::REMOVED != 0;
        let serving = match health {
            _ if returned => true,
            Health::Healthy => now_us >= h.expires_us || h.sources == source::DRAINING,
            Health::Draining => return add_source(h, source::DRAINING),
            Health::Other => false,
        };
        if !serving {
            return Change::Unchanged;
        }
        let ip = h.ip;
        self.hosts.remove(i);
        if health == Health::Draining {
            // Came back draining: closing afresh (the slot just freed).
            self.insert(ip, source::DRAINING, now_us, limits);
        }
        Change::Serving
    }
}

/// The host's own `closing` on an entry.
fn closing_again(h: &mut FrontHost, now_us: u64, limits: &Limits) -> Change {
    let expires = now_us.saturating_add(micros(limits.closing_ttl));
    if h.sources & source::HOST == 0 {
        h.sources |= source::HOST;
        h.expires_us = h.expires_us.max(expires);
        return Change::Closing;
    }
    if expires >= h.expires_us.saturating_add(WRITE_GRANULARITY_US) {
        h.expires_us = expires;
        return Change::Updated;
    }
    Change::Unchanged
}

fn add_source(h: &mut FrontHost, bit: u8) -> Change {
    if h.sources & bit != 0 {
        return Change::Unchanged;
    }
    h.sources |= bit;
    Change::Updated
}

fn steer(h: &mut FrontHost, epoch: u16, now_us: u64) -> Change {
    if h.state != State::Closing {
        return Change::Unchanged;
    }
    h.state = State::Steered;
    h.steered_us = now_us;
    h.epoch = epoch;
    h.zero_reads = 0;
    Change::Updated
}

fn unsteerable(h: &mut FrontHost) -> Change {
    if h.state != State::Steered {
        return Change::Unchanged;
    }
    h.state = State::Closing;
    h.steered_us = 0;
    h.inflight_at_steering = None;
    h.zero_reads = 0;
    Change::Updated
}

fn late(h: &mut FrontHost) -> Change {
    if h.state != State::Acknowledged {
        return Change::Unchanged;
    }
    h.late = h.late.saturating_add(1);
    Change::Late
}

/// One `rq_active` read (None: not listed in `/clusters`).
fn read(
    h: &mut FrontHost,
    active: Option<u32>,
    guard_clear: bool,
    now_us: u64,
    limits: &Limits,
) -> Change {
    match (h.state, active) {
        (State::Acknowledged, Some(n)) if n > 0 => late(h),
        (State::Acknowledged, _) => Change::Unchanged,
        (State::Closing, Some(n)) => read_closing(h, n, now_us),
        (State::Closing, None) => Change::Unchanged,
        (State::Steered, None) if guard_clear => acknowledge(h, now_us),
        (State::Steered, None) => Change::Unchanged,
        (State::Steered, Some(n)) if n > 0 => {
            let first = h.inflight_at_closing.is_none() || h.inflight_at_steering.is_none();
            let reset = h.zero_reads > 0;
            let due = now_us >= h.last_active_us.saturating_add(WRITE_GRANULARITY_US);
            if !(first || reset || due) {
                return Change::Unchanged;
            }
            h.inflight_at_closing.get_or_insert(count(n));
            h.inflight_at_steering.get_or_insert(count(n));
            h.zero_reads = 0;
            h.last_active_us = now_us;
            Change::Updated
        }
        (State::Steered, Some(_)) if h.zero_reads == 0 => {
            h.inflight_at_closing.get_or_insert(0);
            h.inflight_at_steering.get_or_insert(0);
            h.zero_reads = 1;
            h.last_active_us = now_us;
            Change::Updated
        }
        (State::Steered, Some(_)) => {
            let apart = now_us >= h.last_active_us.saturating_add(micros(limits.poll));
            if !(apart && guard_clear) {
                return Change::Unchanged;
            }
            h.zero_reads = h.zero_reads.saturating_add(1);
            acknowledge(h, now_us)
        }
    }
}

fn read_closing(h: &mut FrontHost, n: u32, now_us: u64) -> Change {
    if h.inflight_at_closing.is_none() {
        h.inflight_at_closing = Some(count(n));
        if n > 0 {
            h.last_active_us = now_us;
        }
        return Change::Updated;
    }
    if n > 0 && now_us >= h.last_active_us.saturating_add(WRITE_GRANULARITY_US) {
        h.last_active_us = now_us;
        return Change::Updated;
    }
    Change::Unchanged
}

fn acknowledge(h: &mut FrontHost, now_us: u64) -> Change {
    h.state = State::Acknowledged;
    h.acked_us = now_us;
    Change::Acknowledged
}
