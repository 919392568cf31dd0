//! The config stream end to end: the controller's real gRPC server on loopback, the agent's real
//! stream client, and real `grpcurl`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::{Stream, StreamExt};
use prost::Message as _;
use prost::bytes::BufMut as _;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http;
use tonic::server::NamedService;
use vmdhcp_agent::stream::{AppliedState, Applier, ClientSettings, ConnectionStatus, run};
use vmdhcp_controller::index::{Index, Op, PoolFilter};
use vmdhcp_controller::reports::Reports;
use vmdhcp_controller::stream::config_service::{StreamSettings, serve};
use vmdhcp_core::MacAddr;
use vmdhcp_core::fixtures::pool_config;
use vmdhcp_core::pool::{Binding, Lease, PoolConfig, PoolConfigV6};
use vmdhcp_proto::agent::v1 as pb;
use vmdhcp_proto::agent::v1::config_service_client::ConfigServiceClient;
use vmdhcp_proto::agent::v1::config_service_server::{
    ConfigService, ConfigServiceServer, SERVICE_NAME,
};

const DEADLINE: Duration = Duration::from_secs(20);

fn pool(name: &str, octet: u8) -> PoolConfig {
    let key = format!("ns/{name}");
    PoolConfig {
        interface_name: vmdhcp_core::ifname::base_name(&key.parse().unwrap()),
        router: Some(Ipv4Addr::new(10, octet, 0, 254)),
        dns: vec![Ipv4Addr::new(10, octet, 0, 53)],
        domain_name: Some("example.test".into()),
        domain_search: vec!["example.test".into()],
        ntp: vec!["ntp.example.test".into()],
        lease_seconds: 600,
        ..pool_config(&key).with_subnet(&format!("10.{octet}.0.0/16"))
    }
}

/// `config` as a dual-stack pool: `fd00:<octet>::/112`, server `::1`.
fn dual(config: PoolConfig, octet: u8) -> PoolConfig {
    PoolConfig {
        ipv6: Some(PoolConfigV6 {
            conflicted: Default::default(),
            server_ip: format!("fd00:{octet:x}::1").parse().unwrap(),
            subnet: format!("fd00:{octet:x}::/112").parse().unwrap(),
            dns: vec![format!("fd00:{octet:x}::53").parse().unwrap()],
            lease_seconds: 600,
            router_advertisements: false,
            router: None,
            boot: None,
        }),
        ..config
    }
}

/// `lease` with its IPv6 address on a [`dual`] pool: `fd00:<octet>::<host + 0x10>`.
fn with_v6(lease: Lease, octet: u8, host: u32) -> Lease {
    Lease {
        ipv6: Some(
            format!("fd00:{octet:x}::{:x}", host + 0x10)
                .parse()
                .unwrap(),
        ),
        ..lease
    }
}

fn lease(name: &str, octet: u8, i: u32, host: u32) -> Lease {
    let b = i.to_be_bytes();
    Lease {
        options: None,
        ipv6: None,
        pool: format!("ns/{name}").parse().unwrap(),
        mac: MacAddr([0x02, octet, b[0], b[1], b[2], b[3]]),
        ip: Ipv4Addr::from(u32::from(Ipv4Addr::new(10, octet, 0, 0)) + 2 + host),
        host_name: None,
    }
}

async fn bind(addr: SocketAddr) -> TcpListener {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_reuseaddr(true).unwrap();
    socket.bind(addr).unwrap();
    socket.listen(128).unwrap()
}

/// A controller's config server on loopback.
struct Server {
    addr: SocketAddr,
    reports: Arc<Reports>,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Server {
    async fn start(index: Arc<Index>, addr: SocketAddr, settings: StreamSettings) -> Server {
        let listener = bind(addr).await;
        let addr = listener.local_addr().unwrap();
        let reports = Arc::new(Reports::default());
        let (shutdown, rx) = watch::channel(false);
        let task = tokio::spawn({
            let (index, reports) = (index.clone(), reports.clone());
            async move { serve(listener, index, reports, settings, rx).await.unwrap() }
        });
        Server {
            addr,
            reports,
            shutdown,
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    async fn stop(self) {
        self.shutdown.send_replace(true);
        tokio::time::timeout(DEADLINE, self.task)
            .await
            .expect("server drains")
            .unwrap();
    }
}

fn fast_stream() -> StreamSettings {
    StreamSettings {
        heartbeat: Duration::from_millis(500),
        ..StreamSettings::default()
    }
}

/// An agent's stream client in the background, with its applied state observable.
struct Agent {
    state: watch::Receiver<Arc<AppliedState>>,
    status: watch::Receiver<ConnectionStatus>,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<Applier>,
}

impl Agent {
    fn start(url: &str, name: &str) -> Agent {
        let identity = pb::AgentIdentity {
            pod_name: name.into(),
            namespace: "vmdhcp".into(),
            node_name: "node-1".into(),
        };
        let mut settings = ClientSettings::new(url, identity);
        settings.backoff_min = Duration::from_millis(50);
        settings.backoff_max = Duration::from_millis(400);
        settings.idle_timeout = Duration::from_secs(3);
        let (state_tx, state) = watch::channel(Arc::new(AppliedState::default()));
        let (status_tx, status) = watch::channel(ConnectionStatus::default());
        let (shutdown, rx) = watch::channel(false);
        let task = tokio::spawn(run(
            settings,
            Applier::default(),
            Arc::new(state_tx),
            status_tx,
            rx,
        ));
        Agent {
            state,
            status,
            shutdown,
            task,
        }
    }

    /// Waits until the applied state satisfies `pred`.
    async fn wait_for(
        &mut self,
        what: &str,
        pred: impl Fn(&AppliedState) -> bool,
    ) -> Arc<AppliedState> {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let current = self.state.borrow_and_update().clone();
            if pred(&current) {
                return current;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "agent never reached: {what}; at {}@{}; status {:?}",
                current.epoch,
                current.revision,
                *self.status.borrow()
            );
            let _ = tokio::time::timeout(left, self.state.changed()).await;
        }
    }

    async fn stop(self) -> Applier {
        self.shutdown.send_replace(true);
        tokio::time::timeout(DEADLINE, self.task)
            .await
            .expect("client stops")
            .unwrap()
    }
}

/// Epoch, revision and every pool with its leases: what the agent must have applied.
type View = (
    String,
    u64,
    BTreeMap<String, (PoolConfig, BTreeMap<MacAddr, Binding>)>,
);

/// The index's view as the agent should have applied it.
fn expected(index: &Index) -> View {
    let snap = index.snapshot(&PoolFilter::all());
    let pools = snap
        .pools
        .into_iter()
        .map(|(c, l)| (c.pool.to_string(), (c, l.into_iter().collect())))
        .collect();
    (snap.epoch.to_string(), snap.revision, pools)
}

fn applied(state: &AppliedState) -> View {
    let pools = state
        .pools
        .iter()
        .map(|(k, p)| (k.to_string(), (p.config.clone(), p.leases.clone())))
        .collect();
    (state.epoch.clone(), state.revision, pools)
}

fn seeded_index() -> Arc<Index> {
    let index = Arc::new(Index::new());
    // Pool b is dual-stack: its config and leases carry their IPv6 side through the stream.
    index.apply([
        Op::UpsertPool(Box::new(pool("a", 1))),
        Op::UpsertPool(Box::new(dual(pool("b", 2), 2))),
    ]);
    index.apply((0..50).map(|i| Op::UpsertLease(lease("a", 1, i, i))));
    index.apply((0..30).map(|i| Op::UpsertLease(with_v6(lease("b", 2, i, i), 2, i))));
    index
}

async fn raw_watch(url: &str, epoch: &str, revision: u64) -> tonic::Streaming<pb::WatchResponse> {
    let mut client = ConfigServiceClient::connect(url.to_owned()).await.unwrap();
    let req = pb::WatchRequest {
        agent: None,
        epoch: epoch.into(),
        revision,
        pool_refs: vec![],
    };
    client.watch(req).await.unwrap().into_inner()
}

async fn next(stream: &mut tonic::Streaming<pb::WatchResponse>) -> pb::WatchResponse {
    tokio::time::timeout(DEADLINE, stream.message())
        .await
        .expect("a message in time")
        .unwrap()
        .expect("stream open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_applies_snapshot_then_every_delta_in_order() {
    let index = seeded_index();
    let server = Server::start(index.clone(), "127.0.0.1:0".parse().unwrap(), fast_stream()).await;
    let mut agent = Agent::start(&server.url(), "agent-0");
    let rev = index.revision();
    agent.wait_for("the snapshot", |s| s.revision == rev).await;
    assert_eq!(applied(&agent.state.borrow()), expected(&index));

    // Changes of every kind, one revision each; the agent follows to the exact state.
    index.apply([Op::UpsertLease(lease("a", 1, 0, 40))]);
    index.apply([Op::RemoveLease(
        "ns/a".parse().unwrap(),
        lease("a", 1, 1, 1).mac,
    )]);
    index.apply([Op::UpsertPool(Box::new(PoolConfig {
        lease_seconds: 60,
        ..pool("b", 2)
    }))]);
    index.apply([
        Op::UpsertPool(Box::new(dual(pool("c", 3), 3))),
        Op::UpsertLease(with_v6(lease("c", 3, 0, 0), 3, 0)),
    ]);
    index.apply([Op::RemovePool("ns/b".parse().unwrap())]);
    let rev = index.revision();
    let state = agent.wait_for("all deltas", |s| s.revision == rev).await;
    assert_eq!(applied(&state), expected(&index));
    assert!(!state.pools.contains_key(&"ns/b".parse().unwrap()));
    let status = agent.status.borrow().clone();
    assert!(
        status.connected && status.synced && status.rejected == 0,
        "{status:?}"
    );
    assert_eq!(status.connects, 1);

    agent.stop().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_yields_exactly_the_missed_changes_and_unknown_epoch_a_snapshot() {
    let index = seeded_index();
    let server = Server::start(index.clone(), "127.0.0.1:0".parse().unwrap(), fast_stream()).await;
    let (epoch, since) = (index.epoch().to_string(), index.revision());
    index.apply([Op::UpsertLease(lease("a", 1, 7, 45))]);
    index.apply([
        Op::UpsertLease(lease("a", 1, 7, 46)),
        Op::RemoveLease("ns/b".parse().unwrap(), lease("b", 2, 3, 3).mac),
    ]);

    let mut stream = raw_watch(&server.url(), &epoch, since).await;
    let msg = next(&mut stream).await;
    let Some(pb::watch_response::Event::Delta(d)) = msg.event else {
        panic!("expected a delta, got {msg:?}")
    };
    assert_eq!((d.base_revision, msg.revision), (since, since + 2));
    assert_eq!(
        d.upserted_leases,
        [pb::Lease::from(&lease("a", 1, 7, 46))],
        "coalesced to the latest address"
    );
    assert_eq!(
        d.removed_leases,
        [pb::LeaseKey {
            pool_ref: "ns/b".into(),
            mac_address: lease("b", 2, 3, 3).mac.to_string()
        }]
    );
    assert!(d.upserted_pools.is_empty() && d.removed_pools.is_empty());
    // Then, with nothing new, heartbeats at the same revision.
    let msg = next(&mut stream).await;
    assert!(
        matches!(msg.event, Some(pb::watch_response::Event::Heartbeat(_)))
            && msg.revision == since + 2,
        "{msg:?}"
    );

    // Up to date: a heartbeat right away, no snapshot.
    let mut stream = raw_watch(&server.url(), &epoch, index.revision()).await;
    assert!(matches!(
        next(&mut stream).await.event,
        Some(pb::watch_response::Event::Heartbeat(_))
    ));

    // Unknown epoch (another replica, a restarted controller) or a future revision: a snapshot.
    for (e, r) in [
        ("someone-else", since),
        (epoch.as_str(), index.revision() + 10),
        ("", 0),
    ] {
        let mut stream = raw_watch(&server.url(), e, r).await;
        let msg = next(&mut stream).await;
        let Some(pb::watch_response::Event::Snapshot(s)) = msg.event else {
            panic!("expected a snapshot for {e}@{r}")
        };
        assert!(!s.more);
        assert_eq!(msg.revision, index.revision());
        assert_eq!(s.pools.iter().map(|p| p.leases.len()).sum::<usize>(), 79);
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_agent_costs_no_queue_and_does_not_delay_another() {
    let index = Arc::new(Index::with_limits(64, 100_000));
    index.apply([Op::UpsertPool(Box::new(pool("a", 1)))]);
    index.apply((0..4000).map(|i| Op::UpsertLease(lease("a", 1, i, i))));
    let server = Server::start(index.clone(), "127.0.0.1:0".parse().unwrap(), fast_stream()).await;

    // The stalled agent opens a stream and reads nothing.
    let mut stalled = raw_watch(&server.url(), "", 0).await;
    let mut live = Agent::start(&server.url(), "live");
    live.wait_for("the first snapshot", |s| s.lease_count() == 4000)
        .await;

    // 300 revisions that each move all 4000 leases: ~70 MB of deltas if anything queued them.
    for round in 1..=300u32 {
        index.apply((0..4000).map(|i| Op::UpsertLease(lease("a", 1, i, (i + round) % 60000))));
        if round % 50 == 0 {
            // The live agent keeps up while the other one is stalled.
            live.wait_for("the latest revision", |s| s.revision == index.revision())
                .await;
        }
    }
    let rev = index.revision();
    let live_state = live
        .wait_for("the final revision", |s| s.revision == rev)
        .await;
    assert_eq!(applied(&live_state), expected(&index));

    // The stalled agent now reads: what was in flight, then at most one coalesced catch-up.
    let mut applier = Applier::default();
    let mut messages = 0;
    while applier.state().revision != rev {
        let msg = next(&mut stalled).await;
        messages += 1;
        applier.apply(&msg).unwrap();
    }
    assert_eq!(applied(applier.state()), expected(&index));
    assert!(
        messages < 30,
        "the stalled stream had {messages} messages queued for 300 revisions"
    );
    assert!(index.history_len() <= 64);

    live.stop().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_restart_resyncs_agents_without_losing_a_lease() {
    let index = seeded_index();
    let server = Server::start(index.clone(), "127.0.0.1:0".parse().unwrap(), fast_stream()).await;
    let addr = server.addr;
    let mut agent = Agent::start(&server.url(), "agent-0");
    let before = agent
        .wait_for("the snapshot", |s| s.revision == index.revision())
        .await;

    server.stop().await;
    let deadline = Instant::now() + DEADLINE;
    while agent.status.borrow().connected {
        assert!(
            Instant::now() < deadline,
            "agent never noticed the controller was gone"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        **agent.state.borrow(),
        *before,
        "the last good state is kept while disconnected"
    );

    // A new controller process: new epoch, same leases recorded in etcd, plus one more.
    let restarted = Arc::new(Index::new());
    let snap = index.snapshot(&PoolFilter::all());
    restarted.apply(snap.pools.iter().flat_map(|(c, leases)| {
        std::iter::once(Op::UpsertPool(Box::new(c.clone()))).chain(
            leases
                .iter()
                .map(|(m, b)| Op::UpsertLease(b.lease(c.pool.clone(), *m))),
        )
    }));
    restarted.apply([Op::UpsertLease(lease("a", 1, 99, 99))]);
    let server = Server::start(restarted.clone(), addr, fast_stream()).await;
    let epoch = restarted.epoch().to_string();
    let after = agent.wait_for("the new epoch", |s| s.epoch == epoch).await;
    assert_eq!(applied(&after), expected(&restarted));
    assert_eq!(
        after.lease_count(),
        before.lease_count() + 1,
        "no lease lost"
    );
    assert!(agent.status.borrow().connects >= 2);

    agent.stop().await;
    server.stop().await;
}

/// The one snapshot the test doubles below send first: pool `ns/a` with one lease.
fn first_snapshot() -> pb::WatchResponse {
    pb::WatchResponse {
        epoch: "e1".into(),
        revision: 1,
        trace_context: Default::default(),
        event: Some(pb::watch_response::Event::Snapshot(pb::Snapshot {
            pools: vec![pb::PoolSnapshot {
                config: Some(pb::PoolConfig::from(&pool("a", 1))),
                leases: vec![pb::LeaseEntry {
                    options: None,
                    ipv6_address: String::new(),
                    mac_address: "02:01:00:00:00:01".into(),
                    ip_address: "10.1.0.10".into(),
                    host_name: String::new(),
                }],
            }],
            more: false,
        })),
    }
}

/// Test double of a faulty controller (ours never sends such messages, so the real one cannot
/// play this part): a valid snapshot, then whatever `script` says, and it records each request.
#[derive(Clone)]
struct MisbehavingController {
    script: Vec<Result<pb::WatchResponse, tonic::Status>>,
    requests: Arc<Mutex<Vec<pb::WatchRequest>>>,
}

#[tonic::async_trait]
impl ConfigService for MisbehavingController {
    type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchResponse, tonic::Status>> + Send>>;

    async fn watch(
        &self,
        request: tonic::Request<pb::WatchRequest>,
    ) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
        let mut requests = self.requests.lock().unwrap();
        requests.push(request.into_inner());
        let first = requests.len() == 1;
        drop(requests);
        let mut items = vec![Ok(first_snapshot())];
        if first {
            items.extend(self.script.clone());
        }
        let stream = futures_util::stream::iter(items).chain(futures_util::stream::pending());
        Ok(tonic::Response::new(Box::pin(stream)))
    }

    async fn report(
        &self,
        _: tonic::Request<pb::ReportRequest>,
    ) -> Result<tonic::Response<pb::ReportResponse>, tonic::Status> {
        Ok(tonic::Response::new(pb::ReportResponse {}))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_messages_are_rejected_not_applied_and_a_snapshot_is_requested() {
    let bad_delta = |base: u64, revision: u64, ip: &str| pb::WatchResponse {
        epoch: "e1".into(),
        revision,
        trace_context: Default::default(),
        event: Some(pb::watch_response::Event::Delta(pb::Delta {
            base_revision: base,
            upserted_leases: vec![pb::Lease {
                options: None,
                ipv6_address: String::new(),
                pool_ref: "ns/a".into(),
                mac_address: "02:01:00:00:00:02".into(),
                ip_address: ip.into(),
                host_name: String::new(),
            }],
            ..Default::default()
        })),
    };
    let scripts: Vec<(&str, Vec<Result<pb::WatchResponse, tonic::Status>>)> = vec![
        (
            "invalid field value",
            vec![Ok(bad_delta(1, 2, "10.1.0.999"))],
        ),
        ("revision gap", vec![Ok(bad_delta(5, 6, "10.1.0.11"))]),
        (
            "message without event",
            vec![Ok(pb::WatchResponse {
                epoch: "e1".into(),
                revision: 2,
                trace_context: Default::default(),
                event: None,
            })],
        ),
        (
            "stream error mid-way",
            vec![Err(tonic::Status::internal(
                "failed to decode Protobuf message",
            ))],
        ),
    ];
    for (case, script) in scripts {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let fake = MisbehavingController {
            script,
            requests: requests.clone(),
        };
        let listener = bind("127.0.0.1:0".parse().unwrap()).await;
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(ConfigServiceServer::new(fake))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let mut agent = Agent::start(&format!("http://{addr}"), "agent-0");
        agent.wait_for("the snapshot", |s| s.revision == 1).await;
        let deadline = Instant::now() + DEADLINE;
        while requests.lock().unwrap().len() < 2 {
            assert!(Instant::now() < deadline, "{case}: agent never reconnected");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let state = agent.state.borrow().clone();
        assert_eq!(state.lease_count(), 1, "{case}: bad message applied");
        assert_eq!(
            state.pools.values().next().unwrap().leases.values().next(),
            Some(&Binding::ip(Ipv4Addr::new(10, 1, 0, 10)))
        );
        let second = requests.lock().unwrap()[1].clone();
        let status = agent.status.borrow().clone();
        if case == "stream error mid-way" {
            assert_eq!(
                (second.epoch.as_str(), second.revision),
                ("e1", 1),
                "{case}: resumes by revision"
            );
        } else {
            assert_eq!(
                (second.epoch.as_str(), second.revision),
                ("", 0),
                "{case}: asks for a fresh snapshot"
            );
            assert!(status.rejected >= 1, "{case}: {status:?}");
        }
        assert!(status.last_error.is_some(), "{case}: {status:?}");
        agent.stop().await;
        server.abort();
    }
}

/// Test double of a controller that puts raw bytes on the wire (ours cannot: tonic encodes every
/// message it sends): each Watch gets the snapshot, and the first one then gets `frames`, each sent
/// verbatim as one gRPC message, and stays open.
#[derive(Clone)]
struct GarbageController {
    frames: Vec<Vec<u8>>,
    requests: Arc<Mutex<Vec<pb::WatchRequest>>>,
}

/// [`GarbageController`]'s codec: decodes requests, writes each response item as is.
#[derive(Clone, Copy)]
struct VerbatimCodec;

impl Codec for VerbatimCodec {
    type Encode = Vec<u8>;
    type Decode = pb::WatchRequest;
    type Encoder = VerbatimCodec;
    type Decoder = VerbatimCodec;

    fn encoder(&mut self) -> VerbatimCodec {
        VerbatimCodec
    }

    fn decoder(&mut self) -> VerbatimCodec {
        VerbatimCodec
    }
}

impl Encoder for VerbatimCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for VerbatimCodec {
    type Item = pb::WatchRequest;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        src: &mut DecodeBuf<'_>,
    ) -> Result<Option<pb::WatchRequest>, tonic::Status> {
        pb::WatchRequest::decode(src)
            .map(Some)
            .map_err(|e| tonic::Status::internal(e.to_string()))
    }
}

impl NamedService for GarbageController {
    const NAME: &'static str = SERVICE_NAME;
}

impl tower::Service<http::Request<tonic::body::Body>> for GarbageController {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let me = self.clone();
        let watch = tower::service_fn(move |request: tonic::Request<pb::WatchRequest>| {
            let mut requests = me.requests.lock().unwrap();
            requests.push(request.into_inner());
            let mut items = vec![Ok(first_snapshot().encode_to_vec())];
            if requests.len() == 1 {
                items.extend(me.frames.iter().cloned().map(Ok));
            }
            let stream = futures_util::stream::iter(items).chain(futures_util::stream::pending());
            std::future::ready(Ok::<_, tonic::Status>(tonic::Response::new(stream)))
        });
        Box::pin(async move {
            Ok(tonic::server::Grpc::new(VerbatimCodec)
                .server_streaming(watch, request)
                .await)
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_frames_are_rejected_not_applied_and_a_snapshot_is_requested() {
    let delta = pb::WatchResponse {
        epoch: "e1".into(),
        revision: 2,
        trace_context: Default::default(),
        event: Some(pb::watch_response::Event::Delta(pb::Delta {
            base_revision: 1,
            upserted_leases: vec![pb::Lease {
                options: None,
                ipv6_address: String::new(),
                pool_ref: "ns/a".into(),
                mac_address: "02:01:00:00:00:02".into(),
                ip_address: "10.1.0.11".into(),
                host_name: String::new(),
            }],
            ..Default::default()
        })),
    }
    .encode_to_vec();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("random bytes", vec![0xff; 12]),
        ("truncated message", delta[..delta.len() - 3].to_vec()),
        // Field 2 (revision, a varint) sent as a length-delimited field running past the end.
        ("wrong wire type", vec![0x12, 0x7f, 0x01]),
    ];
    for (case, frame) in cases {
        assert!(
            pb::WatchResponse::decode(frame.as_slice()).is_err(),
            "{case} decodes"
        );
        let requests = Arc::new(Mutex::new(Vec::new()));
        let fake = GarbageController {
            // The valid delta after the garbage must not be applied either: the stream is dropped.
            frames: vec![frame, delta.clone()],
            requests: requests.clone(),
        };
        let listener = bind("127.0.0.1:0".parse().unwrap()).await;
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(fake)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let mut agent = Agent::start(&format!("http://{addr}"), "agent-0");
        agent.wait_for("the snapshot", |s| s.revision == 1).await;
        let deadline = Instant::now() + DEADLINE;
        while requests.lock().unwrap().len() < 2 {
            assert!(Instant::now() < deadline, "{case}: agent never reconnected");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let state = agent.state.borrow().clone();
        assert_eq!(
            (state.revision, state.lease_count()),
            (1, 1),
            "{case}: applied"
        );
        let second = requests.lock().unwrap()[1].clone();
        assert_eq!(
            (second.epoch.as_str(), second.revision),
            ("", 0),
            "{case}: asks for a fresh snapshot"
        );
        let status = agent.status.borrow().clone();
        assert!(status.rejected >= 1, "{case}: {status:?}");
        let error = status.last_error.clone().unwrap_or_default();
        assert!(error.contains("malformed frame"), "{case}: {error}");
        agent.stop().await;
        server.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_are_recorded_and_invalid_ones_refused() {
    let index = seeded_index();
    let server = Server::start(index.clone(), "127.0.0.1:0".parse().unwrap(), fast_stream()).await;
    let mut client = ConfigServiceClient::connect(server.url()).await.unwrap();
    let agent = pb::AgentIdentity {
        pod_name: "agent-0".into(),
        namespace: "vmdhcp".into(),
        node_name: "n1".into(),
    };
    let report = pb::ReportRequest {
        agent: Some(agent.clone()),
        epoch: index.epoch().to_string(),
        applied_revision: index.revision(),
        leader: true,
        interfaces: vec![pb::InterfaceReport {
            pool_ref: "ns/a".into(),
            interface_name: "vmd0".into(),
            state: pb::InterfaceState::Serving.into(),
            error: String::new(),
            lease_count: 50,
            probes: vec![],
            suspects: vec![],
        }],
    };
    client.report(report.clone()).await.unwrap();
    let all = server.reports.all();
    assert_eq!(all["vmdhcp/agent-0"].applied_revision, index.revision());
    assert!(all["vmdhcp/agent-0"].leader);

    let bad = pb::ReportRequest {
        interfaces: vec![pb::InterfaceReport {
            pool_ref: "nope".into(),
            ..report.interfaces[0].clone()
        }],
        ..report.clone()
    };
    let err = client.report(bad).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("pool_ref = \"nope\""),
        "{}",
        err.message()
    );
    // Probe verdicts are checked field by field, and bounded.
    let verdict = pb::AddressProbe {
        ip_address: "10.0.0.9".into(),
        mac_address: String::new(),
        answered_by: "02:00:00:00:00:09".into(),
        reason: pb::ProbeReason::Offer.into(),
    };
    let with_probes = |probes: Vec<pb::AddressProbe>| pb::ReportRequest {
        interfaces: vec![pb::InterfaceReport {
            probes,
            ..report.interfaces[0].clone()
        }],
        ..report.clone()
    };
    client
        .report(with_probes(vec![verdict.clone()]))
        .await
        .unwrap();
    let all = server.reports.all();
    assert_eq!(
        all["vmdhcp/agent-0"].interfaces[0].probes[0]
            .answered_by
            .map(|m| m.to_string()),
        Some("02:00:00:00:00:09".to_owned())
    );
    for (bad, field) in [
        (
            pb::AddressProbe {
                ip_address: "10.0.0.300".into(),
                ..verdict.clone()
            },
            "interfaces.probes.ip_address = \"10.0.0.300\"",
        ),
        (
            pb::AddressProbe {
                answered_by: "zz".into(),
                ..verdict.clone()
            },
            "interfaces.probes.answered_by = \"zz\"",
        ),
        (
            pb::AddressProbe {
                reason: 7,
                ..verdict.clone()
            },
            "interfaces.probes.reason = \"7\"",
        ),
    ] {
        let err = client.report(with_probes(vec![bad])).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains(field), "{}", err.message());
    }
    let err = client
        .report(with_probes(vec![verdict; 65]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err}");
    // So are suspect hosts: a MAC, an address or none, a known kind; a detail cut to its bound.
    let rogue = pb::NetworkSuspect {
        kind: pb::SuspectKind::ForeignDhcpServer.into(),
        mac_address: "02:00:00:00:0e:0e".into(),
        ip_address: "10.0.0.7".into(),
        detail: "x".repeat(1000),
        ipv6_address: String::new(),
    };
    let with_suspects = |suspects: Vec<pb::NetworkSuspect>| pb::ReportRequest {
        interfaces: vec![pb::InterfaceReport {
            suspects,
            ..report.interfaces[0].clone()
        }],
        ..report.clone()
    };
    client
        .report(with_suspects(vec![rogue.clone()]))
        .await
        .unwrap();
    let kept = server.reports.all()["vmdhcp/agent-0"].interfaces[0]
        .suspects
        .clone();
    assert_eq!(kept.len(), 1);
    assert_eq!(
        kept[0].ip.map(|ip| ip.to_string()).as_deref(),
        Some("10.0.0.7")
    );
    assert_eq!(kept[0].detail.len(), 256);
    for (bad, field) in [
        (
            pb::NetworkSuspect {
                mac_address: String::new(),
                ..rogue.clone()
            },
            "interfaces.suspects.mac_address = \"\"",
        ),
        (
            pb::NetworkSuspect {
                ip_address: "10.0.0".into(),
                ..rogue.clone()
            },
            "interfaces.suspects.ip_address = \"10.0.0\"",
        ),
        (
            pb::NetworkSuspect {
                ip_address: String::new(),
                ipv6_address: "10.0.0.7".into(),
                ..rogue.clone()
            },
            "interfaces.suspects.ipv6_address = \"10.0.0.7\"",
        ),
        (
            pb::NetworkSuspect {
                ipv6_address: "fe80::66".into(),
                ..rogue.clone()
            },
            "interfaces.suspects.ipv6_address = \"fe80::66\": is set beside ip_address",
        ),
        (
            pb::NetworkSuspect {
                kind: 0,
                ..rogue.clone()
            },
            "interfaces.suspects.kind = \"0\"",
        ),
    ] {
        let err = client.report(with_suspects(vec![bad])).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains(field), "{}", err.message());
    }
    let err = client
        .report(with_suspects(vec![rogue; 17]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err}");
    let err = client
        .report(pb::ReportRequest {
            agent: None,
            ..report
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    server.stop().await;
}

fn grpcurl(args: &[&str]) -> (bool, String, String) {
    let bin = vmdhcp_integration::control_plane::bin_dir().join("grpcurl");
    assert!(
        bin.exists(),
        "grpcurl not installed at {}: run scripts/install-deps.sh",
        bin.display()
    );
    let out = std::process::Command::new(bin).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcurl_lists_checks_health_and_prints_a_snapshot() {
    let index = seeded_index();
    let server = Server::start(index.clone(), "127.0.0.1:0".parse().unwrap(), fast_stream()).await;
    let addr = server.addr.to_string();
    let (ok, list, err) = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || grpcurl(&["-plaintext", &addr, "list"])
    })
    .await
    .unwrap();
    assert!(ok, "{err}");
    for service in ["vmdhcp.agent.v1.ConfigService", "grpc.health.v1.Health"] {
        assert!(
            list.lines().any(|l| l == service),
            "{service} not listed:\n{list}"
        );
    }
    let (ok, health, err) = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || {
            grpcurl(&[
                "-plaintext",
                "-d",
                r#"{"service":"vmdhcp.agent.v1.ConfigService"}"#,
                &addr,
                "grpc.health.v1.Health/Check",
            ])
        }
    })
    .await
    .unwrap();
    assert!(ok && health.contains("\"SERVING\""), "{health}{err}");

    // Watch streams forever: grpcurl stops at -max-time, after printing the snapshot as JSON.
    let (_, watch, err) = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || {
            grpcurl(&[
                "-plaintext",
                "-max-time",
                "2",
                "-d",
                r#"{"agent":{"podName":"grpcurl","namespace":"default"}}"#,
                &addr,
                "vmdhcp.agent.v1.ConfigService/Watch",
            ])
        }
    })
    .await
    .unwrap();
    let first: serde_json::Value = serde_json::Deserializer::from_str(&watch)
        .into_iter()
        .next()
        .expect("one JSON message")
        .unwrap_or_else(|e| panic!("{e}: {watch}{err}"));
    assert_eq!(first["revision"], index.revision().to_string());
    let pools = first["snapshot"]["pools"].as_array().unwrap();
    assert_eq!(pools.len(), 2);
    assert_eq!(pools[0]["config"]["serverIp"], "10.1.0.1");
    assert_eq!(pools[0]["leases"].as_array().unwrap().len(), 50);
    // The dual-stack pool's IPv6 side, as grpcurl prints it.
    assert_eq!(pools[1]["config"]["ipv6"]["serverIp"], "fd00:2::1");
    assert_eq!(pools[1]["config"]["ipv6"]["cidr"], "fd00:2::/112");
    assert_eq!(pools[1]["leases"][0]["ipv6Address"], "fd00:2::10");
    server.stop().await;
}
