//! `vmdhcp-demo`: the whole system on this machine, no cluster needed. Starts etcd and a
//! kube-apiserver, the controller and two agents as processes, applies an IPPool and two
//! VirtualMachines with kubectl, lets a real `dhclient` in a VM namespace get its address, shows
//! what happened (pool, lease, which agent answered, the config stream through grpcurl), and
//! cleans everything up. Run it through `scripts/demo.sh`, which installs what it needs.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::process::Command;
use std::time::Duration;

use vmdhcp_integration::control_plane::tool;
use vmdhcp_integration::dhcp_client::{start_dhclient, wait_event, wait_for};
use vmdhcp_integration::fleet::{NS, VM1_MAC, setup};

fn step(text: &str) {
    println!("\n==> {text}");
}

fn main() -> anyhow::Result<()> {
    step("starting etcd, kube-apiserver and the controller; applying a NAD, an IPPool and two VMs");
    let mut fleet = setup();
    let out = fleet
        .cp
        .kubectl()
        .args(["-n", NS, "get", "ippool,vmnetcfg", "-o", "wide"])
        .output()?;
    println!("{}", String::from_utf8_lossy(&out.stdout));
    println!(
        "the controller wrote the agents' bootstrap env:\n  AGENT_NETWORK_CONFIGS={}\n  IPPOOL_REFS_JSON={}",
        fleet.env.0, fleet.env.1
    );

    step("starting two agent replicas (each in its own network namespace on the VM bridge)");
    let ns0 = fleet.agent_netns(0);
    let ns1 = fleet.agent_netns(1);
    let a0 = fleet.start_agent(&ns0, "agent-0");
    let a1 = fleet.start_agent(&ns1, "agent-1");
    let leader = fleet.leader(&[&a0, &a1]).identity.clone();
    println!("{leader} holds the Lease and answers DHCP; the other replica is a hot standby");

    step(&format!("booting vm1: dhclient on its NIC (MAC {VM1_MAC})"));
    let vm1 = fleet.vm("vm1", VM1_MAC);
    let dir = fleet.dir.path().join("vm1");
    fs::create_dir_all(&dir)?;
    start_dhclient(&mut fleet.lab, &vm1, &dir);
    let bound = wait_event(&dir, "BOUND", 0, Duration::from_secs(30));
    for key in [
        "new_ip_address",
        "new_subnet_mask",
        "new_routers",
        "new_domain_name_servers",
        "new_domain_name",
        "new_dhcp_lease_time",
        "new_dhcp_server_identifier",
    ] {
        println!("  {key:<28} {}", bound.get(key).map_or("-", String::as_str));
    }
    println!("answered by {leader}");
    let condition = wait_for("AgentReady", Duration::from_secs(30), || {
        let pool = fleet.kubectl_json(&["-n", NS, "get", "ippool", "pool-a"]);
        pool["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "AgentReady" && c["status"] == "True")
            .and_then(|c| c["message"].as_str().map(str::to_owned))
    });
    println!("IPPool {NS}/pool-a AgentReady: {condition}");

    step("the config stream, as grpcurl sees it (first message of a Watch)");
    let out = Command::new(tool("grpcurl")?)
        .args(["-plaintext", "-max-time", "3", "-d"])
        .arg(r#"{"agent":{"podName":"demo","namespace":"demo"}}"#)
        .arg(format!("127.0.0.1:{}", fleet.grpc))
        .arg("vmdhcp.agent.v1.ConfigService/Watch")
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    for line in text.lines().take(60) {
        println!("  {line}");
    }

    step("cleaning up: processes, namespaces and the control plane's files");
    drop(a0);
    drop(a1);
    drop(fleet);
    println!("done");
    Ok(())
}
