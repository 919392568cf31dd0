//! What wakes each controller of a term besides its own watch: the objects each kind's
//! reconcile depends on (a pool's network and siblings, a config's VM, pools and holders, a
//! claim's VM and pool), each looked up in an index or a cache in time proportional to the
//! answer.

use std::sync::Arc;

use futures_util::StreamExt;
use kube::ResourceExt;
use kube::api::DynamicObject;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::{self, ObjectRef};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use vmdhcp_core::NamespacedName;
use vmdhcp_core::crd::{AddressClaim, ClaimPhase, IPPool, VirtualMachineNetworkConfig};

use crate::index::configs::ConfigIndex;
use crate::index::pools::PoolNetworks;
use crate::index::shared_watch::{SharedWatch, Trigger};
use crate::kinds::{VirtualMachine, nad_resource, network_of, object_ref, store_key};
use crate::reconcile::status::PoolStatusWriter;
use crate::reports::Reports;

/// The IPPool controller: a pool is reconciled on its own changes, on its network's (NAD), on
/// another pool claiming the same network, and when an agent report about it changed. Changes
/// that are the status writer's own writes ([`PoolStatusWriter::wrote`]) wake nothing: every
/// allocation writes its pool, and a reconcile of the whole pool per allocation would make the
/// cost of one allocation grow with the pool. A write by anyone else (a user's edit of status,
/// the other replica's last writes) still wakes the pool, and its 300 s requeue bounds drift.
pub(super) fn pool_controller(
    pools: &reflector::Store<IPPool>,
    networks: &Arc<PoolNetworks>,
    (own, siblings): (Trigger<IPPool>, Trigger<IPPool>),
    nads: Trigger<DynamicObject>,
    reports: &Arc<Reports>,
    writer: &Arc<PoolStatusWriter>,
) -> Controller<IPPool> {
    let not_ours = |writer: Arc<PoolStatusWriter>| {
        move |pool: &Arc<IPPool>| std::future::ready(!writer.wrote(pool))
    };
    let own = own.filter(not_ours(writer.clone()));
    let siblings = siblings.filter(not_ours(writer.clone()));
    // A pool waits on its network (NAD) and on the other pools claiming the same network,
    // looked up in the pools' network index (a pool whose network name does not parse serves
    // nothing and waits on nothing).
    let pools_on = |networks: Arc<PoolNetworks>| {
        move |network: Option<NamespacedName>| {
            network
                .map(|n| networks.on(&n).iter().map(store_key).collect::<Vec<_>>())
                .unwrap_or_default()
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
    let by_nad = pools_on(networks.clone());
    let by_sibling = pools_on(networks.clone());
    Controller::for_shared_stream(own, pools.clone())
        .reconcile_on(report_changes)
        .watches_shared_stream_with(
            nads,
            move |nad: Arc<DynamicObject>| by_nad(object_ref(nad.as_ref())),
            nad_resource(),
        )
        .watches_shared_stream(siblings, move |pool: Arc<IPPool>| {
            by_sibling(network_of(&pool))
        })
}

/// The AddressClaim controller: a claim is reconciled on its own changes, on its VM's (the
/// NIC it binds comes, changes its MAC or goes), and on a change of a pool on its network that
/// the status writer did not make (created, ready, its rule edited); a refused claim also on the
/// writer's own writes of that pool (an address or a place in the quota freed). Looked up in the claims'
/// cache: claims are few (bounded by the pools' quotas), and with none this costs nothing.
pub(super) fn claim_controller(
    watch: &SharedWatch<AddressClaim>,
    claims: &reflector::Store<AddressClaim>,
    vms: Trigger<VirtualMachine>,
    pools: Trigger<IPPool>,
    writer: &Arc<PoolStatusWriter>,
) -> Controller<AddressClaim> {
    let writer = writer.clone();
    let (by_vm, by_pool) = (claims.clone(), claims.clone());
    Controller::for_shared_stream(watch.trigger(), claims.clone())
        .watches_shared_stream(vms, move |vm: Arc<VirtualMachine>| {
            let (ns, name) = (vm.namespace().unwrap_or_default(), vm.name_any());
            by_vm
                .state()
                .iter()
                .filter(|c| c.namespace().as_deref() == Some(ns.as_str()))
                .filter(|c| c.spec.vm.as_deref() == Some(name.as_str()))
                .filter_map(|c| object_ref(c.as_ref()))
                .map(|c| store_key::<AddressClaim>(&c))
                .collect::<Vec<_>>()
        })
        .watches_shared_stream(pools, move |pool: Arc<IPPool>| {
            let Some(network) = network_of(&pool) else {
                return Vec::new();
            };
            // The status writer's own writes (an address freed, a claim's place in the quota
            // given back) wake only the refused claims, which may fit now.
            let ours = writer.wrote(&pool);
            by_pool
                .state()
                .iter()
                .filter(|c| {
                    !ours || c.status.as_ref().and_then(|s| s.phase) == Some(ClaimPhase::Refused)
                })
                .filter(|c| {
                    let ns = c.namespace().unwrap_or_default();
                    NamespacedName::parse_in(&c.spec.network, &ns).is_ok_and(|n| n == network)
                })
                .filter_map(|c| object_ref(c.as_ref()))
                .map(|c| store_key::<AddressClaim>(&c))
                .collect::<Vec<_>>()
        })
}

/// The configs a claim's change concerns: its VM's (bound by NIC), and those whose spec names
/// its MAC on its network (bound by MAC, or holding it now).
pub(super) fn configs_of_claim(
    claim: &AddressClaim,
    configs: &ConfigIndex,
    store: &reflector::Store<VirtualMachineNetworkConfig>,
) -> Vec<ObjectRef<VirtualMachineNetworkConfig>> {
    let ns = claim.namespace().unwrap_or_default();
    let mut out = Vec::new();
    if let Some(vm) = claim
        .spec
        .vm
        .as_deref()
        .and_then(|vm| NamespacedName::new(&ns, vm).ok())
    {
        out.push(store_key::<VirtualMachineNetworkConfig>(&vm));
    }
    let macs: Vec<vmdhcp_core::MacAddr> = [
        claim.spec.mac_address.as_deref(),
        claim.status.as_ref().and_then(|s| s.mac_address.as_deref()),
    ]
    .into_iter()
    .flatten()
    .filter_map(|m| m.parse().ok())
    .collect();
    let Ok(network) = NamespacedName::parse_in(&claim.spec.network, &ns) else {
        return out;
    };
    if macs.is_empty() {
        return out;
    }
    for key in configs.on_network(&network) {
        let Some(cfg) = store.get(&store_key(&key)) else {
            continue;
        };
        if crate::index::configs::spec_nics(&cfg)
            .iter()
            .any(|(n, m)| *n == network && macs.contains(m))
        {
            out.push(store_key(&key));
        }
    }
    out
}

/// Networks whose pool's IPAM was rebuilt that may wait for the config controller to take them.
/// A pool reconcile finding no room waits for it, up to `POOL_REBUILT_WAIT` (then it logs that
/// the configs were not woken).
pub(super) const POOL_REBUILT_QUEUE: usize = 64;

/// Every config on each network whose pool's IPAM its reconcile has (re)built
/// ([`Context::pool_rebuilt`]), looked up in the [`ConfigIndex`] when the network arrives.
pub(super) fn members_of(
    networks: mpsc::Receiver<NamespacedName>,
    configs: Arc<ConfigIndex>,
) -> impl futures_util::Stream<Item = ObjectRef<VirtualMachineNetworkConfig>> + Send + 'static {
    ReceiverStream::new(networks).flat_map(move |network| {
        futures_util::stream::iter(
            configs
                .on_network(&network)
                .into_iter()
                .map(|c| store_key::<VirtualMachineNetworkConfig>(&c)),
        )
    })
}

/// The config controller's triggers besides its own watch: the VM it is named after, the
/// config holding a MAC it was refused, and the pools on its networks while it still waits for an
/// address there, or holds one another host was found using (it must move off it, or say why it
/// cannot). The others do not depend on the
/// pool's status, and re-queueing every config on every pool write is quadratic: the configs are
/// looked up in the [`ConfigIndex`], in time proportional to the answer.
pub(super) fn config_triggers(
    ctrl: Controller<VirtualMachineNetworkConfig>,
    configs: Arc<ConfigIndex>,
    (vms, holders): (
        Trigger<VirtualMachine>,
        Trigger<VirtualMachineNetworkConfig>,
    ),
    pools: Trigger<IPPool>,
) -> Controller<VirtualMachineNetworkConfig> {
    let blocked = configs.clone();
    ctrl.watches_shared_stream(vms, |vm: Arc<VirtualMachine>| {
        Some(ObjectRef::new(&vm.name_any()).within(&vm.namespace().unwrap_or_default()))
    })
    // A config refused a MAC another holds (`MacInUse`) waits for that holder's change or
    // deletion: by then its reconcile has let the MAC go.
    .watches_shared_stream(holders, move |holder: Arc<VirtualMachineNetworkConfig>| {
        blocked
            .blocked_by(&holder)
            .into_iter()
            .map(|c| store_key::<VirtualMachineNetworkConfig>(&c))
            .collect::<Vec<_>>()
    })
    .watches_shared_stream(pools, move |pool: Arc<IPPool>| {
        let Some(network) = network_of(&pool) else {
            return Vec::new();
        };
        let conflicts = pool
            .conflict_keys()
            .filter_map(|ip| ip.parse::<std::net::IpAddr>().ok());
        configs
            .concerned_by_pool(&network, conflicts)
            .into_iter()
            .map(|c| store_key::<VirtualMachineNetworkConfig>(&c))
            .collect::<Vec<_>>()
    })
}
