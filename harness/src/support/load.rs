//! An open-loop load generator: requests are scheduled at a fixed rate
//! whatever the answers do, spread over a fixed set of connections, and
//! every one is recorded (when it was due, how long it took, whether it
//! succeeded, which app served it, whether it carried the closing mark).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{mpsc, Mutex};
use tokio::task::JoinHandle;

use crate::support::client::Conn;

/// The protocol the load speaks to the consumer sidecar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Http1,
    Http2,
    Grpc,
}

impl std::str::FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "http1" => Ok(Protocol::Http1),
            "http2" => Ok(Protocol::Http2),
            "grpc" => Ok(Protocol::Grpc),
            _ => Err(format!("unknown protocol {s:?} (http1, http2, grpc)")),
        }
    }
}

/// What the load asks: the method, and a share of long requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// `GET`, or `POST` (a non-idempotent call: with no retry policy, a
    /// consumer never retries it).
    pub method: &'static str,
    /// Every `long_every`-th request (0: none) is `/delay/MS`, MS spread
    /// evenly over `long_ms` (a slow query, an upload).
    pub long_every: u64,
    pub long_ms: (u64, u64),
    /// Each HTTP path carries the request's sequence number as a query
    /// (`?seq=N`, which the demo app ignores), so the consumer's and the
    /// providers' access logs name the same request.
    pub numbered: bool,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            method: "GET",
            long_every: 0,
            long_ms: (0, 0),
            numbered: false,
        }
    }
}

impl Shape {
    /// The path of the `seq`-th request (0-based) and whether it is long.
    /// Deterministic, so every approach of a scenario gets the same load.
    pub fn path(&self, seq: u64) -> (String, bool) {
        let (path, long) = if self.long_every > 0 && seq % self.long_every == self.long_every - 1 {
            let (lo, hi) = self.long_ms;
            let span = hi.saturating_sub(lo) + 1;
            // A multiplicative step spreads durations over the range.
            let ms = lo + (seq / self.long_every).wrapping_mul(7919) % span;
            (format!("/delay/{ms}"), true)
        } else {
            ("/".to_string(), false)
        };
        if self.numbered {
            (format!("{path}?seq={seq}"), long)
        } else {
            (path, long)
        }
    }

    /// A request's time bound: the longest request plus [`REQUEST_TIMEOUT`].
    pub fn timeout(&self) -> Duration {
        REQUEST_TIMEOUT + Duration::from_millis(self.long_ms.1)
    }
}

/// One request as the client saw it.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// When it was due, in ms since the run started.
    pub due_ms: u64,
    /// From due time to the end of the answer (includes queueing, so a
    /// stall shows; no coordinated omission).
    pub latency_us: u64,
    pub ok: bool,
    /// 1-based index of the app that served it (`x-served-by: pN`), 0 if none.
    pub served_by: u8,
    /// The answer carried `x-graceful-closing: true`.
    pub marked: bool,
    /// One of the shape's long requests (left out of latency percentiles).
    pub long: bool,
}

/// Per-request bound: a request unanswered by then counts as failed.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// A running load; [`Load::stop`] ends it and returns the samples.
pub struct Load {
    stop: mpsc::Sender<()>,
    dispatcher: JoinHandle<()>,
    workers: Vec<JoinHandle<Vec<Sample>>>,
}

impl Load {
    /// Starts `rate` GETs per second over `conns` connections.
    pub fn start(
        addr: SocketAddr,
        protocol: Protocol,
        rate: u32,
        conns: usize,
        epoch: Instant,
    ) -> Load {
        Load::start_shaped(addr, protocol, rate, conns, epoch, Shape::default())
    }

    /// Starts `rate` requests per second over `conns` connections, as
    /// `shape` says.
    pub fn start_shaped(
        addr: SocketAddr,
        protocol: Protocol,
        rate: u32,
        conns: usize,
        epoch: Instant,
        shape: Shape,
    ) -> Load {
        let (jobs_tx, jobs_rx) = mpsc::channel::<(Instant, u64)>(conns * 64);
        let jobs_rx = Arc::new(Mutex::new(jobs_rx));
        let (stop, mut stopped) = mpsc::channel::<()>(1);
        let period = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
        let dispatcher = tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut seq = 0u64;
            loop {
                tokio::select! {
                    at = tick.tick() => {
                        if jobs_tx.send((at.into_std(), seq)).await.is_err() {
                            break;
                        }
                        seq += 1;
                    }
                    _ = stopped.recv() => break,
                }
            }
        });
        let workers = (0..conns)
            .map(|_| {
                let jobs = jobs_rx.clone();
                tokio::spawn(async move { worker(addr, protocol, shape, jobs, epoch).await })
            })
            .collect();
        Load {
            stop,
            dispatcher,
            workers,
        }
    }

    /// Stops scheduling, waits for requests in flight, returns all samples
    /// ordered by due time.
    pub async fn stop(self) -> Vec<Sample> {
        let _ = self.stop.send(()).await;
        let _ = self.dispatcher.await;
        let mut all = Vec::new();
        for w in self.workers {
            if let Ok(samples) = w.await {
                all.extend(samples);
            }
        }
        all.sort_by_key(|s| s.due_ms);
        all
    }
}

async fn connect(addr: SocketAddr, protocol: Protocol) -> Option<Conn> {
    match protocol {
        Protocol::Http1 => Conn::http1(addr).await.ok(),
        Protocol::Http2 | Protocol::Grpc => Conn::http2(addr).await.ok(),
    }
}

async fn worker(
    addr: SocketAddr,
    protocol: Protocol,
    shape: Shape,
    jobs: Arc<Mutex<mpsc::Receiver<(Instant, u64)>>>,
    epoch: Instant,
) -> Vec<Sample> {
    let mut samples = Vec::new();
    let mut conn: Option<Conn> = None;
    loop {
        let (due, seq) = {
            let mut rx = jobs.lock().await;
            match rx.recv().await {
                Some(due) => due,
                None => break,
            }
        };
        // A connection the server ended (HTTP/2 GOAWAY; HTTP/1.1 closed)
        // takes no new request: a client opens another, as HTTP/2 and gRPC
        // clients do.
        if conn.as_ref().is_some_and(Conn::is_closed) {
            conn = None;
        }
        if conn.is_none() {
            conn = connect(addr, protocol).await;
        }
        let (path, long) = shape.path(seq);
        let answer = match conn.as_mut() {
            None => None,
            Some(c) => {
                let call = async {
                    match protocol {
                        Protocol::Grpc => c.grpc("/echo.Echo/Say", b"ping").await,
                        _ => c.send(shape.method, &path, &[], Bytes::new()).await,
                    }
                };
                tokio::time::timeout(shape.timeout(), call)
                    .await
                    .ok()
                    .and_then(Result::ok)
            }
        };
        let latency_us = u64::try_from(due.elapsed().as_micros()).unwrap_or(u64::MAX);
        let due_ms = u64::try_from(due.saturating_duration_since(epoch).as_millis()).unwrap_or(0);
        let sample = match answer {
            None => {
                conn = None; // the connection is suspect: start a new one
                Sample {
                    due_ms,
                    latency_us,
                    ok: false,
                    served_by: 0,
                    marked: false,
                    long,
                }
            }
            Some(r) => {
                let ok = match protocol {
                    Protocol::Grpc => r.status == 200 && r.grpc_status().as_deref() == Some("0"),
                    _ => r.status == 200,
                };
                let served_by = r
                    .header("x-served-by")
                    .and_then(|n| n.strip_prefix('p').and_then(|i| i.parse::<u8>().ok()))
                    .unwrap_or(0);
                let marked = r.header("x-graceful-closing").as_deref() == Some("true");
                if protocol == Protocol::Http1
                    && r.header("connection")
                        .is_some_and(|c| c.eq_ignore_ascii_case("close"))
                {
                    // As an HTTP/1.1 client must (RFC 9112, 9.6): no more
                    // requests on a connection the server is closing.
                    conn = None;
                }
                Sample {
                    due_ms,
                    latency_us,
                    ok,
                    served_by,
                    marked,
                    long,
                }
            }
        };
        samples.push(sample);
    }
    samples
}
