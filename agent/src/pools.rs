//! The agent's one vocabulary for pool state: [`PoolLeases`], a pool with its leases, and
//! [`PoolDelta`], a change to the pools.
//!
//! Every source describes what it serves in these two types: the config stream's applied state
//! ([`crate::stream`]), the IPPool-status fallback and the static file ([`crate::sources`]);
//! the lease table ([`crate::lease_table`]) takes them as they are. Living below all of them,
//! this module lets the stream and the table share a vocabulary without either knowing the
//! other, so nothing translates pool state between two shapes on its way to the packet path.

use std::collections::BTreeMap;

use vmdhcp_core::MacAddr;
use vmdhcp_core::pool::{Binding, PoolConfig};

/// A change to the pools, as the controller's index computes it and the stream delivers it; the
/// lease table applies it as it is (the same type on both sides of the stream, so a delta is
/// never re-expressed on its way).
pub use vmdhcp_core::pool::PoolDelta;

/// One pool with all its leases: a unit of a whole snapshot, whichever source it comes from.
///
/// Leases are keyed by MAC, as a NIC holds one address per pool: the stream's deltas upsert and
/// remove by MAC, and a lease cannot name another pool than the one it is listed under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolLeases {
    /// The pool's config; its `pool` names the pool.
    pub config: PoolConfig,
    /// Who holds which address (and host name) on the pool.
    pub leases: BTreeMap<MacAddr, Binding>,
}

impl PoolLeases {
    /// A pool with no lease yet (a pool just configured, or a snapshot part to fill).
    pub fn new(config: PoolConfig) -> Self {
        PoolLeases {
            config,
            leases: BTreeMap::new(),
        }
    }
}
