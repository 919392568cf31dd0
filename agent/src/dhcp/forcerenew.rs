//! DHCPFORCERENEW (RFC 3203) authenticated with a reconfigure key (RFC 6704): what a DHCPv4
//! client's answer is made of, for [`crate::reconfigure`] to tell when it changed, and the signed
//! FORCERENEW that sends the client back to renew.
//!
//! The key goes in option 90 of the ACK to a client that lists HMAC-MD5 in option 145; the
//! FORCERENEW carries the transaction of that client's last ACK (clients drop any other), comes
//! from the server's address to the client's, and is signed over the whole message with `hops`
//! and `giaddr` zero (RFC 3118 §5), as they are sent.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::Ipv4Addr;

use vmdhcp_core::MacAddr;

use crate::lease_table::PoolSnapshot;
use crate::reconfigure::{self, AUTH_LEN, Due, Family, ReconfigureError};

/// Option 90, Authentication (RFC 3118).
pub const AUTHENTICATION: u8 = 90;
/// DHCPFORCERENEW's message type (RFC 3203).
const FORCERENEW: u8 = 9;
/// The BOOTP header and magic cookie, and the smallest message relays and clients take.
const OPTIONS_START: usize = 240;
const MIN_MESSAGE: usize = 300;
const MAGIC_COOKIE: [u8; 4] = [99, 130, 83, 99];

/// Appends option 90 as an ACK carries a reconfigure key, its replay counter and key zero for
/// [`reconfigure::Keyed::acked`] to fill in; returns where its data starts.
pub(crate) fn key_option(bytes: &mut Vec<u8>) -> usize {
    bytes.extend_from_slice(&[AUTHENTICATION, AUTH_LEN as u8]);
    let at = bytes.len();
    bytes.extend_from_slice(&reconfigure::key_data());
    at
}

/// Where a DHCPv4 client's FORCERENEW goes, as its last ACK left it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    /// The transaction of that ACK.
    pub xid: u32,
    /// The address it leased, where the client listens.
    pub ip: Ipv4Addr,
}

/// The DHCPv4 side of [`reconfigure::Keyed`].
pub struct V4;

/// The keyed DHCPv4 clients of one interface.
pub type Keyed = reconfigure::Keyed<V4>;

impl Family for V4 {
    type Pool = PoolSnapshot;
    type Target = Target;

    /// What a pool's DHCPv4 answers carry: its config without what no answer shows (the
    /// addresses found in conflict, the IPv6 side), and the NTP names resolved so far.
    fn pool_digest(pool: &PoolSnapshot) -> u64 {
        let mut config = (**pool.config()).clone();
        config.conflicted.clear();
        config.ipv6 = None;
        let mut h = DefaultHasher::new();
        // A config always serialises (plain data); were it not to, every change looks the same
        // and clients learn it at T1.
        serde_json::to_vec(&config).unwrap_or_default().hash(&mut h);
        pool.ntp_addresses().hash(&mut h);
        h.finish()
    }

    /// The pool's options, and the client's address, host name and own options.
    fn answer_digest(pool_digest: u64, pool: &PoolSnapshot, mac: &MacAddr) -> u64 {
        let mut h = DefaultHasher::new();
        pool_digest.hash(&mut h);
        pool.address_of(mac).hash(&mut h);
        pool.host_name_of(mac).hash(&mut h);
        pool.options_of(mac).hash(&mut h);
        h.finish()
    }

    fn leased(pool: &PoolSnapshot, mac: &MacAddr) -> bool {
        pool.address_of(mac).is_some()
    }
}

/// The FORCERENEW `due` to its client, from `server`, signed with the client's key.
pub fn message(server: Ipv4Addr, due: &Due<Target>) -> Result<Vec<u8>, ReconfigureError> {
    let mut b = vec![0u8; OPTIONS_START];
    b[0] = 2; // BOOTREPLY
    b[1] = 1; // Ethernet
    b[2] = 6;
    b[4..8].copy_from_slice(&due.target.xid.to_be_bytes());
    b[12..16].copy_from_slice(&due.target.ip.octets());
    b[28..34].copy_from_slice(&due.mac.0);
    b[236..240].copy_from_slice(&MAGIC_COOKIE);
    b.extend_from_slice(&[53, 1, FORCERENEW, 54, 4]);
    b.extend_from_slice(&server.octets());
    b.extend_from_slice(&[AUTHENTICATION, AUTH_LEN as u8]);
    let at = b.len();
    b.extend_from_slice(&reconfigure::hmac_data(due.replay));
    b.push(255);
    b.resize(MIN_MESSAGE, 0);
    reconfigure::sign(&mut b, at, &due.key)?;
    Ok(b)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use dhcproto::v4::{DhcpOption, Message, MessageType, OptionCode, UnknownOption};
    use dhcproto::{Decodable, Encodable};
    use vmdhcp_core::fixtures::pool_config;
    use vmdhcp_core::pool::{Binding, PoolConfig};

    use super::*;
    use crate::dhcp::handler::{Action, Reply, handle};
    use crate::lease_table::LeaseTable;
    use crate::pools::PoolLeases;
    use crate::reconfigure::{KEY_LEN, PER_SECOND, hmac_md5};

    const SERVER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
    /// Where the replay counter, the type and the key or HMAC sit in option 90's data.
    const REPLAY: std::ops::Range<usize> = 3..11;
    const TYPE: usize = 11;
    const VALUE: std::ops::Range<usize> = 12..28;

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

    /// Client `n` renews with option 145 and is keyed: returns its key.
    fn key(keyed: &mut Keyed, pool: &Arc<PoolSnapshot>, n: u8, xid: u32) -> Vec<u8> {
        let mut r = ack(pool, &renewal(n, xid, true));
        let slot = r.key_slot.unwrap();
        keyed
            .acked(mac(n), (slot.at, slot.target), &mut r.bytes, pool)
            .unwrap();
        auth_of(&r.bytes)[VALUE].to_vec()
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
        let hmac = &auth[VALUE];
        let at = message.windows(hmac.len()).position(|w| w == hmac).unwrap();
        let mut zeroed = message.to_vec();
        zeroed[at..at + KEY_LEN].fill(0);
        hmac_md5(key, &zeroed) == hmac
    }

    fn replay_of(bytes: &[u8]) -> u64 {
        u64::from_be_bytes(auth_of(bytes)[REPLAY].try_into().unwrap())
    }

    #[test]
    fn a_capable_client_s_ack_carries_its_own_key_and_others_none() {
        let table = LeaseTable::new();
        let pool = serve(&table, config(ip(53)), &[10, 11]);
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
        assert_eq!(slot.target, Target { xid: 7, ip: ip(10) });
        keyed
            .acked(mac(10), (slot.at, slot.target), &mut first.bytes, &pool)
            .unwrap();
        let auth = auth_of(&first.bytes);
        assert_eq!(auth.len(), AUTH_LEN);
        assert_eq!(&auth[..3], &[3, 1, 0]);
        assert_eq!(auth[TYPE], 1);
        let key = auth[VALUE].to_vec();
        assert_ne!(key, vec![0; KEY_LEN]);
        let replay = replay_of(&first.bytes);

        // The next renewal: the same key, a later counter, the new transaction.
        let mut second = ack(&pool, &renewal(10, 8, true));
        let slot = second.key_slot.unwrap();
        keyed
            .acked(mac(10), (slot.at, slot.target), &mut second.bytes, &pool)
            .unwrap();
        assert_eq!(&auth_of(&second.bytes)[VALUE], key.as_slice());
        assert!(replay_of(&second.bytes) > replay);
        assert_eq!(
            keyed.target_of(&mac(10)),
            Some(&Target { xid: 8, ip: ip(10) })
        );
        assert_eq!(keyed.len(), 1);
    }

    #[test]
    fn a_changed_option_sends_each_keyed_client_a_signed_forcerenew_once() {
        let table = LeaseTable::new();
        let pool = serve(&table, config(ip(53)), &[10, 11, 12]);
        let mut keyed = Keyed::default();
        let keys: HashMap<MacAddr, Vec<u8>> = [10, 11]
            .into_iter()
            .map(|n| (mac(n), key(&mut keyed, &pool, n, 100 + u32::from(n))))
            .collect();
        let now = Instant::now();
        keyed.look(&pool);
        assert!(keyed.due(now).is_empty(), "nothing changed");

        // The same options in a new snapshot (a lease of another client came): still nothing.
        let same = serve(&table, config(ip(53)), &[10, 11, 12, 13]);
        keyed.look(&same);
        assert!(keyed.due(now).is_empty());

        // The DNS server changed: both keyed clients, none other, each signed with its key.
        let changed = serve(&table, config(ip(99)), &[10, 11, 12, 13]);
        keyed.look(&changed);
        let due = keyed.due(now);
        let mut to: Vec<_> = due.iter().map(|d| (d.mac, d.target.ip)).collect();
        to.sort();
        assert_eq!(to, vec![(mac(10), ip(10)), (mac(11), ip(11))]);
        let mut replays = Vec::new();
        for d in &due {
            let bytes = message(SERVER, d).unwrap();
            let m = Message::from_bytes(&bytes).unwrap();
            assert_eq!(m.opts().msg_type(), Some(MessageType::ForceRenew));
            assert_eq!(m.xid(), 100 + u32::from(d.mac.0[5]));
            assert_eq!(&m.chaddr()[..6], &d.mac.0);
            assert_eq!(
                m.opts().get(OptionCode::ServerIdentifier),
                Some(&DhcpOption::ServerIdentifier(SERVER))
            );
            assert!(bytes.len() >= MIN_MESSAGE);
            let auth = auth_of(&bytes);
            assert_eq!(&auth[..3], &[3, 1, 0]);
            assert_eq!(auth[TYPE], 2);
            assert!(verifies(&bytes, &keys[&d.mac]));
            assert!(!verifies(&bytes, &[0; KEY_LEN]));
            replays.push(replay_of(&bytes));
        }
        assert!(replays[1] > replays[0]);
        // Told once: looking again at the same change sends nothing more.
        keyed.look(&changed);
        assert!(keyed.due(now).is_empty());
    }

    #[test]
    fn a_client_whose_lease_went_is_forgotten_and_one_whose_name_changed_is_told() {
        let table = LeaseTable::new();
        let pool = serve(&table, config(ip(53)), &[10, 11]);
        let mut keyed = Keyed::default();
        for n in [10, 11] {
            key(&mut keyed, &pool, n, 1);
        }
        // 11's lease went and the DNS server changed: only 10 is told, 11 forgotten.
        let changed = serve(&table, config(ip(99)), &[10]);
        keyed.look(&changed);
        let due = keyed.due(Instant::now());
        assert_eq!(due.iter().map(|d| d.mac).collect::<Vec<_>>(), vec![mac(10)]);
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
        assert_eq!(keyed.due(Instant::now()).len(), 1);
    }

    #[test]
    fn forcerenews_go_out_at_most_per_second_s_rate() {
        let table = LeaseTable::new();
        let clients: Vec<u8> = (2..=251).collect();
        let pool = serve(&table, config(ip(53)), &clients);
        let mut keyed = Keyed::default();
        for &n in &clients {
            key(&mut keyed, &pool, n, 1);
        }
        keyed.look(&serve(&table, config(ip(99)), &clients));
        let start = Instant::now();
        let first = keyed.due(start).len();
        assert_eq!(first, PER_SECOND as usize);
        assert!(keyed.due(start).is_empty());
        let half = keyed.due(start + Duration::from_millis(500)).len();
        assert_eq!(half, PER_SECOND as usize / 2);
        let rest = keyed.due(start + Duration::from_secs(10)).len();
        assert_eq!(first + half + rest, clients.len());
    }

    #[test]
    fn a_slot_outside_the_reply_is_an_error_not_a_panic() {
        let table = LeaseTable::new();
        let pool = serve(&table, config(ip(53)), &[10]);
        let target = Target { xid: 1, ip: ip(10) };
        let err = Keyed::default()
            .acked(mac(10), (290, target), &mut [0u8; 300], &pool)
            .unwrap_err();
        assert!(matches!(err, ReconfigureError::NoSlot { at: 290 }), "{err}");
    }
}
