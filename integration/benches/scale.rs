//! Scale benchmark: a cluster built up to 20 000 VMs (one Multus NIC each) on 200 pools (/24,
//! 100 VMs per pool), against the real kube-apiserver, with two `vm-dhcp-controller` processes
//! electing a leader, 20 config-stream clients (the agent's own stream client, in this process,
//! half on each replica) and one real `vm-dhcp-agent` process (standby, every pool: it holds the
//! whole lease table as a hot standby does).
//!
//! At each step (200, 2 000, 5 000, 10 000, 20 000 VMs built up; the timed VMs below are named
//! apart and come on top, so the VMs column, the cluster's size, also counts every step's timed
//! VMs so far) it prints: allocations/s while building up to the step and the controllers' API
//! calls per allocation; the leader's CPU seconds per
//! 1 000 allocations (and every other process's); for 300 more VMs created one at a time, once
//! the build-up's events are published, create → lease in a stream client's table (what the
//! serving agent would offer; p50/p99, and their ratios to the first step's; also from the VM's
//! POST answered, which leaves out the API server's own round trip), and pool status
//! recorded → lease applied by all 20 clients (p50/p99); the API server's own round trips on the
//! idle cluster (the VM's POST, a ConfigMap PATCH); the leader's and the agent's RSS; a fresh
//! client's snapshot time; the leader's CPU at rest (and the build-up's less that). Then a
//! control: as many fresh pools built up as the second step built up the first ones, at the full
//! cluster's size, with the leader's CPU per allocation — the same as at the second step if that
//! cost follows the pools' fill, not the cluster's size.
//! At the end: `kill -9` of the leader → the new leader's
//! first allocation (from its Lease acquired), and a restart of both controllers on the
//! converged cluster, counting its writes to the API.
//!
//! `cargo bench -p vmdhcp-integration --bench scale` (as root or not; no network namespaces).
//! `VMDHCP_SCALE_POOLS=20 VMDHCP_SCALE_VMS=2000` runs it small (steps scale with the total);
//! `VMDHCP_SCALE_SAMPLES=<n>` times n VMs one at a time per step (default [`SAMPLES`]),
//! `VMDHCP_SCALE_AT_REST=<s>` watches the leader at rest for s seconds (default [`AT_REST`]) and
//! `VMDHCP_SCALE_REFERENCE=<n>` makes the reference workload n round trips (default
//! [`REFERENCE_ROUND_TRIPS`]): smaller, they let a tiny run (`scripts/bench-smoke.sh`) reach the
//! end quickly, its tails and ratios then rough;
//! `VMDHCP_SCALE_PACE=<VMs/s>` creates the VMs at that pace instead of as fast as the API takes
//! them (alloc/s is then the pace; the CPU per allocation of the steps compares at one rate);
//! `VMDHCP_SCALE_LOGS=<dir>` keeps the controllers' and the agent's logs there;
//! `VMDHCP_SCALE_PERF=<dir>` has `perf record` (DWARF call graphs: the build has no frame
//! pointers) sample the leader through each step's build-up, into `<dir>/leader-<VMs>.data`, so
//! where its CPU per allocation grows can be read off two steps of one run.
#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs
)]

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ObjectMeta, Patch, PatchParams, PostParams,
};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::watch;
use tokio::time::Instant;
use vmdhcp_agent::stream::{AppliedState, Applier, ClientSettings, ConfigSink, PoolDelta, run};
use vmdhcp_core::MacAddr;
use vmdhcp_core::crd::{IPPool, VirtualMachineNetworkConfig, find_condition};
use vmdhcp_integration::control_plane::ControlPlane;
use vmdhcp_integration::dhcp_client::wait_for_async;
use vmdhcp_integration::fleet::{metric, vm_manifest};
use vmdhcp_integration::ports::free_port;
use vmdhcp_integration::process::{Supervised, cpu_seconds, rss_mb, workspace_binary};
use vmdhcp_proto::agent::v1 as pb;

const CLIENTS: usize = 20;
/// One-at-a-time VMs measured at each step: enough that the p99 is not one of the API server's
/// own slow answers (with 300 it is the fourth slowest; with fewer it follows the API server's
/// own tail from run to run: docs/tuning.md).
const SAMPLES: usize = 300;
/// How long the leader is watched at rest after each step: what it spends with nothing to do
/// (Lease renewals, watch bookmarks, the agent's reports, timers) is part of the build-up's CPU
/// per allocation in proportion to how long the build-up took, so a slower step shows more of
/// it without any allocation costing more.
const AT_REST: Duration = Duration::from_secs(10);
/// The reference workload's round trips ([`reference_seconds`]): many, since the thread's CPU
/// clock counts in ticks of 10 ms.
const REFERENCE_ROUND_TRIPS: usize = 40_000;
/// The controllers' elections: slow enough that a loaded 2-core machine does not depose the
/// leader mid-build (the failover figure is measured from the Lease's acquisition).
const ELECTION: [&str; 3] = [
    "--lease-duration-seconds=15",
    "--renew-deadline-seconds=10",
    "--retry-period-seconds=2",
];

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn vm_ar() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachine"),
        "virtualmachines",
    )
}

/// VM number `k`: on pool `k % pools`, with a MAC no other VM has.
fn vm_of(k: usize, pools: usize) -> (String, MacAddr, usize) {
    let b = (k as u32).to_be_bytes();
    (
        format!("vm-{k}"),
        MacAddr([2, 0x50, b[1], b[2], b[3], 1]),
        k % pools,
    )
}

/// Timed VM number `t`: named and addressed apart from every [`vm_of`] (and the control's
/// VMs), so the build-ups and the timed VMs never take each other's names or MACs.
fn timed_vm_of(t: usize, pools: usize) -> (String, MacAddr, usize) {
    let b = (t as u32).to_be_bytes();
    (
        format!("timed-{t}"),
        MacAddr([2, 0x52, b[1], b[2], b[3], 1]),
        t % pools,
    )
}

/// `perf record` of process `pid` into `out`, until [`stop_perf`].
fn start_perf(pid: u32, out: &Path) -> std::process::Child {
    std::process::Command::new("perf")
        .args(["record", "-F", "99", "--call-graph", "dwarf,8192", "-o"])
        .arg(out)
        .args(["-p", &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("VMDHCP_SCALE_PERF needs `perf` on PATH")
}

/// Stops a [`start_perf`] recording the way perf expects (SIGINT), and waits for its file.
fn stop_perf(mut perf: std::process::Child) {
    let _ = std::process::Command::new("kill")
        .args(["-INT", &perf.id().to_string()])
        .status();
    let _ = perf.wait();
}

/// CPU seconds a fixed piece of work takes on this machine right now: a full pool's
/// `allocated` map (100 entries) through JSON and back `round_trips` times
/// ([`REFERENCE_ROUND_TRIPS`] unless `VMDHCP_SCALE_REFERENCE` says), on a thread of its own,
/// timed by that thread's CPU clock. A shared machine's speed drifts within a run (the figures
/// of processes whose work per allocation is fixed move together: docs/tuning.md); a step's
/// CPU per allocation over this, against the first step's, tells the code's growth from the
/// machine's.
fn reference_seconds(round_trips: usize) -> f64 {
    std::thread::spawn(move || {
        let allocated: BTreeMap<String, String> = (0..100u32)
            .map(|i| (format!("10.0.0.{i}"), format!("02:00:00:00:00:{i:02x}")))
            .collect();
        let t0 = cpu_seconds("thread-self");
        let mut entries = 0;
        for _ in 0..round_trips {
            let text = serde_json::to_string(&allocated).unwrap();
            let back: BTreeMap<String, String> = serde_json::from_str(&text).unwrap();
            entries += back.len();
        }
        std::hint::black_box(entries);
        cpu_seconds("thread-self") - t0
    })
    .join()
    .unwrap()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// When each MAC first reached a stream client's table, and when its snapshots landed.
#[derive(Default)]
struct Sink {
    leases: Mutex<HashMap<MacAddr, Instant>>,
    snapshots: Mutex<Vec<Instant>>,
}

impl ConfigSink for Sink {
    fn snapshot(&self, state: &AppliedState) {
        let now = Instant::now();
        let mut leases = self.leases.lock().unwrap();
        for pool in state.pools.values() {
            for mac in pool.leases.keys() {
                leases.entry(*mac).or_insert(now);
            }
        }
        self.snapshots.lock().unwrap().push(now);
    }

    fn delta(&self, delta: &PoolDelta, _: &AppliedState) {
        let now = Instant::now();
        let mut leases = self.leases.lock().unwrap();
        for lease in &delta.upserted_leases {
            leases.entry(lease.mac).or_insert(now);
        }
    }
}

fn start_client(endpoint: String, name: String, stop: watch::Receiver<bool>) -> Arc<Sink> {
    let sink = Arc::new(Sink::default());
    let identity = pb::AgentIdentity {
        pod_name: name,
        namespace: "bench".into(),
        node_name: "n".into(),
    };
    let (status, _) = watch::channel(Default::default());
    tokio::spawn(run(
        ClientSettings::new(endpoint, identity),
        Applier::default(),
        sink.clone(),
        status,
        stop,
    ));
    sink
}

/// One controller replica: fixed ports, a new identity per start.
struct Replica {
    grpc: u16,
    http: u16,
    process: Option<Supervised>,
    starts: usize,
}

impl Replica {
    fn start(&mut self, index: usize, kubeconfig: &Path, lease_ns: &str, dir: &Path) {
        let identity = format!("controller-{index}-{}", self.starts);
        self.starts += 1;
        let mut args = vec![
            "run".to_owned(),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--identity={identity}"),
            format!("--grpc-listen=127.0.0.1:{}", self.grpc),
            format!("--http-listen=127.0.0.1:{}", self.http),
            format!("--leader-election-namespace={lease_ns}"),
            "--grpc-plaintext".into(),
        ];
        args.extend(ELECTION.iter().map(|s| (*s).to_owned()));
        let bin = workspace_binary("vmdhcp-controller", "vm-dhcp-controller");
        let log = dir.join(format!("{identity}.log"));
        self.process = Some(Supervised::spawn(&bin, &args, &log, None).unwrap());
    }

    fn metrics(&self) -> String {
        vmdhcp_integration::http::get(&format!("127.0.0.1:{}", self.http), "/metrics")
            .unwrap_or_default()
    }

    fn leads(&self) -> bool {
        metric(&self.metrics(), "vmdhcpcontroller_leader ") == Some(1.0)
    }

    fn pid(&self) -> u32 {
        self.process.as_ref().and_then(Supervised::pid).unwrap()
    }
}

/// [`wait_for_async`], polling every 20 ms.
async fn poll<T>(what: &str, limit: Duration, f: impl AsyncFnMut() -> Option<T>) -> T {
    wait_for_async(what, limit, Duration::from_millis(20), f).await
}

/// What the bench's own watches saw: allocated configs and when, and when each MAC first
/// appeared in a pool's status.
#[derive(Default)]
struct Seen {
    allocated: Mutex<HashMap<String, Instant>>,
    recorded: Mutex<HashMap<MacAddr, Instant>>,
}

fn watch_cluster(client: &Client, ns: &str, seen: Arc<Seen>) -> [tokio::task::JoinHandle<()>; 2] {
    let cfgs: Api<VirtualMachineNetworkConfig> = Api::namespaced(client.clone(), ns);
    let s = seen.clone();
    let configs = tokio::spawn(async move {
        let mut events =
            std::pin::pin!(watcher(cfgs, watcher::Config::default()).applied_objects());
        while let Some(event) = events.next().await {
            let Ok(cfg) = event else { continue };
            let done = cfg.status.as_ref().is_some_and(|st| {
                find_condition(&st.conditions, "Allocated").is_some_and(|a| a.status == "True")
            });
            if done {
                s.allocated
                    .lock()
                    .unwrap()
                    .entry(cfg.name_any())
                    .or_insert_with(Instant::now);
            }
        }
    });
    let pools: Api<IPPool> = Api::namespaced(client.clone(), ns);
    let pools = tokio::spawn(async move {
        let mut events =
            std::pin::pin!(watcher(pools, watcher::Config::default()).applied_objects());
        while let Some(event) = events.next().await {
            let Ok(pool) = event else { continue };
            let now = Instant::now();
            let mut recorded = seen.recorded.lock().unwrap();
            for mac in pool
                .status
                .iter()
                .flat_map(|s| s.ipv4.iter())
                .flat_map(|v4| v4.allocated.values())
                .filter_map(|m| m.parse::<MacAddr>().ok())
            {
                recorded.entry(mac).or_insert(now);
            }
        }
    });
    [configs, pools]
}

/// Requests by (verb, resource).
type Counts = BTreeMap<(String, String), f64>;

/// The controllers' API calls between two readings: everything but the bench's own creates,
/// the namespaced LISTs (the bench's and the standby agent's watches relisting; the controllers
/// list across all namespaces, and their GETs of a pool's status after a conflict are counted
/// as GETs), the Leases (elections), the API server's own endpoints, and the Kubernetes events:
/// those are best-effort, published from a bounded queue after the allocation and dropped when
/// it is full, so how many fall within a build-up depends on its rate (about one per allocation
/// when paced, most dropped when API-bound); they are counted apart ([`EventsSeen`]).
fn controller_calls(
    before: &Counts,
    after: &Counts,
    own_creates: f64,
) -> (f64, Counts, BTreeMap<String, f64>) {
    let mut by = BTreeMap::new();
    let mut namespaced_lists = BTreeMap::new();
    for (k, v) in after {
        let mut d = v - before.get(k).copied().unwrap_or(0.0);
        if k.0 == "POST" && k.1 == "virtualmachines" {
            d -= own_creates;
        }
        if k.1 == "leases" || k.1 == "endpoints" || k.1 == "events" || d < 1.0 {
            continue;
        }
        if k.0 == "LIST" && !k.1.ends_with(" (all namespaces)") {
            namespaced_lists.insert(k.1.clone(), d);
            continue;
        }
        by.insert(k.clone(), d);
    }
    (by.values().sum(), by, namespaced_lists)
}

/// The leader's event counters (`vmdhcpcontroller_events`): published, dropped.
#[derive(Clone, Copy, Default)]
struct EventsSeen {
    published: f64,
    dropped: f64,
}

impl EventsSeen {
    fn read(replica: &Replica) -> Self {
        let text = replica.metrics();
        let count = |result: &str| {
            metric(
                &text,
                &format!("vmdhcpcontroller_events_total{{result=\"{result}\"}}"),
            )
            .unwrap_or(0.0)
        };
        EventsSeen {
            published: count("published"),
            dropped: count("dropped"),
        }
    }
}

/// Writes (not GET or LIST) in a delta of request counts, Leases and endpoints left out.
fn writes(before: &Counts, after: &Counts) -> Counts {
    vmdhcp_integration::control_plane::writes_between(before, after, &["endpoints", "leases"])
}

/// Returns once 2 s pass without a write to the API (Leases and endpoints aside); 300 s at most.
async fn quiet(cp: &ControlPlane) {
    poll(
        "the API writes to stop",
        Duration::from_secs(300),
        async || {
            let a = cp.requests().unwrap();
            tokio::time::sleep(Duration::from_secs(2)).await;
            writes(&a, &cp.requests().unwrap()).is_empty().then_some(())
        },
    )
    .await;
}

/// The cluster under test as the bench drives it: the API, its watches and the stream clients'
/// tables, and the VMs created so far.
struct Bench {
    cp: ControlPlane,
    client: Client,
    ns: String,
    pools: usize,
    seen: Arc<Seen>,
    watches: [tokio::task::JoinHandle<()>; 2],
    sinks: Vec<Arc<Sink>>,
    /// Build-up VMs created, [`vm_of`] `0..built`.
    built: usize,
    /// Timed VMs created, [`timed_vm_of`] `0..timed`: counted apart, so that a build-up never
    /// starts on a name a timed VM took.
    timed: usize,
}

/// The pace of the build-ups, VMs created per second (`VMDHCP_SCALE_PACE`; unset: as fast as
/// the API takes them, in waves of 100). What a component spends per allocation depends on the
/// rate as well as on the cluster (at a higher rate more events share a read, a wakeup, a TLS
/// record), and the API-bound rate falls as the cluster grows: a pace below the slowest step's
/// rate compares the steps' CPU per allocation at one rate.
fn pace() -> Option<f64> {
    std::env::var("VMDHCP_SCALE_PACE")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|r| *r > 0.0)
}

/// Creates the VMs `vm(k)` (name, MAC, pool number) for each `k` of `ks` in `ns`, on
/// `ns/net-<pool>`: in waves of 100 at once, or one every 1 / [`pace`] s.
async fn create_vms(
    client: &Client,
    ns: &str,
    ks: std::ops::Range<usize>,
    vm: impl Fn(usize) -> (String, MacAddr, usize),
) {
    let vms: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &vm_ar());
    let create = |k: usize| {
        let (name, mac, pool) = vm(k);
        let manifest = vm_manifest(ns, &name, &mac.to_string(), &format!("{ns}/net-{pool}"));
        let object: DynamicObject = serde_json::from_value(manifest).unwrap();
        let vms = vms.clone();
        async move { vms.create(&PostParams::default(), &object).await.unwrap() }
    };
    if let Some(rate) = pace() {
        let ticks = tokio_stream::wrappers::IntervalStream::new(tokio::time::interval(
            Duration::from_secs_f64(1.0 / rate),
        ));
        futures_util::stream::iter(ks)
            .zip(ticks)
            .for_each_concurrent(None, |(k, _)| async move {
                create(k).await;
            })
            .await;
        return;
    }
    let ks: Vec<usize> = ks.collect();
    for wave in ks.chunks(100) {
        futures_util::future::join_all(wave.iter().map(|k| create(*k))).await;
    }
}

impl Bench {
    /// VMs in the cluster's namespace: built up and timed.
    fn vms(&self) -> usize {
        self.built + self.timed
    }

    /// Creates build-up VMs `self.built..upto` (none if there are that many already), in waves
    /// of 100 at once.
    async fn create_up_to(&mut self, upto: usize) {
        let pools = self.pools;
        create_vms(&self.client, &self.ns, self.built..upto, |k| {
            vm_of(k, pools)
        })
        .await;
        self.built = self.built.max(upto);
    }

    async fn wait_allocated(&self, n: usize, limit: Duration) {
        poll(&format!("{n} configs allocated"), limit, async || {
            (self.seen.allocated.lock().unwrap().len() >= n).then_some(())
        })
        .await;
    }

    /// One more timed VM: (create → in a client's table, pool status recorded → in all clients,
    /// create → pool status recorded, the create's own round trip), s.
    async fn one_more(&mut self) -> (f64, f64, f64, f64) {
        let (t, pools) = (self.timed, self.pools);
        let (_, mac, _) = timed_vm_of(t, pools);
        let t0 = Instant::now();
        create_vms(&self.client, &self.ns, t..t + 1, |k| timed_vm_of(k, pools)).await;
        self.timed += 1;
        let posted = t0.elapsed().as_secs_f64();
        let sinks = self.sinks.clone();
        let times: Vec<Instant> = poll(
            "a new VM's lease in every client",
            Duration::from_secs(60),
            async || {
                let t: Vec<Instant> = sinks
                    .iter()
                    .filter_map(|s| s.leases.lock().unwrap().get(&mac).copied())
                    .collect();
                (t.len() == sinks.len()).then_some(t)
            },
        )
        .await;
        let recorded = poll(
            "its address in the pool status",
            Duration::from_secs(10),
            async || self.seen.recorded.lock().unwrap().get(&mac).copied(),
        )
        .await;
        let first = times.iter().min().copied().unwrap();
        let last = times.iter().max().copied().unwrap();
        (
            first.duration_since(t0).as_secs_f64(),
            last.saturating_duration_since(recorded).as_secs_f64(),
            recorded.saturating_duration_since(t0).as_secs_f64(),
            posted,
        )
    }

    /// Round trips of a write whose cost does not depend on the cluster (a label on one
    /// ConfigMap), one at a time, ms sorted: how fast the API server itself answers at this size.
    async fn probe_writes(&self, n: usize) -> Vec<f64> {
        let maps: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.ns);
        if maps.get_opt("probe").await.unwrap().is_none() {
            let probe = ConfigMap {
                metadata: ObjectMeta {
                    name: Some("probe".into()),
                    ..Default::default()
                },
                ..Default::default()
            };
            maps.create(&PostParams::default(), &probe).await.unwrap();
        }
        let mut took = Vec::with_capacity(n);
        for i in 0..n {
            let patch = serde_json::json!({"metadata": {"labels": {"probe": i.to_string()}}});
            let t = Instant::now();
            maps.patch("probe", &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
            took.push(t.elapsed().as_secs_f64() * 1e3);
        }
        took.sort_by(f64::total_cmp);
        took
    }
}

/// The run's sizes and settings, from the environment (the top comment lists them).
struct Settings {
    pools: usize,
    total: usize,
    /// Build-up VMs at each step.
    steps: [usize; 5],
    /// VMs timed one at a time per step, and the API server's own round trips probed.
    samples: usize,
    at_rest: Duration,
    /// The reference workload's round trips.
    reference: usize,
    /// Where the leader's `perf` recordings go, if anywhere.
    perf: Option<PathBuf>,
}

impl Settings {
    fn from_env() -> Self {
        let pools = env_usize("VMDHCP_SCALE_POOLS", 200);
        let total = env_usize("VMDHCP_SCALE_VMS", 20_000);
        let at_rest = std::env::var("VMDHCP_SCALE_AT_REST")
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|s| *s > 0.0)
            .map_or(AT_REST, Duration::from_secs_f64);
        let perf = std::env::var_os("VMDHCP_SCALE_PERF").map(PathBuf::from);
        if let Some(d) = &perf {
            std::fs::create_dir_all(d).unwrap();
        }
        Settings {
            pools,
            total,
            steps: [pools, total / 10, total / 4, total / 2, total],
            samples: env_usize("VMDHCP_SCALE_SAMPLES", SAMPLES).max(1),
            at_rest,
            reference: env_usize("VMDHCP_SCALE_REFERENCE", REFERENCE_ROUND_TRIPS).max(1),
            perf,
        }
    }
}

/// The processes measured besides the API server: two controller replicas electing a leader
/// and the standby agent; and the switch that stops the bench's stream clients.
struct Processes {
    replicas: Vec<Replica>,
    /// The replica that leads.
    leader: usize,
    /// The namespace of the Leases.
    system: String,
    logs: PathBuf,
    agent: Supervised,
    agent_pid: u32,
    agent_http: u16,
    clients_stop: watch::Sender<bool>,
    /// The logs' directory unless `VMDHCP_SCALE_LOGS` names one; last, so that it goes once the
    /// processes writing there have stopped.
    _dir: tempfile::TempDir,
}

impl Processes {
    fn leader(&self) -> &Replica {
        &self.replicas[self.leader]
    }

    fn follower(&self) -> &Replica {
        &self.replicas[1 - self.leader]
    }

    /// The leases the standby agent holds.
    fn agent_leases(&self) -> usize {
        let text =
            vmdhcp_integration::http::get(&format!("127.0.0.1:{}", self.agent_http), "/metrics")
                .unwrap_or_default();
        metric(&text, "vmdhcp_agent_leases{").unwrap_or(0.0) as usize
    }
}

/// Starts the API server, the pools, both controllers, the stream clients, the standby agent and
/// the bench's own watches.
async fn setup(settings: &Settings) -> (Bench, Processes) {
    let pools = settings.pools;
    let cp = ControlPlane::start().unwrap();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "scale").await.unwrap();
    let system = cp.namespace(&client, "scale-system").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The processes' logs: kept where VMDHCP_SCALE_LOGS says, else gone with the run.
    let logs =
        std::env::var_os("VMDHCP_SCALE_LOGS").map_or_else(|| dir.path().to_owned(), PathBuf::from);
    std::fs::create_dir_all(&logs).unwrap();

    // The NADs and pools, a /24 each.
    vmdhcp_integration::pools::create(&client, &ns, pools, 60)
        .await
        .unwrap();

    // Two electing controllers.
    let mut replicas: Vec<Replica> = (0..2)
        .map(|_| Replica {
            grpc: free_port(),
            http: free_port(),
            process: None,
            starts: 0,
        })
        .collect();
    for (i, r) in replicas.iter_mut().enumerate() {
        r.start(i, cp.kubeconfig(), &system, &logs);
    }
    let leader = poll("a leader", Duration::from_secs(120), async || {
        replicas.iter().position(Replica::leads)
    })
    .await;
    poll("every pool ready", Duration::from_secs(300), async || {
        tokio::time::sleep(Duration::from_millis(500)).await;
        vmdhcp_integration::pools::all_ready(&client, &ns)
            .await
            .then_some(())
    })
    .await;

    // The stream clients, half on each replica, and one standby agent holding every pool: the
    // agents' Lease is held by someone else for a day, so it follows the stream without serving.
    let (clients_stop, clients_stop_rx) = watch::channel(false);
    let sinks: Vec<Arc<Sink>> = (0..CLIENTS)
        .map(|i| {
            let endpoint = format!("http://127.0.0.1:{}", replicas[i % 2].grpc);
            start_client(endpoint, format!("client-{i}"), clients_stop_rx.clone())
        })
        .collect();
    let leases: Api<Lease> = Api::namespaced(client.clone(), &system);
    leases
        .create(
            &PostParams::default(),
            &Lease {
                metadata: ObjectMeta {
                    name: Some("vm-dhcp-agents".into()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some("elsewhere".into()),
                    lease_duration_seconds: Some(86_400),
                    acquire_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
                    renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
                    ..Default::default()
                }),
            },
        )
        .await
        .unwrap();
    let agent_http = free_port();
    let agent_args: Vec<String> = vec![
        "run".into(),
        format!("--controller=http://127.0.0.1:{}", replicas[leader].grpc),
        format!("--kubeconfig={}", cp.kubeconfig().display()),
        "--identity=agent-scale".into(),
        format!("--namespace={system}"),
        "--all-pools".into(),
        "--no-configure-interfaces".into(),
        format!("--http-listen=127.0.0.1:{agent_http}"),
    ];
    let agent_bin: PathBuf = workspace_binary("vmdhcp-agent", "vm-dhcp-agent");
    let agent = Supervised::spawn(&agent_bin, &agent_args, &logs.join("agent.log"), None).unwrap();
    let agent_pid = agent.pid().unwrap();

    let seen = Arc::new(Seen::default());
    let watches = watch_cluster(&client, &ns, seen.clone());
    let bench = Bench {
        cp,
        client,
        ns,
        pools,
        seen,
        watches,
        sinks,
        built: 0,
        timed: 0,
    };
    let processes = Processes {
        replicas,
        leader,
        system,
        logs,
        agent,
        agent_pid,
        agent_http,
        clients_stop,
        _dir: dir,
    };
    (bench, processes)
}

fn print_header(settings: &Settings) {
    let (pools, total) = (settings.pools, settings.total);
    println!(
        "scale: {pools} pools (/24), up to {total} VMs, 2 controller processes (host build, jemalloc as in the image), {CLIENTS} stream clients, 1 standby agent (real kube-apiserver v1.20)"
    );
    println!(
        "{:>7} | {:>8} | {:>9} | {:>10} | {:>17} | {:>15} | {:>17} | {:>9} | {:>9} | {:>9}",
        "VMs",
        "alloc/s",
        "API/alloc",
        "CPU s/1000",
        "create→table p50/p99 ms",
        "vs first p50/p99",
        "status→all 20 p50/p99 ms",
        "leader MB",
        "agent MB",
        "snapshot ms"
    );
    if let Some(rate) = pace() {
        println!("        (paced: {rate} VMs created per second; alloc/s is not the API's limit)");
    }
}

/// A build-up to a step: what it allocated, how fast, and what that cost whom.
struct BuildUp {
    /// VMs created, each one allocation.
    adding: usize,
    /// Seconds from the first create to the last config allocated.
    took: f64,
    /// The leader's CPU seconds.
    cpu: f64,
    /// Every other process's CPU per 1 000 allocations, as printed.
    spent: Vec<String>,
    /// The controllers' API calls, in all and by (verb, resource), and the namespaced LISTs
    /// ([`controller_calls`]).
    calls: f64,
    by: Counts,
    namespaced_lists: BTreeMap<String, f64>,
    /// The leader's event counters before it.
    events0: EventsSeen,
}

impl BuildUp {
    /// `s` CPU seconds per 1 000 of the build-up's allocations.
    fn per_1000(&self, s: f64) -> f64 {
        s / self.adding.max(1) as f64 * 1000.0
    }
}

/// Builds the cluster up to `step` build-up VMs and waits for every config allocated, with the
/// leader's CPU and every other process's over it (and the leader under `perf` if asked).
async fn build_up(
    bench: &mut Bench,
    processes: &Processes,
    step: usize,
    perf_dir: Option<&Path>,
) -> BuildUp {
    let adding = step.saturating_sub(bench.built);
    let before = bench.cp.requests().unwrap();
    let events0 = EventsSeen::read(processes.leader());
    let leader_pid = processes.leader().pid();
    let cpu0 = cpu_seconds(leader_pid);
    // Everyone else's CPU over the same build-up: where an allocation's cost goes.
    let (apiserver_pid, etcd_pid) = bench.cp.pids();
    let others = [
        ("kube-apiserver", apiserver_pid),
        ("etcd", etcd_pid),
        ("follower", Some(processes.follower().pid())),
        ("agent", Some(processes.agent_pid)),
    ];
    let others0: Vec<f64> = others
        .iter()
        .map(|(_, p)| p.map_or(0.0, cpu_seconds))
        .collect();
    let bench0 = cpu_seconds("self");
    let perf = perf_dir.map(|d| start_perf(leader_pid, &d.join(format!("leader-{step}.data"))));
    let started = Instant::now();
    bench.create_up_to(step).await;
    bench
        .wait_allocated(bench.vms(), Duration::from_secs(1800))
        .await;
    let took = started.elapsed().as_secs_f64();
    if let Some(perf) = perf {
        stop_perf(perf);
    }
    let cpu = cpu_seconds(leader_pid) - cpu0;
    let per_1000 = |s: f64| s / adding.max(1) as f64 * 1000.0;
    let mut spent: Vec<String> = others
        .iter()
        .zip(&others0)
        .map(|((name, p), c0)| format!("{name} {:.2}", per_1000(p.map_or(0.0, cpu_seconds) - c0)))
        .collect();
    spent.push(format!(
        "bench (creates, watches, 20 clients) {:.2}",
        per_1000(cpu_seconds("self") - bench0)
    ));
    let (calls, by, namespaced_lists) =
        controller_calls(&before, &bench.cp.requests().unwrap(), adding as f64);
    BuildUp {
        adding,
        took,
        cpu,
        spent,
        calls,
        by,
        namespaced_lists,
        events0,
    }
}

/// Waits for the build-up's events to be published: the controller publishes them after it, one
/// at a time from a bounded queue, and the timed VMs are timed once that is over, as on a
/// cluster at rest. Returns how long it took, s (printed).
async fn drain_events(bench: &Bench) -> f64 {
    let drain = Instant::now();
    let event_posts = || bench.cp.requests_of("POST", "events").unwrap();
    let mut events = event_posts();
    while drain.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = event_posts();
        if now == events {
            break;
        }
        events = now;
    }
    drain.elapsed().as_secs_f64()
}

/// A step's timed VMs, ms, each list sorted.
#[derive(Default)]
struct Timed {
    /// Create → in a client's table.
    offered: Vec<f64>,
    /// Pool status recorded → in all clients' tables.
    applied: Vec<f64>,
    /// Create → in the pool's status.
    recorded: Vec<f64>,
    /// The VM's POST, its own round trip.
    posted: Vec<f64>,
    /// The VM's POST answered → in a client's table.
    after_post: Vec<f64>,
}

/// Creates `samples` timed VMs, one at a time.
async fn timed_vms(bench: &mut Bench, samples: usize) -> Timed {
    let mut timed = Timed::default();
    for _ in 0..samples {
        let (o, a, r, c) = bench.one_more().await;
        timed.offered.push(o * 1e3);
        timed.after_post.push((o - c) * 1e3);
        timed.applied.push(a * 1e3);
        timed.recorded.push(r * 1e3);
        timed.posted.push(c * 1e3);
    }
    for list in [
        &mut timed.offered,
        &mut timed.applied,
        &mut timed.recorded,
        &mut timed.posted,
        &mut timed.after_post,
    ] {
        list.sort_by(f64::total_cmp);
    }
    timed
}

/// The cluster at a step's size, its timed VMs in.
struct AtSize {
    /// The API server's own round trips on the idle cluster, ms sorted.
    probes: Vec<f64>,
    /// [`reference_seconds`], the machine's speed now.
    machine: f64,
    leader_mb: f64,
    agent_mb: f64,
    follower_mb: f64,
    /// A fresh client's snapshot, ms.
    snapshot_ms: f64,
    /// The leader's CPU seconds per second with nothing to do.
    at_rest: f64,
}

/// Measures the cluster at its size: the API server's own round trips, the machine's speed,
/// the processes' memory once the agent holds every lease, a fresh client's snapshot and the
/// leader at rest.
async fn at_size(bench: &Bench, processes: &Processes, settings: &Settings) -> AtSize {
    let probes = bench.probe_writes(settings.samples).await;
    let machine = reference_seconds(settings.reference);

    // Memory, once the agent holds every lease.
    let expected = bench.vms();
    poll(
        "the agent to hold every lease",
        Duration::from_secs(120),
        async || (processes.agent_leases() >= expected).then_some(()),
    )
    .await;
    let leader_mb = rss_mb(processes.leader().pid());
    let agent_mb = rss_mb(processes.agent_pid);
    // The follower holds the leader's caches (to lead at once), not its IPAM or queues.
    let follower_mb = rss_mb(processes.follower().pid());

    // A fresh client's snapshot (an agent reconnecting), from the leader.
    let (stop, stop_rx) = watch::channel(false);
    let t = Instant::now();
    let fresh = start_client(
        format!("http://127.0.0.1:{}", processes.leader().grpc),
        "fresh".into(),
        stop_rx,
    );
    let snapshot_at = poll(
        "a fresh client's snapshot",
        Duration::from_secs(60),
        async || fresh.snapshots.lock().unwrap().first().copied(),
    )
    .await;
    stop.send_replace(true);
    let snapshot_ms = snapshot_at.duration_since(t).as_secs_f64() * 1e3;

    // The leader at rest at this size (a measuring window, not a wait for anything).
    let leader_pid = processes.leader().pid();
    let rest0 = cpu_seconds(leader_pid);
    let rest_t = Instant::now();
    tokio::time::sleep(settings.at_rest).await;
    let at_rest = (cpu_seconds(leader_pid) - rest0) / rest_t.elapsed().as_secs_f64();
    AtSize {
        probes,
        machine,
        leader_mb,
        agent_mb,
        follower_mb,
        snapshot_ms,
        at_rest,
    }
}

/// What one step measured.
struct Step {
    /// VMs in the cluster, its timed VMs in.
    vms: usize,
    build: BuildUp,
    /// Seconds from the build-up's end to its events published.
    drained: f64,
    /// The leader's event counters then.
    events1: EventsSeen,
    timed: Timed,
    at: AtSize,
}

/// One step: the build-up to `step` VMs, its events published, the timed VMs, the cluster at
/// that size.
async fn measure_step(
    bench: &mut Bench,
    processes: &Processes,
    settings: &Settings,
    step: usize,
) -> Step {
    let build = build_up(bench, processes, step, settings.perf.as_deref()).await;
    let drained = drain_events(bench).await;
    let events1 = EventsSeen::read(processes.leader());
    let timed = timed_vms(bench, settings.samples).await;
    let at = at_size(bench, processes, settings).await;
    Step {
        vms: bench.vms(),
        build,
        drained,
        events1,
        timed,
        at,
    }
}

/// The first step's figures, which the later steps' are compared with.
#[derive(Default)]
struct Firsts {
    /// Create → in a client's table, p50 and p99.
    offered: Option<(f64, f64)>,
    /// The same from the VM's POST answered.
    after_post: Option<(f64, f64)>,
    /// [`reference_seconds`].
    machine: Option<f64>,
    /// The leader's CPU seconds per 1 000 allocations.
    leader: Option<f64>,
    /// The cluster's size and the leader's RSS, MB.
    rss: Option<(usize, f64)>,
}

impl Step {
    /// Prints the step's row of the table and its lines below it; the first step's figures go
    /// into `firsts`.
    fn print(&self, firsts: &mut Firsts) {
        let Step {
            vms,
            build,
            drained,
            events1,
            timed,
            at,
        } = self;
        let per_1000 = |s: f64| build.per_1000(s);
        let (adding, took) = (build.adding.max(1) as f64, build.took);
        let p50 = percentile(&timed.offered, 0.5);
        let p99 = percentile(&timed.offered, 0.99);
        let (reference, reference99) = *firsts.offered.get_or_insert((p50, p99));
        let ours = (
            percentile(&timed.after_post, 0.5),
            percentile(&timed.after_post, 0.99),
        );
        let ours0 = *firsts.after_post.get_or_insert(ours);
        let machine = at.machine;
        let machine0 = *firsts.machine.get_or_insert(machine);
        let leader_first = *firsts.leader.get_or_insert(per_1000(build.cpu));
        firsts.rss.get_or_insert((*vms, at.leader_mb));
        let follower_mb = at.follower_mb;
        println!(
            "{:>7} | {:>8.0} | {:>9.2} | {:>10.2} | {:>8.1} / {:>6.1} | {:>5.2}x / {:>5.2}x | {:>8.1} / {:>6.1} | {:>9.1} | {:>9.1} | {:>9.1}",
            vms,
            build.adding as f64 / took,
            build.calls / adding,
            per_1000(build.cpu),
            p50,
            p99,
            p50 / reference,
            p99 / reference99,
            percentile(&timed.applied, 0.5),
            percentile(&timed.applied, 0.99),
            at.leader_mb,
            at.agent_mb,
            at.snapshot_ms
        );
        println!(
            "        CPU s per 1 000 allocations besides the leader: {}; follower RSS {follower_mb:.1} MB",
            build.spent.join(", ")
        );
        println!(
            "        reference workload (fixed, on the idle cluster) {machine:.2} s CPU, {:.2}x the first step's; leader CPU per allocation against the first step's {:.2}x, over the reference's {:.2}x",
            machine / machine0,
            per_1000(build.cpu) / leader_first,
            (per_1000(build.cpu) / leader_first) / (machine / machine0),
        );
        println!(
            "        leader at rest at this size {:.1} ms CPU per s; its CPU over the build-up ({took:.0} s) less that: {:.2} s per 1 000 allocations",
            at.at_rest * 1e3,
            per_1000(build.cpu - at.at_rest * took),
        );
        println!(
            "        create → in a client's table, from the VM's POST answered (the controllers' and the stream's part) p50 / p99: {:.1} / {:.1} ms, {:.2}x / {:.2}x the first step's",
            ours.0,
            ours.1,
            ours.0 / ours0.0,
            ours.1 / ours0.1,
        );
        println!(
            "        create → address in the pool's status (the bench's watch) p50 / p99: {:.1} / {:.1} ms",
            percentile(&timed.recorded, 0.5),
            percentile(&timed.recorded, 0.99)
        );
        println!(
            "        the build-up's events published {drained:.0} s after it; then the API server alone, idle, p50 / p99: the VM's POST {:.1} / {:.1} ms, a ConfigMap label PATCH {:.1} / {:.1} ms",
            percentile(&timed.posted, 0.5),
            percentile(&timed.posted, 0.99),
            percentile(&at.probes, 0.5),
            percentile(&at.probes, 0.99)
        );
        println!(
            "        Kubernetes events (best-effort, not in API/alloc), build-up and its drain: {:.2} published, {:.2} dropped per allocation",
            (events1.published - build.events0.published) / adding,
            (events1.dropped - build.events0.dropped) / adding,
        );
        println!(
            "        controller calls while building up: {}; namespaced LISTs (the bench's and the agent's watches): {}",
            build
                .by
                .iter()
                .map(|((v, r), n)| format!("{v} {r} {n:.0}"))
                .collect::<Vec<_>>()
                .join(", "),
            build
                .namespaced_lists
                .iter()
                .map(|(r, n)| format!("{r} {n:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

/// The leader's RSS per VM, from the first step's to now.
fn print_rss_per_vm(bench: &Bench, processes: &Processes, firsts: &Firsts) {
    if let Some((n0, mb0)) = firsts.rss {
        let last_mb = rss_mb(processes.leader().pid());
        println!(
            "leader RSS per VM (VM, config, allocation and index entry, cached): {:.1} KB ({:.1} MB at {n0} VMs → {:.1} MB at {})",
            (last_mb - mb0) * 1024.0 / (bench.vms() - n0).max(1) as f64,
            mb0,
            last_mb,
            bench.vms()
        );
    }
}

/// The control's pools and VMs, which the restart reconciles too.
struct Control {
    pools: usize,
    vms: usize,
}

/// The control: is what the leader spends per allocation at the last step the cluster's size,
/// or its pools' fill? The pools fill as the cluster grows here (VM k on pool k % pools), and
/// every allocation rewrites its pool's status, whose size is the pool's. As many fresh pools,
/// in their own namespace, built up as the second step built up the first ones (0 to
/// steps[1] / pools VMs each, the same number of allocations), at the full cluster's size.
async fn control(bench: &Bench, processes: &Processes, settings: &Settings) -> Control {
    let client = &bench.client;
    let control_pools = settings.pools;
    let per_pool = (settings.steps[1] / settings.pools).max(1);
    let n = control_pools * per_pool;
    let control_ns = bench.cp.namespace(client, "scale-control").await.unwrap();
    vmdhcp_integration::pools::create(client, &control_ns, control_pools, 120)
        .await
        .unwrap();
    poll(
        "the control pools ready",
        Duration::from_secs(300),
        async || {
            tokio::time::sleep(Duration::from_millis(500)).await;
            vmdhcp_integration::pools::all_ready(client, &control_ns)
                .await
                .then_some(())
        },
    )
    .await;
    // Measured from a quiet cluster: the new pools' own writes (status, conditions) over.
    quiet(&bench.cp).await;
    let control_seen = Arc::new(Seen::default());
    let control_watches = watch_cluster(client, &control_ns, control_seen.clone());
    let leader_pid = processes.leader().pid();
    let (apiserver_pid, _) = bench.cp.pids();
    let (cpu0, api0) = (
        cpu_seconds(leader_pid),
        apiserver_pid.map_or(0.0, cpu_seconds),
    );
    let before = bench.cp.requests().unwrap();
    let started = Instant::now();
    create_vms(client, &control_ns, 0..n, |k| {
        let b = (k as u32).to_be_bytes();
        (
            format!("control-{k}"),
            MacAddr([2, 0x51, b[1], b[2], b[3], 1]),
            k % control_pools,
        )
    })
    .await;
    poll(
        &format!("{n} control configs allocated"),
        Duration::from_secs(600),
        async || (control_seen.allocated.lock().unwrap().len() >= n).then_some(()),
    )
    .await;
    let took = started.elapsed().as_secs_f64();
    let per_1000 = |s: f64| s / n as f64 * 1000.0;
    let (calls, _, _) = controller_calls(&before, &bench.cp.requests().unwrap(), n as f64);
    println!(
        "control at {} VMs: {n} VMs on {control_pools} fresh pools (0 → {per_pool} VMs each, as the {} step filled the first pools): {:.0} alloc/s, {:.2} API calls/alloc, leader CPU {:.2} s / 1 000 (kube-apiserver {:.2})",
        bench.vms(),
        settings.steps[1],
        n as f64 / took,
        calls / n as f64,
        per_1000(cpu_seconds(leader_pid) - cpu0),
        per_1000(apiserver_pid.map_or(0.0, cpu_seconds) - api0),
    );
    for task in control_watches {
        task.abort();
    }
    Control {
        pools: control_pools,
        vms: n,
    }
}

/// `kill -9` of the leader; a VM created at once; the new leader's first allocation. The killed
/// replica then starts again, a follower.
async fn failover(bench: &mut Bench, processes: &mut Processes) {
    let (leader, follower) = (processes.leader, 1 - processes.leader);
    let killed = Instant::now();
    processes.replicas[leader]
        .process
        .as_ref()
        .unwrap()
        .signal("KILL");
    let k = bench.built;
    bench.create_up_to(k + 1).await;
    let (name, _, _) = vm_of(k, bench.pools);
    let acquired = poll(
        "the follower to lead",
        Duration::from_secs(120),
        async || processes.replicas[follower].leads().then(Instant::now),
    )
    .await;
    let allocated = poll(
        "the VM created after the kill allocated",
        Duration::from_secs(120),
        async || bench.seen.allocated.lock().unwrap().get(&name).copied(),
    )
    .await;
    println!(
        "leader kill -9 → follower leads {:.1} s (Lease expiry) → its first allocation {:.2} s after (target ≤ 10 s)",
        acquired.duration_since(killed).as_secs_f64(),
        allocated.saturating_duration_since(acquired).as_secs_f64()
    );
    processes.leader = follower;
    let replica = &mut processes.replicas[leader];
    replica.process = None;
    replica.start(
        leader,
        bench.cp.kubeconfig(),
        &processes.system,
        &processes.logs,
    );
}

/// A restart of both controllers on the converged cluster: every object reconciled again, and
/// nothing to write. The agent's reports would be published again by the new replicas; it has
/// been measured, so it stops, and so do the stream clients.
async fn restart(bench: &Bench, processes: &mut Processes, control: &Control) {
    processes.agent.stop();
    processes.clients_stop.send_replace(true);
    let vms_total = (bench.vms() + control.vms) as f64;
    quiet(&bench.cp).await;
    let before = bench.cp.requests().unwrap();
    for r in &mut processes.replicas {
        r.process = None;
    }
    let restarted = Instant::now();
    for (i, r) in processes.replicas.iter_mut().enumerate() {
        r.start(i, bench.cp.kubeconfig(), &processes.system, &processes.logs);
    }
    let replicas = &processes.replicas;
    let new_leader = poll(
        "a leader after the restart",
        Duration::from_secs(120),
        async || replicas.iter().position(Replica::leads),
    )
    .await;
    poll(
        "every object reconciled again",
        Duration::from_secs(600),
        async || {
            let text = replicas[new_leader].metrics();
            let n = |c: &str| {
                metric(
                    &text,
                    &format!("vmdhcpcontroller_reconciles_total{{controller=\"{c}\""),
                )
                .unwrap_or(0.0)
            };
            (n("vm") >= vms_total
                && n("vmnetcfg") >= vms_total
                && n("ippool") >= (bench.pools + control.pools) as f64)
                .then_some(())
        },
    )
    .await;
    let converged = restarted.elapsed().as_secs_f64();
    // A write follows its reconcile within milliseconds: watch for one for a while.
    let window = Instant::now() + Duration::from_secs(5);
    let mut written = BTreeMap::new();
    while Instant::now() < window && written.is_empty() {
        written = writes(&before, &bench.cp.requests().unwrap());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "restart of both controllers at {} VMs on {} pools (the control's included): every object reconciled in {converged:.1} s, writes to the API: {:.0} {written:?} (target 0)",
        bench.vms() + control.vms,
        bench.pools + control.pools,
        written.values().sum::<f64>().abs()
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .try_init();
    let settings = Settings::from_env();
    let (mut bench, mut processes) = setup(&settings).await;
    print_header(&settings);
    let mut firsts = Firsts::default();
    for &step in &settings.steps {
        measure_step(&mut bench, &processes, &settings, step)
            .await
            .print(&mut firsts);
    }
    print_rss_per_vm(&bench, &processes, &firsts);
    let control = control(&bench, &processes, &settings).await;
    failover(&mut bench, &mut processes).await;
    restart(&bench, &mut processes, &control).await;
    // The bench's own watches end before the API server does (they would log its going away).
    for task in &bench.watches {
        task.abort();
    }
    processes.clients_stop.send_replace(true);
}
