//! The agent's DHCPv6 server against real clients: `vm-dhcp-agent serve-static` with a
//! dual-stack pool in a server namespace, ISC `dhclient -6` and `dhcpcd` in VM namespaces joined
//! to it by veth pairs ([`vmdhcp_integration::dhcp6_client`]).
//!
//! Covered: the reservation with its lifetimes, DNS and the pool's server DUID; RENEW; RELEASE;
//! Rapid Commit; INFORMATION-REQUEST; an unknown client gets nothing; REBIND answered after the
//! server that bound the client is gone (another DUID now serves the link); CONFIRM after a move
//! to another link (NotOnLink, then the new link's reservation); the pool's Router
//! Advertisements make dhcpcd go stateful and put the prefix on-link; `radvd` standing for the
//! network's router does the same with the agent sending none; a DECLINE, hand-built and from
//! dhcpcd whose own duplicate address detection found another host on its address, withheld
//! only once the agent's Neighbor Solicitation finds that host too.
//!
//! Addresses are TEST-NET and ULA prefixes that exist only in the namespaces each test creates;
//! every wait has a deadline.
#![allow(clippy::unwrap_used, clippy::panic, clippy::print_stderr)]

use std::net::Ipv6Addr;
use std::time::Duration;

use serde_json::{Value, json};
use vmdhcp_core::NamespacedName;
use vmdhcp_core::pool::duid::server_duid;
use vmdhcp_integration::dhcp_client::wait_for;
use vmdhcp_integration::dhcp6_client::{
    Client6, Options6, Radvd, RadvdConfig, hex_id, no_dad, set_mac, wait_link_local,
};
use vmdhcp_integration::netns::Netns;
use vmdhcp_integration::static_agent::{Bridged, MAC_1, Rig, pool, rig};

/// The VM's NIC.
const MAC: &str = "02:00:00:00:01:0a";
/// The other host on the bridged network ([`vmdhcp_integration::static_agent::EVIL_MAC`]).
const EVIL: &str = "02:00:00:00:0e:0e";
/// A NIC without a reservation.
const STRANGER: &str = "02:00:00:00:ff:ff";
/// The pool's IPv6 subnet, a ULA that exists only in the lab.
const SUBNET: &str = "fd76:6d64:6863::/112";
/// The lease time: T1 5 s, T2 8 s.
const LEASE: u32 = 10;
const BIND: Duration = Duration::from_secs(20);

fn reserved() -> Ipv6Addr {
    "fd76:6d64:6863::10".parse().unwrap()
}

/// A dual-stack pool `default/<name>` on `srv0`: 192.0.2.0/24 and `subnet`, the server at `::1`,
/// DNS at `::53`, [`MAC`]'s reservation at `::10` (and .10); `ra` sends Router Advertisements.
fn dual(name: &str, subnet: &str, ra: bool) -> Value {
    dual_leasing(name, subnet, ra, LEASE)
}

/// [`dual`] with a lease time of `lease` seconds.
fn dual_leasing(name: &str, subnet: &str, ra: bool, lease: u32) -> Value {
    let base: Ipv6Addr = subnet.split('/').next().unwrap().parse().unwrap();
    let at = |n: u16| {
        let mut s = base.segments();
        s[7] = n;
        Ipv6Addr::from(s).to_string()
    };
    let mut p = pool(
        name,
        "srv0",
        "192.0.2.1",
        "192.0.2.0/24",
        json!({"domain_search": ["vms.example.test"], "ipv6": {
            "server_ip": at(1), "subnet": subnet, "dns": [at(0x53)], "lease_seconds": lease,
            "router_advertisements": ra,
        }}),
    );
    p["leases"] = json!([{"mac": MAC, "ip": "192.0.2.10", "ipv6": at(0x10)}]);
    p
}

/// The server namespace and one VM namespace (`eth0`, `mac`), duplicate address detection off
/// in both so that link-local addresses are usable at once; the agent serving `pools`.
fn lab(mac: &str, pools: &[Value]) -> (Rig, Netns) {
    let mut rig = rig();
    no_dad(&rig.lab, &rig.srv);
    let vm = rig.lab.netns("vm").unwrap();
    no_dad(&rig.lab, &vm);
    rig.lab.veth(&rig.srv, "srv0", &vm, "eth0").unwrap();
    set_mac(&rig.lab, &vm, "eth0", mac);
    wait_link_local(&rig.lab, &vm, "eth0", Duration::from_secs(5));
    rig.start_with(pools, &["--configure-interfaces"]);
    rig.wait_serving(&["srv0"]);
    wait_for("the DHCPv6 server", Duration::from_secs(10), || {
        rig.agent_log().contains("DHCPv6 serving").then_some(())
    });
    (rig, vm)
}

/// Runs `f`; if it fails, prints the agent's log first (the client's is in the failure).
fn showing_agent_log<T>(rig: &Rig, f: impl FnOnce() -> T) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(value) => value,
        Err(panic) => {
            eprintln!("agent log:\n{}", rig.agent_log());
            std::panic::resume_unwind(panic)
        }
    }
}

fn duid_of(pool: &str) -> String {
    let pool: NamespacedName = pool.parse().unwrap();
    hex_id(
        &server_duid(&pool)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":"),
    )
}

#[test]
fn both_clients_get_the_reservation_with_its_lifetimes_renew_and_release() {
    for kind in ["dhclient", "dhcpcd"] {
        let (rig, vm) = lab(MAC, &[dual("p6", SUBNET, false)]);
        let mut c = match kind {
            "dhclient" => Client6::dhclient(&vm, "eth0", Options6::default()),
            _ => Client6::dhcpcd(&vm, "eth0", Options6::default()),
        };
        let env = c.wait_event("BOUND6", 0, BIND);
        let bound = vmdhcp_integration::dhcp6_client::Lease6::from_event(&env).unwrap();
        assert_eq!(bound.address, reserved(), "{kind}");
        // The pool's search list (set on its IPv4 side, good for both families): option 24.
        let search = env
            .get("new_dhcp6_domain_search")
            .map(|s| s.trim_end_matches('.').to_owned());
        assert_eq!(
            search.as_deref(),
            Some("vms.example.test"),
            "{kind}: {env:?}"
        );
        assert_eq!(
            (bound.t1, bound.t2, bound.preferred, bound.valid),
            (5, 8, LEASE, LEASE),
            "{kind}"
        );
        assert_eq!(bound.server_id, duid_of("default/p6"), "{kind}");
        assert_eq!(
            bound.dns,
            ["fd76:6d64:6863::53".parse::<Ipv6Addr>().unwrap()],
            "{kind}"
        );
        // RENEW at T1, answered with the same address.
        let renewed = c.wait_lease("RENEW6", 0, Duration::from_secs(15));
        assert_eq!(renewed.address, reserved(), "{kind}");
        c.release(Duration::from_secs(10));
        let log = rig.agent_log();
        assert!(!log.contains("DHCPv6 reply not sent"), "{kind}: {log}");
    }
}

#[test]
fn dhcpcd_holding_a_reconfigure_key_is_sent_a_changed_dns_server_at_once() {
    // An hour's lease: T1 is half an hour away, so only a RECONFIGURE brings the change within
    // the wait below.
    let (rig, vm) = lab(MAC, &[dual_leasing("p6", SUBNET, false, 3600)]);
    showing_agent_log(&rig, || {
        let accepting = Options6 {
            reconfigure_accept: true,
            ..Options6::default()
        };
        let c = Client6::dhcpcd(&vm, "eth0", accepting);
        let bound = c.wait_lease("BOUND6", 0, BIND);
        assert_eq!(bound.address, reserved());
        assert_eq!(
            bound.dns,
            ["fd76:6d64:6863::53".parse::<Ipv6Addr>().unwrap()]
        );
        assert!(
            c.log().contains("accepted reconfigure key"),
            "dhcpcd sent Reconfigure Accept and took the key from its REPLY:\n{}",
            c.log()
        );

        let mut changed = dual_leasing("p6", SUBNET, false, 3600);
        changed["config"]["ipv6"]["dns"] = json!(["fd76:6d64:6863::99"]);
        rig.reload(&[changed]);
        let renewed = c.wait_lease("RENEW6", 0, Duration::from_secs(20));
        assert_eq!(renewed.address, reserved());
        assert_eq!(
            renewed.dns,
            ["fd76:6d64:6863::99".parse::<Ipv6Addr>().unwrap()]
        );
        // dhcpcd checked the RECONFIGURE's HMAC with its key before renewing.
        let log = c.log();
        assert!(log.contains("RECONFIGURE6 from"), "{log}");
        assert!(!log.contains("unauthenticated"), "{log}");
        assert!(!log.contains("authentication failed"), "{log}");
        assert!(rig.agent_log().contains("RECONFIGURE sent"));
    });
}

#[test]
fn rapid_commit_binds_in_two_messages_and_information_requests_get_the_options() {
    let (_rig, vm) = lab(MAC, &[dual("p6", SUBNET, false)]);
    let rapid = Options6 {
        rapid_commit: true,
        ..Options6::default()
    };
    let c = Client6::dhclient(&vm, "eth0", rapid);
    assert_eq!(c.wait_lease("BOUND6", 0, BIND).address, reserved());
    let log = c.log();
    assert!(
        !log.contains("XMT: Forming Request"),
        "no REQUEST after a rapid commit: {log}"
    );
    drop(c);
    let info = Options6 {
        information_only: true,
        ..Options6::default()
    };
    let c = Client6::dhclient(&vm, "eth0", info);
    // dhclient hands an INFORMATION-REQUEST's reply to its hook as RENEW6, without an address.
    let env = c.wait_event("RENEW6", 0, BIND);
    assert_eq!(
        env.get("new_dhcp6_name_servers").map(String::as_str),
        Some("fd76:6d64:6863::53"),
        "{env:?}"
    );
    assert!(!env.contains_key("new_ip6_address"), "{env:?}");
}

#[test]
fn a_booting_client_gets_the_pool_s_boot_file_url_and_parameters() {
    let mut pool = dual("p6", SUBNET, false);
    pool["config"]["ipv6"]["boot"] = json!({
        "uefi_file_url": "tftp://[fd76:6d64:6863::5]/ipxe.efi",
        "parameters": ["console=ttyS0"],
    });
    let (rig, vm) = lab(MAC, &[pool]);
    let request = "request dhcp6.name-servers, dhcp6.bootfile-url, dhcp6.bootfile-param;\n";
    let booting = Options6 {
        // UEFI x64 PXE (RFC 5970's option 61), as firmware says it.
        dhclient_conf: format!("send dhcp6.client-arch-type 7;\n{request}"),
        ..Options6::default()
    };
    let env = showing_agent_log(&rig, || {
        let c = Client6::dhclient(&vm, "eth0", booting);
        assert_eq!(c.wait_lease("BOUND6", 0, BIND).address, reserved());
        c.wait_event("BOUND6", 0, BIND)
    });
    let get = |key: &str| env.get(key).cloned().unwrap_or_default();
    assert_eq!(
        get("new_dhcp6_bootfile_url"),
        "tftp://[fd76:6d64:6863::5]/ipxe.efi",
        "{env:?}"
    );
    // RFC 5970's layout, as dhclient prints bytes: a 16-bit length, then the parameter.
    let param = b"\x00\x0dconsole=ttyS0".iter().map(|b| format!("{b:x}"));
    assert_eq!(
        get("new_dhcp6_bootfile_param"),
        param.collect::<Vec<_>>().join(":")
    );
    // A client that says no architecture is an operating system's: no boot file.
    let os = Options6 {
        dhclient_conf: request.to_owned(),
        ..Options6::default()
    };
    let c = Client6::dhclient(&vm, "eth0", os);
    let env = c.wait_event("BOUND6", 0, BIND);
    assert!(!env.contains_key("new_dhcp6_bootfile_url"), "{env:?}");
}

#[test]
fn an_unknown_client_gets_no_address() {
    let (rig, vm) = lab(STRANGER, &[dual("p6", SUBNET, false)]);
    let c = Client6::dhclient(&vm, "eth0", Options6::default());
    // Three SOLICITs seen, none answered.
    wait_for("three SOLICITs", BIND, || {
        (c.log().matches("XMT: Solicit").count() >= 3).then_some(())
    });
    assert!(
        !c.event_names().iter().any(|e| e == "BOUND6"),
        "{}",
        c.log()
    );
    let log = rig.agent_log();
    assert!(log.contains("unknown_client"), "{log}");
}

#[test]
fn rebind_is_answered_after_the_server_that_bound_the_client_is_gone() {
    // dhclient sends one RENEW at T1 and looks again only when its retransmission timer fires
    // (about 10 s later), whatever T2 says: so its REBIND comes near T1 + 10 s, and the lease
    // must outlive that by a margin. 40 s: T1 20 s, REBIND near 30 s, expiry at 40 s.
    let (rig, vm) = lab(MAC, &[dual_leasing("p6", SUBNET, false, 40)]);
    let c = Client6::dhclient(&vm, "eth0", Options6::default());
    assert_eq!(
        c.wait_lease("BOUND6", 0, BIND).server_id,
        duid_of("default/p6")
    );
    // Another pool (another DUID) serves the link now: the client's RENEWs name the old
    // server and go unanswered, its REBIND names none and is answered.
    rig.reload(&[dual_leasing("p6-moved", SUBNET, false, 40)]);
    let rebound = showing_agent_log(&rig, || c.wait_lease("REBIND6", 0, Duration::from_secs(45)));
    assert_eq!(rebound.address, reserved());
    assert_eq!(rebound.server_id, duid_of("default/p6-moved"));
    assert!(rig.agent_log().contains("other_server"));
}

#[test]
fn confirm_after_a_move_to_another_link_says_not_on_link_and_the_new_reservation_follows() {
    let (rig, vm) = lab(MAC, &[dual("p6", SUBNET, false)]);
    let mut c = Client6::dhclient(&vm, "eth0", Options6::default());
    assert_eq!(c.wait_lease("BOUND6", 0, BIND).address, reserved());
    // The VM now sits on another network (another pool, another prefix) and restarts: it
    // CONFIRMs its old address, hears NotOnLink, and solicits the new one.
    c.stop();
    rig.reload(&[dual("other", "fd76:6d64:6864::/112", false)]);
    c.restart();
    let moved: Ipv6Addr = "fd76:6d64:6864::10".parse().unwrap();
    wait_for("the address of the new link", BIND, || {
        c.events()
            .iter()
            .filter_map(|(_, env)| vmdhcp_integration::dhcp6_client::Lease6::from_event(env))
            .any(|l| l.address == moved)
            .then_some(())
    });
    let log = c.log();
    assert!(log.contains("Confirm"), "{log}");
}

#[test]
fn the_pool_s_router_advertisements_make_dhcpcd_stateful_and_the_prefix_on_link() {
    let (rig, vm) = lab(MAC, &[dual("p6", SUBNET, true)]);
    let waits = Options6 {
        wait_for_ra: true,
        ..Options6::default()
    };
    let c = Client6::dhcpcd(&vm, "eth0", waits);
    assert_eq!(c.wait_lease("BOUND6", 0, BIND).address, reserved());
    let routes = rig.lab.exec(&vm, "ip", &["-6", "route"]).unwrap();
    assert!(routes.contains("fd76:6d64:6863::/112"), "{routes}");
    assert!(
        !routes.contains("default"),
        "the agent is no router: {routes}"
    );
    assert!(rig.agent_log().contains("sending router advertisements"));
}

#[test]
fn with_radvd_standing_for_the_network_s_router_the_agent_sends_no_advertisement() {
    let (rig, vm) = lab(MAC, &[dual("p6", SUBNET, false)]);
    let _radvd = Radvd::start(
        &rig.srv,
        &RadvdConfig::managed("srv0", "fd76:6d64:6863::/64"),
    );
    let waits = Options6 {
        wait_for_ra: true,
        ..Options6::default()
    };
    let c = Client6::dhcpcd(&vm, "eth0", waits);
    assert_eq!(c.wait_lease("BOUND6", 0, BIND).address, reserved());
    assert!(!rig.agent_log().contains("sending router advertisements"));
}

/// A DHCPv6 DECLINE of `addr` by a client with a DUID-EN, to the pool `pool`'s server, encoded
/// by hand (type 9, transaction id, Client Identifier, Server Identifier, IA_NA with the address).
fn decline(pool: &str, addr: Ipv6Addr) -> Vec<u8> {
    let option = |code: u16, value: &[u8]| {
        let mut o = code.to_be_bytes().to_vec();
        o.extend_from_slice(&u16::try_from(value.len()).unwrap().to_be_bytes());
        o.extend_from_slice(value);
        o
    };
    let pool: NamespacedName = pool.parse().unwrap();
    let mut ia_addr = addr.octets().to_vec();
    ia_addr.extend_from_slice(&[0; 8]);
    let mut ia_na = vec![0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0];
    ia_na.extend(option(5, &ia_addr));
    let mut msg = vec![9, 0x12, 0x34, 0x56];
    msg.extend(option(1, &[0, 2, 0, 0, 0xab, 0xcd, 1, 2, 3, 4]));
    msg.extend(option(2, &server_duid(&pool)));
    msg.extend(option(3, &ia_na));
    msg
}

/// Sends `payload` to ff02::1:2 port 547 on `vm`'s eth0 (from an ephemeral port).
fn send_to_servers(rig: &Rig, vm: &Netns, payload: &[u8]) {
    let hex: String = payload.iter().map(|b| format!("{b:02x}")).collect();
    let script = format!(
        "import socket; s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); \
         s.sendto(bytes.fromhex('{hex}'), ('ff02::1:2', 547, 0, socket.if_nametoindex('eth0')))"
    );
    rig.lab.exec(vm, "python3", &["-c", &script]).unwrap();
}

/// A DECLINE (hand-built, over the real path) costs nothing unless another host answers the
/// agent's Neighbor Solicitation: nobody answering leaves the address served, and neither does
/// the reservation's own client answering (a DECLINE forged in its name, or a stale one). The
/// confirmed case, from a real client, is the next test.
#[test]
fn a_decline_costs_nothing_unless_another_host_answers_the_neighbor_solicitation() {
    let (rig, vm) = lab(MAC, &[dual("p6", SUBNET, false)]);
    // Nobody uses the address: the DECLINE is checked, and the address still served.
    send_to_servers(&rig, &vm, &decline("default/p6", reserved()));
    showing_agent_log(&rig, || {
        wait_for("the unconfirmed decline", Duration::from_secs(10), || {
            rig.agent_log()
                .contains("no host answers every solicitation for it: still served")
                .then_some(())
        })
    });
    let c = Client6::dhclient(&vm, "eth0", Options6::default());
    assert_eq!(c.wait_lease("BOUND6", 0, BIND).address, reserved());
    drop(c);
    // The VM itself uses the address (its interface holds it) and answers the probe: a
    // DECLINE in its name is forged or stale, and withholds nothing.
    rig.lab
        .exec(
            &vm,
            "ip",
            &[
                "-6",
                "addr",
                "replace",
                "fd76:6d64:6863::10/128",
                "dev",
                "eth0",
            ],
        )
        .unwrap();
    send_to_servers(&rig, &vm, &decline("default/p6", reserved()));
    showing_agent_log(&rig, || {
        wait_for("the ignored decline", Duration::from_secs(10), || {
            rig.agent_log()
                .contains("in the name of its own holder, which answers for it")
                .then_some(())
        })
    });
    assert!(!rig.agent_log().contains("another host answers for it"));
    let c = Client6::dhclient(&vm, "eth0", Options6::default());
    assert_eq!(c.wait_lease("BOUND6", 0, BIND).address, reserved());
}

/// dhclient, with duplicate address detection on as a VM runs it, is given its reservation
/// while another host on the bridge already holds that address: its DAD fails, its script says
/// so (exit 3, as ISC's own Linux script does), and it DECLINEs the address. The agent's own
/// Neighbor Solicitation finds the other host too and withholds the address, and the client's
/// next SOLICITs go unanswered instead of binding it again.
///
/// (dhcpcd 9 declines only an address the kernel keeps flagged `dadfailed`; Linux deletes a
/// failed address that has lifetimes, as every leased one does, so dhcpcd never sees it fail.)
#[test]
fn dhclient_declines_an_address_its_dad_finds_taken_and_the_agent_withholds_it_after_probing() {
    assert_eq!(MAC, MAC_1, "the bridged VM holds the reservation");
    let b = Bridged::with_args(&[dual("a", SUBNET, false)], &["--configure-interfaces"]);
    showing_agent_log(&b.rig, || {
        wait_for("the DHCPv6 server", Duration::from_secs(10), || {
            b.rig.agent_log().contains("DHCPv6 serving").then_some(())
        })
    });
    // The squatter holds the address (without DAD of its own: it was there first).
    let squatted = format!("{}/112", reserved());
    b.rig
        .lab
        .exec(
            &b.evil,
            "ip",
            &["-6", "addr", "add", &squatted, "dev", "eth0", "nodad"],
        )
        .unwrap();
    // The VM's link-local address passes DAD (nobody else has it) before dhclient starts.
    wait_link_local(&b.rig.lab, &b.vm, "eth0", Duration::from_secs(10));
    let options = Options6 {
        dad_wait_seconds: Some(3),
        ..Options6::default()
    };
    let c = Client6::dhclient(&b.vm, "eth0", options);
    showing_agent_log(&b.rig, || {
        let bound = c.wait_event("BOUND6", 0, BIND);
        assert_eq!(
            bound.get("dad_result").map(String::as_str),
            Some("failed"),
            "{bound:?}"
        );
        wait_for("dhclient's DECLINE", BIND, || {
            c.log().contains("XMT: Forming Decline").then_some(())
        });
        wait_for(
            "the agent's probe to confirm it",
            Duration::from_secs(10),
            || {
                b.rig
                    .agent_log()
                    .contains("another host answers for it")
                    .then_some(())
            },
        );
        let log = b.rig.agent_log();
        assert!(log.contains(&format!("answered_by={EVIL}")), "{log}");
        let confirmed = r#"vmdhcp_agent_dhcp6_declines_total{interface="srv0",pool="default/a",result="confirmed"} 1"#;
        let metrics = b.metrics();
        assert!(metrics.lines().any(|l| l == confirmed), "{metrics}");
        // Withheld: dhclient solicits again and is not given the address.
        let solicits = |c: &Client6| c.log().matches("XMT: Solicit").count();
        let before = solicits(&c);
        wait_for("two more SOLICITs", BIND, || {
            (solicits(&c) >= before + 2).then_some(())
        });
        let bound = c.event_names().iter().filter(|e| *e == "BOUND6").count();
        assert_eq!(bound, 1, "{}", c.log());
    });
}
