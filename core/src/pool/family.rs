//! The two address families a pool allocates from, as one trait, so the range, the recorded
//! `allocated` map and the controller's allocator are written once and used for IPv4 and IPv6
//! alike: the same lowest-free rule, the same interval arithmetic, the same errors.
//!
//! The trait is implemented on the address types themselves ([`Ipv4Addr`], [`Ipv6Addr`]); an
//! address maps to an unsigned integer (`u32`, `u128`) in address order, which is what the
//! allocator's free intervals are kept in.

use std::fmt::{Debug, Display};
use std::hash::Hash;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// An address family: its address, the integer it is ordered by, and its network type.
pub trait Family:
    Copy + Ord + Hash + Debug + Display + FromStr + Send + Sync + Into<IpAddr> + 'static
{
    /// The address as an integer, in address order.
    type Int: Copy + Ord + Hash + Debug + Default + Send + Sync + 'static;
    /// A network of this family.
    type Net: Copy + Eq + Debug + Display + Send + Sync + Into<IpNet> + 'static;
    /// `IPv4` or `IPv6`, for messages.
    const NAME: &'static str;
    /// The protocol a host answers for its addresses with, for messages (`ARP`, `NDP`).
    const RESOLUTION: &'static str;

    /// The address's integer.
    fn to_int(self) -> Self::Int;
    /// The address of an integer.
    fn from_int(n: Self::Int) -> Self;
    /// `n + 1`, if there is one.
    fn succ(n: Self::Int) -> Option<Self::Int>;
    /// `n - 1`, if there is one.
    fn pred(n: Self::Int) -> Option<Self::Int>;
    /// How many addresses `first..=last` holds (`first <= last`), saturating at `u64::MAX`.
    fn span(first: Self::Int, last: Self::Int) -> u64;
    /// Whether `net` contains `addr`.
    fn contains(net: &Self::Net, addr: Self) -> bool;
    /// `net` with its host bits cleared.
    fn trunc(net: Self::Net) -> Self::Net;
    /// `ip` when it is of this family (an agent's report names addresses of either).
    fn of(ip: IpAddr) -> Option<Self>;
}

impl Family for Ipv4Addr {
    type Int = u32;
    type Net = Ipv4Net;
    const NAME: &'static str = "IPv4";
    const RESOLUTION: &'static str = "ARP";

    fn to_int(self) -> u32 {
        u32::from(self)
    }
    fn from_int(n: u32) -> Self {
        Ipv4Addr::from(n)
    }
    fn succ(n: u32) -> Option<u32> {
        n.checked_add(1)
    }
    fn pred(n: u32) -> Option<u32> {
        n.checked_sub(1)
    }
    fn span(first: u32, last: u32) -> u64 {
        u64::from(last - first) + 1
    }
    fn contains(net: &Ipv4Net, addr: Self) -> bool {
        net.contains(&addr)
    }
    fn trunc(net: Ipv4Net) -> Ipv4Net {
        net.trunc()
    }

    fn of(ip: IpAddr) -> Option<Self> {
        match ip {
            IpAddr::V4(v4) => Some(v4),
            IpAddr::V6(_) => None,
        }
    }
}

impl Family for Ipv6Addr {
    type Int = u128;
    type Net = Ipv6Net;
    const NAME: &'static str = "IPv6";
    const RESOLUTION: &'static str = "NDP";

    fn to_int(self) -> u128 {
        u128::from(self)
    }
    fn from_int(n: u128) -> Self {
        Ipv6Addr::from(n)
    }
    fn succ(n: u128) -> Option<u128> {
        n.checked_add(1)
    }
    fn pred(n: u128) -> Option<u128> {
        n.checked_sub(1)
    }
    fn span(first: u128, last: u128) -> u64 {
        u64::try_from(last - first)
            .ok()
            .and_then(|d| d.checked_add(1))
            .unwrap_or(u64::MAX)
    }
    fn contains(net: &Ipv6Net, addr: Self) -> bool {
        net.contains(&addr)
    }
    fn trunc(net: Ipv6Net) -> Ipv6Net {
        net.trunc()
    }

    fn of(ip: IpAddr) -> Option<Self> {
        match ip {
            IpAddr::V6(v6) => Some(v6),
            IpAddr::V4(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_follow_address_order_and_spans_saturate() {
        let a: Ipv6Addr = "fd00::10".parse().unwrap();
        let b: Ipv6Addr = "fd00::fff0".parse().unwrap();
        assert!(a.to_int() < b.to_int());
        assert_eq!(Ipv6Addr::span(a.to_int(), b.to_int()), 0xfff0 - 0x10 + 1);
        assert_eq!(Ipv6Addr::span(0, u128::MAX), u64::MAX);
        assert_eq!(Ipv4Addr::span(0, u32::MAX), 1 << 32);
        assert_eq!(Ipv6Addr::succ(u128::MAX), None);
        assert_eq!(Ipv4Addr::pred(0), None);
        assert_eq!(Ipv6Addr::from_int(b.to_int()), b);
    }

    /// `status.ipv6.allocated` keys are written as `Display` prints them: RFC 5952's form,
    /// whatever spelling was read.
    #[test]
    fn v6_keys_are_written_canonically() {
        let spelled: Ipv6Addr = "FD00:0:0:0:0:0:0:0010".parse().unwrap();
        assert_eq!(spelled.to_string(), "fd00::10");
    }
}
