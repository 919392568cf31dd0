//! The option types of ours the CRDs carry: a pool's network boot settings (both families)
//! and a NIC's own DHCP options in KubeVirt's shape. Re-exported by [`super`], generated and
//! drift-tested with the rest.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Network boot for a pool's IPv4 clients. The file is chosen by the client's architecture
/// (option 93, RFC 4578) and, for iPXE (user class `iPXE`, option 77), is the script it runs,
/// so that firmware loads iPXE and iPXE loads the script instead of loading itself again. A
/// client of an architecture with no file set gets no boot options.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BootConfig {
    /// The TFTP server's address, sent as the reply's next server (`siaddr`). Unset: the DHCP
    /// server's own address, as every reply carries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::optional_ipv4")]
    pub next_server: Option<String>,
    /// The TFTP server's host name or address (option 66).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 255))]
    pub tftp_server_name: Option<String>,
    /// The file BIOS PXE firmware loads (architecture 0), e.g. `undionly.kpxe`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 255))]
    pub bios_file: Option<String>,
    /// The file x86 UEFI PXE firmware loads (architectures 6, 7 and 9), e.g. `ipxe.efi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 255))]
    pub uefi_file: Option<String>,
    /// The `http://` or `https://` URL x86 UEFI HTTP boot loads (architectures 15 and 16); the
    /// reply names itself `HTTPClient` (option 60), as the UEFI specification requires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 255))]
    pub uefi_http_url: Option<String>,
    /// The script iPXE runs (`http://`, `https://` or `tftp://`), e.g.
    /// `http://boot.example/vm.ipxe`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 255))]
    pub ipxe_script_url: Option<String>,
}

/// Network boot for a dual-stack pool's DHCPv6 clients: the boot file URL (option 59, RFC
/// 5970) chosen by the client's architecture (option 61) or, for iPXE (user class `iPXE`), its
/// script, with the parameters (option 60). Not in Harvester's design.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPv6BootConfig {
    /// The URL x86 UEFI PXE firmware loads (architectures 7 and 9): `tftp://[fd00::2]/ipxe.efi`,
    /// or `http://` / `https://`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 255))]
    pub uefi_file_url: Option<String>,
    /// The `http://` or `https://` URL x86 UEFI HTTP boot loads (architecture 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 255))]
    pub uefi_http_url: Option<String>,
    /// The script iPXE runs (`http://`, `https://` or `tftp://`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 255))]
    pub ipxe_script_url: Option<String>,
    /// Parameters handed with the boot file (option 60), at most 8.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub parameters: Vec<String>,
}

/// Per-interface DHCPv4 options, in the shape of KubeVirt's `DHCPOptions`: the same field names
/// and the same rules (private option codes 224 to 254, each once; NTP servers IPv4 addresses).
/// Bounded here: each value at most 255 bytes (one option), at most 4 NTP servers, and at most
/// 1024 bytes in all, since the pool's status records them for every NIC that has them.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DhcpOptions {
    /// Option 67, the boot file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 255))]
    pub boot_file_name: Option<String>,
    /// Option 66, the TFTP server's name or address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 255))]
    pub tftp_server_name: Option<String>,
    /// Option 42, IPv4 addresses; replaces the pool's NTP servers for this NIC.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::ipv4_list_max4")]
    pub ntp_servers: Vec<String>,
    /// Options for private use (codes 224 to 254), each sent as the bytes of its value.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 31))]
    pub private_options: Vec<DhcpPrivateOption>,
}

/// One private-use DHCP option, as KubeVirt's `DHCPPrivateOptions`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DhcpPrivateOption {
    /// The code, 224 to 254.
    #[schemars(range(min = 224, max = 254))]
    pub option: i64,
    /// The value, sent as its bytes.
    #[schemars(length(max = 255))]
    pub value: String,
}
