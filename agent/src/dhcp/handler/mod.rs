//! What the server answers to one datagram, as pure functions of the packet bytes and one
//! [`PoolSnapshot`]: [`handle`] is the one entry point ([`handle_on`] when the interface's own MAC
//! is known, so that the agent never answers itself), and this module owns the vocabulary of its
//! answer ([`Outcome`], [`Action`], [`Reply`], [`Silence`], [`DropReason`]). The steps live in
//! their own modules: `wire` checks and sanitises the datagram, `decide` applies the RFC 2131
//! state logic, `reply` builds and addresses the answer.
//!
//! Nothing here does I/O or mutates state: a DECLINE comes back as [`Silence::Declined`] and the
//! caller records it. Every byte sequence yields an [`Outcome`]; nothing a packet holds can panic.

use std::net::{Ipv4Addr, SocketAddrV4};

use dhcproto::Decodable;
use dhcproto::v4::{Message, MessageType};
use vmdhcp_core::MacAddr;

use crate::lease_table::PoolSnapshot;

mod boot;
mod decide;
#[cfg(test)]
mod fixtures;
mod reply;
mod wire;

pub use wire::MAX_PACKET;

/// Why a datagram was dropped without an answer because it is not a usable DHCP request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DropReason {
    /// Larger than [`MAX_PACKET`].
    Oversized,
    /// Shorter than a BOOTP header with the magic cookie.
    Truncated,
    /// `op` is not BOOTREQUEST.
    NotBootRequest,
    /// Not Ethernet (`htype` 1, `hlen` 6).
    BadHardware,
    /// The DHCP magic cookie is missing.
    BadMagic,
    /// An option runs past the end of the packet, or one we rely on has the wrong length.
    BadOptions,
    /// No option 53: plain BOOTP, which this server does not speak.
    NoMessageType,
    /// A message type only servers send (OFFER, ACK, NAK, …).
    NotClientMessage,
    /// A REQUEST or INFORM that names no address at all.
    RequestWithoutAddress,
}

impl DropReason {
    /// Every reason, for metrics that must list zero counts too.
    pub const ALL: [DropReason; 9] = [
        DropReason::Oversized,
        DropReason::Truncated,
        DropReason::NotBootRequest,
        DropReason::BadHardware,
        DropReason::BadMagic,
        DropReason::BadOptions,
        DropReason::NoMessageType,
        DropReason::NotClientMessage,
        DropReason::RequestWithoutAddress,
    ];

    /// Stable label for logs and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            DropReason::Oversized => "oversized",
            DropReason::Truncated => "truncated",
            DropReason::NotBootRequest => "not_bootrequest",
            DropReason::BadHardware => "bad_hardware",
            DropReason::BadMagic => "bad_magic",
            DropReason::BadOptions => "bad_options",
            DropReason::NoMessageType => "no_message_type",
            DropReason::NotClientMessage => "not_client_message",
            DropReason::RequestWithoutAddress => "request_without_address",
        }
    }
}

/// A well-formed request that deliberately gets no answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Silence {
    /// No lease for this MAC on this pool.
    UnknownMac,
    /// A REQUEST in SELECTING state for another server's offer (option 54 is not ours).
    OtherServer,
    /// The MAC's address was declined earlier and must not be handed out again.
    Conflicted(Ipv4Addr),
    /// The client released its address (recorded; leases are the controller's to change).
    Released(Ipv4Addr),
    /// The client declined its address: the caller marks it conflicted.
    Declined(Ipv4Addr),
    /// A RELEASE or DECLINE about an address this MAC does not hold, or aimed at another server.
    Ignored,
    /// The client hardware address is the serving interface's own MAC: this agent's probe for
    /// other DHCP servers ([`crate::dhcp::foreign`]), which the kernel loops back to our own
    /// socket, or a host forging that MAC. Answering it would make us our own foreign server.
    OwnInterface,
}

impl Silence {
    /// Stable label for logs and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            Silence::UnknownMac => "unknown_mac",
            Silence::OtherServer => "other_server",
            Silence::Conflicted(_) => "conflicted",
            Silence::Released(_) => "released",
            Silence::Declined(_) => "declined",
            Silence::Ignored => "ignored",
            Silence::OwnInterface => "own_interface",
        }
    }
}

/// A reply ready for the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// OFFER, ACK or NAK.
    pub kind: MessageType,
    /// Where to send it.
    pub to: SocketAddrV4,
    /// The encoded message.
    pub bytes: Vec<u8>,
    /// The client's MAC when the reply is unicast to its address on this link (a renewal):
    /// the address must reach that MAC, not whatever ARP says (see `netlink::pin_neighbour`).
    pub unicast_to: Option<vmdhcp_core::MacAddr>,
    /// In an ACK to a client that takes a reconfigure key: where the server writes it.
    pub key_slot: Option<KeySlot>,
}

/// The room an ACK keeps for the client's reconfigure key (RFC 6704 §3.1.1): option 90 laid out
/// with a zero replay counter and key, which the server fills in ([`crate::reconfigure`]) as
/// the key is the server's secret, not a function of the packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeySlot {
    /// Where option 90's data starts in the reply's bytes.
    pub at: usize,
    /// Where the client's FORCERENEW goes: the ACK's transaction and address.
    pub target: super::forcerenew::Target,
}

/// What to do with one datagram.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send this.
    Reply(Reply),
    /// Stay silent, for this reason.
    Silent(Silence),
    /// Drop it as unusable.
    Drop(DropReason),
}

/// The decision about one datagram, with what is known about its sender for logs and metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The request's message type, once parsed.
    pub request: Option<MessageType>,
    /// The sender's MAC, once parsed.
    pub mac: Option<MacAddr>,
    /// What to do.
    pub action: Action,
}

impl Outcome {
    fn drop(reason: DropReason) -> Self {
        Outcome {
            request: None,
            mac: None,
            action: Action::Drop(reason),
        }
    }
}

/// Decides what to answer to `packet`, received on the interface serving `pool`;
/// `is_conflicted` tells whether an address of the pool was declined.
pub fn handle(
    packet: &[u8],
    pool: &PoolSnapshot,
    is_conflicted: impl Fn(&Ipv4Addr) -> bool,
) -> Outcome {
    handle_on(None, packet, pool, is_conflicted)
}

/// [`handle`], on an interface whose own MAC is `own` (when known): a message whose client
/// hardware address is `own` is never answered ([`Silence::OwnInterface`]).
pub fn handle_on(
    own: Option<MacAddr>,
    packet: &[u8],
    pool: &PoolSnapshot,
    is_conflicted: impl Fn(&Ipv4Addr) -> bool,
) -> Outcome {
    let sanitized = match wire::sanitize(packet) {
        Ok(sanitized) => sanitized,
        Err(reason) => return Outcome::drop(reason),
    };
    let request = match Message::from_bytes(&sanitized.packet) {
        Ok(m) => m,
        Err(_) => return Outcome::drop(DropReason::BadOptions),
    };
    let mac = decide::reservation_key(&request, sanitized.chaddr, pool);
    let Some(kind) = request.opts().msg_type() else {
        return Outcome::drop(DropReason::NoMessageType);
    };
    if own == Some(sanitized.chaddr) {
        return Outcome {
            request: Some(kind),
            mac: Some(sanitized.chaddr),
            action: Action::Silent(Silence::OwnInterface),
        };
    }
    let action = decide::decide(&request, &sanitized, kind, mac, pool, is_conflicted);
    Outcome {
        request: Some(kind),
        mac: Some(mac),
        action,
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::handle_on;
    use super::reply::MIN_REPLY;
    use proptest::prelude::*;

    fn any_packet() -> impl Strategy<Value = Vec<u8>> {
        let kinds = prop::sample::select(vec![
            MessageType::Discover,
            MessageType::Request,
            MessageType::Release,
            MessageType::Decline,
            MessageType::Inform,
        ]);
        let valid = (kinds, any::<bool>(), any::<[u8; 4]>(), any::<bool>()).prop_map(
            |(kind, known, ip, relayed)| {
                let mut m = request(kind, if known { KNOWN } else { STRANGER });
                m.set_ciaddr(Ipv4Addr::from(ip));
                if relayed {
                    m.set_giaddr(Ipv4Addr::new(198, 51, 100, 1));
                }
                m.opts_mut()
                    .insert(DhcpOption::RequestedIpAddress(Ipv4Addr::from(ip)));
                m.to_vec().unwrap()
            },
        );
        let mutated = (
            valid.clone(),
            prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
            any::<prop::sample::Index>(),
        )
            .prop_map(|(mut bytes, flips, cut)| {
                for (at, value) in flips {
                    let i = at.index(bytes.len());
                    bytes[i] = value;
                }
                let keep = OPTIONS_START + cut.index(bytes.len() - OPTIONS_START + 1);
                bytes.truncate(keep);
                bytes
            });
        let header_then_noise = prop::collection::vec(any::<u8>(), 0..400).prop_map(|noise| {
            let mut b = request(MessageType::Discover, KNOWN).to_vec().unwrap();
            b.truncate(OPTIONS_START);
            b.extend(noise);
            b
        });
        prop_oneof![
            valid,
            mutated,
            header_then_noise,
            prop::collection::vec(any::<u8>(), 0..1600),
        ]
    }

    #[test]
    fn a_request_from_the_interfaces_own_mac_is_never_answered() {
        // The probe for foreign DHCP servers, looped back by the kernel: even were the
        // interface's MAC reserved, nothing answers it, and nothing else changes.
        let own = MacAddr(KNOWN);
        for kind in [MessageType::Discover, MessageType::Request] {
            let mut req = request(kind, KNOWN);
            req.opts_mut()
                .insert(DhcpOption::RequestedIpAddress(LEASED));
            let bytes = req.to_vec().unwrap();
            let outcome = handle_on(Some(own), &bytes, &pool(), |_| false);
            assert_eq!(outcome.action, Action::Silent(Silence::OwnInterface));
            assert_eq!((outcome.request, outcome.mac), (Some(kind), Some(own)));
            // Another interface's MAC, or none known: answered as before.
            let other = MacAddr(STRANGER);
            assert!(matches!(
                handle_on(Some(other), &bytes, &pool(), |_| false).action,
                Action::Reply(_)
            ));
            assert_eq!(
                handle_on(None, &bytes, &pool(), |_| false),
                handle(&bytes, &pool(), |_| false)
            );
        }
        // A malformed datagram is still dropped for what it is.
        let outcome = handle_on(Some(own), &[0u8; 10], &pool(), |_| false);
        assert_eq!(outcome.action, Action::Drop(DropReason::Truncated));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn no_packet_panics_and_replies_are_well_formed(packet in any_packet()) {
            let p = pool();
            let outcome = handle(&packet, &p, |_| false);
            if let Action::Reply(r) = outcome.action {
                let reply = Message::from_bytes(&r.bytes).unwrap();
                prop_assert_eq!(reply.opcode(), Opcode::BootReply);
                prop_assert_eq!(reply.chaddr(), &packet[28..34]);
                prop_assert!(r.bytes.len() >= MIN_REPLY && r.bytes.len() <= MAX_PACKET);
                prop_assert_eq!(outcome.mac, Some(MacAddr(KNOWN)));
                if r.kind != MessageType::Nak && outcome.request != Some(MessageType::Inform) {
                    prop_assert_eq!(reply.yiaddr(), LEASED);
                }
            }
        }
    }
}
