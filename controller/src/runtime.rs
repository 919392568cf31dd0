//! Wires the controller together: on every replica, the IPPool watch that feeds the index, the
//! config stream and the HTTP endpoints; on the leader only, the reconcilers and the agent
//! bootstrap writer, started when leadership is gained and dropped — with every reconcile in
//! flight — the moment it is lost. Each leadership term starts from a fresh IPAM, rebuilt from
//! status, so nothing a previous leader held in memory is trusted.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{Instrument, error, field, info, info_span, warn};
use vmdhcp_core::NamespacedName;
use vmdhcp_core::crd::{IPPool, VirtualMachineNetworkConfig};

use crate::causes::TraceCauses;
use crate::http::HttpState;
use crate::index::Index;
use crate::index::shared_watch;
use crate::index::sync::IndexSync;
use crate::ipam::{Ipam, MacOwners};
use crate::kinds::{nad_resource, object_ref, store_key, vm_resource};
use crate::metrics::Metrics;
use crate::reconcile::context::{AgentDeployment, Context};
use crate::reconcile::status::PoolStatusWriter;
use crate::reports::{Reports, ReportsObject};
use crate::stream::config_service::StreamSettings;

/// Why the controller stopped.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The config stream server failed.
    #[error(transparent)]
    ConfigService(#[from] crate::stream::config_service::ConfigServiceError),
    /// The HTTP server failed.
    #[error("HTTP server: {0}")]
    Http(#[from] std::io::Error),
}

/// A reconcile failed (wraps each reconciler's own error).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// IPPool.
    #[error(transparent)]
    IPPool(#[from] crate::reconcile::ippool::Error),
    /// VirtualMachineNetworkConfig.
    #[error(transparent)]
    Vmnetcfg(#[from] crate::reconcile::vmnetcfg::Error),
    /// VirtualMachine.
    #[error(transparent)]
    Vm(#[from] crate::reconcile::vm::Error),
}

impl ReconcileError {
    /// Leadership was lost under the reconcile: not a failure, the write was just not made.
    fn is_not_leader(&self) -> bool {
        matches!(
            self,
            ReconcileError::IPPool(crate::reconcile::ippool::Error::NotLeader(_))
                | ReconcileError::Vmnetcfg(crate::reconcile::vmnetcfg::Error::NotLeader(_))
                | ReconcileError::Vm(crate::reconcile::vm::Error::NotLeader(_))
        )
    }
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

/// Per-object retry backoff: 1 s, 2 s, 4 s … 5 min, reset by a success.
#[derive(Default)]
struct Backoff(Mutex<HashMap<String, u32>>);

impl Backoff {
    fn failed(&self, key: String) -> Duration {
        let mut m = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let n = m.entry(key).or_insert(0);
        *n = n.saturating_add(1);
        Duration::from_secs(1u64 << (*n - 1).min(8)).min(Duration::from_secs(300))
    }

    fn succeeded(&self, key: &str) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
    }
}

/// Whether a config's status says every NIC is allocated.
fn is_allocated(c: &VirtualMachineNetworkConfig) -> bool {
    c.status.as_ref().is_some_and(|s| {
        vmdhcp_core::crd::find_condition(&s.conditions, vmdhcp_core::crd::CONDITION_ALLOCATED)
            .is_some_and(|a| a.status == "True")
    })
}

/// A leadership term's context plus its backoff bookkeeping.
struct Term {
    ctx: Arc<Context>,
    backoff: Backoff,
}

fn key<K: ResourceExt>(kind: &str, obj: &K) -> String {
    format!(
        "{kind}/{}/{}",
        obj.namespace().unwrap_or_default(),
        obj.name_any()
    )
}

async fn timed<T: ResourceExt, E: Into<ReconcileError>>(
    term: &Term,
    kind: &'static str,
    obj: &T,
    fut: impl Future<Output = Result<Action, E>>,
) -> Result<Action, ReconcileError> {
    // No waiting on other controllers' caches here: kube's store readiness wakes only its last
    // waiter (the controller's own runner), so a reconcile waiting on it could sleep forever.
    // Each controller's own cache is complete before its first reconcile; reads of the others
    // are either self-healing (requeue) or confirmed with a GET.
    let name = object_ref(obj);
    let span = info_span!(
        "reconcile",
        kind,
        object = %name.as_ref().map_or_else(|| obj.name_any(), ToString::to_string),
        outcome = field::Empty,
        error = field::Empty,
        otel.status_code = field::Empty,
    );
    if kind == "vmnetcfg"
        && let Some(name) = &name
        && let Some(cause) = term.ctx.causes.vmnetcfgs.get(name)
    {
        // The VM reconcile that wrote this config: one trace from VM to lease.
        vmdhcp_telemetry::trace::continue_from(&span, &[cause]);
    }
    let started = Instant::now();
    let result = fut.instrument(span.clone()).await.map_err(Into::into);
    let outcome = match &result {
        Ok(_) => "ok",
        Err(e) if e.is_not_leader() => "not_leader",
        Err(e) => {
            span.record("error", field::display(e));
            span.record("otel.status_code", "ERROR");
            "error"
        }
    };
    span.record("outcome", outcome);
    term.ctx
        .metrics
        .reconciled(kind, outcome, started.elapsed());
    if result.is_ok() {
        term.backoff.succeeded(&key(kind, obj));
    }
    result
}

fn error_policy<K: ResourceExt>(
    kind: &'static str,
) -> impl Fn(Arc<K>, &ReconcileError, Arc<Term>) -> Action {
    move |obj, err, term| {
        let delay = term.backoff.failed(key(kind, obj.as_ref()));
        if !err.is_not_leader() {
            warn!(object = %key(kind, obj.as_ref()), error = %err, retry_in = ?delay, "reconcile failed")
        }
        Action::requeue(delay)
    }
}

/// Logs what a controller stream yields besides successful reconciles (watch and queue errors;
/// reconcile errors are logged by the error policy).
fn log_outcome<K: kube::Resource, E: std::fmt::Display>(
    kind: &str,
    r: Result<(ObjectRef<K>, Action), kube::runtime::controller::Error<E, watcher::Error>>,
) where
    K::DynamicType: std::fmt::Debug,
{
    use kube::runtime::controller::Error as E2;
    match r {
        Ok(_) | Err(E2::ReconcilerFailed(..)) => {}
        Err(E2::ObjectNotFound(obj)) => {
            tracing::debug!(kind, object = %obj, "queued object no longer exists")
        }
        Err(e) => warn!(kind, error = %e, "controller stream error"),
    }
}

/// What every leadership term shares with the replica's always-on parts.
#[derive(Clone)]
struct Shared {
    index: Arc<Index>,
    reports: Arc<Reports>,
    metrics: Arc<Metrics>,
    ipam_slot: Arc<RwLock<Option<Arc<Ipam>>>>,
    causes: Arc<TraceCauses>,
}

/// Resolves once `stop` turns true (or its sender is gone).
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Runs the writers for one leadership term, until the future is dropped (leadership lost:
/// writes stop at once) or `stop` turns true (shutdown: no new reconcile starts, those in
/// flight finish their writes, then it returns).
async fn lead(
    client: Client,
    settings: Settings,
    shared: Shared,
    leader: watch::Receiver<bool>,
    stop: watch::Receiver<bool>,
) {
    let Shared {
        index,
        reports,
        metrics,
        ipam_slot,
        causes,
    } = shared;
    let wc = watcher::Config::default();
    let pool_api: Api<IPPool> = Api::all(client.clone());
    let cfg_api: Api<VirtualMachineNetworkConfig> = Api::all(client.clone());
    let vm_api: Api<DynamicObject> = Api::all_with(client.clone(), &vm_resource());

    // One watch per kind the reconcilers share, so a reconcile woken by an event always reads a
    // cache that has applied it (see `shared_watch`), and the API server sends each event once.
    let (pools, pool_watch, [pool_self, pool_siblings, pool_for_cfgs]) =
        shared_watch::watch(pool_api, (), wc.clone());
    let (vms, vm_watch, [vm_self, vm_for_cfgs]) =
        shared_watch::watch(vm_api, vm_resource(), wc.clone());
    let pool_ctrl = Controller::for_stream(pool_self, pools.clone());
    // A pool waits on its network (NAD) and on the other pools claiming the same network.
    let pools_on = |store: reflector::Store<IPPool>| {
        move |network: Option<NamespacedName>| {
            store
                .state()
                .into_iter()
                .filter(|p| {
                    NamespacedName::parse_in(
                        &p.spec.network_name,
                        &p.namespace().unwrap_or_default(),
                    )
                    .ok()
                        == network
                })
                .map(|p| ObjectRef::from_obj(p.as_ref()))
                .collect::<Vec<_>>()
        }
    };
    // A report re-checks only the pools it names (and only when its content changed).
    let touched_by = reports.clone();
    let report_changes = tokio_stream::wrappers::WatchStream::from_changes(reports.subscribe())
        .flat_map(move |_| {
            futures_util::stream::iter(
                touched_by
                    .take_touched()
                    .into_iter()
                    .map(|p| store_key::<IPPool>(&p)),
            )
        });
    let by_nad = pools_on(pools.clone());
    let by_sibling = pools_on(pools.clone());
    let pool_ctrl = pool_ctrl
        .graceful_shutdown_on(stopped(stop.clone()))
        .reconcile_on(report_changes)
        .watches_with(
            Api::<DynamicObject>::all_with(client.clone(), &nad_resource()),
            nad_resource(),
            wc.clone(),
            move |nad: DynamicObject| by_nad(object_ref(&nad)),
        )
        .watches_stream(pool_siblings, move |pool: IPPool| {
            by_sibling(
                NamespacedName::parse_in(
                    &pool.spec.network_name,
                    &pool.namespace().unwrap_or_default(),
                )
                .ok(),
            )
        });
    let cfg_ctrl = Controller::new(cfg_api, wc);
    let cfgs = cfg_ctrl.store();
    let vm_ctrl = Controller::for_stream_with(vm_self, vms.clone(), vm_resource())
        .graceful_shutdown_on(stopped(stop.clone()));
    let cfgs_for_pools = cfgs.clone();
    let cfg_ctrl = cfg_ctrl
        .graceful_shutdown_on(stopped(stop.clone()))
        .watches_stream_with(
            vm_for_cfgs,
            |vm: DynamicObject| {
                Some(ObjectRef::new(&vm.name_any()).within(&vm.namespace().unwrap_or_default()))
            },
            vm_resource(),
        )
        .watches_stream(pool_for_cfgs, move |pool: IPPool| {
            let ns = pool.namespace().unwrap_or_default();
            let network = NamespacedName::parse_in(&pool.spec.network_name, &ns).ok();
            cfgs_for_pools
                .state()
                .into_iter()
                // Only configs still waiting for an address: the others do not depend on the
                // pool's status, and re-queueing every config on every pool write is quadratic.
                .filter(|c| !is_allocated(c))
                .filter(|c| {
                    let cns = c.namespace().unwrap_or_default();
                    c.spec
                        .network_configs
                        .iter()
                        .any(|n| NamespacedName::parse_in(&n.network_name, &cns).ok() == network)
                })
                .map(|c| ObjectRef::from_obj(c.as_ref()))
                .collect::<Vec<_>>()
        });

    let ipam = Arc::new(Ipam::new());
    *ipam_slot.write().unwrap_or_else(PoisonError::into_inner) = Some(ipam.clone());
    let reporter = Reporter {
        controller: "vm-dhcp-controller".into(),
        instance: Some(settings.identity.clone()),
    };
    let (events, queued_events) =
        crate::reconcile::context::Events::new(crate::reconcile::context::EVENT_QUEUE);
    let ctx = Arc::new(Context {
        client: client.clone(),
        pools,
        vmnetcfgs: cfgs,
        vms,
        ipam,
        writer: PoolStatusWriter::default(),
        events,
        metrics,
        leader,
        agent: settings.agent.clone(),
        mac_owners: MacOwners::default(),
        reports: reports.clone(),
        agent_deployment_missing: Default::default(),
        causes,
        written: Default::default(),
    });
    let term = Arc::new(Term {
        ctx: ctx.clone(),
        backoff: Backoff::default(),
    });

    let pools_run = pool_ctrl
        .run(
            |o, t: Arc<Term>| async move {
                timed(
                    &t,
                    "ippool",
                    o.as_ref(),
                    crate::reconcile::ippool::reconcile(o.clone(), t.ctx.clone()),
                )
                .await
            },
            error_policy("ippool"),
            term.clone(),
        )
        .for_each(|r| async move { log_outcome("ippool", r) });
    let cfgs_run = cfg_ctrl
        .run(
            |o, t: Arc<Term>| async move {
                timed(
                    &t,
                    "vmnetcfg",
                    o.as_ref(),
                    crate::reconcile::vmnetcfg::reconcile(o.clone(), t.ctx.clone()),
                )
                .await
            },
            error_policy("vmnetcfg"),
            term.clone(),
        )
        .for_each(|r| async move { log_outcome("vmnetcfg", r) });
    let vms_run = vm_ctrl
        .run(
            |o, t: Arc<Term>| async move {
                timed(
                    &t,
                    "vm",
                    o.as_ref(),
                    crate::reconcile::vm::reconcile(o.clone(), t.ctx.clone()),
                )
                .await
            },
            error_policy("vm"),
            term.clone(),
        )
        .for_each(|r| async move { log_outcome("vm", r) });
    let bootstrap = async {
        match settings.agent.clone() {
            Some(target) => {
                crate::reconcile::agent_bootstrap::run(ctx.clone(), index, target, stop.clone())
                    .await
            }
            None => stopped(stop.clone()).await,
        }
    };
    // Events are published by one task per term, from a bounded queue.
    let events_task = crate::reconcile::context::Events::run(
        Recorder::new(client.clone(), reporter),
        queued_events,
    );
    // The writers end together on `stop`, each after its last write; the watches feeding them
    // never end on their own.
    let writers = async {
        tokio::join!(pools_run, cfgs_run, vms_run, bootstrap);
    };
    tokio::select! {
        () = writers => info!("reconcilers stopped; their writes are finished"),
        _ = async { tokio::join!(pool_watch, vm_watch, events_task) } => error!("shared watches ended"),
    }
}

/// Feeds the index from the IPPool watch (every replica); flips `ready` after the first sync.
async fn sync_index(
    client: Client,
    index: Arc<Index>,
    causes: Arc<TraceCauses>,
    ready: watch::Sender<bool>,
) {
    let (reader, writer) = reflector::store::<IPPool>();
    let mut sync = IndexSync::with_causes(index, causes);
    let stream = reflector::reflector(
        writer,
        watcher(Api::<IPPool>::all(client), watcher::Config::default()).default_backoff(),
    );
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::InitDone | watcher::Event::Apply(_) | watcher::Event::Delete(_)) => {
                sync.sync(&reader.state());
                ready.send_replace(true);
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "IPPool watch failed; retrying"),
        }
    }
}

/// Runs the controller until `shutdown`; `leader` says when this replica may write.
pub async fn run(
    client: Client,
    settings: Settings,
    grpc: TcpListener,
    http: TcpListener,
    mut leader: watch::Receiver<bool>,
    shutdown: watch::Receiver<bool>,
    started: impl FnOnce(Handles),
) -> Result<(), RuntimeError> {
    let index = Arc::new(Index::new());
    let reports = Arc::new(Reports::default());
    let metrics = Arc::new(Metrics::default());
    let ipam_slot: Arc<RwLock<Option<Arc<Ipam>>>> = Arc::default();
    let causes: Arc<TraceCauses> = Arc::default();
    let (ready_tx, ready) = watch::channel(false);
    started(Handles {
        index: index.clone(),
        reports: reports.clone(),
        metrics: metrics.clone(),
        grpc: grpc.local_addr()?,
        http: http.local_addr()?,
    });

    let grpc_task = tokio::spawn(crate::stream::config_service::serve(
        grpc,
        index.clone(),
        reports.clone(),
        settings.stream.clone(),
        shutdown.clone(),
    ));
    let http_state = HttpState {
        metrics: metrics.clone(),
        ready,
        ipam: ipam_slot.clone(),
        dumps: settings.dumps,
        index: index.clone(),
        reports: reports.clone(),
        leader: leader.clone(),
    };
    let http_task = tokio::spawn(crate::http::serve(http, http_state, shutdown.clone()));
    let shared = Shared {
        index: index.clone(),
        reports: reports.clone(),
        metrics: metrics.clone(),
        ipam_slot: ipam_slot.clone(),
        causes: causes.clone(),
    };
    let report_tasks = settings.reports.clone().map(|object| {
        [
            tokio::spawn(crate::reports::publish(
                client.clone(),
                object.clone(),
                reports.clone(),
                shutdown.clone(),
            )),
            tokio::spawn(crate::reports::follow(
                client.clone(),
                object,
                reports.clone(),
                leader.clone(),
                shutdown.clone(),
            )),
        ]
    });
    let sync_task = tokio::spawn(sync_index(
        client.clone(),
        index.clone(),
        causes.clone(),
        ready_tx,
    ));

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
                error!("reconcilers ended unexpectedly");
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
        *ipam_slot.write().unwrap_or_else(PoisonError::into_inner) = None;
        if *stop.borrow() {
            break;
        }
    }
    sync_task.abort();
    for task in report_tasks.into_iter().flatten() {
        let _ = task.await;
    }
    if let Ok(result) = grpc_task.await {
        result?;
    }
    if let Ok(result) = http_task.await {
        result?;
    }
    info!("controller stopped");
    Ok(())
}
