//! Addresses a pool's books hold for MACs no live config names: released after a grace period.
//!
//! An address is normally given back by the config holding it (its cleanup, a NIC dropped, a
//! pause), from its status and from the MAC claims this term made. Neither covers an address whose
//! config's status write failed after the pool's succeeded and that went while another replica
//! led (the claim was in that replica's memory): nothing would ever name the entry again, and
//! the address would be lost to the pool. The pool's reconcile sweeps such entries once they
//! have been unnamed for the grace period, which outlasts any config's way through the caches.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;

use kube::runtime::events::EventType;
use parking_lot::Mutex;
use tokio::time::Instant;
use tracing::warn;
use vmdhcp_core::crd::IPPool;
use vmdhcp_core::{MacAddr, NamespacedName};

use crate::ipam::IpamError;
use crate::kinds::store_key;
use crate::reconcile::context::Context;

/// How long an entry stays unnamed before it is released, unless the command line says
/// otherwise: far longer than a config takes from its creation to its first status write, or
/// a cache to catch up after a failover.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(600);

/// Since when each (pool, MAC) entry has been seen unnamed. Bounded by the entries the books
/// hold: an entry named again, released or on a forgotten pool is dropped.
#[derive(Debug)]
pub struct Orphans {
    grace: Duration,
    since: Mutex<HashMap<(NamespacedName, MacAddr), Instant>>,
}

/// What one sweep of a pool found.
#[derive(Debug, PartialEq, Eq)]
pub struct Sweep {
    /// The MACs unnamed for the grace period: their addresses go.
    pub due: Vec<MacAddr>,
    /// How soon the next unnamed entry is due, if any is waiting.
    pub next: Option<Duration>,
}

impl Orphans {
    /// Entries are released once unnamed for `grace`.
    pub fn new(grace: Duration) -> Self {
        Orphans {
            grace,
            since: Mutex::default(),
        }
    }

    /// Takes the MACs `pool`'s books hold that nothing names now (`unnamed`, as of `now`):
    /// returns those unnamed for the grace period, and forgets every other MAC of the pool that
    /// is named again.
    pub fn sweep(&self, pool: &NamespacedName, unnamed: &BTreeSet<MacAddr>, now: Instant) -> Sweep {
        let mut since = self.since.lock();
        since.retain(|(p, mac), _| p != pool || unnamed.contains(mac));
        let (mut due, mut next) = (Vec::new(), None::<Duration>);
        for mac in unnamed {
            let key = (pool.clone(), *mac);
            let age = now.saturating_duration_since(*since.entry(key.clone()).or_insert(now));
            if age >= self.grace {
                since.remove(&key);
                due.push(*mac);
            } else {
                let left = self.grace - age;
                next = Some(next.map_or(left, |n| n.min(left)));
            }
        }
        Sweep { due, next }
    }

    /// Forgets a pool (deleted, paused or refused: its books are gone).
    pub fn forget_pool(&self, pool: &NamespacedName) {
        self.since.lock().retain(|(p, _), _| p != pool);
    }
}

/// Sweeps `pool`'s books (it serves `network`): releases the entries unnamed for the grace period
/// (the caller's status write records it) and returns how soon to look again.
pub fn release_unnamed(
    ctx: &Context,
    pool: &IPPool,
    pool_ref: &NamespacedName,
    network: &NamespacedName,
) -> Result<Option<Duration>, IpamError> {
    let held: Vec<MacAddr> = ctx.books.ipam.with_books(pool_ref, |b| {
        let v6 = b.v6.iter().flat_map(|a| a.leases().map(|(_, mac)| mac));
        b.v4.leases().map(|(_, mac)| mac).chain(v6).collect()
    })?;
    let index = &ctx.stores.config_index;
    let mut unnamed: BTreeSet<MacAddr> = held
        .into_iter()
        .filter(|mac| {
            ctx.books.mac_owners.owner(pool_ref, *mac).is_none()
                && !index.claimed_by_any(network, *mac)
        })
        .collect();
    if !unnamed.is_empty() {
        // Rare: looked up in the configs on the network only when some entry is unnamed so far.
        let named = spec_macs(ctx, network);
        unnamed.retain(|mac| !named.contains(mac));
    }
    let sweep = ctx.books.orphans.sweep(pool_ref, &unnamed, Instant::now());
    for mac in &sweep.due {
        let released = ctx.books.ipam.with_books(pool_ref, |b| {
            let v6 = b.v6.as_mut().and_then(|a| a.release_mac(mac));
            (b.v4.release_mac(mac), v6)
        })?;
        let addresses: Vec<String> = released
            .0
            .map(|ip| ip.to_string())
            .into_iter()
            .chain(released.1.map(|ip| ip.to_string()))
            .collect();
        let pool_key = pool_ref.to_string();
        ctx.signals.metrics.allocation(&pool_key, "released");
        let message = format!(
            "{} released from {mac}: no VirtualMachineNetworkConfig named it for {} s",
            addresses.join(", "),
            ctx.books.orphans.grace.as_secs()
        );
        warn!(pool = %pool_ref, %mac, addresses = %addresses.join(","), "address no config names released");
        ctx.event(
            pool,
            EventType::Warning,
            "UnnamedReleased",
            "Release",
            message,
        );
    }
    Ok(sweep.next)
}

/// The MACs the specs of the configs on `network` name there.
fn spec_macs(ctx: &Context, network: &NamespacedName) -> HashSet<MacAddr> {
    let mut macs = HashSet::new();
    for key in ctx.stores.config_index.on_network(network) {
        let Some(cfg) = ctx.stores.vmnetcfgs.get(&store_key(&key)) else {
            continue;
        };
        macs.extend(cfg.spec.network_configs.iter().filter_map(|nc| {
            let on = NamespacedName::parse_in(&nc.network_name, &key.namespace).ok()?;
            if on != *network {
                return None;
            }
            nc.mac_address.parse::<MacAddr>().ok()
        }));
    }
    macs
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const B: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);

    fn pool() -> NamespacedName {
        "ns/p".parse().unwrap()
    }

    #[test]
    fn an_entry_goes_only_after_the_grace_period_unnamed_throughout() {
        let orphans = Orphans::new(Duration::from_secs(60));
        let t0 = Instant::now();
        let both = BTreeSet::from([A, B]);
        assert_eq!(
            orphans.sweep(&pool(), &both, t0),
            Sweep {
                due: vec![],
                next: Some(Duration::from_secs(60))
            }
        );
        // B is named again at +30 s: its clock starts over when it is unnamed next.
        let t30 = t0 + Duration::from_secs(30);
        let sweep = orphans.sweep(&pool(), &BTreeSet::from([A]), t30);
        assert_eq!(sweep.next, Some(Duration::from_secs(30)));
        let t45 = t0 + Duration::from_secs(45);
        assert_eq!(
            orphans.sweep(&pool(), &both, t45).next,
            Some(Duration::from_secs(15))
        );
        let t60 = t0 + Duration::from_secs(60);
        assert_eq!(
            orphans.sweep(&pool(), &both, t60),
            Sweep {
                due: vec![A],
                next: Some(Duration::from_secs(45))
            }
        );
        // Released: nothing is kept for A.
        assert_eq!(orphans.since.lock().len(), 1);
        orphans.forget_pool(&pool());
        assert!(orphans.since.lock().is_empty());
    }

    #[test]
    fn pools_are_swept_apart() {
        let orphans = Orphans::new(Duration::ZERO);
        let other: NamespacedName = "ns/q".parse().unwrap();
        let now = Instant::now();
        assert!(orphans.sweep(&other, &BTreeSet::from([A]), now).due == [A]);
        orphans.sweep(&other, &BTreeSet::new(), now);
        orphans.sweep(&pool(), &BTreeSet::new(), now);
        assert!(orphans.since.lock().is_empty());
    }
}
