//! What a user installs, running as pods: `helm install` of the chart with its default values
//! (2 controller and 2 agent replicas, TLS, token-authenticated stream, webhook) on a real
//! single-node Kubernetes ([`vmdhcp_integration::node`]: kubelet, containerd, kube-proxy,
//! scheduler, controller-manager), our container images, and VMs that are network namespaces
//! with real `dhclient`s on a NetworkAttachmentDefinition's bridge.
//!
//! One test walks the whole life of an installation, in order: install → webhook → pools and VMs
//! → leases from the agent pod → agent and controller pod deletion → upgrade → the pool made
//! dual-stack (a VM's `dhclient` and `dhclient -6` get both its addresses from the agent pod) →
//! takeover of upstream's agent pod and a config whose VM is gone → RBAC against the API
//! server's audit log → uninstall, and prints a timeline and each pod's memory and restarts. Another moves
//! Harvester's add-on from upstream: one `helm upgrade` of an upstream-shaped release
//! `harvester-vm-dhcp-controller` to this chart, with the add-on example's values, ends with our
//! pods serving every recorded lease and nothing of upstream's left but the CRDs and their
//! objects. A third shows the harness naming a node component that dies, with the tail of its log.
//!
//! The RBAC check: the node's API server logs every request of the release namespace's
//! ServiceAccounts ([`vmdhcp_integration::audit`]), and the test fails naming each
//! (verb, resource) the chart grants the controller or the agent that neither used, and each call
//! that was refused. The steps before it exercise every granted verb, the rare ones included.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use vmdhcp_core::crd::{
    IPPool, LABEL_IPPOOL_NAME, LABEL_IPPOOL_NAMESPACE, VirtualMachineNetworkConfig,
};
use vmdhcp_integration::audit::{self, Access, Comparison};
use vmdhcp_integration::control_plane::repo_root;
use vmdhcp_integration::dhcp_client::{dhclient_lease, start_dhclient, wait_event};
use vmdhcp_integration::dhcp6_client::{
    Client6, Options6, global_addresses, no_dad, set_mac, wait_link_local,
};
use vmdhcp_integration::fleet::{probe_until_leased, vm_manifest};
use vmdhcp_integration::netns::{Lab, Netns};
use vmdhcp_integration::node::{Node, images_dir};
use vmdhcp_integration::process::Supervised;

const RELEASE: &str = "vmdhcp";
const SYSTEM: &str = "vmdhcp-system";
const VMS: &str = "vms";
/// The NAD's bridge, in the node's network namespace; agent pods (through the Multus stand-in)
/// and VM namespaces plug into it.
const BRIDGE: &str = "brvm";
const SERVER_IP: &str = "10.77.0.2";
const VM1_MAC: &str = "02:77:00:00:00:01";
const VM2_MAC: &str = "02:77:00:00:00:02";
const VM3_MAC: &str = "02:77:00:00:00:03";
/// The VM of the dual-stack step.
const VM4_MAC: &str = "02:77:00:00:00:04";
/// vm5, created with upstream v1.9's static-IP annotation.
const VM5_MAC: &str = "02:77:00:00:00:05";
/// vm6, whose NIC a namespace editor's AddressClaim binds.
const VM6_MAC: &str = "02:77:00:00:00:06";
/// vm6 created again, with a new MAC.
const VM6_NEW_MAC: &str = "02:77:00:00:00:07";
/// The IPv6 side net-a gains: a ULA that exists only in the lab, the server at `::2`, DNS at
/// `::53`, addresses from `::100` to `::1ff`.
const V6_PREFIX: &str = "fd76:6d64:6865::";
const V6_CIDR: &str = "fd76:6d64:6865::/112";
const V6_SERVER_IP: &str = "fd76:6d64:6865::2";
const V6_DNS: &str = "fd76:6d64:6865::53";
/// The IPv6 lease time: dhclient -6 renews at half of it, so a renewal happens in the step.
const V6_LEASE_SECONDS: u32 = 20;
/// The pool's lease time: dhclient renews at half of it, so renewals happen during the test.
const LEASE_SECONDS: u64 = 20;
/// How long the kubelet may take to stop a deleted pod before the test calls the node stalled:
/// far more than a working kubelet and the agent's short drain take, within the agent's 30 s
/// grace period.
const KUBELET_STALL: Duration = Duration::from_secs(15);

fn output(cmd: &mut Command) -> (bool, String) {
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

struct Cluster {
    node: Node,
    /// The release's namespace.
    system: &'static str,
}

impl Cluster {
    fn kubectl(&self, args: &[&str]) -> String {
        let (ok, text) = output(self.node.kubectl().args(args));
        assert!(ok, "kubectl {args:?}: {text}");
        text
    }

    /// `kubectl ARGS -o json`, parsed; the error says what kubectl said.
    fn get_json(&self, args: &[&str]) -> Result<Value, String> {
        let out = self
            .node
            .kubectl()
            .args(args)
            .args(["-o", "json"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("kubectl {args:?}: {e}"))?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            return Err(format!("kubectl {args:?}: {stderr}"));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| format!("kubectl {args:?}: {e}"))
    }

    fn json(&self, args: &[&str]) -> Value {
        self.get_json(args).unwrap_or_else(|e| panic!("{e}"))
    }

    fn try_json(&self, args: &[&str]) -> Option<Value> {
        self.get_json(args).ok()
    }

    /// `kubectl apply -f -`; the error text when refused.
    fn apply(&self, manifest: &Value) -> Result<String, String> {
        let mut child = self
            .node
            .kubectl()
            .args(["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(manifest.to_string().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() {
            Ok(text)
        } else {
            Err(text)
        }
    }

    fn helm<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(&self, args: &[S]) -> String {
        let (ok, text) = output(self.node.helm().args(args));
        assert!(ok, "helm {args:?}: {text}\n{}", self.diagnose());
        text
    }

    fn pods(&self, component: &str) -> Vec<Value> {
        let list = self.json(&[
            "get",
            "pods",
            "-n",
            self.system,
            "-l",
            &format!("app.kubernetes.io/component={component},app.kubernetes.io/part-of=vmdhcp"),
        ]);
        list["items"].as_array().cloned().unwrap_or_default()
    }

    /// Names of the component's pods that are Ready and not being deleted.
    fn ready_pods(&self, component: &str) -> Vec<String> {
        self.pods(component)
            .into_iter()
            .filter(|p| {
                p["metadata"]["deletionTimestamp"].is_null()
                    && p["status"]["conditions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
            .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
            .collect()
    }

    /// Deletes a pod of the system namespace and watches, in the background, that the kubelet
    /// stops its processes. The node's kubelet (v1.20 built from source) can go silent and never
    /// kill a deleted pod (docs/tuning.md); that is the node failing, not the product, so if
    /// the pod still runs after [`KUBELET_STALL`] the watch sends its processes SIGTERM itself,
    /// as the kubelet would, and says so. Joining the handle gives when that happened.
    #[allow(clippy::print_stdout)]
    fn delete_pod(&self, pod: &str) -> std::thread::JoinHandle<Option<Instant>> {
        let uid = self.json(&["get", "pod", "-n", self.system, pod])["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        self.kubectl(&["delete", "pod", "-n", self.system, pod, "--wait=false"]);
        let (pod, deleted) = (pod.to_owned(), Instant::now());
        std::thread::spawn(move || {
            let mut killed = None;
            while deleted.elapsed() < KUBELET_STALL * 4 {
                let pids = Node::pod_processes(&uid);
                if pids.is_empty() {
                    break;
                }
                if killed.is_none() && deleted.elapsed() > KUBELET_STALL {
                    println!(
                        "NODE STALLED: the kubelet did not stop deleted pod {pod} within \
                         {KUBELET_STALL:?}; sending SIGTERM to its processes {pids:?}"
                    );
                    for pid in &pids {
                        let _ = Command::new("kill")
                            .args(["-TERM", &pid.to_string()])
                            .status();
                    }
                    killed = Some(Instant::now());
                }
                std::thread::sleep(Duration::from_millis(250));
            }
            killed
        })
    }

    fn lease_holder(&self, lease: &str) -> Option<String> {
        self.try_json(&["get", "lease", "-n", self.system, lease])?["spec"]["holderIdentity"]
            .as_str()
            .map(str::to_owned)
    }

    /// The agent leader once it is not `old` (deleted: it releases the Lease on its way out).
    fn new_agent_leader(&self, old: &str) -> String {
        self.wait("a new agent leader", Duration::from_secs(60), || {
            self.lease_holder("vm-dhcp-agents")
                .filter(|h| !h.is_empty() && h != old)
        })
    }

    /// A metric of a pod, read through the API server's pod proxy.
    fn pod_metrics(&self, pod: &str) -> String {
        let (_, text) = output(self.node.kubectl().args([
            "get",
            "--raw",
            &format!(
                "/api/v1/namespaces/{}/pods/{pod}:8080/proxy/metrics",
                self.system
            ),
        ]));
        text
    }

    /// The controller pod whose log shows `agent` opening its config stream (last one wins).
    fn stream_replica(&self, agent: &str) -> Option<String> {
        let mut found = None;
        for pod in self.ready_pods("controller") {
            let (_, logs) = output(self.node.kubectl().args(["logs", "-n", self.system, &pod]));
            if logs
                .lines()
                .any(|l| l.contains("agent watching") && l.contains(agent))
            {
                found = Some(pod);
            }
        }
        found
    }

    fn allocations(&self) -> BTreeMap<String, String> {
        self.pool_allocations("net-a")
    }

    /// MAC → address, from the pool's `status.ipv4.allocated`.
    fn pool_allocations(&self, pool: &str) -> BTreeMap<String, String> {
        self.family_allocations(pool, "ipv4")
    }

    /// MAC → address, from the pool's `status.<family>.allocated` (`ipv4`, `ipv6`).
    fn family_allocations(&self, pool: &str, family: &str) -> BTreeMap<String, String> {
        self.try_json(&["get", "ippool", "-n", VMS, pool])
            .and_then(|p| {
                p["status"][family]["allocated"].as_object().map(|m| {
                    m.iter()
                        .filter_map(|(ip, mac)| Some((mac.as_str()?.to_owned(), ip.clone())))
                        .collect()
                })
            })
            .unwrap_or_default()
    }

    fn condition(&self, kind: &str, name: &str, condition: &str) -> Option<(String, String)> {
        let obj = self.try_json(&["get", kind, "-n", VMS, name])?;
        obj["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == condition)
            .map(|c| {
                (
                    c["status"].as_str().unwrap_or_default().to_owned(),
                    c["reason"].as_str().unwrap_or_default().to_owned(),
                )
            })
    }

    /// What helps when a step fails: pods, recent events, the tails of the node's logs.
    fn diagnose(&self) -> String {
        let (_, pods) = output(
            self.node
                .kubectl()
                .args(["get", "pods", "-A", "-o", "wide"]),
        );
        let (_, events) =
            output(
                self.node
                    .kubectl()
                    .args(["get", "events", "-A", "--sort-by=.lastTimestamp"]),
            );
        let events: Vec<&str> = events.lines().collect();
        let mut text = format!(
            "--- pods\n{pods}--- last events\n{}\n",
            events[events.len().saturating_sub(30)..].join("\n")
        );
        for pod in self.pods("controller").iter().chain(&self.pods("agent")) {
            if let Some(name) = pod["metadata"]["name"].as_str() {
                let (_, logs) = output(self.node.kubectl().args([
                    "logs",
                    "-n",
                    self.system,
                    name,
                    "--tail=15",
                ]));
                text.push_str(&format!("--- logs of {name}\n{logs}\n"));
            }
        }
        let (_, disk) = output(Command::new("df").arg("-h").arg(self.node.dir()));
        text.push_str(&format!(
            "--- disk of the node\n{disk}--- kubelet\n{}\n",
            self.node.log_tail("kubelet", 15)
        ));
        text
    }

    /// Waits for the next RENEW (or REBIND) of the dhclient recording into `dir`, which must keep
    /// `address`.
    fn wait_renewal(&self, what: &str, dir: &Path, address: &str) {
        let before = vmdhcp_integration::dhcp_client::events(dir).len();
        let renewed = self.wait(what, Duration::from_secs(LEASE_SECONDS * 2), || {
            vmdhcp_integration::dhcp_client::events(dir)[before..]
                .iter()
                .find(|(name, _)| name == "RENEW" || name == "REBIND")
                .map(|(_, env)| env.clone())
        });
        assert_eq!(renewed["new_ip_address"], address, "{renewed:?}");
    }

    fn wait<T>(&self, what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + limit;
        loop {
            if let Err(e) = self.node.check() {
                panic!("waiting for {what}: {e}");
            }
            if let Some(v) = f() {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {limit:?} waiting for {what}\n{}",
                self.diagnose()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

/// net-a made dual-stack: [`pool_manifest`] with an `ipv6Config`.
fn dual_stack_pool_manifest() -> Value {
    let mut pool = pool_manifest(SERVER_IP);
    pool["spec"]["ipv6Config"] = json!({
        "serverIP": V6_SERVER_IP, "cidr": V6_CIDR,
        "pool": {"start": format!("{V6_PREFIX}100"), "end": format!("{V6_PREFIX}1ff")},
        "router": format!("{V6_PREFIX}1"), "dns": [V6_DNS], "leaseTime": V6_LEASE_SECONDS
    });
    pool
}

fn pool_manifest(server_ip: &str) -> Value {
    json!({
        "apiVersion": "network.harvesterhci.io/v1alpha1", "kind": "IPPool",
        "metadata": {"name": "net-a", "namespace": VMS},
        "spec": {"networkName": format!("{VMS}/net-a"), "ipv4Config": {
            "serverIP": server_ip, "cidr": "10.77.0.0/24",
            "pool": {"start": "10.77.0.50", "end": "10.77.0.99"},
            "router": "10.77.0.1", "dns": ["10.77.0.53"], "leaseTime": LEASE_SECONDS
        }}
    })
}

/// A VM: a namespace whose `eth0` (MAC `mac`) is plugged into the NAD's bridge on the node.
fn plug_vm(lab: &mut Lab, node_ns: &Netns, name: &str, mac: &str) -> Netns {
    let ns = lab.netns(name).unwrap();
    lab.plug(node_ns, BRIDGE, &format!("p{name}"), &ns, "eth0")
        .unwrap();
    lab.exec(&ns, "ip", &["link", "set", "eth0", "address", mac])
        .unwrap();
    ns
}

/// Each pod's working-set memory and restarts, from the kubelet's summary API.
fn pod_figures(c: &Cluster) -> Vec<(String, u64, u64)> {
    let summary: Value = serde_json::from_str(&c.kubectl(&[
        "get",
        "--raw",
        "/api/v1/nodes/node1/proxy/stats/summary",
    ]))
    .unwrap();
    let mut out = Vec::new();
    for component in ["controller", "agent"] {
        for pod in c.pods(component) {
            if !pod["metadata"]["deletionTimestamp"].is_null() {
                continue; // an old replica on its way out
            }
            let name = pod["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let restarts = pod["status"]["containerStatuses"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s["restartCount"].as_u64())
                .sum();
            // The container's own figure (the pod's adds the pause container).
            let working_set = summary["pods"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["podRef"]["name"] == name.as_str())
                .and_then(|p| p["containers"].as_array().cloned())
                .into_iter()
                .flatten()
                .filter_map(|c| c["memory"]["workingSetBytes"].as_u64())
                .sum();
            out.push((name, working_set, restarts));
        }
    }
    out
}

/// One node at a time: two would compete for the 2 cores, and kubelet's kernel settings are
/// saved and restored per node.
static ONE_NODE: Mutex<()> = Mutex::new(());

fn start_node() -> Node {
    Node::start(
        &images_dir(),
        Path::new(env!("CARGO_BIN_EXE_vmdhcp-multus-standin")),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// The node, its API server logging every request of the release namespace's ServiceAccounts.
fn start_audited_node() -> Node {
    Node::start_audited(
        &images_dir(),
        Path::new(env!("CARGO_BIN_EXE_vmdhcp-multus-standin")),
        &audit::service_account_policy(SYSTEM),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// The label upstream's Go controller puts on its per-pool agent pods.
const LABEL_UPSTREAM_AGENT: &str = "network.harvesterhci.io/vm-dhcp-controller";

/// Granted permissions the suite cannot make a binary use yet, each with why; printed when
/// unused, never failed. Keep it minimal: a verb that can be exercised belongs in the steps.
fn rbac_exemptions() -> Vec<(&'static str, Access, &'static str)> {
    // None today: every granted verb is exercised by the steps above.
    Vec::new()
}

impl Cluster {
    /// A kube client (admin) for the steps that write status subresources, which kubectl 1.20
    /// cannot patch.
    fn client(&self, rt: &tokio::runtime::Runtime) -> kube::Client {
        rt.block_on(async {
            let kubeconfig = kube::config::Kubeconfig::read_from(self.node.kubeconfig()).unwrap();
            let config = kube::Config::from_custom_kubeconfig(
                kubeconfig,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .unwrap();
            kube::Client::try_from(config).unwrap()
        })
    }

    /// Sets the pool's `status.agentPodRef` (upstream's reference to its agent pod), as
    /// upstream's Go controller left it.
    fn set_agent_pod_ref(&self, rt: &tokio::runtime::Runtime, client: &kube::Client, r: Value) {
        let pools: kube::Api<IPPool> = kube::Api::namespaced(client.clone(), VMS);
        let patch = json!({"status": {"agentPodRef": r}});
        rt.block_on(pools.patch_status(
            "net-a",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        ))
        .unwrap();
    }

    fn agent_pod_ref(&self) -> Option<Value> {
        let pool = self.try_json(&["get", "ippool", "-n", VMS, "net-a"])?;
        Some(pool["status"]["agentPodRef"].clone()).filter(|r| !r.is_null())
    }

    fn wait_agent_ready(&self) {
        self.wait("AgentReady=True", Duration::from_secs(120), || {
            (self.condition("ippool", "net-a", "AgentReady")?.0 == "True").then_some(())
        });
    }

    /// The audit log's events so far.
    fn audit_events(&self) -> Vec<audit::Event> {
        audit::read_log(&self.node.audit_log()).unwrap_or_else(|e| panic!("{e}"))
    }

    /// How many requests of ServiceAccount `sa` of the release have used `access` so far.
    fn uses(&self, sa: &str, access: &Access) -> usize {
        audit::uses(
            &self.audit_events(),
            &audit::service_account_user(SYSTEM, sa),
            access,
        )
    }
}

/// The rare verbs the chart grants, used as in a real cluster: upstream's agent pod retired
/// (pods get and delete), a repeated event (its series patched), a config whose VM is gone
/// (virtualmachines get, virtualmachinenetworkconfigs delete), and a status write that conflicts
/// (ippools/status get, the re-read).
#[allow(clippy::print_stdout)]
fn exercise_rare_permissions(c: &Cluster) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = c.client(&rt);
    c.wait_agent_ready();

    // Upstream's agent pod for net-a, in the namespace upstream ran in (here the release's: the
    // default of controller.upstreamAgentNamespaces), named by the pool's agentPodRef.
    let pod = "upstream-net-a-agent";
    c.apply(&json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod, "namespace": SYSTEM, "labels": {
            LABEL_UPSTREAM_AGENT: "agent", LABEL_IPPOOL_NAMESPACE: VMS, LABEL_IPPOOL_NAME: "net-a"}},
        "spec": {"terminationGracePeriodSeconds": 0, "containers": [{"name": "agent",
            "image": "registry.k8s.io/pause:3.6", "imagePullPolicy": "Never"}]}
    }))
    .unwrap();
    let uid = c.json(&["get", "pod", "-n", SYSTEM, pod])["metadata"]["uid"].clone();
    c.set_agent_pod_ref(
        &rt,
        &client,
        json!({"namespace": SYSTEM, "name": pod, "uid": uid, "image": "upstream:agent"}),
    );
    c.wait(
        "upstream's agent pod deleted and agentPodRef cleared",
        Duration::from_secs(60),
        || {
            let pod = c.try_json(&["get", "pod", "-n", SYSTEM, pod]);
            let deleted = pod.is_none_or(|p| !p["metadata"]["deletionTimestamp"].is_null());
            (deleted && c.agent_pod_ref().is_none()).then_some(())
        },
    );
    // A reference to a pod that is gone, twice: the second event continues the first's series.
    for _ in 0..2 {
        c.set_agent_pod_ref(
            &rt,
            &client,
            json!({"namespace": SYSTEM, "name": "upstream-gone-agent"}),
        );
        c.wait(
            "a stale agentPodRef cleared",
            Duration::from_secs(60),
            || c.agent_pod_ref().is_none().then_some(()),
        );
    }
    let series = Access::new("patch", "events.k8s.io", "events");
    c.wait(
        "the repeated event's series patched",
        Duration::from_secs(30),
        || (c.uses("vmdhcp-controller", &series) > 0).then_some(()),
    );

    // A config whose VM is gone. Its owner is named under an API version this node does not
    // serve, so the node's garbage collector cannot act on it and the controller's stand-in for
    // it (clusters without KubeVirt's) does: it reads the VM, finds none, deletes the config.
    c.apply(&json!({
        "apiVersion": "network.harvesterhci.io/v1alpha1", "kind": "VirtualMachineNetworkConfig",
        "metadata": {"name": "vm-gone", "namespace": VMS, "ownerReferences": [{
            "apiVersion": "kubevirt.io/v1alpha3", "kind": "VirtualMachine", "name": "vm-gone",
            "uid": "00000000-0000-0000-0000-00000000dead"}]},
        "spec": {"vmName": "vm-gone", "networkConfigs": []}
    }))
    .unwrap();
    c.wait(
        "the config of a VM that is gone deleted",
        Duration::from_secs(60),
        || {
            c.try_json(&["get", "virtualmachinenetworkconfig", "-n", VMS, "vm-gone"])
                .is_none()
                .then_some(())
        },
    );

    // A status write that conflicts: someone else (here the test) keeps rewriting the pool's
    // conditions while the controller writes them back from a version that is already stale, so
    // it reads the status again (counted from here: other paths may read it too).
    let reread = Access::new("get", "network.harvesterhci.io", "ippools/status");
    let before = c.uses("vmdhcp-controller", &reread);
    let pools: kube::Api<IPPool> = kube::Api::namespaced(client.clone(), VMS);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut writes = 0;
    while c.uses("vmdhcp-controller", &reread) == before {
        assert!(
            Instant::now() < deadline,
            "the controller never re-read a pool's status after {writes} conflicting writes"
        );
        rt.block_on(async {
            for _ in 0..50 {
                let patch = json!({"status": {"conditions": []}});
                let params = kube::api::PatchParams::default();
                pools
                    .patch_status("net-a", &params, &kube::api::Patch::Merge(&patch))
                    .await
                    .unwrap();
                writes += 1;
            }
        });
    }
    println!("status re-read seen ({writes} conflicting writes)");
    c.wait_agent_ready();
}

impl Cluster {
    /// The status of `vm`'s NIC `mac` in its VirtualMachineNetworkConfig.
    fn nic_status(&self, vm: &str, mac: &str) -> Option<Value> {
        let config = self.try_json(&["get", "virtualmachinenetworkconfig", "-n", VMS, vm])?;
        config["status"]["networkConfigs"]
            .as_array()?
            .iter()
            .find(|n| n["macAddress"] == mac)
            .cloned()
    }

    /// `ip -6 -o addr show` in the network namespace of agent pod `pod`.
    fn agent_pod_ipv6(&self, pod: &str) -> String {
        self.in_pod_netns(pod, &["ip", "-6", "-o", "addr", "show"])
    }

    /// The output of `cmd` run in the network namespace of pod `pod` of the release's namespace
    /// (entered through one of its processes); fails unless it succeeds.
    fn in_pod_netns(&self, pod: &str, cmd: &[&str]) -> String {
        let uid = self.json(&["get", "pod", "-n", self.system, pod])["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let pid = Node::pod_processes(&uid)
            .first()
            .copied()
            .unwrap_or_else(|| panic!("no process of pod {pod}"));
        let (ok, text) = output(
            Command::new("nsenter")
                .args(["-t", &pid.to_string(), "-n"])
                .args(cmd),
        );
        assert!(ok, "{cmd:?} in pod {pod}: {text}");
        text
    }

    /// The pool interfaces of agent pod `pod` (its Multus selection) with their IPv6 settings
    /// `accept_ra`, `autoconf`, `accept_redirects` and `proxy_ndp`, as its network namespace
    /// has them.
    fn agent_pod_ipv6_settings(&self, pod: &str) -> BTreeMap<String, Vec<String>> {
        let annotation =
            self.json(&["get", "pod", "-n", self.system, pod])["metadata"]["annotations"]
                [vmdhcp_core::bootstrap::MULTUS_NETWORKS_ANNOTATION]
                .as_str()
                .unwrap_or_default()
                .to_owned();
        let interfaces = vmdhcp_core::bootstrap::multus_interfaces(&annotation)
            .unwrap_or_else(|e| panic!("agent pod {pod}'s Multus selection: {e}"));
        interfaces
            .into_iter()
            .map(|interface| {
                let files: Vec<String> = ["accept_ra", "autoconf", "accept_redirects", "proxy_ndp"]
                    .iter()
                    .map(|s| format!("/proc/sys/net/ipv6/conf/{interface}/{s}"))
                    .collect();
                let mut cmd = vec!["cat"];
                cmd.extend(files.iter().map(String::as_str));
                let values = self
                    .in_pod_netns(pod, &cmd)
                    .split_whitespace()
                    .map(str::to_owned)
                    .collect();
                (interface, values)
            })
            .collect()
    }
}

/// net-a becomes dual-stack (its `ipv6Config` added to the running pool): every NIC of the
/// pool is allocated an IPv6 address as well, recorded in the pool's `status.ipv6.allocated`
/// and in its config's `allocatedIPv6Address`; a new VM's `dhclient` and `dhclient -6` get the
/// VM's two recorded addresses from the agent pod, with the pool's DNS server, lifetimes and
/// server DUID. The agent Deployment rolls (its bootstrap now names the IPv6 server address);
/// the new leader, a pod started after the VM bound, holds the IPv6 server address on its pool
/// interface (the standby does not) and answers both clients' renewals with the same addresses.
#[allow(clippy::print_stdout)]
fn dual_stack_vm_gets_both_addresses(c: &Cluster, lab: &mut Lab, node_ns: &Netns, dir: &Path) {
    let started = Instant::now();
    let agents_before = c.ready_pods("agent");
    c.apply(&dual_stack_pool_manifest()).unwrap();
    c.apply(&vm_manifest(VMS, "vm4", VM4_MAC, &format!("{VMS}/net-a")))
        .unwrap();
    let macs = [VM1_MAC, VM2_MAC, VM3_MAC, VM4_MAC];
    let (v4, v6) = c.wait(
        "every NIC of net-a allocated an IPv6 address",
        Duration::from_secs(60),
        || {
            let (v4, v6) = (
                c.family_allocations("net-a", "ipv4"),
                c.family_allocations("net-a", "ipv6"),
            );
            macs.iter()
                .all(|m| v4.contains_key(*m) && v6.contains_key(*m))
                .then_some((v4, v6))
        },
    );
    for mac in macs {
        let ip: std::net::Ipv6Addr = v6[mac].parse().unwrap();
        let range = |last: &str| {
            u128::from(
                format!("{V6_PREFIX}{last}")
                    .parse::<std::net::Ipv6Addr>()
                    .unwrap(),
            )
        };
        assert!(
            (range("100")..=range("1ff")).contains(&u128::from(ip)),
            "{mac}: {ip} outside the pool's IPv6 range"
        );
    }
    let distinct: std::collections::BTreeSet<&String> = v6.values().collect();
    assert_eq!(
        distinct.len(),
        v6.len(),
        "an IPv6 address given twice: {v6:?}"
    );
    for (vm, mac) in [
        ("vm1", VM1_MAC),
        ("vm2", VM2_MAC),
        ("vm3", VM3_MAC),
        ("vm4", VM4_MAC),
    ] {
        let recorded = c.wait(
            &format!("{vm}'s config to record both addresses"),
            Duration::from_secs(60),
            || {
                let nic = c.nic_status(vm, mac)?;
                let both = (
                    nic["allocatedIPAddress"].as_str()?.to_owned(),
                    nic["allocatedIPv6Address"].as_str()?.to_owned(),
                );
                Some(both)
            },
        );
        assert_eq!(recorded, (v4[mac].clone(), v6[mac].clone()), "{vm}");
    }

    // vm4: duplicate address detection off before its link exists, so that its link-local
    // address (DHCPv6's source) is usable at once; a dhclient for each family.
    let vm4 = lab.netns("vm4").unwrap();
    no_dad(lab, &vm4);
    lab.plug(node_ns, BRIDGE, "pvm4", &vm4, "eth0").unwrap();
    set_mac(lab, &vm4, "eth0", VM4_MAC);
    wait_link_local(lab, &vm4, "eth0", Duration::from_secs(5));
    let vm4_dir = dir.join("vm4");
    std::fs::create_dir_all(&vm4_dir).unwrap();
    let dhcp_started = Instant::now();
    start_dhclient(lab, &vm4, &vm4_dir);
    let client6 = Client6::dhclient(&vm4, "eth0", Options6::default());
    let bound = wait_event(&vm4_dir, "BOUND", 0, Duration::from_secs(60));
    assert_eq!(bound["new_ip_address"], v4[VM4_MAC], "{bound:?}");
    assert_eq!(bound["new_routers"], "10.77.0.1", "{bound:?}");
    let lease6 = client6.wait_lease("BOUND6", 0, Duration::from_secs(60));
    println!(
        "vm4 bound {} and {} {:.1} s after its clients started",
        v4[VM4_MAC],
        lease6.address,
        dhcp_started.elapsed().as_secs_f64()
    );
    assert_eq!(lease6.address.to_string(), v6[VM4_MAC], "{lease6:?}");
    assert_eq!(
        lease6.dns,
        [V6_DNS.parse::<std::net::Ipv6Addr>().unwrap()],
        "{lease6:?}"
    );
    assert_eq!(
        (lease6.preferred, lease6.valid),
        (V6_LEASE_SECONDS, V6_LEASE_SECONDS),
        "{lease6:?}"
    );
    let pool: vmdhcp_core::NamespacedName = format!("{VMS}/net-a").parse().unwrap();
    let duid: String = vmdhcp_core::pool::duid::server_duid(&pool)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(lease6.server_id, duid, "the pool's server DUID: {lease6:?}");
    assert!(
        global_addresses(lab, &vm4, "eth0").contains(&lease6.address),
        "{lease6:?} not on vm4's eth0"
    );

    // The agents roll; the new leader holds the IPv6 server address on its pool interface, the
    // standby does not.
    let leader = c.wait(
        "the agent Deployment to roll, a new pod leading",
        Duration::from_secs(180),
        || {
            let ready = c.ready_pods("agent");
            let leader = c.lease_holder("vm-dhcp-agents")?;
            (ready.len() == 2
                && ready.iter().all(|p| !agents_before.contains(p))
                && ready.contains(&leader))
            .then_some(leader)
        },
    );
    let rolled = Instant::now();
    let server = format!("inet6 {V6_SERVER_IP}/112 ");
    let addresses = c.wait(
        "the new agent leader to configure the IPv6 server address",
        Duration::from_secs(30),
        || {
            let text = c.agent_pod_ipv6(&leader);
            text.contains(&server).then_some(text)
        },
    );
    println!("IPv6 addresses in the leading agent pod {leader}:\n{addresses}");

    // Neither agent pod takes routing from its pool interface: the chart's init container set
    // the IPv6 host settings there before the agent started (the kernel's defaults in a new
    // network namespace are accept_ra, autoconf and accept_redirects 1), and the leader reports
    // them held.
    for pod in c.ready_pods("agent") {
        let settings = c.agent_pod_ipv6_settings(&pod);
        assert!(
            !settings.is_empty(),
            "agent pod {pod} has no pool interface"
        );
        for (interface, values) in &settings {
            assert_eq!(
                values,
                &["0", "0", "0", "0"],
                "agent pod {pod}, {interface}: accept_ra, autoconf, accept_redirects, proxy_ndp"
            );
        }
    }
    let held = c.wait(
        "the leader to report its pool interface's IPv6 host settings held",
        Duration::from_secs(30),
        || {
            let metrics = c.pod_metrics(&leader);
            metrics
                .lines()
                .find(|l| {
                    l.starts_with("vmdhcp_agent_ipv6_host_settings{")
                        && l.contains(&format!("pool=\"{VMS}/net-a\""))
                })
                .map(str::to_owned)
        },
    );
    assert!(held.ends_with(" 1"), "{held}");
    for standby in c.ready_pods("agent").iter().filter(|p| **p != leader) {
        let text = c.agent_pod_ipv6(standby);
        assert!(
            !text.contains(&server),
            "standby {standby} holds the IPv6 server address:\n{text}"
        );
    }

    // Both clients renew with the new leader, on the same addresses (the server DUID is the
    // pool's, so the new leader answers RENEWs naming it).
    let renewals6 = client6
        .event_names()
        .iter()
        .filter(|e| *e == "RENEW6" || *e == "REBIND6")
        .count();
    let renewed6 = c.wait(
        "vm4's dhclient -6 to renew with the new leader",
        Duration::from_secs(u64::from(V6_LEASE_SECONDS) * 2),
        || {
            client6
                .events()
                .into_iter()
                .filter(|(e, _)| e == "RENEW6" || e == "REBIND6")
                .nth(renewals6)
        },
    );
    let renewed = vmdhcp_integration::dhcp6_client::Lease6::from_event(&renewed6.1)
        .unwrap_or_else(|| panic!("{} without an address: {:?}", renewed6.0, renewed6.1));
    assert_eq!(
        (
            renewed6.0.as_str(),
            renewed.address,
            renewed.server_id.as_str()
        ),
        ("RENEW6", lease6.address, duid.as_str()),
        "{renewed:?}"
    );
    c.wait_renewal(
        "vm4's dhclient to renew with the new leader",
        &vm4_dir,
        &v4[VM4_MAC],
    );
    println!(
        "net-a dual-stack: every NIC allocated an IPv6 address, vm4 bound both families, the \
         agents rolled and vm4 renewed both with the new leader: {:.1} s (roll done after \
         {:.1} s, renewals {:.1} s later)",
        started.elapsed().as_secs_f64(),
        (rolled - started).as_secs_f64(),
        rolled.elapsed().as_secs_f64()
    );
}

/// vm5 is created with upstream v1.9's `static-ip.harvesterhci.io/nic-0` annotation: its
/// `dhclient` is given that address by the agent pod; the annotation changed, its next lease
/// has the new one (the renewal of the old address is refused, and the client asks again).
#[allow(clippy::print_stdout)]
fn pinned_vm_gets_its_address_and_a_new_pin_at_its_next_lease(
    c: &Cluster,
    lab: &mut Lab,
    node_ns: &Netns,
    dir: &Path,
) {
    const PIN: &str = "10.77.0.90";
    const NEW_PIN: &str = "10.77.0.91";
    let mut manifest = vm_manifest(VMS, "vm5", VM5_MAC, &format!("{VMS}/net-a"));
    manifest["metadata"]["annotations"] = json!({"static-ip.harvesterhci.io/nic-0": PIN});
    c.apply(&manifest).unwrap();
    c.wait("vm5 allocated its pin", Duration::from_secs(60), || {
        (c.allocations().get(VM5_MAC).map(String::as_str) == Some(PIN)).then_some(())
    });
    let vm5 = plug_vm(lab, node_ns, "vm5", VM5_MAC);
    let vm5_dir = dir.join("vm5");
    std::fs::create_dir_all(&vm5_dir).unwrap();
    start_dhclient(lab, &vm5, &vm5_dir);
    let bound = wait_event(&vm5_dir, "BOUND", 0, Duration::from_secs(60));
    assert_eq!(bound["new_ip_address"], PIN, "{bound:?}");

    let before = vmdhcp_integration::dhcp_client::events(&vm5_dir).len();
    let changed = Instant::now();
    c.kubectl(&[
        "annotate",
        "--overwrite",
        "virtualmachines.kubevirt.io",
        "-n",
        VMS,
        "vm5",
        &format!("static-ip.harvesterhci.io/nic-0={NEW_PIN}"),
    ]);
    c.wait("vm5 moved to its new pin", Duration::from_secs(60), || {
        (c.allocations().get(VM5_MAC).map(String::as_str) == Some(NEW_PIN)).then_some(())
    });
    let (event, _) = c.wait(
        "vm5's next lease to have its new pin",
        Duration::from_secs(LEASE_SECONDS * 3),
        || {
            vmdhcp_integration::dhcp_client::events(&vm5_dir)[before..]
                .iter()
                .find(|(_, env)| env.get("new_ip_address").map(String::as_str) == Some(NEW_PIN))
                .cloned()
        },
    );
    println!(
        "vm5: {event} with its new pin {NEW_PIN} {:.1} s after the annotation changed",
        changed.elapsed().as_secs_f64()
    );
}

/// A namespace's editor (a user bound to the built-in `edit` role, impersonated) claims an
/// address for a VM's NIC: the chart's aggregated role lets them, and nothing lets them edit the
/// IPPool. The pool admits the namespace by label (the controller reads the namespace's labels);
/// the claim holds an address before the VM exists; the VM's dhclient then gets exactly it from
/// the agent pod; the VM deleted, the address stays held, and the VM created again with a new
/// MAC leases it again; made `Delete`, the claim goes with the VM (the garbage collector) and the
/// address is free.
#[allow(clippy::print_stdout)]
fn an_editor_s_claim_holds_an_address_its_vm_then_leases(
    c: &Cluster,
    lab: &mut Lab,
    node_ns: &Netns,
    dir: &Path,
) {
    c.kubectl(&[
        "label",
        "--overwrite",
        "namespace",
        VMS,
        "vmdhcp.io/claims=allowed",
    ]);
    let rule = json!({"spec": {"claims": {
        "namespaceSelector": {"matchLabels": {"vmdhcp.io/claims": "allowed"}},
        "perNamespace": {"ipv4": 4, "ipv6": 4}}}});
    c.kubectl(&[
        "patch",
        "ippool",
        "-n",
        VMS,
        "net-a",
        "--type",
        "merge",
        "-p",
        &rule.to_string(),
    ]);
    c.kubectl(&[
        "create",
        "rolebinding",
        "tenant-edit",
        "-n",
        VMS,
        "--clusterrole",
        "edit",
        "--user",
        "tenant",
    ]);
    let claim = json!({
        "apiVersion": "ipam.vmdhcp.io/v1alpha1", "kind": "AddressClaim",
        "metadata": {"name": "vm6-nic", "namespace": VMS},
        "spec": {"network": format!("{VMS}/net-a"), "vm": "vm6", "nic": "nic-0"}
    });
    // The aggregation controller adds the chart's rules to `edit` shortly after install.
    c.wait(
        "a namespace editor allowed to claim",
        Duration::from_secs(60),
        || {
            let (ok, _) = output(
                c.node
                    .kubectl()
                    .args(["auth", "can-i", "create", "addressclaims.ipam.vmdhcp.io"])
                    .args(["-n", VMS, "--as", "tenant"]),
            );
            ok.then_some(())
        },
    );
    let manifest = claim.to_string();
    let mut create = c.node.kubectl();
    create
        .args(["create", "--as", "tenant", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = create.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(manifest.as_bytes())
        .unwrap();
    let done = child.wait_with_output().unwrap();
    assert!(
        done.status.success(),
        "the editor's claim: {}",
        String::from_utf8_lossy(&done.stderr)
    );
    let (edited, said) = output(c.node.kubectl().args([
        "patch",
        "ippool",
        "-n",
        VMS,
        "net-a",
        "--as",
        "tenant",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"paused":true}}"#,
    ]));
    assert!(
        !edited && said.contains("forbidden"),
        "an editor edited the pool: {said}"
    );

    let held = c.wait("the claim Reserved", Duration::from_secs(60), || {
        let claim = c.try_json(&["get", "addressclaims.ipam.vmdhcp.io", "-n", VMS, "vm6-nic"])?;
        let status = &claim["status"];
        (status["phase"] == "Reserved").then(|| {
            (
                status["ipAddress"].as_str().unwrap_or_default().to_owned(),
                status["ipv6Address"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
    });
    assert!(!held.0.is_empty() && !held.1.is_empty(), "{held:?}");
    c.apply(&vm_manifest(VMS, "vm6", VM6_MAC, &format!("{VMS}/net-a")))
        .unwrap();
    c.wait(
        "vm6's NIC bound to the claim",
        Duration::from_secs(60),
        || (c.allocations().get(VM6_MAC) == Some(&held.0)).then_some(()),
    );
    let vm6 = plug_vm(lab, node_ns, "vm6", VM6_MAC);
    let vm6_dir = dir.join("vm6");
    std::fs::create_dir_all(&vm6_dir).unwrap();
    start_dhclient(lab, &vm6, &vm6_dir);
    let bound = wait_event(&vm6_dir, "BOUND", 0, Duration::from_secs(60));
    assert_eq!(bound["new_ip_address"], held.0, "{bound:?}");
    println!(
        "vm6: leased {} (IPv6 {}), the address its namespace's editor claimed",
        held.0, held.1
    );
    // Deleted (`Retain`): the address stays held, for nobody; vm6 created again with a new MAC
    // leases it again. The deleted guest is gone from the network (its link down): one still
    // answering ARP for the address would be a conflict the agent's probe finds.
    c.kubectl(&["delete", "virtualmachines.kubevirt.io", "-n", VMS, "vm6"]);
    lab.exec(&vm6, "ip", &["link", "set", "eth0", "down"])
        .unwrap();
    c.wait(
        "the claim's address held for nobody",
        Duration::from_secs(60),
        || {
            c.allocations()
                .iter()
                .any(|(mac, ip)| mac.starts_with("06:c1:") && *ip == held.0)
                .then_some(())
        },
    );
    c.wait("vm6's config gone", Duration::from_secs(60), || {
        c.try_json(&["get", "virtualmachinenetworkconfig", "-n", VMS, "vm6"])
            .is_none()
            .then_some(())
    });
    c.apply(&vm_manifest(
        VMS,
        "vm6",
        VM6_NEW_MAC,
        &format!("{VMS}/net-a"),
    ))
    .unwrap();
    let again = plug_vm(lab, node_ns, "vm6b", VM6_NEW_MAC);
    let again_dir = dir.join("vm6b");
    std::fs::create_dir_all(&again_dir).unwrap();
    start_dhclient(lab, &again, &again_dir);
    let bound = wait_event(&again_dir, "BOUND", 0, Duration::from_secs(60));
    assert_eq!(bound["new_ip_address"], held.0, "{bound:?}");
    println!(
        "vm6 created again with MAC {VM6_NEW_MAC}: leased {} again",
        held.0
    );
    // `reclaimPolicy: Delete` (an admin's edit): the VM becomes the claim's owner, and the
    // node's garbage collector deletes the claim with it; the finalizer frees the address.
    c.kubectl(&[
        "patch",
        "addressclaims.ipam.vmdhcp.io",
        "-n",
        VMS,
        "vm6-nic",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"reclaimPolicy":"Delete"}}"#,
    ]);
    c.wait("the claim owned by vm6", Duration::from_secs(60), || {
        let claim = c.try_json(&["get", "addressclaims.ipam.vmdhcp.io", "-n", VMS, "vm6-nic"])?;
        claim["metadata"]["ownerReferences"]
            .as_array()?
            .iter()
            .any(|o| o["kind"] == "VirtualMachine" && o["name"] == "vm6")
            .then_some(())
    });
    c.kubectl(&[
        "delete",
        "virtualmachines.kubevirt.io",
        "-n",
        VMS,
        "vm6",
        "--wait=false",
    ]);
    c.wait(
        "vm6's claim deleted with it and its address freed",
        Duration::from_secs(90),
        || {
            let gone = c
                .try_json(&["get", "addressclaims.ipam.vmdhcp.io", "-n", VMS, "vm6-nic"])
                .is_none();
            let freed = !c.allocations().values().any(|ip| *ip == held.0);
            (gone && freed).then_some(())
        },
    );
}

/// Compares, for the controller's and the agent's ServiceAccounts, the (verb, resource) pairs
/// their RBAC rules grant (read from the cluster) with what the audit log shows them using and
/// being refused; fails naming each mismatch.
#[allow(clippy::print_stdout)]
fn check_rbac_against_audit(c: &Cluster) {
    let rbac = c.json(&[
        "get",
        "clusterroles,clusterrolebindings,roles,rolebindings",
        "--all-namespaces",
    ]);
    let objects = rbac["items"].as_array().cloned().unwrap_or_default();
    let events = c.audit_events();
    let exemptions = rbac_exemptions();
    let mut report = String::new();
    let mut clean = true;
    for sa in ["vmdhcp-controller", "vmdhcp-agent"] {
        let granted = audit::granted(&objects, SYSTEM, sa);
        assert!(!granted.is_empty(), "no RBAC rule bound to {SYSTEM}/{sa}");
        let usage = audit::usage(&events, &audit::service_account_user(SYSTEM, sa));
        let exempt: Vec<Access> = exemptions
            .iter()
            .filter(|(who, _, _)| *who == sa)
            .map(|(_, a, _)| a.clone())
            .collect();
        let comparison = Comparison::of(&granted, &usage, &exempt);
        clean &= comparison.is_clean();
        report.push_str(&format!(
            "{sa}: {} granted, {} used
{comparison}",
            granted.len(),
            usage.used.len()
        ));
    }
    println!(
        "RBAC against the audit log ({} events):
{report}",
        events.len()
    );
    for (sa, access, why) in &exemptions {
        println!("exempt when unused: {sa} {access}: {why}");
    }
    assert!(
        clean,
        "RBAC and use disagree:
{report}"
    );
}

#[test]
fn a_node_component_that_dies_is_named_with_the_tail_of_its_log() {
    let _one = ONE_NODE.lock();
    let node = start_node();
    node.check().unwrap();
    // kube-proxy: its death disturbs nothing else this test does.
    let dir = node.dir().display().to_string();
    let pid = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let c = String::from_utf8_lossy(&c);
                c.contains("kube-proxy") && c.contains(&dir)
            })
        })
        .expect("the node's kube-proxy process");
    assert!(
        Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let err = loop {
        if let Err(e) = node.check() {
            break e.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "the node did not report its dead kube-proxy"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        err.contains("kube-proxy") && err.contains("exited"),
        "{err}"
    );
    // The tail of its log comes with it (kube-proxy logs its start-up).
    assert!(err.lines().count() > 2, "{err}");
}

#[test]
fn helm_install_on_a_real_node_serves_vms_fails_over_upgrades_and_uninstalls_cleanly() {
    let _one = ONE_NODE.lock();
    let t0 = Instant::now();
    let mut timeline: Vec<(String, Duration)> = Vec::new();
    let mut mark = |what: &str| {
        let at = t0.elapsed();
        eprintln!("[{:>7.1} s] {what}", at.as_secs_f64());
        timeline.push((what.to_owned(), at));
    };
    let c = Cluster {
        node: start_audited_node(),
        system: SYSTEM,
    };
    mark("node Ready, images imported");

    // KubeVirt's and Multus's CRDs (minimal, ours: neither runs here), the VMs' namespace, and
    // the NAD's bridge in the node's network namespace.
    c.kubectl(&[
        "apply",
        "-f",
        repo_root().join("integration/manifests").to_str().unwrap(),
    ]);
    c.kubectl(&["create", "namespace", VMS]);
    c.node
        .ip(&["link", "add", BRIDGE, "type", "bridge"])
        .unwrap();
    c.node.ip(&["link", "set", BRIDGE, "up"]).unwrap();

    // 1. helm install --wait with the default values.
    let chart = repo_root().join("chart");
    let install_started = Instant::now();
    c.helm(&[
        "install",
        RELEASE,
        chart.to_str().unwrap(),
        "--namespace",
        SYSTEM,
        "--create-namespace",
        "--wait",
        "--timeout",
        "5m",
    ]);
    let install_to_ready = install_started.elapsed();
    mark("helm install --wait returned");
    assert_eq!(c.ready_pods("controller").len(), 2, "{}", c.diagnose());
    assert_eq!(c.ready_pods("agent").len(), 2, "{}", c.diagnose());
    println!(
        "helm install (default values) → every pod Ready: {:.1} s",
        install_to_ready.as_secs_f64()
    );

    // 2. The webhook, reached through its Service, refuses a bad IPPool with upstream's words.
    c.apply(&json!({
        "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": "net-a", "namespace": VMS},
        "spec": {"config": format!("{{\"cniVersion\":\"0.3.1\",\"type\":\"bridge\",\"bridge\":\"{BRIDGE}\"}}")}
    }))
    .unwrap();
    let refused = c.wait("the webhook to answer", Duration::from_secs(60), || {
        match c.apply(&pool_manifest("10.99.0.2")) {
            Err(text) if text.contains("denied the request") => Some(text),
            Err(_) => None, // webhook not reachable yet (failurePolicy Fail)
            Ok(text) => panic!("a server IP outside the CIDR was accepted: {text}"),
        }
    });
    assert!(
        refused.contains("cannot create IPPool vms/net-a because"),
        "upstream's message: {refused}"
    );
    mark("webhook refused a bad IPPool through its Service");

    // 3. A NAD, an IPPool and two VMs: configs Allocated, the agents roll with the network, a
    // VM's dhclient gets its reserved address from the agent pod, AgentReady=True.
    let agents_before: Vec<String> = c.ready_pods("agent");
    c.apply(&pool_manifest(SERVER_IP)).unwrap();
    c.apply(&vm_manifest(VMS, "vm1", VM1_MAC, &format!("{VMS}/net-a")))
        .unwrap();
    c.apply(&vm_manifest(VMS, "vm2", VM2_MAC, &format!("{VMS}/net-a")))
        .unwrap();
    let allocated = c.wait("both VMs allocated", Duration::from_secs(60), || {
        let a = c.allocations();
        (a.contains_key(VM1_MAC) && a.contains_key(VM2_MAC)).then_some(a)
    });
    for vm in ["vm1", "vm2"] {
        c.wait(
            &format!("{vm}'s config Allocated"),
            Duration::from_secs(60),
            || {
                (c.condition("virtualmachinenetworkconfig", vm, "Allocated")?
                    .0
                    == "True")
                    .then_some(())
            },
        );
    }
    mark("configs Allocated");
    c.wait(
        "the agent Deployment to roll with the network",
        Duration::from_secs(180),
        || {
            let ready = c.ready_pods("agent");
            (ready.len() == 2 && ready.iter().all(|p| !agents_before.contains(p))).then_some(())
        },
    );
    mark("agent pods rolled with the pool's network");
    let mut lab = Lab::new().unwrap();
    let node_ns = c.node.netns();
    let vm1 = plug_vm(&mut lab, &node_ns, "vm1", VM1_MAC);
    let vm3 = plug_vm(&mut lab, &node_ns, "vm3", VM3_MAC);
    let dir = tempfile::tempdir().unwrap();
    let vm1_dir = dir.path().join("vm1");
    std::fs::create_dir_all(&vm1_dir).unwrap();
    let dhcp_started = Instant::now();
    start_dhclient(&mut lab, &vm1, &vm1_dir);
    let bound = wait_event(&vm1_dir, "BOUND", 0, Duration::from_secs(60));
    println!(
        "first lease from the agent pod: {:.1} s after dhclient started",
        dhcp_started.elapsed().as_secs_f64()
    );
    assert_eq!(bound["new_ip_address"], allocated[VM1_MAC], "{bound:?}");
    assert_eq!(bound["new_routers"], "10.77.0.1", "{bound:?}");
    assert_eq!(bound["new_domain_name_servers"], "10.77.0.53", "{bound:?}");
    mark("vm1's dhclient bound its reserved address");
    c.wait("AgentReady=True", Duration::from_secs(60), || {
        (c.condition("ippool", "net-a", "AgentReady")?.0 == "True").then_some(())
    });
    // Which controller replica each agent streams from: AgentReady must hold whichever it is.
    let streams: Vec<(String, f64)> = c
        .ready_pods("controller")
        .into_iter()
        .map(|p| {
            let m = c.pod_metrics(&p);
            let n = vmdhcp_integration::fleet::metric(&m, "vmdhcpcontroller_stream_clients")
                .unwrap_or(0.0);
            (p, n)
        })
        .collect();
    let leader = c.lease_holder("vm-dhcp-controllers").unwrap_or_default();
    println!("config streams per controller replica (leader {leader}): {streams:?}");
    // Each replica reads the cluster's token signing keys under the chart's RBAC, so a forged
    // agent token costs no TokenReview.
    for pod in c.ready_pods("controller") {
        let m = c.pod_metrics(&pod);
        let keys = vmdhcp_integration::fleet::metric(&m, "vmdhcpcontroller_token_issuer_keys");
        assert!(
            keys.is_some_and(|k| k >= 1.0),
            "{pod}: issuer keys {keys:?}"
        );
    }
    mark("AgentReady=True");

    // 4. Deleting the leading agent pod: the standby serves within 3 s, vm1 renews on its address.
    let agent_leader = c.wait("an agent leader", Duration::from_secs(30), || {
        c.lease_holder("vm-dhcp-agents")
    });
    let deleted_at = Instant::now();
    let stopped = c.delete_pod(&agent_leader);
    // vm2 asks for its reserved address (one udhcpc try per second) until a leader answers.
    let vm2 = plug_vm(&mut lab, &node_ns, "vm2", VM2_MAC);
    let vm2_dir = dir.path().join("vm2");
    std::fs::create_dir_all(&vm2_dir).unwrap();
    let probed = probe_until_leased(&vm2, &vm2_dir, &allocated[VM2_MAC], Duration::from_secs(45));
    let leased_at = Instant::now();
    // If the node stalled, the outage counts from when the leader was actually stopped.
    let outage = match stopped.join().unwrap() {
        Some(killed_at) => {
            println!("{}", c.node.log_tail("kubelet", 30));
            leased_at.saturating_duration_since(killed_at)
        }
        None => probed.min(leased_at - deleted_at),
    };
    let new_leader = c.new_agent_leader(&agent_leader);
    println!(
        "agent leader {agent_leader} deleted → {new_leader} leads, vm2 answered after {:.2} s (probe: one udhcpc try per second)",
        outage.as_secs_f64()
    );
    assert!(
        outage < Duration::from_secs(3),
        "the standby did not serve within 3 s of the leader's deletion: {outage:?}"
    );
    c.wait_renewal(
        "vm1 to renew with the new leader",
        &vm1_dir,
        &allocated[VM1_MAC],
    );
    mark("agent leader deleted: standby served, vm1 renewed on the same address");

    // AgentReady whichever controller replica the serving agent streams from. The Service
    // balances at random, so fail the agents over until the leading one streams from the replica
    // that does not lead (each failover is a coin toss); AgentReady must then name it.
    let mut leader = new_leader;
    for attempt in 1.. {
        let controller_leader = c.lease_holder("vm-dhcp-controllers").unwrap_or_default();
        let replica = c.wait("the agent leader's stream", Duration::from_secs(60), || {
            c.stream_replica(&leader)
        });
        println!(
            "agent leader {leader} streams from {replica} (controller leader {controller_leader})"
        );
        if replica != controller_leader {
            break;
        }
        assert!(
            attempt < 10,
            "no agent leader ever streamed from the follower replica"
        );
        let stopped = c.delete_pod(&leader);
        leader = c.new_agent_leader(&leader);
        stopped.join().unwrap();
    }
    c.wait(
        "AgentReady=True naming the agent that streams from the follower replica",
        Duration::from_secs(60),
        || {
            let obj = c.try_json(&["get", "ippool", "-n", VMS, "net-a"])?;
            obj["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| {
                    c["type"] == "AgentReady"
                        && c["status"] == "True"
                        && c["message"].as_str().is_some_and(|m| m.contains(&leader))
                })
                .map(|_| ())
        },
    );
    mark("AgentReady=True from the agent leader on the follower controller replica");

    // Deleting the leading controller pod: a new VM still gets its address.
    let controller_leader = c.lease_holder("vm-dhcp-controllers").unwrap();
    let stopped = c.delete_pod(&controller_leader);
    let vm3_dir = dir.path().join("vm3");
    std::fs::create_dir_all(&vm3_dir).unwrap();
    c.apply(&vm_manifest(VMS, "vm3", VM3_MAC, &format!("{VMS}/net-a")))
        .unwrap();
    let vm3_ip = c.wait("vm3 allocated", Duration::from_secs(90), || {
        c.allocations().get(VM3_MAC).cloned()
    });
    probe_until_leased(&vm3, &vm3_dir, &vm3_ip, Duration::from_secs(60));
    stopped.join().unwrap();
    assert_ne!(
        c.lease_holder("vm-dhcp-controllers").as_deref(),
        Some(controller_leader.as_str())
    );
    mark("controller leader deleted: vm3 allocated and leased");

    // 5. helm upgrade with a changed value keeps every lease.
    let before = c.allocations();
    c.helm(&[
        "upgrade",
        RELEASE,
        chart.to_str().unwrap(),
        "--namespace",
        SYSTEM,
        "--set",
        "agent.reportIntervalSeconds=10",
        "--set",
        "controller.logLevel=debug",
        "--wait",
        "--timeout",
        "5m",
    ]);
    c.wait(
        "every pod Ready after the upgrade",
        Duration::from_secs(180),
        || {
            (c.ready_pods("controller").len() == 2 && c.ready_pods("agent").len() == 2)
                .then_some(())
        },
    );
    assert_eq!(c.allocations(), before, "the upgrade moved an allocation");
    c.wait_renewal(
        "vm1 to renew after the upgrade",
        &vm1_dir,
        &allocated[VM1_MAC],
    );
    assert_eq!(
        dhclient_lease(&vm1_dir.join("dhclient.leases"))["fixed-address"],
        allocated[VM1_MAC]
    );
    mark("helm upgrade: every allocation kept, vm1 renewed on the same address");

    // 6. net-a becomes dual-stack: a new VM gets both its addresses from the agent pod.
    dual_stack_vm_gets_both_addresses(&c, &mut lab, &node_ns, dir.path());
    mark(
        "net-a dual-stack: vm4 bound both recorded addresses, renewed both after the agents rolled",
    );
    pinned_vm_gets_its_address_and_a_new_pin_at_its_next_lease(&c, &mut lab, &node_ns, dir.path());
    mark("vm5 pinned by its static-ip annotation: leased the pin, then the new pin");
    an_editor_s_claim_holds_an_address_its_vm_then_leases(&c, &mut lab, &node_ns, dir.path());
    mark("vm6: an editor's claim held its address across the VM's re-creation; Delete took it");

    // 7. Every permission the chart grants is used, and no call is refused.
    exercise_rare_permissions(&c);
    mark("upstream's agent retired, a gone VM's config deleted, a status conflict re-read");
    check_rbac_against_audit(&c);
    mark("RBAC: every granted permission used, none refused");

    // 8. Figures.
    println!("pod                                    working set   restarts");
    for (pod, bytes, restarts) in pod_figures(&c) {
        println!(
            "{pod:<38} {:>8.1} MiB {restarts:>10}",
            bytes as f64 / 1048576.0
        );
    }

    // 9. helm uninstall leaves nothing of ours behind.
    c.helm(&[
        "uninstall",
        RELEASE,
        "--namespace",
        SYSTEM,
        "--wait",
        "--timeout",
        "3m",
    ]);
    let ours = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.contains("vmdhcp") || l.contains("vm-dhcp"))
            .map(str::to_owned)
            .collect()
    };
    let left = c.wait("nothing of ours left", Duration::from_secs(120), || {
        let (_, ns_objects) = output(c.node.kubectl().args([
            "get",
            "pods,deployments,services,secrets,configmaps,leases,serviceaccounts,roles,rolebindings",
            "-n",
            SYSTEM,
            "-o",
            "name",
        ]));
        let (_, cluster_objects) = output(c.node.kubectl().args([
            "get",
            "mutatingwebhookconfigurations,validatingwebhookconfigurations,clusterroles,clusterrolebindings",
            "-o",
            "name",
        ]));
        let left = [ours(&ns_objects), ours(&cluster_objects)].concat();
        left.is_empty().then_some(left)
    });
    assert!(left.is_empty());
    mark("helm uninstall: nothing of ours left");
    println!("timeline:");
    for (what, at) in &timeline {
        println!("  {:>7.1} s  {what}", at.as_secs_f64());
    }
}

/// Harvester's managed-DHCP add-on: its release name and namespace.
const ADDON_RELEASE: &str = "harvester-vm-dhcp-controller";
const HARVESTER: &str = "harvester-system";
/// The second pool's bridge.
const BRIDGE_B: &str = "brvm2";
/// An image every node has (containerd's sandbox image), standing in for upstream's binaries.
const PAUSE: &str = "registry.k8s.io/pause:3.6";

/// Upstream's chart (harvester/vm-dhcp-controller as Harvester packages it) as it renders for the
/// add-on's release, written as a chart of the same name whose templates are those objects, so
/// that `helm install` makes them a Helm release exactly as upstream's install did: Deployments of
/// the controller and the webhook server (their containers are pause: nothing of upstream's runs),
/// three ServiceAccounts, the ClusterRoles and Roles with their bindings (the election's in
/// kube-system), the metrics and webhook Services, and the CRDs in `crds/` (this repository's:
/// what `kubectl apply -f chart/crds/` leaves).
fn write_upstream_chart(dir: &Path) {
    let labels = |component: &str, name: &str| {
        json!({
            "helm.sh/chart": "harvester-vm-dhcp-controller-0.3.3",
            "app.kubernetes.io/name": name,
            "app.kubernetes.io/instance": ADDON_RELEASE,
            "app.kubernetes.io/version": "v0.3.3",
            "app.kubernetes.io/managed-by": "Helm",
            "app.kubernetes.io/component": component,
        })
    };
    let selector = |name: &str| json!({"app.kubernetes.io/name": name, "app.kubernetes.io/instance": ADDON_RELEASE});
    let deployment = |name: &str, component: &str, sa: &str, port: u16| {
        let app = if component == "webhook" {
            format!("{ADDON_RELEASE}-webhook")
        } else {
            ADDON_RELEASE.to_owned()
        };
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": HARVESTER, "labels": labels(component, &app)},
            "spec": {"replicas": 1, "selector": {"matchLabels": selector(&app)}, "template": {
                "metadata": {"labels": labels(component, &app)},
                "spec": {"serviceAccountName": sa, "terminationGracePeriodSeconds": 0, "containers": [{
                    "name": "harvester-vm-dhcp-controller", "image": PAUSE, "imagePullPolicy": "Never",
                    "ports": [{"name": if component == "webhook" { "https" } else { "metrics" },
                               "containerPort": port, "protocol": "TCP"}]}]}}}
        })
    };
    let sa = |name: &str| {
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "automountServiceAccountToken": true,
               "metadata": {"name": name, "namespace": HARVESTER, "labels": labels("controller", ADDON_RELEASE)}})
    };
    let rbac = |kind: &str, name: &str, ns: Option<&str>, rules: Value| {
        let mut md = json!({"name": name, "labels": labels("controller", ADDON_RELEASE)});
        if let Some(ns) = ns {
            md["namespace"] = json!(ns);
        }
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": md, "rules": rules})
    };
    let binding = |kind: &str,
                   name: &str,
                   ns: Option<&str>,
                   role_kind: &str,
                   role: &str,
                   sa: &str| {
        let mut md = json!({"name": name, "labels": labels("controller", ADDON_RELEASE)});
        if let Some(ns) = ns {
            md["namespace"] = json!(ns);
        }
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": md,
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
               "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": HARVESTER}]})
    };
    let r = ADDON_RELEASE;
    let read = |group: &str, resources: &[&str]| json!({"apiGroups": [group], "resources": resources, "verbs": ["get", "list", "watch"]});
    let objects = vec![
        sa(r),
        sa(&format!("{r}-agent")),
        sa(&format!("{r}-webhook")),
        rbac(
            "ClusterRole",
            r,
            None,
            json!([
                read(
                    "network.harvesterhci.io",
                    &["ippools", "virtualmachinenetworkconfigs"]
                ),
                read("kubevirt.io", &["virtualmachines"])
            ]),
        ),
        rbac(
            "ClusterRole",
            &format!("{r}-agent"),
            None,
            json!([read("network.harvesterhci.io", &["ippools"])]),
        ),
        rbac(
            "ClusterRole",
            &format!("{r}-webhook"),
            None,
            json!([read(
                "admissionregistration.k8s.io",
                &[
                    "validatingwebhookconfigurations",
                    "mutatingwebhookconfigurations"
                ]
            )]),
        ),
        binding("ClusterRoleBinding", r, None, "ClusterRole", r, r),
        binding(
            "ClusterRoleBinding",
            &format!("{r}-agent"),
            None,
            "ClusterRole",
            &format!("{r}-agent"),
            &format!("{r}-agent"),
        ),
        binding(
            "ClusterRoleBinding",
            &format!("{r}-webhook"),
            None,
            "ClusterRole",
            &format!("{r}-webhook"),
            &format!("{r}-webhook"),
        ),
        rbac(
            "Role",
            &format!("{r}-lease-manager"),
            Some("kube-system"),
            json!([read("coordination.k8s.io", &["leases"])]),
        ),
        rbac(
            "Role",
            &format!("{r}-pod-manager"),
            Some(HARVESTER),
            json!([read("", &["pods"])]),
        ),
        rbac(
            "Role",
            &format!("{r}-webhook-secret-manager"),
            Some(HARVESTER),
            json!([read("", &["secrets"])]),
        ),
        binding(
            "RoleBinding",
            &format!("{r}-manage-leases"),
            Some("kube-system"),
            "Role",
            &format!("{r}-lease-manager"),
            r,
        ),
        binding(
            "RoleBinding",
            &format!("{r}-manage-pods"),
            Some(HARVESTER),
            "Role",
            &format!("{r}-pod-manager"),
            r,
        ),
        binding(
            "RoleBinding",
            &format!("{r}-webhook-manage-secrets"),
            Some(HARVESTER),
            "Role",
            &format!("{r}-webhook-secret-manager"),
            &format!("{r}-webhook"),
        ),
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": r, "namespace": HARVESTER, "labels": labels("controller", r)},
               "spec": {"type": "ClusterIP", "selector": selector(r),
                        "ports": [{"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}]}}),
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": format!("{r}-webhook"), "namespace": HARVESTER,
                            "labels": labels("webhook", &format!("{r}-webhook"))},
               "spec": {"type": "ClusterIP", "selector": selector(&format!("{r}-webhook")),
                        "ports": [{"name": "https", "port": 443, "targetPort": 8443, "protocol": "TCP"}]}}),
        deployment(r, "controller", r, 8080),
        deployment(
            &format!("{r}-webhook"),
            "webhook",
            &format!("{r}-webhook"),
            8443,
        ),
    ];
    std::fs::create_dir_all(dir.join("templates")).unwrap();
    std::fs::create_dir_all(dir.join("crds")).unwrap();
    std::fs::write(
        dir.join("Chart.yaml"),
        "apiVersion: v2\nname: harvester-vm-dhcp-controller\nversion: 0.3.3\nappVersion: v0.3.3\n",
    )
    .unwrap();
    let manifest: Vec<String> = objects.iter().map(|o| format!("---\n{o}\n")).collect();
    std::fs::write(dir.join("templates/upstream.yaml"), manifest.concat()).unwrap();
    for crd in std::fs::read_dir(repo_root().join("chart/crds")).unwrap() {
        let crd = crd.unwrap().path();
        std::fs::copy(&crd, dir.join("crds").join(crd.file_name().unwrap())).unwrap();
    }
}

/// What upstream's processes created outside its Helm release, as they name them: the webhook
/// server's two configurations (the validating one fails closed) and dynamiclistener's Secrets,
/// and the controller's election Lease in kube-system. No Helm ownership: Helm never made them.
fn upstream_runtime_objects() -> Vec<Value> {
    let svc = format!("{ADDON_RELEASE}-webhook");
    let client = |path: &str| json!({"service": {"namespace": HARVESTER, "name": svc, "path": path, "port": 443}});
    let rule = |resources: &[&str], ops: &[&str]| {
        json!({"apiGroups": ["network.harvesterhci.io"], "apiVersions": ["v1alpha1"],
        "resources": resources, "operations": ops, "scope": "Namespaced"})
    };
    let secret = |name: String| {
        json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": name, "namespace": HARVESTER},
        "data": {"tls.crt": "dXBzdHJlYW0=", "tls.key": "dXBzdHJlYW0="}})
    };
    vec![
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": svc}, "webhooks": [{
                "name": format!("validator.{HARVESTER}.{svc}"), "clientConfig": client("/v1/webhook/validation"),
                "rules": [rule(&["ippools"], &["CREATE", "UPDATE", "DELETE"]), rule(&["virtualmachinenetworkconfigs"], &["CREATE"])],
                "failurePolicy": "Fail", "sideEffects": "None", "admissionReviewVersions": ["v1", "v1beta1"]}]}),
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": svc}, "webhooks": [{
                "name": format!("mutator.{HARVESTER}.{svc}"), "clientConfig": client("/v1/webhook/mutation"),
                "rules": [rule(&["ippools"], &["CREATE"])],
                "failurePolicy": "Ignore", "sideEffects": "None", "admissionReviewVersions": ["v1", "v1beta1"]}]}),
        secret(format!("{svc}-ca")),
        secret(format!("{svc}-tls")),
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "vm-dhcp-controllers", "namespace": "kube-system"},
            "spec": {"holderIdentity": format!("{ADDON_RELEASE}-5d4f8b7c9-x2x7q"), "leaseDurationSeconds": 45}}),
    ]
}

/// The add-on's values: the valuesContent of `examples/harvester-addon.yaml`, in upstream's terms.
fn addon_values(dir: &Path) -> std::path::PathBuf {
    let example =
        std::fs::read_to_string(repo_root().join("examples/harvester-addon.yaml")).unwrap();
    let addon: Value = serde_yaml_ng::from_str(&example).unwrap();
    let path = dir.join("addon-values.yaml");
    std::fs::write(
        &path,
        addon["spec"]["valuesContent"]
            .as_str()
            .expect("valuesContent"),
    )
    .unwrap();
    path
}

/// One pool of the upstream install: its NAD, the pool, one VM and its config, with the status
/// upstream's controller wrote (the VM's address recorded in both, `agentPodRef` naming its agent
/// pod, which the test creates as upstream's controller did: labelled, bare, pause).
struct UpstreamPool {
    pool: &'static str,
    bridge: &'static str,
    cidr_prefix: &'static str,
    vm: &'static str,
    mac: &'static str,
    /// The recorded address: not the first of the range, so a recomputation would show.
    address: &'static str,
}

impl UpstreamPool {
    fn agent_pod(&self) -> String {
        format!("{VMS}-{}-agent", self.pool)
    }

    fn create(&self, c: &Cluster, rt: &tokio::runtime::Runtime, client: &kube::Client) {
        let p = self.cidr_prefix;
        c.apply(&json!({
            "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": self.pool, "namespace": VMS, "labels": {
                LABEL_IPPOOL_NAMESPACE: VMS, LABEL_IPPOOL_NAME: self.pool}},
            "spec": {"config": format!("{{\"cniVersion\":\"0.3.1\",\"type\":\"bridge\",\"bridge\":\"{}\"}}", self.bridge)}
        }))
        .unwrap();
        c.apply(&json!({
            "apiVersion": "network.harvesterhci.io/v1alpha1", "kind": "IPPool",
            "metadata": {"name": self.pool, "namespace": VMS,
                         "finalizers": ["wrangler.cattle.io/vm-dhcp-ippool-controller"]},
            "spec": {"networkName": format!("{VMS}/{}", self.pool), "ipv4Config": {
                "serverIP": format!("{p}.2"), "cidr": format!("{p}.0/24"),
                "pool": {"start": format!("{p}.50"), "end": format!("{p}.99")},
                "router": format!("{p}.1"), "dns": [format!("{p}.53")], "leaseTime": LEASE_SECONDS
            }}
        }))
        .unwrap();
        c.apply(&vm_manifest(
            VMS,
            self.vm,
            self.mac,
            &format!("{VMS}/{}", self.pool),
        ))
        .unwrap();
        let vm_uid =
            c.json(&["get", "virtualmachine", "-n", VMS, self.vm])["metadata"]["uid"].clone();
        c.apply(&json!({
            "apiVersion": "network.harvesterhci.io/v1alpha1", "kind": "VirtualMachineNetworkConfig",
            "metadata": {"name": self.vm, "namespace": VMS, "labels": {"harvesterhci.io/vmName": self.vm},
                "finalizers": ["wrangler.cattle.io/vm-dhcp-vmnetcfg-controller"],
                "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                                     "name": self.vm, "uid": vm_uid}]},
            "spec": {"vmName": self.vm, "networkConfigs": [
                {"networkName": format!("{VMS}/{}", self.pool), "macAddress": self.mac}]}
        }))
        .unwrap();
        // Upstream's agent pod for the pool: bare, labelled, in its release's namespace.
        let pod = self.agent_pod();
        c.apply(&json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": HARVESTER, "labels": {
                LABEL_UPSTREAM_AGENT: "agent", LABEL_IPPOOL_NAMESPACE: VMS, LABEL_IPPOOL_NAME: self.pool}},
            "spec": {"serviceAccountName": format!("{ADDON_RELEASE}-agent"), "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "agent", "image": PAUSE, "imagePullPolicy": "Never"}]}
        }))
        .unwrap();
        let pod_uid = c.json(&["get", "pod", "-n", HARVESTER, &pod])["metadata"]["uid"].clone();
        let now = "2026-01-01T00:00:00Z";
        let cond = |t: &str| json!({"type": t, "status": "True", "lastUpdateTime": now});
        let pools: kube::Api<IPPool> = kube::Api::namespaced(client.clone(), VMS);
        let status = json!({"status": {
            "lastUpdate": now,
            "ipv4": {"allocated": {self.address: self.mac}, "used": 1, "available": 49},
            "agentPodRef": {"namespace": HARVESTER, "name": pod, "uid": pod_uid,
                            "image": "rancher/harvester-vm-dhcp-agent:v0.3.3"},
            "conditions": [cond("Registered"), cond("CacheReady"), cond("AgentReady")]
        }});
        let params = kube::api::PatchParams::default();
        rt.block_on(pools.patch_status(self.pool, &params, &kube::api::Patch::Merge(&status)))
            .unwrap();
        let configs: kube::Api<VirtualMachineNetworkConfig> =
            kube::Api::namespaced(client.clone(), VMS);
        let status = json!({"status": {
            "networkConfigs": [{"allocatedIPAddress": self.address, "macAddress": self.mac,
                                "networkName": format!("{VMS}/{}", self.pool), "state": "Allocated"}],
            "conditions": [cond("Allocated")]
        }});
        rt.block_on(configs.patch_status(self.vm, &params, &kube::api::Patch::Merge(&status)))
            .unwrap();
    }

    fn agent_pod_ref(&self, c: &Cluster) -> Option<Value> {
        let pool = c.try_json(&["get", "ippool", "-n", VMS, self.pool])?;
        Some(pool["status"]["agentPodRef"].clone()).filter(|r| !r.is_null())
    }
}

/// Every object upstream's install left, as (kind, namespace, name): its release's and what its
/// processes made. After the upgrade each is gone, or is the same name now of ours (this chart's
/// ServiceAccount, ClusterRole and ClusterRoleBinding `<release>-agent`).
fn upstream_objects(pools: &[UpstreamPool]) -> Vec<(&'static str, &'static str, String)> {
    let r = ADDON_RELEASE;
    let mut out = vec![
        ("deployment", HARVESTER, r.to_owned()),
        ("deployment", HARVESTER, format!("{r}-webhook")),
        ("service", HARVESTER, r.to_owned()),
        ("service", HARVESTER, format!("{r}-webhook")),
        ("serviceaccount", HARVESTER, r.to_owned()),
        ("serviceaccount", HARVESTER, format!("{r}-agent")),
        ("serviceaccount", HARVESTER, format!("{r}-webhook")),
        ("clusterrole", "", r.to_owned()),
        ("clusterrole", "", format!("{r}-agent")),
        ("clusterrole", "", format!("{r}-webhook")),
        ("clusterrolebinding", "", r.to_owned()),
        ("clusterrolebinding", "", format!("{r}-agent")),
        ("clusterrolebinding", "", format!("{r}-webhook")),
        ("role", "kube-system", format!("{r}-lease-manager")),
        ("role", HARVESTER, format!("{r}-pod-manager")),
        ("role", HARVESTER, format!("{r}-webhook-secret-manager")),
        ("rolebinding", "kube-system", format!("{r}-manage-leases")),
        ("rolebinding", HARVESTER, format!("{r}-manage-pods")),
        (
            "rolebinding",
            HARVESTER,
            format!("{r}-webhook-manage-secrets"),
        ),
        ("validatingwebhookconfiguration", "", format!("{r}-webhook")),
        ("mutatingwebhookconfiguration", "", format!("{r}-webhook")),
        ("secret", HARVESTER, format!("{r}-webhook-ca")),
        ("secret", HARVESTER, format!("{r}-webhook-tls")),
        ("lease", "kube-system", "vm-dhcp-controllers".to_owned()),
    ];
    out.extend(pools.iter().map(|p| ("pod", HARVESTER, p.agent_pod())));
    out
}

#[test]
fn helm_upgrade_of_the_harvester_addon_release_from_upstream_to_this_chart_in_one_command() {
    let _one = ONE_NODE.lock();
    let t0 = Instant::now();
    let mark = |what: &str| eprintln!("[{:>7.1} s] {what}", t0.elapsed().as_secs_f64());
    let c = Cluster {
        node: start_node(),
        system: HARVESTER,
    };
    mark("node Ready, images imported");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = c.client(&rt);
    let dir = tempfile::tempdir().unwrap();
    c.kubectl(&[
        "apply",
        "-f",
        repo_root().join("integration/manifests").to_str().unwrap(),
    ]);
    for ns in [VMS, HARVESTER] {
        c.kubectl(&["create", "namespace", ns]);
    }
    for bridge in [BRIDGE, BRIDGE_B] {
        c.node
            .ip(&["link", "add", bridge, "type", "bridge"])
            .unwrap();
        c.node.ip(&["link", "set", bridge, "up"]).unwrap();
    }

    // 1. Upstream's install: its Helm release, then what its processes made, then two pools with
    // a VM each, recorded as upstream's controller records them, each with its agent pod.
    let upstream_chart = dir.path().join("upstream-chart");
    write_upstream_chart(&upstream_chart);
    c.helm(&[
        "install",
        ADDON_RELEASE,
        upstream_chart.to_str().unwrap(),
        "--namespace",
        HARVESTER,
        "--wait",
        "--timeout",
        "3m",
    ]);
    let pools = [
        UpstreamPool {
            pool: "net-a",
            bridge: BRIDGE,
            cidr_prefix: "10.77.0",
            vm: "vm1",
            mac: VM1_MAC,
            address: "10.77.0.77",
        },
        UpstreamPool {
            pool: "net-b",
            bridge: BRIDGE_B,
            cidr_prefix: "10.78.0",
            vm: "vm2",
            mac: VM2_MAC,
            address: "10.78.0.88",
        },
    ];
    for p in &pools {
        p.create(&c, &rt, &client);
    }
    for object in upstream_runtime_objects() {
        c.apply(&object).unwrap();
    }
    mark("upstream's release, runtime objects, pools, configs and agent pods in place");
    // Upstream's validating webhook fails closed while its server does not answer: left behind,
    // it would refuse every IPPool write.
    let mut bad = pool_manifest("10.99.0.2");
    bad["metadata"]["name"] = json!("net-bad");
    let refused = c
        .apply(&bad)
        .expect_err("upstream's webhook refuses while its server is down");
    assert!(
        refused.contains(&format!("{ADDON_RELEASE}-webhook")),
        "{refused}"
    );
    let before: Vec<BTreeMap<String, String>> =
        pools.iter().map(|p| c.pool_allocations(p.pool)).collect();

    // 2. The upgrade: the CRDs first (Helm never upgrades crds/), then what Harvester's add-on
    // job runs once the Addon is edited as examples/harvester-addon.yaml is (spec.chart
    // unchanged, upstream's name): `helm upgrade --install` of that chart at spec.version from
    // spec.repo, a chart repository here on loopback, with spec.valuesContent (upstream's terms).
    c.kubectl(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        repo_root().join("chart/crds").to_str().unwrap(),
    ]);
    let values = addon_values(dir.path());
    let repo = ChartRepo::serve(dir.path());
    let upgrade_started = Instant::now();
    let out = c.helm(&repo.addon_job(&values));
    println!(
        "helm upgrade from upstream's release → every pod Ready: {:.1} s",
        upgrade_started.elapsed().as_secs_f64()
    );
    assert!(
        out.contains("serviceCIDR=10.53.0.0/16 -> controller.serviceCIDR"),
        "the notes name the new keys:\n{out}"
    );
    mark("helm upgrade --wait returned");
    let history = c.helm(&[
        "history",
        ADDON_RELEASE,
        "--namespace",
        HARVESTER,
        "-o",
        "json",
    ]);
    let history: Value = serde_json::from_str(&history).unwrap();
    let last = history
        .as_array()
        .and_then(|h| h.last())
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        (
            last["revision"].as_u64(),
            last["status"].as_str(),
            last["chart"].as_str()
        ),
        (
            Some(2),
            Some("deployed"),
            Some(format!("harvester-vm-dhcp-controller-{}", repo.version).as_str())
        ),
        "{history}"
    );
    assert_eq!(c.ready_pods("controller").len(), 2, "{}", c.diagnose());
    assert_eq!(c.ready_pods("agent").len(), 2, "{}", c.diagnose());

    // 3. Our agents serve every recorded lease; then, and only then, upstream's agents retire.
    for p in &pools {
        c.wait(
            &format!("{} AgentReady from our agent", p.pool),
            Duration::from_secs(120),
            || {
                (c.condition("ippool", p.pool, "AgentReady")?.0 == "True"
                    && p.agent_pod_ref(&c).is_none())
                .then_some(())
            },
        );
    }
    mark("both pools served by our agents, agentPodRef cleared");
    let mut lab = Lab::new().unwrap();
    let node_ns = c.node.netns();
    for p in &pools {
        let ns = lab.netns(p.vm).unwrap();
        lab.plug(&node_ns, p.bridge, &format!("p{}", p.vm), &ns, "eth0")
            .unwrap();
        lab.exec(&ns, "ip", &["link", "set", "eth0", "address", p.mac])
            .unwrap();
        let vm_dir = dir.path().join(p.vm);
        std::fs::create_dir_all(&vm_dir).unwrap();
        start_dhclient(&mut lab, &ns, &vm_dir);
        let bound = wait_event(&vm_dir, "BOUND", 0, Duration::from_secs(60));
        assert_eq!(bound["new_ip_address"], p.address, "{}: {bound:?}", p.vm);
        assert_eq!(
            bound["new_routers"],
            format!("{}.1", p.cidr_prefix),
            "{bound:?}"
        );
    }
    let after: Vec<BTreeMap<String, String>> =
        pools.iter().map(|p| c.pool_allocations(p.pool)).collect();
    assert_eq!(after, before, "the upgrade moved an allocation");
    mark("each VM bound the address upstream recorded, from our agent");

    // 4. Admission is ours: upstream's fail-closed webhook is gone, ours refuses with upstream's
    // words, and a new VM gets its config and address.
    let refused = c.wait(
        "our webhook to answer",
        Duration::from_secs(60),
        || match c.apply(&bad) {
            Err(text) if text.contains("denied the request") => Some(text),
            Err(_) => None,
            Ok(text) => panic!("a server IP outside the CIDR was accepted: {text}"),
        },
    );
    assert!(
        refused.contains("cannot create IPPool vms/net-bad because"),
        "{refused}"
    );
    c.apply(&vm_manifest(VMS, "vm3", VM3_MAC, &format!("{VMS}/net-a")))
        .unwrap();
    c.wait("vm3 allocated", Duration::from_secs(60), || {
        c.pool_allocations("net-a").get(VM3_MAC).cloned()
    });
    mark("admission by our controller; a new VM allocated");

    // 5. Nothing of upstream's is left but the CRDs and their objects.
    let objects = upstream_objects(&pools);
    let left = c.wait(
        "nothing of upstream's left",
        Duration::from_secs(90),
        || {
            let left: Vec<String> = objects
                .iter()
                .filter_map(|(kind, ns, name)| {
                    let mut args = vec!["get", kind, name.as_str()];
                    if !ns.is_empty() {
                        args.extend(["-n", ns]);
                    }
                    let obj = c.try_json(&args)?;
                    let ours = obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "vmdhcp"
                        && obj["metadata"]["annotations"]["meta.helm.sh/release-name"]
                            == ADDON_RELEASE;
                    (!ours).then(|| format!("{kind} {ns}/{name}"))
                })
                .collect();
            left.is_empty().then_some(left)
        },
    );
    assert!(left.is_empty());
    let taken_over: Vec<String> = objects
        .iter()
        .filter(|(kind, ns, name)| {
            let mut args = vec!["get", *kind, name.as_str()];
            if !ns.is_empty() {
                args.extend(["-n", *ns]);
            }
            c.try_json(&args).is_some()
        })
        .map(|(kind, _, name)| format!("{kind} {name}"))
        .collect();
    println!("upstream's names now this chart's: {taken_over:?}");
    mark("nothing of upstream's left (the CRDs and their objects stay)");

    // 6. The add-on disabled (Harvester uninstalls the release) and enabled again (its job
    // installs it): every allocation is kept, and each VM has its address again from the new
    // agents (renewed, or bound anew if its short lease ran out meanwhile).
    let before: Vec<BTreeMap<String, String>> =
        pools.iter().map(|p| c.pool_allocations(p.pool)).collect();
    let events_before: Vec<usize> = pools
        .iter()
        .map(|p| vmdhcp_integration::dhcp_client::events(&dir.path().join(p.vm)).len())
        .collect();
    c.helm(&[
        "uninstall",
        ADDON_RELEASE,
        "--namespace",
        HARVESTER,
        "--wait",
        "--timeout",
        "3m",
    ]);
    c.wait("the release's pods gone", Duration::from_secs(120), || {
        (c.pods("controller").is_empty() && c.pods("agent").is_empty()).then_some(())
    });
    mark("add-on disabled: the release uninstalled");
    let reenabled = Instant::now();
    c.helm(&repo.addon_job(&values));
    let after: Vec<BTreeMap<String, String>> =
        pools.iter().map(|p| c.pool_allocations(p.pool)).collect();
    assert_eq!(
        after, before,
        "disabling and enabling the add-on moved an allocation"
    );
    for (p, since) in pools.iter().zip(events_before) {
        c.wait(
            &format!("{} AgentReady again", p.pool),
            Duration::from_secs(120),
            || (c.condition("ippool", p.pool, "AgentReady")?.0 == "True").then_some(()),
        );
        let vm_dir = dir.path().join(p.vm);
        let (event, _) = c.wait(
            &format!(
                "{} to have its address from the re-enabled add-on's agents",
                p.vm
            ),
            Duration::from_secs(LEASE_SECONDS * 4),
            || {
                vmdhcp_integration::dhcp_client::events(&vm_dir)
                    .into_iter()
                    .skip(since)
                    .filter(|(name, _)| {
                        ["BOUND", "RENEW", "REBIND", "REBOOT"].contains(&name.as_str())
                    })
                    .find(|(_, env)| {
                        env.get("new_ip_address").map(String::as_str) == Some(p.address)
                    })
            },
        );
        println!("{}: {event} {} with the re-enabled add-on", p.vm, p.address);
    }
    println!(
        "add-on enabled again: every pool served and each VM had its address {:.1} s after the \
         install started",
        reenabled.elapsed().as_secs_f64()
    );
    mark("add-on enabled again: every allocation kept, each VM has its address");
}

/// The chart as a chart repository, as Harvester's add-on reads one: packaged under both names
/// with its index (scripts/package-chart.sh), served on 127.0.0.1 by Python's http.server.
struct ChartRepo {
    _server: Supervised,
    url: String,
    /// The chart's version (chart/Chart.yaml), the Addon's spec.version.
    version: String,
}

impl ChartRepo {
    fn serve(dir: &Path) -> ChartRepo {
        let root = dir.join("chart-repo");
        let port = vmdhcp_integration::ports::free_port();
        let url = format!("http://127.0.0.1:{port}");
        let (ok, text) = output(
            Command::new(repo_root().join("scripts/package-chart.sh"))
                .arg(&root)
                .arg(&url)
                .env(
                    "HELM",
                    vmdhcp_integration::control_plane::bin_dir().join("helm"),
                ),
        );
        assert!(ok, "scripts/package-chart.sh: {text}");
        let server = Supervised::spawn(
            Path::new("python3"),
            &[
                "-m".into(),
                "http.server".into(),
                port.to_string(),
                "--bind".into(),
                "127.0.0.1".into(),
                "--directory".into(),
                root.display().to_string(),
            ],
            &dir.join("chart-repo.log"),
            None,
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !vmdhcp_integration::http::get(&format!("127.0.0.1:{port}"), "/index.yaml")
            .is_ok_and(|r| r.contains("harvester-vm-dhcp-controller"))
        {
            assert!(
                Instant::now() < deadline,
                "the chart repository never answered"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let chart = std::fs::read_to_string(repo_root().join("chart/Chart.yaml")).unwrap();
        let version = chart
            .lines()
            .find_map(|l| l.strip_prefix("version: "))
            .unwrap()
            .trim()
            .to_owned();
        ChartRepo {
            _server: server,
            url,
            version,
        }
    }

    /// What Harvester's add-on job runs for the Addon of examples/harvester-addon.yaml:
    /// `helm upgrade --install` of spec.chart at spec.version from spec.repo with
    /// spec.valuesContent (`values`), into the add-on's release.
    fn addon_job(&self, values: &Path) -> Vec<String> {
        [
            "upgrade",
            "--install",
            ADDON_RELEASE,
            "harvester-vm-dhcp-controller",
            "--repo",
            &self.url,
            "--version",
            &self.version,
            "--namespace",
            HARVESTER,
            "-f",
            values.to_str().unwrap(),
            "--wait",
            "--timeout",
            "5m",
        ]
        .map(str::to_owned)
        .to_vec()
    }
}
