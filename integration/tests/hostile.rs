//! Tenants against the agent (issue 37): every VM on a pool network can send any frame it likes.
//! In network namespaces, with the agent's `serve-static`, real clients (`dhclient`, `dhcpcd`,
//! `udhcpc`) and VMs that answer ARP for their address, each test shows one thing a hostile host
//! cannot do and prints what the attempt cost the VM:
//!
//! - route through the agent to another pool's network or to the pod network, even with IPv4
//!   forwarding inherited on;
//! - reach any TCP or UDP port of the agent but DHCP, through the server address or through the
//!   pod address routed via it;
//! - move or starve a live VM with forged DECLINEs and a flood of unicast ARP replies;
//! - keep new VMs off the network by answering every ARP request;
//! - hold more than a bounded number of a pool's addresses in conflict (a real squatter is
//!   still found);
//! - run a DHCP server on the network unnoticed;
//! - and on a dual-stack pool, against a live `dhclient -6`: steal a VM's DHCPv6 answers with
//!   forged Neighbor Advertisements, take its IPv6 address with a forged (relayed) DECLINE and a
//!   burst of advertisements, deny DHCPv6 to the pool with requests from unresolvable sources,
//!   reflect answers to every VM, or steer the agent's routing with a Router Advertisement.
//!
//! Every attacker is a bounded process on raw sockets ([`vmdhcp_integration::hostile`]).
//! Addresses are TEST-NET ranges that exist only inside the lab: 192.0.2.0/24 (pool A),
//! 198.51.100.0/24 (pool B) and 203.0.113.0/24 (the pod network).
#![allow(clippy::unwrap_used, clippy::print_stdout)]

use std::net::Ipv6Addr;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use vmdhcp_core::NamespacedName;
use vmdhcp_core::pool::duid::server_duid;
use vmdhcp_integration::dhcp_client::{
    events, start_dhclient, start_dhcpcd, try_http_get, udhcpc, udhcpc_bound, wait_event, wait_for,
};
use vmdhcp_integration::dhcp6_client::{
    Client6, Kea6, Kea6Config, Lease6, Options6, Radvd, RadvdConfig, addresses, global_addresses,
    wait_link_local,
};
use vmdhcp_integration::fleet::metric;
use vmdhcp_integration::hostile::{
    EchoCounter, Forgery, answer_every_arp, capture_dhcp, forge, leased_after, mac_bytes, mac_of,
    neighbour, now_unix, ping, settled_cost, transcript,
};
use vmdhcp_integration::hostile6;
use vmdhcp_integration::netns::Netns;
use vmdhcp_integration::static_agent::{
    Bridged, EVIL_MAC, IP_1, MAC_1, MAC_1_BYTES, Rig, SERVER_A, SERVER_B, hex, pool, rig,
    send_decline, start_rogue, timed_udhcpc, with_lease,
};

/// The pod network's other end (a node or another pod), in namespace `pod`.
const POD_PEER: &str = "203.0.113.1";
/// The agent's own address on its pod network (`eth0` of its namespace).
const POD_IP: &str = "203.0.113.2";
const POD_NET: &str = "203.0.113.0/24";
/// A VM on pool B.
const IP_B: &str = "198.51.100.11";

/// The labels of pool A's series on `srv0`.
const LABELS: &str = r#"interface="srv0",pool="default/a""#;

/// Pool A on `srv0` with [`MAC_1`]'s reservation and `extra` settings.
fn pool_a(extra: Value) -> Value {
    with_lease(
        pool("a", "srv0", SERVER_A, "192.0.2.0/24", extra),
        MAC_1,
        IP_1,
    )
}

/// `ip ARGS` in `ns`, which must succeed.
fn ip(rig: &Rig, ns: &Netns, args: &[&str]) {
    rig.lab.exec(ns, "ip", args).unwrap();
}

/// Gives the agent's namespace a pod network: `eth0` (the pod IP) on a veth to namespace `pod`,
/// its default route through it, as Kubernetes wires a pod; `pod` routes the pools' subnets back
/// through the agent, as a node routes to its pods.
fn pod_network(rig: &mut Rig) -> Netns {
    let pod = rig.lab.netns("pod").unwrap();
    let srv = rig.srv.clone();
    rig.lab.veth(&srv, "eth0", &pod, "eth0").unwrap();
    for (ns, address) in [(&srv, POD_IP), (&pod, POD_PEER)] {
        let cidr = format!("{address}/24");
        rig.lab.address(ns, "eth0", &cidr).unwrap();
    }
    ip(rig, &srv, &["route", "add", "default", "via", POD_PEER]);
    for subnet in ["192.0.2.0/24", "198.51.100.0/24"] {
        ip(rig, &pod, &["route", "add", subnet, "via", POD_IP]);
    }
    pod
}

/// A sysctl of the agent's namespace, as the kernel reports it.
fn sysctl(rig: &Rig, path: &str) -> String {
    let file = format!("/proc/sys/net/ipv4/{path}");
    rig.lab
        .exec(&rig.srv, "cat", &[&file])
        .unwrap()
        .trim()
        .to_owned()
}

#[test]
fn a_vm_reaches_neither_another_pool_nor_the_pod_network_through_the_agent() {
    let mut rig = rig();
    let srv = rig.srv.clone();
    // As a pod inherits it from a Kubernetes node: forwarding on, for the links made after too.
    rig.lab
        .exec(
            &srv,
            "sysctl",
            &[
                "-qw",
                "net.ipv4.conf.all.forwarding=1",
                "net.ipv4.conf.default.forwarding=1",
            ],
        )
        .unwrap();
    let pod = pod_network(&mut rig);
    // Pool A's network is bridge br0, pool B's br1.
    let net = rig.lab.netns("net").unwrap();
    for bridge in ["br0", "br1"] {
        rig.lab.bridge(&net, bridge).unwrap();
    }
    let (vm_a, vm_b) = (rig.lab.netns("vma").unwrap(), rig.lab.netns("vmb").unwrap());
    let mut host = |name: &str, bridge: &str, ns: &Netns, ifname: &str| {
        rig.lab
            .plug(&net, bridge, &format!("p-{name}"), ns, ifname)
            .unwrap();
    };
    host("srv0", "br0", &srv, "srv0");
    host("srv1", "br1", &srv, "srv1");
    host("vma", "br0", &vm_a, "eth0");
    host("vmb", "br1", &vm_b, "eth0");
    // The VM on A routes B's subnet and the pod network via A's server address; B's answers.
    for (vm, address) in [(&vm_a, IP_1), (&vm_b, IP_B)] {
        let cidr = format!("{address}/24");
        rig.lab.address(vm, "eth0", &cidr).unwrap();
    }
    for subnet in ["198.51.100.0/24", POD_NET] {
        ip(&rig, &vm_a, &["route", "add", subnet, "via", SERVER_A]);
    }
    ip(
        &rig,
        &vm_b,
        &["route", "add", "192.0.2.0/24", "via", SERVER_B],
    );
    let at_b = EchoCounter::install(&rig.lab, &vm_b, IP_1.parse().unwrap());
    let at_pod = EchoCounter::install(&rig.lab, &pod, IP_1.parse().unwrap());

    // The server addresses set by hand, as on a node where nothing hardens the interfaces: the
    // pings cross (so the counters below can tell).
    rig.lab.address(&srv, "srv0", "192.0.2.1/24").unwrap();
    rig.lab.address(&srv, "srv1", "198.51.100.1/24").unwrap();
    for interface in ["srv0", "srv1", "eth0"] {
        assert_eq!(sysctl(&rig, &format!("conf/{interface}/forwarding")), "1");
    }
    const PINGS: u32 = 3;
    ping(&rig.lab, &vm_a, IP_B, PINGS);
    ping(&rig.lab, &vm_a, POD_PEER, PINGS);
    let unprotected = (at_b.read(&rig.lab), at_pod.read(&rig.lab));
    assert_eq!(unprotected, (PINGS.into(), PINGS.into()), "the lab routes");

    // The agent configures both pool interfaces.
    let pool_b = pool("b", "srv1", SERVER_B, "198.51.100.0/24", json!({}));
    rig.start_with(&[pool_a(json!({})), pool_b], &["--configure-interfaces"]);
    rig.wait_serving(&["srv0", "srv1"]);
    let settings = [
        ("forwarding", "0"),
        ("proxy_arp", "0"),
        ("accept_redirects", "0"),
        ("send_redirects", "0"),
        ("accept_source_route", "0"),
        ("arp_ignore", "1"),
        ("arp_announce", "2"),
    ];
    for interface in ["srv0", "srv1"] {
        for (name, value) in settings {
            let path = format!("conf/{interface}/{name}");
            assert_eq!(sysctl(&rig, &path), value, "{path}");
        }
    }
    // The pod's own interface stays as Kubernetes set it.
    assert_eq!(sysctl(&rig, "conf/eth0/forwarding"), "1");
    assert_eq!(sysctl(&rig, "conf/all/forwarding"), "1");

    let replies = ping(&rig.lab, &vm_a, IP_B, PINGS) + ping(&rig.lab, &vm_a, POD_PEER, PINGS);
    let crossed = (
        at_b.read(&rig.lab) - unprotected.0,
        at_pod.read(&rig.lab) - unprotected.1,
    );
    println!(
        "pings from pool A via the server address, forwarding inherited on: without the agent \
         {}/{PINGS} reached pool B and {}/{PINGS} the pod network; with the agent serving {}/{PINGS} \
         and {}/{PINGS} ({replies} replies)",
        unprotected.0, unprotected.1, crossed.0, crossed.1
    );
    assert_eq!(crossed, (0, 0), "packets crossed the agent");
    assert_eq!(replies, 0);
}

/// Tries a TCP connection to each of `targets` from `ns`, 2 s at most each: (target, `open`,
/// `refused`, `timeout` or the error, milliseconds taken).
fn connect(rig: &Rig, ns: &Netns, targets: &[(&str, u16)]) -> Vec<(String, String, u64)> {
    let list: Vec<String> = targets
        .iter()
        .map(|(host, port)| format!("('{host}',{port})"))
        .collect();
    let script = format!(
        "import socket,time\n\
         for t in [{}]:\n\
         \x20 s=socket.socket(); s.settimeout(2); start=time.monotonic()\n\
         \x20 try: s.connect(t); r='open'\n\
         \x20 except ConnectionRefusedError: r='refused'\n\
         \x20 except socket.timeout: r='timeout'\n\
         \x20 except OSError as e: r=e.strerror.replace(' ','_')\n\
         \x20 print('%s:%d'%t, r, int((time.monotonic()-start)*1000))\n\
         \x20 s.close()\n",
        list.join(",")
    );
    let out = rig.lab.exec(ns, "python3", &["-c", &script]).unwrap();
    out.lines()
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w[0].to_owned(), w[1].to_owned(), w[2].parse().unwrap())
        })
        .collect()
}

/// The agent's listening sockets in its namespace: (`tcp` or `udp`, port), from `ss`.
fn listening(rig: &Rig) -> Vec<(String, u16)> {
    let out = rig.lab.exec(&rig.srv, "ss", &["-H", "-lntup"]).unwrap();
    let mine = format!("pid={},", rig.agent_pid);
    let mut sockets: Vec<(String, u16)> = out
        .lines()
        .filter(|l| l.contains(&mine))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let port = w[4].rsplit(':').next().unwrap().parse().unwrap();
            (w[0].to_owned(), port)
        })
        .collect();
    sockets.sort();
    sockets.dedup();
    sockets
}

#[test]
fn from_a_vm_no_port_of_the_agent_but_dhcp_answers_by_either_path() {
    let mut rig = rig();
    let pod = pod_network(&mut rig);
    let vm = rig.vm("vm", "srv0", MAC_1);
    rig.start_with(
        &[pool_a(json!({}))],
        &["--configure-interfaces", "--http-listen", "0.0.0.0:8080"],
    );
    rig.wait_serving(&["srv0"]);
    // The endpoints answer the pod network.
    let health = format!("http://{POD_IP}:8080/healthz");
    wait_for(
        "/healthz from the pod network",
        Duration::from_secs(10),
        || try_http_get(&rig.lab, &pod, &health).filter(|(code, _)| *code == 200),
    );

    // DHCP answers the VM (dhcpcd applies the address itself); then it routes the pod network
    // via the server address, to reach the agent's other side.
    let dir = tempfile::tempdir().unwrap();
    start_dhcpcd(&mut rig.lab, &vm, dir.path());
    wait_for("dhcpcd's address on eth0", Duration::from_secs(20), || {
        let addr = rig
            .lab
            .exec(&vm, "ip", &["-4", "addr", "show", "eth0"])
            .ok()?;
        addr.contains(&format!("{IP_1}/24")).then_some(())
    });
    ip(&rig, &vm, &["route", "add", POD_NET, "via", SERVER_A]);

    let sockets = listening(&rig);
    let ports = |proto: &str| -> Vec<u16> {
        sockets
            .iter()
            .filter(|(p, _)| p == proto)
            .map(|(_, port)| *port)
            .collect()
    };
    let (tcp, udp) = (ports("tcp"), ports("udp"));
    assert!(tcp.contains(&8080), "{sockets:?}");
    assert!(udp.contains(&67), "{sockets:?}");
    assert!(
        udp.iter().all(|p| [67, 68].contains(p)),
        "UDP beyond DHCP: {sockets:?}"
    );

    // Every TCP port by both paths, from the VM: nothing answers. From the pod network the
    // same check finds the endpoints open, so it can tell.
    let targets: Vec<(&str, u16)> = tcp
        .iter()
        .flat_map(|port| [(SERVER_A, *port), (POD_IP, *port)])
        .collect();
    let from_vm = connect(&rig, &vm, &targets);
    let from_pod = connect(&rig, &pod, &[(POD_IP, 8080)]);
    println!(
        "agent sockets {sockets:?}; from a VM on pool A: {from_vm:?}; from the pod network: \
         {from_pod:?}"
    );
    assert_eq!(from_pod[0].1, "open");
    assert_eq!(from_vm.len(), targets.len());
    for (target, result, ms) in &from_vm {
        assert_ne!(result, "open", "{target} answers a VM");
        assert!(*ms <= 2_500, "{target}: {ms} ms");
    }
}

/// The agent's `/leases` entries of pool A that record a conflict.
fn conflicts(b: &Bridged) -> Vec<(String, Value)> {
    let leases = b.leases();
    leases["default/a"]
        .as_object()
        .map(|by_mac| {
            by_mac
                .iter()
                .filter_map(|(mac, l)| Some((mac.clone(), l.get("conflict")?.clone())))
                .collect()
        })
        .unwrap_or_default()
}

/// `family{interface="srv0",pool="default/a",verdict="…"}` in `metrics`, 0 when absent.
fn verdicts(metrics: &str, family: &str, verdict: &str) -> f64 {
    metric(
        metrics,
        &format!("{family}{{{LABELS},verdict=\"{verdict}\"}}"),
    )
    .unwrap_or(0.0)
}

#[test]
fn forged_declines_with_a_unicast_arp_flood_neither_move_nor_starve_a_live_vm() {
    // 4 s leases: dhclient renews every few seconds, so the attack spans several renewals.
    let mut b = Bridged::new(&[pool_a(json!({ "lease_seconds": 4 }))]);
    let pcap = b.rig.dir.path().join("vm.pcap");
    capture_dhcp(&mut b.rig.lab, &b.vm, &pcap, false);
    let dir = tempfile::tempdir().unwrap();
    // The VM configures its address (the recording hook does), so it answers ARP for it.
    start_dhclient(&mut b.rig.lab, &b.vm, dir.path());
    wait_event(dir.path(), "BOUND", 0, Duration::from_secs(20));
    // A renewal done: the server's own ARP cache knows the VM, as in a running network.
    wait_event(dir.path(), "RENEW", 0, Duration::from_secs(10));

    // Another host sends DECLINEs in the VM's name and floods the server alone with ARP
    // replies for the VM's address from its own MAC.
    let forgery = Forgery::against(
        MAC_1_BYTES,
        IP_1.parse().unwrap(),
        SERVER_A.parse().unwrap(),
        mac_of(&b.rig.lab, &b.rig.srv, "srv0"),
        mac_bytes(EVIL_MAC),
    );
    let seen_before = events(dir.path()).len();
    let from = now_unix();
    let mut attacker = forge(&b.evil, &forgery);
    // Whether the address was withheld at any moment of the attack, and where the server's own
    // kernel sends what it unicasts to the VM (its renewal ACKs).
    let mut withheld = Vec::new();
    let mut server_sees = std::collections::BTreeMap::<String, u32>::new();
    while attacker.running() {
        withheld.extend(conflicts(&b));
        let mac = neighbour(&b.rig.lab, &b.rig.srv, "srv0", IP_1).unwrap_or_default();
        *server_sees.entry(mac).or_default() += 1;
    }
    let sent = attacker.finish();
    let stopped = Instant::now();
    withheld.extend(conflicts(&b));

    // What the attack cost counts until it is over for the VM: the server's ARP entry for it is
    // its own again (or gone), and its client holds a lease after that.
    let (healed_at, healed) = wait_for(
        "the server's ARP entry for the VM back to it",
        Duration::from_secs(60),
        || {
            let mac = neighbour(&b.rig.lab, &b.rig.srv, "srv0", IP_1);
            mac.is_none_or(|m| m == MAC_1)
                .then(|| (now_unix(), events(dir.path()).len()))
        },
    );
    wait_for("a lease after the attack", Duration::from_secs(15), || {
        leased_after(dir.path(), healed).then_some(())
    });
    let aftermath = stopped.elapsed();
    let cost = settled_cost(&pcap, MAC_1_BYTES, from, healed_at);
    let metrics = b.metrics();
    let declines = |verdict: &str| verdicts(&metrics, "vmdhcp_agent_declines_total", verdict);
    let client_events: Vec<String> = events(dir.path())
        .into_iter()
        .skip(seen_before)
        .map(|(e, env)| {
            format!(
                "{e} {}",
                env.get("new_ip_address").cloned().unwrap_or_default()
            )
        })
        .collect();
    println!(
        "forger sent {} DECLINEs and {} ARP replies in 10 s; the VM, until the attack was over \
         for it ({} ms after the flood stopped): {cost}; verdicts: \
         holder_answers {}, conflict {}, no_answer {}, capped {}, proxy_arp {}; client events \
         {client_events:?}; the server's ARP entry for the VM, by polls: {server_sees:?} (VM \
         {MAC_1}, forger {EVIL_MAC})",
        sent[0],
        sent[1],
        aftermath.as_millis(),
        declines("holder_answers"),
        declines("conflict"),
        declines("no_answer"),
        declines("capped"),
        declines("proxy_arp"),
    );
    // Never withheld, never a conflict: each DECLINE found forged.
    assert!(
        withheld.is_empty(),
        "the VM's address was withheld: {withheld:?}"
    );
    assert!(declines("holder_answers") >= 1.0, "{metrics}");
    assert_eq!(declines("conflict"), 0.0, "{metrics}");
    let gauge = "vmdhcp_agent_conflicted_addresses{pool=\"default/a\"} 0";
    assert!(metrics.lines().any(|l| l == gauge), "{metrics}");
    // And every renewal answered, to the VM.
    assert!(
        cost.attempts >= 3,
        "the VM did not renew during the attack: {cost}"
    );
    assert_eq!(
        cost.lost,
        0,
        "the VM lost exchanges: {cost}; its DHCP messages:\n{}",
        transcript(&pcap, MAC_1_BYTES, from).join("\n")
    );
    assert!(
        client_events.iter().all(|e| e == &format!("RENEW {IP_1}")),
        "the VM's client left its lease: {client_events:?}"
    );
}

/// VMs that are not up yet, each with its reservation in pool A: (name, MAC, address).
const NEW_VMS: [(&str, &str, &str); 3] = [
    ("vm2", "02:00:00:00:01:0b", "192.0.2.11"),
    ("vm3", "02:00:00:00:01:0c", "192.0.2.12"),
    ("vm4", "02:00:00:00:01:0d", "192.0.2.13"),
];

/// [`Bridged`] serving pool A with [`MAC_1`]'s reservation and those of [`NEW_VMS`].
fn bridged_with_new_vms() -> Bridged {
    let pool = NEW_VMS
        .iter()
        .fold(pool_a(json!({})), |pool, (_, mac, ip)| {
            with_lease(pool, mac, ip)
        });
    Bridged::new(&[pool])
}

/// Runs udhcpc once on `vm`, which must get `ip`; how long that took.
fn timed_lease(vm: &Netns, ip: &str) -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    assert_eq!(udhcpc_bound(vm, dir.path(), &[])["ip"], ip);
    started.elapsed()
}

#[test]
fn a_host_answering_every_arp_request_delays_no_new_vm_and_makes_no_conflict() {
    let mut b = bridged_with_new_vms();
    // The usual time: a new VM's first lease, its address probed with nobody answering.
    let usual = timed_lease(&b.vm, IP_1);

    let responder = answer_every_arp(&b.evil, mac_bytes(EVIL_MAC), Duration::from_secs(60), 5_000);
    let took: Vec<Duration> = NEW_VMS
        .iter()
        .map(|(name, mac, ip)| {
            let vm = b.host(name, mac);
            timed_lease(&vm, ip)
        })
        .collect();
    // A DECLINE for an address its VM no longer uses: only the responder answers for it.
    b.rig
        .lab
        .exec(&b.vm, "ip", &["addr", "flush", "dev", "eth0"])
        .unwrap();
    send_decline(&b.rig.lab, &b.vm, MAC_1_BYTES, [0xa0, 0, 0, 1]);
    let metrics = b.wait_verdict("vmdhcp_agent_declines_total", "proxy_arp", 1);
    let answered = responder.stop();

    let offers = |verdict: &str| verdicts(&metrics, "vmdhcp_agent_offer_probes_total", verdict);
    let suspects = metric(
        &metrics,
        "vmdhcp_agent_network_suspects{pool=\"default/a\",kind=\"proxy_arp_responder\"}",
    );
    let ms = |d: &Duration| d.as_millis();
    println!(
        "a new VM's first lease: {} ms with nobody answering ARP; with a host answering every \
         ARP request ({} answers): {:?} ms; offer verdicts clean {} proxy_arp {} conflict {}; \
         proxy_arp_responder suspects {suspects:?}",
        ms(&usual),
        answered[0],
        took.iter().map(ms).collect::<Vec<_>>(),
        offers("clean"),
        offers("proxy_arp"),
        offers("conflict"),
    );
    // No more than one more DISCOVER round (udhcpc waits 1 s for an OFFER) than usual.
    for t in &took {
        assert!(
            *t < usual + Duration::from_secs(1),
            "{t:?} against {usual:?}"
        );
    }
    assert_eq!(offers("proxy_arp"), NEW_VMS.len() as f64, "{metrics}");
    assert_eq!(offers("conflict"), 0.0, "{metrics}");
    assert_eq!(
        verdicts(&metrics, "vmdhcp_agent_declines_total", "conflict"),
        0.0
    );
    assert!(conflicts(&b).is_empty(), "{:?}", conflicts(&b));
    let gauge = "vmdhcp_agent_conflicted_addresses{pool=\"default/a\"} 0";
    assert!(metrics.lines().any(|l| l == gauge), "{metrics}");
    assert_eq!(
        suspects,
        Some(1.0),
        "the responder is not reported: {metrics}"
    );
}

#[test]
fn a_real_squatter_is_still_found_and_holds_no_more_than_two_addresses_in_conflict() {
    let (mut b, squatted) = (bridged_with_new_vms(), NEW_VMS);
    assert!(timed_udhcpc(&b.vm).0);
    // The other host really uses the three addresses: its kernel answers every probe for them.
    for (_, _, ip) in squatted {
        b.rig
            .lab
            .address(&b.evil, "eth0", &format!("{ip}/24"))
            .unwrap();
    }
    let got: Vec<bool> = squatted
        .iter()
        .map(|(name, mac, _)| {
            let vm = b.host(name, mac);
            let dir = tempfile::tempdir().unwrap();
            udhcpc(&vm, dir.path(), &["-t", "2"]).status.success()
        })
        .collect();
    let metrics = b.wait_verdict("vmdhcp_agent_offer_probes_total", "capped", 1);
    let found = conflicts(&b);
    println!("a host using three reserved addresses: leases obtained {got:?}; conflicts {found:?}");
    assert_eq!(got, [false, false, true], "offered a squatted address");
    let answered_by: Vec<(&str, &Value)> = found
        .iter()
        .map(|(mac, c)| (mac.as_str(), &c["answered_by"]))
        .collect();
    assert_eq!(
        answered_by,
        [
            (squatted[0].1, &json!(EVIL_MAC)),
            (squatted[1].1, &json!(EVIL_MAC))
        ]
    );
    assert_eq!(
        verdicts(&metrics, "vmdhcp_agent_offer_probes_total", "conflict"),
        2.0
    );
    let gauge = "vmdhcp_agent_conflicted_addresses{pool=\"default/a\"} 2";
    assert!(metrics.lines().any(|l| l == gauge), "{metrics}");
    // The VM beside them keeps its address.
    assert!(timed_udhcpc(&b.vm).0);
}

#[test]
fn a_rogue_dnsmasq_beside_a_booting_vm_is_reported_and_forgotten_after_it_stops() {
    const INTERVAL: u64 = 2;
    const FORGET: u64 = 6;
    let mut b = Bridged::with_args(
        &[pool_a(json!({}))],
        &[
            "--foreign-dhcp-probe-interval-seconds",
            &INTERVAL.to_string(),
            "--suspect-forget-after-seconds",
            &FORGET.to_string(),
        ],
    );
    let series = "vmdhcp_agent_network_suspects{pool=\"default/a\",kind=\"foreign_dhcp_server\"}";
    let suspects = |b: &Bridged| metric(&b.metrics(), series);
    assert_eq!(suspects(&b), Some(0.0), "{}", b.metrics());

    // A tenant starts dnsmasq as a DHCP server on the network while a VM boots: the client
    // takes the first OFFER, whoever sent it.
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let rogue = start_rogue(&mut b, dir.path());
    let vm_dir = tempfile::tempdir().unwrap();
    let booted = udhcpc(&b.vm, vm_dir.path(), &[]).status.success();
    let bound = events(vm_dir.path())
        .into_iter()
        .find(|(e, _)| e == "bound")
        .map(|(_, env)| (env.get("ip").cloned(), env.get("serverid").cloned()));
    wait_for(
        "the rogue server reported",
        Duration::from_secs(INTERVAL + 5),
        || (suspects(&b) == Some(1.0)).then_some(()),
    );
    let found_after = started.elapsed();

    // It stops: forgotten once not seen for the forget time.
    let killed = std::process::Command::new("kill")
        .arg(rogue.to_string())
        .status()
        .unwrap();
    assert!(killed.success());
    let stopped = Instant::now();
    wait_for(
        "the rogue server forgotten",
        Duration::from_secs(FORGET + 3),
        || (suspects(&b) == Some(0.0)).then_some(()),
    );
    let cleared_after = stopped.elapsed();
    println!(
        "rogue dnsmasq (probe every {INTERVAL} s, forgotten after {FORGET} s): reported {} ms \
         after it started, cleared {} ms after it stopped; the VM booting meanwhile: {} \
         (address, server) {bound:?}",
        found_after.as_millis(),
        cleared_after.as_millis(),
        if booted { "bound" } else { "no lease" },
    );
    // Documented: within one probe interval of the rogue answering (it answers at once here).
    assert!(found_after <= Duration::from_secs(INTERVAL + 1));
    // Last seen at most one probe interval before it stopped.
    assert!(cleared_after >= Duration::from_secs(FORGET - INTERVAL));
}

// IPv6 (issue 53): the same tenant, on a dual-stack pool, against a live `dhclient -6`.

/// The dual-stack pool's IPv6 subnet, a ULA that exists only in the lab.
const SUBNET6: &str = "fd76:6d64:6863::/112";
/// A prefix a rogue router advertises, another lab-only ULA.
const ROGUE_PREFIX: &str = "fd99:6d64:6863:1::/64";

fn reserved6() -> Ipv6Addr {
    "fd76:6d64:6863::10".parse().unwrap()
}

/// Pool A dual-stack: [`MAC_1`] holds [`IP_1`] and `::10`; IPv6 leases of 10 s (T1 5 s, T2
/// 8 s), so a victim that stops being answered loses its address within seconds.
fn dual_a() -> Value {
    let mut p = pool(
        "a",
        "srv0",
        SERVER_A,
        "192.0.2.0/24",
        json!({"ipv6": {"server_ip": "fd76:6d64:6863::1", "subnet": SUBNET6, "lease_seconds": 10}}),
    );
    p["leases"] = json!([{"mac": MAC_1, "ip": IP_1, "ipv6": reserved6().to_string()}]);
    p
}

/// The bridged network serving [`dual_a`], interfaces configured by the agent, with the VM's
/// `dhclient -6` bound to its reservation.
fn dual_lab() -> (Bridged, Client6) {
    let b = Bridged::with_args(&[dual_a()], &["--configure-interfaces"]);
    wait_for("the DHCPv6 server", Duration::from_secs(10), || {
        b.rig.agent_log().contains("DHCPv6 serving").then_some(())
    });
    wait_link_local(&b.rig.lab, &b.vm, "eth0", Duration::from_secs(10));
    let victim = Client6::dhclient(&b.vm, "eth0", Options6::default());
    let bound = victim.wait_lease("BOUND6", 0, Duration::from_secs(20));
    assert_eq!(bound.address, reserved6());
    // The attacks start once the VM's duplicate address detection is over: an advertisement
    // of a tentative address makes the VM's own kernel give it up (RFC 4862 §5.4.4), which is
    // the link's weakness, not the server's.
    wait_for("the VM's address past DAD", Duration::from_secs(10), || {
        addresses(&b.rig.lab, &b.vm, "eth0", "global")
            .iter()
            .any(|(a, flags)| *a == reserved6() && flags.is_empty())
            .then_some(())
    });
    (b, victim)
}

/// Waits, during an attack, until the victim renewed `n` more times from `events_before`
/// events, each keeping its address; fails (with both logs) on an expiry or a lost address.
fn keeps_renewing(b: &Bridged, victim: &Client6, events_before: usize, n: usize) -> usize {
    let kept = wait_for("the victim's renewals", Duration::from_secs(40), || {
        let events = victim.events();
        for (name, env) in &events[events_before..] {
            assert!(
                !["EXPIRE6", "STOP6", "RELEASE6"].contains(&name.as_str()),
                "the victim lost its lease ({name}); client:\n{}\nagent:\n{}",
                victim.log(),
                b.rig.agent_log()
            );
            if let Some(lease) = Lease6::from_event(env) {
                assert_eq!(lease.address, reserved6(), "{name}: {env:?}");
            }
        }
        let renewed = events[events_before..]
            .iter()
            .filter(|(name, _)| name == "RENEW6" || name == "REBIND6")
            .count();
        (renewed >= n).then_some(renewed)
    });
    println!(
        "the victim renewed {kept} times during the attack, keeping {}",
        reserved6()
    );
    kept
}

/// Plays `frames` from the tenant, one every `every`, for 20 s while the victim renews, running
/// `during` once the attack started; returns once the victim renewed 3 times keeping its address
/// (failing otherwise), having printed how many frames of `what` were sent, and checks that no
/// answer of the agent failed meanwhile.
fn attack_while_renewing(
    b: &Bridged,
    victim: &Client6,
    (frames, every): (&[Vec<u8>], Duration),
    what: &str,
    during: impl FnOnce(),
) {
    let before = victim.events().len();
    let attacker = hostile6::play(&b.evil, frames, every, Duration::from_secs(20));
    during();
    let kept = keeps_renewing(b, victim, before, 3);
    let sent = attacker.finish();
    println!("{what} sent: {}", sent[0]);
    assert!(kept >= 3);
    assert_eq!(
        dhcp6_metric(b, "vmdhcp_agent_dhcp6_send_errors_total", ""),
        0.0
    );
}

/// Polls `f` until it gives something, for at most `limit`.
fn wait_for_or_none<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A metric line of pool A's DHCPv6 server on `srv0`: `family{labels,extra} value`.
fn dhcp6_metric(b: &Bridged, family: &str, extra: &str) -> f64 {
    let labels = if extra.is_empty() {
        LABELS.to_owned()
    } else {
        format!("{LABELS},{extra}")
    };
    metric(&b.metrics(), &format!("{family}{{{labels}}}")).unwrap_or(0.0)
}

/// 50 Neighbor Advertisements a second, for 20 s, unicast to the agent and claiming the
/// victim's link-local address for the tenant's MAC (Solicited and Override set): on a server
/// that sends through the kernel's neighbour table, every answer to the victim goes to the
/// tenant and the victim's address expires. Ours answers the MAC each request came from.
#[test]
fn forged_neighbor_advertisements_do_not_steal_a_vm_s_dhcpv6_answers() {
    let (b, victim) = dual_lab();
    let agent_mac = mac_of(&b.rig.lab, &b.rig.srv, "srv0");
    let agent_ll = wait_link_local(&b.rig.lab, &b.rig.srv, "srv0", Duration::from_secs(10));
    let victim_ll = wait_link_local(&b.rig.lab, &b.vm, "eth0", Duration::from_secs(10));
    let evil = mac_bytes(EVIL_MAC);
    let na =
        hostile6::neighbor_advertisement((evil, agent_mac), (victim_ll, agent_ll), victim_ll, evil);
    let attack = (&[na][..], Duration::from_millis(20));
    attack_while_renewing(&b, &victim, attack, "forged NAs", || {});
}

/// A DECLINE of the victim's address in its name, relayed (option 79 naming its MAC), every
/// 20 ms, in a stream of 2 000 Neighbor Advertisements a second of that address from the tenant
/// (to all nodes, naming the tenant's MAC, as a real answer looks; and unicast to the agent),
/// half from its own MAC, half from a new MAC each time: a server that takes the first answer
/// to one solicitation hears the tenant before the VM sooner or later, and withholds the VM's
/// address. Ours hears the VM answer its solicitations, so the DECLINE is forged and nothing is
/// withheld; the victim keeps renewing its address.
#[test]
fn a_forged_relayed_decline_with_an_advertisement_burst_takes_no_vm_s_ipv6_address() {
    let (b, victim) = dual_lab();
    let agent_mac = mac_of(&b.rig.lab, &b.rig.srv, "srv0");
    let agent_ll = wait_link_local(&b.rig.lab, &b.rig.srv, "srv0", Duration::from_secs(10));
    let evil = mac_bytes(EVIL_MAC);
    let evil_ll: Ipv6Addr = "fe80::e0e".parse().unwrap();
    let pool_name: NamespacedName = "default/a".parse().unwrap();
    let decline = hostile6::udp6(
        (evil, hostile6::ALL_SERVERS_MAC),
        (evil_ll, 547),
        (hostile6::ALL_SERVERS, 547),
        &hostile6::relayed_decline(mac_bytes(MAC_1), &server_duid(&pool_name), reserved6()),
    );
    let all_nodes: Ipv6Addr = "ff02::1".parse().unwrap();
    let mut frames = vec![decline];
    for n in 0u8..20 {
        // The tenant's own MAC, then a fresh one per frame.
        let mac = if n % 2 == 0 {
            evil
        } else {
            [2, 0xee, 0, 0, 0, n]
        };
        frames.push(hostile6::neighbor_advertisement(
            (mac, [0x33, 0x33, 0, 0, 0, 1]),
            (reserved6(), all_nodes),
            reserved6(),
            mac,
        ));
        frames.push(hostile6::neighbor_advertisement(
            (mac, agent_mac),
            (reserved6(), agent_ll),
            reserved6(),
            mac,
        ));
    }
    let verdict = "in the name of its own holder, which answers for it";
    let attack = (&frames[..], Duration::from_micros(500));
    attack_while_renewing(&b, &victim, attack, "DECLINEs and NAs", || {
        let heard = wait_for_or_none(Duration::from_secs(20), || {
            b.rig.agent_log().contains(verdict).then_some(())
        });
        assert!(heard.is_some(), "no verdict; agent:\n{}", b.rig.agent_log());
    });
    let log = b.rig.agent_log();
    assert!(
        !log.contains("another host answers for it: withheld"),
        "{log}"
    );
    let confirmed = dhcp6_metric(
        &b,
        "vmdhcp_agent_dhcp6_declines_total",
        r#"result="confirmed""#,
    );
    assert_eq!(confirmed, 0.0);
}

/// 200 INFORMATION-REQUESTs a second, for 20 s, each from a new link-local source nobody owns:
/// a server whose answers wait in the kernel for Neighbor Discovery of those sources fills its
/// send buffer and stops answering anyone. Ours sends each answer to the frame's MAC at once:
/// the victim keeps renewing, no answer fails, and the agent's neighbour table does not grow.
#[test]
fn information_requests_from_unresolvable_sources_deny_dhcpv6_to_nobody() {
    let (b, victim) = dual_lab();
    let evil = mac_bytes(EVIL_MAC);
    let frames: Vec<Vec<u8>> = (0u16..400)
        .map(|n| {
            let source = Ipv6Addr::new(0xfe80, 0, 0, 0, 0x1234, 0x5678, n, 0x9abc);
            hostile6::udp6(
                (evil, hostile6::ALL_SERVERS_MAC),
                (source, 546),
                (hostile6::ALL_SERVERS, 547),
                &hostile6::information_request(u32::from(n)),
            )
        })
        .collect();
    let attack = (&frames[..], Duration::from_millis(5));
    attack_while_renewing(&b, &victim, attack, "INFORMATION-REQUESTs", || {});
    let neighbours = b
        .rig
        .lab
        .exec(&b.rig.srv, "ip", &["-6", "neigh", "show", "dev", "srv0"])
        .unwrap();
    assert!(neighbours.lines().count() < 10, "{neighbours}");
}

/// SOLICITs naming 85 IA_NAs: from `ff02::1` (a reply would go to every VM), dropped; from a
/// host's own address, answered for the first few IAs only, a reply smaller than the request.
/// The victim's interface sees no reply of the agent's meanwhile.
#[test]
fn a_solicit_from_all_nodes_is_not_reflected_and_many_ias_are_not_amplified() {
    let (mut b, victim) = dual_lab();
    drop(victim);
    let evil = mac_bytes(EVIL_MAC);
    // In the VM's name (its DUID-LL), so that there is a reservation to answer with.
    let solicit = hostile6::solicit_with_ias(mac_bytes(MAC_1), 85);
    let reflected = hostile6::udp6(
        (evil, hostile6::ALL_SERVERS_MAC),
        ("ff02::1".parse().unwrap(), 546),
        (hostile6::ALL_SERVERS, 547),
        &solicit,
    );
    let pcap = b.rig.dir.path().join("vm6.pcap");
    let mut cmd = b.vm.command("tcpdump");
    cmd.args(["-i", "eth0", "--immediate-mode", "-U", "-n", "-w"])
        .arg(&pcap)
        .args(["udp", "src", "port", "547"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    b.rig.lab.spawn(cmd).unwrap();
    wait_for("tcpdump capturing", Duration::from_secs(10), || {
        std::fs::metadata(&pcap)
            .is_ok_and(|m| m.len() >= 24)
            .then_some(())
    });
    let sent = hostile6::play(
        &b.evil,
        &[reflected],
        Duration::from_millis(10),
        Duration::from_secs(1),
    )
    .finish();
    let dropped = wait_for("the drops counted", Duration::from_secs(10), || {
        let n = dhcp6_metric(
            &b,
            "vmdhcp_agent_dhcp6_dropped_total",
            r#"reason="source_not_unicast""#,
        );
        (n >= sent[0] as f64).then_some(n)
    });
    println!(
        "SOLICITs from ff02::1 sent: {}, dropped: {dropped}",
        sent[0]
    );
    let replies = b
        .rig
        .lab
        .exec(&b.vm, "tcpdump", &["-r", pcap.to_str().unwrap(), "-n"])
        .unwrap_or_default();
    assert_eq!(replies.lines().count(), 0, "{replies}");
    // From the tenant's own link-local address: answered, for at most a few IAs.
    let evil_ll = wait_link_local(&b.rig.lab, &b.evil, "eth0", Duration::from_secs(10));
    let own = hostile6::udp6(
        (evil, hostile6::ALL_SERVERS_MAC),
        (evil_ll, 546),
        (hostile6::ALL_SERVERS, 547),
        &solicit,
    );
    let script = format!(
        "import socket\n\
         s=socket.socket(socket.AF_INET6,socket.SOCK_DGRAM)\n\
         s.setsockopt(socket.SOL_SOCKET,socket.SO_BINDTODEVICE,b'eth0')\n\
         s.bind(('::',546)); s.settimeout(5)\n\
         p=socket.socket(socket.AF_PACKET,socket.SOCK_RAW); p.bind(('eth0',0))\n\
         p.send(bytes.fromhex('{}'))\n\
         d=s.recv(65535)\n\
         print(len(d))\n",
        hex(&own)
    );
    let answer = b
        .rig
        .lab
        .exec(&b.evil, "python3", &["-c", &script])
        .unwrap();
    let reply_len: usize = answer.split_whitespace().next().unwrap().parse().unwrap();
    println!(
        "a SOLICIT of {} bytes with 85 IA_NAs: a reply of {reply_len} bytes",
        solicit.len()
    );
    assert!(reply_len < solicit.len(), "{reply_len} ≥ {}", solicit.len());
}

/// radvd on the tenant's host as a rogue router: [`ROGUE_PREFIX`] with SLAAC on, itself the
/// default router, no DHCPv6 flags.
fn rogue_router(b: &Bridged) -> Radvd {
    let config = RadvdConfig {
        managed: false,
        other: false,
        autonomous: true,
        router_lifetime: 1800,
        ..RadvdConfig::managed("eth0", ROGUE_PREFIX)
    };
    Radvd::start(&b.evil, &config)
}

/// Whether `a` is in [`ROGUE_PREFIX`].
fn rogue(a: &Ipv6Addr) -> bool {
    a.segments()[..4] == [0xfd99, 0x6d64, 0x6863, 1]
}

/// A tenant runs a router (radvd) advertising a prefix with SLAAC on and itself as the default
/// router: the VM takes the prefix (the RA reached the network), the agent takes nothing, no
/// address and no route, and its interface ignores RAs, redirects and proxies no NDP.
#[test]
fn a_rogue_router_advertisement_steers_none_of_the_agent_s_routing() {
    let (b, victim) = dual_lab();
    drop(victim);
    let mut radvd = rogue_router(&b);
    let slaac = wait_for(
        "the VM's SLAAC address from the rogue RA",
        Duration::from_secs(30),
        || {
            global_addresses(&b.rig.lab, &b.vm, "eth0")
                .into_iter()
                .find(rogue)
        },
    );
    println!("the VM took {slaac} from the rogue router");
    // The agent's namespace: no address in the prefix, no route learned from the RA.
    let addresses = global_addresses(&b.rig.lab, &b.rig.srv, "srv0");
    assert!(!addresses.iter().any(rogue), "{addresses:?}");
    let routes = b
        .rig
        .lab
        .exec(&b.rig.srv, "ip", &["-6", "route", "show", "proto", "ra"])
        .unwrap();
    assert!(routes.trim().is_empty(), "{routes}");
    let settings = format!("vmdhcp_agent_ipv6_host_settings{{{LABELS}}}");
    assert_eq!(
        metric(&b.metrics(), &settings),
        Some(1.0),
        "{}",
        b.metrics()
    );
    for setting in ["accept_ra", "autoconf", "accept_redirects", "proxy_ndp"] {
        let file = format!("/proc/sys/net/ipv6/conf/srv0/{setting}");
        let value = b.rig.lab.exec(&b.rig.srv, "cat", &[&file]).unwrap();
        assert_eq!(value.trim(), "0", "{setting}");
    }
    radvd.stop();
}

/// A tenant runs a DHCPv6 server (kea-dhcp6 with a pool of the pool's own subnet) on the
/// network: the agent's probe SOLICIT finds it within one probe interval, and reports it as it
/// reports a DHCPv4 one (the suspect series the IPPool condition, event and alert follow); once
/// it stops, it is forgotten after the forget time.
#[test]
fn a_rogue_dhcpv6_server_is_reported_and_forgotten_after_it_stops() {
    const INTERVAL: u64 = 2;
    const FORGET: u64 = 6;
    let b = Bridged::with_args(
        &[dual_a()],
        &[
            "--configure-interfaces",
            "--foreign-dhcp-probe-interval-seconds",
            &INTERVAL.to_string(),
            "--suspect-forget-after-seconds",
            &FORGET.to_string(),
        ],
    );
    wait_for("the DHCPv6 server", Duration::from_secs(10), || {
        b.rig.agent_log().contains("DHCPv6 serving").then_some(())
    });
    let series = "vmdhcp_agent_network_suspects{pool=\"default/a\",kind=\"foreign_dhcp_server\"}";
    let suspects = |b: &Bridged| metric(&b.metrics(), series);
    assert_eq!(suspects(&b), Some(0.0), "{}", b.metrics());
    let config = Kea6Config {
        pool: Some("fd76:6d64:6863::100 - fd76:6d64:6863::1ff".to_owned()),
        ..Kea6Config::new("eth0", SUBNET6)
    };
    // Kea binds its link-local address: once that one is past DAD.
    wait_link_local(&b.rig.lab, &b.evil, "eth0", Duration::from_secs(10));
    let started = Instant::now();
    let mut kea = Kea6::start(&b.evil, &config);
    let found = wait_for_or_none(Duration::from_secs(INTERVAL + 5), || {
        (suspects(&b) == Some(1.0)).then_some(())
    });
    assert!(
        found.is_some(),
        "not reported; kea:\n{}\nagent:\n{}",
        kea.log(),
        b.rig.agent_log()
    );
    let found_after = started.elapsed();
    let log = b.rig.agent_log();
    assert!(
        log.contains("foreign DHCPv6 server on the pool's network"),
        "{log}"
    );
    assert!(log.contains(&config.server_duid()[..16]), "{log}");
    kea.stop();
    let stopped = Instant::now();
    wait_for(
        "the rogue server forgotten",
        Duration::from_secs(FORGET + 3),
        || (suspects(&b) == Some(0.0)).then_some(()),
    );
    println!(
        "rogue kea-dhcp6 (probe every {INTERVAL} s, forgotten after {FORGET} s): reported {} ms \
         after it started, cleared {} ms after it stopped",
        found_after.as_millis(),
        stopped.elapsed().as_millis()
    );
    assert!(found_after <= Duration::from_secs(INTERVAL + 1));
}

/// A tenant answers every Neighbor Solicitation (proxy NDP): a new VM's duplicate address
/// detection fails on its reservation and `dhclient -6` declines it. The agent's own
/// solicitations hear the tenant too, and for addresses nobody holds: a proxy-NDP responder,
/// reported, whose answers make no conflict. Nothing is withheld.
#[test]
fn a_host_answering_every_neighbor_solicitation_makes_no_ipv6_conflict_and_is_reported() {
    let b = Bridged::with_args(&[dual_a()], &["--configure-interfaces"]);
    wait_for("the DHCPv6 server", Duration::from_secs(10), || {
        b.rig.agent_log().contains("DHCPv6 serving").then_some(())
    });
    wait_link_local(&b.rig.lab, &b.vm, "eth0", Duration::from_secs(10));
    let proxy =
        hostile6::answer_every_ns(&b.evil, mac_bytes(EVIL_MAC), Duration::from_secs(30), 2000);
    let options = Options6 {
        dad_wait_seconds: Some(3),
        ..Options6::default()
    };
    let c = Client6::dhclient(&b.vm, "eth0", options);
    let verdict = "only a proxy-NDP responder answers for it: still served";
    let heard = wait_for_or_none(Duration::from_secs(30), || {
        b.rig.agent_log().contains(verdict).then_some(())
    });
    assert!(
        heard.is_some(),
        "no verdict; client:\n{}\nagent:\n{}",
        c.log(),
        b.rig.agent_log()
    );
    assert!(c.log().contains("XMT: Forming Decline"), "{}", c.log());
    let series = "vmdhcp_agent_network_suspects{pool=\"default/a\",kind=\"proxy_ndp_responder\"}";
    assert_eq!(metric(&b.metrics(), series), Some(1.0), "{}", b.metrics());
    let confirmed = dhcp6_metric(
        &b,
        "vmdhcp_agent_dhcp6_declines_total",
        r#"result="confirmed""#,
    );
    assert_eq!(confirmed, 0.0);
    let answers = proxy.stop();
    println!("the proxy answered {} solicitations", answers[0]);
}

/// The rogue router again, where the agent cannot write `/proc/sys` (as in a pod whose runtime
/// allows no writes there: `vmdhcp_agent_ipv6_host_settings` 0): the kernel takes the RA's
/// address and default route, and the agent removes both as the kernel announces them, each
/// counted; after the rogue stops, nothing of it is left.
#[test]
fn where_proc_sys_is_read_only_what_a_rogue_ra_teaches_the_agent_is_removed_at_once() {
    let b = Bridged::with_read_only_proc_sys(&[dual_a()], &["--configure-interfaces"]);
    wait_for("the DHCPv6 server", Duration::from_secs(10), || {
        b.rig.agent_log().contains("DHCPv6 serving").then_some(())
    });
    let settings = format!("vmdhcp_agent_ipv6_host_settings{{{LABELS}}}");
    assert_eq!(
        metric(&b.metrics(), &settings),
        Some(0.0),
        "{}",
        b.metrics()
    );
    let accept_ra = b
        .rig
        .lab
        .exec(
            &b.rig.srv,
            "cat",
            &["/proc/sys/net/ipv6/conf/srv0/accept_ra"],
        )
        .unwrap();
    assert_eq!(accept_ra.trim(), "1", "the namespace's default stays");
    let mut radvd = rogue_router(&b);
    let removed = |kind: &str| {
        let series = format!("vmdhcp_agent_ipv6_learned_removed_total{{{LABELS},kind=\"{kind}\"}}");
        metric(&b.metrics(), &series).unwrap_or(0.0)
    };
    let seen = wait_for_or_none(Duration::from_secs(30), || {
        (removed("route") >= 1.0 && removed("address") >= 1.0).then_some(())
    });
    assert!(
        seen.is_some(),
        "nothing removed; agent:\n{}",
        b.rig.agent_log()
    );
    radvd.stop();
    let left = wait_for_or_none(Duration::from_secs(10), || {
        let routes = b
            .rig
            .lab
            .exec(&b.rig.srv, "ip", &["-6", "route", "show", "proto", "ra"])
            .unwrap();
        let addresses = global_addresses(&b.rig.lab, &b.rig.srv, "srv0");
        (routes.trim().is_empty() && !addresses.iter().any(rogue)).then_some(())
    });
    assert!(
        left.is_some(),
        "the rogue's route or address stayed; agent:\n{}",
        b.rig.agent_log()
    );
    println!(
        "with /proc/sys read-only, the agent removed {} routes and {} addresses a rogue RA gave it",
        removed("route"),
        removed("address")
    );
}
