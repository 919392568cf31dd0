//! What each NIC of a config gets, decided without writing anything: the address on the pool's
//! allocator, and the plan for every NIC of the spec and every NIC gone from it.

use super::*;

/// The address a NIC gets, as a pure decision on the pool's allocator:
/// held address (unless a different static one is requested, or another host was found using
/// it and the NIC is dynamic) → requested → previously recorded → lowest free. A refused static
/// request leaves the held address in place; a static address in conflict stays (the reconciler
/// says why it is not `Allocated`).
///
/// The same decision for either family: a dual-stack NIC's IPv6 address is decided by it too,
/// on the pool's IPv6 books, once its IPv4 address is.
///
/// `avoid` names the addresses other NICs ask for as their static address: neither the lowest
/// free nor a restored one is ever one of them, so a static request admitted by the webhook is
/// not taken by a dynamic NIC that happens to reconcile first.
pub fn allocate_nic<A: Family>(
    alloc: &mut PoolAllocator<A>,
    mac: MacAddr,
    requested: Option<A>,
    previous: Option<A>,
    avoid: &dyn Fn(IpAddr) -> bool,
) -> Result<A, IpamError> {
    let avoid = |ip: A| avoid(ip.into());
    match (alloc.lookup(&mac), requested) {
        (Some(held), None) if alloc.conflict(held).is_some() => {
            // Another host answers for it: a dynamic NIC moves (the address stays blocked).
            alloc.release(held)?;
            alloc.allocate_avoiding(mac, &avoid)
        }
        (Some(held), Some(want)) if held != want => {
            alloc.release(held)?;
            match alloc.allocate_requested(mac, want) {
                Ok(ip) => Ok(ip),
                Err(e) => {
                    alloc.allocate_requested(mac, held)?;
                    Err(e)
                }
            }
        }
        (Some(held), _) => Ok(held),
        (None, Some(want)) => alloc.allocate_requested(mac, want),
        (None, None) => match previous.filter(|p| !avoid(*p)) {
            Some(prev) => alloc
                .allocate_requested(mac, prev)
                .or_else(|_| alloc.allocate_avoiding(mac, &avoid)),
            None => alloc.allocate_avoiding(mac, &avoid),
        },
    }
}

/// The IPv6 address `previous6` records for `mac` on `network`.
pub(super) fn recorded_v6(
    previous6: &[Recorded6],
    network: &NamespacedName,
    mac: MacAddr,
) -> Option<Ipv6Addr> {
    previous6
        .iter()
        .find(|(n, m, _)| n == network && *m == mac)
        .map(|(_, _, ip)| *ip)
}

/// What a NIC asks for on a dual-stack pool's IPv6 side: its static `ipv6Address`, and the
/// address its status recorded (restored when free, as for IPv4).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct V6Want {
    pub(super) requested: Option<Ipv6Addr>,
    pub(super) previous: Option<Ipv6Addr>,
}

/// What [`plan_nic`] needs to know about the cluster, asked only when the decision gets there.
pub(super) trait NicFacts {
    /// The pool serving `network`, if any.
    fn pool_serving(&self, network: &NamespacedName) -> Option<NamespacedName>;
    /// Whether this term's IPAM holds the pool (its reconcile rebuilt it from status).
    fn pool_ready(&self, pool: &NamespacedName) -> bool;
    /// Whether the pool is paused (`spec.paused`).
    fn pool_paused(&self, pool: &NamespacedName) -> bool;
    /// Another config whose status holds `mac` on `network`.
    fn claimed_elsewhere(&self, network: &NamespacedName, mac: MacAddr) -> Option<NamespacedName>;
    /// What an AddressClaim says of `mac` on `network` served by `pool`.
    fn claim(&self, pool: &NamespacedName, network: &NamespacedName, mac: MacAddr) -> ClaimFact;
}

/// What an AddressClaim says of one NIC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ClaimFact {
    /// No claim binds it: allocated as any NIC.
    None,
    /// The NIC's MAC holds a claim's addresses: it keeps them, whatever else it asks.
    Holds {
        ip: Option<Ipv4Addr>,
        ipv6: Option<Ipv6Addr>,
    },
    /// A claim binds it and has not moved its addresses to it yet: it waits (its reconcile
    /// wakes the config) rather than take a dynamic address it would give back.
    Waits(NamespacedName),
}

/// The reconciler's caches as [`NicFacts`], for the config `me`.
pub(super) struct CacheFacts<'a> {
    pub(super) ctx: &'a Context,
    pub(super) me: &'a NamespacedName,
}

impl NicFacts for CacheFacts<'_> {
    fn pool_serving(&self, network: &NamespacedName) -> Option<NamespacedName> {
        self.ctx
            .pool_for_network(network)
            .and_then(|p| object_ref(p.as_ref()))
    }

    fn pool_ready(&self, pool: &NamespacedName) -> bool {
        self.ctx.books.ipam.contains(pool)
    }

    fn pool_paused(&self, pool: &NamespacedName) -> bool {
        self.ctx
            .stores
            .pools
            .get(&store_key::<IPPool>(pool))
            .is_some_and(|p| p.spec.paused == Some(true))
    }

    fn claimed_elsewhere(&self, network: &NamespacedName, mac: MacAddr) -> Option<NamespacedName> {
        self.ctx
            .stores
            .config_index
            .claimed_elsewhere(network, mac, self.me)
    }

    fn claim(&self, pool: &NamespacedName, network: &NamespacedName, mac: MacAddr) -> ClaimFact {
        use crate::reconcile::claim::{claim_holding, claim_waiting_for};
        if claim_holding(self.ctx, pool, mac).is_some() {
            let held = self.ctx.books.ipam.with_books(pool, |b| {
                (
                    b.v4.lookup(&mac),
                    b.v6.as_ref().and_then(|a| a.lookup(&mac)),
                )
            });
            if let Ok((ip, ipv6)) = held {
                return ClaimFact::Holds { ip, ipv6 };
            }
        }
        match claim_waiting_for(self.ctx, &self.me.namespace, &self.me.name, network, mac) {
            Some(claim) => ClaimFact::Waits(claim),
            None => ClaimFact::None,
        }
    }
}

/// What to do with one NIC of the spec.
#[derive(Debug, PartialEq)]
pub(super) enum NicPlan {
    /// Its network or MAC does not parse: a problem, no status entry.
    Invalid(String),
    /// No address now: a `Pending` entry (with the address recorded before, if any) and a
    /// problem; `waiting` when a pool may come or get ready soon.
    Pending {
        network: NamespacedName,
        mac: MacAddr,
        ip: Option<Ipv4Addr>,
        ipv6: Option<Ipv6Addr>,
        problem: String,
        waiting: bool,
    },
    /// Another config's status holds the MAC on this network: refused, with an event.
    MacInUse {
        network: NamespacedName,
        mac: MacAddr,
        other: NamespacedName,
    },
    /// Its pool is paused: the addresses its status records stay as recorded (a paused pool
    /// keeps its allocations, and has no IPAM to ask).
    Held {
        network: NamespacedName,
        mac: MacAddr,
        ip: Ipv4Addr,
        ipv6: Option<Ipv6Addr>,
    },
    /// Give it an address on `pool` ([`allocate_nic`]: keep, honour the static request or
    /// refuse it, restore the recorded one, or the lowest free).
    Allocate {
        network: NamespacedName,
        mac: MacAddr,
        pool: NamespacedName,
        requested: Option<Ipv4Addr>,
        previous: Option<Ipv4Addr>,
        v6: V6Want,
    },
}

impl NicPlan {
    /// The (network, MAC) the spec asks for, when it could be read.
    pub(super) fn nic(&self) -> Option<(NamespacedName, MacAddr)> {
        match self {
            NicPlan::Invalid(_) => None,
            NicPlan::Held { network, mac, .. }
            | NicPlan::Pending { network, mac, .. }
            | NicPlan::MacInUse { network, mac, .. }
            | NicPlan::Allocate { network, mac, .. } => Some((network.clone(), *mac)),
        }
    }
}

/// Decides, without writing anything, what one NIC of the spec gets.
pub(super) fn plan_nic(
    nc: &NetworkConfig,
    namespace: &str,
    (previous, previous6): (&[Recorded], &[Recorded6]),
    facts: &impl NicFacts,
) -> NicPlan {
    let network = match NamespacedName::parse_in(&nc.network_name, namespace) {
        Ok(n) => n,
        Err(e) => return NicPlan::Invalid(format!("networkName {:?}: {e}", nc.network_name)),
    };
    let mac: MacAddr = match nc.mac_address.parse() {
        Ok(m) => m,
        Err(e) => return NicPlan::Invalid(format!("{network}: {e}")),
    };
    let prev6 = recorded_v6(previous6, &network, mac);
    let pending = |ip, problem, waiting| NicPlan::Pending {
        network: network.clone(),
        mac,
        ip,
        ipv6: prev6,
        problem,
        waiting,
    };
    let requested = match nc
        .ip_address
        .as_deref()
        .filter(|s| !s.is_empty())
        .map(str::parse::<Ipv4Addr>)
    {
        None => None,
        Some(Ok(ip)) => Some(ip),
        Some(Err(_)) => {
            let problem = format!(
                "{network} {mac}: ipAddress {:?} is not an IPv4 address",
                nc.ip_address.as_deref().unwrap_or_default()
            );
            return pending(None, problem, false);
        }
    };
    let requested6 = match nc
        .ipv6_address
        .as_deref()
        .filter(|s| !s.is_empty())
        .map(str::parse::<Ipv6Addr>)
    {
        None => None,
        Some(Ok(ip)) => Some(ip),
        Some(Err(_)) => {
            let problem = format!(
                "{network} {mac}: ipv6Address {:?} is not an IPv6 address",
                nc.ipv6_address.as_deref().unwrap_or_default()
            );
            return pending(None, problem, false);
        }
    };
    let recorded = previous
        .iter()
        .find(|(n, m, _, _)| *n == network && *m == mac);
    let prev_ip = recorded.and_then(|(_, _, ip, _)| *ip);
    let Some(pool) = facts.pool_serving(&network) else {
        return pending(prev_ip, format!("no IPPool serves network {network}"), true);
    };
    if facts.pool_paused(&pool) {
        return match recorded {
            Some((_, _, Some(ip), Some(NetworkConfigState::Allocated))) => NicPlan::Held {
                network,
                mac,
                ip: *ip,
                ipv6: prev6,
            },
            // Woken when the pool resumes (a pool's change wakes the configs waiting on it).
            _ => pending(prev_ip, format!("IPPool {pool} is paused"), false),
        };
    }
    if !facts.pool_ready(&pool) {
        return pending(prev_ip, format!("IPPool {pool} is not ready"), true);
    }
    if let Some(other) = facts.claimed_elsewhere(&network, mac) {
        return NicPlan::MacInUse {
            network,
            mac,
            other,
        };
    }
    let (requested, requested6) = match facts.claim(&pool, &network, mac) {
        ClaimFact::None => (requested, requested6),
        // The claim's addresses, asked for as a static request the NIC already holds: kept
        // even where another host was found using them (a dynamic NIC would move).
        ClaimFact::Holds { ip, ipv6 } => (ip, ipv6),
        ClaimFact::Waits(claim) => {
            let problem = format!("{network} {mac}: waiting for AddressClaim {claim}");
            return pending(prev_ip, problem, true);
        }
    };
    NicPlan::Allocate {
        network,
        mac,
        pool,
        requested,
        previous: prev_ip,
        v6: V6Want {
            requested: requested6,
            previous: prev6,
        },
    }
}

/// NICs recorded in status but gone from the spec: each is released; its entry is kept (as
/// `Stale`) unless it already says `Stale` without an address. (network, MAC, address, keep).
pub(super) fn plan_stale(
    previous: &[Recorded],
    wanted: &BTreeSet<(NamespacedName, MacAddr)>,
) -> Vec<(NamespacedName, MacAddr, Option<Ipv4Addr>, bool)> {
    previous
        .iter()
        .filter(|(network, mac, _, _)| !wanted.contains(&(network.clone(), *mac)))
        .map(|(network, mac, ip, state)| {
            let keep = *state != Some(NetworkConfigState::Stale) || ip.is_some();
            (network.clone(), *mac, *ip, keep)
        })
        .collect()
}
