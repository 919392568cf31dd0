//! Per-interface servers kept running: one supervising task per interface, started and stopped
//! independently of the others, an attempt that fails retried with a growing delay, and each
//! interface's counters published while it runs. The DHCPv4 and DHCPv6 servers are both run
//! this way; what an attempt does (its sockets, its thread) is theirs.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tracing::{Instrument, Span, warn};
use vmdhcp_core::NamespacedName;

/// Delays between attempts to serve an interface that failed (`vmdhcp_core::retry::exponential`):
/// a missing interface (Multus has not attached it yet) is found quickly, one that keeps failing
/// costs a log line every half minute.
const MIN_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// An interface as a server of one pool serves it: what the supervisor keys and compares.
pub trait Served: Clone + PartialEq + Send + Sync + 'static {
    /// The Linux interface name (one server per name).
    fn name(&self) -> &str;
    /// The pool served on it.
    fn pool(&self) -> &NamespacedName;
}

/// What one attempt to serve an interface is given.
pub struct Attempt<C> {
    /// The interface's counters, kept across attempts.
    pub counters: Arc<C>,
    /// Becomes true when the interface is to stop; the attempt then returns `Ok`.
    pub stop: watch::Receiver<bool>,
    served: Arc<AtomicBool>,
}

impl<C> Attempt<C> {
    /// Says the attempt got its sockets and serves: a failure after this is retried after the
    /// shortest delay again, since the interface did work.
    pub fn serving(&self) {
        self.served.store(true, Ordering::Relaxed);
    }
}

/// A started interface: its own stop switch and supervising task.
struct Running<I> {
    interface: I,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

/// The running servers of one kind, one per interface, with their counters (`C`).
pub struct Supervisor<I, C> {
    running: BTreeMap<String, Running<I>>,
    counters_tx: watch::Sender<Vec<(I, Arc<C>)>>,
}

impl<I: Served, C: Default + Send + Sync + 'static> Default for Supervisor<I, C> {
    fn default() -> Self {
        Supervisor {
            running: BTreeMap::new(),
            counters_tx: watch::channel(Vec::new()).0,
        }
    }
}

impl<I: Served, C: Default + Send + Sync + 'static> Supervisor<I, C> {
    /// Starts serving `interface` in the background, in `span`: `attempt` is called until it
    /// returns `Ok` (stopped), and after each error `failed` hears it before the delay. Returns
    /// false, and starts nothing, when the interface already runs (a warning is logged if for
    /// another pool: the old server must be stopped first).
    pub fn start<F, Fut, E>(
        &mut self,
        interface: I,
        span: Span,
        mut attempt: F,
        failed: impl Fn(&str, String) + Send + 'static,
    ) -> bool
    where
        F: FnMut(Attempt<C>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send,
        E: Display + Send,
    {
        if let Some(r) = self.running.get(interface.name()) {
            if r.interface != interface {
                warn!(interface = %interface.name(), running = %r.interface.pool(), wanted = %interface.pool(), "interface already serves another pool; not restarted");
            }
            return false;
        }
        let counters = Arc::new(C::default());
        self.counters_tx.send_modify(|all| {
            all.retain(|(i, _)| i.name() != interface.name());
            all.push((interface.clone(), Arc::clone(&counters)));
        });
        let (stop, mut stopped) = watch::channel(false);
        let name = interface.name().to_owned();
        let task = tokio::spawn(
            async move {
                let fresh = || vmdhcp_core::retry::exponential(MIN_BACKOFF, MAX_BACKOFF);
                let mut delays = fresh();
                while !*stopped.borrow() {
                    let served = Arc::new(AtomicBool::new(false));
                    let result = attempt(Attempt {
                        counters: Arc::clone(&counters),
                        stop: stopped.clone(),
                        served: Arc::clone(&served),
                    })
                    .await;
                    let error = match result {
                        Ok(()) => return,
                        Err(e) => e.to_string(),
                    };
                    if served.load(Ordering::Relaxed) {
                        delays = fresh();
                    }
                    let backoff = delays.next().unwrap_or(MAX_BACKOFF);
                    warn!(%error, retry_in_ms = backoff.as_millis() as u64, "interface not serving");
                    failed(&name, error);
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = stopped.changed() => {}
                    }
                }
            }
            .instrument(span),
        );
        self.running.insert(
            interface.name().to_owned(),
            Running {
                interface,
                stop,
                task,
            },
        );
        true
    }

    /// Stops serving on `name` and waits until its attempt has returned (its sockets closed).
    /// Returns whether it was running.
    pub async fn stop(&mut self, name: &str) -> bool {
        let Some(r) = self.running.remove(name) else {
            return false;
        };
        let _ = r.stop.send(true);
        if let Err(error) = r.task.await {
            warn!(interface = %name, %error, "interface server task failed");
        }
        self.counters_tx
            .send_modify(|all| all.retain(|(i, _)| i.name() != name));
        true
    }

    /// Stops every interface (all told at once, then each awaited); returns their names.
    pub async fn stop_all(&mut self) -> Vec<String> {
        for r in self.running.values() {
            let _ = r.stop.send(true);
        }
        let names: Vec<String> = self.running.keys().cloned().collect();
        for name in &names {
            self.stop(name).await;
        }
        names
    }

    /// Whether an interface of this name runs.
    pub fn runs(&self, name: &str) -> bool {
        self.running.contains_key(name)
    }

    /// The interfaces running now.
    pub fn running(&self) -> impl Iterator<Item = &I> {
        self.running.values().map(|r| &r.interface)
    }

    /// Each running interface with its counters, updated as interfaces start and stop.
    pub fn counters(&self) -> watch::Receiver<Vec<(I, Arc<C>)>> {
        self.counters_tx.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[derive(Clone, Debug, PartialEq)]
    struct Iface(&'static str, NamespacedName);

    impl Served for Iface {
        fn name(&self) -> &str {
            self.0
        }
        fn pool(&self) -> &NamespacedName {
            &self.1
        }
    }

    fn iface(name: &'static str, pool: &str) -> Iface {
        Iface(name, pool.parse().unwrap())
    }

    /// Polls `cond` every 10 ms for up to 10 s.
    async fn eventually(what: &str, cond: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(tokio::time::Instant::now() < deadline, "never: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_failing_attempt_is_retried_and_reported_until_stopped() {
        let mut s: Supervisor<Iface, AtomicU64> = Supervisor::default();
        let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
        let heard = Arc::clone(&failures);
        let started = s.start(
            iface("eth1", "ns/a"),
            Span::none(),
            |a: Attempt<AtomicU64>| async move {
                let n = a.counters.fetch_add(1, Ordering::Relaxed);
                if n < 1 {
                    return Err(format!("attempt {n} failed"));
                }
                a.serving();
                let mut stop = a.stop;
                let _ = stop.wait_for(|s| *s).await;
                Ok::<(), String>(())
            },
            move |name, error| heard.lock().unwrap().push(format!("{name}: {error}")),
        );
        assert!(started);
        let counters = s.counters();
        eventually("the second attempt serves", || {
            counters
                .borrow()
                .first()
                .is_some_and(|(_, c)| c.load(Ordering::Relaxed) == 2)
        })
        .await;
        assert_eq!(*failures.lock().unwrap(), vec!["eth1: attempt 0 failed"]);
        // The same interface for another pool is refused while it runs; for the same, nothing.
        assert!(!s.start(
            iface("eth1", "ns/b"),
            Span::none(),
            |_| async { Ok::<(), String>(()) },
            |_, _| {}
        ));
        assert_eq!(s.running().count(), 1);
        assert_eq!(s.stop_all().await, vec!["eth1".to_owned()]);
        assert!(s.counters().borrow().is_empty());
        assert!(!s.stop("eth1").await);
    }
}
