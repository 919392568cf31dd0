//! The rules of address claims ([`crate::crd::AddressClaim`]), decided without I/O so the
//! admission webhook and the claim reconciler decide alike: what a claim binds to, the
//! placeholder MAC an unbound claim is recorded under, whether a pool admits a namespace, and
//! which of a namespace's claims fit its quota.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::crd::{AddressClaimSpec, ClaimQuota, ClaimsPolicy, IPPool, ReclaimPolicy};
use crate::{MacAddr, NamespacedName};

/// Why a claim cannot be held. Each names the rule it breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// `network` does not name a network.
    #[error("network {network:?}: {reason}")]
    Network {
        /// The value.
        network: String,
        /// Why.
        reason: String,
    },
    /// `vm` and `nic` go together, and not with `macAddress`.
    #[error("{0}")]
    Target(&'static str),
    /// `macAddress` is not a MAC.
    #[error("macAddress {0:?} is not a MAC address")]
    Mac(String),
    /// `ipAddress` / `ipv6Address` is not an address of its family.
    #[error("{field} {value:?} is not an {family} address")]
    Address {
        /// The field.
        field: &'static str,
        /// The value.
        value: String,
        /// `IPv4` or `IPv6`.
        family: &'static str,
    },
    /// The pool has no `spec.claims`, or its rule does not admit the namespace.
    #[error("IPPool {pool} does not admit claims from namespace {namespace}{detail}")]
    NotAdmitted {
        /// The pool.
        pool: NamespacedName,
        /// The claim's namespace.
        namespace: String,
        /// Which part of the rule: no claims at all, or not listed nor selected.
        detail: &'static str,
    },
    /// The namespace holds its quota of the family already.
    #[error(
        "namespace {namespace} holds {held} {family} address(es) claimed from IPPool {pool}: its quota (spec.claims.perNamespace.{field}) is {quota}"
    )]
    Quota {
        /// The pool.
        pool: NamespacedName,
        /// The claim's namespace.
        namespace: String,
        /// `IPv4` or `IPv6`.
        family: &'static str,
        /// `ipv4` or `ipv6`.
        field: &'static str,
        /// Claims of the namespace holding addresses of the pool.
        held: usize,
        /// The quota.
        quota: u32,
    },
    /// An IPv6 address asked of a pool without `ipv6Config`.
    #[error("ipv6Address {ip} asked of IPPool {pool}, which has no ipv6Config")]
    NoIpv6 {
        /// The address.
        ip: Ipv6Addr,
        /// The pool.
        pool: NamespacedName,
    },
}

/// What a claim's addresses are recorded for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The NIC `nic` of VirtualMachine `vm` in the claim's namespace, whatever its MAC.
    Nic {
        /// The VM's name.
        vm: String,
        /// The interface's name.
        nic: String,
    },
    /// This MAC.
    Mac(MacAddr),
    /// Nobody: a VIP.
    Nothing,
}

/// A claim's spec, read: the network, the addresses asked for, the target, the policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRequest {
    /// The network (a NIC's `networkName`, in the claim's namespace when bare).
    pub network: NamespacedName,
    /// The IPv4 address asked for.
    pub ip: Option<Ipv4Addr>,
    /// The IPv6 address asked for.
    pub ipv6: Option<Ipv6Addr>,
    /// What it binds to.
    pub target: Target,
    /// `Retain` unless said.
    pub reclaim: ReclaimPolicy,
}

impl ClaimRequest {
    /// Reads `spec` of a claim in `namespace`, naming the first field that is wrong.
    pub fn parse(spec: &AddressClaimSpec, namespace: &str) -> Result<Self, ClaimError> {
        let network = NamespacedName::parse_in(&spec.network, namespace).map_err(|e| {
            ClaimError::Network {
                network: spec.network.clone(),
                reason: e.to_string(),
            }
        })?;
        let given = |s: &Option<String>| s.as_deref().filter(|v| !v.is_empty()).map(str::to_owned);
        let target = match (given(&spec.vm), given(&spec.nic), given(&spec.mac_address)) {
            (Some(_), _, Some(_)) | (_, Some(_), Some(_)) => {
                return Err(ClaimError::Target(
                    "a claim binds to vm and nic, or to macAddress, not both",
                ));
            }
            (Some(vm), Some(nic), None) => Target::Nic { vm, nic },
            (Some(_), None, None) | (None, Some(_), None) => {
                return Err(ClaimError::Target("vm and nic are given together"));
            }
            (None, None, Some(mac)) => {
                Target::Mac(mac.parse().map_err(|_| ClaimError::Mac(mac.clone()))?)
            }
            (None, None, None) => Target::Nothing,
        };
        let ip = match given(&spec.ip_address) {
            None => None,
            Some(v) => Some(v.parse().map_err(|_| ClaimError::Address {
                field: "ipAddress",
                value: v.clone(),
                family: "IPv4",
            })?),
        };
        let ipv6 = match given(&spec.ipv6_address) {
            None => None,
            Some(v) => Some(v.parse().map_err(|_| ClaimError::Address {
                field: "ipv6Address",
                value: v.clone(),
                family: "IPv6",
            })?),
        };
        Ok(Self {
            network,
            ip,
            ipv6,
            target,
            reclaim: spec.reclaim_policy.unwrap_or_default(),
        })
    }
}

/// The value an unbound claim's addresses are recorded under in the pool's status: MAC-shaped
/// (so upstream's readers, which replay every entry that is not `RESERVED` or `EXCLUDED` as
/// taken, hold the address too), locally administered and unicast (`06:c1:` then 32 bits of
/// the claim's uid's FNV-1a hash), so no NIC a hypervisor or KubeVirt makes has it. From the
/// uid, not the name: a claim deleted and created again under its name is another claim.
pub fn placeholder_mac(uid: &str) -> MacAddr {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in uid.as_bytes() {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    let h = ((hash >> 32) ^ hash).to_be_bytes();
    MacAddr([0x06, 0xc1, h[4], h[5], h[6], h[7]])
}

/// Whether `mac` has the placeholders' prefix (it may still be a real NIC's, if someone set one).
pub fn is_placeholder(mac: &MacAddr) -> bool {
    mac.0[0] == 0x06 && mac.0[1] == 0xc1
}

/// Whether `pool`'s `policy` admits claims from `namespace`, whose labels are `labels`.
pub fn admits(
    pool: &NamespacedName,
    policy: Option<&ClaimsPolicy>,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Result<(), ClaimError> {
    let refused = |detail| ClaimError::NotAdmitted {
        pool: pool.clone(),
        namespace: namespace.to_owned(),
        detail,
    };
    let Some(policy) = policy else {
        return Err(refused(": it has no spec.claims"));
    };
    if policy.namespaces.iter().any(|n| n == namespace) {
        return Ok(());
    }
    match &policy.namespace_selector {
        Some(selector) if selects(selector, labels) => Ok(()),
        _ => Err(refused(
            ": not in spec.claims.namespaces, nor selected by spec.claims.namespaceSelector",
        )),
    }
}

/// Kubernetes' label selector semantics: every `matchLabels` pair and every expression holds
/// (`In`, `NotIn`, `Exists`, `DoesNotExist`); an unknown operator selects nothing. An empty
/// selector selects everything, as Kubernetes has it.
pub fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let pairs = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let expressions = selector.match_expressions.iter().flatten().all(|e| {
        let value = labels.get(&e.key);
        let values = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    pairs && expressions
}

/// The pool's per-namespace quota (`spec.claims.perNamespace`; no bound where absent).
pub fn quota_of(pool: &IPPool) -> ClaimQuota {
    pool.spec
        .claims
        .as_ref()
        .and_then(|p| p.per_namespace)
        .unwrap_or_default()
}

/// Whether one more claim of `namespace` fits `pool`'s quota in each family the pool has, while
/// `held` of the namespace's claims hold addresses there ([`within_quota`] per family).
pub fn fits_quota(
    pool: &IPPool,
    pool_ref: &NamespacedName,
    namespace: &str,
    held: usize,
) -> Result<(), ClaimError> {
    let quota = quota_of(pool);
    within_quota(pool_ref, namespace, held, quota.ipv4, false)?;
    if pool.spec.ipv6_config.is_some() {
        within_quota(pool_ref, namespace, held, quota.ipv6, true)?;
    }
    Ok(())
}

/// Whether one more claim fits `quota` (`None`: no bound) of this family while `held` claims of
/// its namespace hold addresses of the pool. A claim already holding its addresses is not asked:
/// a quota lowered under what is held refuses new claims and takes nothing away.
pub fn within_quota(
    pool: &NamespacedName,
    namespace: &str,
    held: usize,
    quota: Option<u32>,
    v6: bool,
) -> Result<(), ClaimError> {
    match quota {
        Some(q) if held >= q as usize => Err(ClaimError::Quota {
            pool: pool.clone(),
            namespace: namespace.to_owned(),
            family: if v6 { "IPv6" } else { "IPv4" },
            field: if v6 { "ipv6" } else { "ipv4" },
            held,
            quota: q,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn spec(network: &str) -> AddressClaimSpec {
        AddressClaimSpec {
            network: network.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_claim_binds_to_a_nic_a_mac_or_nothing_and_never_two() {
        let ns = "tenant";
        let bare = ClaimRequest::parse(&spec("net"), ns).unwrap();
        assert_eq!(bare.network, NamespacedName::new("tenant", "net").unwrap());
        assert_eq!(bare.target, Target::Nothing);
        assert_eq!(bare.reclaim, ReclaimPolicy::Retain);
        let nic = AddressClaimSpec {
            vm: Some("web".into()),
            nic: Some("nic1".into()),
            ..spec("default/net")
        };
        assert_eq!(
            ClaimRequest::parse(&nic, ns).unwrap().target,
            Target::Nic {
                vm: "web".into(),
                nic: "nic1".into()
            }
        );
        let mac = AddressClaimSpec {
            mac_address: Some("02:00:00:00:00:0A".into()),
            ..spec("net")
        };
        assert_eq!(
            ClaimRequest::parse(&mac, ns).unwrap().target,
            Target::Mac("02:00:00:00:00:0a".parse().unwrap())
        );
        let both = AddressClaimSpec {
            vm: Some("web".into()),
            nic: Some("nic1".into()),
            mac_address: Some("02:00:00:00:00:0a".into()),
            ..spec("net")
        };
        assert!(matches!(
            ClaimRequest::parse(&both, ns),
            Err(ClaimError::Target(_))
        ));
        let half = AddressClaimSpec {
            vm: Some("web".into()),
            ..spec("net")
        };
        assert!(matches!(
            ClaimRequest::parse(&half, ns),
            Err(ClaimError::Target(_))
        ));
        let bad = AddressClaimSpec {
            ip_address: Some("10.0.0.300".into()),
            ..spec("net")
        };
        assert_eq!(
            ClaimRequest::parse(&bad, ns).unwrap_err().to_string(),
            "ipAddress \"10.0.0.300\" is not an IPv4 address"
        );
    }

    #[test]
    fn the_example_claim_reads_as_a_nic_claim() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/addressclaim.yaml");
        let text = std::fs::read_to_string(path).unwrap();
        let claim: crate::crd::AddressClaim = serde_yaml_ng::from_str(&text).unwrap();
        let request = ClaimRequest::parse(&claim.spec, "default").unwrap();
        assert_eq!(
            request.target,
            Target::Nic {
                vm: "web".into(),
                nic: "nic-0".into()
            }
        );
        assert_eq!(request.ip, Some("192.168.48.85".parse().unwrap()));
    }

    /// Upstream's rebuild (its IPPool controller's BuildCache) replays every
    /// `status.ipv4.allocated` entry whose value is not `EXCLUDED` or `RESERVED` as an address
    /// taken by that value, a MAC as Go's `net.ParseMAC` reads it; ours replays it as a
    /// [`crate::pool::Holder::Mac`]. A placeholder must be taken by both.
    #[test]
    fn a_placeholder_entry_is_taken_by_upstream_s_rebuild_and_ours() {
        let placeholder = placeholder_mac("0b7d6a8e-4f0a-4e55-9d3a-2a1c1f0c7e11").to_string();
        // Upstream's rule: not a mark, and six colon-separated pairs of hex digits (the form
        // net.ParseMAC accepts and upstream's agent keys its leases by).
        assert!(placeholder != crate::crd::ALLOCATED_EXCLUDED);
        assert!(placeholder != crate::crd::ALLOCATED_RESERVED);
        let groups: Vec<&str> = placeholder.split(':').collect();
        assert_eq!(groups.len(), 6);
        assert!(groups.iter().all(|g| {
            g.len() == 2
                && g.chars()
                    .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        }));
        // Ours.
        let pool = NamespacedName::new("default", "pool").unwrap();
        let entries: BTreeMap<String, String> =
            [("10.0.0.40".to_string(), placeholder.clone())].into();
        let (parsed, errors) = crate::pool::parse_allocated::<std::net::Ipv4Addr>(&pool, &entries);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            parsed.get(&"10.0.0.40".parse().unwrap()),
            Some(&crate::pool::Holder::Mac(placeholder.parse().unwrap()))
        );
    }

    #[test]
    fn placeholders_are_stable_local_unicast_and_differ_per_uid() {
        let a = placeholder_mac("4b1c0f1e-0000-4000-8000-000000000001");
        let b = placeholder_mac("4b1c0f1e-0000-4000-8000-000000000002");
        assert_ne!(a, b);
        assert_eq!(a, placeholder_mac("4b1c0f1e-0000-4000-8000-000000000001"));
        // Locally administered (bit 1), unicast (bit 0 clear).
        assert_eq!(a.0[0] & 0b11, 0b10);
        assert!(is_placeholder(&a) && is_placeholder(&b));
        assert!(!is_placeholder(&"02:00:00:00:00:01".parse().unwrap()));
        // Pinned: the value is recorded in etcd and must not change between releases.
        assert_eq!(placeholder_mac("uid").to_string(), "06:c1:72:97:92:34");
    }

    #[test]
    fn a_pool_admits_listed_or_selected_namespaces_only() {
        let pool = NamespacedName::new("default", "pool").unwrap();
        let labels: BTreeMap<String, String> = [("team".to_string(), "blue".to_string())].into();
        let none = BTreeMap::new();
        let err = admits(&pool, None, "a", &none).unwrap_err();
        assert_eq!(
            err.to_string(),
            "IPPool default/pool does not admit claims from namespace a: it has no spec.claims"
        );
        let listed = ClaimsPolicy {
            namespaces: vec!["a".into()],
            ..Default::default()
        };
        assert!(admits(&pool, Some(&listed), "a", &none).is_ok());
        assert!(admits(&pool, Some(&listed), "b", &labels).is_err());
        let selected = ClaimsPolicy {
            namespace_selector: Some(LabelSelector {
                match_labels: Some([("team".to_string(), "blue".to_string())].into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(admits(&pool, Some(&selected), "b", &labels).is_ok());
        assert!(admits(&pool, Some(&selected), "b", &none).is_err());
    }

    #[test]
    fn selectors_follow_kubernetes_operators() {
        let labels: BTreeMap<String, String> = [("env".to_string(), "prod".to_string())].into();
        let expr = |op: &str, values: &[&str]| LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "env".into(),
                operator: op.into(),
                values: Some(values.iter().map(|v| v.to_string()).collect()),
            }]),
            ..Default::default()
        };
        assert!(selects(&expr("In", &["prod", "qa"]), &labels));
        assert!(!selects(&expr("In", &["qa"]), &labels));
        assert!(selects(&expr("NotIn", &["qa"]), &labels));
        assert!(!selects(&expr("NotIn", &["prod"]), &labels));
        assert!(selects(&expr("Exists", &[]), &labels));
        assert!(!selects(&expr("DoesNotExist", &[]), &labels));
        assert!(!selects(&expr("Bogus", &[]), &labels));
        assert!(selects(&LabelSelector::default(), &labels));
    }

    #[test]
    fn the_quota_refuses_the_claims_past_it_naming_it() {
        let pool = NamespacedName::new("default", "pool").unwrap();
        assert!(within_quota(&pool, "a", 1, Some(2), false).is_ok());
        assert!(within_quota(&pool, "a", 100, None, false).is_ok());
        let err = within_quota(&pool, "a", 2, Some(2), true).unwrap_err();
        assert_eq!(
            err.to_string(),
            "namespace a holds 2 IPv6 address(es) claimed from IPPool default/pool: its quota (spec.claims.perNamespace.ipv6) is 2"
        );
    }
}
