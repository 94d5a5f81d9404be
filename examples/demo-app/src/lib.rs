//! The demo's app, and the upstream of the end-to-end tests: HTTP/1.1 and
//! HTTP/2 (h2c, so gRPC too) on one port.
//!
//! | path                             | answer                                                      |
//! |----------------------------------|-------------------------------------------------------------|
//! | `/delay/<ms>`                    | 200 `ok` after `<ms>` milliseconds                          |
//! | `/reset-after/<ms>`              | 200, one body chunk, then the stream is reset after `<ms>`  |
//! | `/echo.Echo/Say`                 | gRPC unary echo: the request message back, `grpc-status: 0` |
//! | `/grpc/trailers`                 | gRPC: one message, trailers `grpc-status: 0`                |
//! | `/grpc/no-trailers`              | gRPC content type, one message, no trailers                 |
//! | `/grpc.health.v1.Health/Check`   | gRPC health: SERVING                                        |
//! | `/grpc.health.v1.Health/Watch`   | gRPC health stream: SERVING, then held for 10 minutes (OK)  |
//! | `/grpc/hold`                     | gRPC server stream: one message, then held for 10 minutes   |
//! | `/ws`                            | a WebSocket (HTTP/1.1 upgrade): echoes each message until closed |
//! | `POST /shutdown`                 | 200; counted in `shutdown_calls` (an `on_drained` hook)     |
//! | `/graceful/ready`                | what graceful_drain answers a consumer's probe: 200 (503 while closing) with the instance id and `x-graceful-address` |
//! | anything else                    | 200 `ok`, after the configured latency                      |
//!
//! Every answer carries `x-served-by: <name>` when a name is set, so a load
//! generator can tell which app served it. For tests the app can also stand
//! in for a provider sidecar: [`App::set_instance`] stamps every answer with
//! `x-graceful-instance`, [`App::set_closing`] with `x-graceful-closing: true`.

use std::convert::Infallible;
use std::future::Future;
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
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the app counts and how it answers; shared with its connections.
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

/// How the app answers.
#[derive(Debug, Clone, Default)]
pub struct AppConfig {
    /// Sent back in `x-served-by` (none when empty).
    pub name: String,
    /// Added before answering ordinary requests.
    pub latency: Duration,
}

/// A running app; dies when dropped (listener and every connection closed at
/// once, mid-request), or stops gracefully with [`App::shutdown`].
pub struct App {
    pub addr: SocketAddr,
    pub counters: Arc<Counters>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

/// gRPC length-prefixed framing: flag byte 0, u32 big-endian length, bytes.
pub fn grpc_frame(message: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(0);
    out.extend_from_slice(
        &u32::try_from(message.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    out.extend_from_slice(message);
    Bytes::from(out)
}

impl App {
    /// Starts on 127.0.0.1 with a port of the kernel's choosing (tests).
    pub async fn start() -> App {
        match App::start_with(SocketAddr::from(([127, 0, 0, 1], 0)), AppConfig::default()).await {
            Ok(app) => app,
            Err(e) => panic!("app cannot bind 127.0.0.1: {e}"),
        }
    }

    pub async fn start_with(bind: SocketAddr, config: AppConfig) -> std::io::Result<App> {
        let listener = TcpListener::bind(bind).await?;
        let addr = listener.local_addr()?;
        let counters = Arc::new(Counters::default());
        let shared = counters.clone();
        let config = Arc::new(config);
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let graceful = GracefulShutdown::new();
            // Connections live in this set, so aborting the app's task (a
            // drop: the app dies) aborts them too, mid-request.
            let mut connections = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        // A response's frames go out as written: with Nagle,
                        // a write after an unacknowledged one waits for the
                        // peer's delayed ACK (40 ms on Linux loopback).
                        let _ = stream.set_nodelay(true);
                        let counters = shared.clone();
                        let config = config.clone();
                        let service = service_fn(move |req| handle(req, counters.clone(), config.clone(), addr));
                        let builder = auto::Builder::new(TokioExecutor::new());
                        let conn = builder
                            .serve_connection_with_upgrades(TokioIo::new(stream), service)
                            .into_owned();
                        let conn = graceful.watch(conn);
                        while connections.try_join_next().is_some() {}
                        connections.spawn(async move {
                            let _ = conn.await;
                        });
                    }
                    _ = stopped.changed() => break,
                }
            }
            // Listener dropped: no new connections. Let the open ones finish
            // their requests (idle keep-alive connections close at once).
            graceful.shutdown().await;
            drop(connections);
        });
        Ok(App {
            addr,
            counters,
            stop,
            task: Some(task),
        })
    }

    /// Stops accepting and waits (at most `grace`) for in-flight requests.
    pub async fn shutdown(mut self, grace: Duration) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(grace, task).await;
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

impl Drop for App {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

type Body = BoxBody<Bytes, std::io::Error>;

/// A body that sends one chunk, then fails after a delay: hyper then resets
/// the stream (HTTP/2) or closes the connection (HTTP/1.1) mid-body.
struct ResetBody {
    sent: bool,
    delay: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl hyper::body::Body for ResetBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, std::io::Error>>> {
        if !self.sent {
            self.sent = true;
            return std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(Bytes::from_static(
                b"partial",
            )))));
        }
        match self.delay.as_mut().poll(cx) {
            std::task::Poll::Pending => std::task::Poll::Pending,
            std::task::Poll::Ready(()) => {
                std::task::Poll::Ready(Some(Err(std::io::Error::other("reset mid-body"))))
            }
        }
    }
}

/// A held gRPC server stream (a health `Watch`: nothing changes while the
/// app runs): one message, then the stream open until `hold` runs out,
/// then `grpc-status: 0`.
struct HeldBody {
    message: &'static [u8],
    sent: bool,
    hold: std::pin::Pin<Box<tokio::time::Sleep>>,
    ended: bool,
}

impl HeldBody {
    fn response(message: &'static [u8]) -> Response<Body> {
        let body = HeldBody {
            message,
            sent: false,
            hold: Box::pin(tokio::time::sleep(Duration::from_secs(600))),
            ended: false,
        };
        let mut res = Response::new(BodyExt::boxed(body));
        res.headers_mut()
            .insert("content-type", HeaderValue::from_static("application/grpc"));
        res
    }
}

impl hyper::body::Body for HeldBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, std::io::Error>>> {
        use std::task::Poll;
        if !self.sent {
            self.sent = true;
            return Poll::Ready(Some(Ok(hyper::body::Frame::data(grpc_frame(self.message)))));
        }
        if self.ended {
            return Poll::Ready(None);
        }
        match self.hold.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(()) => {
                self.ended = true;
                let mut trailers = HeaderMap::new();
                trailers.insert("grpc-status", HeaderValue::from_static("0"));
                Poll::Ready(Some(Ok(hyper::body::Frame::trailers(trailers))))
            }
        }
    }
}

fn text(status: u16, body: &'static str) -> Response<Body> {
    let mut res = Response::new(
        Full::new(Bytes::from_static(body.as_bytes()))
            .map_err(|e| match e {})
            .boxed(),
    );
    *res.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::OK);
    res
}

fn grpc(message: &[u8], with_trailers: bool) -> Response<Body> {
    let body = Full::new(grpc_frame(message));
    let body = if with_trailers {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        body.with_trailers(async move { Some(Ok(trailers)) })
            .map_err(|e| match e {})
            .boxed()
    } else {
        body.map_err(|e| match e {}).boxed()
    };
    let mut res = Response::new(body);
    res.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
    res
}

/// `/ws`: accepts a WebSocket upgrade and echoes every text or binary
/// message until the client or the connection ends it.
fn websocket(mut req: Request<Incoming>) -> Response<Body> {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
    use tokio_tungstenite::tungstenite::protocol::Role;

    let upgrade = req
        .headers()
        .get("upgrade")
        .is_some_and(|u| u.as_bytes().eq_ignore_ascii_case(b"websocket"));
    let accept = req
        .headers()
        .get("sec-websocket-key")
        .map(|k| derive_accept_key(k.as_bytes()));
    let (true, Some(accept)) = (upgrade, accept) else {
        return text(400, "not a WebSocket upgrade\n");
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(upgraded) = on_upgrade.await else {
            return;
        };
        let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
            TokioIo::new(upgraded),
            Role::Server,
            None,
        )
        .await;
        while let Some(Ok(message)) = ws.next().await {
            if (message.is_text() || message.is_binary()) && ws.send(message).await.is_err() {
                break;
            }
        }
    });
    let mut res = text(101, "");
    let headers = res.headers_mut();
    headers.insert("connection", HeaderValue::from_static("upgrade"));
    headers.insert("upgrade", HeaderValue::from_static("websocket"));
    if let Ok(v) = HeaderValue::from_str(&accept) {
        headers.insert("sec-websocket-accept", v);
    }
    res
}

async fn handle(
    req: Request<Incoming>,
    counters: Arc<Counters>,
    config: Arc<AppConfig>,
    addr: SocketAddr,
) -> Result<Response<Body>, Infallible> {
    let mut res = route(req, &counters, &config, addr).await;
    let headers = res.headers_mut();
    if !config.name.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&config.name) {
            headers.insert("x-served-by", v);
        }
    }
    let instance = counters
        .instance
        .lock()
        .map(|i| i.clone())
        .unwrap_or_default();
    if !instance.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&instance) {
            headers.insert("x-graceful-instance", v);
        }
    }
    if counters.closing.load(Ordering::SeqCst) {
        headers.insert("x-graceful-closing", HeaderValue::from_static("true"));
    }
    Ok(res)
}

async fn route(
    req: Request<Incoming>,
    counters: &Counters,
    config: &AppConfig,
    addr: SocketAddr,
) -> Response<Body> {
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
    if path == "/ws" {
        return websocket(req);
    }
    let method = req.method().clone();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    if let Some(ms) = path
        .strip_prefix("/reset-after/")
        .and_then(|ms| ms.parse::<u64>().ok())
    {
        let delay = Box::pin(tokio::time::sleep(Duration::from_millis(ms)));
        return Response::new(BodyExt::boxed(ResetBody { sent: false, delay }));
    }
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
        // HealthCheckResponse { status: SERVING (1) }
        (_, "/grpc.health.v1.Health/Watch") => HeldBody::response(&[0x08, 0x01]),
        (_, "/grpc/hold") => HeldBody::response(b"hello"),
        (_, "/echo.Echo/Say") => {
            sleep(config.latency).await;
            // The request's single frame, echoed: strip the 5-byte prefix.
            grpc(body.get(5..).unwrap_or_default(), true)
        }
        ("POST", "/shutdown") => {
            counters.shutdown_calls.fetch_add(1, Ordering::SeqCst);
            if let Ok(mut last) = counters.last_shutdown_body.lock() {
                *last = String::from_utf8_lossy(&body).into_owned();
            }
            text(200, "bye\n")
        }
        _ => {
            sleep(config.latency).await;
            text(200, "ok\n")
        }
    }
}

async fn sleep(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}
