//! The DHCP clients cloud images run, started in a VM namespace as a guest runs them, with what
//! they learned readable by the test: systemd-networkd (Debian and Ubuntu cloud images) here;
//! ISC `dhclient`, `dhcpcd` and busybox `udhcpc` live in [`crate::dhcp_client`].
//!
//! systemd-networkd runs without systemd as PID 1 or a D-Bus system bus (it logs that and goes
//! on), under its own `systemd-network` user, with its configuration, state and lease files in a
//! directory of the test bind-mounted over `/run` in its own mount namespace (`ip netns exec`
//! gives each command one, so nothing of it shows on the host and it all goes when it exits).
//! Two facts make it run in a namespace: it waits for udev to initialise a link unless `/sys` is
//! read-only (systemd's rule for containers, which have no udev), so `/sys` is bound read-only
//! there; and it manages every link it sees, which in a VM namespace is `eth0` and `lo`.
//!
//! Test set-up: a failure to write the lab's files is the test's failure, so it panics.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;

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
        let log = fs::File::create(dir.join("networkd.log")).unwrap();
        let script = format!(
            "mount --bind {run} /run && chown -R systemd-network:systemd-network /run/systemd/netif \
             && mount -o remount,bind,ro /sys && SYSTEMD_LOG_LEVEL=debug exec /lib/systemd/systemd-networkd",
            run = run.display()
        );
        let mut cmd = vm.command("sh");
        cmd.args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        lab.spawn(cmd).unwrap();
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
