//! Real DHCPv6 clients, and the reference servers they are checked against, in network
//! namespaces a test created: ISC `dhclient -6` and `dhcpcd` (Debian's `dhcpcd-base`) asking for
//! a stateful address (IA_NA), `kea-dhcp6` (Debian's `kea-dhcp6-server`) with host reservations
//! by hardware address, and `radvd` standing for a network's router.
//!
//! Every process runs under [`crate::process::Supervised`], so it is stopped when its handle
//! drops, when the test panics and when the test process itself is killed; a client is first
//! asked to stop the way a VM's shutdown would (SIGTERM, no RELEASE), then killed. Files (config,
//! lease file, logs, the events the hook recorded) live in a temporary directory of the handle.
//!
//! What each client is told, and why (checked against the man pages of the versions Debian 12
//! ships, dhclient 4.4.3 and dhcpcd 9.4):
//!
//! - `dhclient -6 -d -v -cf CONF -lf LEASES -pf PID -sf HOOK IFACE`: stateful IA_NA (its default
//!   without `-S`/`-T`/`-P`), DUID-LLT built from the interface's MAC (`-D LL` for DUID-LL).
//!   Rapid Commit is not a flag (`-R` means "require every IA asked for"): `send
//!   dhcp6.rapid-commit;` in the config file makes it send the option and accept a REPLY to its
//!   SOLICIT. `-S` asks with INFORMATION-REQUEST only (its REPLY reaches the hook as `RENEW6`
//!   with no address). `-r` (same `-pf`/`-lf`) stops the running client and sends RELEASE.
//!   Started again on a lease file that holds an active lease, it sends CONFIRM first ("Confirming
//!   active lease (INIT-REBOOT)"), then reports `BOUND6`.
//! - `dhcpcd -6 -B -d -f CONF -c HOOK IFACE` with `ipv6only`, `noipv6rs`, `duid ll` and
//!   `ia_na` on the interface: DHCPv6 starts at once, without waiting for a Router Advertisement
//!   with the Managed flag (with `ipv6rs` kept on, it waits for one: see [`Radvd`]). It applies
//!   the address itself; SIGUSR1 renews now, SIGALRM releases and exits, SIGTERM exits without
//!   releasing. Its lease database (`/var/lib/dhcpcd`) is a directory of the handle, bind-mounted
//!   in the client's own mount namespace (`ip netns exec` gives each command one), so a restart
//!   finds its lease and nothing is left on the host; `/run` is a private tmpfs.
//!
//! The hook both clients call records each event's whole environment, one file per event, in
//! the format [`crate::dhcp_client::events`] reads; for dhclient it also applies the address
//! (as Debian's `dhclient-script` does, as a /128 unless the server's prefix length is given), so
//! the address is on the interface when the test sees the event. [`Lease6`] reads the two
//! clients' variables into one shape.
//!
//! DHCPv6 clients send from their link-local address, which must not be tentative: call
//! [`no_dad`] on a namespace before its links are made, then [`wait_link_local`].
//!
//! These helpers fail the calling test on any error: they are test code, not product code.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::collections::BTreeMap;
use std::fs;
use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::dhcp_client::{events, wait_for};
use crate::netns::{Lab, Netns};
use crate::process::Supervised;

/// Turns duplicate address detection off in `ns`, for every interface made from now on (and
/// those already there), so link-local and leased addresses are usable at once. Call it before
/// the namespace's links are created: a link already up has started DAD on its link-local
/// address.
pub fn no_dad(lab: &Lab, ns: &Netns) {
    lab.exec(
        ns,
        "sysctl",
        &[
            "-qw",
            "net.ipv6.conf.all.accept_dad=0",
            "net.ipv6.conf.default.accept_dad=0",
        ],
    )
    .unwrap();
}

/// Gives `ifname` in `ns` the MAC `mac` with the link down, then brings it up again, so its
/// link-local address (EUI-64) is derived from the new MAC, as a VM's NIC's is.
pub fn set_mac(lab: &Lab, ns: &Netns, ifname: &str, mac: &str) {
    lab.exec(ns, "ip", &["link", "set", ifname, "down"])
        .unwrap();
    lab.exec(ns, "ip", &["link", "set", ifname, "address", mac])
        .unwrap();
    lab.exec(ns, "ip", &["link", "set", ifname, "up"]).unwrap();
}

/// Adds `addr/len` to `ifname` in `ns` without duplicate address detection.
pub fn add_address(lab: &Lab, ns: &Netns, ifname: &str, cidr: &str) {
    lab.exec(
        ns,
        "ip",
        &["-6", "addr", "add", cidr, "dev", ifname, "nodad"],
    )
    .unwrap();
}

/// `ifname`'s IPv6 addresses of `scope` (`link`, `global`) in `ns`, with whether each is still
/// tentative (duplicate address detection not done) or failed it.
pub fn addresses(lab: &Lab, ns: &Netns, ifname: &str, scope: &str) -> Vec<(Ipv6Addr, String)> {
    let out = lab
        .exec(
            ns,
            "ip",
            &["-6", "-o", "addr", "show", "dev", ifname, "scope", scope],
        )
        .unwrap_or_default();
    out.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            words.find(|w| *w == "inet6")?;
            let addr = words.next()?.split('/').next()?.parse().ok()?;
            let flags = ["tentative", "dadfailed"]
                .into_iter()
                .filter(|f| line.contains(f))
                .collect::<Vec<_>>()
                .join(",");
            Some((addr, flags))
        })
        .collect()
}

/// `ifname`'s global IPv6 addresses in `ns` (leased ones among them).
pub fn global_addresses(lab: &Lab, ns: &Netns, ifname: &str) -> Vec<Ipv6Addr> {
    addresses(lab, ns, ifname, "global")
        .into_iter()
        .map(|(a, _)| a)
        .collect()
}

/// Waits until `ifname` in `ns` has a usable (not tentative) link-local address; returns it.
pub fn wait_link_local(lab: &Lab, ns: &Netns, ifname: &str, limit: Duration) -> Ipv6Addr {
    wait_for(
        &format!("a usable link-local address on {ifname} in {}", ns.name()),
        limit,
        || {
            addresses(lab, ns, ifname, "link")
                .into_iter()
                .find(|(_, flags)| flags.is_empty())
                .map(|(a, _)| a)
        },
    )
}

/// A DUID or other identifier as lowercase hex without separators: dhclient prints them as
/// `0:1:0:1:…` (each byte without its leading zero), dhcpcd and Kea as `00010001…` or
/// `00:01:00:01:…`.
pub fn hex_id(text: &str) -> String {
    if text.contains(':') {
        text.split(':')
            .map(|b| format!("{:0>2}", b.to_ascii_lowercase()))
            .collect()
    } else {
        text.to_ascii_lowercase()
    }
}

/// One address lease as a client's hook saw it, the same for both clients.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease6 {
    /// The IA_NA address.
    pub address: Ipv6Addr,
    /// T1 (renew) in seconds.
    pub t1: u32,
    /// T2 (rebind) in seconds.
    pub t2: u32,
    /// Preferred lifetime in seconds.
    pub preferred: u32,
    /// Valid lifetime in seconds.
    pub valid: u32,
    /// The server's DUID, as [`hex_id`].
    pub server_id: String,
    /// DNS servers (option 23), in order.
    pub dns: Vec<Ipv6Addr>,
}

impl Lease6 {
    /// The lease an event's environment describes (dhclient's `new_ip6_address`, … or dhcpcd's
    /// `new_dhcp6_ia_na1_ia_addr1`, …); `None` when it has no address (an INFORMATION-REQUEST's
    /// reply, a release).
    pub fn from_event(env: &BTreeMap<String, String>) -> Option<Lease6> {
        let get = |k: &str| env.get(k).map(String::as_str);
        let num = |k: &str| get(k).and_then(|v| v.parse().ok()).unwrap_or(0);
        let (address, t1, t2, preferred, valid) = if let Some(a) = get("new_ip6_address") {
            (
                a,
                num("new_renew"),
                num("new_rebind"),
                num("new_preferred_life"),
                num("new_max_life"),
            )
        } else {
            (
                get("new_dhcp6_ia_na1_ia_addr1")?,
                num("new_dhcp6_ia_na1_t1"),
                num("new_dhcp6_ia_na1_t2"),
                num("new_dhcp6_ia_na1_ia_addr1_pltime"),
                num("new_dhcp6_ia_na1_ia_addr1_vltime"),
            )
        };
        Some(Lease6 {
            address: address.parse().ok()?,
            t1,
            t2,
            preferred,
            valid,
            server_id: hex_id(get("new_dhcp6_server_id").unwrap_or_default()),
            dns: get("new_dhcp6_name_servers")
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|a| a.parse().ok())
                .collect(),
        })
    }
}

/// The hook both clients run: applies dhclient's address (dhcpcd applies its own and passes no
/// `new_ip6_address`) and removes it when dhclient gives it up, then records the whole
/// environment, one file per event, numbered in order. Given a `dad_wait_time` (dhclient's
/// `--dad-wait-time`), it waits that long at most for the added address to leave `tentative`;
/// an address the kernel deleted or flagged `dadfailed` makes it exit 3 (dhclient DECLINEs).
fn hook_script(dir: &Path) -> PathBuf {
    let path = dir.join("hook6.sh");
    let events = dir.join("events");
    fs::create_dir_all(&events).unwrap();
    fs::write(
        &path,
        format!(
            r#"#!/bin/sh
ev="${{reason:-unknown}}"
case "$ev" in
  BOUND6|RENEW6|REBIND6)
    if [ -n "$new_ip6_address" ]; then
      ip -6 addr replace "$new_ip6_address/${{new_ip6_prefixlen:-128}}" dev "$interface" \
        scope global valid_lft "${{new_max_life:-forever}}" preferred_lft "${{new_preferred_life:-forever}}"
      if [ "${{dad_wait_time:-0}}" -gt 0 ]; then
        i=0
        while [ "$i" -lt $((dad_wait_time * 10)) ]; do
          st=$(ip -6 addr show dev "$interface" to "$new_ip6_address")
          case "$st" in *tentative*) ;; *) break ;; esac
          sleep 0.1; i=$((i + 1))
        done
        case "$st" in
          ""|*dadfailed*) export dad_result=failed; status=3 ;;
          *) export dad_result=passed ;;
        esac
      fi
    fi ;;
  DEPREF6)
    [ -n "$cur_ip6_address" ] && ip -6 addr change "$cur_ip6_address/${{cur_ip6_prefixlen:-128}}" \
      dev "$interface" preferred_lft 0 ;;
  EXPIRE6|RELEASE6|STOP6)
    [ -n "$old_ip6_address" ] && ip -6 addr del "$old_ip6_address/${{old_ip6_prefixlen:-128}}" dev "$interface" ;;
esac
n=$(ls {events} | wc -l)
env > {events}/tmp.$$
mv {events}/tmp.$$ {events}/$(printf %04d "$n")-"$ev"
exit "${{status:-0}}"
"#,
            events = events.display()
        ),
    )
    .unwrap();
    let ok = Command::new("chmod")
        .args(["+x", path.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(ok.success());
    path
}

/// Stops a supervised process the way a shutdown would: SIGTERM, up to 5 s to exit (daemons with
/// helper processes, as dhcpcd and radvd have, stop them first), then killed regardless.
fn terminate(proc: &mut Option<Supervised>) {
    if let Some(p) = proc.as_ref()
        && !p.exited()
    {
        p.signal("TERM");
        let deadline = Instant::now() + Duration::from_secs(5);
        while !p.exited() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    if let Some(mut p) = proc.take() {
        p.stop();
    }
}

/// Which real client a [`Client6`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// ISC `dhclient -6`.
    Dhclient,
    /// `dhcpcd -6`.
    Dhcpcd,
}

/// How a [`Client6`] asks.
#[derive(Clone, Debug, Default)]
pub struct Options6 {
    /// Sends Rapid Commit in its SOLICIT (dhclient: `send dhcp6.rapid-commit;`; dhcpcd:
    /// `option dhcp6_rapid_commit`), so a server that allows it answers with REPLY at once.
    pub rapid_commit: bool,
    /// INFORMATION-REQUEST only, no address (dhclient `-S`, at once; dhcpcd: no `ia_na`, which
    /// it asks only once a Router Advertisement with the Other flag and without Managed
    /// arrives, so this implies [`Options6::wait_for_ra`] for it).
    pub information_only: bool,
    /// dhcpcd only: start DHCPv6 when a Router Advertisement with the Managed flag arrives
    /// (dhcpcd's default), instead of at once.
    pub wait_for_ra: bool,
    /// dhclient only: a DUID-LL (`-D LL`) instead of its default DUID-LLT.
    pub duid_ll: bool,
    /// dhclient only: `--dad-wait-time` seconds. The hook then waits, as ISC's own Linux
    /// script does, for duplicate address detection of the address it adds; if that fails (the
    /// kernel deletes the address, or flags it `dadfailed`) it exits 3, which makes dhclient
    /// DECLINE the address. Its event then has `dad_result=failed`.
    pub dad_wait_seconds: Option<u32>,
    /// dhcpcd only: sends Reconfigure Accept (`option dhcp6_reconfigure_accept`), so a server
    /// that supports it hands over a reconfigure key and may send RECONFIGURE.
    pub reconfigure_accept: bool,
    /// dhclient only: lines appended to its config (a later `request` replaces the default
    /// one).
    pub dhclient_conf: String,
}

/// A real DHCPv6 client on one interface of a namespace; stopped (SIGTERM, then killed) when
/// dropped.
pub struct Client6 {
    kind: Kind,
    ns: Netns,
    ifname: String,
    options: Options6,
    proc: Option<Supervised>,
    starts: usize,
    dir: tempfile::TempDir,
}

/// The options both clients ask for: DNS servers (23) and the domain search list (24).
const DHCLIENT6_REQUEST: &str = "request dhcp6.name-servers, dhcp6.domain-search;\n";

impl Client6 {
    /// Starts ISC `dhclient -6` on `ifname` of `ns`.
    pub fn dhclient(ns: &Netns, ifname: &str, options: Options6) -> Self {
        Client6::start(Kind::Dhclient, ns, ifname, options)
    }

    /// Starts `dhcpcd -6` on `ifname` of `ns`.
    pub fn dhcpcd(ns: &Netns, ifname: &str, options: Options6) -> Self {
        Client6::start(Kind::Dhcpcd, ns, ifname, options)
    }

    /// Starts a `kind` client on `ifname` of `ns`.
    pub fn start(kind: Kind, ns: &Netns, ifname: &str, options: Options6) -> Self {
        let dir = tempfile::tempdir().unwrap();
        hook_script(dir.path());
        fs::write(dir.path().join("dhclient.leases"), "").unwrap();
        fs::create_dir_all(dir.path().join("dhcpcd-db")).unwrap();
        let mut client = Client6 {
            kind,
            ns: ns.clone(),
            ifname: ifname.to_owned(),
            options,
            proc: None,
            starts: 0,
            dir,
        };
        client.write_config();
        client.spawn();
        client
    }

    fn write_config(&self) {
        let o = &self.options;
        match self.kind {
            Kind::Dhclient => {
                let mut conf = DHCLIENT6_REQUEST.to_owned();
                if o.rapid_commit {
                    conf.push_str("send dhcp6.rapid-commit;\n");
                }
                conf.push_str(&o.dhclient_conf);
                fs::write(self.path("dhclient.conf"), conf).unwrap();
            }
            Kind::Dhcpcd => {
                let mut conf = String::from(
                    "ipv6only\nduid ll\noption dhcp6_name_servers, dhcp6_domain_search\n",
                );
                if o.rapid_commit {
                    conf.push_str("option dhcp6_rapid_commit\n");
                }
                if o.reconfigure_accept {
                    conf.push_str("option dhcp6_reconfigure_accept\n");
                }
                if !o.wait_for_ra && !o.information_only {
                    conf.push_str("noipv6rs\n");
                }
                conf.push_str(&format!("interface {}\n", self.ifname));
                if !o.information_only {
                    conf.push_str("  ia_na\n");
                }
                fs::write(self.path("dhcpcd.conf"), conf).unwrap();
            }
        }
    }

    /// A file of this client's directory.
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The client's own command line, as `ip netns exec` runs it in [`Client6::ns`].
    fn command_line(&self, extra: &[&str]) -> Vec<String> {
        let p = |n: &str| self.path(n).display().to_string();
        match self.kind {
            Kind::Dhclient => {
                let mut args: Vec<String> = vec!["dhclient".into(), "-6".into(), "-v".into()];
                if self.options.information_only {
                    args.push("-S".into());
                }
                if self.options.duid_ll {
                    args.extend(["-D".into(), "LL".into()]);
                }
                if let Some(wait) = self.options.dad_wait_seconds {
                    args.extend(["--dad-wait-time".into(), wait.to_string()]);
                }
                for (flag, file) in [
                    ("-cf", "dhclient.conf"),
                    ("-lf", "dhclient.leases"),
                    ("-pf", "dhclient.pid"),
                    ("-sf", "hook6.sh"),
                ] {
                    args.extend([flag.into(), p(file)]);
                }
                args.extend(extra.iter().map(|s| (*s).to_owned()));
                args.push(self.ifname.clone());
                args
            }
            Kind::Dhcpcd => {
                let script = format!(
                    "mount --bind {db} /var/lib/dhcpcd && mount -t tmpfs dhcpcd-run /run && \
                     mkdir /run/dhcpcd && exec dhcpcd -6 -B -d -f {conf} -c {hook} {extra} {ifname}",
                    db = p("dhcpcd-db"),
                    conf = p("dhcpcd.conf"),
                    hook = p("hook6.sh"),
                    extra = extra.join(" "),
                    ifname = self.ifname,
                );
                vec!["sh".into(), "-c".into(), script]
            }
        }
    }

    fn spawn(&mut self) {
        let mut args = vec![
            "netns".to_owned(),
            "exec".to_owned(),
            self.ns.name().to_owned(),
        ];
        // dhclient's -d keeps it in the foreground (dhcpcd's -B, in its script, does).
        let foreground: &[&str] = match self.kind {
            Kind::Dhclient => &["-d"],
            Kind::Dhcpcd => &[],
        };
        args.extend(self.command_line(foreground));
        let log = self.path(&format!("client-{}.log", self.starts));
        self.starts += 1;
        self.proc = Some(Supervised::spawn(Path::new("ip"), &args, &log, None).unwrap());
    }

    /// Which client this is.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The directory holding the config, lease file, logs and recorded events.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// What the client logged, every start of it in order.
    pub fn log(&self) -> String {
        (0..self.starts)
            .map(|i| fs::read_to_string(self.path(&format!("client-{i}.log"))).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The client's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().and_then(Supervised::pid)
    }

    /// Events the hook recorded so far: (reason, environment), in order.
    pub fn events(&self) -> Vec<(String, BTreeMap<String, String>)> {
        events(self.dir.path())
    }

    /// The names of the events recorded so far, in order.
    pub fn event_names(&self) -> Vec<String> {
        self.events().into_iter().map(|(e, _)| e).collect()
    }

    /// Waits for the `nth` (0-based) event named `name`; returns its environment. Fails with the
    /// client's log if it does not come within `limit`.
    pub fn wait_event(&self, name: &str, nth: usize, limit: Duration) -> BTreeMap<String, String> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some((_, env)) = self
                .events()
                .into_iter()
                .filter(|(e, _)| e == name)
                .nth(nth)
            {
                return env;
            }
            assert!(
                Instant::now() < deadline,
                "{:?}: no {name} event #{nth} within {limit:?}; events {:?}; log:\n{}",
                self.kind,
                self.event_names(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for the `nth` event named `name` and reads its lease; fails if it has no address.
    pub fn wait_lease(&self, name: &str, nth: usize, limit: Duration) -> Lease6 {
        let env = self.wait_event(name, nth, limit);
        Lease6::from_event(&env).unwrap_or_else(|| panic!("{name} without an address: {env:?}"))
    }

    /// The address of the last lease dhclient wrote to its lease file (`iaaddr` of the last
    /// `lease6` block), if any; dhcpcd's lease file is binary, so `None` for it.
    pub fn lease_file_address(&self) -> Option<Ipv6Addr> {
        if self.kind != Kind::Dhclient {
            return None;
        }
        let text = fs::read_to_string(self.path("dhclient.leases")).unwrap_or_default();
        let last = text.rsplit("lease6 {").next()?;
        last.lines()
            .find_map(|l| l.trim().strip_prefix("iaaddr "))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|a| a.parse().ok())
    }

    /// Sends `signal` to the client (dhcpcd: `USR1` renews now, `ALRM` releases and exits).
    pub fn signal(&self, signal: &str) -> bool {
        self.proc.as_ref().is_some_and(|p| p.signal(signal))
    }

    /// Whether the client process has exited (or was never started again after a stop).
    pub fn exited(&self) -> bool {
        self.proc.as_ref().is_none_or(Supervised::exited)
    }

    /// Stops the client as a shutdown would, without releasing (SIGTERM; the hook sees `STOP6`
    /// from dhclient, `STOPPED` from dhcpcd), waiting up to 5 s for it to exit; then makes sure
    /// it is gone.
    pub fn stop(&mut self) {
        terminate(&mut self.proc);
    }

    /// Stops the client (no RELEASE) and starts it again with the same DUID, config and lease
    /// file: dhclient then CONFIRMs its lease first; dhcpcd reads its saved lease.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// Releases the lease and stops the client: `dhclient -6 -r` with the same files (it stops
    /// the running one, then sends RELEASE and waits for the REPLY), or SIGALRM to dhcpcd. Returns
    /// once the client process is gone and the hook recorded `RELEASE6`.
    pub fn release(&mut self, limit: Duration) {
        let releases = self
            .event_names()
            .iter()
            .filter(|e| *e == "RELEASE6")
            .count();
        match self.kind {
            Kind::Dhclient => {
                let mut cmd = self.ns.command("timeout");
                cmd.arg(limit.as_secs().max(1).to_string())
                    .args(self.command_line(&["-r"]))
                    .stdin(Stdio::null());
                let out = cmd.output().unwrap();
                fs::write(self.path("release.log"), &out.stderr).unwrap();
                assert!(
                    out.status.success(),
                    "dhclient -r failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Kind::Dhcpcd => {
                assert!(self.signal("ALRM"), "dhcpcd is not running");
            }
        }
        self.wait_event("RELEASE6", releases, limit);
        wait_for("the client to exit after its release", limit, || {
            self.exited().then_some(())
        });
        self.stop();
    }
}

impl Drop for Client6 {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A `kea-dhcp6` config: one subnet on one interface, host reservations by hardware address,
/// DNS servers, and no dynamic pool unless [`Kea6Config::pool`] gives one.
#[derive(Clone, Debug)]
pub struct Kea6Config {
    /// The interface it serves (and the subnet's `interface`, so direct and relayed traffic
    /// arriving there selects the subnet).
    pub interface: String,
    /// The subnet, `prefix/len`.
    pub subnet: String,
    /// Reservations: (MAC, address).
    pub reservations: Vec<(String, Ipv6Addr)>,
    /// A dynamic pool (`first - last`), none by default: only reserved clients get addresses.
    pub pool: Option<String>,
    /// DNS servers (option 23).
    pub dns: Vec<Ipv6Addr>,
    /// T1, T2, preferred and valid lifetimes, in seconds.
    pub timers: (u32, u32, u32, u32),
    /// Whether Rapid Commit is allowed (answers a SOLICIT carrying it with REPLY).
    pub rapid_commit: bool,
    /// The server's DUID-EN identifier, hex (enterprise 32473, the documentation number): two
    /// servers with different identifiers are two servers to a client.
    pub server_identifier: String,
    /// Where Kea takes a client's MAC from (`any`, `duid`, `ipv6-link-local`,
    /// `client-link-addr-option`, …), in order.
    pub mac_sources: Vec<String>,
    /// Logs every packet (DEBUG level 40), which the tests read; otherwise INFO (a line per
    /// lease).
    pub log_packets: bool,
}

impl Kea6Config {
    /// Serves `subnet` on `interface`: no reservation, no pool, no DNS, T1/T2/preferred/valid
    /// 2/3/5/8 s (so renewals and rebinds happen within a test), Rapid Commit allowed, MACs
    /// from any source, packets logged.
    pub fn new(interface: &str, subnet: &str) -> Self {
        Kea6Config {
            interface: interface.to_owned(),
            subnet: subnet.to_owned(),
            reservations: Vec::new(),
            pool: None,
            dns: Vec::new(),
            timers: (2, 3, 5, 8),
            rapid_commit: true,
            server_identifier: "766d646863700001".to_owned(),
            mac_sources: vec!["any".to_owned()],
            log_packets: true,
        }
    }

    /// Adds a reservation of `address` for the NIC `mac`.
    pub fn reserve(mut self, mac: &str, address: Ipv6Addr) -> Self {
        self.reservations.push((mac.to_owned(), address));
        self
    }

    /// The config as Kea reads it, logging to `log`.
    pub fn json(&self, log: &Path) -> Value {
        let (t1, t2, preferred, valid) = self.timers;
        let mut subnet = json!({
            "id": 1,
            "subnet": self.subnet,
            "interface": self.interface,
            "rapid-commit": self.rapid_commit,
            "reservations": self.reservations.iter().map(|(mac, ip)| json!({
                "hw-address": mac, "ip-addresses": [ip.to_string()],
            })).collect::<Vec<_>>(),
            "pools": self.pool.iter().map(|p| json!({ "pool": p })).collect::<Vec<_>>(),
        });
        if !self.dns.is_empty() {
            let dns: Vec<String> = self.dns.iter().map(Ipv6Addr::to_string).collect();
            subnet["option-data"] = json!([{ "name": "dns-servers", "data": dns.join(", ") }]);
        }
        // Without packets, INFO still logs `DHCP6_STARTED`, which tells that Kea is ready.
        let (severity, debuglevel) = if self.log_packets {
            ("DEBUG", 40)
        } else {
            ("INFO", 0)
        };
        json!({ "Dhcp6": {
            "interfaces-config": { "interfaces": [self.interface] },
            "lease-database": { "type": "memfile", "persist": false },
            "server-id": {
                "type": "EN", "enterprise-id": 32473,
                "identifier": self.server_identifier, "persist": false,
            },
            "renew-timer": t1, "rebind-timer": t2,
            "preferred-lifetime": preferred, "valid-lifetime": valid,
            "host-reservation-identifiers": ["hw-address"],
            "mac-sources": self.mac_sources,
            "subnet6": [subnet],
            "loggers": [{
                "name": "kea-dhcp6",
                "output_options": [{ "output": log.display().to_string() }],
                "severity": severity, "debuglevel": debuglevel,
            }],
        }})
    }

    /// The DUID clients see from a server with this config, as [`hex_id`]: DUID-EN (type 2),
    /// enterprise 32473, the identifier.
    pub fn server_duid(&self) -> String {
        format!(
            "0002{:08x}{}",
            32473u32,
            self.server_identifier.to_ascii_lowercase()
        )
    }
}

/// `kea-dhcp6` running in a namespace with a [`Kea6Config`]; stopped when dropped.
pub struct Kea6 {
    proc: Option<Supervised>,
    dir: tempfile::TempDir,
}

impl Kea6 {
    /// Starts Kea in `ns` (its pid and lock files in a directory of its own, leases in memory);
    /// returns once it logged `DHCP6_STARTED` (its sockets are open), failing with its log if it
    /// does not within 10 s.
    pub fn start(ns: &Netns, config: &Kea6Config) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("kea.log");
        let conf = dir.path().join("kea-dhcp6.json");
        let json = config.json(&log);
        fs::write(&conf, serde_json::to_string_pretty(&json).unwrap()).unwrap();
        let state = dir.path().display().to_string();
        let args: Vec<String> = [
            format!("KEA_PIDFILE_DIR={state}"),
            format!("KEA_LOCKFILE_DIR={state}"),
            "ip".into(),
            "netns".into(),
            "exec".into(),
            ns.name().into(),
            "kea-dhcp6".into(),
            "-c".into(),
            conf.display().to_string(),
        ]
        .into();
        let out = dir.path().join("kea.out");
        let proc = Supervised::spawn(Path::new("env"), &args, &out, None).unwrap();
        let kea = Kea6 {
            proc: Some(proc),
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !kea.log().contains("DHCP6_STARTED") {
            assert!(
                Instant::now() < deadline && !kea.exited(),
                "kea-dhcp6 did not start; log:\n{}\n{}",
                kea.log(),
                fs::read_to_string(&out).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        kea
    }

    /// Kea's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("kea.log")).unwrap_or_default()
    }

    /// The lines of Kea's log that name `message` (a Kea message id, e.g. `DHCP6_RELEASE_NA`)
    /// and contain `text`.
    pub fn lines(&self, message: &str, text: &str) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| l.contains(message) && l.contains(text))
            .map(str::to_owned)
            .collect()
    }

    /// Waits until Kea has logged `message` with `text` at least `n` times; returns those lines.
    pub fn wait_log(&self, message: &str, text: &str, n: usize, limit: Duration) -> Vec<String> {
        let deadline = Instant::now() + limit;
        loop {
            let lines = self.lines(message, text);
            if lines.len() >= n {
                return lines;
            }
            assert!(
                Instant::now() < deadline,
                "kea-dhcp6 did not log {message} with {text:?} {n} times within {limit:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kea's process id.
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().and_then(Supervised::pid)
    }

    /// Whether Kea has exited.
    pub fn exited(&self) -> bool {
        self.proc.as_ref().is_none_or(Supervised::exited)
    }

    /// Stops Kea (SIGTERM, then killed after 5 s); its leases, in memory only, are gone.
    pub fn stop(&mut self) {
        terminate(&mut self.proc);
    }
}

impl Drop for Kea6 {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What [`Radvd`] advertises on one interface.
#[derive(Clone, Debug)]
pub struct RadvdConfig {
    /// The interface it advertises on.
    pub interface: String,
    /// The prefix, `prefix/len`, advertised on-link.
    pub prefix: String,
    /// The Managed flag: addresses come from DHCPv6.
    pub managed: bool,
    /// The Other flag: other configuration comes from DHCPv6.
    pub other: bool,
    /// The prefix's Autonomous flag: hosts may form addresses in it themselves (SLAAC).
    pub autonomous: bool,
    /// Router lifetime in seconds; 0 says "not a default router".
    pub router_lifetime: u32,
    /// Minimum and maximum interval between unsolicited advertisements, in seconds.
    pub interval: (u32, u32),
}

impl RadvdConfig {
    /// Advertises `prefix` on `interface` as a DHCPv6-managed network: Managed and Other set,
    /// the prefix on-link but not autonomous, not a default router, every 3–4 s.
    pub fn managed(interface: &str, prefix: &str) -> Self {
        RadvdConfig {
            interface: interface.to_owned(),
            prefix: prefix.to_owned(),
            managed: true,
            other: true,
            autonomous: false,
            router_lifetime: 0,
            interval: (3, 4),
        }
    }

    /// The config file radvd reads.
    pub fn text(&self) -> String {
        let on = |b: bool| if b { "on" } else { "off" };
        format!(
            "interface {ifname} {{\n  AdvSendAdvert on;\n  MinRtrAdvInterval {min};\n  \
             MaxRtrAdvInterval {max};\n  AdvManagedFlag {m};\n  AdvOtherConfigFlag {o};\n  \
             AdvDefaultLifetime {life};\n  prefix {prefix} {{\n    AdvOnLink on;\n    \
             AdvAutonomous {a};\n  }};\n}};\n",
            ifname = self.interface,
            min = self.interval.0,
            max = self.interval.1,
            m = on(self.managed),
            o = on(self.other),
            life = self.router_lifetime,
            prefix = self.prefix,
            a = on(self.autonomous),
        )
    }
}

/// `radvd` running in a namespace, standing for the network's router; stopped when dropped.
pub struct Radvd {
    proc: Option<Supervised>,
    dir: tempfile::TempDir,
}

impl Radvd {
    /// Starts radvd in `ns` in the foreground (`-n`), logging to its own file (`-m stderr -d 1`),
    /// its pid file in a directory of its own; returns once its main loop runs, failing with its
    /// log if it exits first (a config it refuses) or takes over 10 s. It only warns that IPv6
    /// forwarding is off, and advertises all the same.
    pub fn start(ns: &Netns, config: &RadvdConfig) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("radvd.conf");
        fs::write(&conf, config.text()).unwrap();
        let args: Vec<String> = [
            "netns",
            "exec",
            ns.name(),
            "radvd",
            "-n",
            "-m",
            "stderr",
            "-d",
            "1",
            "-C",
            &conf.display().to_string(),
            "-p",
            &dir.path().join("radvd.pid").display().to_string(),
        ]
        .map(str::to_owned)
        .into();
        let log = dir.path().join("radvd.log");
        let proc = Supervised::spawn(Path::new("ip"), &args, &log, None).unwrap();
        let radvd = Radvd {
            proc: Some(proc),
            dir,
        };
        // Its main loop logs "polling for N second(s), next iface is …" once the interface is
        // set up and the first advertisement is scheduled.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !radvd.log().contains("next iface is") {
            assert!(
                Instant::now() < deadline && !radvd.exited(),
                "radvd did not start; log:\n{}",
                radvd.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        radvd
    }

    /// radvd's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("radvd.log")).unwrap_or_default()
    }

    /// Whether radvd has exited.
    pub fn exited(&self) -> bool {
        self.proc.as_ref().is_none_or(Supervised::exited)
    }

    /// Stops radvd (SIGTERM: it sends its final advertisements; killed after 5 s).
    pub fn stop(&mut self) {
        terminate(&mut self.proc);
    }
}

impl Drop for Radvd {
    fn drop(&mut self) {
        self.stop();
    }
}
