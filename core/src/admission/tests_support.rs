//! Fixtures shared by the admission unit tests of every kind: the README's objects, a cluster of
//! two labelled networks, builders of pools and configs, and the `refused` assertion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use super::{
    Nad, PoolFacts, Rejection, VmNetCfgFacts, validate_ippool_create, validate_ippool_update,
    validate_vmnetcfg_create,
};
use crate::crd::{
    IPPool, IPv6Config, IPv6Pool, IPv6Status, LABEL_IPPOOL_NAME, LABEL_IPPOOL_NAMESPACE,
    NetworkConfig, VirtualMachineNetworkConfig, VirtualMachineNetworkConfigSpec,
};
pub(super) use crate::fixtures::{dual_stack_pool, nn, pool_on, readme_pool, with_allocated};

pub(super) const MAC_A: &str = "fa:cf:8e:50:82:fc";
pub(super) const MAC_B: &str = "c6:d6:82:39:d3:c3";

// === fixtures ===

/// The README's VirtualMachineNetworkConfig.
pub(super) use crate::fixtures::readme_vmnetcfg as readme_cfg;

/// A NAD labelled with the pool serving it (`None`: no labels).
pub(super) fn nad(name: &str, pool: Option<&str>) -> Nad {
    let mut labels = BTreeMap::new();
    if let Some(pool) = pool {
        let p = nn(pool);
        labels.insert(LABEL_IPPOOL_NAMESPACE.to_owned(), p.namespace);
        labels.insert(LABEL_IPPOOL_NAME.to_owned(), p.name);
    }
    Nad {
        name: nn(name),
        labels,
    }
}

pub(super) fn net48() -> Nad {
    nad("default/net-48", Some("default/net-48"))
}

pub(super) fn service() -> Option<Ipv4Net> {
    Some("10.53.0.0/16".parse().unwrap())
}

/// A minimal pool on default/net-48 with only the required fields.
pub(super) fn bare_pool(cidr: &str) -> IPPool {
    let mut pool = readme_pool();
    pool.spec.ipv4_config = crate::crd::IPv4Config {
        cidr: cidr.to_owned(),
        ..Default::default()
    };
    pool
}

pub(super) fn create(pool: &IPPool) -> Result<(), Rejection> {
    let nad = net48();
    validate_ippool_create(
        pool,
        &PoolFacts {
            nad: Some(&nad),
            pools: &[],
            service_cidr: service(),
        },
    )
}

pub(super) fn update(old: &IPPool, new: &IPPool) -> Result<(), Rejection> {
    let nad = net48();
    validate_ippool_update(
        old,
        new,
        &PoolFacts {
            nad: Some(&nad),
            pools: std::slice::from_ref(old),
            service_cidr: service(),
        },
    )
}

/// A vmnetcfg `ns/name` for VM `name` with `(network, mac, ip)` NICs.
pub(super) fn cfg(key: &str, nics: &[(&str, &str, Option<&str>)]) -> VirtualMachineNetworkConfig {
    let k = nn(key);
    let mut cfg = VirtualMachineNetworkConfig::new(
        &k.name,
        VirtualMachineNetworkConfigSpec {
            vm_name: k.name.clone(),
            paused: None,
            network_configs: nics
                .iter()
                .map(|(net, mac, ip)| NetworkConfig {
                    ipv6_address: None,
                    dhcp_options: None,
                    network_name: (*net).to_owned(),
                    mac_address: (*mac).to_owned(),
                    ip_address: ip.map(str::to_owned),
                })
                .collect(),
        },
    );
    cfg.metadata.namespace = Some(k.namespace);
    cfg
}

/// The cluster of the README: NAD and pool default/net-48, plus default/net-49 likewise.
pub(super) struct Cluster {
    pub(super) nads: Vec<Nad>,
    pub(super) pools: Vec<IPPool>,
    pub(super) configs: Vec<VirtualMachineNetworkConfig>,
}

impl Cluster {
    pub(super) fn new() -> Self {
        let mut net49 = pool_on("default/net-49", "default/net-49");
        net49.spec.ipv4_config.cidr = "192.168.49.0/24".into();
        net49.spec.ipv4_config.server_ip = "192.168.49.77".into();
        net49.spec.ipv4_config.router = Some("192.168.49.1".into());
        net49.spec.ipv4_config.pool = crate::crd::Pool {
            start: "192.168.49.81".into(),
            end: "192.168.49.90".into(),
            exclude: vec![],
        };
        Cluster {
            nads: vec![net48(), nad("default/net-49", Some("default/net-49"))],
            pools: vec![readme_pool(), net49],
            configs: vec![],
        }
    }

    pub(super) fn facts(&self) -> VmNetCfgFacts<'_> {
        VmNetCfgFacts {
            nads: &self.nads,
            pools: &self.pools,
            configs: &self.configs,
        }
    }

    pub(super) fn create(&self, cfg: &VirtualMachineNetworkConfig) -> Result<(), Rejection> {
        validate_vmnetcfg_create(cfg, &self.facts())
    }
}

/// The IPv6 side of [`dual_pool`], the README pool's twin: server fd00:48::77 and router
/// fd00:48::1 outside the range fd00:48::81-fd00:48::90 of fd00:48::/112, both ends excluded.
pub(super) fn v6_config() -> IPv6Config {
    IPv6Config {
        send_router_advertisements: None,
        boot: None,
        server_ip: "fd00:48::77".into(),
        cidr: "fd00:48::/112".into(),
        pool: IPv6Pool {
            start: "fd00:48::81".into(),
            end: "fd00:48::90".into(),
            exclude: vec!["fd00:48::81".into(), "fd00:48::90".into()],
        },
        router: Some("fd00:48::1".into()),
        dns: vec!["fd00:48::53".into()],
        lease_time: Some(300),
    }
}

/// The README pool (default/net-48), dual-stack with [`v6_config`].
pub(super) fn dual_pool() -> IPPool {
    let mut pool = readme_pool();
    pool.spec.ipv6_config = Some(v6_config());
    pool
}

/// `pool` with `status.ipv6.allocated` set to `entries`, the rest of its status kept.
pub(super) fn with_allocated_v6(mut pool: IPPool, entries: &[(&str, &str)]) -> IPPool {
    let status = pool.status.get_or_insert_with(Default::default);
    status.ipv6 = Some(IPv6Status {
        conflicts: Default::default(),
        allocated: entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        used: 0,
        available: 0,
    });
    pool
}

/// [`cfg`] with NICs `(network, mac, ip, ipv6)`.
pub(super) fn cfg6(
    key: &str,
    nics: &[(&str, &str, Option<&str>, Option<&str>)],
) -> VirtualMachineNetworkConfig {
    let v4: Vec<_> = nics.iter().map(|(n, m, ip, _)| (*n, *m, *ip)).collect();
    let mut c = cfg(key, &v4);
    for (nc, (_, _, _, ipv6)) in c.spec.network_configs.iter_mut().zip(nics) {
        nc.ipv6_address = ipv6.map(str::to_owned);
    }
    c
}

/// Asserts a refusal of `field` whose rule contains `rule`, and returns it.
#[track_caller]
pub(super) fn refused<T: std::fmt::Debug>(
    r: Result<T, Rejection>,
    field: &str,
    rule: &str,
) -> Rejection {
    let err = r.expect_err("expected a rejection");
    assert_eq!(err.field, field, "{err}");
    assert!(
        err.rule.contains(rule),
        "rule {:?} lacks {rule:?}",
        err.rule
    );
    err
}

pub(super) fn ip(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}
