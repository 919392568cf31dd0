//! Reconfigure keys (RFC 6704 for DHCPv4's FORCERENEW, RFC 8415 §20.4 for DHCPv6's Reconfigure):
//! the key each client of one interface holds, what it was last told, and which clients are owed
//! a message telling them to renew, handed out at a bounded rate. Family-free: the DHCPv4 and
//! DHCPv6 servers each say what a client's answer is made of ([`Family`]) and build their own
//! message; both sign it here ([`sign`]).
//!
//! A client that says it takes a key (DHCPv4 option 145 listing HMAC-MD5, DHCPv6 Reconfigure
//! Accept) gets one of its own in its ACK or REPLY (authentication type 1): the handler leaves
//! the room ([`key_data`]) and [`Keyed::acked`] fills it in and records the client. When the
//! pool's snapshot changes, [`Keyed::look`] queues every keyed client whose answer changed and
//! forgets those without a lease; [`Keyed::due`] hands them out at most [`PER_SECOND`] a second,
//! each with a replay counter above any sent before.
//!
//! Keys live in this replica's memory: after a failover the new leader keys each client again at
//! its next renewal, and until then a change reaches that client at T1, as it does a client that
//! takes no key.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use md5::Md5;
use ring::rand::{SecureRandom, SystemRandom};
use vmdhcp_core::MacAddr;

/// Protocol 3: the reconfigure key.
const RECONFIGURE_KEY: u8 = 3;
/// Algorithm 1: HMAC-MD5, the one both RFCs define for it.
const HMAC_MD5: u8 = 1;
/// Replay detection method 0: a strictly increasing counter.
const MONOTONIC: u8 = 0;
/// Authentication information of type 1 carries the key (in an ACK or REPLY) …
const TYPE_KEY: u8 = 1;
/// … and of type 2 the HMAC of the message (in a FORCERENEW or RECONFIGURE).
const TYPE_HMAC: u8 = 2;
/// A key's and an HMAC-MD5's length.
pub const KEY_LEN: usize = 16;
/// The authentication option's data: protocol, algorithm, RDM, the replay counter, the type,
/// the key or HMAC.
pub const AUTH_LEN: usize = 3 + 8 + 1 + KEY_LEN;
/// Where the replay counter, the type and the key or HMAC sit in that data.
const REPLAY_AT: usize = 3;
const TYPE_AT: usize = 11;
const VALUE_AT: usize = 12;
/// Most messages one interface sends a second: a pool edit reaches ten thousand keyed clients in
/// under two minutes, and no edit makes a storm of renewals.
pub const PER_SECOND: u32 = 100;
/// Most clients one interface remembers a key for; a client past it still gets a key in its
/// answer but no message (its change comes at T1).
const MAX_KEYED: usize = 65_536;

/// Why a client could not be keyed.
#[derive(Debug, thiserror::Error)]
pub enum ReconfigureError {
    /// The system's random source failed: the answer goes without a key.
    #[error("no random key: the system's random source failed")]
    Random,
    /// The answer has no room where the handler said: a bug, reported rather than written.
    #[error("the answer has no key option at byte {at}")]
    NoSlot {
        /// Where the handler said the option's data starts.
        at: usize,
    },
}

/// An authentication option's data as an ACK or REPLY carries a key: zero replay counter and
/// key, for [`Keyed::acked`] to fill in.
pub fn key_data() -> [u8; AUTH_LEN] {
    data(TYPE_KEY)
}

/// The data of a FORCERENEW's or RECONFIGURE's authentication option with `replay`, the HMAC
/// zero: [`sign`] writes it once the message is whole.
pub fn hmac_data(replay: u64) -> [u8; AUTH_LEN] {
    let mut d = data(TYPE_HMAC);
    d[REPLAY_AT..TYPE_AT].copy_from_slice(&replay.to_be_bytes());
    d
}

fn data(kind: u8) -> [u8; AUTH_LEN] {
    let mut d = [0u8; AUTH_LEN];
    d[..REPLAY_AT].copy_from_slice(&[RECONFIGURE_KEY, HMAC_MD5, MONOTONIC]);
    d[TYPE_AT] = kind;
    d
}

/// Signs `message`, whose authentication option's data starts at `at` ([`hmac_data`]): HMAC-MD5
/// with `key` over the whole message, the HMAC field zero, written into that field.
pub fn sign(message: &mut [u8], at: usize, key: &[u8; KEY_LEN]) -> Result<(), ReconfigureError> {
    let field = at + VALUE_AT..at + AUTH_LEN;
    if message.len() < field.end {
        return Err(ReconfigureError::NoSlot { at });
    }
    message[field.clone()].fill(0);
    let hmac = hmac_md5(key, message);
    message[field].copy_from_slice(&hmac);
    Ok(())
}

/// HMAC-MD5 of `message` with `key`.
pub fn hmac_md5(key: &[u8], message: &[u8]) -> [u8; KEY_LEN] {
    // HMAC takes a key of any length (`new_from_slice` never fails for it).
    let Ok(mut mac) = Hmac::<Md5>::new_from_slice(key) else {
        return [0; KEY_LEN];
    };
    mac.update(message);
    mac.finalize().into_bytes().into()
}

/// The source of keys and the replay counter of one interface's [`Keyed`].
#[derive(Debug)]
struct Authority {
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

    fn new_key(&self) -> Result<[u8; KEY_LEN], ReconfigureError> {
        let mut key = [0u8; KEY_LEN];
        self.random
            .fill(&mut key)
            .map_err(|_| ReconfigureError::Random)?;
        Ok(key)
    }
}

/// What one family's server says about its pools and clients.
pub trait Family {
    /// The pool as the packet path sees it.
    type Pool;
    /// Where a client's message goes, as its last answer left it.
    type Target: Clone + std::fmt::Debug + PartialEq;
    /// A digest of what every client's answer shares (the pool's options).
    fn pool_digest(pool: &Self::Pool) -> u64;
    /// A digest of what `mac`'s answer is made of, given its pool's digest.
    fn answer_digest(pool_digest: u64, pool: &Self::Pool, mac: &MacAddr) -> u64;
    /// Whether `mac` holds a lease in `pool`.
    fn leased(pool: &Self::Pool, mac: &MacAddr) -> bool;
}

/// A keyed client, as its last answer left it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Client<T> {
    key: [u8; KEY_LEN],
    target: T,
    /// The digest of what it was told ([`Family::answer_digest`]).
    told: u64,
}

/// A message owed to a client: where it goes, its key and its replay counter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Due<T> {
    /// The client's MAC.
    pub mac: MacAddr,
    /// Where its message goes.
    pub target: T,
    /// Its key, to [`sign`] the message with.
    pub key: [u8; KEY_LEN],
    /// The message's replay counter ([`hmac_data`]).
    pub replay: u64,
}

/// The keyed clients of one interface and the messages owed to them.
pub struct Keyed<F: Family> {
    clients: HashMap<MacAddr, Client<F::Target>>,
    queue: VecDeque<MacAddr>,
    queued: HashSet<MacAddr>,
    /// The snapshot [`Keyed::look`] compared against last, and its pool's digest.
    seen: Option<(Arc<F::Pool>, u64)>,
    tokens: u32,
    refilled: Instant,
    authority: Authority,
}

impl<F: Family> Default for Keyed<F> {
    fn default() -> Self {
        Keyed {
            clients: HashMap::new(),
            queue: VecDeque::new(),
            queued: HashSet::new(),
            seen: None,
            tokens: PER_SECOND,
            refilled: Instant::now(),
            authority: Authority::default(),
        }
    }
}

impl<F: Family> Keyed<F> {
    /// Fills in the key of the answer `bytes` to `mac` (its own key, the same across renewals)
    /// and a replay counter, in the authentication data starting at `at` ([`key_data`]), and
    /// records the client with `target` and what it was told, from `pool`.
    pub fn acked(
        &mut self,
        mac: MacAddr,
        (at, target): (usize, F::Target),
        bytes: &mut [u8],
        pool: &Arc<F::Pool>,
    ) -> Result<(), ReconfigureError> {
        let data = bytes
            .get_mut(at..at + AUTH_LEN)
            .ok_or(ReconfigureError::NoSlot { at })?;
        let key = match self.clients.get(&mac) {
            Some(client) => client.key,
            None => self.authority.new_key()?,
        };
        data[REPLAY_AT..TYPE_AT].copy_from_slice(&self.authority.next_replay().to_be_bytes());
        data[VALUE_AT..].copy_from_slice(&key);
        if self.clients.len() >= MAX_KEYED && !self.clients.contains_key(&mac) {
            return Ok(());
        }
        let told = F::answer_digest(self.pool_digest(pool), pool, &mac);
        self.clients.insert(mac, Client { key, target, told });
        Ok(())
    }

    /// Compares `pool` with the snapshot seen last: every keyed client whose answer changed is
    /// queued, and every one without a lease any more is forgotten. Costs one pointer comparison
    /// when nothing changed, and nothing while no client holds a key.
    pub fn look(&mut self, pool: &Arc<F::Pool>) {
        if self.clients.is_empty()
            || self
                .seen
                .as_ref()
                .is_some_and(|(seen, _)| Arc::ptr_eq(seen, pool))
        {
            return;
        }
        let digest = self.pool_digest(pool);
        self.clients.retain(|mac, _| F::leased(pool, mac));
        for (mac, client) in &self.clients {
            if F::answer_digest(digest, pool, mac) != client.told && self.queued.insert(*mac) {
                self.queue.push_back(*mac);
            }
        }
    }

    /// The messages due now, within [`PER_SECOND`]; a client sent one is taken as told (its
    /// renewal keys it again).
    pub fn due(&mut self, now: Instant) -> Vec<Due<F::Target>> {
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
        let mut out = Vec::new();
        while self.tokens > 0 {
            let Some(mac) = self.queue.pop_front() else {
                break;
            };
            self.queued.remove(&mac);
            let (Some(client), Some((pool, digest))) =
                (self.clients.get_mut(&mac), self.seen.as_ref())
            else {
                continue;
            };
            if !F::leased(pool, &mac) {
                continue;
            }
            client.told = F::answer_digest(*digest, pool, &mac);
            self.tokens -= 1;
            out.push(Due {
                mac,
                target: client.target.clone(),
                key: client.key,
                replay: self.authority.next_replay(),
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

    /// The target recorded for `mac`, if it holds a key.
    pub fn target_of(&self, mac: &MacAddr) -> Option<&F::Target> {
        self.clients.get(mac).map(|c| &c.target)
    }

    /// The digest of `pool`'s options, computed once per snapshot.
    fn pool_digest(&mut self, pool: &Arc<F::Pool>) -> u64 {
        if let Some((seen, digest)) = &self.seen
            && Arc::ptr_eq(seen, pool)
        {
            return *digest;
        }
        let digest = F::pool_digest(pool);
        self.seen = Some((Arc::clone(pool), digest));
        digest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn the_layouts_are_rfc_3118_s_with_protocol_3() {
        let key = key_data();
        assert_eq!(&key[..4], &[3, 1, 0, 0]);
        assert_eq!(key[TYPE_AT], 1);
        let h = hmac_data(0x0102_0304_0506_0708);
        assert_eq!(&h[..TYPE_AT], &[3, 1, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(h[TYPE_AT], 2);
        assert_eq!(&h[VALUE_AT..], &[0; KEY_LEN]);
    }

    #[test]
    fn a_signature_is_the_hmac_of_the_message_with_its_field_zero_and_a_short_one_is_an_error() {
        let mut m = b"header".to_vec();
        let at = m.len();
        m.extend_from_slice(&hmac_data(7));
        m.extend_from_slice(b"trailer");
        let unsigned = m.clone();
        sign(&mut m, at, &[9; KEY_LEN]).unwrap();
        assert_eq!(
            &m[at + VALUE_AT..at + AUTH_LEN],
            &hmac_md5(&[9; KEY_LEN], &unsigned)
        );
        // Signing again gives the same: the field is zeroed first.
        let once = m.clone();
        sign(&mut m, at, &[9; KEY_LEN]).unwrap();
        assert_eq!(m, once);
        assert!(matches!(
            sign(&mut [0u8; 10], 4, &[9; KEY_LEN]),
            Err(ReconfigureError::NoSlot { at: 4 })
        ));
    }

    #[test]
    fn replay_counters_strictly_increase() {
        let a = Authority::default();
        let mut last = 0;
        for _ in 0..1000 {
            let next = a.next_replay();
            assert!(next > last);
            last = next;
        }
    }
}
