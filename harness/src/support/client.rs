//! Small HTTP clients for the tests: HTTP/1.1 keep-alive and HTTP/2
//! (prior knowledge, as gRPC uses) connections over hyper, plus gRPC framing.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper::header::HeaderMap;
use hyper::{Request, Response as HyperResponse};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};

pub use demo_app::grpc_frame;

/// A whole response: status, headers, body and trailers.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub trailers: Option<HeaderMap>,
}

impl Response {
    /// A header's value as text (lossy), None if absent.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    }

    /// A trailer's value as text, None if absent or no trailers.
    pub fn trailer(&self, name: &str) -> Option<String> {
        self.trailers
            .as_ref()?
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The gRPC status: from trailers, or from headers for trailers-only.
    pub fn grpc_status(&self) -> Option<String> {
        self.trailer("grpc-status")
            .or_else(|| self.header("grpc-status"))
    }
}

enum Sender {
    H1(http1::SendRequest<Full<Bytes>>),
    H2(http2::SendRequest<Full<Bytes>>),
}

/// One client connection; requests on it go one after another (HTTP/1.1
/// keep-alive) or may be cloned for concurrent streams (HTTP/2).
pub struct Conn {
    sender: Sender,
}

/// Per-request bound: every test wait has a deadline.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

impl Conn {
    pub async fn http1(addr: SocketAddr) -> Result<Conn, String> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        Conn::http1_over(stream).await
    }

    /// [`Conn::http1`] from `source` (another loopback address, say: a
    /// second caller as the server sees it).
    pub async fn http1_from(addr: SocketAddr, source: IpAddr) -> Result<Conn, String> {
        let socket = match source {
            IpAddr::V4(_) => TcpSocket::new_v4(),
            IpAddr::V6(_) => TcpSocket::new_v6(),
        }
        .map_err(|e| e.to_string())?;
        socket
            .bind(SocketAddr::new(source, 0))
            .map_err(|e| format!("bind {source}: {e}"))?;
        let stream = socket
            .connect(addr)
            .await
            .map_err(|e| format!("connect {addr} from {source}: {e}"))?;
        Conn::http1_over(stream).await
    }

    async fn http1_over(stream: TcpStream) -> Result<Conn, String> {
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let (sender, conn) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        Ok(Conn {
            sender: Sender::H1(sender),
        })
    }

    pub async fn http2(addr: SocketAddr) -> Result<Conn, String> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        // A request's HEADERS and DATA frames are two writes: with Nagle
        // the DATA waits for the peer's delayed ACK (40 ms on loopback),
        // which made every gRPC call of the demo take 40 ms and its open-
        // loop load queue for seconds.
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let (sender, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        Ok(Conn {
            sender: Sender::H2(sender),
        })
    }

    /// Sends a request and reads the whole response.
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<Response, String> {
        let mut req = Request::builder().method(method).uri(path);
        if matches!(self.sender, Sender::H1(_)) {
            req = req.header("host", "test");
        } else {
            req = req.uri(format!("http://test{path}"));
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(body)).map_err(|e| e.to_string())?;
        let fut = async {
            let res = match &mut self.sender {
                Sender::H1(s) => {
                    s.ready().await.map_err(|e| e.to_string())?;
                    s.send_request(req).await
                }
                Sender::H2(s) => {
                    s.ready().await.map_err(|e| e.to_string())?;
                    s.send_request(req).await
                }
            };
            collect(res.map_err(|e| e.to_string())?).await
        };
        tokio::time::timeout(REQUEST_TIMEOUT, fut)
            .await
            .map_err(|_| format!("{method} {path}: no answer within {REQUEST_TIMEOUT:?}"))?
    }

    pub async fn get(&mut self, path: &str) -> Result<Response, String> {
        self.send("GET", path, &[], Bytes::new()).await
    }

    /// The connection has ended: closed by either side (HTTP/1.1 after a
    /// `connection: close` answer), or, for HTTP/2, no new stream can open.
    pub fn is_closed(&self) -> bool {
        match &self.sender {
            Sender::H1(s) => s.is_closed(),
            Sender::H2(s) => s.is_closed(),
        }
    }

    /// A unary gRPC call with one framed message.
    pub async fn grpc(&mut self, path: &str, message: &[u8]) -> Result<Response, String> {
        let headers = [("content-type", "application/grpc"), ("te", "trailers")];
        self.send("POST", path, &headers, grpc_frame(message)).await
    }
}

/// How [`H2Conn::get`]'s error begins when the server had sent the
/// connection GOAWAY: the client must open a new connection.
pub const GOAWAY: &str = "the server sent GOAWAY";

/// An HTTP/2 connection on the `h2` library itself: hyper's client hides
/// a GOAWAY behind "channel closed", h2's errors name it.
pub struct H2Conn {
    sender: h2::client::SendRequest<Bytes>,
}

impl H2Conn {
    pub async fn connect(addr: SocketAddr) -> Result<H2Conn, String> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let (sender, conn) = h2::client::handshake(stream)
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(H2Conn { sender })
    }

    /// A GET on a new stream and its status, its body read; a GOAWAY from
    /// the server is an error that begins with [`GOAWAY`].
    pub async fn get(&mut self, path: &str) -> Result<u16, String> {
        let named = |e: h2::Error| {
            if e.is_go_away() && e.is_remote() {
                format!("{GOAWAY} ({:?})", e.reason())
            } else {
                e.to_string()
            }
        };
        let fut = async {
            let mut sender = self.sender.clone().ready().await.map_err(named)?;
            let req = Request::get(format!("http://test{path}"))
                .body(())
                .map_err(|e| e.to_string())?;
            let (answer, _) = sender.send_request(req, true).map_err(named)?;
            let answer = answer.await.map_err(named)?;
            let status = answer.status().as_u16();
            let mut body = answer.into_body();
            while let Some(chunk) = body.data().await {
                let chunk = chunk.map_err(named)?;
                let _ = body.flow_control().release_capacity(chunk.len());
            }
            Ok(status)
        };
        tokio::time::timeout(REQUEST_TIMEOUT, fut)
            .await
            .map_err(|_| format!("GET {path}: no answer within {REQUEST_TIMEOUT:?}"))?
    }
}

/// What a gRPC server stream ([`H2Conn::grpc_stream`]) gives next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrpcEvent {
    /// One message, without its 5-byte frame prefix.
    Message(Vec<u8>),
    /// The stream ended with this `grpc-status` and `grpc-message` (in
    /// trailers, or in the headers of a trailers-only answer).
    Ended {
        status: Option<String>,
        message: Option<String>,
    },
    /// The stream was reset, or its connection failed.
    Reset(String),
}

/// A gRPC call whose answer is read message by message.
pub struct GrpcStream {
    /// A trailers-only answer's end, told by the first `next`.
    ended: Option<GrpcEvent>,
    body: Option<h2::RecvStream>,
    buf: Vec<u8>,
}

fn grpc_end(headers: &HeaderMap) -> GrpcEvent {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    GrpcEvent::Ended {
        status: text("grpc-status"),
        message: text("grpc-message"),
    }
}

impl GrpcStream {
    /// The next message or the end, within `within`.
    pub async fn next(&mut self, within: Duration) -> Result<GrpcEvent, String> {
        tokio::time::timeout(within, self.read())
            .await
            .map_err(|_| format!("nothing on the gRPC stream within {within:?}"))
    }

    async fn read(&mut self) -> GrpcEvent {
        if let Some(end) = self.ended.take() {
            return end;
        }
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]);
                let end = 5 + len as usize;
                if self.buf.len() >= end {
                    let message = self.buf[5..end].to_vec();
                    self.buf.drain(..end);
                    return GrpcEvent::Message(message);
                }
            }
            let Some(body) = self.body.as_mut() else {
                return GrpcEvent::Reset("read past the end".into());
            };
            match body.data().await {
                Some(Ok(chunk)) => {
                    let _ = body.flow_control().release_capacity(chunk.len());
                    self.buf.extend_from_slice(&chunk);
                }
                Some(Err(e)) => return GrpcEvent::Reset(e.to_string()),
                None => {
                    let end = match body.trailers().await {
                        Ok(Some(t)) => grpc_end(&t),
                        Ok(None) => GrpcEvent::Ended {
                            status: None,
                            message: None,
                        },
                        Err(e) => GrpcEvent::Reset(e.to_string()),
                    };
                    self.body = None;
                    return end;
                }
            }
        }
    }
}

impl H2Conn {
    /// Starts a gRPC call of `path` with one empty request message (a
    /// `HealthCheckRequest` for every service) and returns once the answer's
    /// headers arrived.
    pub async fn grpc_stream(&mut self, path: &str) -> Result<GrpcStream, String> {
        let fut = async {
            let mut sender = self
                .sender
                .clone()
                .ready()
                .await
                .map_err(|e| e.to_string())?;
            let req = Request::post(format!("http://test{path}"))
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(())
                .map_err(|e| e.to_string())?;
            let (answer, mut send) = sender.send_request(req, false).map_err(|e| e.to_string())?;
            send.send_data(grpc_frame(&[]), true)
                .map_err(|e| e.to_string())?;
            let answer = answer.await.map_err(|e| e.to_string())?;
            let (parts, body) = answer.into_parts();
            let trailers_only = parts.headers.contains_key("grpc-status");
            Ok(GrpcStream {
                ended: trailers_only.then(|| grpc_end(&parts.headers)),
                body: (!trailers_only).then_some(body),
                buf: Vec::new(),
            })
        };
        tokio::time::timeout(REQUEST_TIMEOUT, fut)
            .await
            .map_err(|_| format!("POST {path}: no answer within {REQUEST_TIMEOUT:?}"))?
    }
}

async fn collect(res: HyperResponse<Incoming>) -> Result<Response, String> {
    let (parts, body) = res.into_parts();
    let collected = body.collect().await.map_err(|e| e.to_string())?;
    let trailers = collected.trailers().cloned();
    Ok(Response {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body: collected.to_bytes(),
        trailers,
    })
}

/// One HTTP/1.1 request on a fresh connection.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Response, String> {
    Conn::http1(addr)
        .await?
        .send(method, path, headers, Bytes::new())
        .await
}

pub async fn get(addr: SocketAddr, path: &str) -> Result<Response, String> {
    request(addr, "GET", path, &[]).await
}

pub async fn post(addr: SocketAddr, path: &str) -> Result<Response, String> {
    request(addr, "POST", path, &[]).await
}

/// Sends a request on a raw connection and closes it after `after` without
/// reading the answer: a client abort.
pub async fn abort_after(addr: SocketAddr, path: &str, after: Duration) -> Result<(), String> {
    let mut stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let req = format!("GET {path} HTTP/1.1\r\nhost: test\r\n\r\n");
    stream
        .write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    tokio::time::sleep(after).await;
    drop(stream);
    Ok(())
}

/// Runs `per_conn` sequential GETs of `path` on each of `conns` keep-alive
/// HTTP/1.1 connections at once; returns every response. A connection
/// that was answered `connection: close` is replaced by a new one, as an
/// HTTP/1.1 client must. Panics on a transport error (a test wants to
/// know).
pub async fn load(
    addr: SocketAddr,
    conns: usize,
    per_conn: usize,
    path: &'static str,
) -> Vec<Response> {
    let tasks: Vec<_> = (0..conns)
        .map(|_| {
            tokio::spawn(async move {
                let mut conn = Conn::http1(addr).await.unwrap_or_else(|e| panic!("{e}"));
                let mut out = Vec::with_capacity(per_conn);
                for _ in 0..per_conn {
                    if conn.is_closed() {
                        conn = Conn::http1(addr).await.unwrap_or_else(|e| panic!("{e}"));
                    }
                    let r = conn.get(path).await.unwrap_or_else(|e| panic!("{e}"));
                    if r.header("connection").as_deref() == Some("close") {
                        conn = Conn::http1(addr).await.unwrap_or_else(|e| panic!("{e}"));
                    }
                    out.push(r);
                }
                out
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap_or_else(|e| panic!("load task: {e}")));
    }
    all
}
