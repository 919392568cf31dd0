//! The agent's side of the config stream: connect to a controller, apply a snapshot then deltas
//! in order, and keep the last good state through any disconnect.
//!
//! [`AppliedState`] is what the agent has applied: every pool it serves with its leases, at one
//! epoch and revision. [`Applier`] turns wire messages into it and is the only place that
//! decides whether a message is acceptable: every field is converted and every ordering rule
//! checked *before* anything changes, so a malformed or out-of-order message changes nothing.
//! [`run`] owns the connection: it resumes by epoch and revision, reconnects with jittered
//! exponential backoff, asks for a fresh snapshot after rejecting a message, and treats a stream
//! that stays silent past the idle timeout (heartbeats stopped) as dead.
//!
//! Applied changes are handed to a [`ConfigSink`] ([`crate::sources::Sources`] in the agent,
//! which feeds the lease table).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use prost::Message as _;
use prost::bytes::{Buf as _, Bytes};
use tokio::sync::watch;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tracing::{Instrument, debug, info, info_span, warn};
/// The delta type the stream applies (shared with the controller's index).
pub use vmdhcp_core::pool::PoolDelta;
use vmdhcp_core::pool::{Binding, Lease, PoolConfig};
use vmdhcp_core::{MacAddr, NamespacedName, retry};
use vmdhcp_proto::agent::v1 as pb;
use vmdhcp_proto::agent::v1::config_service_server::SERVICE_NAME;
use vmdhcp_proto::convert::{ConvertError, lease_from_entry, lease_key, removed_pool};
use vmdhcp_telemetry::trace;

/// Why a message was rejected or the stream failed.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// A field holds a value the domain model cannot take.
    #[error("invalid message: {0}")]
    Invalid(#[from] ConvertError),
    /// A message that does not follow from the applied state.
    #[error("out-of-order message: {0}")]
    OutOfOrder(String),
    /// A message with no event.
    #[error("message at revision {0} carries no event")]
    Empty(u64),
    /// A frame that does not decode as a `WatchResponse` (garbage or truncated bytes).
    #[error("malformed frame of {len} bytes: {source}")]
    Malformed {
        /// The frame's length.
        len: usize,
        /// What the protobuf decoder said.
        source: prost::DecodeError,
    },
    /// The transport failed or the server ended the stream with an error.
    #[error("stream to {endpoint} failed: {step}: {source}")]
    Transport {
        /// The controller address.
        endpoint: String,
        /// What was being done: `connect`, `watch`, `receive`, …
        step: &'static str,
        /// The transport's, tonic's or the credentials' error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Nothing arrived for longer than the idle timeout.
    #[error("no message from {endpoint} for {seconds} s; assuming the stream is dead")]
    Idle {
        /// The controller address.
        endpoint: String,
        /// The idle timeout.
        seconds: u64,
    },
}

/// One pool as the agent serves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolState {
    /// Its configuration.
    pub config: PoolConfig,
    /// Its reservations.
    pub leases: BTreeMap<MacAddr, Binding>,
}

/// Everything applied from the stream, at one epoch and revision.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AppliedState {
    /// The controller epoch; empty before the first snapshot.
    pub epoch: String,
    /// The last revision applied completely.
    pub revision: u64,
    /// The pools served, with their leases.
    pub pools: BTreeMap<NamespacedName, PoolState>,
}

impl AppliedState {
    /// Number of leases over all pools.
    pub fn lease_count(&self) -> usize {
        self.pools.values().map(|p| p.leases.len()).sum()
    }
}

/// What applying one message did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    /// A complete snapshot replaced the state.
    Snapshot,
    /// Part of a snapshot was buffered; the state is unchanged until the last part.
    SnapshotPart,
    /// A delta was applied.
    Delta(PoolDelta),
    /// A heartbeat confirmed the state.
    Heartbeat,
}

/// Receives what the stream applies; the agent's [`crate::sources::Sources`] implements it, so
/// the stream never writes the lease table behind the fallback's back.
pub trait ConfigSink: Send + Sync {
    /// The state was replaced by a snapshot.
    fn snapshot(&self, state: &AppliedState);
    /// A delta was applied; `state` is the result.
    fn delta(&self, delta: &PoolDelta, state: &AppliedState);
    /// A new stream's first message was applied without a snapshot (the controller resumed from
    /// our revision): `state` is current again. A sink that served another source meanwhile
    /// re-reads it here.
    fn resumed(&self, state: &AppliedState) {
        let _ = state;
    }
}

/// Publishes each new state on a watch channel (clones the state; for tests and small setups).
impl ConfigSink for watch::Sender<Arc<AppliedState>> {
    fn snapshot(&self, state: &AppliedState) {
        self.send_replace(Arc::new(state.clone()));
    }

    fn delta(&self, _: &PoolDelta, state: &AppliedState) {
        self.send_replace(Arc::new(state.clone()));
    }
}

/// Applies wire messages to an [`AppliedState`], validating everything first.
#[derive(Debug, Default)]
pub struct Applier {
    state: AppliedState,
    /// A snapshot being received in parts: (epoch, revision, pools so far).
    partial: Option<(String, u64, BTreeMap<NamespacedName, PoolState>)>,
}

impl Applier {
    /// An applier starting from `state` (e.g. restored after a restart).
    pub fn new(state: AppliedState) -> Self {
        Applier {
            state,
            partial: None,
        }
    }

    /// The applied state.
    pub fn state(&self) -> &AppliedState {
        &self.state
    }

    /// Drops a half-received snapshot (the stream broke in the middle of it).
    pub fn abandon_partial(&mut self) {
        self.partial = None;
    }

    /// Applies one message, or rejects it and changes nothing.
    pub fn apply(&mut self, msg: &pb::WatchResponse) -> Result<Applied, StreamError> {
        let out_of_order = |what: String| Err(StreamError::OutOfOrder(what));
        let Some(event) = &msg.event else {
            return Err(StreamError::Empty(msg.revision));
        };
        if let Some((epoch, revision, _)) = &self.partial
            && (!matches!(event, pb::watch_response::Event::Snapshot(_))
                || *epoch != msg.epoch
                || *revision != msg.revision)
        {
            let (epoch, revision) = (epoch.clone(), *revision);
            self.partial = None;
            return out_of_order(format!(
                "snapshot {epoch}@{revision} was interrupted by a message for {}@{}",
                msg.epoch, msg.revision
            ));
        }
        match event {
            pb::watch_response::Event::Snapshot(snap) => self.apply_snapshot(msg, snap),
            pb::watch_response::Event::Delta(d) => self.apply_delta(msg, d),
            pb::watch_response::Event::Heartbeat(_) => {
                if msg.epoch != self.state.epoch || msg.revision != self.state.revision {
                    return out_of_order(format!(
                        "heartbeat at {}@{} but the state is at {}@{}",
                        msg.epoch, msg.revision, self.state.epoch, self.state.revision
                    ));
                }
                Ok(Applied::Heartbeat)
            }
        }
    }

    /// A snapshot part: accumulated until the last part, which replaces the state.
    fn apply_snapshot(
        &mut self,
        msg: &pb::WatchResponse,
        snap: &pb::Snapshot,
    ) -> Result<Applied, StreamError> {
        let mut pools = match self.partial.take() {
            Some((_, _, pools)) => pools,
            None => BTreeMap::new(),
        };
        for part in &snap.pools {
            let config = part.config.as_ref().ok_or_else(|| {
                StreamError::Invalid(ConvertError {
                    message: "PoolSnapshot",
                    field: "config",
                    value: String::new(),
                    reason: "is required".into(),
                })
            })?;
            let config = PoolConfig::try_from(config)?;
            let leases = part
                .leases
                .iter()
                .map(|e| lease_from_entry(&config.pool, e).map(|l| (l.mac, l.binding())))
                .collect::<Result<Vec<_>, _>>()?;
            let entry = pools
                .entry(config.pool.clone())
                .or_insert_with(|| PoolState {
                    config: config.clone(),
                    leases: BTreeMap::new(),
                });
            entry.config = config;
            entry.leases.extend(leases);
        }
        if snap.more {
            self.partial = Some((msg.epoch.clone(), msg.revision, pools));
            return Ok(Applied::SnapshotPart);
        }
        self.state = AppliedState {
            epoch: msg.epoch.clone(),
            revision: msg.revision,
            pools,
        };
        Ok(Applied::Snapshot)
    }

    /// A delta, checked whole against the state (epoch, revisions, leases on served pools)
    /// before any of it is applied.
    fn apply_delta(
        &mut self,
        msg: &pb::WatchResponse,
        d: &pb::Delta,
    ) -> Result<Applied, StreamError> {
        let out_of_order = |what: String| Err(StreamError::OutOfOrder(what));
        if self.state.epoch.is_empty() {
            return out_of_order(format!(
                "delta to revision {} before any snapshot",
                msg.revision
            ));
        }
        if msg.epoch != self.state.epoch {
            return out_of_order(format!(
                "delta of epoch {} on state of epoch {}",
                msg.epoch, self.state.epoch
            ));
        }
        if d.base_revision != self.state.revision || msg.revision <= d.base_revision {
            return out_of_order(format!(
                "delta {}→{} on state at revision {}",
                d.base_revision, msg.revision, self.state.revision
            ));
        }
        let delta = decode_delta(msg, d)?;
        for lease in &delta.upserted_leases {
            let known = self.state.pools.contains_key(&lease.pool)
                || delta.upserted_pools.iter().any(|p| p.pool == lease.pool);
            if !known || delta.removed_pools.contains(&lease.pool) {
                return out_of_order(format!(
                    "lease {} {} on pool {} that is not served",
                    lease.mac, lease.ip, lease.pool
                ));
            }
        }
        // Everything is valid: apply.
        let st = &mut self.state;
        for pool in &delta.removed_pools {
            st.pools.remove(pool);
        }
        for config in &delta.upserted_pools {
            st.pools
                .entry(config.pool.clone())
                .and_modify(|p| p.config = config.clone())
                .or_insert_with(|| PoolState {
                    config: config.clone(),
                    leases: BTreeMap::new(),
                });
        }
        for lease in &delta.upserted_leases {
            if let Some(p) = st.pools.get_mut(&lease.pool) {
                p.leases.insert(lease.mac, lease.binding());
            }
        }
        for (pool, mac) in &delta.removed_leases {
            if let Some(p) = st.pools.get_mut(pool) {
                p.leases.remove(mac);
            }
        }
        st.revision = delta.revision;
        Ok(Applied::Delta(delta))
    }
}

/// Where the stream stands, for `/readyz` and `/metrics`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConnectionStatus {
    /// Whether a stream is open and has delivered its first message.
    pub connected: bool,
    /// Epoch of the applied state.
    pub epoch: String,
    /// Last revision applied completely.
    pub revision: u64,
    /// Whether a state has been applied at all (from a snapshot).
    pub synced: bool,
    /// Streams opened so far.
    pub connects: u64,
    /// Messages rejected so far.
    pub rejected: u64,
    /// The last error, if any.
    pub last_error: Option<String>,
}

/// How to reach the controller and how patiently.
#[derive(Clone, Debug)]
pub struct ClientSettings {
    /// The controller's gRPC address, e.g. `http://vm-dhcp-controller:9090`.
    pub endpoint: String,
    /// Who we are.
    pub agent: pb::AgentIdentity,
    /// The pools we serve (empty: all).
    pub pool_refs: Vec<NamespacedName>,
    /// Time allowed to establish a connection.
    pub connect_timeout: Duration,
    /// First reconnect delay; doubles per failure up to `backoff_max`, with jitter
    /// ([`retry::exponential`]).
    pub backoff_min: Duration,
    /// Largest reconnect delay.
    pub backoff_max: Duration,
    /// Silence (no message, not even a heartbeat) after which the stream is considered dead.
    pub idle_timeout: Duration,
    /// CA and token for a secured stream.
    pub credentials: crate::credentials::Credentials,
}

impl ClientSettings {
    /// Defaults suited to a server heartbeat of 10 s.
    pub fn new(endpoint: impl Into<String>, agent: pb::AgentIdentity) -> Self {
        ClientSettings {
            endpoint: endpoint.into(),
            agent,
            pool_refs: Vec::new(),
            connect_timeout: Duration::from_secs(5),
            backoff_min: Duration::from_millis(200),
            backoff_max: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(35),
            credentials: crate::credentials::Credentials::default(),
        }
    }
}

/// The domain form of a delta message; any unreadable entry refuses the whole delta.
fn decode_delta(msg: &pb::WatchResponse, d: &pb::Delta) -> Result<PoolDelta, StreamError> {
    Ok(PoolDelta {
        base_revision: d.base_revision,
        revision: msg.revision,
        upserted_pools: d
            .upserted_pools
            .iter()
            .map(PoolConfig::try_from)
            .collect::<Result<_, _>>()?,
        removed_pools: d
            .removed_pools
            .iter()
            .map(|p| removed_pool(p))
            .collect::<Result<_, _>>()?,
        upserted_leases: d
            .upserted_leases
            .iter()
            .map(Lease::try_from)
            .collect::<Result<_, _>>()?,
        removed_leases: d
            .removed_leases
            .iter()
            .map(lease_key)
            .collect::<Result<_, _>>()?,
    })
}

/// Runs the stream until `shutdown` turns true: connects, applies, hands changes to `sink`,
/// publishes [`ConnectionStatus`], and reconnects after any failure. The state survives every
/// disconnect; it is only ever replaced by a complete, valid snapshot.
pub async fn run(
    settings: ClientSettings,
    mut applier: Applier,
    sink: Arc<dyn ConfigSink>,
    status: watch::Sender<ConnectionStatus>,
    mut shutdown: watch::Receiver<bool>,
) -> Applier {
    let reconnect_delays = || retry::exponential(settings.backoff_min, settings.backoff_max);
    let mut delays = reconnect_delays();
    let mut attempt = 0u32;
    let mut resync = false;
    loop {
        if *shutdown.borrow() {
            return applier;
        }
        let span = info_span!("config_stream", endpoint = %settings.endpoint, attempt);
        let outcome = session(
            &settings,
            &mut applier,
            &*sink,
            &status,
            &mut shutdown,
            resync,
        )
        .instrument(span)
        .await;
        applier.abandon_partial();
        if status.borrow().connected {
            // The stream was up: a new series of delays, as after any success.
            (attempt, delays) = (0, reconnect_delays());
        }
        status.send_modify(|s| s.connected = false);
        match outcome {
            Ok(true) => return applier,
            Ok(false) => {
                info!(endpoint = %settings.endpoint, "controller ended the stream; reconnecting");
                (attempt, delays) = (0, reconnect_delays());
                resync = false;
            }
            Err(
                e @ (StreamError::Invalid(_)
                | StreamError::OutOfOrder(_)
                | StreamError::Empty(_)
                | StreamError::Malformed { .. }),
            ) => {
                warn!(error = %e, revision = applier.state().revision, "rejected a message; keeping the applied state and asking for a snapshot");
                status.send_modify(|s| {
                    s.rejected += 1;
                    s.last_error = Some(e.to_string());
                });
                resync = true;
                (attempt, delays) = (0, reconnect_delays());
            }
            Err(e) => {
                warn!(error = %e, "config stream lost; serving the last applied state");
                status.send_modify(|s| s.last_error = Some(e.to_string()));
                attempt = attempt.saturating_add(1);
            }
        }
        let delay = delays.next().unwrap_or(settings.backoff_max);
        debug!(?delay, "reconnecting after backoff");
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// One stream. `Ok(true)` on shutdown, `Ok(false)` when the server ended it cleanly.
async fn session(
    settings: &ClientSettings,
    applier: &mut Applier,
    sink: &dyn ConfigSink,
    status: &watch::Sender<ConnectionStatus>,
    shutdown: &mut watch::Receiver<bool>,
    resync: bool,
) -> Result<bool, StreamError> {
    let mut stream = open_watch(settings, applier.state(), resync).await?;
    status.send_modify(|s| s.connects += 1);
    let mut first = true;
    loop {
        let next = tokio::select! {
            next = tokio::time::timeout(settings.idle_timeout, stream.message()) => next,
            _ = shutdown.changed() => return Ok(true),
        };
        let msg = match next {
            Err(_) => {
                return Err(StreamError::Idle {
                    endpoint: settings.endpoint.clone(),
                    seconds: settings.idle_timeout.as_secs(),
                });
            }
            Ok(Err(s)) => {
                return Err(StreamError::Transport {
                    endpoint: settings.endpoint.clone(),
                    step: "receive",
                    source: Box::new(s),
                });
            }
            Ok(Ok(None)) => return Ok(false),
            Ok(Ok(Some(frame))) => pb::WatchResponse::decode(frame.clone()).map_err(|source| {
                StreamError::Malformed {
                    len: frame.len(),
                    source,
                }
            })?,
        };
        let applied = apply_traced(&msg, applier, sink, first)?;
        if !matches!(applied, Applied::SnapshotPart) {
            first = false;
        }
        let st = applier.state();
        status.send_modify(|s| {
            s.connected = true;
            s.epoch.clone_from(&st.epoch);
            s.revision = st.revision;
            s.synced = !st.epoch.is_empty();
        });
    }
}

/// Connects and opens the Watch stream, resuming from `state` unless `resync` asks for a
/// fresh snapshot.
async fn open_watch(
    settings: &ClientSettings,
    state: &AppliedState,
    resync: bool,
) -> Result<tonic::codec::Streaming<Bytes>, StreamError> {
    let transport = |step: &'static str| {
        move |source: Box<dyn std::error::Error + Send + Sync>| StreamError::Transport {
            endpoint: settings.endpoint.clone(),
            step,
            source,
        }
    };
    let endpoint = settings
        .credentials
        .endpoint(&settings.endpoint)
        .map_err(|e| transport("credentials")(e.into()))?
        .connect_timeout(settings.connect_timeout)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true);
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| transport("connect")(e.into()))?;
    let mut client = tonic::client::Grpc::new(channel).max_decoding_message_size(64 << 20);
    let (epoch, revision) = if resync || state.epoch.is_empty() {
        (String::new(), 0)
    } else {
        (state.epoch.clone(), state.revision)
    };
    let request = pb::WatchRequest {
        agent: Some(settings.agent.clone()),
        epoch,
        revision,
        pool_refs: settings.pool_refs.iter().map(ToString::to_string).collect(),
    };
    client
        .ready()
        .await
        .map_err(|e| transport("watch")(e.into()))?;
    let path = format!("/{SERVICE_NAME}/Watch")
        .parse()
        .map_err(|e: tonic::codegen::http::uri::InvalidUri| transport("watch path")(e.into()))?;
    let mut request = tonic::Request::new(request);
    settings
        .credentials
        .authorize(&mut request)
        .map_err(|e| transport("credentials")(e.into()))?;
    Ok(client
        .server_streaming(request, path, FrameCodec)
        .await
        .map_err(|s| transport("watch")(s.into()))?
        .into_inner())
}

/// Applies one message and hands the change to `sink`, in a span that continues the
/// controller's trace (none for heartbeats). `first`: no message of this stream applied yet.
fn apply_traced(
    msg: &pb::WatchResponse,
    applier: &mut Applier,
    sink: &dyn ConfigSink,
    first: bool,
) -> Result<Applied, StreamError> {
    let kind = match &msg.event {
        Some(pb::watch_response::Event::Snapshot(s)) if s.more => "snapshot_part",
        Some(pb::watch_response::Event::Snapshot(_)) => "snapshot",
        Some(pb::watch_response::Event::Delta(_)) => "delta",
        Some(pb::watch_response::Event::Heartbeat(_)) => "heartbeat",
        None => "empty",
    };
    let span = if kind == "heartbeat" {
        tracing::Span::none()
    } else {
        tracing::info_span!(
            "apply",
            kind,
            epoch = %msg.epoch,
            revision = msg.revision,
            pools = tracing::field::Empty,
            leases = tracing::field::Empty,
            outcome = tracing::field::Empty,
            error = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        )
    };
    // The controller's send span: this apply is the last step of its trace.
    if let Some(parent) = trace::extract(&msg.trace_context) {
        trace::continue_from(&span, &[parent]);
    }
    let applied = span.in_scope(|| -> Result<Applied, StreamError> {
        let applied = applier.apply(msg)?;
        match &applied {
            Applied::Snapshot => {
                let st = applier.state();
                span.record("pools", st.pools.len());
                span.record("leases", st.lease_count());
                info!(epoch = %st.epoch, revision = st.revision, pools = st.pools.len(), leases = st.lease_count(), "applied snapshot");
                sink.snapshot(st);
            }
            Applied::Delta(d) => {
                let pools = d.upserted_pools.len() + d.removed_pools.len();
                let leases = d.upserted_leases.len() + d.removed_leases.len();
                span.record("pools", pools);
                span.record("leases", leases);
                debug!(revision = d.revision, pools, leases, "applied delta");
                sink.delta(d, applier.state());
            }
            Applied::SnapshotPart => {}
            Applied::Heartbeat => {
                if first {
                    sink.resumed(applier.state());
                }
            }
        }
        Ok(applied)
    });
    match &applied {
        Ok(_) => {
            span.record("outcome", "applied");
        }
        Err(e) => {
            span.record("outcome", "rejected");
            span.record("error", tracing::field::display(e));
            span.record("otel.status_code", "ERROR");
        }
    }
    applied
}

/// The Watch call's codec: requests are encoded as protobuf, but responses come out as the raw
/// bytes of each gRPC frame, decoded by [`session`] itself. With tonic's protobuf codec a frame
/// that does not decode surfaces as a transport `Status`, indistinguishable from a broken
/// connection; decoding here makes it a [`StreamError::Malformed`] message, which is rejected
/// and answered with a request for a fresh snapshot.
#[derive(Clone, Copy, Debug, Default)]
struct FrameCodec;

/// Encodes Watch requests (protobuf).
struct RequestEncoder;

/// Hands each response frame over undecoded.
struct FrameDecoder;

impl Codec for FrameCodec {
    type Encode = pb::WatchRequest;
    type Decode = Bytes;
    type Encoder = RequestEncoder;
    type Decoder = FrameDecoder;

    fn encoder(&mut self) -> RequestEncoder {
        RequestEncoder
    }

    fn decoder(&mut self) -> FrameDecoder {
        FrameDecoder
    }
}

impl Encoder for RequestEncoder {
    type Item = pb::WatchRequest;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: pb::WatchRequest,
        dst: &mut EncodeBuf<'_>,
    ) -> Result<(), Self::Error> {
        item.encode(dst)
            .map_err(|e| tonic::Status::internal(format!("encoding WatchRequest: {e}")))
    }
}

impl Decoder for FrameDecoder {
    type Item = Bytes;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Self::Error> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(name: &str) -> pb::PoolConfig {
        pb::PoolConfig {
            pool_ref: format!("ns/{name}"),
            network_name: format!("ns/{name}"),
            interface_name: "eth1".into(),
            server_ip: "192.0.2.1".into(),
            cidr: "192.0.2.0/24".into(),
            lease_time_seconds: 60,
            ..Default::default()
        }
    }

    fn msg(epoch: &str, revision: u64, event: pb::watch_response::Event) -> pb::WatchResponse {
        pb::WatchResponse {
            epoch: epoch.into(),
            revision,
            event: Some(event),
            trace_context: Default::default(),
        }
    }

    fn snapshot(
        epoch: &str,
        revision: u64,
        more: bool,
        pools: Vec<(pb::PoolConfig, Vec<(&str, &str)>)>,
    ) -> pb::WatchResponse {
        let pools = pools
            .into_iter()
            .map(|(c, l)| pb::PoolSnapshot {
                config: Some(c),
                leases: l
                    .into_iter()
                    .map(|(m, i)| pb::LeaseEntry {
                        mac_address: m.into(),
                        ip_address: i.into(),
                        host_name: String::new(),
                    })
                    .collect(),
            })
            .collect();
        msg(
            epoch,
            revision,
            pb::watch_response::Event::Snapshot(pb::Snapshot { pools, more }),
        )
    }

    fn delta(
        epoch: &str,
        base: u64,
        revision: u64,
        leases: Vec<(&str, &str, &str)>,
    ) -> pb::WatchResponse {
        let upserted_leases = leases
            .into_iter()
            .map(|(p, m, i)| pb::Lease {
                pool_ref: p.into(),
                mac_address: m.into(),
                ip_address: i.into(),
                host_name: String::new(),
            })
            .collect();
        msg(
            epoch,
            revision,
            pb::watch_response::Event::Delta(pb::Delta {
                base_revision: base,
                upserted_leases,
                ..Default::default()
            }),
        )
    }

    fn heartbeat(epoch: &str, revision: u64) -> pb::WatchResponse {
        msg(
            epoch,
            revision,
            pb::watch_response::Event::Heartbeat(pb::Heartbeat { sent_unix_ms: 1 }),
        )
    }

    fn applied() -> Applier {
        let mut a = Applier::default();
        a.apply(&snapshot(
            "e1",
            5,
            false,
            vec![(cfg("a"), vec![("02:00:00:00:00:01", "192.0.2.10")])],
        ))
        .unwrap();
        a
    }

    #[test]
    fn snapshot_then_deltas_in_order() {
        let mut a = applied();
        assert_eq!(a.state().revision, 5);
        assert_eq!(a.state().lease_count(), 1);
        let d = a
            .apply(&delta(
                "e1",
                5,
                7,
                vec![
                    ("ns/a", "02:00:00:00:00:01", "192.0.2.11"),
                    ("ns/a", "02:00:00:00:00:02", "192.0.2.12"),
                ],
            ))
            .unwrap();
        assert!(matches!(d, Applied::Delta(ref d) if d.upserted_leases.len() == 2));
        let pool = &a.state().pools[&"ns/a".parse::<NamespacedName>().unwrap()];
        assert_eq!(
            pool.leases[&"02:00:00:00:00:01".parse::<MacAddr>().unwrap()].ip,
            std::net::Ipv4Addr::new(192, 0, 2, 11)
        );
        assert_eq!(a.apply(&heartbeat("e1", 7)).unwrap(), Applied::Heartbeat);
        let removal = msg(
            "e1",
            8,
            pb::watch_response::Event::Delta(pb::Delta {
                base_revision: 7,
                removed_pools: vec!["ns/a".into()],
                ..Default::default()
            }),
        );
        a.apply(&removal).unwrap();
        assert!(a.state().pools.is_empty());
    }

    #[test]
    fn rejected_messages_change_nothing() {
        let cases = [
            delta("e1", 4, 6, vec![]), // gap behind
            delta("e1", 6, 7, vec![]), // gap ahead
            delta("e1", 5, 5, vec![]), // no progress
            delta("e2", 5, 6, vec![]), // other epoch
            delta("e1", 5, 6, vec![("ns/a", "02:00:00:00:00:09", "999.0.2.1")]), // bad address
            delta("e1", 5, 6, vec![("ns/a", "not-a-mac", "192.0.2.1")]), // bad MAC
            delta(
                "e1",
                5,
                6,
                vec![("ns/zz", "02:00:00:00:00:09", "192.0.2.9")],
            ), // unknown pool
            heartbeat("e1", 4),
            pb::WatchResponse {
                epoch: "e1".into(),
                revision: 6,
                event: None,
                trace_context: Default::default(),
            },
            snapshot(
                "e1",
                9,
                false,
                vec![(
                    pb::PoolConfig {
                        server_ip: "10.9.9.9".into(),
                        ..cfg("b")
                    },
                    vec![],
                )],
            ),
            snapshot(
                "e1",
                9,
                false,
                vec![(cfg("b"), vec![("02:00:00:00:00:01", "192.0.2")])],
            ),
        ];
        for bad in cases {
            let mut a = applied();
            let before = a.state().clone();
            assert!(a.apply(&bad).is_err(), "accepted {bad:?}");
            assert_eq!(a.state(), &before, "state changed by {bad:?}");
        }
        // A valid delta after a rejection still applies.
        let mut a = applied();
        assert!(
            a.apply(&delta("e1", 5, 6, vec![("ns/a", "bad", "192.0.2.1")]))
                .is_err()
        );
        a.apply(&delta(
            "e1",
            5,
            6,
            vec![("ns/a", "02:00:00:00:00:03", "192.0.2.13")],
        ))
        .unwrap();
        assert_eq!(a.state().lease_count(), 2);
    }

    #[test]
    fn snapshot_parts_replace_the_state_only_when_complete() {
        let mut a = applied();
        let before = a.state().clone();
        assert_eq!(
            a.apply(&snapshot(
                "e2",
                3,
                true,
                vec![(cfg("b"), vec![("02:00:00:00:00:05", "192.0.2.5")])]
            ))
            .unwrap(),
            Applied::SnapshotPart
        );
        assert_eq!(a.state(), &before);
        // The same pool continues in the next part.
        a.apply(&snapshot(
            "e2",
            3,
            false,
            vec![(cfg("b"), vec![("02:00:00:00:00:06", "192.0.2.6")])],
        ))
        .unwrap();
        assert_eq!(a.state().epoch, "e2");
        assert_eq!(a.state().pools.len(), 1);
        assert_eq!(a.state().lease_count(), 2);

        // A part interrupted by anything else is dropped, the state kept.
        let mut a = applied();
        a.apply(&snapshot("e2", 3, true, vec![(cfg("b"), vec![])]))
            .unwrap();
        assert!(a.apply(&heartbeat("e1", 5)).is_err());
        assert_eq!(a.state(), &before);
        a.apply(&snapshot("e3", 1, false, vec![])).unwrap();
        assert!(a.state().pools.is_empty());
    }
}
