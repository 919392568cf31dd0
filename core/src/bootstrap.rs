//! The agent Deployment's bootstrap: `AGENT_NETWORK_CONFIGS`, `IPPOOL_REFS_JSON` and the Multus
//! network-selection annotation, in the JSON of upstream PR #64 (docs/design.md, contract 2).
//!
//! The controller renders these from its active pools; an agent parses them at start so it knows
//! its pools before (or without) the config stream. Parsing is strict and every error names the
//! variable, the entry, the field and the value, because an operator reading a crash-looping or
//! unready agent has nothing else to go on.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ifname;
use crate::names::NamespacedName;
use crate::pool::v6::not_a_host_v6;
use crate::pool::{PoolConfig, is_host_of};

/// Env var holding the JSON list of [`AgentNetworkConfig`].
pub const ENV_AGENT_NETWORK_CONFIGS: &str = "AGENT_NETWORK_CONFIGS";
/// Env var holding the JSON list of served pools, `["ns/name", …]`.
pub const ENV_IPPOOL_REFS_JSON: &str = "IPPOOL_REFS_JSON";
/// Pod-template annotation through which Multus attaches the agent to each pool's network.
pub const MULTUS_NETWORKS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/networks";

/// Why bootstrap env could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BootstrapError {
    /// Not JSON at all.
    #[error("{var} is not valid JSON ({reason}): {value:?}")]
    Json {
        /// The variable.
        var: &'static str,
        /// The text, truncated for the message.
        value: String,
        /// The parser's complaint.
        reason: String,
    },
    /// JSON, but not a list.
    #[error("{var} must be a JSON list, got {value}")]
    NotAList {
        /// The variable.
        var: &'static str,
        /// The value, truncated.
        value: String,
    },
    /// An entry or one of its fields is missing, mistyped or invalid.
    #[error("{var}[{index}].{field} = {value}: {reason}")]
    Field {
        /// The variable.
        var: &'static str,
        /// Position of the entry in the list.
        index: usize,
        /// The field's JSON name (empty for a whole entry).
        field: &'static str,
        /// The offending value as JSON (or `<missing>`).
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// Two entries claim the same pool or interface.
    #[error("{var}[{index}].{field} = {value:?} duplicates an earlier entry")]
    Duplicate {
        /// The variable.
        var: &'static str,
        /// Position of the later entry.
        index: usize,
        /// The field that repeats.
        field: &'static str,
        /// The repeated value.
        value: String,
    },
}

/// One pool the agent serves and the interface Multus gives it for that pool's network.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentNetworkConfig {
    /// The agent-side interface (the `@ifname` of the Multus selection).
    pub interface_name: String,
    /// The server address to configure on that interface.
    #[serde(rename = "serverIP")]
    pub server_ip: Ipv4Addr,
    /// The pool's subnet; the interface gets `serverIP/prefix`.
    pub cidr: Ipv4Net,
    /// The pool, `namespace/name` (PR #64 writes the same value as `ipPoolRef`).
    pub ip_pool_name: NamespacedName,
    /// The pool, `namespace/name`.
    pub ip_pool_ref: NamespacedName,
    /// The NetworkAttachmentDefinition, `namespace/name`.
    pub nad_name: NamespacedName,
    /// The IPv6 server address of a dual-stack pool (experimental; ours, not PR #64's: older
    /// agents read fields by name and ignore it).
    #[serde(
        rename = "serverIPv6",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub server_ipv6: Option<Ipv6Addr>,
    /// The dual-stack pool's IPv6 subnet; the interface gets `serverIPv6/prefix`.
    #[serde(rename = "cidrV6", default, skip_serializing_if = "Option::is_none")]
    pub cidr_v6: Option<Ipv6Net>,
}

impl From<&PoolConfig> for AgentNetworkConfig {
    fn from(cfg: &PoolConfig) -> Self {
        AgentNetworkConfig {
            interface_name: cfg.interface_name.clone(),
            server_ip: cfg.server_ip,
            cidr: cfg.subnet,
            ip_pool_name: cfg.pool.clone(),
            ip_pool_ref: cfg.pool.clone(),
            nad_name: cfg.network.clone(),
            server_ipv6: cfg.ipv6.as_ref().map(|v6| v6.server_ip),
            cidr_v6: cfg.ipv6.as_ref().map(|v6| v6.subnet),
        }
    }
}

/// The whole bootstrap of an agent Deployment, in canonical (pool-sorted) order so that an
/// unchanged set of pools renders byte-identical env and the controller writes nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bootstrap {
    /// One entry per active pool, sorted by pool.
    pub network_configs: Vec<AgentNetworkConfig>,
    /// The active pools, sorted.
    pub pool_refs: Vec<NamespacedName>,
}

impl Bootstrap {
    /// The bootstrap for a set of pool configs.
    pub fn from_pools<'a>(pools: impl IntoIterator<Item = &'a PoolConfig>) -> Self {
        let mut network_configs: Vec<AgentNetworkConfig> =
            pools.into_iter().map(Into::into).collect();
        network_configs.sort_by(|a, b| a.ip_pool_ref.cmp(&b.ip_pool_ref));
        network_configs.dedup_by(|a, b| a.ip_pool_ref == b.ip_pool_ref);
        let pool_refs = network_configs
            .iter()
            .map(|c| c.ip_pool_ref.clone())
            .collect();
        Bootstrap {
            network_configs,
            pool_refs,
        }
    }

    /// Parses both env values (as read; `None` or blank means `[]`).
    pub fn parse(
        network_configs: Option<&str>,
        pool_refs: Option<&str>,
    ) -> Result<Self, BootstrapError> {
        Ok(Bootstrap {
            network_configs: parse_network_configs(network_configs.unwrap_or("[]"))?,
            pool_refs: parse_pool_refs(pool_refs.unwrap_or("[]"))?,
        })
    }

    /// `AGENT_NETWORK_CONFIGS`.
    pub fn render_network_configs(&self) -> String {
        serde_json::to_string(&self.network_configs).unwrap_or_else(|_| "[]".to_owned())
    }

    /// `IPPOOL_REFS_JSON`.
    pub fn render_pool_refs(&self) -> String {
        serde_json::to_string(&self.pool_refs).unwrap_or_else(|_| "[]".to_owned())
    }

    /// The Multus annotation value: `ns/nad@ifname` for each pool, comma-separated.
    pub fn render_multus_networks(&self) -> String {
        self.network_configs
            .iter()
            .map(|c| format!("{}@{}", c.nad_name, c.interface_name))
            .collect::<Vec<_>>()
            .join(",")
    }
}

fn truncate(s: &str) -> String {
    const MAX: usize = 200;
    match s.char_indices().nth(MAX) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_owned(),
    }
}

fn parse_list(var: &'static str, text: &str) -> Result<Vec<Value>, BootstrapError> {
    let text = if text.trim().is_empty() { "[]" } else { text };
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Array(items)) => Ok(items),
        Ok(other) => Err(BootstrapError::NotAList {
            var,
            value: truncate(&other.to_string()),
        }),
        Err(e) => Err(BootstrapError::Json {
            var,
            value: truncate(text),
            reason: e.to_string(),
        }),
    }
}

/// Parses `AGENT_NETWORK_CONFIGS`: every field present and valid, the server address a host of
/// the subnet, and no pool or interface named twice.
pub fn parse_network_configs(text: &str) -> Result<Vec<AgentNetworkConfig>, BootstrapError> {
    const VAR: &str = ENV_AGENT_NETWORK_CONFIGS;
    let mut out: Vec<AgentNetworkConfig> = Vec::new();
    let (mut pools, mut ifaces) = (BTreeSet::new(), BTreeSet::new());
    for (index, item) in parse_list(VAR, text)?.into_iter().enumerate() {
        let field_err =
            |field: &'static str, value: Option<&Value>, reason: String| BootstrapError::Field {
                var: VAR,
                index,
                field,
                value: value.map_or_else(|| "<missing>".to_owned(), |v| truncate(&v.to_string())),
                reason,
            };
        let Value::Object(obj) = &item else {
            return Err(field_err("", Some(&item), "must be a JSON object".into()));
        };
        let string = |field: &'static str| -> Result<&str, BootstrapError> {
            match obj.get(field) {
                Some(Value::String(s)) => Ok(s.as_str()),
                other => Err(field_err(field, other, "must be a string".into())),
            }
        };
        let reference = |field: &'static str| -> Result<NamespacedName, BootstrapError> {
            let s = string(field)?;
            s.parse()
                .map_err(|e| field_err(field, obj.get(field), format!("{e}")))
        };

        let interface_name = string("interfaceName")?.to_owned();
        ifname::validate(&interface_name)
            .map_err(|e| field_err("interfaceName", obj.get("interfaceName"), e.to_string()))?;
        let server_ip: Ipv4Addr = string("serverIP")?.parse().map_err(|_| {
            field_err(
                "serverIP",
                obj.get("serverIP"),
                "is not an IPv4 address".into(),
            )
        })?;
        let cidr: Ipv4Net = string("cidr")?.parse().map_err(|_| {
            field_err(
                "cidr",
                obj.get("cidr"),
                "is not an IPv4 CIDR (e.g. 192.168.48.0/24)".into(),
            )
        })?;
        if !is_host_of(cidr.trunc(), server_ip) {
            return Err(field_err(
                "serverIP",
                obj.get("serverIP"),
                format!("is not a host address of {}", cidr.trunc()),
            ));
        }
        let ip_pool_ref = reference("ipPoolRef")?;
        let ip_pool_name = match obj.get("ipPoolName") {
            None => ip_pool_ref.clone(),
            Some(_) => reference("ipPoolName")?,
        };
        let nad_name = reference("nadName")?;
        // Optional, together: the IPv6 side of a dual-stack pool.
        let (server_ipv6, cidr_v6) = match (obj.get("serverIPv6"), obj.get("cidrV6")) {
            (None, None) => (None, None),
            (server, cidr) => {
                let server_ipv6: Ipv6Addr = string("serverIPv6")?.parse().map_err(|_| {
                    field_err("serverIPv6", server, "is not an IPv6 address".into())
                })?;
                let cidr_v6: Ipv6Net = string("cidrV6")?.parse().map_err(|_| {
                    field_err(
                        "cidrV6",
                        cidr,
                        "is not an IPv6 CIDR (e.g. fd00::/112)".into(),
                    )
                })?;
                if let Some(reason) = not_a_host_v6(cidr_v6.trunc(), server_ipv6) {
                    return Err(field_err("serverIPv6", server, reason));
                }
                (Some(server_ipv6), Some(cidr_v6))
            }
        };

        if !pools.insert(ip_pool_ref.clone()) {
            return Err(BootstrapError::Duplicate {
                var: VAR,
                index,
                field: "ipPoolRef",
                value: ip_pool_ref.to_string(),
            });
        }
        if !ifaces.insert(interface_name.clone()) {
            return Err(BootstrapError::Duplicate {
                var: VAR,
                index,
                field: "interfaceName",
                value: interface_name,
            });
        }
        out.push(AgentNetworkConfig {
            interface_name,
            server_ip,
            cidr,
            ip_pool_name,
            ip_pool_ref,
            nad_name,
            server_ipv6,
            cidr_v6,
        });
    }
    Ok(out)
}

/// Parses `IPPOOL_REFS_JSON`: a list of distinct `namespace/name` strings.
pub fn parse_pool_refs(text: &str) -> Result<Vec<NamespacedName>, BootstrapError> {
    const VAR: &str = ENV_IPPOOL_REFS_JSON;
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for (index, item) in parse_list(VAR, text)?.into_iter().enumerate() {
        let err = |reason: String| BootstrapError::Field {
            var: VAR,
            index,
            field: "",
            value: truncate(&item.to_string()),
            reason,
        };
        let Value::String(s) = &item else {
            return Err(err("must be a \"namespace/name\" string".into()));
        };
        let r: NamespacedName = s.parse().map_err(|e| err(format!("{e}")))?;
        if !seen.insert(r.clone()) {
            return Err(BootstrapError::Duplicate {
                var: VAR,
                index,
                field: "",
                value: r.to_string(),
            });
        }
        out.push(r);
    }
    Ok(out)
}

/// The interfaces a pod's Multus network-selection annotation gives it, in order: `@ifname`
/// (comma form) or `"interface"` (JSON form) where named, else `net1`, `net2`, … by position,
/// as Multus names them. Each is checked as a kernel interface name; none may repeat.
pub fn multus_interfaces(annotation: &str) -> Result<Vec<String>, BootstrapError> {
    const VAR: &str = MULTUS_NETWORKS_ANNOTATION;
    let text = annotation.trim();
    let named: Vec<Option<String>> = if text.starts_with('[') {
        parse_list(VAR, text)?
            .iter()
            .enumerate()
            .map(|(index, item)| match item.get("interface") {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(name)) => Ok(Some(name.clone())),
                Some(other) => Err(BootstrapError::Field {
                    var: VAR,
                    index,
                    field: "interface",
                    value: truncate(&other.to_string()),
                    reason: "must be a string".into(),
                }),
            })
            .collect::<Result<_, _>>()?
    } else {
        text.split(',')
            .map(str::trim)
            .filter(|entry| !entry.is_empty())
            .map(|entry| entry.split_once('@').map(|(_, name)| name.to_owned()))
            .collect()
    };
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(named.len());
    for (index, name) in named.into_iter().enumerate() {
        let name = name.unwrap_or_else(|| format!("net{}", index + 1));
        ifname::validate(&name).map_err(|e| BootstrapError::Field {
            var: VAR,
            index,
            field: "interface",
            value: truncate(&name),
            reason: e.to_string(),
        })?;
        if !seen.insert(name.clone()) {
            return Err(BootstrapError::Duplicate {
                var: VAR,
                index,
                field: "interface",
                value: name,
            });
        }
        out.push(name);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PR64_CONFIGS: &str = r#"[{"interfaceName":"net0","serverIP":"192.168.48.77","cidr":"192.168.48.0/24","ipPoolName":"default/net-48","ipPoolRef":"default/net-48","nadName":"default/net-48"}]"#;

    #[test]
    fn parses_pr64_example() {
        let b = Bootstrap::parse(Some(PR64_CONFIGS), Some(r#"["default/net-48"]"#)).unwrap();
        assert_eq!(b.network_configs.len(), 1);
        let c = &b.network_configs[0];
        assert_eq!(c.interface_name, "net0");
        assert_eq!(c.server_ip, Ipv4Addr::new(192, 168, 48, 77));
        assert_eq!(c.cidr.to_string(), "192.168.48.0/24");
        assert_eq!(c.ip_pool_ref.to_string(), "default/net-48");
        assert_eq!(b.pool_refs, std::slice::from_ref(&c.ip_pool_ref));
        assert_eq!(b.render_network_configs(), PR64_CONFIGS);
        assert_eq!(b.render_pool_refs(), r#"["default/net-48"]"#);
        assert_eq!(b.render_multus_networks(), "default/net-48@net0");
    }

    /// A dual-stack pool's entry carries its IPv6 server and subnet under names of ours; PR
    /// #64's fields and order are unchanged, so an agent that reads only those still boots.
    #[test]
    fn a_dual_stack_entry_carries_its_ipv6_side_and_round_trips() {
        let pool = crate::fixtures::dual_stack_pool();
        let cfg = crate::pool::PoolConfig::from_ippool(&pool, "vmd0").unwrap();
        let b = Bootstrap::from_pools([&cfg]);
        let text = b.render_network_configs();
        assert!(
            text.ends_with(
                r#""nadName":"default/vm-net-dual","serverIPv6":"fd00::2","cidrV6":"fd00::/112"}]"#
            ),
            "{text}"
        );
        let again = Bootstrap::parse(Some(&text), Some(&b.render_pool_refs())).unwrap();
        assert_eq!(again, b);
        assert_eq!(
            again.network_configs[0].server_ipv6,
            Some("fd00::2".parse().unwrap())
        );
        // An IPv4-only pool renders exactly PR #64's entry.
        assert!(!PR64_CONFIGS.contains("IPv6"));
    }

    #[test]
    fn empty_means_idle() {
        for v in [None, Some(""), Some("  "), Some("[]")] {
            assert_eq!(Bootstrap::parse(v, v).unwrap(), Bootstrap::default());
        }
    }

    #[test]
    fn errors_name_variable_entry_field_and_value() {
        let entry = |patch: &str| {
            let mut v: Value = serde_json::from_str(PR64_CONFIGS).unwrap();
            let p: Value = serde_json::from_str(patch).unwrap();
            for (k, val) in p.as_object().unwrap() {
                if val.is_null() {
                    v[0].as_object_mut().unwrap().remove(k);
                } else {
                    v[0][k] = val.clone();
                }
            }
            v.to_string()
        };
        let cases = [
            (
                entry(r#"{"serverIP":"192.168.48.300"}"#),
                "AGENT_NETWORK_CONFIGS[0].serverIP = \"192.168.48.300\": is not an IPv4 address",
            ),
            (
                entry(r#"{"serverIP":"10.0.0.1"}"#),
                "AGENT_NETWORK_CONFIGS[0].serverIP = \"10.0.0.1\": is not a host address of 192.168.48.0/24",
            ),
            (
                entry(r#"{"cidr":"192.168.48.0"}"#),
                "AGENT_NETWORK_CONFIGS[0].cidr = \"192.168.48.0\"",
            ),
            (
                entry(r#"{"interfaceName":"averyveryverylongname"}"#),
                "AGENT_NETWORK_CONFIGS[0].interfaceName = \"averyveryverylongname\"",
            ),
            (
                entry(r#"{"ipPoolRef":"net-48"}"#),
                "AGENT_NETWORK_CONFIGS[0].ipPoolRef = \"net-48\"",
            ),
            (
                entry(r#"{"nadName":null}"#),
                "AGENT_NETWORK_CONFIGS[0].nadName = <missing>: must be a string",
            ),
            (
                entry(r#"{"serverIP":42}"#),
                "AGENT_NETWORK_CONFIGS[0].serverIP = 42: must be a string",
            ),
            (
                entry(r#"{"serverIPv6":"fd00::1"}"#),
                "AGENT_NETWORK_CONFIGS[0].cidrV6 = <missing>: must be a string",
            ),
            (
                entry(r#"{"serverIPv6":"10.0.0.1","cidrV6":"fd00::/112"}"#),
                "AGENT_NETWORK_CONFIGS[0].serverIPv6 = \"10.0.0.1\": is not an IPv6 address",
            ),
            (
                entry(r#"{"serverIPv6":"fd01::1","cidrV6":"fd00::/112"}"#),
                "AGENT_NETWORK_CONFIGS[0].serverIPv6 = \"fd01::1\": is outside cidr fd00::/112",
            ),
            (
                entry(r#"{"serverIPv6":"fd00::1","cidrV6":"fd00::"}"#),
                "AGENT_NETWORK_CONFIGS[0].cidrV6 = \"fd00::\": is not an IPv6 CIDR",
            ),
            (
                "[1]".to_owned(),
                "AGENT_NETWORK_CONFIGS[0]. = 1: must be a JSON object",
            ),
            ("{}".to_owned(), "AGENT_NETWORK_CONFIGS must be a JSON list"),
            ("[{".to_owned(), "AGENT_NETWORK_CONFIGS is not valid JSON"),
        ];
        for (text, want) in cases {
            let err = parse_network_configs(&text).unwrap_err().to_string();
            assert!(err.contains(want), "{text}\n  got:  {err}\n  want: {want}");
        }
        let err = parse_pool_refs(r#"["default/a", 7]"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("IPPOOL_REFS_JSON[1]. = 7"), "{err}");
        let err = parse_pool_refs(r#"["default/a", "default/a"]"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("duplicates"), "{err}");
    }

    #[test]
    fn duplicate_pools_and_interfaces_are_refused() {
        let two = |a: &str, b: &str| {
            let one: Value = serde_json::from_str(PR64_CONFIGS).unwrap();
            let mut second = one[0].clone();
            second["interfaceName"] = Value::String(a.to_owned());
            second["ipPoolRef"] = Value::String(b.to_owned());
            Value::Array(vec![one[0].clone(), second]).to_string()
        };
        assert!(matches!(
            parse_network_configs(&two("net1", "default/net-48")),
            Err(BootstrapError::Duplicate {
                field: "ipPoolRef",
                ..
            })
        ));
        assert!(matches!(
            parse_network_configs(&two("net0", "default/other")),
            Err(BootstrapError::Duplicate {
                field: "interfaceName",
                ..
            })
        ));
        assert!(parse_network_configs(&two("net1", "default/other")).is_ok());
    }

    #[test]
    fn rendering_is_canonical_and_round_trips() {
        let pool = crate::fixtures::readme_pool();
        let mut other = pool.clone();
        other.metadata.name = Some("aaa".into());
        other.spec.network_name = "default/aaa".into();
        let names = ifname::assign([
            &"default/net-48".parse().unwrap(),
            &"default/aaa".parse().unwrap(),
        ]);
        let cfg = |p: &crate::crd::IPPool| {
            let r = crate::pool::pool_ref(p).unwrap();
            PoolConfig::from_ippool(p, &names[&r]).unwrap()
        };
        let (a, b) = (cfg(&pool), cfg(&other));
        let one = Bootstrap::from_pools([&a, &b]);
        let two = Bootstrap::from_pools([&b, &a]);
        assert_eq!(one, two);
        assert_eq!(one.pool_refs[0].to_string(), "default/aaa");
        let parsed = Bootstrap::parse(
            Some(&one.render_network_configs()),
            Some(&one.render_pool_refs()),
        )
        .unwrap();
        assert_eq!(parsed, one);
        assert_eq!(
            one.render_multus_networks(),
            format!(
                "default/aaa@{},default/net-48@{}",
                b.interface_name, a.interface_name
            )
        );
    }

    #[test]
    fn multus_interfaces_are_read_from_either_form_named_or_by_position() {
        assert_eq!(multus_interfaces("").unwrap(), Vec::<String>::new());
        assert_eq!(
            multus_interfaces("default/net-a@vmd0a1, vms/net-b").unwrap(),
            ["vmd0a1", "net2"]
        );
        assert_eq!(
            multus_interfaces(
                r#"[{"name":"net-a","namespace":"default","interface":"pool0"},{"name":"net-b"}]"#
            )
            .unwrap(),
            ["pool0", "net2"]
        );
        let err = multus_interfaces("a@x,b@x").unwrap_err();
        assert!(
            matches!(err, BootstrapError::Duplicate { index: 1, .. }),
            "{err}"
        );
        let err = multus_interfaces("a@../etc").unwrap_err().to_string();
        assert!(err.contains("[0].interface"), "{err}");
        let err = multus_interfaces(r#"[{"interface":7}]"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("must be a string"), "{err}");
        assert!(matches!(
            multus_interfaces("[not json"),
            Err(BootstrapError::Json { .. })
        ));
    }
}
