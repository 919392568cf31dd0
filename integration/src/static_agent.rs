//! `vm-dhcp-agent serve-static` in a network lab: a server namespace running the agent over a
//! JSON file of pools and leases, VM namespaces wired to it (by veth pairs, or through a bridge
//! that stands for a VM network shared with other hosts), and hand-built DHCP messages sent
//! from raw sockets. Addresses are TEST-NET ranges that exist only inside the lab.
//!
//! These helpers fail the calling test on any error: they are test code, not product code.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::dhcp_client::{http_get, udhcpc, wait_for};
use crate::netns::{Lab, Netns};

/// Pool A's server address (on `srv0`).
pub const SERVER_A: &str = "192.0.2.1";
/// Pool B's server address, for tests that serve two networks.
pub const SERVER_B: &str = "198.51.100.1";
/// The first VM's NIC.
pub const MAC_1: &str = "02:00:00:00:01:0a";
/// [`MAC_1`] as bytes, for hand-built messages.
pub const MAC_1_BYTES: [u8; 6] = [0x02, 0, 0, 0, 0x01, 0x0a];
/// [`MAC_1`]'s reservation in pool A.
pub const IP_1: &str = "192.0.2.10";
/// The MAC of the other host on [`Bridged`]'s VM network.
pub const EVIL_MAC: &str = "02:00:00:00:0e:0e";
/// Where [`Bridged`]'s agent serves its HTTP endpoints, inside the server namespace.
pub const BRIDGED_HTTP: &str = "http://127.0.0.1:8080";

/// The agent binary, built once per test process (the integration crate cannot depend on a bin).
pub fn agent_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| crate::process::workspace_binary("vmdhcp-agent", "vm-dhcp-agent"))
}

/// A pool of the static file: `default/<name>` served on `interface` from `server`, no options
/// but those `extra` sets, no leases.
pub fn pool(name: &str, interface: &str, server: &str, cidr: &str, extra: Value) -> Value {
    let mut config = json!({
        "pool": format!("default/{name}"),
        "network": format!("default/{name}"),
        "interface_name": interface,
        "server_ip": server,
        "subnet": cidr,
        "router": null,
        "dns": [],
        "domain_name": null,
        "domain_search": [],
        "ntp": [],
        "lease_seconds": 3600,
    });
    for (k, v) in extra.as_object().unwrap() {
        config[k] = v.clone();
    }
    json!({ "config": config, "leases": [] })
}

/// `pool` with one more lease: `mac` → `ip`.
pub fn with_lease(mut pool: Value, mac: &str, ip: &str) -> Value {
    pool["leases"]
        .as_array_mut()
        .unwrap()
        .push(json!({ "mac": mac, "ip": ip }));
    pool
}

/// A lab with the agent serving `pools` from namespace `srv`.
pub struct Rig {
    /// Namespaces and their processes.
    pub lab: Lab,
    /// The agent's namespace (its pod).
    pub srv: Netns,
    /// The pools file, the status file and the agent's log.
    pub dir: tempfile::TempDir,
    /// The agent's process id, once started.
    pub agent_pid: u32,
    /// Whether the agent sees `/proc/sys` read-only, as in a pod whose runtime allows no
    /// writes there.
    pub read_only_proc_sys: bool,
}

/// A new lab with an empty server namespace `srv`; nothing runs yet.
pub fn rig() -> Rig {
    let mut lab = Lab::new().unwrap();
    let srv = lab.netns("srv").unwrap();
    Rig {
        lab,
        srv,
        dir: tempfile::tempdir().unwrap(),
        agent_pid: 0,
        read_only_proc_sys: false,
    }
}

impl Rig {
    /// The pools file the agent serves.
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("pools.json")
    }

    /// The status file the agent writes.
    pub fn status_path(&self) -> PathBuf {
        self.dir.path().join("status.json")
    }

    /// Writes `pools` as the pools file.
    pub fn write_config(&self, pools: &[Value]) {
        fs::write(
            self.config_path(),
            serde_json::to_string_pretty(&json!({ "pools": pools })).unwrap(),
        )
        .unwrap();
    }

    /// The status file, once the agent wrote it.
    pub fn status(&self) -> Option<Value> {
        let text = fs::read_to_string(self.status_path()).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Adds a VM namespace whose `eth0` (with `mac`) is wired to the server's `srv_if`.
    pub fn vm(&mut self, name: &str, srv_if: &str, mac: &str) -> Netns {
        let vm = self.lab.netns(name).unwrap();
        self.lab.veth(&self.srv, srv_if, &vm, "eth0").unwrap();
        self.lab
            .exec(&vm, "ip", &["link", "set", "eth0", "address", mac])
            .unwrap();
        vm
    }

    /// Starts the agent serving `pools`.
    pub fn start(&mut self, pools: &[Value]) {
        self.start_with(pools, &[]);
    }

    /// Starts the agent serving `pools`, with more arguments to `serve-static`.
    pub fn start_with(&mut self, pools: &[Value], args: &[&str]) {
        self.write_config(pools);
        let log = fs::File::create(self.dir.path().join("agent.log")).unwrap();
        let agent = agent_bin().to_str().unwrap();
        let mut cmd = if self.read_only_proc_sys {
            // A mount namespace of its own (private), where /proc/sys is bound read-only.
            let mut cmd = self.srv.command("unshare");
            cmd.args([
                "-m",
                "sh",
                "-c",
                "mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec \"$0\" \"$@\"",
                agent,
            ]);
            cmd
        } else {
            self.srv.command(agent)
        };
        cmd.arg("serve-static")
            .arg("--config")
            .arg(self.config_path())
            .arg("--status-file")
            .arg(self.status_path())
            .args(args)
            .env("RUST_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        self.agent_pid = self.lab.spawn(cmd).unwrap().id();
    }

    /// Waits until every one of `interfaces` serves; returns the status that says so.
    pub fn wait_serving(&self, interfaces: &[&str]) -> Value {
        wait_for("interfaces serving", Duration::from_secs(10), || {
            let status = self.status()?;
            interfaces
                .iter()
                .all(|i| status["interfaces"][i]["state"] == "serving")
                .then_some(status)
        })
    }

    /// What the agent logged so far.
    pub fn agent_log(&self) -> String {
        fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
    }

    /// Rewrites the config and makes the agent re-read it; returns once it has.
    pub fn reload(&self, pools: &[Value]) {
        let before = self.status().unwrap()["reloads"].as_u64().unwrap();
        self.write_config(pools);
        let ok = Command::new("kill")
            .args(["-HUP", &self.agent_pid.to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
        wait_for("the agent to reload", Duration::from_secs(10), || {
            (self.status()?["reloads"].as_u64()? > before).then_some(())
        });
    }
}

/// One VM network, a bridge (`br0` in `net`), with the agent (serving `pools` on `srv0`,
/// 192.0.2.1/24, HTTP on [`BRIDGED_HTTP`]), a VM `vm` ([`MAC_1`]) and another host `evil`
/// ([`EVIL_MAC`]) on it.
pub struct Bridged {
    /// The agent and its lab.
    pub rig: Rig,
    /// The namespace holding the bridge.
    pub net: Netns,
    /// The VM whose reservation is [`IP_1`].
    pub vm: Netns,
    /// Another host on the network.
    pub evil: Netns,
}

impl Bridged {
    /// The network with the agent serving `pools`.
    pub fn new(pools: &[Value]) -> Self {
        Bridged::with_args(pools, &[])
    }

    /// [`Bridged::new`], with more arguments to `serve-static`.
    pub fn with_args(pools: &[Value], args: &[&str]) -> Self {
        Bridged::build(pools, args, false)
    }

    /// [`Bridged::with_args`], the agent seeing `/proc/sys` read-only (as in a pod).
    pub fn with_read_only_proc_sys(pools: &[Value], args: &[&str]) -> Self {
        Bridged::build(pools, args, true)
    }

    fn build(pools: &[Value], args: &[&str], read_only_proc_sys: bool) -> Self {
        let mut lab = Lab::new().unwrap();
        let net = lab.netns("net").unwrap();
        lab.bridge(&net, "br0").unwrap();
        let srv = lab.netns("srv").unwrap();
        lab.plug(&net, "br0", "p-srv", &srv, "srv0").unwrap();
        lab.address(&srv, "srv0", "192.0.2.1/24").unwrap();
        let mut rig = Rig {
            lab,
            srv,
            dir: tempfile::tempdir().unwrap(),
            agent_pid: 0,
            read_only_proc_sys,
        };
        let listen = BRIDGED_HTTP.trim_start_matches("http://");
        rig.start_with(pools, &[&["--http-listen", listen], args].concat());
        rig.wait_serving(&["srv0"]);
        let vm = plug_host(&mut rig.lab, &net, "vm", MAC_1);
        let evil = plug_host(&mut rig.lab, &net, "evil", EVIL_MAC);
        Bridged { rig, net, vm, evil }
    }

    /// A namespace `name` plugged into the bridge, its eth0 with `mac`.
    pub fn host(&mut self, name: &str, mac: &str) -> Netns {
        plug_host(&mut self.rig.lab, &self.net, name, mac)
    }

    /// The agent's `/metrics`.
    pub fn metrics(&self) -> String {
        let url = format!("{BRIDGED_HTTP}/metrics");
        http_get(&self.rig.lab, &self.rig.srv, &url).1
    }

    /// Waits until the agent's `/metrics` has `family{interface="srv0",pool="default/a",
    /// verdict}` at `n`; returns the whole page.
    pub fn wait_verdict(&self, family: &str, verdict: &str, n: u32) -> String {
        let labels = r#"interface="srv0",pool="default/a""#;
        let line = format!("{family}{{{labels},verdict=\"{verdict}\"}} {n}");
        wait_for(&line.clone(), Duration::from_secs(10), || {
            let m = self.metrics();
            m.lines().any(|l| l == line).then_some(m)
        })
    }

    /// The agent's `/leases`.
    pub fn leases(&self) -> Value {
        let url = format!("{BRIDGED_HTTP}/leases");
        let (_, body) = http_get(&self.rig.lab, &self.rig.srv, &url);
        serde_json::from_str(&body).unwrap()
    }
}

/// The address of the rogue DHCP server [`start_rogue`] runs.
pub const ROGUE_IP: &str = "192.0.2.7";

/// Starts dnsmasq on [`Bridged::evil`] as a rogue DHCP server on the pool's network: eth0 at
/// [`ROGUE_IP`], handing out a small range of pool A's subnet to anyone, at once (no ping check).
/// Returns its pid; it logs to `dir/dnsmasq.log` and dies with the lab.
pub fn start_rogue(b: &mut Bridged, dir: &Path) -> u32 {
    start_dnsmasq(b, dir, &["--dhcp-range=192.0.2.100,192.0.2.109,1h"])
}

/// A peer's client on [`Bridged`]'s network, which only [`start_peer`]'s server knows.
pub const PEER_CLIENT_MAC: &str = "02:00:00:00:0d:01";
/// [`PEER_CLIENT_MAC`]'s reservation at the peer server.
pub const PEER_CLIENT_IP: &str = "192.0.2.100";

/// Starts dnsmasq on [`Bridged::evil`] as a peer DHCP server (another cluster's, an external
/// one) at [`ROGUE_IP`]: it serves its one reservation ([`PEER_CLIENT_MAC`]) and ignores every
/// other client, as two servers with disjoint reservations on one segment must. Returns its
/// pid; it logs to `dir/dnsmasq.log`.
pub fn start_peer(b: &mut Bridged, dir: &Path) -> u32 {
    start_dnsmasq(
        b,
        dir,
        &[
            "--dhcp-range=192.0.2.0,static,255.255.255.0,2m",
            &format!("--dhcp-host={PEER_CLIENT_MAC},{PEER_CLIENT_IP}"),
            "--dhcp-ignore=tag:!known",
        ],
    )
}

/// dnsmasq as a DHCP server only, on [`Bridged::evil`]'s eth0 at [`ROGUE_IP`], with `dhcp`'s
/// options; logs to `dir/dnsmasq.log`, dies with the lab. Returns its pid.
fn start_dnsmasq(b: &mut Bridged, dir: &Path, dhcp: &[&str]) -> u32 {
    let ns = b.evil.clone();
    b.rig
        .lab
        .address(&ns, "eth0", &format!("{ROGUE_IP}/24"))
        .unwrap();
    let log = fs::File::create(dir.join("dnsmasq.log")).unwrap();
    let mut cmd = ns.command("dnsmasq");
    cmd.args([
        "--keep-in-foreground",
        "--conf-file=/dev/null",
        "--no-resolv",
        "--no-hosts",
        "--port=0",
        "--interface=eth0",
        "--bind-interfaces",
        "--no-ping",
        "--log-dhcp",
        "--log-facility=-",
        "--user=root",
    ])
    .args(dhcp)
    .arg(format!("--dhcp-leasefile={}", dir.join("leases").display()))
    .arg(format!("--pid-file={}", dir.join("pid").display()))
    .stdin(Stdio::null())
    .stdout(log.try_clone().unwrap())
    .stderr(log);
    b.rig.lab.spawn(cmd).unwrap().id()
}

/// A namespace `name` plugged into `net`'s bridge `br0`, its eth0 with `mac`.
pub fn plug_host(lab: &mut Lab, net: &Netns, name: &str, mac: &str) -> Netns {
    let ns = lab.netns(name).unwrap();
    lab.plug(net, "br0", &format!("p-{name}"), &ns, "eth0")
        .unwrap();
    lab.exec(&ns, "ip", &["link", "set", "eth0", "address", mac])
        .unwrap();
    ns
}

/// Runs udhcpc on `ns` once: whether it got a lease, and how long that took.
pub fn timed_udhcpc(ns: &Netns) -> (bool, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let ok = udhcpc(ns, dir.path(), &[]).status.success();
    (ok, started.elapsed())
}

/// A BOOTREQUEST of DHCP message type `kind` from `mac`, with `giaddr` and extra options.
pub fn bootrequest(
    kind: u8,
    mac: [u8; 6],
    giaddr: [u8; 4],
    xid: [u8; 4],
    options: &[u8],
) -> Vec<u8> {
    let mut p = vec![0u8; 236];
    p[0] = 1; // BOOTREQUEST
    p[1] = 1; // Ethernet
    p[2] = 6;
    p[3] = u8::from(giaddr != [0; 4]); // hops
    p[4..8].copy_from_slice(&xid);
    p[24..28].copy_from_slice(&giaddr);
    p[28..34].copy_from_slice(&mac);
    p.extend_from_slice(&[99, 130, 83, 99]);
    p.extend_from_slice(&[53, 1, kind]);
    p.extend_from_slice(options);
    p.push(255);
    p
}

/// A DHCPDECLINE of `ip` to `server` in the name of `mac` (RFC 2131 §4.4.1): what a client
/// that finds its address taken sends, and what any host can forge.
pub fn decline(mac: [u8; 6], ip: Ipv4Addr, server: Ipv4Addr, xid: [u8; 4]) -> Vec<u8> {
    let mut options = vec![50, 4];
    options.extend_from_slice(&ip.octets());
    options.extend_from_slice(&[54, 4]);
    options.extend_from_slice(&server.octets());
    bootrequest(4, mac, [0; 4], xid, &options)
}

/// `bytes` in lowercase hex, as Python's `bytes.fromhex` reads it.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Python that opens `s`: a UDP socket on eth0's port 68 that may broadcast, as a client
/// without an address sends from.
pub const PY_CLIENT_SOCKET: &str = "import socket\n\
     s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
     s.setsockopt(socket.SOL_SOCKET,socket.SO_BROADCAST,1)\n\
     s.setsockopt(socket.SOL_SOCKET,socket.SO_BINDTODEVICE,b'eth0')\n\
     s.bind(('0.0.0.0',68))\n";

/// Sends, from `ns`'s eth0, a broadcast DHCPDECLINE of [`IP_1`] to [`SERVER_A`] in the name of
/// `mac`.
pub fn send_decline(lab: &Lab, ns: &Netns, mac: [u8; 6], xid: [u8; 4]) {
    let message = decline(mac, IP_1.parse().unwrap(), SERVER_A.parse().unwrap(), xid);
    let script = format!(
        "{PY_CLIENT_SOCKET}s.sendto(bytes.fromhex('{}'),('255.255.255.255',67))\n",
        hex(&message)
    );
    lab.exec(ns, "python3", &["-c", &script]).unwrap();
}
