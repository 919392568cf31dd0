//! Writing status: conditions in upstream's (wrangler) shape, and the pool-status writer that
//! puts the IPAM's books into `IPPool.status.ipv4`.
//!
//! Every allocation must be recorded in etcd before anyone is told about it, and many
//! allocations land on one pool at once (500 VMs created together). [`PoolStatusWriter::persist`]
//! batches them: callers take a ticket after changing the IPAM, one of them writes the pool's
//! whole `allocated` map as it stands (covering every ticket taken so far), and the others find
//! their ticket already covered. Writes carry the object's `resourceVersion` and start from the
//! pool as the writer's own last write left it (the cache only before its first); a conflict
//! (someone else wrote meanwhile) re-reads the pool and writes again, and so does finding
//! nothing to change on a start the cache cannot confirm is the latest.
//!
//! The writer also remembers the resourceVersions its writes produced
//! ([`PoolStatusWriter::wrote`]): the pool controller drops the watch events of those writes
//! instead of reconciling the pool once per allocation, and the writer keeps the pool's gauges
//! current itself.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};
use std::net::{Ipv4Addr, Ipv6Addr};
use tracing::{debug, warn};
use vmdhcp_core::crd::{Condition, IPPool, IPPoolSpec, IPPoolStatus, IPv4Status, IPv6Status};
use vmdhcp_core::{MacAddr, NamespacedName};

use crate::ipam::{Foreign, Ipam, IpamError, PoolAllocator, PoolBooks};
use crate::kinds::store_key;
use crate::metrics::Metrics;
use crate::reconcile::versioned;

mod writer;

pub use writer::{FamilyFill, Filled, Kept, PoolStatusWriter, fill_books};

/// How many times a status write is retried after a conflict.
const CONFLICT_RETRIES: usize = 8;

/// How many of its own writes' resourceVersions the writer remembers per pool, to know their
/// watch events for its own. The watch usually brings a write back within milliseconds, but an
/// API server short of CPU can deliver the pools' events several writes late (docs/tuning.md);
/// a version that fell out costs one needless reconcile of the pool.
const OWN_VERSIONS: usize = 32;

/// Why a status could not be written.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The API refused or failed the write.
    #[error("writing status of IPPool {pool}: {source}")]
    Api {
        /// The pool.
        pool: NamespacedName,
        /// The API error.
        source: kube::Error,
    },
    /// The pool's allocator is gone (paused or deleted meanwhile).
    #[error(transparent)]
    Ipam(#[from] IpamError),
    /// A write succeeded but its response carries no resourceVersion to continue from.
    #[error("IPPool {pool}: the status write's response has no resourceVersion")]
    Unversioned {
        /// The pool.
        pool: NamespacedName,
    },
    /// Too many conflicting writers.
    #[error("IPPool {pool}: status still conflicting after {CONFLICT_RETRIES} attempts")]
    Conflicts {
        /// The pool.
        pool: NamespacedName,
    },
}

/// A condition as a reconciler wants it to read. [`Wanted::apply`] sets it with the times
/// [`set_condition`] gives, so the reconcilers state what, never when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    /// The condition's type (`Registered`, `Allocated`, …).
    pub type_: &'static str,
    /// True or False.
    pub status: bool,
    /// A CamelCase reason; empty for none.
    pub reason: &'static str,
    /// A sentence for people; empty for none.
    pub message: String,
}

impl Wanted {
    /// `type_` with `status`, no reason and no message.
    pub fn new(type_: &'static str, status: bool) -> Self {
        Wanted {
            type_,
            status,
            reason: "",
            message: String::new(),
        }
    }

    /// The same condition with a reason and a message.
    pub fn because(self, reason: &'static str, message: impl Into<String>) -> Self {
        Wanted {
            reason,
            message: message.into(),
            ..self
        }
    }

    /// Sets it in `conditions`; returns whether anything changed.
    pub fn apply(&self, conditions: &mut Vec<Condition>) -> bool {
        set_condition(
            conditions,
            self.type_,
            self.status,
            self.reason,
            &self.message,
        )
    }
}

/// Sets condition `type_` in `conditions`: `lastUpdateTime` when its status, reason or message
/// changes, `lastTransitionTime` only when its status does (so a status rewritten unchanged
/// stays byte for byte what it was). Returns whether anything changed.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
) -> bool {
    // The time is formatted only when something changed: most calls (one per allocation, from
    // the config's status) find the condition as it was.
    let now = || Timestamp::now().to_string();
    let status = if status { "True" } else { "False" }.to_owned();
    let reason = Some(reason.to_owned()).filter(|r| !r.is_empty());
    let message = Some(message.to_owned()).filter(|m| !m.is_empty());
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            let changed = c.status != status || c.reason != reason || c.message != message;
            if changed {
                let now = now();
                if c.status != status {
                    c.last_transition_time = Some(now.clone());
                }
                c.last_update_time = Some(now);
            }
            c.status = status;
            c.reason = reason;
            c.message = message;
            changed
        }
        None => {
            let now = now();
            conditions.push(Condition {
                type_: type_.to_owned(),
                status,
                last_update_time: Some(now.clone()),
                last_transition_time: Some(now),
                reason,
                message,
            });
            true
        }
    }
}

/// The current time as a status timestamp, in whole seconds: what the API keeps of it (a
/// `Time` is written to the second), so a status holding it is the same before it is sent and
/// as its watch event shows it.
pub fn now() -> Time {
    let now = Timestamp::now();
    Time(Timestamp::from_second(now.as_second()).unwrap_or(now))
}

/// Writes IPPool status, read-modify-write with optimistic concurrency; starts from the cached
/// object (no GET) and re-reads only on conflict.
pub async fn update_pool_status(
    client: &Client,
    cache: Option<&Store<IPPool>>,
    pool: &NamespacedName,
    mut edit: impl FnMut(&mut IPPoolStatus) -> Result<(), StatusError>,
) -> Result<IPPool, StatusError> {
    let cached = cache.and_then(|s| s.get(&store_key(pool)));
    update_pool_status_from(
        client,
        cached,
        true,
        false,
        pool,
        |_: &IPPool, status: &mut IPPoolStatus| edit(status),
        |_| {},
    )
    .await
    .map(|outcome| Arc::unwrap_or_clone(outcome.into_pool()))
}

/// What a status update came to.
enum Outcome {
    /// Nothing to write: the pool as it stands.
    Unchanged(Arc<IPPool>),
    /// Written: the object sent, and the resourceVersion the write made.
    Written(Arc<IPPool>, String),
}

impl Outcome {
    /// The pool as etcd now holds it. Once the sent object is no longer shared (the writer
    /// lets go of its copy for the watch first), it becomes that without a copy.
    fn into_pool(self) -> Arc<IPPool> {
        match self {
            Outcome::Unchanged(pool) => pool,
            Outcome::Written(sent, version) => {
                let mut pool = Arc::unwrap_or_clone(sent);
                pool.metadata.resource_version = Some(version);
                Arc::new(pool)
            }
        }
    }
}

/// [`update_pool_status`] starting from `start` (the cached pool, or the writer's last write);
/// read from the API when there is none; `edit` sees the version it edits (a write from a
/// version whose spec has changed since conflicts and edits the latest). `trusted`:
/// whether `start` already holding the edit proves there is nothing to write (false: it may
/// trail someone else's write, and the pool is read again to decide). `refills_books`: `edit`
/// writes `ipv4` whole (the IPAM's books), so the start's is not copied for it. `sending` sees
/// each object just before it is sent.
async fn update_pool_status_from(
    client: &Client,
    start: Option<Arc<IPPool>>,
    mut trusted: bool,
    refills_books: bool,
    pool: &NamespacedName,
    mut edit: impl FnMut(&IPPool, &mut IPPoolStatus) -> Result<(), StatusError>,
    mut sending: impl FnMut(&Arc<IPPool>),
) -> Result<Outcome, StatusError> {
    let api: Api<IPPool> = Api::namespaced(client.clone(), &pool.namespace);
    let api_err = |source| StatusError::Api {
        pool: pool.clone(),
        source,
    };
    // Shared, not copied: a full pool's status is the largest thing the leader handles per
    // allocation, and a write needs it in three places (start, cache, sent).
    let mut current: Arc<IPPool> = match start {
        Some(obj) => obj,
        None => Arc::new(api.get_status(&pool.name).await.map_err(api_err)?),
    };
    for attempt in 0..CONFLICT_RETRIES {
        let mut status = to_edit(&current, refills_books);
        edit(&current, &mut status)?;
        if current.status.as_ref() == Some(&status) {
            if trusted {
                return Ok(Outcome::Unchanged(current));
            }
            debug!(%pool, attempt, "nothing to write on a version that may trail; re-reading");
            current = Arc::new(api.get_status(&pool.name).await.map_err(api_err)?);
            trusted = true;
            continue;
        }
        status.last_update = Some(now());
        let mut metadata = current.metadata.clone();
        // Left out, the API server keeps them as they are; nothing here reads them.
        metadata.managed_fields = None;
        let desired = Arc::new(IPPool {
            metadata,
            spec: current.spec.clone(),
            status: Some(status),
        });
        sending(&desired);
        match replace_status(client, &api, &pool.name, desired.as_ref()).await {
            Ok(Some(made)) => return Ok(Outcome::Written(desired, made)),
            Ok(None) => {
                return Err(StatusError::Unversioned { pool: pool.clone() });
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                debug!(%pool, attempt, sent = current.metadata.resource_version.as_deref().unwrap_or_default(), "status conflict; re-reading");
                current = Arc::new(api.get_status(&pool.name).await.map_err(api_err)?);
            }
            Err(e) => return Err(api_err(e)),
        }
    }
    Err(StatusError::Conflicts { pool: pool.clone() })
}

/// The status to edit: `current`'s, without its books when the edit writes them anew
/// (`refills_books`): copying a full pool's three maps only to replace them would be a cost
/// per allocation that grows with the pool.
fn to_edit(current: &IPPool, refills_books: bool) -> IPPoolStatus {
    match &current.status {
        None => IPPoolStatus::default(),
        Some(s) if refills_books => IPPoolStatus {
            last_update: s.last_update.clone(),
            ipv4: None,
            ipv6: None,
            agent_pod_ref: s.agent_pod_ref.clone(),
            conditions: s.conditions.clone(),
        },
        Some(s) => s.clone(),
    }
}

/// PUTs `pool`'s status and returns the resourceVersion the write made (`None`: the response
/// did not say). The written object is what was sent with that version (a status comes back
/// from JSON as it went in: see the test `a_status_as_written_comes_back_from_json_unchanged`;
/// the write's precondition is the version the rest was read at), so the response is asked for
/// as metadata alone ([`versioned`]): the API server encoding the whole pool, and the leader
/// decoding it, once per allocation, would be a cost that grows with the pool.
async fn replace_status(
    client: &Client,
    api: &Api<IPPool>,
    name: &str,
    pool: &IPPool,
) -> Result<Option<String>, kube::Error> {
    let body = serde_json::to_vec(pool).map_err(kube::Error::SerdeError)?;
    let request = kube::core::Request::new(api.resource_url()).replace_subresource(
        "status",
        name,
        &PostParams::default(),
        body,
    );
    versioned::send(client, request, "replace_status").await
}

#[cfg(test)]
mod tests {
    use super::writer::*;
    use super::*;
    use vmdhcp_core::pool::PoolRange;

    fn pool() -> NamespacedName {
        "default/net".parse().unwrap()
    }

    /// The IPv4 books of `pool()`: 10.0.0.10–20 of 10.0.0.0/24.
    fn range_v4() -> PoolRange {
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        PoolRange::new(
            pool(),
            "10.0.0.0/24".parse().unwrap(),
            (ip("10.0.0.10"), ip("10.0.0.20")),
            ip("10.0.0.2"),
            None,
            Vec::new(),
        )
        .unwrap()
    }

    #[test]
    fn host_names_are_written_only_while_the_pool_sends_them() {
        let pool = pool();
        let ipam = Ipam::new();
        ipam.insert(PoolAllocator::new(range_v4()));
        let mac = MacAddr([2, 0, 0, 0, 0, 1]);
        let held = ipam.allocate(&pool, mac).unwrap();
        ipam.with_pool(&pool, |a| a.set_host_name(held, Some("vm-1")))
            .unwrap();

        let mut spec = vmdhcp_core::crd::IPPoolSpec::default();
        let mut status = IPPoolStatus::default();
        let filled = fill_books(&ipam, &pool, &spec, None, &mut status).unwrap();
        assert_eq!((filled.v4.used, filled.v4.available), (1, 10));
        let v4 = status.ipv4.clone().unwrap();
        assert_eq!(
            v4.allocated.get("10.0.0.10").map(String::as_str),
            Some("02:00:00:00:00:01")
        );
        assert!(v4.host_names.is_empty(), "{v4:?}");

        spec.ipv4_config.send_host_name = Some(true);
        fill_books(&ipam, &pool, &spec, None, &mut status).unwrap();
        let v4 = status.ipv4.unwrap();
        assert_eq!(
            v4.host_names.get("10.0.0.10").map(String::as_str),
            Some("vm-1")
        );
    }

    /// A dual-stack pool's two families go out in one status; a pool without IPv6 books
    /// (IPv4-only, or one that lost its `ipv6Config`) has no `status.ipv6` at all.
    #[test]
    fn both_families_are_filled_by_one_write_and_ipv6_only_when_the_books_have_it() {
        let pool = pool();
        let ip6 = |s: &str| s.parse::<Ipv6Addr>().unwrap();
        let range6 = PoolRange::new_v6(
            pool.clone(),
            "fd00::/64".parse().unwrap(),
            (ip6("fd00::10"), ip6("fd00::ffff:ffff:ffff:ffff")),
            ip6("fd00::1"),
            None,
            Vec::new(),
        )
        .unwrap();
        let ipam = Ipam::new();
        ipam.insert_books(PoolBooks {
            v4: PoolAllocator::new(range_v4()),
            v6: Some(PoolAllocator::new(range6)),
        });
        let mac = MacAddr([2, 0, 0, 0, 0, 1]);
        ipam.with_books(&pool, |b| {
            b.v4.allocate(mac).unwrap();
            b.v6.as_mut().unwrap().allocate(mac).unwrap();
        })
        .unwrap();
        let spec = vmdhcp_core::crd::IPPoolSpec::default();
        let mut status = IPPoolStatus::default();
        let filled = fill_books(&ipam, &pool, &spec, None, &mut status).unwrap();
        let v6 = status.ipv6.clone().unwrap();
        assert_eq!(
            v6.allocated.get("fd00::10").map(String::as_str),
            Some("02:00:00:00:00:01")
        );
        // A range wider than the webhook allows costs nothing: intervals, not addresses.
        assert_eq!(v6.used, 1);
        assert_eq!(v6.available, i64::MAX);
        assert_eq!(filled.v6.map(|f| f.used), Some(1));
        assert!(status.ipv4.is_some());

        ipam.insert(PoolAllocator::new(range_v4()));
        fill_books(&ipam, &pool, &spec, None, &mut status).unwrap();
        assert_eq!(status.ipv6, None);
    }

    #[test]
    fn a_pool_is_the_same_to_its_reconcile_unless_spec_status_finalizers_or_deletion_differ() {
        let mut sent = IPPool::new("net", Default::default());
        sent.metadata.namespace = Some("default".into());
        sent.metadata.generation = Some(3);
        sent.metadata.finalizers = Some(vec!["vmdhcp".into()]);
        sent.status = Some(IPPoolStatus {
            last_update: Some(now()),
            ..Default::default()
        });
        // What the watch shows of the write: through JSON, with a new version and labels.
        let shown = |p: &IPPool| -> IPPool {
            serde_json::from_value(serde_json::to_value(p).unwrap()).unwrap()
        };
        let sent = shown(&sent);
        let mut event = shown(&sent);
        event.metadata.resource_version = Some("42".into());
        event.metadata.labels = Some([("a".to_owned(), "b".to_owned())].into());
        assert!(same_to_reconcile(&sent, &event));

        let differs = |edit: fn(&mut IPPool)| {
            let mut other = event.clone();
            edit(&mut other);
            !same_to_reconcile(&sent, &other)
        };
        assert!(differs(|p| p.metadata.generation = Some(4)));
        assert!(differs(|p| p.metadata.finalizers = None));
        assert!(differs(|p| p.metadata.deletion_timestamp = Some(now())));
        assert!(differs(|p| p.spec.paused = Some(true)));
        assert!(differs(|p| p.status = None));
    }

    /// The writer recognises its write's watch event by comparing it with what it sent, without
    /// passing what it sends through JSON first: a status as the writer makes it (books,
    /// conflicts, host names, conditions, its time) must come back from JSON unchanged.
    #[test]
    fn a_status_as_written_comes_back_from_json_unchanged() {
        let mut conditions = Vec::new();
        set_condition(&mut conditions, "CacheReady", true, "", "");
        set_condition(
            &mut conditions,
            "AgentReady",
            false,
            "NoAgent",
            "no agent serves it",
        );
        let full = IPPoolStatus {
            ipv6: None,
            last_update: Some(now()),
            ipv4: Some(IPv4Status {
                dhcp_options: Default::default(),
                allocated: [("10.0.0.2".to_owned(), "02:00:00:00:00:01".to_owned())].into(),
                used: 1,
                available: 250,
                conflicts: [(
                    "10.0.0.3".to_owned(),
                    vmdhcp_core::crd::AddressConflict {
                        mac_address: "02:00:00:00:00:02".into(),
                        answered_by: "02:00:00:00:00:09".into(),
                        source: "Probe".into(),
                        since: Some(now()),
                    },
                )]
                .into(),
                host_names: [("10.0.0.2".to_owned(), "vm1".to_owned())].into(),
            }),
            agent_pod_ref: None,
            conditions,
        };
        let empty = IPPoolStatus {
            last_update: Some(now()),
            ipv4: Some(IPv4Status::default()),
            ..Default::default()
        };
        for status in [full, empty] {
            let mut pool = IPPool::new("net", Default::default());
            pool.status = Some(status);
            let shown: IPPool =
                serde_json::from_value(serde_json::to_value(&pool).unwrap()).unwrap();
            assert!(same_to_reconcile(&pool, &shown), "{:?}", pool.status);
        }
    }

    /// The IPPool `net` at resourceVersion `v`.
    fn pool_at(v: &str) -> Arc<IPPool> {
        let mut p = IPPool::new("net", Default::default());
        p.metadata.namespace = Some("ns".into());
        p.metadata.resource_version = Some(v.into());
        Arc::new(p)
    }

    fn writer() -> PoolStatusWriter {
        PoolStatusWriter::new(Arc::new(Metrics::default()))
    }

    #[test]
    fn after_books_are_built_the_next_write_starts_from_their_version_of_record() {
        let (w, pool) = (writer(), "ns/net".parse().unwrap());
        // Nothing known: the cache, whatever it shows (before a term's books, no write starts).
        assert!(w.slot(&pool).written.lock().start(Some("3")).is_none());
        w.built_from(&pool, pool_at("5"));
        let start = |cached: Option<&str>| {
            w.slot(&pool)
                .written
                .lock()
                .start(cached)
                .map(|(p, known)| (p.resource_version().unwrap_or_default(), known))
        };
        // A cache trailing the read of record (the last term's releases not in it yet) is not
        // where the write starts, and nothing it shows is taken for another writer's.
        assert_eq!(start(Some("3")), Some(("5".into(), false)));
        assert_eq!(start(Some("5")), Some(("5".into(), true)));
        assert_eq!(start(None), Some(("5".into(), true)));
    }

    #[tokio::test]
    async fn a_rebuild_waits_for_the_write_in_flight_and_the_next_write_starts_from_its_read() {
        let (w, pool): (PoolStatusWriter, NamespacedName) = (writer(), "ns/net".parse().unwrap());
        let slot = w.slot(&pool);
        slot.written.lock().last = Some(pool_at("7"));
        let in_flight = slot.writing.lock().await;
        let read = std::sync::atomic::AtomicBool::new(false);
        let rebuild = w.rebuild(&pool, async || {
            read.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, ()>((pool_at("9"), ()))
        });
        let mut rebuild = std::pin::pin!(rebuild);
        assert!(
            futures_util::poll!(rebuild.as_mut()).is_pending(),
            "a rebuild beside a write in flight"
        );
        assert!(
            !read.load(std::sync::atomic::Ordering::SeqCst),
            "read beside the write"
        );
        drop(in_flight);
        rebuild.await.unwrap();
        assert!(read.load(std::sync::atomic::Ordering::SeqCst));
        let last = slot.written.lock().last.clone();
        assert_eq!(last.and_then(|p| p.resource_version()), Some("9".into()));
    }

    #[test]
    fn a_write_starts_from_our_last_and_our_recent_versions_are_known() {
        let at = |v: &str| {
            let mut p = IPPool::new("net", Default::default());
            p.metadata.resource_version = Some(v.into());
            p
        };
        let mut w = Written::default();
        assert!(w.start(Some("1")).is_none(), "nothing written: the cache");
        // Writes in a burst: 1 → 2 → … → 40; however far the cache trails, the next write
        // starts from the last.
        for made in 2..=40 {
            w.record((made - 1).to_string(), made.to_string());
            w.last = Some(Arc::new(at(&made.to_string())));
        }
        let start = |cached| {
            w.start(cached)
                .map(|(p, known)| (p.resource_version().unwrap_or_default(), known))
        };
        for cached in [None, Some("40"), Some("9"), Some("8")] {
            assert_eq!(
                start(cached),
                Some(("40".into(), true)),
                "cache at {cached:?}"
            );
        }
        // A version we do not know (someone else's, or ours from long ago): still from ours,
        // but finding nothing to change there proves nothing.
        for cached in ["1", "7", "41"] {
            assert_eq!(
                start(Some(cached)),
                Some(("40".into(), false)),
                "cache at {cached}"
            );
        }
        assert!(w.made("40") && w.made("9") && !w.made("8") && !w.made("41"));
        assert_eq!(w.versions.len(), OWN_VERSIONS);
    }

    #[test]
    fn an_edit_that_refills_the_books_starts_from_everything_else() {
        let mut conditions = Vec::new();
        set_condition(&mut conditions, "CacheReady", true, "", "");
        let status = IPPoolStatus {
            ipv6: None,
            last_update: Some(now()),
            ipv4: Some(IPv4Status {
                allocated: [("10.0.0.2".to_owned(), "02:00:00:00:00:01".to_owned())].into(),
                used: 1,
                ..Default::default()
            }),
            agent_pod_ref: Some(Default::default()),
            conditions,
        };
        let mut pool = IPPool::new("net", Default::default());
        assert_eq!(to_edit(&pool, true), IPPoolStatus::default());
        pool.status = Some(status.clone());
        assert_eq!(to_edit(&pool, false), status);
        assert_eq!(
            to_edit(&pool, true),
            IPPoolStatus {
                ipv4: None,
                ..status
            }
        );
    }

    #[test]
    fn conditions_keep_transition_time_until_status_changes() {
        let mut cs = Vec::new();
        assert!(set_condition(
            &mut cs,
            "CacheReady",
            false,
            "NotInitialized",
            ""
        ));
        let first = cs[0].clone();
        assert!(!set_condition(
            &mut cs,
            "CacheReady",
            false,
            "NotInitialized",
            ""
        ));
        assert_eq!(cs[0], first, "unchanged, times included");
        assert!(set_condition(&mut cs, "CacheReady", true, "", ""));
        assert_eq!(cs[0].status, "True");
        assert_eq!(cs[0].last_transition_time, cs[0].last_update_time);
        assert_eq!(cs[0].reason, None);
        assert!(set_condition(&mut cs, "Stopped", false, "", ""));
        assert_eq!(cs.len(), 2);
    }
}
