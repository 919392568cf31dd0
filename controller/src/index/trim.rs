//! What the process's caches keep of each object: the fields this controller reads and nothing
//! else, applied as each object enters its watch's cache ([`super::caches`]). A field dropped
//! here is one no reader may need: the reconcilers, the webhook and the index read cached
//! objects only through what these functions keep.

use kube::api::DynamicObject;
use vmdhcp_core::crd::{LABEL_VM_NAME, VirtualMachineNetworkConfig};

use crate::kinds::{PINNED_BY_VM_ANNOTATION, VirtualMachine, vm_annotation_read};

/// Keeps of a cached VirtualMachine's metadata what this controller reads (identity, deletion,
/// the MAC, static-IP and shown-address annotations) and drops the rest (managed fields, labels, other annotations…); the
/// spec was already read down to the networks and interfaces ([`VirtualMachine`]).
pub fn vm(vm: &mut VirtualMachine) {
    let meta = &mut vm.metadata;
    meta.managed_fields = None;
    meta.labels = None;
    meta.owner_references = None;
    meta.finalizers = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.retain(|k, _| vm_annotation_read(k));
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
}

/// Keeps of a cached config's metadata what this controller reads: of the annotations, only the
/// record of the pins VM annotations made ([`PINNED_BY_VM_ANNOTATION`], on pinned configs only),
/// and the labels shrink to whether the config carries the VM-name label this
/// controller applies ([`labelled_as_applied`]). A map of one label costs a whole tree node
/// (over half a kilobyte), once per config, for one bit (docs/tuning.md). The label right: no
/// map; otherwise a map holding at most that label, empty when it is missing, so the two can
/// never be confused.
pub fn config(cfg: &mut VirtualMachineNetworkConfig) {
    let meta = &mut cfg.metadata;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.retain(|k, _| k == PINNED_BY_VM_ANNOTATION);
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
    let name = meta.name.as_deref().unwrap_or_default();
    let labels = meta.labels.take().unwrap_or_default();
    if labels.get(LABEL_VM_NAME).map(String::as_str) != Some(name) {
        meta.labels = Some(
            labels
                .into_iter()
                .filter(|(k, _)| k == LABEL_VM_NAME)
                .collect(),
        );
    }
}

/// Whether a config, as the cache holds it ([`config`]), carries the VM-name label this
/// controller applies (`harvesterhci.io/vmName` = its own name).
pub fn labelled_as_applied(cfg: &VirtualMachineNetworkConfig) -> bool {
    cfg.metadata.labels.is_none()
}

/// A NAD as the pool reconciler reads it: its name and labels; its annotations and its
/// configuration (`spec.config`, often kilobytes) are dropped.
pub fn nad(nad: &mut DynamicObject) {
    nad.metadata.annotations = None;
    nad.data = serde_json::Value::Null;
}
