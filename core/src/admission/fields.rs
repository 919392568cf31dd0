//! What the admission rules of both kinds share: the JSON paths of the fields they name, the
//! parsers and checks of single fields (each refusing with a [`Rejection`] that names the field),
//! the lookups of objects by `namespace/name` and network, and what a rule written once for both
//! address families needs to know of each ([`AdmittedFamily`]).

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::Rejection;
use crate::claims::is_placeholder;
use crate::crd::{IPPool, NetworkConfig};
use crate::mac::MacAddr;
use crate::names::{NameError, NamespacedName};
use crate::pool::spec::not_a_host;
use crate::pool::v6::not_a_host_v6;
use crate::pool::{Family, Holder, PoolError, PoolRange, ValidPool, parse_allocated};

// The JSON paths of the fields the rules name in their rejections: the IPPool's from the one
// parse of its spec.
pub(super) use crate::pool::spec::{
    F_CIDR, F_DNS, F_DOMAIN, F_END, F_EXCLUDE, F_NETWORK, F_NTP, F_ROUTER, F_SEARCH, F_SERVER,
    F_START,
};
// The IPv6 side's, from the one parse of `spec.ipv6Config`.
pub(super) use crate::pool::v6::{
    F6, F6_CIDR, F6_DNS, F6_END, F6_EXCLUDE, F6_ROUTER, F6_SERVER, F6_START,
};
pub(super) const F_IPV4: &str = "spec.ipv4Config";
pub(super) const F_VM_NAME: &str = "spec.vmName";
pub(super) const F_CONFIGS: &str = "spec.networkConfigs";

/// What a rule written once for both address families needs to know of each, beyond
/// [`Family`]: where a pool keeps the family's config and books, and which field of a network
/// config requests a static address of it.
pub(super) trait AdmittedFamily: Family {
    /// The path of the pool's config of this family (`spec.ipv4Config`, `spec.ipv6Config`).
    const CONFIG_FIELD: &'static str;
    /// The JSON name of a network config's static address of this family.
    const NIC_FIELD: &'static str;
    /// The pool's `status.ipv4.allocated` or `status.ipv6.allocated`, if it has one.
    fn books(pool: &IPPool) -> Option<&BTreeMap<String, String>>;
    /// The range of this family of a parsed pool (`None`: the pool has no config of it).
    fn range(valid: &ValidPool) -> Option<&PoolRange<Self>>;
    /// Why `ip` is not a host address of `subnet`, in the words of the rules; `None` when it is.
    fn not_a_host(subnet: Self::Net, ip: Self) -> Option<String>;
    /// The static address of this family a network config requests, as written (`None` when
    /// unset or empty).
    fn requested(nc: &NetworkConfig) -> Option<&str>;
}

impl AdmittedFamily for Ipv4Addr {
    const CONFIG_FIELD: &'static str = F_IPV4;
    const NIC_FIELD: &'static str = "ipAddress";
    fn books(pool: &IPPool) -> Option<&BTreeMap<String, String>> {
        Some(&pool.status.as_ref()?.ipv4.as_ref()?.allocated)
    }
    fn range(valid: &ValidPool) -> Option<&PoolRange<Self>> {
        Some(valid.range())
    }
    fn not_a_host(subnet: Ipv4Net, ip: Self) -> Option<String> {
        not_a_host(subnet, ip)
    }
    fn requested(nc: &NetworkConfig) -> Option<&str> {
        optional(nc.ip_address.as_deref())
    }
}

impl AdmittedFamily for Ipv6Addr {
    const CONFIG_FIELD: &'static str = F6;
    const NIC_FIELD: &'static str = "ipv6Address";
    fn books(pool: &IPPool) -> Option<&BTreeMap<String, String>> {
        Some(&pool.status.as_ref()?.ipv6.as_ref()?.allocated)
    }
    fn range(valid: &ValidPool) -> Option<&PoolRange<Self>> {
        valid.ipv6().map(|v6| v6.range())
    }
    fn not_a_host(subnet: Ipv6Net, ip: Self) -> Option<String> {
        not_a_host_v6(subnet, ip)
    }
    fn requested(nc: &NetworkConfig) -> Option<&str> {
        optional(nc.ipv6_address.as_deref())
    }
}

/// An object's `namespace/name`, unvalidated (objects from the API always have both).
pub(super) fn key_of(meta: &ObjectMeta) -> NamespacedName {
    NamespacedName {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
    }
}

/// Whether a network name written in an object of namespace `ns` names `network`. Objects
/// already stored are read as the controller reads them (a bare name lives in their namespace).
pub(super) fn same_network(raw: &str, ns: &str, network: &NamespacedName) -> bool {
    NamespacedName::parse_in(raw, ns).is_ok_and(|n| n == *network)
}

/// The parsed `status.ipv4.allocated` or `status.ipv6.allocated` of a pool; malformed entries
/// are ignored (they block nothing, as they serve nothing).
pub(super) fn allocated_of<A: AdmittedFamily>(pool: &IPPool) -> BTreeMap<A, Holder> {
    match A::books(pool) {
        Some(books) => parse_allocated(&key_of(&pool.metadata), books).0,
        None => BTreeMap::new(),
    }
}

/// Whether `pool` could give `ip` (an address of family `A` someone asks for) to the asker: the
/// pool has the family; `ip` is a host address inside its range that is neither its server,
/// router nor excluded; and its books hold it for no one, or for a MAC `own` says is the
/// asker's, and not as a marker. Refusals are built by `refuse` from the rule broken.
pub(super) fn check_address<A: AdmittedFamily>(
    ip: A,
    pool: &IPPool,
    pool_ref: &NamespacedName,
    own: &dyn Fn(&MacAddr) -> bool,
    refuse: &dyn Fn(String) -> Rejection,
) -> Result<(), Rejection> {
    let valid = ValidPool::parse(pool).map_err(|e| {
        refuse(match e {
            PoolError::InvalidField { field, value, .. } => {
                format!("cannot be checked: IPPool {pool_ref} has an invalid {field} {value:?}")
            }
            other => format!("cannot be checked: {other}"),
        })
    })?;
    let Some(range) = A::range(&valid) else {
        return Err(refuse(format!(
            "is not allowed: IPPool {pool_ref} has no {}",
            A::CONFIG_FIELD
        )));
    };
    let (subnet, start, end) = (range.subnet(), range.start(), range.end());
    if !A::contains(&subnet, ip) {
        return Err(refuse(format!(
            "is outside cidr {subnet} of IPPool {pool_ref}"
        )));
    }
    if let Some(rule) = A::not_a_host(subnet, ip) {
        return Err(refuse(rule));
    }
    if ip < start || ip > end {
        return Err(refuse(format!(
            "is outside pool range {start}-{end} of IPPool {pool_ref}"
        )));
    }
    if ip == range.server_ip() {
        return Err(refuse(format!("is the server ip of IPPool {pool_ref}")));
    }
    if range.router() == Some(ip) {
        return Err(refuse(format!("is the router of IPPool {pool_ref}")));
    }
    if range.exclude().contains(&ip) {
        return Err(refuse(format!("is excluded by IPPool {pool_ref}")));
    }
    match allocated_of::<A>(pool).get(&ip) {
        Some(Holder::Mac(holder)) if own(holder) => Ok(()),
        Some(Holder::Mac(holder)) if is_placeholder(holder) => Err(refuse(format!(
            "is held by an AddressClaim (recorded for its placeholder {holder})"
        ))),
        Some(Holder::Mac(holder)) => Err(refuse(format!("is already occupied by MAC {holder}"))),
        Some(Holder::Reserved) => Err(refuse("is already occupied (RESERVED)".into())),
        Some(Holder::Excluded) => Err(refuse("is already occupied (EXCLUDED)".into())),
        None => Ok(()),
    }
}

pub(super) fn is_missing(value: &str) -> bool {
    value.trim().is_empty()
}

/// An optional string field, with an empty string meaning unset (as the controller reads it).
pub(super) fn optional(value: Option<&str>) -> Option<&str> {
    value.filter(|s| !s.is_empty())
}

pub(super) fn immutable(field: &str, value: &str, before: &str) -> Rejection {
    Rejection::new(
        field,
        value,
        if value.is_empty() {
            format!("is immutable and cannot be removed once set (was {before:?})")
        } else {
            format!("is immutable (was {before:?})")
        },
    )
}

/// A network reference written by the user: `namespace/name` in full, since the NAD it names
/// must be found without guessing.
pub(super) fn parse_network(field: &str, value: &str) -> Result<NamespacedName, Rejection> {
    if is_missing(value) {
        return Err(Rejection::new(field, value, "is required"));
    }
    value.parse().map_err(|e| {
        let rule = match e {
            NameError::MissingNamespace { .. } => {
                "must name a NetworkAttachmentDefinition as namespace/name".to_owned()
            }
            NameError::BadNamespace { part, .. } => format!(
                "has namespace {part:?}, which is not a DNS-1123 label (lowercase alphanumerics and '-', at most 63)"
            ),
            NameError::BadName { part, .. } => format!(
                "has name {part:?}, which is not a DNS-1123 subdomain (lowercase alphanumerics, '-' and '.', at most 253)"
            ),
        };
        Rejection::new(field, value, rule)
    })
}

pub(super) fn parse_cidr(value: &str) -> Result<Ipv4Net, Rejection> {
    if is_missing(value) {
        return Err(Rejection::new(F_CIDR, value, "is required"));
    }
    value
        .parse::<Ipv4Net>()
        .map(|n| n.trunc())
        .map_err(|_| Rejection::new(F_CIDR, value, "is not an IPv4 CIDR (e.g. 192.168.48.0/24)"))
}

/// An address of family `A` written by the user (`is not an IPv4 address`, or IPv6: an address
/// of the other family is refused like any other string).
pub(super) fn parse_ip<A: Family>(field: &str, value: &str) -> Result<A, Rejection> {
    if is_missing(value) {
        return Err(Rejection::new(field, value, "is required"));
    }
    value
        .parse()
        .map_err(|_| Rejection::new(field, value, format!("is not an {} address", A::NAME)))
}

/// The addresses of `subnet` a host may use, under the same rule as [`crate::pool::is_host_of`]: all but the
/// network and broadcast addresses, or every address of a /31 or /32 (RFC 3021).
pub(super) fn host_range(subnet: Ipv4Net) -> (Ipv4Addr, Ipv4Addr) {
    let (network, broadcast) = (u32::from(subnet.network()), u32::from(subnet.broadcast()));
    if subnet.prefix_len() >= 31 {
        (network.into(), broadcast.into())
    } else {
        // prefix ≤ 30: broadcast ≥ network + 3, so neither step wraps.
        (
            network.saturating_add(1).into(),
            broadcast.saturating_sub(1).into(),
        )
    }
}

pub(super) fn check_count(field: &str, items: &[String], max: usize) -> Result<(), Rejection> {
    if items.len() > max {
        return Err(Rejection::new(
            field,
            items.join(","),
            format!("has {} entries, at most {max} are allowed", items.len()),
        ));
    }
    Ok(())
}

/// Whether `s` is a DNS name under RFC 1123: dot-separated labels of 1 to 63 letters, digits and
/// inner hyphens, at most 253 characters. A last label of only digits is refused too (no
/// top-level domain is numeric, RFC 3696), so a mistyped address such as `10.0.0` is not taken
/// for a host name.
pub(super) fn is_dns_name(s: &str) -> bool {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    s.len() <= 253
        && s.split('.').all(label_ok)
        && s.rsplit('.')
            .next()
            .is_some_and(|last| !last.bytes().all(|c| c.is_ascii_digit()))
}
