//! `make oci` and `make push` against a real registry: Debian's
//! `docker-registry` (the CNCF distribution registry) on a loopback port of
//! its own, with its own config and storage under `target/e2e/`, so nothing
//! depends on (or collides with) a system service the package may start.
//!
//! The push goes through the Makefile (`make -s push`), so its skopeo
//! command is what is tested. Each image is then read back three ways: the
//! registry's own answer to `GET /v2/<name>/manifests/<tag>` (content type
//! and `Docker-Content-Digest`), `skopeo inspect --raw`, and `skopeo copy`
//! into a fresh OCI layout. The checks are the rules Istio's and Envoy
//! Gateway's image fetchers apply: an image manifest (not an index) that is
//! not Docker schema2, whose last (here: only) layer is
//! `application/vnd.oci.image.layer.v1.tar+gzip` and holds `plugin.wasm`.
//!
//! `make test-tools` installs skopeo and docker-registry (CI runs it first).

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use graceful_harness::support::client;
use graceful_harness::support::envoy::{candidate_port, lost_a_port, repo_root, wasm_dir};
use serde_json::Value;

const FILTERS: [&str; 3] = ["graceful_provider", "graceful_drain", "graceful_consumer"];
const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const INDEX: &str = "application/vnd.oci.image.index.v1+json";
const CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const REGISTRY_BINARY: &str = "/usr/bin/docker-registry";
/// How long the registry may take to answer `GET /v2/`.
const REGISTRY_DEADLINE: Duration = Duration::from_secs(30);
/// `make push` runs `make build` first, which may have to compile.
const MAKE_DEADLINE: Duration = Duration::from_secs(900);
const TOOL_DEADLINE: Duration = Duration::from_secs(120);

static SEQ: AtomicU32 = AtomicU32::new(0);
/// `make push` rewrites `dist/*.wasm` (it runs `make build`): the other test
/// reads them only while holding this, so it never sees a half-written one.
static DIST: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A fresh folder under `target/e2e/` for one test.
fn test_dir(name: &str) -> PathBuf {
    let seq = SEQ.fetch_add(1, Ordering::SeqCst);
    let dir = repo_root()
        .join("target/e2e")
        .join(format!("{name}-{}-{seq}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}

fn require_tools() {
    assert!(
        Path::new(REGISTRY_BINARY).exists(),
        "{REGISTRY_BINARY} missing: run `make test-tools` (installs Debian's docker-registry and skopeo)"
    );
    let skopeo = Command::new("skopeo")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    assert!(
        skopeo.is_ok_and(|s| s.success()),
        "skopeo missing: run `make test-tools` (installs Debian's skopeo and docker-registry)"
    );
}

struct Output {
    status: ExitStatus,
    stdout: Vec<u8>,
    stderr: String,
}

/// Runs a command with its output in files under `dir`, polling for its
/// exit until `limit`; kills it and panics past that.
async fn run_status(dir: &Path, cmd: &mut Command, limit: Duration) -> Output {
    let seq = SEQ.fetch_add(1, Ordering::SeqCst);
    let out_path = dir.join(format!("cmd-{seq}.out"));
    let err_path = dir.join(format!("cmd-{seq}.err"));
    let what = format!("{cmd:?}");
    let out = fs::File::create(&out_path).unwrap_or_else(|e| panic!("{}: {e}", out_path.display()));
    let err = fs::File::create(&err_path).unwrap_or_else(|e| panic!("{}: {e}", err_path.display()));
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap_or_else(|e| panic!("{what}: {e}")) {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what} still running after {limit:?}; stderr:\n{}",
                fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    Output {
        status,
        stdout: fs::read(&out_path).unwrap_or_default(),
        stderr: fs::read_to_string(&err_path).unwrap_or_default(),
    }
}

/// [`run_status`], and panics with its output unless it succeeded.
async fn run(dir: &Path, cmd: &mut Command, limit: Duration) -> Vec<u8> {
    let what = format!("{cmd:?}");
    let out = run_status(dir, cmd, limit).await;
    assert!(
        out.status.success(),
        "{what}: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        out.stderr
    );
    out.stdout
}

/// A registry of our own. Killed on drop; its log is printed if the test failed.
struct Registry {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl Registry {
    /// Its port is picked (the registry does not report one it bound
    /// for `:0`), and picked again when the registry exits because it
    /// was taken.
    async fn start(dir: &Path) -> Registry {
        for _ in 0..8 {
            let addr = SocketAddr::from(([127, 0, 0, 1], candidate_port()));
            if let Some(registry) = Registry::start_at(dir, addr).await {
                return registry;
            }
            eprintln!("docker-registry: {addr} was taken; starting it again on another port");
        }
        panic!("docker-registry lost its port 8 times");
    }

    /// None if it exited because `addr` was taken.
    async fn start_at(dir: &Path, addr: SocketAddr) -> Option<Registry> {
        let storage = dir.join("storage");
        fs::create_dir_all(&storage).unwrap_or_else(|e| panic!("{}: {e}", storage.display()));
        let config = dir.join("registry.yml");
        fs::write(
            &config,
            format!(
                "version: 0.1\n\
                 log:\n  level: info\n  accesslog:\n    disabled: false\n\
                 storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
                 http:\n  addr: {addr}\n",
                storage.display()
            ),
        )
        .unwrap_or_else(|e| panic!("{}: {e}", config.display()));
        let log = dir.join("registry.log");
        let log_file = fs::File::create(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        let log_err = log_file.try_clone().unwrap_or_else(|e| panic!("{e}"));
        let child = Command::new(REGISTRY_BINARY)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(log_err)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run {REGISTRY_BINARY} ({e}): run `make test-tools`")
            });
        let mut registry = Registry { child, addr, log };
        let deadline = Instant::now() + REGISTRY_DEADLINE;
        loop {
            if let Some(status) = registry.child.try_wait().ok().flatten() {
                if lost_a_port(&fs::read_to_string(&registry.log).unwrap_or_default()) {
                    return None;
                }
                panic!("docker-registry exited during start-up ({status})");
            }
            // The distribution API's version check: 200 with `{}` when no auth is configured.
            if let Ok(r) = client::get(addr, "/v2/").await {
                if r.status == 200
                    && r.header("docker-distribution-api-version").as_deref()
                        == Some("registry/2.0")
                {
                    return Some(registry);
                }
            }
            assert!(
                Instant::now() < deadline,
                "docker-registry not answering GET /v2/ on {addr} within {REGISTRY_DEADLINE:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "docker-registry log ({}):\n{}",
                self.log.display(),
                fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}

fn read(path: &Path) -> Vec<u8> {
    fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn json(bytes: &[u8], what: &str) -> Value {
    serde_json::from_slice(bytes).unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// `sha256:<hex>` of a file, by coreutils' sha256sum.
async fn sha256(dir: &Path, path: &Path) -> String {
    let out = run(
        dir,
        Command::new("sha256sum").arg("--binary").arg(path),
        TOOL_DEADLINE,
    )
    .await;
    let text = String::from_utf8_lossy(&out);
    format!(
        "sha256:{}",
        text.split_whitespace().next().unwrap_or_default()
    )
}

fn blob(layout: &Path, digest: &str) -> PathBuf {
    let hex = digest
        .strip_prefix("sha256:")
        .unwrap_or_else(|| panic!("not a sha256 digest: {digest}"));
    layout.join("blobs/sha256").join(hex)
}

/// An OCI layout's only manifest: its descriptor from index.json.
fn only_manifest(layout: &Path) -> Value {
    let index = json(&read(&layout.join("index.json")), "index.json");
    assert_eq!(index["schemaVersion"], 2, "{}: {index}", layout.display());
    let manifests = index["manifests"].as_array().cloned().unwrap_or_default();
    assert_eq!(manifests.len(), 1, "{}: {index}", layout.display());
    assert_eq!(
        json(&read(&layout.join("oci-layout")), "oci-layout")["imageLayoutVersion"],
        "1.0.0"
    );
    manifests[0].clone()
}

/// One entry of a ustar archive, as its header says.
struct TarEntry {
    name: String,
    typeflag: u8,
    mode: u64,
    uid: u64,
    gid: u64,
    mtime: u64,
    uname: String,
    gname: String,
    data: Vec<u8>,
}

fn cstr(field: &[u8]) -> String {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

fn octal(field: &[u8]) -> u64 {
    let text = cstr(field);
    let text = text.trim_matches(|c| c == ' ' || c == '\0');
    u64::from_str_radix(text, 8).unwrap_or_else(|e| panic!("tar field {text:?}: {e}"))
}

/// Every entry of a ustar archive (checksums checked), up to its end blocks.
fn tar_entries(tar: &[u8]) -> Vec<TarEntry> {
    let mut entries = Vec::new();
    let mut at = 0;
    loop {
        let header = tar
            .get(at..at + 512)
            .unwrap_or_else(|| panic!("tar ends without end blocks at {at}"));
        if header.iter().all(|&b| b == 0) {
            return entries;
        }
        let sum: u64 = header
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                if (148..156).contains(&i) {
                    32
                } else {
                    u64::from(b)
                }
            })
            .sum();
        assert_eq!(octal(&header[148..156]), sum, "tar header checksum at {at}");
        assert_eq!(
            &header[257..265],
            b"ustar\x0000",
            "not a ustar header at {at}"
        );
        let size = usize::try_from(octal(&header[124..136])).unwrap_or(usize::MAX);
        let start = at + 512;
        let data = tar
            .get(start..start + size)
            .unwrap_or_else(|| panic!("tar entry at {at} runs past the end"))
            .to_vec();
        let prefix = cstr(&header[345..500]);
        let name = cstr(&header[0..100]);
        entries.push(TarEntry {
            name: if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            },
            typeflag: header[156],
            mode: octal(&header[100..108]),
            uid: octal(&header[108..116]),
            gid: octal(&header[116..124]),
            mtime: octal(&header[136..148]),
            uname: cstr(&header[265..297]),
            gname: cstr(&header[297..329]),
            data,
        });
        at = start + size.div_ceil(512) * 512;
    }
}

/// Checks a pulled image (an OCI layout written by `skopeo copy`) the way the
/// fetchers read it, and that its plugin.wasm is `wasm`.
async fn check_pulled_image(dir: &Path, pulled: &Path, name: &str, wasm: &[u8]) {
    let manifest_path = blob(
        pulled,
        only_manifest(pulled)["digest"].as_str().unwrap_or_default(),
    );
    let manifest = json(&read(&manifest_path), "pulled manifest");
    assert_eq!(manifest["schemaVersion"], 2, "{name}: {manifest}");
    assert_eq!(manifest["mediaType"], MANIFEST, "{name}: {manifest}");
    assert_eq!(
        manifest["config"]["mediaType"], CONFIG,
        "{name}: {manifest}"
    );
    assert_eq!(
        manifest["annotations"]["module.wasm.image/variant"], "compat",
        "{name}: {manifest}"
    );
    let layers = manifest["layers"].as_array().cloned().unwrap_or_default();
    assert_eq!(layers.len(), 1, "{name}: exactly one layer: {manifest}");
    assert_eq!(layers[0]["mediaType"], LAYER, "{name}: {manifest}");

    // Blobs are what their descriptors say.
    let config_digest = manifest["config"]["digest"].as_str().unwrap_or_default();
    let config_path = blob(pulled, config_digest);
    assert_eq!(
        sha256(dir, &config_path).await,
        config_digest,
        "{name} config"
    );
    let config = json(&read(&config_path), "config");
    assert_eq!(config["architecture"], "wasm", "{name}: {config}");
    assert_eq!(config["os"], "wasip1", "{name}: {config}");
    assert_eq!(config["rootfs"]["type"], "layers", "{name}: {config}");
    let layer_digest = layers[0]["digest"].as_str().unwrap_or_default();
    let layer_path = blob(pulled, layer_digest);
    assert_eq!(sha256(dir, &layer_path).await, layer_digest, "{name} layer");
    assert_eq!(
        layers[0]["size"].as_u64(),
        Some(read(&layer_path).len() as u64),
        "{name} layer size"
    );

    // The layer gunzips (gzip, as the fetchers do) to a tar whose digest is the diff_id.
    let tar = run(
        dir,
        Command::new("gzip").arg("-dc").arg(&layer_path),
        TOOL_DEADLINE,
    )
    .await;
    let tar_path = dir.join(format!("{name}.tar"));
    fs::write(&tar_path, &tar).unwrap_or_else(|e| panic!("{}: {e}", tar_path.display()));
    assert_eq!(
        config["rootfs"]["diff_ids"],
        serde_json::json!([sha256(dir, &tar_path).await]),
        "{name}: diff_ids"
    );
    let entries = tar_entries(&tar);
    assert_eq!(entries.len(), 1, "{name}: one file in the layer");
    let e = &entries[0];
    assert_eq!(e.name, "plugin.wasm", "{name}");
    assert_eq!(e.typeflag, b'0', "{name}: a regular file");
    assert_eq!(e.mode, 0o644, "{name}: mode");
    assert_eq!(
        (e.uid, e.gid, e.mtime, e.uname.as_str(), e.gname.as_str()),
        (0, 0, 0, "", ""),
        "{name}: owner and time"
    );
    assert!(
        e.data == wasm,
        "{name}: plugin.wasm differs from dist/{name}.wasm"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_pushes_each_image_with_make_push_and_pulls_it_back_unchanged() {
    require_tools();
    let root = repo_root();
    let dir = test_dir("oci-push");
    let registry = Registry::start(&dir).await;
    let repository = format!("{}/graceful-wasm", registry.addr);
    let _dist = DIST.lock().await;

    // The Makefile's own command (it runs `make oci`, so `make build`, first).
    let pushed = run(
        &dir,
        Command::new("make")
            .args(["-s", "--no-print-directory", "push"])
            .arg(format!("REGISTRY={repository}"))
            .arg("TAG=e2e")
            .current_dir(&root)
            .env_remove("MAKEFLAGS")
            .env_remove("MFLAGS")
            .env_remove("MAKELEVEL"),
        MAKE_DEADLINE,
    )
    .await;
    let pushed = String::from_utf8_lossy(&pushed).into_owned();

    let mut checked = 0;
    for name in FILTERS {
        let wasm = read(&root.join("dist").join(format!("{name}.wasm")));
        let layout = root.join("dist/oci").join(name);
        let local = only_manifest(&layout);
        assert_eq!(local["mediaType"], MANIFEST, "{name}: {local}");
        assert_eq!(
            local["annotations"]["org.opencontainers.image.ref.name"], "e2e",
            "{name}: {local}"
        );
        let digest = local["digest"].as_str().unwrap_or_default().to_string();
        let local_manifest = read(&blob(&layout, &digest));
        let image = format!("{repository}/{name}:e2e");
        assert!(
            pushed.contains(&format!("pushed {image}@{digest}")),
            "{name}: make push said:\n{pushed}"
        );

        // The registry's answer, as go-containerregistry's remote.Get asks
        // for it (an image manifest, not an index, under the tag).
        let accept = [
            MANIFEST,
            INDEX,
            "application/vnd.docker.distribution.manifest.v2+json",
        ]
        .join(", ");
        let path = format!("/v2/graceful-wasm/{name}/manifests/e2e");
        let r = client::request(registry.addr, "GET", &path, &[("accept", &accept)])
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        assert_eq!(r.status, 200, "GET {path}: {}", r.text());
        assert_eq!(
            r.header("content-type").as_deref(),
            Some(MANIFEST),
            "{path}"
        );
        assert_eq!(
            r.header("docker-content-digest").as_deref(),
            Some(digest.as_str()),
            "{path}"
        );
        assert!(
            r.body == local_manifest,
            "{path}: not the manifest of {}",
            layout.display()
        );

        // A real client: skopeo reads the manifest and digests it itself.
        let raw = run(
            &dir,
            Command::new("skopeo")
                .args(["inspect", "--raw", "--tls-verify=false"])
                .arg(format!("docker://{image}")),
            TOOL_DEADLINE,
        )
        .await;
        assert!(
            raw == local_manifest,
            "{name}: skopeo inspect --raw differs"
        );
        let seen = run(
            &dir,
            Command::new("skopeo")
                .args(["inspect", "--tls-verify=false", "--format", "{{.Digest}}"])
                .arg(format!("docker://{image}")),
            TOOL_DEADLINE,
        )
        .await;
        assert_eq!(String::from_utf8_lossy(&seen).trim(), digest, "{name}");

        // Pull it back whole and check it the way the fetchers read it.
        let pulled = dir.join(format!("pulled-{name}"));
        run(
            &dir,
            Command::new("skopeo")
                .args(["copy", "--quiet", "--src-tls-verify=false"])
                .arg(format!("docker://{image}"))
                .arg(format!("oci:{}:e2e", pulled.display())),
            TOOL_DEADLINE,
        )
        .await;
        assert_eq!(only_manifest(&pulled)["digest"], digest.as_str(), "{name}");
        check_pulled_image(&dir, &pulled, name, &wasm).await;
        checked += 1;
    }
    assert_eq!(checked, FILTERS.len());
    assert_eq!(checked, 3);
}

/// The manifest digest of each filter in a layout folder written by oci.py.
fn digests(out: &Path) -> Vec<String> {
    FILTERS
        .iter()
        .map(|name| {
            only_manifest(&out.join(name))["digest"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

/// Every blob of a layout folder: (filter, digest, bytes).
fn all_blobs(out: &Path) -> Vec<(String, String, Vec<u8>)> {
    let mut blobs = Vec::new();
    for name in FILTERS {
        let folder = out.join(name).join("blobs/sha256");
        let mut files: Vec<_> = fs::read_dir(&folder)
            .unwrap_or_else(|e| panic!("{}: {e}", folder.display()))
            .map(|e| e.unwrap_or_else(|e| panic!("{e}")).path())
            .collect();
        files.sort();
        for f in files {
            let hex = f
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            blobs.push((name.to_string(), hex, read(&f)));
        }
    }
    blobs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_packs_reproducibly_and_a_changed_module_changes_the_digest() {
    let dir = test_dir("oci-repro");
    let tool = repo_root().join("tools/oci.py");
    // Copies, read once, while `make push` in the other test cannot rewrite dist/.
    let input = dir.join("in");
    let changed = dir.join("changed");
    fs::create_dir_all(&input).unwrap_or_else(|e| panic!("{e}"));
    fs::create_dir_all(&changed).unwrap_or_else(|e| panic!("{e}"));
    let dist = DIST.lock().await;
    for name in FILTERS {
        let mut wasm = read(&wasm_dir().join(format!("{name}.wasm")));
        fs::write(input.join(format!("{name}.wasm")), &wasm).unwrap_or_else(|e| panic!("{e}"));
        // Still a valid module: a custom section (id 0) named "x", one byte.
        wasm.extend_from_slice(&[0, 3, 1, b'x', 1]);
        fs::write(changed.join(format!("{name}.wasm")), &wasm).unwrap_or_else(|e| panic!("{e}"));
    }
    drop(dist);
    let pack = |from: &Path, out: &Path, tag: &str| {
        let mut cmd = Command::new("python3");
        cmd.arg(&tool)
            .arg("--dist")
            .arg(from)
            .arg("--out")
            .arg(out)
            .args(["--tag", tag])
            .args(FILTERS);
        cmd
    };
    run(
        &dir,
        &mut pack(&input, &dir.join("a"), "one"),
        TOOL_DEADLINE,
    )
    .await;
    run(
        &dir,
        &mut pack(&input, &dir.join("b"), "two"),
        TOOL_DEADLINE,
    )
    .await;
    run(
        &dir,
        &mut pack(&changed, &dir.join("c"), "one"),
        TOOL_DEADLINE,
    )
    .await;

    let (a, b, c) = (
        digests(&dir.join("a")),
        digests(&dir.join("b")),
        digests(&dir.join("c")),
    );
    assert_eq!(a.len(), 3);
    // Same module, another run and another tag: the same image, byte for byte.
    assert_eq!(a, b, "two runs of oci.py gave different manifests");
    let (blobs_a, blobs_b) = (all_blobs(&dir.join("a")), all_blobs(&dir.join("b")));
    assert_eq!(blobs_a.len(), 9, "config, layer and manifest per filter");
    assert!(
        blobs_a == blobs_b,
        "two runs of oci.py gave different blobs"
    );
    // Every blob is named by its digest.
    for (name, hex, bytes) in &blobs_a {
        let path = dir.join("a").join(name).join("blobs/sha256").join(hex);
        assert_eq!(sha256(&dir, &path).await, format!("sha256:{hex}"), "{name}");
        assert!(!bytes.is_empty());
    }
    // Three distinct images, and each changed module gives a new digest.
    assert_eq!(
        a.iter().collect::<std::collections::BTreeSet<_>>().len(),
        3,
        "{a:?}"
    );
    for ((name, before), after) in FILTERS.iter().zip(&a).zip(&c) {
        assert_ne!(before, after, "{name}: a changed module kept its digest");
    }

    // A missing module is an error naming the file.
    let empty = dir.join("empty");
    fs::create_dir_all(&empty).unwrap_or_else(|e| panic!("{e}"));
    let out = run_status(
        &dir,
        &mut pack(&empty, &dir.join("d"), "one"),
        TOOL_DEADLINE,
    )
    .await;
    assert!(!out.status.success(), "oci.py packed a missing module");
    let missing = empty.join("graceful_provider.wasm").display().to_string();
    assert!(out.stderr.contains(&missing), "{}", out.stderr);
}
