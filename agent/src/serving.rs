//! What the agent answers on, as a function of leadership and the pools it knows.
//!
//! [`Serving::converge`] brings the machine to one of two shapes. As leader: every known pool's
//! interface carries exactly its server address and has a running DHCP server; interfaces of
//! pools that left (or whose address changed) are stopped and their address removed. As standby:
//! no server runs and no server address is configured, every pool shows `standby`. Stepping down
//! stops every socket first, then removes the addresses, so a deposed leader is silent before a
//! new one can start (the leader crate ends leadership before the Lease can expire elsewhere).
//!
//! Every server address it configures is announced by gratuitous ARP ([`crate::arp`]), so clients
//! that cached the previous leader's MAC renew by unicast with this one right away; stepping down
//! cancels the announcements still running before anything else.
//!
//! Beside each server runs a detector of other DHCP servers on the interface's network
//! ([`crate::dhcp::foreign`]; the DHCPv6 server looks for other DHCPv6 servers itself, with the
//! same settings), started and stopped with it: a standby looks for none, and
//! stepping down forgets what was found, so that only the serving agent reports suspects.
//!
//! A dual-stack pool's interface also carries the pool's IPv6 server address and runs a DHCPv6
//! server ([`crate::dhcp6`]) beside the DHCPv4 one, started and stopped with it; an interface
//! whose IPv6 side cannot be set up (IPv6 disabled in the pod, say) keeps serving IPv4.
//!
//! Every wanted pool interface, leading or standby, is also kept an IPv6 host that takes no
//! routing from its tenants ([`crate::host6`], when the agent configures interfaces): the
//! settings once, a watcher that removes what the kernel learns from a tenant's Router
//! Advertisement or redirect anyway as it appears, and a sweep on every convergence.
//!
//! This module owns the servers, the detectors, the addresses it configured and their
//! announcements; the pools come from the lease table (or, before anything is loaded, from the
//! bootstrap env).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::sync::Arc;

use tokio::task::JoinHandle;

use tracing::{debug, info, warn};
use vmdhcp_core::NamespacedName;
use vmdhcp_core::bootstrap::AgentNetworkConfig;

use crate::arp::Announcer;
use crate::dhcp::foreign::{Detectors, Target};
use crate::dhcp::server::{Interface, InterfaceStatus, Servers};
use crate::dhcp6::server::{Foreign6, Interface6, Servers6};
use crate::host6::{self, Guarded, Host6Counters};
use crate::lease_table::LeaseTable;
use crate::netlink::InterfaceSetup;
use crate::ra::{Advertised, Advertisers};

/// One interface the agent should serve on: its pool and server address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    /// The pool served there.
    pub pool: NamespacedName,
    /// The server address the interface carries.
    pub server_ip: Ipv4Addr,
    /// The pool's prefix length.
    pub prefix: u8,
    /// The IPv6 server address and prefix length of a dual-stack pool.
    pub ipv6: Option<(Ipv6Addr, u8)>,
    /// The Router Advertisements of a dual-stack pool that asks for them.
    pub ra: Option<Advertised>,
}

/// Interface name → what it should serve.
pub type WantedSet = BTreeMap<String, Wanted>;

/// The interfaces of the pools in the table.
pub fn wanted_from_table(table: &LeaseTable) -> WantedSet {
    table
        .pools()
        .values()
        .map(|p| {
            let c = p.config();
            (
                c.interface_name.clone(),
                Wanted {
                    pool: c.pool.clone(),
                    server_ip: c.server_ip,
                    prefix: c.subnet.prefix_len(),
                    ipv6: c
                        .ipv6
                        .as_ref()
                        .map(|v6| (v6.server_ip, v6.subnet.prefix_len())),
                    ra: c
                        .ipv6
                        .as_ref()
                        .filter(|v6| v6.router_advertisements)
                        .map(|v6| {
                            Advertised::of(v6.subnet, v6.server_ip, v6.router, v6.lease_seconds)
                        }),
                },
            )
        })
        .collect()
}

/// The interfaces the bootstrap env names (known before any lease is loaded).
pub fn wanted_from_bootstrap(configs: &[AgentNetworkConfig]) -> WantedSet {
    configs
        .iter()
        .map(|c| {
            (
                c.interface_name.clone(),
                Wanted {
                    pool: c.ip_pool_ref.clone(),
                    server_ip: c.server_ip,
                    prefix: c.cidr.prefix_len(),
                    ipv6: c.server_ipv6.zip(c.cidr_v6.map(|n| n.prefix_len())),
                    // Known once the pool's config is loaded.
                    ra: None,
                },
            )
        })
        .collect()
}

/// The servers and configured addresses of one agent.
pub struct Serving {
    servers: Servers,
    /// The DHCPv6 servers of dual-stack pools.
    servers6: Servers6,
    /// The Router Advertisements of the pools that ask for them.
    advertisers: Advertisers,
    /// Interface → the IPv6 server address we configured on it (and must remove).
    configured6: BTreeMap<String, (Ipv6Addr, u8)>,
    setup: Option<InterfaceSetup>,
    /// Announces each server address we configure.
    announcer: Announcer,
    /// Looks for other DHCP servers on each interface served.
    detectors: Detectors,
    /// Interface → the address we configured on it (and must remove).
    configured: BTreeMap<String, (Ipv4Addr, u8)>,
    /// Interfaces shown in the statuses (to remove those that are no longer wanted).
    shown: BTreeMap<String, Wanted>,
    /// Interfaces known to carry no server address of ours while standby.
    cleared: BTreeSet<String>,
    /// What the IPv6 guard did on each interface (whose settings it looked at), for `/metrics`.
    host6_counters: Host6Counters,
    /// The interfaces whose learned routes and addresses the watcher removes at once.
    guarded6: Guarded,
    /// The watcher, once an interface is configured ([`crate::host6::watch`]).
    watcher6: Option<JoinHandle<()>>,
}

impl Serving {
    /// What the IPv6 guard did on each interface ([`crate::host6`]), for `/metrics`.
    pub fn host6_counters(&self) -> Host6Counters {
        self.host6_counters.clone()
    }

    /// Serves from `table`; with `setup`, gives each interface its server address and announces
    /// it with `announcer` (pass [`Announcer::disabled`] to announce nothing); `detectors` look
    /// for other DHCP servers beside each server.
    pub fn new(
        table: Arc<LeaseTable>,
        setup: Option<InterfaceSetup>,
        announcer: Announcer,
        detectors: Detectors,
    ) -> Self {
        Serving {
            servers6: Servers6::new(Arc::clone(&table)).reporting_to(
                Arc::clone(detectors.suspects()),
                Foreign6 {
                    enabled: detectors.settings().enabled,
                    probe_interval: detectors.settings().probe_interval,
                },
            ),
            advertisers: Advertisers::default(),
            configured6: BTreeMap::new(),
            servers: Servers::new(table).reporting_to(Arc::clone(detectors.suspects())),
            setup,
            announcer,
            detectors,
            configured: BTreeMap::new(),
            shown: BTreeMap::new(),
            cleared: BTreeSet::new(),
            host6_counters: Host6Counters::default(),
            guarded6: Guarded::default(),
            watcher6: None,
        }
    }

    /// The servers, for the HTTP endpoints' statuses and counters.
    pub fn servers(&self) -> &Servers {
        &self.servers
    }

    /// The DHCPv6 servers, for the HTTP endpoints' counters.
    pub fn servers6(&self) -> &Servers6 {
        &self.servers6
    }

    /// The ARP announcement counters, for `/metrics`.
    pub fn arp_counters(&self) -> crate::arp::ArpCounters {
        self.announcer.counters()
    }

    /// The foreign-server probe counters, for `/metrics`.
    pub fn probe_counters(&self) -> crate::arp::SendCounters {
        self.detectors.counters()
    }

    /// Whether any interface is answering or configured.
    pub fn is_active(&self) -> bool {
        self.advertisers.running().next().is_some()
            || self.servers.running().next().is_some()
            || !self.configured.is_empty()
            || self.servers6.running().next().is_some()
            || !self.configured6.is_empty()
    }

    /// Brings servers and addresses to `wanted` (as leader) or to nothing (as standby).
    pub async fn converge(&mut self, leading: bool, wanted: &WantedSet) {
        if !leading {
            if self.is_active() {
                info!(
                    interfaces = self.configured.len(),
                    "not leading: stopping every DHCP server and removing server addresses"
                );
            }
            // No more announcing an address we give up; then silence, for every interface at
            // once; addresses after.
            self.announcer.cancel_all();
            self.advertisers.stop_all();
            self.servers6.stop_all().await;
            self.servers.stop_all(Some(InterfaceStatus::Standby)).await;
            // A standby looks for nothing and reports nothing: the new leader finds again
            // whatever is still there.
            self.detectors.stop_all().await;
            self.detectors.suspects().retain_pools(|_| false);
            for name in self.configured.keys().cloned().collect::<Vec<_>>() {
                self.unconfigure(&name).await;
            }
            for name in self.configured6.keys().cloned().collect::<Vec<_>>() {
                self.unconfigure6(&name).await;
            }
            self.clear_leftovers(wanted).await;
            self.guard6(wanted).await;
            self.show(wanted, true);
            return;
        }
        // Interfaces to stop: gone, or serving another pool or address.
        let stale: Vec<String> = self
            .servers
            .running()
            .map(|i| i.name.clone())
            .chain(self.configured.keys().cloned())
            .filter(|name| match (wanted.get(name), self.configured.get(name)) {
                (None, _) => true,
                (Some(w), Some((ip, prefix))) => (w.server_ip, w.prefix) != (*ip, *prefix),
                (Some(w), None) => self
                    .servers
                    .running()
                    .any(|i| &i.name == name && i.pool != w.pool),
            })
            .collect();
        // IPv6 sides to stop: gone, or another pool or address.
        let stale6: Vec<String> = self
            .servers6
            .running()
            .map(|i| i.name.clone())
            .chain(self.configured6.keys().cloned())
            .filter(|name| match wanted.get(name) {
                None => true,
                Some(w) => {
                    w.ipv6.is_none()
                        || self
                            .configured6
                            .get(name)
                            .is_some_and(|c| Some(*c) != w.ipv6)
                        || self
                            .servers6
                            .running()
                            .any(|i| &i.name == name && i.pool != w.pool)
                }
            })
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        for name in stale6 {
            self.advertisers.stop(&name);
            self.servers6.stop(&name).await;
            self.unconfigure6(&name).await;
        }
        for name in stale {
            self.servers.stop(&name, None).await;
            self.detectors.stop(&name).await;
            self.unconfigure(&name).await;
        }
        self.detectors
            .retain(|name| wanted.contains_key(name))
            .await;
        self.guard6(wanted).await;
        self.detectors
            .suspects()
            .retain_pools(|pool| wanted.values().any(|w| &w.pool == pool));
        for (name, w) in wanted {
            if let Some(setup) = &self.setup
                && !self.configured.contains_key(name)
            {
                match setup.configure(name, w.server_ip, w.prefix).await {
                    Ok(changes) => {
                        if changes.is_empty() {
                            info!(interface = %name, pool = %w.pool, ip = %w.server_ip, prefix = w.prefix, "interface already configured");
                        } else {
                            info!(interface = %name, pool = %w.pool, ip = %w.server_ip, prefix = w.prefix, removed = ?changes.removed, added = changes.added, brought_up = changes.brought_up, "interface configured");
                        }
                        self.configured
                            .insert(name.clone(), (w.server_ip, w.prefix));
                        self.cleared.remove(name);
                        // Even when the address was already there (left by a crashed run of
                        // ours): clients may still hold another replica's MAC for it.
                        self.announcer.announce(name, &w.pool, w.server_ip);
                    }
                    Err(error) => {
                        // Retried on the next convergence; the other pools go on.
                        warn!(interface = %name, pool = %w.pool, %error, "interface not configured");
                        self.servers.set_status(
                            name,
                            Some(InterfaceStatus::Failed {
                                error: error.to_string(),
                            }),
                        );
                        continue;
                    }
                }
            }
            self.servers.start(Interface {
                name: name.clone(),
                pool: w.pool.clone(),
            });
            if let Some((ip6, prefix6)) = w.ipv6 {
                self.serve_v6(name, &w.pool, ip6, prefix6).await;
            }
            match w.ra {
                Some(advertised) if self.configured6.contains_key(name) || self.setup.is_none() => {
                    self.advertisers.start(name, advertised);
                }
                _ => self.advertisers.stop(name),
            }
            self.detectors
                .ensure(Target {
                    interface: name.clone(),
                    pool: w.pool.clone(),
                    server_ip: w.server_ip,
                })
                .await;
        }
        self.show(wanted, false);
    }

    /// The IPv6 side of a dual-stack pool's interface: its server address, then its DHCPv6
    /// server. A failure is logged and retried on the next convergence; IPv4 goes on.
    async fn serve_v6(&mut self, name: &str, pool: &NamespacedName, ip: Ipv6Addr, prefix: u8) {
        if let Some(setup) = &self.setup
            && !self.configured6.contains_key(name)
        {
            match setup.configure6(name, ip, prefix).await {
                Ok(added) => {
                    info!(interface = %name, %pool, %ip, prefix, added, "IPv6 server address configured");
                    self.configured6.insert(name.to_owned(), (ip, prefix));
                    // Neighbours that cached the previous leader's MAC for it learn ours.
                    self.announcer.announce(name, pool, ip);
                }
                Err(error) => {
                    warn!(interface = %name, %pool, %error, "IPv6 server address not configured; serving IPv4 only");
                    return;
                }
            }
        }
        self.servers6.start(Interface6 {
            name: name.to_owned(),
            pool: pool.clone(),
        });
    }

    async fn unconfigure6(&mut self, name: &str) {
        let (Some(setup), Some((ip, prefix))) = (&self.setup, self.configured6.remove(name)) else {
            return;
        };
        match setup.undo6(name, ip, prefix).await {
            Ok(_) => info!(interface = %name, %ip, "IPv6 server address removed"),
            Err(error) => warn!(interface = %name, %ip, %error, "IPv6 server address not removed"),
        }
    }

    /// Stops everything and removes every address we configured (shutdown).
    pub async fn stop(&mut self) {
        self.converge(false, &WantedSet::new()).await;
    }

    /// Statuses: standby for each wanted interface when not leading; removed for the unwanted.
    fn show(&mut self, wanted: &WantedSet, standby: bool) {
        self.announcer.retain(|name| wanted.contains_key(name));
        for name in self.shown.keys() {
            if !wanted.contains_key(name) {
                self.servers.set_status(name, None);
            }
        }
        if standby {
            for name in wanted.keys() {
                self.servers
                    .set_status(name, Some(InterfaceStatus::Standby));
            }
        }
        self.shown = wanted.clone();
    }

    /// Removes server addresses this process did not configure but finds on a wanted interface:
    /// left by a previous run of the agent in the same pod that crashed while leading (the pod's
    /// network namespace outlives the container). Each interface is checked once per run, and
    /// again after we configured and removed it ourselves.
    async fn clear_leftovers(&mut self, wanted: &WantedSet) {
        let Some(setup) = &self.setup else { return };
        for (name, w) in wanted {
            if self.cleared.contains(name) {
                continue;
            }
            match setup.undo(name, w.server_ip, w.prefix).await {
                Ok(true) => {
                    info!(interface = %name, ip = %w.server_ip, "leftover server address removed (standby)");
                }
                Ok(false) => {}
                // Interface not there yet or netlink trouble: tried again next time.
                Err(error) => {
                    warn!(interface = %name, %error, "cannot check for a leftover server address");
                    continue;
                }
            }
            // A dual-stack pool's IPv6 server address, left the same way.
            if let Some((ip, prefix)) = w.ipv6 {
                match setup.undo6(name, ip, prefix).await {
                    Ok(true) => {
                        info!(interface = %name, %ip, "leftover IPv6 server address removed (standby)");
                    }
                    Ok(false) => {}
                    Err(error) => {
                        warn!(interface = %name, %error, "cannot check for a leftover IPv6 server address");
                        continue;
                    }
                }
            }
            self.cleared.insert(name.clone());
        }
    }

    /// Keeps the IPv6 side of every wanted interface a host's ([`crate::host6`]), leading or
    /// not: a standby's pool interfaces are on the same networks, and a tenant's RA would steer
    /// its routing as much. Interfaces no longer wanted are forgotten.
    async fn guard6(&mut self, wanted: &WantedSet) {
        let Some(setup) = &self.setup else {
            return;
        };
        self.guarded6.retain(|name| wanted.contains_key(name));
        self.host6_counters.retain(|name| wanted.contains_key(name));
        for (name, w) in wanted {
            settle6(&self.host6_counters, name, &w.pool);
            if !self.guarded6.contains(name)
                && let Ok((index, _)) = setup.link(name).await
            {
                self.guarded6.insert(index, name, &w.pool);
            }
        }
        if self.watcher6.is_none() && !wanted.is_empty() {
            match host6::watch(self.guarded6.clone(), self.host6_counters.clone()) {
                Ok(task) => self.watcher6 = Some(task),
                Err(error) => {
                    warn!(%error, "IPv6 routes and addresses learned from pool networks are removed every few seconds only")
                }
            }
        }
        if let Err(error) = host6::sweep(setup.handle(), &self.guarded6, &self.host6_counters).await
        {
            debug!(%error, "IPv6 routes not checked");
        }
    }

    async fn unconfigure(&mut self, name: &str) {
        self.announcer.cancel(name);
        let (Some(setup), Some((ip, prefix))) = (&self.setup, self.configured.remove(name)) else {
            return;
        };
        match setup.undo(name, ip, prefix).await {
            Ok(_) => info!(interface = %name, %ip, "server address removed"),
            Err(error) => warn!(interface = %name, %ip, %error, "server address not removed"),
        }
    }
}

/// Makes `name`'s IPv6 settings a host's ([`host6::settle`]), once: an interface not there yet
/// is tried again on the next convergence; one whose settings are not writable is said once.
fn settle6(counters: &Host6Counters, name: &str, pool: &NamespacedName) {
    if counters.settled_on(name) {
        return;
    }
    let settled = match host6::settle(Path::new(host6::PROC_CONF), name) {
        Ok(changed) => {
            if !changed.is_empty() {
                info!(interface = %name, %pool, ?changed, "IPv6 set to take no routing from the pool network");
            }
            true
        }
        Err(error) if error.missing() => {
            debug!(interface = %name, %pool, %error, "IPv6 settings not there yet");
            return;
        }
        Err(error) => {
            warn!(interface = %name, %pool, %error, "IPv6 settings not changed; what Router Advertisements or redirects teach the interface is removed as it appears");
            false
        }
    };
    counters.settled(name, pool, settled);
}

impl Drop for Serving {
    fn drop(&mut self) {
        if let Some(watcher) = self.watcher6.take() {
            watcher.abort();
        }
    }
}
