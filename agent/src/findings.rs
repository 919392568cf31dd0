//! What this agent's ARP probes found that the controller must hear of: addresses another host
//! uses, and addresses the controller records as conflicted that a later probe found free.
//!
//! The agent only withholds an address for a short, bounded time on its own
//! ([`crate::dhcp::probe`]); what lasts is decided by the controller, which records each conflict
//! in its IPPool's `status.ipv4.conflicts`, moves a dynamically allocated VM to another address,
//! and streams the recorded addresses back to every agent ([`PoolConfig::conflicted`]). The
//! serving agent withholds those and probes them again every [`RECHECK`]; a probe nobody else
//! answers is reported, and the controller clears the conflict.
//!
//! So the report carries, per pool, the latest verdict on each address found (not a log): the
//! last one wins. Bounded whatever the network does: at most [`MAX_PER_POOL`] addresses per pool
//! (the oldest verdict goes first), each forgotten after [`TTL`], and those of pools no longer
//! served dropped with them.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use vmdhcp_core::pool::PoolConfig;
use vmdhcp_core::{MacAddr, NamespacedName};

/// Most addresses with a verdict kept per pool.
pub const MAX_PER_POOL: usize = 64;
/// How long a verdict is kept (and reported) after the probe that made it.
pub const TTL: Duration = Duration::from_secs(600);
/// How often the serving agent probes the addresses the controller records as conflicted.
pub const RECHECK: Duration = Duration::from_secs(30);

/// Why an address was probed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Before its first offer to a client.
    Offer,
    /// A client declined it.
    Decline,
    /// The controller records a conflict on it.
    Recheck,
}

/// The latest verdict on one address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Finding {
    /// The client the address is reserved for, when it has one.
    pub mac: Option<MacAddr>,
    /// Another host that answered for the address; `None`: nobody but its client did.
    pub answered_by: Option<MacAddr>,
    /// Why it was probed.
    pub reason: Reason,
    /// When.
    pub at: Instant,
}

impl Finding {
    /// Another host uses the address.
    pub fn conflict(mac: Option<MacAddr>, answered_by: MacAddr, reason: Reason) -> Self {
        Finding {
            mac,
            answered_by: Some(answered_by),
            reason,
            at: Instant::now(),
        }
    }

    /// A recorded conflict's address was probed and nobody else answered.
    pub fn free(mac: Option<MacAddr>) -> Self {
        Finding {
            mac,
            answered_by: None,
            reason: Reason::Recheck,
            at: Instant::now(),
        }
    }

    fn live(&self) -> bool {
        self.at.elapsed() < TTL
    }
}

type ByPool = HashMap<NamespacedName, BTreeMap<Ipv4Addr, Finding>>;

/// The verdicts, per pool; writers bump a generation the report follows.
#[derive(Debug)]
pub struct Findings {
    by_pool: Mutex<ByPool>,
    changed: watch::Sender<u64>,
}

impl Default for Findings {
    fn default() -> Self {
        Findings {
            by_pool: Mutex::default(),
            changed: watch::Sender::new(0),
        }
    }
}

impl Findings {
    /// Records the latest verdict on `ip` of `pool`, replacing an earlier one; a pool at
    /// [`MAX_PER_POOL`] forgets its oldest verdict first.
    pub fn record(&self, pool: &NamespacedName, ip: Ipv4Addr, finding: Finding) {
        {
            let mut all = self.by_pool.lock();
            let entries = all.entry(pool.clone()).or_default();
            entries.retain(|_, f| f.live());
            if !entries.contains_key(&ip) && entries.len() >= MAX_PER_POOL {
                let oldest = entries.iter().min_by_key(|(_, f)| f.at).map(|(ip, _)| *ip);
                if let Some(oldest) = oldest {
                    entries.remove(&oldest);
                }
            }
            entries.insert(ip, finding);
        }
        self.changed.send_modify(|g| *g = g.wrapping_add(1));
    }

    /// The live verdicts on `pool`'s addresses, in address order.
    pub fn of(&self, pool: &NamespacedName) -> Vec<(Ipv4Addr, Finding)> {
        self.by_pool
            .lock()
            .get(pool)
            .map(|e| {
                e.iter()
                    .filter(|(_, f)| f.live())
                    .map(|(ip, f)| (*ip, *f))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether `ip` must not be offered on `config`'s pool: the controller records a conflict
    /// on it and no probe has found it free since.
    pub fn withheld(&self, config: &PoolConfig, ip: Ipv4Addr) -> bool {
        if !config.conflicted.contains(&ip) {
            return false;
        }
        let found_free = self
            .by_pool
            .lock()
            .get(&config.pool)
            .and_then(|e| e.get(&ip))
            .is_some_and(|f| f.live() && f.reason == Reason::Recheck && f.answered_by.is_none());
        !found_free
    }

    /// Forgets the verdicts of pools `keep` rejects (no longer served).
    pub fn retain_pools(&self, keep: impl Fn(&NamespacedName) -> bool) {
        let removed = {
            let mut all = self.by_pool.lock();
            let before = all.len();
            all.retain(|pool, _| keep(pool));
            all.len() != before
        };
        if removed {
            self.changed.send_modify(|g| *g = g.wrapping_add(1));
        }
    }

    /// Changes whenever a verdict is recorded or forgotten.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmdhcp_core::fixtures::pool_config;

    const VM: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const SQUATTER: MacAddr = MacAddr([2, 0, 0, 0, 0, 9]);

    fn ip(n: u8) -> Ipv4Addr {
        Ipv4Addr::new(192, 0, 2, n)
    }

    #[test]
    fn the_latest_verdict_per_address_wins_and_a_pool_keeps_at_most_its_bound() {
        let findings = Findings::default();
        let pool = pool_config("default/a").pool;
        let mut changes = findings.subscribe();
        findings.record(
            &pool,
            ip(10),
            Finding::conflict(Some(VM), SQUATTER, Reason::Offer),
        );
        assert!(changes.has_changed().unwrap());
        changes.mark_unchanged();
        findings.record(&pool, ip(10), Finding::free(Some(VM)));
        assert!(changes.has_changed().unwrap());
        assert_eq!(findings.of(&pool), [(ip(10), findings.of(&pool)[0].1)]);
        assert_eq!(findings.of(&pool)[0].1.answered_by, None);

        for n in 0..200u8 {
            findings.record(
                &pool,
                ip(n),
                Finding::conflict(None, SQUATTER, Reason::Offer),
            );
        }
        let kept = findings.of(&pool);
        assert_eq!(kept.len(), MAX_PER_POOL);
        // The newest verdicts stay.
        assert!(
            kept.iter()
                .all(|(a, _)| a.octets()[3] >= 200 - MAX_PER_POOL as u8)
        );
    }

    #[test]
    fn a_recorded_conflict_is_withheld_until_a_recheck_finds_it_free() {
        let findings = Findings::default();
        let mut config = pool_config("default/a");
        assert!(!findings.withheld(&config, ip(10)), "nothing recorded");
        config.conflicted = vec![ip(10)];
        assert!(findings.withheld(&config, ip(10)));
        assert!(!findings.withheld(&config, ip(11)));
        // An offer probe finding someone else keeps it withheld; a recheck nobody answers frees
        // it before the controller's update arrives; a later conflict withholds it again.
        findings.record(
            &config.pool,
            ip(10),
            Finding::conflict(None, SQUATTER, Reason::Recheck),
        );
        assert!(findings.withheld(&config, ip(10)));
        findings.record(&config.pool, ip(10), Finding::free(None));
        assert!(!findings.withheld(&config, ip(10)));
        findings.record(
            &config.pool,
            ip(10),
            Finding::conflict(Some(VM), SQUATTER, Reason::Decline),
        );
        assert!(findings.withheld(&config, ip(10)));
    }

    #[test]
    fn pools_no_longer_served_lose_their_verdicts() {
        let findings = Findings::default();
        let (a, b) = (pool_config("default/a").pool, pool_config("default/b").pool);
        findings.record(&a, ip(1), Finding::free(None));
        findings.record(&b, ip(1), Finding::free(None));
        findings.retain_pools(|p| *p == a);
        assert_eq!(findings.of(&a).len(), 1);
        assert!(findings.of(&b).is_empty());
    }
}
