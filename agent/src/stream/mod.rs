//! The agent's side of the config stream: connect to a controller, apply a snapshot then deltas
//! in order, and keep the last good state through any disconnect.
//!
//! - `applier`: the pure part. [`AppliedState`] is what the agent has applied: every pool it
//!   serves with its leases ([`crate::pools::PoolLeases`]), at one epoch and revision.
//!   [`Applier`] turns wire messages into it and is the only place that decides whether a
//!   message is acceptable: every field is converted and every ordering rule checked *before*
//!   anything changes, so a malformed or out-of-order message changes nothing.
//! - `client`: the I/O. [`run`] owns the connection: it resumes by epoch and revision,
//!   reconnects with jittered exponential backoff, asks for a fresh snapshot after rejecting a
//!   message, and treats a stream that stays silent past the idle timeout (heartbeats stopped)
//!   as dead.
//! - `codec`: the Watch call's gRPC codec, which hands frames over undecoded so that a frame
//!   that does not decode is a rejected message rather than a broken connection.
//!
//! Applied changes are handed to a [`ConfigSink`] ([`crate::sources::Sources`] in the agent,
//! which feeds the lease table) in the agent's one vocabulary for pool state
//! ([`crate::pools`]): the applied state's pools, and each delta as the controller computed it.
//! This module knows nothing of the table it feeds.

use vmdhcp_proto::convert::ConvertError;

mod applier;
mod client;
mod codec;

/// The change the stream applies, in the agent's one vocabulary for pool state (re-exported so
/// that a sink is written against this module alone).
pub use crate::pools::PoolDelta;
pub use applier::{Applied, AppliedState, Applier};
pub use client::{ClientSettings, ConfigSink, run};

/// Why a message was rejected or the stream failed. One enum for the whole module, because
/// [`run`] tells them apart: the first four reject a message (the applier's three, and a frame
/// that does not decode), answered by asking for a fresh snapshot; the last two lose the
/// stream, which is resumed where it left off.
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
