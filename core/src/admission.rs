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
//! per network, and the CRD's CEL immutability rules (which a 1.20 apiserver drops). Two
//! principles upstream does not state:
//! - Names and MACs are compared normalised ([`NamespacedName`], [`MacAddr`]), never as strings.
//! - What was admitted stays admitted: an update that leaves the spec unchanged (finalizers,
//!   labels) is never refused, and a network config unchanged by an update is not re-checked
//!   against the cluster, so a NAD deleted since cannot wedge a controller's metadata writes.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::crd::{
    IPPool, IPPoolSpec, LABEL_IPPOOL_NAME, LABEL_IPPOOL_NAMESPACE, NetworkConfig,
    VirtualMachineNetworkConfig,
};
use crate::mac::MacAddr;
use crate::names::{NameError, NamespacedName};
use crate::pool::{Holder, is_host_of, parse_allocated};

/// Most DNS servers an IPPool may hand out (upstream's CRD `maxItems`).
pub const MAX_DNS: usize = 3;
/// Most NTP servers an IPPool may hand out (upstream's CRD `maxItems`).
pub const MAX_NTP: usize = 4;
/// Most network configs one VirtualMachineNetworkConfig may hold (upstream's CRD `maxItems`).
pub const MAX_NETWORK_CONFIGS: usize = 4;
/// Most users a delete refusal names, so the message stays readable for a busy network.
pub const MAX_LISTED_USERS: usize = 5;

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
    /// The NAD's labels, among them [`LABEL_IPPOOL_NAMESPACE`] and [`LABEL_IPPOOL_NAME`].
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
/// a CIDR and get a working pool, as upstream's mutator does.
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

// === IPPool ===

const F_NETWORK: &str = "spec.networkName";
const F_CIDR: &str = "spec.ipv4Config.cidr";
const F_SERVER: &str = "spec.ipv4Config.serverIP";
const F_ROUTER: &str = "spec.ipv4Config.router";
const F_START: &str = "spec.ipv4Config.pool.start";
const F_END: &str = "spec.ipv4Config.pool.end";
const F_EXCLUDE: &str = "spec.ipv4Config.pool.exclude";
const F_DNS: &str = "spec.ipv4Config.dns";
const F_NTP: &str = "spec.ipv4Config.ntp";
const F_DOMAIN: &str = "spec.ipv4Config.domainName";
const F_SEARCH: &str = "spec.ipv4Config.domainSearch";
const F_LEASE: &str = "spec.ipv4Config.leaseTime";
const F_VM_NAME: &str = "spec.vmName";
const F_CONFIGS: &str = "spec.networkConfigs";

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

    let checked = check_pool_spec(new, facts)?;

    // The status the apiserver stores: on a validated update, new.status is old.status.
    let allocated = allocated_of(old);
    let held_by_mac = |ip: Ipv4Addr| match allocated.get(&ip) {
        Some(Holder::Mac(mac)) => Some(*mac),
        _ => None,
    };
    if old_router.is_none()
        && let (Some(router), Some(raw)) = (checked.router, new_router)
        && let Some(mac) = held_by_mac(router)
    {
        return Err(Rejection::new(
            F_ROUTER,
            raw,
            format!("is already occupied by MAC {mac}"),
        ));
    }
    if o4.pool.exclude.is_empty() {
        for (i, (ip, raw)) in checked.exclude.iter().zip(&n4.pool.exclude).enumerate() {
            if let Some(mac) = held_by_mac(*ip) {
                return Err(Rejection::new(
                    format!("{F_EXCLUDE}[{i}]"),
                    raw,
                    format!("is already occupied by MAC {mac}"),
                ));
            }
        }
    }
    match allocated.get(&checked.server_ip) {
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

/// The addressing of a pool that passed every create-time rule.
struct CheckedPool {
    server_ip: Ipv4Addr,
    router: Option<Ipv4Addr>,
    exclude: Vec<Ipv4Addr>,
}

/// Every rule a pool must satisfy on create and (when its spec changes) on update.
fn check_pool_spec(pool: &IPPool, facts: &PoolFacts) -> Result<CheckedPool, Rejection> {
    let spec = &pool.spec;
    let v4 = &spec.ipv4_config;
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

    let subnet = parse_cidr(&v4.cidr)?;
    if let Some(service) = facts.service_cidr
        && (subnet.contains(&service.network()) || service.contains(&subnet.network()))
    {
        return Err(Rejection::new(
            F_CIDR,
            &v4.cidr,
            format!("overlaps cluster service cidr {}", service.trunc()),
        ));
    }

    let server_ip = parse_ip(F_SERVER, &v4.server_ip)?;
    check_host(F_SERVER, &v4.server_ip, server_ip, subnet)?;
    let start = parse_ip(F_START, &v4.pool.start)?;
    check_host(F_START, &v4.pool.start, start, subnet)?;
    let end = parse_ip(F_END, &v4.pool.end)?;
    check_host(F_END, &v4.pool.end, end, subnet)?;
    check_range_order(start, end)?;

    let router = match optional(v4.router.as_deref()) {
        None => None,
        Some(raw) => {
            let router = parse_ip(F_ROUTER, raw)?;
            check_host(F_ROUTER, raw, router, subnet)?;
            if router == server_ip {
                return Err(Rejection::new(
                    F_SERVER,
                    &v4.server_ip,
                    format!("must differ from {F_ROUTER} {router}"),
                ));
            }
            Some(router)
        }
    };

    let mut exclude: Vec<Ipv4Addr> = Vec::with_capacity(v4.pool.exclude.len());
    for (i, raw) in v4.pool.exclude.iter().enumerate() {
        let field = format!("{F_EXCLUDE}[{i}]");
        let ip = parse_ip(&field, raw)?;
        if ip < start || ip > end {
            return Err(Rejection::new(
                field,
                raw,
                format!("is outside pool range {start}-{end}"),
            ));
        }
        if let Some(j) = exclude.iter().position(|e| *e == ip) {
            return Err(Rejection::new(
                field,
                raw,
                format!("duplicates {F_EXCLUDE}[{j}]"),
            ));
        }
        exclude.push(ip);
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

    check_count(F_DNS, &v4.dns, MAX_DNS)?;
    for (i, raw) in v4.dns.iter().enumerate() {
        parse_ip(&format!("{F_DNS}[{i}]"), raw)?;
    }
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
    if let Some(lease) = v4.lease_time
        && u32::try_from(lease).is_err()
    {
        return Err(Rejection::new(
            F_LEASE,
            lease.to_string(),
            "must be between 0 and 4294967295 seconds",
        ));
    }

    Ok(CheckedPool {
        server_ip,
        router,
        exclude,
    })
}

// === VirtualMachineNetworkConfig ===

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

/// The rules of one (new or changed) network config that depend on other objects.
fn check_config_in_cluster(
    pc: &ParsedConfig,
    me: &NamespacedName,
    old: Option<&VirtualMachineNetworkConfig>,
    facts: &VmNetCfgFacts,
) -> Result<(), Rejection> {
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

    // The NICs of other objects on the same network.
    let others: Vec<(&VirtualMachineNetworkConfig, &NetworkConfig)> = facts
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
        .collect();
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

    let Some(ip) = pc.ip else {
        return Ok(());
    };
    let ip_field = format!("{F_CONFIGS}[{i}].ipAddress");
    let ip_raw = pc.raw.ip_address.as_deref().unwrap_or_default();
    let refuse = |rule: String| Rejection::new(&ip_field, ip_raw, rule);
    let v4 = &pool.spec.ipv4_config;

    let subnet = v4.cidr.parse::<Ipv4Net>().map(|n| n.trunc()).map_err(|_| {
        refuse(format!(
            "cannot be checked: IPPool {pool_ref} has an invalid {F_CIDR} {:?}",
            v4.cidr
        ))
    })?;
    let bound = |field: &str, raw: &str| {
        raw.parse::<Ipv4Addr>().map_err(|_| {
            refuse(format!(
                "cannot be checked: IPPool {pool_ref} has an invalid {field} {raw:?}"
            ))
        })
    };
    let (start, end) = (bound(F_START, &v4.pool.start)?, bound(F_END, &v4.pool.end)?);
    if !subnet.contains(&ip) {
        return Err(refuse(format!(
            "is outside cidr {subnet} of IPPool {pool_ref}"
        )));
    }
    if !is_host_of(subnet, ip) {
        return Err(refuse(not_host_rule(subnet, ip)));
    }
    if ip < start || ip > end {
        return Err(refuse(format!(
            "is outside pool range {start}-{end} of IPPool {pool_ref}"
        )));
    }
    let is = |raw: &str| raw.parse::<Ipv4Addr>() == Ok(ip);
    if is(&v4.server_ip) {
        return Err(refuse(format!("is the server ip of IPPool {pool_ref}")));
    }
    if v4.router.as_deref().is_some_and(is) {
        return Err(refuse(format!("is the router of IPPool {pool_ref}")));
    }
    if v4.pool.exclude.iter().any(|e| is(e)) {
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

    for (other, nc) in &others {
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

// === shared helpers ===

/// An object's `namespace/name`, unvalidated (objects from the API always have both).
fn key_of(meta: &ObjectMeta) -> NamespacedName {
    NamespacedName {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
    }
}

/// Whether a network name written in an object of namespace `ns` names `network`. Objects
/// already stored are read as the controller reads them (a bare name lives in their namespace).
fn same_network(raw: &str, ns: &str, network: &NamespacedName) -> bool {
    NamespacedName::parse_in(raw, ns).is_ok_and(|n| n == *network)
}

/// The parsed `status.ipv4.allocated` of a pool; malformed entries are ignored (they block
/// nothing, as they serve nothing).
fn allocated_of(pool: &IPPool) -> BTreeMap<Ipv4Addr, Holder> {
    match pool.status.as_ref().and_then(|s| s.ipv4.as_ref()) {
        Some(v4) => parse_allocated(&key_of(&pool.metadata), &v4.allocated).0,
        None => BTreeMap::new(),
    }
}

fn is_missing(value: &str) -> bool {
    value.trim().is_empty()
}

/// An optional string field, with an empty string meaning unset (as the controller reads it).
fn optional(value: Option<&str>) -> Option<&str> {
    value.filter(|s| !s.is_empty())
}

fn immutable(field: &str, value: &str, before: &str) -> Rejection {
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
fn parse_network(field: &str, value: &str) -> Result<NamespacedName, Rejection> {
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

fn parse_cidr(value: &str) -> Result<Ipv4Net, Rejection> {
    if is_missing(value) {
        return Err(Rejection::new(F_CIDR, value, "is required"));
    }
    value
        .parse::<Ipv4Net>()
        .map(|n| n.trunc())
        .map_err(|_| Rejection::new(F_CIDR, value, "is not an IPv4 CIDR (e.g. 192.168.48.0/24)"))
}

fn parse_ip(field: &str, value: &str) -> Result<Ipv4Addr, Rejection> {
    if is_missing(value) {
        return Err(Rejection::new(field, value, "is required"));
    }
    value
        .parse()
        .map_err(|_| Rejection::new(field, value, "is not an IPv4 address"))
}

/// The addresses of `subnet` a host may use, under the same rule as [`is_host_of`]: all but the
/// network and broadcast addresses, or every address of a /31 or /32 (RFC 3021).
fn host_range(subnet: Ipv4Net) -> (Ipv4Addr, Ipv4Addr) {
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

fn check_host(field: &str, raw: &str, ip: Ipv4Addr, subnet: Ipv4Net) -> Result<(), Rejection> {
    if !subnet.contains(&ip) {
        return Err(Rejection::new(
            field,
            raw,
            format!("is outside cidr {subnet}"),
        ));
    }
    if !is_host_of(subnet, ip) {
        return Err(Rejection::new(field, raw, not_host_rule(subnet, ip)));
    }
    Ok(())
}

fn not_host_rule(subnet: Ipv4Net, ip: Ipv4Addr) -> String {
    if ip == subnet.network() {
        format!("is the network address of {subnet}")
    } else {
        format!("is the broadcast address of {subnet}")
    }
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

fn check_count(field: &str, items: &[String], max: usize) -> Result<(), Rejection> {
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
fn is_dns_name(s: &str) -> bool {
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::crd::{IPPoolStatus, IPv4Status, VirtualMachineNetworkConfigSpec};
    use proptest::prelude::*;

    const README_IPPOOL: &str = include_str!("../../examples/ippool.yaml");
    const README_VMNETCFG: &str = include_str!("../../examples/vmnetcfg.yaml");
    const MAC_A: &str = "fa:cf:8e:50:82:fc";
    const MAC_B: &str = "c6:d6:82:39:d3:c3";

    // === fixtures ===

    /// The README pool: default/net-48 on default/net-48, 192.168.48.0/24, range .81-.90 with
    /// both ends excluded, server .77, router .1.
    fn readme_pool() -> IPPool {
        serde_yaml_ng::from_str(README_IPPOOL).unwrap()
    }

    fn readme_cfg() -> VirtualMachineNetworkConfig {
        serde_yaml_ng::from_str(README_VMNETCFG).unwrap()
    }

    fn nn(s: &str) -> NamespacedName {
        s.parse().unwrap()
    }

    /// A NAD labelled with the pool serving it (`None`: no labels).
    fn nad(name: &str, pool: Option<&str>) -> Nad {
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

    fn net48() -> Nad {
        nad("default/net-48", Some("default/net-48"))
    }

    fn service() -> Option<Ipv4Net> {
        Some("10.53.0.0/16".parse().unwrap())
    }

    /// A pool `ns/name` on `network` with the README's addressing.
    fn pool_on(key: &str, network: &str) -> IPPool {
        let k = nn(key);
        let mut pool = readme_pool();
        pool.metadata.namespace = Some(k.namespace);
        pool.metadata.name = Some(k.name);
        pool.spec.network_name = network.to_owned();
        pool
    }

    /// A minimal pool on default/net-48 with only the required fields.
    fn bare_pool(cidr: &str) -> IPPool {
        let mut pool = readme_pool();
        pool.spec.ipv4_config = crate::crd::IPv4Config {
            cidr: cidr.to_owned(),
            ..Default::default()
        };
        pool
    }

    fn with_allocated(mut pool: IPPool, entries: &[(&str, &str)]) -> IPPool {
        pool.status = Some(IPPoolStatus {
            ipv4: Some(IPv4Status {
                allocated: entries
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
                used: 0,
                available: 0,
            }),
            ..Default::default()
        });
        pool
    }

    fn create(pool: &IPPool) -> Result<(), Rejection> {
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

    fn update(old: &IPPool, new: &IPPool) -> Result<(), Rejection> {
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
    fn cfg(key: &str, nics: &[(&str, &str, Option<&str>)]) -> VirtualMachineNetworkConfig {
        let k = nn(key);
        let mut cfg = VirtualMachineNetworkConfig::new(
            &k.name,
            VirtualMachineNetworkConfigSpec {
                vm_name: k.name.clone(),
                paused: None,
                network_configs: nics
                    .iter()
                    .map(|(net, mac, ip)| NetworkConfig {
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
    struct Cluster {
        nads: Vec<Nad>,
        pools: Vec<IPPool>,
        configs: Vec<VirtualMachineNetworkConfig>,
    }

    impl Cluster {
        fn new() -> Self {
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

        fn facts(&self) -> VmNetCfgFacts<'_> {
            VmNetCfgFacts {
                nads: &self.nads,
                pools: &self.pools,
                configs: &self.configs,
            }
        }

        fn create(&self, cfg: &VirtualMachineNetworkConfig) -> Result<(), Rejection> {
            validate_vmnetcfg_create(cfg, &self.facts())
        }
    }

    /// Asserts a refusal of `field` whose rule contains `rule`, and returns it.
    #[track_caller]
    fn refused<T: std::fmt::Debug>(r: Result<T, Rejection>, field: &str, rule: &str) -> Rejection {
        let err = r.expect_err("expected a rejection");
        assert_eq!(err.field, field, "{err}");
        assert!(
            err.rule.contains(rule),
            "rule {:?} lacks {rule:?}",
            err.rule
        );
        err
    }

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

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
