//! ARP probes (RFC 5227) for the two moments an address may turn out to be someone else's:
//! before its first OFFER to a MAC, and when a client DECLINEs it.
//!
//! **Before the first OFFER.** An address is offered to a MAC only after a probe on the pool's
//! interface finds nobody else using it: the OFFER waits at most [`PROBE_WAIT`], once per
//! address and MAC while this agent serves (renewals, INIT-REBOOT, later DISCOVERs and relayed
//! clients, which are on another link, are not probed). An address another host answers for is not offered: it is withheld for
//! [`CONFLICT_HOLD`] (see below). A probe that cannot be sent (no CAP_NET_RAW), or one more than
//! [`MAX_PROBES`] running, does not hold the OFFER back: serving comes first.
//!
//! **A DECLINE.** DHCP has no authentication: any host on the VM network can send a DECLINE in
//! any VM's name. Taken at its word, one forged DECLINE would withhold that VM's reserved address
//! and lock it out. So a DECLINE is checked before it costs anything, and judged by who answers:
//!
//! | who answers the probes ([`PROBE_WAIT`]) | verdict | the address |
//! |---|---|---|
//! | the reservation's own MAC, at any time in the window | [`Verdict::HolderAnswers`]: the VM uses its address, so the DECLINE was forged or stale, whatever else answered | served; an earlier hold ends |
//! | another host, every probe ([`Evidence::Taken`]) | [`Verdict::Conflict`]: someone else uses it | withheld for [`CONFLICT_HOLD`], then offered again (a client that still finds it taken declines again, and is checked again) |
//! | a proxy-ARP responder ([`Evidence::Proxy`]) | [`Verdict::Proxy`]: it answers for addresses nobody holds | served |
//! | a host already holding [`MAX_CONFLICTS_PER_HOST`] of the pool's addresses in conflict | [`Verdict::Capped`] | served |
//! | nobody, or not every probe | [`Verdict::NoAnswer`]: stale or forged | served; an earlier hold ends (the squatter left) |
//! | the probe cannot be sent (no CAP_NET_RAW) | [`Verdict::Unverifiable`] | withheld for [`UNVERIFIED_HOLD`], the 10 s a declining client waits anyway (RFC 2131 §3.1.5) |
//! | [`MAX_PROBES`] probes already running | [`Verdict::Busy`]: not checked | served as before |
//!
//! So a forged DECLINE withholds nothing, or, with probes impossible, at most
//! [`UNVERIFIED_HOLD`]; only a host that answers ARP for the address itself (which already takes
//! the address away from the VM at layer 2) makes a hold, [`CONFLICT_HOLD`] at a time.
//!
//! **Evidence a tenant cannot fake cheaply.** Any host on the segment can send any frame, so an
//! answer counts only when it holds up ([`crate::arp::answer_of`]): an ARP reply to the probe
//! sent (or an announcement of the address) whose Ethernet source is its sender hardware
//! address. A conflict needs one host to answer each of the [`arp::PROBE_NUM`] probes
//! ([`PROBE_INTERVAL`] apart), not one frame. The address's own client answering at any time in
//! the window settles it: it uses the address. A host that answers is then asked about
//! [`CANARIES`] addresses of the pool's subnet that nobody holds; answering for
//! [`PROXY_CANARY_ANSWERS`] of them makes it a proxy-ARP responder (a router with proxy ARP
//! on, or a tenant answering for everything): its answers make no conflict, it is remembered for
//! [`PROXY_MEMORY`] from its last answer ([`Probes::proxies`], reported to the controller), and
//! later answers of it skip the canaries. And no answering host holds more than
//! [`MAX_CONFLICTS_PER_HOST`] of a pool's addresses in conflict on this agent, so none can drain
//! a pool: what a tenant can keep from others is the addresses it really answers for at layer 2,
//! up to that number.
//!
//! **What lasts is the controller's.** Every conflict found here (an offer probe or a DECLINE
//! another host answers for) is also recorded in the table's [`crate::findings`] and reported;
//! the controller records it in the pool's status, moves a dynamic VM elsewhere, and streams
//! the recorded addresses back: they are withheld by every agent, across failovers and
//! restarts, and the serving agent probes them again ([`Probes::recheck`]) so one found free is
//! cleared.
//!
//! **Bounds.** At most [`MAX_PROBES`] probes run at once, one per address, each a small thread
//! that lives at most twice [`PROBE_WAIT`] (the canaries' window follows the address's); at most
//! [`MAX_PROXIES`] proxy-ARP responders are remembered; the record of addresses probed clean holds at most
//! [`MAX_CLEAN`] entries (when full it starts over, which costs a re-probe of first OFFERs
//! only). A flood of DISCOVERs or DECLINEs costs neither memory nor threads beyond that.

use std::collections::{HashMap, HashSet};
use std::marker::PhantomData;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use tracing::{debug, info, warn};
use vmdhcp_core::{MacAddr, NamespacedName};

use crate::arp::{self, Answers, ArpError, Check, Evidence};
use crate::findings::{Finding, Reason};
use crate::lease_table::{LeaseTable, PoolSnapshot};
use crate::suspects::{SuspectKind, Suspects};

mod verdicts;

pub use verdicts::*;

/// How long a probe waits for an answer (RFC 5227's PROBE_WAIT is 1 s; hosts on one L2 answer
/// within milliseconds).
pub const PROBE_WAIT: Duration = Duration::from_millis(500);
/// How long an address another host answers for is withheld before it is offered again.
pub const CONFLICT_HOLD: Duration = Duration::from_secs(60);
/// How long a DECLINE that cannot be checked withholds the address.
pub const UNVERIFIED_HOLD: Duration = Duration::from_secs(10);
/// Time between the [`arp::PROBE_NUM`] probes of one check (RFC 5227 spaces them 1–2 s; hosts
/// on one L2 answer within milliseconds, and a first OFFER waits for the check).
pub const PROBE_INTERVAL: Duration = Duration::from_millis(150);
pub use crate::arp::{CANARIES, PROXY_CANARY_ANSWERS};
/// How long a proxy-ARP responder is remembered after its last answer.
pub const PROXY_MEMORY: Duration = Duration::from_secs(600);
/// Most proxy-ARP responders remembered (the oldest go first).
pub const MAX_PROXIES: usize = 64;
/// Most of one pool's addresses one answering host can hold in conflict (the controller applies
/// the same number to what it records).
pub use vmdhcp_core::pool::MAX_CONFLICTS_PER_HOST;
/// Most probes running at once, across every interface.
pub const MAX_PROBES: usize = 32;
/// Most (address, MAC) pairs remembered as probed clean.
pub const MAX_CLEAN: usize = 65_536;
/// Stack of a probe thread. It only sends and reads small frames, but the allocator (jemalloc)
/// sets up its per-thread cache on the thread's first allocation, which overflowed 64 KiB in a
/// debug build; the pages are only mapped, not used, and the threads are bounded.
const PROBE_STACK: usize = 256 * 1024;

/// What became of a request for a probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Spawned {
    /// The probe runs.
    Started,
    /// A probe of that address already runs.
    Running,
    /// [`MAX_PROBES`] run already, or no thread could be started.
    Busy,
}

/// The probes running, the addresses probed clean and the proxy-ARP responders found, shared by
/// every interface's server.
#[derive(Debug, Default)]
pub struct Probes {
    running: Mutex<HashSet<(NamespacedName, Ipv4Addr)>>,
    clean: Mutex<HashSet<(NamespacedName, Ipv4Addr, MacAddr)>>,
    proxies: Mutex<HashMap<(NamespacedName, MacAddr), Instant>>,
    /// Where proxy-ARP responders are reported (to the controller and `/metrics`).
    suspects: Option<Arc<Suspects>>,
}

type ProbeResult = Result<Answers, ArpError>;

/// The probe as a check sends it: on an interface, for some addresses, until what was heard is
/// enough ([`arp::probe`]; a stand-in in tests).
pub trait Prober: Fn(&str, &[Ipv4Addr], &dyn Fn(&Answers) -> bool) -> ProbeResult {}
impl<F: Fn(&str, &[Ipv4Addr], &dyn Fn(&Answers) -> bool) -> ProbeResult> Prober for F {}

/// The real probe: [`arp::probe`] with [`PROBE_INTERVAL`] and [`PROBE_WAIT`].
fn arp_probe(
    interface: &str,
    targets: &[Ipv4Addr],
    enough: &dyn Fn(&Answers) -> bool,
) -> ProbeResult {
    arp::probe(interface, targets, PROBE_INTERVAL, PROBE_WAIT, enough)
}

/// Up to `n` addresses of `pool`'s subnet that nobody should answer for: not `ip`, not the
/// server, the router or a DNS server, not reserved, not recorded as conflicted. Spread over the
/// subnet from a point that depends on `ip`, so that a host cannot know them in advance from
/// the pool alone.
pub fn canaries(pool: &PoolSnapshot, ip: Ipv4Addr, n: usize) -> Vec<Ipv4Addr> {
    let config = pool.config();
    let subnet = config.subnet;
    let hosts = (1u128 << (32 - u32::from(subnet.prefix_len()))).saturating_sub(2);
    let network = u128::from(u32::from(subnet.network()));
    let seed = u128::from(u32::from(ip)) * 2_654_435_761;
    let taken = |candidate: Ipv4Addr| {
        candidate == ip
            || candidate == config.server_ip
            || config.router == Some(candidate)
            || config.dns.contains(&candidate)
            || config.conflicted.contains(&candidate)
            || pool.holder_of(&candidate).is_some()
    };
    let v4 = |c: u128| u32::try_from(c).ok().map(Ipv4Addr::from);
    arp::spread(network, hosts, seed, n, |c| v4(c).is_none_or(taken))
        .into_iter()
        .filter_map(v4)
        .collect()
}

impl Probes {
    /// Probes that report the proxy-ARP responders they find to `suspects`.
    pub fn reporting_to(suspects: Arc<Suspects>) -> Self {
        Probes {
            suspects: Some(suspects),
            ..Probes::default()
        }
    }

    /// Finds out who uses `ip` of `pool` on `interface` (see the module docs): `holder` is the
    /// client the address is reserved for, whose answer settles it; with `cap`, a host that
    /// holds [`MAX_CONFLICTS_PER_HOST`] of the pool's addresses in conflict already makes no
    /// more. Blocking: up to two probe windows.
    fn investigate(
        &self,
        probe: &impl Prober,
        table: &LeaseTable,
        check: Check<'_, Ipv4Addr>,
    ) -> Result<Evidence, ArpError> {
        let Check {
            interface,
            pool,
            ip,
            holder,
            cap,
        } = check;
        let known_proxy = |m: MacAddr| self.remembers_proxy(pool, m);
        let canaries = || {
            table
                .pool(pool)
                .map(|snapshot| canaries(&snapshot, ip, CANARIES))
                .unwrap_or_default()
        };
        let held = |other: MacAddr| {
            table.conflicts().get(pool).map_or(0, |conflicts| {
                conflicts
                    .iter()
                    .filter(|(held, c)| **held != ip && c.answered_by == Some(other) && c.holds())
                    .count()
            })
        };
        let inquiry = arp::Inquiry {
            ip,
            holder,
            end_when_taken: false,
            known_proxy: &known_proxy,
            canaries: &canaries,
            held: cap.then_some(&held as &dyn Fn(MacAddr) -> usize),
        };
        let evidence = arp::weigh(|ips, done| probe(interface, ips, done), &inquiry)?;
        match evidence {
            Evidence::Proxy(other) => self.note_proxy(pool, other, ip),
            Evidence::Capped(other) => {
                warn!(pool = %pool, mac = %other, %ip, "a host answers ARP for one more address but holds {MAX_CONFLICTS_PER_HOST} in conflict already: no more");
            }
            Evidence::Holder | Evidence::Taken(_) | Evidence::Nobody => {}
        }
        Ok(evidence)
    }

    fn remembers_proxy(&self, pool: &NamespacedName, mac: MacAddr) -> bool {
        let mut proxies = self.proxies.lock();
        let key = (pool.clone(), mac);
        match proxies.get(&key) {
            Some(seen) if seen.elapsed() < PROXY_MEMORY => {
                proxies.insert(key, Instant::now());
                true
            }
            Some(_) => {
                proxies.remove(&key);
                false
            }
            None => false,
        }
    }

    fn note_proxy(&self, pool: &NamespacedName, mac: MacAddr, ip: Ipv4Addr) {
        if let Some(suspects) = &self.suspects {
            let detail = format!("answers ARP for {ip} and for addresses nobody holds");
            if suspects.record(pool, SuspectKind::ProxyArpResponder, mac, None, &detail) {
                warn!(pool = %pool, %mac, %ip, "a host answers ARP for addresses nobody holds: a proxy-ARP responder, its answers make no conflict");
            }
        }
        let mut proxies = self.proxies.lock();
        proxies.retain(|_, seen| seen.elapsed() < PROXY_MEMORY);
        if proxies.len() >= MAX_PROXIES
            && let Some(oldest) = proxies
                .iter()
                .min_by_key(|(_, seen)| **seen)
                .map(|(k, _)| k.clone())
        {
            proxies.remove(&oldest);
        }
        proxies.insert((pool.clone(), mac), Instant::now());
    }

    /// The proxy-ARP responders found on `pool` and seen within [`PROXY_MEMORY`], with how long
    /// ago each last answered.
    pub fn proxies(&self, pool: &NamespacedName) -> Vec<(MacAddr, Duration)> {
        let proxies = self.proxies.lock();
        let mut found: Vec<_> = proxies
            .iter()
            .filter(|((p, _), seen)| p == pool && seen.elapsed() < PROXY_MEMORY)
            .map(|((_, mac), seen)| (*mac, seen.elapsed()))
            .collect();
        found.sort();
        found
    }

    /// Whether `ip` of `pool` may be offered to `mac` now without a probe: probed clean before.
    pub fn is_clean(&self, pool: &NamespacedName, ip: Ipv4Addr, mac: MacAddr) -> bool {
        self.clean.lock().contains(&(pool.clone(), ip, mac))
    }

    fn mark_clean(&self, pool: &NamespacedName, ip: Ipv4Addr, mac: MacAddr) {
        let mut clean = self.clean.lock();
        if clean.len() >= MAX_CLEAN {
            clean.clear();
        }
        clean.insert((pool.clone(), ip, mac));
    }

    /// Probes `offer.ip`, then calls `send` (which sends the held OFFER) unless another host
    /// answered, in which case the address is withheld in `table`. Returns whether the OFFER
    /// must be sent now, unprobed (no probe could run) rather than by the probe.
    pub fn probe_offer(
        self: &Arc<Self>,
        offer: PendingOffer,
        table: Arc<LeaseTable>,
        counts: Arc<OfferCounts>,
        send: impl FnOnce() + Send + 'static,
    ) -> bool {
        self.probe_offer_with(offer, table, counts, send, arp_probe)
    }

    fn probe_offer_with(
        self: &Arc<Self>,
        offer: PendingOffer,
        table: Arc<LeaseTable>,
        counts: Arc<OfferCounts>,
        send: impl FnOnce() + Send + 'static,
        probe: impl Prober + Send + 'static,
    ) -> bool {
        let key = (offer.pool.clone(), offer.ip);
        let me = Arc::clone(self);
        let counted = Arc::clone(&counts);
        let job = move || {
            let PendingOffer {
                interface,
                pool,
                ip,
                mac,
            } = &offer;
            let check = Check {
                interface,
                pool,
                ip: *ip,
                holder: Some(*mac),
                cap: true,
            };
            let verdict = match me.investigate(&probe, &table, check) {
                Ok(Evidence::Taken(other)) => {
                    table.mark_conflicted(pool, *ip, *mac, Some(other), CONFLICT_HOLD);
                    table.findings().record(
                        pool,
                        *ip,
                        Finding::conflict(Some(*mac), other, Reason::Offer),
                    );
                    warn!(%mac, %ip, answered_by = %other, hold_s = CONFLICT_HOLD.as_secs(), "address in use by another host: not offered, withheld");
                    OfferVerdict::Conflict
                }
                Ok(Evidence::Proxy(_)) => {
                    send();
                    OfferVerdict::Proxy
                }
                Ok(Evidence::Capped(_)) => {
                    send();
                    OfferVerdict::Capped
                }
                Ok(Evidence::Holder | Evidence::Nobody) => {
                    me.mark_clean(pool, *ip, *mac);
                    send();
                    OfferVerdict::Clean
                }
                Err(error) => {
                    debug!(%mac, %ip, %error, "address not probed: offered unprobed");
                    send();
                    OfferVerdict::Unverifiable
                }
            };
            counted.record(verdict);
        };
        match self.spawn(key, job) {
            Spawned::Started | Spawned::Running => false,
            Spawned::Busy => {
                counts.record(OfferVerdict::Busy);
                true
            }
        }
    }

    /// Checks `declined` in the background and applies the verdict to `table`, counting it in
    /// `counts`. A DECLINE for an address whose probe is still running is ignored.
    pub fn check_decline(
        self: &Arc<Self>,
        declined: Declined,
        table: Arc<LeaseTable>,
        counts: Arc<VerdictCounts>,
    ) {
        self.check_decline_with(declined, table, counts, arp_probe);
    }

    fn check_decline_with(
        self: &Arc<Self>,
        declined: Declined,
        table: Arc<LeaseTable>,
        counts: Arc<VerdictCounts>,
        probe: impl Prober + Send + 'static,
    ) {
        let key = (declined.pool.clone(), declined.ip);
        let (by, ip) = (declined.by, declined.ip);
        let counted = Arc::clone(&counts);
        let me = Arc::clone(self);
        let job = move || {
            let check = Check {
                interface: &declined.interface,
                pool: &declined.pool,
                ip: declined.ip,
                holder: Some(declined.by),
                cap: true,
            };
            let verdict = Verdict::of(&me.investigate(&probe, &table, check));
            apply(&declined, verdict, &table);
            counted.record(verdict);
        };
        if self.spawn(key, job) == Spawned::Busy {
            counts.record(Verdict::Busy);
            warn!(mac = %by, %ip, "DECLINE not checked: {MAX_PROBES} probes running; the address stays served");
        }
    }

    /// Probes again each address the controller records as conflicted on `pool` (served on
    /// `interface`), recording in `table`'s findings who answers: another host (the conflict
    /// stands) or nobody but the address's own client (it is free; the controller clears it).
    /// Addresses whose probe is running, or beyond [`MAX_PROBES`], wait for the next round.
    pub fn recheck(
        self: &Arc<Self>,
        interface: &str,
        pool: &PoolSnapshot,
        table: &Arc<LeaseTable>,
    ) {
        self.recheck_with(interface, pool, table, arp_probe);
    }

    fn recheck_with(
        self: &Arc<Self>,
        interface: &str,
        pool: &PoolSnapshot,
        table: &Arc<LeaseTable>,
        probe: impl Prober + Clone + Send + 'static,
    ) {
        let name = pool.config().pool.clone();
        for ip in pool.config().conflicted.iter().copied() {
            let holder = pool.holder_of(&ip);
            let (table, name2, interface, probe, me) = (
                Arc::clone(table),
                name.clone(),
                interface.to_owned(),
                probe.clone(),
                Arc::clone(self),
            );
            let job = move || {
                let check = Check {
                    interface: &interface,
                    pool: &name2,
                    ip,
                    holder,
                    cap: false,
                };
                let finding = match me.investigate(&probe, &table, check) {
                    Ok(Evidence::Taken(other) | Evidence::Capped(other)) => {
                        Finding::conflict(holder, other, Reason::Recheck)
                    }
                    Ok(Evidence::Holder | Evidence::Nobody | Evidence::Proxy(_)) => {
                        Finding::free(holder)
                    }
                    Err(error) => {
                        debug!(%ip, %error, "recorded conflict not rechecked");
                        return;
                    }
                };
                if finding.answered_by.is_none() {
                    info!(%ip, "an address recorded as conflicted is free again");
                }
                table.findings().record(&name2, ip, finding);
            };
            if self.spawn((name.clone(), ip), job) == Spawned::Busy {
                return;
            }
        }
    }

    /// Runs `job` on a thread of its own, unless a probe of `key` runs already or
    /// [`MAX_PROBES`] do.
    fn spawn(
        self: &Arc<Self>,
        key: (NamespacedName, Ipv4Addr),
        job: impl FnOnce() + Send + 'static,
    ) -> Spawned {
        {
            let mut running = self.running.lock();
            if running.contains(&key) {
                return Spawned::Running;
            }
            if running.len() >= MAX_PROBES {
                return Spawned::Busy;
            }
            running.insert(key.clone());
        }
        let me = Arc::clone(self);
        let span = tracing::Span::current();
        let unwind = key.clone();
        let spawned = std::thread::Builder::new()
            .name("arp-probe".into())
            .stack_size(PROBE_STACK)
            .spawn(move || {
                let _in = span.enter();
                job();
                me.running.lock().remove(&key);
            });
        match spawned {
            Ok(_) => Spawned::Started,
            Err(error) => {
                warn!(%error, "no thread for an ARP probe");
                self.running.lock().remove(&unwind);
                Spawned::Busy
            }
        }
    }

    /// Probes running now.
    pub fn running(&self) -> usize {
        self.running.lock().len()
    }
}

/// Records the verdict on `declined` in the table and the log.
fn apply(declined: &Declined, verdict: Verdict, table: &LeaseTable) {
    let Declined { pool, ip, by, .. } = declined;
    match (verdict, verdict.hold()) {
        (Verdict::Conflict(other), Some(hold)) => {
            table.mark_conflicted(pool, *ip, *by, Some(other), hold);
            table.findings().record(
                pool,
                *ip,
                Finding::conflict(Some(*by), other, Reason::Decline),
            );
            warn!(mac = %by, %ip, answered_by = %other, hold_s = hold.as_secs(), "address declined and another host answers ARP for it: withheld");
        }
        (_, Some(hold)) => {
            table.mark_conflicted(pool, *ip, *by, None, hold);
            warn!(mac = %by, %ip, hold_s = hold.as_secs(), "address declined and cannot be probed (CAP_NET_RAW?): withheld briefly");
        }
        (Verdict::HolderAnswers, None) => {
            let cleared = table.clear_conflict(pool, *ip);
            warn!(mac = %by, %ip, cleared, "DECLINE in the name of the address's own holder, which answers ARP for it: forged or stale, ignored");
        }
        (Verdict::NoAnswer, None) => {
            let cleared = table.clear_conflict(pool, *ip);
            info!(mac = %by, %ip, cleared, "address declined but nobody answers ARP for it: stale or forged, still served");
        }
        (Verdict::Proxy(proxy), None) => {
            let cleared = table.clear_conflict(pool, *ip);
            info!(mac = %by, %ip, %proxy, cleared, "address declined but only a proxy-ARP responder answers for it: still served");
        }
        (Verdict::Capped(other), None) => {
            warn!(mac = %by, %ip, answered_by = %other, "address declined; the host answering for it holds {MAX_CONFLICTS_PER_HOST} addresses in conflict already: still served");
        }
        (_, None) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmdhcp_core::fixtures::pool_config;
    use vmdhcp_core::pool::Binding;

    use crate::pools::PoolLeases;
    use std::collections::BTreeMap;

    const HOLDER: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const OTHER: MacAddr = MacAddr([2, 0, 0, 0, 0, 9]);
    const IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);

    fn table() -> Arc<LeaseTable> {
        let table = LeaseTable::new();
        let config = pool_config("default/a");
        table.apply_snapshot(&[PoolLeases {
            leases: [(HOLDER, Binding::ip(IP))].into(),
            config,
        }]);
        Arc::new(table)
    }

    fn declined() -> Declined {
        Declined {
            interface: "eth1".into(),
            pool: "default/a".parse().unwrap(),
            ip: IP,
            by: HOLDER,
        }
    }

    fn no_socket() -> ArpError {
        ArpError::Socket {
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
            missing: crate::capability::Missing(None),
        }
    }

    /// A stand-in for the ARP probe (the real one needs a network; the `dhcp` and `hostile`
    /// suites run it): each host answers every probe for its addresses (all, when empty) in
    /// `rounds` of the rounds.
    fn hosts(
        hosts: Vec<(MacAddr, Vec<Ipv4Addr>)>,
        rounds: u8,
    ) -> impl Prober + Clone + Send + 'static {
        move |_: &str, targets: &[Ipv4Addr], _: &dyn Fn(&Answers) -> bool| -> ProbeResult {
            let mut answers = Answers::default();
            for (mac, ips) in &hosts {
                for ip in targets.iter().filter(|t| ips.is_empty() || ips.contains(t)) {
                    for round in 0..rounds {
                        answers.record(*mac, *ip, round);
                    }
                }
            }
            Ok(answers)
        }
    }

    /// `who` answers every probe for the checked address, nothing else; nobody when `None`.
    fn answering(who: Option<MacAddr>) -> impl Prober + Clone + Send + 'static {
        hosts(
            who.map(|m| (m, vec![IP])).into_iter().collect(),
            arp::PROBE_NUM,
        )
    }

    /// The probe cannot be sent.
    fn unprobed() -> impl Prober + Clone + Send + 'static {
        |_: &str, _: &[Ipv4Addr], _: &dyn Fn(&Answers) -> bool| -> ProbeResult { Err(no_socket()) }
    }

    #[test]
    fn verdicts_follow_the_evidence_and_only_a_conflict_or_no_probe_holds() {
        let cases = [
            (
                Ok(Evidence::Taken(OTHER)),
                Verdict::Conflict(OTHER),
                Some(CONFLICT_HOLD),
            ),
            (Ok(Evidence::Holder), Verdict::HolderAnswers, None),
            (Ok(Evidence::Nobody), Verdict::NoAnswer, None),
            (Ok(Evidence::Proxy(OTHER)), Verdict::Proxy(OTHER), None),
            (Ok(Evidence::Capped(OTHER)), Verdict::Capped(OTHER), None),
            (
                Err(no_socket()),
                Verdict::Unverifiable,
                Some(UNVERIFIED_HOLD),
            ),
        ];
        for (evidence, verdict, hold) in cases {
            assert_eq!(Verdict::of(&evidence), verdict);
            assert_eq!(verdict.hold(), hold, "{verdict:?}");
        }
        assert!(UNVERIFIED_HOLD <= CONFLICT_HOLD);
    }

    /// Runs one check with `probe` and waits for it to finish.
    fn run(
        checks: &Arc<Probes>,
        table: &Arc<LeaseTable>,
        counts: &Arc<VerdictCounts>,
        probe: impl Prober + Send + 'static,
    ) {
        checks.check_decline_with(declined(), Arc::clone(table), Arc::clone(counts), probe);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while checks.running() > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the check never ended"
            );
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_forged_or_stale_decline_withholds_nothing_a_real_conflict_is_held() {
        let (checks, table, counts) = (
            Arc::new(Probes::default()),
            table(),
            Arc::new(VerdictCounts::default()),
        );
        let pool = declined().pool;
        run(&checks, &table, &counts, answering(Some(HOLDER)));
        run(&checks, &table, &counts, answering(None));
        assert!(!table.is_conflicted(&pool, &IP));
        // A forger answering every probe while the VM answers one: the VM uses its address.
        let both = hosts(vec![(OTHER, vec![IP])], arp::PROBE_NUM);
        let forged = move |i: &str, t: &[Ipv4Addr], e: &dyn Fn(&Answers) -> bool| -> ProbeResult {
            let mut answers = both(i, t, e)?;
            answers.record(HOLDER, IP, 2);
            Ok(answers)
        };
        run(&checks, &table, &counts, forged);
        assert!(!table.is_conflicted(&pool, &IP));
        // One frame, or answers to some of the probes only: no conflict.
        run(&checks, &table, &counts, hosts(vec![(OTHER, vec![IP])], 1));
        assert!(!table.is_conflicted(&pool, &IP));
        run(&checks, &table, &counts, answering(Some(OTHER)));
        assert!(table.is_conflicted(&pool, &IP));
        assert_eq!(table.conflicts()[&pool][&IP].answered_by, Some(OTHER));
        // The squatter leaves: the next clean probe ends the hold.
        run(&checks, &table, &counts, answering(None));
        assert!(!table.is_conflicted(&pool, &IP));
        let read: Vec<u64> = counts.read().into_iter().map(|(_, n)| n).collect();
        assert_eq!(read, [1, 2, 3, 0, 0, 0, 0]);
        // Only the confirmed conflict became a finding for the controller.
        let found = table.findings().of(&pool);
        assert_eq!(found.len(), 1);
        assert_eq!(
            (found[0].0, found[0].1.answered_by, found[0].1.reason),
            (IP.into(), Some(OTHER), Reason::Decline)
        );
    }

    fn settle(probes: &Probes) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while probes.running() > 0 {
            assert!(std::time::Instant::now() < deadline, "a probe never ended");
            std::thread::yield_now();
        }
    }

    #[test]
    fn recorded_conflicts_are_rechecked_and_found_free_or_taken() {
        let probes = Arc::new(Probes::default());
        let table = LeaseTable::new();
        let mut config = pool_config("default/a");
        let free = Ipv4Addr::new(192, 0, 2, 20);
        config.conflicted = vec![IP, free];
        table.apply_snapshot(&[PoolLeases {
            leases: [(HOLDER, Binding::ip(IP))].into(),
            config: config.clone(),
        }]);
        let table = Arc::new(table);
        assert!(table.findings().withheld(&config, IP));
        let snapshot = table.pool(&config.pool).unwrap();
        // IP: another host answers; `free`: nobody does.
        probes.recheck_with("eth1", &snapshot, &table, answering(Some(OTHER)));
        settle(&probes);
        // Findings are keyed by either family's address; these are IPv4.
        let found: BTreeMap<Ipv4Addr, _> = table
            .findings()
            .of(&config.pool)
            .into_iter()
            .filter_map(|(ip, f)| match ip {
                std::net::IpAddr::V4(ip) => Some((ip, f)),
                std::net::IpAddr::V6(_) => None,
            })
            .collect();
        assert_eq!(found[&IP].answered_by, Some(OTHER));
        assert_eq!(found[&IP].mac, Some(HOLDER));
        assert_eq!(found[&free].answered_by, None);
        assert!(table.findings().withheld(&config, IP));
        assert!(!table.findings().withheld(&config, free));
        // The squatter leaves; a probe the reservation's own client answers is free too.
        probes.recheck_with(
            "eth1",
            &snapshot,
            &table,
            hosts(vec![(HOLDER, vec![IP, free])], arp::PROBE_NUM),
        );
        settle(&probes);
        assert!(!table.findings().withheld(&config, IP));
        // A probe that cannot be sent changes nothing.
        probes.recheck_with("eth1", &snapshot, &table, unprobed());
        settle(&probes);
        assert!(!table.findings().withheld(&config, IP));
    }

    fn offer() -> PendingOffer {
        PendingOffer {
            interface: "eth1".into(),
            pool: "default/a".parse().unwrap(),
            ip: IP,
            mac: HOLDER,
        }
    }

    /// Probes `offer()` with `answer`; returns whether the OFFER went out (now or from the probe).
    fn offer_with(
        probes: &Arc<Probes>,
        table: &Arc<LeaseTable>,
        counts: &Arc<OfferCounts>,
        probe: impl Prober + Send + 'static,
    ) -> bool {
        let sent = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = Arc::clone(&sent);
        let send = move || flag.store(true, Ordering::SeqCst);
        let now =
            probes.probe_offer_with(offer(), Arc::clone(table), Arc::clone(counts), send, probe);
        assert!(!now, "a probe could run");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while probes.running() > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the probe never ended"
            );
            std::thread::yield_now();
        }
        sent.load(Ordering::SeqCst)
    }

    #[test]
    fn a_first_offer_waits_for_its_probe_and_is_not_made_when_another_host_answers() {
        let (probes, table, counts) = (
            Arc::new(Probes::default()),
            table(),
            Arc::new(OfferCounts::default()),
        );
        let pool = offer().pool;
        // Another host uses the address: no OFFER, the address withheld.
        assert!(!offer_with(
            &probes,
            &table,
            &counts,
            answering(Some(OTHER))
        ));
        assert!(table.is_conflicted(&pool, &IP));
        assert!(!probes.is_clean(&pool, IP, HOLDER));
        table.clear_conflict(&pool, IP);
        // Nobody, or the MAC itself (a VM rebooting with its address): offered, remembered.
        assert!(offer_with(
            &probes,
            &table,
            &counts,
            answering(Some(HOLDER))
        ));
        assert!(probes.is_clean(&pool, IP, HOLDER));
        assert!(!probes.is_clean(&pool, IP, OTHER), "per MAC");
        // No probe possible: offered, not remembered (tried again next time).
        let fresh = Arc::new(Probes::default());
        assert!(offer_with(&fresh, &table, &counts, unprobed()));
        assert!(!fresh.is_clean(&pool, IP, HOLDER));
        let read: Vec<u64> = counts.read().into_iter().map(|(_, n)| n).collect();
        assert_eq!(read, [1, 1, 1, 0, 0, 0]);
    }

    #[test]
    fn offers_beyond_the_probe_limit_go_out_unprobed() {
        let (probes, table, counts) = (
            Arc::new(Probes::default()),
            table(),
            Arc::new(OfferCounts::default()),
        );
        let (release, gate) = std::sync::mpsc::channel::<()>();
        let gate = Arc::new(Mutex::new(gate));
        for i in 0..MAX_PROBES {
            let gate = Arc::clone(&gate);
            let o = PendingOffer {
                ip: Ipv4Addr::new(192, 0, 2, 100 + i as u8),
                ..offer()
            };
            let now = probes.probe_offer_with(
                o,
                Arc::clone(&table),
                Arc::clone(&counts),
                || {},
                move |_: &str, _: &[Ipv4Addr], _: &dyn Fn(&Answers) -> bool| -> ProbeResult {
                    let _ = gate.lock().recv();
                    Ok(Answers::default())
                },
            );
            assert!(!now);
        }
        // The same address again while its probe runs: held (the probe sends the OFFER).
        let again = PendingOffer {
            ip: Ipv4Addr::new(192, 0, 2, 100),
            ..offer()
        };
        assert!(!probes.probe_offer_with(
            again,
            Arc::clone(&table),
            Arc::clone(&counts),
            || {},
            answering(None)
        ));
        // Another address: sent now, unprobed.
        assert!(probes.probe_offer_with(
            offer(),
            Arc::clone(&table),
            Arc::clone(&counts),
            || {},
            answering(None)
        ));
        assert_eq!(counts.read()[OfferVerdict::Busy.index()].1, 1);
        for _ in 0..MAX_PROBES {
            release.send(()).unwrap();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while probes.running() > 0 {
            assert!(std::time::Instant::now() < deadline);
            std::thread::yield_now();
        }
    }

    #[test]
    fn the_clean_record_is_bounded() {
        let probes = Probes::default();
        let pool: NamespacedName = "default/a".parse().unwrap();
        for i in 0..(MAX_CLEAN as u32 + 10) {
            probes.mark_clean(&pool, Ipv4Addr::from(i), HOLDER);
        }
        assert!(probes.clean.lock().len() <= MAX_CLEAN);
    }

    #[test]
    fn checks_are_bounded_and_one_per_address() {
        let (checks, table, counts) = (
            Arc::new(Probes::default()),
            table(),
            Arc::new(VerdictCounts::default()),
        );
        let (release, gate) = std::sync::mpsc::channel::<()>();
        let gate = Arc::new(Mutex::new(gate));
        // MAX_PROBES probes that wait for the gate, each for another address.
        for i in 0..MAX_PROBES {
            let gate = Arc::clone(&gate);
            let d = Declined {
                ip: Ipv4Addr::new(192, 0, 2, 100 + i as u8),
                ..declined()
            };
            checks.check_decline_with(
                d,
                Arc::clone(&table),
                Arc::clone(&counts),
                move |_: &str, _: &[Ipv4Addr], _: &dyn Fn(&Answers) -> bool| -> ProbeResult {
                    let _ = gate.lock().recv();
                    Ok(Answers::default())
                },
            );
        }
        assert_eq!(checks.running(), MAX_PROBES);
        // A second DECLINE for a running address, and a flood for others: no more threads.
        for i in 0..1000u32 {
            let d = Declined {
                ip: Ipv4Addr::from(u32::from(IP) + 1000 + i),
                ..declined()
            };
            checks.check_decline_with(d, Arc::clone(&table), Arc::clone(&counts), answering(None));
        }
        assert_eq!(checks.running(), MAX_PROBES);
        assert_eq!(counts.read()[Verdict::Busy.index()].1, 1000);
        for _ in 0..MAX_PROBES {
            release.send(()).unwrap();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while checks.running() > 0 {
            assert!(std::time::Instant::now() < deadline);
            std::thread::yield_now();
        }
        assert!(table.conflicts().is_empty());
    }

    #[test]
    fn a_host_answering_for_addresses_nobody_holds_is_a_proxy_and_makes_no_conflict() {
        let suspects = Arc::new(Suspects::new(Duration::from_secs(60)));
        let (checks, table, counts) = (
            Arc::new(Probes::reporting_to(Arc::clone(&suspects))),
            table(),
            Arc::new(VerdictCounts::default()),
        );
        let pool = declined().pool;
        let calls = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&calls);
        let everything = hosts(vec![(OTHER, vec![])], arp::PROBE_NUM);
        let proxy = move |i: &str, t: &[Ipv4Addr], e: &dyn Fn(&Answers) -> bool| -> ProbeResult {
            counted.fetch_add(1, Ordering::SeqCst);
            everything(i, t, e)
        };
        run(&checks, &table, &counts, proxy.clone());
        assert!(!table.is_conflicted(&pool, &IP));
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "the address, then the canaries"
        );
        assert_eq!(checks.proxies(&pool).len(), 1);
        assert_eq!(checks.proxies(&pool)[0].0, OTHER);
        // Remembered: the next check needs no canaries.
        run(&checks, &table, &counts, proxy);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        assert_eq!(counts.read()[Verdict::Proxy(OTHER).index()].1, 2);
        assert!(
            table.findings().of(&pool).is_empty(),
            "nothing for the controller"
        );
        assert!(
            checks.proxies(&"default/b".parse().unwrap()).is_empty(),
            "per pool"
        );
    }

    #[test]
    fn one_host_holds_at_most_a_few_addresses_in_conflict() {
        let (probes, table, counts) = (
            Arc::new(Probes::default()),
            table(),
            Arc::new(OfferCounts::default()),
        );
        let pool = offer().pool;
        let squatted: Vec<Ipv4Addr> = (0..=MAX_CONFLICTS_PER_HOST as u8)
            .map(|i| Ipv4Addr::new(192, 0, 2, 50 + i))
            .collect();
        let squatter = hosts(vec![(OTHER, squatted.clone())], arp::PROBE_NUM);
        let mut offered = Vec::new();
        for (i, ip) in squatted.iter().enumerate() {
            let o = PendingOffer {
                ip: *ip,
                mac: MacAddr([2, 0, 0, 0, 1, i as u8]),
                ..offer()
            };
            let sent = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let flag = Arc::clone(&sent);
            probes.probe_offer_with(
                o,
                Arc::clone(&table),
                Arc::clone(&counts),
                move || flag.store(true, Ordering::SeqCst),
                squatter.clone(),
            );
            settle(&probes);
            offered.push(sent.load(Ordering::SeqCst));
        }
        let mut want = vec![false; MAX_CONFLICTS_PER_HOST];
        want.push(true);
        assert_eq!(
            offered, want,
            "the host's answers past the cap withhold nothing"
        );
        assert_eq!(table.conflicts()[&pool].len(), MAX_CONFLICTS_PER_HOST);
        assert_eq!(counts.read()[OfferVerdict::Capped.index()].1, 1);
    }

    #[test]
    fn canaries_are_addresses_nobody_holds() {
        let table = table();
        let mut config = pool_config("default/a");
        config.conflicted = vec![Ipv4Addr::new(192, 0, 2, 99)];
        table.apply_snapshot(&[PoolLeases {
            leases: [(HOLDER, Binding::ip(IP))].into(),
            config: config.clone(),
        }]);
        let snapshot = table.pool(&config.pool).unwrap();
        for ip in [IP, Ipv4Addr::new(192, 0, 2, 77)] {
            let picked = canaries(&snapshot, ip, CANARIES);
            assert_eq!(picked.len(), CANARIES);
            for c in &picked {
                assert!(config.subnet.contains(c) && *c != config.subnet.network());
                assert!(*c != config.subnet.broadcast() && *c != ip && *c != config.server_ip);
                assert!(config.router != Some(*c) && !config.dns.contains(c));
                assert!(!config.conflicted.contains(c) && snapshot.holder_of(c).is_none());
            }
            let mut unique = picked.clone();
            unique.sort();
            unique.dedup();
            assert_eq!(unique.len(), picked.len());
        }
        assert_ne!(
            canaries(&snapshot, IP, 4),
            canaries(&snapshot, Ipv4Addr::new(192, 0, 2, 77), 4)
        );
    }
}
