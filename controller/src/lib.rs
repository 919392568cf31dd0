//! The vmdhcp controller: it turns IPPools and VirtualMachines into allocations recorded in etcd,
//! and serves the resulting pool configs and leases to the agents.
//!
//! - [`ipam`]: per-pool address allocation, rebuilt from `IPPool.status` after any restart.
//! - [`index`]: the versioned pool configs and leases the config stream serves.
//! - [`config_service`]: the gRPC `ConfigService` (Watch stream, Report) built on the index.
//! - [`index_sync`]: IPPool status → index, on every replica.
//! - [`reports`]: what agents report (for `AgentReady`), shared through the API so the leader
//!   sees reports that reached any replica.
//! - [`ippool`], [`vmnetcfg`], [`vm`]: the reconcilers (leader only), sharing a [`context::Context`].
//! - [`status`]: conditions and the batched IPAM → `IPPool.status` writer.
//! - [`agent_bootstrap`]: the agent Deployment's Multus annotation and env.
//! - [`metrics`], [`http`]: Prometheus metrics and the HTTP endpoints.
//! - [`certs`], [`tls`]: the controller's CA and serving certificate, kept in a Secret, renewed
//!   before expiry and published (CA ConfigMap, webhook caBundles).
//! - [`auth`]: who may read the config stream (agent ServiceAccount tokens, via TokenReview).
//! - [`listener`]: TLS accept loops bounded in handshakes, connections and time.
//! - [`webhook`]: the admission webhook server (decisions in `vmdhcp_core::admission`).
//! - [`shared_watch`]: one watch (and cache) feeding several controllers.
//! - [`upstream_agent`]: retiring the Go controller's per-pool agent pod once ours serves.
//! - [`runtime`]: the wiring, with leadership gating every writer.
#![forbid(unsafe_code)]

pub mod agent_bootstrap;
pub mod auth;
pub mod causes;
pub mod certs;
pub mod config_service;
pub mod context;
pub mod http;
pub mod index;
pub mod index_sync;
pub mod ipam;
pub mod ippool;
pub mod kinds;
pub mod listener;
pub mod metrics;
pub mod reports;
pub mod runtime;
pub mod shared_watch;
pub mod status;
pub mod tls;
pub mod upstream_agent;
pub mod vm;
pub mod vmnetcfg;
pub mod webhook;
