//! The front-proxy role's side of the consumer's decisions
//! (docs/design/front-proxy-drain.md §1–§3): what the front endpoints and
//! the front tick (`crate::consumer::filter`) ask of the tombstones, the
//! admin's membership and the steering plan.
//!
//! INTERFACE STUB: the signatures are fixed; the bodies are being written.

use std::collections::HashMap;
use std::net::Ipv6Addr;

use super::{Consumer, Effect};
use crate::shared::store::SharedStore;

/// What the admin's membership and the steering plans say of one host IP
/// (every member at it, in every cluster the admin lists).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FrontHostView {
    /// Some member at the IP is in the admin's membership.
    pub listed: bool,
    /// Some member at the IP is listed `DRAINING` (EDS health).
    pub draining: bool,
    /// Every member at the IP is listed `HEALTHY` (neither DRAINING nor
    /// otherwise unusable).
    pub healthy: bool,
    /// Every cluster with a member at the IP has an acceptable host known
    /// (one not tombstoned, not closing, not DRAINING), so a plan lists it
    /// and not this IP's members.
    pub steerable: bool,
}

impl Consumer {
    /// The members (cluster, `ip:port` address) at `ip` in the admin's
    /// membership as this copy last read it; empty: not a member (the
    /// front's `closing` then answers 403 `not_a_member`).
    pub fn front_members_at(&mut self, store: &dyn SharedStore, ip: Ipv6Addr) -> Vec<(String, String)> {
        let _ = (store, ip);
        Vec::new()
    }

    /// Tombstones every member at `ip` with the announced cause (lifted by
    /// no answer) until `now_us + ttl_us`, in one shared-data write, and
    /// returns the effects (the generation bump among them). Err: the
    /// write failed (the caller answers 503 and writes nothing else).
    pub fn announce_closing(
        &mut self,
        store: &dyn SharedStore,
        ip: Ipv6Addr,
        now_us: u64,
        ttl_us: u64,
    ) -> Result<Vec<Effect>, String> {
        let _ = (store, ip, now_us, ttl_us);
        Ok(Vec::new())
    }

    /// Removes the announced tombstones of every member at `ip` (the host
    /// said `serving`, or came back), in one write; Ok(empty) when there
    /// were none.
    pub fn lift_announced(
        &mut self,
        store: &dyn SharedStore,
        ip: Ipv6Addr,
        now_us: u64,
    ) -> Result<Vec<Effect>, String> {
        let _ = (store, ip, now_us);
        Ok(Vec::new())
    }

    /// How the admin's membership and the plans see each IP asked about
    /// (after syncing this copy's caches with shared data).
    pub fn front_view(
        &mut self,
        store: &dyn SharedStore,
        ips: &[Ipv6Addr],
        now_us: u64,
    ) -> HashMap<Ipv6Addr, FrontHostView> {
        let _ = (store, now_us);
        ips.iter().map(|ip| (*ip, FrontHostView::default())).collect()
    }

    /// IPs of members the admin lists `DRAINING` (the front's closing by
    /// the control plane), after syncing caches.
    pub fn front_draining(&mut self, store: &dyn SharedStore) -> Vec<Ipv6Addr> {
        let _ = store;
        Vec::new()
    }
}

/// Per-IP `rq_active` (summed over clusters and ports) from an admin
/// `/clusters?format=json` answer; an IP listed with no `rq_active` stat
/// reads 0 (Envoy omits zero stats). None: not a `/clusters` JSON answer.
pub fn parse_rq_active(body: &[u8]) -> Option<HashMap<Ipv6Addr, u32>> {
    let _ = body;
    None
}
