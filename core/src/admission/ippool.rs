//! IPPool admission: the defaults the mutating webhook fills in on create
//! ([`ippool_defaults`]), and what create, update and delete refuse ([`validate_ippool_create`],
//! [`validate_ippool_update`], [`validate_ippool_delete`]), all resting on [`check_pool_spec`].

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use super::fields::{
    F_CIDR, F_DNS, F_DOMAIN, F_END, F_EXCLUDE, F_NETWORK, F_NTP, F_ROUTER, F_SEARCH, F_SERVER,
    F_START, allocated_of, check_count, host_range, immutable, is_dns_name, is_missing, key_of,
    optional, parse_cidr, parse_network, same_network,
};
use super::{PoolDefaults, PoolFacts, Rejection};
use crate::crd::{IPPool, IPPoolSpec, IPv4Config, VirtualMachineNetworkConfig};
use crate::names::NamespacedName;
use crate::pool::spec::{F_ROUTES, not_a_host};
use crate::pool::{Holder, PoolError, PoolRange, ValidPool};

/// Most DNS servers an IPPool may hand out (upstream's CRD `maxItems`).
pub const MAX_DNS: usize = 3;
/// Most NTP servers an IPPool may hand out (upstream's CRD `maxItems`).
pub const MAX_NTP: usize = 4;
/// Most classless static routes an IPPool may hand out (each up to 9 bytes of option 121, and
/// again in 249: 16 fit any client's 576-byte reply with the other options).
pub const MAX_ROUTES: usize = 16;
/// Most users a delete refusal names, so the message stays readable for a busy network.
pub const MAX_LISTED_USERS: usize = 5;

/// The mutating webhook's defaults for a new pool (upstream's mutator): a missing start or end
/// becomes the first or last host address of the CIDR, and a missing serverIP the first host
/// address that is neither the router nor excluded. Refuses an unparseable CIDR (nothing can be
/// derived from it), a range whose start ends up after its end ("invalid pool range"), and a
/// subnet with no address left for the server ("fail to assign ip for dhcp server"). Other
/// malformed fields are left for the validator to name.
pub fn ippool_defaults(spec: &IPPoolSpec) -> Result<PoolDefaults, Rejection> {
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
pub fn validate_ippool_update(
    old: &IPPool,
    new: &IPPool,
    facts: &PoolFacts,
) -> Result<(), Rejection> {
    if old.spec == new.spec {
        return Ok(());
    }
    let (o4, n4) = (&old.spec.ipv4_config, &new.spec.ipv4_config);
    for (field, before, after) in [
        (F_NETWORK, &old.spec.network_name, &new.spec.network_name),
        (F_CIDR, &o4.cidr, &n4.cidr),
        (F_SERVER, &o4.server_ip, &n4.server_ip),
        (F_START, &o4.pool.start, &n4.pool.start),
        (F_END, &o4.pool.end, &n4.pool.end),
    ] {
        if before != after {
            return Err(immutable(field, after, before));
        }
    }
    let (old_router, new_router) = (
        optional(o4.router.as_deref()),
        optional(n4.router.as_deref()),
    );
    if let Some(before) = old_router
        && new_router != Some(before)
    {
        return Err(immutable(F_ROUTER, new_router.unwrap_or_default(), before));
    }
    if !o4.pool.exclude.is_empty() && o4.pool.exclude != n4.pool.exclude {
        return Err(immutable(
            F_EXCLUDE,
            &n4.pool.exclude.join(","),
            &o4.pool.exclude.join(","),
        ));
    }

    let valid = check_pool_spec(new, facts)?;
    let checked = valid.range();

    // The status the apiserver stores: on a validated update, new.status is old.status.
    let allocated = allocated_of(old);
    let held_by_mac = |ip: Ipv4Addr| match allocated.get(&ip) {
        Some(Holder::Mac(mac)) => Some(*mac),
        _ => None,
    };
    if old_router.is_none()
        && let (Some(router), Some(raw)) = (checked.router(), new_router)
        && let Some(mac) = held_by_mac(router)
    {
        return Err(Rejection::new(
            F_ROUTER,
            raw,
            format!("is already occupied by MAC {mac}"),
        ));
    }
    if o4.pool.exclude.is_empty() {
        for (i, (ip, raw)) in checked.exclude().iter().zip(&n4.pool.exclude).enumerate() {
            if let Some(mac) = held_by_mac(*ip) {
                return Err(Rejection::new(
                    format!("{F_EXCLUDE}[{i}]"),
                    raw,
                    format!("is already occupied by MAC {mac}"),
                ));
            }
        }
    }
    match allocated.get(&checked.server_ip()) {
        Some(Holder::Mac(mac)) => Err(Rejection::new(
            F_SERVER,
            &n4.server_ip,
            format!("is already occupied by MAC {mac}"),
        )),
        Some(Holder::Excluded) => Err(Rejection::new(
            F_SERVER,
            &n4.server_ip,
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
/// its network, the one parse of its spec ([`ValidPool::parse`]), its CIDR against the cluster's,
/// the addressing policy, the options.
fn check_pool_spec(pool: &IPPool, facts: &PoolFacts) -> Result<ValidPool, Rejection> {
    let v4 = &pool.spec.ipv4_config;
    check_pool_network(pool, facts)?;
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
    check_pool_addressing(v4, valid.range())?;
    check_pool_options(v4)?;
    check_pool_routes(v4, &valid)?;
    Ok(valid)
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

/// What a new pool's addressing must meet beyond being servable: a router apart from the
/// server, excludes unique and in range, and neither server nor router excluded.
fn check_pool_addressing(v4: &IPv4Config, range: &PoolRange) -> Result<(), Rejection> {
    let (server_ip, router) = (range.server_ip(), range.router());
    let (start, end) = (range.start(), range.end());
    if router == Some(server_ip) {
        return Err(Rejection::new(
            F_SERVER,
            &v4.server_ip,
            format!("must differ from {F_ROUTER} {server_ip}"),
        ));
    }
    let exclude = range.exclude();
    for (i, (ip, raw)) in exclude.iter().zip(&v4.pool.exclude).enumerate() {
        let field = format!("{F_EXCLUDE}[{i}]");
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
                format!("duplicates {F_EXCLUDE}[{j}]"),
            ));
        }
    }
    for (field, raw, ip) in [
        (F_SERVER, v4.server_ip.as_str(), Some(server_ip)),
        (F_ROUTER, v4.router.as_deref().unwrap_or_default(), router),
    ] {
        if let Some(ip) = ip
            && let Some(i) = exclude.iter().position(|e| *e == ip)
        {
            return Err(Rejection::new(
                field,
                raw,
                format!("is excluded by {F_EXCLUDE}[{i}]"),
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
