//! The DHCPv6 real-client harness (`vmdhcp_integration::dhcp6_client`) proven against the
//! reference server, before our own DHCPv6 server exists: `kea-dhcp6` with a host reservation by
//! MAC, and ISC `dhclient -6` and `dhcpcd` in a VM namespace joined to Kea's by a veth pair.
//! Each test shows that the harness starts a client, observes the address it obtained (hook
//! events, dhclient's lease file, the interface), its renewals, rebinds, confirms and releases,
//! and stops everything on every exit path; the same tests can later be pointed at
//! `vm-dhcp-agent serve-static`.
//!
//! Addresses are link-local and a ULA prefix (`fd76:6d64:6863::/64`) that exist only inside the
//! namespaces each test creates; every wait has a deadline.
#![allow(clippy::unwrap_used)]

use std::net::Ipv6Addr;
use std::time::Duration;

use vmdhcp_integration::dhcp_client::wait_for;
use vmdhcp_integration::dhcp6_client::{
    Client6, Kea6, Kea6Config, Lease6, Options6, Radvd, RadvdConfig, add_address, global_addresses,
    no_dad, set_mac, wait_link_local,
};
use vmdhcp_integration::netns::{Lab, Netns};

/// The VM network's prefix, a ULA that exists only in the lab.
const PREFIX: &str = "fd76:6d64:6863::/64";
/// The server's address on it.
const SERVER: &str = "fd76:6d64:6863::1/64";
/// The VM's NIC.
const MAC_1: &str = "02:00:00:00:01:0a";
/// A NIC without a reservation.
const STRANGER: &str = "02:00:00:00:ff:ff";
/// Kea's DNS servers.
const DNS: [&str; 2] = ["fd76:6d64:6863::53", "fd76:6d64:6863::54"];

/// [`MAC_1`]'s reservation.
fn reserved() -> Ipv6Addr {
    "fd76:6d64:6863::10".parse().unwrap()
}

/// A server namespace (`srv0`, [`SERVER`]) and a VM namespace (`eth0` with `mac`) on a veth
/// pair, without duplicate address detection, both link-local addresses usable.
struct Link {
    lab: Lab,
    srv: Netns,
    vm: Netns,
}

fn link(mac: &str) -> Link {
    let mut lab = Lab::new().unwrap();
    let srv = lab.netns("srv").unwrap();
    let vm = lab.netns("vm").unwrap();
    no_dad(&lab, &srv);
    no_dad(&lab, &vm);
    lab.veth(&srv, "srv0", &vm, "eth0").unwrap();
    set_mac(&lab, &vm, "eth0", mac);
    add_address(&lab, &srv, "srv0", SERVER);
    wait_link_local(&lab, &srv, "srv0", Duration::from_secs(5));
    wait_link_local(&lab, &vm, "eth0", Duration::from_secs(5));
    Link { lab, srv, vm }
}

/// Kea serving [`PREFIX`] on `srv0`: [`MAC_1`]'s reservation, [`DNS`], no pool, T1/T2/preferred/
/// valid 2/3/5/8 s.
fn kea_config() -> Kea6Config {
    let mut config = Kea6Config::new("srv0", PREFIX).reserve(MAC_1, reserved());
    config.dns = DNS.iter().map(|d| d.parse().unwrap()).collect();
    config
}

fn dns() -> Vec<Ipv6Addr> {
    DNS.iter().map(|d| d.parse().unwrap()).collect()
}

/// Waits until the VM's eth0 has exactly `want` as global addresses.
fn wait_addresses(l: &Link, want: &[Ipv6Addr]) {
    wait_for(
        &format!("eth0's global addresses to be {want:?}"),
        Duration::from_secs(10),
        || (global_addresses(&l.lab, &l.vm, "eth0") == want).then_some(()),
    );
}

const BIND: Duration = Duration::from_secs(20);

/// `bound` is exactly the reservation, with Kea's timers, DUID and DNS servers.
fn assert_the_reservation(bound: &Lease6, config: &Kea6Config) {
    assert_eq!(bound.address, reserved());
    assert_eq!(
        (bound.t1, bound.t2, bound.preferred, bound.valid),
        (2, 3, 5, 8)
    );
    assert_eq!(bound.server_id, config.server_duid());
    assert_eq!(bound.dns, dns());
}

/// Kea logged `what` for the reservation at least once within `within`.
fn kea_logged(kea: &Kea6, what: &str, within: Duration) {
    kea.wait_log(what, &reserved().to_string(), 1, within);
}

/// The client RENEWs at T1 and keeps the address; then it RELEASEs, Kea frees the binding
/// and the address leaves the interface.
fn renews_then_releases(l: &Link, kea: &Kea6, c: &mut Client6) {
    let renewed = c.wait_lease("RENEW6", 0, Duration::from_secs(10));
    assert_eq!(renewed.address, reserved());
    kea_logged(kea, "DHCP6_LEASE_RENEW", Duration::from_secs(1));
    c.release(Duration::from_secs(10));
    kea_logged(kea, "DHCP6_RELEASE_NA", Duration::from_secs(5));
    wait_addresses(l, &[]);
}

#[test]
fn harness_dhclient6_gets_renews_confirms_and_releases_a_kea_reservation() {
    let l = link(MAC_1);
    let config = kea_config();
    let kea = Kea6::start(&l.srv, &config);
    let mut c = Client6::dhclient(&l.vm, "eth0", Options6::default());

    // SOLICIT/ADVERTISE/REQUEST/REPLY: exactly the reservation, with Kea's timers and options.
    assert_the_reservation(&c.wait_lease("BOUND6", 0, BIND), &config);
    let log = c.log();
    assert!(log.contains("XMT: Forming Request"), "{log}");
    kea_logged(
        &kea,
        "ALLOC_ENGINE_V6_HR_ADDR_GRANTED",
        Duration::from_secs(1),
    );
    // The same address in dhclient's lease file, and on the interface (applied by the hook).
    assert_eq!(c.lease_file_address(), Some(reserved()));
    wait_addresses(&l, &[reserved()]);

    // RENEW at T1, answered with the same address.
    let renewed = c.wait_lease("RENEW6", 0, Duration::from_secs(10));
    assert_eq!(renewed.address, reserved());
    kea_logged(&kea, "DHCP6_LEASE_RENEW", Duration::from_secs(1));

    // Started again on its lease file, it CONFIRMs the lease before using it.
    let bound_before = c.event_names().iter().filter(|e| *e == "BOUND6").count();
    c.restart();
    let confirmed = c.wait_lease("BOUND6", bound_before, BIND);
    assert_eq!(confirmed.address, reserved());
    let log = c.log();
    assert!(log.contains("XMT: Forming Confirm"), "{log}");
    assert!(log.contains("Confirm Address fd76:6d64:6863::10"), "{log}");

    // RELEASE: Kea frees the binding, the address leaves the interface, the client is gone.
    c.release(Duration::from_secs(10));
    kea_logged(&kea, "DHCP6_RELEASE_NA", Duration::from_secs(5));
    wait_addresses(&l, &[]);
    assert!(c.exited());
}

#[test]
fn harness_dhclient6_rebinds_when_the_server_changes_identity() {
    let l = link(MAC_1);
    let first = kea_config();
    let mut kea = Kea6::start(&l.srv, &first);
    let c = Client6::dhclient(&l.vm, "eth0", Options6::default());
    let bound = c.wait_lease("BOUND6", 0, BIND);
    assert_eq!(bound.server_id, first.server_duid());

    // Another server (another DUID) takes over before T1: it drops the RENEW that names the
    // first one, and answers the REBIND the client sends at T2 to any server.
    kea.stop();
    let mut second = kea_config();
    second.server_identifier = "766d646863700002".to_owned();
    let kea = Kea6::start(&l.srv, &second);
    let rebound = c.wait_lease("REBIND6", 0, BIND);
    assert_eq!(rebound.address, reserved());
    assert_eq!(rebound.server_id, second.server_duid());
    let names = c.event_names();
    let rebind = names.iter().position(|e| e == "REBIND6").unwrap();
    assert!(
        !names[..rebind].iter().any(|e| e == "RENEW6"),
        "no RENEW may have been answered: {names:?}"
    );
    let log = c.log();
    assert!(log.contains("XMT: Forming Renew"), "{log}");
    assert!(log.contains("XMT: Forming Rebind"), "{log}");
    assert!(!kea.lines("DHCP6_", "fd76:6d64:6863::10").is_empty());
}

#[test]
fn harness_dhcpcd_gets_renews_and_releases_a_kea_reservation() {
    let l = link(MAC_1);
    let config = kea_config();
    let kea = Kea6::start(&l.srv, &config);
    let mut c = Client6::dhcpcd(&l.vm, "eth0", Options6::default());

    // DHCPv6 at once, without a Router Advertisement.
    assert_the_reservation(&c.wait_lease("BOUND6", 0, BIND), &config);
    // dhcpcd applies the address itself.
    wait_addresses(&l, &[reserved()]);
    kea_logged(
        &kea,
        "ALLOC_ENGINE_V6_HR_ADDR_GRANTED",
        Duration::from_secs(1),
    );
    renews_then_releases(&l, &kea, &mut c);
}

#[test]
fn harness_kea_without_a_pool_gives_an_unknown_client_no_address() {
    let l = link(STRANGER);
    let kea = Kea6::start(&l.srv, &kea_config());
    // The stranger's DUID (DUID-LLT from dhclient, DUID-LL from dhcpcd) ends with its MAC.
    let duid_tail = "00:00:ff:ff]";
    let failures = || kea.lines("ALLOC_ENGINE_V6_ALLOC_FAIL", duid_tail).len();

    for start in [Client6::dhclient, Client6::dhcpcd] {
        let before = failures();
        let c = start(&l.vm, "eth0", Options6::default());
        // Kea heard the client's SOLICITs and had no address for it, twice: the client had
        // every chance to take an address that was offered.
        kea.wait_log("ALLOC_ENGINE_V6_ALLOC_FAIL", duid_tail, before + 2, BIND);
        let names = c.event_names();
        assert!(
            !names.iter().any(|e| e == "BOUND6"),
            "{:?}: {names:?}",
            c.kind()
        );
        assert_eq!(
            global_addresses(&l.lab, &l.vm, "eth0"),
            Vec::<Ipv6Addr>::new()
        );
        assert!(kea.lines("DHCP6_LEASE_ALLOC", duid_tail).is_empty());
    }
}

#[test]
fn harness_rapid_commit_and_information_request_with_kea() {
    let l = link(MAC_1);
    let kea = Kea6::start(&l.srv, &kea_config());
    let rapid = Options6 {
        rapid_commit: true,
        ..Options6::default()
    };

    // dhclient: SOLICIT with Rapid Commit, answered by REPLY; no REQUEST.
    let mut c = Client6::dhclient(&l.vm, "eth0", rapid.clone());
    let bound = c.wait_lease("BOUND6", 0, BIND);
    assert_eq!(bound.address, reserved());
    let log = c.log();
    assert!(!log.contains("XMT: Forming Request"), "{log}");
    assert!(
        std::fs::read_to_string(c.dir().join("dhclient.leases"))
            .unwrap()
            .contains("option dhcp6.rapid-commit;")
    );
    // Released, or Kea would keep the address bound to this client's DUID and refuse it to
    // the next client's.
    c.release(Duration::from_secs(10));

    // dhcpcd, the same.
    let mut c = Client6::dhcpcd(&l.vm, "eth0", rapid);
    let bound = c.wait_lease("BOUND6", 0, BIND);
    assert_eq!(bound.address, reserved());
    let log = c.log();
    assert!(!log.contains("REQUEST6"), "{log}");
    c.release(Duration::from_secs(10));

    // INFORMATION-REQUEST (dhclient -S): the options, no address.
    let c = Client6::dhclient(
        &l.vm,
        "eth0",
        Options6 {
            information_only: true,
            ..Options6::default()
        },
    );
    let informed = c.wait_event("RENEW6", 0, BIND);
    assert!(!informed.contains_key("new_ip6_address"), "{informed:?}");
    assert_eq!(
        informed["new_dhcp6_name_servers"],
        "fd76:6d64:6863::53 fd76:6d64:6863::54"
    );
    let log = c.log();
    assert!(log.contains("XMT: Forming Info-Request"), "{log}");
    assert_eq!(
        global_addresses(&l.lab, &l.vm, "eth0"),
        Vec::<Ipv6Addr>::new()
    );
    drop(kea);
}

#[test]
fn harness_radvd_flags_start_dhcpcd_stateful_or_information_only_without_slaac() {
    let l = link(MAC_1);
    let _kea = Kea6::start(&l.srv, &kea_config());
    let radvd = Radvd::start(&l.srv, &RadvdConfig::managed("srv0", PREFIX));

    // dhcpcd as a VM runs it: DHCPv6 only once an RA says Managed.
    let c = Client6::dhcpcd(
        &l.vm,
        "eth0",
        Options6 {
            wait_for_ra: true,
            ..Options6::default()
        },
    );
    let bound = c.wait_lease("BOUND6", 0, BIND);
    assert_eq!(bound.address, reserved());
    let names = c.event_names();
    let ra = names.iter().position(|e| e == "ROUTERADVERT");
    let dhcp = names.iter().position(|e| e == "BOUND6");
    assert!(ra.is_some() && ra < dhcp, "{names:?}\n{}", radvd.log());
    // The prefix is on-link but not autonomous: the leased address is the only global one.
    wait_addresses(&l, &[reserved()]);
    drop(c);
    drop(radvd);

    // Other without Managed: dhcpcd asks with INFORMATION-REQUEST, for options only (its hook
    // sees INFORM6).
    let mut other = RadvdConfig::managed("srv0", PREFIX);
    other.managed = false;
    let _radvd = Radvd::start(&l.srv, &other);
    let c = Client6::dhcpcd(
        &l.vm,
        "eth0",
        Options6 {
            information_only: true,
            ..Options6::default()
        },
    );
    let informed = c.wait_event("INFORM6", 0, BIND);
    assert!(
        !informed.contains_key("new_dhcp6_ia_na1_ia_addr1"),
        "{informed:?}"
    );
    assert_eq!(
        informed["new_dhcp6_name_servers"],
        "fd76:6d64:6863::53 fd76:6d64:6863::54"
    );
    assert_eq!(
        global_addresses(&l.lab, &l.vm, "eth0"),
        Vec::<Ipv6Addr>::new()
    );
}
