//! Keeps the [`Index`] equal to what etcd says about the pools, on every replica (leader or
//! not), so any replica can serve the config stream.
//!
//! A pool is served when it is registered, its cache is ready (the leader rebuilt its IPAM from
//! status — upstream's CacheReady gate), it is not stopped, paused or being deleted, and its spec
//! is valid. Its leases are exactly the MAC entries of `status.ipv4.allocated`: an address reaches
//! agents only once it is recorded in etcd. Interface names come from [`ifname::assign`] over the
//! served set, and a pool is re-read only when its `resourceVersion` changed.

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
        }
    }

    /// Brings the index to the state of `pools` (the whole cache) in one revision; returns it,
    /// or `None` if nothing changed.
    pub fn sync(&mut self, pools: &[Arc<IPPool>]) -> Option<u64> {
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
            let config = match PoolConfig::from_ippool(pool, &name) {
                Ok(c) => c,
                Err(e) => {
                    warn!(pool = %pool_ref, error = %e, "not serving a pool with an invalid spec");
                    continue;
                }
            };
            let (leases, errors) = match leases_from_status(pool) {
                Ok(l) => l,
                Err(e) => {
                    warn!(pool = %pool_ref, error = %e, "not serving a pool without a name");
                    continue;
                }
            };
            for e in errors.iter().take(5) {
                warn!(pool = %pool_ref, error = %e, "status entry skipped");
            }
            ops.push(Op::UpsertPool(Box::new(config)));
            ops.push(Op::ReplaceLeases(
                (*pool_ref).clone(),
                leases.into_iter().map(|l| (l.mac, l.binding())).collect(),
            ));
            served.insert((*pool_ref).clone(), (version, name));
        }
        let gone: BTreeSet<&NamespacedName> = self
            .served
            .keys()
            .filter(|p| !served.contains_key(*p))
            .collect();
        ops.extend(gone.into_iter().map(|p| Op::RemovePool(p.clone())));
        self.served = served;
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
}
