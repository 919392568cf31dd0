//! DHCPv6 Reconfigure (RFC 8415 §18.3.11) authenticated with a reconfigure key (§20.4): what a
//! DHCPv6 client's answer is made of, for [`crate::reconfigure`] to tell when it changed, and
//! the signed RECONFIGURE that sends the client back to renew.
//!
//! The key goes in the REPLY to a client that sent Reconfigure Accept, in the room
//! [`add_key_options`] keeps ([`super::handler::KeySlot`]); the RECONFIGURE names the client's
//! DUID and ours, asks for a RENEW, and goes from our link-local address to the client's
//! (clients take it from no other).

use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::Ipv6Addr;

use dhcproto::v6::{DhcpOption, Message, MessageType, OptionCode};
use vmdhcp_core::MacAddr;

use super::handler::Received;
use crate::lease_table::PoolSnapshot;
use crate::reconfigure::{self, AUTH_LEN, Due, Family, ReconfigureError};

/// RECONFIGURE's message type, and RENEW's, which the Reconfigure Message option asks for.
const RECONFIGURE: u8 = 10;
const RENEW: u8 = 5;
/// Options 1, 2 and 19: Client Identifier, Server Identifier, Reconfigure Message.
const CLIENT_ID: u8 = 1;
const SERVER_ID: u8 = 2;
const RECONFIGURE_MESSAGE: u8 = 19;
/// Option 20, Reconfigure Accept (RFC 8415 §21.20).
const RECONFIGURE_ACCEPT: u8 = 20;
/// Option 11, Authentication (RFC 8415 §21.11).
const AUTHENTICATION: u8 = 11;

/// Where a DHCPv6 client's RECONFIGURE goes, as its last REPLY left it: the link-local address
/// and MAC its message came from (clients take a RECONFIGURE only from a link-local address,
/// and only naming their own DUID).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The client's DUID (its Client Identifier).
    pub duid: Vec<u8>,
    /// Its link-local address.
    pub address: Ipv6Addr,
    /// The MAC of its frames.
    pub link: MacAddr,
}

/// Where `reply`'s RECONFIGURE would go, if it takes a key: a REPLY giving `mac` its address,
/// to a REQUEST, RENEW, REBIND or rapid-commit SOLICIT that sent Reconfigure Accept, from a
/// link-local address and a known MAC (never a relayed one: a RECONFIGURE goes on this link).
pub(super) fn target_of(
    request: &Message,
    reply: &Message,
    mac: Option<MacAddr>,
    received: Received<'_>,
    pool: &PoolSnapshot,
) -> Option<Target> {
    use MessageType as T;
    let opts = request.opts();
    let asks = matches!(
        request.msg_type(),
        T::Request | T::Renew | T::Rebind | T::Solicit
    );
    if !asks || reply.msg_type() != T::Reply || opts.get(OptionCode::ReconfAccept).is_none() {
        return None;
    }
    pool.ipv6_of(&mac?)?;
    let Some(DhcpOption::ClientId(duid)) = opts.get(OptionCode::ClientId) else {
        return None;
    };
    Some(Target {
        duid: duid.clone(),
        address: received.source,
        link: received.link_source?,
    })
}

/// Appends Reconfigure Accept (20) and an Authentication option (11) as a REPLY carries a
/// reconfigure key, its replay counter and key zero; returns where the latter's data starts.
pub(super) fn add_key_options(bytes: &mut Vec<u8>) -> usize {
    bytes.extend_from_slice(&[0, RECONFIGURE_ACCEPT, 0, 0]);
    bytes.extend_from_slice(&[0, AUTHENTICATION, 0, AUTH_LEN as u8]);
    let at = bytes.len();
    bytes.extend_from_slice(&reconfigure::key_data());
    at
}

/// The DHCPv6 side of [`reconfigure::Keyed`].
pub struct V6;

/// The keyed DHCPv6 clients of one interface.
pub type Keyed = reconfigure::Keyed<V6>;

impl Family for V6 {
    type Pool = PoolSnapshot;
    type Target = Target;

    /// What a pool's DHCPv6 answers carry: its IPv6 config without the addresses found in
    /// conflict, and the search list, which the IPv4 side holds.
    fn pool_digest(pool: &PoolSnapshot) -> u64 {
        let mut h = DefaultHasher::new();
        if let Some(v6) = &pool.config().ipv6 {
            let mut v6 = v6.clone();
            v6.conflicted.clear();
            // A config always serialises (plain data); were it not to, every change looks the
            // same and clients learn it at T1.
            serde_json::to_vec(&v6).unwrap_or_default().hash(&mut h);
        }
        pool.config().domain_search.hash(&mut h);
        h.finish()
    }

    /// The pool's options and the client's address.
    fn answer_digest(pool_digest: u64, pool: &PoolSnapshot, mac: &MacAddr) -> u64 {
        let mut h = DefaultHasher::new();
        pool_digest.hash(&mut h);
        pool.ipv6_of(mac).hash(&mut h);
        h.finish()
    }

    fn leased(pool: &PoolSnapshot, mac: &MacAddr) -> bool {
        pool.ipv6_of(mac).is_some()
    }
}

/// The RECONFIGURE `due` to its client from the server `duid`, signed with the client's key.
pub fn message(duid: &[u8], due: &Due<Target>) -> Result<Vec<u8>, ReconfigureError> {
    // The transaction ID is zero (§18.3.11): the client answers with a RENEW of its own.
    let mut b = vec![RECONFIGURE, 0, 0, 0];
    option(&mut b, SERVER_ID, duid);
    option(&mut b, CLIENT_ID, &due.target.duid);
    option(&mut b, RECONFIGURE_MESSAGE, &[RENEW]);
    b.extend_from_slice(&[0, AUTHENTICATION, 0, AUTH_LEN as u8]);
    let at = b.len();
    b.extend_from_slice(&reconfigure::hmac_data(due.replay));
    reconfigure::sign(&mut b, at, &due.key)?;
    Ok(b)
}

/// Appends option `code` with `data` (a DUID is at most 130 bytes, RFC 8415 §11.1).
fn option(b: &mut Vec<u8>, code: u8, data: &[u8]) {
    let len = u16::try_from(data.len()).unwrap_or(u16::MAX);
    b.extend_from_slice(&[0, code]);
    b.extend_from_slice(&len.to_be_bytes());
    b.extend_from_slice(&data[..usize::from(len)]);
}
