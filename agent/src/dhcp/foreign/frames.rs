//! The frames of the foreign-server detector, built and read by pure functions: the probing
//! DISCOVER, a server's reply as read off the wire, whether it is someone else's, and the socket
//! filter that lets only such replies through.

use super::*;

/// A random transaction id, one per probe. Not a secret (any host on the network sees the
/// probe); it only tells answers to the probe from replies to clients. `RandomState` is seeded
/// from the OS once per process and advanced per instance, which is random enough for that.
pub(super) fn random_xid() -> u32 {
    let bits = RandomState::new().build_hasher().finish();
    (bits ^ (bits >> 32)) as u32
}

/// The probe: a DHCPDISCOVER from `mac` with transaction id `xid` and the broadcast flag (so
/// that servers answer by broadcast, which reaches the packet socket whatever address they
/// offer).
pub fn discover(mac: MacAddr, xid: u32) -> Result<Vec<u8>, dhcproto::error::EncodeError> {
    let u = Ipv4Addr::UNSPECIFIED;
    let mut m = Message::new_with_id(xid, u, u, u, u, &mac.octets());
    m.set_flags(Flags::default().set_broadcast());
    m.opts_mut()
        .insert(DhcpOption::MessageType(MessageType::Discover));
    m.opts_mut().insert(DhcpOption::ParameterRequestList(vec![
        OptionCode::SubnetMask,
        OptionCode::Router,
        OptionCode::DomainNameServer,
    ]));
    m.to_vec()
}

/// What kind of reply a server sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyKind {
    /// DHCPOFFER.
    Offer,
    /// DHCPACK.
    Ack,
    /// DHCPNAK.
    Nak,
}

/// A DHCP server's reply as read off the wire, with who sent it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerReply {
    /// OFFER, ACK or NAK.
    pub kind: ReplyKind,
    /// The frame's Ethernet source.
    pub eth_source: MacAddr,
    /// The packet's IP source.
    pub ip_source: Ipv4Addr,
    /// Option 54, when present.
    pub server_id: Option<Ipv4Addr>,
    /// The transaction id.
    pub xid: u32,
    /// The address offered or acknowledged (zero in a NAK).
    pub yiaddr: Ipv4Addr,
    /// The client it answers.
    pub chaddr: MacAddr,
}

/// Reads an Ethernet frame as a DHCP server's reply (IPv4, UDP 67 → 68, BOOTREPLY on Ethernet
/// with the magic cookie and a message type of OFFER, ACK or NAK); `None` for anything else.
/// Pure and total: no input panics it.
pub fn read_reply(frame: &[u8]) -> Option<ServerReply> {
    let be16 = |at: usize| -> Option<u16> {
        Some(u16::from_be_bytes(frame.get(at..at + 2)?.try_into().ok()?))
    };
    let mac_at =
        |at: usize| -> Option<MacAddr> { Some(MacAddr(frame.get(at..at + 6)?.try_into().ok()?)) };
    let ip_at = |bytes: &[u8], at: usize| -> Option<Ipv4Addr> {
        let b: [u8; 4] = bytes.get(at..at + 4)?.try_into().ok()?;
        Some(Ipv4Addr::from(b))
    };
    if be16(12)? != ETH_P_IP {
        return None;
    }
    let eth_source = mac_at(6)?;
    let ip = 14;
    let version_ihl = *frame.get(ip)?;
    let ihl = usize::from(version_ihl & 0x0f) * 4;
    if version_ihl >> 4 != 4 || ihl < 20 || *frame.get(ip + 9)? != IPPROTO_UDP {
        return None;
    }
    // A fragment (other than a whole datagram) is not read: replies fit in one frame.
    if be16(ip + 6)? & 0x3fff != 0 {
        return None;
    }
    let ip_source = ip_at(frame, ip + 12)?;
    let udp = ip + ihl;
    if be16(udp)? != SERVER_PORT || be16(udp + 2)? != CLIENT_PORT {
        return None;
    }
    let udp_len = usize::from(be16(udp + 4)?);
    let end = udp.checked_add(udp_len)?.min(frame.len());
    let dhcp = frame.get(udp + 8..end)?;
    if dhcp.len() < 240 || dhcp[0] != BOOTREPLY || dhcp[1] != 1 || dhcp[2] != 6 {
        return None;
    }
    if dhcp[236..240] != MAGIC_COOKIE {
        return None;
    }
    let xid = u32::from_be_bytes(dhcp.get(4..8)?.try_into().ok()?);
    let yiaddr = ip_at(dhcp, 16)?;
    let chaddr = MacAddr(dhcp.get(28..34)?.try_into().ok()?);
    let (mut kind, mut server_id) = (None, None);
    let mut at = 240;
    while let Some(&code) = dhcp.get(at) {
        match code {
            0 => at += 1,
            255 => break,
            _ => {
                let len = usize::from(*dhcp.get(at + 1)?);
                let value = dhcp.get(at + 2..at + 2 + len)?;
                match (code, value) {
                    (53, [2]) => kind = Some(ReplyKind::Offer),
                    (53, [5]) => kind = Some(ReplyKind::Ack),
                    (53, [6]) => kind = Some(ReplyKind::Nak),
                    (54, &[a, b, c, d]) => server_id = Some(Ipv4Addr::new(a, b, c, d)),
                    _ => {}
                }
                at += 2 + len;
            }
        }
    }
    Some(ServerReply {
        kind: kind?,
        eth_source,
        ip_source,
        server_id,
        xid,
        yiaddr,
        chaddr,
    })
}

/// Who we are on the interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Own {
    /// The interface's MAC.
    pub mac: MacAddr,
    /// The pool's server address.
    pub server_ip: Ipv4Addr,
}

/// A foreign server, as seen in one reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sighting {
    /// Its MAC (the reply's Ethernet source).
    pub mac: MacAddr,
    /// The address it speaks for: its server identifier, else the reply's IP source; `None`
    /// when it gives neither.
    pub ip: Option<Ipv4Addr>,
    /// What it did, for people.
    pub detail: String,
}

/// Whether `reply` comes from a server that is not ours, and what it did; `probe_xid` is the
/// transaction id of our last probe.
pub fn judge(reply: &ServerReply, own: Own, probe_xid: Option<u32>) -> Option<Sighting> {
    let server = reply.server_id.unwrap_or(reply.ip_source);
    if server == own.server_ip || reply.eth_source == own.mac || reply.ip_source == own.server_ip {
        return None;
    }
    let to_probe = probe_xid == Some(reply.xid) && reply.chaddr == own.mac;
    let detail = match (reply.kind, to_probe) {
        (ReplyKind::Offer, true) => {
            format!("offered {} in answer to the agent's probe", reply.yiaddr)
        }
        (ReplyKind::Offer, false) => format!("offered {} to {}", reply.yiaddr, reply.chaddr),
        (ReplyKind::Ack, _) => format!("acknowledged {} for {}", reply.yiaddr, reply.chaddr),
        (ReplyKind::Nak, _) => format!("refused {} (NAK)", reply.chaddr),
    };
    Some(Sighting {
        mac: reply.eth_source,
        ip: Some(server).filter(|ip| !ip.is_unspecified()),
        detail,
    })
}

// Classic BPF opcodes (linux/filter.h), as the kernel reads them.
pub(super) const BPF_LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
pub(super) const BPF_LD_H_ABS: u16 = (libc::BPF_LD | libc::BPF_H | libc::BPF_ABS) as u16;
pub(super) const BPF_LD_B_ABS: u16 = (libc::BPF_LD | libc::BPF_B | libc::BPF_ABS) as u16;
pub(super) const BPF_LD_H_IND: u16 = (libc::BPF_LD | libc::BPF_H | libc::BPF_IND) as u16;
pub(super) const BPF_LDX_B_MSH: u16 = (libc::BPF_LDX | libc::BPF_B | libc::BPF_MSH) as u16;
pub(super) const BPF_JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
pub(super) const BPF_JGT_K: u16 = (libc::BPF_JMP | libc::BPF_JGT | libc::BPF_K) as u16;
pub(super) const BPF_JSET_K: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
pub(super) const BPF_RET: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
/// Where the kernel's ancillary data is read from (`SKF_AD_OFF + SKF_AD_*`).
pub(super) const AD_IFINDEX: u32 = (libc::SKF_AD_OFF + libc::SKF_AD_IFINDEX) as u32;
pub(super) const AD_PKTTYPE: u32 = (libc::SKF_AD_OFF + libc::SKF_AD_PKTTYPE) as u32;

/// The packet socket's filter: frames received on interface `ifindex` (not sent or looped back
/// by this host), IPv4, UDP, the first or only fragment, from port 67 to port 68. A packet
/// socket bound to a protocol hears every interface; selecting the interface here needs no
/// `sockaddr_ll`, and so no `unsafe`.
pub fn filter(ifindex: u32) -> [SockFilter; 17] {
    program(ifindex).map(|i| SockFilter::new(i.code, i.jt, i.jf, i.k))
}

/// [`filter`]'s instructions, readable (socket2's `SockFilter` keeps them private).
pub(super) fn program(ifindex: u32) -> [libc::sock_filter; 17] {
    // Instruction 16 drops; a jump offset counts from the instruction after the jump.
    const DROP: u8 = 16;
    let to_drop = |at: u8| DROP - at - 1;
    let op = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    [
        op(BPF_LD_W_ABS, 0, 0, AD_IFINDEX),
        op(BPF_JEQ_K, 0, to_drop(1), ifindex),
        op(BPF_LD_W_ABS, 0, 0, AD_PKTTYPE),
        op(BPF_JGT_K, to_drop(3), 0, PACKET_OTHERHOST),
        op(BPF_LD_H_ABS, 0, 0, 12),
        op(BPF_JEQ_K, 0, to_drop(5), u32::from(ETH_P_IP)),
        op(BPF_LD_B_ABS, 0, 0, 14 + 9),
        op(BPF_JEQ_K, 0, to_drop(7), u32::from(IPPROTO_UDP)),
        op(BPF_LD_H_ABS, 0, 0, 14 + 6),
        op(BPF_JSET_K, to_drop(9), 0, 0x1fff),
        op(BPF_LDX_B_MSH, 0, 0, 14),
        op(BPF_LD_H_IND, 0, 0, 14),
        op(BPF_JEQ_K, 0, to_drop(12), u32::from(SERVER_PORT)),
        op(BPF_LD_H_IND, 0, 0, 14 + 2),
        op(BPF_JEQ_K, 0, to_drop(14), u32::from(CLIENT_PORT)),
        op(BPF_RET, 0, 0, FRAME_MAX as u32),
        op(BPF_RET, 0, 0, 0),
    ]
}
