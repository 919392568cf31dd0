//! What the books hold besides holders: the host name and the NIC's own DHCP options of each
//! address, and the addresses another host was found using (conflicts), bounded, blocked until
//! a probe clears them.

use super::*;

impl<A: Family> PoolAllocator<A> {
    /// Names the VM holding `ip` (`None`: no name); returns whether that changed. Only an
    /// address held by a MAC carries a name; it goes when the address is released.
    pub fn set_host_name(&mut self, ip: A, name: Option<&str>) -> bool {
        let name = name.map(str::to_owned);
        set_beside_holder(&self.taken, &mut self.host_names, ip.to_int(), name)
    }

    /// Restores the names recorded in `status.ipv4.hostNames` for addresses held by a MAC (a
    /// rebuild from status); entries for other addresses or that are not host names are dropped
    /// and will not be written back.
    pub fn restore_host_names(&mut self, recorded: &BTreeMap<String, String>) {
        for (ip, name) in recorded {
            if let Ok(ip) = ip.parse::<A>()
                && vmdhcp_core::names::is_host_name(name)
            {
                self.set_host_name(ip, Some(name));
            }
        }
    }

    /// Sets the DHCP options of the NIC holding `ip` (`None`: none); returns whether that
    /// changed. As a host name, only an address held by a MAC carries them, until released.
    pub fn set_nic_options(&mut self, ip: A, options: Option<&NicOptions>) -> bool {
        let options = options.cloned();
        set_beside_holder(&self.taken, &mut self.nic_options, ip.to_int(), options)
    }

    /// Restores the options recorded in `status.ipv4.dhcpOptions` for addresses held by a MAC
    /// (a rebuild from status); entries for other addresses or that break the rules are
    /// dropped and will not be written back (the config's reconcile records them again).
    pub fn restore_nic_options(&mut self, recorded: &BTreeMap<String, DhcpOptions>) {
        for (ip, options) in recorded {
            if let (Ok(ip), Ok(Some(options))) = (ip.parse::<A>(), NicOptions::parse(options)) {
                self.set_nic_options(ip, Some(&options));
            }
        }
    }

    /// The pool's `status.ipv4.dhcpOptions` map.
    pub fn status_nic_options(&self) -> BTreeMap<String, DhcpOptions> {
        self.nic_options
            .iter()
            .map(|(n, o)| (A::from_int(*n).to_string(), o.to_crd()))
            .collect()
    }

    /// The pool's `status.ipv4.hostNames` map.
    pub fn status_host_names(&self) -> BTreeMap<String, String> {
        self.host_names
            .iter()
            .map(|(n, name)| (A::from_int(*n).to_string(), name.clone()))
            .collect()
    }

    /// The pool's `status.ipv4.conflicts` map.
    pub fn status_conflicts(&self) -> BTreeMap<String, AddressConflict> {
        self.conflicts
            .iter()
            .map(|(n, c)| (A::from_int(*n).to_string(), c.clone()))
            .collect()
    }

    /// How many addresses the pool records as in conflict because `host` answers for them.
    pub fn conflicts_held_by(&self, host: &str) -> usize {
        self.conflicts
            .values()
            .filter(|c| c.answered_by.eq_ignore_ascii_case(host))
            .count()
    }

    /// The conflict recorded on `ip`, if another host was found using it.
    pub fn conflict(&self, ip: A) -> Option<&AddressConflict> {
        self.conflicts.get(&ip.to_int())
    }

    /// Records that another host uses `ip`: it is not handed out again until
    /// [`PoolAllocator::clear_conflict`]. A NIC holding it keeps it here (the reconciler moves a
    /// dynamic one: [`PoolAllocator::release`] then leaves the address blocked). Returns whether
    /// the conflict is new; the pool's own markers (server, router, excluded) are never recorded.
    pub fn record_conflict(&mut self, ip: A, conflict: AddressConflict) -> Result<bool, IpamError> {
        if !self.in_range(ip) {
            return Err(IpamError::OutsideRange {
                pool: self.range.pool().clone(),
                ip: ip.into(),
                start: self.range.start().into(),
                end: self.range.end().into(),
            });
        }
        let n = ip.to_int();
        if self.conflicts.contains_key(&n)
            || matches!(
                self.taken.get(&n),
                Some(Slot::Held(Holder::Reserved | Holder::Excluded))
            )
        {
            return Ok(false);
        }
        if self.conflicts.len() >= MAX_CONFLICTS {
            return Err(IpamError::TooManyConflicts {
                pool: self.range.pool().clone(),
                ip: ip.into(),
            });
        }
        self.conflicts.insert(n, conflict);
        if self.is_free(n) {
            self.take(n, Slot::Conflicted);
        }
        Ok(true)
    }

    /// Ends the conflict on `ip` (a probe found it free): free again unless a NIC holds it.
    /// Returns whether there was one.
    pub fn clear_conflict(&mut self, ip: A) -> bool {
        let n = ip.to_int();
        if self.conflicts.remove(&n).is_none() {
            return false;
        }
        if self.taken.get(&n) == Some(&Slot::Conflicted) {
            self.give_back(n);
        }
        true
    }

    /// Replays `status.ipv4.conflicts` after [`PoolAllocator::rebuild`]; entries that cannot be
    /// are returned (an unreadable key blocks nothing: it names no address).
    pub fn restore_conflicts(
        &mut self,
        conflicts: &BTreeMap<String, AddressConflict>,
    ) -> Vec<IpamError> {
        let pool = self.range.pool().clone();
        let mut problems = Vec::new();
        for (key, conflict) in conflicts {
            let recorded = key
                .parse::<A>()
                .map_err(|_| format!("not an {} address", A::NAME))
                .and_then(|ip| {
                    self.record_conflict(ip, conflict.clone())
                        .map_err(|e| e.to_string())
                });
            if let Err(reason) = recorded {
                problems.push(IpamError::StatusEntry {
                    pool: pool.clone(),
                    ip: key.clone(),
                    value: format!("conflict with {}", conflict.answered_by),
                    reason,
                });
            }
        }
        problems
    }

    /// Why `ip` may not be used, when a conflict is recorded on it: "in use by another host
    /// (<MAC> answers ARP for it)" (NDP for IPv6), the words of refusals, events and conditions
    /// alike.
    pub fn conflict_reason(&self, ip: A) -> Option<String> {
        self.conflict(ip).map(|c| {
            format!(
                "in use by another host ({} answers {} for it)",
                c.answered_by,
                A::RESOLUTION
            )
        })
    }
}

/// Records `value` for the address `n` in `beside` (`None`: forgets it) when a MAC holds that
/// address; returns whether that changed. What the books keep beside a NIC's address, its host
/// name and its own DHCP options, is kept this one way.
fn set_beside_holder<K: Ord + std::hash::Hash + Copy, V: PartialEq>(
    taken: &BTreeMap<K, Slot>,
    beside: &mut HashMap<K, V>,
    n: K,
    value: Option<V>,
) -> bool {
    if !matches!(taken.get(&n), Some(Slot::Held(Holder::Mac(_)))) {
        return false;
    }
    match value {
        Some(v) if beside.get(&n) != Some(&v) => {
            beside.insert(n, v);
            true
        }
        Some(_) => false,
        None => beside.remove(&n).is_some(),
    }
}
