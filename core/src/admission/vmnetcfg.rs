//! VirtualMachineNetworkConfig admission: what create and update refuse
//! ([`validate_vmnetcfg_create`], [`validate_vmnetcfg_update`]): each NIC's own fields first
//! ([`check_vmnetcfg`]), then, for NICs new or changed, the NAD, pool and other objects on its
//! network ([`check_config_in_cluster`]).
//!
//! A NIC's static `ipAddress` is IPv4, the primary family's, and its `ipv6Address`
//! (experimental) IPv6, allowed only on a dual-stack pool; both obey the same rules in their
//! family's range and books ([`check_static_ip`]).

use std::net::{Ipv4Addr, Ipv6Addr};

use super::fields::{
    AdmittedFamily, F_CONFIGS, F_VM_NAME, check_address, immutable, key_of, optional, parse_ip,
    parse_network, same_network,
};
use super::{Rejection, VmNetCfgFacts};
use crate::crd::{
    IPPool, LABEL_IPPOOL_NAME, LABEL_IPPOOL_NAMESPACE, NetworkConfig, VirtualMachineNetworkConfig,
};
use crate::mac::MacAddr;
use crate::names::NamespacedName;
use crate::pool::NicOptions;

/// Most network configs one VirtualMachineNetworkConfig may hold (upstream's CRD `maxItems`).
pub const MAX_NETWORK_CONFIGS: usize = 4;

/// Admits a new VirtualMachineNetworkConfig only if every NIC can get an address: well-formed
/// and unique networks, MACs and static addresses (`ipAddress` IPv4, `ipv6Address` IPv6); each
/// network's NAD labelled with the pool that serves it; a static address free in that pool (an
/// IPv6 one only if the pool has an `ipv6Config`); no MAC already used on the network.
pub fn validate_vmnetcfg_create(
    cfg: &VirtualMachineNetworkConfig,
    facts: &VmNetCfgFacts,
) -> Result<(), Rejection> {
    check_vmnetcfg(cfg, None, facts)
}

/// Admits a change to a VirtualMachineNetworkConfig: `spec.vmName` is immutable, and the
/// network configs obey the create rules. Configs identical to one the object already had are
/// not re-checked against the cluster (they were admitted then), an address held by one of the
/// object's previous MACs on the same network counts as its own (the controller is releasing
/// it), and an update leaving the spec as it is is always admitted.
pub fn validate_vmnetcfg_update(
    old: &VirtualMachineNetworkConfig,
    new: &VirtualMachineNetworkConfig,
    facts: &VmNetCfgFacts,
) -> Result<(), Rejection> {
    if old.spec == new.spec {
        return Ok(());
    }
    if old.spec.vm_name != new.spec.vm_name {
        return Err(immutable(F_VM_NAME, &new.spec.vm_name, &old.spec.vm_name));
    }
    check_vmnetcfg(new, Some(old), facts)
}

/// One network config whose own fields are valid.
struct ParsedConfig<'a> {
    index: usize,
    raw: &'a NetworkConfig,
    network: NamespacedName,
    mac: MacAddr,
    ip: Option<Ipv4Addr>,
    ipv6: Option<Ipv6Addr>,
}

fn check_vmnetcfg(
    cfg: &VirtualMachineNetworkConfig,
    old: Option<&VirtualMachineNetworkConfig>,
    facts: &VmNetCfgFacts,
) -> Result<(), Rejection> {
    let spec = &cfg.spec;
    if spec.vm_name.trim().is_empty() {
        return Err(Rejection::new(F_VM_NAME, &spec.vm_name, "is required"));
    }
    if spec.network_configs.len() > MAX_NETWORK_CONFIGS {
        let names: Vec<&str> = spec
            .network_configs
            .iter()
            .map(|nc| nc.network_name.as_str())
            .collect();
        return Err(Rejection::new(
            F_CONFIGS,
            names.join(","),
            format!(
                "has {} entries, at most {MAX_NETWORK_CONFIGS} are allowed",
                names.len()
            ),
        ));
    }

    let mut parsed: Vec<ParsedConfig> = Vec::with_capacity(spec.network_configs.len());
    for (index, raw) in spec.network_configs.iter().enumerate() {
        let field = |name: &str| format!("{F_CONFIGS}[{index}].{name}");
        let network = parse_network(&field("networkName"), &raw.network_name)?;
        let mac: MacAddr = raw.mac_address.parse().map_err(|_| {
            Rejection::new(
                field("macAddress"),
                &raw.mac_address,
                "is not a MAC address (six pairs of hex digits separated by ':' or '-')",
            )
        })?;
        let ip = match optional(raw.ip_address.as_deref()) {
            None => None,
            Some(s) => Some(parse_ip::<Ipv4Addr>(&field("ipAddress"), s)?),
        };
        let ipv6 = match optional(raw.ipv6_address.as_deref()) {
            None => None,
            Some(s) => Some(parse_ip::<Ipv6Addr>(&field("ipv6Address"), s)?),
        };
        if let Some(options) = &raw.dhcp_options {
            // KubeVirt's rules for `interfaces[].dhcpOptions`, with its messages, and our bounds.
            NicOptions::parse(options).map_err(|e| {
                Rejection::new(e.path(&field("dhcpOptions")), e.value(), e.to_string())
            })?;
        }
        for earlier in &parsed {
            let dup = |name: &str, value: &str| {
                Rejection::new(
                    field(name),
                    value,
                    format!("duplicates {F_CONFIGS}[{}].{name}", earlier.index),
                )
            };
            if earlier.network == network {
                return Err(dup("networkName", &raw.network_name));
            }
            if earlier.mac == mac {
                return Err(dup("macAddress", &raw.mac_address));
            }
            if ip.is_some() && earlier.ip == ip {
                return Err(dup(
                    "ipAddress",
                    raw.ip_address.as_deref().unwrap_or_default(),
                ));
            }
            if ipv6.is_some() && earlier.ipv6 == ipv6 {
                return Err(dup(
                    "ipv6Address",
                    raw.ipv6_address.as_deref().unwrap_or_default(),
                ));
            }
        }
        parsed.push(ParsedConfig {
            index,
            raw,
            network,
            mac,
            ip,
            ipv6,
        });
    }

    let me = key_of(&cfg.metadata);
    for pc in &parsed {
        if old.is_some_and(|o| o.spec.network_configs.contains(pc.raw)) {
            continue;
        }
        check_config_in_cluster(pc, &me, old, facts)?;
    }
    Ok(())
}

/// The rules of one (new or changed) network config that depend on other objects: its network's
/// NAD and pool, its MAC unused by other objects on that network, and its static addresses (if
/// any) free in that pool.
fn check_config_in_cluster(
    pc: &ParsedConfig,
    me: &NamespacedName,
    old: Option<&VirtualMachineNetworkConfig>,
    facts: &VmNetCfgFacts,
) -> Result<(), Rejection> {
    let i = pc.index;
    let network = &pc.network;
    let (pool, pool_ref) = serving_pool(pc, facts)?;

    // The NICs of other objects on the same network.
    let others = nics_on_network(facts, me, network);
    for (other, nc) in &others {
        if nc.mac_address.parse::<MacAddr>() == Ok(pc.mac) {
            return Err(Rejection::new(
                format!("{F_CONFIGS}[{i}].macAddress"),
                &pc.raw.mac_address,
                format!(
                    "is already used on network {network} by VirtualMachineNetworkConfig {}",
                    key_of(&other.metadata)
                ),
            ));
        }
    }

    check_static_ip(pc, pc.ip, me, old, pool, &pool_ref, &others)?;
    check_static_ip(pc, pc.ipv6, me, old, pool, &pool_ref, &others)
}

/// The IPPool serving `pc`'s network, as named by the labels of the network's NAD, and its
/// `namespace/name`.
fn serving_pool<'f>(
    pc: &ParsedConfig,
    facts: &VmNetCfgFacts<'f>,
) -> Result<(&'f IPPool, NamespacedName), Rejection> {
    let i = pc.index;
    let net_field = format!("{F_CONFIGS}[{i}].networkName");
    let net_raw = &pc.raw.network_name;
    let network = &pc.network;

    let nad = facts
        .nads
        .iter()
        .find(|n| n.name == *network)
        .ok_or_else(|| {
            Rejection::new(
                &net_field,
                net_raw,
                format!("NetworkAttachmentDefinition {network} not found"),
            )
        })?;
    let label = |key: &str| {
        nad.labels
            .get(key)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| {
                Rejection::new(
                    &net_field,
                    net_raw,
                    format!("label {key} not found on NetworkAttachmentDefinition {network}"),
                )
            })
    };
    let pool_ns = label(LABEL_IPPOOL_NAMESPACE)?;
    let pool_name = label(LABEL_IPPOOL_NAME)?;
    let pool_ref = NamespacedName {
        namespace: pool_ns.clone(),
        name: pool_name.clone(),
    };
    let pool = facts
        .pools
        .iter()
        .find(|p| key_of(&p.metadata) == pool_ref)
        .ok_or_else(|| {
            Rejection::new(
                &net_field,
                net_raw,
                format!(
                    "IPPool {pool_ref} (named by the labels of NetworkAttachmentDefinition {network}) not found"
                ),
            )
        })?;
    if !same_network(&pool.spec.network_name, &pool_ref.namespace, network) {
        return Err(Rejection::new(
            &net_field,
            net_raw,
            format!(
                "is not served by IPPool {pool_ref} (named by the labels of NetworkAttachmentDefinition {network}), which serves {:?}",
                pool.spec.network_name
            ),
        ));
    }
    Ok((pool, pool_ref))
}

/// The NICs on `network` of every object but `me`, with the object holding each.
fn nics_on_network<'f>(
    facts: &VmNetCfgFacts<'f>,
    me: &NamespacedName,
    network: &NamespacedName,
) -> Vec<(&'f VirtualMachineNetworkConfig, &'f NetworkConfig)> {
    facts
        .configs
        .iter()
        .filter(|c| key_of(&c.metadata) != *me)
        .flat_map(|c| {
            let ns = c.metadata.namespace.as_deref().unwrap_or_default();
            c.spec
                .network_configs
                .iter()
                .filter(move |nc| same_network(&nc.network_name, ns, network))
                .map(move |nc| (c, nc))
        })
        .collect()
}

/// `ip`, `pc`'s static address of family `A` (`ipAddress`, `ipv6Address`), if any: allowed
/// only if the pool has that family, a host address within its range that is neither its
/// server, router nor excluded, not held in its books by another MAC than the object's own (new
/// or previous) on the network, nor marked, and not requested by another object (`others`).
fn check_static_ip<A: AdmittedFamily>(
    pc: &ParsedConfig,
    ip: Option<A>,
    me: &NamespacedName,
    old: Option<&VirtualMachineNetworkConfig>,
    pool: &IPPool,
    pool_ref: &NamespacedName,
    others: &[(&VirtualMachineNetworkConfig, &NetworkConfig)],
) -> Result<(), Rejection> {
    let i = pc.index;
    let network = &pc.network;
    let Some(ip) = ip else {
        return Ok(());
    };
    let ip_field = format!("{F_CONFIGS}[{i}].{}", A::NIC_FIELD);
    let ip_raw = A::requested(pc.raw).unwrap_or_default();
    let refuse = |rule: String| Rejection::new(&ip_field, ip_raw, rule);
    let previous_macs: Vec<MacAddr> = old
        .map(|o| o.spec.network_configs.as_slice())
        .unwrap_or_default()
        .iter()
        .filter(|nc| same_network(&nc.network_name, &me.namespace, network))
        .filter_map(|nc| nc.mac_address.parse::<MacAddr>().ok())
        .collect();
    let own = |holder: &MacAddr| *holder == pc.mac || previous_macs.contains(holder);
    check_address::<A>(ip, pool, pool_ref, &own, &refuse)?;

    for (other, nc) in others {
        let requested = A::requested(nc).and_then(|s| s.parse::<A>().ok());
        if requested == Some(ip) {
            return Err(refuse(format!(
                "is already requested on network {network} by VirtualMachineNetworkConfig {}",
                key_of(&other.metadata)
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::admission::tests_support::*;

    // === vmnetcfg create ===

    #[test]
    fn vm_name_is_required() {
        let cluster = Cluster::new();
        let mut c = readme_cfg();
        c.spec.vm_name = String::new();
        refused(cluster.create(&c), F_VM_NAME, "is required");
        cluster.create(&readme_cfg()).unwrap();
    }

    #[test]
    fn at_most_four_network_configs() {
        let mut cluster = Cluster::new();
        let mut nics = Vec::new();
        for i in 0..5u8 {
            let key = format!("default/net-{}", 50 + i);
            let mut p = pool_on(&key, &key);
            p.spec.ipv4_config.cidr = format!("192.168.{}.0/24", 50 + i);
            p.spec.ipv4_config.server_ip = format!("192.168.{}.77", 50 + i);
            p.spec.ipv4_config.router = None;
            cluster.pools.push(p);
            cluster.nads.push(nad(&key, Some(&key)));
            nics.push((key, format!("02:00:00:00:00:0{i}")));
        }
        let nics: Vec<(&str, &str, Option<&str>)> = nics
            .iter()
            .map(|(n, m)| (n.as_str(), m.as_str(), None))
            .collect();
        refused(
            cluster.create(&cfg("default/vm", &nics)),
            F_CONFIGS,
            "has 5 entries, at most 4 are allowed",
        );
        cluster.create(&cfg("default/vm", &nics[..4])).unwrap();
    }

    #[test]
    fn network_names_must_be_full_references() {
        let cluster = Cluster::new();
        let r = refused(
            cluster.create(&cfg(
                "default/vm",
                &[("default/net-48", MAC_A, None), ("net-49", MAC_B, None)],
            )),
            "spec.networkConfigs[1].networkName",
            "namespace/name",
        );
        assert_eq!(r.value, "net-49");
        cluster
            .create(&cfg(
                "default/vm",
                &[
                    ("default/net-48", MAC_A, None),
                    ("default/net-49", MAC_B, None),
                ],
            ))
            .unwrap();
    }

    #[test]
    fn kubevirt_s_dhcp_options_follow_its_rules() {
        let cluster = Cluster::new();
        let with = |options: crate::crd::DhcpOptions| {
            let mut c = cfg("default/vm", &[("default/net-48", MAC_A, None)]);
            c.spec.network_configs[0].dhcp_options = Some(options);
            c
        };
        let private = |option: i64, value: &str| crate::crd::DhcpPrivateOption {
            option,
            value: value.into(),
        };
        cluster
            .create(&with(crate::crd::DhcpOptions {
                boot_file_name: Some("pxelinux.0".into()),
                ntp_servers: vec!["192.168.48.123".into()],
                private_options: vec![private(240, "x")],
                ..Default::default()
            }))
            .unwrap();
        let r = refused(
            cluster.create(&with(crate::crd::DhcpOptions {
                private_options: vec![private(223, "x")],
                ..Default::default()
            })),
            "spec.networkConfigs[0].dhcpOptions.privateOptions[0].option",
            "provided DHCPPrivateOptions are out of range, must be in range 224 to 254",
        );
        assert_eq!(r.value, "223");
        refused(
            cluster.create(&with(crate::crd::DhcpOptions {
                private_options: vec![private(240, "a"), private(240, "b")],
                ..Default::default()
            })),
            "spec.networkConfigs[0].dhcpOptions.privateOptions[1].option",
            "Found Duplicates: you have provided duplicate DHCPPrivateOptions",
        );
        refused(
            cluster.create(&with(crate::crd::DhcpOptions {
                ntp_servers: vec!["ntp.example".into()],
                ..Default::default()
            })),
            "spec.networkConfigs[0].dhcpOptions.ntpServers[0]",
            "NTP servers must be a list of valid IPv4 addresses.",
        );
        refused(
            cluster.create(&with(crate::crd::DhcpOptions {
                boot_file_name: Some("x".repeat(256)),
                ..Default::default()
            })),
            "spec.networkConfigs[0].dhcpOptions.bootFileName",
            "is longer than 255 bytes",
        );
    }

    #[test]
    fn macs_must_parse() {
        let cluster = Cluster::new();
        refused(
            cluster.create(&cfg(
                "default/vm",
                &[("default/net-48", "fa:cf:8e:50:82", None)],
            )),
            "spec.networkConfigs[0].macAddress",
            "is not a MAC address",
        );
        cluster
            .create(&cfg(
                "default/vm",
                &[("default/net-48", "FA-CF-8E-50-82-FC", None)],
            ))
            .unwrap();
    }

    #[test]
    fn macs_networks_and_addresses_are_unique_within_the_object() {
        let cluster = Cluster::new();
        refused(
            cluster.create(&cfg(
                "default/vm",
                &[
                    ("default/net-48", MAC_A, None),
                    ("default/net-49", "FA-CF-8E-50-82-FC", None),
                ],
            )),
            "spec.networkConfigs[1].macAddress",
            "duplicates spec.networkConfigs[0].macAddress",
        );
        refused(
            cluster.create(&cfg(
                "default/vm",
                &[
                    ("default/net-48", MAC_A, None),
                    ("default/net-48", MAC_B, None),
                ],
            )),
            "spec.networkConfigs[1].networkName",
            "duplicates spec.networkConfigs[0].networkName",
        );
        refused(
            cluster.create(&cfg(
                "default/vm",
                &[
                    ("default/net-48", MAC_A, Some("192.168.48.85")),
                    ("default/net-49", MAC_B, Some("192.168.48.85")),
                ],
            )),
            "spec.networkConfigs[1].ipAddress",
            "duplicates spec.networkConfigs[0].ipAddress",
        );
        cluster
            .create(&cfg(
                "default/vm",
                &[
                    ("default/net-48", MAC_A, Some("192.168.48.85")),
                    ("default/net-49", MAC_B, Some("192.168.49.85")),
                ],
            ))
            .unwrap();
    }

    #[test]
    fn nad_must_exist_with_both_labels_and_its_pool() {
        let mut cluster = Cluster::new();
        let on = |net: &str| cfg("default/vm", &[(net, MAC_A, None)]);
        refused(
            cluster.create(&on("default/net-50")),
            "spec.networkConfigs[0].networkName",
            "NetworkAttachmentDefinition default/net-50 not found",
        );
        cluster.nads.push(nad("default/net-50", None));
        refused(
            cluster.create(&on("default/net-50")),
            "spec.networkConfigs[0].networkName",
            "label network.harvesterhci.io/ippool-namespace not found",
        );
        let mut half = nad("default/net-51", Some("default/net-51"));
        half.labels.remove(LABEL_IPPOOL_NAME);
        cluster.nads.push(half);
        refused(
            cluster.create(&on("default/net-51")),
            "spec.networkConfigs[0].networkName",
            "label network.harvesterhci.io/ippool-name not found",
        );
        cluster
            .nads
            .push(nad("default/net-52", Some("infra/pool-52")));
        refused(
            cluster.create(&on("default/net-52")),
            "spec.networkConfigs[0].networkName",
            "IPPool infra/pool-52 (named by the labels of NetworkAttachmentDefinition default/net-52) not found",
        );
        let mut p = pool_on("infra/pool-52", "default/net-52");
        p.spec.ipv4_config.cidr = "192.168.52.0/24".into();
        cluster.pools.push(p);
        cluster.create(&on("default/net-52")).unwrap();
        // Stale labels naming a pool of another network.
        cluster
            .nads
            .push(nad("default/net-53", Some("default/net-49")));
        refused(
            cluster.create(&on("default/net-53")),
            "spec.networkConfigs[0].networkName",
            "is not served by IPPool default/net-49",
        );
    }

    #[test]
    fn static_address_must_fit_the_pool() {
        let mut cluster = Cluster::new();
        // Server and router inside the range, so those rules are reachable.
        let p = &mut cluster.pools[0];
        p.spec.ipv4_config.server_ip = "192.168.48.84".into();
        p.spec.ipv4_config.router = Some("192.168.48.83".into());
        let with_ip = |addr: &str| cfg("default/vm", &[("default/net-48", MAC_A, Some(addr))]);
        let field = "spec.networkConfigs[0].ipAddress";
        for (addr, rule) in [
            ("192.168.48.300", "is not an IPv4 address"),
            (
                "192.168.49.85",
                "is outside cidr 192.168.48.0/24 of IPPool default/net-48",
            ),
            (
                "192.168.48.255",
                "is the broadcast address of 192.168.48.0/24",
            ),
            ("192.168.48.0", "is the network address of 192.168.48.0/24"),
            (
                "192.168.48.91",
                "is outside pool range 192.168.48.81-192.168.48.90",
            ),
            ("192.168.48.84", "is the server ip of IPPool default/net-48"),
            ("192.168.48.83", "is the router of IPPool default/net-48"),
            ("192.168.48.90", "is excluded by IPPool default/net-48"),
        ] {
            let r = refused(cluster.create(&with_ip(addr)), field, rule);
            assert_eq!(r.value, addr);
        }
        cluster.create(&with_ip("192.168.48.85")).unwrap();
        // An empty ipAddress is no static address.
        cluster.create(&with_ip("")).unwrap();
    }

    #[test]
    fn static_address_must_not_be_occupied() {
        let mut cluster = Cluster::new();
        cluster.pools[0] = with_allocated(
            readme_pool(),
            &[
                ("192.168.48.85", MAC_B),
                ("192.168.48.86", "FA-CF-8E-50-82-FC"),
                ("192.168.48.87", "RESERVED"),
                ("192.168.48.88", "EXCLUDED"),
                ("192.168.48.89", "garbage"),
            ],
        );
        let with_ip = |addr: &str| cfg("default/vm", &[("default/net-48", MAC_A, Some(addr))]);
        let field = "spec.networkConfigs[0].ipAddress";
        refused(
            cluster.create(&with_ip("192.168.48.85")),
            field,
            &format!("is already occupied by MAC {MAC_B}"),
        );
        refused(
            cluster.create(&with_ip("192.168.48.87")),
            field,
            "is already occupied (RESERVED)",
        );
        refused(
            cluster.create(&with_ip("192.168.48.88")),
            field,
            "is already occupied (EXCLUDED)",
        );
        // Held by this very NIC (spelled differently): its own lease.
        cluster.create(&with_ip("192.168.48.86")).unwrap();
        // A malformed entry holds nothing.
        cluster.create(&with_ip("192.168.48.89")).unwrap();
    }

    #[test]
    fn static_address_must_not_be_requested_by_another_object() {
        let mut cluster = Cluster::new();
        cluster.configs.push(cfg(
            "default/other",
            &[("net-48", MAC_B, Some("192.168.48.85"))],
        ));
        cluster.configs.push(cfg(
            "default/third",
            &[("default/net-49", "02:00:00:00:00:01", Some("192.168.48.86"))],
        ));
        refused(
            cluster.create(&cfg(
                "default/vm",
                &[("default/net-48", MAC_A, Some("192.168.48.85"))],
            )),
            "spec.networkConfigs[0].ipAddress",
            "is already requested on network default/net-48 by VirtualMachineNetworkConfig default/other",
        );
        // The same address requested on another network is someone else's business.
        cluster
            .create(&cfg(
                "default/vm",
                &[("default/net-48", MAC_A, Some("192.168.48.86"))],
            ))
            .unwrap();
    }

    #[test]
    fn a_mac_is_used_once_per_network() {
        let mut cluster = Cluster::new();
        cluster.configs.push(cfg(
            "default/other",
            &[("net-48", "FA:CF:8E:50:82:FC", None)],
        ));
        let r = refused(
            cluster.create(&readme_cfg()),
            "spec.networkConfigs[0].macAddress",
            "is already used on network default/net-48 by VirtualMachineNetworkConfig default/other",
        );
        assert_eq!(r.value, MAC_A);
        // The same MAC on another network, or in the object under review itself: fine.
        cluster.configs = vec![
            cfg("default/other", &[("default/net-49", MAC_A, None)]),
            readme_cfg(),
        ];
        cluster.create(&readme_cfg()).unwrap();
    }

    // === dual-stack: ipAddress stays IPv4, ipv6Address (rule 9) ===

    /// The README cluster with default/net-48 dual-stack ([`dual_pool`]).
    fn dual_cluster() -> Cluster {
        let mut cluster = Cluster::new();
        cluster.pools[0] = dual_pool();
        cluster
    }

    /// A config default/vm with one NIC on default/net-48 (MAC A) requesting `ipv6`.
    fn with_ipv6(ipv6: &str) -> VirtualMachineNetworkConfig {
        cfg6("default/vm", &[("default/net-48", MAC_A, None, Some(ipv6))])
    }

    const IPV6_FIELD: &str = "spec.networkConfigs[0].ipv6Address";

    #[test]
    fn ip_address_must_be_ipv4() {
        // The CRD's `format: ipv4` is gone (Harvester's design); the rule stays.
        let cluster = dual_cluster();
        for addr in ["fd00:48::85", "::ffff:192.168.48.85"] {
            let r = refused(
                cluster.create(&cfg("default/vm", &[("default/net-48", MAC_A, Some(addr))])),
                "spec.networkConfigs[0].ipAddress",
                "is not an IPv4 address",
            );
            assert_eq!(r.value, addr);
        }
    }

    #[test]
    fn ipv6_address_must_be_ipv6() {
        let cluster = dual_cluster();
        for addr in ["192.168.48.85", "fd00:48::zz", "fd00:48::85/112"] {
            let r = refused(
                cluster.create(&with_ipv6(addr)),
                IPV6_FIELD,
                "is not an IPv6 address",
            );
            assert_eq!(r.value, addr);
        }
        cluster.create(&with_ipv6("fd00:48::85")).unwrap();
        // An empty ipv6Address is no static address.
        cluster.create(&with_ipv6("")).unwrap();
        Cluster::new().create(&with_ipv6("")).unwrap();
    }

    #[test]
    fn ipv6_address_needs_a_dual_stack_pool() {
        let r = refused(
            Cluster::new().create(&with_ipv6("fd00:48::85")),
            IPV6_FIELD,
            "is not allowed: IPPool default/net-48 has no spec.ipv6Config",
        );
        assert_eq!(r.value, "fd00:48::85");
        // Both static addresses on a dual-stack pool.
        dual_cluster()
            .create(&cfg6(
                "default/vm",
                &[(
                    "default/net-48",
                    MAC_A,
                    Some("192.168.48.85"),
                    Some("fd00:48::85"),
                )],
            ))
            .unwrap();
    }

    #[test]
    fn static_ipv6_address_must_fit_the_pool() {
        let mut cluster = dual_cluster();
        // Server and router inside the range, so those rules are reachable (the controller
        // marks both RESERVED).
        let v6 = cluster.pools[0].spec.ipv6_config.as_mut().unwrap();
        v6.server_ip = "fd00:48::84".into();
        v6.router = Some("fd00:48::83".into());
        for (addr, rule) in [
            (
                "fd00:49::85",
                "is outside cidr fd00:48::/112 of IPPool default/net-48",
            ),
            (
                "fd00:48::",
                "is the subnet-router anycast address of fd00:48::/112",
            ),
            (
                "fd00:48::91",
                "is outside pool range fd00:48::81-fd00:48::90 of IPPool default/net-48",
            ),
            ("fd00:48::84", "is the server ip of IPPool default/net-48"),
            ("FD00:48:0::83", "is the router of IPPool default/net-48"),
            ("fd00:48::90", "is excluded by IPPool default/net-48"),
        ] {
            let r = refused(cluster.create(&with_ipv6(addr)), IPV6_FIELD, rule);
            assert_eq!(r.value, addr);
        }
        cluster.create(&with_ipv6("fd00:48::85")).unwrap();
    }

    #[test]
    fn static_ipv6_address_must_not_be_occupied() {
        let mut cluster = dual_cluster();
        cluster.pools[0] = with_allocated(
            with_allocated_v6(
                dual_pool(),
                &[
                    ("fd00:48::85", MAC_B),
                    ("FD00:48::86", "FA-CF-8E-50-82-FC"),
                    ("fd00:48::87", "RESERVED"),
                    ("fd00:48::88", "EXCLUDED"),
                    ("fd00:48::89", "garbage"),
                ],
            ),
            // The IPv4 books hold nothing of IPv6.
            &[("192.168.48.85", MAC_B)],
        );
        refused(
            cluster.create(&with_ipv6("fd00:48::85")),
            IPV6_FIELD,
            &format!("is already occupied by MAC {MAC_B}"),
        );
        refused(
            cluster.create(&with_ipv6("fd00:48::87")),
            IPV6_FIELD,
            "is already occupied (RESERVED)",
        );
        refused(
            cluster.create(&with_ipv6("fd00:48::88")),
            IPV6_FIELD,
            "is already occupied (EXCLUDED)",
        );
        // Held by this very NIC (both spelled differently): its own lease.
        cluster.create(&with_ipv6("fd00:48::86")).unwrap();
        // A malformed entry holds nothing.
        cluster.create(&with_ipv6("fd00:48::89")).unwrap();
        // The IPv4 address the IPv6 books do not know is judged by the IPv4 books alone.
        refused(
            cluster.create(&cfg6(
                "default/vm",
                &[(
                    "default/net-48",
                    MAC_A,
                    Some("192.168.48.85"),
                    Some("fd00:48::8a"),
                )],
            )),
            "spec.networkConfigs[0].ipAddress",
            &format!("is already occupied by MAC {MAC_B}"),
        );
    }

    #[test]
    fn static_ipv6_address_is_unique_within_the_object_and_the_network() {
        let mut cluster = dual_cluster();
        cluster.pools[1].spec.ipv6_config = Some(crate::crd::IPv6Config {
            cidr: "fd00:49::/112".into(),
            server_ip: "fd00:49::77".into(),
            pool: crate::crd::IPv6Pool {
                start: "fd00:49::81".into(),
                end: "fd00:49::90".into(),
                exclude: vec![],
            },
            ..Default::default()
        });
        refused(
            cluster.create(&cfg6(
                "default/vm",
                &[
                    ("default/net-48", MAC_A, None, Some("fd00:48::85")),
                    ("default/net-49", MAC_B, None, Some("FD00:48::85")),
                ],
            )),
            "spec.networkConfigs[1].ipv6Address",
            "duplicates spec.networkConfigs[0].ipv6Address",
        );
        cluster.configs.push(cfg6(
            "default/other",
            &[("net-48", MAC_B, None, Some("fd00:48::85"))],
        ));
        refused(
            cluster.create(&with_ipv6("fd00:48::85")),
            IPV6_FIELD,
            "is already requested on network default/net-48 by VirtualMachineNetworkConfig default/other",
        );
        // An IPv4 address requested by another object does not block the same host's IPv6.
        cluster.configs.push(cfg(
            "default/third",
            &[("default/net-48", "02:00:00:00:00:03", Some("192.168.48.86"))],
        ));
        cluster.create(&with_ipv6("fd00:48::86")).unwrap();
    }

    #[test]
    fn ipv6_address_held_by_a_previous_mac_of_the_object_is_its_own() {
        let mut cluster = dual_cluster();
        cluster.pools[0] = with_allocated_v6(
            dual_pool(),
            &[("fd00:48::85", MAC_A), ("fd00:48::86", "02:00:00:00:00:07")],
        );
        let old = with_ipv6("fd00:48::85");
        let nic = |ipv6: &str| cfg6("default/vm", &[("default/net-48", MAC_B, None, Some(ipv6))]);
        validate_vmnetcfg_update(&old, &nic("fd00:48::85"), &cluster.facts()).unwrap();
        refused(
            validate_vmnetcfg_update(&old, &nic("fd00:48::86"), &cluster.facts()),
            IPV6_FIELD,
            "is already occupied by MAC 02:00:00:00:00:07",
        );
        refused(
            cluster.create(&nic("fd00:48::85")),
            IPV6_FIELD,
            &format!("is already occupied by MAC {MAC_A}"),
        );
        // An ipv6Address added to an unchanged NIC is checked; one left as it was is not.
        let mut gone = Cluster::new();
        gone.configs.clear();
        let added = with_ipv6("fd00:48::85");
        refused(
            validate_vmnetcfg_update(&readme_cfg_as_vm(), &added, &gone.facts()),
            IPV6_FIELD,
            "has no spec.ipv6Config",
        );
        validate_vmnetcfg_update(&added, &added, &gone.facts()).unwrap();
    }

    /// The README config renamed default/vm with MAC A, so `with_ipv6` changes only its NIC.
    fn readme_cfg_as_vm() -> VirtualMachineNetworkConfig {
        cfg("default/vm", &[("default/net-48", MAC_A, None)])
    }

    // === vmnetcfg update ===

    #[test]
    fn vm_name_is_immutable() {
        let cluster = Cluster::new();
        let old = readme_cfg();
        let mut new = old.clone();
        new.spec.vm_name = "other-vm".into();
        refused(
            validate_vmnetcfg_update(&old, &new, &cluster.facts()),
            F_VM_NAME,
            "is immutable (was \"test-vm\")",
        );
        new.spec.vm_name = old.spec.vm_name.clone();
        new.spec.paused = Some(true);
        validate_vmnetcfg_update(&old, &new, &cluster.facts()).unwrap();
    }

    #[test]
    fn update_rechecks_only_what_changed() {
        let mut cluster = Cluster::new();
        cluster.nads.retain(|n| n.name != nn("default/net-48"));
        let old = readme_cfg();
        // Metadata only: admitted although the NAD is gone.
        let mut new = old.clone();
        new.metadata.finalizers = Some(vec![]);
        validate_vmnetcfg_update(&old, &new, &cluster.facts()).unwrap();
        // A NIC added on a good network beside an unchanged one on a gone network: admitted.
        new.spec.network_configs.push(NetworkConfig {
            ipv6_address: None,
            dhcp_options: None,
            network_name: "default/net-49".into(),
            mac_address: MAC_B.into(),
            ip_address: None,
        });
        validate_vmnetcfg_update(&old, &new, &cluster.facts()).unwrap();
        // The NIC on the gone network changed: checked, and refused.
        new.spec.network_configs[0].mac_address = "02:00:00:00:00:09".into();
        refused(
            validate_vmnetcfg_update(&old, &new, &cluster.facts()),
            "spec.networkConfigs[0].networkName",
            "NetworkAttachmentDefinition default/net-48 not found",
        );
        // Within-object rules always apply.
        let mut dup = old.clone();
        dup.spec
            .network_configs
            .push(old.spec.network_configs[0].clone());
        refused(
            validate_vmnetcfg_update(&old, &dup, &cluster.facts()),
            "spec.networkConfigs[1].networkName",
            "duplicates",
        );
    }

    #[test]
    fn address_held_by_a_previous_mac_of_the_object_is_its_own() {
        let mut cluster = Cluster::new();
        cluster.pools[0] = with_allocated(
            readme_pool(),
            &[
                ("192.168.48.85", MAC_A),
                ("192.168.48.86", "02:00:00:00:00:07"),
            ],
        );
        let old = cfg(
            "default/vm",
            &[("default/net-48", MAC_A, Some("192.168.48.85"))],
        );
        // The NIC's MAC changed; the old MAC's lease is being released.
        let new = cfg(
            "default/vm",
            &[("default/net-48", MAC_B, Some("192.168.48.85"))],
        );
        validate_vmnetcfg_update(&old, &new, &cluster.facts()).unwrap();
        let new = cfg(
            "default/vm",
            &[("default/net-48", MAC_B, Some("192.168.48.86"))],
        );
        refused(
            validate_vmnetcfg_update(&old, &new, &cluster.facts()),
            "spec.networkConfigs[0].ipAddress",
            "is already occupied by MAC 02:00:00:00:00:07",
        );
        // On create the same request is refused.
        refused(
            cluster.create(&cfg(
                "default/vm",
                &[("default/net-48", MAC_B, Some("192.168.48.85"))],
            )),
            "spec.networkConfigs[0].ipAddress",
            &format!("is already occupied by MAC {MAC_A}"),
        );
    }
}
