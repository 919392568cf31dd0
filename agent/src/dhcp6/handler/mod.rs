//! What the DHCPv6 server answers to one datagram (RFC 8415, stateful IA_NA), as a pure
//! function of the bytes, who sent them and one [`PoolSnapshot`]: [`handle`] is the one entry
//! point. Nothing here does I/O or changes state; a DECLINE comes back as
//! [`Silence::Declined`] for the caller to verify. Every byte sequence yields an [`Outcome`];
//! nothing a datagram holds can panic (a property test feeds it garbage).
//!
//! **Whose address.** Reservations are keyed by the NIC's MAC, and DHCPv6 clients identify by
//! DUID, which often carries another MAC or none. The MAC is taken, in this order of trust:
//! the Ethernet source of the frame that carried a direct message; the MAC a DUID-LL or
//! DUID-LLT names; for a message relayed to us, the Client Link-Layer Address option (RFC 6939)
//! the relay added (the frame's source is then the relay's). The first that has a reservation
//! wins. A DUID naming a MAC is no stronger a claim than a forged frame, which any tenant can
//! send: both only ever get the address reserved for that MAC.

use std::net::Ipv6Addr;

use dhcproto::v6::{
    DhcpOption, DhcpOptions, IAAddr, IANA, IAPD, IATA, Message, MessageType, NtpSuboption,
    OptionCode, Status, StatusCode,
};
use dhcproto::{Decodable, Decoder, Encodable, Encoder, Name};
use vmdhcp_core::MacAddr;
use vmdhcp_core::pool::PoolConfigV6;

use super::reconfigure::{Target, add_key_options, target_of};
use crate::lease_table::PoolSnapshot;

mod boot;
mod relay;

use relay::*;

/// Largest datagram accepted; larger ones are dropped (and not read past this, plus one byte to
/// tell them apart). Relayed messages nest, so this is more than a client sends.
pub const MAX_PACKET: usize = 4096;

/// Most relay agents a message may have passed (RFC 8415 §7.6 HOP_COUNT_LIMIT).
const HOP_COUNT_LIMIT: u8 = 8;

/// Option codes dhcproto does not name.
const OPTION_CLIENT_LINKLAYER_ADDR: u16 = 79;
const OPTION_RELAY_MSG: u16 = 9;
const OPTION_INTERFACE_ID: u16 = 18;

/// The fixed part of a RELAY-FORW / RELAY-REPL: type, hop count, link and peer addresses.
const RELAY_HEADER: usize = 34;

/// Why a datagram was dropped without an answer because it is not a usable DHCPv6 message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DropReason {
    /// Larger than [`MAX_PACKET`].
    Oversized,
    /// It does not decode as a DHCPv6 message (or its relay framing is broken).
    Malformed,
    /// A message type only servers or relays send (ADVERTISE, REPLY, RELAY-REPL, …), or one
    /// this server does not handle (RECONFIGURE, lease queries).
    NotClientMessage,
    /// No Client Identifier where RFC 8415 requires one.
    NoClientId,
    /// A Server Identifier where RFC 8415 forbids one (SOLICIT, CONFIRM, REBIND), or a missing
    /// one where it requires one (REQUEST, RENEW, RELEASE, DECLINE).
    ServerIdRule,
    /// Relayed through more than `HOP_COUNT_LIMIT` (8) relays.
    TooManyHops,
    /// SOLICIT, REBIND, CONFIRM or INFORMATION-REQUEST sent to a unicast address (RFC 8415
    /// §16: discarded).
    UnicastNotAllowed,
    /// Sent from an address no single host owns: a multicast, unspecified or loopback IPv6
    /// source, or a group Ethernet source. Answering it would reflect the reply to every host
    /// of the link (a forged `ff02::1` source), so it gets none.
    SourceNotUnicast,
    /// A client message sent directly (not relayed) from an address that is not link-local:
    /// clients speak to servers from their link-local address (RFC 8415 §13.1), and an answer
    /// to another source would go wherever the sender pointed it.
    SourceNotLinkLocal,
}

impl DropReason {
    /// Every reason, for metrics that must list zero counts too.
    pub const ALL: [DropReason; 9] = [
        DropReason::Oversized,
        DropReason::Malformed,
        DropReason::NotClientMessage,
        DropReason::NoClientId,
        DropReason::ServerIdRule,
        DropReason::TooManyHops,
        DropReason::UnicastNotAllowed,
        DropReason::SourceNotUnicast,
        DropReason::SourceNotLinkLocal,
    ];

    /// Stable label for logs and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            DropReason::Oversized => "oversized",
            DropReason::Malformed => "malformed",
            DropReason::NotClientMessage => "not_client_message",
            DropReason::NoClientId => "no_client_id",
            DropReason::ServerIdRule => "server_id_rule",
            DropReason::TooManyHops => "too_many_hops",
            DropReason::UnicastNotAllowed => "unicast_not_allowed",
            DropReason::SourceNotUnicast => "source_not_unicast",
            DropReason::SourceNotLinkLocal => "source_not_link_local",
        }
    }
}

/// A well-formed message that deliberately gets no answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Silence {
    /// A SOLICIT from a client with no reservation on this pool.
    UnknownClient,
    /// A message naming another server's DUID.
    OtherServer,
    /// A REBIND for addresses this server knows nothing of, on its own link.
    NotOurs,
    /// A CONFIRM naming no address.
    NothingToConfirm,
    /// The frame came from the serving interface itself (our own traffic looped back, or a
    /// host forging our MAC).
    OwnInterface,
    /// The client declined its address (its duplicate address detection found it taken): the
    /// caller verifies that with a Neighbor Solicitation before it costs anything. The REPLY
    /// the client waits for is [`Outcome::Answer`]'s; this is what comes with it.
    Declined(Ipv6Addr),
}

impl Silence {
    /// Stable label for logs and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            Silence::UnknownClient => "unknown_client",
            Silence::OtherServer => "other_server",
            Silence::NotOurs => "not_ours",
            Silence::NothingToConfirm => "nothing_to_confirm",
            Silence::OwnInterface => "own_interface",
            Silence::Declined(_) => "declined",
        }
    }
}

/// What arrived, besides the bytes.
#[derive(Clone, Copy, Debug)]
pub struct Received<'a> {
    /// The UDP payload.
    pub payload: &'a [u8],
    /// The IPv6 source of the datagram, where the answer goes.
    pub source: Ipv6Addr,
    /// The Ethernet source of the frame.
    pub link_source: Option<MacAddr>,
    /// Whether the datagram was sent to a multicast address (`ff02::1:2`).
    pub multicast: bool,
}

/// The server's side of one interface.
#[derive(Clone, Copy)]
pub struct Server<'a> {
    /// This pool's server DUID ([`vmdhcp_core::pool::duid::server_duid`]).
    pub duid: &'a [u8],
    /// The interface's own MAC: frames from it are never answered.
    pub own_mac: Option<MacAddr>,
    /// Whether an address is withheld, after a DECLINE the server confirmed or while the
    /// controller records it as used by another host (`status.ipv6.conflicts`, until a recheck
    /// finds it free): not given, as if not reserved.
    pub withheld: &'a dyn Fn(&Ipv6Addr) -> bool,
}

impl std::fmt::Debug for Server<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("duid", &self.duid)
            .field("own_mac", &self.own_mac)
            .finish_non_exhaustive()
    }
}

/// The message type of an answer, for metrics.
pub type Answered = MessageType;

/// The room a REPLY keeps for the client's reconfigure key (RFC 8415 §20.4): an Authentication
/// option with a zero replay counter and key, which the server fills in
/// ([`crate::reconfigure`]), as the key is the server's secret, not a function of the packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeySlot {
    /// Where the option's data starts in the reply's bytes.
    pub at: usize,
    /// Where the client's RECONFIGURE goes.
    pub target: Target,
}

/// What to do with a datagram.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Send `bytes` back to where the datagram came from (the client's port 546, or the relay's
    /// 547 for a RELAY-REPL), and act on `also`.
    Answer {
        /// The encoded reply.
        bytes: Vec<u8>,
        /// Its message type (the inner one, for a relayed reply).
        kind: Answered,
        /// Whether it goes to a relay (port 547) rather than a client (546).
        to_relay: bool,
        /// What the caller does besides sending it (a DECLINE to verify).
        also: Option<Silence>,
        /// The MAC it was answered for, when one was found.
        mac: Option<MacAddr>,
        /// In a REPLY to a client that sent Reconfigure Accept: where the server writes its key.
        key_slot: Option<KeySlot>,
    },
    /// No answer, on purpose.
    Silent(Silence),
    /// Not a usable message.
    Dropped(DropReason),
}

/// Decides what to answer to one datagram on the interface serving `pool`.
pub fn handle(received: Received<'_>, server: Server<'_>, pool: &PoolSnapshot) -> Outcome {
    if received.payload.len() > MAX_PACKET {
        return Outcome::Dropped(DropReason::Oversized);
    }
    if received.link_source.is_some() && received.link_source == server.own_mac {
        return Outcome::Silent(Silence::OwnInterface);
    }
    if !is_unicast(&received.source) || received.link_source.is_some_and(|m| m.0[0] & 1 == 1) {
        return Outcome::Dropped(DropReason::SourceNotUnicast);
    }
    let Some(config) = pool.config().ipv6.as_ref() else {
        // The pool is IPv4-only (or lost its IPv6 side): nothing to serve.
        return Outcome::Silent(Silence::UnknownClient);
    };
    let Some(&kind) = received.payload.first() else {
        return Outcome::Dropped(DropReason::Malformed);
    };
    if kind == u8::from(MessageType::RelayForw) {
        return relayed(received.payload, server, pool, config);
    }
    if !is_link_local(&received.source) {
        return Outcome::Dropped(DropReason::SourceNotLinkLocal);
    }
    let msg = match Message::decode(&mut Decoder::new(received.payload)) {
        Ok(msg) => msg,
        Err(_) => return Outcome::Dropped(DropReason::Malformed),
    };
    let who = Who {
        frame: received.link_source,
        relay: None,
    };
    match decide(&msg, received.multicast, who, server, pool, config) {
        Decision::Reply(reply, also, mac) => match encode(&reply) {
            Some(mut bytes) => {
                let key_slot = target_of(&msg, &reply, mac, received, pool).map(|target| KeySlot {
                    at: add_key_options(&mut bytes),
                    target,
                });
                Outcome::Answer {
                    bytes,
                    kind: reply.msg_type(),
                    to_relay: false,
                    also,
                    mac,
                    key_slot,
                }
            }
            None => Outcome::Dropped(DropReason::Malformed),
        },
        Decision::Silent(s) => Outcome::Silent(s),
        Decision::Drop(r) => Outcome::Dropped(r),
    }
}

/// Whether `ip` can be one host's address: not multicast, unspecified or loopback.
fn is_unicast(ip: &Ipv6Addr) -> bool {
    !(ip.is_multicast() || ip.is_unspecified() || ip.is_loopback())
}

/// Whether `ip` is link-local (`fe80::/10`).
pub fn is_link_local(ip: &Ipv6Addr) -> bool {
    ip.segments()[0] & 0xffc0 == 0xfe80
}

/// The MACs a message may be answered for, in order of trust (see the module docs).
#[derive(Clone, Copy, Debug)]
struct Who {
    /// The Ethernet source of a direct message.
    frame: Option<MacAddr>,
    /// The Client Link-Layer Address a relay added.
    relay: Option<MacAddr>,
}

/// What [`decide`] made of a client message.
enum Decision {
    Reply(Message, Option<Silence>, Option<MacAddr>),
    Silent(Silence),
    Drop(DropReason),
}

/// RFC 8415 §18.3 for one client message.
fn decide(
    msg: &Message,
    multicast: bool,
    who: Who,
    server: Server<'_>,
    pool: &PoolSnapshot,
    config: &PoolConfigV6,
) -> Decision {
    use MessageType as T;
    let kind = msg.msg_type();
    if !matches!(
        kind,
        T::Solicit
            | T::Request
            | T::Renew
            | T::Rebind
            | T::Confirm
            | T::Release
            | T::Decline
            | T::InformationRequest
    ) {
        return Decision::Drop(DropReason::NotClientMessage);
    }
    let opts = msg.opts();
    let client_id = match opts.get(OptionCode::ClientId) {
        Some(DhcpOption::ClientId(id)) => Some(id.clone()),
        _ => None,
    };
    let server_id = match opts.get(OptionCode::ServerId) {
        Some(DhcpOption::ServerId(id)) => Some(id.as_slice()),
        _ => None,
    };
    // Client Identifier: required by all but INFORMATION-REQUEST.
    if client_id.is_none() && kind != T::InformationRequest {
        return Decision::Drop(DropReason::NoClientId);
    }
    match (kind, server_id) {
        (T::Solicit | T::Confirm | T::Rebind, Some(_)) => {
            return Decision::Drop(DropReason::ServerIdRule);
        }
        (T::Request | T::Renew | T::Release | T::Decline, None) => {
            return Decision::Drop(DropReason::ServerIdRule);
        }
        (_, Some(id)) if id != server.duid => return Decision::Silent(Silence::OtherServer),
        _ => {}
    }
    if !multicast {
        match kind {
            T::Solicit | T::Rebind | T::Confirm | T::InformationRequest => {
                return Decision::Drop(DropReason::UnicastNotAllowed);
            }
            // We never send a Server Unicast option: the client must use multicast.
            _ => {
                let mut reply = answer(msg, server, T::Reply);
                reply
                    .opts_mut()
                    .insert(status(Status::UseMulticast, "use multicast"));
                return Decision::Reply(reply, None, None);
            }
        }
    }
    let holder = holder(opts, who, pool).filter(|(_, addr)| !(server.withheld)(addr));
    let lifetimes = Lifetimes::of(config);
    match kind {
        T::InformationRequest => {
            let mut reply = answer(msg, server, T::Reply);
            add_info(&mut reply, opts, config, pool);
            Decision::Reply(reply, None, holder.map(|(m, _)| m))
        }
        T::Solicit => {
            let Some((mac, addr)) = holder else {
                return Decision::Silent(Silence::UnknownClient);
            };
            let rapid = opts.get(OptionCode::RapidCommit).is_some();
            let mut reply = answer(msg, server, if rapid { T::Reply } else { T::Advertise });
            if rapid {
                reply.opts_mut().insert(DhcpOption::RapidCommit);
            }
            bind_ias(
                &mut reply,
                opts,
                Some(addr),
                lifetimes,
                Status::NoAddrsAvail,
            );
            add_info(&mut reply, opts, config, pool);
            Decision::Reply(reply, None, Some(mac))
        }
        T::Request => {
            let mut reply = answer(msg, server, T::Reply);
            bind_ias(
                &mut reply,
                opts,
                holder.map(|(_, a)| a),
                lifetimes,
                Status::NoAddrsAvail,
            );
            add_info(&mut reply, opts, config, pool);
            Decision::Reply(reply, None, holder.map(|(m, _)| m))
        }
        T::Renew => {
            let mut reply = answer(msg, server, T::Reply);
            bind_ias(
                &mut reply,
                opts,
                holder.map(|(_, a)| a),
                lifetimes,
                Status::NoBinding,
            );
            add_info(&mut reply, opts, config, pool);
            Decision::Reply(reply, None, holder.map(|(m, _)| m))
        }
        T::Rebind => {
            if holder.is_none() && !names_foreign_address(opts, config) {
                // Addresses of our link we have no binding for: another server's business.
                return Decision::Silent(Silence::NotOurs);
            }
            let mut reply = answer(msg, server, T::Reply);
            bind_ias(
                &mut reply,
                opts,
                holder.map(|(_, a)| a),
                lifetimes,
                Status::NoBinding,
            );
            add_info(&mut reply, opts, config, pool);
            Decision::Reply(reply, None, holder.map(|(m, _)| m))
        }
        T::Confirm => {
            let addresses = ia_addresses(opts);
            if addresses.is_empty() {
                return Decision::Silent(Silence::NothingToConfirm);
            }
            let on_link = addresses.iter().all(|a| config.subnet.contains(a));
            let mut reply = answer(msg, server, T::Reply);
            reply.opts_mut().insert(if on_link {
                status(Status::Success, "all addresses on link")
            } else {
                status(Status::NotOnLink, "not on link")
            });
            Decision::Reply(reply, None, holder.map(|(m, _)| m))
        }
        T::Release => {
            // Reservations are the controller's: nothing to free here.
            let mut reply = answer(msg, server, T::Reply);
            reply.opts_mut().insert(status(Status::Success, "released"));
            Decision::Reply(reply, None, holder.map(|(m, _)| m))
        }
        T::Decline => {
            let mut reply = answer(msg, server, T::Reply);
            reply.opts_mut().insert(status(Status::Success, "declined"));
            let declined = holder
                .map(|(_, ours)| ours)
                .filter(|ours| ia_addresses(opts).contains(ours))
                .map(Silence::Declined);
            Decision::Reply(reply, declined, holder.map(|(m, _)| m))
        }
        _ => Decision::Drop(DropReason::NotClientMessage),
    }
}

/// The MAC with a reservation among those the message names, and its address.
fn holder(opts: &DhcpOptions, who: Who, pool: &PoolSnapshot) -> Option<(MacAddr, Ipv6Addr)> {
    let duid = match opts.get(OptionCode::ClientId) {
        Some(DhcpOption::ClientId(id)) => duid_mac(id),
        _ => None,
    };
    [who.frame, duid, who.relay]
        .into_iter()
        .flatten()
        .find_map(|mac| pool.ipv6_of(&mac).map(|a| (mac, a)))
}

/// The MAC a DUID-LLT (type 1) or DUID-LL (type 3) of Ethernet (hardware type 1) names.
fn duid_mac(duid: &[u8]) -> Option<MacAddr> {
    let kind = u16::from_be_bytes([*duid.first()?, *duid.get(1)?]);
    let hw = u16::from_be_bytes([*duid.get(2)?, *duid.get(3)?]);
    let mac = match (kind, hw) {
        (1, 1) => duid.get(8..14)?,
        (3, 1) => duid.get(4..10)?,
        _ => return None,
    };
    if duid.len() != mac.len() + if kind == 1 { 8 } else { 4 } {
        return None;
    }
    let mut bytes = [0u8; 6];
    bytes.copy_from_slice(mac);
    Some(MacAddr(bytes))
}

/// Lifetimes from the pool's lease time: valid and preferred the lease, T1 ½ and T2 ⅘ of it
/// (RFC 8415 §21.4's recommended 0.5 and 0.8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Lifetimes {
    valid: u32,
    preferred: u32,
    t1: u32,
    t2: u32,
}

impl Lifetimes {
    fn of(config: &PoolConfigV6) -> Self {
        let valid = config.lease_seconds;
        let part =
            |num: u64, den: u64| u32::try_from(u64::from(valid) * num / den).unwrap_or(valid);
        Lifetimes {
            valid,
            preferred: valid,
            t1: part(1, 2),
            t2: part(4, 5),
        }
    }
}

/// A reply of `kind` to `msg`: its transaction id, our Server Identifier, its Client Identifier.
fn answer(msg: &Message, server: Server<'_>, kind: MessageType) -> Message {
    let mut reply = Message::new_with_id(kind, msg.xid());
    let opts = reply.opts_mut();
    opts.insert(DhcpOption::ServerId(server.duid.to_vec()));
    if let Some(DhcpOption::ClientId(id)) = msg.opts().get(OptionCode::ClientId) {
        opts.insert(DhcpOption::ClientId(id.clone()));
    }
    reply
}

fn status(status: Status, msg: &str) -> DhcpOption {
    DhcpOption::StatusCode(StatusCode {
        status,
        msg: msg.to_owned(),
    })
}

/// The pool's boot file URL to a booting client (see [`boot`]), its DNS servers (option 23),
/// and what the pool's IPv4 side sets that holds for both
/// families: its domain search list (option 24) and the host names among its NTP servers
/// (option 56, FQDN suboptions; its IPv4 addresses have no place in DHCPv6).
fn add_info(
    reply: &mut Message,
    request: &DhcpOptions,
    config: &PoolConfigV6,
    pool: &PoolSnapshot,
) {
    let opts = reply.opts_mut();
    if let Some(b) = &config.boot {
        boot::add_boot(opts, request, b);
    }
    if !config.dns.is_empty() {
        opts.insert(DhcpOption::DomainNameServers(config.dns.clone()));
    }
    let v4 = pool.config();
    let search: Vec<Name> = v4
        .domain_search
        .iter()
        .filter_map(|d| Name::from_ascii(d).ok())
        .collect();
    if !search.is_empty() {
        opts.insert(DhcpOption::DomainSearchList(search));
    }
    let ntp: Vec<NtpSuboption> = v4
        .ntp
        .iter()
        .filter(|n| n.parse::<std::net::IpAddr>().is_err())
        .filter_map(|n| Name::from_ascii(n).ok().map(NtpSuboption::FQDN))
        .collect();
    if !ntp.is_empty() {
        opts.insert(DhcpOption::NtpServer(ntp));
    }
}

/// Most IAs of each kind (IA_NA, IA_TA, IA_PD) one request gets an answer for; the rest are
/// left out of the reply. A NIC has one reservation, so a client asks for one IA_NA; a request
/// naming dozens only wants a reply many times its own size.
pub const MAX_IAS: usize = 4;

/// Answers the first [`MAX_IAS`] IAs of each kind in the request: the first IA_NA gets `addr`
/// with `lifetimes` (any other address it named, with lifetimes 0: no longer ours to give),
/// further IA_NAs and every IA of an IA_NA without an address get `missing`; IA_TA and IA_PD
/// are not served here.
fn bind_ias(
    reply: &mut Message,
    request: &DhcpOptions,
    addr: Option<Ipv6Addr>,
    lifetimes: Lifetimes,
    missing: Status,
) {
    let ianas: Vec<&IANA> = request
        .get_all(OptionCode::IANA)
        .unwrap_or_default()
        .iter()
        .filter_map(|o| match o {
            DhcpOption::IANA(ia) => Some(ia),
            _ => None,
        })
        .take(MAX_IAS)
        .collect();
    let mut given = false;
    for ia in &ianas {
        let mut opts = DhcpOptions::new();
        let (t1, t2) = match addr.filter(|_| !given) {
            Some(addr) => {
                given = true;
                opts.insert(DhcpOption::IAAddr(IAAddr {
                    addr,
                    preferred_life: lifetimes.preferred,
                    valid_life: lifetimes.valid,
                    opts: DhcpOptions::new(),
                }));
                for old in addresses_in(&ia.opts).into_iter().filter(|a| *a != addr) {
                    opts.insert(DhcpOption::IAAddr(IAAddr {
                        addr: old,
                        preferred_life: 0,
                        valid_life: 0,
                        opts: DhcpOptions::new(),
                    }));
                }
                (lifetimes.t1, lifetimes.t2)
            }
            None => {
                opts.insert(status(missing, status_text(missing)));
                (0, 0)
            }
        };
        reply.opts_mut().insert(DhcpOption::IANA(IANA {
            id: ia.id,
            t1,
            t2,
            opts,
        }));
    }
    if ianas.is_empty() && reply.msg_type() == MessageType::Advertise {
        reply.opts_mut().insert(status(
            Status::NoAddrsAvail,
            status_text(Status::NoAddrsAvail),
        ));
    }
    for o in request
        .get_all(OptionCode::IATA)
        .unwrap_or_default()
        .iter()
        .take(MAX_IAS)
    {
        if let DhcpOption::IATA(ia) = o {
            let mut opts = DhcpOptions::new();
            opts.insert(status(
                Status::NoAddrsAvail,
                "temporary addresses are not served",
            ));
            reply
                .opts_mut()
                .insert(DhcpOption::IATA(IATA { id: ia.id, opts }));
        }
    }
    for o in request
        .get_all(OptionCode::IAPD)
        .unwrap_or_default()
        .iter()
        .take(MAX_IAS)
    {
        if let DhcpOption::IAPD(ia) = o {
            let mut opts = DhcpOptions::new();
            opts.insert(status(Status::NoPrefixAvail, "prefixes are not delegated"));
            reply.opts_mut().insert(DhcpOption::IAPD(IAPD {
                id: ia.id,
                t1: 0,
                t2: 0,
                opts,
            }));
        }
    }
}

fn status_text(status: Status) -> &'static str {
    match status {
        Status::NoAddrsAvail => "no address reserved for this client",
        Status::NoBinding => "no binding for this client",
        _ => "",
    }
}

/// The addresses of the IA Address options in `opts`.
fn addresses_in(opts: &DhcpOptions) -> Vec<Ipv6Addr> {
    opts.get_all(OptionCode::IAAddr)
        .unwrap_or_default()
        .iter()
        .filter_map(|o| match o {
            DhcpOption::IAAddr(a) => Some(a.addr),
            _ => None,
        })
        .collect()
}

/// Every address the message's IA_NAs name.
fn ia_addresses(opts: &DhcpOptions) -> Vec<Ipv6Addr> {
    opts.get_all(OptionCode::IANA)
        .unwrap_or_default()
        .iter()
        .filter_map(|o| match o {
            DhcpOption::IANA(ia) => Some(addresses_in(&ia.opts)),
            _ => None,
        })
        .flatten()
        .collect()
}

/// Whether the message names an address outside this link's subnet: a REBIND after a move,
/// which must hear that those addresses are gone (lifetimes 0) rather than nothing.
fn names_foreign_address(opts: &DhcpOptions, config: &PoolConfigV6) -> bool {
    ia_addresses(opts)
        .iter()
        .any(|a| !config.subnet.contains(a))
}

fn encode(msg: &Message) -> Option<Vec<u8>> {
    let mut bytes = Vec::with_capacity(256);
    msg.encode(&mut Encoder::new(&mut bytes)).ok()?;
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dhcp6::reconfigure::message as reconfigure_message;
    use crate::lease_table::LeaseTable;
    use crate::pools::PoolLeases;
    use crate::reconfigure;
    use proptest::prelude::*;
    use std::sync::Arc;
    use vmdhcp_core::fixtures::pool_config;
    use vmdhcp_core::pool::Binding;
    use vmdhcp_core::pool::duid::server_duid;

    const CLIENT: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const STRANGER: MacAddr = MacAddr([2, 0, 0, 0, 0, 9]);
    const OURS: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xaa]);

    fn ip6(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    /// The test pool's config: dual-stack, fd00::/112, served from fd00::2.
    fn config() -> vmdhcp_core::pool::PoolConfig {
        vmdhcp_core::pool::PoolConfig {
            ipv6: Some(PoolConfigV6 {
                conflicted: Default::default(),
                server_ip: ip6("fd00::2"),
                subnet: "fd00::/112".parse().unwrap(),
                dns: vec![ip6("fd00::53")],
                lease_seconds: 1000,
                router_advertisements: false,
                router: None,
                boot: None,
            }),
            ..pool_config("ns/p")
        }
    }

    /// `config` served with one reservation: CLIENT holds 192.0.2.10 and fd00::10.
    fn snapshot_of(config: vmdhcp_core::pool::PoolConfig) -> Arc<PoolSnapshot> {
        let binding = Binding {
            ipv6: Some(ip6("fd00::10")),
            ..Binding::ip("192.0.2.10".parse().unwrap())
        };
        let table = LeaseTable::new();
        let errors = table.apply_snapshot(&[PoolLeases {
            config,
            leases: [(CLIENT, binding)].into_iter().collect(),
        }]);
        assert!(errors.is_empty(), "{errors:?}");
        table.pool(&"ns/p".parse().unwrap()).unwrap()
    }

    fn snapshot() -> Arc<PoolSnapshot> {
        snapshot_of(config())
    }

    fn duid() -> Vec<u8> {
        server_duid(&"ns/p".parse().unwrap())
    }

    /// A DUID-EN (type 2): names no MAC, as systemd-networkd's default.
    fn client_duid() -> Vec<u8> {
        vec![0, 2, 0, 0, 0xab, 0xcd, 1, 2, 3, 4]
    }

    fn message(kind: MessageType, opts: Vec<DhcpOption>) -> Vec<u8> {
        let mut msg = Message::new_with_id(kind, [1, 2, 3]);
        for o in opts {
            msg.opts_mut().insert(o);
        }
        encode(&msg).unwrap()
    }

    fn ia(addr: Option<&str>) -> DhcpOption {
        let mut opts = DhcpOptions::new();
        if let Some(a) = addr {
            opts.insert(DhcpOption::IAAddr(IAAddr {
                addr: ip6(a),
                preferred_life: 0,
                valid_life: 0,
                opts: DhcpOptions::new(),
            }));
        }
        DhcpOption::IANA(IANA {
            id: 7,
            t1: 0,
            t2: 0,
            opts,
        })
    }

    fn run(payload: &[u8], from: MacAddr, multicast: bool) -> Outcome {
        run_on(&snapshot(), payload, from, multicast, &|_| false)
    }

    /// `payload` from `from`'s frame, answered by our server on `pool` withholding `withheld`.
    fn run_on(
        pool: &PoolSnapshot,
        payload: &[u8],
        from: MacAddr,
        multicast: bool,
        withheld: &dyn Fn(&Ipv6Addr) -> bool,
    ) -> Outcome {
        run_sourced(pool, payload, (from, ip6("fe80::1")), multicast, withheld)
    }

    /// [`run_on`] from the IPv6 source `source.1` in a frame from `source.0`.
    fn run_sourced(
        pool: &PoolSnapshot,
        payload: &[u8],
        source: (MacAddr, Ipv6Addr),
        multicast: bool,
        withheld: &dyn Fn(&Ipv6Addr) -> bool,
    ) -> Outcome {
        let duid = duid();
        handle(
            Received {
                payload,
                source: source.1,
                link_source: Some(source.0),
                multicast,
            },
            Server {
                duid: &duid,
                own_mac: Some(OURS),
                withheld,
            },
            pool,
        )
    }

    #[test]
    fn a_withheld_address_is_not_given() {
        let withheld = |a: &Ipv6Addr| *a == ip6("fd00::10");
        let solicit = message(
            MessageType::Solicit,
            vec![DhcpOption::ClientId(client_duid()), ia(None)],
        );
        let outcome = run_on(&snapshot(), &solicit, CLIENT, true, &withheld);
        assert_eq!(outcome, Outcome::Silent(Silence::UnknownClient));
    }

    fn reply(outcome: &Outcome) -> Message {
        match outcome {
            Outcome::Answer { bytes, .. } => Message::decode(&mut Decoder::new(bytes)).unwrap(),
            other => panic!("no answer: {other:?}"),
        }
    }

    /// The address and lifetimes of the reply's first IA_NA, or its status.
    fn granted(msg: &Message) -> Result<(Ipv6Addr, u32, u32, u32), Status> {
        let Some(DhcpOption::IANA(ia)) = msg.opts().get(OptionCode::IANA) else {
            panic!("no IA_NA in {msg:?}");
        };
        if let Some(DhcpOption::StatusCode(s)) = ia.opts.get(OptionCode::StatusCode) {
            return Err(s.status);
        }
        match ia.opts.get(OptionCode::IAAddr) {
            Some(DhcpOption::IAAddr(a)) => Ok((a.addr, a.valid_life, ia.t1, ia.t2)),
            _ => panic!("no address in {ia:?}"),
        }
    }

    fn top_status(msg: &Message) -> Option<Status> {
        match msg.opts().get(OptionCode::StatusCode) {
            Some(DhcpOption::StatusCode(s)) => Some(s.status),
            _ => None,
        }
    }

    #[test]
    fn a_booting_client_gets_the_pool_s_boot_file_url_and_others_do_not() {
        let mut config = config();
        if let Some(v6) = config.ipv6.as_mut() {
            v6.boot = Some(vmdhcp_core::pool::BootV6 {
                uefi_file_url: Some("tftp://[fd00::2]/ipxe.efi".into()),
                ..Default::default()
            });
        }
        let pool = snapshot_of(config);
        let arch = DhcpOption::Unknown(dhcproto::v6::UnknownOption::new(
            OptionCode::ClientArchType,
            vec![0, 7],
        ));
        let url = |with: Vec<DhcpOption>| {
            let mut opts = vec![DhcpOption::ClientId(client_duid()), ia(None)];
            opts.extend(with);
            let solicit = message(MessageType::Solicit, opts);
            let adv = reply(&run_on(&pool, &solicit, CLIENT, true, &|_| false));
            assert_eq!(granted(&adv), Ok((ip6("fd00::10"), 1000, 500, 800)));
            match adv.opts().get(OptionCode::OptBootfileUrl) {
                Some(DhcpOption::Unknown(u)) => Some(u.data().to_vec()),
                _ => None,
            }
        };
        assert_eq!(url(vec![arch]), Some(b"tftp://[fd00::2]/ipxe.efi".to_vec()));
        assert_eq!(url(vec![]), None);
    }

    #[test]
    fn a_reply_to_a_client_accepting_reconfigure_keeps_room_for_its_key_and_others_do_not() {
        let request = |accept: bool| {
            let mut opts = vec![
                DhcpOption::ClientId(client_duid()),
                DhcpOption::ServerId(duid()),
                ia(Some("fd00::10")),
            ];
            if accept {
                opts.push(DhcpOption::ReconfAccept);
            }
            message(MessageType::Request, opts)
        };
        let Outcome::Answer {
            bytes, key_slot, ..
        } = run(&request(true), CLIENT, true)
        else {
            panic!("no answer");
        };
        let slot = key_slot.unwrap();
        assert_eq!(
            slot.target,
            Target {
                duid: client_duid(),
                address: ip6("fe80::1"),
                link: CLIENT,
            }
        );
        let msg = Message::decode(&mut Decoder::new(&bytes)).unwrap();
        assert_eq!(granted(&msg).map(|g| g.0), Ok(ip6("fd00::10")));
        assert!(msg.opts().get(OptionCode::ReconfAccept).is_some());
        assert!(msg.opts().get(OptionCode::Authentication).is_some());
        assert_eq!(&bytes[slot.at..], &reconfigure::key_data());
        assert_eq!(&bytes[slot.at - 4..slot.at], &[0, 11, 0, 28]);

        // Without Reconfigure Accept, or without a reservation: no key.
        let Outcome::Answer { key_slot, .. } = run(&request(false), CLIENT, true) else {
            panic!("no answer");
        };
        assert_eq!(key_slot, None);
        let Outcome::Answer { key_slot, .. } = run(&request(true), STRANGER, true) else {
            panic!("no answer");
        };
        assert_eq!(key_slot, None);
    }

    #[test]
    fn a_reconfigure_names_both_duids_asks_for_a_renew_and_is_signed_with_the_key() {
        let due = reconfigure::Due {
            mac: CLIENT,
            target: Target {
                duid: client_duid(),
                address: ip6("fe80::1"),
                link: CLIENT,
            },
            key: [7; reconfigure::KEY_LEN],
            replay: 42,
        };
        let bytes = reconfigure_message(&duid(), &due).unwrap();
        let msg = Message::decode(&mut Decoder::new(&bytes)).unwrap();
        assert_eq!(msg.msg_type(), MessageType::Reconfigure);
        assert_eq!(msg.xid(), [0, 0, 0]);
        assert_eq!(
            msg.opts().get(OptionCode::ServerId),
            Some(&DhcpOption::ServerId(duid()))
        );
        assert_eq!(
            msg.opts().get(OptionCode::ClientId),
            Some(&DhcpOption::ClientId(client_duid()))
        );
        assert_eq!(
            msg.opts().get(OptionCode::ReconfMsg),
            Some(&DhcpOption::ReconfMsg(MessageType::Renew))
        );
        // What a client checks: the HMAC over the message with the HMAC zero.
        let at = bytes.len() - reconfigure::KEY_LEN;
        let mut zeroed = bytes.clone();
        zeroed[at..].fill(0);
        assert_eq!(&bytes[at..], &reconfigure::hmac_md5(&[7; 16], &zeroed));
        assert_eq!(&bytes[at - 12..at - 1], &[3, 1, 0, 0, 0, 0, 0, 0, 0, 0, 42]);
        assert_eq!(bytes[at - 1], 2);
    }

    #[test]
    fn a_reserved_client_is_advertised_then_given_its_address_by_the_frame_s_mac() {
        let solicit = message(
            MessageType::Solicit,
            vec![DhcpOption::ClientId(client_duid()), ia(None)],
        );
        let adv = reply(&run(&solicit, CLIENT, true));
        assert_eq!(adv.msg_type(), MessageType::Advertise);
        assert_eq!(adv.xid(), [1, 2, 3]);
        assert_eq!(granted(&adv), Ok((ip6("fd00::10"), 1000, 500, 800)));
        assert_eq!(
            adv.opts().get(OptionCode::ServerId),
            Some(&DhcpOption::ServerId(duid()))
        );
        assert_eq!(
            adv.opts().get(OptionCode::DomainNameServers),
            Some(&DhcpOption::DomainNameServers(vec![ip6("fd00::53")]))
        );
        let request = message(
            MessageType::Request,
            vec![
                DhcpOption::ClientId(client_duid()),
                DhcpOption::ServerId(duid()),
                ia(Some("fd00::10")),
            ],
        );
        let rep = reply(&run(&request, CLIENT, true));
        assert_eq!(rep.msg_type(), MessageType::Reply);
        assert_eq!(granted(&rep).map(|g| g.0), Ok(ip6("fd00::10")));
    }

    #[test]
    fn the_pool_s_search_list_and_ntp_host_names_go_out_as_options_24_and_56() {
        let pool = snapshot_of(vmdhcp_core::pool::PoolConfig {
            domain_search: vec!["example.test".into()],
            ntp: vec!["ntp.example.test".into(), "192.0.2.5".into()],
            ..config()
        });
        let info = message(
            MessageType::InformationRequest,
            vec![DhcpOption::ClientId(client_duid())],
        );
        let outcome = run_on(&pool, &info, CLIENT, true, &|_| false);
        let rep = reply(&outcome);
        assert_eq!(
            rep.opts().get(OptionCode::DomainSearchList),
            Some(&DhcpOption::DomainSearchList(vec![
                Name::from_ascii("example.test.").unwrap()
            ]))
        );
        // Only the host name: an IPv4 address has no place in DHCPv6.
        assert_eq!(
            rep.opts().get(OptionCode::NtpServer),
            Some(&DhcpOption::NtpServer(vec![NtpSuboption::FQDN(
                Name::from_ascii("ntp.example.test.").unwrap()
            )]))
        );
    }

    #[test]
    fn rapid_commit_replies_at_once() {
        let solicit = message(
            MessageType::Solicit,
            vec![
                DhcpOption::ClientId(client_duid()),
                DhcpOption::RapidCommit,
                ia(None),
            ],
        );
        let rep = reply(&run(&solicit, CLIENT, true));
        assert_eq!(rep.msg_type(), MessageType::Reply);
        assert!(rep.opts().get(OptionCode::RapidCommit).is_some());
        assert_eq!(granted(&rep).map(|g| g.0), Ok(ip6("fd00::10")));
    }

    #[test]
    fn an_unknown_client_gets_nothing_to_a_solicit_and_no_addrs_to_a_request() {
        let solicit = message(
            MessageType::Solicit,
            vec![DhcpOption::ClientId(client_duid()), ia(None)],
        );
        assert_eq!(
            run(&solicit, STRANGER, true),
            Outcome::Silent(Silence::UnknownClient)
        );
        let request = message(
            MessageType::Request,
            vec![
                DhcpOption::ClientId(client_duid()),
                DhcpOption::ServerId(duid()),
                ia(None),
            ],
        );
        assert_eq!(
            granted(&reply(&run(&request, STRANGER, true))),
            Err(Status::NoAddrsAvail)
        );
        let renew = message(
            MessageType::Renew,
            vec![
                DhcpOption::ClientId(client_duid()),
                DhcpOption::ServerId(duid()),
                ia(Some("fd00::10")),
            ],
        );
        assert_eq!(
            granted(&reply(&run(&renew, STRANGER, true))),
            Err(Status::NoBinding)
        );
    }

    #[test]
    fn a_duid_ll_names_the_nic_when_the_frame_does_not() {
        let mut duid_ll = vec![0, 3, 0, 1];
        duid_ll.extend_from_slice(&CLIENT.0);
        assert_eq!(duid_mac(&duid_ll), Some(CLIENT));
        let mut duid_llt = vec![0, 1, 0, 1, 0, 0, 0, 9];
        duid_llt.extend_from_slice(&CLIENT.0);
        assert_eq!(duid_mac(&duid_llt), Some(CLIENT));
        assert_eq!(duid_mac(&client_duid()), None);
        assert_eq!(duid_mac(&[0, 3, 0, 1, 2]), None);
        let solicit = message(
            MessageType::Solicit,
            vec![DhcpOption::ClientId(duid_ll), ia(None)],
        );
        assert_eq!(
            granted(&reply(&run(&solicit, STRANGER, true))).map(|g| g.0),
            Ok(ip6("fd00::10"))
        );
    }

    #[test]
    fn renews_naming_another_server_are_ignored_and_ours_answered_after_a_failover() {
        let renew = |server: Vec<u8>| {
            message(
                MessageType::Renew,
                vec![
                    DhcpOption::ClientId(client_duid()),
                    DhcpOption::ServerId(server),
                    ia(Some("fd00::10")),
                ],
            )
        };
        assert_eq!(
            run(&renew(vec![0, 4, 9, 9]), CLIENT, true),
            Outcome::Silent(Silence::OtherServer)
        );
        // The DUID is the pool's: any replica computes the same and answers.
        assert_eq!(
            granted(&reply(&run(&renew(duid()), CLIENT, true))).map(|g| g.0),
            Ok(ip6("fd00::10"))
        );
    }

    #[test]
    fn rebind_after_a_move_hears_the_old_address_is_gone() {
        let rebind = message(
            MessageType::Rebind,
            vec![DhcpOption::ClientId(client_duid()), ia(Some("fd99::5"))],
        );
        let rep = reply(&run(&rebind, CLIENT, true));
        let Some(DhcpOption::IANA(iana)) = rep.opts().get(OptionCode::IANA) else {
            panic!("{rep:?}");
        };
        let addrs: Vec<(Ipv6Addr, u32)> = iana
            .opts
            .get_all(OptionCode::IAAddr)
            .unwrap()
            .iter()
            .filter_map(|o| match o {
                DhcpOption::IAAddr(a) => Some((a.addr, a.valid_life)),
                _ => None,
            })
            .collect();
        assert!(addrs.contains(&(ip6("fd00::10"), 1000)), "{addrs:?}");
        assert!(addrs.contains(&(ip6("fd99::5"), 0)), "{addrs:?}");
        // A stranger rebinding an address of our link: not ours to answer.
        let theirs = message(
            MessageType::Rebind,
            vec![DhcpOption::ClientId(client_duid()), ia(Some("fd00::77"))],
        );
        assert_eq!(
            run(&theirs, STRANGER, true),
            Outcome::Silent(Silence::NotOurs)
        );
    }

    #[test]
    fn confirm_says_whether_the_addresses_are_on_link() {
        let confirm = |a: &str| {
            message(
                MessageType::Confirm,
                vec![DhcpOption::ClientId(client_duid()), ia(Some(a))],
            )
        };
        assert_eq!(
            top_status(&reply(&run(&confirm("fd00::10"), CLIENT, true))),
            Some(Status::Success)
        );
        assert_eq!(
            top_status(&reply(&run(&confirm("fd42::10"), CLIENT, true))),
            Some(Status::NotOnLink)
        );
    }

    #[test]
    fn release_and_decline_are_acknowledged_and_a_decline_of_our_address_is_verified() {
        let opts = |a: &str| {
            vec![
                DhcpOption::ClientId(client_duid()),
                DhcpOption::ServerId(duid()),
                ia(Some(a)),
            ]
        };
        let rel = reply(&run(
            &message(MessageType::Release, opts("fd00::10")),
            CLIENT,
            true,
        ));
        assert_eq!(top_status(&rel), Some(Status::Success));
        match run(
            &message(MessageType::Decline, opts("fd00::10")),
            CLIENT,
            true,
        ) {
            Outcome::Answer { also, .. } => {
                assert_eq!(also, Some(Silence::Declined(ip6("fd00::10"))));
            }
            other => panic!("{other:?}"),
        }
        // Declining an address it does not hold costs nothing.
        match run(
            &message(MessageType::Decline, opts("fd00::11")),
            CLIENT,
            true,
        ) {
            Outcome::Answer { also, .. } => assert_eq!(also, None),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn information_requests_get_the_options_and_unicast_requests_use_multicast() {
        let info = message(
            MessageType::InformationRequest,
            vec![DhcpOption::ClientId(client_duid())],
        );
        let rep = reply(&run(&info, STRANGER, true));
        assert!(rep.opts().get(OptionCode::DomainNameServers).is_some());
        assert!(rep.opts().get(OptionCode::IANA).is_none());
        assert_eq!(
            run(&info, STRANGER, false),
            Outcome::Dropped(DropReason::UnicastNotAllowed)
        );
        let request = message(
            MessageType::Request,
            vec![
                DhcpOption::ClientId(client_duid()),
                DhcpOption::ServerId(duid()),
                ia(None),
            ],
        );
        assert_eq!(
            top_status(&reply(&run(&request, CLIENT, false))),
            Some(Status::UseMulticast)
        );
    }

    #[test]
    fn rule_breakers_and_our_own_frames_are_dropped_by_reason() {
        let no_id = message(MessageType::Solicit, vec![ia(None)]);
        assert_eq!(
            run(&no_id, CLIENT, true),
            Outcome::Dropped(DropReason::NoClientId)
        );
        let with_server = message(
            MessageType::Solicit,
            vec![
                DhcpOption::ClientId(client_duid()),
                DhcpOption::ServerId(duid()),
            ],
        );
        assert_eq!(
            run(&with_server, CLIENT, true),
            Outcome::Dropped(DropReason::ServerIdRule)
        );
        let advertise = message(
            MessageType::Advertise,
            vec![DhcpOption::ClientId(client_duid())],
        );
        assert_eq!(
            run(&advertise, CLIENT, true),
            Outcome::Dropped(DropReason::NotClientMessage)
        );
        assert_eq!(
            run(&[1, 2], CLIENT, true),
            Outcome::Dropped(DropReason::Malformed)
        );
        assert_eq!(
            run(&[], CLIENT, true),
            Outcome::Dropped(DropReason::Malformed)
        );
        let big = vec![1u8; MAX_PACKET + 1];
        assert_eq!(
            run(&big, CLIENT, true),
            Outcome::Dropped(DropReason::Oversized)
        );
        let solicit = message(
            MessageType::Solicit,
            vec![DhcpOption::ClientId(client_duid()), ia(None)],
        );
        assert_eq!(
            run(&solicit, OURS, true),
            Outcome::Silent(Silence::OwnInterface)
        );
    }

    #[test]
    fn sources_no_one_host_owns_and_direct_messages_from_beyond_the_link_are_dropped() {
        let solicit = message(
            MessageType::Solicit,
            vec![DhcpOption::ClientId(client_duid()), ia(None)],
        );
        let from = |mac: MacAddr, source: &str| {
            run_sourced(&snapshot(), &solicit, (mac, ip6(source)), true, &|_| false)
        };
        for source in ["ff02::1", "ff02::1:2", "::", "::1"] {
            assert_eq!(
                from(CLIENT, source),
                Outcome::Dropped(DropReason::SourceNotUnicast),
                "{source}"
            );
        }
        let group = MacAddr([0x33, 0x33, 0, 0, 0, 1]);
        assert_eq!(
            from(group, "fe80::1"),
            Outcome::Dropped(DropReason::SourceNotUnicast)
        );
        // A direct message from a global source: dropped; from a link-local one: answered.
        assert_eq!(
            from(CLIENT, "fd00::77"),
            Outcome::Dropped(DropReason::SourceNotLinkLocal)
        );
        assert!(matches!(from(CLIENT, "fe80::1"), Outcome::Answer { .. }));
        // A relay may speak from its global address; not from a group one.
        let relayed = relay_forw(&solicit, 0, Some(CLIENT));
        let via = |source: &str| {
            run_sourced(
                &snapshot(),
                &relayed,
                (STRANGER, ip6(source)),
                false,
                &|_| false,
            )
        };
        assert!(matches!(via("fd00::1"), Outcome::Answer { .. }));
        assert_eq!(
            via("ff02::1"),
            Outcome::Dropped(DropReason::SourceNotUnicast)
        );
    }

    #[test]
    fn a_request_naming_many_ias_is_answered_for_the_first_few_of_each_kind() {
        let mut opts = vec![DhcpOption::ClientId(client_duid())];
        for id in 0..85u32 {
            opts.push(DhcpOption::IANA(IANA {
                id,
                t1: 0,
                t2: 0,
                opts: DhcpOptions::new(),
            }));
            opts.push(DhcpOption::IATA(IATA {
                id,
                opts: DhcpOptions::new(),
            }));
            opts.push(DhcpOption::IAPD(IAPD {
                id,
                t1: 0,
                t2: 0,
                opts: DhcpOptions::new(),
            }));
        }
        let solicit = message(MessageType::Solicit, opts);
        let outcome = run(&solicit, CLIENT, true);
        let answered = reply(&outcome);
        let count = |code| answered.opts().get_all(code).map_or(0, |all| all.len());
        assert_eq!(
            (
                count(OptionCode::IANA),
                count(OptionCode::IATA),
                count(OptionCode::IAPD)
            ),
            (MAX_IAS, MAX_IAS, MAX_IAS)
        );
        // One of them still gets the reservation; the reply stays smaller than the request.
        let given: Vec<Vec<Ipv6Addr>> = answered
            .opts()
            .get_all(OptionCode::IANA)
            .unwrap_or_default()
            .iter()
            .filter_map(|o| match o {
                DhcpOption::IANA(ia) => Some(addresses_in(&ia.opts)),
                _ => None,
            })
            .filter(|given| !given.is_empty())
            .collect();
        assert_eq!(given, [vec![ip6("fd00::10")]], "{answered:?}");
        let Outcome::Answer { bytes, .. } = outcome else {
            unreachable!("answered above")
        };
        assert!(
            bytes.len() < solicit.len(),
            "{} ≥ {}",
            bytes.len(),
            solicit.len()
        );
    }

    /// A RELAY-FORW around `inner`, from a relay that saw the client at `mac`.
    fn relay_forw(inner: &[u8], hop: u8, mac: Option<MacAddr>) -> Vec<u8> {
        let mut out = vec![u8::from(MessageType::RelayForw), hop];
        out.extend_from_slice(&ip6("fd00::1").octets());
        out.extend_from_slice(&ip6("fe80::99").octets());
        push_option(&mut out, OPTION_INTERFACE_ID, b"port7");
        if let Some(mac) = mac {
            let mut value = vec![0, 1];
            value.extend_from_slice(&mac.0);
            push_option(&mut out, OPTION_CLIENT_LINKLAYER_ADDR, &value);
        }
        push_option(&mut out, OPTION_RELAY_MSG, inner);
        out
    }

    #[test]
    fn a_relayed_solicit_is_answered_for_the_mac_the_relay_saw_in_a_relay_repl() {
        let solicit = message(
            MessageType::Solicit,
            vec![DhcpOption::ClientId(client_duid()), ia(None)],
        );
        // The frame comes from the relay; the relay names the client.
        let outcome = run(&relay_forw(&solicit, 0, Some(CLIENT)), STRANGER, false);
        let Outcome::Answer {
            bytes,
            to_relay,
            kind,
            ..
        } = outcome
        else {
            panic!("{outcome:?}");
        };
        assert!(to_relay);
        assert_eq!(kind, MessageType::Advertise);
        let mut as_forw = bytes.clone();
        as_forw[0] = u8::from(MessageType::RelayForw);
        let layer = Relay::parse(&as_forw).unwrap();
        assert_eq!(bytes[0], u8::from(MessageType::RelayRepl));
        assert_eq!(layer.interface_id, Some(&b"port7"[..]));
        assert_eq!(layer.peer, ip6("fe80::99").octets());
        let inner = Message::decode(&mut Decoder::new(layer.message)).unwrap();
        assert_eq!(granted(&inner).map(|g| g.0), Ok(ip6("fd00::10")));
        // Nested relays, within the limit: answered, wrapped twice.
        let twice = relay_forw(&relay_forw(&solicit, 0, Some(CLIENT)), 1, None);
        assert!(matches!(
            run(&twice, STRANGER, false),
            Outcome::Answer { .. }
        ));
        // Past the hop limit: dropped.
        let far = relay_forw(&solicit, HOP_COUNT_LIMIT, Some(CLIENT));
        assert_eq!(
            run(&far, STRANGER, false),
            Outcome::Dropped(DropReason::TooManyHops)
        );
        // Broken framing: dropped.
        let mut cut = relay_forw(&solicit, 0, Some(CLIENT));
        cut.truncate(cut.len() - 3);
        assert_eq!(
            run(&cut, STRANGER, false),
            Outcome::Dropped(DropReason::Malformed)
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// No datagram makes the handler panic, and whatever it answers decodes.
        #[test]
        fn no_datagram_panics_the_handler(bytes in proptest::collection::vec(any::<u8>(), 0..600), relay in any::<bool>()) {
            let payload = if relay { relay_forw(&bytes, 0, Some(CLIENT)) } else { bytes };
            let _ = run(&payload, CLIENT, true);
            let _ = run(&payload, STRANGER, false);
        }

        /// Messages that decode, with options drawn at random, are answered or refused, never
        /// with an address other than the client's own.
        #[test]
        fn only_the_reserved_address_is_ever_given(kind in 1u8..14, ids in any::<(bool, bool)>(), addr in any::<bool>(), from_client in any::<bool>()) {
            let mut opts = vec![ia(addr.then_some("fd00::10"))];
            if ids.0 { opts.push(DhcpOption::ClientId(client_duid())); }
            if ids.1 { opts.push(DhcpOption::ServerId(duid())); }
            let payload = message(MessageType::from(kind), opts);
            let from = if from_client { CLIENT } else { STRANGER };
            if let Outcome::Answer { bytes, to_relay: false, .. } = run(&payload, from, true) {
                let msg = Message::decode(&mut Decoder::new(&bytes)).unwrap();
                if let Ok((a, valid, _, _)) = granted_or_none(&msg) {
                    prop_assert!(valid == 0 || (from_client && a == ip6("fd00::10")), "{msg:?}");
                }
            }
        }
    }

    /// [`granted`], without panicking on a reply that has no IA_NA.
    fn granted_or_none(msg: &Message) -> Result<(Ipv6Addr, u32, u32, u32), Status> {
        if msg.opts().get(OptionCode::IANA).is_none() {
            return Err(Status::Success);
        }
        granted(msg)
    }
}
