//! The one parse of an IPPool spec: [`ValidPool::parse`] turns the strings of the CRD into typed
//! values and checks what every reader relies on, so the admission webhook, the IPPool
//! reconciler, the IPAM, the controller's index and an agent reading IPPools directly all see the
//! same pool, refused for the same reasons, with errors that name the field and the value.
//!
//! What is checked here is what makes a pool servable at all: every address parses, the server,
//! range ends and router are host addresses of the CIDR, the range is in order, the lease time
//! and the MTU fit their DHCP options, the routes are networks and next hops. Policy that only new objects must meet (excludes inside the range, the
//! server apart from the router, counts and DNS names, the NAD and the other pools) is the
//! admission webhook's, layered on top of a [`ValidPool`]: an object already stored (by upstream's
//! controller, say) keeps being served if it is servable.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use super::boot::Boot;
use super::family::Family;
use super::v6::ValidV6;
use super::{DEFAULT_LEASE_SECONDS, PoolConfig, PoolError, Route, is_host_of, pool_ref};
use crate::crd::{IPPool, IPv4Config, StaticRoute};
use crate::names::NamespacedName;

// The JSON paths of the fields, as errors and admission refusals name them.
/// `spec.networkName`.
pub const F_NETWORK: &str = "spec.networkName";
/// `spec.ipv4Config.cidr`.
pub const F_CIDR: &str = "spec.ipv4Config.cidr";
/// `spec.ipv4Config.serverIP`.
pub const F_SERVER: &str = "spec.ipv4Config.serverIP";
/// `spec.ipv4Config.router`.
pub const F_ROUTER: &str = "spec.ipv4Config.router";
/// `spec.ipv4Config.pool.start`.
pub const F_START: &str = "spec.ipv4Config.pool.start";
/// `spec.ipv4Config.pool.end`.
pub const F_END: &str = "spec.ipv4Config.pool.end";
/// `spec.ipv4Config.pool.exclude`.
pub const F_EXCLUDE: &str = "spec.ipv4Config.pool.exclude";
/// `spec.ipv4Config.dns`.
pub const F_DNS: &str = "spec.ipv4Config.dns";
/// `spec.ipv4Config.ntp`.
pub const F_NTP: &str = "spec.ipv4Config.ntp";
/// `spec.ipv4Config.domainName`.
pub const F_DOMAIN: &str = "spec.ipv4Config.domainName";
/// `spec.ipv4Config.domainSearch`.
pub const F_SEARCH: &str = "spec.ipv4Config.domainSearch";
/// `spec.ipv4Config.leaseTime`.
pub const F_LEASE: &str = "spec.ipv4Config.leaseTime";
/// `spec.ipv4Config.mtu`.
pub const F_MTU: &str = "spec.ipv4Config.mtu";
/// `spec.ipv4Config.routes`.
pub const F_ROUTES: &str = "spec.ipv4Config.routes";
/// `spec.ipv4Config.defaultRoute`.
pub const F_DEFAULT_ROUTE: &str = "spec.ipv4Config.defaultRoute";
/// The smallest MTU option 26 may carry (RFC 2132 §5.1).
pub const MIN_MTU: u16 = 68;

/// The addressing of a pool: what the IPAM allocates from. Only built checked (by
/// [`PoolRange::new`] or [`ValidPool::parse`]), so an allocator never meets a range out of order
/// or outside its subnet.
///
/// Generic over the address family: `PoolRange` is a pool's IPv4 range, `PoolRange<Ipv6Addr>`
/// its IPv6 one ([`PoolRange::new_v6`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolRange<A: Family = Ipv4Addr> {
    pool: NamespacedName,
    subnet: A::Net,
    start: A,
    end: A,
    server_ip: A,
    router: Option<A>,
    exclude: Vec<A>,
}

impl PoolRange {
    /// Checks and builds a range: `server_ip`, `start`, `end` and `router` host addresses of
    /// `subnet` (host bits are cleared), `start` ≤ `end`. Errors name the field as the IPPool
    /// spec does. Excludes may lie anywhere: those outside the range exclude nothing.
    pub fn new(
        pool: NamespacedName,
        subnet: Ipv4Net,
        (start, end): (Ipv4Addr, Ipv4Addr),
        server_ip: Ipv4Addr,
        router: Option<Ipv4Addr>,
        exclude: Vec<Ipv4Addr>,
    ) -> Result<Self, PoolError> {
        let subnet = subnet.trunc();
        let invalid = |field: &str, ip: Ipv4Addr, reason: String| PoolError::InvalidField {
            pool: pool.to_string(),
            field: field.to_owned(),
            value: ip.to_string(),
            reason,
        };
        let hosts = [(F_SERVER, Some(server_ip)), (F_START, Some(start))];
        for (field, ip) in hosts
            .into_iter()
            .chain([(F_END, Some(end)), (F_ROUTER, router)])
        {
            if let Some(ip) = ip
                && let Some(reason) = not_a_host(subnet, ip)
            {
                return Err(invalid(field, ip, reason));
            }
        }
        if start > end {
            return Err(invalid(
                F_START,
                start,
                format!("is after {F_END} {end}: invalid pool range"),
            ));
        }
        Ok(PoolRange {
            pool,
            subnet,
            start,
            end,
            server_ip,
            router,
            exclude,
        })
    }
}

impl<A: Family> PoolRange<A> {
    /// A range from parts the caller has checked (each family's constructor).
    pub(super) fn from_parts(
        pool: NamespacedName,
        subnet: A::Net,
        start: A,
        end: A,
        server_ip: A,
        router: Option<A>,
        exclude: Vec<A>,
    ) -> Self {
        PoolRange {
            pool,
            subnet,
            start,
            end,
            server_ip,
            router,
            exclude,
        }
    }

    /// The pool, `namespace/name`, for messages.
    pub fn pool(&self) -> &NamespacedName {
        &self.pool
    }

    /// The subnet, host bits cleared.
    pub fn subnet(&self) -> A::Net {
        self.subnet
    }

    /// First allocatable address.
    pub fn start(&self) -> A {
        self.start
    }

    /// Last allocatable address (≥ [`Self::start`]).
    pub fn end(&self) -> A {
        self.end
    }

    /// The DHCP server's address: `RESERVED` when inside the range.
    pub fn server_ip(&self) -> A {
        self.server_ip
    }

    /// The router: `RESERVED` when inside the range.
    pub fn router(&self) -> Option<A> {
        self.router
    }

    /// Addresses never handed out: `EXCLUDED` (those outside the range have no effect).
    pub fn exclude(&self) -> &[A] {
        &self.exclude
    }
}

/// Why `ip` is not a host address of `subnet`, in the words of the admission webhook; `None`
/// when it is one (see [`is_host_of`]).
pub fn not_a_host(subnet: Ipv4Net, ip: Ipv4Addr) -> Option<String> {
    if !subnet.contains(&ip) {
        Some(format!("is outside cidr {subnet}"))
    } else if is_host_of(subnet, ip) {
        None
    } else if ip == subnet.network() {
        Some(format!("is the network address of {subnet}"))
    } else {
        Some(format!("is the broadcast address of {subnet}"))
    }
}

/// An IPPool spec, parsed and checked once: its range for the IPAM and the options an agent
/// hands out. See the module docs for what is checked here and what is left to admission.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidPool {
    network: NamespacedName,
    range: PoolRange,
    dns: Vec<Ipv4Addr>,
    domain_name: Option<String>,
    domain_search: Vec<String>,
    ntp: Vec<String>,
    lease_seconds: u32,
    mtu: Option<u16>,
    routes: Vec<Route>,
    default_route: bool,
    boot: Option<Boot>,
    ipv6: Option<ValidV6>,
}

impl ValidPool {
    /// Parses `pool`'s spec; the first field that cannot be used is the error. A bare
    /// `networkName` names a NAD in the pool's namespace, as upstream reads stored objects.
    pub fn parse(pool: &IPPool) -> Result<Self, PoolError> {
        let pool_ref = pool_ref(pool)?;
        let f = Fields(&pool_ref);
        let spec = &pool.spec;
        let v4 = &spec.ipv4_config;
        let network =
            NamespacedName::parse_in(&spec.network_name, &pool_ref.namespace).map_err(|e| {
                let reason = format!("is not a network reference: {e}");
                f.invalid(F_NETWORK, &spec.network_name, &reason)
            })?;
        let range = f.range(v4)?;
        let dns = f.ipv4_list(F_DNS, &v4.dns)?;
        let lease_seconds = match v4.lease_time {
            None | Some(0) => DEFAULT_LEASE_SECONDS,
            Some(t) => u32::try_from(t).map_err(|_| {
                let reason = "must be between 0 and 4294967295 seconds";
                f.invalid(F_LEASE, &t.to_string(), reason)
            })?,
        };
        let mtu =
            match v4.mtu {
                None => None,
                Some(m) => Some(u16::try_from(m).ok().filter(|m| *m >= MIN_MTU).ok_or_else(
                    || f.invalid(F_MTU, &m.to_string(), "must be between 68 and 65535"),
                )?),
            };
        Ok(ValidPool {
            network,
            range,
            dns,
            domain_name: v4.domain_name.clone().filter(|d| !d.is_empty()),
            domain_search: v4.domain_search.clone(),
            ntp: v4.ntp.clone(),
            lease_seconds,
            mtu,
            routes: f.routes(&v4.routes)?,
            default_route: v4.default_route != Some(false),
            boot: match &v4.boot {
                None => None,
                Some(boot) => Boot::parse(&pool_ref, boot)?,
            },
            ipv6: spec
                .ipv6_config
                .as_ref()
                .map(|v6| ValidV6::parse(&pool_ref, v6))
                .transpose()?,
        })
    }

    /// The pool, `namespace/name`.
    pub fn pool(&self) -> &NamespacedName {
        &self.range.pool
    }

    /// The NetworkAttachmentDefinition the pool serves.
    pub fn network(&self) -> &NamespacedName {
        &self.network
    }

    /// The addressing, for the IPAM.
    pub fn range(&self) -> &PoolRange {
        &self.range
    }

    /// The IPv6 side of a dual-stack pool, if it has one.
    pub fn ipv6(&self) -> Option<&ValidV6> {
        self.ipv6.as_ref()
    }

    /// The classless static routes, destinations truncated to their prefix.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// What an agent serves for this pool on `interface_name` (a valid Linux interface name).
    pub fn config(&self, interface_name: &str) -> Result<PoolConfig, PoolError> {
        if crate::ifname::validate(interface_name).is_err() {
            return Err(PoolError::InvalidField {
                pool: self.pool().to_string(),
                field: "interfaceName".to_owned(),
                value: interface_name.to_owned(),
                reason: "is not a valid Linux interface name".to_owned(),
            });
        }
        Ok(PoolConfig {
            pool: self.pool().clone(),
            network: self.network.clone(),
            interface_name: interface_name.to_owned(),
            server_ip: self.range.server_ip,
            subnet: self.range.subnet,
            // Without a default route, no router option (and no 0.0.0.0/0 among the routes).
            router: self.range.router.filter(|_| self.default_route),
            dns: self.dns.clone(),
            domain_name: self.domain_name.clone(),
            domain_search: self.domain_search.clone(),
            ntp: self.ntp.clone(),
            lease_seconds: self.lease_seconds,
            mtu: self.mtu,
            routes: self.routes.clone(),
            conflicted: Vec::new(),
            boot: self.boot.clone(),
            ipv6: self.ipv6.as_ref().map(ValidV6::config),
        })
    }
}

/// The field parsers of one pool's spec, each error naming the pool, the field and the value.
struct Fields<'a>(&'a NamespacedName);

impl Fields<'_> {
    fn invalid(&self, field: &str, value: &str, reason: &str) -> PoolError {
        PoolError::InvalidField {
            pool: self.0.to_string(),
            field: field.to_owned(),
            value: value.to_owned(),
            reason: reason.to_owned(),
        }
    }

    fn ipv4(&self, field: &str, value: &str) -> Result<Ipv4Addr, PoolError> {
        if value.trim().is_empty() {
            return Err(self.invalid(field, value, "is required"));
        }
        value
            .parse()
            .map_err(|_| self.invalid(field, value, "is not an IPv4 address"))
    }

    /// `values`, each an address, named `field[i]`.
    fn ipv4_list(&self, field: &str, values: &[String]) -> Result<Vec<Ipv4Addr>, PoolError> {
        let each = values.iter().enumerate();
        each.map(|(i, v)| self.ipv4(&format!("{field}[{i}]"), v))
            .collect()
    }

    /// The CIDR, server, range, router and excludes, checked by [`PoolRange::new`].
    fn range(&self, v4: &IPv4Config) -> Result<PoolRange, PoolError> {
        if v4.cidr.trim().is_empty() {
            return Err(self.invalid(F_CIDR, &v4.cidr, "is required"));
        }
        let subnet: Ipv4Net = v4.cidr.parse().map_err(|_| {
            let reason = "is not an IPv4 CIDR (e.g. 192.168.48.0/24)";
            self.invalid(F_CIDR, &v4.cidr, reason)
        })?;
        let server_ip = self.ipv4(F_SERVER, &v4.server_ip)?;
        let start = self.ipv4(F_START, &v4.pool.start)?;
        let end = self.ipv4(F_END, &v4.pool.end)?;
        let router = match v4.router.as_deref() {
            None | Some("") => None,
            Some(r) => Some(self.ipv4(F_ROUTER, r)?),
        };
        let exclude = self.ipv4_list(F_EXCLUDE, &v4.pool.exclude)?;
        let range = (start, end);
        PoolRange::new(self.0.clone(), subnet, range, server_ip, router, exclude).map_err(|e| {
            match e {
                // Name the value as written, not as re-printed.
                PoolError::InvalidField { field, reason, .. } => {
                    let written = match field.as_str() {
                        F_SERVER => v4.server_ip.as_str(),
                        F_START => v4.pool.start.as_str(),
                        F_END => v4.pool.end.as_str(),
                        _ => v4.router.as_deref().unwrap_or_default(),
                    };
                    self.invalid(&field, written, &reason)
                }
                other => other,
            }
        })
    }

    /// The classless static routes, destinations truncated to their prefix.
    fn routes(&self, routes: &[StaticRoute]) -> Result<Vec<Route>, PoolError> {
        let each = routes.iter().enumerate();
        each.map(|(i, r)| {
            let field = |name: &str| format!("{F_ROUTES}[{i}].{name}");
            let destination = r.destination.parse::<Ipv4Net>().map_err(|_| {
                let reason = "is not an IPv4 CIDR (e.g. 10.96.0.0/12)";
                self.invalid(&field("destination"), &r.destination, reason)
            })?;
            Ok(Route {
                destination: destination.trunc(),
                gateway: self.ipv4(&field("gateway"), &r.gateway)?,
            })
        })
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{nn, readme_pool};

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    #[test]
    fn readme_pool_parses() {
        let valid = ValidPool::parse(&readme_pool()).unwrap();
        let range = valid.range();
        assert_eq!(valid.pool().to_string(), "default/net-48");
        assert_eq!(valid.network().to_string(), "default/net-48");
        assert_eq!(range.subnet().to_string(), "192.168.48.0/24");
        assert_eq!(
            (range.start(), range.end()),
            (ip("192.168.48.81"), ip("192.168.48.90"))
        );
        assert_eq!(range.server_ip(), ip("192.168.48.77"));
        assert_eq!(range.router(), Some(ip("192.168.48.1")));
        assert_eq!(range.exclude(), [ip("192.168.48.81"), ip("192.168.48.90")]);
    }

    #[test]
    fn a_bare_network_name_is_in_the_pools_namespace() {
        let mut pool = readme_pool();
        pool.spec.network_name = "net-48".into();
        assert_eq!(
            ValidPool::parse(&pool).unwrap().network().to_string(),
            "default/net-48"
        );
    }

    #[test]
    fn each_unusable_field_is_named_with_its_value_as_written() {
        type Mutation = fn(&mut IPPool);
        let cases: Vec<(Mutation, &str, &str, &str)> = vec![
            (
                |p| p.spec.ipv4_config.cidr = String::new(),
                F_CIDR,
                "",
                "is required",
            ),
            (
                |p| p.spec.ipv4_config.cidr = "192.168.48.0/33".into(),
                F_CIDR,
                "192.168.48.0/33",
                "is not an IPv4 CIDR",
            ),
            (
                |p| p.spec.ipv4_config.server_ip = "192.168.49.1".into(),
                F_SERVER,
                "192.168.49.1",
                "is outside cidr 192.168.48.0/24",
            ),
            (
                |p| p.spec.ipv4_config.server_ip = "192.168.48.255".into(),
                F_SERVER,
                "192.168.48.255",
                "is the broadcast address of 192.168.48.0/24",
            ),
            (
                |p| p.spec.ipv4_config.pool.start = "192.168.48.0".into(),
                F_START,
                "192.168.48.0",
                "is the network address of 192.168.48.0/24",
            ),
            (
                |p| p.spec.ipv4_config.pool.end = "192.168.48.80".into(),
                F_START,
                "192.168.48.81",
                "is after spec.ipv4Config.pool.end 192.168.48.80: invalid pool range",
            ),
            (
                |p| p.spec.ipv4_config.pool.end = " ".into(),
                F_END,
                " ",
                "is required",
            ),
            (
                |p| p.spec.ipv4_config.router = Some("gw".into()),
                F_ROUTER,
                "gw",
                "is not an IPv4 address",
            ),
            (
                |p| p.spec.ipv4_config.router = Some("10.0.0.1".into()),
                F_ROUTER,
                "10.0.0.1",
                "is outside cidr",
            ),
            (
                |p| p.spec.ipv4_config.pool.exclude = vec!["192.168.48.82".into(), "x".into()],
                "spec.ipv4Config.pool.exclude[1]",
                "x",
                "is not an IPv4 address",
            ),
            (
                |p| p.spec.ipv4_config.dns = vec!["1.1.1.1".into(), "8.8.8".into()],
                "spec.ipv4Config.dns[1]",
                "8.8.8",
                "is not an IPv4 address",
            ),
            (
                |p| p.spec.ipv4_config.lease_time = Some(-5),
                F_LEASE,
                "-5",
                "must be between",
            ),
            (
                |p| p.spec.network_name = "Bad/Name".into(),
                F_NETWORK,
                "Bad/Name",
                "is not a network reference",
            ),
        ];
        for (mutate, field, value, reason) in cases {
            let mut pool = readme_pool();
            mutate(&mut pool);
            match ValidPool::parse(&pool) {
                Err(PoolError::InvalidField {
                    pool,
                    field: f,
                    value: v,
                    reason: r,
                }) => {
                    assert_eq!(
                        (f.as_str(), v.as_str(), pool.as_str()),
                        (field, value, "default/net-48")
                    );
                    assert!(r.contains(reason), "{field}: {r:?} lacks {reason:?}");
                }
                other => panic!("{field}: expected InvalidField, got {other:?}"),
            }
        }
    }

    #[test]
    fn mtu_routes_and_the_default_route_reach_the_config() {
        let mut pool = readme_pool();
        pool.spec.ipv4_config.mtu = Some(1450);
        pool.spec.ipv4_config.routes = vec![crate::crd::StaticRoute {
            destination: "10.96.0.0/12".into(),
            gateway: "192.168.48.1".into(),
        }];
        let cfg = ValidPool::parse(&pool).unwrap().config("eth1").unwrap();
        assert_eq!(cfg.mtu, Some(1450));
        assert_eq!(
            cfg.routes,
            [Route {
                destination: "10.96.0.0/12".parse().unwrap(),
                gateway: ip("192.168.48.1")
            }]
        );
        assert_eq!(cfg.router, Some(ip("192.168.48.1")));
        // A secondary network: no router option, the routes still go out.
        pool.spec.ipv4_config.default_route = Some(false);
        let cfg = ValidPool::parse(&pool).unwrap().config("eth1").unwrap();
        assert_eq!((cfg.router, cfg.routes.len()), (None, 1));
        // Upstream's manifests set none of these: nothing new is sent.
        let cfg = ValidPool::parse(&readme_pool())
            .unwrap()
            .config("eth1")
            .unwrap();
        assert_eq!((cfg.mtu, cfg.routes.len()), (None, 0));
        assert!(cfg.router.is_some());
        for bad in [0, 67, 65536] {
            let mut p = readme_pool();
            p.spec.ipv4_config.mtu = Some(bad);
            assert!(matches!(
                ValidPool::parse(&p),
                Err(PoolError::InvalidField { field, .. }) if field == F_MTU
            ));
        }
    }

    #[test]
    fn ranges_are_checked_when_built() {
        let net: Ipv4Net = "10.0.0.0/24".parse().unwrap();
        let range = |start: &str, end: &str| {
            PoolRange::new(
                nn("ns/p"),
                net,
                (ip(start), ip(end)),
                ip("10.0.0.1"),
                None,
                vec![],
            )
        };
        assert!(range("10.0.0.5", "10.0.0.5").is_ok());
        assert!(range("10.0.0.6", "10.0.0.5").is_err());
        assert!(range("10.0.0.0", "10.0.0.5").is_err());
        assert!(range("10.0.0.5", "10.0.1.5").is_err());
        // Host bits of the subnet are cleared.
        let wide: Ipv4Net = "10.0.0.7/24".parse().unwrap();
        let r = PoolRange::new(
            nn("ns/p"),
            wide,
            (ip("10.0.0.5"), ip("10.0.0.9")),
            ip("10.0.0.1"),
            None,
            vec![],
        )
        .unwrap();
        assert_eq!(r.subnet(), net);
    }

    #[test]
    fn config_carries_the_options_and_checks_the_interface() {
        let valid = ValidPool::parse(&readme_pool()).unwrap();
        let cfg = valid.config("vmd0123456789").unwrap();
        assert_eq!(cfg.dns, [ip("1.1.1.1")]);
        assert_eq!(cfg.lease_seconds, 300);
        assert!(valid.config("bad/name").is_err());
    }
}
