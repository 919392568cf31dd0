//! What every reconciler shares: the API client, the caches (reflector stores), the IPAM, the
//! pool-status writer, the bounded event queue, and the leadership flag that gates every write.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use kube::api::DynamicObject;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::Store;
use kube::{Client, Resource};
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};
use vmdhcp_core::NamespacedName;
use vmdhcp_core::crd::{AddressClaim, IPPool, VirtualMachineNetworkConfig};

use crate::causes::TraceCauses;
use crate::index::configs::ConfigIndex;
use crate::index::pools::PoolNetworks;
use crate::ipam::{ClaimHolders, Ipam, MacOwners};
use crate::kinds::{VirtualMachine, store_key};
use crate::metrics::Metrics;
use crate::reconcile::events::Events;
use crate::reconcile::status::{Kept, PoolStatusWriter};
use crate::reports::Reports;

/// Finalizer on IPPools (upstream's name, so objects created by upstream carry over).
pub const IPPOOL_FINALIZER: &str = "wrangler.cattle.io/vm-dhcp-ippool-controller";
/// Finalizer on VirtualMachineNetworkConfigs (upstream's name).
pub const VMNETCFG_FINALIZER: &str = "wrangler.cattle.io/vm-dhcp-vmnetcfg-controller";
/// Finalizer on AddressClaims: a claim's addresses are freed before it goes.
pub const CLAIM_FINALIZER: &str = "ipam.vmdhcp.io/address-claim";

/// Where the agent Deployment lives, for the bootstrap writer.
#[derive(Clone, Debug)]
pub struct AgentDeployment {
    /// Its namespace and name.
    pub deployment: NamespacedName,
    /// The agent container in it.
    pub container: String,
}

/// Shared by all reconcilers: the API client, the leadership flag every write checks, and what
/// they read and keep, grouped by who it belongs to.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// True while this replica leads; every write checks it.
    pub leader: watch::Receiver<bool>,
    /// The caches the reconcilers read.
    pub stores: Stores,
    /// This term's allocations and how they reach the pools' status.
    pub books: Books,
    /// The agents: their Deployment and what they report.
    pub agents: Agents,
    /// Events, metrics and trace links.
    pub signals: Signals,
    /// Write each VM's addresses to `harvesterhci.io/custom-ip` (`--vm-address-annotation`).
    pub vm_address_annotation: bool,
}

/// The caches the reconcilers read: the objects as last seen, and the indexes kept from them.
pub struct Stores {
    /// IPPools as last seen.
    pub pools: Store<IPPool>,
    /// VirtualMachineNetworkConfigs as last seen.
    pub vmnetcfgs: Store<VirtualMachineNetworkConfig>,
    /// KubeVirt VirtualMachines as last seen, trimmed to what the reconcilers read
    /// ([`crate::index::trim::vm`]).
    pub vms: Store<VirtualMachine>,
    /// NetworkAttachmentDefinitions as last seen, metadata only (a pool labels its network).
    pub nads: Store<DynamicObject>,
    /// AddressClaims as last seen.
    pub claims: Store<AddressClaim>,
    /// Which pools name each network (kept from the pools' watch).
    pub pool_networks: Arc<PoolNetworks>,
    /// Which config's status holds each MAC on each network (kept from the configs' watch).
    pub config_index: Arc<ConfigIndex>,
    /// True once `pools`, `vmnetcfgs` and `vms` have each had their first full list (see
    /// [`Context::caches_ready`]). A watch channel rather than each store's own wait, which wakes
    /// only the last of many concurrent waiters (kube-runtime's `DelayedInit` holds one waker).
    pub ready: watch::Receiver<bool>,
}

/// This term's allocations: the IPAM, who claimed each MAC, and the writers that record them.
pub struct Books {
    /// Allocations, rebuilt from status when leadership starts.
    pub ipam: Arc<Ipam>,
    /// Which config owns each MAC on each pool (claims made in this term).
    pub mac_owners: MacOwners,
    /// Which AddressClaim's address each MAC holds on each pool (this term's claim reconciles).
    pub claim_holders: ClaimHolders,
    /// Batches IPAM → IPPool status writes.
    pub writer: Arc<PoolStatusWriter>,
    /// Pool entries no live config names, and since when ([`crate::reconcile::orphans`]).
    pub orphans: crate::reconcile::orphans::Orphans,
    /// The status last written per config, until the cache shows it.
    pub written: StatusMemo,
    /// The networks whose pool's IPAM its reconcile has just (re)built: every config on such a
    /// network is reconciled again. An allocated config waits for its own changes only, so a
    /// pool that comes (back) without the allocations its configs record (recreated, or on a
    /// new range) must wake them to be registered again.
    pub rebuilt: mpsc::Sender<NamespacedName>,
}

/// The agents as the reconcilers see them.
pub struct Agents {
    /// The agent Deployment to bootstrap, if configured.
    pub deployment: Option<AgentDeployment>,
    /// Set by the bootstrap writer while the agent Deployment is missing.
    pub deployment_missing: AtomicBool,
    /// What agents report over the config stream (feeds `AgentReady`).
    pub reports: Arc<Reports>,
}

/// What the reconcilers tell the world besides the objects they write.
pub struct Signals {
    /// Kubernetes events, published in order by one task.
    pub events: Events,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// Spans whose work later reconciles and index revisions continue.
    pub causes: Arc<TraceCauses>,
}

impl Context {
    /// Waits until every cache the reconcilers read has had its first full list. Each
    /// controller starts on its own watch, so without this a reconcile right after a restart
    /// could read a cache still filling and take a missing object for an absent one: apply a
    /// config that is already there, or judge a VM gone. Returns at once afterwards.
    pub async fn caches_ready(&self) {
        // Err: the term is ending (its sender is gone); the reconcile's writes check leadership.
        let _ = self.stores.ready.clone().wait_for(|ready| *ready).await;
    }
}

/// This replica lost leadership: the write was not made.
#[derive(Debug, thiserror::Error)]
#[error("not the leader; write skipped")]
pub struct NotLeader;

impl Context {
    /// Fails unless this replica is the leader right now.
    pub fn ensure_leader(&self) -> Result<(), NotLeader> {
        if *self.leader.borrow() {
            Ok(())
        } else {
            Err(NotLeader)
        }
    }

    /// Publishes a Kubernetes event about `obj` in the background: events are best-effort and
    /// must not slow allocation. They go through the term's bounded [`Events`] queue; when it
    /// is full the event is dropped and counted, never a task or memory per event.
    pub fn event<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        self.signals.events.send(ev, obj.object_ref(&()));
    }

    /// Tells operators what a status write of `pool` did with entries another writer recorded
    /// ([`crate::ipam::Foreign`]): a Warning naming the address and both holders for a collision, a Normal
    /// event for an adoption. Also in the log and `vmdhcpcontroller_foreign_allocations`.
    pub fn report_foreign(&self, pool: &NamespacedName, kept: &Kept) {
        if kept.v4.is_empty() && kept.v6.is_empty() {
            return;
        }
        let Some(obj) = self.stores.pools.get(&store_key(pool)) else {
            return;
        };
        let v4 = kept.v4.iter().map(|e| (e.is_collision(), e.to_string()));
        let v6 = kept.v6.iter().map(|e| (e.is_collision(), e.to_string()));
        for (collision, entry) in v4.chain(v6) {
            let (type_, reason) = if collision {
                (EventType::Warning, "AddressCollision")
            } else {
                (EventType::Normal, "ForeignAllocation")
            };
            self.event(obj.as_ref(), type_, reason, "Record", entry);
        }
    }

    /// The IPPool that serves `network` ([`PoolNetworks::serving`]).
    pub fn pool_for_network(&self, network: &NamespacedName) -> Option<Arc<IPPool>> {
        self.stores
            .pool_networks
            .serving(&self.stores.pools, network)
    }
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
    pub(crate) fn already(&self, key: &str, version: &str, timeless: &str) -> bool {
        self.0
            .lock()
            .get(key)
            .is_some_and(|w| w.from_version == version && w.timeless == timeless)
    }

    /// Notes a write.
    pub(crate) fn record(&self, key: String, from_version: String, timeless: String) {
        self.0.lock().insert(
            key,
            WrittenStatus {
                from_version,
                timeless,
            },
        );
    }

    /// Forgets `key`'s note: the cache shows the write, or the config is gone.
    pub(crate) fn forget(&self, key: &str) {
        self.0.lock().remove(key);
    }
}
