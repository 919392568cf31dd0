//! One leadership term: the reconcilers and the agent bootstrap writer, over shared watches,
//! with per-object backoff, a span and a metric per reconcile. Started when this replica gains
//! leadership, dropped — with every reconcile in flight — the moment it is lost.

use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{Instrument, field, info, info_span, warn};
use vmdhcp_core::crd::{AddressClaim, IPPool, VirtualMachineNetworkConfig};

use super::replay::{self, Backlog};
use super::triggers::{
    POOL_REBUILT_QUEUE, claim_controller, config_triggers, configs_of_claim, members_of,
    pool_controller,
};
use super::{Settings, stopped};
use crate::causes::TraceCauses;
use crate::index::Index;
use crate::index::caches::Caches;
use crate::ipam::{ClaimHolders, Ipam, MacOwners};
use crate::kinds::{VirtualMachine, object_ref};
use crate::metrics::Metrics;
use crate::reconcile::context::{Agents, Books, Context, NotLeader, Signals, Stores};
use crate::reconcile::events::{EVENT_QUEUE, Events, Publisher};
use crate::reconcile::orphans::Orphans;
use crate::reconcile::status::PoolStatusWriter;
use crate::reconcile::{agent_bootstrap, claim, ippool, vm, vmnetcfg};
use crate::reports::Reports;

/// A reconcile failed (wraps each reconciler's own error).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// IPPool.
    #[error(transparent)]
    IPPool(#[from] ippool::Error),
    /// VirtualMachineNetworkConfig.
    #[error(transparent)]
    Vmnetcfg(#[from] vmnetcfg::Error),
    /// VirtualMachine.
    #[error(transparent)]
    Vm(#[from] vm::Error),
    /// AddressClaim.
    #[error(transparent)]
    Claim(#[from] claim::Error),
}

impl ReconcileError {
    /// Leadership was lost under the reconcile: not a failure, the write was just not made.
    /// Anywhere in the chain: a reconciler's error mostly comes wrapped by kube's finalizer
    /// helper (`ApplyFailed`, `CleanupFailed`).
    fn is_not_leader(&self) -> bool {
        let said_here = |e: &(dyn std::error::Error + 'static)| {
            e.is::<NotLeader>()
                || matches!(
                    e.downcast_ref::<ippool::Error>(),
                    Some(ippool::Error::NotLeader(_))
                )
                || matches!(
                    e.downcast_ref::<vmnetcfg::Error>(),
                    Some(vmnetcfg::Error::NotLeader(_))
                )
                || matches!(e.downcast_ref::<vm::Error>(), Some(vm::Error::NotLeader(_)))
                || matches!(
                    e.downcast_ref::<claim::Error>(),
                    Some(claim::Error::NotLeader(_))
                )
        };
        // The variants are transparent: the chain starts at the reconciler's own error.
        let inner: &(dyn std::error::Error + 'static) = match self {
            ReconcileError::IPPool(e) => e,
            ReconcileError::Vmnetcfg(e) => e,
            ReconcileError::Vm(e) => e,
            ReconcileError::Claim(e) => e,
        };
        std::iter::successors(Some(inner), |e| e.source()).any(said_here)
    }
}

/// Per-object retry delays: from 1 s, doubling up to 5 min, with jitter
/// ([`vmdhcp_core::retry::exponential`]); a success starts the object's series again. Holds
/// an entry only for objects whose last reconcile failed. A failure for want of the API server
/// ([`is_transient`]) waits at most [`Backoff::TRANSIENT_MAX`]: through a few API outages in a
/// row an object's delay would otherwise double past minutes, and it would catch up that long
/// after the API came back, when nothing else wakes it (its watch resumed without a relist).
#[derive(Default)]
struct Backoff(Mutex<HashMap<String, vmdhcp_core::retry::Delays>>);

impl Backoff {
    const MIN: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(300);
    const TRANSIENT_MAX: Duration = Duration::from_secs(15);

    fn failed(&self, key: String, transient: bool) -> Duration {
        let mut m = self.0.lock();
        let delay = m
            .entry(key)
            .or_insert_with(|| vmdhcp_core::retry::exponential(Self::MIN, Self::MAX))
            .next()
            .unwrap_or(Self::MAX);
        if transient {
            delay.min(Self::TRANSIENT_MAX)
        } else {
            delay
        }
    }

    fn succeeded(&self, key: &str) {
        self.0.lock().remove(key);
    }
}

/// Whether `err` failed for want of the API server (unreachable, restarting, overloaded:
/// a connection error, a 5xx or a 429 anywhere in its chain of sources), not because the API
/// refused the request.
fn is_transient(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(k) = e.downcast_ref::<kube::Error>() {
            return match k {
                kube::Error::Api(s) => s.code >= 500 || s.code == 429,
                kube::Error::HyperError(_)
                | kube::Error::Service(_)
                | kube::Error::ReadEvents(_) => true,
                _ => false,
            };
        }
        next = e.source();
    }
    false
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
        && let Some(cause) = term.ctx.signals.causes.vmnetcfgs.get(name)
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
        .signals
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
        let delay = term
            .backoff
            .failed(key(kind, obj.as_ref()), is_transient(err));
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
pub(super) struct Shared {
    pub(super) caches: Caches,
    pub(super) index: Arc<Index>,
    pub(super) reports: Arc<Reports>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) ipam_slot: Arc<RwLock<Option<Arc<Ipam>>>>,
    pub(super) causes: Arc<TraceCauses>,
}

/// Runs the writers for one leadership term, until the future is dropped (leadership lost:
/// writes stop at once) or `stop` turns true (shutdown: no new reconcile starts, those in
/// flight finish their writes, then it returns).
pub(super) async fn lead(
    client: Client,
    settings: Settings,
    shared: Shared,
    leader: watch::Receiver<bool>,
    stop: watch::Receiver<bool>,
) {
    // The process's shared watches (see `shared_watch`): a reconcile woken by an event always
    // reads a cache that has applied it, the API server sends each event once, and a new term
    // starts from caches that are already full (VMs and NADs too, though only a leader reads
    // them: listing every VM when a term starts would be most of a failover).
    let shared_caches = shared.caches.clone();
    let pools = shared_caches.pools.store();
    let (pool_self, pool_siblings, pool_for_cfgs) = (
        shared_caches.pools.trigger(),
        shared_caches.pools.trigger(),
        shared_caches.pools.trigger(),
    );
    let (vm_watch, nad_watch) = (&shared_caches.vms, &shared_caches.nads);
    let vms = vm_watch.store();
    // A term's first pass reconciles every cached config and VM once; paced, so what changes
    // meanwhile (a VM created while there was no leader) does not wait behind them all. Sorted
    // once every cache is whole (a VM looks unsettled by the configs cache).
    let (caches_tx, caches) = watch::channel(false);
    let caches_whole = || {
        let mut caches = caches.clone();
        async move {
            // Err: the term is ending; nothing will be reconciled anyway.
            let _ = caches.wait_for(|whole| *whole).await;
        }
    };
    let cfgs = shared_caches.configs.store();
    let (cfg_backlog, vm_backlog) = (Arc::new(Backlog::default()), Arc::new(Backlog::default()));
    let vm_self = replay::paced_trigger(
        vm_watch,
        {
            let cfgs = cfgs.clone();
            move |vm: &VirtualMachine| vm::looks_unsettled(vm, &cfgs)
        },
        vm_backlog.clone(),
        caches_whole(),
    );
    // The configs' own first pass covers every config the VMs' first list would wake.
    let vm_for_cfgs = replay::changes_after_list(vm_watch);
    let writer = Arc::new(PoolStatusWriter::new(shared.metrics.clone()));
    let pool_ctrl = pool_controller(
        &pools,
        &shared_caches.pool_networks,
        (pool_self, pool_siblings),
        nad_watch.trigger(),
        &shared.reports,
        &writer,
    )
    .graceful_shutdown_on(stopped(stop.clone()));
    let cfg_ctrl = Controller::for_shared_stream(
        replay::paced_trigger(
            &shared_caches.configs,
            vmnetcfg::looks_unsettled,
            cfg_backlog.clone(),
            caches_whole(),
        ),
        cfgs.clone(),
    );
    let vm_ctrl = Controller::for_shared_stream(vm_self, vms.clone());
    // A VM's shown addresses follow its config's status.
    let vm_ctrl = if settings.vm_address_annotation {
        vm_ctrl.watches_shared_stream(
            replay::changes_after_list(&shared_caches.configs),
            |cfg: Arc<VirtualMachineNetworkConfig>| {
                Some(ObjectRef::new(&cfg.name_any()).within(&cfg.namespace().unwrap_or_default()))
            },
        )
    } else {
        vm_ctrl
    }
    .graceful_shutdown_on(stopped(stop.clone()));
    let (pool_rebuilt, rebuilt_networks) = mpsc::channel(POOL_REBUILT_QUEUE);
    let cfg_ctrl = config_triggers(
        cfg_ctrl.graceful_shutdown_on(stopped(stop.clone())),
        shared_caches.config_index.clone(),
        (
            vm_for_cfgs,
            replay::changes_after_list(&shared_caches.configs),
        ),
        pool_for_cfgs,
    )
    .reconcile_on(members_of(
        rebuilt_networks,
        shared_caches.config_index.clone(),
    ));

    let claims = shared_caches.claims.store();
    let claim_ctrl = claim_controller(
        &shared_caches.claims,
        &claims,
        vm_watch.trigger(),
        shared_caches.pools.trigger(),
        &writer,
    )
    .graceful_shutdown_on(stopped(stop.clone()));
    // A config bound to a claim follows the claim's changes.
    let cfg_ctrl = {
        let configs = shared_caches.config_index.clone();
        let cfg_store = cfgs.clone();
        cfg_ctrl.watches_shared_stream(
            replay::changes_after_list(&shared_caches.claims),
            move |c: Arc<AddressClaim>| configs_of_claim(&c, &configs, &cfg_store),
        )
    };

    let ipam = Arc::new(Ipam::new());
    *shared.ipam_slot.write() = Some(ipam.clone());
    let reporter = Reporter {
        controller: "vm-dhcp-controller".into(),
        instance: Some(settings.identity.clone()),
    };
    let event_counts = shared.metrics.event_counts();
    let (events, queued_events) = Events::new(EVENT_QUEUE, event_counts.clone());
    // Every reconcile may start once every cache holds its first list, and the pools that were
    // ready have their IPAM back (see `ippool::prebuild`).
    let caches_ready = {
        let (shared_caches, vms, nads, claims_ready) = (
            shared_caches.clone(),
            vm_watch.ready(),
            nad_watch.ready(),
            shared_caches.claims.ready(),
        );
        let (client, ipam, writer) = (client.clone(), ipam.clone(), writer.clone());
        // AddressClaims are optional: a cluster upgraded without the new CRD, or an RBAC that
        // does not grant them, must still get its addresses. The first list normally takes
        // milliseconds; past the bound the term starts without it (and the claims are held
        // once the watch lists them).
        let claims_ready = async move {
            if tokio::time::timeout(CLAIMS_LIST_WAIT, claims_ready)
                .await
                .is_err()
            {
                warn!(
                    waited = ?CLAIMS_LIST_WAIT,
                    "AddressClaims cannot be listed (their CRD not applied, or not granted): \
                     reconciles start without them; no claim is held until they can be"
                );
            }
        };
        async move {
            tokio::join!(shared_caches.ready(), vms, nads, claims_ready);
            let pools = pools_of_record(&client).await;
            let built = ippool::prebuild(&pools, &ipam, &writer);
            caches_tx.send_replace(true);
            info!(
                pools = built,
                "caches filled, IPAM rebuilt from pool status: reconciles may start"
            );
        }
    };
    let ctx = Arc::new(Context {
        client: client.clone(),
        leader,
        stores: Stores {
            pools,
            vmnetcfgs: cfgs,
            vms,
            nads: nad_watch.store(),
            claims,
            pool_networks: shared_caches.pool_networks.clone(),
            config_index: shared_caches.config_index.clone(),
            ready: caches,
        },
        books: Books {
            ipam,
            mac_owners: MacOwners::default(),
            claim_holders: ClaimHolders::default(),
            writer,
            orphans: Orphans::new(settings.orphan_grace),
            written: Default::default(),
            rebuilt: pool_rebuilt,
        },
        agents: Agents {
            deployment: settings.agent.clone(),
            deployment_missing: Default::default(),
            reports: shared.reports.clone(),
        },
        signals: Signals {
            events,
            metrics: shared.metrics,
            causes: shared.causes,
        },
        vm_address_annotation: settings.vm_address_annotation,
    });
    let term = Arc::new(Term {
        ctx: ctx.clone(),
        backoff: Backoff::default(),
    });

    let pools_run = drive(
        pool_ctrl,
        "ippool",
        term.clone(),
        ippool::reconcile,
        Arc::default(),
    );
    let cfgs_run = drive(
        cfg_ctrl,
        "vmnetcfg",
        term.clone(),
        vmnetcfg::reconcile,
        cfg_backlog,
    );
    let vms_run = drive(vm_ctrl, "vm", term.clone(), vm::reconcile, vm_backlog);
    let claims_run = drive(
        claim_ctrl,
        "claim",
        term.clone(),
        claim::reconcile,
        Arc::default(),
    );
    let bootstrap = async {
        match settings.agent.clone() {
            Some(target) => {
                agent_bootstrap::run(ctx.clone(), shared.index, target, stop.clone()).await
            }
            None => stopped(stop.clone()).await,
        }
    };
    // Events are published by one task per term, from a bounded queue.
    let events_task = Events::run(
        Publisher::new(client.clone(), reporter),
        queued_events,
        event_counts,
    );
    // The writers end together on `stop`, each after its last write; the watches feeding them
    // never end on their own.
    let writers = async {
        tokio::join!(pools_run, cfgs_run, vms_run, claims_run, bootstrap);
    };
    tokio::select! {
        () = writers => info!("reconcilers stopped; their writes are finished"),
        () = async {
            tokio::join!(events_task, caches_ready);
            // The event queue's sender lives in the context, as long as the writers.
            std::future::pending::<()>().await
        } => {}
    }
}

/// Every IPPool as etcd holds it now: a LIST without a resourceVersion, which the API server
/// answers with a quorum read, never from its watch cache. A new term builds its IPAM from this,
/// not from this replica's cache, which may trail the last term's final writes (a standby's
/// watch delayed, or an API server's watch cache behind etcd): an allocation it has not seen
/// could otherwise be handed out again before the first write would notice. Retried until it
/// succeeds (with the API server down no write can be made either); the term's end drops it.
async fn pools_of_record(client: &Client) -> Vec<Arc<IPPool>> {
    let api: kube::Api<IPPool> = kube::Api::all(client.clone());
    let mut pause = Duration::from_millis(250);
    loop {
        match api.list(&kube::api::ListParams::default()).await {
            Ok(list) => return list.items.into_iter().map(Arc::new).collect(),
            Err(e) => {
                warn!(error = %e, retry_in = ?pause, "listing the pools of record failed; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(10));
            }
        }
    }
}

/// How long a term waits for the AddressClaims' first list before it starts without them.
const CLAIMS_LIST_WAIT: Duration = Duration::from_secs(10);

/// How many reconciles of one controller run at once. Each in flight may hold an API connection
/// (HTTP/1.1: one request per connection, kept open idle afterwards) and its buffers; unbounded,
/// a burst of 20 000 objects (a restart, a new leader) could open as many connections. And
/// kube-runtime's runner keeps the reconciles in flight in a `FutureHashMap` that polls every
/// one of them whenever it is woken (each trigger, each completion), a cost per allocation that
/// grows as a slower API server keeps more reconciles waiting. 64 is low enough for that, and
/// still lets the configs allocating on one pool together share its status write
/// ([`PoolStatusWriter`]). The measurements behind 64: docs/tuning.md.
const RECONCILE_CONCURRENCY: u16 = 64;

/// Runs one controller until it ends: every reconcile timed and traced ([`timed`]), failures
/// retried with the term's per-object backoff, the rest of its stream logged; at most
/// [`RECONCILE_CONCURRENCY`] reconciles at once. Each start, and each queued object found gone,
/// is counted off the controller's first-pass `backlog` ([`replay`]).
async fn drive<K, R, F, E>(
    ctrl: Controller<K>,
    kind: &'static str,
    term: Arc<Term>,
    reconcile: R,
    backlog: Arc<Backlog>,
) where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Debug + Eq + Hash + Clone + Unpin,
    R: Fn(Arc<K>, Arc<Context>) -> F,
    F: Future<Output = Result<Action, E>> + Send + 'static,
    E: Into<ReconcileError>,
{
    let gone = backlog.clone();
    ctrl.with_config(controller::Config::default().concurrency(RECONCILE_CONCURRENCY))
        .run(
            move |o: Arc<K>, t: Arc<Term>| {
                backlog.taken();
                let fut = reconcile(o.clone(), t.ctx.clone());
                async move {
                    // Futures are lazy: the reconcile starts reading caches only once they are whole.
                    t.ctx.caches_ready().await;
                    timed(&t, kind, o.as_ref(), fut).await
                }
            },
            error_policy(kind),
            term,
        )
        .for_each(|r| {
            if matches!(r, Err(controller::Error::ObjectNotFound(_))) {
                gone.taken();
            }
            log_outcome(kind, r);
            std::future::ready(())
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(Status::failure("m", "r").with_code(code).boxed())
    }

    /// `source` as the config reconciler returns it: its own error, wrapped by kube's
    /// finalizer helper, as every error of a real reconcile is.
    fn through_a_reconciler(source: kube::Error) -> ReconcileError {
        wrapped(vmnetcfg::Error::Kube {
            action: "writing".into(),
            source,
        })
    }

    fn wrapped(inner: vmnetcfg::Error) -> ReconcileError {
        use kube::runtime::finalizer::Error as Finalizer;
        ReconcileError::Vmnetcfg(vmnetcfg::Error::Finalizer(Box::new(
            Finalizer::ApplyFailed(inner),
        )))
    }

    #[test]
    fn a_lost_leadership_is_seen_through_the_finalizer_wrapper() {
        use kube::runtime::finalizer::Error as Finalizer;
        let lost = || vmnetcfg::Error::NotLeader(NotLeader);
        assert!(ReconcileError::Vmnetcfg(lost()).is_not_leader());
        assert!(wrapped(lost()).is_not_leader());
        let cleanup = vmnetcfg::Error::Finalizer(Box::new(Finalizer::CleanupFailed(lost())));
        assert!(ReconcileError::Vmnetcfg(cleanup).is_not_leader());
        let pool = ippool::Error::Finalizer(Box::new(Finalizer::ApplyFailed(
            ippool::Error::NotLeader(NotLeader),
        )));
        assert!(ReconcileError::IPPool(pool).is_not_leader());
        assert!(!through_a_reconciler(api(503)).is_not_leader());
        assert!(!wrapped(vmnetcfg::Error::Unnamespaced).is_not_leader());
    }

    #[test]
    fn api_outages_are_transient_and_refusals_are_not() {
        for code in [500, 503, 504, 429] {
            assert!(is_transient(&through_a_reconciler(api(code))), "{code}");
        }
        for code in [403, 404, 409, 422] {
            assert!(!is_transient(&through_a_reconciler(api(code))), "{code}");
        }
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let unreachable = kube::Error::Service(Box::new(refused));
        assert!(is_transient(&through_a_reconciler(unreachable)));
        // The finalizer's own patches, adding or removing it.
        use kube::runtime::finalizer::Error as Finalizer;
        for (code, transient) in [(503, true), (409, false)] {
            let add = vmnetcfg::Error::Finalizer(Box::new(Finalizer::AddFinalizer(api(code))));
            assert_eq!(is_transient(&ReconcileError::Vmnetcfg(add)), transient);
            let remove =
                vmnetcfg::Error::Finalizer(Box::new(Finalizer::RemoveFinalizer(api(code))));
            assert_eq!(is_transient(&ReconcileError::Vmnetcfg(remove)), transient);
        }
        // Deeper in the chain: a status write's API error inside a reconciler's error.
        let status = vmnetcfg::Error::Status(crate::reconcile::status::StatusError::Api {
            pool: "ns/p".parse().unwrap(),
            source: api(503),
        });
        assert!(is_transient(&wrapped(status)));
        assert!(!is_transient(&ReconcileError::Vmnetcfg(
            vmnetcfg::Error::Unnamespaced
        )));
    }

    #[test]
    fn a_transient_failure_waits_at_most_the_transient_bound() {
        let backoff = Backoff::default();
        let delays: Vec<Duration> = (0..12).map(|_| backoff.failed("k".into(), true)).collect();
        assert!(
            delays.iter().all(|d| *d <= Backoff::TRANSIENT_MAX),
            "{delays:?}"
        );
        // The series goes on underneath: a refusal after them waits the long delay.
        assert!(backoff.failed("k".into(), false) > Backoff::TRANSIENT_MAX);
        backoff.succeeded("k");
        assert!(backoff.failed("k".into(), false) <= Duration::from_secs(2));
    }
}
