//! Which IPPools name each network, kept in step with the pools' watch event by event.
//!
//! Every allocation asks which pool serves its network (a config reconcile asks up to three
//! times), and every pool event not written by the leader asks which pools share its network.
//! Scanning the pool cache for that would make each allocation cost every pool in the cluster
//! (up to three name parses per pool); this index answers in time proportional to the pools on
//! the one network asked about, usually one.
//!
//! The index names pools; their objects stay in the cache, where the caller reads them (and
//! checks they still name the network: the index sees an event just before the cache does).

use parking_lot::{Mutex, MutexGuard};
use std::collections::{BTreeSet, HashMap};

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use vmdhcp_core::NamespacedName;
use vmdhcp_core::crd::IPPool;

use crate::index::shared_watch::Relisted;
use crate::kinds::{network_of, object_ref, store_key};

/// Pools by the network they name; see the module docs. Fed by [`PoolNetworks::observe`].
#[derive(Default)]
pub struct PoolNetworks {
    inner: Mutex<Relisted<Networks>>,
}

#[derive(Default)]
struct Networks {
    /// Each pool → the network it names (pools whose network name does not parse are left out:
    /// they serve nothing).
    of: HashMap<NamespacedName, NamespacedName>,
    /// Each network → the pools naming it.
    on: HashMap<NamespacedName, BTreeSet<NamespacedName>>,
}

impl Networks {
    fn set(&mut self, pool: &IPPool) {
        let Some(key) = object_ref(pool) else {
            return;
        };
        match network_of(pool) {
            Some(network) if self.of.get(&key) == Some(&network) => {}
            Some(network) => {
                self.remove(&key);
                self.on
                    .entry(network.clone())
                    .or_default()
                    .insert(key.clone());
                self.of.insert(key, network);
            }
            None => self.remove(&key),
        }
    }

    fn remove(&mut self, key: &NamespacedName) {
        let Some(network) = self.of.remove(key) else {
            return;
        };
        if let Some(pools) = self.on.get_mut(&network) {
            pools.remove(key);
            if pools.is_empty() {
                self.on.remove(&network);
            }
        }
    }
}

impl PoolNetworks {
    fn lock(&self) -> MutexGuard<'_, Relisted<Networks>> {
        // Each event is applied whole under the lock: a panic elsewhere cannot leave one torn.
        self.inner.lock()
    }

    /// Takes one event of the pools' watch into account.
    pub fn observe(&self, event: &watcher::Event<IPPool>) {
        self.lock().observe(event, Networks::set, |networks, pool| {
            if let Some(key) = object_ref(pool) {
                networks.remove(&key);
            }
        });
    }

    /// The pools naming `network` (by namespace/name), being deleted or not.
    pub fn on(&self, network: &NamespacedName) -> BTreeSet<NamespacedName> {
        self.lock()
            .live
            .on
            .get(network)
            .cloned()
            .unwrap_or_default()
    }

    /// The IPPool that serves `network`: among live pools naming it, the first in
    /// [`serving_order`]. Upstream let a second pool on one network silently clobber the first;
    /// here the first keeps it and the others are refused. Costs the pools on `network`.
    pub fn serving(&self, pools: &Store<IPPool>, network: &NamespacedName) -> Option<Arc<IPPool>> {
        self.on(network)
            .iter()
            .filter_map(|p| pools.get(&store_key(p)))
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| network_of(p).as_ref() == Some(network))
            .min_by_key(|p| serving_order(p))
    }

    /// How many networks have a pool (for tests).
    pub fn networks(&self) -> usize {
        self.lock().live.on.len()
    }
}

/// Of several pools on one network, the first in this order serves it: the oldest, then by
/// namespace and name (a pool not yet given a creation time comes last).
pub fn serving_order(pool: &IPPool) -> (Timestamp, String, String) {
    let created = pool
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(Timestamp::MAX, |t| t.0);
    (
        created,
        pool.namespace().unwrap_or_default(),
        pool.name_any(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;
    use vmdhcp_core::crd::IPPoolSpec;

    /// Pool `ns{n % 2}/pool{n}` naming network `net` (`"bad name"`: one that does not parse).
    fn pool(n: u8, net: &str) -> IPPool {
        let mut p = IPPool::new(
            &format!("pool{n}"),
            IPPoolSpec {
                network_name: net.into(),
                ..Default::default()
            },
        );
        p.metadata.namespace = Some(format!("ns{}", n % 2));
        p
    }

    const NETWORK_NAMES: [&str; 4] = ["ns0/net-a", "net-a", "ns1/net-b", "bad name"];

    #[test]
    fn a_pool_moves_between_networks_and_a_relist_replaces_everything_once_complete() {
        let index = PoolNetworks::default();
        let net = |s: &str| -> NamespacedName { s.parse().unwrap() };
        let key = |s: &str| -> NamespacedName { s.parse().unwrap() };
        index.observe(&watcher::Event::Apply(pool(0, "net-a")));
        index.observe(&watcher::Event::Apply(pool(2, "ns0/net-a")));
        assert_eq!(
            index.on(&net("ns0/net-a")),
            BTreeSet::from([key("ns0/pool0"), key("ns0/pool2")]),
            "a bare network name is in the pool's namespace"
        );
        index.observe(&watcher::Event::Apply(pool(0, "ns1/net-b")));
        assert_eq!(
            index.on(&net("ns0/net-a")),
            BTreeSet::from([key("ns0/pool2")])
        );
        assert_eq!(
            index.on(&net("ns1/net-b")),
            BTreeSet::from([key("ns0/pool0")])
        );
        index.observe(&watcher::Event::Apply(pool(0, "bad name")));
        index.observe(&watcher::Event::Delete(pool(2, "ns0/net-a")));
        assert_eq!(index.networks(), 0, "no network kept without a pool");
        index.observe(&watcher::Event::Apply(pool(4, "net-a")));
        index.observe(&watcher::Event::Init);
        index.observe(&watcher::Event::InitApply(pool(1, "net-b")));
        assert_eq!(
            index.on(&net("ns0/net-a")),
            BTreeSet::from([key("ns0/pool4")])
        );
        index.observe(&watcher::Event::InitDone);
        assert!(index.on(&net("ns0/net-a")).is_empty());
        assert_eq!(
            index.on(&net("ns1/net-b")),
            BTreeSet::from([key("ns1/pool1")])
        );
    }

    #[derive(Debug, Clone)]
    enum Step {
        Apply(u8, usize),
        Delete(u8),
        Relist(Vec<(u8, usize)>),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            6 => (0..6u8, 0..NETWORK_NAMES.len()).prop_map(|(n, w)| Step::Apply(n, w)),
            2 => (0..6u8).prop_map(Step::Delete),
            1 => prop::collection::vec((0..6u8, 0..NETWORK_NAMES.len()), 0..5).prop_map(Step::Relist),
        ]
    }

    proptest! {
        #[test]
        fn answers_as_a_scan_of_every_pool_would(history in prop::collection::vec(step(), 1..40)) {
            let index = PoolNetworks::default();
            let mut pools: BTreeMap<NamespacedName, IPPool> = BTreeMap::new();
            for step in history {
                match step {
                    Step::Apply(n, w) => {
                        let p = pool(n, NETWORK_NAMES[w]);
                        pools.insert(object_ref(&p).unwrap(), p.clone());
                        index.observe(&watcher::Event::Apply(p));
                    }
                    Step::Delete(n) => {
                        let k = object_ref(&pool(n, "")).unwrap();
                        if let Some(p) = pools.remove(&k) {
                            index.observe(&watcher::Event::Delete(p));
                        }
                    }
                    Step::Relist(all) => {
                        pools.clear();
                        index.observe(&watcher::Event::Init);
                        for (n, w) in all {
                            let p = pool(n, NETWORK_NAMES[w]);
                            pools.insert(object_ref(&p).unwrap(), p.clone());
                            index.observe(&watcher::Event::InitApply(p));
                        }
                        index.observe(&watcher::Event::InitDone);
                    }
                }
                let mut networks = BTreeSet::new();
                for net in ["ns0/net-a", "ns1/net-a", "ns1/net-b", "ns0/net-b"] {
                    let net: NamespacedName = net.parse().unwrap();
                    let naive: BTreeSet<NamespacedName> = pools
                        .iter()
                        .filter(|(_, p)| network_of(p).as_ref() == Some(&net))
                        .map(|(k, _)| k.clone())
                        .collect();
                    if !naive.is_empty() {
                        networks.insert(net.clone());
                    }
                    prop_assert_eq!(index.on(&net), naive);
                }
                prop_assert_eq!(index.networks(), networks.len(), "no empty network kept");
            }
        }
    }
}
