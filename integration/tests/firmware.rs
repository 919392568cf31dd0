//! A firmware client against the agent, in a real VM: QEMU (TCG, no KVM needed) boots a guest
//! whose NIC runs Debian's iPXE ROM, from a tap port on a bridge wired to the interface the
//! agent (`serve-static`) serves a dual-stack pool with boot settings on. iPXE asks for its
//! address over DHCPv4 (and, told so by the pool's Router Advertisements, DHCPv6), fetches the
//! script the pool names for iPXE from an HTTP server in the lab, and runs it: the script prints
//! a marker with the address it got on the serial console and fetches one more URL, so both the
//! console and the HTTP server's log show the chain ended at the script.
//!
//! Addresses are TEST-NET and ULA prefixes that exist only in the namespaces the test creates;
//! QEMU runs under a deadline and is killed with the lab on every exit path.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::fs;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use vmdhcp_integration::dhcp_client::wait_for;
use vmdhcp_integration::dhcp6_client::no_dad;
use vmdhcp_integration::static_agent::{pool, rig};

/// The guest's NIC.
const MAC: &str = "52:54:00:12:34:56";
/// Its reservation.
const IP: &str = "192.0.2.10";
const IPV6: &str = "fd76:6d64:6869::10";
/// Debian's iPXE ROM for a virtio NIC (package `ipxe-qemu`).
const ROM: &str = "/usr/lib/ipxe/qemu/pxe-virtio.rom";
/// The HTTP server in the agent's namespace.
const WWW: &str = "http://192.0.2.1:8080";
/// How long the boot may take: about 1 s on an idle machine, 20 s when iPXE waits out its
/// IPv6 configuration.
const BOOT: Duration = Duration::from_secs(90);

/// iPXE's script: prints the marker with what DHCP gave it, then fetches `/done`, which the
/// HTTP log shows, and reboots, which ends QEMU (`-no-reboot`). Debian's iPXE has no
/// `poweroff`.
const SCRIPT: &str = "#!ipxe\n\
    echo VMDHCP-CHAIN-OK ${net0/ip} ${filename} ${next-server}\n\
    imgfetch http://192.0.2.1:8080/done?ip=${net0/ip}&mac=${net0/mac} ||\n\
    reboot\n";

#[test]
fn ipxe_firmware_gets_its_reservation_and_boot_options_and_the_chain_ends_at_the_script() {
    for (what, path) in [
        ("qemu-system-x86_64", "/usr/bin/qemu-system-x86_64"),
        ("Debian's iPXE ROM", ROM),
    ] {
        assert!(
            Path::new(path).exists(),
            "{what} ({path}) is missing: scripts/install-deps.sh installs qemu-system-x86"
        );
    }
    let mut rig = rig();
    no_dad(&rig.lab, &rig.srv);
    // The guest's side: a bridge with the agent's link and QEMU's tap port on it.
    let fw = rig.lab.netns("fw").unwrap();
    no_dad(&rig.lab, &fw);
    rig.lab.bridge(&fw, "br0").unwrap();
    rig.lab.plug(&fw, "br0", "up0", &rig.srv, "srv0").unwrap();
    for args in [
        &["tuntap", "add", "tap0", "mode", "tap"][..],
        &["link", "set", "tap0", "master", "br0"],
        &["link", "set", "tap0", "up"],
    ] {
        rig.lab.exec(&fw, "ip", args).unwrap();
    }

    let mut p = pool(
        "fw",
        "srv0",
        "192.0.2.1",
        "192.0.2.0/24",
        json!({
            "router": "192.0.2.254",
            "lease_seconds": 600,
            // Firmware that is not iPXE would load iPXE; iPXE gets its script.
            "boot": {
                "next_server": "192.0.2.1",
                "bios_file": "undionly.kpxe",
                "ipxe_script_url": format!("{WWW}/boot.ipxe"),
            },
            "ipv6": {
                "server_ip": "fd76:6d64:6869::1", "subnet": "fd76:6d64:6869::/112",
                "dns": [], "lease_seconds": 600, "router_advertisements": true,
            },
        }),
    );
    p["leases"] = json!([{"mac": MAC, "ip": IP, "ipv6": IPV6}]);
    rig.start_with(&[p], &["--configure-interfaces"]);
    rig.wait_serving(&["srv0"]);

    let www = rig.dir.path().join("www");
    fs::create_dir_all(&www).unwrap();
    fs::write(www.join("boot.ipxe"), SCRIPT).unwrap();
    let http_log = rig.dir.path().join("http.log");
    let mut http = rig.srv.command("timeout");
    http.args([
        "120",
        "python3",
        "-u",
        "-m",
        "http.server",
        "8080",
        "--directory",
    ])
    .arg(&www)
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(fs::File::create(&http_log).unwrap());
    rig.lab.spawn(http).unwrap();
    wait_for("the HTTP server", Duration::from_secs(10), || {
        let (status, _) = vmdhcp_integration::dhcp_client::try_http_get(
            &rig.lab,
            &rig.srv,
            &format!("{WWW}/boot.ipxe"),
        )?;
        (status == 200).then_some(())
    });

    // SeaBIOS copies its console and iPXE's to the serial port only without graphics.
    let serial = rig.dir.path().join("serial.log");
    let mut qemu = fw.command("timeout");
    qemu.args([
        &BOOT.as_secs().to_string(),
        "qemu-system-x86_64",
        "-machine",
        "pc,graphics=off",
        "-accel",
        "tcg",
        "-m",
        "32",
        "-nodefaults",
        "-display",
        "none",
        "-serial",
        &format!("file:{}", serial.display()),
        "-netdev",
        "tap,id=n0,ifname=tap0,script=no,downscript=no",
        "-device",
        // Debian's virtio ROMs are built for the modern device (1af4:1041); SeaBIOS loads a ROM
        // only onto a device of its exact ID.
        &format!("virtio-net-pci,disable-legacy=on,netdev=n0,mac={MAC},romfile={ROM},bootindex=1"),
        "-boot",
        "strict=on,reboot-timeout=0",
        "-no-reboot",
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(fs::File::create(rig.dir.path().join("qemu.log")).unwrap());
    rig.lab.spawn(qemu).unwrap();

    let console = || fs::read_to_string(&serial).unwrap_or_default();
    let http = || fs::read_to_string(&http_log).unwrap_or_default();
    let shown = |what: &str| {
        format!(
            "{what}\n--- serial console:\n{}\n--- HTTP log:\n{}\n--- agent log:\n{}",
            console(),
            http(),
            rig.agent_log()
        )
    };
    let marker = format!("VMDHCP-CHAIN-OK {IP} {WWW}/boot.ipxe 192.0.2.1");
    let seen = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for("the script's marker on the serial console", BOOT, || {
            console().contains(&marker).then_some(())
        });
        wait_for(
            "the script's fetch in the HTTP log",
            Duration::from_secs(10),
            || {
                http()
                    .contains(&format!("GET /done?ip={IP}&mac="))
                    .then_some(())
            },
        );
    }));
    if seen.is_err() {
        panic!("{}", shown("the boot chain did not end at the script"));
    }
    let log = http();
    // iPXE was handed its script, never the BIOS file that would load iPXE again.
    assert!(
        log.contains("GET /boot.ipxe"),
        "{}",
        shown("no script fetch")
    );
    assert!(
        !log.contains("undionly"),
        "{}",
        shown("iPXE loaded itself again")
    );
    // And got its IPv6 address over DHCPv6 from the same agent.
    assert!(
        console().contains(&format!("net0: {IPV6}/112")),
        "{}",
        shown("no DHCPv6 address")
    );
}
