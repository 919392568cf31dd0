//! The process's caches: IPPools (the index served to agents, the webhook, the leader's
//! reconcilers) and VirtualMachineNetworkConfigs (the webhook, the leader's reconcilers, the
//! [`ConfigIndex`]), each with the index kept from its events ([`PoolNetworks`],
//! [`ConfigIndex`]); and the VirtualMachines and NetworkAttachmentDefinitions only the leader's
//! reconcilers read, kept warm on a follower too. One watch each for the whole process, started
//! once and kept across leadership terms, so a new leader starts from filled caches instead of
//! listing everything again between the Lease and its first allocation (at scale, most of a
//! failover: docs/tuning.md), and no object is held twice. Configs, VMs and NADs are
//! cached trimmed to what is read of them ([`trim`]).

use std::sync::Arc;

use kube::Client;
use kube::api::{Api, DynamicObject};
use kube::runtime::watcher;
use tokio::task::JoinHandle;
use vmdhcp_core::crd::{AddressClaim, IPPool, VirtualMachineNetworkConfig};

use crate::index::configs::ConfigIndex;
use crate::index::pools::PoolNetworks;
use crate::index::shared_watch::SharedWatch;
use crate::index::trim;
use crate::kinds::{VirtualMachine, nad_resource};

/// The shared watches and the indexes kept from them. Cheap to clone.
#[derive(Clone)]
pub struct Caches {
    /// Every IPPool.
    pub pools: SharedWatch<IPPool>,
    /// The pools by network, kept in step with `pools` event by event.
    pub pool_networks: Arc<PoolNetworks>,
    /// Every VirtualMachineNetworkConfig.
    pub configs: SharedWatch<VirtualMachineNetworkConfig>,
    /// The configs by network (MAC claims, waiting configs, held addresses), kept in step with
    /// `configs` event by event.
    pub config_index: Arc<ConfigIndex>,
    /// Every KubeVirt VirtualMachine (for the leader's VM and config reconcilers).
    pub vms: SharedWatch<VirtualMachine>,
    /// Every NetworkAttachmentDefinition (for the leader's pool reconciler).
    pub nads: SharedWatch<DynamicObject>,
    /// Every AddressClaim (for the leader's claim and config reconcilers).
    pub claims: SharedWatch<AddressClaim>,
}

/// The tasks driving the watches of [`Caches`]; they end when this is dropped.
pub struct CacheTasks([JoinHandle<()>; 5]);

impl Drop for CacheTasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

impl Caches {
    /// Starts the watches (on the current runtime).
    pub fn start(client: &Client) -> (Self, CacheTasks) {
        let wc = watcher::Config::default();
        let pool_networks = Arc::new(PoolNetworks::default());
        let observer = pool_networks.clone();
        let (pools, pool_watch) = SharedWatch::start_with(
            Api::all(client.clone()),
            (),
            wc.clone(),
            |_| {},
            move |event| observer.observe(event),
        );
        let config_index = Arc::new(ConfigIndex::default());
        let observer = config_index.clone();
        let (configs, config_watch) = SharedWatch::start_with(
            Api::all(client.clone()),
            (),
            wc.clone(),
            trim::config,
            move |event| observer.observe(event),
        );
        let (vms, vm_watch) =
            SharedWatch::start_trimmed(Api::all(client.clone()), (), wc.clone(), trim::vm);
        let (nads, nad_watch) = SharedWatch::start_trimmed(
            Api::all_with(client.clone(), &nad_resource()),
            nad_resource(),
            wc.clone(),
            trim::nad,
        );
        let (claims, claim_watch) = SharedWatch::start_trimmed(
            Api::all(client.clone()),
            (),
            wc,
            crate::index::shared_watch::forget_managed_fields,
        );
        let tasks = CacheTasks([
            tokio::spawn(pool_watch),
            tokio::spawn(config_watch),
            tokio::spawn(vm_watch),
            tokio::spawn(nad_watch),
            tokio::spawn(claim_watch),
        ]);
        (
            Caches {
                pools,
                pool_networks,
                configs,
                config_index,
                vms,
                nads,
                claims,
            },
            tasks,
        )
    }

    /// Resolves once the pools and configs caches hold their first list (what a follower
    /// serves from; the leader's term also waits for `vms` and `nads`, which need KubeVirt's
    /// and Multus' CRDs).
    pub async fn ready(&self) {
        tokio::join!(self.pools.ready(), self.configs.ready());
    }
}
