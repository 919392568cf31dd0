//! The controller against the real kube-apiserver: pools, VMs, configs and the agent Deployment,
//! applied through the API, with status awaited by bounded polling. One controller serves the
//! whole test binary (as in a cluster); every test works in its own namespaces.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::watch;
use vmdhcp_controller::reconcile::context::AgentDeployment;
use vmdhcp_controller::runtime::{Handles, Settings, run};
use vmdhcp_core::claims::placeholder_mac;
use vmdhcp_core::crd::{
    ALLOCATED_EXCLUDED, ALLOCATED_RESERVED, AddressClaim, ClaimPhase, IPPool,
    VirtualMachineNetworkConfig, find_condition,
};
use vmdhcp_integration::control_plane::ControlPlane;

const DEADLINE: Duration = Duration::from_secs(30);
const AGENT_NS: &str = "vmdhcp-system";

/// The controller of this test binary, on a runtime of its own (tests each have their own).
fn controller() -> &'static Handles {
    static HANDLES: OnceLock<Handles> = OnceLock::new();
    HANDLES.get_or_init(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "warn".into()),
            )
            .with_test_writer()
            .try_init();
        let cp = ControlPlane::shared();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let client = cp.client().await.unwrap();
                let ns = k8s_openapi::api::core::v1::Namespace {
                    metadata: kube::api::ObjectMeta {
                        name: Some(AGENT_NS.into()),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
                    .create(&PostParams::default(), &ns)
                    .await;
                // The agent Deployment exists before any pool, as in an installed cluster.
                Api::<Deployment>::namespaced(client.clone(), AGENT_NS)
                    .create(&PostParams::default(), &agent_deployment())
                    .await
                    .unwrap();
                let settings = Settings {
                    identity: "controller-0".into(),
                    stream: Default::default(),
                    agent: Some(AgentDeployment {
                        deployment: format!("{AGENT_NS}/vm-dhcp-agent").parse().unwrap(),
                        container: "agent".into(),
                    }),
                    dumps: true,
                    reports: None,
                    agent_lease: None,
                    orphan_grace: vmdhcp_controller::reconcile::orphans::DEFAULT_GRACE,
                    vm_address_annotation: true,
                };
                let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let (_leader_tx, leader) = watch::channel(true);
                let (_stop_tx, stop) = watch::channel(false);
                run(client, settings, grpc, http, leader, stop, move |h| {
                    tx.send(h).unwrap()
                })
                .await
                .unwrap();
            });
        });
        rx.recv_timeout(DEADLINE).expect("controller started")
    })
}

fn agent_deployment() -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "vm-dhcp-agent", "namespace": AGENT_NS},
        "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": {
            "metadata": {"labels": {"app": "agent"}},
            "spec": {"containers": [{"name": "agent", "image": "vmdhcp/agent:test", "env": [{"name": "POD_NAMESPACE", "value": AGENT_NS}]}]}
        }}
    }))
    .unwrap()
}

async fn setup(prefix: &str) -> (Client, String) {
    controller();
    let cp = ControlPlane::shared();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, prefix).await.unwrap();
    (client, ns)
}

fn nad_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("k8s.cni.cncf.io", "v1", "NetworkAttachmentDefinition"),
        "network-attachment-definitions",
    );
    Api::namespaced_with(client.clone(), ns, &ar)
}

fn vm_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachine"),
        "virtualmachines",
    );
    Api::namespaced_with(client.clone(), ns, &ar)
}

async fn create_nad(client: &Client, ns: &str, name: &str) {
    let nad: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"config": "{\"cniVersion\":\"0.3.1\",\"type\":\"bridge\"}"}
    }))
    .unwrap();
    nad_api(client, ns)
        .create(&PostParams::default(), &nad)
        .await
        .unwrap();
}

/// A pool on `ns/<net>`: 10.<octet>.0.0/24, range .10–.20, server .2 (inside the range), router .1.
async fn create_pool(client: &Client, ns: &str, name: &str, net: &str, octet: u8) {
    let pool: IPPool = serde_json::from_value(json!({
        "apiVersion": "network.harvesterhci.io/v1alpha1", "kind": "IPPool",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"networkName": format!("{ns}/{net}"), "ipv4Config": {
            "serverIP": format!("10.{octet}.0.12"), "cidr": format!("10.{octet}.0.0/24"), "router": format!("10.{octet}.0.1"),
            "pool": {"start": format!("10.{octet}.0.10"), "end": format!("10.{octet}.0.20"), "exclude": [format!("10.{octet}.0.11")]},
            "dns": ["10.0.0.53"], "leaseTime": 600
        }}
    }))
    .unwrap();
    Api::<IPPool>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pool)
        .await
        .unwrap();
}

fn vm(ns: &str, name: &str, nics: &[(&str, &str)]) -> DynamicObject {
    let interfaces: Vec<Value> = nics
        .iter()
        .enumerate()
        .map(|(i, (_, mac))| json!({"name": format!("nic-{i}"), "macAddress": mac, "bridge": {}}))
        .collect();
    let networks: Vec<Value> = nics
        .iter()
        .enumerate()
        .map(|(i, (net, _))| json!({"name": format!("nic-{i}"), "multus": {"networkName": net}}))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"running": true, "template": {"spec": {"domain": {"devices": {"interfaces": interfaces}}, "networks": networks}}}
    }))
    .unwrap()
}

async fn wait_for<K, F>(api: &Api<K>, name: &str, what: &str, pred: F) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    F: Fn(&K) -> bool,
{
    let deadline = Instant::now() + DEADLINE;
    loop {
        let current = api.get_opt(name).await.unwrap();
        if let Some(obj) = &current
            && pred(obj)
        {
            return obj.clone();
        }
        assert!(
            Instant::now() < deadline,
            "{name}: never {what}; last seen: {current:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Deletes a pool and waits, bounded, until its finalizer has let it go.
async fn delete_pool(pools: &Api<IPPool>, name: &str) {
    pools.delete(name, &DeleteParams::default()).await.unwrap();
    let deadline = Instant::now() + DEADLINE;
    while pools.get_opt(name).await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "{name}: never deleted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn condition(pool: &IPPool, t: &str) -> Option<(String, Option<String>)> {
    find_condition(&pool.status.as_ref()?.conditions, t)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

fn cfg_condition(cfg: &VirtualMachineNetworkConfig, t: &str) -> Option<(String, Option<String>)> {
    find_condition(&cfg.status.as_ref()?.conditions, t)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

fn allocated(pool: &IPPool) -> std::collections::BTreeMap<String, String> {
    pool.status
        .as_ref()
        .and_then(|s| s.ipv4.clone())
        .map(|v| v.allocated)
        .unwrap_or_default()
}

fn cfg_ips(cfg: &VirtualMachineNetworkConfig) -> Vec<(String, String, String)> {
    cfg.status
        .iter()
        .flat_map(|s| &s.network_configs)
        .map(|e| {
            (
                e.mac_address.clone().unwrap_or_default(),
                e.allocated_ip_address.clone().unwrap_or_default(),
                format!("{:?}", e.state),
            )
        })
        .collect()
}

fn ready(p: &IPPool) -> bool {
    condition(p, "CacheReady").is_some_and(|c| c.0 == "True")
        && condition(p, "Registered").is_some_and(|c| c.0 == "True")
}

#[tokio::test]
async fn pool_is_registered_marked_counted_paused_and_deleted_cleanly() {
    let (client, ns) = setup("pool").await;
    create_nad(&client, &ns, "net-a").await;
    create_pool(&client, &ns, "pool-a", "net-a", 1).await;
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    let pool = wait_for(&pools, "pool-a", "ready", ready).await;
    let alloc = allocated(&pool);
    assert_eq!(
        alloc.get("10.1.0.12").map(String::as_str),
        Some("RESERVED"),
        "server inside the range"
    );
    assert_eq!(alloc.get("10.1.0.11").map(String::as_str), Some("EXCLUDED"));
    assert!(
        !alloc.contains_key("10.1.0.1"),
        "router outside the range is not marked"
    );
    let v4 = pool.status.as_ref().unwrap().ipv4.clone().unwrap();
    assert_eq!((v4.used, v4.available), (0, 9));
    assert_eq!(condition(&pool, "Stopped").unwrap().0, "False");
    assert!(
        pool.finalizers()
            .iter()
            .any(|f| f == "wrangler.cattle.io/vm-dhcp-ippool-controller")
    );
    let nad = nad_api(&client, &ns).get("net-a").await.unwrap();
    assert_eq!(
        nad.labels()
            .get("network.harvesterhci.io/ippool-name")
            .map(String::as_str),
        Some("pool-a")
    );
    assert_eq!(
        nad.labels().get("network.harvesterhci.io/ippool-namespace"),
        Some(&ns)
    );

    // Metrics carry upstream's names and labels.
    let h = controller();
    let metrics = metrics_text(h.http).await;
    let series = format!(
        r#"vmdhcpcontroller_ippool_available{{ippool="{ns}/pool-a",cidr="10.1.0.0/24",network="{ns}/net-a"}} 9"#
    );
    assert!(metrics.contains(&series), "{series} not in:\n{metrics}");

    // Served to agents once ready.
    let deadline = Instant::now() + DEADLINE;
    while !h
        .index
        .snapshot(&Default::default())
        .pools
        .iter()
        .any(|(c, _)| c.pool.to_string() == format!("{ns}/pool-a"))
    {
        assert!(Instant::now() < deadline, "pool never reached the index");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // AgentReady follows the leading agent's report over the config stream.
    let before = pools.get("pool-a").await.unwrap();
    assert_eq!(
        condition(&before, "AgentReady").map(|c| c.0),
        Some("False".into())
    );
    let mut grpc = vmdhcp_proto::agent::v1::config_service_client::ConfigServiceClient::connect(
        format!("http://{}", h.grpc),
    )
    .await
    .unwrap();
    let report =
        |state: vmdhcp_proto::agent::v1::InterfaceState| vmdhcp_proto::agent::v1::ReportRequest {
            agent: Some(vmdhcp_proto::agent::v1::AgentIdentity {
                pod_name: format!("agent-{ns}"),
                namespace: AGENT_NS.into(),
                node_name: "n1".into(),
            }),
            epoch: h.index.epoch().to_string(),
            applied_revision: h.index.revision(),
            leader: true,
            interfaces: vec![vmdhcp_proto::agent::v1::InterfaceReport {
                pool_ref: format!("{ns}/pool-a"),
                interface_name: "vmd1".into(),
                state: state.into(),
                error: "bind: no such device".into(),
                lease_count: 0,
                probes: vec![],
                suspects: vec![],
            }],
        };
    grpc.report(report(vmdhcp_proto::agent::v1::InterfaceState::Serving))
        .await
        .unwrap();
    let served = wait_for(&pools, "pool-a", "agent ready", |p| {
        condition(p, "AgentReady").is_some_and(|c| c.0 == "True")
    })
    .await;
    let msg = find_condition(&served.status.unwrap().conditions, "AgentReady")
        .unwrap()
        .message
        .clone()
        .unwrap_or_default();
    assert!(msg.contains(&format!("agent-{ns}")), "{msg}");
    grpc.report(report(vmdhcp_proto::agent::v1::InterfaceState::Error))
        .await
        .unwrap();
    wait_for(&pools, "pool-a", "interface error reported", |p| {
        condition(p, "AgentReady").is_some_and(|c| c.1.as_deref() == Some("InterfaceError"))
    })
    .await;

    // Pause: stops being served, allocations kept.
    pools
        .patch(
            "pool-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"paused": true}})),
        )
        .await
        .unwrap();
    let paused = wait_for(&pools, "pool-a", "stopped", |p| {
        condition(p, "Stopped").is_some_and(|c| c.0 == "True")
    })
    .await;
    assert_eq!(allocated(&paused), alloc, "pause keeps allocations");
    assert_eq!(
        condition(&paused, "CacheReady"),
        Some(("False".into(), Some("Paused".into()))),
        "its IPAM is forgotten: nothing waits for a rebuild"
    );
    pools
        .patch(
            "pool-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"paused": false}})),
        )
        .await
        .unwrap();
    wait_for(&pools, "pool-a", "resumed", |p| {
        condition(p, "Stopped").is_some_and(|c| c.0 == "False")
    })
    .await;

    // Deletion: finalizer released, NAD unlabelled, series gone.
    delete_pool(&pools, "pool-a").await;
    let nad = nad_api(&client, &ns).get("net-a").await.unwrap();
    assert!(
        !nad.labels()
            .contains_key("network.harvesterhci.io/ippool-name"),
        "{:?}",
        nad.labels()
    );
    let metrics = metrics_text(h.http).await;
    assert!(
        !metrics.contains(&format!("{ns}/pool-a")),
        "series leaked:\n{metrics}"
    );
}

#[tokio::test]
async fn second_pool_on_a_network_and_missing_network_are_refused_with_conditions() {
    let (client, ns) = setup("refuse").await;
    create_nad(&client, &ns, "net-a").await;
    create_pool(&client, &ns, "first", "net-a", 2).await;
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    wait_for(&pools, "first", "ready", ready).await;
    create_pool(&client, &ns, "second", "net-a", 3).await;
    let second = wait_for(&pools, "second", "refused", |p| {
        condition(p, "Registered").is_some_and(|c| c.1.as_deref() == Some("NetworkInUse"))
    })
    .await;
    assert!(
        find_condition(&second.status.clone().unwrap().conditions, "Registered")
            .unwrap()
            .message
            .as_deref()
            .unwrap()
            .contains(&format!("IPPool {ns}/first"))
    );
    assert_eq!(
        condition(&second, "CacheReady"),
        Some(("False".into(), Some("NetworkInUse".into())))
    );
    let first = pools.get("first").await.unwrap();
    assert!(ready(&first), "the first pool keeps its network");

    create_pool(&client, &ns, "orphan", "no-such-net", 4).await;
    wait_for(&pools, "orphan", "refused", |p| {
        condition(p, "Registered").is_some_and(|c| c.1.as_deref() == Some("NetworkNotFound"))
    })
    .await;
    // Creating the network later lets it register.
    create_nad(&client, &ns, "no-such-net").await;
    wait_for(&pools, "orphan", "ready", ready).await;
}

/// The (address, MAC) entries of a pool's `allocated`, without the RESERVED/EXCLUDED markers.
fn held_by_vms(pool: &IPPool) -> BTreeSet<(String, String)> {
    allocated(pool)
        .into_iter()
        .filter(|(_, v)| v != ALLOCATED_RESERVED && v != ALLOCATED_EXCLUDED)
        .collect()
}

/// An allocated config waits for changes only (no periodic pass): a pool that comes back on its
/// network without its allocations (deleted and created again) must wake it, or the VM would
/// have no lease until something else touched its config.
#[tokio::test]
async fn a_pool_created_again_gets_back_the_addresses_its_vms_hold() {
    let (client, ns) = setup("recreate").await;
    create_nad(&client, &ns, "net-r").await;
    create_pool(&client, &ns, "pool-r", "net-r", 7).await;
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    wait_for(&pools, "pool-r", "ready", ready).await;
    let cfgs: Api<VirtualMachineNetworkConfig> = Api::namespaced(client.clone(), &ns);
    let vms = vm_api(&client, &ns);
    for (name, mac) in [("vm1", "02:00:00:00:07:01"), ("vm2", "02:00:00:00:07:02")] {
        vms.create(&PostParams::default(), &vm(&ns, name, &[("net-r", mac)]))
            .await
            .unwrap();
    }
    let mut held = BTreeSet::new();
    for name in ["vm1", "vm2"] {
        let cfg = wait_for(&cfgs, name, "allocated", |c| {
            cfg_condition(c, "Allocated").is_some_and(|a| a.0 == "True")
        })
        .await;
        let (mac, ip, _) = cfg_ips(&cfg).remove(0);
        held.insert((ip, mac));
    }
    wait_for(&pools, "pool-r", "recording both", |p| {
        held_by_vms(p) == held
    })
    .await;

    delete_pool(&pools, "pool-r").await;
    create_pool(&client, &ns, "pool-r", "net-r", 7).await;
    // Each VM keeps its address.
    wait_for(&pools, "pool-r", "given back both addresses", |p| {
        held_by_vms(p) == held
    })
    .await;
    // The pool is written before the config (recorded before served), so each config's
    // condition, False while its pool was gone, turns True after the pool shows the address.
    let mut again = BTreeSet::new();
    for name in ["vm1", "vm2"] {
        let cfg = wait_for(&cfgs, name, "allocated again", |c| {
            cfg_condition(c, "Allocated").is_some_and(|a| a.0 == "True")
        })
        .await;
        let (mac, ip, _) = cfg_ips(&cfg).remove(0);
        again.insert((ip, mac));
    }
    assert_eq!(again, held, "each config shows the address it held before");
}

#[tokio::test]
async fn vm_gets_an_address_recorded_in_the_pool_first_and_released_on_every_path() {
    let (client, ns) = setup("vm").await;
    create_nad(&client, &ns, "net-a").await;
    create_pool(&client, &ns, "pool-a", "net-a", 5).await;
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    wait_for(&pools, "pool-a", "ready", ready).await;
    let cfgs: Api<VirtualMachineNetworkConfig> = Api::namespaced(client.clone(), &ns);
    let vms = vm_api(&client, &ns);

    // A VM with one Multus NIC (MAC in upper case: normalised) and the pod network.
    let mut v = vm(&ns, "vm1", &[("net-a", "02:00:00:00:05:01")]);
    v.data["spec"]["template"]["spec"]["networks"]
        .as_array_mut()
        .unwrap()
        .insert(0, json!({"name": "default", "pod": {}}));
    v.data["spec"]["template"]["spec"]["domain"]["devices"]["interfaces"]
        .as_array_mut()
        .unwrap()
        .insert(0, json!({"name": "default", "masquerade": {}}));
    vms.create(&PostParams::default(), &v).await.unwrap();
    let cfg = wait_for(&cfgs, "vm1", "allocated", |c| {
        cfg_condition(c, "Allocated").is_some_and(|a| a.0 == "True")
    })
    .await;
    assert_eq!(
        cfg.labels()
            .get("harvesterhci.io/vmName")
            .map(String::as_str),
        Some("vm1")
    );
    assert_eq!(cfg.owner_references()[0].kind, "VirtualMachine");
    assert_eq!(
        cfg.spec.network_configs.len(),
        1,
        "the pod network is skipped"
    );
    assert_eq!(
        cfg_ips(&cfg),
        [(
            "02:00:00:00:05:01".into(),
            "10.5.0.10".into(),
            "Some(Allocated)".into()
        )]
    );
    let pool = pools.get("pool-a").await.unwrap();
    assert_eq!(
        allocated(&pool).get("10.5.0.10").map(String::as_str),
        Some("02:00:00:00:05:01")
    );
    assert_eq!(pool.status.unwrap().ipv4.unwrap().used, 1);

    // A static address is honoured; a taken or out-of-range one is refused with a reason.
    cfgs.patch("vm1", &PatchParams::default(), &Patch::Merge(json!({"spec": {"networkConfigs": [{"networkName": format!("{ns}/net-a"), "macAddress": "02:00:00:00:05:01", "ipAddress": "10.5.0.15"}]}}))).await.unwrap();
    wait_for(&cfgs, "vm1", "moved to the static address", |c| {
        cfg_ips(c).first().is_some_and(|e| e.1 == "10.5.0.15")
    })
    .await;
    let pool = wait_for(&pools, "pool-a", "recording the move", |p| {
        allocated(p).contains_key("10.5.0.15")
    })
    .await;
    assert!(!allocated(&pool).contains_key("10.5.0.10"));
    cfgs.patch("vm1", &PatchParams::default(), &Patch::Merge(json!({"spec": {"networkConfigs": [{"networkName": format!("{ns}/net-a"), "macAddress": "02:00:00:00:05:01", "ipAddress": "10.5.0.99"}]}}))).await.unwrap();
    let cfg = wait_for(&cfgs, "vm1", "refused", |c| {
        cfg_condition(c, "Allocated").is_some_and(|a| a.0 == "False")
    })
    .await;
    let msg = find_condition(&cfg.status.clone().unwrap().conditions, "Allocated")
        .unwrap()
        .message
        .clone()
        .unwrap();
    assert!(msg.contains("10.5.0.99 is outside the pool range"), "{msg}");
    assert_eq!(
        cfg_ips(&cfg)[0].1,
        "10.5.0.15",
        "the refused request keeps the held address"
    );

    // The same MAC in another config on the same network is refused, not shared.
    let dup: VirtualMachineNetworkConfig = serde_json::from_value(json!({
        "apiVersion": "network.harvesterhci.io/v1alpha1", "kind": "VirtualMachineNetworkConfig",
        "metadata": {"name": "dup", "namespace": ns},
        "spec": {"vmName": "dup", "networkConfigs": [{"networkName": format!("{ns}/net-a"), "macAddress": "02:00:00:00:05:01"}]}
    }))
    .unwrap();
    cfgs.create(&PostParams::default(), &dup).await.unwrap();
    let dup = wait_for(&cfgs, "dup", "refused", |c| {
        cfg_condition(c, "Allocated").is_some_and(|a| a.0 == "False")
    })
    .await;
    let msg = find_condition(&dup.status.clone().unwrap().conditions, "Allocated")
        .unwrap()
        .message
        .clone()
        .unwrap();
    assert!(
        msg.contains(&format!(
            "already allocated to VirtualMachineNetworkConfig {ns}/vm1"
        )),
        "{msg}"
    );
    cfgs.delete("dup", &DeleteParams::default()).await.unwrap();

    // Pause releases (status keeps the address), resume gets the same address back.
    cfgs.patch("vm1", &PatchParams::default(), &Patch::Merge(json!({"spec": {"networkConfigs": [{"networkName": format!("{ns}/net-a"), "macAddress": "02:00:00:00:05:01"}]}}))).await.unwrap();
    wait_for(&cfgs, "vm1", "allocated again", |c| {
        cfg_condition(c, "Allocated").is_some_and(|a| a.0 == "True")
    })
    .await;
    cfgs.patch(
        "vm1",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"paused": true}})),
    )
    .await
    .unwrap();
    wait_for(&cfgs, "vm1", "disabled", |c| {
        cfg_condition(c, "Disabled").is_some_and(|a| a.0 == "True")
    })
    .await;
    wait_for(&pools, "pool-a", "released", |p| {
        !allocated(p).values().any(|m| m == "02:00:00:00:05:01")
    })
    .await;
    cfgs.patch(
        "vm1",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"paused": false}})),
    )
    .await
    .unwrap();
    let cfg = wait_for(&cfgs, "vm1", "re-enabled", |c| {
        cfg_condition(c, "Disabled").is_some_and(|a| a.0 == "False")
            && cfg_ips(c).first().is_some_and(|e| e.2 == "Some(Allocated)")
    })
    .await;
    assert_eq!(
        cfg_ips(&cfg)[0].1,
        "10.5.0.15",
        "the same address returns after a pause"
    );

    // A NIC removed from the VM is released and marked Stale; a new one allocated.
    vms.patch("vm1", &PatchParams::default(), &Patch::Merge(json!({"spec": {"template": {"spec": {
        "domain": {"devices": {"interfaces": [{"name": "nic-9", "macAddress": "02:00:00:00:05:09", "bridge": {}}]}},
        "networks": [{"name": "nic-9", "multus": {"networkName": "net-a"}}]
    }}}}))).await.unwrap();
    let cfg = wait_for(&cfgs, "vm1", "re-synced", |c| {
        cfg_ips(c)
            .iter()
            .any(|e| e.0 == "02:00:00:00:05:09" && e.2 == "Some(Allocated)")
    })
    .await;
    assert!(
        cfg_ips(&cfg)
            .iter()
            .any(|e| e.0 == "02:00:00:00:05:01" && e.2 == "Some(Stale)"),
        "{:?}",
        cfg_ips(&cfg)
    );
    let pool = wait_for(&pools, "pool-a", "updated", |p| {
        allocated(p).values().any(|m| m == "02:00:00:00:05:09")
    })
    .await;
    assert!(!allocated(&pool).values().any(|m| m == "02:00:00:00:05:01"));

    // A VM that loses its last Multus NIC (only the pod network left): the config drops the NIC
    // and the address goes back to the pool (upstream kept it until the VM was deleted).
    vms.patch(
        "vm1",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"template": {"spec": {
            "domain": {"devices": {"interfaces": [{"name": "default", "masquerade": {}}]}},
            "networks": [{"name": "default", "pod": {}}]
        }}}})),
    )
    .await
    .unwrap();
    let cfg = wait_for(&cfgs, "vm1", "emptied of NICs", |c| {
        c.spec.network_configs.is_empty()
            && cfg_ips(c)
                .iter()
                .any(|e| e.0 == "02:00:00:00:05:09" && e.2 == "Some(Stale)")
    })
    .await;
    assert_eq!(
        cfg_condition(&cfg, "Allocated").map(|c| c.0).as_deref(),
        Some("False")
    );
    wait_for(&pools, "pool-a", "released the last NIC's address", |p| {
        !allocated(p).values().any(|m| m == "02:00:00:00:05:09")
    })
    .await;

    // Deleting the VM removes its config (no garbage collector runs here) and frees the address.
    vms.delete("vm1", &DeleteParams::default()).await.unwrap();
    let deadline = Instant::now() + DEADLINE;
    while cfgs.get_opt("vm1").await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "config outlived its VM");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pool = wait_for(&pools, "pool-a", "emptied", |p| {
        !allocated(p).values().any(|m| m.starts_with("02:"))
    })
    .await;
    assert_eq!(pool.status.unwrap().ipv4.unwrap().used, 0);
}

#[tokio::test]
async fn agent_deployment_gets_the_bootstrap_of_every_served_pool() {
    let (client, ns) = setup("boot").await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), AGENT_NS);
    let deploy = agent_deployment();
    let _ = deployments.create(&PostParams::default(), &deploy).await; // normally there already
    create_nad(&client, &ns, "net-b").await;
    create_pool(&client, &ns, "pool-b", "net-b", 6).await;
    let want = format!(
        "{ns}/net-b@{}",
        vmdhcp_core::ifname::base_name(&format!("{ns}/pool-b").parse().unwrap())
    );
    let deadline = Instant::now() + DEADLINE;
    loop {
        let d = deployments.get("vm-dhcp-agent").await.unwrap();
        let template = d.spec.unwrap().template;
        let annotation = template
            .metadata
            .and_then(|m| m.annotations)
            .and_then(|a| a.get("k8s.v1.cni.cncf.io/networks").cloned())
            .unwrap_or_default();
        let env: Vec<(String, String)> = template.spec.unwrap().containers[0]
            .env
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|e| (e.name, e.value.unwrap_or_default()))
            .collect();
        if annotation.split(',').any(|s| s == want) {
            let configs = env
                .iter()
                .find(|(n, _)| n == "AGENT_NETWORK_CONFIGS")
                .unwrap()
                .1
                .clone();
            let parsed = vmdhcp_core::bootstrap::parse_network_configs(&configs).unwrap();
            let mine = parsed
                .iter()
                .find(|c| c.ip_pool_ref.to_string() == format!("{ns}/pool-b"))
                .unwrap();
            assert_eq!(mine.server_ip.to_string(), "10.6.0.12");
            assert!(
                env.iter().any(
                    |(n, v)| n == "IPPOOL_REFS_JSON" && v.contains(&format!("\"{ns}/pool-b\""))
                )
            );
            assert!(
                env.iter().any(|(n, _)| n == "POD_NAMESPACE"),
                "other env is kept"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "bootstrap never written: {annotation:?} {env:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn many_vms_at_once_get_distinct_addresses_agreeing_with_the_pool() {
    let (client, ns) = setup("burst").await;
    create_nad(&client, &ns, "net-c").await;
    let pool: IPPool = serde_json::from_value(json!({
        "apiVersion": "network.harvesterhci.io/v1alpha1", "kind": "IPPool",
        "metadata": {"name": "pool-c", "namespace": ns},
        "spec": {"networkName": format!("{ns}/net-c"), "ipv4Config": {"serverIP": "10.7.0.1", "cidr": "10.7.0.0/16", "pool": {"start": "10.7.0.2", "end": "10.7.255.254"}}}
    }))
    .unwrap();
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    pools.create(&PostParams::default(), &pool).await.unwrap();
    wait_for(&pools, "pool-c", "ready", ready).await;
    let vms = vm_api(&client, &ns);
    let n = 100u32;
    let creates = (0..n).map(|i| {
        let vms = vms.clone();
        let v = vm(
            &ns,
            &format!("vm-{i}"),
            &[(
                "net-c",
                &format!("02:00:00:07:{:02x}:{:02x}", i / 256, i % 256),
            )],
        );
        async move { vms.create(&PostParams::default(), &v).await.unwrap() }
    });
    futures_util::future::join_all(creates).await;
    let pool = wait_for(&pools, "pool-c", "all recorded", |p| {
        held_by_vms(p).len() == n as usize
    })
    .await;
    let cfgs: Api<VirtualMachineNetworkConfig> = Api::namespaced(client.clone(), &ns);
    let deadline = Instant::now() + DEADLINE;
    loop {
        let all = cfgs.list(&Default::default()).await.unwrap();
        let done: Vec<_> = all
            .items
            .iter()
            .filter(|c| cfg_condition(c, "Allocated").is_some_and(|a| a.0 == "True"))
            .collect();
        if done.len() == n as usize {
            let ips: BTreeSet<String> = done.iter().map(|c| cfg_ips(c)[0].1.clone()).collect();
            assert_eq!(ips.len(), n as usize, "an address was handed out twice");
            for c in &done {
                let (mac, ip, _) = &cfg_ips(c)[0];
                assert_eq!(
                    allocated(&pool).get(ip),
                    Some(mac),
                    "{} disagrees with the pool",
                    c.name_any()
                );
            }
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {n} configs allocated",
            done.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The controller's `/metrics` text.
async fn metrics_text(addr: std::net::SocketAddr) -> String {
    tokio::task::spawn_blocking(move || {
        vmdhcp_integration::http::get(&addr.to_string(), "/metrics").unwrap()
    })
    .await
    .unwrap()
}

/// Repeats of one event about one object become one Event with a series count (as
/// `kubectl describe` shows for built-in controllers); an Event the API server dropped ends its
/// series; and however many distinct events are published, the publisher remembers a bounded
/// number of series (kube's `Recorder` kept every event for six minutes).
#[tokio::test]
async fn repeated_events_fold_into_a_series_and_the_series_kept_are_bounded() {
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::events::v1::Event as K8sEvent;
    use kube::runtime::events::{Event, EventType, Reporter};
    use vmdhcp_controller::reconcile::events::Publisher;

    let cp = ControlPlane::shared();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "events").await.unwrap();
    let reporter = Reporter {
        controller: "vm-dhcp-controller".into(),
        instance: Some("controller-test".into()),
    };
    let publisher = Publisher::with_capacity(client.clone(), reporter, 16);
    let about = |name: &str| ObjectReference {
        api_version: Some("network.harvesterhci.io/v1alpha1".into()),
        kind: Some("VirtualMachineNetworkConfig".into()),
        namespace: Some(ns.clone()),
        name: Some(name.into()),
        uid: Some(format!("uid-{name}")),
        ..Default::default()
    };
    let ev = |note: &str| Event {
        type_: EventType::Warning,
        reason: "AllocationRefused".into(),
        note: Some(note.into()),
        action: "Allocate".into(),
        secondary: None,
    };
    let events: Api<K8sEvent> = Api::namespaced(client.clone(), &ns);
    let listed = async || events.list(&Default::default()).await.unwrap().items;

    for _ in 0..3 {
        publisher
            .publish(&ev("pool full"), &about("vm-a"))
            .await
            .unwrap();
    }
    let all = listed().await;
    assert_eq!(all.len(), 1, "{all:?}");
    // The count is written at the 2nd, 4th, 8th… repeat (and every minute while it goes on).
    assert_eq!(all[0].series.as_ref().map(|s| s.count), Some(2));
    publisher
        .publish(&ev("pool full"), &about("vm-a"))
        .await
        .unwrap();
    let all = listed().await;
    assert_eq!(all[0].series.as_ref().map(|s| s.count), Some(4));
    assert_eq!(all[0].reason.as_deref(), Some("AllocationRefused"));
    assert_eq!(
        all[0].reporting_instance.as_deref(),
        Some("controller-test")
    );
    let regarding = all[0].regarding.clone().unwrap();
    assert_eq!(regarding.name.as_deref(), Some("vm-a"));

    // Something else said about the same object is an Event of its own.
    publisher
        .publish(&ev("other"), &about("vm-a"))
        .await
        .unwrap();
    assert_eq!(listed().await.len(), 2);

    // The API server dropped the Event (its TTL): the next repeat written (the 8th) starts a
    // new one.
    let first = all[0].metadata.name.clone().unwrap();
    events
        .delete(&first, &DeleteParams::default())
        .await
        .unwrap();
    for _ in 5..=8 {
        publisher
            .publish(&ev("pool full"), &about("vm-a"))
            .await
            .unwrap();
    }
    let all = listed().await;
    assert_eq!(all.len(), 2, "{all:?}");
    assert!(
        all.iter()
            .all(|e| e.metadata.name.as_deref() != Some(&first))
    );

    // A flood of distinct events: each is published, at most 16 series are remembered.
    for i in 0..100 {
        publisher
            .publish(&ev("pool full"), &about(&format!("vm-{i}")))
            .await
            .unwrap();
    }
    assert_eq!(listed().await.len(), 102);
    let kept = publisher.series_kept().await;
    assert!(kept <= 16, "{kept} series kept");
}

/// What the leading agent reports of hosts acting where they should not on a pool's network
/// becomes the pool's `ForeignDHCPServer` / `ProxyARPResponder` / `ProxyNDPResponder` conditions
/// through the real API server, with a Warning event when one appears and a gauge (a DHCPv6
/// server named by its IPv6 source); a standby's claims count for nothing, and an empty report
/// clears the condition.
#[tokio::test]
async fn a_foreign_dhcp_server_the_leading_agent_reports_is_a_condition_until_it_is_gone() {
    use k8s_openapi::api::events::v1::Event;
    use vmdhcp_proto::agent::v1 as pb;
    let (client, ns) = setup("rogue").await;
    create_nad(&client, &ns, "net-r").await;
    create_pool(&client, &ns, "pool-r", "net-r", 8).await;
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    wait_for(&pools, "pool-r", "ready", ready).await;
    let h = controller();
    let mut grpc =
        pb::config_service_client::ConfigServiceClient::connect(format!("http://{}", h.grpc))
            .await
            .unwrap();
    let report = |pod: &str, leader: bool, suspects: Vec<pb::NetworkSuspect>| pb::ReportRequest {
        agent: Some(pb::AgentIdentity {
            pod_name: format!("{pod}-{ns}"),
            namespace: AGENT_NS.into(),
            node_name: "n1".into(),
        }),
        epoch: h.index.epoch().to_string(),
        applied_revision: h.index.revision(),
        leader,
        interfaces: vec![pb::InterfaceReport {
            pool_ref: format!("{ns}/pool-r"),
            interface_name: "vmd1".into(),
            state: pb::InterfaceState::Serving.into(),
            error: String::new(),
            lease_count: 0,
            probes: vec![],
            suspects,
        }],
    };
    let rogue = pb::NetworkSuspect {
        kind: pb::SuspectKind::ForeignDhcpServer.into(),
        mac_address: "02:00:00:00:0e:0e".into(),
        ip_address: "10.8.0.7".into(),
        detail: "offered 10.8.0.50 in answer to the agent's probe".into(),
        ipv6_address: String::new(),
    };
    let claimed = pb::NetworkSuspect {
        mac_address: "02:00:00:00:0e:0f".into(),
        ip_address: "10.8.0.9".into(),
        ..rogue.clone()
    };
    let rogue6 = pb::NetworkSuspect {
        mac_address: "02:00:00:00:0e:10".into(),
        ip_address: String::new(),
        ipv6_address: "fe80::66".into(),
        detail: "ADVERTISE to the agent's SOLICIT".into(),
        ..rogue.clone()
    };
    let proxy6 = pb::NetworkSuspect {
        kind: pb::SuspectKind::ProxyNdpResponder.into(),
        mac_address: "02:00:00:00:0e:11".into(),
        ip_address: String::new(),
        ipv6_address: String::new(),
        detail: "answers Neighbor Solicitations for addresses nobody holds".into(),
    };

    // A standby's claim first: believed by nobody.
    grpc.report(report("standby", false, vec![claimed]))
        .await
        .unwrap();
    grpc.report(report("leader", true, vec![rogue.clone()]))
        .await
        .unwrap();
    let pool = wait_for(&pools, "pool-r", "ForeignDHCPServer=True", |p| {
        condition(p, "ForeignDHCPServer").is_some_and(|c| c.0 == "True")
    })
    .await;
    let status = pool.status.unwrap();
    let found = find_condition(&status.conditions, "ForeignDHCPServer").unwrap();
    let message = found.message.clone().unwrap_or_default();
    assert_eq!(found.reason.as_deref(), Some("Detected"));
    assert!(
        message.contains("10.8.0.7 (02:00:00:00:0e:0e)") && !message.contains("0e:0f"),
        "{message}"
    );
    assert_eq!(
        find_condition(&status.conditions, "ProxyARPResponder").map(|c| c.status.as_str()),
        Some("False")
    );

    // A Warning event names it, with what it did.
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    // The note of the first Warning with `reason` whose note names `mac`.
    let warning = async |reason: &str, mac: &str| {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let listed = events.list(&Default::default()).await.unwrap().items;
            if let Some(e) = listed.iter().find(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.note.as_deref().is_some_and(|n| n.contains(mac))
            }) {
                assert_eq!(e.type_.as_deref(), Some("Warning"));
                return e.note.clone().unwrap_or_default();
            }
            assert!(Instant::now() < deadline, "no {reason} event: {listed:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let note = warning("ForeignDHCPServer", "02:00:00:00:0e:0e").await;
    for wanted in [
        "02:00:00:00:0e:0e",
        "10.8.0.7",
        "in answer to the agent's probe",
    ] {
        assert!(note.contains(wanted), "{wanted} not in {note}");
    }
    // The gauge is set right after the status write that shows the condition.
    let gauge_reads = async |n: u32| {
        let series = format!(
            r#"vmdhcpcontroller_network_suspects{{ippool="{ns}/pool-r",kind="foreign_dhcp_server"}} {n}"#
        );
        let deadline = Instant::now() + DEADLINE;
        loop {
            let metrics = metrics_text(h.http).await;
            if metrics.contains(&series) {
                return;
            }
            assert!(Instant::now() < deadline, "{series} not in:\n{metrics}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    gauge_reads(1).await;

    // A DHCPv6 server is named by its IPv6 source; a proxy-NDP responder has its own condition
    // and event.
    grpc.report(report("leader", true, vec![rogue, rogue6, proxy6]))
        .await
        .unwrap();
    let pool = wait_for(&pools, "pool-r", "ProxyNDPResponder=True", |p| {
        condition(p, "ProxyNDPResponder").is_some_and(|c| c.0 == "True")
    })
    .await;
    let status = pool.status.unwrap();
    let dhcp = find_condition(&status.conditions, "ForeignDHCPServer").unwrap();
    assert!(
        dhcp.message
            .as_deref()
            .unwrap_or_default()
            .ends_with("10.8.0.7 (02:00:00:00:0e:0e), fe80::66 (02:00:00:00:0e:10)"),
        "{dhcp:?}"
    );
    let ndp = find_condition(&status.conditions, "ProxyNDPResponder").unwrap();
    assert!(
        ndp.message
            .as_deref()
            .unwrap_or_default()
            .ends_with("an unknown address (02:00:00:00:0e:11)"),
        "{ndp:?}"
    );
    assert_eq!(
        find_condition(&status.conditions, "ProxyARPResponder").map(|c| c.status.as_str()),
        Some("False")
    );
    warning("ProxyNDPResponder", "02:00:00:00:0e:11").await;

    // The leader finds it no more: False, and the gauge follows.
    grpc.report(report("leader", true, vec![])).await.unwrap();
    let pool = wait_for(&pools, "pool-r", "ForeignDHCPServer=False", |p| {
        condition(p, "ForeignDHCPServer").is_some_and(|c| c.0 == "False")
    })
    .await;
    assert_eq!(
        condition(&pool, "ForeignDHCPServer").unwrap().1,
        None,
        "checked, and none found"
    );
    gauge_reads(0).await;

    // The series goes with the pool.
    delete_pool(&pools, "pool-r").await;
    let metrics = metrics_text(h.http).await;
    assert!(!metrics.contains(&format!("{ns}/pool-r")), "{metrics}");
}

/// The IPv6 `allocated` map of a dual-stack pool's status.
fn allocated_v6(pool: &IPPool) -> std::collections::BTreeMap<String, String> {
    pool.status
        .as_ref()
        .and_then(|s| s.ipv6.clone())
        .map(|v| v.allocated)
        .unwrap_or_default()
}

/// The (MAC, IPv4, IPv6) a config's status records for each NIC.
fn cfg_both(cfg: &VirtualMachineNetworkConfig) -> Vec<(String, String, String)> {
    cfg.status
        .iter()
        .flat_map(|s| &s.network_configs)
        .map(|e| {
            (
                e.mac_address.clone().unwrap_or_default(),
                e.allocated_ip_address.clone().unwrap_or_default(),
                e.allocated_ipv6_address.clone().unwrap_or_default(),
            )
        })
        .collect()
}

/// A dual-stack pool (the shape of Harvester's example): each NIC gets its IPv4 address, then
/// its IPv6 one; the pool's status records both families (the server and router inside the
/// IPv6 range `RESERVED`), the config's status both addresses; a static `ipv6Address` is
/// honoured, a bad one refused with the IPAM's words; a VM's deletion frees both.
#[tokio::test]
async fn a_dual_stack_pool_allocates_records_and_frees_both_families() {
    let (client, ns) = setup("dual").await;
    create_nad(&client, &ns, "net-d").await;
    let pool: IPPool = serde_json::from_value(json!({
        "apiVersion": "network.harvesterhci.io/v1alpha1", "kind": "IPPool",
        "metadata": {"name": "dual", "namespace": ns},
        "spec": {"networkName": format!("{ns}/net-d"),
            "ipv4Config": {"serverIP": "10.77.0.2", "cidr": "10.77.0.0/24", "router": "10.77.0.1",
                "pool": {"start": "10.77.0.10", "end": "10.77.0.20"}},
            "ipv6Config": {"serverIP": "fd00:77::1", "cidr": "fd00:77::/112", "router": "fd00:77::2",
                "pool": {"start": "fd00:77::1", "end": "fd00:77::20"}}}
    }))
    .unwrap();
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    pools.create(&PostParams::default(), &pool).await.unwrap();
    wait_for(&pools, "dual", "ready", ready).await;

    let vms = vm_api(&client, &ns);
    let net = format!("{ns}/net-d");
    let (mac1, mac2) = ("02:77:00:00:00:01", "02:77:00:00:00:02");
    for (name, mac) in [("d1", mac1), ("d2", mac2)] {
        vms.create(&PostParams::default(), &vm(&ns, name, &[(&net, mac)]))
            .await
            .unwrap();
    }
    let cfgs: Api<VirtualMachineNetworkConfig> = Api::namespaced(client.clone(), &ns);
    let d1 = wait_for(&cfgs, "d1", "allocated both families", |c| {
        cfg_condition(c, "Allocated").is_some_and(|a| a.0 == "True")
            && cfg_both(c)
                .iter()
                .all(|(_, v4, v6)| !v4.is_empty() && !v6.is_empty())
    })
    .await;
    let (_, v4, v6) = cfg_both(&d1).remove(0);
    let recorded = wait_for(&pools, "dual", "recording d1 in both families", |p| {
        allocated(p).get(&v4).map(String::as_str) == Some(mac1)
            && allocated_v6(p).get(&v6).map(String::as_str) == Some(mac1)
    })
    .await;
    let six = allocated_v6(&recorded);
    assert_eq!(
        six.get("fd00:77::1").map(String::as_str),
        Some(ALLOCATED_RESERVED)
    );
    assert_eq!(
        six.get("fd00:77::2").map(String::as_str),
        Some(ALLOCATED_RESERVED)
    );
    assert!(
        ["fd00:77::3", "fd00:77::4"].contains(&v6.as_str()),
        "lowest free first: {v6}"
    );

    // A static IPv6 address, set on the config by an operator: honoured, and kept by the VM's
    // reconcile.
    let nic = |v6: &str| json!({"spec": {"networkConfigs": [{"networkName": net, "macAddress": mac2, "ipv6Address": v6}]}});
    cfgs.patch(
        "d2",
        &PatchParams::default(),
        &Patch::Merge(nic("fd00:77::20")),
    )
    .await
    .unwrap();
    wait_for(&cfgs, "d2", "given its static IPv6 address", |c| {
        cfg_both(c).first().map(|e| e.2.as_str()) == Some("fd00:77::20")
    })
    .await;
    wait_for(&pools, "dual", "recording the static IPv6 address", |p| {
        allocated_v6(p).get("fd00:77::20").map(String::as_str) == Some(mac2)
            && allocated_v6(p).values().filter(|m| *m == mac2).count() == 1
    })
    .await;
    // Outside the range: refused with the IPAM's words, the IPv4 address kept.
    cfgs.patch(
        "d2",
        &PatchParams::default(),
        &Patch::Merge(nic("fd00:77::99")),
    )
    .await
    .unwrap();
    let refused = wait_for(
        &cfgs,
        "d2",
        "refused an IPv6 address outside the range",
        |c| cfg_condition(c, "Allocated").is_some_and(|a| a.0 == "False"),
    )
    .await;
    let message = find_condition(&refused.status.as_ref().unwrap().conditions, "Allocated")
        .and_then(|c| c.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains("IPv6") && message.contains("outside the pool range"),
        "{message}"
    );
    assert!(!cfg_both(&refused)[0].1.is_empty(), "{refused:?}");

    // The VM goes: both of its addresses are freed, in one status.
    vms.delete("d1", &DeleteParams::default()).await.unwrap();
    let freed = wait_for(&pools, "dual", "freeing both of d1's addresses", |p| {
        !allocated(p).values().any(|m| m == mac1) && !allocated_v6(p).values().any(|m| m == mac1)
    })
    .await;
    let v6_status = freed.status.as_ref().unwrap().ipv6.clone().unwrap();
    assert_eq!(v6_status.used, 1, "{v6_status:?}");
    assert_eq!(v6_status.available, 32 - 2 - 1, "{v6_status:?}");

    // The agent Deployment's bootstrap carries the pool's IPv6 side.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), AGENT_NS);
    let pool_ref = format!("{ns}/dual");
    let deadline = Instant::now() + DEADLINE;
    loop {
        let d = deployments.get("vm-dhcp-agent").await.unwrap();
        let env = d.spec.unwrap().template.spec.unwrap().containers[0]
            .env
            .clone()
            .unwrap_or_default();
        let configs = env
            .iter()
            .find(|e| e.name == "AGENT_NETWORK_CONFIGS")
            .and_then(|e| e.value.clone())
            .unwrap_or_default();
        let parsed = vmdhcp_core::bootstrap::parse_network_configs(&configs).unwrap_or_default();
        if let Some(mine) = parsed
            .iter()
            .find(|c| c.ip_pool_ref.to_string() == pool_ref)
        {
            assert_eq!(mine.server_ipv6, Some("fd00:77::1".parse().unwrap()));
            assert_eq!(
                mine.cidr_v6.map(|c| c.to_string()).as_deref(),
                Some("fd00:77::/112")
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no bootstrap for {pool_ref}: {configs}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A pool that loses its ipv6Config (past the webhook, which refuses it): its IPv6 books
    // and `status.ipv6` go, and the configs stop naming an IPv6 address; IPv4 is untouched.
    pools
        .patch(
            "dual",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ipv6Config": null}})),
        )
        .await
        .unwrap();
    wait_for(&pools, "dual", "dropping status.ipv6", |p| {
        p.status.as_ref().is_some_and(|s| s.ipv6.is_none())
            && allocated(p).values().any(|m| m == mac2)
    })
    .await;
    wait_for(&cfgs, "d2", "dropping its IPv6 address", |c| {
        cfg_both(c)
            .first()
            .is_some_and(|(_, v4, v6)| !v4.is_empty() && v6.is_empty())
    })
    .await;
}

/// A static address a config asks for is never handed to a dynamic NIC, even one that
/// reconciles first: here the config asking for the pool's lowest free address is paused (as
/// one waiting for anything would be) while a VM with a dynamic NIC comes; the VM gets the next
/// address, and the config gets its own once resumed.
#[tokio::test]
async fn a_static_address_asked_for_is_never_given_to_a_dynamic_nic() {
    let (client, ns) = setup("static").await;
    create_nad(&client, &ns, "net-s").await;
    create_pool(&client, &ns, "pool-s", "net-s", 9).await;
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    wait_for(&pools, "pool-s", "ready", ready).await;
    let cfgs: Api<VirtualMachineNetworkConfig> = Api::namespaced(client.clone(), &ns);
    let asks: VirtualMachineNetworkConfig = serde_json::from_value(json!({
        "apiVersion": "network.harvesterhci.io/v1alpha1", "kind": "VirtualMachineNetworkConfig",
        "metadata": {"name": "asks", "namespace": ns},
        "spec": {"vmName": "asks", "paused": true, "networkConfigs": [{"networkName": format!("{ns}/net-s"), "macAddress": "02:00:00:00:09:01", "ipAddress": "10.9.0.10"}]}
    }))
    .unwrap();
    cfgs.create(&PostParams::default(), &asks).await.unwrap();
    wait_for(&cfgs, "asks", "disabled", |c| {
        cfg_condition(c, "Disabled").is_some_and(|a| a.0 == "True")
    })
    .await;

    vm_api(&client, &ns)
        .create(
            &PostParams::default(),
            &vm(&ns, "dynamic", &[("net-s", "02:00:00:00:09:02")]),
        )
        .await
        .unwrap();
    let dynamic = wait_for(&cfgs, "dynamic", "allocated", |c| {
        cfg_condition(c, "Allocated").is_some_and(|a| a.0 == "True")
    })
    .await;
    // .10 is asked for, .11 excluded, .12 the server's.
    assert_eq!(cfg_ips(&dynamic)[0].1, "10.9.0.13");

    cfgs.patch(
        "asks",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"paused": false}})),
    )
    .await
    .unwrap();
    let asks = wait_for(&cfgs, "asks", "allocated", |c| {
        cfg_condition(c, "Allocated").is_some_and(|a| a.0 == "True")
    })
    .await;
    assert_eq!(cfg_ips(&asks)[0].1, "10.9.0.10");
    let pool = pools.get("pool-s").await.unwrap();
    assert_eq!(
        allocated(&pool).get("10.9.0.10").map(String::as_str),
        Some("02:00:00:00:09:01")
    );
}

/// A config on a network no pool serves is not polled (on a cluster whose VLANs have DHCP of
/// their own, thousands of them would be reconciled every few seconds for nothing): it waits,
/// and the pool's creation and readiness wake it.
#[tokio::test]
async fn a_config_waiting_for_a_pool_is_woken_by_the_pool_not_polled() {
    let (client, ns) = setup("nopool").await;
    create_nad(&client, &ns, "net-w").await;
    vm_api(&client, &ns)
        .create(
            &PostParams::default(),
            &vm(&ns, "early", &[("net-w", "02:00:00:00:0a:01")]),
        )
        .await
        .unwrap();
    let cfgs: Api<VirtualMachineNetworkConfig> = Api::namespaced(client.clone(), &ns);
    let waiting = wait_for(&cfgs, "early", "pending", |c| {
        cfg_condition(c, "Allocated").is_some_and(|a| a.0 == "False")
    })
    .await;
    let msg = find_condition(&waiting.status.clone().unwrap().conditions, "Allocated")
        .and_then(|c| c.message.clone())
        .unwrap_or_default();
    assert!(msg.contains("no IPPool serves network"), "{msg}");
    create_pool(&client, &ns, "pool-w", "net-w", 10).await;
    let cfg = wait_for(&cfgs, "early", "allocated", |c| {
        cfg_condition(c, "Allocated").is_some_and(|a| a.0 == "True")
    })
    .await;
    assert_eq!(cfg_ips(&cfg)[0].1, "10.10.0.10");
}

/// What no version of a pool may show while no VM goes: an address recorded for one MAC and
/// then another (it was given twice), or one MAC at two addresses. `first` remembers each
/// address's first MAC across versions.
fn check_version(
    first: &mut std::collections::BTreeMap<String, String>,
    allocated: std::collections::BTreeMap<String, String>,
    family: &str,
) {
    let mut macs = BTreeSet::new();
    for (ip, mac) in allocated.into_iter().filter(|(_, v)| v.starts_with("02:")) {
        assert!(macs.insert(mac.clone()), "{family}: {mac} at two addresses");
        let held = first.entry(ip.clone()).or_insert_with(|| mac.clone());
        assert_eq!(
            *held, mac,
            "{family}: {ip} recorded for {held}, then for {mac}"
        );
    }
}

/// A pool's books are rebuilt every 20 allocations (it gains `ipv6Config`, its exclusions change,
/// it gains a router) while a burst of 300 VMs allocates on it. A rebuild reads the pool and swaps the books while no
/// status write is in flight, and the next write starts from the version it read: otherwise an
/// allocation recorded in between drops out of the books and its address goes to another MAC.
/// Every version of the pool a watch shows is checked, and at the end every allocated config's
/// addresses are recorded for its MAC.
#[tokio::test]
async fn a_pool_rebuilt_during_a_burst_never_records_an_address_for_two_macs() {
    use futures_util::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};

    let (client, ns) = setup("rebuild").await;
    create_nad(&client, &ns, "net-rb").await;
    let pool: IPPool = serde_json::from_value(json!({
        "apiVersion": "network.harvesterhci.io/v1alpha1", "kind": "IPPool",
        "metadata": {"name": "pool-rb", "namespace": ns},
        "spec": {"networkName": format!("{ns}/net-rb"), "ipv4Config": {"serverIP": "10.78.0.1",
            "cidr": "10.78.0.0/16", "pool": {"start": "10.78.0.2", "end": "10.78.255.254"}}}
    }))
    .unwrap();
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    pools.create(&PostParams::default(), &pool).await.unwrap();
    wait_for(&pools, "pool-rb", "ready", ready).await;

    let checker = tokio::spawn({
        let versions = watcher(
            pools.clone(),
            watcher::Config::default().fields("metadata.name=pool-rb"),
        )
        .applied_objects();
        async move {
            let (mut v4, mut v6) = Default::default();
            let mut versions = std::pin::pin!(versions);
            while let Some(Ok(p)) = versions.next().await {
                check_version(&mut v4, allocated(&p), "IPv4");
                check_version(&mut v6, allocated_v6(&p), "IPv6");
            }
        }
    });
    let n = 300u32;
    let burst = tokio::spawn({
        let (vms, ns) = (vm_api(&client, &ns), ns.clone());
        async move {
            let creates = (0..n).map(|i| {
                let vms = vms.clone();
                let mac = format!("02:00:00:4e:{:02x}:{:02x}", i / 256, i % 256);
                let v = vm(&ns, &format!("vm-{i}"), &[("net-rb", &mac)]);
                async move { vms.create(&PostParams::default(), &v).await.unwrap() }
            });
            futures_util::stream::iter(creates)
                .buffer_unordered(32)
                .collect::<Vec<_>>()
                .await;
        }
    });
    // A rebuild every 20 allocations: the IPv6 side first, then the exclusions toggled, then a
    // router. Each is a GET and a swap of the books while allocations go on.
    let mut edits = vec![(
        30,
        json!({"spec": {"ipv6Config": {"serverIP": "fd00:78::1", "cidr": "fd00:78::/112",
            "pool": {"start": "fd00:78::10", "end": "fd00:78::ffff"}}}}),
    )];
    for (i, after) in (50..280).step_by(20).enumerate() {
        let exclude = if i % 2 == 0 {
            json!(["10.78.255.200", "10.78.255.201"])
        } else {
            json!(["10.78.255.210"])
        };
        edits.push((
            after,
            json!({"spec": {"ipv4Config": {"pool": {"exclude": exclude}}}}),
        ));
    }
    edits.push((
        290,
        json!({"spec": {"ipv4Config": {"router": "10.78.255.254"}}}),
    ));
    for (after, edit) in edits {
        wait_for(&pools, "pool-rb", "allocating", |p| {
            held_by_vms(p).len() >= after
        })
        .await;
        pools
            .patch("pool-rb", &PatchParams::default(), &Patch::Merge(edit))
            .await
            .unwrap();
    }
    burst.await.unwrap();

    let cfgs: Api<VirtualMachineNetworkConfig> = Api::namespaced(client.clone(), &ns);
    let deadline = Instant::now() + 4 * DEADLINE;
    let done = loop {
        let all = cfgs.list(&Default::default()).await.unwrap().items;
        let done: Vec<_> = all
            .into_iter()
            .filter(|c| cfg_condition(c, "Allocated").is_some_and(|a| a.0 == "True"))
            .filter(|c| {
                cfg_both(c)
                    .iter()
                    .all(|(_, v4, v6)| !v4.is_empty() && !v6.is_empty())
            })
            .collect();
        if done.len() == n as usize {
            break done;
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {n} configs allocated in both families",
            done.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let pool = pools.get("pool-rb").await.unwrap();
    let (v4, v6) = (allocated(&pool), allocated_v6(&pool));
    for c in &done {
        for (mac, ip4, ip6) in cfg_both(c) {
            assert_eq!(v4.get(&ip4), Some(&mac), "{}: {ip4}", c.name_any());
            assert_eq!(v6.get(&ip6), Some(&mac), "{}: {ip6}", c.name_any());
        }
    }
    // A failed check ends the watch task: its panic is this test's.
    let ended = checker.is_finished();
    checker.abort();
    if let Err(e) = checker.await
        && e.is_panic()
    {
        std::panic::resume_unwind(e.into_panic());
    }
    assert!(!ended, "the pool's watch ended before the burst did");
}

/// A config refused because another config holds its MAC (`MacInUse`) says so once: reconciled
/// again, it raises no second Warning while its condition already says it. And it gets the MAC's
/// address as soon as the holder goes, woken by the holder's deletion (not a minute later).
#[tokio::test]
async fn a_config_refused_for_a_mac_in_use_warns_once_and_gets_it_when_the_holder_goes() {
    let (client, ns) = setup("macinuse").await;
    create_nad(&client, &ns, "net-m").await;
    create_pool(&client, &ns, "pool-m", "net-m", 79).await;
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    wait_for(&pools, "pool-m", "ready", ready).await;
    let cfgs: Api<VirtualMachineNetworkConfig> = Api::namespaced(client.clone(), &ns);
    let config = |name: &str| -> VirtualMachineNetworkConfig {
        serde_json::from_value(json!({
            "apiVersion": "network.harvesterhci.io/v1alpha1", "kind": "VirtualMachineNetworkConfig",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"vmName": name, "networkConfigs": [{"networkName": format!("{ns}/net-m"), "macAddress": "02:00:00:4f:00:01"}]}
        }))
        .unwrap()
    };
    cfgs.create(&PostParams::default(), &config("holder"))
        .await
        .unwrap();
    let held = wait_for(&cfgs, "holder", "allocated", |c| {
        cfg_condition(c, "Allocated").is_some_and(|a| a.0 == "True")
    })
    .await;
    cfgs.create(&PostParams::default(), &config("second"))
        .await
        .unwrap();
    wait_for(&cfgs, "second", "refused", |c| {
        cfg_condition(c, "Allocated") == Some(("False".into(), Some("MacInUse".into())))
    })
    .await;
    // Reconciled again (each change of its labels wakes it): no second Warning.
    for i in 0..3 {
        cfgs.patch(
            "second",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"touch": i.to_string()}}})),
        )
        .await
        .unwrap();
    }
    // Then a second NIC asking for an address outside the range: a new refusal, warned. The
    // events are published in order, so once this one shows, any repeat of MacInUse before it
    // does too.
    let nic = |mac: &str, ip: Option<&str>| json!({"networkName": format!("{ns}/net-m"), "macAddress": mac, "ipAddress": ip});
    let spec = |nics: Vec<Value>| json!({"spec": {"networkConfigs": nics}});
    let with_refused = spec(vec![
        nic("02:00:00:4f:00:01", None),
        nic("02:00:00:4f:00:02", Some("10.79.0.99")),
    ]);
    cfgs.patch(
        "second",
        &PatchParams::default(),
        &Patch::Merge(with_refused),
    )
    .await
    .unwrap();
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &ns);
    let count = |events: &[k8s_openapi::api::events::v1::Event], reason: &str| -> i32 {
        events
            .iter()
            .filter(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("second")
            })
            .map(|e| e.series.as_ref().map_or(1, |s| s.count))
            .sum()
    };
    let deadline = Instant::now() + DEADLINE;
    let seen = loop {
        let seen = events.list(&Default::default()).await.unwrap().items;
        if count(&seen, "AllocationRefused") > 0 {
            break seen;
        }
        assert!(Instant::now() < deadline, "no AllocationRefused event");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        count(&seen, "MacInUse"),
        1,
        "MacInUse warned more than once"
    );
    cfgs.patch(
        "second",
        &PatchParams::default(),
        &Patch::Merge(spec(vec![nic("02:00:00:4f:00:01", None)])),
    )
    .await
    .unwrap();

    cfgs.delete("holder", &DeleteParams::default())
        .await
        .unwrap();
    let second = wait_for(&cfgs, "second", "allocated once the holder went", |c| {
        cfg_condition(c, "Allocated").is_some_and(|a| a.0 == "True")
    })
    .await;
    assert_eq!(cfg_ips(&second)[0].1, cfg_ips(&held)[0].1);
}

/// A VM's `static-ip.harvesterhci.io/<nic>` annotation (upstream v1.9) pins that NIC: the
/// generated config asks for the address and the NIC gets it; an annotation naming no NIC of the
/// VM, or not an IPv4 address, is skipped; changing it moves the NIC (the old address is free
/// again); removing it unpins the NIC and keeps its address. On a dual-stack pool our
/// `static-ipv6.vmdhcp.io/<nic>` pins the IPv6 side the same way.
#[tokio::test]
async fn a_vm_s_static_ip_annotations_pin_move_and_unpin_its_nic() {
    let (client, ns) = setup("pins").await;
    create_nad(&client, &ns, "net-p").await;
    create_pool(&client, &ns, "pool-p", "net-p", 81).await;
    create_nad(&client, &ns, "net-q").await;
    let dual: IPPool = serde_json::from_value(json!({
        "apiVersion": "network.harvesterhci.io/v1alpha1", "kind": "IPPool",
        "metadata": {"name": "pool-q", "namespace": ns},
        "spec": {"networkName": format!("{ns}/net-q"),
            "ipv4Config": {"serverIP": "10.82.0.2", "cidr": "10.82.0.0/24",
                "pool": {"start": "10.82.0.10", "end": "10.82.0.20"}},
            "ipv6Config": {"serverIP": "fd00:82::1", "cidr": "fd00:82::/112",
                "pool": {"start": "fd00:82::10", "end": "fd00:82::20"}}}
    }))
    .unwrap();
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    pools.create(&PostParams::default(), &dual).await.unwrap();
    wait_for(&pools, "pool-p", "ready", ready).await;
    wait_for(&pools, "pool-q", "ready", ready).await;
    let vms = vm_api(&client, &ns);
    let cfgs: Api<VirtualMachineNetworkConfig> = Api::namespaced(client.clone(), &ns);
    let mac = "02:00:00:51:00:01";
    let mut pinned = vm(&ns, "pinned", &[(&format!("{ns}/net-p"), mac)]);
    pinned.metadata.annotations = Some(
        [
            ("static-ip.harvesterhci.io/nic-0", "10.81.0.15"),
            ("static-ip.harvesterhci.io/nic-9", "10.81.0.16"),
            ("static-ipv6.vmdhcp.io/nic-0", "10.81.0.17"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .into(),
    );
    vms.create(&PostParams::default(), &pinned).await.unwrap();
    let holds = |ip: &'static str| {
        move |c: &VirtualMachineNetworkConfig| {
            cfg_ips(c)
                .first()
                .is_some_and(|(m, a, _)| m == mac && a == ip)
        }
    };
    let cfg = wait_for(
        &cfgs,
        "pinned",
        "allocated its pin .15",
        holds("10.81.0.15"),
    )
    .await;
    let asked = &cfg.spec.network_configs[0];
    assert_eq!(
        (asked.ip_address.as_deref(), asked.ipv6_address.as_deref()),
        (Some("10.81.0.15"), None),
        "only the valid pin of a NIC the VM has"
    );
    wait_for(&pools, "pool-p", "recording .15", |p| {
        allocated(p).get("10.81.0.15").map(String::as_str) == Some(mac)
    })
    .await;

    // Changed: the NIC moves and its old address is free again.
    let annotate = |value: Value| {
        let vms = vms.clone();
        async move {
            vms.patch(
                "pinned",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": value}})),
            )
            .await
            .unwrap();
        }
    };
    annotate(json!({"static-ip.harvesterhci.io/nic-0": "10.81.0.18"})).await;
    wait_for(&cfgs, "pinned", "moved to .18", holds("10.81.0.18")).await;
    wait_for(&pools, "pool-p", "recording .18, .15 free", |p| {
        let a = allocated(p);
        a.get("10.81.0.18").map(String::as_str) == Some(mac) && !a.contains_key("10.81.0.15")
    })
    .await;

    // Removed: unpinned, the address kept.
    annotate(json!({"static-ip.harvesterhci.io/nic-0": null})).await;
    let cfg = wait_for(&cfgs, "pinned", "unpinned", |c| {
        c.spec.network_configs[0].ip_address.is_none()
    })
    .await;
    assert!(holds("10.81.0.18")(&cfg), "{cfg:?}");
    assert!(
        cfg.annotations()
            .get("vmdhcp.io/pinned-by-vm-annotation")
            .is_none(),
        "{cfg:?}"
    );
    let pool = pools.get("pool-p").await.unwrap();
    assert_eq!(
        allocated(&pool).get("10.81.0.18").map(String::as_str),
        Some(mac)
    );

    // The IPv6 side of a dual-stack pool, by our annotation, beside an IPv4 pin.
    let mac6 = "02:00:00:52:00:01";
    let mut dual_vm = vm(&ns, "pinned6", &[(&format!("{ns}/net-q"), mac6)]);
    dual_vm.metadata.annotations = Some(
        [
            ("static-ip.harvesterhci.io/nic-0", "10.82.0.14"),
            ("static-ipv6.vmdhcp.io/nic-0", "fd00:82::14"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .into(),
    );
    vms.create(&PostParams::default(), &dual_vm).await.unwrap();
    let cfg = wait_for(&cfgs, "pinned6", "allocated both pins", |c| {
        cfg_both(c)
            .first()
            .is_some_and(|(m, v4, v6)| m == mac6 && v4 == "10.82.0.14" && v6 == "fd00:82::14")
    })
    .await;
    assert_eq!(
        cfg.annotations()
            .get("vmdhcp.io/pinned-by-vm-annotation")
            .map(String::as_str),
        Some("02:00:00:52:00:01=10.82.0.14,02:00:00:52:00:01=fd00:82::14")
    );
}

/// With `--vm-address-annotation`, a VM's allocated addresses are shown where Harvester's UI
/// reads them, `harvesterhci.io/custom-ip` (IPv4 then IPv6 per NIC, in the VM's network
/// order), and follow its NICs: a second NIC, its last NIC gone (removed). A value a person set
/// is never overwritten: the controller drops its own record of the value and leaves theirs.
#[tokio::test]
async fn a_vm_s_addresses_are_shown_in_its_custom_ip_annotation_and_a_person_s_value_is_kept() {
    const SHOWN: &str = "harvesterhci.io/custom-ip";
    const WRITTEN: &str = "vmdhcp.io/custom-ip-written";
    let (client, ns) = setup("customip").await;
    create_nad(&client, &ns, "net-c").await;
    create_pool(&client, &ns, "pool-c", "net-c", 83).await;
    create_nad(&client, &ns, "net-d").await;
    create_pool(&client, &ns, "pool-d", "net-d", 84).await;
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    wait_for(&pools, "pool-c", "ready", ready).await;
    wait_for(&pools, "pool-d", "ready", ready).await;
    let vms = vm_api(&client, &ns);
    let cfgs: Api<VirtualMachineNetworkConfig> = Api::namespaced(client.clone(), &ns);
    let (net_c, net_d) = (format!("{ns}/net-c"), format!("{ns}/net-d"));
    let annotations_read =
        |vm: &'static str,
         what: String,
         want: Box<dyn Fn(&DynamicObject) -> bool + Send + Sync>| {
            let vms = vms.clone();
            async move { wait_for(&vms, vm, &what, |v| want(v)).await }
        };
    let shows = |vm: &'static str, value: Option<String>| {
        annotations_read(
            vm,
            format!("showing {value:?}"),
            Box::new(move |v: &DynamicObject| {
                let a = v.annotations();
                a.get(SHOWN) == value.as_ref() && a.get(WRITTEN) == value.as_ref()
            }),
        )
    };
    let nics_of = |pairs: &[(&str, &str)]| vm(&ns, "shown", pairs).data["spec"].clone();

    // Created: its address shown, and recorded as ours.
    vms.create(
        &PostParams::default(),
        &vm(&ns, "shown", &[(&net_c, "02:00:00:53:00:01")]),
    )
    .await
    .unwrap();
    let one = wait_for(&cfgs, "shown", "allocated", |c| {
        cfg_condition(c, "Allocated").is_some_and(|a| a.0 == "True")
    })
    .await;
    let first = cfg_ips(&one)[0].1.clone();
    shows("shown", Some(first.clone())).await;

    // A second NIC: both, in the VM's network order.
    let spec = nics_of(&[(&net_c, "02:00:00:53:00:01"), (&net_d, "02:00:00:54:00:01")]);
    vms.patch(
        "shown",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": spec })),
    )
    .await
    .unwrap();
    let both = wait_for(&cfgs, "shown", "two NICs allocated", |c| {
        let ips = cfg_ips(c);
        ips.len() == 2 && ips.iter().all(|(_, ip, _)| !ip.is_empty())
    })
    .await;
    let by_mac: std::collections::BTreeMap<String, String> = cfg_ips(&both)
        .into_iter()
        .map(|(m, ip, _)| (m, ip))
        .collect();
    let second = by_mac["02:00:00:54:00:01"].clone();
    assert_eq!(by_mac["02:00:00:53:00:01"], first);
    shows("shown", Some(format!("{first},{second}"))).await;

    // The last NICs gone: the value we wrote goes with them.
    let spec = nics_of(&[]);
    vms.patch(
        "shown",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": spec })),
    )
    .await
    .unwrap();
    shows("shown", None).await;

    // A person's value, set over ours: when the VM's address next changes (a new NIC), the
    // controller sees it, drops its own record, and leaves the person's value as it is.
    let spec = nics_of(&[(&net_c, "02:00:00:53:00:02")]);
    vms.patch(
        "shown",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": spec })),
    )
    .await
    .unwrap();
    let again = wait_for(&cfgs, "shown", "allocated again", |c| {
        cfg_ips(c)
            .first()
            .is_some_and(|(m, ip, _)| m == "02:00:00:53:00:02" && !ip.is_empty())
    })
    .await;
    shows("shown", Some(cfg_ips(&again)[0].1.clone())).await;
    vms.patch(
        "shown",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {SHOWN: "192.0.2.10"}}})),
    )
    .await
    .unwrap();
    let spec = nics_of(&[(&net_c, "02:00:00:53:00:02"), (&net_d, "02:00:00:54:00:02")]);
    vms.patch(
        "shown",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": spec })),
    )
    .await
    .unwrap();
    let v = annotations_read(
        "shown",
        "our record dropped".into(),
        Box::new(|v: &DynamicObject| !v.annotations().contains_key(WRITTEN)),
    )
    .await;
    assert_eq!(
        v.annotations().get(SHOWN).map(String::as_str),
        Some("192.0.2.10")
    );
}

/// `status.ipv4.dhcpOptions` of `pool` for the address `mac` holds, if it holds one.
fn recorded_options(pool: &IPPool, mac: &str) -> Option<vmdhcp_core::crd::DhcpOptions> {
    let v4 = pool.status.as_ref()?.ipv4.as_ref()?;
    let (ip, _) = v4.allocated.iter().find(|(_, m)| m.as_str() == mac)?;
    v4.dhcp_options.get(ip).cloned()
}

#[tokio::test]
async fn a_vm_s_dhcp_options_reach_its_config_and_its_pool_and_follow_its_changes() {
    let (client, ns) = setup("nicopts").await;
    create_nad(&client, &ns, "net-o").await;
    create_pool(&client, &ns, "pool-o", "net-o", 83).await;
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    wait_for(&pools, "pool-o", "ready", ready).await;
    let vms = vm_api(&client, &ns);
    let cfgs: Api<VirtualMachineNetworkConfig> = Api::namespaced(client.clone(), &ns);
    let mac = "02:00:00:53:00:01";
    let net = format!("{ns}/net-o");
    // KubeVirt's own field, as a VM manifest sets it.
    let interface = |options: Value| {
        json!({"spec": {"template": {"spec": {"domain": {"devices": {"interfaces": [
            {"name": "nic-0", "macAddress": mac, "bridge": {}, "dhcpOptions": options}
        ]}}}}}})
    };
    let mut booted = vm(&ns, "booted", &[(&net, mac)]);
    booted.data["spec"]["template"]["spec"]["domain"]["devices"]["interfaces"][0]["dhcpOptions"] = json!({
        "bootFileName": "pxelinux.0", "ntpServers": ["10.83.0.123"],
        "privateOptions": [{"option": 240, "value": "x"}]
    });
    vms.create(&PostParams::default(), &booted).await.unwrap();

    let boot_file = |o: &Option<vmdhcp_core::crd::DhcpOptions>| {
        o.as_ref().and_then(|o| o.boot_file_name.clone())
    };
    let cfg = wait_for(&cfgs, "booted", "carrying the NIC's options", |c| {
        c.spec
            .network_configs
            .first()
            .is_some_and(|n| boot_file(&n.dhcp_options).as_deref() == Some("pxelinux.0"))
    })
    .await;
    let carried = cfg.spec.network_configs[0].dhcp_options.clone().unwrap();
    assert_eq!(carried.ntp_servers, ["10.83.0.123"]);
    assert_eq!(carried.private_options[0].option, 240);
    // Recorded with the NIC's address, in the pool's status, before any agent serves them.
    let pool = wait_for(&pools, "pool-o", "recording the NIC's options", |p| {
        boot_file(&recorded_options(p, mac)).as_deref() == Some("pxelinux.0")
    })
    .await;
    assert_eq!(recorded_options(&pool, mac).unwrap(), carried);

    // The VM's options change: the record follows.
    let patch = Patch::Merge(interface(json!({"bootFileName": "ipxe.efi"})));
    vms.patch("booted", &PatchParams::default(), &patch)
        .await
        .unwrap();
    wait_for(&pools, "pool-o", "recording the new options", |p| {
        recorded_options(p, mac).is_some_and(|o| {
            o.boot_file_name.as_deref() == Some("ipxe.efi") && o.ntp_servers.is_empty()
        })
    })
    .await;

    // Options KubeVirt's rules refuse are left out (the NIC keeps its address, with the pool's).
    let refused = Patch::Merge(interface(
        json!({"privateOptions": [{"option": 223, "value": "x"}]}),
    ));
    vms.patch("booted", &PatchParams::default(), &refused)
        .await
        .unwrap();
    let pool = wait_for(&pools, "pool-o", "dropping the options", |p| {
        recorded_options(p, mac).is_none()
    })
    .await;
    assert!(held_by_vms(&pool).iter().any(|(_, m)| m == mac), "{pool:?}");
    let cfg = cfgs.get("booted").await.unwrap();
    assert_eq!(cfg.spec.network_configs[0].dhcp_options, None);

    // Deleting the VM releases the address and its options with it.
    vms.delete("booted", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(&pools, "pool-o", "released", |p| {
        !held_by_vms(p).iter().any(|(_, m)| m == mac)
            && p.status
                .as_ref()
                .and_then(|s| s.ipv4.as_ref())
                .is_some_and(|v4| v4.dhcp_options.is_empty())
    })
    .await;
}

fn claim_api(client: &Client, ns: &str) -> Api<AddressClaim> {
    Api::namespaced(client.clone(), ns)
}

async fn create_claim(client: &Client, ns: &str, name: &str, spec: Value) {
    let claim: AddressClaim = serde_json::from_value(json!({
        "apiVersion": "ipam.vmdhcp.io/v1alpha1", "kind": "AddressClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }))
    .unwrap();
    claim_api(client, ns)
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
}

fn claim_phase(c: &AddressClaim) -> Option<ClaimPhase> {
    c.status.as_ref().and_then(|s| s.phase)
}

/// The MAC the pool records for `ip`, if any.
fn recorded_for(pool: &IPPool, ip: &str) -> Option<String> {
    allocated(pool)
        .into_iter()
        .find(|(a, _)| a == ip)
        .map(|(_, m)| m)
}

/// Address claims through the real API server: a VIP held in the pool and given to no NIC; a
/// claim bound to a VM's NIC that outlives the VM and follows the NIC to a new MAC; the pool's
/// rule (namespaces, quota) refusing with messages naming it; a freed address on deletion.
#[tokio::test]
async fn address_claims_hold_outlive_their_vm_follow_its_nic_and_keep_to_the_pool_s_rule() {
    let (client, ns) = setup("claims").await;
    create_nad(&client, &ns, "net-c").await;
    create_pool(&client, &ns, "pool-c", "net-c", 9).await;
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    wait_for(&pools, "pool-c", "ready", ready).await;
    let claims = claim_api(&client, &ns);
    let network = format!("{ns}/net-c");

    // Without spec.claims the pool admits no claim.
    create_claim(&client, &ns, "early", json!({"network": network})).await;
    let early = wait_for(&claims, "early", "refused", |c| {
        claim_phase(c) == Some(ClaimPhase::Refused)
    })
    .await;
    let reserved = find_condition(&early.status.as_ref().unwrap().conditions, "Reserved").unwrap();
    assert_eq!(reserved.reason.as_deref(), Some("NotAdmitted"));
    assert!(
        reserved
            .message
            .as_deref()
            .unwrap()
            .contains("has no spec.claims"),
        "{reserved:?}"
    );
    claims
        .delete("early", &DeleteParams::default())
        .await
        .unwrap();

    // The pool admits this namespace, two IPv4 addresses at most.
    let rule = json!({"spec": {"claims": {"namespaces": [ns], "perNamespace": {"ipv4": 2}}}});
    pools
        .patch("pool-c", &PatchParams::default(), &Patch::Merge(&rule))
        .await
        .unwrap();

    // A VIP: the lowest free address, recorded under the claim's placeholder.
    create_claim(&client, &ns, "vip", json!({"network": network})).await;
    let vip = wait_for(&claims, "vip", "reserved", |c| {
        claim_phase(c) == Some(ClaimPhase::Reserved)
    })
    .await;
    let vip_status = vip.status.clone().unwrap();
    let vip_ip = vip_status.ip_address.clone().unwrap();
    let placeholder = placeholder_mac(vip.metadata.uid.as_deref().unwrap()).to_string();
    assert_eq!(
        vip_status.mac_address.as_deref(),
        Some(placeholder.as_str())
    );
    wait_for(&pools, "pool-c", "recording the VIP", |p| {
        recorded_for(p, &vip_ip).as_deref() == Some(placeholder.as_str())
    })
    .await;

    // A claim for nic-0 of VM web, created before the VM: held for nobody until it comes.
    create_claim(
        &client,
        &ns,
        "web",
        json!({"network": network, "vm": "web", "nic": "nic-0"}),
    )
    .await;
    let web = wait_for(&claims, "web", "reserved", |c| {
        claim_phase(c) == Some(ClaimPhase::Reserved)
    })
    .await;
    let web_ip = web.status.clone().unwrap().ip_address.unwrap();
    assert_ne!(web_ip, vip_ip);

    // Over the quota: the third claim is refused, naming the quota.
    create_claim(&client, &ns, "third", json!({"network": network})).await;
    let third = wait_for(&claims, "third", "refused", |c| {
        claim_phase(c) == Some(ClaimPhase::Refused)
    })
    .await;
    let why = find_condition(&third.status.as_ref().unwrap().conditions, "Reserved").unwrap();
    assert_eq!(why.reason.as_deref(), Some("QuotaExceeded"));
    assert!(
        why.message
            .as_deref()
            .unwrap()
            .contains("spec.claims.perNamespace.ipv4) is 2"),
        "{why:?}"
    );

    let cfgs: Api<VirtualMachineNetworkConfig> = Api::namespaced(client.clone(), &ns);
    let vms = vm_api(&client, &ns);
    let allocated_ip = |c: &VirtualMachineNetworkConfig| {
        cfg_condition(c, "Allocated").is_some_and(|a| a.0 == "True")
    };
    // A VM without a claim gets neither claimed address.
    vms.create(
        &PostParams::default(),
        &vm(&ns, "other", &[(&network, "02:00:00:00:09:09")]),
    )
    .await
    .unwrap();
    let other = wait_for(&cfgs, "other", "allocated", allocated_ip).await;
    let (_, other_ip, _) = cfg_ips(&other).remove(0);
    assert!(other_ip != vip_ip && other_ip != web_ip);

    // The VM comes: its NIC gets the claim's address, recorded for its MAC.
    vms.create(
        &PostParams::default(),
        &vm(&ns, "web", &[(&network, "02:00:00:00:09:01")]),
    )
    .await
    .unwrap();
    let cfg = wait_for(&cfgs, "web", "allocated the claim's address", |c| {
        allocated_ip(c) && cfg_ips(c).first().map(|e| e.1.clone()) == Some(web_ip.clone())
    })
    .await;
    assert_eq!(cfg_ips(&cfg)[0].0, "02:00:00:00:09:01");
    wait_for(&claims, "web", "bound", |c| {
        claim_phase(c) == Some(ClaimPhase::Bound)
            && c.status.as_ref().unwrap().mac_address.as_deref() == Some("02:00:00:00:09:01")
    })
    .await;
    wait_for(&pools, "pool-c", "recording it for the NIC", |p| {
        recorded_for(p, &web_ip).as_deref() == Some("02:00:00:00:09:01")
    })
    .await;

    // The VM goes: the address stays held (Retain), back under the claim's placeholder.
    vms.delete("web", &DeleteParams::default()).await.unwrap();
    let web = wait_for(&claims, "web", "reserved again", |c| {
        claim_phase(c) == Some(ClaimPhase::Reserved)
    })
    .await;
    let web_placeholder = placeholder_mac(web.metadata.uid.as_deref().unwrap()).to_string();
    wait_for(&pools, "pool-c", "holding it for nobody", |p| {
        recorded_for(p, &web_ip).as_deref() == Some(web_placeholder.as_str())
    })
    .await;
    // A new VM is not given it.
    vms.create(
        &PostParams::default(),
        &vm(&ns, "newcomer", &[(&network, "02:00:00:00:09:05")]),
    )
    .await
    .unwrap();
    let newcomer = wait_for(&cfgs, "newcomer", "allocated", allocated_ip).await;
    let (_, newcomer_ip, _) = cfg_ips(&newcomer).remove(0);
    assert!(newcomer_ip != web_ip && newcomer_ip != vip_ip);

    // The VM is created again with a new MAC: the same address.
    wait_for_gone(&cfgs, "web").await;
    vms.create(
        &PostParams::default(),
        &vm(&ns, "web", &[(&network, "02:00:00:00:09:02")]),
    )
    .await
    .unwrap();
    wait_for(&cfgs, "web", "allocated the claim's address again", |c| {
        allocated_ip(c)
            && cfg_ips(c).first().map(|e| (e.0.clone(), e.1.clone()))
                == Some(("02:00:00:00:09:02".into(), web_ip.clone()))
    })
    .await;

    // Deleting the VIP claim frees its address and its place in the quota: the claim refused
    // for the quota is woken by that write and holds an address now.
    claims
        .delete("vip", &DeleteParams::default())
        .await
        .unwrap();
    wait_for_gone(&claims, "vip").await;
    let third = wait_for(&claims, "third", "reserved once there is room", |c| {
        claim_phase(c) == Some(ClaimPhase::Reserved)
    })
    .await;
    let third_ip = third.status.unwrap().ip_address.unwrap();
    wait_for(&pools, "pool-c", "recording the third claim", |p| {
        recorded_for(p, &third_ip).is_some_and(|m| m.starts_with("06:c1:"))
    })
    .await;
}

/// Waits, bounded, until `name` is gone.
async fn wait_for_gone<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let deadline = Instant::now() + DEADLINE;
    while api.get_opt(name).await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "{name}: never gone");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A claim on a dual-stack pool holds an address of each family (the IPv6 one as asked), both
/// recorded under its placeholder, then for its VM's NIC, whose config shows both. With
/// `reclaimPolicy: Delete` the VM is made the claim's owner, for the garbage collector to delete
/// the claim with it (the cluster suite shows the collector doing it); deleting the claim frees
/// both addresses.
#[tokio::test]
async fn a_dual_stack_claim_holds_both_families_and_a_delete_claim_is_owned_by_its_vm() {
    let (client, ns) = setup("claims6").await;
    create_nad(&client, &ns, "net-c6").await;
    let pool: IPPool = serde_json::from_value(json!({
        "apiVersion": "network.harvesterhci.io/v1alpha1", "kind": "IPPool",
        "metadata": {"name": "dual", "namespace": ns},
        "spec": {"networkName": format!("{ns}/net-c6"),
            "ipv4Config": {"serverIP": "10.79.0.2", "cidr": "10.79.0.0/24", "router": "10.79.0.1",
                "pool": {"start": "10.79.0.10", "end": "10.79.0.20"}},
            "ipv6Config": {"serverIP": "fd00:79::1", "cidr": "fd00:79::/112", "router": "fd00:79::2",
                "pool": {"start": "fd00:79::10", "end": "fd00:79::20"}},
            "claims": {"namespaces": [ns]}}
    }))
    .unwrap();
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    pools.create(&PostParams::default(), &pool).await.unwrap();
    wait_for(&pools, "dual", "ready", ready).await;
    let network = format!("{ns}/net-c6");
    let claims = claim_api(&client, &ns);
    create_claim(
        &client,
        &ns,
        "db",
        json!({"network": network, "vm": "db", "nic": "nic-0",
               "ipv6Address": "fd00:79::15", "reclaimPolicy": "Delete"}),
    )
    .await;
    let held = wait_for(&claims, "db", "reserved", |c| {
        claim_phase(c) == Some(ClaimPhase::Reserved)
    })
    .await;
    let status = held.status.clone().unwrap();
    let (v4, v6) = (status.ip_address.unwrap(), status.ipv6_address.unwrap());
    assert_eq!(v6, "fd00:79::15");
    let placeholder = placeholder_mac(held.metadata.uid.as_deref().unwrap()).to_string();
    wait_for(&pools, "dual", "recording both for nobody", |p| {
        recorded_for(p, &v4).as_deref() == Some(placeholder.as_str())
            && allocated_v6(p).get(&v6) == Some(&placeholder)
    })
    .await;

    let mac = "02:00:00:00:79:01";
    vm_api(&client, &ns)
        .create(&PostParams::default(), &vm(&ns, "db", &[(&network, mac)]))
        .await
        .unwrap();
    let cfgs: Api<VirtualMachineNetworkConfig> = Api::namespaced(client.clone(), &ns);
    wait_for(&cfgs, "db", "allocated the claim's addresses", |c| {
        cfg_condition(c, "Allocated").is_some_and(|a| a.0 == "True")
            && cfg_both(c) == vec![(mac.to_owned(), v4.clone(), v6.clone())]
    })
    .await;
    wait_for(&pools, "dual", "recording both for the NIC", |p| {
        recorded_for(p, &v4).as_deref() == Some(mac)
            && allocated_v6(p).get(&v6).map(String::as_str) == Some(mac)
    })
    .await;
    let vm_uid = vm_api(&client, &ns)
        .get("db")
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let owned = wait_for(&claims, "db", "owned by its VM", |c| {
        c.owner_references()
            .iter()
            .any(|o| o.uid == vm_uid && o.kind == "VirtualMachine")
    })
    .await;
    assert_eq!(claim_phase(&owned), Some(ClaimPhase::Bound));

    // The claim deleted while its VM runs: the NIC keeps the addresses it uses, now as any NIC
    // does (never released in between); the VM deleted, they are free (no claim keeps them).
    claims.delete("db", &DeleteParams::default()).await.unwrap();
    wait_for_gone(&claims, "db").await;
    let kept = pools.get("dual").await.unwrap();
    assert_eq!(recorded_for(&kept, &v4).as_deref(), Some(mac));
    assert_eq!(allocated_v6(&kept).get(&v6).map(String::as_str), Some(mac));
    vm_api(&client, &ns)
        .delete("db", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(&pools, "dual", "freeing both", |p| {
        recorded_for(p, &v4).is_none() && !allocated_v6(p).contains_key(&v6)
    })
    .await;
}
