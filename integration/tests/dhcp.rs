//! The agent's DHCP server against real clients (ISC `dhclient`, busybox `udhcpc`) in network
//! namespaces: `vm-dhcp-agent serve-static` runs in a server namespace, clients in VM namespaces
//! joined to it by veth pairs. Addresses are TEST-NET ranges that exist only inside the lab.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fs;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use vmdhcp_integration::dhcp_client::{
    dhclient_lease, events, hook_script, http_get, start_dhclient, start_dhclient_configuring,
    start_dhcpcd, start_dhcpcd_recording, udhcpc, udhcpc_bound, wait_event, wait_for,
    wait_renewal_with,
};
use vmdhcp_integration::netns::Netns;
use vmdhcp_integration::static_agent::{
    Bridged, EVIL_MAC, IP_1, MAC_1, MAC_1_BYTES, PEER_CLIENT_IP, PEER_CLIENT_MAC, ROGUE_IP, Rig,
    SERVER_A, SERVER_B, bootrequest, hex, pool, rig, send_decline, start_peer, start_rogue,
    timed_udhcpc, with_lease,
};

const MAC_2: &str = "02:00:00:00:02:0b";
const IP_2: &str = "198.51.100.11";
const STRANGER: &str = "02:00:00:00:ff:ff";

/// Pool A as most tests serve it: every option set, one lease.
fn pool_a(lease_seconds: u32, dns: &str) -> Value {
    with_lease(
        pool(
            "a",
            "srv0",
            SERVER_A,
            "192.0.2.0/24",
            json!({
                "router": "192.0.2.254",
                "dns": [dns, "192.0.2.54"],
                "domain_name": "example.test",
                "domain_search": ["example.test", "svc.example.test"],
                "ntp": ["192.0.2.123"],
                "lease_seconds": lease_seconds,
            }),
        ),
        MAC_1,
        IP_1,
    )
}

#[test]
fn dhclient_gets_its_reservation_with_exact_options_renews_and_sees_option_changes() {
    let mut rig = rig();
    let vm = rig.vm("vm", "srv0", MAC_1);
    rig.lab.address(&rig.srv, "srv0", "192.0.2.1/24").unwrap();
    // A 6 s lease: T1 = 3 s, so renewals happen within the test.
    rig.start(&[pool_a(6, "192.0.2.53")]);
    rig.wait_serving(&["srv0"]);

    let dir = tempfile::tempdir().unwrap();
    start_dhclient(&mut rig.lab, &vm, dir.path());
    let bound = wait_event(dir.path(), "BOUND", 0, Duration::from_secs(20));
    assert_eq!(bound["new_ip_address"], IP_1);
    assert_eq!(bound["new_subnet_mask"], "255.255.255.0");
    assert_eq!(bound["new_broadcast_address"], "192.0.2.255");
    assert_eq!(bound["new_routers"], "192.0.2.254");
    assert_eq!(bound["new_domain_name_servers"], "192.0.2.53 192.0.2.54");
    assert_eq!(bound["new_domain_name"], "example.test");
    assert_eq!(
        bound["new_domain_search"],
        "example.test. svc.example.test."
    );
    assert_eq!(bound["new_ntp_servers"], "192.0.2.123");
    assert_eq!(bound["new_dhcp_lease_time"], "6");
    assert_eq!(bound["new_dhcp_server_identifier"], SERVER_A);
    assert!(
        !bound.contains_key("new_host_name"),
        "a lease without a name sends none: {bound:?}"
    );

    // The same values, as dhclient recorded them in its lease file.
    let lease = wait_for("the lease file", Duration::from_secs(5), || {
        let l = dhclient_lease(&dir.path().join("dhclient.leases"));
        l.contains_key("fixed-address").then_some(l)
    });
    assert_eq!(lease["fixed-address"], IP_1);
    assert_eq!(lease["subnet-mask"], "255.255.255.0");
    assert_eq!(lease["routers"], "192.0.2.254");
    assert_eq!(lease["domain-name-servers"], "192.0.2.53,192.0.2.54");
    assert_eq!(lease["domain-name"], "\"example.test\"");
    assert_eq!(
        lease["domain-search"],
        "\"example.test.\", \"svc.example.test.\""
    );
    assert_eq!(lease["ntp-servers"], "192.0.2.123");
    assert_eq!(lease["dhcp-lease-time"], "6");
    assert_eq!(lease["dhcp-renewal-time"], "3");
    assert_eq!(lease["dhcp-rebinding-time"], "5");
    assert_eq!(lease["dhcp-server-identifier"], SERVER_A);

    // Renewal (unicast from the bound address, T1 = 3 s) is ACKed with the same address.
    let renew = wait_event(dir.path(), "RENEW", 0, Duration::from_secs(15));
    assert_eq!(renew["new_ip_address"], IP_1);

    // An option change reaches the next renewal without restarting anything.
    let changed = a_dns_change_reaches(&rig, dir.path(), 6);
    assert_eq!(changed["new_ip_address"], IP_1);
    let log = rig.agent_log();
    assert!(!log.contains("panicked"), "{log}");
}

/// Serves [`pool_a`] again with `lease_seconds` and DNS 192.0.2.99, and waits (20 s) for the
/// client recording its events in `dir` to renew with it; returns that renewal's environment.
fn a_dns_change_reaches(
    rig: &Rig,
    dir: &std::path::Path,
    lease_seconds: u32,
) -> BTreeMap<String, String> {
    // Counted first: a FORCERENEW's renewal can follow the reload within milliseconds.
    let seen_before = events(dir).len();
    rig.reload(&[pool_a(lease_seconds, "192.0.2.99")]);
    wait_renewal_with(
        dir,
        seen_before,
        "new_domain_name_servers",
        "192.0.2.99 192.0.2.54",
        Duration::from_secs(20),
    )
}

#[test]
fn dhcpcd_holding_a_reconfigure_key_is_sent_a_changed_dns_server_at_once() {
    // An hour's lease: the client's own renewal is half an hour away, so only a FORCERENEW
    // brings the change within the wait below.
    let (mut rig, vm) = serving(&[pool_a(3600, "192.0.2.53")]);
    let dir = tempfile::tempdir().unwrap();
    start_dhcpcd_recording(&mut rig.lab, &vm, dir.path());
    let bound = wait_event(dir.path(), "BOUND", 0, Duration::from_secs(20));
    assert_eq!(bound["new_ip_address"], IP_1);
    assert_eq!(bound["new_domain_name_servers"], "192.0.2.53 192.0.2.54");
    let log = || std::fs::read_to_string(dir.path().join("dhcpcd.log")).unwrap_or_default();
    assert!(
        log().contains("accepted reconfigure key"),
        "dhcpcd offered option 145 and took the key from its ACK:\n{}",
        log()
    );

    let changed = a_dns_change_reaches(&rig, dir.path(), 3600);
    assert_eq!(changed["new_ip_address"], IP_1);
    // dhcpcd checked the FORCERENEW's HMAC with its key: an unsigned one it would log as
    // "unauthenticated Force Renew".
    let log = log();
    assert!(log.contains("Force Renew from"), "{log}");
    assert!(!log.contains("unauthenticated"), "{log}");
    assert!(!log.contains("authentication failed"), "{log}");
    let agent = rig.agent_log();
    assert!(agent.contains("FORCERENEW sent"), "{agent}");
    assert!(!agent.contains("panicked"), "{agent}");
}

/// [`pool_a`] whose lease is named `host_name` (what `sendHostName` makes of the VM's name).
fn pool_a_named(lease_seconds: u32, host_name: &str) -> Value {
    let mut pool = pool_a(lease_seconds, "192.0.2.53");
    pool["leases"][0]["host_name"] = host_name.into();
    pool
}

#[test]
fn the_host_name_arrives_and_a_rename_reaches_the_next_renewal() {
    let (mut rig, vm) = serving(&[pool_a_named(6, "vm-1")]);

    // udhcpc asks for option 12 by default.
    let dir = tempfile::tempdir().unwrap();
    let bound = udhcpc_bound(&vm, dir.path(), &[]);
    assert_eq!(bound["hostname"], "vm-1");

    // dhclient too (its default request list has host-name); a rename reaches its next ACK.
    let dir = tempfile::tempdir().unwrap();
    start_dhclient(&mut rig.lab, &vm, dir.path());
    let bound = wait_event(dir.path(), "BOUND", 0, Duration::from_secs(20));
    assert_eq!(bound["new_ip_address"], IP_1);
    assert_eq!(bound["new_host_name"], "vm-1");
    rig.reload(&[pool_a_named(6, "vm-renamed")]);
    let seen_before = events(dir.path()).len();
    let renewed = wait_renewal_with(
        dir.path(),
        seen_before,
        "new_host_name",
        "vm-renamed",
        Duration::from_secs(20),
    );
    assert_eq!(renewed["new_ip_address"], IP_1);
    let log = rig.agent_log();
    assert!(!log.contains("panicked"), "{log}");
}

/// Pool A with an MTU and one classless route, no DNS or domain (the system's dhclient-script
/// would write them to the host's resolv.conf).
fn pool_a_routed(lease_seconds: u32, mtu: u16, router: Option<&str>) -> Value {
    with_lease(
        pool(
            "a",
            "srv0",
            SERVER_A,
            "192.0.2.0/24",
            json!({
                "router": router,
                "mtu": mtu,
                "routes": [{ "destination": "10.96.0.0/12", "gateway": "192.0.2.254" }],
                "lease_seconds": lease_seconds,
            }),
        ),
        MAC_1,
        IP_1,
    )
}

/// A rig serving `pools` on `srv0` (192.0.2.1/24), wired to the VM namespace it returns
/// ([`MAC_1`] on eth0).
fn serving(pools: &[Value]) -> (Rig, Netns) {
    let mut rig = rig();
    let vm = rig.vm("vm", "srv0", MAC_1);
    rig.lab.address(&rig.srv, "srv0", "192.0.2.1/24").unwrap();
    rig.start(pools);
    rig.wait_serving(&["srv0"]);
    (rig, vm)
}

/// Waits until the client on `vm` applied [`pool_a_routed`]'s route; returns `vm`'s IPv4 routes
/// on eth0.
fn wait_routes(rig: &Rig, vm: &Netns) -> String {
    wait_for(
        "the classless route applied",
        Duration::from_secs(30),
        || {
            let routes = rig
                .lab
                .exec(vm, "ip", &["-4", "route", "show", "dev", "eth0"])
                .unwrap_or_default();
            routes
                .contains("10.96.0.0/12 via 192.0.2.254")
                .then_some(routes)
        },
    )
}

#[test]
fn dhclient_applies_the_mtu_and_classless_routes_and_sees_an_mtu_change() {
    // 6 s leases: renewals every 3 s carry option changes.
    let (mut rig, vm) = serving(&[pool_a_routed(6, 1400, Some("192.0.2.254"))]);

    let dir = tempfile::tempdir().unwrap();
    start_dhclient_configuring(&mut rig.lab, &vm, dir.path());
    let ip = |args: &[&str]| rig.lab.exec(&vm, "ip", args).unwrap_or_default();
    let routes = wait_routes(&rig, &vm);
    assert!(routes.contains("default via 192.0.2.254"), "{routes}");
    wait_for("MTU 1400 on eth0", Duration::from_secs(10), || {
        ip(&["link", "show", "eth0"])
            .contains("mtu 1400 ")
            .then_some(())
    });
    let addr = ip(&["-4", "addr", "show", "eth0"]);
    assert!(addr.contains(&format!("{IP_1}/24")), "{addr}");

    // An MTU change reaches the next ACK: dhclient records it with the renewed lease (Debian's
    // script applies an MTU only on BOUND and REBOOT, so the link keeps 1400 until then).
    rig.reload(&[pool_a_routed(6, 1300, Some("192.0.2.254"))]);
    let lease = wait_for("a renewal with MTU 1300", Duration::from_secs(20), || {
        let l = dhclient_lease(&dir.path().join("dhclient.leases"));
        (l.get("interface-mtu").map(String::as_str) == Some("1300")).then_some(l)
    });
    assert_eq!(lease["fixed-address"], IP_1);
    assert_eq!(
        lease["rfc3442-classless-static-routes"],
        "0,192,0,2,254,12,10,96,192,0,2,254"
    );
    let log = rig.agent_log();
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn dhcpcd_applies_the_mtu_and_classless_routes() {
    let (mut rig, vm) = serving(&[pool_a_routed(600, 1400, Some("192.0.2.254"))]);

    let dir = tempfile::tempdir().unwrap();
    start_dhcpcd(&mut rig.lab, &vm, dir.path());
    let ip = |args: &[&str]| rig.lab.exec(&vm, "ip", args).unwrap_or_default();
    let routes = wait_routes(&rig, &vm);
    assert!(routes.contains("default via 192.0.2.254"), "{routes}");
    // dhcpcd 9 applies the MTU to the routes it adds (not to the link, so the link does not
    // bounce): every route of the lease carries it.
    for route in routes.lines().filter(|r| r.contains("proto dhcp")) {
        assert!(route.contains(" mtu 1400"), "{routes}");
    }
    let addr = ip(&["-4", "addr", "show", "eth0"]);
    assert!(addr.contains(&format!("{IP_1}/24")), "{addr}");
}

#[test]
fn a_secondary_network_client_gets_the_routes_and_mtu_but_no_default_route() {
    // `defaultRoute: false` in the IPPool reaches the agent as a config without a router.
    let (mut rig, vm) = serving(&[pool_a_routed(600, 1450, None)]);

    // udhcpc, asking for 121, 249 and 26 by name.
    let dir = tempfile::tempdir().unwrap();
    let bound = udhcpc_bound(
        &vm,
        dir.path(),
        &["-O", "staticroutes", "-O", "msstaticroutes", "-O", "mtu"],
    );
    assert_eq!(bound["ip"], IP_1);
    assert_eq!(bound["mtu"], "1450");
    assert_eq!(bound["staticroutes"], "10.96.0.0/12 192.0.2.254");
    assert_eq!(bound["msstaticroutes"], "10.96.0.0/12 192.0.2.254");
    assert!(!bound.contains_key("router"), "{bound:?}");

    // dhclient with the system script, as the VM would run it: the route, no default route.
    let dir = tempfile::tempdir().unwrap();
    start_dhclient_configuring(&mut rig.lab, &vm, dir.path());
    let ip = |args: &[&str]| rig.lab.exec(&vm, "ip", args).unwrap_or_default();
    let routes = wait_routes(&rig, &vm);
    assert!(!routes.contains("default"), "{routes}");
    wait_for("MTU 1450 on eth0", Duration::from_secs(10), || {
        ip(&["link", "show", "eth0"])
            .contains("mtu 1450 ")
            .then_some(())
    });
}

#[test]
fn dhclient_asking_for_another_address_is_naked_then_gets_its_own() {
    let mut rig = rig();
    let vm = rig.vm("vm", "srv0", MAC_1);
    rig.lab.address(&rig.srv, "srv0", "192.0.2.1/24").unwrap();
    rig.start(&[pool_a(3600, "192.0.2.53")]);
    rig.wait_serving(&["srv0"]);

    // dhclient remembers a lease for another address: it asks for it (INIT-REBOOT).
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("dhclient.leases"),
        "lease {\n  interface \"eth0\";\n  fixed-address 192.0.2.99;\n  \
         option subnet-mask 255.255.255.0;\n  option dhcp-lease-time 3600;\n  \
         option dhcp-server-identifier 192.0.2.1;\n  renew 4 2037/12/30 00:00:00;\n  \
         rebind 4 2037/12/30 00:00:00;\n  expire 4 2037/12/31 00:00:00;\n}\n",
    )
    .unwrap();
    start_dhclient(&mut rig.lab, &vm, dir.path());
    let bound = wait_event(dir.path(), "BOUND", 0, Duration::from_secs(30));
    assert_eq!(bound["new_ip_address"], IP_1);
    let log = fs::read_to_string(dir.path().join("dhclient.log")).unwrap();
    assert!(
        log.contains("DHCPREQUEST for 192.0.2.99"),
        "no INIT-REBOOT request: {log}"
    );
    assert!(log.contains("DHCPNAK from 192.0.2.1"), "no NAK: {log}");
    assert!(
        !events(dir.path())
            .iter()
            .any(|(_, env)| env.get("new_ip_address").map(String::as_str) == Some("192.0.2.99")),
        "the wrong address was acknowledged"
    );
}

#[test]
fn udhcpc_gets_its_reservation_with_exact_options_and_renews() {
    let mut rig = rig();
    let vm = rig.vm("vm", "srv0", MAC_1);
    rig.lab.address(&rig.srv, "srv0", "192.0.2.1/24").unwrap();
    rig.start(&[pool_a(600, "192.0.2.53")]);
    rig.wait_serving(&["srv0"]);

    let dir = tempfile::tempdir().unwrap();
    let bound = udhcpc_bound(&vm, dir.path(), &[]);
    assert_eq!(bound["ip"], IP_1);
    assert_eq!(bound["subnet"], "255.255.255.0");
    assert_eq!(bound["mask"], "24");
    assert_eq!(bound["broadcast"], "192.0.2.255");
    assert_eq!(bound["router"], "192.0.2.254");
    assert_eq!(bound["dns"].trim(), "192.0.2.53 192.0.2.54");
    assert_eq!(bound["domain"], "example.test");
    assert_eq!(bound["search"], "example.test svc.example.test");
    assert_eq!(bound["ntpsrv"], "192.0.2.123");
    assert_eq!(bound["lease"], "600");
    assert_eq!(bound["serverid"], SERVER_A);

    // Renewal: a client in BOUND state renews on SIGUSR1 (unicast, ciaddr set) and gets an ACK.
    let dir = tempfile::tempdir().unwrap();
    let script = hook_script(dir.path());
    let mut cmd = vm.command("udhcpc");
    cmd.args(["-i", "eth0", "-f", "-t", "4", "-T", "1", "-A", "1", "-s"])
        .arg(&script)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let pid = rig.lab.spawn(cmd).unwrap().id();
    wait_event(dir.path(), "bound", 0, Duration::from_secs(10));
    let renewed = wait_for("a renewal", Duration::from_secs(15), || {
        // Each SIGUSR1 asks for one renewal; repeat until one is seen (the first may race start-up).
        Command::new("kill")
            .args(["-USR1", &pid.to_string()])
            .status()
            .ok()?;
        std::thread::sleep(Duration::from_millis(200));
        events(dir.path())
            .into_iter()
            .find(|(e, _)| e == "renew")
            .map(|(_, env)| env)
    });
    assert_eq!(renewed["ip"], IP_1);
    assert_eq!(renewed["lease"], "600");
}

/// Pool A with every boot setting: the next server is 192.0.2.5.
fn pool_a_booting() -> Value {
    let mut p = pool_a(600, "192.0.2.53");
    p["config"]["boot"] = json!({
        "next_server": "192.0.2.5",
        "tftp_server_name": "tftp.example.test",
        "bios_file": "undionly.kpxe",
        "uefi_file": "ipxe.efi",
        "uefi_http_url": "http://192.0.2.5/ipxe.efi",
        "ipxe_script_url": "http://192.0.2.5/vm.ipxe",
    });
    p
}

#[test]
fn booting_clients_get_the_boot_file_of_their_kind_and_other_clients_nothing_new() {
    let (_rig, vm) = serving(&[pool_a_booting()]);
    // udhcpc sends what firmware sends (-V: option 60, -x: options 93 and 77) and reports the
    // header's next server and file, and options 66, 67 and 60 (as `vendor`).
    let ask = ["-O", "tftp", "-O", "bootfile", "-O", "vendor"];
    let boot = |extra: &[&str]| {
        let dir = tempfile::tempdir().unwrap();
        let args: Vec<&str> = ask.iter().chain(extra).copied().collect();
        let bound = udhcpc_bound(&vm, dir.path(), &args);
        assert_eq!(bound["ip"], IP_1, "{extra:?}: {bound:?}");
        assert_eq!(bound["router"], "192.0.2.254", "{extra:?}: {bound:?}");
        bound
    };
    let get = |bound: &std::collections::BTreeMap<String, String>, key: &str| {
        bound.get(key).cloned().unwrap_or_default()
    };

    let bios = boot(&["-V", "PXEClient:Arch:00000:UNDI:002001", "-x", "0x5d:0000"]);
    assert_eq!(get(&bios, "siaddr"), "192.0.2.5");
    assert_eq!(get(&bios, "boot_file"), "undionly.kpxe");
    assert_eq!(get(&bios, "bootfile"), "undionly.kpxe");
    assert_eq!(get(&bios, "tftp"), "tftp.example.test");
    assert_eq!(get(&bios, "vendor"), "");

    let uefi = boot(&["-V", "PXEClient:Arch:00007:UNDI:003016", "-x", "0x5d:0007"]);
    assert_eq!(get(&uefi, "boot_file"), "ipxe.efi");

    // iPXE (user class 77 = "iPXE") gets its script, not iPXE again.
    let ipxe = boot(&[
        "-V",
        "PXEClient:Arch:00000:UNDI:002001",
        "-x",
        "0x4d:69505845",
    ]);
    assert_eq!(get(&ipxe, "boot_file"), "http://192.0.2.5/vm.ipxe");

    // UEFI HTTP boot gets its URL and the vendor class HTTPClient back.
    let http = boot(&["-V", "HTTPClient:Arch:00016:UNDI:003001", "-x", "0x5d:0010"]);
    assert_eq!(get(&http, "bootfile"), "http://192.0.2.5/ipxe.efi");
    assert_eq!(get(&http, "vendor"), "HTTPClient");

    // An operating system's client (udhcpc's own vendor class) gets nothing new.
    let os = boot(&[]);
    assert_eq!(get(&os, "siaddr"), SERVER_A, "{os:?}");
    for key in ["boot_file", "bootfile", "tftp", "vendor"] {
        assert_eq!(get(&os, key), "", "{key}: {os:?}");
    }
}

#[test]
fn a_nic_s_own_dhcp_options_are_served_to_it_over_the_pool_s() {
    let mut p = pool_a(600, "192.0.2.53");
    // KubeVirt's `dhcpOptions`, as the controller streams them for the NIC.
    p["leases"][0]["dhcp_options"] = json!({
        "bootFileName": "nic.efi", "tftpServerName": "192.0.2.5", "ntpServers": ["192.0.2.99"],
        "privateOptions": [{"option": 240, "value": "hello"}, {"option": 252, "value": "http://wpad/wpad.dat"}],
    });
    let (_rig, vm) = serving(&[p]);
    let dir = tempfile::tempdir().unwrap();
    let bound = udhcpc_bound(
        &vm,
        dir.path(),
        &["-O", "bootfile", "-O", "tftp", "-O", "240", "-O", "252"],
    );
    assert_eq!(bound["ip"], IP_1);
    assert_eq!(bound["bootfile"], "nic.efi", "{bound:?}");
    assert_eq!(bound["tftp"], "192.0.2.5");
    // The NIC's NTP server replaces the pool's 192.0.2.123.
    assert_eq!(bound["ntpsrv"], "192.0.2.99");
    assert_eq!(bound["opt240"], hex(b"hello"));
    // 252 is a private code udhcpc knows by name (WPAD).
    assert_eq!(bound["wpad"], "http://wpad/wpad.dat");
    // The pool's own options still come with them.
    assert_eq!(bound["router"], "192.0.2.254");
    assert_eq!(bound["domain"], "example.test");
}

#[test]
fn an_unknown_mac_gets_nothing() {
    let mut rig = rig();
    let vm = rig.vm("vm", "srv0", STRANGER);
    rig.lab.address(&rig.srv, "srv0", "192.0.2.1/24").unwrap();
    rig.start(&[pool_a(600, "192.0.2.53")]);
    rig.wait_serving(&["srv0"]);

    let dir = tempfile::tempdir().unwrap();
    let out = udhcpc(&vm, dir.path(), &[]);
    assert!(
        !out.status.success(),
        "udhcpc got a lease for an unknown MAC"
    );
    assert!(
        events(dir.path()).iter().all(|(e, _)| e != "bound"),
        "{:?}",
        events(dir.path())
    );
    let log = rig.agent_log();
    assert!(log.contains("no lease for this MAC"), "{log}");
}

#[test]
fn two_pools_on_two_interfaces_and_a_missing_interface_does_not_stop_them() {
    let mut rig = rig();
    let vm1 = rig.vm("vm1", "srv0", MAC_1);
    let vm2 = rig.vm("vm2", "srv1", MAC_2);
    rig.lab.address(&rig.srv, "srv0", "192.0.2.1/24").unwrap();
    rig.lab
        .address(&rig.srv, "srv1", "198.51.100.1/24")
        .unwrap();
    let pool_b = with_lease(
        pool(
            "b",
            "srv1",
            SERVER_B,
            "198.51.100.0/24",
            json!({ "dns": ["198.51.100.53"], "lease_seconds": 120 }),
        ),
        MAC_2,
        IP_2,
    );
    // MAC_1 also has a lease on pool B, and MAC_2 none on pool A: each network must answer
    // from its own pool only.
    let pool_b = with_lease(pool_b, MAC_1, "198.51.100.10");
    let gone = pool("c", "nosuch0", "203.0.113.1", "203.0.113.0/24", json!({}));
    rig.start(&[pool_a(600, "192.0.2.53"), pool_b, gone]);
    let status = rig.wait_serving(&["srv0", "srv1"]);
    let status = if status["interfaces"]["nosuch0"]["state"] == "failed" {
        status
    } else {
        wait_for("nosuch0 reported failed", Duration::from_secs(10), || {
            let s = rig.status()?;
            (s["interfaces"]["nosuch0"]["state"] == "failed").then_some(s)
        })
    };
    assert!(
        status["interfaces"]["nosuch0"]["error"]
            .as_str()
            .unwrap()
            .contains("nosuch0"),
        "{status}"
    );

    let d1 = tempfile::tempdir().unwrap();
    let d2 = tempfile::tempdir().unwrap();
    let out1 = udhcpc(&vm1, d1.path(), &[]);
    let out2 = udhcpc(&vm2, d2.path(), &[]);
    assert!(out1.status.success() && out2.status.success());
    let b1 = wait_event(d1.path(), "bound", 0, Duration::from_secs(1));
    let b2 = wait_event(d2.path(), "bound", 0, Duration::from_secs(1));
    assert_eq!(
        (b1["ip"].as_str(), b1["serverid"].as_str()),
        (IP_1, SERVER_A)
    );
    assert_eq!(b1["lease"], "600");
    assert_eq!(
        (b2["ip"].as_str(), b2["serverid"].as_str()),
        (IP_2, SERVER_B)
    );
    assert_eq!(b2["lease"], "120");
    assert_eq!(b2["dns"].trim(), "198.51.100.53");
}

#[test]
fn a_relayed_request_is_answered_to_the_relay() {
    let mut rig = rig();
    // The relay sits on the server's network at 192.0.2.2 and talks from port 67, as relays
    // (and perfdhcp) do.
    let relay = rig.vm("relay", "srv0", "02:00:00:00:00:02");
    rig.lab.address(&rig.srv, "srv0", "192.0.2.1/24").unwrap();
    rig.lab.address(&relay, "eth0", "192.0.2.2/24").unwrap();
    rig.start(&[pool_a(600, "192.0.2.53")]);
    rig.wait_serving(&["srv0"]);

    let mac = [0x02, 0, 0, 0, 0x01, 0x0a];
    let mut options = vec![61, 7, 1];
    options.extend_from_slice(&mac);
    options.extend_from_slice(&[55, 3, 1, 3, 6]);
    let packet = bootrequest(1, mac, [192, 0, 2, 2], [0xde, 0xad, 0xbe, 0xef], &options);
    let hex = hex(&packet);
    let script = format!(
        "import socket,time\n\
         s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
         s.bind(('192.0.2.2',67))\n\
         s.settimeout(0.5)\n\
         end=time.time()+10\n\
         while time.time()<end:\n\
         \x20 s.sendto(bytes.fromhex('{hex}'),('{SERVER_A}',67))\n\
         \x20 try:\n\
         \x20\x20 data,peer=s.recvfrom(2048)\n\
         \x20\x20 print(peer[0],peer[1],data.hex());break\n\
         \x20 except socket.timeout:\n\
         \x20\x20 pass\n"
    );
    let out = rig.lab.exec(&relay, "python3", &["-c", &script]).unwrap();
    let mut parts = out.split_whitespace();
    let (from, port, reply) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    assert_eq!((from, port), (SERVER_A, "67"));
    let reply: Vec<u8> = (0..reply.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&reply[i..i + 2], 16).unwrap())
        .collect();
    assert_eq!(reply[0], 2, "BOOTREPLY");
    assert_eq!(&reply[4..8], &[0xde, 0xad, 0xbe, 0xef]);
    assert_eq!(&reply[16..20], &[192, 0, 2, 10], "yiaddr");
    assert_eq!(&reply[24..28], &[192, 0, 2, 2], "giaddr kept");
    assert_eq!(&reply[28..34], &mac);
    // Options: 53 = OFFER and the client identifier echoed.
    let opts = &reply[240..];
    let find = |code: u8| -> Option<&[u8]> {
        let mut i = 0;
        while i + 1 < opts.len() && opts[i] != 255 {
            if opts[i] == 0 {
                i += 1;
                continue;
            }
            let len = usize::from(opts[i + 1]);
            if opts[i] == code {
                return opts.get(i + 2..i + 2 + len);
            }
            i += 2 + len;
        }
        None
    };
    assert_eq!(find(53), Some(&[2u8][..]));
    assert_eq!(find(61), Some(&[1, 2, 0, 0, 0, 1, 10][..]));
    assert_eq!(find(54), Some(&[192, 0, 2, 1][..]));
}

#[test]
fn http_endpoints_report_leases_replies_and_a_declined_address() {
    let mut rig = rig();
    let vm = rig.vm("vm", "srv0", MAC_1);
    rig.lab.address(&rig.srv, "srv0", "192.0.2.1/24").unwrap();
    rig.start_with(
        &[pool_a(600, "192.0.2.53")],
        &["--http-listen", "127.0.0.1:8080"],
    );
    rig.wait_serving(&["srv0"]);
    let (code, body) = wait_for("/readyz", Duration::from_secs(10), || {
        let (code, body) = http_get(&rig.lab, &rig.srv, "http://127.0.0.1:8080/readyz");
        (code == 200).then_some((code, body))
    });
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        http_get(&rig.lab, &rig.srv, "http://127.0.0.1:8080/healthz").0,
        200
    );

    let dir = tempfile::tempdir().unwrap();
    assert!(udhcpc(&vm, dir.path(), &[]).status.success());
    let (_, leases) = http_get(&rig.lab, &rig.srv, "http://127.0.0.1:8080/leases");
    let leases: Value = serde_json::from_str(&leases).unwrap();
    assert_eq!(leases["default/a"][MAC_1]["ip"], IP_1);

    // A DECLINE for an address nobody answers ARP for (the client dropped it): checked with a
    // probe, found stale, and the address stays served.
    rig.lab
        .exec(&vm, "ip", &["addr", "flush", "dev", "eth0"])
        .unwrap();
    send_decline(&rig.lab, &vm, MAC_1_BYTES, [1, 2, 3, 4]);
    let labels = r#"interface="srv0",pool="default/a""#;
    let checked = format!("vmdhcp_agent_declines_total{{{labels},verdict=\"no_answer\"}} 1");
    let metrics = wait_for("the DECLINE checked", Duration::from_secs(10), || {
        let (_, m) = http_get(&rig.lab, &rig.srv, "http://127.0.0.1:8080/metrics");
        m.lines().any(|l| l == checked).then_some(m)
    });
    let dir = tempfile::tempdir().unwrap();
    assert!(udhcpc(&vm, dir.path(), &[]).status.success());
    let (_, leases) = http_get(&rig.lab, &rig.srv, "http://127.0.0.1:8080/leases");
    let leases: Value = serde_json::from_str(&leases).unwrap();
    assert!(
        leases["default/a"][MAC_1].get("conflict").is_none(),
        "{leases}"
    );

    for line in [
        format!("vmdhcp_agent_dhcp_replies_total{{{labels},type=\"offer\"}} 1"),
        format!("vmdhcp_agent_dhcp_replies_total{{{labels},type=\"ack\"}} 1"),
        format!("vmdhcp_agent_dhcp_requests_total{{{labels},type=\"decline\"}} 1"),
        format!("vmdhcp_agent_dhcp_unanswered_total{{{labels},reason=\"declined\"}} 1"),
        format!("vmdhcp_agent_dhcp_reply_latency_seconds_count{{{labels}}} 2"),
        format!("vmdhcp_agent_interface_serving{{{labels}}} 1"),
        "vmdhcp_agent_leases{pool=\"default/a\"} 1".to_owned(),
        "vmdhcp_agent_conflicted_addresses{pool=\"default/a\"} 0".to_owned(),
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "missing {line}\n{metrics}"
        );
    }
}

#[test]
fn an_address_a_squatter_holds_is_not_offered_and_the_probe_costs_the_first_lease_only() {
    const MAC_3: &str = "02:00:00:00:03:0c";
    let pool = with_lease(pool_a(600, "192.0.2.53"), MAC_3, "192.0.2.11");
    let mut b = Bridged::new(&[pool]);

    // The first lease waits for one probe of the address; the next DISCOVER does not.
    let (ok, first) = timed_udhcpc(&b.vm);
    assert!(ok);
    let (ok, second) = timed_udhcpc(&b.vm);
    assert!(ok);
    b.wait_verdict("vmdhcp_agent_offer_probes_total", "clean", 1);

    // Another host takes 192.0.2.11 before vm3 boots: vm3 is not offered it, and the agent
    // says who holds it.
    b.rig.lab.address(&b.evil, "eth0", "192.0.2.11/24").unwrap();
    let vm3 = b.host("vm3", MAC_3);
    let dir = tempfile::tempdir().unwrap();
    assert!(
        !udhcpc(&vm3, dir.path(), &[]).status.success(),
        "offered a squatted address"
    );
    let metrics = b.wait_verdict("vmdhcp_agent_offer_probes_total", "conflict", 1);
    let gauge = "vmdhcp_agent_conflicted_addresses{pool=\"default/a\"} 1";
    assert!(metrics.lines().any(|l| l == gauge), "{metrics}");
    assert_eq!(
        b.leases()["default/a"][MAC_3]["conflict"]["answered_by"],
        EVIL_MAC
    );
    // Nothing else moves: the VM beside it keeps its address.
    let (ok, _) = timed_udhcpc(&b.vm);
    assert!(ok);
    println!(
        "first lease with its ARP probe: {} ms; the next DISCOVER: {} ms (renewals are never probed)",
        first.as_millis(),
        second.as_millis()
    );
}

#[test]
fn a_forged_decline_locks_nobody_out_and_a_squatter_is_held_off_for_a_bounded_time() {
    let b = Bridged::new(&[pool_a(600, "192.0.2.53")]);
    let (rig, vm, evil, evil_mac) = (&b.rig, &b.vm, &b.evil, EVIL_MAC);
    let verdicts = |verdict: &str, n: u32| {
        b.wait_verdict("vmdhcp_agent_declines_total", verdict, n);
    };
    let leases = || b.leases();

    // The VM boots and holds its address.
    let dir = tempfile::tempdir().unwrap();
    assert!(udhcpc(vm, dir.path(), &[]).status.success());

    // Another host forges a DECLINE in the VM's name: the VM answers the probe for its own
    // address, so nothing is withheld and the VM renews at once.
    send_decline(&rig.lab, evil, MAC_1_BYTES, [5, 6, 7, 8]);
    verdicts("holder_answers", 1);
    assert!(leases()["default/a"][MAC_1].get("conflict").is_none());
    let started = std::time::Instant::now();
    let dir = tempfile::tempdir().unwrap();
    assert!(udhcpc(vm, dir.path(), &[]).status.success());
    let renewed_after = started.elapsed();

    // A real conflict: the other host takes the address, the VM (without it) declines. The
    // probe is answered by the squatter: the address is withheld, for at most CONFLICT_HOLD.
    rig.lab
        .exec(vm, "ip", &["addr", "flush", "dev", "eth0"])
        .unwrap();
    rig.lab.address(evil, "eth0", "192.0.2.10/24").unwrap();
    send_decline(&rig.lab, vm, MAC_1_BYTES, [9, 9, 9, 9]);
    verdicts("conflict", 1);
    let conflict = leases()["default/a"][MAC_1]["conflict"].clone();
    assert_eq!(conflict["declined_by"], MAC_1);
    assert_eq!(conflict["answered_by"], evil_mac);
    let held = conflict["held_for_seconds"].as_u64().unwrap();
    assert!((1..=60).contains(&held), "{conflict}");
    let dir = tempfile::tempdir().unwrap();
    assert!(!udhcpc(vm, dir.path(), &[]).status.success(), "withheld");

    // The squatter leaves; the next DECLINE's probe finds the address free and ends the hold.
    rig.lab
        .exec(evil, "ip", &["addr", "flush", "dev", "eth0"])
        .unwrap();
    send_decline(&rig.lab, evil, MAC_1_BYTES, [1, 1, 1, 1]);
    verdicts("no_answer", 1);
    let dir = tempfile::tempdir().unwrap();
    assert!(udhcpc(vm, dir.path(), &[]).status.success());
    println!(
        "forged DECLINE -> the VM's next lease: {} ms (no hold); a real conflict held {held} s of at most 60",
        renewed_after.as_millis()
    );
    let log = rig.agent_log();
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn configure_interfaces_sets_exactly_the_server_address_idempotently_and_undoes_it() {
    let mut rig = rig();
    let vm = rig.vm("vm", "srv0", MAC_1);
    // Leftovers the agent must clear: a foreign address in the subnet, another elsewhere, and
    // the link down.
    rig.lab.address(&rig.srv, "srv0", "192.0.2.200/24").unwrap();
    rig.lab.address(&rig.srv, "srv0", "10.9.9.9/8").unwrap();
    rig.lab
        .exec(&rig.srv, "ip", &["link", "set", "srv0", "down"])
        .unwrap();
    let missing = pool("c", "nosuch0", "203.0.113.1", "203.0.113.0/24", json!({}));
    let pools = [pool_a(600, "192.0.2.53"), missing];
    rig.start_with(&pools, &["--configure-interfaces"]);
    rig.wait_serving(&["srv0"]);
    let addrs = rig
        .lab
        .exec(&rig.srv, "ip", &["-4", "-o", "addr", "show", "dev", "srv0"])
        .unwrap();
    assert!(addrs.contains("inet 192.0.2.1/24"), "{addrs}");
    assert_eq!(addrs.lines().count(), 1, "{addrs}");
    let link = rig
        .lab
        .exec(&rig.srv, "ip", &["-o", "link", "show", "dev", "srv0"])
        .unwrap();
    assert!(link.contains(",UP") || link.contains("<UP"), "{link}");
    let log = rig.agent_log();
    assert!(log.contains("interface configured"), "{log}");
    assert!(log.contains("interface nosuch0 does not exist"), "{log}");

    let dir = tempfile::tempdir().unwrap();
    assert_eq!(udhcpc_bound(&vm, dir.path(), &[])["ip"], IP_1);

    // Stopping removes the server address.
    Command::new("kill")
        .args(["-TERM", &rig.agent_pid.to_string()])
        .status()
        .unwrap();
    wait_for(
        "the server address removed",
        Duration::from_secs(10),
        || {
            let addrs = rig
                .lab
                .exec(&rig.srv, "ip", &["-4", "-o", "addr", "show", "dev", "srv0"])
                .ok()?;
            (!addrs.contains("192.0.2.1/")).then_some(())
        },
    );

    // An interface already in shape is left as it is.
    rig.lab.address(&rig.srv, "srv0", "192.0.2.1/24").unwrap();
    rig.start_with(&pools, &["--configure-interfaces"]);
    rig.wait_serving(&["srv0"]);
    let log = wait_for("the second start's log", Duration::from_secs(10), || {
        let log = rig.agent_log();
        log.contains("interface already configured").then_some(log)
    });
    assert!(!log.contains("interface configured\n"), "{log}");
}

#[test]
fn an_interface_that_disappears_is_reported_and_served_again_when_it_returns() {
    let mut rig = rig();
    let vm1 = rig.vm("vm1", "srv0", MAC_1);
    let _vm2 = rig.vm("vm2", "srv1", MAC_2);
    rig.lab.address(&rig.srv, "srv0", "192.0.2.1/24").unwrap();
    rig.lab
        .address(&rig.srv, "srv1", "198.51.100.1/24")
        .unwrap();
    let pool_b = with_lease(
        pool("b", "srv1", SERVER_B, "198.51.100.0/24", json!({})),
        MAC_2,
        IP_2,
    );
    rig.start(&[pool_a(600, "192.0.2.53"), pool_b]);
    rig.wait_serving(&["srv0", "srv1"]);

    // The network of pool B goes away (deleting one end of a veth deletes both).
    rig.lab
        .exec(&rig.srv, "ip", &["link", "del", "srv1"])
        .unwrap();
    let status = wait_for("srv1 reported failed", Duration::from_secs(15), || {
        let s = rig.status()?;
        (s["interfaces"]["srv1"]["state"] == "failed").then_some(s)
    });
    assert!(
        status["interfaces"]["srv1"]["error"]
            .as_str()
            .unwrap()
            .contains("srv1"),
        "{status}"
    );
    assert_eq!(status["interfaces"]["srv0"]["state"], "serving");
    let dir = tempfile::tempdir().unwrap();
    assert!(udhcpc(&vm1, dir.path(), &[]).status.success());
    assert_eq!(
        wait_event(dir.path(), "bound", 0, Duration::from_secs(1))["ip"],
        IP_1
    );

    // It comes back (a new link, a new VM on it): served again without a restart.
    let vm3 = rig.vm("vm3", "srv1", MAC_2);
    rig.lab
        .address(&rig.srv, "srv1", "198.51.100.1/24")
        .unwrap();
    // Retries back off up to 30 s between attempts; by now the gap is well below that.
    wait_for("srv1 serving again", Duration::from_secs(45), || {
        (rig.status()?["interfaces"]["srv1"]["state"] == "serving").then_some(())
    });
    let dir = tempfile::tempdir().unwrap();
    let out = udhcpc(&vm3, dir.path(), &[]);
    assert!(out.status.success(), "{}", rig.agent_log());
    assert_eq!(
        wait_event(dir.path(), "bound", 0, Duration::from_secs(1))["ip"],
        IP_2
    );
}

/// The agent on [`Bridged`]'s network looking for foreign DHCP servers with short settings: a
/// probe every `probe_seconds` (0: none), a suspect forgotten 4 s after it was last seen.
fn looking_for_rogues(probe_seconds: &str) -> Bridged {
    let args = [
        "--foreign-dhcp-probe-interval-seconds",
        probe_seconds,
        "--suspect-forget-after-seconds",
        "4",
    ];
    Bridged::with_args(&[pool_a(600, "192.0.2.53")], &args)
}

/// `family{labels}`'s value on a `/metrics` page; 0 when absent.
fn metric_value(metrics: &str, series: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0)
}

const PROBES_SENT: &str =
    r#"vmdhcp_agent_foreign_dhcp_probes_total{interface="srv0",pool="default/a",result="sent"}"#;
const OWN_PROBES_IGNORED: &str = r#"vmdhcp_agent_dhcp_unanswered_total{interface="srv0",pool="default/a",reason="own_interface"}"#;
const FOREIGN_SERVERS: &str =
    r#"vmdhcp_agent_network_suspects{pool="default/a",kind="foreign_dhcp_server"}"#;

#[test]
fn a_rogue_dhcp_server_is_reported_within_the_probe_interval_and_cleared_after_it_stops() {
    let mut b = looking_for_rogues("1");
    // Alone on the network, with a VM served: the probes go out, our own server hears them and
    // stays silent, and nothing is reported, our own replies included.
    let (ok, _) = timed_udhcpc(&b.vm);
    assert!(ok, "{}", b.rig.agent_log());
    let metrics = wait_for("probes sent and ignored by our server", DEADLINE, || {
        let m = b.metrics();
        (metric_value(&m, PROBES_SENT) >= 3 && metric_value(&m, OWN_PROBES_IGNORED) >= 1)
            .then_some(m)
    });
    assert_eq!(metric_value(&metrics, FOREIGN_SERVERS), 0, "{metrics}");
    assert!(
        metrics.lines().any(|l| l.starts_with(FOREIGN_SERVERS)),
        "a served pool shows 0: {metrics}"
    );

    // dnsmasq starts on the same bridge: reported within about one probe interval.
    let dir = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let rogue = start_rogue(&mut b, dir.path());
    wait_for("the rogue server reported", DEADLINE, || {
        (metric_value(&b.metrics(), FOREIGN_SERVERS) == 1).then_some(())
    });
    let found_in = started.elapsed();
    // Documented: within one probe interval of the server answering (here 1 s), plus the time
    // dnsmasq takes to start and the scrapes.
    assert!(
        found_in < Duration::from_secs(5),
        "reported after {found_in:?}"
    );
    let log = b.rig.agent_log();
    let line = log
        .lines()
        .find(|l| l.contains("foreign DHCP server on the pool's network"))
        .unwrap_or_else(|| panic!("no report in the log:\n{log}"));
    for wanted in [EVIL_MAC, ROGUE_IP, "in answer to the agent's probe"] {
        assert!(line.contains(wanted), "{wanted} not in {line}");
    }
    // Several probes later it is still the only one: our own server is never among them.
    let sent = metric_value(&b.metrics(), PROBES_SENT);
    let metrics = wait_for("three more probes", DEADLINE, || {
        let m = b.metrics();
        (metric_value(&m, PROBES_SENT) >= sent + 3).then_some(m)
    });
    assert_eq!(metric_value(&metrics, FOREIGN_SERVERS), 1, "{metrics}");
    assert_eq!(
        log.matches("foreign DHCP server on the pool's network")
            .count(),
        1,
        "{log}"
    );

    // dnsmasq stops: forgotten once it has been silent for its time, not before.
    let killed = Command::new("kill")
        .arg(rogue.to_string())
        .status()
        .unwrap();
    assert!(killed.success());
    let stopped = std::time::Instant::now();
    wait_for("the rogue server forgotten", DEADLINE, || {
        (metric_value(&b.metrics(), FOREIGN_SERVERS) == 0).then_some(())
    });
    let cleared_in = stopped.elapsed();
    // Last seen at most one probe interval before it stopped.
    assert!(
        cleared_in >= Duration::from_secs(3),
        "cleared after {cleared_in:?}"
    );
    println!(
        "rogue DHCP server reported {} ms after it started, cleared {} ms after it stopped \
         (probe every 1 s, forgotten after 4 s)",
        found_in.as_millis(),
        cleared_in.as_millis()
    );
}

#[test]
fn a_rogue_server_answering_a_vm_is_heard_without_any_probe() {
    let mut b = looking_for_rogues("0");
    let dir = tempfile::tempdir().unwrap();
    start_rogue(&mut b, dir.path());
    // A host our pool does not know asks, by broadcast: only dnsmasq answers, and its
    // broadcast OFFER reaches the agent too.
    const NEWCOMER: &str = "02:00:00:00:09:09";
    let newcomer = b.host("newcomer", NEWCOMER);
    let client = tempfile::tempdir().unwrap();
    let out = udhcpc(&newcomer, client.path(), &["-B"]);
    assert!(
        out.status.success(),
        "{}",
        fs::read_to_string(dir.path().join("dnsmasq.log")).unwrap_or_default()
    );
    let metrics = wait_for("the rogue server reported", DEADLINE, || {
        let m = b.metrics();
        (metric_value(&m, FOREIGN_SERVERS) == 1).then_some(m)
    });
    assert_eq!(metric_value(&metrics, PROBES_SENT), 0, "{metrics}");
    let log = b.rig.agent_log();
    let line = log
        .lines()
        .find(|l| l.contains("foreign DHCP server on the pool's network"))
        .unwrap_or_else(|| panic!("no report in the log:\n{log}"));
    for wanted in [EVIL_MAC, ROGUE_IP, &format!("to {NEWCOMER}")] {
        assert!(line.contains(wanted), "{wanted} not in {line}");
    }
}

const PEER_REPLIES: &str = r#"vmdhcp_agent_dhcp_peer_replies_total{pool="default/a"}"#;
const NAKS_SENT: &str =
    r#"vmdhcp_agent_dhcp_replies_total{interface="srv0",pool="default/a",type="nak"}"#;

#[test]
fn a_named_peer_server_is_no_suspect_and_each_server_serves_its_own_clients() {
    // Two servers on one segment by design (harvester#8225): the agent is told the other's
    // address, and the other serves only its own reservation.
    let args = [
        "--foreign-dhcp-probe-interval-seconds",
        "1",
        "--suspect-forget-after-seconds",
        "4",
        "--known-dhcp-servers",
        ROGUE_IP,
    ];
    let mut b = Bridged::with_args(&[pool_a(6, "192.0.2.53")], &args);
    let peer_dir = tempfile::tempdir().unwrap();
    start_peer(&mut b, peer_dir.path());
    let peer_log = || fs::read_to_string(peer_dir.path().join("dnsmasq.log")).unwrap_or_default();

    // The peer's client gets the peer's address, twice (the second time asking for it), its
    // OFFERs and ACKs broadcast (-B) so that the agent hears them.
    let theirs = b.host("theirs", PEER_CLIENT_MAC);
    for again in [&["-B"][..], &["-B", "-r", PEER_CLIENT_IP][..]] {
        let dir = tempfile::tempdir().unwrap();
        let bound = udhcpc_bound(&theirs, dir.path(), again);
        assert_eq!(bound["ip"], PEER_CLIENT_IP, "{}", peer_log());
        assert_eq!(bound["serverid"], ROGUE_IP);
    }

    // Our VM gets ours from us, and renews with us, with the peer answering beside.
    let ours = tempfile::tempdir().unwrap();
    start_dhclient(&mut b.rig.lab, &b.vm, ours.path());
    let bound = wait_event(ours.path(), "BOUND", 0, DEADLINE);
    assert_eq!(bound["new_ip_address"], IP_1);
    assert_eq!(bound["new_dhcp_server_identifier"], SERVER_A);
    let renewed = wait_event(ours.path(), "RENEW", 0, DEADLINE);
    assert_eq!(renewed["new_ip_address"], IP_1);

    // The peer's broadcast answers reached the agent: counted, logged once, never a suspect
    // (the peer ignores the agent's probes, as it ignores every MAC it does not know); and
    // neither server refused the other's clients.
    let metrics = wait_for(
        "the peer's answers counted, three probes sent",
        DEADLINE,
        || {
            let m = b.metrics();
            (metric_value(&m, PROBES_SENT) >= 3 && metric_value(&m, PEER_REPLIES) >= 4).then_some(m)
        },
    );
    assert_eq!(metric_value(&metrics, FOREIGN_SERVERS), 0, "{metrics}");
    assert_eq!(metric_value(&metrics, NAKS_SENT), 0, "{metrics}");
    let log = b.rig.agent_log();
    assert_eq!(
        log.matches("known peer DHCP server on the pool's network")
            .count(),
        1,
        "{log}"
    );
    assert!(
        !log.contains("foreign DHCP server on the pool's network"),
        "{log}"
    );
    let peer = peer_log();
    assert!(!peer.contains("DHCPNAK"), "{peer}");
    assert!(
        events(ours.path())
            .iter()
            .all(|(e, _)| e != "EXPIRE" && e != "FAIL"),
        "{:?}",
        events(ours.path())
    );
}

/// How long a test waits for what the agent should do within a few probe intervals.
const DEADLINE: Duration = Duration::from_secs(20);
