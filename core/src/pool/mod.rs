//! What an agent needs to serve one pool ([`PoolConfig`]) and whom it serves ([`Lease`]), derived
//! from an IPPool; the meaning of each `status.ipv4.allocated` entry ([`Holder`]); and, in
//! [`spec`], the one parse of an IPPool spec ([`ValidPool`]) every reader goes through, with
//! the IPv6 side of a dual-stack pool in [`v6`] and what the two families share in [`family`].
//!
//! Everything here parses the strings of the CRD once, with errors that name the field and the
//! value, so the controller, the stream and the DHCP server only ever see typed, valid data.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::Ipv4Net;
use kube::ResourceExt;
use serde::{Deserialize, Serialize};

use crate::crd::{
    ALLOCATED_EXCLUDED, ALLOCATED_RESERVED, CONDITION_CACHE_READY, CONDITION_REGISTERED,
    CONDITION_STOPPED, IPPool, IPv4Status, find_condition,
};
use crate::mac::MacAddr;
use crate::names::{NamespacedName, is_host_name};

pub mod boot;
pub mod duid;
pub mod family;
pub mod nic_options;
pub mod recorded;
pub mod spec;
pub mod v6;
pub use boot::{Boot, BootV6, Firmware};
pub use family::Family;
pub use nic_options::NicOptions;
pub use recorded::RecordedLeases;
pub use spec::{PoolRange, ValidPool};
pub use v6::{PoolConfigV6, ValidV6};

/// Most of one pool's addresses that one host answering ARP for them can hold in conflict. Any
/// tenant can answer ARP for any address; past this number its answers withhold nothing more,
/// so no host can drain a pool (the agent stops withholding, the controller stops recording).
pub const MAX_CONFLICTS_PER_HOST: usize = 2;

/// Lease time when the pool sets none (or 0): one year, as upstream.
pub const DEFAULT_LEASE_SECONDS: u32 = 31_536_000;

/// Why an IPPool (or one of its status entries) cannot be turned into configs or leases.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// The object has no namespace or name (never true of objects read from the API).
    #[error("IPPool has no namespace/name")]
    Unnamed,
    /// A spec field holds a value that cannot be used.
    #[error("IPPool {pool}: {field} {value:?} {reason}")]
    InvalidField {
        /// The pool, `namespace/name`.
        pool: String,
        /// JSON path of the field, e.g. `spec.ipv4Config.dns[1]`.
        field: String,
        /// The rejected value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A `status.ipv4.allocated` entry whose key is not an address or whose value is neither a
    /// MAC nor a marker. Other entries are unaffected.
    #[error("IPPool {pool}: status.ipv4.allocated[{ip:?}] = {value:?} {reason}")]
    InvalidAllocation {
        /// The pool, `namespace/name`.
        pool: String,
        /// The entry's key.
        ip: String,
        /// The entry's value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A `status.ipv6.allocated` entry whose key is not an IPv6 address or whose value is
    /// neither a MAC nor a marker. Other entries are unaffected.
    #[error("IPPool {pool}: status.ipv6.allocated[{ip:?}] = {value:?} {reason}")]
    InvalidV6Allocation {
        /// The pool, `namespace/name`.
        pool: String,
        /// The entry's key.
        ip: String,
        /// The entry's value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A `status.ipv4.hostNames` entry that is not a host name we would hand out; the lease is
    /// served without one.
    #[error(
        "IPPool {pool}: status.ipv4.hostNames[{ip:?}] = {value:?} is not a host name (dot-separated DNS-1123 labels, at most 63 bytes)"
    )]
    InvalidHostName {
        /// The pool, `namespace/name`.
        pool: String,
        /// The entry's key.
        ip: String,
        /// The entry's value.
        value: String,
    },
    /// A `status.ipv4.dhcpOptions` entry that breaks the rules of a NIC's `dhcpOptions`; the
    /// NIC is served without them.
    #[error("IPPool {pool}: status.ipv4.dhcpOptions[{ip}].{field}: {reason}")]
    InvalidDhcpOptions {
        /// The pool, `namespace/name`.
        pool: String,
        /// The entry's key.
        ip: String,
        /// The field of the entry.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Who holds an address of a pool, as recorded in `status.ipv4.allocated`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Holder {
    /// Leased to this NIC.
    Mac(MacAddr),
    /// Held back for the DHCP server or the router (`RESERVED`).
    Reserved,
    /// Kept out by the pool's exclude list (`EXCLUDED`).
    Excluded,
}

impl Holder {
    /// Parses an `allocated` value: a MAC, `RESERVED` or `EXCLUDED`.
    pub fn parse(value: &str) -> Result<Self, String> {
        match value {
            ALLOCATED_RESERVED => Ok(Holder::Reserved),
            ALLOCATED_EXCLUDED => Ok(Holder::Excluded),
            mac => mac
                .parse()
                .map(Holder::Mac)
                .map_err(|_| "is neither a MAC address nor RESERVED/EXCLUDED".to_owned()),
        }
    }

    /// The `allocated` value for this holder.
    pub fn as_status_value(&self) -> String {
        match self {
            Holder::Mac(mac) => mac.to_string(),
            Holder::Reserved => ALLOCATED_RESERVED.to_owned(),
            Holder::Excluded => ALLOCATED_EXCLUDED.to_owned(),
        }
    }
}

/// Parses every entry of an `allocated` map. Good entries are returned even when others are bad,
/// so one corrupt entry never hides the leases recorded beside it.
pub fn parse_allocated<A: Family>(
    pool: &NamespacedName,
    allocated: &BTreeMap<String, String>,
) -> (BTreeMap<A, Holder>, Vec<PoolError>) {
    let mut good = BTreeMap::new();
    let mut bad = Vec::new();
    for (ip, value) in allocated {
        match parse_entry(pool, ip, value) {
            Ok((addr, holder)) => {
                good.insert(addr, holder);
            }
            Err(e) => bad.push(e),
        }
    }
    (good, bad)
}

/// Parses one `allocated` entry.
pub fn parse_entry<A: Family>(
    pool: &NamespacedName,
    ip: &str,
    value: &str,
) -> Result<(A, Holder), PoolError> {
    let invalid = |reason: String| PoolError::InvalidAllocation {
        pool: pool.to_string(),
        ip: ip.to_owned(),
        value: value.to_owned(),
        reason,
    };
    match (ip.parse::<A>(), Holder::parse(value)) {
        (Ok(addr), Ok(holder)) => Ok((addr, holder)),
        (Err(_), _) => Err(invalid(format!(
            "has a key that is not an {} address",
            A::NAME
        ))),
        (_, Err(reason)) => Err(invalid(reason)),
    }
}

/// One reservation: the address a NIC gets on a pool.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Lease {
    /// The pool, `namespace/name`.
    pub pool: NamespacedName,
    /// The NIC.
    pub mac: MacAddr,
    /// Its address.
    pub ip: Ipv4Addr,
    /// The host name it is given (option 12), when its pool sends them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_name: Option<String>,
    /// Its IPv6 address, on a dual-stack pool (IPv4 first: only a NIC with an IPv4 address
    /// has one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<Ipv6Addr>,
    /// The NIC's own DHCP options, served over the pool's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<Box<NicOptions>>,
}

impl Lease {
    /// What the lease binds the NIC to, without the pool and MAC that key it.
    pub fn binding(&self) -> Binding {
        Binding {
            ip: self.ip,
            host_name: self.host_name.clone(),
            ipv6: self.ipv6,
            options: self.options.clone(),
        }
    }
}

/// What a NIC is given on a pool: its address and, if the pool sends one, its host name. The
/// value the controller's index and an agent's table keep per `(pool, MAC)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Binding {
    /// The address.
    pub ip: Ipv4Addr,
    /// The host name (option 12).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_name: Option<String>,
    /// The IPv6 address, on a dual-stack pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<Ipv6Addr>,
    /// The NIC's own DHCP options (its VM's `dhcpOptions`), served over the pool's. Boxed: most
    /// NICs have none, and a binding is kept per NIC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<Box<NicOptions>>,
}

impl Binding {
    /// An address without a host name.
    pub fn ip(ip: Ipv4Addr) -> Self {
        Binding {
            ip,
            host_name: None,
            ipv6: None,
            options: None,
        }
    }

    /// The lease of `mac` on `pool` this binding makes.
    pub fn lease(&self, pool: NamespacedName, mac: MacAddr) -> Lease {
        Lease {
            pool,
            mac,
            ip: self.ip,
            host_name: self.host_name.clone(),
            ipv6: self.ipv6,
            options: self.options.clone(),
        }
    }
}

/// The changes between two revisions of a set of pools, as the latest state of everything that
/// changed: what the controller's index computes for a reader and what an agent applies.
/// Removing a pool removes its leases (they are not listed again in `removed_leases`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolDelta {
    /// The revision the changes apply to.
    pub base_revision: u64,
    /// The revision they bring the reader to.
    pub revision: u64,
    /// Pools added or changed, at their current config.
    pub upserted_pools: Vec<PoolConfig>,
    /// Pools gone, with their leases.
    pub removed_pools: Vec<NamespacedName>,
    /// Leases added or changed, at their current address.
    pub upserted_leases: Vec<Lease>,
    /// Leases withdrawn from pools that remain.
    pub removed_leases: Vec<(NamespacedName, MacAddr)>,
}

impl PoolDelta {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.upserted_pools.is_empty()
            && self.removed_pools.is_empty()
            && self.upserted_leases.is_empty()
            && self.removed_leases.is_empty()
    }
}

/// Whether the agents should serve `pool` now: registered, its cache ready (the controller
/// rebuilt its IPAM from status), not stopped, paused or being deleted. The controller's index
/// and an agent reading IPPools directly (while the stream is down) decide it the same way.
pub fn is_served(pool: &IPPool) -> bool {
    let conditions = pool
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let is = |t: &str| find_condition(conditions, t).is_some_and(|c| c.status == "True");
    pool.metadata.deletion_timestamp.is_none()
        && pool.spec.paused != Some(true)
        && is(CONDITION_REGISTERED)
        && is(CONDITION_CACHE_READY)
        && !is(CONDITION_STOPPED)
}

/// The leases recorded in a pool's status (markers skipped), with their host names when the
/// pool sends them (`sendHostName`), plus an error for each bad entry.
pub fn leases_from_status(pool: &IPPool) -> Result<(Vec<Lease>, Vec<PoolError>), PoolError> {
    let pool_ref = pool_ref(pool)?;
    let Some(v4) = pool.status.as_ref().and_then(|s| s.ipv4.as_ref()) else {
        return Ok((Vec::new(), Vec::new()));
    };
    let (entries, mut errors) = parse_allocated(&pool_ref, &v4.allocated);
    let v6 = ipv6_by_mac(pool, &pool_ref, &mut errors);
    let names = pool.spec.ipv4_config.send_host_name == Some(true);
    let leases = entries
        .into_iter()
        .filter_map(|(ip, holder)| match holder {
            Holder::Mac(mac) => Some(Lease {
                pool: pool_ref.clone(),
                mac,
                ip,
                host_name: recorded_host_name(&pool_ref, v4, names, ip, &mut errors),
                ipv6: v6.get(&mac).copied(),
                options: recorded_options(&pool_ref, v4, ip, &mut errors),
            }),
            Holder::Reserved | Holder::Excluded => None,
        })
        .collect();
    Ok((leases, errors))
}

/// The IPv6 address `status.ipv6.allocated` records for each MAC, when the pool has an
/// `ipv6Config` (the highest, if someone recorded a MAC twice, as for IPv4). Served only with
/// the MAC's IPv4 lease: IPv4 is allocated first, so the controller never records one alone.
fn ipv6_by_mac(
    pool: &IPPool,
    pool_ref: &NamespacedName,
    errors: &mut Vec<PoolError>,
) -> BTreeMap<MacAddr, Ipv6Addr> {
    let Some(v6) = pool
        .status
        .as_ref()
        .and_then(|s| s.ipv6.as_ref())
        .filter(|_| pool.spec.ipv6_config.is_some())
    else {
        return BTreeMap::new();
    };
    let (entries, bad) = parse_allocated_v6(pool_ref, &v6.allocated);
    errors.extend(bad);
    entries
        .into_iter()
        .filter_map(|(ip, holder)| match holder {
            Holder::Mac(mac) => Some((mac, ip)),
            Holder::Reserved | Holder::Excluded => None,
        })
        .collect()
}

/// [`parse_allocated`] of a `status.ipv6.allocated` map, errors naming that map.
pub fn parse_allocated_v6(
    pool: &NamespacedName,
    allocated: &BTreeMap<String, String>,
) -> (BTreeMap<Ipv6Addr, Holder>, Vec<PoolError>) {
    let (good, bad) = parse_allocated::<Ipv6Addr>(pool, allocated);
    let bad = bad.into_iter().map(in_ipv6_status).collect();
    (good, bad)
}

/// An `allocated` entry's error, said of `status.ipv6.allocated`.
pub fn in_ipv6_status(e: PoolError) -> PoolError {
    match e {
        PoolError::InvalidAllocation {
            pool,
            ip,
            value,
            reason,
        } => PoolError::InvalidV6Allocation {
            pool,
            ip,
            value,
            reason,
        },
        other => other,
    }
}

/// The DHCP options `v4` records for the NIC holding `ip`, if any and valid (else an error,
/// and none: the NIC is still served, with the pool's options).
fn recorded_options(
    pool: &NamespacedName,
    v4: &IPv4Status,
    ip: Ipv4Addr,
    errors: &mut Vec<PoolError>,
) -> Option<Box<NicOptions>> {
    if v4.dhcp_options.is_empty() {
        return None;
    }
    let key = ip.to_string();
    match NicOptions::parse(v4.dhcp_options.get(&key)?) {
        Ok(options) => options.map(Box::new),
        Err(e) => {
            errors.push(PoolError::InvalidDhcpOptions {
                pool: pool.to_string(),
                ip: key,
                field: e.field().to_owned(),
                reason: e.to_string(),
            });
            None
        }
    }
}

/// The host name `v4` records for `ip` when the pool sends them (`names`), if it is one we
/// would hand out (else an error, and none).
fn recorded_host_name(
    pool: &NamespacedName,
    v4: &IPv4Status,
    names: bool,
    ip: Ipv4Addr,
    errors: &mut Vec<PoolError>,
) -> Option<String> {
    if !names {
        return None;
    }
    let key = ip.to_string();
    let name = v4.host_names.get(&key)?;
    if is_host_name(name) {
        return Some(name.clone());
    }
    errors.push(PoolError::InvalidHostName {
        pool: pool.to_string(),
        ip: key,
        value: name.clone(),
    });
    None
}

/// The `namespace/name` of an IPPool object.
pub fn pool_ref(pool: &IPPool) -> Result<NamespacedName, PoolError> {
    let namespace = pool.namespace().ok_or(PoolError::Unnamed)?;
    NamespacedName::new(&namespace, &pool.name_any()).map_err(|_| PoolError::Unnamed)
}

/// Everything an agent needs to answer DHCP for one pool on one interface.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolConfig {
    /// The IPPool, `namespace/name`.
    pub pool: NamespacedName,
    /// The NetworkAttachmentDefinition served, `namespace/name`.
    pub network: NamespacedName,
    /// The agent's interface on that network (at most 15 bytes; see [`crate::ifname`]).
    pub interface_name: String,
    /// The server's own address (option 54), inside `subnet`.
    pub server_ip: Ipv4Addr,
    /// The subnet, host bits cleared (options 1 and 28).
    pub subnet: Ipv4Net,
    /// Default gateway (option 3).
    pub router: Option<Ipv4Addr>,
    /// DNS servers (option 6).
    pub dns: Vec<Ipv4Addr>,
    /// Domain name (option 15).
    pub domain_name: Option<String>,
    /// Search list (option 119).
    pub domain_search: Vec<String>,
    /// NTP servers, addresses or host names (option 42).
    pub ntp: Vec<String>,
    /// Lease duration in seconds (option 51).
    pub lease_seconds: u32,
    /// The network's MTU (option 26), at least 68.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u16>,
    /// Classless static routes (options 121 and 249), the default route not among them: a
    /// client that gets these ignores option 3, so the reply adds `0.0.0.0/0` via `router`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
    /// Addresses the controller records as used by another host (`status.ipv4.conflicts`):
    /// not offered, and re-probed by the serving agent so a freed one can be cleared.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflicted: Vec<Ipv4Addr>,
    /// Network boot, for clients that ask to boot from the network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot: Option<Boot>,
    /// The IPv6 side of a dual-stack pool (experimental), served over DHCPv6.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<PoolConfigV6>,
}

/// A classless static route: `destination` (host bits clear) via `gateway`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Route {
    /// The destination network.
    pub destination: Ipv4Net,
    /// The next hop.
    pub gateway: Ipv4Addr,
}

impl PoolConfig {
    /// Derives the config of `pool`, to be served on `interface_name`: [`ValidPool::parse`],
    /// then [`ValidPool::config`].
    pub fn from_ippool(pool: &IPPool, interface_name: &str) -> Result<Self, PoolError> {
        let mut config = ValidPool::parse(pool)?.config(interface_name)?;
        config.conflicted = conflicted_in(pool);
        if let Some(v6) = config.ipv6.as_mut() {
            v6.conflicted = conflicted_v6_in(pool);
        }
        Ok(config)
    }
}

/// The addresses `status.ipv4.conflicts` records, in address order; a key that is not an
/// address names nothing an agent could offer and is skipped (the controller reports it).
pub fn conflicted_in(pool: &IPPool) -> Vec<Ipv4Addr> {
    pool.status
        .as_ref()
        .and_then(|s| s.ipv4.as_ref())
        .map(|v4| v4.conflicts.keys().filter_map(|k| k.parse().ok()).collect())
        .unwrap_or_default()
}

/// The addresses `status.ipv6.conflicts` records, in address order ([`conflicted_in`]).
pub fn conflicted_v6_in(pool: &IPPool) -> Vec<Ipv6Addr> {
    let mut found: Vec<Ipv6Addr> = pool
        .status
        .as_ref()
        .and_then(|s| s.ipv6.as_ref())
        .map(|v6| v6.conflicts.keys().filter_map(|k| k.parse().ok()).collect())
        .unwrap_or_default();
    // Keys are RFC 5952 text, whose order is not the addresses'.
    found.sort_unstable();
    found.dedup();
    found
}

/// Whether `addr` is a usable host address of `subnet`: inside it, and neither its network nor
/// its broadcast address (for /31 and /32, every address inside counts, RFC 3021).
pub fn is_host_of(subnet: Ipv4Net, addr: Ipv4Addr) -> bool {
    subnet.contains(&addr)
        && (subnet.prefix_len() >= 31 || (addr != subnet.network() && addr != subnet.broadcast()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{IPPoolStatus, IPv4Status};

    use crate::fixtures::readme_pool;

    /// `status.ipv6.conflicts` reaches the agents as the IPv6 config's `conflicted`, in address
    /// order whatever the keys' spelling; a key that is no address is skipped.
    #[test]
    fn ipv6_conflicts_are_served_as_conflicted_in_address_order() {
        let mut pool = crate::fixtures::dual_stack_pool();
        let conflicts = ["fd00::0:20", "fd00::11", "not-an-address"]
            .into_iter()
            .map(|k| (k.to_owned(), crate::crd::AddressConflict::default()))
            .collect();
        pool.status = Some(IPPoolStatus {
            ipv6: Some(crate::crd::IPv6Status {
                conflicts,
                ..Default::default()
            }),
            ..Default::default()
        });
        let cfg = PoolConfig::from_ippool(&pool, "vmd0123456789").unwrap();
        let v6 = cfg.ipv6.unwrap();
        let want: Vec<Ipv6Addr> = vec!["fd00::11".parse().unwrap(), "fd00::20".parse().unwrap()];
        assert_eq!(v6.conflicted, want);
        assert!(cfg.conflicted.is_empty());
    }

    #[test]
    fn config_from_readme_pool() {
        let cfg = PoolConfig::from_ippool(&readme_pool(), "vmd0123456789").unwrap();
        assert_eq!(cfg.pool.to_string(), "default/net-48");
        assert_eq!(cfg.network.to_string(), "default/net-48");
        assert_eq!(cfg.server_ip, Ipv4Addr::new(192, 168, 48, 77));
        assert_eq!(cfg.subnet.to_string(), "192.168.48.0/24");
        assert_eq!(cfg.router, Some(Ipv4Addr::new(192, 168, 48, 1)));
        assert_eq!(cfg.dns, [Ipv4Addr::new(1, 1, 1, 1)]);
        assert_eq!(cfg.domain_name.as_deref(), Some("aibao.moe"));
        assert_eq!(cfg.domain_search, ["aibao.moe"]);
        assert_eq!(cfg.ntp, ["pool.ntp.org"]);
        assert_eq!(cfg.lease_seconds, 300);
    }

    #[test]
    fn lease_time_defaults_to_a_year() {
        let mut pool = readme_pool();
        pool.spec.ipv4_config.lease_time = None;
        assert_eq!(
            PoolConfig::from_ippool(&pool, "eth1")
                .unwrap()
                .lease_seconds,
            DEFAULT_LEASE_SECONDS
        );
        pool.spec.ipv4_config.lease_time = Some(0);
        assert_eq!(
            PoolConfig::from_ippool(&pool, "eth1")
                .unwrap()
                .lease_seconds,
            DEFAULT_LEASE_SECONDS
        );
    }

    #[test]
    fn leases_skip_markers_and_keep_good_entries_beside_bad_ones() {
        let mut pool = readme_pool();
        pool.status = Some(IPPoolStatus {
            ipv4: Some(IPv4Status {
                allocated: [
                    ("192.168.48.77", "RESERVED"),
                    ("192.168.48.81", "EXCLUDED"),
                    ("192.168.48.86", "C6:D6:82:39:D3:C3"),
                    ("192.168.48.87", "not-a-mac"),
                    ("192.168.48.x", "fa:e7:60:2e:37:dd"),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
                used: 1,
                available: 6,
                ..Default::default()
            }),
            ..Default::default()
        });
        let (leases, errors) = leases_from_status(&pool).unwrap();
        assert_eq!(leases.len(), 1);
        assert_eq!(leases[0].mac.to_string(), "c6:d6:82:39:d3:c3");
        assert_eq!(leases[0].ip, Ipv4Addr::new(192, 168, 48, 86));
        assert_eq!(errors.len(), 2);
        assert!(errors.iter().any(|e| e.to_string().contains("not-a-mac")));
        assert!(
            errors
                .iter()
                .any(|e| e.to_string().contains("192.168.48.x"))
        );
    }

    #[test]
    fn leases_carry_host_names_only_when_the_pool_sends_them_and_only_valid_ones() {
        let mut pool = readme_pool();
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        pool.status = Some(IPPoolStatus {
            ipv4: Some(IPv4Status {
                allocated: map(&[
                    ("192.168.48.86", "c6:d6:82:39:d3:c3"),
                    ("192.168.48.87", "c6:d6:82:39:d3:c4"),
                    ("192.168.48.88", "c6:d6:82:39:d3:c5"),
                ]),
                host_names: map(&[("192.168.48.86", "vm-1"), ("192.168.48.87", "Bad Name")]),
                ..Default::default()
            }),
            ..Default::default()
        });
        let names = |pool: &IPPool| {
            let (leases, errors) = leases_from_status(pool).unwrap();
            let names: Vec<Option<String>> = leases.into_iter().map(|l| l.host_name).collect();
            (names, errors)
        };
        let (off, errors) = names(&pool);
        assert_eq!(off, [None, None, None], "off unless sendHostName");
        assert!(errors.is_empty());
        pool.spec.ipv4_config.send_host_name = Some(true);
        let (on, errors) = names(&pool);
        assert_eq!(on, [Some("vm-1".to_owned()), None, None]);
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0]
                .to_string()
                .contains("hostNames[\"192.168.48.87\"]"),
            "{}",
            errors[0]
        );
    }

    #[test]
    fn host_addresses() {
        let net: Ipv4Net = "10.0.0.0/24".parse().unwrap();
        assert!(is_host_of(net, "10.0.0.1".parse().unwrap()));
        assert!(!is_host_of(net, "10.0.0.0".parse().unwrap()));
        assert!(!is_host_of(net, "10.0.0.255".parse().unwrap()));
        assert!(!is_host_of(net, "10.0.1.1".parse().unwrap()));
        let p2p: Ipv4Net = "10.0.0.0/31".parse().unwrap();
        assert!(is_host_of(p2p, "10.0.0.0".parse().unwrap()));
    }
}
