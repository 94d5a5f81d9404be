//! `graceful_consumer` as a proxy-wasm plugin: the callbacks of
//! [`graceful_core::consumer::filter`] forwarded from the SDK's, over the
//! guest host. What each callback reads, and why that is enough, is the
//! per-request protocol in [`graceful_core::consumer::decisions`].
//!
//! With `front` (the listener instance), each VM copy also keeps a
//! [`FrontCopy`]: its held `drained?wait=` long-polls are answered from
//! the root's tick through their context, made effective, as graceful_drain
//! answers its own; the front's `/clusters` answer comes to the root.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use graceful_core::consumer::decisions::upstream_from_vm_config;
use graceful_core::consumer::filter::{ConsumerCopy, ConsumerFilter, ConsumerStream};
use graceful_core::consumer::front::FrontCopy;
use graceful_core::shared::host::StateCell;
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
    /// This VM copy's front table, held long-polls and `/clusters` call.
    front: RefCell<FrontCopy>,
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
            let answer = CallAnswer { body_size };
            if !s
                .filter
                .front_call_answered(&s.front, &s.copy, &s.host, token, &answer)
            {
                s.filter.call_answered(&s.copy, &s.host, token, &answer);
            }
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
        // With `front`, at most `front.poll` too: the poll's lease and the
        // held long-polls' answers wait for a tick.
        if !self.upstream {
            let mut period = filter.config().membership_refresh.min(TICK_AT_MOST);
            if let Some(front) = &filter.config().front {
                period = period.min(front.poll);
            }
            graceful_guest::set_tick_period(period);
        } else if let Some(front) = &filter.config().front {
            // The watch's caches follow the listener's writes even where the
            // change signal is per stats scope (upstream_tick).
            graceful_guest::set_tick_period(front.poll);
        }
        let copy = RefCell::new(filter.new_copy());
        log::info!(
            "graceful_consumer {}: configured",
            graceful_core::build_version!()
        );
        self.shared = Some(Rc::new(Shared {
            filter,
            host,
            copy,
            front: RefCell::default(),
        }));
        true
    }

    fn on_tick(&mut self) {
        let Some(s) = &self.shared else {
            return;
        };
        if self.upstream {
            s.filter.upstream_tick(&s.copy, &s.host);
            return;
        }
        s.filter.tick(&s.copy, &s.host);
        for (context_id, ()) in s.filter.front_tick(&s.front, &s.copy, &s.host, |_, _| {}) {
            // The stream may have gone meanwhile: then the host refuses the
            // context and there is nobody to answer.
            if hostcalls::set_effective_context(context_id).is_ok() {
                s.filter.front_answer_woken(&s.front, &s.host, context_id);
            }
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(WasmStream {
            shared: self.shared.clone(),
            stream: ConsumerStream::default(),
            context_id,
            held: Cell::new(false),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct WasmStream {
    shared: Option<Rc<Shared>>,
    stream: ConsumerStream,
    context_id: u32,
    /// A front long-poll held by this copy: its slot is freed at the end.
    held: Cell<bool>,
}

impl Context for WasmStream {}

impl HttpContext for WasmStream {
    fn on_http_request_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        let Some(s) = &self.shared else {
            return Action::Continue;
        };
        let (id, held) = (self.context_id, &self.held);
        let hold = || {
            held.set(true);
            (id, ())
        };
        if let Some(next) = s
            .filter
            .front_request_headers(&s.front, &s.copy, &s.host, hold)
        {
            return action(next);
        }
        action(s.filter.request_headers(&s.copy, &self.stream, &s.host))
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
            if self.held.get() {
                let id = self.context_id;
                s.front.with(|f| s.filter.front_release(f, &s.host, id));
            }
        }
    }
}
