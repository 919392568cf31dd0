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

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use parking_lot::Mutex;
use serde_json::json;
use tracing::{debug, field, info, info_span};
use vmdhcp_core::crd::{
    CONDITION_ALLOCATED, CONDITION_CACHE_READY, CONDITION_DISABLED, CONDITION_IN_SYNCED, IPPool,
    NetworkConfig, NetworkConfigState, NetworkConfigStatus, REASON_MAC_IN_USE,
    VirtualMachineNetworkConfig, find_condition,
};
use vmdhcp_core::names::host_name_of;
use vmdhcp_core::pool::Family;
use vmdhcp_core::{MacAddr, NamespacedName};

use crate::ipam::{IpamError, PoolAllocator, PoolBooks};
use crate::kinds::{VirtualMachine, object_ref, store_key};
use crate::metrics::VmnetcfgLabels;
use crate::reconcile::context::{Context, NotLeader, VMNETCFG_FINALIZER};
use crate::reconcile::status::{StatusError, Wanted};
use crate::reconcile::versioned;

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

/// The address a NIC gets, as a pure decision on the pool's allocator:
/// held address (unless a different static one is requested, or another host was found using
/// it and the NIC is dynamic) → requested → previously recorded → lowest free. A refused static
/// request leaves the held address in place; a static address in conflict stays (the reconciler
/// says why it is not `Allocated`).
///
/// The same decision for either family: a dual-stack NIC's IPv6 address is decided by it too,
/// on the pool's IPv6 books, once its IPv4 address is.
///
/// `avoid` names the addresses other NICs ask for as their static address: neither the lowest
/// free nor a restored one is ever one of them, so a static request admitted by the webhook is
/// not taken by a dynamic NIC that happens to reconcile first.
pub fn allocate_nic<A: Family>(
    alloc: &mut PoolAllocator<A>,
    mac: MacAddr,
    requested: Option<A>,
    previous: Option<A>,
    avoid: &dyn Fn(IpAddr) -> bool,
) -> Result<A, IpamError> {
    let avoid = |ip: A| avoid(ip.into());
    match (alloc.lookup(&mac), requested) {
        (Some(held), None) if alloc.conflict(held).is_some() => {
            // Another host answers for it: a dynamic NIC moves (the address stays blocked).
            alloc.release(held)?;
            alloc.allocate_avoiding(mac, &avoid)
        }
        (Some(held), Some(want)) if held != want => {
            alloc.release(held)?;
            match alloc.allocate_requested(mac, want) {
                Ok(ip) => Ok(ip),
                Err(e) => {
                    alloc.allocate_requested(mac, held)?;
                    Err(e)
                }
            }
        }
        (Some(held), _) => Ok(held),
        (None, Some(want)) => alloc.allocate_requested(mac, want),
        (None, None) => match previous.filter(|p| !avoid(*p)) {
            Some(prev) => alloc
                .allocate_requested(mac, prev)
                .or_else(|_| alloc.allocate_avoiding(mac, &avoid)),
            None => alloc.allocate_avoiding(mac, &avoid),
        },
    }
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

/// Releases `mac` on the pool serving `network` for `owner`; returns the pool if something was
/// released. Not when another config claims the MAC there in this term, nor, when no config
/// does, while another config's status holds it: a NIC listed in the spec or status of a config
/// that never got the MAC (refused as `MacInUse`) must not free its holder's address.
fn release(
    ctx: &Context,
    network: &NamespacedName,
    mac: MacAddr,
    owner: &NamespacedName,
) -> Option<NamespacedName> {
    let pool = object_ref(ctx.pool_for_network(network)?.as_ref())?;
    let theirs = match ctx.books.mac_owners.owner(&pool, mac) {
        Some(claimant) => claimant != *owner,
        None => ctx
            .stores
            .config_index
            .claimed_elsewhere(network, mac, owner)
            .is_some(),
    };
    (!theirs && release_claimed(ctx, &pool, mac, owner)).then_some(pool)
}

/// Releases `mac` on `pool`, with `owner`'s claim on it; whether the books held it.
fn release_claimed(
    ctx: &Context,
    pool: &NamespacedName,
    mac: MacAddr,
    owner: &NamespacedName,
) -> bool {
    ctx.books.mac_owners.release(pool, mac, owner);
    let released = ctx
        .books
        .ipam
        .with_books(pool, |b| {
            let v6 = b.v6.as_mut().and_then(|a| a.release_mac(&mac));
            b.v4.release_mac(&mac).is_some() || v6.is_some()
        })
        .unwrap_or(false);
    if released {
        ctx.signals
            .metrics
            .allocation(&pool.to_string(), "released");
    }
    released
}

/// Releases every MAC `owner` claimed in this term on a pool other than those `kept` (the pools
/// serving the NICs it still has): what its status may not record, because the write that would
/// have recorded them failed. Returns the pools whose books changed.
fn release_claims(
    ctx: &Context,
    owner: &NamespacedName,
    kept: &BTreeSet<(NamespacedName, MacAddr)>,
) -> BTreeSet<NamespacedName> {
    ctx.books
        .mac_owners
        .claims_of(owner)
        .into_iter()
        .filter(|claim| !kept.contains(claim))
        .filter(|(pool, mac)| release_claimed(ctx, pool, *mac, owner))
        .map(|(pool, _)| pool)
        .collect()
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

/// The status this replica last wrote to each config, until its cache shows it: a reconcile
/// queued behind our own write may still see the version the write was computed from, and the
/// same version with the same result means the write is already done.
#[derive(Debug, Default)]
pub struct StatusMemo(Mutex<HashMap<String, WrittenStatus>>);

/// One config's status as written, and the version it was computed from.
#[derive(Debug, PartialEq, Eq)]
struct WrittenStatus {
    /// The config's resourceVersion the status was computed from.
    from_version: String,
    /// The status sent, serialised without its conditions' times.
    timeless: String,
}

impl StatusMemo {
    /// Whether `timeless`, computed from `version`, is what was last written to `key`.
    fn already(&self, key: &str, version: &str, timeless: &str) -> bool {
        self.0
            .lock()
            .get(key)
            .is_some_and(|w| w.from_version == version && w.timeless == timeless)
    }

    /// Notes a write.
    fn record(&self, key: String, from_version: String, timeless: String) {
        self.0.lock().insert(
            key,
            WrittenStatus {
                from_version,
                timeless,
            },
        );
    }

    /// Forgets `key`'s note: the cache shows the write, or the config is gone.
    fn forget(&self, key: &str) {
        self.0.lock().remove(key);
    }
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

/// The IPv6 address `previous6` records for `mac` on `network`.
fn recorded_v6(
    previous6: &[Recorded6],
    network: &NamespacedName,
    mac: MacAddr,
) -> Option<Ipv6Addr> {
    previous6
        .iter()
        .find(|(n, m, _)| n == network && *m == mac)
        .map(|(_, _, ip)| *ip)
}

/// What a NIC asks for on a dual-stack pool's IPv6 side: its static `ipv6Address`, and the
/// address its status recorded (restored when free, as for IPv4).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct V6Want {
    requested: Option<Ipv6Addr>,
    previous: Option<Ipv6Addr>,
}

/// What [`plan_nic`] needs to know about the cluster, asked only when the decision gets there.
trait NicFacts {
    /// The pool serving `network`, if any.
    fn pool_serving(&self, network: &NamespacedName) -> Option<NamespacedName>;
    /// Whether this term's IPAM holds the pool (its reconcile rebuilt it from status).
    fn pool_ready(&self, pool: &NamespacedName) -> bool;
    /// Whether the pool is paused (`spec.paused`).
    fn pool_paused(&self, pool: &NamespacedName) -> bool;
    /// Another config whose status holds `mac` on `network`.
    fn claimed_elsewhere(&self, network: &NamespacedName, mac: MacAddr) -> Option<NamespacedName>;
}

/// The reconciler's caches as [`NicFacts`], for the config `me`.
struct CacheFacts<'a> {
    ctx: &'a Context,
    me: &'a NamespacedName,
}

impl NicFacts for CacheFacts<'_> {
    fn pool_serving(&self, network: &NamespacedName) -> Option<NamespacedName> {
        self.ctx
            .pool_for_network(network)
            .and_then(|p| object_ref(p.as_ref()))
    }

    fn pool_ready(&self, pool: &NamespacedName) -> bool {
        self.ctx.books.ipam.contains(pool)
    }

    fn pool_paused(&self, pool: &NamespacedName) -> bool {
        self.ctx
            .stores
            .pools
            .get(&store_key::<IPPool>(pool))
            .is_some_and(|p| p.spec.paused == Some(true))
    }

    fn claimed_elsewhere(&self, network: &NamespacedName, mac: MacAddr) -> Option<NamespacedName> {
        self.ctx
            .stores
            .config_index
            .claimed_elsewhere(network, mac, self.me)
    }
}

/// What to do with one NIC of the spec.
#[derive(Debug, PartialEq)]
enum NicPlan {
    /// Its network or MAC does not parse: a problem, no status entry.
    Invalid(String),
    /// No address now: a `Pending` entry (with the address recorded before, if any) and a
    /// problem; `waiting` when a pool may come or get ready soon.
    Pending {
        network: NamespacedName,
        mac: MacAddr,
        ip: Option<Ipv4Addr>,
        ipv6: Option<Ipv6Addr>,
        problem: String,
        waiting: bool,
    },
    /// Another config's status holds the MAC on this network: refused, with an event.
    MacInUse {
        network: NamespacedName,
        mac: MacAddr,
        other: NamespacedName,
    },
    /// Its pool is paused: the addresses its status records stay as recorded (a paused pool
    /// keeps its allocations, and has no IPAM to ask).
    Held {
        network: NamespacedName,
        mac: MacAddr,
        ip: Ipv4Addr,
        ipv6: Option<Ipv6Addr>,
    },
    /// Give it an address on `pool` ([`allocate_nic`]: keep, honour the static request or
    /// refuse it, restore the recorded one, or the lowest free).
    Allocate {
        network: NamespacedName,
        mac: MacAddr,
        pool: NamespacedName,
        requested: Option<Ipv4Addr>,
        previous: Option<Ipv4Addr>,
        v6: V6Want,
    },
}

impl NicPlan {
    /// The (network, MAC) the spec asks for, when it could be read.
    fn nic(&self) -> Option<(NamespacedName, MacAddr)> {
        match self {
            NicPlan::Invalid(_) => None,
            NicPlan::Held { network, mac, .. }
            | NicPlan::Pending { network, mac, .. }
            | NicPlan::MacInUse { network, mac, .. }
            | NicPlan::Allocate { network, mac, .. } => Some((network.clone(), *mac)),
        }
    }
}

/// Decides, without writing anything, what one NIC of the spec gets.
fn plan_nic(
    nc: &NetworkConfig,
    namespace: &str,
    (previous, previous6): (&[Recorded], &[Recorded6]),
    facts: &impl NicFacts,
) -> NicPlan {
    let network = match NamespacedName::parse_in(&nc.network_name, namespace) {
        Ok(n) => n,
        Err(e) => return NicPlan::Invalid(format!("networkName {:?}: {e}", nc.network_name)),
    };
    let mac: MacAddr = match nc.mac_address.parse() {
        Ok(m) => m,
        Err(e) => return NicPlan::Invalid(format!("{network}: {e}")),
    };
    let prev6 = recorded_v6(previous6, &network, mac);
    let pending = |ip, problem, waiting| NicPlan::Pending {
        network: network.clone(),
        mac,
        ip,
        ipv6: prev6,
        problem,
        waiting,
    };
    let requested = match nc
        .ip_address
        .as_deref()
        .filter(|s| !s.is_empty())
        .map(str::parse::<Ipv4Addr>)
    {
        None => None,
        Some(Ok(ip)) => Some(ip),
        Some(Err(_)) => {
            let problem = format!(
                "{network} {mac}: ipAddress {:?} is not an IPv4 address",
                nc.ip_address.as_deref().unwrap_or_default()
            );
            return pending(None, problem, false);
        }
    };
    let requested6 = match nc
        .ipv6_address
        .as_deref()
        .filter(|s| !s.is_empty())
        .map(str::parse::<Ipv6Addr>)
    {
        None => None,
        Some(Ok(ip)) => Some(ip),
        Some(Err(_)) => {
            let problem = format!(
                "{network} {mac}: ipv6Address {:?} is not an IPv6 address",
                nc.ipv6_address.as_deref().unwrap_or_default()
            );
            return pending(None, problem, false);
        }
    };
    let recorded = previous
        .iter()
        .find(|(n, m, _, _)| *n == network && *m == mac);
    let prev_ip = recorded.and_then(|(_, _, ip, _)| *ip);
    let Some(pool) = facts.pool_serving(&network) else {
        return pending(prev_ip, format!("no IPPool serves network {network}"), true);
    };
    if facts.pool_paused(&pool) {
        return match recorded {
            Some((_, _, Some(ip), Some(NetworkConfigState::Allocated))) => NicPlan::Held {
                network,
                mac,
                ip: *ip,
                ipv6: prev6,
            },
            // Woken when the pool resumes (a pool's change wakes the configs waiting on it).
            _ => pending(prev_ip, format!("IPPool {pool} is paused"), false),
        };
    }
    if !facts.pool_ready(&pool) {
        return pending(prev_ip, format!("IPPool {pool} is not ready"), true);
    }
    if let Some(other) = facts.claimed_elsewhere(&network, mac) {
        return NicPlan::MacInUse {
            network,
            mac,
            other,
        };
    }
    NicPlan::Allocate {
        network,
        mac,
        pool,
        requested,
        previous: prev_ip,
        v6: V6Want {
            requested: requested6,
            previous: prev6,
        },
    }
}

/// NICs recorded in status but gone from the spec: each is released; its entry is kept (as
/// `Stale`) unless it already says `Stale` without an address. (network, MAC, address, keep).
fn plan_stale(
    previous: &[Recorded],
    wanted: &BTreeSet<(NamespacedName, MacAddr)>,
) -> Vec<(NamespacedName, MacAddr, Option<Ipv4Addr>, bool)> {
    previous
        .iter()
        .filter(|(network, mac, _, _)| !wanted.contains(&(network.clone(), *mac)))
        .map(|(network, mac, ip, state)| {
            let keep = *state != Some(NetworkConfigState::Stale) || ip.is_some();
            (network.clone(), *mac, *ip, keep)
        })
        .collect()
}

/// Carries out one NIC's plan: events, MAC claim, allocation, its status entry and problems.
async fn perform(
    ctx: &Context,
    cfg: &VirtualMachineNetworkConfig,
    me: &NamespacedName,
    plan: NicPlan,
    out: &mut Outcome,
) {
    match plan {
        NicPlan::Invalid(problem) => out.problems.push(problem),
        NicPlan::Held {
            network,
            mac,
            ip,
            ipv6,
        } => out.entries.push(entry(
            &network,
            mac,
            (Some(ip), ipv6),
            NetworkConfigState::Allocated,
        )),
        NicPlan::Pending {
            network,
            mac,
            ip,
            ipv6,
            problem,
            waiting,
        } => {
            out.problems.push(problem);
            out.entries.push(entry(
                &network,
                mac,
                (ip, ipv6),
                NetworkConfigState::Pending,
            ));
            out.waiting |= waiting;
        }
        NicPlan::MacInUse {
            network,
            mac,
            other,
        } => {
            let msg = format!(
                "{mac} on {network} is already allocated to VirtualMachineNetworkConfig {other}"
            );
            warn_refused(ctx, cfg, "MacInUse", msg.clone());
            out.problems.push(msg);
            out.mac_in_use += 1;
            out.entries.push(entry(
                &network,
                mac,
                (None, None),
                NetworkConfigState::Pending,
            ));
        }
        NicPlan::Allocate {
            network,
            mac,
            pool,
            requested,
            previous,
            v6,
        } => {
            if let Err(other) = ctx.books.mac_owners.claim(&pool, mac, me) {
                out.mac_in_use += 1;
                out.problems.push(format!(
                    "{mac} on {network} is already allocated to VirtualMachineNetworkConfig {other}"
                ));
                out.entries.push(entry(
                    &network,
                    mac,
                    (None, None),
                    NetworkConfigState::Pending,
                ));
                return;
            }
            let nic = Nic {
                network: &network,
                mac,
                pool: &pool,
            };
            allocate(ctx, cfg, me, nic, (requested, previous, v6), out);
        }
    }
}

/// A NIC being given an address on `pool`.
struct Nic<'a> {
    network: &'a NamespacedName,
    mac: MacAddr,
    pool: &'a NamespacedName,
}

/// What one NIC's allocation decided, taken under one hold of its pool's lock so that no other
/// reconcile's change can fall between the address chosen and what is read about it.
#[derive(Debug, PartialEq, Eq)]
struct Decision {
    /// The address the NIC held before.
    held_before: Option<Ipv4Addr>,
    /// The address it holds now, or why it got none.
    result: Result<Ipv4Addr, IpamError>,
    /// Whether the address's host name changed.
    renamed: bool,
    /// The address it moved away from, and why that one was in conflict.
    moved_from: Option<(Ipv4Addr, String)>,
    /// Why the address it holds now is in conflict (only a static one can be).
    conflict: Option<String>,
    /// Whether no write has recorded the address it holds after the decision (the new one, or
    /// the one it kept when refused): one just given, or one an earlier reconcile gave without
    /// its write succeeding. Either is recorded before it is told.
    unrecorded: bool,
}

/// Decides one NIC's address on its pool's allocator: [`allocate_nic`], then the host name and
/// the conflicts read from the same state.
fn decide(
    alloc: &mut PoolAllocator,
    mac: MacAddr,
    requested: Option<Ipv4Addr>,
    previous: Option<Ipv4Addr>,
    host_name: Option<&str>,
    avoid: &dyn Fn(IpAddr) -> bool,
) -> Decision {
    let held_before = alloc.lookup(&mac);
    let result = allocate_nic(alloc, mac, requested, previous, avoid);
    let unrecorded = alloc.lookup(&mac).is_some_and(|ip| alloc.is_unrecorded(ip));
    let (mut renamed, mut moved_from, mut conflict) = (false, None, None);
    if let Ok(ip) = result {
        renamed = alloc.set_host_name(ip, host_name);
        moved_from = held_before
            .filter(|old| *old != ip)
            .and_then(|old| Some((old, alloc.conflict_reason(old)?)));
        conflict = alloc.conflict_reason(ip);
    }
    Decision {
        held_before,
        result,
        renamed,
        moved_from,
        conflict,
        unrecorded,
    }
}

/// The IPv6 side of one NIC's allocation on a dual-stack pool.
#[derive(Debug, PartialEq, Eq)]
struct DecisionV6 {
    /// The address the NIC held before.
    held_before: Option<Ipv6Addr>,
    /// The address it holds now, or why it got none.
    result: Result<Ipv6Addr, IpamError>,
    /// Whether no write has recorded that address yet ([`Decision::unrecorded`]).
    unrecorded: bool,
    /// The address it moved away from, and why that one was in conflict.
    moved_from: Option<(Ipv6Addr, String)>,
}

/// Decides one NIC's addresses on its pool's books, IPv4 first ([`decide`]); then, on a
/// dual-stack pool and only if the NIC has its IPv4 address, its IPv6 one ([`allocate_nic`]
/// on the IPv6 books). One hold of the pool's lock covers both.
fn decide_books(
    books: &mut PoolBooks,
    mac: MacAddr,
    (requested, previous): (Option<Ipv4Addr>, Option<Ipv4Addr>),
    host_name: Option<&str>,
    want6: V6Want,
    avoid: &dyn Fn(IpAddr) -> bool,
) -> (Decision, Option<DecisionV6>) {
    let v4 = decide(&mut books.v4, mac, requested, previous, host_name, avoid);
    let v6 = match (&mut books.v6, &v4.result) {
        (Some(a6), Ok(_)) => {
            let held_before = a6.lookup(&mac);
            let result = allocate_nic(a6, mac, want6.requested, want6.previous, avoid);
            let moved_from = match (held_before, &result) {
                (Some(old), Ok(new)) if old != *new => {
                    a6.conflict_reason(old).map(|why| (old, why))
                }
                _ => None,
            };
            Some(DecisionV6 {
                held_before,
                result,
                unrecorded: a6.lookup(&mac).is_some_and(|ip| a6.is_unrecorded(ip)),
                moved_from,
            })
        }
        // A refused IPv4 request leaves the NIC what it held, IPv6 included.
        (Some(a6), Err(_)) => a6.lookup(&mac).map(|held| DecisionV6 {
            held_before: Some(held),
            result: Ok(held),
            unrecorded: a6.is_unrecorded(held),
            moved_from: None,
        }),
        (None, _) => None,
    };
    (v4, v6)
}

/// Allocates one NIC its address (a traced `allocate` span): an event and a metric when the
/// address is new, the MAC claim undone and an event when refused. On a dual-stack pool the
/// NIC gets its IPv6 address in the same decision, after its IPv4 one; it is `Allocated` only
/// with both.
fn allocate(
    ctx: &Context,
    cfg: &VirtualMachineNetworkConfig,
    me: &NamespacedName,
    nic: Nic<'_>,
    (requested, prev_ip, want6): (Option<Ipv4Addr>, Option<Ipv4Addr>, V6Want),
    out: &mut Outcome,
) {
    let Nic { network, mac, pool } = nic;
    let span = info_span!(
        "allocate",
        pool = %pool,
        network = %network,
        mac = %mac,
        requested = field::Empty,
        ip = field::Empty,
        result = field::Empty,
        otel.status_code = field::Empty,
    );
    if let Some(r) = requested {
        span.record("requested", field::display(r));
    }
    // The VM's name goes into the IPAM with the address, and into the pool's status while the
    // pool sends host names (a name the status lacks, by the same write as any other change).
    // While it does not, a new name changes nothing to write: after an IPAM rebuild every
    // config names its address again, and touching the pool for each would rebuild and compare
    // its whole status for nothing.
    let vm_name = Some(cfg.spec.vm_name.as_str())
        .filter(|n| !n.is_empty())
        .map_or_else(|| cfg.name_any(), str::to_owned);
    let host_name = host_name_of(&vm_name);
    // Addresses other NICs on the network ask for as their static one.
    let index = &ctx.stores.config_index;
    let avoid = |ip: IpAddr| index.requested_by_another(network, ip, me, mac);
    let decision = span.in_scope(|| {
        ctx.books.ipam.with_books(pool, |b| {
            decide_books(
                b,
                mac,
                (requested, prev_ip),
                host_name.as_deref(),
                want6,
                &avoid,
            )
        })
    });
    let (decision, v6) = decision.unwrap_or_else(|e| {
        let refused = Decision {
            held_before: None,
            result: Err(e),
            renamed: false,
            moved_from: None,
            conflict: None,
            unrecorded: false,
        };
        (refused, None)
    });
    let (ipv6, v6_new) = v6_outcome(ctx, cfg, &nic_of(network, mac, pool), v6, out);
    let held_before = decision.held_before;
    let holds = decision.result.as_ref().ok().copied().or(held_before);
    if let (true, Some(ip)) = (decision.unrecorded, holds) {
        out.touched.insert(pool.clone());
        out.given.push((pool.clone(), mac, ip.into()));
    }
    match decision.result {
        Ok(ip) => {
            span.record("ip", field::display(ip));
            let names_written = ctx
                .stores
                .pools
                .get(&store_key(pool))
                .is_none_or(|p| p.spec.ipv4_config.send_host_name == Some(true));
            if decision.renamed && names_written {
                out.touched.insert(pool.clone());
            }
            if let Some((old, why)) = &decision.moved_from {
                ctx.event(
                    cfg,
                    EventType::Warning,
                    "AddressConflict",
                    "Allocate",
                    format!("{old} is {why}: {mac} on {network} moved to {ip}"),
                );
            }
            if let Some(why) = &decision.conflict {
                // Only a static address stays in conflict (a dynamic one has just moved).
                out.problems.push(format!(
                    "{mac} on {network}: static ip {ip} is {why}; it is not served until a probe finds it free"
                ));
                out.conflict = true;
            }
            if held_before == Some(ip) {
                span.record("result", "kept");
                if let Some(ip6) = v6_new {
                    ctx.event(
                        cfg,
                        EventType::Normal,
                        "Allocated",
                        "Allocate",
                        format!("{ip6} allocated to {mac} on {network}"),
                    );
                }
            } else {
                span.record("result", "allocated");
                ctx.signals
                    .metrics
                    .allocation(&pool.to_string(), "allocated");
                // The index revision that publishes this lease continues this trace.
                if let Some(cause) = vmdhcp_telemetry::trace::span_context(&span) {
                    ctx.signals.causes.leases.record((pool.clone(), mac), cause);
                }
                // One event for both families: events are API writes too.
                let both = v6_new.map(|ip6| format!(" and {ip6}")).unwrap_or_default();
                ctx.event(
                    cfg,
                    EventType::Normal,
                    "Allocated",
                    "Allocate",
                    format!("{ip}{both} allocated to {mac} on {network}"),
                );
            }
            let state = match ipv6 {
                V6State::Refused(_) => NetworkConfigState::Pending,
                V6State::None | V6State::Held(_) => NetworkConfigState::Allocated,
            };
            out.entries
                .push(entry(network, mac, (Some(ip), ipv6.address()), state));
        }
        Err(e) => {
            span.record("result", "refused");
            span.record("otel.status_code", "ERROR");
            ctx.signals.metrics.allocation(&pool.to_string(), "refused");
            span.in_scope(|| debug!(error = %e, "allocation refused"));
            if held_before.is_none() {
                ctx.books.mac_owners.release(pool, mac, me);
            }
            warn_refused(ctx, cfg, "AllocationRefused", e.to_string());
            out.problems.push(e.to_string());
            out.entries.push(entry(
                network,
                mac,
                (held_before, ipv6.address()),
                if held_before.is_some() {
                    NetworkConfigState::Allocated
                } else {
                    NetworkConfigState::Pending
                },
            ));
        }
    }
}

/// Where a NIC's IPv6 side stands after its allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum V6State {
    /// No IPv6 books on the pool (IPv4-only), or no IPv4 address to go with one.
    None,
    /// It holds this address.
    Held(Ipv6Addr),
    /// It was refused one; it keeps the one it held, if any.
    Refused(Option<Ipv6Addr>),
}

impl V6State {
    /// The address to record in the NIC's status.
    fn address(self) -> Option<Ipv6Addr> {
        match self {
            V6State::None => None,
            V6State::Held(ip) | V6State::Refused(Some(ip)) => Some(ip),
            V6State::Refused(None) => None,
        }
    }
}

/// The [`Nic`] named by these parts.
fn nic_of<'a>(network: &'a NamespacedName, mac: MacAddr, pool: &'a NamespacedName) -> Nic<'a> {
    Nic { network, mac, pool }
}

/// Carries out the IPv6 side of a NIC's decision: an address no write has recorded yet is to be
/// recorded (the pool touched, the address checked after the write like an IPv4 one); a refusal is a
/// problem and a Warning event. Returns where the NIC stands and the address newly given.
fn v6_outcome(
    ctx: &Context,
    cfg: &VirtualMachineNetworkConfig,
    nic: &Nic<'_>,
    v6: Option<DecisionV6>,
    out: &mut Outcome,
) -> (V6State, Option<Ipv6Addr>) {
    let Some(v6) = v6 else {
        return (V6State::None, None);
    };
    let Nic { network, mac, pool } = *nic;
    let holds = v6.result.as_ref().ok().copied().or(v6.held_before);
    if let (true, Some(ip6)) = (v6.unrecorded, holds) {
        out.touched.insert(pool.clone());
        out.given.push((pool.clone(), mac, ip6.into()));
    }
    match v6.result {
        Ok(ip6) => {
            if v6.held_before == Some(ip6) {
                return (V6State::Held(ip6), None);
            }
            if let Some((old, why)) = &v6.moved_from {
                ctx.event(
                    cfg,
                    EventType::Warning,
                    "AddressConflict",
                    "Allocate",
                    format!("{old} is {why}: {mac} on {network} moved to {ip6}"),
                );
            }
            ctx.signals
                .metrics
                .allocation(&pool.to_string(), "allocated");
            (V6State::Held(ip6), Some(ip6))
        }
        Err(e) => {
            ctx.signals.metrics.allocation(&pool.to_string(), "refused");
            let msg = format!("{mac} on {network}: IPv6: {e}");
            warn_refused(ctx, cfg, "AllocationRefused", msg.clone());
            out.problems.push(msg);
            (V6State::Refused(v6.held_before), None)
        }
    }
}

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
    let named = cfg.spec.network_configs.iter().filter_map(|nc| {
        let network = NamespacedName::parse_in(&nc.network_name, &me.namespace).ok()?;
        Some((network, nc.mac_address.parse::<MacAddr>().ok()?))
    });
    let recorded = cfg.recorded_nics().into_iter().map(|(n, m, _, _)| (n, m));
    let nics: BTreeSet<(NamespacedName, MacAddr)> = recorded.chain(named).collect();
    for (network, mac) in nics {
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
        let (v4, v6) = decide_books(&mut b, A, (None, None), None, none, &nothing);
        let held = v6.unwrap().result.unwrap();
        if let Some(a6) = b.v6.as_mut() {
            a6.record_conflict(held, squatted()).unwrap();
        }
        let (again, v6) = decide_books(&mut b, A, (None, None), None, none, &nothing);
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
        let (v4, v6) = decide_books(&mut b, A, (None, None), None, none, &nothing);
        assert_eq!(v4.result, Ok(ip("192.0.2.10")));
        let v6 = v6.unwrap();
        assert_eq!((v6.held_before, v6.result), (None, Ok(ip6("fd00::10"))));
        // Again: both kept.
        let (_, v6) = decide_books(&mut b, A, (None, None), None, none, &nothing);
        assert_eq!(v6.unwrap().held_before, Some(ip6("fd00::10")));
        // A static IPv6 address is honoured; a recorded one restored when free.
        let want = V6Want {
            requested: Some(ip6("fd00::12")),
            previous: None,
        };
        let (_, v6) = decide_books(&mut b, B, (None, None), None, want, &nothing);
        assert_eq!(v6.unwrap().result, Ok(ip6("fd00::12")));
        b.v4.release_mac(&B);
        b.v6.as_mut().unwrap().release_mac(&B);
        let back = V6Want {
            requested: None,
            previous: Some(ip6("fd00::12")),
        };
        let (_, v6) = decide_books(&mut b, B, (None, None), None, back, &nothing);
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
            None,
            V6Want::default(),
            &nothing,
        );
        assert!(v4.result.is_err());
        assert!(v6.is_none());
        assert_eq!(b.v6.as_ref().unwrap().lookup(&A), None);
        // IPv6 exhausted: IPv4 given, IPv6 refused with the pool's words.
        for (i, m) in [A, B, MacAddr([2, 0, 0, 0, 0, 3])].into_iter().enumerate() {
            let (_, v6) = decide_books(&mut b, m, (None, None), None, V6Want::default(), &nothing);
            assert!(v6.unwrap().result.is_ok(), "NIC {i}");
        }
        let d = MacAddr([2, 0, 0, 0, 0, 4]);
        let (v4, v6) = decide_books(&mut b, d, (None, None), None, V6Want::default(), &nothing);
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
            None,
            V6Want::default(),
            &nothing,
        );
        assert!(v6.is_none());
    }

    #[test]
    fn one_decision_reads_the_move_the_name_and_the_conflict_from_the_same_state() {
        let mut a = alloc();
        let first = decide(&mut a, A, None, None, Some("vm1"), &nothing);
        assert_eq!(first.held_before, None);
        assert_eq!(first.result, Ok(ip("192.0.2.10")));
        assert!(first.renamed, "a new address takes the VM's name");
        assert_eq!((first.moved_from, first.conflict), (None, None));
        let again = decide(&mut a, A, None, None, Some("vm1"), &nothing);
        assert_eq!(again.held_before, Some(ip("192.0.2.10")));
        assert!(!again.renamed, "the same name is no change");

        // Another host answers for the address: a dynamic NIC moves, and says from where.
        a.record_conflict(ip("192.0.2.10"), squatted()).unwrap();
        let moved = decide(&mut a, A, None, None, Some("vm1"), &nothing);
        assert_eq!(moved.result, Ok(ip("192.0.2.11")));
        let (from, why) = moved.moved_from.unwrap();
        assert_eq!(from, ip("192.0.2.10"));
        assert!(why.contains("02:00:00:00:00:99"), "{why}");
        assert_eq!(moved.conflict, None);

        // A static NIC keeps its conflicted address, and the decision says it is in conflict.
        let stays = decide(&mut a, B, Some(ip("192.0.2.12")), None, None, &nothing);
        a.record_conflict(ip("192.0.2.12"), squatted()).unwrap();
        let stays_again = decide(&mut a, B, Some(ip("192.0.2.12")), None, None, &nothing);
        assert_eq!(stays.result, stays_again.result);
        assert!(stays_again.conflict.is_some());

        // Refused: nothing else is read.
        let refused = decide(&mut a, B, Some(ip("198.51.100.1")), None, None, &nothing);
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
        let (first, v6) = decide_books(&mut b, A, (None, None), None, none, &nothing);
        assert!(first.unrecorded && v6.unwrap().unrecorded, "new addresses");
        // The write failed: the retry finds the NIC holding both, still unrecorded.
        let (again, v6) = decide_books(&mut b, A, (None, None), None, none, &nothing);
        assert_eq!(again.held_before, Some(ip("192.0.2.10")));
        assert!(again.unrecorded && v6.unwrap().unrecorded);
        // A refused static request keeps the held address, which still needs its record.
        let refused = decide(&mut b.v4, A, Some(ip("198.51.100.1")), None, None, &nothing);
        assert!(refused.result.is_err() && refused.unrecorded);
        // Recorded (a write covered every change): kept is nothing to record.
        let upto = b.v4.changes();
        b.v4.settle(&[], upto);
        let upto6 = b.v6.as_ref().unwrap().changes();
        b.v6.as_mut().unwrap().settle(&[], upto6);
        let (kept, v6) = decide_books(&mut b, A, (None, None), None, none, &nothing);
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
    }

    fn nic(network: &str, mac: &str, ip: Option<&str>) -> NetworkConfig {
        NetworkConfig {
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
