//! Where the served leases come from, and which source wins.
//!
//! Two sources feed the one [`LeaseTable`]: the controller's config stream, and, while the stream
//! is unavailable, the IPPools named in `IPPOOL_REFS_JSON` read directly from the API server
//! (their `status.ipv4.allocated`, which is what the controller streams anyway: etcd is the only
//! source of truth). The stream wins whenever it is live; the fallback fills in when it is not,
//! so that an agent restarted while the controller is down still serves every lease recorded in
//! etcd. Switching is done under one lock, so a late fallback update can never overwrite a state
//! the stream has just applied.
//!
//! A third source stands alone: a JSON file of pools and leases ([`mod@file`], `serve-static`),
//! which replaces the table whole at start and on each reload; nothing else feeds the table then.
//!
//! Every source speaks the agent's one vocabulary for pool state ([`crate::pools`]), which the
//! table takes as it is: nothing here translates between shapes. This module owns the
//! arbitration ([`Sources`], the stream's [`ConfigSink`]), the IPPool watch feeding the
//! fallback ([`follow_ippools`]) and the reading of IPPools into pools ([`pools_from_ippools`]).

pub mod file;

use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use tokio::sync::watch;
use tracing::{debug, info, warn};
use vmdhcp_core::NamespacedName;
use vmdhcp_core::crd::IPPool;
use vmdhcp_core::pool::{PoolConfig, is_served, leases_from_status};

use crate::lease_table::LeaseTable;
use crate::pools::{PoolDelta, PoolLeases};
use crate::stream::{AppliedState, ConfigSink};

/// Which source the table holds now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Source {
    /// Nothing loaded yet.
    #[default]
    None,
    /// The controller's config stream.
    Stream,
    /// The IPPools' status, read directly while the stream is unavailable.
    IPPoolStatus,
    /// A static file of pools and leases (`serve-static`).
    File,
}

impl Source {
    /// The name shown on `/readyz`.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::None => "none",
            Source::Stream => "stream",
            Source::IPPoolStatus => "ippool-status",
            Source::File => "file",
        }
    }
}

/// What the table holds, as the rest of the agent follows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceView {
    /// Where the table's content comes from.
    pub source: Source,
    /// Whether a complete state has been loaded (from either source); readiness waits for it.
    pub loaded: bool,
    /// Bumped on every change of the table, so followers wake up on each one.
    pub generation: u64,
}

#[derive(Default)]
struct State {
    /// The stream has delivered something since it last (re)connected.
    stream_live: bool,
    /// The last complete fallback state.
    fallback: Option<Vec<PoolLeases>>,
}

/// The arbiter: the stream's [`ConfigSink`], and the entry point of the fallback.
pub struct Sources {
    table: Arc<LeaseTable>,
    state: Mutex<State>,
    view: watch::Sender<SourceView>,
}

impl Sources {
    /// Arbitrates writes to `table`. `loaded` starts true for an agent with nothing to load
    /// (no pools in its bootstrap).
    pub fn new(table: Arc<LeaseTable>, loaded: bool) -> Self {
        Sources {
            table,
            state: Mutex::new(State::default()),
            view: watch::channel(SourceView {
                loaded,
                ..SourceView::default()
            })
            .0,
        }
    }

    /// Follows every change of the table and its source.
    pub fn subscribe(&self) -> watch::Receiver<SourceView> {
        self.view.subscribe()
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, State> {
        // The state is a flag and a cloneable vector: a panic elsewhere cannot leave it torn.
        self.state.lock()
    }

    fn changed(&self, source: Source) {
        self.view.send_modify(|v| {
            v.source = source;
            v.loaded = true;
            v.generation += 1;
        });
    }

    fn apply_fallback(&self, pools: &[PoolLeases]) {
        for error in self.table.apply_snapshot(pools) {
            warn!(%error, "lease from IPPool status skipped");
        }
        self.changed(Source::IPPoolStatus);
    }

    /// The stream's whole applied state replaces the table's. A lease the table refuses is
    /// skipped with a warning; the rest is served.
    fn apply_stream_state(&self, applied: &AppliedState) {
        for error in self.table.apply_snapshot(applied.pools.values()) {
            warn!(%error, "lease from the stream's snapshot skipped");
        }
    }

    /// The stream is gone: from now on the fallback, when it has a state, is served; until it
    /// has one, the stream's last applied state stays.
    pub fn stream_lost(&self) {
        let mut state = self.lock();
        if !state.stream_live {
            return;
        }
        state.stream_live = false;
        if let Some(pools) = &state.fallback {
            info!("config stream lost; serving leases from IPPool status");
            self.apply_fallback(pools);
        }
    }

    /// A complete state read from IPPool status; served unless the stream is live.
    pub fn fallback(&self, pools: Vec<PoolLeases>) {
        let mut state = self.lock();
        if !state.stream_live {
            self.apply_fallback(&pools);
        }
        state.fallback = Some(pools);
    }

    /// A complete state read from the static file: the only source in that mode, it replaces
    /// the table whole. A lease the table refuses is skipped with a warning.
    pub fn file(&self, pools: Vec<PoolLeases>) {
        let _state = self.lock();
        for error in self.table.apply_snapshot(&pools) {
            warn!(%error, "lease skipped");
        }
        self.changed(Source::File);
    }

    /// The stream is current again: its whole state replaces whatever the fallback served.
    fn stream_is_back(&self, state: &mut State, applied: &AppliedState) {
        if !state.stream_live {
            state.stream_live = true;
            self.apply_stream_state(applied);
            self.changed(Source::Stream);
        }
    }
}

impl ConfigSink for Sources {
    fn snapshot(&self, applied: &AppliedState) {
        let mut state = self.lock();
        state.stream_live = true;
        self.apply_stream_state(applied);
        self.changed(Source::Stream);
    }

    fn delta(&self, delta: &PoolDelta, applied: &AppliedState) {
        let mut state = self.lock();
        if state.stream_live {
            for error in self.table.apply(delta) {
                warn!(%error, revision = delta.revision, "lease from the stream's delta skipped");
            }
            self.changed(Source::Stream);
        } else {
            // Resumed with a delta while the fallback was served: the table does not hold the
            // delta's base, so the whole stream state goes in.
            self.stream_is_back(&mut state, applied);
        }
    }

    fn resumed(&self, applied: &AppliedState) {
        let mut state = self.lock();
        self.stream_is_back(&mut state, applied);
    }
}

/// The pools to serve from IPPool objects: those in `refs` that are served (not paused, stopped
/// or being deleted; see [`is_served`]), each on the interface its bootstrap names, with the
/// leases of its status. A pool whose spec is invalid is skipped with a warning, as the
/// controller skips it.
pub fn pools_from_ippools<'a>(
    ippools: impl IntoIterator<Item = &'a IPPool>,
    interfaces: &BTreeMap<NamespacedName, String>,
) -> Vec<PoolLeases> {
    let mut out = Vec::new();
    for pool in ippools {
        let (Some(ns), Some(name)) = (&pool.metadata.namespace, &pool.metadata.name) else {
            continue;
        };
        let Ok(pool_ref) = NamespacedName::new(ns, name) else {
            continue;
        };
        let Some(interface) = interfaces.get(&pool_ref) else {
            continue;
        };
        if !is_served(pool) {
            continue;
        }
        let config = match PoolConfig::from_ippool(pool, interface) {
            Ok(c) => c,
            Err(error) => {
                warn!(pool = %pool_ref, %error, "IPPool not served from status: invalid spec");
                continue;
            }
        };
        match leases_from_status(pool) {
            Ok((leases, errors)) => {
                for error in errors.iter().take(5) {
                    warn!(pool = %pool_ref, %error, "status entry skipped");
                }
                // Status lists addresses in order; a MAC recorded at two keeps the later one,
                // as the table kept it when it read the list itself.
                let leases = leases
                    .into_iter()
                    .map(|lease| (lease.mac, lease.binding()))
                    .collect();
                out.push(PoolLeases { config, leases });
            }
            Err(error) => warn!(pool = %pool_ref, %error, "IPPool status not readable"),
        }
    }
    out
}

/// Whether a watch event concerns one of the `wanted` pools (list markers always do).
fn is_wanted(wanted: &BTreeSet<NamespacedName>, event: &watcher::Event<IPPool>) -> bool {
    match event {
        watcher::Event::Apply(p) | watcher::Event::InitApply(p) | watcher::Event::Delete(p) => {
            vmdhcp_core::pool::pool_ref(p).is_ok_and(|r| wanted.contains(&r))
        }
        watcher::Event::Init | watcher::Event::InitDone => true,
    }
}

/// How long a burst of IPPool events is collected before the fallback state is recomputed.
const SETTLE: Duration = Duration::from_millis(100);

/// Watches the IPPools in `interfaces` (pool → interface) and hands [`Sources::fallback`] their
/// state after every change, until `shutdown` turns true. One watch per namespace those pools
/// live in, never the whole cluster's; other pools of those namespaces are not cached, nor
/// anyone's `managedFields`. Watch errors are logged and retried with backoff; the last good
/// state stays meanwhile.
pub async fn follow_ippools(
    client: kube::Client,
    interfaces: BTreeMap<NamespacedName, String>,
    sources: Arc<Sources>,
    mut shutdown: watch::Receiver<bool>,
) {
    let namespaces: BTreeSet<&str> = interfaces.keys().map(|p| p.namespace.as_str()).collect();
    info!(
        pools = interfaces.len(),
        namespaces = namespaces.len(),
        "watching IPPools for the fallback lease source"
    );
    let wanted: Arc<BTreeSet<NamespacedName>> = Arc::new(interfaces.keys().cloned().collect());
    let mut stores = Vec::with_capacity(namespaces.len());
    let mut watches = Vec::with_capacity(namespaces.len());
    for (n, ns) in namespaces.into_iter().enumerate() {
        let (store, writer) = reflector::store::<IPPool>();
        let wanted = Arc::clone(&wanted);
        let api = Api::<IPPool>::namespaced(client.clone(), ns);
        let events = watcher(api, watcher::Config::default())
            .default_backoff()
            .try_filter(move |event| std::future::ready(is_wanted(&wanted, event)))
            .modify(|p| p.managed_fields_mut().clear())
            .reflect(writer)
            .map(move |event| (n, event))
            .boxed();
        stores.push(store);
        watches.push(events);
    }
    // The fallback is computed once every namespace's watch has listed.
    let mut listed = BTreeSet::new();
    let watching = watches.len();
    let mut events = futures_util::stream::select_all(watches);
    let mut ready = false;
    loop {
        let event = tokio::select! {
            event = events.next() => event,
            _ = shutdown.changed() => return,
        };
        let mut dirty = false;
        let mut note =
            |event: Option<(usize, Result<watcher::Event<IPPool>, watcher::Error>)>| match event {
                Some((n, Ok(watcher::Event::InitDone))) => {
                    listed.insert(n);
                    ready = listed.len() >= watching;
                    dirty = true;
                }
                Some((_, Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)))) => dirty = true,
                Some((_, Ok(_))) => {}
                Some((_, Err(error))) => warn!(%error, "IPPool watch failed; retrying"),
                None => {}
            };
        let Some(event) = event else { return };
        note(Some(event));
        // Take the rest of a burst before recomputing.
        while let Ok(next) = tokio::time::timeout(SETTLE, events.next()).await {
            let end = next.is_none();
            note(next);
            if end {
                break;
            }
        }
        if ready && dirty {
            let state: Vec<_> = stores.iter().flat_map(|s| s.state()).collect();
            let pools = pools_from_ippools(state.iter().map(|p| &**p), &interfaces);
            debug!(
                pools = pools.len(),
                "fallback state recomputed from IPPools"
            );
            sources.fallback(pools);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmdhcp_core::MacAddr;
    use vmdhcp_core::crd::{CONDITION_CACHE_READY, CONDITION_REGISTERED};
    use vmdhcp_core::fixtures::{
        pool_config, pool_on, readme_pool, with_allocated, with_conditions,
    };
    use vmdhcp_core::pool::Binding;

    /// The only lease of a pool (the tests' pools have one).
    fn only_lease(pool: &PoolLeases) -> &Binding {
        assert_eq!(pool.leases.len(), 1, "{pool:?}");
        pool.leases.values().next().unwrap()
    }

    /// The README pool renamed `default/<name>`, registered and ready, with `allocated`.
    fn ippool(name: &str, allocated: &[(&str, &str)], paused: bool) -> IPPool {
        let mut p = pool_on(&format!("default/{name}"), "default/net-48");
        p.spec.paused = Some(paused);
        let p = with_conditions(
            p,
            &[(CONDITION_REGISTERED, true), (CONDITION_CACHE_READY, true)],
        );
        with_allocated(p, allocated)
    }

    #[test]
    fn only_the_bootstrap_pools_reach_the_fallback_cache() {
        let wanted: BTreeSet<NamespacedName> = ["default/a".parse().unwrap()].into();
        let a = ippool("a", &[], false);
        let b = ippool("b", &[], false);
        for event in [
            watcher::Event::Apply(a.clone()),
            watcher::Event::InitApply(a.clone()),
            watcher::Event::Delete(a),
            watcher::Event::Init,
            watcher::Event::InitDone,
        ] {
            assert!(is_wanted(&wanted, &event), "{event:?}");
        }
        for event in [
            watcher::Event::Apply(b.clone()),
            watcher::Event::InitApply(b.clone()),
            watcher::Event::Delete(b),
        ] {
            assert!(!is_wanted(&wanted, &event), "{event:?}");
        }
    }

    fn refs(names: &[&str]) -> BTreeMap<NamespacedName, String> {
        names
            .iter()
            .map(|n| {
                (
                    NamespacedName::new("default", n).unwrap(),
                    format!("if-{n}"),
                )
            })
            .collect()
    }

    fn addr_of(table: &LeaseTable, pool: &str, mac: &str) -> Option<String> {
        let mac: MacAddr = mac.parse().unwrap();
        table
            .pool(&NamespacedName::new("default", pool).unwrap())
            .and_then(|p| p.address_of(&mac))
            .map(|ip| ip.to_string())
    }

    fn example_ip(n: u8) -> String {
        let p = readme_pool();
        let net: ipnet::Ipv4Net = p.spec.ipv4_config.cidr.parse().unwrap();
        let base = u32::from(net.network());
        std::net::Ipv4Addr::from(base + 81 + u32::from(n)).to_string()
    }

    #[test]
    fn only_referenced_served_pools_with_their_status_leases() {
        let ip = example_ip(1);
        let pools = [
            ippool("a", &[(ip.as_str(), "02:00:00:00:00:01")], false),
            ippool("b", &[(ip.as_str(), "02:00:00:00:00:02")], true),
            ippool("c", &[(ip.as_str(), "02:00:00:00:00:03")], false),
        ];
        let out = pools_from_ippools(&pools, &refs(&["a", "b"]));
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].config.pool.name, "a");
        assert_eq!(out[0].config.interface_name, "if-a");
        assert_eq!(out[0].leases.len(), 1);
        assert_eq!(only_lease(&out[0]).ip.to_string(), ip);
    }

    /// The bootstrap env carries addressing only (the JSON of upstream PR #64); an agent without
    /// its stream gets the pool's options from the IPPool it reads, as the stream would send
    /// them: MTU, routes, no default route, host names.
    #[test]
    fn without_the_stream_the_ippool_gives_the_options_the_stream_would() {
        let ip = example_ip(1);
        let mut pool = ippool("a", &[(ip.as_str(), "02:00:00:00:00:01")], false);
        pool.spec.ipv4_config.mtu = Some(1450);
        pool.spec.ipv4_config.routes = vec![vmdhcp_core::crd::StaticRoute {
            destination: "10.96.0.0/12".into(),
            gateway: pool.spec.ipv4_config.router.clone().unwrap_or_default(),
        }];
        pool.spec.ipv4_config.default_route = Some(false);
        pool.spec.ipv4_config.send_host_name = Some(true);
        if let Some(v4) = pool.status.as_mut().and_then(|s| s.ipv4.as_mut()) {
            v4.host_names.insert(ip.clone(), "vm-1".into());
        }
        let out = pools_from_ippools([&pool], &refs(&["a"]));
        assert_eq!(out.len(), 1, "{out:?}");
        let (config, lease) = (&out[0].config, only_lease(&out[0]));
        assert_eq!(config.mtu, Some(1450));
        assert_eq!(config.routes.len(), 1);
        assert_eq!(config.routes[0].destination.to_string(), "10.96.0.0/12");
        assert_eq!(
            config.router, None,
            "defaultRoute: false leaves the router out"
        );
        assert_eq!(lease.host_name.as_deref(), Some("vm-1"));
    }

    fn stream_state(pools: &[PoolLeases], revision: u64) -> AppliedState {
        AppliedState {
            epoch: "e".into(),
            revision,
            pools: pools
                .iter()
                .map(|p| (p.config.pool.clone(), p.clone()))
                .collect(),
        }
    }

    #[test]
    fn the_stream_wins_while_live_and_the_fallback_fills_in_when_it_is_not() {
        let (ip1, ip2) = (example_ip(1), example_ip(2));
        let table = Arc::new(LeaseTable::new());
        let sources = Sources::new(Arc::clone(&table), false);
        let view = sources.subscribe();
        assert!(!view.borrow().loaded);

        // Fallback first (agent restarted, controller down): served.
        let from_status = pools_from_ippools(
            &[ippool("a", &[(ip1.as_str(), "02:00:00:00:00:01")], false)],
            &refs(&["a"]),
        );
        sources.fallback(from_status.clone());
        assert_eq!(view.borrow().source, Source::IPPoolStatus);
        assert!(view.borrow().loaded);
        assert_eq!(addr_of(&table, "a", "02:00:00:00:00:01"), Some(ip1.clone()));

        // The stream's snapshot replaces it; a later fallback update does not.
        let mut streamed = from_status.clone();
        for binding in streamed[0].leases.values_mut() {
            binding.ip = ip2.parse().unwrap();
        }
        let applied = stream_state(&streamed, 5);
        ConfigSink::snapshot(&sources, &applied);
        assert_eq!(view.borrow().source, Source::Stream);
        assert_eq!(addr_of(&table, "a", "02:00:00:00:00:01"), Some(ip2.clone()));
        sources.fallback(from_status.clone());
        assert_eq!(addr_of(&table, "a", "02:00:00:00:00:01"), Some(ip2.clone()));

        // Stream lost: the last fallback state is served.
        sources.stream_lost();
        assert_eq!(view.borrow().source, Source::IPPoolStatus);
        assert_eq!(addr_of(&table, "a", "02:00:00:00:00:01"), Some(ip1.clone()));

        // Resumed by a heartbeat: the stream's whole state comes back.
        sources.resumed(&applied);
        assert_eq!(view.borrow().source, Source::Stream);
        assert_eq!(addr_of(&table, "a", "02:00:00:00:00:01"), Some(ip2.clone()));

        // Resumed by a delta: again the whole state, not the delta on top of the fallback.
        sources.stream_lost();
        let delta = PoolDelta {
            revision: 6,
            ..PoolDelta::default()
        };
        sources.delta(&delta, &stream_state(&streamed, 6));
        assert_eq!(view.borrow().source, Source::Stream);
        assert_eq!(addr_of(&table, "a", "02:00:00:00:00:01"), Some(ip2));
    }

    #[test]
    fn losing_the_stream_without_a_fallback_keeps_the_stream_state() {
        let table = Arc::new(LeaseTable::new());
        let sources = Sources::new(Arc::clone(&table), false);
        let ip = example_ip(3);
        let pools = pools_from_ippools(
            &[ippool("a", &[(ip.as_str(), "02:00:00:00:00:01")], false)],
            &refs(&["a"]),
        );
        ConfigSink::snapshot(&sources, &stream_state(&pools, 1));
        sources.stream_lost();
        assert_eq!(sources.subscribe().borrow().source, Source::Stream);
        assert_eq!(addr_of(&table, "a", "02:00:00:00:00:01"), Some(ip));
    }

    #[test]
    fn the_config_stream_feeds_the_table() {
        let name = |pool: &str| NamespacedName::new("default", pool).unwrap();
        let mac = |last: u8| MacAddr([0x02, 0, 0, 0, 0, last]);
        let lease = |pool: &str, m: u8, ip: &str| vmdhcp_core::pool::Lease {
            options: None,
            ipv6: None,
            pool: name(pool),
            mac: mac(m),
            ip: ip.parse().unwrap(),
            host_name: None,
        };
        let table = Arc::new(LeaseTable::new());
        let sources = Sources::new(Arc::clone(&table), false);
        let cfg = pool_config("default/a");
        let mut state = AppliedState::default();
        state.pools.insert(
            name("a"),
            PoolLeases {
                config: cfg.clone(),
                leases: [(mac(1), Binding::ip("192.0.2.10".parse().unwrap()))].into(),
            },
        );
        ConfigSink::snapshot(&sources, &state);
        let a = table.pool(&name("a")).unwrap();
        assert_eq!(a.address_of(&mac(1)), Some("192.0.2.10".parse().unwrap()));
        // An address moves from MAC 1 to MAC 2, and the DNS changes, in one delta. (The sink
        // applies the delta itself while the stream is live; the state beside it is not read.)
        let mut changed = cfg.clone();
        changed.dns = vec!["192.0.2.53".parse().unwrap()];
        sources.delta(
            &PoolDelta {
                base_revision: 1,
                revision: 2,
                upserted_pools: vec![changed.clone()],
                removed_pools: vec![],
                upserted_leases: vec![lease("a", 2, "192.0.2.10")],
                removed_leases: vec![(name("a"), mac(1))],
            },
            &state,
        );
        let a = table.pool(&name("a")).unwrap();
        assert_eq!(a.holder_of(&"192.0.2.10".parse().unwrap()), Some(mac(2)));
        assert_eq!(a.address_of(&mac(1)), None);
        assert_eq!(**a.config(), changed);
        sources.delta(
            &PoolDelta {
                removed_pools: vec![name("a")],
                ..PoolDelta::default()
            },
            &state,
        );
        assert!(table.pool(&name("a")).is_none());
    }
}
