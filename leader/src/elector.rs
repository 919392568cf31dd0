//! The election loop: acquire, renew, step down, release, against the Lease on the API server.
//!
//! Owns the Lease named by its [`ElectionConfig`] and the leadership channel. It follows client-go's
//! `LeaderElector` (observed-time expiry, resourceVersion concurrency, transitions, release on
//! shutdown) with one difference: after losing leadership it goes back to being a standby instead
//! of ending, because our replicas keep serving read-only work while they wait.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until, timeout, timeout_at};
use tracing::{Instrument, debug, info, info_span, warn};

use crate::record::{self, Verdict};
use crate::{ElectionConfig, ElectionError};

/// Who holds the Lease as this process last saw it, for logs and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseHolder {
    /// `holderIdentity`, `None` when vacant (released) or not read yet.
    pub holder: Option<String>,
    /// `leaseTransitions`: how many times leadership changed hands.
    pub transitions: i32,
}

/// Elects one leader among the replicas sharing a Lease.
///
/// Create it, hand out [`LeaderElector::subscribe`] receivers to whatever must only run on the
/// leader, then drive it with [`LeaderElector::run`].
pub struct LeaderElector {
    inner: Elector<KubeLeases>,
}

impl LeaderElector {
    /// Validates `config`; no request is made until [`LeaderElector::run`].
    pub fn new(client: Client, config: ElectionConfig) -> Result<Self, ElectionError> {
        let store = KubeLeases {
            api: Api::namespaced(client, &config.namespace),
            name: config.name.clone(),
            lease: config.lease_ref(),
        };
        Ok(Self {
            inner: Elector::new(store, config)?,
        })
    }

    /// `true` exactly while this process may act as leader.
    ///
    /// It turns `false` at the latest `renew_deadline` after the start of the last successful
    /// renewal, before the Lease can expire for any standby, and before the Lease is released on
    /// shutdown. Work guarded by it must stop as soon as it reads `false`.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.inner.leading.subscribe()
    }

    /// The Lease's holder and transition count as last read or written.
    pub fn holder(&self) -> watch::Receiver<LeaseHolder> {
        self.inner.holder.subscribe()
    }

    /// Runs the election until `shutdown` becomes `true` (or its sender is dropped: nobody could
    /// stop us otherwise), then steps down and releases the Lease if we hold it.
    ///
    /// Request errors are logged and retried every `retry_period`; they never end the loop.
    pub async fn run(self, shutdown: watch::Receiver<bool>) {
        self.inner.run(shutdown).await;
    }
}

// === impl KubeLeases ===

/// The three Lease requests election needs, so the loop can be tested on a fake API.
pub(crate) trait LeaseStore: Send + Sync {
    /// The Lease, or `None` when it does not exist.
    fn get(&self) -> impl Future<Output = Result<Option<Lease>, ElectionError>> + Send;
    /// Creates the Lease; fails if it exists.
    fn create(&self, lease: &Lease) -> impl Future<Output = Result<Lease, ElectionError>> + Send;
    /// Replaces the Lease; fails on a stale `resourceVersion`.
    fn replace(&self, lease: &Lease) -> impl Future<Output = Result<Lease, ElectionError>> + Send;
}

struct KubeLeases {
    api: Api<Lease>,
    name: String,
    lease: String,
}

impl KubeLeases {
    fn error(&self, op: &'static str) -> impl FnOnce(kube::Error) -> ElectionError {
        let lease = self.lease.clone();
        move |source| ElectionError::Api { op, lease, source }
    }
}

impl LeaseStore for KubeLeases {
    async fn get(&self) -> Result<Option<Lease>, ElectionError> {
        self.api
            .get_opt(&self.name)
            .await
            .map_err(self.error("get"))
    }

    async fn create(&self, lease: &Lease) -> Result<Lease, ElectionError> {
        self.api
            .create(&PostParams::default(), lease)
            .await
            .map_err(self.error("create"))
    }

    async fn replace(&self, lease: &Lease) -> Result<Lease, ElectionError> {
        self.api
            .replace(&self.name, &PostParams::default(), lease)
            .await
            .map_err(self.error("replace"))
    }
}

// === impl Elector ===

/// The last version of the Lease we read or wrote, and when we first saw that spec.
struct Observed {
    lease: Lease,
    at: Instant,
}

impl Observed {
    fn spec(&self) -> LeaseSpec {
        self.lease.spec.clone().unwrap_or_default()
    }
}

/// The election state machine over any [`LeaseStore`].
pub(crate) struct Elector<S> {
    store: S,
    config: ElectionConfig,
    lease_seconds: i32,
    leading: watch::Sender<bool>,
    holder: watch::Sender<LeaseHolder>,
    observed: Option<Observed>,
    /// Set while we are leader: the end of our right to act unless we renew before.
    leading_until: Option<Instant>,
    /// When the Lease held by another replica expires for us, if nothing changes before: a
    /// standby tries again at that instant rather than on its next retry tick, so a crashed
    /// leader is replaced a full retry period sooner in the worst case.
    held_until: Option<Instant>,
}

impl<S: LeaseStore> Elector<S> {
    pub(crate) fn new(store: S, config: ElectionConfig) -> Result<Self, ElectionError> {
        config.validate()?;
        let lease_seconds =
            config
                .lease_duration_seconds()
                .ok_or_else(|| ElectionError::InvalidConfig {
                    reason: "lease_duration does not fit leaseDurationSeconds".into(),
                })?;
        Ok(Self {
            store,
            config,
            lease_seconds,
            leading: watch::Sender::new(false),
            holder: watch::Sender::new(LeaseHolder::default()),
            observed: None,
            leading_until: None,
            held_until: None,
        })
    }

    pub(crate) async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let span = info_span!(
            "leader_election",
            identity = %self.config.identity,
            lease = %self.config.lease_ref(),
        );
        async move {
            info!("starting leader election");
            loop {
                self.check_fence(Instant::now());
                let started = Instant::now();
                let deadline = record::attempt_deadline(
                    started,
                    self.leading_until,
                    self.config.renew_deadline,
                );
                if *shutdown.borrow() {
                    break;
                }
                // An attempt in flight is finished even if shutdown comes meanwhile (it is
                // bounded by `deadline`): dropping it could lose the answer to a write that
                // landed, and the release would then hold a stale resourceVersion.
                let outcome = timeout_at(deadline, self.try_acquire_or_renew(started)).await;
                match outcome {
                    Ok(Ok(true)) => self.renewed(started),
                    Ok(Ok(false)) => self.step_down("the lease is held by another replica"),
                    Ok(Err(error)) => warn!(%error, "lease attempt failed"),
                    Err(_) => warn!(
                        millis = deadline.saturating_duration_since(started).as_millis(),
                        "lease attempt timed out"
                    ),
                }
                self.check_fence(Instant::now());
                let mut wake = Instant::now() + self.pause();
                if let Some(until) = self.leading_until {
                    wake = wake.min(until);
                }
                if let Some(expiry) = self.held_until.take() {
                    wake = wake.min(expiry);
                }
                tokio::select! {
                    biased;
                    () = shutdown_requested(&mut shutdown) => break,
                    () = sleep_until(wake) => {}
                }
            }
            self.step_down("shutting down");
            match self.release().await {
                Ok(true) => info!("released the lease"),
                Ok(false) => debug!("not the holder, nothing to release"),
                Err(error) => warn!(%error, "could not release the lease; it will expire"),
            }
        }
        .instrument(span)
        .await;
    }

    /// One client-go `tryAcquireOrRenew`: `Ok(true)` when we hold the Lease after it.
    async fn try_acquire_or_renew(&mut self, started: Instant) -> Result<bool, ElectionError> {
        let identity = self.config.identity.clone();
        // Fast path: a leader renews its cached copy without reading first.
        if self.leading_until.is_some()
            && let Some(observed) = &self.observed
            && record::holder(&observed.spec()) == Some(identity.as_str())
        {
            let mut lease = observed.lease.clone();
            lease.spec = Some(record::renewed(
                &observed.spec(),
                &identity,
                self.lease_seconds,
                wall_now(),
            ));
            match self.store.replace(&lease).await {
                Ok(written) => {
                    self.observe(written, Instant::now());
                    return Ok(true);
                }
                Err(error) => debug!(%error, "fast renewal failed, reading the lease"),
            }
        }

        let Some(current) = self.store.get().await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(record::taken(
                    None,
                    &identity,
                    self.lease_seconds,
                    wall_now(),
                )),
            };
            let created = self.store.create(&lease).await?;
            self.observe(created, Instant::now());
            return Ok(true);
        };
        let mut lease = current.clone();
        let observed_at = self.observe(current, Instant::now());
        let spec = lease.spec.clone().unwrap_or_default();
        let next = match record::verdict(
            &spec,
            observed_at,
            &identity,
            Instant::now(),
            self.config.lease_duration,
        ) {
            Verdict::HeldByOther { holder, expires_at } => {
                self.held_until = Some(expires_at);
                debug!(
                    %holder,
                    expires_in_ms = expires_at.saturating_duration_since(started).as_millis(),
                    "lease held by another replica"
                );
                return Ok(false);
            }
            Verdict::Renew => record::renewed(&spec, &identity, self.lease_seconds, wall_now()),
            Verdict::Take => record::taken(Some(&spec), &identity, self.lease_seconds, wall_now()),
        };
        lease.spec = Some(next);
        let written = self.store.replace(&lease).await?;
        self.observe(written, Instant::now());
        Ok(true)
    }

    /// Records a version of the Lease; `at` only moves when the spec changed, which is what makes
    /// expiry count from the holder's last renewal as we saw it. Returns that first-seen instant.
    fn observe(&mut self, lease: Lease, at: Instant) -> Instant {
        let at = match &self.observed {
            Some(old) if old.lease.spec == lease.spec => old.at,
            _ => at,
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let now_holding = LeaseHolder {
            holder: record::holder(&spec).map(str::to_owned),
            transitions: spec.lease_transitions.unwrap_or(0),
        };
        self.holder.send_if_modified(|h| {
            let changed = *h != now_holding;
            *h = now_holding;
            changed
        });
        self.observed = Some(Observed { lease, at });
        at
    }

    /// A write that started at `started` succeeded: we may lead until `renew_deadline` after it.
    fn renewed(&mut self, started: Instant) {
        let until = record::leading_until(started, self.config.renew_deadline);
        if Instant::now() >= until {
            self.step_down("the renewal answered after the renew deadline");
            return;
        }
        self.leading_until = Some(until);
        let became = self
            .leading
            .send_if_modified(|l| !std::mem::replace(l, true));
        if became {
            let h = self.holder.borrow().clone();
            info!(transitions = h.transitions, "became leader");
        }
    }

    /// Ends our leadership once the renew deadline has passed without a successful renewal.
    fn check_fence(&mut self, now: Instant) {
        if self.leading_until.is_some_and(|until| now >= until) {
            self.step_down("could not renew the lease before the renew deadline");
        }
    }

    fn step_down(&mut self, reason: &str) {
        self.leading_until = None;
        if self
            .leading
            .send_if_modified(|l| std::mem::replace(l, false))
        {
            warn!(reason, "stopped being leader");
        }
    }

    /// client-go's ReleaseOnCancel: if the Lease we last saw is ours, write it vacant with a 1 s
    /// duration. The cached `resourceVersion` makes this a no-op conflict if anyone wrote since.
    /// On such a conflict the Lease is read once more: a renewal of ours whose answer was lost
    /// (timed out, connection reset) moved the resourceVersion without us seeing it, and the
    /// Lease is then still ours to release. Bounded by one `renew_deadline` in all.
    async fn release(&mut self) -> Result<bool, ElectionError> {
        let Some(observed) = self.observed.as_ref().map(|o| o.lease.clone()) else {
            return Ok(false);
        };
        let millis = self.config.renew_deadline.as_millis();
        let lease = self.config.lease_ref();
        timeout(self.config.renew_deadline, async {
            match self.release_from(observed).await {
                Err(error) if error.is_conflict() => {
                    debug!(%error, "the lease moved since we last saw it; reading it again");
                    match self.store.get().await? {
                        Some(current) => self.release_from(current).await,
                        None => Ok(false),
                    }
                }
                other => other,
            }
        })
        .await
        .map_err(|_| ElectionError::Timeout {
            op: "release",
            lease,
            millis,
        })?
    }

    /// Writes `lease` vacant if it names us as holder; `Ok(false)` if it names someone else.
    async fn release_from(&mut self, mut lease: Lease) -> Result<bool, ElectionError> {
        let spec = lease.spec.clone().unwrap_or_default();
        if record::holder(&spec) != Some(self.config.identity.as_str()) {
            return Ok(false);
        }
        lease.spec = Some(record::released(&spec, wall_now()));
        let written = self.store.replace(&lease).await?;
        self.observe(written, Instant::now());
        Ok(true)
    }

    /// The wait before the next attempt: `retry_period` for a leader; a standby adds up to 20 %
    /// jitter so replicas do not hit the API server in lockstep. client-go's standby jitter goes up
    /// to 120 %; we keep it small so a released Lease is taken within about one retry period.
    fn pause(&self) -> Duration {
        let period = self.config.retry_period;
        if self.leading_until.is_some() {
            return period;
        }
        vmdhcp_core::retry::between(period, period + period / 5)
    }
}

/// Resolves when shutdown is requested or can no longer be signalled.
async fn shutdown_requested(shutdown: &mut watch::Receiver<bool>) {
    // An error means the sender is gone: treat it as a shutdown too.
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// Wall-clock time for `renewTime` / `acquireTime`; informational for other replicas, which
/// judge expiry by their own monotonic clock.
fn wall_now() -> MicroTime {
    MicroTime(Timestamp::now())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU8, Ordering};
    use std::sync::{Arc, Mutex};

    use kube::core::Status;

    use super::*;

    const LD: Duration = Duration::from_secs(3);
    const RD: Duration = Duration::from_secs(2);
    const RP: Duration = Duration::from_millis(500);

    const UP: u8 = 0;
    const FAILING: u8 = 1;
    const HANGING: u8 = 2;
    /// Writes land on the server but their answers are lost (a timeout or reset after the fact).
    const LOSING_ANSWERS: u8 = 3;

    /// One API server: the Lease, its resourceVersion, and every successful write.
    #[derive(Default)]
    struct Server {
        lease: Option<Lease>,
        version: u64,
        /// (holder written, when) for every successful create/replace.
        writes: Vec<(Option<String>, Instant)>,
        /// (resourceVersion returned, when) for every successful get.
        reads: Vec<(u64, Instant)>,
    }

    /// One replica's connection to the shared server; `mode` cuts it off.
    #[derive(Clone)]
    struct FakeStore {
        server: Arc<Mutex<Server>>,
        mode: Arc<AtomicU8>,
    }

    impl FakeStore {
        fn connect(server: &Arc<Mutex<Server>>) -> Self {
            Self {
                server: server.clone(),
                mode: Arc::new(AtomicU8::new(UP)),
            }
        }

        async fn reachable(&self, op: &'static str) -> Result<(), ElectionError> {
            match self.mode.load(Ordering::SeqCst) {
                UP | LOSING_ANSWERS => Ok(()),
                FAILING => Err(api_error(op, 503)),
                _ => std::future::pending().await,
            }
        }

        fn store(&self, server: &mut Server, lease: &Lease) -> Lease {
            server.version += 1;
            let mut stored = lease.clone();
            stored.metadata.resource_version = Some(server.version.to_string());
            let holder = stored
                .spec
                .as_ref()
                .and_then(|s| record::holder(s).map(str::to_owned));
            server.writes.push((holder, Instant::now()));
            server.lease = Some(stored.clone());
            stored
        }
    }

    fn api_error(op: &'static str, code: u16) -> ElectionError {
        ElectionError::Api {
            op,
            lease: "ns/lease".into(),
            source: kube::Error::Api(Box::new(Status::failure("fake", "Fake").with_code(code))),
        }
    }

    impl LeaseStore for FakeStore {
        async fn get(&self) -> Result<Option<Lease>, ElectionError> {
            self.reachable("get").await?;
            let mut server = self.server.lock().unwrap();
            let version = server.version;
            server.reads.push((version, Instant::now()));
            Ok(server.lease.clone())
        }

        async fn create(&self, lease: &Lease) -> Result<Lease, ElectionError> {
            self.reachable("create").await?;
            let mut server = self.server.lock().unwrap();
            if server.lease.is_some() {
                return Err(api_error("create", 409));
            }
            Ok(self.store(&mut server, lease))
        }

        async fn replace(&self, lease: &Lease) -> Result<Lease, ElectionError> {
            self.reachable("replace").await?;
            let mut server = self.server.lock().unwrap();
            let current = server
                .lease
                .as_ref()
                .and_then(|l| l.metadata.resource_version.clone());
            if current.is_none() || current != lease.metadata.resource_version {
                return Err(api_error("replace", 409));
            }
            let stored = self.store(&mut server, lease);
            if self.mode.load(Ordering::SeqCst) == LOSING_ANSWERS {
                return Err(api_error("replace", 504));
            }
            Ok(stored)
        }
    }

    struct Replica {
        store: FakeStore,
        leading: watch::Receiver<bool>,
        holder: watch::Receiver<LeaseHolder>,
        stop: watch::Sender<bool>,
        task: tokio::task::JoinHandle<()>,
    }

    fn config(identity: &str) -> ElectionConfig {
        ElectionConfig {
            lease_duration: LD,
            renew_deadline: RD,
            retry_period: RP,
            ..ElectionConfig::new("ns", "lease", identity)
        }
    }

    fn start(server: &Arc<Mutex<Server>>, identity: &str) -> Replica {
        let store = FakeStore::connect(server);
        let elector = Elector::new(store.clone(), config(identity)).unwrap();
        let leading = elector.leading.subscribe();
        let holder = elector.holder.subscribe();
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(elector.run(stop_rx));
        Replica {
            store,
            leading,
            holder,
            stop,
            task,
        }
    }

    /// Waits (in paused time) until `rx` holds `want`; returns when that happened.
    async fn until(rx: &mut watch::Receiver<bool>, want: bool, within: Duration) -> Instant {
        timeout(within, rx.wait_for(|v| *v == want))
            .await
            .unwrap_or_else(|_| panic!("leadership did not become {want} within {within:?}"))
            .unwrap();
        Instant::now()
    }

    fn last_write_by(server: &Arc<Mutex<Server>>, who: &str) -> Instant {
        server
            .lock()
            .unwrap()
            .writes
            .iter()
            .rev()
            .find(|(h, _)| h.as_deref() == Some(who))
            .map(|(_, at)| *at)
            .unwrap()
    }

    fn lease(server: &Arc<Mutex<Server>>) -> LeaseSpec {
        server
            .lock()
            .unwrap()
            .lease
            .as_ref()
            .and_then(|l| l.spec.clone())
            .unwrap()
    }

    #[test]
    fn an_invalid_config_is_refused_at_construction() {
        let server = Arc::new(Mutex::new(Server::default()));
        let mut c = config("a");
        c.renew_deadline = LD;
        assert!(matches!(
            Elector::new(FakeStore::connect(&server), c),
            Err(ElectionError::InvalidConfig { .. })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_replica_creates_the_lease_and_the_second_waits() {
        let server = Arc::new(Mutex::new(Server::default()));
        let mut a = start(&server, "a");
        until(&mut a.leading, true, RP).await;
        let mut b = start(&server, "b");
        // Several retry periods and lease durations: b never leads while a renews.
        let end = Instant::now() + LD * 3;
        while Instant::now() < end {
            assert!(*a.leading.borrow() && !*b.leading.borrow());
            tokio::time::sleep(RP / 4).await;
        }
        let spec = lease(&server);
        assert_eq!(spec.holder_identity.as_deref(), Some("a"));
        assert_eq!(spec.lease_transitions, Some(0));
        assert_eq!(spec.lease_duration_seconds, Some(3));
        assert_eq!(
            b.holder.borrow_and_update().holder.as_deref(),
            Some("a"),
            "a standby reports the holder it sees"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_that_cannot_renew_steps_down_before_a_standby_may_take_over() {
        for mode in [FAILING, HANGING] {
            let server = Arc::new(Mutex::new(Server::default()));
            let mut a = start(&server, "a");
            until(&mut a.leading, true, RP).await;
            let mut b = start(&server, "b");
            tokio::time::sleep(RP * 3).await;
            a.store.mode.store(mode, Ordering::SeqCst);

            let stepped_down = until(&mut a.leading, false, LD).await;
            let last_renewal = last_write_by(&server, "a");
            assert!(
                stepped_down <= last_renewal + RD,
                "mode {mode}: led {:?} past its last renewal",
                stepped_down - last_renewal
            );
            assert!(!*b.leading.borrow(), "mode {mode}: two leaders");
            let took_over = until(&mut b.leading, true, LD * 2).await;
            assert!(
                took_over >= last_renewal + LD,
                "mode {mode}: b took a lease that had not expired"
            );
            let spec = lease(&server);
            assert_eq!(spec.holder_identity.as_deref(), Some("b"));
            assert_eq!(spec.lease_transitions, Some(1));
            a.task.abort();
            b.task.abort();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_fenced_leader_whose_lease_nobody_took_leads_again_when_the_api_returns() {
        let server = Arc::new(Mutex::new(Server::default()));
        let mut a = start(&server, "a");
        until(&mut a.leading, true, RP).await;
        a.store.mode.store(FAILING, Ordering::SeqCst);
        until(&mut a.leading, false, LD).await;
        a.store.mode.store(UP, Ordering::SeqCst);
        until(&mut a.leading, true, RP * 2).await;
        let spec = lease(&server);
        assert_eq!(spec.holder_identity.as_deref(), Some("a"));
        assert_eq!(spec.lease_transitions, Some(0), "not a new term");
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_steps_down_then_releases_so_a_standby_takes_over_within_a_retry_period() {
        let server = Arc::new(Mutex::new(Server::default()));
        let mut a = start(&server, "a");
        until(&mut a.leading, true, RP).await;
        let mut b = start(&server, "b");
        tokio::time::sleep(RP * 3).await;

        a.stop.send(true).unwrap();
        let stopped = Instant::now();
        a.task.await.unwrap();
        assert!(!*a.leading.borrow());
        let released = {
            let guard = server.lock().unwrap();
            guard.lease.as_ref().and_then(|l| l.spec.clone()).unwrap()
        };
        let taken_already = released.holder_identity.as_deref() == Some("b");
        if !taken_already {
            assert_eq!(record::holder(&released), None);
            assert_eq!(released.lease_duration_seconds, Some(1));
        }
        until(&mut b.leading, true, RP * 2).await;
        assert!(Instant::now() - stopped <= RP * 2);
        assert_eq!(lease(&server).lease_transitions, Some(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_whose_answer_was_lost_does_not_keep_the_release_from_landing() {
        let server = Arc::new(Mutex::new(Server::default()));
        let mut a = start(&server, "a");
        until(&mut a.leading, true, RP).await;
        let writes = || server.lock().unwrap().writes.len();
        let before = writes();
        a.store.mode.store(LOSING_ANSWERS, Ordering::SeqCst);
        // Renewals land (the server counts them) while `a` sees only errors.
        while writes() < before + 2 {
            tokio::time::sleep(RP / 4).await;
        }
        a.store.mode.store(UP, Ordering::SeqCst);
        a.stop.send(true).unwrap();
        a.task.await.unwrap();
        let spec = lease(&server);
        assert_eq!(record::holder(&spec), None, "the lease was not released");
        assert_eq!(spec.lease_duration_seconds, Some(1));
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_crash_the_standby_waits_for_the_lease_to_expire() {
        let server = Arc::new(Mutex::new(Server::default()));
        let mut a = start(&server, "a");
        until(&mut a.leading, true, RP).await;
        let mut b = start(&server, "b");
        tokio::time::sleep(RP * 3).await;

        a.task.abort();
        let last_renewal = last_write_by(&server, "a");
        let took_over = until(&mut b.leading, true, LD + RP * 2).await;
        assert!(took_over >= last_renewal + LD);
        assert_eq!(lease(&server).holder_identity.as_deref(), Some("b"));
        // Expiry counts from b's first look at a's last renewal, and b tries again at that very
        // instant, not on its next retry tick.
        let first_look = {
            let guard = server.lock().unwrap();
            let last = guard
                .writes
                .iter()
                .filter(|(h, _)| h.as_deref() == Some("a"))
                .count();
            let version = u64::try_from(last).unwrap();
            guard
                .reads
                .iter()
                .find(|(v, _)| *v == version)
                .map(|(_, at)| *at)
                .unwrap()
        };
        assert_eq!(took_over, first_look + LD);
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_replica_waits_a_full_lease_duration_from_its_first_look() {
        // client-go's rule: a record we have just met counts as freshly renewed, whatever its
        // renewTime says, because our clock and the writer's may disagree.
        let server = Arc::new(Mutex::new(Server::default()));
        let mut a = start(&server, "a");
        until(&mut a.leading, true, RP).await;
        a.task.abort();
        tokio::time::sleep(LD * 2).await;

        let first_look = Instant::now();
        let mut b = start(&server, "b");
        let took_over = until(&mut b.leading, true, LD + RP * 2).await;
        assert!(took_over >= first_look + LD);
    }
}
