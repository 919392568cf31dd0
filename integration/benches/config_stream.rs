//! Config-stream benchmark: 1 000 pools × 250 leases, 20 agents.
//!
//! Prints the time to build a full snapshot and to send + apply it (one agent from scratch), its
//! size on the wire, the change→applied latency (p50/p99) over 20 connected agents for 200
//! single-lease changes, and the process RSS (server and agents share this process; the figures
//! before and after the agents connect are printed so the server's part can be read off).
//!
//! `cargo bench -p vmdhcp-integration --bench config_stream`; `VMDHCP_STREAM_POOLS=<n>` and
//! `VMDHCP_STREAM_CHANGES=<n>` set the pools and the timed changes (defaults [`POOLS`] and
//! [`CHANGES`]), so that a small run (`scripts/bench-smoke.sh`) reaches the end quickly.
#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs
)]

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message;
use tokio::sync::watch;
use vmdhcp_agent::stream::{AppliedState, Applier, ClientSettings, ConfigSink, PoolDelta, run};
use vmdhcp_controller::index::{Index, Op, PoolFilter};
use vmdhcp_controller::reports::Reports;
use vmdhcp_controller::stream::config_service::{StreamSettings, serve, snapshot_parts};
use vmdhcp_core::MacAddr;
use vmdhcp_core::fixtures::pool_config;
use vmdhcp_core::pool::{Lease, PoolConfig};
use vmdhcp_integration::process::rss_mb;
use vmdhcp_proto::agent::v1 as pb;
use vmdhcp_proto::agent::v1::config_service_client::ConfigServiceClient;

const POOLS: u32 = 1000;
const LEASES: u32 = 250;
const AGENTS: usize = 20;
const CHANGES: u32 = 200;

/// `name`'s value, or `default` when it is unset or not a number.
fn env_u32(name: &str, default: u32) -> u32 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pool(i: u32) -> PoolConfig {
    let key = format!("tenant-{}/pool-{i}", i % 10);
    let net = Ipv4Addr::new(10, (i / 256) as u8, (i % 256) as u8, 0);
    PoolConfig {
        interface_name: vmdhcp_core::ifname::base_name(&key.parse().unwrap()),
        router: Some(Ipv4Addr::from(u32::from(net) + 254)),
        dns: vec![Ipv4Addr::new(10, 255, 0, 53)],
        domain_name: Some("example.test".into()),
        domain_search: vec!["example.test".into()],
        lease_seconds: 3600,
        ..pool_config(&key).with_subnet(&format!("{net}/24"))
    }
}

fn lease(p: &PoolConfig, i: u32, host: u32) -> Lease {
    let b = i.to_be_bytes();
    Lease {
        options: None,
        ipv6: None,
        pool: p.pool.clone(),
        mac: MacAddr([2, b[0], b[1], b[2], b[3], host as u8]),
        ip: Ipv4Addr::from(u32::from(p.subnet.network()) + 2 + host),
        host_name: None,
    }
}

/// Records when each revision was applied.
#[derive(Default)]
struct Recorder(Mutex<BTreeMap<u64, Instant>>);

impl ConfigSink for Recorder {
    fn snapshot(&self, state: &AppliedState) {
        self.0
            .lock()
            .unwrap()
            .insert(state.revision, Instant::now());
    }
    fn delta(&self, delta: &PoolDelta, _: &AppliedState) {
        self.0
            .lock()
            .unwrap()
            .insert(delta.revision, Instant::now());
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let pool_count = env_u32("VMDHCP_STREAM_POOLS", POOLS).max(1);
    let changes = env_u32("VMDHCP_STREAM_CHANGES", CHANGES).max(1);
    let rss_start = rss_mb("self");
    let index = Arc::new(Index::new());
    let pools: Vec<PoolConfig> = (0..pool_count).map(pool).collect();
    for p in &pools {
        index.apply(
            std::iter::once(Op::UpsertPool(Box::new(p.clone())))
                .chain((0..LEASES).map(|h| Op::UpsertLease(lease(p, h, h)))),
        );
    }
    let rss_index = rss_mb("self");

    let t = Instant::now();
    let parts = snapshot_parts(
        &index.snapshot(&PoolFilter::all()),
        StreamSettings::default().snapshot_part_leases,
    );
    let build = t.elapsed();
    let bytes: usize = parts.iter().map(|m| m.encoded_len()).sum();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stop_rx) = watch::channel(false);
    let server = tokio::spawn(serve(
        listener,
        index.clone(),
        Arc::new(Reports::default()),
        StreamSettings::default(),
        stop_rx,
    ));

    // One agent from scratch: request → every part received and applied.
    let t = Instant::now();
    let mut client = ConfigServiceClient::connect(url.clone())
        .await
        .unwrap()
        .max_decoding_message_size(64 << 20);
    let mut stream = client
        .watch(pb::WatchRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut applier = Applier::default();
    while applier.state().revision != index.revision() {
        let msg = stream.message().await.unwrap().unwrap();
        applier.apply(&msg).unwrap();
    }
    let send_apply = t.elapsed();
    assert_eq!(
        applier.state().lease_count(),
        (pool_count * LEASES) as usize
    );
    drop(stream);

    // The agents, then the single-lease changes, each waited for on every agent.
    let (agents_stop, agents_stop_rx) = watch::channel(false);
    let recorders: Vec<Arc<Recorder>> =
        (0..AGENTS).map(|_| Arc::new(Recorder::default())).collect();
    for (i, rec) in recorders.iter().enumerate() {
        let identity = pb::AgentIdentity {
            pod_name: format!("agent-{i}"),
            namespace: "bench".into(),
            node_name: "n".into(),
        };
        let (status, _) = watch::channel(Default::default());
        tokio::spawn(run(
            ClientSettings::new(url.clone(), identity),
            Applier::default(),
            rec.clone(),
            status,
            agents_stop_rx.clone(),
        ));
    }
    let wait_all = |revision: u64| {
        let recorders = recorders.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(120);
            while !recorders.iter().all(|r| {
                r.0.lock()
                    .unwrap()
                    .keys()
                    .next_back()
                    .is_some_and(|r| *r >= revision)
            }) {
                assert!(
                    Instant::now() < deadline,
                    "agents did not reach revision {revision}"
                );
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        }
    };
    let t = Instant::now();
    wait_all(index.revision()).await;
    let sync_all = t.elapsed();
    let rss_agents = rss_mb("self");

    let mut samples = Vec::new();
    for c in 0..changes {
        let p = &pools[(c * 7 % pool_count) as usize];
        let t0 = Instant::now();
        let rev = index
            .apply([Op::UpsertLease(lease(p, c % LEASES, (c + 1) % LEASES))])
            .unwrap();
        wait_all(rev).await;
        for r in &recorders {
            samples.push(r.0.lock().unwrap()[&rev].duration_since(t0));
        }
    }
    samples.sort();

    println!(
        "config stream: {pool_count} pools × {LEASES} leases = {} leases, {AGENTS} agents",
        pool_count * LEASES
    );
    println!(
        "  snapshot build (server)            {:>10.1} ms",
        build.as_secs_f64() * 1e3
    );
    println!(
        "  snapshot size on the wire          {:>10.1} MB in {} messages",
        bytes as f64 / 1e6,
        parts.len()
    );
    println!(
        "  snapshot request → applied (1)     {:>10.1} ms",
        send_apply.as_secs_f64() * 1e3
    );
    println!(
        "  snapshot to all {AGENTS} agents          {:>10.1} ms",
        sync_all.as_secs_f64() * 1e3
    );
    println!(
        "  change → applied, p50 ({} samples) {:>10.2} ms",
        samples.len(),
        percentile(&samples, 0.5).as_secs_f64() * 1e3
    );
    println!(
        "  change → applied, p99              {:>10.2} ms",
        percentile(&samples, 0.99).as_secs_f64() * 1e3
    );
    println!(
        "  change → applied, max              {:>10.2} ms",
        samples.last().unwrap().as_secs_f64() * 1e3
    );
    println!(
        "  RSS: start {rss_start:.0} MB, index built {rss_index:.0} MB, +{AGENTS} agents synced {rss_agents:.0} MB"
    );
    println!("  targets: snapshot < 1000 ms and < 40 MB; p99 < 50 ms");

    agents_stop.send_replace(true);
    stop.send_replace(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
}
