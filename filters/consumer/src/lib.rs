//! `graceful_consumer` as a proxy-wasm plugin: the callbacks of
//! [`graceful_core::consumer::filter`] forwarded from the SDK's, over the
//! guest host. What each callback reads, and why that is enough, is the
//! per-request protocol in [`graceful_core::consumer::decisions`].

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use graceful_core::consumer::decisions::upstream_from_vm_config;
use graceful_core::consumer::filter::{ConsumerCopy, ConsumerFilter, ConsumerStream};
use graceful_core::shared::keys::Owner;
use graceful_guest::{action, CallAnswer, Guest};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> {
        Box::new(ConsumerRoot { shared: None, upstream: false })
    });
}}

/// The longest tick period of the listener instance's copies.
const TICK_AT_MOST: Duration = Duration::from_millis(100);

struct Shared {
    filter: ConsumerFilter,
    host: Guest,
    /// This VM copy's caches, observations and calls.
    copy: RefCell<ConsumerCopy>,
}

struct ConsumerRoot {
    shared: Option<Rc<Shared>>,
    /// `vm_config.configuration` was `upstream`.
    upstream: bool,
}

impl Context for ConsumerRoot {
    fn on_http_call_response(
        &mut self,
        token: u32,
        _headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        if let Some(s) = &self.shared {
            s.filter
                .call_answered(&s.copy, &s.host, token, &CallAnswer { body_size });
        }
    }
}

impl RootContext for ConsumerRoot {
    /// The VM configuration says where the filter sits: empty for the
    /// listener's filter chain, `upstream` for the cluster's upstream filters
    /// (one stream per attempt: it only observes, so retries hide nothing).
    /// A separate VM configuration also gives the upstream instance a VM of
    /// its own, which it needs: the listener instance's probes go through
    /// the cluster, and a VM entered again from its own root callback traps.
    fn on_vm_start(&mut self, size: usize) -> bool {
        let vm_config = hostcalls::get_buffer(BufferType::VmConfiguration, 0, size)
            .ok()
            .flatten()
            .unwrap_or_default();
        match upstream_from_vm_config(&vm_config) {
            Ok(upstream) => self.upstream = upstream,
            Err(line) => {
                log::error!("{line}");
                return false;
            }
        }
        true
    }

    fn on_configure(&mut self, _size: usize) -> bool {
        let host = Guest::define(Owner::Consumer);
        let json = graceful_guest::plugin_configuration();
        let filter = match ConsumerFilter::configure(&host, &json, self.upstream) {
            Ok(f) => f,
            Err(e) => {
                log::error!("graceful_consumer: {e}");
                return false;
            }
        };
        // Membership refreshes and probes are the listener instance's: an
        // upstream instance taking the refresh lease would skip a refresh.
        // Its copies tick at most every 100 ms (the lease keeps refreshes
        // to one per membership_refresh): a tick announces the upstream
        // instance's writes where its stats scope is not this one (Envoy
        // 1.36, see Consumer::notice_unannounced).
        if !self.upstream {
            graceful_guest::set_tick_period(filter.config().membership_refresh.min(TICK_AT_MOST));
        }
        let copy = RefCell::new(filter.new_copy());
        self.shared = Some(Rc::new(Shared { filter, host, copy }));
        true
    }

    fn on_tick(&mut self) {
        if let Some(s) = &self.shared {
            s.filter.tick(&s.copy, &s.host);
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(WasmStream {
            shared: self.shared.clone(),
            stream: ConsumerStream::default(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct WasmStream {
    shared: Option<Rc<Shared>>,
    stream: ConsumerStream,
}

impl Context for WasmStream {}

impl HttpContext for WasmStream {
    fn on_http_request_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        self.shared.as_ref().map_or(Action::Continue, |s| {
            action(s.filter.request_headers(&s.copy, &self.stream, &s.host))
        })
    }

    fn on_http_response_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        self.shared.as_ref().map_or(Action::Continue, |s| {
            action(s.filter.response_headers(&s.copy, &self.stream, &s.host))
        })
    }

    fn on_http_response_trailers(&mut self, _trailers: usize) -> Action {
        self.shared.as_ref().map_or(Action::Continue, |s| {
            action(s.filter.response_trailers(&s.copy, &self.stream, &s.host))
        })
    }
}

/// The stream is over (why here: the `graceful_guest` crate doc).
impl Drop for WasmStream {
    fn drop(&mut self) {
        if let Some(s) = &self.shared {
            s.filter.stream_end(&self.stream, &s.host);
            s.filter.attempt_done(&s.copy, &self.stream, &s.host);
        }
    }
}
