//! What a probe found and what was done with it: the verdicts on DECLINEs and OFFERs, their
//! evidence, and their counters.

use super::*;

/// What a checked DECLINE turned out to be (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Another host answered for the address.
    Conflict(MacAddr),
    /// The reservation's own MAC answered: the address is in use by its holder.
    HolderAnswers,
    /// Nobody answered (every probe).
    NoAnswer,
    /// The probe could not be sent.
    Unverifiable,
    /// Too many probes running; not checked.
    Busy,
    /// Only a proxy-ARP responder answered.
    Proxy(MacAddr),
    /// The answering host already holds [`MAX_CONFLICTS_PER_HOST`] addresses in conflict.
    Capped(MacAddr),
}

impl Labels for Verdict {
    const LABELS: &'static [&'static str] = &[
        "conflict",
        "holder_answers",
        "no_answer",
        "unverifiable",
        "busy",
        "proxy_arp",
        "capped",
    ];

    fn index(self) -> usize {
        match self {
            Verdict::Conflict(_) => 0,
            Verdict::HolderAnswers => 1,
            Verdict::NoAnswer => 2,
            Verdict::Unverifiable => 3,
            Verdict::Busy => 4,
            Verdict::Proxy(_) => 5,
            Verdict::Capped(_) => 6,
        }
    }
}

impl Verdict {
    /// The verdict on a DECLINE, from what its check found.
    pub fn of(evidence: &Result<Evidence, ArpError>) -> Self {
        match evidence {
            Err(_) => Verdict::Unverifiable,
            Ok(Evidence::Nobody) => Verdict::NoAnswer,
            Ok(Evidence::Holder) => Verdict::HolderAnswers,
            Ok(Evidence::Taken(mac)) => Verdict::Conflict(*mac),
            Ok(Evidence::Proxy(mac)) => Verdict::Proxy(*mac),
            Ok(Evidence::Capped(mac)) => Verdict::Capped(*mac),
        }
    }

    /// How long the declined address is withheld.
    pub fn hold(self) -> Option<Duration> {
        match self {
            Verdict::Conflict(_) => Some(CONFLICT_HOLD),
            Verdict::Unverifiable => Some(UNVERIFIED_HOLD),
            Verdict::HolderAnswers
            | Verdict::NoAnswer
            | Verdict::Busy
            | Verdict::Proxy(_)
            | Verdict::Capped(_) => None,
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
    pub(super) fn record(&self, verdict: V) {
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
    /// Only a proxy-ARP responder answered: offered.
    Proxy,
    /// The answering host holds [`MAX_CONFLICTS_PER_HOST`] conflicts already: offered.
    Capped,
}

impl Labels for OfferVerdict {
    const LABELS: &'static [&'static str] = &[
        "clean",
        "conflict",
        "unverifiable",
        "busy",
        "proxy_arp",
        "capped",
    ];

    fn index(self) -> usize {
        match self {
            OfferVerdict::Clean => 0,
            OfferVerdict::Conflict => 1,
            OfferVerdict::Unverifiable => 2,
            OfferVerdict::Busy => 3,
            OfferVerdict::Proxy => 4,
            OfferVerdict::Capped => 5,
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
