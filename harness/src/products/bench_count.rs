//! `make bench-count`: what a request costs Envoy in instructions, counted
//! by valgrind's callgrind, so the figure does not move with this host's
//! noise (the same binary, config and load give the same count within a
//! few per cent, whatever else the machine does).
//!
//! Each set of `make bench` runs in the same proxy config under callgrind
//! (`--separate-threads=yes`), in front of the same upstream. After the
//! set's preparation (tombstones made) and a warm-up, two windows are
//! counted on the worker thread and the main thread:
//!
//! | window | load | read as |
//! |---|---|---|
//! | idle | none | the time-driven work per second (ticks, timers) |
//! | loaded | wrk, 16 connections | the worker's instructions per request |
//!
//! What callgrind cannot see: the kernel's share (system time), and the
//! speed of an instruction. Under callgrind Envoy runs some 50 times
//! slower, so work paced by the clock (a wasm copy's 100 ms tick, a
//! tombstone confirmed again by a probe, a host seen again) falls on 50
//! times fewer requests than at full speed: the per-request figure is an
//! upper bound, and the idle rate says how much of it such work can be.
//! (The idle rate is not subtracted: V8's own background work lands in
//! one window or the other, and moved it by 7,000 per request between two
//! runs of the same set.)

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::Serialize;

use super::bench::{dead_hosts, prepare_proxy, proxy_spec, wrk, FilterSet};
use super::bench_mesh::start_mesh_proxy;
use crate::support::envoy::{envoy_binary, refusing_port, Envoy};

/// How long an Envoy under callgrind may take to be ready (V8 compiles
/// the modules at a fiftieth of its speed).
pub const START_UNDER_CALLGRIND: Duration = Duration::from_secs(300);

/// One set's counts.
#[derive(Debug, Clone, Serialize)]
pub struct Counted {
    pub set: String,
    /// Requests answered in the loaded window (all 2xx, or the run fails).
    pub requests: u64,
    pub window_s: u64,
    /// Worker thread: instructions per request in the loaded window, and
    /// per second with no load.
    pub worker_per_request: u64,
    pub worker_idle_per_s: u64,
    /// Main thread (admin, root contexts, timers): instructions per second,
    /// idle and loaded.
    pub main_idle_per_s: u64,
    pub main_loaded_per_s: u64,
}

/// The committed counts `make bench` quotes beside its µs: per set, the
/// worker's instructions per request in `count_json` (what `make
/// bench-count` wrote). Err if the file cannot be read or names no set.
pub fn committed_counts(
    count_json: &Path,
) -> Result<std::collections::BTreeMap<String, u64>, String> {
    let text =
        fs::read_to_string(count_json).map_err(|e| format!("{}: {e}", count_json.display()))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", count_json.display()))?;
    let counts: std::collections::BTreeMap<String, u64> = json["sets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|set| {
            Some((
                set["set"].as_str()?.to_string(),
                set["worker_per_request"].as_u64()?,
            ))
        })
        .collect();
    if counts.is_empty() {
        return Err(format!("{}: no counted set", count_json.display()));
    }
    Ok(counts)
}

/// A script that runs the Envoy under callgrind, writing its counts under
/// `out` (valgrind replaces the shell: the pid is callgrind's).
pub fn callgrind_wrapper(dir: &Path, out: &Path) -> Result<PathBuf, String> {
    let script = dir.join(format!(
        "envoy-under-callgrind-{}.sh",
        out.file_name().and_then(|n| n.to_str()).unwrap_or("out")
    ));
    let text = format!(
        "#!/bin/sh\nexec valgrind --tool=callgrind --smc-check=all-non-file --separate-threads=yes --callgrind-out-file={} {} \"$@\"\n",
        out.display(),
        envoy_binary().display()
    );
    fs::write(&script, text).map_err(|e| format!("{}: {e}", script.display()))?;
    let status = Command::new("chmod")
        .arg("+x")
        .arg(&script)
        .status()
        .map_err(|e| format!("chmod: {e}"))?;
    if !status.success() {
        return Err(format!("chmod +x {} failed", script.display()));
    }
    Ok(script)
}

/// Asks callgrind in process `pid` to zero its counters or to dump them.
fn control(pid: u32, what: &[&str]) -> Result<(), String> {
    let out = Command::new("callgrind_control")
        .args(what)
        .arg(pid.to_string())
        .output()
        .map_err(|e| format!("callgrind_control: {e} (valgrind installs it)"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "callgrind_control {what:?} {pid}: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The instructions of each thread in dump number `dump` of `out`:
/// (thread number, total), read from each file's `summary:` line.
pub fn read_dump(out: &Path, dump: u32) -> Result<Vec<(u32, u64)>, String> {
    let dir = out.parent().ok_or("no directory")?;
    let stem = out
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or("no file name")?;
    let prefix = format!("{stem}.{dump}-");
    let mut threads = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(thread) = name.strip_prefix(&prefix) else {
            continue;
        };
        let thread: u32 = thread
            .parse()
            .map_err(|_| format!("{name}: not a thread's dump"))?;
        let text = fs::read_to_string(entry.path()).map_err(|e| format!("{name}: {e}"))?;
        threads.push((
            thread,
            summary(&text).ok_or(format!("{name}: no summary line"))?,
        ));
    }
    if threads.is_empty() {
        return Err(format!("no dump {dump} of {}", out.display()));
    }
    threads.sort_unstable();
    Ok(threads)
}

/// The `summary:` (or, failing it, `totals:`) count of a callgrind file.
pub fn summary(text: &str) -> Option<u64> {
    let line = text
        .lines()
        .find(|l| l.starts_with("summary:"))
        .or_else(|| text.lines().find(|l| l.starts_with("totals:")))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The main thread (callgrind's thread 1) and the busiest other thread
/// of a loaded dump: with `--concurrency 1`, Envoy's one worker.
pub fn main_and_worker(loaded: &[(u32, u64)]) -> Result<(u32, u32), String> {
    let worker = loaded
        .iter()
        .filter(|(t, _)| *t != 1)
        .max_by_key(|(_, n)| *n)
        .map(|(t, _)| *t)
        .ok_or("no thread but the main one")?;
    Ok((1, worker))
}

fn of(threads: &[(u32, u64)], thread: u32) -> u64 {
    threads
        .iter()
        .find(|(t, _)| *t == thread)
        .map_or(0, |(_, n)| *n)
}

/// Where `name`'s callgrind counts go in `dir`, cleared of an earlier
/// run's files (callgrind numbers its dumps, and `read_dump` reads them by
/// number).
fn fresh_out(dir: &Path, name: &str) -> Result<PathBuf, String> {
    let out = dir.join(format!("{name}.out"));
    for entry in fs::read_dir(dir).map_err(|e| e.to_string())?.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        if file.starts_with(&format!("{name}.out")) {
            let _ = fs::remove_file(entry.path());
        }
    }
    Ok(out)
}

/// Counts one set: starts its proxy under callgrind in front of
/// `upstream`, prepares and warms it, counts an idle and a loaded window.
pub async fn count_set(
    set: &FilterSet,
    upstream: &[SocketAddr],
    dir: &Path,
    window: Duration,
) -> Result<Counted, String> {
    let extra = if set.tombstones > 0 {
        dead_hosts(set.tombstones, refusing_port())
    } else {
        Vec::new()
    };
    let out = fresh_out(dir, set.name)?;
    let mut spec = proxy_spec(set, upstream, &extra);
    spec.binary = Some(callgrind_wrapper(dir, &out)?);
    spec.start_deadline = START_UNDER_CALLGRIND;
    let envoy = spec.start().await;
    let (envoy, addr) = prepare_proxy(envoy, set).await;
    count_started(set, &envoy, addr, &out, window).await
}

/// Counts one set in the mesh of `make bench-mesh` (1,000 clusters of 10
/// endpoints from `cds`, see `bench_mesh::start_mesh_proxy`): what a
/// request costs where the consumer's membership and Envoy's cluster
/// manager are a large mesh's.
pub async fn count_mesh_set(
    set: &FilterSet,
    cds: &Path,
    upstream: &[SocketAddr],
    dir: &Path,
    window: Duration,
) -> Result<Counted, String> {
    let out = fresh_out(dir, &format!("mesh-{}", set.name))?;
    let wrapper = callgrind_wrapper(dir, &out)?;
    let (envoy, addr) =
        start_mesh_proxy(&wrapper, set, cds, upstream, START_UNDER_CALLGRIND).await?;
    count_started(set, &envoy, addr, &out, window).await
}

/// Warms a started proxy under callgrind and counts its idle and loaded
/// windows into `out`'s dumps 1 and 2.
async fn count_started(
    set: &FilterSet,
    envoy: &Envoy,
    addr: SocketAddr,
    out: &Path,
    window: Duration,
) -> Result<Counted, String> {
    warm(envoy, addr)?;
    let pid = envoy.pid();
    control(pid, &["-z"])?;
    tokio::time::sleep(window).await;
    control(pid, &["-d", "idle"])?;
    control(pid, &["-z"])?;
    let load = wrk(addr, 16, window)?;
    control(pid, &["-d", "loaded"])?;
    if load.non_2xx > 0 || load.requests == 0 {
        return Err(format!(
            "{}: {} requests, {} not 2xx",
            set.name, load.requests, load.non_2xx
        ));
    }
    let idle = read_dump(out, 1)?;
    let loaded = read_dump(out, 2)?;
    let (main, worker) = main_and_worker(&loaded)?;
    let secs = window.as_secs().max(1);
    Ok(Counted {
        set: set.name.to_string(),
        requests: load.requests,
        window_s: secs,
        worker_per_request: of(&loaded, worker) / load.requests,
        worker_idle_per_s: of(&idle, worker) / secs,
        main_idle_per_s: of(&idle, main) / secs,
        main_loaded_per_s: of(&loaded, main) / secs,
    })
}

/// Runs load until the worker has compiled and entered every path a
/// steered request takes: four runs of 5 s of wrk that each got answers.
/// A run with none (the worker waits its turn behind a main thread busy
/// under callgrind, as with 1.36's first whole-mesh `/clusters` answer)
/// is run again, within [`START_UNDER_CALLGRIND`]; a non-2xx answer fails.
fn warm(envoy: &Envoy, addr: SocketAddr) -> Result<(), String> {
    let until = std::time::Instant::now() + START_UNDER_CALLGRIND;
    let mut answered = 0;
    // Why the last run got no answer: said if the deadline passes (wrk
    // missing, or refused connections, reads differently from a slow start).
    let mut last = String::from("no requests answered");
    while answered < 4 {
        match wrk(addr, 4, Duration::from_secs(5)) {
            Ok(r) if r.non_2xx > 0 => {
                return Err(format!(
                    "{}: {} of {} warm-up requests not 2xx",
                    envoy.name, r.non_2xx, r.requests
                ))
            }
            Ok(r) if r.requests > 0 => answered += 1,
            Ok(_) => last = String::from("no requests answered"),
            Err(e) => last = e,
        }
        if answered < 4 && std::time::Instant::now() >= until {
            return Err(format!(
                "{}: no answer to warm-up load within {:?} (last run: {last})",
                envoy.name, START_UNDER_CALLGRIND
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_counts_read_every_set_and_a_file_without_one_is_refused() {
        let root = crate::support::envoy::repo_root();
        let counts = committed_counts(&root.join("bench/results/count.json")).unwrap();
        for set in [
            "none",
            "wasm_header",
            "native_floor",
            "provider_drain",
            "consumer",
        ] {
            assert!(
                counts.get(set).is_some_and(|n| *n > 10_000),
                "{set}: {counts:?}"
            );
        }
        let dir = std::env::temp_dir().join(format!("committed-counts-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("count.json");
        fs::write(&empty, r#"{"sets": []}"#).unwrap();
        assert!(committed_counts(&empty)
            .unwrap_err()
            .contains("no counted set"));
        assert!(committed_counts(&dir.join("absent.json")).is_err());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn reads_the_summary_and_refuses_a_file_without_one() {
        let text = "version: 1\ncreator: callgrind-3.19.0\nthread: 7\nsummary: 650118841\ntotals: 650118842\n";
        assert_eq!(summary(text), Some(650_118_841));
        assert_eq!(summary("totals: 12\n"), Some(12));
        assert_eq!(summary("events: Ir\n"), None);
    }

    #[test]
    fn the_worker_is_the_busiest_thread_but_the_main_one() {
        let loaded = [(1, 900), (2, 10), (5, 0), (7, 800), (8, 0)];
        assert_eq!(main_and_worker(&loaded), Ok((1, 7)));
        assert!(main_and_worker(&[(1, 5)]).is_err());
    }

    #[test]
    fn reads_each_threads_file_of_one_dump() {
        let dir = std::env::temp_dir().join(format!("bench-count-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let out = dir.join("consumer.out");
        for (name, n) in [
            ("consumer.out.1-01", 5),
            ("consumer.out.1-07", 9),
            ("consumer.out.2-07", 4),
            ("consumer.out-01", 1),
        ] {
            fs::write(dir.join(name), format!("summary: {n}\n")).unwrap();
        }
        assert_eq!(read_dump(&out, 1), Ok(vec![(1, 5), (7, 9)]));
        assert_eq!(read_dump(&out, 2), Ok(vec![(7, 4)]));
        assert!(read_dump(&out, 3).is_err(), "no such dump");
        fs::write(dir.join("consumer.out.4-02"), "events: Ir\n").unwrap();
        assert!(read_dump(&out, 4).is_err(), "a file without a count");
        let _ = fs::remove_dir_all(&dir);
    }
}
