//! The front's host table in shared data (`graceful.v1.front.hosts`,
//! docs/design/front-proxy-drain.md §7): fixed little-endian, bounded,
//! versioned.
//!
//! Layout: u8 version (1), u16 count, then per host [`ENTRY_LEN`] bytes:
//! IP (16, IPv4 mapped), u8 state (1 closing, 2 steered, 3 acknowledged),
//! u8 sources (1 host, 2 draining, 4 removed; at least one), u16 epoch,
//! u32 `inflight_at_closing`, u32 `inflight_at_steering` (`u32::MAX`:
//! unread), u32 `late`, u32 `zero_reads`, then u64 `closing_us`,
//! `steered_us`, `last_active_us`, `acked_us`, `expires_us`. At most
//! [`MAX_HOSTS_CEILING`] hosts, each IP once. The empty table is
//! `[1, 0, 0]`. [`FrontHosts::decode`] refuses anything else: another
//! version, a count beyond the ceiling, a length that is not exactly the
//! count's, an unknown state or source bit, an IP twice.

use std::net::Ipv6Addr;

use super::{source, FrontHost, FrontHosts, State, UNREAD};

/// The layout's version byte.
pub const VERSION: u8 = 1;
/// Bytes per host.
pub const ENTRY_LEN: usize = 76;
/// The most hosts a table holds, whatever `max_hosts` says (76 KiB).
pub const MAX_HOSTS_CEILING: usize = 1024;
/// Version and count.
const HEADER_LEN: usize = 3;

fn state_byte(state: State) -> u8 {
    match state {
        State::Closing => 1,
        State::Steered => 2,
        State::Acknowledged => 3,
    }
}

fn state_of(byte: u8) -> Option<State> {
    match byte {
        1 => Some(State::Closing),
        2 => Some(State::Steered),
        3 => Some(State::Acknowledged),
        _ => None,
    }
}

impl FrontHosts {
    /// The table as stored (see the module's layout).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.hosts.len() * ENTRY_LEN);
        out.push(VERSION);
        // Bounded at MAX_HOSTS_CEILING by every insertion.
        out.extend_from_slice(&(self.hosts.len() as u16).to_le_bytes());
        for h in &self.hosts {
            encode_host(h, &mut out);
        }
        out
    }

    /// None for anything [`FrontHosts::encode`] did not write.
    pub fn decode(bytes: &[u8]) -> Option<FrontHosts> {
        let (header, body) = bytes.split_first_chunk::<HEADER_LEN>()?;
        let [version, lo, hi] = *header;
        let count = usize::from(u16::from_le_bytes([lo, hi]));
        if version != VERSION || count > MAX_HOSTS_CEILING || body.len() != count * ENTRY_LEN {
            return None;
        }
        let mut hosts: Vec<FrontHost> = Vec::with_capacity(count);
        for chunk in body.chunks_exact(ENTRY_LEN) {
            let h = decode_host(chunk)?;
            if hosts.iter().any(|other| other.ip == h.ip) {
                return None;
            }
            hosts.push(h);
        }
        Some(FrontHosts { hosts })
    }
}

fn encode_host(h: &FrontHost, out: &mut Vec<u8>) {
    out.extend_from_slice(&h.ip.octets());
    out.push(state_byte(h.state));
    out.push(h.sources);
    out.extend_from_slice(&h.epoch.to_le_bytes());
    for n in [
        h.inflight_at_closing.unwrap_or(UNREAD),
        h.inflight_at_steering.unwrap_or(UNREAD),
        h.late,
        h.zero_reads,
    ] {
        out.extend_from_slice(&n.to_le_bytes());
    }
    for t in [
        h.closing_us,
        h.steered_us,
        h.last_active_us,
        h.acked_us,
        h.expires_us,
    ] {
        out.extend_from_slice(&t.to_le_bytes());
    }
}

/// One host's [`ENTRY_LEN`] bytes.
fn decode_host(chunk: &[u8]) -> Option<FrontHost> {
    let mut r = Reader(chunk);
    let ip = Ipv6Addr::from(r.array::<16>()?);
    let state = state_of(r.u8()?)?;
    let sources = r.u8()?;
    if sources == 0 || sources & !source::ALL != 0 {
        return None;
    }
    let epoch = u16::from_le_bytes(r.array()?);
    let read = |n: u32| (n != UNREAD).then_some(n);
    let inflight_at_closing = read(u32::from_le_bytes(r.array()?));
    let inflight_at_steering = read(u32::from_le_bytes(r.array()?));
    let late = u32::from_le_bytes(r.array()?);
    let zero_reads = u32::from_le_bytes(r.array()?);
    let mut times = [0u64; 5];
    for t in &mut times {
        *t = u64::from_le_bytes(r.array()?);
    }
    let [closing_us, steered_us, last_active_us, acked_us, expires_us] = times;
    r.0.is_empty().then_some(FrontHost {
        ip,
        state,
        sources,
        epoch,
        inflight_at_closing,
        inflight_at_steering,
        late,
        zero_reads,
        closing_us,
        steered_us,
        last_active_us,
        acked_us,
        expires_us,
    })
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, tail) = self.0.split_first_chunk::<N>()?;
        self.0 = tail;
        Some(*head)
    }

    fn u8(&mut self) -> Option<u8> {
        let [b] = self.array::<1>()?;
        Some(b)
    }
}
