//! The Kubernetes kinds this controller reads without their projects' bindings (KubeVirt's
//! `VirtualMachine`, as the few fields it reads; Multus' `NetworkAttachmentDefinition`, as a
//! dynamic object), and how any object is named.
//!
//! One place for each group/version/kind, so the reconcilers, the watches in the runtime and the
//! webhook cannot drift apart. Owns no I/O.

use std::borrow::Cow;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, GroupVersionKind};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde::{Deserialize, Deserializer};
use vmdhcp_core::NamespacedName;
use vmdhcp_core::crd::IPPool;

/// Annotation in which Harvester records the MAC of each NIC (`{"nic-1": "aa:bb:…"}`).
pub const MAC_ANNOTATION: &str = "harvesterhci.io/mac-address";
/// Upstream's VirtualMachine annotation prefix that pins a NIC's IPv4 address
/// (`static-ip.harvesterhci.io/<nic-name>`; `reconcile::vm::pins`).
pub const STATIC_IP_PREFIX: &str = "static-ip.harvesterhci.io/";
/// Ours: the VirtualMachine annotation prefix that pins a NIC's IPv6 address on a dual-stack
/// pool (`static-ipv6.vmdhcp.io/<nic-name>`).
pub const STATIC_IPV6_PREFIX: &str = "static-ipv6.vmdhcp.io/";
/// Harvester's VirtualMachine annotation its UI shows as the VM's address
/// (`reconcile::vm::custom_ip`).
pub const CUSTOM_IP_ANNOTATION: &str = "harvesterhci.io/custom-ip";
/// Ours: the value of [`CUSTOM_IP_ANNOTATION`] this controller last wrote.
pub const CUSTOM_IP_WRITTEN_ANNOTATION: &str = "vmdhcp.io/custom-ip-written";
/// Ours, on a config this controller writes: the pins its NICs got from the VM's annotations.
pub const PINNED_BY_VM_ANNOTATION: &str = "vmdhcp.io/pinned-by-vm-annotation";

/// Whether a cached VirtualMachine keeps annotation `key`: the ones the reconcilers read (the
/// MAC map, the static-IP pins, the shown addresses).
pub fn vm_annotation_read(key: &str) -> bool {
    key == MAC_ANNOTATION
        || key.starts_with(STATIC_IP_PREFIX)
        || key.starts_with(STATIC_IPV6_PREFIX)
        || key == CUSTOM_IP_ANNOTATION
        || key == CUSTOM_IP_WRITTEN_ANNOTATION
}

/// KubeVirt's `VirtualMachine`, as far as this controller reads it: its identity, annotations
/// (the MAC one) and its template's networks and interfaces.
///
/// Decoded straight from the API's JSON, skipping every other field while parsing: the leader
/// caches every VM of the cluster, and the whole object as JSON values costs kilobytes per VM,
/// even trimmed to these fields, where this costs a few hundred bytes (docs/tuning.md).
/// Read-only: the controller never writes VMs.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct VirtualMachine {
    /// The VM's metadata (the cache drops what is not read; see `index::trim::vm`).
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// `spec`; a malformed one reads as empty (no NICs), see [`lenient`].
    #[serde(default, deserialize_with = "lenient")]
    pub spec: VmSpec,
}

/// `VirtualMachine.spec`: only its template.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct VmSpec {
    /// `spec.template`.
    #[serde(default)]
    pub template: Option<VmTemplate>,
}

/// `spec.template`: only its spec.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct VmTemplate {
    /// `spec.template.spec`.
    #[serde(default)]
    pub spec: Option<VmTemplateSpec>,
}

/// `spec.template.spec`: the VM's networks and the interfaces that use them.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct VmTemplateSpec {
    /// `networks[]`: a NIC's name and where it is plugged (pod network or a Multus one).
    #[serde(default)]
    pub networks: Vec<VmNetwork>,
    /// `domain` (only its devices' interfaces).
    #[serde(default)]
    pub domain: VmDomain,
}

/// One of `spec.template.spec.networks`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct VmNetwork {
    /// The NIC's name (matches an interface's).
    #[serde(default)]
    pub name: Option<String>,
    /// Set when the NIC is on a Multus network.
    #[serde(default)]
    pub multus: Option<VmMultus>,
}

/// `networks[].multus`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct VmMultus {
    /// The NetworkAttachmentDefinition, `name` or `namespace/name`.
    #[serde(default, rename = "networkName")]
    pub network_name: Option<String>,
}

/// `spec.template.spec.domain`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct VmDomain {
    /// `domain.devices` (only its interfaces).
    #[serde(default)]
    pub devices: VmDevices,
}

/// `domain.devices`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct VmDevices {
    /// `devices.interfaces[]`.
    #[serde(default)]
    pub interfaces: Vec<VmInterface>,
}

/// One of `domain.devices.interfaces`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct VmInterface {
    /// The NIC's name (matches a network's).
    #[serde(default)]
    pub name: Option<String>,
    /// The MAC KubeVirt or the user set, if any.
    #[serde(default, rename = "macAddress")]
    pub mac_address: Option<String>,
    /// KubeVirt's per-interface DHCP options, carried into the NIC's config.
    #[serde(default, rename = "dhcpOptions")]
    pub dhcp_options: Option<vmdhcp_core::crd::DhcpOptions>,
}

impl VirtualMachine {
    /// The template's spec, if the VM has one.
    pub fn template_spec(&self) -> Option<&VmTemplateSpec> {
        self.spec.template.as_ref()?.spec.as_ref()
    }
}

/// Reads a `T`, or `T::default()` if the JSON does not have its shape: one malformed VM (the
/// API server does not check a CRD's fields it has no schema for) must not fail the decoding of
/// the whole watch page it arrives in, which would stall every other VM's events.
fn lenient<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: serde::de::DeserializeOwned + Default,
{
    let value = serde_json::Value::deserialize(d)?;
    Ok(serde_json::from_value(value).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "malformed VirtualMachine spec; reading it as one without NICs");
        T::default()
    }))
}

impl Resource for VirtualMachine {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "VirtualMachine".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "kubevirt.io".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "virtualmachines".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The NetworkAttachmentDefinition resource (Multus), read as a dynamic object.
pub fn nad_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("k8s.cni.cncf.io", "v1", "NetworkAttachmentDefinition"),
        "network-attachment-definitions",
    )
}

/// The network an IPPool names: its `spec.networkName`, in the pool's namespace when it gives
/// none. `None` when the name does not parse (the pool is refused as invalid).
pub fn network_of(pool: &IPPool) -> Option<NamespacedName> {
    NamespacedName::parse_in(
        &pool.spec.network_name,
        &pool.namespace().unwrap_or_default(),
    )
    .ok()
}

/// The `namespace/name` of any namespaced object.
pub fn object_ref<K: ResourceExt>(obj: &K) -> Option<NamespacedName> {
    NamespacedName::new(&obj.namespace()?, &obj.name_any()).ok()
}

/// The reflector-store key of the object `name` (the reverse of [`object_ref`]).
pub fn store_key<K>(name: &NamespacedName) -> ObjectRef<K>
where
    K: Resource,
    K::DynamicType: Default,
{
    ObjectRef::new(&name.name).within(&name.namespace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_vm_keeps_the_annotations_the_reconcilers_read_and_no_other() {
        for key in [
            MAC_ANNOTATION,
            "static-ip.harvesterhci.io/nic-1",
            "static-ipv6.vmdhcp.io/nic-1",
            CUSTOM_IP_ANNOTATION,
            CUSTOM_IP_WRITTEN_ANNOTATION,
        ] {
            assert!(vm_annotation_read(key), "{key}");
        }
        for key in [
            "kubevirt.io/latest-observed-api-version",
            "harvesterhci.io/vmName",
            PINNED_BY_VM_ANNOTATION,
            "static-ip.harvesterhci.io",
        ] {
            assert!(!vm_annotation_read(key), "{key}");
        }
    }
}
