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
use std::net::IpAddr;
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

mod shared;
mod types;

use shared::*;
pub use shared::{ReportsObject, follow, follow_agent_lease, publish};
pub use types::*;

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
    Vec<(SuspectKind, MacAddr, Option<IpAddr>)>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

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
                    ip: Some(Ipv4Addr::new(10, 0, 0, 7).into()),
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
