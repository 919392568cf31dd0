//! The whole system end to end: real API server, the controller and two agents as processes,
//! real DHCP clients (see [`vmdhcp_integration::fleet`] for the topology).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::net::Ipv6Addr;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use vmdhcp_core::pool::duid::server_duid;
use vmdhcp_integration::dhcp_client::{start_dhclient, start_udhcpc, wait_event, wait_for};
use vmdhcp_integration::dhcp6_client::{
    Client6, Lease6, Options6, global_addresses, wait_link_local,
};
use vmdhcp_integration::fleet::{
    Agent, Captured, Fleet, LEASE_SECONDS, NS, NTP_IP, Options, SERVER_IP, SERVER_IP6, SUBNET6,
    VM1_MAC, VM2_MAC, arp_announcements, captured, doubled_replies, metric, probe_until_leased,
    setup, setup_with,
};
use vmdhcp_integration::hostile::{
    Forgery, capture_dhcp, forge, leased_after, mac_bytes, now_unix, settled_cost, transcript,
};
use vmdhcp_integration::image_clients::{NetworkManager, Networkd};

#[test]
fn kubectl_apply_to_lease_then_failover_fallback_and_resume() {
    let mut fleet = setup();
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    let mut timeline: Vec<(&str, f64)> = vec![("setup done", now())];
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
    // The pool names its NTP server by host: `run` resolves it (option 42 carries addresses).
    assert_eq!(bound["new_ntp_servers"], NTP_IP);
    // Host names are off by default, and the pool's status records none...
    assert!(!bound.contains_key("new_host_name"), "{bound:?}");
    let pool = fleet.kubectl_json(&["-n", NS, "get", "ippool", "pool-a"]);
    assert!(pool["status"]["ipv4"].get("hostNames").is_none(), "{pool}");
    let addresses = pool["status"]["ipv4"]["allocated"].clone();
    // ...opting in records the VM's name with its address (the controller kept it) and sends
    // it from the next ACK on, with no allocation changed.
    fleet.kubectl_json(&[
        "-n",
        NS,
        "patch",
        "ippool",
        "pool-a",
        "--type=merge",
        "-p",
        r#"{"spec":{"ipv4Config":{"sendHostName":true}}}"#,
    ]);
    let seen = vmdhcp_integration::dhcp_client::events(&dir1).len();
    wait_for("a renewal naming vm1", Duration::from_secs(30), || {
        vmdhcp_integration::dhcp_client::events(&dir1)
            .into_iter()
            .skip(seen)
            .find(|(e, env)| {
                e == "RENEW" && env.get("new_host_name").map(String::as_str) == Some("vm1")
            })
    });
    let pool = fleet.kubectl_json(&["-n", NS, "get", "ippool", "pool-a"]);
    assert_eq!(pool["status"]["ipv4"]["hostNames"][&ip1], "vm1", "{pool}");
    assert_eq!(pool["status"]["ipv4"]["allocated"], addresses, "{pool}");

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

    // Both /metrics show the system at work, and their series move with it.
    timeline.push(("metrics and probe", now()));
    let leading = if leader == a0.identity { &a0 } else { &a1 };
    let c = fleet.controller_metrics();
    assert_eq!(metric(&c, "vmdhcpcontroller_leader "), Some(1.0), "{c}");
    assert_eq!(
        metric(&c, "vmdhcpcontroller_stream_clients "),
        Some(2.0),
        "{c}"
    );
    assert!(
        metric(&c, "vmdhcpcontroller_index_revision ").unwrap_or(0.0) > 0.0,
        "{c}"
    );
    assert_eq!(
        metric(&c, "vmdhcpcontroller_ippool_used{ippool=\"fleet/pool-a\""),
        Some(2.0),
        "{c}"
    );
    assert!(
        metric(
            &c,
            "vmdhcpcontroller_reconciles_total{controller=\"vmnetcfg\",result=\"ok\"}"
        )
        .unwrap_or(0.0)
            > 0.0,
        "{c}"
    );
    assert_eq!(
        metric(
            &c,
            "vmdhcpcontroller_allocations_total{ippool=\"fleet/pool-a\",result=\"allocated\"}"
        ),
        Some(2.0),
        "{c}"
    );
    assert_eq!(metric(&c, "vmdhcpcontroller_build_info{"), Some(1.0), "{c}");
    let requests = |text: &str| metric(text, "vmdhcp_agent_dhcp_requests_total").unwrap_or(0.0);
    let m = fleet.agent_metrics(leading);
    assert_eq!(metric(&m, "vmdhcp_agent_build_info{"), Some(1.0), "{m}");
    assert_eq!(metric(&m, "vmdhcp_agent_leader "), Some(1.0), "{m}");
    assert_eq!(
        metric(&m, "vmdhcp_agent_leases{pool=\"fleet/pool-a\"}"),
        Some(2.0),
        "{m}"
    );
    assert_eq!(
        metric(&m, "vmdhcp_agent_stream_connected "),
        Some(1.0),
        "{m}"
    );
    assert!(requests(&m) > 0.0, "{m}");
    let before = (
        requests(&m),
        metric(&m, "vmdhcp_agent_dhcp_replies_total").unwrap_or(0.0),
    );
    probe_until_leased(
        &vm2,
        &fleet.dir.path().join("probe"),
        &ip2,
        Duration::from_secs(10),
    );
    let m = fleet.agent_metrics(leading);
    assert!(requests(&m) > before.0, "requests did not move: {m}");
    assert!(
        metric(&m, "vmdhcp_agent_dhcp_replies_total").unwrap_or(0.0) > before.1,
        "replies did not move: {m}"
    );

    // kill -9 the leader: the standby answers within lease duration + 2 s (+1 s of probe).
    let (mut killed, survivor) = if leader == a0.identity {
        (a0, a1)
    } else {
        (a1, a0)
    };
    timeline.push(("kill -9 leader", now()));
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
    timeline.push(("restart killed", now()));
    killed = fleet.restart_as_standby(killed);
    let addrs = fleet
        .lab
        .exec(&killed.ns, "ip", &["-4", "addr", "show", &fleet.interface])
        .unwrap();
    assert!(
        !addrs.contains(SERVER_IP),
        "standby still carries the server address: {addrs}"
    );

    // SIGTERM the leader: handoff within 3 s (+1 s of probe).
    timeline.push(("SIGTERM leader", now()));
    assert!(survivor.process.signal("TERM"));
    let took = probe_until_leased(&vm2, &probe_dir, &ip2, Duration::from_secs(3 + 1));
    eprintln!("graceful failover: a renewal answered {took:?} after SIGTERM");
    wait_for("the old leader to exit", Duration::from_secs(10), || {
        survivor.process.exited().then_some(())
    });
    assert_eq!(fleet.leader(&[&killed]).identity, killed.identity);

    // The controller dies; agents keep serving; a freshly started agent with no stream serves
    // every lease recorded in etcd from IPPool status.
    timeline.push(("controller stopped", now()));
    fleet.controller.take().unwrap().stop();
    probe_until_leased(&vm2, &probe_dir, &ip2, Duration::from_secs(10));
    let fresh_ns = killed.ns.clone();
    drop(killed);
    timeline.push(("fresh agent (old leader killed)", now()));
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
    timeline.push(("controller restarted", now()));
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

    // Never two servers answering one client request.
    let messages = captured(&pcap);
    assert!(
        messages.iter().any(|m| m.op == 2),
        "no DHCP replies captured"
    );
    let doubled = doubled_replies(&messages);
    assert!(
        doubled.is_empty(),
        "replies from two servers to one request: {doubled:#?}\ntimeline (unix s): {timeline:#?}"
    );
}

/// Issue #18 item 2: a server address that moves to another agent moves to another MAC. A client
/// that renewed with the old leader holds the old MAC in its ARP cache; the new leader's ARP
/// announcements must update it, so the client's next RENEW, unicast, reaches the new leader
/// instead of waiting for the entry to expire. The client keeps its ARP entries for minutes
/// (base_reachable_time 10 min: the kernel's default entry lives 15-45 s, long enough to lose
/// several renewals on a short lease, and a busy client keeps its entry confirmed indefinitely).
#[test]
fn after_a_takeover_clients_renew_by_unicast_with_the_new_leader_at_once() {
    let mut fleet = setup();
    let ip1 = fleet.allocated()[VM1_MAC].clone();
    let ns0 = fleet.agent_netns(0);
    let ns1 = fleet.agent_netns(1);
    let a0 = fleet.start_agent(&ns0, "agent-0");
    let a1 = fleet.start_agent(&ns1, "agent-1");
    let vm1 = fleet.vm("vm1", VM1_MAC);
    fleet
        .lab
        .exec(
            &vm1,
            "sysctl",
            &["-qw", "net.ipv4.neigh.eth0.base_reachable_time_ms=600000"],
        )
        .unwrap();
    let pcap = fleet.dir.path().join("vm1.pcap");
    let mut tcpdump = vm1.command("tcpdump");
    tcpdump
        .args(["-i", "eth0", "-U", "-n", "-w"])
        .arg(&pcap)
        .args(["arp", "or", "udp", "port", "67", "or", "udp", "port", "68"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    fleet.lab.spawn(tcpdump).unwrap();

    let leader = fleet.leader(&[&a0, &a1]).identity.clone();
    let (old, new) = if leader == a0.identity {
        (a0, a1)
    } else {
        (a1, a0)
    };
    let old_mac = fleet.mac_of(&old.ns, &fleet.interface);
    let new_mac = fleet.mac_of(&new.ns, &fleet.interface);
    assert_ne!(old_mac, new_mac);

    // The client binds, then renews by unicast with the old leader: its ARP cache now maps the
    // server address to the old leader's MAC, for the next ten minutes.
    let dir1 = fleet.dir.path().join("vm1");
    fs::create_dir_all(&dir1).unwrap();
    start_dhclient(&mut fleet.lab, &vm1, &dir1);
    let bound = wait_event(&dir1, "BOUND", 0, Duration::from_secs(30));
    assert_eq!(bound["new_ip_address"], ip1);
    wait_event(&dir1, "RENEW", 0, Duration::from_secs(30));
    let cached = fleet.neighbour(&vm1, SERVER_IP);
    assert_eq!(
        cached.as_ref().map(|(mac, _)| mac.as_str()),
        Some(old_mac.as_str()),
        "the client renewed with the old leader: {cached:?}"
    );

    // Graceful handoff: the old leader removes its address and releases the Lease; the standby
    // takes over.
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    let stopped_at = now();
    assert!(old.process.signal("TERM"));
    assert_eq!(fleet.leader(&[&new]).identity, new.identity);
    let takeover = now();
    eprintln!(
        "takeover: {} serving {:.2} s after SIGTERM to {}",
        new.identity,
        takeover - stopped_at,
        old.identity
    );

    // Measure first (printed with or without announcements), judge after. The client's neighbour
    // entry for the server address: does it show the new MAC, and when did it first?
    let mut neighbour_moved: Option<f64> = None;
    let mac = |s: &str| -> [u8; 6] {
        let bytes: Vec<u8> = s
            .split(':')
            .map(|b| u8::from_str_radix(b, 16).unwrap())
            .collect();
        bytes.try_into().unwrap()
    };
    let (new_hw, vm_hw) = (mac(&new_mac), mac(VM1_MAC));
    let server: [u8; 4] = SERVER_IP.parse::<std::net::Ipv4Addr>().unwrap().octets();
    let client: [u8; 4] = ip1.parse::<std::net::Ipv4Addr>().unwrap().octets();
    // ACKs from the new leader to vm1 after the handoff began, each with the client request it
    // answers (the latest one with its xid captured before it).
    let acks = || {
        let messages = captured(&pcap);
        messages
            .iter()
            .enumerate()
            .filter(|(_, m)| {
                m.op == 2
                    && m.kind == 5
                    && m.src == new_hw
                    && m.chaddr == vm_hw
                    && m.at > stopped_at
            })
            .map(|(i, ack)| {
                let request = messages[..i]
                    .iter()
                    .rev()
                    .find(|r| r.op == 1 && r.xid == ack.xid && r.src == vm_hw)
                    .cloned();
                (ack.clone(), request)
            })
            .collect::<Vec<_>>()
    };
    let unicast = |r: &Captured| r.dst == new_hw && r.dst_ip == server && r.ciaddr == client;
    // Bounded by the lease: 20 s, so T1 10 s and T2 17.5 s. Without announcements, RENEWs go
    // to the old MAC and are lost; the client may even let its lease expire and start over with
    // a broadcast DISCOVER (docs/tuning.md); only a broadcast REBIND answered by unicast makes
    // the new leader ARP for the client and so fixes the client's entry.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let first_unicast = loop {
        if neighbour_moved.is_none()
            && fleet
                .neighbour(&vm1, SERVER_IP)
                .is_some_and(|(m, _)| m == new_mac)
        {
            neighbour_moved = Some(now());
        }
        let found = acks()
            .into_iter()
            .find(|(_, request)| request.as_ref().is_some_and(unicast));
        if found.is_some() || std::time::Instant::now() > deadline {
            break found;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let acks = acks();
    let announcements: Vec<f64> = arp_announcements(&pcap)
        .iter()
        .filter(|a| a.mac == new_hw && a.ip == server && a.at > stopped_at)
        .map(|a| a.at - takeover)
        .collect();
    eprintln!(
        "ARP announcements of {SERVER_IP} by {new_mac} seen by the client, s after takeover: {announcements:.2?}"
    );
    eprintln!(
        "client's neighbour entry for {SERVER_IP} moved to {new_mac}: {}",
        neighbour_moved.map_or("never (within 60 s)".to_owned(), |t| format!(
            "{:.2} s after takeover",
            t - takeover
        ))
    );
    eprintln!(
        "takeover -> first unicast ACK (RENEW from {ip1} to {SERVER_IP} at {new_mac}): {}",
        first_unicast
            .as_ref()
            .map_or("none within 60 s".to_owned(), |(ack, _)| format!(
                "{:.2} s",
                ack.at - takeover
            ))
    );
    for (ack, request) in &acks {
        eprintln!(
            "  ACK by the new leader at +{:.2} s to a request to {:02x?} / {:?} (ciaddr {:?})",
            ack.at - takeover,
            request.as_ref().map(|r| r.dst),
            request.as_ref().map(|r| r.dst_ip),
            request.as_ref().map(|r| r.ciaddr),
        );
    }

    // Generous: the announcements go out within 4 s of taking over.
    assert!(
        neighbour_moved.is_some_and(|t| t - takeover < 10.0),
        "the client's ARP entry for {SERVER_IP} did not move to the new leader within 10 s of \
         the takeover (moved: {neighbour_moved:?}, takeover {takeover}): {:?}",
        fleet.neighbour(&vm1, SERVER_IP)
    );
    let (first_ack, first_request) = acks
        .first()
        .cloned()
        .unwrap_or_else(|| panic!("the new leader ACKed nothing within 60 s"));
    assert!(
        first_request.as_ref().is_some_and(unicast),
        "the first request the new leader ACKed (at +{:.2} s) was not a unicast RENEW to \
         {SERVER_IP} at {new_mac}: {first_request:?}",
        first_ack.at - takeover
    );
    // Generous: the next renewal comes at most T1 (10 s) after the last one, plus a retry.
    let took = first_ack.at - takeover;
    assert!(took < 30.0, "first unicast ACK {took:.2} s after takeover");
    // The announcements reached the client, and the new leader counted them.
    assert!(
        !announcements.is_empty(),
        "no ARP announcement of {SERVER_IP} by the new leader reached the client"
    );
    let m = fleet.agent_metrics(&new);
    assert!(
        metric(&m, "vmdhcp_agent_arp_announcements_total{").is_some_and(|n| n >= 1.0)
            && metric(&m, "vmdhcp_agent_arp_announcements_enabled ") == Some(1.0),
        "{m}"
    );
}

/// The dual-stack pool's IPv6 `leaseTime`: T1 10 s, T2 16 s. dhclient sends one RENEW at T1 and
/// retransmits it only after REN_TIMEOUT (10 s), past T2, so a RENEW lost to an outage means a
/// REBIND: the takeover must complete within T1 of the renewal before it, and a kill -9 takeover
/// takes up to the agents' Lease duration (6 s) + their retry period.
const LEASE6: u32 = 20;

/// Issue #40 point 6: a dual-stack pool through the controller, a real `dhclient -6` (and a
/// DHCPv4 `dhclient` beside it) on vm1, and two agents: the leader is killed (kill -9), then the
/// survivor stepped down (SIGTERM) to the restarted replica. The server DUID comes from the pool,
/// not the replica, so after each takeover the client's next RENEW (naming that DUID) is answered
/// by the new leader with the same address: no REBIND, no new SOLICIT. The IPv6 server address
/// follows the leader: on its interface only, removed on graceful step-down and, after a crash,
/// by the restarted replica as a standby.
#[test]
fn dual_stack_clients_renew_ipv6_with_the_new_leader_after_a_crash_and_a_graceful_failover() {
    let started = Instant::now();
    let mut fleet = setup_with(Options {
        ipv6_lease_seconds: Some(LEASE6),
        ..Options::default()
    });
    let ip1 = fleet.allocated()[VM1_MAC].clone();
    let ip6: Ipv6Addr = fleet.allocated6()[VM1_MAC].parse().unwrap();
    let range: [Ipv6Addr; 2] = ["fd10:123:45::50", "fd10:123:45::99"].map(|a| a.parse().unwrap());
    assert!(
        (range[0]..=range[1]).contains(&ip6),
        "{ip6} is outside pool-a's IPv6 range {range:?} ({SUBNET6})"
    );
    let duid: String = server_duid(&format!("{NS}/pool-a").parse().unwrap())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let ns0 = fleet.agent_netns(0);
    let ns1 = fleet.agent_netns(1);
    let a0 = fleet.start_agent(&ns0, "agent-0");
    let a1 = fleet.start_agent(&ns1, "agent-1");
    let vm1 = fleet.vm6("vm1", VM1_MAC);
    let leader = fleet.leader(&[&a0, &a1]).identity.clone();
    let (first, second) = if leader == a0.identity {
        (a0, a1)
    } else {
        (a1, a0)
    };
    wait_for(
        "the IPv6 server address on the leader's interface",
        Duration::from_secs(10),
        || carries_server_ip6(&fleet, &first).then_some(()),
    );
    assert!(
        !carries_server_ip6(&fleet, &second),
        "the standby carries {SERVER_IP6}"
    );

    // Both families bind on vm1's eth0: IPv4 from dhclient, IPv6 from dhclient -6.
    let dir4 = fleet.dir.path().join("vm1-v4");
    fs::create_dir_all(&dir4).unwrap();
    start_dhclient(&mut fleet.lab, &vm1, &dir4);
    let client = Client6::dhclient(&vm1, "eth0", Options6::default());
    let bound4 = wait_event(&dir4, "BOUND", 0, Duration::from_secs(30));
    assert_eq!(bound4["new_ip_address"], ip1);
    let bound = client.wait_lease("BOUND6", 0, Duration::from_secs(30));
    let expected = Lease6 {
        address: ip6,
        t1: LEASE6 / 2,
        t2: LEASE6 * 4 / 5,
        preferred: LEASE6,
        valid: LEASE6,
        server_id: duid.clone(),
        dns: vec!["fd10:123:45::53".parse().unwrap()],
    };
    assert_eq!(bound, expected);
    assert!(
        global_addresses(&fleet.lab, &vm1, "eth0").contains(&ip6),
        "the leased address is not on vm1's eth0"
    );

    // kill -9 of the leader, right after a renewal with it.
    let took = fail_over(
        &fleet, &client, &dir4, &first, &second, "KILL", &expected, &ip1,
    );
    eprintln!(
        "crash failover: {} serving {took:.2} s after kill -9",
        second.identity
    );

    // The killed replica comes back in the same pod network: a standby, the server addresses
    // it left behind removed.
    let restarted = fleet.restart_as_standby(first);
    let leftover = wait_for_or_last(Duration::from_secs(5), || {
        let v4 = fleet
            .lab
            .exec(
                &restarted.ns,
                "ip",
                &["-4", "addr", "show", &fleet.interface],
            )
            .unwrap();
        (
            !v4.contains(SERVER_IP) && !carries_server_ip6(&fleet, &restarted),
            v4,
        )
    });
    assert!(
        leftover.0,
        "the restarted standby still carries a server address: {}; IPv6: {:?}",
        leftover.1,
        global_addresses(&fleet.lab, &restarted.ns, &fleet.interface)
    );

    // SIGTERM of the survivor, right after a renewal with it: it steps down to the restarted
    // replica and removes its IPv6 server address.
    let took = fail_over(
        &fleet, &client, &dir4, &second, &restarted, "TERM", &expected, &ip1,
    );
    eprintln!(
        "graceful failover: {} serving {took:.2} s after SIGTERM",
        restarted.identity
    );
    wait_for("the old leader to exit", Duration::from_secs(10), || {
        second.process.exited().then_some(())
    });
    assert!(
        !carries_server_ip6(&fleet, &second),
        "{} kept {SERVER_IP6} after stepping down: {:?}",
        second.identity,
        global_addresses(&fleet.lab, &second.ns, &fleet.interface)
    );
    assert_eq!(fleet.allocated6()[VM1_MAC], ip6.to_string());
    assert_eq!(fleet.allocated()[VM1_MAC], ip1);
    eprintln!(
        "dual-stack failovers: {:.1} s in all",
        started.elapsed().as_secs_f64()
    );
}

/// Whether `agent`'s pool interface carries the pool's IPv6 server address.
fn carries_server_ip6(fleet: &Fleet, agent: &Agent) -> bool {
    let server: Ipv6Addr = SERVER_IP6.parse().unwrap();
    global_addresses(&fleet.lab, &agent.ns, &fleet.interface).contains(&server)
}

/// Polls `f` (whether it holds, and what it saw) until it holds or `limit` passes; returns the
/// last result either way.
fn wait_for_or_last<T>(limit: Duration, mut f: impl FnMut() -> (bool, T)) -> (bool, T) {
    let deadline = Instant::now() + limit;
    loop {
        let (ok, seen) = f();
        if ok || Instant::now() > deadline {
            return (ok, seen);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits for `client`'s next RENEW6 (answered by `old`), sends `signal` to `old` at once and
/// waits for `new` to lead; then the client's next RENEW6 must be answered by `new` with the
/// lease `expected` (same address, same server DUID) and nothing else may have happened to the
/// client's IPv6 lease since the signal (no REBIND6, no new BOUND6), the IPv6 server address
/// must be on `new`'s interface, and the DHCPv4 client (events in `dir4`) must renew or rebind
/// `ip4`. Returns the seconds from the signal to `new` serving.
#[allow(clippy::too_many_arguments)]
fn fail_over(
    fleet: &Fleet,
    client: &Client6,
    dir4: &Path,
    old: &Agent,
    new: &Agent,
    signal: &str,
    expected: &Lease6,
    ip4: &str,
) -> f64 {
    let renewals = |c: &Client6| c.event_names().iter().filter(|e| *e == "RENEW6").count();
    // The outage starts right after a renewal: the next RENEW comes T1 later.
    let renewed = client.wait_lease("RENEW6", renewals(client), Duration::from_secs(30));
    assert_eq!(&renewed, expected, "a renewal with {}", old.identity);
    let (seen6, seen4) = (
        client.events().len(),
        vmdhcp_integration::dhcp_client::events(dir4).len(),
    );
    let renewals_before = renewals(client);
    let replies = |agent: &Agent| {
        metric(
            &fleet.agent_metrics(agent),
            &format!(
                "vmdhcp_agent_dhcp6_replies_total{{interface=\"{}\",pool=\"{NS}/pool-a\",type=\"reply\"}}",
                fleet.interface
            ),
        )
        .unwrap_or(0.0)
    };
    assert_eq!(replies(new), 0.0, "{} answered as a standby", new.identity);
    let signalled = Instant::now();
    assert!(old.process.signal(signal));
    assert_eq!(fleet.leader(&[new]).identity, new.identity);
    let took = signalled.elapsed().as_secs_f64();
    assert!(
        carries_server_ip6(fleet, new),
        "{} serves without {SERVER_IP6}: {:?}",
        new.identity,
        global_addresses(&fleet.lab, &new.ns, &fleet.interface)
    );

    // The next RENEW, naming the pool's DUID, is answered by the new leader: same lease.
    let renewed = client.wait_lease("RENEW6", renewals_before, Duration::from_secs(30));
    assert_eq!(
        &renewed, expected,
        "the first renewal after {signal} to {}",
        old.identity
    );
    let since: Vec<String> = client.event_names().split_off(seen6);
    assert!(
        since.iter().all(|e| e == "RENEW6"),
        "after {signal} to {}, the client did more than renew: {since:?}; log:\n{}",
        old.identity,
        client.log()
    );
    assert!(
        replies(new) >= 1.0,
        "{} sent no DHCPv6 REPLY: {}",
        new.identity,
        fleet.agent_metrics(new)
    );

    // IPv4 keeps working: the DHCPv4 client's next renewal (or rebind) keeps its address.
    let (event, env) = wait_for(
        "a DHCPv4 renewal after the takeover",
        Duration::from_secs(30),
        || {
            vmdhcp_integration::dhcp_client::events(dir4)
                .into_iter()
                .skip(seen4)
                .find(|(e, _)| e == "RENEW" || e == "REBIND")
        },
    );
    assert_eq!(
        env.get("new_ip_address").map(String::as_str),
        Some(ip4),
        "{event}: {env:?}"
    );
    took
}

#[test]
fn a_squatter_on_a_vms_address_moves_the_vm_records_why_and_is_cleared_once_gone() {
    let mut fleet = setup();
    let allocated = fleet.allocated();
    let (ip1, ip2) = (allocated[VM1_MAC].clone(), allocated[VM2_MAC].clone());
    let ns0 = fleet.agent_netns(0);
    let a0 = fleet.start_agent(&ns0, "agent-0");
    fleet.leader(&[&a0]);

    // A host nobody manages already uses vm1's address when vm1 boots.
    const SQUATTER_MAC: &str = "02:12:34:00:00:99";
    let squatter = fleet.vm("squat", SQUATTER_MAC);
    fleet
        .lab
        .exec(
            &squatter,
            "ip",
            &["addr", "add", &format!("{ip1}/24"), "dev", "eth0"],
        )
        .unwrap();
    fleet
        .lab
        .exec(&squatter, "ip", &["link", "set", "eth0", "up"])
        .unwrap();
    let vm1 = fleet.vm("vm1", VM1_MAC);
    let dir1 = fleet.dir.path().join("vm1");
    fs::create_dir_all(&dir1).unwrap();
    let started = std::time::Instant::now();
    start_dhclient(&mut fleet.lab, &vm1, &dir1);
    let bound = wait_event(&dir1, "BOUND", 0, Duration::from_secs(90));
    let moved_to = bound["new_ip_address"].clone();
    eprintln!(
        "squatted {ip1}: vm1 bound to {moved_to} {:.1} s after dhclient started",
        started.elapsed().as_secs_f64()
    );
    assert_ne!(moved_to, ip1, "the squatted address is never offered");

    // The status says why, and nothing else moved.
    let pool = fleet.kubectl_json(&["-n", NS, "get", "ippool", "pool-a"]);
    let conflict = &pool["status"]["ipv4"]["conflicts"][&ip1];
    assert_eq!(conflict["answeredBy"], SQUATTER_MAC, "{pool}");
    assert_eq!(conflict["macAddress"], VM1_MAC, "{pool}");
    assert_eq!(conflict["source"], "Probe", "{pool}");
    let now = fleet.allocated();
    assert_eq!(now[VM1_MAC], moved_to);
    assert_eq!(now[VM2_MAC], ip2, "vm2 keeps its address");
    assert!(
        !pool["status"]["ipv4"]["allocated"]
            .as_object()
            .unwrap()
            .contains_key(&ip1),
        "the squatted address is nobody's: {pool}"
    );
    let said = wait_for("AddressConflict events", Duration::from_secs(20), || {
        let said = events(&fleet, "AddressConflict");
        (said.iter().any(|(k, _)| k == "IPPool")
            && said.iter().any(|(k, _)| k == "VirtualMachineNetworkConfig"))
        .then_some(said)
    });
    assert!(
        said.iter().any(|(k, m)| k == "VirtualMachineNetworkConfig"
            && m.contains(&ip1)
            && m.contains(SQUATTER_MAC)
            && m.contains(&moved_to)),
        "{said:?}"
    );

    // A controller restart keeps the conflict: a new VM does not get the squatted address.
    fleet.start_controller();
    fleet.apply_vm("vm3", "02:12:34:00:00:03", "net-a");
    let ip3 = wait_for("vm3 allocated", Duration::from_secs(60), || {
        fleet.allocated().get("02:12:34:00:00:03").cloned()
    });
    assert_ne!(
        ip3, ip1,
        "a restarted controller still withholds the squatted address"
    );
    let pool = fleet.kubectl_json(&["-n", NS, "get", "ippool", "pool-a"]);
    assert_eq!(
        pool["status"]["ipv4"]["conflicts"][&ip1]["answeredBy"],
        SQUATTER_MAC
    );

    // The squatter leaves: the agent's next probe of the recorded address finds it free and
    // the controller clears it.
    fleet
        .lab
        .exec(
            &squatter,
            "ip",
            &["addr", "del", &format!("{ip1}/24"), "dev", "eth0"],
        )
        .unwrap();
    let left = std::time::Instant::now();
    wait_for("the conflict cleared", Duration::from_secs(120), || {
        let pool = fleet.kubectl_json(&["-n", NS, "get", "ippool", "pool-a"]);
        pool["status"]["ipv4"]["conflicts"]
            .get(&ip1)
            .is_none()
            .then_some(())
    });
    eprintln!(
        "squatter gone: conflict on {ip1} cleared {:.1} s later",
        left.elapsed().as_secs_f64()
    );
    assert!(
        events(&fleet, "ConflictCleared")
            .iter()
            .any(|(k, m)| k == "IPPool" && m.contains(&ip1))
    );
    assert_eq!(fleet.allocated()[VM2_MAC], ip2);
}

/// The IPv6 side of the rule above. A host nobody manages already uses vm1's IPv6 address:
/// dhclient -6, with duplicate address detection on as a VM runs it, binds the address, its DAD
/// fails and it DECLINEs. The leader's Neighbor Solicitation finds the squatter too and reports
/// it; the controller records the conflict in `status.ipv6.conflicts`, moves vm1's IPv6
/// address (its IPv4 one stays) and says why; the client's next SOLICIT binds the new address.
/// Once the squatter leaves, the agent's recheck finds the address free and the controller
/// clears the conflict.
#[test]
fn a_squatted_ipv6_address_a_vm_declines_is_recorded_the_vm_moves_and_it_clears_once_gone() {
    let mut fleet = setup_with(Options {
        ipv6_lease_seconds: Some(LEASE6),
        ..Options::default()
    });
    let ip1 = fleet.allocated()[VM1_MAC].clone();
    let squatted = fleet.allocated6()[VM1_MAC].clone();
    let ns0 = fleet.agent_netns(0);
    let a0 = fleet.start_agent(&ns0, "agent-0");
    fleet.leader(&[&a0]);

    const SQUATTER_MAC: &str = "02:12:34:00:00:98";
    let squatter = fleet.vm("squat6", SQUATTER_MAC);
    let squat = |fleet: &Fleet, verb: &str| {
        let address = format!("{squatted}/112");
        let mut args = vec!["-6", "addr", verb, address.as_str(), "dev", "eth0"];
        if verb == "add" {
            args.push("nodad");
        }
        fleet.lab.exec(&squatter, "ip", &args).unwrap();
    };
    squat(&fleet, "add");
    // DAD on, as in a VM: its link-local address must pass it before DHCPv6 starts.
    let vm1 = fleet.vm("vm1", VM1_MAC);
    wait_link_local(&fleet.lab, &vm1, "eth0", Duration::from_secs(10));
    let started = Instant::now();
    let client = Client6::dhclient(
        &vm1,
        "eth0",
        Options6 {
            dad_wait_seconds: Some(3),
            ..Options6::default()
        },
    );
    let first = client.wait_event("BOUND6", 0, Duration::from_secs(30));
    assert_eq!(first.get("new_ip6_address"), Some(&squatted), "{first:?}");
    assert_eq!(first.get("dad_result").map(String::as_str), Some("failed"));

    // A SOLICIT sent before the agent's check of the DECLINE ends is offered the squatted
    // address once more; the client's DAD fails again and its second DECLINE finds the address
    // withheld. Never more than that.
    let mut moved = client.wait_lease("BOUND6", 1, Duration::from_secs(90));
    if moved.address.to_string() == squatted {
        eprintln!("vm1 solicited before the check ended: offered {squatted} once more");
        moved = client.wait_lease("BOUND6", 2, Duration::from_secs(90));
    }
    eprintln!(
        "squatted {squatted}: vm1 bound to {} {:.1} s after dhclient -6 started",
        moved.address,
        started.elapsed().as_secs_f64()
    );
    assert_ne!(moved.address.to_string(), squatted, "{}", client.log());
    assert_eq!(fleet.allocated6()[VM1_MAC], moved.address.to_string());
    assert_eq!(fleet.allocated()[VM1_MAC], ip1, "vm1's IPv4 address stays");
    assert!(
        client.log().contains("XMT: Forming Decline"),
        "{}",
        client.log()
    );

    let pool = fleet.kubectl_json(&["-n", NS, "get", "ippool", "pool-a"]);
    let conflict = &pool["status"]["ipv6"]["conflicts"][&squatted];
    assert_eq!(conflict["answeredBy"], SQUATTER_MAC, "{pool}");
    assert_eq!(conflict["macAddress"], VM1_MAC, "{pool}");
    assert_eq!(conflict["source"], "Decline", "{pool}");
    assert!(
        pool["status"]["ipv4"]["conflicts"].is_null(),
        "nothing recorded for IPv4: {pool}"
    );
    let said = wait_for("AddressConflict events", Duration::from_secs(20), || {
        let said = events(&fleet, "AddressConflict");
        said.iter()
            .any(|(k, m)| {
                k == "IPPool" && m.contains(&squatted) && m.contains("Neighbor Solicitation")
            })
            .then_some(said)
    });
    assert!(
        said.iter().any(|(_, m)| m.contains(SQUATTER_MAC)),
        "{said:?}"
    );

    // The squatter leaves: the recheck finds the address free and the conflict is cleared.
    squat(&fleet, "del");
    let left = Instant::now();
    wait_for(
        "the IPv6 conflict cleared",
        Duration::from_secs(120),
        || {
            let pool = fleet.kubectl_json(&["-n", NS, "get", "ippool", "pool-a"]);
            pool["status"]["ipv6"]["conflicts"]
                .get(&squatted)
                .is_none()
                .then_some(())
        },
    );
    eprintln!(
        "squatter gone: conflict on {squatted} cleared {:.1} s later",
        left.elapsed().as_secs_f64()
    );
    assert!(
        events(&fleet, "ConflictCleared")
            .iter()
            .any(|(k, m)| k == "IPPool" && m.contains(&squatted))
    );
    drop(a0);
}

/// Issue 37: another host sends DECLINEs in a running VM's name and floods the leader with
/// unicast ARP replies for the VM's address. The VM answers the leader's probes for its own
/// address, so each DECLINE is found forged: no conflict reaches the controller, the VM keeps
/// every renewal, and its allocation does not move.
#[test]
fn forged_declines_with_an_arp_flood_do_not_move_a_running_vm() {
    let mut fleet = setup();
    let ip1 = fleet.allocated()[VM1_MAC].clone();
    let ns0 = fleet.agent_netns(0);
    let a0 = fleet.start_agent(&ns0, "agent-0");
    fleet.leader(&[&a0]);
    let vm1 = fleet.vm("vm1", VM1_MAC);
    const FORGER_MAC: &str = "02:12:34:00:00:ee";
    let forger = fleet.vm("forger", FORGER_MAC);
    let pcap = fleet.dir.path().join("vm1.pcap");
    capture_dhcp(&mut fleet.lab, &vm1, &pcap, false);
    let dir1 = fleet.dir.path().join("vm1");
    fs::create_dir_all(&dir1).unwrap();
    start_dhclient(&mut fleet.lab, &vm1, &dir1);
    let bound = wait_event(&dir1, "BOUND", 0, Duration::from_secs(30));
    assert_eq!(bound["new_ip_address"], ip1);

    // What the controller holds of vm1: (its config's address, the pool's conflicts).
    let recorded = |fleet: &vmdhcp_integration::fleet::Fleet| {
        let cfg = fleet.kubectl_json(&["-n", NS, "get", "vmnetcfg", "vm1"]);
        let pool = fleet.kubectl_json(&["-n", NS, "get", "ippool", "pool-a"]);
        (
            cfg["status"]["networkConfigs"][0]["allocatedIPAddress"].clone(),
            pool["status"]["ipv4"]["conflicts"].clone(),
        )
    };
    let before = recorded(&fleet);
    assert_eq!(before.0, ip1.as_str(), "{before:?}");

    // The pool's leases renew every half lease time: the attack outlasts one renewal.
    let forgery = Forgery {
        duration: Duration::from_secs(15),
        ..Forgery::against(
            mac_bytes(VM1_MAC),
            ip1.parse().unwrap(),
            SERVER_IP.parse().unwrap(),
            mac_bytes(&fleet.mac_of(&ns0, &fleet.interface)),
            mac_bytes(FORGER_MAC),
        )
    };
    let from = now_unix();
    let mut attacker = forge(&forger, &forgery);
    let mut changed = Vec::new();
    while attacker.running() {
        changed.extend(Some(recorded(&fleet)).filter(|now| *now != before));
    }
    let sent = attacker.finish();
    // Until the VM's next renewal after the attack, which counts too: reports (every 2 s) keep
    // reaching the controller meanwhile.
    let (ended, during) = (
        now_unix(),
        vmdhcp_integration::dhcp_client::events(&dir1).len(),
    );
    wait_for(
        "a renewal after the attack",
        Duration::from_secs(30),
        || {
            changed.extend(Some(recorded(&fleet)).filter(|now| *now != before));
            leased_after(&dir1, during).then_some(())
        },
    );
    let cost = settled_cost(&pcap, mac_bytes(VM1_MAC), from, ended);
    let m = fleet.agent_metrics(&a0);
    let verdict = |v: &str| {
        let labels = format!("interface=\"{}\",pool=\"{NS}/pool-a\"", fleet.interface);
        metric(
            &m,
            &format!("vmdhcp_agent_declines_total{{{labels},verdict=\"{v}\"}}"),
        )
    };
    eprintln!(
        "forger sent {} DECLINEs and {} ARP replies in {:?}; vm1: {cost}; verdicts \
         holder_answers {:?}, conflict {:?}; controller's record changed: {changed:?}; vm1's \
         DHCP messages: {:?}",
        sent[0],
        sent[1],
        forgery.duration,
        verdict("holder_answers"),
        verdict("conflict"),
        transcript(&pcap, mac_bytes(VM1_MAC), from)
    );
    assert!(changed.is_empty(), "vm1's record moved: {changed:?}");
    assert!(verdict("holder_answers").is_some_and(|n| n >= 1.0), "{m}");
    assert_eq!(verdict("conflict"), Some(0.0), "{m}");
    assert_eq!(fleet.allocated()[VM1_MAC], ip1);
    assert!(
        recorded(&fleet).1.as_object().is_none_or(|c| c.is_empty()),
        "{:?}",
        recorded(&fleet)
    );
    assert!(cost.attempts >= 1, "vm1 did not renew during the attack");
    assert_eq!(
        cost.lost,
        0,
        "vm1 lost exchanges: {cost}; its DHCP messages:\n{}",
        transcript(&pcap, mac_bytes(VM1_MAC), from).join("\n")
    );
}

/// The (involved object's kind, message) of every event in [`NS`] with `reason`.
fn events(fleet: &vmdhcp_integration::fleet::Fleet, reason: &str) -> Vec<(String, String)> {
    let events = fleet.kubectl_json(&["-n", NS, "get", "events"]);
    events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"] == reason)
        .map(|e| {
            let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
            (text(&e["involvedObject"]["kind"]), text(&e["message"]))
        })
        .collect()
}

/// The third VM of [`image_clients_get_the_pool_s_options_and_renew_across_a_crash_and_a_graceful_failover`].
const VM3_MAC: &str = "02:12:34:00:00:03";

/// The image clients of [`image_clients_get_the_pool_s_options_and_renew_across_a_crash_and_a_graceful_failover`]
/// and their addresses: systemd-networkd on vm1, udhcpc on vm2 (its events' directory),
/// NetworkManager on vm3.
struct ImageClients {
    networkd: Networkd,
    udhcpc: std::path::PathBuf,
    nm: NetworkManager,
    ips: [String; 3],
}

/// What the image clients had done at one instant: ACKs taken and DISCOVERs sent by networkd and
/// NetworkManager, udhcpc's events.
struct Seen {
    acks: [usize; 2],
    discovers: [usize; 2],
    udhcpc_events: usize,
}

impl ImageClients {
    fn seen(&self) -> Seen {
        let networkd_discovers = self
            .networkd
            .log()
            .matches("DHCPv4 client: DISCOVER")
            .count();
        Seen {
            acks: [self.networkd.acks(), self.nm.acks()],
            discovers: [networkd_discovers, self.nm.discovers()],
            udhcpc_events: vmdhcp_integration::dhcp_client::events(&self.udhcpc).len(),
        }
    }

    /// Waits until each client renewed after `since` (networkd and NetworkManager took another
    /// ACK, udhcpc ran its `renew` event) and checks that none started over (no DISCOVER, no
    /// `deconfig`) and each kept its address.
    fn renewed_keeping_their_addresses(&self, since: &Seen, what: &str) {
        let [ip1, ip2, ip3] = &self.ips;
        wait_for(
            &format!("systemd-networkd's and NetworkManager's renewals {what}"),
            Duration::from_secs(40),
            || {
                let now = self.seen();
                (now.acks[0] > since.acks[0] && now.acks[1] > since.acks[1]).then_some(())
            },
        );
        let now = self.seen();
        assert_eq!(
            now.discovers,
            since.discovers,
            "systemd-networkd or NetworkManager started over {what}:\n{}\n{}",
            self.networkd.log(),
            self.nm.log()
        );
        assert_eq!(&self.networkd.lease()["ADDRESS"], ip1, "{what}");
        assert_eq!(&self.nm.lease()["ip_address"], ip3, "{what}");
        let (event, env) = wait_for(
            &format!("udhcpc's renewal {what}"),
            Duration::from_secs(40),
            || {
                vmdhcp_integration::dhcp_client::events(&self.udhcpc)
                    .into_iter()
                    .skip(since.udhcpc_events)
                    .find(|(e, _)| e == "renew" || e == "deconfig" || e == "bound")
            },
        );
        assert_eq!(event, "renew", "udhcpc {what}: {env:?}");
        assert_eq!(&env["ip"], ip2, "{what}");
    }
}

/// Issue #52 point 5: the clients cloud images run, beside dhclient and dhcpcd, through the
/// controller and two agents: systemd-networkd (vm1, Debian's 252), busybox udhcpc (vm2, as
/// cirros runs it) and NetworkManager's internal client (vm3, Debian's 1.42) each get their
/// reservation with the pool's router, DNS, domain, MTU, classless route and host name, and keep
/// renewing it across a crash (kill -9) and a graceful (SIGTERM) failover of the leading agent,
/// without starting over.
#[test]
fn image_clients_get_the_pool_s_options_and_renew_across_a_crash_and_a_graceful_failover() {
    let mut fleet = setup();
    let mut pool = vmdhcp_integration::fleet::pool_a(None);
    let v4 = &mut pool["spec"]["ipv4Config"];
    v4["mtu"] = 1400.into();
    v4["routes"] = serde_json::json!([{"destination": "10.96.0.0/12", "gateway": "10.123.45.1"}]);
    v4["sendHostName"] = true.into();
    fleet.apply(&pool);
    fleet.apply_vm("vm3", VM3_MAC, "net-a");
    let allocated = wait_for("vm3 allocated", Duration::from_secs(30), || {
        let a = fleet.allocated();
        a.contains_key(VM3_MAC).then_some(a)
    });
    let ips = [VM1_MAC, VM2_MAC, VM3_MAC].map(|m| allocated[m].clone());
    let ns0 = fleet.agent_netns(0);
    let ns1 = fleet.agent_netns(1);
    let a0 = fleet.start_agent(&ns0, "agent-0");
    let a1 = fleet.start_agent(&ns1, "agent-1");
    let leader = fleet.leader(&[&a0, &a1]).identity.clone();
    let (first, second) = if leader == a0.identity {
        (a0, a1)
    } else {
        (a1, a0)
    };

    let dir = |name: &str| {
        let d = fleet.dir.path().join(name);
        fs::create_dir_all(&d).unwrap();
        d
    };
    let (dir1, dir2, dir3) = (dir("vm1-networkd"), dir("vm2-udhcpc"), dir("vm3-nm"));
    let vm1 = fleet.vm("vm1", VM1_MAC);
    let networkd = Networkd::start(&mut fleet.lab, &vm1, &dir1);
    let vm2 = fleet.vm("vm2", VM2_MAC);
    start_udhcpc(&mut fleet.lab, &vm2, &dir2);
    let vm3 = fleet.vm("vm3", VM3_MAC);
    let nm = NetworkManager::start(&mut fleet.lab, &vm3, &dir3);
    let clients = ImageClients {
        networkd,
        udhcpc: dir2.clone(),
        nm,
        ips: ips.clone(),
    };
    let [ip1, ip2, ip3] = &ips;

    // What each applied to its link: address, default route, classless route, MTU.
    for (vm, ip) in [(&vm1, ip1), (&vm3, ip3)] {
        let run = |args: &[&str]| fleet.lab.exec(vm, "ip", args).unwrap_or_default();
        let routes = wait_for(
            "the classless route applied",
            Duration::from_secs(30),
            || {
                let r = run(&["-4", "route", "show", "dev", "eth0"]);
                r.contains("10.96.0.0/12 via 10.123.45.1").then_some(r)
            },
        );
        assert!(routes.contains("default via 10.123.45.1"), "{routes}");
        assert!(run(&["-4", "addr", "show", "eth0"]).contains(&format!("{ip}/24")));
        let link = wait_for("MTU 1400", Duration::from_secs(10), || {
            let l = run(&["link", "show", "eth0"]);
            l.contains("mtu 1400 ").then_some(l)
        });
        assert!(link.contains("mtu 1400 "));
    }

    // systemd-networkd: the lease it saved.
    let lease = clients.networkd.lease();
    assert_eq!(&lease["ADDRESS"], ip1, "{lease:?}");
    assert_eq!(lease["NETMASK"], "255.255.255.0", "{lease:?}");
    assert_eq!(lease["ROUTER"], "10.123.45.1", "{lease:?}");
    assert_eq!(lease["DNS"], "10.123.45.53", "{lease:?}");
    assert_eq!(lease["DOMAINNAME"], "fleet.test", "{lease:?}");
    assert_eq!(lease["HOSTNAME"], "vm1", "{lease:?}");
    assert_eq!(lease["MTU"], "1400", "{lease:?}");
    assert_eq!(lease["SERVER_ADDRESS"], SERVER_IP, "{lease:?}");

    // udhcpc: what it hands its script (cirros' applies each).
    let bound = wait_event(&dir2, "bound", 0, Duration::from_secs(30));
    assert_eq!(&bound["ip"], ip2, "{bound:?}");
    assert_eq!(bound["subnet"], "255.255.255.0", "{bound:?}");
    assert_eq!(bound["router"].trim(), "10.123.45.1", "{bound:?}");
    assert_eq!(bound["dns"].trim(), "10.123.45.53", "{bound:?}");
    assert_eq!(bound["domain"], "fleet.test", "{bound:?}");
    assert_eq!(bound["hostname"], "vm2", "{bound:?}");
    assert_eq!(bound["mtu"], "1400", "{bound:?}");
    assert_eq!(
        bound["staticroutes"], "0.0.0.0/0 10.123.45.1 10.96.0.0/12 10.123.45.1",
        "{bound:?}"
    );
    assert_eq!(bound["serverid"], SERVER_IP, "{bound:?}");

    // NetworkManager: the lease it took, and the host name it set from it.
    let lease = clients.nm.lease();
    assert_eq!(&lease["ip_address"], ip3, "{lease:?}");
    assert_eq!(lease["routers"], "10.123.45.1", "{lease:?}");
    assert_eq!(lease["domain_name_servers"], "10.123.45.53", "{lease:?}");
    assert_eq!(lease["domain_name"], "fleet.test", "{lease:?}");
    assert_eq!(lease["host_name"], "vm3", "{lease:?}");
    assert_eq!(lease["interface_mtu"], "1400", "{lease:?}");
    assert_eq!(
        lease["rfc3442_classless_static_routes"], "0.0.0.0/0 10.123.45.1 10.96.0.0/12 10.123.45.1",
        "{lease:?}"
    );
    wait_for(
        "NetworkManager's host name from the lease",
        Duration::from_secs(10),
        || (clients.nm.host_name().as_deref() == Some("vm3")).then_some(()),
    );

    // All renew with the leader, then it is killed: all renew with the standby that takes over,
    // without starting over.
    clients.renewed_keeping_their_addresses(&clients.seen(), "with the first leader");
    let before = clients.seen();
    assert!(first.process.signal("KILL"));
    assert_eq!(fleet.leader(&[&second]).identity, second.identity);
    clients.renewed_keeping_their_addresses(&before, "after kill -9 of the leader");

    // The killed replica comes back as a standby; the leader is stopped gracefully.
    let restarted = fleet.restart_as_standby(first);
    let before = clients.seen();
    assert!(second.process.signal("TERM"));
    assert_eq!(fleet.leader(&[&restarted]).identity, restarted.identity);
    clients.renewed_keeping_their_addresses(&before, "after SIGTERM to the leader");
    let allocated = fleet.allocated();
    assert_eq!(
        [VM1_MAC, VM2_MAC, VM3_MAC].map(|m| allocated[m].clone()),
        ips
    );
}
