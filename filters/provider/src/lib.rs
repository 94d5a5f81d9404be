//! `graceful_provider`: the provider's inbound sidecar filter.
//!
//! Per stream: admit (count in the in-flight gauge, or reject with a local
//! 503 once the drain gate has passed: [`graceful_core::gate`]), mark the
//! response while the instance is closing (headers, and gRPC trailers), and
//! count the stream out exactly once when Envoy deletes its context, which
//! Envoy 1.40 does for every stream that reached the filter, client aborts
//! and local replies included.
//!
//! An ordinary request enters the VM four times (context create, request
//! headers, response headers, delete: one more than a filter that only adds
//! a response header) and makes only the cheapest hostcalls: gauge +1, one
//! gauge read (the gate), counter +1; on the response the instance header
//! and one gauge read (the phase); gauge −1 at the end. No shared data, no
//! clock, no header read.

use std::rc::Rc;

use graceful_core::config::ProviderConfig;
use graceful_core::gate::{self, Admission, Stat};
use graceful_core::headers::IMMEDIATE_HC_FAIL;
use graceful_core::instance;
use graceful_core::keys::{self, Owner};
use graceful_core::store::{self, SharedStore};
use graceful_guest::{now_us, replace_header, send_reply, GuestStats, HostStore, Metric};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel, MapType};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(ProviderRoot { shared: None }) });
}}

struct Shared {
    config: ProviderConfig,
    instance_id: String,
    /// In flight, started, and the drain gate.
    stats: GuestStats,
    /// `graceful_drain_phase`, kept by graceful_drain: > 0 once closing.
    phase: Metric,
    closing_marked: Metric,
    rejected: Metric,
}

impl Shared {
    /// Unreadable reads as serving: an unmarked response is harmless, a
    /// false mark would evict a healthy instance.
    fn is_closing(&self) -> bool {
        self.phase.get().is_some_and(|p| p > 0)
    }
}

struct ProviderRoot {
    shared: Option<Rc<Shared>>,
}

impl Context for ProviderRoot {}

impl RootContext for ProviderRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        let config = match ProviderConfig::from_json(&graceful_guest::plugin_configuration()) {
            Ok(c) => c,
            Err(e) => {
                log::error!("graceful_provider: {e}");
                return false;
            }
        };
        // The main thread's VM configures before any worker serves, so the
        // record exists before the first admission (no first-write race).
        if let Err((key, e)) = store::ensure_all(&HostStore, &keys::initial_values(Owner::Provider))
        {
            log::error!("graceful_provider: cannot initialise shared data {key:?}: {e:?}");
            return false;
        }
        let instance_id = match &config.instance_id {
            Some(id) => id.clone(),
            None => {
                let candidate = instance::generate(now_us(), graceful_guest::entropy());
                match instance::agree(&HostStore, &candidate) {
                    Ok(id) => id,
                    Err(e) => {
                        log::warn!(
                            "graceful_provider: instance id not shared ({e:?}); using {candidate}"
                        );
                        candidate
                    }
                }
            }
        };
        // Published for graceful_drain, which stamps its own answers with it
        // (every copy writes the same value, so racing writes agree).
        if let Some(h) = &config.instance_header {
            let _ = HostStore.set(
                keys::IDENTITY.name,
                &instance::encode_identity(h, &instance_id),
                0,
            );
        }
        let stats = GuestStats::define(&[Stat::Inflight, Stat::Started, Stat::Gate]);
        // A stat Envoy's stats_matcher rejects counts nothing: the gate
        // would pass with requests in flight. Refuse rather than pretend.
        if !stats
            .metric(Stat::Inflight)
            .is_some_and(|m| m.gauge_is_kept())
        {
            log::error!(
                "graceful_provider: Envoy does not keep the stat {} (reads 0 after +1): its stats_matcher must keep the wasmcustom.graceful_ stats",
                Stat::Inflight.name()
            );
            return false;
        }
        self.shared = Some(Rc::new(Shared {
            config,
            instance_id,
            stats,
            phase: Metric::gauge("graceful_drain_phase"),
            closing_marked: Metric::counter("graceful_provider_closing_marked"),
            rejected: Metric::counter("graceful_provider_rejected"),
        }));
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        // The SDK panics on None; an unconfigured root (Envoy never routes
        // streams to one) gets a stream that does nothing.
        Some(Box::new(ProviderStream {
            shared: self.shared.clone(),
            counted: false,
            marked: false,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct ProviderStream {
    shared: Option<Rc<Shared>>,
    /// This stream is in the in-flight count and must leave it in `on_log`.
    counted: bool,
    /// The closing mark was set on this response (counted once).
    marked: bool,
}

impl ProviderStream {
    fn note_marked(&mut self, shared: &Shared) {
        if !self.marked {
            self.marked = true;
            shared.closing_marked.add(1);
        }
    }

    /// Marks the trailers of a response if the instance is closing now:
    /// any response with trailers (gRPC, or HTTP with chunked trailers,
    /// where the mark is as harmless as in headers). A gRPC response always
    /// ends in trailers, or is trailers-only (headers, marked above); one
    /// that ends in its body instead is not valid gRPC, and carries the mark
    /// in its headers only: creating trailers there would need the body
    /// callback, entered for every chunk of every response.
    fn mark_trailers(&mut self) {
        let Some(shared) = self.shared.clone() else {
            return;
        };
        if !shared.is_closing() {
            return;
        }
        if replace_header(
            MapType::HttpResponseTrailers,
            &shared.config.closing_header,
            "true",
        ) {
            self.note_marked(&shared);
        }
    }
}

impl Context for ProviderStream {}

impl HttpContext for ProviderStream {
    fn on_http_request_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        let Some(shared) = self.shared.clone() else {
            return Action::Continue;
        };
        match gate::admit(&shared.stats, shared.config.reject_when_drained) {
            Admission::Admitted => {
                self.counted = true;
                Action::Continue
            }
            Admission::Rejected => {
                shared.rejected.add(1);
                let mut headers = vec![(shared.config.closing_header.as_str(), "true")];
                if shared.config.immediate_health_check_fail {
                    headers.push((IMMEDIATE_HC_FAIL, "true"));
                }
                if let Some(h) = &shared.config.instance_header {
                    headers.push((h.as_str(), shared.instance_id.as_str()));
                }
                if send_reply(503, &headers, b"instance is shutting down\n", None) {
                    Action::Pause
                } else {
                    Action::Continue
                }
            }
        }
    }

    fn on_http_response_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        let Some(shared) = self.shared.clone() else {
            return Action::Continue;
        };
        let cfg = &shared.config;
        if let Some(h) = &cfg.instance_header {
            replace_header(MapType::HttpResponseHeaders, h, &shared.instance_id);
        }
        if shared.is_closing() {
            let mut ok = replace_header(MapType::HttpResponseHeaders, &cfg.closing_header, "true");
            if cfg.immediate_health_check_fail {
                ok &= replace_header(MapType::HttpResponseHeaders, IMMEDIATE_HC_FAIL, "true");
            }
            if ok {
                self.note_marked(&shared);
            }
        }
        Action::Continue
    }

    fn on_http_response_trailers(&mut self, _trailers: usize) -> Action {
        self.mark_trailers();
        Action::Continue
    }
}

/// The stream is over: leave the in-flight count, exactly once. Envoy
/// deletes the context of every stream that reached the filter (client
/// resets and local replies included), so the SDK drops it in
/// `proxy_on_delete`, a VM entry every stream pays anyway: counting out here
/// instead of in `on_log` saves one.
impl Drop for ProviderStream {
    fn drop(&mut self) {
        if std::mem::take(&mut self.counted) {
            if let Some(shared) = &self.shared {
                gate::finish(&shared.stats);
            }
        }
    }
}
