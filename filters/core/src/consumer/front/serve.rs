//! The front role over the host traits (docs/design/front-proxy-drain.md
//! §1, §3, §4): the endpoints ([`super::endpoints`]), the poll of the
//! admin's `/clusters` and the held long-polls, as methods of
//! [`ConsumerFilter`] that the glue calls beside the consumer's own. Only
//! the listener instance runs them, and only with `front` configured; the
//! endpoints only with `front.serve_endpoints`.
//!
//! | callback | does |
//! |---|---|
//! | request headers, a `/graceful/front/` path, `serve_endpoints` | answers it ([`super::endpoints`]) or holds a `drained?wait=` (at most `max_waiters` per Envoy); any other path: nothing (one header read) |
//! | `closing` from a member (or a host the table knows) | `Event::Closing` on the table (one CAS write, `.gen` bumped); full: 503, nothing written; then the announced tombstones ([`Consumer::announce_closing`], on every accepted `closing`: idempotent, so a retry after a failed write writes them) |
//! | `serving` | `Event::Serving`; its announced tombstones lifted |
//! | refused (untrusted peer, not a member, another `host=`) | 403, `graceful_front_refused` +1, nothing changed; one log line per copy per minute |
//! | tick, every copy | decodes the table again if `.gen` moved; answers held long-polls whose host is acknowledged (200) or serving (409), or whose wait ran out (503) |
//! | tick, the copy holding `graceful.v1.front.poll_lease` (one per `poll`) | `DRAINING` members become closing(draining); per host in the table: listed (its health) or left, steerable or not ([`Consumer::front_view`]); while a host is not acknowledged, `GET /clusters?format=json` to `admin_cluster` |
//! | `/clusters` answered | an `rq_active` read per host in the table ([`parse_rq_active`]; absent: it left `/clusters`) |
//! | a write acknowledging a host, or seeing it late | `graceful_front_acknowledged` / `graceful_front_late` +1, logged |
//! | a write making a host serving | its announced tombstones lifted |
//! | any table write | `graceful_front_closing` = the table's entries |
//!
//! A host with no member in the admin's membership but an entry in the
//! table (it left membership while its requests still run) is still
//! answered: its long-poll must end in an acknowledgement, not a 403.
//!
//! The guard of §3: a read's `guard_clear` is the grace count's
//! ([`super::grace`]): the slot of the requests that started before the
//! host's steering reads 0. A steering records the epoch it advanced to (or
//! the next, while the older slot is busy; a later poll advances). The
//! design's fence is not the guard: an upstream filter's local reply goes
//! to the client, not to the retry policy, so the upstream instance only
//! watches, counting an attempt at an acknowledged host as late
//! ([`ConsumerFilter::front_attempt_seen`]).

use std::net::Ipv6Addr;

use super::endpoints::{is_front_path, route, FrontEndpoint, FrontReply, FrontRoute, Refused};
use super::grace;
use super::{host_ip, Change, Event, FrontHosts, Health, State};
use crate::consumer::config::FrontConfig;
use crate::consumer::decisions::front::parse_rq_active;
use crate::consumer::decisions::{CALL_TIMEOUT, MAX_ADMIN_BODY};
use crate::consumer::filter::{carry_out, ConsumerCopy, ConsumerFilter};
use crate::consumer::steering::admin_clusters_path;
use crate::drain::Waiters;
use crate::shared::duration::micros;
use crate::shared::headers::{ADMIN_AUTHORITY, AUTHORITY, FORWARDED_FOR, METHOD, PATH, STATUS};
use crate::shared::host::HostMetrics;
use crate::shared::host::{
    Action, Attribute, CallResponse, Host, HttpCall, Level, LocalReply, Map, StateCell, Stream,
};
use crate::shared::keys::{FRONT_HOSTS, FRONT_HOSTS_GEN, FRONT_POLL_LEASE, FRONT_WAITERS};
use crate::shared::metrics::Metric;
use crate::shared::net::trusted_peer_ip;
use crate::shared::store::{add_bounded, read_u64, take_lease, update, SharedStore, UpdateError};

/// A copy logs at most one refusal this often (µs): a caller cannot fill
/// the log.
const REFUSAL_LOG_EVERY_US: u64 = 60_000_000;

/// One copy's front state (a wasm VM copy's; natively the config's one):
/// the table as last decoded, its held long-polls and its `/clusters`
/// call. `W` wakes a held long-poll ([`Waiters`]).
#[derive(Debug)]
pub struct FrontCopy<W = ()> {
    hosts: FrontHosts,
    /// `graceful.v1.front.hosts.gen` when `hosts` was decoded (None: decode
    /// at the next look).
    gen: Option<u64>,
    /// Each held long-poll with the host it waits for.
    waiters: Waiters<(Ipv6Addr, W)>,
    /// Woken long-polls not answered yet, with their host.
    woken: Vec<(u32, Ipv6Addr)>,
    /// Token of the `/clusters` call in flight.
    poll_call: Option<u32>,
    /// When this copy last logged a refusal (µs).
    refusal_logged_us: Option<u64>,
}

impl<W> Default for FrontCopy<W> {
    fn default() -> Self {
        FrontCopy {
            hosts: FrontHosts::default(),
            gen: None,
            waiters: Waiters::default(),
            woken: Vec::new(),
            poll_call: None,
            refusal_logged_us: None,
        }
    }
}

impl<W> FrontCopy<W> {
    /// Long-polls held.
    pub fn held(&self) -> usize {
        self.waiters.len()
    }

    /// The table as this copy last decoded it.
    pub fn hosts(&self) -> &FrontHosts {
        &self.hosts
    }
}

/// Decodes the table again if `.gen` moved since this copy looked (an
/// unreadable table keeps the cached one).
fn refresh<W>(front: &impl StateCell<FrontCopy<W>>, store: &dyn SharedStore) {
    let gen = read_key_u64(store, FRONT_HOSTS_GEN.name);
    if gen.is_some() && front.with(|f| f.gen == gen) {
        return;
    }
    let hosts = store
        .get(FRONT_HOSTS.name)
        .ok()
        .flatten()
        .and_then(|(bytes, _)| FrontHosts::decode(&bytes));
    if let Some(hosts) = hosts {
        front.with(|f| {
            f.hosts = hosts;
            f.gen = gen;
        });
    }
}

fn read_key_u64(store: &dyn SharedStore, key: &str) -> Option<u64> {
    store
        .get(key)
        .ok()
        .flatten()
        .and_then(|(bytes, _)| read_u64(&bytes))
}

/// What a write did: each event with its change, the table after, and
/// whether it was written.
type Written = (Vec<(Ipv6Addr, Event, Change)>, FrontHosts, bool);

/// Applies `events` in order to the table in shared data, in one CAS
/// write (none if nothing changed), then bumps `.gen`. A table that does
/// not decode is taken as empty (and so replaced).
fn write_events(
    store: &dyn SharedStore,
    events: &[(Ipv6Addr, Event)],
    now_us: u64,
    front: &FrontConfig,
) -> Result<Written, UpdateError> {
    let limits = front.limits();
    let (changes, hosts, written) = update(store, FRONT_HOSTS.name, |bytes| {
        let mut hosts = bytes.and_then(FrontHosts::decode).unwrap_or_default();
        let changes: Vec<_> = events
            .iter()
            .map(|(ip, e)| (*ip, *e, hosts.apply(*ip, *e, now_us, &limits)))
            .collect();
        let written = changes.iter().any(|(_, _, c)| c.written());
        (written.then(|| hosts.encode()), (changes, hosts, written))
    })?;
    if written {
        add_bounded(store, FRONT_HOSTS_GEN.name, 1, u64::MAX)?;
    }
    Ok((changes, hosts, written))
}

/// Sends one of the front's answers.
fn send(s: &impl Stream, reply: &FrontReply) {
    let headers: Vec<(&str, &str)> = reply
        .headers
        .iter()
        .map(|(k, v)| (*k, v.as_str()))
        .collect();
    s.send_reply(&LocalReply {
        status: reply.status,
        headers: &headers,
        body: reply.body.as_bytes(),
        grpc_status: None,
        details: "graceful_consumer_front",
    });
}

/// Whether a held long-poll for `ip` is answered now: its host is
/// acknowledged, or serving (no entry).
fn settled(hosts: &FrontHosts, ip: Ipv6Addr) -> bool {
    hosts.get(ip).is_none_or(|h| h.state == State::Acknowledged)
}

impl ConsumerFilter {
    /// `front`, where this instance acts on it (the listener's).
    fn front(&self) -> Option<&FrontConfig> {
        self.config().front.as_ref().filter(|_| !self.is_upstream())
    }

    /// A request's headers, before [`ConsumerFilter::request_headers`]:
    /// Some when it was a front endpoint (answered, or held: `waiter` gives
    /// its id and wake handle); None for every other request, and on a
    /// listener without `front.serve_endpoints` (read nothing).
    pub fn front_request_headers<W>(
        &self,
        front: &impl StateCell<FrontCopy<W>>,
        copy: &impl StateCell<ConsumerCopy>,
        s: &impl Stream,
        waiter: impl FnOnce() -> (u32, W),
    ) -> Option<Action> {
        let fc = self.front().filter(|f| f.serve_endpoints)?;
        let path = s.header(Map::RequestHeaders, PATH)?;
        if !is_front_path(&path) {
            return None;
        }
        let method = s.header(Map::RequestHeaders, METHOD)?;
        let reply = match route(&method, &path) {
            FrontRoute::Pass => return None,
            FrontRoute::MethodNotAllowed(allow) => FrontReply::method_not_allowed(allow),
            FrontRoute::BadRequest(reason) => FrontReply::bad_request(&reason),
            FrontRoute::Endpoint(endpoint, host) => {
                match self.front_answer(fc, front, copy, s, endpoint, host, waiter) {
                    Some(reply) => reply,
                    None => return Some(Action::Stop),
                }
            }
        };
        send(s, &reply);
        Some(Action::Stop)
    }

    /// An endpoint's answer; None: held.
    #[allow(clippy::too_many_arguments)]
    fn front_answer<W>(
        &self,
        fc: &FrontConfig,
        front: &impl StateCell<FrontCopy<W>>,
        copy: &impl StateCell<ConsumerCopy>,
        s: &impl Stream,
        endpoint: FrontEndpoint,
        host: Option<Ipv6Addr>,
        waiter: impl FnOnce() -> (u32, W),
    ) -> Option<FrontReply> {
        let now = s.now_us();
        let ip = match self.front_source(front, copy, s, host, now) {
            Ok(ip) => ip,
            Err(refused) => return Some(refused),
        };
        Some(match endpoint {
            FrontEndpoint::Closing => self.front_closing(fc, front, copy, s, ip, now),
            FrontEndpoint::Serving => self.front_serving(fc, front, copy, s, ip, now),
            FrontEndpoint::Status => FrontReply::status(200, &front.with(|f| f.hosts.status(ip))),
            FrontEndpoint::Drained { wait } => {
                let status = front.with(|f| f.hosts.status(ip));
                let pending = matches!(status.state, "closing" | "steered");
                let Some(wait) = wait.filter(|_| pending) else {
                    return Some(FrontReply::drained(&status));
                };
                let max = u64::from(fc.max_waiters);
                match add_bounded(s.store(), FRONT_WAITERS.name, 1, max) {
                    Ok(Some(_)) => {
                        let (id, wake) = waiter();
                        let deadline = now.saturating_add(micros(wait));
                        front.with(|f| f.waiters.hold(id, (ip, wake), deadline));
                        return None;
                    }
                    Ok(None) => FrontReply::too_many_waiters(),
                    Err(e) => FrontReply::unavailable(&format!("{e:?}")),
                }
            }
        })
    }

    /// The request's source as a host IP, or the 403 to answer: a trusted
    /// peer (never a forwarded address), naming no other `host=`, a member
    /// or a host the table knows.
    fn front_source<W>(
        &self,
        front: &impl StateCell<FrontCopy<W>>,
        copy: &impl StateCell<ConsumerCopy>,
        s: &impl Stream,
        host: Option<Ipv6Addr>,
        now: u64,
    ) -> Result<Ipv6Addr, FrontReply> {
        let source = s.attribute(Attribute::SourceAddress);
        let xff = s.header(Map::RequestHeaders, FORWARDED_FOR);
        let peer = source
            .as_deref()
            .and_then(|a| trusted_peer_ip(a, xff.as_deref()))
            .map(host_ip);
        let refused = match peer {
            None => Refused::UntrustedPeer,
            Some(ip) if host.is_some_and(|h| h != ip) => Refused::NotYourAddress,
            Some(ip) => {
                refresh(front, s.store());
                let known = front.with(|f| f.hosts.get(ip).is_some())
                    || !copy
                        .with(|c| c.core_mut().front_members_at(s.store(), ip))
                        .is_empty();
                if known {
                    return Ok(ip);
                }
                Refused::NotAMember
            }
        };
        s.metric_add(Metric::FrontRefused, 1);
        let due = front.with(|f| {
            let due = f
                .refusal_logged_us
                .is_none_or(|at| now >= at.saturating_add(REFUSAL_LOG_EVERY_US));
            if due {
                f.refusal_logged_us = Some(now);
            }
            due
        });
        if due {
            let from = source.map_or("unknown".into(), |a| {
                String::from_utf8_lossy(&a).into_owned()
            });
            s.log(
                Level::Warn,
                &format!(
                    "front: request from {from} refused ({}); more refusals this minute are counted in graceful_front_refused, not logged",
                    refused.name()
                ),
            );
        }
        Err(FrontReply::refused(refused))
    }

    /// `closing` from `ip` itself.
    fn front_closing<W>(
        &self,
        fc: &FrontConfig,
        front: &impl StateCell<FrontCopy<W>>,
        copy: &impl StateCell<ConsumerCopy>,
        s: &impl Stream,
        ip: Ipv6Addr,
        now: u64,
    ) -> FrontReply {
        let (changes, hosts) =
            match self.front_write(fc, front, copy, s, &[(ip, Event::Closing)], now) {
                Ok(done) => done,
                Err(e) => return FrontReply::unavailable(&format!("{e:?}")),
            };
        if changes.contains(&Change::Full) {
            return FrontReply::table_full();
        }
        let ttl = micros(fc.closing_ttl);
        match copy.with(|c| c.core_mut().announce_closing(s.store(), ip, now, ttl)) {
            Ok(effects) => carry_out(s, effects),
            Err(e) => return FrontReply::unavailable(&e),
        }
        if changes.contains(&Change::Closing) {
            s.log(
                Level::Info,
                &format!(
                    "front: host {} closing: it asked (announced tombstones written)",
                    shown(ip)
                ),
            );
        }
        FrontReply::status(202, &hosts.status(ip))
    }

    /// `serving` from `ip` itself: its entry and announced tombstones go.
    fn front_serving<W>(
        &self,
        fc: &FrontConfig,
        front: &impl StateCell<FrontCopy<W>>,
        copy: &impl StateCell<ConsumerCopy>,
        s: &impl Stream,
        ip: Ipv6Addr,
        now: u64,
    ) -> FrontReply {
        let hosts = match self.front_write(fc, front, copy, s, &[(ip, Event::Serving)], now) {
            Ok((_, hosts)) => hosts,
            Err(e) => return FrontReply::unavailable(&format!("{e:?}")),
        };
        // Lifted even with no entry: a table lost to a failed write must
        // not leave tombstones only `closing_ttl` ends.
        match copy.with(|c| c.core_mut().lift_announced(s.store(), ip, now)) {
            Ok(effects) => carry_out(s, effects),
            Err(e) => return FrontReply::unavailable(&e),
        }
        FrontReply::status(202, &hosts.status(ip))
    }

    /// Writes `events`, caches the table written, sets the closing gauge
    /// and carries out what each change asks (but `closing`'s
    /// announcement: its caller's). The changes and the table come back.
    fn front_write<W>(
        &self,
        fc: &FrontConfig,
        front: &impl StateCell<FrontCopy<W>>,
        copy: &impl StateCell<ConsumerCopy>,
        h: &(impl Host + ?Sized),
        events: &[(Ipv6Addr, Event)],
        now: u64,
    ) -> Result<(Vec<Change>, FrontHosts), UpdateError> {
        let (changes, hosts, written) = write_events(h.store(), events, now, fc)?;
        if written {
            h.metric_set(Metric::FrontClosing, hosts.hosts().len() as u64);
            front.with(|f| {
                f.hosts = hosts.clone();
                // Another copy may write between this write and the bump:
                // decode again at the next look.
                f.gen = None;
            });
        }
        for (ip, event, change) in &changes {
            self.front_effects(copy, h, *ip, *event, *change, &hosts, now);
        }
        Ok((changes.into_iter().map(|(_, _, c)| c).collect(), hosts))
    }

    /// What one change asks beside the write.
    #[allow(clippy::too_many_arguments)]
    fn front_effects(
        &self,
        copy: &impl StateCell<ConsumerCopy>,
        h: &(impl Host + ?Sized),
        ip: Ipv6Addr,
        event: Event,
        change: Change,
        hosts: &FrontHosts,
        now: u64,
    ) {
        match change {
            Change::Acknowledged => {
                h.metric_add(Metric::FrontAcknowledged, 1);
                let figures = serde_json::to_string(&hosts.status(ip)).unwrap_or_default();
                h.log(
                    Level::Info,
                    &format!("front: host {} acknowledged: {figures}", shown(ip)),
                );
            }
            Change::Late => {
                h.metric_add(Metric::FrontLate, 1);
                h.log(
                    Level::Warn,
                    &format!(
                        "front: host {} reached after its acknowledgement ({event:?})",
                        shown(ip)
                    ),
                );
            }
            // The host's own `serving` lifts them itself, with no entry too.
            Change::Serving if event != Event::Serving => {
                match copy.with(|c| c.core_mut().lift_announced(h.store(), ip, now)) {
                    Ok(effects) => carry_out(h, effects),
                    Err(e) => h.log(
                        Level::Warn,
                        &format!(
                            "front: host {} serving, its tombstones not lifted: {e}",
                            shown(ip)
                        ),
                    ),
                }
            }
            Change::Closing if event != Event::Closing => h.log(
                Level::Info,
                &format!("front: host {} closing: {event:?}", shown(ip)),
            ),
            _ => {}
        }
    }

    /// A held long-poll the tick woke: the status of its host now (200
    /// acknowledged, 409 serving, else 503: its wait ran out).
    pub fn front_answer_woken<W>(
        &self,
        front: &impl StateCell<FrontCopy<W>>,
        s: &impl Stream,
        id: u32,
    ) {
        let ip = front.with(|f| {
            let i = f.woken.iter().position(|(w, _)| *w == id)?;
            Some(f.woken.swap_remove(i).1)
        });
        let Some(ip) = ip else {
            return;
        };
        refresh(front, s.store());
        send(s, &FrontReply::drained(&front.with(|f| f.hosts.status(ip))));
    }

    /// A stream with long-poll `id` ended: one not answered yet frees its
    /// slot. Takes the copy locked: the native module deletes the stream's
    /// wake handle under the same lock.
    pub fn front_release<W>(&self, f: &mut FrontCopy<W>, h: &(impl Host + ?Sized), id: u32) {
        if f.waiters.release(id) {
            let _ = add_bounded(h.store(), FRONT_WAITERS.name, -1, u64::MAX);
        }
        f.woken.retain(|(w, _)| *w != id);
    }

    /// The front's tick (see the module table): `wake` is called for each
    /// long-poll to answer, under the copy's lock; they are returned too.
    pub fn front_tick<W>(
        &self,
        front: &impl StateCell<FrontCopy<W>>,
        copy: &impl StateCell<ConsumerCopy>,
        h: &impl Host,
        mut wake: impl FnMut(u32, &W),
    ) -> Vec<(u32, W)> {
        let Some(fc) = self.front() else {
            return Vec::new();
        };
        let now = h.now_us();
        refresh(front, h.store());
        self.front_poll(fc, front, copy, h, now);
        front.with(|f| {
            let hosts = &f.hosts;
            let due = f.waiters.take_due_by(now, |(ip, _)| settled(hosts, *ip));
            due.into_iter()
                .map(|(id, (ip, w))| {
                    let _ = add_bounded(h.store(), FRONT_WAITERS.name, -1, u64::MAX);
                    f.woken.push((id, ip));
                    wake(id, &w);
                    (id, w)
                })
                .collect()
        })
    }

    /// The lease holder's look at the admin's view of every host in the
    /// table (and at `DRAINING` members), and its `/clusters` call.
    fn front_poll<W>(
        &self,
        fc: &FrontConfig,
        front: &impl StateCell<FrontCopy<W>>,
        copy: &impl StateCell<ConsumerCopy>,
        h: &impl Host,
        now: u64,
    ) {
        let store = h.store();
        if !take_lease(store, FRONT_POLL_LEASE.name, now, micros(fc.poll)).unwrap_or(false) {
            return;
        }
        let table: Vec<Ipv6Addr> = front.with(|f| f.hosts.hosts().iter().map(|h| h.ip).collect());
        let draining: Vec<Ipv6Addr> = copy
            .with(|c| c.core_mut().front_draining(store))
            .into_iter()
            .filter(|ip| !table.contains(ip))
            .collect();
        let mut events: Vec<(Ipv6Addr, Event)> = draining
            .iter()
            .map(|ip| (*ip, Event::Listed(Health::Draining)))
            .collect();
        if !table.is_empty() {
            let views = copy.with(|c| c.core_mut().front_view(store, &table, now));
            let epoch = self.front_epoch(front, h, &views);
            for ip in &table {
                let v = views.get(ip).cloned().unwrap_or_default();
                events.push((*ip, listed_event(v.listed, v.draining, v.healthy)));
                let steered = if v.steerable {
                    Event::Steered { epoch }
                } else {
                    Event::Unsteerable
                };
                events.push((*ip, steered));
            }
        }
        let hosts = if events.is_empty() {
            front.with(|f| f.hosts.clone())
        } else {
            match self.front_write(fc, front, copy, h, &events, now) {
                Ok((_, hosts)) => hosts,
                Err(e) => {
                    h.log(
                        Level::Warn,
                        &format!("front: table not written this poll: {e:?}"),
                    );
                    return;
                }
            }
        };
        self.front_read_active(front, copy, h, &hosts);
    }

    /// The grace count's epoch a steering now advances to (stored in the
    /// entry it steers): advanced when a host is to be steered or one
    /// steered still waits for its advance, and the older slot reads 0;
    /// else the next epoch, which a later poll advances to (its
    /// acknowledgement waits for that).
    fn front_epoch<W>(
        &self,
        front: &impl StateCell<FrontCopy<W>>,
        h: &impl Host,
        views: &std::collections::HashMap<
            Ipv6Addr,
            crate::consumer::decisions::front::FrontHostView,
        >,
    ) -> u16 {
        let m = HostMetrics(h);
        let epoch = h.metric_get(Metric::FrontEpoch).unwrap_or(0);
        let wanted = front.with(|f| {
            f.hosts.hosts().iter().any(|x| match x.state {
                State::Closing => views.get(&x.ip).is_some_and(|v| v.steerable),
                State::Steered => grace::ahead(x.epoch, epoch),
                State::Acknowledged => false,
            })
        });
        match wanted.then(|| grace::advance(&m)).flatten() {
            Some(advanced) => grace::stored(advanced),
            None => grace::stored(epoch.wrapping_add(1)),
        }
    }

    /// While a host is not acknowledged, one `/clusters` call in flight:
    /// filtered to the clusters of the hosts' members when every such host
    /// has one (a host that left membership may still be listed there).
    fn front_read_active<W>(
        &self,
        front: &impl StateCell<FrontCopy<W>>,
        copy: &impl StateCell<ConsumerCopy>,
        h: &impl Host,
        hosts: &FrontHosts,
    ) {
        let pending: Vec<Ipv6Addr> = hosts
            .hosts()
            .iter()
            .filter(|x| x.state != State::Acknowledged)
            .map(|x| x.ip)
            .collect();
        let Some(admin) = self.config().admin_cluster.as_deref() else {
            return;
        };
        if pending.is_empty() || front.with(|f| f.poll_call.is_some()) {
            return;
        }
        let mut clusters: Vec<String> = Vec::new();
        let mut every_one_listed = true;
        for ip in &pending {
            let members = copy.with(|c| c.core_mut().front_members_at(h.store(), *ip));
            every_one_listed &= !members.is_empty();
            clusters.extend(members.into_iter().map(|(cluster, _)| cluster));
        }
        clusters.sort();
        clusters.dedup();
        let path = if every_one_listed {
            let names: Vec<&str> = clusters.iter().map(String::as_str).collect();
            admin_clusters_path(&names)
        } else {
            "/clusters?format=json".to_string()
        };
        let headers = [
            (METHOD, "GET"),
            (PATH, path.as_str()),
            (AUTHORITY, ADMIN_AUTHORITY),
        ];
        let call = HttpCall {
            cluster: admin,
            headers: &headers,
            body: &[],
            timeout: CALL_TIMEOUT,
        };
        match h.dispatch(&call) {
            Ok(token) => front.with(|f| f.poll_call = Some(token)),
            Err(reason) => h.log(
                Level::Warn,
                &format!("front: /clusters not asked of cluster {admin:?}: {reason}"),
            ),
        }
    }

    /// An answer to one of the front's calls: true if it was one (the
    /// consumer's own `call_answered` is then not asked).
    pub fn front_call_answered<W>(
        &self,
        front: &impl StateCell<FrontCopy<W>>,
        copy: &impl StateCell<ConsumerCopy>,
        h: &impl Host,
        token: u32,
        answer: &impl CallResponse,
    ) -> bool {
        let ours = front.with(|f| {
            let ours = f.poll_call == Some(token);
            if ours {
                f.poll_call = None;
            }
            ours
        });
        let Some(fc) = self.front().filter(|_| ours) else {
            return ours;
        };
        if answer.header(STATUS).as_deref() != Some(b"200") {
            return true;
        }
        let Some(active) = parse_rq_active(&answer.body(MAX_ADMIN_BODY)) else {
            return true;
        };
        refresh(front, h.store());
        // The guard (§3): the grace slot of the requests that started
        // before its steering; read only for hosts that may be acknowledged.
        let m = HostMetrics(h);
        let events: Vec<(Ipv6Addr, Event)> = front.with(|f| {
            f.hosts
                .hosts()
                .iter()
                .map(|x| {
                    let active = active.get(&x.ip).copied();
                    let guard_clear = x.state == State::Steered && grace::clear(&m, x.epoch);
                    (
                        x.ip,
                        Event::Read {
                            active,
                            guard_clear,
                        },
                    )
                })
                .collect()
        });
        if let Err(e) = self.front_write(fc, front, copy, h, &events, h.now_us()) {
            h.log(
                Level::Warn,
                &format!("front: rq_active read not written: {e:?}"),
            );
        }
        true
    }
}

impl ConsumerFilter {
    /// The upstream instance saw an attempt at `address`, a closing host:
    /// one at a host the table holds acknowledged is late
    /// (`Event::Attempt`). The table is read only here (attempts at a
    /// closing host are rare once steering holds).
    pub fn front_attempt_seen(&self, h: &(impl Host + ?Sized), address: &str, now: u64) {
        let Some(fc) = self.config().front.as_ref() else {
            return;
        };
        let Some(ip) = crate::consumer::steering::member_ip(address) else {
            return;
        };
        let acknowledged = h
            .store()
            .get(FRONT_HOSTS.name)
            .ok()
            .flatten()
            .and_then(|(bytes, _)| FrontHosts::decode(&bytes))
            .and_then(|t| t.get(ip).map(|x| x.state == State::Acknowledged))
            .unwrap_or(false);
        if !acknowledged {
            return;
        }
        match write_events(h.store(), &[(ip, Event::Attempt)], now, fc) {
            Ok((changes, _, _)) => {
                if changes.iter().any(|(_, _, c)| *c == Change::Late) {
                    h.metric_add(Metric::FrontLate, 1);
                    h.log(
                        Level::Warn,
                        &format!(
                            "front: host {} reached after its acknowledgement (an attempt at it)",
                            shown(ip)
                        ),
                    );
                }
            }
            Err(e) => h.log(
                Level::Warn,
                &format!("front: a late attempt at {} not written: {e:?}", shown(ip)),
            ),
        }
    }
}

/// What the admin's membership says of a host in the table.
fn listed_event(listed: bool, draining: bool, healthy: bool) -> Event {
    match (listed, draining, healthy) {
        (false, _, _) => Event::Left,
        (true, true, _) => Event::Listed(Health::Draining),
        (true, false, true) => Event::Listed(Health::Healthy),
        (true, false, false) => Event::Listed(Health::Other),
    }
}

/// A host IP as logs show it (an IPv4 host as IPv4).
pub fn shown(ip: Ipv6Addr) -> String {
    ip.to_ipv4_mapped()
        .map_or_else(|| ip.to_string(), |v4| v4.to_string())
}

#[cfg(test)]
#[path = "serve_tests.rs"]
mod tests;
