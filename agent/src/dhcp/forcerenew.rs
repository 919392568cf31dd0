//! DHCPFORCERENEW (RFC 3203) authenticated with a reconfigure key (RFC 6704): which clients of
//! one interface hold a key from this server, what each was last told, and the FORCERENEW that
//! sends a client back to renew once what it would be told has changed.
//!
//! A client that lists HMAC-MD5 in option 145 gets a key of its own in its ACK (option 90,
//! type 1); the handler leaves room for it ([`super::handler::KeySlot`]) and [`Keyed::acked`]
//! fills it in and records the client. When the pool's snapshot changes, [`Keyed::look`]
//! queues every keyed client whose answer changed (the pool's options, its address, host name
//! or own options); [`Keyed::due`] hands the FORCERENEWs out at most [`PER_SECOND`] a second,
//! each signed with the client's key (type 2), carrying the transaction of the ACK it answers
//! and a replay counter above any sent before. A client without a lease in the pool is
//! forgotten and sent nothing.
//!
//! Keys live in this replica's memory: after a failover the new leader keys each client again at
//! its next renewal, and until then a change reaches that client at T1, as it does a client
//! that takes no key.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use md5::Md5;
use ring::rand::{SecureRandom, SystemRandom};
use vmdhcp_core::MacAddr;

use super::handler::KeySlot;
use crate::lease_table::PoolSnapshot;

/// Option 90, Authentication (RFC 3118).
pub const AUTHENTICATION: u8 = 90;
/// Protocol 3: the reconfigure key (RFC 6704 §3.1).
const RECONFIGURE_KEY: u8 = 3;
/// Algorithm 1: HMAC-MD5, the one RFC 6704 defines.
const HMAC_MD5: u8 = 1;
/// Replay detection method 0: a strictly increasing counter.
const MONOTONIC: u8 = 0;
/// Authentication information of type 1 carries the key (in an ACK) …
const TYPE_KEY: u8 = 1;
/// … and of type 2 the HMAC of the message (in a FORCERENEW).
const TYPE_HMAC: u8 = 2;
const KEY_LEN: usize = 16;
/// Option 90's data: protocol, algorithm, RDM, the replay counter, the type, the key or HMAC.
const AUTH_LEN: u8 = 3 + 8 + 1 + KEY_LEN as u8;
/// Where the replay counter, the type and the key or HMAC sit in option 90's data.
const REPLAY_AT: usize = 3;
const TYPE_AT: usize = 11;
const VALUE_AT: usize = 12;
/// DHCPFORCERENEW's message type (RFC 3203).
const FORCERENEW: u8 = 9;
/// Most FORCERENEWs one interface sends a second: a pool edit reaches ten thousand keyed
/// clients in under two minutes, and no edit makes a storm of renewals.
pub const PER_SECOND: u32 = 100;
/// Most clients one interface remembers a key for; a client past it still gets a key in its
/// ACK but no FORCERENEW (its change comes at T1).
const MAX_KEYED: usize = 65_536;
/// The BOOTP header, the magic cookie, and the smallest message relays and clients take.
const OPTIONS_START: usize = 240;
const MIN_MESSAGE: usize = 300;
const MAGIC_COOKIE: [u8; 4] = [99, 130, 83, 99];

/// Why a client could not be keyed.
#[derive(Debug, thiserror::Error)]
pub enum ForcerenewError {
    /// The system's random source failed: the ACK goes without a key.
    #[error("no random key: the system's random source failed")]
    Random,
    /// The reply has no room where the handler said: a bug, reported rather than written.
    #[error("the ACK has no key option at byte {at}")]
    NoSlot {
        /// Where the handler said option 90's data starts.
        at: usize,
    },
}

/// Appends option 90 as an ACK carries a reconfigure key, with a zero replay counter and key for
/// [`Keyed::acked`] to fill in; returns where its data starts.
pub(crate) fn key_option(bytes: &mut Vec<u8>) -> usize {
    bytes.extend_from_slice(&[AUTHENTICATION, AUTH_LEN]);
    let at = bytes.len();
    bytes.extend_from_slice(&[RECONFIGURE_KEY, HMAC_MD5, MONOTONIC]);
    bytes.extend_from_slice(&[0; 8]);
    bytes.push(TYPE_KEY);
    bytes.extend_from_slice(&[0; KEY_LEN]);
    at
}

/// What every interface shares: the source of keys and the replay counter.
#[derive(Debug)]
pub struct Authority {
    random: SystemRandom,
    replay: AtomicU64,
}

impl Default for Authority {
    fn default() -> Self {
        Authority {
            random: SystemRandom::new(),
            replay: AtomicU64::new(0),
        }
    }
}

impl Authority {
    /// The next replay counter: nanoseconds since the epoch, so that a restarted or new leader
    /// starts above what its predecessor sent, and strictly above the last one handed out.
    fn next_replay(&self) -> u64 {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        let last = self
            .replay
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |last| {
                Some(now.max(last.saturating_add(1)))
            })
            .unwrap_or(0);
        now.max(last.saturating_add(1))
    }

    fn new_key(&self) -> Result<[u8; KEY_LEN], ForcerenewError> {
        let mut key = [0u8; KEY_LEN];
        self.random
            .fill(&mut key)
            .map_err(|_| ForcerenewError::Random)?;
        Ok(key)
    }
}

/// A keyed client, as its last ACK left it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Client {
    key: [u8; KEY_LEN],
    xid: u32,
    ip: Ipv4Addr,
    /// The digest of what it was told ([`Told`]).
    told: u64,
}

/// A FORCERENEW ready for the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forcerenew {
    /// The client's address: the message goes to port 68 there.
    pub ip: Ipv4Addr,
    /// The client's MAC, which the address must reach.
    pub mac: MacAddr,
    /// The signed message.
    pub bytes: Vec<u8>,
}

/// The keyed clients of one interface and the FORCERENEWs owed to them.
#[derive(Debug)]
pub struct Keyed {
    clients: HashMap<MacAddr, Client>,
    queue: VecDeque<MacAddr>,
    queued: HashSet<MacAddr>,
    /// The snapshot [`Keyed::look`] compared against last, and its pool's digest.
    seen: Option<(Arc<PoolSnapshot>, u64)>,
    tokens: u32,
    refilled: Instant,
}

impl Default for Keyed {
    fn default() -> Self {
        Keyed {
            clients: HashMap::new(),
            queue: VecDeque::new(),
            queued: HashSet::new(),
            seen: None,
            tokens: PER_SECOND,
            refilled: Instant::now(),
        }
    }
}

impl Keyed {
    /// Fills in the key of the ACK `bytes` to `mac` (its own key, the same across renewals) and
    /// a replay counter, and records the client with what it was told, from `pool`.
    pub fn acked(
        &mut self,
        authority: &Authority,
        mac: MacAddr,
        slot: KeySlot,
        bytes: &mut [u8],
        pool: &Arc<PoolSnapshot>,
    ) -> Result<(), ForcerenewError> {
        let data = bytes
            .get_mut(slot.at..slot.at + usize::from(AUTH_LEN))
            .ok_or(ForcerenewError::NoSlot { at: slot.at })?;
        let key = match self.clients.get(&mac) {
            Some(client) => client.key,
            None => authority.new_key()?,
        };
        data[REPLAY_AT..TYPE_AT].copy_from_slice(&authority.next_replay().to_be_bytes());
        data[VALUE_AT..].copy_from_slice(&key);
        if self.clients.len() >= MAX_KEYED && !self.clients.contains_key(&mac) {
            return Ok(());
        }
        let told = Told::of(self.pool_digest(pool), pool, mac);
        self.clients.insert(
            mac,
            Client {
                key,
                xid: slot.xid,
                ip: slot.ip,
                told,
            },
        );
        Ok(())
    }

    /// Compares `pool` with the snapshot seen last: every keyed client whose answer changed is
    /// queued for a FORCERENEW, and every one without a lease any more is forgotten. Costs one
    /// pointer comparison when nothing changed, and nothing while no client holds a key.
    pub fn look(&mut self, pool: &Arc<PoolSnapshot>) {
        if self.clients.is_empty()
            || self
                .seen
                .as_ref()
                .is_some_and(|(seen, _)| Arc::ptr_eq(seen, pool))
        {
            return;
        }
        let digest = self.pool_digest(pool);
        self.clients.retain(|mac, _| pool.address_of(mac).is_some());
        for (mac, client) in &self.clients {
            if Told::of(digest, pool, *mac) != client.told && self.queued.insert(*mac) {
                self.queue.push_back(*mac);
            }
        }
    }

    /// The FORCERENEWs due now, within [`PER_SECOND`], each from `server` and signed for its
    /// client; a client sent one is taken as told (its renewal keys it again).
    pub fn due(
        &mut self,
        authority: &Authority,
        server: Ipv4Addr,
        now: Instant,
    ) -> Vec<Forcerenew> {
        if self.queue.is_empty() {
            return Vec::new();
        }
        let elapsed = now.saturating_duration_since(self.refilled);
        let earned =
            u32::try_from(elapsed.as_millis() * u128::from(PER_SECOND) / 1000).unwrap_or(u32::MAX);
        if earned > 0 {
            self.tokens = self.tokens.saturating_add(earned).min(PER_SECOND);
            self.refilled = now;
        }
        let digest = self.seen.as_ref().map(|(_, d)| *d);
        let mut out = Vec::new();
        while self.tokens > 0 {
            let Some(mac) = self.queue.pop_front() else {
                break;
            };
            self.queued.remove(&mac);
            let (Some(client), Some((pool, _)), Some(digest)) =
                (self.clients.get_mut(&mac), self.seen.as_ref(), digest)
            else {
                continue;
            };
            client.told = Told::of(digest, pool, mac);
            if pool.address_of(&mac).is_none() {
                continue;
            }
            self.tokens -= 1;
            out.push(Forcerenew {
                // To the address the client holds: a moved lease is NAKed at the renewal.
                ip: client.ip,
                mac,
                bytes: message(server, mac, client, authority.next_replay()),
            });
        }
        out
    }

    /// How many clients hold a key from this interface.
    pub fn len(&self) -> usize {
        self.clients.len()
    }

    /// Whether no client holds a key from this interface.
    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }

    /// The digest of `pool`'s options, computed once per snapshot.
    fn pool_digest(&mut self, pool: &Arc<PoolSnapshot>) -> u64 {
        if let Some((seen, digest)) = &self.seen
            && Arc::ptr_eq(seen, pool)
        {
            return *digest;
        }
        let digest = options_digest(pool);
        self.seen = Some((Arc::clone(pool), digest));
        digest
    }
}

/// What a client's answer is made of, as one number: the pool's options, and the client's
/// address, host name and own options.
struct Told;

impl Told {
    fn of(pool_digest: u64, pool: &PoolSnapshot, mac: MacAddr) -> u64 {
        let mut h = DefaultHasher::new();
        pool_digest.hash(&mut h);
        pool.address_of(&mac).hash(&mut h);
        pool.host_name_of(&mac).hash(&mut h);
        pool.options_of(&mac).hash(&mut h);
        h.finish()
    }
}

/// The digest of what a pool's DHCPv4 answers carry: its config without what no answer shows
/// (the addresses found in conflict, the IPv6 side), and the NTP names resolved so far.
fn options_digest(pool: &PoolSnapshot) -> u64 {
    let mut config = (**pool.config()).clone();
    config.conflicted.clear();
    config.ipv6 = None;
    let mut h = DefaultHasher::new();
    // A config always serialises (plain data); were it not to, every change looks the same and
    // clients learn it at T1.
    serde_json::to_vec(&config).unwrap_or_default().hash(&mut h);
    pool.ntp_addresses().hash(&mut h);
    h.finish()
}

/// The FORCERENEW to `mac`: its last ACK's transaction, from `server`, authenticated with the
/// client's key: HMAC-MD5 over the whole message with the HMAC zero (and `hops` and `giaddr`,
/// which RFC 3118 §5 leaves out, zero as sent).
fn message(server: Ipv4Addr, mac: MacAddr, client: &Client, replay: u64) -> Vec<u8> {
    let mut b = vec![0u8; OPTIONS_START];
    b[0] = 2; // BOOTREPLY
    b[1] = 1; // Ethernet
    b[2] = 6;
    b[4..8].copy_from_slice(&client.xid.to_be_bytes());
    b[12..16].copy_from_slice(&client.ip.octets());
    b[28..34].copy_from_slice(&mac.0);
    b[236..240].copy_from_slice(&MAGIC_COOKIE);
    b.extend_from_slice(&[53, 1, FORCERENEW, 54, 4]);
    b.extend_from_slice(&server.octets());
    b.extend_from_slice(&[AUTHENTICATION, AUTH_LEN]);
    let at = b.len();
    b.extend_from_slice(&[RECONFIGURE_KEY, HMAC_MD5, MONOTONIC]);
    b.extend_from_slice(&replay.to_be_bytes());
    b.push(TYPE_HMAC);
    b.extend_from_slice(&[0; KEY_LEN]);
    b.push(255);
    b.resize(MIN_MESSAGE, 0);
    let hmac = hmac_md5(&client.key, &b);
    b[at + VALUE_AT..at + VALUE_AT + KEY_LEN].copy_from_slice(&hmac);
    b
}

fn hmac_md5(key: &[u8], message: &[u8]) -> [u8; KEY_LEN] {
    // HMAC takes a key of any length (`new_from_slice` never fails for it).
    let Ok(mut mac) = Hmac::<Md5>::new_from_slice(key) else {
        return [0; KEY_LEN];
    };
    mac.update(message);
    mac.finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use dhcproto::v4::{DhcpOption, Message, MessageType, OptionCode, UnknownOption};
    use dhcproto::{Decodable, Encodable};
    use vmdhcp_core::fixtures::pool_config;
    use vmdhcp_core::pool::{Binding, PoolConfig};

    use super::*;
    use crate::dhcp::handler::{Action, Reply, handle};
    use crate::lease_table::LeaseTable;
    use crate::pools::PoolLeases;

    const SERVER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);

    fn mac(n: u8) -> MacAddr {
        MacAddr([2, 0, 0, 0, 1, n])
    }

    fn ip(n: u8) -> Ipv4Addr {
        Ipv4Addr::new(192, 0, 2, n)
    }

    fn config(dns: Ipv4Addr) -> PoolConfig {
        let mut c = pool_config("default/a")
            .with_options()
            .with_lease_seconds(3600);
        c.dns = vec![dns];
        c
    }

    /// The table holding `clients` (MAC n → 192.0.2.n) with `config`.
    fn serve(table: &LeaseTable, config: PoolConfig, clients: &[u8]) -> Arc<PoolSnapshot> {
        let name = config.pool.clone();
        table.apply_snapshot(&[PoolLeases {
            config,
            leases: clients
                .iter()
                .map(|&n| (mac(n), Binding::ip(ip(n))))
                .collect(),
        }]);
        table.pool(&name).unwrap()
    }

    /// A REQUEST from client `n` renewing its address, with option 145 when `capable`.
    fn renewal(n: u8, xid: u32, capable: bool) -> Vec<u8> {
        let u = Ipv4Addr::UNSPECIFIED;
        let mut m = Message::new_with_id(xid, ip(n), u, u, u, &mac(n).0);
        m.opts_mut()
            .insert(DhcpOption::MessageType(MessageType::Request));
        if capable {
            m.opts_mut().insert(DhcpOption::Unknown(UnknownOption::new(
                OptionCode::from(145),
                vec![1],
            )));
        }
        m.to_vec().unwrap()
    }

    fn ack(pool: &PoolSnapshot, request: &[u8]) -> Reply {
        match handle(request, pool, |_| false).action {
            Action::Reply(r) => r,
            other => panic!("no reply: {other:?}"),
        }
    }

    fn auth_of(bytes: &[u8]) -> Vec<u8> {
        let m = Message::from_bytes(bytes).unwrap();
        match m.opts().get(OptionCode::from(AUTHENTICATION)) {
            Some(DhcpOption::Unknown(o)) => o.data().to_vec(),
            other => panic!("no option 90: {other:?}"),
        }
    }

    /// What dhcpcd does with a FORCERENEW: the HMAC over the message with the HMAC zeroed.
    fn verifies(message: &[u8], key: &[u8]) -> bool {
        let auth = auth_of(message);
        let hmac = &auth[VALUE_AT..];
        let at = message.windows(hmac.len()).position(|w| w == hmac).unwrap();
        let mut zeroed = message.to_vec();
        zeroed[at..at + KEY_LEN].fill(0);
        hmac_md5(key, &zeroed) == hmac
    }

    #[test]
    fn hmac_md5_is_rfc_2202_s() {
        assert_eq!(
            hmac_md5(&[0x0b; 16], b"Hi There"),
            [
                0x92, 0x94, 0x72, 0x7a, 0x36, 0x38, 0xbb, 0x1c, 0x13, 0xf4, 0x8e, 0xf8, 0x15, 0x8b,
                0xfc, 0x9d
            ]
        );
    }

    #[test]
    fn a_capable_client_s_ack_carries_its_own_key_and_others_none() {
        let table = LeaseTable::new();
        let pool = serve(&table, config(ip(53)), &[10, 11]);
        let authority = Authority::default();
        let mut keyed = Keyed::default();

        let plain = ack(&pool, &renewal(11, 7, false));
        assert_eq!(plain.key_slot, None);
        assert!(
            Message::from_bytes(&plain.bytes)
                .unwrap()
                .opts()
                .get(OptionCode::from(AUTHENTICATION))
                .is_none()
        );

        let mut first = ack(&pool, &renewal(10, 7, true));
        let slot = first.key_slot.unwrap();
        assert_eq!((slot.xid, slot.ip), (7, ip(10)));
        keyed
            .acked(&authority, mac(10), slot, &mut first.bytes, &pool)
            .unwrap();
        let auth = auth_of(&first.bytes);
        assert_eq!(auth.len(), usize::from(AUTH_LEN));
        assert_eq!(&auth[..3], &[RECONFIGURE_KEY, HMAC_MD5, MONOTONIC]);
        assert_eq!(auth[TYPE_AT], TYPE_KEY);
        let key = auth[VALUE_AT..].to_vec();
        assert_ne!(key, vec![0; KEY_LEN]);
        let replay = u64::from_be_bytes(auth[REPLAY_AT..TYPE_AT].try_into().unwrap());

        // The next renewal: the same key, a later counter, the new transaction.
        let mut second = ack(&pool, &renewal(10, 8, true));
        keyed
            .acked(
                &authority,
                mac(10),
                second.key_slot.unwrap(),
                &mut second.bytes,
                &pool,
            )
            .unwrap();
        let again = auth_of(&second.bytes);
        assert_eq!(&again[VALUE_AT..], key.as_slice());
        assert!(u64::from_be_bytes(again[REPLAY_AT..TYPE_AT].try_into().unwrap()) > replay);
        assert_eq!(keyed.clients[&mac(10)].xid, 8);
        assert_eq!(keyed.len(), 1);
    }

    #[test]
    fn a_changed_option_sends_each_keyed_client_a_signed_forcerenew_once() {
        let table = LeaseTable::new();
        let pool = serve(&table, config(ip(53)), &[10, 11, 12]);
        let authority = Authority::default();
        let mut keyed = Keyed::default();
        let mut keys = HashMap::new();
        for n in [10, 11] {
            let mut r = ack(&pool, &renewal(n, 100 + u32::from(n), true));
            keyed
                .acked(&authority, mac(n), r.key_slot.unwrap(), &mut r.bytes, &pool)
                .unwrap();
            keys.insert(mac(n), auth_of(&r.bytes)[VALUE_AT..].to_vec());
        }
        let now = Instant::now();
        keyed.look(&pool);
        assert!(
            keyed.due(&authority, SERVER, now).is_empty(),
            "nothing changed"
        );

        // The same options in a new snapshot (a lease of another client came): still nothing.
        let same = serve(&table, config(ip(53)), &[10, 11, 12, 13]);
        keyed.look(&same);
        assert!(keyed.due(&authority, SERVER, now).is_empty());

        // The DNS server changed: both keyed clients, none other, each signed with its key.
        let changed = serve(&table, config(ip(99)), &[10, 11, 12, 13]);
        keyed.look(&changed);
        let sent = keyed.due(&authority, SERVER, now);
        let mut to: Vec<_> = sent.iter().map(|f| (f.mac, f.ip)).collect();
        to.sort();
        assert_eq!(to, vec![(mac(10), ip(10)), (mac(11), ip(11))]);
        let mut replays = Vec::new();
        for f in &sent {
            let m = Message::from_bytes(&f.bytes).unwrap();
            assert_eq!(m.opts().msg_type(), Some(MessageType::ForceRenew));
            assert_eq!(m.xid(), 100 + u32::from(f.mac.0[5]));
            assert_eq!(&m.chaddr()[..6], &f.mac.0);
            assert_eq!(
                m.opts().get(OptionCode::ServerIdentifier),
                Some(&DhcpOption::ServerIdentifier(SERVER))
            );
            assert!(f.bytes.len() >= MIN_MESSAGE);
            let auth = auth_of(&f.bytes);
            assert_eq!(&auth[..3], &[RECONFIGURE_KEY, HMAC_MD5, MONOTONIC]);
            assert_eq!(auth[TYPE_AT], TYPE_HMAC);
            assert!(verifies(&f.bytes, &keys[&f.mac]));
            assert!(!verifies(&f.bytes, &[0; KEY_LEN]));
            replays.push(u64::from_be_bytes(
                auth[REPLAY_AT..TYPE_AT].try_into().unwrap(),
            ));
        }
        assert!(replays[1] > replays[0]);
        // Told once: looking again at the same change sends nothing more.
        keyed.look(&changed);
        assert!(keyed.due(&authority, SERVER, now).is_empty());
    }

    #[test]
    fn a_client_whose_lease_went_is_forgotten_and_one_whose_name_changed_is_told() {
        let table = LeaseTable::new();
        let pool = serve(&table, config(ip(53)), &[10, 11]);
        let authority = Authority::default();
        let mut keyed = Keyed::default();
        for n in [10, 11] {
            let mut r = ack(&pool, &renewal(n, 1, true));
            keyed
                .acked(&authority, mac(n), r.key_slot.unwrap(), &mut r.bytes, &pool)
                .unwrap();
        }
        // 11's lease went and the DNS server changed: only 10 is told, 11 forgotten.
        let changed = serve(&table, config(ip(99)), &[10]);
        keyed.look(&changed);
        let sent = keyed.due(&authority, SERVER, Instant::now());
        assert_eq!(
            sent.iter().map(|f| f.mac).collect::<Vec<_>>(),
            vec![mac(10)]
        );
        assert_eq!(keyed.len(), 1);

        // Its own host name is part of its answer too.
        let named = Binding {
            host_name: Some("vm-10".to_owned()),
            ..Binding::ip(ip(10))
        };
        table.apply_snapshot(&[PoolLeases {
            config: config(ip(99)),
            leases: [(mac(10), named)].into(),
        }]);
        let renamed = table.pool(&changed.config().pool).unwrap();
        keyed.look(&renamed);
        assert_eq!(keyed.due(&authority, SERVER, Instant::now()).len(), 1);
    }

    #[test]
    fn forcerenews_go_out_at_most_per_second_s_rate() {
        let table = LeaseTable::new();
        let clients: Vec<u8> = (2..=251).collect();
        let pool = serve(&table, config(ip(53)), &clients);
        let authority = Authority::default();
        let mut keyed = Keyed::default();
        for &n in &clients {
            let mut r = ack(&pool, &renewal(n, 1, true));
            keyed
                .acked(&authority, mac(n), r.key_slot.unwrap(), &mut r.bytes, &pool)
                .unwrap();
        }
        keyed.look(&serve(&table, config(ip(99)), &clients));
        let start = Instant::now();
        let first = keyed.due(&authority, SERVER, start).len();
        assert_eq!(first, PER_SECOND as usize);
        assert!(keyed.due(&authority, SERVER, start).is_empty());
        let half = keyed
            .due(&authority, SERVER, start + Duration::from_millis(500))
            .len();
        assert_eq!(half, PER_SECOND as usize / 2);
        let rest = keyed
            .due(&authority, SERVER, start + Duration::from_secs(10))
            .len();
        assert_eq!(first + half + rest, clients.len());
    }

    #[test]
    fn a_slot_outside_the_reply_is_an_error_not_a_panic() {
        let table = LeaseTable::new();
        let pool = serve(&table, config(ip(53)), &[10]);
        let slot = KeySlot {
            at: 290,
            xid: 1,
            ip: ip(10),
        };
        let err = Keyed::default()
            .acked(&Authority::default(), mac(10), slot, &mut [0u8; 300], &pool)
            .unwrap_err();
        assert!(matches!(err, ForcerenewError::NoSlot { at: 290 }), "{err}");
    }
}
