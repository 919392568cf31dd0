//! The Ethernet frames of the DHCPv6 server's packet socket: what a received frame carries (its
//! sender's MAC, its addresses and its datagram), the whole frame of a reply, and the source
//! address a reply is sent from.
//!
//! **Replies go to the MAC that asked.** A reply is built here, Ethernet header included, and
//! sent on the packet socket to the Ethernet source of the request's frame. It never passes the
//! kernel's IPv6 output path, so:
//! - no neighbour entry decides where it goes: a tenant's forged Neighbor Advertisements that
//!   rewrite the entry for a VM's link-local address steer nothing;
//! - no reply waits in the kernel for Neighbor Discovery of a source nobody owns, charged to a
//!   socket every client shares: an unresolvable source costs only its own answer;
//! - no forged source adds an entry to the node's neighbour cache.
//!
//! A frame from a relay is answered to the relay's MAC the same way: the relay is on this link.
//!
//! Pure functions, apart from reading `/proc/net/if_inet6` ([`Sources::refresh`]).

use std::net::Ipv6Addr;
use std::time::{Duration, Instant};

use socket2::SockFilter;
use vmdhcp_core::MacAddr;

use super::handler::is_link_local;
use super::{CLIENT_PORT, SERVER_PORT};

/// Ethernet header length.
pub const ETHERNET: usize = 14;
/// IPv6 header length.
pub const IPV6: usize = 40;
/// UDP header length.
pub const UDP: usize = 8;
/// The EtherType of IPv6.
pub const ETH_P_IPV6: u16 = 0x86dd;
/// Hop limit of a reply: the kernel's default for IPv6.
const HOP_LIMIT: u8 = 64;

/// A kernel filter passing only IPv6 frames carrying UDP to port 547 (clients' and relays'
/// messages) or 546 (other servers' answers, [`super::foreign`]); no extension headers: clients,
/// relays and servers send none.
pub fn dhcp_filter() -> [SockFilter; 9] {
    use crate::arp::bpf::{JEQ_K, LD_B_ABS, LD_H_ABS, RET_K};
    [
        SockFilter::new(LD_H_ABS, 0, 0, 12),
        SockFilter::new(JEQ_K, 0, 6, u32::from(ETH_P_IPV6)),
        SockFilter::new(LD_B_ABS, 0, 0, 20),
        SockFilter::new(JEQ_K, 0, 4, 17),
        SockFilter::new(LD_H_ABS, 0, 0, 56),
        SockFilter::new(JEQ_K, 1, 0, u32::from(SERVER_PORT)),
        SockFilter::new(JEQ_K, 0, 1, u32::from(CLIENT_PORT)),
        SockFilter::new(RET_K, 0, 0, 0x0004_0000),
        SockFilter::new(RET_K, 0, 0, 0),
    ]
}

/// A UDP datagram to port 547 (or 546) read from an Ethernet frame.
#[derive(Debug, PartialEq, Eq)]
pub struct Udp6<'a> {
    /// The frame's Ethernet source: where the answer goes.
    pub source_mac: MacAddr,
    /// The IPv6 source.
    pub source: Ipv6Addr,
    /// The IPv6 destination (`ff02::1:2`, or one of ours).
    pub destination: Ipv6Addr,
    /// The UDP source port.
    pub source_port: u16,
    /// The UDP destination port: 547 for a server, 546 for a client.
    pub destination_port: u16,
    /// The UDP payload.
    pub payload: &'a [u8],
}

/// The DHCPv6 datagram an Ethernet frame carries, when it carries one: IPv6, UDP (no extension
/// header), destination port 547 or 546, lengths consistent.
pub fn parse(frame: &[u8]) -> Option<Udp6<'_>> {
    let eth = frame.get(..ETHERNET)?;
    if u16::from_be_bytes([eth[12], eth[13]]) != ETH_P_IPV6 {
        return None;
    }
    let ip = frame.get(ETHERNET..ETHERNET + IPV6)?;
    if ip[0] >> 4 != 6 || ip[6] != 17 {
        return None;
    }
    let payload_len = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
    let udp = frame.get(ETHERNET + IPV6..ETHERNET + IPV6 + payload_len)?;
    let header = udp.get(..UDP)?;
    let destination_port = u16::from_be_bytes([header[2], header[3]]);
    if destination_port != SERVER_PORT && destination_port != CLIENT_PORT {
        return None;
    }
    let udp_len = usize::from(u16::from_be_bytes([header[4], header[5]]));
    let payload = udp.get(UDP..udp_len)?;
    let octets = |range: std::ops::Range<usize>| -> Option<Ipv6Addr> {
        let bytes: [u8; 16] = ip.get(range)?.try_into().ok()?;
        Some(Ipv6Addr::from(bytes))
    };
    let mut mac = [0u8; 6];
    mac.copy_from_slice(eth.get(6..12)?);
    Some(Udp6 {
        source_mac: MacAddr(mac),
        source: octets(8..24)?,
        destination: octets(24..40)?,
        source_port: u16::from_be_bytes([header[0], header[1]]),
        destination_port,
        payload,
    })
}

/// The addressing of one reply frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Addressing {
    /// The interface's MAC.
    pub from_mac: MacAddr,
    /// The MAC the request came from.
    pub to_mac: MacAddr,
    /// Our source address ([`Sources::source_for`]).
    pub from: Ipv6Addr,
    /// The request's source address.
    pub to: Ipv6Addr,
    /// 547 for a server's answer; 546 for the probe's SOLICIT ([`super::foreign`]).
    pub from_port: u16,
    /// 546 for a client, 547 for a relay or a server.
    pub to_port: u16,
}

/// Writes into `out` (cleared first) the Ethernet frame carrying `payload` as `addressing` says, with the UDP checksum IPv6 requires. `None` for a payload too large for
/// one datagram.
pub fn build(addressing: &Addressing, payload: &[u8], out: &mut Vec<u8>) -> Option<()> {
    let udp_len = u16::try_from(UDP + payload.len()).ok()?;
    out.clear();
    out.reserve(ETHERNET + IPV6 + usize::from(udp_len));
    out.extend_from_slice(&addressing.to_mac.0);
    out.extend_from_slice(&addressing.from_mac.0);
    out.extend_from_slice(&ETH_P_IPV6.to_be_bytes());
    out.extend_from_slice(&[0x60, 0, 0, 0]);
    out.extend_from_slice(&udp_len.to_be_bytes());
    out.extend_from_slice(&[17, HOP_LIMIT]);
    out.extend_from_slice(&addressing.from.octets());
    out.extend_from_slice(&addressing.to.octets());
    let udp_start = out.len();
    out.extend_from_slice(&addressing.from_port.to_be_bytes());
    out.extend_from_slice(&addressing.to_port.to_be_bytes());
    out.extend_from_slice(&udp_len.to_be_bytes());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(payload);
    let checksum =
        crate::arp::ipv6_checksum(addressing.from, addressing.to, 17, out.get(udp_start..)?);
    out.get_mut(udp_start + 6..udp_start + 8)?
        .copy_from_slice(&checksum.to_be_bytes());
    Some(())
}

/// How often the interface's link-local address is read again.
const REFRESH: Duration = Duration::from_secs(1);

/// The addresses a reply may come from on one interface: its usable link-local address (not
/// tentative, not failed), read from `/proc/net/if_inet6` at most every `REFRESH`, and the
/// pool's IPv6 server address.
#[derive(Debug)]
pub struct Sources {
    index: u32,
    link_local: Option<Ipv6Addr>,
    read_at: Option<Instant>,
}

impl Sources {
    /// Nothing read yet for the interface with index `index`.
    pub fn new(index: u32) -> Self {
        Sources {
            index,
            link_local: None,
            read_at: None,
        }
    }

    /// Reads the link-local address again when the last reading is older than `REFRESH`.
    pub fn refresh(&mut self, now: Instant) {
        if self
            .read_at
            .is_some_and(|at| now.saturating_duration_since(at) < REFRESH)
        {
            return;
        }
        self.read_at = Some(now);
        self.link_local = std::fs::read_to_string("/proc/net/if_inet6")
            .ok()
            .and_then(|table| usable_link_local(&table, self.index));
    }

    /// The interface's usable link-local address, when it has one.
    pub fn link_local(&self) -> Option<Ipv6Addr> {
        self.link_local
    }

    /// Where a reply to `to` comes from: to a link-local address, from the interface's
    /// link-local address, as a client expects of a server on its link; otherwise (a relay's
    /// address), or while that one is still tentative, from the pool's server address
    /// `server` (added without duplicate address detection, so usable at once).
    pub fn source_for(&self, to: &Ipv6Addr, server: Option<Ipv6Addr>) -> Option<Ipv6Addr> {
        match (is_link_local(to), self.link_local, server) {
            (true, Some(own), _) => Some(own),
            (_, _, Some(server)) => Some(server),
            (false, own, None) => own,
            (true, None, None) => None,
        }
    }
}

/// Flags of `/proc/net/if_inet6` that make an address unusable as a source.
const IFA_F_DADFAILED: u8 = 0x08;
const IFA_F_TENTATIVE: u8 = 0x40;

/// The first link-local address of the interface with index `index` that is neither tentative
/// nor failed, from the text of `/proc/net/if_inet6` (address, index, prefix length, scope,
/// flags, name; all hexadecimal but the name).
pub fn usable_link_local(table: &str, index: u32) -> Option<Ipv6Addr> {
    table.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let hex = fields.next()?;
        let on = u32::from_str_radix(fields.next()?, 16).ok()?;
        let _prefix = fields.next()?;
        let _scope = fields.next()?;
        let flags = u8::from_str_radix(fields.next()?, 16).ok()?;
        if on != index || flags & (IFA_F_DADFAILED | IFA_F_TENTATIVE) != 0 || hex.len() != 32 {
            return None;
        }
        let mut octets = [0u8; 16];
        for (i, byte) in octets.iter_mut().enumerate() {
            *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        let ip = Ipv6Addr::from(octets);
        is_link_local(&ip).then_some(ip)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLIENT: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const OURS: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xaa]);

    fn ip6(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    pub(super) fn frame(next_header: u8, port: u16, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0x33, 0x33, 0, 1, 0, 2, 2, 0, 0, 0, 0, 1, 0x86, 0xdd];
        let udp_len = u16::try_from(UDP + payload.len()).unwrap();
        f.extend_from_slice(&[0x60, 0, 0, 0]);
        f.extend_from_slice(&udp_len.to_be_bytes());
        f.extend_from_slice(&[next_header, 1]);
        f.extend_from_slice(&ip6("fe80::1").octets());
        f.extend_from_slice(&super::super::ALL_SERVERS.octets());
        f.extend_from_slice(&546u16.to_be_bytes());
        f.extend_from_slice(&port.to_be_bytes());
        f.extend_from_slice(&udp_len.to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn a_frame_to_port_547_yields_its_datagram_and_the_sender_s_mac() {
        let f = frame(17, 547, b"hello");
        let udp = parse(&f).unwrap();
        assert_eq!(udp.source_mac, CLIENT);
        assert_eq!(udp.source, ip6("fe80::1"));
        assert_eq!(udp.source_port, 546);
        assert!(udp.destination.is_multicast());
        assert_eq!(udp.payload, b"hello");
    }

    #[test]
    fn other_frames_and_broken_lengths_yield_nothing() {
        assert_eq!(parse(&frame(6, 547, b"x")), None, "TCP");
        assert_eq!(parse(&frame(17, 68, b"x")), None, "to another port");
        assert_eq!(
            parse(&frame(17, 546, b"x")).map(|u| u.destination_port),
            Some(546),
            "to a client: another server's answer"
        );
        let mut cut = frame(17, 547, b"hello");
        cut.truncate(cut.len() - 2);
        assert_eq!(parse(&cut), None);
        assert_eq!(parse(&[0u8; 10]), None);
        let mut v4 = frame(17, 547, b"x");
        v4[12] = 0x08;
        v4[13] = 0x00;
        assert_eq!(parse(&v4), None);
    }

    #[test]
    fn a_reply_goes_to_the_mac_that_asked_with_a_checksum_that_verifies() {
        let addressing = Addressing {
            from_mac: OURS,
            to_mac: CLIENT,
            from: ip6("fe80::aa"),
            to: ip6("fe80::1"),
            from_port: 547,
            to_port: 546,
        };
        let mut out = Vec::new();
        build(&addressing, b"reply!", &mut out).unwrap();
        assert_eq!(&out[..6], &CLIENT.0, "Ethernet destination");
        assert_eq!(&out[6..12], &OURS.0, "Ethernet source");
        assert_eq!(&out[12..14], &ETH_P_IPV6.to_be_bytes());
        assert_eq!(out[ETHERNET] >> 4, 6);
        assert_eq!((out[ETHERNET + 6], out[ETHERNET + 7]), (17, HOP_LIMIT));
        let udp = &out[ETHERNET + IPV6..];
        assert_eq!(
            u16::from_be_bytes([out[ETHERNET + 4], out[ETHERNET + 5]]),
            u16::try_from(udp.len()).unwrap()
        );
        assert_eq!(u16::from_be_bytes([udp[0], udp[1]]), 547);
        assert_eq!(u16::from_be_bytes([udp[2], udp[3]]), 546);
        assert_eq!(&udp[UDP..], b"reply!");
        // Summed with its checksum in place, a datagram verifies to zero (or the 0xffff a
        // zero checksum is sent as).
        let verify = crate::arp::ipv6_checksum(addressing.from, addressing.to, 17, udp);
        assert!(verify == 0 || verify == 0xffff, "{verify:#x}");
        // What we send parses back as what it is, apart from the port.
        let mut as_request = out.clone();
        as_request[ETHERNET + IPV6 + 2..ETHERNET + IPV6 + 4].copy_from_slice(&547u16.to_be_bytes());
        let back = parse(&as_request).unwrap();
        assert_eq!(back.destination_port, 547);
        assert_eq!(
            (back.source_mac, back.source, back.destination, back.payload),
            (OURS, addressing.from, addressing.to, &b"reply!"[..])
        );
    }

    const IF_INET6: &str = "\
fd000000000000000000000000000002 03 70 00 80     srv0
fe800000000000000000000000000abc 03 40 20 c0     srv0
fe800000000000000000000000000001 02 40 20 80     eth0
fe800000000000000000000000000def 03 40 20 80     srv0
";

    #[test]
    fn the_link_local_source_is_the_interface_s_own_and_not_a_tentative_one() {
        assert_eq!(usable_link_local(IF_INET6, 3), Some(ip6("fe80::def")));
        assert_eq!(usable_link_local(IF_INET6, 2), Some(ip6("fe80::1")));
        assert_eq!(usable_link_local(IF_INET6, 9), None);
        let tentative_only = IF_INET6.lines().nth(1).unwrap();
        assert_eq!(usable_link_local(tentative_only, 3), None);
        assert_eq!(usable_link_local("garbage\n\n1 2", 3), None);
    }

    #[test]
    fn clients_hear_the_link_local_address_relays_the_server_address() {
        let server = Some(ip6("fd00::2"));
        let mut sources = Sources::new(3);
        // Nothing usable yet (tentative): the server address for everyone.
        assert_eq!(sources.source_for(&ip6("fe80::1"), server), server);
        assert_eq!(sources.source_for(&ip6("fe80::1"), None), None);
        sources.link_local = Some(ip6("fe80::def"));
        assert_eq!(
            sources.source_for(&ip6("fe80::1"), server),
            Some(ip6("fe80::def"))
        );
        assert_eq!(sources.source_for(&ip6("fd00::77"), server), server);
        assert_eq!(
            sources.source_for(&ip6("fd00::77"), None),
            Some(ip6("fe80::def"))
        );
    }
}
