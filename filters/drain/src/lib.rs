//! `graceful_drain` as a proxy-wasm plugin: the callbacks of
//! [`graceful_core::drain::filter`] (the endpoints, the tick, the answers
//! to its calls) forwarded from the SDK's, over the guest host. Every VM
//! copy ticks and holds its own long-polls; a woken one is answered from
//! the tick through its context, made effective.

use std::cell::RefCell;
use std::rc::Rc;

use graceful_core::drain::filter::{Drain, DrainCopy, TICK};
use graceful_core::shared::host::StateCell;
use graceful_core::shared::keys::Owner;
use graceful_guest::{action, CallAnswer, Guest};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(DrainRoot { shared: None }) });
}}

struct Shared {
    drain: Drain,
    host: Guest,
    /// This VM copy's gate evaluation, long-polls and calls.
    copy: RefCell<DrainCopy>,
}

struct DrainRoot {
    shared: Option<Rc<Shared>>,
}

impl Context for DrainRoot {
    fn on_http_call_response(
        &mut self,
        token: u32,
        _headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        if let Some(s) = &self.shared {
            s.drain
                .call_answered(&s.copy, &s.host, token, &CallAnswer { body_size });
        }
    }
}

impl RootContext for DrainRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        let host = Guest::define(Owner::Drain);
        match Drain::configure(&host, &graceful_guest::plugin_configuration()) {
            Ok(drain) => {
                self.shared = Some(Rc::new(Shared {
                    drain,
                    host,
                    copy: RefCell::new(DrainCopy::default()),
                }));
                graceful_guest::set_tick_period(TICK);
                log::info!(
                    "graceful_drain {}: configured",
                    graceful_core::build_version!()
                );
                true
            }
            Err(e) => {
                log::error!("graceful_drain: {e}");
                false
            }
        }
    }

    fn on_tick(&mut self) {
        let Some(s) = &self.shared else {
            return;
        };
        for (context_id, ()) in s.drain.tick(&s.copy, &s.host, |_, _| {}) {
            // The stream may have gone meanwhile: then the host refuses the
            // context and there is nobody to answer.
            if hostcalls::set_effective_context(context_id).is_ok() {
                s.drain.answer_woken(&s.copy, &s.host, context_id);
            }
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(DrainStream {
            shared: self.shared.clone(),
            context_id,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct DrainStream {
    shared: Option<Rc<Shared>>,
    context_id: u32,
}

impl Context for DrainStream {}

impl HttpContext for DrainStream {
    fn on_http_request_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        let Some(s) = &self.shared else {
            return Action::Continue;
        };
        let id = self.context_id;
        action(s.drain.request_headers(&s.copy, &s.host, || (id, ())))
    }
}

/// The stream is over (why here: the `graceful_guest` crate doc). A
/// long-poll whose client went away before it was answered frees its slot
/// (answered ones were released by the tick).
impl Drop for DrainStream {
    fn drop(&mut self) {
        if let Some(s) = &self.shared {
            let id = self.context_id;
            s.copy.with(|c| s.drain.release(c, &s.host, id));
        }
    }
}
