//! Network boot over DHCPv6 (RFC 5970): what a booting client says about itself (its
//! architecture, option 61; iPXE's user class; UEFI's vendor class; a request for option 59)
//! and the options the pool's boot settings give it.

use dhcproto::v6::{DhcpOption, DhcpOptions, OptionCode, UnknownOption, VendorClass};
use vmdhcp_core::pool::boot::{BootRequest, HTTP_CLIENT, IPXE_USER_CLASS, PXE_CLIENT};
use vmdhcp_core::pool::{BootV6, Firmware};
/// The enterprise number UEFI firmware puts in its vendor class, echoed when the client's is
/// unreadable.
const UEFI_ENTERPRISE: u32 = 343;

/// Adds the boot file URL (59), its parameters (60) and, for UEFI HTTP boot, the vendor class
/// `HTTPClient` (16) to `reply`, when `request` comes from a booting client the pool has a URL
/// for. Anything else gets nothing.
pub(super) fn add_boot(reply: &mut DhcpOptions, request: &DhcpOptions, boot: &BootV6) {
    let Some(firmware) = firmware(request, boot) else {
        return;
    };
    let Some(url) = boot.url_for(firmware) else {
        return;
    };
    reply.insert(DhcpOption::Unknown(UnknownOption::new(
        OptionCode::OptBootfileUrl,
        url.as_bytes().to_vec(),
    )));
    if !boot.parameters.is_empty() {
        let mut data = Vec::new();
        for p in &boot.parameters {
            // Parsed at most 255 bytes each, so the length always fits.
            let len = u16::try_from(p.len()).unwrap_or(u16::MAX);
            data.extend_from_slice(&len.to_be_bytes());
            data.extend_from_slice(&p.as_bytes()[..usize::from(len)]);
        }
        reply.insert(DhcpOption::Unknown(UnknownOption::new(
            OptionCode::OptBootfileParam,
            data,
        )));
    }
    if firmware == Firmware::UefiHttp {
        let num = match request.get(OptionCode::VendorClass) {
            Some(DhcpOption::VendorClass(v)) => v.num,
            _ => UEFI_ENTERPRISE,
        };
        reply.insert(DhcpOption::VendorClass(VendorClass {
            num,
            data: vec![HTTP_CLIENT.to_vec()],
        }));
    }
}

/// The firmware `request` boots as ([`BootRequest::firmware`]): its user class (15), client
/// architecture (61) and vendor class (16).
fn firmware(request: &DhcpOptions, boot: &BootV6) -> Option<Firmware> {
    let mut said = BootRequest::default();
    if let Some(DhcpOption::UserClass(u)) = request.get(OptionCode::UserClass) {
        said.ipxe = u.data.iter().any(|c| c == IPXE_USER_CLASS);
    }
    if let Some(DhcpOption::Unknown(u)) = request.get(OptionCode::ClientArchType)
        && let [hi, lo, ..] = u.data()
    {
        said.arch = Some(u16::from_be_bytes([*hi, *lo]));
    }
    if let Some(DhcpOption::VendorClass(v)) = request.get(OptionCode::VendorClass)
        && let Some(class) = v
            .data
            .iter()
            .find(|c| c.starts_with(HTTP_CLIENT) || c.starts_with(PXE_CLIENT))
    {
        said.vendor_class(class);
    }
    said.firmware(boot.ipxe_script_url.is_some())
}

#[cfg(test)]
mod tests {
    use dhcproto::v6::UserClass;

    use super::*;

    fn boot() -> BootV6 {
        BootV6 {
            uefi_file_url: Some("tftp://[fd00::5]/ipxe.efi".into()),
            uefi_http_url: Some("http://[fd00::5]/ipxe.efi".into()),
            ipxe_script_url: Some("http://[fd00::5]/vm.ipxe".into()),
            parameters: vec!["a=1".into(), "console".into()],
        }
    }

    fn arch(n: u16) -> DhcpOption {
        DhcpOption::Unknown(UnknownOption::new(
            OptionCode::ClientArchType,
            n.to_be_bytes().to_vec(),
        ))
    }

    fn answer(request: Vec<DhcpOption>, boot: &BootV6) -> DhcpOptions {
        let mut opts = DhcpOptions::new();
        for o in request {
            opts.insert(o);
        }
        let mut reply = DhcpOptions::new();
        add_boot(&mut reply, &opts, boot);
        reply
    }

    fn url(reply: &DhcpOptions) -> Option<String> {
        match reply.get(OptionCode::OptBootfileUrl) {
            Some(DhcpOption::Unknown(u)) => Some(String::from_utf8_lossy(u.data()).into_owned()),
            _ => None,
        }
    }

    #[test]
    fn uefi_pxe_gets_its_url_and_the_parameters_as_rfc_5970_lays_them_out() {
        let reply = answer(vec![arch(7)], &boot());
        assert_eq!(url(&reply).as_deref(), Some("tftp://[fd00::5]/ipxe.efi"));
        let Some(DhcpOption::Unknown(p)) = reply.get(OptionCode::OptBootfileParam) else {
            panic!("no parameters");
        };
        assert_eq!(p.data(), b"\x00\x03a=1\x00\x07console");
        assert!(reply.get(OptionCode::VendorClass).is_none());
    }

    #[test]
    fn uefi_http_boot_gets_the_vendor_class_back_and_ipxe_its_script() {
        let vendor = DhcpOption::VendorClass(VendorClass {
            num: 343,
            data: vec![b"HTTPClient:Arch:00016:UNDI:003001".to_vec()],
        });
        let reply = answer(vec![vendor], &boot());
        assert_eq!(url(&reply).as_deref(), Some("http://[fd00::5]/ipxe.efi"));
        assert_eq!(
            reply.get(OptionCode::VendorClass),
            Some(&DhcpOption::VendorClass(VendorClass {
                num: 343,
                data: vec![b"HTTPClient".to_vec()]
            }))
        );
        let ipxe = DhcpOption::UserClass(UserClass {
            data: vec![b"iPXE".to_vec()],
        });
        let reply = answer(vec![arch(7), ipxe], &boot());
        assert_eq!(url(&reply).as_deref(), Some("http://[fd00::5]/vm.ipxe"));
    }

    #[test]
    fn clients_that_do_not_boot_or_have_no_url_get_nothing() {
        assert!(
            answer(vec![], &boot())
                .get(OptionCode::OptBootfileUrl)
                .is_none()
        );
        // BIOS has no DHCPv6 boot; ARM64 UEFI no field.
        assert_eq!(url(&answer(vec![arch(0)], &boot())), None);
        assert_eq!(url(&answer(vec![arch(11)], &boot())), None);
        let no_http = BootV6 {
            uefi_http_url: None,
            ..boot()
        };
        assert_eq!(url(&answer(vec![arch(16)], &no_http)), None);
        assert!(
            answer(vec![arch(16)], &no_http)
                .get(OptionCode::OptBootfileParam)
                .is_none()
        );
    }
}
