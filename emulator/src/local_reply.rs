//! Local replies: a filter's `send_local_response` is delivered after the VM
//! call returns, rendered as Envoy's `sendLocalReply` renders it (a gRPC
//! request gets a trailers-only reply with `grpc-status` derived from the
//! HTTP status and `grpc-message` from the body), through the encoder
//! callbacks of the filters that saw the request, the sender included.

use crate::headers::HeaderMap;
use crate::world::{Callback, LocalReply, Open};
use crate::{Host, StreamId};

/// Envoy's gRPC status for a local reply's HTTP status
/// (`Grpc::Utility::httpToGrpcStatus`).
pub(crate) fn http_to_grpc_status(http: u32) -> u32 {
    match http {
        400 => 13,
        401 => 16,
        403 => 7,
        404 => 12,
        429 | 502 | 503 | 504 => 14,
        _ => 2,
    }
}

/// Envoy's `PercentEncoding::encode` for `grpc-message`.
pub(crate) fn percent_encode(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    for &b in bytes {
        if !(b' '..b'~').contains(&b) || b == b'%' {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        } else {
            out.push(b);
        }
    }
    out
}

/// What Envoy's `sendLocalReply` makes of a filter's local reply: the
/// headers and body the encoder filters (and the client) see.
pub(crate) fn render_local_reply(reply: &LocalReply, grpc: bool) -> (HeaderMap, Vec<u8>) {
    let mut h = HeaderMap::default();
    h.add(b":status", reply.status.to_string().as_bytes());
    for (k, v) in reply.headers.entries() {
        h.add(k, v);
    }
    if grpc {
        // Trailers-only: status in headers, the body is dropped.
        h.replace(b":status", b"200");
        h.replace(b"content-type", b"application/grpc");
        if !h.contains("grpc-status") {
            let code = reply
                .grpc_status
                .unwrap_or_else(|| http_to_grpc_status(reply.status));
            h.add(b"grpc-status", code.to_string().as_bytes());
        }
        if !reply.body.is_empty() {
            let body = reply.body.strip_suffix(b"\n").unwrap_or(&reply.body);
            h.replace(b"grpc-message", &percent_encode(body));
        }
        h.remove(b"content-length");
        return (h, Vec::new());
    }
    if reply.body.is_empty() {
        h.remove(b"content-length");
        h.remove(b"content-type");
    } else {
        h.replace(b"content-length", reply.body.len().to_string().as_bytes());
        if !h.contains("content-type") {
            h.add(b"content-type", b"text/plain");
        }
    }
    (h, reply.body.clone())
}

impl Host {
    /// Envoy delivering a filter's local reply (after the VM call that sent
    /// it returned): rendered like `sendLocalReply`, then through the
    /// encoder callbacks of filter `j` and those before it, last first.
    pub(crate) fn deliver_local_reply(&mut self, s: usize, j: usize) -> Result<(), String> {
        let (headers, body) = {
            let mut w = self.world.borrow_mut();
            let st = &mut w.streams[s];
            let Some(reply) = st.local_reply.clone() else {
                return Ok(());
            };
            let (headers, body) = render_local_reply(&reply, st.grpc);
            st.response_started = true;
            st.response_headers = Some(headers.clone());
            st.stopped_at.get_or_insert(j);
            w.note(
                "host",
                format!(
                    "stream {s}: Envoy sends the local reply of {}: {headers:?}",
                    reply.vm
                ),
            );
            (headers, body)
        };
        let _ = headers;
        let order: Vec<usize> = (0..=j).rev().collect();
        let eos = body.is_empty();
        self.world.borrow_mut().streams[s].response_complete = eos;
        self.encode_headers(s, &order, eos)?;
        if !eos {
            self.world.borrow_mut().streams[s].response_body = body.clone();
            for &k in &order {
                let (vm, ctx) = self.slot(s, k);
                self.set_open(
                    s,
                    k,
                    Open {
                        response_body: true,
                        end_of_stream: true,
                        ..Open::default()
                    },
                );
                let f = self.vms[vm].ex.response_body.clone();
                let len = body.len();
                self.call(
                    vm,
                    ctx,
                    Callback::ResponseBody,
                    f,
                    (ctx as i32, len as i32, 1),
                    format!("proxy_on_response_body({ctx}, {len}, eos=true)"),
                )?;
                self.set_open(s, k, Open::default());
            }
            let mut w = self.world.borrow_mut();
            let st = &mut w.streams[s];
            let chunk = std::mem::take(&mut st.response_body);
            st.response_body_total.extend_from_slice(&chunk);
            st.response_complete = true;
        }
        Ok(())
    }

    /// The local reply a filter sent on this stream, as it asked for it.
    pub fn local_reply(&self, s: StreamId) -> Option<LocalReply> {
        self.world.borrow().streams[s.0].local_reply.clone()
    }
}
