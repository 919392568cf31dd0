//! What the agents report about a pool, as the pool's status and signals say it: `AgentReady`,
//! the hosts acting where they should not (foreign DHCP servers, proxy-ARP/NDP responders), and
//! the probe verdicts recorded as address conflicts.

use super::*;

/// How recent an agent report must be to count for `AgentReady`.
pub const REPORT_FRESHNESS: Duration = Duration::from_secs(90);

/// The fresh reports of agents saying they lead, newest first. Right after a failover two agents
/// have one (the old leader's last and the new leader's first): the newest is the one that holds
/// the Lease now.
pub(super) fn fresh_leaders(
    reports: &BTreeMap<String, AgentReport>,
    now: SystemTime,
) -> Vec<(&String, &AgentReport)> {
    let mut leaders: Vec<_> = reports
        .iter()
        .filter(|(_, r)| {
            r.leader
                && now
                    .duration_since(r.received_at)
                    .is_ok_and(|age| age < REPORT_FRESHNESS)
        })
        .collect();
    leaders.sort_by_key(|(_, r)| std::cmp::Reverse(r.received_at));
    leaders
}

/// `AgentReady` from what agents report: True when a fresh report of the leading agent has the
/// pool's interface serving; otherwise False with the reason (the interface's error, not served,
/// no report at all).
pub fn agent_ready(
    reports: &BTreeMap<String, AgentReport>,
    pool: &NamespacedName,
    now: SystemTime,
) -> Wanted {
    let not_ready =
        |reason, message| Wanted::new(CONDITION_AGENT_READY, false).because(reason, message);
    let pool_ref = pool.to_string();
    let mut seen_leader = None;
    for (agent, report) in fresh_leaders(reports, now) {
        seen_leader = Some(agent.clone());
        for i in report.interfaces.iter().filter(|i| i.pool_ref == pool_ref) {
            match i.state {
                InterfaceState::Serving => {
                    // Not the revision it applied: that changes with every allocation, and
                    // a condition naming it would be a write of every pool on every report.
                    let msg = format!("served by {agent} on {}", i.interface_name);
                    return Wanted::new(CONDITION_AGENT_READY, true).because("", msg);
                }
                InterfaceState::Error => {
                    return not_ready(
                        "InterfaceError",
                        format!("{agent}: {}: {}", i.interface_name, i.error),
                    );
                }
                _ => {}
            }
        }
    }
    match seen_leader {
        Some(agent) => not_ready(
            "NotServed",
            format!("the leading agent {agent} does not report serving this pool"),
        ),
        None => not_ready(
            "NoAgentReport",
            "no leading agent has reported in the last 90 s".to_owned(),
        ),
    }
}

/// The entry for `pool` of the agent serving it now: in the latest fresh report of a leading
/// agent that names the pool, when its interface for the pool serves (an old leader's, or a
/// standby's, does not count; nor does a leader that does not name the pool, which can say
/// nothing about it).
pub(super) fn serving_entry<'a>(
    reports: &'a BTreeMap<String, AgentReport>,
    pool: &NamespacedName,
    now: SystemTime,
) -> Option<(&'a str, &'a InterfaceReport)> {
    let pool_ref = pool.to_string();
    fresh_leaders(reports, now)
        .into_iter()
        .find_map(|(agent, r)| {
            let entry = r.interfaces.iter().find(|i| i.pool_ref == pool_ref)?;
            Some((agent.as_str(), entry))
        })
        .filter(|(_, i)| i.state == InterfaceState::Serving)
}

/// The probe verdicts on `pool` of the agent serving it now ([`serving_entry`]).
pub fn serving_probes<'a>(
    reports: &'a BTreeMap<String, AgentReport>,
    pool: &NamespacedName,
    now: SystemTime,
) -> Option<(&'a str, &'a [AddressProbe])> {
    serving_entry(reports, pool, now).map(|(agent, i)| (agent, i.probes.as_slice()))
}

/// What the serving agent reports of the hosts acting where they should not on a pool's
/// network, as the pool's status and signals should show it.
#[derive(Debug, PartialEq)]
pub struct SuspectFindings {
    /// `ForeignDHCPServer`, `ProxyARPResponder` and `ProxyNDPResponder`, as they should read.
    pub conditions: [Wanted; 3],
    /// Suspects the pool's conditions do not name yet: each gets a Warning event.
    pub appeared: Vec<NetworkSuspect>,
    /// How many suspects of each kind the serving agent reports (every kind listed).
    pub counts: [(SuspectKind, usize); 3],
    /// The agent that reports them (`namespace/pod`), when one serves the pool.
    pub agent: Option<String>,
}

/// The condition type that shows suspects of `kind`.
pub(super) fn suspect_condition(kind: SuspectKind) -> &'static str {
    match kind {
        SuspectKind::ForeignDhcpServer => CONDITION_FOREIGN_DHCP_SERVER,
        SuspectKind::ProxyArpResponder => CONDITION_PROXY_ARP_RESPONDER,
        SuspectKind::ProxyNdpResponder => CONDITION_PROXY_NDP_RESPONDER,
    }
}

/// The suspects of `pool` from the report of the agent serving it now ([`serving_entry`]: a
/// standby's, or an old leader's, are not believed), as conditions: True with reason `Detected`
/// and a message naming each by address and MAC, False when there is none, False with reason
/// `NotChecked` when no agent serves the pool. `previous` is the pool's conditions as they read
/// now: a suspect they do not name has just appeared. The message leaves out what each suspect
/// last did, which changes with every frame it sends: only who they are moves the condition.
pub fn network_suspects(
    reports: &BTreeMap<String, AgentReport>,
    pool: &NamespacedName,
    now: SystemTime,
    previous: &[Condition],
) -> SuspectFindings {
    let entry = serving_entry(reports, pool, now);
    let mut appeared = Vec::new();
    let mut counts = SuspectKind::ALL.map(|kind| (kind, 0));
    let conditions = SuspectKind::ALL.map(|kind| {
        let type_ = suspect_condition(kind);
        let Some((agent, interface)) = entry else {
            return Wanted::new(type_, false).because(
                "NotChecked",
                "no agent serving this pool has reported lately",
            );
        };
        let mut found: Vec<&NetworkSuspect> = interface
            .suspects
            .iter()
            .filter(|s| s.kind == kind)
            .collect();
        // One entry per MAC (the agent keys them so; a report is believed, not trusted), in
        // address order so that the message reads the same whatever order they came in.
        found.sort_by_key(|s| s.mac);
        found.dedup_by_key(|s| s.mac);
        found.sort_by_key(|s| (s.ip, s.mac));
        if let Some(count) = counts.iter_mut().find(|(k, _)| *k == kind) {
            count.1 = found.len();
        }
        if found.is_empty() {
            return Wanted::new(type_, false);
        }
        let named = find_condition(previous, type_)
            .filter(|c| c.status == "True")
            .map(|c| listed_macs(c.message.as_deref().unwrap_or_default()))
            .unwrap_or_default();
        appeared.extend(
            found
                .iter()
                .filter(|s| !named.contains(&s.mac))
                .map(|s| (*s).clone()),
        );
        let list: Vec<String> = found.iter().map(|s| named_suspect(s)).collect();
        let what = match kind {
            SuspectKind::ForeignDhcpServer => "DHCP servers other than the pool's answer",
            SuspectKind::ProxyArpResponder => "hosts answer ARP for addresses not their own",
            SuspectKind::ProxyNdpResponder => {
                "hosts answer Neighbor Solicitations for IPv6 addresses not their own"
            }
        };
        Wanted::new(type_, true).because(
            "Detected",
            format!("{what} on its network ({agent}): {}", list.join(", ")),
        )
    });
    SuspectFindings {
        conditions,
        appeared,
        counts,
        agent: entry.map(|(agent, _)| agent.to_owned()),
    }
}

/// A suspect as a condition message names it: `address (MAC)`.
pub(super) fn named_suspect(s: &NetworkSuspect) -> String {
    match s.ip {
        Some(ip) => format!("{ip} ({})", s.mac),
        None => format!("an unknown address ({})", s.mac),
    }
}

/// The MACs a suspect condition's message names (each in parentheses, as [`named_suspect`]
/// writes them).
pub(super) fn listed_macs(message: &str) -> std::collections::BTreeSet<MacAddr> {
    message
        .split('(')
        .skip(1)
        .filter_map(|rest| rest.split_once(')'))
        .filter_map(|(inside, _)| inside.parse().ok())
        .collect()
}

/// A Warning event for each suspect that has just appeared (after the status naming it is
/// written, so that a failed write does not announce it twice), and the gauges.
pub(super) fn report_suspects(
    ctx: &Context,
    pool: &IPPool,
    pool_ref: &NamespacedName,
    found: &SuspectFindings,
) {
    let agent = found.agent.as_deref().unwrap_or("the serving agent");
    for s in &found.appeared {
        let (reason, what) = match s.kind {
            SuspectKind::ForeignDhcpServer => ("ForeignDHCPServer", "another DHCP server"),
            SuspectKind::ProxyArpResponder => ("ProxyARPResponder", "a proxy-ARP responder"),
            SuspectKind::ProxyNdpResponder => ("ProxyNDPResponder", "a proxy-NDP responder"),
        };
        let address =
            s.ip.map_or_else(|| "an unknown address".to_owned(), |ip| ip.to_string());
        let detail = if s.detail.is_empty() {
            String::new()
        } else {
            format!(": {}", s.detail)
        };
        warn!(pool = %pool_ref, kind = s.kind.as_str(), mac = %s.mac, ip = %address, detail = %s.detail, %agent, "host acting where it should not on the pool's network");
        ctx.event(
            pool,
            EventType::Warning,
            reason,
            "Detect",
            format!(
                "{what} on the pool's network: {address} at {}{detail} (reported by {agent})",
                s.mac
            ),
        );
    }
    let ippool = pool_ref.to_string();
    for (kind, n) in found.counts {
        ctx.signals
            .metrics
            .set_network_suspects(&ippool, kind.as_str(), n);
    }
}

/// What probe verdicts changed in a pool's conflicts.
#[derive(Debug, Default, PartialEq)]
pub struct ConflictChanges {
    /// Newly recorded: (address, the host answering for it, why it was probed).
    pub recorded: Vec<(IpAddr, MacAddr, ProbeReason)>,
    /// Found free by a recheck and cleared.
    pub cleared: Vec<IpAddr>,
    /// Not recorded (outside the range, or too many already).
    pub refused: Vec<IpamError>,
    /// Not recorded: (address, the host answering for it), a host that holds
    /// [`MAX_CONFLICTS_PER_HOST`] of the pool's addresses in conflict already.
    pub capped: Vec<(IpAddr, MacAddr)>,
}

impl ConflictChanges {
    /// Adds another family's changes.
    fn extend(&mut self, other: ConflictChanges) {
        self.recorded.extend(other.recorded);
        self.cleared.extend(other.cleared);
        self.refused.extend(other.refused);
        self.capped.extend(other.capped);
    }
}

/// Applies the serving agent's verdicts on addresses of `alloc`'s family to its books: another
/// host answering for an address records a conflict (once; the client's own answer is none)
/// unless that host holds [`MAX_CONFLICTS_PER_HOST`] already, a recheck nobody else answers
/// clears one. `since` stamps new records.
pub fn apply_probes<A: Family>(
    alloc: &mut PoolAllocator<A>,
    probes: &[AddressProbe],
    since: &Time,
) -> ConflictChanges {
    let mut changes = ConflictChanges::default();
    for p in probes {
        let Some(ip) = A::of(p.ip) else {
            continue;
        };
        match p.answered_by {
            Some(other) if Some(other) != p.mac => {
                if alloc.conflict(ip).is_none()
                    && alloc.conflicts_held_by(&other.to_string()) >= MAX_CONFLICTS_PER_HOST
                {
                    changes.capped.push((p.ip, other));
                    continue;
                }
                let conflict = AddressConflict {
                    mac_address: MacAddr::text_or_empty(p.mac),
                    answered_by: other.to_string(),
                    source: p.reason.as_source().to_owned(),
                    since: Some(since.clone()),
                };
                match alloc.record_conflict(ip, conflict) {
                    Ok(true) => changes.recorded.push((p.ip, other, p.reason)),
                    Ok(false) => {}
                    Err(e) => changes.refused.push(e),
                }
            }
            None if p.reason == ProbeReason::Recheck && alloc.clear_conflict(ip) => {
                changes.cleared.push(p.ip);
            }
            _ => {}
        }
    }
    changes
}

/// Records in the pool's books what its serving agent's probes found (written with the
/// status that follows), with an event for each change.
pub(super) async fn record_conflicts(
    ctx: &Context,
    pool: &IPPool,
    pool_ref: &NamespacedName,
    reports: &BTreeMap<String, AgentReport>,
    now: SystemTime,
) {
    let Some((agent, probes)) = serving_probes(reports, pool_ref, now) else {
        return;
    };
    if probes.is_empty() {
        return;
    }
    let since = crate::reconcile::status::now();
    let Ok(changes) = ctx.books.ipam.with_books(pool_ref, |b| {
        let mut changes = apply_probes(&mut b.v4, probes, &since);
        if let Some(a6) = b.v6.as_mut() {
            changes.extend(apply_probes(a6, probes, &since));
        }
        changes
    }) else {
        return;
    };
    for (ip, by, reason) in &changes.recorded {
        warn!(pool = %pool_ref, %ip, answered_by = %by, %agent, "address in use by another host: recorded as conflicted");
        let how = match reason {
            ProbeReason::Offer => "before it was offered",
            ProbeReason::Decline => "after a client declined it",
            ProbeReason::Recheck => "when checked again",
        };
        ctx.event(
            pool,
            EventType::Warning,
            "AddressConflict",
            "Probe",
            format!("{ip} is in use by another host: {by} answered {} {how} ({agent}); it is not handed out until a probe finds it free", probe_of(ip)),
        );
    }
    for ip in &changes.cleared {
        info!(pool = %pool_ref, %ip, %agent, "conflicted address found free: cleared");
        ctx.event(
            pool,
            EventType::Normal,
            "ConflictCleared",
            "Probe",
            format!(
                "{ip} is free again: nobody else answered {} ({agent})",
                probe_of(ip)
            ),
        );
    }
    for e in changes.refused.iter().take(3) {
        warn!(pool = %pool_ref, error = %e, "conflict not recorded");
    }
    for (ip, by) in &changes.capped {
        warn!(pool = %pool_ref, %ip, answered_by = %by, %agent, "host answers for more addresses than it may hold in conflict: not recorded");
        ctx.event(
            pool,
            EventType::Warning,
            "ConflictLimit",
            "Probe",
            format!("{by} also answers {} for {ip}, but it holds {MAX_CONFLICTS_PER_HOST} of this pool's addresses in conflict already: no more are withheld for it", if ip.is_ipv4() { "ARP" } else { "NDP" }),
        );
    }
}

/// How an agent probes `ip`: ARP for IPv4, a Neighbor Solicitation for IPv6.
pub(super) fn probe_of(ip: &IpAddr) -> &'static str {
    if ip.is_ipv4() {
        "an ARP probe"
    } else {
        "a Neighbor Solicitation"
    }
}

/// `AgentReady`: the agent Deployment missing overrides whatever agents report.
pub(super) fn agent_condition(
    ctx: &Context,
    pool_ref: &NamespacedName,
    reports: &BTreeMap<String, AgentReport>,
    now: SystemTime,
) -> Wanted {
    if ctx
        .agents
        .deployment_missing
        .load(std::sync::atomic::Ordering::Relaxed)
    {
        Wanted::new(CONDITION_AGENT_READY, false).because(
            "AgentDeploymentNotFound",
            "the agent Deployment was not found",
        )
    } else {
        agent_ready(reports, pool_ref, now)
    }
}
