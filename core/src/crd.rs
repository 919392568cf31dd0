//! The `network.harvesterhci.io/v1alpha1` custom resources, field for field as upstream
//! (harvester/vm-dhcp-controller) defines them, so every existing manifest and status applies
//! unchanged; and the generator of their CRD manifests (`chart/crds/`, kept in sync by a test).
//!
//! Addresses are kept as strings here, as they are on the wire: one malformed object must not
//! make a watch of all objects fail to deserialize. They are parsed, with errors naming the
//! field, where they are used ([`crate::pool::PoolConfig::from_ippool`]).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, CustomResourceExt};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

mod claim;
mod options;
pub use claim::{
    AddressClaim, AddressClaimSpec, AddressClaimStatus, CLAIM_GROUP, CONDITION_BOUND,
    CONDITION_RESERVED, ClaimPhase, ClaimQuota, ClaimsPolicy, ReclaimPolicy,
};
pub use options::{BootConfig, DhcpOptions, DhcpPrivateOption, IPv6BootConfig};

/// The API group of both resources.
pub const GROUP: &str = "network.harvesterhci.io";

/// Label on a NetworkAttachmentDefinition naming the namespace of the IPPool that serves it.
pub const LABEL_IPPOOL_NAMESPACE: &str = "network.harvesterhci.io/ippool-namespace";
/// Label on a NetworkAttachmentDefinition naming the IPPool that serves it.
pub const LABEL_IPPOOL_NAME: &str = "network.harvesterhci.io/ippool-name";
/// Label on a VirtualMachineNetworkConfig naming the VirtualMachine it was built from.
pub const LABEL_VM_NAME: &str = "harvesterhci.io/vmName";
/// Value of an `status.ipv4.allocated` entry that holds an address back for the server or router.
pub const ALLOCATED_RESERVED: &str = "RESERVED";
/// Value of an `status.ipv4.allocated` entry that the pool's `exclude` list keeps out.
pub const ALLOCATED_EXCLUDED: &str = "EXCLUDED";

/// IPPool condition: the pool's network is labelled and the pool is known to the controller.
pub const CONDITION_REGISTERED: &str = "Registered";
/// IPPool condition: the controller's IPAM for the pool has been rebuilt from status.
pub const CONDITION_CACHE_READY: &str = "CacheReady";
/// IPPool condition: an agent reports serving the pool.
pub const CONDITION_AGENT_READY: &str = "AgentReady";
/// IPPool condition: the pool is paused and not served.
pub const CONDITION_STOPPED: &str = "Stopped";
/// IPPool condition (ours, not upstream's): the serving agent found another DHCP server on the
/// pool's network; the message names each by address and MAC.
pub const CONDITION_FOREIGN_DHCP_SERVER: &str = "ForeignDHCPServer";
/// IPPool condition (ours, not upstream's): the serving agent found a host answering ARP for
/// many addresses that are not its own on the pool's network; the message names each.
pub const CONDITION_PROXY_ARP_RESPONDER: &str = "ProxyARPResponder";
/// IPPool condition (ours, not upstream's): the serving agent found a host answering Neighbor
/// Solicitations for many IPv6 addresses that are not its own on a dual-stack pool's network;
/// the message names each.
pub const CONDITION_PROXY_NDP_RESPONDER: &str = "ProxyNDPResponder";
/// VirtualMachineNetworkConfig condition: every network config has an address.
pub const CONDITION_ALLOCATED: &str = "Allocated";
/// The `Allocated=False` reason of a config whose only problem is MACs another config holds on
/// their networks (ours; upstream says nothing of it).
pub const REASON_MAC_IN_USE: &str = "MacInUse";
/// VirtualMachineNetworkConfig condition: the config is paused and its addresses released.
pub const CONDITION_DISABLED: &str = "Disabled";
/// VirtualMachineNetworkConfig condition: the spec matches the VirtualMachine it came from.
pub const CONDITION_IN_SYNCED: &str = "InSynced";

/// Why the CRD manifests could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// The generated CustomResourceDefinition did not serialize to YAML.
    #[error("cannot render CRD {name} as YAML: {source}")]
    Render {
        /// The CRD's name.
        name: String,
        /// The serializer's error.
        source: serde_yaml_ng::Error,
    },
}

fn ipv4(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "string", "format": "ipv4" })
}

fn optional_ipv4(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "string", "format": "ipv4", "nullable": true })
}

fn ipv6(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "string", "format": "ipv6" })
}

fn optional_ipv6(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "string", "format": "ipv6", "nullable": true })
}

fn ipv6_cidr(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "string", "format": "cidr" })
}

fn ipv6_list_max3(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "array", "maxItems": 3, "items": { "type": "string", "format": "ipv6" } })
}

fn ipv6_list(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "array", "items": { "type": "string", "format": "ipv6" } })
}

/// `ipAddress` was `format: ipv4` upstream; Harvester's dual-stack design drops the marker
/// (the webhook still requires an IPv4 address there: it is the primary family's).
fn optional_address(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "string", "nullable": true })
}

fn ipv4_list_max3(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "array", "maxItems": 3, "items": { "type": "string", "format": "ipv4" } })
}

fn ipv4_list_max4(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "array", "maxItems": 4, "items": { "type": "string", "format": "ipv4" } })
}

fn ipv4_list(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "array", "items": { "type": "string", "format": "ipv4" } })
}

/// `ipv4Config` is optional in upstream's schema, but a server-side default of empty strings
/// would fail its own `format: ipv4`; the field stays optional and gets no default.
fn drop_ipv4_config_default(schema: &mut Schema) {
    if let Some(field) = schema
        .get_mut("properties")
        .and_then(|p| p.get_mut("ipv4Config"))
        .and_then(|f| f.as_object_mut())
    {
        field.remove("default");
    }
}

/// A wrangler `GenericCondition`, the condition shape upstream writes into both statuses.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Type of the condition, e.g. `CacheReady`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Status of the condition, one of True, False, Unknown.
    pub status: String,
    /// The last time this condition was updated (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<String>,
    /// Last time the condition transitioned from one status to another (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    /// The reason for the condition's last transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable message indicating details about last transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Finds a condition by type in a status's condition list.
pub fn find_condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// An address pool on one Multus network, served by the DHCP agents.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "network.harvesterhci.io",
    version = "v1alpha1",
    kind = "IPPool",
    namespaced,
    status = "IPPoolStatus",
    shortname = "ippl",
    shortname = "ippls",
    printcolumn = r#"{"name":"NETWORK","type":"string","jsonPath":".spec.networkName"}"#,
    printcolumn = r#"{"name":"AVAILABLE","type":"integer","jsonPath":".status.ipv4.available"}"#,
    printcolumn = r#"{"name":"USED","type":"integer","jsonPath":".status.ipv4.used"}"#,
    printcolumn = r#"{"name":"IPV6AVAILABLE","type":"integer","jsonPath":".status.ipv6.available"}"#,
    printcolumn = r#"{"name":"IPV6USED","type":"integer","jsonPath":".status.ipv6.used"}"#,
    printcolumn = r#"{"name":"REGISTERED","type":"string","jsonPath":".status.conditions[?(@.type=='Registered')].status"}"#,
    printcolumn = r#"{"name":"CACHEREADY","type":"string","jsonPath":".status.conditions[?(@.type=='CacheReady')].status"}"#,
    printcolumn = r#"{"name":"AGENTREADY","type":"string","jsonPath":".status.conditions[?(@.type=='AgentReady')].status"}"#,
    printcolumn = r#"{"name":"AGE","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    doc = "An address pool on one Multus network, served by the DHCP agents."
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = drop_ipv4_config_default)]
pub struct IPPoolSpec {
    /// The subnet, range and DHCP options of the pool.
    #[serde(default)]
    pub ipv4_config: IPv4Config,
    /// Experimental. The IPv6 side of a dual-stack pool (Harvester's dual-stack design): the
    /// subnet, range and DHCPv6 options. Requires `ipv4Config` (IPv4 stays the primary family);
    /// may be added to a pool, never removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6_config: Option<IPv6Config>,
    /// The NetworkAttachmentDefinition served, as `namespace/name`. Immutable.
    #[schemars(length(max = 64))]
    pub network_name: String,
    /// A paused pool keeps its allocations in status but is not served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// Which namespaces may claim addresses of this pool with an AddressClaim
    /// (`ipam.vmdhcp.io`), and how many each may hold. Absent: none. Not upstream's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claims: Option<ClaimsPolicy>,
}

/// The IPv4 part of a pool: subnet, range and the options handed to clients.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPv4Config {
    /// The DHCP server's own address on the network (option 54). Immutable.
    #[serde(rename = "serverIP")]
    #[schemars(schema_with = "ipv4")]
    pub server_ip: String,
    /// The subnet, e.g. `192.168.48.0/24`. Immutable.
    pub cidr: String,
    /// The range addresses are allocated from. Immutable.
    pub pool: Pool,
    /// Default gateway (option 3). Immutable; cannot be removed once set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_ipv4")]
    pub router: Option<String>,
    /// DNS servers (option 6), at most 3.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "ipv4_list_max3")]
    pub dns: Vec<String>,
    /// DNS domain name (option 15).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain_name: Option<String>,
    /// DNS search list (option 119).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub domain_search: Vec<String>,
    /// NTP servers (option 42), IPv4 addresses or host names, at most 4.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4))]
    pub ntp: Vec<String>,
    /// Lease duration in seconds; unset or 0 means one year, as upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_time: Option<i64>,
    /// The network's MTU, handed out as option 26 (68 to 65535), e.g. 1450 on a VXLAN overlay.
    /// Not upstream's: unset, no MTU is sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 68, max = 65535))]
    pub mtu: Option<i64>,
    /// Classless static routes (option 121, RFC 3442; also as 249 to clients that ask for it),
    /// at most 16. A client given these ignores the router option, so the default route via
    /// `router` is sent among them unless `defaultRoute` is false. Not upstream's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub routes: Vec<StaticRoute>,
    /// Whether clients get a default route via `router` (the default, as upstream). False for
    /// a secondary network that must not take over the VM's default route: the router option
    /// is left out, the `routes` are still sent. Not upstream's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_route: Option<bool>,
    /// Whether each client gets its VirtualMachine's name as host name (option 12), as KubeVirt
    /// names guests on the pod network. Off unless true: `dhclient-script` renames a guest whose
    /// host name is unset or `localhost`, which upstream's clients would notice. Not upstream's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_host_name: Option<bool>,
    /// Network boot: what PXE firmware, UEFI HTTP boot and iPXE are told to load. Only clients
    /// that ask to boot from the network get any of it. Not upstream's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot: Option<BootConfig>,
}

/// Experimental. The IPv6 part of a dual-stack pool: subnet, range and the DHCPv6 options.
/// Field for field as Harvester's dual-stack design names them.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPv6Config {
    /// The DHCPv6 server's own address on the network. Immutable.
    #[serde(rename = "serverIP")]
    #[schemars(schema_with = "ipv6")]
    pub server_ip: String,
    /// The subnet, e.g. `fd00::/112` (/64 to /126). Immutable.
    #[schemars(schema_with = "ipv6_cidr")]
    pub cidr: String,
    /// The range addresses are allocated from, at most 65 535 addresses. Immutable.
    pub pool: IPv6Pool,
    /// The network's router, held back from allocation. DHCPv6 carries no route: guests learn
    /// it from Router Advertisements. Immutable; cannot be removed once set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_ipv6")]
    pub router: Option<String>,
    /// DNS servers (DHCPv6 option 23), at most 3.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "ipv6_list_max3")]
    pub dns: Vec<String>,
    /// Valid lifetime of an address in seconds; unset or 0 means one year, as for IPv4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_time: Option<i64>,
    /// Whether the serving agent sends Router Advertisements on the network: Managed and Other
    /// flags set (clients start DHCPv6), the pool's prefix on-link without autonomous
    /// configuration, and a router lifetime only when `router` is the server's own address. Off
    /// unless true, because the network's router normally sends them. Not in Harvester's design.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_router_advertisements: Option<bool>,
    /// Network boot over DHCPv6. Not in Harvester's design.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot: Option<IPv6BootConfig>,
}

/// The IPv6 allocation range of a pool, inclusive at both ends (the shape of [`Pool`]).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPv6Pool {
    /// First allocatable address. Immutable.
    #[schemars(schema_with = "ipv6")]
    pub start: String,
    /// Last allocatable address. Immutable.
    #[schemars(schema_with = "ipv6")]
    pub end: String,
    /// Addresses in the range never handed out. Immutable; cannot be removed once set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "ipv6_list")]
    pub exclude: Vec<String>,
}

/// One classless static route handed to clients.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StaticRoute {
    /// The destination network, e.g. `10.96.0.0/12` (host bits clear, not `0.0.0.0/0`: the
    /// default route is `router`'s).
    pub destination: String,
    /// The next hop, a host address of the pool's subnet.
    #[schemars(schema_with = "ipv4")]
    pub gateway: String,
}

/// The allocation range of a pool, inclusive at both ends.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Pool {
    /// First allocatable address. Immutable.
    #[schemars(schema_with = "ipv4")]
    pub start: String,
    /// Last allocatable address. Immutable.
    #[schemars(schema_with = "ipv4")]
    pub end: String,
    /// Addresses in the range never handed out. Immutable; cannot be removed once set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "ipv4_list")]
    pub exclude: Vec<String>,
}

/// What the controller records about a pool; `ipv4.allocated` is the source of truth for leases.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPPoolStatus {
    /// When the controller last wrote this status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update: Option<Time>,
    /// Allocation state of the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<IPv4Status>,
    /// Experimental. IPv6 allocation state of a dual-stack pool, written in the same status
    /// write as `ipv4`, so the two never disagree in etcd.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<IPv6Status>,
    /// The agent pod serving the pool (upstream's one-pod-per-pool model; kept for compatibility).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_pod_ref: Option<PodReference>,
    /// Wrangler-style conditions: Registered, CacheReady, AgentReady, Stopped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Address accounting of a pool.
///
/// Its three maps are written whole, by the controller alone, and are declared atomic
/// (`x-kubernetes-map-type: atomic`): the API server then tracks each as one field in
/// `managedFields` instead of one per address. Per key, that bookkeeping would double the stored
/// pool and take much of the API server's CPU, on the status write every allocation makes
/// (docs/tuning.md).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPv4Status {
    /// Address → MAC of the lease holder, or `RESERVED` / `EXCLUDED`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("x-kubernetes-map-type" = "atomic"))]
    pub allocated: BTreeMap<String, String>,
    /// Addresses allocated to MACs.
    pub used: i64,
    /// Addresses still free to allocate.
    pub available: i64,
    /// Address → conflict: addresses another host was found using (it answered an agent's ARP
    /// probe), which are not handed out until a later probe finds them free or an operator
    /// removes the entry. A vmdhcp addition: upstream's clients ignore it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("x-kubernetes-map-type" = "atomic"))]
    pub conflicts: BTreeMap<String, AddressConflict>,
    /// Address → host name of the VirtualMachine holding it (its name, as a DNS label of at
    /// most 63 bytes), recorded while the pool's `sendHostName` is on, so an agent without its
    /// stream reads them here; empty while it is off (turning it on is one write of the pool).
    /// A vmdhcp addition: upstream's clients ignore it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("x-kubernetes-map-type" = "atomic"))]
    pub host_names: BTreeMap<String, String>,
    /// Address → the DHCP options of the NIC holding it (its VirtualMachine's
    /// `interfaces[].dhcpOptions`), for NICs that have any, so an agent without its stream
    /// reads them here. A vmdhcp addition: upstream's clients ignore it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("x-kubernetes-map-type" = "atomic"))]
    pub dhcp_options: BTreeMap<String, DhcpOptions>,
}

/// IPv6 address accounting of a dual-stack pool: the shape of [`IPv4Status`]'s first three
/// fields. Keys are written in RFC 5952's form; any spelling is read. The map is atomic for the
/// reason given on [`IPv4Status`].
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPv6Status {
    /// Address → MAC of the lease holder (the NIC's, as for IPv4), or `RESERVED` / `EXCLUDED`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("x-kubernetes-map-type" = "atomic"))]
    pub allocated: BTreeMap<String, String>,
    /// Addresses allocated to MACs.
    pub used: i64,
    /// Addresses still free to allocate.
    pub available: i64,
    /// Address → conflict: addresses another host was found using (it answered an agent's
    /// Neighbor Solicitation after a client declined the address, or when checked again), as
    /// `status.ipv4.conflicts` records them for IPv4. Not in the HEP: a vmdhcp addition.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("x-kubernetes-map-type" = "atomic"))]
    pub conflicts: BTreeMap<String, AddressConflict>,
}

/// An address of a pool that another host uses, as an agent found it.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddressConflict {
    /// The NIC the address was to go to (or had, if it declined it).
    #[schemars(length(max = 17))]
    pub mac_address: String,
    /// The MAC of the host that answered ARP for the address.
    #[schemars(length(max = 17))]
    pub answered_by: String,
    /// How it was found: `Probe` (before an offer) or `Decline` (a client declined it and a
    /// probe confirmed another host has it).
    #[schemars(length(max = 16))]
    pub source: String,
    /// When the controller recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
}

/// A reference to the agent pod of a pool.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodReference {
    /// Pod namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Pod name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The agent image the pod runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Pod UID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// The addresses one VirtualMachine's NICs need, one entry per Multus network.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "network.harvesterhci.io",
    version = "v1alpha1",
    kind = "VirtualMachineNetworkConfig",
    namespaced,
    status = "VirtualMachineNetworkConfigStatus",
    shortname = "vmnetcfg",
    shortname = "vmnetcfgs",
    printcolumn = r#"{"name":"VMNAME","type":"string","jsonPath":".spec.vmName"}"#,
    printcolumn = r#"{"name":"ALLOCATED","type":"string","jsonPath":".status.conditions[?(@.type=='Allocated')].status"}"#,
    printcolumn = r#"{"name":"DISABLED","type":"string","jsonPath":".status.conditions[?(@.type=='Disabled')].status"}"#,
    printcolumn = r#"{"name":"INSYNCED","type":"string","jsonPath":".status.conditions[?(@.type=='InSynced')].status"}"#,
    printcolumn = r#"{"name":"AGE","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    doc = "The addresses one VirtualMachine's NICs need, one entry per Multus network."
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineNetworkConfigSpec {
    /// The VirtualMachine these configs belong to. Immutable.
    #[schemars(length(max = 64))]
    pub vm_name: String,
    /// A paused config releases its addresses (status keeps them for the resume).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// One entry per NIC on a Multus network, at most 4.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4))]
    pub network_configs: Vec<NetworkConfig>,
}

/// One NIC of a VirtualMachine on one network.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfig {
    /// The NetworkAttachmentDefinition, as `namespace/name`.
    #[schemars(length(max = 64))]
    pub network_name: String,
    /// The NIC's MAC address.
    #[schemars(length(max = 17))]
    pub mac_address: String,
    /// A static IPv4 address requested for this NIC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_address")]
    pub ip_address: Option<String>,
    /// Experimental. A static IPv6 address requested for this NIC, on a dual-stack pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_ipv6")]
    pub ipv6_address: Option<String>,
    /// The DHCP options KubeVirt's VirtualMachine sets on this NIC's interface
    /// (`interfaces[].dhcpOptions`), carried over by the VM reconciler and served to this MAC
    /// over the pool's. Not upstream's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhcp_options: Option<DhcpOptions>,
}

/// What the controller allocated for each NIC.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineNetworkConfigStatus {
    /// One entry per NIC the controller has handled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_configs: Vec<NetworkConfigStatus>,
    /// Wrangler-style conditions: Allocated, Disabled, InSynced.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Allocation state of one NIC.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfigStatus {
    /// The address allocated (kept while paused, so the same one returns).
    #[serde(
        rename = "allocatedIPAddress",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub allocated_ip_address: Option<String>,
    /// Experimental. The IPv6 address allocated on a dual-stack pool (kept while paused, as
    /// the IPv4 one is).
    #[serde(
        rename = "allocatedIPv6Address",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub allocated_ipv6_address: Option<String>,
    /// The NIC's MAC address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac_address: Option<String>,
    /// The network, as `namespace/name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_name: Option<String>,
    /// Allocated, Pending or Stale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<NetworkConfigState>,
}

/// Where one NIC's allocation stands.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum NetworkConfigState {
    /// The address is recorded in the pool and served.
    Allocated,
    /// Waiting for an address (pool not ready, config paused).
    Pending,
    /// The NIC is gone from the spec; its address has been released.
    Stale,
}

/// One NIC a config's status records: (network, MAC, address, state).
pub type RecordedNic = (
    crate::NamespacedName,
    crate::MacAddr,
    Option<std::net::Ipv4Addr>,
    Option<NetworkConfigState>,
);

impl IPPool {
    /// The addresses its status records as used by another host, as recorded (keys, not
    /// parsed): `status.ipv4.conflicts`, then `status.ipv6.conflicts`. What the controller
    /// wakes configs for and republishes a pool's config on, whichever family changed.
    pub fn conflict_keys(&self) -> impl Iterator<Item = &String> {
        let status = self.status.as_ref();
        let v4 = status.and_then(|s| s.ipv4.as_ref()).into_iter();
        let v6 = status.and_then(|s| s.ipv6.as_ref()).into_iter();
        v4.flat_map(|v4| v4.conflicts.keys())
            .chain(v6.flat_map(|v6| v6.conflicts.keys()))
    }
}

impl VirtualMachineNetworkConfig {
    /// The NICs its status records, networks resolved in its namespace; an entry whose network
    /// or MAC does not parse names no NIC and is skipped.
    pub fn recorded_nics(&self) -> Vec<RecordedNic> {
        let ns = self.metadata.namespace.as_deref().unwrap_or_default();
        self.status
            .iter()
            .flat_map(|s| &s.network_configs)
            .filter_map(|e| {
                let network =
                    crate::NamespacedName::parse_in(e.network_name.as_deref()?, ns).ok()?;
                let mac = e.mac_address.as_deref()?.parse().ok()?;
                let ip = e
                    .allocated_ip_address
                    .as_deref()
                    .and_then(|i| i.parse().ok());
                Some((network, mac, ip, e.state))
            })
            .collect()
    }
}

impl VirtualMachineNetworkConfig {
    /// The IPv6 addresses its status records, by NIC (network resolved in its namespace, MAC);
    /// entries that do not parse name nothing and are skipped.
    pub fn recorded_ipv6(
        &self,
    ) -> Vec<(crate::NamespacedName, crate::MacAddr, std::net::Ipv6Addr)> {
        let ns = self.metadata.namespace.as_deref().unwrap_or_default();
        self.status
            .iter()
            .flat_map(|s| &s.network_configs)
            .filter_map(|e| {
                let network =
                    crate::NamespacedName::parse_in(e.network_name.as_deref()?, ns).ok()?;
                let mac = e.mac_address.as_deref()?.parse().ok()?;
                let ip = e.allocated_ipv6_address.as_deref()?.parse().ok()?;
                Some((network, mac, ip))
            })
            .collect()
    }
}

/// The CRD manifests of both resources as `(file name, YAML)`, in the form `chart/crds/` holds.
pub fn crd_manifests() -> Result<Vec<(String, String)>, CrdError> {
    [
        IPPool::crd(),
        VirtualMachineNetworkConfig::crd(),
        AddressClaim::crd(),
    ]
        .into_iter()
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let body = serde_yaml_ng::to_string(&crd).map_err(|source| CrdError::Render {
                name: name.clone(),
                source,
            })?;
            let file = format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural);
            let yaml = format!(
                "# Generated from the Rust types in core/src/crd.rs by `cargo run -p vmdhcp-core --bin crdgen`.\n# Do not edit: a test fails when this file and the types drift apart.\n---\n{body}"
            );
            Ok((file, yaml))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn chart_crds_match_the_types() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../chart/crds");
        for (file, want) in crd_manifests().unwrap() {
            let path = dir.join(&file);
            let have = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                have == want,
                "{} is out of date with core/src/crd.rs; run `cargo run -p vmdhcp-core --bin crdgen`",
                path.display()
            );
        }
    }

    #[test]
    fn crds_carry_upstream_names_columns_and_status() {
        let crd = IPPool::crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("ippools.network.harvesterhci.io")
        );
        assert_eq!(
            crd.spec.names.short_names,
            Some(vec!["ippl".into(), "ippls".into()])
        );
        assert_eq!(crd.spec.scope, "Namespaced");
        let v = &crd.spec.versions[0];
        assert_eq!(v.name, "v1alpha1");
        let cols: Vec<_> = v
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(
            cols,
            [
                "NETWORK",
                "AVAILABLE",
                "USED",
                "IPV6AVAILABLE",
                "IPV6USED",
                "REGISTERED",
                "CACHEREADY",
                "AGENTREADY",
                "AGE"
            ]
        );
        assert!(
            v.subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some()
        );

        let crd = VirtualMachineNetworkConfig::crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("virtualmachinenetworkconfigs.network.harvesterhci.io")
        );
        assert_eq!(
            crd.spec.names.short_names,
            Some(vec!["vmnetcfg".into(), "vmnetcfgs".into()])
        );
        let v = &crd.spec.versions[0];
        let cols: Vec<_> = v
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(cols, ["VMNAME", "ALLOCATED", "DISABLED", "INSYNCED", "AGE"]);
    }

    #[test]
    fn schema_requires_what_upstream_requires() {
        let crd = serde_json::to_value(IPPool::crd()).unwrap();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        assert_eq!(spec["required"], serde_json::json!(["networkName"]));
        assert_eq!(spec["properties"]["networkName"]["maxLength"], 64);
        let v4 = &spec["properties"]["ipv4Config"];
        let mut req: Vec<_> = v4["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        req.sort();
        assert_eq!(req, ["cidr", "pool", "serverIP"]);
        assert_eq!(v4["properties"]["dns"]["maxItems"], 3);
        assert_eq!(v4["properties"]["ntp"]["maxItems"], 4);
        assert_eq!(v4["properties"]["serverIP"]["format"], "ipv4");
        assert_eq!(
            v4["properties"]["pool"]["properties"]["exclude"]["items"]["format"],
            "ipv4"
        );
        let status =
            &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"];
        let mut req: Vec<_> = status["properties"]["ipv4"]["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        req.sort();
        assert_eq!(req, ["available", "used"]);

        let crd = serde_json::to_value(VirtualMachineNetworkConfig::crd()).unwrap();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        assert_eq!(spec["required"], serde_json::json!(["vmName"]));
        assert_eq!(spec["properties"]["networkConfigs"]["maxItems"], 4);
        let item = &spec["properties"]["networkConfigs"]["items"];
        assert_eq!(item["properties"]["macAddress"]["maxLength"], 17);
        // Harvester's dual-stack design drops `format: ipv4` from `ipAddress`.
        assert_eq!(
            item["properties"]["ipAddress"]["format"],
            serde_json::Value::Null
        );
        assert_eq!(item["properties"]["ipv6Address"]["format"], "ipv6");
    }

    #[test]
    fn upstream_readme_examples_deserialize() {
        let pool: IPPool = crate::fixtures::readme_pool();
        assert_eq!(pool.spec.network_name, "default/net-48");
        let v4 = &pool.spec.ipv4_config;
        assert_eq!(v4.server_ip, "192.168.48.77");
        assert_eq!(v4.pool.exclude, ["192.168.48.81", "192.168.48.90"]);
        assert_eq!(v4.ntp, ["pool.ntp.org"]);
        assert_eq!(v4.lease_time, Some(300));

        let cfg: VirtualMachineNetworkConfig = crate::fixtures::readme_vmnetcfg();
        assert_eq!(cfg.spec.vm_name, "test-vm");
        assert_eq!(cfg.spec.network_configs[0].mac_address, "fa:cf:8e:50:82:fc");
    }

    #[test]
    fn upstream_status_round_trips() {
        let status = serde_json::json!({
            "lastUpdate": "2024-01-02T03:04:05Z",
            "ipv4": {"allocated": {"192.168.48.77": "RESERVED", "192.168.48.86": "c6:d6:82:39:d3:c3"}, "used": 1, "available": 7},
            "agentPodRef": {"namespace": "harvester-system", "name": "default-net-48-agent", "image": "x:y", "uid": "u"},
            "conditions": [{"type": "CacheReady", "status": "True", "lastUpdateTime": "2024-01-02T03:04:05Z"}]
        });
        let parsed: IPPoolStatus = serde_json::from_value(status.clone()).unwrap();
        assert_eq!(
            find_condition(&parsed.conditions, CONDITION_CACHE_READY).map(|c| c.status.as_str()),
            Some("True")
        );
        assert_eq!(serde_json::to_value(&parsed).unwrap(), status);

        let status = serde_json::json!({
            "networkConfigs": [{"allocatedIPAddress": "192.168.48.86", "macAddress": "c6:d6:82:39:d3:c3", "networkName": "default/net-48", "state": "Allocated"}],
            "conditions": [{"type": "Allocated", "status": "True"}]
        });
        let parsed: VirtualMachineNetworkConfigStatus =
            serde_json::from_value(status.clone()).unwrap();
        assert_eq!(
            parsed.network_configs[0].state,
            Some(NetworkConfigState::Allocated)
        );
        assert_eq!(serde_json::to_value(&parsed).unwrap(), status);
    }
}
