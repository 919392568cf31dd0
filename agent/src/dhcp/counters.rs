//! Per-interface packet counters: what arrived, what was answered, what was ignored and why.
//!
//! Plain atomics, bumped once per packet by the interface's task and read by whoever reports
//! (logs, readiness, metrics); they never block the packet path.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use dhcproto::v4::MessageType;

use super::handler::{Action, DropReason, Outcome, Silence};

const REQUEST_KINDS: [&str; 6] = [
    "discover", "request", "release", "decline", "inform", "other",
];
const REPLY_KINDS: [&str; 3] = ["offer", "ack", "nak"];
const SILENCES: [&str; 6] = [
    "unknown_mac",
    "other_server",
    "conflicted",
    "released",
    "declined",
    "ignored",
];

/// Counters of one interface's server.
#[derive(Debug, Default)]
pub struct Counters {
    received: [AtomicU64; REQUEST_KINDS.len()],
    replies: [AtomicU64; REPLY_KINDS.len()],
    silences: [AtomicU64; SILENCES.len()],
    drops: [AtomicU64; DropReason::ALL.len()],
    send_errors: AtomicU64,
    no_pool: AtomicU64,
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

    /// Counts a packet that arrived before its pool's config did.
    pub fn record_no_pool(&self) {
        self.no_pool.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a reply the socket refused to send.
    pub fn record_send_error(&self) {
        self.send_errors.fetch_add(1, Ordering::Relaxed);
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

    /// Every counter by a stable `group.label` name, zeros included, for reports.
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        let groups: [(&str, &[&str], &[AtomicU64]); 3] = [
            ("received", &REQUEST_KINDS, &self.received),
            ("replies", &REPLY_KINDS, &self.replies),
            ("silent", &SILENCES, &self.silences),
        ];
        for (group, labels, values) in groups {
            for (label, value) in labels.iter().zip(values) {
                out.insert(format!("{group}.{label}"), value.load(Ordering::Relaxed));
            }
        }
        for (reason, value) in DropReason::ALL.iter().zip(&self.drops) {
            out.insert(
                format!("dropped.{}", reason.as_str()),
                value.load(Ordering::Relaxed),
            );
        }
        out.insert(
            "send_errors".to_owned(),
            self.send_errors.load(Ordering::Relaxed),
        );
        out.insert(
            "silent.no_pool".to_owned(),
            self.no_pool.load(Ordering::Relaxed),
        );
        out
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
        let snap = c.snapshot();
        assert_eq!(snap["received.discover"], 1);
        assert_eq!(snap["received.decline"], 1);
        assert_eq!(snap["dropped.bad_magic"], 1);
        assert_eq!(snap["replies.offer"], 0);
        assert_eq!(snap.len(), 6 + 3 + 6 + 9 + 2);
    }
}
