//! The answer on the wire: an OFFER, ACK or NAK with the pool's options, fitted to what the
//! client accepts, padded for BOOTP relays, and the address it is sent to (RFC 2131 §4.1).

use std::net::{Ipv4Addr, SocketAddrV4};

use dhcproto::v4::{DhcpOption, Flags, Message, MessageType, Opcode, OptionCode, UnknownOption};
use dhcproto::{Encodable, Name};
use ipnet::Ipv4Net;
use vmdhcp_core::pool::{DEFAULT_LEASE_SECONDS, NicOptions, PoolConfig};

use super::boot;
use super::wire::{MAX_PACKET, Sanitized};
use super::{Action, DropReason, KeySlot, Reply};
use crate::dhcp::{CLIENT_PORT, SERVER_PORT, forcerenew};
use crate::lease_table::PoolSnapshot;

/// The BOOTP header's `file` field: a boot file shorter than this goes there as well.
const FILE_FIELD: usize = 128;
/// Smallest reply sent: BOOTP relays and old clients drop shorter ones (RFC 1542 §2.1).
pub(super) const MIN_REPLY: usize = 300;
/// IP + UDP headers, which RFC 2132 §9.10's maximum message size includes.
const IP_UDP_HEADERS: usize = 28;
/// Every client must accept this much (RFC 2131 §2); used when option 57 is absent or smaller.
const MIN_MAX_MESSAGE: usize = 576;

/// Builds an OFFER, ACK or NAK (RFC 2131 table 3) and works out where it goes (§4.1).
/// `leased` — the address and the host name it comes with, if any — is `None` for NAK and for
/// the ACK to an INFORM, which carry no lease. `wire` holds the raw option 82, echoed last, and
/// what the client said about booting from the network.
pub(super) fn reply(
    request: &Message,
    wire: &Sanitized,
    kind: MessageType,
    leased: Option<(Ipv4Addr, Option<&str>)>,
    nic: Option<&NicOptions>,
    pool: &PoolSnapshot,
) -> Action {
    let (host_name, leased) = (leased.and_then(|(_, n)| n), leased.map(|(ip, _)| ip));
    let config = pool.config();
    let ntp = pool.ntp_addresses();
    let unspecified = Ipv4Addr::UNSPECIFIED;
    let ciaddr = match kind {
        MessageType::Ack => request.ciaddr(),
        _ => unspecified,
    };
    let boot = match (&config.boot, kind) {
        (Some(boot), MessageType::Offer | MessageType::Ack) => boot::answer(boot, &wire.netboot),
        _ => None,
    }
    .map(|mut answer| {
        // The NIC's own boot file and TFTP server (its VM's `dhcpOptions`) win over the pool's.
        if let Some(n) = nic {
            answer.file = n.boot_file_name.as_deref().unwrap_or(answer.file);
            answer.tftp_server_name = n.tftp_server_name.as_deref().or(answer.tftp_server_name);
        }
        answer
    });
    let siaddr = match (kind, &boot) {
        (MessageType::Nak, _) => unspecified,
        (_, Some(b)) => b.next_server.unwrap_or(config.server_ip),
        (_, None) => config.server_ip,
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
    if let Some(b) = &boot
        && b.file.len() < FILE_FIELD
    {
        // Firmware that reads only the header's `file` finds it there too (NUL-terminated).
        msg.set_fname(b.file.as_bytes());
    }

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
    if boot.as_ref().is_some_and(|b| b.http) {
        // UEFI HTTP boot takes only offers that name it (UEFI specification, HTTP Boot).
        opts.insert(DhcpOption::ClassIdentifier(
            vmdhcp_core::pool::boot::HTTP_CLIENT.to_vec(),
        ));
    }
    let mut optional = if kind == MessageType::Nak {
        Vec::new()
    } else {
        let nic = nic.map(|options| Nic {
            options,
            boot_answered: boot.is_some(),
        });
        pool_options(
            config,
            ntp,
            host_name,
            nic,
            requested_codes(request).as_deref(),
        )
    };
    if let Some(b) = &boot {
        // Right after the addressing, whatever the client asked for: without them a booting
        // client has nothing to load, and firmware does not always list them in option 55.
        let mut booting = vec![DhcpOption::BootfileName(b.file.as_bytes().to_vec())];
        if let Some(name) = b.tftp_server_name {
            booting.push(DhcpOption::TFTPServerName(name.as_bytes().to_vec()));
        }
        if b.ipxe {
            booting.push(DhcpOption::Unknown(UnknownOption::new(
                OptionCode::from(boot::IPXE_ENCAPSULATED),
                boot::IPXE_NO_PXEDHCP.to_vec(),
            )));
        }
        let after = optional
            .iter()
            .take_while(|o| matches!(o, DhcpOption::SubnetMask(_) | DhcpOption::Router(_)))
            .count();
        optional.splice(after..after, booting);
    }

    let budget = reply_budget(request);
    let keyed = wire.forcerenew_nonce && kind == MessageType::Ack && leased.is_some();
    let Some((bytes, key_at)) = encode_within(msg, keyed, optional, &wire.relay_info, budget)
    else {
        // Only what the request brought (an echoed option) can make encoding fail.
        return Action::Drop(DropReason::BadOptions);
    };

    let mut unicast_to = None;
    let to = if relayed {
        SocketAddrV4::new(request.giaddr(), SERVER_PORT)
    } else if kind != MessageType::Nak && request.ciaddr() != unspecified {
        let chaddr = request.chaddr();
        unicast_to =
            (request.htype() == dhcproto::v4::HType::Eth && chaddr.len() >= 6).then(|| {
                let mut mac = [0u8; 6];
                mac.copy_from_slice(&chaddr[..6]);
                vmdhcp_core::MacAddr(mac)
            });
        SocketAddrV4::new(request.ciaddr(), CLIENT_PORT)
    } else {
        // No address to unicast to without a raw socket writing the client's MAC into the ARP
        // cache, so replies to clients without ciaddr are broadcast, with or without the flag.
        SocketAddrV4::new(Ipv4Addr::BROADCAST, CLIENT_PORT)
    };
    let key_slot = key_at.zip(leased).map(|(at, ip)| KeySlot {
        at,
        target: forcerenew::Target {
            xid: request.xid(),
            ip,
        },
    });
    Action::Reply(Reply {
        kind,
        to,
        bytes,
        unicast_to,
        key_slot,
    })
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

/// A NIC's own options, and whether a boot answer already carries its boot file.
#[derive(Clone, Copy)]
struct Nic<'a> {
    options: &'a NicOptions,
    boot_answered: bool,
}

/// The pool's options, with the NIC's own over them, in the order they are given up when a
/// reply is too big for the client: the most important first. With a parameter request list,
/// only what it asks for (as KubeVirt's own DHCP server sends an interface's options).
fn pool_options(
    config: &PoolConfig,
    ntp: &[Ipv4Addr],
    host_name: Option<&str>,
    nic: Option<Nic<'_>>,
    requested: Option<&[u8]>,
) -> Vec<DhcpOption> {
    // The NIC's NTP servers replace the pool's.
    let ntp = match nic {
        Some(n) if !n.options.ntp_servers.is_empty() => &n.options.ntp_servers[..],
        _ => ntp,
    };
    let mut all = vec![DhcpOption::SubnetMask(config.subnet.netmask())];
    if let Some(router) = config.router {
        all.push(DhcpOption::Router(vec![router]));
    }
    if let Some(mtu) = config.mtu {
        all.push(DhcpOption::InterfaceMtu(mtu));
    }
    let routes = classless_routes(config);
    if !routes.is_empty() {
        all.push(DhcpOption::ClasslessStaticRoute(routes.clone()));
    }
    if !config.dns.is_empty() {
        all.push(DhcpOption::DomainNameServer(config.dns.clone()));
    }
    if let Some(name) = host_name {
        all.push(DhcpOption::Hostname(name.to_owned()));
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
    // The same routes under Microsoft's code, only to clients that ask for it by name.
    if !routes.is_empty() && requested.is_some_and(|c| c.contains(&MS_CLASSLESS_ROUTES)) {
        all.push(DhcpOption::Unknown(UnknownOption::new(
            OptionCode::from(MS_CLASSLESS_ROUTES),
            rfc3442(&routes),
        )));
    }
    if let Some(n) = nic {
        let o = n.options;
        if !n.boot_answered {
            if let Some(file) = &o.boot_file_name {
                all.push(DhcpOption::BootfileName(file.as_bytes().to_vec()));
            }
            if let Some(tftp) = &o.tftp_server_name {
                all.push(DhcpOption::TFTPServerName(tftp.as_bytes().to_vec()));
            }
        }
        for (code, value) in &o.private {
            all.push(DhcpOption::Unknown(UnknownOption::new(
                OptionCode::from(*code),
                value.as_bytes().to_vec(),
            )));
        }
    }
    match requested {
        None => all,
        Some(codes) => all
            .into_iter()
            .filter(|o| codes.contains(&u8::from(OptionCode::from(o))))
            .collect(),
    }
}

/// Microsoft's code for classless static routes, the encoding of option 121.
const MS_CLASSLESS_ROUTES: u8 = 249;

/// The pool's classless static routes as option 121 carries them: a client that gets them
/// ignores option 3 (RFC 3442 §3), so the default route via the router, if the pool gives
/// one, comes first among them. Empty when the pool has no routes (option 3 then suffices).
fn classless_routes(config: &PoolConfig) -> Vec<(Ipv4Net, Ipv4Addr)> {
    if config.routes.is_empty() {
        return Vec::new();
    }
    let default = config.router.map(|router| (Ipv4Net::default(), router));
    default
        .into_iter()
        .chain(config.routes.iter().map(|r| (r.destination, r.gateway)))
        .collect()
}

/// RFC 3442's encoding: per route, the prefix length, the significant octets of the
/// destination, then the gateway.
fn rfc3442(routes: &[(Ipv4Net, Ipv4Addr)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(routes.len() * 9);
    for (destination, gateway) in routes {
        let significant = usize::from(destination.prefix_len().div_ceil(8));
        out.push(destination.prefix_len());
        out.extend_from_slice(&destination.network().octets()[..significant]);
        out.extend_from_slice(&gateway.octets());
    }
    out
}

/// Encodes `msg` with as many of `optional` (most important first) as fit in `budget`, then the
/// request's raw option 82 (`relay_info`, last, as RFC 3046 asks), padded to [`MIN_REPLY`].
/// The mandatory part alone always fits: it is far below 548 bytes.
///
/// The optional options are encoded one by one after the mandatory ones, each kept while the
/// reply still fits, rather than inserted into the message's option map and the whole message
/// encoded again per attempt: those inserts and re-encodings were a third of the CPU the agent
/// spends in user space per DORA (docs/benchmarks.md).
///
/// With `keyed`, option 90 follows the mandatory options, its replay counter and key zero, and
/// where its data starts comes back with the bytes.
fn encode_within(
    msg: Message,
    keyed: bool,
    optional: Vec<DhcpOption>,
    relay_info: &[u8],
    budget: usize,
) -> Option<(Vec<u8>, Option<usize>)> {
    let mut bytes = msg.to_vec().ok()?;
    // dhcproto ends the options with End (255); what follows goes in before it.
    if bytes.pop() != Some(u8::from(OptionCode::End)) {
        return None;
    }
    let key_at = keyed.then(|| forcerenew::key_option(&mut bytes));
    let room = budget.saturating_sub(relay_info.len() + 1);
    for opt in &optional {
        // An option that cannot be encoded, or does not fit, ends the list: what comes after it
        // matters less, and a reply keeps the most important options first.
        match opt.to_vec() {
            Ok(encoded) if bytes.len() + encoded.len() <= room => bytes.extend_from_slice(&encoded),
            _ => break,
        }
    }
    bytes.extend_from_slice(relay_info);
    bytes.push(u8::from(OptionCode::End));
    Some((pad(bytes), key_at))
}

fn pad(mut bytes: Vec<u8>) -> Vec<u8> {
    if bytes.len() < MIN_REPLY {
        bytes.resize(MIN_REPLY, 0);
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;

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

    /// The fixture pool with MTU 1450 and one route, 10.96.0.0/12 via .254; `default_route`
    /// false drops its router.
    fn routed(default_route: bool) -> Arc<PoolSnapshot> {
        let mut config = config();
        config.mtu = Some(1450);
        config.routes = vec![vmdhcp_core::pool::Route {
            destination: "10.96.0.0/12".parse().unwrap(),
            gateway: Ipv4Addr::new(192, 0, 2, 254),
        }];
        if !default_route {
            config.router = None;
        }
        pool_with(config)
    }

    fn ask(codes: &[u8]) -> Message {
        let mut req = request(MessageType::Discover, KNOWN);
        req.opts_mut().insert(DhcpOption::ParameterRequestList(
            codes.iter().map(|c| OptionCode::from(*c)).collect(),
        ));
        req
    }

    fn reply_from(pool: &PoolSnapshot, req: &Message) -> Message {
        reply_of(&handle(&req.to_vec().unwrap(), pool, |_| false)).2
    }

    #[test]
    fn mtu_and_classless_routes_with_the_default_route_first() {
        let offer = reply_from(&routed(true), &ask(&[1, 3, 26, 121]));
        let o = offer.opts();
        assert_eq!(
            o.get(OptionCode::InterfaceMtu),
            Some(&DhcpOption::InterfaceMtu(1450))
        );
        let gw = Ipv4Addr::new(192, 0, 2, 254);
        assert_eq!(
            o.get(OptionCode::ClasslessStaticRoute),
            Some(&DhcpOption::ClasslessStaticRoute(vec![
                ("0.0.0.0/0".parse().unwrap(), gw),
                ("10.96.0.0/12".parse().unwrap(), gw),
            ]))
        );
        // Option 3 still goes to clients that ignore 121.
        assert_eq!(
            o.get(OptionCode::Router),
            Some(&DhcpOption::Router(vec![gw]))
        );
        // 249 only when asked for.
        assert!(o.get(OptionCode::from(249)).is_none());
    }

    #[test]
    fn without_a_default_route_no_router_and_no_default_among_the_routes() {
        let offer = reply_from(&routed(false), &ask(&[1, 3, 121, 249]));
        let o = offer.opts();
        assert!(o.get(OptionCode::Router).is_none());
        let gw = Ipv4Addr::new(192, 0, 2, 254);
        let want = vec![("10.96.0.0/12".parse().unwrap(), gw)];
        assert_eq!(
            o.get(OptionCode::ClasslessStaticRoute),
            Some(&DhcpOption::ClasslessStaticRoute(want.clone()))
        );
        // Microsoft's 249: the same bytes as 121 (RFC 3442), for clients that ask for it.
        let Some(DhcpOption::Unknown(ms)) = o.get(OptionCode::from(249)) else {
            panic!("no option 249: {o:?}");
        };
        assert_eq!(ms.data(), [12, 10, 96, 192, 0, 2, 254]);
        assert_eq!(super::rfc3442(&want), ms.data());
    }

    #[test]
    fn a_pool_without_the_new_options_sends_none_of_them() {
        let offer = reply_from(&pool(), &ask(&[1, 3, 26, 121, 249]));
        let o = offer.opts();
        for code in [26u8, 121, 249] {
            assert!(o.get(OptionCode::from(code)).is_none(), "option {code}");
        }
        assert!(o.get(OptionCode::Router).is_some());
    }

    #[test]
    fn rfc3442_encodes_only_the_significant_octets() {
        let gw = Ipv4Addr::new(10, 0, 0, 1);
        let routes = [
            ("0.0.0.0/0".parse().unwrap(), gw),
            ("10.0.0.0/8".parse().unwrap(), gw),
            ("10.17.0.0/16".parse().unwrap(), gw),
            ("10.27.129.0/24".parse().unwrap(), gw),
            ("10.229.0.128/25".parse().unwrap(), gw),
            ("10.198.122.47/32".parse().unwrap(), gw),
        ];
        assert_eq!(
            super::rfc3442(&routes),
            [
                0, 10, 0, 0, 1, //
                8, 10, 10, 0, 0, 1, //
                16, 10, 17, 10, 0, 0, 1, //
                24, 10, 27, 129, 10, 0, 0, 1, //
                25, 10, 229, 0, 128, 10, 0, 0, 1, //
                32, 10, 198, 122, 47, 10, 0, 0, 1,
            ]
        );
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
        table.apply_snapshot(&[PoolLeases {
            config: cfg.clone(),
            leases: [(MacAddr(KNOWN), Binding::ip(LEASED))].into(),
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
    fn a_named_lease_brings_its_host_name_to_offer_and_ack_only() {
        let table = LeaseTable::new();
        let cfg = config();
        let name = cfg.pool.clone();
        let binding = Binding {
            options: None,
            ipv6: None,
            ip: LEASED,
            host_name: Some("vm-1".into()),
        };
        table.apply_snapshot(&[PoolLeases {
            config: cfg,
            leases: [(MacAddr(KNOWN), binding)].into(),
        }]);
        let pool = table.pool(&name).unwrap();
        let answer = |m: &Message| {
            let (kind, _, reply) = reply_of(&handle(&m.to_vec().unwrap(), &pool, |_| false));
            (kind, reply.opts().get(OptionCode::Hostname).cloned())
        };
        let named = Some(DhcpOption::Hostname("vm-1".into()));
        assert_eq!(
            answer(&request(MessageType::Discover, KNOWN)),
            (MessageType::Offer, named.clone())
        );
        let mut req = request(MessageType::Request, KNOWN);
        req.opts_mut()
            .insert(DhcpOption::RequestedIpAddress(LEASED));
        assert_eq!(answer(&req), (MessageType::Ack, named));
        // Asked for other options only: not sent (RFC 2131 §4.3.1).
        req.opts_mut().insert(DhcpOption::ParameterRequestList(vec![
            OptionCode::SubnetMask,
        ]));
        assert_eq!(answer(&req), (MessageType::Ack, None));
        // No lease in the reply, no name: a NAK.
        let mut wrong = request(MessageType::Request, KNOWN);
        wrong
            .opts_mut()
            .insert(DhcpOption::RequestedIpAddress(Ipv4Addr::new(192, 0, 2, 99)));
        assert_eq!(answer(&wrong), (MessageType::Nak, None));
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

    /// The fixture pool with every boot setting; the next server is 192.0.2.5.
    fn booting() -> Arc<PoolSnapshot> {
        let mut config = config();
        config.boot = Some(vmdhcp_core::pool::Boot {
            next_server: Some(Ipv4Addr::new(192, 0, 2, 5)),
            tftp_server_name: Some("tftp.example.test".into()),
            bios_file: Some("undionly.kpxe".into()),
            uefi_file: Some("ipxe.efi".into()),
            uefi_http_url: Some(format!("http://192.0.2.5/{}", "x".repeat(200))),
            ipxe_script_url: Some("http://192.0.2.5/vm.ipxe".into()),
        });
        pool_with(config)
    }

    fn firmware(kind: MessageType, extra: Vec<DhcpOption>) -> Message {
        let mut req = request(kind, KNOWN);
        if kind == MessageType::Request {
            req.opts_mut()
                .insert(DhcpOption::RequestedIpAddress(LEASED));
        }
        // Firmware asks for the boot options, but not always: these do not.
        req.opts_mut().insert(DhcpOption::ParameterRequestList(vec![
            OptionCode::SubnetMask,
        ]));
        for o in extra {
            req.opts_mut().insert(o);
        }
        req
    }

    fn file_field(m: &Message) -> String {
        let raw = m.fname().unwrap_or_default();
        String::from_utf8_lossy(raw)
            .trim_end_matches('\0')
            .to_owned()
    }

    #[test]
    fn pxe_firmware_gets_its_file_the_next_server_and_the_tftp_server() {
        let bios = vec![DhcpOption::ClassIdentifier(
            b"PXEClient:Arch:00000:UNDI:002001".to_vec(),
        )];
        for kind in [MessageType::Discover, MessageType::Request] {
            let got = reply_from(&booting(), &firmware(kind, bios.clone()));
            assert_eq!(got.siaddr(), Ipv4Addr::new(192, 0, 2, 5));
            assert_eq!(file_field(&got), "undionly.kpxe");
            let o = got.opts();
            assert_eq!(
                o.get(OptionCode::BootfileName),
                Some(&DhcpOption::BootfileName(b"undionly.kpxe".to_vec()))
            );
            assert_eq!(
                o.get(OptionCode::TFTPServerName),
                Some(&DhcpOption::TFTPServerName(b"tftp.example.test".to_vec()))
            );
            // The address still comes with it, and no vendor class: this is no HTTP boot.
            assert_eq!(got.yiaddr(), LEASED);
            assert!(o.get(OptionCode::SubnetMask).is_some());
            assert!(o.get(OptionCode::ClassIdentifier).is_none());
        }
        let uefi = vec![DhcpOption::ClientSystemArchitecture(
            dhcproto::v4::Architecture::from(7),
        )];
        let got = reply_from(&booting(), &firmware(MessageType::Discover, uefi));
        assert_eq!(file_field(&got), "ipxe.efi");
        // iPXE gets its script, not iPXE again.
        let ipxe = vec![
            DhcpOption::ClientSystemArchitecture(dhcproto::v4::Architecture::from(0)),
            DhcpOption::UserClass(b"iPXE".to_vec()),
        ];
        let got = reply_from(&booting(), &firmware(MessageType::Discover, ipxe));
        assert_eq!(file_field(&got), "http://192.0.2.5/vm.ipxe");
        // Told not to wait for ProxyDHCP offers (iPXE's no-pxedhcp); firmware is not.
        let Some(DhcpOption::Unknown(encapsulated)) = got.opts().get(OptionCode::from(175)) else {
            panic!("no option 175");
        };
        assert_eq!(encapsulated.data(), [176, 1, 1]);
        let uefi = vec![DhcpOption::ClientSystemArchitecture(
            dhcproto::v4::Architecture::from(7),
        )];
        let got = reply_from(&booting(), &firmware(MessageType::Discover, uefi));
        assert!(got.opts().get(OptionCode::from(175)).is_none());
    }

    #[test]
    fn uefi_http_boot_gets_its_url_in_option_67_and_the_vendor_class_echoed() {
        let http = vec![
            DhcpOption::ClassIdentifier(b"HTTPClient:Arch:00016:UNDI:003001".to_vec()),
            DhcpOption::ClientSystemArchitecture(dhcproto::v4::Architecture::from(16)),
        ];
        let got = reply_from(&booting(), &firmware(MessageType::Discover, http));
        let o = got.opts();
        assert_eq!(
            o.get(OptionCode::ClassIdentifier),
            Some(&DhcpOption::ClassIdentifier(b"HTTPClient".to_vec()))
        );
        let url = format!("http://192.0.2.5/{}", "x".repeat(200));
        assert_eq!(
            o.get(OptionCode::BootfileName),
            Some(&DhcpOption::BootfileName(url.into_bytes()))
        );
        // Too long for the header's 128 bytes: only the option carries it.
        assert_eq!(file_field(&got), "");
    }

    #[test]
    fn clients_that_do_not_boot_and_naks_get_no_boot_options() {
        let plain = reply_from(&booting(), &firmware(MessageType::Discover, vec![]));
        assert_eq!(plain.siaddr(), SERVER);
        assert_eq!(file_field(&plain), "");
        assert!(plain.opts().get(OptionCode::BootfileName).is_none());
        assert!(plain.opts().get(OptionCode::TFTPServerName).is_none());
        let mut wrong = firmware(
            MessageType::Request,
            vec![DhcpOption::ClassIdentifier(b"PXEClient".to_vec())],
        );
        wrong
            .opts_mut()
            .insert(DhcpOption::RequestedIpAddress(Ipv4Addr::new(192, 0, 2, 99)));
        let nak = reply_from(&booting(), &wrong);
        assert_eq!(nak.opts().msg_type(), Some(MessageType::Nak));
        assert_eq!(
            (nak.siaddr(), file_field(&nak)),
            (Ipv4Addr::UNSPECIFIED, String::new())
        );
        // A pool without boot settings sends nothing new to firmware.
        let bios = vec![DhcpOption::ClassIdentifier(b"PXEClient".to_vec())];
        let got = reply_from(&pool(), &firmware(MessageType::Discover, bios));
        assert_eq!((got.siaddr(), file_field(&got)), (SERVER, String::new()));
        assert!(got.opts().get(OptionCode::BootfileName).is_none());
    }

    /// `config` with KNOWN holding LEASED and its NIC's own options: boot file `nic.efi`,
    /// NTP 192.0.2.99, private options 240 and 252.
    fn with_nic_options(config: PoolConfig) -> Arc<PoolSnapshot> {
        let table = LeaseTable::new();
        let name = config.pool.clone();
        let options = vmdhcp_core::pool::NicOptions {
            boot_file_name: Some("nic.efi".into()),
            tftp_server_name: None,
            ntp_servers: vec![Ipv4Addr::new(192, 0, 2, 99)],
            private: vec![(240, "hello".into()), (252, "http://wpad/wpad.dat".into())],
        };
        let binding = Binding {
            options: Some(Box::new(options)),
            ..Binding::ip(LEASED)
        };
        table.apply_snapshot(&[PoolLeases {
            config,
            leases: [(MacAddr(KNOWN), binding)].into(),
        }]);
        table.pool(&name).unwrap()
    }

    #[test]
    fn a_nic_s_own_options_are_served_over_the_pool_s_as_asked_for() {
        let pool = with_nic_options(config());
        let got = reply_from(&pool, &ask(&[1, 42, 67, 240]));
        let o = got.opts();
        assert_eq!(
            o.get(OptionCode::NtpServers),
            Some(&DhcpOption::NtpServers(vec![Ipv4Addr::new(192, 0, 2, 99)]))
        );
        assert_eq!(
            o.get(OptionCode::BootfileName),
            Some(&DhcpOption::BootfileName(b"nic.efi".to_vec()))
        );
        let Some(DhcpOption::Unknown(private)) = o.get(OptionCode::from(240)) else {
            panic!("no option 240: {o:?}");
        };
        assert_eq!(private.data(), b"hello");
        // Not asked for: not sent.
        assert!(o.get(OptionCode::from(252)).is_none());
        // Without a request list, everything.
        let all = reply_from(&pool, &request(MessageType::Discover, KNOWN));
        assert!(all.opts().get(OptionCode::from(252)).is_some());
        // Another MAC of the pool gets the pool's NTP server and nothing of this NIC's.
        let other = reply_from(&pool_with(config()), &ask(&[42, 67, 240]));
        assert_eq!(
            other.opts().get(OptionCode::NtpServers),
            Some(&DhcpOption::NtpServers(vec![Ipv4Addr::new(192, 0, 2, 123)]))
        );
        assert!(other.opts().get(OptionCode::BootfileName).is_none());
    }

    #[test]
    fn a_booting_nic_with_its_own_boot_file_gets_it_over_the_pool_s() {
        let mut config = config();
        config.boot = Some(vmdhcp_core::pool::Boot {
            next_server: Some(Ipv4Addr::new(192, 0, 2, 5)),
            bios_file: Some("undionly.kpxe".into()),
            tftp_server_name: Some("tftp.example.test".into()),
            ..Default::default()
        });
        let pool = with_nic_options(config);
        let bios = vec![DhcpOption::ClassIdentifier(b"PXEClient".to_vec())];
        let got = reply_from(&pool, &firmware(MessageType::Discover, bios));
        assert_eq!(file_field(&got), "nic.efi");
        assert_eq!(got.siaddr(), Ipv4Addr::new(192, 0, 2, 5));
        assert_eq!(
            got.opts().get(OptionCode::TFTPServerName),
            Some(&DhcpOption::TFTPServerName(b"tftp.example.test".to_vec()))
        );
    }
}
