//! Trace links across the API server: which span produced state that another task acts on later.
//!
//! A VM reconcile writes a VirtualMachineNetworkConfig that the config's reconcile reads; an
//! allocation records a lease that an index revision publishes. Neither reader runs inside the
//! writer's span, so the writer records its span here and the reader continues that trace. Owns
//! only the bounded maps; it never decides anything.

use vmdhcp_core::NamespacedName;

/// Which span produced state that another task acts on later, so traces continue across the
/// API server: the VM reconcile that wrote a config (read by the config's reconcile) and the
/// allocation that recorded a lease (read by the index revision that publishes it).
pub struct TraceCauses {
    /// VirtualMachineNetworkConfig → the VM reconcile that created or changed it.
    pub vmnetcfgs: vmdhcp_telemetry::trace::Causes<NamespacedName>,
    /// (pool, MAC) → the allocation that gave the MAC its address.
    pub leases: vmdhcp_telemetry::trace::Causes<(NamespacedName, vmdhcp_core::MacAddr)>,
}

impl Default for TraceCauses {
    fn default() -> Self {
        // Bounded: a burst larger than this only loses the oldest links, never memory.
        TraceCauses {
            vmnetcfgs: vmdhcp_telemetry::trace::Causes::new(10_000),
            leases: vmdhcp_telemetry::trace::Causes::new(10_000),
        }
    }
}
