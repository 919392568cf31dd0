//! The datagram as it arrives: the checks `dhcproto` is lenient about, and the options it may
//! decode. Everything after this works on a [`Sanitized`] packet, never on the raw bytes.

use vmdhcp_core::MacAddr;

use super::DropReason;
use super::boot::Netboot;

/// Largest datagram accepted: an Ethernet MTU's worth. Larger ones are dropped as oversized.
pub const MAX_PACKET: usize = 1500;
/// Fixed BOOTP header plus the magic cookie; options start here.
pub(super) const OPTIONS_START: usize = 240;
const MAGIC_COOKIE: [u8; 4] = [99, 130, 83, 99];
/// Option 145, Forcerenew Nonce Capable (RFC 6704 §4): the algorithms the client takes.
const FORCERENEW_NONCE_CAPABLE: u8 = 145;
/// Algorithm 1 of RFC 3118's registry, HMAC-MD5: the one RFC 6704 defines.
const HMAC_MD5: u8 = 1;
/// Where `chaddr`, the client hardware address, sits in the BOOTP header (RFC 2131 §2).
const CHADDR: std::ops::Range<usize> = 28..34;

/// A datagram that passed [`sanitize`], split into what the later steps read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Sanitized {
    /// The packet with only the options the state logic reads, safe to give to `dhcproto`.
    pub packet: Vec<u8>,
    /// Option 82 (relay agent information), raw, to be echoed verbatim (RFC 3046 §2.2).
    pub relay_info: Vec<u8>,
    /// The client hardware address: Ethernet, as the header check guarantees.
    pub chaddr: MacAddr,
    /// What the client says about booting from the network.
    pub netboot: Netboot,
    /// The client takes a reconfigure key for HMAC-MD5 FORCERENEW (option 145 lists algorithm 1,
    /// RFC 6704 §4): its ACK carries one.
    pub forcerenew_nonce: bool,
}

/// Checks what `dhcproto` is lenient about (header fields, the cookie, option framing, the
/// lengths of the options the state logic reads) and returns the packet with only those options
/// kept. `dhcproto` decodes every option it knows and some of its decoders assume well-formed
/// input (a classless-route option with a prefix over 32 panics), so it never sees the others.
pub(super) fn sanitize(packet: &[u8]) -> Result<Sanitized, DropReason> {
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
    // Ethernet (checked above): `chaddr` holds a MAC, and the header is all there.
    let chaddr = <[u8; 6]>::try_from(&packet[CHADDR]).map_err(|_| DropReason::Truncated)?;
    let mut kept = Vec::with_capacity(packet.len());
    kept.extend_from_slice(&packet[..OPTIONS_START]);
    // Option 82 (relay agent information) is echoed verbatim, never interpreted (RFC 3046 §2.2).
    let mut relay_info = Vec::new();
    let mut netboot = Netboot::default();
    let mut forcerenew_nonce = false;
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
                    None if code == FORCERENEW_NONCE_CAPABLE => {
                        forcerenew_nonce |= packet[at + 2..end].contains(&HMAC_MD5);
                    }
                    None => netboot.read(code, &packet[at + 2..end]),
                }
                at = end;
            }
        }
    }
    kept.push(255);
    Ok(Sanitized {
        packet: kept,
        relay_info,
        chaddr: MacAddr(chaddr),
        netboot,
        forcerenew_nonce,
    })
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::sanitize;

    #[test]
    fn sanitize_returns_chaddr_and_relay_info_and_keeps_only_read_options() {
        let mut b = request(MessageType::Discover, KNOWN).to_vec().unwrap();
        b.truncate(OPTIONS_START);
        let option82 = [82u8, 4, 1, 2, 0x00, 0x07];
        b.extend_from_slice(&option82);
        b.extend_from_slice(&[121, 5, 40, 10, 0, 0, 0]);
        b.extend_from_slice(&[53, 1, 1, 255]);
        let s = sanitize(&b).unwrap();
        assert_eq!(s.chaddr, MacAddr(KNOWN));
        assert_eq!(s.relay_info, option82);
        assert_eq!(s.packet[..OPTIONS_START], b[..OPTIONS_START]);
        assert_eq!(s.packet[OPTIONS_START..], [53, 1, 1, 255]);
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
        // A tenant's FORCERENEW, signed or not, moves nothing here: servers send it, never heed it.
        let mut forcerenew = request(MessageType::ForceRenew, KNOWN);
        forcerenew
            .opts_mut()
            .insert(DhcpOption::Unknown(dhcproto::v4::UnknownOption::new(
                OptionCode::from(90),
                vec![
                    3, 1, 0, 0, 0, 0, 0, 0, 0, 0, 9, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                    0, 0,
                ],
            )));
        check(&forcerenew.to_vec().unwrap(), DropReason::NotClientMessage);
        forcerenew.set_opcode(Opcode::BootReply);
        check(&forcerenew.to_vec().unwrap(), DropReason::NotBootRequest);
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
}
