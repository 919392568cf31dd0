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
//! - **Watch and sweep** ([`watch`], at once; [`sweep`], every convergence): a route the kernel
//!   learned from an RA
//!   (`proto ra`) or a redirect on the interface, and an address it configured itself from an
//!   RA's prefix (any IPv6 address that is not permanent: ours, the pool's server address and
//!   the link-local one, are), are removed and reported: the watcher removes each as the kernel
//!   announces it (milliseconds after the RA), the sweep whatever came before the watcher or was
//!   missed; a warning, and
//!   `vmdhcp_agent_ipv6_learned_removed_total` ([`Host6Counters`]), beside
//!   `vmdhcp_agent_ipv6_host_settings`, which says whether the first layer holds.

use std::collections::BTreeMap;
use std::net::Ipv6Addr;
use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;
use vmdhcp_core::NamespacedName;

use futures_util::{StreamExt, TryStreamExt};
use rtnetlink::packet_core::NetlinkPayload;
use rtnetlink::packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage,
};
use rtnetlink::packet_route::route::{RouteAttribute, RouteMessage, RouteProtocol};
use rtnetlink::packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::sys::AsyncSocket;
use rtnetlink::{Handle, RouteMessageBuilder};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use crate::netlink::NetlinkError;

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

impl Host6Error {
    /// Whether the settings are not there (the interface does not exist yet, or has no IPv6),
    /// rather than not writable: worth trying again later.
    pub fn missing(&self) -> bool {
        matches!(self, Host6Error::Setting { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }
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

/// What the watcher or a [`sweep`] removed from an interface.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Learned {
    /// Routes learned from RAs or redirects: destination/prefix via gateway.
    pub routes: Vec<String>,
    /// Addresses configured from an RA's prefix.
    pub addresses: Vec<Ipv6Addr>,
}

/// What one interface's guard did, for `/metrics`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Host6Reading {
    /// The interface.
    pub interface: String,
    /// The pool served there.
    pub pool: String,
    /// Whether [`SETTINGS`] hold there (set by us or found so); `false`: only the sweep guards.
    pub settings: bool,
    /// Routes removed so far.
    pub routes_removed: u64,
    /// Addresses removed so far.
    pub addresses_removed: u64,
}

/// Per-interface state of the guard, shared with `/metrics`; cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Host6Counters(Arc<Mutex<BTreeMap<String, Host6Reading>>>);

impl Host6Counters {
    /// Notes whether `interface` (serving `pool`) has the host settings; starts its counts
    /// afresh when it serves another pool.
    pub fn settled(&self, interface: &str, pool: &NamespacedName, settings: bool) {
        let mut all = self.0.lock();
        let pool = pool.to_string();
        let entry = all.entry(interface.to_owned()).or_default();
        if entry.pool != pool {
            *entry = Host6Reading {
                interface: interface.to_owned(),
                pool,
                ..Host6Reading::default()
            };
        }
        entry.settings = settings;
    }

    /// Counts what was removed from `interface`.
    pub fn swept(&self, interface: &str, learned: &Learned) {
        if let Some(entry) = self.0.lock().get_mut(interface) {
            entry.routes_removed += u64::try_from(learned.routes.len()).unwrap_or(u64::MAX);
            entry.addresses_removed += u64::try_from(learned.addresses.len()).unwrap_or(u64::MAX);
        }
    }

    /// Whether `interface`'s settings were looked at (set, found so, or found not writable).
    pub fn settled_on(&self, interface: &str) -> bool {
        self.0.lock().contains_key(interface)
    }

    /// Forgets the interfaces `keep` rejects (their series leave `/metrics`).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.0.lock().retain(|name, _| keep(name));
    }

    /// Every interface's reading.
    pub fn read(&self) -> Vec<Host6Reading> {
        self.0.lock().values().cloned().collect()
    }
}

/// The interfaces the watcher guards: index → (name, pool). Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Guarded(Arc<Mutex<BTreeMap<u32, (String, NamespacedName)>>>);

impl Guarded {
    /// Guards the interface `name` (index `index`) serving `pool`.
    pub fn insert(&self, index: u32, name: &str, pool: &NamespacedName) {
        self.0.lock().insert(index, (name.to_owned(), pool.clone()));
    }

    /// Keeps guarding only the interfaces `keep` accepts.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.0.lock().retain(|_, (name, _)| keep(name));
    }

    /// Whether the interface `name` is guarded.
    pub fn contains(&self, name: &str) -> bool {
        self.0.lock().values().any(|(n, _)| n == name)
    }

    fn get(&self, index: u32) -> Option<(String, NamespacedName)> {
        self.0.lock().get(&index).cloned()
    }
}

/// Starts watching the kernel's IPv6 route and address events: a route or address that a
/// [`Guarded`] interface learned from its link is removed as soon as the kernel announces it,
/// counted in `counters` and logged. The task runs until aborted.
pub fn watch(guarded: Guarded, counters: Host6Counters) -> Result<JoinHandle<()>, NetlinkError> {
    let (mut connection, handle, mut messages) =
        rtnetlink::new_connection().map_err(NetlinkError::Connect)?;
    let groups = rtnetlink::constants::RTMGRP_IPV6_IFADDR | rtnetlink::constants::RTMGRP_IPV6_ROUTE;
    connection
        .socket_mut()
        .socket_mut()
        .bind(&rtnetlink::sys::SocketAddr::new(0, groups))
        .map_err(NetlinkError::Connect)?;
    tokio::spawn(connection);
    Ok(tokio::spawn(async move {
        while let Some((message, _)) = messages.next().await {
            let NetlinkPayload::InnerMessage(event) = message.payload else {
                continue;
            };
            match event {
                RouteNetlinkMessage::NewRoute(route) if learned_from_link(&route) => {
                    remove_route(&handle, &guarded, &counters, route).await;
                }
                RouteNetlinkMessage::NewAddress(address)
                    if address.header.family == AddressFamily::Inet6 =>
                {
                    remove_address(&handle, &guarded, &counters, address).await;
                }
                _ => {}
            }
        }
    }))
}

async fn remove_route(
    handle: &Handle,
    guarded: &Guarded,
    counters: &Host6Counters,
    route: RouteMessage,
) {
    let index = route.attributes.iter().find_map(|a| match a {
        RouteAttribute::Oif(i) => Some(*i),
        _ => None,
    });
    let Some((name, pool)) = index.and_then(|i| guarded.get(i)) else {
        return;
    };
    let shown = describe(&route);
    match handle.route().del(route).execute().await {
        Ok(()) => {
            let learned = Learned {
                routes: vec![shown.clone()],
                addresses: Vec::new(),
            };
            counters.swept(&name, &learned);
            warn!(interface = %name, %pool, route = %shown, "removed a route a Router Advertisement or redirect from a host on the pool network gave the agent");
        }
        Err(error) => {
            debug!(interface = %name, %pool, route = %shown, %error, "a learned route not removed (the sweep retries)")
        }
    }
}

async fn remove_address(
    handle: &Handle,
    guarded: &Guarded,
    counters: &Host6Counters,
    address: AddressMessage,
) {
    let flags = address.attributes.iter().find_map(|a| match a {
        AddressAttribute::Flags(f) => Some(*f),
        _ => None,
    });
    if !autoconfigured(address.header.flags, flags) {
        return;
    }
    let Some((name, pool)) = guarded.get(address.header.index) else {
        return;
    };
    let ip = address.attributes.iter().find_map(|a| match a {
        AddressAttribute::Address(std::net::IpAddr::V6(ip)) => Some(*ip),
        _ => None,
    });
    match handle.address().del(address).execute().await {
        Ok(()) => {
            let learned = Learned {
                routes: Vec::new(),
                addresses: ip.into_iter().collect(),
            };
            counters.swept(&name, &learned);
            warn!(interface = %name, %pool, address = ?ip, "removed an address a Router Advertisement from a host on the pool network gave the agent");
        }
        Err(error) => {
            debug!(interface = %name, %pool, address = ?ip, %error, "a learned address not removed (the sweep retries)")
        }
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

/// Removes from every [`Guarded`] interface each route and address it learned from its link
/// (see the module docs), as the watcher does, counted in `counters`: what came before the
/// watcher, or what it missed. One dump of the IPv6 routes and one of the IPv6 addresses,
/// whatever the number of interfaces.
pub async fn sweep(
    handle: &Handle,
    guarded: &Guarded,
    counters: &Host6Counters,
) -> Result<(), NetlinkError> {
    let query = |step| move |source| NetlinkError::query("pool interfaces", step, source);
    let routes: Vec<RouteMessage> = handle
        .route()
        .get(RouteMessageBuilder::<Ipv6Addr>::new().build())
        .execute()
        .try_filter(|route| std::future::ready(learned_from_link(route)))
        .try_collect()
        .await
        .map_err(query("list IPv6 routes"))?;
    for route in routes {
        remove_route(handle, guarded, counters, route).await;
    }
    let addresses: Vec<AddressMessage> = handle
        .address()
        .get()
        .execute()
        .try_filter(|address| std::future::ready(address.header.family == AddressFamily::Inet6))
        .try_collect()
        .await
        .map_err(query("list IPv6 addresses"))?;
    for address in addresses {
        remove_address(handle, guarded, counters, address).await;
    }
    Ok(())
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
        let err = settle(root.path(), "nope").unwrap_err();
        assert!(err.missing(), "{err}");
        let err = err.to_string();
        assert!(err.contains("net.ipv6.conf.nope.accept_ra"), "{err}");
        for bad in ["", "../x", "a/b", ".."] {
            assert!(
                matches!(settle(root.path(), bad), Err(Host6Error::BadName { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn counts_follow_the_interface_s_pool_and_go_with_it() {
        let counters = Host6Counters::default();
        let a: NamespacedName = "default/a".parse().unwrap();
        let b: NamespacedName = "default/b".parse().unwrap();
        let learned = Learned {
            routes: vec!["default via fe80::1 (ra)".into()],
            addresses: vec!["fd99::1".parse().unwrap(), "fd99::2".parse().unwrap()],
        };
        counters.swept("srv0", &learned);
        assert!(
            counters.read().is_empty(),
            "not counted before it is settled"
        );
        counters.settled("srv0", &a, false);
        counters.swept("srv0", &learned);
        counters.settled("srv0", &a, true);
        let read = counters.read();
        assert_eq!(
            (
                read[0].pool.as_str(),
                read[0].settings,
                read[0].routes_removed,
                read[0].addresses_removed
            ),
            ("default/a", true, 1, 2)
        );
        counters.settled("srv0", &b, true);
        assert_eq!(
            counters.read()[0].routes_removed,
            0,
            "another pool starts afresh"
        );
        counters.retain(|name| name != "srv0");
        assert!(counters.read().is_empty());
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
