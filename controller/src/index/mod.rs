//! The versioned index of pool configs and leases: the only thing the config stream reads, and
//! the watches that feed in-memory views of the API.
//!
//! - this module: the [`Index`] itself (revisions, history, snapshots and deltas);
//! - [`sync`]: IPPool status → index, on every replica, leader or not;
//! - [`shared_watch`]: one watch and cache per kind, feeding every reader in the process;
//! - [`caches`]: the process's shared watches of IPPools and configs;
//! - [`configs`]: which config holds each MAC on each network, and which configs a pool write
//!   concerns, kept per config event;
//! - [`pools`]: which pools name each network, kept per pool event;
//! - [`trim`]: what the caches keep of each object.
//!
//! It must not reach into the reconcilers or the gRPC layer: both depend on it, not the reverse.
//!
//! The sync writes to it with [`Index::apply`]: each call is one atomic change and, if it changes
//! anything, exactly one new revision. Readers take a [`Snapshot`] of the state or the
//! [`PoolDelta`] since a revision, filtered to the pools an agent serves. History is a bounded ring
//! of the keys each revision touched (not copies of values), so memory does not grow with churn,
//! and a delta is always computed from the *current* state of the touched keys: however far a
//! reader lags, what it is sent is the latest state, coalesced — never a queue of stale changes.
//!
//! The epoch names one process's index: revisions are only comparable within one epoch, so an
//! agent that comes back from another controller replica (or a restarted one) gets a snapshot.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry::trace::SpanContext;
use tokio::sync::watch;
use vmdhcp_core::pool::{Binding, Lease, PoolConfig, PoolDelta};
use vmdhcp_core::{MacAddr, NamespacedName};

pub mod caches;
pub mod configs;
pub mod pools;
pub mod shared_watch;
pub mod sync;
pub mod trim;

/// How many revisions of history an index keeps by default for resuming agents.
pub const DEFAULT_HISTORY: usize = 4096;
/// How many touched keys (pools + leases, summed over revisions) the history holds at most by
/// default; a few huge revisions cannot make it grow past this (about 100 MB).
pub const DEFAULT_HISTORY_KEYS: usize = 1_000_000;

/// One change to the index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Add or replace a pool's config (its leases are untouched). (Boxed: a config is several
    /// times the size of the other changes, which are the many.)
    UpsertPool(Box<PoolConfig>),
    /// Remove a pool and all its leases.
    RemovePool(NamespacedName),
    /// Add or replace the lease of a MAC on a pool.
    UpsertLease(Lease),
    /// Remove the lease of a MAC on a pool.
    RemoveLease(NamespacedName, MacAddr),
    /// Make a pool's leases exactly these (for resyncing one pool from its status).
    ReplaceLeases(NamespacedName, BTreeMap<MacAddr, Binding>),
}

/// The keys one revision touched.
#[derive(Debug, Default)]
struct Touched {
    revision: u64,
    pools: BTreeSet<NamespacedName>,
    leases: BTreeSet<(NamespacedName, MacAddr)>,
    /// The span that published the revision (when tracing), which stream sends continue.
    cause: Option<SpanContext>,
}

/// What one revision changed, shown to the caller of [`Index::apply_with`] before it is
/// published.
pub struct Change<'a> {
    /// Pools added, changed or removed.
    pub pools: &'a BTreeSet<NamespacedName>,
    /// Leases added, changed or removed.
    pub leases: &'a BTreeSet<(NamespacedName, MacAddr)>,
}

#[derive(Debug)]
struct State {
    revision: u64,
    pools: BTreeMap<NamespacedName, PoolConfig>,
    leases: BTreeMap<NamespacedName, BTreeMap<MacAddr, Binding>>,
    history: VecDeque<Touched>,
    history_keys: usize,
    history_limit: usize,
    history_keys_limit: usize,
}

impl State {
    /// The history's revisions after `since`, oldest first. Found by bisection (the history is
    /// in revision order): each stream client asks once per revision it catches up on, and a
    /// scan from the oldest kept revision would make that cost grow with the history rather
    /// than with what changed (docs/tuning.md).
    fn after(&self, since: u64) -> std::collections::vec_deque::Iter<'_, Touched> {
        let first = self.history.partition_point(|t| t.revision <= since);
        self.history.range(first..)
    }
}

/// Which pools a reader wants; empty means all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolFilter(BTreeSet<NamespacedName>);

impl PoolFilter {
    /// Every pool.
    pub fn all() -> Self {
        PoolFilter::default()
    }

    /// Only these pools (all of them when the list is empty).
    pub fn only(pools: impl IntoIterator<Item = NamespacedName>) -> Self {
        PoolFilter(pools.into_iter().collect())
    }

    /// Whether `pool` passes.
    pub fn accepts(&self, pool: &NamespacedName) -> bool {
        self.0.is_empty() || self.0.contains(pool)
    }
}

/// The state of (some) pools at one revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// The index's epoch.
    pub epoch: Arc<str>,
    /// The revision this state is at.
    pub revision: u64,
    /// Each pool with its leases, in pool order.
    pub pools: Vec<(PoolConfig, Vec<(MacAddr, Binding)>)>,
}

/// The index. Cheap to share (`Arc`); all access is short, under one mutex.
pub struct Index {
    epoch: Arc<str>,
    state: Mutex<State>,
    revisions: watch::Sender<u64>,
    /// The last revision that added, changed or removed a pool (not only leases).
    pool_revisions: watch::Sender<u64>,
}

impl Index {
    /// An empty index with a fresh epoch and the default history.
    pub fn new() -> Self {
        Self::with_history(DEFAULT_HISTORY)
    }

    /// An empty index keeping `history` revisions for resuming readers.
    pub fn with_history(history: usize) -> Self {
        Self::with_limits(history, DEFAULT_HISTORY_KEYS)
    }

    /// An empty index keeping at most `history` revisions and `history_keys` touched keys
    /// (always at least the latest revision).
    pub fn with_limits(history: usize, history_keys: usize) -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let epoch: Arc<str> = format!("{nanos:x}-{:x}", std::process::id()).into();
        Index {
            epoch,
            state: Mutex::new(State {
                revision: 0,
                pools: BTreeMap::new(),
                leases: BTreeMap::new(),
                history: VecDeque::new(),
                history_keys: 0,
                history_limit: history.max(1),
                history_keys_limit: history_keys,
            }),
            revisions: watch::channel(0).0,
            pool_revisions: watch::channel(0).0,
        }
    }

    /// The epoch of this index.
    pub fn epoch(&self) -> Arc<str> {
        self.epoch.clone()
    }

    /// The current revision.
    pub fn revision(&self) -> u64 {
        self.lock().revision
    }

    /// A receiver that wakes on every new revision (it sees the latest, not each one).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.revisions.subscribe()
    }

    /// A receiver that wakes when a pool is added, changed or removed, and not when only leases
    /// change: for readers of the pool set (the agent bootstrap), whose work must not grow with
    /// the rate of allocations.
    pub fn subscribe_pools(&self) -> watch::Receiver<u64> {
        self.pool_revisions.subscribe()
    }

    /// The configs of the pools `filter` accepts, in pool order, without their leases: what
    /// [`Index::snapshot`] gives minus the part that grows with the number of VMs.
    pub fn pool_configs(&self, filter: &PoolFilter) -> Vec<PoolConfig> {
        self.lock()
            .pools
            .iter()
            .filter(|(pool, _)| filter.accepts(pool))
            .map(|(_, cfg)| cfg.clone())
            .collect()
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Applies `ops` as one atomic change. Returns the new revision, or `None` when the ops
    /// changed nothing (then no revision is made and no reader wakes).
    pub fn apply(&self, ops: impl IntoIterator<Item = Op>) -> Option<u64> {
        self.apply_with(ops, |_| None)
    }

    /// [`Index::apply`], recording as the revision's cause the span `cause` returns for what
    /// changed (called only when something did, before readers wake).
    pub fn apply_with(
        &self,
        ops: impl IntoIterator<Item = Op>,
        cause: impl FnOnce(Change<'_>) -> Option<SpanContext>,
    ) -> Option<u64> {
        let mut st = self.lock();
        let mut touched = Touched::default();
        for op in ops {
            match op {
                Op::UpsertPool(cfg) => {
                    if st.pools.get(&cfg.pool) != Some(&cfg) {
                        touched.pools.insert(cfg.pool.clone());
                        st.leases.entry(cfg.pool.clone()).or_default();
                        st.pools.insert(cfg.pool.clone(), *cfg);
                    }
                }
                Op::RemovePool(pool) => {
                    if st.pools.remove(&pool).is_some() {
                        touched.pools.insert(pool.clone());
                    }
                    if let Some(leases) = st.leases.remove(&pool) {
                        touched
                            .leases
                            .extend(leases.into_keys().map(|mac| (pool.clone(), mac)));
                    }
                }
                Op::UpsertLease(lease) => {
                    let leases = st.leases.entry(lease.pool.clone()).or_default();
                    let binding = lease.binding();
                    if leases.insert(lease.mac, binding.clone()) != Some(binding) {
                        touched.leases.insert((lease.pool, lease.mac));
                    }
                }
                Op::RemoveLease(pool, mac) => {
                    if st
                        .leases
                        .get_mut(&pool)
                        .and_then(|l| l.remove(&mac))
                        .is_some()
                    {
                        touched.leases.insert((pool, mac));
                    }
                }
                Op::ReplaceLeases(pool, new) => {
                    let old = st.leases.entry(pool.clone()).or_default();
                    for (mac, binding) in old.iter() {
                        if new.get(mac) != Some(binding) {
                            touched.leases.insert((pool.clone(), *mac));
                        }
                    }
                    for (mac, ip) in &new {
                        if old.get(mac) != Some(ip) {
                            touched.leases.insert((pool.clone(), *mac));
                        }
                    }
                    *old = new;
                }
            }
        }
        if touched.pools.is_empty() && touched.leases.is_empty() {
            return None;
        }
        st.revision += 1;
        touched.revision = st.revision;
        touched.cause = cause(Change {
            pools: &touched.pools,
            leases: &touched.leases,
        });
        st.history_keys += touched.pools.len() + touched.leases.len();
        let pools_changed = !touched.pools.is_empty();
        st.history.push_back(touched);
        while st.history.len() > st.history_limit
            || (st.history.len() > 1 && st.history_keys > st.history_keys_limit)
        {
            if let Some(old) = st.history.pop_front() {
                st.history_keys -= old.pools.len() + old.leases.len();
            }
        }
        let revision = st.revision;
        drop(st);
        if pools_changed {
            self.pool_revisions.send_replace(revision);
        }
        self.revisions.send_replace(revision);
        Some(revision)
    }

    /// The current state of the pools `filter` accepts.
    pub fn snapshot(&self, filter: &PoolFilter) -> Snapshot {
        let st = self.lock();
        let pools = st
            .pools
            .iter()
            .filter(|(pool, _)| filter.accepts(pool))
            .map(|(pool, cfg)| {
                let leases = st
                    .leases
                    .get(pool)
                    .map(|l| l.iter().map(|(m, b)| (*m, b.clone())).collect())
                    .unwrap_or_default();
                (cfg.clone(), leases)
            })
            .collect();
        Snapshot {
            epoch: self.epoch.clone(),
            revision: st.revision,
            pools,
        }
    }

    /// What changed since `since` for the pools `filter` accepts, or `None` when the history no
    /// longer reaches back to `since` (or `since` is in the future): the reader needs a snapshot.
    pub fn changes_since(&self, since: u64, filter: &PoolFilter) -> Option<PoolDelta> {
        let st = self.lock();
        if since > st.revision {
            return None;
        }
        if since == st.revision {
            return Some(PoolDelta {
                base_revision: since,
                revision: since,
                ..PoolDelta::default()
            });
        }
        let oldest = st.history.front().map_or(st.revision + 1, |t| t.revision);
        if since + 1 < oldest {
            return None;
        }
        let mut pools = BTreeSet::new();
        let mut leases = BTreeSet::new();
        for t in st.after(since) {
            pools.extend(t.pools.iter().filter(|p| filter.accepts(p)).cloned());
            leases.extend(t.leases.iter().filter(|(p, _)| filter.accepts(p)).cloned());
        }
        let mut changes = PoolDelta {
            base_revision: since,
            revision: st.revision,
            ..PoolDelta::default()
        };
        for pool in pools {
            match st.pools.get(&pool) {
                Some(cfg) => changes.upserted_pools.push(cfg.clone()),
                None => changes.removed_pools.push(pool),
            }
        }
        for (pool, mac) in leases {
            match st.leases.get(&pool).and_then(|l| l.get(&mac)) {
                Some(binding) => changes.upserted_leases.push(binding.lease(pool, mac)),
                // A pool removed in this span takes its leases with it.
                None if !st.pools.contains_key(&pool) => {}
                None => changes.removed_leases.push((pool, mac)),
            }
        }
        Some(changes)
    }

    /// The spans that published the revisions after `since` up to `upto`, newest first (those
    /// still in the history and recorded while tracing).
    pub fn causes(&self, since: u64, upto: u64) -> Vec<SpanContext> {
        let st = self.lock();
        st.after(since)
            .rev()
            .filter(|t| t.revision <= upto)
            .filter_map(|t| t.cause.clone())
            .collect()
    }

    /// Revisions of history currently kept (bounded by the configured limit).
    pub fn history_len(&self) -> usize {
        self.lock().history.len()
    }
}

impl Default for Index {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use vmdhcp_core::fixtures::pool_config;

    /// Pool `ns/<name>` on its derived interface, in 192.0.2.0/24.
    fn pool(name: &str) -> PoolConfig {
        let key = format!("ns/{name}");
        pool_config(&key)
            .with_interface(&vmdhcp_core::ifname::base_name(&key.parse().unwrap()))
            .with_lease_seconds(3600)
    }

    fn lease(p: &str, m: u8, ip: u8) -> Lease {
        Lease {
            options: None,
            ipv6: None,
            pool: format!("ns/{p}").parse().unwrap(),
            mac: MacAddr([2, 0, 0, 0, 0, m]),
            ip: Ipv4Addr::new(192, 0, 2, ip),
            host_name: None,
        }
    }

    fn cause(n: u8) -> SpanContext {
        use opentelemetry::trace::{SpanId, TraceFlags, TraceId, TraceState};
        SpanContext::new(
            TraceId::from_bytes([n; 16]),
            SpanId::from_bytes([n; 8]),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        )
    }

    #[test]
    fn revisions_remember_their_cause_for_the_stream_sends() {
        let index = Index::new();
        index.apply([Op::UpsertPool(Box::new(pool("a")))]);
        let mut seen = None;
        let r2 = index.apply_with([Op::UpsertLease(lease("a", 1, 10))], |change| {
            seen = Some((change.pools.len(), change.leases.len()));
            Some(cause(2))
        });
        assert_eq!(
            seen,
            Some((0, 1)),
            "the callback sees what the revision changed"
        );
        assert_eq!(
            index.apply_with([Op::UpsertLease(lease("a", 1, 10))], |_| {
                panic!("no change, no callback")
            }),
            None
        );
        let r3 = index
            .apply_with([Op::UpsertLease(lease("a", 2, 11))], |_| Some(cause(3)))
            .unwrap();
        assert_eq!(index.causes(0, r3), [cause(3), cause(2)], "newest first");
        assert_eq!(index.causes(r2.unwrap(), r3), [cause(3)]);
        assert_eq!(index.causes(r3, r3), []);
    }

    #[test]
    fn each_effective_change_is_one_revision() {
        let ix = Index::new();
        assert_eq!(
            ix.apply([
                Op::UpsertPool(Box::new(pool("a"))),
                Op::UpsertLease(lease("a", 1, 10))
            ]),
            Some(1)
        );
        assert_eq!(
            ix.apply([Op::UpsertPool(Box::new(pool("a")))]),
            None,
            "no-op makes no revision"
        );
        assert_eq!(ix.apply([Op::UpsertLease(lease("a", 1, 10))]), None);
        assert_eq!(ix.apply([Op::UpsertLease(lease("a", 1, 11))]), Some(2));
        assert_eq!(*ix.subscribe().borrow(), 2);
        let snap = ix.snapshot(&PoolFilter::all());
        assert_eq!(snap.revision, 2);
        assert_eq!(
            snap.pools[0].1,
            [(
                MacAddr([2, 0, 0, 0, 0, 1]),
                Binding::ip(Ipv4Addr::new(192, 0, 2, 11))
            )]
        );
    }

    #[test]
    fn a_host_name_alone_is_a_change_readers_are_sent() {
        let ix = Index::new();
        ix.apply([
            Op::UpsertPool(Box::new(pool("a"))),
            Op::UpsertLease(lease("a", 1, 10)),
        ]);
        let r = ix.revision();
        let named = Lease {
            host_name: Some("vm-1".into()),
            ..lease("a", 1, 10)
        };
        let renamed = ix.apply([Op::ReplaceLeases(
            "ns/a".parse().unwrap(),
            BTreeMap::from([(named.mac, named.binding())]),
        )]);
        assert_eq!(renamed, Some(r + 1));
        let c = ix.changes_since(r, &PoolFilter::all()).unwrap();
        assert_eq!(c.upserted_leases, std::slice::from_ref(&named));
        assert_eq!(
            ix.apply([Op::UpsertLease(named)]),
            None,
            "the same name again"
        );
    }

    #[test]
    fn changes_are_the_latest_state_of_touched_keys() {
        let ix = Index::new();
        ix.apply([
            Op::UpsertPool(Box::new(pool("a"))),
            Op::UpsertPool(Box::new(pool("b"))),
        ]);
        ix.apply([
            Op::UpsertLease(lease("a", 1, 10)),
            Op::UpsertLease(lease("b", 2, 20)),
        ]);
        let r2 = ix.revision();
        ix.apply([Op::UpsertLease(lease("a", 1, 11))]);
        ix.apply([
            Op::UpsertLease(lease("a", 1, 12)),
            Op::UpsertLease(lease("a", 3, 13)),
        ]);
        ix.apply([Op::RemoveLease(
            "ns/a".parse().unwrap(),
            MacAddr([2, 0, 0, 0, 0, 3]),
        )]);
        ix.apply([Op::RemovePool("ns/b".parse().unwrap())]);
        let c = ix.changes_since(r2, &PoolFilter::all()).unwrap();
        assert_eq!((c.base_revision, c.revision), (r2, ix.revision()));
        assert_eq!(c.upserted_leases, [lease("a", 1, 12)]);
        assert_eq!(
            c.removed_leases,
            [("ns/a".parse().unwrap(), MacAddr([2, 0, 0, 0, 0, 3]))]
        );
        assert_eq!(c.removed_pools, ["ns/b".parse::<NamespacedName>().unwrap()]);
        assert!(c.upserted_pools.is_empty());
        // Filtered to pool b only: just its removal.
        let c = ix
            .changes_since(r2, &PoolFilter::only(["ns/b".parse().unwrap()]))
            .unwrap();
        assert_eq!(c.removed_pools.len(), 1);
        assert!(c.upserted_leases.is_empty() && c.removed_leases.is_empty());
        // Up to date: empty changes.
        assert!(
            ix.changes_since(ix.revision(), &PoolFilter::all())
                .unwrap()
                .is_empty()
        );
        assert!(
            ix.changes_since(ix.revision() + 1, &PoolFilter::all())
                .is_none()
        );
    }

    #[test]
    fn history_is_bounded_and_old_readers_need_a_snapshot() {
        let ix = Index::with_history(8);
        ix.apply([Op::UpsertPool(Box::new(pool("a")))]);
        for i in 0..100u8 {
            ix.apply([Op::UpsertLease(lease("a", 1, i))]);
        }
        assert_eq!(ix.history_len(), 8);
        assert!(ix.changes_since(0, &PoolFilter::all()).is_none());
        assert!(
            ix.changes_since(ix.revision() - 9, &PoolFilter::all())
                .is_none()
        );
        let c = ix
            .changes_since(ix.revision() - 8, &PoolFilter::all())
            .unwrap();
        assert_eq!(c.upserted_leases, [lease("a", 1, 99)]);
    }

    proptest::proptest! {
        /// On random histories, trimmed by both limits, the bisection finds exactly the
        /// revisions a scan of the whole history finds, for every reader's revision.
        #[test]
        fn revisions_after_are_found_as_a_scan_finds_them(
            batches in proptest::collection::vec(proptest::collection::vec((0u8..3, 0u8..8, 0u8..4), 1..6), 1..60),
            limit in 1usize..16,
            keys in 1usize..40,
        ) {
            let ix = Index::with_limits(limit, keys);
            let pools = ["a", "b", "c"];
            for batch in &batches {
                ix.apply(batch.iter().map(|&(p, m, what)| match what {
                    0 => Op::UpsertPool(Box::new(pool(pools[usize::from(p)]))),
                    1 => Op::RemoveLease(format!("ns/{}", pools[usize::from(p)]).parse().unwrap(), MacAddr([2, 0, 0, 0, 0, m])),
                    _ => Op::UpsertLease(lease(pools[usize::from(p)], m, m + what)),
                }));
            }
            let st = ix.lock();
            for since in 0..=st.revision + 1 {
                let scanned: Vec<u64> = st.history.iter().filter(|t| t.revision > since).map(|t| t.revision).collect();
                let found: Vec<u64> = st.after(since).map(|t| t.revision).collect();
                proptest::prop_assert_eq!(scanned, found, "since {}", since);
            }
        }
    }

    #[test]
    fn history_is_bounded_in_keys_too() {
        let ix = Index::with_limits(1000, 50);
        ix.apply([Op::UpsertPool(Box::new(pool("a")))]);
        for round in 0..10u8 {
            ix.apply((0..20u8).map(|m| Op::UpsertLease(lease("a", m, round))));
        }
        assert_eq!(ix.history_len(), 2, "40 keys fit, 60 do not");
        assert!(
            ix.changes_since(ix.revision() - 2, &PoolFilter::all())
                .is_some()
        );
        assert!(
            ix.changes_since(ix.revision() - 3, &PoolFilter::all())
                .is_none()
        );
        let huge = Index::with_limits(1000, 5);
        huge.apply((0..20u8).map(|m| Op::UpsertLease(lease("a", m, 1))));
        assert_eq!(huge.history_len(), 1, "the latest revision is always kept");
    }

    #[test]
    fn pool_readers_wake_on_pool_changes_only() {
        let index = Index::new();
        let mut pools = index.subscribe_pools();
        let mut all = index.subscribe();
        index.apply([Op::UpsertPool(Box::new(pool("a")))]);
        assert!(pools.has_changed().unwrap() && all.has_changed().unwrap());
        pools.mark_unchanged();
        all.mark_unchanged();
        index.apply([Op::UpsertLease(lease("a", 1, 10))]);
        assert!(all.has_changed().unwrap());
        assert!(
            !pools.has_changed().unwrap(),
            "a lease is not a pool change"
        );
        index.apply([Op::UpsertPool(Box::new(pool("a")))]);
        assert!(
            !pools.has_changed().unwrap(),
            "an unchanged config is no change"
        );
        index.apply([
            Op::UpsertPool(Box::new(pool("b"))),
            Op::RemovePool("ns/a".parse().unwrap()),
        ]);
        assert!(pools.has_changed().unwrap());
        assert_eq!(
            index.pool_configs(&PoolFilter::all()),
            vec![pool("b")],
            "configs only, in pool order"
        );
        assert!(
            index
                .pool_configs(&PoolFilter::only(["ns/a".parse().unwrap()]))
                .is_empty()
        );
    }

    #[test]
    fn replace_leases_touches_only_differences() {
        let ix = Index::new();
        ix.apply([
            Op::UpsertPool(Box::new(pool("a"))),
            Op::UpsertLease(lease("a", 1, 10)),
            Op::UpsertLease(lease("a", 2, 20)),
        ]);
        let r = ix.revision();
        let new = BTreeMap::from([
            (MacAddr([2, 0, 0, 0, 0, 1]), lease("a", 1, 10).binding()),
            (MacAddr([2, 0, 0, 0, 0, 4]), lease("a", 4, 40).binding()),
        ]);
        ix.apply([Op::ReplaceLeases("ns/a".parse().unwrap(), new)]);
        let c = ix.changes_since(r, &PoolFilter::all()).unwrap();
        assert_eq!(c.upserted_leases, [lease("a", 4, 40)]);
        assert_eq!(
            c.removed_leases,
            [("ns/a".parse().unwrap(), MacAddr([2, 0, 0, 0, 0, 2]))]
        );
    }
}
