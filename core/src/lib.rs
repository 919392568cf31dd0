//! vmdhcp's domain model, shared by the controller and the agent, with no I/O.
//!
//! - [`crd`]: the `IPPool` and `VirtualMachineNetworkConfig` custom resources (upstream's API),
//!   and the generator of their CRD manifests.
//! - [`claims`]: the rules of address claims (target, placeholder MAC, a pool's admission and
//!   quota), shared by the webhook and the claim reconciler.
//! - [`names`] and [`mac`]: the validated identifiers everything is keyed by.
//! - [`pool`]: the one parse of an IPPool spec ([`pool::ValidPool`], whose [`pool::PoolRange`]
//!   the IPAM allocates from and whose [`pool::PoolConfig`] an agent serves), the admission
//!   webhook, the reconciler, the index and an agent's direct read all go through; and to whom a
//!   pool is served ([`pool::Lease`]).
//! - [`ifname`]: stable per-pool interface names.
//! - [`retry`]: the one retry policy (exponential with jitter, from `backon`) and the elector's
//!   jittered period, so that what failed together does not retry together.
//! - [`text`]: strings from others, cut to a bound on a character boundary.
//! - [`bootstrap`]: the agent Deployment's env and Multus annotation.
//! - [`admission`]: the admission webhook's decisions (IPPool defaults, what is refused and why).
//! - `fixtures` (tests only, feature `test-support` for the other crates): the objects and
//!   configs every crate's tests build on.
//! - `layering` (tests only, same feature): the check that each crate's modules import only
//!   the layers below their own, as its `lib.rs` lists them.
#![forbid(unsafe_code)]

pub mod admission;
pub mod bootstrap;
pub mod claims;
pub mod crd;
#[cfg(any(test, feature = "test-support"))]
pub mod fixtures;
pub mod ifname;
#[cfg(any(test, feature = "test-support"))]
pub mod layering;
pub mod mac;
pub mod names;
pub mod pool;
pub mod retry;
pub mod text;

pub use mac::MacAddr;
pub use names::NamespacedName;
