//! Conversions between wire messages and the domain model.
//!
//! Outbound (domain → wire) cannot fail. Inbound (wire → domain) checks every field and names the
//! message, the field and the value it rejects, because whatever arrives from the network is
//! untrusted until it has passed here: an agent applies nothing that failed to convert.

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use vmdhcp_core::crd::{BootConfig, DhcpOptions, DhcpPrivateOption, IPv6BootConfig};
use vmdhcp_core::pool::spec::MIN_MTU;
use vmdhcp_core::pool::v6::not_a_host_v6;
use vmdhcp_core::pool::{
    Binding, Boot, BootV6, DEFAULT_LEASE_SECONDS, Lease, NicOptions, PoolConfig, PoolConfigV6,
    PoolError, Route, is_host_of,
};
use vmdhcp_core::{MacAddr, NamespacedName, ifname};

use crate::agent::v1 as pb;

/// A wire message holds a value the domain model cannot take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}.{field} = {value:?}: {reason}")]
pub struct ConvertError {
    /// The message type, e.g. `PoolConfig`.
    pub message: &'static str,
    /// The field.
    pub field: &'static str,
    /// The rejected value.
    pub value: String,
    /// What is wrong.
    pub reason: String,
}

fn err(
    message: &'static str,
    field: &'static str,
    value: &str,
    reason: impl Into<String>,
) -> ConvertError {
    ConvertError {
        message,
        field,
        value: value.to_owned(),
        reason: reason.into(),
    }
}

fn reference(
    message: &'static str,
    field: &'static str,
    value: &str,
) -> Result<NamespacedName, ConvertError> {
    value
        .parse()
        .map_err(|e| err(message, field, value, format!("{e}")))
}

fn ipv4(message: &'static str, field: &'static str, value: &str) -> Result<Ipv4Addr, ConvertError> {
    value
        .parse()
        .map_err(|_| err(message, field, value, "is not an IPv4 address"))
}

fn ipv6(message: &'static str, field: &'static str, value: &str) -> Result<Ipv6Addr, ConvertError> {
    value
        .parse()
        .map_err(|_| err(message, field, value, "is not an IPv6 address"))
}

/// An optional IPv6 address: empty is none.
fn optional_ipv6(
    message: &'static str,
    field: &'static str,
    value: &str,
) -> Result<Option<Ipv6Addr>, ConvertError> {
    match value {
        "" => Ok(None),
        v => ipv6(message, field, v).map(Some),
    }
}

fn mac(message: &'static str, field: &'static str, value: &str) -> Result<MacAddr, ConvertError> {
    value
        .parse()
        .map_err(|e| err(message, field, value, format!("{e}")))
}

/// An optional host name: empty is none, anything else must be one we would hand out.
fn host_name(message: &'static str, value: &str) -> Result<Option<String>, ConvertError> {
    if value.is_empty() {
        return Ok(None);
    }
    if !vmdhcp_core::names::is_host_name(value) {
        return Err(err(
            message,
            "host_name",
            value,
            "is not a host name (dot-separated DNS-1123 labels, at most 63 bytes)",
        ));
    }
    Ok(Some(value.to_owned()))
}

impl From<&PoolConfig> for pb::PoolConfig {
    fn from(c: &PoolConfig) -> Self {
        pb::PoolConfig {
            pool_ref: c.pool.to_string(),
            network_name: c.network.to_string(),
            interface_name: c.interface_name.clone(),
            server_ip: c.server_ip.to_string(),
            cidr: c.subnet.to_string(),
            router: c.router.map(|r| r.to_string()).unwrap_or_default(),
            dns: c.dns.iter().map(ToString::to_string).collect(),
            domain_name: c.domain_name.clone().unwrap_or_default(),
            domain_search: c.domain_search.clone(),
            ntp: c.ntp.clone(),
            lease_time_seconds: c.lease_seconds,
            mtu: c.mtu.map(u32::from).unwrap_or_default(),
            routes: c
                .routes
                .iter()
                .map(|r| pb::StaticRoute {
                    destination: r.destination.to_string(),
                    gateway: r.gateway.to_string(),
                })
                .collect(),
            conflicted: c.conflicted.iter().map(ToString::to_string).collect(),
            ipv6: c.ipv6.as_ref().map(pb::PoolConfigV6::from),
            boot: c.boot.as_ref().map(|b| pb::Boot {
                next_server: b.next_server.map(|s| s.to_string()).unwrap_or_default(),
                tftp_server_name: b.tftp_server_name.clone().unwrap_or_default(),
                bios_file: b.bios_file.clone().unwrap_or_default(),
                uefi_file: b.uefi_file.clone().unwrap_or_default(),
                uefi_http_url: b.uefi_http_url.clone().unwrap_or_default(),
                ipxe_script_url: b.ipxe_script_url.clone().unwrap_or_default(),
            }),
        }
    }
}

/// `value`, `None` when empty (proto3's unset string).
fn set(value: &str) -> Option<String> {
    Some(value.to_owned()).filter(|v| !v.is_empty())
}

/// A boot block from the stream, through the same checks as the IPPool's (so no agent serves a
/// boot file the webhook would have refused); `None` when it names no file.
fn boot(pool: &NamespacedName, b: &pb::Boot) -> Result<Option<Boot>, ConvertError> {
    let spec = BootConfig {
        next_server: set(&b.next_server),
        tftp_server_name: set(&b.tftp_server_name),
        bios_file: set(&b.bios_file),
        uefi_file: set(&b.uefi_file),
        uefi_http_url: set(&b.uefi_http_url),
        ipxe_script_url: set(&b.ipxe_script_url),
    };
    Boot::parse(pool, &spec).map_err(|e| boot_error("Boot", e))
}

/// [`boot`] for DHCPv6.
fn boot_v6(pool: &NamespacedName, b: &pb::BootV6) -> Result<Option<BootV6>, ConvertError> {
    let spec = IPv6BootConfig {
        uefi_file_url: set(&b.uefi_file_url),
        uefi_http_url: set(&b.uefi_http_url),
        ipxe_script_url: set(&b.ipxe_script_url),
        parameters: b.parameters.clone(),
    };
    BootV6::parse(pool, &spec).map_err(|e| boot_error("BootV6", e))
}

/// A refused boot field, named as the IPPool names it.
fn boot_error(message: &'static str, e: PoolError) -> ConvertError {
    match e {
        PoolError::InvalidField {
            field,
            value,
            reason,
            ..
        } => err(message, "boot", &value, format!("{field} {reason}")),
        other => err(message, "boot", "", other.to_string()),
    }
}

impl From<&PoolConfigV6> for pb::PoolConfigV6 {
    fn from(c: &PoolConfigV6) -> Self {
        pb::PoolConfigV6 {
            server_ip: c.server_ip.to_string(),
            cidr: c.subnet.to_string(),
            dns: c.dns.iter().map(ToString::to_string).collect(),
            lease_time_seconds: c.lease_seconds,
            router_advertisements: c.router_advertisements,
            router: c.router.map(|r| r.to_string()).unwrap_or_default(),
            conflicted: c.conflicted.iter().map(ToString::to_string).collect(),
            boot: c.boot.as_ref().map(|b| pb::BootV6 {
                uefi_file_url: b.uefi_file_url.clone().unwrap_or_default(),
                uefi_http_url: b.uefi_http_url.clone().unwrap_or_default(),
                ipxe_script_url: b.ipxe_script_url.clone().unwrap_or_default(),
                parameters: b.parameters.clone(),
            }),
        }
    }
}

/// The IPv6 side of `pool`'s config from the stream.
fn pool_config_v6(
    pool: &NamespacedName,
    p: &pb::PoolConfigV6,
) -> Result<PoolConfigV6, ConvertError> {
    const M: &str = "PoolConfigV6";
    let server_ip = ipv6(M, "server_ip", &p.server_ip)?;
    let cidr: Ipv6Net = p
        .cidr
        .parse()
        .map_err(|_| err(M, "cidr", &p.cidr, "is not an IPv6 CIDR"))?;
    let subnet = cidr.trunc();
    if let Some(reason) = not_a_host_v6(subnet, server_ip) {
        return Err(err(M, "server_ip", &p.server_ip, reason));
    }
    let dns = p
        .dns
        .iter()
        .map(|d| ipv6(M, "dns", d))
        .collect::<Result<Vec<_>, _>>()?;
    let lease_seconds = match p.lease_time_seconds {
        0 => DEFAULT_LEASE_SECONDS,
        t => t,
    };
    Ok(PoolConfigV6 {
        server_ip,
        subnet,
        dns,
        lease_seconds,
        router_advertisements: p.router_advertisements,
        router: optional_ipv6(M, "router", &p.router)?,
        conflicted: p
            .conflicted
            .iter()
            .map(|c| ipv6(M, "conflicted", c))
            .collect::<Result<Vec<_>, _>>()?,
        boot: p
            .boot
            .as_ref()
            .map(|b| boot_v6(pool, b))
            .transpose()?
            .flatten(),
    })
}

impl TryFrom<&pb::PoolConfig> for PoolConfig {
    type Error = ConvertError;

    fn try_from(p: &pb::PoolConfig) -> Result<Self, Self::Error> {
        const M: &str = "PoolConfig";
        let pool = reference(M, "pool_ref", &p.pool_ref)?;
        let network = reference(M, "network_name", &p.network_name)?;
        ifname::validate(&p.interface_name)
            .map_err(|e| err(M, "interface_name", &p.interface_name, e.to_string()))?;
        let server_ip = ipv4(M, "server_ip", &p.server_ip)?;
        let cidr: Ipv4Net = p
            .cidr
            .parse()
            .map_err(|_| err(M, "cidr", &p.cidr, "is not an IPv4 CIDR"))?;
        let subnet = cidr.trunc();
        if !is_host_of(subnet, server_ip) {
            return Err(err(
                M,
                "server_ip",
                &p.server_ip,
                format!("is not a host address of {subnet}"),
            ));
        }
        let router = match p.router.as_str() {
            "" => None,
            r => Some(ipv4(M, "router", r)?),
        };
        let dns = p
            .dns
            .iter()
            .map(|d| ipv4(M, "dns", d))
            .collect::<Result<Vec<_>, _>>()?;
        let lease_seconds = if p.lease_time_seconds == 0 {
            DEFAULT_LEASE_SECONDS
        } else {
            p.lease_time_seconds
        };
        let mtu = match p.mtu {
            0 => None,
            m => Some(
                u16::try_from(m)
                    .ok()
                    .filter(|m| *m >= MIN_MTU)
                    .ok_or_else(|| err(M, "mtu", &m.to_string(), "must be between 68 and 65535"))?,
            ),
        };
        let routes = p
            .routes
            .iter()
            .map(|r| {
                let destination: Ipv4Net = r.destination.parse().map_err(|_| {
                    err(
                        M,
                        "routes.destination",
                        &r.destination,
                        "is not an IPv4 CIDR",
                    )
                })?;
                Ok(Route {
                    destination: destination.trunc(),
                    gateway: ipv4(M, "routes.gateway", &r.gateway)?,
                })
            })
            .collect::<Result<Vec<_>, ConvertError>>()?;
        let conflicted = p
            .conflicted
            .iter()
            .map(|c| ipv4(M, "conflicted", c))
            .collect::<Result<Vec<_>, _>>()?;
        let boot = p
            .boot
            .as_ref()
            .map(|b| boot(&pool, b))
            .transpose()?
            .flatten();
        let ipv6 = p
            .ipv6
            .as_ref()
            .map(|v6| pool_config_v6(&pool, v6))
            .transpose()?;
        Ok(PoolConfig {
            pool,
            network,
            interface_name: p.interface_name.clone(),
            server_ip,
            subnet,
            router,
            dns,
            domain_name: Some(p.domain_name.clone()).filter(|d| !d.is_empty()),
            domain_search: p.domain_search.clone(),
            ntp: p.ntp.clone(),
            lease_seconds,
            mtu,
            routes,
            conflicted,
            boot,
            ipv6,
        })
    }
}

impl From<&Lease> for pb::Lease {
    fn from(l: &Lease) -> Self {
        pb::Lease {
            pool_ref: l.pool.to_string(),
            mac_address: l.mac.to_string(),
            ip_address: l.ip.to_string(),
            host_name: l.host_name.clone().unwrap_or_default(),
            ipv6_address: l.ipv6.map(|a| a.to_string()).unwrap_or_default(),
            options: l.options.as_deref().map(pb::NicOptions::from),
        }
    }
}

impl From<&NicOptions> for pb::NicOptions {
    fn from(o: &NicOptions) -> Self {
        pb::NicOptions {
            boot_file_name: o.boot_file_name.clone().unwrap_or_default(),
            tftp_server_name: o.tftp_server_name.clone().unwrap_or_default(),
            ntp_servers: o.ntp_servers.iter().map(ToString::to_string).collect(),
            private_options: o
                .private
                .iter()
                .map(|(option, value)| pb::PrivateOption {
                    option: u32::from(*option),
                    value: value.clone(),
                })
                .collect(),
        }
    }
}

/// A NIC's options from the stream, through the rules the config webhook applies (so no agent
/// serves an option KubeVirt would refuse); `None` when they set nothing.
fn nic_options(
    message: &'static str,
    o: Option<&pb::NicOptions>,
) -> Result<Option<Box<NicOptions>>, ConvertError> {
    let Some(o) = o else {
        return Ok(None);
    };
    let spec = DhcpOptions {
        boot_file_name: set(&o.boot_file_name),
        tftp_server_name: set(&o.tftp_server_name),
        ntp_servers: o.ntp_servers.clone(),
        private_options: o
            .private_options
            .iter()
            .map(|p| DhcpPrivateOption {
                option: i64::from(p.option),
                value: p.value.clone(),
            })
            .collect(),
    };
    match NicOptions::parse(&spec) {
        Ok(parsed) => Ok(parsed.map(Box::new)),
        Err(e) => Err(err(
            message,
            "options",
            e.value(),
            format!("{} {e}", e.path("dhcpOptions")),
        )),
    }
}

/// A snapshot entry for the NIC `mac`.
pub fn lease_entry(mac: &MacAddr, binding: &Binding) -> pb::LeaseEntry {
    pb::LeaseEntry {
        mac_address: mac.to_string(),
        ip_address: binding.ip.to_string(),
        host_name: binding.host_name.clone().unwrap_or_default(),
        ipv6_address: binding.ipv6.map(|a| a.to_string()).unwrap_or_default(),
        options: binding.options.as_deref().map(pb::NicOptions::from),
    }
}

impl TryFrom<&pb::Lease> for Lease {
    type Error = ConvertError;

    fn try_from(l: &pb::Lease) -> Result<Self, Self::Error> {
        const M: &str = "Lease";
        Ok(Lease {
            options: nic_options(M, l.options.as_ref())?,
            pool: reference(M, "pool_ref", &l.pool_ref)?,
            mac: mac(M, "mac_address", &l.mac_address)?,
            ip: ipv4(M, "ip_address", &l.ip_address)?,
            host_name: host_name(M, &l.host_name)?,
            ipv6: optional_ipv6(M, "ipv6_address", &l.ipv6_address)?,
        })
    }
}

/// A lease of `pool` from a snapshot entry.
pub fn lease_from_entry(pool: &NamespacedName, e: &pb::LeaseEntry) -> Result<Lease, ConvertError> {
    const M: &str = "LeaseEntry";
    Ok(Lease {
        options: nic_options(M, e.options.as_ref())?,
        pool: pool.clone(),
        mac: mac(M, "mac_address", &e.mac_address)?,
        ip: ipv4(M, "ip_address", &e.ip_address)?,
        host_name: host_name(M, &e.host_name)?,
        ipv6: optional_ipv6(M, "ipv6_address", &e.ipv6_address)?,
    })
}

/// The identity of a lease to withdraw.
pub fn lease_key(k: &pb::LeaseKey) -> Result<(NamespacedName, MacAddr), ConvertError> {
    const M: &str = "LeaseKey";
    Ok((
        reference(M, "pool_ref", &k.pool_ref)?,
        mac(M, "mac_address", &k.mac_address)?,
    ))
}

/// A pool reference from a list of removed pools.
pub fn removed_pool(value: &str) -> Result<NamespacedName, ConvertError> {
    reference("Delta", "removed_pools", value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> PoolConfig {
        PoolConfig {
            ipv6: None,
            pool: "default/net-48".parse().unwrap(),
            network: "default/net-48".parse().unwrap(),
            interface_name: "vmdff247118e5".into(),
            server_ip: "192.168.48.77".parse().unwrap(),
            subnet: "192.168.48.0/24".parse().unwrap(),
            router: Some("192.168.48.1".parse().unwrap()),
            dns: vec!["1.1.1.1".parse().unwrap()],
            domain_name: Some("aibao.moe".into()),
            domain_search: vec!["aibao.moe".into()],
            ntp: vec!["pool.ntp.org".into()],
            lease_seconds: 300,
            mtu: Some(1450),
            routes: vec![Route {
                destination: "10.96.0.0/12".parse().unwrap(),
                gateway: "192.168.48.1".parse().unwrap(),
            }],
            conflicted: vec!["192.168.48.90".parse().unwrap()],
            boot: None,
        }
    }

    /// A test double for an agent built from the first published contract: the `PoolConfig`
    /// and `LeaseEntry` it knew (the fields it reads), without the IPv6 ones added since.
    mod first_contract {
        #[derive(Clone, PartialEq, prost::Message)]
        pub struct PoolConfig {
            #[prost(string, tag = "1")]
            pub pool_ref: String,
            #[prost(string, tag = "4")]
            pub server_ip: String,
            #[prost(string, tag = "5")]
            pub cidr: String,
            #[prost(uint32, tag = "11")]
            pub lease_time_seconds: u32,
        }

        #[derive(Clone, PartialEq, prost::Message)]
        pub struct LeaseEntry {
            #[prost(string, tag = "1")]
            pub mac_address: String,
            #[prost(string, tag = "2")]
            pub ip_address: String,
        }
    }

    /// A dual-stack pool's config and lease round-trip, and an agent that predates the IPv6
    /// fields reads the same messages as IPv4 ones: it skips what it does not know.
    #[test]
    fn the_ipv6_side_round_trips_and_an_older_agent_reads_the_ipv4_side() {
        use prost::Message;
        let v6 = PoolConfigV6 {
            conflicted: vec!["fd00::99".parse().unwrap()],
            server_ip: "fd00::1".parse().unwrap(),
            subnet: "fd00::/112".parse().unwrap(),
            dns: vec!["fd00::53".parse().unwrap()],
            lease_seconds: 600,
            router_advertisements: true,
            router: Some("fd00::1".parse().unwrap()),
            boot: None,
        };
        let c = PoolConfig {
            ipv6: Some(v6),
            ..config()
        };
        let wire = pb::PoolConfig::from(&c);
        assert_eq!(PoolConfig::try_from(&wire).unwrap(), c);
        let old = first_contract::PoolConfig::decode(wire.encode_to_vec().as_slice()).unwrap();
        assert_eq!(
            (
                old.server_ip.as_str(),
                old.cidr.as_str(),
                old.lease_time_seconds
            ),
            ("192.168.48.77", "192.168.48.0/24", 300)
        );

        let binding = Binding {
            ipv6: Some("fd00::10".parse().unwrap()),
            ..Binding::ip("192.168.48.83".parse().unwrap())
        };
        let mac: MacAddr = "02:00:00:00:00:01".parse().unwrap();
        let entry = lease_entry(&mac, &binding);
        assert_eq!(entry.ipv6_address, "fd00::10");
        let pool: NamespacedName = "default/net-48".parse().unwrap();
        assert_eq!(lease_from_entry(&pool, &entry).unwrap().binding(), binding);
        let old = first_contract::LeaseEntry::decode(entry.encode_to_vec().as_slice()).unwrap();
        assert_eq!(old.ip_address, "192.168.48.83");

        // Bad IPv6 input is refused, naming the field.
        let mut bad = wire.clone();
        if let Some(v6) = bad.ipv6.as_mut() {
            v6.server_ip = "fd01::1".into();
        }
        let e = PoolConfig::try_from(&bad).unwrap_err().to_string();
        assert!(
            e.contains("PoolConfigV6.server_ip") && e.contains("outside cidr"),
            "{e}"
        );
        let mut bad = wire.clone();
        if let Some(v6) = bad.ipv6.as_mut() {
            v6.conflicted = vec!["192.168.48.90".into()];
        }
        let e = PoolConfig::try_from(&bad).unwrap_err().to_string();
        assert!(e.contains("PoolConfigV6.conflicted"), "{e}");
        let e = lease_from_entry(
            &pool,
            &pb::LeaseEntry {
                ipv6_address: "10.0.0.1".into(),
                ..entry
            },
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("LeaseEntry.ipv6_address"), "{e}");
    }

    #[test]
    fn pool_config_round_trips() {
        let c = config();
        assert_eq!(PoolConfig::try_from(&pb::PoolConfig::from(&c)).unwrap(), c);
        let bare = PoolConfig {
            router: None,
            dns: vec![],
            domain_name: None,
            domain_search: vec![],
            ntp: vec![],
            mtu: None,
            routes: vec![],
            conflicted: vec![],
            ..config()
        };
        assert_eq!(
            PoolConfig::try_from(&pb::PoolConfig::from(&bare)).unwrap(),
            bare
        );
    }

    #[test]
    fn boot_settings_round_trip_and_pass_the_ippool_s_checks() {
        use prost::Message;
        let boot = Boot {
            next_server: Some("192.168.48.5".parse().unwrap()),
            tftp_server_name: Some("tftp.aibao.moe".into()),
            bios_file: Some("undionly.kpxe".into()),
            uefi_file: Some("ipxe.efi".into()),
            uefi_http_url: Some("http://192.168.48.5/ipxe.efi".into()),
            ipxe_script_url: Some("http://192.168.48.5/vm.ipxe".into()),
        };
        let mut c = config();
        c.boot = Some(boot);
        c.ipv6 = Some(PoolConfigV6 {
            conflicted: vec![],
            server_ip: "fd00::1".parse().unwrap(),
            subnet: "fd00::/112".parse().unwrap(),
            dns: vec![],
            lease_seconds: 600,
            router_advertisements: false,
            router: None,
            boot: Some(BootV6 {
                uefi_file_url: Some("tftp://[fd00::5]/ipxe.efi".into()),
                uefi_http_url: None,
                ipxe_script_url: Some("http://[fd00::5]/vm.ipxe".into()),
                parameters: vec!["console=ttyS0".into()],
            }),
        });
        let wire = pb::PoolConfig::from(&c);
        assert_eq!(PoolConfig::try_from(&wire).unwrap(), c);
        // An agent that predates boot serves the pool without it.
        let old = first_contract::PoolConfig::decode(wire.encode_to_vec().as_slice()).unwrap();
        assert_eq!(old.server_ip, "192.168.48.77");
        // A boot message naming no file is no boot.
        let mut empty = wire.clone();
        empty.boot = Some(pb::Boot {
            next_server: "192.168.48.5".into(),
            ..Default::default()
        });
        assert_eq!(PoolConfig::try_from(&empty).unwrap().boot, None);
        // What the webhook refuses, the agent refuses too, naming the field.
        let mut bad = wire.clone();
        if let Some(b) = bad.boot.as_mut() {
            b.uefi_http_url = "ftp://192.168.48.5/ipxe.efi".into();
        }
        let e = PoolConfig::try_from(&bad).unwrap_err().to_string();
        assert!(
            e.contains("Boot.boot") && e.contains("spec.ipv4Config.boot.uefiHttpUrl"),
            "{e}"
        );
        let mut bad = wire;
        if let Some(b) = bad.ipv6.as_mut().and_then(|v6| v6.boot.as_mut()) {
            b.parameters = vec!["x".into(); 9];
        }
        let e = PoolConfig::try_from(&bad).unwrap_err().to_string();
        assert!(e.contains("BootV6.boot"), "{e}");
    }

    #[test]
    fn a_nic_s_options_round_trip_and_kubevirt_s_rules_hold_on_the_stream() {
        use prost::Message;
        let options = NicOptions {
            boot_file_name: Some("pxelinux.0".into()),
            tftp_server_name: Some("192.168.48.5".into()),
            ntp_servers: vec!["192.168.48.123".parse().unwrap()],
            private: vec![(240, "x".into())],
        };
        let binding = Binding {
            options: Some(Box::new(options)),
            ..Binding::ip("192.168.48.83".parse().unwrap())
        };
        let mac: MacAddr = "02:00:00:00:00:01".parse().unwrap();
        let pool: NamespacedName = "default/net-48".parse().unwrap();
        let entry = lease_entry(&mac, &binding);
        assert_eq!(lease_from_entry(&pool, &entry).unwrap().binding(), binding);
        let lease = binding.lease(pool.clone(), mac);
        assert_eq!(Lease::try_from(&pb::Lease::from(&lease)).unwrap(), lease);
        // An agent that predates the field reads the address.
        let old = first_contract::LeaseEntry::decode(entry.encode_to_vec().as_slice()).unwrap();
        assert_eq!(old.ip_address, "192.168.48.83");
        // A code KubeVirt refuses is refused here too, naming the field.
        let mut bad = entry;
        if let Some(o) = bad.options.as_mut() {
            o.private_options[0].option = 300;
        }
        let e = lease_from_entry(&pool, &bad).unwrap_err().to_string();
        assert!(
            e.contains("LeaseEntry.options") && e.contains("privateOptions[0].option"),
            "{e}"
        );
    }

    #[test]
    fn invalid_values_are_named() {
        type Mutation = fn(&mut pb::PoolConfig);
        let cases: [(Mutation, &str); 12] = [
            (
                |p| p.pool_ref = "nope".into(),
                "PoolConfig.pool_ref = \"nope\"",
            ),
            (
                |p| p.server_ip = "999.1.1.1".into(),
                "PoolConfig.server_ip = \"999.1.1.1\"",
            ),
            (
                |p| p.server_ip = "10.0.0.1".into(),
                "is not a host address of 192.168.48.0/24",
            ),
            (|p| p.cidr = "192.168.48.0/40".into(), "PoolConfig.cidr"),
            (|p| p.router = "x".into(), "PoolConfig.router"),
            (|p| p.dns = vec!["1.1.1".into()], "PoolConfig.dns"),
            (
                |p| p.interface_name = "a/b".into(),
                "PoolConfig.interface_name",
            ),
            (|p| p.mtu = 67, "PoolConfig.mtu = \"67\""),
            (
                |p| p.conflicted = vec!["10.0.0.300".into()],
                "PoolConfig.conflicted = \"10.0.0.300\"",
            ),
            (|p| p.mtu = 70_000, "PoolConfig.mtu = \"70000\""),
            (
                |p| p.routes[0].destination = "10.96.0.0".into(),
                "PoolConfig.routes.destination",
            ),
            (
                |p| p.routes[0].gateway = "gw".into(),
                "PoolConfig.routes.gateway",
            ),
        ];
        for (mutate, want) in cases {
            let mut p = pb::PoolConfig::from(&config());
            mutate(&mut p);
            let e = PoolConfig::try_from(&p).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
        let bad = pb::Lease {
            options: None,
            ipv6_address: String::new(),
            pool_ref: "a/b".into(),
            mac_address: "zz".into(),
            ip_address: "1.2.3.4".into(),
            host_name: String::new(),
        };
        assert!(
            Lease::try_from(&bad)
                .unwrap_err()
                .to_string()
                .contains("Lease.mac_address")
        );
    }

    #[test]
    fn host_names_round_trip_and_bad_ones_are_refused_by_field() {
        let lease = Lease {
            options: None,
            ipv6: None,
            pool: "a/b".parse().unwrap(),
            mac: "02:00:00:00:00:01".parse().unwrap(),
            ip: "10.0.0.5".parse().unwrap(),
            host_name: Some("vm-1".into()),
        };
        let wire = pb::Lease::from(&lease);
        assert_eq!(wire.host_name, "vm-1");
        assert_eq!(Lease::try_from(&wire).unwrap(), lease);
        let entry = lease_entry(&lease.mac, &lease.binding());
        assert_eq!(lease_from_entry(&lease.pool, &entry).unwrap(), lease);
        let unnamed = Lease {
            host_name: None,
            ..lease.clone()
        };
        assert_eq!(
            Lease::try_from(&pb::Lease::from(&unnamed)).unwrap(),
            unnamed
        );
        for bad in ["vm 1", "-vm", &"a".repeat(64)] {
            let e = Lease::try_from(&pb::Lease {
                host_name: bad.to_owned(),
                ..wire.clone()
            })
            .unwrap_err()
            .to_string();
            assert!(e.contains("Lease.host_name"), "{e}");
            let e = lease_from_entry(
                &lease.pool,
                &pb::LeaseEntry {
                    host_name: bad.to_owned(),
                    ..entry.clone()
                },
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains("LeaseEntry.host_name"), "{e}");
        }
    }
}
