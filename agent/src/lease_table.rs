//! The agent's lease table: for each pool it serves, the pool's config and who holds which address.
//!
//! It owns the in-memory copy of what the controller streams (whole snapshots, then deltas) and the
//! addresses clients declined. It does no I/O and knows nothing of sockets: the DHCP server reads
//! it, and [`crate::sources`] writes it, from the stream or the fallback.
//!
//! Readers never wait behind writers: each pool is an immutable [`PoolSnapshot`] behind one
//! atomically swapped map ([`arc_swap::ArcSwap`]), so a packet's lookup is a pointer load and a
//! hash probe, whatever is being applied at the same time. Writers build the next version of each
//! pool they touch and swap it in; a delta copies each touched pool once. It takes the agent's
//! one vocabulary for pool state as it is ([`crate::pools`]): a whole snapshot is a list of
//! [`PoolLeases`], a change is a [`PoolDelta`], whichever source ([`crate::sources`]) sends them.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use vmdhcp_core::claims::is_placeholder;
use vmdhcp_core::pool::{Binding, NicOptions, PoolConfig, is_host_of};
use vmdhcp_core::{MacAddr, NamespacedName};

use crate::findings::Findings;
use crate::pools::{PoolDelta, PoolLeases};

/// Why an update could not be applied (in part); the rest of the update is applied regardless.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseTableError {
    /// A delta's lease names a pool the table has no config for (or one the same delta
    /// removes). A snapshot cannot hold one: its leases are listed under their pool.
    #[error("lease {mac} -> {ip} names pool {pool}, which is not configured on this agent")]
    UnknownPool {
        /// The pool named by the lease.
        pool: NamespacedName,
        /// The lease's MAC.
        mac: MacAddr,
        /// The lease's address.
        ip: Ipv4Addr,
    },
    /// A lease's address cannot be handed out on its pool's subnet.
    #[error("lease {mac} -> {ip} of pool {pool} is not a host address of {subnet}")]
    OutsideSubnet {
        /// The pool.
        pool: NamespacedName,
        /// The lease's MAC.
        mac: MacAddr,
        /// The lease's address.
        ip: Ipv4Addr,
        /// The pool's subnet.
        subnet: ipnet::Ipv4Net,
    },
    /// A snapshot leases one address of a pool to two MACs. An address has one holder: the
    /// later MAC (in MAC order) keeps it, and the earlier one is served nothing on that pool.
    #[error(
        "lease {dropped} -> {ip} of pool {pool} skipped: the same snapshot leases {ip} to {kept}"
    )]
    AddressHeldTwice {
        /// The pool.
        pool: NamespacedName,
        /// The address.
        ip: Ipv4Addr,
        /// The MAC left without it.
        dropped: MacAddr,
        /// The MAC that holds it.
        kept: MacAddr,
    },
    /// A lease's IPv6 address is not in its pool's IPv6 subnet, or the pool has none: the
    /// lease is served over DHCPv4 only.
    #[error(
        "lease {mac} -> {ip} of pool {pool} is outside the pool's IPv6 subnet (or it has none)"
    )]
    OutsideV6Subnet {
        /// The pool.
        pool: NamespacedName,
        /// The lease's MAC.
        mac: MacAddr,
        /// The lease's IPv6 address.
        ip: Ipv6Addr,
    },
}

/// One pool as the packet path sees it at one instant: never changes once published.
#[derive(Debug, Clone)]
pub struct PoolSnapshot {
    config: Arc<PoolConfig>,
    ntp_addresses: Arc<[Ipv4Addr]>,
    by_mac: HashMap<MacAddr, Ipv4Addr>,
    by_ip: HashMap<Ipv4Addr, MacAddr>,
    /// Host names (option 12) of the MACs that have one; most pools send none.
    host_names: HashMap<MacAddr, Arc<str>>,
    /// The NICs' own DHCP options (their VMs' `dhcpOptions`), for the MACs that have any.
    nic_options: HashMap<MacAddr, Arc<NicOptions>>,
    /// IPv6 addresses of a dual-stack pool's MACs (only MACs with an IPv4 lease have one).
    v6_by_mac: HashMap<MacAddr, Ipv6Addr>,
    /// The MAC each IPv6 address is reserved for.
    v6_by_ip: HashMap<Ipv6Addr, MacAddr>,
}

/// Keeps `value` as `mac`'s entry in `map` (`None`: none), replacing the entry only when it
/// differs, so that a name or option set that did not change keeps its one shared copy.
fn keep<T: ?Sized + PartialEq>(
    map: &mut HashMap<MacAddr, Arc<T>>,
    mac: MacAddr,
    value: Option<&T>,
    share: impl FnOnce(&T) -> Arc<T>,
) {
    match value {
        Some(v) if map.get(&mac).map(|held| &**held) != Some(v) => {
            map.insert(mac, share(v));
        }
        Some(_) => {}
        None => {
            map.remove(&mac);
        }
    }
}

/// The NTP entries of a config that are addresses already; host names wait for a resolver.
fn literal_ntp(config: &PoolConfig) -> Arc<[Ipv4Addr]> {
    config.ntp.iter().filter_map(|s| s.parse().ok()).collect()
}

impl PoolSnapshot {
    fn new(config: PoolConfig) -> Self {
        PoolSnapshot {
            ntp_addresses: literal_ntp(&config),
            config: Arc::new(config),
            by_mac: HashMap::new(),
            by_ip: HashMap::new(),
            host_names: HashMap::new(),
            nic_options: HashMap::new(),
            v6_by_mac: HashMap::new(),
            v6_by_ip: HashMap::new(),
        }
    }

    /// A new config for this pool; resolved NTP addresses are kept while the NTP list is the same.
    fn set_config(&mut self, config: PoolConfig) {
        if config.ntp != self.config.ntp {
            self.ntp_addresses = literal_ntp(&config);
        }
        self.config = Arc::new(config);
    }

    /// NTP servers as addresses (option 42): the config's literal addresses, and its host names
    /// once [`LeaseTable::set_ntp_addresses`] has recorded what they resolve to.
    pub fn ntp_addresses(&self) -> &[Ipv4Addr] {
        &self.ntp_addresses
    }

    /// The pool's config; replies are built from it, so option changes reach the next reply.
    pub fn config(&self) -> &Arc<PoolConfig> {
        &self.config
    }

    /// The address reserved for `mac` on this pool. Never for an AddressClaim's placeholder:
    /// an unbound claim's address (a VIP) is held in the pool and served to nobody, whoever
    /// forges that MAC.
    pub fn address_of(&self, mac: &MacAddr) -> Option<Ipv4Addr> {
        if is_placeholder(mac) {
            return None;
        }
        self.by_mac.get(mac).copied()
    }

    /// The IPv6 address reserved for `mac` on this dual-stack pool (never for a placeholder,
    /// as [`Self::address_of`]).
    pub fn ipv6_of(&self, mac: &MacAddr) -> Option<Ipv6Addr> {
        if is_placeholder(mac) {
            return None;
        }
        self.v6_by_mac.get(mac).copied()
    }

    /// The MAC an IPv6 address is reserved for.
    pub fn ipv6_holder_of(&self, ip: &Ipv6Addr) -> Option<MacAddr> {
        self.v6_by_ip.get(ip).copied()
    }

    /// The host name `mac` is given (option 12), if its pool sends one.
    pub fn host_name_of(&self, mac: &MacAddr) -> Option<&str> {
        self.host_names.get(mac).map(|n| &**n)
    }

    /// The DHCP options of `mac`'s own NIC, if it has any.
    pub fn options_of(&self, mac: &MacAddr) -> Option<&NicOptions> {
        // Most pools have none: no hashing on the packet path for them.
        if self.nic_options.is_empty() {
            return None;
        }
        self.nic_options.get(mac).map(|o| &**o)
    }

    /// The MAC an address is reserved for.
    pub fn holder_of(&self, ip: &Ipv4Addr) -> Option<MacAddr> {
        self.by_ip.get(ip).copied()
    }

    /// Number of leases.
    pub fn len(&self) -> usize {
        self.by_mac.len()
    }

    /// Whether the pool has no lease.
    pub fn is_empty(&self) -> bool {
        self.by_mac.is_empty()
    }

    /// Leases sorted by MAC, for the `/leases` view and for tests.
    pub fn leases(&self) -> BTreeMap<MacAddr, Ipv4Addr> {
        self.by_mac.iter().map(|(m, ip)| (*m, *ip)).collect()
    }

    /// Records `mac -> ip` (and its host name), dropping whatever either of them was bound to
    /// before: a MAC holds one address per pool and an address has one holder (an IP moved to
    /// another MAC follows it). Returns the other MAC that held `ip` until now, if any, for a
    /// snapshot to report.
    fn insert(
        &mut self,
        mac: MacAddr,
        binding: &Binding,
    ) -> Result<Option<MacAddr>, LeaseTableError> {
        let (ip, host_name) = (binding.ip, binding.host_name.as_deref());
        if !is_host_of(self.config.subnet, ip) {
            return Err(LeaseTableError::OutsideSubnet {
                pool: self.config.pool.clone(),
                mac,
                ip,
                subnet: self.config.subnet,
            });
        }
        if let Some(old_ip) = self.by_mac.insert(mac, ip)
            && old_ip != ip
        {
            self.by_ip.remove(&old_ip);
        }
        let mut displaced = None;
        if let Some(old_mac) = self.by_ip.insert(ip, mac)
            && old_mac != mac
        {
            self.by_mac.remove(&old_mac);
            self.host_names.remove(&old_mac);
            self.nic_options.remove(&old_mac);
            displaced = Some(old_mac);
        }
        keep(
            &mut self.nic_options,
            mac,
            binding.options.as_deref(),
            |o| Arc::new(o.clone()),
        );
        keep(&mut self.host_names, mac, host_name, |name| Arc::from(name));
        if let Some(old) = displaced {
            self.remove_v6(&old);
        }
        self.insert_v6(mac, binding.ipv6)?;
        Ok(displaced)
    }

    /// Records (or drops) `mac`'s IPv6 address, as [`Self::insert`] does its IPv4 one; only on
    /// a dual-stack pool and inside its IPv6 subnet.
    fn insert_v6(&mut self, mac: MacAddr, ipv6: Option<Ipv6Addr>) -> Result<(), LeaseTableError> {
        let Some(ip) = ipv6 else {
            self.remove_v6(&mac);
            return Ok(());
        };
        let subnet = self.config.ipv6.as_ref().map(|v6| v6.subnet);
        if !subnet.is_some_and(|s| s.contains(&ip)) {
            self.remove_v6(&mac);
            return Err(LeaseTableError::OutsideV6Subnet {
                pool: self.config.pool.clone(),
                mac,
                ip,
            });
        }
        if let Some(old) = self.v6_by_mac.insert(mac, ip)
            && old != ip
        {
            self.v6_by_ip.remove(&old);
        }
        if let Some(old_mac) = self.v6_by_ip.insert(ip, mac)
            && old_mac != mac
        {
            self.v6_by_mac.remove(&old_mac);
        }
        Ok(())
    }

    fn remove_v6(&mut self, mac: &MacAddr) {
        if let Some(ip) = self.v6_by_mac.remove(mac) {
            self.v6_by_ip.remove(&ip);
        }
    }

    fn remove(&mut self, mac: &MacAddr) {
        if let Some(ip) = self.by_mac.remove(mac) {
            self.by_ip.remove(&ip);
        }
        self.host_names.remove(mac);
        self.nic_options.remove(mac);
        self.remove_v6(mac);
    }
}

/// An address withheld after a client declined it (RFC 2131 DHCPDECLINE), for a bounded time:
/// see [`crate::dhcp::probe`] for when and how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Conflict {
    /// The MAC that declined it (the reservation's holder).
    pub declined_by: MacAddr,
    /// The other host that answered an ARP probe for it, when one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answered_by: Option<MacAddr>,
    /// When the address is offered again.
    #[serde(rename = "held_for_seconds", serialize_with = "seconds_left")]
    pub until: Instant,
}

impl Conflict {
    /// Whether the address is still withheld.
    pub fn holds(&self) -> bool {
        self.until > Instant::now()
    }
}

fn seconds_left<S: serde::Serializer>(until: &Instant, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(until.saturating_duration_since(Instant::now()).as_secs())
}

type Pools = HashMap<NamespacedName, Arc<PoolSnapshot>>;
/// IPv6 addresses withheld per pool, until when.
type Withheld6 = HashMap<NamespacedName, BTreeMap<Ipv6Addr, Instant>>;

/// Most IPv6 addresses one pool withholds at once: a flood of confirmed DECLINEs (each needs
/// another host answering for the address) cannot take more of a pool out of service.
pub const MAX_WITHHELD6: usize = 64;
type Conflicts = HashMap<NamespacedName, BTreeMap<Ipv4Addr, Conflict>>;

/// Every pool this agent serves, readable from any number of packet tasks without locks.
#[derive(Debug, Default)]
pub struct LeaseTable {
    pools: ArcSwap<Pools>,
    conflicts: ArcSwap<Conflicts>,
    /// IPv6 addresses withheld after a DECLINE that a Neighbor Solicitation confirmed.
    withheld6: ArcSwap<Withheld6>,
    /// What probes found, for the controller (see [`crate::findings`]).
    findings: Findings,
    /// Serialises writers, so two updates never both start from the same version and lose one.
    /// Readers never take it.
    write: Mutex<()>,
}

impl LeaseTable {
    /// An empty table: serves nobody until a snapshot or deltas arrive.
    pub fn new() -> Self {
        Self::default()
    }

    /// The current version of a pool, for one packet's worth of lookups.
    pub fn pool(&self, pool: &NamespacedName) -> Option<Arc<PoolSnapshot>> {
        self.pools.load().get(pool).cloned()
    }

    /// Every pool, sorted by name.
    pub fn pools(&self) -> BTreeMap<NamespacedName, Arc<PoolSnapshot>> {
        self.pools
            .load()
            .iter()
            .map(|(k, v)| (k.clone(), Arc::clone(v)))
            .collect()
    }

    /// Replaces everything with a whole snapshot (the stream's first message or a resync, the
    /// fallback's state, the static file). Borrowed, so the stream's applied state goes in as it
    /// is, without a copy. Conflicts of pools that remain are kept unless their address moved
    /// to another MAC. Bad leases are skipped and returned; the good ones beside them are
    /// applied.
    pub fn apply_snapshot<'a>(
        &self,
        pools: impl IntoIterator<Item = &'a PoolLeases>,
    ) -> Vec<LeaseTableError> {
        let _guard = self.write.lock();
        let mut errors = Vec::new();
        let pools = pools.into_iter();
        let mut next = Pools::with_capacity(pools.size_hint().0);
        let previous = self.pools.load();
        for PoolLeases { config, leases } in pools {
            let name = config.pool.clone();
            let mut snap = PoolSnapshot::new(config.clone());
            if let Some(old) = previous.get(&name)
                && old.config.ntp == snap.config.ntp
            {
                snap.ntp_addresses = Arc::clone(&old.ntp_addresses);
            }
            snap.by_mac.reserve(leases.len());
            snap.by_ip.reserve(leases.len());
            for (mac, binding) in leases {
                match snap.insert(*mac, binding) {
                    Ok(None) => {}
                    Ok(Some(dropped)) => errors.push(LeaseTableError::AddressHeldTwice {
                        pool: name.clone(),
                        ip: binding.ip,
                        dropped,
                        kept: *mac,
                    }),
                    Err(e) => errors.push(e),
                }
            }
            next.insert(name, Arc::new(snap));
        }
        self.pools.store(Arc::new(next));
        self.prune_conflicts();
        self.prune_findings();
        errors
    }

    /// Applies one delta, publishing once at the end: a reader sees all of it or none. Removals
    /// go before upserts (removed pools, upserted pools, removed leases, upserted leases), so an
    /// address moving between MACs in one delta lands on the new one, and a pool removed and
    /// added again starts empty. Its revisions are not checked: the stream's applier ordered the
    /// deltas already. A lease on a pool not served, or outside its subnet, is skipped and
    /// returned; the rest of the delta is applied.
    pub fn apply(&self, delta: &PoolDelta) -> Vec<LeaseTableError> {
        let _guard = self.write.lock();
        let current = self.pools.load_full();
        // Pools touched by this delta, copied once; `None` marks a removal.
        let mut touched: HashMap<NamespacedName, Option<PoolSnapshot>> = HashMap::new();
        let mut errors = Vec::new();
        let working = |touched: &mut HashMap<NamespacedName, Option<PoolSnapshot>>,
                       name: &NamespacedName|
         -> bool {
            if !touched.contains_key(name) {
                match current.get(name) {
                    Some(snap) => {
                        touched.insert(name.clone(), Some(PoolSnapshot::clone(snap)));
                    }
                    None => return false,
                }
            }
            matches!(touched.get(name), Some(Some(_)))
        };
        for name in &delta.removed_pools {
            touched.insert(name.clone(), None);
        }
        for config in &delta.upserted_pools {
            let name = config.pool.clone();
            let snap = if working(&mut touched, &name) {
                touched.remove(&name).flatten()
            } else {
                None
            };
            let next = match snap {
                Some(mut snap) => {
                    let subnet_changed = snap.config.subnet != config.subnet;
                    snap.set_config(config.clone());
                    if subnet_changed {
                        let subnet = snap.config.subnet;
                        snap.by_mac.retain(|_, ip| is_host_of(subnet, *ip));
                        snap.by_ip.retain(|ip, _| is_host_of(subnet, *ip));
                        let kept = &snap.by_mac;
                        snap.host_names.retain(|mac, _| kept.contains_key(mac));
                        snap.nic_options.retain(|mac, _| kept.contains_key(mac));
                    }
                    // IPv6 addresses outside the (new, or no) IPv6 subnet go.
                    let subnet6 = snap.config.ipv6.as_ref().map(|v6| v6.subnet);
                    let by_mac = &snap.by_mac;
                    snap.v6_by_mac.retain(|mac, ip| {
                        by_mac.contains_key(mac) && subnet6.is_some_and(|s| s.contains(&*ip))
                    });
                    let kept = &snap.v6_by_mac;
                    snap.v6_by_ip.retain(|_, mac| kept.contains_key(mac));
                    snap
                }
                None => PoolSnapshot::new(config.clone()),
            };
            touched.insert(name, Some(next));
        }
        for (pool, mac) in &delta.removed_leases {
            if working(&mut touched, pool)
                && let Some(Some(snap)) = touched.get_mut(pool)
            {
                snap.remove(mac);
            }
        }
        for lease in &delta.upserted_leases {
            if !working(&mut touched, &lease.pool) {
                errors.push(LeaseTableError::UnknownPool {
                    pool: lease.pool.clone(),
                    mac: lease.mac,
                    ip: lease.ip,
                });
                continue;
            }
            // A displaced holder is the point of a move, not an error: the delta's removals
            // went first, and the controller gave the address to this MAC.
            if let Some(Some(snap)) = touched.get_mut(&lease.pool)
                && let Err(e) = snap.insert(lease.mac, &lease.binding())
            {
                errors.push(e);
            }
        }
        if !touched.is_empty() {
            let mut next = Pools::clone(&current);
            for (name, snap) in touched {
                match snap {
                    Some(snap) => {
                        next.insert(name, Arc::new(snap));
                    }
                    None => {
                        next.remove(&name);
                    }
                }
            }
            self.pools.store(Arc::new(next));
            self.prune_conflicts();
            self.prune_findings();
        }
        errors
    }

    /// Records what the NTP entries `ntp` of `pool`'s config resolve to. Ignored when the pool is
    /// gone or its NTP list changed meanwhile (a newer resolution will follow); a no-op when
    /// nothing changed. Returns whether the pool was updated.
    pub fn set_ntp_addresses(
        &self,
        pool: &NamespacedName,
        ntp: &[String],
        addresses: Vec<Ipv4Addr>,
    ) -> bool {
        let _guard = self.write.lock();
        let current = self.pools.load_full();
        let Some(snap) = current.get(pool) else {
            return false;
        };
        if snap.config.ntp != ntp || *snap.ntp_addresses == *addresses {
            return false;
        }
        let mut updated = PoolSnapshot::clone(snap);
        updated.ntp_addresses = addresses.into();
        let mut next = Pools::clone(&current);
        next.insert(pool.clone(), Arc::new(updated));
        self.pools.store(Arc::new(next));
        true
    }

    /// Withholds the IPv6 address `ip` of `pool` until `hold` from now (a client declined it
    /// and another host answered for it); at most [`MAX_WITHHELD6`] per pool at once, further
    /// ones refused until some expire. Returns whether it is withheld.
    pub fn withhold6(&self, pool: &NamespacedName, ip: Ipv6Addr, hold: Duration) -> bool {
        let _guard = self.write.lock();
        let now = Instant::now();
        let mut next = Withheld6::clone(&self.withheld6.load());
        let held = next.entry(pool.clone()).or_default();
        held.retain(|_, until| *until > now);
        if held.len() >= MAX_WITHHELD6 && !held.contains_key(&ip) {
            return false;
        }
        held.insert(ip, now + hold);
        self.withheld6.store(Arc::new(next));
        true
    }

    /// Whether `ip` of `pool` is withheld now (one lock-free look, on the packet path).
    pub fn is_withheld6(&self, pool: &NamespacedName, ip: &Ipv6Addr) -> bool {
        self.withheld6
            .load()
            .get(pool)
            .and_then(|held| held.get(ip))
            .is_some_and(|until| *until > Instant::now())
    }

    /// Whether the IPv6 address `ip` of `pool` must not be given now: held after a DECLINE
    /// this agent confirmed ([`LeaseTable::is_withheld6`]), or recorded as conflicted by the
    /// controller and not found free since ([`Findings::withheld6`]). The DHCPv6 packet path's
    /// one question, as [`LeaseTable::withholds`] is the DHCPv4 one.
    pub fn withholds6(&self, pool: &PoolSnapshot, ip: &Ipv6Addr) -> bool {
        let config = pool.config();
        self.is_withheld6(&config.pool, ip) || self.findings.withheld6(config, *ip)
    }

    /// Withholds `ip` of `pool`, which `mac` declined, for `hold` (`answered_by`: the host that
    /// answered a probe for it). A conflict on the same address is replaced.
    pub fn mark_conflicted(
        &self,
        pool: &NamespacedName,
        ip: Ipv4Addr,
        mac: MacAddr,
        answered_by: Option<MacAddr>,
        hold: Duration,
    ) {
        let _guard = self.write.lock();
        let mut next = Conflicts::clone(&self.conflicts.load());
        let conflict = Conflict {
            declined_by: mac,
            answered_by,
            until: Instant::now() + hold,
        };
        next.entry(pool.clone()).or_default().insert(ip, conflict);
        self.conflicts.store(Arc::new(next));
    }

    /// Ends the hold of `ip` of `pool`, if any (a later probe found the address free, or in
    /// use by its own holder). Returns whether there was one.
    pub fn clear_conflict(&self, pool: &NamespacedName, ip: Ipv4Addr) -> bool {
        if !self.is_conflicted(pool, &ip) {
            return false;
        }
        let _guard = self.write.lock();
        let mut next = Conflicts::clone(&self.conflicts.load());
        let removed = next.get_mut(pool).is_some_and(|c| c.remove(&ip).is_some());
        self.conflicts.store(Arc::new(next));
        removed
    }

    /// Whether `ip` of `pool` is withheld now.
    pub fn is_conflicted(&self, pool: &NamespacedName, ip: &Ipv4Addr) -> bool {
        self.conflicts
            .load()
            .get(pool)
            .and_then(|c| c.get(ip))
            .is_some_and(Conflict::holds)
    }

    /// Whether `ip` of `pool` must not be offered now: held after a conflict this agent found
    /// ([`LeaseTable::is_conflicted`]), or recorded as conflicted by the controller and not
    /// found free since ([`Findings::withheld`]). The packet path's one question.
    pub fn withholds(&self, pool: &PoolSnapshot, ip: &Ipv4Addr) -> bool {
        let config = pool.config();
        self.is_conflicted(&config.pool, ip) || self.findings.withheld(config, *ip)
    }

    /// Every address withheld now, per pool, for readiness and `/leases`.
    pub fn conflicts(&self) -> BTreeMap<NamespacedName, BTreeMap<Ipv4Addr, Conflict>> {
        self.conflicts
            .load()
            .iter()
            .map(|(k, v)| {
                let live = v.iter().filter(|(_, c)| c.holds()).map(|(ip, c)| (*ip, *c));
                (k.clone(), live.collect::<BTreeMap<_, _>>())
            })
            .filter(|(_, c)| !c.is_empty())
            .collect()
    }

    /// What this agent's probes found, for the report and the addresses withheld.
    pub fn findings(&self) -> &Findings {
        &self.findings
    }

    fn prune_findings(&self) {
        let pools = self.pools.load();
        self.findings.retain_pools(|p| pools.contains_key(p));
    }

    /// Drops conflicts whose hold ended, whose pool is gone or whose address is no longer held
    /// by the MAC that declined it: the controller has moved on, so the new holder gets a fresh
    /// start.
    fn prune_conflicts(&self) {
        let conflicts = self.conflicts.load_full();
        if conflicts.is_empty() {
            return;
        }
        let pools = self.pools.load();
        let mut next = Conflicts::new();
        for (name, entries) in conflicts.iter() {
            let Some(snap) = pools.get(name) else {
                continue;
            };
            let kept: BTreeMap<_, _> = entries
                .iter()
                .filter(|(ip, c)| c.holds() && snap.holder_of(ip) == Some(c.declined_by))
                .map(|(ip, c)| (*ip, *c))
                .collect();
            if !kept.is_empty() {
                next.insert(name.clone(), kept);
            }
        }
        if next != *conflicts {
            self.conflicts.store(Arc::new(next));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmdhcp_core::pool::{Binding, Lease};

    pub(crate) fn config(name: &str, cidr: &str, server: &str) -> PoolConfig {
        PoolConfig {
            server_ip: server.parse().unwrap(),
            subnet: cidr.parse().unwrap(),
            ..vmdhcp_core::fixtures::pool_config(&format!("default/{name}"))
        }
    }

    fn mac(last: u8) -> MacAddr {
        MacAddr([0x02, 0, 0, 0, 0, last])
    }

    fn lease(pool: &str, m: u8, ip: &str) -> Lease {
        Lease {
            options: None,
            ipv6: None,
            pool: NamespacedName::new("default", pool).unwrap(),
            mac: mac(m),
            ip: ip.parse().unwrap(),
            host_name: None,
        }
    }

    fn name(pool: &str) -> NamespacedName {
        NamespacedName::new("default", pool).unwrap()
    }

    /// A pool of a snapshot with `leases` (MAC's last byte, address).
    fn pool_with(config: PoolConfig, leases: &[(u8, &str)]) -> PoolLeases {
        PoolLeases {
            config,
            leases: leases
                .iter()
                .map(|(m, ip)| (mac(*m), Binding::ip(ip.parse().unwrap())))
                .collect(),
        }
    }

    /// A delta that only upserts `leases`.
    fn upserts(leases: impl IntoIterator<Item = Lease>) -> PoolDelta {
        PoolDelta {
            upserted_leases: leases.into_iter().collect(),
            ..PoolDelta::default()
        }
    }

    /// A delta that only upserts `config`.
    fn upsert_pool(config: PoolConfig) -> PoolDelta {
        PoolDelta {
            upserted_pools: vec![config],
            ..PoolDelta::default()
        }
    }

    fn table_with_a() -> LeaseTable {
        let table = LeaseTable::new();
        let errors = table.apply_snapshot(&[pool_with(
            config("a", "192.0.2.0/24", "192.0.2.1"),
            &[(1, "192.0.2.10"), (2, "192.0.2.11")],
        )]);
        assert!(errors.is_empty(), "{errors:?}");
        table
    }

    #[test]
    fn snapshot_then_lookup() {
        let table = table_with_a();
        let a = table.pool(&name("a")).unwrap();
        assert_eq!(a.address_of(&mac(1)), Some("192.0.2.10".parse().unwrap()));
        assert_eq!(a.holder_of(&"192.0.2.11".parse().unwrap()), Some(mac(2)));
        assert_eq!(a.address_of(&mac(3)), None);
        assert!(table.pool(&name("b")).is_none());
    }

    #[test]
    fn a_claim_s_placeholder_holds_its_address_and_is_served_nothing() {
        let table = LeaseTable::new();
        let vip = vmdhcp_core::claims::placeholder_mac("claim-uid");
        let mut pool = pool_with(config("a", "192.0.2.0/24", "192.0.2.1"), &[]);
        pool.leases
            .insert(vip, Binding::ip("192.0.2.20".parse().unwrap()));
        assert!(table.apply_snapshot(&[pool]).is_empty());
        let a = table.pool(&name("a")).unwrap();
        // Held (no one else is given it, probes pass it over) but never answered for.
        assert_eq!(a.holder_of(&"192.0.2.20".parse().unwrap()), Some(vip));
        assert_eq!(a.address_of(&vip), None);
        assert_eq!(a.ipv6_of(&vip), None);
    }

    #[test]
    fn snapshot_replaces_everything_and_reports_bad_leases() {
        let table = table_with_a();
        // A lease listed under its pool cannot name another one; the bad leases a snapshot can
        // hold are an address outside the subnet and an address held twice.
        let errors = table.apply_snapshot(&[pool_with(
            config("b", "198.51.100.0/24", "198.51.100.1"),
            &[
                (1, "198.51.100.10"),
                (2, "192.0.2.10"),
                (3, "198.51.100.10"),
            ],
        )]);
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(matches!(errors[0], LeaseTableError::OutsideSubnet { .. }));
        assert_eq!(
            errors[1],
            LeaseTableError::AddressHeldTwice {
                pool: name("b"),
                ip: "198.51.100.10".parse().unwrap(),
                dropped: mac(1),
                kept: mac(3),
            }
        );
        assert!(table.pool(&name("a")).is_none());
        assert_eq!(table.pool(&name("b")).unwrap().len(), 1);
    }

    #[test]
    fn host_names_follow_their_mac_and_go_with_its_lease() {
        let table = table_with_a();
        let named = |m: u8, ip: &str, n: Option<&str>| Lease {
            host_name: n.map(str::to_owned),
            ..lease("a", m, ip)
        };
        table.apply(&upserts([
            named(1, "192.0.2.10", Some("vm-1")),
            named(2, "192.0.2.11", Some("vm-2")),
        ]));
        let a = table.pool(&name("a")).unwrap();
        assert_eq!(a.host_name_of(&mac(1)), Some("vm-1"));
        // The address of MAC 1 moves to MAC 3: MAC 1's name goes with its lease.
        table.apply(&upserts([named(3, "192.0.2.10", None)]));
        let a = table.pool(&name("a")).unwrap();
        assert_eq!(a.host_name_of(&mac(1)), None);
        assert_eq!(a.host_name_of(&mac(3)), None);
        // Unnamed again, or removed: no name.
        table.apply(&upserts([named(2, "192.0.2.11", None)]));
        assert_eq!(table.pool(&name("a")).unwrap().host_name_of(&mac(2)), None);
        table.apply(&upserts([named(2, "192.0.2.11", Some("vm-2"))]));
        table.apply(&PoolDelta {
            removed_leases: vec![(name("a"), mac(2))],
            ..PoolDelta::default()
        });
        assert_eq!(table.pool(&name("a")).unwrap().host_name_of(&mac(2)), None);
    }

    #[test]
    fn deltas_upsert_and_remove_leases() {
        let table = table_with_a();
        let before = table.pool(&name("a")).unwrap();
        let errors = table.apply(&PoolDelta {
            upserted_leases: vec![lease("a", 3, "192.0.2.12"), lease("zz", 4, "192.0.2.13")],
            removed_leases: vec![(name("a"), mac(1))],
            ..PoolDelta::default()
        });
        assert_eq!(errors.len(), 1);
        // The lease naming a pool this agent does not serve is the one skipped.
        assert!(
            matches!(&errors[0], LeaseTableError::UnknownPool { pool, .. } if *pool == name("zz")),
            "{errors:?}"
        );
        let a = table.pool(&name("a")).unwrap();
        assert_eq!(a.address_of(&mac(3)), Some("192.0.2.12".parse().unwrap()));
        assert_eq!(a.address_of(&mac(1)), None);
        assert_eq!(a.holder_of(&"192.0.2.10".parse().unwrap()), None);
        // A reader holding the old version keeps a consistent view.
        assert_eq!(
            before.address_of(&mac(1)),
            Some("192.0.2.10".parse().unwrap())
        );
        assert_eq!(before.address_of(&mac(3)), None);
    }

    #[test]
    fn an_ip_moving_to_another_mac_follows_it() {
        let table = table_with_a();
        table.apply(&upserts([lease("a", 9, "192.0.2.10")]));
        let a = table.pool(&name("a")).unwrap();
        assert_eq!(a.holder_of(&"192.0.2.10".parse().unwrap()), Some(mac(9)));
        assert_eq!(a.address_of(&mac(9)), Some("192.0.2.10".parse().unwrap()));
        assert_eq!(a.address_of(&mac(1)), None, "old holder lost the address");
        assert_eq!(a.len(), 2);
        // And a MAC moving to another IP frees the old one.
        table.apply(&upserts([lease("a", 9, "192.0.2.20")]));
        let a = table.pool(&name("a")).unwrap();
        assert_eq!(a.holder_of(&"192.0.2.10".parse().unwrap()), None);
        assert_eq!(a.address_of(&mac(9)), Some("192.0.2.20".parse().unwrap()));
    }

    #[test]
    fn a_delta_applies_its_removals_before_its_upserts() {
        let table = table_with_a();
        // The address of MAC 1 moves to MAC 3, and the DNS changes, in one delta.
        let mut changed = config("a", "192.0.2.0/24", "192.0.2.1");
        changed.dns = vec!["192.0.2.53".parse().unwrap()];
        let errors = table.apply(&PoolDelta {
            base_revision: 1,
            revision: 2,
            upserted_pools: vec![changed.clone()],
            removed_pools: vec![],
            upserted_leases: vec![lease("a", 3, "192.0.2.10")],
            removed_leases: vec![(name("a"), mac(1))],
        });
        assert!(errors.is_empty(), "{errors:?}");
        let a = table.pool(&name("a")).unwrap();
        assert_eq!(a.holder_of(&"192.0.2.10".parse().unwrap()), Some(mac(3)));
        assert_eq!(a.address_of(&mac(1)), None);
        assert_eq!(**a.config(), changed);
        assert_eq!(a.len(), 2);
        // A pool removed and added again in one delta starts empty, then takes its new leases.
        let errors = table.apply(&PoolDelta {
            removed_pools: vec![name("a")],
            upserted_pools: vec![changed],
            upserted_leases: vec![lease("a", 4, "192.0.2.40")],
            ..PoolDelta::default()
        });
        assert!(errors.is_empty(), "{errors:?}");
        let a = table.pool(&name("a")).unwrap();
        assert_eq!(a.leases(), [(mac(4), "192.0.2.40".parse().unwrap())].into());
    }

    #[test]
    fn pool_option_changes_keep_leases() {
        let table = table_with_a();
        let mut cfg = config("a", "192.0.2.0/24", "192.0.2.1");
        cfg.dns = vec!["192.0.2.53".parse().unwrap()];
        cfg.lease_seconds = 60;
        table.apply(&upsert_pool(cfg.clone()));
        let a = table.pool(&name("a")).unwrap();
        assert_eq!(**a.config(), cfg);
        assert_eq!(a.len(), 2);
    }

    #[test]
    fn resolved_ntp_addresses_last_while_the_ntp_list_does() {
        let table = LeaseTable::new();
        let mut cfg = config("a", "192.0.2.0/24", "192.0.2.1");
        cfg.ntp = vec!["192.0.2.123".into(), "ntp.example.test".into()];
        table.apply_snapshot(&[PoolLeases::new(cfg.clone())]);
        let literal: Ipv4Addr = "192.0.2.123".parse().unwrap();
        let resolved: Ipv4Addr = "192.0.2.124".parse().unwrap();
        assert_eq!(table.pool(&name("a")).unwrap().ntp_addresses(), [literal]);
        assert!(table.set_ntp_addresses(&name("a"), &cfg.ntp, vec![literal, resolved]));
        assert!(!table.set_ntp_addresses(&name("a"), &cfg.ntp, vec![literal, resolved]));
        assert!(!table.set_ntp_addresses(&name("a"), &["other".into()], vec![resolved]));
        // Another option changes: the resolution is kept, in deltas and in snapshots.
        cfg.dns = vec![literal];
        table.apply(&upsert_pool(cfg.clone()));
        assert_eq!(
            table.pool(&name("a")).unwrap().ntp_addresses(),
            [literal, resolved]
        );
        table.apply_snapshot(&[PoolLeases::new(cfg.clone())]);
        assert_eq!(
            table.pool(&name("a")).unwrap().ntp_addresses(),
            [literal, resolved]
        );
        // The NTP list changes: back to its literals until resolved again.
        cfg.ntp = vec!["ntp2.example.test".into()];
        table.apply(&upsert_pool(cfg));
        assert!(table.pool(&name("a")).unwrap().ntp_addresses().is_empty());
    }

    #[test]
    fn a_subnet_change_drops_leases_outside_it() {
        let table = table_with_a();
        table.apply(&upsert_pool(config("a", "192.0.2.0/29", "192.0.2.1")));
        assert!(table.pool(&name("a")).unwrap().is_empty());
    }

    #[test]
    fn removing_a_pool_removes_its_leases_and_conflicts() {
        let table = table_with_a();
        table.mark_conflicted(
            &name("a"),
            "192.0.2.10".parse().unwrap(),
            mac(1),
            None,
            HOUR,
        );
        table.apply(&PoolDelta {
            removed_pools: vec![name("a")],
            ..PoolDelta::default()
        });
        assert!(table.pool(&name("a")).is_none());
        assert!(table.conflicts().is_empty());
        // Re-adding starts empty.
        table.apply(&upsert_pool(config("a", "192.0.2.0/24", "192.0.2.1")));
        assert!(table.pool(&name("a")).unwrap().is_empty());
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn a_conflict_ends_with_its_hold() {
        let table = table_with_a();
        let ip: Ipv4Addr = "192.0.2.10".parse().unwrap();
        table.mark_conflicted(&name("a"), ip, mac(1), Some(mac(9)), Duration::ZERO);
        assert!(!table.is_conflicted(&name("a"), &ip));
        assert!(table.conflicts().is_empty());
        table.mark_conflicted(&name("a"), ip, mac(1), Some(mac(9)), HOUR);
        assert!(table.is_conflicted(&name("a"), &ip));
        assert_eq!(table.conflicts()[&name("a")][&ip].answered_by, Some(mac(9)));
        assert!(table.clear_conflict(&name("a"), ip));
        assert!(!table.is_conflicted(&name("a"), &ip));
        assert!(!table.clear_conflict(&name("a"), ip));
    }

    #[test]
    fn conflicts_last_until_the_address_changes_hands() {
        let table = table_with_a();
        let ip: Ipv4Addr = "192.0.2.10".parse().unwrap();
        table.mark_conflicted(&name("a"), ip, mac(1), None, HOUR);
        assert!(table.is_conflicted(&name("a"), &ip));
        // Unrelated deltas keep it.
        table.apply(&upserts([lease("a", 5, "192.0.2.50")]));
        assert!(table.is_conflicted(&name("a"), &ip));
        assert_eq!(table.conflicts()[&name("a")][&ip].declined_by, mac(1));
        // The controller moves the MAC elsewhere: the conflict is history.
        table.apply(&upserts([lease("a", 1, "192.0.2.60")]));
        assert!(!table.is_conflicted(&name("a"), &ip));
    }

    #[test]
    fn concurrent_readers_see_whole_versions() {
        let table = Arc::new(table_with_a());
        let reader = {
            let table = Arc::clone(&table);
            std::thread::spawn(move || {
                for _ in 0..20_000 {
                    let a = table.pool(&name("a")).unwrap();
                    // Within one version, the two maps always agree.
                    for (m, ip) in a.leases() {
                        assert_eq!(a.holder_of(&ip), Some(m));
                    }
                }
            })
        };
        for i in 0..200u32 {
            let last = u8::try_from(i % 200).unwrap() + 10;
            table.apply(&upserts([Lease {
                options: None,
                ipv6: None,
                pool: name("a"),
                mac: mac(u8::try_from(i % 3).unwrap()),
                ip: Ipv4Addr::new(192, 0, 2, last),
                host_name: None,
            }]));
        }
        reader.join().unwrap();
    }

    #[test]
    fn an_ipv6_address_is_withheld_after_a_confirmed_decline_or_while_the_controller_records_it() {
        let v6 = |s: &str| -> Ipv6Addr { s.parse().unwrap() };
        let mut cfg = config("a", "192.0.2.0/24", "192.0.2.1");
        cfg.ipv6 = Some(vmdhcp_core::pool::PoolConfigV6 {
            server_ip: v6("fd00::1"),
            subnet: "fd00::/112".parse().unwrap(),
            dns: vec![],
            lease_seconds: 300,
            router_advertisements: false,
            router: None,
            conflicted: vec![v6("fd00::20")],
            boot: None,
        });
        let table = LeaseTable::new();
        table.apply_snapshot(&[PoolLeases {
            leases: [
                (
                    mac(1),
                    Binding {
                        ipv6: Some(v6("fd00::10")),
                        ..Binding::ip("192.0.2.10".parse().unwrap())
                    },
                ),
                (
                    mac(2),
                    Binding {
                        ipv6: Some(v6("fd00::20")),
                        ..Binding::ip("192.0.2.11".parse().unwrap())
                    },
                ),
            ]
            .into(),
            config: cfg,
        }]);
        let a = table.pool(&name("a")).unwrap();
        assert_eq!(a.ipv6_holder_of(&v6("fd00::20")), Some(mac(2)));
        assert!(!table.withholds6(&a, &v6("fd00::10")));
        // Recorded by the controller: withheld until a recheck finds it free.
        assert!(table.withholds6(&a, &v6("fd00::20")));
        table.findings().record(
            &name("a"),
            v6("fd00::20"),
            crate::findings::Finding::free(Some(mac(2))),
        );
        assert!(!table.withholds6(&a, &v6("fd00::20")));
        // A DECLINE this agent confirmed: withheld for its hold.
        assert!(table.withhold6(&name("a"), v6("fd00::10"), HOUR));
        assert!(table.withholds6(&a, &v6("fd00::10")));
        assert!(table.withhold6(&name("a"), v6("fd00::30"), Duration::ZERO));
        assert!(!table.withholds6(&a, &v6("fd00::30")));
    }
}
