//! The IPv6 side of a dual-stack pool (`spec.ipv6Config`, experimental): its one parse
//! ([`ValidV6::parse`]) into a checked [`PoolRange<Ipv6Addr>`] and the DHCPv6 options, and
//! what an agent serves from it ([`PoolConfigV6`]).
//!
//! As for IPv4, what is checked here is what makes the IPv6 side servable at all: every address
//! parses as IPv6, the server, range ends and router lie inside the CIDR and are not its
//! subnet-router anycast address (host bits zero), the range is in order, the lease time fits.
//! The size limit on the range and the rest of the policy for new objects are the admission
//! webhook's. IPv6 has no broadcast address: the last address of the CIDR is a host.

use std::net::Ipv6Addr;

use ipnet::Ipv6Net;
use serde::{Deserialize, Serialize};

use super::boot::BootV6;
use super::family::Family;
use super::{DEFAULT_LEASE_SECONDS, PoolError, PoolRange};
use crate::crd::IPv6Config;
use crate::names::NamespacedName;

/// `spec.ipv6Config`.
pub const F6: &str = "spec.ipv6Config";
/// `spec.ipv6Config.cidr`.
pub const F6_CIDR: &str = "spec.ipv6Config.cidr";
/// `spec.ipv6Config.serverIP`.
pub const F6_SERVER: &str = "spec.ipv6Config.serverIP";
/// `spec.ipv6Config.router`.
pub const F6_ROUTER: &str = "spec.ipv6Config.router";
/// `spec.ipv6Config.pool.start`.
pub const F6_START: &str = "spec.ipv6Config.pool.start";
/// `spec.ipv6Config.pool.end`.
pub const F6_END: &str = "spec.ipv6Config.pool.end";
/// `spec.ipv6Config.pool.exclude`.
pub const F6_EXCLUDE: &str = "spec.ipv6Config.pool.exclude";
/// `spec.ipv6Config.dns`.
pub const F6_DNS: &str = "spec.ipv6Config.dns";
/// `spec.ipv6Config.leaseTime`.
pub const F6_LEASE: &str = "spec.ipv6Config.leaseTime";

/// Most addresses an IPv6 range may span (Harvester's design: a full /64 must be refused). The
/// IPAM would cope with more (it keeps intervals, not addresses); the bound keeps the
/// `available` count and an operator's expectations to what a VM network holds.
pub const MAX_V6_RANGE: u64 = 65_535;

impl PoolRange<Ipv6Addr> {
    /// Checks and builds an IPv6 range: `server_ip`, `start`, `end` and `router` inside
    /// `subnet` and not its subnet-router anycast address, `start <= end`. The subnet's host
    /// bits are cleared.
    pub fn new_v6(
        pool: NamespacedName,
        subnet: Ipv6Net,
        (start, end): (Ipv6Addr, Ipv6Addr),
        server_ip: Ipv6Addr,
        router: Option<Ipv6Addr>,
        exclude: Vec<Ipv6Addr>,
    ) -> Result<Self, PoolError> {
        let subnet = subnet.trunc();
        let invalid = |field: &str, ip: Ipv6Addr, reason: String| PoolError::InvalidField {
            pool: pool.to_string(),
            field: field.to_owned(),
            value: ip.to_string(),
            reason,
        };
        let hosts = [
            (F6_SERVER, Some(server_ip)),
            (F6_START, Some(start)),
            (F6_END, Some(end)),
            (F6_ROUTER, router),
        ];
        for (field, ip) in hosts {
            if let Some(ip) = ip
                && let Some(reason) = not_a_host_v6(subnet, ip)
            {
                return Err(invalid(field, ip, reason));
            }
        }
        if start > end {
            return Err(invalid(
                F6_START,
                start,
                format!("is after {F6_END} {end}: invalid pool range"),
            ));
        }
        Ok(PoolRange::from_parts(
            pool, subnet, start, end, server_ip, router, exclude,
        ))
    }

    /// How many addresses `start..=end` spans.
    pub fn size(&self) -> u64 {
        Ipv6Addr::span(self.start().to_int(), self.end().to_int())
    }
}

/// Why `ip` is not a host address of the IPv6 `subnet`, in the words of the admission webhook;
/// `None` when it is one. The subnet-router anycast address (RFC 4291 §2.6.1) is no host's.
pub fn not_a_host_v6(subnet: Ipv6Net, ip: Ipv6Addr) -> Option<String> {
    if !subnet.contains(&ip) {
        Some(format!("is outside cidr {subnet}"))
    } else if ip == subnet.network() && subnet.prefix_len() < 127 {
        Some(format!("is the subnet-router anycast address of {subnet}"))
    } else {
        None
    }
}

/// A pool's `ipv6Config`, parsed and checked once: its range for the IPAM and the DHCPv6
/// options an agent hands out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidV6 {
    range: PoolRange<Ipv6Addr>,
    dns: Vec<Ipv6Addr>,
    lease_seconds: u32,
    router_advertisements: bool,
    boot: Option<BootV6>,
}

impl ValidV6 {
    /// Parses `v6`, the `ipv6Config` of `pool`; every error names the field and the value.
    pub fn parse(pool: &NamespacedName, v6: &IPv6Config) -> Result<Self, PoolError> {
        let invalid = |field: &str, value: &str, reason: &str| PoolError::InvalidField {
            pool: pool.to_string(),
            field: field.to_owned(),
            value: value.to_owned(),
            reason: reason.to_owned(),
        };
        let addr = |field: &str, value: &str| -> Result<Ipv6Addr, PoolError> {
            if value.trim().is_empty() {
                return Err(invalid(field, value, "is required"));
            }
            value
                .parse()
                .map_err(|_| invalid(field, value, "is not an IPv6 address"))
        };
        let list = |field: &str, values: &[String]| -> Result<Vec<Ipv6Addr>, PoolError> {
            let each = values.iter().enumerate();
            each.map(|(i, v)| addr(&format!("{field}[{i}]"), v))
                .collect()
        };
        if v6.cidr.trim().is_empty() {
            return Err(invalid(F6_CIDR, &v6.cidr, "is required"));
        }
        let subnet: Ipv6Net = v6
            .cidr
            .parse()
            .map_err(|_| invalid(F6_CIDR, &v6.cidr, "is not an IPv6 CIDR (e.g. fd00::/112)"))?;
        let server_ip = addr(F6_SERVER, &v6.server_ip)?;
        let start = addr(F6_START, &v6.pool.start)?;
        let end = addr(F6_END, &v6.pool.end)?;
        let router = match v6.router.as_deref() {
            None | Some("") => None,
            Some(r) => Some(addr(F6_ROUTER, r)?),
        };
        let exclude = list(F6_EXCLUDE, &v6.pool.exclude)?;
        let dns = list(F6_DNS, &v6.dns)?;
        let lease_seconds = match v6.lease_time {
            None | Some(0) => DEFAULT_LEASE_SECONDS,
            Some(t) => u32::try_from(t).map_err(|_| {
                invalid(
                    F6_LEASE,
                    &t.to_string(),
                    "must be between 0 and 4294967295 seconds",
                )
            })?,
        };
        let range = PoolRange::new_v6(
            pool.clone(),
            subnet,
            (start, end),
            server_ip,
            router,
            exclude,
        )
        .map_err(|e| match e {
            // Name the value as written, not as re-printed.
            PoolError::InvalidField { field, reason, .. } => {
                let written = match field.as_str() {
                    F6_SERVER => v6.server_ip.as_str(),
                    F6_START => v6.pool.start.as_str(),
                    F6_END => v6.pool.end.as_str(),
                    _ => v6.router.as_deref().unwrap_or_default(),
                };
                invalid(&field, written, &reason)
            }
            other => other,
        })?;
        Ok(ValidV6 {
            range,
            dns,
            lease_seconds,
            router_advertisements: v6.send_router_advertisements == Some(true),
            boot: match &v6.boot {
                None => None,
                Some(boot) => BootV6::parse(pool, boot)?,
            },
        })
    }

    /// The IPv6 addressing, for the IPAM.
    pub fn range(&self) -> &PoolRange<Ipv6Addr> {
        &self.range
    }

    /// What an agent serves over DHCPv6 for this pool.
    pub fn config(&self) -> PoolConfigV6 {
        PoolConfigV6 {
            // From the status, not the spec: `PoolConfig::from_ippool` fills it.
            conflicted: Vec::new(),
            server_ip: self.range.server_ip(),
            subnet: self.range.subnet(),
            dns: self.dns.clone(),
            lease_seconds: self.lease_seconds,
            router_advertisements: self.router_advertisements,
            router: self.range.router(),
            boot: self.boot.clone(),
        }
    }
}

/// The IPv6 side of a [`super::PoolConfig`]: what an agent needs to answer DHCPv6 for the pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolConfigV6 {
    /// The server's own address on the network, inside `subnet`.
    pub server_ip: Ipv6Addr,
    /// The subnet, host bits cleared.
    pub subnet: Ipv6Net,
    /// DNS servers (option 23).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dns: Vec<Ipv6Addr>,
    /// Valid lifetime of an address, in seconds.
    pub lease_seconds: u32,
    /// Whether the agent sends Router Advertisements ([`crate::crd::IPv6Config`]'s
    /// `sendRouterAdvertisements`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub router_advertisements: bool,
    /// The network's router: a router lifetime is advertised only when it is `server_ip`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router: Option<Ipv6Addr>,
    /// Addresses the controller records as used by another host (`status.ipv6.conflicts`):
    /// not given, and re-probed by the serving agent so a freed one can be cleared.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflicted: Vec<Ipv6Addr>,
    /// Network boot over DHCPv6, for clients that ask for a boot file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot: Option<BootV6>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::IPv6Pool;

    fn hep_example() -> IPv6Config {
        IPv6Config {
            server_ip: "fd00::1".into(),
            cidr: "fd00::/112".into(),
            pool: IPv6Pool {
                start: "fd00::10".into(),
                end: "fd00::fff0".into(),
                exclude: vec![],
            },
            router: Some("fd00::1".into()),
            dns: vec![],
            lease_time: None,
            send_router_advertisements: None,
            boot: None,
        }
    }

    fn pool() -> NamespacedName {
        "default/vm-pool-dual".parse().unwrap()
    }

    #[test]
    fn the_designs_example_parses_into_its_range_and_config() {
        let v6 = ValidV6::parse(&pool(), &hep_example()).unwrap();
        assert_eq!(v6.range().size(), 65_505);
        assert!(v6.range().size() <= MAX_V6_RANGE);
        let cfg = v6.config();
        assert_eq!(cfg.server_ip, "fd00::1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(cfg.subnet.to_string(), "fd00::/112");
        assert_eq!(cfg.lease_seconds, DEFAULT_LEASE_SECONDS);
    }

    #[test]
    fn every_bad_field_is_named_with_its_value() {
        type Mutate = fn(&mut IPv6Config);
        let cases: Vec<(Mutate, &str, &str, &str)> = vec![
            (
                |c| c.cidr = "192.168.0.0/24".into(),
                F6_CIDR,
                "192.168.0.0/24",
                "is not an IPv6 CIDR",
            ),
            (|c| c.cidr = String::new(), F6_CIDR, "", "is required"),
            (
                |c| c.server_ip = "10.0.0.1".into(),
                F6_SERVER,
                "10.0.0.1",
                "is not an IPv6 address",
            ),
            (
                |c| c.server_ip = "fd01::1".into(),
                F6_SERVER,
                "fd01::1",
                "is outside cidr fd00::/112",
            ),
            (
                |c| c.pool.start = "fd00::".into(),
                F6_START,
                "fd00::",
                "subnet-router anycast",
            ),
            (
                |c| c.pool.start = "FD00::FFFF".into(),
                F6_START,
                "FD00::FFFF",
                "is after",
            ),
            (
                |c| c.pool.end = "fd00::1:0".into(),
                F6_END,
                "fd00::1:0",
                "is outside cidr",
            ),
            (
                |c| c.router = Some("fd00::zz".into()),
                F6_ROUTER,
                "fd00::zz",
                "is not an IPv6 address",
            ),
            (
                |c| c.pool.exclude = vec!["fd00::20".into(), "x".into()],
                "spec.ipv6Config.pool.exclude[1]",
                "x",
                "is not an IPv6 address",
            ),
            (
                |c| c.dns = vec!["1.1.1.1".into()],
                "spec.ipv6Config.dns[0]",
                "1.1.1.1",
                "is not an IPv6 address",
            ),
            (
                |c| c.lease_time = Some(-1),
                F6_LEASE,
                "-1",
                "must be between",
            ),
        ];
        for (mutate, field, value, reason) in cases {
            let mut c = hep_example();
            mutate(&mut c);
            match ValidV6::parse(&pool(), &c) {
                Err(PoolError::InvalidField {
                    field: f,
                    value: v,
                    reason: r,
                    ..
                }) => {
                    assert_eq!((f.as_str(), v.as_str()), (field, value));
                    assert!(r.contains(reason), "{field}: {r:?} lacks {reason:?}");
                }
                other => panic!("{field}: expected InvalidField, got {other:?}"),
            }
        }
    }

    #[test]
    fn the_last_address_is_a_host_and_the_first_is_not() {
        let net: Ipv6Net = "fd00::/126".parse().unwrap();
        let a = |s: &str| s.parse::<Ipv6Addr>().unwrap();
        assert_eq!(not_a_host_v6(net, a("fd00::3")), None);
        assert!(not_a_host_v6(net, a("fd00::")).is_some());
        assert!(not_a_host_v6(net, a("fd00::4")).is_some());
        // On a /127 (RFC 6164) both addresses are hosts.
        let p2p: Ipv6Net = "fd00::/127".parse().unwrap();
        assert_eq!(not_a_host_v6(p2p, a("fd00::")), None);
    }
}
