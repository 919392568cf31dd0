//! Per-interface packet counters: what arrived, what was answered, what was ignored and why.
//!
//! Plain atomics, bumped once per packet by the interface's task and read by whoever reports
//! (logs, readiness, metrics); they never block the packet path.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dhcproto::v4::MessageType;

use super::handler::{Action, DropReason, Outcome, Silence};
use super::probe::{OfferCounts, VerdictCounts};

const REQUEST_KINDS: [&str; 6] = [
    "discover", "request", "release", "decline", "inform", "other",
];
const REPLY_KINDS: [&str; 3] = ["offer", "ack", "nak"];
/// Upper bounds of the reply-latency buckets, in microseconds (receive to reply handed to the
/// kernel): a reply takes a few microseconds of CPU, so anything past a millisecond is a stall.
pub const LATENCY_BUCKETS_US: [u64; 10] = [5, 10, 25, 50, 100, 250, 500, 1_000, 5_000, 25_000];

const SILENCES: [&str; 7] = [
    "unknown_mac",
    "other_server",
    "conflicted",
    "released",
    "declined",
    "ignored",
    "own_interface",
];

/// Counters of one interface's server.
#[derive(Debug, Default)]
pub struct Counters {
    received: [AtomicU64; REQUEST_KINDS.len()],
    replies: [AtomicU64; REPLY_KINDS.len()],
    silences: [AtomicU64; SILENCES.len()],
    drops: [AtomicU64; DropReason::ALL.len()],
    send_errors: AtomicU64,
    forcerenews: AtomicU64,
    no_pool: AtomicU64,
    latency_buckets: [AtomicU64; LATENCY_BUCKETS_US.len()],
    latency_count: AtomicU64,
    latency_sum_ns: AtomicU64,
    declines: Arc<VerdictCounts>,
    offer_probes: Arc<OfferCounts>,
}

/// A reading of every counter, grouped the way metrics export them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reading {
    /// Requests by message type.
    pub received: Vec<(&'static str, u64)>,
    /// Replies by message type (`offer`, `ack`, `nak`).
    pub replies: Vec<(&'static str, u64)>,
    /// Requests deliberately left unanswered, by reason (`unknown_mac`, …).
    pub unanswered: Vec<(&'static str, u64)>,
    /// Datagrams dropped as unusable, by reason.
    pub dropped: Vec<(&'static str, u64)>,
    /// Replies the socket refused.
    pub send_errors: u64,
    /// FORCERENEWs sent to keyed clients whose answer changed.
    pub forcerenews: u64,
    /// Latency buckets, not cumulative: (upper bound in seconds, replies in that bucket); the
    /// last bound is `f64::MAX`, standing for +Inf, as `prometheus-client` encodes it.
    pub latency_buckets: Vec<(f64, u64)>,
    /// Replies timed.
    pub latency_count: u64,
    /// Sum of their latencies, in seconds.
    pub latency_sum_seconds: f64,
    /// DECLINEs checked, by verdict (see [`super::probe`]).
    pub declines: Vec<(&'static str, u64)>,
    /// First OFFERs probed, by verdict (see [`super::probe`]).
    pub offer_probes: Vec<(&'static str, u64)>,
}

fn request_index(kind: Option<MessageType>) -> usize {
    match kind {
        Some(MessageType::Discover) => 0,
        Some(MessageType::Request) => 1,
        Some(MessageType::Release) => 2,
        Some(MessageType::Decline) => 3,
        Some(MessageType::Inform) => 4,
        _ => 5,
    }
}

fn index_of(list: &[&str], label: &str) -> usize {
    list.iter().position(|l| *l == label).unwrap_or(0)
}

impl Counters {
    /// The DECLINE verdict counts of this interface, for the checks to record into.
    pub fn declines(&self) -> Arc<VerdictCounts> {
        Arc::clone(&self.declines)
    }

    /// The offer-probe verdict counts of this interface, for the probes to record into.
    pub fn offer_probes(&self) -> Arc<OfferCounts> {
        Arc::clone(&self.offer_probes)
    }

    /// Counts one handled datagram.
    pub fn record(&self, outcome: &Outcome) {
        if outcome.request.is_some() {
            self.received[request_index(outcome.request)].fetch_add(1, Ordering::Relaxed);
        }
        match &outcome.action {
            Action::Reply(reply) => {
                let i = match reply.kind {
                    MessageType::Offer => 0,
                    MessageType::Ack => 1,
                    _ => 2,
                };
                self.replies[i].fetch_add(1, Ordering::Relaxed);
            }
            Action::Silent(silence) => {
                self.silences[index_of(&SILENCES, silence.as_str())]
                    .fetch_add(1, Ordering::Relaxed);
            }
            Action::Drop(reason) => {
                let i = DropReason::ALL
                    .iter()
                    .position(|r| r == reason)
                    .unwrap_or(0);
                self.drops[i].fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Records how long a reply took, from reading the datagram to the send (the time it waited
    /// in the socket, up to one batch window under load, is not the agent's work).
    pub fn record_latency(&self, took: Duration) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        if let Some(i) = LATENCY_BUCKETS_US.iter().position(|b| us <= *b) {
            self.latency_buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.latency_count.fetch_add(1, Ordering::Relaxed);
        self.latency_sum_ns.fetch_add(
            u64::try_from(took.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Reads every counter.
    pub fn read(&self) -> Reading {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let buckets: Vec<u64> = self.latency_buckets.iter().map(load).collect();
        let count = load(&self.latency_count);
        let overflow = count.saturating_sub(buckets.iter().sum());
        Reading {
            received: REQUEST_KINDS
                .iter()
                .copied()
                .zip(self.received.iter().map(load))
                .collect(),
            replies: REPLY_KINDS
                .iter()
                .copied()
                .zip(self.replies.iter().map(load))
                .collect(),
            unanswered: SILENCES
                .iter()
                .copied()
                .zip(self.silences.iter().map(load))
                .chain([("no_pool", load(&self.no_pool))])
                .collect(),
            dropped: DropReason::ALL
                .iter()
                .map(DropReason::as_str)
                .zip(self.drops.iter().map(load))
                .collect(),
            send_errors: load(&self.send_errors),
            forcerenews: load(&self.forcerenews),
            declines: self.declines.read(),
            offer_probes: self.offer_probes.read(),
            latency_buckets: LATENCY_BUCKETS_US
                .iter()
                .map(|bound| *bound as f64 / 1e6)
                .zip(buckets)
                .chain([(f64::MAX, overflow)])
                .collect(),
            latency_count: count,
            latency_sum_seconds: load(&self.latency_sum_ns) as f64 / 1e9,
        }
    }

    /// Counts a packet that arrived before its pool's config did.
    pub fn record_no_pool(&self) {
        self.no_pool.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a reply the socket refused to send.
    pub fn record_send_error(&self) {
        self.send_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a FORCERENEW sent.
    pub fn record_forcerenew(&self) {
        self.forcerenews.fetch_add(1, Ordering::Relaxed);
    }

    /// Replies of one kind sent so far.
    pub fn replies(&self, kind: MessageType) -> u64 {
        let i = match kind {
            MessageType::Offer => 0,
            MessageType::Ack => 1,
            _ => 2,
        };
        self.replies[i].load(Ordering::Relaxed)
    }

    /// Silences of one kind so far.
    pub fn silences(&self, silence: Silence) -> u64 {
        self.silences[index_of(&SILENCES, silence.as_str())].load(Ordering::Relaxed)
    }

    /// Drops for one reason so far.
    pub fn drops(&self, reason: DropReason) -> u64 {
        let i = DropReason::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        self.drops[i].load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn every_outcome_lands_in_its_own_counter() {
        let c = Counters::default();
        c.record(&Outcome {
            request: Some(MessageType::Discover),
            mac: None,
            action: Action::Silent(Silence::UnknownMac),
        });
        c.record(&Outcome {
            request: Some(MessageType::Decline),
            mac: None,
            action: Action::Silent(Silence::Declined(Ipv4Addr::LOCALHOST)),
        });
        c.record(&Outcome {
            request: None,
            mac: None,
            action: Action::Drop(DropReason::BadMagic),
        });
        assert_eq!(c.silences(Silence::UnknownMac), 1);
        assert_eq!(c.silences(Silence::Declined(Ipv4Addr::UNSPECIFIED)), 1);
        assert_eq!(c.drops(DropReason::BadMagic), 1);
        assert_eq!(c.drops(DropReason::Truncated), 0);
        let reading = c.read();
        assert!(reading.received.contains(&("discover", 1)));
        assert!(reading.received.contains(&("decline", 1)));
        assert!(reading.replies.contains(&("offer", 0)));
        assert_eq!(reading.unanswered.len(), SILENCES.len() + 1, "and no_pool");
        assert_eq!(reading.dropped.len(), DropReason::ALL.len());
        assert!(reading.unanswered.contains(&("unknown_mac", 1)));
        assert!(reading.dropped.contains(&("bad_magic", 1)));
    }

    #[test]
    fn latency_lands_in_its_bucket() {
        let c = Counters::default();
        c.record_latency(Duration::from_micros(3));
        c.record_latency(Duration::from_micros(40));
        c.record_latency(Duration::from_secs(1));
        let r = c.read();
        assert_eq!(r.latency_count, 3);
        assert_eq!(r.latency_buckets[0], (5e-6, 1));
        assert_eq!(r.latency_buckets[3], (50e-6, 1));
        assert_eq!(r.latency_buckets.len(), LATENCY_BUCKETS_US.len() + 1);
        assert_eq!(
            *r.latency_buckets.last().unwrap(),
            (f64::MAX, 1),
            "1 s is past every bound"
        );
        assert!((r.latency_sum_seconds - 1.000_043).abs() < 1e-9);
    }
}
