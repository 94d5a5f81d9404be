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
//!
//! The front shape (`envoy/docker-compose-front.yaml`, [`FRONT`]): two
//! front Envoys over three backends with no sidecar, each the demo app
//! under `graceful-entrypoint --front`. [`stop_backend_under_load`] stops
//! one backend with `docker stop` while load runs through both fronts and
//! a slow request may be in flight at it, then starts it again:
//!
//! | step | what happens | recorded as |
//! |---|---|---|
//! | `docker stop -t 45` | SIGTERM to graceful-entrypoint: `POST /graceful/front/closing` to both fronts, long-polls of `drained` | `closing_ms` |
//! | both acknowledged | each front steered away from it and its requests there ended; the entrypoint prints `graceful-hook front: 2 of 2 fronts acknowledged in ...` | in `log` |
//! | stop returns | the app stopped, the container exited | `down_ms`, `stop_took`, exit code |
//! | `docker start` | same address; the entrypoint posts `serving` to both fronts | `started_ms` |
//! | back | it serves through both fronts again | `back_ms` |

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::platform::compose::{self as generated, front_host_ports, FRONT_PROJECT, PROJECT};
use crate::support::client::{self, Conn};
use crate::support::envoy::{repo_root, wait_for};
use crate::support::load::{Load, Protocol, Sample};
use crate::support::run_report::{ProviderEvents, RunReport};

/// A compose project: its name (`-p`) and its file in the repository.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Project {
    pub name: &'static str,
    pub file: &'static str,
}

/// `make up`'s mesh: a consumer sidecar before three provider sidecars.
pub const MESH: Project = Project {
    name: PROJECT,
    file: generated::FILE,
};
/// The front shape: two front Envoys before three backends with no sidecar.
pub const FRONT: Project = Project {
    name: FRONT_PROJECT,
    file: generated::FRONT_FILE,
};
/// The front shape's services.
pub const BACKENDS: [&str; 3] = ["backend1", "backend2", "backend3"];
pub const FRONTS: [&str; 2] = ["front1", "front2"];

/// Front `i`'s (1-based) public listener as the compose file publishes it.
pub fn front_public(i: usize) -> SocketAddr {
    SocketAddr::new(std::net::IpAddr::V4(LOOPBACK), front_host_ports(i).0)
}

/// Front `i`'s (1-based) admin, published on loopback.
pub fn front_admin(i: usize) -> SocketAddr {
    SocketAddr::new(std::net::IpAddr::V4(LOOPBACK), front_host_ports(i).1)
}

impl Project {
    /// `docker compose` if the CLI has the plugin, else docker-compose (as
    /// the Makefile chooses), on this project and file.
    pub fn compose(&self, args: &[&str]) -> Result<String, String> {
        let file = repo_root().join(self.file);
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
        all.extend(["-p", self.name, "-f", &file]);
        all.extend(args);
        run(program, &all)
    }

    /// The container of a service (either Compose's naming), or "".
    pub fn container(&self, service: &str) -> String {
        docker(&[
            "ps",
            "-aq",
            "--filter",
            &format!("label=com.docker.compose.project={}", self.name),
            "--filter",
            &format!("label=com.docker.compose.service={service}"),
        ])
        .unwrap_or_default()
        .trim()
        .to_string()
    }

    /// `compose down`: no container, network or volume left.
    pub fn down(&self) -> Result<String, String> {
        self.compose(&["down", "--volumes", "--remove-orphans"])
    }

    /// The last log lines of each service's container, for a failure's
    /// report.
    pub fn logs(&self, services: &[&str]) -> String {
        let mut out = String::new();
        for service in services {
            let id = self.container(service);
            if let Ok(log) = docker(&["logs", "--tail", "60", &id]) {
                out += &format!("---- {service} ----\n{log}\n");
            }
        }
        out
    }

    /// What is left of the project on the engine: containers, networks
    /// and volumes (empty after `down`).
    pub fn leftovers(&self) -> Vec<String> {
        let label = format!("label=com.docker.compose.project={}", self.name);
        let mut left = Vec::new();
        for kind in [&["ps", "-a"][..], &["network", "ls"], &["volume", "ls"]] {
            let mut args = kind.to_vec();
            args.extend(["-q", "--filter", &label]);
            let ids = docker(&args).unwrap_or_default();
            left.extend(ids.split_whitespace().map(|id| format!("{} {id}", kind[0])));
        }
        left
    }
}

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
/// Makefile chooses), on the mesh's project and file.
pub fn compose(args: &[&str]) -> Result<String, String> {
    MESH.compose(args)
}

/// The container of a mesh service (either Compose's naming), or "".
pub fn container(service: &str) -> String {
    MESH.container(service)
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
    MESH.down()
}

/// Every container's last log lines, for a failure's report.
pub fn logs() -> String {
    MESH.logs(&[PROVIDERS[0], PROVIDERS[1], PROVIDERS[2], "consumer"])
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

/// How many of `n` requests through `public` each backend served (by
/// `x-served-by: pN`), on one connection; failed ones are not counted.
pub async fn served_through(public: SocketAddr, n: usize) -> [u64; 3] {
    let mut counts = [0; 3];
    let Ok(mut conn) = Conn::http1(public).await else {
        return counts;
    };
    for _ in 0..n {
        let Ok(r) = conn.get("/").await else {
            break;
        };
        if let Some(slot) = r
            .header("x-served-by")
            .and_then(|b| b.strip_prefix('p').and_then(|i| i.parse::<usize>().ok()))
            .and_then(|i| i.checked_sub(1))
            .and_then(|i| counts.get_mut(i))
        {
            *slot += 1;
        }
    }
    counts
}

/// The front shape's `compose up -d` from nothing; returns once requests
/// through each front reach all three backends (from their first request
/// the fronts read membership from their admins, every second).
pub async fn front_up() -> Result<(), String> {
    let _ = FRONT.down();
    FRONT.compose(&["up", "-d"])?;
    for i in 1..=FRONTS.len() {
        wait_for(
            &format!("front{i} reaches every backend"),
            Duration::from_secs(60),
            || async move {
                let n = served_through(front_public(i), 30).await;
                n.iter().all(|&c| c > 0).then_some(())
            },
        )
        .await?;
    }
    Ok(())
}

/// Every container of the front shape's last log lines.
pub fn front_logs() -> String {
    FRONT.logs(&[BACKENDS[0], BACKENDS[1], BACKENDS[2], FRONTS[0], FRONTS[1]])
}

/// `graceful-hook front: A of B fronts acknowledged` in an entrypoint's
/// log (its last such line): (A, B).
pub fn fronts_acknowledged(log: &str) -> Option<(u32, u32)> {
    log.lines().rev().find_map(|l| {
        let rest = l.split("graceful-hook front: ").nth(1)?;
        let mut words = rest.split(' ');
        let acked = words.next()?.parse().ok()?;
        (words.next()? == "of").then_some(())?;
        let of = words.next()?.parse().ok()?;
        (words.next()? == "fronts" && words.next()? == "acknowledged").then_some((acked, of))
    })
}

/// One backend's stop in the front shape: load through both fronts, slow
/// requests in flight, and its pace.
#[derive(Debug, Clone, Copy)]
pub struct FrontPlan {
    /// Requests per second through each front, on `conns` connections each.
    pub rate: u32,
    pub conns: usize,
    /// Load before the stop.
    pub warmup: Duration,
    /// `slow_each` requests of `/delay/<slow>` through each front, each on
    /// a connection of its own, sent just before the stop: some are in
    /// flight at the stopped backend (the balancer spreads them).
    pub slow: Duration,
    pub slow_each: usize,
    /// Load after the stop returned, before the backend is started again.
    pub window: Duration,
}

impl Default for FrontPlan {
    fn default() -> Self {
        FrontPlan {
            rate: 150,
            conns: 6,
            warmup: Duration::from_millis(1500),
            slow: Duration::from_millis(2500),
            slow_each: 9,
            window: Duration::from_secs(2),
        }
    }
}

/// One slow request as the client saw it.
#[derive(Debug, Clone, Copy)]
pub struct Slow {
    /// 0: no answer.
    pub status: u16,
    /// The backend that answered (`pN`), 0 if none.
    pub served_by: u8,
    pub sent_ms: u64,
    pub ended_ms: u64,
}

/// What [`stop_backend_under_load`] saw; times in ms since the load began.
#[derive(Debug, Clone)]
pub struct FrontStop {
    pub service: &'static str,
    /// The stopped backend's `pN`.
    pub index: u8,
    /// The load's requests through each front.
    pub samples: Vec<Vec<Sample>>,
    pub slow: Vec<Slow>,
    pub closing_ms: u64,
    pub down_ms: u64,
    /// How long `docker stop` took.
    pub stop_took: Duration,
    /// The container's log up to its exit, and its exit code.
    pub log: String,
    pub exit_code: String,
    pub started_ms: u64,
    /// When it served through both fronts again.
    pub back_ms: u64,
    /// What the entrypoint logged after `docker start`.
    pub restart_log: String,
}

/// Stops backend `index` (1-based) with `docker stop -t 45` while load
/// runs through both fronts and slow requests are in flight, keeps the load
/// on for `plan.window`, starts it again and waits until it serves through
/// both fronts; the front shape must be up.
pub async fn stop_backend_under_load(index: usize, plan: FrontPlan) -> Result<FrontStop, String> {
    let service = *BACKENDS
        .get(index.wrapping_sub(1))
        .ok_or_else(|| format!("no backend {index}"))?;
    let id = FRONT.container(service);
    if id.is_empty() {
        return Err(format!("no container for {service}"));
    }
    let epoch = Instant::now();
    let loads: Vec<Load> = (1..=FRONTS.len())
        .map(|i| {
            Load::start(
                front_public(i),
                Protocol::Http1,
                plan.rate,
                plan.conns,
                epoch,
            )
        })
        .collect();
    let outcome = async {
        tokio::time::sleep(plan.warmup).await;
        let path = format!("/delay/{}", plan.slow.as_millis());
        let slow: Vec<_> = (0..plan.slow_each * FRONTS.len())
            .map(|k| {
                let public = front_public(1 + k % FRONTS.len());
                let path = path.clone();
                let budget = plan.slow + Duration::from_secs(15);
                tokio::spawn(async move {
                    let sent_ms = ms(epoch);
                    let answer = async {
                        let mut conn = Conn::http1(public).await?;
                        conn.get(&path).await
                    };
                    let answer = tokio::time::timeout(budget, answer).await;
                    let (status, served_by) = match answer {
                        Ok(Ok(r)) => (
                            r.status,
                            r.header("x-served-by")
                                .and_then(|b| b.strip_prefix('p').and_then(|i| i.parse().ok()))
                                .unwrap_or(0),
                        ),
                        _ => (0, 0),
                    };
                    Slow {
                        status,
                        served_by,
                        sent_ms,
                        ended_ms: ms(epoch),
                    }
                })
            })
            .collect();
        // Sent and under way at the backends.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let closing_ms = ms(epoch);
        let started = Instant::now();
        {
            let id = id.clone();
            tokio::task::spawn_blocking(move || docker(&["stop", "-t", "45", &id]))
                .await
                .map_err(|e| e.to_string())??;
        }
        let stop_took = started.elapsed();
        let down_ms = ms(epoch);
        let log = docker(&["logs", &id]).unwrap_or_default();
        let exit_code = inspect(&id, "{{.State.ExitCode}}");
        tokio::time::sleep(plan.window).await;
        docker(&["start", &id])?;
        let started_ms = ms(epoch);
        let p = index - 1;
        wait_for(
            &format!("{service} serves through both fronts again"),
            Duration::from_secs(30),
            || async move {
                for i in 1..=FRONTS.len() {
                    if served_through(front_public(i), 30).await[p] == 0 {
                        return None;
                    }
                }
                Some(())
            },
        )
        .await?;
        let back_ms = ms(epoch);
        let whole = docker(&["logs", &id]).unwrap_or_default();
        let restart_log = whole.get(log.len()..).unwrap_or_default().to_string();
        let mut slows = Vec::new();
        for task in slow {
            slows.push(task.await.map_err(|e| e.to_string())?);
        }
        Ok::<_, String>(FrontStop {
            service,
            index: u8::try_from(index).unwrap_or(0),
            samples: Vec::new(),
            slow: slows,
            closing_ms,
            down_ms,
            stop_took,
            log,
            exit_code,
            started_ms,
            back_ms,
            restart_log,
        })
    }
    .await;
    // Load on after the restart for a moment, then stopped either way.
    if outcome.is_ok() {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut samples = Vec::new();
    for load in loads {
        samples.push(load.stop().await);
    }
    let mut stop = outcome?;
    stop.samples = samples;
    Ok(stop)
}

#[cfg(test)]
mod tests {
    use super::drained_after;

    #[test]
    fn it_reads_the_fronts_acknowledgement_from_the_entrypoint_log() {
        use super::fronts_acknowledged;
        let log = "graceful-entrypoint: SIGTERM: telling the fronts http://front1:19091\ngraceful-hook front: 2 of 2 fronts acknowledged in 2.6s (172.29.0.21: 1 in flight at closing)\ngraceful-entrypoint: exit 0\n";
        assert_eq!(fronts_acknowledged(log), Some((2, 2)));
        let late = "graceful-hook front: 1 of 2 fronts acknowledged by the 20s deadline; 172.29.0.22 never acknowledged";
        assert_eq!(fronts_acknowledged(late), Some((1, 2)));
        assert_eq!(
            fronts_acknowledged("graceful-hook front: no front answered: returned at once"),
            None
        );
    }

    #[test]
    fn it_reads_the_drain_time_from_the_entrypoint_log() {
        let log = "graceful-entrypoint: closing\ngraceful-entrypoint: drained after 1234 ms\n";
        assert_eq!(drained_after(log), Some(1234));
        let forced = "graceful-entrypoint: drained after 25003 ms, FORCED: a drain timeout";
        assert_eq!(drained_after(forced), Some(25003));
        assert_eq!(drained_after("graceful-entrypoint: closing\n"), None);
    }
}
