//! What the handler's tests share: one pool with one reservation, and requests to it.

pub(super) use std::net::{Ipv4Addr, SocketAddrV4};
pub(super) use std::sync::Arc;

pub(super) use dhcproto::v4::{DhcpOption, Flags, Message, MessageType, Opcode, OptionCode};
pub(super) use dhcproto::{Decodable, Encodable};
pub(super) use vmdhcp_core::MacAddr;
pub(super) use vmdhcp_core::fixtures::pool_config;
pub(super) use vmdhcp_core::pool::{Binding, DEFAULT_LEASE_SECONDS, PoolConfig};

pub(super) use super::wire::{MAX_PACKET, OPTIONS_START};
pub(super) use super::{Action, DropReason, Outcome, Silence, handle};
pub(super) use crate::lease_table::{LeaseTable, PoolSnapshot};
pub(super) use crate::pools::PoolLeases;

pub(super) const SERVER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
pub(super) const LEASED: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
pub(super) const KNOWN: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
pub(super) const STRANGER: [u8; 6] = [0x02, 0, 0, 0, 0, 0xff];

/// Pool `default/a`: server [`SERVER`] in 192.0.2.0/24, every option set (see
/// [`PoolConfig::with_options`]), one-hour leases.
pub(super) fn config() -> PoolConfig {
    pool_config("default/a")
        .with_options()
        .with_lease_seconds(3600)
}

pub(super) fn pool_with(config: PoolConfig) -> Arc<PoolSnapshot> {
    let table = LeaseTable::new();
    let name = config.pool.clone();
    table.apply_snapshot(&[PoolLeases {
        config,
        leases: [(MacAddr(KNOWN), Binding::ip(LEASED))].into(),
    }]);
    table.pool(&name).unwrap()
}

pub(super) fn pool() -> Arc<PoolSnapshot> {
    pool_with(config())
}

pub(super) fn request(kind: MessageType, mac: [u8; 6]) -> Message {
    let u = Ipv4Addr::UNSPECIFIED;
    let mut m = Message::new_with_id(0x1234_5678, u, u, u, u, &mac);
    m.opts_mut().insert(DhcpOption::MessageType(kind));
    m
}

pub(super) fn run(m: &Message) -> Outcome {
    handle(&m.to_vec().unwrap(), &pool(), |_| false)
}

pub(super) fn reply_of(outcome: &Outcome) -> (MessageType, SocketAddrV4, Message) {
    match &outcome.action {
        Action::Reply(r) => (r.kind, r.to, Message::from_bytes(&r.bytes).unwrap()),
        other => panic!("expected a reply, got {other:?}"),
    }
}

pub(super) fn broadcast() -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::BROADCAST, 68)
}
