//! The controller's runtime inside the test's own process, always leading (no election), for
//! the tests and benchmarks that count its work against the real API server. Shared by path
//! (`#[path = …] mod in_process;`): the integration library itself does not link the controller.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use kube::Client;
use tokio::sync::watch;
use vmdhcp_controller::runtime::{Settings, run};

/// A running controller; [`InProcess::stop`] lets its writes finish and waits for it.
pub struct InProcess {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    /// Its HTTP address (`/metrics`).
    pub http: SocketAddr,
}

impl InProcess {
    /// Starts a controller named `identity` on loopback ports, leading from the start.
    pub async fn start(client: &Client, identity: &str) -> InProcess {
        let (leading, leader) = watch::channel(true);
        let (stop, stop_rx) = watch::channel(false);
        let settings = Settings {
            identity: identity.into(),
            stream: Default::default(),
            agent: None,
            dumps: false,
            reports: None,
            agent_lease: None,
            orphan_grace: vmdhcp_controller::reconcile::orphans::DEFAULT_GRACE,
            vm_address_annotation: false,
        };
        let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = http.local_addr().unwrap();
        let client = client.clone();
        let task = tokio::spawn(async move {
            // The leader channel's sender lives as long as the controller: always leading.
            let _leading = leading;
            run(client, settings, grpc, http, leader, stop_rx, |_| {})
                .await
                .unwrap();
        });
        InProcess {
            stop,
            task,
            http: addr,
        }
    }

    /// Stops it (reconciles in flight finish their writes) and waits up to 30 s.
    pub async fn stop(self) {
        self.stop.send_replace(true);
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .unwrap()
            .unwrap();
    }

    /// Its `/metrics` text (empty while it does not answer).
    pub fn metrics(&self) -> String {
        vmdhcp_integration::http::get(&self.http.to_string(), "/metrics").unwrap_or_default()
    }

    /// The sum of every series of the counter or gauge `name` (0 when it has none yet).
    #[allow(dead_code)] // Not every user reads it.
    pub fn sum(&self, name: &str) -> f64 {
        self.metrics()
            .lines()
            .filter(|l| {
                l.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// `vmdhcpcontroller_reconciles_total` by controller (all results summed).
    #[allow(dead_code)] // Not every user reads it.
    pub fn reconciles(&self) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for line in self
            .metrics()
            .lines()
            .filter(|l| l.starts_with("vmdhcpcontroller_reconciles_total{"))
        {
            let controller = line
                .split("controller=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or_default()
                .to_owned();
            let value: f64 = line
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0);
            *out.entry(controller).or_insert(0.0) += value;
        }
        out
    }
}
