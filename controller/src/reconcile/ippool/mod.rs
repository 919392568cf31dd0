//! The IPPool reconciler (leader only): registers the pool on its network, builds its IPAM from
//! status, keeps `RESERVED`/`EXCLUDED`, `used`/`available` and the conditions current (among
//! them, from the serving agent's report, the hosts found acting where they should not on the
//! pool's network: `ForeignDHCPServer`, `ProxyARPResponder`), and on pause or deletion lets go
//! of everything in memory while keeping the allocations in etcd.
//!
//! Order of work follows upstream (docs/compatibility.md) with its bugs fixed: IPAM is
//! keyed by pool, a second pool on a network is refused rather than clobbering the first, and
//! metrics are removed under the labels they were created with.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use serde_json::json;
use tracing::{info, warn};
use vmdhcp_core::crd::{
    AddressConflict, CONDITION_AGENT_READY, CONDITION_CACHE_READY, CONDITION_FOREIGN_DHCP_SERVER,
    CONDITION_PROXY_ARP_RESPONDER, CONDITION_PROXY_NDP_RESPONDER, CONDITION_REGISTERED,
    CONDITION_STOPPED, Condition, IPPool, IPPoolStatus, LABEL_IPPOOL_NAME, LABEL_IPPOOL_NAMESPACE,
    find_condition,
};
use vmdhcp_core::pool::{Family, MAX_CONFLICTS_PER_HOST, PoolRange, ValidPool};

use crate::index::pools::serving_order;
use crate::ipam::{IpamError, PoolAllocator, PoolBooks};
use crate::kinds::{nad_resource, network_of, object_ref};
use crate::metrics::PoolLabels;
use crate::reconcile::context::{Context, IPPOOL_FINALIZER, NotLeader};
use crate::reconcile::status::{PoolStatusWriter, StatusError, Wanted, update_pool_status};
use crate::reports::{
    AddressProbe, AgentReport, InterfaceReport, InterfaceState, NetworkSuspect, ProbeReason,
    SuspectKind,
};
use vmdhcp_core::{MacAddr, NamespacedName};

mod agents;
mod unnamed;

use agents::*;
pub use agents::{
    ConflictChanges, REPORT_FRESHNESS, SuspectFindings, agent_ready, apply_probes,
    network_suspects, serving_probes,
};

/// Why an IPPool reconcile failed (it is retried with per-object backoff).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done.
        action: String,
        /// The API error.
        source: kube::Error,
    },
    /// Writing status failed.
    #[error(transparent)]
    Status(#[from] StatusError),
    /// The IPAM refused.
    #[error(transparent)]
    Ipam(#[from] IpamError),
    /// Leadership was lost.
    #[error(transparent)]
    NotLeader(#[from] NotLeader),
    /// Adding or removing the finalizer failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// The object has no namespace.
    #[error("IPPool without namespace")]
    Unnamespaced,
    /// Retiring upstream's agent pod failed.
    #[error(transparent)]
    UpstreamAgent(crate::reconcile::upstream_agent::UpstreamAgentError),
}

fn labels(range: &PoolRange, network: &NamespacedName) -> PoolLabels {
    PoolLabels {
        ippool: range.pool().to_string(),
        cidr: range.subnet().to_string(),
        network: network.to_string(),
    }
}

/// Reconciles one IPPool.
pub async fn reconcile(pool: Arc<IPPool>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.ensure_leader()?;
    let ns = pool.namespace().ok_or(Error::Unnamespaced)?;
    let api: Api<IPPool> = Api::namespaced(ctx.client.clone(), &ns);
    finalizer(&api, IPPOOL_FINALIZER, pool, |event| async {
        match event {
            Finalizer::Apply(p) => apply(p, ctx.clone()).await,
            Finalizer::Cleanup(p) => cleanup(p, ctx.clone()).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

/// Writes the conditions (and, when the IPAM holds the pool, the books) in one status update;
/// with the books, through the pool's status writer, so that it is one write among the
/// allocations' and covers them.
async fn write_status(
    ctx: &Context,
    pool: &NamespacedName,
    conditions: &[Wanted],
    books: bool,
) -> Result<(), Error> {
    ctx.ensure_leader()?;
    let set = |status: &mut IPPoolStatus| {
        for wanted in conditions {
            wanted.apply(&mut status.conditions);
        }
    };
    if books {
        let kept = ctx
            .books
            .writer
            .persist_with(
                &ctx.client,
                Some(&ctx.stores.pools),
                &ctx.books.ipam,
                pool,
                set,
            )
            .await?;
        ctx.report_foreign(pool, &kept);
    } else {
        update_pool_status(&ctx.client, Some(&ctx.stores.pools), pool, |status| {
            set(status);
            Ok(())
        })
        .await?;
    }
    Ok(())
}

/// How often a served pool is reconciled when nothing wakes it: what bounds drift from writes
/// no watch event woke it for.
const RESYNC: Duration = Duration::from_secs(300);

/// Drops what this replica holds in memory for a pool (its IPPool stays, with its allocations).
fn forget(ctx: &Context, pool_ref: &NamespacedName) {
    ctx.books.ipam.remove(pool_ref);
    ctx.books.orphans.forget_pool(pool_ref);
    ctx.books.mac_owners.forget_pool(pool_ref);
    ctx.signals.metrics.remove_pool(&pool_ref.to_string());
}

/// Refuses to register a pool: a warning event and `Registered=False` with `reason`; its IPAM
/// is forgotten, so `CacheReady=False` too (the configs on its network wait for no rebuild).
async fn refuse(
    ctx: &Context,
    pool: &IPPool,
    pool_ref: &NamespacedName,
    reason: &'static str,
    message: String,
) -> Result<(), Error> {
    ctx.event(
        pool,
        EventType::Warning,
        reason,
        "Register",
        message.clone(),
    );
    write_status(
        ctx,
        pool_ref,
        &[
            Wanted::new(CONDITION_REGISTERED, false).because(reason, message),
            Wanted::new(CONDITION_CACHE_READY, false).because(reason, ""),
        ],
        false,
    )
    .await
}

async fn apply(pool: Arc<IPPool>, ctx: Arc<Context>) -> Result<Action, Error> {
    let Some(pool_ref) = object_ref(pool.as_ref()) else {
        return Err(Error::Unnamespaced);
    };
    let valid = match ValidPool::parse(&pool) {
        Ok(valid) => valid,
        Err(invalid) => {
            forget(&ctx, &pool_ref);
            refuse(&ctx, &pool, &pool_ref, "InvalidSpec", invalid.to_string()).await?;
            return Ok(Action::await_change());
        }
    };
    let (range, network) = (valid.range(), valid.network());

    // One pool per network.
    if let Some(owner) = ctx.pool_for_network(network)
        && object_ref(owner.as_ref()).as_ref() != Some(&pool_ref)
    {
        let owner = format!(
            "{}/{}",
            owner.namespace().unwrap_or_default(),
            owner.name_any()
        );
        let message = format!("network {network} is already served by IPPool {owner}");
        forget(&ctx, &pool_ref);
        refuse(&ctx, &pool, &pool_ref, "NetworkInUse", message).await?;
        return Ok(Action::requeue(Duration::from_secs(60)));
    }

    if let Some(retry) = label_network(&ctx, &pool, &pool_ref, network).await? {
        return Ok(retry);
    }

    if pool.spec.paused == Some(true) {
        forget(&ctx, &pool_ref);
        write_status(
            &ctx,
            &pool_ref,
            &[
                Wanted::new(CONDITION_REGISTERED, true),
                Wanted::new(CONDITION_STOPPED, true).because("Paused", ""),
                // Its IPAM is forgotten: after a restart, nothing waits for it to be rebuilt.
                Wanted::new(CONDITION_CACHE_READY, false).because("Paused", ""),
            ],
            false,
        )
        .await?;
        info!(pool = %pool_ref, "pool paused; allocations kept in status");
        return Ok(Action::await_change());
    }

    rebuild_ipam(&ctx, &pool, &pool_ref, &valid).await?;
    // Released in the books here, recorded by the status write below.
    let unnamed_due = unnamed::release_unnamed(&ctx, &pool, &pool_ref, network)?;
    // One copy of the agents' reports serves both the conflicts and `AgentReady`.
    let (reports, now) = (ctx.agents.reports.all(), SystemTime::now());
    record_conflicts(&ctx, &pool, &pool_ref, &reports, now).await;
    let agent = agent_condition(&ctx, &pool_ref, &reports, now);
    let previous = pool.status.as_ref().map_or(&[][..], |s| &s.conditions[..]);
    let suspects = network_suspects(&reports, &pool_ref, now, previous);
    let [foreign_dhcp, proxy_arp, proxy_ndp] = suspects.conditions.clone();
    write_status(
        &ctx,
        &pool_ref,
        &[
            Wanted::new(CONDITION_REGISTERED, true),
            Wanted::new(CONDITION_STOPPED, false),
            Wanted::new(CONDITION_CACHE_READY, true),
            agent.clone(),
            foreign_dhcp,
            proxy_arp,
            proxy_ndp,
        ],
        true,
    )
    .await?;
    report_suspects(&ctx, &pool, &pool_ref, &suspects);
    if agent.status {
        // Our agent serves the pool: upstream's agent pod, if the Go controller left one, goes.
        crate::reconcile::upstream_agent::retire(&ctx, &pool, &pool_ref)
            .await
            .map_err(|e| match e {
                crate::reconcile::upstream_agent::UpstreamAgentError::NotLeader(n) => {
                    Error::NotLeader(n)
                }
                other => Error::UpstreamAgent(other),
            })?;
    }
    let (used, available) = ctx
        .books
        .ipam
        .with_pool(&pool_ref, |a| (a.used(), a.available()))?;
    ctx.signals
        .metrics
        .set_pool(labels(range, network), used, available);
    Ok(Action::requeue(
        unnamed_due.map_or(RESYNC, |due| due.min(RESYNC)),
    ))
}

/// Labels the pool's network (NAD) with the pool that serves it. Returns when to look again if
/// the network does not exist (the pool is refused meanwhile).
async fn label_network(
    ctx: &Context,
    pool: &IPPool,
    pool_ref: &NamespacedName,
    network: &NamespacedName,
) -> Result<Option<Action>, Error> {
    let labelled = |nad: &DynamicObject| {
        let l = nad.labels();
        l.get(LABEL_IPPOOL_NAMESPACE) == Some(&pool_ref.namespace)
            && l.get(LABEL_IPPOOL_NAME) == Some(&pool_ref.name)
    };
    // The cache answers the common case (labelled already) without a read per reconcile; what
    // it does not show yet is read from the API (a NAD just created, or just labelled by us).
    let cached = ctx.stores.nads.get(
        &kube::runtime::reflector::ObjectRef::new_with(&network.name, nad_resource())
            .within(&network.namespace),
    );
    if cached.is_some_and(|nad| labelled(&nad)) {
        return Ok(None);
    }
    let nads: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &network.namespace, &nad_resource());
    match nads.get_opt(&network.name).await {
        Err(source) => {
            return Err(Error::Kube {
                action: format!("reading NetworkAttachmentDefinition {network}"),
                source,
            });
        }
        Ok(None) => {
            let message = format!("NetworkAttachmentDefinition {network} not found");
            refuse(ctx, pool, pool_ref, "NetworkNotFound", message).await?;
            return Ok(Some(Action::requeue(Duration::from_secs(30))));
        }
        Ok(Some(nad)) => {
            if !labelled(&nad) {
                ctx.ensure_leader()?;
                let patch = json!({"metadata": {"labels": {LABEL_IPPOOL_NAMESPACE: pool_ref.namespace, LABEL_IPPOOL_NAME: pool_ref.name}}});
                nads.patch(
                    &network.name,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .map_err(|source| Error::Kube {
                    action: format!("labelling {network}"),
                    source,
                })?;
            }
        }
    }
    Ok(None)
}

/// The pool's books as its status records them, both families (the IPv6 ones when the pool
/// has an `ipv6Config`), with what could not be replayed.
fn allocator_from_status(pool: &IPPool, valid: &ValidPool) -> (PoolBooks, Vec<IpamError>) {
    let status = pool.status.as_ref();
    let recorded = status.and_then(|s| s.ipv4.as_ref());
    let allocated = recorded.map(|v| v.allocated.clone()).unwrap_or_default();
    let (mut allocator, mut problems) = PoolAllocator::rebuild(valid.range().clone(), &allocated);
    if let Some(v4) = recorded {
        problems.extend(allocator.restore_conflicts(&v4.conflicts));
        allocator.restore_host_names(&v4.host_names);
        allocator.restore_nic_options(&v4.dhcp_options);
    }
    let v6 = valid.ipv6().map(|v6| {
        let allocated = status
            .and_then(|s| s.ipv6.as_ref())
            .map(|v| v.allocated.clone())
            .unwrap_or_default();
        let (mut books, v6_problems) = PoolAllocator::rebuild(v6.range().clone(), &allocated);
        problems.extend(v6_problems);
        if let Some(v6) = status.and_then(|s| s.ipv6.as_ref()) {
            problems.extend(books.restore_conflicts(&v6.conflicts));
        }
        books
    });
    (PoolBooks { v4: allocator, v6 }, problems)
}

/// Whether a dual-stack pool's record lacks `status.ipv6` while it records IPv4 allocations:
/// what a writer that predates dual-stack leaves (upstream's controller, an older release).
fn lost_ipv6_record(pool: &IPPool, valid: &ValidPool) -> bool {
    let status = pool.status.as_ref();
    valid.ipv6().is_some()
        && status.is_some_and(|s| s.ipv6.is_none())
        && status
            .and_then(|s| s.ipv4.as_ref())
            .is_some_and(|v4| !v4.allocated.is_empty())
}

/// The ranges a pool's books are built on: IPv4, and IPv6 on a dual-stack pool. Books built on
/// other ranges are rebuilt.
fn ranges_of(valid: &ValidPool) -> (PoolRange, Option<PoolRange<Ipv6Addr>>) {
    (
        valid.range().clone(),
        valid.ipv6().map(|v6| v6.range().clone()),
    )
}

/// How long a rebuilt pool waits to hand its network to the config controller.
const POOL_REBUILT_WAIT: Duration = Duration::from_secs(5);

/// (Re)builds the pool's IPAM from what etcd records whenever it is missing or the range changed.
async fn rebuild_ipam(
    ctx: &Context,
    pool: &IPPool,
    pool_ref: &NamespacedName,
    valid: &ValidPool,
) -> Result<(), Error> {
    let current = ctx
        .books
        .ipam
        .with_books(pool_ref, |b| {
            (
                b.v4.range().clone(),
                b.v6.as_ref().map(|a| a.range().clone()),
            )
        })
        .ok();
    if current == Some(ranges_of(valid)) {
        return Ok(());
    }
    // From the record, not the cache (which may trail the last term's or another writer's
    // final writes): a GET is a quorum read. Under the status writer's lock, so that no write
    // lands between the read and the books built from it.
    let api: Api<IPPool> = Api::namespaced(ctx.client.clone(), &pool_ref.namespace);
    let problems = ctx
        .books
        .writer
        .rebuild(pool_ref, async || {
            let of_record = api
                .get_status(&pool_ref.name)
                .await
                .map_err(|source| Error::Kube {
                    action: format!("reading IPPool {pool_ref} to rebuild its IPAM"),
                    source,
                })?;
            let (allocator, problems) = allocator_from_status(&of_record, valid);
            ctx.books.mac_owners.forget_pool(pool_ref);
            ctx.books.ipam.insert_books(allocator);
            let ipv6_missing = lost_ipv6_record(&of_record, valid);
            Ok::<_, Error>((Arc::new(of_record), (problems, ipv6_missing)))
        })
        .await?;
    let (problems, ipv6_missing) = problems;
    if let (true, Some(network)) = (ipv6_missing, network_of(pool)) {
        let recorded = ctx.stores.config_index.allocated_ipv6_on(&network);
        if recorded > 0 {
            let message = format!(
                "status.ipv6 is missing (written by a controller that predates dual-stack?): the {recorded} IPv6 addresses the configs' status records stay theirs and are recorded again as each config is reconciled"
            );
            warn!(pool = %pool_ref, recorded, "the pool's IPv6 record is missing; kept from the configs' status");
            ctx.event(
                pool,
                EventType::Warning,
                "IPv6RecordMissing",
                "Rebuild",
                message,
            );
        }
    }
    for problem in problems.iter().take(5) {
        warn!(pool = %pool_ref, %problem, "status entry not replayed");
        ctx.event(
            pool,
            EventType::Warning,
            "StatusEntry",
            "Rebuild",
            problem.to_string(),
        );
    }
    info!(pool = %pool_ref, leases = ctx.books.ipam.with_pool(pool_ref, |a| a.used()).unwrap_or(0), "IPAM rebuilt from status");
    if let Some(network) = network_of(pool) {
        // Bounded: a term shutting down may no longer take them (the next term reconciles
        // every config anyway). Closed: the term is ending.
        let wake = ctx.books.rebuilt.send(network.clone());
        if tokio::time::timeout(POOL_REBUILT_WAIT, wake).await.is_err() {
            warn!(pool = %pool_ref, %network, "the configs on the network were not woken; they wait for their next change");
        }
    }
    Ok(())
}

/// Builds, when a leadership term starts, the IPAM of every pool its reconcile would rebuild
/// as it is: ready in the last term (`CacheReady`), valid, not paused or being deleted, the
/// pool serving its network, and with a status that replays without a problem (a pool with one
/// is left to its reconcile, which reports it). Returns how many were built.
///
/// Every config of such a pool can then be reconciled at once: without this, each of them
/// waits for its pool's reconcile, and after a failover at scale the configs (thousands) crowd
/// out the pools (hundreds) they wait for. The pool's reconcile still runs; it finds the IPAM
/// built, with the same range, and keeps it.
///
/// Each pool's status writer starts from the version its books were built from
/// ([`PoolStatusWriter::built_from`]).
pub fn prebuild(
    pools: &[Arc<IPPool>],
    ipam: &crate::ipam::Ipam,
    writer: &PoolStatusWriter,
) -> usize {
    // Which pool serves each network: the first in `serving_order`, as the reconcilers decide.
    let mut serving: BTreeMap<NamespacedName, &Arc<IPPool>> = BTreeMap::new();
    for pool in pools
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        let Some(network) = network_of(pool) else {
            continue;
        };
        serving
            .entry(network)
            .and_modify(|owner| {
                if serving_order(pool) < serving_order(owner) {
                    *owner = pool;
                }
            })
            .or_insert(pool);
    }
    let mut built = 0;
    for pool in serving.into_values() {
        let ready = pool.status.as_ref().is_some_and(|s| {
            find_condition(&s.conditions, CONDITION_CACHE_READY).is_some_and(|c| c.status == "True")
        });
        let (Ok(valid), Some(pool_ref)) = (ValidPool::parse(pool), object_ref(pool.as_ref()))
        else {
            continue;
        };
        // A record without its IPv6 side is left to the reconcile, which reports it.
        if !ready
            || pool.spec.paused == Some(true)
            || ipam.contains(&pool_ref)
            || lost_ipv6_record(pool, &valid)
        {
            continue;
        }
        let (allocator, problems) = allocator_from_status(pool, &valid);
        if problems.is_empty() {
            ipam.insert_books(allocator);
            writer.built_from(&pool_ref, Arc::clone(pool));
            built += 1;
        }
    }
    built
}

async fn cleanup(pool: Arc<IPPool>, ctx: Arc<Context>) -> Result<Action, Error> {
    let Some(pool_ref) = object_ref(pool.as_ref()) else {
        return Err(Error::Unnamespaced);
    };
    ctx.ensure_leader()?;
    forget(&ctx, &pool_ref);
    ctx.books.writer.forget(&pool_ref);
    if let Some(network) = network_of(&pool) {
        let nads: Api<DynamicObject> =
            Api::namespaced_with(ctx.client.clone(), &network.namespace, &nad_resource());
        if let Ok(Some(nad)) = nads.get_opt(&network.name).await
            && nad.labels().get(LABEL_IPPOOL_NAME) == Some(&pool_ref.name)
            && nad.labels().get(LABEL_IPPOOL_NAMESPACE) == Some(&pool_ref.namespace)
        {
            let patch = json!({"metadata": {"labels": {LABEL_IPPOOL_NAMESPACE: null, LABEL_IPPOOL_NAME: null}}});
            match nads
                .patch(
                    &network.name,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.is_not_found() => {}
                Err(source) => {
                    return Err(Error::Kube {
                        action: format!("unlabelling {network}"),
                        source,
                    });
                }
            }
        }
    }
    info!(pool = %pool_ref, "pool deleted; released everything");
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reports::{AgentIdentity, InterfaceReport};
    use std::net::Ipv4Addr;
    use vmdhcp_core::fixtures::{nn, pool_on, with_allocated, with_conditions};

    #[test]
    fn a_new_term_prebuilds_exactly_the_pools_their_reconcile_would_keep() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let at = |secs: i64| {
            Some(Time(
                k8s_openapi::jiff::Timestamp::from_second(secs).unwrap(),
            ))
        };
        let ready = |key: &str, network: &str, created: i64| {
            let mut p = with_conditions(
                with_allocated(
                    pool_on(key, network),
                    &[("192.168.48.82", "aa:bb:cc:00:00:01")],
                ),
                &[(CONDITION_CACHE_READY, true)],
            );
            p.metadata.creation_timestamp = at(created);
            p
        };
        let mut paused = ready("ns/paused", "ns/net-p", 1);
        paused.spec.paused = Some(true);
        let mut deleting = ready("ns/deleting", "ns/net-d", 1);
        deleting.metadata.deletion_timestamp = at(2);
        let mut invalid_owner = ready("ns/invalid", "ns/net-i", 1);
        invalid_owner.spec.ipv4_config.cidr = "not a cidr".into();
        let pools: Vec<Arc<IPPool>> = [
            ready("ns/ok", "ns/net-a", 1),
            // Second on net-b: the older one serves it.
            ready("ns/newer", "ns/net-b", 5),
            ready("ns/older", "ns/net-b", 3),
            // Not ready in the last term: its reconcile decides.
            with_conditions(
                pool_on("ns/unready", "ns/net-u"),
                &[(CONDITION_CACHE_READY, false)],
            ),
            paused,
            deleting,
            // An older invalid pool holds its network: the valid one will be refused.
            invalid_owner,
            ready("ns/refused", "ns/net-i", 9),
            // A status entry that does not replay: left to the reconcile, which reports it.
            with_conditions(
                with_allocated(
                    pool_on("ns/odd", "ns/net-o"),
                    &[("192.168.48.82", "not a mac")],
                ),
                &[(CONDITION_CACHE_READY, true)],
            ),
        ]
        .into_iter()
        .map(Arc::new)
        .collect();
        let ipam = crate::ipam::Ipam::new();
        let writer = PoolStatusWriter::new(Arc::new(crate::metrics::Metrics::default()));
        assert_eq!(prebuild(&pools, &ipam, &writer), 2);
        assert_eq!(ipam.pools(), [nn("ns/ok"), nn("ns/older")]);
        let mac: MacAddr = "aa:bb:cc:00:00:01".parse().unwrap();
        assert_eq!(
            ipam.with_pool(&nn("ns/ok"), |a| a.lookup(&mac)).unwrap(),
            Some("192.168.48.82".parse().unwrap()),
            "built from the recorded allocations"
        );
        // Built already: a second call (or the pool's reconcile) keeps it.
        assert_eq!(prebuild(&pools, &ipam, &writer), 0);
    }

    fn report(leader: bool, age: u64, state: InterfaceState, error: &str) -> AgentReport {
        AgentReport {
            agent: AgentIdentity {
                pod_name: "agent-0".into(),
                namespace: "vmdhcp".into(),
                node_name: "n".into(),
            },
            epoch: "e".into(),
            applied_revision: 7,
            leader,
            interfaces: vec![InterfaceReport {
                pool_ref: "ns/pool".into(),
                interface_name: "vmd1".into(),
                state,
                error: error.into(),
                lease_count: 3,
                probes: vec![],
                suspects: vec![],
            }],
            received_at: SystemTime::now() - Duration::from_secs(age),
        }
    }

    /// `pool`'s IPv4 range: 192.0.2.10–20 of 192.0.2.0/24, the server at .1.
    fn range_v4(pool: NamespacedName) -> PoolRange {
        PoolRange::new(
            pool,
            "192.0.2.0/24".parse().unwrap(),
            (Ipv4Addr::new(192, 0, 2, 10), Ipv4Addr::new(192, 0, 2, 20)),
            Ipv4Addr::new(192, 0, 2, 1),
            None,
            vec![],
        )
        .unwrap()
    }

    /// A restart rebuilds both families' conflicts from the status, so an IPv6 address another
    /// host uses stays blocked across leaders.
    #[test]
    fn ipv6_conflicts_survive_a_rebuild_from_status() {
        let mut pool = vmdhcp_core::fixtures::dual_stack_pool();
        let conflict = AddressConflict {
            mac_address: "02:00:00:00:00:01".into(),
            answered_by: "02:00:00:00:00:09".into(),
            source: "Decline".into(),
            since: None,
        };
        pool.status = Some(vmdhcp_core::crd::IPPoolStatus {
            ipv6: Some(vmdhcp_core::crd::IPv6Status {
                conflicts: [("fd00::11".to_owned(), conflict.clone())].into(),
                ..Default::default()
            }),
            ..Default::default()
        });
        let valid = ValidPool::parse(&pool).unwrap();
        let (books, problems) = allocator_from_status(&pool, &valid);
        assert!(problems.is_empty(), "{problems:?}");
        let a6 = books.v6.unwrap();
        assert_eq!(a6.conflict("fd00::11".parse().unwrap()), Some(&conflict));
        assert!(books.v4.status_conflicts().is_empty());
    }

    /// A dual-stack pool's verdicts go to the books of their family: an IPv6 address another
    /// host answers a Neighbor Solicitation for is recorded on the IPv6 books, and the IPv4
    /// books never see it.
    #[test]
    fn ipv6_verdicts_are_recorded_on_the_ipv6_books_only() {
        let pool: NamespacedName = "ns/pool".parse().unwrap();
        let vm: MacAddr = "02:00:00:00:00:01".parse().unwrap();
        let squatter: MacAddr = "02:00:00:00:00:09".parse().unwrap();
        let v6 = |s: &str| s.parse::<Ipv6Addr>().unwrap();
        let range6 = PoolRange::new_v6(
            pool.clone(),
            "fd00::/112".parse().unwrap(),
            (v6("fd00::10"), v6("fd00::20")),
            v6("fd00::1"),
            None,
            vec![],
        )
        .unwrap();
        let (mut a4, mut a6) = (
            PoolAllocator::new(range_v4(pool)),
            PoolAllocator::new(range6),
        );
        let probes = [
            AddressProbe {
                ip: v6("fd00::11").into(),
                mac: Some(vm),
                answered_by: Some(squatter),
                reason: ProbeReason::Decline,
            },
            AddressProbe {
                ip: v6("fd00::12").into(),
                mac: None,
                answered_by: None,
                reason: ProbeReason::Recheck,
            },
        ];
        let since = crate::reconcile::status::now();
        assert_eq!(
            apply_probes(&mut a4, &probes, &since),
            ConflictChanges::default()
        );
        a6.record_conflict(v6("fd00::12"), AddressConflict::default())
            .unwrap();
        let changes = apply_probes(&mut a6, &probes, &since);
        assert_eq!(
            changes.recorded,
            [(IpAddr::from(v6("fd00::11")), squatter, ProbeReason::Decline)]
        );
        assert_eq!(changes.cleared, [IpAddr::from(v6("fd00::12"))]);
        let recorded = a6.conflict(v6("fd00::11")).unwrap();
        assert_eq!(recorded.mac_address, vm.to_string());
        assert_eq!(recorded.source, "Decline");
        assert!(a4.status_conflicts().is_empty());
        assert_eq!(a6.status_conflicts().len(), 1);
    }

    #[test]
    fn conflicts_come_from_the_serving_leaders_verdicts_only() {
        let pool: NamespacedName = "ns/pool".parse().unwrap();
        let vm: MacAddr = "02:00:00:00:00:01".parse().unwrap();
        let squatter: MacAddr = "02:00:00:00:00:09".parse().unwrap();
        let verdict = |last: u8, answered_by, reason| AddressProbe {
            ip: Ipv4Addr::new(192, 0, 2, last).into(),
            mac: Some(vm),
            answered_by,
            reason,
        };
        let mut old = report(true, 30, InterfaceState::Serving, "");
        old.interfaces[0].probes = vec![verdict(10, None, ProbeReason::Recheck)];
        let mut new = report(true, 1, InterfaceState::Serving, "");
        new.interfaces[0].probes = vec![
            verdict(10, Some(squatter), ProbeReason::Offer),
            // The client's own answer is no conflict.
            verdict(11, Some(vm), ProbeReason::Decline),
            verdict(12, None, ProbeReason::Recheck),
            verdict(99, Some(squatter), ProbeReason::Offer),
        ];
        let standby = report(false, 0, InterfaceState::Standby, "");
        let reports = BTreeMap::from([
            ("vmdhcp/agent-0".to_owned(), old),
            ("vmdhcp/agent-1".to_owned(), new),
            ("vmdhcp/agent-2".to_owned(), standby),
        ]);
        let (agent, probes) = serving_probes(&reports, &pool, SystemTime::now()).unwrap();
        assert_eq!((agent, probes.len()), ("vmdhcp/agent-1", 4));

        let mut alloc = PoolAllocator::new(range_v4(pool.clone()));
        let since = crate::reconcile::status::now();
        alloc
            .record_conflict(Ipv4Addr::new(192, 0, 2, 12), AddressConflict::default())
            .unwrap();
        let changes = apply_probes(&mut alloc, probes, &since);
        assert_eq!(
            changes.recorded,
            [(
                IpAddr::from(Ipv4Addr::new(192, 0, 2, 10)),
                squatter,
                ProbeReason::Offer
            )]
        );
        assert_eq!(
            changes.cleared,
            [IpAddr::from(Ipv4Addr::new(192, 0, 2, 12))]
        );
        assert!(
            matches!(changes.refused[..], [IpamError::OutsideRange { .. }]),
            "{:?}",
            changes.refused
        );
        let recorded = alloc.conflict(Ipv4Addr::new(192, 0, 2, 10)).unwrap();
        assert_eq!(recorded.answered_by, squatter.to_string());
        assert_eq!(recorded.source, "Probe");
        // The same report again changes nothing.
        assert_eq!(
            apply_probes(&mut alloc, &probes[..3], &since),
            ConflictChanges::default()
        );

        // One host answering for every address holds at most MAX_CONFLICTS_PER_HOST of them.
        let all: Vec<AddressProbe> = (13..=20)
            .map(|last| verdict(last, Some(squatter), ProbeReason::Offer))
            .collect();
        let changes = apply_probes(&mut alloc, &all, &since);
        assert_eq!(changes.recorded.len(), MAX_CONFLICTS_PER_HOST - 1);
        assert_eq!(
            changes.capped.len(),
            all.len() - (MAX_CONFLICTS_PER_HOST - 1)
        );
        assert_eq!(
            alloc.conflicts_held_by(&squatter.to_string()),
            MAX_CONFLICTS_PER_HOST
        );
        // Another host is not held back by the first one's count.
        let other: MacAddr = "02:00:00:00:00:0a".parse().unwrap();
        let changes = apply_probes(
            &mut alloc,
            &[verdict(20, Some(other), ProbeReason::Offer)],
            &since,
        );
        assert_eq!(changes.recorded.len(), 1);
    }

    #[test]
    fn suspect_conditions_name_the_serving_leaders_suspects_and_each_appears_once() {
        let pool: NamespacedName = "ns/pool".parse().unwrap();
        let now = SystemTime::now();
        let rogue: MacAddr = "02:00:00:00:0e:0e".parse().unwrap();
        let other: MacAddr = "02:00:00:00:0e:0f".parse().unwrap();
        let suspect = |kind, mac, ip: Option<&str>, detail: &str| NetworkSuspect {
            kind,
            mac,
            ip: ip.map(|ip| ip.parse().unwrap()),
            detail: detail.into(),
        };
        let foreign = |mac, ip, detail| suspect(SuspectKind::ForeignDhcpServer, mac, ip, detail);
        let mut leader = report(true, 1, InterfaceState::Serving, "");
        leader.interfaces[0].suspects = vec![foreign(rogue, Some("192.0.2.7"), "offered .50")];
        // A standby's (or an old leader's) claims are not believed.
        let mut standby = report(false, 0, InterfaceState::Standby, "");
        standby.interfaces[0].suspects = vec![foreign(other, Some("192.0.2.9"), "")];
        let mut reports = BTreeMap::from([
            ("vmdhcp/agent-0".to_owned(), leader.clone()),
            ("vmdhcp/agent-1".to_owned(), standby),
        ]);

        let found = network_suspects(&reports, &pool, now, &[]);
        let [dhcp, arp, ndp] = &found.conditions;
        assert_eq!(
            (dhcp.type_, dhcp.status, dhcp.reason),
            ("ForeignDHCPServer", true, "Detected")
        );
        assert_eq!(
            dhcp.message,
            "DHCP servers other than the pool's answer on its network (vmdhcp/agent-0): \
             192.0.2.7 (02:00:00:00:0e:0e)"
        );
        assert_eq!(*arp, Wanted::new("ProxyARPResponder", false));
        assert_eq!(*ndp, Wanted::new("ProxyNDPResponder", false));
        assert_eq!(
            found.appeared,
            [foreign(rogue, Some("192.0.2.7"), "offered .50")]
        );
        assert_eq!(
            found.counts,
            [
                (SuspectKind::ForeignDhcpServer, 1),
                (SuspectKind::ProxyArpResponder, 0),
                (SuspectKind::ProxyNdpResponder, 0)
            ]
        );

        // Once the status names it, it does not appear again, whatever it did since.
        let mut conditions = Vec::new();
        for c in &found.conditions {
            c.apply(&mut conditions);
        }
        leader.interfaces[0].suspects = vec![foreign(rogue, Some("192.0.2.7"), "offered .51")];
        reports.insert("vmdhcp/agent-0".to_owned(), leader.clone());
        let again = network_suspects(&reports, &pool, now, &conditions);
        assert!(again.appeared.is_empty());
        assert_eq!(
            again.conditions, found.conditions,
            "no write for a new deed"
        );

        // A second server (a DHCPv6 one, by its IPv6 source), a proxy-ARP and a proxy-NDP
        // responder (no address known): only they appear.
        leader.interfaces[0].suspects = vec![
            foreign(other, Some("fe80::66"), ""),
            foreign(rogue, Some("192.0.2.7"), ""),
            suspect(
                SuspectKind::ProxyArpResponder,
                rogue,
                None,
                "answered for 40 addresses",
            ),
            suspect(
                SuspectKind::ProxyNdpResponder,
                other,
                None,
                "answered for 3 of 4 unused addresses",
            ),
        ];
        reports.insert("vmdhcp/agent-0".to_owned(), leader.clone());
        let more = network_suspects(&reports, &pool, now, &conditions);
        assert!(
            more.conditions[0]
                .message
                .ends_with("192.0.2.7 (02:00:00:00:0e:0e), fe80::66 (02:00:00:00:0e:0f)"),
            "{}",
            more.conditions[0].message
        );
        assert_eq!(
            (more.conditions[1].status, more.conditions[1].reason),
            (true, "Detected")
        );
        assert_eq!(
            (
                more.conditions[2].type_,
                more.conditions[2].status,
                more.conditions[2].message.as_str()
            ),
            (
                "ProxyNDPResponder",
                true,
                "hosts answer Neighbor Solicitations for IPv6 addresses not their own on its \
                 network (vmdhcp/agent-0): an unknown address (02:00:00:00:0e:0f)"
            )
        );
        let appeared: Vec<_> = more.appeared.iter().map(|s| (s.kind, s.mac)).collect();
        assert_eq!(
            appeared,
            [
                (SuspectKind::ForeignDhcpServer, other),
                (SuspectKind::ProxyArpResponder, rogue),
                (SuspectKind::ProxyNdpResponder, other)
            ]
        );

        // Gone from the report: False, no reason; no serving leader: False, not checked.
        leader.interfaces[0].suspects.clear();
        reports.insert("vmdhcp/agent-0".to_owned(), leader);
        let cleared = network_suspects(&reports, &pool, now, &conditions);
        assert_eq!(
            cleared.conditions,
            [
                Wanted::new("ForeignDHCPServer", false),
                Wanted::new("ProxyARPResponder", false),
                Wanted::new("ProxyNDPResponder", false)
            ]
        );
        reports.remove("vmdhcp/agent-0");
        let unknown = network_suspects(&reports, &pool, now, &conditions);
        assert_eq!(
            (unknown.conditions[0].status, unknown.conditions[0].reason),
            (false, "NotChecked")
        );
        assert_eq!(unknown.agent, None);
    }

    #[test]
    fn agent_ready_follows_the_leading_agents_fresh_report() {
        let pool: NamespacedName = "ns/pool".parse().unwrap();
        let now = SystemTime::now();
        let one = |r: AgentReport| BTreeMap::from([("vmdhcp/agent-0".to_owned(), r)]);
        let Wanted {
            status: ok,
            reason,
            message: msg,
            ..
        } = agent_ready(
            &one(report(true, 1, InterfaceState::Serving, "")),
            &pool,
            now,
        );
        assert!(
            ok && reason.is_empty() && msg.contains("vmd1") && !msg.contains("revision"),
            "{msg}"
        );
        let Wanted {
            status: ok,
            reason,
            message: msg,
            ..
        } = agent_ready(
            &one(report(
                true,
                1,
                InterfaceState::Error,
                "socket: no such device",
            )),
            &pool,
            now,
        );
        assert_eq!((ok, reason), (false, "InterfaceError"));
        assert!(msg.contains("no such device"));
        assert_eq!(
            agent_ready(
                &one(report(false, 1, InterfaceState::Serving, "")),
                &pool,
                now
            )
            .reason,
            "NoAgentReport",
            "a standby does not serve"
        );
        assert_eq!(
            agent_ready(
                &one(report(true, 600, InterfaceState::Serving, "")),
                &pool,
                now
            )
            .reason,
            "NoAgentReport",
            "stale"
        );
        assert_eq!(
            agent_ready(
                &one(report(true, 1, InterfaceState::Standby, "")),
                &pool,
                now
            )
            .reason,
            "NotServed"
        );
        assert_eq!(
            agent_ready(&BTreeMap::new(), &pool, now).reason,
            "NoAgentReport"
        );
    }

    #[test]
    fn after_a_failover_the_latest_leader_report_counts() {
        let pool: NamespacedName = "ns/pool".parse().unwrap();
        let now = SystemTime::now();
        // The old leader ("agent-a", first in key order) reported 20 s ago, still fresh; the new
        // one 1 s ago.
        let reports = BTreeMap::from([
            (
                "vmdhcp/agent-a".to_owned(),
                report(true, 20, InterfaceState::Serving, ""),
            ),
            (
                "vmdhcp/agent-b".to_owned(),
                report(true, 1, InterfaceState::Error, "no such device"),
            ),
        ]);
        let Wanted {
            status: ok,
            reason,
            message: msg,
            ..
        } = agent_ready(&reports, &pool, now);
        assert_eq!((ok, reason), (false, "InterfaceError"), "{msg}");
        assert!(msg.contains("agent-b"), "{msg}");
    }
}
