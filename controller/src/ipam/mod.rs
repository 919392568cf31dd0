//! IP address management: which address of a pool belongs to whom.
//!
//! A [`PoolAllocator`] owns one pool's range `[start, end]`. Free addresses are kept as a map of
//! disjoint free intervals and taken addresses as an ordered map, so allocating the lowest free
//! address, taking a requested one and releasing are all O(log n) and memory grows with the
//! number of allocations (and holes), never with the size of the range: a /16 costs what a /24
//! costs. Allocation is lowest-free and so fully determined by what is recorded in
//! `IPPool.status.ipv4.allocated`; [`PoolAllocator::rebuild`] reproduces the exact state from it.
//!
//! [`Ipam`] holds one allocator per pool, keyed by the pool (`namespace/name`) rather than by its
//! network as upstream did, so two pools never share or clobber state, and every access goes
//! through a lock (upstream left pool creation, deletion and lookup unlocked).
//!
//! [`MacOwners`] (in `owners`) records which config claimed each MAC on each pool, so one MAC
//! never gets two configs' addresses; [`ClaimHolders`] (in `claims`) which AddressClaim's
//! address each MAC holds, and [`hold_claim`] moves a claim's address between its holders.
//!
//! This module only keeps the books. Writing them to etcd before anything is served is the
//! reconciler's job; the IPAM is always rebuilt from there after a restart.

mod claims;
mod conflicts;
mod owners;
mod record;

pub use claims::{ClaimHolders, hold_claim};
pub use owners::MacOwners;
pub use record::Foreign;

use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use ipnet::IpNet;
use vmdhcp_core::crd::{AddressConflict, DhcpOptions};
use vmdhcp_core::pool::{Family, Holder, NicOptions, PoolRange, parse_allocated};
use vmdhcp_core::{MacAddr, NamespacedName};

/// Why an IPAM operation was refused. Every variant names the pool and the address concerned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IpamError {
    /// The requested address is not in the pool's subnet.
    #[error("pool {pool}: ip {ip} is outside subnet {subnet}")]
    OutsideSubnet {
        /// The pool.
        pool: NamespacedName,
        /// The requested address.
        ip: IpAddr,
        /// The pool's subnet.
        subnet: IpNet,
    },
    /// The requested address is in the subnet but outside `[start, end]` (upstream reported this
    /// as "no more ip addresses left").
    #[error("pool {pool}: ip {ip} is outside the pool range {start}-{end}")]
    OutsideRange {
        /// The pool.
        pool: NamespacedName,
        /// The requested address.
        ip: IpAddr,
        /// First address of the range.
        start: IpAddr,
        /// Last address of the range.
        end: IpAddr,
    },
    /// The requested address is held back by a marker or an unreadable status entry.
    #[error("pool {pool}: ip {ip} is not allocatable: {reason}")]
    Unavailable {
        /// The pool.
        pool: NamespacedName,
        /// The requested address.
        ip: IpAddr,
        /// `RESERVED`, `EXCLUDED`, or why the status entry could not be read.
        reason: String,
    },
    /// The requested address is leased to another NIC.
    #[error("pool {pool}: designated ip {ip} is already allocated to {holder}")]
    AlreadyAllocated {
        /// The pool.
        pool: NamespacedName,
        /// The requested address.
        ip: IpAddr,
        /// Its holder.
        holder: MacAddr,
    },
    /// The NIC already holds a different address in this pool.
    #[error("pool {pool}: {mac} already holds ip {held}")]
    MacHoldsOther {
        /// The pool.
        pool: NamespacedName,
        /// The NIC.
        mac: MacAddr,
        /// The address it holds.
        held: IpAddr,
    },
    /// Every address of the range is taken.
    #[error("pool {pool}: no more ip addresses left in {start}-{end}")]
    Exhausted {
        /// The pool.
        pool: NamespacedName,
        /// First address of the range.
        start: IpAddr,
        /// Last address of the range.
        end: IpAddr,
    },
    /// Markers are part of the pool's definition and cannot be released.
    #[error("pool {pool}: ip {ip} is {marker} and cannot be released")]
    ReleaseMarker {
        /// The pool.
        pool: NamespacedName,
        /// The address.
        ip: IpAddr,
        /// `RESERVED` or `EXCLUDED`.
        marker: &'static str,
    },
    /// A `status.ipv4.allocated` entry that could not be replayed as recorded. The address (if
    /// any) stays blocked, so nothing recorded in etcd is ever handed out again.
    #[error("pool {pool}: status entry {ip:?} = {value:?} not replayed: {reason}")]
    StatusEntry {
        /// The pool.
        pool: NamespacedName,
        /// The entry's key.
        ip: String,
        /// The entry's value.
        value: String,
        /// Why.
        reason: String,
    },
    /// The pool records [`MAX_CONFLICTS`] conflicts already.
    #[error(
        "pool {pool}: ip {ip} not recorded as conflicted: {MAX_CONFLICTS} conflicts are recorded already"
    )]
    TooManyConflicts {
        /// The pool.
        pool: NamespacedName,
        /// The address reported.
        ip: IpAddr,
    },
    /// No allocator is registered for the pool.
    #[error("pool {pool}: IPAM is not initialized")]
    UnknownPool {
        /// The pool.
        pool: NamespacedName,
    },
}

/// Most conflicts one pool records; more are refused, so a host answering ARP for every
/// address cannot take a whole pool out of service (nor grow its status without bound).
pub const MAX_CONFLICTS: usize = 64;

/// Who holds a taken address.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Slot {
    Held(Holder),
    /// A status entry we could not read: blocked, counted as used, reported.
    Unreadable(String),
    /// Nobody here, but another host uses it (`status.ipv4.conflicts`): not handed out.
    Conflicted,
}

/// The allocation state of one pool. See the module docs for complexity and determinism.
///
/// Generic over the address family: `PoolAllocator` is a pool's IPv4 books,
/// `PoolAllocator<Ipv6Addr>` the IPv6 books of a dual-stack pool, kept by the same code.
#[derive(Clone, Debug)]
pub struct PoolAllocator<A: Family = Ipv4Addr> {
    range: PoolRange<A>,
    /// Free intervals, `first → last` (inclusive), disjoint and never adjacent.
    free: BTreeMap<A::Int, A::Int>,
    free_count: u64,
    taken: BTreeMap<A::Int, Slot>,
    by_mac: HashMap<MacAddr, A::Int>,
    used: u64,
    /// Addresses another host uses, whoever holds them here (at most [`MAX_CONFLICTS`]).
    conflicts: BTreeMap<A::Int, AddressConflict>,
    /// The host name of the VM holding an address, for addresses held by a MAC only.
    host_names: HashMap<A::Int, String>,
    /// The DHCP options of the NIC holding an address (its VM's `dhcpOptions`), for addresses
    /// held by a MAC whose NIC has any.
    nic_options: HashMap<A::Int, NicOptions>,
    /// Recorded entries this allocator cannot hold as addresses (a key outside the range or not
    /// an address, written by another writer): kept and written back as they are.
    verbatim: BTreeMap<String, String>,
    /// What changed since the books were last recorded.
    unrecorded: Unrecorded<A::Int>,
}

/// Changes to a pool's books not yet recorded in etcd, each numbered. A write that meets a
/// version of the pool it did not make (someone else wrote) tells by them an entry this
/// allocator released (left out) from one it never knew (adopted: [`Foreign`]), and an address
/// it gave but has not recorded (the record came first) from one it recorded earlier.
#[derive(Clone, Debug)]
struct Unrecorded<N> {
    /// The number of the latest change.
    seq: u64,
    /// Addresses given to a MAC, and when.
    given: HashMap<N, u64>,
    /// Addresses freed, the value they were recorded under, and when.
    freed: HashMap<N, (String, u64)>,
}

impl<N> Default for Unrecorded<N> {
    fn default() -> Self {
        Unrecorded {
            seq: 0,
            given: HashMap::new(),
            freed: HashMap::new(),
        }
    }
}

/// Equal books: the same holders, free addresses, conflicts, names and kept entries, whatever
/// either has yet to record (a rebuild from status equals the allocator that wrote it).
impl<A: Family> PartialEq for PoolAllocator<A> {
    fn eq(&self, other: &Self) -> bool {
        self.range == other.range
            && self.free == other.free
            && self.free_count == other.free_count
            && self.taken == other.taken
            && self.by_mac == other.by_mac
            && self.used == other.used
            && self.conflicts == other.conflicts
            && self.host_names == other.host_names
            && self.nic_options == other.nic_options
            && self.verbatim == other.verbatim
    }
}

impl<A: Family> Eq for PoolAllocator<A> {}

impl<A: Family> PoolAllocator<A> {
    /// A pool with nothing allocated but its markers: the server and router addresses when they
    /// fall inside the range (`RESERVED`) and the exclude list (`EXCLUDED`).
    /// The range is checked when it is built ([`PoolRange<A>::new`], [`ValidPool::parse`]), so
    /// this cannot fail.
    ///
    /// [`ValidPool::parse`]: vmdhcp_core::pool::ValidPool::parse
    pub fn new(range: PoolRange<A>) -> Self {
        let (first, last) = (range.start().to_int(), range.end().to_int());
        let mut alloc = PoolAllocator {
            range,
            free: BTreeMap::from([(first, last)]),
            free_count: A::span(first, last),
            taken: BTreeMap::new(),
            by_mac: HashMap::new(),
            used: 0,
            conflicts: BTreeMap::new(),
            host_names: HashMap::new(),
            nic_options: HashMap::new(),
            verbatim: BTreeMap::new(),
            unrecorded: Unrecorded::default(),
        };
        let reserved = std::iter::once(alloc.range.server_ip()).chain(alloc.range.router());
        let marks: Vec<(A, Holder)> = reserved
            .map(|ip| (ip, Holder::Reserved))
            .chain(
                alloc
                    .range
                    .exclude()
                    .iter()
                    .map(|ip| (*ip, Holder::Excluded)),
            )
            .collect();
        for (ip, holder) in marks {
            if alloc.in_range(ip) && !alloc.taken.contains_key(&ip.to_int()) {
                alloc.take(ip.to_int(), Slot::Held(holder));
            }
        }
        alloc
    }

    /// The pool's range and markers.
    pub fn range(&self) -> &PoolRange<A> {
        &self.range
    }

    /// Addresses leased to NICs (plus blocked unreadable records).
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Addresses still free.
    pub fn available(&self) -> u64 {
        self.free_count
    }

    /// The address `mac` holds, if any.
    pub fn lookup(&self, mac: &MacAddr) -> Option<A> {
        self.by_mac.get(mac).map(|n| A::from_int(*n))
    }

    /// The MAC holding `ip`, if a MAC does (not a marker, an unreadable or a conflicted slot).
    pub fn holder(&self, ip: A) -> Option<MacAddr> {
        match self.taken.get(&ip.to_int()) {
            Some(Slot::Held(Holder::Mac(mac))) => Some(*mac),
            _ => None,
        }
    }

    /// Gives `mac` an address: the one it already holds, else the lowest free one.
    pub fn allocate(&mut self, mac: MacAddr) -> Result<A, IpamError> {
        self.allocate_avoiding(mac, &|_| false)
    }

    /// [`allocate`](Self::allocate), passing over free addresses `avoid` names: those another
    /// NIC asks for as its static address (`ipAddress`) and does not hold yet. As a Kea
    /// reservation, such an address is never given dynamically, whoever asks first; when only
    /// those are free, the pool is exhausted for dynamic NICs. Costs one look per address
    /// passed over.
    pub fn allocate_avoiding(
        &mut self,
        mac: MacAddr,
        avoid: &dyn Fn(A) -> bool,
    ) -> Result<A, IpamError> {
        if let Some(ip) = self.lookup(&mac) {
            return Ok(ip);
        }
        let first = self.free.iter().find_map(|(&start, &last)| {
            let mut n = start;
            loop {
                if !avoid(A::from_int(n)) {
                    return Some(n);
                }
                if n == last {
                    return None;
                }
                n = A::succ(n)?;
            }
        });
        let Some(first) = first else {
            return Err(IpamError::Exhausted {
                pool: self.range.pool().clone(),
                start: self.range.start().into(),
                end: self.range.end().into(),
            });
        };
        self.take(first, Slot::Held(Holder::Mac(mac)));
        self.note_given(first);
        Ok(A::from_int(first))
    }

    /// Gives `mac` exactly `ip` (a static lease), or says precisely why not.
    pub fn allocate_requested(&mut self, mac: MacAddr, ip: A) -> Result<A, IpamError> {
        let pool = || self.range.pool().clone();
        if !A::contains(&self.range.subnet(), ip) {
            return Err(IpamError::OutsideSubnet {
                pool: pool(),
                ip: ip.into(),
                subnet: self.range.subnet().into(),
            });
        }
        if !self.in_range(ip) {
            return Err(IpamError::OutsideRange {
                pool: pool(),
                ip: ip.into(),
                start: self.range.start().into(),
                end: self.range.end().into(),
            });
        }
        let n = ip.to_int();
        match self.taken.get(&n) {
            Some(Slot::Held(Holder::Mac(holder))) if *holder == mac => return Ok(ip),
            Some(Slot::Held(Holder::Mac(holder))) => {
                return Err(IpamError::AlreadyAllocated {
                    pool: pool(),
                    ip: ip.into(),
                    holder: *holder,
                });
            }
            Some(Slot::Held(marker)) => {
                return Err(IpamError::Unavailable {
                    pool: pool(),
                    ip: ip.into(),
                    reason: marker.as_status_value(),
                });
            }
            Some(Slot::Unreadable(value)) => {
                return Err(IpamError::Unavailable {
                    pool: pool(),
                    ip: ip.into(),
                    reason: format!("recorded in status as {value:?}"),
                });
            }
            Some(Slot::Conflicted) => {
                return Err(IpamError::Unavailable {
                    pool: pool(),
                    ip: ip.into(),
                    reason: self
                        .conflict_reason(ip)
                        .unwrap_or_else(|| "in use by another host".to_owned()),
                });
            }
            None => {}
        }
        if let Some(held) = self.lookup(&mac) {
            return Err(IpamError::MacHoldsOther {
                pool: pool(),
                mac,
                held: held.into(),
            });
        }
        self.take(n, Slot::Held(Holder::Mac(mac)));
        self.note_given(n);
        Ok(ip)
    }

    /// Frees `ip`. Returns the MAC that held it, `None` if it was already free. Markers cannot
    /// be released; an unreadable record can (that is how an operator clears one).
    pub fn release(&mut self, ip: A) -> Result<Option<MacAddr>, IpamError> {
        let n = ip.to_int();
        let holder = match self.taken.get(&n) {
            None => return Ok(None),
            Some(Slot::Held(Holder::Reserved)) => "RESERVED",
            Some(Slot::Held(Holder::Excluded)) => "EXCLUDED",
            Some(Slot::Held(Holder::Mac(mac))) => {
                let mac = *mac;
                self.note_freed(n, mac.to_string());
                self.give_back(n);
                return Ok(Some(mac));
            }
            Some(Slot::Unreadable(value)) => {
                let value = value.clone();
                self.note_freed(n, value);
                self.give_back(n);
                return Ok(None);
            }
            Some(Slot::Conflicted) => return Ok(None),
        };
        Err(IpamError::ReleaseMarker {
            pool: self.range.pool().clone(),
            ip: ip.into(),
            marker: holder,
        })
    }

    /// Frees whatever `mac` holds; returns that address.
    pub fn release_mac(&mut self, mac: &MacAddr) -> Option<A> {
        let n = *self.by_mac.get(mac)?;
        self.note_freed(n, mac.to_string());
        self.give_back(n);
        Some(A::from_int(n))
    }

    /// The pool's `status.ipv4.allocated` map: what must be recorded in etcd for this state.
    /// Unreadable records are written back unchanged, so nothing is ever lost by a rewrite.
    /// Conflicted addresses nobody holds are not in it (upstream would read any value there as
    /// a MAC): they are in [`PoolAllocator::status_conflicts`].
    pub fn status_allocated(&self) -> BTreeMap<String, String> {
        self.taken
            .iter()
            .filter_map(|(n, slot)| {
                let value = match slot {
                    Slot::Held(h) => h.as_status_value(),
                    Slot::Unreadable(v) => v.clone(),
                    Slot::Conflicted => return None,
                };
                Some((A::from_int(*n).to_string(), value))
            })
            .chain(self.verbatim.iter().map(|(k, v)| (k.clone(), v.clone())))
            .collect()
    }

    /// Every leased address and its NIC, in address order.
    pub fn leases(&self) -> impl Iterator<Item = (A, MacAddr)> + '_ {
        self.taken.iter().filter_map(|(n, slot)| match slot {
            Slot::Held(Holder::Mac(mac)) => Some((A::from_int(*n), *mac)),
            _ => None,
        })
    }

    fn in_range(&self, ip: A) -> bool {
        (self.range.start().to_int()..=self.range.end().to_int()).contains(&ip.to_int())
    }

    fn is_free(&self, n: A::Int) -> bool {
        self.free
            .range(..=n)
            .next_back()
            .is_some_and(|(_, last)| n <= *last)
    }

    /// Moves a free address `n` (inside the range) to `taken`. O(log n).
    fn take(&mut self, n: A::Int, slot: Slot) {
        let Some((&first, &last)) = self.free.range(..=n).next_back() else {
            return;
        };
        if n > last {
            return;
        }
        self.free.remove(&first);
        if first < n
            && let Some(before) = A::pred(n)
        {
            self.free.insert(first, before);
        }
        if n < last
            && let Some(after) = A::succ(n)
        {
            self.free.insert(after, last);
        }
        self.free_count -= 1;
        self.hold(n, slot);
    }

    /// Puts `slot` at `n`, which is in no free interval and not taken.
    fn hold(&mut self, n: A::Int, slot: Slot) {
        match &slot {
            Slot::Held(Holder::Mac(mac)) => {
                self.by_mac.insert(*mac, n);
                self.used += 1;
            }
            Slot::Unreadable(_) => self.used += 1,
            Slot::Held(_) | Slot::Conflicted => {}
        }
        self.taken.insert(n, slot);
    }

    /// Returns a taken address `n` to the free intervals, merging neighbours. O(log n).
    /// An address with a conflict recorded stays blocked instead.
    fn give_back(&mut self, n: A::Int) {
        match self.taken.remove(&n) {
            Some(Slot::Held(Holder::Mac(mac))) => {
                self.by_mac.remove(&mac);
                self.host_names.remove(&n);
                self.nic_options.remove(&n);
                self.used -= 1;
            }
            Some(Slot::Unreadable(_)) => self.used -= 1,
            Some(Slot::Held(_) | Slot::Conflicted) => {}
            None => return,
        }
        if self.conflicts.contains_key(&n) {
            self.taken.insert(n, Slot::Conflicted);
            return;
        }
        let (mut first, mut last) = (n, n);
        if let Some((&pf, &pl)) = self.free.range(..n).next_back()
            && A::succ(pl) == Some(n)
        {
            self.free.remove(&pf);
            first = pf;
        }
        if let Some(nl) = A::succ(n).and_then(|next| self.free.remove(&next)) {
            last = nl;
        }
        self.free.insert(first, last);
        self.free_count += 1;
    }
}

/// One pool's books: the IPv4 allocator and, on a dual-stack pool, the IPv6 one, under one lock
/// so a NIC's two addresses are given, released and recorded together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolBooks {
    /// The IPv4 books (every pool has them: IPv4 is the primary family).
    pub v4: PoolAllocator,
    /// The IPv6 books of a dual-stack pool.
    pub v6: Option<PoolAllocator<Ipv6Addr>>,
}

impl PoolBooks {
    /// The books of an IPv4-only pool.
    pub fn v4_only(v4: PoolAllocator) -> Self {
        PoolBooks { v4, v6: None }
    }
}

/// Every pool's allocator, keyed by pool. Safe to share between reconcilers and HTTP handlers:
/// the map is behind a read-write lock and each pool behind its own mutex, so work on one pool
/// never waits for another.
#[derive(Default)]
pub struct Ipam {
    pools: RwLock<HashMap<NamespacedName, Arc<Mutex<PoolBooks>>>>,
}

impl Ipam {
    /// An IPAM with no pools.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers (or replaces) an IPv4-only pool's allocator.
    pub fn insert(&self, allocator: PoolAllocator) {
        self.insert_books(PoolBooks::v4_only(allocator));
    }

    /// Registers (or replaces) a pool's books, both families.
    pub fn insert_books(&self, books: PoolBooks) {
        let pool = books.v4.range.pool().clone();
        let mut pools = self.pools.write();
        pools.insert(pool, Arc::new(Mutex::new(books)));
    }

    /// Forgets a pool (pause or deletion); returns whether it was known.
    pub fn remove(&self, pool: &NamespacedName) -> bool {
        let mut pools = self.pools.write();
        pools.remove(pool).is_some()
    }

    /// Whether the pool's allocator has been built (upstream's `IsNetworkInitialized`).
    pub fn contains(&self, pool: &NamespacedName) -> bool {
        let pools = self.pools.read();
        pools.contains_key(pool)
    }

    /// Runs `f` on the pool's IPv4 allocator under the pool's lock.
    pub fn with_pool<T>(
        &self,
        pool: &NamespacedName,
        f: impl FnOnce(&mut PoolAllocator) -> T,
    ) -> Result<T, IpamError> {
        self.with_books(pool, |b| f(&mut b.v4))
    }

    /// Runs `f` on the pool's books, both families, under the pool's lock.
    pub fn with_books<T>(
        &self,
        pool: &NamespacedName,
        f: impl FnOnce(&mut PoolBooks) -> T,
    ) -> Result<T, IpamError> {
        let books = {
            let pools = self.pools.read();
            pools.get(pool).cloned()
        }
        .ok_or_else(|| IpamError::UnknownPool { pool: pool.clone() })?;
        let mut guard = books.lock();
        Ok(f(&mut guard))
    }

    /// [`PoolAllocator::allocate`] on a pool.
    pub fn allocate(&self, pool: &NamespacedName, mac: MacAddr) -> Result<Ipv4Addr, IpamError> {
        self.with_pool(pool, |a| a.allocate(mac))?
    }

    /// [`PoolAllocator::allocate_requested`] on a pool.
    pub fn allocate_requested(
        &self,
        pool: &NamespacedName,
        mac: MacAddr,
        ip: Ipv4Addr,
    ) -> Result<Ipv4Addr, IpamError> {
        self.with_pool(pool, |a| a.allocate_requested(mac, ip))?
    }

    /// [`PoolAllocator::release`] on a pool.
    pub fn release(
        &self,
        pool: &NamespacedName,
        ip: Ipv4Addr,
    ) -> Result<Option<MacAddr>, IpamError> {
        self.with_pool(pool, |a| a.release(ip))?
    }

    /// Pools currently registered, sorted.
    pub fn pools(&self) -> Vec<NamespacedName> {
        let pools = self.pools.read();
        let mut out: Vec<_> = pools.keys().cloned().collect();
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    fn mac(i: u32) -> MacAddr {
        let b = i.to_be_bytes();
        MacAddr([0x02, 0, b[0], b[1], b[2], b[3]])
    }

    /// A checked range of `pool` in `cidr`: `start-end`, server, router, excludes.
    fn range(
        pool: &str,
        cidr: &str,
        (start, end): (&str, &str),
        server: &str,
        router: Option<&str>,
        exclude: Vec<Ipv4Addr>,
    ) -> PoolRange {
        PoolRange::new(
            pool.parse().unwrap(),
            cidr.parse().unwrap(),
            (ip(start), ip(end)),
            ip(server),
            router.map(ip),
            exclude,
        )
        .unwrap()
    }

    fn readme_range_of(pool: &str) -> PoolRange {
        range(
            pool,
            "192.168.48.0/24",
            ("192.168.48.81", "192.168.48.90"),
            "192.168.48.77",
            Some("192.168.48.1"),
            vec![ip("192.168.48.81"), ip("192.168.48.90")],
        )
    }

    fn readme_range() -> PoolRange {
        readme_range_of("default/net-48")
    }

    #[test]
    fn readme_pool_counts_and_markers() {
        let a = PoolAllocator::new(readme_range());
        // 10 addresses in range, 2 excluded; server and router are outside the range.
        assert_eq!((a.used(), a.available()), (0, 8));
        let status = a.status_allocated();
        assert_eq!(
            status.get("192.168.48.81").map(String::as_str),
            Some("EXCLUDED")
        );
        assert_eq!(
            status.get("192.168.48.90").map(String::as_str),
            Some("EXCLUDED")
        );
        assert!(
            !status.contains_key("192.168.48.77"),
            "server outside the range is not marked"
        );
    }

    #[test]
    fn server_and_router_inside_the_range_are_reserved() {
        let r = range(
            "default/net-48",
            "192.168.48.0/24",
            ("192.168.48.81", "192.168.48.90"),
            "192.168.48.85",
            Some("192.168.48.86"),
            vec![ip("192.168.48.81"), ip("192.168.48.90")],
        );
        let mut a = PoolAllocator::new(r);
        assert_eq!(
            a.status_allocated()
                .get("192.168.48.85")
                .map(String::as_str),
            Some("RESERVED")
        );
        assert_eq!(
            a.status_allocated()
                .get("192.168.48.86")
                .map(String::as_str),
            Some("RESERVED")
        );
        assert_eq!(a.available(), 6);
        let err = a
            .allocate_requested(mac(1), ip("192.168.48.85"))
            .unwrap_err();
        assert!(
            matches!(err, IpamError::Unavailable { ref reason, .. } if reason == "RESERVED"),
            "{err}"
        );
        let err = a
            .allocate_requested(mac(1), ip("192.168.48.81"))
            .unwrap_err();
        assert!(
            matches!(err, IpamError::Unavailable { ref reason, .. } if reason == "EXCLUDED"),
            "{err}"
        );
        assert!(matches!(
            a.release(ip("192.168.48.85")),
            Err(IpamError::ReleaseMarker { .. })
        ));
    }

    #[test]
    fn allocation_is_lowest_free_and_sticky_per_mac() {
        let mut a = PoolAllocator::new(readme_range());
        assert_eq!(a.allocate(mac(1)).unwrap(), ip("192.168.48.82"));
        assert_eq!(a.allocate(mac(2)).unwrap(), ip("192.168.48.83"));
        assert_eq!(
            a.allocate(mac(1)).unwrap(),
            ip("192.168.48.82"),
            "a MAC keeps its address"
        );
        assert_eq!(a.release(ip("192.168.48.82")).unwrap(), Some(mac(1)));
        assert_eq!(
            a.release(ip("192.168.48.82")).unwrap(),
            None,
            "release is idempotent"
        );
        assert_eq!(a.allocate(mac(3)).unwrap(), ip("192.168.48.82"));
        assert_eq!((a.used(), a.available()), (2, 6));
    }

    #[test]
    fn addresses_other_nics_ask_for_are_passed_over_by_dynamic_allocation() {
        let mut a = PoolAllocator::new(readme_range());
        // 192.168.48.82..=.89 are free (.81 and .90 excluded); .82, .83 and .85 are asked for.
        let asked: Vec<Ipv4Addr> = ["192.168.48.82", "192.168.48.83", "192.168.48.85"]
            .into_iter()
            .map(ip)
            .collect();
        let avoid = |x: Ipv4Addr| asked.contains(&x);
        assert_eq!(
            a.allocate_avoiding(mac(1), &avoid).unwrap(),
            ip("192.168.48.84")
        );
        assert_eq!(
            a.allocate_avoiding(mac(2), &avoid).unwrap(),
            ip("192.168.48.86")
        );
        assert_eq!(
            a.allocate_avoiding(mac(1), &avoid).unwrap(),
            ip("192.168.48.84"),
            "a MAC keeps its address"
        );
        // The NIC that asked gets its address.
        assert_eq!(
            a.allocate_requested(mac(3), ip("192.168.48.82")).unwrap(),
            ip("192.168.48.82")
        );
        for i in 4..7 {
            a.allocate_avoiding(mac(i), &avoid).unwrap();
        }
        // Only .83 and .85 are free, both asked for: exhausted for a dynamic NIC.
        assert_eq!(a.available(), 2);
        assert!(matches!(
            a.allocate_avoiding(mac(99), &avoid),
            Err(IpamError::Exhausted { .. })
        ));
        assert_eq!(a.allocate(mac(99)).unwrap(), ip("192.168.48.83"));
    }

    #[test]
    fn exhaustion_is_reported() {
        let mut a = PoolAllocator::new(readme_range());
        for i in 0..8 {
            a.allocate(mac(i)).unwrap();
        }
        let err = a.allocate(mac(99)).unwrap_err();
        assert!(matches!(err, IpamError::Exhausted { .. }));
        assert!(
            err.to_string()
                .contains("no more ip addresses left in 192.168.48.81-192.168.48.90")
        );
    }

    #[test]
    fn requested_address_errors_are_specific() {
        // Upstream said "no more ip addresses left" for an address outside the range (bug fix).
        let mut a = PoolAllocator::new(readme_range());
        let err = a
            .allocate_requested(mac(1), ip("192.168.48.100"))
            .unwrap_err();
        assert!(matches!(err, IpamError::OutsideRange { .. }), "{err}");
        assert!(
            err.to_string()
                .contains("outside the pool range 192.168.48.81-192.168.48.90")
        );
        let err = a.allocate_requested(mac(1), ip("10.0.0.1")).unwrap_err();
        assert!(matches!(err, IpamError::OutsideSubnet { .. }), "{err}");

        assert_eq!(
            a.allocate_requested(mac(1), ip("192.168.48.88")).unwrap(),
            ip("192.168.48.88")
        );
        assert_eq!(
            a.allocate_requested(mac(1), ip("192.168.48.88")).unwrap(),
            ip("192.168.48.88")
        );
        let err = a
            .allocate_requested(mac(2), ip("192.168.48.88"))
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("designated ip 192.168.48.88 is already allocated"),
            "{err}"
        );
        let err = a
            .allocate_requested(mac(1), ip("192.168.48.87"))
            .unwrap_err();
        assert!(
            matches!(err, IpamError::MacHoldsOther { held, .. } if held == ip("192.168.48.88"))
        );
        // Lowest-free skips the static lease.
        assert_eq!(a.allocate(mac(3)).unwrap(), ip("192.168.48.82"));
    }

    #[test]
    fn a_single_address_range_has_one_address() {
        // Ranges out of order or outside the subnet cannot be built: PoolRange::new's tests.
        let single = range(
            "default/net-48",
            "192.168.48.0/24",
            ("192.168.48.82", "192.168.48.82"),
            "192.168.48.77",
            None,
            vec![],
        );
        assert_eq!(PoolAllocator::new(single).available(), 1);
    }

    #[test]
    fn two_pools_on_one_network_are_independent() {
        // Upstream keyed IPAM by network, so the second pool replaced the first.
        let ipam = Ipam::new();
        let a = readme_range();
        let b = readme_range_of("default/net-48-b");
        ipam.insert(PoolAllocator::new(a.clone()));
        ipam.insert(PoolAllocator::new(b.clone()));
        assert_eq!(
            ipam.allocate(a.pool(), mac(1)).unwrap(),
            ip("192.168.48.82")
        );
        assert_eq!(
            ipam.allocate(b.pool(), mac(2)).unwrap(),
            ip("192.168.48.82")
        );
        assert_eq!(
            ipam.with_pool(a.pool(), |p| p.lookup(&mac(2))).unwrap(),
            None
        );
        assert!(ipam.remove(b.pool()));
        assert_eq!(ipam.with_pool(a.pool(), |p| p.used()).unwrap(), 1);
        assert!(matches!(
            ipam.allocate(b.pool(), mac(3)),
            Err(IpamError::UnknownPool { .. })
        ));
        assert_eq!(ipam.pools(), [a.pool().clone()]);
    }

    #[test]
    fn concurrent_allocations_never_share_an_address() {
        let ipam = Arc::new(Ipam::new());
        let wide = range(
            "default/net-48",
            "10.20.0.0/16",
            ("10.20.0.1", "10.20.255.254"),
            "10.20.0.1",
            None,
            vec![],
        );
        let pool = wide.pool().clone();
        ipam.insert(PoolAllocator::new(wide));
        let threads: Vec<_> = (0..4u32)
            .map(|t| {
                let (ipam, pool) = (ipam.clone(), pool.clone());
                std::thread::spawn(move || {
                    (0..2000u32)
                        .map(|i| ipam.allocate(&pool, mac(t * 10_000 + i)).unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let all: Vec<Ipv4Addr> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        assert_eq!(all.iter().collect::<BTreeSet<_>>().len(), 8000);
        assert_eq!(
            ipam.with_pool(&pool, |p| (p.used(), p.available()))
                .unwrap(),
            (8000, 65533 - 8000)
        );
    }

    fn conflict(by: u32) -> AddressConflict {
        AddressConflict {
            mac_address: mac(1).to_string(),
            answered_by: mac(by).to_string(),
            source: "Probe".into(),
            since: None,
        }
    }

    #[test]
    fn conflicts_block_addresses_are_bounded_and_survive_a_rebuild() {
        let mut a = PoolAllocator::new(range(
            "ns/p",
            "10.0.0.0/16",
            ("10.0.0.10", "10.0.1.250"),
            "10.0.0.1",
            None,
            vec![ip("10.0.0.12")],
        ));
        let held = a.allocate(mac(1)).unwrap();
        assert_eq!(held, ip("10.0.0.10"));
        let free = ip("10.0.0.11");
        assert!(a.record_conflict(held, conflict(90)).unwrap());
        assert!(a.record_conflict(free, conflict(91)).unwrap());
        assert!(
            !a.record_conflict(free, conflict(92)).unwrap(),
            "already recorded"
        );
        assert!(
            !a.record_conflict(ip("10.0.0.12"), conflict(93)).unwrap(),
            "markers are not"
        );
        assert!(matches!(
            a.record_conflict(ip("10.0.9.9"), conflict(94)),
            Err(IpamError::OutsideRange { .. })
        ));
        // A held conflicted address stays its holder's until released; then it stays blocked.
        assert_eq!(a.lookup(&mac(1)), Some(held));
        assert_eq!(a.allocate(mac(2)).unwrap(), ip("10.0.0.13"));
        a.release_mac(&mac(1));
        assert_eq!(a.allocate(mac(3)).unwrap(), ip("10.0.0.14"));
        assert_eq!(a.used(), 2);

        // The status round-trips: allocated holds neither conflicted address, conflicts both.
        let allocated = a.status_allocated();
        assert!(!allocated.contains_key("10.0.0.10") && !allocated.contains_key("10.0.0.11"));
        let conflicts = a.status_conflicts();
        assert_eq!(conflicts.len(), 2);
        let (mut b, problems) = PoolAllocator::rebuild(a.range().clone(), &allocated);
        assert!(problems.is_empty());
        let mut bad = conflicts.clone();
        bad.insert("nope".into(), conflict(95));
        let problems = b.restore_conflicts(&bad);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(b, a, "rebuilt from status: the same books");

        // Bounded: beyond MAX_CONFLICTS, refused.
        for i in 0..MAX_CONFLICTS as u32 {
            let _ = a.record_conflict(
                Ipv4Addr::from(u32::from(ip("10.0.0.100")) + i),
                conflict(96),
            );
        }
        assert_eq!(a.status_conflicts().len(), MAX_CONFLICTS);
        assert!(matches!(
            a.record_conflict(ip("10.0.1.200"), conflict(97)),
            Err(IpamError::TooManyConflicts { .. })
        ));
        // Cleared, a free address is free again; clearing twice is a no-op.
        assert!(a.clear_conflict(free));
        assert!(!a.clear_conflict(free));
        assert!(a.clear_conflict(held));
        assert_eq!(a.allocate(mac(4)).unwrap(), held, "the lowest free again");
        assert_eq!(a.allocate(mac(5)).unwrap(), free);
    }

    #[test]
    fn host_names_follow_the_holder_and_survive_a_rebuild() {
        let mut a = PoolAllocator::new(readme_range());
        let one = a.allocate(mac(1)).unwrap();
        let two = a.allocate(mac(2)).unwrap();
        assert!(a.set_host_name(one, Some("vm-1")));
        assert!(
            !a.set_host_name(one, Some("vm-1")),
            "unchanged: nothing to write"
        );
        assert!(a.set_host_name(two, Some("vm-2")));
        assert!(
            !a.set_host_name(ip("192.168.48.77"), Some("server")),
            "markers carry no name"
        );
        let recorded = a.status_host_names();
        assert_eq!(recorded.len(), 2);
        let (mut b, _) = PoolAllocator::rebuild(readme_range(), &a.status_allocated());
        let mut tampered = recorded.clone();
        tampered.insert("192.168.48.90".into(), "nobody-holds-it".into());
        tampered.insert("192.168.48.91".into(), "Not A Name".into());
        b.restore_host_names(&tampered);
        assert_eq!(
            b.status_host_names(),
            recorded,
            "only names of held addresses return"
        );
        // Released, the name goes with the address; the next holder starts unnamed.
        b.release_mac(&mac(1));
        assert_eq!(b.allocate(mac(3)).unwrap(), one);
        assert_eq!(
            b.status_host_names().keys().collect::<Vec<_>>(),
            [&two.to_string()]
        );
        assert!(b.set_host_name(two, None));
        assert!(b.status_host_names().is_empty());
    }

    #[test]
    fn a_nic_s_options_follow_the_holder_and_survive_a_rebuild() {
        let mut a = PoolAllocator::new(readme_range());
        let one = a.allocate(mac(1)).unwrap();
        let options = NicOptions {
            boot_file_name: Some("pxelinux.0".into()),
            private: vec![(240, "x".into())],
            ..NicOptions::default()
        };
        assert!(a.set_nic_options(one, Some(&options)));
        assert!(!a.set_nic_options(one, Some(&options)), "unchanged");
        assert!(
            !a.set_nic_options(ip("192.168.48.77"), Some(&options)),
            "markers carry none"
        );
        let recorded = a.status_nic_options();
        assert_eq!(recorded.len(), 1);
        let (mut b, _) = PoolAllocator::rebuild(readme_range(), &a.status_allocated());
        let mut tampered = recorded.clone();
        tampered.insert("192.168.48.90".into(), options.to_crd());
        let mut refused = options.to_crd();
        refused.private_options[0].option = 1;
        tampered.insert(one.to_string(), refused);
        b.restore_nic_options(&tampered);
        assert!(
            b.status_nic_options().is_empty(),
            "neither a free address nor a bad entry"
        );
        b.restore_nic_options(&recorded);
        assert_eq!(b.status_nic_options(), recorded);
        assert_eq!(a, b, "a rebuild equals the books that wrote the status");
        // Released, the options go with the address.
        b.release_mac(&mac(1));
        assert!(b.status_nic_options().is_empty());
    }

    #[test]
    fn rebuild_keeps_unreadable_and_conflicting_records_blocked() {
        let mut status: BTreeMap<String, String> = BTreeMap::new();
        status.insert("192.168.48.82".into(), "c6:d6:82:39:d3:c3".into());
        status.insert("192.168.48.83".into(), "garbage".into());
        status.insert("192.168.48.84".into(), "C6:D6:82:39:D3:C3".into()); // same MAC twice
        status.insert("192.168.48.81".into(), "aa:aa:aa:aa:aa:aa".into()); // on an excluded address
        status.insert("192.168.48.200".into(), "bb:bb:bb:bb:bb:bb".into()); // outside the range
        status.insert("not-an-ip".into(), "cc:cc:cc:cc:cc:cc".into());
        let (mut a, problems) = PoolAllocator::rebuild(readme_range(), &status);
        assert_eq!(problems.len(), 5, "{problems:#?}");
        assert!(
            problems
                .iter()
                .all(|p| matches!(p, IpamError::StatusEntry { .. }))
        );
        assert_eq!(
            a.lookup(&"c6:d6:82:39:d3:c3".parse().unwrap()),
            Some(ip("192.168.48.82"))
        );
        // .83 and .84 stay taken: new allocations skip them.
        assert_eq!(a.allocate(mac(1)).unwrap(), ip("192.168.48.85"));
        assert_eq!(a.used(), 4);
        // Nothing is lost by a rewrite: every recorded entry is written back as it was (the
        // MAC on the excluded .81 too, which stays excluded here), beside the new one.
        let written = a.status_allocated();
        for (key, value) in &status {
            assert_eq!(written.get(key), Some(value), "{key} lost or changed");
        }
        assert_eq!(
            written.get("192.168.48.85").map(String::as_str),
            Some(mac(1).to_string().as_str())
        );
        assert_eq!(
            written.get("192.168.48.90").map(String::as_str),
            Some("EXCLUDED")
        );
        // What is kept verbatim is no other writer's news on the next write.
        assert!(a.foreign(&written).is_empty(), "{:?}", a.foreign(&written));
        // And a rebuild from that write gives the same books.
        let (mut again, _) = PoolAllocator::rebuild(readme_range(), &written);
        assert_eq!(again.status_allocated(), written);
        assert_eq!(
            again.allocate_avoiding(mac(2), &|_| false).ok(),
            a.clone().allocate(mac(2)).ok()
        );
    }

    /// A naive model of the allocator: a set of free addresses and a map of holders.
    #[derive(Debug, Clone)]
    enum Op {
        Allocate(u32),
        Request(u32, u32),
        Release(u32),
        ReleaseMac(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..40u32).prop_map(Op::Allocate),
            (0..40u32, 0..70u32).prop_map(|(m, o)| Op::Request(m, o)),
            (0..70u32).prop_map(Op::Release),
            (0..40u32).prop_map(Op::ReleaseMac),
        ]
    }

    fn small_range(excl: &[u32]) -> PoolRange {
        range(
            "ns/p",
            "10.0.0.0/25",
            ("10.0.0.10", "10.0.0.60"),
            "10.0.0.20",
            Some("10.0.0.1"),
            excl.iter()
                .map(|o| Ipv4Addr::from(u32::from(ip("10.0.0.0")) + o))
                .collect(),
        )
    }

    /// Runs `ops` on an allocator of `range` (offsets 10–60 allocatable, the server at 20)
    /// and on a naive model (a set of free offsets, a map of holders), checking after each
    /// that they agree. Generic over the family: `at` and `off` map offsets to addresses.
    fn check_against_model<A: Family>(
        range: PoolRange<A>,
        at: impl Fn(u32) -> A,
        off: impl Fn(A) -> u32,
        ops: Vec<Op>,
    ) -> Result<(), TestCaseError> {
        let mut a = PoolAllocator::new(range.clone());
        let marked: BTreeSet<u32> = std::iter::once(off(range.server_ip()))
            .chain(range.exclude().iter().map(|i| off(*i)))
            .filter(|n| (10..=60).contains(n))
            .collect();
        let mut free: BTreeSet<u32> = (10..=60).filter(|n| !marked.contains(n)).collect();
        let mut holders: BTreeMap<u32, MacAddr> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Allocate(m) => {
                    let held = holders.iter().find(|(_, h)| **h == mac(m)).map(|(n, _)| *n);
                    let want = held.or_else(|| free.first().copied());
                    match a.allocate(mac(m)) {
                        Ok(got) => {
                            prop_assert_eq!(Some(off(got)), want);
                            free.remove(&off(got));
                            holders.insert(off(got), mac(m));
                        }
                        Err(IpamError::Exhausted { .. }) => prop_assert!(want.is_none()),
                        Err(e) => prop_assert!(false, "unexpected {e}"),
                    }
                }
                Op::Request(m, n) => {
                    let ok = match holders.get(&n) {
                        Some(h) => *h == mac(m),
                        None => free.contains(&n) && !holders.values().any(|h| *h == mac(m)),
                    };
                    let res = a.allocate_requested(mac(m), at(n));
                    prop_assert_eq!(res.is_ok(), ok, "{:?}", res);
                    if ok {
                        free.remove(&n);
                        holders.insert(n, mac(m));
                    }
                }
                Op::Release(n) => {
                    let res = a.release(at(n));
                    if marked.contains(&n) {
                        prop_assert!(res.is_err());
                    } else {
                        prop_assert_eq!(res.unwrap(), holders.remove(&n));
                        if (10..=60).contains(&n) {
                            free.insert(n);
                        }
                    }
                }
                Op::ReleaseMac(m) => {
                    let held = holders.iter().find(|(_, h)| **h == mac(m)).map(|(n, _)| *n);
                    prop_assert_eq!(a.release_mac(&mac(m)).map(&off), held);
                    if let Some(n) = held {
                        holders.remove(&n);
                        free.insert(n);
                    }
                }
            }
            prop_assert_eq!(a.available(), free.len() as u64);
            prop_assert_eq!(a.used(), holders.len() as u64);
            let leased: Vec<(u32, MacAddr)> = a.leases().map(|(i, m)| (off(i), m)).collect();
            prop_assert_eq!(
                leased,
                holders.iter().map(|(n, m)| (*n, *m)).collect::<Vec<_>>()
            );
            let macs: BTreeSet<MacAddr> = holders.values().copied().collect();
            prop_assert_eq!(macs.len(), holders.len(), "one address per MAC");
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn never_hands_out_an_address_twice_and_matches_a_naive_model(
            excl in proptest::collection::vec(0..70u32, 0..6),
            ops in proptest::collection::vec(op(), 0..200),
        ) {
            let base = u32::from(ip("10.0.0.0"));
            check_against_model(
                small_range(&excl),
                |o| Ipv4Addr::from(base + o),
                |a| u32::from(a) - base,
                ops,
            )?;
        }

        /// The IPv6 books are the same code over `u128`: the same model holds, on a range at
        /// the top of a /112 whose addresses have no IPv4 counterpart.
        #[test]
        fn ipv6_books_never_hand_out_an_address_twice_and_match_the_model(
            excl in proptest::collection::vec(0..70u32, 0..6),
            ops in proptest::collection::vec(op(), 0..200),
        ) {
            let base = u128::from("fd00:1:2:3:4:5:6:0".parse::<Ipv6Addr>().unwrap());
            let at = move |o: u32| Ipv6Addr::from(base + u128::from(o));
            let range = PoolRange::new_v6(
                "ns/p".parse().unwrap(),
                "fd00:1:2:3:4:5:6:0/112".parse().unwrap(),
                (at(10), at(60)),
                at(20),
                Some(at(1)),
                excl.iter().map(|o| at(*o)).collect(),
            )
            .unwrap();
            check_against_model(
                range,
                at,
                |a| u32::try_from(u128::from(a) - base).unwrap(),
                ops,
            )?;
        }

        #[test]
        fn rebuild_from_status_gives_the_same_state(
            excl in proptest::collection::vec(0..70u32, 0..6),
            ops in proptest::collection::vec(op(), 0..200),
        ) {
            let mut a = PoolAllocator::new(small_range(&excl));
            for op in ops {
                let _ = match op {
                    Op::Allocate(m) => a.allocate(mac(m)).map(|_| ()),
                    Op::Request(m, o) => a.allocate_requested(mac(m), Ipv4Addr::from(u32::from(ip("10.0.0.0")) + o)).map(|_| ()),
                    Op::Release(o) => a.release(Ipv4Addr::from(u32::from(ip("10.0.0.0")) + o)).map(|_| ()),
                    Op::ReleaseMac(m) => { a.release_mac(&mac(m)); Ok(()) }
                };
            }
            let (b, problems) = PoolAllocator::rebuild(small_range(&excl), &a.status_allocated());
            prop_assert!(problems.is_empty(), "{:?}", problems);
            prop_assert_eq!(&b, &a);
            // And both go on to allocate identically.
            let (mut a, mut b) = (a, b);
            prop_assert_eq!(a.allocate(mac(1000)), b.allocate(mac(1000)));
        }

        #[test]
        fn release_then_allocate_round_trips(n in 1usize..50) {
            let mut a = PoolAllocator::new(small_range(&[]));
            let before = a.clone();
            let got: Vec<Ipv4Addr> = (0..n as u32).map(|m| a.allocate(mac(m)).unwrap()).collect();
            for ip in &got {
                a.release(*ip).unwrap();
            }
            prop_assert_eq!(&a, &before);
            let again: Vec<Ipv4Addr> = (0..n as u32).map(|m| a.allocate(mac(m + 100)).unwrap()).collect();
            prop_assert_eq!(again, got);
        }
    }

    /// A write that meets another writer's version of the record: entries it does not know
    /// are adopted, its own unrecorded releases are left out, and nothing changes before the
    /// write is recorded.
    #[test]
    fn another_writers_entries_are_adopted_and_our_releases_left_out() {
        let mut a = PoolAllocator::new(readme_range());
        let first = a.allocate(mac(1)).unwrap();
        let second = a.allocate(mac(2)).unwrap();
        a.settle(&[], a.changes());
        // We release the first (not recorded yet); someone else records mac 9 on a free address.
        a.release_mac(&mac(1));
        let mut record = a.status_allocated();
        record.insert(first.to_string(), mac(1).to_string());
        record.insert("192.168.48.85".into(), mac(9).to_string());
        record.insert("not-an-ip".into(), "x".into());
        let plan = a.foreign(&record);
        assert_eq!(
            plan,
            vec![
                Foreign::Adopted {
                    ip: ip("192.168.48.85"),
                    value: mac(9).to_string()
                },
                Foreign::Verbatim {
                    key: "not-an-ip".into(),
                    value: "x".into()
                },
            ]
        );
        let written = a.status_allocated_with(&plan);
        assert!(!written.contains_key(&first.to_string()), "{written:?}");
        assert_eq!(written.get("192.168.48.85"), Some(&mac(9).to_string()));
        assert_eq!(written.get("not-an-ip").map(String::as_str), Some("x"));
        assert_eq!(a.lookup(&mac(9)), None, "nothing applied before the write");

        assert!(a.settle(&plan, a.changes()).is_empty());
        assert_eq!(a.lookup(&mac(9)), Some(ip("192.168.48.85")));
        assert_eq!(a.lookup(&mac(2)), Some(second));
        // The books now write what the record holds: nothing foreign is left.
        assert!(a.foreign(&written).is_empty());
        assert_eq!(a.status_allocated(), written);
        // The adopted address is never handed out again.
        for _ in 0..5 {
            let _ = a.allocate(mac(100 + a.used() as u32));
        }
        assert_eq!(
            a.leases()
                .filter(|(i, _)| *i == ip("192.168.48.85"))
                .count(),
            1
        );
    }

    #[test]
    fn a_collision_keeps_whichever_was_recorded_first() {
        let mut a = PoolAllocator::new(readme_range());
        let recorded = a.allocate(mac(1)).unwrap();
        a.settle(&[], a.changes());
        let pending = a.allocate(mac(2)).unwrap();
        // Another writer recorded mac 7 on our recorded address and mac 8 on our pending one.
        let mut record = a.status_allocated();
        record.remove(&pending.to_string());
        record.insert(recorded.to_string(), mac(7).to_string());
        record.insert(pending.to_string(), mac(8).to_string());
        let plan = a.foreign(&record);
        assert_eq!(
            plan,
            vec![
                Foreign::KeptOurs {
                    ip: recorded,
                    ours: mac(1).to_string(),
                    theirs: mac(7).to_string()
                },
                Foreign::Withdrew {
                    ip: pending,
                    ours: mac(2),
                    theirs: mac(8).to_string()
                },
            ]
        );
        assert!(plan.iter().all(Foreign::is_collision));
        let written = a.status_allocated_with(&plan);
        assert_eq!(
            written.get(&recorded.to_string()),
            Some(&mac(1).to_string())
        );
        assert_eq!(written.get(&pending.to_string()), Some(&mac(8).to_string()));
        assert_eq!(a.settle(&plan, a.changes()), vec![mac(2)]);
        assert_eq!(
            a.lookup(&mac(2)),
            None,
            "withdrawn: its config allocates again"
        );
        assert_eq!(a.lookup(&mac(8)), Some(pending));
        let again = a.allocate(mac(2)).unwrap();
        assert_ne!(again, pending);
        assert_eq!(a.status_allocated_with(&[]).len(), written.len() + 1);
    }

    /// Two writers on one record, in any interleaving: every entry either wrote survives
    /// unless its own writer released it, and no address is recorded for two MACs by one write.
    #[test]
    fn two_writers_never_lose_each_others_entries() {
        let mut rng = 0x9e37_79b9_u32;
        let mut next = move |n: u32| {
            rng ^= rng << 13;
            rng ^= rng >> 17;
            rng ^= rng << 5;
            rng % n
        };
        let r = range(
            "default/two",
            "10.0.0.0/24",
            ("10.0.0.10", "10.0.0.60"),
            "10.0.0.1",
            None,
            vec![],
        );
        let mut ours = PoolAllocator::new(r);
        let mut record: BTreeMap<String, String> = BTreeMap::new();
        // What the other writer added and still means to hold.
        let mut theirs: BTreeMap<String, String> = BTreeMap::new();
        for step in 0..400u32 {
            match next(4) {
                0 => {
                    let _ = ours.allocate(mac(step));
                }
                1 => {
                    // Ours only: nothing here ever releases the other writer's MACs.
                    let mine = |m: &MacAddr| {
                        u32::from_be_bytes([m.0[2], m.0[3], m.0[4], m.0[5]]) < 1_000_000
                    };
                    let pick = next(8) as usize;
                    let picked = ours.leases().filter(|(_, m)| mine(m)).nth(pick);
                    if let Some((_, m)) = picked {
                        ours.release_mac(&m);
                    }
                }
                2 => {
                    // The other writer records a MAC of its own on an address free in the record.
                    let n = 10 + next(51);
                    let key = format!("10.0.0.{n}");
                    if !record.contains_key(&key) {
                        let value = mac(1_000_000 + step).to_string();
                        record.insert(key.clone(), value.clone());
                        theirs.insert(key, value);
                    }
                }
                _ => {
                    let plan = ours.foreign(&record);
                    let written = ours.status_allocated_with(&plan);
                    let upto = ours.changes();
                    ours.settle(&plan, upto);
                    let held: BTreeMap<Ipv4Addr, MacAddr> = ours.leases().collect();
                    for (k, v) in &theirs {
                        assert_eq!(written.get(k), Some(v), "step {step}: their {k} lost");
                        let at: Ipv4Addr = k.parse().unwrap();
                        assert_eq!(
                            held.get(&at).map(ToString::to_string).as_ref(),
                            Some(v),
                            "step {step}: their {k} not held in our books"
                        );
                    }
                    // One address per MAC in what was written.
                    let macs: Vec<&String> = written
                        .values()
                        .filter(|v| v.parse::<MacAddr>().is_ok())
                        .collect();
                    let distinct: BTreeSet<&String> = macs.iter().copied().collect();
                    assert_eq!(
                        distinct.len(),
                        macs.len(),
                        "step {step}: a MAC written twice"
                    );
                    record = written;
                }
            }
            // No MAC at two addresses in the books, and each held address is the MAC's.
            let by_mac: BTreeMap<MacAddr, Ipv4Addr> = ours.leases().map(|(i, m)| (m, i)).collect();
            assert_eq!(
                by_mac.len(),
                ours.leases().count(),
                "step {step}: a MAC held twice"
            );
            for (m, i) in &by_mac {
                assert_eq!(ours.lookup(m), Some(*i), "step {step}: {m}");
            }
        }
        assert!(
            !theirs.is_empty() && ours.used() > theirs.len() as u64,
            "both writers held entries: {} theirs, {} in all",
            theirs.len(),
            ours.used()
        );
    }
}
