//! The I/O half of the stream: the connection to the controller and its lifecycle.
//!
//! [`run`] opens the Watch call (resuming from the applied epoch and revision, or asking for a
//! fresh snapshot after a rejection), feeds each message to the [`Applier`], hands what it
//! applied to a [`ConfigSink`], and publishes [`ConnectionStatus`]. It reconnects with jittered
//! exponential backoff after any failure, and treats a stream silent past the idle timeout as
//! dead. Every decision about a message's content is the applier's; this file only moves bytes
//! and keeps time.

use std::sync::Arc;
use std::time::Duration;

use prost::Message as _;
use prost::bytes::Bytes;
use tokio::sync::watch;
use tracing::{Instrument, debug, info, info_span, warn};
use vmdhcp_core::{NamespacedName, retry};
use vmdhcp_proto::agent::v1 as pb;
use vmdhcp_proto::agent::v1::config_service_server::SERVICE_NAME;
use vmdhcp_telemetry::trace;

use super::codec::FrameCodec;
use super::{Applied, AppliedState, Applier, ConnectionStatus, StreamError};
use crate::pools::PoolDelta;

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
