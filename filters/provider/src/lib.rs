//! `graceful_provider` as a proxy-wasm plugin: the callbacks of
//! [`graceful_core::provider::filter`] (admission, the closing mark, the
//! in-flight count) forwarded from the SDK's, over the guest host.
//!
//! An ordinary request enters the VM four times (context create, request
//! headers, response headers, delete: one more than a filter that only adds
//! a response header) and makes only the cheapest hostcalls: gauge +1, one
//! gauge read (the gate), counter +1, one header read (`upgrade`: is it a
//! long-lived stream? only for a request its headers do not end), one
//! gauge read (the phase: does the request go in
//! the drain report?); on the response the instance header and one gauge
//! read (the phase); gauge −1 at the end. No shared data; one clock read at
//! the start, for the drain report's exact longest request, and one at the
//! end only for a request sampled (one in 32) or one that could be the
//! longest (see `graceful_core::provider::filter`).
//! Every VM copy ticks to merge its report records into shared data and to
//! end its kept long-lived streams once drained, answering each through
//! its context, made effective.

use std::cell::RefCell;
use std::rc::Rc;

use graceful_core::provider::filter::{Provider, ProviderCopy, ProviderStream, TICK};
use graceful_core::shared::keys::Owner;
use graceful_guest::{action, Guest};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(ProviderRoot { shared: None }) });
}}

struct Shared {
    provider: Provider,
    host: Guest,
    /// This VM copy's kept long-lived streams and report records.
    copy: RefCell<ProviderCopy>,
}

struct ProviderRoot {
    shared: Option<Rc<Shared>>,
}

impl Context for ProviderRoot {}

impl RootContext for ProviderRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        let host = Guest::define(Owner::Provider);
        match Provider::configure(&host, &graceful_guest::plugin_configuration()) {
            Ok(provider) => {
                self.shared = Some(Rc::new(Shared {
                    provider,
                    host,
                    copy: RefCell::new(ProviderCopy::default()),
                }));
                graceful_guest::set_tick_period(TICK);
                log::info!(
                    "graceful_provider {}: configured",
                    graceful_core::build_version!()
                );
                true
            }
            Err(e) => {
                log::error!("graceful_provider: {e}");
                false
            }
        }
    }

    fn on_tick(&mut self) {
        let Some(s) = &self.shared else {
            return;
        };
        for (context_id, ()) in s.provider.tick(&s.copy, &s.host, |_, _| {}) {
            // The stream may have gone meanwhile: then the host refuses the
            // context and there is nobody to answer.
            if hostcalls::set_effective_context(context_id).is_ok() {
                s.provider.answer_woken(&s.host);
            }
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        // The SDK panics on None; an unconfigured root (Envoy never routes
        // streams to one) gets a stream that does nothing.
        Some(Box::new(WasmStream {
            shared: self.shared.clone(),
            stream: ProviderStream::default(),
            context_id,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct WasmStream {
    shared: Option<Rc<Shared>>,
    stream: ProviderStream,
    context_id: u32,
}

impl Context for WasmStream {}

impl HttpContext for WasmStream {
    fn on_http_request_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        let id = self.context_id;
        self.shared.as_ref().map_or(Action::Continue, |s| {
            action(s.provider.request_headers(
                &self.stream,
                &s.host,
                &s.copy,
                end_of_stream,
                || (id, ()),
            ))
        })
    }

    fn on_http_response_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        self.shared.as_ref().map_or(Action::Continue, |s| {
            action(s.provider.response_headers(&self.stream, &s.host))
        })
    }

    fn on_http_response_trailers(&mut self, _trailers: usize) -> Action {
        self.shared.as_ref().map_or(Action::Continue, |s| {
            action(s.provider.response_trailers(&self.stream, &s.host))
        })
    }
}

/// The stream is over (why here: the `graceful_guest` crate doc): it
/// leaves the in-flight count.
impl Drop for WasmStream {
    fn drop(&mut self) {
        if let Some(s) = &self.shared {
            s.provider.stream_end(&self.stream, &s.host, &s.copy);
        }
    }
}
