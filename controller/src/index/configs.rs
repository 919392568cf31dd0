//! What the reconcilers ask about VirtualMachineNetworkConfigs by network, kept up to date from
//! the configs' watch events, so that no question costs a scan of every config:
//!
//! - which config's status holds each MAC on each network: before it hands a NIC an address, the
//!   config reconciler must know whether another config already holds that MAC there (upstream
//!   gave both the same address). Scanning every cached config for every NIC would make one
//!   reconcile cost O(configs) and a resync O(configs²);
//! - which configs wait for an address on a network, and which hold a given address there: a
//!   pool's status write (every allocation makes one) wakes exactly those, where a scan of every
//!   config per pool event would make building up a cluster quadratic;
//! - which addresses NICs ask for as their static one (`ipAddress`, `ipv6Address`): dynamic
//!   allocation passes over them, as over a Kea reservation.
//!
//! Each answer costs O(log n + answer); an event costs what its one config costs. The index is
//! fed by [`ConfigIndex::observe`] with every event of the config watch, before the cache and the
//! controller see it: a relist (`Init` … `InitDone`) builds a fresh copy that replaces the old one
//! only when complete, as kube's own store does.

use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::watcher;
use vmdhcp_core::crd::{
    CONDITION_ALLOCATED, NetworkConfigState, REASON_MAC_IN_USE, VirtualMachineNetworkConfig,
    find_condition,
};
use vmdhcp_core::{MacAddr, NamespacedName};

use crate::index::shared_watch::Relisted;
use crate::kinds::object_ref;

/// A NIC: (network, MAC).
pub type Nic = (NamespacedName, MacAddr);

/// A name as the index holds it: one allocation shared by every map and footprint that
/// mentions it. A config's name is in up to five places and a network's in every entry of
/// every config on it; cloned strings would make those copies most of the index's memory
/// (docs/tuning.md), and a tree node of `Arc`s is a sixth of one of names.
type Name = Arc<NamespacedName>;

/// What one config contributes to the index.
#[derive(Debug, Default, Clone, PartialEq)]
struct Footprint {
    /// The networks of its spec.
    networks: Vec<NamespacedName>,
    /// The NICs its status records as `Allocated` ([`claims_of`]).
    nics: Vec<Nic>,
    /// The networks of its spec while it is not `Allocated=True`: a pool write on one of them
    /// may be what it waits for.
    waits_on: Vec<NamespacedName>,
    /// Every address its status records, both families, with the network of the entry.
    holds: Vec<(NamespacedName, IpAddr)>,
    /// The addresses of its status entries that say `Allocated`, both families: what it holds
    /// by the record, which no other NIC's dynamic allocation may take.
    allocated: Vec<(NamespacedName, IpAddr)>,
    /// The static addresses its spec asks for, both families: (network, address, MAC).
    requests: Vec<(NamespacedName, IpAddr, MacAddr)>,
    /// While it waits only for MACs another config holds (`MacInUse`): the NICs of its spec its
    /// status does not record as allocated. The holder's release wakes it.
    blocked: Vec<Nic>,
}

impl Footprint {
    fn of(cfg: &VirtualMachineNetworkConfig) -> Self {
        let ns = cfg.namespace().unwrap_or_default();
        let mut networks: Vec<NamespacedName> = cfg
            .spec
            .network_configs
            .iter()
            .filter_map(|n| NamespacedName::parse_in(&n.network_name, &ns).ok())
            .collect();
        networks.sort();
        networks.dedup();
        // A config whose only problem is a MAC another config holds waits for no pool: a
        // burst of allocations beside it would wake it once per pool write for nothing.
        let waits_on = if is_allocated(cfg) || waits_for_a_mac(cfg) {
            Vec::new()
        } else {
            networks.clone()
        };
        let nics = claims_of(cfg);
        let blocked = if waits_for_a_mac(cfg) {
            let mut blocked: Vec<Nic> = spec_nics(cfg)
                .into_iter()
                .filter(|nic| !nics.contains(nic))
                .collect();
            blocked.sort();
            blocked.dedup();
            blocked
        } else {
            Vec::new()
        };
        let mut holds: Vec<(NamespacedName, IpAddr)> = cfg
            .recorded_nics()
            .into_iter()
            .filter_map(|(network, _, ip, _)| Some((network, IpAddr::V4(ip?))))
            .chain(
                cfg.recorded_ipv6()
                    .into_iter()
                    .map(|(network, _, ip)| (network, IpAddr::V6(ip))),
            )
            .collect();
        holds.sort();
        holds.dedup();
        let allocated = allocated_addresses(cfg);
        Footprint {
            networks,
            nics,
            waits_on,
            holds,
            allocated,
            requests: requests_of(cfg),
            blocked,
        }
    }

    fn is_empty(&self) -> bool {
        self.networks.is_empty()
            && self.nics.is_empty()
            && self.holds.is_empty()
            && self.requests.is_empty()
            && self.blocked.is_empty()
    }
}

/// A [`Footprint`] as the index keeps it, every network name interned, in slices of exactly
/// their length (a `Vec` collected from the footprint's would keep the footprint's larger
/// allocation: collecting into a vector of smaller items reuses the source's memory).
#[derive(Debug, Default, Clone, PartialEq)]
struct Kept {
    networks: Box<[Name]>,
    nics: Box<[(Name, MacAddr)]>,
    waits_on: Box<[Name]>,
    holds: Box<[(Name, IpAddr)]>,
    allocated: Box<[(Name, IpAddr)]>,
    requests: Box<[(Name, IpAddr, MacAddr)]>,
    blocked: Box<[(Name, MacAddr)]>,
}

/// Whether a config's status says every NIC is allocated.
pub fn is_allocated(c: &VirtualMachineNetworkConfig) -> bool {
    c.status.as_ref().is_some_and(|s| {
        find_condition(&s.conditions, CONDITION_ALLOCATED).is_some_and(|a| a.status == "True")
    })
}

/// Whether a config says it is not allocated only because its MACs are held elsewhere.
fn waits_for_a_mac(c: &VirtualMachineNetworkConfig) -> bool {
    c.status.as_ref().is_some_and(|s| {
        find_condition(&s.conditions, CONDITION_ALLOCATED)
            .is_some_and(|a| a.status == "False" && a.reason.as_deref() == Some(REASON_MAC_IN_USE))
    })
}

/// `key → configs`, with the empty sets removed so the maps hold only what is live.
fn link<K: Ord + Clone>(map: &mut BTreeMap<K, BTreeSet<Name>>, k: &K, c: &Name) {
    map.entry(k.clone()).or_default().insert(c.clone());
}

fn unlink<K: Ord>(map: &mut BTreeMap<K, BTreeSet<Name>>, k: &K, c: &NamespacedName) {
    if let Some(set) = map.get_mut(k) {
        set.remove(c);
        if set.is_empty() {
            map.remove(k);
        }
    }
}

/// [`link`] for keys almost always held by one config (a NIC, an address): a sorted `Vec`
/// costs one small allocation where a one-element `BTreeSet` costs a whole tree node, once per
/// config.
fn link_one<K: Ord + Clone>(map: &mut BTreeMap<K, Vec<Name>>, k: &K, c: &Name) {
    let configs = map.entry(k.clone()).or_default();
    if let Err(at) = configs.binary_search(c) {
        // Exactly: most of these hold one config for good, where growing would reserve four.
        configs.reserve_exact(1);
        configs.insert(at, c.clone());
    }
}

/// [`unlink`] for the maps of [`link_one`].
fn unlink_one<K: Ord>(map: &mut BTreeMap<K, Vec<Name>>, k: &K, c: &NamespacedName) {
    if let Some(configs) = map.get_mut(k) {
        if let Ok(at) = configs.binary_search_by(|x| x.as_ref().cmp(c)) {
            configs.remove(at);
        }
        if configs.is_empty() {
            map.remove(k);
        }
    }
}

/// Every config's footprint, and the reverse maps the questions need.
#[derive(Debug, Default, Clone, PartialEq)]
struct Claims {
    /// Every network name some footprint mentions, once (dropped with its last mention).
    networks: HashSet<Name>,
    /// Network → the configs with a NIC on it.
    members: BTreeMap<Name, BTreeSet<Name>>,
    /// (network, MAC) → the configs whose status holds it (sorted; one but for duplicates).
    owners: BTreeMap<(Name, MacAddr), Vec<Name>>,
    /// Network → the configs not yet `Allocated` on it.
    waiting: BTreeMap<Name, BTreeSet<Name>>,
    /// (network, address) → the configs whose status records it (sorted; one but for conflicts).
    holders: BTreeMap<(Name, IpAddr), Vec<Name>>,
    /// (network, address) → the configs whose status records it as `Allocated`.
    allocated_at: BTreeMap<(Name, IpAddr), Vec<Name>>,
    /// (network, address) → the (config, MAC) NICs whose spec asks for it (one but for a
    /// request the webhook would refuse).
    requested: BTreeMap<(Name, IpAddr), Vec<(Name, MacAddr)>>,
    /// (network, MAC) → the configs waiting for that MAC's holder to let it go.
    blocked: BTreeMap<(Name, MacAddr), Vec<Name>>,
    /// Config → its footprint (what to withdraw when it changes).
    by_config: HashMap<Name, Kept>,
}

impl Claims {
    /// The one shared copy of `network`'s name.
    fn intern(&mut self, network: &NamespacedName) -> Name {
        if let Some(kept) = self.networks.get(network) {
            return kept.clone();
        }
        let kept = Name::new(network.clone());
        self.networks.insert(kept.clone());
        kept
    }

    /// The shared copy of `network`'s name, if any config mentions it.
    fn interned(&self, network: &NamespacedName) -> Option<&Name> {
        self.networks.get(network)
    }

    fn set(&mut self, config: NamespacedName, footprint: Footprint) {
        self.remove(&config);
        if footprint.is_empty() {
            return;
        }
        let config = Name::new(config);
        let kept = Kept {
            networks: footprint.networks.iter().map(|n| self.intern(n)).collect(),
            nics: footprint
                .nics
                .iter()
                .map(|(n, mac)| (self.intern(n), *mac))
                .collect(),
            waits_on: footprint.waits_on.iter().map(|n| self.intern(n)).collect(),
            allocated: footprint
                .allocated
                .iter()
                .map(|(n, ip)| (self.intern(n), *ip))
                .collect(),
            holds: footprint
                .holds
                .iter()
                .map(|(n, ip)| (self.intern(n), *ip))
                .collect(),
            requests: footprint
                .requests
                .iter()
                .map(|(n, ip, mac)| (self.intern(n), *ip, *mac))
                .collect(),
            blocked: footprint
                .blocked
                .iter()
                .map(|(n, mac)| (self.intern(n), *mac))
                .collect(),
        };
        for network in &kept.networks {
            link(&mut self.members, network, &config);
        }
        for nic in &kept.nics {
            link_one(&mut self.owners, nic, &config);
        }
        for network in &kept.waits_on {
            link(&mut self.waiting, network, &config);
        }
        for held in &kept.holds {
            link_one(&mut self.holders, held, &config);
        }
        for held in &kept.allocated {
            link_one(&mut self.allocated_at, held, &config);
        }
        for nic in &kept.blocked {
            link_one(&mut self.blocked, nic, &config);
        }
        for (network, ip, mac) in &kept.requests {
            let requesters = self.requested.entry((network.clone(), *ip)).or_default();
            requesters.reserve_exact(1);
            requesters.push((config.clone(), *mac));
        }
        self.by_config.insert(config, kept);
    }

    fn remove(&mut self, config: &NamespacedName) {
        let Some(kept) = self.by_config.remove(config) else {
            return;
        };
        let mut mentioned: Vec<Name> = kept.networks.to_vec();
        for network in &kept.networks {
            unlink(&mut self.members, network, config);
        }
        for nic in &kept.nics {
            unlink_one(&mut self.owners, nic, config);
            mentioned.push(nic.0.clone());
        }
        for network in &kept.waits_on {
            unlink(&mut self.waiting, network, config);
        }
        for held in &kept.holds {
            unlink_one(&mut self.holders, held, config);
            mentioned.push(held.0.clone());
        }
        for held in &kept.allocated {
            unlink_one(&mut self.allocated_at, held, config);
            mentioned.push(held.0.clone());
        }
        for nic in &kept.blocked {
            unlink_one(&mut self.blocked, nic, config);
            mentioned.push(nic.0.clone());
        }
        for (network, ip, _) in &kept.requests {
            let key = (network.clone(), *ip);
            if let Some(requesters) = self.requested.get_mut(&key) {
                requesters.retain(|(c, _)| c.as_ref() != config);
                if requesters.is_empty() {
                    self.requested.remove(&key);
                }
            }
            mentioned.push(network.clone());
        }
        drop(kept);
        for network in mentioned {
            // Two references left, the set's and this one: nothing else mentions it.
            if Arc::strong_count(&network) == 2 {
                self.networks.remove(&network);
            }
        }
    }
}

/// The index; shared by the watch that feeds it and the reconcilers and triggers that ask it.
#[derive(Debug, Default)]
pub struct ConfigIndex {
    inner: Mutex<Relisted<Claims>>,
}

/// The static addresses `cfg`'s spec asks for, both families: (network, address, MAC); none
/// while it is being deleted. A NIC whose network, MAC or address does not parse asks for
/// nothing (its reconcile says why).
fn requests_of(cfg: &VirtualMachineNetworkConfig) -> Vec<(NamespacedName, IpAddr, MacAddr)> {
    if cfg.metadata.deletion_timestamp.is_some() {
        return Vec::new();
    }
    let ns = cfg.namespace().unwrap_or_default();
    let mut out = Vec::new();
    for nc in &cfg.spec.network_configs {
        let (Ok(network), Ok(mac)) = (
            NamespacedName::parse_in(&nc.network_name, &ns),
            nc.mac_address.parse::<MacAddr>(),
        ) else {
            continue;
        };
        let v4 = nc
            .ip_address
            .as_deref()
            .and_then(|a| a.parse::<Ipv4Addr>().ok());
        let v6 = nc
            .ipv6_address
            .as_deref()
            .and_then(|a| a.parse::<Ipv6Addr>().ok());
        out.extend(
            v4.map(IpAddr::V4)
                .into_iter()
                .chain(v6.map(IpAddr::V6))
                .map(|ip| (network.clone(), ip, mac)),
        );
    }
    out.sort();
    out.dedup();
    out
}

/// The addresses `cfg`'s status records as `Allocated`, both families, with their network; none
/// while it is being deleted (they are on their way back).
fn allocated_addresses(cfg: &VirtualMachineNetworkConfig) -> Vec<(NamespacedName, IpAddr)> {
    if cfg.metadata.deletion_timestamp.is_some() {
        return Vec::new();
    }
    let ns = cfg.namespace().unwrap_or_default();
    let mut out: Vec<(NamespacedName, IpAddr)> = cfg
        .status
        .iter()
        .flat_map(|s| &s.network_configs)
        .filter(|e| e.state == Some(NetworkConfigState::Allocated))
        .filter_map(|e| {
            let network = NamespacedName::parse_in(e.network_name.as_deref()?, &ns).ok()?;
            let v4 = e
                .allocated_ip_address
                .as_deref()
                .and_then(|a| a.parse::<Ipv4Addr>().ok());
            let v6 = e
                .allocated_ipv6_address
                .as_deref()
                .and_then(|a| a.parse::<Ipv6Addr>().ok());
            Some(
                v4.map(IpAddr::V4)
                    .into_iter()
                    .chain(v6.map(IpAddr::V6))
                    .map(move |ip| (network.clone(), ip)),
            )
        })
        .flatten()
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The NICs of `cfg`'s spec (a NIC whose network or MAC does not parse is none).
pub fn spec_nics(cfg: &VirtualMachineNetworkConfig) -> Vec<Nic> {
    let ns = cfg.namespace().unwrap_or_default();
    cfg.spec
        .network_configs
        .iter()
        .filter_map(|nc| {
            let network = NamespacedName::parse_in(&nc.network_name, &ns).ok()?;
            Some((network, nc.mac_address.parse().ok()?))
        })
        .collect()
}

/// Every NIC `cfg` names, in its spec or in its status (whatever state the entry says).
pub fn named_nics(cfg: &VirtualMachineNetworkConfig) -> BTreeSet<Nic> {
    let recorded = cfg.recorded_nics().into_iter().map(|(n, m, _, _)| (n, m));
    spec_nics(cfg).into_iter().chain(recorded).collect()
}

/// The NICs `cfg`'s status records as `Allocated`; none while it is being deleted (its
/// addresses are on their way back).
pub fn claims_of(cfg: &VirtualMachineNetworkConfig) -> Vec<Nic> {
    if cfg.metadata.deletion_timestamp.is_some() {
        return Vec::new();
    }
    let mut nics: Vec<Nic> = cfg
        .recorded_nics()
        .into_iter()
        .filter(|(_, _, _, state)| *state == Some(NetworkConfigState::Allocated))
        .map(|(network, mac, _, _)| (network, mac))
        .collect();
    nics.sort();
    nics.dedup();
    nics
}

impl ConfigIndex {
    fn lock(&self) -> parking_lot::MutexGuard<'_, Relisted<Claims>> {
        // Whole values replaced under the lock: a panic elsewhere cannot leave one torn.
        self.inner.lock()
    }

    /// Takes one event of the configs' watch into account.
    pub fn observe(&self, event: &watcher::Event<VirtualMachineNetworkConfig>) {
        self.lock().observe(
            event,
            |claims, cfg| {
                if let Some(k) = object_ref(cfg) {
                    claims.set(k, Footprint::of(cfg));
                }
            },
            |claims, cfg| {
                if let Some(k) = object_ref(cfg) {
                    claims.remove(&k);
                }
            },
        );
    }

    /// A config other than `me` whose status holds `mac` on `network` (the first by name when
    /// several do).
    pub fn claimed_elsewhere(
        &self,
        network: &NamespacedName,
        mac: MacAddr,
        me: &NamespacedName,
    ) -> Option<NamespacedName> {
        let inner = self.lock();
        let claims = &inner.live;
        let network = claims.interned(network)?;
        claims
            .owners
            .get(&(network.clone(), mac))?
            .iter()
            .find(|owner| owner.as_ref() != me)
            .map(|owner| owner.as_ref().clone())
    }

    /// Whether any config's status holds `mac` on `network`.
    pub fn claimed_by_any(&self, network: &NamespacedName, mac: MacAddr) -> bool {
        let inner = self.lock();
        let claims = &inner.live;
        claims.interned(network).is_some_and(|network| {
            claims
                .owners
                .get(&(network.clone(), mac))
                .is_some_and(|owners| !owners.is_empty())
        })
    }

    /// The configs a write of the pool on `network` may concern: those waiting for an address
    /// there, and those whose status holds one of `conflicts` there (they must move off it, or
    /// say why they cannot).
    pub fn concerned_by_pool(
        &self,
        network: &NamespacedName,
        conflicts: impl IntoIterator<Item = IpAddr>,
    ) -> BTreeSet<NamespacedName> {
        let inner = self.lock();
        let claims = &inner.live;
        let Some(network) = claims.interned(network) else {
            return BTreeSet::new();
        };
        let mut out: BTreeSet<NamespacedName> = claims
            .waiting
            .get(network)
            .into_iter()
            .flatten()
            .map(|c| c.as_ref().clone())
            .collect();
        for ip in conflicts {
            if let Some(holders) = claims.holders.get(&(network.clone(), ip)) {
                out.extend(holders.iter().map(|c| c.as_ref().clone()));
            }
        }
        out
    }

    /// Whether a NIC other than `me`'s `mac` asks for `ip` on `network` as its static address.
    pub fn requested_by_another(
        &self,
        network: &NamespacedName,
        ip: IpAddr,
        me: &NamespacedName,
        mac: MacAddr,
    ) -> bool {
        let inner = self.lock();
        let claims = &inner.live;
        let Some(network) = claims.interned(network) else {
            return false;
        };
        claims
            .requested
            .get(&(network.clone(), ip))
            .is_some_and(|r| r.iter().any(|(c, m)| c.as_ref() != me || *m != mac))
    }

    /// The configs waiting (`MacInUse`) for a MAC `cfg` may just have let go, as the change of
    /// `cfg` (its deletion too) that the caller saw shows it: a MAC its status records (held,
    /// or released: `Stale`). A config that records none (just created) or waits for the MAC
    /// itself cannot have let it go: were its changes to wake the others, a hundred copies of
    /// one MAC would wake one another on each of their writes.
    pub fn blocked_by(&self, cfg: &VirtualMachineNetworkConfig) -> BTreeSet<NamespacedName> {
        let me = object_ref(cfg);
        let waits_for = Footprint::of(cfg).blocked;
        let mut nics: Vec<Nic> = cfg
            .recorded_nics()
            .into_iter()
            .map(|(network, mac, _, _)| (network, mac))
            .filter(|nic| !waits_for.contains(nic))
            .collect();
        nics.sort();
        nics.dedup();
        let inner = self.lock();
        let claims = &inner.live;
        let mut out = BTreeSet::new();
        for (network, mac) in nics {
            let Some(network) = claims.interned(&network) else {
                continue;
            };
            let waiting = claims.blocked.get(&(network.clone(), mac));
            out.extend(
                waiting
                    .into_iter()
                    .flatten()
                    .filter(|c| Some(c.as_ref()) != me.as_ref())
                    .map(|c| c.as_ref().clone()),
            );
        }
        out
    }

    /// Whether a config other than `me` records `ip` on `network` as `Allocated`: the address is
    /// its by the record even when the books lost it (a writer that predates dual-stack erased
    /// `status.ipv6`, say), and a dynamic allocation passes over it until that config has been
    /// reconciled and took it back.
    pub fn recorded_by_another(
        &self,
        network: &NamespacedName,
        ip: IpAddr,
        me: &NamespacedName,
    ) -> bool {
        let inner = self.lock();
        let claims = &inner.live;
        let Some(network) = claims.interned(network) else {
            return false;
        };
        claims
            .allocated_at
            .get(&(network.clone(), ip))
            .is_some_and(|holders| holders.iter().any(|c| c.as_ref() != me))
    }

    /// How many IPv6 addresses the configs' statuses record as `Allocated` on `network`.
    pub fn allocated_ipv6_on(&self, network: &NamespacedName) -> usize {
        let inner = self.lock();
        let claims = &inner.live;
        let Some(network) = claims.interned(network) else {
            return 0;
        };
        let (lo, hi) = (Ipv6Addr::UNSPECIFIED, Ipv6Addr::from(u128::MAX));
        claims
            .allocated_at
            .range((network.clone(), IpAddr::V6(lo))..=(network.clone(), IpAddr::V6(hi)))
            .count()
    }

    /// The configs with a NIC on `network` (its pool's users).
    pub fn on_network(&self, network: &NamespacedName) -> BTreeSet<NamespacedName> {
        self.lock()
            .live
            .members
            .get(network)
            .into_iter()
            .flatten()
            .map(|c| c.as_ref().clone())
            .collect()
    }

    /// How many NICs are claimed (for tests and metrics).
    pub fn len(&self) -> usize {
        self.lock().live.owners.len()
    }

    /// Whether no NIC is claimed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::Ipv4Addr;
    use vmdhcp_core::crd::{
        Condition, NetworkConfig, NetworkConfigStatus, VirtualMachineNetworkConfigSpec,
        VirtualMachineNetworkConfigStatus,
    };

    const NETWORKS: [&str; 2] = ["ns/net-a", "other/net-b"];

    fn mac(i: u8) -> MacAddr {
        MacAddr([2, 0, 0, 0, 0, i])
    }

    fn ip(i: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 0, 0, i)
    }

    /// A config `ns/vm{n}` whose spec has a NIC per entry and whose status holds `entries`
    /// (network index, MAC index, state), the address `10.0.0.<MAC index>` each; it is
    /// `Allocated=True` when it has entries and all are allocated.
    fn config(n: u8, entries: &[(usize, u8, bool)], deleting: bool) -> VirtualMachineNetworkConfig {
        let spec = VirtualMachineNetworkConfigSpec {
            network_configs: entries
                .iter()
                .map(|(net, m, _)| NetworkConfig {
                    dhcp_options: None,
                    ipv6_address: None,
                    network_name: NETWORKS[*net % NETWORKS.len()].into(),
                    mac_address: mac(*m).to_string(),
                    ip_address: None,
                })
                .collect(),
            ..Default::default()
        };
        let mut cfg = VirtualMachineNetworkConfig::new(&format!("vm{n}"), spec);
        cfg.metadata.namespace = Some("ns".into());
        if deleting {
            cfg.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                ));
        }
        cfg.status = Some(VirtualMachineNetworkConfigStatus {
            network_configs: entries
                .iter()
                .map(|(net, m, allocated)| NetworkConfigStatus {
                    allocated_ipv6_address: None,
                    allocated_ip_address: Some(ip(*m).to_string()),
                    mac_address: Some(mac(*m).to_string()),
                    network_name: Some(NETWORKS[*net % NETWORKS.len()].into()),
                    state: Some(if *allocated {
                        NetworkConfigState::Allocated
                    } else {
                        NetworkConfigState::Pending
                    }),
                })
                .collect(),
            conditions: vec![Condition {
                type_: CONDITION_ALLOCATED.into(),
                status: if !entries.is_empty() && entries.iter().all(|e| e.2) {
                    "True"
                } else {
                    "False"
                }
                .into(),
                ..Default::default()
            }],
        });
        cfg
    }

    /// The pool trigger's answer without this index: a scan of every config.
    fn naive_concerned(
        configs: &BTreeMap<NamespacedName, VirtualMachineNetworkConfig>,
        network: &NamespacedName,
        conflicts: &[Ipv4Addr],
    ) -> BTreeSet<NamespacedName> {
        configs
            .iter()
            .filter(|(_, c)| {
                let waits = !is_allocated(c)
                    && c.spec
                        .network_configs
                        .iter()
                        .any(|n| n.network_name == network.to_string());
                let holds = c.recorded_nics().into_iter().any(|(net, _, ip, _)| {
                    net == *network && ip.is_some_and(|ip| conflicts.contains(&ip))
                });
                waits || holds
            })
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// The reconciler's answer without this index: a scan of every config.
    fn naive(
        configs: &BTreeMap<NamespacedName, VirtualMachineNetworkConfig>,
        network: &NamespacedName,
        mac: MacAddr,
        me: &NamespacedName,
    ) -> BTreeSet<NamespacedName> {
        configs
            .iter()
            .filter(|(k, c)| *k != me && claims_of(c).contains(&(network.clone(), mac)))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// A conflict on an IPv6 address concerns the config whose status records it, as an IPv4
    /// one does: it must move off it.
    #[test]
    fn a_conflict_on_an_ipv6_address_concerns_the_config_holding_it() {
        let index = ConfigIndex::default();
        let net: NamespacedName = NETWORKS[0].parse().unwrap();
        let mut held = config(1, &[(0, 1, true)], false);
        let v6: std::net::Ipv6Addr = "fd00::11".parse().unwrap();
        if let Some(status) = held.status.as_mut() {
            status.network_configs[0].allocated_ipv6_address = Some(v6.to_string());
        }
        index.observe(&watcher::Event::Apply(held));
        let vm1: NamespacedName = "ns/vm1".parse().unwrap();
        assert_eq!(
            index.concerned_by_pool(&net, [IpAddr::V6(v6)]),
            BTreeSet::from([vm1.clone()])
        );
        assert_eq!(
            index.concerned_by_pool(&net, [ip(1).into()]),
            BTreeSet::from([vm1])
        );
        let other: std::net::Ipv6Addr = "fd00::12".parse().unwrap();
        assert!(
            index
                .concerned_by_pool(&net, [IpAddr::V6(other)])
                .is_empty()
        );
    }

    /// The static addresses NICs ask for are known by network until their config no longer
    /// asks (changed, being deleted, gone); the asking NIC itself is not "another".
    #[test]
    fn static_requests_are_known_until_their_config_stops_asking() {
        let index = ConfigIndex::default();
        let net: NamespacedName = NETWORKS[0].parse().unwrap();
        let (vm1, vm2): (NamespacedName, NamespacedName) =
            ("ns/vm1".parse().unwrap(), "ns/vm2".parse().unwrap());
        let mut asking = config(1, &[(0, 1, false)], false);
        asking.spec.network_configs[0].ip_address = Some(ip(50).to_string());
        asking.spec.network_configs[0].ipv6_address = Some("fd00::50".into());
        index.observe(&watcher::Event::Apply(asking.clone()));
        let asked = IpAddr::V4(ip(50));
        let asked6 = IpAddr::V6("fd00::50".parse().unwrap());
        assert!(index.requested_by_another(&net, asked, &vm2, mac(2)));
        assert!(index.requested_by_another(&net, asked6, &vm2, mac(2)));
        assert!(
            !index.requested_by_another(&net, asked, &vm1, mac(1)),
            "its own"
        );
        assert!(
            index.requested_by_another(&net, asked, &vm1, mac(7)),
            "its other NIC"
        );
        assert!(!index.requested_by_another(&net, IpAddr::V4(ip(51)), &vm2, mac(2)));
        let elsewhere: NamespacedName = NETWORKS[1].parse().unwrap();
        assert!(!index.requested_by_another(&elsewhere, asked, &vm2, mac(2)));
        // Being deleted: its addresses are on their way back, and so is its request.
        let mut deleting = asking.clone();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        index.observe(&watcher::Event::Apply(deleting));
        assert!(!index.requested_by_another(&net, asked, &vm2, mac(2)));
        index.observe(&watcher::Event::Apply(asking.clone()));
        assert!(index.requested_by_another(&net, asked, &vm2, mac(2)));
        index.observe(&watcher::Event::Delete(asking));
        assert!(!index.requested_by_another(&net, asked, &vm2, mac(2)));
        assert!(!index.requested_by_another(&net, asked6, &vm2, mac(2)));
    }

    /// A config refused only because another config holds its MAC waits for no pool write:
    /// a burst of allocations beside a hundred of them would wake each once per write.
    #[test]
    fn a_config_waiting_only_for_a_mac_is_not_woken_by_pool_writes() {
        let index = ConfigIndex::default();
        let net: NamespacedName = NETWORKS[0].parse().unwrap();
        let mut dup = config(1, &[(0, 1, false)], false);
        let reason = |cfg: &mut VirtualMachineNetworkConfig, why: &str| {
            if let Some(status) = cfg.status.as_mut() {
                status.conditions[0].reason = Some(why.into());
            }
        };
        reason(&mut dup, REASON_MAC_IN_USE);
        index.observe(&watcher::Event::Apply(dup.clone()));
        assert!(index.concerned_by_pool(&net, []).is_empty());
        // The holder of its MAC (another config, Allocated) wakes it when it changes or goes;
        // a holder of another MAC does not, nor does it wake itself.
        let holder = config(2, &[(0, 1, true)], false);
        let other = config(3, &[(0, 2, true)], false);
        let vm1: BTreeSet<NamespacedName> = BTreeSet::from(["ns/vm1".parse().unwrap()]);
        assert_eq!(index.blocked_by(&holder), vm1);
        assert!(index.blocked_by(&other).is_empty());
        assert!(index.blocked_by(&dup).is_empty());
        // Another copy of the MAC, refused too, or just created (no status yet), wakes none:
        // only what held the MAC can have let it go.
        let mut copy = config(4, &[(0, 1, false)], false);
        reason(&mut copy, REASON_MAC_IN_USE);
        index.observe(&watcher::Event::Apply(copy.clone()));
        assert!(!index.blocked_by(&holder).is_empty());
        assert!(index.blocked_by(&copy).is_empty(), "a copy woke the others");
        let mut fresh = copy.clone();
        fresh.status = None;
        assert!(
            index.blocked_by(&fresh).is_empty(),
            "a new copy woke the others"
        );
        index.observe(&watcher::Event::Delete(copy));
        reason(&mut dup, "Error");
        index.observe(&watcher::Event::Apply(dup.clone()));
        assert_eq!(index.concerned_by_pool(&net, []), vm1);
        assert!(index.blocked_by(&holder).is_empty(), "no longer MacInUse");
        reason(&mut dup, REASON_MAC_IN_USE);
        index.observe(&watcher::Event::Apply(dup.clone()));
        index.observe(&watcher::Event::Delete(dup));
        assert!(index.blocked_by(&holder).is_empty(), "gone");
        assert!(index.lock().live.blocked.is_empty());
    }

    #[test]
    fn a_config_claims_its_allocated_nics_and_lets_go_when_it_changes_or_goes() {
        let index = ConfigIndex::default();
        let me: NamespacedName = "ns/vm9".parse().unwrap();
        let net: NamespacedName = NETWORKS[0].parse().unwrap();
        let a = config(1, &[(0, 1, true), (1, 2, false)], false);
        index.observe(&watcher::Event::Apply(a.clone()));
        assert_eq!(
            index.concerned_by_pool(&net, []),
            BTreeSet::from(["ns/vm1".parse().unwrap()]),
            "not Allocated=True: waits on both its networks"
        );
        assert!(
            index
                .concerned_by_pool(&"ns/elsewhere".parse().unwrap(), [ip(1).into()])
                .is_empty()
        );
        assert_eq!(
            index.claimed_elsewhere(&net, mac(1), &me),
            Some("ns/vm1".parse().unwrap())
        );
        assert_eq!(
            index.claimed_elsewhere(&net, mac(1), &"ns/vm1".parse().unwrap()),
            None
        );
        assert_eq!(index.len(), 1, "a Pending entry claims nothing");
        // Being deleted, or deleted: the claim goes.
        index.observe(&watcher::Event::Apply(config(1, &[(0, 1, true)], true)));
        assert!(index.is_empty());
        index.observe(&watcher::Event::Apply(a.clone()));
        index.observe(&watcher::Event::Delete(a));
        assert!(index.is_empty());
        // A relist replaces everything only when it is complete.
        index.observe(&watcher::Event::Apply(config(3, &[(0, 3, true)], false)));
        index.observe(&watcher::Event::Init);
        index.observe(&watcher::Event::InitApply(config(
            4,
            &[(0, 4, true)],
            false,
        )));
        assert!(index.claimed_elsewhere(&net, mac(3), &me).is_some());
        index.observe(&watcher::Event::InitDone);
        assert!(index.claimed_elsewhere(&net, mac(3), &me).is_none());
        assert!(index.claimed_elsewhere(&net, mac(4), &me).is_some());
    }

    /// Status entries of a test config: (network index, MAC index, allocated).
    type Entries = Vec<(usize, u8, bool)>;

    #[derive(Debug, Clone)]
    enum Step {
        Apply(u8, Entries, bool),
        Delete(u8),
        Relist(Vec<(u8, Entries)>),
    }

    fn entries() -> impl Strategy<Value = Entries> {
        prop::collection::vec((0..2usize, 0..4u8, any::<bool>()), 0..3)
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            6 => (0..6u8, entries(), prop::bool::weighted(0.1)).prop_map(|(n, e, d)| Step::Apply(n, e, d)),
            2 => (0..6u8).prop_map(Step::Delete),
            1 => prop::collection::vec((0..6u8, entries()), 0..5).prop_map(Step::Relist),
        ]
    }

    proptest! {
        #[test]
        fn answers_as_a_scan_of_every_config_would(history in prop::collection::vec(step(), 1..40)) {
            let index = ConfigIndex::default();
            let mut configs: BTreeMap<NamespacedName, VirtualMachineNetworkConfig> = BTreeMap::new();
            for step in history {
                match step {
                    Step::Apply(n, e, deleting) => {
                        let cfg = config(n, &e, deleting);
                        configs.insert(object_ref(&cfg).unwrap(), cfg.clone());
                        index.observe(&watcher::Event::Apply(cfg));
                    }
                    Step::Delete(n) => {
                        let k: NamespacedName = format!("ns/vm{n}").parse().unwrap();
                        if let Some(cfg) = configs.remove(&k) {
                            index.observe(&watcher::Event::Delete(cfg));
                        }
                    }
                    Step::Relist(all) => {
                        configs.clear();
                        index.observe(&watcher::Event::Init);
                        for (n, e) in all {
                            let cfg = config(n, &e, false);
                            configs.insert(object_ref(&cfg).unwrap(), cfg.clone());
                            index.observe(&watcher::Event::InitApply(cfg));
                        }
                        index.observe(&watcher::Event::InitDone);
                    }
                }
                for net in NETWORKS {
                    let net: NamespacedName = net.parse().unwrap();
                    let members: BTreeSet<NamespacedName> = configs
                        .iter()
                        .filter(|(_, c)| {
                            c.spec.network_configs.iter().any(|n| n.network_name == net.to_string())
                        })
                        .map(|(k, _)| k.clone())
                        .collect();
                    prop_assert_eq!(index.on_network(&net), members);
                    for conflicts in [vec![], vec![ip(1)], vec![ip(0), ip(3)]] {
                        prop_assert_eq!(
                            index.concerned_by_pool(&net, conflicts.iter().map(|&c| IpAddr::from(c))),
                            naive_concerned(&configs, &net, &conflicts)
                        );
                    }
                    for m in 0..4 {
                        for me in 0..7u8 {
                            let me: NamespacedName = format!("ns/vm{me}").parse().unwrap();
                            let want = naive(&configs, &net, mac(m), &me);
                            let got = index.claimed_elsewhere(&net, mac(m), &me);
                            prop_assert_eq!(got.is_some(), !want.is_empty());
                            if let Some(got) = got {
                                prop_assert!(want.contains(&got));
                            }
                        }
                    }
                }
                // Each interned network name is still mentioned by some config (none leaks).
                let inner = index.lock();
                for n in &inner.live.networks {
                    prop_assert!(Arc::strong_count(n) > 1, "{n} kept after its last mention");
                }
                drop(inner);
            }
        }
    }
}
