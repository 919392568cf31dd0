//! End-to-end allocation benchmark: N VMs created at once on one pool, measured until every
//! VirtualMachineNetworkConfig says Allocated, against a real kube-apiserver with the controller
//! in process. Prints allocations per second and the API requests per allocation, read from the
//! apiserver's own `apiserver_request_total` (the benchmark's own creates and lists subtracted).
//! Run twice in the same process, in turn: on an IPv4-only pool, then on a dual-stack one (each
//! NIC gets both families; one status write still carries both), with the ratio of the two.
//!
//! `cargo bench -p vmdhcp-integration --bench allocation` (N = 2000; `VMDHCP_BENCH_VMS` overrides)
#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs
)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use vmdhcp_core::crd::{IPPool, VirtualMachineNetworkConfig, find_condition};
use vmdhcp_integration::control_plane::ControlPlane;
use vmdhcp_integration::process::cpu_seconds;

#[path = "../tests/support/in_process.rs"]
mod in_process;
use in_process::InProcess;

/// What one burst measured.
struct Burst {
    /// Seconds to create the VMs.
    created: f64,
    /// Seconds until every config said Allocated.
    took: f64,
    /// The controller's API requests.
    calls: f64,
    /// The controller's API requests by (verb, resource).
    by_kind: BTreeMap<(String, String), f64>,
    /// kube-apiserver CPU seconds.
    apiserver_cpu: f64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .try_init();
    let n: u32 = std::env::var("VMDHCP_BENCH_VMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let cp = ControlPlane::start().unwrap();
    let client = cp.client().await.unwrap();
    let controller = InProcess::start(&client, "bench").await;
    println!(
        "allocation: {n} VMs created at once on one pool (real kube-apiserver v1.20, controller in process)"
    );
    let mut runs = Vec::new();
    for (label, dual) in [("IPv4-only", false), ("dual-stack", true)] {
        let burst = burst(&cp, &client, n, dual).await;
        let per = |x: f64| x / f64::from(n);
        println!("  {label} pool:");
        println!(
            "    VMs created in                    {:>8.2} s",
            burst.created
        );
        println!(
            "    all configs Allocated after       {:>8.2} s",
            burst.took
        );
        println!(
            "    allocations per second            {:>8.0}",
            f64::from(n) / burst.took
        );
        println!(
            "    controller API requests           {:>8.0} ({:.2} per allocation)",
            burst.calls,
            per(burst.calls)
        );
        for ((verb, resource), own) in &burst.by_kind {
            if *own >= 1.0 {
                println!("      {verb:<7} {resource:<32} {own:>8.0}");
            }
        }
        // The API server's CPU per allocation: the figure that bounds the rate on a small
        // machine, and steadier between runs than the rate itself.
        println!(
            "    kube-apiserver CPU                {:>8.2} s per 1 000 allocations",
            per(burst.apiserver_cpu) * 1000.0
        );
        runs.push(burst);
    }
    if let [v4, dual] = &runs[..] {
        // Events are best effort (a bounded queue drops what a burst overflows), so their
        // count varies from run to run; the writes that record allocations do not.
        let writes = |b: &Burst| {
            b.by_kind
                .iter()
                .filter(|((_, resource), _)| resource != "events")
                .map(|(_, v)| v)
                .sum::<f64>()
        };
        println!(
            "  dual-stack / IPv4-only: API requests per allocation {:.2} (events aside {:.2}), allocations per second {:.2}, kube-apiserver CPU {:.2}",
            dual.calls / v4.calls,
            writes(dual) / writes(v4),
            v4.took / dual.took,
            dual.apiserver_cpu / v4.apiserver_cpu
        );
    }
    println!(
        "  targets: >= 200 allocations/s; <= 4 API calls per allocation; dual-stack no more API calls than IPv4-only"
    );
    // How much reconciling the bursts took (each reconcile is cheap when it has nothing to write).
    let metrics = controller.metrics();
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("vmdhcpcontroller_reconciles_total"))
    {
        println!("    {line}");
    }
    controller.stop().await;
}

/// Creates a pool (dual-stack if `dual`) in a namespace of its own, `n` VMs on it at once, and
/// measures until every config is Allocated.
async fn burst(cp: &ControlPlane, client: &Client, n: u32, dual: bool) -> Burst {
    let ns = cp
        .namespace(client, if dual { "bench-dual" } else { "bench" })
        .await
        .unwrap();
    let nad_ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("k8s.cni.cncf.io", "v1", "NetworkAttachmentDefinition"),
        "network-attachment-definitions",
    );
    let vm_ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachine"),
        "virtualmachines",
    );
    let nads: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &nad_ar);
    nads.create(&PostParams::default(), &serde_json::from_value(json!({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition", "metadata": {"name": "net"}, "spec": {"config": "{}"}})).unwrap()).await.unwrap();
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    let mut pool = json!({
        "apiVersion": "network.harvesterhci.io/v1alpha1", "kind": "IPPool", "metadata": {"name": "pool"},
        "spec": {"networkName": format!("{ns}/net"), "ipv4Config": {"serverIP": "10.30.0.1", "cidr": "10.30.0.0/16", "pool": {"start": "10.30.0.2", "end": "10.30.255.254"}}}
    });
    if dual {
        pool["spec"]["ipv6Config"] = json!({"serverIP": "fd00:30::1", "cidr": "fd00:30::/112", "pool": {"start": "fd00:30::2", "end": "fd00:30::ffff"}});
    }
    pools
        .create(
            &PostParams::default(),
            &serde_json::from_value(pool).unwrap(),
        )
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !pools.get("pool").await.unwrap().status.is_some_and(|s| {
        find_condition(&s.conditions, "CacheReady").is_some_and(|c| c.status == "True")
    }) {
        assert!(Instant::now() < deadline, "pool never ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let before = cp.requests().unwrap();
    let apiserver = cp.pids().0;
    let apiserver_cpu0 = apiserver.map_or(0.0, cpu_seconds);
    let vms: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &vm_ar);
    let started = Instant::now();
    let creates = (0..n).map(|i| {
        let vms = vms.clone();
        let vm: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": format!("vm-{i}")},
            "spec": {"template": {"spec": {"domain": {"devices": {"interfaces": [{"name": "nic", "macAddress": format!("02:00:{:02x}:{:02x}:{:02x}:01", i >> 16, (i >> 8) & 255, i & 255)}]}}, "networks": [{"name": "nic", "multus": {"networkName": "net"}}]}}}
        }))
        .unwrap();
        async move { vms.create(&PostParams::default(), &vm).await.unwrap() }
    });
    // Create in bounded waves, as a burst from a client would arrive.
    let mut creates = creates.collect::<Vec<_>>();
    while !creates.is_empty() {
        let wave: Vec<_> = creates.drain(..creates.len().min(200)).collect();
        futures_util::future::join_all(wave).await;
    }
    let created = started.elapsed();
    // Follow the configs with one watch (a LIST of 2 000 objects every few hundred ms would load
    // the API server the controller is measured against).
    let cfgs: Api<VirtualMachineNetworkConfig> = Api::namespaced(client.clone(), &ns);
    let lists = 1u32;
    let mut allocated = std::collections::BTreeSet::new();
    let mut events = std::pin::pin!(watcher(cfgs, watcher::Config::default()).applied_objects());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    while allocated.len() < n as usize {
        let next = tokio::time::timeout_at(deadline, events.next()).await;
        let cfg = match next {
            Ok(Some(Ok(cfg))) => cfg,
            Ok(Some(Err(e))) => panic!("watch failed: {e}"),
            Ok(None) => panic!("watch ended"),
            Err(_) => panic!("only {} of {n} allocated", allocated.len()),
        };
        if cfg.status.as_ref().is_some_and(|s| {
            find_condition(&s.conditions, "Allocated").is_some_and(|a| a.status == "True")
        }) {
            allocated.insert(cfg.name_any());
        }
    }
    let took = started.elapsed();
    let after = cp.requests().unwrap();
    let mut by_kind: BTreeMap<(String, String), f64> = BTreeMap::new();
    for (k, v) in &after {
        let d = v - before.get(k).copied().unwrap_or(0.0);
        if d > 0.0 {
            by_kind.insert(k.clone(), d);
        }
    }
    // Subtract what the benchmark itself sent: the VM creates and its watch's LIST.
    let mine = |k: &(String, String)| match (k.0.as_str(), k.1.as_str()) {
        ("POST", "virtualmachines") => f64::from(n),
        ("LIST", "virtualmachinenetworkconfigs") => f64::from(lists),
        _ => 0.0,
    };
    let by_kind: BTreeMap<(String, String), f64> = by_kind
        .iter()
        .map(|(k, v)| (k.clone(), (v - mine(k)).max(0.0)))
        .collect();
    Burst {
        created: created.as_secs_f64(),
        took: took.as_secs_f64(),
        calls: by_kind.values().sum(),
        by_kind,
        apiserver_cpu: apiserver.map_or(0.0, cpu_seconds) - apiserver_cpu0,
    }
}
