//! vmdhcp's domain model, shared by the controller and the agent, with no I/O.
//!
//! - [`crd`]: the `IPPool` and `VirtualMachineNetworkConfig` custom resources (upstream's API),
//!   and the generator of their CRD manifests.
//! - [`names`] and [`mac`]: the validated identifiers everything is keyed by.
//! - [`pool`]: what an agent serves for one pool ([`pool::PoolConfig`]) and to whom ([`pool::Lease`]).
//! - [`ifname`]: stable per-pool interface names.
//! - [`bootstrap`]: the agent Deployment's env and Multus annotation.
#![forbid(unsafe_code)]

pub mod bootstrap;
pub mod crd;
pub mod ifname;
pub mod mac;
pub mod names;
pub mod pool;

pub use mac::MacAddr;
pub use names::NamespacedName;
