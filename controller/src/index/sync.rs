//! Keeps the [`Index`] equal to what etcd says about the pools, on every replica (leader or
//! not), so any replica can serve the config stream.
//!
//! A pool is served when it is registered, its cache is ready (the leader rebuilt its IPAM from
//! status — upstream's CacheReady gate), it is not stopped, paused or being deleted, and its spec
//! is valid. Its leases are exactly the MAC entries of `status.ipv4.allocated`: an address reaches
//! agents only once it is recorded in etcd. Interface names come from [`ifname::assign`] over the
//! served set, and a pool is re-read only when its `resourceVersion` changed.
//!
//! One event costs what its pool costs ([`IndexSync::changed`]): the whole served set is looked
//! at again only when it changes (a pool starts or stops being served, which may move a colliding
//! interface name) and after a relist ([`IndexSync::sync`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kube::ResourceExt;
use tracing::{debug, field, info_span, warn};
use vmdhcp_core::crd::IPPool;
use vmdhcp_core::pool::{PoolConfig, is_served, leases_from_status};
use vmdhcp_core::{NamespacedName, ifname};
use vmdhcp_telemetry::trace;

use crate::causes::TraceCauses;
use crate::index::{Index, Op};
use crate::kinds::object_ref;

/// Applies IPPool state to the index.
pub struct IndexSync {
    index: Arc<Index>,
    causes: Arc<TraceCauses>,
    /// Served pools → (resourceVersion, interface name) as last applied.
    served: BTreeMap<NamespacedName, (String, String)>,
    /// Pools looked at so far: what the changes cost (a metric, and tests count it).
    examined: u64,
}

impl IndexSync {
    /// A sync feeding `index`.
    pub fn new(index: Arc<Index>) -> Self {
        Self::with_causes(index, Arc::default())
    }

    /// A sync feeding `index` whose revisions continue the traces of the allocations in
    /// `causes` (the leader's; other replicas publish revisions as traces of their own).
    pub fn with_causes(index: Arc<Index>, causes: Arc<TraceCauses>) -> Self {
        IndexSync {
            index,
            causes,
            served: BTreeMap::new(),
            examined: 0,
        }
    }

    /// Pools looked at since this sync started: one per [`IndexSync::changed`] call, every
    /// pool of each full pass.
    pub fn examined(&self) -> u64 {
        self.examined
    }

    /// Applies one event of `pool` (`deleted`: it is gone); `all` gives the whole cache, asked
    /// for only when the set of served pools changes. Returns the new revision, if any.
    pub fn changed(
        &mut self,
        pool: &IPPool,
        deleted: bool,
        all: impl FnOnce() -> Vec<Arc<IPPool>>,
    ) -> Option<u64> {
        self.examined += 1;
        let key = object_ref(pool)?;
        let serve = !deleted && is_served(pool);
        let Some((version, name)) = self.served.get(&key).cloned() else {
            return if serve { self.sync(&all()) } else { None };
        };
        if !serve {
            return self.sync(&all());
        }
        let now = pool.resource_version().unwrap_or_default();
        if now == version {
            return None;
        }
        let Some(ops) = self.read(&key, pool, &name) else {
            // No longer servable as it is: the full pass withdraws it.
            return self.sync(&all());
        };
        self.served.insert(key, (now, name));
        self.publish(ops)
    }

    /// The ops that make the index hold `pool` as served on `name`; `None` (logged) if its spec
    /// or name cannot be read.
    fn read(&mut self, key: &NamespacedName, pool: &IPPool, name: &str) -> Option<Vec<Op>> {
        let config = match PoolConfig::from_ippool(pool, name) {
            Ok(c) => c,
            Err(e) => {
                warn!(pool = %key, error = %e, "not serving a pool with an invalid spec");
                return None;
            }
        };
        let (leases, errors) = match leases_from_status(pool) {
            Ok(l) => l,
            Err(e) => {
                warn!(pool = %key, error = %e, "not serving a pool without a name");
                return None;
            }
        };
        for e in errors.iter().take(5) {
            warn!(pool = %key, error = %e, "status entry skipped");
        }
        Some(vec![
            Op::UpsertPool(Box::new(config)),
            Op::ReplaceLeases(
                key.clone(),
                leases.into_iter().map(|l| (l.mac, l.binding())).collect(),
            ),
        ])
    }

    /// Brings the index to the state of `pools` (the whole cache) in one revision; returns it,
    /// or `None` if nothing changed.
    pub fn sync(&mut self, pools: &[Arc<IPPool>]) -> Option<u64> {
        self.examined += pools.len() as u64;
        let live: BTreeMap<NamespacedName, &Arc<IPPool>> = pools
            .iter()
            .filter(|p| is_served(p))
            .filter_map(|p| Some((object_ref(p.as_ref())?, p)))
            .collect();
        let names = ifname::assign(live.keys());
        let mut ops = Vec::new();
        let mut served = BTreeMap::new();
        for (pool_ref, pool) in &live {
            let version = pool.resource_version().unwrap_or_default();
            let name = names.get(pool_ref).cloned().unwrap_or_default();
            if self.served.get(pool_ref) == Some(&(version.clone(), name.clone())) {
                served.insert((*pool_ref).clone(), (version, name));
                continue;
            }
            let Some(pool_ops) = self.read(pool_ref, pool, &name) else {
                continue;
            };
            ops.extend(pool_ops);
            served.insert((*pool_ref).clone(), (version, name));
        }
        let gone: BTreeSet<&NamespacedName> = self
            .served
            .keys()
            .filter(|p| !served.contains_key(*p))
            .collect();
        ops.extend(gone.into_iter().map(|p| Op::RemovePool(p.clone())));
        self.served = served;
        self.publish(ops)
    }

    /// Applies `ops` as one revision (continuing the traces of the allocations it publishes).
    fn publish(&mut self, ops: Vec<Op>) -> Option<u64> {
        if ops.is_empty() {
            return None;
        }
        let span = info_span!(
            "index.publish",
            revision = field::Empty,
            pools = field::Empty,
            leases = field::Empty
        );
        let causes = &self.causes;
        let revision = self.index.apply_with(ops, |change| {
            span.record("pools", change.pools.len());
            span.record("leases", change.leases.len());
            if !trace::enabled() {
                return None;
            }
            // The allocations whose leases this revision publishes: the first is the parent.
            let from: Vec<_> = change
                .leases
                .iter()
                .filter_map(|key| causes.leases.take(key))
                .collect();
            trace::continue_from(&span, &from);
            trace::span_context(&span)
        });
        if let Some(r) = revision {
            span.record("revision", r);
            span.in_scope(|| {
                debug!(
                    revision = r,
                    pools = self.served.len(),
                    "index updated from IPPools"
                )
            });
        }
        revision
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::PoolFilter;
    use vmdhcp_core::crd::{CONDITION_CACHE_READY, CONDITION_REGISTERED};
    use vmdhcp_core::fixtures::{pool_on, with_allocated, with_conditions};

    /// The README pool renamed `default/<name>` on its own network, registered, ready or not,
    /// with `allocated` (its resource version changes with the number of entries).
    fn pool(name: &str, ready: bool, allocated: &[(&str, &str)]) -> Arc<IPPool> {
        let key = format!("default/{name}");
        let mut p = pool_on(&key, &key);
        p.metadata.resource_version = Some(format!("{name}-{}", allocated.len()));
        let p = with_conditions(
            p,
            &[(CONDITION_REGISTERED, true), (CONDITION_CACHE_READY, ready)],
        );
        Arc::new(with_allocated(p, allocated))
    }

    #[test]
    fn serves_ready_pools_with_their_recorded_leases_only() {
        let index = Arc::new(Index::new());
        let mut sync = IndexSync::new(index.clone());
        let a = pool(
            "a",
            true,
            &[
                ("192.168.48.86", "c6:d6:82:39:d3:c3"),
                ("192.168.48.81", "EXCLUDED"),
            ],
        );
        let b = pool("b", false, &[]);
        assert_eq!(sync.sync(&[a.clone(), b.clone()]), Some(1));
        let snap = index.snapshot(&PoolFilter::all());
        assert_eq!(
            snap.pools.len(),
            1,
            "a pool whose cache is not ready is not served"
        );
        assert_eq!(snap.pools[0].1.len(), 1, "markers are not leases");
        assert_eq!(
            snap.pools[0].0.interface_name,
            ifname::base_name(&"default/a".parse().unwrap())
        );
        assert_eq!(
            sync.sync(&[a.clone(), b]),
            None,
            "unchanged resourceVersion: nothing to do"
        );

        let mut paused = (*a).clone();
        paused.spec.paused = Some(true);
        paused.metadata.resource_version = Some("later".into());
        sync.sync(&[Arc::new(paused)]);
        assert!(
            index.snapshot(&PoolFilter::all()).pools.is_empty(),
            "paused pools stop being served"
        );
    }

    /// What the index serves: pools with their interface and leases.
    fn served(index: &Index) -> Vec<(String, String, usize)> {
        index
            .snapshot(&PoolFilter::all())
            .pools
            .iter()
            .map(|(c, leases)| (c.pool.to_string(), c.interface_name.clone(), leases.len()))
            .collect()
    }

    #[test]
    fn one_event_examines_one_pool_and_ends_where_a_full_pass_would() {
        let index = Arc::new(Index::new());
        let mut sync = IndexSync::new(index.clone());
        let mut cache: BTreeMap<String, Arc<IPPool>> = (0..50)
            .map(|i| (format!("p{i}"), pool(&format!("p{i}"), true, &[])))
            .collect();
        let all = |c: &BTreeMap<String, Arc<IPPool>>| c.values().cloned().collect::<Vec<_>>();
        sync.sync(&all(&cache));
        assert_eq!(sync.examined(), 50);

        // An allocation recorded in one pool's status: that pool is looked at, no other.
        let grown = pool("p7", true, &[("192.168.48.86", "c6:d6:82:39:d3:c3")]);
        cache.insert("p7".into(), grown.clone());
        let revision = sync.changed(&grown, false, || panic!("the served set did not change"));
        assert!(revision.is_some());
        assert_eq!(sync.examined(), 51);
        // The same object again (a resync): no new revision.
        assert_eq!(sync.changed(&grown, false, || panic!("unchanged")), None);
        assert_eq!(sync.examined(), 52);

        // A pool that stops being served, one deleted, one new: the set changes, a full pass.
        let unready = pool("p8", false, &[]);
        cache.insert("p8".into(), unready.clone());
        sync.changed(&unready, false, || all(&cache));
        let gone = cache.remove("p9").unwrap();
        sync.changed(&gone, true, || all(&cache));
        let new = pool("q", true, &[]);
        cache.insert("q".into(), new.clone());
        sync.changed(&new, false, || all(&cache));

        let fresh = Arc::new(Index::new());
        IndexSync::new(fresh.clone()).sync(&all(&cache));
        assert_eq!(served(&index), served(&fresh));
        assert_eq!(served(&index).len(), 49);
    }
}
