//! The process's caches of the kinds every replica reads: IPPools (the index served to agents,
//! the webhook, the leader's reconcilers) and VirtualMachineNetworkConfigs (the webhook, the
//! leader's reconcilers, the [`ConfigIndex`]), each with the index kept from its events
//! ([`PoolNetworks`], [`ConfigIndex`]). One watch each for the whole process, started
//! once and kept across leadership terms, so a new leader starts from a filled cache instead of
//! listing everything again, and no object is held twice. Configs are cached trimmed to what is
//! read of them ([`crate::reconcile::vm::trim_config`]).

use std::sync::Arc;

use kube::Client;
use kube::api::Api;
use kube::runtime::watcher;
use tokio::task::JoinHandle;
use vmdhcp_core::crd::{IPPool, VirtualMachineNetworkConfig};

use crate::index::configs::ConfigIndex;
use crate::index::pools::PoolNetworks;
use crate::index::shared_watch::SharedWatch;

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
}

/// The tasks driving the watches of [`Caches`]; they end when this is dropped.
pub struct CacheTasks([JoinHandle<()>; 2]);

impl Drop for CacheTasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

impl Caches {
    /// Starts both watches (on the current runtime).
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
            wc,
            crate::reconcile::vm::trim_config,
            move |event| observer.observe(event),
        );
        let tasks = CacheTasks([tokio::spawn(pool_watch), tokio::spawn(config_watch)]);
        (
            Caches {
                pools,
                pool_networks,
                configs,
                config_index,
            },
            tasks,
        )
    }

    /// Resolves once both caches hold their first list.
    pub async fn ready(&self) {
        tokio::join!(self.pools.ready(), self.configs.ready());
    }
}
