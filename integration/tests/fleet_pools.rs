//! Pools come and go while clients on another pool keep renewing: a pool added (the controller
//! rewrites the agent Deployment and the replicas roll, as Kubernetes would roll them), paused,
//! resumed and deleted — and a real dhclient on pool-a never loses its lease or misses a renewal.
//! See [`vmdhcp_integration::fleet`] for the topology.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::time::Duration;

use serde_json::{Value, json};
use vmdhcp_integration::dhcp_client::{events, start_dhclient, udhcpc, wait_event, wait_for};
use vmdhcp_integration::fleet::{Agent, Fleet, NS, VM1_MAC, probe_until_leased, setup};

const VM3_MAC: &str = "02:12:34:00:00:03";
const POOL_B_SERVER: &str = "10.123.46.2";

/// The interfaces `agent` reports as serving, by name.
fn serving(fleet: &Fleet, agent: &Agent) -> Vec<String> {
    fleet
        .readyz(agent)
        .and_then(|v| {
            v["interfaces"].as_object().map(|m| {
                m.iter()
                    .filter(|(_, s)| s["state"] == "serving")
                    .map(|(name, _)| name.clone())
                    .collect()
            })
        })
        .unwrap_or_default()
}

/// Waits until the leader among `agents` serves exactly `interfaces`.
fn wait_serving(fleet: &Fleet, agents: &[&Agent], interfaces: &[&str], what: &str) {
    let mut want: Vec<String> = interfaces.iter().map(|s| (*s).to_owned()).collect();
    want.sort();
    wait_for(what, Duration::from_secs(30), || {
        agents
            .iter()
            .any(|a| {
                let mut got = serving(fleet, a);
                got.sort();
                got == want
            })
            .then_some(())
    });
}

/// pool-a's dhclient events so far: it must have bound once and only renewed since, always to
/// the same address; returns the number of renewals.
fn renewals_without_interruption(dir: &std::path::Path, ip: &str) -> usize {
    let evs = events(dir);
    let kinds: Vec<&str> = evs.iter().map(|(e, _)| e.as_str()).collect();
    let bound = kinds.iter().position(|e| *e == "BOUND").expect("bound");
    for (event, env) in &evs[bound..] {
        assert!(
            event == "BOUND" || event == "RENEW",
            "pool-a's client was interrupted: {kinds:?}"
        );
        assert_eq!(env["new_ip_address"], ip, "address changed: {kinds:?}");
    }
    assert_eq!(
        kinds.iter().filter(|e| **e == "BOUND").count(),
        1,
        "{kinds:?}"
    );
    kinds.iter().filter(|e| **e == "RENEW").count()
}

#[test]
fn pools_added_paused_and_removed_without_interrupting_other_pools() {
    let mut fleet = setup();
    let ip1 = fleet.allocated()[VM1_MAC].clone();
    let pool_a_if = fleet.interface.clone();

    let ns0 = fleet.agent_netns(0);
    let ns1 = fleet.agent_netns(1);
    let a0 = fleet.start_agent(&ns0, "agent-0");
    let a1 = fleet.start_agent(&ns1, "agent-1");
    let leader = fleet.leader(&[&a0, &a1]).identity.clone();

    // A real dhclient on pool-a (lease 20 s: it renews every 10 s throughout).
    let vm1 = fleet.vm("vm1", VM1_MAC);
    let dir1 = fleet.dir.path().join("vm1");
    fs::create_dir_all(&dir1).unwrap();
    start_dhclient(&mut fleet.lab, &vm1, &dir1);
    let bound = wait_event(&dir1, "BOUND", 0, Duration::from_secs(30));
    assert_eq!(bound["new_ip_address"], ip1);

    // pool-b on a second network, with a VM.
    let net = fleet.net.clone();
    fleet.lab.bridge(&net, "br1").unwrap();
    fleet
        .bridges
        .insert(format!("{NS}/net-b"), "br1".to_owned());
    fleet.apply(&json!({
        "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": "net-b", "namespace": NS},
        "spec": {"config": "{\"cniVersion\":\"0.3.1\",\"type\":\"bridge\",\"bridge\":\"br1\"}"}
    }));
    fleet.apply(&json!({
        "apiVersion": "network.harvesterhci.io/v1alpha1", "kind": "IPPool",
        "metadata": {"name": "pool-b", "namespace": NS},
        "spec": {"networkName": format!("{NS}/net-b"), "ipv4Config": {
            "serverIP": POOL_B_SERVER, "cidr": "10.123.46.0/24",
            "pool": {"start": "10.123.46.50", "end": "10.123.46.99"},
            "leaseTime": 20
        }}
    }));
    fleet.apply_vm("vm3", VM3_MAC, "net-b");
    let ip3 = wait_for("vm3 allocated on pool-b", Duration::from_secs(30), || {
        fleet.allocated_in("pool-b").get(VM3_MAC).cloned()
    });

    // The controller adds pool-b to the agents' bootstrap; pool-a's interface name is unchanged.
    fleet.env = wait_for(
        "pool-b in the agent Deployment",
        Duration::from_secs(30),
        || {
            fleet
                .bootstrap_env()
                .filter(|(_, refs)| refs.contains("pool-b"))
        },
    );
    let configs: Vec<Value> = serde_json::from_str(&fleet.env.0).unwrap();
    let interface_of = |pool: &str| {
        configs
            .iter()
            .find(|c| c["ipPoolRef"] == format!("{NS}/{pool}"))
            .and_then(|c| c["interfaceName"].as_str())
            .unwrap()
            .to_owned()
    };
    assert_eq!(interface_of("pool-a"), pool_a_if, "pool-a renamed");
    let pool_b_if = interface_of("pool-b");

    // The Deployment rolls: two new replicas (with both networks) start and wait as standbys,
    // then the old ones are terminated, the leader first.
    let ns2 = fleet.agent_netns(2);
    let ns3 = fleet.agent_netns(3);
    let a2 = fleet.start_agent(&ns2, "agent-2");
    let a3 = fleet.start_agent(&ns3, "agent-3");
    for a in [&a2, &a3] {
        wait_for("a new replica ready", Duration::from_secs(30), || {
            fleet.readyz(a).filter(|v| v["ready"] == true).map(|_| ())
        });
    }
    let (old_leader, old_standby) = if leader == a0.identity {
        (a0, a1)
    } else {
        (a1, a0)
    };
    for old in [&old_leader, &old_standby] {
        assert!(old.process.signal("TERM"));
        wait_for("an old replica to exit", Duration::from_secs(15), || {
            old.process.exited().then_some(())
        });
    }
    let new_leader = fleet.leader(&[&a2, &a3]).identity.clone();
    wait_serving(
        &fleet,
        &[&a2, &a3],
        &[&pool_a_if, &pool_b_if],
        "the new leader serving both pools",
    );
    let vm3 = fleet.vm_on("vm3", VM3_MAC, "br1");
    let probe_dir = fleet.dir.path().join("probe");
    probe_until_leased(&vm3, &probe_dir, &ip3, Duration::from_secs(15));

    // Pause pool-b: the leader stops answering on its interface and gives the address back.
    let patch = |paused: bool| {
        fleet
            .cp
            .kubectl()
            .args(["-n", NS, "patch", "ippool", "pool-b", "--type=merge", "-p"])
            .arg(json!({"spec": {"paused": paused}}).to_string())
            .output()
            .unwrap()
    };
    assert!(patch(true).status.success());
    wait_serving(
        &fleet,
        &[&a2, &a3],
        &[&pool_a_if],
        "pool-b no longer served",
    );
    let leader_ns = if new_leader == a2.identity {
        &ns2
    } else {
        &ns3
    };
    // Either agent's report may say so first; the leader's interface follows within moments.
    wait_for(
        "the paused pool's server address removed from the leader's interface",
        Duration::from_secs(30),
        || {
            let addrs = fleet
                .lab
                .exec(leader_ns, "ip", &["-4", "addr", "show", &pool_b_if])
                .unwrap();
            (!addrs.contains(POOL_B_SERVER)).then_some(())
        },
    );
    let out = udhcpc(&vm3, &probe_dir, &["-t", "2", "-T", "1", "-r", &ip3]);
    let said =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(!said.contains("obtained"), "a paused pool answered: {said}");

    // Resume: served again, with the same allocation.
    assert!(patch(false).status.success());
    wait_serving(
        &fleet,
        &[&a2, &a3],
        &[&pool_a_if, &pool_b_if],
        "pool-b served again",
    );
    probe_until_leased(&vm3, &probe_dir, &ip3, Duration::from_secs(15));

    // Delete pool-b: its interface is released, pool-a untouched.
    fleet
        .cp
        .kubectl_stdin(&["-n", NS, "delete", "ippool", "pool-b"], "")
        .unwrap();
    wait_serving(&fleet, &[&a2, &a3], &[&pool_a_if], "pool-b gone");
    fleet.env = wait_for(
        "pool-b out of the agent Deployment",
        Duration::from_secs(30),
        || {
            fleet
                .bootstrap_env()
                .filter(|(_, refs)| !refs.contains("pool-b"))
        },
    );

    // Through all of it, pool-a's client only ever renewed, on its address, and kept renewing.
    let at_end = renewals_without_interruption(&dir1, &ip1);
    wait_for(
        "pool-a's client to renew again after the changes",
        Duration::from_secs(30),
        || (renewals_without_interruption(&dir1, &ip1) > at_end.max(2)).then_some(()),
    );
}
