//! The neighbour entries one interface's DHCPv4 server pins for the clients it answers by
//! unicast, so that a tenant's forged ARP cannot redirect another VM's reply.

use std::collections::HashMap;
use std::io;
use std::net::Ipv4Addr;

use tracing::warn;
use vmdhcp_core::MacAddr;

/// Most addresses one interface's server remembers as pinned to their client's MAC; past it the
/// record starts over (which costs one netlink request per renewing client, once).
const MAX_PINNED: usize = 65_536;

/// The neighbour entries this interface's server has pinned (address → the client's MAC), so
/// that a unicast reply reaches the client and not whoever forged ARP for its address last
/// ([`crate::netlink::pin_neighbour`]). Each address is pinned once per MAC while the socket
/// serves; without the capability to pin, the replies follow ARP as before and no more is tried.
#[derive(Default)]
pub(super) struct Pins {
    pinned: HashMap<Ipv4Addr, MacAddr>,
    refused: bool,
}

impl Pins {
    /// Pins `ip` to `mac` on the interface `index`, unless it already is (or pinning was
    /// refused).
    pub(super) fn pin(&mut self, index: u32, ip: Ipv4Addr, mac: MacAddr) {
        if self.refused || self.pinned.get(&ip) == Some(&mac) {
            return;
        }
        match crate::netlink::pin_neighbour(index, ip, mac) {
            Ok(()) => {
                if self.pinned.len() >= MAX_PINNED {
                    self.pinned.clear();
                }
                self.pinned.insert(ip, mac);
            }
            Err(error) => {
                self.refused = error.kind() == io::ErrorKind::PermissionDenied;
                warn!(%ip, %mac, %error, "neighbour entry not pinned: unicast replies follow ARP");
            }
        }
    }
}
