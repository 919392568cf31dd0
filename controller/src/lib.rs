//! The vmdhcp controller: it turns IPPools and VirtualMachines into allocations recorded in etcd,
//! and serves the resulting pool configs and leases to the agents.
//!
//! - [`ipam`]: per-pool address allocation, rebuilt from `IPPool.status` after any restart.
#![forbid(unsafe_code)]

pub mod ipam;
