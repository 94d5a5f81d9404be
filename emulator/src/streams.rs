//! Streams and their header maps: a stream through a filter chain, its
//! properties, and the callbacks in Envoy's order (request headers, body and
//! trailers through the decoder chain; the upstream's response back through
//! the encoders, last filter first; `on_log`, `on_done`, `on_delete` at the
//! end). A filter sees a header map only inside its callback (`Open`).

use crate::headers::HeaderMap;
use crate::world::{self, CallState, Callback, Open, Slot, Stream};
use crate::{action, must, Action, Host, StreamId, Vm};

impl Host {
    /// A new stream through one filter.
    pub fn stream(&mut self, vm: Vm) -> StreamId {
        self.stream_through(&[vm])
    }

    /// A new stream through a filter chain, in decoding order (Envoy's
    /// `http_filters` order). Defaults: `source.address` 127.0.0.1 with a
    /// port of its own, `destination.address` 127.0.0.1:10000; set others
    /// with [`set_property`](Self::set_property).
    pub fn stream_through(&mut self, chain: &[Vm]) -> StreamId {
        assert!(!chain.is_empty(), "a stream needs at least one filter");
        let mut w = self.world.borrow_mut();
        let id = w.streams.len();
        let mut slots = Vec::new();
        for vm in chain {
            let state = &mut w.vms[vm.0];
            assert!(!state.dead, "{} is dead", state.name);
            // Envoy allocates the context id when it creates the filter;
            // proxy_on_context_create runs at the first callback.
            let context_id = state.next_context_id;
            state.next_context_id += 1;
            slots.push(Slot {
                vm: vm.0,
                context_id,
                created: false,
                deleted: false,
                open: Open::default(),
            });
        }
        let mut properties = std::collections::BTreeMap::new();
        properties.insert(
            "source.address".to_string(),
            format!("127.0.0.1:{}", 40000 + id % 20000).into_bytes(),
        );
        properties.insert(
            "destination.address".to_string(),
            b"127.0.0.1:10000".to_vec(),
        );
        let names: Vec<String> = slots
            .iter()
            .map(|s| format!("{}/{}", w.vms[s.vm].name, s.context_id))
            .collect();
        w.streams.push(Stream {
            chain: slots,
            properties,
            request_headers: None,
            request_body: Vec::new(),
            request_trailers: None,
            response_headers: None,
            response_body: Vec::new(),
            response_trailers: None,
            response_body_total: Vec::new(),
            local_reply: None,
            grpc: false,
            reached_upstream: false,
            stopped_at: None,
            response_started: false,
            response_complete: false,
            ended: false,
        });
        w.note(
            "host",
            format!("stream {id} through {}", names.join(" -> ")),
        );
        StreamId(id)
    }

    /// Sets a property of the stream (dotted path, e.g. `upstream.address`)
    /// to raw bytes, as Envoy would encode it.
    pub fn set_property(&mut self, s: StreamId, path: &str, value: impl Into<Vec<u8>>) {
        let value = value.into();
        let mut w = self.world.borrow_mut();
        w.note(
            "host",
            format!("stream {}: property {path} = {}", s.0, world::show(&value)),
        );
        w.streams[s.0].properties.insert(path.to_string(), value);
    }

    /// A property of the stream as currently set.
    pub fn property(&self, s: StreamId, path: &str) -> Option<Vec<u8>> {
        self.world.borrow().streams[s.0]
            .properties
            .get(path)
            .cloned()
    }

    /// `source.address`: the downstream peer, `ip:port`.
    pub fn set_source(&mut self, s: StreamId, address: &str) {
        self.set_property(s, "source.address", address);
    }

    /// `upstream.address`: the host that answers (Envoy knows it only once
    /// a host was picked, i.e. in the response phase).
    pub fn set_upstream(&mut self, s: StreamId, address: &str) {
        self.set_property(s, "upstream.address", address);
    }

    /// `xds.cluster_name`: the route's cluster.
    pub fn set_cluster(&mut self, s: StreamId, cluster: &str) {
        self.set_property(s, "xds.cluster_name", cluster);
    }

    /// `response.flags` (u64 little-endian, Envoy's legacy bits: 0x20 UF,
    /// 0x40 UC, 0x4000 DC, ...).
    pub fn set_response_flags(&mut self, s: StreamId, flags: u64) {
        self.set_property(s, "response.flags", flags.to_le_bytes().to_vec());
    }

    pub(crate) fn slot(&self, s: usize, j: usize) -> (usize, u32) {
        let w = self.world.borrow();
        let slot = &w.streams[s].chain[j];
        (slot.vm, slot.context_id)
    }

    pub(crate) fn set_open(&self, s: usize, j: usize, open: Open) {
        self.world.borrow_mut().streams[s].chain[j].open = open;
    }

    pub(crate) fn check_live(&self, s: usize) -> Result<(), String> {
        if self.world.borrow().streams[s].ended {
            return Err(format!("stream {s} has ended (log was called)"));
        }
        Ok(())
    }

    /// The client's request headers reach the chain; returns Continue if
    /// every filter continued (the router forwards them), Pause if one
    /// paused or answered locally (then the local reply has been delivered
    /// already, through the encoder callbacks, as Envoy does).
    pub fn request_headers<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &mut self,
        s: StreamId,
        headers: &[(K, V)],
        end_of_stream: bool,
    ) -> Action {
        must(self.try_request_headers(s, HeaderMap::from_pairs(headers), end_of_stream))
    }

    pub(crate) fn try_request_headers(
        &mut self,
        s: StreamId,
        map: HeaderMap,
        eos: bool,
    ) -> Result<Action, String> {
        let s = s.0;
        self.check_live(s)?;
        let n = {
            let mut w = self.world.borrow_mut();
            let st = &mut w.streams[s];
            if st.request_headers.is_some() {
                return Err(format!("stream {s}: request headers sent twice"));
            }
            st.grpc = map
                .get("content-type")
                .is_some_and(|ct| ct.starts_with(b"application/grpc"));
            let n = map.len();
            st.request_headers = Some(map);
            n
        };
        let len = self.world.borrow().streams[s].chain.len();
        for j in 0..len {
            self.ensure_context(s, j)?;
            let (vm, ctx) = self.slot(s, j);
            self.set_open(
                s,
                j,
                Open {
                    request_headers: true,
                    ..Open::default()
                },
            );
            let f = self.vms[vm].ex.request_headers.clone();
            let r = self.call(
                vm,
                ctx,
                Callback::RequestHeaders,
                f,
                (ctx as i32, n as i32, i32::from(eos)),
                format!("proxy_on_request_headers({ctx}, {n}, eos={eos})"),
            )?;
            let a = r.map_or(Ok(Action::Continue), action)?;
            let replied = self.world.borrow().streams[s].local_reply.is_some();
            if replied || a == Action::Pause {
                self.world.borrow_mut().streams[s].stopped_at = Some(j);
                return Ok(Action::Pause);
            }
            self.set_open(s, j, Open::default());
        }
        self.world.borrow_mut().streams[s].reached_upstream = true;
        Ok(Action::Continue)
    }

    /// Which filters get a request body or trailers: those the headers went
    /// through, up to and including one that paused.
    pub(crate) fn request_reach(&self, s: usize) -> Result<usize, String> {
        let w = self.world.borrow();
        let st = &w.streams[s];
        if st.request_headers.is_none() {
            return Err(format!("stream {s}: request body before headers"));
        }
        if st.local_reply.is_some() {
            return Ok(0);
        }
        Ok(st.stopped_at.map_or(st.chain.len(), |j| j + 1))
    }

    /// A request body chunk.
    pub fn request_body(&mut self, s: StreamId, body: &[u8], end_of_stream: bool) -> Action {
        must(self.try_body(s.0, body, end_of_stream, false))
    }

    /// A response body chunk from the upstream.
    pub fn response_body(&mut self, s: StreamId, body: &[u8], end_of_stream: bool) -> Action {
        must(self.try_body(s.0, body, end_of_stream, true))
    }

    pub(crate) fn try_body(
        &mut self,
        s: usize,
        body: &[u8],
        eos: bool,
        response: bool,
    ) -> Result<Action, String> {
        self.check_live(s)?;
        let order: Vec<usize> = if response {
            self.response_order(s)?
        } else {
            (0..self.request_reach(s)?).collect()
        };
        {
            let mut w = self.world.borrow_mut();
            let st = &mut w.streams[s];
            if response {
                st.response_body = body.to_vec();
            } else {
                st.request_body = body.to_vec();
            }
        }
        let mut result = Action::Continue;
        for j in order {
            let (vm, ctx) = self.slot(s, j);
            let open = if response {
                Open {
                    response_body: true,
                    end_of_stream: eos,
                    ..Open::default()
                }
            } else {
                Open {
                    request_body: true,
                    end_of_stream: eos,
                    ..Open::default()
                }
            };
            self.set_open(s, j, open);
            let (f, name, cb) = if response {
                (
                    self.vms[vm].ex.response_body.clone(),
                    "proxy_on_response_body",
                    Callback::ResponseBody,
                )
            } else {
                (
                    self.vms[vm].ex.request_body.clone(),
                    "proxy_on_request_body",
                    Callback::RequestBody,
                )
            };
            let len = body.len();
            let r = self.call(
                vm,
                ctx,
                cb,
                f,
                (ctx as i32, len as i32, i32::from(eos)),
                format!("{name}({ctx}, {len}, eos={eos})"),
            )?;
            self.set_open(s, j, Open::default());
            if r.map_or(Ok(Action::Continue), action)? == Action::Pause {
                result = Action::Pause;
                break;
            }
        }
        let mut w = self.world.borrow_mut();
        let st = &mut w.streams[s];
        if response {
            let chunk = std::mem::take(&mut st.response_body);
            st.response_body_total.extend_from_slice(&chunk);
            if eos {
                st.response_complete = true;
            }
        }
        Ok(result)
    }

    /// Request trailers from the client.
    pub fn request_trailers<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &mut self,
        s: StreamId,
        trailers: &[(K, V)],
    ) -> Action {
        must(self.try_trailers(s.0, HeaderMap::from_pairs(trailers), false))
    }

    /// Response trailers from the upstream.
    pub fn response_trailers<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &mut self,
        s: StreamId,
        trailers: &[(K, V)],
    ) -> Action {
        must(self.try_trailers(s.0, HeaderMap::from_pairs(trailers), true))
    }

    pub(crate) fn try_trailers(
        &mut self,
        s: usize,
        map: HeaderMap,
        response: bool,
    ) -> Result<Action, String> {
        self.check_live(s)?;
        let order: Vec<usize> = if response {
            self.response_order(s)?
        } else {
            (0..self.request_reach(s)?).collect()
        };
        let n = map.len();
        {
            let mut w = self.world.borrow_mut();
            let st = &mut w.streams[s];
            if response {
                st.response_trailers = Some(map);
                st.response_complete = true;
            } else {
                st.request_trailers = Some(map);
            }
        }
        for j in order {
            let (vm, ctx) = self.slot(s, j);
            let open = if response {
                Open {
                    response_trailers: true,
                    ..Open::default()
                }
            } else {
                Open {
                    request_trailers: true,
                    ..Open::default()
                }
            };
            self.set_open(s, j, open);
            let (f, name, cb) = if response {
                (
                    self.vms[vm].ex.response_trailers.clone(),
                    "proxy_on_response_trailers",
                    Callback::ResponseTrailers,
                )
            } else {
                (
                    self.vms[vm].ex.request_trailers.clone(),
                    "proxy_on_request_trailers",
                    Callback::RequestTrailers,
                )
            };
            let r = self.call(
                vm,
                ctx,
                cb,
                f,
                (ctx as i32, n as i32),
                format!("{name}({ctx}, {n})"),
            )?;
            if r.map_or(Ok(Action::Continue), action)? == Action::Pause {
                return Ok(Action::Pause);
            }
            self.set_open(s, j, Open::default());
        }
        Ok(Action::Continue)
    }

    /// Encoder order for an upstream response: every filter, last first.
    pub(crate) fn response_order(&self, s: usize) -> Result<Vec<usize>, String> {
        let w = self.world.borrow();
        let st = &w.streams[s];
        if st.local_reply.is_some() {
            return Err(format!(
                "stream {s} was answered by a local reply; no upstream response"
            ));
        }
        if !st.reached_upstream {
            return Err(format!(
                "stream {s}: the request never reached the upstream"
            ));
        }
        if st.response_complete {
            return Err(format!("stream {s}: the response has ended already"));
        }
        Ok((0..st.chain.len()).rev().collect())
    }

    /// The upstream's response headers (the router's own replies too: a
    /// 503 for a connect failure is a response like any other, with
    /// `response.flags` set).
    pub fn response_headers<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &mut self,
        s: StreamId,
        headers: &[(K, V)],
        end_of_stream: bool,
    ) -> Action {
        must(self.try_response_headers(s.0, HeaderMap::from_pairs(headers), end_of_stream))
    }

    pub(crate) fn try_response_headers(
        &mut self,
        s: usize,
        map: HeaderMap,
        eos: bool,
    ) -> Result<Action, String> {
        self.check_live(s)?;
        let order = self.response_order(s)?;
        {
            let mut w = self.world.borrow_mut();
            let st = &mut w.streams[s];
            if st.response_started {
                return Err(format!("stream {s}: response headers sent twice"));
            }
            st.response_started = true;
            st.response_complete = eos;
            st.response_headers = Some(map);
        }
        self.encode_headers(s, &order, eos)
    }

    pub(crate) fn encode_headers(
        &mut self,
        s: usize,
        order: &[usize],
        eos: bool,
    ) -> Result<Action, String> {
        let n = self.world.borrow().streams[s]
            .response_headers
            .as_ref()
            .map_or(0, HeaderMap::len);
        for &j in order {
            self.ensure_context(s, j)?;
            let (vm, ctx) = self.slot(s, j);
            self.set_open(
                s,
                j,
                Open {
                    response_headers: true,
                    ..Open::default()
                },
            );
            let f = self.vms[vm].ex.response_headers.clone();
            let r = self.call(
                vm,
                ctx,
                Callback::ResponseHeaders,
                f,
                (ctx as i32, n as i32, i32::from(eos)),
                format!("proxy_on_response_headers({ctx}, {n}, eos={eos})"),
            )?;
            if r.map_or(Ok(Action::Continue), action)? == Action::Pause {
                return Ok(Action::Pause);
            }
            self.set_open(s, j, Open::default());
        }
        Ok(Action::Continue)
    }

    /// The stream ends: Envoy calls `on_log` in every filter (creating the
    /// context first where a filter never saw the stream), then `on_done`
    /// and `on_delete`. Covers complete streams, resets and aborts alike.
    pub fn log(&mut self, s: StreamId) {
        must(self.try_log(s.0));
    }

    /// The client reset the stream (or the connection dropped): no more
    /// callbacks but `on_log`, `on_done`, `on_delete` (Envoy 1.40 logs every
    /// stream that reached a filter).
    pub fn reset(&mut self, s: StreamId) {
        self.world
            .borrow_mut()
            .note("host", format!("stream {}: downstream reset", s.0));
        must(self.try_log(s.0));
    }

    pub(crate) fn try_log(&mut self, s: usize) -> Result<(), String> {
        self.check_live(s)?;
        let len = self.world.borrow().streams[s].chain.len();
        for j in 0..len {
            self.ensure_context(s, j)?;
            let (vm, ctx) = self.slot(s, j);
            self.set_open(
                s,
                j,
                Open {
                    log: true,
                    ..Open::default()
                },
            );
            let f = self.vms[vm].ex.log.clone();
            self.call(
                vm,
                ctx,
                Callback::Log,
                f,
                ctx as i32,
                format!("proxy_on_log({ctx})"),
            )?;
            self.set_open(s, j, Open::default());
        }
        self.world.borrow_mut().streams[s].ended = true;
        for j in 0..len {
            let (vm, ctx) = self.slot(s, j);
            let f = self.vms[vm].ex.done.clone();
            let done = self.call(
                vm,
                ctx,
                Callback::Done,
                f,
                ctx as i32,
                format!("proxy_on_done({ctx})"),
            )?;
            if done == Some(0) {
                return Err(format!(
                    "proxy_on_done({ctx}) returned false (waits for proxy_done): not modelled"
                ));
            }
            let f = self.vms[vm].ex.delete.clone();
            self.call(
                vm,
                ctx,
                Callback::Delete,
                f,
                ctx as i32,
                format!("proxy_on_delete({ctx})"),
            )?;
            let mut w = self.world.borrow_mut();
            w.vms[vm].contexts.remove(&ctx);
            w.streams[s].chain[j].deleted = true;
            // Envoy cancels the calls of a context that goes away.
            for c in w.calls.iter_mut() {
                if c.vm_index == vm && c.context_id == ctx && c.state == CallState::Pending {
                    c.state = CallState::Cancelled;
                }
            }
        }
        Ok(())
    }
}
