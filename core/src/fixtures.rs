//! Test fixtures shared by every crate's tests, so that a change of the domain types is made in
//! one place rather than in each test module: the README's objects, IPPools renamed and given a
//! status, and [`PoolConfig`]s with builder methods.
//!
//! Compiled for this crate's own tests and, for the other crates, behind the `test-support`
//! feature, which only their dev-dependencies enable: nothing here reaches a binary. The
//! fixtures panic on a malformed literal, which is a bug in the test that wrote it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use crate::crd::{Condition, IPPool, IPPoolStatus, IPv4Status, VirtualMachineNetworkConfig};
use crate::names::NamespacedName;
use crate::pool::PoolConfig;

const README_IPPOOL: &str = include_str!("../../examples/ippool.yaml");
const README_VMNETCFG: &str = include_str!("../../examples/vmnetcfg.yaml");
const DUAL_STACK_IPPOOL: &str = include_str!("../../examples/ippool-dual-stack.yaml");

/// `namespace/name` from a literal.
pub fn nn(s: &str) -> NamespacedName {
    s.parse().unwrap()
}

/// The README pool: default/net-48 on default/net-48, 192.168.48.0/24, range .81-.90 with
/// both ends excluded, server .77, router .1, every option set, no status.
pub fn readme_pool() -> IPPool {
    serde_yaml_ng::from_str(README_IPPOOL).unwrap()
}

/// The dual-stack example (Harvester's design, servers off the routers' addresses):
/// default/vm-pool-dual on default/vm-net-dual, 192.168.100.0/24 range .10-.100 server .2
/// router .1, and fd00::/112 range fd00::10-fd00::fff0 server fd00::2 router fd00::1; no status.
pub fn dual_stack_pool() -> IPPool {
    serde_yaml_ng::from_str(DUAL_STACK_IPPOOL).unwrap()
}

/// The README's VirtualMachineNetworkConfig (one NIC on default/net-48).
pub fn readme_vmnetcfg() -> VirtualMachineNetworkConfig {
    serde_yaml_ng::from_str(README_VMNETCFG).unwrap()
}

/// The README pool renamed to `key` (`namespace/name`), serving `network`.
pub fn pool_on(key: &str, network: &str) -> IPPool {
    let k = nn(key);
    let mut pool = readme_pool();
    pool.metadata.namespace = Some(k.namespace);
    pool.metadata.name = Some(k.name);
    pool.spec.network_name = network.to_owned();
    pool
}

/// `pool` with `status.ipv4.allocated` set to `entries` (address → MAC or `EXCLUDED`/`RESERVED`),
/// the rest of its status kept.
pub fn with_allocated(mut pool: IPPool, entries: &[(&str, &str)]) -> IPPool {
    let mut status = pool.status.take().unwrap_or_default();
    status.ipv4 = Some(IPv4Status {
        allocated: entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        used: 0,
        available: 0,
        ..Default::default()
    });
    pool.status = Some(status);
    pool
}

/// `pool` with its status conditions set to `conditions` (type, True or False), the rest of its
/// status kept.
pub fn with_conditions(mut pool: IPPool, conditions: &[(&str, bool)]) -> IPPool {
    let status = pool.status.get_or_insert_with(IPPoolStatus::default);
    status.conditions = conditions
        .iter()
        .map(|(type_, ok)| Condition {
            type_: (*type_).to_owned(),
            status: if *ok { "True" } else { "False" }.to_owned(),
            ..Condition::default()
        })
        .collect();
    pool
}

/// A pool config with nothing optional: pool and network `key`, interface `eth1`, server
/// 192.0.2.1 in 192.0.2.0/24, no options, a 300 s lease. Tests set what they exercise with the
/// `with_*` methods or struct update syntax.
pub fn pool_config(key: &str) -> PoolConfig {
    PoolConfig {
        ipv6: None,
        pool: nn(key),
        network: nn(key),
        interface_name: "eth1".into(),
        server_ip: Ipv4Addr::new(192, 0, 2, 1),
        subnet: "192.0.2.0/24".parse().unwrap(),
        router: None,
        dns: vec![],
        domain_name: None,
        domain_search: vec![],
        ntp: vec![],
        lease_seconds: 300,
        mtu: None,
        routes: vec![],
        conflicted: vec![],
        boot: None,
    }
}

// === impl PoolConfig (fixtures) ===

impl PoolConfig {
    /// Served on `interface`.
    pub fn with_interface(mut self, interface: &str) -> Self {
        self.interface_name = interface.to_owned();
        self
    }

    /// In `cidr`, the server on its first host address.
    pub fn with_subnet(mut self, cidr: &str) -> Self {
        let subnet: Ipv4Net = cidr.parse().unwrap();
        self.subnet = subnet.trunc();
        self.server_ip = Ipv4Addr::from(u32::from(subnet.network()) + 1);
        self
    }

    /// Leases of `seconds`.
    pub fn with_lease_seconds(mut self, seconds: u32) -> Self {
        self.lease_seconds = seconds;
        self
    }

    /// Dual-stack: an IPv6 side in fd00::/112, the server at fd00::1, no DNS, 300 s lifetimes,
    /// no Router Advertisements, `conflicted` recorded as used by another host.
    pub fn with_ipv6(mut self, conflicted: Vec<std::net::Ipv6Addr>) -> Self {
        self.ipv6 = Some(crate::pool::PoolConfigV6 {
            server_ip: "fd00::1".parse().unwrap(),
            subnet: "fd00::/112".parse().unwrap(),
            dns: vec![],
            lease_seconds: 300,
            router_advertisements: false,
            router: None,
            conflicted,
            boot: None,
        });
        self
    }

    /// Every option set, in 192.0.2.0/24: router .254, DNS .53 and .54, domain `example.test`,
    /// search `example.test` and `svc.example.test`, NTP 192.0.2.123 and `ntp.example.test`.
    pub fn with_options(mut self) -> Self {
        self.router = Some(Ipv4Addr::new(192, 0, 2, 254));
        self.dns = vec![Ipv4Addr::new(192, 0, 2, 53), Ipv4Addr::new(192, 0, 2, 54)];
        self.domain_name = Some("example.test".into());
        self.domain_search = vec!["example.test".into(), "svc.example.test".into()];
        self.ntp = vec!["192.0.2.123".into(), "ntp.example.test".into()];
        self
    }
}
