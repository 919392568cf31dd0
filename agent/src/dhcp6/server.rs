//! The DHCPv6 sockets of one interface, each interface served by its own thread, supervised by
//! its own task, so that one interface's failure is reported and retried without touching the
//! others (or the DHCPv4 server beside it).
//!
//! Two sockets per interface:
//! - a packet socket (`AF_PACKET`, CAP_NET_RAW) that receives the frames of UDP ports 547 (and
//!   546, other servers' answers: [`super::foreign`]), with a kernel filter that passes nothing
//!   else: only the frame tells the client's MAC, which keys its reservation (DHCPv6 carries
//!   none of its own); and that sends the replies, whole frames addressed to the MAC the
//!   request came from ([`super::frame`]: never through the kernel's neighbour table, which
//!   tenants can write);
//! - a UDP socket on `[::]:547` bound to the device, joined to `ff02::1:2` so that the interface
//!   (and an MLD-snooping bridge) passes the clients' multicast. It sends nothing, and what it
//!   receives itself is dropped by a filter.
//!
//! Beside serving, each interface checks the addresses clients decline, and those the controller
//! records as conflicted, with Neighbor Solicitations ([`super::probe`]).
//!
//! This is the part of the DHCPv6 server that serves; what to answer is [`super::handler`]'s.

use std::collections::BTreeMap;
use std::io;
use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockFilter, Socket, Type};
use tokio::sync::watch;
use tracing::{debug, info, info_span, warn};
use vmdhcp_core::pool::duid::server_duid;
use vmdhcp_core::{MacAddr, NamespacedName};

use super::foreign;
use super::frame::{self, Addressing, ETH_P_IPV6, ETHERNET, IPV6, Sources, UDP};
use super::handler::{DropReason, MAX_PACKET, Outcome, Received, Server, Silence, handle};
use super::probe::{Context, Declines, InFlight, Rechecks, recheck, verify_decline};
use super::reconfigure::{self, Keyed};
use super::{ALL_SERVERS, CLIENT_PORT, SERVER_PORT};
use crate::arp;
use crate::capability::{Capability, Missing};
use crate::lease_table::LeaseTable;
use crate::pacing::{self, Pacer};
use crate::reconfigure::Due;
use crate::supervisor::{Attempt, Served, Supervisor};
use crate::suspects::{SuspectKind, Suspects};

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
    /// RECONFIGUREs sent to clients holding a reconfigure key whose answer changed.
    pub reconfigures: AtomicU64,
    /// Datagrams dropped, by [`DropReason`] (in [`DropReason::ALL`]'s order).
    pub dropped: [AtomicU64; DropReason::ALL.len()],
    /// Messages not answered on purpose (unknown clients, other servers' renewals, …).
    pub silent: AtomicU64,
    /// DECLINEs of a reserved address, by what their check found.
    pub declines: Arc<Declines>,
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
    suspects: Option<Arc<Suspects>>,
    foreign: Foreign6,
    supervisor: Supervisor<Interface6, Counters6>,
    errors_tx: Arc<watch::Sender<BTreeMap<String, String>>>,
}

impl Servers6 {
    /// No servers yet.
    pub fn new(table: Arc<LeaseTable>) -> Self {
        Servers6 {
            table,
            suspects: None,
            foreign: Foreign6::default(),
            supervisor: Supervisor::default(),
            errors_tx: Arc::new(watch::channel(BTreeMap::new()).0),
        }
    }

    /// Servers that report to `suspects` the proxy-NDP responders their probes find and, as
    /// `foreign` says, the other DHCPv6 servers on their networks.
    pub fn reporting_to(mut self, suspects: Arc<Suspects>, foreign: Foreign6) -> Self {
        self.suspects = Some(suspects);
        self.foreign = foreign;
        self
    }

    /// Starts serving DHCPv6 on `interface` (in the background, retried with backoff). Starting
    /// one that runs for the same pool does nothing.
    pub fn start(&mut self, interface: Interface6) {
        let span = info_span!("dhcp6", interface = %interface.name, pool = %interface.pool);
        let (table, errors) = (Arc::clone(&self.table), Arc::clone(&self.errors_tx));
        let (suspects, foreign) = (self.suspects.clone(), self.foreign);
        let failed = Arc::clone(&self.errors_tx);
        let served = interface.clone();
        self.supervisor.start(
            interface,
            span,
            move |attempt| {
                let (Interface6 { name, pool }, table, errors, suspects) = (
                    served.clone(),
                    Arc::clone(&table),
                    Arc::clone(&errors),
                    suspects.clone(),
                );
                async move {
                    let thread_name = name.clone();
                    tokio::task::spawn_blocking(move || {
                        let watchers = Watchers {
                            errors,
                            suspects,
                            foreign,
                        };
                        serve(&thread_name, &pool, &table, &attempt, &watchers)
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

/// Where one interface's server says how it fares: its errors, and the hosts it suspects.
struct Watchers {
    errors: Arc<watch::Sender<BTreeMap<String, String>>>,
    suspects: Option<Arc<Suspects>>,
    foreign: Foreign6,
}

/// Whether and how often the DHCPv6 servers look for other DHCPv6 servers ([`super::foreign`]),
/// as the DHCPv4 side's detectors are set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Foreign6 {
    /// Whether answers of other servers are looked at (and reported) at all.
    pub enabled: bool,
    /// Time between two probe SOLICITs; `None`: listening only.
    pub probe_interval: Option<Duration>,
}

impl Foreign6 {
    fn probe_every(&self) -> Option<Duration> {
        self.probe_interval.filter(|_| self.enabled)
    }
}

impl Default for Foreign6 {
    fn default() -> Self {
        Foreign6 {
            enabled: true,
            probe_interval: Some(Duration::from_secs(30)),
        }
    }
}

/// Sends the probe SOLICIT ([`super::foreign::solicit`]) from the interface's link-local
/// address; returns whether it had a usable one to send from.
fn probe_servers(packet: &Socket, own: MacAddr, sources: &Sources) -> bool {
    let Some(from) = sources.link_local() else {
        return false;
    };
    let bits =
        std::hash::BuildHasher::build_hasher(&std::collections::hash_map::RandomState::new());
    let xid = std::hash::Hasher::finish(&bits).to_be_bytes();
    let addressing = Addressing {
        from_mac: own,
        to_mac: MacAddr([0x33, 0x33, 0, 1, 0, 2]),
        from,
        to: ALL_SERVERS,
        from_port: CLIENT_PORT,
        to_port: SERVER_PORT,
    };
    let mut out = Vec::new();
    let sent = frame::build(
        &addressing,
        &foreign::solicit(own, [xid[0], xid[1], xid[2]]),
        &mut out,
    )
    .map(|()| packet.send_with_flags(&out, libc::MSG_DONTWAIT));
    match sent {
        Some(Ok(_)) => debug!("probe SOLICIT sent"),
        Some(Err(error)) => debug!(%error, "probe SOLICIT not sent"),
        None => {}
    }
    true
}

/// Records the sender of a datagram to port 546 if it is another DHCPv6 server's answer.
fn look_at(
    udp: &frame::Udp6<'_>,
    own: MacAddr,
    duid: &[u8],
    pool: &NamespacedName,
    suspects: &Suspects,
) {
    let Some(seen) = foreign::judge(udp, own, duid) else {
        return;
    };
    if suspects
        .peer(pool, seen.mac, Some(seen.source.into()), &seen.detail)
        .is_some()
    {
        return;
    }
    if suspects.record(
        pool,
        SuspectKind::ForeignDhcpServer,
        seen.mac,
        Some(seen.source.into()),
        &seen.detail,
    ) {
        warn!(%pool, mac = %seen.mac, server = %seen.source, detail = %seen.detail, "foreign DHCPv6 server on the pool's network");
    } else {
        debug!(%pool, mac = %seen.mac, server = %seen.source, "foreign DHCPv6 server seen again");
    }
}

/// Serves until `stop`; returns an error when a socket cannot be set up or fails.
fn serve(
    name: &str,
    pool: &NamespacedName,
    table: &Arc<LeaseTable>,
    attempt: &Attempt<Counters6>,
    watchers: &Watchers,
) -> Result<(), Server6Error> {
    let (counters, stop) = (&attempt.counters, &attempt.stop);
    let Watchers {
        errors, suspects, ..
    } = watchers;
    let (index, own) = crate::arp::link(name).map_err(|_| Server6Error::NoInterface {
        interface: name.to_owned(),
    })?;
    let sockets = Sockets::open(name, index)?;
    errors.send_if_modified(|all| all.remove(name).is_some());
    attempt.serving();
    info!(interface = %name, %pool, "DHCPv6 serving on [::]:547 (ff02::1:2)");
    let duid = server_duid(pool);
    let probes = Arc::new(InFlight::default());
    let context = Context {
        table: Arc::clone(table),
        counters: Arc::clone(&counters.declines),
        suspects: suspects.clone(),
    };
    let mut rechecks = Rechecks::new(Instant::now());
    let mut frame = vec![0u8; FRAME_BUFFER];
    let mut reply = Vec::with_capacity(FRAME_BUFFER);
    let mut sources = Sources::new(index);
    let mut next_probe = Instant::now();
    let mut keyed = Keyed::default();
    let mut pacer = Pacer::new(pacing::WINDOW);
    while !*stop.borrow() {
        // Before the receive, which returns every RECEIVE_TIMEOUT when nothing arrives.
        if let Some(every) = watchers.foreign.probe_every()
            && Instant::now() >= next_probe
        {
            sources.refresh(Instant::now());
            // Until the interface has a usable link-local address, tried again each turn.
            if probe_servers(&sockets.packet, own, &sources) {
                next_probe = Instant::now() + every;
            }
        }
        if !keyed.is_empty()
            && let Some(snapshot) = table.pool(pool)
        {
            keyed.look(&snapshot);
            let due = keyed.due(Instant::now());
            if !due.is_empty() {
                sources.refresh(Instant::now());
                let server_ip = snapshot.config().ipv6.as_ref().map(|v6| v6.server_ip);
                let sender = Reconfigurer {
                    packet: &sockets.packet,
                    own,
                    sources: &sources,
                    server_ip,
                    duid: &duid,
                    counters,
                };
                for due in &due {
                    sender.send(due, &mut reply);
                }
            }
        }
        rechecks.start_round(Instant::now(), || table.pool(pool));
        for claimed in rechecks.claim(&probes) {
            recheck(name, pool, &context, claimed);
        }
        let len = match pacer.receive(&sockets.packet, pacing::read_into(&mut frame)) {
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
        let Some(udp) = frame.get(..len).and_then(frame::parse) else {
            continue;
        };
        if udp.destination_port == CLIENT_PORT {
            if watchers.foreign.enabled
                && let Some(suspects) = suspects
            {
                look_at(&udp, own, &duid, pool, suspects);
            }
            continue;
        }
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
                source: udp.source,
                link_source: Some(udp.source_mac),
                multicast: udp.destination.is_multicast(),
            },
            Server {
                duid: &duid,
                own_mac: Some(own),
                withheld: &|ip| table.withholds6(&snapshot, ip),
            },
            &snapshot,
        );
        match outcome {
            Outcome::Answer {
                mut bytes,
                kind,
                to_relay,
                also,
                mac,
                key_slot,
            } => {
                if let (Some(slot), Some(mac)) = (key_slot, mac)
                    && let Err(error) =
                        keyed.acked(mac, (slot.at, slot.target), &mut bytes, &snapshot)
                {
                    // The REPLY still goes: the client learns a change at T1 instead.
                    warn!(%mac, %error, "REPLY sent without a reconfigure key");
                }
                sources.refresh(Instant::now());
                let server_ip = snapshot.config().ipv6.as_ref().map(|v6| v6.server_ip);
                let sent = sources
                    .source_for(&udp.source, server_ip)
                    .ok_or(SendError::NoSource)
                    .and_then(|from| {
                        let addressing = Addressing {
                            from_mac: own,
                            to_mac: udp.source_mac,
                            from,
                            to: udp.source,
                            from_port: SERVER_PORT,
                            to_port: if to_relay { SERVER_PORT } else { CLIENT_PORT },
                        };
                        frame::build(&addressing, &bytes, &mut reply).ok_or(SendError::TooLarge)?;
                        sockets
                            .packet
                            .send_with_flags(&reply, libc::MSG_DONTWAIT)
                            .map_err(SendError::Io)
                    });
                match sent {
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
                    verify_decline(name, pool, addr, mac, &context, &probes);
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

/// What sending a RECONFIGURE takes: this interface's packet socket, MAC and source addresses,
/// the pool's server address and DUID, and the counters.
struct Reconfigurer<'a> {
    packet: &'a Socket,
    own: MacAddr,
    sources: &'a Sources,
    server_ip: Option<std::net::Ipv6Addr>,
    duid: &'a [u8],
    counters: &'a Counters6,
}

impl Reconfigurer<'_> {
    /// Sends the RECONFIGURE `due` from this interface's link-local address to its client's, as
    /// a whole frame to the client's MAC like every answer, counting it or the error.
    fn send(&self, due: &Due<reconfigure::Target>, frame_buffer: &mut Vec<u8>) {
        let target = &due.target;
        match self.frame(due, frame_buffer) {
            Ok(()) => {
                self.counters.reconfigures.fetch_add(1, Ordering::Relaxed);
                info!(mac = %due.mac, to = %target.address, "RECONFIGURE sent: the pool's answer to it changed");
            }
            Err(error) => {
                self.counters.send_failed.fetch_add(1, Ordering::Relaxed);
                warn!(mac = %due.mac, to = %target.address, %error, "RECONFIGURE not sent");
            }
        }
    }

    fn frame(
        &self,
        due: &Due<reconfigure::Target>,
        frame_buffer: &mut Vec<u8>,
    ) -> Result<(), SendError> {
        let message = reconfigure::message(self.duid, due)?;
        let target = &due.target;
        let from = self
            .sources
            .source_for(&target.address, self.server_ip)
            .ok_or(SendError::NoSource)?;
        let addressing = Addressing {
            from_mac: self.own,
            to_mac: target.link,
            from,
            to: target.address,
            from_port: SERVER_PORT,
            to_port: CLIENT_PORT,
        };
        frame::build(&addressing, &message, frame_buffer).ok_or(SendError::TooLarge)?;
        self.packet
            .send_with_flags(frame_buffer, libc::MSG_DONTWAIT)
            .map(|_| ())
            .map_err(SendError::Io)
    }
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

/// The sockets of one interface.
struct Sockets {
    /// Reads the requests and sends the replies.
    packet: Socket,
    /// Held open for its membership in `ff02::1:2`, which lasts as long as it does.
    _membership: Socket,
}

/// Room for a frame: the largest accepted datagram plus Ethernet, IPv6 and UDP headers.
const FRAME_BUFFER: usize = MAX_PACKET + 1 + ETHERNET + IPV6 + UDP;

/// Why a reply was not sent.
#[derive(Debug, thiserror::Error)]
enum SendError {
    /// Neither a usable link-local address on the interface nor a server address to send from.
    #[error("no source address: the interface's link-local address is not usable yet")]
    NoSource,
    /// Larger than one datagram.
    #[error("reply too large for one datagram")]
    TooLarge,
    /// The packet socket refused it.
    #[error(transparent)]
    Io(io::Error),
    /// A RECONFIGURE could not be signed.
    #[error(transparent)]
    Sign(#[from] crate::reconfigure::ReconfigureError),
}

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
        udp.attach_filter(&[SockFilter::new(arp::bpf::RET_K, 0, 0, 0)])
            .map_err(err("filter out what the UDP socket receives", None))?;
        udp.set_nonblocking(true)
            .map_err(err("set non-blocking", None))?;

        // The packet socket: no protocol until the filter is attached, so nothing unfiltered
        // is queued; then bound to IPv6 frames of this interface.
        let packet = Socket::new(Domain::PACKET, Type::RAW, None)
            .map_err(err("create a packet socket", Some(Capability::NetRaw)))?;
        packet
            .attach_filter(&frame::dhcp_filter())
            .map_err(err("attach the DHCPv6 ports' filter", None))?;
        let link = crate::arp::link_address(index, ETH_P_IPV6, [0; 6])
            .map_err(err("address the interface's link", None))?;
        packet.bind(&link).map_err(err(
            "bind the packet socket to the interface",
            Some(Capability::NetRaw),
        ))?;
        packet
            .set_read_timeout(Some(RECEIVE_TIMEOUT))
            .map_err(err("set a receive timeout", None))?;
        Ok(Sockets {
            packet,
            _membership: udp,
        })
    }
}
