//! Runs a real Envoy for a test: renders a template from `envoy/`, starts
//! Envoy with its own log file, waits for the admin's `/ready` with a
//! deadline, and prints Envoy's log whenever the test fails (on drop while
//! panicking), so every failure comes with what Envoy said.

use std::collections::HashMap;
use std::fs;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::support::client;
use crate::support::native::{to_native, Delivery};
use crate::support::render::render;

/// How long Envoy may take to load the wasm VMs and become ready.
pub const START_DEADLINE: Duration = Duration::from_secs(60);

/// The repository root (this crate lives in `harness/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// What the Envoy under test says to `envoy --version`
/// ("envoy  version: <sha>/1.36.4/Clean/RELEASE/BoringSSL"), "" if it
/// cannot run.
pub fn envoy_version() -> String {
    Command::new(envoy_binary())
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// The Envoy under test's (major, minor), from [`envoy_version`].
pub fn envoy_minor() -> (u32, u32) {
    static MINOR: std::sync::OnceLock<(u32, u32)> = std::sync::OnceLock::new();
    *MINOR.get_or_init(|| {
        let text = envoy_version();
        text.split('/')
            .find_map(|part| {
                let mut n = part.split('.').map(|x| x.parse::<u32>().ok());
                match (n.next(), n.next(), n.next(), n.next()) {
                    (Some(Some(major)), Some(Some(minor)), Some(Some(_)), None) => {
                        Some((major, minor))
                    }
                    _ => None,
                }
            })
            .unwrap_or_else(|| panic!("no version in envoy --version: {text}"))
    })
}

/// The Envoy binary: `$GRACEFUL_ENVOY`, else the one `make envoy` links at
/// `.venv/envoy`, else `envoy` on PATH.
pub fn envoy_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("GRACEFUL_ENVOY") {
        return PathBuf::from(p);
    }
    let local = repo_root().join(".venv/envoy");
    if local.exists() {
        return local;
    }
    PathBuf::from("envoy")
}

/// The folder with the built filters: `$GRACEFUL_DIST`, else `dist/`.
/// Panics with the command to run when they are missing.
pub fn wasm_dir() -> PathBuf {
    let dir =
        std::env::var_os("GRACEFUL_DIST").map_or_else(|| repo_root().join("dist"), PathBuf::from);
    for name in [
        "graceful_provider.wasm",
        "graceful_drain.wasm",
        "graceful_consumer.wasm",
    ] {
        assert!(
            dir.join(name).exists(),
            "{} missing: run `make build` first",
            dir.join(name).display()
        );
    }
    dir
}

/// The native module, `libgraceful.so` in the dist folder (`make native`).
pub fn native_module() -> PathBuf {
    let dir =
        std::env::var_os("GRACEFUL_DIST").map_or_else(|| repo_root().join("dist"), PathBuf::from);
    let module = dir.join("libgraceful.so");
    assert!(
        module.exists(),
        "{} missing: run `make native` first",
        module.display()
    );
    module
}

/// The kernel's ephemeral port range (`net.ipv4.ip_local_port_range`):
/// where it picks a port for `bind(0)` and for the local end of every
/// outgoing connection.
fn ephemeral_ports() -> (u16, u16) {
    let text = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let mut ends = text.split_whitespace().filter_map(|p| p.parse().ok());
    match (ends.next(), ends.next()) {
        (Some(low), Some(high)) if low <= high => (low, high),
        _ => (32768, 60999),
    }
}

/// Whether `port` can be bound on the loopback now (IPv6 too where the
/// host has it: some suites listen on `[::1]`).
fn bindable(port: u16) -> bool {
    let v6_ok = match TcpListener::bind(("::1", port)) {
        Ok(_) => true,
        Err(e) => e.kind() == std::io::ErrorKind::AddrNotAvailable,
    };
    v6_ok && TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// A candidate for a port that must be known before the process that
/// binds it starts (a config that points at its own admin or listener,
/// addresses a restarted provider must keep): free on the loopback right
/// now, below the kernel's ephemeral range, never handed out before in
/// this process. Nothing guarantees it is still free when it is bound:
/// use it only where a lost bind is retried with a new candidate
/// ([`EnvoySpec::pick_port`]) or on addresses of the test's own.
///
/// Below the range: the kernel hands out ports in the range for every
/// `bind(0)` (all the harness's listeners) and for the local end of every
/// outgoing connection; below it only explicit binds meet. Each process
/// starts at its own place (by pid), so two test binaries rarely meet.
pub fn candidate_port() -> u16 {
    static NEXT: Mutex<Option<u32>> = Mutex::new(None);
    let (ephemeral_low, _) = ephemeral_ports();
    let high = u32::from(ephemeral_low.saturating_sub(1)).max(2048);
    let low = high.saturating_sub(12_000).max(1024);
    let span = high - low;
    let mut next = NEXT.lock().unwrap_or_else(|e| e.into_inner());
    let mut at = next.unwrap_or_else(|| (std::process::id().wrapping_mul(7919)) % span);
    for _ in 0..span {
        let port = u16::try_from(low + at % span).unwrap_or(u16::MAX);
        at = (at + 1) % span;
        if bindable(port) {
            *next = Some(at);
            return port;
        }
    }
    panic!("no bindable port in {low}..{high}");
}

/// A port that refuses connections on every address for the rest of this
/// process: its dead hosts' port (a tombstone's). A socket bound to it on
/// the wildcard address and never listening holds it (so a connection is
/// refused, and nothing else can bind the port on any address, the
/// socket having no `SO_REUSEADDR`).
pub fn refusing_port() -> u16 {
    static HELD: std::sync::OnceLock<Mutex<RefusingPort>> = std::sync::OnceLock::new();
    HELD.get_or_init(|| Mutex::new(RefusingPort::new()))
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .port
}

/// A socket bound on `0.0.0.0`, never listening: its port refuses
/// connections while it is held.
struct RefusingPort {
    _socket: tokio::net::TcpSocket,
    port: u16,
}

impl RefusingPort {
    fn new() -> RefusingPort {
        let socket = tokio::net::TcpSocket::new_v4().unwrap_or_else(|e| panic!("socket: {e}"));
        socket
            .bind(SocketAddr::from(([0, 0, 0, 0], 0)))
            .unwrap_or_else(|e| panic!("bind 0.0.0.0:0: {e}"));
        let port = socket
            .local_addr()
            .unwrap_or_else(|e| panic!("local address: {e}"))
            .port();
        RefusingPort {
            _socket: socket,
            port,
        }
    }
}

/// Whether a template uses `ADMIN_PORT` beyond the admin's own address (an
/// `envoy_admin` cluster pointing at it), so the port must be known before
/// Envoy starts; an unreadable one is assumed to.
fn admin_port_needed_before_start(template: Option<&str>) -> bool {
    template.is_none_or(|t| t.matches("${ADMIN_PORT").count() > 1)
}

/// How many times [`EnvoySpec::start`] starts an Envoy that lost one of
/// its picked ports before it gives up.
const PICK_ATTEMPTS: u32 = 8;

/// What Envoy (and Prometheus) log when a port they bind is taken.
pub fn lost_a_port(log: &str) -> bool {
    log.contains("Address already in use") || log.contains("address already in use")
}

/// `config` with every `port_value` of `old` made `new` (YAML's
/// `port_value: N` and JSON's `"port_value": N`): a picked port in a
/// config a test rewrote from [`EnvoySpec::rendered`].
fn swap_port(config: &str, old: u16, new: u16) -> String {
    let mut out = config.to_string();
    for key in ["port_value: ", "\"port_value\": ", "\"port_value\":"] {
        let from = format!("{key}{old}");
        let mut result = String::with_capacity(out.len());
        let mut rest = out.as_str();
        while let Some(at) = rest.find(&from) {
            let after = &rest[at + from.len()..];
            result.push_str(&rest[..at]);
            if after.starts_with(|c: char| c.is_ascii_digit()) {
                result.push_str(&from);
            } else {
                result.push_str(&format!("{key}{new}"));
            }
            rest = after;
        }
        result.push_str(rest);
        out = result;
    }
    out
}

static RUN_SEQ: AtomicU32 = AtomicU32::new(0);

/// A running Envoy. Killed on drop; its log is printed if the test failed.
pub struct Envoy {
    child: Child,
    pub name: String,
    pub dir: PathBuf,
    /// The admin's address: what Envoy bound (`--admin-address-path`)
    /// once [`EnvoySpec::start`] returned.
    pub admin: SocketAddr,
    /// The placeholder values it ran with (picked ports as finally bound).
    values: HashMap<String, String>,
    exited: Option<ExitStatus>,
}

/// What to run: a template file in `envoy/` and its placeholder values.
pub struct EnvoySpec {
    pub name: String,
    /// A file in `envoy/`, or an absolute path (a test's own variant).
    pub template: String,
    pub values: HashMap<String, String>,
    pub concurrency: u32,
    /// The filters' delivery (default: `GRACEFUL_DELIVERY`).
    pub delivery: Delivery,
    /// The native module to load (default: `dist/libgraceful.so`).
    pub module: Option<PathBuf>,
    /// The Envoy to run (default: [`envoy_binary`]).
    pub binary: Option<PathBuf>,
    /// More command-line arguments (`--drain-strategy immediate`).
    pub args: Vec<String>,
    /// More environment for the Envoy process (`LD_PRELOAD`).
    pub env: Vec<(String, String)>,
    /// How long [`EnvoySpec::start`] waits for ready (an Envoy under
    /// valgrind takes longer than [`START_DEADLINE`]).
    pub start_deadline: Duration,
    /// The config to run instead of the rendered template: a test's
    /// rewrite of [`EnvoySpec::rendered`] (the delivery already applied).
    pub config: Option<String>,
    /// The ports the harness picked ([`EnvoySpec::pick_port`]): picked
    /// again when Envoy lost one.
    pub picked: Picked,
}

/// The placeholders holding ports the harness picked, and each port
/// picked again so far (old, new): applied to the config Envoy runs
/// whatever wrote it (the template, a test's rewrite of
/// [`EnvoySpec::rendered`], a file the test rendered itself).
#[derive(Clone, Debug, Default)]
pub struct Picked {
    names: Vec<String>,
    swaps: Vec<(u16, u16)>,
}

impl EnvoySpec {
    /// A spec with `ADMIN_PORT` and `WASM_DIR` filled in. The admin binds a
    /// port of its own (0: [`EnvoySpec::start`] reads back which); where the
    /// template uses `ADMIN_PORT` beyond the admin (an `envoy_admin`
    /// cluster pointing at it), the port must be known before Envoy starts,
    /// so it is picked ([`EnvoySpec::pick_port`], retried if lost).
    ///
    /// Listeners: set their port placeholders to 0 and ask
    /// [`Envoy::listener`] where they are, or [`EnvoySpec::pick_port`] the
    /// ones the config itself points at.
    pub fn new(name: &str, template: &str) -> EnvoySpec {
        let mut spec = EnvoySpec {
            name: name.into(),
            template: template.into(),
            values: HashMap::new(),
            concurrency: 2,
            delivery: Delivery::from_env(),
            module: None,
            binary: None,
            args: Vec::new(),
            env: Vec::new(),
            start_deadline: START_DEADLINE,
            config: None,
            picked: Picked::default(),
        };
        spec.values
            .insert("WASM_DIR".into(), wasm_dir().display().to_string());
        if admin_port_needed_before_start(spec.template_text().as_deref()) {
            spec.pick_port("ADMIN_PORT")
        } else {
            spec.set("ADMIN_PORT", 0)
        }
    }

    pub fn set(mut self, name: &str, value: impl ToString) -> EnvoySpec {
        self.picked.names.retain(|p| p != name);
        self.values.insert(name.into(), value.to_string());
        self
    }

    /// Placeholder `name` is a port the config needs before Envoy starts
    /// (a cluster pointing at this Envoy's own listener or admin): a
    /// [`candidate_port`] now, and a new one each time Envoy exits
    /// because it was taken ([`EnvoySpec::start`]). [`Envoy::port`] says
    /// which one it bound.
    pub fn pick_port(mut self, name: &str) -> EnvoySpec {
        self.values
            .insert(name.into(), candidate_port().to_string());
        if !self.picked.names.iter().any(|p| p == name) {
            self.picked.names.push(name.into());
        }
        self
    }

    /// Picks every picked port again.
    fn pick_again(&mut self) {
        for name in self.picked.names.clone() {
            let old: u16 = self.value(&name).and_then(|p| p.parse().ok()).unwrap_or(0);
            let new = candidate_port();
            self.values.insert(name, new.to_string());
            self.picked.swaps.push((old, new));
        }
    }

    fn template_path(&self) -> PathBuf {
        repo_root().join("envoy").join(&self.template)
    }

    fn template_text(&self) -> Option<String> {
        fs::read_to_string(self.template_path()).ok()
    }

    /// One more command-line argument.
    pub fn arg(mut self, arg: &str) -> EnvoySpec {
        self.args.push(arg.into());
        self
    }

    /// Sets an environment variable of the Envoy process.
    pub fn env(mut self, name: &str, value: impl ToString) -> EnvoySpec {
        self.env.push((name.into(), value.to_string()));
        self
    }

    /// Runs this Envoy with the native module at `module` (whatever
    /// `GRACEFUL_DELIVERY` says).
    pub fn native(mut self, module: Option<PathBuf>) -> EnvoySpec {
        self.delivery = Delivery::Native;
        self.module = module;
        self
    }

    pub fn value(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// Starts Envoy and waits until the admin says ready. Panics (printing
    /// the log) if Envoy exits or is not ready by its `start_deadline`;
    /// an Envoy that exits because a port the harness picked was taken
    /// meanwhile ("Address already in use") is started again with new
    /// picks ([`EnvoySpec::pick_port`]).
    pub async fn start(mut self) -> Envoy {
        let mut attempt = 1;
        loop {
            let envoy = self.launch();
            match self.until_ready(envoy).await {
                Ok(envoy) => return envoy,
                Err(envoy) if attempt < PICK_ATTEMPTS => {
                    eprintln!(
                        "envoy {}: a picked port was taken ({}); starting it again with new ones",
                        envoy.name,
                        self.picked.names.join(", ")
                    );
                    drop(envoy);
                    self.pick_again();
                    attempt += 1;
                }
                Err(envoy) => panic!(
                    "envoy {} lost a picked port {attempt} times; log:\n{}",
                    envoy.name,
                    envoy.log()
                ),
            }
        }
    }

    /// Waits for `envoy` to be ready; Err if it exited because a picked
    /// port was taken.
    async fn until_ready(&self, mut envoy: Envoy) -> Result<Envoy, Envoy> {
        let within = self.start_deadline;
        let deadline = Instant::now() + within;
        let admin_file = envoy.dir.join("admin.address");
        loop {
            if let Some(status) = envoy.try_exit() {
                let log = envoy.log();
                if !self.picked.names.is_empty() && lost_a_port(&log) {
                    return Err(envoy);
                }
                panic!(
                    "envoy {} exited during start-up ({status}); log:\n{log}",
                    envoy.name
                );
            }
            // The admin's address as Envoy bound it, written once bound:
            // until then, whatever answers at a picked port is not this
            // Envoy (and may never answer).
            if let Some(addr) = fs::read_to_string(&admin_file)
                .ok()
                .and_then(|a| a.trim().parse::<SocketAddr>().ok())
            {
                envoy.admin = loopback(addr);
                if let Ok(r) = client::get(envoy.admin, "/ready").await {
                    // Ready, and this Envoy (the file is its own).
                    if r.status == 200 && envoy.answers_admin().await {
                        return Ok(envoy);
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "envoy {} not ready within {within:?}",
                envoy.name
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The template rendered with its values, for the spec's delivery.
    pub fn rendered(&self) -> String {
        let template_path = self.template_path();
        let template = fs::read_to_string(&template_path)
            .unwrap_or_else(|e| panic!("{}: {e}", template_path.display()));
        let config =
            render(&template, &self.values).unwrap_or_else(|e| panic!("{}: {e}", self.template));
        match self.delivery {
            Delivery::Wasm => config,
            Delivery::Native => {
                let module = self.module.clone().unwrap_or_else(native_module);
                to_native(&config, &module)
                    .unwrap_or_else(|e| panic!("{}: {e}", self.template))
                    .0
            }
        }
    }

    /// Runs `config` (see [`EnvoySpec::config`]).
    pub fn with_config(mut self, config: String) -> EnvoySpec {
        self.config = Some(config);
        self
    }

    /// Starts Envoy without waiting (for configs that must fail).
    pub fn spawn(self) -> Envoy {
        self.launch()
    }

    fn launch(&self) -> Envoy {
        let mut config = match &self.config {
            Some(config) => config.clone(),
            None => self.rendered(),
        };
        // A picked port written into the config before it was picked again.
        for (old, new) in &self.picked.swaps {
            config = swap_port(&config, *old, *new);
        }
        let seq = RUN_SEQ.fetch_add(1, Ordering::SeqCst);
        let dir = repo_root().join("target/e2e").join(format!(
            "{}-{}-{seq}",
            self.name,
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let config_path = dir.join("envoy.yaml");
        let log_path = dir.join("envoy.log");
        fs::write(&config_path, config)
            .unwrap_or_else(|e| panic!("{}: {e}", config_path.display()));
        let log =
            fs::File::create(&log_path).unwrap_or_else(|e| panic!("{}: {e}", log_path.display()));
        let log_err = log.try_clone().unwrap_or_else(|e| panic!("{e}"));
        let admin_port: u16 = self
            .value("ADMIN_PORT")
            .and_then(|p| p.parse().ok())
            .unwrap_or(9901);
        let binary = self.binary.clone().unwrap_or_else(envoy_binary);
        let child = Command::new(&binary)
            .arg("-c")
            .arg(&config_path)
            .arg("--admin-address-path")
            .arg(dir.join("admin.address"))
            .args(["--concurrency", &self.concurrency.to_string()])
            .args([
                "--disable-hot-restart",
                "--log-format",
                "[%Y-%m-%d %T.%e][%t][%l][%n] %v",
            ])
            .args(["--component-log-level", "wasm:debug,dynamic_modules:debug"])
            .args(["--file-flush-interval-msec", "100"])
            .args(&self.args)
            .env("TZ", "UTC")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run {} ({e}): run `make envoy` first",
                    binary.display()
                )
            });
        Envoy {
            child,
            name: self.name.clone(),
            dir,
            admin: SocketAddr::from(([127, 0, 0, 1], admin_port)),
            values: self.values.clone(),
            exited: None,
        }
    }
}

/// `addr`, a wildcard made the loopback (where a client reaches it).
fn loopback(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::from(([127, 0, 0, 1], addr.port()))
        }
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(std::net::Ipv6Addr::LOCALHOST.into(), addr.port())
        }
        _ => addr,
    }
}

impl Envoy {
    /// The port placeholder `name` as Envoy ran with it (a picked port as
    /// finally bound). Panics if it is not a port.
    pub fn port(&self, name: &str) -> u16 {
        self.values
            .get(name)
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("envoy {}: no port {name}", self.name))
    }

    /// Where listener `name` listens (the port it bound when configured
    /// with 0), as the admin's `/listeners` says; waits up to 30 s for it
    /// (a listener pushed over LDS after start).
    pub async fn listener(&self, name: &str) -> SocketAddr {
        eventually(
            &format!("envoy {}: listener {name} bound", self.name),
            Duration::from_secs(30),
            || self.listener_now(name),
        )
        .await
    }

    /// Where this Envoy's one listener listens (a config with a single
    /// listener, whatever its name); waits up to 30 s for it.
    pub async fn only_listener(&self) -> SocketAddr {
        eventually(
            &format!("envoy {}: its one listener bound", self.name),
            Duration::from_secs(30),
            || async {
                let r = client::get(self.admin, "/listeners?format=json")
                    .await
                    .ok()?;
                let listeners: serde_json::Value = serde_json::from_slice(&r.body).ok()?;
                match listeners["listener_statuses"].as_array()?.as_slice() {
                    [one] => listener_address(&listeners, one["name"].as_str()?),
                    _ => None,
                }
            },
        )
        .await
    }

    /// Where listener `name` listens now, None if it is not (yet) there.
    pub async fn listener_now(&self, name: &str) -> Option<SocketAddr> {
        let r = client::get(self.admin, "/listeners?format=json")
            .await
            .ok()?;
        listener_address(&serde_json::from_slice(&r.body).ok()?, name)
    }

    /// Whether the admin port answers with this Envoy's config file.
    async fn answers_admin(&self) -> bool {
        let config = self.dir.join("envoy.yaml").display().to_string();
        client::get(self.admin, "/server_info")
            .await
            .is_ok_and(|r| r.status == 200 && r.text().contains(&config))
    }

    /// Everything Envoy has logged so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("envoy.log")).unwrap_or_default()
    }

    fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().ok().flatten();
        }
        self.exited
    }

    /// Waits up to `timeout` for Envoy to exit on its own.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.try_exit() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    /// A stat's value from `/stats` (custom wasm metrics are listed there
    /// under `wasmcustom.`), None if absent.
    pub async fn stat(&self, name: &str) -> Option<u64> {
        let r = client::get(self.admin, &format!("/stats?filter=^{name}$"))
            .await
            .ok()?;
        r.text().lines().find_map(|line| {
            let (k, v) = line.split_once(": ")?;
            (k == name).then(|| v.trim().parse().ok()).flatten()
        })
    }

    /// A stat that must exist: panics naming it when `/stats` does not list
    /// it (renamed, dropped by a stats matcher, its filter or listener not
    /// loaded, the admin not answering), so a missing stat fails the test
    /// instead of reading as 0 and passing an assertion of 0.
    pub async fn present_stat(&self, name: &str) -> u64 {
        self.stat(name)
            .await
            .unwrap_or_else(|| panic!("Envoy has no stat {name} (or its admin did not answer)"))
    }

    /// A filter's metric (`wasmcustom.<name>`): 0 until first written (each
    /// filter defines its metrics when it loads), and a panic naming it when
    /// Envoy has no such stat ([`Envoy::present_stat`]).
    pub async fn custom_stat(&self, name: &str) -> u64 {
        self.present_stat(&format!("wasmcustom.{name}")).await
    }

    /// A filter's metric in every stats scope it appears in: the root
    /// (`wasmcustom.<name>`) and each cluster's (`cluster.<c>.wasmcustom.<name>`,
    /// where Envoy 1.36 puts the metrics of a cluster's upstream wasm
    /// filters; 1.40 puts them at the root). Empty before it is written.
    pub async fn custom_stat_scopes(&self, name: &str) -> Vec<u64> {
        let suffix = format!("wasmcustom.{name}");
        let Ok(r) = client::get(self.admin, &format!("/stats?filter=wasmcustom.{name}$")).await
        else {
            return Vec::new();
        };
        r.text()
            .lines()
            .filter_map(|line| {
                let (k, v) = line.split_once(": ")?;
                let scope = k.strip_suffix(&suffix)?;
                let ours = scope.is_empty()
                    || scope
                        .strip_prefix("cluster.")
                        .and_then(|c| c.strip_suffix('.'))
                        .is_some_and(|c| !c.is_empty() && !c.contains('.'));
                ours.then(|| v.trim().parse().ok()).flatten()
            })
            .collect()
    }

    /// Sends SIGTERM (what an orchestrator does after the preStop hook) and
    /// waits up to `grace` for Envoy to exit, then kills it.
    pub async fn terminate(&mut self, grace: Duration) -> Option<ExitStatus> {
        terminate(&mut self.child, grace).await;
        self.try_exit()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub async fn admin_post(&self, path: &str) -> client::Response {
        client::post(self.admin, path)
            .await
            .unwrap_or_else(|e| panic!("admin POST {path}: {e}"))
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "===== envoy {} log ({}) =====\n{}\n===== end of envoy {} log =====",
                self.name,
                self.dir.display(),
                self.log(),
                self.name
            );
        }
    }
}

/// The stats prefix of a listener configured at port 0 on `ip`
/// (`listener.127.0.0.1_0`): Envoy names a listener's stats after the
/// address in its config, not the port it bound.
pub fn listener_stats(ip: std::net::IpAddr) -> String {
    format!("listener.{}", SocketAddr::new(ip, 0)).replace(':', "_")
}

/// Listener `name`'s address in the admin's `/listeners?format=json`
/// (`listener_statuses[].local_address`), a wildcard made the loopback;
/// None while it has no port.
fn listener_address(listeners: &serde_json::Value, name: &str) -> Option<SocketAddr> {
    let status = listeners["listener_statuses"]
        .as_array()?
        .iter()
        .find(|l| l["name"] == name)?;
    let socket = &status["local_address"]["socket_address"];
    let ip: std::net::IpAddr = socket["address"].as_str()?.parse().ok()?;
    let port = u16::try_from(socket["port_value"].as_u64()?).ok()?;
    (port != 0).then(|| loopback(SocketAddr::new(ip, port)))
}

/// Polls `check` every 25 ms until it returns Some, or panics after
/// `deadline` with `what`.
pub async fn eventually<T, F, Fut>(what: &str, deadline: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    wait_for(what, deadline, check)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Polls `check` every 25 ms until it gives a value, or says why not once
/// `deadline` passed (for tools, which report instead of panicking).
pub async fn wait_for<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = Instant::now() + deadline;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if Instant::now() >= end {
            return Err(format!("timed out after {deadline:?} waiting for: {what}"));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Writes a file-based EDS answer for `cluster` listing `endpoints`,
/// atomically (write, then rename), as Envoy's file watcher expects.
pub fn write_eds(path: &Path, cluster: &str, endpoints: &[SocketAddr]) {
    write_eds_localities(path, cluster, &[(0, "", endpoints)]);
}

/// [`write_eds`] with localities: `(priority, zone, endpoints)` each, the
/// way a control plane doing locality failover assigns them (an empty zone
/// writes no locality).
pub fn write_eds_localities(path: &Path, cluster: &str, localities: &[(u32, &str, &[SocketAddr])]) {
    write_eds_document(path, cluster, &in_localities(localities));
}

/// [`write_eds`] with each endpoint's EDS `health_status` (`HEALTHY`,
/// `DRAINING`, ...; empty: none, Envoy's `UNKNOWN`), as a control plane
/// sends a terminating endpoint.
pub fn write_eds_health(path: &Path, cluster: &str, endpoints: &[(SocketAddr, &str)]) {
    write_eds_document(path, cluster, &[(0, "", endpoints.to_vec())]);
}

/// `(priority, zone, [(endpoint, EDS health status or "")])`.
pub type Locality<'a> = (u32, &'a str, Vec<(SocketAddr, &'a str)>);

/// `(priority, zone, endpoints)` as [`Locality`]s, no health status given.
pub fn in_localities<'a>(localities: &[(u32, &'a str, &[SocketAddr])]) -> Vec<Locality<'a>> {
    localities
        .iter()
        .map(|(p, z, es)| (*p, *z, es.iter().map(|e| (*e, "")).collect()))
        .collect()
}

/// A cluster's endpoints as a control plane assigns them (a
/// `ClusterLoadAssignment`, with its `@type`): each locality at its
/// priority, in zone `zone` of region `r1` (an empty zone: no locality).
pub fn load_assignment(cluster: &str, localities: &[Locality]) -> serde_json::Value {
    use serde_json::json;
    let endpoints: Vec<serde_json::Value> = localities
        .iter()
        .map(|(priority, zone, endpoints)| {
            let lb_endpoints: Vec<serde_json::Value> = endpoints
                .iter()
                .map(|(e, status)| {
                    let mut lb = json!({"endpoint": {"address": {"socket_address": {
                        "address": e.ip().to_string(), "port_value": e.port()}}}});
                    if !status.is_empty() {
                        lb["health_status"] = json!(status);
                    }
                    lb
                })
                .collect();
            let mut locality = json!({"priority": priority, "lb_endpoints": lb_endpoints});
            if !zone.is_empty() {
                locality["locality"] = json!({"region": "r1", "zone": zone});
            }
            locality
        })
        .collect();
    json!({
        "@type": crate::support::xds::ENDPOINTS,
        "cluster_name": cluster,
        "endpoints": endpoints,
    })
}

fn write_eds_document(path: &Path, cluster: &str, localities: &[Locality]) {
    let version = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    // JSON, which Envoy's YAML parser reads whatever the file's extension.
    let doc = serde_json::json!({
        "version_info": version.to_string(),
        "resources": [load_assignment(cluster, localities)],
    });
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, doc.to_string()).unwrap_or_else(|e| panic!("{}: {e}", tmp.display()));
    fs::rename(&tmp, path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// A scratch file path for a test (under `target/e2e/`), unique per run,
/// ending in `.{ext}` (Envoy picks the parser by extension).
pub fn scratch_path(name: &str, ext: &str) -> PathBuf {
    let dir = repo_root().join("target/e2e");
    let _ = fs::create_dir_all(&dir);
    let seq = RUN_SEQ.fetch_add(1, Ordering::SeqCst);
    dir.join(format!("{name}-{}-{seq}.{ext}", std::process::id()))
}

/// SIGTERM, then SIGKILL if the process has not exited after `grace`.
pub async fn terminate(child: &mut Child, grace: Duration) {
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if child.try_wait().ok().flatten().is_some() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidate_ports_are_distinct_bindable_and_below_the_ephemeral_range() {
        let (ephemeral_low, _) = ephemeral_ports();
        let ports: Vec<u16> = (0..50).map(|_| candidate_port()).collect();
        let distinct: std::collections::HashSet<_> = ports.iter().collect();
        assert_eq!(
            distinct.len(),
            ports.len(),
            "a port handed out twice: {ports:?}"
        );
        for p in &ports {
            assert!(*p < ephemeral_low, "{p} is in the ephemeral range");
            assert!(
                TcpListener::bind(("127.0.0.1", *p)).is_ok(),
                "{p} not bindable"
            );
        }
    }

    #[test]
    fn a_refusing_port_refuses_connections_and_binds_while_held() {
        let held = RefusingPort::new();
        for port in [held.port, refusing_port()] {
            for ip in [[127, 0, 0, 1], [127, 1, 0, 1]] {
                let refused = std::net::TcpStream::connect(SocketAddr::from((ip, port)))
                    .expect_err("a connection to a refusing port");
                assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
                assert!(
                    TcpListener::bind(SocketAddr::from((ip, port))).is_err(),
                    "{port} bindable"
                );
            }
        }
        assert_eq!(refusing_port(), refusing_port(), "one for the process");
        let port = held.port;
        drop(held);
        assert!(TcpListener::bind(("127.0.0.1", port)).is_ok());
    }

    #[test]
    fn a_picked_port_is_swapped_in_a_given_config_and_nowhere_else() {
        let yaml = "admin: {port_value: 20001}\nother: {port_value: 200011}\ncluster: {port_value: 20001}\n";
        assert_eq!(
            swap_port(yaml, 20001, 20002),
            "admin: {port_value: 20002}\nother: {port_value: 200011}\ncluster: {port_value: 20002}\n"
        );
        let json = r#"{"port_value": 20001, "b": {"port_value":20001}, "c": 20001}"#;
        assert_eq!(
            swap_port(json, 20001, 7),
            r#"{"port_value": 7, "b": {"port_value":7}, "c": 20001}"#
        );
    }

    #[test]
    fn a_listener_is_found_by_name_at_the_port_it_bound() {
        let listeners = serde_json::json!({"listener_statuses": [
            {"name": "inbound", "local_address": {"socket_address": {"address": "0.0.0.0", "port_value": 41234}}},
            {"name": "outbound", "local_address": {"socket_address": {"address": "::1", "port_value": 41235}}},
            {"name": "unbound", "local_address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        ]});
        assert_eq!(
            listener_address(&listeners, "inbound"),
            Some(SocketAddr::from(([127, 0, 0, 1], 41234)))
        );
        assert_eq!(
            listener_address(&listeners, "outbound"),
            Some("[::1]:41235".parse().unwrap())
        );
        assert_eq!(listener_address(&listeners, "unbound"), None);
        assert_eq!(listener_address(&listeners, "missing"), None);
    }

    #[test]
    fn the_admin_port_is_picked_only_where_the_config_points_at_it() {
        let template = |name: &str| fs::read_to_string(repo_root().join("envoy").join(name)).ok();
        for (name, picked) in [
            ("provider-sidecar.yaml", true),
            ("consumer-sidecar.yaml", true),
            ("bench-proxy.yaml", true),
            ("baseline-provider-sidecar.yaml", false),
            ("l4-balancer.yaml", false),
            ("bench-upstream.yaml", false),
        ] {
            assert_eq!(
                admin_port_needed_before_start(template(name).as_deref()),
                picked,
                "{name}"
            );
        }
        assert!(
            admin_port_needed_before_start(None),
            "an unreadable template"
        );
    }
}
