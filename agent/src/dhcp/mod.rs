//! The DHCPv4 server: what to answer ([`handler`], pure functions: the datagram checked, the
//! RFC 2131 decision, the reply encoded), how
//! packets are counted ([`counters`]), NTP host names resolved off the packet path ([`ntp`]),
//! and the sockets, one per interface ([`server`]), with the neighbour entries they pin
//! (`pins`); and other DHCP servers on a pool's network,
//! found by listening and by probing ([`foreign`]), which the server never answers; and
//! FORCERENEW, which brings a changed pool to the clients that took a reconfigure key
//! ([`forcerenew`]).
//!
//! It reads the [`crate::lease_table::LeaseTable`] and writes to it only to withhold declined
//! addresses, once [`probe`] has checked them with an ARP probe; it never configures
//! interfaces' addresses.

pub mod counters;
pub mod forcerenew;
pub mod foreign;
pub mod handler;
pub mod ntp;
mod pins;
pub mod probe;
pub mod server;

/// Port servers listen on and relays are answered on (RFC 2131 §4.1).
pub const SERVER_PORT: u16 = 67;
/// Port clients listen on.
pub const CLIENT_PORT: u16 = 68;
