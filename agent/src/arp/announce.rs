//! The announcement tasks (one bounded task per interface, cancelled when the interface is given
//! up, on step-down and on shutdown) and the counters of the frames they and the probes send.

use super::*;

/// Frames sent and frames the kernel refused on one interface.
#[derive(Debug, Default)]
pub struct Counts {
    pub(super) sent: AtomicU64,
    pub(super) failed: AtomicU64,
}

impl Counts {
    /// Counts a frame sent.
    pub fn count_sent(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a frame the kernel refused (or that could not be made).
    pub fn count_failed(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }
}

/// One interface's counts, as `/metrics` reads them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendReading {
    /// The interface.
    pub interface: String,
    /// The pool served there.
    pub pool: String,
    /// Frames sent.
    pub sent: u64,
    /// Frames the kernel refused.
    pub failed: u64,
}

/// Sent/failed counts per interface, for whatever one task per served interface sends (ARP
/// announcements here, the foreign-DHCP probe's DISCOVERs); cheap to clone, read at scrape
/// time.
#[derive(Clone, Debug, Default)]
pub struct SendCounters(Arc<Mutex<PerInterface>>);

/// Interface → the pool served there and its counts.
pub(super) type PerInterface = BTreeMap<String, (NamespacedName, Arc<Counts>)>;

impl SendCounters {
    /// Every interface's counts.
    pub fn read(&self) -> Vec<SendReading> {
        self.0
            .lock()
            .iter()
            .map(|(interface, (pool, counts))| SendReading {
                interface: interface.clone(),
                pool: pool.to_string(),
                sent: counts.sent.load(Ordering::Relaxed),
                failed: counts.failed.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// The counts of `interface` serving `pool` (new, or reset when the pool changed).
    pub fn entry(&self, interface: &str, pool: &NamespacedName) -> Arc<Counts> {
        let mut interfaces = self.0.lock();
        match interfaces.get(interface) {
            Some((p, counts)) if p == pool => Arc::clone(counts),
            _ => {
                let counts = Arc::new(Counts::default());
                interfaces.insert(interface.to_owned(), (pool.clone(), Arc::clone(&counts)));
                counts
            }
        }
    }

    /// Forgets `interface`'s counts (its series leave `/metrics`).
    pub fn remove(&self, interface: &str) {
        self.0.lock().remove(interface);
    }

    /// Forgets the counts of every interface `keep` rejects.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.0.lock().retain(|name, _| keep(name));
    }
}

/// The announcement counters of every served interface and whether announcements are possible
/// at all; cheap to clone, read at scrape time.
#[derive(Clone, Debug, Default)]
pub struct ArpCounters {
    enabled: Arc<AtomicBool>,
    interfaces: SendCounters,
}

impl ArpCounters {
    /// Whether the packet socket is open (false: CAP_NET_RAW is missing, nothing is announced).
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Every interface's counters.
    pub fn read(&self) -> Vec<SendReading> {
        self.interfaces.read()
    }

    /// Adds to `interface`'s counts, as an announcement task would (tests elsewhere in the crate).
    #[cfg(test)]
    pub(crate) fn record(&self, interface: &str, pool: &NamespacedName, sent: u64, failed: u64) {
        let counts = self.interfaces.entry(interface, pool);
        counts.sent.fetch_add(sent, Ordering::Relaxed);
        counts.failed.fetch_add(failed, Ordering::Relaxed);
    }
}

/// Sends the announcements: one bounded background task per interface taken over, so that
/// serving DHCP never waits for them.
#[derive(Debug)]
pub struct Announcer {
    /// `None`: announcements are disabled (no packet socket).
    socket: Option<Arc<Socket>>,
    tasks: BTreeMap<String, JoinHandle<()>>,
    counters: ArpCounters,
}

impl Announcer {
    /// Opens the packet socket. It is opened once, at start, so that a missing CAP_NET_RAW is
    /// reported once and up front rather than at every takeover.
    pub fn open() -> Result<Self, ArpError> {
        let socket = open_socket()?;
        let counters = ArpCounters::default();
        counters.enabled.store(true, Ordering::Relaxed);
        Ok(Announcer {
            socket: Some(Arc::new(socket)),
            tasks: BTreeMap::new(),
            counters,
        })
    }

    /// Announces nothing (interfaces are not configured by this agent, or no CAP_NET_RAW).
    pub fn disabled() -> Self {
        Announcer {
            socket: None,
            tasks: BTreeMap::new(),
            counters: ArpCounters::default(),
        }
    }

    /// [`Announcer::open`], or, when the socket cannot be opened, a warning that names the
    /// missing capability and [`Announcer::disabled`]: serving DHCP matters more than speeding
    /// up clients' ARP caches after a failover, so this is not fatal.
    pub fn open_or_warn() -> Self {
        match Announcer::open() {
            Ok(announcer) => announcer,
            Err(error) => {
                warn!(
                    %error,
                    "ARP announcements disabled: after a failover, clients renew by unicast with \
                     the new leader only once their ARP entry for the server address expires"
                );
                Announcer::disabled()
            }
        }
    }

    /// The counters, for `/metrics`.
    pub fn counters(&self) -> ArpCounters {
        self.counters.clone()
    }

    /// Starts announcing `ip` on `interface` (which serves `pool`) in the background, replacing
    /// an announcement of the same family still running there: ARP for an IPv4 address,
    /// Neighbor Advertisements for an IPv6 one. Must be called inside a Tokio runtime.
    pub fn announce(&mut self, interface: &str, pool: &NamespacedName, ip: impl Into<IpAddr>) {
        let Some(socket) = self.socket.clone() else {
            return;
        };
        let ip = ip.into();
        let key = task_key(interface, &ip);
        if let Some(task) = self.tasks.remove(&key) {
            task.abort();
        }
        let counts = self.counters.interfaces.entry(interface, pool);
        let span = info_span!("arp_announce", interface, pool = %pool, ip = %ip);
        let task =
            tokio::spawn(announce(socket, interface.to_owned(), ip, counts).instrument(span));
        self.tasks.insert(key, task);
    }

    /// Stops the announcements running on `interface`, both families, if any (its addresses
    /// are being given up).
    pub fn cancel(&mut self, interface: &str) {
        for key in [interface.to_owned(), format!("{interface}{V6_TASK}")] {
            if let Some(task) = self.tasks.remove(&key) {
                task.abort();
            }
        }
    }

    /// Stops every running announcement (step-down, shutdown).
    pub fn cancel_all(&mut self) {
        for (_, task) in std::mem::take(&mut self.tasks) {
            task.abort();
        }
    }

    /// Forgets the tasks that finished and the counters of interfaces `keep` rejects (their
    /// pools left), so that their series disappear from `/metrics`.
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.tasks.retain(|key, task| {
            keep(key.strip_suffix(V6_TASK).unwrap_or(key)) && !task.is_finished()
        });
        self.counters.interfaces.retain(keep);
    }

    /// Interfaces with an announcement still running.
    pub fn running(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .tasks
            .iter()
            .filter(|(_, task)| !task.is_finished())
            .map(|(key, _)| key.strip_suffix(V6_TASK).unwrap_or(key).to_owned())
            .collect();
        names.dedup();
        names
    }
}

impl Drop for Announcer {
    fn drop(&mut self) {
        self.cancel_all();
    }
}

/// The suffix of an interface's IPv6 announcement task among the tasks.
pub(super) const V6_TASK: &str = "/v6";

/// The task key of an announcement of `ip` on `interface`.
pub(super) fn task_key(interface: &str, ip: &IpAddr) -> String {
    match ip {
        IpAddr::V4(_) => interface.to_owned(),
        IpAddr::V6(_) => format!("{interface}{V6_TASK}"),
    }
}

/// An `AF_PACKET` raw socket that receives nothing (protocol 0) and never blocks a send.
pub(super) fn open_socket() -> Result<Socket, ArpError> {
    let err = |source: io::Error| ArpError::Socket {
        missing: Capability::NetRaw.lacking(&source),
        source,
    };
    let socket = Socket::new(Domain::PACKET, Type::RAW, None).map_err(err)?;
    socket.set_nonblocking(true).map_err(err)?;
    Ok(socket)
}

/// Sends [`ANNOUNCE_COUNT`] announcements of `ip` on `interface`, [`ANNOUNCE_INTERVAL`] apart.
pub(super) async fn announce(
    socket: Arc<Socket>,
    interface: String,
    ip: IpAddr,
    counts: Arc<Counts>,
) {
    let (index, mac) = match link(&interface) {
        Ok(link) => link,
        Err(error) => {
            counts.count_failed();
            warn!(%error, "server address not announced");
            return;
        }
    };
    let (frame, destination) = match ip {
        IpAddr::V4(ip) => (announcement(mac, ip).to_vec(), link_destination(index)),
        IpAddr::V6(ip) => (
            neighbor_advertisement(mac, ip).to_vec(),
            link_address(index, ETH_P_IPV6, ALL_NODES_MAC),
        ),
    };
    let destination = match destination {
        Ok(destination) => destination,
        Err(source) => {
            counts.count_failed();
            warn!(error = %ArpError::Send { interface, source }, "server address not announced");
            return;
        }
    };
    let mut sent = 0;
    for n in 1..=ANNOUNCE_COUNT {
        if n > 1 {
            tokio::time::sleep(ANNOUNCE_INTERVAL).await;
        }
        match socket.send_to(&frame, &destination) {
            Ok(_) => {
                sent += 1;
                counts.count_sent();
                debug!(%mac, n, "ARP announcement sent");
            }
            Err(source) => {
                counts.count_failed();
                let error = ArpError::Send {
                    interface: interface.clone(),
                    source,
                };
                warn!(%mac, n, %error, "ARP announcement not sent");
            }
        }
    }
    info!(%mac, sent, of = ANNOUNCE_COUNT, "server address announced");
}
