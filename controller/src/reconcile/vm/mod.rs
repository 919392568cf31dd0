//! The VirtualMachine reconciler (leader only): keeps a VirtualMachineNetworkConfig named after
//! each KubeVirt VirtualMachine, listing its NICs on Multus networks with their MACs.
//!
//! MACs come from `spec.template.spec.domain.devices.interfaces[].macAddress`, else from the
//! `harvesterhci.io/mac-address` annotation (JSON `{nic: mac}`, Harvester ≥ 1.6); the pod network
//! is skipped. Static addresses come from the VM's pin annotations ([`pins`]), else a static
//! `ipAddress` an operator set on the config is carried over. The config is owned by the VM;
//! where no garbage collector runs, the config reconciler removes orphans. With
//! `--vm-address-annotation` it also shows the VM's allocated addresses where Harvester's UI
//! reads them ([`custom_ip`]), woken by its config's changes too.

pub mod custom_ip;
pub mod pins;

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tracing::{debug, warn};
use vmdhcp_core::crd::{
    DhcpOptions, LABEL_VM_NAME, NetworkConfig, VirtualMachineNetworkConfig,
    VirtualMachineNetworkConfigSpec,
};
use vmdhcp_core::pool::NicOptions;
use vmdhcp_core::{MacAddr, NamespacedName};

use crate::index::trim;
use crate::kinds::{MAC_ANNOTATION, VirtualMachine, VmInterface};
use crate::reconcile::context::{Context, NotLeader};
use crate::reconcile::versioned;

/// Field manager of the configs this controller writes.
pub const FIELD_MANAGER: &str = "vm-dhcp-controller";

/// Why a VirtualMachine reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done.
        action: String,
        /// The API error.
        source: kube::Error,
    },
    /// Leadership was lost.
    #[error(transparent)]
    NotLeader(#[from] NotLeader),
    /// The object has no namespace.
    #[error("VirtualMachine without namespace")]
    Unnamespaced,
}

/// The interface's `dhcpOptions`, as its config carries them: those that break KubeVirt's
/// rules or our bounds are left out, with a warning (KubeVirt's webhook refuses most of them
/// first), so the config is still written and the NIC served with the pool's options.
fn dhcp_options_of(vm: &VirtualMachine, nic: &str, interface: &VmInterface) -> Option<DhcpOptions> {
    let options = interface.dhcp_options.as_ref()?;
    match NicOptions::parse(options) {
        Ok(Some(parsed)) => Some(parsed.to_crd()),
        Ok(None) => None,
        Err(e) => {
            let field = e.path("dhcpOptions");
            warn!(vm = %vm.name_any(), nic, field, error = %e, "DHCP options of the interface left out");
            None
        }
    }
}

/// One NIC of a VM on a Multus network, with the MAC KubeVirt or Harvester gave it.
pub struct VmNic<'a> {
    /// Its name (`interfaces[].name`, `networks[].name`).
    pub name: &'a str,
    /// Its network.
    pub network: NamespacedName,
    /// Its MAC.
    pub mac: MacAddr,
    /// Its interface in the domain, if the spec lists one.
    pub interface: Option<&'a VmInterface>,
}

/// A VM's NICs on Multus networks that have a MAC, in its network order. MACs come from the
/// interface, else from the `harvesterhci.io/mac-address` annotation; NICs without one, or with
/// an invalid MAC or network name, are skipped (with a log line).
pub fn multus_nics(vm: &VirtualMachine) -> Vec<VmNic<'_>> {
    let ns = vm.namespace().unwrap_or_default();
    let Some(spec) = vm.template_spec() else {
        return Vec::new();
    };
    let annotated: BTreeMap<String, String> = vm
        .annotations()
        .get(MAC_ANNOTATION)
        .and_then(|a| serde_json::from_str(a).map_err(|e| warn!(vm = %vm.name_any(), error = %e, "unreadable {MAC_ANNOTATION} annotation")).ok())
        .unwrap_or_default();
    let mut out = Vec::new();
    for network in &spec.networks {
        let (Some(nic), Some(net)) = (
            network.name.as_deref(),
            network
                .multus
                .as_ref()
                .and_then(|m| m.network_name.as_deref()),
        ) else {
            continue;
        };
        let interface = spec
            .domain
            .devices
            .interfaces
            .iter()
            .find(|i| i.name.as_deref() == Some(nic));
        let from_spec = interface.and_then(|i| i.mac_address.as_deref());
        let Some(mac) = from_spec.or(annotated.get(nic).map(String::as_str)) else {
            debug!(vm = %vm.name_any(), nic, "no MAC yet; waiting for KubeVirt or Harvester to assign one");
            continue;
        };
        let (Ok(mac), Ok(network)) = (mac.parse::<MacAddr>(), NamespacedName::parse_in(net, &ns))
        else {
            warn!(vm = %vm.name_any(), nic, mac, net, "skipping a NIC with an invalid MAC or network name");
            continue;
        };
        out.push(VmNic {
            name: nic,
            network,
            mac,
            interface,
        });
    }
    out
}

/// The network configs a VM's spec asks for, in its network order (at most 4, as the CRD allows),
/// with the addresses its annotations pin ([`pins`]).
pub fn network_configs(vm: &VirtualMachine) -> Vec<NetworkConfig> {
    let (pinned, skipped) = pins::pins_of(vm);
    for s in &skipped {
        warn!(vm = %vm.name_any(), annotation = %s.key, reason = %s.reason, "static IP annotation skipped");
    }
    let mut out: Vec<NetworkConfig> = multus_nics(vm)
        .into_iter()
        .map(|nic| {
            let pin = pinned.get(nic.name);
            NetworkConfig {
                network_name: nic.network.to_string(),
                mac_address: nic.mac.to_string(),
                ip_address: pin.and_then(|p| p.ipv4).map(|ip| ip.to_string()),
                ipv6_address: pin.and_then(|p| p.ipv6).map(|ip| ip.to_string()),
                dhcp_options: nic.interface.and_then(|i| dhcp_options_of(vm, nic.name, i)),
            }
        })
        .collect();
    if out.len() > 4 {
        warn!(vm = %vm.name_any(), nics = out.len(), "only the first 4 Multus NICs get addresses");
        out.truncate(4);
    }
    out
}

/// The config a VM asks for, as this controller applies it (server-side, owning the spec's
/// NICs): named after the VM, owned by it, created with the finalizer. An empty `configs`
/// serialises without `networkConfigs`, so the apply drops the NICs this manager owned.
pub fn desired_config(
    vm: &VirtualMachine,
    ns: &str,
    name: &str,
    configs: Vec<NetworkConfig>,
    paused: Option<bool>,
    pinned: Option<String>,
) -> VirtualMachineNetworkConfig {
    let owner = OwnerReference {
        api_version: "kubevirt.io/v1".into(),
        kind: "VirtualMachine".into(),
        name: name.to_owned(),
        uid: vm.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    VirtualMachineNetworkConfig {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(ns.to_owned()),
            labels: Some([(LABEL_VM_NAME.to_owned(), name.to_owned())].into()),
            annotations: pinned.map(|p| [(pins::PINNED_BY_VM.to_owned(), p)].into()),
            owner_references: Some(vec![owner]),
            // Created with the finalizer, so the config reconciler need not add it in a second
            // write (which races the create under a burst).
            finalizers: Some(vec![
                crate::reconcile::context::VMNETCFG_FINALIZER.to_owned(),
            ]),
            ..Default::default()
        },
        spec: VirtualMachineNetworkConfigSpec {
            vm_name: name.to_owned(),
            paused,
            network_configs: configs,
        },
        status: None,
    }
}

/// Whether a VM looks as if its config is still to be written: it asks for Multus NICs and no
/// config named after it is cached. For ordering a new term's first pass only
/// ([`crate::runtime::replay`]): cheap, and allowed to be wrong (a VM whose NICs changed while
/// there was no leader is reconciled in the pass's settled part).
pub fn looks_unsettled(
    vm: &VirtualMachine,
    configs: &kube::runtime::reflector::Store<VirtualMachineNetworkConfig>,
) -> bool {
    let Some(ns) = vm.namespace() else {
        return false;
    };
    let key = kube::runtime::reflector::ObjectRef::new(&vm.name_any()).within(&ns);
    configs.get(&key).is_none() && !network_configs(vm).is_empty()
}

/// Reconciles one VirtualMachine: its config, then (with `--vm-address-annotation`) the
/// addresses Harvester's UI shows for it.
pub async fn reconcile(vm: Arc<VirtualMachine>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.ensure_leader()?;
    let ns = vm.namespace().ok_or(Error::Unnamespaced)?;
    if vm.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let name = vm.name_any();
    let existing = ctx
        .stores
        .vmnetcfgs
        .get(&kube::runtime::reflector::ObjectRef::new(&name).within(&ns));
    let nics = network_configs(&vm);
    let action = apply_config(&vm, &ctx, &ns, nics.clone(), existing.as_deref()).await?;
    if ctx.vm_address_annotation {
        show_addresses(&vm, &ctx, &ns, &nics, existing.as_deref()).await?;
    }
    Ok(action)
}

/// Applies the config `vm` asks for (`configs`, with the addresses its annotations pin), unless
/// `existing` already is it.
async fn apply_config(
    vm: &Arc<VirtualMachine>,
    ctx: &Context,
    ns: &str,
    mut configs: Vec<NetworkConfig>,
    existing: Option<&VirtualMachineNetworkConfig>,
) -> Result<Action, Error> {
    let name = vm.name_any();
    // A VM without Multus NICs needs no config; one that lost its last NIC keeps its config,
    // emptied, so the config's reconcile releases the addresses (upstream kept them).
    if configs.is_empty() && existing.is_none_or(|e| e.spec.network_configs.is_empty()) {
        return Ok(Action::await_change());
    }
    // The annotations' pins; else static addresses (both families) set on the config by an
    // operator, unless an annotation since removed had set them.
    let pinned_any = configs
        .iter()
        .any(|c| c.ip_address.is_some() || c.ipv6_address.is_some());
    let pinned = pins::render(&pins::settle(&mut configs, existing));
    if let Some(current) = existing
        && current.spec.network_configs == configs
        && trim::labelled_as_applied(current)
        && current.annotations().get(pins::PINNED_BY_VM) == pinned.as_ref()
    {
        return Ok(Action::await_change());
    }
    let desired = desired_config(
        vm,
        ns,
        &name,
        configs,
        existing.and_then(|e| e.spec.paused),
        pinned,
    );
    ctx.ensure_leader()?;
    if let Ok(config) = NamespacedName::new(ns, &name) {
        // The config's reconcile continues this trace. Recorded before the write: its watch
        // event may start that reconcile before this call returns.
        ctx.signals.causes.vmnetcfgs.record_current(config);
    }
    // The typed object: its serialisation cannot fail, and it carries apiVersion and kind.
    // Answered with its metadata alone: nothing here reads the config back.
    let api: Api<VirtualMachineNetworkConfig> = Api::namespaced(ctx.client.clone(), ns);
    let request = kube::core::Request::new(api.resource_url()).patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&desired),
    );
    match versioned::send(&ctx.client, request, "patch").await {
        Ok(_) => Ok(Action::await_change()),
        // The webhook refuses a pin that is not free in its pool (outside the range, excluded,
        // reserved, held by another MAC…): said on the VM, whose annotation is to blame, and
        // tried again a while later (the address may be released meanwhile).
        Err(kube::Error::Api(status)) if refused_pin(&status, pinned_any) => {
            warn!(vm = %name, namespace = %ns, reason = %status.message, "static IP annotation refused");
            ctx.event(
                vm.as_ref(),
                EventType::Warning,
                "StaticIPRefused",
                "Pin",
                status.message,
            );
            Ok(Action::requeue(PIN_RETRY))
        }
        Err(source) => Err(Error::Kube {
            action: format!("applying VirtualMachineNetworkConfig {ns}/{name}"),
            source,
        }),
    }
}

/// Shows the addresses the config's status records for `nics` in the VM's
/// `harvesterhci.io/custom-ip` ([`custom_ip`]): a merge patch of its annotations, conditional
/// on the version of the VM read. A conflict is left to the newer VM's own reconcile.
async fn show_addresses(
    vm: &VirtualMachine,
    ctx: &Context,
    ns: &str,
    nics: &[NetworkConfig],
    config: Option<&VirtualMachineNetworkConfig>,
) -> Result<(), Error> {
    let want = custom_ip::addresses(nics, config);
    let Some(annotations) = custom_ip::change(vm.annotations(), &want) else {
        return Ok(());
    };
    ctx.ensure_leader()?;
    let name = vm.name_any();
    let api: Api<VirtualMachine> = Api::namespaced(ctx.client.clone(), ns);
    let patch = serde_json::json!({"metadata": {
        "resourceVersion": vm.resource_version(),
        "annotations": annotations,
    }});
    let request = kube::core::Request::new(api.resource_url()).patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(&patch),
    );
    match versioned::send(&ctx.client, request, "patch").await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => {
            debug!(vm = %name, namespace = %ns, "VM changed since read: its next reconcile shows the addresses");
            Ok(())
        }
        Err(source) => Err(Error::Kube {
            action: format!("annotating VirtualMachine {ns}/{name} with its addresses"),
            source,
        }),
    }
}

/// How long after a refused pin it is tried again, unless the VM changes first.
const PIN_RETRY: std::time::Duration = std::time::Duration::from_secs(60);

/// Whether an apply failed because admission refused it while the VM pins addresses: the
/// webhook's denial, not an API or transport failure.
fn refused_pin(status: &kube::core::Status, pinned_any: bool) -> bool {
    pinned_any && status.message.contains("denied the request")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn vm(annotations: Value, interfaces: Value, networks: Value) -> VirtualMachine {
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "vm1", "namespace": "vms", "annotations": annotations},
            "spec": {"template": {"spec": {"domain": {"devices": {"interfaces": interfaces}}, "networks": networks}}}
        }))
        .unwrap()
    }

    /// (network, MAC) of each config, in order.
    fn pairs(configs: &[NetworkConfig]) -> Vec<(&str, &str)> {
        configs
            .iter()
            .map(|c| (c.network_name.as_str(), c.mac_address.as_str()))
            .collect()
    }

    #[test]
    fn a_vm_looks_unsettled_while_it_asks_for_nics_and_has_no_config() {
        let (store, mut writer) = kube::runtime::reflector::store::<VirtualMachineNetworkConfig>();
        let with_nic = vm(
            json!({}),
            json!([{"name": "nic-1", "macAddress": "0a:00:00:00:00:01", "bridge": {}}]),
            json!([{"name": "nic-1", "multus": {"networkName": "vms/net-a"}}]),
        );
        let without = vm(json!({}), json!([]), json!([]));
        assert!(looks_unsettled(&with_nic, &store));
        assert!(!looks_unsettled(&without, &store));
        let config = desired_config(
            &with_nic,
            "vms",
            "vm1",
            network_configs(&with_nic),
            None,
            None,
        );
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(config));
        assert!(!looks_unsettled(&with_nic, &store));
    }

    #[test]
    fn a_cached_config_keeps_whether_it_carries_the_applied_label_and_nothing_else() {
        let config = |labels: Value| -> VirtualMachineNetworkConfig {
            let mut c: VirtualMachineNetworkConfig = serde_json::from_value(json!({
                "apiVersion": "network.harvesterhci.io/v1alpha1", "kind": "VirtualMachineNetworkConfig",
                "metadata": {"name": "vm1", "namespace": "vms", "labels": labels,
                    "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}},
                "spec": {"vmName": "vm1"}
            }))
            .unwrap();
            trim::config(&mut c);
            assert!(c.metadata.annotations.is_none());
            c
        };
        let applied = config(json!({LABEL_VM_NAME: "vm1", "team": "a"}));
        assert!(trim::labelled_as_applied(&applied));
        assert!(applied.metadata.labels.is_none(), "no tree node is kept");
        for (labels, kept) in [
            (json!({LABEL_VM_NAME: "vm2", "team": "a"}), 1),
            (json!({"team": "a"}), 0),
            (json!(null), 0),
        ] {
            let c = config(labels.clone());
            assert!(!trim::labelled_as_applied(&c), "{labels}");
            assert_eq!(c.labels().len(), kept, "{labels}");
        }
        // What this controller applies reads, once cached, as applied.
        let mut desired = desired_config(
            &vm(json!({}), json!([]), json!([])),
            "vms",
            "vm1",
            Vec::new(),
            None,
            None,
        );
        trim::config(&mut desired);
        assert!(trim::labelled_as_applied(&desired));
    }

    #[test]
    fn a_vm_is_read_down_to_its_nics_and_trimmed_to_what_is_read() {
        let full = json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "vm1", "namespace": "vms", "uid": "u1",
                "labels": {"app": "x"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
                "annotations": {MAC_ANNOTATION: r#"{"nic-2":"aa:bb:cc:00:00:02"}"#, "kubevirt.io/latest-observed-api-version": "v1"}},
            "spec": {"running": true, "template": {"spec": {
                "domain": {"cpu": {"cores": 2}, "devices": {
                    "disks": [{"name": "disk"}],
                    "interfaces": [{"name": "nic-1", "macAddress": "aa:bb:cc:00:00:01", "bridge": {}}, {"name": "nic-2", "bridge": {}}]}},
                "networks": [{"name": "default", "pod": {}}, {"name": "nic-1", "multus": {"networkName": "net-a"}}, {"name": "nic-2", "multus": {"networkName": "other/net-b"}}],
                "volumes": [{"name": "disk", "containerDisk": {}}]}}},
            "status": {"printableStatus": "Running", "conditions": [{"type": "Ready"}]}
        });
        let mut v: VirtualMachine = serde_json::from_value(full).unwrap();
        let before = network_configs(&v);
        trim::vm(&mut v);
        assert_eq!(network_configs(&v), before);
        assert_eq!(
            pairs(&before),
            [
                ("vms/net-a", "aa:bb:cc:00:00:01"),
                ("other/net-b", "aa:bb:cc:00:00:02")
            ]
        );
        assert_eq!(v.annotations().len(), 1, "only the MAC annotation is kept");
        assert!(v.metadata.managed_fields.is_none() && v.metadata.labels.is_none());
        assert_eq!(
            v.uid().as_deref(),
            Some("u1"),
            "the owner reference needs the uid"
        );
        // A VM without a template asks for nothing.
        let bare: VirtualMachine = serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "vm2", "namespace": "vms"}, "spec": {"running": true}
        }))
        .unwrap();
        assert!(network_configs(&bare).is_empty());
        // A malformed spec reads as one without NICs; the VM itself (its identity) still reads,
        // so one bad object does not fail the watch page it arrives in.
        for spec in [
            json!({"template": "not an object"}),
            json!({"template": {"spec": {"networks": {"not": "a list"}}}}),
            json!({"template": {"spec": {"networks": [{"name": 7}]}}}),
            json!("a string"),
        ] {
            let odd: VirtualMachine = serde_json::from_value(json!({
                "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                "metadata": {"name": "vm3", "namespace": "vms"}, "spec": spec
            }))
            .unwrap();
            assert_eq!(odd.name_any(), "vm3");
            assert!(network_configs(&odd).is_empty(), "{spec}");
        }
    }

    #[test]
    fn multus_nics_with_macs_from_spec_then_annotation() {
        let v = vm(
            json!({MAC_ANNOTATION: r#"{"nic-2":"AA:BB:CC:00:00:02","nic-3":"aa:bb:cc:00:00:03"}"#}),
            json!([{"name": "default", "masquerade": {}}, {"name": "nic-1", "macAddress": "aa:bb:cc:00:00:01", "bridge": {}}, {"name": "nic-2", "bridge": {}}, {"name": "nic-3", "macAddress": "aa-bb-cc-00-00-99"}]),
            json!([{"name": "default", "pod": {}}, {"name": "nic-1", "multus": {"networkName": "net-a"}}, {"name": "nic-2", "multus": {"networkName": "other/net-b"}}, {"name": "nic-3", "multus": {"networkName": "vms/net-c"}}]),
        );
        assert_eq!(
            pairs(&network_configs(&v)),
            [
                ("vms/net-a", "aa:bb:cc:00:00:01"),
                ("other/net-b", "aa:bb:cc:00:00:02"),
                ("vms/net-c", "aa:bb:cc:00:00:99")
            ]
        );
    }

    #[test]
    fn nics_without_mac_or_with_garbage_are_skipped() {
        let v = vm(
            json!({MAC_ANNOTATION: "not json"}),
            json!([{"name": "nic-1"}, {"name": "nic-2", "macAddress": "zz"}]),
            json!([{"name": "nic-1", "multus": {"networkName": "net-a"}}, {"name": "nic-2", "multus": {"networkName": "net-b"}}]),
        );
        assert!(network_configs(&v).is_empty());
    }

    #[test]
    fn the_applied_config_is_typed_and_an_empty_nic_list_is_left_out() {
        let v = vm(json!({}), json!([]), json!([]));
        let nic = NetworkConfig {
            dhcp_options: None,
            ipv6_address: None,
            network_name: "vms/net-a".into(),
            mac_address: "aa:bb:cc:00:00:01".into(),
            ip_address: None,
        };
        let body =
            serde_json::to_value(desired_config(&v, "vms", "vm1", vec![nic], None, None)).unwrap();
        assert_eq!(body["apiVersion"], "network.harvesterhci.io/v1alpha1");
        assert_eq!(body["kind"], "VirtualMachineNetworkConfig");
        assert_eq!(
            body["spec"]["networkConfigs"][0]["networkName"],
            "vms/net-a"
        );
        assert!(body.get("status").is_none(), "{body}");
        // The VM lost its last NIC: the apply carries no list, so the NICs this manager owned go.
        let body =
            serde_json::to_value(desired_config(&v, "vms", "vm1", vec![], None, None)).unwrap();
        assert!(body["spec"].get("networkConfigs").is_none(), "{body}");
        assert_eq!(body["spec"]["vmName"], "vm1");
        assert_eq!(
            body["metadata"]["finalizers"][0],
            crate::reconcile::context::VMNETCFG_FINALIZER
        );
    }
}
