//! The agent process (`vm-dhcp-agent run` and `serve-static`, the one wiring of both): wires
//! bootstrap, lease sources, leader election, interfaces and DHCP servers, reports and the HTTP
//! endpoints together, and orders shutdown.
//!
//! - Bootstrap: the pools named by `AGENT_NETWORK_CONFIGS` / `IPPOOL_REFS_JSON` are known before
//!   anything else. Invalid env: the agent stays up, unready with the error on `/readyz`, and
//!   takes no part in anything (it would otherwise hold the Lease while serving nothing). Empty
//!   env: idle and ready.
//! - Leases: the config stream, with IPPool status as the fallback ([`crate::sources`]); or,
//!   for `serve-static`, a JSON file re-read on SIGHUP ([`crate::sources::file`]), with no
//!   bootstrap env, election, stream or reports.
//! - Leadership: only the Lease holder configures interfaces, announces their server addresses
//!   by gratuitous ARP, answers, and looks for other DHCP servers on each interface
//!   ([`crate::serving`]); standbys keep the stream and the table hot. Without CAP_NET_RAW the
//!   agent still serves, without announcements or detection (a warning says so).
//! - SIGTERM/SIGINT: stop answering and remove the server addresses, then release the Lease (a
//!   standby takes over within about one retry period), then close the stream and HTTP.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{Instrument, error, info, info_span, warn};
use vmdhcp_core::NamespacedName;
use vmdhcp_core::bootstrap::Bootstrap;
use vmdhcp_leader::{ElectionConfig, LeaderElector, LeaseHolder};
use vmdhcp_proto::agent::v1 as pb;

use crate::arp::Announcer;
use crate::dhcp::foreign::{DetectorSettings, Detectors};
use crate::dhcp::server::InterfaceStatus;
use crate::http::{AgentStatus, HttpState};
use crate::lease_table::LeaseTable;
use crate::netlink::InterfaceSetup;
use crate::serving::{Serving, WantedSet, wanted_from_bootstrap, wanted_from_table};
use crate::sources::Sources;
use crate::sources::file::{FileError, FileSettings, FileSource};
use crate::stream::{Applier, ClientSettings, ConnectionStatus};
use crate::suspects::{KnownServers, Suspects};

/// Why the agent cannot run.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// Leader election is asked for but there is no API server to elect through.
    #[error(
        "leader election needs a Kubernetes client (in-cluster config or --kubeconfig); use --no-leader-election to run alone"
    )]
    NoClientForElection,
    /// The election settings are inconsistent.
    #[error(transparent)]
    Election(#[from] vmdhcp_leader::ElectionError),
    /// The rtnetlink socket cannot be opened.
    #[error(transparent)]
    Netlink(#[from] crate::netlink::NetlinkError),
    /// Signal handlers cannot be installed.
    #[error("cannot install signal handlers: {0}")]
    Signal(std::io::Error),
    /// The HTTP endpoints cannot listen.
    #[error(transparent)]
    Http(#[from] crate::http::HttpError),
    /// The static file cannot be served (`serve-static`).
    #[error(transparent)]
    File(#[from] FileError),
}

/// Everything `run` needs to know.
pub struct Settings {
    /// Where pools and leases come from: the cluster (`run`) or a file (`serve-static`).
    pub source: LeaseSource,
    /// Leader election among replicas; `None` serves unconditionally (a single replica).
    pub election: Option<ElectionConfig>,
    /// Give each served interface its server address (rtnetlink).
    pub configure_interfaces: bool,
    /// Where `/healthz`, `/readyz`, `/leases`, `/metrics` listen; `None` serves no HTTP.
    pub http: Option<SocketAddr>,
    /// Looking for other DHCP servers on the served interfaces ([`crate::dhcp::foreign`]).
    pub foreign_dhcp: DetectorSettings,
    /// How long a host found acting where it should not is kept after it was last seen
    /// ([`crate::suspects`]).
    pub suspect_forget_after: Duration,
    /// Other DHCP servers on the pools' networks by design: peers, not suspects.
    pub known_dhcp_servers: KnownServers,
}

/// Where the agent's pools and leases come from. Everything downstream of the lease table
/// (serving, interfaces, announcements, NTP names, HTTP) is the same for both, so a feature
/// added to the agent reaches `serve-static` as well.
pub enum LeaseSource {
    /// The pools the bootstrap env names, their leases from the controller's stream with IPPool
    /// status as the fallback ([`crate::sources`]).
    Cluster(Box<ClusterSettings>),
    /// A static JSON file, re-read on SIGHUP, with a status file ([`crate::sources::file`]).
    File(FileSettings),
}

/// The cluster lease source: bootstrap env, controller stream, reports.
pub struct ClusterSettings {
    /// Who we are (pod, namespace, node).
    pub identity: pb::AgentIdentity,
    /// The controller's gRPC endpoint; `None` runs without a stream (fallback only).
    pub controller: Option<String>,
    /// CA and token for a secured stream (both unset: plaintext).
    pub credentials: crate::credentials::Credentials,
    /// `AGENT_NETWORK_CONFIGS`, as read.
    pub network_configs: Option<String>,
    /// `IPPOOL_REFS_JSON`, as read.
    pub pool_refs: Option<String>,
    /// Serve every pool the controller streams, whatever the bootstrap says (local runs, nodes
    /// whose interfaces are plumbed otherwise). No IPPool fallback in this mode.
    pub all_pools: bool,
    /// Longest time between two reports to the controller.
    pub report_interval: Duration,
}

/// How often the serving loop re-checks even when nothing changed (retries of interfaces that
/// could not be configured).
const RECHECK: Duration = Duration::from_secs(5);

/// Whether the agent takes part at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Invalid bootstrap env: unready with the error, taking no part in anything.
    Failed,
    /// No pools to serve: ready, and nothing else.
    Idle,
    /// Pools to serve.
    Active,
}

/// Runs the agent until SIGTERM or SIGINT. `client` is the API server connection (election and
/// the IPPool fallback); without one, only `--no-leader-election` and the stream work.
pub async fn run(settings: Settings, client: Option<kube::Client>) -> Result<(), RuntimeError> {
    let mut terminate = signal(SignalKind::terminate()).map_err(RuntimeError::Signal)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(RuntimeError::Signal)?;
    let (stop_tx, stop) = watch::channel(false);

    let table = Arc::new(LeaseTable::new());
    let (role_tx, role) = watch::channel(AgentStatus::default());
    let (stream_tx, stream_status) = watch::channel(ConnectionStatus::default());
    let (bootstrap, mode) = match &settings.source {
        LeaseSource::Cluster(cluster) => read_bootstrap(cluster, &role_tx),
        LeaseSource::File(_) => (Bootstrap::default(), Mode::Active),
    };
    let active = mode == Mode::Active;
    let sources = Arc::new(Sources::new(Arc::clone(&table), mode == Mode::Idle));
    let file = match &settings.source {
        LeaseSource::File(file) => Some(FileSource::open(
            file.clone(),
            Arc::clone(&sources),
            Arc::clone(&table),
        )?),
        LeaseSource::Cluster(_) => None,
    };
    let mut view = sources.subscribe();
    let (loaded_tx, loaded) = watch::channel(view.borrow().loaded);

    let suspects = Arc::new(
        Suspects::new(settings.suspect_forget_after).knowing(settings.known_dhcp_servers.clone()),
    );
    let detectors = Detectors::new(Arc::clone(&suspects), settings.foreign_dhcp);
    let mut serving = new_serving(
        Arc::clone(&table),
        active && settings.configure_interfaces,
        detectors,
    )?;

    let http_task = match settings.http {
        Some(addr) => {
            let state = HttpState::new(
                Arc::clone(&table),
                loaded,
                serving.servers().statuses(),
                serving.servers().counters(),
            )
            .with_stream(stream_status.clone())
            .with_agent(role.clone())
            .with_arp(serving.arp_counters())
            .with_host6(serving.host6_counters())
            .with_dhcp6(serving.servers6().counters())
            .with_suspects(Arc::clone(&suspects), serving.probe_counters());
            // The pool interfaces known now; later ones have `vmd…` names, refused as well.
            let mut pools: Vec<String> = bootstrap
                .network_configs
                .iter()
                .map(|c| c.interface_name.clone())
                .collect();
            pools.extend(
                table
                    .pools()
                    .values()
                    .map(|p| p.config().interface_name.clone()),
            );
            Some(serve_http(addr, &pools, state, stop.clone()).await?)
        }
        None => None,
    };
    info!(http = ?settings.http, pools = bootstrap.pool_refs.len(), source = sources.subscribe().borrow().source.as_str(), "agent up");

    let mut tasks = Vec::new();
    if active {
        // Host names in pools' NTP lists become option 42 addresses, resolved off the packet
        // path whenever the table changes and periodically.
        tasks.push(tokio::spawn(crate::dhcp::ntp::run(
            Arc::clone(&table),
            sources.subscribe(),
            stop.clone(),
        )));
    }
    if let Some(file) = file {
        tasks.push(tokio::spawn(
            file.follow(serving.servers().statuses(), stop.clone()),
        ));
    }
    if active && let LeaseSource::Cluster(cluster) = &settings.source {
        tasks.extend(start_cluster_source(
            cluster,
            &bootstrap,
            client.as_ref(),
            ClusterWiring {
                sources: Arc::clone(&sources),
                table: Arc::clone(&table),
                stream_tx,
                stream_status: stream_status.clone(),
                role: role.clone(),
                statuses: serving.servers().statuses(),
                suspects: Arc::clone(&suspects),
                stop: stop.clone(),
            },
        ));
    }
    let election = settings.election.clone().filter(|_| active);
    let mut leadership = Leadership::start(election, client.as_ref())?;
    let (leading, holder) = (&mut leadership.leading, &mut leadership.holder);

    let mut recheck = tokio::time::interval(RECHECK);
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut leading_open, mut holder_open) = (true, true);
    loop {
        let is_leader = active && *leading.borrow_and_update();
        let v = *view.borrow_and_update();
        let wanted = wanted_now(active, v.loaded, &table, &bootstrap);
        serving.converge(is_leader, &wanted).await;
        loaded_tx.send_if_modified(|l| std::mem::replace(l, v.loaded) != v.loaded);
        let seen = holder.borrow_and_update().clone();
        role_tx.send_if_modified(|r| {
            // The channel starts at "not read yet"; the count is known once the Lease was seen.
            let lease_transitions = (seen != LeaseHolder::default())
                .then_some(seen.transitions)
                .or(r.lease_transitions);
            let next = AgentStatus {
                leader: is_leader,
                lease_holder: seen.holder.clone(),
                lease_transitions,
                source: v.source.as_str(),
                error: r.error.clone(),
            };
            std::mem::replace(r, next.clone()) != next
        });
        tokio::select! {
            changed = leading.changed(), if leading_open => leading_open = changed.is_ok(),
            changed = holder.changed(), if holder_open => holder_open = changed.is_ok(),
            _ = view.changed() => {}
            _ = recheck.tick() => {}
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
        }
    }

    info!("stopping: silencing DHCP, then releasing the Lease");
    serving.stop().await;
    role_tx.send_modify(|r| r.leader = false);
    leadership.release().await;
    let _ = stop_tx.send(true);
    join(tasks, http_task).await;
    info!("stopped");
    Ok(())
}

/// The interfaces to serve: none when idle; the pools in the table once a lease source
/// loaded them; until then, the bootstrap's.
fn wanted_now(active: bool, loaded: bool, table: &LeaseTable, bootstrap: &Bootstrap) -> WantedSet {
    if !active {
        WantedSet::new()
    } else if loaded {
        wanted_from_table(table)
    } else {
        wanted_from_bootstrap(&bootstrap.network_configs)
    }
}

/// Waits for the background tasks and the HTTP endpoints to end (after the stop signal).
async fn join<E: std::fmt::Display>(
    tasks: Vec<JoinHandle<()>>,
    http_task: Option<JoinHandle<Result<(), E>>>,
) {
    for task in tasks {
        let _ = task.await;
    }
    if let Some(task) = http_task {
        match task.await {
            Ok(Err(error)) => warn!(%error, "HTTP endpoints failed"),
            Err(error) => warn!(%error, "HTTP task failed"),
            Ok(Ok(())) => {}
        }
    }
}

/// Whether this replica may answer: the elector's channels, or, without election, always.
struct Leadership {
    leading: watch::Receiver<bool>,
    holder: watch::Receiver<LeaseHolder>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
    /// Keep the constant channels open when there is no elector.
    _always: (watch::Sender<bool>, watch::Sender<LeaseHolder>),
}

impl Leadership {
    /// Starts electing with `config`; with `None`, leads unconditionally.
    fn start(
        config: Option<ElectionConfig>,
        client: Option<&kube::Client>,
    ) -> Result<Self, RuntimeError> {
        let (stop, election_stop) = watch::channel(false);
        let (always_tx, leading) = watch::channel(true);
        let (holder_tx, holder) = watch::channel(LeaseHolder::default());
        let mut leadership = Leadership {
            leading,
            holder,
            stop,
            task: None,
            _always: (always_tx, holder_tx),
        };
        if let Some(config) = config {
            let client = client.cloned().ok_or(RuntimeError::NoClientForElection)?;
            let elector = LeaderElector::new(client, config)?;
            leadership.leading = elector.subscribe();
            leadership.holder = elector.holder();
            leadership.task = Some(tokio::spawn(elector.run(election_stop)));
        }
        Ok(leadership)
    }

    /// Ends the election and waits until the Lease is released.
    async fn release(self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task {
            let _ = task.await;
        }
    }
}

/// The serving side; with `configure_interfaces`, it gives interfaces their server addresses
/// (rtnetlink) and announces them.
fn new_serving(
    table: Arc<LeaseTable>,
    configure_interfaces: bool,
    detectors: Detectors,
) -> Result<Serving, RuntimeError> {
    let setup = if configure_interfaces {
        Some(InterfaceSetup::connect()?)
    } else {
        None
    };
    // Only addresses we configure are announced; without CAP_NET_RAW, DHCP is served anyway.
    let announcer = if setup.is_some() {
        Announcer::open_or_warn()
    } else {
        Announcer::disabled()
    };
    Ok(Serving::new(table, setup, announcer, detectors))
}

/// Parses the bootstrap env. Invalid: the error goes to `/readyz` and the agent serves nothing
/// until it is fixed; no pools (and not every pool): idle.
fn read_bootstrap(
    cluster: &ClusterSettings,
    role_tx: &watch::Sender<AgentStatus>,
) -> (Bootstrap, Mode) {
    match Bootstrap::parse(
        cluster.network_configs.as_deref(),
        cluster.pool_refs.as_deref(),
    ) {
        Err(e) => {
            error!(error = %e, "invalid bootstrap env: serving nothing until it is fixed");
            role_tx.send_modify(|r| r.error = Some(format!("invalid bootstrap env: {e}")));
            (Bootstrap::default(), Mode::Failed)
        }
        Ok(b) if b.pool_refs.is_empty() && !cluster.all_pools => {
            info!("no pools in the bootstrap env: idle");
            (b, Mode::Idle)
        }
        Ok(b) => (b, Mode::Active),
    }
}

/// Binds the HTTP endpoints (a bind failure stops the agent) and serves them until `stop`: on
/// `addr`, bound to the interfaces that are not pool interfaces
/// ([`InterfaceSetup::endpoint_interfaces`]), so no tenant of a pool network reaches them.
async fn serve_http(
    addr: SocketAddr,
    pools: &[String],
    state: HttpState,
    stop: watch::Receiver<bool>,
) -> Result<JoinHandle<Result<(), crate::http::HttpError>>, RuntimeError> {
    let devices = InterfaceSetup::connect()?
        .endpoint_interfaces(addr.ip(), pools)
        .await?;
    let listeners = crate::http::bind_on_devices(addr, &devices)?;
    Ok(tokio::spawn(crate::http::serve_all(
        listeners,
        crate::http::router(state),
        stop,
    )))
}

/// What the cluster source's tasks share with the rest of the agent.
struct ClusterWiring {
    sources: Arc<Sources>,
    table: Arc<LeaseTable>,
    stream_tx: watch::Sender<ConnectionStatus>,
    stream_status: watch::Receiver<ConnectionStatus>,
    role: watch::Receiver<AgentStatus>,
    statuses: watch::Receiver<BTreeMap<String, InterfaceStatus>>,
    suspects: Arc<Suspects>,
    stop: watch::Receiver<bool>,
}

/// Starts the cluster source's tasks: the controller's stream (with the reports back and the
/// switch to the fallback when it drops), and the IPPool watch of the fallback.
fn start_cluster_source(
    cluster: &ClusterSettings,
    bootstrap: &Bootstrap,
    client: Option<&kube::Client>,
    wiring: ClusterWiring,
) -> Vec<JoinHandle<()>> {
    let ClusterWiring {
        sources,
        table,
        stream_tx,
        stream_status,
        role,
        statuses,
        suspects,
        stop,
    } = wiring;
    let mut tasks = Vec::new();
    if let Some(endpoint) = &cluster.controller {
        let mut client_settings = ClientSettings::new(endpoint.clone(), cluster.identity.clone());
        client_settings.credentials = cluster.credentials.clone();
        if !cluster.all_pools {
            client_settings.pool_refs = bootstrap.pool_refs.clone();
        }
        let sink: Arc<dyn crate::stream::ConfigSink> = Arc::clone(&sources) as _;
        let stream = crate::stream::run(
            client_settings,
            Applier::default(),
            sink,
            stream_tx,
            stop.clone(),
        );
        tasks.push(tokio::spawn(
            async move {
                stream.await;
            }
            .instrument(info_span!("stream")),
        ));
        tasks.push(tokio::spawn(follow_stream(
            stream_status.clone(),
            Arc::clone(&sources),
            stop.clone(),
        )));
        tasks.push(tokio::spawn(crate::report::run(
            endpoint.clone(),
            cluster.credentials.clone(),
            crate::report::ReportInputs {
                agent: cluster.identity.clone(),
                stream: stream_status,
                role,
                statuses,
                table,
                suspects,
            },
            cluster.report_interval,
            stop.clone(),
        )));
    }
    match (client, cluster.all_pools) {
        (Some(client), false) => {
            let interfaces: BTreeMap<NamespacedName, String> = bootstrap
                .network_configs
                .iter()
                .map(|c| (c.ip_pool_ref.clone(), c.interface_name.clone()))
                .collect();
            tasks.push(tokio::spawn(crate::sources::follow_ippools(
                client.clone(),
                interfaces,
                sources,
                stop,
            )));
        }
        (None, false) => {
            warn!("no Kubernetes client: no IPPool fallback while the controller is unreachable")
        }
        (_, true) => {}
    }
    tasks
}

/// Tells [`Sources`] when the stream drops, so the fallback takes over.
async fn follow_stream(
    mut status: watch::Receiver<ConnectionStatus>,
    sources: Arc<Sources>,
    mut stop: watch::Receiver<bool>,
) {
    let mut was_connected = false;
    loop {
        let connected = status.borrow_and_update().connected;
        if was_connected && !connected {
            sources.stream_lost();
        }
        was_connected = connected;
        tokio::select! {
            changed = status.changed() => if changed.is_err() { return },
            _ = stop.changed() => return,
        }
    }
}
