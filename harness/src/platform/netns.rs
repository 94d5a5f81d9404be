//! Pods on one machine: a network namespace per pod, each with its own
//! address on a bridge that lives in a "node" namespace of its own, and
//! Istio's traffic capture written as iptables rules inside the pod.
//!
//! This is the stand-in the Istio-shaped suite runs on: the kernel's own
//! `REDIRECT` and `SO_ORIGINAL_DST` are what carry a pod's traffic into its
//! sidecar, as `istio-iptables` sets them up, so Envoy's `original_dst`
//! listeners, the blackhole chain for direct connections to 15006 and the
//! uid-1337 exemption behave as in a pod. Nothing here touches the root
//! namespace but the names of the namespaces; addresses are in
//! [`SUBNET`], reachable only from inside them. Needs root (`ip netns`,
//! iptables); [`available`] says whether this machine can.

use std::net::Ipv4Addr;
use std::os::fd::AsFd;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// The pods' subnet (a /24 on the node's bridge, `.1` being the node).
pub const SUBNET: [u8; 3] = [10, 66, 0];
/// The uid Istio runs Envoy as; its own connections are not captured.
pub const PROXY_UID: u32 = 1337;

static SEQ: AtomicU32 = AtomicU32::new(0);

fn run(what: &str, cmd: &mut Command) -> Output {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn ip(args: &[&str]) -> Output {
    run(
        &format!("ip {}", args.join(" ")),
        Command::new("ip").args(args),
    )
}

/// Whether network namespaces with iptables can be made here (root, the
/// `ip` and `iptables` tools): the reason when not. Probed once per
/// process (tests running side by side ask at once).
pub fn available() -> Result<(), String> {
    static PROBED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    PROBED.get_or_init(probe).clone()
}

fn probe() -> Result<(), String> {
    let probe = format!("gwprobe{}", std::process::id());
    let made = Command::new("ip")
        .args(["netns", "add", &probe])
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("no `ip` tool: {e}"))?;
    if !made.success() {
        return Err("`ip netns add` failed (needs root)".into());
    }
    let iptables = Command::new("ip")
        .args(["netns", "exec", &probe, "iptables", "-t", "nat", "-L"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let _ = Command::new("ip").args(["netns", "del", &probe]).status();
    match iptables {
        Ok(s) if s.success() => Ok(()),
        _ => Err("iptables (nat table) does not work in a network namespace".into()),
    }
}

/// The node: a namespace holding the bridge every pod hangs on.
pub struct Node {
    pub netns: String,
    tag: String,
    pods: u32,
}

impl Node {
    pub fn new() -> Node {
        let tag = format!(
            "{}{}",
            std::process::id() % 100_000,
            SEQ.fetch_add(1, Ordering::SeqCst)
        );
        let netns = format!("gw{tag}node");
        ip(&["netns", "add", &netns]);
        let node = Node {
            netns,
            tag,
            pods: 0,
        };
        node.exec(&["ip", "link", "set", "lo", "up"]);
        node.exec(&["ip", "link", "add", "br0", "type", "bridge"]);
        let gateway = format!("{}.{}.{}.1/24", SUBNET[0], SUBNET[1], SUBNET[2]);
        node.exec(&["ip", "addr", "add", &gateway, "dev", "br0"]);
        node.exec(&["ip", "link", "set", "br0", "up"]);
        node
    }

    fn exec(&self, args: &[&str]) -> Output {
        let mut full = vec!["netns", "exec", &self.netns];
        full.extend_from_slice(args);
        ip(&full)
    }

    /// A pod named `name` at `SUBNET.host`, its loopback up and a default
    /// route through the node.
    pub fn pod(&mut self, name: &str, host: u8) -> Pod {
        self.pods += 1;
        let netns = format!("gw{}{name}", self.tag);
        ip(&["netns", "add", &netns]);
        // Interface names are at most 15 bytes.
        let outside = format!("v{}n{}", self.tag, self.pods);
        let inside = format!("v{}p{}", self.tag, self.pods);
        ip(&[
            "link", "add", &outside, "type", "veth", "peer", "name", &inside,
        ]);
        ip(&["link", "set", &outside, "netns", &self.netns]);
        ip(&["link", "set", &inside, "netns", &netns]);
        self.exec(&["ip", "link", "set", &outside, "master", "br0"]);
        self.exec(&["ip", "link", "set", &outside, "up"]);
        let address = Ipv4Addr::new(SUBNET[0], SUBNET[1], SUBNET[2], host);
        let pod = Pod {
            name: name.into(),
            netns,
            ip: address,
        };
        pod.exec(&["ip", "link", "set", "lo", "up"]);
        pod.exec(&["ip", "link", "set", &inside, "name", "eth0"]);
        pod.exec(&["ip", "addr", "add", &format!("{address}/24"), "dev", "eth0"]);
        pod.exec(&["ip", "link", "set", "eth0", "up"]);
        let gateway = format!("{}.{}.{}.1", SUBNET[0], SUBNET[1], SUBNET[2]);
        pod.exec(&["ip", "route", "add", "default", "via", &gateway]);
        pod
    }

    /// The node's address on the bridge (`SUBNET.1`, every pod's default
    /// route): where a control plane running on the node serves its pods.
    pub fn ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(SUBNET[0], SUBNET[1], SUBNET[2], 1)
    }

    /// Gives the bridge IPv6 address `cidr` too (usable at once: no
    /// duplicate address detection), for IPv6-only pods in its prefix.
    pub fn add_ipv6(&self, cidr: &str) {
        self.exec(&["ip", "-6", "addr", "add", cidr, "dev", "br0", "nodad"]);
    }

    /// Moves the calling thread into the node's namespace: sockets it opens
    /// from then on reach every pod's address (the view of a scraper or a
    /// kubelet on the node).
    pub fn enter(&self) {
        enter(&self.netns);
    }
}

impl Default for Node {
    fn default() -> Self {
        Node::new()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .status();
    }
}

/// Moves the calling thread into namespace `netns` (`setns`): sockets it
/// creates afterwards belong to that namespace. Threads of their own keep
/// their namespace, so a test gives each namespace a thread.
pub fn enter(netns: &str) {
    let path = format!("/run/netns/{netns}");
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
        .unwrap_or_else(|e| panic!("setns {path}: {e}"));
}

/// A future a thread inside a namespace runs (built on that thread, so
/// the sockets it opens belong there).
pub type InNetns<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T>>>;

/// Runs `f` on a thread of its own inside `netns`, on a current-thread
/// runtime of its own; the thread's handle.
pub fn spawn_in<T: Send + 'static>(
    netns: &str,
    f: impl FnOnce() -> InNetns<T> + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let inside = netns.to_string();
    std::thread::spawn(move || {
        enter(&inside);
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"))
            .block_on(f())
    })
}

/// [`spawn_in`], waited for: what `f` returned.
pub fn run_in<T: Send + 'static>(
    netns: &str,
    f: impl FnOnce() -> InNetns<T> + Send + 'static,
) -> T {
    spawn_in(netns, f)
        .join()
        .unwrap_or_else(|_| panic!("a thread inside {netns} failed"))
}

/// One pod: a namespace with `eth0` at `ip`.
pub struct Pod {
    pub name: String,
    pub netns: String,
    pub ip: Ipv4Addr,
}

impl Pod {
    fn exec(&self, args: &[&str]) -> Output {
        let mut full = vec!["netns", "exec", &self.netns];
        full.extend_from_slice(args);
        ip(&full)
    }

    /// A command run inside the pod (as root, like a container's hook).
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.netns, program]);
        cmd
    }

    /// A command run inside the pod as the sidecar's uid ([`PROXY_UID`]),
    /// whose connections the capture rules leave alone.
    pub fn proxy_command(&self, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.netns, "setpriv"])
            .arg(format!("--reuid={PROXY_UID}"))
            .arg(format!("--regid={PROXY_UID}"))
            .args(["--clear-groups", program]);
        cmd
    }

    /// Makes the pod IPv6-only: `eth0` loses its IPv4 address (`ip` no
    /// longer names the pod) and gets `cidr`, usable at once (no duplicate
    /// address detection). Loopback keeps `127.0.0.1` and `::1`, as in a
    /// Kubernetes IPv6-only pod.
    pub fn make_ipv6_only(&self, cidr: &str) {
        self.exec(&["ip", "-4", "addr", "flush", "dev", "eth0"]);
        self.exec(&["ip", "-6", "addr", "add", cidr, "dev", "eth0", "nodad"]);
    }

    /// Istio's sidecar capture, as `istio-iptables` writes it for a pod
    /// (nat table): inbound TCP to any port but the sidecar's own goes to
    /// 15006; outbound TCP goes to 15001, except the sidecar's own (uid
    /// 1337, and the inbound cluster's 127.0.0.6 source), loopback
    /// traffic of the app, and the sidecar calling its own pod address
    /// (sent back through inbound).
    pub fn capture_like_istio(&self) {
        let mut rules = vec![
            "-N ISTIO_INBOUND".to_string(),
            "-N ISTIO_IN_REDIRECT".into(),
            "-N ISTIO_OUTPUT".into(),
            "-N ISTIO_REDIRECT".into(),
        ];
        // The sidecar's own ports stay its own.
        for port in [15008, 15090, 15021, 15020] {
            rules.push(format!("-A ISTIO_INBOUND -p tcp --dport {port} -j RETURN"));
        }
        rules.extend(
            [
                "-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT",
                "-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006",
                "-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001",
                "-A ISTIO_OUTPUT -s 127.0.0.6/32 -o lo -j RETURN",
                "-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT",
                "-A ISTIO_OUTPUT -o lo -m owner ! --uid-owner 1337 -j RETURN",
                "-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN",
                "-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN",
                "-A ISTIO_OUTPUT -j ISTIO_REDIRECT",
                "-A PREROUTING -p tcp -j ISTIO_INBOUND",
                "-A OUTPUT -p tcp -j ISTIO_OUTPUT",
            ]
            .map(String::from),
        );
        for rule in &rules {
            let mut args = vec!["iptables", "-t", "nat"];
            args.extend(rule.split_whitespace());
            self.exec(&args);
        }
    }

    /// Moves the calling thread into this pod's namespace (see [`enter`]).
    pub fn enter(&self) {
        enter(&self.netns);
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        // Processes still inside keep a namespace alive only through their
        // own handles; their owners kill them on drop.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .status();
    }
}
