//! Leader election among replicas through a `coordination.k8s.io/v1` Lease, as client-go's
//! `leaderelection` package does it, for the controller and the agents.
//!
//! - [`client`] builds the API client every electing process uses.
//! - [`config`] holds the timing knobs and their validation; [`cli`] the flags that set them.
//! - [`record`] is the pure part: reading a Lease (who holds it, has it expired for us) and
//!   computing the next Lease spec to write. No I/O, tested on plain data.
//! - [`elector`] drives acquire / renew / release against the API server and publishes, through a
//!   watch channel, whether this process may act as leader right now.
//!
//! The one guarantee callers build on: the leadership channel turns `false` no later than
//! `renew_deadline` after the start of the last successful write, which is strictly before any
//! other replica can consider the Lease expired (`lease_duration` after it saw that write). A
//! leader cut off from the API server therefore stops acting before a standby can take over.
//!
//! This crate owns the Lease object named in its config and nothing else.
//!
//! ```no_run
//! use tokio::sync::watch;
//! use vmdhcp_leader::{ElectionConfig, ElectionError, LeaderElector};
//!
//! async fn serve(client: kube::Client, stop: watch::Receiver<bool>) -> Result<(), ElectionError> {
//!     let config = ElectionConfig::new("vmdhcp-system", "vmdhcp-agent", "agent-0");
//!     let elector = LeaderElector::new(client, config)?;
//!     let mut leading = elector.subscribe();
//!     let election = tokio::spawn(elector.run(stop));
//!     while leading.changed().await.is_ok() {
//!         if *leading.borrow_and_update() {
//!             // start answering
//!         } else {
//!             // stop answering now: another replica may take over soon
//!         }
//!     }
//!     // The sender is dropped when `run` returns, after the Lease was released.
//!     let _ = election.await;
//!     Ok(())
//! }
//! ```
#![forbid(unsafe_code)]

pub mod cli;
pub mod client;
pub mod config;
pub mod elector;
pub mod record;

pub use cli::ElectionArgs;
pub use config::ElectionConfig;
pub use elector::{LeaderElector, LeaseHolder};

/// Why leader election could not be set up, or why one Lease request failed.
///
/// Request failures are logged and retried by [`LeaderElector::run`]; only configuration errors
/// reach the caller of [`LeaderElector::new`].
#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    /// The configuration breaks an invariant the fencing guarantee depends on.
    #[error("invalid leader election config: {reason}")]
    InvalidConfig {
        /// Which invariant, with the offending values.
        reason: String,
    },
    /// A request on the Lease failed (network, RBAC, conflict on resourceVersion, ...).
    #[error("{op} lease {lease}: {source}")]
    Api {
        /// The request: get, create or replace.
        op: &'static str,
        /// `namespace/name` of the Lease.
        lease: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// A request on the Lease did not answer in time.
    #[error("{op} lease {lease}: no answer within {millis} ms")]
    Timeout {
        /// The request.
        op: &'static str,
        /// `namespace/name` of the Lease.
        lease: String,
        /// How long we waited.
        millis: u128,
    },
}

impl ElectionError {
    /// Whether the API server refused a write for a stale `resourceVersion` (HTTP 409): someone,
    /// perhaps our own write whose answer was lost, changed the Lease since we read it.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Api { source: kube::Error::Api(status), .. } if status.code == 409)
    }
}
