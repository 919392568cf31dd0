//! What this agent's probes found that the controller must hear of: addresses another host
//! uses, and addresses the controller records as conflicted that a later probe found free. IPv4
//! addresses are probed with ARP ([`crate::dhcp::probe`]), the IPv6 addresses of a dual-stack pool
//! with duplicate-address-detection Neighbor Solicitations ([`crate::dhcp6::server`]).
//!
//! The agent only withholds an address for a short, bounded time on its own; what lasts is
//! decided by the controller, which records each conflict in its IPPool's
//! `status.ipv4.conflicts` or `status.ipv6.conflicts`, moves a dynamically allocated VM to
//! another address, and streams the recorded addresses back to every agent
//! ([`PoolConfig::conflicted`], [`vmdhcp_core::pool::PoolConfigV6::conflicted`]). The serving
//! agent withholds those ([`Findings::withheld`], [`Findings::withheld6`]) and probes them again
//! every [`RECHECK`]; a probe nobody else answers is reported, and the controller clears the
//! conflict.
//!
//! So the report carries, per pool, the latest verdict on each address found (not a log): the
//! last one wins. Bounded whatever the network does: at most [`MAX_PER_POOL`] addresses per
//! pool, both families counted together (the oldest verdict goes first, whatever its family),
//! each forgotten after [`TTL`], and those of pools no longer served dropped with them.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use vmdhcp_core::pool::PoolConfig;
use vmdhcp_core::{MacAddr, NamespacedName};

/// Most addresses with a verdict kept per pool, IPv4 and IPv6 together.
pub const MAX_PER_POOL: usize = 64;
/// How long a verdict is kept (and reported) after the probe that made it.
pub const TTL: Duration = Duration::from_secs(600);
/// How often the serving agent probes the addresses the controller records as conflicted.
pub const RECHECK: Duration = Duration::from_secs(30);

/// Why an address was probed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Before its first offer to a client (IPv4 only: DHCPv6 gives a reservation unprobed).
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
    /// Another host that answered for the address (an ARP reply, or a Neighbor Advertisement);
    /// `None`: nobody but its client did.
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

/// Both families in one map per pool, so that [`MAX_PER_POOL`] bounds them together.
type ByPool = HashMap<NamespacedName, BTreeMap<IpAddr, Finding>>;

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
    /// Records the latest verdict on `ip` (of either family) of `pool`, replacing an earlier
    /// one; a pool at [`MAX_PER_POOL`] forgets its oldest verdict first, whatever its family.
    pub fn record(&self, pool: &NamespacedName, ip: impl Into<IpAddr>, finding: Finding) {
        let ip = ip.into();
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

    /// The live verdicts on `pool`'s addresses, in address order (IPv4 before IPv6).
    pub fn of(&self, pool: &NamespacedName) -> Vec<(IpAddr, Finding)> {
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
    /// on it (`status.ipv4.conflicts`) and no probe has found it free since.
    pub fn withheld(&self, config: &PoolConfig, ip: Ipv4Addr) -> bool {
        config.conflicted.contains(&ip) && !self.found_free(&config.pool, ip.into())
    }

    /// Whether the IPv6 address `ip` must not be given on `config`'s pool: the controller
    /// records a conflict on it (`status.ipv6.conflicts`) and no probe has found it free since.
    /// A pool without an IPv6 side withholds nothing.
    pub fn withheld6(&self, config: &PoolConfig, ip: Ipv6Addr) -> bool {
        config
            .ipv6
            .as_ref()
            .is_some_and(|v6| v6.conflicted.contains(&ip))
            && !self.found_free(&config.pool, ip.into())
    }

    /// Whether the latest live verdict on `ip` of `pool` is a recheck nobody else answered:
    /// the address is free until the controller, told so, stops recording the conflict.
    fn found_free(&self, pool: &NamespacedName, ip: IpAddr) -> bool {
        self.by_pool
            .lock()
            .get(pool)
            .and_then(|e| e.get(&ip))
            .is_some_and(|f| f.live() && f.reason == Reason::Recheck && f.answered_by.is_none())
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

    fn ip6(n: u16) -> Ipv6Addr {
        Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, n)
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
        assert_eq!(
            findings.of(&pool),
            [(ip(10).into(), findings.of(&pool)[0].1)]
        );
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
        assert!(kept.iter().all(|(a, _)| match a {
            IpAddr::V4(a) => a.octets()[3] >= 200 - MAX_PER_POOL as u8,
            IpAddr::V6(_) => false,
        }));
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

    #[test]
    fn both_families_are_kept_side_by_side_and_bounded_together() {
        let findings = Findings::default();
        let pool = pool_config("default/a").pool;
        // The same host part in both families: two addresses, two verdicts, IPv4 first.
        findings.record(&pool, ip(10), Finding::free(Some(VM)));
        findings.record(
            &pool,
            ip6(10),
            Finding::conflict(Some(VM), SQUATTER, Reason::Decline),
        );
        let both = findings.of(&pool);
        assert_eq!(
            both.iter().map(|(a, _)| *a).collect::<Vec<_>>(),
            [IpAddr::from(ip(10)), IpAddr::from(ip6(10))]
        );
        assert_eq!(both[0].1.answered_by, None);
        assert_eq!(both[1].1.answered_by, Some(SQUATTER));

        // Verdicts of both families, interleaved, each stamped later than the one before (set
        // here, so the order does not hang on the clock's resolution): one bound for both, and
        // the oldest go first whatever their family.
        let base = Instant::now();
        let stamped = |n: u64| Finding {
            at: base + Duration::from_millis(n),
            ..Finding::conflict(None, SQUATTER, Reason::Recheck)
        };
        for n in 0..100u16 {
            let finding = stamped(u64::from(n));
            if n % 2 == 0 {
                findings.record(&pool, ip(100 + (n / 2) as u8), finding);
            } else {
                findings.record(&pool, ip6(100 + n / 2), finding);
            }
        }
        let kept = findings.of(&pool);
        assert_eq!(kept.len(), MAX_PER_POOL);
        let oldest_kept = base + Duration::from_millis(100 - MAX_PER_POOL as u64);
        assert!(kept.iter().all(|(_, f)| f.at >= oldest_kept));
        let v6 = kept.iter().filter(|(a, _)| a.is_ipv6()).count();
        assert_eq!(
            (MAX_PER_POOL - v6, v6),
            (MAX_PER_POOL / 2, MAX_PER_POOL / 2)
        );
    }

    #[test]
    fn a_recorded_ipv6_conflict_is_withheld_until_a_recheck_finds_it_free() {
        let findings = Findings::default();
        let single = pool_config("default/a");
        assert!(!findings.withheld6(&single, ip6(10)), "no IPv6 side");
        let mut config = pool_config("default/a").with_ipv6(vec![]);
        assert!(!findings.withheld6(&config, ip6(10)), "nothing recorded");
        config.ipv6.as_mut().unwrap().conflicted = vec![ip6(10)];
        config.conflicted = vec![ip(10)];
        assert!(findings.withheld6(&config, ip6(10)));
        assert!(!findings.withheld6(&config, ip6(11)));
        // Another host answering a recheck keeps it withheld; nobody answering frees it before
        // the controller's update arrives; a later conflict withholds it again.
        findings.record(
            &config.pool,
            ip6(10),
            Finding::conflict(None, SQUATTER, Reason::Recheck),
        );
        assert!(findings.withheld6(&config, ip6(10)));
        findings.record(&config.pool, ip6(10), Finding::free(Some(VM)));
        assert!(!findings.withheld6(&config, ip6(10)));
        // The families do not mix: the IPv4 conflict stands, and an IPv4 verdict frees no IPv6
        // address.
        assert!(findings.withheld(&config, ip(10)));
        findings.record(
            &config.pool,
            ip6(10),
            Finding::conflict(Some(VM), SQUATTER, Reason::Decline),
        );
        assert!(findings.withheld6(&config, ip6(10)));
        findings.record(&config.pool, ip(10), Finding::free(None));
        assert!(!findings.withheld(&config, ip(10)));
        assert!(findings.withheld6(&config, ip6(10)));
        // Another pool's verdict frees nothing here.
        let other = pool_config("default/b").with_ipv6(vec![ip6(10)]);
        findings.record(&other.pool, ip6(10), Finding::free(None));
        assert!(findings.withheld6(&config, ip6(10)));
        assert!(!findings.withheld6(&other, ip6(10)));
    }
}
