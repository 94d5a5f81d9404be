//! HTTP calls: `proxy_http_call` to a known cluster.

use std::time::Duration;

use crate::headers::{self, HeaderMap};
use crate::world::{show, CallState, Deferred, HttpCall};

use super::memory::{read, write_u32};
use super::{status, with_world, Hc, BAD_ARGUMENT, C};

#[allow(clippy::too_many_arguments)]
pub(super) fn proxy_http_call(
    c: &mut C,
    up_ptr: i32,
    up_len: i32,
    headers_ptr: i32,
    headers_len: i32,
    body_ptr: i32,
    body_len: i32,
    trailers_ptr: i32,
    trailers_len: i32,
    timeout_ms: i32,
    token_ptr: i32,
) -> Hc {
    let cluster = String::from_utf8_lossy(&read(c, up_ptr, up_len)?).into_owned();
    let Some(headers) = headers::decode(&read(c, headers_ptr, headers_len)?) else {
        return Err(status(BAD_ARGUMENT, "malformed header pairs"));
    };
    let body = read(c, body_ptr, body_len)?;
    if headers::decode(&read(c, trailers_ptr, trailers_len)?).is_none() {
        return Err(status(BAD_ARGUMENT, "malformed trailer pairs"));
    }
    let headers = HeaderMap::from_pairs(&headers);
    let detail = format!(
        "{cluster:?}, {headers:?}, {}, {}ms",
        show(&body),
        timeout_ms as u32
    );
    let vm_name = c.data().name.clone();
    let token = with_world(c, |w, vm| {
        // Envoy refuses a call without these, or to an unknown cluster.
        for required in [":method", ":path", ":authority"] {
            if !headers.contains(required) {
                return Err(status(BAD_ARGUMENT, format!("{detail}: no {required}")));
            }
        }
        if !w.clusters.contains(&cluster) {
            return Err(status(BAD_ARGUMENT, format!("{detail}: unknown cluster")));
        }
        let Some((context_id, _)) = w.current_ctx(vm) else {
            return Err(status(BAD_ARGUMENT, format!("{detail}: no context")));
        };
        let sent_at = w.elapsed();
        let state = &mut w.vms[vm];
        state.next_token += 1;
        let token = state.next_token;
        let id = w.calls.len();
        w.calls.push(HttpCall {
            id,
            vm: vm_name,
            cluster,
            headers,
            body,
            timeout: Duration::from_millis(u64::from(timeout_ms as u32)),
            sent_at,
            state: CallState::Pending,
            vm_index: vm,
            context_id,
            token,
        });
        w.deferred.push_back(Deferred::CallMade { call: id });
        Ok(token)
    })?;
    write_u32(c, token_ptr, token)?;
    Ok(format!("{detail}: token {token}"))
}
