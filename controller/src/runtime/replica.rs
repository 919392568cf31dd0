//! The whole `vm-dhcp-controller run` process, in start-up order: leader election, the serving
//! certificate (kept by the leader, used by every replica), the admission webhook, the
//! controller itself ([`super::run`]); at shutdown, the Lease is released only once every writer
//! has stopped, so a successor never overlaps a write of ours.

use std::net::SocketAddr;
use std::sync::Arc;

use ipnet::Ipv4Net;
use kube::Client;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};
use vmdhcp_leader::{ElectionConfig, LeaderElector, LeaseHolder};

use super::{RuntimeError, Settings};
use crate::index::caches::Caches;
use crate::metrics::Metrics;
use crate::security::tls::{ServingCerts, TlsSettings};
use crate::security::webhook::{self, WebhookError};
use crate::stream::auth::{ReviewRate, TokenAuth};
use crate::stream::config_service::Security;
use crate::stream::keys::IssuerKeys;

/// Which callers may read the config stream.
#[derive(Clone, Debug)]
pub enum StreamAccess {
    /// Anyone, without TLS: for local use and `grpcurl -plaintext` only.
    Plaintext,
    /// TLS with the serving certificate; only tokens of the agents' ServiceAccount.
    Agents {
        /// The audience their tokens must be issued for.
        audience: String,
        /// The ServiceAccount, `namespace:name`.
        service_account: String,
        /// The most TokenReviews their checks may cost.
        review_rate: ReviewRate,
    },
}

/// Where the admission webhook listens and what it checks.
#[derive(Clone, Debug)]
pub struct WebhookSettings {
    /// Its HTTPS address.
    pub listen: SocketAddr,
    /// The cluster's Service CIDR: IPPools overlapping it are refused.
    pub service_cidr: Option<Ipv4Net>,
}

/// One controller process, as its command line configured it.
#[derive(Clone, Debug)]
pub struct Replica {
    /// The controller's settings; `stream.security` is replaced by what [`Replica::access`] and
    /// the serving certificate make of it.
    pub settings: Settings,
    /// Address of the gRPC config stream.
    pub grpc_listen: SocketAddr,
    /// Address of the HTTP endpoints.
    pub http_listen: SocketAddr,
    /// Leader election; `None`: this replica always leads (a single replica).
    pub election: Option<ElectionConfig>,
    /// The CA and serving certificate; `None`: no TLS at all (plaintext stream, no webhook).
    pub tls: Option<TlsSettings>,
    /// Who may read the config stream.
    pub access: StreamAccess,
    /// The admission webhook, if served.
    pub webhook: Option<WebhookSettings>,
}

/// Runs one controller process until `shutdown`, then releases the Lease after the last write.
pub async fn run(
    client: Client,
    replica: Replica,
    shutdown: watch::Receiver<bool>,
) -> Result<(), RuntimeError> {
    // The Lease is released only after every writer stopped (see the end of this function).
    let (release_tx, release) = watch::channel(false);
    let (_always, leader) = watch::channel(true);
    // Created before the election and the stream's security: they count into it.
    let metrics = Arc::new(Metrics::default());
    let (leader, election) = match replica.election {
        None => (leader, None),
        Some(election) => {
            let elector = LeaderElector::new(client.clone(), election)?;
            let leading = elector.subscribe();
            tokio::spawn(export_lease_transitions(elector.holder(), metrics.clone()));
            (leading, Some(tokio::spawn(elector.run(release))))
        }
    };
    let certs = Arc::new(ServingCerts::new());
    if let Some(loads) = certs.subscribe() {
        tokio::spawn(export_certificate_expiry(
            loads,
            certs.clone(),
            metrics.clone(),
            shutdown.clone(),
        ));
    }
    let mut settings = replica.settings;
    settings.stream.security = stream_security(&client, &certs, &metrics, replica.access);
    let tls_task = replica.tls.map(|tls| {
        tokio::spawn(crate::security::tls::run(
            client.clone(),
            tls,
            certs.clone(),
            leader.clone(),
            shutdown.clone(),
        ))
    });
    // One watch per kind for the whole process: the webhook, the index and the reconcilers read
    // the same caches.
    let (caches, _cache_tasks) = Caches::start(&client);
    let webhook_task = match replica.webhook {
        Some(w) => Some(start_webhook(&client, &caches, &certs, w, &metrics, &shutdown).await?),
        None => None,
    };
    let grpc = bind(replica.grpc_listen).await?;
    let http = bind(replica.http_listen).await?;
    super::run_with_caches(
        client,
        caches,
        metrics,
        settings,
        grpc,
        http,
        leader,
        shutdown,
        |h| info!(grpc = %h.grpc, http = %h.http, "controller up"),
    )
    .await?;
    if let Some(task) = tls_task {
        let _ = task.await;
    }
    if let Some(task) = webhook_task
        && let Ok(Err(e)) = task.await
    {
        warn!(error = %e, "webhook server failed");
    }
    // Every writer has stopped (reconcilers drained, certificates written): only now may a
    // successor start, so only now is the Lease released.
    release_tx.send_replace(true);
    if let Some(election) = election {
        let _ = election.await;
    }
    Ok(())
}

/// How the config stream is exposed: TLS with the serving certificate and agent tokens, or
/// (asked for explicitly) plaintext.
fn stream_security(
    client: &Client,
    certs: &Arc<ServingCerts>,
    metrics: &Metrics,
    access: StreamAccess,
) -> Security {
    match access {
        StreamAccess::Plaintext => {
            warn!("config stream served in plaintext without authentication (--grpc-plaintext)");
            Security::Plaintext
        }
        StreamAccess::Agents {
            audience,
            service_account,
            review_rate,
        } => {
            let auth = Arc::new(TokenAuth::new(
                client.clone(),
                audience,
                &service_account,
                review_rate,
                IssuerKeys::new(Some(client.clone())),
                metrics.token_counts(),
            ));
            // The keys are read before the first agent asks, so `/metrics` says at once
            // whether forgeries cost a TokenReview.
            tokio::spawn({
                let auth = auth.clone();
                async move { auth.load_keys().await }
            });
            Security::Tls {
                config: certs.server_config(&[b"h2"]),
                auth,
            }
        }
    }
}

/// Keeps `vmdhcpcontroller_leader_transitions` at the Lease's count as the elector last saw it;
/// ends with the election. The first value is set once the Lease was seen held (the channel
/// starts at "not read yet").
async fn export_lease_transitions(mut holder: watch::Receiver<LeaseHolder>, metrics: Arc<Metrics>) {
    while holder.changed().await.is_ok() {
        let transitions = holder.borrow_and_update().transitions;
        metrics.set_leader_transitions(transitions);
    }
}

/// Keeps `vmdhcpcontroller_certificate_expiry_timestamp_seconds` at the expiry of what this
/// replica serves, after every load of the Secret; ends on shutdown.
async fn export_certificate_expiry(
    mut loads: watch::Receiver<u64>,
    certs: Arc<ServingCerts>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        for (which, not_after) in certs.expiries() {
            metrics.set_certificate_expiry(which, not_after);
        }
        tokio::select! {
            changed = loads.changed() => if changed.is_err() { return },
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
    }
}

/// Binds the webhook's address and starts serving it (HTTP/2 and HTTP/1.1 over TLS).
async fn start_webhook(
    client: &Client,
    caches: &Caches,
    certs: &Arc<ServingCerts>,
    settings: WebhookSettings,
    metrics: &Arc<Metrics>,
    shutdown: &watch::Receiver<bool>,
) -> Result<JoinHandle<Result<(), WebhookError>>, RuntimeError> {
    let listener = bind(settings.listen).await?;
    Ok(tokio::spawn(webhook::serve(
        listener,
        certs.server_config(&[b"h2", b"http/1.1"]),
        client.clone(),
        caches.clone(),
        settings.service_cidr,
        metrics.clone(),
        shutdown.clone(),
    )))
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, RuntimeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| RuntimeError::Bind { addr, source })
}
