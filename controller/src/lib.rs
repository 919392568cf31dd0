//! The vmdhcp controller: it turns IPPools and VirtualMachines into allocations recorded in etcd,
//! and serves the resulting pool configs and leases to the agents.
//!
//! # Layout
//!
//! | where | owns |
//! |---|---|
//! | [`runtime`] | the wiring: watches, servers, leadership gating every writer, TLS and webhook start-up |
//! | [`reconcile`] | the reconcilers (leader only) and what they share: IPPool, VirtualMachine, VirtualMachineNetworkConfig, status writing, the agent Deployment bootstrap, retiring upstream's agent pods |
//! | [`index`] | the versioned pool configs and leases agents are served; IPPool status → index on every replica; shared watches |
//! | [`stream`] | the gRPC `ConfigService` (Watch stream, Report) and who may call it |
//! | [`security`] | the CA and serving certificate, the bounded TLS accept loop, the admission webhook |
//! | [`ipam`] | per-pool address allocation and MAC ownership, rebuilt from `IPPool.status` |
//! | [`reports`] | what agents report (for `AgentReady`), shared between replicas through a ConfigMap |
//! | [`kinds`] | the dynamic kinds (KubeVirt VM, Multus NAD) and object names |
//! | [`causes`] | trace links from a write to the task that later acts on it |
//! | [`metrics`], [`http`] | Prometheus metrics and the HTTP endpoints |
//!
//! # Layers
//!
//! A module imports only modules of the layers below its own, never one above or beside it:
//! the index, IPAM, reports and kinds know nothing of who drives them, and the reconcilers never
//! import the gRPC layer. `tests/layering.rs` reads this list and fails on any import against
//! it, so a new module must be placed here.
//!
//! 1. `runtime`
//! 2. `reconcile`, `stream`, `http`
//! 3. `security`
//! 4. `index`
//! 5. `ipam`, `reports`, `kinds`, `causes`, `metrics`
//!
//! # One lease, from `kubectl apply` to the agent
//!
//! 1. `kubectl apply` a VirtualMachine with a NIC on a Multus network. [`reconcile::vm`] writes a
//!    VirtualMachineNetworkConfig named after it, listing the NIC's MAC.
//! 2. [`reconcile::vmnetcfg`] finds the IPPool serving that network, takes an address from the
//!    pool's [`ipam`] allocator, records it in `IPPool.status.ipv4.allocated` (through
//!    [`reconcile::status::PoolStatusWriter`]), and only then marks the config `Allocated`.
//! 3. On every replica, [`index::sync`] sees the pool's status change and applies the lease to
//!    the [`index::Index`] as one new revision.
//! 4. [`stream::config_service`] sends that revision as a delta on every agent's Watch stream;
//!    the leading agent adds the lease to its table and answers the VM's DHCP request.
//! 5. The agent reports its interfaces back ([`reports`]); [`reconcile::ippool`] turns the report
//!    into the pool's `AgentReady` condition.
#![forbid(unsafe_code)]

pub mod causes;
pub mod http;
pub mod index;
pub mod ipam;
pub mod kinds;
pub mod metrics;
pub mod reconcile;
pub mod reports;
pub mod runtime;
pub mod security;
pub mod stream;
