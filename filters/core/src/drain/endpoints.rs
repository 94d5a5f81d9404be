//! The drain filter's endpoints: which request is which, and what each one
//! answers. The glue only reads `:method`/`:path`, calls [`route`], and sends
//! the [`Reply`] it is handed.

use std::time::Duration;

use crate::drain::config::Paths;
use crate::drain::record::Phase;
use crate::drain::status::Status;
use crate::shared::duration::parse_duration;

/// The longest `?wait=` a long-poll may ask for.
pub const MAX_WAIT: Duration = Duration::from_secs(3600);

/// A request for one of the drain filter's endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /graceful/closing`
    Closing,
    /// `GET /graceful/ready`
    Ready,
    /// `GET /graceful/status`
    Status,
    /// `GET /graceful/drained[?wait=…]`; `wait` is None or non-zero.
    Drained { wait: Option<Duration> },
    /// `POST /grpc.health.v1.Health/Check`
    GrpcHealth,
    /// `POST /grpc.health.v1.Health/Watch`
    GrpcHealthWatch,
    /// `GET /graceful/report`
    Report,
}

/// What the filter does with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Not an endpoint: pass it on to the app.
    Pass,
    Endpoint(Endpoint),
    /// An endpoint's path with the wrong method: 405 with this `allow`.
    MethodNotAllowed(&'static str),
    /// An endpoint's path with a bad query: 400 with this reason.
    BadRequest(String),
}

/// True if `path` (query included) is one of the endpoints' paths: the
/// filter reads `:method` only then, saving a hostcall on every other
/// request.
pub fn is_endpoint_path(paths: &Paths, path: &[u8]) -> bool {
    let path = without_query(path);
    paths.named().iter().any(|(_, p)| p.as_bytes() == path)
}

/// A request's `:path` up to its query.
pub fn without_query(path: &[u8]) -> &[u8] {
    path.split(|&b| b == b'?').next().unwrap_or_default()
}

/// Classifies a request by `:method` and `:path` (query included).
pub fn route(paths: &Paths, method: &[u8], path: &[u8]) -> Route {
    let (path, query) = match path.iter().position(|&b| b == b'?') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (path, &b""[..]),
    };
    let is = |p: &String| p.as_bytes() == path;
    let read_only = method == b"GET" || method == b"HEAD";
    for (grpc_path, endpoint) in [
        (&paths.grpc_health, Endpoint::GrpcHealth),
        (&paths.grpc_health_watch, Endpoint::GrpcHealthWatch),
    ] {
        if is(grpc_path) {
            // Any other method is the app's business, not a health check.
            return if method == b"POST" {
                Route::Endpoint(endpoint)
            } else {
                Route::Pass
            };
        }
    }
    if is(&paths.closing) {
        return if method == b"POST" {
            Route::Endpoint(Endpoint::Closing)
        } else {
            Route::MethodNotAllowed("POST")
        };
    }
    let endpoint = if is(&paths.ready) {
        Endpoint::Ready
    } else if is(&paths.status) {
        Endpoint::Status
    } else if is(&paths.report) {
        Endpoint::Report
    } else if is(&paths.drained) {
        match wait_param(query) {
            Ok(wait) => Endpoint::Drained { wait },
            Err(reason) => return Route::BadRequest(reason),
        }
    } else {
        return Route::Pass;
    };
    if read_only {
        Route::Endpoint(endpoint)
    } else {
        Route::MethodNotAllowed("GET, HEAD")
    }
}

/// Reads `wait=<duration>` from a query string; other parameters are
/// ignored (probes add their own). `wait=0s` means no wait.
fn wait_param(query: &[u8]) -> Result<Option<Duration>, String> {
    let mut wait = None;
    for pair in query.split(|&b| b == b'&') {
        let Some(value) = pair.strip_prefix(b"wait=") else {
            continue;
        };
        let text = std::str::from_utf8(value).map_err(|_| "wait: not UTF-8".to_string())?;
        let d = parse_duration(text).map_err(|e| format!("wait: {e}"))?;
        if d > MAX_WAIT {
            return Err("wait: longer than 1h".to_string());
        }
        wait = (!d.is_zero()).then_some(d);
    }
    Ok(wait)
}

/// The status of a refusal to a source outside `allowed_sources`.
const FORBIDDEN: u32 = 403;

/// A local reply for the glue to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u32,
    /// For gRPC requests: the grpc-status Envoy puts in the trailers-only
    /// reply (Envoy derives one from `status` when None).
    pub grpc_status: Option<i32>,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
}

impl Reply {
    fn text(status: u32, body: &str) -> Reply {
        Reply {
            status,
            grpc_status: None,
            headers: vec![
                ("content-type", "text/plain".into()),
                ("cache-control", "no-store".into()),
            ],
            body: format!("{body}\n"),
        }
    }

    fn json(status: u32, s: &Status) -> Reply {
        Reply::json_text(status, &s.to_json())
    }

    /// A JSON answer that no cache keeps.
    fn json_text(status: u32, json: &str) -> Reply {
        Reply {
            status,
            grpc_status: None,
            headers: vec![
                ("content-type", "application/json".into()),
                ("cache-control", "no-store".into()),
            ],
            body: format!("{json}\n"),
        }
    }

    /// `ready`: the readiness probe.
    pub fn ready(phase: Phase) -> Reply {
        match phase {
            Phase::Serving => Reply::text(200, "SERVING"),
            Phase::Closing | Phase::Drained => Reply::text(503, "NOT_SERVING"),
        }
    }

    /// `status`: always 200.
    pub fn status(s: &Status) -> Reply {
        Reply::json(200, s)
    }

    /// `report`: the drain report's JSON.
    pub fn report(json: &str) -> Reply {
        Reply::json_text(200, json)
    }

    /// `closing`: accepted (202) with the status after closing started.
    pub fn closing(s: &Status) -> Reply {
        Reply::json(202, s)
    }

    /// `drained`: 200 once the gate has passed, else 503.
    pub fn drained(s: &Status) -> Reply {
        Reply::json(if s.drained { 200 } else { 503 }, s)
    }

    /// Any endpoint but readiness and gRPC health from a source outside
    /// `allowed_sources`: the bare word, so an outsider learns nothing
    /// about the instance (nor is it stamped: [`Stamp::headers`]).
    pub fn forbidden() -> Reply {
        Reply {
            body: "forbidden".to_string(),
            ..Reply::text(FORBIDDEN, "")
        }
    }

    /// More long-polls than `max_waiters` at once.
    pub fn too_many_waiters() -> Reply {
        Reply::text(429, "too many drained?wait= requests held")
    }

    pub fn method_not_allowed(allow: &'static str) -> Reply {
        let mut r = Reply::text(405, "method not allowed");
        r.headers.push(("allow", allow.to_string()));
        r
    }

    pub fn bad_request(reason: &str) -> Reply {
        Reply::text(400, &format!("bad request: {reason}"))
    }

    /// The shared state could not be read or written: retry later.
    pub fn unavailable(reason: &str) -> Reply {
        Reply::text(503, &format!("unavailable: {reason}"))
    }

    /// gRPC health Check once closing. Envoy sends a filter's local reply to
    /// a gRPC request as trailers-only, so only a status can be carried:
    /// UNAVAILABLE (14) with `grpc-message: NOT_SERVING`.
    pub fn grpc_not_serving() -> Reply {
        Reply {
            status: 503,
            grpc_status: Some(14),
            headers: Vec::new(),
            body: "NOT_SERVING".to_string(),
        }
    }
}

/// What the drain stamps on each of its answers: the instance id the
/// provider published (shared data) and the address the request reached.
/// A consumer's probe tells a restarted instance from the closing one by
/// both.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stamp {
    identity: Option<(String, String)>,
    address: Option<String>,
}

impl Stamp {
    /// The published identity from `store` (none if unreadable) and the
    /// `address` the glue read.
    pub fn read(store: &dyn crate::shared::store::SharedStore, address: Option<String>) -> Stamp {
        let identity = store
            .get(crate::shared::keys::IDENTITY.name)
            .ok()
            .flatten()
            .and_then(|(bytes, _)| crate::shared::instance::decode_identity(&bytes));
        Stamp { identity, address }
    }

    /// The reply's headers, then the instance header and the address; a
    /// 403 gets neither: it answers a caller outside `allowed_sources`, who
    /// must not learn the instance id or the address it reached.
    pub fn headers<'a>(&'a self, reply: &'a Reply) -> Vec<(&'a str, &'a str)> {
        let mut headers: Vec<(&str, &str)> = reply
            .headers
            .iter()
            .map(|(k, v)| (*k, v.as_str()))
            .collect();
        if reply.status == FORBIDDEN {
            return headers;
        }
        if let Some((name, id)) = &self.identity {
            headers.push((name, id));
        }
        if let Some(address) = &self.address {
            headers.push((crate::shared::headers::ADDRESS, address));
        }
        headers
    }
}

/// The long-polls held by one VM copy: each stream's id, what its delivery
/// wakes it with (`W`: nothing in a VM, whose tick answers through the
/// stream's context id; the stream's scheduler natively) and when its wait
/// runs out. Each copy resolves its own on its tick.
#[derive(Debug)]
pub struct Waiters<W = ()> {
    held: Vec<(u32, W, u64)>,
}

impl<W> Default for Waiters<W> {
    fn default() -> Self {
        Waiters { held: Vec::new() }
    }
}

impl<W> Waiters<W> {
    pub fn hold(&mut self, id: u32, wake: W, deadline_us: u64) {
        self.held.push((id, wake, deadline_us));
    }

    /// Forgets a stream (it ended or was answered); true if it was held.
    pub fn release(&mut self, id: u32) -> bool {
        let before = self.held.len();
        self.held.retain(|(held, _, _)| *held != id);
        self.held.len() != before
    }

    /// Takes the streams to answer now: all of them once drained, else those
    /// whose wait ran out.
    pub fn take_due(&mut self, drained: bool, now_us: u64) -> Vec<(u32, W)> {
        self.take_due_by(now_us, |_| drained)
    }

    /// Takes the streams to answer now: those `ready` says are (the front's
    /// long-polls each wait for their own host), and those whose wait ran
    /// out.
    pub fn take_due_by(&mut self, now_us: u64, mut ready: impl FnMut(&W) -> bool) -> Vec<(u32, W)> {
        let (due, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|(_, wake, deadline)| now_us >= *deadline || ready(wake));
        self.held = keep;
        due.into_iter().map(|(id, wake, _)| (id, wake)).collect()
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Publishes instance `i-1`'s identity, as the filter does at start.
    fn publish_identity(store: &crate::shared::store::MemStore) {
        use crate::shared::store::SharedStore;
        store
            .set(
                crate::shared::keys::IDENTITY.name,
                &crate::shared::instance::encode_identity("x-graceful-instance", "i-1"),
                0,
            )
            .unwrap();
    }

    #[test]
    fn a_stamp_adds_the_published_identity_and_the_address() {
        let store = crate::shared::store::MemStore::new();
        let reply = Reply::ready(Phase::Serving);
        let bare = Stamp::read(&store, None);
        assert_eq!(bare.headers(&reply).len(), reply.headers.len());
        publish_identity(&store);
        let stamp = Stamp::read(&store, Some("10.0.0.1:80".into()));
        let h = stamp.headers(&reply);
        assert_eq!(
            &h[reply.headers.len()..],
            [
                ("x-graceful-instance", "i-1"),
                (crate::shared::headers::ADDRESS, "10.0.0.1:80")
            ]
        );
    }

    #[test]
    fn a_403_says_only_forbidden_and_carries_no_identity_or_address() {
        let store = crate::shared::store::MemStore::new();
        publish_identity(&store);
        let stamp = Stamp::read(&store, Some("10.0.0.1:80".into()));
        let reply = Reply::forbidden();
        assert_eq!((reply.status, reply.body.as_str()), (403, "forbidden"));
        let names: Vec<&str> = stamp.headers(&reply).iter().map(|(k, _)| *k).collect();
        assert_eq!(names, ["content-type", "cache-control"]);
    }

    fn r(method: &str, path: &str) -> Route {
        route(&Paths::default(), method.as_bytes(), path.as_bytes())
    }

    #[test]
    fn routes_each_endpoint() {
        assert_eq!(
            r("POST", "/graceful/closing"),
            Route::Endpoint(Endpoint::Closing)
        );
        assert_eq!(
            r("GET", "/graceful/ready"),
            Route::Endpoint(Endpoint::Ready)
        );
        assert_eq!(
            r("HEAD", "/graceful/ready"),
            Route::Endpoint(Endpoint::Ready)
        );
        assert_eq!(
            r("GET", "/graceful/status"),
            Route::Endpoint(Endpoint::Status)
        );
        assert_eq!(
            r("GET", "/graceful/drained"),
            Route::Endpoint(Endpoint::Drained { wait: None })
        );
        assert_eq!(
            r("POST", "/grpc.health.v1.Health/Check"),
            Route::Endpoint(Endpoint::GrpcHealth)
        );
        assert_eq!(
            r("POST", "/grpc.health.v1.Health/Watch"),
            Route::Endpoint(Endpoint::GrpcHealthWatch)
        );
        assert_eq!(
            r("GET", "/graceful/report?x=1"),
            Route::Endpoint(Endpoint::Report)
        );
        assert_eq!(
            r("POST", "/graceful/report"),
            Route::MethodNotAllowed("GET, HEAD")
        );
    }

    #[test]
    fn endpoint_paths_are_recognised_without_the_method() {
        let paths = Paths::default();
        assert!(is_endpoint_path(&paths, b"/graceful/drained?wait=1s"));
        assert!(is_endpoint_path(&paths, b"/grpc.health.v1.Health/Check"));
        assert!(!is_endpoint_path(&paths, b"/graceful/drainedx"));
        assert!(!is_endpoint_path(&paths, b"/"));
        assert!(!is_endpoint_path(&paths, b""));
    }

    #[test]
    fn passes_everything_else() {
        for (m, p) in [
            ("GET", "/"),
            ("GET", "/graceful"),
            ("GET", "/graceful/ready/"),
            ("GET", "/GRACEFUL/READY"),
            ("GET", "/graceful/readyz"),
            ("GET", "/grpc.health.v1.Health/Check"),
            ("GET", "/grpc.health.v1.Health/Watch"),
            ("POST", "/grpc.health.v1.Health/List"),
        ] {
            assert_eq!(r(m, p), Route::Pass, "{m} {p}");
        }
    }

    #[test]
    fn wrong_methods_get_405() {
        assert_eq!(
            r("GET", "/graceful/closing"),
            Route::MethodNotAllowed("POST")
        );
        assert_eq!(
            r("POST", "/graceful/ready"),
            Route::MethodNotAllowed("GET, HEAD")
        );
        assert_eq!(
            r("DELETE", "/graceful/drained"),
            Route::MethodNotAllowed("GET, HEAD")
        );
    }

    #[test]
    fn drained_reads_wait_and_ignores_other_parameters() {
        let wait = |q: &str| r("GET", &format!("/graceful/drained?{q}"));
        assert_eq!(
            wait("wait=10s"),
            Route::Endpoint(Endpoint::Drained {
                wait: Some(Duration::from_secs(10))
            })
        );
        assert_eq!(
            wait("x=1&wait=250ms"),
            Route::Endpoint(Endpoint::Drained {
                wait: Some(Duration::from_millis(250))
            })
        );
        assert_eq!(
            wait("wait=0s"),
            Route::Endpoint(Endpoint::Drained { wait: None })
        );
        assert_eq!(wait(""), Route::Endpoint(Endpoint::Drained { wait: None }));
        assert_eq!(
            wait("waiting=5s"),
            Route::Endpoint(Endpoint::Drained { wait: None })
        );
        assert_eq!(
            r("GET", "/graceful/status?x=y"),
            Route::Endpoint(Endpoint::Status)
        );
    }

    #[test]
    fn bad_wait_is_a_400() {
        for q in [
            "wait=10",
            "wait=",
            "wait=2h",
            "wait=-1s",
            "wait=%31s",
            "wait=\u{ff}s",
        ] {
            match r("GET", &format!("/graceful/drained?{q}")) {
                Route::BadRequest(reason) => assert!(reason.starts_with("wait:"), "{q}: {reason}"),
                other => panic!("{q}: {other:?}"),
            }
        }
        assert!(matches!(
            route(&Paths::default(), b"GET", b"/graceful/drained?wait=\xff"),
            Route::BadRequest(_)
        ));
    }

    #[test]
    fn custom_paths_are_honoured() {
        let paths = Paths {
            ready: "/healthz".into(),
            ..Paths::default()
        };
        assert_eq!(
            route(&paths, b"GET", b"/healthz"),
            Route::Endpoint(Endpoint::Ready)
        );
        assert_eq!(route(&paths, b"GET", b"/graceful/ready"), Route::Pass);
    }

    #[test]
    fn replies_carry_the_contract_codes_and_bodies() {
        assert_eq!(Reply::ready(Phase::Serving).status, 200);
        assert_eq!(Reply::ready(Phase::Serving).body, "SERVING\n");
        assert_eq!(Reply::ready(Phase::Closing).status, 503);
        assert_eq!(Reply::ready(Phase::Drained).body, "NOT_SERVING\n");
        let serving = Status::new(&Default::default(), &Default::default(), 0, 0);
        assert_eq!(Reply::drained(&serving).status, 503);
        assert_eq!(Reply::closing(&serving).status, 202);
        assert_eq!(Reply::status(&serving).status, 200);
        assert_eq!(
            Reply::status(&serving).body,
            format!("{}\n", serving.to_json())
        );
        let g = Reply::grpc_not_serving();
        assert_eq!((g.grpc_status, g.body.as_str()), (Some(14), "NOT_SERVING"));
        let m = Reply::method_not_allowed("POST");
        assert!(m.headers.contains(&("allow", "POST".to_string())));
    }

    #[test]
    fn waiters_resolve_on_drain_or_deadline() {
        let mut w = Waiters::default();
        w.hold(1, 'a', 100);
        w.hold(2, 'b', 200);
        w.hold(3, 'c', 300);
        assert_eq!(w.take_due(false, 99), vec![]);
        assert_eq!(w.take_due(false, 200), vec![(1, 'a'), (2, 'b')]);
        assert_eq!(w.len(), 1);
        w.hold(4, 'd', 900);
        assert!(w.release(4));
        assert!(!w.release(4));
        assert_eq!(w.take_due(true, 0), vec![(3, 'c')]);
        assert!(w.is_empty());
    }

    #[test]
    fn waiters_resolve_each_by_its_own_readiness_or_deadline() {
        let mut w = Waiters::default();
        w.hold(1, 'a', 100);
        w.hold(2, 'b', 200);
        w.hold(3, 'c', 300);
        assert_eq!(w.take_due_by(0, |c| *c == 'b'), vec![(2, 'b')]);
        assert_eq!(w.take_due_by(100, |_| false), vec![(1, 'a')]);
        assert_eq!(w.len(), 1);
    }
}
