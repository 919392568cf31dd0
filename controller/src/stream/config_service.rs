//! The gRPC `ConfigService`: streams the [`Index`] to agents and records their reports.
//!
//! Every replica serves it from its own index. A Watch is a lazy stream: a message is computed
//! only when the transport asks for the next one, from the index's *current* state. So a slow or
//! stalled agent holds no queue on the server — HTTP/2 flow control stops the polling, revisions
//! pile up only as touched keys in the bounded history, and when the agent reads again it gets
//! one coalesced delta (or a snapshot, if it fell out of the history). Other agents are served by
//! their own streams and never wait for it.
//!
//! Shutdown ends every stream (the agents resume elsewhere by revision or snapshot) so that the
//! server can drain; HTTP/2 keepalive and heartbeats detect dead peers on both sides.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::Stream;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::{Request, Response, Status};
use tracing::{Instrument, debug, info, info_span, warn};
use vmdhcp_core::{MacAddr, NamespacedName};
use vmdhcp_proto::agent::v1 as pb;
use vmdhcp_proto::agent::v1::config_service_server::{ConfigService, ConfigServiceServer};
use vmdhcp_proto::convert;
use vmdhcp_telemetry::trace;

use crate::index::{Index, PoolFilter, Snapshot};
use crate::reports::{
    AddressProbe, AgentIdentity, AgentReport, InterfaceReport, InterfaceState, MAX_SUSPECT_DETAIL,
    NetworkSuspect, OpenStream, ProbeReason, ReportError, Reports, SuspectKind, truncate_detail,
};
use crate::security::listener::Limits;
use crate::stream::auth::{TokenAuth, Verified, WatchGuard};
use vmdhcp_core::pool::PoolDelta;

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ConfigServiceError {
    /// The reflection service could not be built from our descriptors.
    #[error("building gRPC reflection: {0}")]
    Reflection(String),
    /// The transport failed.
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The listener has no local address.
    #[error("listener address: {0}")]
    Listener(#[from] std::io::Error),
}

/// Tunables of the stream.
#[derive(Clone, Debug)]
pub struct StreamSettings {
    /// Idle time after which a stream gets a heartbeat.
    pub heartbeat: Duration,
    /// Most leases per snapshot message; larger snapshots are split.
    pub snapshot_part_leases: usize,
    /// HTTP/2 PING interval to detect dead peers.
    pub keepalive_interval: Duration,
    /// How long a PING may go unanswered before the connection is closed.
    pub keepalive_timeout: Duration,
    /// TLS and caller authentication.
    pub security: Security,
    /// The TLS listener's connection limits. Its byte clock ([`Limits::idle`], [`STREAM_IDLE`]
    /// by default) is never shorter than a PING round, so it cuts only connections that never
    /// started HTTP/2 or stopped answering, never a Watch.
    pub limits: Limits,
}

/// A connection to the stream with no byte either way for this long is ended. Three keepalive
/// intervals: the server PINGs a peer it has not heard from every
/// [`StreamSettings::keepalive_interval`] and sends a Watch a heartbeat every
/// [`StreamSettings::heartbeat`], so a live agent's connection is never this quiet; one that
/// completed TLS and says nothing (no HTTP/2 preface, hence no PINGs) is.
pub const STREAM_IDLE: Duration = Duration::from_secs(30);
/// Concurrent HTTP/2 streams per connection: an agent holds a Watch and sends a Report now and
/// then; a caller needs no more to inspect the stream, and a hostile one opens no more.
const MAX_STREAMS: u32 = 16;
/// The largest HTTP/2 header block: a request's headers are its path and a bearer token (a
/// ServiceAccount JWT, about a kilobyte).
const MAX_HEADER_LIST: u32 = 16 << 10;
/// Streams a client may open and reset before the server has accepted them (the HTTP/2 rapid
/// reset attack); hyper's default, pinned.
const MAX_PENDING_RESETS: usize = 20;

/// How the config stream is exposed.
#[derive(Clone, Default)]
pub enum Security {
    /// No TLS and no authentication: for local use and `grpcurl -plaintext` only, since anyone
    /// who can connect reads every pool's MACs and addresses.
    #[default]
    Plaintext,
    /// TLS with the controller's certificate; `Watch` and `Report` require an agent token.
    Tls {
        /// The server configuration (certificate resolver, ALPN `h2`).
        config: Arc<rustls::ServerConfig>,
        /// The token check.
        auth: Arc<TokenAuth>,
    },
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Security::Plaintext => f.write_str("Plaintext"),
            Security::Tls { auth, .. } => f.debug_struct("Tls").field("auth", auth).finish(),
        }
    }
}

impl Default for StreamSettings {
    fn default() -> Self {
        StreamSettings {
            heartbeat: Duration::from_secs(10),
            snapshot_part_leases: 16_384,
            keepalive_interval: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(5),
            security: Security::Plaintext,
            limits: Limits {
                idle: Some(STREAM_IDLE),
                ..Limits::default()
            },
        }
    }
}

/// The service implementation.
#[derive(Clone)]
pub struct ConfigServer {
    index: Arc<Index>,
    reports: Arc<Reports>,
    settings: StreamSettings,
    shutdown: watch::Receiver<bool>,
}

impl ConfigServer {
    /// A service over `index`; every stream ends when `shutdown` turns true.
    pub fn new(
        index: Arc<Index>,
        reports: Arc<Reports>,
        settings: StreamSettings,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        ConfigServer {
            index,
            reports,
            settings,
            shutdown,
        }
    }
}

impl ConfigServer {
    /// Refuses callers without an agent token when the stream is secured; says who the caller
    /// is when its token tells (plaintext: nobody is known).
    async fn authorize<T>(&self, request: &Request<T>) -> Result<Verified, Status> {
        match &self.settings.security {
            Security::Plaintext => Ok(Verified::default()),
            Security::Tls { auth, .. } => Ok(auth
                .check(request.metadata(), request.remote_addr())
                .await?),
        }
    }

    /// Keeps a verified Watch's verdict for Reports on its connection while the guard lives.
    fn watching<T>(&self, request: &Request<T>, who: &Verified) -> Option<WatchGuard> {
        match &self.settings.security {
            Security::Plaintext => None,
            Security::Tls { auth, .. } => {
                auth.watching(request.metadata(), request.remote_addr(), who)
            }
        }
    }
}

fn invalid(field: &str, value: &str, reason: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("{field} = {value:?}: {reason}"))
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ConfigService for ConfigServer {
    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<WatchStream>, Status> {
        let caller = self.authorize(&request).await?;
        let peer = request.remote_addr();
        let verdict = self.watching(&request, &caller);
        let req = request.into_inner();
        let pools = req
            .pool_refs
            .iter()
            .map(|r| {
                r.parse::<NamespacedName>()
                    .map_err(|e| invalid("pool_refs", r, e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let agent = req.agent.as_ref().map_or_else(
            || "unnamed".to_owned(),
            |a| format!("{}/{}", a.namespace, a.pod_name),
        );
        let resume = (req.epoch == *self.index.epoch() && req.revision > 0).then_some(req.revision);
        let session = Session {
            index: self.index.clone(),
            filter: PoolFilter::only(pools),
            revisions: self.index.subscribe(),
            shutdown: self.shutdown.clone(),
            settings: self.settings.clone(),
            sent: resume,
            greet: true,
            pending: VecDeque::new(),
            _open: self.reports.stream_opened(),
            _verdict: verdict,
        };
        info!(%agent, ?peer, epoch = %req.epoch, revision = req.revision, resume = resume.is_some(), "agent watching");
        let span = info_span!("watch", %agent);
        let stream =
            futures_util::stream::unfold(session, move |s| s.next().instrument(span.clone()));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn report(
        &self,
        request: Request<pb::ReportRequest>,
    ) -> Result<Response<pb::ReportResponse>, Status> {
        let caller = self.authorize(&request).await?;
        // A token bound to no pod could speak as any agent pod, the Lease holder's too: a
        // secured stream takes reports only from the kubelet's projected tokens.
        if matches!(self.settings.security, Security::Tls { .. }) && caller.pod.is_none() {
            return Err(Status::permission_denied(
                "reports need a ServiceAccount token bound to the agent's pod (the projected \
                 token the chart mounts); this token is bound to none",
            ));
        }
        let req = request.into_inner();
        let agent = req
            .agent
            .ok_or_else(|| invalid("agent", "", "is required"))?;
        // Reports are keyed by the agent's pod: a token bound to a pod may report only as that
        // pod, so one agent cannot speak (or fill the table) in the names of others.
        if let Some(pod) = &caller.pod
            && *pod != agent.pod_name
        {
            return Err(Status::permission_denied(format!(
                "this token belongs to pod {pod:?}; it may not report as {:?}",
                agent.pod_name
            )));
        }
        // And in the namespace of its ServiceAccount: the agents' own, never another's.
        if let Some(namespace) = &caller.namespace
            && *namespace != agent.namespace
        {
            return Err(Status::permission_denied(format!(
                "this token belongs to namespace {namespace:?}; it may not report as {:?}",
                agent.namespace
            )));
        }
        if agent.pod_name.is_empty() || agent.namespace.is_empty() {
            return Err(invalid(
                "agent",
                &format!("{}/{}", agent.namespace, agent.pod_name),
                "needs pod_name and namespace",
            ));
        }
        for i in &req.interfaces {
            i.pool_ref
                .parse::<NamespacedName>()
                .map_err(|e| invalid("interfaces.pool_ref", &i.pool_ref, e))?;
            if pb::InterfaceState::try_from(i.state).is_err() {
                return Err(invalid(
                    "interfaces.state",
                    &i.state.to_string(),
                    "is not an InterfaceState",
                ));
            }
        }
        // Every applied revision brings one (twice a second while VMs are created): what is
        // news among them is logged where it is published.
        debug!(agent = %format!("{}/{}", agent.namespace, agent.pod_name), revision = req.applied_revision, leader = req.leader, interfaces = req.interfaces.len(), "agent report");
        let recorded = self.reports.record(AgentReport {
            agent: identity(agent),
            epoch: req.epoch,
            applied_revision: req.applied_revision,
            leader: req.leader,
            interfaces: req
                .interfaces
                .into_iter()
                .map(interface)
                .collect::<Result<_, _>>()?,
            received_at: SystemTime::now(),
        });
        match recorded {
            Ok(()) => Ok(Response::new(pb::ReportResponse {})),
            Err(e @ (ReportError::Identity { .. } | ReportError::Field { .. })) => {
                Err(Status::invalid_argument(e.to_string()))
            }
            Err(e) => Err(Status::resource_exhausted(e.to_string())),
        }
    }
}

/// The reporting agent, as the controller keeps it.
fn identity(a: pb::AgentIdentity) -> AgentIdentity {
    AgentIdentity {
        pod_name: a.pod_name,
        namespace: a.namespace,
        node_name: a.node_name,
    }
}

/// One interface of a report, as the controller keeps it (its state was checked on receipt).
fn interface(i: pb::InterfaceReport) -> Result<InterfaceReport, Status> {
    let mut suspects = Vec::with_capacity(i.suspects.len());
    for s in &i.suspects {
        suspects.extend(suspect(s)?);
    }
    Ok(InterfaceReport {
        state: InterfaceState::from_number(i.state).unwrap_or_default(),
        probes: i.probes.iter().map(probe).collect::<Result<_, _>>()?,
        suspects,
        pool_ref: i.pool_ref,
        interface_name: i.interface_name,
        error: i.error,
        lease_count: i.lease_count,
    })
}

/// One probe verdict, checked: an address, MACs or empty, a known reason.
fn probe(p: &pb::AddressProbe) -> Result<AddressProbe, Status> {
    let mac = |field: &str, value: &str| {
        MacAddr::parse_or_empty(value).map_err(|e| invalid(field, value, e))
    };
    Ok(AddressProbe {
        ip: p.ip_address.parse().map_err(|_| {
            invalid(
                "interfaces.probes.ip_address",
                &p.ip_address,
                "is not an IP address",
            )
        })?,
        mac: mac("interfaces.probes.mac_address", &p.mac_address)?,
        answered_by: mac("interfaces.probes.answered_by", &p.answered_by)?,
        reason: ProbeReason::from_number(p.reason).ok_or_else(|| {
            invalid(
                "interfaces.probes.reason",
                &p.reason.to_string(),
                "is not a ProbeReason",
            )
        })?,
    })
}

/// One suspect host, checked: a MAC, an address or empty, the detail cut to its bound. A kind
/// this controller does not know (a newer agent's) is skipped: `None`.
fn suspect(s: &pb::NetworkSuspect) -> Result<Option<NetworkSuspect>, Status> {
    let Some(kind) = SuspectKind::from_number(s.kind) else {
        if s.kind == pb::SuspectKind::Unspecified as i32 {
            return Err(invalid(
                "interfaces.suspects.kind",
                &s.kind.to_string(),
                "is not a SuspectKind",
            ));
        }
        return Ok(None);
    };
    let mac = s
        .mac_address
        .parse()
        .map_err(|e| invalid("interfaces.suspects.mac_address", &s.mac_address, e))?;
    let ip = match (s.ip_address.as_str(), s.ipv6_address.as_str()) {
        ("", "") => None,
        (text, "") => Some(IpAddr::V4(text.parse().map_err(|_| {
            invalid(
                "interfaces.suspects.ip_address",
                text,
                "is not an IPv4 address",
            )
        })?)),
        ("", text) => Some(IpAddr::V6(text.parse().map_err(|_| {
            invalid(
                "interfaces.suspects.ipv6_address",
                text,
                "is not an IPv6 address",
            )
        })?)),
        (_, text) => {
            return Err(invalid(
                "interfaces.suspects.ipv6_address",
                text,
                "is set beside ip_address (at most one of the two)",
            ));
        }
    };
    Ok(Some(NetworkSuspect {
        kind,
        mac,
        ip,
        detail: truncate_detail(&s.detail, MAX_SUSPECT_DETAIL).to_owned(),
    }))
}

/// One agent's stream: what it has been sent and what it still has to be sent.
struct Session {
    index: Arc<Index>,
    filter: PoolFilter,
    revisions: watch::Receiver<u64>,
    shutdown: watch::Receiver<bool>,
    settings: StreamSettings,
    /// The revision the agent is at after everything sent so far; `None` until a snapshot went.
    sent: Option<u64>,
    /// Whether the next idle wait should be skipped with an immediate heartbeat (stream start).
    greet: bool,
    /// Remaining parts of a snapshot being sent.
    pending: VecDeque<pb::WatchResponse>,
    /// Keeps this stream counted in [`Reports::open_streams`].
    _open: OpenStream,
    /// Keeps the caller's verdict for its Reports on this connection.
    _verdict: Option<WatchGuard>,
}

impl Session {
    fn message(&self, revision: u64, event: pb::watch_response::Event) -> pb::WatchResponse {
        pb::WatchResponse {
            epoch: self.index.epoch().to_string(),
            revision,
            event: Some(event),
            trace_context: Default::default(),
        }
    }

    async fn next(mut self) -> Option<(Result<pb::WatchResponse, Status>, Self)> {
        if let Some(part) = self.pending.pop_front() {
            return Some((Ok(part), self));
        }
        loop {
            if *self.shutdown.borrow() {
                debug!("server shutting down; ending stream");
                return None;
            }
            let Some(sent) = self.sent else {
                let snapshot = self.index.snapshot(&self.filter);
                self.sent = Some(snapshot.revision);
                self.greet = false;
                let mut parts = snapshot_parts(&snapshot, self.settings.snapshot_part_leases);
                let span = info_span!(
                    "stream.send",
                    kind = "snapshot",
                    revision = snapshot.revision,
                    parts = parts.len(),
                    pools = snapshot.pools.len(),
                    leases = snapshot.pools.iter().map(|(_, l)| l.len()).sum::<usize>(),
                );
                // A snapshot carries the state every revision so far made: it continues the
                // latest one's trace.
                let causes = self.index.causes(0, snapshot.revision);
                trace::continue_from(&span, &causes[..causes.len().min(1)]);
                let carrier = trace::inject(&span);
                for part in &mut parts {
                    part.trace_context = carrier.clone();
                }
                span.in_scope(|| debug!(parts = parts.len(), "sending snapshot"));
                self.pending = parts.into();
                let first = self.pending.pop_front()?;
                return Some((Ok(first), self));
            };
            self.revisions.borrow_and_update();
            if self.index.revision() != sent {
                match self.index.changes_since(sent, &self.filter) {
                    None => {
                        debug!(sent, "agent fell out of the history; sending a snapshot");
                        self.sent = None;
                        continue;
                    }
                    Some(changes) => {
                        self.sent = Some(changes.revision);
                        self.greet = false;
                        let span = info_span!(
                            "stream.send",
                            kind = "delta",
                            revision = changes.revision,
                            base_revision = changes.base_revision,
                            pools = changes.upserted_pools.len() + changes.removed_pools.len(),
                            leases = changes.upserted_leases.len() + changes.removed_leases.len(),
                        );
                        // The revisions this delta carries: the newest is the parent, the
                        // others (coalesced into it) are linked.
                        trace::continue_from(&span, &self.index.causes(sent, changes.revision));
                        let mut msg = self.message(
                            changes.revision,
                            pb::watch_response::Event::Delta(delta(&changes)),
                        );
                        msg.trace_context = trace::inject(&span);
                        return Some((Ok(msg), self));
                    }
                }
            }
            if std::mem::take(&mut self.greet) {
                return Some((Ok(self.heartbeat(sent)), self));
            }
            tokio::select! {
                changed = self.revisions.changed() => {
                    if changed.is_err() {
                        return None;
                    }
                }
                _ = self.shutdown.changed() => {}
                () = tokio::time::sleep(self.settings.heartbeat) => {
                    return Some((Ok(self.heartbeat(sent)), self));
                }
            }
        }
    }

    fn heartbeat(&self, revision: u64) -> pb::WatchResponse {
        let sent_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or_default();
        self.message(
            revision,
            pb::watch_response::Event::Heartbeat(pb::Heartbeat { sent_unix_ms }),
        )
    }
}

/// Splits a snapshot into messages of at most `part_leases` leases (at least one message; a
/// large pool may span several parts, its leases being the union).
pub fn snapshot_parts(snapshot: &Snapshot, part_leases: usize) -> Vec<pb::WatchResponse> {
    let part_leases = part_leases.max(1);
    let mut parts: Vec<Vec<pb::PoolSnapshot>> = Vec::new();
    let mut current: Vec<pb::PoolSnapshot> = Vec::new();
    let mut in_part = 0usize;
    for (config, leases) in &snapshot.pools {
        let config = pb::PoolConfig::from(config);
        if leases.is_empty() {
            current.push(pb::PoolSnapshot {
                config: Some(config),
                leases: Vec::new(),
            });
            continue;
        }
        for chunk in leases.chunks(part_leases) {
            if in_part > 0 && in_part + chunk.len() > part_leases {
                parts.push(std::mem::take(&mut current));
                in_part = 0;
            }
            in_part += chunk.len();
            let leases = chunk
                .iter()
                .map(|(mac, binding)| convert::lease_entry(mac, binding))
                .collect();
            current.push(pb::PoolSnapshot {
                config: Some(config.clone()),
                leases,
            });
        }
    }
    parts.push(current);
    let last = parts.len() - 1;
    parts
        .into_iter()
        .enumerate()
        .map(|(i, pools)| pb::WatchResponse {
            epoch: snapshot.epoch.to_string(),
            revision: snapshot.revision,
            event: Some(pb::watch_response::Event::Snapshot(pb::Snapshot {
                pools,
                more: i != last,
            })),
            trace_context: Default::default(),
        })
        .collect()
}

fn delta(c: &PoolDelta) -> pb::Delta {
    pb::Delta {
        base_revision: c.base_revision,
        upserted_pools: c.upserted_pools.iter().map(Into::into).collect(),
        removed_pools: c.removed_pools.iter().map(ToString::to_string).collect(),
        upserted_leases: c.upserted_leases.iter().map(Into::into).collect(),
        removed_leases: c
            .removed_leases
            .iter()
            .map(|(p, m)| pb::LeaseKey {
                pool_ref: p.to_string(),
                mac_address: m.to_string(),
            })
            .collect(),
    }
}

/// Serves `ConfigService`, grpc.health.v1 and reflection (v1 and v1alpha, for older grpcurl)
/// on `listener` until `shutdown` turns true; then ends every stream and drains.
pub async fn serve(
    listener: TcpListener,
    index: Arc<Index>,
    reports: Arc<Reports>,
    settings: StreamSettings,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), ConfigServiceError> {
    let addr: SocketAddr = listener.local_addr()?;
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<ConfigServiceServer<ConfigServer>>()
        .await;
    let reflection = |b: tonic_reflection::server::Builder<'static>| {
        b.register_encoded_file_descriptor_set(vmdhcp_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection(tonic_reflection::server::Builder::configure())
        .build_v1()
        .map_err(|e| ConfigServiceError::Reflection(e.to_string()))?;
    let reflection_v1alpha = reflection(tonic_reflection::server::Builder::configure())
        .build_v1alpha()
        .map_err(|e| ConfigServiceError::Reflection(e.to_string()))?;
    let service = ConfigServiceServer::new(ConfigServer::new(
        index,
        reports,
        settings.clone(),
        shutdown.clone(),
    ))
    .max_encoding_message_size(64 << 20);
    info!(%addr, tls = matches!(settings.security, Security::Tls { .. }), "config stream serving");
    let stop = async move {
        // Stops on true, or when the sender is gone.
        let _ = shutdown.wait_for(|stop| *stop).await;
        health
            .set_not_serving::<ConfigServiceServer<ConfigServer>>()
            .await;
        info!("config stream draining");
    };
    let server = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(settings.keepalive_interval))
        .http2_keepalive_timeout(Some(settings.keepalive_timeout))
        .max_concurrent_streams(MAX_STREAMS)
        .http2_max_header_list_size(MAX_HEADER_LIST)
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_RESETS))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(service);
    let result = match &settings.security {
        Security::Plaintext => {
            // tonic's `tcp_keepalive` applies only to its own `TcpIncoming`: set it there.
            let incoming = tonic::transport::server::TcpIncoming::from(listener)
                .with_keepalive(Some(settings.keepalive_interval));
            server.serve_with_incoming_shutdown(incoming, stop).await
        }
        Security::Tls { config, .. } => {
            // A live connection talks at least every keepalive round: the byte clock may not be
            // shorter, or it would cut agents between PINGs.
            let round = settings.keepalive_interval + settings.keepalive_timeout;
            let limits = Limits {
                idle: settings.limits.idle.map(|idle| idle.max(round)),
                ..settings.limits.clone()
            };
            let (incoming, _usage) =
                crate::security::listener::accept(listener, config.clone(), limits);
            server.serve_with_incoming_shutdown(incoming, stop).await
        }
    };
    if let Err(e) = &result {
        warn!(error = %e, "config stream server failed");
    }
    Ok(result?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use vmdhcp_core::MacAddr;
    use vmdhcp_core::fixtures::pool_config;
    use vmdhcp_core::pool::PoolConfig;

    fn cfg(name: &str) -> PoolConfig {
        pool_config(&format!("ns/{name}")).with_lease_seconds(60)
    }

    #[test]
    fn a_suspect_s_address_is_read_from_its_family_s_field_and_never_from_both() {
        let wire = |kind: pb::SuspectKind, v4: &str, v6: &str| pb::NetworkSuspect {
            kind: kind.into(),
            mac_address: "02:00:00:00:0e:0e".into(),
            ip_address: v4.into(),
            ipv6_address: v6.into(),
            detail: "seen".into(),
        };
        let ip = |s: &pb::NetworkSuspect| suspect(s).map(|s| s.and_then(|s| s.ip));
        let foreign = pb::SuspectKind::ForeignDhcpServer;
        assert_eq!(
            ip(&wire(foreign, "192.0.2.7", "")).unwrap(),
            Some(Ipv4Addr::new(192, 0, 2, 7).into())
        );
        assert_eq!(
            ip(&wire(foreign, "", "fe80::66")).unwrap(),
            Some("fe80::66".parse::<IpAddr>().unwrap())
        );
        assert_eq!(ip(&wire(foreign, "", "")).unwrap(), None);
        for (v4, v6, field) in [
            ("fe80::66", "", "interfaces.suspects.ip_address"),
            ("", "192.0.2.7", "interfaces.suspects.ipv6_address"),
            ("192.0.2.7", "fe80::66", "interfaces.suspects.ipv6_address"),
        ] {
            let err = ip(&wire(foreign, v4, v6)).unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument);
            assert!(err.message().starts_with(field), "{}", err.message());
        }
        // The IPv6 kind is read; a kind from a newer agent is skipped, not refused.
        let ndp = suspect(&wire(pb::SuspectKind::ProxyNdpResponder, "", "")).unwrap();
        assert_eq!(ndp.map(|s| s.kind), Some(SuspectKind::ProxyNdpResponder));
        let mut newer = wire(foreign, "", "");
        newer.kind = 99;
        assert_eq!(suspect(&newer).unwrap(), None);
    }

    #[test]
    fn interface_states_keep_their_wire_numbers() {
        // The reports ConfigMap stores these numbers: they must stay the wire's.
        for state in [
            pb::InterfaceState::Unspecified,
            pb::InterfaceState::Serving,
            pb::InterfaceState::Standby,
            pb::InterfaceState::Error,
        ] {
            let kept = InterfaceState::from_number(state as i32).unwrap();
            assert_eq!(kept as i32, state as i32);
            assert_eq!(format!("{kept:?}"), format!("{state:?}"));
        }
        assert_eq!(InterfaceState::from_number(4), None);
    }

    #[test]
    fn snapshots_split_into_bounded_parts_and_keep_every_lease() {
        let leases = |n: u32| {
            (0..n)
                .map(|i| {
                    (
                        MacAddr([2, 0, 0, 0, (i >> 8) as u8, i as u8]),
                        vmdhcp_core::pool::Binding::ip(Ipv4Addr::from(i)),
                    )
                })
                .collect::<Vec<_>>()
        };
        let snap = Snapshot {
            epoch: "e".into(),
            revision: 7,
            pools: vec![
                (cfg("a"), leases(5)),
                (cfg("b"), vec![]),
                (cfg("c"), leases(12)),
            ],
        };
        let parts = snapshot_parts(&snap, 4);
        let mut total = 0;
        for (i, p) in parts.iter().enumerate() {
            let Some(pb::watch_response::Event::Snapshot(s)) = &p.event else {
                panic!("not a snapshot")
            };
            assert_eq!(s.more, i + 1 != parts.len());
            assert_eq!(p.revision, 7);
            let n: usize = s.pools.iter().map(|p| p.leases.len()).sum();
            assert!(n <= 4, "part {i} has {n} leases");
            total += n;
        }
        assert_eq!(total, 17);
        let empty = Snapshot {
            epoch: "e".into(),
            revision: 0,
            pools: vec![],
        };
        assert_eq!(snapshot_parts(&empty, 4).len(), 1);
    }
}
