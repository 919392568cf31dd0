//! Addresses a pool's books hold for MACs no live config names: released after a grace period.
//!
//! An address is normally given back by the config holding it (its cleanup, a NIC dropped, a
//! pause), from its status and from the MAC claims this term made. Neither covers an address whose
//! config's status write failed after the pool's succeeded and that went while another replica
//! led (the claim was in that replica's memory): nothing would ever name the entry again, and
//! the address would be lost to the pool. The pool's reconcile sweeps such entries once they
//! have been unnamed for the grace period, which outlasts any config's way through the caches
//! (`ippool::unnamed` asks who names what; this module keeps the time each entry went unnamed).

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;
use vmdhcp_core::{MacAddr, NamespacedName};

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

    /// How long an entry stays unnamed before it goes.
    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// Forgets a pool (deleted, paused or refused: its books are gone).
    pub fn forget_pool(&self, pool: &NamespacedName) {
        self.since.lock().retain(|(p, _), _| p != pool);
    }
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
