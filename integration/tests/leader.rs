//! Leader election against a real kube-apiserver: one leader at a time, graceful handoff within
//! about a retry period, takeover after a crash only once the Lease expired, and a leader cut off
//! from the API server stepping down before a standby may take over.
//!
//! Timings are shortened to 3 s / 2 s / 0.5 s; every wait is a bounded poll, and the only timing
//! assertions are "within the deadline" bounds, generous enough not to flake.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::jiff::SignedDuration;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};
use vmdhcp_integration::control_plane::ControlPlane;
use vmdhcp_leader::{ElectionConfig, LeaderElector, LeaseHolder};

const LEASE: &str = "vmdhcp-test";
const LD: Duration = Duration::from_secs(3);
const RD: Duration = Duration::from_secs(2);
const RP: Duration = Duration::from_millis(500);
const POLL: Duration = Duration::from_millis(20);

fn config(ns: &str, identity: &str) -> ElectionConfig {
    ElectionConfig {
        lease_duration: LD,
        renew_deadline: RD,
        retry_period: RP,
        ..ElectionConfig::new(ns, LEASE, identity)
    }
}

/// One replica: its election task and what it publishes.
struct Replica {
    leading: watch::Receiver<bool>,
    holder: watch::Receiver<LeaseHolder>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Replica {
    fn start(client: Client, ns: &str, identity: &str) -> Self {
        let elector = LeaderElector::new(client, config(ns, identity)).unwrap();
        let (stop, stop_rx) = watch::channel(false);
        Self {
            leading: elector.subscribe(),
            holder: elector.holder(),
            task: tokio::spawn(elector.run(stop_rx)),
            stop,
        }
    }

    fn leads(&self) -> bool {
        *self.leading.borrow()
    }

    /// Graceful shutdown, bounded.
    async fn shutdown(self) {
        self.stop.send(true).unwrap();
        timeout(RD + Duration::from_secs(2), self.task)
            .await
            .expect("the elector did not stop")
            .unwrap();
    }
}

/// Records whether two replicas were ever leader at the same time, on every change of either.
struct NoOverlap {
    overlap: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl NoOverlap {
    fn watch(a: &Replica, b: &Replica) -> Self {
        let (mut a, mut b) = (a.leading.clone(), b.leading.clone());
        let overlap = Arc::new(AtomicBool::new(false));
        let seen = overlap.clone();
        let task = tokio::spawn(async move {
            loop {
                if *a.borrow_and_update() && *b.borrow_and_update() {
                    seen.store(true, Ordering::SeqCst);
                }
                tokio::select! {
                    r = a.changed() => if r.is_err() { return },
                    r = b.changed() => if r.is_err() { return },
                }
            }
        });
        Self { overlap, task }
    }

    fn assert_never(self) {
        self.task.abort();
        assert!(
            !self.overlap.load(Ordering::SeqCst),
            "two replicas were leader at the same time"
        );
    }
}

/// Polls `check` every [`POLL`] until it holds; panics with `what` after `within`.
async fn eventually(what: &str, within: Duration, mut check: impl FnMut() -> bool) -> Instant {
    let deadline = Instant::now() + within;
    loop {
        if check() {
            return Instant::now();
        }
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        sleep(POLL).await;
    }
}

async fn lease(client: &Client, ns: &str) -> LeaseSpec {
    Api::<Lease>::namespaced(client.clone(), ns)
        .get(LEASE)
        .await
        .unwrap()
        .spec
        .unwrap()
}

/// `a` leads and `b` is a standby that has seen `a` hold the Lease.
async fn a_leads_b_waits(a_client: Client, b_client: Client, ns: &str) -> (Replica, Replica) {
    let a = Replica::start(a_client, ns, "a");
    eventually("a leads", Duration::from_secs(10), || a.leads()).await;
    let b = Replica::start(b_client, ns, "b");
    eventually(
        "b sees a holding the lease",
        Duration::from_secs(10),
        || b.holder.borrow().holder.as_deref() == Some("a"),
    )
    .await;
    assert!(!b.leads());
    (a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_never_lead_at_once_and_one_leads() {
    let cp = ControlPlane::shared();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "leader-one").await.unwrap();

    // Both race to create the Lease.
    let a = Replica::start(client.clone(), &ns, "a");
    let b = Replica::start(client.clone(), &ns, "b");
    let monitor = NoOverlap::watch(&a, &b);
    eventually("someone leads", Duration::from_secs(10), || {
        a.leads() || b.leads()
    })
    .await;

    // Over several lease durations of renewals, exactly one leads at every look.
    let end = Instant::now() + LD * 3;
    while Instant::now() < end {
        assert!(
            a.leads() != b.leads(),
            "leading: a={} b={}",
            a.leads(),
            b.leads()
        );
        sleep(POLL).await;
    }
    let leader = if a.leads() { "a" } else { "b" };
    let spec = lease(&client, &ns).await;
    assert_eq!(spec.holder_identity.as_deref(), Some(leader));
    assert_eq!(spec.lease_duration_seconds, Some(3));
    assert_eq!(spec.lease_transitions, Some(0));
    assert!(spec.renew_time >= spec.acquire_time);

    monitor.assert_never();
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_releases_and_the_standby_leads_within_about_a_retry_period() {
    let cp = ControlPlane::shared();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "leader-graceful").await.unwrap();
    let (a, b) = a_leads_b_waits(client.clone(), client.clone(), &ns).await;
    let monitor = NoOverlap::watch(&a, &b);
    let transitions = lease(&client, &ns).await.lease_transitions;

    let stopped = Instant::now();
    let mut a_leading = a.leading.clone();
    a.shutdown().await;
    assert!(!*a_leading.borrow_and_update());
    let released = lease(&client, &ns).await;
    match released.holder_identity.as_deref() {
        // b may already have taken it between the release and this read.
        Some("b") => {}
        holder => {
            assert!(holder.is_none_or(str::is_empty), "holder {holder:?}");
            assert_eq!(released.lease_duration_seconds, Some(1));
            assert_eq!(released.lease_transitions, transitions);
        }
    }

    let deadline = stopped + Duration::from_secs(5);
    eventually("b leads after a released", Duration::from_secs(5), || {
        b.leads()
    })
    .await;
    assert!(Instant::now() <= deadline);
    let spec = lease(&client, &ns).await;
    assert_eq!(spec.holder_identity.as_deref(), Some("b"));
    assert_eq!(spec.lease_transitions, transitions.map(|t| t + 1));

    monitor.assert_never();
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_crash_the_standby_leads_only_once_the_lease_expired() {
    let cp = ControlPlane::shared();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "leader-crash").await.unwrap();
    let (a, b) = a_leads_b_waits(client.clone(), client.clone(), &ns).await;
    let transitions = lease(&client, &ns).await.lease_transitions;

    // A crash: the task is gone, nothing is released.
    a.task.abort();
    let crashed = Instant::now();
    let deadline = crashed + LD + Duration::from_secs(2);
    let mut last_renewal_by_a = None;
    loop {
        if b.leads() {
            break;
        }
        let spec = lease(&client, &ns).await;
        match spec.holder_identity.as_deref() {
            Some("a") => last_renewal_by_a = spec.renew_time.clone().max(last_renewal_by_a),
            // b has just written its takeover; its leadership flag follows.
            Some("b") => {}
            other => panic!("the lease was not left to expire: holder {other:?}"),
        }
        assert!(
            Instant::now() < deadline,
            "b did not take over within lease duration + 2 s"
        );
        sleep(POLL).await;
    }

    let spec = lease(&client, &ns).await;
    assert_eq!(spec.holder_identity.as_deref(), Some("b"));
    assert_eq!(spec.lease_transitions, transitions.map(|t| t + 1));
    // b's takeover is at least a lease duration after a's last renewal, by the same wall clock
    // (100 ms of slack for wall-clock adjustments, which the monotonic clocks do not see).
    let last = last_renewal_by_a.unwrap().0;
    let acquired = spec.acquire_time.unwrap().0;
    let gap = acquired.duration_since(last);
    assert!(
        gap >= SignedDuration::try_from(LD).unwrap() - SignedDuration::from_millis(100),
        "b took the lease {gap:?} after a's last renewal"
    );
    b.shutdown().await;
}

/// A TCP relay to the API server that can be cut: open connections are dropped, and later ones
/// are accepted but never answered, as in a network partition.
struct Proxy {
    url: String,
    cut: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{}", listener.local_addr().unwrap());
        let (cut, cut_rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut blackholed = Vec::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                if *cut_rx.borrow() {
                    blackholed.push(inbound);
                    continue;
                }
                let mut cut_rx = cut_rx.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut_rx.wait_for(|c| *c) => {}
                    }
                });
            }
        });
        Self { url, cut, task }
    }

    fn cut(&self) {
        self.cut.send_replace(true);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}

/// An admin client whose requests go through `url` instead of straight to the API server.
async fn client_via(cp: &ControlPlane, url: &str) -> Client {
    let kubeconfig = Kubeconfig::read_from(cp.kubeconfig()).unwrap();
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    config.cluster_url = url.parse().unwrap();
    Client::try_from(config).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_api_steps_down_before_the_standby_may_take_over() {
    let cp = ControlPlane::shared();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "leader-fence").await.unwrap();
    let upstream: SocketAddr = cp.server().trim_start_matches("https://").parse().unwrap();
    let proxy = Proxy::start(upstream).await;
    let (a, b) = a_leads_b_waits(client_via(cp, &proxy.url).await, client.clone(), &ns).await;
    let monitor = NoOverlap::watch(&a, &b);
    let transitions = lease(&client, &ns).await.lease_transitions;

    proxy.cut();
    let mut a_leading = a.leading.clone();
    timeout(LD + Duration::from_secs(2), a_leading.wait_for(|l| !*l))
        .await
        .expect("the cut-off leader kept leading")
        .unwrap();
    // At the moment a stops, the Lease is still a's for everyone else: b cannot have taken it.
    assert!(!b.leads(), "b leads while a still did");
    assert_eq!(
        lease(&client, &ns).await.holder_identity.as_deref(),
        Some("a"),
        "a stepped down only after its lease was taken"
    );

    eventually(
        "b takes over from the cut-off leader",
        LD + Duration::from_secs(2),
        || b.leads(),
    )
    .await;
    let spec = lease(&client, &ns).await;
    assert_eq!(spec.holder_identity.as_deref(), Some("b"));
    assert_eq!(spec.lease_transitions, transitions.map(|t| t + 1));
    assert!(!a.leads(), "the cut-off replica must stay a standby");

    monitor.assert_never();
    a.task.abort();
    b.shutdown().await;
    drop(proxy);
}
