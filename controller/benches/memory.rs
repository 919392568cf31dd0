//! What each object the leader keeps per VM costs in its heap, counted by dhat's allocator (bytes
//! asked for and blocks; glibc adds 8–24 bytes of its own per block).
//!
//! Builds, for `VMDHCP_MEMORY_VMS` VMs (default 20 000, one Multus NIC each, 100 per pool as in
//! the scale benchmark), each structure the leader keeps — the trimmed VM cache, the config
//! cache, the config index, IPAM, the index's leases and the per-config metric series — and
//! prints its cost per VM. The config cache is also measured untrimmed, as the reference: the
//! ratio is what trimming saves. Counting, not timing: the figures repeat exactly.
//!
//! `cargo bench -p vmdhcp-controller --bench memory`
#![allow(clippy::print_stdout, clippy::unwrap_used, missing_docs)]

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use kube::ResourceExt;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use serde_json::{Value, json};
use vmdhcp_controller::index::configs::ConfigIndex;
use vmdhcp_controller::index::shared_watch::forget_managed_fields;
use vmdhcp_controller::index::trim;
use vmdhcp_controller::index::{DEFAULT_HISTORY, Index, Op};
use vmdhcp_controller::ipam::PoolAllocator;
use vmdhcp_controller::kinds::VirtualMachine;
use vmdhcp_controller::metrics::{Metrics, VmnetcfgLabels};
use vmdhcp_core::MacAddr;
use vmdhcp_core::crd::VirtualMachineNetworkConfig;
use vmdhcp_core::pool::PoolRange;

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

const NS: &str = "scale-4f2k9";
const PER_POOL: usize = 100;

fn mac(k: usize) -> MacAddr {
    let b = (k as u32).to_be_bytes();
    MacAddr([2, 0x50, b[1], b[2], b[3], 1])
}

/// VM `k`'s pool, and its address there (.10 onwards of 10.<pool>.0.0/16-style /24s).
fn placement(k: usize) -> (usize, Ipv4Addr) {
    let pool = k / PER_POOL;
    let host = (k % PER_POOL) as u8 + 10;
    (
        pool,
        Ipv4Addr::new(10, (pool / 256) as u8, (pool % 256) as u8, host),
    )
}

fn uid(k: usize, kind: u8) -> String {
    format!("{kind:08x}-4b1e-4c2d-9f00-{k:012x}")
}

/// VM `k` as the API server sends it to the watch: KubeVirt's defaults and status included.
fn vm(k: usize) -> VirtualMachine {
    let (pool, _) = placement(k);
    serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": format!("vm-{k}"), "namespace": NS, "uid": uid(k, 1),
            "resourceVersion": format!("{}", 100_000 + k), "generation": 1,
            "creationTimestamp": "2026-11-25T10:00:00Z",
            "labels": {"app": "bench", "harvesterhci.io/creator": "harvester"},
            "annotations": {"kubevirt.io/latest-observed-api-version": "v1", "kubevirt.io/storage-observed-api-version": "v1"},
            "finalizers": ["kubevirt.io/virtualMachineControllerFinalize"],
            "managedFields": managed(&[("kubectl", "Update", ""), ("virt-controller", "Update", "status")])},
        "spec": {"running": true, "template": {"metadata": {"labels": {"kubevirt.io/vm": format!("vm-{k}")}}, "spec": {
            "domain": {"cpu": {"cores": 1}, "memory": {"guest": "1Gi"}, "devices": {
                "disks": [{"name": "disk0", "disk": {"bus": "virtio"}}],
                "interfaces": [{"name": "nic-0", "macAddress": mac(k).to_string(), "bridge": {}, "model": "virtio"}]}},
            "networks": [{"name": "nic-0", "multus": {"networkName": format!("{NS}/net-{pool}")}}],
            "volumes": [{"name": "disk0", "containerDisk": {"image": "quay.io/containerdisks/fedora:40"}}]}}},
        "status": {"printableStatus": "Running", "ready": true, "created": true}
    }))
    .unwrap()
}

/// `metadata.managedFields` as the API server records them: one entry per writer.
fn managed(managers: &[(&str, &str, &str)]) -> Value {
    managers
        .iter()
        .map(|(manager, operation, subresource)| {
            json!({"manager": manager, "operation": operation, "subresource": subresource,
                "apiVersion": "v1", "fieldsType": "FieldsV1", "time": "2026-11-25T10:00:01Z",
                "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}}, "f:spec": {"f:running": {}}}})
        })
        .collect()
}

fn condition(type_: &str, status: &str) -> Value {
    json!({"type": type_, "status": status, "lastUpdateTime": "2026-11-25T10:00:01.123456Z", "lastTransitionTime": "2026-11-25T10:00:01.123456Z"})
}

/// VM `k`'s config as the controller leaves it: applied from the VM, then allocated.
fn config(k: usize) -> VirtualMachineNetworkConfig {
    let (pool, ip) = placement(k);
    let network = format!("{NS}/net-{pool}");
    let name = format!("vm-{k}");
    serde_json::from_value(json!({
        "apiVersion": "network.harvesterhci.io/v1alpha1", "kind": "VirtualMachineNetworkConfig",
        "metadata": {"name": name, "namespace": NS, "uid": uid(k, 2),
            "resourceVersion": format!("{}", 200_000 + k), "generation": 1,
            "creationTimestamp": "2026-11-25T10:00:00Z",
            "labels": {"harvesterhci.io/vmName": name},
            "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": name,
                "uid": uid(k, 1), "controller": true, "blockOwnerDeletion": true}],
            "finalizers": ["wrangler.cattle.io/vm-dhcp-vmnetcfg-controller"],
            "managedFields": managed(&[("vm-dhcp-controller", "Apply", ""), ("vm-dhcp-controller", "Update", "status")])},
        "spec": {"vmName": name, "networkConfigs": [{"networkName": network, "macAddress": mac(k).to_string()}]},
        "status": {
            "networkConfigs": [{"allocatedIPAddress": ip.to_string(), "macAddress": mac(k).to_string(),
                "networkName": network, "state": "Allocated"}],
            "conditions": [condition("Allocated", "True"), condition("Disabled", "False"), condition("InSynced", "True")]}
    }))
    .unwrap()
}

/// Heap bytes and blocks live now.
fn live() -> (i64, i64) {
    let stats = dhat::HeapStats::get();
    (stats.curr_bytes as i64, stats.curr_blocks as i64)
}

/// Builds something with `build` and reports what it keeps per VM; returns it, so that it is
/// measured while alive and dropped afterwards.
fn measure<T>(what: &str, vms: usize, build: impl FnOnce() -> T) -> (T, f64) {
    let (b0, n0) = live();
    let kept = build();
    let (b1, n1) = live();
    let per = (b1 - b0) as f64 / vms as f64;
    println!(
        "{what:<52} {per:>8.0} B {:>6.1} blocks   {:>6.1} MB at {vms}",
        (n1 - n0) as f64 / vms as f64,
        (b1 - b0) as f64 / 1e6
    );
    (kept, per)
}

/// A kube reflector store of objects `0..n`, each prepared by `prepare` (what the shared watch
/// does to it) before the store takes it.
fn cache<K>(n: usize, make: impl Fn(usize) -> K, prepare: impl Fn(&mut K)) -> Writer<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    let mut w = Writer::<K>::new(());
    for k in 0..n {
        let mut o = make(k);
        prepare(&mut o);
        w.apply_watcher_event(&watcher::Event::Apply(o));
    }
    w
}

fn main() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let vms: usize = std::env::var("VMDHCP_MEMORY_VMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let pools = vms.div_ceil(PER_POOL);
    println!(
        "memory: what the leader keeps per VM, {vms} VMs (one Multus NIC each) on {pools} pools, heap bytes asked for (dhat)"
    );

    let (vm_cache, vm_bytes) = measure("VM cache (trimmed to what is read)", vms, || {
        cache(vms, vm, |v| {
            forget_managed_fields(v);
            trim::vm(v);
        })
    });
    let (untrimmed, untrimmed_bytes) = measure("config cache, untrimmed (as before)", vms, || {
        cache(vms, config, |c| c.managed_fields_mut().clear())
    });
    drop(untrimmed);
    let (cfg_cache, cfg_bytes) = measure("config cache (trimmed)", vms, || {
        cache(vms, config, |c| {
            forget_managed_fields(c);
            trim::config(c);
        })
    });
    let (index, index_bytes) = measure("config index (MAC owners, members, holders)", vms, || {
        let index = ConfigIndex::default();
        for k in 0..vms {
            index.observe(&watcher::Event::Apply(config(k)));
        }
        index
    });
    let (ipam, ipam_bytes) = measure("IPAM (one allocator per pool)", vms, || {
        (0..pools)
            .map(|p| {
                let subnet: ipnet::Ipv4Net =
                    format!("10.{}.{}.0/24", p / 256, p % 256).parse().unwrap();
                let range = PoolRange::new(
                    format!("{NS}/pool-{p}").parse().unwrap(),
                    subnet,
                    (
                        Ipv4Addr::from(u32::from(subnet.network()) + 10),
                        Ipv4Addr::from(u32::from(subnet.broadcast()) - 1),
                    ),
                    Ipv4Addr::from(u32::from(subnet.network()) + 2),
                    Some(Ipv4Addr::from(u32::from(subnet.network()) + 1)),
                    vec![],
                )
                .unwrap();
                let allocated: BTreeMap<String, String> = (p * PER_POOL
                    ..((p + 1) * PER_POOL).min(vms))
                    .map(|k| (placement(k).1.to_string(), mac(k).to_string()))
                    .collect();
                PoolAllocator::rebuild(range, &allocated).0
            })
            .collect::<Vec<_>>()
    });
    let lease = |k: usize| {
        let (pool, ip) = placement(k);
        Op::UpsertLease(vmdhcp_core::pool::Lease {
            options: None,
            ipv6: None,
            pool: format!("{NS}/pool-{pool}").parse().unwrap(),
            mac: mac(k),
            ip,
            host_name: None,
        })
    };
    let (leases, lease_bytes) = measure("index leases (served to agents)", vms, || {
        // One revision kept: the history is a fixed cost, measured below.
        let index = Index::with_limits(1, 0);
        for k in 0..vms {
            index.apply([lease(k)]);
        }
        index
    });
    let (b0, _) = live();
    let history = Index::new();
    for k in 0..DEFAULT_HISTORY {
        history.apply([lease(k)]);
    }
    let (b1, _) = live();
    // Less the leases themselves, counted above.
    let history_mb = ((b1 - b0) as f64 - lease_bytes * DEFAULT_HISTORY as f64) / 1e6;
    drop(history);
    let (metrics, metric_bytes) = measure("per-config metric series", vms, || {
        let metrics = Metrics::default();
        for k in 0..vms {
            let (pool, ip) = placement(k);
            let key = format!("{NS}/vm-{k}");
            metrics.set_vmnetcfg(
                &key,
                vec![VmnetcfgLabels {
                    vmnetcfg: key.as_str().into(),
                    network: format!("{NS}/net-{pool}").into(),
                    mac: mac(k).to_string().into(),
                    ip: ip.to_string().into(),
                    state: "Allocated".into(),
                }],
            );
        }
        metrics
    });
    let total = vm_bytes + cfg_bytes + index_bytes + ipam_bytes + lease_bytes + metric_bytes;
    println!(
        "{:<52} {total:>8.0} B per VM; {:.0} MB at {vms} (the config cache: {:.2}x of before)",
        "total",
        total * vms as f64 / 1e6,
        cfg_bytes / untrimmed_bytes
    );
    println!(
        "{:<52} {history_mb:>6.1} MB whatever the size (the last {DEFAULT_HISTORY} revisions, for resuming agents)",
        "index history (fixed)"
    );
    drop((vm_cache, cfg_cache, index, ipam, leases, metrics));
}
