//! Other DHCP servers on the pools' networks: a VM running dnsmasq, an appliance or a router
//! with its server left on. Clients take the first OFFER they get, so such a server hands our
//! VMs wrong addresses whenever it answers faster than we do; switches' DHCP snooping exists for
//! this, and tenant networks rarely have it.
//!
//! While this agent leads, on each interface it serves:
//!
//! - it **listens**: a packet socket reads every DHCP reply (UDP 67 → 68) reaching the
//!   interface, selected in the kernel by a classic BPF filter ([`filter`]: this interface,
//!   received rather than sent or looped back by us, IPv4, UDP, not a later fragment), so that
//!   the Ethernet source of each reply, the server's MAC, is known;
//! - it **asks**: every `probe_interval` ([`PROBE_INTERVAL`] unless set) it broadcasts a
//!   DHCPDISCOVER ([`discover`]) from the interface's own MAC, broadcast flag set, with a fresh
//!   random xid, from port 68 to 255.255.255.255:67, which every server on the network answers.
//!   Our own server never does ([`super::handler::Silence::OwnInterface`]).
//!
//! An OFFER, ACK or NAK is foreign ([`judge`]) when its server identifier (option 54, else the IP
//! source) is not the pool's server address and neither its Ethernet nor its IP source is this
//! interface; it is recorded in [`crate::suspects`] under the frame's source MAC, unless the
//! operator named that MAC or server address as a peer ([`crate::suspects::KnownServers`]). A server that
//! names the pool's own address as its identifier is not reported (upstream's agent, during a
//! migration, does exactly that); it also clashes with our address in every ARP cache.
//!
//! Received bytes are parsed by hand ([`read_reply`]), never given to `dhcproto`'s decoder, some
//! of whose option decoders panic on malformed input (see `handler::wire`); only our own
//! DISCOVER is built with it.
//!
//! Bounded whatever the network sends: one task and two sockets per interface (the packet
//! socket that reads, a UDP socket that only sends the probe, its receive side closed by a
//! filter that accepts nothing), at most [`MAX_FRAMES_PER_SECOND`] frames read per interface and
//! second (beyond that the kernel's small receive buffer drops them), and nothing allocated per
//! frame but the detail of what is recorded. The standby runs none of this: [`Detectors`] is
//! driven by [`crate::serving`], which stops every detector on step-down. Without CAP_NET_RAW
//! (the packet socket) nothing is detected, and a warning says so.

use std::collections::BTreeMap;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher as _};
use std::io::{self, Read};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dhcproto::Encodable;
use dhcproto::v4::{DhcpOption, Flags, Message, MessageType, OptionCode};
use socket2::{Domain, Protocol, SockFilter, Socket, Type};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{Instrument, debug, info, info_span, warn};
use vmdhcp_core::{MacAddr, NamespacedName};

use super::server::{SocketStep, ifindex, udp_on_device};
use super::{CLIENT_PORT, SERVER_PORT};
use crate::arp::{Counts, SendCounters};
use crate::capability::{Capability, Missing};
use crate::suspects::{SuspectKind, Suspects};

mod frames;

pub use frames::*;

/// How often the serving agent asks for other servers, unless set: a rogue server is found
/// within this (sooner if it answers a client where we can hear it), and each probe costs every
/// server on the network one OFFER.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(30);
/// Most frames read per interface and second; a flood beyond it is dropped by the kernel.
pub const MAX_FRAMES_PER_SECOND: u32 = 256;
/// How often each detector checks that its interface is still the one it opened, and forgets
/// suspects not seen for their time.
const HOUSEKEEPING: Duration = Duration::from_secs(5);
/// The packet socket's receive buffer: a few hundred replies; the kernel drops the rest.
const RECV_BUFFER: usize = 256 << 10;
/// Longest frame read: an Ethernet MTU and its header; a longer one is cut, and a DHCP reply
/// that does not fit is not one a client on this network could take either.
const FRAME_MAX: usize = 1514;
/// Delays between attempts to open an interface's sockets again (vmdhcp_core::retry).
const MIN_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

const ETH_P_IP: u16 = 0x0800;
const IPPROTO_UDP: u8 = 17;
const BOOTREPLY: u8 = 2;
const MAGIC_COOKIE: [u8; 4] = [99, 130, 83, 99];
/// `PACKET_OTHERHOST`: the highest packet type of a frame that came from the wire; above it are
/// `PACKET_OUTGOING` and `PACKET_LOOPBACK`, our own frames.
const PACKET_OTHERHOST: u32 = 3;

/// Why an interface's detector is not running.
#[derive(Debug, thiserror::Error)]
pub enum ForeignError {
    /// A socket could not be created, configured or bound.
    #[error("interface {interface}: cannot {step}: {source}{missing}")]
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
    /// The interface's index or MAC cannot be read (it does not exist, or not yet).
    #[error(transparent)]
    Interface(#[from] crate::arp::ArpError),
    /// The interface disappeared (or was re-created) under the sockets.
    #[error("interface {interface} is gone or was re-created")]
    InterfaceGone {
        /// The interface.
        interface: String,
    },
}

impl ForeignError {
    /// Whether retrying cannot help: a capability the process does not hold.
    fn lacks_capability(&self) -> bool {
        matches!(self, ForeignError::Socket { missing, .. } if missing.0.is_some())
    }
}

/// How the detectors run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DetectorSettings {
    /// Whether to look for foreign servers at all.
    pub enabled: bool,
    /// Time between two probes; `None`: no probes, listening only.
    pub probe_interval: Option<Duration>,
}

impl Default for DetectorSettings {
    fn default() -> Self {
        DetectorSettings {
            enabled: true,
            probe_interval: Some(PROBE_INTERVAL),
        }
    }
}

/// What a detector watches: an interface, the pool served there and its server address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The interface.
    pub interface: String,
    /// The pool served there.
    pub pool: NamespacedName,
    /// The pool's server address: replies naming it are ours.
    pub server_ip: Ipv4Addr,
}

/// A running detector: its stop switch and task.
struct Running {
    target: Target,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// The detectors, one per served interface, started and stopped with the servers.
pub struct Detectors {
    suspects: Arc<Suspects>,
    settings: DetectorSettings,
    counters: SendCounters,
    running: BTreeMap<String, Running>,
}

impl Detectors {
    /// No detectors yet; what they find goes to `suspects`.
    pub fn new(suspects: Arc<Suspects>, settings: DetectorSettings) -> Self {
        Detectors {
            suspects,
            settings,
            counters: SendCounters::default(),
            running: BTreeMap::new(),
        }
    }

    /// How they run, for the DHCPv6 servers' own look for other servers.
    pub fn settings(&self) -> DetectorSettings {
        self.settings
    }

    /// Where what they find is recorded.
    pub fn suspects(&self) -> &Arc<Suspects> {
        &self.suspects
    }

    /// The probe counters, for `/metrics`.
    pub fn counters(&self) -> SendCounters {
        self.counters.clone()
    }

    /// Watches `target` from now on: nothing if a detector already watches it, a restart if
    /// the interface's pool or server address changed.
    pub async fn ensure(&mut self, target: Target) {
        if !self.settings.enabled {
            return;
        }
        match self.running.get(&target.interface) {
            Some(r) if r.target == target => return,
            Some(_) => self.stop(&target.interface.clone()).await,
            None => {}
        }
        let (stop, stopped) = watch::channel(false);
        let counts = self.counters.entry(&target.interface, &target.pool);
        let span = info_span!("foreign_dhcp", interface = %target.interface, pool = %target.pool);
        let task = tokio::spawn(
            detect(
                target.clone(),
                self.settings,
                Arc::clone(&self.suspects),
                counts,
                stopped,
            )
            .instrument(span),
        );
        self.running
            .insert(target.interface.clone(), Running { target, stop, task });
    }

    /// Stops watching `interface` and waits until its sockets are closed.
    pub async fn stop(&mut self, interface: &str) {
        if let Some(r) = self.running.remove(interface) {
            let _ = r.stop.send(true);
            if let Err(error) = r.task.await {
                warn!(%interface, %error, "foreign DHCP server detector failed");
            }
        }
        self.counters.remove(interface);
    }

    /// Stops every detector whose interface `keep` rejects.
    pub async fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        let gone: Vec<String> = self.running.keys().filter(|i| !keep(i)).cloned().collect();
        for interface in gone {
            self.stop(&interface).await;
        }
    }

    /// Stops every detector (step-down, shutdown).
    pub async fn stop_all(&mut self) {
        for r in self.running.values() {
            let _ = r.stop.send(true);
        }
        self.retain(|_| false).await;
    }
}

/// One interface's detector: opens its sockets (again, with backoff, when the interface is
/// missing or re-created) and watches until `stop`.
async fn detect(
    target: Target,
    settings: DetectorSettings,
    suspects: Arc<Suspects>,
    counts: Arc<Counts>,
    mut stop: watch::Receiver<bool>,
) {
    let mut delays = vmdhcp_core::retry::exponential(MIN_BACKOFF, MAX_BACKOFF);
    loop {
        if *stop.borrow() {
            return;
        }
        let error = match Sockets::open(&target.interface) {
            Ok(sockets) => {
                info!(
                    probe_interval_s = settings.probe_interval.map_or(0, |d| d.as_secs()),
                    "looking for foreign DHCP servers"
                );
                delays = vmdhcp_core::retry::exponential(MIN_BACKOFF, MAX_BACKOFF);
                let mut watcher = Watcher {
                    target: &target,
                    suspects: &suspects,
                    counts: &counts,
                    sockets,
                    probe_xid: None,
                };
                match watcher.run(settings, &mut stop).await {
                    Ok(()) => return,
                    Err(e) => e,
                }
            }
            Err(e) => e,
        };
        if error.lacks_capability() {
            warn!(%error, "foreign DHCP servers are not looked for on this interface");
            return;
        }
        let backoff = delays.next().unwrap_or(MAX_BACKOFF);
        debug!(%error, retry_in_ms = backoff.as_millis() as u64, "foreign DHCP server detector not running");
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            _ = stop.changed() => return,
        }
    }
}

/// An interface's two sockets and what they were opened for.
struct Sockets {
    /// Reads the DHCP replies reaching the interface: a packet socket, registered with the
    /// runtime through tokio's `UdpSocket` (only `recv` is used, the same system call for any
    /// datagram socket), because tokio's own way to register a descriptor of another kind,
    /// `AsyncFd::register`, is `unsafe`. A thread per interface would be the alternative, and
    /// the runtime's blocking threads are already one per served interface.
    frames: tokio::net::UdpSocket,
    /// Sends the probes; receives nothing.
    probes: Socket,
    ifindex: u32,
    own_mac: MacAddr,
}

impl Sockets {
    fn open(interface: &str) -> Result<Self, ForeignError> {
        let (ifindex, own_mac) = crate::arp::link(interface)?;
        let err = |step: &'static str, needs: Option<Capability>| {
            move |source: io::Error| ForeignError::Socket {
                interface: interface.to_owned(),
                step,
                missing: needs.map(|cap| cap.lacking(&source)).unwrap_or_default(),
                source,
            }
        };
        let frames = Socket::new(
            Domain::PACKET,
            Type::RAW,
            Some(Protocol::from(i32::from(ETH_P_IP.to_be()))),
        )
        .map_err(err("open a packet socket", Some(Capability::NetRaw)))?;
        frames
            .attach_filter(&filter(ifindex))
            .map_err(err("attach the DHCP reply filter", None))?;
        frames
            .set_recv_buffer_size(RECV_BUFFER)
            .map_err(err("set SO_RCVBUF", None))?;
        frames
            .set_nonblocking(true)
            .map_err(err("set non-blocking", None))?;
        // The socket heard every interface's IP frames until the filter was attached: those
        // queued meanwhile go unread.
        drain(&frames);
        let frames = tokio::net::UdpSocket::from_std(std::net::UdpSocket::from(frames))
            .map_err(err("register with the runtime", None))?;

        let probes = udp_on_device(interface, CLIENT_PORT, |socket| {
            socket
                .attach_filter(&[SockFilter::new(BPF_RET, 0, 0, 0)])
                .map_err(SocketStep::at(
                    "close the probe socket's receive side",
                    None,
                ))
        })
        .map_err(|e| err(e.step, e.needs)(e.source))?;
        Ok(Sockets {
            frames,
            probes,
            ifindex,
            own_mac,
        })
    }
}

/// Reads and discards what a non-blocking socket holds.
fn drain(socket: &Socket) {
    let mut buf = [0u8; 64];
    let mut reader = socket;
    for _ in 0..4096 {
        if reader.read(&mut buf).is_err() {
            return;
        }
    }
}

/// How many frames a detector may still read in the current second.
struct Budget {
    window_end: Instant,
    left: u32,
}

impl Budget {
    fn new(now: Instant) -> Self {
        Budget {
            window_end: now + Duration::from_secs(1),
            left: MAX_FRAMES_PER_SECOND,
        }
    }

    /// Whether a frame may be read at `now` (a new second refills the budget).
    fn available(&mut self, now: Instant) -> bool {
        if now >= self.window_end {
            *self = Budget::new(now);
        }
        self.left > 0
    }
}

/// One interface's detector while its sockets are open.
struct Watcher<'a> {
    target: &'a Target,
    suspects: &'a Suspects,
    counts: &'a Counts,
    sockets: Sockets,
    /// The xid of the last probe sent, to tell answers to it from replies to clients.
    probe_xid: Option<u32>,
}

impl Watcher<'_> {
    /// Watches until `stop` (`Ok`) or until the interface is gone (`Err`).
    async fn run(
        &mut self,
        settings: DetectorSettings,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<(), ForeignError> {
        // The first probe goes at once: a new leader learns of a rogue server right away.
        let mut probe = settings.probe_interval.map(|every| {
            let mut t = tokio::time::interval(every);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        });
        let start = tokio::time::Instant::now() + HOUSEKEEPING;
        let mut housekeeping = tokio::time::interval_at(start, HOUSEKEEPING);
        housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut budget = Budget::new(Instant::now());
        let mut buf = vec![0u8; FRAME_MAX];
        loop {
            let can_read = budget.available(Instant::now());
            let refill = tokio::time::Instant::from_std(budget.window_end);
            tokio::select! {
                // Stop asked, or the switch dropped: either way, stop.
                _ = stop.changed() => return Ok(()),
                () = tick(&mut probe) => self.probe(),
                _ = housekeeping.tick() => {
                    if ifindex(&self.target.interface) != Some(self.sockets.ifindex) {
                        return Err(ForeignError::InterfaceGone {
                            interface: self.target.interface.clone(),
                        });
                    }
                    self.suspects.expire();
                }
                // Spent for this second: what arrives meanwhile waits in (or overflows) the
                // socket's small buffer.
                () = tokio::time::sleep_until(refill), if !can_read => {}
                read = self.sockets.frames.recv(&mut buf), if can_read => match read {
                    Ok(len) => {
                        budget.left -= 1;
                        self.look_at(&buf[..len]);
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(source) => {
                        return Err(ForeignError::Socket {
                            interface: self.target.interface.clone(),
                            step: "read a frame",
                            source,
                            missing: Missing(None),
                        });
                    }
                },
            }
        }
    }

    /// Sends one DISCOVER with a fresh xid.
    fn probe(&mut self) {
        let xid = random_xid();
        let bytes = match discover(self.sockets.own_mac, xid) {
            Ok(bytes) => bytes,
            Err(error) => {
                warn!(%error, "probe DISCOVER not encoded");
                return;
            }
        };
        let to = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::BROADCAST, SERVER_PORT));
        match self.sockets.probes.send_to(&bytes, &to.into()) {
            Ok(_) => {
                self.probe_xid = Some(xid);
                self.counts.count_sent();
                debug!(xid = format_args!("{xid:#010x}"), "probe DISCOVER sent");
            }
            Err(error) => {
                self.counts.count_failed();
                debug!(%error, "probe DISCOVER not sent");
            }
        }
    }

    /// Records the frame's sender if it is a foreign server's reply.
    fn look_at(&self, frame: &[u8]) {
        let Some(reply) = read_reply(frame) else {
            return;
        };
        let own = Own {
            mac: self.sockets.own_mac,
            server_ip: self.target.server_ip,
        };
        let Some(sighting) = judge(&reply, own, self.probe_xid) else {
            return;
        };
        let ip = sighting.ip.map(std::net::IpAddr::V4);
        let pool = &self.target.pool;
        if self
            .suspects
            .peer(pool, sighting.mac, ip, &sighting.detail)
            .is_some()
        {
            return;
        }
        let news = self.suspects.record(
            pool,
            SuspectKind::ForeignDhcpServer,
            sighting.mac,
            ip,
            &sighting.detail,
        );
        let server = IpField(sighting.ip);
        if news {
            warn!(mac = %sighting.mac, %server, detail = %sighting.detail, "foreign DHCP server on the pool's network");
        } else {
            debug!(mac = %sighting.mac, %server, detail = %sighting.detail, "foreign DHCP server seen again");
        }
    }
}

/// Waits for the next tick of `interval`, or forever without one.
async fn tick(interval: &mut Option<tokio::time::Interval>) {
    match interval {
        Some(i) => {
            i.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// An address for log fields, `-` when unknown.
struct IpField(Option<Ipv4Addr>);

impl std::fmt::Display for IpField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(ip) => ip.fmt(f),
            None => f.write_str("-"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dhcproto::Decodable;

    const OWN_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const SERVER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
    const ROGUE_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0x0e, 0x0e]);
    const ROGUE: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 7);
    const VM: MacAddr = MacAddr([2, 0, 0, 0, 1, 0x0a]);

    fn own() -> Own {
        Own {
            mac: OWN_MAC,
            server_ip: SERVER,
        }
    }

    /// A server's reply as a frame: Ethernet from `eth`, IPv4 from `ip`, UDP 67 → 68.
    fn reply_frame(
        eth: MacAddr,
        ip: Ipv4Addr,
        kind: MessageType,
        server_id: Option<Ipv4Addr>,
        xid: u32,
        chaddr: MacAddr,
    ) -> Vec<u8> {
        let u = Ipv4Addr::UNSPECIFIED;
        let mut m =
            Message::new_with_id(xid, u, Ipv4Addr::new(192, 0, 2, 50), u, u, &chaddr.octets());
        m.set_opcode(dhcproto::v4::Opcode::BootReply);
        m.opts_mut().insert(DhcpOption::MessageType(kind));
        if let Some(id) = server_id {
            m.opts_mut().insert(DhcpOption::ServerIdentifier(id));
        }
        let dhcp = m.to_vec().unwrap();
        let udp_len = u16::try_from(8 + dhcp.len()).unwrap();
        let mut f = Vec::new();
        f.extend_from_slice(&[0xff; 6]);
        f.extend_from_slice(&eth.octets());
        f.extend_from_slice(&ETH_P_IP.to_be_bytes());
        f.extend_from_slice(&[0x45, 0]);
        f.extend_from_slice(&(20 + udp_len).to_be_bytes());
        f.extend_from_slice(&[0, 0, 0, 0, 64, IPPROTO_UDP, 0, 0]);
        f.extend_from_slice(&ip.octets());
        f.extend_from_slice(&Ipv4Addr::BROADCAST.octets());
        f.extend_from_slice(&SERVER_PORT.to_be_bytes());
        f.extend_from_slice(&CLIENT_PORT.to_be_bytes());
        f.extend_from_slice(&udp_len.to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(&dhcp);
        f
    }

    #[test]
    fn a_foreign_servers_replies_are_read_with_their_sender_and_ours_are_not_reported() {
        let offer = reply_frame(ROGUE_MAC, ROGUE, MessageType::Offer, Some(ROGUE), 7, VM);
        let reply = read_reply(&offer).unwrap();
        assert_eq!(
            reply,
            ServerReply {
                kind: ReplyKind::Offer,
                eth_source: ROGUE_MAC,
                ip_source: ROGUE,
                server_id: Some(ROGUE),
                xid: 7,
                yiaddr: Ipv4Addr::new(192, 0, 2, 50),
                chaddr: VM,
            }
        );
        let seen = judge(&reply, own(), Some(9)).unwrap();
        assert_eq!(
            seen,
            Sighting {
                mac: ROGUE_MAC,
                ip: Some(ROGUE),
                detail: "offered 192.0.2.50 to 02:00:00:00:01:0a".into(),
            }
        );
        // Its answer to our probe says so.
        let answer = reply_frame(
            ROGUE_MAC,
            ROGUE,
            MessageType::Offer,
            Some(ROGUE),
            9,
            OWN_MAC,
        );
        let seen = judge(&read_reply(&answer).unwrap(), own(), Some(9)).unwrap();
        assert_eq!(
            seen.detail,
            "offered 192.0.2.50 in answer to the agent's probe"
        );
        // ACK and NAK count too; without option 54 the IP source names the server.
        for (kind, detail) in [
            (
                MessageType::Ack,
                "acknowledged 192.0.2.50 for 02:00:00:00:01:0a",
            ),
            (MessageType::Nak, "refused 02:00:00:00:01:0a (NAK)"),
        ] {
            let frame = reply_frame(ROGUE_MAC, ROGUE, kind, None, 1, VM);
            let seen = judge(&read_reply(&frame).unwrap(), own(), None).unwrap();
            assert_eq!((seen.ip, seen.detail.as_str()), (Some(ROGUE), detail));
        }
        // Ours: our server identifier (whoever sends it), our MAC, or our address.
        for frame in [
            reply_frame(ROGUE_MAC, ROGUE, MessageType::Offer, Some(SERVER), 1, VM),
            reply_frame(OWN_MAC, ROGUE, MessageType::Offer, Some(ROGUE), 1, VM),
            reply_frame(ROGUE_MAC, SERVER, MessageType::Offer, None, 1, VM),
        ] {
            assert_eq!(judge(&read_reply(&frame).unwrap(), own(), None), None);
        }
        // A server that gives no address at all is still reported, by its MAC.
        let frame = reply_frame(
            ROGUE_MAC,
            Ipv4Addr::UNSPECIFIED,
            MessageType::Offer,
            None,
            1,
            VM,
        );
        assert_eq!(
            judge(&read_reply(&frame).unwrap(), own(), None).unwrap().ip,
            None
        );
    }

    #[test]
    fn anything_but_a_server_reply_is_not_read_and_nothing_panics() {
        let good = reply_frame(ROGUE_MAC, ROGUE, MessageType::Offer, Some(ROGUE), 7, VM);
        // Every truncation, and every single-byte corruption of the headers.
        for len in 0..good.len() {
            let _ = read_reply(&good[..len]);
        }
        for at in 0..(14 + 20 + 8 + 240) {
            for value in [0u8, 1, 0x7f, 0xff] {
                let mut bad = good.clone();
                bad[at] = value;
                let _ = read_reply(&bad);
            }
        }
        // Client messages, other ports, other protocols, fragments: none.
        let request = reply_frame(ROGUE_MAC, ROGUE, MessageType::Request, None, 1, VM);
        assert_eq!(read_reply(&request), None);
        let mut other_port = good.clone();
        other_port[14 + 20 + 2..14 + 20 + 4].copy_from_slice(&67u16.to_be_bytes());
        assert_eq!(read_reply(&other_port), None);
        let mut tcp = good.clone();
        tcp[14 + 9] = 6;
        assert_eq!(read_reply(&tcp), None);
        let mut fragment = good.clone();
        fragment[14 + 6] = 0x20; // more fragments follow
        assert_eq!(read_reply(&fragment), None);
        let mut bootrequest = good.clone();
        bootrequest[14 + 20 + 8] = 1;
        assert_eq!(read_reply(&bootrequest), None);
        // An option running past the end of the datagram.
        let mut runaway = good.clone();
        let end = runaway.iter().rposition(|b| *b == 255).unwrap();
        runaway.truncate(end);
        runaway.extend_from_slice(&[61, 200, 1]);
        assert_eq!(read_reply(&runaway), None);
    }

    #[test]
    fn the_probe_is_a_broadcast_discover_from_the_interfaces_mac() {
        let bytes = discover(OWN_MAC, 0xdead_beef).unwrap();
        let m = Message::from_bytes(&bytes).unwrap();
        assert_eq!(m.opcode(), dhcproto::v4::Opcode::BootRequest);
        assert_eq!(m.chaddr(), OWN_MAC.octets());
        assert_eq!(m.xid(), 0xdead_beef);
        assert!(m.flags().broadcast());
        assert_eq!(m.opts().msg_type(), Some(MessageType::Discover));
        assert_ne!(random_xid(), random_xid());
    }

    /// Runs a classic BPF program the way the kernel does, for the instructions [`filter`] uses;
    /// returns how many bytes the socket would get (0: dropped).
    fn run_filter(program: &[libc::sock_filter], frame: &[u8], ifindex: u32, pkttype: u32) -> u32 {
        let (mut a, mut x, mut pc) = (0u32, 0u32, 0usize);
        let load = |at: usize, size: usize| -> Option<u32> {
            let b = frame.get(at..at + size)?;
            Some(b.iter().fold(0u32, |acc, v| (acc << 8) | u32::from(*v)))
        };
        loop {
            let i = program[pc];
            pc += 1;
            let k = i.k as usize;
            let loaded = match i.code {
                BPF_LD_W_ABS if i.k == AD_IFINDEX => Some(ifindex),
                BPF_LD_W_ABS if i.k == AD_PKTTYPE => Some(pkttype),
                BPF_LD_W_ABS => load(k, 4),
                BPF_LD_H_ABS => load(k, 2),
                BPF_LD_B_ABS => load(k, 1),
                BPF_LD_H_IND => load(x as usize + k, 2),
                BPF_LDX_B_MSH => {
                    match load(k, 1) {
                        Some(v) => x = (v & 0xf) * 4,
                        None => return 0,
                    }
                    continue;
                }
                BPF_JEQ_K | BPF_JGT_K | BPF_JSET_K => {
                    let taken = match i.code {
                        BPF_JEQ_K => a == i.k,
                        BPF_JGT_K => a > i.k,
                        _ => a & i.k != 0,
                    };
                    pc += usize::from(if taken { i.jt } else { i.jf });
                    continue;
                }
                BPF_RET => return i.k,
                other => panic!("opcode {other:#x} not used by the filter"),
            };
            // A load past the end of the frame drops it, as in the kernel.
            match loaded {
                Some(v) => a = v,
                None => return 0,
            }
        }
    }

    #[test]
    fn the_kernel_filter_passes_only_replies_received_on_the_interface() {
        let good = reply_frame(ROGUE_MAC, ROGUE, MessageType::Offer, Some(ROGUE), 7, VM);
        let program = program(4);
        assert_eq!(filter(4).len(), program.len());
        let pass =
            |frame: &[u8], ifindex, pkttype| run_filter(&program, frame, ifindex, pkttype) > 0;
        assert!(pass(&good, 4, 1), "broadcast on the interface");
        assert!(
            pass(&good, 4, 0) && pass(&good, 4, 3),
            "to us, or to another host"
        );
        assert!(!pass(&good, 5, 1), "another interface");
        assert!(
            !pass(&good, 4, 4) && !pass(&good, 4, 5),
            "sent or looped back by us"
        );
        let mut request = good.clone();
        request[14 + 20..14 + 20 + 4].copy_from_slice(&[0, 68, 0, 67]);
        assert!(!pass(&request, 4, 1), "client to server");
        let mut fragment = good.clone();
        fragment[14 + 7] = 1;
        assert!(!pass(&fragment, 4, 1), "a later fragment");
        let mut arp = good.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert!(!pass(&arp, 4, 1));
        // Options in the IP header move the UDP header: still found.
        let mut with_options = good[..14].to_vec();
        with_options.push(0x46);
        with_options.extend_from_slice(&good[15..34]);
        with_options.extend_from_slice(&[1, 1, 1, 0]);
        with_options.extend_from_slice(&good[34..]);
        assert!(pass(&with_options, 4, 1));
        assert!(read_reply(&with_options).is_some());
    }
}
