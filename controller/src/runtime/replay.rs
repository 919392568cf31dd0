//! The pace of a new term's first pass: every cached object is reconciled once when a term
//! starts, and what changes meanwhile must not wait behind all of them.
//!
//! A trigger hands a controller every cached object, then every change
//! ([`SharedWatch::trigger`]). kube-runtime queues whatever it is handed and, with all its
//! reconcile slots busy, takes the next from a hash set: a VM created while there was no leader
//! would wait, in the new term, behind a random share of every object in the cluster
//! (docs/tuning.md). A [`paced_trigger`] hands the cached objects that look settled only while
//! few of its own wait in the queue ([`Backlog`]), and the rest — changes, deletions, objects
//! that look unsettled — at once. Nothing is skipped: the order changes, not what is reconciled.

use std::collections::VecDeque;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use futures_util::{FutureExt, StreamExt};
use kube::Resource;
use tokio::sync::Notify;

use crate::index::shared_watch::{Seen, SharedWatch, Trigger};

/// How many settled objects of the first pass may wait in a controller's queue at once: a
/// change arriving then waits for at most about as many reconciles to start, each of a settled
/// object (one comparison, no write).
pub const BACKLOG: usize = 64;

/// How long the first pass waits for a reconcile to start before it stops counting what it
/// handed over as waiting. Every start and every queued object found deleted is counted
/// ([`Backlog::taken`]); this only bounds the cost of a miscount (a pause, never a stall).
const RECOUNT_AFTER: Duration = Duration::from_secs(1);

/// How many objects of a first pass are in a controller's queue, not yet taken by a reconcile.
/// One per controller, shared by its trigger and its runner.
#[derive(Debug, Default)]
pub struct Backlog {
    waiting: AtomicUsize,
    taken: Notify,
}

impl Backlog {
    /// A reconcile started, or the runner found a queued object gone: one fewer waits.
    /// (A start of an object that was not handed over by the first pass also counts: the pass
    /// then hands over slightly more, never less.)
    pub fn taken(&self) {
        // Err: already zero, which it stays.
        let _ = self
            .waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| w.checked_sub(1));
        self.taken.notify_one();
    }

    /// How many wait (the pacing's own test, and its tests').
    fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    fn has_room(&self) -> bool {
        self.waiting() < BACKLOG
    }

    fn handed(&self) {
        self.waiting.fetch_add(1, Ordering::AcqRel);
    }

    /// Until a reconcile starts or, if none does within [`RECOUNT_AFTER`], the count is cleared.
    async fn room(&self) {
        if tokio::time::timeout(RECOUNT_AFTER, self.taken.notified())
            .await
            .is_err()
        {
            self.waiting.store(0, Ordering::Release);
        }
    }
}

/// Where a paced trigger is.
struct Pass<K, U> {
    /// The cache (the first pass, once the first list is complete), then the changes.
    live: BoxStream<'static, Seen<K>>,
    /// The first pass, not sorted yet: `looks_unsettled` may read other caches, which are
    /// whole only once `sort_after` has resolved.
    unsorted: Vec<Arc<K>>,
    sort_after: Option<BoxFuture<'static, ()>>,
    /// First-pass objects that look settled, handed over as the [`Backlog`] allows.
    settled: VecDeque<Arc<K>>,
    /// First-pass objects that do not, handed over first.
    unsettled: VecDeque<Arc<K>>,
    looks_unsettled: U,
    backlog: Arc<Backlog>,
    live_ended: bool,
}

impl<K, U: Fn(&K) -> bool> Pass<K, U> {
    /// Sorts the first pass, once it is known and may be sorted.
    fn sort(&mut self) {
        if self.sort_after.is_some() {
            return;
        }
        for o in std::mem::take(&mut self.unsorted) {
            if (self.looks_unsettled)(&o) {
                self.unsettled.push_back(o);
            } else {
                self.settled.push_back(o);
            }
        }
    }

    /// What a change hands over at once (the cache is left to the pass).
    fn take(&mut self, seen: Seen<K>) -> Option<Arc<K>> {
        match seen {
            Seen::Change(o) => Some(o),
            Seen::Cache(all) => {
                self.unsorted = all;
                self.sort();
                None
            }
        }
    }

    /// Whether the trigger waits for nothing any more.
    fn done(&self) -> bool {
        // Once sorted, `unsorted` stays empty.
        self.live_ended && self.settled.is_empty() && self.unsorted.is_empty()
    }
}

/// A controller trigger for `watch` that reconciles every cached object once (the first pass)
/// and every change from then on, as [`SharedWatch::trigger`] does, in this order: changes and
/// first-pass objects for which `looks_unsettled` holds at once, the other first-pass objects
/// only while fewer than [`BACKLOG`] of them wait in the controller's queue (its runner calls
/// [`Backlog::taken`]). The first pass is sorted once `sort_after` resolves (when the caches
/// `looks_unsettled` reads are whole; changes flow meanwhile). `looks_unsettled` only orders:
/// it should be cheap, and may be wrong.
pub fn paced_trigger<K, U>(
    watch: &SharedWatch<K>,
    looks_unsettled: U,
    backlog: Arc<Backlog>,
    sort_after: impl Future<Output = ()> + Send + 'static,
) -> Trigger<K>
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Clone + Eq + Hash,
    U: Fn(&K) -> bool + Send + 'static,
{
    let pass = Pass {
        live: watch.changes(),
        unsorted: Vec::new(),
        sort_after: Some(sort_after.boxed()),
        settled: VecDeque::new(),
        unsettled: VecDeque::new(),
        looks_unsettled,
        backlog,
        live_ended: false,
    };
    futures_util::stream::unfold(pass, |mut pass| async move {
        loop {
            if let Some(o) = pass.unsettled.pop_front() {
                return Some((o, pass));
            }
            // Whatever has arrived goes before the settled part of the first pass.
            if !pass.live_ended {
                match pass.live.next().now_or_never() {
                    Some(Some(touch)) => {
                        if let Some(o) = pass.take(touch) {
                            return Some((o, pass));
                        }
                        continue;
                    }
                    Some(None) => pass.live_ended = true,
                    None => {}
                }
            }
            if let Some(gate) = pass.sort_after.as_mut()
                && gate.now_or_never().is_some()
            {
                pass.sort_after = None;
                pass.sort();
                continue;
            }
            if !pass.settled.is_empty() && pass.backlog.has_room() {
                pass.backlog.handed();
                return pass.settled.pop_front().map(|o| (o, pass));
            }
            if pass.done() {
                return None;
            }
            let live = !pass.live_ended;
            let settled = !pass.settled.is_empty();
            let (changes, gate, backlog) = (&mut pass.live, &mut pass.sort_after, &pass.backlog);
            tokio::select! {
                biased;
                touch = changes.next(), if live => match touch {
                    Some(touch) => {
                        if let Some(o) = pass.take(touch) {
                            return Some((o, pass));
                        }
                    }
                    None => pass.live_ended = true,
                },
                () = async {
                    match gate.as_mut() {
                        Some(gate) => gate.await,
                        None => std::future::pending().await,
                    }
                } => {
                    pass.sort_after = None;
                    pass.sort();
                }
                () = backlog.room(), if settled => {}
            }
        }
    })
    .boxed()
}

/// A controller trigger for `watch` with every change after its first list, not the list itself:
/// for a controller that reconciles another kind's objects on these changes, and whose own
/// first pass already covers what the list would wake (every object, once the caches are
/// whole).
pub fn changes_after_list<K>(watch: &SharedWatch<K>) -> Trigger<K>
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Clone + Eq + Hash,
{
    watch
        .changes()
        .filter_map(|seen| {
            std::future::ready(match seen {
                Seen::Change(o) => Some(o),
                Seen::Cache(_) => None,
            })
        })
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::shared_watch::fixtures::{cm, fed, name, send};
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::watcher;

    /// Objects whose name starts with `u` look unsettled.
    fn by_name(o: &ConfigMap) -> bool {
        name(o).starts_with('u')
    }

    /// What the trigger hands over without waiting.
    fn ready_now(trigger: &mut Trigger<ConfigMap>) -> Vec<String> {
        std::iter::from_fn(|| trigger.next().now_or_never().flatten())
            .map(|o| name(&o))
            .collect()
    }

    async fn listed(events: &Events, names: &[String]) {
        send(events, watcher::Event::Init).await;
        for n in names {
            send(events, watcher::Event::InitApply(cm(n))).await;
        }
        send(events, watcher::Event::InitDone).await;
    }

    type Events = tokio::sync::mpsc::Sender<Result<watcher::Event<ConfigMap>, watcher::Error>>;

    fn settled(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("s{i:03}")).collect()
    }

    // The clock is paused (it moves only when every task waits): no pause of the machine can
    // pass for a miscount.
    #[tokio::test(start_paused = true)]
    async fn the_settled_first_pass_waits_for_room_and_changes_do_not() {
        let (shared, events, _driver) = fed();
        let mut names = settled(100);
        names.insert(70, "u-late".into());
        listed(&events, &names).await;
        shared.ready().await;
        let backlog = Arc::new(Backlog::default());
        let mut trigger = paced_trigger(&shared, by_name, backlog.clone(), async {});

        // The unsettled object first, wherever it was listed; then as many settled as fit.
        let first = ready_now(&mut trigger);
        assert_eq!(first.len(), 1 + BACKLOG);
        assert_eq!(first[0], "u-late");
        assert!(first[1..].iter().all(|n| n.starts_with('s')));
        assert_eq!(backlog.waiting(), BACKLOG);

        // A change while the queue is full goes at once, ahead of the rest of the pass.
        send(&events, watcher::Event::Apply(cm("new"))).await;
        let change = trigger.next().await.map(|o| name(&o));
        assert_eq!(change.as_deref(), Some("new"));
        assert!(ready_now(&mut trigger).is_empty());

        // Each reconcile that starts lets one more through.
        for _ in 0..10 {
            backlog.taken();
        }
        let next = ready_now(&mut trigger);
        assert_eq!(next.len(), 10);
        assert_eq!(backlog.waiting(), BACKLOG);
        for _ in 0..200 {
            backlog.taken();
        }
        let mut all: Vec<String> = first.into_iter().chain(next).collect();
        all.extend(ready_now(&mut trigger));
        // Nothing skipped, nothing twice.
        all.sort();
        let mut expected = names.clone();
        expected.sort();
        assert_eq!(all, expected);
    }

    #[tokio::test(start_paused = true)]
    async fn a_first_list_arriving_after_the_trigger_is_its_first_pass() {
        let (shared, events, _driver) = fed();
        let backlog = Arc::new(Backlog::default());
        let mut trigger = paced_trigger(&shared, by_name, backlog.clone(), async {});
        let mut names = settled(BACKLOG + 5);
        names.push("u1".into());
        listed(&events, &names).await;
        shared.ready().await;
        let first = trigger.next().await.map(|o| name(&o));
        assert_eq!(first.as_deref(), Some("u1"));
        assert_eq!(ready_now(&mut trigger).len(), BACKLOG);
        // After the list, a change is live again.
        send(&events, watcher::Event::Apply(cm("s000"))).await;
        let change = trigger.next().await.map(|o| name(&o));
        assert_eq!(change.as_deref(), Some("s000"));
        assert_eq!(backlog.waiting(), BACKLOG);
    }

    #[tokio::test(start_paused = true)]
    async fn a_miscount_costs_a_pause_not_a_stall() {
        let (shared, events, _driver) = fed();
        listed(&events, &settled(BACKLOG + 1)).await;
        shared.ready().await;
        let backlog = Arc::new(Backlog::default());
        let mut trigger = paced_trigger(&shared, by_name, backlog.clone(), async {});
        assert_eq!(ready_now(&mut trigger).len(), BACKLOG);
        // Nothing is ever taken (say, every one was deleted before its turn, uncounted): after
        // a second of the clock the pass goes on.
        let started = tokio::time::Instant::now();
        assert!(trigger.next().await.is_some());
        assert!(started.elapsed() >= RECOUNT_AFTER);
        assert_eq!(backlog.waiting(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_pass_is_sorted_once_the_caches_it_reads_are_whole() {
        let (shared, events, _driver) = fed();
        listed(&events, &settled(BACKLOG + 5)).await;
        shared.ready().await;
        // Which object looks unsettled is known only once another cache is whole.
        let known = Arc::new(parking_lot::Mutex::new(None::<String>));
        let reads = known.clone();
        let (whole, gate) = tokio::sync::oneshot::channel::<()>();
        let mut trigger = paced_trigger(
            &shared,
            move |o: &ConfigMap| reads.lock().as_deref() == Some(name(o).as_str()),
            Arc::default(),
            async {
                let _ = gate.await;
            },
        );
        // Before: no first pass yet, changes flow.
        assert!(ready_now(&mut trigger).is_empty());
        send(&events, watcher::Event::Apply(cm("new"))).await;
        let change = trigger.next().await.map(|o| name(&o));
        assert_eq!(change.as_deref(), Some("new"));
        *known.lock() = Some("s042".into());
        whole.send(()).unwrap();
        let first = trigger.next().await.map(|o| name(&o));
        assert_eq!(first.as_deref(), Some("s042"));
        assert_eq!(ready_now(&mut trigger).len(), BACKLOG);
    }

    #[tokio::test]
    async fn changes_after_list_leave_the_list_out() {
        let (shared, events, driver) = fed();
        let trigger = changes_after_list(&shared);
        listed(&events, &["a".into(), "b".into()]).await;
        send(&events, watcher::Event::Apply(cm("c"))).await;
        send(&events, watcher::Event::Delete(cm("a"))).await;
        drop(events);
        driver.await.unwrap_or_default();
        drop(shared);
        let seen: Vec<String> = trigger.map(|o| name(&o)).collect().await;
        assert_eq!(seen, ["c", "a"]);
    }

    #[tokio::test]
    async fn the_trigger_ends_with_its_watch_once_the_pass_is_handed_over() {
        let (shared, events, driver) = fed();
        listed(&events, &settled(3)).await;
        shared.ready().await;
        let trigger = paced_trigger(&shared, by_name, Arc::default(), async {});
        drop(events);
        driver.await.unwrap_or_default();
        drop(shared);
        let mut seen: Vec<String> = trigger.map(|o| name(&o)).collect().await;
        seen.sort();
        assert_eq!(seen, settled(3));
    }
}
