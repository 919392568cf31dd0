//! Serving pools and leases read from a JSON file instead of the controller's stream: the
//! `vm-dhcp-agent serve-static` mode, used by the network-namespace tests and the benchmark to
//! run the real server with nothing else around it.
//!
//! The file is re-read on SIGHUP (a whole snapshot, as the stream's resync would deliver); the
//! set of interfaces is fixed at start. With `--configure-interfaces`, an interface that cannot be
//! configured is not served, as in `run`, and its status carries the error (not retried here); one
//! that is configured has its server address announced by gratuitous ARP, as in `run`. Interface
//! statuses, reload count and declined addresses are written to a status file, atomically,
//! whenever they change.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tracing::{info, warn};
use vmdhcp_core::MacAddr;
use vmdhcp_core::pool::{Lease, PoolConfig};

use super::server::{Interface, InterfaceStatus, Servers};
use crate::arp::Announcer;
use crate::http::HttpState;
use crate::lease_table::{Conflict, LeaseTable, PoolLeases};
use crate::netlink::InterfaceSetup;

/// Why the static server cannot start or reload.
#[derive(Debug, thiserror::Error)]
pub enum StaticConfigError {
    /// The file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not a valid config.
    #[error("{path} is not a valid static config: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        source: serde_json::Error,
    },
    /// The status file cannot be written.
    #[error("cannot write status file {path}: {source}")]
    WriteStatus {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The rtnetlink socket cannot be opened.
    #[error(transparent)]
    Netlink(crate::netlink::NetlinkError),
    /// Signal handlers cannot be installed.
    #[error("cannot install signal handlers: {0}")]
    Signal(std::io::Error),
}

/// The file: every pool with its leases.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct StaticConfig {
    /// The pools, each served on its `interface_name`.
    pub pools: Vec<StaticPool>,
}

/// One pool of the file.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct StaticPool {
    /// The pool's config.
    pub config: PoolConfig,
    /// Its leases.
    #[serde(default)]
    pub leases: Vec<StaticLease>,
}

/// One lease of the file; its pool is the one it is listed under.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct StaticLease {
    /// The NIC.
    pub mac: MacAddr,
    /// Its address.
    pub ip: Ipv4Addr,
}

/// What the status file holds.
#[derive(Debug, Serialize)]
struct Status<'a> {
    interfaces: &'a BTreeMap<String, InterfaceStatus>,
    reloads: u64,
    conflicts: BTreeMap<String, BTreeMap<Ipv4Addr, Conflict>>,
}

/// Reads the file into a whole snapshot.
pub fn load(path: &Path) -> Result<Vec<PoolLeases>, StaticConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| StaticConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    let config: StaticConfig =
        serde_json::from_str(&text).map_err(|source| StaticConfigError::Parse {
            path: path.to_owned(),
            source,
        })?;
    Ok(config
        .pools
        .into_iter()
        .map(|p| PoolLeases {
            leases: p
                .leases
                .into_iter()
                .map(|l| Lease {
                    pool: p.config.pool.clone(),
                    mac: l.mac,
                    ip: l.ip,
                })
                .collect(),
            config: p.config,
        })
        .collect())
}

fn apply(table: &LeaseTable, pools: Vec<PoolLeases>) {
    for error in table.apply_snapshot(pools) {
        warn!(%error, "lease skipped");
    }
}

fn write_status(
    path: &Path,
    interfaces: &BTreeMap<String, InterfaceStatus>,
    reloads: u64,
    table: &LeaseTable,
) -> Result<(), StaticConfigError> {
    let status = Status {
        interfaces,
        reloads,
        conflicts: table
            .conflicts()
            .into_iter()
            .map(|(pool, c)| (pool.to_string(), c))
            .collect(),
    };
    let err = |source| StaticConfigError::WriteStatus {
        path: path.to_owned(),
        source,
    };
    let text = serde_json::to_string_pretty(&status).map_err(|e| err(e.into()))?;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

/// How [`serve_file`] runs, beside the file itself.
#[derive(Clone, Debug, Default)]
pub struct ServeOptions {
    /// Where to write the status JSON.
    pub status_file: Option<PathBuf>,
    /// Where to serve the HTTP endpoints.
    pub http: Option<SocketAddr>,
    /// Give each pool's interface exactly its server address and bring it up before serving
    /// (rtnetlink), and remove the address on stop.
    pub configure_interfaces: bool,
}

/// Serves the file's pools until SIGTERM or SIGINT; SIGHUP re-reads the file.
pub async fn serve_file(path: &Path, options: ServeOptions) -> Result<(), StaticConfigError> {
    let ServeOptions {
        status_file,
        http,
        configure_interfaces,
    } = options;
    let status_file = status_file.as_deref();
    let pools = load(path)?;
    let setup = if configure_interfaces {
        Some(InterfaceSetup::connect().map_err(StaticConfigError::Netlink)?)
    } else {
        None
    };
    let mut announcer = if setup.is_some() {
        Announcer::open_or_warn()
    } else {
        Announcer::disabled()
    };
    let mut configured = Vec::new();
    // Interfaces that could not be configured are not served (as in `run`): their status says why.
    let mut unconfigured = BTreeMap::new();
    if let Some(setup) = &setup {
        for p in &pools {
            let c = &p.config;
            let (name, ip, prefix) = (&c.interface_name, c.server_ip, c.subnet.prefix_len());
            match setup.configure(name, ip, prefix).await {
                Ok(changes) if changes.is_empty() => {
                    info!(interface = %name, %ip, prefix, "interface already configured");
                    announcer.announce(name, &c.pool, ip);
                    configured.push((name.clone(), ip, prefix));
                }
                Ok(changes) => {
                    info!(interface = %name, %ip, prefix, removed = ?changes.removed, added = changes.added, brought_up = changes.brought_up, "interface configured");
                    announcer.announce(name, &c.pool, ip);
                    configured.push((name.clone(), ip, prefix));
                }
                // That pool is not served; the others go on.
                Err(error) => {
                    warn!(pool = %c.pool, %error, "interface not configured");
                    unconfigured.insert(name.clone(), error.to_string());
                }
            }
        }
    }
    let interfaces = pools
        .iter()
        .filter(|p| !unconfigured.contains_key(&p.config.interface_name))
        .map(|p| Interface {
            name: p.config.interface_name.clone(),
            pool: p.config.pool.clone(),
        })
        .collect();
    let table = Arc::new(LeaseTable::new());
    apply(&table, pools);
    let (stop, stopped) = watch::channel(false);
    let servers = Servers::spawn(Arc::clone(&table), interfaces, stopped);
    for (name, error) in unconfigured {
        servers.set_status(&name, Some(InterfaceStatus::Failed { error }));
    }
    // The static table changes only on reload (SIGHUP), which signals the resolver.
    let (table_changed, changes) = watch::channel(());
    let ntp_task = tokio::spawn(super::ntp::run(
        Arc::clone(&table),
        changes,
        stop.subscribe(),
    ));
    let mut statuses = servers.statuses();
    let (_loaded_tx, loaded) = watch::channel(true);
    let arp_counters = announcer.counters();
    let http_task = http.map(|addr| {
        let state = HttpState::new(
            Arc::clone(&table),
            loaded,
            servers.statuses(),
            servers.counters(),
        )
        .with_arp(arp_counters);
        let stopped = stop.subscribe();
        tokio::spawn(async move {
            if let Err(error) = crate::http::serve(addr, crate::http::router(state), stopped).await
            {
                warn!(%error, "HTTP endpoints stopped");
            }
        })
    });
    let mut hangup = signal(SignalKind::hangup()).map_err(StaticConfigError::Signal)?;
    let mut terminate = signal(SignalKind::terminate()).map_err(StaticConfigError::Signal)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(StaticConfigError::Signal)?;
    let mut reloads = 0u64;
    let mut conflicts = table.conflicts();
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(200));
    let mut dirty = true;
    loop {
        if dirty && let Some(status_path) = status_file {
            let current = statuses.borrow_and_update().clone();
            if let Err(error) = write_status(status_path, &current, reloads, &table) {
                warn!(%error, "status not written");
            }
        }
        dirty = true;
        tokio::select! {
            changed = statuses.changed() => {
                if changed.is_err() {
                    break;
                }
            }
            _ = hangup.recv() => {
                match load(path) {
                    Ok(pools) => {
                        apply(&table, pools);
                        table_changed.send_replace(());
                        reloads += 1;
                        info!(reloads, "config reloaded");
                    }
                    Err(error) => warn!(%error, "reload failed; keeping the current config"),
                }
            }
            _ = tick.tick() => {
                // Declines are recorded by the servers; surface them when they change.
                let now = table.conflicts();
                dirty = now != conflicts;
                conflicts = now;
            }
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
        }
    }
    let _ = stop.send(true);
    announcer.cancel_all();
    servers.join().await;
    let _ = ntp_task.await;
    if let Some(task) = http_task {
        let _ = task.await;
    }
    if let Some(setup) = &setup {
        for (name, ip, prefix) in configured {
            match setup.undo(&name, ip, prefix).await {
                Ok(_) => info!(interface = %name, %ip, "server address removed"),
                Err(error) => warn!(interface = %name, %error, "server address not removed"),
            }
        }
    }
    Ok(())
}
