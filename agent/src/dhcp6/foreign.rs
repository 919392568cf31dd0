//! Other DHCPv6 servers on a dual-stack pool's network, found as the DHCPv4 side finds other
//! DHCP servers ([`crate::dhcp::foreign`], whose rules these are): a tenant's server with
//! preference 255 hands a booting VM an address of its own whenever it answers first.
//!
//! The DHCPv6 server's own packet socket does the work ([`super::server`]): its kernel filter
//! also passes datagrams to port 546 that reach the interface, and
//! - it **asks**: every probe interval it sends a SOLICIT ([`solicit`]) from the interface's own
//!   MAC and link-local address to `ff02::1:2`, which every server on the network answers (ours
//!   never does: the frame is its own interface's);
//! - it **judges** every ADVERTISE or REPLY that reaches it ([`judge`]): one whose Server
//!   Identifier is not the pool's DUID, from another MAC than the interface's, is a foreign
//!   server's, recorded in [`crate::suspects`] under the frame's source MAC as the IPv4 side's
//!   (`foreign_dhcp_server`: the IPPool condition, event, metric and alert follow).
//!
//! Received bytes are read by hand, bounded by the datagram: the message type and the options'
//! type-length framing, nothing else.

use std::net::Ipv6Addr;

use vmdhcp_core::MacAddr;

use super::frame::Udp6;

/// DHCPv6 message types a server sends to a client.
const ADVERTISE: u8 = 2;
const REPLY: u8 = 7;
/// Option codes read or written here.
const OPTION_CLIENTID: u16 = 1;
const OPTION_SERVERID: u16 = 2;
const OPTION_IA_NA: u16 = 3;
const OPTION_ELAPSED_TIME: u16 = 8;
/// Most bytes of a foreign server's DUID shown in a report.
const MAX_DUID_SHOWN: usize = 20;

/// A foreign DHCPv6 server seen on the network.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sighting {
    /// The frame's Ethernet source: the server (or the relay in front of it).
    pub mac: MacAddr,
    /// Its IPv6 source address.
    pub source: Ipv6Addr,
    /// What it sent, for the report.
    pub detail: String,
}

/// The SOLICIT the probe sends, with transaction id `xid`: from the DUID-LL of the
/// interface's MAC, one IA_NA, so that every stateful server on the network answers it.
pub fn solicit(own: MacAddr, xid: [u8; 3]) -> Vec<u8> {
    let mut m = vec![1, xid[0], xid[1], xid[2]];
    let mut duid = vec![0, 3, 0, 1];
    duid.extend_from_slice(&own.0);
    push(&mut m, OPTION_CLIENTID, &duid);
    push(&mut m, OPTION_ELAPSED_TIME, &[0, 0]);
    push(&mut m, OPTION_IA_NA, &[0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
    m
}

fn push(out: &mut Vec<u8>, code: u16, value: &[u8]) {
    out.extend_from_slice(&code.to_be_bytes());
    out.extend_from_slice(&u16::try_from(value.len()).unwrap_or(u16::MAX).to_be_bytes());
    out.extend_from_slice(value);
}

/// The Server Identifier of a server's message, when it has one and its options are framed
/// consistently.
fn server_id(payload: &[u8]) -> Option<&[u8]> {
    let mut options = payload.get(4..)?;
    while !options.is_empty() {
        let code = u16::from_be_bytes([*options.first()?, *options.get(1)?]);
        let len = usize::from(u16::from_be_bytes([*options.get(2)?, *options.get(3)?]));
        let value = options.get(4..4 + len)?;
        if code == OPTION_SERVERID {
            return Some(value);
        }
        options = options.get(4 + len..)?;
    }
    None
}

/// Whether a datagram to port 546 shows a foreign server: an ADVERTISE or REPLY whose Server
/// Identifier is not `duid`, the pool's, in a frame from another MAC than `own`.
pub fn judge(datagram: &Udp6<'_>, own: MacAddr, duid: &[u8]) -> Option<Sighting> {
    if datagram.source_mac == own {
        return None;
    }
    let kind = *datagram.payload.first()?;
    if kind != ADVERTISE && kind != REPLY {
        return None;
    }
    let id = server_id(datagram.payload)?;
    if id == duid {
        return None;
    }
    let shown: String = id
        .iter()
        .take(MAX_DUID_SHOWN)
        .map(|b| format!("{b:02x}"))
        .collect();
    let kind = if kind == ADVERTISE {
        "ADVERTISE"
    } else {
        "REPLY"
    };
    Some(Sighting {
        mac: datagram.source_mac,
        source: datagram.source,
        detail: format!(
            "DHCPv6 {kind} from {} with server DUID {shown}",
            datagram.source
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWN: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xaa]);
    const ROGUE: MacAddr = MacAddr([2, 0, 0, 0, 0, 0x66]);

    fn from(mac: MacAddr, payload: &[u8]) -> Udp6<'_> {
        Udp6 {
            source_mac: mac,
            source: "fe80::66".parse().unwrap(),
            destination: "fe80::aa".parse().unwrap(),
            source_port: 547,
            destination_port: 546,
            payload,
        }
    }

    fn message(kind: u8, server: Option<&[u8]>) -> Vec<u8> {
        let mut m = vec![kind, 1, 2, 3];
        push(&mut m, OPTION_CLIENTID, &[0, 3, 0, 1, 2, 0, 0, 0, 0, 0xaa]);
        if let Some(id) = server {
            push(&mut m, OPTION_SERVERID, id);
        }
        m
    }

    #[test]
    fn another_server_s_advertise_or_reply_is_a_sighting_ours_and_the_rest_are_not() {
        let ours = [0, 4, 1, 2, 3];
        let theirs = [0, 1, 0, 1, 9, 9, 9, 9, 2, 0, 0, 0, 0, 0x66];
        for kind in [ADVERTISE, REPLY] {
            let m = message(kind, Some(&theirs));
            let seen = judge(&from(ROGUE, &m), OWN, &ours).unwrap();
            assert_eq!(seen.mac, ROGUE);
            assert!(seen.detail.contains("fe80::66"), "{}", seen.detail);
            assert!(seen.detail.contains("000100010909"), "{}", seen.detail);
        }
        // Our own DUID, our own MAC, no Server Identifier, a client's message: nothing.
        assert_eq!(
            judge(&from(ROGUE, &message(REPLY, Some(&ours))), OWN, &ours),
            None
        );
        assert_eq!(
            judge(&from(OWN, &message(REPLY, Some(&theirs))), OWN, &ours),
            None
        );
        assert_eq!(judge(&from(ROGUE, &message(REPLY, None)), OWN, &ours), None);
        assert_eq!(
            judge(&from(ROGUE, &message(1, Some(&theirs))), OWN, &ours),
            None
        );
        // Broken framing: nothing, and no panic on any cut.
        let m = message(ADVERTISE, Some(&theirs));
        for cut in 0..m.len() {
            assert_eq!(judge(&from(ROGUE, &m[..cut]), OWN, &ours), None, "{cut}");
        }
    }

    #[test]
    fn the_probe_solicits_from_the_interface_s_own_duid_ll() {
        let m = solicit(OWN, [7, 8, 9]);
        assert_eq!(&m[..4], &[1, 7, 8, 9]);
        // A SOLICIT carries no Server Identifier, and its Client Identifier names our MAC.
        assert_eq!(server_id(&m), None);
        let client = &m[4..4 + 4 + 10];
        assert_eq!(&client[..4], &[0, 1, 0, 10]);
        assert_eq!(&client[8..], &OWN.0);
    }
}
