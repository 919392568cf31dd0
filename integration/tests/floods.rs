//! The controller's two TLS listeners under connection floods (issue 38), through the real
//! kube-apiserver and one `vm-dhcp-controller` process.
//!
//! One hostile source address (127.0.0.2; the API server and the agents come from 127.0.0.1,
//! another peer) keeps thousands of connections going to the webhook and to the config stream:
//! idle TLS connections (handshake done, then silence) and slow-handshake connections (half a
//! ClientHello, dribbled a byte a second), re-opening every one the controller closes.
//! Meanwhile VirtualMachineNetworkConfigs created through the API server are admitted by the
//! webhook, an agent's Watch keeps receiving (heartbeats and the new leases), a new agent and a
//! new webhook client are served, and the controller never holds more of the hostile peer's
//! connections than its per-peer cap. The admission latency under the flood is printed beside
//! the idle one: a figure, not an assertion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;
use tokio::sync::watch;
use tokio::task::JoinSet;
use vmdhcp_agent::credentials::Credentials;
use vmdhcp_core::crd::VirtualMachineNetworkConfig;
use vmdhcp_integration::control_plane::ControlPlane;
use vmdhcp_integration::dhcp_client::wait_for_async;
use vmdhcp_integration::process::tcp_connections;
use vmdhcp_integration::secure_controller::SecureController;
use vmdhcp_proto::agent::v1 as pb;
use vmdhcp_proto::agent::v1::config_service_client::ConfigServiceClient;

#[path = "support/agent_watch.rs"]
mod agent_watch;
use agent_watch::watch_request;

/// The controller's namespace (its Secret, ConfigMap and the agents' ServiceAccount).
const NS: &str = "vmdhcp-floods";
/// The webhook registration's name.
const WEBHOOK: &str = "vmdhcp-floods";
/// Namespaces carrying this label are under the webhook.
const WEBHOOK_LABEL: &str = "vmdhcp.io/floods-test";
/// Where the flood comes from.
const HOSTILE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
/// Where the API server, the agents and the controller are.
const LOCAL: Ipv4Addr = Ipv4Addr::LOCALHOST;
/// Connections of each kind the hostile peer keeps trying to hold on each listener.
const SLOTS: usize = 2000;
/// How long a slot whose connection ended waits before it connects again, plus up to a second
/// of spread: a steady flood of hundreds of connections a second per kind and listener,
/// without running the loopback out of ports.
const RECONNECT: Duration = Duration::from_secs(3);
/// Admissions timed, idle and under the flood.
const SAMPLES: usize = 8;
/// Time between two timed admissions, so those under the flood span its reconnect rounds and
/// the controller's handshake timeout.
const SAMPLE_EVERY: Duration = Duration::from_millis(1500);
/// Seconds between heartbeats on an idle Watch, so the flood spans several.
const HEARTBEAT_SECONDS: u64 = 2;

/// What a flood of connections of one kind does to the listener.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// Completes the TLS handshake, then says nothing.
    IdleTls,
    /// Sends a TLS record header for a 512-byte ClientHello, then its body a byte a second.
    SlowHandshake,
}

/// What a flood's clients did.
#[derive(Default)]
struct Tally {
    /// TCP connections opened.
    connected: AtomicU64,
    /// TLS handshakes completed.
    handshakes: AtomicU64,
}

/// [`SLOTS`] clients of one kind against one port; every socket is closed when this drops
/// (the tasks holding them are aborted), on any exit path.
struct Flood {
    stop: watch::Sender<bool>,
    slots: JoinSet<()>,
    tally: Arc<Tally>,
}

impl Flood {
    fn start(port: u16, kind: Kind, tls: &Arc<rustls::ClientConfig>) -> Self {
        let (stop, stopped) = watch::channel(false);
        let tally = Arc::new(Tally::default());
        let mut slots = JoinSet::new();
        for n in 0..SLOTS {
            let spread = Duration::from_millis((n % 1000) as u64);
            slots.spawn(slot(
                port,
                kind,
                tls.clone(),
                tally.clone(),
                RECONNECT + spread,
                stopped.clone(),
            ));
        }
        Flood { stop, slots, tally }
    }

    fn connected(&self) -> u64 {
        self.tally.connected.load(Ordering::Relaxed)
    }

    fn handshakes(&self) -> u64 {
        self.tally.handshakes.load(Ordering::Relaxed)
    }

    /// Stops every client and waits until their sockets are closed.
    async fn stop(mut self) {
        self.stop.send_replace(true);
        let all = async { while self.slots.join_next().await.is_some() {} };
        tokio::time::timeout(Duration::from_secs(30), all)
            .await
            .expect("the flood's clients stop");
    }
}

/// One hostile client, again and again until stopped.
async fn slot(
    port: u16,
    kind: Kind,
    tls: Arc<rustls::ClientConfig>,
    tally: Arc<Tally>,
    pause: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let target = SocketAddr::from((LOCAL, port));
    loop {
        let attempt = async {
            let socket = TcpSocket::new_v4().ok()?;
            socket.bind(SocketAddr::from((HOSTILE, 0))).ok()?;
            let connect = tokio::time::timeout(Duration::from_secs(10), socket.connect(target));
            let mut tcp = connect.await.ok()?.ok()?;
            tally.connected.fetch_add(1, Ordering::Relaxed);
            match kind {
                Kind::IdleTls => {
                    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
                    let connector = tokio_rustls::TlsConnector::from(tls.clone());
                    let mut tls = connector.connect(name, tcp).await.ok()?;
                    tally.handshakes.fetch_add(1, Ordering::Relaxed);
                    // Silent; reads only to learn when the server ends the connection.
                    let mut buf = [0u8; 256];
                    while tls.read(&mut buf).await.is_ok_and(|n| n > 0) {}
                }
                Kind::SlowHandshake => {
                    tcp.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00]).await.ok()?;
                    let mut tick = tokio::time::interval(Duration::from_secs(1));
                    loop {
                        tick.tick().await;
                        tcp.write_all(&[0x01]).await.ok()?;
                    }
                }
            }
            Some(())
        };
        tokio::select! {
            _ = attempt => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        // Pacing of the attack, not a wait for anything.
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Raises this process's open-file limit to its hard limit: the flood holds thousands of
/// sockets at once.
fn raise_open_files(needed: u64) {
    let pid = std::process::id().to_string();
    let out = std::process::Command::new("prlimit")
        .args([
            "--pid",
            &pid,
            "--nofile",
            "--raw",
            "--noheadings",
            "--output=HARD",
        ])
        .output()
        .unwrap();
    let hard = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let status = std::process::Command::new("prlimit")
        .args(["--pid", &pid, &format!("--nofile={hard}:{hard}")])
        .status()
        .unwrap();
    assert!(status.success(), "prlimit failed");
    let raised: u64 = hard.parse().unwrap_or(u64::MAX);
    assert!(
        raised >= needed,
        "the flood needs {needed} open files; the hard limit is {hard}"
    );
}

/// An agent's Watch on the controller's stream.
async fn watch_stream(
    creds: &Credentials,
    port: u16,
    pod: &str,
) -> tonic::Streaming<pb::WatchResponse> {
    let channel = creds
        .endpoint(&format!("https://127.0.0.1:{port}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap();
    let request = watch_request(creds, NS, pod).unwrap();
    ConfigServiceClient::new(channel)
        .watch(request)
        .await
        .unwrap()
        .into_inner()
}

/// What an agent's Watch received so far.
#[derive(Clone, Debug, Default)]
struct Received {
    heartbeats: u64,
    macs: BTreeSet<String>,
    ended: Option<String>,
}

/// Reads `stream` to its end into `seen`.
async fn record(mut stream: tonic::Streaming<pb::WatchResponse>, seen: watch::Sender<Received>) {
    loop {
        let message = stream.message().await;
        seen.send_modify(|r| match &message {
            Ok(Some(m)) => match &m.event {
                Some(pb::watch_response::Event::Heartbeat(_)) => r.heartbeats += 1,
                Some(pb::watch_response::Event::Snapshot(s)) => r.macs.extend(
                    s.pools
                        .iter()
                        .flat_map(|p| &p.leases)
                        .map(|l| l.mac_address.clone()),
                ),
                Some(pb::watch_response::Event::Delta(d)) => r
                    .macs
                    .extend(d.upserted_leases.iter().map(|l| l.mac_address.clone())),
                None => {}
            },
            Ok(None) => r.ended = Some("the server ended the stream".into()),
            Err(status) => r.ended = Some(format!("{status:?}")),
        });
        if !matches!(message, Ok(Some(_))) {
            return;
        }
    }
}

/// The most connections the controller held at once from each address on each port, sampled
/// from its sockets until dropped.
#[derive(Default)]
struct Held {
    hostile_webhook: AtomicU64,
    hostile_stream: AtomicU64,
    local_webhook: AtomicU64,
    local_stream: AtomicU64,
}

async fn sample_held(pid: u32, webhook: u16, stream: u16, held: Arc<Held>) {
    loop {
        for (port, peer, max) in [
            (webhook, HOSTILE, &held.hostile_webhook),
            (stream, HOSTILE, &held.hostile_stream),
            (webhook, LOCAL, &held.local_webhook),
            (stream, LOCAL, &held.local_stream),
        ] {
            max.fetch_max(tcp_connections(pid, port, peer) as u64, Ordering::Relaxed);
        }
        // Sampling period, not a wait for anything.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn mac(n: usize) -> String {
    format!("02:00:00:80:{:02x}:{:02x}", (n >> 8) & 0xff, n & 0xff)
}

/// Creates the VMNetCfg `name` for `mac` on `ns/net` through the API server (the webhook
/// judges it): how long the API server took to admit it, or its refusal.
async fn create_config(
    client: &Client,
    ns: &str,
    name: &str,
    mac: &str,
) -> Result<Duration, String> {
    let config: VirtualMachineNetworkConfig = serde_json::from_value(json!({
        "apiVersion": "network.harvesterhci.io/v1alpha1", "kind": "VirtualMachineNetworkConfig",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"vmName": name, "networkConfigs": [{"networkName": format!("{ns}/net"), "macAddress": mac}]}
    }))
    .unwrap();
    let api: Api<VirtualMachineNetworkConfig> = Api::namespaced(client.clone(), ns);
    let started = Instant::now();
    api.create(&PostParams::default(), &config)
        .await
        .map(|_| started.elapsed())
        .map_err(|e| e.to_string())
}

/// Times [`SAMPLES`] admissions of configs numbered from `first`; each must be admitted.
async fn admissions(client: &Client, ns: &str, first: usize) -> Vec<Duration> {
    let mut took = Vec::new();
    for n in first..first + SAMPLES {
        let admitted = create_config(client, ns, &format!("vm-{n}"), &mac(n)).await;
        took.push(admitted.unwrap_or_else(|e| panic!("vm-{n} not admitted: {e}")));
        // Spacing of the samples, not a wait for anything.
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
    took.sort();
    took
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::test(flavor = "multi_thread")]
async fn both_listeners_serve_while_one_peer_floods_them() {
    raise_open_files(4 * SLOTS as u64 + 2000);
    let cap = vmdhcp_controller::security::listener::Limits::default().per_peer as u64;
    let cp = ControlPlane::shared();
    let heartbeat = format!("--heartbeat-seconds={HEARTBEAT_SECONDS}");
    let (controller, (ca_pem, ca_file), token) = tokio::task::spawn_blocking(move || {
        let controller =
            SecureController::start(cp, WEBHOOK, NS, WEBHOOK_LABEL, &[heartbeat.as_str()]);
        let (ca, token) = (controller.ca(), controller.agent_token());
        (controller, ca, token)
    })
    .await
    .unwrap();
    let pid = controller.pid();
    let client = cp.client().await.unwrap();

    // A pool and its network in a namespace under the webhook.
    let ns = cp.namespace(&client, "floods").await.unwrap();
    let manifest = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
         "metadata": {"name": "net", "namespace": ns, "labels": {
             "network.harvesterhci.io/ippool-namespace": ns,
             "network.harvesterhci.io/ippool-name": "pool"}},
         "spec": {"config": "{\"cniVersion\":\"0.3.1\",\"type\":\"bridge\"}"}},
        {"apiVersion": "network.harvesterhci.io/v1alpha1", "kind": "IPPool",
         "metadata": {"name": "pool", "namespace": ns},
         "spec": {"networkName": format!("{ns}/net"), "ipv4Config": {
             "cidr": "10.80.0.0/24", "serverIP": "10.80.0.2", "router": "10.80.0.1",
             "pool": {"start": "10.80.0.10", "end": "10.80.0.200"}}}},
    ]});
    cp.kubectl_stdin(&["apply", "-f", "-"], &manifest.to_string())
        .unwrap();
    cp.kubectl_stdin(
        &["label", "namespace", &ns, &format!("{WEBHOOK_LABEL}=on")],
        "",
    )
    .unwrap();
    // The webhook admits once its caches hold the pool; this also opens the API server's
    // connection to it.
    let mut warm = 0;
    wait_for_async(
        "a first config admitted",
        Duration::from_secs(60),
        Duration::from_millis(200),
        async || {
            warm += 1;
            let name = format!("warm-{warm}");
            create_config(&client, &ns, &name, &mac(1000 + warm))
                .await
                .ok()
        },
    )
    .await;

    // An agent streaming from before the flood to after it.
    let creds = Credentials {
        ca_file: Some(ca_file),
        token_file: Some(token),
    };
    let (seen_tx, seen) = watch::channel(Received::default());
    let mut background = JoinSet::new();
    background.spawn(record(
        watch_stream(&creds, controller.grpc, "agent-0").await,
        seen_tx,
    ));

    let idle = admissions(&client, &ns, 0).await;

    // The flood: both kinds on both listeners, from one address.
    let held = Arc::new(Held::default());
    background.spawn(sample_held(
        pid,
        controller.webhook,
        controller.grpc,
        held.clone(),
    ));
    let tls = vmdhcp_integration::tls::client_config(&ca_pem);
    let floods = [
        (
            "webhook idle TLS",
            Flood::start(controller.webhook, Kind::IdleTls, &tls),
        ),
        (
            "webhook slow handshake",
            Flood::start(controller.webhook, Kind::SlowHandshake, &tls),
        ),
        (
            "stream idle TLS",
            Flood::start(controller.grpc, Kind::IdleTls, &tls),
        ),
        (
            "stream slow handshake",
            Flood::start(controller.grpc, Kind::SlowHandshake, &tls),
        ),
    ];
    // Under way: every slot connected at least once, and the controller holds the hostile
    // peer's cap on both listeners.
    wait_for_async(
        "the flood at full strength",
        Duration::from_secs(120),
        Duration::from_millis(100),
        async || {
            let connected = floods.iter().all(|(_, f)| f.connected() >= SLOTS as u64);
            let at_cap = [controller.webhook, controller.grpc]
                .iter()
                .all(|port| tcp_connections(pid, *port, HOSTILE) as u64 == cap);
            (connected && at_cap).then_some(())
        },
    )
    .await;
    let heartbeats_before = seen.borrow().heartbeats;

    let flooded = admissions(&client, &ns, SAMPLES).await;
    // A new client of each listener is served: the accept loops are not stalled.
    let fresh = Instant::now();
    let mut tls_stream = tokio::time::timeout(
        Duration::from_secs(30),
        vmdhcp_integration::tls::connect(controller.webhook, &ca_pem, "127.0.0.1"),
    )
    .await
    .expect("a new webhook client is served under the flood");
    let fresh_webhook = fresh.elapsed();
    tls_stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut reply = String::new();
    tls_stream.read_to_string(&mut reply).await.unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    let fresh = Instant::now();
    let mut second = watch_stream(&creds, controller.grpc, "agent-1").await;
    let first = tokio::time::timeout(Duration::from_secs(10), second.message()).await;
    assert!(
        matches!(first, Ok(Ok(Some(_)))),
        "a new agent is not served under the flood: {first:?}"
    );
    let fresh_agent = fresh.elapsed();
    // The agent that streamed all along has the leases admitted under the flood and its
    // heartbeats.
    let flood_macs: Vec<String> = (SAMPLES..2 * SAMPLES).map(mac).collect();
    let mut seen_rx = seen.clone();
    let received = tokio::time::timeout(
        Duration::from_secs(60),
        seen_rx.wait_for(|r| {
            r.ended.is_some()
                || (flood_macs.iter().all(|m| r.macs.contains(m))
                    && r.heartbeats >= heartbeats_before + 2)
        }),
    )
    .await
    .expect("the agent's stream to carry the leases and heartbeats")
    .unwrap()
    .clone();
    assert_eq!(
        received.ended, None,
        "the agent's stream ended under the flood"
    );

    let attempts: Vec<(&str, u64, u64)> = floods
        .iter()
        .map(|(what, f)| (*what, f.connected(), f.handshakes()))
        .collect();
    let most = |m: &AtomicU64| m.load(Ordering::Relaxed);
    let (hostile_webhook, hostile_stream) =
        (most(&held.hostile_webhook), most(&held.hostile_stream));
    for (_, flood) in floods {
        flood.stop().await;
    }
    // The places are given back once the hostile clients are gone.
    wait_for_async(
        "the hostile connections released",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || {
            (tcp_connections(pid, controller.webhook, HOSTILE) == 0
                && tcp_connections(pid, controller.grpc, HOSTILE) == 0)
                .then_some(())
        },
    )
    .await;
    background.shutdown().await;

    let median = |d: &[Duration]| ms(d[d.len() / 2]);
    let max = |d: &[Duration]| ms(*d.last().unwrap());
    println!(
        "admission latency through the API server: idle median {:.1} ms (max {:.1}), \
         under the flood median {:.1} ms (max {:.1})",
        median(&idle),
        max(&idle),
        median(&flooded),
        max(&flooded),
    );
    println!(
        "under the flood: new webhook TLS client {:.1} ms, new agent's first message {:.1} ms",
        ms(fresh_webhook),
        ms(fresh_agent)
    );
    for (what, connected, handshakes) in &attempts {
        println!("{what}: {connected} connections opened, {handshakes} TLS handshakes completed");
    }
    println!(
        "held by the controller from the hostile peer at most: webhook {hostile_webhook}, \
         stream {hostile_stream} (cap {cap}); from 127.0.0.1: webhook {}, stream {}",
        most(&held.local_webhook),
        most(&held.local_stream)
    );
    // A refused connection lives between its accept and its close, in one step of the loop:
    // a sample may catch that one beside the cap.
    assert!(
        hostile_webhook <= cap + 1 && hostile_stream <= cap + 1,
        "the controller held more than its per-peer cap {cap}: webhook {hostile_webhook}, \
         stream {hostile_stream}\n{}",
        controller.log_tail(30)
    );
    for (what, connected, _) in &attempts {
        assert!(
            *connected >= SLOTS as u64,
            "{what}: only {connected} connections"
        );
    }
}
