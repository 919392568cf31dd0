//! Hosts on the pools' networks that this agent found acting where they should not: another
//! DHCP server (of either family) answering on a pool's network ([`crate::dhcp::foreign`],
//! [`crate::dhcp6::server`]), a host answering ARP or Neighbor Solicitations for addresses that
//! are not its own. The serving agent records what it sees here; the report carries each pool's
//! current suspects to the controller, which turns them into the pool's `ForeignDHCPServer`,
//! `ProxyARPResponder` and `ProxyNDPResponder` conditions, and `/metrics` counts them.
//!
//! A suspect is kept while it keeps showing itself: one not seen again for `forget_after`
//! ([`FORGET_AFTER`] unless set) is forgotten, which is how a condition clears once the host
//! stops. Bounded whatever the network does (any host can forge frames in any MAC's name): at
//! most [`MAX_PER_POOL`] suspects per pool, the one seen least recently going first, details cut
//! to [`MAX_DETAIL`] bytes, and the pools no longer served dropped with their suspects.
//!
//! DHCP servers the operator names as peers ([`KnownServers`]: another cluster's agent on the
//! same VLAN, an external server with disjoint reservations) are not suspects: their answers are
//! counted per pool and logged once, never reported as `ForeignDHCPServer`.
//!
//! It records and forgets; it sends nothing and decides nothing about serving.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::str::FromStr;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::watch;
use tracing::info;
use vmdhcp_core::{MacAddr, NamespacedName};

/// Most suspects kept (and reported) per pool; the wire contract says the same.
pub const MAX_PER_POOL: usize = 16;
/// Longest detail kept, in bytes (the controller keeps no more either).
pub const MAX_DETAIL: usize = 256;
/// How long a suspect is kept after it was last seen, unless set otherwise: long enough to
/// span several probes for foreign DHCP servers ([`crate::dhcp::foreign::PROBE_INTERVAL`]),
/// so that one lost answer does not clear a condition that is still true.
pub const FORGET_AFTER: Duration = Duration::from_secs(120);

/// Most peer servers that may be named: each is one lookup per foreign reply, and the list
/// comes from one environment variable.
pub const MAX_KNOWN_SERVERS: usize = 64;

/// What is wrong with a list of known DHCP servers.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KnownServersError {
    /// An entry is neither an IP address nor a MAC.
    #[error(
        "known DHCP server {entry:?} is neither an IP address (192.0.2.7, fd00::7) nor a MAC \
         (02:00:00:00:0e:0e)"
    )]
    Entry {
        /// The entry as given.
        entry: String,
    },
    /// More entries than [`MAX_KNOWN_SERVERS`].
    #[error("{count} known DHCP servers named; at most {MAX_KNOWN_SERVERS}")]
    TooMany {
        /// How many were named.
        count: usize,
    },
}

/// The other DHCP servers that share the pools' networks by design (harvester#8225: two
/// clusters on one VLAN; an external server with disjoint reservations), each named by the
/// address it answers from (its server identifier, the DHCPv6 source) or by its MAC. An answer
/// whose Ethernet source or server address is named here is a peer's, not a foreign server's.
///
/// Either the MAC or the address suffices. A name is a claim anyone on the network can make in a
/// forged frame, so a tenant could hide a rogue server behind a peer's name: that only keeps a
/// report quiet and never changes what this agent serves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KnownServers {
    macs: BTreeSet<MacAddr>,
    ips: BTreeSet<IpAddr>,
}

impl KnownServers {
    /// Whether `mac` or `ip` names a known server.
    pub fn names(&self, mac: MacAddr, ip: Option<IpAddr>) -> bool {
        self.macs.contains(&mac) || ip.is_some_and(|ip| self.ips.contains(&ip))
    }
}

impl FromStr for KnownServers {
    type Err = KnownServersError;

    /// Entries separated by commas or white space; empty: none.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let entries: Vec<&str> = text
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|e| !e.is_empty())
            .collect();
        if entries.len() > MAX_KNOWN_SERVERS {
            return Err(KnownServersError::TooMany {
                count: entries.len(),
            });
        }
        let mut known = KnownServers::default();
        for entry in entries {
            if let Ok(ip) = entry.parse::<IpAddr>() {
                known.ips.insert(ip);
            } else if let Ok(mac) = entry.parse::<MacAddr>() {
                known.macs.insert(mac);
            } else {
                return Err(KnownServersError::Entry {
                    entry: truncate(entry, 64).to_owned(),
                });
            }
        }
        Ok(known)
    }
}

/// What was heard from the known servers on one pool's network.
#[derive(Debug, Default)]
struct PeerLog {
    /// Answers heard.
    replies: u64,
    /// The names (MACs and addresses of [`KnownServers`]) heard at least once, so that each is
    /// logged once: bounded by the list, whatever the frames claim.
    heard: BTreeSet<(Option<MacAddr>, Option<IpAddr>)>,
}

/// What a suspect host was found doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SuspectKind {
    /// It answers DHCP on the pool's network (an OFFER, ACK or NAK from a server that is not
    /// the pool's).
    ForeignDhcpServer,
    /// It answers ARP for many addresses that are not its own.
    ProxyArpResponder,
    /// It answers Neighbor Solicitations for many IPv6 addresses that are not its own.
    ProxyNdpResponder,
}

impl SuspectKind {
    /// Every kind, for metrics that list zero counts too.
    pub const ALL: [SuspectKind; 3] = [
        SuspectKind::ForeignDhcpServer,
        SuspectKind::ProxyArpResponder,
        SuspectKind::ProxyNdpResponder,
    ];

    /// Stable label for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            SuspectKind::ForeignDhcpServer => "foreign_dhcp_server",
            SuspectKind::ProxyArpResponder => "proxy_arp_responder",
            SuspectKind::ProxyNdpResponder => "proxy_ndp_responder",
        }
    }
}

/// One suspect host as currently known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Suspect {
    /// What it was found doing.
    pub kind: SuspectKind,
    /// Its hardware address (the Ethernet source of what it sent).
    pub mac: MacAddr,
    /// The address it speaks for (a DHCP server's identifier, a DHCPv6 server's source), when
    /// known.
    pub ip: Option<IpAddr>,
    /// What was last seen, for people.
    pub detail: String,
    /// When it was last seen.
    pub last_seen: Instant,
}

/// What is kept of one suspect (its kind and MAC are the key).
#[derive(Clone, Debug)]
struct Entry {
    ip: Option<IpAddr>,
    detail: String,
    last_seen: Instant,
}

type Key = (SuspectKind, MacAddr);
type ByPool = HashMap<NamespacedName, BTreeMap<Key, Entry>>;

/// The suspects of every pool; writers bump a generation the report follows.
#[derive(Debug)]
pub struct Suspects {
    forget_after: Duration,
    by_pool: Mutex<ByPool>,
    changed: watch::Sender<u64>,
    known: KnownServers,
    peers: Mutex<HashMap<NamespacedName, PeerLog>>,
}

impl Default for Suspects {
    fn default() -> Self {
        Suspects::new(FORGET_AFTER)
    }
}

impl Suspects {
    /// An empty registry that forgets a suspect `forget_after` after it was last seen.
    pub fn new(forget_after: Duration) -> Self {
        Suspects {
            forget_after,
            by_pool: Mutex::default(),
            changed: watch::Sender::new(0),
            known: KnownServers::default(),
            peers: Mutex::default(),
        }
    }

    /// The same registry, with `known` as the peer servers whose answers are no suspects.
    pub fn knowing(mut self, known: KnownServers) -> Self {
        self.known = known;
        self
    }

    /// Whether an answering DHCP server (of either family), `mac` speaking for `ip`, is a known
    /// peer on `pool`'s network: `None` if not (a suspect then), else whether this is the first
    /// time that peer was heard there, which is logged. Counts the answer.
    pub fn peer(
        &self,
        pool: &NamespacedName,
        mac: MacAddr,
        ip: Option<IpAddr>,
        detail: &str,
    ) -> Option<bool> {
        if !self.known.names(mac, ip) {
            return None;
        }
        // The key is the part of the frame the list names, so the set stays within the list.
        let name = (
            self.known.macs.contains(&mac).then_some(mac),
            ip.filter(|ip| self.known.ips.contains(ip)),
        );
        let first = {
            let mut peers = self.peers.lock();
            let log = peers.entry(pool.clone()).or_default();
            log.replies = log.replies.saturating_add(1);
            log.heard.insert(name)
        };
        if first {
            info!(%pool, %mac, server = ip.map(tracing::field::display), detail, "known peer DHCP server on the pool's network");
        }
        Some(first)
    }

    /// Answers heard from known peers, per pool, for `/metrics`.
    pub fn peer_replies(&self) -> Vec<(NamespacedName, u64)> {
        let mut list: Vec<_> = self
            .peers
            .lock()
            .iter()
            .map(|(pool, log)| (pool.clone(), log.replies))
            .collect();
        list.sort();
        list
    }

    /// How long a suspect is kept after it was last seen.
    pub fn forget_after(&self) -> Duration {
        self.forget_after
    }

    /// Records that `mac` was seen acting as `kind` on `pool`'s network. Returns whether it is
    /// news (not known, or known for another address): only news wakes the report, so a busy
    /// rogue server costs no report per frame. A pool at [`MAX_PER_POOL`] forgets the suspect it
    /// saw least recently first.
    pub fn record(
        &self,
        pool: &NamespacedName,
        kind: SuspectKind,
        mac: MacAddr,
        ip: Option<IpAddr>,
        detail: &str,
    ) -> bool {
        self.record_at(pool, kind, mac, ip, detail, Instant::now())
    }

    fn record_at(
        &self,
        pool: &NamespacedName,
        kind: SuspectKind,
        mac: MacAddr,
        ip: Option<IpAddr>,
        detail: &str,
        now: Instant,
    ) -> bool {
        let detail = truncate(detail, MAX_DETAIL).to_owned();
        let news = {
            let mut all = self.by_pool.lock();
            let entries = all.entry(pool.clone()).or_default();
            let mut news = self.prune(entries, now);
            let key = (kind, mac);
            match entries.get_mut(&key) {
                Some(entry) => {
                    news |= entry.ip != ip;
                    *entry = Entry {
                        ip,
                        detail,
                        last_seen: now,
                    };
                }
                None => {
                    if entries.len() >= MAX_PER_POOL {
                        let stalest = entries
                            .iter()
                            .min_by_key(|(_, e)| e.last_seen)
                            .map(|(k, _)| *k);
                        if let Some(stalest) = stalest {
                            entries.remove(&stalest);
                        }
                    }
                    entries.insert(
                        key,
                        Entry {
                            ip,
                            detail,
                            last_seen: now,
                        },
                    );
                    news = true;
                }
            }
            news
        };
        if news {
            self.bump();
        }
        news
    }

    /// The suspects of `pool` seen within `forget_after`, by kind then MAC; older ones are
    /// forgotten on the way.
    pub fn current(&self, pool: &NamespacedName) -> Vec<Suspect> {
        self.current_at(pool, Instant::now())
    }

    fn current_at(&self, pool: &NamespacedName, now: Instant) -> Vec<Suspect> {
        let (list, pruned) = {
            let mut all = self.by_pool.lock();
            let Some(entries) = all.get_mut(pool) else {
                return Vec::new();
            };
            let pruned = self.prune(entries, now);
            let list = entries
                .iter()
                .map(|((kind, mac), e)| Suspect {
                    kind: *kind,
                    mac: *mac,
                    ip: e.ip,
                    detail: e.detail.clone(),
                    last_seen: e.last_seen,
                })
                .collect();
            (list, pruned)
        };
        if pruned {
            self.bump();
        }
        list
    }

    /// How many suspects of each kind every pool has now (pools with none are left out), for
    /// `/metrics`; older ones are forgotten on the way.
    pub fn counts(&self) -> Vec<(NamespacedName, SuspectKind, usize)> {
        self.counts_at(Instant::now())
    }

    fn counts_at(&self, now: Instant) -> Vec<(NamespacedName, SuspectKind, usize)> {
        let (counts, pruned) = {
            let mut all = self.by_pool.lock();
            let mut pruned = false;
            let mut counts = Vec::new();
            for (pool, entries) in all.iter_mut() {
                pruned |= self.prune(entries, now);
                for kind in SuspectKind::ALL {
                    let n = entries.keys().filter(|(k, _)| *k == kind).count();
                    if n > 0 {
                        counts.push((pool.clone(), kind, n));
                    }
                }
            }
            all.retain(|_, entries| !entries.is_empty());
            (counts, pruned)
        };
        if pruned {
            self.bump();
        }
        counts
    }

    /// Forgets every suspect not seen within `forget_after` (called periodically, so that a
    /// suspect clears even when nothing reads it).
    pub fn expire(&self) {
        self.counts();
    }

    /// Forgets the suspects of pools `keep` rejects (no longer served, or every pool when this
    /// agent stops serving: a standby reports none).
    pub fn retain_pools(&self, keep: impl Fn(&NamespacedName) -> bool) {
        let removed = {
            let mut all = self.by_pool.lock();
            let before: usize = all.values().map(BTreeMap::len).sum();
            all.retain(|pool, _| keep(pool));
            let after: usize = all.values().map(BTreeMap::len).sum();
            before != after
        };
        self.peers.lock().retain(|pool, _| keep(pool));
        if removed {
            self.bump();
        }
    }

    /// Changes whenever a suspect appears, changes address or is forgotten.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Drops the entries last seen `forget_after` or longer before `now`; whether any went.
    fn prune(&self, entries: &mut BTreeMap<Key, Entry>, now: Instant) -> bool {
        let before = entries.len();
        entries.retain(|_, e| now.saturating_duration_since(e.last_seen) < self.forget_after);
        entries.len() != before
    }

    fn bump(&self) {
        self.changed.send_modify(|g| *g = g.wrapping_add(1));
    }
}

/// The longest prefix of `text` of at most `max` bytes that ends on a character boundary.
pub use vmdhcp_core::text::truncate;

#[cfg(test)]
mod tests {
    use super::*;

    const ROGUE: MacAddr = MacAddr([2, 0, 0, 0, 0x0e, 0x0e]);
    const OTHER: MacAddr = MacAddr([2, 0, 0, 0, 0x0f, 0x0f]);

    fn pool(name: &str) -> NamespacedName {
        format!("default/{name}").parse().unwrap()
    }

    fn ip(n: u8) -> Option<IpAddr> {
        Some(std::net::Ipv4Addr::new(192, 0, 2, n).into())
    }

    #[test]
    fn a_suspect_is_news_once_kept_while_seen_and_forgotten_after_its_time() {
        let suspects = Suspects::new(Duration::from_secs(60));
        let (a, t0) = (pool("a"), Instant::now());
        let kind = SuspectKind::ForeignDhcpServer;
        let mut changes = suspects.subscribe();
        assert!(suspects.record_at(&a, kind, ROGUE, ip(7), "offered 192.0.2.50", t0));
        assert!(changes.has_changed().unwrap());
        changes.mark_unchanged();
        // Seen again with another detail: not news (no report per frame), but the detail and
        // the time move.
        let t1 = t0 + Duration::from_secs(50);
        assert!(!suspects.record_at(&a, kind, ROGUE, ip(7), "offered 192.0.2.51", t1));
        assert!(!changes.has_changed().unwrap());
        let now = suspects.current_at(&a, t1 + Duration::from_secs(30));
        assert_eq!(now.len(), 1, "seen 30 s ago: kept");
        assert_eq!(
            (now[0].kind, now[0].mac, now[0].ip, now[0].detail.as_str()),
            (kind, ROGUE, ip(7), "offered 192.0.2.51")
        );
        // Another address is news.
        assert!(suspects.record_at(&a, kind, ROGUE, ip(8), "", t1));
        assert!(changes.has_changed().unwrap());
        changes.mark_unchanged();
        // Not seen for the whole time: forgotten, and the report hears of it.
        assert!(
            suspects
                .current_at(&a, t1 + Duration::from_secs(60))
                .is_empty()
        );
        assert!(changes.has_changed().unwrap());
        assert!(suspects.current_at(&pool("b"), t1).is_empty());
    }

    #[test]
    fn kinds_and_macs_are_separate_suspects_and_a_pool_keeps_at_most_its_bound() {
        let suspects = Suspects::default();
        let (a, t0) = (pool("a"), Instant::now());
        suspects.record_at(&a, SuspectKind::ForeignDhcpServer, ROGUE, ip(7), "", t0);
        suspects.record_at(&a, SuspectKind::ProxyArpResponder, ROGUE, None, "", t0);
        suspects.record_at(&a, SuspectKind::ForeignDhcpServer, OTHER, ip(9), "", t0);
        let kinds: Vec<_> = suspects
            .current_at(&a, t0)
            .iter()
            .map(|s| (s.kind, s.mac))
            .collect();
        assert_eq!(
            kinds,
            [
                (SuspectKind::ForeignDhcpServer, ROGUE),
                (SuspectKind::ForeignDhcpServer, OTHER),
                (SuspectKind::ProxyArpResponder, ROGUE),
            ]
        );
        let mut counts = suspects.counts_at(t0);
        counts.sort();
        assert_eq!(
            counts,
            [
                (a.clone(), SuspectKind::ForeignDhcpServer, 2),
                (a.clone(), SuspectKind::ProxyArpResponder, 1),
            ]
        );

        // A flood of forged MACs: the bound holds, and the real rogue, seen again, is back.
        for n in 0..100u8 {
            let t = t0 + Duration::from_millis(u64::from(n) + 1);
            let forged = MacAddr([2, 0, 0, 1, 0, n]);
            suspects.record_at(&a, SuspectKind::ForeignDhcpServer, forged, None, "", t);
        }
        assert_eq!(suspects.current_at(&a, t0).len(), MAX_PER_POOL);
        let later = t0 + Duration::from_secs(1);
        suspects.record_at(&a, SuspectKind::ForeignDhcpServer, ROGUE, ip(7), "", later);
        let kept = suspects.current_at(&a, later);
        assert_eq!(kept.len(), MAX_PER_POOL);
        assert!(kept.iter().any(|s| s.mac == ROGUE));
    }

    #[test]
    fn details_are_cut_and_pools_no_longer_served_lose_their_suspects() {
        let suspects = Suspects::default();
        let (a, b) = (pool("a"), pool("b"));
        let long = "é".repeat(MAX_DETAIL);
        suspects.record(&a, SuspectKind::ForeignDhcpServer, ROGUE, None, &long);
        suspects.record(&b, SuspectKind::ForeignDhcpServer, ROGUE, None, "x");
        let detail = &suspects.current(&a)[0].detail;
        assert!(detail.len() <= MAX_DETAIL && detail.len() >= MAX_DETAIL - 1);
        let changes = suspects.subscribe();
        suspects.retain_pools(|p| *p == a);
        assert!(changes.has_changed().unwrap());
        assert_eq!(suspects.current(&a).len(), 1);
        assert!(suspects.current(&b).is_empty());
        suspects.retain_pools(|_| false);
        assert!(suspects.counts().is_empty());
    }

    #[test]
    fn known_servers_parse_addresses_and_macs_and_refuse_anything_else() {
        let known: KnownServers = "192.0.2.7, fd00::7\n02:00:00:00:0e:0e,,".parse().unwrap();
        assert!(known.names(OTHER, ip(7)));
        assert!(known.names(OTHER, Some("fd00::7".parse().unwrap())));
        assert!(known.names(ROGUE, None));
        assert!(!known.names(OTHER, ip(8)));
        assert_eq!("".parse::<KnownServers>().unwrap(), KnownServers::default());
        assert_eq!(
            "192.0.2.7,dhcp.example".parse::<KnownServers>(),
            Err(KnownServersError::Entry {
                entry: "dhcp.example".into()
            })
        );
        let many = vec!["192.0.2.1"; MAX_KNOWN_SERVERS + 1].join(",");
        let err = many.parse::<KnownServers>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "65 known DHCP servers named; at most 64",
            "{err:?}"
        );
    }

    #[test]
    fn a_known_peer_is_counted_and_logged_once_never_a_suspect() {
        let known: KnownServers = "192.0.2.7".parse().unwrap();
        let suspects = Suspects::default().knowing(known);
        let (a, b) = (pool("a"), pool("b"));
        let changes = suspects.subscribe();
        assert_eq!(suspects.peer(&a, ROGUE, ip(7), ""), Some(true));
        assert_eq!(suspects.peer(&a, ROGUE, ip(7), ""), Some(false));
        // Forged frames naming the peer's address from any MAC add no entries to log.
        for n in 0..100u8 {
            assert_eq!(
                suspects.peer(&a, MacAddr([2, 0, 0, 1, 0, n]), ip(7), ""),
                Some(false)
            );
        }
        assert_eq!(suspects.peer(&b, ROGUE, ip(7), ""), Some(true));
        assert_eq!(suspects.peer(&a, ROGUE, ip(8), ""), None);
        assert_eq!(suspects.peers.lock()[&a].heard.len(), 1);
        assert_eq!(suspects.peer_replies(), [(a.clone(), 102), (b.clone(), 1)]);
        assert!(suspects.current(&a).is_empty());
        assert!(!changes.has_changed().unwrap(), "a peer wakes no report");
        suspects.retain_pools(|p| *p == a);
        assert_eq!(suspects.peer_replies(), [(a, 102)]);
    }
}
