//! Pieces of a graceful mesh that several real-Envoy suites start the same
//! way: the consumer sidecar in front of test upstreams, and the drain
//! filter's status answer.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use graceful_core::drain::status::Status;

use crate::support::client::{self, Conn, Response};
use crate::support::envoy::{eventually, scratch_path, write_eds, Envoy, EnvoySpec};
use crate::support::upstream::Upstream;

/// The closing mark a provider sidecar puts on responses.
pub const CLOSING: &str = "x-graceful-closing";

/// graceful_consumer's gauges (its other metrics are counters).
const CONSUMER_GAUGES: [&str; 3] = [
    "graceful_consumer_tombstones",
    "graceful_consumer_tombstone_bytes",
    "graceful_consumer_inflight",
];

/// `envoy/consumer-sidecar.yaml` (graceful_consumer, override_host, a
/// retry policy) in front of a `providers` cluster fed by file-based EDS.
pub struct ConsumerSidecar {
    pub envoy: Envoy,
    /// The outbound listener the app would call.
    pub outbound: SocketAddr,
    /// The EDS file: rewrite it with [`write_eds`] to change membership.
    pub eds: PathBuf,
    /// The test upstreams standing in for provider sidecars.
    pub ups: Vec<Upstream>,
}

impl ConsumerSidecar {
    /// Three upstreams with instance ids a1, b1, c1, all in the cluster.
    pub async fn start(name: &str, config: &str, retries: u32) -> ConsumerSidecar {
        ConsumerSidecar::with_instances(name, config, retries, ["a1", "b1", "c1"]).await
    }

    /// One upstream per instance id, in that order, all in the cluster.
    pub async fn with_instances<I>(
        name: &str,
        config: &str,
        retries: u32,
        instances: I,
    ) -> ConsumerSidecar
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let mut ups = Vec::new();
        for id in instances {
            let u = Upstream::start().await;
            u.set_instance(id.as_ref());
            ups.push(u);
        }
        let addrs: Vec<SocketAddr> = ups.iter().map(|u| u.addr).collect();
        ConsumerSidecar::with_endpoints(name, config, retries, ups, &addrs).await
    }

    /// `endpoints` in the cluster (they need not be `ups`: an address with
    /// nothing listening refuses connections); returns once Envoy has them.
    pub async fn with_endpoints(
        name: &str,
        config: &str,
        retries: u32,
        ups: Vec<Upstream>,
        endpoints: &[SocketAddr],
    ) -> ConsumerSidecar {
        let eds = scratch_path(&format!("{name}-eds"), "yaml");
        write_eds(&eds, "providers", endpoints);
        let envoy = EnvoySpec::new(name, "consumer-sidecar.yaml")
            .set("OUTBOUND_PORT", 0)
            .set("EDS_PATH", eds.display())
            .set("CONSUMER_CONFIG", config)
            .set("RETRIES", retries)
            .start()
            .await;
        let sidecar = ConsumerSidecar {
            outbound: envoy.listener("outbound").await,
            envoy,
            eds,
            ups,
        };
        sidecar.wait_members(endpoints.len() as u64).await;
        sidecar
    }

    /// Waits until Envoy's `providers` cluster has `n` members.
    pub async fn wait_members(&self, n: u64) {
        eventually(
            &format!("{n} members in cluster providers"),
            Duration::from_secs(10),
            || async {
                (self.envoy.stat("cluster.providers.membership_total").await == Some(n))
                    .then_some(())
            },
        )
        .await;
    }

    /// Waits until graceful_consumer has refreshed membership from the
    /// admin since now: a request to Envoy's admin cluster completed (and,
    /// the admin's stats being answered on the main thread after it, its
    /// answer was read). Until the first refresh after a cluster's first
    /// request, steering knows only the members it saw answer (sampled),
    /// and with none but the closing host seen it has nothing to steer to.
    pub async fn until_membership_refreshed(&self) {
        let stat = "cluster.envoy_admin.upstream_rq_completed";
        let before = self.envoy.present_stat(stat).await;
        eventually(
            "a membership refresh from the admin",
            Duration::from_secs(10),
            || async { (self.envoy.present_stat(stat).await > before).then_some(()) },
        )
        .await;
    }

    /// Requests each upstream's app has served, in `ups` order.
    pub fn counts(&self) -> Vec<u64> {
        self.ups.iter().map(Upstream::app_requests).collect()
    }

    /// One of the filter's metrics (0 before it is first written; a panic
    /// naming it when Envoy has no such stat in any scope, so a missing one
    /// never reads as 0). A counter adds up over every stats scope the
    /// listener and upstream instances write it in (two on Envoy 1.36: see
    /// [`crate::support::envoy::Envoy::custom_stat_scopes`]); a gauge is the
    /// listener's, at the root (its ticks keep it current; the upstream
    /// instance sets it only when it writes).
    pub async fn stat(&self, name: &str) -> u64 {
        if CONSUMER_GAUGES.contains(&name) {
            return self.envoy.custom_stat(name).await;
        }
        let scopes = self.envoy.custom_stat_scopes(name).await;
        assert!(
            !scopes.is_empty(),
            "Envoy has no stat wasmcustom.{name} in any scope (or its admin did not answer)"
        );
        scopes.into_iter().sum()
    }

    /// Sends single requests until one comes back with the closing mark.
    pub async fn until_marked(&self) -> Instant {
        let mut conn = Conn::http1(self.outbound).await.unwrap();
        for _ in 0..200 {
            let r = conn.get("/").await.unwrap();
            assert_eq!(r.status, 200);
            if r.header(CLOSING).as_deref() == Some("true") {
                return Instant::now();
            }
        }
        panic!(
            "no closing-marked response in 200 requests: {:?}",
            self.counts()
        );
    }
}

/// `envoy/provider-sidecar.yaml` (graceful_drain + graceful_provider) in
/// front of a test upstream standing in for the app.
pub struct ProviderSidecar {
    pub envoy: Envoy,
    /// The inbound listener callers reach.
    pub inbound: SocketAddr,
    pub app: Upstream,
}

impl ProviderSidecar {
    /// Listening on `listen` (an IPv4 or IPv6 loopback address).
    pub async fn start(
        name: &str,
        listen: IpAddr,
        drain_config: &str,
        provider_config: &str,
    ) -> ProviderSidecar {
        let app = Upstream::start().await;
        let envoy = EnvoySpec::new(name, "provider-sidecar.yaml")
            .set("LISTEN_ADDRESS", listen)
            .set("INBOUND_PORT", 0)
            .set("APP_PORT", app.addr.port())
            .set("DRAIN_CONFIG", drain_config)
            .set("PROVIDER_CONFIG", provider_config)
            .start()
            .await;
        ProviderSidecar {
            inbound: envoy.listener("inbound").await,
            envoy,
            app,
        }
    }
}

/// The status JSON in a `/graceful/status` answer.
pub fn status_of(r: &Response) -> Status {
    serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("status JSON {:?}: {e}", r.text()))
}

/// `GET /graceful/status` on a listener with graceful_drain.
pub async fn status(addr: SocketAddr) -> Status {
    status_of(&client::get(addr, "/graceful/status").await.unwrap())
}

/// `POST /graceful/closing` on a listener with graceful_drain, answered 202.
pub async fn start_closing(addr: SocketAddr) {
    let r = client::post(addr, "/graceful/closing").await.unwrap();
    assert_eq!(r.status, 202, "{r:?}");
}

/// Polls `/graceful/status` until the drain gate has passed, within
/// `within`; the status then.
pub async fn until_drained(addr: SocketAddr, within: Duration) -> Status {
    eventually("the drain gate to pass", within, || async {
        let st = status(addr).await;
        (st.phase == "drained").then_some(st)
    })
    .await
}
