//! The admission webhook's HTTPS server: AdmissionReviews for IPPools,
//! VirtualMachineNetworkConfigs and AddressClaims in, decisions out. The decisions themselves are
//! [`vmdhcp_core::admission`]'s; this module fetches the cluster facts they need and speaks the
//! AdmissionReview protocol, and counts its answers (`vmdhcpcontroller_webhook_requests_total`):
//! allowed, denied by a rule, or refused because the request could not be judged.
//!
//! The objects a decision needs come from the process's shared caches ([`Caches`]), looked up by
//! network through the [`crate::index::configs::ConfigIndex`], so a request costs what its
//! networks hold, not what the cluster holds; only NetworkAttachmentDefinitions are read per
//! request. A LIST per request would be no more exact: two requests admitted at the same moment
//! both pass either way (the API server has no transaction across objects), and the caches trail
//! etcd by one watch event.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::StreamExt;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::{Api, Client, ResourceExt};
use rustls::ServerConfig;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{Instrument, debug, info, info_span, warn};
use vmdhcp_core::NamespacedName;
use vmdhcp_core::admission::{self, ClaimFacts, Nad, PoolFacts, VmNetCfgFacts};
use vmdhcp_core::crd::{AddressClaim, IPPool, VirtualMachineNetworkConfig};

use crate::index::caches::Caches;
use crate::kinds::{nad_resource, network_of, store_key};
use crate::metrics::Metrics;
use crate::security::listener::{Activity, Limits};

/// How long a client may take to send a request's headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long shutdown waits for requests in flight.
const DRAIN: Duration = Duration::from_secs(5);
/// A connection with no request in flight for this long is closed (gracefully: HTTP/2 GOAWAY,
/// or HTTP/1 between requests). 90 s is how long the API server's own client keeps an idle
/// connection (Go's `IdleConnTimeout` as Kubernetes sets it), so the one client that matters
/// rarely finds a connection it meant to reuse closed, while an idle hoarder holds its place no
/// longer.
const IDLE: Duration = Duration::from_secs(90);
/// HTTP/2 PING interval: a peer gone without a FIN is found within this and
/// [`KEEPALIVE_TIMEOUT`], instead of holding its place until the idle bound.
const KEEPALIVE: Duration = Duration::from_secs(30);
/// How long a PING may go unanswered.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest a request may take, body included: the API server waits at most 30 s for a
/// webhook (`timeoutSeconds` ≤ 30), so a later answer is read by no one, and a client that
/// dribbles its body holds a request no longer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Concurrent HTTP/2 streams per connection: the API server multiplexes its calls over one
/// connection per instance and opens another only beyond this.
const MAX_STREAMS: u32 = 256;
/// The largest HTTP/2 header block: an AdmissionReview's headers are a few hundred bytes.
const MAX_HEADER_LIST: u32 = 16 << 10;
/// Streams a client may open and reset before the server has accepted them (the HTTP/2 rapid
/// reset attack); hyper's default, pinned.
const MAX_PENDING_RESETS: usize = 20;

/// Why the webhook server could not run, or why a request could not be judged (it is then
/// refused with this as its reason, in upstream's words: "… because <this>").
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// The listener failed.
    #[error("webhook listener: {0}")]
    Io(#[from] std::io::Error),
    /// The request lacks the object or old object its operation needs.
    #[error("the request has no {0}")]
    Missing(&'static str),
    /// The object is not the kind's schema.
    #[error("its {which} does not parse: {source}")]
    Unparsable {
        /// `object` or `old object`.
        which: &'static str,
        /// Why.
        source: kube::core::dynamic::ParseDynamicObjectError,
    },
    /// Something the decision needs could not be read from the API.
    #[error("{what} cannot be {verb}: {source}")]
    Read {
        /// What, e.g. `NetworkAttachmentDefinition ns/name`.
        what: String,
        /// `read` or `listed`.
        verb: &'static str,
        /// The API error.
        source: kube::Error,
    },
    /// The caches are still filling after a start.
    #[error("the webhook's caches are not ready yet; retry")]
    CachesNotReady,
    /// The defaulting patch could not be encoded.
    #[error("its defaults cannot be encoded: {0}")]
    Patch(#[source] serde_json::Error),
    /// The admission response refused the patch.
    #[error("its defaults cannot be encoded: {0}")]
    PatchResponse(#[source] kube::core::admission::SerializePatchError),
}

/// What the handlers share.
#[derive(Clone)]
pub struct WebhookState {
    client: Client,
    service_cidr: Option<Ipv4Net>,
    caches: Caches,
    metrics: Arc<Metrics>,
}

/// Serves `/mutate`, `/validate` and `/healthz` over TLS on `listener` until shutdown.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    client: Client,
    caches: Caches,
    service_cidr: Option<Ipv4Net>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), WebhookError> {
    let addr = listener.local_addr()?;
    let state = WebhookState {
        client,
        service_cidr,
        caches,
        metrics: metrics.clone(),
    };
    let app = Router::new()
        .route("/mutate", post(mutate))
        .route("/validate", post(validate))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(state);
    info!(%addr, "admission webhook serving");
    // Connection limits as for any listener; no byte clock: HTTP/2 PINGs are bytes, so idleness
    // is measured in requests (`Activity`).
    let (connections, _usage) = crate::security::listener::accept(listener, tls, Limits::default());
    let mut connections = std::pin::pin!(connections);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // A client that opens a connection and sends nothing, or half a request, holds it for a
    // bounded time only.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(KEEPALIVE)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .max_concurrent_streams(MAX_STREAMS)
        .max_header_list_size(MAX_HEADER_LIST)
        .max_pending_accept_reset_streams(MAX_PENDING_RESETS);
    let mut open = tokio::task::JoinSet::new();
    let stops = shutdown.clone();
    loop {
        tokio::select! {
            conn = connections.next() => match conn {
                Some(Ok(stream)) => {
                    let activity = Activity::default();
                    let app = TowerToHyperService::new(app.clone());
                    let requests = activity.clone();
                    let metrics = metrics.clone();
                    let service = hyper::service::service_fn(move |req: http::Request<_>| {
                        let busy = requests.begin();
                        let webhook = req.uri().path().trim_start_matches('/').to_owned();
                        let answer = hyper::service::Service::call(&app, req);
                        let metrics = metrics.clone();
                        async move {
                            let answer = tokio::time::timeout(REQUEST_TIMEOUT, answer).await;
                            drop(busy);
                            answer.unwrap_or_else(|_| {
                                debug!(limit = ?REQUEST_TIMEOUT, "webhook request timed out");
                                metrics.webhook_request(&webhook, "", "error");
                                let mut late = axum::response::Response::new(axum::body::Body::empty());
                                *late.status_mut() = http::StatusCode::REQUEST_TIMEOUT;
                                Ok(late)
                            })
                        }
                    });
                    let connection = builder
                        .serve_connection(TokioIo::new(stream), service)
                        .into_owned();
                    let mut stop = stops.clone();
                    open.spawn(async move {
                        let mut connection = std::pin::pin!(connection);
                        let why = tokio::select! {
                            ended = connection.as_mut() => {
                                if let Err(e) = ended {
                                    debug!(error = %e, "webhook connection ended");
                                }
                                return;
                            }
                            () = activity.idle(IDLE) => "idle",
                            _ = stop.wait_for(|s| *s) => "shutdown",
                        };
                        // Requests in flight are answered (the API server would otherwise retry
                        // or fail them); no new one is taken.
                        connection.as_mut().graceful_shutdown();
                        if let Err(e) = connection.await {
                            debug!(error = %e, why, "webhook connection ended");
                        }
                    });
                }
                Some(Err(e)) => debug!(error = %e, "webhook connection not accepted"),
                None => break,
            },
            Some(_) = open.join_next(), if !open.is_empty() => {}
            _ = shutdown.wait_for(|s| *s) => break,
        }
    }
    let drained =
        tokio::time::timeout(DRAIN, async { while open.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        warn!(limit = ?DRAIN, open = open.len(), "webhook connections still open at shutdown");
    }
    Ok(())
}

type Review = Json<AdmissionReview<DynamicObject>>;

async fn mutate(State(state): State<WebhookState>, Json(review): Review) -> Review {
    let metrics = state.metrics.clone();
    respond(&metrics, "mutate", review, |req| async move {
        mutate_request(&state, &req).map_err(|e| deny(&req, e))
    })
    .await
}

async fn validate(State(state): State<WebhookState>, Json(review): Review) -> Review {
    let metrics = state.metrics.clone();
    respond(&metrics, "validate", review, |req| async move {
        validate_request(&state, &req)
            .await
            .map_err(|e| deny(&req, e))
    })
    .await
}

/// Runs `decide` on the request inside a span, counts its answer and wraps it in an
/// AdmissionReview. `decide` answers `Err` with the refusal of a request it could not judge.
async fn respond<F, Fut>(
    metrics: &Metrics,
    webhook: &str,
    review: AdmissionReview<DynamicObject>,
    decide: F,
) -> Review
where
    F: FnOnce(AdmissionRequest<DynamicObject>) -> Fut,
    Fut: std::future::Future<Output = Result<AdmissionResponse, AdmissionResponse>>,
{
    let req: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(r) => r,
        Err(e) => {
            warn!(error = %e, "malformed AdmissionReview");
            metrics.webhook_request(webhook, "", "error");
            return Json(AdmissionResponse::invalid(e.to_string()).into_review());
        }
    };
    let kind = req.kind.kind.clone();
    let span = info_span!(
        "admission",
        kind = %req.kind.kind,
        operation = ?req.operation,
        object = %format!("{}/{}", req.namespace.as_deref().unwrap_or_default(), req.name),
        allowed = tracing::field::Empty,
    );
    let (response, result) = match decide(req).instrument(span.clone()).await {
        Ok(response) if response.allowed => (response, "allowed"),
        Ok(response) => (response, "denied"),
        Err(response) => (response, "error"),
    };
    metrics.webhook_request(webhook, &kind, result);
    span.record("allowed", response.allowed);
    if result == "error" {
        warn!(parent: &span, reason = %response.result.message, "admission refused: the request could not be judged");
    } else if !response.allowed {
        info!(parent: &span, reason = %response.result.message, "admission denied");
    }
    Json(response.into_review())
}

fn verb(op: &Operation) -> &'static str {
    match op {
        Operation::Create => "create",
        Operation::Update => "update",
        Operation::Delete => "delete",
        Operation::Connect => "connect",
    }
}

/// A denial in upstream's words: "cannot create IPPool ns/name because …".
fn deny(
    req: &AdmissionRequest<DynamicObject>,
    reason: impl std::fmt::Display,
) -> AdmissionResponse {
    AdmissionResponse::from(req).deny(format!(
        "cannot {} {} {}/{} because {reason}",
        verb(&req.operation),
        req.kind.kind,
        req.namespace.as_deref().unwrap_or_default(),
        req.name
    ))
}

fn parse<K: serde::de::DeserializeOwned + kube::Resource>(
    obj: Option<&DynamicObject>,
    which: &'static str,
) -> Result<K, WebhookError> {
    let obj = obj.ok_or(WebhookError::Missing(which))?;
    obj.clone()
        .try_parse::<K>()
        .map_err(|source| WebhookError::Unparsable { which, source })
}

/// The defaulting answer; `Err` when the request cannot be judged.
fn mutate_request(
    _state: &WebhookState,
    req: &AdmissionRequest<DynamicObject>,
) -> Result<AdmissionResponse, WebhookError> {
    if req.kind.kind != "IPPool" || req.operation != Operation::Create {
        return Ok(AdmissionResponse::from(req));
    }
    let pool: IPPool = parse(req.object.as_ref(), "object")?;
    let defaults = match admission::ippool_defaults(&pool.spec) {
        Ok(d) => d,
        Err(rejection) => return Ok(deny(req, rejection)),
    };
    let raw = req
        .object
        .as_ref()
        .map(|o| o.data.clone())
        .unwrap_or(Value::Null);
    let ops = defaults_patch(&raw, &defaults);
    if ops.is_empty() {
        return Ok(AdmissionResponse::from(req));
    }
    let patch = serde_json::from_value::<json_patch::Patch>(Value::Array(ops))
        .map_err(WebhookError::Patch)?;
    AdmissionResponse::from(req)
        .with_patch(patch)
        .map_err(WebhookError::PatchResponse)
}

/// JSON patch operations that set the defaulted fields, creating missing parents first.
fn defaults_patch(raw: &Value, d: &admission::PoolDefaults) -> Vec<Value> {
    let mut ops = Vec::new();
    let fields: [(&str, Option<Ipv4Addr>); 3] = [
        ("/spec/ipv4Config/pool/start", d.start),
        ("/spec/ipv4Config/pool/end", d.end),
        ("/spec/ipv4Config/serverIP", d.server_ip),
    ];
    if fields.iter().all(|(_, v)| v.is_none()) {
        return ops;
    }
    if raw.pointer("/spec/ipv4Config").is_none() {
        ops.push(json!({"op": "add", "path": "/spec/ipv4Config", "value": {}}));
    }
    if (d.start.is_some() || d.end.is_some()) && raw.pointer("/spec/ipv4Config/pool").is_none() {
        ops.push(json!({"op": "add", "path": "/spec/ipv4Config/pool", "value": {}}));
    }
    for (path, value) in fields {
        if let Some(ip) = value {
            ops.push(json!({"op": "add", "path": path, "value": ip.to_string()}));
        }
    }
    ops
}

/// The validating answer; `Err` when the request cannot be judged.
async fn validate_request(
    state: &WebhookState,
    req: &AdmissionRequest<DynamicObject>,
) -> Result<AdmissionResponse, WebhookError> {
    let verdict = match (req.kind.kind.as_str(), &req.operation) {
        ("IPPool", Operation::Create | Operation::Update) => {
            let new: IPPool = parse(req.object.as_ref(), "object")?;
            let facts = pool_facts(state, &new).await?;
            let facts = PoolFacts {
                nad: facts.0.as_ref(),
                pools: &facts.1,
                service_cidr: state.service_cidr,
            };
            if req.operation == Operation::Create {
                admission::validate_ippool_create(&new, &facts)
            } else {
                let old: IPPool = parse(req.old_object.as_ref(), "old object")?;
                admission::validate_ippool_update(&old, &new, &facts)
            }
        }
        ("IPPool", Operation::Delete) => {
            let old: IPPool = parse(req.old_object.as_ref(), "old object")?;
            let users = pool_users(state, &old).await?;
            admission::validate_ippool_delete(&old, &users)
        }
        ("VirtualMachineNetworkConfig", Operation::Create | Operation::Update) => {
            let new: VirtualMachineNetworkConfig = parse(req.object.as_ref(), "object")?;
            let (nads, pools, configs) = config_facts(state, &new).await?;
            let facts = VmNetCfgFacts {
                nads: &nads,
                pools: &pools,
                configs: &configs,
            };
            if req.operation == Operation::Create {
                admission::validate_vmnetcfg_create(&new, &facts)
            } else {
                let old: VirtualMachineNetworkConfig =
                    parse(req.old_object.as_ref(), "old object")?;
                admission::validate_vmnetcfg_update(&old, &new, &facts)
            }
        }
        ("AddressClaim", Operation::Create) => {
            let new: AddressClaim = parse(req.object.as_ref(), "object")?;
            let (pool, labels, claims) = claim_facts(state, &new).await?;
            let facts = ClaimFacts {
                pool: pool.as_deref(),
                namespace_labels: &labels,
                claims: &claims,
            };
            admission::validate_claim_create(&new, &facts)
        }
        ("AddressClaim", Operation::Update) => {
            let new: AddressClaim = parse(req.object.as_ref(), "object")?;
            let old: AddressClaim = parse(req.old_object.as_ref(), "old object")?;
            admission::validate_claim_update(&old, &new)
        }
        _ => Ok(()),
    };
    Ok(match verdict {
        Ok(()) => AdmissionResponse::from(req),
        Err(rejection) => deny(req, &rejection),
    })
}

/// Reads a NAD by `namespace/name`; `Ok(None)` when it does not exist.
async fn get_nad(client: &Client, name: &str) -> Result<Option<Nad>, WebhookError> {
    let Ok(nn) = name.parse::<NamespacedName>() else {
        return Ok(None);
    };
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &nn.namespace, &nad_resource());
    match api.get_opt(&nn.name).await {
        Ok(Some(obj)) => Ok(Some(Nad {
            labels: obj.labels().clone(),
            name: nn,
        })),
        Ok(None) => Ok(None),
        Err(source) => Err(WebhookError::Read {
            what: format!("NetworkAttachmentDefinition {name}"),
            verb: "read",
            source,
        }),
    }
}

async fn pool_facts(
    state: &WebhookState,
    pool: &IPPool,
) -> Result<(Option<Nad>, Vec<IPPool>), WebhookError> {
    let nad = get_nad(&state.client, &pool.spec.network_name).await?;
    caches_ready(state).await?;
    // Every pool: the decision looks for others on the same network and for overlaps.
    let pools = state
        .caches
        .pools
        .store()
        .state()
        .iter()
        .map(|p| (**p).clone())
        .collect();
    Ok((nad, pools))
}

/// The configs with a NIC on `pool`'s network.
async fn pool_users(
    state: &WebhookState,
    pool: &IPPool,
) -> Result<Vec<VirtualMachineNetworkConfig>, WebhookError> {
    caches_ready(state).await?;
    let Some(network) = network_of(pool) else {
        return Ok(Vec::new());
    };
    Ok(configs_on(state, [&network]))
}

/// The cached configs with a NIC on any of `networks`, each once.
fn configs_on<'a>(
    state: &WebhookState,
    networks: impl IntoIterator<Item = &'a NamespacedName>,
) -> Vec<VirtualMachineNetworkConfig> {
    let names: std::collections::BTreeSet<NamespacedName> = networks
        .into_iter()
        .flat_map(|n| state.caches.config_index.on_network(n))
        .collect();
    let store = state.caches.configs.store();
    names
        .iter()
        .filter_map(|n| store.get(&store_key::<VirtualMachineNetworkConfig>(n)))
        .map(|c| (*c).clone())
        .collect()
}

/// The first decisions after a start wait for the caches rather than decide on empty ones.
async fn caches_ready(state: &WebhookState) -> Result<(), WebhookError> {
    tokio::time::timeout(CACHE_WAIT, state.caches.ready())
        .await
        .map_err(|_| WebhookError::CachesNotReady)
}

type ClaimCluster = (
    Option<Arc<IPPool>>,
    BTreeMap<String, String>,
    Vec<AddressClaim>,
);

/// What a claim's decision needs: the pool serving its network, its namespace's labels (read
/// only when that pool admits namespaces by label), and the claims on its network.
async fn claim_facts(
    state: &WebhookState,
    claim: &AddressClaim,
) -> Result<ClaimCluster, WebhookError> {
    caches_ready(state).await?;
    tokio::time::timeout(CACHE_WAIT, state.caches.claims.ready())
        .await
        .map_err(|_| WebhookError::CachesNotReady)?;
    let ns = claim.namespace().unwrap_or_default();
    let Ok(network) = NamespacedName::parse_in(&claim.spec.network, &ns) else {
        // The decision names the field.
        return Ok((None, BTreeMap::new(), Vec::new()));
    };
    let pool = state
        .caches
        .pool_networks
        .serving(&state.caches.pools.store(), &network);
    let selects = pool
        .as_ref()
        .and_then(|p| p.spec.claims.as_ref())
        .is_some_and(|c| !c.namespaces.contains(&ns) && c.namespace_selector.is_some());
    let labels = if selects {
        let api: Api<Namespace> = Api::all(state.client.clone());
        api.get(&ns)
            .await
            .map_err(|source| WebhookError::Read {
                what: format!("Namespace {ns}"),
                verb: "read",
                source,
            })?
            .metadata
            .labels
            .unwrap_or_default()
    } else {
        BTreeMap::new()
    };
    // The claims on the network: few (bounded by the pools' quotas).
    let claims = state
        .caches
        .claims
        .store()
        .state()
        .iter()
        .filter(|c| {
            let their_ns = c.namespace().unwrap_or_default();
            NamespacedName::parse_in(&c.spec.network, &their_ns).is_ok_and(|n| n == network)
        })
        .map(|c| (**c).clone())
        .collect();
    Ok((pool, labels, claims))
}

type ConfigFacts = (Vec<Nad>, Vec<IPPool>, Vec<VirtualMachineNetworkConfig>);

async fn config_facts(
    state: &WebhookState,
    cfg: &VirtualMachineNetworkConfig,
) -> Result<ConfigFacts, WebhookError> {
    caches_ready(state).await?;
    let mut nads = Vec::new();
    for nc in &cfg.spec.network_configs {
        if nads
            .iter()
            .any(|n: &Nad| n.name.to_string() == nc.network_name)
        {
            continue;
        }
        if let Some(nad) = get_nad(&state.client, &nc.network_name).await? {
            nads.push(nad);
        }
    }
    let networks: Vec<&str> = cfg
        .spec
        .network_configs
        .iter()
        .map(|n| n.network_name.as_str())
        .collect();
    // Only the objects on the same networks: cloning every config per request would not scale.
    let pools = state
        .caches
        .pools
        .store()
        .state()
        .iter()
        .filter(|p| {
            networks.contains(&p.spec.network_name.as_str())
                || nads.iter().any(|n| {
                    n.labels
                        .get("network.harvesterhci.io/ippool-namespace")
                        .map(String::as_str)
                        == p.metadata.namespace.as_deref()
                        && n.labels
                            .get("network.harvesterhci.io/ippool-name")
                            .map(String::as_str)
                            == p.metadata.name.as_deref()
                })
        })
        .map(|p| (**p).clone())
        .collect();
    // Only the configs on the same networks, found through the index: a scan of every config
    // per request (one per VM) would make creating n VMs cost n².
    let ns = cfg.namespace().unwrap_or_default();
    let keys: Vec<NamespacedName> = networks
        .iter()
        .filter_map(|n| NamespacedName::parse_in(n, &ns).ok())
        .collect();
    let configs = configs_on(state, &keys);
    Ok((nads, pools, configs))
}

/// How long a request waits for the caches before the first decision.
const CACHE_WAIT: Duration = Duration::from_secs(10);

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn defaults_patch_creates_missing_parents_then_sets_fields() {
        let d = admission::PoolDefaults {
            start: Some("10.0.0.1".parse().unwrap()),
            end: None,
            server_ip: Some("10.0.0.2".parse().unwrap()),
        };
        let ops = defaults_patch(&json!({"spec": {"networkName": "a/b"}}), &d);
        let paths: Vec<&str> = ops.iter().map(|o| o["path"].as_str().unwrap()).collect();
        assert_eq!(
            paths,
            [
                "/spec/ipv4Config",
                "/spec/ipv4Config/pool",
                "/spec/ipv4Config/pool/start",
                "/spec/ipv4Config/serverIP"
            ]
        );
        let mut doc = json!({"spec": {"networkName": "a/b"}});
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).unwrap();
        json_patch::patch(&mut doc, &patch).unwrap();
        assert_eq!(doc["spec"]["ipv4Config"]["pool"]["start"], "10.0.0.1");
        assert_eq!(doc["spec"]["ipv4Config"]["serverIP"], "10.0.0.2");
    }

    #[test]
    fn nothing_to_default_is_no_patch() {
        assert!(defaults_patch(&json!({}), &admission::PoolDefaults::default()).is_empty());
    }
}
