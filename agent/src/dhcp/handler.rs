//! What the server answers to one datagram: validation, RFC 2131 state logic, reply options and
//! reply addressing, as pure functions of the packet bytes and one [`PoolSnapshot`].
//!
//! Nothing here does I/O or mutates state: a DECLINE comes back as [`Silence::Declined`] and the
//! caller records it. Every byte sequence yields an [`Outcome`]; nothing a packet holds can panic.

use std::net::{Ipv4Addr, SocketAddrV4};

use dhcproto::v4::{DhcpOption, Flags, Message, MessageType, Opcode, OptionCode};
use dhcproto::{Decodable, Encodable, Name};
use vmdhcp_core::MacAddr;
use vmdhcp_core::pool::{DEFAULT_LEASE_SECONDS, PoolConfig};

use super::{CLIENT_PORT, SERVER_PORT};
use crate::lease_table::PoolSnapshot;

/// Largest datagram accepted: an Ethernet MTU's worth. Larger ones are dropped as oversized.
pub const MAX_PACKET: usize = 1500;
/// Smallest reply sent: BOOTP relays and old clients drop shorter ones (RFC 1542 §2.1).
const MIN_REPLY: usize = 300;
/// Fixed BOOTP header plus the magic cookie; options start here.
const OPTIONS_START: usize = 240;
const MAGIC_COOKIE: [u8; 4] = [99, 130, 83, 99];
/// IP + UDP headers, which RFC 2132 §9.10's maximum message size includes.
const IP_UDP_HEADERS: usize = 28;
/// Every client must accept this much (RFC 2131 §2); used when option 57 is absent or smaller.
const MIN_MAX_MESSAGE: usize = 576;

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
    let (sanitized, relay_info) = match sanitize(packet) {
        Ok(parts) => parts,
        Err(reason) => return Outcome::drop(reason),
    };
    let request = match Message::from_bytes(&sanitized) {
        Ok(m) => m,
        Err(_) => return Outcome::drop(DropReason::BadOptions),
    };
    let mut chaddr = [0u8; 6];
    chaddr.copy_from_slice(&packet[28..34]);
    let mac = reservation_key(&request, MacAddr(chaddr), pool);
    let Some(kind) = request.opts().msg_type() else {
        return Outcome::drop(DropReason::NoMessageType);
    };
    let action = decide(&request, &relay_info, kind, mac, pool, is_conflicted);
    Outcome {
        request: Some(kind),
        mac: Some(mac),
        action,
    }
}

/// The MAC whose reservation answers this client: its hardware address (`chaddr`) when the pool
/// has a reservation for it, else the hardware address inside its client identifier (option 61,
/// type 1 = Ethernet, RFC 2132 §9.14) when that has one, else `chaddr` (an unknown client).
/// Reservations come from the VM NIC's MAC; a client that names itself by that MAC in option 61
/// while its frames carry another (a bond, a rewritten or regenerated NIC address) still gets its
/// address. Other identifiers (DUIDs, RFC 4361) cannot be mapped to a NIC and are ignored.
fn reservation_key(request: &Message, chaddr: MacAddr, pool: &PoolSnapshot) -> MacAddr {
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

/// Checks what `dhcproto` is lenient about (header fields, the cookie, option framing, the
/// lengths of the options the state logic reads) and returns the packet with only those options
/// kept. `dhcproto` decodes every option it knows and some of its decoders assume well-formed
/// input (a classless-route option with a prefix over 32 panics), so it never sees the others.
fn sanitize(packet: &[u8]) -> Result<(Vec<u8>, Vec<u8>), DropReason> {
    if packet.len() > MAX_PACKET {
        return Err(DropReason::Oversized);
    }
    if packet.len() < OPTIONS_START {
        return Err(DropReason::Truncated);
    }
    if packet[0] != 1 {
        return Err(DropReason::NotBootRequest);
    }
    if packet[1] != 1 || packet[2] != 6 {
        return Err(DropReason::BadHardware);
    }
    if packet[236..240] != MAGIC_COOKIE {
        return Err(DropReason::BadMagic);
    }
    let mut kept = Vec::with_capacity(packet.len());
    kept.extend_from_slice(&packet[..OPTIONS_START]);
    // Option 82 (relay agent information) is echoed verbatim, never interpreted (RFC 3046 §2.2).
    let mut relay_info = Vec::new();
    let mut at = OPTIONS_START;
    while at < packet.len() {
        let code = packet[at];
        match code {
            0 => at += 1,
            255 => break,
            _ => {
                let Some(&len) = packet.get(at + 1) else {
                    return Err(DropReason::BadOptions);
                };
                let len = usize::from(len);
                let end = at + 2 + len;
                if end > packet.len() {
                    return Err(DropReason::BadOptions);
                }
                let wanted = match code {
                    53 => Some(len == 1),
                    50 | 54 => Some(len == 4),
                    57 => Some(len == 2),
                    55 | 61 => Some(len >= 1),
                    _ => None,
                };
                match wanted {
                    Some(true) => kept.extend_from_slice(&packet[at..end]),
                    Some(false) => return Err(DropReason::BadOptions),
                    None if code == 82 => relay_info.extend_from_slice(&packet[at..end]),
                    None => {}
                }
                at = end;
            }
        }
    }
    kept.push(255);
    Ok((kept, relay_info))
}

fn decide(
    request: &Message,
    relay_info: &[u8],
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
        MessageType::Inform => reply(request, relay_info, MessageType::Ack, None, pool),
        _ if is_conflicted(&leased) => Action::Silent(Silence::Conflicted(leased)),
        MessageType::Discover => reply(request, relay_info, MessageType::Offer, Some(leased), pool),
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
                reply(request, relay_info, MessageType::Ack, Some(leased), pool)
            } else {
                reply(request, relay_info, MessageType::Nak, None, pool)
            }
        }
    }
}

/// Builds an OFFER, ACK or NAK (RFC 2131 table 3) and works out where it goes (§4.1).
/// `leased` is `None` for NAK and for the ACK to an INFORM, which carry no lease.
fn reply(
    request: &Message,
    relay_info: &[u8],
    kind: MessageType,
    leased: Option<Ipv4Addr>,
    pool: &PoolSnapshot,
) -> Action {
    let config = pool.config();
    let ntp = pool.ntp_addresses();
    let unspecified = Ipv4Addr::UNSPECIFIED;
    let ciaddr = match kind {
        MessageType::Ack => request.ciaddr(),
        _ => unspecified,
    };
    let siaddr = if kind == MessageType::Nak {
        unspecified
    } else {
        config.server_ip
    };
    let mut msg = Message::new_with_id(
        request.xid(),
        ciaddr,
        leased.unwrap_or(unspecified),
        siaddr,
        request.giaddr(),
        request.chaddr(),
    );
    msg.set_opcode(Opcode::BootReply);
    msg.set_htype(request.htype());
    let relayed = request.giaddr() != unspecified;
    let mut flags = request.flags();
    if kind == MessageType::Nak && relayed {
        // The relay must broadcast a NAK: the client may hold an address on the wrong subnet.
        flags = flags.set_broadcast();
    }
    msg.set_flags(Flags::new(u16::from(flags)));

    let opts = msg.opts_mut();
    opts.insert(DhcpOption::MessageType(kind));
    opts.insert(DhcpOption::ServerIdentifier(config.server_ip));
    if let Some(DhcpOption::ClientIdentifier(id)) = request.opts().get(OptionCode::ClientIdentifier)
    {
        // RFC 6842: a server that receives a client identifier sends it back.
        opts.insert(DhcpOption::ClientIdentifier(id.clone()));
    }
    if leased.is_some() {
        // 0 never reaches here from an IPPool (it means the default there too), but a config from
        // elsewhere must not hand out leases that expire at once.
        let lease = match config.lease_seconds {
            0 => DEFAULT_LEASE_SECONDS,
            n => n,
        };
        opts.insert(DhcpOption::AddressLeaseTime(lease));
        opts.insert(DhcpOption::Renewal(lease / 2));
        opts.insert(DhcpOption::Rebinding(t2(lease)));
    }
    let optional = if kind == MessageType::Nak {
        Vec::new()
    } else {
        pool_options(config, ntp, requested_codes(request).as_deref())
    };

    let budget = reply_budget(request);
    let Some(bytes) = encode_within(msg, optional, relay_info, budget) else {
        // Only what the request brought (an echoed option) can make encoding fail.
        return Action::Drop(DropReason::BadOptions);
    };

    let to = if relayed {
        SocketAddrV4::new(request.giaddr(), SERVER_PORT)
    } else if kind != MessageType::Nak && request.ciaddr() != unspecified {
        SocketAddrV4::new(request.ciaddr(), CLIENT_PORT)
    } else {
        // No address to unicast to without a raw socket writing the client's MAC into the ARP
        // cache, so replies to clients without ciaddr are broadcast, with or without the flag.
        SocketAddrV4::new(Ipv4Addr::BROADCAST, CLIENT_PORT)
    };
    Action::Reply(Reply { kind, to, bytes })
}

/// T2 = 87.5% of the lease (RFC 2131 §4.4.5), without overflow.
fn t2(lease: u32) -> u32 {
    u32::try_from(u64::from(lease) * 7 / 8).unwrap_or(u32::MAX)
}

/// Option codes of the client's parameter request list (55), if it sent one.
fn requested_codes(request: &Message) -> Option<Vec<u8>> {
    match request.opts().get(OptionCode::ParameterRequestList) {
        Some(DhcpOption::ParameterRequestList(codes)) => {
            Some(codes.iter().map(|c| u8::from(*c)).collect())
        }
        _ => None,
    }
}

/// The most a reply may hold: the client's option 57 (which counts IP and UDP headers), never
/// below what every client must accept, nor above one Ethernet frame.
fn reply_budget(request: &Message) -> usize {
    let max = match request.opts().get(OptionCode::MaxMessageSize) {
        Some(DhcpOption::MaxMessageSize(n)) => usize::from(*n),
        _ => MIN_MAX_MESSAGE,
    };
    max.clamp(MIN_MAX_MESSAGE, MAX_PACKET) - IP_UDP_HEADERS
}

/// The pool's options, in the order they are given up when a reply is too big for the client:
/// the most important first. With a parameter request list, only what it asks for.
fn pool_options(
    config: &PoolConfig,
    ntp: &[Ipv4Addr],
    requested: Option<&[u8]>,
) -> Vec<DhcpOption> {
    let mut all = vec![DhcpOption::SubnetMask(config.subnet.netmask())];
    if let Some(router) = config.router {
        all.push(DhcpOption::Router(vec![router]));
    }
    if !config.dns.is_empty() {
        all.push(DhcpOption::DomainNameServer(config.dns.clone()));
    }
    all.push(DhcpOption::BroadcastAddr(config.subnet.broadcast()));
    if let Some(domain) = &config.domain_name {
        all.push(DhcpOption::DomainName(domain.clone()));
    }
    let search: Vec<Name> = config
        .domain_search
        .iter()
        .filter_map(|d| Name::from_ascii(d).ok())
        .collect();
    if !search.is_empty() {
        all.push(DhcpOption::DomainSearch(search));
    }
    // Host names were resolved off the packet path (see `super::ntp`).
    if !ntp.is_empty() {
        all.push(DhcpOption::NtpServers(ntp.to_vec()));
    }
    match requested {
        None => all,
        Some(codes) => all
            .into_iter()
            .filter(|o| codes.contains(&u8::from(OptionCode::from(o))))
            .collect(),
    }
}

/// Encodes `msg` with as many of `optional` (most important first) as fit in `budget`, then the
/// request's raw option 82 (`relay_info`, last, as RFC 3046 asks), padded to [`MIN_REPLY`].
/// The mandatory part alone always fits: it is far below 548 bytes.
fn encode_within(
    msg: Message,
    mut optional: Vec<DhcpOption>,
    relay_info: &[u8],
    budget: usize,
) -> Option<Vec<u8>> {
    loop {
        let mut attempt = msg.clone();
        for opt in &optional {
            attempt.opts_mut().insert(opt.clone());
        }
        match attempt.to_vec() {
            Ok(mut bytes) => {
                if !relay_info.is_empty() && bytes.last() == Some(&255) {
                    bytes.pop();
                    bytes.extend_from_slice(relay_info);
                    bytes.push(255);
                }
                if bytes.len() <= budget || optional.is_empty() {
                    return Some(pad(bytes));
                }
                optional.pop();
            }
            Err(_) if optional.is_empty() => return None,
            Err(_) => {
                optional.pop();
            }
        }
    }
}

fn pad(mut bytes: Vec<u8>) -> Vec<u8> {
    if bytes.len() < MIN_REPLY {
        bytes.resize(MIN_REPLY, 0);
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease_table::{LeaseTable, PoolLeases};
    use proptest::prelude::*;
    use std::sync::Arc;
    use vmdhcp_core::NamespacedName;
    use vmdhcp_core::pool::Lease;

    const SERVER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
    const LEASED: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
    const KNOWN: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
    const STRANGER: [u8; 6] = [0x02, 0, 0, 0, 0, 0xff];

    fn config() -> PoolConfig {
        PoolConfig {
            pool: NamespacedName::new("default", "a").unwrap(),
            network: NamespacedName::new("default", "a").unwrap(),
            interface_name: "eth1".into(),
            server_ip: SERVER,
            subnet: "192.0.2.0/24".parse().unwrap(),
            router: Some(Ipv4Addr::new(192, 0, 2, 254)),
            dns: vec![Ipv4Addr::new(192, 0, 2, 53), Ipv4Addr::new(192, 0, 2, 54)],
            domain_name: Some("example.test".into()),
            domain_search: vec!["example.test".into(), "svc.example.test".into()],
            ntp: vec!["192.0.2.123".into(), "ntp.example.test".into()],
            lease_seconds: 3600,
        }
    }

    fn pool_with(config: PoolConfig) -> Arc<PoolSnapshot> {
        let table = LeaseTable::new();
        let name = config.pool.clone();
        table.apply_snapshot(vec![PoolLeases {
            config,
            leases: vec![Lease {
                pool: name.clone(),
                mac: MacAddr(KNOWN),
                ip: LEASED,
            }],
        }]);
        table.pool(&name).unwrap()
    }

    fn pool() -> Arc<PoolSnapshot> {
        pool_with(config())
    }

    fn request(kind: MessageType, mac: [u8; 6]) -> Message {
        let u = Ipv4Addr::UNSPECIFIED;
        let mut m = Message::new_with_id(0x1234_5678, u, u, u, u, &mac);
        m.opts_mut().insert(DhcpOption::MessageType(kind));
        m
    }

    fn run(m: &Message) -> Outcome {
        handle(&m.to_vec().unwrap(), &pool(), |_| false)
    }

    fn reply_of(outcome: &Outcome) -> (MessageType, SocketAddrV4, Message) {
        match &outcome.action {
            Action::Reply(r) => (r.kind, r.to, Message::from_bytes(&r.bytes).unwrap()),
            other => panic!("expected a reply, got {other:?}"),
        }
    }

    fn broadcast() -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::BROADCAST, 68)
    }

    #[test]
    fn discover_gets_an_offer_with_every_option() {
        let (kind, to, offer) = reply_of(&run(&request(MessageType::Discover, KNOWN)));
        assert_eq!(kind, MessageType::Offer);
        assert_eq!(to, broadcast());
        assert_eq!(offer.opcode(), Opcode::BootReply);
        assert_eq!(offer.xid(), 0x1234_5678);
        assert_eq!(offer.yiaddr(), LEASED);
        assert_eq!(offer.ciaddr(), Ipv4Addr::UNSPECIFIED);
        assert_eq!(offer.chaddr(), KNOWN);
        let o = offer.opts();
        assert_eq!(o.msg_type(), Some(MessageType::Offer));
        assert_eq!(
            o.get(OptionCode::ServerIdentifier),
            Some(&DhcpOption::ServerIdentifier(SERVER))
        );
        assert_eq!(
            o.get(OptionCode::SubnetMask),
            Some(&DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 255, 0)))
        );
        assert_eq!(
            o.get(OptionCode::Router),
            Some(&DhcpOption::Router(vec![Ipv4Addr::new(192, 0, 2, 254)]))
        );
        assert_eq!(
            o.get(OptionCode::DomainNameServer),
            Some(&DhcpOption::DomainNameServer(config().dns))
        );
        assert_eq!(
            o.get(OptionCode::DomainName),
            Some(&DhcpOption::DomainName("example.test".into()))
        );
        assert_eq!(
            o.get(OptionCode::NtpServers),
            Some(&DhcpOption::NtpServers(vec![Ipv4Addr::new(192, 0, 2, 123)]))
        );
        assert_eq!(
            o.get(OptionCode::BroadcastAddr),
            Some(&DhcpOption::BroadcastAddr(Ipv4Addr::new(192, 0, 2, 255)))
        );
        assert_eq!(
            o.get(OptionCode::AddressLeaseTime),
            Some(&DhcpOption::AddressLeaseTime(3600))
        );
        assert_eq!(o.get(OptionCode::Renewal), Some(&DhcpOption::Renewal(1800)));
        assert_eq!(
            o.get(OptionCode::Rebinding),
            Some(&DhcpOption::Rebinding(3150))
        );
        let Some(DhcpOption::DomainSearch(names)) = o.get(OptionCode::DomainSearch) else {
            panic!("no search list");
        };
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        assert_eq!(names, ["example.test.", "svc.example.test."]);
    }

    #[test]
    fn search_list_is_rfc3397_encoded() {
        // example.test + svc.<pointer to example.test>: labels, then a compression pointer.
        let mut req = request(MessageType::Discover, KNOWN);
        req.opts_mut().insert(DhcpOption::ParameterRequestList(vec![
            OptionCode::DomainSearch,
        ]));
        let Action::Reply(r) = run(&req).action else {
            panic!()
        };
        let raw = &r.bytes;
        let at = raw
            .windows(2)
            .position(|w| w[0] == 119 && usize::from(w[1]) < 64)
            .filter(|&i| i >= OPTIONS_START)
            .unwrap();
        let len = usize::from(raw[at + 1]);
        let data = &raw[at + 2..at + 2 + len];
        let mut want = b"\x07example\x04test\x00".to_vec();
        want.extend_from_slice(b"\x03svc\xc0\x00");
        assert_eq!(data, want.as_slice());
    }

    #[test]
    fn parameter_request_list_limits_pool_options() {
        let mut req = request(MessageType::Discover, KNOWN);
        req.opts_mut().insert(DhcpOption::ParameterRequestList(vec![
            OptionCode::SubnetMask,
            OptionCode::Router,
        ]));
        let (_, _, offer) = reply_of(&run(&req));
        let o = offer.opts();
        assert!(o.get(OptionCode::SubnetMask).is_some());
        assert!(o.get(OptionCode::Router).is_some());
        assert!(o.get(OptionCode::DomainNameServer).is_none());
        assert!(o.get(OptionCode::DomainSearch).is_none());
        // Lease timing and the server identifier are not optional.
        assert!(o.get(OptionCode::AddressLeaseTime).is_some());
        assert!(o.get(OptionCode::Renewal).is_some());
        assert!(o.get(OptionCode::ServerIdentifier).is_some());
    }

    #[test]
    fn max_message_size_drops_least_important_options() {
        let mut cfg = config();
        cfg.domain_search = (0..40)
            .map(|i| format!("zone{i}.a-rather-long-domain-name.example.test"))
            .collect();
        let p = pool_with(cfg);
        let mut req = request(MessageType::Discover, KNOWN);
        req.opts_mut().insert(DhcpOption::MaxMessageSize(576));
        let Action::Reply(r) = handle(&req.to_vec().unwrap(), &p, |_| false).action else {
            panic!()
        };
        assert!(r.bytes.len() <= 576 - 28, "{}", r.bytes.len());
        let offer = Message::from_bytes(&r.bytes).unwrap();
        assert!(offer.opts().get(OptionCode::DomainSearch).is_none());
        assert!(offer.opts().get(OptionCode::SubnetMask).is_some());
        // With room (and 57 allowing it), the long list goes out, split per RFC 3396.
        let mut req = request(MessageType::Discover, KNOWN);
        req.opts_mut().insert(DhcpOption::MaxMessageSize(1500));
        let Action::Reply(r) = handle(&req.to_vec().unwrap(), &p, |_| false).action else {
            panic!()
        };
        assert!(r.bytes.len() > 576 && r.bytes.len() <= 1500 - 28);
        let offer = Message::from_bytes(&r.bytes).unwrap();
        let Some(DhcpOption::DomainSearch(names)) = offer.opts().get(OptionCode::DomainSearch)
        else {
            panic!("search list missing")
        };
        assert_eq!(names.len(), 40);
    }

    #[test]
    fn resolved_ntp_names_reach_the_next_reply() {
        let table = LeaseTable::new();
        let cfg = config();
        let name = cfg.pool.clone();
        table.apply_snapshot(vec![PoolLeases {
            config: cfg.clone(),
            leases: vec![Lease {
                pool: name.clone(),
                mac: MacAddr(KNOWN),
                ip: LEASED,
            }],
        }]);
        let resolved = Ipv4Addr::new(192, 0, 2, 124);
        table.set_ntp_addresses(
            &name,
            &cfg.ntp,
            vec![Ipv4Addr::new(192, 0, 2, 123), resolved],
        );
        let req = request(MessageType::Discover, KNOWN).to_vec().unwrap();
        let outcome = handle(&req, &table.pool(&name).unwrap(), |_| false);
        let (_, _, offer) = reply_of(&outcome);
        assert_eq!(
            offer.opts().get(OptionCode::NtpServers),
            Some(&DhcpOption::NtpServers(vec![
                Ipv4Addr::new(192, 0, 2, 123),
                resolved
            ]))
        );
    }

    #[test]
    fn replies_are_padded_to_bootp_minimum() {
        let p = pool_with(PoolConfig {
            router: None,
            dns: vec![],
            domain_name: None,
            domain_search: vec![],
            ntp: vec![],
            ..config()
        });
        let req = request(MessageType::Discover, KNOWN);
        let Action::Reply(r) = handle(&req.to_vec().unwrap(), &p, |_| false).action else {
            panic!()
        };
        assert_eq!(r.bytes.len(), 300);
    }

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
    fn relayed_requests_are_answered_to_the_relay() {
        let relay = Ipv4Addr::new(198, 51, 100, 1);
        let mut req = request(MessageType::Discover, KNOWN);
        req.set_giaddr(relay);
        req.set_hops(1);
        let (kind, to, offer) = reply_of(&run(&req));
        assert_eq!(
            (kind, to),
            (MessageType::Offer, SocketAddrV4::new(relay, 67))
        );
        assert_eq!(offer.giaddr(), relay);
        assert_eq!(offer.hops(), 0);
        // A relayed NAK asks the relay to broadcast it.
        let mut req = request(MessageType::Request, KNOWN);
        req.set_giaddr(relay);
        req.opts_mut()
            .insert(DhcpOption::RequestedIpAddress(Ipv4Addr::new(192, 0, 2, 99)));
        let (kind, to, nak) = reply_of(&run(&req));
        assert_eq!((kind, to), (MessageType::Nak, SocketAddrV4::new(relay, 67)));
        assert!(nak.flags().broadcast());
    }

    #[test]
    fn relay_agent_information_is_echoed_verbatim() {
        let mut b = request(MessageType::Discover, KNOWN).to_vec().unwrap();
        b.truncate(OPTIONS_START);
        // Option 82 with a circuit id (1) and a remote id (2), then 53 = DISCOVER.
        let option82 = [82u8, 8, 1, 2, 0x00, 0x07, 2, 2, 0xab, 0xcd];
        b.extend_from_slice(&option82);
        b.extend_from_slice(&[53, 1, 1, 255]);
        b[24..28].copy_from_slice(&[198, 51, 100, 1]);
        let Action::Reply(r) = handle(&b, &pool(), |_| false).action else {
            panic!()
        };
        let at = r
            .bytes
            .windows(option82.len())
            .position(|w| w == option82)
            .expect("option 82 echoed");
        assert!(at >= OPTIONS_START);
        assert_eq!(r.bytes[at + option82.len()], 255, "last option, before End");
        // Without it, nothing is added.
        let plain = request(MessageType::Discover, KNOWN).to_vec().unwrap();
        let Action::Reply(r) = handle(&plain, &pool(), |_| false).action else {
            panic!()
        };
        assert!(!r.bytes[OPTIONS_START..].windows(2).any(|w| w == [82, 8]));
    }

    #[test]
    fn broadcast_flag_and_client_identifier_are_echoed() {
        let mut req = request(MessageType::Discover, KNOWN);
        req.set_flags(Flags::default().set_broadcast());
        let id = vec![1, 2, 0, 0, 0, 0, 0x0a];
        req.opts_mut()
            .insert(DhcpOption::ClientIdentifier(id.clone()));
        let (_, to, offer) = reply_of(&run(&req));
        assert_eq!(to, broadcast());
        assert!(offer.flags().broadcast());
        assert_eq!(
            offer.opts().get(OptionCode::ClientIdentifier),
            Some(&DhcpOption::ClientIdentifier(id))
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

    #[test]
    fn lease_time_follows_the_pool() {
        let p = pool_with(PoolConfig {
            lease_seconds: u32::MAX,
            ..config()
        });
        let req = request(MessageType::Discover, KNOWN);
        let Action::Reply(r) = handle(&req.to_vec().unwrap(), &p, |_| false).action else {
            panic!()
        };
        let offer = Message::from_bytes(&r.bytes).unwrap();
        assert_eq!(
            offer.opts().get(OptionCode::Rebinding),
            Some(&DhcpOption::Rebinding(3_758_096_383))
        );
        assert_eq!(
            offer.opts().get(OptionCode::Renewal),
            Some(&DhcpOption::Renewal(2_147_483_647))
        );
    }

    #[test]
    fn a_zero_lease_time_means_the_default() {
        let p = pool_with(PoolConfig {
            lease_seconds: 0,
            ..config()
        });
        let req = request(MessageType::Discover, KNOWN);
        let Action::Reply(r) = handle(&req.to_vec().unwrap(), &p, |_| false).action else {
            panic!()
        };
        let offer = Message::from_bytes(&r.bytes).unwrap();
        assert_eq!(
            offer.opts().get(OptionCode::AddressLeaseTime),
            Some(&DhcpOption::AddressLeaseTime(DEFAULT_LEASE_SECONDS))
        );
    }

    #[test]
    fn bad_packets_are_dropped_with_their_reason() {
        let good = request(MessageType::Discover, KNOWN).to_vec().unwrap();
        let p = pool();
        let check = |bytes: &[u8], want: DropReason| {
            assert_eq!(
                handle(bytes, &p, |_| false).action,
                Action::Drop(want),
                "{want:?}"
            );
        };
        check(&good[..100], DropReason::Truncated);
        check(&[0u8; 1501], DropReason::Oversized);
        let mut b = good.clone();
        b[0] = 2;
        check(&b, DropReason::NotBootRequest);
        let mut b = good.clone();
        b[2] = 16;
        check(&b, DropReason::BadHardware);
        let mut b = good.clone();
        b[236] = 0;
        check(&b, DropReason::BadMagic);
        // Option 53 claiming 200 bytes runs off the end.
        let mut b = good.clone();
        b[241] = 200;
        check(&b, DropReason::BadOptions);
        // Option 53 with two bytes.
        let mut b = good[..240].to_vec();
        b.extend_from_slice(&[53, 2, 1, 1, 255]);
        check(&b, DropReason::BadOptions);
        let mut b = good[..240].to_vec();
        b.push(255);
        check(&b, DropReason::NoMessageType);
        let offer = request(MessageType::Offer, KNOWN).to_vec().unwrap();
        check(&offer, DropReason::NotClientMessage);
    }

    #[test]
    fn options_dhcproto_would_choke_on_are_never_decoded() {
        // Found by the property test: option 93 (client architecture) with a short length, and
        // option 121 with a prefix over 32, which dhcproto's decoder asserts or unwraps on.
        for bad in [&[93u8, 1, 0][..], &[121, 5, 40, 10, 0, 0, 0], &[124, 0]] {
            let mut b = request(MessageType::Discover, KNOWN).to_vec().unwrap();
            b.truncate(OPTIONS_START);
            b.extend_from_slice(bad);
            b.extend_from_slice(&[53, 1, 1, 255]);
            let (kind, _, _) = reply_of(&handle(&b, &pool(), |_| false));
            assert_eq!(kind, MessageType::Offer, "{bad:?}");
        }
    }

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
