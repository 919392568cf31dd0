//! Hostile hosts on a dual-stack VM network, for the `hostile` suite's IPv6 tests: the frames a
//! tenant forges (Neighbor Advertisements, DHCPv6 messages from any source, relayed DECLINEs in
//! another VM's name), built whole here with their checksums, and a bounded sender that plays
//! them on a namespace's `eth0`.
//!
//! These helpers fail the calling test on any error: they are test code, not product code.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::net::Ipv6Addr;
use std::time::Duration;

use crate::hostile::Attacker;
use crate::netns::Netns;
use crate::static_agent::hex;

/// The Ethernet group of `ff02::1:2` (all DHCPv6 servers and relays).
pub const ALL_SERVERS_MAC: [u8; 6] = [0x33, 0x33, 0, 1, 0, 2];
/// All DHCPv6 servers and relays.
pub const ALL_SERVERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 1, 2);

/// The Internet checksum of `message` over IPv6 with next header `next_header`.
fn checksum(src: Ipv6Addr, dst: Ipv6Addr, next_header: u8, message: &[u8]) -> u16 {
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    pseudo.extend_from_slice(&[0, 0, 0, next_header]);
    pseudo.extend_from_slice(message);
    let mut sum: u64 = pseudo
        .chunks(2)
        .map(|c| u64::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !u16::try_from(sum).unwrap()
}

/// An Ethernet frame carrying IPv6 `payload` (next header `next_header`, hop limit `hops`).
fn ipv6_frame(
    (src_mac, dst_mac): ([u8; 6], [u8; 6]),
    (src, dst): (Ipv6Addr, Ipv6Addr),
    next_header: u8,
    hops: u8,
    payload: &[u8],
) -> Vec<u8> {
    let mut f = Vec::with_capacity(54 + payload.len());
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
    f.extend_from_slice(&u16::try_from(payload.len()).unwrap().to_be_bytes());
    f.extend_from_slice(&[next_header, hops]);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    f.extend_from_slice(payload);
    f
}

/// A UDP datagram `payload` from `src:sport` to `dst:dport`, in a frame from `macs.0` to
/// `macs.1`.
pub fn udp6(
    macs: ([u8; 6], [u8; 6]),
    (src, sport): (Ipv6Addr, u16),
    (dst, dport): (Ipv6Addr, u16),
    payload: &[u8],
) -> Vec<u8> {
    let len = u16::try_from(8 + payload.len()).unwrap();
    let mut udp = Vec::with_capacity(usize::from(len));
    udp.extend_from_slice(&sport.to_be_bytes());
    udp.extend_from_slice(&dport.to_be_bytes());
    udp.extend_from_slice(&len.to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(payload);
    let sum = checksum(src, dst, 17, &udp);
    udp[6..8].copy_from_slice(&sum.to_be_bytes());
    ipv6_frame(macs, (src, dst), 17, 64, &udp)
}

/// A Neighbor Advertisement of `target` with the Solicited and Override flags and a Target
/// Link-Layer Address option naming `tlla`, from `src` to `dst` in a frame from `macs.0` to
/// `macs.1`: what rewrites a neighbour entry for `target` to `tlla`.
pub fn neighbor_advertisement(
    macs: ([u8; 6], [u8; 6]),
    (src, dst): (Ipv6Addr, Ipv6Addr),
    target: Ipv6Addr,
    tlla: [u8; 6],
) -> Vec<u8> {
    let mut icmp = vec![136, 0, 0, 0, 0x60, 0, 0, 0];
    icmp.extend_from_slice(&target.octets());
    icmp.extend_from_slice(&[2, 1]);
    icmp.extend_from_slice(&tlla);
    let sum = checksum(src, dst, 58, &icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    ipv6_frame(macs, (src, dst), 58, 255, &icmp)
}

/// The DHCPv6 option `code` with `value`.
fn option(code: u16, value: &[u8]) -> Vec<u8> {
    let mut o = code.to_be_bytes().to_vec();
    o.extend_from_slice(&u16::try_from(value.len()).unwrap().to_be_bytes());
    o.extend_from_slice(value);
    o
}

/// An INFORMATION-REQUEST (no client or server id needed) with transaction id `xid`.
pub fn information_request(xid: u32) -> Vec<u8> {
    let mut m = vec![11];
    m.extend_from_slice(&xid.to_be_bytes()[1..]);
    m.extend(option(8, &[0, 0]));
    m
}

/// A SOLICIT from the DUID-LL of `mac` asking for `ias` IA_NAs.
pub fn solicit_with_ias(mac: [u8; 6], ias: u32) -> Vec<u8> {
    let mut m = vec![1, 0xab, 0xcd, 0xef];
    let mut duid = vec![0, 3, 0, 1];
    duid.extend_from_slice(&mac);
    m.extend(option(1, &duid));
    m.extend(option(8, &[0, 0]));
    for id in 0..ias {
        let mut ia = id.to_be_bytes().to_vec();
        ia.extend_from_slice(&[0; 8]);
        m.extend(option(3, &ia));
    }
    m
}

/// A DECLINE of `addr` to the server with DUID `server_duid`, in the name of the NIC `victim`
/// (its DUID-LL), relayed: a RELAY-FORW whose Client Link-Layer Address option (79) names the
/// victim, as a tenant posing as a relay sends it.
pub fn relayed_decline(victim: [u8; 6], server_duid: &[u8], addr: Ipv6Addr) -> Vec<u8> {
    let mut decline = vec![9, 0x0d, 0xec, 0x11];
    let mut duid = vec![0, 3, 0, 1];
    duid.extend_from_slice(&victim);
    decline.extend(option(1, &duid));
    decline.extend(option(2, server_duid));
    let mut ia = 1u32.to_be_bytes().to_vec();
    ia.extend_from_slice(&[0; 8]);
    let mut ia_addr = addr.octets().to_vec();
    ia_addr.extend_from_slice(&[0; 8]);
    ia.extend(option(5, &ia_addr));
    decline.extend(option(3, &ia));
    let mut relay = vec![12, 0];
    relay.extend_from_slice(&Ipv6Addr::UNSPECIFIED.octets());
    relay.extend_from_slice(&"fe80::dead".parse::<Ipv6Addr>().unwrap().octets());
    let mut lla = vec![0, 1];
    lla.extend_from_slice(&victim);
    relay.extend(option(79, &lla));
    relay.extend(option(9, &decline));
    relay
}

/// Starts, on `ns`'s eth0, a host that sends `frames` in turn, one every `every`, for
/// `duration` and no more frames than that. [`Attacker::finish`] gives (frames sent, bytes
/// sent).
pub fn play(ns: &Netns, frames: &[Vec<u8>], every: Duration, duration: Duration) -> Attacker {
    let list: Vec<String> = frames.iter().map(|f| format!("'{}'", hex(f))).collect();
    let script = format!(
        "import signal,socket,time\n\
         signal.signal(signal.SIGINT,signal.default_int_handler)\n\
         p=socket.socket(socket.AF_PACKET,socket.SOCK_RAW)\n\
         p.bind(('eth0',0))\n\
         frames=[bytes.fromhex(h) for h in [{list}]]\n\
         print('ready',flush=True)\n\
         start=time.monotonic()\n\
         end=start+{duration}\n\
         n=b=0\n\
         try:\n\
         \x20while n<{max}:\n\
         \x20 now=time.monotonic()\n\
         \x20 if now>=end: break\n\
         \x20 f=frames[n%len(frames)]\n\
         \x20 p.send(f); n+=1; b+=len(f)\n\
         \x20 time.sleep(max(0,min(start+n*{every},end)-time.monotonic()))\n\
         except KeyboardInterrupt:\n\
         \x20pass\n\
         print(n,b)\n",
        list = list.join(","),
        duration = duration.as_secs_f64(),
        every = every.as_secs_f64(),
        max = duration.as_micros() / every.as_micros().max(1) + 1,
    );
    Attacker::start(ns, &script, duration)
}

/// Starts, on `ns`'s eth0 (MAC `own`), a host that answers every Neighbor Solicitation it hears
/// for any address, duplicate address detection's included (to all nodes, Override set, naming
/// `own`), as a proxy-NDP router or a hostile tenant does, for `duration` and at most `max`
/// answers. [`Attacker::finish`] gives the number of answers sent.
pub fn answer_every_ns(ns: &Netns, own: [u8; 6], duration: Duration, max: u32) -> Attacker {
    let script = format!(
        "import signal,socket,time\n\
         signal.signal(signal.SIGINT,signal.default_int_handler)\n\
         p=socket.socket(socket.AF_PACKET,socket.SOCK_RAW,socket.htons(0x86dd))\n\
         p.bind(('eth0',0))\n\
         p.settimeout(0.1)\n\
         me=bytes.fromhex('{own}')\n\
         allnodes=bytes.fromhex('ff020000000000000000000000000001')\n\
         def csum(src,dst,msg):\n\
         \x20d=src+dst+len(msg).to_bytes(4,'big')+bytes([0,0,0,58])+msg\n\
         \x20s=sum(int.from_bytes(d[i:i+2],'big') for i in range(0,len(d),2))\n\
         \x20while s>>16: s=(s&0xffff)+(s>>16)\n\
         \x20return (~s)&0xffff\n\
         print('ready',flush=True)\n\
         end=time.monotonic()+{duration}\n\
         n=0\n\
         try:\n\
         \x20while time.monotonic()<end and n<{max}:\n\
         \x20 try: f,addr=p.recvfrom(256)\n\
         \x20 except socket.timeout: continue\n\
         \x20 if addr[2]==socket.PACKET_OUTGOING or len(f)<78 or f[20]!=58 or f[54]!=135 or f[6:12]==me: continue\n\
         \x20 target=f[62:78]\n\
         \x20 icmp=bytearray([136,0,0,0,0x20,0,0,0])+target+bytes([2,1])+me\n\
         \x20 c=csum(target,allnodes,bytes(icmp)); icmp[2]=c>>8; icmp[3]=c&0xff\n\
         \x20 ip=bytes([0x60,0,0,0,0,len(icmp),58,255])+target+allnodes\n\
         \x20 p.send(bytes.fromhex('333300000001')+me+bytes([0x86,0xdd])+ip+bytes(icmp))\n\
         \x20 n+=1\n\
         except KeyboardInterrupt:\n\
         \x20pass\n\
         print(n)\n",
        own = hex(&own),
        duration = duration.as_secs_f64(),
    );
    Attacker::start(ns, &script, duration)
}
