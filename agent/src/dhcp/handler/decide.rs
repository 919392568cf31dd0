//! The RFC 2131 state logic: which reservation a request is about, and whether it gets an
//! OFFER, an ACK, a NAK, silence or is dropped. Building the reply is [`super::reply`]'s.

use std::net::Ipv4Addr;

use dhcproto::v4::{DhcpOption, Message, MessageType, OptionCode};
use vmdhcp_core::MacAddr;

use super::reply::reply;
use super::wire::Sanitized;
use super::{Action, DropReason, Silence};
use crate::lease_table::PoolSnapshot;

/// The MAC whose reservation answers this client: its hardware address (`chaddr`) when the pool
/// has a reservation for it, else the hardware address inside its client identifier (option 61,
/// type 1 = Ethernet, RFC 2132 §9.14) when that has one, else `chaddr` (an unknown client).
/// Reservations come from the VM NIC's MAC; a client that names itself by that MAC in option 61
/// while its frames carry another (a bond, a rewritten or regenerated NIC address) still gets its
/// address. Other identifiers (DUIDs, RFC 4361) cannot be mapped to a NIC and are ignored.
pub(super) fn reservation_key(request: &Message, chaddr: MacAddr, pool: &PoolSnapshot) -> MacAddr {
    if pool.address_of(&chaddr).is_some() {
        return chaddr;
    }
    match request.opts().get(OptionCode::ClientIdentifier) {
        Some(DhcpOption::ClientIdentifier(id)) if id.len() == 7 && id[0] == 1 => {
            let mut mac = [0u8; 6];
            mac.copy_from_slice(&id[1..]);
            let mac = MacAddr(mac);
            if pool.address_of(&mac).is_some() {
                mac
            } else {
                chaddr
            }
        }
        _ => chaddr,
    }
}

/// What to do with a parsed client message of type `kind` from the client reserved as `mac`.
/// `wire` is what was read off the raw packet (option 82, the boot signals), handed through to
/// the reply.
pub(super) fn decide(
    request: &Message,
    wire: &Sanitized,
    kind: MessageType,
    mac: MacAddr,
    pool: &PoolSnapshot,
    is_conflicted: impl Fn(&Ipv4Addr) -> bool,
) -> Action {
    let config = pool.config();
    let unspecified = Ipv4Addr::UNSPECIFIED;
    let requested_ip = match request.opts().get(OptionCode::RequestedIpAddress) {
        Some(DhcpOption::RequestedIpAddress(ip)) => Some(*ip),
        _ => None,
    };
    let server_id = match request.opts().get(OptionCode::ServerIdentifier) {
        Some(DhcpOption::ServerIdentifier(ip)) => Some(*ip),
        _ => None,
    };
    if !matches!(
        kind,
        MessageType::Discover
            | MessageType::Request
            | MessageType::Release
            | MessageType::Decline
            | MessageType::Inform
    ) {
        return Action::Drop(DropReason::NotClientMessage);
    }
    if kind == MessageType::Inform && request.ciaddr() == unspecified {
        return Action::Drop(DropReason::RequestWithoutAddress);
    }
    if kind == MessageType::Request
        && server_id.is_none()
        && requested_ip.is_none()
        && request.ciaddr() == unspecified
    {
        return Action::Drop(DropReason::RequestWithoutAddress);
    }
    let Some(leased) = pool.address_of(&mac) else {
        return Action::Silent(Silence::UnknownMac);
    };
    let nic = pool.options_of(&mac);
    let ours = |id: Option<Ipv4Addr>| id.is_none_or(|id| id == config.server_ip);
    match kind {
        MessageType::Release => {
            if ours(server_id) && request.ciaddr() == leased {
                Action::Silent(Silence::Released(leased))
            } else {
                Action::Silent(Silence::Ignored)
            }
        }
        MessageType::Decline => {
            if ours(server_id) && requested_ip == Some(leased) {
                Action::Silent(Silence::Declined(leased))
            } else {
                Action::Silent(Silence::Ignored)
            }
        }
        MessageType::Inform => reply(request, wire, MessageType::Ack, None, nic, pool),
        _ if is_conflicted(&leased) => Action::Silent(Silence::Conflicted(leased)),
        MessageType::Discover => {
            let lease = Some((leased, pool.host_name_of(&mac)));
            reply(request, wire, MessageType::Offer, lease, nic, pool)
        }
        _ => {
            // REQUEST. SELECTING names a server (option 54); INIT-REBOOT names only an address
            // (option 50); RENEWING and REBINDING name neither and carry ciaddr (RFC 2131 §4.3.2).
            let asked = match (server_id, requested_ip) {
                (Some(id), _) if id != config.server_ip => {
                    return Action::Silent(Silence::OtherServer);
                }
                (Some(_), Some(ip)) | (None, Some(ip)) => ip,
                (_, None) => request.ciaddr(),
            };
            if asked == leased {
                let lease = Some((leased, pool.host_name_of(&mac)));
                reply(request, wire, MessageType::Ack, lease, nic, pool)
            } else {
                reply(request, wire, MessageType::Nak, None, None, pool)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;

    #[test]
    fn selecting_request_for_us_is_acked_for_another_server_is_silent() {
        let mut req = request(MessageType::Request, KNOWN);
        req.opts_mut().insert(DhcpOption::ServerIdentifier(SERVER));
        req.opts_mut()
            .insert(DhcpOption::RequestedIpAddress(LEASED));
        let (kind, to, ack) = reply_of(&run(&req));
        assert_eq!((kind, to), (MessageType::Ack, broadcast()));
        assert_eq!(ack.yiaddr(), LEASED);
        assert_eq!(ack.opts().msg_type(), Some(MessageType::Ack));

        req.opts_mut()
            .insert(DhcpOption::ServerIdentifier(Ipv4Addr::new(192, 0, 2, 2)));
        assert_eq!(run(&req).action, Action::Silent(Silence::OtherServer));
    }

    #[test]
    fn selecting_request_for_another_address_is_naked() {
        let mut req = request(MessageType::Request, KNOWN);
        req.opts_mut().insert(DhcpOption::ServerIdentifier(SERVER));
        req.opts_mut()
            .insert(DhcpOption::RequestedIpAddress(Ipv4Addr::new(192, 0, 2, 99)));
        let (kind, to, nak) = reply_of(&run(&req));
        assert_eq!((kind, to), (MessageType::Nak, broadcast()));
        assert_eq!(nak.yiaddr(), Ipv4Addr::UNSPECIFIED);
        assert!(nak.opts().get(OptionCode::AddressLeaseTime).is_none());
        assert!(nak.opts().get(OptionCode::SubnetMask).is_none());
    }

    #[test]
    fn init_reboot_acks_the_reservation_and_naks_anything_else() {
        let mut req = request(MessageType::Request, KNOWN);
        req.opts_mut()
            .insert(DhcpOption::RequestedIpAddress(LEASED));
        assert_eq!(reply_of(&run(&req)).0, MessageType::Ack);
        req.opts_mut()
            .insert(DhcpOption::RequestedIpAddress(Ipv4Addr::new(
                198, 51, 100, 7,
            )));
        let (kind, to, _) = reply_of(&run(&req));
        assert_eq!((kind, to), (MessageType::Nak, broadcast()));
        let Action::Reply(r) = &run(&req).action else {
            panic!("no reply");
        };
        assert_eq!(r.unicast_to, None, "a broadcast pins nothing");
    }

    #[test]
    fn renewing_and_rebinding_are_unicast_to_ciaddr() {
        let mut req = request(MessageType::Request, KNOWN);
        req.set_ciaddr(LEASED);
        let (kind, to, ack) = reply_of(&run(&req));
        assert_eq!(kind, MessageType::Ack);
        assert_eq!(to, SocketAddrV4::new(LEASED, 68));
        assert_eq!(ack.ciaddr(), LEASED);
        assert_eq!(ack.yiaddr(), LEASED);
        // The unicast names the client's MAC, which the server pins its address to.
        let Action::Reply(r) = &run(&req).action else {
            panic!("no reply");
        };
        assert_eq!(r.unicast_to, Some(vmdhcp_core::MacAddr(KNOWN)));
        // Rebinding with the broadcast flag still has an address to unicast to (RFC 2131 §4.1).
        req.set_flags(Flags::default().set_broadcast());
        assert_eq!(reply_of(&run(&req)).1, SocketAddrV4::new(LEASED, 68));
        // A renewal for an address that is not the reservation is refused, by broadcast.
        req.set_ciaddr(Ipv4Addr::new(192, 0, 2, 11));
        let (kind, to, _) = reply_of(&run(&req));
        assert_eq!((kind, to), (MessageType::Nak, broadcast()));
    }

    #[test]
    fn request_without_any_address_is_dropped() {
        let req = request(MessageType::Request, KNOWN);
        assert_eq!(
            run(&req).action,
            Action::Drop(DropReason::RequestWithoutAddress)
        );
    }

    #[test]
    fn a_client_identifier_naming_a_reserved_mac_is_honoured() {
        const OTHER: [u8; 6] = [0x02, 0, 0, 0, 0x0b, 0x0b];
        let with_id = |chaddr: [u8; 6], id: Vec<u8>| {
            let mut req = request(MessageType::Discover, chaddr);
            req.opts_mut().insert(DhcpOption::ClientIdentifier(id));
            run(&req)
        };
        let type1 = |mac: [u8; 6]| [vec![1], mac.to_vec()].concat();
        // Unknown chaddr, identifier naming the reserved NIC: its address, to the sender.
        let outcome = with_id(OTHER, type1(KNOWN));
        assert_eq!(outcome.mac, Some(MacAddr(KNOWN)));
        let (kind, _, offer) = reply_of(&outcome);
        assert_eq!(kind, MessageType::Offer);
        assert_eq!(offer.yiaddr(), LEASED);
        assert_eq!(offer.chaddr(), OTHER);
        // A reserved chaddr wins over whatever the identifier names.
        let outcome = with_id(KNOWN, type1(OTHER));
        assert_eq!(outcome.mac, Some(MacAddr(KNOWN)));
        // A DUID (type 255) or an identifier naming no reservation: still unknown.
        let duid = [vec![255, 0, 0, 0, 1], KNOWN.to_vec()].concat();
        for id in [duid, type1(OTHER), vec![1, 2, 3]] {
            let outcome = with_id(OTHER, id.clone());
            assert!(
                matches!(outcome.action, Action::Silent(Silence::UnknownMac)),
                "{id:?}"
            );
        }
    }

    #[test]
    fn unknown_mac_gets_nothing() {
        for kind in [
            MessageType::Discover,
            MessageType::Inform,
            MessageType::Release,
        ] {
            let mut req = request(kind, STRANGER);
            req.set_ciaddr(LEASED);
            assert_eq!(run(&req).action, Action::Silent(Silence::UnknownMac));
        }
    }

    #[test]
    fn inform_gets_options_without_a_lease() {
        let mut req = request(MessageType::Inform, KNOWN);
        req.set_ciaddr(Ipv4Addr::new(192, 0, 2, 10));
        let (kind, to, ack) = reply_of(&run(&req));
        assert_eq!(kind, MessageType::Ack);
        assert_eq!(to, SocketAddrV4::new(LEASED, 68));
        assert_eq!(ack.yiaddr(), Ipv4Addr::UNSPECIFIED);
        assert!(ack.opts().get(OptionCode::AddressLeaseTime).is_none());
        assert!(ack.opts().get(OptionCode::Renewal).is_none());
        assert!(ack.opts().get(OptionCode::DomainNameServer).is_some());
        let req = request(MessageType::Inform, KNOWN);
        assert_eq!(
            run(&req).action,
            Action::Drop(DropReason::RequestWithoutAddress)
        );
    }

    #[test]
    fn release_and_decline_are_reported_not_answered() {
        let mut rel = request(MessageType::Release, KNOWN);
        rel.set_ciaddr(LEASED);
        rel.opts_mut().insert(DhcpOption::ServerIdentifier(SERVER));
        assert_eq!(run(&rel).action, Action::Silent(Silence::Released(LEASED)));
        rel.set_ciaddr(Ipv4Addr::new(192, 0, 2, 77));
        assert_eq!(run(&rel).action, Action::Silent(Silence::Ignored));

        let mut dec = request(MessageType::Decline, KNOWN);
        dec.opts_mut()
            .insert(DhcpOption::RequestedIpAddress(LEASED));
        dec.opts_mut().insert(DhcpOption::ServerIdentifier(SERVER));
        assert_eq!(run(&dec).action, Action::Silent(Silence::Declined(LEASED)));
        dec.opts_mut()
            .insert(DhcpOption::ServerIdentifier(Ipv4Addr::new(192, 0, 2, 2)));
        assert_eq!(run(&dec).action, Action::Silent(Silence::Ignored));
    }

    #[test]
    fn a_declined_address_is_not_offered_again() {
        let req = request(MessageType::Discover, KNOWN);
        let outcome = handle(&req.to_vec().unwrap(), &pool(), |ip| *ip == LEASED);
        assert_eq!(outcome.action, Action::Silent(Silence::Conflicted(LEASED)));
        let mut req = request(MessageType::Request, KNOWN);
        req.set_ciaddr(LEASED);
        let outcome = handle(&req.to_vec().unwrap(), &pool(), |ip| *ip == LEASED);
        assert_eq!(outcome.action, Action::Silent(Silence::Conflicted(LEASED)));
    }
}
