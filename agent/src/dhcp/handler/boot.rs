//! Network boot on the wire: what a booting client says about itself (options 60, 77 and 93,
//! read from the raw options, never decoded by `dhcproto`) and the file the pool's boot
//! settings give it.

use std::net::Ipv4Addr;

use vmdhcp_core::pool::boot::{BootRequest, IPXE_USER_CLASS};
use vmdhcp_core::pool::{Boot, Firmware};

/// What a request says about booting from the network, read off options 60, 77 and 93.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Netboot(BootRequest);

impl Netboot {
    /// Notes option `code` with `value`, if it is one of the three this reads.
    pub(super) fn read(&mut self, code: u8, value: &[u8]) {
        match code {
            93 => {
                if let [hi, lo, ..] = value {
                    self.0.arch = Some(u16::from_be_bytes([*hi, *lo]));
                }
            }
            60 => self.0.vendor_class(value),
            77 => {
                self.0.ipxe = value == IPXE_USER_CLASS
                    || rfc3004_classes(value).any(|c| c == IPXE_USER_CLASS);
            }
            _ => {}
        }
    }

    /// The firmware the client boots as, given the pool's settings ([`BootRequest::firmware`]).
    fn firmware(&self, boot: &Boot) -> Option<Firmware> {
        self.0.firmware(boot.ipxe_script_url.is_some())
    }
}

/// The classes of an RFC 3004 user class option: each a length byte and that many bytes.
fn rfc3004_classes(mut value: &[u8]) -> impl Iterator<Item = &[u8]> {
    std::iter::from_fn(move || {
        let (&len, rest) = value.split_first()?;
        let class = rest.get(..usize::from(len))?;
        value = &rest[usize::from(len)..];
        Some(class)
    })
}

/// What a booting client is told: the next server, the file, and the options that carry them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct BootAnswer<'a> {
    /// `siaddr`: the pool's next server, if it names one.
    pub next_server: Option<Ipv4Addr>,
    /// The boot file or URL (option 67, and the `file` header field when it fits).
    pub file: &'a str,
    /// Option 66.
    pub tftp_server_name: Option<&'a str>,
    /// UEFI HTTP boot: the reply carries option 60 `HTTPClient`.
    pub http: bool,
    /// iPXE, handed its script: the reply tells it not to wait for a ProxyDHCP offer.
    pub ipxe: bool,
}

/// iPXE's encapsulated options (175) with `no-pxedhcp` (176) = 1: without it iPXE waits
/// seconds for ProxyDHCP offers that never come before it asks for the address it was offered.
pub(super) const IPXE_NO_PXEDHCP: [u8; 3] = [176, 1, 1];
/// The code of iPXE's encapsulated options.
pub(super) const IPXE_ENCAPSULATED: u8 = 175;

/// The pool's answer to a client that said `netboot`, if it boots and the pool has its file.
pub(super) fn answer<'a>(boot: &'a Boot, netboot: &Netboot) -> Option<BootAnswer<'a>> {
    let firmware = netboot.firmware(boot)?;
    Some(BootAnswer {
        next_server: boot.next_server,
        file: boot.file_for(firmware)?,
        tftp_server_name: boot.tftp_server_name.as_deref(),
        http: firmware == Firmware::UefiHttp,
        ipxe: firmware == Firmware::Ipxe,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boot() -> Boot {
        Boot {
            next_server: Some(Ipv4Addr::new(192, 0, 2, 5)),
            tftp_server_name: Some("192.0.2.5".into()),
            bios_file: Some("undionly.kpxe".into()),
            uefi_file: Some("ipxe.efi".into()),
            uefi_http_url: Some("http://192.0.2.5/ipxe.efi".into()),
            ipxe_script_url: Some("http://192.0.2.5/vm.ipxe".into()),
        }
    }

    fn said(options: &[(u8, &[u8])]) -> Netboot {
        let mut n = Netboot::default();
        for (code, value) in options {
            n.read(*code, value);
        }
        n
    }

    fn file_of(options: &[(u8, &[u8])]) -> Option<(&'static str, bool)> {
        let b = Box::leak(Box::new(boot()));
        answer(b, &said(options)).map(|a| (a.file, a.http))
    }

    #[test]
    fn each_kind_of_booting_client_gets_its_file() {
        let bios: &[u8] = b"PXEClient:Arch:00000:UNDI:002001";
        assert_eq!(file_of(&[(60, bios)]), Some(("undionly.kpxe", false)));
        assert_eq!(file_of(&[(93, &[0, 7])]), Some(("ipxe.efi", false)));
        let efi: &[u8] = b"PXEClient:Arch:00009:UNDI:003016";
        assert_eq!(file_of(&[(60, efi)]), Some(("ipxe.efi", false)));
        // Option 93 wins over the vendor class's architecture.
        assert_eq!(
            file_of(&[(60, efi), (93, &[0, 0])]),
            Some(("undionly.kpxe", false))
        );
        let http: &[u8] = b"HTTPClient:Arch:00016:UNDI:003001";
        assert_eq!(
            file_of(&[(60, http), (93, &[0, 16])]),
            Some(("http://192.0.2.5/ipxe.efi", true))
        );
        assert_eq!(
            file_of(&[(60, b"HTTPClient")]),
            Some(("http://192.0.2.5/ipxe.efi", true))
        );
        // iPXE, bare or as an RFC 3004 list, gets the script whatever it runs on.
        let script = Some(("http://192.0.2.5/vm.ipxe", false));
        assert_eq!(file_of(&[(60, bios), (93, &[0, 0]), (77, b"iPXE")]), script);
        assert_eq!(file_of(&[(93, &[0, 7]), (77, b"\x04iPXE")]), script);
    }

    #[test]
    fn other_clients_and_architectures_get_nothing() {
        // An operating system's client.
        assert_eq!(file_of(&[(60, b"MSFT 5.0"), (77, b"\x03abc")]), None);
        assert_eq!(file_of(&[]), None);
        // ARM64 UEFI: no field serves it.
        assert_eq!(file_of(&[(93, &[0, 11])]), None);
        // Short or odd values are read as far as they go, never past.
        assert_eq!(file_of(&[(93, &[7])]), None);
        assert_eq!(
            file_of(&[(60, b"PXEClient:Arch:0")]),
            Some(("undionly.kpxe", false))
        );
        assert_eq!(file_of(&[(77, b"\x09iPXE")]), None);
    }

    #[test]
    fn ipxe_without_a_script_is_firmware_like_any_other() {
        let b = Boot {
            ipxe_script_url: None,
            ..boot()
        };
        let n = said(&[(93, &[0, 7]), (77, b"iPXE")]);
        assert_eq!(answer(&b, &n).map(|a| a.file), Some("ipxe.efi"));
        // And a pool without the file for the architecture gives nothing.
        let bios_only = Boot {
            uefi_file: None,
            ..b
        };
        assert_eq!(answer(&bios_only, &n), None);
    }
}
