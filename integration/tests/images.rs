//! The container images (`scripts/build-images.sh`) under a real container runtime, containerd +
//! runc, with the security contexts the chart renders (`helm template`):
//! - the archives: one layer holding only the static binary and the licence, the binary as
//!   ENTRYPOINT, the chart's user, the OCI labels, each image at most 20 MB;
//! - the controller as UID 65532 on a read-only root with every capability dropped: `--version`,
//!   then `run` with the chart's args and env against the test kube-apiserver: it takes the
//!   Lease, serves `/healthz`, the config stream (gRPC health over TLS, verified with the CA it
//!   published) and the webhook port (TLS), and releases the Lease on SIGTERM;
//! - the agent as UID 0 on a read-only root with exactly the chart's capabilities, in a network
//!   namespace with a pool interface: it sets the server address, announces it by gratuitous
//!   ARP, binds UDP 67 on that device, and a real `dhclient` on the other end of the veth gets its
//!   reservation. Without NET_ADMIN, or without NET_BIND_SERVICE, it fails with an error naming
//!   the missing capability; without NET_RAW it serves, without announcements, and its log names
//!   CAP_NET_RAW.
//!
//! The images come from `$VMDHCP_IMAGES_DIR` (default `<target dir>/images`), which
//! `scripts/test.sh` fills with `scripts/build-images.sh` before running the tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use serde::Deserialize as _;
use serde_json::{Value, json};
use vmdhcp_integration::containerd::{
    Container, Containerd, Network, Run, SecurityContext, capability_bit,
};
use vmdhcp_integration::control_plane::{ControlPlane, bin_dir, repo_root};
use vmdhcp_integration::dhcp_client::{start_dhclient, udhcpc, wait_event, wait_for};
use vmdhcp_integration::netns::{Lab, Netns};
use vmdhcp_integration::ports::free_port;

/// The size budget of each image, compressed and unpacked: what it has held to so far
/// (docs/tuning.md, "Image profile"), with room for the controller's address claims.
const MAX_IMAGE_BYTES: u64 = 24_000_000;
const SERVER_IP: &str = "192.0.2.1";
const VM_MAC: &str = "02:00:00:00:16:01";
const VM_IP: &str = "192.0.2.16";

// === the images ===

/// One line of `images.tsv`, as `scripts/build-images.sh` writes it.
#[derive(Clone, Debug)]
struct Image {
    name: String,
    reference: String,
    digest: String,
    compressed: u64,
    unpacked: u64,
    archive: PathBuf,
}

fn images_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("VMDHCP_IMAGES_DIR") {
        return PathBuf::from(dir);
    }
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
        .join("images")
}

/// The built images, by name; fails (not skips) when they are missing.
fn images() -> &'static BTreeMap<String, Image> {
    static IMAGES: OnceLock<BTreeMap<String, Image>> = OnceLock::new();
    IMAGES.get_or_init(|| {
        let dir = images_dir();
        let tsv = std::fs::read_to_string(dir.join("images.tsv")).unwrap_or_else(|e| {
            panic!(
                "no images in {} ({e}): build them with `scripts/build-images.sh --out {}` \
                 (scripts/test.sh does), or point VMDHCP_IMAGES_DIR at them",
                dir.display(),
                dir.display()
            )
        });
        let images: BTreeMap<String, Image> = tsv
            .lines()
            .map(|line| {
                let f: Vec<&str> = line.split('\t').collect();
                assert_eq!(f.len(), 7, "images.tsv line {line:?}");
                let image = Image {
                    name: f[0].to_owned(),
                    reference: f[1].to_owned(),
                    digest: f[2].to_owned(),
                    compressed: f[3].parse().unwrap(),
                    unpacked: f[4].parse().unwrap(),
                    archive: PathBuf::from(f[6]),
                };
                assert!(
                    image.archive.exists(),
                    "{} listed in images.tsv but missing: rebuild with scripts/build-images.sh",
                    image.archive.display()
                );
                (image.name.clone(), image)
            })
            .collect();
        for name in ["vm-dhcp-controller", "vm-dhcp-agent"] {
            assert!(images.contains_key(name), "{name} missing from images.tsv");
        }
        images
    })
}

/// The image's OCI config, manifest and layer listing, read from its archive.
struct Unpacked {
    manifest: Value,
    config: Value,
    /// `tar -tvzf` of the one layer.
    files: String,
}

fn unpack(image: &Image) -> Unpacked {
    let dir = tempfile::tempdir().unwrap();
    run_ok(
        Command::new("tar")
            .arg("-xf")
            .arg(&image.archive)
            .arg("-C")
            .arg(dir.path()),
    );
    let blob = |digest: &str| dir.path().join("blobs").join(digest.replace(':', "/"));
    let json = |path: PathBuf| -> Value {
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
    };
    let index = json(dir.path().join("index.json"));
    assert_eq!(
        index["manifests"].as_array().map(Vec::len),
        Some(1),
        "{index}"
    );
    assert_eq!(index["manifests"][0]["digest"], image.digest.as_str());
    assert_eq!(
        index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"],
        image.reference.as_str()
    );
    let manifest = json(blob(index["manifests"][0]["digest"].as_str().unwrap()));
    let config = json(blob(manifest["config"]["digest"].as_str().unwrap()));
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1, "one layer: {manifest}");
    let files = run_ok(
        Command::new("tar")
            .arg("-tvzf")
            .arg(blob(layers[0]["digest"].as_str().unwrap())),
    );
    Unpacked {
        manifest,
        config,
        files,
    }
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn app_version() -> String {
    let chart = std::fs::read_to_string(repo_root().join("chart/Chart.yaml")).unwrap();
    chart
        .lines()
        .find_map(|l| l.strip_prefix("appVersion:"))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .unwrap()
}

// === the chart ===

/// The pod spec of one of the chart's Deployments (`controller` or `agent`), as `helm template`
/// renders it with the default values into `namespace`.
fn chart_pod(component: &str, namespace: &str) -> Value {
    let helm = bin_dir().join("helm");
    assert!(
        helm.exists(),
        "helm not installed at {}: run scripts/install-deps.sh",
        helm.display()
    );
    let rendered = run_ok(
        Command::new(helm)
            .args(["template", "vmdhcp"])
            .arg(repo_root().join("chart"))
            .args(["--namespace", namespace]),
    );
    serde_yaml_ng::Deserializer::from_str(&rendered)
        .map(|doc| serde_yaml_ng::Value::deserialize(doc).unwrap())
        .map(|doc| serde_json::to_value(doc).unwrap())
        .find(|doc| {
            doc["kind"] == "Deployment"
                && doc["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
                    == component
        })
        .map(|doc| doc["spec"]["template"]["spec"].clone())
        .unwrap_or_else(|| panic!("no {component} Deployment in the rendered chart"))
}

/// What the chart asks of a container: user, read-only root, capabilities kept, args, env.
struct ChartContainer {
    run_as_user: u64,
    read_only_root: bool,
    capabilities: Vec<String>,
    args: Vec<String>,
    /// Variables with a literal value (those from the downward API are the test's to set).
    env: Vec<(String, String)>,
}

fn chart_container(component: &str, namespace: &str) -> ChartContainer {
    let pod = chart_pod(component, namespace);
    let container = &pod["containers"][0];
    let security = &container["securityContext"];
    let drop: Vec<&str> = security["capabilities"]["drop"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert_eq!(
        drop,
        ["ALL"],
        "the chart drops every capability: {security}"
    );
    ChartContainer {
        run_as_user: pod["securityContext"]["runAsUser"].as_u64().unwrap(),
        read_only_root: security["readOnlyRootFilesystem"] == true,
        capabilities: security["capabilities"]["add"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default(),
        args: container["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect(),
        env: container["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| {
                Some((
                    e["name"].as_str()?.to_owned(),
                    e["value"].as_str()?.to_owned(),
                ))
            })
            .collect(),
    }
}

// === the runtime ===

/// containerd with both images imported, shared by the tests of this binary.
fn containerd() -> &'static Containerd {
    static CONTAINERD: OnceLock<Containerd> = OnceLock::new();
    CONTAINERD.get_or_init(|| {
        let ctrd = Containerd::start().unwrap_or_else(|e| panic!("cannot start containerd: {e}"));
        for image in images().values() {
            let listed = ctrd
                .import(&image.archive)
                .unwrap_or_else(|e| panic!("ctr images import {}: {e}", image.archive.display()));
            // Imported under its own name and digest, as a node would pull it.
            assert!(
                listed
                    .lines()
                    .any(|l| l.starts_with(&format!("{} ", image.reference))
                        && l.contains(&image.digest)),
                "{} ({}) not listed after import:\n{listed}",
                image.reference,
                image.digest
            );
        }
        ctrd
    })
}

/// What the kernel says about the container's first process.
struct ProcessView {
    status: String,
    root_mount_options: String,
}

impl ProcessView {
    fn of(container: &Container) -> Self {
        let pid = wait_for("the container's pid", Duration::from_secs(20), || {
            container.pid()
        });
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
        // Fields: id parent major:minor root mountpoint options ...
        let root_mount_options = mountinfo
            .lines()
            .map(|l| l.split(' ').collect::<Vec<_>>())
            .rfind(|f| f.len() > 5 && f[4] == "/")
            .map(|f| f[5].to_owned())
            .unwrap();
        ProcessView {
            status,
            root_mount_options,
        }
    }

    fn field(&self, name: &str) -> &str {
        self.status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .map(str::trim)
            .unwrap_or_else(|| panic!("no {name} in {}", self.status))
    }

    fn caps(&self, set: &str) -> u64 {
        u64::from_str_radix(self.field(set), 16).unwrap()
    }

    /// Checks UID, read-only root, exactly `capabilities` in every set that matters, no new
    /// privileges and the runtime's seccomp filter.
    fn assert_context(&self, uid: u64, read_only_root: bool, capabilities: &[String]) {
        let uids: Vec<&str> = self.field("Uid").split_whitespace().collect();
        assert_eq!(uids, [uid.to_string().as_str(); 4], "{}", self.status);
        let expected: u64 = capabilities
            .iter()
            .map(|c| 1u64 << capability_bit(c).unwrap())
            .sum();
        // A non-root process keeps no capability across exec (no ambient ones), so its effective
        // and permitted sets are empty whatever the bounding set says.
        let effective = if uid == 0 { expected } else { 0 };
        assert_eq!(self.caps("CapEff"), effective, "CapEff\n{}", self.status);
        assert_eq!(self.caps("CapPrm"), effective, "CapPrm\n{}", self.status);
        assert_eq!(self.caps("CapBnd"), expected, "CapBnd\n{}", self.status);
        assert_eq!(self.caps("CapAmb"), 0, "CapAmb\n{}", self.status);
        assert_eq!(self.field("NoNewPrivs"), "1", "{}", self.status);
        assert_eq!(self.field("Seccomp"), "2", "{}", self.status);
        assert_eq!(
            self.root_mount_options.split(',').next() == Some("ro"),
            read_only_root,
            "root mount options {}",
            self.root_mount_options
        );
    }
}

fn unique_id(what: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{what}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

// === the tests ===

#[test]
fn each_image_is_one_small_layer_with_the_binary_as_entrypoint_and_the_oci_labels() {
    let version = app_version();
    for (name, image) in images() {
        let Unpacked {
            manifest,
            config,
            files,
        } = unpack(image);
        assert_eq!(
            image.reference,
            format!("ghcr.io/vmdhcp/{name}:{version}"),
            "tagged with the chart's appVersion"
        );
        assert!(
            image.compressed <= MAX_IMAGE_BYTES && image.unpacked <= MAX_IMAGE_BYTES,
            "{name}: {} bytes compressed, {} unpacked, budget {MAX_IMAGE_BYTES}",
            image.compressed,
            image.unpacked
        );
        let cfg = &config["config"];
        assert_eq!(cfg["Entrypoint"], json!([format!("/{name}")]), "{config}");
        assert!(
            cfg["Cmd"].is_null(),
            "no CMD: the chart passes args: {config}"
        );
        let user = if name == "vm-dhcp-controller" {
            "65532:65532"
        } else {
            "0:0"
        };
        assert_eq!(cfg["User"], user, "{config}");
        let labels = &cfg["Labels"];
        assert_eq!(labels["org.opencontainers.image.version"], version.as_str());
        assert_eq!(labels["org.opencontainers.image.licenses"], "Apache-2.0");
        assert_eq!(labels["org.opencontainers.image.title"], name.as_str());
        assert!(
            labels["org.opencontainers.image.source"]
                .as_str()
                .is_some_and(|s| s.starts_with("https://")),
            "{labels}"
        );
        let revision = labels["org.opencontainers.image.revision"]
            .as_str()
            .unwrap();
        assert!(
            revision.len() >= 40 && revision[..40].bytes().all(|b| b.is_ascii_hexdigit()),
            "revision label {revision:?}"
        );
        assert_eq!(config["architecture"], "amd64");
        assert_eq!(config["os"], "linux");
        assert_eq!(
            manifest["mediaType"],
            "application/vnd.oci.image.manifest.v1+json"
        );
        // Exactly the licence and the binary, owned by root, not writable by others.
        let mut listing: Vec<(String, String)> = files
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (
                    f[0].to_owned(),
                    f[f.len() - 1].trim_start_matches("./").to_owned(),
                )
            })
            .collect();
        listing.sort_by(|a, b| a.1.cmp(&b.1));
        assert_eq!(
            listing,
            [
                ("-rw-r--r--".to_owned(), "LICENSE".to_owned()),
                ("-rwxr-xr-x".to_owned(), name.clone()),
            ],
            "{files}"
        );
        assert!(files.lines().all(|l| l.contains(" 0/0 ")), "{files}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_runs_as_the_chart_says_leads_and_serves_health_stream_and_webhook() {
    let image = images()["vm-dhcp-controller"].clone();
    let ctrd = tokio::task::spawn_blocking(containerd).await.unwrap();
    let cp = tokio::task::spawn_blocking(ControlPlane::shared)
        .await
        .unwrap();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "images").await.unwrap();
    let chart = chart_container("controller", &ns);
    let entrypoint = format!("/{}", image.name);

    // --version, as the chart's user on a read-only root.
    let version = tokio::task::block_in_place(|| {
        ctrd.run_to_end(&Run {
            image: image.reference.clone(),
            id: unique_id("controller-version"),
            args: vec![entrypoint.clone(), "--version".into()],
            env: vec![],
            mounts: vec![],
            security: SecurityContext {
                read_only_root: chart.read_only_root,
                capabilities: chart.capabilities.clone(),
            },
            network: Network::Host,
        })
    })
    .unwrap();
    assert!(version.status.success(), "{version:?}");
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("vm-dhcp-controller {}", app_version())
    );

    // `run` with the chart's args and env, the kubeconfig mounted, on free loopback ports.
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(cp.kubeconfig(), dir.path().join("kubeconfig")).unwrap();
    let ca_file = cp.dir().join("ca.crt");
    let (grpc, http, webhook) = (free_port(), free_port(), free_port());
    let pod_name = unique_id("vm-dhcp-controller");
    let mut env: BTreeMap<String, String> = chart.env.iter().cloned().collect();
    env.insert("POD_NAME".into(), pod_name.clone());
    env.insert("POD_NAMESPACE".into(), ns.clone());
    env.insert("KUBECONFIG".into(), "/etc/vmdhcp/kubeconfig".into());
    for (var, port) in [
        ("GRPC_LISTEN", grpc),
        ("HTTP_LISTEN", http),
        ("WEBHOOK_LISTEN", webhook),
    ] {
        assert!(env.contains_key(var), "the chart sets {var}");
        env.insert(var.into(), format!("127.0.0.1:{port}"));
    }
    let service = env["SERVICE_NAME"].clone();
    let ca_configmap = env["CA_CONFIGMAP"].clone();
    let lease_name = chart
        .args
        .iter()
        .find_map(|a| a.strip_prefix("--leader-election-name="))
        .unwrap()
        .to_owned();
    let spec = Run {
        image: image.reference.clone(),
        id: unique_id("controller"),
        args: std::iter::once(entrypoint)
            .chain(chart.args.iter().cloned())
            .collect(),
        env: env.into_iter().collect(),
        mounts: vec![
            (
                dir.path().join("kubeconfig"),
                "/etc/vmdhcp/kubeconfig".into(),
                true,
            ),
            // The kubeconfig names the CA by this path.
            (ca_file.clone(), ca_file.display().to_string(), true),
        ],
        security: SecurityContext {
            read_only_root: chart.read_only_root,
            capabilities: chart.capabilities.clone(),
        },
        network: Network::Host,
    };
    let mut container = tokio::task::block_in_place(|| {
        ctrd.start_container(&spec, &dir.path().join("controller.log"))
    })
    .unwrap();
    let context = tokio::task::block_in_place(|| ProcessView::of(&container));
    context.assert_context(chart.run_as_user, chart.read_only_root, &chart.capabilities);
    assert_eq!(chart.run_as_user, 65532);

    // Leader: the Lease names this container's identity.
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let log = || container.log();
    poll(
        &format!("Lease {ns}/{lease_name} held by {pod_name}"),
        &log,
        || {
            let leases = leases.clone();
            let (lease_name, pod_name) = (lease_name.clone(), pod_name.clone());
            async move {
                let lease = leases.get_opt(&lease_name).await.ok()??;
                (lease.spec?.holder_identity? == pod_name).then_some(())
            }
        },
    )
    .await;
    // /healthz, on the chart's liveness probe path.
    let healthz = vmdhcp_integration::http::get(&format!("127.0.0.1:{http}"), "/healthz").unwrap();
    assert!(
        healthz.starts_with("HTTP/1.0 200") || healthz.starts_with("HTTP/1.1 200"),
        "{healthz}"
    );
    // The CA the controller published, to verify both TLS ports by the Service's name.
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let ca = poll("the published CA", &log, || {
        let (configmaps, name) = (configmaps.clone(), ca_configmap.clone());
        async move {
            configmaps
                .get_opt(&name)
                .await
                .ok()??
                .data?
                .remove("ca.crt")
        }
    })
    .await;
    std::fs::write(dir.path().join("ca.crt"), &ca).unwrap();
    let server_name = format!("{service}.{ns}.svc");
    // The config stream: gRPC health over TLS, with real grpcurl.
    let health = tokio::task::block_in_place(|| {
        run_ok(
            Command::new(bin_dir().join("grpcurl"))
                .arg("-cacert")
                .arg(dir.path().join("ca.crt"))
                .args(["-servername", &server_name, "-d"])
                .arg(r#"{"service":"vmdhcp.agent.v1.ConfigService"}"#)
                .arg(format!("127.0.0.1:{grpc}"))
                .arg("grpc.health.v1.Health/Check"),
        )
    });
    assert!(health.contains("\"SERVING\""), "{health}");
    // The webhook port: a TLS handshake verified with the published CA.
    tls_handshake(webhook, &ca, &server_name).await;

    // SIGTERM to the container's first process: the controller releases the Lease and exits 0.
    container.signal("SIGTERM").unwrap();
    let status = tokio::task::block_in_place(|| container.wait_exit(Duration::from_secs(30)));
    assert!(
        status.is_some_and(|s| s.success()),
        "exit {status:?}\n{}",
        container.log()
    );
    let lease = leases.get(&lease_name).await.unwrap();
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity),
        None,
        "the Lease is released on SIGTERM"
    );
}

/// Polls `f` every 100 ms for up to 60 s; the container's log is shown on timeout.
async fn poll<T, F, Fut>(what: &str, log: &dyn Fn() -> String, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn tls_handshake(port: u16, ca_pem: &str, server_name: &str) {
    let tls = vmdhcp_integration::tls::connect(port, ca_pem, server_name).await;
    assert!(tls.get_ref().1.peer_certificates().is_some());
}

/// A node namespace whose pool interface is wired to a VM namespace's `eth0`, the agent's
/// static config and a status directory, and the agent container once started.
struct AgentRig {
    lab: Lab,
    node: Netns,
    vm: Netns,
    interface: String,
    dir: tempfile::TempDir,
    chart: ChartContainer,
}

impl AgentRig {
    fn new() -> Self {
        let mut lab = Lab::new().unwrap();
        let node = lab.netns("node").unwrap();
        let vm = lab.netns("vm").unwrap();
        let pool: vmdhcp_core::NamespacedName = "default/net-16".parse().unwrap();
        // The interface name the agent Deployment would get for this pool.
        let interface = vmdhcp_core::ifname::base_name(&pool);
        lab.veth(&node, &interface, &vm, "eth0").unwrap();
        lab.exec(&vm, "ip", &["link", "set", "eth0", "address", VM_MAC])
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("status")).unwrap();
        let config = json!({"pools": [{
            "config": {
                "pool": pool.to_string(), "network": pool.to_string(),
                "interface_name": interface, "server_ip": SERVER_IP, "subnet": "192.0.2.0/24",
                "router": "192.0.2.254", "dns": [], "domain_name": null, "domain_search": [],
                "ntp": [], "lease_seconds": 600,
            },
            "leases": [{"mac": VM_MAC, "ip": VM_IP}],
        }]});
        std::fs::write(dir.path().join("pools.json"), config.to_string()).unwrap();
        AgentRig {
            lab,
            node,
            vm,
            interface,
            dir,
            chart: chart_container("agent", "vmdhcp-system"),
        }
    }

    /// Runs the agent image's `serve-static` on the pool interface, keeping `capabilities`.
    fn start(&self, capabilities: &[String]) -> Container {
        let image = &images()["vm-dhcp-agent"];
        let spec = Run {
            image: image.reference.clone(),
            id: unique_id("agent"),
            args: vec![
                format!("/{}", image.name),
                "serve-static".into(),
                "--config=/etc/vmdhcp/pools.json".into(),
                "--status-file=/run/vmdhcp/status.json".into(),
                "--configure-interfaces".into(),
            ],
            env: self.chart.env.clone(),
            mounts: vec![
                (
                    self.dir.path().join("pools.json"),
                    "/etc/vmdhcp/pools.json".into(),
                    true,
                ),
                (self.dir.path().join("status"), "/run/vmdhcp".into(), false),
            ],
            security: SecurityContext {
                read_only_root: self.chart.read_only_root,
                capabilities: capabilities.to_vec(),
            },
            network: Network::Namespace(PathBuf::from("/var/run/netns").join(self.node.name())),
        };
        containerd()
            .start_container(&spec, &self.dir.path().join("agent.log"))
            .unwrap()
    }

    /// The interface's status in the agent's status file, once it is `state`.
    fn wait_state(&self, container: &Container, state: &str) -> Value {
        let path = self.dir.path().join("status/status.json");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let status: Option<Value> = std::fs::read_to_string(&path)
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok());
            let interface = status.map(|s| s["interfaces"][&self.interface].clone());
            if let Some(i) = interface.filter(|i| i["state"] == state) {
                return i;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{} never {state}\n{}",
                self.interface,
                container.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn addresses(&self) -> String {
        self.lab
            .exec(
                &self.node,
                "ip",
                &["-4", "-o", "addr", "show", "dev", &self.interface],
            )
            .unwrap()
    }

    /// Chart capabilities without `name`.
    fn without(&self, name: &str) -> Vec<String> {
        assert!(
            self.chart.capabilities.iter().any(|c| c == name),
            "the chart grants {name}: {:?}",
            self.chart.capabilities
        );
        self.chart
            .capabilities
            .iter()
            .filter(|c| *c != name)
            .cloned()
            .collect()
    }

    /// A short udhcpc run that must get no lease.
    fn assert_no_lease(&self) {
        let dir = tempfile::tempdir().unwrap();
        let out = udhcpc(&self.vm, dir.path(), &[]);
        assert!(
            !out.status.success(),
            "udhcpc got a lease: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_agent_with_the_charts_capabilities_serves_a_real_client_its_reservation() {
    let mut rig = AgentRig::new();
    assert_eq!(rig.chart.run_as_user, 0);
    assert!(rig.chart.read_only_root);
    // --version first, under the same context.
    let image = &images()["vm-dhcp-agent"];
    let version = containerd()
        .run_to_end(&Run {
            image: image.reference.clone(),
            id: unique_id("agent-version"),
            args: vec![format!("/{}", image.name), "--version".into()],
            env: vec![],
            mounts: vec![],
            security: SecurityContext {
                read_only_root: true,
                capabilities: rig.chart.capabilities.clone(),
            },
            network: Network::Namespace(PathBuf::from("/var/run/netns").join(rig.node.name())),
        })
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("vm-dhcp-agent {}", app_version()),
        "{version:?}"
    );

    assert_eq!(rig.addresses(), "", "no address before the agent runs");
    let mut container = rig.start(&rig.chart.capabilities);
    ProcessView::of(&container).assert_context(0, true, &rig.chart.capabilities);
    rig.wait_state(&container, "serving");
    // The server address is set, and UDP 67 is bound to the pool interface (SO_BINDTODEVICE).
    let addrs = rig.addresses();
    assert!(addrs.contains(&format!("inet {SERVER_IP}/24")), "{addrs}");
    assert_eq!(addrs.lines().count(), 1, "{addrs}");
    let sockets = rig.lab.exec(&rig.node, "ss", &["-H", "-uln"]).unwrap();
    assert!(
        sockets.contains(&format!("0.0.0.0%{}:67", rig.interface)),
        "{sockets}"
    );
    // The chart's NET_RAW lets it announce the server address (3 frames, 2 s apart).
    wait_for(
        "the server address announced by ARP",
        Duration::from_secs(20),
        || {
            container
                .log()
                .contains("server address announced")
                .then_some(())
        },
    );
    assert!(
        !container.log().contains("ARP announcements disabled"),
        "{}",
        container.log()
    );

    let client = tempfile::tempdir().unwrap();
    start_dhclient(&mut rig.lab, &rig.vm, client.path());
    let bound = wait_event(client.path(), "BOUND", 0, Duration::from_secs(30));
    assert_eq!(bound["new_ip_address"], VM_IP, "{}", container.log());
    assert_eq!(bound["new_dhcp_server_identifier"], SERVER_IP);
    assert_eq!(bound["new_routers"], "192.0.2.254");

    // SIGTERM reaches the binary as the container's first process: it removes the address and
    // exits 0.
    container.signal("SIGTERM").unwrap();
    let status = container.wait_exit(Duration::from_secs(20));
    assert!(
        status.is_some_and(|s| s.success()),
        "exit {status:?}\n{}",
        container.log()
    );
    assert_eq!(rig.addresses(), "", "server address removed on stop");
}

#[test]
fn the_agent_without_net_admin_fails_naming_the_capability() {
    let rig = AgentRig::new();
    let container = rig.start(&rig.without("NET_ADMIN"));
    let failed = rig.wait_state(&container, "failed");
    let error = failed["error"].as_str().unwrap();
    assert!(
        error.contains("cannot add the server address")
            && error.contains("the agent lacks CAP_NET_ADMIN")
            && error.contains("grant NET_ADMIN"),
        "{error}"
    );
    // The shim copies output to the log on its own schedule: the line may trail the status.
    wait_for("CAP_NET_ADMIN in the log", Duration::from_secs(10), || {
        container.log().contains("CAP_NET_ADMIN").then_some(())
    });
    assert_eq!(rig.addresses(), "");
    rig.assert_no_lease();
}

#[test]
fn the_agent_without_net_bind_service_fails_naming_the_capability() {
    let rig = AgentRig::new();
    // The capability is really needed: this namespace keeps the kernel's default (containerd
    // 1.x and CRI-O do not lower it for pods either).
    let start = rig
        .lab
        .exec(
            &rig.node,
            "cat",
            &["/proc/sys/net/ipv4/ip_unprivileged_port_start"],
        )
        .unwrap();
    assert_eq!(start.trim(), "1024");
    let container = rig.start(&rig.without("NET_BIND_SERVICE"));
    let failed = rig.wait_state(&container, "failed");
    let error = failed["error"].as_str().unwrap();
    assert!(
        error.contains("cannot bind 0.0.0.0:67")
            && error.contains("the agent lacks CAP_NET_BIND_SERVICE")
            && error.contains("grant NET_BIND_SERVICE"),
        "{error}"
    );
    wait_for(
        "CAP_NET_BIND_SERVICE in the log",
        Duration::from_secs(10),
        || {
            container
                .log()
                .contains("CAP_NET_BIND_SERVICE")
                .then_some(())
        },
    );
    rig.assert_no_lease();
}

#[test]
fn the_agent_without_net_raw_serves_without_arp_announcements_naming_the_capability() {
    let mut rig = AgentRig::new();
    let container = rig.start(&rig.without("NET_RAW"));
    rig.wait_state(&container, "serving");
    wait_for("the ARP line in the log", Duration::from_secs(10), || {
        container
            .log()
            .contains("ARP announcements disabled")
            .then_some(())
    });
    let log = container.log();
    assert!(
        log.contains("ARP announcements disabled")
            && log.contains("the agent lacks CAP_NET_RAW")
            && log.contains("grant NET_RAW"),
        "{log}"
    );
    // Not fatal: a real client still gets its reservation.
    let client = tempfile::tempdir().unwrap();
    start_dhclient(&mut rig.lab, &rig.vm, client.path());
    let bound = wait_event(client.path(), "BOUND", 0, Duration::from_secs(30));
    assert_eq!(bound["new_ip_address"], VM_IP, "{}", container.log());
}
