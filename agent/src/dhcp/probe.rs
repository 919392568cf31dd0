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
//! | who answers the probe ([`PROBE_WAIT`]) | verdict | the address |
//! |---|---|---|
//! | another host | [`Verdict::Conflict`]: someone else uses it | withheld for [`CONFLICT_HOLD`], then offered again (a client that still finds it taken declines again, and is checked again) |
//! | the reservation's own MAC | [`Verdict::HolderAnswers`]: the VM uses its address, so the DECLINE was forged or stale | served; an earlier hold ends |
//! | nobody | [`Verdict::NoAnswer`]: stale or forged | served; an earlier hold ends (the squatter left) |
//! | the probe cannot be sent (no CAP_NET_RAW) | [`Verdict::Unverifiable`] | withheld for [`UNVERIFIED_HOLD`], the 10 s a declining client waits anyway (RFC 2131 §3.1.5) |
//! | [`MAX_PROBES`] probes already running | [`Verdict::Busy`]: not checked | served as before |
//!
//! So a forged DECLINE withholds nothing, or, with probes impossible, at most
//! [`UNVERIFIED_HOLD`]; only a host that answers ARP for the address itself (which already takes
//! the address away from the VM at layer 2) makes a hold, [`CONFLICT_HOLD`] at a time.
//!
//! **What lasts is the controller's.** Every conflict found here (an offer probe or a DECLINE
//! another host answers for) is also recorded in the table's [`crate::findings`] and reported;
//! the controller records it in the pool's status, moves a dynamic VM elsewhere, and streams
//! the recorded addresses back: they are withheld by every agent, across failovers and
//! restarts, and the serving agent probes them again ([`Probes::recheck`]) so one found free is
//! cleared.
//!
//! **Bounds.** At most [`MAX_PROBES`] probes run at once, one per address, each a small thread
//! that lives at most [`PROBE_WAIT`]; the record of addresses probed clean holds at most
//! [`MAX_CLEAN`] entries (when full it starts over, which costs a re-probe of first OFFERs
//! only). A flood of DISCOVERs or DECLINEs costs neither memory nor threads beyond that.

use std::collections::HashSet;
use std::marker::PhantomData;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tracing::{debug, info, warn};
use vmdhcp_core::{MacAddr, NamespacedName};

use crate::arp::{self, ArpError};
use crate::findings::{Finding, Reason};
use crate::lease_table::{LeaseTable, PoolSnapshot};

/// How long a probe waits for an answer (RFC 5227's PROBE_WAIT is 1 s; hosts on one L2 answer
/// within milliseconds).
pub const PROBE_WAIT: Duration = Duration::from_millis(500);
/// How long an address another host answers for is withheld before it is offered again.
pub const CONFLICT_HOLD: Duration = Duration::from_secs(60);
/// How long a DECLINE that cannot be checked withholds the address.
pub const UNVERIFIED_HOLD: Duration = Duration::from_secs(10);
/// Most probes running at once, across every interface.
pub const MAX_PROBES: usize = 32;
/// Most (address, MAC) pairs remembered as probed clean.
pub const MAX_CLEAN: usize = 65_536;
/// Stack of a probe thread: it only sends and reads 60-byte frames.
const PROBE_STACK: usize = 64 * 1024;

/// What a checked DECLINE turned out to be (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Another host answered for the address.
    Conflict(MacAddr),
    /// The reservation's own MAC answered: the address is in use by its holder.
    HolderAnswers,
    /// Nobody answered.
    NoAnswer,
    /// The probe could not be sent.
    Unverifiable,
    /// Too many probes running; not checked.
    Busy,
}

impl Labels for Verdict {
    const LABELS: &'static [&'static str] = &[
        "conflict",
        "holder_answers",
        "no_answer",
        "unverifiable",
        "busy",
    ];

    fn index(self) -> usize {
        match self {
            Verdict::Conflict(_) => 0,
            Verdict::HolderAnswers => 1,
            Verdict::NoAnswer => 2,
            Verdict::Unverifiable => 3,
            Verdict::Busy => 4,
        }
    }
}

impl Verdict {
    /// The verdict on a DECLINE by `holder`, from what its probe saw.
    pub fn of(probe: &Result<Option<MacAddr>, ArpError>, holder: MacAddr) -> Self {
        match probe {
            Err(_) => Verdict::Unverifiable,
            Ok(None) => Verdict::NoAnswer,
            Ok(Some(mac)) if *mac == holder => Verdict::HolderAnswers,
            Ok(Some(mac)) => Verdict::Conflict(*mac),
        }
    }

    /// How long the declined address is withheld.
    pub fn hold(self) -> Option<Duration> {
        match self {
            Verdict::Conflict(_) => Some(CONFLICT_HOLD),
            Verdict::Unverifiable => Some(UNVERIFIED_HOLD),
            Verdict::HolderAnswers | Verdict::NoAnswer | Verdict::Busy => None,
        }
    }
}

/// Verdicts with a metric label each.
pub trait Labels: Copy {
    /// Every verdict's label, in [`Labels::index`] order.
    const LABELS: &'static [&'static str];
    /// The position of this verdict's label in [`Labels::LABELS`].
    fn index(self) -> usize;
}

/// Counts of verdicts `V`, per interface, for `/metrics`.
#[derive(Debug)]
pub struct Tally<V> {
    counts: Box<[AtomicU64]>,
    verdicts: PhantomData<fn(V)>,
}

impl<V: Labels> Default for Tally<V> {
    fn default() -> Self {
        Tally {
            counts: V::LABELS.iter().map(|_| AtomicU64::new(0)).collect(),
            verdicts: PhantomData,
        }
    }
}

impl<V: Labels> Tally<V> {
    fn record(&self, verdict: V) {
        if let Some(n) = self.counts.get(verdict.index()) {
            n.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// (label, count) for every verdict.
    pub fn read(&self) -> Vec<(&'static str, u64)> {
        V::LABELS
            .iter()
            .zip(self.counts.iter())
            .map(|(label, n)| (*label, n.load(Ordering::Relaxed)))
            .collect()
    }
}

/// DECLINE verdicts counted.
pub type VerdictCounts = Tally<Verdict>;
/// Offer-probe verdicts counted.
pub type OfferCounts = Tally<OfferVerdict>;

/// One DECLINE to check.
#[derive(Clone, Debug)]
pub struct Declined {
    /// The interface it arrived on, where the address is probed.
    pub interface: String,
    /// The pool of the reservation.
    pub pool: NamespacedName,
    /// The declined address.
    pub ip: Ipv4Addr,
    /// The reservation's MAC, in whose name it came.
    pub by: MacAddr,
}

/// What an offer probe found (see the module docs), for `/metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OfferVerdict {
    /// Nobody but the MAC itself answered: offered.
    Clean,
    /// Another host answered: not offered, withheld.
    Conflict,
    /// The probe could not be sent: offered unprobed.
    Unverifiable,
    /// Too many probes running: offered unprobed.
    Busy,
}

impl Labels for OfferVerdict {
    const LABELS: &'static [&'static str] = &["clean", "conflict", "unverifiable", "busy"];

    fn index(self) -> usize {
        match self {
            OfferVerdict::Clean => 0,
            OfferVerdict::Conflict => 1,
            OfferVerdict::Unverifiable => 2,
            OfferVerdict::Busy => 3,
        }
    }
}

/// An OFFER held back until its address is probed.
#[derive(Clone, Debug)]
pub struct PendingOffer {
    /// The interface the DISCOVER arrived on, where the address is probed.
    pub interface: String,
    /// The pool of the reservation.
    pub pool: NamespacedName,
    /// The address offered.
    pub ip: Ipv4Addr,
    /// The MAC it is offered to.
    pub mac: MacAddr,
}

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

/// The probes running and the addresses probed clean, shared by every interface's server.
#[derive(Debug, Default)]
pub struct Probes {
    running: Mutex<HashSet<(NamespacedName, Ipv4Addr)>>,
    clean: Mutex<HashSet<(NamespacedName, Ipv4Addr, MacAddr)>>,
}

type ProbeResult = Result<Option<MacAddr>, ArpError>;

impl Probes {
    /// Whether `ip` of `pool` may be offered to `mac` now without a probe: probed clean before.
    pub fn is_clean(&self, pool: &NamespacedName, ip: Ipv4Addr, mac: MacAddr) -> bool {
        self.clean
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&(pool.clone(), ip, mac))
    }

    fn mark_clean(&self, pool: &NamespacedName, ip: Ipv4Addr, mac: MacAddr) {
        let mut clean = self.clean.lock().unwrap_or_else(PoisonError::into_inner);
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
        self.probe_offer_with(offer, table, counts, send, |o| {
            arp::probe(&o.interface, o.ip, PROBE_WAIT)
        })
    }

    fn probe_offer_with(
        self: &Arc<Self>,
        offer: PendingOffer,
        table: Arc<LeaseTable>,
        counts: Arc<OfferCounts>,
        send: impl FnOnce() + Send + 'static,
        probe: impl FnOnce(&PendingOffer) -> ProbeResult + Send + 'static,
    ) -> bool {
        let key = (offer.pool.clone(), offer.ip);
        let me = Arc::clone(self);
        let counted = Arc::clone(&counts);
        let job = move || {
            let answer = probe(&offer);
            let PendingOffer { pool, ip, mac, .. } = &offer;
            let verdict = match answer {
                Ok(Some(other)) if other != *mac => {
                    table.mark_conflicted(pool, *ip, *mac, Some(other), CONFLICT_HOLD);
                    table.findings().record(
                        pool,
                        *ip,
                        Finding::conflict(Some(*mac), other, Reason::Offer),
                    );
                    warn!(%mac, %ip, answered_by = %other, hold_s = CONFLICT_HOLD.as_secs(), "address in use by another host: not offered, withheld");
                    OfferVerdict::Conflict
                }
                Ok(_) => {
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
        self.check_decline_with(declined, table, counts, |d| {
            arp::probe(&d.interface, d.ip, PROBE_WAIT)
        });
    }

    fn check_decline_with(
        self: &Arc<Self>,
        declined: Declined,
        table: Arc<LeaseTable>,
        counts: Arc<VerdictCounts>,
        probe: impl FnOnce(&Declined) -> ProbeResult + Send + 'static,
    ) {
        let key = (declined.pool.clone(), declined.ip);
        let (by, ip) = (declined.by, declined.ip);
        let counted = Arc::clone(&counts);
        let job = move || {
            let verdict = Verdict::of(&probe(&declined), declined.by);
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
        self.recheck_with(interface, pool, table, |interface, ip| {
            arp::probe(interface, ip, PROBE_WAIT)
        });
    }

    fn recheck_with(
        self: &Arc<Self>,
        interface: &str,
        pool: &PoolSnapshot,
        table: &Arc<LeaseTable>,
        probe: impl Fn(&str, Ipv4Addr) -> ProbeResult + Clone + Send + 'static,
    ) {
        let name = pool.config().pool.clone();
        for ip in pool.config().conflicted.iter().copied() {
            let holder = pool.holder_of(&ip);
            let (table, name2, interface, probe) = (
                Arc::clone(table),
                name.clone(),
                interface.to_owned(),
                probe.clone(),
            );
            let job = move || {
                let finding = match probe(&interface, ip) {
                    Ok(Some(other)) if Some(other) != holder => {
                        Finding::conflict(holder, other, Reason::Recheck)
                    }
                    Ok(_) => Finding::free(holder),
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
            let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
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
                me.running
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&key);
            });
        match spawned {
            Ok(_) => Spawned::Started,
            Err(error) => {
                warn!(%error, "no thread for an ARP probe");
                self.running
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&unwind);
                Spawned::Busy
            }
        }
    }

    /// Probes running now.
    pub fn running(&self) -> usize {
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
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
        (_, None) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmdhcp_core::fixtures::pool_config;
    use vmdhcp_core::pool::Lease;

    use crate::lease_table::PoolLeases;
    use std::collections::BTreeMap;

    const HOLDER: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const OTHER: MacAddr = MacAddr([2, 0, 0, 0, 0, 9]);
    const IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);

    fn table() -> Arc<LeaseTable> {
        let table = LeaseTable::new();
        let config = pool_config("default/a");
        table.apply_snapshot(vec![PoolLeases {
            leases: vec![Lease {
                pool: config.pool.clone(),
                mac: HOLDER,
                ip: IP,
                host_name: None,
            }],
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

    #[test]
    fn verdicts_follow_who_answers_and_only_a_conflict_or_no_probe_holds() {
        let cases = [
            (
                Ok(Some(OTHER)),
                Verdict::Conflict(OTHER),
                Some(CONFLICT_HOLD),
            ),
            (Ok(Some(HOLDER)), Verdict::HolderAnswers, None),
            (Ok(None), Verdict::NoAnswer, None),
            (
                Err(no_socket()),
                Verdict::Unverifiable,
                Some(UNVERIFIED_HOLD),
            ),
        ];
        for (probe, verdict, hold) in cases {
            assert_eq!(Verdict::of(&probe, HOLDER), verdict);
            assert_eq!(verdict.hold(), hold, "{verdict:?}");
        }
        assert!(UNVERIFIED_HOLD <= CONFLICT_HOLD);
    }

    /// Runs one check with `answer` and waits for it to finish.
    fn run(
        checks: &Arc<Probes>,
        table: &Arc<LeaseTable>,
        counts: &Arc<VerdictCounts>,
        answer: Result<Option<MacAddr>, ArpError>,
    ) {
        checks.check_decline_with(
            declined(),
            Arc::clone(table),
            Arc::clone(counts),
            move |_| answer,
        );
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
        run(&checks, &table, &counts, Ok(Some(HOLDER)));
        run(&checks, &table, &counts, Ok(None));
        assert!(!table.is_conflicted(&pool, &IP));
        run(&checks, &table, &counts, Ok(Some(OTHER)));
        assert!(table.is_conflicted(&pool, &IP));
        assert_eq!(table.conflicts()[&pool][&IP].answered_by, Some(OTHER));
        // The squatter leaves: the next clean probe ends the hold.
        run(&checks, &table, &counts, Ok(None));
        assert!(!table.is_conflicted(&pool, &IP));
        let read: Vec<u64> = counts.read().into_iter().map(|(_, n)| n).collect();
        assert_eq!(read, [1, 1, 2, 0, 0]);
        // Only the confirmed conflict became a finding for the controller.
        let found = table.findings().of(&pool);
        assert_eq!(found.len(), 1);
        assert_eq!(
            (found[0].0, found[0].1.answered_by, found[0].1.reason),
            (IP, Some(OTHER), Reason::Decline)
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
        table.apply_snapshot(vec![PoolLeases {
            leases: vec![Lease {
                pool: config.pool.clone(),
                mac: HOLDER,
                ip: IP,
                host_name: None,
            }],
            config: config.clone(),
        }]);
        let table = Arc::new(table);
        assert!(table.findings().withheld(&config, IP));
        let snapshot = table.pool(&config.pool).unwrap();
        // IP: another host answers; `free`: nobody does.
        probes.recheck_with("eth1", &snapshot, &table, |_, ip| {
            Ok((ip == IP).then_some(OTHER))
        });
        settle(&probes);
        let found: BTreeMap<_, _> = table.findings().of(&config.pool).into_iter().collect();
        assert_eq!(found[&IP].answered_by, Some(OTHER));
        assert_eq!(found[&IP].mac, Some(HOLDER));
        assert_eq!(found[&free].answered_by, None);
        assert!(table.findings().withheld(&config, IP));
        assert!(!table.findings().withheld(&config, free));
        // The squatter leaves; a probe the reservation's own client answers is free too.
        probes.recheck_with("eth1", &snapshot, &table, |_, _| Ok(Some(HOLDER)));
        settle(&probes);
        assert!(!table.findings().withheld(&config, IP));
        // A probe that cannot be sent changes nothing.
        probes.recheck_with("eth1", &snapshot, &table, |_, _| Err(no_socket()));
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
        answer: ProbeResult,
    ) -> bool {
        let sent = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = Arc::clone(&sent);
        let send = move || flag.store(true, Ordering::SeqCst);
        let now = probes.probe_offer_with(
            offer(),
            Arc::clone(table),
            Arc::clone(counts),
            send,
            move |_| answer,
        );
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
        assert!(!offer_with(&probes, &table, &counts, Ok(Some(OTHER))));
        assert!(table.is_conflicted(&pool, &IP));
        assert!(!probes.is_clean(&pool, IP, HOLDER));
        table.clear_conflict(&pool, IP);
        // Nobody, or the MAC itself (a VM rebooting with its address): offered, remembered.
        assert!(offer_with(&probes, &table, &counts, Ok(Some(HOLDER))));
        assert!(probes.is_clean(&pool, IP, HOLDER));
        assert!(!probes.is_clean(&pool, IP, OTHER), "per MAC");
        // No probe possible: offered, not remembered (tried again next time).
        let fresh = Arc::new(Probes::default());
        assert!(offer_with(&fresh, &table, &counts, Err(no_socket())));
        assert!(!fresh.is_clean(&pool, IP, HOLDER));
        let read: Vec<u64> = counts.read().into_iter().map(|(_, n)| n).collect();
        assert_eq!(read, [1, 1, 1, 0]);
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
                move |_| {
                    let _ = gate.lock().unwrap().recv();
                    Ok(None)
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
            |_| Ok(None)
        ));
        // Another address: sent now, unprobed.
        assert!(probes.probe_offer_with(
            offer(),
            Arc::clone(&table),
            Arc::clone(&counts),
            || {},
            |_| Ok(None)
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
        assert!(probes.clean.lock().unwrap().len() <= MAX_CLEAN);
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
            checks.check_decline_with(d, Arc::clone(&table), Arc::clone(&counts), move |_| {
                let _ = gate.lock().unwrap().recv();
                Ok(None)
            });
        }
        assert_eq!(checks.running(), MAX_PROBES);
        // A second DECLINE for a running address, and a flood for others: no more threads.
        for i in 0..1000u32 {
            let d = Declined {
                ip: Ipv4Addr::from(u32::from(IP) + 1000 + i),
                ..declined()
            };
            checks.check_decline_with(d, Arc::clone(&table), Arc::clone(&counts), |_| Ok(None));
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
}
