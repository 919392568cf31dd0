//! The vmdhcp controller: it turns IPPools and VirtualMachines into allocations recorded in etcd,
//! and serves the resulting pool configs and leases to the agents.
//!
//! - [`ipam`]: per-pool address allocation, rebuilt from `IPPool.status` after any restart.
//! - [`index`]: the versioned pool configs and leases the config stream serves.
//! - [`config_service`]: the gRPC `ConfigService` (Watch stream, Report) built on the index.
#![forbid(unsafe_code)]

pub mod config_service;
pub mod index;
pub mod ipam;
