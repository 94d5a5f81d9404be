//! `graceful_provider`: the provider's inbound sidecar filter.
//!
//! Per stream: admit (count in the shared instance record, or reject with a
//! local 503 once the drain gate has passed), mark the response while the
//! instance is closing (headers, and gRPC trailers), and count the stream
//! out exactly once in `on_log`, which Envoy 1.40 calls for every stream
//! that reached the filter, client aborts and local replies included.

use std::rc::Rc;

use graceful_core::config::ProviderConfig;
use graceful_core::headers::{CONTENT_TYPE, IMMEDIATE_HC_FAIL};
use graceful_core::instance;
use graceful_core::keys::{self, Owner};
use graceful_core::record::{self, Admission};
use graceful_core::store::{self, SharedStore};
use graceful_guest::{header, now_us, replace_header, send_reply, HostStore, Metric};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel, MapType};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(ProviderRoot { shared: None }) });
}}

struct Shared {
    config: ProviderConfig,
    instance_id: String,
    closing_marked: Metric,
    rejected: Metric,
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
        // The in-flight gauge is defined here but kept by graceful_drain,
        // which sets it from the shared record on every tick.
        let _ = Metric::gauge("graceful_provider_inflight");
        self.shared = Some(Rc::new(Shared {
            config,
            instance_id,
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
            grpc: false,
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
    /// The response is gRPC with a body: trailers will carry the mark.
    grpc: bool,
    /// The closing mark was set on this response (counted once).
    marked: bool,
}

fn is_closing() -> bool {
    // Unreadable shared data reads as serving: an unmarked response is
    // harmless, a false mark would evict a healthy instance.
    record::read(&HostStore).is_ok_and(|r| r.phase.is_closing())
}

impl ProviderStream {
    fn note_marked(&mut self, shared: &Shared) {
        if !self.marked {
            self.marked = true;
            shared.closing_marked.add(1);
        }
    }

    /// Marks the trailers of a gRPC response if the instance is closing now.
    /// Called from the trailers callback, or from the body callback at end
    /// of stream when the upstream sent no trailers: Envoy creates the
    /// trailer map there and only there (observed on Envoy 1.40; elsewhere
    /// adding a trailer fails with BadArgument).
    fn mark_trailers(&mut self) {
        let Some(shared) = self.shared.clone() else {
            return;
        };
        if !self.grpc || !is_closing() {
            return;
        }
        self.grpc = false;
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
        match record::admit(&HostStore, now_us(), shared.config.reject_when_drained) {
            Ok((Admission::Admitted, _)) => {
                self.counted = true;
                Action::Continue
            }
            Ok((Admission::Rejected, _)) => {
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
            Err(e) => {
                // Fail open: serving the request uncounted beats a 503 over
                // contention on shared data.
                log::warn!("graceful_provider: request not counted: {e:?}");
                Action::Continue
            }
        }
    }

    fn on_http_response_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        let Some(shared) = self.shared.clone() else {
            return Action::Continue;
        };
        let cfg = &shared.config;
        if let Some(h) = &cfg.instance_header {
            replace_header(MapType::HttpResponseHeaders, h, &shared.instance_id);
        }
        if is_closing() {
            let mut ok = replace_header(MapType::HttpResponseHeaders, &cfg.closing_header, "true");
            if cfg.immediate_health_check_fail {
                ok &= replace_header(MapType::HttpResponseHeaders, IMMEDIATE_HC_FAIL, "true");
            }
            if ok {
                self.note_marked(&shared);
            }
        }
        if !end_of_stream {
            // A gRPC response with a body ends in trailers (or in a body at
            // end of stream, where the host lets us create them).
            self.grpc = header(MapType::HttpResponseHeaders, CONTENT_TYPE)
                .is_some_and(|ct| ct.starts_with(b"application/grpc"));
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, _size: usize, end_of_stream: bool) -> Action {
        if end_of_stream {
            self.mark_trailers();
        }
        Action::Continue
    }

    fn on_http_response_trailers(&mut self, _trailers: usize) -> Action {
        self.mark_trailers();
        Action::Continue
    }

    fn on_log(&mut self) {
        if !std::mem::take(&mut self.counted) {
            return;
        }
        if let Err(e) = record::finish(&HostStore) {
            log::error!("graceful_provider: in-flight count not decremented: {e:?}");
        }
    }
}
