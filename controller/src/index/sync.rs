//! Keeps the [`Index`] equal to what etcd says about the pools, on every replica (leader or
//! not), so any replica can serve the config stream.
//!
//! A pool is served when it is registered, its cache is ready (the leader rebuilt its IPAM from
//! status — upstream's CacheReady gate), it is not stopped, paused or being deleted, and its spec
//! is valid. Its leases are exactly the MAC entries of `status.ipv4.allocated`: an address reaches
//! agents only once it is recorded in etcd. Interface names come from [`ifname::assign`] over the
//! served set, and a pool is re-read only when its `resourceVersion` changed.
//!
//! One event costs what its pool's change costs ([`IndexSync::changed`]): a new version of a
//! served pool whose spec is the same is read by the status entries that differ from the version
//! before ([`RecordedLeases::update`]), and the whole served set is looked at again only when it
//! changes (a pool starts or stops being served, which may move a colliding interface name) and
//! after a relist ([`IndexSync::sync`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use tracing::{debug, field, info_span, warn};
use vmdhcp_core::crd::IPPool;
use vmdhcp_core::pool::{PoolConfig, PoolError, RecordedLeases, is_served};
use vmdhcp_core::{NamespacedName, ifname};
use vmdhcp_telemetry::trace;

use crate::causes::TraceCauses;
use crate::index::{Index, Op};
use crate::kinds::object_ref;

/// Applies IPPool state to the index.
pub struct IndexSync {
    index: Arc<Index>,
    causes: Arc<TraceCauses>,
    /// Served pools as last applied.
    served: BTreeMap<NamespacedName, Served>,
    /// Pools looked at so far: what the changes cost (a metric, and tests count it).
    examined: u64,
}

/// A served pool as last applied.
struct Served {
    /// The interface it is served on.
    name: String,
    /// The version read (the cache's own, shared), which the next one is compared with.
    pool: Arc<IPPool>,
    /// Its recorded leases, kept for that comparison.
    leases: RecordedLeases,
}

impl Served {
    fn version(&self) -> Option<&str> {
        self.pool.metadata.resource_version.as_deref()
    }
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
        pool: &Arc<IPPool>,
        deleted: bool,
        all: impl FnOnce() -> Vec<Arc<IPPool>>,
    ) -> Option<u64> {
        self.examined += 1;
        let key = object_ref(pool.as_ref())?;
        let serve = !deleted && is_served(pool);
        let Some(before) = self.served.get(&key) else {
            return if serve { self.sync(&all()) } else { None };
        };
        if !serve {
            return self.sync(&all());
        }
        if before.version() == pool.metadata.resource_version.as_deref() {
            return None;
        }
        let name = before.name.clone();
        let mut slot = self.served.remove(&key);
        let ops = Self::read(&key, pool, &name, &mut slot);
        if let Some(served) = slot {
            self.served.insert(key, served);
        }
        match ops {
            Some(ops) => self.publish(ops),
            // No longer servable as it is: the full pass withdraws it.
            None => self.sync(&all()),
        }
    }

    /// The ops that make the index hold `pool` as served on `name`, `served` then holding what
    /// is kept of it; `None` (logged, `served` untouched) if its spec or name cannot be read.
    /// From the version last applied on the same interface (`served`), only what changed is
    /// read when the pool's config did not change.
    fn read(
        key: &NamespacedName,
        pool: &Arc<IPPool>,
        name: &str,
        served: &mut Option<Served>,
    ) -> Option<Vec<Op>> {
        if let Some(kept) = served
            .as_mut()
            .filter(|b| b.name == name && same_config(b.pool.as_ref(), pool.as_ref()))
        {
            let changes = logged(key, kept.leases.update(&kept.pool, pool))?;
            kept.pool = Arc::clone(pool);
            return Some(
                changes
                    .into_iter()
                    .map(|(mac, binding)| match binding {
                        Some(b) => Op::UpsertLease(b.lease(key.clone(), mac)),
                        None => Op::RemoveLease(key.clone(), mac),
                    })
                    .collect(),
            );
        }
        let config = match PoolConfig::from_ippool(pool, name) {
            Ok(c) => c,
            Err(e) => {
                warn!(pool = %key, error = %e, "not serving a pool with an invalid spec");
                return None;
            }
        };
        let (leases, read) = logged(
            key,
            RecordedLeases::read(pool).map(|(leases, read, errors)| ((leases, read), errors)),
        )?;
        *served = Some(Served {
            name: name.to_owned(),
            pool: Arc::clone(pool),
            leases,
        });
        Some(vec![
            Op::UpsertPool(Box::new(config)),
            Op::ReplaceLeases(
                key.clone(),
                read.into_iter().map(|l| (l.mac, l.binding())).collect(),
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
        let mut before = std::mem::take(&mut self.served);
        for (pool_ref, pool) in &live {
            let name = names.get(pool_ref).cloned().unwrap_or_default();
            let mut slot = before.remove(pool_ref);
            let unchanged = slot.as_ref().is_some_and(|k| {
                k.name == name && k.version() == pool.metadata.resource_version.as_deref()
            });
            if !unchanged {
                match Self::read(pool_ref, pool, &name, &mut slot) {
                    Some(pool_ops) => ops.extend(pool_ops),
                    None => {
                        // Served until now, unreadable now: withdrawn.
                        if slot.take().is_some() {
                            ops.push(Op::RemovePool((*pool_ref).clone()));
                        }
                        continue;
                    }
                }
            }
            if let Some(served) = slot {
                self.served.insert((*pool_ref).clone(), served);
            }
        }
        ops.extend(before.into_keys().map(Op::RemovePool));
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

/// What was read of a pool's leases, its bad entries logged (the first five: they come back with
/// every version until someone mends them); `None` (logged) for a pool without a name.
fn logged<T>(key: &NamespacedName, read: Result<(T, Vec<PoolError>), PoolError>) -> Option<T> {
    match read {
        Ok((read, errors)) => {
            for e in errors.iter().take(5) {
                warn!(pool = %key, error = %e, "status entry skipped");
            }
            Some(read)
        }
        Err(e) => {
            warn!(pool = %key, error = %e, "not serving a pool without a name");
            None
        }
    }
}

/// Whether two versions of a pool give it the same config (spec, and the conflicted addresses
/// its status records), so that only its leases can differ.
fn same_config(a: &IPPool, b: &IPPool) -> bool {
    a.spec == b.spec && a.conflict_keys().eq(b.conflict_keys())
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

    /// A conflict recorded on either family changes the pool's config (agents must withhold
    /// and recheck it); the leases alone do not.
    #[test]
    fn a_recorded_conflict_of_either_family_changes_the_config() {
        let base = vmdhcp_core::fixtures::dual_stack_pool();
        let leased = with_allocated(base.clone(), &[("192.168.100.10", "02:00:00:00:00:01")]);
        assert!(same_config(&base, &leased));
        let conflict = || {
            [(
                "fd00::11".to_owned(),
                vmdhcp_core::crd::AddressConflict::default(),
            )]
            .into()
        };
        let mut v6 = base.clone();
        v6.status.get_or_insert_default().ipv6 = Some(vmdhcp_core::crd::IPv6Status {
            conflicts: conflict(),
            ..Default::default()
        });
        assert!(!same_config(&base, &v6));
        let mut v4 = base.clone();
        v4.status.get_or_insert_default().ipv4 = Some(vmdhcp_core::crd::IPv4Status {
            conflicts: [(
                "192.168.100.11".to_owned(),
                vmdhcp_core::crd::AddressConflict::default(),
            )]
            .into(),
            ..Default::default()
        });
        assert!(!same_config(&base, &v4));
        assert!(!same_config(&v4, &v6));
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

    /// One version of pool `name` in a random history: its books, whether it sends host
    /// names (a spec change), a recorded conflict (a config change), and whether it is served.
    #[derive(Clone, Debug)]
    struct Version {
        pool: usize,
        allocated: Vec<(u8, u8)>,
        host_names: Vec<(u8, u8)>,
        names: bool,
        conflict: bool,
        ready: bool,
    }

    fn versions() -> impl proptest::strategy::Strategy<Value = Vec<Version>> {
        use proptest::prelude::*;
        let version = (
            0usize..3,
            proptest::collection::vec((80u8..90, 0u8..6), 0..8),
            proptest::collection::vec((80u8..90, 0u8..3), 0..3),
            proptest::bool::weighted(0.2),
            proptest::bool::weighted(0.1),
            proptest::bool::weighted(0.9),
        )
            .prop_map(
                |(pool, allocated, host_names, names, conflict, ready)| Version {
                    pool,
                    allocated,
                    host_names,
                    names,
                    conflict,
                    ready,
                },
            );
        proptest::collection::vec(version, 1..30)
    }

    /// Version `n` of a history as the cache would hold it. MACs 1-4, `EXCLUDED` (0) and a bad
    /// value (5); host names good and bad.
    fn object(v: &Version, n: usize) -> Arc<IPPool> {
        let name = format!("p{}", v.pool);
        let entries: Vec<(String, String)> = v
            .allocated
            .iter()
            .map(|(o, m)| {
                let value = match m {
                    0 => "EXCLUDED".to_owned(),
                    5 => "bad".to_owned(),
                    m => format!("02:00:00:00:00:0{m}"),
                };
                (format!("192.168.48.{o}"), value)
            })
            .collect();
        let entries: Vec<(&str, &str)> = entries
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let mut p = (*pool(&name, v.ready, &entries)).clone();
        p.metadata.resource_version = Some(n.to_string());
        p.spec.ipv4_config.send_host_name = Some(v.names);
        let v4 = p
            .status
            .as_mut()
            .and_then(|s| s.ipv4.as_mut())
            .expect("with_allocated sets books");
        v4.host_names = v
            .host_names
            .iter()
            .map(|(o, h)| {
                let host = if *h == 2 {
                    "Not A Name".to_owned()
                } else {
                    format!("vm-{h}")
                };
                (format!("192.168.48.{o}"), host)
            })
            .collect();
        if v.conflict {
            v4.conflicts
                .insert("192.168.48.85".into(), Default::default());
        }
        Arc::new(p)
    }

    proptest::proptest! {
        /// Following each pool event by what changed in it serves, after every event, what a
        /// full pass over the cache serves, and looks at one pool per event while the served
        /// set stays the same.
        #[test]
        fn events_end_where_a_full_pass_would(history in versions()) {
            let index = Arc::new(Index::new());
            let mut sync = IndexSync::new(index.clone());
            let mut cache: BTreeMap<usize, Arc<IPPool>> = BTreeMap::new();
            for (n, v) in history.iter().enumerate() {
                let obj = object(v, n + 1);
                cache.insert(v.pool, obj.clone());
                let all: Vec<Arc<IPPool>> = cache.values().cloned().collect();
                let key = format!("default/p{}", v.pool);
                let was_served = served(&index).iter().any(|(p, _, _)| *p == key);
                let examined = sync.examined();
                sync.changed(&obj, false, || all.clone());
                let fresh = Arc::new(Index::new());
                IndexSync::new(fresh.clone()).sync(&all);
                let (ours, full) = (
                    index.snapshot(&PoolFilter::all()).pools,
                    fresh.snapshot(&PoolFilter::all()).pools,
                );
                proptest::prop_assert_eq!(ours, full, "after version {}: {:?}", n + 1, v);
                if was_served && v.ready {
                    proptest::prop_assert_eq!(sync.examined(), examined + 1, "one pool looked at");
                }
            }
        }
    }
}
