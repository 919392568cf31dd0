//! The Neighbor Solicitation checks of one interface's DHCPv6 server: the addresses clients
//! decline, and those the controller records as conflicted, probed with
//! duplicate-address-detection solicitations ([`crate::arp::probe6`]) as the DHCPv4 server does
//! with ARP ([`crate::dhcp::probe`], whose rules these follow):
//! - a DECLINE costs nothing until checked: only when another host (not the reservation's own
//!   client) answers for the address is it withheld, for `DECLINE_HOLD`, and the conflict
//!   recorded in the table's [`crate::findings`], which reach the controller; it records them in
//!   the pool's `status.ipv6.conflicts`, moves a dynamically allocated VM elsewhere, and streams
//!   the recorded addresses back ([`vmdhcp_core::pool::PoolConfigV6::conflicted`]);
//! - those recorded addresses are not given ([`LeaseTable::withholds6`]), and every
//!   [`crate::findings::RECHECK`] each is probed again (`Rechecks`): one nobody else answers
//!   for is reported free, and the controller clears it.
//!
//! The probes of one interface, of DECLINEs and rechecks together, are bounded: at most
//! `MAX_PROBES` at once, one per address, each a small thread that lives at most two probe
//! windows (`PROBE_WAIT`); the rechecks still to start live in the serving loop, and stop with
//! it.

use std::collections::{HashSet, VecDeque};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tracing::{debug, info, warn};
use vmdhcp_core::pool::MAX_CONFLICTS_PER_HOST;
use vmdhcp_core::{MacAddr, NamespacedName};

use crate::arp::{self, Answers, ArpError, CANARIES, Check, Evidence};
use crate::findings::{Finding, RECHECK, Reason};
use crate::lease_table::{LeaseTable, PoolSnapshot};
use crate::suspects::{SuspectKind, Suspects};

/// DECLINEs of a reserved address, by what their check found: another host answered (the
/// address is withheld and the conflict reported), it did not (nothing changes: nobody, the
/// reservation's own client, a proxy-NDP responder, or a host at its conflict limit answered),
/// or no probe was sent (too many in flight, or the socket failed). For `/metrics`.
#[derive(Debug, Default)]
pub struct Declines {
    /// Another host uses the address.
    pub confirmed: AtomicU64,
    /// Nothing changes.
    pub unconfirmed: AtomicU64,
    /// Not checked.
    pub not_probed: AtomicU64,
}

/// Most Neighbor Solicitation probes in flight per interface, of DECLINEs and rechecks
/// together; more DECLINEs meanwhile are counted and change nothing, more rechecks wait.
const MAX_PROBES: usize = 4;
/// How long a check listens for advertisements of the address, from its first solicitation.
///
/// A check ends as soon as it is decided (a host answered every solicitation, or the holder
/// answered), within milliseconds of the last solicitation on a quiet link: a DHCPv6 client
/// that declined an address solicits again within a second (unlike a DHCPv4 one, which waits
/// 10 s), and a squatter's address should be withheld by then. A client whose SOLICIT comes
/// sooner is offered the address once more, declines it once more, and is moved then.
const PROBE_WAIT: Duration = Duration::from_millis(500);
/// Time between the [`arp::PROBE_NUM`] solicitations of one check.
const PROBE_INTERVAL: Duration = Duration::from_millis(50);
/// How long a declined address that another host answered for is withheld here (the
/// controller's record, once it arrives, withholds it for as long as the conflict lasts).
const DECLINE_HOLD: Duration = Duration::from_secs(60);
/// Stack of a probe thread. It only sends and reads small frames, but the allocator (jemalloc)
/// sets up its per-thread cache on the thread's first allocation, which overflowed 64 KiB in a
/// debug build; the pages are only mapped, not used, and the threads are bounded.
const PROBE_STACK: usize = 256 * 1024;

/// The probes of one interface running now, by address: at most [`MAX_PROBES`], one per
/// address, so a flood of DECLINEs or a long list of recorded conflicts costs no more threads.
#[derive(Debug, Default)]
pub(super) struct InFlight {
    running: Mutex<HashSet<Ipv6Addr>>,
}

/// Whether a probe of an address may start.
#[derive(Debug)]
pub(super) enum Claim {
    /// It may; the address's place is held until the [`Slot`] is dropped.
    Granted(Slot),
    /// A probe of that address runs already.
    Running,
    /// [`MAX_PROBES`] run already.
    Busy,
}

/// A running probe's place in [`InFlight`], given back when dropped: when its probe ends, and
/// also when its thread cannot start or panics, so a place is never lost.
#[derive(Debug)]
pub(super) struct Slot {
    in_flight: Arc<InFlight>,
    ip: Ipv6Addr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.in_flight.running.lock().remove(&self.ip);
    }
}

impl InFlight {
    fn claim(self: &Arc<Self>, ip: Ipv6Addr) -> Claim {
        let mut running = self.running.lock();
        if running.contains(&ip) {
            return Claim::Running;
        }
        if running.len() >= MAX_PROBES {
            return Claim::Busy;
        }
        running.insert(ip);
        Claim::Granted(Slot {
            in_flight: Arc::clone(self),
            ip,
        })
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.running.lock().len()
    }
}

/// Runs `job` on a small thread of its own, holding `slot` until it ends; returns whether the
/// thread started.
fn spawn_probe(slot: Slot, job: impl FnOnce() + Send + 'static) -> bool {
    let span = tracing::Span::current();
    let started = std::thread::Builder::new()
        .name("ns-probe".into())
        .stack_size(PROBE_STACK)
        .spawn(move || {
            let _held = slot;
            let _in = span.enter();
            job();
        });
    match started {
        Ok(_) => true,
        Err(error) => {
            warn!(%error, "no thread for a Neighbor Solicitation probe");
            false
        }
    }
}

/// What a DECLINE's check found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DeclineVerdict {
    /// Another host uses the address: withheld, reported.
    Conflict(MacAddr),
    /// The reservation's own client answered: it uses its address, so the DECLINE was forged
    /// or stale.
    HolderAnswers,
    /// Nobody answered every probe: stale or forged.
    NoAnswer,
    /// Only a proxy-NDP responder answered.
    Proxy(MacAddr),
    /// The answering host holds [`MAX_CONFLICTS_PER_HOST`] conflicts already.
    Capped(MacAddr),
    /// The probe could not be sent.
    Unverifiable,
}

impl DeclineVerdict {
    /// The verdict on a DECLINE, from what its check found.
    fn of(evidence: &Result<Evidence, ArpError>) -> Self {
        match evidence {
            Err(_) => DeclineVerdict::Unverifiable,
            Ok(Evidence::Holder) => DeclineVerdict::HolderAnswers,
            Ok(Evidence::Nobody) => DeclineVerdict::NoAnswer,
            Ok(Evidence::Taken(host)) => DeclineVerdict::Conflict(*host),
            Ok(Evidence::Proxy(host)) => DeclineVerdict::Proxy(*host),
            Ok(Evidence::Capped(host)) => DeclineVerdict::Capped(*host),
        }
    }
}

/// The probe as a check sends it: on an interface, for some addresses, until what was heard is
/// enough ([`arp::probe6`]; a stand-in in tests).
trait Prober6:
    Fn(&str, &[Ipv6Addr], &dyn Fn(&Answers<Ipv6Addr>) -> bool) -> Result<Answers<Ipv6Addr>, ArpError>
{
}
impl<F> Prober6 for F where
    F: Fn(
        &str,
        &[Ipv6Addr],
        &dyn Fn(&Answers<Ipv6Addr>) -> bool,
    ) -> Result<Answers<Ipv6Addr>, ArpError>
{
}

/// The real probe: [`arp::probe6`], [`PROBE_INTERVAL`] apart, listening [`PROBE_WAIT`].
fn ndp_probe(
    interface: &str,
    targets: &[Ipv6Addr],
    enough: &dyn Fn(&Answers<Ipv6Addr>) -> bool,
) -> Result<Answers<Ipv6Addr>, ArpError> {
    arp::probe6(interface, targets, PROBE_INTERVAL, PROBE_WAIT, enough)
}

/// Finds out who uses `check.ip` (see [`Evidence`]): the holder answering any of the
/// solicitations settles it; otherwise a host must answer every one, then is asked about [`CANARIES`]
/// addresses of the pool's IPv6 subnet nobody holds, answering [`arp::PROXY_CANARY_ANSWERS`] of
/// which makes it a proxy-NDP responder (reported to `suspects`); with `check.cap`, a host
/// holding [`MAX_CONFLICTS_PER_HOST`] of the pool's IPv6 addresses in conflict here makes no
/// more. Blocking: up to two probe windows.
fn investigate(
    probe: &impl Prober6,
    table: &LeaseTable,
    suspects: Option<&Suspects>,
    check: Check<'_, Ipv6Addr>,
) -> Result<Evidence, ArpError> {
    let Check {
        interface,
        pool,
        ip,
        holder,
        cap,
    } = check;
    let canaries = || {
        table
            .pool(pool)
            .map(|snapshot| canaries6(&snapshot, ip, CANARIES))
            .unwrap_or_default()
    };
    let held = |other: MacAddr| {
        table
            .findings()
            .of(pool)
            .iter()
            .filter(|(at, f)| {
                matches!(at, IpAddr::V6(v6) if *v6 != ip) && f.answered_by == Some(other)
            })
            .count()
    };
    let inquiry = arp::Inquiry {
        ip,
        holder,
        // A client that declined solicits again within a second: decided as soon as another
        // host answered every solicitation.
        end_when_taken: true,
        known_proxy: &|_| false,
        canaries: &canaries,
        held: cap.then_some(&held as &dyn Fn(MacAddr) -> usize),
    };
    let evidence = arp::weigh(|ips, done| probe(interface, ips, done), &inquiry)?;
    match evidence {
        Evidence::Proxy(other) => {
            let detail = format!(
                "answers Neighbor Solicitations for {ip} and for IPv6 addresses nobody holds"
            );
            if suspects.is_none_or(|s| {
                s.record(pool, SuspectKind::ProxyNdpResponder, other, None, &detail)
            }) {
                warn!(%pool, mac = %other, %ip, "a host answers Neighbor Solicitations for addresses nobody holds: a proxy-NDP responder, its answers make no conflict");
            }
        }
        Evidence::Capped(other) => {
            warn!(%pool, mac = %other, %ip, "a host answers for one more IPv6 address but holds {MAX_CONFLICTS_PER_HOST} in conflict already: no more");
        }
        Evidence::Holder | Evidence::Taken(_) | Evidence::Nobody => {}
    }
    Ok(evidence)
}

/// Up to `n` addresses of `pool`'s IPv6 subnet that nobody should answer for: not `ip`, not the
/// server, the router or a DNS server, not reserved, not recorded as conflicted. Spread over the
/// subnet from a point that depends on `ip`, so that a host cannot know them in advance from
/// the pool alone.
fn canaries6(pool: &PoolSnapshot, ip: Ipv6Addr, n: usize) -> Vec<Ipv6Addr> {
    let Some(v6) = pool.config().ipv6.as_ref() else {
        return Vec::new();
    };
    let bits = 128 - u32::from(v6.subnet.prefix_len());
    // A subnet wider than 2^64 is walked in its first 2^64 hosts.
    let hosts: u128 = if bits >= 64 {
        u128::from(u64::MAX)
    } else {
        (1u128 << bits).saturating_sub(1)
    };
    let seed = u128::from(ip).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let taken = |c: u128| {
        let candidate = Ipv6Addr::from(c);
        candidate == ip
            || candidate == v6.server_ip
            || v6.router == Some(candidate)
            || v6.dns.contains(&candidate)
            || v6.conflicted.contains(&candidate)
            || pool.ipv6_holder_of(&candidate).is_some()
    };
    arp::spread(u128::from(v6.subnet.network()), hosts, seed, n, taken)
        .into_iter()
        .map(Ipv6Addr::from)
        .collect()
}

/// A DECLINE costs nothing until checked ([`investigate`], in the background); only evidence
/// that another host uses the address withholds it (for [`DECLINE_HOLD`]) and records the
/// conflict for the controller. A tenant forging DECLINEs in a VM's name, relayed or direct,
/// and answering the solicitations itself, withholds nothing while the VM answers for its
/// address, and nothing beyond [`MAX_CONFLICTS_PER_HOST`] per MAC it answers with steadily.
/// A DECLINE for an address whose probe runs already changes nothing: that probe answers for it.
pub(super) fn verify_decline(
    interface: &str,
    pool: &NamespacedName,
    addr: Ipv6Addr,
    client: Option<MacAddr>,
    context: &Context,
    in_flight: &Arc<InFlight>,
) {
    let slot = match in_flight.claim(addr) {
        Claim::Granted(slot) => slot,
        Claim::Running => {
            debug!(%interface, %pool, %addr, mac = ?client, "IPv6 address declined while a probe of it runs");
            return;
        }
        Claim::Busy => {
            context.counters.not_probed.fetch_add(1, Ordering::Relaxed);
            warn!(%interface, %pool, %addr, mac = ?client, "IPv6 address declined; too many probes in flight, not checked");
            return;
        }
    };
    let (interface, pool, context2) = (interface.to_owned(), pool.clone(), context.clone());
    let started = spawn_probe(slot, move || {
        let Context {
            table,
            counters,
            suspects,
        } = &context2;
        let check = Check {
            interface: &interface,
            pool: &pool,
            ip: addr,
            holder: client,
            cap: true,
        };
        let evidence = investigate(&ndp_probe, table, suspects.as_deref(), check);
        if let Err(error) = &evidence {
            warn!(%interface, %pool, %addr, mac = ?client, %error, "IPv6 address declined; it could not be checked");
        }
        apply_decline(
            &pool,
            addr,
            client,
            DeclineVerdict::of(&evidence),
            table,
            counters,
        );
    });
    if !started {
        context.counters.not_probed.fetch_add(1, Ordering::Relaxed);
    }
}

/// What a DECLINE's check needs besides the address: where verdicts go.
#[derive(Clone)]
pub(super) struct Context {
    /// The leases, withheld addresses and findings.
    pub(super) table: Arc<LeaseTable>,
    /// Where DECLINE verdicts are counted.
    pub(super) counters: Arc<Declines>,
    /// Where proxy-NDP responders are reported.
    pub(super) suspects: Option<Arc<Suspects>>,
}

/// Applies the verdict on a DECLINE of `addr` of `pool` in the name of `client`: a conflict is
/// withheld here and recorded in the table's findings (reported; the controller records it in
/// `status.ipv6.conflicts`), as the DHCPv4 server does; nothing else changes anything.
fn apply_decline(
    pool: &NamespacedName,
    addr: Ipv6Addr,
    client: Option<MacAddr>,
    verdict: DeclineVerdict,
    table: &LeaseTable,
    counters: &Declines,
) {
    match verdict {
        DeclineVerdict::Conflict(host) => {
            counters.confirmed.fetch_add(1, Ordering::Relaxed);
            let withheld = table.withhold6(pool, addr, DECLINE_HOLD);
            table
                .findings()
                .record(pool, addr, Finding::conflict(client, host, Reason::Decline));
            warn!(%pool, %addr, mac = ?client, answered_by = %host, withheld, hold_s = DECLINE_HOLD.as_secs(), "IPv6 address declined, and another host answers for it: withheld, reported");
        }
        DeclineVerdict::HolderAnswers => {
            counters.unconfirmed.fetch_add(1, Ordering::Relaxed);
            warn!(%pool, %addr, mac = ?client, "IPv6 address declined in the name of its own holder, which answers for it: forged or stale, ignored");
        }
        DeclineVerdict::NoAnswer => {
            counters.unconfirmed.fetch_add(1, Ordering::Relaxed);
            info!(%pool, %addr, mac = ?client, "IPv6 address declined, but no host answers every solicitation for it: still served");
        }
        DeclineVerdict::Proxy(host) => {
            counters.unconfirmed.fetch_add(1, Ordering::Relaxed);
            info!(%pool, %addr, mac = ?client, proxy = %host, "IPv6 address declined, but only a proxy-NDP responder answers for it: still served");
        }
        DeclineVerdict::Capped(host) => {
            counters.unconfirmed.fetch_add(1, Ordering::Relaxed);
            warn!(%pool, %addr, mac = ?client, answered_by = %host, "IPv6 address declined; the host answering for it holds {MAX_CONFLICTS_PER_HOST} addresses in conflict already: still served");
        }
        // Logged with its error where the probe failed.
        DeclineVerdict::Unverifiable => {
            counters.not_probed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// One recorded conflict to probe again: the address, and the client it is reserved for, if
/// any (whose own answer makes no conflict).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Target {
    ip: Ipv6Addr,
    holder: Option<MacAddr>,
}

/// The addresses of `pool`'s IPv6 side that the controller records as conflicted
/// (`status.ipv6.conflicts`), each with its reservation's holder.
fn recheck_targets(pool: &PoolSnapshot) -> Vec<Target> {
    pool.config()
        .ipv6
        .as_ref()
        .map(|v6| {
            v6.conflicted
                .iter()
                .map(|ip| Target {
                    ip: *ip,
                    holder: pool.ipv6_holder_of(ip),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The finding a recheck's evidence makes, as the DHCPv4 recheck's: another host answering
/// every solicitation (not the address's own client) keeps the conflict; nobody else, or only a
/// proxy-NDP responder, frees it; a probe that could not be sent says nothing.
fn recheck_finding(
    holder: Option<MacAddr>,
    evidence: &Result<Evidence, ArpError>,
) -> Option<Finding> {
    match evidence {
        Ok(Evidence::Taken(host) | Evidence::Capped(host)) => {
            Some(Finding::conflict(holder, *host, Reason::Recheck))
        }
        Ok(Evidence::Holder | Evidence::Nobody | Evidence::Proxy(_)) => Some(Finding::free(holder)),
        Err(_) => None,
    }
}

/// The rechecks of one interface's recorded conflicts: a round starts every [`RECHECK`] (the
/// first as soon as the interface serves, so a new leader learns at once which are free), and
/// its addresses are probed a few at a time as places in [`InFlight`] free up. Only the serving
/// loop holds it, so the rounds stop with the interface.
#[derive(Debug)]
pub(super) struct Rechecks {
    /// This round's addresses still to probe, next first.
    pending: VecDeque<Target>,
    /// When the next round is due.
    next_round: Instant,
}

impl Rechecks {
    pub(super) fn new(now: Instant) -> Self {
        Rechecks {
            pending: VecDeque::new(),
            next_round: now,
        }
    }

    /// Starts a round of the recorded conflicts of the pool `pool` returns, when one is due and
    /// the last one has been started in full. Without a config yet, the round waits for one.
    pub(super) fn start_round(
        &mut self,
        now: Instant,
        pool: impl FnOnce() -> Option<Arc<PoolSnapshot>>,
    ) {
        if now < self.next_round || !self.pending.is_empty() {
            return;
        }
        let Some(pool) = pool() else {
            return;
        };
        self.pending = recheck_targets(&pool).into();
        self.next_round = now + RECHECK;
    }

    /// Claims a probe for this round's addresses, in order, while [`MAX_PROBES`] do not run;
    /// an address probed already (a DECLINE's probe answers for it) leaves the round, the rest
    /// wait for places.
    pub(super) fn claim(&mut self, in_flight: &Arc<InFlight>) -> Vec<(Slot, Target)> {
        let mut claimed = Vec::new();
        while let Some(target) = self.pending.front().copied() {
            match in_flight.claim(target.ip) {
                Claim::Granted(slot) => claimed.push((slot, target)),
                Claim::Running => {}
                Claim::Busy => break,
            }
            self.pending.pop_front();
        }
        claimed
    }
}

/// Probes one recorded conflict of `pool` again on `interface`, in the background, recording in
/// the table's findings who answers: another host (the conflict stands) or nobody but the
/// address's own client (it is free: withheld no longer, and the controller clears it).
pub(super) fn recheck(
    interface: &str,
    pool: &NamespacedName,
    context: &Context,
    (slot, target): (Slot, Target),
) {
    let (interface, pool, context) = (interface.to_owned(), pool.clone(), context.clone());
    spawn_probe(slot, move || {
        let Target { ip, holder } = target;
        let table = &context.table;
        let check = Check {
            interface: &interface,
            pool: &pool,
            ip,
            holder,
            cap: false,
        };
        let probed = investigate(&ndp_probe, table, context.suspects.as_deref(), check);
        let Some(finding) = recheck_finding(holder, &probed) else {
            if let Err(error) = probed {
                debug!(%interface, %pool, %ip, %error, "recorded IPv6 conflict not rechecked");
            }
            return;
        };
        match finding.answered_by {
            None => {
                info!(%interface, %pool, %ip, mac = ?holder, "an IPv6 address recorded as conflicted is free again")
            }
            Some(host) => {
                debug!(%interface, %pool, %ip, mac = ?holder, answered_by = %host, "an IPv6 address recorded as conflicted is still used by another host")
            }
        }
        table.findings().record(&pool, ip, finding);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pools::PoolLeases;
    use vmdhcp_core::fixtures::pool_config;
    use vmdhcp_core::pool::Binding;

    const VM: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const OTHER: MacAddr = MacAddr([2, 0, 0, 0, 0, 9]);

    fn ip6(n: u16) -> Ipv6Addr {
        Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, n)
    }

    /// A table serving `default/a`, dual-stack in fd00::/112, where VM holds fd00::10 and the
    /// controller records `conflicted` as used by another host.
    fn table(conflicted: Vec<Ipv6Addr>) -> Arc<LeaseTable> {
        let config = pool_config("default/a").with_ipv6(conflicted);
        let table = LeaseTable::new();
        let binding = Binding {
            ipv6: Some(ip6(0x10)),
            ..Binding::ip("192.0.2.10".parse().unwrap())
        };
        let errors = table.apply_snapshot(&[PoolLeases {
            leases: [(VM, binding)].into(),
            config,
        }]);
        assert!(errors.is_empty(), "{errors:?}");
        Arc::new(table)
    }

    fn pool() -> NamespacedName {
        "default/a".parse().unwrap()
    }

    fn no_socket() -> ArpError {
        ArpError::Socket {
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
            missing: crate::capability::Missing(None),
        }
    }

    /// Who answers for what in each round of a probe.
    type Hosts<'a> = dyn Fn(&[Ipv6Addr], u8) -> Vec<(MacAddr, Ipv6Addr)> + 'a;

    /// A stand-in for the network: `hosts(targets, round)` says who answers for what in each
    /// round of a probe.
    fn network(hosts: impl Fn(&[Ipv6Addr], u8) -> Vec<(MacAddr, Ipv6Addr)>) -> impl Prober6 {
        move |_, targets, _| {
            let mut answers = Answers::default();
            for round in 0..arp::PROBE_NUM {
                for (mac, ip) in hosts(targets, round) {
                    answers.record(mac, ip, round);
                }
            }
            Ok(answers)
        }
    }

    fn check(ip: Ipv6Addr, holder: Option<MacAddr>) -> Check<'static, Ipv6Addr> {
        static POOL: std::sync::OnceLock<NamespacedName> = std::sync::OnceLock::new();
        Check {
            interface: "srv0",
            pool: POOL.get_or_init(pool),
            ip,
            holder,
            cap: true,
        }
    }

    #[test]
    fn a_declined_address_is_in_conflict_only_on_evidence_a_tenant_cannot_fake_cheaply() {
        let table = table(vec![]);
        let suspects = Suspects::new(Duration::from_secs(60));
        let addr = ip6(0x10);
        let judge = |probe: &Hosts<'_>| {
            let evidence = investigate(
                &network(|t, r| probe(t, r)),
                &table,
                Some(&suspects),
                check(addr, Some(VM)),
            );
            DeclineVerdict::of(&evidence)
        };
        // Another host answering every solicitation, and only for the address: a conflict.
        let squatter = |t: &[Ipv6Addr], _| {
            t.iter()
                .filter(|ip| **ip == addr)
                .map(|ip| (OTHER, *ip))
                .collect()
        };
        assert_eq!(judge(&squatter), DeclineVerdict::Conflict(OTHER));
        // The VM answering for its address, even once beside a steady forger: it uses it.
        let answered = |t: &[Ipv6Addr], r: u8| {
            let mut heard: Vec<_> = t.iter().map(|ip| (OTHER, *ip)).collect();
            if r == 2 {
                heard.push((VM, addr));
            }
            heard
        };
        assert_eq!(judge(&answered), DeclineVerdict::HolderAnswers);
        // Not every round, or a new MAC every round: nobody.
        let twice = |t: &[Ipv6Addr], r: u8| if r < 2 { vec![(OTHER, t[0])] } else { vec![] };
        assert_eq!(judge(&twice), DeclineVerdict::NoAnswer);
        let rotating = |t: &[Ipv6Addr], r: u8| vec![(MacAddr([2, 0, 0, 0, 0xee, r]), t[0])];
        assert_eq!(judge(&rotating), DeclineVerdict::NoAnswer);
        assert!(suspects.current(&pool()).is_empty());
        // Answering for the canaries too: a proxy-NDP responder, reported, no conflict.
        let everything = |t: &[Ipv6Addr], _| t.iter().map(|ip| (OTHER, *ip)).collect();
        assert_eq!(judge(&everything), DeclineVerdict::Proxy(OTHER));
        let reported = suspects.current(&pool());
        assert_eq!(reported.len(), 1);
        assert_eq!(
            (reported[0].kind, reported[0].mac),
            (SuspectKind::ProxyNdpResponder, OTHER)
        );
        // A host holding the cap already: no more.
        for n in 0..MAX_CONFLICTS_PER_HOST {
            let held = ip6(0x40 + u16::try_from(n).unwrap());
            table.findings().record(
                &pool(),
                held,
                Finding::conflict(None, OTHER, Reason::Decline),
            );
        }
        assert_eq!(judge(&squatter), DeclineVerdict::Capped(OTHER));
        // A probe that cannot be sent.
        let failing =
            |_: &str, _: &[Ipv6Addr], _: &dyn Fn(&Answers<Ipv6Addr>) -> bool| Err(no_socket());
        let evidence = investigate(&failing, &table, None, check(addr, Some(VM)));
        assert_eq!(DeclineVerdict::of(&evidence), DeclineVerdict::Unverifiable);
    }

    #[test]
    fn canaries_are_free_addresses_of_the_subnet_that_depend_on_the_address() {
        let table = table(vec![ip6(0x20)]);
        let snapshot = table.pool(&pool()).unwrap();
        let v6 = snapshot.config().ipv6.clone().unwrap();
        let some = canaries6(&snapshot, ip6(0x10), CANARIES);
        assert_eq!(some.len(), CANARIES);
        for c in &some {
            assert!(v6.subnet.contains(c), "{c}");
            assert!(![ip6(0x10), ip6(0x20), v6.server_ip].contains(c), "{c}");
        }
        assert_ne!(some, canaries6(&snapshot, ip6(0x11), CANARIES));
    }

    #[test]
    fn a_confirmed_decline_is_withheld_and_recorded_for_the_controller_and_nothing_else_is() {
        let (table, counters) = (table(vec![]), Declines::default());
        let snapshot = table.pool(&pool()).unwrap();
        let addr = ip6(0x10);
        for verdict in [
            DeclineVerdict::NoAnswer,
            DeclineVerdict::HolderAnswers,
            DeclineVerdict::Unverifiable,
        ] {
            apply_decline(&pool(), addr, Some(VM), verdict, &table, &counters);
            assert!(!table.withholds6(&snapshot, &addr), "{verdict:?}");
            assert!(table.findings().of(&pool()).is_empty(), "{verdict:?}");
        }
        apply_decline(
            &pool(),
            addr,
            Some(VM),
            DeclineVerdict::Conflict(OTHER),
            &table,
            &counters,
        );
        assert!(table.is_withheld6(&pool(), &addr));
        assert!(table.withholds6(&snapshot, &addr));
        let found = table.findings().of(&pool());
        assert_eq!(found.len(), 1);
        let (ip, finding) = found[0];
        assert_eq!(
            (ip, finding.mac, finding.answered_by, finding.reason),
            (addr.into(), Some(VM), Some(OTHER), Reason::Decline)
        );
        let counted = |c: &AtomicU64| c.load(Ordering::Relaxed);
        assert_eq!(
            (
                counted(&counters.confirmed),
                counted(&counters.unconfirmed),
                counted(&counters.not_probed)
            ),
            (1, 2, 1)
        );
    }

    #[test]
    fn probes_are_bounded_one_per_address_and_give_their_place_back_when_done() {
        let in_flight = Arc::new(InFlight::default());
        let mut slots: Vec<Slot> = (0..MAX_PROBES as u16)
            .map(|n| match in_flight.claim(ip6(0x100 + n)) {
                Claim::Granted(slot) => slot,
                other => panic!("{other:?}"),
            })
            .collect();
        assert!(matches!(in_flight.claim(ip6(0x100)), Claim::Running));
        assert!(matches!(in_flight.claim(ip6(0x999)), Claim::Busy));
        assert_eq!(in_flight.len(), MAX_PROBES);
        // A probe ends (or its thread never started): its place is free again.
        slots.pop();
        assert!(matches!(in_flight.claim(ip6(0x999)), Claim::Granted(_)));
        drop(slots);
        assert_eq!(in_flight.len(), 0);
    }

    #[test]
    fn a_recheck_finds_a_recorded_conflict_free_unless_another_host_answers_for_it() {
        let taken = recheck_finding(Some(VM), &Ok(Evidence::Taken(OTHER))).unwrap();
        assert_eq!(
            (taken.mac, taken.answered_by, taken.reason),
            (Some(VM), Some(OTHER), Reason::Recheck)
        );
        let unreserved = recheck_finding(None, &Ok(Evidence::Taken(OTHER))).unwrap();
        assert_eq!(
            (unreserved.mac, unreserved.answered_by),
            (None, Some(OTHER))
        );
        // Nobody, only the address's own client, or a proxy: free.
        for heard in [Evidence::Nobody, Evidence::Holder, Evidence::Proxy(OTHER)] {
            let free = recheck_finding(Some(VM), &Ok(heard)).unwrap();
            assert_eq!(
                (free.mac, free.answered_by, free.reason),
                (Some(VM), None, Reason::Recheck)
            );
        }
        assert_eq!(recheck_finding(Some(VM), &Err(no_socket())), None);

        // Recorded, a free verdict gives the address again until the controller clears it; a
        // conflict keeps it withheld.
        let table = table(vec![ip6(0x10), ip6(0x20)]);
        let snapshot = table.pool(&pool()).unwrap();
        assert!(table.withholds6(&snapshot, &ip6(0x10)));
        table
            .findings()
            .record(&pool(), ip6(0x10), Finding::free(Some(VM)));
        table.findings().record(&pool(), ip6(0x20), taken);
        assert!(!table.withholds6(&snapshot, &ip6(0x10)));
        assert!(table.withholds6(&snapshot, &ip6(0x20)));
    }

    /// The targets of `claimed`, in order.
    fn targets(claimed: &[(Slot, Target)]) -> Vec<Target> {
        claimed.iter().map(|(_, t)| *t).collect()
    }

    #[test]
    fn each_recorded_conflict_is_rechecked_with_its_holder_a_few_at_a_time_every_recheck() {
        let conflicted: Vec<Ipv6Addr> = (0..6).map(|n| ip6(0x10 + n)).collect();
        let table = table(conflicted.clone());
        let snapshot = || table.pool(&pool());
        let want: Vec<Target> = conflicted
            .iter()
            .map(|ip| Target {
                ip: *ip,
                holder: (*ip == ip6(0x10)).then_some(VM),
            })
            .collect();
        assert_eq!(recheck_targets(&table.pool(&pool()).unwrap()), want);

        let in_flight = Arc::new(InFlight::default());
        let start = Instant::now();
        let mut rechecks = Rechecks::new(start);
        // No config yet: the round waits for one.
        rechecks.start_round(start, || None);
        assert!(rechecks.claim(&in_flight).is_empty());
        rechecks.start_round(start, snapshot);
        // A DECLINE's probe of one address runs: it answers for that address this round.
        let Claim::Granted(decline) = in_flight.claim(ip6(0x11)) else {
            panic!("nothing runs yet");
        };
        let first = rechecks.claim(&in_flight);
        assert_eq!(targets(&first), [want[0], want[2], want[3]]);
        assert!(rechecks.claim(&in_flight).is_empty(), "every place taken");
        // A probe ends: the next address takes its place; the round is not over.
        drop(decline);
        let second = rechecks.claim(&in_flight);
        assert_eq!(targets(&second), [want[4]]);
        let later = start + RECHECK;
        rechecks.start_round(later, snapshot);
        drop(first);
        let third = rechecks.claim(&in_flight);
        assert_eq!(targets(&third), [want[5]]);
        assert!(rechecks.claim(&in_flight).is_empty(), "the round is done");
        drop((second, third));
        // The next round is due RECHECK after the last one started, and not before.
        let mut asked = false;
        rechecks.start_round(later - Duration::from_millis(1), || {
            asked = true;
            None
        });
        assert!(!asked);
        rechecks.start_round(later, snapshot);
        assert_eq!(targets(&rechecks.claim(&in_flight)), want[..MAX_PROBES]);
    }

    #[test]
    fn a_pool_without_an_ipv6_side_has_nothing_to_recheck() {
        let table = LeaseTable::new();
        table.apply_snapshot(&[PoolLeases::new(pool_config("default/a"))]);
        assert!(recheck_targets(&table.pool(&pool()).unwrap()).is_empty());
    }
}
