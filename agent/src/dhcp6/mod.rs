//! The DHCPv6 server (RFC 8415, stateful IA_NA) of a dual-stack pool: what to answer
//! ([`handler`], a pure function of the datagram, who sent it and the pool's leases), the frames
//! it reads and sends ([`frame`]), other DHCPv6 servers on the network ([`foreign`]), the
//! RECONFIGURE that brings a changed pool to the clients that took a reconfigure key
//! ([`reconfigure`]) and the sockets, one set per interface ([`server`]).
//!
//! It reads the [`crate::lease_table::LeaseTable`] (each MAC's IPv6 reservation, and the
//! addresses withheld) and writes only what its Neighbor Solicitation probes find: an address
//! withheld after a DECLINE another host's answer confirms, and the verdicts for the controller
//! ([`crate::findings`]: conflicts, and recorded conflicts found free again). It never
//! configures interfaces' addresses.

pub mod foreign;
pub mod frame;
pub mod handler;
pub mod probe;
pub mod reconfigure;
pub mod server;

/// Port servers and relays listen on (RFC 8415 §7.2).
pub const SERVER_PORT: u16 = 547;
/// Port clients listen on.
pub const CLIENT_PORT: u16 = 546;
/// All_DHCP_Relay_Agents_and_Servers (RFC 8415 §7.1): where clients send.
pub const ALL_SERVERS: std::net::Ipv6Addr = std::net::Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 1, 2);
