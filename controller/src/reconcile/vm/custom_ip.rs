//! A VM's addresses where Harvester's UI shows them (`--vm-address-annotation`): Harvester's VM
//! list shows the annotation `harvesterhci.io/custom-ip` in its IP column (harvester#7299),
//! which a VM without the guest agent otherwise leaves empty (harvester#6146). The controller
//! writes there each NIC's allocated addresses, IPv4 then IPv6, in the order of the VM's
//! networks, comma separated.
//!
//! The annotation is also a person's to set. The value this controller wrote is kept beside it
//! ([`WRITTEN`]), so it changes only a value it wrote (or none), never one a person set (it then
//! drops its own record and leaves theirs), and removes only what it wrote. Each write is a
//! merge patch conditional on the VM's resourceVersion, so a person's edit racing it wins.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use vmdhcp_core::MacAddr;
use vmdhcp_core::crd::{NetworkConfig, VirtualMachineNetworkConfig};

pub use crate::kinds::{
    CUSTOM_IP_ANNOTATION as CUSTOM_IP, CUSTOM_IP_WRITTEN_ANNOTATION as WRITTEN,
};

/// The addresses to show for the VM whose NICs are `nics` (in its network order), as the
/// config's status records them: each NIC's IPv4 address, then its IPv6 one; empty when none.
pub fn addresses(nics: &[NetworkConfig], config: Option<&VirtualMachineNetworkConfig>) -> String {
    let Some(status) = config.and_then(|c| c.status.as_ref()) else {
        return String::new();
    };
    let mut out = Vec::new();
    for nic in nics {
        let Ok(mac) = nic.mac_address.parse::<MacAddr>() else {
            continue;
        };
        let Some(entry) = status.network_configs.iter().find(|e| {
            e.network_name.as_deref() == Some(nic.network_name.as_str())
                && e.mac_address.as_deref().and_then(|m| m.parse().ok()) == Some(mac)
        }) else {
            continue;
        };
        out.extend(entry.allocated_ip_address.iter().cloned());
        out.extend(entry.allocated_ipv6_address.iter().cloned());
    }
    out.join(",")
}

/// The annotations' merge patch that shows `want` (empty: nothing to show), given the VM's
/// annotations now; `None` when nothing is to change.
pub fn change(annotations: &BTreeMap<String, String>, want: &str) -> Option<Value> {
    let shown = annotations.get(CUSTOM_IP);
    let written = annotations.get(WRITTEN);
    let ours = shown.is_none() || (written.is_some() && shown == written);
    if !ours {
        // A person's value: left alone, and our record of a value that is no longer there goes.
        return written.map(|_| json!({ WRITTEN: null }));
    }
    if want.is_empty() {
        return (shown.is_some() || written.is_some())
            .then(|| json!({ CUSTOM_IP: null, WRITTEN: null }));
    }
    (shown.map(String::as_str) != Some(want) || written.map(String::as_str) != Some(want))
        .then(|| json!({ CUSTOM_IP: want, WRITTEN: want }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn addresses_follow_the_nics_order_ipv4_before_ipv6() {
        let nic = |net: &str, mac: &str| NetworkConfig {
            dhcp_options: None,
            network_name: net.into(),
            mac_address: mac.into(),
            ip_address: None,
            ipv6_address: None,
        };
        let config: VirtualMachineNetworkConfig = serde_json::from_value(json!({
            "apiVersion": "network.harvesterhci.io/v1alpha1", "kind": "VirtualMachineNetworkConfig",
            "metadata": {"name": "vm1", "namespace": "vms"},
            "spec": {"vmName": "vm1"},
            "status": {"networkConfigs": [
                {"networkName": "vms/b", "macAddress": "02:00:00:00:00:02", "allocatedIPAddress": "10.0.1.5", "allocatedIPv6Address": "fd00:1::5"},
                {"networkName": "vms/a", "macAddress": "02:00:00:00:00:01", "allocatedIPAddress": "10.0.0.5"},
                {"networkName": "vms/c", "macAddress": "02:00:00:00:00:03"}
            ]}
        }))
        .unwrap();
        let nics = [
            nic("vms/a", "02:00:00:00:00:01"),
            nic("vms/b", "02:00:00:00:00:02"),
            nic("vms/c", "02:00:00:00:00:03"),
            nic("vms/d", "02:00:00:00:00:04"),
        ];
        assert_eq!(
            addresses(&nics, Some(&config)),
            "10.0.0.5,10.0.1.5,fd00:1::5"
        );
        assert_eq!(addresses(&nics, None), "");
    }

    #[test]
    fn only_a_value_this_controller_wrote_or_none_is_changed_or_removed() {
        let want = "10.0.0.5";
        // Nothing shown yet: written, with our record.
        assert_eq!(
            change(&annotations(&[]), want),
            Some(json!({CUSTOM_IP: want, WRITTEN: want}))
        );
        // Ours and current: nothing to do; ours and stale: replaced; ours and nothing to show:
        // removed.
        let ours = annotations(&[(CUSTOM_IP, want), (WRITTEN, want)]);
        assert_eq!(change(&ours, want), None);
        assert_eq!(
            change(&ours, "10.0.0.6"),
            Some(json!({CUSTOM_IP: "10.0.0.6", WRITTEN: "10.0.0.6"}))
        );
        assert_eq!(
            change(&ours, ""),
            Some(json!({CUSTOM_IP: null, WRITTEN: null}))
        );
        assert_eq!(change(&annotations(&[]), ""), None);
        // A person's value: never touched; our record of an older value goes.
        let theirs = annotations(&[(CUSTOM_IP, "192.0.2.1")]);
        assert_eq!(change(&theirs, want), None);
        assert_eq!(change(&theirs, ""), None);
        let overwritten = annotations(&[(CUSTOM_IP, "192.0.2.1"), (WRITTEN, want)]);
        assert_eq!(change(&overwritten, want), Some(json!({WRITTEN: null})));
        // A person removed the value we wrote: shown again.
        let removed = annotations(&[(WRITTEN, want)]);
        assert_eq!(
            change(&removed, want),
            Some(json!({CUSTOM_IP: want, WRITTEN: want}))
        );
    }
}
