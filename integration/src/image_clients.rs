//! The DHCP clients cloud images run, started in a VM namespace as a guest runs them, with what
//! they learned readable by the test: systemd-networkd (Debian and Ubuntu cloud images) and
//! NetworkManager with its internal client (RHEL, Fedora, SUSE) here; ISC `dhclient`, `dhcpcd`
//! and busybox `udhcpc` live in [`crate::dhcp_client`].
//!
//! systemd-networkd runs without systemd as PID 1 or a D-Bus system bus (it logs that and goes
//! on), under its own `systemd-network` user, with its configuration, state and lease files in a
//! directory of the test bind-mounted over `/run` in its own mount namespace (`ip netns exec`
//! gives each command one, so nothing of it shows on the host and it all goes when it exits).
//! Two facts make it run in a namespace: it waits for udev to initialise a link unless `/sys` is
//! read-only (systemd's rule for containers, which have no udev), so `/sys` is bound read-only
//! there; and it manages every link it sees, which in a VM namespace is `eth0` and `lo`.
//!
//! NetworkManager needs a D-Bus system bus: each instance gets a private `dbus-daemon` whose
//! socket is a file of the test directory (so `nmcli` reaches it from the host), and its state,
//! configuration and host name (a UTS namespace of its own) stay in its mount namespace. The
//! same read-only `/sys` makes it enumerate links without udev.
//!
//! Test set-up: a failure to write the lab's files is the test's failure, so it panics.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::netns::{Lab, Netns};

/// What the `.network` file asks of networkd: DHCPv4 on `eth0` with the MTU and search domains
/// applied, no IPv6, no link-local fallback, and the host name recorded but not set (setting it
/// would go through `systemd-hostnamed`, which does not run here).
const NETWORK: &str = "[Match]\nName=eth0\n\n[Network]\nDHCP=ipv4\nLinkLocalAddressing=no\n\
IPv6AcceptRA=no\n\n[DHCPv4]\nUseMTU=yes\nUseDomains=yes\nUseHostname=no\n";

/// A systemd-networkd on one VM namespace's `eth0`; stopped with the [`Lab`] it was spawned in.
pub struct Networkd {
    dir: PathBuf,
}

impl Networkd {
    /// Starts systemd-networkd on `vm`'s `eth0`, its `/run` in `dir/run` and its debug log in
    /// `dir/networkd.log`.
    pub fn start(lab: &mut Lab, vm: &Netns, dir: &Path) -> Networkd {
        let run = dir.join("run");
        fs::create_dir_all(run.join("systemd/network")).unwrap();
        fs::create_dir_all(run.join("systemd/netif")).unwrap();
        fs::write(run.join("systemd/network/10-eth0.network"), NETWORK).unwrap();
        let script = format!(
            "mount --bind {run} /run && chown -R systemd-network:systemd-network /run/systemd/netif \
             && mount -o remount,bind,ro /sys && SYSTEMD_LOG_LEVEL=debug exec /lib/systemd/systemd-networkd",
            run = run.display()
        );
        lab.spawn_logged(vm, &["sh", "-c", &script], &dir.join("networkd.log"))
            .unwrap();
        Networkd {
            dir: dir.to_owned(),
        }
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("networkd.log")).unwrap_or_default()
    }

    /// The DHCPv4 lease it holds, as it saved it (`ADDRESS`, `ROUTER`, `DNS`, `DOMAINNAME`,
    /// `HOSTNAME`, `MTU`, `CLASSLESS_ROUTES`, …); empty until it has one.
    pub fn lease(&self) -> BTreeMap<String, String> {
        let leases = self.dir.join("run/systemd/netif/leases");
        let Some(file) = fs::read_dir(leases)
            .ok()
            .and_then(|mut d| d.find_map(|e| e.ok()))
        else {
            return BTreeMap::new();
        };
        fs::read_to_string(file.path())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    /// How many ACKs it has taken (the first, then one per renewal or rebinding).
    pub fn acks(&self) -> usize {
        self.log().matches("DHCPv4 client: ACK").count()
    }
}

/// NetworkManager's configuration: the internal DHCP client, only `eth0` managed, nothing
/// written to the system's resolv.conf, everything logged (DHCP at trace level) to stderr.
const NM_CONF: &str = "[main]\nplugins=keyfile\ndhcp=internal\nno-auto-default=*\n\
auth-polkit=false\nrc-manager=unmanaged\n\n[keyfile]\nunmanaged-devices=except:interface-name:eth0\n\n\
[logging]\nlevel=DEBUG\ndomains=ALL,DHCP4:TRACE\n";

/// The connection a cloud image's NetworkManager makes of its NIC: DHCPv4, no IPv6.
const NM_CONNECTION: &str = "[connection]\nid=eth0\ntype=ethernet\ninterface-name=eth0\n\
autoconnect=true\n\n[ethernet]\n\n[ipv4]\nmethod=auto\n\n[ipv6]\nmethod=disabled\n";

/// NetworkManager (its internal DHCP client) on one VM namespace's `eth0`, with its private
/// D-Bus; both stopped with the [`Lab`] they were spawned in.
pub struct NetworkManager {
    dir: PathBuf,
}

impl NetworkManager {
    /// Starts a private `dbus-daemon` and NetworkManager on `vm`'s `eth0`; their files and logs
    /// in `dir` (`nm.log`, `dbus.sock`).
    pub fn start(lab: &mut Lab, vm: &Netns, dir: &Path) -> NetworkManager {
        let etc = dir.join("etc-nm");
        fs::create_dir_all(etc.join("system-connections")).unwrap();
        fs::create_dir_all(etc.join("conf.d")).unwrap();
        fs::write(etc.join("NetworkManager.conf"), NM_CONF).unwrap();
        let connection = etc.join("system-connections/eth0.nmconnection");
        fs::write(&connection, NM_CONNECTION).unwrap();
        // NetworkManager ignores a keyfile others can read.
        fs::set_permissions(&connection, fs::Permissions::from_mode(0o600)).unwrap();
        fs::write(dir.join("hostname"), "").unwrap();
        let bus = format!("unix:path={}", dir.join("dbus.sock").display());
        fs::write(
            dir.join("dbus.conf"),
            format!(
                "<!DOCTYPE busconfig PUBLIC \"-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN\"\n \
                 \"http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd\">\n<busconfig>\n\
                 <type>system</type>\n<listen>{bus}</listen>\n<auth>EXTERNAL</auth>\n\
                 <policy context=\"default\"><allow user=\"root\"/><allow own=\"*\"/>\
                 <allow send_destination=\"*\"/><allow receive_sender=\"*\"/></policy>\n</busconfig>\n"
            ),
        )
        .unwrap();
        let p = |name: &str| dir.join(name).display().to_string();
        // Its own /run, state and config; no static host name, so it takes the lease's (in its
        // own UTS namespace).
        let script = format!(
            "mount --make-rprivate / && mount -o remount,bind,ro /sys && \
             mount -t tmpfs nm-run /run && mount -t tmpfs nm-lib /var/lib/NetworkManager && \
             mount --bind {etc} /etc/NetworkManager && mount --bind {hostname} /etc/hostname && \
             hostname localhost && \
             (dbus-daemon --config-file={conf} --nofork --nopidfile > {dbus_log} 2>&1 &) && \
             for i in $(seq 50); do [ -S {sock} ] && break; sleep 0.1; done && \
             echo $$ > {pid} && DBUS_SYSTEM_BUS_ADDRESS={bus} exec NetworkManager --debug",
            pid = p("nm.pid"),
            etc = etc.display(),
            hostname = p("hostname"),
            conf = p("dbus.conf"),
            dbus_log = p("dbus.log"),
            sock = p("dbus.sock"),
        );
        let argv = ["unshare", "--uts", "--", "sh", "-c", &script];
        lab.spawn_logged(vm, &argv, &dir.join("nm.log")).unwrap();
        NetworkManager {
            dir: dir.to_owned(),
        }
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("nm.log")).unwrap_or_default()
    }

    /// The options of the last lease it took (`ip_address`, `routers`, `domain_name_servers`,
    /// `domain_name`, `host_name`, `interface_mtu`, `rfc3442_classless_static_routes`, …), as it
    /// logs them; empty until it has one.
    pub fn lease(&self) -> BTreeMap<String, String> {
        let log = self.log();
        let Some((_, last)) = log.rsplit_once("state changed new lease") else {
            return BTreeMap::new();
        };
        last.lines()
            .filter_map(|l| l.split_once("dhcp4 (eth0): option ")?.1.split_once("=>"))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().trim_matches('\'').to_owned()))
            .collect()
    }

    /// How many ACKs it has taken (the first, then one per renewal or rebinding).
    pub fn acks(&self) -> usize {
        self.log().matches("event: received ACK").count()
    }

    /// How many DISCOVERs it has sent (one to start; more only when it starts over).
    pub fn discovers(&self) -> usize {
        self.log().matches("event: send DISCOVER").count()
    }

    /// Its host name now, which it takes from the lease (option 12).
    pub fn host_name(&self) -> Option<String> {
        let pid = fs::read_to_string(self.dir.join("nm.pid")).ok()?;
        let out = std::process::Command::new("nsenter")
            .args(["-t", pid.trim(), "-u", "hostname"])
            .output()
            .ok()?;
        Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }
}
