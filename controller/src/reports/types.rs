//! A report as the controller keeps it: who sent it, each interface's state, the hosts acting
//! where they should not, the probe verdicts.

use super::*;

/// Who reported: the agent pod, as Kubernetes knows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentIdentity {
    /// Pod name (the agent's leader-election identity).
    pub pod_name: String,
    /// Pod namespace.
    pub namespace: String,
    /// Node the pod runs on.
    pub node_name: String,
}

/// How one pool's interface fares on one agent (numbered as the wire's `InterfaceState`, the
/// numbers the reports ConfigMap stores).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InterfaceState {
    /// Not reported.
    #[default]
    Unspecified = 0,
    /// Configured and answering DHCP (leader).
    Serving = 1,
    /// Leases loaded, not answering (standby).
    Standby = 2,
    /// Could not be configured or its socket failed; see [`InterfaceReport::error`].
    Error = 3,
}

impl InterfaceState {
    /// The state numbered `n`; `None` for a number no state has.
    pub fn from_number(n: i32) -> Option<Self> {
        match n {
            0 => Some(InterfaceState::Unspecified),
            1 => Some(InterfaceState::Serving),
            2 => Some(InterfaceState::Standby),
            3 => Some(InterfaceState::Error),
            _ => None,
        }
    }
}

/// The state of one pool's interface on one agent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InterfaceReport {
    /// The pool, as `namespace/name`.
    pub pool_ref: String,
    /// The interface serving it.
    pub interface_name: String,
    /// How it fares.
    pub state: InterfaceState,
    /// Why it is in error; empty otherwise.
    pub error: String,
    /// Leases loaded for the pool.
    pub lease_count: u32,
    /// The latest ARP probe verdicts on the pool's addresses.
    pub probes: Vec<AddressProbe>,
    /// Hosts the agent found acting where they should not on the pool's network.
    pub suspects: Vec<NetworkSuspect>,
}

/// What a suspect host was found doing (numbered as the wire's `SuspectKind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SuspectKind {
    /// It answers DHCP on the pool's network: a server that is not the pool's.
    ForeignDhcpServer = 1,
    /// It answers ARP for many addresses that are not its own.
    ProxyArpResponder = 2,
    /// It answers Neighbor Solicitations for many IPv6 addresses that are not its own.
    ProxyNdpResponder = 3,
}

impl SuspectKind {
    /// Every kind, for conditions and metrics that list each.
    pub const ALL: [SuspectKind; 3] = [
        SuspectKind::ForeignDhcpServer,
        SuspectKind::ProxyArpResponder,
        SuspectKind::ProxyNdpResponder,
    ];

    /// The kind numbered `n`; `None` for 0 (not a kind) or a number this controller does not
    /// know (a newer agent's).
    pub fn from_number(n: i32) -> Option<Self> {
        match n {
            1 => Some(SuspectKind::ForeignDhcpServer),
            2 => Some(SuspectKind::ProxyArpResponder),
            3 => Some(SuspectKind::ProxyNdpResponder),
            _ => None,
        }
    }

    /// Stable label for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            SuspectKind::ForeignDhcpServer => "foreign_dhcp_server",
            SuspectKind::ProxyArpResponder => "proxy_arp_responder",
            SuspectKind::ProxyNdpResponder => "proxy_ndp_responder",
        }
    }
}

/// A host an agent found acting where it should not on a pool's network.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkSuspect {
    /// What it was found doing.
    pub kind: SuspectKind,
    /// Its hardware address.
    pub mac: MacAddr,
    /// The address it speaks for (IPv4 or IPv6), when known.
    pub ip: Option<IpAddr>,
    /// What was seen, for people (at most [`MAX_SUSPECT_DETAIL`] bytes).
    pub detail: String,
}

impl NetworkSuspect {
    /// Who it is, whatever it was last seen doing: what a pool's conditions name.
    pub fn identity(&self) -> (SuspectKind, MacAddr, Option<IpAddr>) {
        (self.kind, self.mac, self.ip)
    }
}

/// The longest prefix of `text` of at most `max` bytes that ends on a character boundary.
pub use vmdhcp_core::text::truncate as truncate_detail;

/// Why an agent probed an address (numbered as the wire's `ProbeReason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeReason {
    /// Before its first offer to a client.
    Offer = 1,
    /// A client declined it.
    Decline = 2,
    /// The pool records a conflict on it; probed again to clear it.
    Recheck = 3,
}

impl ProbeReason {
    /// The reason numbered `n`.
    pub fn from_number(n: i32) -> Option<Self> {
        match n {
            1 => Some(ProbeReason::Offer),
            2 => Some(ProbeReason::Decline),
            3 => Some(ProbeReason::Recheck),
            _ => None,
        }
    }

    /// As `status.ipv4.conflicts[].source` says it.
    pub fn as_source(self) -> &'static str {
        match self {
            ProbeReason::Offer => "Probe",
            ProbeReason::Decline => "Decline",
            ProbeReason::Recheck => "Recheck",
        }
    }
}

/// The latest verdict of an agent's probe on one address of a pool: ARP for IPv4, a Neighbor
/// Solicitation for IPv6.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddressProbe {
    /// The address.
    pub ip: IpAddr,
    /// The client it is reserved for, when it has one.
    pub mac: Option<MacAddr>,
    /// Another host that answered for it; `None`: it is free.
    pub answered_by: Option<MacAddr>,
    /// Why it was probed.
    pub reason: ProbeReason,
}

/// The last report of one agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentReport {
    /// The agent's identity.
    pub agent: AgentIdentity,
    /// The epoch it applied from.
    pub epoch: String,
    /// The revision it applied.
    pub applied_revision: u64,
    /// Whether it leads (answers DHCP).
    pub leader: bool,
    /// Per-pool interface states.
    pub interfaces: Vec<InterfaceReport>,
    /// When it arrived (at whichever replica received it).
    pub received_at: SystemTime,
}

impl AgentReport {
    /// The agent as `namespace/pod`, validated (it names a ConfigMap key).
    pub fn key(&self) -> Result<NamespacedName, ReportError> {
        NamespacedName::new(&self.agent.namespace, &self.agent.pod_name).map_err(|source| {
            ReportError::Identity {
                namespace: self.agent.namespace.clone(),
                pod: self.agent.pod_name.clone(),
                source,
            }
        })
    }

    /// Whether `other` tells the replicas that read reports from the ConfigMap nothing new: the
    /// same agent, epoch, leadership and interface entries (interface, state, error, probes),
    /// whenever it arrived and whatever its applied revision and lease counts. Those two move
    /// with every allocation and nothing reads them from the ConfigMap (a pool's status does
    /// not: see [`changed_pools`]); published as they move, they would rewrite the whole
    /// ConfigMap (every agent's entry for every pool) at each agent's report rate while VMs are
    /// being created, so the periodic refresh carries them instead.
    pub(super) fn same_to_publish(&self, other: &AgentReport) -> bool {
        self.agent == other.agent
            && self.epoch == other.epoch
            && self.leader == other.leader
            && entries_by_pool(self) == entries_by_pool(other)
    }
}
