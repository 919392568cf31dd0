//! The foundation, end to end against real components: our CRDs on a real kube-apiserver
//! (applied with kubectl, read back with kube-rs) and the netns lab.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use vmdhcp_core::crd::{IPPool, VirtualMachineNetworkConfig};
use vmdhcp_integration::control_plane::ControlPlane;
use vmdhcp_integration::netns::Lab;

/// An example manifest moved into the test's namespace (and its network with it).
fn example(file: &str, ns: &str) -> String {
    let text = std::fs::read_to_string(
        vmdhcp_integration::control_plane::repo_root()
            .join("examples")
            .join(file),
    )
    .unwrap();
    text.replace("namespace: default", &format!("namespace: {ns}"))
        .replace("default/net-48", &format!("{ns}/net-48"))
}

fn nad(ns: &str) -> String {
    format!(
        "apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata:\n  name: net-48\n  namespace: {ns}\n  labels:\n    network.harvesterhci.io/clusternetwork: mgmt\nspec:\n  config: '{{\"cniVersion\":\"0.3.1\",\"type\":\"bridge\",\"bridge\":\"br-48\"}}'\n"
    )
}

#[tokio::test]
async fn upstream_examples_apply_with_kubectl_and_read_back_through_kube_rs() {
    let cp = ControlPlane::shared();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "examples").await.unwrap();

    cp.kubectl_stdin(&["apply", "-f", "-"], &nad(&ns)).unwrap();
    let out = cp
        .kubectl_stdin(&["apply", "-f", "-"], &example("ippool.yaml", &ns))
        .unwrap();
    assert!(
        out.contains("ippool.network.harvesterhci.io/net-48 created"),
        "{out}"
    );
    let out = cp
        .kubectl_stdin(&["apply", "-f", "-"], &example("vmnetcfg.yaml", &ns))
        .unwrap();
    assert!(
        out.contains("virtualmachinenetworkconfig.network.harvesterhci.io/test-vm created"),
        "{out}"
    );

    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    let pool = pools.get("net-48").await.unwrap();
    assert_eq!(pool.spec.network_name, format!("{ns}/net-48"));
    let v4 = &pool.spec.ipv4_config;
    assert_eq!(
        (v4.server_ip.as_str(), v4.cidr.as_str()),
        ("192.168.48.77", "192.168.48.0/24")
    );
    assert_eq!(
        (v4.pool.start.as_str(), v4.pool.end.as_str()),
        ("192.168.48.81", "192.168.48.90")
    );
    assert_eq!(v4.pool.exclude, ["192.168.48.81", "192.168.48.90"]);
    assert_eq!(v4.router.as_deref(), Some("192.168.48.1"));
    assert_eq!(v4.dns, ["1.1.1.1"]);
    assert_eq!(v4.domain_name.as_deref(), Some("aibao.moe"));
    assert_eq!(v4.domain_search, ["aibao.moe"]);
    assert_eq!(v4.ntp, ["pool.ntp.org"]);
    assert_eq!(v4.lease_time, Some(300));
    let cfg = vmdhcp_core::pool::PoolConfig::from_ippool(&pool, "eth1").unwrap();
    assert_eq!(cfg.lease_seconds, 300);

    let cfgs: Api<VirtualMachineNetworkConfig> = Api::namespaced(client.clone(), &ns);
    let vmnetcfg = cfgs.get("test-vm").await.unwrap();
    assert_eq!(vmnetcfg.spec.vm_name, "test-vm");
    assert_eq!(
        vmnetcfg.spec.network_configs[0].mac_address,
        "fa:cf:8e:50:82:fc"
    );

    // Short names and printer columns are the ones operators type and read.
    let table = String::from_utf8(
        cp.kubectl()
            .args(["get", "ippl", "-n", &ns])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    for column in [
        "NETWORK",
        "AVAILABLE",
        "USED",
        "REGISTERED",
        "CACHEREADY",
        "AGENTREADY",
        "AGE",
    ] {
        assert!(table.contains(column), "missing column {column}:\n{table}");
    }
    let table = String::from_utf8(
        cp.kubectl()
            .args(["get", "vmnetcfg", "-n", &ns])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    for column in ["VMNAME", "ALLOCATED", "DISABLED", "INSYNCED"] {
        assert!(table.contains(column), "missing column {column}:\n{table}");
    }
}

/// The shared API server, a client, and a new namespace holding the example pool (`net-48`),
/// applied with kubectl.
async fn example_pool(prefix: &str) -> (&'static ControlPlane, kube::Client, String) {
    let cp = ControlPlane::shared();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, prefix).await.unwrap();
    cp.kubectl_stdin(&["apply", "-f", "-"], &example("ippool.yaml", &ns))
        .unwrap();
    (cp, client, ns)
}

#[tokio::test]
async fn status_subresource_takes_upstream_status_shape() {
    let (cp, client, ns) = example_pool("status").await;
    let pools: Api<IPPool> = Api::namespaced(client, &ns);
    let status = json!({"status": {
        "lastUpdate": "2026-11-22T00:00:00Z",
        "ipv4": {"allocated": {"192.168.48.81": "EXCLUDED", "192.168.48.86": "c6:d6:82:39:d3:c3"}, "used": 1, "available": 7},
        "conditions": [{"type": "CacheReady", "status": "True", "lastUpdateTime": "2026-11-22T00:00:00Z"}]
    }});
    pools
        .patch_status("net-48", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let pool = pools.get_status("net-48").await.unwrap();
    let (leases, errors) = vmdhcp_core::pool::leases_from_status(&pool).unwrap();
    assert!(errors.is_empty());
    assert_eq!(leases.len(), 1);
    assert_eq!(leases[0].mac.to_string(), "c6:d6:82:39:d3:c3");
    let table = String::from_utf8(
        cp.kubectl()
            .args(["get", "ippl", "net-48", "-n", &ns])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert!(
        table
            .lines()
            .nth(1)
            .is_some_and(|row| row.contains(" 7 ") && row.contains(" 1 ") && row.contains("True")),
        "{table}"
    );
}

/// The controller's status writes ask for the written pool's metadata alone and take the rest
/// from what they sent: the real API server must answer a status PUT that way, and hold exactly
/// what the writer believes it wrote, at the version it was told.
#[tokio::test]
async fn a_status_write_answered_with_metadata_alone_holds_what_was_sent() {
    use vmdhcp_controller::reconcile::status::{set_condition, update_pool_status};
    let (_, client, ns) = example_pool("status-put").await;
    let pool_ref = vmdhcp_core::NamespacedName::new(&ns, "net-48").unwrap();
    let pools: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    for (round, mac) in ["c6:d6:82:39:d3:c3", "c6:d6:82:39:d3:c4"]
        .iter()
        .enumerate()
    {
        let written = update_pool_status(&client, None, &pool_ref, |s| {
            let v4 = s.ipv4.get_or_insert_with(Default::default);
            v4.allocated
                .insert(format!("192.168.48.{}", 86 + round), (*mac).to_owned());
            v4.used = v4.allocated.len() as i64;
            set_condition(&mut s.conditions, "CacheReady", true, "", "");
            Ok(())
        })
        .await
        .unwrap();
        let held = pools.get_status("net-48").await.unwrap();
        assert_eq!(
            held.metadata.resource_version, written.metadata.resource_version,
            "round {round}"
        );
        assert_eq!(held.status, written.status, "round {round}");
        assert_eq!(held.spec, written.spec, "round {round}");
        assert_eq!(
            held.status
                .and_then(|s| s.ipv4)
                .map(|v4| v4.allocated.len()),
            Some(round + 1)
        );
    }
}

#[tokio::test]
async fn the_server_enforces_the_generated_schema() {
    let cp = ControlPlane::shared();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "schema").await.unwrap();
    let bad = [
        (
            "serverIP: 192.168.48.77",
            "serverIP: not-an-ip",
            "spec.ipv4Config.serverIP",
        ),
        (
            "    - 1.1.1.1\n",
            "    - 1.1.1.1\n    - 1.1.1.2\n    - 1.1.1.3\n    - 1.1.1.4\n",
            "spec.ipv4Config.dns",
        ),
    ];
    for (from, to, field) in bad {
        let manifest = example("ippool.yaml", &ns).replace(from, to);
        assert_ne!(
            manifest,
            example("ippool.yaml", &ns),
            "the mutation of {field} applied"
        );
        let err = cp
            .kubectl_stdin(&["apply", "--validate=false", "-f", "-"], &manifest)
            .unwrap_err()
            .to_string();
        assert!(err.contains(field), "{field}: {err}");
    }
    let missing = example("ippool.yaml", &ns).replace(&format!("  networkName: {ns}/net-48\n"), "");
    let err = cp
        .kubectl_stdin(&["apply", "--validate=false", "-f", "-"], &missing)
        .unwrap_err()
        .to_string();
    assert!(err.contains("spec.networkName: Required value"), "{err}");
}

#[test]
fn netns_lab_builds_a_wire_and_cleans_up() {
    let names;
    {
        let mut lab = Lab::new().unwrap();
        let (a, b) = (lab.netns("a").unwrap(), lab.netns("b").unwrap());
        lab.veth(&a, "eth-a", &b, "eth-b").unwrap();
        lab.address(&a, "eth-a", "192.0.2.1/24").unwrap();
        lab.address(&b, "eth-b", "192.0.2.2/24").unwrap();
        let link = lab
            .exec(&b, "ip", &["-br", "addr", "show", "dev", "eth-b"])
            .unwrap();
        assert!(link.contains("192.0.2.2/24"), "{link}");
        assert!(
            !lab.exec(&a, "ip", &["-br", "link", "show", "dev", "eth-a"])
                .unwrap()
                .contains("DOWN")
        );

        // A packet crosses the wire: a UDP listener in b receives a datagram sent from a.
        let mut listener = b.command("python3");
        listener.args(["-c", "import socket,sys\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.bind(('192.0.2.2',9999))\ns.settimeout(10)\nprint(s.recvfrom(64)[0].decode(),flush=True)"]);
        listener.stdout(std::process::Stdio::piped());
        let child = lab.spawn(listener).unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let got = std::thread::spawn(move || {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut stdout, &mut s).map(|_| s)
        });
        while !got.is_finished() && Instant::now() < deadline {
            let _ = lab.exec(&a, "python3", &["-c", "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.sendto(b'over-the-veth',('192.0.2.2',9999))"]);
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(got.join().unwrap().unwrap().trim(), "over-the-veth");

        // The bridge topology the end-to-end tests use.
        let sw = lab.netns("sw").unwrap();
        lab.bridge(&sw, "br0").unwrap();
        lab.plug(&sw, "br0", "p-a", &a, "net1").unwrap();
        let ports = lab
            .exec(&sw, "ip", &["-br", "link", "show", "master", "br0"])
            .unwrap();
        assert!(ports.contains("p-a"), "{ports}");
        names = lab.namespaces();
        let listed = String::from_utf8(
            std::process::Command::new("ip")
                .args(["netns", "list"])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        assert!(names.iter().all(|n| listed.contains(n.as_str())));
    }
    let listed = String::from_utf8(
        std::process::Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    for n in names {
        assert!(!listed.contains(n.as_str()), "{n} left behind:\n{listed}");
    }
}
