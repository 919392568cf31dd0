//! Network boot, for both families: the typed boot settings of a pool ([`Boot`], [`BootV6`]),
//! their one parse from the CRD, and which file a booting client is handed ([`Firmware`]).
//!
//! Parsed here, not in the agent, so that the webhook, the stream and an agent reading IPPools
//! directly refuse the same values: every string fits one DHCP option (255 bytes) and is
//! printable text without spaces, every URL has a scheme its client can fetch.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use super::PoolError;
use crate::crd::{BootConfig, IPv6BootConfig};
use crate::names::NamespacedName;

/// `spec.ipv4Config.boot`.
pub const F_BOOT: &str = "spec.ipv4Config.boot";
/// `spec.ipv6Config.boot`.
pub const F6_BOOT: &str = "spec.ipv6Config.boot";
/// The longest value one DHCP option carries.
pub const MAX_BOOT_VALUE: usize = 255;
/// Most boot file parameters (DHCPv6 option 60) a pool hands out.
pub const MAX_BOOT_PARAMETERS: usize = 8;

const HTTP: &[&str] = &["http", "https"];
const FETCHABLE: &[&str] = &["http", "https", "tftp"];

/// The vendor class (DHCPv4 option 60, DHCPv6 option 16) of UEFI HTTP boot; the offer it takes
/// must carry it back.
pub const HTTP_CLIENT: &[u8] = b"HTTPClient";
/// The vendor class of PXE firmware.
pub const PXE_CLIENT: &[u8] = b"PXEClient";
/// iPXE's user class (DHCPv4 option 77, bare or RFC 3004; DHCPv6 option 15).
pub const IPXE_USER_CLASS: &[u8] = b"iPXE";

/// The architecture a PXE or HTTP boot vendor class spells, `PXEClient:Arch:00007:UNDI:003016`.
pub fn vendor_class_arch(value: &[u8]) -> Option<u16> {
    let at = value.windows(6).position(|w| w == b":Arch:")? + 6;
    let digits = value.get(at..at + 5)?;
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// What a request says about booting from the network, in either family; all unset for an
/// operating system's client, which then gets no boot options.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BootRequest {
    /// The client architecture type (DHCPv4 option 93, DHCPv6 option 61), its first.
    pub arch: Option<u16>,
    /// The vendor class names PXE (`PXEClient…`) or UEFI HTTP boot (`HTTPClient…`): whether
    /// HTTP, and the architecture in its `:Arch:NNNNN` part.
    pub vendor: Option<(bool, Option<u16>)>,
    /// The user class says iPXE.
    pub ipxe: bool,
}

impl BootRequest {
    /// Notes a vendor class, if it is PXE's or UEFI HTTP boot's.
    pub fn vendor_class(&mut self, class: &[u8]) {
        let http = class.starts_with(HTTP_CLIENT);
        if http || class.starts_with(PXE_CLIENT) {
            self.vendor = Some((http, vendor_class_arch(class)));
        }
    }

    /// The firmware the client boots as, given whether the pool has an iPXE script: iPXE gets
    /// the script when there is one (otherwise it is firmware like any other); then the
    /// architecture decides, said outright or in the vendor class (PXE without one is BIOS,
    /// HTTP boot without one x64 UEFI HTTP). `None` for a client that does not boot from the
    /// network or whose architecture no field serves.
    pub fn firmware(&self, ipxe_script: bool) -> Option<Firmware> {
        if self.ipxe && ipxe_script {
            return Some(Firmware::Ipxe);
        }
        let arch = match (self.arch, self.vendor) {
            (Some(arch), _) => arch,
            (None, Some((_, Some(arch)))) => arch,
            (None, Some((true, None))) => 16,
            (None, Some((false, None))) => 0,
            (None, None) if self.ipxe => 0,
            (None, None) => return None,
        };
        Firmware::of_architecture(arch)
    }
}

/// What kind of network boot a client asked for, which picks the file it is handed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Firmware {
    /// BIOS PXE (architecture 0).
    Bios,
    /// x86 UEFI PXE (architectures 6, 7 and 9).
    Uefi,
    /// x86 UEFI HTTP boot (architectures 15 and 16).
    UefiHttp,
    /// iPXE, by its user class: it gets the script.
    Ipxe,
}

impl Firmware {
    /// The firmware a client architecture type names (RFC 4578 §2.1 and IANA's registry, shared
    /// by DHCPv4 option 93 and DHCPv6 option 61); `None` for those no pool field serves.
    pub fn of_architecture(arch: u16) -> Option<Self> {
        match arch {
            0 => Some(Firmware::Bios),
            6 | 7 | 9 => Some(Firmware::Uefi),
            15 | 16 => Some(Firmware::UefiHttp),
            _ => None,
        }
    }
}

/// A pool's IPv4 network boot settings, checked. Never empty: a `boot` without a file is none.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Boot {
    /// The reply's next server (`siaddr`) for booting clients; unset: the DHCP server's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_server: Option<Ipv4Addr>,
    /// Option 66.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tftp_server_name: Option<String>,
    /// For [`Firmware::Bios`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bios_file: Option<String>,
    /// For [`Firmware::Uefi`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uefi_file: Option<String>,
    /// For [`Firmware::UefiHttp`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uefi_http_url: Option<String>,
    /// For [`Firmware::Ipxe`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipxe_script_url: Option<String>,
}

impl Boot {
    /// The file `firmware` loads, if the pool sets one.
    pub fn file_for(&self, firmware: Firmware) -> Option<&str> {
        match firmware {
            Firmware::Bios => self.bios_file.as_deref(),
            Firmware::Uefi => self.uefi_file.as_deref(),
            Firmware::UefiHttp => self.uefi_http_url.as_deref(),
            Firmware::Ipxe => self.ipxe_script_url.as_deref(),
        }
    }

    /// Parses `spec.ipv4Config.boot`; `None` when it names no file.
    pub fn parse(pool: &NamespacedName, boot: &BootConfig) -> Result<Option<Self>, PoolError> {
        let f = Check { pool, base: F_BOOT };
        let next_server = match nonempty(&boot.next_server) {
            None => None,
            Some(s) => Some(f.next_server(s)?),
        };
        let parsed = Boot {
            next_server,
            tftp_server_name: f.text("tftpServerName", &boot.tftp_server_name)?,
            bios_file: f.text("biosFile", &boot.bios_file)?,
            uefi_file: f.text("uefiFile", &boot.uefi_file)?,
            uefi_http_url: f.url("uefiHttpUrl", &boot.uefi_http_url, HTTP)?,
            ipxe_script_url: f.url("ipxeScriptUrl", &boot.ipxe_script_url, FETCHABLE)?,
        };
        let files = [
            &parsed.bios_file,
            &parsed.uefi_file,
            &parsed.uefi_http_url,
            &parsed.ipxe_script_url,
        ];
        Ok(files.iter().any(|f| f.is_some()).then_some(parsed))
    }
}

/// A dual-stack pool's DHCPv6 network boot settings, checked; never without a URL.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootV6 {
    /// For [`Firmware::Uefi`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uefi_file_url: Option<String>,
    /// For [`Firmware::UefiHttp`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uefi_http_url: Option<String>,
    /// For [`Firmware::Ipxe`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipxe_script_url: Option<String>,
    /// Option 60's parameters, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parameters: Vec<String>,
}

impl BootV6 {
    /// The URL `firmware` loads, if the pool sets one (DHCPv6 has no BIOS boot).
    pub fn url_for(&self, firmware: Firmware) -> Option<&str> {
        match firmware {
            Firmware::Bios => None,
            Firmware::Uefi => self.uefi_file_url.as_deref(),
            Firmware::UefiHttp => self.uefi_http_url.as_deref(),
            Firmware::Ipxe => self.ipxe_script_url.as_deref(),
        }
    }

    /// Parses `spec.ipv6Config.boot`; `None` when it names no URL.
    pub fn parse(pool: &NamespacedName, boot: &IPv6BootConfig) -> Result<Option<Self>, PoolError> {
        let f = Check {
            pool,
            base: F6_BOOT,
        };
        if boot.parameters.len() > MAX_BOOT_PARAMETERS {
            return Err(f.invalid(
                "parameters",
                &boot.parameters.len().to_string(),
                &format!("names more than {MAX_BOOT_PARAMETERS} parameters"),
            ));
        }
        let mut parameters = Vec::with_capacity(boot.parameters.len());
        for (i, p) in boot.parameters.iter().enumerate() {
            f.printable(&format!("parameters[{i}]"), p)?;
            parameters.push(p.clone());
        }
        let parsed = BootV6 {
            uefi_file_url: f.url("uefiFileUrl", &boot.uefi_file_url, FETCHABLE)?,
            uefi_http_url: f.url("uefiHttpUrl", &boot.uefi_http_url, HTTP)?,
            ipxe_script_url: f.url("ipxeScriptUrl", &boot.ipxe_script_url, FETCHABLE)?,
            parameters,
        };
        let urls = [
            &parsed.uefi_file_url,
            &parsed.uefi_http_url,
            &parsed.ipxe_script_url,
        ];
        Ok(urls.iter().any(|u| u.is_some()).then_some(parsed))
    }
}

fn nonempty(value: &Option<String>) -> Option<&str> {
    value.as_deref().filter(|v| !v.is_empty())
}

/// The checks of one `boot` block, errors naming `base.field`.
struct Check<'a> {
    pool: &'a NamespacedName,
    base: &'static str,
}

impl Check<'_> {
    fn invalid(&self, field: &str, value: &str, reason: &str) -> PoolError {
        PoolError::InvalidField {
            pool: self.pool.to_string(),
            field: format!("{}.{field}", self.base),
            value: value.to_owned(),
            reason: reason.to_owned(),
        }
    }

    fn next_server(&self, value: &str) -> Result<Ipv4Addr, PoolError> {
        let ip: Ipv4Addr = value
            .parse()
            .map_err(|_| self.invalid("nextServer", value, "is not an IPv4 address"))?;
        if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() {
            return Err(self.invalid("nextServer", value, "is not a unicast address"));
        }
        Ok(ip)
    }

    /// One option's worth of printable ASCII without spaces: what firmware reads as a file name.
    fn printable(&self, field: &str, value: &str) -> Result<(), PoolError> {
        if value.len() > MAX_BOOT_VALUE {
            let reason = format!("is longer than {MAX_BOOT_VALUE} bytes");
            return Err(self.invalid(field, value, &reason));
        }
        if !value.bytes().all(|b| b.is_ascii_graphic()) {
            let reason = "must be printable ASCII without spaces";
            return Err(self.invalid(field, value, reason));
        }
        Ok(())
    }

    fn text(&self, field: &str, value: &Option<String>) -> Result<Option<String>, PoolError> {
        let Some(value) = nonempty(value) else {
            return Ok(None);
        };
        self.printable(field, value)?;
        Ok(Some(value.to_owned()))
    }

    /// A URL with one of `schemes` and something after `scheme://`.
    fn url(
        &self,
        field: &str,
        value: &Option<String>,
        schemes: &[&str],
    ) -> Result<Option<String>, PoolError> {
        let Some(text) = self.text(field, value)? else {
            return Ok(None);
        };
        let fetchable = text.split_once("://").is_some_and(|(scheme, rest)| {
            !rest.is_empty() && schemes.iter().any(|s| scheme.eq_ignore_ascii_case(s))
        });
        if !fetchable {
            let reason = format!("is not a URL starting {}", schemes.join("://, ") + "://");
            return Err(self.invalid(field, &text, &reason));
        }
        Ok(Some(text))
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_firmware_is_ipxe_s_with_a_script_then_the_architecture_s() {
        let said = |arch: Option<u16>, vendor: Option<(bool, Option<u16>)>, ipxe: bool| {
            BootRequest { arch, vendor, ipxe }
        };
        // iPXE gets the script when there is one; without, it is firmware like any other.
        assert_eq!(
            said(Some(7), None, true).firmware(true),
            Some(Firmware::Ipxe)
        );
        assert_eq!(
            said(Some(7), None, true).firmware(false),
            Some(Firmware::Uefi)
        );
        assert_eq!(said(None, None, true).firmware(false), Some(Firmware::Bios));
        // The architecture said outright wins over the vendor class's.
        assert_eq!(
            said(Some(0), Some((true, Some(16))), false).firmware(true),
            Some(Firmware::Bios)
        );
        assert_eq!(
            said(None, Some((false, Some(9))), false).firmware(true),
            Some(Firmware::Uefi)
        );
        // A vendor class without an architecture: PXE is BIOS, HTTP boot x64 UEFI HTTP.
        assert_eq!(
            said(None, Some((false, None)), false).firmware(true),
            Some(Firmware::Bios)
        );
        assert_eq!(
            said(None, Some((true, None)), false).firmware(true),
            Some(Firmware::UefiHttp)
        );
        // An operating system's client, and an architecture no field serves (ARM64 UEFI).
        assert_eq!(BootRequest::default().firmware(true), None);
        assert_eq!(said(Some(11), None, false).firmware(true), None);
        // Only PXE's and HTTP boot's vendor classes count.
        let mut r = BootRequest::default();
        r.vendor_class(b"MSFT 5.0");
        assert_eq!(r, BootRequest::default());
        r.vendor_class(b"HTTPClient:Arch:00016");
        assert_eq!(r.vendor, Some((true, Some(16))));
    }
    use super::*;

    fn pool() -> NamespacedName {
        NamespacedName::new("default", "net").unwrap()
    }

    fn reason(r: Result<impl std::fmt::Debug, PoolError>) -> (String, String) {
        match r {
            Err(PoolError::InvalidField { field, reason, .. }) => (field, reason),
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn a_vendor_class_spells_its_architecture_in_five_digits() {
        assert_eq!(
            vendor_class_arch(b"PXEClient:Arch:00007:UNDI:003016"),
            Some(7)
        );
        assert_eq!(vendor_class_arch(b"HTTPClient:Arch:00016"), Some(16));
        assert_eq!(vendor_class_arch(b"PXEClient:Arch:0"), None);
        assert_eq!(vendor_class_arch(b"PXEClient"), None);
    }

    #[test]
    fn architectures_pick_the_firmware_as_rfc_4578_numbers_them() {
        let of = Firmware::of_architecture;
        assert_eq!(of(0), Some(Firmware::Bios));
        for uefi in [6, 7, 9] {
            assert_eq!(of(uefi), Some(Firmware::Uefi));
        }
        for http in [15, 16] {
            assert_eq!(of(http), Some(Firmware::UefiHttp));
        }
        // ARM64 UEFI (11) and the rest: no field serves them.
        for other in [1, 2, 8, 10, 11, 19, 0xffff] {
            assert_eq!(of(other), None);
        }
    }

    #[test]
    fn a_boot_block_parses_and_each_firmware_gets_its_file() {
        let boot = BootConfig {
            next_server: Some("192.0.2.5".into()),
            tftp_server_name: Some("tftp.example".into()),
            bios_file: Some("undionly.kpxe".into()),
            uefi_file: Some("ipxe.efi".into()),
            uefi_http_url: Some("http://192.0.2.5/ipxe.efi".into()),
            ipxe_script_url: Some("https://boot.example/vm.ipxe".into()),
        };
        let b = Boot::parse(&pool(), &boot).unwrap().unwrap();
        assert_eq!(b.next_server, Some(Ipv4Addr::new(192, 0, 2, 5)));
        assert_eq!(b.file_for(Firmware::Bios), Some("undionly.kpxe"));
        assert_eq!(b.file_for(Firmware::Uefi), Some("ipxe.efi"));
        assert_eq!(
            b.file_for(Firmware::UefiHttp),
            Some("http://192.0.2.5/ipxe.efi")
        );
        assert_eq!(
            b.file_for(Firmware::Ipxe),
            Some("https://boot.example/vm.ipxe")
        );
        // Nothing to load: no boot at all, whatever else is set.
        let empty = BootConfig {
            next_server: Some("192.0.2.5".into()),
            bios_file: Some(String::new()),
            ..BootConfig::default()
        };
        assert_eq!(Boot::parse(&pool(), &empty).unwrap(), None);
    }

    #[test]
    fn values_no_client_could_use_are_refused_by_field() {
        let cases: [(BootConfig, &str, &str); 5] = [
            (
                BootConfig {
                    next_server: Some("255.255.255.255".into()),
                    ..BootConfig::default()
                },
                "spec.ipv4Config.boot.nextServer",
                "is not a unicast address",
            ),
            (
                BootConfig {
                    bios_file: Some("a b".into()),
                    ..BootConfig::default()
                },
                "spec.ipv4Config.boot.biosFile",
                "must be printable ASCII without spaces",
            ),
            (
                BootConfig {
                    uefi_file: Some("x".repeat(256)),
                    ..BootConfig::default()
                },
                "spec.ipv4Config.boot.uefiFile",
                "is longer than 255 bytes",
            ),
            (
                BootConfig {
                    uefi_http_url: Some("tftp://192.0.2.5/ipxe.efi".into()),
                    ..BootConfig::default()
                },
                "spec.ipv4Config.boot.uefiHttpUrl",
                "is not a URL starting http://, https://",
            ),
            (
                BootConfig {
                    ipxe_script_url: Some("boot.ipxe".into()),
                    ..BootConfig::default()
                },
                "spec.ipv4Config.boot.ipxeScriptUrl",
                "is not a URL starting http://, https://, tftp://",
            ),
        ];
        for (boot, field, why) in cases {
            assert_eq!(
                reason(Boot::parse(&pool(), &boot)),
                (field.to_owned(), why.to_owned())
            );
        }
    }

    #[test]
    fn the_v6_block_takes_urls_and_at_most_eight_parameters() {
        let boot = IPv6BootConfig {
            uefi_file_url: Some("tftp://[fd00::2]/ipxe.efi".into()),
            parameters: vec!["console=ttyS0".into()],
            ..IPv6BootConfig::default()
        };
        let b = BootV6::parse(&pool(), &boot).unwrap().unwrap();
        assert_eq!(b.url_for(Firmware::Uefi), Some("tftp://[fd00::2]/ipxe.efi"));
        assert_eq!(
            (b.url_for(Firmware::Bios), b.url_for(Firmware::Ipxe)),
            (None, None)
        );
        let many = IPv6BootConfig {
            parameters: vec!["p".into(); 9],
            ..boot.clone()
        };
        assert_eq!(
            reason(BootV6::parse(&pool(), &many)),
            (
                "spec.ipv6Config.boot.parameters".to_owned(),
                "names more than 8 parameters".to_owned()
            )
        );
        let spaced = IPv6BootConfig {
            parameters: vec!["ok".into(), "not ok".into()],
            ..boot
        };
        assert_eq!(
            reason(BootV6::parse(&pool(), &spaced)).0,
            "spec.ipv6Config.boot.parameters[1]"
        );
        let only_parameters = IPv6BootConfig {
            parameters: vec!["p".into()],
            ..IPv6BootConfig::default()
        };
        assert_eq!(BootV6::parse(&pool(), &only_parameters).unwrap(), None);
    }
}
