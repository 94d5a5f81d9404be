//! Local replies: `proxy_send_local_response` on the current stream.

use wasmtime::Error;

use crate::headers::{self, HeaderMap};
use crate::world::{show, Ctx, Deferred, LocalReply};

use super::memory::read;
use super::{status, with_world, Fail, Hc, BAD_ARGUMENT, C};

#[allow(clippy::too_many_arguments)]
pub(super) fn proxy_send_local_response(
    c: &mut C,
    code: i32,
    details_ptr: i32,
    details_len: i32,
    body_ptr: i32,
    body_len: i32,
    headers_ptr: i32,
    headers_len: i32,
    grpc_status: i32,
) -> Hc {
    let details = String::from_utf8_lossy(&read(c, details_ptr, details_len)?).into_owned();
    let body = read(c, body_ptr, body_len)?;
    let Some(headers) = headers::decode(&read(c, headers_ptr, headers_len)?) else {
        return Err(status(BAD_ARGUMENT, "malformed header pairs"));
    };
    let headers = HeaderMap::from_pairs(&headers);
    let detail = format!("{code}, {headers:?}, {}, grpc {grpc_status}", show(&body));
    let vm_name = c.data().name.clone();
    with_world(c, |w, vm| {
        let Some((_, Ctx::Stream { stream, filter })) = w.current_ctx(vm) else {
            // Envoy has no decoder callbacks on a root context: the reply
            // goes nowhere, and the call still says Ok.
            return Ok(format!("{detail} [no stream: ignored, as Envoy does]"));
        };
        let s = &mut w.streams[stream];
        if s.ended {
            return Err(status(
                BAD_ARGUMENT,
                format!("{detail}: the stream has ended"),
            ));
        }
        if s.local_reply.is_some() {
            return Err(status(
                BAD_ARGUMENT,
                format!("{detail}: a local reply was already sent on this stream"),
            ));
        }
        if s.response_started {
            return Err(Fail::Trap(Error::msg(
                "send_local_response after the response started is not modelled by the test host",
            )));
        }
        s.local_reply = Some(LocalReply {
            status: code as u32,
            headers,
            body,
            grpc_status: u32::try_from(grpc_status).ok().filter(|g| *g <= 16),
            details,
            vm: vm_name,
        });
        // Envoy sends it after the VM call returns (an after-VM-call action).
        w.deferred
            .push_back(Deferred::LocalReply { stream, filter });
        Ok(detail)
    })
}
