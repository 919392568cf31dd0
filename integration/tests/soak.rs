//! The fault soak: the whole system as processes, as the chart deploys it (two electing
//! controller replicas behind a Service stand-in, two agents), while VMs come and go and 20 real
//! `dhclient`s renew, and at seeded random moments a controller or agent replica gets `kill -9`
//! or SIGTERM (and is started again, as its Deployment would), the API server and etcd restart,
//! a second writer records allocations of its own in the pool's status (upstream's Go
//! controller during a migration does: read, add, replace), or a namespace user makes address
//! claims (a VIP, and one bound to a VM's NIC created with it).
//!
//! At the end: no address is held by two MACs (in the VMs' configs, in the pool's status, and in
//! what the clients hold), no allocation is lost (the second writer's included), every claim is
//! held (the VIP for its placeholder, the NIC's for its MAC), every client kept its address, and the longest
//! DHCP outage any client saw is at most the agents' Lease duration + 2 s. The outage is measured
//! by `integration/bench/dhcp_probe.py` on the VM network, which asks for each client's address
//! in turn (INIT-REBOOT REQUEST, a fresh transaction every 10 ms until the ACK): the wait for one
//! answer is how long a client asking at that moment would have gone without.
//!
//! The pool's lease is 60 s here (the other suites use 20 s to see renewals quickly): ISC
//! dhclient retries a failed renewal only `initial-interval` (10 s) later, capped at the lease's
//! expiry, so with a 20 s lease one unanswered renewal at T1 — any outage that covers T1, however
//! short — expires the lease before the retry. That is the client's policy, not an outage; a
//! lease of 60 s leaves it its retries and its REBIND inside any outage the bound allows.
//!
//! `VMDHCP_SOAK_SEED` replays a run's schedule (printed first; random otherwise) and
//! `VMDHCP_SOAK_SECONDS` sets how long faults are injected (default 150: each kind of fault
//! once, and a few more; longer soaks are for hunting).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout
)]

/// Like `println!`, but straight to the process's stderr, past the test harness's capture: the
/// seed, the fault schedule and the figures appear in every run's log (CI's too), not only when
/// the test fails.
macro_rules! report {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use vmdhcp_integration::control_plane::bin_dir;
use vmdhcp_integration::dhcp_client::{dhclient_lease, start_dhclient, wait_for};
use vmdhcp_integration::fleet::{
    AGENT_NS, Agent, Fleet, LEASE_SECONDS, NS, Options, Probe, setup_with, vm_manifest,
};

/// Real DHCP clients renewing through the whole run.
const CLIENTS: usize = 20;
/// Longest outage any client may see: the agents' Lease duration + 2 s (the bound).
const OUTAGE_BOUND: Duration = Duration::from_secs(LEASE_SECONDS + 2);

/// splitmix64: small, seedable, the same sequence on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// Uniform in `[lo, hi)` milliseconds.
    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo))
    }
}

/// One injected fault.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// `kill -9` of controller replica `n`.
    KillController(usize),
    /// SIGTERM of controller replica `n`.
    StopController(usize),
    /// `kill -9` of the agent leading (`true`) or standing by.
    KillAgent(bool),
    /// SIGTERM of the agent leading (`true`) or standing by.
    StopAgent(bool),
    /// The API server and etcd killed and started again.
    RestartApi,
    /// A second writer (upstream's controller mid-migration, a hand edit) records allocations
    /// of its own in the pool's status, on the addresses the leader is about to give.
    ForeignWriter,
    /// A namespace user claims two addresses: a VIP, and one for the NIC of a VM created with
    /// the claim. Every claim must be held through every later fault.
    Claims,
}

/// The run's faults: (time from the start, fault, pause before the victim is started again).
/// Every kind comes once, in a seeded order, however short `seconds` is, then seeded picks until
/// `seconds` is used up; faults are 12–30 s apart so each outage ends before the next fault.
fn schedule(rng: &mut Rng, seconds: u64) -> Vec<(Duration, Fault, Duration)> {
    let mut kinds = [
        Fault::KillController(0),
        Fault::StopController(1),
        Fault::KillAgent(true),
        Fault::StopAgent(true),
        Fault::RestartApi,
        Fault::ForeignWriter,
        Fault::Claims,
    ];
    for i in (1..kinds.len()).rev() {
        kinds.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut out = Vec::new();
    let mut at = Duration::from_secs(10);
    while at < Duration::from_secs(seconds) || out.len() < kinds.len() {
        let fault = if out.len() < kinds.len() {
            kinds[out.len()]
        } else {
            let n = rng.below(2) as usize;
            let leader = rng.below(2) == 0;
            match rng.below(7) {
                0 => Fault::KillController(n),
                1 => Fault::StopController(n),
                2 => Fault::KillAgent(leader),
                3 => Fault::StopAgent(leader),
                4 => Fault::ForeignWriter,
                5 => Fault::Claims,
                _ => Fault::RestartApi,
            }
        };
        out.push((at, fault, rng.millis(1_000, 5_000)));
        at += rng.millis(12_000, 30_000);
    }
    out
}

/// `kubectl ARGS` against the control plane with a short request timeout (the API server may be
/// down); stdout on success.
fn kubectl(kubeconfig: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new(bin_dir().join("kubectl"))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg("--request-timeout=5s")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Creates claim `vip-K` (bound to nothing) and claim `nic-K` with VM `claimed-K` (MAC
/// `02:12:38:00:00:K`) it binds; each call tried until it succeeds (the API server may be
/// restarting), at most 50 times. Returns the VM's MAC.
fn claim_write(kubeconfig: &Path, k: usize) -> String {
    let mac = format!("02:12:38:00:00:{k:02x}");
    let vm = format!("claimed-{k}");
    let objects = [
        json!({"apiVersion": "ipam.vmdhcp.io/v1alpha1", "kind": "AddressClaim",
               "metadata": {"name": format!("vip-{k}"), "namespace": NS},
               "spec": {"network": format!("{NS}/net-a")}}),
        json!({"apiVersion": "ipam.vmdhcp.io/v1alpha1", "kind": "AddressClaim",
               "metadata": {"name": format!("nic-{k}"), "namespace": NS},
               "spec": {"network": format!("{NS}/net-a"), "vm": vm, "nic": "nic-0"}}),
        vm_manifest(NS, &vm, &mac, &format!("{NS}/net-a")),
    ];
    let file = kubeconfig.with_file_name(format!("claim-write-{k}.json"));
    for object in objects {
        fs::write(&file, object.to_string()).unwrap();
        let file_arg = file.display().to_string();
        let made = (0..50).any(|_| {
            kubectl(kubeconfig, &["apply", "-f", &file_arg]).is_some() || {
                std::thread::sleep(Duration::from_millis(200));
                false
            }
        });
        assert!(made, "could not create {object}");
    }
    mac
}

/// Each claim's phase, holder and address, by name.
fn claim_states(fleet: &Fleet) -> BTreeMap<String, (String, String, String)> {
    let list = fleet.kubectl_json(&["-n", NS, "get", "addressclaims.ipam.vmdhcp.io"]);
    list["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|c| {
            let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            (
                text(&c["metadata"]["name"]),
                (
                    text(&c["status"]["phase"]),
                    text(&c["status"]["macAddress"]).to_lowercase(),
                    text(&c["status"]["ipAddress"]),
                ),
            )
        })
        .collect()
}

/// Records `n` allocations of MACs `02:00:00:ee:…` (numbered from `first`) in `pool-a`'s
/// status as upstream's controller does: read, add the entry on the lowest address the status
/// shows free, replace with the resourceVersion read, again on a conflict (at most 50 tries:
/// the API server may be restarting). Returns MAC → address of those recorded.
fn foreign_write(kubeconfig: &Path, first: usize, n: usize) -> BTreeMap<String, String> {
    let mut recorded = BTreeMap::new();
    let file = kubeconfig.with_file_name("foreign-write.json");
    for _ in 0..50 {
        if recorded.len() == n {
            break;
        }
        let Some(text) = kubectl(
            kubeconfig,
            &["-n", NS, "get", "ippool", "pool-a", "-o", "json"],
        ) else {
            continue;
        };
        let mut pool: Value = serde_json::from_str(&text).unwrap();
        let bound = |which: &str| -> u32 {
            let ip: std::net::Ipv4Addr = pool["spec"]["ipv4Config"]["pool"][which]
                .as_str()
                .unwrap()
                .parse()
                .unwrap();
            u32::from(ip)
        };
        let (start, end) = (bound("start"), bound("end"));
        let allocated = &mut pool["status"]["ipv4"]["allocated"];
        let Some(ip) = (start..=end)
            .map(|a| std::net::Ipv4Addr::from(a).to_string())
            .find(|a| allocated.get(a).is_none())
        else {
            break;
        };
        let mac = format!("02:00:00:ee:00:{:02x}", first + recorded.len());
        allocated[&ip] = Value::String(mac.clone());
        fs::write(&file, pool.to_string()).unwrap();
        let path = file.display().to_string();
        if kubectl(
            kubeconfig,
            &["replace", "--subresource=status", "-f", &path],
        )
        .is_some()
        {
            recorded.insert(mac, ip);
        }
    }
    recorded
}

/// For a look at every process's whole log after a run, passed or failed:
/// `VMDHCP_SOAK_KEEP=DIR` copies the fleet's directory there.
fn keep_logs(fleet: &Fleet) {
    if let Ok(keep) = std::env::var("VMDHCP_SOAK_KEEP") {
        let _ = Command::new("cp")
            .arg("-a")
            .arg(fleet.dir.path())
            .arg(&keep)
            .status();
    }
}

/// What the churn did.
#[derive(Debug, Default)]
struct Churn {
    created: usize,
    deleted: usize,
    failed: usize,
}

/// Creates and deletes VMs (`churn-N`, up to 10 at a time) until `stop`, one change every
/// 0.5–1.5 s; calls that fail (the API server restarting) are counted, not retried: the API is
/// the truth the end checks read.
fn churn(kubeconfig: PathBuf, seed: u64, stop: Arc<AtomicBool>) -> JoinHandle<Churn> {
    std::thread::spawn(move || {
        let mut rng = Rng(seed);
        let mut live: Vec<String> = Vec::new();
        let mut stats = Churn::default();
        let mut n = 0u32;
        while !stop.load(Ordering::Relaxed) {
            if live.len() < 3 || (live.len() < 10 && rng.below(2) == 0) {
                n += 1;
                let name = format!("churn-{n}");
                let mac = format!("02:12:35:00:{:02x}:{:02x}", n >> 8, n & 0xff);
                let file =
                    std::env::temp_dir().join(format!("soak-{}-{name}.json", std::process::id()));
                fs::write(
                    &file,
                    vm_manifest(NS, &name, &mac, &format!("{NS}/net-a")).to_string(),
                )
                .unwrap();
                let file_arg = file.display().to_string();
                if kubectl(&kubeconfig, &["create", "-f", &file_arg]).is_some() {
                    stats.created += 1;
                    live.push(name);
                } else {
                    stats.failed += 1;
                }
                let _ = fs::remove_file(&file);
            } else {
                let at = rng.below(live.len() as u64) as usize;
                let ok = kubectl(
                    &kubeconfig,
                    &["-n", NS, "delete", "vm", &live[at], "--wait=false"],
                )
                .is_some();
                if ok {
                    stats.deleted += 1;
                    live.swap_remove(at);
                } else {
                    stats.failed += 1;
                }
            }
            std::thread::sleep(rng.millis(500, 1_500));
        }
        stats
    })
}

/// Per client, each probe: (seconds from the start when it was sent, wait for the ACK or `None`
/// when none came within the probe's timeout).
type Probes = Vec<Vec<(f64, Option<Duration>)>>;

/// Asks for each client's address in turn until `stop`, 0.2 s between rounds.
fn prober(
    mut probe: Probe,
    clients: Vec<(String, String)>,
    start: Instant,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Probes> {
    std::thread::spawn(move || {
        let mut probes: Probes = vec![Vec::new(); clients.len()];
        while !stop.load(Ordering::Relaxed) {
            for (i, (mac, ip)) in clients.iter().enumerate() {
                let sent = start.elapsed().as_secs_f64();
                probes[i].push((sent, probe.try_ask(&format!("request {mac} {ip}"))));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        probes
    })
}

/// Holders of the Leases in the agents' namespace (the agents' and the controllers').
fn lease_holders(fleet: &Fleet) -> BTreeSet<String> {
    let leases = kubectl(
        fleet.cp.kubeconfig(),
        &["-n", AGENT_NS, "get", "lease", "-o", "json"],
    )
    .and_then(|out| serde_json::from_str::<Value>(&out).ok())
    .unwrap_or_default();
    leases["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits for a SIGTERMed process to finish its shutdown (bounded: then it is killed on restart).
fn wait_exit(process: &vmdhcp_integration::process::Supervised) -> Duration {
    let start = Instant::now();
    while !process.exited() && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(50));
    }
    start.elapsed()
}

/// Every config in [`NS`]: VM name → (MAC, allocated address) of its NICs.
fn configs(fleet: &Fleet) -> BTreeMap<String, Vec<(String, Option<String>)>> {
    let list = fleet.kubectl_json(&["-n", NS, "get", "virtualmachinenetworkconfigs"]);
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let name = c["metadata"]["name"].as_str().unwrap().to_owned();
            let statuses = c["status"]["networkConfigs"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let nics = c["spec"]["networkConfigs"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|nic| {
                    let mac = nic["macAddress"].as_str().unwrap_or_default().to_owned();
                    let ip = statuses
                        .iter()
                        .find(|s| s["macAddress"] == mac.as_str() && s["state"] == "Allocated")
                        .and_then(|s| s["allocatedIPAddress"].as_str())
                        .map(str::to_owned);
                    (mac, ip)
                })
                .collect();
            (name, nics)
        })
        .collect()
}

/// MACs of the VMs in [`NS`].
fn vm_macs(fleet: &Fleet) -> BTreeSet<String> {
    let list = fleet.kubectl_json(&["-n", NS, "get", "vm"]);
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|vm| {
            vm["spec"]["template"]["spec"]["domain"]["devices"]["interfaces"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|nic| nic["macAddress"].as_str().map(str::to_lowercase))
        .collect()
}

#[test]
fn seeded_faults_under_churn_lose_no_lease_and_bound_every_outage() {
    let seed = std::env::var("VMDHCP_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    let seconds = std::env::var("VMDHCP_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(150);
    let mut rng = Rng(seed);
    let plan = schedule(&mut rng, seconds);
    report!("soak seed {seed} (VMDHCP_SOAK_SEED={seed} replays it), {seconds} s of faults");
    for (at, fault, pause) in &plan {
        report!(
            "  planned at {:>5.1} s: {fault:?}, restarted after {:.1} s",
            at.as_secs_f64(),
            pause.as_secs_f64()
        );
    }

    let began = Instant::now();
    let phase = |what: &str| report!("[{:>6.1} s] {what}", began.elapsed().as_secs_f64());
    let mut fleet = setup_with(Options {
        controller_replicas: 2,
        ..Options::default()
    });
    phase("control plane, controllers and pool up");
    let kubeconfig = fleet.cp.kubeconfig().to_owned();
    fleet
        .cp
        .kubectl_stdin(
            &[
                "-n",
                NS,
                "patch",
                "ippool",
                "pool-a",
                "--type=merge",
                "--patch-file=/dev/stdin",
            ],
            &json!({"spec": {"ipv4Config": {"leaseTime": 60}, "claims": {"namespaces": [NS]}}})
                .to_string(),
        )
        .unwrap();

    // Two agents, and 20 VMs with a dhclient each, bound to their allocated addresses.
    let slots = [fleet.agent_netns(0), fleet.agent_netns(1)];
    let mut agents: Vec<Agent> = slots
        .iter()
        .enumerate()
        .map(|(i, ns)| fleet.start_agent(ns, &format!("agent-{i}-0")))
        .collect();
    let clients: Vec<(String, String)> = (0..CLIENTS)
        .map(|i| (format!("c{i:02}"), format!("02:12:36:00:00:{i:02x}")))
        .collect();
    for (name, mac) in &clients {
        fleet.apply_vm(name, mac, "net-a");
    }
    let initial = wait_for("every client allocated", Duration::from_secs(90), || {
        let allocated = fleet.allocated();
        clients
            .iter()
            .map(|(_, mac)| allocated.get(mac).cloned())
            .collect::<Option<Vec<String>>>()
    });
    phase("20 clients allocated");
    fleet.leader(&[&agents[0], &agents[1]]);
    phase("an agent leads");
    let mut dirs = Vec::new();
    for (name, mac) in &clients {
        let vm = fleet.vm(name, mac);
        let dir = fleet.dir.path().join(name);
        fs::create_dir_all(&dir).unwrap();
        start_dhclient(&mut fleet.lab, &vm, &dir);
        dirs.push(dir);
    }
    for (dir, ip) in dirs.iter().zip(&initial) {
        wait_for("every dhclient bound", Duration::from_secs(60), || {
            (dhclient_lease(&dir.join("dhclient.leases")).get("fixed-address") == Some(ip))
                .then_some(())
        });
    }

    phase("20 clients bound; faults begin");
    // The load: churn and probes, in threads, while this thread injects the faults.
    let probe_ns = fleet.vm("probe", "02:12:37:00:00:01");
    let probe = Probe::start(&mut fleet.lab, &probe_ns, 30);
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let wall_start = std::time::SystemTime::now();
    let targets: Vec<(String, String)> = clients
        .iter()
        .zip(&initial)
        .map(|((_, mac), ip)| (mac.clone(), ip.clone()))
        .collect();
    let prober = prober(probe, targets, start, stop.clone());
    let churn = churn(kubeconfig.clone(), rng.next(), stop.clone());

    let mut timeline = Vec::new();
    // The second writer's entries (MAC → address): no VM holds them; each must survive.
    let mut foreign: BTreeMap<String, String> = BTreeMap::new();
    // The claims made (by their number) and the MACs of the VMs they bind.
    let mut claimed: Vec<String> = Vec::new();
    for (at, fault, pause) in plan {
        if let Some(wait) = at.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        let t = start.elapsed().as_secs_f64();
        let holders = lease_holders(&fleet);
        let what = match fault {
            Fault::KillController(n) | Fault::StopController(n) => {
                let replica = &mut fleet.replicas[n];
                let role = if holders.contains(&replica.identity) {
                    "leader"
                } else {
                    "follower"
                };
                let process = replica.process.as_mut().unwrap();
                let kill = matches!(fault, Fault::KillController(_));
                process.signal(if kill { "KILL" } else { "TERM" });
                let exit = wait_exit(process);
                let what = format!(
                    "{} controller {} ({role}), exited in {:.1} s",
                    if kill { "kill -9" } else { "SIGTERM" },
                    replica.identity,
                    exit.as_secs_f64()
                );
                replica.process.take();
                std::thread::sleep(pause);
                fleet.start_replica(n);
                what
            }
            Fault::KillAgent(leader) | Fault::StopAgent(leader) => {
                let slot = (0..agents.len())
                    .find(|&i| holders.contains(&agents[i].identity) == leader)
                    .unwrap_or(0);
                let role = if holders.contains(&agents[slot].identity) {
                    "leader"
                } else {
                    "standby"
                };
                let kill = matches!(fault, Fault::KillAgent(_));
                agents[slot]
                    .process
                    .signal(if kill { "KILL" } else { "TERM" });
                let exit = wait_exit(&agents[slot].process);
                let what = format!(
                    "{} agent {} ({role}), exited in {:.1} s",
                    if kill { "kill -9" } else { "SIGTERM" },
                    agents[slot].identity,
                    exit.as_secs_f64()
                );
                agents[slot].process.stop();
                std::thread::sleep(pause);
                let identity = format!("agent-{slot}-{}", timeline.len() + 1);
                agents[slot] = fleet.start_agent(&slots[slot], &identity);
                what
            }
            Fault::ForeignWriter => {
                let written = foreign_write(&kubeconfig, foreign.len(), 5);
                let what = format!("a second writer recorded {written:?} in pool-a");
                foreign.extend(written);
                what
            }
            Fault::Claims => {
                let mac = claim_write(&kubeconfig, claimed.len());
                let what = format!(
                    "claims vip-{0} and nic-{0} made, VM claimed-{0} ({mac}) created",
                    claimed.len()
                );
                claimed.push(mac);
                what
            }
            Fault::RestartApi => {
                let begun = Instant::now();
                fleet.cp.restart().unwrap();
                format!(
                    "API server and etcd restarted, ready again in {:.1} s",
                    begun.elapsed().as_secs_f64()
                )
            }
        };
        report!("  at {t:>5.1} s: {what}");
        timeline.push((t, what));
    }

    // Let the last fault's outage end, then stop the load and let the system converge.
    phase("faults done");
    fleet.leader(&[&agents[0], &agents[1]]);
    stop.store(true, Ordering::Relaxed);
    let churned = churn.join().unwrap();
    let probes = prober.join().unwrap();
    // On a timeout the message says which MACs are off and the controllers' last words.
    let deadline = Instant::now() + Duration::from_secs(120);
    let macs = loop {
        let macs = vm_macs(&fleet);
        let allocated = fleet.allocated();
        let configs = configs(&fleet);
        let held: BTreeSet<String> = configs
            .values()
            .flatten()
            .filter(|(_, ip)| ip.is_some())
            .map(|(mac, _)| mac.to_lowercase())
            .collect();
        let in_pool: BTreeSet<String> = allocated
            .keys()
            .map(|m| m.to_lowercase())
            .filter(|m| !foreign.contains_key(m))
            .filter(|m| !m.starts_with("06:c1:"))
            .collect();
        // Every claim held: each VIP for its placeholder, each NIC claim for its VM's MAC.
        let claims = claim_states(&fleet);
        let claims_held = (0..claimed.len()).all(|k| {
            let vip = claims.get(&format!("vip-{k}"));
            let nic = claims.get(&format!("nic-{k}"));
            let recorded = |(_, mac, ip): &(String, String, String)| {
                allocated.get(mac) == Some(ip) && !ip.is_empty()
            };
            vip.is_some_and(|c| c.0 == "Reserved" && c.1.starts_with("06:c1:") && recorded(c))
                && nic.is_some_and(|c| c.0 == "Bound" && c.1 == claimed[k] && recorded(c))
        });
        if held == macs && in_pool == macs && claims_held {
            break macs;
        }
        if Instant::now() > deadline {
            keep_logs(&fleet);
            let logs: Vec<String> = fleet
                .replicas
                .iter()
                .filter_map(|r| {
                    Some(format!(
                        "{}:\n{}",
                        r.identity,
                        r.process.as_ref()?.log_tail(40)
                    ))
                })
                .collect();
            panic!(
                "not converged 120 s after the faults: VMs' MACs without an address in their \
                 config {:?}; configs holding one for no VM {:?}; VMs' MACs missing from the pool \
                 {:?}; in the pool for no VM {:?}\nclaims (all held: {claims_held}): {claims:?}\n\
                 configs: {configs:?}\ncontroller logs:\n{}",
                macs.difference(&held).collect::<Vec<_>>(),
                held.difference(&macs).collect::<Vec<_>>(),
                macs.difference(&in_pool).collect::<Vec<_>>(),
                in_pool.difference(&macs).collect::<Vec<_>>(),
                logs.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };

    phase("converged");
    // No address held by two MACs: in the configs, in the pool (IP → MAC, one MAC per IP by
    // construction; so no MAC twice), and in what the clients hold.
    let mut by_ip: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (mac, ip) in configs(&fleet).into_values().flatten() {
        by_ip.entry(ip.unwrap()).or_default().insert(mac);
    }
    let doubled: Vec<_> = by_ip.iter().filter(|(_, m)| m.len() > 1).collect();
    assert!(
        doubled.is_empty(),
        "addresses held by two MACs: {doubled:?}"
    );
    let allocated = fleet.allocated();
    let pool_ips: BTreeSet<&String> = allocated.values().collect();
    assert_eq!(
        pool_ips.len(),
        allocated.len(),
        "a MAC holds two addresses: {allocated:?}"
    );

    // Over DHCP, from a host on the network: a claim bound to a VM's NIC is that NIC's lease;
    // a VIP is answered to no one, not even a host forging the claim's placeholder MAC.
    let claims = claim_states(&fleet);
    let check_ns = fleet.vm("claimcheck", "02:12:37:00:00:02");
    let mut check = Probe::start(&mut fleet.lab, &check_ns, 3);
    for k in 0..claimed.len() {
        let (_, placeholder, vip) = &claims[&format!("vip-{k}")];
        assert!(
            check.try_ask(&format!("discover {placeholder}")).is_none(),
            "a DISCOVER from vip-{k}'s placeholder {placeholder} was answered"
        );
        assert!(
            check
                .try_ask(&format!("request {placeholder} {vip}"))
                .is_none(),
            "a REQUEST for VIP {vip} from its placeholder was acknowledged"
        );
        let (_, mac, ip) = &claims[&format!("nic-{k}")];
        assert!(
            check.try_ask(&format!("request {mac} {ip}")).is_some(),
            "nic-{k}'s VM ({mac}) was not acknowledged its claimed {ip}"
        );
    }
    report!(
        "{} claim pairs held through the faults; each VIP unanswered over DHCP, each NIC claim acknowledged",
        claimed.len()
    );

    // Nothing the second writer recorded was dropped or given to another MAC.
    for (mac, ip) in &foreign {
        assert_eq!(
            allocated.get(mac),
            Some(ip),
            "the second writer's {mac} lost its address"
        );
    }

    // No allocation lost, every client kept its address (in the pool, in its lease file, and in
    // every event its hook saw).
    keep_logs(&fleet);

    // The longest outage.
    let mut worst: Vec<(Duration, &str, f64)> = Vec::new();
    let mut unanswered = Vec::new();
    let mut total = 0;
    for ((name, _), samples) in clients.iter().zip(&probes) {
        total += samples.len();
        for (sent, wait) in samples {
            match wait {
                Some(wait) => worst.push((*wait, name, *sent)),
                None => unanswered.push(format!("{name} at {sent:.1} s")),
            }
        }
    }
    worst.sort_by_key(|w| std::cmp::Reverse(w.0));
    report!(
        "soak seed {seed}: {} faults, {total} probes, churn {} created / {} deleted / {} calls failed, {} VMs at the end",
        timeline.len(),
        churned.created,
        churned.deleted,
        churned.failed,
        macs.len()
    );
    report!("longest waits for an ACK (client, when the probe was sent):");
    for (wait, name, sent) in worst.iter().take(8) {
        report!("  {:>6.2} s  {name} at {sent:>5.1} s", wait.as_secs_f64());
    }
    let mut changed = Vec::new();
    for (((name, mac), ip), dir) in clients.iter().zip(&initial).zip(&dirs) {
        assert_eq!(
            allocated.get(mac),
            Some(ip),
            "{name}'s allocation moved or was lost"
        );
        let lease = dhclient_lease(&dir.join("dhclient.leases"));
        assert_eq!(lease.get("fixed-address"), Some(ip), "{name}'s lease");
        for entry in fs::read_dir(dir.join("events")).unwrap().flatten() {
            let file = entry.file_name().to_string_lossy().into_owned();
            let event = file.split_once('-').map_or(file.as_str(), |(_, e)| e);
            let text = fs::read_to_string(entry.path()).unwrap_or_default();
            let address = text
                .lines()
                .find_map(|l| l.strip_prefix("new_ip_address="))
                .map(str::to_owned);
            let moved = address.as_ref().is_some_and(|a| a != ip);
            if moved || matches!(event, "EXPIRE" | "FAIL" | "RELEASE" | "STOP") {
                let at = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.duration_since(wall_start).ok())
                    .map_or(-1.0, |d| d.as_secs_f64());
                changed.push(format!("{name}: {event} {address:?} at {at:.1} s"));
            }
        }
    }
    assert!(
        changed.is_empty(),
        "clients that lost or changed their address: {changed:?}"
    );
    assert!(
        unanswered.is_empty(),
        "probes never answered: {unanswered:?}"
    );
    let longest = worst.first().map(|w| w.0).unwrap_or_default();
    assert!(
        longest <= OUTAGE_BOUND,
        "longest outage {longest:?} > {OUTAGE_BOUND:?} (seed {seed}); faults: {timeline:#?}"
    );
}
