//! The controller's HTTP endpoints: `/healthz`, `/readyz` (the index has synced from the API),
//! `/metrics` (Prometheus text), and, behind `--enable-cache-dump-api`, upstream's debug dumps
//! `/ipams/{ns}/{pool}` (address → holder) and `/caches/{ns}/{pool}` (MAC → address).

use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::watch;
use vmdhcp_core::NamespacedName;

use crate::index::Index;
use crate::ipam::Ipam;
use crate::metrics::Metrics;
use crate::reports::Reports;

/// What the endpoints read.
#[derive(Clone)]
pub struct HttpState {
    /// Metrics to expose.
    pub metrics: Arc<Metrics>,
    /// True once the index has synced from the API.
    pub ready: watch::Receiver<bool>,
    /// The IPAM of the current leadership term (none on followers).
    pub ipam: Arc<RwLock<Option<Arc<Ipam>>>>,
    /// Whether the debug dumps are served.
    pub dumps: bool,
    /// The index the stream serves (its revision is a gauge).
    pub index: Arc<Index>,
    /// Agents' reports and open streams.
    pub reports: Arc<Reports>,
    /// Whether this replica leads.
    pub leader: watch::Receiver<bool>,
}

async fn readyz(State(s): State<HttpState>) -> Response {
    if *s.ready.borrow() {
        (StatusCode::OK, "ok").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "index not synced").into_response()
    }
}

async fn metrics(State(s): State<HttpState>) -> Response {
    s.metrics.set_live(
        s.reports.open_streams(),
        s.index.revision(),
        *s.leader.borrow(),
    );
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
        .into_response()
}

fn dump(
    s: &HttpState,
    ns: &str,
    pool: &str,
    f: impl FnOnce(&Ipam, &NamespacedName) -> Option<BTreeMap<String, String>>,
) -> Response {
    if !s.dumps {
        return (
            StatusCode::NOT_FOUND,
            "cache dumps are disabled (--enable-cache-dump-api)",
        )
            .into_response();
    }
    let Ok(pool) = NamespacedName::new(ns, pool) else {
        return (StatusCode::BAD_REQUEST, "invalid pool reference").into_response();
    };
    let ipam = s.ipam.read().clone();
    match ipam.and_then(|i| f(&i, &pool)) {
        Some(map) => Json(map).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            format!("no IPAM for {pool} on this replica"),
        )
            .into_response(),
    }
}

async fn ipams(State(s): State<HttpState>, Path((ns, pool)): Path<(String, String)>) -> Response {
    dump(&s, &ns, &pool, |ipam, p| {
        ipam.with_pool(p, |a| a.status_allocated()).ok()
    })
}

async fn caches(State(s): State<HttpState>, Path((ns, pool)): Path<(String, String)>) -> Response {
    dump(&s, &ns, &pool, |ipam, p| {
        ipam.with_pool(p, |a| {
            a.leases()
                .map(|(ip, mac)| (mac.to_string(), ip.to_string()))
                .collect()
        })
        .ok()
    })
}

/// The router.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/ipams/{ns}/{pool}", get(ipams))
        .route("/caches/{ns}/{pool}", get(caches))
        .with_state(state)
}

/// Serves until `shutdown` turns true.
pub async fn serve(
    listener: TcpListener,
    state: HttpState,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(async move {
            // Stops on true, or when the sender is gone.
            let _ = shutdown.wait_for(|stop| *stop).await;
        })
        .await
}
