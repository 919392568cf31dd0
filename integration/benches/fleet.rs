//! Fleet benchmark, the whole system as processes (see `vmdhcp_integration::fleet`): failover
//! time of the agents (kill -9 and SIGTERM of the leader, `VMDHCP_BENCH_RUNS` runs each, default
//! 10) and propagation latency (VM created → its address offered, `VMDHCP_BENCH_VMS` VMs, default
//! 40; pool option changed → the next renewal carries it, `VMDHCP_BENCH_RUNS` changes).
//!
//! Times are measured by `integration/bench/dhcp_probe.py` in a VM namespace, which sends a fresh
//! transaction every 10 ms (real clients retry after seconds, which would measure their backoff,
//! not us); a failover is the time from the signal to the first answered REQUEST. Agents use a
//! 6 s Lease, 4 s renew deadline and 1 s retry period.
//!
//! `cargo bench -p vmdhcp-integration --bench fleet` (as root: network namespaces)
#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs
)]

use std::time::{Duration, Instant};

use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::json;
use vmdhcp_core::crd::IPPool;
use vmdhcp_integration::dhcp_client::wait_for;
use vmdhcp_integration::fleet::{
    Agent, LEASE_SECONDS, NS, Probe, RETRY_SECONDS, SERVER_IP, VM2_MAC, setup, vm_manifest,
};

/// Prints min, p50, p90, p99 and max of `samples` (seconds), and whether p99 meets `target`.
fn report(what: &str, samples: &mut [f64], target: Option<f64>) {
    samples.sort_by(f64::total_cmp);
    let at = |p: f64| {
        let rank = ((p * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
        samples[rank - 1]
    };
    let verdict = match target {
        Some(t) if at(0.99) <= t => format!("target ≤ {t} s: met"),
        Some(t) => format!("target ≤ {t} s: MISSED"),
        None => String::new(),
    };
    println!(
        "{what:<34} n={:<3} min {:>6.3}  p50 {:>6.3}  p90 {:>6.3}  p99 {:>6.3}  max {:>6.3} s   {verdict}",
        samples.len(),
        samples[0],
        at(0.5),
        at(0.9),
        at(0.99),
        samples[samples.len() - 1],
    );
}

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    // `cargo bench` passes --bench; there is nothing to filter.
    let runs = env_number("VMDHCP_BENCH_RUNS", 10);
    let vms = env_number("VMDHCP_BENCH_VMS", 40);
    let mut fleet = setup();
    let ip2 = fleet.allocated()[VM2_MAC].clone();
    let ns0 = fleet.agent_netns(0);
    let ns1 = fleet.agent_netns(1);
    let mut agents: Vec<Agent> = vec![
        fleet.start_agent(&ns0, "agent-0"),
        fleet.start_agent(&ns1, "agent-1"),
    ];
    let vm = fleet.vm("probe", VM2_MAC);
    fleet.lab.address(&vm, "eth0", "10.123.45.250/24").unwrap();
    let mut probe = Probe::start(&mut fleet.lab, &vm, 30);
    fleet.leader(&[&agents[0], &agents[1]]);
    probe.ask(&format!("request {VM2_MAC} {ip2}"));

    let mut crash = Vec::new();
    let mut graceful = Vec::new();
    for signal in ["KILL", "TERM"] {
        for _ in 0..runs {
            let leader = fleet.leader(&[&agents[0], &agents[1]]).identity.clone();
            let i = agents.iter().position(|a| a.identity == leader).unwrap();
            assert!(agents[i].process.signal(signal));
            let start = Instant::now();
            // Probe only once the old leader is silent (dead, or its server address gone: it
            // silences its sockets before removing addresses), so no answer can come from it.
            let interface = fleet.interface.clone();
            wait_for("the old leader silent", Duration::from_secs(15), || {
                let gone = agents[i].process.exited()
                    || !fleet
                        .lab
                        .exec(&agents[i].ns, "ip", &["-4", "addr", "show", &interface])
                        .unwrap_or_default()
                        .contains(SERVER_IP);
                gone.then_some(())
            });
            probe.ask(&format!("request {VM2_MAC} {ip2}"));
            let took = start.elapsed().as_secs_f64();
            if signal == "KILL" {
                &mut crash
            } else {
                &mut graceful
            }
            .push(took);
            wait_for("the old leader to exit", Duration::from_secs(15), || {
                agents[i].process.exited().then_some(())
            });
            let (ns, identity) = (agents[i].ns.clone(), agents[i].identity.clone());
            agents[i] = fleet.start_agent(&ns, &identity);
            // The replica comes back in its pod: ready, with one leader among the two (it may
            // win the Lease itself when the old leader released it).
            wait_for(
                "the restarted replica ready",
                Duration::from_secs(30),
                || {
                    fleet
                        .readyz(&agents[i])
                        .filter(|v| v["ready"] == true)
                        .map(|_| ())
                },
            );
            fleet.leader(&[&agents[0], &agents[1]]);
        }
    }

    // VM created → its address offered; option changed → the next renewal has it. The probe is
    // already sending when the create or patch request leaves (through the API, not kubectl, whose
    // start-up would be counted), and the time runs from just before that request.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt.block_on(fleet.cp.client()).unwrap();
    let vm_resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachine"),
        "virtualmachines",
    );
    let vm_api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &vm_resource);
    let pools: Api<IPPool> = Api::namespaced(client, NS);
    let mut created = Vec::new();
    for n in 0..vms {
        let mac = format!("02:12:35:00:00:{n:02x}");
        let vm: DynamicObject = serde_json::from_value(vm_manifest(
            NS,
            &format!("bench-{n}"),
            &mac,
            &format!("{NS}/net-a"),
        ))
        .unwrap();
        let command = format!("discover {mac}");
        probe.send(&command);
        let start = Instant::now();
        rt.block_on(vm_api.create(&PostParams::default(), &vm))
            .unwrap();
        probe.answered(&command);
        created.push(start.elapsed().as_secs_f64());
    }

    let mut changed = Vec::new();
    for n in 0..runs {
        let dns = format!("10.123.45.{}", 200 + n);
        let patch = json!({"spec": {"ipv4Config": {"dns": [dns]}}});
        let command = format!("request {VM2_MAC} {ip2} {dns}");
        probe.send(&command);
        let start = Instant::now();
        rt.block_on(pools.patch("pool-a", &PatchParams::default(), &Patch::Merge(&patch)))
            .unwrap();
        probe.answered(&command);
        changed.push(start.elapsed().as_secs_f64());
    }

    println!();
    println!(
        "fleet: 2 agents (Lease {LEASE_SECONDS} s, retry {RETRY_SECONDS} s), controller, real kube-apiserver; probe resolution 10 ms"
    );
    report(
        "failover, leader kill -9",
        &mut crash,
        Some((LEASE_SECONDS + 2) as f64),
    );
    report("failover, leader SIGTERM", &mut graceful, Some(3.0));
    report("VM created → address offered", &mut created, Some(1.0));
    report("option changed → renewal has it", &mut changed, None);
}
