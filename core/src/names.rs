//! `namespace/name` references, the way the API spells pools and networks.
//!
//! IPPools are referred to as `ns/name` in `IPPOOL_REFS_JSON` and in metrics, and networks as
//! `ns/nad` in `spec.networkName`. Upstream keyed its caches by whichever string it had at hand
//! and so mixed the two up; here both are the same validated type and never a bare string.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why a string is not a `namespace/name` reference.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// No `/` separating namespace and name (and no default namespace was given).
    #[error("invalid reference {value:?}: expected \"namespace/name\"")]
    MissingNamespace {
        /// The rejected input.
        value: String,
    },
    /// The namespace part is not a DNS-1123 label.
    #[error(
        "invalid reference {value:?}: namespace {part:?} is not a DNS-1123 label (lowercase alphanumerics and '-', at most 63)"
    )]
    BadNamespace {
        /// The rejected input.
        value: String,
        /// The offending part.
        part: String,
    },
    /// The name part is not a DNS-1123 subdomain.
    #[error(
        "invalid reference {value:?}: name {part:?} is not a DNS-1123 subdomain (lowercase alphanumerics, '-' and '.', at most 253)"
    )]
    BadName {
        /// The rejected input.
        value: String,
        /// The offending part.
        part: String,
    },
}

/// A reference to a namespaced object, `namespace/name`; `Display` gives that form back.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NamespacedName {
    /// The object's namespace (a DNS-1123 label).
    pub namespace: String,
    /// The object's name (a DNS-1123 subdomain).
    pub name: String,
}

impl NamespacedName {
    /// Builds a reference from parts, validating both.
    pub fn new(namespace: &str, name: &str) -> Result<Self, NameError> {
        format!("{namespace}/{name}").parse()
    }

    /// Parses `namespace/name`, or a bare `name` which then lives in `default_namespace`
    /// (how Multus resolves a network named without a namespace).
    pub fn parse_in(value: &str, default_namespace: &str) -> Result<Self, NameError> {
        if value.contains('/') {
            value.parse()
        } else {
            Self::new(default_namespace, value).map_err(|err| match err {
                NameError::BadName { part, .. } => NameError::BadName {
                    value: value.to_owned(),
                    part,
                },
                other => other,
            })
        }
    }
}

fn is_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Whether `s` is a DNS subdomain as Kubernetes names objects (nodes, most kinds): at most 253
/// bytes of dot-separated lowercase labels. For names received from callers that must name
/// something real.
pub fn is_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_label)
}

/// The longest host name handed out (option 12): a DNS label's limit, and Linux's.
pub const MAX_HOST_NAME: usize = 63;

/// The host name a VirtualMachine named `vm_name` gets: its name cut to [`MAX_HOST_NAME`]
/// bytes, as KubeVirt names guests on the pod network, without a trailing `-` or `.` the cut
/// may leave. `None` if nothing valid remains (not a Kubernetes name).
pub fn host_name_of(vm_name: &str) -> Option<String> {
    let cut = vm_name.get(..MAX_HOST_NAME).unwrap_or(vm_name);
    let name = cut.trim_end_matches(['-', '.']);
    is_host_name(name).then(|| name.to_owned())
}

/// Whether `s` is a host name we hand out: at most [`MAX_HOST_NAME`] bytes of dot-separated
/// DNS-1123 labels. Names read back from status or the stream are checked with it, since
/// anyone allowed to write them could put anything there.
pub fn is_host_name(s: &str) -> bool {
    s.len() <= MAX_HOST_NAME && is_subdomain(s)
}

impl FromStr for NamespacedName {
    type Err = NameError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let (namespace, name) =
            value
                .split_once('/')
                .ok_or_else(|| NameError::MissingNamespace {
                    value: value.to_owned(),
                })?;
        if !is_label(namespace) {
            return Err(NameError::BadNamespace {
                value: value.to_owned(),
                part: namespace.to_owned(),
            });
        }
        if !is_subdomain(name) {
            return Err(NameError::BadName {
                value: value.to_owned(),
                part: name.to_owned(),
            });
        }
        Ok(NamespacedName {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    }
}

impl fmt::Display for NamespacedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl fmt::Debug for NamespacedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NamespacedName({self})")
    }
}

impl Serialize for NamespacedName {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for NamespacedName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn host_names_are_vm_names_cut_to_one_label_length() {
        assert_eq!(host_name_of("vm-1").as_deref(), Some("vm-1"));
        assert_eq!(host_name_of("web.prod").as_deref(), Some("web.prod"));
        let long = format!("{}-{}", "a".repeat(62), "b".repeat(10));
        assert_eq!(
            host_name_of(&long),
            Some("a".repeat(62)),
            "the cut drops the dangling '-'"
        );
        assert_eq!(host_name_of("Not_A_Name"), None);
        assert_eq!(host_name_of(""), None);
        assert!(is_host_name("vm-1"));
        assert!(!is_host_name(&"a".repeat(64)));
        assert!(!is_host_name("vm 1"));
        assert!(!is_host_name("-vm"));
    }

    use super::*;

    #[test]
    fn parses_and_displays() {
        let r: NamespacedName = "default/net-48".parse().unwrap();
        assert_eq!(
            (r.namespace.as_str(), r.name.as_str()),
            ("default", "net-48")
        );
        assert_eq!(r.to_string(), "default/net-48");
        let dotted: NamespacedName = "kube-system/a.b-c".parse().unwrap();
        assert_eq!(dotted.name, "a.b-c");
    }

    #[test]
    fn bare_name_takes_default_namespace() {
        let r = NamespacedName::parse_in("net-48", "vms").unwrap();
        assert_eq!(r.to_string(), "vms/net-48");
        let r = NamespacedName::parse_in("other/net-48", "vms").unwrap();
        assert_eq!(r.to_string(), "other/net-48");
    }

    #[test]
    fn rejects_invalid_parts_with_specific_errors() {
        assert!(matches!(
            "net-48".parse::<NamespacedName>(),
            Err(NameError::MissingNamespace { .. })
        ));
        assert!(matches!(
            "/net".parse::<NamespacedName>(),
            Err(NameError::BadNamespace { .. })
        ));
        assert!(matches!(
            "Default/net".parse::<NamespacedName>(),
            Err(NameError::BadNamespace { .. })
        ));
        assert!(matches!(
            "a.b/net".parse::<NamespacedName>(),
            Err(NameError::BadNamespace { .. })
        ));
        assert!(matches!(
            "default/".parse::<NamespacedName>(),
            Err(NameError::BadName { .. })
        ));
        assert!(matches!(
            "default/a/b".parse::<NamespacedName>(),
            Err(NameError::BadName { .. })
        ));
        assert!(matches!(
            "default/-x".parse::<NamespacedName>(),
            Err(NameError::BadName { .. })
        ));
        assert!(
            matches!(NamespacedName::parse_in("Bad", "ns"), Err(NameError::BadName { value, .. }) if value == "Bad")
        );
        let long = format!("ns/{}", "a".repeat(64));
        assert!(matches!(
            long.parse::<NamespacedName>(),
            Err(NameError::BadName { .. })
        ));
    }
}
