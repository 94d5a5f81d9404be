//! HTTP calls: clusters a filter may call, scripted answers offered as calls
//! are made, answering, failing and timing out pending calls
//! (`proxy_on_http_call_response` in the context that made the call; a
//! failed or timed-out call is answered with no headers, as Envoy does).

use crate::world::{CallAnswer, CallState, Callback, HttpCall};
use crate::{must, Host};

impl Host {
    /// Declares an upstream cluster: `http_call` to any other is refused
    /// with BadArgument, as Envoy does.
    pub fn add_cluster(&mut self, name: &str) {
        self.world.borrow_mut().clusters.insert(name.to_string());
    }

    /// Answers calls to `cluster` as they are made (right after the VM call
    /// that made them returns). `answer` returning None leaves a call
    /// pending. Declares the cluster too.
    pub fn respond(
        &mut self,
        cluster: &str,
        answer: impl FnMut(&HttpCall) -> Option<CallAnswer> + 'static,
    ) {
        self.add_cluster(cluster);
        self.world
            .borrow_mut()
            .responders
            .push((cluster.to_string(), Box::new(answer)));
    }

    pub(crate) fn offer_call(&mut self, id: usize) -> Result<(), String> {
        let (call, mut responders) = {
            let mut w = self.world.borrow_mut();
            (w.calls[id].clone(), std::mem::take(&mut w.responders))
        };
        let mut answer = None;
        for (cluster, f) in responders.iter_mut() {
            if *cluster == call.cluster {
                answer = f(&call);
                if answer.is_some() {
                    break;
                }
            }
        }
        {
            let mut w = self.world.borrow_mut();
            responders.append(&mut w.responders);
            w.responders = responders;
        }
        match answer {
            Some(a) => self.deliver_call(id, Some(a)),
            None => Ok(()),
        }
    }

    /// Every HTTP call made so far, in order.
    pub fn http_calls(&self) -> Vec<HttpCall> {
        self.world.borrow().calls.clone()
    }

    /// The calls still waiting for an answer.
    pub fn pending_calls(&self) -> Vec<HttpCall> {
        self.world
            .borrow()
            .calls
            .iter()
            .filter(|c| c.state == CallState::Pending)
            .cloned()
            .collect()
    }

    /// Answers a pending call: `proxy_on_http_call_response` runs in the
    /// context that made it.
    pub fn answer_call(&mut self, id: usize, answer: CallAnswer) {
        must(self.deliver_call(id, Some(answer)));
    }

    /// Fails a pending call (reset, no healthy upstream): delivered with no
    /// headers and no body, as Envoy does.
    pub fn fail_call(&mut self, id: usize) {
        must(self.deliver_call(id, None));
    }

    pub(crate) fn deliver_call(
        &mut self,
        id: usize,
        answer: Option<CallAnswer>,
    ) -> Result<(), String> {
        let (vm, ctx, token, alive) = {
            let mut w = self.world.borrow_mut();
            let c = &w.calls[id];
            if c.state != CallState::Pending {
                return Err(format!("http call {id} is not pending: {:?}", c.state));
            }
            let (vm, ctx, token) = (c.vm_index, c.context_id, c.token);
            let alive = !w.vms[vm].dead && w.vms[vm].contexts.contains_key(&ctx);
            w.calls[id].state = match &answer {
                _ if !alive => CallState::Cancelled,
                Some(a) => CallState::Answered(
                    a.headers
                        .text(":status")
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0),
                ),
                None => CallState::Failed,
            };
            (vm, ctx, token, alive)
        };
        if !alive {
            return Ok(());
        }
        let answer = answer.unwrap_or_default();
        let (nh, nb, nt) = (
            answer.headers.len(),
            answer.body.len(),
            answer.trailers.len(),
        );
        let f = self.vms[vm].ex.http_call_response.clone();
        self.call_with(
            vm,
            ctx,
            Callback::HttpCallResponse,
            f,
            (ctx as i32, token as i32, nh as i32, nb as i32, nt as i32),
            format!("proxy_on_http_call_response({ctx}, token {token}, {nh} headers, {nb} body bytes, {nt} trailers)"),
            Some(answer),
        )?;
        Ok(())
    }
}
