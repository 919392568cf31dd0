//! `vmdhcp-demo-cluster`: what a user does, on a real single-node Kubernetes on this machine.
//! Starts the node ([`vmdhcp_integration::node`]), `helm install`s the chart with its default
//! values, applies a NAD, an IPPool and a VirtualMachine with kubectl, lets a real `dhclient` in a
//! VM namespace get its address from the agent pod, deletes the leading agent pod to show the
//! standby take over, uninstalls, and removes the node. Run it through
//! `scripts/demo.sh --cluster`, which installs what it needs and builds the images.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use vmdhcp_integration::control_plane::repo_root;
use vmdhcp_integration::dhcp_client::{start_dhclient, wait_event, wait_for};
use vmdhcp_integration::netns::Lab;
use vmdhcp_integration::node::{Node, images_dir};
use vmdhcp_integration::process::workspace_binary;

const MANIFESTS: &str = r#"
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {name: net-a, namespace: vms}
spec: {config: '{"cniVersion":"0.3.1","type":"bridge","bridge":"brvm"}'}
---
apiVersion: network.harvesterhci.io/v1alpha1
kind: IPPool
metadata: {name: net-a, namespace: vms}
spec:
  networkName: vms/net-a
  ipv4Config:
    serverIP: 10.77.0.2
    cidr: 10.77.0.0/24
    pool: {start: 10.77.0.50, end: 10.77.0.99}
    router: 10.77.0.1
    dns: [10.77.0.53]
    leaseTime: 60
---
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: vm1, namespace: vms}
spec:
  running: true
  template:
    spec:
      domain: {devices: {interfaces: [{name: nic-0, macAddress: "02:77:00:00:00:01", bridge: {}}]}}
      networks: [{name: nic-0, multus: {networkName: vms/net-a}}]
"#;

fn step(text: &str) {
    println!("\n==> {text}");
}

fn run(mut cmd: Command) -> anyhow::Result<String> {
    let out = cmd.stdin(Stdio::null()).output()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(text)
}

fn kubectl(node: &Node, args: &[&str]) -> anyhow::Result<String> {
    let mut cmd = node.kubectl();
    cmd.args(args);
    run(cmd)
}

/// The holder of the agents' Lease (empty while nobody holds it).
fn agent_leader(node: &Node) -> anyhow::Result<String> {
    kubectl(
        node,
        &[
            "get",
            "lease",
            "-n",
            "vmdhcp-system",
            "vm-dhcp-agents",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ],
    )
}

fn main() -> anyhow::Result<()> {
    let node = start_node()?;
    install(&node)?;
    apply_and_roll(&node)?;
    // The VM's namespace and dhclient live until the end.
    let _vm = boot_vm(&node)?;
    fail_over(&node)?;
    step("helm uninstall; then the node and the VM namespace are removed");
    let mut helm = node.helm();
    helm.args([
        "uninstall",
        "vmdhcp",
        "--namespace",
        "vmdhcp-system",
        "--wait",
    ]);
    run(helm)?;
    println!("uninstalled; done");
    Ok(())
}

/// The single node, with the test manifests applied and the VM network's bridge.
fn start_node() -> anyhow::Result<Node> {
    step(
        "starting a single-node Kubernetes 1.20 (etcd, apiserver, controller-manager, scheduler, kube-proxy, containerd, kubelet)",
    );
    let started = Instant::now();
    let standin = workspace_binary("vmdhcp-integration", "vmdhcp-multus-standin");
    let node = Node::start(&images_dir(), &standin)?;
    println!(
        "node Ready in {:.0} s; our images imported into its containerd",
        started.elapsed().as_secs_f64()
    );
    kubectl(
        &node,
        &[
            "apply",
            "-f",
            &repo_root()
                .join("integration/manifests")
                .display()
                .to_string(),
        ],
    )?;
    node.ip(&["link", "add", "brvm", "type", "bridge"])?;
    node.ip(&["link", "set", "brvm", "up"])?;

    Ok(node)
}

/// `helm install` of the chart with its default values.
fn install(node: &Node) -> anyhow::Result<()> {
    step(
        "helm install vmdhcp chart/ --namespace vmdhcp-system --create-namespace --wait   (default values)",
    );
    let started = Instant::now();
    let mut helm = node.helm();
    helm.args(["install", "vmdhcp"])
        .arg(repo_root().join("chart"))
        .args([
            "--namespace",
            "vmdhcp-system",
            "--create-namespace",
            "--wait",
        ]);
    run(helm)?;
    println!(
        "installed and Ready in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    println!(
        "{}",
        kubectl(node, &["get", "pods", "-n", "vmdhcp-system", "-o", "wide"])?
    );

    Ok(())
}

/// A NAD, an IPPool and a VirtualMachine: allocated, and the agents roll with the network.
fn apply_and_roll(node: &Node) -> anyhow::Result<()> {
    step("kubectl apply: a NetworkAttachmentDefinition, an IPPool and a VirtualMachine");
    kubectl(node, &["create", "namespace", "vms"])?;
    let mut apply = node.kubectl();
    apply
        .args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut child = apply.spawn()?;
    child
        .stdin
        .take()
        .context("kubectl's stdin")?
        .write_all(MANIFESTS.as_bytes())?;
    println!(
        "{}",
        String::from_utf8_lossy(&child.wait_with_output()?.stdout)
    );
    wait_for("vm1's address", Duration::from_secs(60), || {
        kubectl(
            node,
            &[
                "get",
                "ippool",
                "-n",
                "vms",
                "net-a",
                "-o",
                "jsonpath={.status.ipv4.allocated}",
            ],
        )
        .ok()
        .filter(|s| s.contains("02:77:00:00:00:01"))
    });
    println!(
        "{}",
        kubectl(node, &["get", "ippool,vmnetcfg", "-n", "vms"])?
    );
    println!("the controller wrote the pool's network into the agent Deployment; the agents roll:");
    let generation = || {
        kubectl(
            node,
            &[
                "get",
                "deployment",
                "-n",
                "vmdhcp-system",
                "vmdhcp-agent",
                "-o",
                "jsonpath={.metadata.generation}",
            ],
        )
        .ok()
        .filter(|g| g.trim() != "1")
    };
    wait_for(
        "the controller's change to the agent Deployment",
        Duration::from_secs(60),
        generation,
    );
    kubectl(
        node,
        &[
            "rollout",
            "status",
            "-n",
            "vmdhcp-system",
            "deployment/vmdhcp-agent",
            "--timeout=180s",
        ],
    )?;
    println!(
        "{}",
        kubectl(node, &["get", "pods", "-n", "vmdhcp-system"])?
    );

    Ok(())
}

/// vm1 on the NAD's bridge runs dhclient and gets its address; returned to keep it running.
fn boot_vm(node: &Node) -> anyhow::Result<(Lab, tempfile::TempDir)> {
    step("a VM (a network namespace on the NAD's bridge) runs dhclient");
    let mut lab = Lab::new()?;
    let vm = lab.netns("vm1")?;
    lab.plug(&node.netns(), "brvm", "pvm1", &vm, "eth0")?;
    lab.exec(
        &vm,
        "ip",
        &["link", "set", "eth0", "address", "02:77:00:00:00:01"],
    )?;
    let dir = tempfile::tempdir()?;
    start_dhclient(&mut lab, &vm, dir.path());
    let bound = wait_event(dir.path(), "BOUND", 0, Duration::from_secs(60));
    println!(
        "vm1 got {} (router {}, DNS {}) from {}",
        bound["new_ip_address"],
        bound["new_routers"],
        bound["new_domain_name_servers"],
        bound
            .get("new_dhcp_server_identifier")
            .map_or("?", String::as_str)
    );

    Ok((lab, dir))
}

/// Deletes the leading agent pod; the standby takes over and reports the pool served.
fn fail_over(node: &Node) -> anyhow::Result<()> {
    step("kubectl delete pod <the leading agent>: the standby takes over");
    let leader = agent_leader(node)?;
    let deleted = Instant::now();
    kubectl(
        node,
        &[
            "delete",
            "pod",
            "-n",
            "vmdhcp-system",
            &leader,
            "--wait=false",
        ],
    )?;
    let new_leader = wait_for("a new agent leader", Duration::from_secs(30), || {
        agent_leader(node)
            .ok()
            .filter(|h| !h.is_empty() && *h != leader)
    });
    println!(
        "{leader} deleted; {new_leader} leads after {:.1} s",
        deleted.elapsed().as_secs_f64()
    );
    let ready = wait_for(
        "AgentReady from the new leader",
        Duration::from_secs(60),
        || {
            kubectl(
                node,
                &[
                    "get",
                    "ippool",
                    "-n",
                    "vms",
                    "net-a",
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"AgentReady\")].message}",
                ],
            )
            .ok()
            .filter(|m| m.contains(&new_leader))
        },
    );
    println!("IPPool vms/net-a AgentReady: {ready}");

    Ok(())
}
