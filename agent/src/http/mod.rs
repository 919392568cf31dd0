//! The agent's HTTP endpoints: `/healthz` (the process runs), `/readyz` (leases are loaded and
//! every interface serves), `/leases` (what the table holds, pool → MAC → lease, with declined
//! addresses) and `/metrics` (Prometheus text, read from the servers' and the ARP announcer's
//! counters at scrape time).
//!
//! It only reads: the lease table, the interface statuses and the counters. Nothing here is on the
//! packet path; a scrape takes no lock the servers use.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use serde::Serialize;
use tokio::sync::watch;

use crate::arp::{ArpCounters, SendCounters, SendReading};
use crate::dhcp::counters::Reading;
use crate::dhcp::server::{InterfaceCounters, InterfaceStatus};
use crate::dhcp6::handler::DropReason as DropReason6;
use crate::dhcp6::server::{Counters6, Interface6};
use crate::host6::Host6Counters;
use crate::lease_table::{Conflict, LeaseTable};
use crate::stream::ConnectionStatus;
use crate::suspects::{SuspectKind, Suspects};

mod collectors;

use collectors::*;

/// Why the HTTP server stopped or could not start.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The listen address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The listen address cannot be bound on one of the interfaces the endpoints answer on.
    #[error("cannot listen on {addr} on interface {device}: {source}")]
    BindDevice {
        /// The address.
        addr: SocketAddr,
        /// The interface.
        device: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("HTTP server failed: {0}")]
    Serve(std::io::Error),
}

/// What the endpoints read; cheap to clone (all shared).
#[derive(Clone)]
pub struct HttpState {
    table: Arc<LeaseTable>,
    leases_loaded: watch::Receiver<bool>,
    statuses: watch::Receiver<BTreeMap<String, InterfaceStatus>>,
    registry: Arc<Registry>,
    stream: Option<watch::Receiver<ConnectionStatus>>,
    agent: Option<watch::Receiver<AgentStatus>>,
}

/// The agent process's role, as `/readyz` and `/metrics` show it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AgentStatus {
    /// Whether this replica holds the leader Lease (or runs without election) and answers DHCP.
    pub leader: bool,
    /// Who holds the Lease, as last seen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_holder: Option<String>,
    /// The Lease's `leaseTransitions` (how many times leadership changed hands), once seen held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_transitions: Option<i32>,
    /// Where the served leases come from: `stream`, `ippool-status` (fallback), `file`
    /// (`serve-static`), or `none`.
    pub source: &'static str,
    /// Why the agent cannot serve at all (invalid bootstrap env); never ready while set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl HttpState {
    /// Endpoints over `table` and the servers' `statuses` and `counters`; `leases_loaded` turns
    /// true once the first snapshot is applied (readiness waits for it).
    pub fn new(
        table: Arc<LeaseTable>,
        leases_loaded: watch::Receiver<bool>,
        statuses: watch::Receiver<BTreeMap<String, InterfaceStatus>>,
        counters: watch::Receiver<Vec<InterfaceCounters>>,
    ) -> Self {
        let mut registry = Registry::default();
        registry.register(
            "vmdhcp_agent_build",
            "The running version",
            prometheus_client::metrics::info::Info::new(vec![(
                "version".to_owned(),
                env!("CARGO_PKG_VERSION").to_owned(),
            )]),
        );
        registry.register_collector(Box::new(DataPlaneMetrics {
            table: Arc::clone(&table),
            statuses: statuses.clone(),
            counters,
        }));
        HttpState {
            table,
            leases_loaded,
            statuses,
            registry: Arc::new(registry),
            stream: None,
            agent: None,
        }
    }

    /// Also reports the agent's role: leader, lease source and fatal errors on `/readyz`, and
    /// `vmdhcp_agent_leader` on `/metrics`. Call it before the state is cloned.
    pub fn with_agent(mut self, status: watch::Receiver<AgentStatus>) -> Self {
        match Arc::get_mut(&mut self.registry) {
            Some(registry) => registry.register_collector(Box::new(RoleMetrics(status.clone()))),
            None => tracing::warn!(
                "HttpState::with_agent called after the state was shared; role metrics not registered"
            ),
        }
        self.agent = Some(status);
        self
    }

    /// Also reports the ARP announcements after takeovers: `vmdhcp_agent_arp_announcements`
    /// per interface and result, and whether they are possible at all. Call it before the state
    /// is cloned.
    pub fn with_arp(mut self, counters: ArpCounters) -> Self {
        match Arc::get_mut(&mut self.registry) {
            Some(registry) => registry.register_collector(Box::new(ArpMetrics(counters))),
            None => tracing::warn!(
                "HttpState::with_arp called after the state was shared; ARP metrics not registered"
            ),
        }
        self
    }

    /// Also reports the IPv6 guard of the pool interfaces ([`crate::host6`]):
    /// `vmdhcp_agent_ipv6_host_settings` and `vmdhcp_agent_ipv6_learned_removed_total` per
    /// interface and pool. Call it before the state is cloned.
    pub fn with_host6(mut self, counters: Host6Counters) -> Self {
        match Arc::get_mut(&mut self.registry) {
            Some(registry) => registry.register_collector(Box::new(Host6Metrics(counters))),
            None => tracing::warn!(
                "HttpState::with_host6 called after the state was shared; IPv6 guard metrics not registered"
            ),
        }
        self
    }

    /// Also reports the DHCPv6 servers of dual-stack pools: `vmdhcp_agent_dhcp6_*` per interface
    /// and pool, beside the DHCPv4 series. Call it before the state is cloned.
    pub fn with_dhcp6(
        mut self,
        counters: watch::Receiver<Vec<(Interface6, Arc<Counters6>)>>,
    ) -> Self {
        match Arc::get_mut(&mut self.registry) {
            Some(registry) => registry.register_collector(Box::new(Dhcp6Metrics(counters))),
            None => tracing::warn!(
                "HttpState::with_dhcp6 called after the state was shared; DHCPv6 metrics not registered"
            ),
        }
        self
    }

    /// Also reports the hosts found acting where they should not on the pools' networks:
    /// `vmdhcp_agent_network_suspects` per pool and kind (0 for every served pool without any),
    /// and the probes for foreign DHCP servers sent per interface. Call it before the state is
    /// cloned.
    pub fn with_suspects(mut self, suspects: Arc<Suspects>, probes: SendCounters) -> Self {
        let collector = SuspectMetrics {
            table: Arc::clone(&self.table),
            suspects,
            probes,
        };
        match Arc::get_mut(&mut self.registry) {
            Some(registry) => registry.register_collector(Box::new(collector)),
            None => tracing::warn!(
                "HttpState::with_suspects called after the state was shared; suspect metrics not registered"
            ),
        }
        self
    }

    /// Also reports the config stream: its state on `/readyz` and `vmdhcp_agent_stream_*` on
    /// `/metrics`. Call it before the state is cloned (the registry is completed here).
    pub fn with_stream(mut self, status: watch::Receiver<ConnectionStatus>) -> Self {
        match Arc::get_mut(&mut self.registry) {
            Some(registry) => registry.register_collector(Box::new(StreamMetrics(status.clone()))),
            None => tracing::warn!(
                "HttpState::with_stream called after the state was shared; stream metrics not registered"
            ),
        }
        self.stream = Some(status);
        self
    }
}

/// The config stream's state as `/readyz` shows it.
#[derive(Serialize)]
struct StreamView {
    connected: bool,
    synced: bool,
    epoch: String,
    revision: u64,
    connects: u64,
    rejected: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_error: Option<String>,
}

impl From<&ConnectionStatus> for StreamView {
    fn from(s: &ConnectionStatus) -> Self {
        StreamView {
            connected: s.connected,
            synced: s.synced,
            epoch: s.epoch.clone(),
            revision: s.revision,
            connects: s.connects,
            rejected: s.rejected,
            last_error: s.last_error.clone(),
        }
    }
}

/// The router with every endpoint.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/leases", get(leases))
        .route("/metrics", get(metrics))
        .with_state(state)
}

/// Serves `router` on `addr` until `shutdown` turns true (or its sender goes away).
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    shutdown: watch::Receiver<bool>,
) -> Result<(), HttpError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| HttpError::Bind { addr, source })?;
    serve_on(listener, router, shutdown).await
}

/// Binds `addr` once per interface of `devices`, each socket bound to its device
/// (`SO_BINDTODEVICE`): it accepts only connections that arrive on that interface, whatever
/// local address they are for.
pub fn bind_on_devices(
    addr: SocketAddr,
    devices: &[String],
) -> Result<Vec<tokio::net::TcpListener>, HttpError> {
    devices
        .iter()
        .map(|device| {
            let error = |source| HttpError::BindDevice {
                addr,
                device: device.clone(),
                source,
            };
            let socket = socket2::Socket::new(
                socket2::Domain::for_address(addr),
                socket2::Type::STREAM,
                Some(socket2::Protocol::TCP),
            )
            .map_err(error)?;
            socket.set_reuse_address(true).map_err(error)?;
            socket.bind_device(Some(device.as_bytes())).map_err(error)?;
            socket.bind(&addr.into()).map_err(error)?;
            socket.listen(1024).map_err(error)?;
            socket.set_nonblocking(true).map_err(error)?;
            tokio::net::TcpListener::from_std(socket.into()).map_err(error)
        })
        .collect()
}

/// Serves `router` on every listener until `shutdown` turns true (or its sender goes away); ends
/// with the first that fails.
pub async fn serve_all(
    listeners: Vec<tokio::net::TcpListener>,
    router: Router,
    shutdown: watch::Receiver<bool>,
) -> Result<(), HttpError> {
    futures_util::future::try_join_all(
        listeners
            .into_iter()
            .map(|listener| serve_on(listener, router.clone(), shutdown.clone())),
    )
    .await
    .map(|_| ())
}

/// Serves `router` on a bound `listener` until `shutdown` turns true (or its sender goes away).
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    router: Router,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), HttpError> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "HTTP endpoints listening");
    }
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            // Stops on true, or when the sender is gone.
            let _ = shutdown.wait_for(|stop| *stop).await;
        })
        .await
        .map_err(HttpError::Serve)
}

async fn healthz() -> impl IntoResponse {
    axum::Json(serde_json::json!({ "ok": true }))
}

#[derive(Serialize)]
struct Readiness {
    ready: bool,
    leases_loaded: bool,
    interfaces: BTreeMap<String, InterfaceStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream: Option<StreamView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    agent: Option<AgentStatus>,
}

async fn readyz(State(state): State<HttpState>) -> Response {
    let leases_loaded = *state.leases_loaded.borrow();
    let interfaces = state.statuses.borrow().clone();
    let agent = state.agent.as_ref().map(|a| a.borrow().clone());
    let ready = leases_loaded
        && agent.as_ref().is_none_or(|a| a.error.is_none())
        && interfaces
            .values()
            .all(|s| matches!(s, InterfaceStatus::Serving | InterfaceStatus::Standby));
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        code,
        axum::Json(Readiness {
            ready,
            leases_loaded,
            interfaces,
            stream: state
                .stream
                .as_ref()
                .map(|s| StreamView::from(&*s.borrow())),
            agent,
        }),
    )
        .into_response()
}

#[derive(Serialize)]
struct LeaseView {
    ip: Ipv4Addr,
    #[serde(skip_serializing_if = "Option::is_none")]
    conflict: Option<Conflict>,
}

async fn leases(State(state): State<HttpState>) -> impl IntoResponse {
    let conflicts = state.table.conflicts();
    let view: BTreeMap<String, BTreeMap<String, LeaseView>> = state
        .table
        .pools()
        .into_iter()
        .map(|(pool, snap)| {
            let declined = conflicts.get(&pool);
            let leases = snap
                .leases()
                .into_iter()
                .map(|(mac, ip)| {
                    let conflict = declined.and_then(|d| d.get(&ip)).copied();
                    (mac.to_string(), LeaseView { ip, conflict })
                })
                .collect();
            (pool.to_string(), leases)
        })
        .collect();
    axum::Json(view)
}

async fn metrics(State(state): State<HttpState>) -> Response {
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, &state.registry) {
        Ok(()) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dhcp::counters::Counters;
    use crate::dhcp::handler::{Action, DropReason, Outcome, Silence};
    use crate::pools::PoolLeases;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;
    use vmdhcp_core::fixtures::pool_config;
    use vmdhcp_core::pool::Binding;
    use vmdhcp_core::{MacAddr, NamespacedName};

    fn pool_name() -> NamespacedName {
        NamespacedName::new("default", "a").unwrap()
    }

    fn setup(loaded: bool, status: InterfaceStatus) -> (HttpState, Arc<Counters>, Arc<LeaseTable>) {
        let table = Arc::new(LeaseTable::new());
        table.apply_snapshot(&[PoolLeases {
            config: pool_config("default/a").with_lease_seconds(60),
            leases: [(
                MacAddr([2, 0, 0, 0, 0, 1]),
                Binding::ip("192.0.2.10".parse().unwrap()),
            )]
            .into(),
        }]);
        let counters = Arc::new(Counters::default());
        let (_, loaded_rx) = watch::channel(loaded);
        let (_, statuses) = watch::channel(BTreeMap::from([("eth1".to_owned(), status)]));
        let state = HttpState::new(
            Arc::clone(&table),
            loaded_rx,
            statuses,
            watch::channel(vec![(
                crate::dhcp::server::Interface {
                    name: "eth1".into(),
                    pool: pool_name(),
                },
                Arc::clone(&counters),
            )])
            .1,
        );
        (state, counters, table)
    }

    async fn get(state: HttpState, path: &str) -> (StatusCode, String) {
        let response = router(state)
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn stream_state_is_on_readyz_and_metrics() {
        let (state, _, _) = setup(true, InterfaceStatus::Serving);
        let (tx, rx) = watch::channel(ConnectionStatus::default());
        let state = state.with_stream(rx);
        tx.send_replace(ConnectionStatus {
            connected: true,
            synced: true,
            epoch: "e1".into(),
            revision: 42,
            connects: 3,
            rejected: 1,
            last_error: Some("invalid message: Lease.ip_address".into()),
        });
        let (code, body) = get(state.clone(), "/readyz").await;
        assert_eq!(code, StatusCode::OK);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["stream"]["revision"], 42);
        assert_eq!(v["stream"]["connected"], true);
        assert!(
            v["stream"]["last_error"]
                .as_str()
                .unwrap()
                .contains("Lease.ip_address")
        );
        let (_, metrics) = get(state.clone(), "/metrics").await;
        for line in [
            "vmdhcp_agent_stream_revision 42",
            "vmdhcp_agent_stream_connected 1",
            "vmdhcp_agent_stream_connects_total 3",
            "vmdhcp_agent_stream_rejected_messages_total 1",
        ] {
            assert!(
                metrics.lines().any(|l| l == line),
                "{line} not in\n{metrics}"
            );
        }
        // Disconnected, the agent stays ready on its last good state; the stream says so.
        tx.send_modify(|s| s.connected = false);
        let (code, body) = get(state.clone(), "/readyz").await;
        assert_eq!(code, StatusCode::OK, "{body}");
        assert!(body.contains("\"connected\":false"), "{body}");
        let (_, metrics) = get(state, "/metrics").await;
        assert!(
            metrics
                .lines()
                .any(|l| l == "vmdhcp_agent_stream_connected 0"),
            "{metrics}"
        );
    }

    #[tokio::test]
    async fn the_ipv6_guard_is_on_metrics_per_interface() {
        let (state, _, _) = setup(true, InterfaceStatus::Serving);
        let counters = Host6Counters::default();
        let state = state.with_host6(counters.clone());
        counters.settled("eth1", &pool_name(), false);
        counters.swept(
            "eth1",
            &crate::host6::Learned {
                routes: vec!["default via fe80::66 (ra)".into()],
                addresses: vec![],
            },
        );
        let (_, metrics) = get(state, "/metrics").await;
        for line in [
            r#"vmdhcp_agent_ipv6_host_settings{interface="eth1",pool="default/a"} 0"#,
            r#"vmdhcp_agent_ipv6_learned_removed_total{interface="eth1",pool="default/a",kind="route"} 1"#,
            r#"vmdhcp_agent_ipv6_learned_removed_total{interface="eth1",pool="default/a",kind="address"} 0"#,
        ] {
            assert!(
                metrics.lines().any(|l| l == line),
                "{line} not in\n{metrics}"
            );
        }
    }

    #[tokio::test]
    async fn arp_announcements_are_on_metrics_per_interface_and_result() {
        let (state, _, _) = setup(true, InterfaceStatus::Serving);
        let counters = ArpCounters::default();
        let state = state.with_arp(counters.clone());
        let (_, metrics) = get(state.clone(), "/metrics").await;
        assert!(
            metrics
                .lines()
                .any(|l| l == "vmdhcp_agent_arp_announcements_enabled 0"),
            "{metrics}"
        );
        assert!(
            !metrics.contains("vmdhcp_agent_arp_announcements_total{"),
            "{metrics}"
        );
        counters.record("eth1", &pool_name(), 3, 1);
        let (_, metrics) = get(state, "/metrics").await;
        for line in [
            r#"vmdhcp_agent_arp_announcements_total{interface="eth1",pool="default/a",result="sent"} 3"#,
            r#"vmdhcp_agent_arp_announcements_total{interface="eth1",pool="default/a",result="failed"} 1"#,
        ] {
            assert!(
                metrics.lines().any(|l| l == line),
                "{line} not in\n{metrics}"
            );
        }
    }

    #[tokio::test]
    async fn suspects_are_on_metrics_per_pool_and_kind_and_read_zero_when_none() {
        let (state, _, _) = setup(true, InterfaceStatus::Serving);
        let suspects = Arc::new(Suspects::default());
        let state = state.with_suspects(Arc::clone(&suspects), SendCounters::default());
        let line = |kind: &str, n: u32| {
            format!(r#"vmdhcp_agent_network_suspects{{pool="default/a",kind="{kind}"}} {n}"#)
        };
        let (_, metrics) = get(state.clone(), "/metrics").await;
        for wanted in [
            line("foreign_dhcp_server", 0),
            line("proxy_arp_responder", 0),
            line("proxy_ndp_responder", 0),
        ] {
            assert!(
                metrics.lines().any(|l| l == wanted),
                "{wanted} not in\n{metrics}"
            );
        }
        for last in [7u8, 8] {
            suspects.record(
                &pool_name(),
                SuspectKind::ForeignDhcpServer,
                MacAddr([2, 0, 0, 0, 0x0e, last]),
                Some(std::net::Ipv4Addr::new(192, 0, 2, last).into()),
                "offered 192.0.2.50",
            );
        }
        let (_, metrics) = get(state, "/metrics").await;
        for wanted in [
            line("foreign_dhcp_server", 2),
            line("proxy_arp_responder", 0),
        ] {
            assert!(
                metrics.lines().any(|l| l == wanted),
                "{wanted} not in\n{metrics}"
            );
        }
    }

    #[tokio::test]
    async fn role_metrics_export_the_lease_transitions_only_once_seen() {
        let (state, _, _) = setup(true, InterfaceStatus::Serving);
        let (tx, rx) = watch::channel(AgentStatus::default());
        let state = state.with_agent(rx);
        let (_, metrics) = get(state.clone(), "/metrics").await;
        assert!(
            metrics.lines().any(|l| l == "vmdhcp_agent_leader 0")
                && !metrics.contains("vmdhcp_agent_leader_transitions"),
            "{metrics}"
        );
        tx.send_modify(|s| {
            s.leader = true;
            s.lease_transitions = Some(4);
        });
        let (_, metrics) = get(state, "/metrics").await;
        for line in ["vmdhcp_agent_leader 1", "vmdhcp_agent_leader_transitions 4"] {
            assert!(
                metrics.lines().any(|l| l == line),
                "{line} not in\n{metrics}"
            );
        }
    }

    #[tokio::test]
    async fn recorded_conflicts_are_counted_per_pool_from_the_served_config() {
        let (state, _, table) = setup(true, InterfaceStatus::Serving);
        let line = |n: u32| format!(r#"vmdhcp_agent_recorded_conflicts{{pool="default/a"}} {n}"#);
        let (_, metrics) = get(state.clone(), "/metrics").await;
        assert!(metrics.lines().any(|l| l == line(0)), "{metrics}");
        let mut config = pool_config("default/a").with_lease_seconds(60);
        config.conflicted = vec!["192.0.2.20".parse().unwrap(), "192.0.2.21".parse().unwrap()];
        table.apply_snapshot(&[PoolLeases {
            config,
            leases: Default::default(),
        }]);
        let (_, metrics) = get(state, "/metrics").await;
        assert!(metrics.lines().any(|l| l == line(2)), "{metrics}");
    }

    #[tokio::test]
    async fn readiness_needs_leases_and_every_interface() {
        let (state, _, _) = setup(true, InterfaceStatus::Serving);
        assert_eq!(get(state, "/readyz").await.0, StatusCode::OK);
        let (state, _, _) = setup(false, InterfaceStatus::Serving);
        assert_eq!(
            get(state, "/readyz").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        let (state, _, _) = setup(
            true,
            InterfaceStatus::Failed {
                error: "interface eth1 is gone".into(),
            },
        );
        let (code, body) = get(state.clone(), "/readyz").await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("interface eth1 is gone"), "{body}");
        assert_eq!(get(state, "/healthz").await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn leases_show_pool_mac_ip_and_conflicts() {
        let (state, _, table) = setup(true, InterfaceStatus::Serving);
        let (_, body) = get(state.clone(), "/leases").await;
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["default/a"]["02:00:00:00:00:01"]["ip"], "192.0.2.10");
        assert!(
            v["default/a"]["02:00:00:00:00:01"]
                .get("conflict")
                .is_none()
        );
        table.mark_conflicted(
            &pool_name(),
            "192.0.2.10".parse().unwrap(),
            MacAddr([2, 0, 0, 0, 0, 1]),
            Some(MacAddr([2, 0, 0, 0, 0, 9])),
            std::time::Duration::from_secs(60),
        );
        let (_, body) = get(state, "/leases").await;
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let conflict = &v["default/a"]["02:00:00:00:00:01"]["conflict"];
        assert_eq!(conflict["declined_by"], "02:00:00:00:00:01");
        assert_eq!(conflict["answered_by"], "02:00:00:00:00:09");
        assert!(
            (58..=60).contains(&conflict["held_for_seconds"].as_u64().unwrap()),
            "{conflict}"
        );
    }

    #[test]
    fn dhcp6_counters_are_exported_per_interface_and_reason() {
        let counters = Arc::new(Counters6::default());
        counters
            .received
            .fetch_add(3, std::sync::atomic::Ordering::Relaxed);
        counters
            .replied
            .fetch_add(2, std::sync::atomic::Ordering::Relaxed);
        counters.dropped[1].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let interface = Interface6 {
            name: "eth1".into(),
            pool: pool_name(),
        };
        let (_tx, rx) = watch::channel(vec![(interface, counters)]);
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Dhcp6Metrics(rx)));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            r#"vmdhcp_agent_dhcp6_requests_total{interface="eth1",pool="default/a"} 3"#,
            r#"vmdhcp_agent_dhcp6_replies_total{interface="eth1",pool="default/a",type="reply"} 2"#,
            r#"vmdhcp_agent_dhcp6_replies_total{interface="eth1",pool="default/a",type="advertise"} 0"#,
            r#"vmdhcp_agent_dhcp6_dropped_total{interface="eth1",pool="default/a",reason="malformed"} 1"#,
            r#"vmdhcp_agent_dhcp6_dropped_total{interface="eth1",pool="default/a",reason="oversized"} 0"#,
            r#"vmdhcp_agent_dhcp6_declines_total{interface="eth1",pool="default/a",result="confirmed"} 0"#,
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }

    #[tokio::test]
    async fn metrics_expose_counters_latency_and_leases() {
        let (state, counters, _) = setup(true, InterfaceStatus::Serving);
        counters.record(&Outcome {
            request: Some(dhcproto::v4::MessageType::Discover),
            mac: None,
            action: Action::Silent(Silence::UnknownMac),
        });
        counters.record(&Outcome {
            request: None,
            mac: None,
            action: Action::Drop(DropReason::Truncated),
        });
        counters.record_latency(std::time::Duration::from_micros(20));
        let (code, text) = get(state, "/metrics").await;
        assert_eq!(code, StatusCode::OK);
        for line in [
            r#"vmdhcp_agent_dhcp_requests_total{interface="eth1",pool="default/a",type="discover"} 1"#,
            r#"vmdhcp_agent_dhcp_unanswered_total{interface="eth1",pool="default/a",reason="unknown_mac"} 1"#,
            r#"vmdhcp_agent_dhcp_dropped_total{interface="eth1",pool="default/a",reason="truncated"} 1"#,
            r#"vmdhcp_agent_dhcp_replies_total{interface="eth1",pool="default/a",type="nak"} 0"#,
            r#"vmdhcp_agent_dhcp_reply_latency_seconds_count{interface="eth1",pool="default/a"} 1"#,
            r#"vmdhcp_agent_dhcp_reply_latency_seconds_bucket{le="0.000025",interface="eth1",pool="default/a"} 1"#,
            r#"vmdhcp_agent_interface_serving{interface="eth1",pool="default/a"} 1"#,
            r#"vmdhcp_agent_leases{pool="default/a"} 1"#,
            r#"vmdhcp_agent_conflicted_addresses{pool="default/a"} 0"#,
            r#"vmdhcp_agent_declines_total{interface="eth1",pool="default/a",verdict="holder_answers"} 0"#,
            &format!(
                r#"vmdhcp_agent_build_info{{version="{}"}} 1"#,
                env!("CARGO_PKG_VERSION")
            ),
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
    }
}
