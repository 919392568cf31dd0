//! The whole system on one machine, for the end-to-end tests and the local demo: a real API
//! server, the controller and agents as processes, and VMs as network namespaces with real DHCP
//! clients.
//!
//! Topology: one namespace holds a bridge per VM network (`br0` for pool-a's); each agent replica
//! runs in a namespace of its own with a veth on each network's bridge, named as the controller's
//! bootstrap env says (the interfaces Multus would have given it); each VM is a namespace with a
//! veth on its network's bridge.
//! Agents reach the API server and the controller, which listen on the host's loopback, through
//! `socat` relays over Unix sockets (paths are not namespaced), so the agent binary runs unchanged
//! and nothing is added to the host's network. Addresses are 10.123.45.0/24, inside the lab only.
//!
//! Helpers fail the caller on any error: this is test code, not product code.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::control_plane::ControlPlane;
use crate::dhcp_client::{try_http_get, udhcpc, wait_for};
use crate::netns::{Lab, Netns};
use crate::ports::free_port;
use crate::process::{Supervised, workspace_binary};

/// Namespace of the pools and VMs.
pub const NS: &str = "fleet";
/// Namespace of the agent Deployment and Lease.
pub const AGENT_NS: &str = "vmdhcp-system";
/// The pool's server address.
pub const SERVER_IP: &str = "10.123.45.2";
/// Agents' leader-election Lease duration.
pub const LEASE_SECONDS: u64 = 6;
/// Agents' election retry period.
pub const RETRY_SECONDS: u64 = 1;
/// The NTP server pool-a names by host; it resolves only inside agent namespaces (their own
/// `/etc/hosts`), as a cluster-internal name would.
pub const NTP_HOST: &str = "ntp.fleet.test";
/// What [`NTP_HOST`] resolves to.
pub const NTP_IP: &str = "10.123.45.123";
/// The first VM's NIC.
pub const VM1_MAC: &str = "02:12:34:00:00:01";
/// The second VM's NIC.
pub const VM2_MAC: &str = "02:12:34:00:00:02";
/// The pool's IPv6 server address, when it is dual-stack ([`Options::ipv6_lease_seconds`]).
pub const SERVER_IP6: &str = "fd10:123:45::2";
/// The pool's IPv6 subnet, a ULA that exists only in the lab.
pub const SUBNET6: &str = "fd10:123:45::/112";
const AGENT_HTTP: &str = "http://127.0.0.1:8080";

/// One agent replica: its namespace (its pod), process and identity.
pub struct Agent {
    /// The namespace standing for its pod's network.
    pub ns: Netns,
    /// The process.
    pub process: Supervised,
    /// Its pod name.
    pub identity: String,
}

/// The control plane, the controller, the lab and the relays of one end-to-end run.
pub struct Fleet {
    /// The API server.
    pub cp: ControlPlane,
    /// Namespaces and their processes.
    pub lab: Lab,
    /// Logs, sockets, client files.
    pub dir: tempfile::TempDir,
    /// The namespace holding the VM network's bridge `br0`.
    pub net: Netns,
    /// The controller's gRPC port on the host loopback.
    pub grpc: u16,
    /// The controller's HTTP port (`/metrics`) on the host loopback.
    pub controller_http: u16,
    /// The controller, while running (runs without [`Options::controller_replicas`]).
    pub controller: Option<Supervised>,
    /// The electing controller replicas (runs with [`Options::controller_replicas`]).
    pub replicas: Vec<ControllerReplica>,
    relays: Vec<Supervised>,
    /// `AGENT_NETWORK_CONFIGS` and `IPPOOL_REFS_JSON` as the controller wrote them.
    pub env: (String, String),
    /// The pool's interface name in agent namespaces.
    pub interface: String,
    /// The bridge in `net` standing for each network (NAD `ns/name`).
    pub bridges: BTreeMap<String, String>,
    /// The OTLP receiver's port on the host loopback, when the run exports traces.
    pub otlp: Option<u16>,
    starts: usize,
}

/// How [`setup_with`] differs from [`setup`].
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Export both binaries' traces to an OTLP/gRPC receiver on this host loopback port
    /// (relayed into agent namespaces like the controller's port).
    pub otlp: Option<u16>,
    /// Run this many controller replicas with leader election (as the chart's Deployment does)
    /// behind a Service stand-in on [`Fleet::grpc`], instead of one controller without election.
    pub controller_replicas: usize,
    /// Makes pool-a dual-stack with this IPv6 `leaseTime` (see [`pool_a`]); `setup_with` then
    /// also waits for both VMs' IPv6 allocations.
    pub ipv6_lease_seconds: Option<u32>,
}

/// One electing controller replica of a [`Fleet`] run with
/// [`Options::controller_replicas`]: its ports stay the same across restarts, as a pod's
/// endpoint would behind the Service; each start gets a new identity, as a new pod would.
pub struct ControllerReplica {
    /// The process, while running.
    pub process: Option<Supervised>,
    /// Its gRPC port on the host loopback.
    pub grpc: u16,
    /// Its HTTP port (`/metrics`, `/readyz`) on the host loopback.
    pub http: u16,
    /// Its identity (`controller-<index>-<start>`) in the current or last start.
    pub identity: String,
}

impl Fleet {
    /// `kubectl ARGS -o json`, parsed.
    pub fn kubectl_json(&self, args: &[&str]) -> Value {
        let out = self
            .cp
            .kubectl()
            .args(args)
            .args(["-o", "json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// `kubectl apply` of one manifest.
    pub fn apply(&self, manifest: &Value) {
        self.cp
            .kubectl_stdin(&["apply", "-f", "-"], &manifest.to_string())
            .unwrap();
    }

    /// `kubectl apply` of a VirtualMachine `name` in [`NS`] with one NIC (`mac`) on the Multus
    /// network `network` (a NAD in [`NS`]).
    pub fn apply_vm(&self, name: &str, mac: &str, network: &str) {
        self.apply(&vm_manifest(NS, name, mac, &format!("{NS}/{network}")));
    }

    /// Starts (or restarts) the controller process.
    pub fn start_controller(&mut self) {
        // The old one first: the new one binds the same ports, and a replacement spawned while
        // its predecessor still shut down found them taken and exited.
        if let Some(mut old) = self.controller.take() {
            old.stop();
        }
        let args = self.controller_args("controller-0", self.grpc, self.controller_http);
        let args = [args, vec!["--no-leader-election".into()]].concat();
        self.controller = Some(self.spawn_controller("controller", args));
    }

    /// Starts (or restarts) electing controller replica `index`, under a new identity.
    pub fn start_replica(&mut self, index: usize) {
        // As in `start_controller`: the replica's ports are free before it starts again.
        if let Some(mut old) = self.replicas[index].process.take() {
            old.stop();
        }
        let (grpc, http) = (self.replicas[index].grpc, self.replicas[index].http);
        let identity = format!("controller-{index}-{}", self.starts);
        let args = self.controller_args(&identity, grpc, http);
        let args = [
            args,
            vec![
                format!("--leader-election-namespace={AGENT_NS}"),
                "--lease-duration-seconds=4".into(),
                "--renew-deadline-seconds=3".into(),
                "--retry-period-seconds=1".into(),
            ],
        ]
        .concat();
        let process = self.spawn_controller(&identity, args);
        let replica = &mut self.replicas[index];
        replica.process = Some(process);
        replica.identity = identity;
    }

    fn controller_args(&self, identity: &str, grpc: u16, http: u16) -> Vec<String> {
        let args = vec![
            "run".into(),
            format!("--kubeconfig={}", self.cp.kubeconfig().display()),
            format!("--identity={identity}"),
            format!("--grpc-listen=127.0.0.1:{grpc}"),
            format!("--http-listen=127.0.0.1:{http}"),
            format!("--agent-deployment={AGENT_NS}/vm-dhcp-agent"),
            "--heartbeat-seconds=2".into(),
            "--grpc-plaintext".into(),
        ];
        [args, self.otlp_args()].concat()
    }

    fn spawn_controller(&mut self, name: &str, args: Vec<String>) -> Supervised {
        let log = self.dir.path().join(format!("{name}-{}.log", self.starts));
        self.starts += 1;
        let bin = workspace_binary("vmdhcp-controller", "vm-dhcp-controller");
        Supervised::spawn(&bin, &args, &log, None).unwrap()
    }

    /// `--otlp-endpoint` when the run exports traces (the same loopback address works in agent
    /// namespaces, through their relay).
    fn otlp_args(&self) -> Vec<String> {
        self.otlp
            .map(|port| vec![format!("--otlp-endpoint=http://127.0.0.1:{port}")])
            .unwrap_or_default()
    }

    /// The host loopback ports agents reach through relays: the API server, the controller's
    /// gRPC and, when tracing, the OTLP receiver.
    fn relayed(&self) -> Vec<(&'static str, u16)> {
        let mut ports = vec![("api", self.api_port()), ("grpc", self.grpc)];
        ports.extend(self.otlp.map(|p| ("otlp", p)));
        ports
    }

    /// Host side of the relays: Unix sockets forwarding to the API server and the controller.
    pub fn relay_sockets(&mut self) {
        for (name, port) in self.relayed() {
            let sock = self.dir.path().join(format!("{name}.sock"));
            let args = vec![
                format!("UNIX-LISTEN:{},fork,unlink-early", sock.display()),
                format!("TCP:127.0.0.1:{port}"),
            ];
            let log = self.dir.path().join(format!("relay-{name}.log"));
            self.relays
                .push(Supervised::spawn(Path::new("socat"), &args, &log, None).unwrap());
        }
    }

    /// The API server's port.
    pub fn api_port(&self) -> u16 {
        self.cp
            .server()
            .rsplit(':')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    }

    /// A namespace for agent `n` with one interface per network of the bootstrap env in
    /// [`Fleet::env`], each plugged into that network's bridge, named as the env says (as Multus
    /// would), and relays to the API server and the controller on its loopback.
    pub fn agent_netns(&mut self, n: usize) -> Netns {
        let ns = self.lab.netns(&format!("a{n}")).unwrap();
        self.lab
            .hosts_file(&ns, &format!("127.0.0.1 localhost\n{NTP_IP} {NTP_HOST}\n"))
            .unwrap();
        let net = self.net.clone();
        let configs: Vec<Value> = serde_json::from_str(&self.env.0).unwrap();
        for (i, config) in configs.iter().enumerate() {
            let nad = config["nadName"].as_str().unwrap();
            let bridge = self
                .bridges
                .get(nad)
                .unwrap_or_else(|| panic!("no bridge for {nad}"));
            let iface = config["interfaceName"].as_str().unwrap();
            self.lab
                .plug(&net, bridge, &format!("pa{n}i{i}"), &ns, iface)
                .unwrap();
        }
        for (name, port) in self.relayed() {
            let sock = self.dir.path().join(format!("{name}.sock"));
            let args = vec![
                "netns".into(),
                "exec".into(),
                ns.name().to_owned(),
                "socat".into(),
                format!("TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr"),
                format!("UNIX-CONNECT:{}", sock.display()),
            ];
            let log = self.dir.path().join(format!("relay-{name}-a{n}.log"));
            self.relays
                .push(Supervised::spawn(Path::new("ip"), &args, &log, None).unwrap());
        }
        ns
    }

    /// Starts agent `identity` in `ns`, booting from the Deployment's env.
    pub fn start_agent(&mut self, ns: &Netns, identity: &str) -> Agent {
        let log = self
            .dir
            .path()
            .join(format!("{identity}-{}.log", self.starts));
        self.starts += 1;
        let args: Vec<String> = vec![
            "RUST_LOG=info".into(),
            "ip".into(),
            "netns".into(),
            "exec".into(),
            ns.name().to_owned(),
            workspace_binary("vmdhcp-agent", "vm-dhcp-agent")
                .display()
                .to_string(),
            "run".into(),
            format!("--controller=http://127.0.0.1:{}", self.grpc),
            format!("--kubeconfig={}", self.cp.kubeconfig().display()),
            format!("--identity={identity}"),
            format!("--namespace={AGENT_NS}"),
            format!("--node=node-{identity}"),
            format!("--agent-network-configs={}", self.env.0),
            format!("--ippool-refs-json={}", self.env.1),
            format!("--lease-duration-seconds={LEASE_SECONDS}"),
            "--renew-deadline-seconds=4".into(),
            format!("--retry-period-seconds={RETRY_SECONDS}"),
            "--report-interval-seconds=2".into(),
            "--http-listen=127.0.0.1:8080".into(),
        ];
        let args = [args, self.otlp_args()].concat();
        let process = Supervised::spawn(Path::new("env"), &args, &log, None).unwrap();
        Agent {
            ns: ns.clone(),
            process,
            identity: identity.to_owned(),
        }
    }

    /// Starts `agent`'s replica again (the process it replaces has been killed or has exited),
    /// in the same pod network under the same identity, and waits until it is a ready standby.
    pub fn restart_as_standby(&mut self, agent: Agent) -> Agent {
        let restarted = self.start_agent(&agent.ns.clone(), &agent.identity.clone());
        drop(agent);
        crate::dhcp_client::wait_for(
            "the restarted agent to be a ready standby",
            std::time::Duration::from_secs(30),
            || {
                let v = self.readyz(&restarted)?;
                (v["ready"] == true && v["agent"]["leader"] == false).then_some(())
            },
        );
        restarted
    }

    /// The agent's `/readyz` body, read inside its namespace.
    pub fn readyz(&self, agent: &Agent) -> Option<Value> {
        let (_, body) = try_http_get(&self.lab, &agent.ns, &format!("{AGENT_HTTP}/readyz"))?;
        serde_json::from_str(body.trim()).ok()
    }

    /// The controller's `/metrics` text (empty while it does not answer).
    pub fn controller_metrics(&self) -> String {
        crate::http::get(&format!("127.0.0.1:{}", self.controller_http), "/metrics")
            .unwrap_or_default()
    }

    /// The agent's `/metrics` text, read inside its namespace (empty while it does not answer).
    pub fn agent_metrics(&self, agent: &Agent) -> String {
        try_http_get(&self.lab, &agent.ns, &format!("{AGENT_HTTP}/metrics"))
            .map(|(_, body)| body)
            .unwrap_or_default()
    }

    /// The MAC of `interface` in `ns`, as `ip link` prints it (lowercase, colons).
    pub fn mac_of(&self, ns: &Netns, interface: &str) -> String {
        self.lab
            .exec(ns, "cat", &[&format!("/sys/class/net/{interface}/address")])
            .unwrap()
            .trim()
            .to_owned()
    }

    /// The MAC `ns`'s neighbour table holds for `ip` on eth0, and the entry's state
    /// (`REACHABLE`, `STALE`, …); `None` without an entry or without a MAC (`INCOMPLETE`, `FAILED`).
    pub fn neighbour(&self, ns: &Netns, ip: &str) -> Option<(String, String)> {
        let out = self
            .lab
            .exec(ns, "ip", &["-4", "neigh", "show", ip, "dev", "eth0"])
            .ok()?;
        let words: Vec<&str> = out.split_whitespace().collect();
        let at = words.iter().position(|w| *w == "lladdr")?;
        Some((words.get(at + 1)?.to_string(), words.last()?.to_string()))
    }

    /// The one agent that says it leads (and serves), once exactly one does.
    pub fn leader<'a>(&self, agents: &[&'a Agent]) -> &'a Agent {
        wait_for(
            "exactly one serving leader",
            Duration::from_secs(60),
            || {
                let views: Vec<Option<Value>> = agents.iter().map(|a| self.readyz(a)).collect();
                let leaders: Vec<usize> = views
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| {
                        v.as_ref().is_some_and(|v| {
                            v["agent"]["leader"] == true
                                && v["interfaces"].as_object().is_some_and(|i| {
                                    !i.is_empty() && i.values().all(|s| s["state"] == "serving")
                                })
                        })
                    })
                    .map(|(i, _)| i)
                    .collect();
                (leaders.len() == 1).then(|| agents[leaders[0]])
            },
        )
    }

    /// A VM namespace with `eth0` (MAC `mac`) on pool-a's bridge.
    pub fn vm(&mut self, name: &str, mac: &str) -> Netns {
        self.vm_on(name, mac, "br0")
    }

    /// A VM namespace with `eth0` (MAC `mac`) on `bridge`.
    pub fn vm_on(&mut self, name: &str, mac: &str, bridge: &str) -> Netns {
        let vm = self.lab.netns(name).unwrap();
        self.plug_vm(vm, name, mac, bridge)
    }

    /// [`Fleet::vm`] for a DHCPv6 client: IPv6 duplicate address detection off in the namespace
    /// before its link exists ([`crate::dhcp6_client::no_dad`]), so `eth0`'s link-local address,
    /// which DHCPv6 clients send from, is usable at once; returns once it is.
    pub fn vm6(&mut self, name: &str, mac: &str) -> Netns {
        let vm = self.lab.netns(name).unwrap();
        crate::dhcp6_client::no_dad(&self.lab, &vm);
        let vm = self.plug_vm(vm, name, mac, "br0");
        crate::dhcp6_client::wait_link_local(&self.lab, &vm, "eth0", Duration::from_secs(10));
        vm
    }

    fn plug_vm(&mut self, vm: Netns, name: &str, mac: &str, bridge: &str) -> Netns {
        let net = self.net.clone();
        self.lab
            .plug(&net, bridge, &format!("p{name}"), &vm, "eth0")
            .unwrap();
        self.lab
            .exec(&vm, "ip", &["link", "set", "eth0", "address", mac])
            .unwrap();
        vm
    }

    /// pool-a's allocations, MAC → address, from its status.
    pub fn allocated(&self) -> BTreeMap<String, String> {
        self.allocated_in("pool-a")
    }

    /// The bootstrap env the controller wrote into the agent Deployment:
    /// (`AGENT_NETWORK_CONFIGS`, `IPPOOL_REFS_JSON`).
    pub fn bootstrap_env(&self) -> Option<(String, String)> {
        let d = self.kubectl_json(&["-n", AGENT_NS, "get", "deployment", "vm-dhcp-agent"]);
        let env = d["spec"]["template"]["spec"]["containers"][0]["env"].as_array()?;
        let get = |name: &str| {
            env.iter()
                .find(|e| e["name"] == name)
                .and_then(|e| e["value"].as_str())
                .map(str::to_owned)
        };
        Some((get("AGENT_NETWORK_CONFIGS")?, get("IPPOOL_REFS_JSON")?))
    }

    /// pool-a's IPv6 allocations, MAC → address, from its `status.ipv6` (dual-stack runs).
    pub fn allocated6(&self) -> BTreeMap<String, String> {
        self.allocated_family("pool-a", "ipv6")
    }

    /// A pool's allocations, MAC → address, from its status.
    pub fn allocated_in(&self, pool: &str) -> BTreeMap<String, String> {
        self.allocated_family(pool, "ipv4")
    }

    /// A pool's `status.<family>.allocated`, MAC → address.
    fn allocated_family(&self, pool: &str, family: &str) -> BTreeMap<String, String> {
        let pool = self.kubectl_json(&["-n", NS, "get", "ippool", pool]);
        pool["status"][family]["allocated"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(ip, mac)| (mac.as_str().unwrap_or_default().to_owned(), ip.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A running KubeVirt VirtualMachine `namespace/name` with one bridged NIC (`mac`) on the Multus
/// network `network` (its NAD's `namespace/name`), as a user would apply it.
pub fn vm_manifest(namespace: &str, name: &str, mac: &str, network: &str) -> Value {
    json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"running": true, "template": {"spec": {
            "domain": {"devices": {"interfaces": [{"name": "nic-0", "macAddress": mac, "bridge": {}}]}},
            "networks": [{"name": "nic-0", "multus": {"networkName": network}}]
        }}}
    })
}

/// `integration/bench/dhcp_probe.py` in a VM namespace: one command in, one answer out. It sends a
/// fresh transaction every 10 ms until answered, so it measures the server, not a real client's
/// retry backoff.
pub struct Probe {
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl Probe {
    /// Starts the probe on `vm`'s eth0 (killed when `lab` drops); a command not answered within
    /// `timeout_seconds` answers `timeout`.
    pub fn start(lab: &mut Lab, vm: &Netns, timeout_seconds: u64) -> Probe {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/dhcp_probe.py");
        let mut cmd = vm.command("python3");
        cmd.arg(script)
            .args(["eth0", &timeout_seconds.to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped());
        let child = lab.spawn(cmd).unwrap();
        let mut probe = Probe {
            stdin: child.stdin.take().unwrap(),
            stdout: std::io::BufReader::new(child.stdout.take().unwrap()),
        };
        assert_eq!(probe.line(), "ready");
        probe
    }

    fn line(&mut self) -> String {
        use std::io::BufRead;
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim().to_owned()
    }

    /// Runs one probe command (`discover MAC`, `request MAC IP [DNS]`); the time from now to its
    /// answer. Fails the caller on a timeout.
    pub fn ask(&mut self, command: &str) -> Duration {
        let start = Instant::now();
        self.send(command);
        self.answered(command);
        start.elapsed()
    }

    /// [`Probe::ask`], with a timeout as `None` instead of a failure.
    pub fn try_ask(&mut self, command: &str) -> Option<Duration> {
        let start = Instant::now();
        self.send(command);
        self.line().starts_with("ok ").then(|| start.elapsed())
    }

    /// Starts a probe command.
    pub fn send(&mut self, command: &str) {
        use std::io::Write;
        writeln!(self.stdin, "{command}").unwrap();
    }

    /// Waits for the answer to the command sent; fails the caller on a timeout.
    pub fn answered(&mut self, command: &str) {
        let answer = self.line();
        assert!(answer.starts_with("ok "), "{command}: {answer}");
    }
}

/// The sum of the samples in Prometheus `text` whose line starts with `series` (a name, or a
/// name and the start of its labels); `None` when there is no such sample.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    let values: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with(series))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// Server replies that answer the same client request packet from more than one server: each
/// reply is paired with the latest request with its xid captured before it (clients such as ISC
/// dhclient reuse one xid for every renewal of a lease, so an xid alone is not one request).
pub fn doubled_replies(messages: &[Captured]) -> Vec<Vec<Captured>> {
    let mut by_request: BTreeMap<(usize, u32, u8), Vec<Captured>> = BTreeMap::new();
    for (i, reply) in messages.iter().enumerate().filter(|(_, m)| m.op == 2) {
        let request = messages[..i]
            .iter()
            .rposition(|m| m.op == 1 && m.xid == reply.xid)
            .unwrap_or(usize::MAX);
        by_request
            .entry((request, reply.xid, reply.kind))
            .or_default()
            .push(reply.clone());
    }
    by_request
        .into_values()
        .filter(|replies| {
            replies
                .iter()
                .map(|r| r.src)
                .collect::<std::collections::BTreeSet<_>>()
                .len()
                > 1
        })
        .collect()
}

/// Probes with one-shot udhcpc runs until one gets `ip`; returns the time it took.
pub fn probe_until_leased(vm: &Netns, dir: &Path, ip: &str, limit: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let out = udhcpc(vm, dir, &["-t", "1", "-T", "1", "-r", ip]);
        let text = String::from_utf8_lossy(&out.stderr).into_owned()
            + &String::from_utf8_lossy(&out.stdout);
        if out.status.success() && text.contains(&format!("lease of {ip} obtained")) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "no lease of {ip} within {limit:?}: {text}"
        );
    }
}

/// One DHCP message seen in a capture.
#[derive(Clone, Debug, Default)]
pub struct Captured {
    /// Capture time, seconds since the epoch.
    pub at: f64,
    /// BOOTP op: 1 request (client), 2 reply (server).
    pub op: u8,
    /// Transaction id.
    pub xid: u32,
    /// Message type (1 discover, 3 request, 2 offer, 5 ack, 6 nak, …).
    pub kind: u8,
    /// Source MAC (which client or server).
    pub src: [u8; 6],
    /// Destination MAC.
    pub dst: [u8; 6],
    /// The client's hardware address.
    pub chaddr: [u8; 6],
    /// The address offered or acknowledged.
    pub yiaddr: [u8; 4],
    /// The client's address as it says (set in RENEW/REBIND requests, zero otherwise).
    pub ciaddr: [u8; 4],
    /// Destination IP address (a broadcast, or a unicast to the server or client).
    pub dst_ip: [u8; 4],
}

/// One ARP Announcement (RFC 5227: a request whose sender and target IP are the same) seen in a
/// capture.
#[derive(Clone, Debug, PartialEq)]
pub struct Announced {
    /// Capture time, seconds since the epoch.
    pub at: f64,
    /// The announcing MAC (Ethernet source and ARP sender hardware address, which must agree).
    pub mac: [u8; 6],
    /// The address announced.
    pub ip: [u8; 4],
    /// The Ethernet destination (broadcast for an announcement).
    pub dst: [u8; 6],
}

/// Frames of a pcap file: (capture time in seconds since the epoch, frame bytes).
fn frames(pcap: &Path) -> Vec<(f64, Vec<u8>)> {
    let data = fs::read(pcap).unwrap_or_default();
    let mut out = Vec::new();
    let mut at = 24; // global header
    while at + 16 <= data.len() {
        let secs = u32::from_le_bytes(data[at..at + 4].try_into().unwrap());
        let usecs = u32::from_le_bytes(data[at + 4..at + 8].try_into().unwrap());
        let caplen = u32::from_le_bytes(data[at + 8..at + 12].try_into().unwrap()) as usize;
        let frame = &data[(at + 16).min(data.len())..(at + 16 + caplen).min(data.len())];
        at += 16 + caplen;
        out.push((f64::from(secs) + f64::from(usecs) / 1e6, frame.to_vec()));
    }
    out
}

/// ARP Announcements in a pcap file, in capture order.
pub fn arp_announcements(pcap: &Path) -> Vec<Announced> {
    frames(pcap)
        .into_iter()
        .filter_map(|(at, frame)| {
            // Ethernet/IPv4 ARP request with sender IP == target IP, sender MAC == source MAC.
            let arp = frame.get(14..42)?;
            let is_announcement = frame[12..14] == [0x08, 0x06]
                && arp[0..8] == [0, 1, 8, 0, 6, 4, 0, 1]
                && arp[14..18] == arp[24..28]
                && arp[8..14] == frame[6..12];
            is_announcement.then(|| Announced {
                at,
                mac: frame[6..12].try_into().unwrap(),
                ip: arp[14..18].try_into().unwrap(),
                dst: frame[0..6].try_into().unwrap(),
            })
        })
        .collect()
}

/// DHCP messages in a pcap file, in capture order, with when, from and to whom and for what.
pub fn captured(pcap: &Path) -> Vec<Captured> {
    let mut out = Vec::new();
    for (at, frame) in frames(pcap) {
        let frame = frame.as_slice();
        if frame.len() < 14 + 20 + 8 + 240 || frame[12..14] != [0x08, 0x00] {
            continue;
        }
        let ihl = usize::from(frame[14] & 0x0f) * 4;
        let dhcp = &frame[14 + ihl + 8..];
        if dhcp.len() < 240 || !(dhcp[0] == 1 || dhcp[0] == 2) {
            continue;
        }
        let xid = u32::from_be_bytes(dhcp[4..8].try_into().unwrap());
        let mut kind = 0;
        let mut i = 240;
        while i + 1 < dhcp.len() && dhcp[i] != 255 {
            if dhcp[i] == 0 {
                i += 1;
                continue;
            }
            let len = usize::from(dhcp[i + 1]);
            if dhcp[i] == 53 && len == 1 && i + 2 < dhcp.len() {
                kind = dhcp[i + 2];
            }
            i += 2 + len;
        }
        out.push(Captured {
            at,
            op: dhcp[0],
            xid,
            kind,
            src: frame[6..12].try_into().unwrap(),
            dst: frame[0..6].try_into().unwrap(),
            chaddr: dhcp[28..34].try_into().unwrap(),
            yiaddr: dhcp[16..20].try_into().unwrap(),
            ciaddr: dhcp[12..16].try_into().unwrap(),
            dst_ip: frame[30..34].try_into().unwrap(),
        });
    }
    out
}

/// TEST DOUBLE for the controller's Service (kube-proxy): accepts on `port` of the host loopback
/// and forwards each connection to the next replica port that accepts, round robin, so agents
/// stream from whichever replica is up, as behind the chart's Service. A connection whose replica
/// dies is closed on both sides, and the agent reconnects through it to another.
fn service_standin(port: u16, replicas: Vec<u16>) {
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    std::thread::spawn(move || {
        let mut next = 0;
        for client in listener.incoming() {
            let Ok(client) = client else { continue };
            next += 1;
            let upstream = (0..replicas.len()).find_map(|k| {
                let to = std::net::SocketAddr::from((
                    [127, 0, 0, 1],
                    replicas[(next + k) % replicas.len()],
                ));
                std::net::TcpStream::connect_timeout(&to, Duration::from_millis(500)).ok()
            });
            // No replica up: dropping the connection makes the agent retry with its backoff.
            let Some(upstream) = upstream else { continue };
            for (from, to) in [
                (client.try_clone(), upstream.try_clone()),
                (Ok(upstream), Ok(client)),
            ] {
                let (Ok(mut from), Ok(mut to)) = (from, to) else {
                    continue;
                };
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from, &mut to);
                    let _ = to.shutdown(std::net::Shutdown::Both);
                    let _ = from.shutdown(std::net::Shutdown::Both);
                });
            }
        }
    });
}

/// Starts the control plane and the controller, applies the agent Deployment, a NAD, an IPPool
/// and two VMs with kubectl, and returns once both VMs are allocated and the controller wrote the
/// agents' bootstrap env.
pub fn setup() -> Fleet {
    setup_with(Options::default())
}

/// [`setup`], with `options`.
pub fn setup_with(options: Options) -> Fleet {
    let cp = ControlPlane::start().unwrap();
    let mut lab = Lab::new().unwrap();
    let net = lab.netns("net").unwrap();
    lab.bridge(&net, "br0").unwrap();
    let mut fleet = Fleet {
        cp,
        lab,
        dir: tempfile::tempdir().unwrap(),
        net,
        grpc: free_port(),
        controller_http: free_port(),
        controller: None,
        replicas: Vec::new(),
        relays: Vec::new(),
        env: (String::new(), String::new()),
        interface: String::new(),
        bridges: BTreeMap::from([(format!("{NS}/net-a"), "br0".to_owned())]),
        otlp: options.otlp,
        starts: 0,
    };
    fleet.apply(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}));
    fleet.apply(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": AGENT_NS}}));
    fleet.apply(&json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "vm-dhcp-agent", "namespace": AGENT_NS},
        "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": {
            "metadata": {"labels": {"app": "agent"}},
            "spec": {"containers": [{"name": "agent", "image": "vmdhcp/agent:test"}]}
        }}
    }));
    if options.controller_replicas > 1 {
        for index in 0..options.controller_replicas {
            let http = if index == 0 {
                fleet.controller_http
            } else {
                free_port()
            };
            fleet.replicas.push(ControllerReplica {
                process: None,
                grpc: free_port(),
                http,
                identity: String::new(),
            });
            fleet.start_replica(index);
        }
        service_standin(fleet.grpc, fleet.replicas.iter().map(|r| r.grpc).collect());
    } else {
        fleet.start_controller();
    }
    fleet.relay_sockets();
    fleet.apply(&json!({
        "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": "net-a", "namespace": NS},
        "spec": {"config": "{\"cniVersion\":\"0.3.1\",\"type\":\"bridge\",\"bridge\":\"br0\"}"}
    }));
    fleet.apply(&pool_a(options.ipv6_lease_seconds));
    for (name, mac) in [("vm1", VM1_MAC), ("vm2", VM2_MAC)] {
        fleet.apply_vm(name, mac, "net-a");
    }
    // The controller writes the pool's network into the agent Deployment: that is what the
    // agents boot from, as pods of that Deployment would.
    let env = wait_for(
        "the bootstrap env in the agent Deployment",
        Duration::from_secs(60),
        || fleet.bootstrap_env().filter(|(configs, _)| configs != "[]"),
    );
    let configs: Value = serde_json::from_str(&env.0).unwrap();
    fleet.interface = configs[0]["interfaceName"].as_str().unwrap().to_owned();
    fleet.env = env;
    wait_for("both VMs allocated", Duration::from_secs(60), || {
        let a = fleet.allocated();
        (a.contains_key(VM1_MAC) && a.contains_key(VM2_MAC)).then_some(())
    });
    if options.ipv6_lease_seconds.is_some() {
        wait_for("both VMs allocated IPv6", Duration::from_secs(60), || {
            let a = fleet.allocated6();
            (a.contains_key(VM1_MAC) && a.contains_key(VM2_MAC)).then_some(())
        });
    }
    fleet
}

/// The IPPool `pool-a` on `net-a`: 10.123.45.0/24 with its server at [`SERVER_IP`], router,
/// DNS, domain, [`NTP_HOST`] and 20 s leases; with `ipv6_lease_seconds`, dual-stack too:
/// [`SUBNET6`] with its server at [`SERVER_IP6`], the range `::50`–`::99`, router `::1`, DNS
/// `::53` and that `leaseTime`.
pub fn pool_a(ipv6_lease_seconds: Option<u32>) -> Value {
    let mut pool = json!({
        "apiVersion": "network.harvesterhci.io/v1alpha1", "kind": "IPPool",
        "metadata": {"name": "pool-a", "namespace": NS},
        "spec": {"networkName": format!("{NS}/net-a"), "ipv4Config": {
            "serverIP": SERVER_IP, "cidr": "10.123.45.0/24",
            "pool": {"start": "10.123.45.50", "end": "10.123.45.99"},
            "router": "10.123.45.1", "dns": ["10.123.45.53"], "domainName": "fleet.test",
            "ntp": [NTP_HOST], "leaseTime": 20
        }}
    });
    if let Some(lease) = ipv6_lease_seconds {
        pool["spec"]["ipv6Config"] = json!({
            "serverIP": SERVER_IP6, "cidr": SUBNET6,
            "pool": {"start": "fd10:123:45::50", "end": "fd10:123:45::99"},
            "router": "fd10:123:45::1", "dns": ["fd10:123:45::53"], "leaseTime": lease
        });
    }
    pool
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(op: u8, kind: u8, xid: u32, src: u8) -> Captured {
        Captured {
            at: 0.0,
            op,
            xid,
            kind,
            src: [2, 0, 0, 0, 0, src],
            dst: [0xff; 6],
            chaddr: [2, 0, 0, 0, 0, 1],
            yiaddr: [10, 0, 0, 10],
            ciaddr: [0; 4],
            dst_ip: [255; 4],
        }
    }

    #[test]
    fn arp_announcements_are_told_from_other_arp_frames() {
        // pcap global header (24 bytes, little endian), then records of 16 + frame bytes.
        let mut pcap = vec![0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0];
        pcap.resize(24, 0);
        let arp = |op: u8, spa: [u8; 4], tpa: [u8; 4]| {
            let mac = [2, 0, 0, 0, 0, 7];
            let mut f = vec![0xff; 6];
            f.extend(mac);
            f.extend([8, 6, 0, 1, 8, 0, 6, 4, 0, op]);
            f.extend(mac);
            f.extend(spa);
            f.extend([0; 6]);
            f.extend(tpa);
            f
        };
        let server = [10, 123, 45, 2];
        for (secs, frame) in [
            (1u32, arp(1, server, server)),         // announcement
            (2, arp(1, server, [10, 123, 45, 50])), // an ordinary who-has
            (3, arp(2, server, server)),            // a reply, not a request
        ] {
            pcap.extend(secs.to_le_bytes());
            pcap.extend(0u32.to_le_bytes());
            let len = u32::try_from(frame.len()).unwrap().to_le_bytes();
            pcap.extend(len);
            pcap.extend(len);
            pcap.extend(frame);
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("arp.pcap");
        fs::write(&path, pcap).unwrap();
        assert_eq!(
            arp_announcements(&path),
            vec![Announced {
                at: 1.0,
                mac: [2, 0, 0, 0, 0, 7],
                ip: server,
                dst: [0xff; 6],
            }]
        );
    }

    #[test]
    fn replies_are_doubled_only_when_two_servers_answer_one_request() {
        // dhclient renews with the xid of its first exchange: one server per request is fine.
        let renewals = [
            msg(1, 3, 7, 1),
            msg(2, 5, 7, 0xa),
            msg(1, 3, 7, 1),
            msg(2, 5, 7, 0xb),
        ];
        assert!(doubled_replies(&renewals).is_empty());
        let split_brain = [msg(1, 3, 7, 1), msg(2, 5, 7, 0xa), msg(2, 5, 7, 0xb)];
        assert_eq!(doubled_replies(&split_brain).len(), 1);
        // A reply with no captured request still counts, grouped by xid alone.
        let orphans = [msg(2, 2, 9, 0xa), msg(2, 2, 9, 0xb)];
        assert_eq!(doubled_replies(&orphans).len(), 1);
        let unrelated = [msg(2, 2, 9, 0xa), msg(2, 2, 10, 0xb)];
        assert!(doubled_replies(&unrelated).is_empty());
    }
}
