//! One watch feeding several controllers.
//!
//! The VM controller and the config controller both react to VirtualMachines, and three triggers
//! react to IPPools. With a watch each, the API server sends every event several times, and —
//! worse — a reconciler woken by one watch may read a cache fed by another that has not seen the
//! event yet (a config reconciled for a deleted VM finds the VM still in the VM controller's cache
//! and is kept). [`watch`] runs one watch into one cache and hands every object, after the cache
//! has applied it, to each subscriber's trigger stream. Deletions are handed on too (kube's own
//! shared-store dispatcher forwards only applied objects).

use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;

use futures_util::{Stream, StreamExt};
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tracing::warn;

/// How many objects may wait for a slow subscriber before the watch waits for it.
const BUFFER: usize = 256;

/// A trigger stream for [`kube::runtime::Controller::for_stream`] or `watches_stream`.
pub type Trigger<K> = ReceiverStream<Result<K, watcher::Error>>;

/// Starts one watch of `api` shared by `N` subscribers: returns the cache, the future that drives
/// the watch (poll it alongside the controllers) and one trigger stream per subscriber. Cached
/// objects lose their `managedFields`, which nothing here reads (they are often the larger part
/// of an object).
pub fn watch<K, const N: usize>(
    api: Api<K>,
    dyntype: <K as Resource>::DynamicType,
    config: watcher::Config,
) -> (Store<K>, impl Future<Output = ()> + Send, [Trigger<K>; N])
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    <K as Resource>::DynamicType: Clone + Eq + Hash + Send + Sync,
{
    let kind = K::kind(&dyntype).into_owned();
    let writer = reflector::store::Writer::new(dyntype);
    let store = writer.as_reader();
    let touched = watcher(api, config)
        .default_backoff()
        .modify(|o| o.managed_fields_mut().clear())
        .reflect(writer)
        .touched_objects();
    let (drive, triggers) = fan_out(touched, kind);
    (store, drive, triggers)
}

/// Hands each object of `source` to every subscriber in order, waiting for room in each (a slow
/// subscriber slows the source rather than losing objects). Errors are logged here, not
/// forwarded: the source retries by itself and the subscribers need not each report them. A
/// subscriber that has gone away is skipped.
fn fan_out<K, E, S, const N: usize>(
    source: S,
    kind: String,
) -> (impl Future<Output = ()> + Send, [Trigger<K>; N])
where
    K: Clone + Send + 'static,
    E: std::fmt::Display + Send,
    S: Stream<Item = Result<K, E>> + Send + 'static,
{
    let mut senders = Vec::with_capacity(N);
    let triggers = std::array::from_fn(|_| {
        let (sender, receiver) = mpsc::channel(BUFFER);
        senders.push(sender);
        ReceiverStream::new(receiver)
    });
    let drive = async move {
        let mut source = std::pin::pin!(source);
        while let Some(item) = source.next().await {
            match item {
                Ok(obj) => {
                    for sender in &senders {
                        // Err: that subscriber has stopped; the others go on.
                        let _ = sender.send(Ok(obj.clone())).await;
                    }
                }
                Err(error) => warn!(%kind, %error, "watch failed; retrying"),
            }
        }
    };
    (drive, triggers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;
    use kube::runtime::reflector::ObjectRef;

    fn cm(name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn names<K: Resource>(items: Vec<Result<K, watcher::Error>>) -> Vec<String> {
        items
            .into_iter()
            .map(|i| {
                i.map(|o| o.meta().name.clone().unwrap_or_default())
                    .unwrap_or_default()
            })
            .collect()
    }

    #[tokio::test]
    async fn every_subscriber_gets_every_object_in_order_and_errors_stay_here() {
        let source =
            futures_util::stream::iter(vec![Ok(cm("a")), Err("boom"), Ok(cm("b")), Ok(cm("c"))]);
        let (drive, [one, two]) = fan_out::<_, _, _, 2>(source, "ConfigMap".into());
        drive.await;
        assert_eq!(names(one.collect().await), ["a", "b", "c"]);
        assert_eq!(names(two.collect().await), ["a", "b", "c"]);
    }

    #[tokio::test]
    async fn a_subscriber_that_stopped_does_not_stop_the_others() {
        // More objects than a channel holds: the driver must keep going for the reader it has.
        let total = 2 * BUFFER;
        let source =
            futures_util::stream::iter((0..total).map(|i| Ok::<_, String>(cm(&i.to_string()))));
        let (drive, [gone, kept]) = fan_out::<_, _, _, 2>(source, "ConfigMap".into());
        drop(gone);
        let driver = tokio::spawn(drive);
        assert_eq!(kept.collect::<Vec<_>>().await.len(), total);
        driver.await.unwrap();
    }

    /// The race this module exists for: when a subscriber sees an object, the shared cache has
    /// already applied that event — a deletion included. The test hands the watch one event at a
    /// time and looks at the cache when the subscriber receives it, before sending the next.
    #[tokio::test]
    async fn the_cache_has_applied_an_event_before_subscribers_see_it() {
        let (store, writer) = reflector::store::<ConfigMap>();
        let (events, rx) = mpsc::channel::<Result<watcher::Event<ConfigMap>, watcher::Error>>(1);
        let touched = ReceiverStream::new(rx).reflect(writer).touched_objects();
        let (drive, [trigger]) = fan_out::<_, _, _, 1>(touched, "ConfigMap".into());
        let driver = tokio::spawn(drive);
        let mut trigger = std::pin::pin!(trigger);
        for e in [watcher::Event::Init, watcher::Event::InitDone] {
            events.send(Ok(e)).await.unwrap_or_default();
        }
        let key = ObjectRef::from_obj(&cm("a"));
        for (event, cached) in [
            (watcher::Event::Apply(cm("a")), true),
            (watcher::Event::Delete(cm("a")), false),
            (watcher::Event::Apply(cm("a")), true),
        ] {
            events.send(Ok(event)).await.unwrap_or_default();
            let seen = trigger.next().await;
            assert!(matches!(seen, Some(Ok(_))), "{seen:?}");
            assert_eq!(store.get(&key).is_some(), cached);
        }
        drop(events);
        driver.await.unwrap_or_default();
    }
}
