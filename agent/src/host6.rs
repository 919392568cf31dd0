//! A pool interface is an IPv6 host that ignores its tenants' routing: no Router Advertisement,
//! redirect or Neighbor Solicitation a tenant sends changes the agent's own addresses or routes.
//!
//! A pod's network namespace starts with the kernel's defaults on every interface
//! (`accept_ra=1`, `autoconf=1`, `accept_redirects=1`), and Multus brings the pool interfaces
//! up with IPv6 on, dual-stack pool or not. One tenant's RA would then give the agent a SLAAC
//! address and a default route through the tenant, preferred over the pod's own (`pref high`),
//! with the hop limit and MTU it likes.
//!
//! Two layers, both on every interface the agent configures:
//! - **Settings** ([`settle`]): `accept_ra`, `autoconf`, `accept_redirects` and `proxy_ndp` set
//!   to 0 in `/proc/sys/net/ipv6/conf/<interface>/`. The kernel takes IPv6 device settings only
//!   there, not over rtnetlink (`inet6_set_link_af` accepts a token and an address-generation
//!   mode, nothing else), and a container's `/proc/sys` is read-only unless the runtime allows
//!   the writes. Where it is not writable, that is said once per interface, and the second layer
//!   does the work.
//! - **Sweep** ([`sweep`], every convergence): a route the kernel learned from an RA
//!   (`proto ra`) or a redirect on the interface, and an address it configured itself from an
//!   RA's prefix (any IPv6 address that is not permanent: ours, the pool's server address and
//!   the link-local one, are), are removed and reported.

use std::net::Ipv6Addr;
use std::path::Path;

use futures_util::TryStreamExt;
use rtnetlink::RouteMessageBuilder;
use rtnetlink::packet_route::address::{AddressAttribute, AddressFlags, AddressHeaderFlags};
use rtnetlink::packet_route::route::{RouteAttribute, RouteMessage, RouteProtocol};

use crate::netlink::{InterfaceSetup, NetlinkError};

/// Where the kernel keeps each interface's IPv6 settings.
pub const PROC_CONF: &str = "/proc/sys/net/ipv6/conf";

/// The IPv6 settings of a host that takes no routing from its link: no RAs (so no SLAAC address,
/// default route or hop limit from one), no autoconfiguration, no redirects, and no answering
/// Neighbor Solicitations for others.
pub const SETTINGS: [(&str, &str); 4] = [
    ("accept_ra", "0"),
    ("autoconf", "0"),
    ("accept_redirects", "0"),
    ("proxy_ndp", "0"),
];

/// Why the settings could not be made a host's.
#[derive(Debug, thiserror::Error)]
pub enum Host6Error {
    /// A setting could not be read or written (a read-only `/proc/sys` in a container, or IPv6
    /// off on the interface).
    #[error(
        "interface {interface}: cannot set net.ipv6.conf.{interface}.{setting} to {value}: {source}"
    )]
    Setting {
        /// The interface.
        interface: String,
        /// The setting.
        setting: &'static str,
        /// The value it should have.
        value: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The interface name would leave the settings' directory.
    #[error("interface {interface}: not a name the kernel gives an interface")]
    BadName {
        /// The name.
        interface: String,
    },
}

/// Sets [`SETTINGS`] for `interface` under `root` ([`PROC_CONF`]), writing only those that
/// differ; returns the ones it changed.
pub fn settle(root: &Path, interface: &str) -> Result<Vec<&'static str>, Host6Error> {
    if interface.is_empty() || interface.contains(['/', '\0']) || interface.starts_with('.') {
        return Err(Host6Error::BadName {
            interface: interface.to_owned(),
        });
    }
    let dir = root.join(interface);
    let mut changed = Vec::new();
    for (setting, value) in SETTINGS {
        let path = dir.join(setting);
        let err = |source| Host6Error::Setting {
            interface: interface.to_owned(),
            setting,
            value,
            source,
        };
        let now = std::fs::read_to_string(&path).map_err(err)?;
        if now.trim() != value {
            std::fs::write(&path, value).map_err(err)?;
            changed.push(setting);
        }
    }
    Ok(changed)
}

/// What a [`sweep`] removed from an interface.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Learned {
    /// Routes learned from RAs or redirects: destination/prefix via gateway.
    pub routes: Vec<String>,
    /// Addresses configured from an RA's prefix.
    pub addresses: Vec<Ipv6Addr>,
}

impl Learned {
    /// Whether nothing was found.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty() && self.addresses.is_empty()
    }
}

/// Whether the kernel learned `route` from the link: an RA (its default route, prefix and route
/// information options) or an ICMPv6 redirect.
fn learned_from_link(route: &RouteMessage) -> bool {
    matches!(
        route.header.protocol,
        RouteProtocol::Ra | RouteProtocol::IcmpRedirect
    )
}

/// Whether an address with these flags was configured by the kernel from an RA, not by anyone
/// on purpose: addresses added over rtnetlink or by the kernel for the link (link-local) are
/// permanent; SLAAC ones have lifetimes.
fn autoconfigured(header: AddressHeaderFlags, flags: Option<AddressFlags>) -> bool {
    let permanent = flags.map_or(header.contains(AddressHeaderFlags::Permanent), |f| {
        f.contains(AddressFlags::Permanent)
    });
    !permanent
}

/// Removes from `interface` every route and address it learned from its link (see the module
/// docs), and returns them.
pub async fn sweep(setup: &InterfaceSetup, interface: &str) -> Result<Learned, NetlinkError> {
    let (index, _) = setup.link(interface).await?;
    let handle = setup.handle();
    let mut learned = Learned::default();
    let mut routes = handle
        .route()
        .get(RouteMessageBuilder::<Ipv6Addr>::new().build())
        .execute();
    let mut doomed = Vec::new();
    loop {
        match routes.try_next().await {
            Ok(Some(route)) => {
                let here = route
                    .attributes
                    .iter()
                    .any(|a| matches!(a, RouteAttribute::Oif(i) if *i == index));
                if here && learned_from_link(&route) {
                    doomed.push(route);
                }
            }
            Ok(None) => break,
            Err(source) => return Err(NetlinkError::query(interface, "list IPv6 routes", source)),
        }
    }
    for route in doomed {
        let shown = describe(&route);
        handle
            .route()
            .del(route)
            .execute()
            .await
            .map_err(|source| {
                NetlinkError::change(interface, "remove a route learned from the link", source)
            })?;
        learned.routes.push(shown);
    }
    for (ip, _, msg) in setup.ipv6_addresses(interface, index).await? {
        let flags = msg.attributes.iter().find_map(|a| match a {
            AddressAttribute::Flags(f) => Some(*f),
            _ => None,
        });
        if autoconfigured(msg.header.flags, flags) {
            handle
                .address()
                .del(msg)
                .execute()
                .await
                .map_err(|source| {
                    NetlinkError::change(
                        interface,
                        "remove an address learned from the link",
                        source,
                    )
                })?;
            learned.addresses.push(ip);
        }
    }
    Ok(learned)
}

/// `destination/len via gateway` of a route, for logs.
fn describe(route: &RouteMessage) -> String {
    let mut destination = None;
    let mut gateway = None;
    for a in &route.attributes {
        match a {
            RouteAttribute::Destination(d) => destination = Some(format!("{d:?}")),
            RouteAttribute::Gateway(g) => gateway = Some(format!("{g:?}")),
            _ => {}
        }
    }
    let destination = destination.map_or_else(
        || "default".to_owned(),
        |d| format!("{d}/{}", route.header.destination_prefix_length),
    );
    match gateway {
        Some(g) => format!("{destination} via {g} ({})", route.header.protocol),
        None => format!("{destination} ({})", route.header.protocol),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf_dir(values: &str) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("srv0");
        std::fs::create_dir(&dir).unwrap();
        for (setting, _) in SETTINGS {
            std::fs::write(dir.join(setting), format!("{values}\n")).unwrap();
        }
        root
    }

    #[test]
    fn a_namespace_s_defaults_are_made_a_host_s_and_a_host_s_are_left_alone() {
        let root = conf_dir("1");
        assert_eq!(
            settle(root.path(), "srv0").unwrap(),
            ["accept_ra", "autoconf", "accept_redirects", "proxy_ndp"]
        );
        for (setting, value) in SETTINGS {
            let now = std::fs::read_to_string(root.path().join("srv0").join(setting)).unwrap();
            assert_eq!(now.trim(), value, "{setting}");
        }
        assert!(settle(root.path(), "srv0").unwrap().is_empty());
    }

    #[test]
    fn a_missing_or_unwritable_setting_is_an_error_naming_it() {
        let root = conf_dir("1");
        let err = settle(root.path(), "nope").unwrap_err().to_string();
        assert!(err.contains("net.ipv6.conf.nope.accept_ra"), "{err}");
        for bad in ["", "../x", "a/b", ".."] {
            assert!(
                matches!(settle(root.path(), bad), Err(Host6Error::BadName { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn only_what_the_link_taught_is_swept() {
        let mut route = RouteMessage::default();
        for (protocol, learned) in [
            (RouteProtocol::Ra, true),
            (RouteProtocol::IcmpRedirect, true),
            (RouteProtocol::Kernel, false),
            (RouteProtocol::Boot, false),
            (RouteProtocol::Static, false),
        ] {
            route.header.protocol = protocol;
            assert_eq!(learned_from_link(&route), learned, "{protocol:?}");
        }
        // SLAAC addresses have lifetimes; ours and the link-local one are permanent, whether
        // the flags come in the header's byte or the 32-bit attribute.
        assert!(autoconfigured(AddressHeaderFlags::empty(), None));
        assert!(!autoconfigured(AddressHeaderFlags::Permanent, None));
        assert!(!autoconfigured(
            AddressHeaderFlags::empty(),
            Some(AddressFlags::Permanent | AddressFlags::Nodad)
        ));
        assert!(autoconfigured(
            AddressHeaderFlags::Permanent,
            Some(AddressFlags::Managetempaddr)
        ));
    }
}
