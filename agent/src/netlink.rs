//! Interface setup over rtnetlink: before a pool is served, its interface must carry exactly the
//! server address (option 54 and the source of every reply) and be up.
//!
//! It owns the IPv4 addresses and the up flag of the interfaces it is asked to configure, and
//! nothing else: no routes, no other interfaces, no IPv6. Configuring is idempotent (an interface
//! already in shape is left untouched, so a restart does not drop traffic) and [`undo`] removes the
//! address again on stop.
//!
//! [`undo`]: InterfaceSetup::undo

use std::net::{IpAddr, Ipv4Addr};

use futures_util::TryStreamExt;
use ipnet::Ipv4Net;
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::packet_route::address::{AddressAttribute, AddressMessage};
use rtnetlink::packet_route::link::LinkFlags;
use rtnetlink::{Handle, LinkUnspec};

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
    fn change(interface: &str, step: &'static str, source: rtnetlink::Error) -> Self {
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
    fn query(interface: &str, step: &'static str, source: rtnetlink::Error) -> Self {
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
}

impl Changes {
    /// Whether nothing had to change.
    pub fn is_empty(&self) -> bool {
        self.removed.is_empty() && !self.added && !self.brought_up
    }
}

/// A connection to the kernel's routing socket, used for every interface of this agent.
pub struct InterfaceSetup {
    handle: Handle,
}

const ENODEV: i32 = 19;

impl InterfaceSetup {
    /// Opens the rtnetlink socket; its connection is driven by a task on the current runtime.
    pub fn connect() -> Result<Self, NetlinkError> {
        let (connection, handle, _) = rtnetlink::new_connection().map_err(NetlinkError::Connect)?;
        tokio::spawn(connection);
        Ok(InterfaceSetup { handle })
    }

    async fn link(&self, interface: &str) -> Result<(u32, bool), NetlinkError> {
        let mut links = self
            .handle
            .clone()
            .link()
            .get()
            .match_name(interface.to_owned())
            .execute();
        match links.try_next().await {
            Ok(Some(link)) => Ok((link.header.index, link.header.flags.contains(LinkFlags::Up))),
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

    async fn ipv4_addresses(
        &self,
        interface: &str,
        index: u32,
    ) -> Result<Vec<(Ipv4Net, AddressMessage)>, NetlinkError> {
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
            if msg.header.family != AddressFamily::Inet || msg.header.index != index {
                continue;
            }
            let addr = msg.attributes.iter().find_map(|a| match a {
                AddressAttribute::Local(IpAddr::V4(ip)) => Some(*ip),
                _ => None,
            });
            let addr = addr.or_else(|| {
                msg.attributes.iter().find_map(|a| match a {
                    AddressAttribute::Address(IpAddr::V4(ip)) => Some(*ip),
                    _ => None,
                })
            });
            if let Some(ip) = addr
                && let Ok(net) = Ipv4Net::new(ip, msg.header.prefix_len)
            {
                out.push((net, msg));
            }
        }
        Ok(out)
    }

    /// Makes `interface` carry exactly `server_ip/prefix` as IPv4 address and be up.
    pub async fn configure(
        &self,
        interface: &str,
        server_ip: Ipv4Addr,
        prefix: u8,
    ) -> Result<Changes, NetlinkError> {
        let err = |step: &'static str| move |source| NetlinkError::change(interface, step, source);
        let (index, up) = self.link(interface).await?;
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
        Ok(changes)
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
