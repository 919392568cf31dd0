//! AddressClaim admission: what create and update refuse ([`validate_claim_create`],
//! [`validate_claim_update`]). The rules are the claim reconciler's (`crate::claims`), checked
//! before the claim is stored so its maker reads the refusal at once: the pool's `spec.claims`
//! (namespace, quota), and an address the pool could give (inside its range, not its server,
//! router, an excluded or reserved address, nor held by another MAC or asked by another claim).
//! Without a pool serving the network the claim is admitted: it waits for one, as a NIC does.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use super::Rejection;
use super::fields::{AdmittedFamily, check_address, immutable, key_of, same_network};
use crate::claims::{self, ClaimError, ClaimRequest, Target};
use crate::crd::{AddressClaim, AddressClaimSpec, ClaimPhase, IPPool};
use crate::mac::MacAddr;
use crate::names::NamespacedName;

const F_NETWORK: &str = "spec.network";
const F_IP: &str = "spec.ipAddress";
const F_IPV6: &str = "spec.ipv6Address";
const F_VM: &str = "spec.vm";
const F_NIC: &str = "spec.nic";
const F_MAC: &str = "spec.macAddress";

/// Cluster facts an AddressClaim decision needs, fetched by the server.
#[derive(Debug, Clone, Copy)]
pub struct ClaimFacts<'a> {
    /// The IPPool serving the claim's network, if any.
    pub pool: Option<&'a IPPool>,
    /// The labels of the claim's namespace (read only when the pool selects namespaces by label).
    pub namespace_labels: &'a BTreeMap<String, String>,
    /// The AddressClaims on the claim's network, any namespace; the one under review may be
    /// among them (skipped by ns/name).
    pub claims: &'a [AddressClaim],
}

/// Admits a new claim the pool serving its network would hold: well-formed, from a namespace the
/// pool admits and within its quota, asking for addresses it could give, binding what no other
/// claim binds.
pub fn validate_claim_create(claim: &AddressClaim, facts: &ClaimFacts) -> Result<(), Rejection> {
    let me = key_of(&claim.metadata);
    let request = parse(&claim.spec, &me.namespace)?;
    let Some(pool) = facts.pool else {
        return Ok(());
    };
    let pool_ref = key_of(&pool.metadata);
    let refuse = |field: &str, value: &str, e: ClaimError| {
        Rejection::new(field, value, format!("is refused: {e}"))
    };
    claims::admits(
        &pool_ref,
        pool.spec.claims.as_ref(),
        &me.namespace,
        facts.namespace_labels,
    )
    .map_err(|e| refuse(F_NETWORK, &claim.spec.network, e))?;
    let others: Vec<&AddressClaim> = facts
        .claims
        .iter()
        .filter(|c| key_of(&c.metadata) != me)
        .filter(|c| {
            let ns = c.metadata.namespace.as_deref().unwrap_or_default();
            same_network(&c.spec.network, ns, &request.network)
        })
        .collect();
    if let Some(ip) = request.ipv6
        && pool.spec.ipv6_config.is_none()
    {
        let e = ClaimError::NoIpv6 {
            ip,
            pool: pool_ref.clone(),
        };
        return Err(refuse(F_IPV6, &ip.to_string(), e));
    }
    let held = others
        .iter()
        .filter(|c| c.metadata.namespace.as_deref() == Some(me.namespace.as_str()))
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .filter(|c| c.status.as_ref().and_then(|s| s.phase) != Some(ClaimPhase::Refused))
        .count();
    claims::fits_quota(pool, &pool_ref, &me.namespace, held)
        .map_err(|e| refuse(F_NETWORK, &claim.spec.network, e))?;
    let own: Option<MacAddr> = match request.target {
        Target::Mac(mac) => Some(mac),
        _ => None,
    };
    check_target(&request, &me.namespace, &others)?;
    check_claimed::<Ipv4Addr>(request.ip, F_IP, pool, &pool_ref, own, &others)?;
    check_claimed::<Ipv6Addr>(request.ipv6, F_IPV6, pool, &pool_ref, own, &others)
}

/// Admits an update that leaves what the claim asks for as it was: its network, addresses and
/// target are decided when it is made (delete it and claim again); `reclaimPolicy`, labels,
/// finalizers and owners may change.
pub fn validate_claim_update(old: &AddressClaim, new: &AddressClaim) -> Result<(), Rejection> {
    let fields: [(&str, Option<&str>, Option<&str>); 6] = [
        (F_NETWORK, Some(&new.spec.network), Some(&old.spec.network)),
        (
            F_IP,
            new.spec.ip_address.as_deref(),
            old.spec.ip_address.as_deref(),
        ),
        (
            F_IPV6,
            new.spec.ipv6_address.as_deref(),
            old.spec.ipv6_address.as_deref(),
        ),
        (F_VM, new.spec.vm.as_deref(), old.spec.vm.as_deref()),
        (F_NIC, new.spec.nic.as_deref(), old.spec.nic.as_deref()),
        (
            F_MAC,
            new.spec.mac_address.as_deref(),
            old.spec.mac_address.as_deref(),
        ),
    ];
    for (field, now, before) in fields {
        if now != before {
            return Err(immutable(
                field,
                now.unwrap_or_default(),
                before.unwrap_or_default(),
            ));
        }
    }
    Ok(())
}

/// The claim's spec, read, or the field that does not read.
fn parse(spec: &AddressClaimSpec, namespace: &str) -> Result<ClaimRequest, Rejection> {
    ClaimRequest::parse(spec, namespace).map_err(|e| {
        let (field, value) = match &e {
            ClaimError::Network { network, .. } => (F_NETWORK, network.clone()),
            ClaimError::Mac(mac) => (F_MAC, mac.clone()),
            ClaimError::Address { field, value, .. } => (
                if *field == "ipAddress" { F_IP } else { F_IPV6 },
                value.clone(),
            ),
            _ => (F_VM, spec.vm.clone().unwrap_or_default()),
        };
        Rejection::new(field, value, format!("is refused: {e}"))
    })
}

/// No other claim on the network binds the same NIC or MAC.
fn check_target(
    request: &ClaimRequest,
    namespace: &str,
    others: &[&AddressClaim],
) -> Result<(), Rejection> {
    for other in others {
        let ns = other.metadata.namespace.as_deref().unwrap_or_default();
        let Ok(theirs) = ClaimRequest::parse(&other.spec, ns) else {
            continue;
        };
        let clash = match (&request.target, &theirs.target) {
            (Target::Mac(a), Target::Mac(b)) => a == b,
            (Target::Nic { vm, nic }, Target::Nic { vm: v, nic: n }) => {
                vm == v && nic == n && ns == namespace
            }
            _ => false,
        };
        if clash {
            let (field, value) = match &request.target {
                Target::Mac(mac) => (F_MAC, mac.to_string()),
                Target::Nic { vm, nic } => (F_NIC, format!("{vm}/{nic}")),
                Target::Nothing => (F_VM, String::new()),
            };
            return Err(Rejection::new(
                field,
                value,
                format!(
                    "is already bound by AddressClaim {}",
                    key_of(&other.metadata)
                ),
            ));
        }
    }
    Ok(())
}

/// `ip` (the claim's address of family `A`, if it asks for one) is one the pool could give the
/// claim: checked as a NIC's static address ([`check_address`], the claim's MAC its own), and
/// not asked for nor held by another claim.
fn check_claimed<A: AdmittedFamily>(
    ip: Option<A>,
    field: &str,
    pool: &IPPool,
    pool_ref: &NamespacedName,
    own: Option<MacAddr>,
    others: &[&AddressClaim],
) -> Result<(), Rejection> {
    let Some(ip) = ip else {
        return Ok(());
    };
    let raw = ip.to_string();
    let refuse = |rule: String| Rejection::new(field, raw.as_str(), rule);
    check_address::<A>(ip, pool, pool_ref, &|m| Some(*m) == own, &refuse)?;
    for other in others {
        let status = other.status.clone().unwrap_or_default();
        let asked = [
            other.spec.ip_address.as_deref(),
            other.spec.ipv6_address.as_deref(),
            status.ip_address.as_deref(),
            status.ipv6_address.as_deref(),
        ];
        if asked
            .into_iter()
            .flatten()
            .any(|a| a.parse::<A>().ok() == Some(ip))
        {
            return Err(refuse(format!(
                "is already claimed by AddressClaim {}",
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
    use crate::crd::{AddressClaimStatus, ClaimQuota, ClaimsPolicy};

    /// The README pool (192.168.48.0/24, range .81–.90 with both ends excluded, server .77),
    /// admitting namespace `default`, two IPv4 addresses each.
    fn open_pool() -> IPPool {
        let mut pool = readme_pool();
        pool.spec.claims = Some(ClaimsPolicy {
            namespaces: vec!["default".into()],
            per_namespace: Some(ClaimQuota {
                ipv4: Some(2),
                ipv6: None,
            }),
            ..Default::default()
        });
        pool
    }

    fn claim(name: &str, spec: serde_json::Value) -> AddressClaim {
        let mut spec = spec;
        spec["network"] = "default/net-48".into();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ipam.vmdhcp.io/v1alpha1", "kind": "AddressClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn check(c: &AddressClaim, pool: &IPPool, others: &[AddressClaim]) -> Result<(), Rejection> {
        let labels = BTreeMap::new();
        validate_claim_create(
            c,
            &ClaimFacts {
                pool: Some(pool),
                namespace_labels: &labels,
                claims: others,
            },
        )
    }

    #[test]
    fn a_claim_the_pool_can_hold_is_admitted_and_one_without_a_pool_waits() {
        let pool = open_pool();
        check(&claim("vip", serde_json::json!({})), &pool, &[]).unwrap();
        let nic = claim(
            "web",
            serde_json::json!({"vm": "web", "nic": "nic-0", "ipAddress": "192.168.48.85"}),
        );
        check(&nic, &pool, &[]).unwrap();
        let labels = BTreeMap::new();
        let none = ClaimFacts {
            pool: None,
            namespace_labels: &labels,
            claims: &[],
        };
        validate_claim_create(&nic, &none).unwrap();
    }

    #[test]
    fn refusals_name_the_field_and_the_rule() {
        let pool = open_pool();
        let closed = readme_pool();
        let err = check(&claim("c", serde_json::json!({})), &closed, &[]).unwrap_err();
        assert_eq!(err.field, F_NETWORK);
        assert!(err.rule.contains("has no spec.claims"), "{err}");
        let cases: [(serde_json::Value, &str, &str); 6] = [
            (
                serde_json::json!({"ipAddress": "192.168.49.5"}),
                F_IP,
                "is outside cidr",
            ),
            (
                serde_json::json!({"ipAddress": "192.168.48.81"}),
                F_IP,
                "is excluded",
            ),
            (
                serde_json::json!({"ipAddress": "192.168.48.50"}),
                F_IP,
                "is outside pool range",
            ),
            (
                serde_json::json!({"ipv6Address": "fd00::5"}),
                F_IPV6,
                "has no ipv6Config",
            ),
            (
                serde_json::json!({"vm": "web"}),
                F_VM,
                "vm and nic are given together",
            ),
            (
                serde_json::json!({"macAddress": "zz"}),
                F_MAC,
                "is not a MAC address",
            ),
        ];
        for (spec, field, rule) in cases {
            let err = check(&claim("c", spec.clone()), &pool, &[]).unwrap_err();
            assert_eq!(err.field, field, "{spec}: {err}");
            assert!(err.rule.contains(rule), "{spec}: {err}");
        }
    }

    #[test]
    fn an_address_another_mac_or_claim_holds_is_refused_and_the_claim_s_own_mac_is_not_another() {
        let pool = with_allocated(open_pool(), &[("192.168.48.85", MAC_A)]);
        let err = check(
            &claim("c", serde_json::json!({"ipAddress": "192.168.48.85"})),
            &pool,
            &[],
        )
        .unwrap_err();
        assert!(
            err.rule.contains(&format!("occupied by MAC {MAC_A}")),
            "{err}"
        );
        // A claim for the MAC that holds it takes it over.
        let mine = claim(
            "c",
            serde_json::json!({"ipAddress": "192.168.48.85", "macAddress": MAC_A}),
        );
        check(&mine, &pool, &[]).unwrap();
        // Asked by another claim (spec), or held by one (status).
        let asked = claim("a", serde_json::json!({"ipAddress": "192.168.48.86"}));
        let mut held = claim("b", serde_json::json!({}));
        held.status = Some(AddressClaimStatus {
            ip_address: Some("192.168.48.87".into()),
            ..Default::default()
        });
        let others = [asked, held];
        for ip in ["192.168.48.86", "192.168.48.87"] {
            let c = claim("c", serde_json::json!({"ipAddress": ip}));
            let err = check(&c, &open_pool_with_room(), &others).unwrap_err();
            assert!(
                err.rule
                    .contains("already claimed by AddressClaim default/"),
                "{err}"
            );
        }
        // A placeholder's entry is named as a claim's.
        let placeholder = crate::claims::placeholder_mac("uid").to_string();
        let pool = with_allocated(open_pool(), &[("192.168.48.88", placeholder.as_str())]);
        let err = check(
            &claim("c", serde_json::json!({"ipAddress": "192.168.48.88"})),
            &pool,
            &[],
        )
        .unwrap_err();
        assert!(err.rule.contains("is held by an AddressClaim"), "{err}");
    }

    /// The open pool with no quota (the address rules alone).
    fn open_pool_with_room() -> IPPool {
        let mut pool = open_pool();
        if let Some(c) = pool.spec.claims.as_mut() {
            c.per_namespace = None;
        }
        pool
    }

    #[test]
    fn the_quota_counts_the_namespace_s_claims_that_are_not_refused() {
        let pool = open_pool();
        let mut refused = claim("r", serde_json::json!({}));
        refused.status = Some(AddressClaimStatus {
            phase: Some(ClaimPhase::Refused),
            ..Default::default()
        });
        let one = [claim("a", serde_json::json!({})), refused.clone()];
        check(&claim("c", serde_json::json!({})), &pool, &one).unwrap();
        let two = [
            claim("a", serde_json::json!({})),
            claim("b", serde_json::json!({})),
            refused,
        ];
        let err = check(&claim("c", serde_json::json!({})), &pool, &two).unwrap_err();
        assert!(
            err.rule.contains("spec.claims.perNamespace.ipv4) is 2"),
            "{err}"
        );
    }

    #[test]
    fn a_nic_or_mac_is_bound_by_one_claim_only() {
        let pool = open_pool_with_room();
        let first = claim("a", serde_json::json!({"vm": "web", "nic": "nic-0"}));
        let err = check(
            &claim("b", serde_json::json!({"vm": "web", "nic": "nic-0"})),
            &pool,
            &[first],
        )
        .unwrap_err();
        assert_eq!(err.field, F_NIC);
        assert!(
            err.rule.contains("already bound by AddressClaim default/a"),
            "{err}"
        );
        let first = claim("a", serde_json::json!({"macAddress": MAC_B}));
        let err = check(
            &claim("b", serde_json::json!({"macAddress": MAC_B})),
            &pool,
            &[first],
        )
        .unwrap_err();
        assert_eq!(err.field, F_MAC);
    }

    #[test]
    fn an_update_may_change_the_reclaim_policy_and_metadata_only() {
        let old = claim("a", serde_json::json!({"vm": "web", "nic": "nic-0"}));
        let mut new = old.clone();
        new.metadata.finalizers = Some(vec!["ipam.vmdhcp.io/address-claim".into()]);
        new.spec.reclaim_policy = Some(crate::crd::ReclaimPolicy::Delete);
        validate_claim_update(&old, &new).unwrap();
        new.spec.nic = Some("nic-1".into());
        let err = validate_claim_update(&old, &new).unwrap_err();
        assert_eq!(err.field, F_NIC);
    }
}
