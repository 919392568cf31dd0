//! Kubernetes events: the bounded queue reconcilers hand them to, the correlation that keeps a
//! Warning from being repeated, and the one task per term that publishes them
//! (`events.k8s.io/v1`), folding repeats into a series.
//!
//! A Warning is said once per object, reason and words: a reconcile refused again on every pass
//! (each write of a pool wakes the configs waiting on its network, and a tenant can make many of
//! them) does not write it again, however stale the cache its `Allocated` condition was read
//! from, and each object and reason has client-go's spam budget besides (25, then one every
//! five minutes) for words that keep changing.
//!
//! kube-runtime's `Recorder` keeps every event it published for six minutes, keyed by the
//! object's full reference (resourceVersion included, so nearly every event is a new key), and
//! walks that whole map on every publish to expire old entries. Building up a cluster, that is
//! one cached event per allocation of the last six minutes, and a scan growing with the
//! allocation rate on every event. Here repeats are remembered in a cache bounded in size and
//! age: the cost of one event is one API call and O(1) bookkeeping, whatever the cluster's size
//! or history.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use moka::future::Cache;
use parking_lot::Mutex;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::warn;

use crate::metrics::EventCounts;

/// Events waiting to be published at most; more are dropped (counted: `vmdhcpcontroller_events`
/// with `result="dropped"`, and in the log).
pub const EVENT_QUEUE: usize = 1024;

/// The warnings that say another host uses an address, or two MACs were recorded for one:
/// the last room in the event queue is theirs.
pub const ADDRESS_WARNINGS: [&str; 2] = ["AddressConflict", "AddressCollision"];

/// Series remembered at most (a repeat of an event older or evicted starts a new Event object).
pub const SERIES_KEPT: u64 = 4096;

/// How long a published event may be continued as a series: client-go's and kube-runtime's six
/// minutes, so `kubectl describe` shows the same aggregation as for built-in controllers.
pub const SERIES_TTL: Duration = Duration::from_secs(6 * 60);

/// How long a Warning said of an object is not said again in the same words.
pub const REPEAT_WINDOW: Duration = Duration::from_secs(10 * 60);

/// Warnings of one object and reason sent at once, at most (client-go's spam filter burst).
pub const WARNING_BURST: f64 = 25.0;

/// How often one more Warning of an object and reason may be sent past the burst (client-go's
/// spam filter: one every five minutes).
pub const WARNING_REFILL: Duration = Duration::from_secs(5 * 60);

/// Objects and reasons whose last Warning is remembered, at most.
const WARNINGS_KEPT: usize = 16_384;

/// A bounded queue of Kubernetes events, drained by one publisher task ([`Events::run`]).
pub struct Events {
    tx: mpsc::Sender<(Event, ObjectReference)>,
    counts: EventCounts,
    warnings: Mutex<Correlator>,
}

/// The object (by identity) and reason a Warning is correlated by.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct WarningKey {
    object: (
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    ),
    reason: String,
}

/// The last Warning of an object and reason, and what is left of its budget.
#[derive(Debug)]
struct LastWarning {
    note: Option<String>,
    sent: Instant,
    budget: f64,
}

/// Which Warnings are news: not the words last said of the object for this reason (within
/// [`REPEAT_WINDOW`]), and within the object's budget for the reason.
#[derive(Debug, Default)]
struct Correlator {
    last: HashMap<WarningKey, LastWarning>,
}

impl Correlator {
    /// Whether `event` about `about` is to be sent at `now` (and, if so, remembered).
    fn admit(&mut self, event: &Event, about: &ObjectReference, now: Instant) -> bool {
        let key = WarningKey {
            object: (
                about.kind.clone(),
                about.namespace.clone(),
                about.name.clone(),
                about.uid.clone(),
            ),
            reason: event.reason.clone(),
        };
        if let Some(last) = self.last.get_mut(&key) {
            let since = now.saturating_duration_since(last.sent);
            if last.note == event.note && since < REPEAT_WINDOW {
                return false;
            }
            let budget = (last.budget + since.as_secs_f64() / WARNING_REFILL.as_secs_f64())
                .min(WARNING_BURST);
            if budget < 1.0 {
                return false;
            }
            *last = LastWarning {
                note: event.note.clone(),
                sent: now,
                budget: budget - 1.0,
            };
            return true;
        }
        if self.last.len() >= WARNINGS_KEPT {
            self.last
                .retain(|_, w| now.saturating_duration_since(w.sent) < REPEAT_WINDOW);
        }
        // Still full of recent ones: sent, not remembered (a repeat then costs a series write).
        if self.last.len() < WARNINGS_KEPT {
            self.last.insert(
                key,
                LastWarning {
                    note: event.note.clone(),
                    sent: now,
                    budget: WARNING_BURST - 1.0,
                },
            );
        }
        true
    }
}

impl Events {
    /// A queue of at most `capacity` events and its receiving end, for [`Events::run`]; what
    /// becomes of each event is counted in `counts`.
    pub fn new(
        capacity: usize,
        counts: EventCounts,
    ) -> (Self, mpsc::Receiver<(Event, ObjectReference)>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let warnings = Mutex::default();
        (
            Events {
                tx,
                counts,
                warnings,
            },
            rx,
        )
    }

    /// Queues an event; drops it when the queue is full (the API server is slow or down). The
    /// last quarter of the queue is kept for warnings: a burst of allocations fills the queue
    /// with `Allocated` events faster than one publisher empties it under load (most of them
    /// are dropped: docs/tuning.md), and a refusal or an address conflict in that burst, what
    /// an operator reads events for, must not be dropped for them. Of that quarter, the last
    /// half is kept for [`ADDRESS_WARNINGS`]: warnings a reconcile repeats on every pass (a MAC
    /// in use, a pool full) must not push out the one that says another host uses an address.
    pub fn send(&self, event: Event, about: ObjectReference) {
        if matches!(event.type_, EventType::Warning)
            && !self.warnings.lock().admit(&event, &about, Instant::now())
        {
            self.counts.repeated.inc();
            return;
        }
        let for_warnings = self.tx.max_capacity() / 4;
        let for_addresses = self.tx.max_capacity() / 8;
        let admitted = match event.type_ {
            EventType::Warning if ADDRESS_WARNINGS.contains(&event.reason.as_str()) => true,
            EventType::Warning => self.tx.capacity() > for_addresses,
            EventType::Normal => self.tx.capacity() > for_warnings,
        };
        if !admitted || self.tx.try_send((event, about)).is_err() {
            let n = self.counts.dropped.inc() + 1;
            if n.is_power_of_two() {
                warn!(dropped = n, "event queue full; events dropped");
            }
        }
    }

    /// Publishes queued events one at a time until every sender is gone, counting each in
    /// `counts` as published or failed.
    pub async fn run(
        publisher: Publisher,
        mut rx: mpsc::Receiver<(Event, ObjectReference)>,
        counts: EventCounts,
    ) {
        while let Some((event, about)) = rx.recv().await {
            // Boxed: the cache's futures are large, and this loop is polled inside the term's
            // future, on the stack of whoever drives it.
            match Box::pin(publisher.publish(&event, &about)).await {
                Ok(()) => {
                    counts.published.inc();
                }
                Err(e) => {
                    counts.failed.inc();
                    warn!(error = %e, reason = %event.reason, "could not record event");
                }
            }
        }
    }
}

/// What makes two events the same occurrence: the object (by identity, not version) and
/// everything the event says.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct SeriesKey {
    kind: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    uid: Option<String>,
    type_: &'static str,
    reason: String,
    action: String,
    note: Option<String>,
}

impl SeriesKey {
    fn of(ev: &Event, about: &ObjectReference) -> Self {
        SeriesKey {
            kind: about.kind.clone(),
            namespace: about.namespace.clone(),
            name: about.name.clone(),
            uid: about.uid.clone(),
            type_: type_name(ev.type_),
            reason: ev.reason.clone(),
            action: ev.action.clone(),
            note: ev.note.clone(),
        }
    }
}

/// How often at least a series' count is written while it repeats (see [`Publisher::publish`]).
pub const SERIES_REFRESH: Duration = Duration::from_secs(60);

/// The Event object a series continues, how many times it happened, and when its count was
/// last written.
#[derive(Clone, Debug)]
struct Series {
    namespace: String,
    name: String,
    count: i32,
    written: tokio::time::Instant,
}

/// Publishes events as `reporter`; a repeat within [`SERIES_TTL`] raises the first Event's
/// `series.count` instead of creating another object.
#[derive(Clone)]
pub struct Publisher {
    client: Client,
    reporter: Reporter,
    series: Cache<SeriesKey, Series>,
}

impl Publisher {
    /// A publisher remembering at most [`SERIES_KEPT`] series.
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self::with_capacity(client, reporter, SERIES_KEPT)
    }

    /// A publisher remembering at most `kept` series (tests use a small one).
    pub fn with_capacity(client: Client, reporter: Reporter, kept: u64) -> Self {
        Publisher {
            client,
            reporter,
            series: Cache::builder()
                .max_capacity(kept)
                .time_to_live(SERIES_TTL)
                .build(),
        }
    }

    /// Series remembered right now (after pending evictions).
    pub async fn series_kept(&self) -> u64 {
        self.series.run_pending_tasks().await;
        self.series.entry_count()
    }

    /// Publishes one event about `about` (in its namespace; "default" for a cluster-scoped one).
    ///
    /// A repeat raises its series' count, written to the API at the 2nd, 4th, 8th… occurrence
    /// and at least every [`SERIES_REFRESH`] while it goes on, as client-go's event recorder
    /// refreshes its series: a reconcile that says the same thing on every pass (a MAC in use,
    /// a pool full) costs API writes in the logarithm of its repeats, not one each.
    pub async fn publish(&self, ev: &Event, about: &ObjectReference) -> Result<(), kube::Error> {
        let key = SeriesKey::of(ev, about);
        let now = Timestamp::now();
        if let Some(mut series) = self.series.get(&key).await {
            series.count = series.count.saturating_add(1);
            let doubled = series.count.count_ones() == 1;
            if !doubled && series.written.elapsed() < SERIES_REFRESH {
                self.series.insert(key, series).await;
                return Ok(());
            }
            series.written = tokio::time::Instant::now();
            let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &series.namespace);
            let patch = json!({"series": EventSeries {
                count: series.count,
                last_observed_time: MicroTime(now),
            }});
            match api
                .patch(&series.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.series.insert(key, series).await;
                    return Ok(());
                }
                // Deleted or expired by the API server: start over with a new Event.
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let event = self.event(ev, about, now);
        let namespace = event.metadata.namespace.clone().unwrap_or_default();
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        let created = api.create(&PostParams::default(), &event).await?;
        let series = Series {
            namespace,
            name: created.metadata.name.unwrap_or_default(),
            count: 1,
            written: tokio::time::Instant::now(),
        };
        self.series.insert(key, series).await;
        Ok(())
    }

    fn event(&self, ev: &Event, about: &ObjectReference, now: Timestamp) -> K8sEvent {
        let namespace = about.namespace.clone().unwrap_or_else(|| "default".into());
        let name = about.name.as_deref().unwrap_or(&self.reporter.controller);
        K8sEvent {
            action: Some(ev.action.clone()),
            reason: Some(ev.reason.clone()),
            note: ev.note.clone(),
            type_: Some(type_name(ev.type_).into()),
            event_time: Some(MicroTime(now)),
            regarding: Some(about.clone()),
            related: ev.secondary.clone(),
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| self.reporter.controller.clone()),
            ),
            metadata: ObjectMeta {
                name: Some(format!("{name}.{:x}", now.as_nanosecond())),
                namespace: Some(namespace),
                ..Default::default()
            },
            ..Default::default()
        }
    }
}

fn type_name(t: EventType) -> &'static str {
    match t {
        EventType::Normal => "Normal",
        EventType::Warning => "Warning",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(note: &str) -> Event {
        Event {
            type_: EventType::Normal,
            reason: "Allocated".into(),
            note: Some(note.into()),
            action: "Allocate".into(),
            secondary: None,
        }
    }

    /// A queue of 8 that `n` normal events were sent to, its receiver and its counts.
    fn flooded(
        n: usize,
    ) -> (
        Events,
        mpsc::Receiver<(Event, ObjectReference)>,
        EventCounts,
    ) {
        let counts = EventCounts::default();
        let (events, rx) = Events::new(8, counts.clone());
        for _ in 0..n {
            events.send(ev("x"), ObjectReference::default());
        }
        (events, rx, counts)
    }

    #[tokio::test]
    async fn a_flood_of_events_is_bounded_and_counted() {
        let (events, mut rx, counts) = flooded(10_000);
        // Normal events: all but the quarter kept for warnings.
        assert_eq!(counts.dropped.get(), 10_000 - 6);
        let mut queued = 0;
        while rx.try_recv().is_ok() {
            queued += 1;
        }
        assert_eq!(queued, 6);
        // Room again once drained.
        events.send(ev("x"), ObjectReference::default());
        assert!(rx.try_recv().is_ok());
    }

    #[tokio::test]
    async fn warnings_keep_the_last_quarter_of_the_queue() {
        let (events, mut rx, counts) = flooded(100);
        // Normal events take three quarters of it.
        assert_eq!(counts.dropped.get(), 100 - 6);
        let warning = || Event {
            type_: EventType::Warning,
            reason: "AllocationRefused".into(),
            note: Some("pool full".into()),
            action: "Allocate".into(),
            secondary: None,
        };
        for n in 0..3 {
            events.send(warning(), object(n));
        }
        // One warning fits beside them; the last eighth is kept for address warnings.
        assert_eq!(counts.dropped.get(), 100 - 6 + 2);
        let conflict = || Event {
            reason: "AddressConflict".into(),
            note: Some("10.0.0.9 is used by 02:00:00:00:00:09".into()),
            ..warning()
        };
        events.send(conflict(), object(3));
        // The queue is full now: even that one is dropped.
        events.send(conflict(), object(4));
        assert_eq!(counts.dropped.get(), 100 - 6 + 3);
        let mut queued = Vec::new();
        while let Ok((e, _)) = rx.try_recv() {
            queued.push(e.reason);
        }
        assert_eq!(queued.len(), 8);
        assert_eq!(
            queued.iter().filter(|r| *r == "AllocationRefused").count(),
            1
        );
        assert_eq!(queued.last().map(String::as_str), Some("AddressConflict"));
    }

    /// Config `vm-<n>`.
    fn object(n: u32) -> ObjectReference {
        ObjectReference {
            kind: Some("VirtualMachineNetworkConfig".into()),
            namespace: Some("ns".into()),
            name: Some(format!("vm-{n}")),
            uid: Some(format!("u{n}")),
            ..Default::default()
        }
    }

    fn refused(note: &str) -> Event {
        Event {
            type_: EventType::Warning,
            reason: "MacInUse".into(),
            note: Some(note.into()),
            action: "Allocate".into(),
            secondary: None,
        }
    }

    #[tokio::test]
    async fn a_warning_is_said_once_per_object_reason_and_words() {
        let counts = EventCounts::default();
        let (events, mut rx) = Events::new(64, counts.clone());
        for _ in 0..10 {
            events.send(refused("02:00:00:00:00:01 is in use by vm-0"), object(1));
        }
        // Another object, or other words, are news; Normal events are not correlated.
        events.send(refused("02:00:00:00:00:01 is in use by vm-0"), object(2));
        events.send(refused("02:00:00:00:00:01 is in use by vm-9"), object(1));
        for _ in 0..2 {
            events.send(ev("allocated"), object(1));
        }
        let mut sent = Vec::new();
        while let Ok((e, about)) = rx.try_recv() {
            sent.push((e.reason, about.name.unwrap_or_default()));
        }
        assert_eq!(sent.len(), 5, "{sent:?}");
        assert_eq!(counts.repeated.get(), 9);
    }

    #[test]
    fn the_same_words_are_said_again_after_the_window_and_changing_words_have_a_budget() {
        let mut c = Correlator::default();
        let start = Instant::now();
        let same = refused("pool full");
        assert!(c.admit(&same, &object(1), start));
        assert!(!c.admit(&same, &object(1), start + REPEAT_WINDOW / 2));
        assert!(c.admit(&same, &object(1), start + REPEAT_WINDOW));
        // Words that change every time: the burst, then one per refill.
        let mut c = Correlator::default();
        let sent = (0..100)
            .filter(|i| c.admit(&refused(&format!("try {i}")), &object(1), start))
            .count();
        assert_eq!(sent, WARNING_BURST as usize);
        assert!(!c.admit(&refused("again"), &object(1), start + WARNING_REFILL / 2));
        assert!(c.admit(&refused("again"), &object(1), start + WARNING_REFILL));
        assert!(!c.admit(&refused("more"), &object(1), start + WARNING_REFILL));
        // The budget is per object and reason.
        assert!(c.admit(&refused("try 0"), &object(2), start));
    }

    #[test]
    fn the_correlator_is_bounded() {
        let mut c = Correlator::default();
        let start = Instant::now();
        for n in 0..(WARNINGS_KEPT as u32 + 10) {
            assert!(c.admit(&refused("x"), &object(n), start));
        }
        assert_eq!(c.last.len(), WARNINGS_KEPT);
        // Old entries make room.
        let later = start + REPEAT_WINDOW;
        assert!(c.admit(&refused("x"), &object(u32::MAX), later));
        assert_eq!(c.last.len(), 1);
    }

    #[test]
    fn a_series_is_the_object_by_identity_and_what_the_event_says() {
        let about = |rv: &str| ObjectReference {
            kind: Some("VirtualMachineNetworkConfig".into()),
            namespace: Some("ns".into()),
            name: Some("vm".into()),
            uid: Some("u1".into()),
            resource_version: Some(rv.into()),
            ..Default::default()
        };
        // Another version of the same object: the same series.
        assert_eq!(
            SeriesKey::of(&ev("a"), &about("1")),
            SeriesKey::of(&ev("a"), &about("2"))
        );
        // Another note, or another object with the same name: not.
        assert_ne!(
            SeriesKey::of(&ev("a"), &about("1")),
            SeriesKey::of(&ev("b"), &about("1"))
        );
        let mut recreated = about("1");
        recreated.uid = Some("u2".into());
        assert_ne!(
            SeriesKey::of(&ev("a"), &about("1")),
            SeriesKey::of(&ev("a"), &recreated)
        );
    }
}
