//! Stable agent interface names, one per pool.
//!
//! Upstream PR #64 numbered interfaces `net0, net1, …` in pool order, so adding or removing one
//! pool renamed the others and rolled every agent. Here a pool's name is a hash of its
//! `namespace/name`: it never depends on which other pools exist, except in the (2^-40) case of a
//! hash collision, which [`assign`] detects and resolves the same way on every run.

use std::collections::{BTreeMap, BTreeSet};

use crate::names::NamespacedName;

/// Linux's limit on interface names (IFNAMSIZ − 1).
pub const MAX_LEN: usize = 15;

/// Prefix of every interface name vmdhcp derives.
pub const PREFIX: &str = "vmd";

/// Why a string cannot be an interface name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IfnameError {
    /// Empty, longer than 15 bytes, or holding a character Linux or Multus cannot take.
    #[error("invalid interface name {name:?}: {reason}")]
    Invalid {
        /// The rejected name.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// Checks that `name` is usable as a Linux interface name and as the `@ifname` of a Multus
/// network selection.
pub fn validate(name: &str) -> Result<(), IfnameError> {
    let invalid = |reason| IfnameError::Invalid {
        name: name.to_owned(),
        reason,
    };
    if name.is_empty() {
        return Err(invalid("empty"));
    }
    if name.len() > MAX_LEN {
        return Err(invalid("longer than 15 bytes"));
    }
    if name == "." || name == ".." {
        return Err(invalid("reserved"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_graphic() && !matches!(b, b'/' | b':' | b'@' | b',' | b'"'))
    {
        return Err(invalid(
            "only printable ASCII without '/', ':', '@', ',' or '\"' is allowed",
        ));
    }
    Ok(())
}

/// 64-bit FNV-1a: tiny, fixed forever (names must not change across releases), good spread.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The name a pool gets at attempt `salt` (0 unless it collided): `vmd` + 10 hex digits.
pub fn candidate(pool: &NamespacedName, salt: u32) -> String {
    let key = if salt == 0 {
        pool.to_string()
    } else {
        format!("{pool}#{salt}")
    };
    format!("{PREFIX}{:010x}", fnv1a(key.as_bytes()) & 0xff_ffff_ffff)
}

/// The interface name of `pool` when it collides with no other pool.
pub fn base_name(pool: &NamespacedName) -> String {
    candidate(pool, 0)
}

/// Names every pool of a set: each gets its [`base_name`], and on a collision the pools are taken
/// in `namespace/name` order, the first keeping the name and later ones moving to the next salt.
pub fn assign<'a>(
    pools: impl IntoIterator<Item = &'a NamespacedName>,
) -> BTreeMap<NamespacedName, String> {
    assign_with(pools, candidate)
}

fn assign_with<'a>(
    pools: impl IntoIterator<Item = &'a NamespacedName>,
    name_of: impl Fn(&NamespacedName, u32) -> String,
) -> BTreeMap<NamespacedName, String> {
    let sorted: BTreeSet<&NamespacedName> = pools.into_iter().collect();
    let mut taken = BTreeSet::new();
    let mut out = BTreeMap::new();
    for pool in sorted {
        let name = (0..)
            .map(|salt| name_of(pool, salt))
            .find(|n| !taken.contains(n))
            .unwrap_or_default();
        taken.insert(name.clone());
        out.insert(pool.clone(), name);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: &str) -> NamespacedName {
        s.parse().unwrap()
    }

    #[test]
    fn names_are_valid_stable_and_short() {
        let name = base_name(&r("default/net-48"));
        assert_eq!(name.len(), 13);
        assert!(validate(&name).is_ok());
        // Pinned: a change here renames every interface in every cluster.
        assert_eq!(name, "vmdff247118e5");
        assert_ne!(
            base_name(&r("default/net-48")),
            base_name(&r("default/net-49"))
        );
        let long = r(&format!(
            "{}/{}{}",
            "n".repeat(63),
            format!("{}.", "x".repeat(63)).repeat(3),
            "x".repeat(61)
        ));
        assert!(validate(&base_name(&long)).is_ok());
    }

    #[test]
    fn adding_or_removing_a_pool_renames_nothing_else() {
        let pools: Vec<_> = (0..50)
            .map(|i| r(&format!("ns{}/pool-{i}", i % 3)))
            .collect();
        let all = assign(&pools);
        let fewer = assign(&pools[1..]);
        for (pool, name) in &fewer {
            assert_eq!(&all[pool], name);
        }
        assert_eq!(all.values().collect::<BTreeSet<_>>().len(), 50);
    }

    #[test]
    fn collisions_are_detected_and_resolved_deterministically() {
        // A name function that collides for every pool at salt 0.
        let colliding = |p: &NamespacedName, salt: u32| {
            if salt == 0 {
                "vmdsame".to_owned()
            } else {
                format!("vmd{}{salt}", p.name)
            }
        };
        let (a, b, c) = (r("ns/a"), r("ns/b"), r("ns/c"));
        let one = assign_with([&c, &a, &b], colliding);
        let two = assign_with([&b, &c, &a], colliding);
        assert_eq!(one, two);
        assert_eq!(one[&a], "vmdsame");
        assert_eq!(one[&b], "vmdb1");
        assert_eq!(one[&c], "vmdc1");
    }

    #[test]
    fn validation_rejects_what_linux_or_multus_cannot_take() {
        for bad in [
            "",
            "a".repeat(16).as_str(),
            ".",
            "..",
            "a/b",
            "a:b",
            "a@b",
            "a b",
            "a,b",
            "é",
        ] {
            assert!(validate(bad).is_err(), "{bad:?}");
        }
        for good in ["eth1", "net0", "vmd0123456789a", "a".repeat(15).as_str()] {
            assert!(validate(good).is_ok(), "{good:?}");
        }
    }
}
