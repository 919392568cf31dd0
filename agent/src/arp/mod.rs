//! Gratuitous ARP (and, for a dual-stack pool's IPv6 server address, unsolicited Neighbor
//! Advertisements) for the server addresses this agent takes over.
//!
//! When a standby becomes leader, each pool's server address moves to another MAC: clients keep
//! sending their unicast RENEWs to the old MAC until their ARP entry for the server expires,
//! which on Linux can take minutes. So whenever the leader gives an interface its server address
//! (on taking over, or for a pool added while leading), it broadcasts a few RFC 5227 "ARP
//! Announcements" on that interface: ARP requests whose sender and target protocol addresses are
//! both the server address, sender hardware address the interface's MAC. Hosts that hold an entry
//! for the address update it to the new MAC. An IPv6 server address is announced the same way
//! with unsolicited Neighbor Advertisements (RFC 4861 §7.2.6: to all nodes, Override set).
//!
//! It also probes an address (RFC 5227 ARP Probe, [`probe`]) before the DHCP server first offers
//! it and to check a DHCPDECLINE ([`crate::dhcp::probe`]).
//!
//! This module owns the packet sockets (`AF_PACKET`, which needs CAP_NET_RAW), the frames (built
//! by pure functions), the announcement tasks (one bounded task per interface, cancelled when the
//! interface is given up, on step-down and on shutdown) and their counters. A missing CAP_NET_RAW
//! is not fatal: DHCP is served without announcements, and the warning says which capability to
//! grant.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::io::{self, Read};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use socket2::{Domain, SockAddr, SockAddrStorage, Socket, Type};
use tokio::task::JoinHandle;
use tracing::{Instrument, debug, info, info_span, warn};
use vmdhcp_core::NamespacedName;
use vmdhcp_core::mac::MacAddr;

use crate::capability::{Capability, Missing};

mod announce;
mod weigh;

pub use announce::*;
pub use weigh::{Check, Evidence, Inquiry, weigh};

/// Announcements sent per takeover of an interface. RFC 5227 asks for two (ANNOUNCE_NUM); one
/// more rides out a lost frame on a busy segment.
pub const ANNOUNCE_COUNT: u32 = 3;
/// Time between two announcements (RFC 5227 ANNOUNCE_INTERVAL).
pub const ANNOUNCE_INTERVAL: Duration = Duration::from_secs(2);

/// Length of an ARP frame on Ethernet: 14 bytes of header and 28 of ARP, padded with zeros to the
/// 60-byte Ethernet minimum (the kernel does not pad frames handed to a packet socket).
pub const FRAME_LEN: usize = 60;

const ETH_P_ARP: u16 = 0x0806;
const ETH_P_IP: u16 = 0x0800;
const ARPHRD_ETHER: u16 = 1;
const ARPOP_REQUEST: u16 = 1;
const ARPOP_REPLY: u16 = 2;
const BROADCAST: [u8; 6] = [0xff; 6];
const ETH_P_IPV6: u16 = 0x86dd;
/// The Ethernet address of ff02::1 (all nodes).
const ALL_NODES_MAC: [u8; 6] = [0x33, 0x33, 0, 0, 0, 1];
const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
/// Length of an unsolicited Neighbor Advertisement frame: Ethernet, IPv6, ICMPv6 NA (24) and a
/// Target Link-Layer Address option (8).
pub const NA_FRAME_LEN: usize = 14 + 40 + 24 + 8;

/// Why an announcement could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ArpError {
    /// The packet socket cannot be opened (usually: CAP_NET_RAW is missing).
    #[error("cannot open a packet socket for ARP announcements: {source}{missing}")]
    Socket {
        /// The OS error.
        source: io::Error,
        /// CAP_NET_RAW, when the kernel refused the socket for want of it.
        missing: Missing,
    },
    /// The interface's index or MAC cannot be read.
    #[error("interface {interface}: cannot read its {what}: {detail}")]
    Interface {
        /// The interface.
        interface: String,
        /// `ifindex` or `MAC address`.
        what: &'static str,
        /// Why.
        detail: String,
    },
    /// The kernel refused a frame.
    #[error("interface {interface}: cannot send an ARP announcement: {source}")]
    Send {
        /// The interface.
        interface: String,
        /// The OS error.
        source: io::Error,
    },
}

/// The RFC 5227 ARP Announcement of `ip` by `mac`: a broadcast ARP request with sender and
/// target protocol address both `ip`, the target hardware address zero.
pub fn announcement(mac: MacAddr, ip: Ipv4Addr) -> [u8; FRAME_LEN] {
    let mut frame = [0u8; FRAME_LEN];
    let (ethernet, arp) = frame.split_at_mut(14);
    ethernet[0..6].copy_from_slice(&BROADCAST);
    ethernet[6..12].copy_from_slice(&mac.octets());
    ethernet[12..14].copy_from_slice(&ETH_P_ARP.to_be_bytes());
    arp[0..2].copy_from_slice(&ARPHRD_ETHER.to_be_bytes());
    arp[2..4].copy_from_slice(&ETH_P_IP.to_be_bytes());
    arp[4] = 6; // hardware address length
    arp[5] = 4; // protocol address length
    arp[6..8].copy_from_slice(&ARPOP_REQUEST.to_be_bytes());
    arp[8..14].copy_from_slice(&mac.octets()); // sender hardware address
    arp[14..18].copy_from_slice(&ip.octets()); // sender protocol address
    // 18..24: target hardware address, zero (RFC 5227 §2.3: ignored, SHOULD be zero).
    arp[24..28].copy_from_slice(&ip.octets()); // target protocol address
    frame
}

/// An unsolicited Neighbor Advertisement of `ip` by `mac` (RFC 4861 §4.4, §7.2.6): from `ip`
/// to all nodes, hop limit 255, Override set, with the Target Link-Layer Address option; hosts
/// that hold a neighbour entry for `ip` update it to `mac`.
pub fn neighbor_advertisement(mac: MacAddr, ip: Ipv6Addr) -> [u8; NA_FRAME_LEN] {
    let mut frame = [0u8; NA_FRAME_LEN];
    let (ethernet, rest) = frame.split_at_mut(14);
    ethernet[0..6].copy_from_slice(&ALL_NODES_MAC);
    ethernet[6..12].copy_from_slice(&mac.octets());
    ethernet[12..14].copy_from_slice(&ETH_P_IPV6.to_be_bytes());
    let (ipv6, icmp) = rest.split_at_mut(40);
    let icmp_len: u16 = 32;
    ipv6[0] = 0x60;
    ipv6[4..6].copy_from_slice(&icmp_len.to_be_bytes());
    ipv6[6] = 58; // ICMPv6
    ipv6[7] = 255; // hop limit (RFC 4861 §7.1.2: receivers drop anything else)
    ipv6[8..24].copy_from_slice(&ip.octets());
    ipv6[24..40].copy_from_slice(&ALL_NODES.octets());
    icmp[0] = 136; // Neighbor Advertisement
    icmp[4] = 0x20; // Override; neither Router nor Solicited
    icmp[8..24].copy_from_slice(&ip.octets());
    icmp[24] = 2; // Target Link-Layer Address
    icmp[25] = 1; // length, in units of 8 bytes
    icmp[26..32].copy_from_slice(&mac.octets());
    let checksum = icmpv6_checksum(ip, ALL_NODES, icmp);
    icmp[2..4].copy_from_slice(&checksum.to_be_bytes());
    frame
}

/// The ICMPv6 checksum of `message` (its checksum field zero) from `src` to `dst`: the one's
/// complement sum over the IPv6 pseudo-header and the message (RFC 4443 §2.3).
fn icmpv6_checksum(src: Ipv6Addr, dst: Ipv6Addr, message: &[u8]) -> u16 {
    ipv6_checksum(src, dst, 58, message)
}

/// The checksum of an upper-layer `message` (`next_header` 58 for ICMPv6, 17 for UDP; its
/// checksum field zero) from `src` to `dst` over IPv6: the one's complement of the one's
/// complement sum of the pseudo-header (RFC 8200 §8.1) and the message. For UDP, a result of
/// zero is sent as `0xffff` (RFC 8200 §8.1: zero means "no checksum", which IPv6 forbids).
pub fn ipv6_checksum(src: Ipv6Addr, dst: Ipv6Addr, next_header: u8, message: &[u8]) -> u16 {
    let len = u32::try_from(message.len()).unwrap_or(u32::MAX);
    let words = |bytes: &[u8]| -> u64 {
        bytes
            .chunks(2)
            .map(|c| u64::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)])))
            .sum()
    };
    let mut sum = words(&src.octets())
        + words(&dst.octets())
        + u64::from(len >> 16)
        + u64::from(len & 0xffff)
        + u64::from(next_header)
        + words(message);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let folded = !u16::try_from(sum).unwrap_or(0xffff);
    if next_header == 17 && folded == 0 {
        0xffff
    } else {
        folded
    }
}

/// Length of a duplicate-address-detection Neighbor Solicitation frame: Ethernet, IPv6, and an
/// ICMPv6 NS (24) without options.
pub const NS_FRAME_LEN: usize = 14 + 40 + 24;

/// The Neighbor Solicitation a host sends for duplicate address detection of `target` (RFC 4862
/// §5.4.2): from the unspecified address (no neighbour learns anything from it) to `target`'s
/// solicited-node multicast group. A host using `target` answers it with a Neighbor
/// Advertisement to all nodes.
pub fn neighbor_solicitation(mac: MacAddr, target: Ipv6Addr) -> [u8; NS_FRAME_LEN] {
    let t = target.octets();
    let group = Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(t[13]),
        u16::from_be_bytes([t[14], t[15]]),
    );
    let mut frame = [0u8; NS_FRAME_LEN];
    let (ethernet, rest) = frame.split_at_mut(14);
    ethernet[0..6].copy_from_slice(&[0x33, 0x33, 0xff, t[13], t[14], t[15]]);
    ethernet[6..12].copy_from_slice(&mac.octets());
    ethernet[12..14].copy_from_slice(&ETH_P_IPV6.to_be_bytes());
    let (ipv6, icmp) = rest.split_at_mut(40);
    ipv6[0] = 0x60;
    ipv6[4..6].copy_from_slice(&24u16.to_be_bytes());
    ipv6[6] = 58;
    ipv6[7] = 255;
    // 8..24: the unspecified source.
    ipv6[24..40].copy_from_slice(&group.octets());
    icmp[0] = 135; // Neighbor Solicitation
    icmp[8..24].copy_from_slice(&t);
    let checksum = icmpv6_checksum(Ipv6Addr::UNSPECIFIED, group, icmp);
    icmp[2..4].copy_from_slice(&checksum.to_be_bytes());
    frame
}

/// Who a frame answers for, when it is an answer that counts to a duplicate-address-detection
/// probe by `own` for one of `targets` ([`neighbor_solicitation`]): a Neighbor Advertisement of
/// the target to all nodes (RFC 4861 §7.2.4: how a host answers a solicitation from the
/// unspecified address), hop limit 255 (§7.1.2), whose Target Link-Layer Address option names
/// its Ethernet source. A frame that says one thing at layer 2 and another in NDP is forged; a
/// unicast advertisement answers no probe of ours; our own frames are no answer.
pub fn advertiser_of(
    frame: &[u8],
    own: MacAddr,
    targets: &[Ipv6Addr],
) -> Option<(MacAddr, Ipv6Addr)> {
    let eth = frame.get(..14)?;
    if u16::from_be_bytes([eth[12], eth[13]]) != ETH_P_IPV6 || eth[6..12] == own.0 {
        return None;
    }
    let ipv6 = frame.get(14..54)?;
    let payload = usize::from(u16::from_be_bytes([ipv6[4], ipv6[5]]));
    let icmp = frame.get(54..54 + payload)?;
    if ipv6[6] != 58 || ipv6[7] != 255 || ipv6[24..40] != ALL_NODES.octets() {
        return None;
    }
    if *icmp.first()? != 136 || *icmp.get(1)? != 0 {
        return None;
    }
    let target = Ipv6Addr::from(<[u8; 16]>::try_from(icmp.get(8..24)?).ok()?);
    if !targets.contains(&target) {
        return None;
    }
    // The options, 8-byte units each: the Target Link-Layer Address (type 2) must be there.
    let mut options = icmp.get(24..)?;
    let mut named = None;
    while let [kind, units, ..] = *options {
        let len = usize::from(units) * 8;
        if len == 0 {
            return None;
        }
        let option = options.get(..len)?;
        if kind == 2 {
            named = option.get(2..8);
        }
        options = options.get(len..)?;
    }
    if named? != &eth[6..12] {
        return None;
    }
    let mut mac = [0u8; 6];
    mac.copy_from_slice(&eth[6..12]);
    Some((MacAddr(mac), target))
}

/// Whether other hosts use `targets` on `interface` (RFC 4862 §5.4, as RFC 5227 probes for
/// IPv4): [`PROBE_NUM`] rounds, each a duplicate-address-detection Neighbor Solicitation for
/// every target, `interval` apart, listening until `wait` after the first and noting every
/// answer that counts ([`advertiser_of`]) with its round. Stops early once `enough` says what
/// was heard decides the question. Blocking; needs CAP_NET_RAW.
pub fn probe6(
    interface: &str,
    targets: &[Ipv6Addr],
    interval: Duration,
    wait: Duration,
    enough: impl Fn(&Answers<Ipv6Addr>) -> bool,
) -> Result<Answers<Ipv6Addr>, ArpError> {
    let (socket, index, own) = bound_socket(interface, ETH_P_IPV6)?;
    let link_err = |source: io::Error| ArpError::Send {
        interface: interface.to_owned(),
        source,
    };
    socket
        .attach_filter(&advertisement_filter())
        .map_err(link_err)?;
    let send = |target: &Ipv6Addr| -> io::Result<()> {
        let t = target.octets();
        let to = link_address(index, ETH_P_IPV6, [0x33, 0x33, 0xff, t[13], t[14], t[15]])?;
        socket.send_to(&neighbor_solicitation(own, *target), &to)?;
        Ok(())
    };
    let answer = |frame: &[u8]| advertiser_of(frame, own, targets);
    let timing = (interval, wait);
    rounds(&socket, targets, timing, &enough, send, answer).map_err(link_err)
}

/// The classic BPF opcodes the agent's kernel filters on packet sockets are written in.
pub mod bpf {
    /// Load the half-word at an absolute offset.
    pub const LD_H_ABS: u16 = 0x28;
    /// Load the byte at an absolute offset.
    pub const LD_B_ABS: u16 = 0x30;
    /// Jump on equal to a constant.
    pub const JEQ_K: u16 = 0x15;
    /// Return a constant: the bytes of the packet kept, 0 drops it.
    pub const RET_K: u16 = 0x06;
}

/// A kernel filter passing only ICMPv6 Neighbor Advertisements (no extension headers), so that
/// a probe's socket queues nothing else of a busy link.
fn advertisement_filter() -> [socket2::SockFilter; 8] {
    use bpf::{JEQ_K, LD_B_ABS, LD_H_ABS, RET_K};
    use socket2::SockFilter;
    [
        SockFilter::new(LD_H_ABS, 0, 0, 12),
        SockFilter::new(JEQ_K, 0, 5, u32::from(ETH_P_IPV6)),
        SockFilter::new(LD_B_ABS, 0, 0, 20),
        SockFilter::new(JEQ_K, 0, 3, 58),
        SockFilter::new(LD_B_ABS, 0, 0, 54),
        SockFilter::new(JEQ_K, 0, 1, 136),
        SockFilter::new(RET_K, 0, 0, 0x0004_0000),
        SockFilter::new(RET_K, 0, 0, 0),
    ]
}

/// The RFC 5227 ARP Probe for `ip` by `mac`: a broadcast ARP request with sender protocol
/// address zero (so no host's cache learns anything from it) and target protocol address `ip`.
/// A host using `ip` answers it.
pub fn probe_frame(mac: MacAddr, ip: Ipv4Addr) -> [u8; FRAME_LEN] {
    let mut frame = announcement(mac, ip);
    frame[14 + 14..14 + 18].copy_from_slice(&Ipv4Addr::UNSPECIFIED.octets());
    frame
}

/// Addresses nobody holds that a host answering for a probed address is asked about.
pub const CANARIES: usize = 4;
/// Answers for that many canaries make a host a proxy responder (ARP or NDP): it answers for
/// addresses it does not hold.
pub const PROXY_CANARY_ANSWERS: usize = 2;

/// The addresses, as numbers, that a check's canaries are chosen from, for either family: up to
/// `n` of the `hosts` host addresses after `network` (offsets `1..=hosts`), from a start that
/// depends on `seed`, each one `taken` says is someone's skipped. An odd stride visits every
/// host of a power-of-two range before repeating; at most 4 096 are looked at.
pub fn spread(
    network: u128,
    hosts: u128,
    seed: u128,
    n: usize,
    taken: impl Fn(u128) -> bool,
) -> Vec<u128> {
    if hosts == 0 {
        return Vec::new();
    }
    let start = seed % hosts;
    let stride = 2 * (hosts / 7) + 1;
    let mut out = Vec::with_capacity(n);
    for i in 0..hosts.min(4096) {
        let candidate = network + 1 + (start + i * stride) % hosts;
        if !taken(candidate) && !out.contains(&candidate) {
            out.push(candidate);
            if out.len() == n {
                break;
            }
        }
    }
    out
}

/// How many probes one check sends (RFC 5227's PROBE_NUM): an answer counts toward a conflict
/// only when it answers every one of them.
pub const PROBE_NUM: u8 = 3;

/// The most distinct (MAC, address) pairs one check remembers: a flood of answers from many
/// forged MACs costs no more than this.
pub const MAX_HEARD: usize = 32;

/// One host heard answering for one address, and in which rounds (bit `k`: between the `k`-th
/// probe and the next).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heard<A = Ipv4Addr> {
    /// Who answered (its Ethernet source, equal to the hardware address its answer names).
    pub mac: MacAddr,
    /// The address it answered for.
    pub ip: A,
    /// The rounds it answered in, one bit each.
    pub rounds: u8,
}

/// What one check heard: every answer that counts (see [`answer_of`] and [`advertiser_of`]),
/// bounded by [`MAX_HEARD`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answers<A = Ipv4Addr> {
    heard: Vec<Heard<A>>,
}

impl<A> Default for Answers<A> {
    fn default() -> Self {
        Answers { heard: Vec::new() }
    }
}

impl<A: Copy + PartialEq> Answers<A> {
    /// Notes that `mac` answered for `ip` while round `round` ran. The answer counts for the
    /// previous round when `mac` has not answered that one yet, else for this one: on a busy
    /// node an answer can arrive after the next probe left, and it still answers its probe.
    /// One answer counts once, and never for a probe not yet sent or two rounds back, so a
    /// burst of answers counts for two rounds at most.
    pub fn record(&mut self, mac: MacAddr, ip: A, round: u8) {
        let bit = |r: u8| 1u8.checked_shl(u32::from(r)).unwrap_or(0);
        let window = bit(round) | round.checked_sub(1).map_or(0, bit);
        let first_free = |rounds: u8| {
            let free = !rounds & window;
            // The earlier of the two rounds not answered yet, or nothing.
            free & free.wrapping_neg()
        };
        if let Some(h) = self.heard.iter_mut().find(|h| h.mac == mac && h.ip == ip) {
            h.rounds |= first_free(h.rounds);
        } else if self.heard.len() < MAX_HEARD {
            let bit = first_free(0);
            self.heard.push(Heard {
                mac,
                ip,
                rounds: bit,
            });
        }
    }

    /// Whether `mac` answered for `ip` at all.
    pub fn answered(&self, mac: MacAddr, ip: A) -> bool {
        self.heard.iter().any(|h| h.mac == mac && h.ip == ip)
    }

    /// The hosts that answered for `ip` in each of `rounds` rounds, in the order first heard.
    pub fn steady(&self, ip: A, rounds: u8) -> impl Iterator<Item = MacAddr> + '_ {
        let all = 1u8
            .checked_shl(u32::from(rounds))
            .map_or(u8::MAX, |b| b - 1);
        self.heard
            .iter()
            .filter(move |h| h.ip == ip && h.rounds & all == all)
            .map(|h| h.mac)
    }

    /// How many distinct addresses `mac` answered for.
    pub fn addresses_of(&self, mac: MacAddr) -> usize {
        self.heard.iter().filter(|h| h.mac == mac).count()
    }

    /// Everything heard.
    pub fn heard(&self) -> &[Heard<A>] {
        &self.heard
    }
}

/// Who a frame answers for, when it is an answer that counts to a probe by `own` for one of
/// `targets`: an ARP reply to that probe (sender address the target, target hardware address
/// `own`, target address zero, as RFC 5227 §2.1.1 has a host answer a probe), or an announcement
/// of the target (sender and target address both the target, as a host defending its address
/// sends). In both, the Ethernet source must be the sender hardware address: a frame that says
/// one thing at layer 2 and another in ARP is forged. Anything else is no answer: requests of
/// other hosts, replies to someone else, another host's own probe.
pub fn answer_of(frame: &[u8], own: MacAddr, targets: &[Ipv4Addr]) -> Option<(MacAddr, Ipv4Addr)> {
    let (ethernet, arp) = (frame.get(..14)?, frame.get(14..42)?);
    let is = |bytes: &[u8], value: u16| bytes == value.to_be_bytes();
    if !is(&ethernet[12..14], ETH_P_ARP)
        || !is(&arp[0..2], ARPHRD_ETHER)
        || !is(&arp[2..4], ETH_P_IP)
        || arp[4] != 6
        || arp[5] != 4
    {
        return None;
    }
    let (sha, spa, tha, tpa) = (&arp[8..14], &arp[14..18], &arp[18..24], &arp[24..28]);
    if ethernet[6..12] != *sha || *sha == own.0 {
        return None;
    }
    let target = Ipv4Addr::new(spa[0], spa[1], spa[2], spa[3]);
    if !targets.contains(&target) {
        return None;
    }
    let reply_to_us = is(&arp[6..8], ARPOP_REPLY) && *tha == own.0 && *tpa == [0; 4];
    let announcement = (is(&arp[6..8], ARPOP_REQUEST) || is(&arp[6..8], ARPOP_REPLY)) && spa == tpa;
    let mut mac = [0u8; 6];
    mac.copy_from_slice(sha);
    (reply_to_us || announcement).then_some((MacAddr(mac), target))
}

/// Probes `targets` on `interface` (RFC 5227 §2.1.1): [`PROBE_NUM`] rounds, each an ARP Probe
/// for every target, `interval` apart, and listens until `wait` after the first, noting every
/// answer that counts ([`answer_of`]) with its round. Stops early once `enough` says what was
/// heard decides the question. Blocking; needs CAP_NET_RAW.
pub fn probe(
    interface: &str,
    targets: &[Ipv4Addr],
    interval: Duration,
    wait: Duration,
    enough: impl Fn(&Answers) -> bool,
) -> Result<Answers, ArpError> {
    let (socket, index, own) = bound_socket(interface, ETH_P_ARP)?;
    let link_err = |source: io::Error| ArpError::Send {
        interface: interface.to_owned(),
        source,
    };
    let link = link_destination(index).map_err(link_err)?;
    let send = |target: &Ipv4Addr| {
        socket
            .send_to(&probe_frame(own, *target), &link)
            .map(|_| ())
    };
    let answer = |frame: &[u8]| answer_of(frame, own, targets);
    let timing = (interval, wait);
    rounds(&socket, targets, timing, &enough, send, answer).map_err(link_err)
}

/// The rounds of a probe, for either family: [`PROBE_NUM`] rounds, each `send` for every
/// target, `interval` apart (`timing.0`); every frame read on `socket` until `wait` (`timing.1`)
/// after the first is passed to `answer`, and what it finds is noted with its round; stops
/// early once `enough`.
fn rounds<A: Copy + PartialEq>(
    socket: &Socket,
    targets: &[A],
    (interval, wait): (Duration, Duration),
    enough: &dyn Fn(&Answers<A>) -> bool,
    send: impl Fn(&A) -> io::Result<()>,
    answer: impl Fn(&[u8]) -> Option<(MacAddr, A)>,
) -> io::Result<Answers<A>> {
    let start = std::time::Instant::now();
    let end = start + wait;
    let mut answers = Answers::default();
    let mut buf = [0u8; 256];
    for round in 0..PROBE_NUM {
        for target in targets {
            send(target)?;
        }
        let round_end = if round + 1 < PROBE_NUM {
            (start + interval * u32::from(round + 1)).min(end)
        } else {
            end
        };
        loop {
            let left = round_end.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            socket.set_read_timeout(Some(left))?;
            match (&*socket).read(&mut buf) {
                Ok(len) => {
                    if let Some((mac, ip)) = answer(buf.get(..len).unwrap_or_default()) {
                        answers.record(mac, ip, round);
                        if enough(&answers) {
                            return Ok(answers);
                        }
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => return Err(source),
            }
        }
    }
    Ok(answers)
}

/// A packet socket bound to `interface` and EtherType `protocol` (only those frames of that
/// interface are received), with the interface's index and MAC. Needs CAP_NET_RAW.
fn bound_socket(interface: &str, protocol: u16) -> Result<(Socket, u32, MacAddr), ArpError> {
    let (index, own) = link(interface)?;
    let socket = Socket::new(
        Domain::PACKET,
        Type::RAW,
        Some(socket2::Protocol::from(i32::from(protocol.to_be()))),
    )
    .map_err(|source| ArpError::Socket {
        missing: Capability::NetRaw.lacking(&source),
        source,
    })?;
    let bind = link_address(index, protocol, [0; 6]).and_then(|at| socket.bind(&at));
    bind.map_err(|source| ArpError::Send {
        interface: interface.to_owned(),
        source,
    })?;
    Ok((socket, index, own))
}

/// The destination of an ARP frame on a packet socket: `index`'s link, broadcast.
fn link_destination(index: u32) -> io::Result<SockAddr> {
    link_address(index, ETH_P_ARP, BROADCAST)
}

/// A packet-socket address (`sockaddr_ll`): `index`'s link, EtherType `protocol`, to `to`
/// (ignored when binding). For ARP here, and for the DHCPv6 server's socket, which binds to its
/// interface's IPv6 frames.
///
/// socket2 has no constructor for `sockaddr_ll`, so it is written into a zeroed storage here;
/// this is the one place in the agent that needs `unsafe`.
#[allow(unsafe_code)]
pub fn link_address(index: u32, protocol: u16, to: [u8; 6]) -> io::Result<SockAddr> {
    let ifindex = i32::try_from(index).map_err(|_| io::Error::other("ifindex out of range"))?;
    let len = socket2::socklen_t::try_from(std::mem::size_of::<libc::sockaddr_ll>())
        .map_err(|_| io::Error::other("sockaddr_ll size"))?;
    let mut storage = SockAddrStorage::zeroed();
    // SAFETY: `SockAddrStorage` wraps a `sockaddr_storage`, which is large and aligned enough for
    // every socket address type of the platform, `sockaddr_ll` included (`view_as` asserts the
    // size); all-zero bytes are a valid `sockaddr_ll` (plain integers and arrays).
    let ll = unsafe { storage.view_as::<libc::sockaddr_ll>() };
    ll.sll_family = libc::AF_PACKET as libc::c_ushort;
    ll.sll_protocol = protocol.to_be();
    ll.sll_ifindex = ifindex;
    ll.sll_halen = 6;
    ll.sll_addr[..6].copy_from_slice(&to);
    // SAFETY: the storage holds an initialised `sockaddr_ll` of family AF_PACKET, and `len` is
    // its size, within the storage.
    Ok(unsafe { SockAddr::new(storage, len) })
}

/// The index and MAC of `interface`, from sysfs (the agent's own network namespace).
pub fn link(interface: &str) -> Result<(u32, MacAddr), ArpError> {
    let read = |file: &str, what: &'static str| {
        std::fs::read_to_string(format!("/sys/class/net/{interface}/{file}")).map_err(|e| {
            ArpError::Interface {
                interface: interface.to_owned(),
                what,
                detail: e.to_string(),
            }
        })
    };
    let bad = |what: &'static str, detail: String| ArpError::Interface {
        interface: interface.to_owned(),
        what,
        detail,
    };
    let index = read("ifindex", "ifindex")?
        .trim()
        .parse()
        .map_err(|e: std::num::ParseIntError| bad("ifindex", e.to_string()))?;
    let mac = read("address", "MAC address")?
        .trim()
        .parse()
        .map_err(|e: vmdhcp_core::mac::MacError| bad("MAC address", e.to_string()))?;
    Ok((index, mac))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dad_solicitation_goes_to_the_solicited_node_group_and_an_advertisement_names_its_host() {
        let target: Ipv6Addr = "fd00::12:3456".parse().unwrap();
        let ns = neighbor_solicitation(MAC, target);
        assert_eq!(&ns[0..6], &[0x33, 0x33, 0xff, 0x12, 0x34, 0x56]);
        let (ipv6, icmp) = ns[14..].split_at(40);
        assert_eq!(&ipv6[8..24], &[0u8; 16], "from the unspecified address");
        assert_eq!(
            &ipv6[24..40],
            &"ff02::1:ff12:3456".parse::<Ipv6Addr>().unwrap().octets()
        );
        assert_eq!((icmp[0], ipv6[7]), (135, 255));
        let group: Ipv6Addr = "ff02::1:ff12:3456".parse().unwrap();
        assert_eq!(icmpv6_checksum(Ipv6Addr::UNSPECIFIED, group, icmp), 0);
        // Another host's advertisement of the target names it; ours, or another target's, not.
        let other = MacAddr([2, 0, 0, 0, 0, 0x77]);
        let na = neighbor_advertisement(other, target);
        assert_eq!(advertiser_of(&na, MAC, &[target]), Some((other, target)));
        assert_eq!(advertiser_of(&na, other, &[target]), None);
        assert_eq!(advertiser_of(&na, MAC, &["fd00::1".parse().unwrap()]), None);
        assert_eq!(advertiser_of(&ns, MAC, &[target]), None);
    }

    #[test]
    fn an_advertisement_counts_only_to_all_nodes_and_naming_its_own_ethernet_source() {
        let target: Ipv6Addr = "fd00::12:3456".parse().unwrap();
        let host = MacAddr([2, 0, 0, 0, 0, 0x77]);
        let na = neighbor_advertisement(host, target);
        // Its Target Link-Layer Address says another MAC than its Ethernet source: forged.
        let mut lying = na;
        lying[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 0x66]);
        assert_eq!(advertiser_of(&lying, MAC, &[target]), None);
        // Without the option: no answer to a probe from the unspecified address (RFC 4861
        // §7.2.4 requires it there).
        let mut bare = na.to_vec();
        bare.truncate(14 + 40 + 24);
        bare[14 + 5] = 24;
        assert_eq!(advertiser_of(&bare, MAC, &[target]), None);
        // Unicast to us: answers no DAD probe.
        let mut unicast = na;
        unicast[14 + 24..14 + 40]
            .copy_from_slice(&"fe80::aa".parse::<Ipv6Addr>().unwrap().octets());
        assert_eq!(advertiser_of(&unicast, MAC, &[target]), None);
        // A hop limit other than 255: off-link, forged.
        let mut routed = na;
        routed[14 + 7] = 64;
        assert_eq!(advertiser_of(&routed, MAC, &[target]), None);
        // A zero-length option would loop for ever: the frame is no answer.
        let mut broken = na;
        broken[14 + 40 + 25] = 0;
        assert_eq!(advertiser_of(&broken, MAC, &[target]), None);
        for cut in 0..na.len() {
            assert_eq!(advertiser_of(&na[..cut], MAC, &[target]), None, "{cut}");
        }
    }

    #[test]
    fn a_neighbor_advertisement_overrides_from_the_address_to_all_nodes_with_a_valid_checksum() {
        let ip: Ipv6Addr = "fd00::2".parse().unwrap();
        let frame = neighbor_advertisement(MAC, ip);
        assert_eq!(&frame[0..6], &ALL_NODES_MAC);
        assert_eq!(&frame[6..12], &MAC.octets());
        assert_eq!(&frame[12..14], &[0x86, 0xdd]);
        let (ipv6, icmp) = frame[14..].split_at(40);
        assert_eq!((ipv6[6], ipv6[7]), (58, 255));
        assert_eq!(&ipv6[8..24], &ip.octets());
        assert_eq!(&ipv6[24..40], &ALL_NODES.octets());
        assert_eq!((icmp[0], icmp[1], icmp[4]), (136, 0, 0x20));
        assert_eq!(&icmp[8..24], &ip.octets());
        assert_eq!(&icmp[24..32], &[2, 1, 0x02, 0x42, 0xac, 0x11, 0x00, 0x02]);
        // A checksum over the message with its checksum in place sums to all ones.
        assert_eq!(icmpv6_checksum(ip, ALL_NODES, icmp), 0);
    }

    const MAC: MacAddr = MacAddr([0x02, 0x42, 0xac, 0x11, 0x00, 0x02]);
    const IP: Ipv4Addr = Ipv4Addr::new(10, 123, 45, 2);

    #[test]
    fn an_announcement_is_a_broadcast_arp_request_for_the_senders_own_address() {
        let frame = announcement(MAC, IP);
        let expected: [u8; 42] = [
            // Ethernet: broadcast destination, our MAC as source, ARP.
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0x42, 0xac, 0x11, 0x00, 0x02, 0x08, 0x06,
            // ARP: Ethernet/IPv4, 6/4 bytes, request.
            0x00, 0x01, 0x08, 0x00, 6, 4, 0x00, 0x01, //
            // Sender: our MAC, the server address.
            0x02, 0x42, 0xac, 0x11, 0x00, 0x02, 10, 123, 45, 2, //
            // Target: zero MAC, the server address again.
            0, 0, 0, 0, 0, 0, 10, 123, 45, 2,
        ];
        assert_eq!(frame[..42], expected);
        assert!(frame[42..].iter().all(|b| *b == 0), "zero padding");
        assert_eq!(frame.len(), 60, "the Ethernet minimum");
    }

    #[test]
    fn a_probe_asks_for_the_address_without_claiming_it_and_answers_are_read() {
        let mac = MacAddr([2, 0, 0, 0, 0, 7]);
        let ip = Ipv4Addr::new(192, 0, 2, 10);
        let probe = probe_frame(mac, ip);
        assert_eq!(
            &probe[14 + 14..14 + 18],
            &[0, 0, 0, 0],
            "sender address zero"
        );
        assert_eq!(&probe[14 + 24..14 + 28], &ip.octets(), "target");
        assert_eq!(&probe[14 + 8..14 + 14], &mac.0, "sender: the prober's MAC");
        // To another prober, the probe claims nothing, an announcement claims `ip`.
        let other = MacAddr([2, 0, 0, 0, 0, 8]);
        assert_eq!(answer_of(&probe, other, &[ip]), None);
        assert_eq!(
            answer_of(&announcement(mac, ip), other, &[ip]),
            Some((mac, ip))
        );
        // Not ARP on Ethernet: nobody.
        let mut ipv4 = announcement(mac, ip);
        ipv4[12..14].copy_from_slice(&ETH_P_IP.to_be_bytes());
        assert_eq!(answer_of(&ipv4, other, &[ip]), None);
    }

    /// An ARP frame on Ethernet: `op`, Ethernet source `eth_src`, then sender and target.
    fn arp(
        op: u16,
        eth_src: MacAddr,
        sha: MacAddr,
        spa: Ipv4Addr,
        tha: MacAddr,
        tpa: Ipv4Addr,
    ) -> [u8; 42] {
        let mut f = [0u8; 42];
        f[..6].copy_from_slice(&tha.0);
        f[6..12].copy_from_slice(&eth_src.0);
        f[12..14].copy_from_slice(&ETH_P_ARP.to_be_bytes());
        f[14..16].copy_from_slice(&ARPHRD_ETHER.to_be_bytes());
        f[16..18].copy_from_slice(&ETH_P_IP.to_be_bytes());
        (f[18], f[19]) = (6, 4);
        f[20..22].copy_from_slice(&op.to_be_bytes());
        f[22..28].copy_from_slice(&sha.0);
        f[28..32].copy_from_slice(&spa.octets());
        f[32..38].copy_from_slice(&tha.0);
        f[38..42].copy_from_slice(&tpa.octets());
        f
    }

    #[test]
    fn only_a_reply_to_our_probe_or_an_announcement_from_its_own_mac_is_an_answer() {
        let us = MacAddr([2, 0, 0, 0, 0, 1]);
        let host = MacAddr([2, 0, 0, 0, 0, 7]);
        let ip = Ipv4Addr::new(192, 0, 2, 10);
        let zero = Ipv4Addr::UNSPECIFIED;
        let none = MacAddr([0; 6]);
        let targets = [ip];
        // A reply to our probe (as Linux answers one), and an announcement: answers.
        let reply = arp(ARPOP_REPLY, host, host, ip, us, zero);
        assert_eq!(answer_of(&reply, us, &targets), Some((host, ip)));
        let announce = arp(ARPOP_REQUEST, host, host, ip, none, ip);
        assert_eq!(answer_of(&announce, us, &targets), Some((host, ip)));
        // The Ethernet source is not the ARP sender: forged.
        let forged = arp(ARPOP_REPLY, MacAddr([2, 0, 0, 0, 0, 8]), host, ip, us, zero);
        assert_eq!(answer_of(&forged, us, &targets), None);
        // A reply to someone else, or to another address of ours: not to our probe.
        let theirs = arp(
            ARPOP_REPLY,
            host,
            host,
            ip,
            MacAddr([2, 0, 0, 0, 0, 5]),
            zero,
        );
        assert_eq!(answer_of(&theirs, us, &targets), None);
        let to_ours = arp(ARPOP_REPLY, host, host, ip, us, Ipv4Addr::new(192, 0, 2, 1));
        assert_eq!(answer_of(&to_ours, us, &targets), None);
        // A request about the address, another host's own probe, our own frame, another address.
        let who_has = arp(
            ARPOP_REQUEST,
            host,
            host,
            Ipv4Addr::new(192, 0, 2, 9),
            none,
            ip,
        );
        assert_eq!(answer_of(&who_has, us, &targets), None);
        let their_probe = arp(ARPOP_REQUEST, host, host, zero, none, ip);
        assert_eq!(answer_of(&their_probe, us, &targets), None);
        let ours = arp(ARPOP_REPLY, us, us, ip, us, zero);
        assert_eq!(answer_of(&ours, us, &targets), None);
        let elsewhere = arp(
            ARPOP_REPLY,
            host,
            host,
            Ipv4Addr::new(192, 0, 2, 11),
            us,
            zero,
        );
        assert_eq!(answer_of(&elsewhere, us, &targets), None);
        assert_eq!(answer_of(&reply[..30], us, &targets), None, "cut short");
    }

    #[test]
    fn answers_are_kept_by_round_and_bounded() {
        let ip = Ipv4Addr::new(192, 0, 2, 10);
        let (a, b) = (MacAddr([2, 0, 0, 0, 0, 7]), MacAddr([2, 0, 0, 0, 0, 8]));
        let mut answers = Answers::default();
        for round in 0..PROBE_NUM {
            answers.record(a, ip, round);
        }
        answers.record(b, ip, 0);
        answers.record(b, ip, 0);
        assert_eq!(answers.steady(ip, PROBE_NUM).collect::<Vec<_>>(), [a]);
        assert!(answers.answered(b, ip) && !answers.answered(b, Ipv4Addr::new(192, 0, 2, 11)));
        assert_eq!(answers.addresses_of(a), 1);
        for n in 0..100u8 {
            answers.record(MacAddr([2, 0, 0, 0, 1, n]), ip, 0);
        }
        assert_eq!(answers.heard().len(), MAX_HEARD);
    }

    #[test]
    fn a_late_answer_counts_for_its_probe_and_a_burst_for_two_rounds_at_most() {
        let ip = Ipv4Addr::new(192, 0, 2, 10);
        let (late, burst) = (MacAddr([2, 0, 0, 0, 0, 7]), MacAddr([2, 0, 0, 0, 0, 8]));
        let mut answers = Answers::default();
        // Each answer arrives after the next probe left: rounds 1, 2, 2.
        answers.record(late, ip, 1);
        answers.record(late, ip, 2);
        assert_eq!(answers.steady(ip, PROBE_NUM).count(), 0, "two answers");
        answers.record(late, ip, 2);
        assert_eq!(answers.steady(ip, PROBE_NUM).collect::<Vec<_>>(), [late]);
        // Ten answers after the last probe answer two probes, not three.
        for _ in 0..10 {
            answers.record(burst, ip, PROBE_NUM - 1);
        }
        assert_eq!(answers.steady(ip, PROBE_NUM).collect::<Vec<_>>(), [late]);
        // Nor does a burst in the first round.
        let mut first = Answers::default();
        for _ in 0..10 {
            first.record(burst, ip, 0);
        }
        first.record(burst, ip, 1);
        assert_eq!(first.steady(ip, PROBE_NUM).count(), 0);
    }

    #[test]
    fn the_frame_follows_the_mac_and_address() {
        let other = announcement(MacAddr([2, 0, 0, 0, 0, 9]), Ipv4Addr::new(192, 168, 7, 1));
        assert_eq!(other[6..12], [2, 0, 0, 0, 0, 9]);
        assert_eq!(other[22..28], [2, 0, 0, 0, 0, 9]);
        assert_eq!(other[28..32], [192, 168, 7, 1]);
        assert_eq!(other[38..42], [192, 168, 7, 1]);
        assert_ne!(other, announcement(MAC, IP));
    }

    #[test]
    fn the_destination_is_the_interfaces_link_for_arp() {
        let addr = link_destination(7).unwrap();
        assert_eq!(i32::from(addr.family()), libc::AF_PACKET);
        assert_eq!(
            usize::try_from(addr.len()).unwrap(),
            std::mem::size_of::<libc::sockaddr_ll>()
        );
    }

    #[test]
    fn an_interface_that_does_not_exist_is_an_error_naming_it() {
        let error = link("vmdhcp-nope0").unwrap_err();
        assert!(
            error.to_string().contains("interface vmdhcp-nope0"),
            "{error}"
        );
    }

    #[test]
    fn a_refused_socket_names_cap_net_raw_and_where_to_grant_it() {
        let error = ArpError::Socket {
            source: io::Error::from_raw_os_error(1), // EPERM
            missing: Missing(Some(Capability::NetRaw)),
        };
        let text = error.to_string();
        assert!(
            text.starts_with("cannot open a packet socket for ARP announcements:"),
            "{text}"
        );
        assert!(
            text.contains("the agent lacks CAP_NET_RAW: grant NET_RAW"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_disabled_announcer_announces_nothing_and_says_so() {
        let mut announcer = Announcer::disabled();
        let pool: NamespacedName = "default/a".parse().unwrap();
        announcer.announce("eth1", &pool, IP);
        assert!(announcer.running().is_empty());
        assert!(!announcer.counters().enabled());
        assert!(announcer.counters().read().is_empty());
    }

    #[test]
    fn counters_follow_the_pool_of_an_interface_and_go_with_it() {
        let counters = SendCounters::default();
        let a: NamespacedName = "default/a".parse().unwrap();
        let b: NamespacedName = "default/b".parse().unwrap();
        counters
            .entry("eth1", &a)
            .sent
            .fetch_add(3, Ordering::Relaxed);
        counters
            .entry("eth1", &a)
            .failed
            .fetch_add(1, Ordering::Relaxed);
        counters
            .entry("eth2", &b)
            .sent
            .fetch_add(1, Ordering::Relaxed);
        let read = counters.read();
        assert_eq!(
            read[0],
            SendReading {
                interface: "eth1".into(),
                pool: "default/a".into(),
                sent: 3,
                failed: 1
            }
        );
        // Another pool on the same interface starts from zero.
        counters.entry("eth1", &b);
        assert_eq!(counters.read()[0].sent, 0);
        counters.retain(|name| name == "eth2");
        assert_eq!(counters.read().len(), 1);
        assert_eq!(counters.read()[0].interface, "eth2");
    }
}
