//! Carrying out a NIC's plan: the MAC claim, the decision on the pool's books (both families,
//! under one hold of its lock), and what it tells: events, metrics, the trace, its status entry.

use super::*;

/// Carries out one NIC's plan: events, MAC claim, allocation, its status entry and problems.
pub(super) async fn perform(
    ctx: &Context,
    cfg: &VirtualMachineNetworkConfig,
    me: &NamespacedName,
    plan: NicPlan,
    out: &mut Outcome,
) {
    match plan {
        NicPlan::Invalid(problem) => out.problems.push(problem),
        NicPlan::Held {
            network,
            mac,
            ip,
            ipv6,
        } => out.entries.push(entry(
            &network,
            mac,
            (Some(ip), ipv6),
            NetworkConfigState::Allocated,
        )),
        NicPlan::Pending {
            network,
            mac,
            ip,
            ipv6,
            problem,
            waiting,
        } => {
            out.problems.push(problem);
            out.entries.push(entry(
                &network,
                mac,
                (ip, ipv6),
                NetworkConfigState::Pending,
            ));
            out.waiting |= waiting;
        }
        NicPlan::MacInUse {
            network,
            mac,
            other,
        } => {
            let msg = format!(
                "{mac} on {network} is already allocated to VirtualMachineNetworkConfig {other}"
            );
            warn_refused(ctx, cfg, "MacInUse", msg.clone());
            out.problems.push(msg);
            out.mac_in_use += 1;
            out.entries.push(entry(
                &network,
                mac,
                (None, None),
                NetworkConfigState::Pending,
            ));
        }
        NicPlan::Allocate {
            network,
            mac,
            pool,
            requested,
            previous,
            v6,
        } => {
            if let Err(other) = ctx.books.mac_owners.claim(&pool, mac, me) {
                out.mac_in_use += 1;
                out.problems.push(format!(
                    "{mac} on {network} is already allocated to VirtualMachineNetworkConfig {other}"
                ));
                out.entries.push(entry(
                    &network,
                    mac,
                    (None, None),
                    NetworkConfigState::Pending,
                ));
                return;
            }
            let nic = Nic {
                network: &network,
                mac,
                pool: &pool,
            };
            allocate(ctx, cfg, me, nic, (requested, previous, v6), out);
        }
    }
}

/// A NIC being given an address on `pool`.
pub(super) struct Nic<'a> {
    pub(super) network: &'a NamespacedName,
    pub(super) mac: MacAddr,
    pub(super) pool: &'a NamespacedName,
}

/// What one NIC's allocation decided, taken under one hold of its pool's lock so that no other
/// reconcile's change can fall between the address chosen and what is read about it.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Decision {
    /// The address the NIC held before.
    pub(super) held_before: Option<Ipv4Addr>,
    /// The address it holds now, or why it got none.
    pub(super) result: Result<Ipv4Addr, IpamError>,
    /// Whether the address's host name changed.
    pub(super) renamed: bool,
    /// Whether the NIC's own DHCP options changed.
    pub(super) reoptioned: bool,
    /// The address it moved away from, and why that one was in conflict.
    pub(super) moved_from: Option<(Ipv4Addr, String)>,
    /// Why the address it holds now is in conflict (only a static one can be).
    pub(super) conflict: Option<String>,
    /// Whether no write has recorded the address it holds after the decision (the new one, or
    /// the one it kept when refused): one just given, or one an earlier reconcile gave without
    /// its write succeeding. Either is recorded before it is told.
    pub(super) unrecorded: bool,
}

/// What goes with a NIC's address besides its holder: the VM's name and the NIC's own DHCP
/// options.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Extras<'a> {
    pub(super) host_name: Option<&'a str>,
    pub(super) options: Option<&'a NicOptions>,
}

/// Decides one NIC's address on its pool's allocator: [`allocate_nic`], then the host name, the
/// NIC's options and the conflicts read from the same state.
pub(super) fn decide(
    alloc: &mut PoolAllocator,
    mac: MacAddr,
    requested: Option<Ipv4Addr>,
    previous: Option<Ipv4Addr>,
    extras: Extras<'_>,
    avoid: &dyn Fn(IpAddr) -> bool,
) -> Decision {
    let held_before = alloc.lookup(&mac);
    let result = allocate_nic(alloc, mac, requested, previous, avoid);
    let unrecorded = alloc.lookup(&mac).is_some_and(|ip| alloc.is_unrecorded(ip));
    let (mut renamed, mut reoptioned, mut moved_from, mut conflict) = (false, false, None, None);
    if let Ok(ip) = result {
        renamed = alloc.set_host_name(ip, extras.host_name);
        reoptioned = alloc.set_nic_options(ip, extras.options);
        moved_from = held_before
            .filter(|old| *old != ip)
            .and_then(|old| Some((old, alloc.conflict_reason(old)?)));
        conflict = alloc.conflict_reason(ip);
    }
    Decision {
        held_before,
        result,
        renamed,
        reoptioned,
        moved_from,
        conflict,
        unrecorded,
    }
}

/// The IPv6 side of one NIC's allocation on a dual-stack pool.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct DecisionV6 {
    /// The address the NIC held before.
    pub(super) held_before: Option<Ipv6Addr>,
    /// The address it holds now, or why it got none.
    pub(super) result: Result<Ipv6Addr, IpamError>,
    /// Whether no write has recorded that address yet ([`Decision::unrecorded`]).
    pub(super) unrecorded: bool,
    /// The address it moved away from, and why that one was in conflict.
    pub(super) moved_from: Option<(Ipv6Addr, String)>,
}

/// Decides one NIC's addresses on its pool's books, IPv4 first ([`decide`]); then, on a
/// dual-stack pool and only if the NIC has its IPv4 address, its IPv6 one ([`allocate_nic`]
/// on the IPv6 books). One hold of the pool's lock covers both.
pub(super) fn decide_books(
    books: &mut PoolBooks,
    mac: MacAddr,
    (requested, previous): (Option<Ipv4Addr>, Option<Ipv4Addr>),
    extras: Extras<'_>,
    want6: V6Want,
    avoid: &dyn Fn(IpAddr) -> bool,
) -> (Decision, Option<DecisionV6>) {
    let v4 = decide(&mut books.v4, mac, requested, previous, extras, avoid);
    let v6 = match (&mut books.v6, &v4.result) {
        (Some(a6), Ok(_)) => {
            let held_before = a6.lookup(&mac);
            let result = allocate_nic(a6, mac, want6.requested, want6.previous, avoid);
            let moved_from = match (held_before, &result) {
                (Some(old), Ok(new)) if old != *new => {
                    a6.conflict_reason(old).map(|why| (old, why))
                }
                _ => None,
            };
            Some(DecisionV6 {
                held_before,
                result,
                unrecorded: a6.lookup(&mac).is_some_and(|ip| a6.is_unrecorded(ip)),
                moved_from,
            })
        }
        // A refused IPv4 request leaves the NIC what it held, IPv6 included.
        (Some(a6), Err(_)) => a6.lookup(&mac).map(|held| DecisionV6 {
            held_before: Some(held),
            result: Ok(held),
            unrecorded: a6.is_unrecorded(held),
            moved_from: None,
        }),
        (None, _) => None,
    };
    (v4, v6)
}

/// Allocates one NIC its address (a traced `allocate` span): an event and a metric when the
/// address is new, the MAC claim undone and an event when refused. On a dual-stack pool the
/// NIC gets its IPv6 address in the same decision, after its IPv4 one; it is `Allocated` only
/// with both.
pub(super) fn allocate(
    ctx: &Context,
    cfg: &VirtualMachineNetworkConfig,
    me: &NamespacedName,
    nic: Nic<'_>,
    (requested, prev_ip, want6): (Option<Ipv4Addr>, Option<Ipv4Addr>, V6Want),
    out: &mut Outcome,
) {
    let Nic { network, mac, pool } = nic;
    let span = info_span!(
        "allocate",
        pool = %pool,
        network = %network,
        mac = %mac,
        requested = field::Empty,
        ip = field::Empty,
        result = field::Empty,
        otel.status_code = field::Empty,
    );
    if let Some(r) = requested {
        span.record("requested", field::display(r));
    }
    // The VM's name goes into the IPAM with the address, and into the pool's status while the
    // pool sends host names (a name the status lacks, by the same write as any other change).
    // While it does not, a new name changes nothing to write: after an IPAM rebuild every
    // config names its address again, and touching the pool for each would rebuild and compare
    // its whole status for nothing.
    let vm_name = Some(cfg.spec.vm_name.as_str())
        .filter(|n| !n.is_empty())
        .map_or_else(|| cfg.name_any(), str::to_owned);
    let host_name = host_name_of(&vm_name);
    // The NIC's own DHCP options, recorded with its address like its host name.
    let options = nic_options(cfg, network, mac);
    // Addresses other NICs on the network ask for as their static one, or hold by their
    // config's record (the books may have lost one: a status written without `ipv6`).
    let index = &ctx.stores.config_index;
    let avoid = |ip: IpAddr| {
        index.requested_by_another(network, ip, me, mac)
            || index.recorded_by_another(network, ip, me)
    };
    let decision = span.in_scope(|| {
        ctx.books.ipam.with_books(pool, |b| {
            let extras = Extras {
                host_name: host_name.as_deref(),
                options: options.as_ref(),
            };
            decide_books(b, mac, (requested, prev_ip), extras, want6, &avoid)
        })
    });
    let (decision, v6) = decision.unwrap_or_else(|e| {
        let refused = Decision {
            held_before: None,
            result: Err(e),
            renamed: false,
            reoptioned: false,
            moved_from: None,
            conflict: None,
            unrecorded: false,
        };
        (refused, None)
    });
    let (ipv6, v6_new) = v6_outcome(ctx, cfg, &nic_of(network, mac, pool), v6, out);
    let held_before = decision.held_before;
    let holds = decision.result.as_ref().ok().copied().or(held_before);
    if let (true, Some(ip)) = (decision.unrecorded, holds) {
        out.touched.insert(pool.clone());
        out.given.push((pool.clone(), mac, ip.into()));
    }
    match decision.result {
        Ok(ip) => {
            span.record("ip", field::display(ip));
            let names_written = ctx
                .stores
                .pools
                .get(&store_key(pool))
                .is_none_or(|p| p.spec.ipv4_config.send_host_name == Some(true));
            if (decision.renamed && names_written) || decision.reoptioned {
                out.touched.insert(pool.clone());
            }
            if let Some((old, why)) = &decision.moved_from {
                ctx.event(
                    cfg,
                    EventType::Warning,
                    "AddressConflict",
                    "Allocate",
                    format!("{old} is {why}: {mac} on {network} moved to {ip}"),
                );
            }
            if let Some(why) = &decision.conflict {
                // Only a static address stays in conflict (a dynamic one has just moved).
                out.problems.push(format!(
                    "{mac} on {network}: static ip {ip} is {why}; it is not served until a probe finds it free"
                ));
                out.conflict = true;
            }
            if held_before == Some(ip) {
                span.record("result", "kept");
                if let Some(ip6) = v6_new {
                    ctx.event(
                        cfg,
                        EventType::Normal,
                        "Allocated",
                        "Allocate",
                        format!("{ip6} allocated to {mac} on {network}"),
                    );
                }
            } else {
                span.record("result", "allocated");
                ctx.signals
                    .metrics
                    .allocation(&pool.to_string(), "allocated");
                // The index revision that publishes this lease continues this trace.
                if let Some(cause) = vmdhcp_telemetry::trace::span_context(&span) {
                    ctx.signals.causes.leases.record((pool.clone(), mac), cause);
                }
                // One event for both families: events are API writes too.
                let both = v6_new.map(|ip6| format!(" and {ip6}")).unwrap_or_default();
                ctx.event(
                    cfg,
                    EventType::Normal,
                    "Allocated",
                    "Allocate",
                    format!("{ip}{both} allocated to {mac} on {network}"),
                );
            }
            let state = match ipv6 {
                V6State::Refused(_) => NetworkConfigState::Pending,
                V6State::None | V6State::Held(_) => NetworkConfigState::Allocated,
            };
            out.entries
                .push(entry(network, mac, (Some(ip), ipv6.address()), state));
        }
        Err(e) => {
            span.record("result", "refused");
            span.record("otel.status_code", "ERROR");
            ctx.signals.metrics.allocation(&pool.to_string(), "refused");
            span.in_scope(|| debug!(error = %e, "allocation refused"));
            if held_before.is_none() {
                ctx.books.mac_owners.release(pool, mac, me);
            }
            warn_refused(ctx, cfg, "AllocationRefused", e.to_string());
            out.problems.push(e.to_string());
            out.entries.push(entry(
                network,
                mac,
                (held_before, ipv6.address()),
                if held_before.is_some() {
                    NetworkConfigState::Allocated
                } else {
                    NetworkConfigState::Pending
                },
            ));
        }
    }
}

/// Where a NIC's IPv6 side stands after its allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum V6State {
    /// No IPv6 books on the pool (IPv4-only), or no IPv4 address to go with one.
    None,
    /// It holds this address.
    Held(Ipv6Addr),
    /// It was refused one; it keeps the one it held, if any.
    Refused(Option<Ipv6Addr>),
}

impl V6State {
    /// The address to record in the NIC's status.
    fn address(self) -> Option<Ipv6Addr> {
        match self {
            V6State::None => None,
            V6State::Held(ip) | V6State::Refused(Some(ip)) => Some(ip),
            V6State::Refused(None) => None,
        }
    }
}

/// The [`Nic`] named by these parts.
pub(super) fn nic_of<'a>(
    network: &'a NamespacedName,
    mac: MacAddr,
    pool: &'a NamespacedName,
) -> Nic<'a> {
    Nic { network, mac, pool }
}

/// Carries out the IPv6 side of a NIC's decision: an address no write has recorded yet is to be
/// recorded (the pool touched, the address checked after the write like an IPv4 one); a refusal is a
/// problem and a Warning event. Returns where the NIC stands and the address newly given.
pub(super) fn v6_outcome(
    ctx: &Context,
    cfg: &VirtualMachineNetworkConfig,
    nic: &Nic<'_>,
    v6: Option<DecisionV6>,
    out: &mut Outcome,
) -> (V6State, Option<Ipv6Addr>) {
    let Some(v6) = v6 else {
        return (V6State::None, None);
    };
    let Nic { network, mac, pool } = *nic;
    let holds = v6.result.as_ref().ok().copied().or(v6.held_before);
    if let (true, Some(ip6)) = (v6.unrecorded, holds) {
        out.touched.insert(pool.clone());
        out.given.push((pool.clone(), mac, ip6.into()));
    }
    match v6.result {
        Ok(ip6) => {
            if v6.held_before == Some(ip6) {
                return (V6State::Held(ip6), None);
            }
            if let Some((old, why)) = &v6.moved_from {
                ctx.event(
                    cfg,
                    EventType::Warning,
                    "AddressConflict",
                    "Allocate",
                    format!("{old} is {why}: {mac} on {network} moved to {ip6}"),
                );
            }
            ctx.signals
                .metrics
                .allocation(&pool.to_string(), "allocated");
            (V6State::Held(ip6), Some(ip6))
        }
        Err(e) => {
            ctx.signals.metrics.allocation(&pool.to_string(), "refused");
            let msg = format!("{mac} on {network}: IPv6: {e}");
            warn_refused(ctx, cfg, "AllocationRefused", msg.clone());
            out.problems.push(msg);
            (V6State::Refused(v6.held_before), None)
        }
    }
}

/// The DHCP options `cfg`'s spec gives the NIC `mac` on `network` (its VM's `dhcpOptions`),
/// if any. Options that break the rules (admission refuses them; an older object may hold
/// them) are left out with a warning: the NIC is served with the pool's.
fn nic_options(
    cfg: &VirtualMachineNetworkConfig,
    network: &NamespacedName,
    mac: MacAddr,
) -> Option<NicOptions> {
    let namespace = cfg.namespace().unwrap_or_default();
    let nc = cfg.spec.network_configs.iter().find(|nc| {
        nc.mac_address.parse::<MacAddr>().ok() == Some(mac)
            && NamespacedName::parse_in(&nc.network_name, &namespace)
                .ok()
                .as_ref()
                == Some(network)
    })?;
    match NicOptions::parse(nc.dhcp_options.as_ref()?) {
        Ok(options) => options,
        Err(e) => {
            let field = e.path("dhcpOptions");
            warn!(config = %cfg.name_any(), %network, %mac, field, error = %e, "DHCP options left out");
            None
        }
    }
}
