//! Hardware addresses as the rest of the system sees them: six bytes, one canonical text form.
//!
//! KubeVirt accepts both `aa:bb:…` and `aa-bb-…` spellings in either case, and upstream compared
//! MACs as raw strings, so one NIC could hold two leases. Every MAC entering vmdhcp goes through
//! [`MacAddr::from_str`], and every MAC leaving it is lowercase colon form.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why a string is not a MAC address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MacError {
    /// Not six groups of two hex digits separated by one kind of separator (`:` or `-`).
    #[error(
        "invalid MAC address {value:?}: expected six pairs of hex digits separated by ':' or '-'"
    )]
    Malformed {
        /// The rejected input.
        value: String,
    },
}

/// An IEEE 802 MAC-48 address; `Display` gives the canonical lowercase colon form.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// The six address bytes, as they appear in a DHCP `chaddr` field.
    pub fn octets(&self) -> [u8; 6] {
        self.0
    }

    /// `mac` in canonical form, or `""` for none: how an optional MAC travels in proto string
    /// fields and stored reports.
    pub fn text_or_empty(mac: Option<MacAddr>) -> String {
        mac.map(|m| m.to_string()).unwrap_or_default()
    }

    /// The reverse of [`MacAddr::text_or_empty`]: `""` is none, anything else must be a MAC.
    pub fn parse_or_empty(s: &str) -> Result<Option<MacAddr>, MacError> {
        if s.is_empty() {
            Ok(None)
        } else {
            s.parse().map(Some)
        }
    }
}

impl FromStr for MacAddr {
    type Err = MacError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let malformed = || MacError::Malformed {
            value: s.to_owned(),
        };
        let bytes = s.as_bytes();
        if bytes.len() != 17 {
            return Err(malformed());
        }
        let sep = bytes[2];
        if sep != b':' && sep != b'-' {
            return Err(malformed());
        }
        let mut out = [0u8; 6];
        for (i, octet) in out.iter_mut().enumerate() {
            let at = i * 3;
            if i < 5 && bytes[at + 2] != sep {
                return Err(malformed());
            }
            let hi = hex_digit(bytes[at]).ok_or_else(malformed)?;
            let lo = hex_digit(bytes[at + 1]).ok_or_else(malformed)?;
            *octet = (hi << 4) | lo;
        }
        Ok(MacAddr(out))
    }
}

fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Lowercase `aa:bb:cc:dd:ee:ff`, written from one buffer: a MAC is formatted for every entry
/// of a pool's status each time it is written, and six `{:02x}` through the formatter would be a
/// visible share of the leader's CPU per allocation on full pools (docs/tuning.md).
impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut text = [b':'; 17];
        for (i, octet) in self.0.iter().enumerate() {
            text[i * 3] = HEX[usize::from(octet >> 4)];
            text[i * 3 + 1] = HEX[usize::from(octet & 0x0f)];
        }
        // Hex digits and colons only: always UTF-8.
        f.pad(std::str::from_utf8(&text).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MacAddr({self})")
    }
}

impl Serialize for MacAddr {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn normalises_case_and_separator() {
        let want = "fa:cf:8e:50:82:fc";
        for input in [
            "fa:cf:8e:50:82:fc",
            "FA:CF:8E:50:82:FC",
            "fa-cf-8e-50-82-fc",
            "Fa-Cf-8e-50-82-FC",
        ] {
            let mac: MacAddr = input.parse().unwrap();
            assert_eq!(mac.to_string(), want, "{input}");
        }
    }

    #[test]
    fn rejects_every_other_form() {
        for input in [
            "",
            "fa:cf:8e:50:82",
            "fa:cf:8e:50:82:fc:00",
            "facf.8e50.82fc",
            "facf8e5082fc",
            "fa:cf-8e:50:82:fc",
            "fa:cf:8e:50:82:fg",
            " fa:cf:8e:50:82:f",
            "fa:cf:8e:50:82:fc ",
            "fa::f:8e:50:82:fc",
            "ä:cf:8e:50:82:fc",
        ] {
            let err = input.parse::<MacAddr>().unwrap_err();
            assert!(
                err.to_string().contains("invalid MAC address"),
                "{input}: {err}"
            );
        }
    }

    #[test]
    fn an_optional_mac_round_trips_through_an_empty_or_canonical_string() {
        let mac: MacAddr = "FA-CF-8E-50-82-FC".parse().unwrap();
        assert_eq!(MacAddr::text_or_empty(Some(mac)), "fa:cf:8e:50:82:fc");
        assert_eq!(MacAddr::text_or_empty(None), "");
        assert_eq!(MacAddr::parse_or_empty(""), Ok(None));
        assert_eq!(MacAddr::parse_or_empty("fa:cf:8e:50:82:fc"), Ok(Some(mac)));
        assert!(MacAddr::parse_or_empty("zz").is_err());
    }

    #[test]
    fn serde_uses_canonical_form() {
        let mac: MacAddr = serde_json::from_str("\"AA-BB-CC-DD-EE-0F\"").unwrap();
        assert_eq!(
            serde_json::to_string(&mac).unwrap(),
            "\"aa:bb:cc:dd:ee:0f\""
        );
        assert!(serde_json::from_str::<MacAddr>("\"aa:bb\"").is_err());
    }

    proptest! {
        #[test]
        fn display_is_two_lowercase_hex_digits_per_octet(bytes in any::<[u8; 6]>()) {
            let [a, b, c, d, e, g] = bytes;
            prop_assert_eq!(
                MacAddr(bytes).to_string(),
                format!("{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
            );
            prop_assert_eq!(format!("{:>19}", MacAddr(bytes)).len(), 19);
        }

        #[test]
        fn display_parse_round_trips(bytes in any::<[u8; 6]>()) {
            let mac = MacAddr(bytes);
            prop_assert_eq!(mac.to_string().parse::<MacAddr>().unwrap(), mac);
            prop_assert_eq!(mac.to_string().to_uppercase().replace(':', "-").parse::<MacAddr>().unwrap(), mac);
        }

        #[test]
        fn arbitrary_strings_never_panic(s in ".{0,24}") {
            let _ = s.parse::<MacAddr>();
        }
    }
}
