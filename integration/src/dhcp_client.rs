//! Real DHCP clients in network namespaces, for the end-to-end tests: ISC `dhclient` and busybox
//! `udhcpc` with a hook script that records every event (and configures the address, so unicast
//! renewals work), lease-file parsing, and HTTP GETs run inside a namespace.
//!
//! These helpers fail the calling test on any error: they are test code, not product code.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::netns::{Lab, Netns};

/// Polls `f` every 50 ms until it returns `Some` or `limit` passes.
pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// [`wait_for`] for async checks: polls `f` every `every` until it returns `Some` or `limit`
/// passes (a test that reads the API polls less often than one that times a reply).
pub async fn wait_for_async<T>(
    what: &str,
    limit: Duration,
    every: Duration,
    mut f: impl AsyncFnMut() -> Option<T>,
) -> T {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(every).await;
    }
}

/// The hook both clients call: configures the address (so unicast renewals work) and appends
/// the whole environment it was given, one file per event, numbered in order.
pub fn hook_script(dir: &Path) -> PathBuf {
    let path = dir.join("hook.sh");
    let events = dir.join("events");
    fs::create_dir_all(&events).unwrap();
    fs::write(
        &path,
        format!(
            r#"#!/bin/sh
# dhclient passes $reason and new_*; udhcpc passes the event as $1 and ip/mask/...
ev="${{reason:-$1}}"
case "$ev" in
  BOUND|RENEW|REBIND|REBOOT) ip addr replace "$new_ip_address/$new_subnet_mask" dev "$interface" ;;
  bound|renew) ip addr replace "$ip/$mask" dev "$interface" ;;
esac
n=$(ls {events} | wc -l)
env > {events}/tmp.$$
mv {events}/tmp.$$ {events}/$(printf %04d "$n")-"$ev"
exit 0
"#,
            events = events.display()
        ),
    )
    .unwrap();
    Command::new("chmod")
        .args(["+x", path.to_str().unwrap()])
        .status()
        .unwrap();
    path
}

/// Events the hook recorded so far: (event name, environment), in order.
pub fn events(dir: &Path) -> Vec<(String, BTreeMap<String, String>)> {
    let mut names: Vec<String> = fs::read_dir(dir.join("events"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with("tmp."))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
        .into_iter()
        .map(|n| {
            let text = fs::read_to_string(dir.join("events").join(&n)).unwrap_or_default();
            let env = text
                .lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            let ev = n.split_once('-').map(|(_, e)| e.to_owned()).unwrap_or(n);
            (ev, env)
        })
        .collect()
}

/// Waits for the `nth` (0-based) event named `name`.
pub fn wait_event(dir: &Path, name: &str, nth: usize, limit: Duration) -> BTreeMap<String, String> {
    wait_for(&format!("{name} event #{nth}"), limit, || {
        events(dir)
            .into_iter()
            .filter(|(e, _)| e == name)
            .nth(nth)
            .map(|(_, env)| env)
    })
}

/// Waits for a `RENEW` event after the first `since` events whose `key` is `value` (an option
/// change reaching the next renewal); returns its environment.
pub fn wait_renewal_with(
    dir: &Path,
    since: usize,
    key: &str,
    value: &str,
    limit: Duration,
) -> BTreeMap<String, String> {
    wait_for(&format!("a renewal with {key}={value}"), limit, || {
        events(dir)
            .into_iter()
            .skip(since)
            .find(|(e, env)| e == "RENEW" && env.get(key).map(String::as_str) == Some(value))
            .map(|(_, env)| env)
    })
}

/// The options dhclient asks for: everything the agent can answer.
pub const DHCLIENT_CONF: &str = "request subnet-mask, broadcast-address, routers, domain-name, \
     domain-name-servers, domain-search, host-name, ntp-servers, dhcp-lease-time, \
     dhcp-renewal-time, dhcp-rebinding-time;\n";

/// Starts `dhclient` (killed when `lab` drops) in the foreground on `vm`'s eth0, with its own config, lease and pid files.
pub fn start_dhclient(lab: &mut Lab, vm: &Netns, dir: &Path) {
    let script = hook_script(dir);
    spawn_dhclient(lab, vm, dir, DHCLIENT_CONF, Some(&script));
}

/// `dhclient -4 -d` on `vm`'s eth0 with `conf`, its lease, pid and log files in `dir`, and
/// `script` (the system's `dhclient-script` when `None`).
fn spawn_dhclient(lab: &mut Lab, vm: &Netns, dir: &Path, conf: &str, script: Option<&Path>) {
    fs::write(dir.join("dhclient.conf"), conf).unwrap();
    let log = fs::File::create(dir.join("dhclient.log")).unwrap();
    let mut cmd = vm.command("dhclient");
    cmd.args(["-4", "-d", "-v", "-cf"])
        .arg(dir.join("dhclient.conf"))
        .arg("-lf")
        .arg(dir.join("dhclient.leases"))
        .arg("-pf")
        .arg(dir.join("dhclient.pid"));
    if let Some(script) = script {
        cmd.arg("-sf").arg(script);
    }
    cmd.arg("eth0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    lab.spawn(cmd).unwrap();
}

/// What [`start_dhclient_configuring`] asks for: the addressing, the MTU and the classless
/// static routes (declared as Debian's default config does), and nothing that would make the
/// system script touch files outside the namespace (no DNS, domain or host name).
pub const DHCLIENT_ROUTES_CONF: &str = "option rfc3442-classless-static-routes code 121 = array of unsigned integer 8;\n\
     request subnet-mask, broadcast-address, routers, interface-mtu, \
     rfc3442-classless-static-routes, dhcp-lease-time, dhcp-renewal-time, dhcp-rebinding-time;\n";

/// Starts `dhclient` on `vm`'s eth0 (killed when `lab` drops) with the system's own
/// `dhclient-script` and its exit hooks, as a VM runs it: the client itself applies the
/// address, the MTU (`ip link`) and the routes (`ip route`, through Debian's
/// `rfc3442-classless-routes` hook). Config [`DHCLIENT_ROUTES_CONF`].
pub fn start_dhclient_configuring(lab: &mut Lab, vm: &Netns, dir: &Path) {
    spawn_dhclient(lab, vm, dir, DHCLIENT_ROUTES_CONF, None);
}

/// What [`start_dhcpcd`] asks for beyond dhcpcd's defaults: the MTU, the classless static
/// routes and the DNS servers (as Debian's own dhcpcd.conf does); IPv4 only, no link-local
/// fallback, no system hook scripts (they would write the host's resolv.conf and hostname).
pub const DHCPCD_CONF: &str = "ipv4only\nnoipv4ll\nnoarp\noption interface_mtu\n\
     option classless_static_routes\noption domain_name_servers\n";

/// Starts `dhcpcd` in the foreground on `vm`'s eth0 (killed when `lab` drops), with
/// [`DHCPCD_CONF`] and no hook script: dhcpcd itself applies the address, the MTU and the
/// routes, as it does in a VM. Its lease database and run directory are empty tmpfs mounts seen
/// only by it (`ip netns exec` gives each command a mount namespace of its own), so no lease of
/// an earlier run is reused and nothing is left on the host.
pub fn start_dhcpcd(lab: &mut Lab, vm: &Netns, dir: &Path) {
    spawn_dhcpcd(lab, vm, dir, Path::new("/bin/true"));
}

/// [`start_dhcpcd`] with the recording hook ([`hook_script`]): each event's environment
/// (`reason`, `new_domain_name_servers`, …) is kept for [`events`].
pub fn start_dhcpcd_recording(lab: &mut Lab, vm: &Netns, dir: &Path) {
    let hook = hook_script(dir);
    spawn_dhcpcd(lab, vm, dir, &hook);
}

fn spawn_dhcpcd(lab: &mut Lab, vm: &Netns, dir: &Path, hook: &Path) {
    fs::write(dir.join("dhcpcd.conf"), DHCPCD_CONF).unwrap();
    let script = format!(
        "mount -t tmpfs dhcpcd-db /var/lib/dhcpcd && mount -t tmpfs dhcpcd-run /run && \
         mkdir /run/dhcpcd && exec dhcpcd -4 -B -d -f {} -c {} eth0",
        dir.join("dhcpcd.conf").display(),
        hook.display()
    );
    lab.spawn_logged(vm, &["sh", "-c", &script], &dir.join("dhcpcd.log"))
        .unwrap();
}

/// The last lease block of a dhclient lease file: `fixed-address` and each `option`, by name.
pub fn dhclient_lease(path: &Path) -> BTreeMap<String, String> {
    let text = fs::read_to_string(path).unwrap_or_default();
    let last = text.rsplit("lease {").next().unwrap_or_default();
    let mut out = BTreeMap::new();
    for line in last.lines() {
        let line = line.trim().trim_end_matches(';');
        if let Some(addr) = line.strip_prefix("fixed-address ") {
            out.insert("fixed-address".to_owned(), addr.to_owned());
        } else if let Some(opt) = line.strip_prefix("option ")
            && let Some((name, value)) = opt.split_once(' ')
        {
            out.insert(name.to_owned(), value.to_owned());
        }
    }
    out
}

/// Starts busybox `udhcpc` as cirros and appliances run it: in the foreground on `vm`'s eth0
/// (killed when `lab` drops), renewing at T1, asking beyond its defaults for the MTU, the
/// classless routes and the search list, its events (`bound`, `renew`, …) recorded by
/// [`hook_script`].
pub fn start_udhcpc(lab: &mut Lab, vm: &Netns, dir: &Path) {
    let script = hook_script(dir).display().to_string();
    let argv = [
        "udhcpc",
        "-i",
        "eth0",
        "-f",
        "-t",
        "10",
        "-T",
        "1",
        "-A",
        "1",
        "-O",
        "mtu",
        "-O",
        "staticroutes",
        "-O",
        "search",
        "-s",
        &script,
    ];
    lab.spawn_logged(vm, &argv, &dir.join("udhcpc.log"))
        .unwrap();
}

/// Runs busybox `udhcpc` once on `vm`'s eth0 (quit after lease, up to 4 discovers 1 s apart),
/// with the recording hook; `extra` adds arguments (e.g. `-r` to ask for an address).
pub fn udhcpc(vm: &Netns, dir: &Path, extra: &[&str]) -> std::process::Output {
    let script = hook_script(dir);
    let mut cmd = vm.command("udhcpc");
    cmd.args([
        "-i", "eth0", "-f", "-q", "-n", "-t", "4", "-T", "1", "-A", "1",
    ])
    .args(["-O", "search", "-O", "ntpsrv", "-O", "broadcast"])
    .arg("-s")
    .arg(&script)
    .args(extra)
    .stdin(Stdio::null());
    cmd.output().unwrap()
}

/// [`udhcpc`], which must succeed (its stderr shown if not); returns the `bound` event's
/// environment (the lease's values as udhcpc hands them to its script).
pub fn udhcpc_bound(vm: &Netns, dir: &Path, extra: &[&str]) -> BTreeMap<String, String> {
    let out = udhcpc(vm, dir, extra);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_event(dir, "bound", 0, Duration::from_secs(1))
}

/// An HTTP GET run inside `ns`: (status, body); `None` when there is no answer at all (nothing
/// listening, timeout).
pub fn try_http_get(lab: &Lab, ns: &Netns, url: &str) -> Option<(u16, String)> {
    let script = format!(
        "import urllib.request,urllib.error\n\
         try:\n\
         \x20 r=urllib.request.urlopen('{url}',timeout=5); print(r.status); print(r.read().decode())\n\
         except urllib.error.HTTPError as e:\n\
         \x20 print(e.code); print(e.read().decode())\n"
    );
    let out = lab.exec(ns, "python3", &["-c", &script]).ok()?;
    let (code, body) = out.split_once('\n')?;
    Some((code.trim().parse().ok()?, body.to_owned()))
}

/// An HTTP GET run inside `ns` that must be answered: (status, body).
pub fn http_get(lab: &Lab, ns: &Netns, url: &str) -> (u16, String) {
    try_http_get(lab, ns, url)
        .unwrap_or_else(|| panic!("no HTTP answer from {url} in {}", ns.name()))
}
