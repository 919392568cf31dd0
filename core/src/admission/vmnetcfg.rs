//! VirtualMachineNetworkConfig admission: what create and update refuse
//! ([`validate_vmnetcfg_create`], [`validate_vmnetcfg_update`]): each NIC's own fields first
//! ([`check_vmnetcfg`]), then, for NICs new or changed, the NAD, pool and other objects on its
//! network ([`check_config_in_cluster`]).

use std::net::Ipv4Addr;

use super::fields::{
    F_CONFIGS, F_VM_NAME, allocated_of, immutable, key_of, optional, parse_ip, parse_network,
    same_network,
};
use super::{Rejection, VmNetCfgFacts};
use crate::crd::{
    IPPool, LABEL_IPPOOL_NAME, LABEL_IPPOOL_NAMESPACE, NetworkConfig, VirtualMachineNetworkConfig,
};
use crate::mac::MacAddr;
use crate::names::NamespacedName;
use crate::pool::spec::not_a_host;
use crate::pool::{Holder, PoolError, ValidPool};

/// Most network configs one VirtualMachineNetworkConfig may hold (upstream's CRD `maxItems`).
pub const MAX_NETWORK_CONFIGS: usize = 4;

/// Admits a new VirtualMachineNetworkConfig only if every NIC can get an address: well-formed
/// and unique networks, MACs and static addresses; each network's NAD labelled with the pool
/// that serves it; a static address free in that pool; no MAC already used on the network.
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
            Some(s) => Some(parse_ip(&field("ipAddress"), s)?),
        };
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
        }
        parsed.push(ParsedConfig {
            index,
            raw,
            network,
            mac,
            ip,
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
/// NAD and pool, its MAC unused by other objects on that network, and its static address (if
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

    check_static_ip(pc, me, old, pool, &pool_ref, &others)
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

/// `pc`'s static address, if any: a host address within the range of `pool` that is neither
/// its server, router nor excluded, not held by another MAC than the object's own (new or
/// previous) on the network, and not requested by another object (`others`).
fn check_static_ip(
    pc: &ParsedConfig,
    me: &NamespacedName,
    old: Option<&VirtualMachineNetworkConfig>,
    pool: &IPPool,
    pool_ref: &NamespacedName,
    others: &[(&VirtualMachineNetworkConfig, &NetworkConfig)],
) -> Result<(), Rejection> {
    let i = pc.index;
    let network = &pc.network;
    let Some(ip) = pc.ip else {
        return Ok(());
    };
    let ip_field = format!("{F_CONFIGS}[{i}].ipAddress");
    let ip_raw = pc.raw.ip_address.as_deref().unwrap_or_default();
    let refuse = |rule: String| Rejection::new(&ip_field, ip_raw, rule);
    let valid = ValidPool::parse(pool).map_err(|e| {
        refuse(match e {
            PoolError::InvalidField { field, value, .. } => {
                format!("cannot be checked: IPPool {pool_ref} has an invalid {field} {value:?}")
            }
            other => format!("cannot be checked: {other}"),
        })
    })?;
    let range = valid.range();
    let (subnet, start, end) = (range.subnet(), range.start(), range.end());
    if !subnet.contains(&ip) {
        return Err(refuse(format!(
            "is outside cidr {subnet} of IPPool {pool_ref}"
        )));
    }
    if let Some(rule) = not_a_host(subnet, ip) {
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

    match allocated_of(pool).get(&ip) {
        Some(Holder::Mac(holder)) => {
            let previous_macs = old
                .map(|o| o.spec.network_configs.as_slice())
                .unwrap_or_default()
                .iter()
                .filter(|nc| same_network(&nc.network_name, &me.namespace, network))
                .filter_map(|nc| nc.mac_address.parse::<MacAddr>().ok());
            let mut own = std::iter::once(pc.mac).chain(previous_macs);
            if !own.any(|m| m == *holder) {
                return Err(refuse(format!("is already occupied by MAC {holder}")));
            }
        }
        Some(Holder::Reserved) => return Err(refuse("is already occupied (RESERVED)".into())),
        Some(Holder::Excluded) => return Err(refuse("is already occupied (EXCLUDED)".into())),
        None => {}
    }

    for (other, nc) in others {
        let requested = optional(nc.ip_address.as_deref()).and_then(|s| s.parse().ok());
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
