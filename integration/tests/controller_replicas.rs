//! The `vm-dhcp-controller` binary as real processes against the real kube-apiserver: two
//! replicas with leader election (only the leader writes; killing it hands the work over), and a
//! controller killed in the middle of a burst of VMs (no address is ever handed out twice).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Event;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::{Client, ResourceExt};
use serde_json::json;
use vmdhcp_core::crd::{IPPool, VirtualMachineNetworkConfig, find_condition};
use vmdhcp_integration::control_plane::ControlPlane;
use vmdhcp_integration::ports::free_port;
use vmdhcp_integration::process::Supervised;
use vmdhcp_proto::agent::v1 as pb;
use vmdhcp_proto::agent::v1::config_service_client::ConfigServiceClient;

const DEADLINE: Duration = Duration::from_secs(60);

/// A controller process; killed with SIGKILL when dropped (through its supervisor).
struct Replica {
    process: Supervised,
    http: u16,
    grpc: u16,
}

fn start(cp: &ControlPlane, identity: &str, lease_ns: &str, elect: bool) -> Replica {
    start_with(cp, identity, lease_ns, elect, &[])
}

fn start_with(
    cp: &ControlPlane,
    identity: &str,
    lease_ns: &str,
    elect: bool,
    extra: &[String],
) -> Replica {
    let (http, grpc) = (free_port(), free_port());
    let mut args = vec!["run".to_owned()];
    // The admin's kubeconfig unless `extra` names another (a restricted identity).
    if !extra.iter().any(|e| e.starts_with("--kubeconfig")) {
        args.push(format!("--kubeconfig={}", cp.kubeconfig().display()));
    }
    args.extend([
        format!("--identity={identity}"),
        format!("--grpc-listen=127.0.0.1:{grpc}"),
        format!("--http-listen=127.0.0.1:{http}"),
        format!("--leader-election-namespace={lease_ns}"),
        "--grpc-plaintext".into(),
    ]);
    // Fast elections unless `extra` sets its own timings.
    for timing in [
        "--lease-duration-seconds=3",
        "--renew-deadline-seconds=2",
        "--retry-period-seconds=1",
    ] {
        let flag = timing.split('=').next().unwrap_or(timing);
        if !extra.iter().any(|e| e.starts_with(flag)) {
            args.push(timing.to_owned());
        }
    }
    if !elect {
        args.push("--no-leader-election".into());
    }
    args.extend_from_slice(extra);
    let log = cp.dir().join(format!("controller-{identity}.log"));
    let bin =
        vmdhcp_integration::process::workspace_binary("vmdhcp-controller", "vm-dhcp-controller");
    let process = Supervised::spawn(&bin, &args, &log, None).unwrap();
    Replica {
        process,
        http,
        grpc,
    }
}

impl Replica {
    /// GET `path`: (status, body), or None while nothing listens.
    fn get(&self, path: &str) -> Option<(u16, String)> {
        let raw = vmdhcp_integration::http::get(&format!("127.0.0.1:{}", self.http), path).ok()?;
        let (head, body) = raw.split_once("\r\n\r\n")?;
        let status = head.split(' ').nth(1)?.parse().ok()?;
        Some((status, body.to_owned()))
    }

    fn metric(&self, needle: &str) -> f64 {
        // A replica that does not answer has reconciled nothing this test can see.
        let Some((_, out)) = self.get("/metrics") else {
            return 0.0;
        };
        out.lines()
            .filter(|l| l.starts_with(needle))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

async fn create(client: &Client, ns: &str, manifest: serde_json::Value) {
    let gvk = GroupVersionKind::try_from(&kube::api::TypeMeta {
        api_version: manifest["apiVersion"].as_str().unwrap().into(),
        kind: manifest["kind"].as_str().unwrap().into(),
    })
    .unwrap();
    let plural = match gvk.kind.as_str() {
        "NetworkAttachmentDefinition" => "network-attachment-definitions",
        "IPPool" => "ippools",
        "VirtualMachine" => "virtualmachines",
        other => panic!("{other}"),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(&gvk, plural),
    );
    api.create(
        &PostParams::default(),
        &serde_json::from_value(manifest).unwrap(),
    )
    .await
    .unwrap();
}

async fn network_and_pool(client: &Client, ns: &str, name: &str, octet: u8) {
    create(client, ns, json!({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition", "metadata": {"name": name, "namespace": ns}, "spec": {"config": "{}"}})).await;
    create(client, ns, json!({
        "apiVersion": "network.harvesterhci.io/v1alpha1", "kind": "IPPool", "metadata": {"name": name, "namespace": ns},
        "spec": {"networkName": format!("{ns}/{name}"), "ipv4Config": {"serverIP": format!("10.{octet}.0.1"), "cidr": format!("10.{octet}.0.0/16"), "pool": {"start": format!("10.{octet}.0.2"), "end": format!("10.{octet}.255.254")}}}
    }))
    .await;
}

async fn vm(client: &Client, ns: &str, name: &str, net: &str, mac: &str) {
    create(client, ns, json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": name, "namespace": ns},
        "spec": {"template": {"spec": {"domain": {"devices": {"interfaces": [{"name": "nic", "macAddress": mac, "bridge": {}}]}}, "networks": [{"name": "nic", "multus": {"networkName": net}}]}}}
    }))
    .await;
}

fn pool_ready(p: &IPPool) -> bool {
    p.status.as_ref().is_some_and(|s| {
        find_condition(&s.conditions, "CacheReady").is_some_and(|c| c.status == "True")
    })
}

/// A control plane of its own (controllers watch every namespace), a namespace `ns_prefix-…`,
/// two electing replicas `<replicas>-a` and `<replicas>-b`, and the pool `net` on 10.<octet>/16.
async fn two_replicas(
    ns_prefix: &str,
    replicas: &str,
    net: &str,
    octet: u8,
) -> (ControlPlane, Client, String, Replica, Replica) {
    let cp = ControlPlane::start().unwrap();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, ns_prefix).await.unwrap();
    let a = start(&cp, &format!("{replicas}-a"), &ns, true);
    let b = start(&cp, &format!("{replicas}-b"), &ns, true);
    network_and_pool(&client, &ns, net, octet).await;
    (cp, client, ns, a, b)
}

/// Waits until pool `name` says CacheReady.
async fn wait_pool_ready(pools: &Api<IPPool>, name: &str) -> IPPool {
    poll(&format!("pool {name} ready"), async || {
        pools.get(name).await.ok().filter(pool_ready)
    })
    .await
}

/// A gRPC client of `replica`'s config stream, once it listens.
async fn grpc_client(replica: &Replica) -> ConfigServiceClient<tonic::transport::Channel> {
    let url = format!("http://127.0.0.1:{}", replica.grpc);
    poll("the replica's gRPC port", async || {
        ConfigServiceClient::connect(url.clone()).await.ok()
    })
    .await
}

async fn poll<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Creates a VM with one NIC on `net` and waits until its config says Allocated: (mac, ip).
async fn vm_allocated(
    client: &Client,
    ns: &str,
    name: &str,
    net: &str,
    mac: &str,
    what: &str,
) -> (String, String) {
    vm(client, ns, name, net, mac).await;
    poll(what, async || {
        allocated_configs(client, ns).await.get(name).cloned()
    })
    .await
}

/// Pool `name`'s `status.ipv4.allocated` (address → MAC).
async fn recorded(pools: &Api<IPPool>, name: &str) -> BTreeMap<String, String> {
    pools
        .get(name)
        .await
        .unwrap()
        .status
        .unwrap()
        .ipv4
        .unwrap()
        .allocated
}

/// Who holds the controllers' Lease, if it exists yet.
async fn holder_now(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt("vm-dhcp-controllers")
        .await
        .ok()??
        .spec?
        .holder_identity
}

/// Who holds the controllers' Lease (None once it was released).
async fn lease_holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get("vm-dhcp-controllers")
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity
}

/// (vmnetcfg → (mac, ip)) of every config whose status says Allocated; none when the list
/// fails (a busy API server timing out: the polls that call it look again).
async fn allocated_configs(client: &Client, ns: &str) -> BTreeMap<String, (String, String)> {
    let cfgs: Api<VirtualMachineNetworkConfig> = Api::namespaced(client.clone(), ns);
    let listed = match cfgs.list(&Default::default()).await {
        Ok(listed) => listed,
        Err(_) => return BTreeMap::new(),
    };
    listed
        .items
        .into_iter()
        .filter(|c| {
            c.status.as_ref().is_some_and(|s| {
                find_condition(&s.conditions, "Allocated").is_some_and(|a| a.status == "True")
            })
        })
        .filter_map(|c| {
            let e = c.status.as_ref()?.network_configs.first()?.clone();
            Some((c.name_any(), (e.mac_address?, e.allocated_ip_address?)))
        })
        .collect()
}

#[tokio::test]
async fn only_the_leader_writes_and_killing_it_hands_the_work_over() {
    let (cp, client, ns, a, b) = two_replicas("ha", "replica", "net-ha", 20).await;
    let cp = &cp;
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    wait_pool_ready(&pools, "net-ha").await;
    vm_allocated(
        &client,
        &ns,
        "vm-before",
        "net-ha",
        "02:00:00:14:00:01",
        "first VM allocated",
    )
    .await;

    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let holder = lease_holder(&leases).await.unwrap();
    let (leader, follower) = if holder == "replica-a" {
        (a, b)
    } else {
        (b, a)
    };
    let metric = "vmdhcpcontroller_reconciles_total{controller=\"ippool\"";
    assert!(leader.metric(metric) > 0.0, "the leader reconciled nothing");
    assert_eq!(
        follower.metric(metric),
        0.0,
        "the follower reconciled (wrote) while not leading"
    );

    // Kill -9 the leader; work arriving afterwards is done by the other replica.
    drop(leader);
    let (_, ip) = vm_allocated(
        &client,
        &ns,
        "vm-after",
        "net-ha",
        "02:00:00:14:00:02",
        "second VM allocated by the new leader",
    )
    .await;
    assert_eq!(ip, "10.20.0.3");
    let holder_now = lease_holder(&leases).await.unwrap();
    let logs = |id: &str| {
        std::fs::read_to_string(cp.dir().join(format!("controller-{id}.log"))).unwrap_or_default()
    };
    assert_ne!(
        holder_now,
        holder,
        "the Lease did not move:\n{}\n{}",
        logs("replica-a"),
        logs("replica-b")
    );
    assert!(follower.metric(metric) > 0.0);

    // SIGTERM the new leader with a third replica waiting: it stops writing and releases the
    // Lease before it exits (without the release the Lease would name it for 3 more seconds).
    let third = start(cp, "replica-c", &ns, true);
    poll("the third replica up", async || third.get("/healthz")).await;
    assert!(follower.process.signal("TERM"));
    poll("the leader to exit", async || {
        follower.process.exited().then_some(())
    })
    .await;
    let after_exit = lease_holder(&leases).await.unwrap_or_default();
    assert_ne!(
        after_exit, holder_now,
        "the Lease was not released on SIGTERM"
    );
    vm_allocated(
        &client,
        &ns,
        "vm-third",
        "net-ha",
        "02:00:00:14:00:03",
        "third VM allocated by the third replica",
    )
    .await;
    assert!(third.metric(metric) > 0.0);
    drop(follower);
}

#[tokio::test]
async fn missing_agent_deployment_is_reported_and_an_unchanged_bootstrap_writes_nothing() {
    let cp = &ControlPlane::start().unwrap();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "boot").await.unwrap();
    let replica = start_with(
        cp,
        "boot-1",
        &ns,
        false,
        &[
            format!("--agent-deployment={ns}/vm-dhcp-agent"),
            "--enable-cache-dump-api".into(),
        ],
    );
    network_and_pool(&client, &ns, "net-boot", 30).await;
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);

    // No Deployment yet: a condition on the pool and a Warning event, not just a log line.
    poll("AgentReady=False AgentDeploymentNotFound", async || {
        let pool = pools.get("net-boot").await.ok()?;
        let c = find_condition(&pool.status?.conditions, "AgentReady")?.clone();
        (c.status == "False" && c.reason.as_deref() == Some("AgentDeploymentNotFound"))
            .then_some(())
    })
    .await;
    warning_on(&client, &ns, "net-boot", "AgentDeploymentNotFound").await;

    // The Deployment appears: the bootstrap is written once.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    deployments
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "vm-dhcp-agent", "namespace": ns},
                "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": {
                    "metadata": {"labels": {"app": "agent"}},
                    "spec": {"containers": [{"name": "agent", "image": "vmdhcp/agent:test"}]}
                }}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let written = poll("the bootstrap written", async || {
        let d = deployments.get("vm-dhcp-agent").await.ok()?;
        let annotated = d
            .spec
            .as_ref()?
            .template
            .metadata
            .as_ref()?
            .annotations
            .as_ref()?
            .get("k8s.v1.cni.cncf.io/networks")?
            .contains(&format!("{ns}/net-boot@"));
        annotated.then_some(d)
    })
    .await;
    // The Deployment is back: the condition says so at once (no agent runs here), not at the
    // pool's next periodic reconcile.
    poll("AgentReady=False NoAgentReport", async || {
        let pool = pools.get("net-boot").await.ok()?;
        let c = find_condition(&pool.status?.conditions, "AgentReady")?.clone();
        (c.reason.as_deref() == Some("NoAgentReport")).then_some(())
    })
    .await;
    let checks = |result: &str| {
        replica.metric(&format!(
            "vmdhcpcontroller_agent_bootstrap_checks_total{{result=\"{result}\"}}"
        ))
    };
    // The counter moves once the patch has returned, which can be after the watch above shows
    // the patched Deployment.
    poll("the write counted", async || {
        (checks("written") >= 1.0).then_some(())
    })
    .await;
    assert_eq!(checks("written"), 1.0);
    let unchanged_before = checks("unchanged");

    // Allocations change leases, not the set of pools: the bootstrap is not written (nor even
    // looked at: it wakes on pool changes only). A change to the Deployment that leaves the
    // bootstrap alone is checked and not written either.
    let (_, ip) = vm_allocated(
        &client,
        &ns,
        "vm-boot",
        "net-boot",
        "02:00:00:1e:00:01",
        "VM allocated",
    )
    .await;
    deployments
        .patch(
            "vm-dhcp-agent",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"touched": "by-the-test"}}})),
        )
        .await
        .unwrap();
    poll(
        "a bootstrap check after the Deployment changed",
        async || (checks("unchanged") > unchanged_before).then_some(()),
    )
    .await;
    let now = deployments.get("vm-dhcp-agent").await.unwrap();
    assert_eq!(
        now.metadata.generation, written.metadata.generation,
        "an unchanged bootstrap was written"
    );
    assert_eq!(checks("written"), 1.0);

    // The debug endpoints (behind --enable-cache-dump-api) show the allocation.
    let (status, ipams) = replica.get(&format!("/ipams/{ns}/net-boot")).unwrap();
    assert_eq!(status, 200, "{ipams}");
    assert!(
        ipams.contains(&ip) && ipams.contains("02:00:00:1e:00:01"),
        "{ipams}"
    );
    let (status, caches) = replica.get(&format!("/caches/{ns}/net-boot")).unwrap();
    assert_eq!(status, 200, "{caches}");
    let caches: BTreeMap<String, String> = serde_json::from_str(&caches).unwrap();
    assert_eq!(caches.get("02:00:00:1e:00:01"), Some(&ip), "{caches:?}");
    let (status, _) = replica.get(&format!("/caches/{ns}/no-such-pool")).unwrap();
    assert_eq!(status, 404);
}

#[tokio::test]
async fn a_controller_killed_mid_burst_never_hands_out_an_address_twice() {
    let cp = &ControlPlane::start().unwrap();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "restart").await.unwrap();
    network_and_pool(&client, &ns, "net-r1", 21).await;
    network_and_pool(&client, &ns, "net-r2", 22).await;
    let first = start(cp, "restart-1", &ns, false);
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    for p in ["net-r1", "net-r2"] {
        wait_pool_ready(&pools, p).await;
    }
    let n = 500u32;
    let creates = (0..n).map(|i| {
        let (client, ns) = (client.clone(), ns.clone());
        async move {
            vm(
                &client,
                &ns,
                &format!("vm-{i}"),
                if i % 2 == 0 { "net-r1" } else { "net-r2" },
                &format!("02:00:00:15:{:02x}:{:02x}", i / 256, i % 256),
            )
            .await
        }
    });
    futures_util::future::join_all(creates).await;
    // Kill it once some, but not all, are done.
    poll("a quarter allocated", async || {
        (allocated_configs(&client, &ns).await.len() >= (n / 4) as usize).then_some(())
    })
    .await;
    drop(first);
    let _second = start(cp, "restart-2", &ns, false);
    let done = poll("all allocated after the restart", async || {
        let done = allocated_configs(&client, &ns).await;
        (done.len() == n as usize).then_some(done)
    })
    .await;
    let ips: BTreeSet<&String> = done.values().map(|(_, ip)| ip).collect();
    assert_eq!(ips.len(), n as usize, "an address was handed out twice");
    for p in ["net-r1", "net-r2"] {
        let pool = pools.get(p).await.unwrap();
        let allocated = pool.status.unwrap().ipv4.unwrap().allocated;
        let macs: Vec<&String> = allocated
            .values()
            .filter(|v| v.starts_with("02:"))
            .collect();
        assert_eq!(macs.len(), (n / 2) as usize, "{p}: {macs:?}");
        assert_eq!(
            macs.iter().collect::<BTreeSet<_>>().len(),
            macs.len(),
            "{p}: a MAC recorded twice"
        );
    }
    for (name, (mac, ip)) in &done {
        let pool = if name.trim_start_matches("vm-").parse::<u32>().unwrap() % 2 == 0 {
            "net-r1"
        } else {
            "net-r2"
        };
        let allocated = recorded(&pools, pool).await;
        assert_eq!(
            allocated.get(ip),
            Some(mac),
            "{name}: status disagrees with {pool}"
        );
    }
}

/// The highest resourceVersion among the objects of `ns` the controller writes (IPPools and
/// VirtualMachineNetworkConfigs). One etcd: resourceVersions are its global revision, so they
/// order writes across kinds.
async fn last_controller_write(client: &Client, ns: &str) -> u64 {
    let rv = |o: &kube::api::ObjectMeta| {
        o.resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let pools: Api<IPPool> = Api::namespaced(client.clone(), ns);
    let cfgs: Api<VirtualMachineNetworkConfig> = Api::namespaced(client.clone(), ns);
    let p = pools.list(&Default::default()).await.unwrap().items;
    let c = cfgs.list(&Default::default()).await.unwrap().items;
    p.iter()
        .map(|o| rv(&o.metadata))
        .chain(c.iter().map(|o| rv(&o.metadata)))
        .max()
        .unwrap_or(0)
}

#[tokio::test]
async fn sigterm_mid_burst_releases_the_lease_only_after_the_last_write() {
    let cp = &ControlPlane::start().unwrap();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "drain").await.unwrap();
    network_and_pool(&client, &ns, "net-d", 23).await;
    // Slower elections than the other tests: this one is about SIGTERM, and a burst on a loaded
    // 2-core machine can hold a short renewal past its deadline, deposing the replica (its
    // writes cut, correctly) before the signal, with nothing left to drain (docs/tuning.md).
    let timings = [
        "--lease-duration-seconds=15",
        "--renew-deadline-seconds=10",
        "--retry-period-seconds=2",
    ]
    .map(str::to_owned);
    let leader = start_with(cp, "drain-1", &ns, true, &timings);
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    wait_pool_ready(&pools, "net-d").await;
    let n = 300u32;
    let creates = (0..n).map(|i| {
        let (client, ns) = (client.clone(), ns.clone());
        async move {
            let mac = format!("02:00:00:17:{:02x}:{:02x}", i / 256, i % 256);
            vm(&client, &ns, &format!("vm-{i}"), "net-d", &mac).await
        }
    });
    futures_util::future::join_all(creates).await;
    poll("some allocated", async || {
        (allocated_configs(&client, &ns).await.len() >= 30).then_some(())
    })
    .await;
    // SIGTERM in the middle of the burst: reconciles are in flight.
    assert!(leader.process.signal("TERM"));
    poll("the controller to exit", async || {
        leader.process.exited().then_some(())
    })
    .await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let lease = leases.get("vm-dhcp-controllers").await.unwrap();
    assert_ne!(
        lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref()),
        Some("drain-1"),
        "the Lease was not released\n{}",
        leader.process.log_tail(60)
    );
    let released_at: u64 = lease
        .metadata
        .resource_version
        .as_deref()
        .unwrap()
        .parse()
        .unwrap();
    let last_write = last_controller_write(&client, &ns).await;
    let log = leader.process.log_tail(400);
    assert!(
        last_write < released_at,
        "a write (revision {last_write}) landed after the Lease was released (revision \
         {released_at}): a successor could have been writing already\n{log}"
    );
    assert!(
        !log.contains("leadership lost"),
        "deposed before the SIGTERM: nothing left to drain, the test shows nothing\n{log}"
    );
    assert!(
        log.contains("their writes are finished"),
        "the reconcilers were not drained before the release:\n{log}"
    );
}

#[tokio::test]
async fn a_deposed_leader_stops_exporting_per_object_series() {
    let (_cp, client, ns, a, b) = two_replicas("deposed", "deposed", "net-dp", 24).await;
    vm_allocated(
        &client,
        &ns,
        "vm-1",
        "net-dp",
        "02:00:00:18:00:01",
        "a VM allocated",
    )
    .await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let holder = lease_holder(&leases).await.unwrap();
    let (old, new, successor) = if holder == "deposed-a" {
        (a, b, "deposed-b")
    } else {
        (b, a, "deposed-a")
    };
    let series = [
        "vmdhcpcontroller_ippool_used{",
        "vmdhcpcontroller_vmnetcfg_status{",
    ];
    poll("the leader exports per-object series", async || {
        series
            .iter()
            .all(|s| old.get("/metrics").is_some_and(|(_, m)| m.contains(s)))
            .then_some(())
    })
    .await;
    // Freeze the leader past its Lease (as a long GC pause or a partition would): the other
    // replica takes over; thawed, the old one finds itself deposed.
    assert!(old.process.signal("STOP"));
    poll("the other replica to take the Lease", async || {
        (lease_holder(&leases).await.as_deref() == Some(successor)).then_some(())
    })
    .await;
    assert!(old.process.signal("CONT"));
    poll("the new leader exports the series", async || {
        series
            .iter()
            .all(|s| new.get("/metrics").is_some_and(|(_, m)| m.contains(s)))
            .then_some(())
    })
    .await;
    let text = poll("the deposed replica to stop exporting them", async || {
        let (_, text) = old.get("/metrics")?;
        (text.contains("vmdhcpcontroller_leader 0") && !series.iter().any(|s| text.contains(s)))
            .then_some(text)
    })
    .await;
    assert!(
        text.contains("vmdhcpcontroller_reconciles_total"),
        "counters stay: {text}"
    );
}

/// An agent's report of serving `pool` on `interface`, as `vm-dhcp-agent` sends it.
fn serving_report(ns: &str, pod: &str, pool: &str) -> pb::ReportRequest {
    pb::ReportRequest {
        agent: Some(pb::AgentIdentity {
            pod_name: pod.into(),
            namespace: ns.into(),
            node_name: "node-1".into(),
        }),
        epoch: String::new(),
        applied_revision: 0,
        leader: true,
        interfaces: vec![pb::InterfaceReport {
            pool_ref: pool.into(),
            interface_name: "vmd0000000001".into(),
            state: pb::InterfaceState::Serving as i32,
            error: String::new(),
            lease_count: 0,
            probes: vec![],
            suspects: vec![],
        }],
    }
}

#[tokio::test]
async fn agent_ready_holds_whichever_replica_the_agent_reports_to() {
    let (cp, client, ns, a, b) = two_replicas("ready", "ready", "net-ar", 25).await;
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    wait_pool_ready(&pools, "net-ar").await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let holder = lease_holder(&leases).await.unwrap();
    let follower = if holder == "ready-a" { &b } else { &a };

    // The agent's stream and reports landed on the follower (one Service, two replicas).
    let mut grpc = grpc_client(follower).await;
    let pool_ref = format!("{ns}/net-ar");
    grpc.report(serving_report(&ns, "agent-x", &pool_ref))
        .await
        .unwrap();
    let pool = poll("AgentReady=True, written by the leader", async || {
        pools.get("net-ar").await.ok().filter(|p| {
            p.status.as_ref().is_some_and(|s| {
                find_condition(&s.conditions, "AgentReady").is_some_and(|c| c.status == "True")
            })
        })
    })
    .await;
    let status = pool.status.unwrap();
    let ready = find_condition(&status.conditions, "AgentReady").unwrap();
    assert!(
        ready
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("agent-x"),
        "{ready:?}"
    );
    // The report is shared through one ConfigMap beside the controllers' Lease, one key per agent.
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), &ns);
    let shared = cms.get("vm-dhcp-controllers-agent-reports").await.unwrap();
    assert!(
        shared
            .data
            .unwrap_or_default()
            .contains_key(&format!("{ns}.agent-x")),
        "the report is not in the shared ConfigMap"
    );

    // What moves with every allocation (the applied revision, lease counts) is not news: such
    // reports are not written to the ConfigMap until its refresh, while a change a pool reads
    // is, at once. Reports are published in order, so once the changed one shows, every
    // earlier one was handled.
    let stored_revision = async || {
        let cm = cms.get("vm-dhcp-controllers-agent-reports").await.ok()?;
        let entry = cm.data?.remove(&format!("{ns}.agent-x"))?;
        serde_json::from_str::<serde_json::Value>(&entry).ok()?["revision"].as_u64()
    };
    let patches = || cp.requests_of("PATCH", "configmaps").unwrap();
    let before = patches();
    for n in 1..=5 {
        let mut moved = serving_report(&ns, "agent-x", &pool_ref);
        moved.applied_revision = n;
        moved.interfaces[0].lease_count = u32::try_from(n).unwrap();
        grpc.report(moved).await.unwrap();
    }
    let mut failed = serving_report(&ns, "agent-x", &pool_ref);
    failed.applied_revision = 6;
    failed.interfaces[0].state = pb::InterfaceState::Error as i32;
    failed.interfaces[0].error = "socket failed".into();
    grpc.report(failed).await.unwrap();
    poll("the changed report in the ConfigMap", async || {
        (stored_revision().await == Some(6)).then_some(())
    })
    .await;
    let written = patches() - before;
    // 1: the changed report; 2 if the first report's 30 s refresh fell due meanwhile.
    assert!(
        (1.0..=2.0).contains(&written),
        "{written} ConfigMap writes for five reports that moved only their counts and one change"
    );

    // Bad input is refused with the reason, and keeps nothing.
    let mut bad = serving_report(&ns, "Not_A_Pod", &pool_ref);
    let refused = grpc.report(bad.clone()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("Not_A_Pod"), "{refused:?}");
    bad.agent = None;
    let refused = grpc.report(bad).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
}

#[tokio::test]
async fn upstream_agent_pods_are_retired_only_once_our_agent_serves() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Patch, PatchParams};
    let cp = &ControlPlane::start().unwrap();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "upgrade").await.unwrap();
    // What upstream's Go controller leaves behind: pools with allocations and an agentPodRef,
    // and its bare agent pod per pool, still answering DHCP.
    network_and_pool(&client, &ns, "net-up", 26).await;
    network_and_pool(&client, &ns, "net-other", 27).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod = |name: &str, labels: serde_json::Value| -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"containers": [{"name": "agent", "image": "rancher/harvester-vm-dhcp-agent:v0.3.3"}]}
        }))
        .unwrap()
    };
    let agent_name = format!("{ns}-net-up-agent");
    let agent = pods
        .create(
            &PostParams::default(),
            &pod(
                &agent_name,
                json!({"network.harvesterhci.io/vm-dhcp-controller": "agent",
                       "network.harvesterhci.io/ippool-namespace": ns,
                       "network.harvesterhci.io/ippool-name": "net-up"}),
            ),
        )
        .await
        .unwrap();
    // Another pool's reference names a pod that is not upstream's agent: it must survive.
    let bystander = pods
        .create(&PostParams::default(), &pod("web-0", json!({"app": "web"})))
        .await
        .unwrap();
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    let go_status = |pod: &Pod, allocated: serde_json::Value| {
        json!({"status": {
            "ipv4": {"allocated": allocated, "used": 1, "available": 65532},
            "agentPodRef": {"namespace": ns, "name": pod.name_any(),
                            "image": "rancher/harvester-vm-dhcp-agent:v0.3.3", "uid": pod.uid().unwrap()},
            "conditions": [{"type": "AgentReady", "status": "True"}]
        }})
    };
    pools
        .patch_status(
            "net-up",
            &PatchParams::default(),
            &Patch::Merge(go_status(
                &agent,
                json!({"10.26.0.5": "02:00:00:1a:00:05", "10.26.0.1": "RESERVED"}),
            )),
        )
        .await
        .unwrap();
    pools
        .patch_status(
            "net-other",
            &PatchParams::default(),
            &Patch::Merge(go_status(
                &bystander,
                json!({"10.27.0.9": "02:00:00:1b:00:09"}),
            )),
        )
        .await
        .unwrap();

    let controller = start(cp, "upgrade-1", &ns, false);
    let pool_ref_set = |p: &IPPool| p.status.as_ref().and_then(|s| s.agent_pod_ref.clone());
    let pool = wait_pool_ready(&pools, "net-up").await;
    // No agent of ours serves yet: upstream's keeps answering (no gap).
    assert!(
        pool_ref_set(&pool).is_some(),
        "agentPodRef cleared too early"
    );
    assert!(
        pods.get_opt(&agent_name).await.unwrap().is_some(),
        "upstream agent deleted before ours serves"
    );

    // Our agent reports both pools served.
    let mut grpc = grpc_client(&controller).await;
    let mut report = serving_report(&ns, "agent-0", &format!("{ns}/net-up"));
    let mut other = report.interfaces[0].clone();
    other.pool_ref = format!("{ns}/net-other");
    report.interfaces.push(other);
    grpc.report(report).await.unwrap();

    poll("upstream's agent retired", async || {
        let gone = pods.get_opt(&agent_name).await.unwrap().is_none();
        let cleared = pools
            .get("net-up")
            .await
            .ok()
            .is_some_and(|p| pool_ref_set(&p).is_none());
        (gone && cleared).then_some(())
    })
    .await;
    poll("the other pool's stale reference cleared", async || {
        pools
            .get("net-other")
            .await
            .ok()
            .filter(|p| pool_ref_set(p).is_none())
    })
    .await;
    assert!(
        pods.get_opt("web-0").await.unwrap().is_some(),
        "a pod that is not upstream's agent was deleted"
    );
    // Every allocation the Go controller recorded is kept.
    for (pool, ip, mac) in [
        ("net-up", "10.26.0.5", "02:00:00:1a:00:05"),
        ("net-other", "10.27.0.9", "02:00:00:1b:00:09"),
    ] {
        let allocated = recorded(&pools, pool).await;
        assert_eq!(
            allocated.get(ip).map(String::as_str),
            Some(mac),
            "{pool}: {allocated:?}"
        );
    }
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let reasons = poll("the events", async || {
        let reasons: BTreeSet<String> = events
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .filter_map(|e| e.reason)
            .collect();
        (reasons.contains("UpstreamAgentRetired")
            && reasons.contains("AgentPodRefNotUpstreamAgent"))
        .then_some(reasons)
    })
    .await;
    assert!(!reasons.is_empty());
}

/// Writes `n` allocations into pool `name`'s status the way upstream's Go controller does (the
/// address → MAC entry, `used` counted), each on the lowest address free in the version it read
/// (the one the controller is about to give next, too), retrying on a conflict as any writer
/// with optimistic concurrency does. Returns what it recorded.
async fn foreign_writer(
    client: Client,
    ns: String,
    name: &str,
    octet: u8,
    n: u32,
) -> BTreeMap<String, String> {
    let pools: Api<IPPool> = Api::namespaced(client, &ns);
    let mut written = BTreeMap::new();
    while written.len() < n as usize {
        let mut pool = pools.get_status(name).await.unwrap();
        let status = pool.status.get_or_insert_default();
        let v4 = status.ipv4.get_or_insert_default();
        let Some(ip) = (2u32..65_000)
            .map(|k| format!("10.{octet}.{}.{}", k / 256, k % 256))
            .find(|a| !v4.allocated.contains_key(a))
        else {
            panic!("pool {name} full");
        };
        let mac = format!("02:00:00:ee:00:{:02x}", written.len());
        v4.allocated.insert(ip.clone(), mac.clone());
        v4.used += 1;
        v4.available -= 1;
        match pools
            .replace_status(name, &PostParams::default(), &pool)
            .await
        {
            Ok(_) => {
                written.insert(ip, mac);
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("foreign write: {e}"),
        }
    }
    written
}

/// Every config's address and every foreign entry are recorded in `pool`, each for its own MAC,
/// and no address or MAC is recorded twice.
async fn assert_all_recorded(
    pools: &Api<IPPool>,
    pool: &str,
    configs: &BTreeMap<String, (String, String)>,
    foreign: &BTreeMap<String, String>,
) {
    let allocated = recorded(pools, pool).await;
    for (ip, mac) in foreign {
        assert_eq!(allocated.get(ip), Some(mac), "foreign entry {ip} lost");
    }
    for (name, (mac, ip)) in configs {
        assert_eq!(
            allocated.get(ip),
            Some(mac),
            "{name}: {ip} is not recorded for its MAC"
        );
        assert!(!foreign.contains_key(ip), "{name}: {ip} held by two MACs");
    }
    let macs: Vec<&String> = allocated
        .values()
        .filter(|v| v.starts_with("02:"))
        .collect();
    let unique: BTreeSet<&&String> = macs.iter().collect();
    assert_eq!(unique.len(), macs.len(), "a MAC recorded twice");
    let ips: BTreeSet<&String> = configs.values().map(|(_, ip)| ip).collect();
    assert_eq!(ips.len(), configs.len(), "an address given twice");
}

/// A second writer (upstream's controller during a migration, a second release, a hand edit)
/// records allocations on a pool while the controller allocates a burst on it: the controller's
/// status writes keep every entry they did not make, and where both sides took one address the
/// first recorded keeps it.
#[tokio::test]
async fn a_second_writers_allocations_survive_a_burst_and_no_address_is_held_twice() {
    let cp = &ControlPlane::start().unwrap();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "foreign").await.unwrap();
    network_and_pool(&client, &ns, "net-fw", 23).await;
    let controller = start(cp, "foreign-1", &ns, false);
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    wait_pool_ready(&pools, "net-fw").await;
    let n = 150u32;
    let creates = (0..n).map(|i| {
        let (client, ns) = (client.clone(), ns.clone());
        async move {
            let mac = format!("02:00:00:17:{:02x}:{:02x}", i / 256, i % 256);
            vm(&client, &ns, &format!("vm-{i}"), "net-fw", &mac).await
        }
    });
    let writer = foreign_writer(client.clone(), ns.clone(), "net-fw", 23, 40);
    let ((), foreign) = tokio::join!(
        async {
            futures_util::future::join_all(creates).await;
        },
        writer
    );
    let configs = poll("every VM allocated", async || {
        let done = allocated_configs(&client, &ns).await;
        (done.len() == n as usize).then_some(done)
    })
    .await;
    assert_all_recorded(&pools, "net-fw", &configs, &foreign).await;
    let kept = |outcome: &str| {
        controller.metric(&format!(
            "vmdhcpcontroller_foreign_allocations_total{{ippool=\"{ns}/net-fw\",result=\"{outcome}\"}}"
        ))
    };
    println!(
        "second writer: {} entries, all kept; the controller adopted {} and withdrew {} of its own unrecorded ones",
        foreign.len(),
        kept("adopted"),
        kept("withdrew_ours")
    );
    // Each entry of the other writer was taken into the books once, at the first write that
    // met it: adopted, or, where both sides took one address, kept for the other writer with
    // ours withdrawn. It only writes addresses free in what it read, so it never overwrites an
    // entry of ours (kept_ours) and always writes an address of the range (verbatim).
    assert_eq!(
        kept("adopted") + kept("withdrew_ours"),
        foreign.len() as f64,
        "every foreign entry accounted for once"
    );
    assert!(
        kept("adopted") > 0.0,
        "no entry was adopted: the writers never interleaved"
    );
    assert_eq!(kept("kept_ours"), 0.0);
    assert_eq!(kept("verbatim"), 0.0);
}

/// A new leader whose caches trail the last term's final writes (it was stopped while the old
/// leader allocated, and resumed once the old leader's Lease had run out) builds its books from
/// a read of record: the API server's audit log shows a quorum LIST of the pools (no
/// resourceVersion) after the takeover and before its first pool status write, and nothing the
/// old leader recorded is lost or handed out again.
#[tokio::test]
async fn a_takeover_with_a_trailing_cache_builds_its_books_from_a_read_of_record() {
    let audit = tempfile::Builder::new()
        .prefix("vmdhcp-audit-")
        .tempdir()
        .unwrap()
        .keep()
        .join("audit.log");
    let cp = &ControlPlane::start_with_audit(Some(audit.clone())).unwrap();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "record").await.unwrap();
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let a = start_leading(cp, "record-a", &ns, &leases).await;
    let b = start(cp, "record-b", &ns, true);
    network_and_pool(&client, &ns, "net-rec", 24).await;
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    wait_pool_ready(&pools, "net-rec").await;
    // b's caches hold the pool; now they stop following.
    stop_following(&b, "record-b").await;
    let n = 60u32;
    for i in 0..n {
        let mac = format!("02:00:00:18:00:{i:02x}");
        vm(&client, &ns, &format!("vm-{i}"), "net-rec", &mac).await;
    }
    let before = poll("the burst allocated by record-a", async || {
        let done = allocated_configs(&client, &ns).await;
        (done.len() == n as usize).then_some(done)
    })
    .await;
    drop(a);
    let mark = take_over_when_the_lease_runs_out(&leases, &b, "record-b", || {
        std::fs::read_to_string(&audit).unwrap().lines().count()
    })
    .await;
    for i in n..n + 20 {
        let mac = format!("02:00:00:18:00:{i:02x}");
        vm(&client, &ns, &format!("vm-{i}"), "net-rec", &mac).await;
    }
    let after = poll("the VMs after the takeover allocated", async || {
        let done = allocated_configs(&client, &ns).await;
        (done.len() == (n + 20) as usize).then_some(done)
    })
    .await;
    for (name, held) in &before {
        assert_eq!(after.get(name), Some(held), "{name} moved or lost");
    }
    assert_all_recorded(&pools, "net-rec", &after, &BTreeMap::new()).await;

    // The audit log after the resume: only record-b's requests carry the controller's agent.
    let log = std::fs::read_to_string(&audit).unwrap();
    let ours: Vec<serde_json::Value> = log
        .lines()
        .skip(mark)
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| {
            e["userAgent"]
                .as_str()
                .is_some_and(|a| a.starts_with("vm-dhcp-controller/"))
        })
        .collect();
    let is = |e: &serde_json::Value, verb: &str, sub: Option<&str>| {
        e["verb"] == verb
            && e["objectRef"]["resource"] == "ippools"
            && e["objectRef"]["subresource"].as_str() == sub
    };
    let first_write = ours
        .iter()
        .position(|e| is(e, "update", Some("status")) || is(e, "patch", Some("status")))
        .expect("record-b wrote no pool status");
    let quorum_list = ours[..first_write].iter().position(|e| {
        is(e, "list", None)
            && !e["requestURI"]
                .as_str()
                .unwrap_or_default()
                .contains("resourceVersion=")
    });
    if let Some(at) = quorum_list {
        println!(
            "the new leader's requests before its first pool status write: {} (quorum LIST {} at #{at})",
            first_write, ours[at]["requestURI"]
        );
    }
    assert!(
        quorum_list.is_some(),
        "no quorum LIST of the pools before the new leader's first status write; its requests: {:#?}",
        ours[..=first_write]
            .iter()
            .map(|e| format!("{} {}", e["verb"], e["requestURI"]))
            .collect::<Vec<_>>()
    );
}

/// Starts replica `identity` electing in `ns` and waits until it holds the Lease.
async fn start_leading(
    cp: &ControlPlane,
    identity: &str,
    ns: &str,
    leases: &Api<Lease>,
) -> Replica {
    let replica = start(cp, identity, ns, true);
    poll(&format!("{identity} leads"), async || {
        (holder_now(leases).await.as_deref() == Some(identity)).then_some(())
    })
    .await;
    replica
}

/// Waits until `follower` (not leading) has its caches filled, then stops it (SIGSTOP): its
/// caches no longer follow what the leader writes.
async fn stop_following(follower: &Replica, identity: &str) {
    poll(&format!("{identity}'s caches filled"), async || {
        let ready = follower.get("/readyz").is_some_and(|(code, _)| code == 200);
        (ready && follower.metric("vmdhcpcontroller_leader") == 0.0).then_some(())
    })
    .await;
    assert!(follower.process.signal("STOP"));
}

/// The KubeVirt VirtualMachines of `ns`.
fn vm_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachine"),
            "virtualmachines",
        ),
    )
}

/// Resumes `follower` (stopped, its caches trailing) once the leader it followed is gone and
/// its Lease has run out, so that it takes over at once, with the last term's watch events still
/// queued behind its election; returns once it leads. `mark` runs just before the resume.
async fn take_over_when_the_lease_runs_out<T>(
    leases: &Api<Lease>,
    follower: &Replica,
    identity: &str,
    mark: impl FnOnce() -> T,
) -> T {
    poll("the old leader's Lease expired", async || {
        let lease = leases.get("vm-dhcp-controllers").await.ok()?.spec?;
        let renewed = lease.renew_time?.0;
        let duration = i64::from(lease.lease_duration_seconds?);
        let age = k8s_openapi::jiff::Timestamp::now().as_second() - renewed.as_second();
        (age > duration + 1).then_some(())
    })
    .await;
    let marked = mark();
    assert!(follower.process.signal("CONT"));
    poll(&format!("{identity} leads"), async || {
        (holder_now(leases).await.as_deref() == Some(identity)).then_some(())
    })
    .await;
    marked
}

/// A new leader whose caches trail the last term's releases (stopped while the old leader
/// released VMs, resumed once its Lease had run out) does not take the released entries its
/// cache still shows for another writer's and keep them: its first write starts from the
/// version of record its books were built from. The released MACs stay released, and `used`
/// counts the live configs.
#[tokio::test]
async fn a_takeover_with_a_trailing_cache_keeps_the_last_terms_releases() {
    let cp = &ControlPlane::start().unwrap();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "released").await.unwrap();
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let a = start_leading(cp, "released-a", &ns, &leases).await;
    network_and_pool(&client, &ns, "net-rel", 28).await;
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    wait_pool_ready(&pools, "net-rel").await;
    let n = 40u32;
    for i in 0..n {
        let mac = format!("02:00:00:1c:00:{i:02x}");
        vm(&client, &ns, &format!("vm-{i}"), "net-rel", &mac).await;
    }
    poll("the VMs allocated", async || {
        (allocated_configs(&client, &ns).await.len() == n as usize).then_some(())
    })
    .await;
    // b's first lists hold every allocation; then it stops following.
    let b = start(cp, "released-b", &ns, true);
    stop_following(&b, "released-b").await;
    let vms = vm_api(&client, &ns);
    for i in 0..n / 2 {
        vms.delete(&format!("vm-{i}"), &Default::default())
            .await
            .unwrap();
    }
    let macs_recorded = |allocated: BTreeMap<String, String>| -> BTreeSet<String> {
        allocated
            .into_values()
            .filter(|v| v.starts_with("02:"))
            .collect()
    };
    poll("the old leader recorded the releases", async || {
        (macs_recorded(recorded(&pools, "net-rel").await).len() == (n / 2) as usize).then_some(())
    })
    .await;
    drop(a);
    take_over_when_the_lease_runs_out(&leases, &b, "released-b", || ()).await;
    // The new leader writes the pool (its reconcile, and allocations).
    for i in n..n + 5 {
        let mac = format!("02:00:00:1c:00:{i:02x}");
        vm(&client, &ns, &format!("vm-{i}"), "net-rel", &mac).await;
    }
    let live = poll("the VMs after the takeover allocated", async || {
        let done = allocated_configs(&client, &ns).await;
        (done.len() == (n / 2 + 5) as usize).then_some(done)
    })
    .await;
    let live_macs: BTreeSet<String> = live.values().map(|(mac, _)| mac.clone()).collect();
    let macs = macs_recorded(recorded(&pools, "net-rel").await);
    assert_eq!(
        macs.difference(&live_macs).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "released MACs recorded again"
    );
    assert_all_recorded(&pools, "net-rel", &live, &BTreeMap::new()).await;
    let used = pools
        .get("net-rel")
        .await
        .unwrap()
        .status
        .unwrap()
        .ipv4
        .unwrap()
        .used;
    assert_eq!(used, i64::from(n / 2 + 5), "used counts a released entry");
}

/// Applies `manifest` (any kind kubectl knows) as the admin.
fn kubectl_apply(cp: &ControlPlane, manifest: &serde_json::Value) {
    cp.kubectl_stdin(&["apply", "-f", "-"], &manifest.to_string())
        .unwrap();
}

/// A ServiceAccount `controller` in `ns` with every permission the controller uses except
/// writing configs' status, and a kubeconfig acting as it. Binding the ClusterRole
/// `<ns>-config-status` to it (see [`allow_config_status`]) restores that.
fn controller_denied_config_status(cp: &ControlPlane, ns: &str) -> std::path::PathBuf {
    let all = |groups: &[&str], resources: &[&str]| json!({"apiGroups": groups, "resources": resources, "verbs": ["*"]});
    kubectl_apply(
        cp,
        &json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "controller", "namespace": ns}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": format!("{ns}-controller")},
             "rules": [
                all(&["network.harvesterhci.io"], &["ippools", "ippools/status", "virtualmachinenetworkconfigs"]),
                all(&["ipam.vmdhcp.io"], &["addressclaims", "addressclaims/status"]),
                all(&["kubevirt.io"], &["virtualmachines"]),
                all(&["k8s.cni.cncf.io"], &["network-attachment-definitions"]),
                all(&["", "events.k8s.io"], &["events"]),
                all(&[""], &["configmaps", "secrets", "pods", "namespaces"]),
                all(&["coordination.k8s.io"], &["leases"]),
                all(&["apps"], &["deployments"]),
             ]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": format!("{ns}-config-status")},
             "rules": [all(&["network.harvesterhci.io"], &["virtualmachinenetworkconfigs/status"])]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": format!("{ns}-controller")},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": format!("{ns}-controller")},
             "subjects": [{"kind": "ServiceAccount", "name": "controller", "namespace": ns}]},
        ]}),
    );
    cp.kubeconfig_as(ns, "controller").unwrap()
}

/// Gives the ServiceAccount of [`controller_denied_config_status`] back the configs' status.
fn allow_config_status(cp: &ControlPlane, ns: &str) {
    kubectl_apply(
        cp,
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": format!("{ns}-config-status")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": format!("{ns}-config-status")},
        "subjects": [{"kind": "ServiceAccount", "name": "controller", "namespace": ns}]}),
    );
}

/// A config whose status write is refused (RBAC) after its pool's succeeded holds an address its
/// status never records. When its VM goes, the address is released all the same: from the MAC
/// claims of the term that gave it; and, when the replica that gave it is gone and the config was
/// removed past its finalizer, by the next leader's sweep of entries no config names.
#[tokio::test]
async fn an_address_whose_config_status_was_never_written_is_released_when_the_vm_goes() {
    let cp = &ControlPlane::start().unwrap();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "unwritten").await.unwrap();
    let restricted = controller_denied_config_status(cp, &ns);
    let first = start_with(
        cp,
        "unwritten-1",
        &ns,
        false,
        &[format!("--kubeconfig={}", restricted.display())],
    );
    network_and_pool(&client, &ns, "net-uw", 29).await;
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    wait_pool_ready(&pools, "net-uw").await;
    let recorded_for = |mac: &'static str| {
        let pools = pools.clone();
        async move {
            recorded(&pools, "net-uw")
                .await
                .into_iter()
                .find(|(_, m)| m == mac)
                .map(|(ip, _)| ip)
        }
    };
    let vms = vm_api(&client, &ns);
    let cfgs: Api<VirtualMachineNetworkConfig> = Api::namespaced(client.clone(), &ns);

    // The pool records the address; the config's status cannot say so.
    const MAC1: &str = "02:00:00:1d:00:01";
    vm(&client, &ns, "vm-1", "net-uw", MAC1).await;
    let ip1 = poll("vm-1's address recorded", async || recorded_for(MAC1).await).await;
    assert!(
        cfgs.get("vm-1")
            .await
            .unwrap()
            .status
            .is_none_or(|s| s.network_configs.is_empty()),
        "the config's status was written"
    );
    vms.delete("vm-1", &Default::default()).await.unwrap();
    poll("vm-1's config gone", async || {
        cfgs.get_opt("vm-1").await.ok()?.is_none().then_some(())
    })
    .await;
    poll("vm-1's address released", async || {
        recorded_for(MAC1).await.is_none().then_some(())
    })
    .await;
    // Allowed again: the next VM gets the address back, the lowest free.
    allow_config_status(cp, &ns);
    let (_, ip3) = vm_allocated(
        &client,
        &ns,
        "vm-3",
        "net-uw",
        "02:00:00:1d:00:03",
        "vm-3 allocated",
    )
    .await;
    assert_eq!(ip3, ip1, "the released address is free again");

    // The replica that gave the address goes, and the config is removed past its finalizer
    // before another runs: nothing names the entry any more.
    const MAC2: &str = "02:00:00:1d:00:02";
    vm(&client, &ns, "vm-2", "net-uw", MAC2).await;
    let _ = poll("vm-2 allocated", async || recorded_for(MAC2).await).await;
    drop(first);
    vms.delete("vm-2", &Default::default()).await.unwrap();
    cfgs.patch(
        "vm-2",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    let _ = cfgs.delete("vm-2", &Default::default()).await;
    let _second = start_with(
        cp,
        "unwritten-2",
        &ns,
        false,
        &["--unnamed-entry-grace-seconds=2".into()],
    );
    poll("vm-2's unnamed address released", async || {
        recorded_for(MAC2).await.is_none().then_some(())
    })
    .await;
    assert_eq!(
        recorded_for("02:00:00:1d:00:03").await,
        Some(ip3),
        "a named entry was released"
    );
    warning_on(&client, &ns, "net-uw", "UnnamedReleased").await;
}

/// Waits for a Warning event `reason` about the object `name` in `ns`.
async fn warning_on(client: &Client, ns: &str, name: &str, reason: &str) -> Event {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    poll(&format!("a {reason} event on {name}"), async || {
        events
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.involved_object.name.as_deref() == Some(name)
                    && e.type_.as_deref() == Some("Warning")
            })
    })
    .await
}

/// The IPv6 address config `name` records for its first NIC.
async fn ipv6_of(cfgs: &Api<VirtualMachineNetworkConfig>, name: &str) -> Option<String> {
    cfgs.get(name)
        .await
        .ok()?
        .status?
        .network_configs
        .first()?
        .allocated_ipv6_address
        .clone()
}

/// A writer that predates dual-stack (upstream's controller, an older release) writes a
/// dual-stack pool's status without `status.ipv6` while no replica of ours runs. The next
/// replica reports it (`IPv6RecordMissing`), keeps every IPv6 address the configs' status records
/// for its config (a new VM does not get one), and records them again.
#[tokio::test]
async fn a_pool_record_without_its_ipv6_side_keeps_what_the_configs_record() {
    let cp = &ControlPlane::start().unwrap();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "v6lost").await.unwrap();
    let first = start(cp, "v6lost-1", &ns, false);
    create(&client, &ns, json!({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition", "metadata": {"name": "net-6", "namespace": ns}, "spec": {"config": "{}"}})).await;
    create(&client, &ns, json!({
        "apiVersion": "network.harvesterhci.io/v1alpha1", "kind": "IPPool", "metadata": {"name": "net-6", "namespace": ns},
        "spec": {"networkName": format!("{ns}/net-6"),
            "ipv4Config": {"serverIP": "10.31.0.1", "cidr": "10.31.0.0/24", "pool": {"start": "10.31.0.10", "end": "10.31.0.20"}},
            "ipv6Config": {"serverIP": "fd00:31::1", "cidr": "fd00:31::/112", "pool": {"start": "fd00:31::10", "end": "fd00:31::20"}}}
    }))
    .await;
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    wait_pool_ready(&pools, "net-6").await;
    let cfgs: Api<VirtualMachineNetworkConfig> = Api::namespaced(client.clone(), &ns);
    vm(&client, &ns, "vm-1", "net-6", "02:00:00:1f:00:01").await;
    let v6 = poll("vm-1's IPv6 address", async || ipv6_of(&cfgs, "vm-1").await).await;
    drop(first);

    // The pre-dual-stack write: the whole status back, without `ipv6`.
    let mut pool = pools.get_status("net-6").await.unwrap();
    pool.status.as_mut().unwrap().ipv6 = None;
    pool.metadata.managed_fields = None;
    pools
        .replace_status("net-6", &PostParams::default(), &pool)
        .await
        .unwrap();
    assert!(
        pools
            .get("net-6")
            .await
            .unwrap()
            .status
            .unwrap()
            .ipv6
            .is_none()
    );

    let _second = start(cp, "v6lost-2", &ns, false);
    warning_on(&client, &ns, "net-6", "IPv6RecordMissing").await;
    vm(&client, &ns, "vm-2", "net-6", "02:00:00:1f:00:02").await;
    let v6_2 = poll("vm-2's IPv6 address", async || ipv6_of(&cfgs, "vm-2").await).await;
    assert_ne!(v6_2, v6, "vm-1's recorded IPv6 address given to vm-2");
    poll("vm-1's IPv6 address recorded again", async || {
        let status = pools.get("net-6").await.ok()?.status?;
        (status.ipv6?.allocated.get(&v6).map(String::as_str) == Some("02:00:00:1f:00:01"))
            .then_some(())
    })
    .await;
    assert_eq!(ipv6_of(&cfgs, "vm-1").await, Some(v6));
}

/// Sets (creating it the first time) the agents' election Lease `agents` in `ns` to `holder`.
async fn hold_agent_lease(leases: &Api<Lease>, holder: &str) {
    let lease: Lease = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "agents"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15}
    }))
    .unwrap();
    let patch = PatchParams::apply("vmdhcp-tests").force();
    leases
        .patch("agents", &patch, &Patch::Apply(&lease))
        .await
        .unwrap();
}

/// AgentReady of `pool`: (status, message).
async fn agent_ready_of(pools: &Api<IPPool>, pool: &str) -> Option<(String, String)> {
    let p = pools.get(pool).await.ok()?;
    let c = find_condition(&p.status?.conditions, "AgentReady")?.clone();
    Some((c.status, c.message.unwrap_or_default()))
}

/// With the agents' Lease followed, a report's claim to lead counts for nothing: the pool is
/// ready by the Lease holder's report only, and when the Lease moves to an agent that has not
/// reported, AgentReady goes False although the other agent still says it leads.
#[tokio::test]
async fn only_the_agent_lease_holders_report_counts() {
    let cp = &ControlPlane::start().unwrap();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "trust").await.unwrap();
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    hold_agent_lease(&leases, "agent-x").await;
    let controller = start_with(
        cp,
        "trust-1",
        &ns,
        false,
        &[format!("--agent-lease={ns}/agents")],
    );
    network_and_pool(&client, &ns, "net-tr", 26).await;
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    wait_pool_ready(&pools, "net-tr").await;
    let pool_ref = format!("{ns}/net-tr");
    let mut grpc = grpc_client(&controller).await;
    // agent-y says it leads and serves; agent-x holds the Lease and has said nothing.
    grpc.report(serving_report(&ns, "agent-y", &pool_ref))
        .await
        .unwrap();
    hold_agent_lease(&leases, "agent-y").await;
    let (_, message) = poll("AgentReady=True once agent-y holds the Lease", async || {
        agent_ready_of(&pools, "net-tr")
            .await
            .filter(|(s, _)| s == "True")
    })
    .await;
    assert!(message.contains("agent-y"), "{message}");
    // The Lease moves to agent-x, which never reported; agent-y's fresh report still claims
    // to lead.
    hold_agent_lease(&leases, "agent-x").await;
    let (_, message) = poll("AgentReady=False once agent-y lost the Lease", async || {
        agent_ready_of(&pools, "net-tr")
            .await
            .filter(|(s, _)| s == "False")
    })
    .await;
    assert!(message.contains("no leading agent"), "{message}");
    grpc.report(serving_report(&ns, "agent-x", &pool_ref))
        .await
        .unwrap();
    let (_, message) = poll("AgentReady=True by agent-x", async || {
        agent_ready_of(&pools, "net-tr")
            .await
            .filter(|(s, _)| s == "True")
    })
    .await;
    assert!(message.contains("agent-x"), "{message}");
}

/// A paused pool is never rebuilt, so nothing may wait for its rebuild: after a restart, each
/// of its configs used to wait 5 s inside one of the controller's reconcile slots, then again
/// every 5 s, and with a few hundred of them a VM on any other pool waited behind them. Here 200
/// VMs hold addresses on pool P, P is paused and the controller restarts: no config's reconcile
/// takes anywhere near 5 s, P's configs keep their addresses as recorded, and a new VM on pool
/// Q is allocated.
#[tokio::test]
async fn a_paused_pool_holds_no_reconcile_slot_after_a_restart() {
    let cp = &ControlPlane::start().unwrap();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "paused").await.unwrap();
    network_and_pool(&client, &ns, "net-p", 23).await;
    network_and_pool(&client, &ns, "net-q", 24).await;
    let first = start(cp, "paused-1", &ns, false);
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    for p in ["net-p", "net-q"] {
        wait_pool_ready(&pools, p).await;
    }
    let n = 200usize;
    let creates = (0..n).map(|i| {
        let (client, ns) = (client.clone(), ns.clone());
        async move {
            let mac = format!("02:00:00:19:{:02x}:{:02x}", i / 256, i % 256);
            vm(&client, &ns, &format!("vm-{i}"), "net-p", &mac).await
        }
    });
    futures_util::future::join_all(creates).await;
    let held = poll("every VM on P allocated", async || {
        let done = allocated_configs(&client, &ns).await;
        (done.len() == n).then_some(done)
    })
    .await;

    pools
        .patch(
            "net-p",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"paused": true}})),
        )
        .await
        .unwrap();
    poll("P stopped", async || {
        let p = pools.get("net-p").await.ok()?;
        let s = p.status?;
        find_condition(&s.conditions, "Stopped")
            .is_some_and(|c| c.status == "True")
            .then_some(())
    })
    .await;

    drop(first);
    let second = start(cp, "paused-2", &ns, false);
    vm(&client, &ns, "vm-q", "net-q", "02:00:00:18:00:01").await;
    let deadline = Instant::now() + DEADLINE;
    let (_, ip) = loop {
        if let Some(done) = allocated_configs(&client, &ns).await.get("vm-q") {
            break done.clone();
        }
        let log =
            std::fs::read_to_string(cp.dir().join("controller-paused-2.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        assert!(
            Instant::now() < deadline,
            "no VM on Q allocated after the restart; the controller's log ends:\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(ip, "10.24.0.2");
    // The new term's first pass reconciles every config once.
    let count = "vmdhcpcontroller_reconcile_duration_seconds_count{controller=\"vmnetcfg\"}";
    poll("every config reconciled by the new term", async || {
        (second.metric(count) >= (n + 1) as f64).then_some(())
    })
    .await;
    let within =
        "vmdhcpcontroller_reconcile_duration_seconds_bucket{le=\"4.096\",controller=\"vmnetcfg\"}";
    assert_eq!(
        second.metric(within),
        second.metric(count),
        "a config's reconcile took over 4 s: it waited inside its slot"
    );
    let still = poll("P's configs and the VM on Q allocated", async || {
        let done = allocated_configs(&client, &ns).await;
        (done.len() == n + 1).then_some(done)
    })
    .await;
    for (name, held) in &held {
        assert_eq!(still.get(name), Some(held), "{name} on the paused pool");
    }
    drop(second);
}

/// Tenant-driven amplification: 100 VMs copying one VM's MAC, created beside a burst of 200
/// VMs on the same pool. Each of the burst's allocations writes the pool, and a write of the
/// pool used to wake every config still waiting on its network, each repeating its `MacInUse`
/// Warning (an API write); now a config refused for a MAC in use waits on its holder, and a
/// Warning the config's condition already states is not sent again. Reconciles and event writes
/// stay in proportion to the VMs (the controller's metrics, the API server's audit log), and
/// the refused configs do not poll.
#[tokio::test]
async fn duplicate_macs_beside_a_burst_cost_reconciles_and_events_in_proportion_to_the_vms() {
    const BURST: usize = 200;
    const COPIES: usize = 100;
    let audit = tempfile::Builder::new()
        .prefix("vmdhcp-audit-")
        .suffix(".log")
        .tempfile()
        .unwrap()
        .into_temp_path();
    let cp = &ControlPlane::start_with_audit(Some(audit.to_path_buf())).unwrap();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "copies").await.unwrap();
    network_and_pool(&client, &ns, "net-d", 25).await;
    let replica = start(cp, "copies-1", &ns, false);
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    wait_pool_ready(&pools, "net-d").await;
    const COPIED: &str = "02:00:00:25:ff:01";
    vm(&client, &ns, "holder", "net-d", COPIED).await;
    poll("the holder allocated", async || {
        allocated_configs(&client, &ns).await.get("holder").cloned()
    })
    .await;

    let creates = (0..BURST.max(COPIES)).flat_map(|i| {
        let burst = (i < BURST).then(|| {
            let mac = format!("02:00:00:25:{:02x}:{:02x}", i / 256, i % 256);
            (format!("vm-{i}"), mac)
        });
        let copy = (i < COPIES).then(|| (format!("copy-{i}"), COPIED.to_owned()));
        burst.into_iter().chain(copy)
    });
    let creates = creates.map(|(name, mac)| {
        let (client, ns) = (client.clone(), ns.clone());
        async move { vm(&client, &ns, &name, "net-d", &mac).await }
    });
    futures_util::future::join_all(creates).await;
    let cfgs: Api<VirtualMachineNetworkConfig> = Api::namespaced(client.clone(), &ns);
    let refused = |c: &VirtualMachineNetworkConfig| {
        c.status.as_ref().is_some_and(|s| {
            find_condition(&s.conditions, "Allocated")
                .is_some_and(|a| a.status == "False" && a.reason.as_deref() == Some("MacInUse"))
        })
    };
    poll("the burst allocated and every copy refused", async || {
        let done = allocated_configs(&client, &ns).await.len();
        let listed = cfgs.list(&Default::default()).await.ok()?;
        let copies = listed.items.iter().filter(|c| refused(c)).count();
        (done == BURST + 1 && copies == COPIES).then_some(())
    })
    .await;
    // Every event queued is published (or failed) before counting.
    let queued = || {
        replica.metric("vmdhcpcontroller_events_total{result=\"published\"}")
            + replica.metric("vmdhcpcontroller_events_total{result=\"failed\"}")
    };
    let mut last = queued();
    poll("the event queue drained", async || {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = queued();
        let quiet = now == last;
        last = now;
        quiet.then_some(())
    })
    .await;

    let vms = (BURST + COPIES + 1) as f64;
    let reconciles = "vmdhcpcontroller_reconcile_duration_seconds_count{controller=\"vmnetcfg\"}";
    let settled = replica.metric(reconciles);
    let events = audit_event_writes(&audit, &ns);
    // A quiet spell: refused copies are looked at again once a minute at most, and say
    // nothing new.
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(15)).await;
    let idle = replica.metric(reconciles) - settled;
    let idle_events = audit_event_writes(&audit, &ns) - events;
    let warnings = Api::<Event>::namespaced(client.clone(), &ns)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("MacInUse"))
        .collect::<Vec<_>>();
    let repeated = warnings
        .iter()
        .filter(|e| e.count.unwrap_or(1) > 1 || e.series.is_some())
        .count();
    println!(
        "{BURST} VMs beside {COPIES} copies of one MAC: {settled} config reconciles \
         ({:.2} a VM), {events} event writes ({:.2} a VM); in the {:.0} s after: {idle} \
         reconciles, {idle_events} event writes; {} MacInUse Events, {repeated} repeated",
        settled / vms,
        events as f64 / vms,
        started.elapsed().as_secs_f64(),
        warnings.len()
    );
    assert!(
        settled <= 6.0 * vms,
        "{settled} reconciles for {vms} VMs: more than 6 each"
    );
    assert!(
        (events as f64) <= 2.0 * vms,
        "{events} event writes for {vms} VMs: more than 2 each"
    );
    assert_eq!(idle_events, 0, "events written while nothing changed");
    assert!(
        idle <= COPIES as f64,
        "{idle} reconciles in 15 s while nothing changed"
    );
    assert_eq!(warnings.len(), COPIES, "one MacInUse Warning per copy");
    assert_eq!(repeated, 0, "a MacInUse Warning was repeated");
    drop(replica);
}

/// Event writes (create or patch, either API group) in namespace `ns`, from the audit log.
fn audit_event_writes(log: &std::path::Path, ns: &str) -> usize {
    vmdhcp_integration::audit::read_log(log)
        .unwrap()
        .iter()
        .filter(|e| {
            matches!(e.verb.as_str(), "create" | "patch" | "update")
                && e.object_ref
                    .as_ref()
                    .is_some_and(|o| o.resource == "events" && o.namespace.as_deref() == Some(ns))
        })
        .count()
}
