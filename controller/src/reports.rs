//! What agents report about their interfaces (it feeds the pools' `AgentReady`), and how a
//! report reaches the leader whichever replica received it.
//!
//! An agent reports to the controller replica its connection reached (the chart runs two behind
//! one Service), but only the leader writes pool status. So the receiving replica records the
//! report in memory ([`Reports::record`]) and publishes it to the API ([`publish`]): one key per
//! agent in the ConfigMap `<controller Lease name>-agent-reports` of the controller's namespace,
//! each written with a merge patch of its own key, so replicas never conflict and RBAC names the
//! one object. Every replica follows that ConfigMap ([`follow`]), so the leader sees each report
//! within one watch event of its arrival anywhere.
//!
//! Bounded whatever the callers send: at most [`MAX_AGENTS`] agents and [`MAX_INTERFACES`]
//! interfaces per report, [`MAX_SUSPECTS`] suspect hosts per interface and [`MAX_REPORT_SUSPECTS`]
//! per report (more is refused, each suspect's detail cut to [`MAX_SUSPECT_DETAIL`] bytes on
//! receipt); a report unchanged but for its applied revision and
//! lease counts (which move with every allocation) is written at most once per [`REFRESH`];
//! entries older than [`STALE_AFTER`] are dropped from memory and, by the leader,
//! from the ConfigMap.
//!
//! The types here are the controller's own, not the gRPC messages: the config stream translates
//! an agent's `ReportRequest` into an [`AgentReport`], so the IPPool reconciler reads reports
//! without depending on the stream layer.

use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};
use vmdhcp_core::{MacAddr, NamespacedName};

/// Most agents whose reports are kept (the chart runs 2; a Deployment scaled far beyond this is
/// not a DHCP fleet).
pub const MAX_AGENTS: usize = 64;
/// Most interfaces in one report (one per pool the agent serves).
pub const MAX_INTERFACES: usize = 1024;
/// Most probe verdicts in one interface's entry (the agent keeps at most as many per pool).
pub const MAX_PROBES: usize = 64;
/// Most probe verdicts in one report, all interfaces together: the ConfigMap that carries
/// every agent's report stays far below the API's 1 MiB per object.
pub const MAX_REPORT_PROBES: usize = 256;
/// Most suspect hosts in one interface's entry (the agent keeps at most as many per pool).
pub const MAX_SUSPECTS: usize = 16;
/// Most suspect hosts in one report, all interfaces together (the ConfigMap stays small).
pub const MAX_REPORT_SUSPECTS: usize = 64;
/// Longest suspect detail kept, in bytes; the rest is cut on receipt.
pub const MAX_SUSPECT_DETAIL: usize = 256;
/// An unchanged report is published again after this long, so its age stays below
/// [`STALE_AFTER`] and the `AgentReady` freshness window.
pub const REFRESH: Duration = Duration::from_secs(30);
/// A report older than this is dropped (its agent is gone or moved to another name).
pub const STALE_AFTER: Duration = Duration::from_secs(600);
/// How often stale reports are swept.
const SWEEP: Duration = Duration::from_secs(60);
/// Longest interface error kept, in bytes; the rest is cut on receipt.
pub const MAX_ERROR: usize = 512;
/// Longest interface name (Linux's `IFNAMSIZ` less its terminator); longer is refused.
pub const MAX_INTERFACE_NAME: usize = 15;
/// Longest epoch (the controller's are 16 hex digits); longer is refused.
pub const MAX_EPOCH: usize = 64;
/// Most bytes one agent's entry takes in the reports ConfigMap (its JSON): room for a report of
/// [`MAX_INTERFACES`] pools with the longest names Kubernetes allows and every verdict and
/// suspect the bounds admit (errors are cut to [`SHORT_ERROR`] bytes each when the full ones
/// would not fit). Larger is refused.
pub const MAX_REPORT_BYTES: usize = 640 << 10;
/// Most bytes all entries together take: the ConfigMap stays under the API's 1 MiB per object,
/// whatever the agents send. The Lease holder's report is always admitted, the oldest of the
/// others dropped to make room; another agent's beyond it is refused.
pub const MAX_PUBLISHED_BYTES: usize = 896 << 10;
/// What each interface error is cut to when a report with whole errors would exceed
/// [`MAX_REPORT_BYTES`].
pub const SHORT_ERROR: usize = 64;
/// Reports waiting to be published; more are dropped (the agent reports again within its
/// interval).
const OUTBOX: usize = 256;

/// Why a report was refused or could not be stored.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The agent's namespace or pod name is not a Kubernetes name.
    #[error("agent {namespace:?}/{pod:?}: {source}")]
    Identity {
        /// The namespace sent.
        namespace: String,
        /// The pod name sent.
        pod: String,
        /// What is wrong with them.
        source: vmdhcp_core::names::NameError,
    },
    /// A new agent beyond [`MAX_AGENTS`].
    #[error("reports of {0} agents are kept already; refusing a new one")]
    TooManyAgents(usize),
    /// A string field beyond its bound, or not what it must be.
    #[error("{field} {value:?}: {reason}")]
    Field {
        /// The field.
        field: &'static str,
        /// Its value (cut to 64 bytes here).
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// One report larger than [`MAX_REPORT_BYTES`].
    #[error("the report takes {0} bytes; at most {MAX_REPORT_BYTES}")]
    TooLarge(usize),
    /// The reports of every agent together would exceed [`MAX_PUBLISHED_BYTES`].
    #[error("the reports would take {0} bytes together; at most {MAX_PUBLISHED_BYTES}")]
    Full(usize),
    /// A report with more than [`MAX_INTERFACES`] interfaces.
    #[error("{0} interfaces in one report; at most {MAX_INTERFACES}")]
    TooManyInterfaces(usize),
    /// A report with more than [`MAX_PROBES`] verdicts for one pool or [`MAX_REPORT_PROBES`] in
    /// all.
    #[error(
        "{0} probe verdicts in one report; at most {MAX_PROBES} per pool, {MAX_REPORT_PROBES} in all"
    )]
    TooManyProbes(usize),
    /// A report with more than [`MAX_SUSPECTS`] suspects for one pool or [`MAX_REPORT_SUSPECTS`]
    /// in all.
    #[error(
        "{0} suspect hosts in one report; at most {MAX_SUSPECTS} per pool, {MAX_REPORT_SUSPECTS} in all"
    )]
    TooManySuspects(usize),
    /// An entry of the ConfigMap does not decode.
    #[error("entry {key:?} of the agent reports ConfigMap: {source}")]
    Decode {
        /// The entry's key.
        key: String,
        /// The JSON error.
        source: serde_json::Error,
    },
    /// An API call failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done.
        action: String,
        /// The API error.
        source: kube::Error,
    },
}

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
}

impl SuspectKind {
    /// Every kind, for conditions and metrics that list each.
    pub const ALL: [SuspectKind; 2] = [
        SuspectKind::ForeignDhcpServer,
        SuspectKind::ProxyArpResponder,
    ];

    /// The kind numbered `n`; `None` for 0 (not a kind) or a number this controller does not
    /// know (a newer agent's).
    pub fn from_number(n: i32) -> Option<Self> {
        match n {
            1 => Some(SuspectKind::ForeignDhcpServer),
            2 => Some(SuspectKind::ProxyArpResponder),
            _ => None,
        }
    }

    /// Stable label for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            SuspectKind::ForeignDhcpServer => "foreign_dhcp_server",
            SuspectKind::ProxyArpResponder => "proxy_arp_responder",
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
    /// The address it speaks for, when known.
    pub ip: Option<Ipv4Addr>,
    /// What was seen, for people (at most [`MAX_SUSPECT_DETAIL`] bytes).
    pub detail: String,
}

impl NetworkSuspect {
    /// Who it is, whatever it was last seen doing: what a pool's conditions name.
    pub fn identity(&self) -> (SuspectKind, MacAddr, Option<Ipv4Addr>) {
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
    fn same_to_publish(&self, other: &AgentReport) -> bool {
        self.agent == other.agent
            && self.epoch == other.epoch
            && self.leader == other.leader
            && entries_by_pool(self) == entries_by_pool(other)
    }
}

/// Reports of every agent, by `namespace/pod`; the IPPool reconciler reads them for
/// `AgentReady`.
#[derive(Default)]
pub struct Reports {
    by_agent: Mutex<BTreeMap<NamespacedName, AgentReport>>,
    /// Each entry's size in the ConfigMap, for [`MAX_PUBLISHED_BYTES`].
    sizes: Mutex<BTreeMap<NamespacedName, usize>>,
    /// The agents' election Lease, when followed ([`follow_agent_lease`]): who leads is what
    /// it says, never what a report claims.
    agent_lease: OnceLock<NamespacedName>,
    /// Its holder, as last seen.
    holder: Mutex<Option<String>>,
    /// Pools named by reports whose content changed since the last [`Reports::take_touched`]:
    /// each report re-checks only the pools it names (a set: bounded by the pools named).
    touched: Mutex<BTreeSet<NamespacedName>>,
    changed: watch::Sender<u64>,
    streams: Arc<AtomicUsize>,
    outbox: OnceLock<mpsc::Sender<AgentReport>>,
}

/// Counts one open Watch stream for as long as it lives.
pub struct OpenStream(Arc<AtomicUsize>);

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Reports {
    /// The latest report of every agent, keyed `namespace/pod`. While the agents' Lease is
    /// followed, a report's `leader` is whether its agent holds that Lease now: a report's own
    /// claim would let any agent pod set `AgentReady` or record conflicts.
    pub fn all(&self) -> BTreeMap<String, AgentReport> {
        let holder = self.agent_lease.get().map(|lease| {
            let holder = self.holder.lock().clone();
            (lease.namespace.clone(), holder)
        });
        self.lock()
            .iter()
            .map(|(k, r)| {
                let mut r = r.clone();
                if let Some((namespace, holder)) = &holder {
                    r.leader = r.agent.namespace == *namespace
                        && holder.as_deref() == Some(r.agent.pod_name.as_str());
                }
                (k.to_string(), r)
            })
            .collect()
    }

    /// Follows `lease` for leadership from now on (set once; see [`Reports::all`]).
    pub fn lead_by(&self, lease: NamespacedName) {
        let _ = self.agent_lease.set(lease);
    }

    /// Records the agents' Lease holder; on a change, every pool a report names is re-checked.
    pub fn set_holder(&self, holder: Option<String>) {
        let mut held = self.holder.lock();
        if *held == holder {
            return;
        }
        info!(?holder, "agent Lease holder");
        *held = holder;
        drop(held);
        let named: Vec<NamespacedName> = self.lock().values().flat_map(pools_named).collect();
        self.touch(named);
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, BTreeMap<NamespacedName, AgentReport>> {
        // Plain values replaced whole: a panic elsewhere cannot leave one torn.
        self.by_agent.lock()
    }

    /// Watch streams open right now (agents connected to this replica).
    pub fn open_streams(&self) -> usize {
        self.streams.load(Ordering::Relaxed)
    }

    /// Counts a Watch stream until the returned guard drops.
    pub fn stream_opened(&self) -> OpenStream {
        self.streams.fetch_add(1, Ordering::Relaxed);
        OpenStream(self.streams.clone())
    }

    /// A receiver that wakes whenever the reports change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Records a report an agent sent to this replica, and hands it to the publisher (if one
    /// runs) so that the leader sees it too.
    pub fn record(&self, mut report: AgentReport) -> Result<(), ReportError> {
        bound_fields(&mut report)?;
        if report.interfaces.len() > MAX_INTERFACES {
            return Err(ReportError::TooManyInterfaces(report.interfaces.len()));
        }
        let probes: usize = report.interfaces.iter().map(|i| i.probes.len()).sum();
        if probes > MAX_REPORT_PROBES
            || report
                .interfaces
                .iter()
                .any(|i| i.probes.len() > MAX_PROBES)
        {
            return Err(ReportError::TooManyProbes(probes));
        }
        let suspects: usize = report.interfaces.iter().map(|i| i.suspects.len()).sum();
        if suspects > MAX_REPORT_SUSPECTS
            || report
                .interfaces
                .iter()
                .any(|i| i.suspects.len() > MAX_SUSPECTS)
        {
            return Err(ReportError::TooManySuspects(suspects));
        }
        let key = report.key()?;
        self.insert(key, report.clone())?;
        if let Some(outbox) = self.outbox.get()
            && outbox.try_send(report).is_err()
        {
            warn!("agent report not published: the publisher is behind (the agent reports again)");
        }
        Ok(())
    }

    /// Records a report read from the API (published by any replica); older than what is held:
    /// ignored.
    pub fn observe(&self, report: AgentReport) -> Result<(), ReportError> {
        let key = report.key()?;
        self.insert(key, report)
    }

    fn insert(&self, key: NamespacedName, mut report: AgentReport) -> Result<(), ReportError> {
        let mut size = encode(&report).len();
        if size > MAX_REPORT_BYTES {
            // Diagnostics give way first: a report of every pool the agent may serve fits.
            for i in &mut report.interfaces {
                i.error = vmdhcp_core::text::truncate(&i.error, SHORT_ERROR).to_owned();
            }
            size = encode(&report).len();
        }
        if size > MAX_REPORT_BYTES {
            return Err(ReportError::TooLarge(size));
        }
        // Who holds the Lease, read once: every candidate for eviction is asked about it.
        let holder_name = self.agent_lease.get().and_then(|lease| {
            let name = self.holder.lock().clone()?;
            Some((lease.namespace.clone(), name))
        });
        let is_holder = |k: &NamespacedName| {
            holder_name
                .as_ref()
                .is_some_and(|(ns, name)| k.namespace == *ns && k.name == *name)
        };
        let holder = is_holder(&key);
        let mut all = self.lock();
        let mut sizes = self.sizes.lock();
        if all
            .get(&key)
            .is_some_and(|held| held.received_at >= report.received_at)
        {
            return Ok(());
        }
        // Room is made by dropping the oldest reports of other agents that do not hold the
        // Lease (pods of a rollout gone, say), for the holder's always and for another's only
        // when newer than them: reports from old pods never crowd out the serving agent's.
        let fits = |all: &BTreeMap<NamespacedName, AgentReport>,
                    sizes: &BTreeMap<NamespacedName, usize>| {
            let others: usize = sizes
                .iter()
                .filter(|(k, _)| **k != key)
                .map(|(_, n)| n)
                .sum();
            let agents = all.len() + usize::from(!all.contains_key(&key));
            (
                others + size <= MAX_PUBLISHED_BYTES && agents <= MAX_AGENTS,
                others + size,
            )
        };
        let mut touched = Vec::new();
        let mut evicted = Vec::new();
        loop {
            let (ok, total) = fits(&all, &sizes);
            if ok {
                break;
            }
            let oldest = all
                .iter()
                .filter(|(k, _)| **k != key && !is_holder(k))
                .min_by_key(|(_, r)| r.received_at)
                .map(|(k, r)| (k.clone(), r.received_at));
            match oldest {
                Some((victim, at)) if holder || at < report.received_at => {
                    if let Some(gone) = all.remove(&victim) {
                        touched.extend(pools_named(&gone));
                    }
                    sizes.remove(&victim);
                    evicted.push(victim);
                }
                _ if !all.contains_key(&key) && all.len() >= MAX_AGENTS => {
                    return Err(ReportError::TooManyAgents(all.len()));
                }
                _ => return Err(ReportError::Full(total)),
            }
        }
        touched.extend(match all.get(&key) {
            Some(held) => changed_pools(held, &report),
            None => pools_named(&report).collect(),
        });
        sizes.insert(key.clone(), size);
        all.insert(key, report);
        drop(sizes);
        drop(all);
        if !evicted.is_empty() {
            info!(?evicted, "older agents' reports dropped to make room");
        }
        self.touch(touched);
        Ok(())
    }

    /// Has `AgentReady` of `pools` re-checked, for what the reports do not show: the agent
    /// Deployment gone or back.
    pub fn recheck(&self, pools: Vec<NamespacedName>) {
        self.touch(pools);
    }

    fn touch(&self, pools: Vec<NamespacedName>) {
        if !pools.is_empty() {
            self.touched.lock().extend(pools);
        }
        self.changed.send_modify(|n| *n += 1);
    }

    /// The pools whose reports changed since the last call (each once), for their
    /// `AgentReady` to be re-checked.
    pub fn take_touched(&self) -> Vec<NamespacedName> {
        std::mem::take(&mut *self.touched.lock())
            .into_iter()
            .collect()
    }

    /// Drops reports older than [`STALE_AFTER`] at `now`; returns how many.
    pub fn retain_fresh(&self, now: SystemTime) -> usize {
        let mut all = self.lock();
        let (mut dropped, mut touched) = (0, Vec::new());
        all.retain(|_, r| {
            let stale = is_stale(r.received_at, now);
            if stale {
                dropped += 1;
                touched.extend(pools_named(r));
            }
            !stale
        });
        self.sizes.lock().retain(|k, _| all.contains_key(k));
        drop(all);
        if dropped > 0 {
            self.touch(touched);
        }
        dropped
    }

    /// Sends every report [`Reports::record`]s from now on to `outbox` (set once).
    fn attach_outbox(&self, outbox: mpsc::Sender<AgentReport>) {
        let _ = self.outbox.set(outbox);
    }
}

/// The pools whose `AgentReady` (or conflicts, or suspect conditions) a newer report of the same
/// agent may change: every pool either names when what concerns them all changed (leadership,
/// epoch), otherwise only those whose interface entry was added, removed or changed in what a
/// pool's status reads (interface, state, error, probes, which suspects). The applied revision and lease counts touch none: they
/// change with every allocation, and re-checking every pool an agent serves on each report
/// would make one allocation cost a reconcile of every pool (docs/tuning.md).
fn changed_pools(held: &AgentReport, new: &AgentReport) -> Vec<NamespacedName> {
    if held.leader != new.leader || held.epoch != new.epoch {
        return pools_named(held).chain(pools_named(new)).collect();
    }
    let (before, after) = (entries_by_pool(held), entries_by_pool(new));
    before
        .keys()
        .chain(after.keys())
        .filter(|p| before.get(*p) != after.get(*p))
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// What a pool's status reads of one interface entry: interface, state, error, probes, and who
/// the suspects are (not their details: a busy rogue server's latest deed is no news).
type Entry<'a> = (
    &'a str,
    InterfaceState,
    &'a str,
    &'a [AddressProbe],
    Vec<(SuspectKind, MacAddr, Option<Ipv4Addr>)>,
);

/// A report's interface entries by the pool they name.
fn entries_by_pool(report: &AgentReport) -> BTreeMap<&str, Vec<Entry<'_>>> {
    let mut pools: BTreeMap<&str, Vec<Entry<'_>>> = BTreeMap::new();
    for i in &report.interfaces {
        pools.entry(i.pool_ref.as_str()).or_default().push((
            i.interface_name.as_str(),
            i.state,
            i.error.as_str(),
            &i.probes,
            i.suspects.iter().map(NetworkSuspect::identity).collect(),
        ));
    }
    pools
}

/// The pools a report names (entries that do not parse name none: they were refused on receipt).
fn pools_named(report: &AgentReport) -> impl Iterator<Item = NamespacedName> + '_ {
    report
        .interfaces
        .iter()
        .filter_map(|i| i.pool_ref.parse().ok())
}

fn is_stale(at: SystemTime, now: SystemTime) -> bool {
    now.duration_since(at).is_ok_and(|age| age > STALE_AFTER)
}

/// One report as stored in the ConfigMap (short keys: one entry per agent, one line per pool).
#[derive(Serialize, Deserialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Stored {
    pod: String,
    namespace: String,
    #[serde(default)]
    node: String,
    #[serde(default)]
    epoch: String,
    #[serde(default)]
    revision: u64,
    #[serde(default)]
    leader: bool,
    /// Milliseconds since the Unix epoch.
    received_ms: u64,
    #[serde(default)]
    interfaces: Vec<StoredInterface>,
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
struct StoredInterface {
    pool: String,
    name: String,
    state: i32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    error: String,
    #[serde(default)]
    leases: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    probes: Vec<StoredProbe>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    suspects: Vec<StoredSuspect>,
}

/// One suspect as stored: an empty string for no address or detail.
#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct StoredSuspect {
    kind: i32,
    mac: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    ip: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    detail: String,
}

impl StoredSuspect {
    fn of(s: &NetworkSuspect) -> Self {
        StoredSuspect {
            kind: s.kind as i32,
            mac: s.mac.to_string(),
            ip: s.ip.map(|ip| ip.to_string()).unwrap_or_default(),
            detail: s.detail.clone(),
        }
    }

    /// Back into a suspect; `None` for one this controller cannot read (a newer replica's).
    fn read(&self) -> Option<NetworkSuspect> {
        Some(NetworkSuspect {
            kind: SuspectKind::from_number(self.kind)?,
            mac: self.mac.parse().ok()?,
            ip: match self.ip.as_str() {
                "" => None,
                ip => Some(ip.parse().ok()?),
            },
            detail: truncate_detail(&self.detail, MAX_SUSPECT_DETAIL).to_owned(),
        })
    }
}

/// One probe verdict as stored: empty strings for no MAC.
#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct StoredProbe {
    ip: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    mac: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    by: String,
    reason: i32,
}

impl StoredProbe {
    fn of(p: &AddressProbe) -> Self {
        StoredProbe {
            ip: p.ip.to_string(),
            mac: MacAddr::text_or_empty(p.mac),
            by: MacAddr::text_or_empty(p.answered_by),
            reason: p.reason as i32,
        }
    }

    /// Back into a verdict; `None` for one this controller cannot read (it was checked on
    /// receipt, so only a newer replica's could be).
    fn read(&self) -> Option<AddressProbe> {
        Some(AddressProbe {
            ip: self.ip.parse().ok()?,
            mac: MacAddr::parse_or_empty(&self.mac).ok()?,
            answered_by: MacAddr::parse_or_empty(&self.by).ok()?,
            reason: ProbeReason::from_number(self.reason)?,
        })
    }
}

/// The ConfigMap key of an agent: `namespace.pod` (a namespace has no dots, so it splits back).
fn data_key(agent: &NamespacedName) -> String {
    format!("{}.{}", agent.namespace, agent.name)
}

/// A report as the ConfigMap value stored under its agent's key.
fn encode(report: &AgentReport) -> String {
    let millis = report
        .received_at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let stored = Stored {
        pod: report.agent.pod_name.clone(),
        namespace: report.agent.namespace.clone(),
        node: report.agent.node_name.clone(),
        epoch: report.epoch.clone(),
        revision: report.applied_revision,
        leader: report.leader,
        received_ms: millis,
        interfaces: report
            .interfaces
            .iter()
            .map(|i| StoredInterface {
                pool: i.pool_ref.clone(),
                name: i.interface_name.clone(),
                state: i.state as i32,
                error: i.error.clone(),
                leases: i.lease_count,
                probes: i.probes.iter().map(StoredProbe::of).collect(),
                suspects: i.suspects.iter().map(StoredSuspect::of).collect(),
            })
            .collect(),
    };
    // Strings, numbers and booleans only: serialisation cannot fail; "{}" would decode as an
    // error on the reading side rather than as a wrong report.
    serde_json::to_string(&stored).unwrap_or_else(|_| "{}".to_owned())
}

/// A ConfigMap value back into a report.
fn decode(key: &str, value: &str) -> Result<AgentReport, ReportError> {
    let stored: Stored = serde_json::from_str(value).map_err(|source| ReportError::Decode {
        key: key.to_owned(),
        source,
    })?;
    Ok(AgentReport {
        agent: AgentIdentity {
            pod_name: stored.pod,
            namespace: stored.namespace,
            node_name: stored.node,
        },
        epoch: stored.epoch,
        applied_revision: stored.revision,
        leader: stored.leader,
        interfaces: stored
            .interfaces
            .into_iter()
            .map(|i| InterfaceReport {
                pool_ref: i.pool,
                interface_name: i.name,
                // A number this controller does not know (a newer replica wrote it) counts as
                // not reported.
                state: InterfaceState::from_number(i.state).unwrap_or_default(),
                error: i.error,
                lease_count: i.leases,
                probes: i.probes.iter().filter_map(StoredProbe::read).collect(),
                suspects: i.suspects.iter().filter_map(StoredSuspect::read).collect(),
            })
            .collect(),
        received_at: UNIX_EPOCH + Duration::from_millis(stored.received_ms),
    })
}

/// Holds a report's strings to their bounds: an error is cut to [`MAX_ERROR`] bytes; an
/// interface name beyond [`MAX_INTERFACE_NAME`], an epoch beyond [`MAX_EPOCH`], a node name or
/// pool reference that is not a Kubernetes name is refused (none of these can be cut without
/// changing what it names).
fn bound_fields(report: &mut AgentReport) -> Result<(), ReportError> {
    let refuse = |field: &'static str, value: &str, reason: String| ReportError::Field {
        field,
        value: vmdhcp_core::text::truncate(value, 64).to_owned(),
        reason,
    };
    if report.epoch.len() > MAX_EPOCH {
        return Err(refuse(
            "epoch",
            &report.epoch,
            format!("longer than {MAX_EPOCH} bytes"),
        ));
    }
    let node = &report.agent.node_name;
    if !node.is_empty() && !vmdhcp_core::names::is_subdomain(node) {
        return Err(refuse(
            "agent.node_name",
            node,
            "is not a Kubernetes node name".to_owned(),
        ));
    }
    for i in &mut report.interfaces {
        if i.interface_name.len() > MAX_INTERFACE_NAME {
            return Err(refuse(
                "interfaces.interface_name",
                &i.interface_name,
                format!("longer than {MAX_INTERFACE_NAME} bytes"),
            ));
        }
        i.pool_ref
            .parse::<NamespacedName>()
            .map_err(|e| refuse("interfaces.pool_ref", &i.pool_ref, e.to_string()))?;
        if i.error.len() > MAX_ERROR {
            i.error = vmdhcp_core::text::truncate(&i.error, MAX_ERROR).to_owned();
        }
    }
    Ok(())
}

/// Follows the agents' election Lease `lease` into `reports` ([`Reports::lead_by`]) until
/// `stop`: who holds it is who leads, whatever reports claim. Until the first read, nobody
/// leads (no `AgentReady`, no conflicts recorded) rather than anyone who says so.
pub async fn follow_agent_lease(
    client: kube::Client,
    lease: NamespacedName,
    reports: Arc<Reports>,
    mut stop: watch::Receiver<bool>,
) {
    use k8s_openapi::api::coordination::v1::Lease;
    reports.lead_by(lease.clone());
    let api: Api<Lease> = Api::namespaced(client, &lease.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={}", lease.name));
    let mut events = std::pin::pin!(watcher(api, config).default_backoff());
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(watcher::Event::Apply(l) | watcher::Event::InitApply(l))) => {
                    reports.set_holder(l.spec.and_then(|s| s.holder_identity).filter(|h| !h.is_empty()));
                }
                Some(Ok(watcher::Event::Delete(_))) => reports.set_holder(None),
                Some(Ok(_)) => {}
                Some(Err(error)) => warn!(%error, %lease, "agent Lease watch failed; retrying"),
                None => return,
            },
            () = stop_requested(&mut stop) => return,
        }
    }
}

/// Where reports are published: the ConfigMap `name` in `namespace`.
#[derive(Clone, Debug)]
pub struct ReportsObject {
    /// The controller's namespace.
    pub namespace: String,
    /// `<controller Lease name>-agent-reports`.
    pub name: String,
}

impl ReportsObject {
    /// The object next to the controllers' Lease `lease` in `namespace`.
    pub fn beside_lease(namespace: &str, lease: &str) -> Self {
        ReportsObject {
            namespace: namespace.to_owned(),
            name: format!("{lease}-agent-reports"),
        }
    }
}

/// Field manager of the reports ConfigMap.
const FIELD_MANAGER: &str = "vm-dhcp-controller-reports";

/// Writes one agent's entry (creating the ConfigMap the first time).
async fn put(
    api: &Api<ConfigMap>,
    object: &ReportsObject,
    key: &str,
    value: Option<String>,
) -> Result<(), ReportError> {
    let kube_err = |action: &str| {
        let action = format!(
            "{action} {key} in ConfigMap {}/{}",
            object.namespace, object.name
        );
        move |source| ReportError::Kube { action, source }
    };
    let patch = serde_json::json!({"data": {key: value}});
    match api
        .patch(&object.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => return Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() && value.is_some() => {}
        Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(()),
        Err(e) => return Err(kube_err("writing")(e)),
    }
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(object.name.clone()),
            namespace: Some(object.namespace.clone()),
            labels: Some(
                [(
                    "app.kubernetes.io/managed-by".to_owned(),
                    "vm-dhcp-controller".to_owned(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        data: value.map(|v| [(key.to_owned(), v)].into()),
        ..Default::default()
    };
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..Default::default()
    };
    match api.create(&params, &cm).await {
        Ok(_) => Ok(()),
        // Another replica created it in between: our key goes in by patch after all.
        Err(kube::Error::Api(s)) if s.is_already_exists() => api
            .patch(&object.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(kube_err("writing")),
        Err(e) => Err(kube_err("creating")(e)),
    }
}

/// Publishes the reports this replica receives until `stop`: a changed report at once, one
/// that is the same to publish ([`AgentReport::same_to_publish`]) at most every [`REFRESH`].
pub async fn publish(
    client: kube::Client,
    object: ReportsObject,
    reports: Arc<Reports>,
    mut stop: watch::Receiver<bool>,
) {
    let api: Api<ConfigMap> = Api::namespaced(client, &object.namespace);
    let (tx, mut rx) = mpsc::channel(OUTBOX);
    reports.attach_outbox(tx);
    let mut written: HashMap<NamespacedName, (AgentReport, tokio::time::Instant)> = HashMap::new();
    loop {
        let report = tokio::select! {
            r = rx.recv() => match r { Some(r) => r, None => return },
            () = stop_requested(&mut stop) => return,
        };
        let Ok(agent) = report.key() else { continue };
        let (news, due) = match written.get(&agent) {
            None => (true, true),
            Some((last, at)) => {
                let news = !last.same_to_publish(&report);
                (news, news || at.elapsed() >= REFRESH)
            }
        };
        if !due {
            continue;
        }
        match put(&api, &object, &data_key(&agent), Some(encode(&report))).await {
            Ok(()) => {
                if news {
                    let serving = report
                        .interfaces
                        .iter()
                        .filter(|i| i.state == InterfaceState::Serving)
                        .count();
                    info!(%agent, leader = report.leader, epoch = %report.epoch, interfaces = report.interfaces.len(), serving, "agent report changed; published");
                } else {
                    debug!(%agent, "agent report refreshed");
                }
                written.insert(agent, (report, tokio::time::Instant::now()));
            }
            Err(error) => warn!(%error, "agent report not published; the agent reports again"),
        }
        written.retain(|_, (_, at)| at.elapsed() < STALE_AFTER);
    }
}

/// Feeds `reports` from the ConfigMap until `stop`; while this replica leads, also deletes
/// entries older than [`STALE_AFTER`].
pub async fn follow(
    client: kube::Client,
    object: ReportsObject,
    reports: Arc<Reports>,
    leader: watch::Receiver<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let api: Api<ConfigMap> = Api::namespaced(client, &object.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={}", object.name));
    let mut events = std::pin::pin!(watcher(api.clone(), config).default_backoff());
    let mut sweep = tokio::time::interval(SWEEP);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // When each entry of the ConfigMap was received, as last seen.
    let mut entries: BTreeMap<String, SystemTime> = BTreeMap::new();
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm))) => {
                    entries = absorb(&cm, &reports);
                }
                Some(Ok(_)) => {}
                Some(Err(error)) => warn!(%error, "agent reports watch failed; retrying"),
                None => return,
            },
            _ = sweep.tick() => {
                let now = SystemTime::now();
                let dropped = reports.retain_fresh(now);
                if dropped > 0 {
                    info!(dropped, "stale agent reports dropped");
                }
                let leading = *leader.borrow();
                if leading {
                    for (key, _) in entries.iter().filter(|(_, at)| is_stale(**at, now)) {
                        match put(&api, &object, key, None).await {
                            Ok(()) => info!(entry = %key, "stale agent report removed"),
                            Err(error) => warn!(%error, "stale agent report not removed"),
                        }
                    }
                }
            }
            () = stop_requested(&mut stop) => return,
        }
    }
}

/// Resolves once `stop` turns true or its sender is gone (holds no borrow of the channel).
async fn stop_requested(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Records every entry of the ConfigMap; returns when each was received. An entry that does
/// not decode is skipped with a warning (the others still count).
fn absorb(cm: &ConfigMap, reports: &Reports) -> BTreeMap<String, SystemTime> {
    let mut seen = BTreeMap::new();
    for (key, value) in cm.data.iter().flatten() {
        let report = match decode(key, value) {
            Ok(r) => r,
            Err(error) => {
                warn!(%error, "agent report skipped");
                continue;
            }
        };
        seen.insert(key.clone(), report.received_at);
        if let Err(error) = reports.observe(report) {
            warn!(%error, "agent report from the API not kept");
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(pod: &str, at_secs: u64, state: InterfaceState) -> AgentReport {
        AgentReport {
            agent: AgentIdentity {
                pod_name: pod.into(),
                namespace: "vmdhcp-system".into(),
                node_name: "node-1".into(),
            },
            epoch: "e1".into(),
            applied_revision: 7,
            leader: true,
            interfaces: vec![InterfaceReport {
                pool_ref: "default/pool-a".into(),
                interface_name: "vmd0123456789".into(),
                state,
                error: String::new(),
                lease_count: 3,
                probes: vec![AddressProbe {
                    ip: Ipv4Addr::new(10, 0, 0, 9).into(),
                    mac: None,
                    answered_by: "02:00:00:00:00:09".parse().ok(),
                    reason: ProbeReason::Recheck,
                }],
                suspects: vec![NetworkSuspect {
                    kind: SuspectKind::ForeignDhcpServer,
                    mac: "02:00:00:00:0e:0e".parse().unwrap(),
                    ip: Some(Ipv4Addr::new(10, 0, 0, 7)),
                    detail: "offered 10.0.0.50 to 02:00:00:00:01:0a".into(),
                }],
            }],
            received_at: UNIX_EPOCH + Duration::from_secs(at_secs),
        }
    }

    #[test]
    fn a_stored_report_decodes_to_the_same_report() {
        let r = report("agent-0", 1_700_000_000, InterfaceState::Serving);
        let key = data_key(&r.key().unwrap());
        assert_eq!(key, "vmdhcp-system.agent-0");
        assert_eq!(decode(&key, &encode(&r)).unwrap(), r);
        let err = decode(&key, "{not json").unwrap_err();
        assert!(err.to_string().contains("vmdhcp-system.agent-0"), "{err}");
    }

    #[test]
    fn suspects_are_stored_bounded_and_read_back_leniently() {
        let mut r = report("agent-0", 1_700_000_000, InterfaceState::Serving);
        r.interfaces[0].suspects[0].ip = None;
        let key = data_key(&r.key().unwrap());
        assert_eq!(decode(&key, &encode(&r)).unwrap(), r);
        // A kind or MAC this controller cannot read (a newer replica wrote it) is skipped, the
        // rest kept; a long detail is cut.
        let stored = format!(
            r#"{{"pod":"agent-0","namespace":"vmdhcp-system","receivedMs":1,"interfaces":[{{"pool":"default/pool-a","name":"vmd1","state":1,"suspects":[{{"kind":9,"mac":"02:00:00:00:0e:0e"}},{{"kind":1,"mac":"bad"}},{{"kind":2,"mac":"02:00:00:00:0e:0f","detail":"{}"}}]}}]}}"#,
            "x".repeat(1000)
        );
        let read = decode(&key, &stored).unwrap();
        let suspects = &read.interfaces[0].suspects;
        assert_eq!(suspects.len(), 1);
        assert_eq!(suspects[0].kind, SuspectKind::ProxyArpResponder);
        assert_eq!(suspects[0].detail.len(), MAX_SUSPECT_DETAIL);

        let reports = Reports::default();
        let mut many = report("agent-1", 100, InterfaceState::Serving);
        many.interfaces[0].suspects =
            vec![many.interfaces[0].suspects[0].clone(); MAX_SUSPECTS + 1];
        assert!(matches!(
            reports.record(many.clone()),
            Err(ReportError::TooManySuspects(_))
        ));
        many.interfaces[0].suspects.truncate(MAX_SUSPECTS);
        reports.record(many.clone()).unwrap();
        many.interfaces = vec![many.interfaces[0].clone(); MAX_REPORT_SUSPECTS / MAX_SUSPECTS + 1];
        assert!(matches!(
            reports.record(many),
            Err(ReportError::TooManySuspects(_))
        ));
    }

    #[test]
    fn newer_reports_win_from_either_path_and_stale_ones_go() {
        let reports = Reports::default();
        let mut changes = reports.subscribe();
        reports
            .record(report("agent-0", 100, InterfaceState::Standby))
            .unwrap();
        assert!(changes.has_changed().unwrap());
        changes.borrow_and_update();
        // An older copy read back from the API changes nothing.
        reports
            .observe(report("agent-0", 90, InterfaceState::Serving))
            .unwrap();
        assert!(!changes.has_changed().unwrap());
        // A newer one received by another replica replaces it.
        reports
            .observe(report("agent-0", 110, InterfaceState::Serving))
            .unwrap();
        let all = reports.all();
        assert_eq!(
            all["vmdhcp-system/agent-0"].interfaces[0].state,
            InterfaceState::Serving
        );
        let now = UNIX_EPOCH + Duration::from_secs(110) + STALE_AFTER;
        assert_eq!(reports.retain_fresh(now), 0);
        assert_eq!(reports.retain_fresh(now + Duration::from_secs(1)), 1);
        assert!(reports.all().is_empty());
    }

    #[test]
    fn callers_cannot_grow_the_reports_without_bound() {
        let reports = Reports::default();
        for i in 0..MAX_AGENTS {
            reports
                .record(report(&format!("agent-{i}"), 100, InterfaceState::Serving))
                .unwrap();
        }
        let refused = reports.record(report("one-more", 100, InterfaceState::Serving));
        assert!(
            matches!(refused, Err(ReportError::TooManyAgents(n)) if n == MAX_AGENTS),
            "{refused:?}"
        );
        // Known agents still report.
        reports
            .record(report("agent-0", 101, InterfaceState::Serving))
            .unwrap();
        let mut huge = report("agent-1", 102, InterfaceState::Serving);
        huge.interfaces = vec![huge.interfaces[0].clone(); MAX_INTERFACES + 1];
        assert!(matches!(
            reports.record(huge),
            Err(ReportError::TooManyInterfaces(_))
        ));
        let mut bad = report("Not_A_Pod", 100, InterfaceState::Serving);
        bad.agent.namespace = "a.b".into();
        let err = reports.record(bad).unwrap_err();
        assert!(err.to_string().contains("Not_A_Pod"), "{err}");
        assert_eq!(reports.all().len(), MAX_AGENTS);
    }

    #[test]
    fn only_what_a_pool_reads_makes_a_report_worth_publishing_at_once() {
        let a = report("agent-0", 100, InterfaceState::Serving);
        // Later, having applied more revisions and loaded more leases: the same to publish.
        let mut b = report("agent-0", 200, InterfaceState::Serving);
        b.applied_revision += 40;
        b.interfaces[0].lease_count += 40;
        assert!(a.same_to_publish(&b));
        // Anything a pool's status reads, or who reports, is news.
        // Nor is a suspect's latest deed.
        let mut busy = b.clone();
        busy.interfaces[0].suspects[0].detail = "offered 10.0.0.51 to 02:00:00:00:01:0b".into();
        assert!(a.same_to_publish(&busy));
        let changed: [fn(&mut AgentReport); 11] = [
            |r| r.interfaces[0].state = InterfaceState::Error,
            |r| r.interfaces[0].error = "socket failed".into(),
            |r| r.interfaces[0].probes.clear(),
            |r| r.interfaces[0].suspects.clear(),
            |r| r.interfaces[0].suspects[0].ip = None,
            |r| r.interfaces[0].suspects[0].kind = SuspectKind::ProxyArpResponder,
            |r| r.interfaces[0].interface_name = "vmd9876543210".into(),
            |r| r.interfaces.push(r.interfaces[0].clone()),
            |r| r.leader = false,
            |r| r.epoch = "e2".into(),
            |r| r.agent.node_name = "node-2".into(),
        ];
        for change in changed {
            let mut c = b.clone();
            change(&mut c);
            assert!(!a.same_to_publish(&c), "{c:?}");
        }
    }

    #[test]
    fn a_report_re_checks_only_the_pools_it_names_and_only_when_it_changed() {
        let reports = Reports::default();
        let pool = |n: &str| NamespacedName::new("default", n).unwrap();
        reports
            .record(report("agent-0", 100, InterfaceState::Standby))
            .unwrap();
        assert_eq!(reports.take_touched(), [pool("pool-a")]);
        assert!(reports.take_touched().is_empty(), "drained");
        // The same content again (a refresh): nothing to re-check.
        reports
            .record(report("agent-0", 130, InterfaceState::Standby))
            .unwrap();
        assert!(reports.take_touched().is_empty());
        // It moves to another pool: the one it left and the one it serves.
        let mut moved = report("agent-0", 160, InterfaceState::Serving);
        moved.interfaces[0].pool_ref = "default/pool-b".into();
        reports.record(moved).unwrap();
        assert_eq!(reports.take_touched(), [pool("pool-a"), pool("pool-b")]);
        // Another agent's report names only its own pools.
        let mut other = report("agent-1", 170, InterfaceState::Serving);
        other.interfaces[0].pool_ref = "default/pool-c".into();
        reports.record(other).unwrap();
        assert_eq!(reports.take_touched(), [pool("pool-c")]);
        // A new revision and lease count alone re-check nothing; a pool whose entry changed is
        // re-checked alone; a change of leadership re-checks every pool named.
        let mut two = report("agent-1", 180, InterfaceState::Serving);
        two.interfaces[0].pool_ref = "default/pool-c".into();
        let mut d = two.interfaces[0].clone();
        d.pool_ref = "default/pool-d".into();
        two.interfaces.push(d);
        reports.record(two.clone()).unwrap();
        assert_eq!(reports.take_touched(), [pool("pool-d")]);
        two.received_at += Duration::from_secs(1);
        two.applied_revision += 1;
        two.interfaces[0].lease_count += 1;
        reports.record(two.clone()).unwrap();
        assert!(
            reports.take_touched().is_empty(),
            "revision and lease count"
        );
        two.received_at += Duration::from_secs(1);
        two.interfaces[1].state = InterfaceState::Error;
        reports.record(two.clone()).unwrap();
        assert_eq!(reports.take_touched(), [pool("pool-d")]);
        two.received_at += Duration::from_secs(1);
        two.leader = false;
        reports.record(two).unwrap();
        assert_eq!(reports.take_touched(), [pool("pool-c"), pool("pool-d")]);
        // A report going stale re-checks its pools (AgentReady turns False).
        let later = UNIX_EPOCH + Duration::from_secs(165) + STALE_AFTER;
        assert_eq!(
            reports.retain_fresh(later),
            1,
            "agent-1's reports are fresh"
        );
        assert_eq!(reports.take_touched(), [pool("pool-b")]);
    }

    /// While the agents' Lease is followed, leadership is its holder's, whatever reports claim:
    /// a standby (or any agent pod) saying it leads counts for nothing.
    #[test]
    fn leadership_is_the_lease_holders_not_the_reports_claim() {
        let reports = Reports::default();
        reports
            .record(report("agent-0", 10, InterfaceState::Serving))
            .unwrap();
        reports
            .record(report("agent-1", 11, InterfaceState::Serving))
            .unwrap();
        let leaders = |r: &Reports| -> Vec<String> {
            r.all()
                .into_iter()
                .filter(|(_, r)| r.leader)
                .map(|(k, _)| k)
                .collect()
        };
        assert_eq!(leaders(&reports).len(), 2, "not followed: as claimed");
        reports.lead_by("vmdhcp-system/vm-dhcp-agents".parse().unwrap());
        assert!(leaders(&reports).is_empty(), "no holder seen yet: nobody");
        reports.take_touched();
        reports.set_holder(Some("agent-1".into()));
        assert_eq!(leaders(&reports), vec!["vmdhcp-system/agent-1".to_owned()]);
        assert_eq!(
            reports.take_touched(),
            vec!["default/pool-a".parse().unwrap()]
        );
        // An agent of the same name in another namespace does not lead.
        let mut elsewhere = report("agent-1", 12, InterfaceState::Serving);
        elsewhere.agent.namespace = "tenant".into();
        reports.record(elsewhere).unwrap();
        assert_eq!(leaders(&reports), vec!["vmdhcp-system/agent-1".to_owned()]);
    }

    /// Every string a report carries is bounded, and so are the published bytes: a report
    /// filled to each limit is refused or cut, never stored whole.
    #[test]
    fn report_strings_and_the_published_bytes_are_bounded() {
        let reports = Reports::default();
        let mut long_error = report("agent-0", 10, InterfaceState::Error);
        long_error.interfaces[0].error = "e".repeat(100_000);
        reports.record(long_error).unwrap();
        let kept = &reports.all()["vmdhcp-system/agent-0"];
        assert_eq!(kept.interfaces[0].error.len(), MAX_ERROR);

        let refused = |edit: fn(&mut AgentReport)| {
            let mut r = report("agent-1", 20, InterfaceState::Serving);
            edit(&mut r);
            match Reports::default().record(r) {
                Err(ReportError::Field { field, value, .. }) => {
                    assert!(value.len() <= 64, "{value}");
                    field
                }
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(refused(|r| r.epoch = "1".repeat(65)), "epoch");
        assert_eq!(
            refused(|r| r.agent.node_name = "Node_1".repeat(60)),
            "agent.node_name"
        );
        assert_eq!(
            refused(|r| r.interfaces[0].interface_name = "i".repeat(16)),
            "interfaces.interface_name"
        );
        assert_eq!(
            refused(|r| r.interfaces[0].pool_ref = format!("ns/{}", "p".repeat(300))),
            "interfaces.pool_ref"
        );

        // One report beyond its bytes, then agents filling the ConfigMap's budget.
        let big = |pod: &str, n: usize| {
            let mut r = report(pod, 30, InterfaceState::Serving);
            let one = r.interfaces[0].clone();
            r.interfaces = (0..n)
                .map(|i| InterfaceReport {
                    pool_ref: format!("default/pool-{i}"),
                    interface_name: format!("vmd{i:010}"),
                    error: "x".repeat(MAX_ERROR),
                    probes: Vec::new(),
                    suspects: Vec::new(),
                    ..one.clone()
                })
                .collect();
            r
        };
        let full = Reports::default();
        let mut stored = 0;
        for i in 0..MAX_AGENTS {
            match full.record(big(&format!("agent-{i}"), 60)) {
                Ok(()) => stored += 1,
                Err(ReportError::Full(bytes)) => {
                    assert!(bytes > MAX_PUBLISHED_BYTES);
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        let total: usize = full.all().values().map(|r| encode(r).len()).sum();
        assert!(
            stored < MAX_AGENTS && total <= MAX_PUBLISHED_BYTES,
            "{stored} agents, {total} bytes"
        );
        // A stored agent may still report again at its size.
        full.record(big("agent-0", 60)).unwrap();
    }

    /// The largest report the bounds admit: [`MAX_INTERFACES`] pools with the longest names
    /// Kubernetes allows, every error at [`MAX_ERROR`], every verdict and suspect allowed.
    fn largest(pod: &str, at_secs: u64) -> AgentReport {
        let mut r = report(pod, at_secs, InterfaceState::Error);
        let one = r.interfaces[0].clone();
        let (probe, suspect) = (one.probes[0], one.suspects[0].clone());
        r.interfaces = (0..MAX_INTERFACES)
            .map(|i| InterfaceReport {
                pool_ref: format!(
                    "{}/{}.{}.{}.p{i:0>60}",
                    "n".repeat(63),
                    "a".repeat(63),
                    "b".repeat(63),
                    "c".repeat(63)
                ),
                interface_name: format!("{i:0>15}"),
                error: "x".repeat(MAX_ERROR),
                probes: if i < MAX_REPORT_PROBES / MAX_PROBES {
                    vec![probe; MAX_PROBES]
                } else {
                    Vec::new()
                },
                suspects: if i < MAX_REPORT_SUSPECTS / MAX_SUSPECTS {
                    vec![
                        NetworkSuspect {
                            detail: "d".repeat(MAX_SUSPECT_DETAIL),
                            ..suspect.clone()
                        };
                        MAX_SUSPECTS
                    ]
                } else {
                    Vec::new()
                },
                ..one.clone()
            })
            .collect();
        r
    }

    /// Reports of agent pods a rollout left behind never crowd out the one the Lease holder
    /// sends: it is always admitted, the oldest report of an agent not holding the Lease
    /// dropped to make room; another agent's report gets room only over older ones.
    #[test]
    fn the_lease_holders_report_is_always_admitted_over_old_pods() {
        let reports = Reports::default();
        reports.lead_by("vmdhcp-system/agents".parse().unwrap());
        reports.set_holder(Some("leader".into()));
        let big = |pod: &str, at: u64| {
            let mut r = largest(pod, at);
            r.interfaces.truncate(200);
            r
        };
        let mut stored = Vec::new();
        for i in 0..MAX_AGENTS as u64 {
            match reports.record(big(&format!("old-{i}"), 100)) {
                Ok(()) => stored.push(format!("vmdhcp-system/old-{i}")),
                Err(ReportError::Full(_)) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(
            stored.len() > 1 && stored.len() < MAX_AGENTS,
            "{}",
            stored.len()
        );
        // An agent older than every stored one gets no room.
        assert!(matches!(
            reports.record(big("older", 50)),
            Err(ReportError::Full(_))
        ));
        // The holder's largest report, even one that arrived earlier, is admitted: the oldest
        // pods' reports go, and the pools they named are re-checked.
        reports.take_touched();
        reports.record(largest("leader", 90)).unwrap();
        let all = reports.all();
        assert!(all["vmdhcp-system/leader"].leader);
        assert_eq!(all["vmdhcp-system/leader"].interfaces.len(), MAX_INTERFACES);
        assert!(!all.contains_key(&stored[0]), "the oldest went first");
        assert!(
            all.contains_key(stored.last().unwrap()),
            "only as many as needed go"
        );
        assert!(!reports.take_touched().is_empty());
        let total: usize = reports.sizes.lock().values().sum();
        assert!(total <= MAX_PUBLISHED_BYTES, "{total}");
        // A newer report of another agent takes the place of the oldest left.
        let before = reports.all();
        reports.record(big("new", 1_000)).unwrap();
        let after = reports.all();
        assert!(after.contains_key("vmdhcp-system/new"));
        assert!(
            after.len() <= before.len(),
            "room made, not grown past the budget"
        );
        assert!(
            reports.all().contains_key("vmdhcp-system/leader"),
            "never the holder's"
        );
    }

    /// The largest report the bounds admit fits, its errors cut to [`SHORT_ERROR`] bytes.
    #[test]
    fn a_report_of_every_pool_an_agent_may_serve_fits() {
        let reports = Reports::default();
        reports.record(largest("agent-0", 10)).unwrap();
        let kept = &reports.all()["vmdhcp-system/agent-0"];
        assert_eq!(kept.interfaces.len(), MAX_INTERFACES);
        assert!(kept.interfaces.iter().all(|i| i.error.len() == SHORT_ERROR));
        assert!(encode(kept).len() <= MAX_REPORT_BYTES);
    }
}
