//! The pool-status writer: the IPAM's books of a pool, both families, into its status, one
//! write covering every allocation made before it, other writers' entries kept.

use super::*;

/// Puts the IPAM's books of one pool, both families, into an IPPool status (one write carries
/// `status.ipv4` and, on a dual-stack pool, `status.ipv6`, so the two never disagree in etcd;
/// a pool without IPv6 books has no `status.ipv6`). The holders' host names go in only when
/// the pool sends them (`spec`'s `sendHostName`). Recorded always, they would make every write
/// of a full pool much larger (docs/tuning.md) for a field nobody reads while it is off;
/// turning it on (or off) is one write of the pool, made by its reconcile, and the IPAM keeps
/// the names meanwhile (each config's reconcile sets them).
///
/// `recorded`: the status of the version the write replaces, when this IPAM did not write
/// that version itself; its `allocated` entries that the books do not hold are kept
/// ([`Foreign`]), never overwritten, and the plans are returned for [`PoolAllocator::settle`]
/// once written.
///
/// [`PoolAllocator::settle`]: crate::ipam::PoolAllocator::settle
pub fn fill_books(
    ipam: &Ipam,
    pool: &NamespacedName,
    spec: &IPPoolSpec,
    recorded: Option<&IPPoolStatus>,
    status: &mut IPPoolStatus,
) -> Result<Filled, StatusError> {
    let names = spec.ipv4_config.send_host_name == Some(true);
    let (filled, v4, v6) = ipam.with_books(pool, |books| {
        let recorded_v4 = recorded.and_then(|s| s.ipv4.as_ref()).map(|r| &r.allocated);
        let (v4, allocated) = FamilyFill::fill(&books.v4, recorded_v4);
        let v4_status = IPv4Status {
            allocated,
            used: v4.used_i64(),
            available: v4.available_i64(),
            conflicts: books.v4.status_conflicts(),
            host_names: if names {
                books.v4.status_host_names()
            } else {
                BTreeMap::new()
            },
            dhcp_options: books.v4.status_nic_options(),
        };
        let (v6, v6_status) = match &books.v6 {
            None => (None, None),
            Some(a6) => {
                let recorded_v6 = recorded.and_then(|s| s.ipv6.as_ref()).map(|r| &r.allocated);
                let (v6, allocated) = FamilyFill::fill(a6, recorded_v6);
                let status = IPv6Status {
                    allocated,
                    used: v6.used_i64(),
                    available: v6.available_i64(),
                    conflicts: a6.status_conflicts(),
                };
                (Some(v6), Some(status))
            }
        };
        (Filled { v4, v6 }, v4_status, v6_status)
    })?;
    status.ipv4 = Some(v4);
    status.ipv6 = v6;
    Ok(filled)
}

/// What [`fill_books`] wrote of both families' books.
#[derive(Debug, Default)]
pub struct Filled {
    /// The IPv4 books.
    pub v4: FamilyFill<Ipv4Addr>,
    /// The IPv6 books of a dual-stack pool.
    pub v6: Option<FamilyFill<Ipv6Addr>>,
}

impl Filled {
    /// Once the write is recorded: applies each family's plan to its books
    /// ([`PoolAllocator::settle`]); returns the MACs whose unrecorded address was withdrawn.
    fn settle(&self, books: &mut PoolBooks) -> Vec<MacAddr> {
        let mut withdrawn = books.v4.settle(&self.v4.plan, self.v4.upto);
        if let (Some(a6), Some(f6)) = (books.v6.as_mut(), self.v6.as_ref()) {
            withdrawn.extend(a6.settle(&f6.plan, f6.upto));
        }
        withdrawn
    }
}

/// What [`fill_books`] wrote of one family's books.
#[derive(Debug)]
pub struct FamilyFill<A: vmdhcp_core::pool::Family> {
    /// Addresses used, as written.
    pub used: u64,
    /// Addresses available, as written.
    pub available: u64,
    /// Other writers' entries kept.
    pub plan: Vec<Foreign<A>>,
    /// The books' change number the write covers.
    pub upto: u64,
}

impl<A: vmdhcp_core::pool::Family> Default for FamilyFill<A> {
    fn default() -> Self {
        FamilyFill {
            used: 0,
            available: 0,
            plan: Vec::new(),
            upto: 0,
        }
    }
}

impl<A: vmdhcp_core::pool::Family> FamilyFill<A> {
    /// One family's `allocated` map as a write puts it, and what that write covers: the books,
    /// plus the entries of `recorded` (another writer's version) they do not hold
    /// ([`PoolAllocator::foreign`]), counted as used when adopted.
    fn fill(
        a: &PoolAllocator<A>,
        recorded: Option<&BTreeMap<String, String>>,
    ) -> (Self, BTreeMap<String, String>) {
        let plan = recorded.map(|r| a.foreign(r)).unwrap_or_default();
        let adopted = plan
            .iter()
            .filter(|f| matches!(f, Foreign::Adopted { .. }))
            .count() as u64;
        let allocated = a.status_allocated_with(&plan);
        let filled = FamilyFill {
            used: a.used() + adopted,
            available: a.available().saturating_sub(adopted),
            plan,
            upto: a.changes(),
        };
        (filled, allocated)
    }

    fn used_i64(&self) -> i64 {
        i64::try_from(self.used).unwrap_or(i64::MAX)
    }

    fn available_i64(&self) -> i64 {
        i64::try_from(self.available).unwrap_or(i64::MAX)
    }
}

/// Other writers' entries a status write kept, by family, for the caller to report.
#[derive(Debug, Default)]
pub struct Kept {
    /// From `status.ipv4.allocated`.
    pub v4: Vec<Foreign>,
    /// From `status.ipv6.allocated`.
    pub v6: Vec<Foreign<Ipv6Addr>>,
}

#[derive(Default)]
pub(super) struct Tickets {
    issued: u64,
    written: u64,
}

/// One pool's tickets and the lock its writer holds.
#[derive(Default)]
pub(super) struct Slot {
    tickets: Mutex<Tickets>,
    pub(super) writing: tokio::sync::Mutex<()>,
    pub(super) written: Mutex<Written>,
    /// The pool as the write in flight sends it: its watch event may arrive before the
    /// response that tells its resourceVersion.
    sending: Mutex<Option<Arc<IPPool>>>,
}

/// What one pool's writer knows of its own writes.
#[derive(Default)]
pub(super) struct Written {
    /// The pool as our last write left it.
    pub(super) last: Option<Arc<IPPool>>,
    /// Our latest writes (at most [`OWN_VERSIONS`], newest last): the resourceVersion each
    /// replaced, and the one it made.
    pub(super) versions: VecDeque<(String, String)>,
}

impl Written {
    /// Records a write from version `base` to `made`.
    pub(super) fn record(&mut self, base: String, made: String) {
        if self.versions.len() == OWN_VERSIONS {
            self.versions.pop_front();
        }
        self.versions.push_back((base, made));
    }

    /// Whether `version` is one our writes made.
    pub(super) fn made(&self, version: &str) -> bool {
        self.versions.iter().any(|(_, made)| made == version)
    }

    /// Where the next write starts: from our last write, whatever the cache shows; from the
    /// cache only before our first. The cache trails our writes (under a burst they follow each
    /// other faster than the watch brings them back, and an API server short of CPU delivers
    /// them late), and starting from it costs a conflict and a re-read each time, each conflict
    /// adding load to an API server that is already late (docs/tuning.md). A write by
    /// someone else (rare: an operator's edit, the pool reconcile's writes without books for a
    /// paused or refused pool) costs one conflict and re-read instead.
    ///
    /// Also returns whether the start is known to be the pool's latest version as far as the
    /// cache can tell: the cache shows nothing, our last write, or a version our writes made or
    /// replaced. Otherwise (someone else's write, or one of ours older than we remember) the
    /// start may trail, and finding nothing to change there proves nothing.
    pub(super) fn start(&self, cached: Option<&str>) -> Option<(&Arc<IPPool>, bool)> {
        let last = self.last.as_ref()?;
        let known = cached.is_none_or(|v| {
            last.metadata.resource_version.as_deref() == Some(v)
                || self
                    .versions
                    .iter()
                    .any(|(base, made)| base == v || made == v)
        });
        Some((last, known))
    }
}

/// Batches IPAM → `IPPool.status` writes per pool (see the module docs).
pub struct PoolStatusWriter {
    tickets: Mutex<HashMap<NamespacedName, Arc<Slot>>>,
    metrics: Arc<Metrics>,
}

impl PoolStatusWriter {
    /// A writer that keeps `metrics`' pool gauges at what it writes.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        PoolStatusWriter {
            tickets: Mutex::default(),
            metrics,
        }
    }

    /// Whether `pool`, as a watch event shows it, is the result of one of this writer's recent
    /// writes: its status is the IPAM's books (and the reconcile's conditions) and nothing else
    /// changed, so there is nothing for the pool's reconcile to look at again.
    pub fn wrote(&self, pool: &IPPool) -> bool {
        let (Some(version), Some(pool_ref)) =
            (pool.resource_version(), crate::kinds::object_ref(pool))
        else {
            return false;
        };
        let slot = self.tickets.lock().get(&pool_ref).cloned();
        slot.is_some_and(|slot| {
            let sending = slot.sending.lock();
            sending
                .as_ref()
                .is_some_and(|sent| same_to_reconcile(sent, pool))
                || slot.written.lock().made(&version)
        })
    }

    pub(super) fn slot(&self, pool: &NamespacedName) -> Arc<Slot> {
        let mut map = self.tickets.lock();
        map.entry(pool.clone()).or_default().clone()
    }

    /// Records in etcd every IPAM change made to `pool` before this call. Returns once a write
    /// that covers them has succeeded (possibly another caller's), with the other writers'
    /// entries this call's write kept ([`Foreign`], for the caller to report; counted here).
    /// An address given before this call may have been withdrawn by such a write (the record
    /// held it first): callers check the IPAM still holds what they tell anyone.
    pub async fn persist(
        &self,
        client: &Client,
        cache: Option<&Store<IPPool>>,
        ipam: &Ipam,
        pool: &NamespacedName,
    ) -> Result<Kept, StatusError> {
        self.write(client, cache, ipam, pool, None::<fn(&mut IPPoolStatus)>)
            .await
    }

    /// As [`PoolStatusWriter::persist`], with `also` applied in the same write (the pool
    /// reconcile's conditions), which is always made. The pool's own reconcile writes through
    /// here rather than beside it: it is woken by every status write, and as a second writer it
    /// would race the allocations' writes (conflicts, and a write of the same books each time)
    /// instead of covering their tickets.
    pub async fn persist_with(
        &self,
        client: &Client,
        cache: Option<&Store<IPPool>>,
        ipam: &Ipam,
        pool: &NamespacedName,
        also: impl FnMut(&mut IPPoolStatus),
    ) -> Result<Kept, StatusError> {
        self.write(client, cache, ipam, pool, Some(also)).await
    }

    async fn write(
        &self,
        client: &Client,
        cache: Option<&Store<IPPool>>,
        ipam: &Ipam,
        pool: &NamespacedName,
        mut also: Option<impl FnMut(&mut IPPoolStatus)>,
    ) -> Result<Kept, StatusError> {
        let slot = self.slot(pool);
        let ticket = {
            let mut t = slot.tickets.lock();
            t.issued += 1;
            t.issued
        };
        let _writer = slot.writing.lock().await;
        let covering = {
            let t = slot.tickets.lock();
            if also.is_none() && t.written >= ticket {
                return Ok(Kept::default());
            }
            t.issued
        };
        let cached = cache.and_then(|s| s.get(&store_key(pool)));
        let seen = cached.as_ref().and_then(|o| o.resource_version());
        // `ours`: the version our last write made, which holds nothing foreign; any other (the
        // cache's, a re-read after a conflict) may hold another writer's entries, and they are
        // kept.
        let (start, trusted, ours) = {
            let written = slot.written.lock();
            let ours = written.last.as_ref().and_then(|p| p.resource_version());
            match written.start(seen.as_deref()) {
                Some((last, known)) => (Some(Arc::clone(last)), known, ours),
                None => (cached, true, ours),
            }
        };
        debug!(
            %pool,
            cached = seen.as_deref().unwrap_or_default(),
            from = start.as_ref().and_then(|p| p.metadata.resource_version.as_deref()).unwrap_or_default(),
            trusted,
            "writing pool status"
        );
        let mut filled = None;
        let mut base = None;
        // As the watch will show it: what is sent comes back unchanged (the timestamps the
        // status gets are whole seconds, as JSON keeps them; see the test of `now`).
        let sending = |sent: &Arc<IPPool>| {
            base = sent.resource_version();
            *slot.sending.lock() = Some(Arc::clone(sent));
        };
        let edit = |current: &IPPool, status: &mut IPPoolStatus| {
            if let Some(also) = also.as_mut() {
                also(status);
            }
            let recorded = current
                .status
                .as_ref()
                .filter(|_| current.metadata.resource_version != ours);
            filled = Some(fill_books(ipam, pool, &current.spec, recorded, status)?);
            Ok(())
        };
        let result =
            update_pool_status_from(client, start, trusted, true, pool, edit, sending).await;
        // The version our write made is known before the object sent is let go, so its watch
        // event is recognised by one or the other throughout. (Not under one lock: `wrote`
        // takes `sending`, then `written`.)
        if let (Ok(Outcome::Written(_, made)), Some(base)) = (&result, base) {
            slot.written.lock().record(base, made.clone());
        }
        *slot.sending.lock() = None;
        let written = result?.into_pool();
        let mut kept = Kept::default();
        if let Some(filled) = filled {
            let key = pool.to_string();
            let withdrawn = ipam.with_books(pool, |books| filled.settle(books))?;
            let (v4, v6) = (filled.v4, filled.v6);
            self.metrics.set_pool_counts(&key, v4.used, v4.available);
            for entry in &v4.plan {
                self.metrics.foreign_entry(&key, entry.outcome());
                warn!(%pool, %entry, "pool status held another writer's entry");
            }
            for entry in v6.iter().flat_map(|f| &f.plan) {
                self.metrics.foreign_entry(&key, entry.outcome());
                warn!(%pool, %entry, "pool status held another writer's IPv6 entry");
            }
            if !withdrawn.is_empty() {
                warn!(%pool, ?withdrawn, "unrecorded allocations withdrawn: the record held their addresses first");
            }
            kept = Kept {
                v4: v4.plan,
                v6: v6.map(|f| f.plan).unwrap_or_default(),
            };
        }
        slot.written.lock().last = Some(written);
        let mut t = slot.tickets.lock();
        t.written = t.written.max(covering);
        Ok(kept)
    }

    /// Has `pool`'s next write start from `record`, the version of record its books were just
    /// built from (a term's first build): not from a cache that may trail that read, whose
    /// entries the books no longer hold (the last term's releases) would be taken for another
    /// writer's and kept.
    pub fn built_from(&self, pool: &NamespacedName, record: Arc<IPPool>) {
        self.slot(pool).written.lock().last = Some(record);
    }

    /// Runs `rebuild` (a read of record and the books built from it) while no write of `pool`
    /// is in flight, and has the next write start from the version it read
    /// ([`PoolStatusWriter::built_from`]). Beside a write, an allocation recorded between the
    /// read and the swap of the books would be missing from the new books while this writer's
    /// last write holds it, and the next write, starting from that version as its own, would
    /// drop the entry and free the address for another MAC while agents still serve it.
    pub async fn rebuild<T, E>(
        &self,
        pool: &NamespacedName,
        rebuild: impl AsyncFnOnce() -> Result<(Arc<IPPool>, T), E>,
    ) -> Result<T, E> {
        let slot = self.slot(pool);
        let _writer = slot.writing.lock().await;
        let (record, out) = rebuild().await?;
        slot.written.lock().last = Some(record);
        Ok(out)
    }

    /// Forgets a pool's tickets (it was deleted).
    pub fn forget(&self, pool: &NamespacedName) {
        self.tickets.lock().remove(pool);
    }
}

/// Whether two versions of a pool are the same for its reconcile: the same spec, status,
/// finalizers and deletion (labels, annotations and the version itself aside).
pub(super) fn same_to_reconcile(a: &IPPool, b: &IPPool) -> bool {
    let (ma, mb) = (&a.metadata, &b.metadata);
    ma.generation == mb.generation
        && ma.finalizers == mb.finalizers
        && ma.deletion_timestamp == mb.deletion_timestamp
        && a.spec == b.spec
        && a.status == b.status
}
