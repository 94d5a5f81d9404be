//! How the harness's Envoys get their ports (issue 51): listeners at port
//! 0, read back from the admin; a port the config needs before start
//! picked, and picked again when Envoy lost it. Here the picked port is
//! taken on purpose, before Envoy starts.

use std::net::{SocketAddr, TcpListener};

use graceful_harness::support::client;
use graceful_harness::support::envoy::EnvoySpec;
use graceful_harness::support::upstream::Upstream;

/// The provider sidecar, its inbound listener at port 0.
fn provider(name: &str, app: &Upstream) -> EnvoySpec {
    EnvoySpec::new(name, "provider-sidecar.yaml")
        .set("LISTEN_ADDRESS", "127.0.0.1")
        .set("INBOUND_PORT", 0)
        .set("APP_PORT", app.addr.port())
}

/// Takes the port `spec` picked for `name` (as another process would
/// between the pick and Envoy's bind).
fn take(spec: &EnvoySpec, name: &str) -> (u16, TcpListener) {
    let port: u16 = spec.value(name).unwrap().parse().unwrap();
    let held = TcpListener::bind(("127.0.0.1", port)).unwrap();
    (port, held)
}

async fn serves(at: SocketAddr) {
    let r = client::get(at, "/").await.unwrap();
    assert_eq!(r.status, 200, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envoy_whose_picked_admin_port_was_taken_starts_on_another() {
    let app = Upstream::start().await;
    let spec = provider("ports-admin-taken", &app);
    let (taken, _held) = take(&spec, "ADMIN_PORT");
    let envoy = spec.start().await;
    assert_ne!(envoy.port("ADMIN_PORT"), taken);
    assert_eq!(envoy.admin.port(), envoy.port("ADMIN_PORT"));
    let inbound = envoy.listener("inbound").await;
    assert_ne!(inbound.port(), 0);
    serves(inbound).await;
    // The admin cluster followed the new port: its member is the admin.
    let clusters = client::get(envoy.admin, "/clusters").await.unwrap().text();
    let member = format!("envoy_admin::{}::", envoy.admin);
    assert!(clusters.contains(&member), "{member} in:\n{clusters}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewritten_config_follows_its_picked_port_when_it_was_taken() {
    // The config a test rewrote from rendered() has the taken port in it.
    let app = Upstream::start().await;
    let spec = provider("ports-config-taken", &app);
    let (taken, _held) = take(&spec, "ADMIN_PORT");
    let config = spec
        .rendered()
        .replace("stat_prefix: inbound", "stat_prefix: rewritten");
    assert!(config.contains(&format!("port_value: {taken}")));
    let envoy = spec.with_config(config).start().await;
    assert_ne!(envoy.port("ADMIN_PORT"), taken);
    serves(envoy.listener("inbound").await).await;
    assert!(envoy.stat("http.rewritten.downstream_rq_total").await >= Some(1));
    let clusters = client::get(envoy.admin, "/clusters").await.unwrap().text();
    let member = format!("envoy_admin::{}::", envoy.admin);
    assert!(clusters.contains(&member), "{member} in:\n{clusters}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listeners_at_port_zero_each_get_their_own() {
    let app = Upstream::start().await;
    let (a, b) = (
        provider("ports-zero-a", &app).start().await,
        provider("ports-zero-b", &app).start().await,
    );
    let (at_a, at_b) = (a.listener("inbound").await, b.listener("inbound").await);
    assert_ne!(at_a, at_b);
    assert_ne!(a.admin, b.admin);
    serves(at_a).await;
    serves(at_b).await;
}
