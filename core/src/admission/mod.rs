//! The decisions of the admission webhook, with no I/O: which IPPool and
//! VirtualMachineNetworkConfig requests are refused and why, and which IPPool fields the mutating
//! webhook fills in on create.
//!
//! The HTTP server fetches the cluster facts ([`PoolFacts`], [`VmNetCfgFacts`]), calls these
//! functions and turns an `Err(`[`Rejection`]`)` into the denial "cannot create|update|delete
//! Kind ns/name because <Rejection>". Nothing here reads the cluster, and nothing here decides
//! what the controller allocates; it only keeps objects the controller could not serve out of etcd.
//!
//! The rules are upstream's (harvester/vm-dhcp-controller `pkg/webhook`), with its wording, plus
//! what upstream misses: range sanity, one pool per network, static address checks, MACs unique
//! per network, and the CRD's CEL immutability rules (which a 1.20 apiserver drops).
//!
//! A dual-stack pool's `ipv6Config` and a NIC's `ipv6Address` (experimental, Harvester's
//! dual-stack design; docs/dual-stack.md) obey the same rules as their IPv4 counterparts, each
//! written once for both families, plus IPv6's own: IPv4 first (no `ipv6Config` without an
//! `ipv4Config`), a CIDR of /64 to /126 fit for VMs, at most 65 535 addresses in the range, no
//! subnet-router anycast address, and no IPv6 defaults. The CRD no longer says `ipAddress` is
//! IPv4; the rules here still do, as it is the primary family's. Two principles upstream does
//! not state:
//! - Names and MACs are compared normalised ([`NamespacedName`], [`MacAddr`](crate::mac::MacAddr)),
//!   never as strings.
//! - What was admitted stays admitted: an update that leaves the spec unchanged (finalizers,
//!   labels) is never refused, and a network config unchanged by an update is not re-checked
//!   against the cluster, so a NAD deleted since cannot wedge a controller's metadata writes.
//!
//! This module owns those decisions and the types they speak in; its files divide them by kind:
//! - `mod.rs` (here): the shared types ([`Rejection`], [`Nad`], [`PoolFacts`], [`PoolDefaults`],
//!   [`VmNetCfgFacts`]) and the re-exports that make up the public API;
//! - `ippool.rs`: the IPPool rules, defaults on create ([`ippool_defaults`]) and what create,
//!   update and delete refuse;
//! - `vmnetcfg.rs`: the VirtualMachineNetworkConfig rules, what create and update refuse;
//! - `claim.rs`: the AddressClaim rules (the pool's `spec.claims`, the address asked for);
//! - `fields.rs`: what both share, the field paths and the parsers and checks of single fields
//!   (CIDRs, addresses, network references, DNS names, immutability).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use crate::crd::{IPPool, VirtualMachineNetworkConfig};
use crate::names::NamespacedName;

mod claim;
mod fields;
mod ippool;
#[cfg(test)]
mod tests_support;
mod vmnetcfg;

pub use claim::{ClaimFacts, validate_claim_create, validate_claim_update};
pub use ippool::{
    MAX_DNS, MAX_LISTED_USERS, MAX_NTP, MAX_V6_PREFIX, MIN_V6_PREFIX, ippool_defaults,
    validate_ippool_create, validate_ippool_delete, validate_ippool_update,
};
pub use vmnetcfg::{MAX_NETWORK_CONFIGS, validate_vmnetcfg_create, validate_vmnetcfg_update};

/// Why a request is refused: the field, its value and the rule broken, so the user sees exactly
/// what to change (e.g. `spec.ipv4Config.pool.start "10.0.1.5" is outside cidr 10.0.0.0/24`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {value:?} {rule}")]
pub struct Rejection {
    /// JSON path of the offending field, e.g. `spec.networkConfigs[1].ipAddress`.
    pub field: String,
    /// The offending value as written in the request (empty when the field is missing).
    pub value: String,
    /// The rule it breaks, phrased to follow the value, e.g. `is already occupied`.
    pub rule: String,
}

impl Rejection {
    /// Builds a rejection; the server may use it for refusals of its own (e.g. undecodable bodies).
    pub fn new(
        field: impl Into<String>,
        value: impl Into<String>,
        rule: impl Into<String>,
    ) -> Self {
        Rejection {
            field: field.into(),
            value: value.into(),
            rule: rule.into(),
        }
    }
}

/// A NetworkAttachmentDefinition as the webhook sees it: only its name and the labels that point
/// at the IPPool serving it (the NAD's CNI config is none of the webhook's business).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nad {
    /// The NAD's `namespace/name`.
    pub name: NamespacedName,
    /// The NAD's labels, among them [`LABEL_IPPOOL_NAMESPACE`](crate::crd::LABEL_IPPOOL_NAMESPACE)
    /// and [`LABEL_IPPOOL_NAME`](crate::crd::LABEL_IPPOOL_NAME).
    pub labels: BTreeMap<String, String>,
}

/// Cluster facts an IPPool decision needs, fetched by the server before calling in.
#[derive(Debug, Clone, Copy)]
pub struct PoolFacts<'a> {
    /// The NAD named by `spec.networkName` (`None`: it does not exist).
    pub nad: Option<&'a Nad>,
    /// Every IPPool in the cluster; the one under review may be among them (skipped by ns/name).
    pub pools: &'a [IPPool],
    /// The cluster's service CIDR (`--service-cidr`), which no pool may overlap; `None` = unknown.
    pub service_cidr: Option<Ipv4Net>,
}

/// Fields the mutating webhook fills in on create (`None` = leave as is), so a user may give just
/// a CIDR and get a working pool, as upstream's mutator does. All of them are `ipv4Config`'s: an
/// `ipv6Config` gets no defaults.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PoolDefaults {
    /// `spec.ipv4Config.pool.start`, when missing: the first host address of the CIDR.
    pub start: Option<Ipv4Addr>,
    /// `spec.ipv4Config.pool.end`, when missing: the last host address of the CIDR.
    pub end: Option<Ipv4Addr>,
    /// `spec.ipv4Config.serverIP`, when missing: the first host address that is neither the
    /// router nor excluded.
    pub server_ip: Option<Ipv4Addr>,
}

/// Cluster facts a VirtualMachineNetworkConfig decision needs, fetched by the server.
#[derive(Debug, Clone, Copy)]
pub struct VmNetCfgFacts<'a> {
    /// The NADs named by the configs' networks (missing ones are simply absent).
    pub nads: &'a [Nad],
    /// Every IPPool in the cluster.
    pub pools: &'a [IPPool],
    /// Every VirtualMachineNetworkConfig in the cluster; the one under review may be among them
    /// (skipped by ns/name).
    pub configs: &'a [VirtualMachineNetworkConfig],
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::fields::F_START;
    use super::tests_support::*;
    use super::*;
    use proptest::prelude::*;

    // === Rejection ===

    #[test]
    fn rejection_reads_field_value_rule() {
        let r = Rejection::new(F_START, "10.0.1.5", "is outside cidr 10.0.0.0/24");
        assert_eq!(
            r.to_string(),
            r#"spec.ipv4Config.pool.start "10.0.1.5" is outside cidr 10.0.0.0/24"#
        );
    }

    // === upstream examples ===

    #[test]
    fn upstream_examples_are_admitted() {
        let pool = readme_pool();
        assert_eq!(ippool_defaults(&pool.spec), Ok(PoolDefaults::default()));
        create(&pool).unwrap();
        update(&pool, &pool).unwrap();
        validate_ippool_delete(&pool, &[]).unwrap();
        let cluster = Cluster::new();
        let cfg = readme_cfg();
        cluster.create(&cfg).unwrap();
        validate_vmnetcfg_update(&cfg, &cfg, &cluster.facts()).unwrap();
    }

    // === robustness ===

    fn addr() -> impl Strategy<Value = String> {
        prop_oneof![
            (0u8..3, any::<u8>()).prop_map(|(c, d)| format!("10.0.{c}.{d}")),
            any::<u32>().prop_map(|n| Ipv4Addr::from(n).to_string()),
            ".{0,10}",
        ]
    }

    fn cidr() -> impl Strategy<Value = String> {
        prop_oneof![
            (0u8..3, 0u8..=33).prop_map(|(c, p)| format!("10.0.{c}.0/{p}")),
            (any::<u32>(), 0u8..=32).prop_map(|(n, p)| format!("{}/{p}", Ipv4Addr::from(n))),
            ".{0,10}",
        ]
    }

    fn network() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("default/net-48".to_owned()),
            Just("net-48".to_owned()),
            Just("default/net-49".to_owned()),
            ".{0,10}",
        ]
    }

    fn mac() -> impl Strategy<Value = String> {
        prop_oneof![
            (0u8..4).prop_map(|b| format!("02:00:00:00:00:{b:02X}")),
            ".{0,17}",
        ]
    }

    fn holder() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("RESERVED".to_owned()),
            Just("EXCLUDED".to_owned()),
            mac()
        ]
    }

    prop_compose! {
        fn arb_pool()(
            (name, network, cidr, server, start, end) in
                (prop_oneof![Just("net-48"), Just("other")], network(), cidr(), addr(), addr(), addr()),
            (router, exclude, dns, ntp) in (
                proptest::option::of(addr()),
                proptest::collection::vec(addr(), 0..4),
                proptest::collection::vec(addr(), 0..5),
                proptest::collection::vec(prop_oneof![addr(), "[a-z.-]{0,12}"], 0..6),
            ),
            (domain, search, lease, allocated) in (
                proptest::option::of("[a-zA-Z0-9._-]{0,20}"),
                proptest::collection::vec("[a-z0-9.-]{0,12}", 0..3),
                proptest::option::of(any::<i64>()),
                proptest::collection::vec((addr(), holder()), 0..6),
            ),
        ) -> IPPool {
            let mut pool = readme_pool();
            pool.metadata.name = Some(name.to_owned());
            pool.spec.network_name = network;
            let v4 = &mut pool.spec.ipv4_config;
            v4.cidr = cidr;
            v4.server_ip = server;
            v4.pool.start = start;
            v4.pool.end = end;
            v4.pool.exclude = exclude;
            v4.router = router;
            v4.dns = dns;
            v4.ntp = ntp;
            v4.domain_name = domain;
            v4.domain_search = search;
            v4.lease_time = lease;
            let entries: Vec<(&str, &str)> =
                allocated.iter().map(|(a, h)| (a.as_str(), h.as_str())).collect();
            with_allocated(pool, &entries)
        }
    }

    prop_compose! {
        fn arb_cfg()(
            name in prop_oneof![Just("vm"), Just("other")],
            vm in prop_oneof![Just("vm".to_owned()), ".{0,4}"],
            nics in proptest::collection::vec((network(), mac(), proptest::option::of(addr())), 0..6),
        ) -> VirtualMachineNetworkConfig {
            let nics: Vec<(&str, &str, Option<&str>)> = nics
                .iter()
                .map(|(n, m, i)| (n.as_str(), m.as_str(), i.as_deref()))
                .collect();
            let mut c = cfg(&format!("default/{name}"), &nics);
            c.spec.vm_name = vm;
            c
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn random_objects_never_panic(
            old in arb_pool(),
            new in arb_pool(),
            others in proptest::collection::vec(arb_pool(), 0..3),
            old_cfg in arb_cfg(),
            new_cfg in arb_cfg(),
            cfgs in proptest::collection::vec(arb_cfg(), 0..3),
            svc in proptest::option::of((any::<u32>(), 0u8..=32)),
            labelled in any::<bool>(),
        ) {
            let service_cidr = svc.and_then(|(n, p)| Ipv4Net::new(Ipv4Addr::from(n), p).ok());
            let nads = [
                if labelled { net48() } else { nad("default/net-48", None) },
                nad("default/net-49", Some("default/other")),
            ];
            let mut pools = others.clone();
            pools.push(old.clone());
            let pool_facts = PoolFacts { nad: nads.first(), pools: &pools, service_cidr };
            let _ = ippool_defaults(&new.spec);
            let _ = validate_ippool_create(&new, &pool_facts);
            let _ = validate_ippool_update(&old, &new, &pool_facts);
            let _ = validate_ippool_delete(&new, &cfgs);

            let mut configs = cfgs.clone();
            configs.push(old_cfg.clone());
            let facts = VmNetCfgFacts { nads: &nads, pools: &pools, configs: &configs };
            let _ = validate_vmnetcfg_create(&new_cfg, &facts);
            let _ = validate_vmnetcfg_update(&old_cfg, &new_cfg, &facts);
        }
    }

    // === robustness, dual-stack ===

    fn addr6() -> impl Strategy<Value = String> {
        prop_oneof![
            (any::<u16>()).prop_map(|n| format!("fd00:48::{n:x}")),
            any::<u128>().prop_map(|n| std::net::Ipv6Addr::from(n).to_string()),
            addr(),
            ".{0,10}",
        ]
    }

    fn cidr6() -> impl Strategy<Value = String> {
        prop_oneof![
            (0u8..=129).prop_map(|p| format!("fd00:48::/{p}")),
            (any::<u128>(), 0u8..=128)
                .prop_map(|(n, p)| format!("{}/{p}", std::net::Ipv6Addr::from(n))),
            cidr(),
        ]
    }

    prop_compose! {
        fn arb_v6()(
            (cidr, server, start, end) in (cidr6(), addr6(), addr6(), addr6()),
            (router, exclude, dns, lease) in (
                proptest::option::of(addr6()),
                proptest::collection::vec(addr6(), 0..4),
                proptest::collection::vec(addr6(), 0..5),
                proptest::option::of(any::<i64>()),
            ),
        ) -> crate::crd::IPv6Config {
            crate::crd::IPv6Config {
                send_router_advertisements: None,
                boot: None,
                server_ip: server,
                cidr,
                pool: crate::crd::IPv6Pool { start, end, exclude },
                router,
                dns,
                lease_time: lease,
            }
        }
    }

    prop_compose! {
        fn arb_dual_pool()(
            pool in arb_pool(),
            v6 in proptest::option::of(arb_v6()),
            v4_missing in any::<bool>(),
            allocated in proptest::collection::vec((addr6(), holder()), 0..6),
        ) -> IPPool {
            let mut pool = pool;
            pool.spec.ipv6_config = v6;
            if v4_missing {
                pool.spec.ipv4_config = Default::default();
            }
            let entries: Vec<(&str, &str)> =
                allocated.iter().map(|(a, h)| (a.as_str(), h.as_str())).collect();
            with_allocated_v6(pool, &entries)
        }
    }

    prop_compose! {
        fn arb_dual_cfg()(
            cfg in arb_cfg(),
            v6 in proptest::collection::vec(proptest::option::of(addr6()), 6),
        ) -> VirtualMachineNetworkConfig {
            let mut cfg = cfg;
            for (nc, a) in cfg.spec.network_configs.iter_mut().zip(v6) {
                nc.ipv6_address = a;
            }
            cfg
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn random_dual_stack_objects_never_panic(
            old in arb_dual_pool(),
            new in arb_dual_pool(),
            others in proptest::collection::vec(arb_dual_pool(), 0..3),
            old_cfg in arb_dual_cfg(),
            new_cfg in arb_dual_cfg(),
            cfgs in proptest::collection::vec(arb_dual_cfg(), 0..3),
        ) {
            let nads = [net48(), nad("default/net-49", Some("default/other"))];
            let mut pools = others.clone();
            pools.push(old.clone());
            let pool_facts = PoolFacts { nad: nads.first(), pools: &pools, service_cidr: service() };
            let _ = ippool_defaults(&new.spec);
            let _ = validate_ippool_create(&new, &pool_facts);
            let _ = validate_ippool_update(&old, &new, &pool_facts);
            let _ = validate_ippool_update(&new, &old, &pool_facts);
            let _ = validate_ippool_delete(&new, &cfgs);

            let mut configs = cfgs.clone();
            configs.push(old_cfg.clone());
            let facts = VmNetCfgFacts { nads: &nads, pools: &pools, configs: &configs };
            let _ = validate_vmnetcfg_create(&new_cfg, &facts);
            let _ = validate_vmnetcfg_update(&old_cfg, &new_cfg, &facts);
        }
    }

    /// What is admitted of a dual-stack pool's IPv6 side is what the controller can serve:
    /// every admitted `ipv6Config` parses, within the limits, and its IPv4 side is admitted on
    /// its own. Addresses are drawn near one another, so that many are admitted.
    #[test]
    fn admitted_ipv6_configs_are_servable_and_within_the_limits() {
        use crate::pool::v6::MAX_V6_RANGE;
        use proptest::strategy::ValueTree;
        let near =
            || (0u32..0x3_0000).prop_map(|n| format!("fd00:48::{:x}:{:x}", n >> 16, n & 0xffff));
        let strategy = (
            (60u8..=128).prop_map(|p| format!("fd00:48::/{p}")),
            (near(), near(), near(), proptest::option::of(near())),
            proptest::collection::vec(near(), 0..3),
        );
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let mut admitted = 0;
        for _ in 0..4096 {
            let (cidr, (server_ip, start, end, router), exclude) =
                strategy.new_tree(&mut runner).unwrap().current();
            let mut pool = readme_pool();
            pool.spec.ipv6_config = Some(crate::crd::IPv6Config {
                server_ip,
                cidr,
                pool: crate::crd::IPv6Pool {
                    start,
                    end,
                    exclude,
                },
                router,
                ..Default::default()
            });
            if create(&pool).is_ok() {
                admitted += 1;
                let valid = crate::pool::ValidPool::parse(&pool).unwrap();
                let range = valid.ipv6().unwrap().range();
                assert!(range.size() <= MAX_V6_RANGE);
                let prefix = range.subnet().prefix_len();
                assert!((MIN_V6_PREFIX..=MAX_V6_PREFIX).contains(&prefix));
                assert_ne!(range.router(), Some(range.server_ip()));
                assert!(
                    range
                        .exclude()
                        .iter()
                        .all(|e| (range.start()..=range.end()).contains(e))
                );
                pool.spec.ipv6_config = None;
                create(&pool).unwrap();
            }
        }
        assert!(admitted > 100, "only {admitted} admitted");
    }
}
