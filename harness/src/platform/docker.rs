//! The docker harness driven through a real Docker engine: the compose
//! project `envoy/docker-compose.yaml` describes (three providers, each
//! Envoy and the demo app under graceful-entrypoint, and a consumer), and a
//! rolling `docker stop` / `docker start` of every provider under load,
//! reported as `make demo` reports a run. Used by `make harness-demo` and by
//! `tests/docker.rs`.
//!
//! A provider's restart, as the engine drives it:
//!
//! | step | what happens | recorded as |
//! |---|---|---|
//! | `docker stop -t 45` | SIGTERM to graceful-entrypoint: `POST /graceful/closing`, then `GET /graceful/drained?wait=` | `closing_ms` |
//! | the consumer learns it | an answer carries `x-graceful-closing: true`: `graceful_consumer_evictions` moves | `seen_ms` |
//! | drained | the entrypoint logs `drained after N ms` | `drained_ms` = closing + N |
//! | stop returns | Envoy and the app stopped, the container exited | `down_ms`, exit code |
//! | `docker start` | same container, same address, new instance id; healthcheck passes | `up_ms` |

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::platform::compose::PROJECT;
use crate::support::client::{self, Conn};
use crate::support::envoy::{repo_root, wait_for};
use crate::support::load::{Load, Protocol, Sample};
use crate::support::run_report::{ProviderEvents, RunReport};

/// The consumer's listener and admin as the compose file publishes them.
pub const CONSUMER: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(LOOPBACK), 15001);
pub const CONSUMER_ADMIN: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(LOOPBACK), 9902);
const LOOPBACK: std::net::Ipv4Addr = std::net::Ipv4Addr::new(127, 0, 0, 1);
/// The compose services, providers first.
pub const PROVIDERS: [&str; 3] = ["provider1", "provider2", "provider3"];

/// Runs a command; its stdout and stderr, or an error naming it.
pub fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("{program} {}: {}", args.join(" "), text.trim()))
    }
}

pub fn docker(args: &[&str]) -> Result<String, String> {
    run("docker", args)
}

/// The engine's version, or why no engine answers.
pub fn engine() -> Result<String, String> {
    docker(&["info", "--format", "{{.ServerVersion}}"]).map(|v| v.trim().to_string())
}

/// `docker compose` if the CLI has the plugin, else docker-compose (as the
/// Makefile chooses), on the harness's project and file.
pub fn compose(args: &[&str]) -> Result<String, String> {
    let file = repo_root().join("envoy/docker-compose.yaml");
    let file = file.display().to_string();
    let plugin = Command::new("docker")
        .args(["compose", "version"])
        .output()
        .is_ok_and(|o| o.status.success());
    let (program, mut all): (&str, Vec<&str>) = if plugin {
        ("docker", vec!["compose"])
    } else {
        ("docker-compose", vec![])
    };
    all.extend(["-p", PROJECT, "-f", &file]);
    all.extend(args);
    run(program, &all)
}

/// The container of a compose service (either Compose's naming), or "".
pub fn container(service: &str) -> String {
    docker(&[
        "ps",
        "-aq",
        "--filter",
        &format!("label=com.docker.compose.project={PROJECT}"),
        "--filter",
        &format!("label=com.docker.compose.service={service}"),
    ])
    .unwrap_or_default()
    .trim()
    .to_string()
}

/// `docker inspect -f FORMAT`, trimmed ("" if it fails).
pub fn inspect(id: &str, format: &str) -> String {
    docker(&["inspect", "-f", format, id])
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Waits until a service's container reports healthy.
pub async fn healthy(service: &str, deadline: Duration) -> Result<(), String> {
    let id = container(service);
    if id.is_empty() {
        return Err(format!("no container for {service}"));
    }
    wait_for(&format!("{service} healthy"), deadline, || {
        let id = id.clone();
        async move { (inspect(&id, "{{.State.Health.Status}}") == "healthy").then_some(()) }
    })
    .await
}

/// `compose up -d` from nothing, then every provider healthy and the
/// consumer answering.
pub async fn up() -> Result<(), String> {
    let _ = compose(&["down", "--volumes", "--remove-orphans"]);
    compose(&["up", "-d"])?;
    for service in PROVIDERS {
        healthy(service, Duration::from_secs(60)).await?;
    }
    wait_for("the consumer answers", Duration::from_secs(30), || async {
        let mut c = Conn::http1(CONSUMER).await.ok()?;
        (c.get("/").await.ok()?.status == 200).then_some(())
    })
    .await
}

/// `compose down`: no container, network or volume left.
pub fn down() -> Result<String, String> {
    compose(&["down", "--volumes", "--remove-orphans"])
}

/// Every container's last log lines, for a failure's report.
pub fn logs() -> String {
    let mut out = String::new();
    for service in PROVIDERS.iter().chain(&["consumer"]) {
        let id = container(service);
        if let Ok(log) = docker(&["logs", "--tail", "60", &id]) {
            out += &format!("---- {service} ----\n{log}\n");
        }
    }
    out
}

/// A counter or gauge of the consumer's admin: `NAME` exactly (for a wasm
/// stat, `wasmcustom.NAME`); None if unreadable.
pub async fn consumer_stat(name: &str) -> Option<u64> {
    let r = client::get(CONSUMER_ADMIN, &format!("/stats?filter=^{name}$"))
        .await
        .ok()?;
    r.text()
        .lines()
        .find_map(|l| l.split_once(": ").and_then(|(_, v)| v.trim().parse().ok()))
}

/// One provider's `docker stop` as it went.
#[derive(Debug, Clone)]
pub struct Stopped {
    pub service: &'static str,
    /// The container's whole log after it stopped.
    pub log: String,
    pub exit_code: String,
    /// The consumer evicted it (a marked answer) before the stop returned.
    pub consumer_saw: bool,
}

/// A rolling restart's load and pacing.
#[derive(Debug, Clone, Copy)]
pub struct Rolling {
    pub rate: u32,
    pub conns: usize,
    /// Load before the first stop.
    pub warmup: Duration,
    /// Load after each provider is back, before the next stop (and at the end).
    pub settle: Duration,
}

impl Default for Rolling {
    fn default() -> Self {
        Rolling {
            rate: 200,
            conns: 8,
            warmup: Duration::from_secs(2),
            settle: Duration::from_secs(2),
        }
    }
}

/// The time since `epoch`, in ms.
fn ms(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// `drained after N ms` from graceful-entrypoint's log.
fn drained_after(log: &str) -> Option<u64> {
    log.lines().rev().find_map(|l| {
        let rest = l.split("drained after ").nth(1)?;
        rest.split(' ').next()?.parse().ok()
    })
}

/// Restarts each provider in turn with `docker stop` (SIGTERM and a 45 s
/// grace period) and `docker start` while an open-loop load runs through the
/// consumer; the harness must be up. The report counts every request the
/// load made; `after_closing` counts answers a provider gave to requests due
/// after the consumer learnt it was closing (from the load's own answers, as
/// the container's access log leaves with it).
pub async fn rolling_restart(
    plan: Rolling,
) -> Result<(RunReport, Vec<Sample>, Vec<Stopped>), String> {
    let epoch = Instant::now();
    let load = Load::start(CONSUMER, Protocol::Http1, plan.rate, plan.conns, epoch);
    let mut events = Vec::new();
    let mut stopped = Vec::new();
    let outcome = async {
        tokio::time::sleep(plan.warmup).await;
        for (i, service) in PROVIDERS.iter().copied().enumerate() {
            let id = container(service);
            if id.is_empty() {
                return Err(format!("no container for {service}"));
            }
            let evictions = consumer_stat("wasmcustom.graceful_consumer_evictions")
                .await
                .unwrap_or(0);
            let closing_ms = ms(epoch);
            let stop = {
                let id = id.clone();
                tokio::task::spawn_blocking(move || docker(&["stop", "-t", "45", &id]))
            };
            // The consumer's first eviction after the stop began: the
            // moment it learnt (from a marked answer) that this one closes.
            let mut seen_ms = None;
            while !stop.is_finished() {
                if seen_ms.is_none()
                    && consumer_stat("wasmcustom.graceful_consumer_evictions")
                        .await
                        .unwrap_or(0)
                        > evictions
                {
                    seen_ms = Some(ms(epoch));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            stop.await.map_err(|e| e.to_string())??;
            let down_ms = ms(epoch);
            let log = docker(&["logs", &id]).unwrap_or_default();
            let exit_code = inspect(&id, "{{.State.ExitCode}}");
            let drained_ms = drained_after(&log).map_or(down_ms, |n| closing_ms + n);
            docker(&["start", &id])?;
            healthy(service, Duration::from_secs(60)).await?;
            let up_ms = ms(epoch);
            events.push(ProviderEvents {
                provider: i + 1,
                closing_ms,
                seen_ms: seen_ms.unwrap_or(closing_ms),
                drained_ms,
                down_ms,
                up_ms,
                after_closing: 0,
                started_after_seen: None,
                // RunReport::new computes them from the samples.
                busiest_provider: None,
                max_share: None,
                // The container's report line is in its log.
                drain_report: None,
                watch_told_ms: None,
                last_request_end_ms: None,
                access_log: Default::default(),
            });
            stopped.push(Stopped {
                service,
                log,
                exit_code,
                consumer_saw: seen_ms.is_some(),
            });
            tokio::time::sleep(plan.settle).await;
        }
        Ok(())
    }
    .await;
    let samples = load.stop().await;
    outcome?;
    let duration_ms = ms(epoch);
    for ev in &mut events {
        let index = u8::try_from(ev.provider).unwrap_or(0);
        ev.after_closing = samples
            .iter()
            .filter(|s| s.served_by == index && s.due_ms > ev.seen_ms && s.due_ms < ev.down_ms)
            .count() as u64;
    }
    let retries = consumer_stat("cluster.providers.upstream_rq_retry")
        .await
        .unwrap_or(0);
    let mut report = RunReport::new(
        &samples,
        events,
        retries,
        Protocol::Http1,
        plan.rate,
        duration_ms,
    );
    report.consumer_inflight_end = consumer_stat("wasmcustom.graceful_consumer_inflight").await;
    Ok((report, samples, stopped))
}

#[cfg(test)]
mod tests {
    use super::drained_after;

    #[test]
    fn it_reads_the_drain_time_from_the_entrypoint_log() {
        let log = "graceful-entrypoint: closing\ngraceful-entrypoint: drained after 1234 ms\n";
        assert_eq!(drained_after(log), Some(1234));
        let forced = "graceful-entrypoint: drained after 25003 ms, FORCED: a drain timeout";
        assert_eq!(drained_after(forced), Some(25003));
        assert_eq!(drained_after("graceful-entrypoint: closing\n"), None);
    }
}
