//! The reconcilers (leader only): they turn IPPools, VirtualMachines and
//! VirtualMachineNetworkConfigs into allocations recorded in etcd, and keep the agent Deployment
//! bootstrapped.
//!
//! - [`context`]: what every reconciler shares (client, caches, IPAM, events, leadership gate);
//! - [`events`]: the bounded event queue and its publisher, repeats folded into series;
//! - [`ippool`]: a pool's network label, IPAM and status (`AgentReady` from agent reports);
//! - [`vm`]: a VirtualMachine → its VirtualMachineNetworkConfig (NICs, MACs, the static
//!   addresses its annotations pin), and its addresses where Harvester's UI shows them;
//! - [`vmnetcfg`]: a config's NICs → addresses, written to the pool's status first;
//! - [`claim`]: an AddressClaim's addresses, held on its NIC's MAC or its placeholder;
//! - [`status`]: conditions and the batched IPAM → `IPPool.status` writer;
//! - [`orphans`]: pool entries no live config names, released after a grace period;
//! - [`agent_bootstrap`]: the agent Deployment's Multus annotation and env;
//! - [`upstream_agent`]: retiring the Go controller's per-pool agent pod once ours serves;
//! - [`versioned`]: writes whose response is read for the resourceVersion alone.
//!
//! Every write checks leadership first. Reconcilers read the index and agent reports, never the
//! gRPC layer: what agents said reaches them as [`crate::reports`] types.

pub mod agent_bootstrap;
pub mod claim;
pub mod context;
pub mod events;
pub mod ippool;
pub mod orphans;
pub mod status;
pub mod upstream_agent;
pub mod versioned;
pub mod vm;
pub mod vmnetcfg;
