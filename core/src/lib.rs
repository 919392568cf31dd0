//! vmdhcp's domain model, shared by the controller and the agent, with no I/O.
//!
//! - [`crd`]: the `IPPool` and `VirtualMachineNetworkConfig` custom resources (upstream's API),
//!   and the generator of their CRD manifests.
//! - [`names`] and [`mac`]: the validated identifiers everything is keyed by.
//! - [`pool`]: what an agent serves for one pool ([`pool::PoolConfig`]) and to whom ([`pool::Lease`]).
//! - [`ifname`]: stable per-pool interface names.
//! - [`bootstrap`]: the agent Deployment's env and Multus annotation.
//! - [`admission`]: the admission webhook's decisions (IPPool defaults, what is refused and why).
#![forbid(unsafe_code)]

pub mod admission;
pub mod bootstrap;
pub mod crd;
pub mod ifname;
pub mod mac;
pub mod names;
pub mod pool;

pub use mac::MacAddr;
pub use names::NamespacedName;
