//! The Kubernetes kinds this controller reads without typed bindings (KubeVirt's
//! `VirtualMachine`, Multus' `NetworkAttachmentDefinition`), and how any object is named.
//!
//! One place for each group/version/kind, so the reconcilers, the watches in the runtime and the
//! webhook cannot drift apart. Owns no I/O.

use kube::api::{ApiResource, GroupVersionKind};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use vmdhcp_core::NamespacedName;

/// KubeVirt's `VirtualMachine` (read as JSON: we need a few fields, not KubeVirt's types).
pub fn vm_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachine"),
        "virtualmachines",
    )
}

/// The NetworkAttachmentDefinition resource (Multus), read as a dynamic object.
pub fn nad_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("k8s.cni.cncf.io", "v1", "NetworkAttachmentDefinition"),
        "network-attachment-definitions",
    )
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
