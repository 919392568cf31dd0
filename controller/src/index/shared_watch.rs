//! One watch and cache per kind, feeding everything in the process that reads that kind.
//!
//! Every replica keeps the IPPools (for the index it serves to agents and for the webhook) and
//! the configs (for the webhook); the leader's reconcilers react to both, and its VM and config
//! controllers to VirtualMachines. With a watch each, the API server sends every event several
//! times, the process holds several copies of every object, and — worse — a reconciler woken by
//! one watch may read a cache fed by another that has not seen the event yet (a config
//! reconciled for a deleted VM finds the VM still in the VM controller's cache and is kept).
//!
//! A [`SharedWatch`] runs one watch into one cache and hands every change, after the cache has
//! applied it, to each subscriber: [`SharedWatch::subscribe`] for a consumer that needs to tell
//! changes, deletions and relists apart (the index sync), [`SharedWatch::trigger`] for a
//! controller's trigger stream. Subscribers come and go (a leadership term subscribes when it
//! starts and is dropped when it ends); a trigger starts with every cached object, so a term that
//! starts after the initial list still reconciles everything. Cached objects lose their
//! `managedFields`, which nothing here reads (they are often the larger part of an object).
//!
//! A relist (after the watch fell too far behind, e.g. across an API server restart) replaces the
//! cache without saying what disappeared; kube's own streams forget those objects silently, so a
//! VM deleted in the gap would leave its config and address behind until the next restart. Here
//! every object the relist dropped is announced as [`Touch::Deleted`] before [`Touch::Listed`].
//! What a relist brings is announced only once the cache holds all of it (the reflector swaps a
//! list in whole): a controller woken earlier would find a VM created in the gap missing from its
//! cache, skip it as deleted, and never be woken for it again.
//!
//! Readiness is this module's own ([`SharedWatch::ready`]): kube's `Store::wait_until_ready`
//! wakes only its most recent waiter, which the controllers reading the store already are.

use parking_lot::Mutex;
use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use futures_util::stream::BoxStream;
use futures_util::{Stream, StreamExt};
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tracing::warn;

/// How many changes may wait for a slow subscriber before the watch waits for it.
const BUFFER: usize = 256;

/// A trigger stream for [`kube::runtime::Controller::for_shared_stream`] or
/// `watches_shared_stream`: objects shared, not copied, with every subscriber.
pub type Trigger<K> = BoxStream<'static, Arc<K>>;

/// What a subscriber is told, always after the cache has applied it.
#[derive(Clone, Debug, PartialEq)]
pub enum Touch<K> {
    /// Created or changed; also each object of a (re)list, once the whole list is in the cache
    /// (the reflector applies a list only when it is complete). Shared with the cache and every
    /// subscriber: the leader's pools have four subscribers, and a copy each of a pool that
    /// changes with every allocation would grow the cost per allocation with the pool.
    Applied(Arc<K>),
    /// Deleted.
    Deleted(Arc<K>),
    /// A (re)list is complete: the cache now holds exactly the listed objects (those it dropped
    /// were announced as deleted, and those it holds as applied, just before).
    Listed,
}

type Subscribers<K> = Arc<Mutex<Vec<mpsc::Sender<Touch<K>>>>>;

/// One watch of a kind, its cache, and whoever subscribed to its changes. Cheap to clone.
pub struct SharedWatch<K: Resource + 'static>
where
    K::DynamicType: Hash + Eq,
{
    store: Store<K>,
    subscribers: Subscribers<K>,
    ready: watch::Receiver<bool>,
}

impl<K: Resource + 'static> Clone for SharedWatch<K>
where
    K::DynamicType: Clone + Hash + Eq,
{
    fn clone(&self) -> Self {
        SharedWatch {
            store: self.store.clone(),
            subscribers: self.subscribers.clone(),
            ready: self.ready.clone(),
        }
    }
}

impl<K> SharedWatch<K>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Clone + Eq + Hash + Send + Sync,
{
    /// Starts the watch of `api`: returns the handle and the future that drives the watch (poll
    /// or spawn it; it never ends on its own).
    pub fn start(
        api: Api<K>,
        dyntype: K::DynamicType,
        config: watcher::Config,
    ) -> (Self, impl Future<Output = ()> + Send) {
        Self::start_with(api, dyntype, config, |_| {}, |_| {})
    }

    /// As [`SharedWatch::start`], with `trim` applied to every object before anything sees it:
    /// the cache holds only the fields its readers use (a kind the process reads little of, such
    /// as KubeVirt VirtualMachines, would otherwise cost kilobytes per object).
    pub fn start_trimmed(
        api: Api<K>,
        dyntype: K::DynamicType,
        config: watcher::Config,
        trim: impl Fn(&mut K) + Send + 'static,
    ) -> (Self, impl Future<Output = ()> + Send) {
        Self::start_with(api, dyntype, config, trim, |_| {})
    }

    /// As [`SharedWatch::start_trimmed`], with `observe` also called on every (trimmed) event
    /// before the cache and the subscribers see it (to keep an index of the objects in step with
    /// the cache).
    pub fn start_with(
        api: Api<K>,
        dyntype: K::DynamicType,
        config: watcher::Config,
        trim: impl Fn(&mut K) + Send + 'static,
        observe: impl Fn(&watcher::Event<K>) + Send + 'static,
    ) -> (Self, impl Future<Output = ()> + Send) {
        let kind = K::kind(&dyntype).into_owned();
        let writer = reflector::store::Writer::new(dyntype.clone());
        let store = writer.as_reader();
        let events = watcher(api, config)
            .default_backoff()
            .modify(move |o| {
                forget_managed_fields(o);
                trim(o);
            })
            .map(move |event| {
                if let Ok(event) = &event {
                    observe(event);
                }
                event
            })
            .reflect(writer);
        let subscribers = Subscribers::default();
        let (ready_tx, ready) = watch::channel(false);
        let drive = fan_out(
            events,
            Relist::new(store.clone(), dyntype),
            subscribers.clone(),
            ready_tx,
            kind,
        );
        (
            SharedWatch {
                store,
                subscribers,
                ready,
            },
            drive,
        )
    }
}

impl<K> SharedWatch<K>
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Clone + Eq + Hash,
{
    /// The cache.
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// Resolves once the first list is in the cache (at once after that). Any number of tasks
    /// may wait.
    pub fn ready(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut ready = self.ready.clone();
        async move {
            // Err: the watch is gone, and with it any hope of readiness; waiters are not stuck
            // on it (they are stopping too).
            let _ = ready.wait_for(|r| *r).await;
        }
    }

    /// Whether the first list is in the cache.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Every change from now on, in order.
    pub fn subscribe(&self) -> ReceiverStream<Touch<K>> {
        let (sender, receiver) = mpsc::channel(BUFFER);
        lock(&self.subscribers).push(sender);
        ReceiverStream::new(receiver)
    }

    /// The whole cache, then every object changed or deleted from now on, in order. Made while
    /// the first list is arriving, it yields the cache once the list is complete: the list's
    /// objects sent before it subscribed never reach it, and the cache holds none of them
    /// until then. (An object may come twice around the moment of subscribing.)
    pub fn changes(&self) -> BoxStream<'static, Seen<K>> {
        // Subscribed first: whatever the cache applies after the snapshot below is sent live.
        let live = self.subscribe();
        let mut listing = (!self.is_ready()).then(|| self.store.clone());
        let cache = match listing {
            Some(_) => None,
            None => Some(Seen::Cache(self.store.state())),
        };
        let live = live.filter_map(move |touch| {
            std::future::ready(match touch {
                Touch::Applied(_) if listing.is_some() => None,
                Touch::Applied(o) | Touch::Deleted(o) => Some(Seen::Change(o)),
                Touch::Listed => listing.take().map(|s| Seen::Cache(s.state())),
            })
        });
        futures_util::stream::iter(cache).chain(live).boxed()
    }

    /// A controller trigger: every cached object, then every object changed or deleted from now
    /// on ([`SharedWatch::changes`], flattened; triggers are idempotent).
    pub fn trigger(&self) -> Trigger<K> {
        self.changes()
            .flat_map(|seen| {
                futures_util::stream::iter(match seen {
                    Seen::Cache(all) => all,
                    Seen::Change(o) => vec![o],
                })
            })
            .boxed()
    }
}

/// What [`SharedWatch::changes`] yields.
pub enum Seen<K> {
    /// The whole cache, once it holds the first list.
    Cache(Vec<Arc<K>>),
    /// An object changed or deleted after it.
    Change(Arc<K>),
}

/// An index kept from a watch's events: changed object by object, and replaced whole once a
/// relist (`Init` … `InitDone`) is complete, so its readers never see half of one. Shared by the
/// indexes the caches keep ([`crate::index::configs`], [`crate::index::pools`]).
#[derive(Debug, Default)]
pub struct Relisted<T> {
    /// What readers see.
    pub live: T,
    /// A relist being received.
    relist: Option<T>,
}

impl<T: Default> Relisted<T> {
    /// Takes one event into account: `set` puts an object (changed, or listed) into an index,
    /// `remove` takes a deleted one out.
    pub fn observe<K>(
        &mut self,
        event: &watcher::Event<K>,
        set: impl Fn(&mut T, &K),
        remove: impl Fn(&mut T, &K),
    ) {
        match event {
            watcher::Event::Apply(obj) => set(&mut self.live, obj),
            watcher::Event::Delete(obj) => remove(&mut self.live, obj),
            watcher::Event::Init => self.relist = Some(T::default()),
            watcher::Event::InitApply(obj) => {
                if let Some(relist) = self.relist.as_mut() {
                    set(relist, obj);
                }
            }
            watcher::Event::InitDone => {
                if let Some(relist) = self.relist.take() {
                    self.live = relist;
                }
            }
        }
    }
}

/// Drops an object's `managedFields`, which nothing here reads and which are often the larger
/// part of an object.
pub fn forget_managed_fields<K: Resource>(o: &mut K) {
    o.meta_mut().managed_fields = None;
}

fn lock<K>(
    subscribers: &Subscribers<K>,
) -> parking_lot::MutexGuard<'_, Vec<mpsc::Sender<Touch<K>>>> {
    // Only whole senders are pushed or removed under the lock: nothing can be left torn.
    subscribers.lock()
}

/// A (re)list in progress. The reflector applies a list to the cache only when it is complete
/// (`InitDone`), so what the list brings is announced then, not as it arrives: a controller
/// woken for an object its cache does not hold yet takes it for deleted and skips it, and nothing
/// wakes it again (a VM created while the watch was behind would never get its config). Also
/// what the relist dropped: the cache as it was when the relist began, compared with the cache
/// once it is complete.
struct Relist<K: Resource + 'static>
where
    K::DynamicType: Hash + Eq,
{
    store: Store<K>,
    dyntype: K::DynamicType,
    before: Option<Vec<Arc<K>>>,
    /// The objects the list has brought so far, by key (the reflector holds the objects).
    listed: Vec<reflector::ObjectRef<K>>,
}

impl<K> Relist<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Clone + Hash + Eq,
{
    fn new(store: Store<K>, dyntype: K::DynamicType) -> Self {
        Relist {
            store,
            dyntype,
            before: None,
            listed: Vec::new(),
        }
    }

    /// A relist begins (`Init`: the cache still holds the old objects).
    fn begin(&mut self) {
        self.before = Some(self.store.state());
        self.listed.clear();
    }

    /// The list brought `o` (`InitApply`: not in the cache before the list is complete).
    fn listed(&mut self, o: &K) {
        self.listed
            .push(reflector::ObjectRef::from_obj_with(o, self.dyntype.clone()));
    }

    /// Once the list is complete: what it brought, as the cache holds it.
    fn applied(&mut self) -> impl Iterator<Item = Arc<K>> + '_ {
        self.listed.drain(..).filter_map(|key| self.store.get(&key))
    }

    /// `o`, as the cache holds it once it has applied a watch event (the same allocation, not a
    /// copy).
    fn shared(&self, o: K) -> Arc<K> {
        let key = reflector::ObjectRef::from_obj_with(&o, self.dyntype.clone());
        self.store
            .get(&key)
            .filter(|cached| cached.meta().resource_version == o.meta().resource_version)
            .unwrap_or_else(|| Arc::new(o))
    }

    /// The relist is complete (`InitDone`: the cache holds the new list): what it dropped.
    fn dropped(&mut self) -> Vec<Arc<K>> {
        self.before
            .take()
            .unwrap_or_default()
            .into_iter()
            .filter(|old| {
                let key = reflector::ObjectRef::from_obj_with(old.as_ref(), self.dyntype.clone());
                self.store.get(&key).is_none()
            })
            .collect()
    }
}

/// Hands each event of `source` (already applied to the cache) to every subscriber in order,
/// waiting for room in each (a slow subscriber slows the watch rather than losing changes), and
/// flips `ready` at the end of the first list. What a relist dropped is announced as deleted.
/// Errors are logged here, not forwarded: the watch retries by itself and the subscribers need
/// not each report them. A subscriber that has gone away is dropped from the list.
async fn fan_out<K, E, S>(
    source: S,
    mut relist: Relist<K>,
    subscribers: Subscribers<K>,
    ready: watch::Sender<bool>,
    kind: String,
) where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Clone + Hash + Eq,
    E: std::fmt::Display + Send,
    S: Stream<Item = Result<watcher::Event<K>, E>> + Send + 'static,
{
    let mut source = std::pin::pin!(source);
    while let Some(event) = source.next().await {
        let touches = match event {
            Ok(watcher::Event::Apply(o)) => vec![Touch::Applied(relist.shared(o))],
            Ok(watcher::Event::InitApply(o)) => {
                relist.listed(&o);
                continue;
            }
            Ok(watcher::Event::Delete(o)) => vec![Touch::Deleted(Arc::new(o))],
            Ok(watcher::Event::Init) => {
                relist.begin();
                continue;
            }
            Ok(watcher::Event::InitDone) => {
                let dropped = relist.dropped();
                if !dropped.is_empty() {
                    warn!(%kind, dropped = dropped.len(), "relisted: announcing objects deleted while the watch was behind");
                }
                ready.send_replace(true);
                let mut touches: Vec<Touch<K>> = dropped.into_iter().map(Touch::Deleted).collect();
                touches.extend(relist.applied().map(Touch::Applied));
                touches.push(Touch::Listed);
                touches
            }
            Err(error) => {
                warn!(%kind, %error, "watch failed; retrying");
                continue;
            }
        };
        let senders = lock(&subscribers).clone();
        let mut gone = false;
        for touch in touches {
            for sender in &senders {
                // Err: that subscriber has stopped; the others go on.
                gone |= sender.send(touch.clone()).await.is_err();
            }
        }
        if gone {
            lock(&subscribers).retain(|s| !s.is_closed());
        }
    }
}

/// A shared watch the tests feed by hand, for this module's tests and its users'.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    pub(crate) fn cm(name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    pub(crate) fn name(o: &ConfigMap) -> String {
        o.meta().name.clone().unwrap_or_default()
    }

    /// A shared watch over events the test sends: the handle, the sender, the driver task.
    pub(crate) type Fed = (
        SharedWatch<ConfigMap>,
        mpsc::Sender<Result<watcher::Event<ConfigMap>, watcher::Error>>,
        tokio::task::JoinHandle<()>,
    );

    /// A shared watch fed by the test instead of an API server (nothing else differs: the cache,
    /// the fan-out and the readiness are the module's own).
    pub(crate) fn fed() -> Fed {
        let (store, writer) = reflector::store::<ConfigMap>();
        let (events, rx) = mpsc::channel(1);
        let source = ReceiverStream::new(rx).reflect(writer);
        let subscribers = Subscribers::default();
        let (ready_tx, ready) = watch::channel(false);
        let driver = tokio::spawn(fan_out(
            source,
            Relist::new(store.clone(), ()),
            subscribers.clone(),
            ready_tx,
            "ConfigMap".into(),
        ));
        let shared = SharedWatch {
            store,
            subscribers,
            ready,
        };
        (shared, events, driver)
    }

    pub(crate) async fn send(
        events: &mpsc::Sender<Result<watcher::Event<ConfigMap>, watcher::Error>>,
        e: watcher::Event<ConfigMap>,
    ) {
        events.send(Ok(e)).await.unwrap_or_default();
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;
    use futures_util::FutureExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::reflector::ObjectRef;

    fn describe(t: &Touch<ConfigMap>) -> String {
        match t {
            Touch::Applied(o) => format!("+{}", name(o)),
            Touch::Deleted(o) => format!("-{}", name(o)),
            Touch::Listed => "listed".into(),
        }
    }

    #[tokio::test]
    async fn every_subscriber_gets_every_change_in_order_and_errors_stay_here() {
        let (shared, events, driver) = fed();
        let (one, two) = (shared.subscribe(), shared.subscribe());
        assert!(!shared.is_ready());
        send(&events, watcher::Event::Init).await;
        send(&events, watcher::Event::InitApply(cm("a"))).await;
        send(&events, watcher::Event::InitDone).await;
        events
            .send(Err(watcher::Error::NoResourceVersion))
            .await
            .unwrap_or_default();
        send(&events, watcher::Event::Apply(cm("b"))).await;
        send(&events, watcher::Event::Delete(cm("a"))).await;
        drop(events);
        driver.await.unwrap();
        assert!(shared.is_ready());
        shared.ready().await;
        let want = ["+a", "listed", "+b", "-a"];
        drop(shared);
        assert_eq!(one.map(|t| describe(&t)).collect::<Vec<_>>().await, want);
        assert_eq!(two.map(|t| describe(&t)).collect::<Vec<_>>().await, want);
    }

    #[tokio::test]
    async fn a_subscriber_that_stopped_does_not_stop_the_others_and_is_forgotten() {
        let (shared, events, driver) = fed();
        let gone = shared.subscribe();
        let kept = shared.subscribe();
        drop(gone);
        // More changes than a channel holds: the driver must keep going for the reader it has.
        let total = 2 * BUFFER;
        let reader = tokio::spawn(kept.count());
        for i in 0..total {
            send(&events, watcher::Event::Apply(cm(&i.to_string()))).await;
        }
        drop(events);
        driver.await.unwrap();
        assert_eq!(lock(&shared.subscribers).len(), 1);
        drop(shared);
        assert_eq!(reader.await.unwrap(), total);
    }

    /// The race this module exists for: when a subscriber sees a change, the shared cache has
    /// already applied it — a deletion included. The test hands the watch one event at a time
    /// and looks at the cache when the subscriber receives it, before sending the next.
    #[tokio::test]
    async fn the_cache_has_applied_an_event_before_subscribers_see_it() {
        let (shared, events, driver) = fed();
        let mut trigger = shared.trigger();
        for e in [watcher::Event::Init, watcher::Event::InitDone] {
            send(&events, e).await;
        }
        let key = ObjectRef::from_obj(&cm("a"));
        for (event, cached) in [
            (watcher::Event::Apply(cm("a")), true),
            (watcher::Event::Delete(cm("a")), false),
            (watcher::Event::Apply(cm("a")), true),
        ] {
            send(&events, event).await;
            let seen = trigger.next().await;
            assert!(seen.is_some(), "{seen:?}");
            assert_eq!(shared.store().get(&key).is_some(), cached);
        }
        drop(events);
        driver.await.unwrap();
    }

    /// A VM deleted while the watch was behind (an API server restart) is not in the relist; it
    /// is announced as deleted, or its config would keep its address.
    #[tokio::test]
    async fn a_relist_announces_what_it_dropped() {
        let (shared, events, driver) = fed();
        let touches = shared.subscribe();
        for e in [
            watcher::Event::Init,
            watcher::Event::InitApply(cm("a")),
            watcher::Event::InitApply(cm("b")),
            watcher::Event::InitDone,
            // The relist: "a" is gone, "c" is new.
            watcher::Event::Init,
            watcher::Event::InitApply(cm("b")),
            watcher::Event::InitApply(cm("c")),
            watcher::Event::InitDone,
        ] {
            send(&events, e).await;
        }
        drop(events);
        driver.await.unwrap();
        drop(shared);
        assert_eq!(
            touches.map(|t| describe(&t)).collect::<Vec<_>>().await,
            ["+a", "+b", "listed", "-a", "+b", "+c", "listed"]
        );
    }

    /// A relist after the watch fell behind (the API server's "too old resource version")
    /// brings objects created in the gap. A controller reads each object it is woken for from
    /// the cache and skips one it does not find there, so no trigger may fire for a listed object
    /// before the cache holds it. (The test runs on one thread: when `send` returns, the driver
    /// has handled every event before the one sent.)
    #[tokio::test]
    async fn a_relist_wakes_nobody_before_the_cache_holds_what_it_brought() {
        let (shared, events, driver) = fed();
        let mut trigger = shared.trigger();
        for e in [
            watcher::Event::Init,
            watcher::Event::InitApply(cm("a")),
            watcher::Event::InitDone,
            watcher::Event::Init,
            watcher::Event::InitApply(cm("a")),
            watcher::Event::InitApply(cm("b")),
            watcher::Event::InitApply(cm("c")),
        ] {
            send(&events, e).await;
        }
        let uncached = |o: &Arc<ConfigMap>| {
            shared
                .store()
                .get(&ObjectRef::from_obj(o.as_ref()))
                .is_none()
                .then(|| name(o))
        };
        let mut seen = Vec::new();
        while let Some(o) = trigger.next().now_or_never() {
            let o = o.unwrap();
            assert_eq!(uncached(&o), None, "woken before the cache holds it");
            seen.push(name(&o));
        }
        send(&events, watcher::Event::InitDone).await;
        while seen.len() < 4 {
            let o = trigger.next().await.unwrap();
            assert_eq!(uncached(&o), None, "woken before the cache holds it");
            seen.push(name(&o));
        }
        assert_eq!(seen, ["a", "a", "b", "c"]);
        drop(events);
        driver.await.unwrap();
    }

    /// A leadership term subscribes long after the first list: its trigger starts with what is
    /// cached, then carries on live.
    #[tokio::test]
    async fn a_trigger_made_mid_list_gets_the_whole_list() {
        let (shared, events, driver) = fed();
        send(&events, watcher::Event::Init).await;
        send(&events, watcher::Event::InitApply(cm("a"))).await;
        // On one thread: the driver has handled `Init` and is at or past `a`.
        let trigger = shared.trigger();
        send(&events, watcher::Event::InitApply(cm("b"))).await;
        send(&events, watcher::Event::InitDone).await;
        send(&events, watcher::Event::Apply(cm("c"))).await;
        drop(events);
        driver.await.unwrap();
        drop(shared);
        let seen: Vec<String> = trigger.map(|o| name(&o)).collect().await;
        // The cache once listed (which by then may hold `c` too: a trigger may repeat an
        // object), then `c` live.
        assert_eq!(seen.last().map(String::as_str), Some("c"));
        let mut all = seen.clone();
        all.sort();
        all.dedup();
        assert_eq!(all, ["a", "b", "c"]);
    }

    #[tokio::test]
    async fn a_late_trigger_starts_with_the_cache_then_goes_live() {
        let (shared, events, driver) = fed();
        send(&events, watcher::Event::Init).await;
        send(&events, watcher::Event::InitApply(cm("a"))).await;
        send(&events, watcher::Event::InitApply(cm("b"))).await;
        send(&events, watcher::Event::InitDone).await;
        shared.ready().await;
        let trigger = shared.trigger();
        send(&events, watcher::Event::Apply(cm("c"))).await;
        drop(events);
        driver.await.unwrap();
        drop(shared);
        let mut seen: Vec<String> = trigger.map(|o| name(&o)).collect().await;
        seen.sort();
        assert_eq!(seen, ["a", "b", "c"]);
    }
}
