//! Router Advertisements for the dual-stack pools that ask for them
//! (`ipv6Config.sendRouterAdvertisements`), off by default: the network's router normally sends
//! them, and an agent that is not asked to must not look like a router.
//!
//! DHCPv6 carries neither a prefix length nor a route, and many clients start DHCPv6 only when
//! an RA says so. An advertisement here sets the Managed and Other flags (clients ask DHCPv6 for
//! an address and options), announces the pool's prefix on-link without autonomous configuration
//! (no SLAAC address beside the reserved one), and a router lifetime only when the pool's
//! `router` is the server's own address: the agent never routes between networks, so it never
//! offers itself as a default router otherwise.
//!
//! Sent from the interface's link-local address with hop limit 255 (RFC 4861 §6.1.2), to all
//! nodes: a few at start, then periodically, and in answer to Router Solicitations (at most one
//! every [`MIN_DELAY_BETWEEN_RAS`]). This module owns the ICMPv6 sockets and the tasks, one per
//! interface, stopped with the interface's DHCPv6 server.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};
use std::time::{Duration, Instant};

use ipnet::Ipv6Net;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::sync::watch;
use tracing::{debug, info, info_span, warn};
use vmdhcp_core::mac::MacAddr;

/// What one interface advertises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Advertised {
    /// The pool's prefix, on-link.
    pub prefix: Ipv6Net,
    /// The router lifetime, in seconds (0: not a default router).
    pub router_lifetime: u16,
    /// The prefix's valid lifetime, in seconds.
    pub prefix_lifetime: u32,
}

impl Advertised {
    /// What a pool with subnet `prefix`, server `server` and router `router` advertises.
    pub fn of(prefix: Ipv6Net, server: Ipv6Addr, router: Option<Ipv6Addr>, lease: u32) -> Self {
        Advertised {
            prefix: prefix.trunc(),
            router_lifetime: if router == Some(server) {
                ROUTER_LIFETIME
            } else {
                0
            },
            prefix_lifetime: lease.max(MIN_PREFIX_LIFETIME),
        }
    }
}

/// Router lifetime advertised when the agent's own address is the pool's router (RFC 4861's
/// default, 3 × MaxRtrAdvInterval).
const ROUTER_LIFETIME: u16 = 1800;
/// The shortest prefix lifetime advertised, so that the prefix outlives a few lost RAs.
const MIN_PREFIX_LIFETIME: u32 = 1800;
/// Advertisements sent at start (RFC 4861 MAX_INITIAL_RTR_ADVERTISEMENTS), this far apart.
const INITIAL: u32 = 3;
const INITIAL_INTERVAL: Duration = Duration::from_secs(4);
/// Between two unsolicited advertisements afterwards.
const INTERVAL: Duration = Duration::from_secs(200);
/// Least time between two advertisements (RFC 4861 MIN_DELAY_BETWEEN_RAS).
pub const MIN_DELAY_BETWEEN_RAS: Duration = Duration::from_secs(3);
const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

/// The ICMPv6 Router Advertisement `advertised` makes, from `mac` (the kernel fills in the
/// checksum of a raw ICMPv6 socket's messages).
pub fn advertisement(mac: MacAddr, advertised: &Advertised) -> [u8; 56] {
    let mut ra = [0u8; 56];
    ra[0] = 134; // Router Advertisement
    ra[4] = 64; // Cur Hop Limit
    ra[5] = 0x80 | 0x40; // Managed, Other
    ra[6..8].copy_from_slice(&advertised.router_lifetime.to_be_bytes());
    // 8..16: reachable time and retransmit timer, unspecified.
    ra[16] = 1; // Source Link-Layer Address
    ra[17] = 1;
    ra[18..24].copy_from_slice(&mac.octets());
    ra[24] = 3; // Prefix Information
    ra[25] = 4;
    ra[26] = advertised.prefix.prefix_len();
    ra[27] = 0x80; // on-link; not autonomous
    ra[28..32].copy_from_slice(&advertised.prefix_lifetime.to_be_bytes());
    ra[32..36].copy_from_slice(&advertised.prefix_lifetime.to_be_bytes());
    // 36..40 reserved.
    ra[40..56].copy_from_slice(&advertised.prefix.network().octets());
    ra
}

/// Whether an ICMPv6 message is a Router Solicitation (RFC 4861 §4.1: type 133, code 0).
pub fn is_solicitation(icmp: &[u8]) -> bool {
    icmp.first() == Some(&133) && icmp.get(1) == Some(&0)
}

/// The advertisers, one task per interface.
#[derive(Default)]
pub struct Advertisers {
    running: BTreeMap<String, (Advertised, watch::Sender<bool>, tokio::task::JoinHandle<()>)>,
}

impl Advertisers {
    /// Starts advertising `advertised` on `interface` (restarting it if it advertised something
    /// else). Must be called inside a Tokio runtime.
    pub fn start(&mut self, interface: &str, advertised: Advertised) {
        if let Some((current, ..)) = self.running.get(interface) {
            if *current == advertised {
                return;
            }
            self.stop(interface);
        }
        let (stop, stopped) = watch::channel(false);
        let span = info_span!("router_advertisements", interface, prefix = %advertised.prefix);
        let name = interface.to_owned();
        let task = tokio::task::spawn_blocking(move || {
            span.in_scope(|| {
                if let Err(error) = advertise(&name, advertised, &stopped) {
                    warn!(%error, "router advertisements stopped");
                }
            })
        });
        self.running
            .insert(interface.to_owned(), (advertised, stop, task));
    }

    /// Stops advertising on `interface` (its thread sees it within a receive timeout).
    pub fn stop(&mut self, interface: &str) {
        if let Some((_, stop, _)) = self.running.remove(interface) {
            let _ = stop.send(true);
        }
    }

    /// Stops every interface (step-down, shutdown).
    pub fn stop_all(&mut self) {
        for (_, (_, stop, _)) in std::mem::take(&mut self.running) {
            let _ = stop.send(true);
        }
    }

    /// The interfaces advertising now.
    pub fn running(&self) -> impl Iterator<Item = &String> {
        self.running.keys()
    }
}

impl Drop for Advertisers {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// How long a receive waits before the stop switch and the schedule are looked at.
const RECEIVE_TIMEOUT: Duration = Duration::from_millis(250);

/// Advertises on `interface` until `stop`: the initial burst, the periodic ones, and answers to
/// solicitations. Blocking.
fn advertise(
    interface: &str,
    advertised: Advertised,
    stop: &watch::Receiver<bool>,
) -> io::Result<()> {
    let (index, mac) = crate::arp::link(interface).map_err(io::Error::other)?;
    let socket = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6))?;
    socket.bind_device(Some(interface.as_bytes()))?;
    socket.set_multicast_hops_v6(255)?;
    socket.set_unicast_hops_v6(255)?;
    socket.set_multicast_loop_v6(false)?;
    socket.set_read_timeout(Some(RECEIVE_TIMEOUT))?;
    let ra = advertisement(mac, &advertised);
    let to = SocketAddr::V6(SocketAddrV6::new(ALL_NODES, 0, 0, index)).into();
    info!(
        router_lifetime = advertised.router_lifetime,
        "sending router advertisements"
    );
    let (mut sent, mut last) = (0u32, None::<Instant>);
    let mut buf = [0u8; 1500];
    while !*stop.borrow() {
        let due = match last {
            None => true,
            Some(at) if sent < INITIAL => at.elapsed() >= INITIAL_INTERVAL,
            Some(at) => at.elapsed() >= INTERVAL,
        };
        if due {
            send(&socket, &ra, &to, &mut sent, &mut last);
        }
        match (&socket).read(&mut buf) {
            // A raw IPv6 socket delivers the ICMPv6 message without the IPv6 header.
            Ok(len) if is_solicitation(buf.get(..len).unwrap_or_default()) => {
                if last.is_none_or(|at| at.elapsed() >= MIN_DELAY_BETWEEN_RAS) {
                    debug!("router solicitation answered");
                    send(&socket, &ra, &to, &mut sent, &mut last);
                }
            }
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn send(
    socket: &Socket,
    ra: &[u8],
    to: &socket2::SockAddr,
    sent: &mut u32,
    last: &mut Option<Instant>,
) {
    match socket.send_to(ra, to) {
        Ok(_) => *sent += 1,
        // Not fatal: the link-local address may still be tentative; the next is due soon.
        Err(error) => debug!(%error, "router advertisement not sent"),
    }
    *last = Some(Instant::now());
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xaa]);

    #[test]
    fn an_advertisement_asks_for_dhcpv6_and_puts_the_prefix_on_link_without_slaac() {
        let prefix: Ipv6Net = "fd00:db8::7/112".parse().unwrap();
        let server: Ipv6Addr = "fd00:db8::2".parse().unwrap();
        let adv = Advertised::of(prefix, server, Some("fd00:db8::1".parse().unwrap()), 600);
        assert_eq!(adv.router_lifetime, 0, "the router is another host");
        assert_eq!(adv.prefix_lifetime, MIN_PREFIX_LIFETIME);
        let ra = advertisement(MAC, &adv);
        assert_eq!((ra[0], ra[1], ra[4], ra[5]), (134, 0, 64, 0xc0));
        assert_eq!(&ra[6..8], &[0, 0]);
        assert_eq!(&ra[16..24], &[1, 1, 2, 0, 0, 0, 0, 0xaa]);
        assert_eq!((ra[24], ra[25], ra[26], ra[27]), (3, 4, 112, 0x80));
        assert_eq!(
            &ra[40..56],
            &"fd00:db8::".parse::<Ipv6Addr>().unwrap().octets()
        );
        // Only when the router is the server itself does it advertise a router lifetime.
        let own = Advertised::of(prefix, server, Some(server), 86_400);
        assert_eq!(own.router_lifetime, ROUTER_LIFETIME);
        assert_eq!(own.prefix_lifetime, 86_400);
        assert_eq!(
            &advertisement(MAC, &own)[6..8],
            &ROUTER_LIFETIME.to_be_bytes()
        );
    }

    #[test]
    fn solicitations_are_told_from_other_icmpv6() {
        assert!(is_solicitation(&[133, 0, 0, 0]));
        assert!(!is_solicitation(&[134, 0, 0, 0]));
        assert!(!is_solicitation(&[133, 1]));
        assert!(!is_solicitation(&[]));
    }
}
