//! Source-address checks for the drain filter's closing endpoint: CIDR ranges,
//! and the `ip:port` strings Envoy gives for `source.address`.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

/// An address range such as `10.0.0.0/8` or `::1/128`. A bare address means
/// that one address. Host bits past the prefix are cleared, as Go's
/// `net.ParseCIDR` does, so `10.1.2.3/8` is `10.0.0.0/8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// True when `ip` lies in this range. IPv4-mapped IPv6 addresses
    /// (`::ffff:127.0.0.1`, what a dual-stack listener reports for IPv4
    /// peers) are compared as the IPv4 address they carry.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => mask_v4(ip, self.prefix) == net,
            (IpAddr::V6(net), IpAddr::V6(ip)) => mask_v6(ip, self.prefix) == net,
            _ => false,
        }
    }
}

fn mask_v4(ip: Ipv4Addr, prefix: u8) -> Ipv4Addr {
    let bits = u32::from(ip);
    let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
    Ipv4Addr::from(bits & mask)
}

fn mask_v6(ip: Ipv6Addr, prefix: u8) -> Ipv6Addr {
    let bits = u128::from(ip);
    let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
    Ipv6Addr::from(bits & mask)
}

/// Why a CIDR string was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CidrError(String);

impl fmt::Display for CidrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = |why: &str| CidrError(format!("invalid address range {text:?}: {why}"));
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| err("not an IP address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) if !p.is_empty() && p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit()) => {
                p.parse::<u8>().map_err(|_| err("bad prefix length"))?
            }
            Some(_) => return Err(err("bad prefix length")),
        };
        if prefix > max {
            return Err(err(&format!("prefix length above {max}")));
        }
        // A range written in IPv4-mapped form (`::ffff:10.0.0.0/104`) is the
        // IPv4 range it carries: `contains` compares mapped peers as IPv4,
        // so kept as IPv6 it would match nothing.
        let (addr, prefix) = match addr {
            IpAddr::V6(v6) if prefix >= 96 => match v6.to_ipv4_mapped() {
                Some(v4) => (IpAddr::V4(v4), prefix - 96),
                None => (addr, prefix),
            },
            _ => (addr, prefix),
        };
        let network = match addr {
            IpAddr::V4(ip) => IpAddr::V4(mask_v4(ip, prefix)),
            IpAddr::V6(ip) => IpAddr::V6(mask_v6(ip, prefix)),
        };
        Ok(Cidr { network, prefix })
    }
}

/// [`Cidr`]'s written form, for the schema: what `from_str` accepts,
/// spelled as Rust's address parsers read addresses (RFC 3986's IPv6
/// grammar with an IPv4 tail; IPv4 octets without leading zeros), then an
/// optional prefix length of 1 to 3 digits no longer than the address.
#[cfg(feature = "schema")]
impl schemars::JsonSchema for Cidr {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "cidr".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let octet = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])";
        let v4 = format!("{octet}(\\.{octet}){{3}}");
        let h16 = "[0-9A-Fa-f]{1,4}";
        let ls32 = format!("({h16}:{h16}|{v4})");
        // The address as eight 16-bit groups, the last two of which may be
        // an IPv4 address, and `::` standing for one or more zero groups.
        let mut v6 = vec![format!("({h16}:){{6}}{ls32}")];
        for after in 0..=7usize {
            // `after` groups follow `::` (ls32 counting as two), so at most
            // 7 - after come before it.
            let tail = match after {
                0 => String::new(),
                1 => h16.to_string(),
                n => format!("({h16}:){{{}}}{ls32}", n - 2),
            };
            let head = match 7 - after {
                0 => String::new(),
                n => format!("(({h16}:){{0,{}}}{h16})?", n - 1),
            };
            v6.push(format!("{head}::{tail}"));
        }
        let v6 = v6.join("|");
        // 1 to 3 digits (leading zeros allowed) worth at most 32, or 128.
        let v4_prefix = "0?0?[0-9]|0?[12][0-9]|0?3[0-2]";
        let v6_prefix = "0?0?[0-9]|0?[1-9][0-9]|1[01][0-9]|12[0-8]";
        schemars::json_schema!({
            "type": "string",
            "pattern": format!("^({v4}(/({v4_prefix}))?|({v6})(/({v6_prefix}))?)$"),
            "description": "An address range: an IPv4 or IPv6 address with an optional prefix length (\"10.0.0.0/8\", \"::1/128\"); a bare address is that one address. Host bits past the prefix are ignored; an IPv4-mapped range (\"::ffff:10.0.0.0/104\") is the IPv4 range it carries.",
        })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// The IP a request's connection really came from, or None when that cannot
/// be known; callers treat None as "not an allowed source" (fail closed).
///
/// `source_address` is Envoy's `source.address` attribute: the downstream
/// remote address. With the HCM's default `use_remote_address: false`, Envoy
/// replaces it with the last `x-forwarded-for` entry, which any client can
/// write. An address taken from a header has no port (`10.0.0.1:0`), while a
/// real peer always has one, so port 0 is refused; so is an address equal to
/// the last `x-forwarded-for` entry written as `ip:port`, in case a parser
/// ever keeps a port from the header. With `use_remote_address: true` Envoy
/// appends the real peer's bare IP to the header, which never equals
/// `ip:port`, so real peers pass in both modes.
pub fn trusted_peer_ip(source_address: &[u8], xff: Option<&[u8]>) -> Option<IpAddr> {
    let text = std::str::from_utf8(source_address).ok()?;
    let peer = SocketAddr::from_str(text).ok()?;
    if peer.port() == 0 {
        return None;
    }
    let last_forwarded = xff
        .and_then(|x| x.rsplit(|&b| b == b',').next())
        .map(|e| e.trim_ascii());
    if last_forwarded.is_some_and(|entry| {
        SocketAddr::from_str(std::str::from_utf8(entry).unwrap_or("")).ok() == Some(peer)
    }) {
        return None;
    }
    Some(peer.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn contains_matches_inside_and_not_outside() {
        let lo = cidr("127.0.0.0/8");
        assert!(lo.contains(ip("127.0.0.1")));
        assert!(lo.contains(ip("127.255.255.254")));
        assert!(!lo.contains(ip("128.0.0.1")));
        assert!(!lo.contains(ip("::1")));
        let v6 = cidr("::1/128");
        assert!(v6.contains(ip("::1")));
        assert!(!v6.contains(ip("::2")));
        assert!(!v6.contains(ip("127.0.0.1")));
    }

    #[test]
    fn contains_treats_mapped_ipv6_as_ipv4() {
        assert!(cidr("127.0.0.0/8").contains(ip("::ffff:127.0.0.1")));
        assert!(!cidr("10.0.0.0/8").contains(ip("::ffff:127.0.0.1")));
    }

    #[test]
    fn mapped_ranges_are_the_ipv4_ranges_they_carry() {
        let c = cidr("::ffff:10.1.2.3/104");
        assert_eq!(c.to_string(), "10.0.0.0/8");
        assert!(c.contains(ip("10.9.9.9")));
        assert!(c.contains(ip("::ffff:10.9.9.9")));
        assert!(!c.contains(ip("11.0.0.1")));
        assert!(cidr("::ffff:127.0.0.1").contains(ip("127.0.0.1")));
        assert_eq!(cidr("::ffff:0:0/95").to_string(), "::fffe:0:0/95");
    }

    #[test]
    fn zero_prefix_matches_the_whole_family() {
        assert!(cidr("0.0.0.0/0").contains(ip("8.8.8.8")));
        assert!(cidr("::/0").contains(ip("2001:db8::1")));
        assert!(!cidr("::/0").contains(ip("8.8.8.8")));
    }

    #[test]
    fn parse_clears_host_bits_and_accepts_bare_addresses() {
        assert_eq!(cidr("10.1.2.3/8").to_string(), "10.0.0.0/8");
        assert_eq!(cidr("10.1.2.3").to_string(), "10.1.2.3/32");
        assert_eq!(cidr("2001:db8::1/32").to_string(), "2001:db8::/32");
        assert!(cidr("10.1.2.3").contains(ip("10.1.2.3")));
        assert!(!cidr("10.1.2.3").contains(ip("10.1.2.4")));
    }

    #[test]
    fn parse_refuses_malformed_ranges() {
        for bad in [
            "",
            "/8",
            "10.0.0.0/",
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/-1",
            "10.0.0.0/+8",
            "10.0.0/8",
            "localhost",
            "10.0.0.0/8/8",
            "10.0.0.0/0008",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn trusted_peer_reads_envoy_address_forms() {
        assert_eq!(
            trusted_peer_ip(b"127.0.0.1:4242", None),
            Some(ip("127.0.0.1"))
        );
        assert_eq!(trusted_peer_ip(b"[::1]:4242", None), Some(ip("::1")));
        for bad in [
            &b"::1"[..],
            b"127.0.0.1",
            b"/tmp/envoy.sock",
            b"\xff\xfe",
            b"",
        ] {
            assert_eq!(trusted_peer_ip(bad, None), None, "{bad:?}");
        }
    }

    #[test]
    fn trusted_peer_refuses_addresses_taken_from_forwarded_for() {
        // use_remote_address: false, client sent x-forwarded-for: 127.0.0.1
        assert_eq!(trusted_peer_ip(b"127.0.0.1:0", Some(b"127.0.0.1")), None);
        assert_eq!(trusted_peer_ip(b"[::1]:0", Some(b"::1")), None);
        // a forwarded entry with a port, should a parser keep it
        assert_eq!(
            trusted_peer_ip(b"127.0.0.1:5555", Some(b"10.0.0.9, 127.0.0.1:5555")),
            None
        );
    }

    #[test]
    fn trusted_peer_accepts_real_peers_whatever_the_header_says() {
        // use_remote_address: true: Envoy appended the peer's bare IP.
        assert_eq!(
            trusted_peer_ip(b"127.0.0.1:40000", Some(b"10.9.9.9, 127.0.0.1")),
            Some(ip("127.0.0.1"))
        );
        // use_remote_address: false and an unparsable header: the peer stands.
        assert_eq!(
            trusted_peer_ip(b"127.0.0.1:40000", Some(b"not-an-ip")),
            Some(ip("127.0.0.1"))
        );
    }
}
