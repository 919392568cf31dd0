//! The DHCPv6 server identity of a pool: a DUID derived from the pool, not from the agent
//! replica that serves it, so that after a failover the new leader answers the RENEWs clients
//! address to the old one (RFC 8415 servers drop a RENEW that names another server's DUID).
//!
//! The DUID is a DUID-UUID (RFC 6355, type 4) whose UUID is an RFC 9562 version-8 UUID made from
//! the 128-bit FNV-1a hash of the pool's `namespace/name`: every replica, every source of the
//! pool (stream, IPPool status, bootstrap, static file) and every restart computes the same one
//! without anything carried for it.

use crate::names::NamespacedName;

/// DUID type of a DUID-UUID (RFC 6355).
pub const DUID_UUID: u16 = 4;

/// The server DUID of `pool`: 2 bytes of DUID type 4, then the 16-byte UUID.
pub fn server_duid(pool: &NamespacedName) -> Vec<u8> {
    let mut uuid = fnv1a_128(format!("vmdhcp/ippool/{pool}").as_bytes()).to_be_bytes();
    // RFC 9562 §5.8: version 8 in the high nibble of octet 6, variant 10 in octet 8.
    uuid[6] = (uuid[6] & 0x0f) | 0x80;
    uuid[8] = (uuid[8] & 0x3f) | 0x80;
    let mut duid = DUID_UUID.to_be_bytes().to_vec();
    duid.extend_from_slice(&uuid);
    duid
}

/// The 128-bit FNV-1a hash (its published offset basis and prime).
fn fnv1a_128(bytes: &[u8]) -> u128 {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    bytes.iter().fold(OFFSET, |hash, b| {
        (hash ^ u128::from(*b)).wrapping_mul(PRIME)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_fnv1a_128() {
        // The published test vectors of FNV-1a 128.
        assert_eq!(fnv1a_128(b""), 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d);
        assert_eq!(fnv1a_128(b"a"), 0xd228_cb69_6f1a_8caf_7891_2b70_4e4a_8964);
    }

    #[test]
    fn a_pool_has_one_duid_and_pools_differ() {
        let a: NamespacedName = "default/net-48".parse().unwrap();
        let b: NamespacedName = "default/net-49".parse().unwrap();
        let duid = server_duid(&a);
        assert_eq!(duid.len(), 18);
        assert_eq!(&duid[..2], &[0, 4]);
        assert_eq!(duid[8] >> 4, 8, "version 8");
        assert_eq!(duid[10] >> 6, 0b10, "RFC variant");
        assert_eq!(duid, server_duid(&a));
        assert_ne!(duid, server_duid(&b));
    }
}
