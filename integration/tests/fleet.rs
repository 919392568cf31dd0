//! The whole system end to end: real API server, the controller and two agents as processes,
//! real DHCP clients.
//!
//! Topology: one namespace holds a bridge standing for the VM network; each agent replica runs in
//! a namespace of its own with a veth on the bridge named as the controller's bootstrap env says
//! (the interface Multus would have given it); each VM is a namespace with a veth on the bridge.
//! Agents reach the API server and the controller, which listen on the host's loopback, through
//! `socat` relays over Unix sockets (paths are not namespaced), so the agent binary runs unchanged
//! and nothing is added to the host's network. Addresses are 10.123.45.0/24, inside the lab only.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use vmdhcp_integration::control_plane::ControlPlane;
use vmdhcp_integration::dhcp_client::{start_dhclient, udhcpc, wait_event, wait_for};
use vmdhcp_integration::netns::{Lab, Netns};
use vmdhcp_integration::process::{Supervised, workspace_binary};

const NS: &str = "fleet";
const AGENT_NS: &str = "vmdhcp-system";
const SERVER_IP: &str = "10.123.45.2";
const LEASE_SECONDS: u64 = 6;
const RETRY_SECONDS: u64 = 1;
const VM1_MAC: &str = "02:12:34:00:00:01";
const VM2_MAC: &str = "02:12:34:00:00:02";
const AGENT_HTTP: &str = "http://127.0.0.1:8080";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Agent {
    ns: Netns,
    process: Supervised,
    identity: String,
}

struct Fleet {
    cp: ControlPlane,
    lab: Lab,
    dir: tempfile::TempDir,
    net: Netns,
    grpc: u16,
    controller: Option<Supervised>,
    relays: Vec<Supervised>,
    env: (String, String),
    interface: String,
    starts: usize,
}

impl Fleet {
    fn kubectl_json(&self, args: &[&str]) -> Value {
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

    fn apply(&self, manifest: &Value) {
        self.cp
            .kubectl_stdin(&["apply", "-f", "-"], &manifest.to_string())
            .unwrap();
    }

    fn start_controller(&mut self) {
        let log = self
            .dir
            .path()
            .join(format!("controller-{}.log", self.starts));
        self.starts += 1;
        let args: Vec<String> = vec![
            "run".into(),
            format!("--kubeconfig={}", self.cp.kubeconfig().display()),
            "--identity=controller-0".into(),
            format!("--grpc-listen=127.0.0.1:{}", self.grpc),
            format!("--http-listen=127.0.0.1:{}", free_port()),
            format!("--agent-deployment={AGENT_NS}/vm-dhcp-agent"),
            "--no-leader-election".into(),
            "--heartbeat-seconds=2".into(),
        ];
        let bin = workspace_binary("vmdhcp-controller", "vm-dhcp-controller");
        self.controller = Some(Supervised::spawn(&bin, &args, &log, None).unwrap());
    }

    fn relay_sockets(&mut self) {
        for (name, port) in [("api", self.api_port()), ("grpc", self.grpc)] {
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

    fn api_port(&self) -> u16 {
        self.cp
            .server()
            .rsplit(':')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    }

    /// A namespace for agent `n`, plugged into the bridge, with relays to the API server and
    /// the controller on its loopback.
    fn agent_netns(&mut self, n: usize) -> Netns {
        let ns = self.lab.netns(&format!("a{n}")).unwrap();
        let (net, iface) = (self.net.clone(), self.interface.clone());
        self.lab
            .plug(&net, "br0", &format!("pa{n}"), &ns, &iface)
            .unwrap();
        for (name, port) in [("api", self.api_port()), ("grpc", self.grpc)] {
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

    fn start_agent(&mut self, ns: &Netns, identity: &str) -> Agent {
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
        let process = Supervised::spawn(Path::new("env"), &args, &log, None).unwrap();
        Agent {
            ns: ns.clone(),
            process,
            identity: identity.to_owned(),
        }
    }

    fn readyz(&self, agent: &Agent) -> Option<Value> {
        let script = format!(
            "import urllib.request,urllib.error\n\
             try:\n\
             \x20 r=urllib.request.urlopen('{AGENT_HTTP}/readyz',timeout=2); print(r.read().decode())\n\
             except urllib.error.HTTPError as e:\n\
             \x20 print(e.read().decode())\n"
        );
        let out = self.lab.exec(&agent.ns, "python3", &["-c", &script]).ok()?;
        serde_json::from_str(out.trim()).ok()
    }

    /// The one agent that says it leads (and serves), once exactly one does.
    fn leader<'a>(&self, agents: &[&'a Agent]) -> &'a Agent {
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

    fn vm(&mut self, name: &str, mac: &str) -> Netns {
        let vm = self.lab.netns(name).unwrap();
        let net = self.net.clone();
        self.lab
            .plug(&net, "br0", &format!("p{name}"), &vm, "eth0")
            .unwrap();
        self.lab
            .exec(&vm, "ip", &["link", "set", "eth0", "address", mac])
            .unwrap();
        vm
    }

    fn allocated(&self) -> BTreeMap<String, String> {
        let pool = self.kubectl_json(&["-n", NS, "get", "ippool", "pool-a"]);
        pool["status"]["ipv4"]["allocated"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(ip, mac)| (mac.as_str().unwrap_or_default().to_owned(), ip.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Probes with one-shot udhcpc runs until one gets `ip`; returns the time it took.
fn probe_until_leased(vm: &Netns, dir: &Path, ip: &str, limit: Duration) -> Duration {
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

/// DHCP replies in a pcap file: (xid, message type, source MAC).
fn replies(pcap: &Path) -> Vec<(u32, u8, [u8; 6])> {
    let data = fs::read(pcap).unwrap_or_default();
    let mut out = Vec::new();
    let mut at = 24; // global header
    while at + 16 <= data.len() {
        let caplen = u32::from_le_bytes(data[at + 8..at + 12].try_into().unwrap()) as usize;
        let frame = &data[(at + 16).min(data.len())..(at + 16 + caplen).min(data.len())];
        at += 16 + caplen;
        if frame.len() < 14 + 20 + 8 + 240 || frame[12..14] != [0x08, 0x00] {
            continue;
        }
        let ihl = usize::from(frame[14] & 0x0f) * 4;
        let dhcp = &frame[14 + ihl + 8..];
        if dhcp.len() < 240 || dhcp[0] != 2 {
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
        let src: [u8; 6] = frame[6..12].try_into().unwrap();
        out.push((xid, kind, src));
    }
    out
}

fn setup() -> Fleet {
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
        controller: None,
        relays: Vec::new(),
        env: (String::new(), String::new()),
        interface: String::new(),
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
    fleet.start_controller();
    fleet.relay_sockets();
    fleet.apply(&json!({
        "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": "net-a", "namespace": NS},
        "spec": {"config": "{\"cniVersion\":\"0.3.1\",\"type\":\"bridge\",\"bridge\":\"br0\"}"}
    }));
    fleet.apply(&json!({
        "apiVersion": "network.harvesterhci.io/v1alpha1", "kind": "IPPool",
        "metadata": {"name": "pool-a", "namespace": NS},
        "spec": {"networkName": format!("{NS}/net-a"), "ipv4Config": {
            "serverIP": SERVER_IP, "cidr": "10.123.45.0/24",
            "pool": {"start": "10.123.45.50", "end": "10.123.45.99"},
            "router": "10.123.45.1", "dns": ["10.123.45.53"], "domainName": "fleet.test",
            "leaseTime": 20
        }}
    }));
    for (name, mac) in [("vm1", VM1_MAC), ("vm2", VM2_MAC)] {
        fleet.apply(&json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"running": true, "template": {"spec": {
                "domain": {"devices": {"interfaces": [{"name": "nic-0", "macAddress": mac, "bridge": {}}]}},
                "networks": [{"name": "nic-0", "multus": {"networkName": format!("{NS}/net-a")}}]
            }}}
        }));
    }
    // The controller writes the pool's network into the agent Deployment: that is what the
    // agents boot from, as pods of that Deployment would.
    let env = wait_for(
        "the bootstrap env in the agent Deployment",
        Duration::from_secs(60),
        || {
            let d = fleet.kubectl_json(&["-n", AGENT_NS, "get", "deployment", "vm-dhcp-agent"]);
            let env = d["spec"]["template"]["spec"]["containers"][0]["env"]
                .as_array()?
                .clone();
            let get = |name: &str| {
                env.iter()
                    .find(|e| e["name"] == name)
                    .and_then(|e| e["value"].as_str())
                    .map(str::to_owned)
            };
            let configs = get("AGENT_NETWORK_CONFIGS")?;
            (configs != "[]").then_some((configs, get("IPPOOL_REFS_JSON")?))
        },
    );
    let configs: Value = serde_json::from_str(&env.0).unwrap();
    fleet.interface = configs[0]["interfaceName"].as_str().unwrap().to_owned();
    fleet.env = env;
    wait_for("both VMs allocated", Duration::from_secs(60), || {
        let a = fleet.allocated();
        (a.contains_key(VM1_MAC) && a.contains_key(VM2_MAC)).then_some(())
    });
    fleet
}

#[test]
fn kubectl_apply_to_lease_then_failover_fallback_and_resume() {
    let mut fleet = setup();
    let allocated = fleet.allocated();
    let (ip1, ip2) = (allocated[VM1_MAC].clone(), allocated[VM2_MAC].clone());

    // Two agents, one leader.
    let ns0 = fleet.agent_netns(0);
    let ns1 = fleet.agent_netns(1);
    let a0 = fleet.start_agent(&ns0, "agent-0");
    let a1 = fleet.start_agent(&ns1, "agent-1");
    let vm1 = fleet.vm("vm1", VM1_MAC);
    let vm2 = fleet.vm("vm2", VM2_MAC);
    let pcap = fleet.dir.path().join("vm1.pcap");
    let mut tcpdump = vm1.command("tcpdump");
    tcpdump
        .args(["-i", "eth0", "-U", "-n", "-w"])
        .arg(&pcap)
        .args(["udp", "port", "67", "or", "udp", "port", "68"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    fleet.lab.spawn(tcpdump).unwrap();
    let leader = fleet.leader(&[&a0, &a1]).identity.clone();
    let standby = fleet
        .readyz(if leader == a0.identity { &a1 } else { &a0 })
        .unwrap();
    assert_eq!(standby["agent"]["leader"], false, "{standby}");
    assert_eq!(standby["ready"], true, "a hot standby is ready: {standby}");
    assert_eq!(standby["agent"]["source"], "stream", "{standby}");

    // A real dhclient gets the allocated address and the pool's options.
    let dir1 = fleet.dir.path().join("vm1");
    fs::create_dir_all(&dir1).unwrap();
    start_dhclient(&mut fleet.lab, &vm1, &dir1);
    let bound = wait_event(&dir1, "BOUND", 0, Duration::from_secs(30));
    assert_eq!(bound["new_ip_address"], ip1);
    assert_eq!(bound["new_routers"], "10.123.45.1");
    assert_eq!(bound["new_domain_name_servers"], "10.123.45.53");
    assert_eq!(bound["new_domain_name"], "fleet.test");
    assert_eq!(bound["new_dhcp_server_identifier"], SERVER_IP);

    // The pool says which agent serves it.
    wait_for("AgentReady on the pool", Duration::from_secs(30), || {
        let pool = fleet.kubectl_json(&["-n", NS, "get", "ippool", "pool-a"]);
        pool["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "AgentReady" && c["status"] == "True")
            .filter(|c| c["message"].as_str().is_some_and(|m| m.contains(&leader)))
            .map(|_| ())
    });

    // kill -9 the leader: the standby answers within lease duration + 2 s (+1 s of probe).
    let (mut killed, survivor) = if leader == a0.identity {
        (a0, a1)
    } else {
        (a1, a0)
    };
    assert!(killed.process.signal("KILL"));
    let probe_dir = fleet.dir.path().join("probe");
    let took = probe_until_leased(
        &vm2,
        &probe_dir,
        &ip2,
        Duration::from_secs(LEASE_SECONDS + 2 + 1),
    );
    eprintln!("crash failover: a renewal answered {took:?} after kill -9");
    assert_eq!(fleet.leader(&[&survivor]).identity, survivor.identity);

    // The killed replica comes back in the same pod network: a standby, with the address it
    // left behind removed.
    killed = fleet.start_agent(&killed.ns.clone(), &killed.identity.clone());
    wait_for(
        "the restarted agent to be a ready standby",
        Duration::from_secs(30),
        || {
            let v = fleet.readyz(&killed)?;
            (v["ready"] == true && v["agent"]["leader"] == false).then_some(())
        },
    );
    let addrs = fleet
        .lab
        .exec(&killed.ns, "ip", &["-4", "addr", "show", &fleet.interface])
        .unwrap();
    assert!(
        !addrs.contains(SERVER_IP),
        "standby still carries the server address: {addrs}"
    );

    // SIGTERM the leader: handoff within 3 s (+1 s of probe).
    assert!(survivor.process.signal("TERM"));
    let took = probe_until_leased(&vm2, &probe_dir, &ip2, Duration::from_secs(3 + 1));
    eprintln!("graceful failover: a renewal answered {took:?} after SIGTERM");
    wait_for("the old leader to exit", Duration::from_secs(10), || {
        survivor.process.exited().then_some(())
    });
    assert_eq!(fleet.leader(&[&killed]).identity, killed.identity);

    // The controller dies; agents keep serving; a freshly started agent with no stream serves
    // every lease recorded in etcd from IPPool status.
    fleet.controller.take().unwrap().stop();
    probe_until_leased(&vm2, &probe_dir, &ip2, Duration::from_secs(10));
    let fresh_ns = killed.ns.clone();
    drop(killed);
    let fresh = fleet.start_agent(&fresh_ns, "agent-2");
    let fresh = {
        let leader = fleet.leader(&[&fresh]);
        let v = fleet.readyz(leader).unwrap();
        assert_eq!(v["agent"]["source"], "ippool-status", "{v}");
        leader
    };
    probe_until_leased(&vm2, &probe_dir, &ip2, Duration::from_secs(15));
    probe_until_leased(&vm1, &probe_dir, &ip1, Duration::from_secs(15));

    // The controller returns: the stream takes over again, nothing lost or changed.
    fleet.start_controller();
    wait_for(
        "the agent back on the stream",
        Duration::from_secs(60),
        || {
            let v = fleet.readyz(fresh)?;
            (v["agent"]["source"] == "stream" && v["stream"]["connected"] == true).then_some(())
        },
    );
    probe_until_leased(&vm1, &probe_dir, &ip1, Duration::from_secs(15));
    probe_until_leased(&vm2, &probe_dir, &ip2, Duration::from_secs(15));
    assert_eq!(fleet.allocated(), allocated, "allocations changed");

    // Never two servers answering one client transaction.
    let mut by_xid: BTreeMap<(u32, u8), BTreeSet<[u8; 6]>> = BTreeMap::new();
    for (xid, kind, src) in replies(&pcap) {
        by_xid.entry((xid, kind)).or_default().insert(src);
    }
    assert!(!by_xid.is_empty(), "no DHCP replies captured");
    let doubled: Vec<_> = by_xid.iter().filter(|(_, s)| s.len() > 1).collect();
    assert!(
        doubled.is_empty(),
        "replies from two servers to one transaction: {doubled:?}"
    );
}
