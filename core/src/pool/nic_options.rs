//! The DHCP options one NIC carries from its VirtualMachine (KubeVirt's per-interface
//! `dhcpOptions`): their typed form ([`NicOptions`]), the one parse every reader goes through
//! (the VM reconciler, the config webhook, the status a pool records them in, the stream), and
//! the way back to the CRD's shape for that status.
//!
//! The rules are KubeVirt's own (its VirtualMachine webhook's), with its messages: private
//! option codes 224 to 254, each once; NTP servers IPv4 addresses. The bounds are ours, because
//! the pool's status records every NIC's options: one option's worth (255 bytes) per value, at
//! most 4 NTP servers, [`MAX_NIC_OPTIONS_BYTES`] in all.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use crate::crd::{DhcpOptions, DhcpPrivateOption};

/// The most one NIC's options hold, summed over their values.
pub const MAX_NIC_OPTIONS_BYTES: usize = 1024;
/// The longest value one option carries.
pub const MAX_OPTION_VALUE: usize = 255;
/// Most NTP servers a NIC names (as a pool's `ntp`).
pub const MAX_NIC_NTP: usize = 4;
/// The codes RFC 2132 §9.15 leaves for private use, as KubeVirt allows them.
pub const PRIVATE_CODES: std::ops::RangeInclusive<i64> = 224..=254;

/// Why a NIC's `dhcpOptions` are refused: the message says why, [`NicOptionsError::field`]
/// where (relative to `dhcpOptions`; empty for the whole block).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NicOptionsError {
    /// A private option's code outside 224–254 (KubeVirt's message).
    #[error("provided DHCPPrivateOptions are out of range, must be in range 224 to 254")]
    OutOfRange {
        /// e.g. `privateOptions[0].option`.
        field: String,
        /// The code.
        value: String,
    },
    /// Two private options with one code (KubeVirt's message).
    #[error("Found Duplicates: you have provided duplicate DHCPPrivateOptions")]
    Duplicate {
        /// The second option with the code, e.g. `privateOptions[1].option`.
        field: String,
        /// The code.
        value: String,
    },
    /// An NTP server that is not an IPv4 address (KubeVirt's message).
    #[error("NTP servers must be a list of valid IPv4 addresses.")]
    NotIpv4 {
        /// e.g. `ntpServers[1]`.
        field: String,
        /// The server.
        value: String,
    },
    /// A value longer than one option, a control character, too many NTP servers, or too many
    /// bytes in all.
    #[error("{reason}")]
    Unbounded {
        /// The field.
        field: String,
        /// The value, or how many there are.
        value: String,
        /// What is over.
        reason: String,
    },
}

impl NicOptionsError {
    /// The field, relative to `dhcpOptions`.
    pub fn field(&self) -> &str {
        match self {
            NicOptionsError::OutOfRange { field, .. }
            | NicOptionsError::Duplicate { field, .. }
            | NicOptionsError::NotIpv4 { field, .. }
            | NicOptionsError::Unbounded { field, .. } => field,
        }
    }

    /// The refused value (or how many there are, for a count).
    pub fn value(&self) -> &str {
        match self {
            NicOptionsError::OutOfRange { value, .. }
            | NicOptionsError::Duplicate { value, .. }
            | NicOptionsError::NotIpv4 { value, .. }
            | NicOptionsError::Unbounded { value, .. } => value,
        }
    }

    /// The field's full path, under `base` (the path of the `dhcpOptions` block).
    pub fn path(&self, base: &str) -> String {
        match self.field() {
            "" => base.to_owned(),
            field => format!("{base}.{field}"),
        }
    }
}

/// One NIC's options, checked; never empty.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NicOptions {
    /// Option 67.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_file_name: Option<String>,
    /// Option 66.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tftp_server_name: Option<String>,
    /// Option 42, in place of the pool's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ntp_servers: Vec<Ipv4Addr>,
    /// Private-use options, by code, each once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub private: Vec<(u8, String)>,
}

impl NicOptions {
    /// Parses KubeVirt-shaped `dhcpOptions`; `None` when they set nothing.
    pub fn parse(opts: &DhcpOptions) -> Result<Option<Self>, NicOptionsError> {
        let text = |field: &str, v: &Option<String>| -> Result<Option<String>, NicOptionsError> {
            match v.as_deref().filter(|v| !v.is_empty()) {
                None => Ok(None),
                Some(v) => value(field, v).map(|_| Some(v.to_owned())),
            }
        };
        if opts.ntp_servers.len() > MAX_NIC_NTP {
            return Err(unbounded(
                "ntpServers",
                opts.ntp_servers.len().to_string(),
                format!("names more than {MAX_NIC_NTP} servers"),
            ));
        }
        let mut ntp_servers = Vec::with_capacity(opts.ntp_servers.len());
        for (i, s) in opts.ntp_servers.iter().enumerate() {
            let ip = s.parse().map_err(|_| NicOptionsError::NotIpv4 {
                field: format!("ntpServers[{i}]"),
                value: s.clone(),
            })?;
            ntp_servers.push(ip);
        }
        let mut private = Vec::with_capacity(opts.private_options.len());
        let mut seen = BTreeSet::new();
        for (i, DhcpPrivateOption { option, value: v }) in opts.private_options.iter().enumerate() {
            let code = u8::try_from(*option)
                .ok()
                .filter(|_| PRIVATE_CODES.contains(option))
                .ok_or_else(|| NicOptionsError::OutOfRange {
                    field: format!("privateOptions[{i}].option"),
                    value: option.to_string(),
                })?;
            if !seen.insert(code) {
                return Err(NicOptionsError::Duplicate {
                    field: format!("privateOptions[{i}].option"),
                    value: option.to_string(),
                });
            }
            value(&format!("privateOptions[{i}].value"), v)?;
            private.push((code, v.clone()));
        }
        private.sort();
        let parsed = NicOptions {
            boot_file_name: text("bootFileName", &opts.boot_file_name)?,
            tftp_server_name: text("tftpServerName", &opts.tftp_server_name)?,
            ntp_servers,
            private,
        };
        let total = parsed.boot_file_name.as_ref().map_or(0, String::len)
            + parsed.tftp_server_name.as_ref().map_or(0, String::len)
            + parsed.ntp_servers.len() * 4
            + parsed.private.iter().map(|(_, v)| v.len()).sum::<usize>();
        if total > MAX_NIC_OPTIONS_BYTES {
            return Err(unbounded(
                "",
                total.to_string(),
                format!("hold {total} bytes, more than {MAX_NIC_OPTIONS_BYTES}"),
            ));
        }
        Ok((parsed != NicOptions::default()).then_some(parsed))
    }

    /// The CRD's shape, as the pool's status records it.
    pub fn to_crd(&self) -> DhcpOptions {
        DhcpOptions {
            boot_file_name: self.boot_file_name.clone(),
            tftp_server_name: self.tftp_server_name.clone(),
            ntp_servers: self.ntp_servers.iter().map(ToString::to_string).collect(),
            private_options: self
                .private
                .iter()
                .map(|(code, value)| DhcpPrivateOption {
                    option: i64::from(*code),
                    value: value.clone(),
                })
                .collect(),
        }
    }
}

fn unbounded(field: &str, value: String, reason: String) -> NicOptionsError {
    NicOptionsError::Unbounded {
        field: field.to_owned(),
        value,
        reason,
    }
}

/// One option's value: at most [`MAX_OPTION_VALUE`] bytes, no control characters.
fn value(field: &str, v: &str) -> Result<(), NicOptionsError> {
    if v.len() > MAX_OPTION_VALUE {
        return Err(unbounded(
            field,
            v.to_owned(),
            format!("is longer than {MAX_OPTION_VALUE} bytes"),
        ));
    }
    if v.chars().any(char::is_control) {
        let reason = "holds a control character".to_owned();
        return Err(unbounded(field, v.to_owned(), reason));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn private(option: i64, value: &str) -> DhcpPrivateOption {
        DhcpPrivateOption {
            option,
            value: value.into(),
        }
    }

    #[test]
    fn kubevirt_s_options_parse_and_go_back_to_its_shape() {
        let opts = DhcpOptions {
            boot_file_name: Some("pxelinux.0".into()),
            tftp_server_name: Some("tftp.example".into()),
            ntp_servers: vec!["192.0.2.123".into()],
            private_options: vec![private(252, "http://wpad/wpad.dat"), private(240, "x")],
        };
        let parsed = NicOptions::parse(&opts).unwrap().unwrap();
        assert_eq!(parsed.ntp_servers, [Ipv4Addr::new(192, 0, 2, 123)]);
        // Kept in code order.
        assert_eq!(
            parsed.private,
            [
                (240, "x".to_owned()),
                (252, "http://wpad/wpad.dat".to_owned())
            ]
        );
        let back = parsed.to_crd();
        assert_eq!(NicOptions::parse(&back).unwrap().unwrap(), parsed);
        assert_eq!(NicOptions::parse(&DhcpOptions::default()).unwrap(), None);
    }

    #[test]
    fn kubevirt_s_rules_are_refused_with_its_messages() {
        let refused = |opts: DhcpOptions| {
            let e = NicOptions::parse(&opts).unwrap_err();
            format!("{}: {e}", e.path("dhcpOptions"))
        };
        assert_eq!(
            refused(DhcpOptions {
                private_options: vec![private(223, "x")],
                ..Default::default()
            }),
            "dhcpOptions.privateOptions[0].option: provided DHCPPrivateOptions are out of range, must be in range 224 to 254"
        );
        assert_eq!(
            refused(DhcpOptions {
                private_options: vec![private(240, "a"), private(240, "b")],
                ..Default::default()
            }),
            "dhcpOptions.privateOptions[1].option: Found Duplicates: you have provided duplicate DHCPPrivateOptions"
        );
        assert_eq!(
            refused(DhcpOptions {
                ntp_servers: vec!["192.0.2.1".into(), "::1".into()],
                ..Default::default()
            }),
            "dhcpOptions.ntpServers[1]: NTP servers must be a list of valid IPv4 addresses."
        );
    }

    #[test]
    fn the_bounds_hold() {
        let refused = |opts: DhcpOptions| NicOptions::parse(&opts).unwrap_err();
        let long = refused(DhcpOptions {
            boot_file_name: Some("x".repeat(256)),
            ..Default::default()
        });
        assert_eq!(long.field(), "bootFileName");
        let control = refused(DhcpOptions {
            private_options: vec![private(224, "a\nb")],
            ..Default::default()
        });
        assert_eq!(control.field(), "privateOptions[0].value");
        let many = refused(DhcpOptions {
            ntp_servers: vec!["192.0.2.1".into(); 5],
            ..Default::default()
        });
        assert_eq!(many.field(), "ntpServers");
        let big = refused(DhcpOptions {
            private_options: (224..=230).map(|c| private(c, &"v".repeat(200))).collect(),
            ..Default::default()
        });
        assert_eq!(
            (big.path("dhcpOptions"), big.to_string()),
            (
                "dhcpOptions".to_owned(),
                "hold 1400 bytes, more than 1024".to_owned()
            )
        );
    }
}
