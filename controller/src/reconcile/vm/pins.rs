//! Static addresses a VirtualMachine's annotations pin to its NICs, with upstream v1.9's
//! semantics (harvester/vm-dhcp-controller PR #157):
//! `static-ip.harvesterhci.io/<nic-name>: "<IPv4>"` pins the NIC named so (an interface of
//! `spec.template.spec.domain.devices.interfaces[]`) to that address through the generated
//! config's `ipAddress`. For a dual-stack pool's IPv6 side, ours: `static-ipv6.vmdhcp.io/<nic>`
//! pins `ipv6Address` the same way (upstream has no IPv6 pin, and keys under
//! `harvesterhci.io` are Harvester's to name).
//!
//! - An annotation naming no interface of the VM, or whose value is not an address of its
//!   family, is skipped with a warning, as upstream does.
//! - Changing one moves the NIC: the config's reconcile releases the old address and gives the
//!   new one (the webhook refuses one that is not free, as for any static request).
//! - Removing one unpins the NIC and keeps its address: the config's `ipAddress` goes, its
//!   allocation stays, and the NIC is dynamic from then on.
//!
//! To tell a pin an annotation made from one an operator wrote on the config itself (which is
//! kept, as before), the config records the pins it got from annotations ([`PINNED_BY_VM`]:
//! `mac=address` pairs separated by commas, both families).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use kube::ResourceExt;
use vmdhcp_core::MacAddr;
use vmdhcp_core::crd::{NetworkConfig, VirtualMachineNetworkConfig};

use crate::kinds::VirtualMachine;

pub use crate::kinds::{
    PINNED_BY_VM_ANNOTATION as PINNED_BY_VM, STATIC_IP_PREFIX, STATIC_IPV6_PREFIX,
};

/// A NIC's pins, by family.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pin {
    /// From `static-ip.harvesterhci.io/<nic>`.
    pub ipv4: Option<Ipv4Addr>,
    /// From `static-ipv6.vmdhcp.io/<nic>`.
    pub ipv6: Option<Ipv6Addr>,
}

/// An annotation that pins nothing, and why (for the log and the VM's Warning event).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// The annotation's key.
    pub key: String,
    /// Why it is skipped.
    pub reason: String,
}

/// The pins of `vm`'s annotations by NIC name, and the annotations skipped.
pub fn pins_of(vm: &VirtualMachine) -> (BTreeMap<String, Pin>, Vec<Skipped>) {
    let interfaces: BTreeSet<&str> = vm
        .template_spec()
        .map(|spec| {
            spec.domain
                .devices
                .interfaces
                .iter()
                .filter_map(|i| i.name.as_deref())
                .collect()
        })
        .unwrap_or_default();
    let mut pins: BTreeMap<String, Pin> = BTreeMap::new();
    let mut skipped = Vec::new();
    for (key, value) in vm.annotations() {
        let (nic, v6) = if let Some(nic) = key.strip_prefix(STATIC_IP_PREFIX) {
            (nic, false)
        } else if let Some(nic) = key.strip_prefix(STATIC_IPV6_PREFIX) {
            (nic, true)
        } else {
            continue;
        };
        let skip = |reason: String| Skipped {
            key: key.clone(),
            reason,
        };
        if !interfaces.contains(nic) {
            skipped.push(skip(format!("the VM has no interface named {nic:?}")));
            continue;
        }
        let value = value.trim();
        let pin = pins.entry(nic.to_owned()).or_default();
        if v6 {
            match value.parse::<Ipv6Addr>() {
                Ok(ip) => pin.ipv6 = Some(ip),
                Err(_) => skipped.push(skip(format!("{value:?} is not an IPv6 address"))),
            }
        } else {
            match value.parse::<Ipv4Addr>() {
                Ok(ip) => pin.ipv4 = Some(ip),
                Err(_) => skipped.push(skip(format!("{value:?} is not an IPv4 address"))),
            }
        }
    }
    pins.retain(|_, p| *p != Pin::default());
    (pins, skipped)
}

/// The pins a config records as made by VM annotations ([`PINNED_BY_VM`]); what does not read
/// is left out (then the config's addresses count as an operator's, and are kept).
pub fn recorded(config: &VirtualMachineNetworkConfig) -> BTreeSet<(MacAddr, IpAddr)> {
    config
        .annotations()
        .get(PINNED_BY_VM)
        .map(|text| {
            text.split(',')
                .filter_map(|pair| {
                    let (mac, ip) = pair.trim().split_once('=')?;
                    Some((mac.parse().ok()?, ip.parse().ok()?))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The [`PINNED_BY_VM`] value for `pinned`; `None` when there is none.
pub fn render(pinned: &BTreeSet<(MacAddr, IpAddr)>) -> Option<String> {
    (!pinned.is_empty()).then(|| {
        pinned
            .iter()
            .map(|(mac, ip)| format!("{mac}={ip}"))
            .collect::<Vec<_>>()
            .join(",")
    })
}

/// Settles each NIC's static addresses, `configs` holding what the VM's annotations pin
/// (`ip_address` / `ipv6_address`, else `None`), against the config as it is (`existing`): an
/// annotation's pin wins; without one, the config's own address is kept unless an annotation
/// put it there (it was removed: unpinned). Returns the pins made by annotations now, for
/// [`PINNED_BY_VM`].
pub fn settle(
    configs: &mut [NetworkConfig],
    existing: Option<&VirtualMachineNetworkConfig>,
) -> BTreeSet<(MacAddr, IpAddr)> {
    let before = existing.map(recorded).unwrap_or_default();
    let mut now = BTreeSet::new();
    for c in configs {
        let Ok(mac) = c.mac_address.parse::<MacAddr>() else {
            continue;
        };
        let current = existing.and_then(|e| {
            e.spec.network_configs.iter().find(|e| {
                e.network_name == c.network_name && e.mac_address.parse::<MacAddr>() == Ok(mac)
            })
        });
        let mut family =
            |pinned: &mut Option<String>, current: Option<&Option<String>>| match pinned
                .as_deref()
                .and_then(|p| p.parse::<IpAddr>().ok())
            {
                Some(ip) => {
                    now.insert((mac, ip));
                }
                None => {
                    *pinned = current.cloned().flatten().filter(|kept| {
                        kept.parse::<IpAddr>()
                            .is_ok_and(|ip| !before.contains(&(mac, ip)))
                    });
                }
            };
        family(&mut c.ip_address, current.map(|e| &e.ip_address));
        family(&mut c.ipv6_address, current.map(|e| &e.ipv6_address));
    }
    now
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn vm(annotations: Value) -> VirtualMachine {
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "vm1", "namespace": "vms", "annotations": annotations},
            "spec": {"template": {"spec": {
                "domain": {"devices": {"interfaces": [{"name": "nic-1"}, {"name": "nic-2"}]}},
                "networks": []}}}
        }))
        .unwrap()
    }

    fn nic(mac: &str, ip: Option<&str>, ipv6: Option<&str>) -> NetworkConfig {
        NetworkConfig {
            dhcp_options: None,
            network_name: "vms/net-a".into(),
            mac_address: mac.into(),
            ip_address: ip.map(str::to_owned),
            ipv6_address: ipv6.map(str::to_owned),
        }
    }

    fn config(nics: Vec<NetworkConfig>, pinned: Option<&str>) -> VirtualMachineNetworkConfig {
        let mut c: VirtualMachineNetworkConfig = serde_json::from_value(json!({
            "apiVersion": "network.harvesterhci.io/v1alpha1", "kind": "VirtualMachineNetworkConfig",
            "metadata": {"name": "vm1", "namespace": "vms"},
            "spec": {"vmName": "vm1"}
        }))
        .unwrap();
        c.spec.network_configs = nics;
        if let Some(p) = pinned {
            c.metadata.annotations = Some([(PINNED_BY_VM.to_owned(), p.to_owned())].into());
        }
        c
    }

    const MAC: &str = "02:00:00:00:00:01";

    #[test]
    fn pins_are_read_per_nic_and_family_and_the_others_skipped_with_a_reason() {
        let (pins, skipped) = pins_of(&vm(json!({
            "static-ip.harvesterhci.io/nic-1": " 10.0.0.50 ",
            "static-ipv6.vmdhcp.io/nic-1": "fd00::50",
            "static-ip.harvesterhci.io/nic-2": "fd00::51",
            "static-ip.harvesterhci.io/nic-9": "10.0.0.9",
            "static-ipv6.vmdhcp.io/nic-2": "10.0.0.52",
            "harvesterhci.io/mac-address": "{}",
        })));
        assert_eq!(
            pins,
            BTreeMap::from([(
                "nic-1".to_owned(),
                Pin {
                    ipv4: Some(Ipv4Addr::new(10, 0, 0, 50)),
                    ipv6: Some("fd00::50".parse().unwrap()),
                }
            )])
        );
        let reasons: Vec<_> = skipped
            .iter()
            .map(|s| (s.key.as_str(), s.reason.as_str()))
            .collect();
        assert_eq!(
            reasons,
            [
                (
                    "static-ip.harvesterhci.io/nic-2",
                    "\"fd00::51\" is not an IPv4 address"
                ),
                (
                    "static-ip.harvesterhci.io/nic-9",
                    "the VM has no interface named \"nic-9\""
                ),
                (
                    "static-ipv6.vmdhcp.io/nic-2",
                    "\"10.0.0.52\" is not an IPv6 address"
                ),
            ]
        );
    }

    #[test]
    fn an_annotation_pins_a_removed_one_unpins_and_an_operator_s_pin_is_kept() {
        // Pinned by the annotation: recorded.
        let mut nics = vec![nic(MAC, Some("10.0.0.50"), None)];
        let pinned = settle(&mut nics, None);
        assert_eq!(nics[0].ip_address.as_deref(), Some("10.0.0.50"));
        let text = render(&pinned).unwrap();
        assert_eq!(text, "02:00:00:00:00:01=10.0.0.50");
        let written = config(nics.clone(), Some(&text));
        assert_eq!(recorded(&written), pinned);

        // Changed: the new pin.
        let mut nics = vec![nic(MAC, Some("10.0.0.60"), None)];
        let pinned = settle(&mut nics, Some(&written));
        assert_eq!(nics[0].ip_address.as_deref(), Some("10.0.0.60"));
        let written = config(nics, render(&pinned).as_deref());

        // Removed: unpinned (the allocation is the config reconcile's to keep).
        let mut nics = vec![nic(MAC, None, None)];
        let pinned = settle(&mut nics, Some(&written));
        assert_eq!(nics[0], nic(MAC, None, None));
        assert_eq!(render(&pinned), None);

        // An operator's pins on the config, either family, with no annotation: kept.
        let operator = config(vec![nic(MAC, Some("10.0.0.70"), Some("fd00::70"))], None);
        let mut nics = vec![nic(MAC, None, None)];
        assert!(settle(&mut nics, Some(&operator)).is_empty());
        assert_eq!(nics[0], nic(MAC, Some("10.0.0.70"), Some("fd00::70")));
        // An operator's pin changed after an annotation's went: kept too.
        let edited = config(
            vec![nic(MAC, Some("10.0.0.71"), None)],
            Some("02:00:00:00:00:01=10.0.0.60"),
        );
        let mut nics = vec![nic(MAC, None, None)];
        settle(&mut nics, Some(&edited));
        assert_eq!(nics[0].ip_address.as_deref(), Some("10.0.0.71"));
        // An IPv6 pin by annotation beside an operator's IPv4 one.
        let mut nics = vec![nic(MAC, None, Some("fd00::80"))];
        let pinned = settle(&mut nics, Some(&operator));
        assert_eq!(nics[0], nic(MAC, Some("10.0.0.70"), Some("fd00::80")));
        assert_eq!(
            render(&pinned).as_deref(),
            Some("02:00:00:00:00:01=fd00::80")
        );
        // A record that does not read counts for nothing.
        let garbled = config(vec![nic(MAC, Some("10.0.0.70"), None)], Some("x=y,=,"));
        let mut nics = vec![nic(MAC, None, None)];
        settle(&mut nics, Some(&garbled));
        assert_eq!(nics[0].ip_address.as_deref(), Some("10.0.0.70"));
    }
}
