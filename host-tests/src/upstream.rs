//! A test upstream ("the app"): HTTP/1.1 and HTTP/2 (h2c) on one port.
//!
//! | path                             | answer                                              |
//! |----------------------------------|-----------------------------------------------------|
//! | `/delay/<ms>`                    | 200 `ok` after `<ms>` milliseconds                  |
//! | `/grpc/trailers`                 | gRPC: one message, trailers `grpc-status: 0`        |
//! | `/grpc/no-trailers`              | gRPC content type, one message, no trailers         |
//! | `/grpc.health.v1.Health/Check`   | gRPC health: SERVING                                |
//! | `POST /shutdown`                 | 200; counted in `shutdown_calls` (on_drained hook)  |
//! | `/graceful/ready`                | what graceful_drain answers a consumer's probe: 200 (503 while closing) with the instance id and `x-graceful-address` |
//! | anything else                    | 200 `ok`                                            |
//!
//! It can also stand in for a provider sidecar: [`Upstream::set_instance`]
//! stamps every answer with `x-graceful-instance`, [`Upstream::set_closing`]
//! with `x-graceful-closing: true`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::client::grpc_frame;

#[derive(Default)]
pub struct Counters {
    /// Requests received, whatever the path.
    pub requests: AtomicU64,
    /// Requests received outside `/graceful/` (what an app would serve).
    pub app_requests: AtomicU64,
    /// Answer with `x-graceful-closing: true`.
    pub closing: AtomicBool,
    /// Instance id stamped on answers (none when empty).
    pub instance: Mutex<String>,
    /// `POST /shutdown` calls and the last body.
    pub shutdown_calls: AtomicU64,
    pub last_shutdown_body: Mutex<String>,
}

/// A running upstream; stops when dropped.
pub struct Upstream {
    pub addr: SocketAddr,
    pub counters: Arc<Counters>,
    task: JoinHandle<()>,
}

impl Upstream {
    /// Starts on 127.0.0.1 with a port of the kernel's choosing.
    pub async fn start() -> Upstream {
        Upstream::start_on(
            "127.0.0.1:0"
                .parse()
                .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0))),
        )
        .await
    }

    pub async fn start_on(bind: SocketAddr) -> Upstream {
        let listener = match TcpListener::bind(bind).await {
            Ok(l) => l,
            Err(e) => panic!("upstream cannot bind {bind}: {e}"),
        };
        let addr = listener.local_addr().unwrap_or(bind);
        let counters = Arc::new(Counters::default());
        let shared = counters.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let counters = shared.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| handle(req, counters.clone(), addr));
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Upstream {
            addr,
            counters,
            task,
        }
    }

    pub fn requests(&self) -> u64 {
        self.counters.requests.load(Ordering::SeqCst)
    }

    /// Requests an app would serve (not `/graceful/` probes).
    pub fn app_requests(&self) -> u64 {
        self.counters.app_requests.load(Ordering::SeqCst)
    }

    pub fn set_closing(&self, closing: bool) {
        self.counters.closing.store(closing, Ordering::SeqCst);
    }

    pub fn set_instance(&self, id: &str) {
        if let Ok(mut i) = self.counters.instance.lock() {
            *i = id.to_string();
        }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Body = BoxBody<Bytes, Infallible>;

fn text(status: u16, body: &'static str) -> Response<Body> {
    let mut res = Response::new(Full::new(Bytes::from_static(body.as_bytes())).boxed());
    *res.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::OK);
    res
}

fn grpc(message: &[u8], with_trailers: bool) -> Response<Body> {
    let body = Full::new(grpc_frame(message));
    let body = if with_trailers {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        body.with_trailers(async move { Some(Ok(trailers)) })
            .boxed()
    } else {
        body.boxed()
    };
    let mut res = Response::new(body);
    res.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
    res
}

async fn handle(
    req: Request<Incoming>,
    counters: Arc<Counters>,
    addr: SocketAddr,
) -> Result<Response<Body>, Infallible> {
    let mut res = route(req, &counters, addr).await;
    let instance = counters
        .instance
        .lock()
        .map(|i| i.clone())
        .unwrap_or_default();
    if !instance.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&instance) {
            res.headers_mut().insert("x-graceful-instance", v);
        }
    }
    if counters.closing.load(Ordering::SeqCst) {
        res.headers_mut()
            .insert("x-graceful-closing", HeaderValue::from_static("true"));
    }
    Ok(res)
}

async fn route(req: Request<Incoming>, counters: &Counters, addr: SocketAddr) -> Response<Body> {
    counters.requests.fetch_add(1, Ordering::SeqCst);
    let path = req.uri().path().to_string();
    if path == "/graceful/ready" {
        let closing = counters.closing.load(Ordering::SeqCst);
        let mut res = if closing {
            text(503, "NOT_SERVING\n")
        } else {
            text(200, "SERVING\n")
        };
        if let Ok(v) = HeaderValue::from_str(&addr.to_string()) {
            res.headers_mut().insert("x-graceful-address", v);
        }
        return res;
    }
    if !path.starts_with("/graceful/") {
        counters.app_requests.fetch_add(1, Ordering::SeqCst);
    }
    let method = req.method().clone();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    if let Some(ms) = path
        .strip_prefix("/delay/")
        .and_then(|ms| ms.parse::<u64>().ok())
    {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        return text(200, "ok\n");
    }
    match (method.as_str(), path.as_str()) {
        (_, "/grpc/trailers") => grpc(b"hello", true),
        (_, "/grpc/no-trailers") => grpc(b"hello", false),
        // HealthCheckResponse { status: SERVING (1) }
        (_, "/grpc.health.v1.Health/Check") => grpc(&[0x08, 0x01], true),
        ("POST", "/shutdown") => {
            counters.shutdown_calls.fetch_add(1, Ordering::SeqCst);
            if let Ok(mut last) = counters.last_shutdown_body.lock() {
                *last = String::from_utf8_lossy(&body).into_owned();
            }
            text(200, "bye\n")
        }
        _ => text(200, "ok\n"),
    }
}
