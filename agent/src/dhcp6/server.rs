//! The DHCPv6 sockets of one interface, each interface served by its own thread, supervised by
//! its own task, so that one interface's failure is reported and retried without touching the
//! others (or the DHCPv4 server beside it).
//!
//! Two sockets per interface:
//! - a packet socket (`AF_PACKET`, CAP_NET_RAW) that receives the frames of UDP port 547, with a
//!   kernel filter that passes nothing else: only the frame tells the client's MAC, which keys
//!   its reservation (DHCPv6 carries none of its own);
//! - a UDP socket on `[::]:547` bound to the device, joined to `ff02::1:2` so that the interface
//!   (and an MLD-snooping bridge) passes the clients' multicast, and that sends the replies to a
//!   client's link-local address; the kernel picks the source: the interface's link-local
//!   address, or while that is still tentative (the first second or two of a pod's interface)
//!   the pool's IPv6 server address, which is added without duplicate address detection. What it receives itself is dropped by a filter.
//!
//! This is the only part of the DHCPv6 server that does I/O; what to answer is
//! [`super::handler`]'s.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use socket2::{Domain, Protocol, SockFilter, Socket, Type};
use tokio::sync::watch;
use tracing::{debug, info, info_span, warn};
use vmdhcp_core::pool::duid::server_duid;
use vmdhcp_core::{MacAddr, NamespacedName};

use super::handler::{DropReason, MAX_PACKET, Outcome, Received, Server, Silence, handle};
use super::{ALL_SERVERS, CLIENT_PORT, SERVER_PORT};
use crate::capability::{Capability, Missing};
use crate::lease_table::LeaseTable;
use crate::supervisor::{Attempt, Served, Supervisor};

/// Why an interface's DHCPv6 server is not serving.
#[derive(Debug, thiserror::Error)]
pub enum Server6Error {
    /// A socket could not be created, configured or bound.
    #[error("interface {interface}: DHCPv6: cannot {step}: {source}{missing}")]
    Socket {
        /// The interface.
        interface: String,
        /// What was being done.
        step: &'static str,
        /// The OS error.
        source: io::Error,
        /// The capability the step lacked, when the kernel refused it for that.
        missing: Missing,
    },
    /// The interface's server thread ended abnormally.
    #[error("interface {interface}: DHCPv6 server thread failed: {source}")]
    Crashed {
        /// The interface.
        interface: String,
        /// What the runtime reported (a panic, or cancellation at shutdown).
        source: tokio::task::JoinError,
    },
    /// The interface does not exist (yet) in this network namespace.
    #[error("interface {interface}: DHCPv6: no such interface")]
    NoInterface {
        /// The interface.
        interface: String,
    },
    /// Receiving failed; the sockets are re-created.
    #[error("interface {interface}: DHCPv6: receive failed: {source}")]
    Receive {
        /// The interface.
        interface: String,
        /// The OS error.
        source: io::Error,
    },
}

/// What one interface's DHCPv6 server did, for `/metrics`.
#[derive(Debug, Default)]
pub struct Counters6 {
    /// Datagrams received on port 547.
    pub received: AtomicU64,
    /// Replies sent, by message type (ADVERTISE, REPLY).
    pub advertised: AtomicU64,
    /// REPLY messages sent.
    pub replied: AtomicU64,
    /// Replies the kernel refused to send.
    pub send_failed: AtomicU64,
    /// Datagrams dropped, by [`DropReason`] (in [`DropReason::ALL`]'s order).
    pub dropped: [AtomicU64; DropReason::ALL.len()],
    /// Messages not answered on purpose (unknown clients, other servers' renewals, …).
    pub silent: AtomicU64,
    /// DECLINEs of a reserved address, by what the Neighbor Solicitation probe found:
    /// another host answered (the address is withheld), nobody did (nothing changes), or no
    /// probe was sent (too many in flight, or the socket failed).
    pub declines_confirmed: AtomicU64,
    /// See [`Counters6::declines_confirmed`].
    pub declines_unconfirmed: AtomicU64,
    /// See [`Counters6::declines_confirmed`].
    pub declines_not_probed: AtomicU64,
}

impl Counters6 {
    fn count_drop(&self, reason: DropReason) {
        if let Some(i) = DropReason::ALL.iter().position(|r| *r == reason) {
            self.dropped[i].fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// An interface serving a dual-stack pool's IPv6 side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface6 {
    /// The Linux interface name.
    pub name: String,
    /// The pool served on it.
    pub pool: NamespacedName,
}

impl Served for Interface6 {
    fn name(&self) -> &str {
        &self.name
    }

    fn pool(&self) -> &NamespacedName {
        &self.pool
    }
}

/// The running DHCPv6 servers, one per interface, started and stopped beside the DHCPv4 ones
/// ([`Supervisor`]).
pub struct Servers6 {
    table: Arc<LeaseTable>,
    supervisor: Supervisor<Interface6, Counters6>,
    errors_tx: Arc<watch::Sender<BTreeMap<String, String>>>,
}

impl Servers6 {
    /// No servers yet.
    pub fn new(table: Arc<LeaseTable>) -> Self {
        Servers6 {
            table,
            supervisor: Supervisor::default(),
            errors_tx: Arc::new(watch::channel(BTreeMap::new()).0),
        }
    }

    /// Starts serving DHCPv6 on `interface` (in the background, retried with backoff). Starting
    /// one that runs for the same pool does nothing.
    pub fn start(&mut self, interface: Interface6) {
        let span = info_span!("dhcp6", interface = %interface.name, pool = %interface.pool);
        let (table, errors) = (Arc::clone(&self.table), Arc::clone(&self.errors_tx));
        let failed = Arc::clone(&self.errors_tx);
        let served = interface.clone();
        self.supervisor.start(
            interface,
            span,
            move |attempt| {
                let (Interface6 { name, pool }, table, errors) =
                    (served.clone(), Arc::clone(&table), Arc::clone(&errors));
                async move {
                    let thread_name = name.clone();
                    tokio::task::spawn_blocking(move || {
                        serve(&thread_name, &pool, &table, &attempt, &errors)
                    })
                    .await
                    .unwrap_or_else(|join| {
                        Err(Server6Error::Crashed {
                            interface: name,
                            source: join,
                        })
                    })
                }
            },
            move |name, error| {
                failed.send_modify(|all| {
                    all.insert(name.to_owned(), error);
                })
            },
        );
    }

    /// Stops serving on `name` and waits until its sockets are closed (at most one receive
    /// timeout).
    pub async fn stop(&mut self, name: &str) {
        if self.supervisor.stop(name).await {
            self.errors_tx
                .send_if_modified(|all| all.remove(name).is_some());
        }
    }

    /// Stops every interface.
    pub async fn stop_all(&mut self) {
        for name in self.supervisor.stop_all().await {
            self.errors_tx
                .send_if_modified(|all| all.remove(&name).is_some());
        }
    }

    /// The interfaces running now.
    pub fn running(&self) -> impl Iterator<Item = &Interface6> {
        self.supervisor.running()
    }

    /// Each running interface with its counters.
    pub fn counters(&self) -> watch::Receiver<Vec<(Interface6, Arc<Counters6>)>> {
        self.supervisor.counters()
    }

    /// The last error of each interface that is not serving DHCPv6 (cleared once it serves).
    pub fn errors(&self) -> watch::Receiver<BTreeMap<String, String>> {
        self.errors_tx.subscribe()
    }
}

/// How long a receive waits before looking at the stop switch.
const RECEIVE_TIMEOUT: Duration = Duration::from_millis(250);

/// Serves until `stop`; returns an error when a socket cannot be set up or fails.
fn serve(
    name: &str,
    pool: &NamespacedName,
    table: &Arc<LeaseTable>,
    attempt: &Attempt<Counters6>,
    errors: &watch::Sender<BTreeMap<String, String>>,
) -> Result<(), Server6Error> {
    let (counters, stop) = (&attempt.counters, &attempt.stop);
    let (index, own) = crate::arp::link(name).map_err(|_| Server6Error::NoInterface {
        interface: name.to_owned(),
    })?;
    let sockets = Sockets::open(name, index)?;
    errors.send_if_modified(|all| all.remove(name).is_some());
    attempt.serving();
    info!(interface = %name, %pool, "DHCPv6 serving on [::]:547 (ff02::1:2)");
    let duid = server_duid(pool);
    let probes = Arc::new(AtomicUsize::new(0));
    let mut frame = vec![0u8; FRAME_BUFFER];
    while !*stop.borrow() {
        let len = match (&sockets.packet).read(&mut frame) {
            Ok(len) => len,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => {
                return Err(Server6Error::Receive {
                    interface: name.to_owned(),
                    source,
                });
            }
        };
        let Some(udp) = frame.get(..len).and_then(parse_frame) else {
            continue;
        };
        counters.received.fetch_add(1, Ordering::Relaxed);
        let Some(snapshot) = table.pool(pool) else {
            debug!("no config for this pool yet; DHCPv6 message ignored");
            continue;
        };
        let span = transaction_span(name, pool);
        let _in_span = span.enter();
        let outcome = handle(
            Received {
                payload: udp.payload,
                link_source: Some(udp.source_mac),
                multicast: udp.destination.is_multicast(),
            },
            Server {
                duid: &duid,
                own_mac: Some(own),
                withheld: &|ip| table.is_withheld6(pool, ip),
            },
            &snapshot,
        );
        match outcome {
            Outcome::Answer {
                bytes,
                kind,
                to_relay,
                also,
                mac,
            } => {
                let port = if to_relay { SERVER_PORT } else { CLIENT_PORT };
                let scope = if is_link_local(&udp.source) { index } else { 0 };
                let to = SocketAddrV6::new(udp.source, port, 0, scope);
                match sockets.udp.send_to(&bytes, &SocketAddr::V6(to).into()) {
                    Ok(_) => {
                        let counter = if kind == dhcproto::v6::MessageType::Advertise {
                            &counters.advertised
                        } else {
                            &counters.replied
                        };
                        counter.fetch_add(1, Ordering::Relaxed);
                        debug!(?kind, peer = %udp.source, mac = ?mac, "DHCPv6 answered");
                    }
                    Err(error) => {
                        counters.send_failed.fetch_add(1, Ordering::Relaxed);
                        warn!(peer = %udp.source, %error, "DHCPv6 reply not sent");
                    }
                }
                record(&span, &format!("{kind:?}"), mac);
                if let Some(Silence::Declined(addr)) = also {
                    verify_decline(name, pool, addr, table, counters, &probes);
                }
            }
            Outcome::Silent(why) => {
                record(&span, why.as_str(), None);
                counters.silent.fetch_add(1, Ordering::Relaxed);
                debug!(peer = %udp.source, why = why.as_str(), "DHCPv6 message not answered");
            }
            Outcome::Dropped(reason) => {
                record(&span, reason.as_str(), None);
                counters.count_drop(reason);
                debug!(peer = %udp.source, reason = reason.as_str(), "DHCPv6 datagram dropped");
            }
        }
    }
    Ok(())
}

/// One span per DHCPv6 exchange, only while traces are exported (the packet path pays nothing
/// otherwise), as the DHCPv4 server's `dhcp.transaction`: a root of its own.
fn transaction_span(interface: &str, pool: &NamespacedName) -> tracing::Span {
    if vmdhcp_telemetry::trace::enabled() {
        info_span!(
            parent: None,
            "dhcp6.transaction",
            interface,
            pool = %pool,
            mac = tracing::field::Empty,
            result = tracing::field::Empty,
        )
    } else {
        tracing::Span::none()
    }
}

/// Records what became of an exchange in its span: the answer's type, or why there was none.
fn record(span: &tracing::Span, result: &str, mac: Option<MacAddr>) {
    if span.is_none() {
        return;
    }
    span.record("result", result);
    if let Some(mac) = mac {
        span.record("mac", tracing::field::display(mac));
    }
}

/// Most Neighbor Solicitation probes of declined addresses in flight per interface; more
/// DECLINEs meanwhile are counted and change nothing.
const MAX_DECLINE_PROBES: usize = 4;
/// How long a probe listens for an advertisement of the declined address.
const DECLINE_PROBE_WAIT: Duration = Duration::from_secs(1);
/// How long a declined address that another host answered for is withheld.
const DECLINE_HOLD: Duration = Duration::from_secs(60);

/// A DECLINE costs nothing until checked: a Neighbor Solicitation for the address, in the
/// background; only if another host answers is the address withheld (for [`DECLINE_HOLD`]). A
/// tenant forging DECLINEs in a VM's name can make the agent probe, not withhold.
fn verify_decline(
    interface: &str,
    pool: &NamespacedName,
    addr: Ipv6Addr,
    table: &Arc<LeaseTable>,
    counters: &Arc<Counters6>,
    in_flight: &Arc<AtomicUsize>,
) {
    if in_flight.fetch_add(1, Ordering::AcqRel) >= MAX_DECLINE_PROBES {
        in_flight.fetch_sub(1, Ordering::AcqRel);
        counters.declines_not_probed.fetch_add(1, Ordering::Relaxed);
        warn!(%addr, "IPv6 address declined; too many probes in flight, not checked");
        return;
    }
    let (interface, pool) = (interface.to_owned(), pool.clone());
    let (table, counters, in_flight) = (
        Arc::clone(table),
        Arc::clone(counters),
        Arc::clone(in_flight),
    );
    std::thread::spawn(move || {
        match crate::arp::probe6(&interface, addr, DECLINE_PROBE_WAIT) {
            Ok(Some(host)) => {
                counters.declines_confirmed.fetch_add(1, Ordering::Relaxed);
                let withheld = table.withhold6(&pool, addr, DECLINE_HOLD);
                warn!(%addr, %host, withheld, "IPv6 address declined, and another host answers for it");
            }
            Ok(None) => {
                counters
                    .declines_unconfirmed
                    .fetch_add(1, Ordering::Relaxed);
                info!(%addr, "IPv6 address declined, but no host answers for it: still served");
            }
            Err(error) => {
                counters.declines_not_probed.fetch_add(1, Ordering::Relaxed);
                warn!(%addr, %error, "IPv6 address declined; it could not be checked");
            }
        }
        in_flight.fetch_sub(1, Ordering::AcqRel);
    });
}

/// The sockets of one interface.
struct Sockets {
    packet: Socket,
    udp: Socket,
}

/// Room for a frame: the largest accepted datagram plus Ethernet, IPv6 and UDP headers.
const FRAME_BUFFER: usize = MAX_PACKET + 1 + ETHERNET + IPV6 + UDP;
const ETHERNET: usize = 14;
const IPV6: usize = 40;
const UDP: usize = 8;
const ETH_P_IPV6: u16 = 0x86dd;
/// Classic BPF "return k" (k bytes of the packet kept; 0 drops it).
const RET_K: u16 = 0x06;

impl Sockets {
    fn open(interface: &str, index: u32) -> Result<Self, Server6Error> {
        let err = |step: &'static str, needs: Option<Capability>| {
            move |source: io::Error| Server6Error::Socket {
                interface: interface.to_owned(),
                step,
                missing: needs.map(|cap| cap.lacking(&source)).unwrap_or_default(),
                source,
            }
        };
        // The UDP socket first: it fails plainly when IPv6 is disabled in this namespace.
        let udp = Socket::new(Domain::IPV6, Type::DGRAM, Some(Protocol::UDP))
            .map_err(err("create a UDP/IPv6 socket", None))?;
        udp.set_only_v6(true)
            .map_err(err("set IPV6_V6ONLY", None))?;
        udp.set_reuse_address(true)
            .map_err(err("set SO_REUSEADDR", None))?;
        udp.bind_device(Some(interface.as_bytes())).map_err(err(
            "bind to the device (SO_BINDTODEVICE)",
            Some(Capability::NetRaw),
        ))?;
        udp.bind(
            &SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, SERVER_PORT, 0, 0)).into(),
        )
        .map_err(err("bind [::]:547", Some(Capability::NetBindService)))?;
        udp.join_multicast_v6(&ALL_SERVERS, index)
            .map_err(err("join ff02::1:2", None))?;
        udp.set_multicast_loop_v6(false)
            .map_err(err("set IPV6_MULTICAST_LOOP", None))?;
        // It only sends: the packet socket reads the same datagrams, and a copy queued here
        // would fill its buffer and be dropped, counted as losses, under load.
        udp.attach_filter(&[SockFilter::new(RET_K, 0, 0, 0)])
            .map_err(err("filter out what the UDP socket receives", None))?;
        udp.set_nonblocking(true)
            .map_err(err("set non-blocking", None))?;

        // The packet socket: no protocol until the filter is attached, so nothing unfiltered
        // is queued; then bound to IPv6 frames of this interface.
        let packet = Socket::new(Domain::PACKET, Type::RAW, None)
            .map_err(err("create a packet socket", Some(Capability::NetRaw)))?;
        packet
            .attach_filter(&udp547_filter())
            .map_err(err("attach the port-547 filter", None))?;
        let link = crate::arp::link_address(index, ETH_P_IPV6, [0; 6])
            .map_err(err("address the interface's link", None))?;
        packet.bind(&link).map_err(err(
            "bind the packet socket to the interface",
            Some(Capability::NetRaw),
        ))?;
        packet
            .set_read_timeout(Some(RECEIVE_TIMEOUT))
            .map_err(err("set a receive timeout", None))?;
        Ok(Sockets { packet, udp })
    }
}

/// A kernel filter passing only IPv6 frames carrying UDP to port 547 (no extension headers:
/// clients and relays send none).
fn udp547_filter() -> [SockFilter; 8] {
    const LD_H_ABS: u16 = 0x28;
    const LD_B_ABS: u16 = 0x30;
    const JEQ_K: u16 = 0x15;
    [
        SockFilter::new(LD_H_ABS, 0, 0, 12),
        SockFilter::new(JEQ_K, 0, 5, u32::from(ETH_P_IPV6)),
        SockFilter::new(LD_B_ABS, 0, 0, 20),
        SockFilter::new(JEQ_K, 0, 3, 17),
        SockFilter::new(LD_H_ABS, 0, 0, 56),
        SockFilter::new(JEQ_K, 0, 1, u32::from(SERVER_PORT)),
        SockFilter::new(RET_K, 0, 0, 0x0004_0000),
        SockFilter::new(RET_K, 0, 0, 0),
    ]
}

/// A UDP datagram to port 547 read from an Ethernet frame.
#[derive(Debug, PartialEq, Eq)]
struct Udp6<'a> {
    source_mac: MacAddr,
    source: Ipv6Addr,
    destination: Ipv6Addr,
    payload: &'a [u8],
}

/// The DHCPv6 datagram an Ethernet frame carries, when it carries one: IPv6, UDP (no extension
/// header), destination port 547, lengths consistent.
fn parse_frame(frame: &[u8]) -> Option<Udp6<'_>> {
    let eth = frame.get(..ETHERNET)?;
    if u16::from_be_bytes([eth[12], eth[13]]) != ETH_P_IPV6 {
        return None;
    }
    let ip = frame.get(ETHERNET..ETHERNET + IPV6)?;
    if ip[0] >> 4 != 6 || ip[6] != 17 {
        return None;
    }
    let payload_len = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
    let udp = frame.get(ETHERNET + IPV6..ETHERNET + IPV6 + payload_len)?;
    let header = udp.get(..UDP)?;
    if u16::from_be_bytes([header[2], header[3]]) != SERVER_PORT {
        return None;
    }
    let udp_len = usize::from(u16::from_be_bytes([header[4], header[5]]));
    let payload = udp.get(UDP..udp_len)?;
    let octets = |range: std::ops::Range<usize>| -> Option<Ipv6Addr> {
        let bytes: [u8; 16] = ip.get(range)?.try_into().ok()?;
        Some(Ipv6Addr::from(bytes))
    };
    let mut mac = [0u8; 6];
    mac.copy_from_slice(eth.get(6..12)?);
    Some(Udp6 {
        source_mac: MacAddr(mac),
        source: octets(8..24)?,
        destination: octets(24..40)?,
        payload,
    })
}

fn is_link_local(ip: &Ipv6Addr) -> bool {
    ip.segments()[0] & 0xffc0 == 0xfe80
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(next_header: u8, port: u16, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0x33, 0x33, 0, 1, 0, 2, 2, 0, 0, 0, 0, 1, 0x86, 0xdd];
        let udp_len = u16::try_from(UDP + payload.len()).unwrap();
        f.extend_from_slice(&[0x60, 0, 0, 0]);
        f.extend_from_slice(&udp_len.to_be_bytes());
        f.extend_from_slice(&[next_header, 1]);
        f.extend_from_slice(&"fe80::1".parse::<Ipv6Addr>().unwrap().octets());
        f.extend_from_slice(&ALL_SERVERS.octets());
        f.extend_from_slice(&546u16.to_be_bytes());
        f.extend_from_slice(&port.to_be_bytes());
        f.extend_from_slice(&udp_len.to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn a_frame_to_port_547_yields_its_datagram_and_the_sender_s_mac() {
        let f = frame(17, 547, b"hello");
        let udp = parse_frame(&f).unwrap();
        assert_eq!(udp.source_mac, MacAddr([2, 0, 0, 0, 0, 1]));
        assert_eq!(udp.source, "fe80::1".parse::<Ipv6Addr>().unwrap());
        assert!(udp.destination.is_multicast());
        assert_eq!(udp.payload, b"hello");
        assert!(is_link_local(&udp.source));
    }

    #[test]
    fn other_frames_and_broken_lengths_yield_nothing() {
        assert_eq!(parse_frame(&frame(6, 547, b"x")), None, "TCP");
        assert_eq!(parse_frame(&frame(17, 546, b"x")), None, "to a client");
        let mut cut = frame(17, 547, b"hello");
        cut.truncate(cut.len() - 2);
        assert_eq!(parse_frame(&cut), None);
        assert_eq!(parse_frame(&[0u8; 10]), None);
        let mut v4 = frame(17, 547, b"x");
        v4[12] = 0x08;
        v4[13] = 0x00;
        assert_eq!(parse_frame(&v4), None);
    }
}
