//! Wires the controller together: on every replica, the IPPool watch that feeds the index, the
//! config stream and the HTTP endpoints; on the leader only, the reconcilers and the agent
//! bootstrap writer ([`term`], its first pass paced by [`replay`], what wakes each controller in
//! [`triggers`]), started when leadership is gained and dropped — with every
//! reconcile in flight — the moment it is lost. Each leadership term starts from a fresh IPAM,
//! rebuilt from status, so nothing a previous leader held in memory is trusted.
//!
//! [`replica::run`] is the whole `vm-dhcp-controller run` process: leader election,
//! certificates, the webhook, then [`run`], then the Lease released after the last write. Tests
//! embed [`run`] alone.

use parking_lot::RwLock;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use kube::Client;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{error, info, warn};
use vmdhcp_core::crd::IPPool;

use crate::causes::TraceCauses;
use crate::http::HttpState;
use crate::index::Index;
use crate::index::caches::Caches;
use crate::index::shared_watch::{SharedWatch, Touch};
use crate::index::sync::IndexSync;
use crate::ipam::Ipam;
use crate::metrics::Metrics;
use crate::reconcile::context::AgentDeployment;
use crate::reports::{Reports, ReportsObject};
use crate::stream::config_service::StreamSettings;

pub mod replay;
pub mod replica;
mod term;
mod triggers;

pub use term::ReconcileError;
use term::{Shared, lead};

/// Why the controller stopped.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The config stream server failed.
    #[error(transparent)]
    ConfigService(#[from] crate::stream::config_service::ConfigServiceError),
    /// The HTTP server failed.
    #[error("HTTP server: {0}")]
    Http(#[from] std::io::Error),
    /// A listener could not be bound.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The leader-election settings were refused.
    #[error("leader election settings: {0}")]
    Election(#[from] vmdhcp_leader::ElectionError),
}

/// The longest a shutdown waits for the reconciles in flight (the chart's grace period is 30 s).
const DRAIN: Duration = Duration::from_secs(15);

/// Controller settings.
#[derive(Clone, Debug)]
pub struct Settings {
    /// This replica's name (events, logs).
    pub identity: String,
    /// Config stream tunables.
    pub stream: StreamSettings,
    /// The agent Deployment to bootstrap.
    pub agent: Option<AgentDeployment>,
    /// Serve `/ipams` and `/caches`.
    pub dumps: bool,
    /// Where agent reports are shared between replicas (see [`crate::reports`]); `None` keeps
    /// them in this replica's memory only (a single replica, tests).
    pub reports: Option<ReportsObject>,
    /// The agents' election Lease, `namespace/name`: who holds it leads, whatever a report
    /// claims ([`crate::reports::follow_agent_lease`]). `None` (tests, a single agent without
    /// election) believes the reports.
    pub agent_lease: Option<vmdhcp_core::NamespacedName>,
    /// How long a pool entry no live config names is kept before it is released
    /// ([`crate::reconcile::orphans`]).
    pub orphan_grace: Duration,
    /// Write each VM's addresses where Harvester's UI shows them
    /// ([`crate::reconcile::vm::custom_ip`]).
    pub vm_address_annotation: bool,
}

/// What a running controller exposes to its embedder (tests, main).
#[derive(Clone)]
pub struct Handles {
    /// The index served to agents.
    pub index: Arc<Index>,
    /// Agent reports.
    pub reports: Arc<Reports>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The gRPC address.
    pub grpc: SocketAddr,
    /// The HTTP address.
    pub http: SocketAddr,
}

/// Resolves once `stop` turns true (or its sender is gone).
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Feeds the index from the shared IPPool watch (every replica); flips `ready` after the first
/// full pass. After a (re)list the whole cache is compared; each later change costs only its own
/// pool ([`IndexSync::changed`]).
async fn sync_index(
    pools: SharedWatch<IPPool>,
    index: Arc<Index>,
    causes: Arc<TraceCauses>,
    metrics: Arc<Metrics>,
    ready: watch::Sender<bool>,
) {
    let store = pools.store();
    let mut sync = IndexSync::with_causes(index, causes);
    let mut counted = 0;
    // Subscribed before looking at readiness: a list completed before this point is in the
    // cache now, one completed after it is announced below.
    let mut touches = pools.subscribe();
    if pools.is_ready() {
        sync.sync(&store.state());
        ready.send_replace(true);
        metrics.index_pools_examined(sync.examined());
        counted = sync.examined();
    }
    while let Some(touch) = touches.next().await {
        match touch {
            Touch::Listed => {
                sync.sync(&store.state());
                ready.send_replace(true);
            }
            // Before the first list the full pass above (or at `Listed`) reads everything.
            Touch::Applied(_) | Touch::Deleted(_) if !*ready.borrow() => {}
            Touch::Applied(pool) => {
                sync.changed(&pool, false, || store.state());
            }
            Touch::Deleted(pool) => {
                sync.changed(&pool, true, || store.state());
            }
        }
        metrics.index_pools_examined(sync.examined() - counted);
        counted = sync.examined();
    }
}

/// Runs the controller until `shutdown`; `leader` says when this replica may write.
pub async fn run(
    client: Client,
    settings: Settings,
    grpc: TcpListener,
    http: TcpListener,
    leader: watch::Receiver<bool>,
    shutdown: watch::Receiver<bool>,
    started: impl FnOnce(Handles),
) -> Result<(), RuntimeError> {
    let (caches, _tasks) = Caches::start(&client);
    let metrics = Arc::new(Metrics::default());
    run_with_caches(
        client, caches, metrics, settings, grpc, http, leader, shutdown, started,
    )
    .await
}

/// [`run`] over caches the caller started (and shares, e.g. with the webhook), counting into
/// `metrics` (which the caller may have handed to the stream's token checks already).
#[allow(clippy::too_many_arguments)]
pub async fn run_with_caches(
    client: Client,
    caches: Caches,
    metrics: Arc<Metrics>,
    settings: Settings,
    grpc: TcpListener,
    http: TcpListener,
    leader: watch::Receiver<bool>,
    shutdown: watch::Receiver<bool>,
    started: impl FnOnce(Handles),
) -> Result<(), RuntimeError> {
    let shared = Shared {
        caches,
        index: Arc::new(Index::new()),
        reports: Arc::new(Reports::default()),
        metrics,
        ipam_slot: Arc::default(),
        causes: Arc::default(),
    };
    started(Handles {
        index: shared.index.clone(),
        reports: shared.reports.clone(),
        metrics: shared.metrics.clone(),
        grpc: grpc.local_addr()?,
        http: http.local_addr()?,
    });
    let always = AlwaysOn::start(&client, &settings, &shared, grpc, http, &leader, &shutdown);
    follow_leadership(client, settings, shared, leader, shutdown).await;
    always.finish().await?;
    info!("controller stopped");
    Ok(())
}

/// What every replica runs, leader or not: the config stream, the HTTP endpoints, the index sync
/// and the sharing of agent reports.
struct AlwaysOn {
    grpc: JoinHandle<Result<(), crate::stream::config_service::ConfigServiceError>>,
    http: JoinHandle<Result<(), std::io::Error>>,
    reports: Option<[JoinHandle<()>; 2]>,
    sync: JoinHandle<()>,
}

impl AlwaysOn {
    /// Spawns them; the servers and the report sharing end on `shutdown`.
    fn start(
        client: &Client,
        settings: &Settings,
        shared: &Shared,
        grpc: TcpListener,
        http: TcpListener,
        leader: &watch::Receiver<bool>,
        shutdown: &watch::Receiver<bool>,
    ) -> Self {
        let (ready_tx, ready) = watch::channel(false);
        let grpc = tokio::spawn(crate::stream::config_service::serve(
            grpc,
            shared.index.clone(),
            shared.reports.clone(),
            settings.stream.clone(),
            shutdown.clone(),
        ));
        let http_state = HttpState {
            metrics: shared.metrics.clone(),
            ready,
            ipam: shared.ipam_slot.clone(),
            dumps: settings.dumps,
            index: shared.index.clone(),
            reports: shared.reports.clone(),
            leader: leader.clone(),
        };
        let http = tokio::spawn(crate::http::serve(http, http_state, shutdown.clone()));
        let reports = settings.reports.clone().map(|object| {
            [
                tokio::spawn(crate::reports::publish(
                    client.clone(),
                    object.clone(),
                    shared.reports.clone(),
                    shutdown.clone(),
                )),
                tokio::spawn(crate::reports::follow(
                    client.clone(),
                    object,
                    shared.reports.clone(),
                    leader.clone(),
                    shutdown.clone(),
                )),
            ]
        });
        if let Some(lease) = settings.agent_lease.clone() {
            tokio::spawn(crate::reports::follow_agent_lease(
                client.clone(),
                lease,
                shared.reports.clone(),
                shutdown.clone(),
            ));
        }
        let sync = tokio::spawn(sync_index(
            shared.caches.pools.clone(),
            shared.index.clone(),
            shared.causes.clone(),
            shared.metrics.clone(),
            ready_tx,
        ));
        AlwaysOn {
            grpc,
            http,
            reports,
            sync,
        }
    }

    /// Waits for the servers to drain (after `shutdown`); the index sync is stopped.
    async fn finish(self) -> Result<(), RuntimeError> {
        self.sync.abort();
        for task in self.reports.into_iter().flatten() {
            let _ = task.await;
        }
        if let Ok(result) = self.grpc.await {
            result?;
        }
        if let Ok(result) = self.http.await {
            result?;
        }
        Ok(())
    }
}

/// Waits for leadership, leads until it is lost, and again, until `shutdown`; a shutdown while
/// leading lets the writes in flight finish first.
async fn follow_leadership(
    client: Client,
    settings: Settings,
    shared: Shared,
    mut leader: watch::Receiver<bool>,
    shutdown: watch::Receiver<bool>,
) {
    let ipam_slot: Arc<RwLock<Option<Arc<Ipam>>>> = shared.ipam_slot.clone();
    let mut stop = shutdown.clone();
    loop {
        // Follower: wait for leadership (or shutdown).
        while !*leader.borrow_and_update() {
            tokio::select! {
                changed = leader.changed() => if changed.is_err() { break },
                _ = stop.changed() => {}
            }
            if *stop.borrow() {
                break;
            }
        }
        if *stop.borrow() {
            break;
        }
        info!(identity = %settings.identity, "leading: starting reconcilers");
        let term = lead(
            client.clone(),
            settings.clone(),
            shared.clone(),
            leader.clone(),
            shutdown.clone(),
        );
        let mut term = std::pin::pin!(term);
        let lost = async {
            while *leader.borrow_and_update() {
                if leader.changed().await.is_err() {
                    break;
                }
            }
        };
        let stopping = tokio::select! {
            () = &mut term => {
                // On shutdown the term may end (its writes finished) before `stop.changed()` is
                // seen here: that is the expected end, not a failure.
                if !*stop.borrow() {
                    error!("reconcilers ended unexpectedly");
                }
                false
            }
            () = lost => {
                warn!(identity = %settings.identity, "leadership lost: writes stopped");
                false
            }
            _ = stop.changed() => true,
        };
        if stopping {
            // Shutdown while leading: let the reconciles in flight finish their writes (bounded)
            // before the caller releases the Lease, so no write of ours lands after a successor
            // started.
            if tokio::time::timeout(DRAIN, &mut term).await.is_err() {
                warn!(limit = ?DRAIN, "reconciles still running at shutdown; abandoning them");
            }
        }
        // This replica no longer leads: only the leader exports per-object series.
        shared.metrics.clear_objects();
        *ipam_slot.write() = None;
        if *stop.borrow() {
            break;
        }
    }
}
