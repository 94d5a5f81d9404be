//! graceful_provider's callbacks, for both deliveries.
//!
//! Per stream: admit (count in the in-flight gauge, or reject with a local
//! 503 once the drain gate has passed: [`crate::gate`]), mark the response
//! while the instance is closing (headers, and gRPC trailers), and count
//! the stream out exactly once when it ends.
//!
//! | callback | reads | writes |
//! |---|---|---|
//! | request headers | gate gauge | in flight +1, started +1; or rejected +1 and the marked 503 |
//! | response headers | phase gauge | instance header; the closing mark while closing (closing_marked +1 once) |
//! | response trailers | phase gauge | the closing mark while closing |
//! | stream end | nothing | in flight −1 if counted |

use std::cell::Cell;

use super::host::{Action, Host, HostMetrics, Level, LocalReply, Map, Stream};
use crate::config::ProviderConfig;
use crate::gate::{self, Admission};
use crate::headers::IMMEDIATE_HC_FAIL;
use crate::instance;
use crate::keys::{self, Owner};
use crate::metrics::Metric;

/// One configured provider.
pub struct Provider {
    config: ProviderConfig,
    instance_id: String,
}

/// One stream's state. Cells, not `&mut`: the native module may run one of
/// a stream's callbacks inside another (a local reply runs the response
/// ones).
#[derive(Debug, Default)]
pub struct ProviderStream {
    /// In the in-flight count: leaves it once.
    counted: Cell<bool>,
    /// The closing mark was counted for this response.
    marked: Cell<bool>,
}

impl Provider {
    /// Parses `json`, creates the provider's shared keys, agrees on the
    /// instance id and publishes it for graceful_drain. Err: the reason
    /// to refuse the config (the glue names the filter).
    pub fn configure(h: &impl Host, json: &[u8]) -> Result<Provider, String> {
        let config = ProviderConfig::from_json(json).map_err(|e| e.to_string())?;
        // Configured before any worker serves, so the record exists before
        // the first admission (no first-write race).
        super::host::create_keys(h, Owner::Provider)?;
        // A stat Envoy's stats_matcher rejects counts nothing: the gate
        // would pass with requests in flight. Refuse rather than pretend.
        if !h.metric_is_kept(Metric::ProviderInflight) {
            return Err(format!(
                "Envoy does not keep the stat {} (reads 0 after +1): its stats_matcher must keep the wasmcustom.graceful_ stats",
                Metric::ProviderInflight.name()
            ));
        }
        let instance_id = match &config.instance_id {
            Some(id) => id.clone(),
            None => {
                let now = h.now_us();
                let candidate = instance::generate(now, super::entropy(now));
                match instance::agree(h.store(), &candidate) {
                    Ok(id) => id,
                    Err(e) => {
                        h.log(
                            Level::Warn,
                            &format!("instance id not shared ({e:?}); using {candidate}"),
                        );
                        candidate
                    }
                }
            }
        };
        // Published for graceful_drain, which stamps its own answers with it
        // (every copy writes the same value, so racing writes agree).
        if let Some(header) = &config.instance_header {
            let _ = h.store().set(
                keys::IDENTITY.name,
                &instance::encode_identity(header, &instance_id),
                0,
            );
        }
        Ok(Provider {
            config,
            instance_id,
        })
    }

    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// Unreadable reads as serving: an unmarked response is harmless, a
    /// false mark would evict a healthy instance.
    fn is_closing(h: &(impl Host + ?Sized)) -> bool {
        h.metric_get(Metric::DrainPhase).is_some_and(|p| p > 0)
    }

    pub fn request_headers(&self, st: &ProviderStream, s: &impl Stream) -> Action {
        match gate::admit(&HostMetrics(s), self.config.reject_when_drained) {
            Admission::Admitted => {
                st.counted.set(true);
                Action::Continue
            }
            Admission::Rejected => {
                s.metric_add(Metric::ProviderRejected, 1);
                let mut headers = vec![(self.config.closing_header.as_str(), "true")];
                if self.config.immediate_health_check_fail {
                    headers.push((IMMEDIATE_HC_FAIL, "true"));
                }
                if let Some(h) = &self.config.instance_header {
                    headers.push((h.as_str(), self.instance_id.as_str()));
                }
                let sent = s.send_reply(&LocalReply {
                    status: 503,
                    headers: &headers,
                    body: b"instance is shutting down\n",
                    grpc_status: None,
                    details: "graceful_provider_drained",
                });
                if sent {
                    Action::Stop
                } else {
                    Action::Continue
                }
            }
        }
    }

    fn note_marked(st: &ProviderStream, s: &impl Host) {
        if !st.marked.replace(true) {
            s.metric_add(Metric::ProviderClosingMarked, 1);
        }
    }

    pub fn response_headers(&self, st: &ProviderStream, s: &impl Stream) -> Action {
        let cfg = &self.config;
        if let Some(h) = &cfg.instance_header {
            s.set_header(Map::ResponseHeaders, h, &self.instance_id);
        }
        if Self::is_closing(s) {
            let mut ok = s.set_header(Map::ResponseHeaders, &cfg.closing_header, "true");
            if cfg.immediate_health_check_fail {
                ok &= s.set_header(Map::ResponseHeaders, IMMEDIATE_HC_FAIL, "true");
            }
            if ok {
                Self::note_marked(st, s);
            }
        }
        Action::Continue
    }

    /// Marks the trailers of a response if the instance is closing now:
    /// any response with trailers (gRPC, or HTTP with chunked trailers,
    /// where the mark is as harmless as in headers). A gRPC response always
    /// ends in trailers, or is trailers-only (headers, marked above); one
    /// that ends in its body instead is not valid gRPC, and carries the mark
    /// in its headers only: creating trailers there would need the body
    /// callback, entered for every chunk of every response.
    pub fn response_trailers(&self, st: &ProviderStream, s: &impl Stream) -> Action {
        if Self::is_closing(s)
            && s.set_header(Map::ResponseTrailers, &self.config.closing_header, "true")
        {
            Self::note_marked(st, s);
        }
        Action::Continue
    }

    /// The stream is over: it leaves the in-flight count, exactly once
    /// however often the host says so.
    pub fn stream_end(&self, st: &ProviderStream, h: &impl Host) {
        if st.counted.take() {
            gate::finish(&HostMetrics(h));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filter::mock::MockHost;

    fn provider(h: &MockHost, json: &str) -> Provider {
        match Provider::configure(h, json.as_bytes()) {
            Ok(p) => p,
            Err(e) => panic!("configure: {e}"),
        }
    }

    #[test]
    fn it_admits_counts_and_counts_out_once() {
        let h = MockHost::new();
        let p = provider(&h, "");
        let st = ProviderStream::default();
        assert_eq!(p.request_headers(&st, &h), Action::Continue);
        assert_eq!(h.metric(Metric::ProviderInflight), 1);
        assert_eq!(h.metric(Metric::ProviderStarted), 1);
        p.stream_end(&st, &h);
        p.stream_end(&st, &h);
        assert_eq!(h.metric(Metric::ProviderInflight), 0);
        assert!(h.replies().is_empty());
    }

    #[test]
    fn once_the_gate_passed_it_rejects_with_the_marked_503() {
        let h = MockHost::new();
        let p = provider(
            &h,
            r#"{"instance_id": "pod-a", "immediate_health_check_fail": true}"#,
        );
        h.metric_set(Metric::DrainGate, 1);
        let st = ProviderStream::default();
        assert_eq!(p.request_headers(&st, &h), Action::Stop);
        let replies = h.replies();
        assert_eq!(replies.len(), 1);
        let r = &replies[0];
        assert_eq!(r.status, 503);
        assert_eq!(r.details, "graceful_provider_drained");
        assert_eq!(r.body, b"instance is shutting down\n");
        for (k, v) in [
            ("x-graceful-closing", "true"),
            (IMMEDIATE_HC_FAIL, "true"),
            ("x-graceful-instance", "pod-a"),
        ] {
            assert!(r.headers.contains(&(k.into(), v.into())), "{k}: {r:?}");
        }
        assert_eq!(h.metric(Metric::ProviderRejected), 1);
        assert_eq!(h.metric(Metric::ProviderInflight), 0);
        p.stream_end(&st, &h);
        assert_eq!(h.metric(Metric::ProviderInflight), 0);
    }

    #[test]
    fn a_refused_reply_lets_the_request_through() {
        let h = MockHost::new();
        let p = provider(&h, "");
        h.metric_set(Metric::DrainGate, 1);
        h.refuse_replies();
        assert_eq!(
            p.request_headers(&ProviderStream::default(), &h),
            Action::Continue
        );
    }

    #[test]
    fn it_marks_headers_and_trailers_only_while_closing_and_counts_once() {
        let h = MockHost::new();
        let p = provider(&h, r#"{"immediate_health_check_fail": true}"#);
        let st = ProviderStream::default();
        p.request_headers(&st, &h);
        p.response_headers(&st, &h);
        let id = p.instance_id().to_string();
        assert_eq!(
            h.header_text(Map::ResponseHeaders, "x-graceful-instance"),
            Some(id)
        );
        assert_eq!(
            h.header_text(Map::ResponseHeaders, "x-graceful-closing"),
            None
        );
        h.metric_set(Metric::DrainPhase, 1);
        let st = ProviderStream::default();
        p.response_headers(&st, &h);
        p.response_trailers(&st, &h);
        assert_eq!(
            h.header_text(Map::ResponseHeaders, "x-graceful-closing")
                .as_deref(),
            Some("true")
        );
        assert_eq!(
            h.header_text(Map::ResponseHeaders, IMMEDIATE_HC_FAIL)
                .as_deref(),
            Some("true")
        );
        assert_eq!(
            h.header_text(Map::ResponseTrailers, "x-graceful-closing")
                .as_deref(),
            Some("true")
        );
        assert_eq!(h.metric(Metric::ProviderClosingMarked), 1);
    }

    #[test]
    fn every_copy_agrees_on_one_instance_id_and_publishes_it() {
        let h = MockHost::new();
        let a = provider(&h, r#"{"instance_header": "x-i"}"#);
        let b = provider(&h, r#"{"instance_header": "x-i"}"#);
        assert_eq!(a.instance_id(), b.instance_id());
        let published = h.store().get(keys::IDENTITY.name).ok().flatten();
        let decoded = published.and_then(|(v, _)| instance::decode_identity(&v));
        assert_eq!(decoded, Some(("x-i".into(), a.instance_id().into())));
    }

    #[test]
    fn it_refuses_a_config_whose_in_flight_stat_envoy_drops_naming_it() {
        let h = MockHost::new();
        h.drop_metric(Metric::ProviderInflight);
        let err = Provider::configure(&h, b"").err().unwrap_or_default();
        assert!(err.contains("graceful_provider_inflight"), "{err}");
        let h = MockHost::new();
        let err = Provider::configure(&h, br#"{"reject_when_drained": 3}"#)
            .err()
            .unwrap_or_default();
        assert!(err.contains("reject_when_drained"), "{err}");
    }

    #[test]
    fn a_store_that_refuses_the_id_is_logged_and_a_local_id_used() {
        let h = MockHost::new();
        h.refuse_writes_to(keys::INSTANCE_ID.name);
        let p = provider(&h, "");
        assert!(instance::is_valid(p.instance_id().as_bytes()));
        assert_eq!(h.logs_containing("instance id not shared").len(), 1);
    }
}
