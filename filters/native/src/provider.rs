//! graceful_provider natively: the same stream as the wasm filter
//! (`filters/provider`): admit through `graceful_core::gate` (or the marked
//! 503 once the gate passed), mark the response while closing (headers and
//! trailers), leave the in-flight count once at the end. The counts are the
//! module's atomics; each change is mirrored to the contract's Envoy stat
//! by the same hook, so `graceful_provider_inflight` is exact too.

use std::cell::Cell;
use std::sync::atomic::{AtomicI64, Ordering::SeqCst};

use graceful_core::config::ProviderConfig;
use graceful_core::gate::{self, Admission, Stat, Stats};
use graceful_core::headers::IMMEDIATE_HC_FAIL;
use graceful_core::instance;
use graceful_core::keys::{self, Owner};
use graceful_core::store::{self, SharedStore};

use crate::abi::{self, Stream, CONTINUE, RESPONSE_HEADERS, RESPONSE_TRAILERS, STOP_ITERATION};
use crate::{log, COUNTS, PHASE, STORE};

/// Envoy stat ids of the contract's provider metrics.
struct Metrics {
    inflight: Option<usize>,
    started: Option<usize>,
    closing_marked: Option<usize>,
    rejected: Option<usize>,
}

pub struct Config {
    config: ProviderConfig,
    instance_id: String,
    metrics: Metrics,
}

/// −1s for the in-flight gauge not yet written: a stream destroyed without
/// `stream_complete` (which Envoy runs for every stream that ends) has no
/// filter pointer left to write with, so the next stream writes it.
static GAUGE_OWED: AtomicI64 = AtomicI64::new(0);

impl Config {
    pub fn new(envoy: abi::Config, json: &[u8]) -> Result<Config, String> {
        let config = ProviderConfig::from_json(json).map_err(|e| e.to_string())?;
        store::ensure_all(&STORE, &keys::initial_values(Owner::Provider))
            .map_err(|(key, e)| format!("cannot initialise shared data {key:?}: {e:?}"))?;
        let instance_id = match &config.instance_id {
            Some(id) => id.clone(),
            None => {
                let candidate = instance::generate(crate::now_us(), crate::entropy());
                instance::agree(&STORE, &candidate).unwrap_or(candidate)
            }
        };
        if let Some(h) = &config.instance_header {
            let _ = STORE.set(
                keys::IDENTITY.name,
                &instance::encode_identity(h, &instance_id),
                0,
            );
        }
        let metrics = Metrics {
            inflight: envoy.define_gauge(Stat::Inflight.name()),
            started: envoy.define_counter(Stat::Started.name()),
            closing_marked: envoy.define_counter("graceful_provider_closing_marked"),
            rejected: envoy.define_counter("graceful_provider_rejected"),
        };
        Ok(Config {
            config,
            instance_id,
            metrics,
        })
    }
}

/// The gate's stats for one hook: the atomics, with each change written to
/// the Envoy stat through this stream.
struct Mirrored<'a> {
    stream: Stream,
    metrics: &'a Metrics,
}

impl Stats for Mirrored<'_> {
    fn add(&self, stat: Stat, delta: i64) {
        COUNTS.add(stat, delta);
        match stat {
            Stat::Inflight => {
                let owed = GAUGE_OWED.swap(0, SeqCst);
                self.stream.gauge_add(self.metrics.inflight, delta + owed);
            }
            Stat::Started => self
                .stream
                .counter_add(self.metrics.started, delta.unsigned_abs()),
            Stat::Gate | Stat::OutboundInflight | Stat::OutboundStarted => {}
        }
    }

    fn get(&self, stat: Stat) -> Option<u64> {
        COUNTS.get(stat)
    }
}

/// One stream's state. Cells, not `&mut`: Envoy may run a hook of this
/// stream inside another (a local reply runs the response hooks), so hooks
/// share the state.
#[derive(Default)]
pub struct ProviderStream {
    /// In the in-flight count: leaves it once.
    counted: Cell<bool>,
    /// The closing mark was counted for this response.
    marked: Cell<bool>,
}

fn is_closing() -> bool {
    PHASE.value() > 0
}

impl ProviderStream {
    pub fn request_headers(&self, c: &Config, s: Stream) -> u32 {
        let stats = Mirrored {
            stream: s,
            metrics: &c.metrics,
        };
        match gate::admit(&stats, c.config.reject_when_drained) {
            Admission::Admitted => {
                self.counted.set(true);
                CONTINUE
            }
            Admission::Rejected => {
                s.counter_add(c.metrics.rejected, 1);
                let mut headers = vec![(c.config.closing_header.as_str(), "true")];
                if c.config.immediate_health_check_fail {
                    headers.push((IMMEDIATE_HC_FAIL, "true"));
                }
                if let Some(h) = &c.config.instance_header {
                    headers.push((h.as_str(), c.instance_id.as_str()));
                }
                s.send_response(
                    503,
                    &headers,
                    b"instance is shutting down\n",
                    "graceful_provider_drained",
                );
                STOP_ITERATION
            }
        }
    }

    fn note_marked(&self, c: &Config, s: Stream) {
        if !self.marked.replace(true) {
            s.counter_add(c.metrics.closing_marked, 1);
        }
    }

    pub fn response_headers(&self, c: &Config, s: Stream) -> u32 {
        let cfg = &c.config;
        if let Some(h) = &cfg.instance_header {
            s.set_header(RESPONSE_HEADERS, h, &c.instance_id);
        }
        if is_closing() {
            let mut ok = s.set_header(RESPONSE_HEADERS, &cfg.closing_header, "true");
            if cfg.immediate_health_check_fail {
                ok &= s.set_header(RESPONSE_HEADERS, IMMEDIATE_HC_FAIL, "true");
            }
            if ok {
                self.note_marked(c, s);
            }
        }
        CONTINUE
    }

    /// gRPC: the mark in the trailers too.
    pub fn response_trailers(&self, c: &Config, s: Stream) -> u32 {
        if is_closing() && s.set_header(RESPONSE_TRAILERS, &c.config.closing_header, "true") {
            self.note_marked(c, s);
        }
        CONTINUE
    }

    pub fn stream_complete(&self, c: &Config, s: Stream) {
        if self.counted.take() {
            gate::finish(&Mirrored {
                stream: s,
                metrics: &c.metrics,
            });
        }
    }
}

impl Drop for ProviderStream {
    /// A stream Envoy destroyed without `stream_complete`: it leaves the
    /// count here (the gate must not wait for it forever).
    fn drop(&mut self) {
        if self.counted.take() {
            COUNTS.add(Stat::Inflight, -1);
            GAUGE_OWED.fetch_sub(1, SeqCst);
            log::debug("graceful_provider: a stream ended without stream_complete");
        }
    }
}
