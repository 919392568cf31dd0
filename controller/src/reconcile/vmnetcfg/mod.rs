//! The VirtualMachineNetworkConfig reconciler (leader only): gives each NIC its address.
//!
//! For every network config: find the pool serving its network, then keep the address the NIC
//! already holds, or take the requested static `ipAddress` (honoured or refused with a reason,
//! never silently replaced), or the address status last recorded for it, or the lowest free one.
//! NICs gone from the spec are released and marked `Stale`. The pool's `status.ipv4.allocated`
//! is written **before** this object's status says `Allocated`, so an address reaches an agent
//! only once etcd records it, and a controller killed between the two writes finds the address
//! again in the pool's status when it rebuilds. A MAC claimed by one config on a network is
//! refused to any other (upstream shared the address).

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use serde_json::json;
use tracing::{debug, field, info, info_span, warn};
use vmdhcp_core::crd::{
    CONDITION_ALLOCATED, CONDITION_CACHE_READY, CONDITION_DISABLED, CONDITION_IN_SYNCED, IPPool,
    NetworkConfig, NetworkConfigState, NetworkConfigStatus, REASON_MAC_IN_USE,
    VirtualMachineNetworkConfig, find_condition,
};
use vmdhcp_core::names::host_name_of;
use vmdhcp_core::pool::{Family, NicOptions};
use vmdhcp_core::{MacAddr, NamespacedName};

use crate::ipam::{IpamError, PoolAllocator, PoolBooks};
use crate::kinds::{VirtualMachine, object_ref, store_key};
use crate::metrics::VmnetcfgLabels;
use crate::reconcile::context::{Context, NotLeader, VMNETCFG_FINALIZER};
use crate::reconcile::status::{StatusError, Wanted};
use crate::reconcile::versioned;

mod allocate;
mod plan;
mod release;

use allocate::*;
pub use plan::allocate_nic;
use plan::*;
use release::*;

/// Why a VirtualMachineNetworkConfig reconcile failed (retried with per-object backoff).
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
    /// Recording allocations in the pool's status failed.
    #[error(transparent)]
    Status(#[from] StatusError),
    /// Leadership was lost.
    #[error(transparent)]
    NotLeader(#[from] NotLeader),
    /// Adding or removing the finalizer failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// The object has no namespace.
    #[error("VirtualMachineNetworkConfig without namespace")]
    Unnamespaced,
    /// The pool's allocator is gone (paused or deleted meanwhile).
    #[error(transparent)]
    Ipam(#[from] IpamError),
    /// An address given by this reconcile was recorded for another MAC by another writer first.
    #[error("{ip} on IPPool {pool} was recorded for another MAC first; {mac} is allocated again")]
    Withdrawn {
        /// The pool.
        pool: NamespacedName,
        /// The MAC that lost it.
        mac: MacAddr,
        /// The address.
        ip: IpAddr,
    },
}

/// Reconciles one VirtualMachineNetworkConfig.
pub async fn reconcile(
    cfg: Arc<VirtualMachineNetworkConfig>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    ctx.ensure_leader()?;
    let ns = cfg.namespace().ok_or(Error::Unnamespaced)?;
    let api: Api<VirtualMachineNetworkConfig> = Api::namespaced(ctx.client.clone(), &ns);
    finalizer(&api, VMNETCFG_FINALIZER, cfg, |event| async {
        match event {
            Finalizer::Apply(c) => apply(c, ctx.clone()).await,
            Finalizer::Cleanup(c) => cleanup(c, ctx.clone()).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

/// Whether a config looks as if it still needs work: being deleted, or not paused with a NIC
/// of its spec that its status does not record as allocated. For ordering a new term's first
/// pass only ([`crate::runtime::replay`]): cheap, and allowed to be wrong.
pub fn looks_unsettled(cfg: &VirtualMachineNetworkConfig) -> bool {
    if cfg.metadata.deletion_timestamp.is_some() {
        return true;
    }
    if cfg.spec.paused == Some(true) {
        return false;
    }
    let ns = cfg.metadata.namespace.as_deref().unwrap_or_default();
    let recorded = cfg.recorded_nics();
    cfg.spec.network_configs.iter().any(|nc| {
        let (Ok(network), Ok(mac)) = (
            NamespacedName::parse_in(&nc.network_name, ns),
            nc.mac_address.parse::<MacAddr>(),
        ) else {
            return true;
        };
        !recorded.iter().any(|(n, m, ip, state)| {
            *n == network
                && *m == mac
                && ip.is_some()
                && *state == Some(NetworkConfigState::Allocated)
        })
    })
}

/// How soon a config whose pool is being rebuilt ([`pool_rebuilding`]) looks again if nothing
/// wakes it first. The rebuild itself wakes every config on the pool's network
/// (`Books::rebuilt`); this only covers a rebuild that fails and is retried.
const POOL_REBUILD_WAIT: Duration = Duration::from_secs(5);

/// The pool serving `nc`'s network if it was ready in the last term (its status says
/// `CacheReady`), is neither paused nor being deleted, and this term has not rebuilt its IPAM
/// yet: the pool's own reconcile is about to. A config leaves its status alone until then instead
/// of writing `Pending`/"not ready" and then `Allocated` again — after a restart or a change of
/// leader, every config would flap and be written twice. A paused pool is never rebuilt: its
/// configs keep what they hold ([`NicPlan::Held`]).
fn pool_rebuilding(ctx: &Context, nc: &NetworkConfig, namespace: &str) -> Option<NamespacedName> {
    let network = NamespacedName::parse_in(&nc.network_name, namespace).ok()?;
    let pool = ctx.pool_for_network(&network)?;
    let was_ready = pool.status.as_ref().is_some_and(|s| {
        find_condition(&s.conditions, CONDITION_CACHE_READY).is_some_and(|c| c.status == "True")
    });
    let will_rebuild = was_ready && pool.spec.paused != Some(true);
    object_ref(pool.as_ref()).filter(|p| will_rebuild && !ctx.books.ipam.contains(p))
}

async fn persist(ctx: &Context, pools: &BTreeSet<NamespacedName>) -> Result<(), Error> {
    for pool in pools {
        ctx.ensure_leader()?;
        let kept = ctx
            .books
            .writer
            .persist(&ctx.client, Some(&ctx.stores.pools), &ctx.books.ipam, pool)
            .await?;
        ctx.report_foreign(pool, &kept);
    }
    Ok(())
}

/// After [`persist`]: fails when the IPAM no longer holds an address this reconcile gave (a
/// write found another writer had recorded it first, and withdrew ours), so the config is
/// reconciled again and allocates anew instead of telling anyone an address it does not hold.
fn still_held(ctx: &Context, given: &[(NamespacedName, MacAddr, IpAddr)]) -> Result<(), Error> {
    for (pool, mac, ip) in given {
        let held = ctx.books.ipam.with_books(pool, |b| match ip {
            IpAddr::V4(_) => b.v4.lookup(mac).map(IpAddr::from),
            IpAddr::V6(_) => b.v6.as_ref().and_then(|a| a.lookup(mac)).map(IpAddr::from),
        })?;
        if held != Some(*ip) {
            return Err(Error::Withdrawn {
                pool: pool.clone(),
                mac: *mac,
                ip: *ip,
            });
        }
    }
    Ok(())
}

async fn write_status(
    ctx: &Context,
    cfg: &VirtualMachineNetworkConfig,
    entries: Vec<NetworkConfigStatus>,
    conditions: &[Wanted],
) -> Result<(), Error> {
    ctx.ensure_leader()?;
    let (ns, name) = (cfg.namespace().unwrap_or_default(), cfg.name_any());
    let mut all = cfg
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    for wanted in conditions {
        wanted.apply(&mut all);
    }
    let key = format!("{ns}/{name}");
    let shared_key: Arc<str> = key.as_str().into();
    let series = entries
        .iter()
        .map(|e| VmnetcfgLabels {
            vmnetcfg: shared_key.clone(),
            network: e.network_name.as_deref().unwrap_or_default().into(),
            mac: e.mac_address.as_deref().unwrap_or_default().into(),
            ip: e.allocated_ip_address.as_deref().unwrap_or_default().into(),
            state: e.state.map(|s| format!("{s:?}")).unwrap_or_default().into(),
        })
        .collect();
    let status = json!({"status": {"networkConfigs": entries, "conditions": all}});
    let unchanged = cfg.status.as_ref().is_some_and(|s| {
        serde_json::to_value(&s.network_configs).ok()
            == Some(status["status"]["networkConfigs"].clone())
            && serde_json::to_value(&s.conditions).ok()
                == Some(status["status"]["conditions"].clone())
    });
    // A reconcile queued behind our own write may still see the version we computed it from:
    // the same version and the same result mean the write is already done.
    let version = cfg.resource_version().unwrap_or_default();
    let mut timeless = status.clone();
    for c in timeless["status"]["conditions"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        if let Some(c) = c.as_object_mut() {
            c.remove("lastUpdateTime");
            c.remove("lastTransitionTime");
        }
    }
    let timeless = timeless.to_string();
    if unchanged {
        // The cache shows the status: the note of our write has served its purpose (kept, it
        // would cost memory per config for ever).
        ctx.books.written.forget(&key);
    }
    if !unchanged && !ctx.books.written.already(&key, &version, &timeless) {
        let api: Api<VirtualMachineNetworkConfig> = Api::namespaced(ctx.client.clone(), &ns);
        // Answered with its metadata alone: nothing here reads the config back.
        let request = kube::core::Request::new(api.resource_url()).patch_subresource(
            "status",
            &name,
            &PatchParams::default(),
            &Patch::Merge(&status),
        );
        versioned::send(&ctx.client, request, "patch_status")
            .await
            .map_err(|source| Error::Kube {
                action: format!("writing status of {key}"),
                source,
            })?;
        ctx.books.written.record(key.clone(), version, timeless);
    }
    ctx.signals.metrics.set_vmnetcfg(&key, series);
    Ok(())
}

fn entry(
    network: &NamespacedName,
    mac: MacAddr,
    (ip, ipv6): (Option<Ipv4Addr>, Option<Ipv6Addr>),
    state: NetworkConfigState,
) -> NetworkConfigStatus {
    NetworkConfigStatus {
        allocated_ip_address: ip.map(|i| i.to_string()),
        allocated_ipv6_address: ipv6.map(|i| i.to_string()),
        mac_address: Some(mac.to_string()),
        network_name: Some(network.to_string()),
        state: Some(state),
    }
}

/// Whether a VM this config was made from is gone (KubeVirt's garbage collection stand-in for
/// clusters without it; confirmed with a read, never from the cache alone).
async fn vm_gone(ctx: &Context, cfg: &VirtualMachineNetworkConfig) -> Result<bool, Error> {
    let Some(owner) = cfg
        .owner_references()
        .iter()
        .find(|o| o.kind == "VirtualMachine" && o.api_version.starts_with("kubevirt.io/"))
    else {
        return Ok(false);
    };
    let ns = cfg.namespace().unwrap_or_default();
    if ctx
        .stores
        .vms
        .get(&kube::runtime::reflector::ObjectRef::new(&owner.name).within(&ns))
        .is_some()
    {
        return Ok(false);
    }
    let vms: Api<VirtualMachine> = Api::namespaced(ctx.client.clone(), &ns);
    let found = vms
        .get_opt(&owner.name)
        .await
        .map_err(|source| Error::Kube {
            action: format!("reading VirtualMachine {ns}/{}", owner.name),
            source,
        })?;
    Ok(found.is_none_or(|vm| vm.metadata.uid.as_deref() != Some(owner.uid.as_str())))
}

/// Deletes the config `me`, whose VirtualMachine is gone (no garbage collector may run).
async fn delete_orphan(ctx: &Context, me: &NamespacedName) -> Result<(), Error> {
    ctx.ensure_leader()?;
    let api: Api<VirtualMachineNetworkConfig> = Api::namespaced(ctx.client.clone(), &me.namespace);
    info!(vmnetcfg = %me, "its VirtualMachine is gone; deleting it");
    match api.delete(&me.name, &Default::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(source) => Err(Error::Kube {
            action: format!("deleting {me}"),
            source,
        }),
    }
}

async fn apply(cfg: Arc<VirtualMachineNetworkConfig>, ctx: Arc<Context>) -> Result<Action, Error> {
    let Some(me) = object_ref(cfg.as_ref()) else {
        return Err(Error::Unnamespaced);
    };
    if vm_gone(&ctx, &cfg).await? {
        delete_orphan(&ctx, &me).await?;
        return Ok(Action::await_change());
    }
    let rebuilding: BTreeSet<NamespacedName> = cfg
        .spec
        .network_configs
        .iter()
        .filter_map(|nc| pool_rebuilding(&ctx, nc, &me.namespace))
        .collect();
    // Never waited for here: a reconcile holds one of the controller's few slots, and a pool
    // that is not rebuilt soon (its reconcile failing) would hold them all.
    if let Some(pool) = rebuilding.first() {
        debug!(vmnetcfg = %me, %pool, "pool not rebuilt yet; its rebuild wakes this config");
        return Ok(Action::requeue(POOL_REBUILD_WAIT));
    }
    let previous = cfg.recorded_nics();
    let previous6 = cfg.recorded_ipv6();
    if cfg.spec.paused == Some(true) {
        return pause(&ctx, &cfg, &me, &previous, &previous6).await;
    }

    let mut out = Outcome::default();
    let mut wanted = BTreeSet::new();
    let facts = CacheFacts { ctx: &ctx, me: &me };
    for nc in &cfg.spec.network_configs {
        let plan = plan_nic(nc, &me.namespace, (&previous, &previous6), &facts);
        if let Some(nic) = plan.nic() {
            wanted.insert(nic);
        }
        perform(&ctx, &cfg, &me, plan, &mut out).await;
    }
    // NICs gone from the spec: release and mark stale.
    for (network, mac, ip, keep_entry) in plan_stale(&previous, &wanted) {
        if let Some(pool) = release(&ctx, &network, mac, &me) {
            out.touched.insert(pool);
            ctx.event(
                cfg.as_ref(),
                EventType::Normal,
                "Released",
                "Release",
                format!(
                    "{} released from {mac} on {network}",
                    ip.map(|i| i.to_string()).unwrap_or_default()
                ),
            );
        }
        if keep_entry {
            out.entries
                .push(entry(&network, mac, (ip, None), NetworkConfigState::Stale));
        }
    }
    // Claims of NICs gone whose status entry was never written.
    let kept: BTreeSet<(NamespacedName, MacAddr)> = wanted
        .iter()
        .filter_map(|(network, mac)| {
            let pool = object_ref(ctx.pool_for_network(network)?.as_ref())?;
            Some((pool, *mac))
        })
        .collect();
    out.touched.extend(release_claims(&ctx, &me, &kept));
    if cfg.spec.network_configs.is_empty() {
        out.problems.push("no network configs found".into());
    }
    finish(&ctx, &cfg, &me, out).await
}

/// A paused config: every recorded address is released (kept in status as `Pending`, so the NIC
/// gets it back on resume if still free).
async fn pause(
    ctx: &Context,
    cfg: &VirtualMachineNetworkConfig,
    me: &NamespacedName,
    previous: &[Recorded],
    previous6: &[Recorded6],
) -> Result<Action, Error> {
    let mut touched = BTreeSet::new();
    let mut entries = Vec::new();
    for (network, mac, ip, _) in previous {
        touched.extend(release(ctx, network, *mac, me));
        let ipv6 = recorded_v6(previous6, network, *mac);
        entries.push(entry(
            network,
            *mac,
            (*ip, ipv6),
            NetworkConfigState::Pending,
        ));
    }
    touched.extend(release_claims(ctx, me, &BTreeSet::new()));
    persist(ctx, &touched).await?;
    write_status(
        ctx,
        cfg,
        entries,
        &[Wanted::new(CONDITION_DISABLED, true).because("Paused", "")],
    )
    .await?;
    Ok(Action::await_change())
}

/// What one reconcile did so far: pools whose books changed, the status entries, the problems.
#[derive(Default)]
struct Outcome {
    /// Pools whose allocations changed (their status is written before this config's).
    touched: BTreeSet<NamespacedName>,
    /// This config's status entries, one per NIC.
    entries: Vec<NetworkConfigStatus>,
    /// Why some NIC is not allocated (the `Allocated` condition's message).
    problems: Vec<String>,
    /// Some NIC waits for a pool to appear or get ready (the pool's own events wake it).
    waiting: bool,
    /// NICs whose MAC another config holds: nothing but time wakes them (that config's
    /// release is no event of this one or of a pool).
    mac_in_use: usize,
    /// Some NIC's static address is in use by another host.
    conflict: bool,
    /// Addresses this config holds that no write has recorded yet (given by this reconcile, or
    /// by an earlier one whose write failed): (pool, MAC, address).
    given: Vec<(NamespacedName, MacAddr, IpAddr)>,
}

/// Records the pools' books, then this config's status; says when to look again.
async fn finish(
    ctx: &Context,
    cfg: &VirtualMachineNetworkConfig,
    me: &NamespacedName,
    out: Outcome,
) -> Result<Action, Error> {
    // The pool records the allocation first; only then does this object say Allocated.
    persist(ctx, &out.touched).await?;
    still_held(ctx, &out.given)?;
    let allocated = out.problems.is_empty();
    if allocated {
        // Later reconciles of an allocated config are traces of their own.
        ctx.signals.causes.vmnetcfgs.take(me);
    }
    let message = out.problems.join("; ");
    write_status(
        ctx,
        cfg,
        out.entries,
        &[
            Wanted::new(CONDITION_ALLOCATED, allocated).because(
                match (allocated, out.conflict) {
                    (true, _) => "",
                    (false, true) => "AddressConflict",
                    // Only MACs held elsewhere: no pool write can help (the pool trigger
                    // passes such configs over, see `index::configs`).
                    (false, false) if out.problems.len() == out.mac_in_use => REASON_MAC_IN_USE,
                    (false, false) => "Error",
                },
                message,
            ),
            Wanted::new(CONDITION_DISABLED, false),
            Wanted::new(CONDITION_IN_SYNCED, true),
        ],
    )
    .await?;
    if out.waiting {
        debug!(vmnetcfg = %me, "waiting for a pool to serve its network or get ready; woken by the pool's events");
    }
    Ok(match (allocated, out.mac_in_use > 0) {
        // Nothing to look at until something changes: its own object, its VM, its pool's
        // conflicts, or its pool's IPAM rebuilt (`Context::pool_rebuilt`). A periodic pass over
        // every allocated config would cost, at 20 000 configs, 33 reconciles a second of a
        // busy leader's time for nothing, and a scheduler entry per config.
        (true, _) => Action::await_change(),
        // Neither does a config that waits: for a pool to serve its network or get ready
        // (`out.waiting`), for an address to be freed, for a static one to be released. Every
        // write of the pool on its network wakes it (the pool trigger), the pool's creation
        // and readiness included. Polling every 5 s, 20 000 configs on networks with DHCP of
        // their own (a Harvester cluster's VLANs) cost some 4 000 reconciles a second.
        (false, false) => Action::await_change(),
        (false, true) => Action::requeue(Duration::from_secs(60)),
    })
}

/// A refusal's Warning, unless the config says it already: its `Allocated` condition is False
/// with `message` among its problems. A config refused again on every reconcile (each write of
/// its pool wakes one that waits) would otherwise repeat the event, an API write each time;
/// the condition written with the first one tells it as long as it holds.
fn warn_refused(ctx: &Context, cfg: &VirtualMachineNetworkConfig, reason: &str, message: String) {
    if !says_already(cfg, &message) {
        ctx.event(cfg, EventType::Warning, reason, "Allocate", message);
    }
}

/// Whether `cfg`'s `Allocated` condition is False with `problem` among its problems.
fn says_already(cfg: &VirtualMachineNetworkConfig, problem: &str) -> bool {
    cfg.status
        .as_ref()
        .and_then(|s| find_condition(&s.conditions, CONDITION_ALLOCATED))
        .is_some_and(|c| {
            c.status == "False"
                && c.message
                    .as_deref()
                    .is_some_and(|m| m.split("; ").any(|p| p == problem))
        })
}

/// One recorded NIC: (network, MAC, address, state).
type Recorded = vmdhcp_core::crd::RecordedNic;

/// One recorded IPv6 address: (network, MAC, address).
type Recorded6 = (NamespacedName, MacAddr, Ipv6Addr);

async fn cleanup(
    cfg: Arc<VirtualMachineNetworkConfig>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let Some(me) = object_ref(cfg.as_ref()) else {
        return Err(Error::Unnamespaced);
    };
    // What its status records, what its spec names (a status write that failed records
    // nothing), and what it claimed in this term.
    let mut touched = BTreeSet::new();
    for (network, mac) in crate::index::configs::named_nics(&cfg) {
        touched.extend(release(&ctx, &network, mac, &me));
    }
    touched.extend(release_claims(&ctx, &me, &BTreeSet::new()));
    persist(&ctx, &touched).await?;
    ctx.signals.metrics.remove_vmnetcfg(&me.to_string());
    ctx.books.written.forget(&me.to_string());
    info!(vmnetcfg = %me, pools = touched.len(), "config deleted; addresses released");
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmdhcp_core::pool::PoolRange;

    /// No address asked for by another NIC.
    fn nothing(_: IpAddr) -> bool {
        false
    }

    fn alloc() -> PoolAllocator {
        let range = PoolRange::new(
            "ns/p".parse().unwrap(),
            "192.0.2.0/24".parse().unwrap(),
            (ip("192.0.2.10"), ip("192.0.2.20")),
            ip("192.0.2.1"),
            None,
            vec![],
        );
        PoolAllocator::new(range.unwrap())
    }

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    const A: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const B: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);

    #[test]
    fn held_address_is_kept_and_previous_one_restored() {
        let mut a = alloc();
        assert_eq!(
            allocate_nic(&mut a, A, None, None, &nothing).unwrap(),
            ip("192.0.2.10")
        );
        assert_eq!(
            allocate_nic(&mut a, A, None, Some(ip("192.0.2.15")), &nothing).unwrap(),
            ip("192.0.2.10"),
            "held beats recorded"
        );
        // After a pause the NIC gets back the address its status recorded.
        a.release_mac(&A);
        assert_eq!(
            allocate_nic(&mut a, B, None, None, &nothing).unwrap(),
            ip("192.0.2.10")
        );
        assert_eq!(
            allocate_nic(&mut a, A, None, Some(ip("192.0.2.15")), &nothing).unwrap(),
            ip("192.0.2.15")
        );
        // Recorded address taken meanwhile: the next free one.
        let mut a = alloc();
        allocate_nic(&mut a, B, Some(ip("192.0.2.15")), None, &nothing).unwrap();
        assert_eq!(
            allocate_nic(&mut a, A, None, Some(ip("192.0.2.15")), &nothing).unwrap(),
            ip("192.0.2.10")
        );
    }

    #[test]
    fn an_address_another_nic_asks_for_is_never_given_to_a_dynamic_one() {
        let asked = |x: IpAddr| x == ip("192.0.2.10") || x == ip("192.0.2.15");
        let mut a = alloc();
        // The lowest free is asked for by another NIC: the next one.
        assert_eq!(
            allocate_nic(&mut a, A, None, None, &asked).unwrap(),
            ip("192.0.2.11")
        );
        // Nor is a recorded address restored once another NIC asks for it.
        assert_eq!(
            allocate_nic(&mut a, B, None, Some(ip("192.0.2.15")), &asked).unwrap(),
            ip("192.0.2.12")
        );
        // The NIC that asks gets it, whoever reconciled first.
        let c = MacAddr([2, 0, 0, 0, 0, 3]);
        assert_eq!(
            allocate_nic(&mut a, c, Some(ip("192.0.2.10")), None, &nothing).unwrap(),
            ip("192.0.2.10")
        );
    }

    #[test]
    fn static_requests_are_honoured_or_refused_keeping_the_held_address() {
        let mut a = alloc();
        assert_eq!(
            allocate_nic(&mut a, A, Some(ip("192.0.2.12")), None, &nothing).unwrap(),
            ip("192.0.2.12")
        );
        assert_eq!(
            allocate_nic(&mut a, A, Some(ip("192.0.2.13")), None, &nothing).unwrap(),
            ip("192.0.2.13"),
            "moves to a new static address"
        );
        assert_eq!(a.lookup(&A), Some(ip("192.0.2.13")));
        assert!(
            !a.status_allocated().contains_key("192.0.2.12"),
            "old address released"
        );
        allocate_nic(&mut a, B, Some(ip("192.0.2.14")), None, &nothing).unwrap();
        let err = allocate_nic(&mut a, A, Some(ip("192.0.2.14")), None, &nothing).unwrap_err();
        assert!(matches!(err, IpamError::AlreadyAllocated { .. }), "{err}");
        assert_eq!(
            a.lookup(&A),
            Some(ip("192.0.2.13")),
            "refusal keeps the held address"
        );
        let err = allocate_nic(&mut a, A, Some(ip("192.0.2.99")), None, &nothing).unwrap_err();
        assert!(matches!(err, IpamError::OutsideRange { .. }), "{err}");
        assert_eq!(a.lookup(&A), Some(ip("192.0.2.13")));
    }

    fn squatted() -> vmdhcp_core::crd::AddressConflict {
        vmdhcp_core::crd::AddressConflict {
            mac_address: A.to_string(),
            answered_by: "02:00:00:00:00:99".into(),
            source: "Probe".into(),
            since: None,
        }
    }

    #[test]
    fn a_dynamic_nic_moves_off_a_conflicted_address_a_static_one_stays() {
        let mut a = alloc();
        let first = allocate_nic(&mut a, A, None, None, &nothing).unwrap();
        assert!(a.record_conflict(first, squatted()).unwrap());
        let moved = allocate_nic(&mut a, A, None, Some(first), &nothing).unwrap();
        assert_ne!(moved, first);
        assert_eq!(a.lookup(&A), Some(moved));
        // The squatted address is handed to nobody, nor recorded as anyone's.
        assert_eq!(
            allocate_nic(&mut a, B, None, None, &nothing).unwrap(),
            ip("192.0.2.12")
        );
        assert!(!a.status_allocated().contains_key(&first.to_string()));
        assert!(a.status_conflicts().contains_key(&first.to_string()));
        let err = allocate_nic(&mut a, B, Some(first), None, &nothing).unwrap_err();
        assert!(
            err.to_string().contains("02:00:00:00:00:99 answers ARP"),
            "{err}"
        );
        // Cleared: free again.
        assert!(a.clear_conflict(first));
        assert_eq!(a.allocate(MacAddr([2, 0, 0, 0, 0, 3])).unwrap(), first);

        // A static address in conflict is kept.
        let mut a = alloc();
        let want = ip("192.0.2.12");
        allocate_nic(&mut a, A, Some(want), None, &nothing).unwrap();
        a.record_conflict(want, squatted()).unwrap();
        assert_eq!(
            allocate_nic(&mut a, A, Some(want), None, &nothing).unwrap(),
            want
        );
        assert!(a.conflict(want).is_some());
    }

    /// The books of the HEP's example pool, shrunk to a few addresses per family.
    fn dual_books() -> PoolBooks {
        let v6 = PoolRange::new_v6(
            "ns/p".parse().unwrap(),
            "fd00::/112".parse().unwrap(),
            (ip6("fd00::10"), ip6("fd00::12")),
            ip6("fd00::1"),
            None,
            vec![],
        )
        .unwrap();
        PoolBooks {
            v4: alloc(),
            v6: Some(PoolAllocator::new(v6)),
        }
    }

    fn ip6(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    /// Another host found using a dynamic NIC's IPv6 address moves the NIC to another one and
    /// says from where, as on IPv4; its IPv4 address stays.
    #[test]
    fn a_conflict_on_a_nic_s_ipv6_address_moves_it_and_says_why() {
        let mut b = dual_books();
        let none = V6Want::default();
        let (v4, v6) = decide_books(&mut b, A, (None, None), Extras::default(), none, &nothing);
        let held = v6.unwrap().result.unwrap();
        if let Some(a6) = b.v6.as_mut() {
            a6.record_conflict(held, squatted()).unwrap();
        }
        let (again, v6) = decide_books(&mut b, A, (None, None), Extras::default(), none, &nothing);
        assert_eq!(again.result, v4.result, "the IPv4 address stays");
        let v6 = v6.unwrap();
        assert_eq!(v6.held_before, Some(held));
        let moved = v6.result.unwrap();
        assert_ne!(moved, held);
        let (from, why) = v6.moved_from.unwrap();
        assert_eq!(from, held);
        assert!(why.contains("02:00:00:00:00:99"), "{why}");
        assert!(v6.unrecorded, "the new address is to be recorded");
    }

    #[test]
    fn a_dual_stack_nic_gets_ipv4_first_then_ipv6_and_keeps_both() {
        let mut b = dual_books();
        let none = V6Want::default();
        let (v4, v6) = decide_books(&mut b, A, (None, None), Extras::default(), none, &nothing);
        assert_eq!(v4.result, Ok(ip("192.0.2.10")));
        let v6 = v6.unwrap();
        assert_eq!((v6.held_before, v6.result), (None, Ok(ip6("fd00::10"))));
        // Again: both kept.
        let (_, v6) = decide_books(&mut b, A, (None, None), Extras::default(), none, &nothing);
        assert_eq!(v6.unwrap().held_before, Some(ip6("fd00::10")));
        // A static IPv6 address is honoured; a recorded one restored when free.
        let want = V6Want {
            requested: Some(ip6("fd00::12")),
            previous: None,
        };
        let (_, v6) = decide_books(&mut b, B, (None, None), Extras::default(), want, &nothing);
        assert_eq!(v6.unwrap().result, Ok(ip6("fd00::12")));
        b.v4.release_mac(&B);
        b.v6.as_mut().unwrap().release_mac(&B);
        let back = V6Want {
            requested: None,
            previous: Some(ip6("fd00::12")),
        };
        let (_, v6) = decide_books(&mut b, B, (None, None), Extras::default(), back, &nothing);
        assert_eq!(v6.unwrap().result, Ok(ip6("fd00::12")));
    }

    #[test]
    fn no_ipv6_without_ipv4_and_a_refusal_names_the_family_s_reason() {
        let mut b = dual_books();
        // IPv4 refused (outside the pool): no IPv6 decision at all.
        let (v4, v6) = decide_books(
            &mut b,
            A,
            (Some(ip("198.51.100.1")), None),
            Extras::default(),
            V6Want::default(),
            &nothing,
        );
        assert!(v4.result.is_err());
        assert!(v6.is_none());
        assert_eq!(b.v6.as_ref().unwrap().lookup(&A), None);
        // IPv6 exhausted: IPv4 given, IPv6 refused with the pool's words.
        for (i, m) in [A, B, MacAddr([2, 0, 0, 0, 0, 3])].into_iter().enumerate() {
            let (_, v6) = decide_books(
                &mut b,
                m,
                (None, None),
                Extras::default(),
                V6Want::default(),
                &nothing,
            );
            assert!(v6.unwrap().result.is_ok(), "NIC {i}");
        }
        let d = MacAddr([2, 0, 0, 0, 0, 4]);
        let (v4, v6) = decide_books(
            &mut b,
            d,
            (None, None),
            Extras::default(),
            V6Want::default(),
            &nothing,
        );
        assert!(v4.result.is_ok());
        let err = v6.unwrap().result.unwrap_err().to_string();
        assert!(
            err.contains("no more ip addresses left in fd00::10-fd00::12"),
            "{err}"
        );
        // An IPv4-only pool: no IPv6 side.
        let mut v4_only = PoolBooks::v4_only(alloc());
        let (_, v6) = decide_books(
            &mut v4_only,
            A,
            (None, None),
            Extras::default(),
            V6Want::default(),
            &nothing,
        );
        assert!(v6.is_none());
    }

    #[test]
    fn one_decision_reads_the_move_the_name_and_the_conflict_from_the_same_state() {
        let mut a = alloc();
        let first = decide(
            &mut a,
            A,
            None,
            None,
            Extras {
                host_name: Some("vm1"),
                options: None,
            },
            &nothing,
        );
        assert_eq!(first.held_before, None);
        assert_eq!(first.result, Ok(ip("192.0.2.10")));
        assert!(first.renamed, "a new address takes the VM's name");
        assert_eq!((first.moved_from, first.conflict), (None, None));
        let again = decide(
            &mut a,
            A,
            None,
            None,
            Extras {
                host_name: Some("vm1"),
                options: None,
            },
            &nothing,
        );
        assert_eq!(again.held_before, Some(ip("192.0.2.10")));
        assert!(!again.renamed, "the same name is no change");

        // Another host answers for the address: a dynamic NIC moves, and says from where.
        a.record_conflict(ip("192.0.2.10"), squatted()).unwrap();
        let moved = decide(
            &mut a,
            A,
            None,
            None,
            Extras {
                host_name: Some("vm1"),
                options: None,
            },
            &nothing,
        );
        assert_eq!(moved.result, Ok(ip("192.0.2.11")));
        let (from, why) = moved.moved_from.unwrap();
        assert_eq!(from, ip("192.0.2.10"));
        assert!(why.contains("02:00:00:00:00:99"), "{why}");
        assert_eq!(moved.conflict, None);

        // A static NIC keeps its conflicted address, and the decision says it is in conflict.
        let stays = decide(
            &mut a,
            B,
            Some(ip("192.0.2.12")),
            None,
            Extras::default(),
            &nothing,
        );
        a.record_conflict(ip("192.0.2.12"), squatted()).unwrap();
        let stays_again = decide(
            &mut a,
            B,
            Some(ip("192.0.2.12")),
            None,
            Extras::default(),
            &nothing,
        );
        assert_eq!(stays.result, stays_again.result);
        assert!(stays_again.conflict.is_some());

        // Refused: nothing else is read.
        let refused = decide(
            &mut a,
            B,
            Some(ip("198.51.100.1")),
            None,
            Extras::default(),
            &nothing,
        );
        assert!(refused.result.is_err());
        assert_eq!(refused.held_before, Some(ip("192.0.2.12")));
        assert!(!refused.renamed && refused.moved_from.is_none() && refused.conflict.is_none());
    }

    /// An address an earlier reconcile gave but never recorded (its pool write failed) is
    /// still to be recorded when the next reconcile finds the NIC holding it; once a write
    /// covers it, a kept address is nothing to record.
    #[test]
    fn a_held_address_no_write_recorded_is_recorded_before_it_is_told() {
        let mut b = dual_books();
        let none = V6Want::default();
        let (first, v6) = decide_books(&mut b, A, (None, None), Extras::default(), none, &nothing);
        assert!(first.unrecorded && v6.unwrap().unrecorded, "new addresses");
        // The write failed: the retry finds the NIC holding both, still unrecorded.
        let (again, v6) = decide_books(&mut b, A, (None, None), Extras::default(), none, &nothing);
        assert_eq!(again.held_before, Some(ip("192.0.2.10")));
        assert!(again.unrecorded && v6.unwrap().unrecorded);
        // A refused static request keeps the held address, which still needs its record.
        let refused = decide(
            &mut b.v4,
            A,
            Some(ip("198.51.100.1")),
            None,
            Extras::default(),
            &nothing,
        );
        assert!(refused.result.is_err() && refused.unrecorded);
        // Recorded (a write covered every change): kept is nothing to record.
        let upto = b.v4.changes();
        b.v4.settle(&[], upto);
        let upto6 = b.v6.as_ref().unwrap().changes();
        b.v6.as_mut().unwrap().settle(&[], upto6);
        let (kept, v6) = decide_books(&mut b, A, (None, None), Extras::default(), none, &nothing);
        assert_eq!(kept.result, Ok(ip("192.0.2.10")));
        assert!(!kept.unrecorded && !v6.unwrap().unrecorded);
    }

    /// A cluster as a table: which pool serves each network, which pools are ready, which
    /// (network, MAC) another config holds.
    #[derive(Default)]
    struct Table {
        pools: Vec<(&'static str, &'static str)>,
        ready: Vec<&'static str>,
        paused: Vec<&'static str>,
        claimed: Vec<(&'static str, MacAddr, &'static str)>,
        /// What AddressClaims say of MACs (any pool).
        claims: Vec<(MacAddr, ClaimFact)>,
    }

    impl NicFacts for Table {
        fn pool_serving(&self, network: &NamespacedName) -> Option<NamespacedName> {
            let (_, pool) = self.pools.iter().find(|(n, _)| *n == network.to_string())?;
            pool.parse().ok()
        }

        fn pool_ready(&self, pool: &NamespacedName) -> bool {
            self.ready.iter().any(|p| *p == pool.to_string())
        }

        fn pool_paused(&self, pool: &NamespacedName) -> bool {
            self.paused.iter().any(|p| *p == pool.to_string())
        }

        fn claimed_elsewhere(
            &self,
            network: &NamespacedName,
            mac: MacAddr,
        ) -> Option<NamespacedName> {
            let (_, _, other) = self
                .claimed
                .iter()
                .find(|(n, m, _)| *n == network.to_string() && *m == mac)?;
            other.parse().ok()
        }

        fn claim(&self, _: &NamespacedName, _: &NamespacedName, mac: MacAddr) -> ClaimFact {
            self.claims
                .iter()
                .find(|(m, _)| *m == mac)
                .map_or(ClaimFact::None, |(_, f)| f.clone())
        }
    }

    #[test]
    fn a_nic_bound_to_a_claim_asks_for_its_addresses_or_waits_for_them() {
        let held = Some(ip("192.0.2.30"));
        let cluster = Table {
            pools: vec![("vms/net-a", "vms/pool-a")],
            ready: vec!["vms/pool-a"],
            claims: vec![
                (
                    A,
                    ClaimFact::Holds {
                        ip: held,
                        ipv6: None,
                    },
                ),
                (B, ClaimFact::Waits(name("vms/vip"))),
            ],
            ..Default::default()
        };
        // A's own static request is overruled by the claim it holds.
        let a = plan_nic(
            &nic("net-a", "02:00:00:00:00:01", Some("192.0.2.99")),
            "vms",
            (&[], &[]),
            &cluster,
        );
        assert!(matches!(a, NicPlan::Allocate { requested, .. } if requested == held));
        let b = plan_nic(
            &nic("net-a", "02:00:00:00:00:02", None),
            "vms",
            (&[], &[]),
            &cluster,
        );
        assert!(
            matches!(&b, NicPlan::Pending { problem, waiting: true, .. } if problem.contains("waiting for AddressClaim vms/vip")),
            "{b:?}"
        );
    }

    fn nic(network: &str, mac: &str, ip: Option<&str>) -> NetworkConfig {
        NetworkConfig {
            dhcp_options: None,
            ipv6_address: None,
            network_name: network.into(),
            mac_address: mac.into(),
            ip_address: ip.map(Into::into),
        }
    }

    fn name(s: &str) -> NamespacedName {
        s.parse().unwrap()
    }

    #[test]
    fn each_nic_is_planned_from_its_spec_and_the_cluster() {
        let cluster = Table {
            pools: vec![
                ("vms/net-a", "vms/pool-a"),
                ("vms/net-b", "vms/pool-b"),
                ("vms/net-p", "vms/pool-p"),
            ],
            ready: vec!["vms/pool-a"],
            paused: vec!["vms/pool-p"],
            claimed: vec![("vms/net-a", B, "vms/other")],
            ..Default::default()
        };
        // The status recorded 192.0.2.15 for A on net-a and on net-b; A holds 192.0.2.17 on
        // the paused pool's network, where B waited for an address.
        let allocated = Some(NetworkConfigState::Allocated);
        let previous: Vec<Recorded> = vec![
            (name("vms/net-a"), A, Some(ip("192.0.2.15")), None),
            (name("vms/net-b"), A, Some(ip("192.0.2.16")), None),
            (name("vms/net-p"), A, Some(ip("192.0.2.17")), allocated),
            (
                name("vms/net-p"),
                B,
                None,
                Some(NetworkConfigState::Pending),
            ),
        ];
        let pending =
            |network: &str, mac, ip_: Option<&str>, problem: &str, waiting| NicPlan::Pending {
                ipv6: None,
                network: name(network),
                mac,
                ip: ip_.map(ip),
                problem: problem.into(),
                waiting,
            };
        let allocate = |mac, requested: Option<&str>, previous: Option<&str>| NicPlan::Allocate {
            v6: V6Want::default(),
            network: name("vms/net-a"),
            mac,
            pool: name("vms/pool-a"),
            requested: requested.map(ip),
            previous: previous.map(ip),
        };
        let a = "02:00:00:00:00:01";
        let b = "02:00:00:00:00:02";
        let table: Vec<(&str, NetworkConfig, NicPlan)> = vec![
            (
                "a static address that is not IPv4: pending, nothing to wait for",
                nic("net-a", a, Some("192.0.2")),
                pending(
                    "vms/net-a",
                    A,
                    None,
                    "vms/net-a 02:00:00:00:00:01: ipAddress \"192.0.2\" is not an IPv4 address",
                    false,
                ),
            ),
            (
                "no pool on the network: pending with the recorded address, waiting",
                nic("vms/net-c", a, None),
                pending(
                    "vms/net-c",
                    A,
                    None,
                    "no IPPool serves network vms/net-c",
                    true,
                ),
            ),
            (
                "pool not ready: pending with the recorded address, waiting",
                nic("net-b", a, None),
                pending(
                    "vms/net-b",
                    A,
                    Some("192.0.2.16"),
                    "IPPool vms/pool-b is not ready",
                    true,
                ),
            ),
            (
                "an address held on a paused pool: kept as recorded, nothing asked of its IPAM",
                nic("net-p", a, None),
                NicPlan::Held {
                    network: name("vms/net-p"),
                    mac: A,
                    ip: ip("192.0.2.17"),
                    ipv6: None,
                },
            ),
            (
                "no address yet on a paused pool: pending until it resumes, not polled",
                nic("net-p", b, None),
                pending("vms/net-p", B, None, "IPPool vms/pool-p is paused", false),
            ),
            (
                "MAC held by another config on this network",
                nic("net-a", b, None),
                NicPlan::MacInUse {
                    network: name("vms/net-a"),
                    mac: B,
                    other: name("vms/other"),
                },
            ),
            (
                "allocate, restoring the recorded address",
                nic("net-a", a, None),
                allocate(A, None, Some("192.0.2.15")),
            ),
            (
                "an empty ipAddress asks for nothing",
                nic("net-a", a, Some("")),
                allocate(A, None, Some("192.0.2.15")),
            ),
            (
                "a static address is requested (honoured or refused by allocate_nic)",
                nic("vms/net-a", a, Some("192.0.2.12")),
                allocate(A, Some("192.0.2.12"), Some("192.0.2.15")),
            ),
        ];
        for (case, spec, want) in table {
            assert_eq!(
                plan_nic(&spec, "vms", (&previous, &[]), &cluster),
                want,
                "{case}"
            );
        }
        // Unreadable network or MAC: only a problem, naming what is wrong.
        let bad_network = plan_nic(&nic("a/b/c", a, None), "vms", (&previous, &[]), &cluster);
        assert!(
            matches!(&bad_network, NicPlan::Invalid(p) if p.starts_with("networkName \"a/b/c\"")),
            "{bad_network:?}"
        );
        assert_eq!(bad_network.nic(), None, "not wanted: nothing to keep");
        let bad_mac = plan_nic(&nic("net-a", "zz", None), "vms", (&previous, &[]), &cluster);
        assert!(
            matches!(&bad_mac, NicPlan::Invalid(p) if p.starts_with("vms/net-a: ")),
            "{bad_mac:?}"
        );
    }

    #[test]
    fn nics_gone_from_the_spec_are_released_and_marked_stale_once() {
        let previous: Vec<Recorded> = vec![
            (name("vms/net-a"), A, Some(ip("192.0.2.10")), None),
            (name("vms/net-b"), A, Some(ip("192.0.2.11")), None),
            (name("vms/net-c"), A, None, Some(NetworkConfigState::Stale)),
            (
                name("vms/net-d"),
                A,
                Some(ip("192.0.2.12")),
                Some(NetworkConfigState::Stale),
            ),
        ];
        let wanted = BTreeSet::from([(name("vms/net-a"), A)]);
        assert_eq!(
            plan_stale(&previous, &wanted),
            [
                (name("vms/net-b"), A, Some(ip("192.0.2.11")), true),
                (name("vms/net-c"), A, None, false),
                (name("vms/net-d"), A, Some(ip("192.0.2.12")), true),
            ]
        );
    }

    #[test]
    fn a_config_looks_unsettled_until_its_status_records_every_nic() {
        let config = |spec: serde_json::Value, status: serde_json::Value| {
            serde_json::from_value::<VirtualMachineNetworkConfig>(json!({
                "apiVersion": "network.harvesterhci.io/v1alpha1",
                "kind": "VirtualMachineNetworkConfig",
                "metadata": {"name": "vm1", "namespace": "vms"},
                "spec": spec, "status": status,
            }))
            .unwrap()
        };
        let nics = json!({"vmName": "vm1", "networkConfigs": [
            {"networkName": "net-a", "macAddress": "0A:00:00:00:00:01"},
            {"networkName": "other/net-b", "macAddress": "0a:00:00:00:00:02"}]});
        let allocated = |network: &str, mac: &str, ip: Option<&str>| {
            json!({"networkName": network, "macAddress": mac,
                   "allocatedIPAddress": ip, "state": "Allocated"})
        };
        let a = allocated("vms/net-a", "0a:00:00:00:00:01", Some("192.0.2.10"));
        let b = allocated("other/net-b", "0a:00:00:00:00:02", Some("192.0.2.11"));
        // Every NIC recorded (names and MACs in either form): settled.
        assert!(!looks_unsettled(&config(
            nics.clone(),
            json!({"networkConfigs": [a, b]})
        )));
        for (why, status) in [
            ("no status", json!(null)),
            ("one NIC missing", json!({"networkConfigs": [a]})),
            (
                "no address",
                json!({"networkConfigs": [a, allocated("other/net-b", "0a:00:00:00:00:02", None)]}),
            ),
            (
                "pending",
                json!({"networkConfigs": [a, {"networkName": "other/net-b",
                    "macAddress": "0a:00:00:00:00:02", "state": "Pending"}]}),
            ),
            (
                "another MAC",
                json!({"networkConfigs": [a, allocated("other/net-b", "0a:00:00:00:00:03", Some("192.0.2.11"))]}),
            ),
        ] {
            assert!(looks_unsettled(&config(nics.clone(), status)), "{why}");
        }
        // Paused: nothing to allocate; being deleted: addresses to release.
        let mut paused = nics.clone();
        paused["paused"] = json!(true);
        assert!(!looks_unsettled(&config(paused, json!(null))));
        let mut deleted = config(nics, json!({"networkConfigs": [a, b]}));
        deleted.metadata.deletion_timestamp = Some(crate::reconcile::status::now());
        assert!(looks_unsettled(&deleted));
    }

    #[test]
    fn a_refusal_the_condition_already_states_is_not_warned_again() {
        let with = |status: &str, message: &str| {
            serde_json::from_value::<VirtualMachineNetworkConfig>(json!({
                "apiVersion": "network.harvesterhci.io/v1alpha1",
                "kind": "VirtualMachineNetworkConfig",
                "metadata": {"name": "vm1", "namespace": "vms"},
                "spec": {"vmName": "vm1", "networkConfigs": []},
                "status": {"conditions": [{"type": "Allocated", "status": status,
                    "reason": "Error", "message": message}]},
            }))
            .unwrap()
        };
        let (one, two) = ("mac A on vms/net is already allocated", "pool full");
        let both = format!("{one}; {two}");
        assert!(says_already(&with("False", &both), one));
        assert!(says_already(&with("False", &both), two));
        assert!(!says_already(&with("False", one), two), "a new problem");
        assert!(
            !says_already(&with("False", &both), "pool"),
            "whole problems only"
        );
        assert!(!says_already(&with("True", one), one), "allocated since");
        let none = serde_json::from_value::<VirtualMachineNetworkConfig>(json!({
            "metadata": {"name": "vm1", "namespace": "vms"},
            "spec": {"vmName": "vm1", "networkConfigs": []}}))
        .unwrap();
        assert!(!says_already(&none, one), "no status yet");
    }
}
