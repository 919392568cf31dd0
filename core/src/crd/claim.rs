//! The `ipam.vmdhcp.io/v1alpha1` AddressClaim: an address (one per family of its pool) that a
//! namespace's owners reserve and that outlives the VM using it; and the rule on an IPPool that
//! says which namespaces may claim from it and how much. Ours, not upstream's: a group of our own
//! so that Harvester's and upstream's controllers never meet a kind they do not know.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Condition;

/// The API group of [`AddressClaim`].
pub const CLAIM_GROUP: &str = "ipam.vmdhcp.io";
/// Condition: the claim's addresses are held in its pool's status.
pub const CONDITION_RESERVED: &str = "Reserved";
/// Condition: a NIC's MAC holds the claim's addresses (served to it).
pub const CONDITION_BOUND: &str = "Bound";

/// An address that outlives a VM: reserved from the pool serving `network` for a VM's NIC (by
/// name: whatever MAC the VM gets), for a MAC, or for nothing (a VIP, held and served to nobody).
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "ipam.vmdhcp.io",
    version = "v1alpha1",
    kind = "AddressClaim",
    namespaced,
    status = "AddressClaimStatus",
    shortname = "aclaim",
    printcolumn = r#"{"name":"NETWORK","type":"string","jsonPath":".spec.network"}"#,
    printcolumn = r#"{"name":"ADDRESS","type":"string","jsonPath":".status.ipAddress"}"#,
    printcolumn = r#"{"name":"IPV6","type":"string","jsonPath":".status.ipv6Address"}"#,
    printcolumn = r#"{"name":"BOUND-TO","type":"string","jsonPath":".status.macAddress"}"#,
    printcolumn = r#"{"name":"PHASE","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"AGE","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    doc = "An address reserved from an IPPool that outlives the VM using it: bound to a VM's NIC, to a MAC, or to nothing (a VIP)."
)]
#[serde(rename_all = "camelCase")]
pub struct AddressClaimSpec {
    /// The NetworkAttachmentDefinition, as a NIC's `networkName`: `namespace/name`, or a name in
    /// the claim's namespace. Immutable.
    #[schemars(length(max = 253))]
    pub network: String,
    /// The IPv4 address wanted; else the lowest free one of the pool. Immutable once held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 15))]
    pub ip_address: Option<String>,
    /// The IPv6 address wanted, on a dual-stack pool; else the lowest free one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 39))]
    pub ipv6_address: Option<String>,
    /// The VirtualMachine (in the claim's namespace) whose NIC `nic` gets the addresses; with
    /// `nic`, never with `macAddress`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub vm: Option<String>,
    /// The NIC of `vm` (its `interfaces[].name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub nic: Option<String>,
    /// The MAC that gets the addresses, whichever VM has it; never with `vm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 17))]
    pub mac_address: Option<String>,
    /// What happens when the VM is deleted: `Retain` (default) keeps the addresses claimed,
    /// `Delete` deletes the claim with its VM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim_policy: Option<ReclaimPolicy>,
}

/// What becomes of a claim bound to a VM when the VM is deleted, as a PersistentVolume's.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ReclaimPolicy {
    /// The addresses stay claimed, held for nobody until a VM with the NIC comes back.
    #[default]
    Retain,
    /// The claim is deleted with its VM (the VM owns it), and its addresses are freed.
    Delete,
}

/// Where a claim stands.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ClaimPhase {
    /// Held in the pool's status, served to nobody (a VIP, or a NIC not there now).
    Reserved,
    /// Held for a NIC's MAC and served to it.
    Bound,
    /// Not held: the condition `Reserved` says why.
    Refused,
}

/// What a claim holds now.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddressClaimStatus {
    /// The IPPool the addresses come from, as `namespace/name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// The IPv4 address held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_address: Option<String>,
    /// The IPv6 address held, on a dual-stack pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6_address: Option<String>,
    /// The MAC the addresses are recorded for in the pool: a NIC's when bound, else the
    /// claim's own placeholder (locally administered, from the claim's uid).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac_address: Option<String>,
    /// `Reserved`, `Bound` or `Refused`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<ClaimPhase>,
    /// `Reserved` and `Bound`, with reasons.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Which namespaces may claim addresses from a pool, and how many each may hold. Absent: no
/// claims (every pool made before claims existed is unchanged). Not upstream's.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimsPolicy {
    /// Namespaces admitted by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub namespaces: Vec<String>,
    /// Namespaces admitted by their labels (besides those named).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// How many addresses of each family one namespace may hold; absent: no bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_namespace: Option<ClaimQuota>,
}

/// Addresses per family.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimQuota {
    /// IPv4 addresses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<u32>,
    /// IPv6 addresses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<u32>,
}
