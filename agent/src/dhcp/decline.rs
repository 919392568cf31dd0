//! What a DHCPDECLINE is worth. DHCP has no authentication: any host on the VM network can send
//! a DECLINE in any VM's name. Taken at its word, one forged DECLINE would withhold that VM's
//! reserved address and lock it out. So a DECLINE is checked before it costs anything: the agent
//! probes the address with ARP (RFC 5227) on the pool's interface and judges by who answers.
//!
//! | who answers the probe ([`PROBE_WAIT`]) | verdict | the address |
//! |---|---|---|
//! | another host | [`Verdict::Conflict`]: someone else uses it | withheld for [`CONFLICT_HOLD`], then offered again (a client that still finds it taken declines again, and is checked again) |
//! | the reservation's own MAC | [`Verdict::HolderAnswers`]: the VM uses its address, so the DECLINE was forged or stale | served; an earlier hold ends |
//! | nobody | [`Verdict::NoAnswer`]: stale or forged | served; an earlier hold ends (the squatter left) |
//! | the probe cannot be sent (no CAP_NET_RAW) | [`Verdict::Unverifiable`] | withheld for [`UNVERIFIED_HOLD`], the 10 s a declining client waits anyway (RFC 2131 §3.1.5) |
//! | [`MAX_CHECKS`] probes already running | [`Verdict::Busy`]: not checked | served as before |
//!
//! So a forged DECLINE withholds nothing, or, with probes impossible, at most
//! [`UNVERIFIED_HOLD`]; only a host that answers ARP for the address itself (which already takes
//! the address away from the VM at layer 2) makes a hold, [`CONFLICT_HOLD`] at a time. At most
//! [`MAX_CHECKS`] probes run at once, one per address, each a thread that lives at most
//! [`PROBE_WAIT`]: a flood of DECLINEs costs neither memory nor threads beyond that.

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tracing::{info, warn};
use vmdhcp_core::{MacAddr, NamespacedName};

use crate::arp::{self, ArpError};
use crate::lease_table::LeaseTable;

/// How long a probe waits for an answer (RFC 5227's PROBE_WAIT is 1 s).
pub const PROBE_WAIT: Duration = Duration::from_millis(500);
/// How long an address another host answers for is withheld before it is offered again.
pub const CONFLICT_HOLD: Duration = Duration::from_secs(60);
/// How long a DECLINE that cannot be checked withholds the address.
pub const UNVERIFIED_HOLD: Duration = Duration::from_secs(10);
/// Most probes running at once, across every interface.
pub const MAX_CHECKS: usize = 4;

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

impl Verdict {
    /// Every verdict's metric label, in [`Verdict::index`] order.
    pub const LABELS: [&'static str; 5] = [
        "conflict",
        "holder_answers",
        "no_answer",
        "unverifiable",
        "busy",
    ];

    /// The position of this verdict's label in [`Verdict::LABELS`].
    pub fn index(self) -> usize {
        match self {
            Verdict::Conflict(_) => 0,
            Verdict::HolderAnswers => 1,
            Verdict::NoAnswer => 2,
            Verdict::Unverifiable => 3,
            Verdict::Busy => 4,
        }
    }

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

/// Counts of verdicts, per interface, for `/metrics`.
#[derive(Debug, Default)]
pub struct VerdictCounts([AtomicU64; Verdict::LABELS.len()]);

impl VerdictCounts {
    fn record(&self, verdict: Verdict) {
        self.0[verdict.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// (label, count) for every verdict.
    pub fn read(&self) -> Vec<(&'static str, u64)> {
        Verdict::LABELS
            .iter()
            .zip(&self.0)
            .map(|(label, n)| (*label, n.load(Ordering::Relaxed)))
            .collect()
    }
}

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

/// The DECLINE checks running, shared by every interface's server.
#[derive(Debug, Default)]
pub struct DeclineChecks {
    running: Mutex<HashSet<(NamespacedName, Ipv4Addr)>>,
}

impl DeclineChecks {
    /// Checks `declined` in the background and applies the verdict to `table`, counting it in
    /// `counts`. A DECLINE for an address whose check is still running is ignored.
    pub fn check(
        self: &Arc<Self>,
        declined: Declined,
        table: Arc<LeaseTable>,
        counts: Arc<VerdictCounts>,
    ) {
        self.check_with(declined, table, counts, |d| {
            arp::probe(&d.interface, d.ip, PROBE_WAIT)
        });
    }

    /// [`DeclineChecks::check`] with the probe given, so tests can answer it.
    fn check_with(
        self: &Arc<Self>,
        declined: Declined,
        table: Arc<LeaseTable>,
        counts: Arc<VerdictCounts>,
        probe: impl FnOnce(&Declined) -> Result<Option<MacAddr>, ArpError> + Send + 'static,
    ) {
        let key = (declined.pool.clone(), declined.ip);
        {
            let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
            if running.contains(&key) {
                return;
            }
            if running.len() >= MAX_CHECKS {
                counts.record(Verdict::Busy);
                warn!(mac = %declined.by, ip = %declined.ip, "DECLINE not checked: {MAX_CHECKS} checks running; the address stays served");
                return;
            }
            running.insert(key.clone());
        }
        let me = Arc::clone(self);
        let span = tracing::Span::current();
        let unwind = key.clone();
        let spawned = std::thread::Builder::new()
            .name("decline-probe".into())
            .spawn(move || {
                let _in = span.enter();
                let verdict = Verdict::of(&probe(&declined), declined.by);
                apply(&declined, verdict, &table);
                counts.record(verdict);
                me.running
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&key);
            });
        if let Err(error) = spawned {
            warn!(%error, "DECLINE not checked: no thread for the probe");
            self.running
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&unwind);
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
        checks: &Arc<DeclineChecks>,
        table: &Arc<LeaseTable>,
        counts: &Arc<VerdictCounts>,
        answer: Result<Option<MacAddr>, ArpError>,
    ) {
        checks.check_with(
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
            Arc::new(DeclineChecks::default()),
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
    }

    #[test]
    fn checks_are_bounded_and_one_per_address() {
        let (checks, table, counts) = (
            Arc::new(DeclineChecks::default()),
            table(),
            Arc::new(VerdictCounts::default()),
        );
        let (release, gate) = std::sync::mpsc::channel::<()>();
        let gate = Arc::new(Mutex::new(gate));
        // MAX_CHECKS probes that wait for the gate, each for another address.
        for i in 0..MAX_CHECKS {
            let gate = Arc::clone(&gate);
            let d = Declined {
                ip: Ipv4Addr::new(192, 0, 2, 100 + i as u8),
                ..declined()
            };
            checks.check_with(d, Arc::clone(&table), Arc::clone(&counts), move |_| {
                let _ = gate.lock().unwrap().recv();
                Ok(None)
            });
        }
        assert_eq!(checks.running(), MAX_CHECKS);
        // A second DECLINE for a running address, and a flood for others: no more threads.
        for i in 0..1000u32 {
            let d = Declined {
                ip: Ipv4Addr::from(u32::from(IP) + 1000 + i),
                ..declined()
            };
            checks.check_with(d, Arc::clone(&table), Arc::clone(&counts), |_| Ok(None));
        }
        assert_eq!(checks.running(), MAX_CHECKS);
        assert_eq!(counts.read()[Verdict::Busy.index()].1, 1000);
        for _ in 0..MAX_CHECKS {
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
