//! The sockets: one UDP socket on 0.0.0.0:67 per served interface, bound to that device, each
//! supervised by its own task and read by its own thread, so that one interface's failure (socket
//! error, interface gone) is reported and retried without touching the others.
//!
//! This is the only part of the server that does I/O; what to answer is [`super::handler`]'s.

use std::collections::BTreeMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dhcproto::v4::MessageType;
use serde::Serialize;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::sync::watch;
use tracing::{debug, info, info_span, warn};
use vmdhcp_core::{MacAddr, NamespacedName};
use vmdhcp_telemetry::trace;

use super::SERVER_PORT;
use super::counters::Counters;
use super::forcerenew::{self, Keyed};
use super::handler::{Action, MAX_PACKET, Outcome, Reply, Silence, handle_on};
use super::pins::Pins;
use super::probe::{Declined, PendingOffer, Probes};
use crate::capability::{Capability, Missing};
use crate::lease_table::{LeaseTable, PoolSnapshot};
use crate::pacing::{self, Pacer};
use crate::reconfigure::Due;
use crate::supervisor::{Attempt, Served, Supervisor};
use crate::suspects::Suspects;

/// Why an interface is not serving.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The socket could not be created, configured or bound.
    #[error("interface {interface}: cannot {step}: {source}{missing}")]
    Socket {
        /// The interface.
        interface: String,
        /// What was being done (`bind to the device`, …).
        step: &'static str,
        /// The OS error.
        source: io::Error,
        /// The capability the step lacked, when the kernel refused it for that.
        missing: Missing,
    },
    /// Receiving failed; the socket is re-created.
    #[error("interface {interface}: receive failed: {source}")]
    Receive {
        /// The interface.
        interface: String,
        /// The OS error.
        source: io::Error,
    },
    /// The interface's server thread ended abnormally.
    #[error("interface {interface}: server thread failed: {source}")]
    Crashed {
        /// The interface.
        interface: String,
        /// What the runtime reported (a panic, or cancellation at shutdown).
        source: tokio::task::JoinError,
    },
    /// The interface disappeared (or was re-created) under a bound socket.
    #[error("interface {interface} is gone or was re-created")]
    InterfaceGone {
        /// The interface.
        interface: String,
    },
}

/// An interface to serve and the pool whose leases it hands out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    /// The Linux interface name.
    pub name: String,
    /// The pool served on it.
    pub pool: NamespacedName,
}

/// Where one interface's server stands, for readiness and reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum InterfaceStatus {
    /// Not yet bound.
    Starting,
    /// Bound and answering.
    Serving,
    /// Leases loaded, not answering: another agent replica leads.
    Standby,
    /// Not serving; retried with backoff.
    Failed {
        /// The last error.
        error: String,
    },
}

/// Creates the socket of one interface: 0.0.0.0:67, bound to the device so that each pool's
/// broadcasts are heard and answered only on its own network, broadcast allowed for replies to
/// clients without an address, and address reuse so several interfaces can each bind port 67.
pub fn bind(interface: &str) -> Result<std::net::UdpSocket, ServerError> {
    // `needs`: the capability the step requires, named in the error when the kernel refuses it.
    let err = |step: &'static str, needs: Option<Capability>| {
        move |source: io::Error| ServerError::Socket {
            interface: interface.to_owned(),
            step,
            missing: needs.map(|cap| cap.lacking(&source)).unwrap_or_default(),
            source,
        }
    };
    let socket = udp_on_device(interface, SERVER_PORT, |socket| {
        // Room for bursts (a rack of VMs booting at once, relays flushing queues): the kernel
        // caps this at net.core.rmem_max, which is fine, it only has to beat the small default.
        socket
            .set_recv_buffer_size(RECV_BUFFER)
            .map_err(SocketStep::at("set SO_RCVBUF", None))
    })
    .map_err(|e| err(e.step, e.needs)(e.source))?;
    Ok(socket.into())
}

/// A step of setting up a socket that the kernel refused, and the capability it needs.
#[derive(Debug)]
pub(super) struct SocketStep {
    /// What was being done.
    pub step: &'static str,
    /// The capability the step requires, named in the error when the kernel refuses it.
    pub needs: Option<Capability>,
    /// The kernel's answer.
    pub source: io::Error,
}

impl SocketStep {
    /// A `map_err` for `step`.
    pub fn at(step: &'static str, needs: Option<Capability>) -> impl FnOnce(io::Error) -> Self {
        move |source| SocketStep {
            step,
            needs,
            source,
        }
    }
}

/// A non-blocking UDP socket on `0.0.0.0:port` bound to `interface` (SO_BINDTODEVICE) so that
/// it hears and sends on that network only, with address reuse (every interface binds the same
/// port) and broadcast allowed; `prepare` runs on it before it is bound (a buffer size, a
/// filter). The DHCP server's socket (port 67) and the foreign-server probe's (port 68).
pub(super) fn udp_on_device(
    interface: &str,
    port: u16,
    prepare: impl FnOnce(&Socket) -> Result<(), SocketStep>,
) -> Result<Socket, SocketStep> {
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))
        .map_err(SocketStep::at("create a UDP socket", None))?;
    socket
        .set_reuse_address(true)
        .map_err(SocketStep::at("set SO_REUSEADDR", None))?;
    socket
        .set_broadcast(true)
        .map_err(SocketStep::at("set SO_BROADCAST", None))?;
    prepare(&socket)?;
    // Unprivileged since Linux 5.7; before, it needs CAP_NET_RAW.
    socket
        .bind_device(Some(interface.as_bytes()))
        .map_err(SocketStep::at(
            "bind to the device (SO_BINDTODEVICE)",
            Some(Capability::NetRaw),
        ))?;
    // Ports 67 and 68 are below net.ipv4.ip_unprivileged_port_start (1024 unless the runtime
    // lowers it).
    let step = if port == SERVER_PORT {
        "bind 0.0.0.0:67"
    } else {
        "bind 0.0.0.0:68"
    };
    socket
        .bind(&SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port)).into())
        .map_err(SocketStep::at(step, Some(Capability::NetBindService)))?;
    socket
        .set_nonblocking(true)
        .map_err(SocketStep::at("set non-blocking", None))?;
    Ok(socket)
}

const RECV_BUFFER: usize = 4 << 20;

/// The kernel's index of an interface, or `None` if it does not exist in this namespace.
pub(super) fn ifindex(interface: &str) -> Option<u32> {
    std::fs::read_to_string(format!("/sys/class/net/{interface}/ifindex"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// The interface's own MAC ([`crate::arp::link`]), or `None` if it cannot be read (then only
/// the probe for foreign servers could be answered, and only if that MAC were reserved: no
/// lease is lost).
fn own_mac(interface: &str) -> Option<MacAddr> {
    crate::arp::link(interface).ok().map(|(_, mac)| mac)
}

/// One interface's counters, as the metrics endpoint reads them.
pub type InterfaceCounters = (Interface, Arc<Counters>);

impl Served for Interface {
    fn name(&self) -> &str {
        &self.name
    }

    fn pool(&self) -> &NamespacedName {
        &self.pool
    }
}

/// The running servers, one per interface; interfaces can be started and stopped at any time
/// (the agent's serving loop follows pools and leadership), each independently of the others
/// ([`Supervisor`]).
pub struct Servers {
    table: Arc<LeaseTable>,
    probes: Arc<Probes>,
    status_tx: Arc<watch::Sender<BTreeMap<String, InterfaceStatus>>>,
    statuses: watch::Receiver<BTreeMap<String, InterfaceStatus>>,
    supervisor: Supervisor<Interface, Counters>,
}

impl Servers {
    /// No servers yet; [`Servers::start`] adds them.
    pub fn new(table: Arc<LeaseTable>) -> Self {
        let (status_tx, statuses) = watch::channel(BTreeMap::new());
        Servers {
            table,
            probes: Arc::default(),
            status_tx: Arc::new(status_tx),
            statuses,
            supervisor: Supervisor::default(),
        }
    }

    /// The same servers, whose ARP probes report the proxy-ARP responders they find to
    /// `suspects` (for the controller and `/metrics`).
    pub fn reporting_to(mut self, suspects: Arc<Suspects>) -> Self {
        self.probes = Arc::new(Probes::reporting_to(suspects));
        self
    }

    /// Starts serving `interface` (binding, with retries, in the background). Starting an
    /// interface that already runs for the same pool does nothing; for another pool, the old
    /// server must be stopped first (it is left running and a warning logged).
    pub fn start(&mut self, interface: Interface) {
        if !self.supervisor.runs(&interface.name) {
            set_status(&self.status_tx, &interface.name, InterfaceStatus::Starting);
        }
        let span = info_span!("dhcp", interface = %interface.name, pool = %interface.pool);
        let (table, probes, status) = (
            Arc::clone(&self.table),
            Arc::clone(&self.probes),
            Arc::clone(&self.status_tx),
        );
        let failed_status = Arc::clone(&self.status_tx);
        let served = interface.clone();
        self.supervisor.start(
            interface,
            span,
            move |attempt| {
                let (interface, table, probes, status) = (
                    served.clone(),
                    Arc::clone(&table),
                    Arc::clone(&probes),
                    Arc::clone(&status),
                );
                serve_interface(interface, table, probes, status, attempt)
            },
            move |name, error| set_status(&failed_status, name, InterfaceStatus::Failed { error }),
        );
    }

    /// Stops serving on `name` and waits until its socket is closed (at most one receive
    /// timeout, 250 ms); its status becomes `then`, or disappears when `then` is `None`.
    pub async fn stop(&mut self, name: &str, then: Option<InterfaceStatus>) {
        self.supervisor.stop(name).await;
        self.set_status(name, then);
    }

    /// Sets (or with `None` removes) the status of an interface that is not running: a standby's
    /// pools, or an interface that could not be configured.
    pub fn set_status(&self, name: &str, status: Option<InterfaceStatus>) {
        match status {
            Some(status) => set_status(&self.status_tx, name, status),
            None => {
                self.status_tx
                    .send_if_modified(|all| all.remove(name).is_some());
            }
        }
    }

    /// The interfaces running now.
    pub fn running(&self) -> impl Iterator<Item = &Interface> {
        self.supervisor.running()
    }

    /// Every interface's status, updated as they change.
    pub fn statuses(&self) -> watch::Receiver<BTreeMap<String, InterfaceStatus>> {
        self.statuses.clone()
    }

    /// Each running interface with its counters, updated as interfaces start and stop.
    pub fn counters(&self) -> watch::Receiver<Vec<InterfaceCounters>> {
        self.supervisor.counters()
    }

    /// Stops every interface and waits for each to close its socket.
    pub async fn stop_all(&mut self, then: Option<InterfaceStatus>) {
        for name in self.supervisor.stop_all().await {
            self.set_status(&name, then.clone());
        }
    }
}

fn set_status(
    tx: &watch::Sender<BTreeMap<String, InterfaceStatus>>,
    interface: &str,
    status: InterfaceStatus,
) {
    tx.send_if_modified(|all| {
        if all.get(interface) == Some(&status) {
            false
        } else {
            all.insert(interface.to_owned(), status);
            true
        }
    });
}

/// One attempt to serve `interface`: bind its socket, then read it on a thread of its own until
/// stopped or failed ([`Supervisor`] retries).
async fn serve_interface(
    interface: Interface,
    table: Arc<LeaseTable>,
    probes: Arc<Probes>,
    status: Arc<watch::Sender<BTreeMap<String, InterfaceStatus>>>,
    attempt: Attempt<Counters>,
) -> Result<(), ServerError> {
    let index = ifindex(&interface.name).ok_or_else(|| ServerError::Socket {
        interface: interface.name.clone(),
        step: "find the interface",
        source: io::Error::from(io::ErrorKind::NotFound),
        missing: Missing(None),
    })?;
    let socket = bind(&interface.name)?;
    info!("serving");
    set_status(&status, &interface.name, InterfaceStatus::Serving);
    attempt.serving();
    // A thread of its own per interface: a blocking receive costs two system calls per packet
    // where readiness polling costs five, and a panic, should one ever happen, ends only this
    // interface's thread and is reported like any failure.
    let name = interface.name.clone();
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || {
        span.in_scope(|| {
            serve(
                &interface,
                index,
                socket,
                &table,
                &attempt.counters,
                &probes,
                &attempt.stop,
            )
        })
    })
    .await
    .unwrap_or_else(|source| {
        Err(ServerError::Crashed {
            interface: name,
            source,
        })
    })
}

/// Sends `reply`, counting its latency from `received_at`, or the error.
fn send_reply(
    socket: &std::net::UdpSocket,
    reply: &super::handler::Reply,
    counters: &Counters,
    received_at: Instant,
) {
    if let Err(error) = socket.send_to(&reply.bytes, reply.to) {
        counters.record_send_error();
        warn!(to = %reply.to, %error, "reply not sent");
    } else {
        counters.record_latency(received_at.elapsed());
    }
}

/// Sends a FORCERENEW from `server` to its client's address (port 68), counting it or the
/// error.
fn send_forcerenew(
    socket: &std::net::UdpSocket,
    server: Ipv4Addr,
    due: &Due<forcerenew::Target>,
    counters: &Counters,
) {
    let (mac, to) = (
        due.mac,
        SocketAddrV4::new(due.target.ip, super::CLIENT_PORT),
    );
    let sent = forcerenew::message(server, due)
        .map_err(io::Error::other)
        .and_then(|bytes| socket.send_to(&bytes, to));
    match sent {
        Ok(_) => {
            counters.record_forcerenew();
            info!(%mac, %to, "FORCERENEW sent: the pool's answer to it changed");
        }
        Err(error) => {
            counters.record_send_error();
            warn!(%mac, %to, %error, "FORCERENEW not sent");
        }
    }
}

/// A MAC for log fields, formatted only if an event is actually emitted.
struct MacField(Option<vmdhcp_core::MacAddr>);

impl std::fmt::Display for MacField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(mac) => mac.fmt(f),
            None => f.write_str("-"),
        }
    }
}

/// How often a serving socket checks that its interface is still the one it bound to.
const LINK_CHECK: Duration = Duration::from_secs(2);
/// How long a receive blocks before the loop looks at shutdown and the link again.
const POLL: Duration = Duration::from_millis(250);

fn serve(
    interface: &Interface,
    index: u32,
    socket: std::net::UdpSocket,
    table: &Arc<LeaseTable>,
    counters: &Arc<Counters>,
    probes: &Arc<Probes>,
    shutdown: &watch::Receiver<bool>,
) -> Result<(), ServerError> {
    let setup = |step: &'static str| {
        move |source| ServerError::Socket {
            interface: interface.name.clone(),
            step,
            source,
            missing: Missing(None),
        }
    };
    socket
        .set_nonblocking(false)
        .map_err(setup("set blocking"))?;
    socket
        .set_read_timeout(Some(POLL))
        .map_err(setup("set SO_RCVTIMEO"))?;
    // Shared with the probes that send an OFFER once its address is found free.
    let socket = Arc::new(socket);
    // Read once per bind: a re-created interface (a new MAC) is bound again.
    let own = own_mac(&interface.name);
    // Larger than any accepted packet, so an oversized datagram is seen as such, not truncated
    // into something that looks valid.
    let mut buf = vec![0u8; MAX_PACKET * 2];
    let mut next_link_check = Instant::now() + LINK_CHECK;
    // The recorded conflicts are probed again as soon as this interface serves (a new leader
    // learns at once which are free), then every RECHECK.
    let mut next_recheck = Instant::now();
    let mut pins = Pins::default();
    let mut keyed = Keyed::default();
    let mut pacer = Pacer::new(pacing::WINDOW);
    loop {
        if *shutdown.borrow() {
            info!("stopping");
            return Ok(());
        }
        let received = match pacer.receive(&*socket, |socket| socket.recv_from(&mut buf)) {
            Ok(received) => Some(received),
            // The receive timed out: time to look at shutdown and the link.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                None
            }
            Err(source) => {
                return Err(ServerError::Receive {
                    interface: interface.name.clone(),
                    source,
                });
            }
        };
        let received_at = Instant::now();
        if received_at >= next_link_check {
            if ifindex(&interface.name) != Some(index) {
                return Err(ServerError::InterfaceGone {
                    interface: interface.name.clone(),
                });
            }
            next_link_check = received_at + LINK_CHECK;
        }
        if received_at >= next_recheck {
            if let Some(pool) = table.pool(&interface.pool)
                && !pool.config().conflicted.is_empty()
            {
                probes.recheck(&interface.name, &pool, table);
            }
            next_recheck = received_at + crate::findings::RECHECK;
        }
        let pool = table.pool(&interface.pool);
        if let Some(pool) = &pool {
            keyed.look(pool);
            for due in keyed.due(received_at) {
                pins.pin(index, due.target.ip, due.mac);
                send_forcerenew(&socket, pool.config().server_ip, &due, counters);
            }
        }
        let Some((len, peer)) = received else {
            continue;
        };
        let Some(pool) = pool else {
            counters.record_no_pool();
            debug!(%peer, "no config for this pool yet; packet ignored");
            continue;
        };
        let span = transaction_span(interface);
        let _in = span.enter();
        let mut outcome = handle_on(own, &buf[..len], &pool, |ip| table.withholds(&pool, ip));
        if let (Action::Reply(reply), Some(mac)) = (&mut outcome.action, outcome.mac)
            && let Some(slot) = reply.key_slot
            && let Err(error) = keyed.acked(mac, (slot.at, slot.target), &mut reply.bytes, &pool)
        {
            // The ACK still goes: the client learns a change at T1 instead.
            warn!(%mac, %error, "ACK sent without a reconfigure key");
        }
        counters.record(&outcome);
        record_outcome(&span, &outcome);
        if let Action::Reply(super::handler::Reply {
            unicast_to: Some(mac),
            to,
            ..
        }) = &outcome.action
        {
            pins.pin(index, *to.ip(), *mac);
        }
        let exchange = Exchange {
            interface,
            table,
            counters,
            probes,
            socket: &socket,
            received_at,
        };
        exchange.act(outcome, &pool, peer, len);
    }
}

/// One span per exchange, only while traces are exported: the packet path pays nothing
/// otherwise. A root of its own (not a child of the interface's lifelong span).
fn transaction_span(interface: &Interface) -> tracing::Span {
    if trace::enabled() {
        info_span!(
            parent: None,
            "dhcp.transaction",
            interface = %interface.name,
            pool = %interface.pool,
            message_type = tracing::field::Empty,
            mac = tracing::field::Empty,
            result = tracing::field::Empty,
        )
    } else {
        tracing::Span::none()
    }
}

/// Records what became of an exchange in its span (if traces are exported).
fn record_outcome(span: &tracing::Span, outcome: &Outcome) {
    if span.is_none() {
        return;
    }
    if let Some(request) = outcome.request {
        span.record("message_type", tracing::field::debug(request));
    }
    span.record("mac", tracing::field::display(&MacField(outcome.mac)));
    match &outcome.action {
        Action::Reply(reply) => span.record("result", tracing::field::debug(reply.kind)),
        Action::Silent(silence) => span.record("result", silence.as_str()),
        Action::Drop(reason) => span.record("result", reason.as_str()),
    };
}

/// What one received datagram is handled with: the interface's server and its shared parts.
struct Exchange<'a> {
    interface: &'a Interface,
    table: &'a Arc<LeaseTable>,
    counters: &'a Arc<Counters>,
    probes: &'a Arc<Probes>,
    socket: &'a Arc<std::net::UdpSocket>,
    received_at: Instant,
}

impl Exchange<'_> {
    /// Carries out the handler's decision on a datagram of `len` bytes from `peer`.
    fn act(&self, outcome: Outcome, pool: &PoolSnapshot, peer: SocketAddr, len: usize) {
        let mac = MacField(outcome.mac);
        match outcome.action {
            Action::Reply(reply) => {
                let reply = Arc::new(reply);
                if self.held_for_probe(&reply, outcome.mac, pool) {
                    debug!(%mac, "OFFER held until its address is probed");
                    return;
                }
                send_reply(self.socket, &reply, self.counters, self.received_at);
                debug!(%mac, request = ?outcome.request, reply = ?reply.kind, to = %reply.to, "replied");
            }
            Action::Silent(Silence::Declined(ip)) => {
                if let Some(by) = outcome.mac {
                    info!(%mac, %ip, "address declined by the client: checking with an ARP probe");
                    let declined = Declined {
                        interface: self.interface.name.clone(),
                        pool: self.interface.pool.clone(),
                        ip,
                        by,
                    };
                    let (table, counts) = (Arc::clone(self.table), self.counters.declines());
                    self.probes.check_decline(declined, table, counts);
                }
            }
            Action::Silent(Silence::Released(ip)) => {
                info!(%mac, %ip, "address released by the client");
            }
            Action::Silent(Silence::UnknownMac) => {
                debug!(%mac, request = ?outcome.request, "no lease for this MAC; no reply");
            }
            Action::Silent(silence) => {
                debug!(%mac, request = ?outcome.request, reason = silence.as_str(), "no reply");
            }
            Action::Drop(reason) => {
                debug!(%peer, len, reason = reason.as_str(), "packet dropped");
            }
        }
    }

    /// Whether `reply` is the first OFFER of its address to `to` on this link, now held until
    /// a probe finds the address free (the probe sends it). A relayed client is on another
    /// link, where this agent cannot probe; when no probe can run, serving comes first.
    fn held_for_probe(&self, reply: &Arc<Reply>, to: Option<MacAddr>, pool: &PoolSnapshot) -> bool {
        let relayed = reply.to.port() == SERVER_PORT;
        let (MessageType::Offer, Some(to), false) = (reply.kind, to, relayed) else {
            return false;
        };
        let Some(ip) = pool
            .address_of(&to)
            .filter(|ip| !self.probes.is_clean(&self.interface.pool, *ip, to))
        else {
            return false;
        };
        let offer = PendingOffer {
            interface: self.interface.name.clone(),
            pool: self.interface.pool.clone(),
            ip,
            mac: to,
        };
        let (socket, counters, held, at) = (
            Arc::clone(self.socket),
            Arc::clone(self.counters),
            Arc::clone(reply),
            self.received_at,
        );
        let send_late = move || send_reply(&socket, &held, &counters, at);
        let counts = self.counters.offer_probes();
        !self
            .probes
            .probe_offer(offer, Arc::clone(self.table), counts, send_late)
    }
}
