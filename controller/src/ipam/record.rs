//! The books and the record: an allocator rebuilt from a pool's recorded `allocated` map, and
//! what a write does with another writer's version of it (adopt, keep ours, withdraw ours,
//! keep verbatim), settled once the write is recorded.

use super::*;

/// An entry of a pool's recorded `status.ipv4.allocated` that differs from this allocator's
/// books and is not one of its own unrecorded releases: another writer's (upstream's Go
/// controller during a migration, a second release, a hand edit) or a write this replica's
/// caches never showed it. What the next write does with it; nothing is dropped unreported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Foreign<A = Ipv4Addr> {
    /// Nobody holds the address here: it is taken for the recorded holder.
    Adopted {
        /// The address.
        ip: A,
        /// The recorded value (a MAC, or a marker kept as written).
        value: String,
    },
    /// The address is held here by `ours`, recorded before the other writer's entry: ours
    /// stays and the other is reported (two MACs were told the same address at most once:
    /// ours first).
    KeptOurs {
        /// The address.
        ip: A,
        /// Our holder's value.
        ours: String,
        /// The other writer's value.
        theirs: String,
    },
    /// The address was given here to `ours` but not yet recorded, and the record names
    /// `theirs`: the record came first, so ours is withdrawn before anyone is told of it and
    /// its config allocates again.
    Withdrew {
        /// The address.
        ip: A,
        /// The MAC that loses it.
        ours: MacAddr,
        /// The recorded value that keeps it.
        theirs: String,
    },
    /// The entry names no address of the range: kept in the status as it is, never served.
    Verbatim {
        /// The recorded key.
        key: String,
        /// The recorded value.
        value: String,
    },
}

impl<A: Family> Foreign<A> {
    /// A short name for metrics: `adopted`, `kept_ours`, `withdrew_ours`, `verbatim`.
    pub fn outcome(&self) -> &'static str {
        match self {
            Foreign::Adopted { .. } => "adopted",
            Foreign::KeptOurs { .. } => "kept_ours",
            Foreign::Withdrew { .. } => "withdrew_ours",
            Foreign::Verbatim { .. } => "verbatim",
        }
    }

    /// Whether this is two holders of one address (a Warning to operators), not an adoption.
    pub fn is_collision(&self) -> bool {
        matches!(self, Foreign::KeptOurs { .. } | Foreign::Withdrew { .. })
    }

    /// The address and the recorded value the write keeps for it, when the record's holder
    /// keeps it (adopted, or ours withdrawn).
    pub(super) fn recorded_holder(&self) -> Option<(A, &String)> {
        match self {
            Foreign::Adopted { ip, value }
            | Foreign::Withdrew {
                ip, theirs: value, ..
            } => Some((*ip, value)),
            Foreign::KeptOurs { .. } | Foreign::Verbatim { .. } => None,
        }
    }
}

impl<A: Family> std::fmt::Display for Foreign<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Foreign::Adopted { ip, value } => {
                write!(f, "{ip} recorded for {value} by another writer: adopted")
            }
            Foreign::KeptOurs { ip, ours, theirs } => write!(
                f,
                "{ip} recorded for {theirs} by another writer, but {ours} held it first: {ours} keeps it"
            ),
            Foreign::Withdrew { ip, ours, theirs } => write!(
                f,
                "{ip} recorded for {theirs} by another writer before {ours} was recorded: {theirs} keeps it, {ours} is allocated again"
            ),
            Foreign::Verbatim { key, value } => write!(
                f,
                "entry {key}={value} recorded by another writer names no address of the range: kept as written"
            ),
        }
    }
}

impl<A: Family> PoolAllocator<A> {
    /// Rebuilds a pool from its spec and its recorded `status.ipv4.allocated`, giving exactly the
    /// state that produced that status. Entries that cannot be replayed as recorded are returned;
    /// their addresses stay blocked (an unreadable or conflicting record still means "taken"),
    /// and what no address of the books can hold (a key outside the range or not an address, a
    /// MAC on an address the spec now reserves or excludes) is kept verbatim: every later write
    /// records it as it was, so a rebuild never erases what another writer (or an older spec)
    /// recorded.
    pub fn rebuild(
        range: PoolRange<A>,
        allocated: &BTreeMap<String, String>,
    ) -> (Self, Vec<IpamError>) {
        let mut alloc = Self::new(range);
        let pool = alloc.range.pool().clone();
        let (entries, unreadable) = parse_allocated::<A>(&pool, allocated);
        let mut problems = Vec::new();
        let entry_err = |ip: &str, value: &str, reason: String| IpamError::StatusEntry {
            pool: pool.clone(),
            ip: ip.to_owned(),
            value: value.to_owned(),
            reason,
        };
        for err in unreadable {
            if let vmdhcp_core::pool::PoolError::InvalidAllocation {
                ip, value, reason, ..
            } = err
            {
                if let Ok(addr) = ip.parse::<A>()
                    && alloc.in_range(addr)
                    && alloc.is_free(addr.to_int())
                {
                    alloc.take(addr.to_int(), Slot::Unreadable(value.clone()));
                } else {
                    alloc.verbatim.insert(ip.clone(), value.clone());
                }
                problems.push(entry_err(&ip, &value, reason));
            }
        }
        for (ip, holder) in entries {
            let key = ip.to_string();
            // As recorded, where it cannot be held as it is (a MAC's case kept, say).
            let value = allocated
                .get(&key)
                .cloned()
                .unwrap_or_else(|| holder.as_status_value());
            if !alloc.in_range(ip) {
                if holder != Holder::Excluded && holder != Holder::Reserved {
                    problems.push(entry_err(&key, &value, "outside the pool range".into()));
                    alloc.verbatim.insert(key, value);
                }
                continue;
            }
            let n = ip.to_int();
            match (&holder, alloc.taken.get(&n)) {
                (_, None) => match holder {
                    Holder::Mac(mac) if alloc.by_mac.contains_key(&mac) => {
                        // Recorded twice: keep blocking the second address, report it.
                        alloc.take(n, Slot::Unreadable(value.clone()));
                        problems.push(entry_err(
                            &key,
                            &value,
                            format!("{mac} is recorded at more than one address"),
                        ));
                    }
                    _ => alloc.take(n, Slot::Held(holder)),
                },
                (_, Some(Slot::Held(existing))) if *existing == holder => {}
                (Holder::Reserved | Holder::Excluded, Some(_)) => {}
                (Holder::Mac(_), Some(_)) => {
                    problems.push(entry_err(
                        &key,
                        &value,
                        "address is reserved or excluded by the pool spec".into(),
                    ));
                    alloc.verbatim.insert(key, value);
                }
            }
        }
        (alloc, problems)
    }

    pub(super) fn note_given(&mut self, n: A::Int) {
        self.unrecorded.seq += 1;
        self.unrecorded.given.insert(n, self.unrecorded.seq);
    }

    pub(super) fn note_freed(&mut self, n: A::Int, value: String) {
        self.unrecorded.seq += 1;
        self.unrecorded.given.remove(&n);
        self.unrecorded
            .freed
            .insert(n, (value, self.unrecorded.seq));
    }

    /// Whether `ip` was given here and no write has recorded it yet. A reconcile that finds
    /// its NIC already holding such an address (an earlier reconcile's write failed) records it
    /// before telling anyone, as it would a new one: the next write may find that another
    /// writer recorded the address first, and withdraw it.
    pub fn is_unrecorded(&self, ip: A) -> bool {
        self.unrecorded.given.contains_key(&ip.to_int())
    }

    /// The number of the latest change to the books: a write that records them as they stand
    /// now covers every change up to it ([`PoolAllocator::settle`]).
    pub fn changes(&self) -> u64 {
        self.unrecorded.seq
    }

    /// What to do with each entry of `recorded` (a version of the pool's `allocated` map this
    /// allocator did not write) that differs from the books, leaving out this allocator's own
    /// releases not yet recorded. Changes nothing: a write that fails changes nothing either;
    /// [`PoolAllocator::status_allocated_with`] writes the plan, [`PoolAllocator::settle`]
    /// applies it once written.
    pub fn foreign(&self, recorded: &BTreeMap<String, String>) -> Vec<Foreign<A>> {
        let mut plan = Vec::new();
        for (key, value) in recorded {
            // Kept as recorded already (see `rebuild`): nothing new.
            if self.verbatim.get(key) == Some(value) {
                continue;
            }
            let parsed = key.parse::<A>().ok().filter(|ip| self.in_range(*ip));
            let Some(ip) = parsed else {
                if self.verbatim.get(key) != Some(value) {
                    plan.push(Foreign::Verbatim {
                        key: key.clone(),
                        value: value.clone(),
                    });
                }
                continue;
            };
            let n = ip.to_int();
            let theirs = Holder::parse(value).ok();
            let same = match self.taken.get(&n) {
                Some(Slot::Held(h)) => theirs.as_ref() == Some(h),
                Some(Slot::Unreadable(v)) => v == value,
                Some(Slot::Conflicted) | None => false,
            };
            let released_here = self.unrecorded.freed.get(&n).is_some_and(|(v, _)| {
                v == value || (theirs.is_some() && Holder::parse(v).ok() == theirs)
            });
            if same || released_here {
                continue;
            }
            plan.push(match self.taken.get(&n) {
                Some(Slot::Held(Holder::Mac(ours))) if self.unrecorded.given.contains_key(&n) => {
                    Foreign::Withdrew {
                        ip,
                        ours: *ours,
                        theirs: value.clone(),
                    }
                }
                Some(Slot::Held(h)) => Foreign::KeptOurs {
                    ip,
                    ours: h.as_status_value(),
                    theirs: value.clone(),
                },
                Some(Slot::Unreadable(v)) => Foreign::KeptOurs {
                    ip,
                    ours: v.clone(),
                    theirs: value.clone(),
                },
                Some(Slot::Conflicted) | None => Foreign::Adopted {
                    ip,
                    value: value.clone(),
                },
            });
        }
        plan
    }

    /// [`PoolAllocator::status_allocated`] with `plan` ([`PoolAllocator::foreign`]) applied:
    /// adopted and verbatim entries added, withdrawn addresses under the record's holder.
    pub fn status_allocated_with(&self, plan: &[Foreign<A>]) -> BTreeMap<String, String> {
        let mut allocated = self.status_allocated();
        for entry in plan {
            if let Some((ip, value)) = entry.recorded_holder() {
                allocated.insert(ip.to_string(), value.clone());
            } else if let Foreign::Verbatim { key, value } = entry {
                allocated.insert(key.clone(), value.clone());
            }
        }
        allocated
    }

    /// Once a write of [`PoolAllocator::status_allocated_with`]`(plan)`, made when the books
    /// stood at change `upto`, is recorded: applies `plan` to the books (an address adopted
    /// since given here unrecorded is withdrawn from ours: the record holds it) and forgets the
    /// changes up to `upto`. Returns the MACs whose unrecorded address was withdrawn.
    pub fn settle(&mut self, plan: &[Foreign<A>], upto: u64) -> Vec<MacAddr> {
        let mut withdrawn = Vec::new();
        for entry in plan {
            if let Foreign::Verbatim { key, value } = entry {
                self.verbatim.insert(key.clone(), value.clone());
            }
            let Some((ip, value)) = entry.recorded_holder() else {
                continue;
            };
            let n = ip.to_int();
            if let Some(Slot::Held(Holder::Mac(ours))) = self.taken.get(&n) {
                let ours = *ours;
                if Holder::parse(value).ok() == Some(Holder::Mac(ours)) {
                    continue;
                }
                if !self.unrecorded.given.contains_key(&n) {
                    // Recorded by us since the plan was made: ours stays.
                    continue;
                }
                self.unrecorded.given.remove(&n);
                self.give_back(n);
                withdrawn.push(ours);
            }
            // A MAC held here at another address, or a marker the spec does not
            // make: blocked and written back as recorded.
            let slot = match Holder::parse(value) {
                Ok(Holder::Mac(mac)) if !self.by_mac.contains_key(&mac) => {
                    Slot::Held(Holder::Mac(mac))
                }
                _ => Slot::Unreadable(value.clone()),
            };
            match self.taken.get(&n) {
                Some(Slot::Conflicted) => {
                    self.taken.remove(&n);
                    self.hold(n, slot);
                }
                None if self.is_free(n) => self.take(n, slot),
                _ => {}
            }
        }
        let u = &mut self.unrecorded;
        u.given.retain(|_, seq| *seq > upto);
        u.freed.retain(|_, (_, seq)| *seq > upto);
        withdrawn
    }
}
