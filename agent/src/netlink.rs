//! Interface setup over rtnetlink: before a pool is served, its interface must carry exactly the
//! server address (option 54 and the source of every reply), be up, and be a host's interface,
//! not a router's.
//!
//! It owns the IPv4 addresses, the up flag and the IPv4 device settings of the interfaces it is
//! asked to configure, and nothing else: no routes, no other interfaces, no IPv6. Configuring is
//! idempotent (an interface already in shape is left untouched, so a restart does not drop
//! traffic) and [`undo`] removes the address again on stop.
//!
//! **A pool interface never routes.** Every tenant on a pool network can send the agent any
//! frame. A pod's network namespace inherits IPv4 forwarding from the node, where Kubernetes
//! turns it on, so a VM that routed through the server address would reach the other pools'
//! networks and the pod network. [`HOST_DEVCONF`] is set on each pool interface through the
//! kernel's per-device settings (`IFLA_AF_SPEC`/`AF_INET`/`IFLA_INET_CONF` in `RTM_SETLINK`,
//! which needs CAP_NET_ADMIN only, not a writable `/proc/sys`): no forwarding of what arrives
//! there, no redirects sent or accepted, no source routes, no proxy ARP, and ARP answered only
//! for the interface's own address. The pod's own interface is left as Kubernetes set it. IPv6
//! devconf cannot be set over rtnetlink; [`crate::host6`] keeps the IPv6 side a host's.
//!
//! [`endpoint_interfaces`](InterfaceSetup::endpoint_interfaces) tells which interfaces the
//! agent's own HTTP endpoints may answer on: never a pool interface.
//!
//! **Replies reach the client, not whoever answered ARP last.** A reply to a renewing client
//! is unicast to its address, which the kernel resolves through the interface's neighbour
//! table, and any tenant can rewrite that entry with forged ARP replies. [`pin_neighbour`] makes
//! the entry the reservation's (address → the client's MAC, `NUD_PERMANENT`, which no ARP frame
//! changes) before such a reply is sent.
//!
//! [`undo`]: InterfaceSetup::undo

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use futures_util::TryStreamExt;
use ipnet::Ipv4Net;
use rtnetlink::packet_core::DefaultNla;
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::packet_route::address::{AddressAttribute, AddressHeaderFlags, AddressMessage};
use rtnetlink::packet_route::link::{
    AfSpecInet, AfSpecUnspec, InetDevConf, LinkAttribute, LinkFlags, LinkMessage,
};
use rtnetlink::{Handle, LinkUnspec};

use vmdhcp_core::MacAddr;

use crate::capability::{Capability, Missing};

/// Why an interface could not be configured; it concerns that interface (that pool) only.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    /// The rtnetlink socket cannot be opened.
    #[error("cannot open an rtnetlink socket: {0}")]
    Connect(std::io::Error),
    /// The interface does not exist in this network namespace.
    #[error("interface {interface} does not exist")]
    NoSuchInterface {
        /// The interface.
        interface: String,
    },
    /// No interface may carry the agent's endpoints for this listen address.
    #[error("no interface for endpoints listening on {listen}: {reason}")]
    NoEndpointInterface {
        /// The listen address.
        listen: IpAddr,
        /// Why.
        reason: String,
    },
    /// A request was refused.
    #[error("interface {interface}: cannot {step}: {source}{missing}")]
    Request {
        /// The interface.
        interface: String,
        /// What was being done.
        step: &'static str,
        /// The kernel's answer.
        source: rtnetlink::Error,
        /// CAP_NET_ADMIN, when the kernel refused a change for want of it.
        missing: Missing,
    },
}

impl NetlinkError {
    /// A refused change to `interface` (address, link state): these need CAP_NET_ADMIN, which
    /// the error names when the kernel refused for want of it.
    pub(crate) fn change(interface: &str, step: &'static str, source: rtnetlink::Error) -> Self {
        let errno = match &source {
            rtnetlink::Error::NetlinkError(message) => Some(message.raw_code().abs()),
            _ => None,
        };
        NetlinkError::Request {
            interface: interface.to_owned(),
            step,
            missing: Capability::NetAdmin.lacking_errno(errno),
            source,
        }
    }

    /// A failed read-only request about `interface` (lookups need no capability).
    pub(crate) fn query(interface: &str, step: &'static str, source: rtnetlink::Error) -> Self {
        NetlinkError::Request {
            interface: interface.to_owned(),
            step,
            source,
            missing: Missing(None),
        }
    }
}

/// What [`InterfaceSetup::configure`] had to change; all empty/false when it was already right.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Foreign IPv4 addresses removed.
    pub removed: Vec<Ipv4Net>,
    /// Whether the server address was added.
    pub added: bool,
    /// Whether the link was brought up.
    pub brought_up: bool,
    /// Whether its device settings were made a host's ([`HOST_DEVCONF`]).
    pub hardened: bool,
}

impl Changes {
    /// Whether nothing had to change.
    pub fn is_empty(&self) -> bool {
        self.removed.is_empty() && !self.added && !self.brought_up && !self.hardened
    }
}

/// The IPv4 device settings of a pool interface, as (`IPV4_DEVCONF_*` index, value): a host on
/// the tenants' network, never a router for them (see the module docs).
pub const HOST_DEVCONF: [(u16, u32); 7] = [
    (IPV4_DEVCONF_FORWARDING, 0),
    (IPV4_DEVCONF_PROXY_ARP, 0),
    (IPV4_DEVCONF_ACCEPT_REDIRECTS, 0),
    (IPV4_DEVCONF_SEND_REDIRECTS, 0),
    (IPV4_DEVCONF_ACCEPT_SOURCE_ROUTE, 0),
    // Answer ARP only for the interface's own address, never for the pod's other ones.
    (IPV4_DEVCONF_ARP_IGNORE, 1),
    // Ask ARP from the interface's own address only.
    (IPV4_DEVCONF_ARP_ANNOUNCE, 2),
];

// The kernel's `IPV4_DEVCONF_*` indexes (include/uapi/linux/ip.h).
const IPV4_DEVCONF_FORWARDING: u16 = 1;
const IPV4_DEVCONF_PROXY_ARP: u16 = 3;
const IPV4_DEVCONF_ACCEPT_REDIRECTS: u16 = 4;
const IPV4_DEVCONF_SEND_REDIRECTS: u16 = 6;
const IPV4_DEVCONF_ACCEPT_SOURCE_ROUTE: u16 = 9;
const IPV4_DEVCONF_ARP_ANNOUNCE: u16 = 18;
const IPV4_DEVCONF_ARP_IGNORE: u16 = 19;
/// `IFLA_INET_CONF` inside `IFLA_AF_SPEC`/`AF_INET`.
const IFLA_INET_CONF: u16 = 1;

/// The value of `IPV4_DEVCONF_*` index `index` in a device's settings as the kernel reports them.
fn devconf_value(conf: &InetDevConf, index: u16) -> i32 {
    match index {
        IPV4_DEVCONF_FORWARDING => conf.forwarding,
        IPV4_DEVCONF_PROXY_ARP => conf.proxy_arp,
        IPV4_DEVCONF_ACCEPT_REDIRECTS => conf.accept_redirects,
        IPV4_DEVCONF_SEND_REDIRECTS => conf.send_redirects,
        IPV4_DEVCONF_ACCEPT_SOURCE_ROUTE => conf.accept_source_route,
        IPV4_DEVCONF_ARP_ANNOUNCE => conf.arp_announce,
        IPV4_DEVCONF_ARP_IGNORE => conf.arp_ignore,
        _ => -1,
    }
}

/// The link's IPv4 device settings, when the kernel reported them.
fn inet_devconf(link: &LinkMessage) -> Option<InetDevConf> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::AfSpecUnspec(specs) => specs.iter().find_map(|s| match s {
            AfSpecUnspec::Inet(inet) => inet.iter().find_map(|i| match i {
                AfSpecInet::DevConf(conf) => Some(*conf),
                _ => None,
            }),
            _ => None,
        }),
        _ => None,
    })
}

/// Whether `conf` already is [`HOST_DEVCONF`].
fn is_host(conf: &InetDevConf) -> bool {
    HOST_DEVCONF
        .iter()
        .all(|&(index, value)| i64::from(devconf_value(conf, index)) == i64::from(value))
}

/// The `IFLA_AF_SPEC` attribute that sets [`HOST_DEVCONF`]. The kernel reads a set request's
/// `IFLA_INET_CONF` as nested attributes, one per setting (type = index, value = u32), unlike
/// the flat array it reports, so it is built here rather than from [`InetDevConf`].
fn host_devconf_attribute() -> LinkAttribute {
    let mut nested = Vec::with_capacity(HOST_DEVCONF.len() * 8);
    for (index, value) in HOST_DEVCONF {
        nested.extend_from_slice(&8u16.to_ne_bytes());
        nested.extend_from_slice(&index.to_ne_bytes());
        nested.extend_from_slice(&value.to_ne_bytes());
    }
    LinkAttribute::AfSpecUnspec(vec![AfSpecUnspec::Inet(vec![AfSpecInet::Other(
        DefaultNla::new(IFLA_INET_CONF, nested),
    )])])
}

/// Pins `ip` to `mac` in the neighbour table of interface `ifindex` (`NUD_PERMANENT`, replacing
/// what was there): the kernel then sends to `ip` at `mac` whatever ARP frames arrive. Blocking
/// (one netlink request and its acknowledgement), for the DHCP server's threads; needs
/// CAP_NET_ADMIN.
pub fn pin_neighbour(ifindex: u32, ip: Ipv4Addr, mac: MacAddr) -> std::io::Result<()> {
    use rtnetlink::packet_core::{
        NLM_F_ACK, NLM_F_CREATE, NLM_F_REPLACE, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload,
    };
    use rtnetlink::packet_route::RouteNetlinkMessage;
    use rtnetlink::packet_route::neighbour::{
        NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState,
    };
    use rtnetlink::sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

    let mut neighbour = NeighbourMessage::default();
    neighbour.header.family = AddressFamily::Inet;
    neighbour.header.ifindex = ifindex;
    neighbour.header.state = NeighbourState::Permanent;
    neighbour
        .attributes
        .push(NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)));
    neighbour
        .attributes
        .push(NeighbourAttribute::LinkLocalAddress(mac.0.to_vec()));
    let mut request = NetlinkMessage::from(RouteNetlinkMessage::NewNeighbour(neighbour));
    request.header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE;
    request.header.sequence_number = 1;
    request.finalize();
    let mut bytes = vec![0; request.buffer_len()];
    request.serialize(&mut bytes);

    let mut socket = Socket::new(NETLINK_ROUTE)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    socket.send(&bytes, 0)?;
    let (answer, _) = socket.recv_from_full()?;
    match NetlinkMessage::<RouteNetlinkMessage>::deserialize(&answer) {
        Ok(NetlinkMessage {
            payload: NetlinkPayload::Error(e),
            ..
        }) if e.code.is_some() => Err(e.to_io()),
        Ok(_) => Ok(()),
        Err(e) => Err(std::io::Error::other(e.to_string())),
    }
}

/// The interface of the IPv4 default route in `/proc/net/route`'s text, if there is one.
pub fn default_route_interface(proc_net_route: &str) -> Option<String> {
    const RTF_UP: u32 = 0x1;
    proc_net_route.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (iface, destination, flags, mask) = (
            fields.first()?,
            fields.get(1)?,
            fields.get(3)?,
            fields.get(7)?,
        );
        let up = u32::from_str_radix(flags, 16).ok()? & RTF_UP != 0;
        (up && *destination == "00000000" && *mask == "00000000").then(|| (*iface).to_owned())
    })
}

/// A connection to the kernel's routing socket, used for every interface of this agent.
pub struct InterfaceSetup {
    handle: Handle,
}

const ENODEV: i32 = 19;

impl InterfaceSetup {
    /// The rtnetlink handle, for the other modules that change what they own of an interface
    /// ([`crate::host6`]).
    pub(crate) fn handle(&self) -> &Handle {
        &self.handle
    }
}

impl InterfaceSetup {
    /// Opens the rtnetlink socket; its connection is driven by a task on the current runtime.
    pub fn connect() -> Result<Self, NetlinkError> {
        let (connection, handle, _) = rtnetlink::new_connection().map_err(NetlinkError::Connect)?;
        tokio::spawn(connection);
        Ok(InterfaceSetup { handle })
    }

    pub(crate) async fn link(&self, interface: &str) -> Result<(u32, bool), NetlinkError> {
        let link = self.link_message(interface).await?;
        Ok((link.header.index, link.header.flags.contains(LinkFlags::Up)))
    }

    async fn link_message(&self, interface: &str) -> Result<LinkMessage, NetlinkError> {
        let mut links = self
            .handle
            .clone()
            .link()
            .get()
            .match_name(interface.to_owned())
            .execute();
        match links.try_next().await {
            Ok(Some(link)) => Ok(link),
            Ok(None) => Err(NetlinkError::NoSuchInterface {
                interface: interface.to_owned(),
            }),
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code().abs() == ENODEV => {
                Err(NetlinkError::NoSuchInterface {
                    interface: interface.to_owned(),
                })
            }
            Err(source) => Err(NetlinkError::query(
                interface,
                "look the interface up",
                source,
            )),
        }
    }

    /// The addresses of `interface` (index `index`) of `family`, with their prefix lengths: the
    /// local address where the kernel reports one (IPv4), else the address.
    async fn addresses(
        &self,
        interface: &str,
        index: u32,
        family: AddressFamily,
    ) -> Result<Vec<(IpAddr, u8, AddressMessage)>, NetlinkError> {
        let mut stream = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute();
        let mut out = Vec::new();
        loop {
            let msg = match stream.try_next().await {
                Ok(Some(msg)) => msg,
                Ok(None) => break,
                Err(source) => {
                    return Err(NetlinkError::query(interface, "list its addresses", source));
                }
            };
            if msg.header.family != family || msg.header.index != index {
                continue;
            }
            let local = msg.attributes.iter().find_map(|a| match a {
                AddressAttribute::Local(ip) => Some(*ip),
                _ => None,
            });
            let addr = local.or_else(|| {
                msg.attributes.iter().find_map(|a| match a {
                    AddressAttribute::Address(ip) => Some(*ip),
                    _ => None,
                })
            });
            if let Some(ip) = addr {
                out.push((ip, msg.header.prefix_len, msg));
            }
        }
        Ok(out)
    }

    async fn ipv4_addresses(
        &self,
        interface: &str,
        index: u32,
    ) -> Result<Vec<(Ipv4Net, AddressMessage)>, NetlinkError> {
        let all = self
            .addresses(interface, index, AddressFamily::Inet)
            .await?;
        Ok(all
            .into_iter()
            .filter_map(|(ip, len, msg)| match ip {
                IpAddr::V4(ip) => Some((Ipv4Net::new(ip, len).ok()?, msg)),
                IpAddr::V6(_) => None,
            })
            .collect())
    }

    /// Makes `interface` carry exactly `server_ip/prefix` as IPv4 address and be up.
    pub async fn configure(
        &self,
        interface: &str,
        server_ip: Ipv4Addr,
        prefix: u8,
    ) -> Result<Changes, NetlinkError> {
        let err = |step: &'static str| move |source| NetlinkError::change(interface, step, source);
        let link = self.link_message(interface).await?;
        let (index, up) = (link.header.index, link.header.flags.contains(LinkFlags::Up));
        let wanted = Ipv4Net::new(server_ip, prefix).map_err(|_| {
            NetlinkError::query(
                interface,
                "build the server address",
                rtnetlink::Error::RequestFailed,
            )
        })?;
        let mut changes = Changes::default();
        let mut present = false;
        for (net, msg) in self.ipv4_addresses(interface, index).await? {
            if net == wanted {
                present = true;
                continue;
            }
            self.handle
                .address()
                .del(msg)
                .execute()
                .await
                .map_err(err("remove a foreign IPv4 address"))?;
            changes.removed.push(net);
        }
        if !present {
            self.handle
                .address()
                .add(index, IpAddr::V4(server_ip), prefix)
                .execute()
                .await
                .map_err(err("add the server address"))?;
            changes.added = true;
        }
        if !up {
            self.handle
                .link()
                .set(LinkUnspec::new_with_index(index).up().build())
                .execute()
                .await
                .map_err(err("set the link up"))?;
            changes.brought_up = true;
        }
        if !inet_devconf(&link).is_some_and(|conf| is_host(&conf)) {
            let mut message = LinkUnspec::new_with_index(index).build();
            message.attributes.push(host_devconf_attribute());
            self.handle
                .link()
                .set(message)
                .execute()
                .await
                .map_err(err("turn forwarding, redirects and proxy ARP off"))?;
            changes.hardened = true;
        }
        Ok(changes)
    }

    /// The IPv4 device settings of `interface` that [`HOST_DEVCONF`] names, as the kernel
    /// reports them: (index, value). For checks and tests.
    pub async fn host_settings(&self, interface: &str) -> Result<Vec<(u16, i32)>, NetlinkError> {
        let link = self.link_message(interface).await?;
        let conf = inet_devconf(&link).ok_or_else(|| {
            NetlinkError::query(
                interface,
                "read its IPv4 device settings",
                rtnetlink::Error::RequestFailed,
            )
        })?;
        Ok(HOST_DEVCONF
            .iter()
            .map(|&(index, _)| (index, devconf_value(&conf, index)))
            .collect())
    }

    /// The interfaces on which the agent's own endpoints listening on `listen` may answer, none
    /// of them in `pools` (the served interfaces) nor named as a pool interface. Linux accepts a
    /// packet for any local address on any interface, so an endpoint bound to an address alone
    /// would answer a VM that sends to that address (the pod IP routed via the server address)
    /// through its pool interface; bound to these devices, it answers only what arrives on
    /// them. For a given address: the interface that holds it (`lo` for loopback). For the
    /// unspecified address: the interface of the default route (the pod network) and `lo`.
    pub async fn endpoint_interfaces(
        &self,
        listen: IpAddr,
        pools: &[String],
    ) -> Result<Vec<String>, NetlinkError> {
        let refuse = |reason: String| NetlinkError::NoEndpointInterface { listen, reason };
        let mut wanted = Vec::new();
        if listen.is_unspecified() {
            let routes = std::fs::read_to_string("/proc/net/route")
                .map_err(|e| refuse(format!("cannot read /proc/net/route: {e}")))?;
            let default = default_route_interface(&routes).ok_or_else(|| {
                refuse("no IPv4 default route; give a listen address instead".into())
            })?;
            wanted.push(default);
            wanted.push("lo".to_owned());
        } else {
            wanted.push(
                self.interface_holding(listen).await?.ok_or_else(|| {
                    refuse("no interface of this network namespace holds it".into())
                })?,
            );
        }
        // The pools known now, and any interface named as vmdhcp names pool interfaces (a pool
        // added later).
        if let Some(pool) = wanted
            .iter()
            .find(|w| pools.contains(w) || w.starts_with(vmdhcp_core::ifname::PREFIX))
        {
            return Err(refuse(format!(
                "{pool} serves a pool: the endpoints would answer its tenants"
            )));
        }
        wanted.dedup();
        Ok(wanted)
    }

    /// The name of the interface that holds `ip`, if one does.
    async fn interface_holding(&self, ip: IpAddr) -> Result<Option<String>, NetlinkError> {
        let here = "this network namespace";
        let mut addresses = self.handle.address().get().execute();
        let mut index = None;
        loop {
            match addresses.try_next().await {
                Ok(Some(msg)) => {
                    let holds = msg.attributes.iter().any(|a| {
                        matches!(a, AddressAttribute::Local(a) | AddressAttribute::Address(a) if *a == ip)
                    });
                    if holds {
                        index = Some(msg.header.index);
                        break;
                    }
                }
                Ok(None) => break,
                Err(source) => return Err(NetlinkError::query(here, "list addresses", source)),
            }
        }
        let Some(index) = index else {
            return Ok(None);
        };
        let mut links = self.handle.link().get().match_index(index).execute();
        match links.try_next().await {
            Ok(Some(link)) => Ok(link.attributes.iter().find_map(|a| match a {
                LinkAttribute::IfName(name) => Some(name.clone()),
                _ => None,
            })),
            Ok(None) => Ok(None),
            Err(source) => Err(NetlinkError::query(here, "look an interface up", source)),
        }
    }

    /// The IPv6 addresses of `interface` (index `index`) with their prefix lengths.
    async fn ipv6_addresses(
        &self,
        interface: &str,
        index: u32,
    ) -> Result<Vec<(Ipv6Addr, u8, AddressMessage)>, NetlinkError> {
        let all = self
            .addresses(interface, index, AddressFamily::Inet6)
            .await?;
        Ok(all
            .into_iter()
            .filter_map(|(ip, len, msg)| match ip {
                IpAddr::V6(ip) => Some((ip, len, msg)),
                IpAddr::V4(_) => None,
            })
            .collect())
    }

    /// Gives `interface` the IPv6 server address `server_ip/prefix` of a dual-stack pool (beside
    /// its link-local address, which DHCPv6 replies to clients come from). Added without
    /// duplicate address detection, so it is usable at once after a takeover: the pool's
    /// server address is ours by the pool's definition, and the previous leader's went with
    /// its step-down. Returns whether it was added.
    pub async fn configure6(
        &self,
        interface: &str,
        server_ip: Ipv6Addr,
        prefix: u8,
    ) -> Result<bool, NetlinkError> {
        let (index, _) = self.link(interface).await?;
        let present = self
            .ipv6_addresses(interface, index)
            .await?
            .iter()
            .any(|(ip, len, _)| (*ip, *len) == (server_ip, prefix));
        if present {
            return Ok(false);
        }
        let mut request = self
            .handle
            .address()
            .add(index, IpAddr::V6(server_ip), prefix);
        request.message_mut().header.flags |= AddressHeaderFlags::Nodad;
        request.execute().await.map_err(|source| {
            NetlinkError::change(interface, "add the IPv6 server address", source)
        })?;
        Ok(true)
    }

    /// Removes the IPv6 server address `server_ip/prefix` from `interface`. An interface or
    /// address already gone is not an error.
    pub async fn undo6(
        &self,
        interface: &str,
        server_ip: Ipv6Addr,
        prefix: u8,
    ) -> Result<bool, NetlinkError> {
        let index = match self.link(interface).await {
            Ok((index, _)) => index,
            Err(NetlinkError::NoSuchInterface { .. }) => return Ok(false),
            Err(e) => return Err(e),
        };
        for (ip, len, msg) in self.ipv6_addresses(interface, index).await? {
            if (ip, len) == (server_ip, prefix) {
                self.handle
                    .address()
                    .del(msg)
                    .execute()
                    .await
                    .map_err(|source| {
                        NetlinkError::change(interface, "remove the IPv6 server address", source)
                    })?;
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Removes `server_ip/prefix` from `interface` (when the pool stops being served here).
    /// An interface or address already gone is not an error.
    pub async fn undo(
        &self,
        interface: &str,
        server_ip: Ipv4Addr,
        prefix: u8,
    ) -> Result<bool, NetlinkError> {
        let index = match self.link(interface).await {
            Ok((index, _)) => index,
            Err(NetlinkError::NoSuchInterface { .. }) => return Ok(false),
            Err(e) => return Err(e),
        };
        let wanted = Ipv4Net::new(server_ip, prefix).ok();
        for (net, msg) in self.ipv4_addresses(interface, index).await? {
            if Some(net) == wanted {
                self.handle
                    .address()
                    .del(msg)
                    .execute()
                    .await
                    .map_err(|source| {
                        NetlinkError::change(interface, "remove the server address", source)
                    })?;
                return Ok(true);
            }
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtnetlink::packet_core::Nla;

    #[test]
    fn the_default_route_is_read_from_proc_net_route() {
        let table = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                     vmd1234\t004D0A0A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
                     eth0\t00000000\t0100F40A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n";
        assert_eq!(default_route_interface(table).as_deref(), Some("eth0"));
        let down = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\n\
                    eth0\t00000000\t0100F40A\t0002\t0\t0\t0\t00000000\n";
        assert_eq!(default_route_interface(down), None, "a route not up");
        assert_eq!(default_route_interface("Iface\n"), None);
        assert_eq!(default_route_interface("Iface\nshort line\n"), None);
    }

    #[test]
    fn the_set_request_nests_one_u32_attribute_per_setting() {
        let LinkAttribute::AfSpecUnspec(specs) = host_devconf_attribute() else {
            panic!("not IFLA_AF_SPEC");
        };
        let [AfSpecUnspec::Inet(inet)] = specs.as_slice() else {
            panic!("not AF_INET");
        };
        let [AfSpecInet::Other(conf)] = inet.as_slice() else {
            panic!("not one IFLA_INET_CONF");
        };
        assert_eq!(conf.kind(), IFLA_INET_CONF);
        let mut value = vec![0u8; conf.value_len()];
        conf.emit_value(&mut value);
        assert_eq!(value.len(), HOST_DEVCONF.len() * 8);
        for (chunk, (index, want)) in value.chunks(8).zip(HOST_DEVCONF) {
            assert_eq!(u16::from_ne_bytes([chunk[0], chunk[1]]), 8, "nla_len");
            assert_eq!(u16::from_ne_bytes([chunk[2], chunk[3]]), index);
            assert_eq!(
                u32::from_ne_bytes([chunk[4], chunk[5], chunk[6], chunk[7]]),
                want
            );
        }
    }

    #[test]
    fn a_routers_settings_are_not_a_hosts() {
        let mut host = InetDevConf::default();
        (host.arp_ignore, host.arp_announce) = (1, 2);
        assert!(is_host(&host));
        let mut router = host;
        (router.forwarding, router.send_redirects) = (1, 1);
        assert!(!is_host(&router));
    }
}
