//! The front role's endpoints (docs/design/front-proxy-drain.md §4): which
//! request is which, and what each answers. Every answer is about the
//! request's source alone; the host side is [`super::serve`].
//!
//! | request | answer |
//! |---|---|
//! | `POST {PREFIX}closing` | 202, the source's status |
//! | `GET {PREFIX}drained[?wait=D]` | 200, the status, once acknowledged; serving (no entry): 409, the status; else held up to `D` (at most [`MAX_WAIT`]) then 503, the status; past `max_waiters` held: 429 |
//! | `POST {PREFIX}serving` | 202, the status (serving) |
//! | `GET {PREFIX}status` | 200, the status |
//! | any of them from an untrusted peer, a non-member, naming another `host=` | 403 `{"refused": ...}` |
//! | another method on one of those paths | 405 (`allow`) |
//! | a bad `wait=` or `host=` | 400 |
//!
//! graceful-hook's front mode reads these codes and `"state": "serving"`
//! (hook/src/front.rs): 409 and `serving` mean "does not know of the
//! closing".

use std::net::{IpAddr, Ipv6Addr};
use std::time::Duration;

use super::{host_ip, FrontStatus};
use crate::shared::duration::parse_duration;

/// The front endpoints' paths start here (graceful's `/graceful` prefix,
/// the contract's: additive under it).
pub const PREFIX: &str = "/graceful/front/";
/// The longest a `drained?wait=` is held; a longer wait is held this long.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

/// One of the front's endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrontEndpoint {
    Closing,
    /// `wait`: None or non-zero, at most [`MAX_WAIT`].
    Drained {
        wait: Option<Duration>,
    },
    Serving,
    Status,
}

/// What the filter does with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrontRoute {
    /// Not a front endpoint: the request goes on.
    Pass,
    /// `host`: the IP a `host=` parameter named, if any.
    Endpoint(FrontEndpoint, Option<Ipv6Addr>),
    MethodNotAllowed(&'static str),
    BadRequest(String),
}

/// True if `path` starts with [`PREFIX`]: only then is `:method` read.
pub fn is_front_path(path: &[u8]) -> bool {
    path.starts_with(PREFIX.as_bytes())
}

/// Classifies a request by `:method` and `:path` (query included).
pub fn route(method: &[u8], path: &[u8]) -> FrontRoute {
    let (path, query) = match path.iter().position(|&b| b == b'?') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (path, &b""[..]),
    };
    let Some(name) = path.strip_prefix(PREFIX.as_bytes()) else {
        return FrontRoute::Pass;
    };
    let (endpoint, allow) = match name {
        b"closing" => (FrontEndpoint::Closing, "POST"),
        b"serving" => (FrontEndpoint::Serving, "POST"),
        b"status" => (FrontEndpoint::Status, "GET, HEAD"),
        b"drained" => (FrontEndpoint::Drained { wait: None }, "GET, HEAD"),
        _ => return FrontRoute::Pass,
    };
    let allowed = match allow {
        "POST" => method == b"POST",
        _ => method == b"GET" || method == b"HEAD",
    };
    if !allowed {
        return FrontRoute::MethodNotAllowed(allow);
    }
    let params = match params(query) {
        Ok(p) => p,
        Err(reason) => return FrontRoute::BadRequest(reason),
    };
    let endpoint = match endpoint {
        FrontEndpoint::Drained { .. } => FrontEndpoint::Drained { wait: params.wait },
        other => other,
    };
    FrontRoute::Endpoint(endpoint, params.host)
}

struct Params {
    wait: Option<Duration>,
    host: Option<Ipv6Addr>,
}

/// `wait=<duration>` and `host=<ip>`; other parameters are ignored.
fn params(query: &[u8]) -> Result<Params, String> {
    let mut p = Params {
        wait: None,
        host: None,
    };
    for pair in query.split(|&b| b == b'&') {
        if let Some(value) = pair.strip_prefix(b"wait=") {
            let text = std::str::from_utf8(value).map_err(|_| "wait: not UTF-8".to_string())?;
            let d = parse_duration(text).map_err(|e| format!("wait: {e}"))?;
            p.wait = (!d.is_zero()).then_some(d.min(MAX_WAIT));
        } else if let Some(value) = pair.strip_prefix(b"host=") {
            let ip = std::str::from_utf8(value)
                .ok()
                .and_then(|t| t.parse::<IpAddr>().ok())
                .ok_or_else(|| "host: not an IP address".to_string())?;
            p.host = Some(host_ip(ip));
        }
    }
    Ok(p)
}

/// Why a request was refused (403), as its JSON says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The source is no trusted peer: unreadable, or taken from
    /// `x-forwarded-for` ([`crate::shared::net::trusted_peer_ip`]).
    UntrustedPeer,
    /// The source is no member of any cluster this front balances over,
    /// and has no entry in its table.
    NotAMember,
    /// `host=` named another IP than the source's.
    NotYourAddress,
}

impl Refused {
    pub fn name(self) -> &'static str {
        match self {
            Refused::UntrustedPeer => "untrusted_peer",
            Refused::NotAMember => "not_a_member",
            Refused::NotYourAddress => "not_your_address",
        }
    }
}

/// A local reply for the glue to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrontReply {
    pub status: u32,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
}

impl FrontReply {
    fn json(status: u32, json: String) -> FrontReply {
        FrontReply {
            status,
            headers: vec![
                ("content-type", "application/json".into()),
                ("cache-control", "no-store".into()),
            ],
            body: format!("{json}\n"),
        }
    }

    fn text(status: u32, text: &str) -> FrontReply {
        FrontReply {
            status,
            headers: vec![
                ("content-type", "text/plain".into()),
                ("cache-control", "no-store".into()),
            ],
            body: format!("{text}\n"),
        }
    }

    /// `status` with a host's status JSON.
    pub fn status(status: u32, s: &FrontStatus) -> FrontReply {
        // FrontStatus holds strings, numbers and nulls only.
        let json = serde_json::to_string(s).unwrap_or_else(|_| "{}".into());
        FrontReply::json(status, json)
    }

    /// `drained`: 200 once acknowledged; 409 serving (no entry: the front
    /// does not know of the closing); else 503.
    pub fn drained(s: &FrontStatus) -> FrontReply {
        let status = match s.state {
            "acknowledged" => 200,
            "serving" => 409,
            _ => 503,
        };
        FrontReply::status(status, s)
    }

    /// 403 `{"refused": "<why>"}`.
    pub fn refused(why: Refused) -> FrontReply {
        FrontReply::json(403, format!(r#"{{"refused":"{}"}}"#, why.name()))
    }

    /// More long-polls held than `front.max_waiters`.
    pub fn too_many_waiters() -> FrontReply {
        FrontReply::json(429, r#"{"refused":"too_many_waiters"}"#.into())
    }

    /// The table holds `front.max_hosts` hosts, none acknowledged: nothing
    /// written.
    pub fn table_full() -> FrontReply {
        FrontReply::json(503, r#"{"refused":"table_full"}"#.into())
    }

    /// Shared data could not be read or written: retry later.
    pub fn unavailable(reason: &str) -> FrontReply {
        let reason = serde_json::to_string(reason).unwrap_or_else(|_| "\"\"".into());
        FrontReply::json(503, format!(r#"{{"unavailable":{reason}}}"#))
    }

    pub fn method_not_allowed(allow: &'static str) -> FrontReply {
        let mut r = FrontReply::text(405, "method not allowed");
        r.headers.push(("allow", allow.to_string()));
        r
    }

    pub fn bad_request(reason: &str) -> FrontReply {
        FrontReply::text(400, &format!("bad request: {reason}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(method: &str, path: &str) -> FrontRoute {
        route(method.as_bytes(), path.as_bytes())
    }

    #[test]
    fn routes_each_endpoint_and_passes_everything_else() {
        assert_eq!(
            r("POST", "/graceful/front/closing"),
            FrontRoute::Endpoint(FrontEndpoint::Closing, None)
        );
        assert_eq!(
            r("POST", "/graceful/front/serving"),
            FrontRoute::Endpoint(FrontEndpoint::Serving, None)
        );
        assert_eq!(
            r("GET", "/graceful/front/status?x=1"),
            FrontRoute::Endpoint(FrontEndpoint::Status, None)
        );
        assert_eq!(
            r("GET", "/graceful/front/drained?wait=10s"),
            FrontRoute::Endpoint(
                FrontEndpoint::Drained {
                    wait: Some(Duration::from_secs(10))
                },
                None
            )
        );
        for (m, p) in [
            ("GET", "/"),
            ("GET", "/graceful/front/"),
            ("GET", "/graceful/front/closingx"),
            ("GET", "/graceful/closing"),
            ("POST", "/GRACEFUL/FRONT/CLOSING"),
        ] {
            assert_eq!(r(m, p), FrontRoute::Pass, "{m} {p}");
        }
        assert!(is_front_path(b"/graceful/front/drained?wait=1s"));
        assert!(!is_front_path(b"/graceful/drained"));
    }

    #[test]
    fn wrong_methods_get_405_and_bad_parameters_400() {
        assert_eq!(
            r("GET", "/graceful/front/closing"),
            FrontRoute::MethodNotAllowed("POST")
        );
        assert_eq!(
            r("POST", "/graceful/front/drained"),
            FrontRoute::MethodNotAllowed("GET, HEAD")
        );
        for q in ["wait=10", "wait=", "host=10.0.0", "host=", "wait=\u{ff}s"] {
            match r("GET", &format!("/graceful/front/drained?{q}")) {
                FrontRoute::BadRequest(_) => {}
                other => panic!("{q}: {other:?}"),
            }
        }
    }

    #[test]
    fn wait_is_capped_at_a_minute_and_host_is_read_as_an_ip() {
        let drained = |q: &str| r("GET", &format!("/graceful/front/drained?{q}"));
        assert_eq!(
            drained("wait=5m&host=10.0.0.1"),
            FrontRoute::Endpoint(
                FrontEndpoint::Drained {
                    wait: Some(MAX_WAIT)
                },
                Some(host_ip("10.0.0.1".parse().unwrap()))
            )
        );
        assert_eq!(
            drained("wait=0s"),
            FrontRoute::Endpoint(FrontEndpoint::Drained { wait: None }, None)
        );
    }

    #[test]
    fn replies_carry_their_codes_and_json() {
        let serving = FrontStatus::of(None);
        assert_eq!(FrontReply::drained(&serving).status, 409);
        assert!(FrontReply::drained(&serving)
            .body
            .contains(r#""state":"serving""#));
        let refused = FrontReply::refused(Refused::NotAMember);
        assert_eq!(
            (refused.status, refused.body.as_str()),
            (403, "{\"refused\":\"not_a_member\"}\n")
        );
        assert_eq!(FrontReply::too_many_waiters().status, 429);
        let u = FrontReply::unavailable("a \"quote\"");
        let v: serde_json::Value = serde_json::from_str(&u.body).unwrap();
        assert_eq!(v["unavailable"], "a \"quote\"");
    }
}
