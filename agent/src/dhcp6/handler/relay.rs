//! Relayed DHCPv6 (RFC 8415 §19): unwrapping a RELAY-FORW, checked hop by hop, and wrapping the
//! answer in RELAY-REPLY messages back down the same path.

use super::*;

/// A RELAY-FORW: unwrapped (nested relays too, up to [`HOP_COUNT_LIMIT`]), the innermost client
/// message decided with the MAC the relay saw, and the reply wrapped back in a RELAY-REPL for
/// each relay, each echoing its Interface-Id. dhcproto reads a relay's Relay Message option as
/// another relay message, so the framing is read and written here.
pub(super) fn relayed(
    payload: &[u8],
    server: Server<'_>,
    pool: &PoolSnapshot,
    config: &PoolConfigV6,
) -> Outcome {
    let mut layers = Vec::new();
    let mut inner = payload;
    loop {
        if inner.first() != Some(&u8::from(MessageType::RelayForw)) {
            break;
        }
        let Some(layer) = Relay::parse(inner) else {
            return Outcome::Dropped(DropReason::Malformed);
        };
        if layer.hop_count >= HOP_COUNT_LIMIT || layers.len() >= usize::from(HOP_COUNT_LIMIT) {
            return Outcome::Dropped(DropReason::TooManyHops);
        }
        inner = layer.message;
        layers.push(layer);
    }
    let Some(closest) = layers.last() else {
        return Outcome::Dropped(DropReason::Malformed);
    };
    let msg = match Message::decode(&mut Decoder::new(inner)) {
        Ok(msg) => msg,
        Err(_) => return Outcome::Dropped(DropReason::Malformed),
    };
    let who = Who {
        frame: None,
        relay: closest.client_mac,
    };
    // A relay forwards what clients multicast to it; its own unicast to us is the norm.
    let (reply, also, mac) = match decide(&msg, true, who, server, pool, config) {
        Decision::Reply(reply, also, mac) => (reply, also, mac),
        Decision::Silent(s) => return Outcome::Silent(s),
        Decision::Drop(r) => return Outcome::Dropped(r),
    };
    let kind = reply.msg_type();
    let Some(mut bytes) = encode(&reply) else {
        return Outcome::Dropped(DropReason::Malformed);
    };
    for layer in layers.iter().rev() {
        bytes = layer.wrap(&bytes);
    }
    Outcome::Answer {
        bytes,
        kind,
        to_relay: true,
        also,
        mac,
        key_slot: None,
    }
}

/// One RELAY-FORW layer, as read.
pub(super) struct Relay<'a> {
    pub(super) hop_count: u8,
    pub(super) link: [u8; 16],
    pub(super) peer: [u8; 16],
    pub(super) interface_id: Option<&'a [u8]>,
    pub(super) client_mac: Option<MacAddr>,
    pub(super) message: &'a [u8],
}

impl<'a> Relay<'a> {
    /// Reads the header and the options that matter; `None` when the framing is broken or
    /// there is no Relay Message.
    pub(super) fn parse(bytes: &'a [u8]) -> Option<Self> {
        let header = bytes.get(..RELAY_HEADER)?;
        let mut link = [0u8; 16];
        let mut peer = [0u8; 16];
        link.copy_from_slice(header.get(2..18)?);
        peer.copy_from_slice(header.get(18..34)?);
        let mut relay = Relay {
            hop_count: *header.get(1)?,
            link,
            peer,
            interface_id: None,
            client_mac: None,
            message: &[],
        };
        let mut message = None;
        let mut rest = bytes.get(RELAY_HEADER..)?;
        while !rest.is_empty() {
            let code = u16::from_be_bytes([*rest.first()?, *rest.get(1)?]);
            let len = usize::from(u16::from_be_bytes([*rest.get(2)?, *rest.get(3)?]));
            let value = rest.get(4..4 + len)?;
            match code {
                OPTION_RELAY_MSG => message = Some(value),
                OPTION_INTERFACE_ID => relay.interface_id = Some(value),
                // Link-layer type 1 (Ethernet), then the address (RFC 6939).
                OPTION_CLIENT_LINKLAYER_ADDR if len == 8 && value.get(..2) == Some(&[0, 1]) => {
                    let mut mac = [0u8; 6];
                    mac.copy_from_slice(value.get(2..8)?);
                    relay.client_mac = Some(MacAddr(mac));
                }
                _ => {}
            }
            rest = rest.get(4 + len..)?;
        }
        relay.message = message?;
        Some(relay)
    }

    /// `inner` in a RELAY-REPL for this layer: its hop count, link and peer addresses, and its
    /// Interface-Id echoed.
    pub(super) fn wrap(&self, inner: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(RELAY_HEADER + 8 + inner.len() + 32);
        out.push(u8::from(MessageType::RelayRepl));
        out.push(self.hop_count);
        out.extend_from_slice(&self.link);
        out.extend_from_slice(&self.peer);
        if let Some(id) = self.interface_id {
            push_option(&mut out, OPTION_INTERFACE_ID, id);
        }
        push_option(&mut out, OPTION_RELAY_MSG, inner);
        out
    }
}

pub(super) fn push_option(out: &mut Vec<u8>, code: u16, value: &[u8]) {
    // Values come from a datagram of at most MAX_PACKET bytes, or a reply built from one.
    let len = u16::try_from(value.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&code.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(value.get(..usize::from(len)).unwrap_or(value));
}
