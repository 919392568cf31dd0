//! IPPool admission: the defaults the mutating webhook fills in on create
//! ([`ippool_defaults`]), and what create, update and delete refuse ([`validate_ippool_create`],
//! [`validate_ippool_update`], [`validate_ippool_delete`]), all resting on [`check_pool_spec`].
//!
//! A dual-stack pool's `ipv6Config` (experimental) is checked by the same rules as its
//! `ipv4Config` wherever a rule is the same for both families (the addressing, its immutability,
//! the addresses NICs hold), written once over [`Written`] and [`AdmittedFamily`]; what only IPv6
//! has (the CIDR's prefix and kind, the size of the range, IPv4 first) is in [`check_pool_v6`].

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};

use super::fields::{
    AdmittedFamily, F_CIDR, F_DNS, F_DOMAIN, F_END, F_EXCLUDE, F_IPV4, F_NETWORK, F_NTP, F_ROUTER,
    F_SEARCH, F_SERVER, F_START, F6, F6_CIDR, F6_DNS, F6_END, F6_EXCLUDE, F6_ROUTER, F6_SERVER,
    F6_START, allocated_of, check_count, host_range, immutable, is_dns_name, is_missing, key_of,
    optional, parse_cidr, parse_network, same_network,
};
use super::{PoolDefaults, PoolFacts, Rejection};
use crate::crd::{IPPool, IPPoolSpec, IPv4Config, IPv6Config, VirtualMachineNetworkConfig};
use crate::names::NamespacedName;
use crate::pool::spec::{F_ROUTES, not_a_host};
use crate::pool::v6::MAX_V6_RANGE;
use crate::pool::{Family, Holder, PoolError, PoolRange, ValidPool};

/// Most DNS servers an IPPool may hand out (upstream's CRD `maxItems`).
pub const MAX_DNS: usize = 3;
/// Most NTP servers an IPPool may hand out (upstream's CRD `maxItems`).
pub const MAX_NTP: usize = 4;
/// Most classless static routes an IPPool may hand out (each up to 9 bytes of option 121, and
/// again in 249: 16 fit any client's 576-byte reply with the other options).
pub const MAX_ROUTES: usize = 16;
/// Most users a delete refusal names, so the message stays readable for a busy network.
pub const MAX_LISTED_USERS: usize = 5;
/// The shortest prefix an `ipv6Config.cidr` may have: a /64, the usual size of an IPv6 subnet
/// and the only one SLAAC works on (its range may still span at most [`MAX_V6_RANGE`]
/// addresses).
pub const MIN_V6_PREFIX: u8 = 64;
/// The longest prefix an `ipv6Config.cidr` may have: a /126, whose 3 host addresses leave room
/// for a server and a client (a /127 is a point-to-point link, RFC 6164).
pub const MAX_V6_PREFIX: u8 = 126;

/// The mutating webhook's defaults for a new pool (upstream's mutator): a missing start or end
/// becomes the first or last host address of the CIDR, and a missing serverIP the first host
/// address that is neither the router nor excluded. Refuses an unparseable CIDR (nothing can be
/// derived from it), a range whose start ends up after its end ("invalid pool range"), and a
/// subnet with no address left for the server ("fail to assign ip for dhcp server"). Other
/// malformed fields are left for the validator to name.
///
/// An `ipv6Config` gets no defaults (its range would default to a whole /64, past the limit):
/// its `cidr`, `serverIP` and `pool` are required. A pool with an `ipv6Config` and no
/// `ipv4Config` is refused here already (IPv4 first), with the reason rather than a missing CIDR.
pub fn ippool_defaults(spec: &IPPoolSpec) -> Result<PoolDefaults, Rejection> {
    check_ipv4_first(spec)?;
    let v4 = &spec.ipv4_config;
    let subnet = parse_cidr(&v4.cidr)?;
    let (first, last) = host_range(subnet);
    let mut defaults = PoolDefaults::default();

    let start = if is_missing(&v4.pool.start) {
        defaults.start = Some(first);
        Some(first)
    } else {
        v4.pool.start.parse::<Ipv4Addr>().ok()
    };
    let end = if is_missing(&v4.pool.end) {
        defaults.end = Some(last);
        Some(last)
    } else {
        v4.pool.end.parse::<Ipv4Addr>().ok()
    };
    if let (Some(start), Some(end)) = (start, end) {
        check_range_order(start, end)?;
    }

    if is_missing(&v4.server_ip) {
        let router = optional(v4.router.as_deref()).and_then(|r| r.parse::<Ipv4Addr>().ok());
        let excluded: BTreeSet<Ipv4Addr> = v4
            .pool
            .exclude
            .iter()
            .filter_map(|e| e.parse().ok())
            .collect();
        // Each address skipped is the router or an exclude, so this ends within
        // `excluded.len() + 2` steps however large the subnet.
        let server = (u32::from(first)..=u32::from(last))
            .map(Ipv4Addr::from)
            .find(|ip| Some(*ip) != router && !excluded.contains(ip))
            .ok_or_else(|| {
                Rejection::new(
                    F_SERVER,
                    &v4.server_ip,
                    format!(
                        "fail to assign ip for dhcp server: every host address of {subnet} is the router or excluded"
                    ),
                )
            })?;
        defaults.server_ip = Some(server);
    }
    Ok(defaults)
}

/// Admits a new IPPool only if the controller can serve it: a NAD that exists and no other pool
/// serves, a CIDR clear of the service CIDR, a sane range, and well-formed options.
pub fn validate_ippool_create(pool: &IPPool, facts: &PoolFacts) -> Result<(), Rejection> {
    check_pool_spec(pool, facts).map(|_| ())
}

/// Admits a change to an IPPool: the addressing (network, CIDR, server, range, excludes, router)
/// is immutable, as upstream's CEL rules say, except that a router or an exclude list may be
/// added where there was none, if no NIC holds those addresses; the options (dns, domain*, ntp,
/// leaseTime, paused) change freely. An update that leaves the spec as it is (finalizers,
/// labels, annotations) is always admitted, so the controller can never be locked out of its
/// own objects.
///
/// The same holds for the `ipv6Config` of a dual-stack pool, checked against `status.ipv6`; an
/// `ipv6Config` may be added to a pool (and is then checked as on create), never removed.
pub fn validate_ippool_update(
    old: &IPPool,
    new: &IPPool,
    facts: &PoolFacts,
) -> Result<(), Rejection> {
    if old.spec == new.spec {
        return Ok(());
    }
    if old.spec.network_name != new.spec.network_name {
        return Err(immutable(
            F_NETWORK,
            &new.spec.network_name,
            &old.spec.network_name,
        ));
    }
    let (o4, n4) = (
        Written::v4(&old.spec.ipv4_config),
        Written::v4(&new.spec.ipv4_config),
    );
    check_addressing_unchanged(&o4, &n4)?;
    let o6 = old.spec.ipv6_config.as_ref().map(Written::v6);
    let n6 = new.spec.ipv6_config.as_ref().map(Written::v6);
    match (&o6, &n6) {
        (Some(before), None) => {
            return Err(Rejection::new(
                F6,
                "",
                format!(
                    "cannot be removed once set (was cidr {:?}): a dual-stack pool stays dual-stack",
                    before.cidr
                ),
            ));
        }
        (Some(before), Some(after)) => check_addressing_unchanged(before, after)?,
        // Added (checked below as on create), or absent on both sides.
        (None, _) => {}
    }

    let valid = check_pool_spec(new, facts)?;
    // The status the apiserver stores: on a validated update, new.status is old.status.
    check_not_occupied(old, Some(&o4), &n4, valid.range())?;
    if let (Some(after), Some(v6)) = (&n6, valid.ipv6()) {
        check_not_occupied(old, o6.as_ref(), after, v6.range())?;
    }
    Ok(())
}

/// One family's addressing as the user wrote it, with the paths of its fields, so that a rule on
/// addressing is written once for `ipv4Config` and `ipv6Config`.
struct Written<'a> {
    /// `spec.ipv4Config.cidr` or `spec.ipv6Config.cidr`, and so on.
    f: &'static FieldPaths,
    cidr: &'a str,
    server_ip: &'a str,
    start: &'a str,
    end: &'a str,
    /// Unset or empty: `None` (as the controller reads it).
    router: Option<&'a str>,
    exclude: &'a [String],
}

/// The paths of one family's addressing fields.
struct FieldPaths {
    cidr: &'static str,
    server: &'static str,
    start: &'static str,
    end: &'static str,
    router: &'static str,
    exclude: &'static str,
}

const V4_PATHS: FieldPaths = FieldPaths {
    cidr: F_CIDR,
    server: F_SERVER,
    start: F_START,
    end: F_END,
    router: F_ROUTER,
    exclude: F_EXCLUDE,
};

const V6_PATHS: FieldPaths = FieldPaths {
    cidr: F6_CIDR,
    server: F6_SERVER,
    start: F6_START,
    end: F6_END,
    router: F6_ROUTER,
    exclude: F6_EXCLUDE,
};

impl<'a> Written<'a> {
    fn v4(v4: &'a IPv4Config) -> Self {
        Written {
            f: &V4_PATHS,
            cidr: &v4.cidr,
            server_ip: &v4.server_ip,
            start: &v4.pool.start,
            end: &v4.pool.end,
            router: optional(v4.router.as_deref()),
            exclude: &v4.pool.exclude,
        }
    }

    fn v6(v6: &'a IPv6Config) -> Self {
        Written {
            f: &V6_PATHS,
            cidr: &v6.cidr,
            server_ip: &v6.server_ip,
            start: &v6.pool.start,
            end: &v6.pool.end,
            router: optional(v6.router.as_deref()),
            exclude: &v6.pool.exclude,
        }
    }
}

/// One family's addressing on update (upstream's CEL rules): CIDR, server and range unchanged,
/// a router or an exclude list added only where there was none.
fn check_addressing_unchanged(before: &Written, after: &Written) -> Result<(), Rejection> {
    let f = after.f;
    for (field, was, now) in [
        (f.cidr, before.cidr, after.cidr),
        (f.server, before.server_ip, after.server_ip),
        (f.start, before.start, after.start),
        (f.end, before.end, after.end),
    ] {
        if was != now {
            return Err(immutable(field, now, was));
        }
    }
    if let Some(was) = before.router
        && after.router != Some(was)
    {
        return Err(immutable(f.router, after.router.unwrap_or_default(), was));
    }
    if !before.exclude.is_empty() && before.exclude != after.exclude {
        return Err(immutable(
            f.exclude,
            &after.exclude.join(","),
            &before.exclude.join(","),
        ));
    }
    Ok(())
}

/// One family's addresses against the books of the pool (`old`, whose status is the one
/// stored): a router or excludes added where there were none (`before` is `None` when the whole
/// family is being added) may not be held by a NIC, and the server never (nor `EXCLUDED`).
fn check_not_occupied<A: AdmittedFamily>(
    old: &IPPool,
    before: Option<&Written>,
    after: &Written,
    checked: &PoolRange<A>,
) -> Result<(), Rejection> {
    let f = after.f;
    let allocated = allocated_of::<A>(old);
    let held_by_mac = |ip: A| match allocated.get(&ip) {
        Some(Holder::Mac(mac)) => Some(*mac),
        _ => None,
    };
    if before.and_then(|w| w.router).is_none()
        && let (Some(router), Some(raw)) = (checked.router(), after.router)
        && let Some(mac) = held_by_mac(router)
    {
        return Err(Rejection::new(
            f.router,
            raw,
            format!("is already occupied by MAC {mac}"),
        ));
    }
    if before.is_none_or(|w| w.exclude.is_empty()) {
        for (i, (ip, raw)) in checked.exclude().iter().zip(after.exclude).enumerate() {
            if let Some(mac) = held_by_mac(*ip) {
                return Err(Rejection::new(
                    format!("{}[{i}]", f.exclude),
                    raw,
                    format!("is already occupied by MAC {mac}"),
                ));
            }
        }
    }
    match allocated.get(&checked.server_ip()) {
        Some(Holder::Mac(mac)) => Err(Rejection::new(
            f.server,
            after.server_ip,
            format!("is already occupied by MAC {mac}"),
        )),
        Some(Holder::Excluded) => Err(Rejection::new(
            f.server,
            after.server_ip,
            "is already occupied (EXCLUDED)",
        )),
        Some(Holder::Reserved) | None => Ok(()),
    }
}

/// Refuses to delete a pool while any VirtualMachineNetworkConfig has a NIC on its network, so
/// no VM silently loses its lease. Unlike upstream (which looked users up by the pool's own
/// ns/name and so missed them whenever pool and NAD names differed), users are found by network.
/// `users`: every VirtualMachineNetworkConfig in the cluster.
pub fn validate_ippool_delete(
    pool: &IPPool,
    users: &[VirtualMachineNetworkConfig],
) -> Result<(), Rejection> {
    let pool_ns = pool.metadata.namespace.as_deref().unwrap_or_default();
    let Ok(network) = NamespacedName::parse_in(&pool.spec.network_name, pool_ns) else {
        // A pool whose network cannot be named cannot have been served to anyone.
        return Ok(());
    };
    let mut using: Vec<NamespacedName> = users
        .iter()
        .filter(|cfg| {
            let ns = cfg.metadata.namespace.as_deref().unwrap_or_default();
            cfg.spec
                .network_configs
                .iter()
                .any(|nc| same_network(&nc.network_name, ns, &network))
        })
        .map(|cfg| key_of(&cfg.metadata))
        .collect();
    if using.is_empty() {
        return Ok(());
    }
    using.sort();
    using.dedup();
    let mut listed = using
        .iter()
        .take(MAX_LISTED_USERS)
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if using.len() > MAX_LISTED_USERS {
        listed.push_str(&format!(" and {} more", using.len() - MAX_LISTED_USERS));
    }
    Err(Rejection::new(
        F_NETWORK,
        &pool.spec.network_name,
        format!(
            "is still used by VirtualMachineNetworkConfig(s) {listed}, which must be removed at first"
        ),
    ))
}

/// Every rule a pool must satisfy on create and (when its spec changes) on update, in order:
/// its network, IPv4 first, the one parse of its spec ([`ValidPool::parse`], both families), its
/// CIDR against the cluster's, the addressing policy, the options, then the IPv6 side's policy.
fn check_pool_spec(pool: &IPPool, facts: &PoolFacts) -> Result<ValidPool, Rejection> {
    let v4 = &pool.spec.ipv4_config;
    check_pool_network(pool, facts)?;
    check_ipv4_first(&pool.spec)?;
    let valid = ValidPool::parse(pool).map_err(|e| match e {
        PoolError::InvalidField {
            field,
            value,
            reason,
            ..
        } => Rejection::new(field, value, reason),
        other => Rejection::new("metadata", "", other.to_string()),
    })?;
    check_service_cidr(v4, valid.range().subnet(), facts)?;
    check_pool_addressing(&Written::v4(v4), valid.range())?;
    check_pool_options(v4)?;
    check_pool_routes(v4, &valid)?;
    if let (Some(v6), Some(valid6)) = (&pool.spec.ipv6_config, valid.ipv6()) {
        check_pool_v6(v6, valid6.range())?;
    }
    Ok(valid)
}

/// IPv4 first (Harvester's dual-stack design): an `ipv6Config` needs an `ipv4Config`, as IPv4
/// stays the primary family of every pool and NIC; an IPv6-only pool is not supported.
fn check_ipv4_first(spec: &IPPoolSpec) -> Result<(), Rejection> {
    if spec.ipv6_config.is_some() && spec.ipv4_config == IPv4Config::default() {
        return Err(Rejection::new(
            F_IPV4,
            "",
            format!(
                "is required with {F6}: IPv4 is the primary family, IPv6-only pools are not supported"
            ),
        ));
    }
    Ok(())
}

/// What a dual-stack pool's `ipv6Config` must meet beyond being servable ([`ValidPool::parse`]
/// checks that its addresses are IPv6, inside the CIDR and not its subnet-router anycast
/// address, and the range in order): a CIDR fit for a VM network, a range of at most
/// [`MAX_V6_RANGE`] addresses, the addressing policy of IPv4, at most [`MAX_DNS`] DNS servers.
fn check_pool_v6(v6: &IPv6Config, range: &PoolRange<Ipv6Addr>) -> Result<(), Rejection> {
    check_v6_cidr(&v6.cidr, range.subnet())?;
    let size = range.size();
    if size > MAX_V6_RANGE {
        return Err(Rejection::new(
            F6_END,
            &v6.pool.end,
            format!(
                "makes pool range {}-{} span {size} addresses, at most {MAX_V6_RANGE} are allowed",
                range.start(),
                range.end()
            ),
        ));
    }
    check_pool_addressing(&Written::v6(v6), range)?;
    check_count(F6_DNS, &v6.dns, MAX_DNS)
}

/// `spec.ipv6Config.cidr`: a prefix of [`MIN_V6_PREFIX`] to [`MAX_V6_PREFIX`] bits, of unicast
/// addresses a VM may hold on a network (not link-local, multicast or IPv4-mapped, and holding
/// neither the loopback nor the unspecified address).
fn check_v6_cidr(raw: &str, subnet: Ipv6Net) -> Result<(), Rejection> {
    let refuse = |rule: String| Err(Rejection::new(F6_CIDR, raw, rule));
    let prefix = subnet.prefix_len();
    if !(MIN_V6_PREFIX..=MAX_V6_PREFIX).contains(&prefix) {
        return refuse(format!(
            "has prefix length /{prefix}, it must be /{MIN_V6_PREFIX} to /{MAX_V6_PREFIX}"
        ));
    }
    let overlaps = |net: &str| {
        net.parse::<Ipv6Net>()
            .is_ok_and(|n| n.contains(&subnet.network()) || subnet.contains(&n.network()))
    };
    // With a prefix of at most /126, a CIDR holding ::1 holds :: too.
    if subnet.contains(&Ipv6Addr::UNSPECIFIED) {
        return refuse("holds the unspecified address :: and the loopback address ::1".into());
    }
    for (net, kind) in [
        ("::ffff:0:0/96", "IPv4-mapped"),
        ("fe80::/10", "link-local"),
        ("ff00::/8", "multicast"),
    ] {
        if overlaps(net) {
            return refuse(format!(
                "is {kind} ({net}), not a network a VM may be addressed on"
            ));
        }
    }
    Ok(())
}

/// `spec.networkName`: a full reference to a NAD that exists and no other pool serves.
fn check_pool_network(pool: &IPPool, facts: &PoolFacts) -> Result<(), Rejection> {
    let spec = &pool.spec;
    let me = key_of(&pool.metadata);

    let network = parse_network(F_NETWORK, &spec.network_name)?;
    if facts.nad.is_none() {
        return Err(Rejection::new(
            F_NETWORK,
            &spec.network_name,
            format!("NetworkAttachmentDefinition {network} not found"),
        ));
    }
    let mut rivals: Vec<NamespacedName> = facts
        .pools
        .iter()
        .filter(|p| key_of(&p.metadata) != me)
        .filter(|p| {
            let ns = p.metadata.namespace.as_deref().unwrap_or_default();
            same_network(&p.spec.network_name, ns, &network)
        })
        .map(|p| key_of(&p.metadata))
        .collect();
    rivals.sort();
    if let Some(rival) = rivals.first() {
        return Err(Rejection::new(
            F_NETWORK,
            &spec.network_name,
            format!("is already served by IPPool {rival}"),
        ));
    }
    Ok(())
}

/// `spec.ipv4Config.cidr` clear of the cluster's service CIDR.
fn check_service_cidr(
    v4: &IPv4Config,
    subnet: Ipv4Net,
    facts: &PoolFacts,
) -> Result<(), Rejection> {
    if let Some(service) = facts.service_cidr
        && (subnet.contains(&service.network()) || service.contains(&subnet.network()))
    {
        return Err(Rejection::new(
            F_CIDR,
            &v4.cidr,
            format!("overlaps cluster service cidr {}", service.trunc()),
        ));
    }
    Ok(())
}

/// What a new pool's addressing must meet beyond being servable, for either family: a router
/// apart from the server, excludes unique and in range, and neither server nor router excluded.
fn check_pool_addressing<A: Family>(w: &Written, range: &PoolRange<A>) -> Result<(), Rejection> {
    let f = w.f;
    let (server_ip, router) = (range.server_ip(), range.router());
    let (start, end) = (range.start(), range.end());
    if router == Some(server_ip) {
        return Err(Rejection::new(
            f.server,
            w.server_ip,
            format!("must differ from {} {server_ip}", f.router),
        ));
    }
    let exclude = range.exclude();
    for (i, (ip, raw)) in exclude.iter().zip(w.exclude).enumerate() {
        let field = format!("{}[{i}]", f.exclude);
        if *ip < start || *ip > end {
            return Err(Rejection::new(
                field,
                raw,
                format!("is outside pool range {start}-{end}"),
            ));
        }
        if let Some(j) = exclude[..i].iter().position(|e| e == ip) {
            return Err(Rejection::new(
                field,
                raw,
                format!("duplicates {}[{j}]", f.exclude),
            ));
        }
    }
    for (field, raw, ip) in [
        (f.server, w.server_ip, Some(server_ip)),
        (f.router, w.router.unwrap_or_default(), router),
    ] {
        if let Some(ip) = ip
            && let Some(i) = exclude.iter().position(|e| *e == ip)
        {
            return Err(Rejection::new(
                field,
                raw,
                format!("is excluded by {}[{i}]", f.exclude),
            ));
        }
    }
    Ok(())
}

/// The options handed out, beyond what [`ValidPool::parse`] checks (addresses, lease time): at
/// most [`MAX_DNS`] DNS servers and [`MAX_NTP`] NTP servers (addresses or host names), DNS names
/// for the domain and search list.
fn check_pool_options(v4: &IPv4Config) -> Result<(), Rejection> {
    check_count(F_DNS, &v4.dns, MAX_DNS)?;
    check_count(F_NTP, &v4.ntp, MAX_NTP)?;
    for (i, raw) in v4.ntp.iter().enumerate() {
        if raw.parse::<Ipv4Addr>().is_err() && !is_dns_name(raw) {
            return Err(Rejection::new(
                format!("{F_NTP}[{i}]"),
                raw,
                "is neither an IPv4 address nor a host name (RFC 1123)",
            ));
        }
    }
    if let Some(domain) = optional(v4.domain_name.as_deref())
        && !is_dns_name(domain)
    {
        return Err(Rejection::new(
            F_DOMAIN,
            domain,
            "is not a valid DNS domain name (RFC 1123)",
        ));
    }
    for (i, raw) in v4.domain_search.iter().enumerate() {
        if !is_dns_name(raw) {
            return Err(Rejection::new(
                format!("{F_SEARCH}[{i}]"),
                raw,
                "is not a valid DNS domain name (RFC 1123)",
            ));
        }
    }
    Ok(())
}

/// `spec.ipv4Config.routes`: at most [`MAX_ROUTES`], each a network written with its host bits
/// clear, not the default route (that is `router`'s, or none with `defaultRoute: false`), not
/// listed twice, via a gateway on the pool's subnet.
fn check_pool_routes(v4: &IPv4Config, valid: &ValidPool) -> Result<(), Rejection> {
    if v4.routes.len() > MAX_ROUTES {
        return Err(Rejection::new(
            F_ROUTES,
            v4.routes.len().to_string(),
            format!(
                "has {} entries, at most {MAX_ROUTES} are allowed",
                v4.routes.len()
            ),
        ));
    }
    let subnet = valid.range().subnet();
    for (i, (route, raw)) in valid.routes().iter().zip(&v4.routes).enumerate() {
        let field = |name: &str| format!("{F_ROUTES}[{i}].{name}");
        let written: Ipv4Net = raw.destination.parse().unwrap_or(route.destination);
        if written != route.destination {
            return Err(Rejection::new(
                field("destination"),
                &raw.destination,
                format!("has host bits set (the network is {})", route.destination),
            ));
        }
        if route.destination.prefix_len() == 0 {
            return Err(Rejection::new(
                field("destination"),
                &raw.destination,
                format!("is the default route: set {F_ROUTER} instead"),
            ));
        }
        if let Some(j) = valid.routes()[..i]
            .iter()
            .position(|r| r.destination == route.destination)
        {
            return Err(Rejection::new(
                field("destination"),
                &raw.destination,
                format!("duplicates {F_ROUTES}[{j}].destination"),
            ));
        }
        if let Some(rule) = not_a_host(subnet, route.gateway) {
            return Err(Rejection::new(field("gateway"), &raw.gateway, rule));
        }
    }
    Ok(())
}

fn check_range_order(start: Ipv4Addr, end: Ipv4Addr) -> Result<(), Rejection> {
    if start > end {
        return Err(Rejection::new(
            F_START,
            start.to_string(),
            format!("is after {F_END} {end}: invalid pool range"),
        ));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::admission::tests_support::*;
    use crate::crd::IPv6Config;
    use crate::crd::StaticRoute;
    use crate::pool::spec::{F_LEASE, F_MTU};
    use proptest::prelude::*;

    // === mutator ===

    #[test]
    fn defaults_fill_range_and_server_from_cidr() {
        let pool = bare_pool("10.0.0.0/24");
        assert_eq!(
            ippool_defaults(&pool.spec).unwrap(),
            PoolDefaults {
                start: Some(ip("10.0.0.1")),
                end: Some(ip("10.0.0.254")),
                server_ip: Some(ip("10.0.0.1")),
            }
        );
        let mut with_router = bare_pool("10.0.0.0/24");
        with_router.spec.ipv4_config.router = Some("10.0.0.1".into());
        with_router.spec.ipv4_config.pool.exclude = vec!["10.0.0.2".into(), "10.0.0.4".into()];
        assert_eq!(
            ippool_defaults(&with_router.spec).unwrap().server_ip,
            Some(ip("10.0.0.3"))
        );
        // Filled fields make a pool the validator admits.
        let d = ippool_defaults(&pool.spec).unwrap();
        let mut filled = pool.clone();
        filled.spec.ipv4_config.pool.start = d.start.unwrap().to_string();
        filled.spec.ipv4_config.pool.end = d.end.unwrap().to_string();
        filled.spec.ipv4_config.server_ip = d.server_ip.unwrap().to_string();
        create(&filled).unwrap();
    }

    #[test]
    fn defaults_leave_given_fields_alone() {
        let mut pool = bare_pool("10.0.0.0/24");
        pool.spec.ipv4_config.pool.start = "10.0.0.100".into();
        pool.spec.ipv4_config.server_ip = "10.0.0.5".into();
        assert_eq!(
            ippool_defaults(&pool.spec).unwrap(),
            PoolDefaults {
                start: None,
                end: Some(ip("10.0.0.254")),
                server_ip: None,
            }
        );
    }

    #[test]
    fn defaults_follow_is_host_of_for_point_to_point() {
        let p31 = bare_pool("10.0.0.4/31");
        assert_eq!(
            ippool_defaults(&p31.spec).unwrap(),
            PoolDefaults {
                start: Some(ip("10.0.0.4")),
                end: Some(ip("10.0.0.5")),
                server_ip: Some(ip("10.0.0.4")),
            }
        );
        let p32 = bare_pool("10.0.0.9/32");
        assert_eq!(
            ippool_defaults(&p32.spec).unwrap().server_ip,
            Some(ip("10.0.0.9"))
        );
    }

    #[test]
    fn defaults_refuse_an_inverted_range() {
        let mut pool = bare_pool("10.0.0.0/24");
        pool.spec.ipv4_config.pool.start = "10.0.0.200".into();
        pool.spec.ipv4_config.pool.end = "10.0.0.100".into();
        refused(ippool_defaults(&pool.spec), F_START, "invalid pool range");
        // The defaulted start counts too.
        let mut pool = bare_pool("10.0.0.0/24");
        pool.spec.ipv4_config.pool.end = "10.0.0.0".into();
        let r = refused(ippool_defaults(&pool.spec), F_START, "invalid pool range");
        assert_eq!(r.value, "10.0.0.1");
    }

    #[test]
    fn defaults_refuse_when_no_server_address_is_left() {
        let mut pool = bare_pool("10.0.0.0/31");
        pool.spec.ipv4_config.router = Some("10.0.0.0".into());
        pool.spec.ipv4_config.pool.exclude = vec!["10.0.0.1".into()];
        refused(
            ippool_defaults(&pool.spec),
            F_SERVER,
            "fail to assign ip for dhcp server",
        );
        let mut pool = bare_pool("10.0.0.7/32");
        pool.spec.ipv4_config.router = Some("10.0.0.7".into());
        refused(
            ippool_defaults(&pool.spec),
            F_SERVER,
            "fail to assign ip for dhcp server",
        );
    }

    #[test]
    fn defaults_refuse_a_bad_cidr() {
        refused(
            ippool_defaults(&bare_pool("10.0.0.0/33").spec),
            F_CIDR,
            "is not an IPv4 CIDR",
        );
        refused(ippool_defaults(&bare_pool("").spec), F_CIDR, "is required");
    }

    // === IPPool create ===

    #[test]
    fn network_name_must_be_a_full_reference() {
        for (value, rule) in [
            ("", "is required"),
            ("net-48", "namespace/name"),
            ("Default/net-48", "DNS-1123 label"),
            ("default/Net_48", "DNS-1123 subdomain"),
        ] {
            let mut pool = readme_pool();
            pool.spec.network_name = value.into();
            let r = refused(create(&pool), F_NETWORK, rule);
            assert_eq!(r.value, value);
        }
        create(&readme_pool()).unwrap();
    }

    #[test]
    fn nad_must_exist() {
        let pool = readme_pool();
        let facts = PoolFacts {
            nad: None,
            pools: &[],
            service_cidr: None,
        };
        refused(
            validate_ippool_create(&pool, &facts),
            F_NETWORK,
            "NetworkAttachmentDefinition default/net-48 not found",
        );
        create(&pool).unwrap();
    }

    #[test]
    fn addresses_must_parse() {
        type Mutation = fn(&mut IPPool);
        let cases: [(Mutation, &str, &str); 8] = [
            (
                |p| p.spec.ipv4_config.cidr = "192.168.48/24".into(),
                F_CIDR,
                "is not an IPv4 CIDR",
            ),
            (
                |p| p.spec.ipv4_config.server_ip = "192.168.48.777".into(),
                F_SERVER,
                "is not an IPv4 address",
            ),
            (
                |p| p.spec.ipv4_config.server_ip = String::new(),
                F_SERVER,
                "is required",
            ),
            (
                |p| p.spec.ipv4_config.pool.start = "x".into(),
                F_START,
                "is not an IPv4 address",
            ),
            (
                |p| p.spec.ipv4_config.pool.end = "192.168.48.09".into(),
                F_END,
                "is not an IPv4 address",
            ),
            (
                |p| p.spec.ipv4_config.router = Some("gw".into()),
                F_ROUTER,
                "is not an IPv4 address",
            ),
            (
                |p| p.spec.ipv4_config.pool.exclude[1] = "::1".into(),
                "spec.ipv4Config.pool.exclude[1]",
                "is not an IPv4 address",
            ),
            (
                |p| p.spec.ipv4_config.dns = vec!["1.1.1.1".into(), "dns.google".into()],
                "spec.ipv4Config.dns[1]",
                "is not an IPv4 address",
            ),
        ];
        for (mutate, field, rule) in cases {
            let mut pool = readme_pool();
            mutate(&mut pool);
            refused(create(&pool), field, rule);
        }
        // Host bits in the CIDR are tolerated (as upstream's net.ParseCIDR does); an empty
        // router is no router.
        let mut pool = readme_pool();
        pool.spec.ipv4_config.cidr = "192.168.48.5/24".into();
        pool.spec.ipv4_config.router = Some(String::new());
        create(&pool).unwrap();
    }

    #[test]
    fn cidr_must_not_overlap_the_service_cidr() {
        for cidr in ["10.53.4.0/24", "10.0.0.0/8", "10.53.0.0/16"] {
            let mut pool = bare_pool(cidr);
            let d = ippool_defaults(&pool.spec).unwrap();
            pool.spec.ipv4_config.pool.start = d.start.unwrap().to_string();
            pool.spec.ipv4_config.pool.end = d.end.unwrap().to_string();
            pool.spec.ipv4_config.server_ip = d.server_ip.unwrap().to_string();
            refused(
                create(&pool),
                F_CIDR,
                "overlaps cluster service cidr 10.53.0.0/16",
            );
            // Unknown service CIDR: nothing to overlap.
            let nad = net48();
            validate_ippool_create(
                &pool,
                &PoolFacts {
                    nad: Some(&nad),
                    pools: &[],
                    service_cidr: None,
                },
            )
            .unwrap();
        }
        let mut adjacent = bare_pool("10.54.0.0/24");
        let d = ippool_defaults(&adjacent.spec).unwrap();
        adjacent.spec.ipv4_config.pool.start = d.start.unwrap().to_string();
        adjacent.spec.ipv4_config.pool.end = d.end.unwrap().to_string();
        adjacent.spec.ipv4_config.server_ip = d.server_ip.unwrap().to_string();
        create(&adjacent).unwrap();
    }

    #[test]
    fn addresses_must_be_hosts_of_the_subnet() {
        type Mutation = fn(&mut IPPool);
        let cases: [(Mutation, &str, &str); 5] = [
            (
                |p| p.spec.ipv4_config.pool.start = "192.168.47.81".into(),
                F_START,
                "is outside cidr 192.168.48.0/24",
            ),
            (
                |p| p.spec.ipv4_config.pool.end = "192.168.48.255".into(),
                F_END,
                "is the broadcast address of 192.168.48.0/24",
            ),
            (
                |p| p.spec.ipv4_config.router = Some("192.168.48.0".into()),
                F_ROUTER,
                "is the network address of 192.168.48.0/24",
            ),
            (
                |p| p.spec.ipv4_config.server_ip = "192.168.49.77".into(),
                F_SERVER,
                "is outside cidr",
            ),
            (
                |p| p.spec.ipv4_config.server_ip = "192.168.48.255".into(),
                F_SERVER,
                "is the broadcast address",
            ),
        ];
        for (mutate, field, rule) in cases {
            let mut pool = readme_pool();
            mutate(&mut pool);
            refused(create(&pool), field, rule);
        }
        // /31: both addresses are hosts (RFC 3021), as pool::is_host_of says.
        let mut p2p = bare_pool("10.0.0.4/31");
        p2p.spec.ipv4_config.server_ip = "10.0.0.4".into();
        p2p.spec.ipv4_config.pool.start = "10.0.0.4".into();
        p2p.spec.ipv4_config.pool.end = "10.0.0.5".into();
        create(&p2p).unwrap();
    }

    #[test]
    fn server_must_differ_from_router() {
        let mut pool = readme_pool();
        pool.spec.ipv4_config.router = Some("192.168.48.77".into());
        refused(
            create(&pool),
            F_SERVER,
            "must differ from spec.ipv4Config.router",
        );
        pool.spec.ipv4_config.router = Some("192.168.48.78".into());
        create(&pool).unwrap();
    }

    #[test]
    fn start_must_not_be_after_end() {
        let mut pool = readme_pool();
        pool.spec.ipv4_config.pool.exclude.clear();
        pool.spec.ipv4_config.pool.start = "192.168.48.91".into();
        refused(create(&pool), F_START, "invalid pool range");
        pool.spec.ipv4_config.pool.start = "192.168.48.90".into();
        create(&pool).unwrap();
    }

    #[test]
    fn excludes_must_be_in_range_and_unique() {
        let mut pool = readme_pool();
        pool.spec.ipv4_config.pool.exclude = vec!["192.168.48.85".into(), "192.168.48.91".into()];
        refused(
            create(&pool),
            "spec.ipv4Config.pool.exclude[1]",
            "is outside pool range 192.168.48.81-192.168.48.90",
        );
        pool.spec.ipv4_config.pool.exclude = vec!["192.168.48.85".into(), "192.168.48.85".into()];
        refused(
            create(&pool),
            "spec.ipv4Config.pool.exclude[1]",
            "duplicates spec.ipv4Config.pool.exclude[0]",
        );
        // Both ends of the range may be excluded (the README does).
        create(&readme_pool()).unwrap();
    }

    #[test]
    fn server_and_router_must_not_be_excluded() {
        let mut pool = readme_pool();
        pool.spec.ipv4_config.router = Some("192.168.48.85".into());
        pool.spec
            .ipv4_config
            .pool
            .exclude
            .push("192.168.48.85".into());
        refused(
            create(&pool),
            F_ROUTER,
            "is excluded by spec.ipv4Config.pool.exclude[2]",
        );
        let mut pool = readme_pool();
        pool.spec.ipv4_config.server_ip = "192.168.48.81".into();
        refused(
            create(&pool),
            F_SERVER,
            "is excluded by spec.ipv4Config.pool.exclude[0]",
        );
        // Inside the range but not excluded: fine (the controller reserves it).
        pool.spec.ipv4_config.server_ip = "192.168.48.82".into();
        create(&pool).unwrap();
    }

    #[test]
    fn one_pool_per_network() {
        let pool = readme_pool();
        let nad = net48();
        let check = |others: &[IPPool]| {
            validate_ippool_create(
                &pool,
                &PoolFacts {
                    nad: Some(&nad),
                    pools: others,
                    service_cidr: service(),
                },
            )
        };
        refused(
            check(&[pool_on("default/other", "default/net-48")]),
            F_NETWORK,
            "is already served by IPPool default/other",
        );
        // Compared normalised: a stored bare name lives in its pool's namespace.
        refused(
            check(&[pool_on("default/legacy", "net-48")]),
            F_NETWORK,
            "is already served by IPPool default/legacy",
        );
        check(&[
            pool_on("other/net-48", "net-48"),
            pool_on("default/x", "default/net-49"),
        ])
        .unwrap();
        // The pool under review is skipped.
        check(&[readme_pool()]).unwrap();
    }

    #[test]
    fn dns_and_ntp_are_bounded_and_well_formed() {
        let mut pool = readme_pool();
        pool.spec.ipv4_config.dns = ["1.1.1.1", "8.8.8.8", "9.9.9.9"].map(String::from).to_vec();
        pool.spec.ipv4_config.ntp = ["pool.ntp.org", "10.0.0.1", "time-1.Example.com", "ntp"]
            .map(String::from)
            .to_vec();
        create(&pool).unwrap();

        let mut more_dns = pool.clone();
        more_dns.spec.ipv4_config.dns.push("1.0.0.1".into());
        refused(
            create(&more_dns),
            F_DNS,
            "has 4 entries, at most 3 are allowed",
        );

        let mut more_ntp = pool.clone();
        more_ntp.spec.ipv4_config.ntp.push("ntp2".into());
        refused(
            create(&more_ntp),
            F_NTP,
            "has 5 entries, at most 4 are allowed",
        );

        for bad in ["-ntp.org", "ntp..org", "ntp_1.org", "10.0.0", "", "a b"] {
            let mut p = readme_pool();
            p.spec.ipv4_config.ntp = vec!["pool.ntp.org".into(), bad.into()];
            refused(
                create(&p),
                "spec.ipv4Config.ntp[1]",
                "is neither an IPv4 address nor a host name",
            );
        }
    }

    #[test]
    fn lease_time_fits_a_dhcp_option() {
        for ok in [0, 300, i64::from(u32::MAX)] {
            let mut pool = readme_pool();
            pool.spec.ipv4_config.lease_time = Some(ok);
            create(&pool).unwrap();
        }
        for bad in [-1, i64::from(u32::MAX) + 1] {
            let mut pool = readme_pool();
            pool.spec.ipv4_config.lease_time = Some(bad);
            let r = refused(create(&pool), F_LEASE, "must be between 0 and 4294967295");
            assert_eq!(r.value, bad.to_string());
        }
    }

    #[test]
    fn mtu_fits_option_26() {
        for ok in [68, 1450, 9000, 65535] {
            let mut pool = readme_pool();
            pool.spec.ipv4_config.mtu = Some(ok);
            create(&pool).unwrap();
        }
        for bad in [0, 67, 65536, -1] {
            let mut pool = readme_pool();
            pool.spec.ipv4_config.mtu = Some(bad);
            let r = refused(create(&pool), F_MTU, "must be between 68 and 65535");
            assert_eq!(r.value, bad.to_string());
        }
    }

    #[test]
    fn boot_settings_are_admitted_and_unusable_ones_refused_by_field() {
        let mut pool = readme_pool();
        pool.spec.ipv4_config.boot = Some(crate::crd::BootConfig {
            next_server: Some("192.168.48.5".into()),
            bios_file: Some("undionly.kpxe".into()),
            ipxe_script_url: Some("http://192.168.48.5/vm.ipxe".into()),
            ..Default::default()
        });
        create(&pool).unwrap();
        let mut bad = pool.clone();
        if let Some(b) = bad.spec.ipv4_config.boot.as_mut() {
            b.ipxe_script_url = Some("vm.ipxe".into());
        }
        let r = refused(
            create(&bad),
            "spec.ipv4Config.boot.ipxeScriptUrl",
            "is not a URL starting http://, https://, tftp://",
        );
        assert_eq!(r.value, "vm.ipxe");
        let mut v6 = pool;
        v6.spec.ipv6_config = Some(crate::crd::IPv6Config {
            boot: Some(crate::crd::IPv6BootConfig {
                uefi_http_url: Some("http://[fd00::5]/ipxe.efi".into()),
                ..Default::default()
            }),
            ..v6_config()
        });
        create(&v6).unwrap();
        if let Some(b) = v6.spec.ipv6_config.as_mut().and_then(|c| c.boot.as_mut()) {
            b.uefi_http_url = Some("tftp://[fd00::5]/ipxe.efi".into());
        }
        refused(
            create(&v6),
            "spec.ipv6Config.boot.uefiHttpUrl",
            "is not a URL starting http://, https://",
        );
    }

    #[test]
    fn routes_are_networks_via_a_gateway_on_the_subnet() {
        let route = |destination: &str, gateway: &str| StaticRoute {
            destination: destination.into(),
            gateway: gateway.into(),
        };
        let mut pool = readme_pool();
        pool.spec.ipv4_config.routes = vec![
            route("10.96.0.0/12", "192.168.48.1"),
            route("172.16.5.0/24", "192.168.48.2"),
        ];
        pool.spec.ipv4_config.default_route = Some(false);
        create(&pool).unwrap();

        let cases: Vec<(StaticRoute, &str, &str)> = vec![
            (
                route("10.96.0.1/12", "192.168.48.1"),
                "routes[2].destination",
                "has host bits set (the network is 10.96.0.0/12)",
            ),
            (
                route("0.0.0.0/0", "192.168.48.1"),
                "routes[2].destination",
                "is the default route: set spec.ipv4Config.router instead",
            ),
            (
                route("10.96.0.0/12", "192.168.48.3"),
                "routes[2].destination",
                "duplicates spec.ipv4Config.routes[0].destination",
            ),
            (
                route("10.97.0.0/16", "192.168.49.1"),
                "routes[2].gateway",
                "is outside cidr 192.168.48.0/24",
            ),
            (
                route("10.97.0.0/16", "192.168.48.255"),
                "routes[2].gateway",
                "is the broadcast address of 192.168.48.0/24",
            ),
            (
                route("10.97.0.0", "192.168.48.1"),
                "routes[2].destination",
                "is not an IPv4 CIDR",
            ),
            (
                route("10.97.0.0/16", "gw"),
                "routes[2].gateway",
                "is not an IPv4 address",
            ),
        ];
        for (bad, field, rule) in cases {
            let mut p = pool.clone();
            p.spec.ipv4_config.routes.push(bad);
            refused(create(&p), &format!("spec.ipv4Config.{field}"), rule);
        }
        let mut many = pool.clone();
        many.spec.ipv4_config.routes = (0..17)
            .map(|i| route(&format!("10.{i}.0.0/16"), "192.168.48.1"))
            .collect();
        refused(
            create(&many),
            F_ROUTES,
            "has 17 entries, at most 16 are allowed",
        );
    }

    #[test]
    fn new_options_are_mutable() {
        let old = readme_pool();
        let mut new = old.clone();
        new.spec.ipv4_config.mtu = Some(1450);
        new.spec.ipv4_config.default_route = Some(false);
        new.spec.ipv4_config.routes = vec![StaticRoute {
            destination: "10.96.0.0/12".into(),
            gateway: "192.168.48.1".into(),
        }];
        update(&old, &new).unwrap();
        update(&new, &old).unwrap();
    }

    #[test]
    fn domains_are_dns_names() {
        let mut pool = readme_pool();
        pool.spec.ipv4_config.domain_name = Some("bad_domain".into());
        refused(create(&pool), F_DOMAIN, "is not a valid DNS domain name");
        pool.spec.ipv4_config.domain_name = Some("Corp.Example.com".into());
        create(&pool).unwrap();
        pool.spec.ipv4_config.domain_name = Some(String::new());
        create(&pool).unwrap();
        pool.spec.ipv4_config.domain_search = vec!["example.com".into(), "a..b".into()];
        refused(
            create(&pool),
            "spec.ipv4Config.domainSearch[1]",
            "is not a valid DNS domain name",
        );
        pool.spec.ipv4_config.domain_search = vec!["example.com".into(), "svc.local".into()];
        create(&pool).unwrap();
        let long = format!("{}.com", "a".repeat(64));
        pool.spec.ipv4_config.domain_search = vec![long];
        refused(
            create(&pool),
            "spec.ipv4Config.domainSearch[0]",
            "is not a valid DNS domain name",
        );
    }

    // === IPPool update ===

    #[test]
    fn unchanged_spec_is_always_admitted() {
        let old = readme_pool();
        let mut new = old.clone();
        new.metadata.finalizers = Some(vec!["x".into()]);
        let facts = PoolFacts {
            nad: None,
            pools: &[],
            service_cidr: None,
        };
        validate_ippool_update(&old, &new, &facts).unwrap();
        // A spec change is validated in full.
        new.spec.ipv4_config.dns = vec!["8.8.8.8".into()];
        refused(
            validate_ippool_update(&old, &new, &facts),
            F_NETWORK,
            "not found",
        );
    }

    #[test]
    fn options_are_mutable() {
        let old = readme_pool();
        let mut new = old.clone();
        new.spec.paused = Some(true);
        new.spec.ipv4_config.dns = vec!["8.8.8.8".into(), "8.8.4.4".into()];
        new.spec.ipv4_config.domain_name = None;
        new.spec.ipv4_config.domain_search = vec!["example.org".into()];
        new.spec.ipv4_config.ntp = vec![];
        new.spec.ipv4_config.lease_time = Some(600);
        new.metadata.labels = Some([("a".to_owned(), "b".to_owned())].into());
        update(&old, &new).unwrap();
        // ... but still checked.
        new.spec.ipv4_config.lease_time = Some(-1);
        refused(update(&old, &new), F_LEASE, "must be between");
    }

    #[test]
    fn addressing_is_immutable() {
        type Mutation = fn(&mut IPPool);
        let cases: [(Mutation, &str); 5] = [
            (|p| p.spec.network_name = "default/net-49".into(), F_NETWORK),
            (
                |p| p.spec.ipv4_config.cidr = "192.168.48.0/23".into(),
                F_CIDR,
            ),
            (
                |p| p.spec.ipv4_config.server_ip = "192.168.48.78".into(),
                F_SERVER,
            ),
            (
                |p| p.spec.ipv4_config.pool.start = "192.168.48.80".into(),
                F_START,
            ),
            (
                |p| p.spec.ipv4_config.pool.end = "192.168.48.91".into(),
                F_END,
            ),
        ];
        for (mutate, field) in cases {
            let old = readme_pool();
            let mut new = old.clone();
            mutate(&mut new);
            refused(update(&old, &new), field, "is immutable");
        }
    }

    #[test]
    fn router_may_be_added_but_not_changed_or_removed() {
        let old = readme_pool();
        let mut new = old.clone();
        new.spec.ipv4_config.router = Some("192.168.48.2".into());
        refused(
            update(&old, &new),
            F_ROUTER,
            "is immutable (was \"192.168.48.1\")",
        );
        new.spec.ipv4_config.router = None;
        refused(update(&old, &new), F_ROUTER, "cannot be removed once set");

        let mut old = readme_pool();
        old.spec.ipv4_config.router = None;
        let mut new = old.clone();
        new.spec.ipv4_config.router = Some("192.168.48.2".into());
        update(&old, &new).unwrap();

        // Added over an address a NIC holds: refused.
        let old = with_allocated(old, &[("192.168.48.2", "C6:D6:82:39:D3:C3")]);
        let mut new = old.clone();
        new.spec.ipv4_config.router = Some("192.168.48.2".into());
        refused(
            update(&old, &new),
            F_ROUTER,
            "is already occupied by MAC c6:d6:82:39:d3:c3",
        );
    }

    #[test]
    fn excludes_may_be_added_but_not_changed_or_removed() {
        let old = readme_pool();
        let mut new = old.clone();
        new.spec
            .ipv4_config
            .pool
            .exclude
            .push("192.168.48.85".into());
        refused(update(&old, &new), F_EXCLUDE, "is immutable");
        new.spec.ipv4_config.pool.exclude.clear();
        refused(update(&old, &new), F_EXCLUDE, "cannot be removed once set");

        let mut old = readme_pool();
        old.spec.ipv4_config.pool.exclude.clear();
        let old = with_allocated(
            old,
            &[("192.168.48.86", MAC_B), ("192.168.48.77", "RESERVED")],
        );
        let mut new = old.clone();
        new.spec.ipv4_config.pool.exclude = vec!["192.168.48.85".into()];
        update(&old, &new).unwrap();
        new.spec.ipv4_config.pool.exclude = vec!["192.168.48.85".into(), "192.168.48.86".into()];
        refused(
            update(&old, &new),
            "spec.ipv4Config.pool.exclude[1]",
            &format!("is already occupied by MAC {MAC_B}"),
        );
    }

    #[test]
    fn server_ip_must_not_be_occupied() {
        let old = readme_pool();
        let mut changed = old.clone();
        changed.spec.ipv4_config.dns = vec!["8.8.8.8".into()];
        for (holder, rule) in [
            (MAC_A, format!("is already occupied by MAC {MAC_A}")),
            ("EXCLUDED", "is already occupied (EXCLUDED)".to_owned()),
        ] {
            let old = with_allocated(old.clone(), &[("192.168.48.77", holder)]);
            let mut new = changed.clone();
            new.status = old.status.clone();
            let r = refused(update(&old, &new), F_SERVER, &rule);
            assert_eq!(r.value, "192.168.48.77");
        }
        let old = with_allocated(
            old,
            &[("192.168.48.77", "RESERVED"), ("192.168.48.83", MAC_A)],
        );
        let mut new = changed;
        new.status = old.status.clone();
        update(&old, &new).unwrap();
    }

    // === IPPool delete ===

    #[test]
    fn delete_refused_while_the_network_is_used() {
        let pool = readme_pool();
        validate_ippool_delete(&pool, &[]).unwrap();
        validate_ippool_delete(
            &pool,
            &[cfg("default/vm1", &[("default/net-49", MAC_A, None)])],
        )
        .unwrap();
        let r = refused(
            validate_ippool_delete(
                &pool,
                &[cfg("default/vm1", &[("default/net-48", MAC_A, None)])],
            ),
            F_NETWORK,
            "is still used by VirtualMachineNetworkConfig(s) default/vm1, which must be removed at first",
        );
        assert_eq!(r.value, "default/net-48");
    }

    #[test]
    fn delete_finds_users_by_network_not_by_pool_name() {
        // Upstream's bug: pool and NAD names differ, so its index found no users.
        let pool = pool_on("infra/pool-a", "default/net-48");
        let users = [
            cfg("default/vm1", &[("net-48", MAC_A, None)]),
            cfg(
                "other/vm2",
                &[
                    ("default/net-49", MAC_A, None),
                    ("default/net-48", MAC_B, None),
                ],
            ),
            cfg("other/vm3", &[("net-48", MAC_B, None)]),
        ];
        refused(
            validate_ippool_delete(&pool, &users),
            F_NETWORK,
            "VirtualMachineNetworkConfig(s) default/vm1, other/vm2, which",
        );
    }

    #[test]
    fn delete_lists_five_users_then_counts() {
        let pool = readme_pool();
        let users: Vec<_> = (0..7)
            .rev()
            .map(|i| {
                cfg(
                    &format!("default/vm{i}"),
                    &[("default/net-48", MAC_A, None)],
                )
            })
            .collect();
        refused(
            validate_ippool_delete(&pool, &users),
            F_NETWORK,
            "default/vm0, default/vm1, default/vm2, default/vm3, default/vm4 and 2 more, which must be removed at first",
        );
    }

    // === dual-stack (ipv6Config) ===

    type V6Mutation = fn(&mut IPv6Config);

    /// [`dual_pool`] with its `ipv6Config` changed by `mutate`.
    fn dual_with(mutate: impl FnOnce(&mut IPv6Config)) -> IPPool {
        let mut pool = dual_pool();
        mutate(pool.spec.ipv6_config.as_mut().unwrap());
        pool
    }

    /// A dual-stack pool whose IPv6 side is only `cidr`, `serverIP` and a range.
    fn v6_only_range(cidr: &str, server: &str, start: &str, end: &str) -> IPPool {
        dual_with(|v6| {
            v6.cidr = cidr.into();
            v6.server_ip = server.into();
            v6.pool.start = start.into();
            v6.pool.end = end.into();
            v6.pool.exclude.clear();
            v6.router = None;
        })
    }

    #[test]
    fn a_dual_stack_pool_is_admitted_and_gets_no_ipv6_defaults() {
        let pool = dual_pool();
        assert_eq!(ippool_defaults(&pool.spec), Ok(PoolDefaults::default()));
        create(&pool).unwrap();
        update(&pool, &pool).unwrap();
        validate_ippool_delete(&pool, &[]).unwrap();
        // Nothing of ipv6Config is defaulted (a defaulted range would be a whole /64): the
        // fields the mutator fills for IPv4 are required for IPv6.
        for (mutate, field) in [
            ((|v6| v6.server_ip = String::new()) as V6Mutation, F6_SERVER),
            (|v6| v6.pool.start = String::new(), F6_START),
            (|v6| v6.pool.end = String::new(), F6_END),
            (|v6| v6.cidr = String::new(), F6_CIDR),
        ] {
            let pool = dual_with(mutate);
            assert_eq!(ippool_defaults(&pool.spec), Ok(PoolDefaults::default()));
            refused(create(&pool), field, "is required");
        }
    }

    /// Harvester's example: admitted but for one rule of upstream's it breaks as written, its
    /// server being its router ("server ip ... cannot be the same as router ip"), in both
    /// families.
    #[test]
    fn the_designs_dual_stack_example_is_admitted_once_its_server_is_not_its_router() {
        // Our example moves the servers off the routers' addresses, and is admitted.
        let example = dual_stack_pool();
        assert_eq!(ippool_defaults(&example.spec), Ok(PoolDefaults::default()));
        create(&example).unwrap();
        update(&example, &example).unwrap();
        // The design's verbatim example gives server and router one address in each family:
        // refused, family by family, as upstream refuses it for IPv4.
        let mut hep = example.clone();
        hep.spec.ipv4_config.server_ip = "192.168.100.1".into();
        refused(
            create(&hep),
            F_SERVER,
            "must differ from spec.ipv4Config.router 192.168.100.1",
        );
        let mut v6_only_wrong = example;
        v6_only_wrong.spec.ipv6_config.as_mut().unwrap().server_ip = "fd00::1".into();
        refused(
            create(&v6_only_wrong),
            F6_SERVER,
            "must differ from spec.ipv6Config.router fd00::1",
        );
    }

    // Rule 1: the range limit.
    #[test]
    fn ipv6_range_spans_at_most_65535_addresses() {
        // fd00:48::100 + 65 534 = fd00:48::1:fe.
        let pool = v6_only_range(
            "fd00:48::/64",
            "fd00:48::2",
            "fd00:48::100",
            "fd00:48::1:fe",
        );
        create(&pool).unwrap();
        let pool = v6_only_range(
            "fd00:48::/64",
            "fd00:48::2",
            "fd00:48::100",
            "fd00:48::1:ff",
        );
        let r = refused(
            create(&pool),
            F6_END,
            "makes pool range fd00:48::100-fd00:48::1:ff span 65536 addresses, at most 65535 are allowed",
        );
        assert_eq!(r.value, "fd00:48::1:ff");
        // A full /64 (all but its anycast address).
        let pool = v6_only_range(
            "fd00:48::/64",
            "fd00:48::2",
            "fd00:48::1",
            "fd00:48::ffff:ffff:ffff:ffff",
        );
        refused(
            create(&pool),
            F6_END,
            "span 18446744073709551615 addresses, at most 65535",
        );
    }

    // Rule 2: IPv4 first.
    #[test]
    fn ipv6_config_requires_an_ipv4_config() {
        let mut pool = dual_pool();
        pool.spec.ipv4_config = IPv4Config::default();
        let rule = "is required with spec.ipv6Config: IPv4 is the primary family, IPv6-only pools are not supported";
        // Refused by the mutator already, with the reason rather than a missing CIDR.
        refused(ippool_defaults(&pool.spec), "spec.ipv4Config", rule);
        refused(create(&pool), "spec.ipv4Config", rule);
        // Adding ipv6Config while dropping ipv4Config: the IPv4 fields are immutable first.
        refused(update(&readme_pool(), &pool), F_CIDR, "is immutable");
        // An IPv4 config that is only partly given is defaulted and checked as ever.
        let mut partial = bare_pool("192.168.48.0/24");
        partial.spec.ipv6_config = Some(v6_config());
        let d = ippool_defaults(&partial.spec).unwrap();
        assert_eq!(d.start, Some(ip("192.168.48.1")));
        refused(create(&partial), F_SERVER, "is required");
        // Without ipv6Config, an empty ipv4Config is refused as before.
        refused(create(&bare_pool("")), F_CIDR, "is required");
    }

    // Rule 3: each family's fields hold that family's addresses.
    #[test]
    fn ipv6_fields_refuse_ipv4_addresses() {
        let cases: [(V6Mutation, &str, &str); 8] = [
            (
                |v6| v6.cidr = "192.168.48.0/24".into(),
                F6_CIDR,
                "is not an IPv6 CIDR",
            ),
            (
                |v6| v6.server_ip = "192.168.48.77".into(),
                F6_SERVER,
                "is not an IPv6 address",
            ),
            (
                |v6| v6.pool.start = "192.168.48.81".into(),
                F6_START,
                "is not an IPv6 address",
            ),
            (
                |v6| v6.pool.end = "192.168.48.90".into(),
                F6_END,
                "is not an IPv6 address",
            ),
            (
                |v6| v6.router = Some("192.168.48.1".into()),
                F6_ROUTER,
                "is not an IPv6 address",
            ),
            (
                |v6| v6.pool.exclude[1] = "192.168.48.90".into(),
                "spec.ipv6Config.pool.exclude[1]",
                "is not an IPv6 address",
            ),
            (
                |v6| v6.dns = vec!["fd00:48::53".into(), "1.1.1.1".into()],
                "spec.ipv6Config.dns[1]",
                "is not an IPv6 address",
            ),
            (
                |v6| v6.server_ip = "fd00:48::zz".into(),
                F6_SERVER,
                "is not an IPv6 address",
            ),
        ];
        for (mutate, field, rule) in cases {
            refused(create(&dual_with(mutate)), field, rule);
        }
    }

    #[test]
    fn ipv4_fields_refuse_ipv6_addresses() {
        type Mutation = fn(&mut IPv4Config);
        let cases: [(Mutation, &str, &str); 8] = [
            (
                |v4| v4.cidr = "fd00:48::/112".into(),
                F_CIDR,
                "is not an IPv4 CIDR",
            ),
            (
                |v4| v4.server_ip = "fd00:48::77".into(),
                F_SERVER,
                "is not an IPv4 address",
            ),
            (
                |v4| v4.pool.start = "fd00:48::81".into(),
                F_START,
                "is not an IPv4 address",
            ),
            (
                |v4| v4.pool.end = "fd00:48::90".into(),
                F_END,
                "is not an IPv4 address",
            ),
            (
                |v4| v4.router = Some("fd00:48::1".into()),
                F_ROUTER,
                "is not an IPv4 address",
            ),
            (
                |v4| v4.pool.exclude[0] = "fd00:48::81".into(),
                "spec.ipv4Config.pool.exclude[0]",
                "is not an IPv4 address",
            ),
            (
                |v4| v4.dns = vec!["fd00:48::53".into()],
                "spec.ipv4Config.dns[0]",
                "is not an IPv4 address",
            ),
            (
                |v4| v4.ntp = vec!["fd00:48::123".into()],
                "spec.ipv4Config.ntp[0]",
                "is neither an IPv4 address nor a host name",
            ),
        ];
        for (mutate, field, rule) in cases {
            let mut pool = dual_pool();
            mutate(&mut pool.spec.ipv4_config);
            refused(create(&pool), field, rule);
        }
    }

    /// Upstream compares `As4()`, which makes every IPv6 address equal: a range whose ends are of
    /// different families, or of the wrong one, is refused, each end as written.
    #[test]
    fn reversed_family_pool_boundaries_are_refused() {
        let cases: [(V6Mutation, &str, &str); 3] = [
            (
                |v6| v6.pool.start = "192.168.48.81".into(),
                F6_START,
                "192.168.48.81",
            ),
            (
                |v6| v6.pool.end = "192.168.48.90".into(),
                F6_END,
                "192.168.48.90",
            ),
            (
                |v6| {
                    v6.pool.start = "::ffff:192.168.48.81".into();
                    v6.pool.end = "::ffff:192.168.48.90".into();
                },
                F6_START,
                "::ffff:192.168.48.81",
            ),
        ];
        for (mutate, field, value) in cases {
            let r = refused(create(&dual_with(mutate)), field, "");
            assert_eq!(r.value, value);
        }
        let mut pool = dual_pool();
        pool.spec.ipv4_config.pool.start = "fd00:48::81".into();
        pool.spec.ipv4_config.pool.end = "fd00:48::90".into();
        refused(create(&pool), F_START, "is not an IPv4 address");
    }

    // Rule 4: the CIDR.
    #[test]
    fn ipv6_cidr_is_a_unicast_prefix_of_64_to_126_bits() {
        for (pool, rule) in [
            (
                v6_only_range("fd00:48::/48", "fd00:48::2", "fd00:48::10", "fd00:48::20"),
                "has prefix length /48, it must be /64 to /126",
            ),
            (
                v6_only_range("fd00:48::/127", "fd00:48::", "fd00:48::1", "fd00:48::1"),
                "has prefix length /127, it must be /64 to /126",
            ),
            (
                v6_only_range("fd00:48::5/128", "fd00:48::5", "fd00:48::5", "fd00:48::5"),
                "has prefix length /128",
            ),
            (
                v6_only_range("fe80::/64", "fe80::2", "fe80::10", "fe80::20"),
                "is link-local (fe80::/10)",
            ),
            (
                v6_only_range("ff05::/112", "ff05::2", "ff05::10", "ff05::20"),
                "is multicast (ff00::/8)",
            ),
            (
                v6_only_range(
                    "::ffff:192.168.48.0/120",
                    "::ffff:192.168.48.2",
                    "::ffff:192.168.48.10",
                    "::ffff:192.168.48.20",
                ),
                "is IPv4-mapped (::ffff:0:0/96)",
            ),
            (
                v6_only_range("::/120", "::2", "::10", "::20"),
                "holds the unspecified address :: and the loopback address ::1",
            ),
        ] {
            refused(create(&pool), F6_CIDR, rule);
        }
        for pool in [
            v6_only_range("fd00:48::/64", "fd00:48::2", "fd00:48::10", "fd00:48::20"),
            v6_only_range(
                "2001:db8:48::/126",
                "2001:db8:48::1",
                "2001:db8:48::2",
                "2001:db8:48::3",
            ),
            // Host bits in the CIDR are tolerated, as for IPv4.
            v6_only_range("fd00:48::1/112", "fd00:48::2", "fd00:48::10", "fd00:48::20"),
        ] {
            create(&pool).unwrap();
        }
    }

    // Rule 5: inside the CIDR and the range; server apart from router; excludes; DNS.
    #[test]
    fn ipv6_addresses_lie_in_the_cidr_and_range() {
        let cases: [(V6Mutation, &str, &str); 6] = [
            (
                |v6| v6.server_ip = "fd00:49::77".into(),
                F6_SERVER,
                "is outside cidr fd00:48::/112",
            ),
            (
                |v6| v6.router = Some("fd00:49::1".into()),
                F6_ROUTER,
                "is outside cidr fd00:48::/112",
            ),
            (
                |v6| v6.pool.start = "fd00:47::81".into(),
                F6_START,
                "is outside cidr",
            ),
            (
                |v6| v6.pool.end = "fd00:48::1:0".into(),
                F6_END,
                "is outside cidr",
            ),
            (
                |v6| {
                    v6.pool.exclude.clear();
                    v6.pool.start = "fd00:48::91".into();
                },
                F6_START,
                "is after spec.ipv6Config.pool.end fd00:48::90: invalid pool range",
            ),
            (
                |v6| v6.pool.exclude = vec!["fd00:48::85".into(), "fd00:48::91".into()],
                "spec.ipv6Config.pool.exclude[1]",
                "is outside pool range fd00:48::81-fd00:48::90",
            ),
        ];
        for (mutate, field, rule) in cases {
            refused(create(&dual_with(mutate)), field, rule);
        }
        refused(
            create(&dual_with(|v6| {
                v6.pool.exclude = vec!["fd00:48::85".into(), "FD00:48:0::85".into()]
            })),
            "spec.ipv6Config.pool.exclude[1]",
            "duplicates spec.ipv6Config.pool.exclude[0]",
        );
    }

    #[test]
    fn ipv6_server_must_differ_from_router_and_neither_be_excluded() {
        refused(
            create(&dual_with(|v6| v6.router = Some("fd00:48::77".into()))),
            F6_SERVER,
            "must differ from spec.ipv6Config.router fd00:48::77",
        );
        // Compared as addresses, not strings.
        refused(
            create(&dual_with(|v6| v6.router = Some("FD00:48:0:0::77".into()))),
            F6_SERVER,
            "must differ from spec.ipv6Config.router",
        );
        refused(
            create(&dual_with(|v6| {
                v6.router = Some("fd00:48::85".into());
                v6.pool.exclude.push("fd00:48::85".into());
            })),
            F6_ROUTER,
            "is excluded by spec.ipv6Config.pool.exclude[2]",
        );
        refused(
            create(&dual_with(|v6| v6.server_ip = "fd00:48::81".into())),
            F6_SERVER,
            "is excluded by spec.ipv6Config.pool.exclude[0]",
        );
        // Inside the range but not excluded: fine (the controller reserves them).
        create(&dual_with(|v6| {
            v6.server_ip = "fd00:48::82".into();
            v6.router = Some("fd00:48::83".into());
        }))
        .unwrap();
        // No router at all: fine.
        create(&dual_with(|v6| v6.router = None)).unwrap();
    }

    #[test]
    fn ipv6_dns_is_bounded() {
        let three = [
            "fd00:48::53",
            "2001:4860:4860::8888",
            "2606:4700:4700::1111",
        ];
        let mut pool = dual_with(|v6| v6.dns = three.map(String::from).to_vec());
        create(&pool).unwrap();
        pool.spec
            .ipv6_config
            .as_mut()
            .unwrap()
            .dns
            .push("fd00:48::54".into());
        refused(
            create(&pool),
            F6_DNS,
            "has 4 entries, at most 3 are allowed",
        );
    }

    // Rule 6: the subnet-router anycast address; no broadcast.
    #[test]
    fn nothing_is_the_ipv6_subnet_router_anycast_address() {
        let anycast = "is the subnet-router anycast address of fd00:48::/112";
        let cases: [(V6Mutation, &str); 3] = [
            (|v6| v6.server_ip = "fd00:48::".into(), F6_SERVER),
            (|v6| v6.router = Some("fd00:48:0::0".into()), F6_ROUTER),
            (
                |v6| {
                    v6.pool.exclude.clear();
                    v6.pool.start = "fd00:48::".into();
                },
                F6_START,
            ),
        ];
        for (mutate, field) in cases {
            refused(create(&dual_with(mutate)), field, anycast);
        }
        // The last address is a host: IPv6 has no broadcast.
        create(&v6_only_range(
            "fd00:48::/112",
            "fd00:48::ffff",
            "fd00:48::fff0",
            "fd00:48::fffe",
        ))
        .unwrap();
        create(&v6_only_range(
            "fd00:48::/112",
            "fd00:48::2",
            "fd00:48::fff0",
            "fd00:48::ffff",
        ))
        .unwrap();
    }

    // Rule 7: immutability.
    #[test]
    fn ipv6_addressing_is_immutable() {
        let cases: [(V6Mutation, &str); 4] = [
            (|v6| v6.cidr = "fd00:48::/111".into(), F6_CIDR),
            (|v6| v6.server_ip = "fd00:48::78".into(), F6_SERVER),
            (|v6| v6.pool.start = "fd00:48::80".into(), F6_START),
            (|v6| v6.pool.end = "fd00:48::91".into(), F6_END),
        ];
        for (mutate, field) in cases {
            let old = dual_pool();
            let new = dual_with(mutate);
            let r = refused(update(&old, &new), field, "is immutable (was ");
            assert!(r.rule.contains("fd00:48::"), "{r}");
        }
    }

    #[test]
    fn ipv6_router_and_excludes_may_be_added_but_not_changed_or_removed() {
        let old = dual_pool();
        refused(
            update(&old, &dual_with(|v6| v6.router = Some("fd00:48::2".into()))),
            F6_ROUTER,
            "is immutable (was \"fd00:48::1\")",
        );
        refused(
            update(&old, &dual_with(|v6| v6.router = None)),
            F6_ROUTER,
            "cannot be removed once set",
        );
        refused(
            update(
                &old,
                &dual_with(|v6| v6.pool.exclude.push("fd00:48::85".into())),
            ),
            F6_EXCLUDE,
            "is immutable",
        );
        refused(
            update(&old, &dual_with(|v6| v6.pool.exclude.clear())),
            F6_EXCLUDE,
            "cannot be removed once set",
        );
        let bare = dual_with(|v6| {
            v6.router = None;
            v6.pool.exclude.clear();
        });
        let added = dual_with(|v6| v6.pool.exclude = vec!["fd00:48::85".into()]);
        update(&bare, &added).unwrap();
    }

    #[test]
    fn ipv6_config_may_be_added_but_never_removed() {
        let v4_only = readme_pool();
        let dual = dual_pool();
        update(&v4_only, &dual).unwrap();
        let r = refused(
            update(&dual, &v4_only),
            F6,
            "cannot be removed once set (was cidr \"fd00:48::/112\")",
        );
        assert_eq!(r.value, "");
        // Added, it is checked as on create.
        let too_big = dual_with(|v6| {
            v6.cidr = "fd00:48::/64".into();
            v6.pool.end = "fd00:48::1:0:0".into();
        });
        refused(
            update(&v4_only, &too_big),
            F6_END,
            "at most 65535 are allowed",
        );
        // The IPv4 side stays immutable meanwhile.
        let mut moved = dual_pool();
        moved.spec.ipv4_config.server_ip = "192.168.48.78".into();
        refused(update(&v4_only, &moved), F_SERVER, "is immutable");
    }

    #[test]
    fn ipv6_options_are_mutable() {
        let old = dual_pool();
        let new = dual_with(|v6| {
            v6.dns = vec!["fd00:48::54".into(), "fd00:48::55".into()];
            v6.lease_time = Some(600);
        });
        update(&old, &new).unwrap();
        update(&new, &old).unwrap();
        // ... but still checked.
        let bad = dual_with(|v6| v6.lease_time = Some(-1));
        refused(
            update(&old, &bad),
            "spec.ipv6Config.leaseTime",
            "must be between",
        );
    }

    // Rule 8: the server's address is the agent's.
    #[test]
    fn ipv6_server_ip_must_not_be_occupied() {
        let changed = dual_with(|v6| v6.dns = vec!["fd00:48::54".into()]);
        for (key, holder, rule) in [
            (
                "fd00:48::77",
                MAC_A,
                format!("is already occupied by MAC {MAC_A}"),
            ),
            // Keys are read in any spelling.
            (
                "FD00:48:0::0077",
                MAC_A,
                format!("is already occupied by MAC {MAC_A}"),
            ),
            (
                "fd00:48::77",
                "EXCLUDED",
                "is already occupied (EXCLUDED)".to_owned(),
            ),
        ] {
            let old = with_allocated_v6(dual_pool(), &[(key, holder)]);
            let mut new = changed.clone();
            new.status = old.status.clone();
            let r = refused(update(&old, &new), F6_SERVER, &rule);
            assert_eq!(r.value, "fd00:48::77");
        }
        // RESERVED is the server's own mark; the IPv4 books say nothing of IPv6 addresses.
        let old = with_allocated(
            with_allocated_v6(
                dual_pool(),
                &[("fd00:48::77", "RESERVED"), ("fd00:48::83", MAC_A)],
            ),
            &[("192.168.48.83", MAC_B)],
        );
        let mut new = changed;
        new.status = old.status.clone();
        update(&old, &new).unwrap();
        // Adding ipv6Config over stale books: its server is checked against them.
        let old = with_allocated_v6(readme_pool(), &[("fd00:48::77", MAC_B)]);
        let mut new = dual_pool();
        new.status = old.status.clone();
        refused(
            update(&old, &new),
            F6_SERVER,
            &format!("is already occupied by MAC {MAC_B}"),
        );
    }

    #[test]
    fn ipv6_router_and_excludes_added_must_not_be_occupied() {
        let bare = with_allocated_v6(
            dual_with(|v6| {
                v6.router = None;
                v6.pool.exclude.clear();
            }),
            &[("fd00:48::2", MAC_B), ("fd00:48::86", MAC_A)],
        );
        let mut new = bare.clone();
        new.spec.ipv6_config.as_mut().unwrap().router = Some("fd00:48::2".into());
        refused(
            update(&bare, &new),
            F6_ROUTER,
            &format!("is already occupied by MAC {MAC_B}"),
        );
        let mut new = bare.clone();
        new.spec.ipv6_config.as_mut().unwrap().pool.exclude =
            vec!["fd00:48::85".into(), "fd00:48::86".into()];
        refused(
            update(&bare, &new),
            "spec.ipv6Config.pool.exclude[1]",
            &format!("is already occupied by MAC {MAC_A}"),
        );
        new.spec.ipv6_config.as_mut().unwrap().pool.exclude = vec!["fd00:48::85".into()];
        update(&bare, &new).unwrap();
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn defaults_are_admitted_when_nothing_else_is_wrong(c in 0u8..=255, prefix in 8u8..=32) {
            let mut pool = bare_pool(&format!("192.168.{c}.0/{prefix}"));
            if let Ok(d) = ippool_defaults(&pool.spec) {
                pool.spec.ipv4_config.pool.start = d.start.unwrap().to_string();
                pool.spec.ipv4_config.pool.end = d.end.unwrap().to_string();
                pool.spec.ipv4_config.server_ip = d.server_ip.unwrap().to_string();
                prop_assert_eq!(create(&pool), Ok(()));
            }
        }
    }
}
