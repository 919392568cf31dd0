//! The static file lease source: pools and leases read from a JSON file instead of the cluster,
//! for `vm-dhcp-agent serve-static` (the network-namespace tests and the benchmark run the real
//! agent with nothing else around it).
//!
//! It is one more source behind [`super::Sources`], so `serve-static` runs the same wiring as
//! `run` ([`crate::runtime`]): the same serving loop, interface setup, ARP announcements, NTP
//! name resolution and HTTP endpoints. What is its own: the file is read whole at start (an
//! unreadable file stops the agent), re-read whole on SIGHUP (a failed reload keeps the current
//! state), and interface statuses, reload count and declined addresses are written to a status
//! file, atomically, whenever they change.
//!
//! This module owns the file's format, its reloads and the status file; it never touches the
//! servers or interfaces.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::watch;
use tracing::{info, warn};
use vmdhcp_core::MacAddr;
use vmdhcp_core::crd::DhcpOptions;
use vmdhcp_core::pool::{Binding, NicOptions, PoolConfig};

use super::Sources;
use crate::dhcp::server::InterfaceStatus;
use crate::lease_table::{Conflict, LeaseTable};
use crate::pools::PoolLeases;

/// Why the file cannot be served or reloaded, or its status not written.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
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
    /// The SIGHUP handler cannot be installed.
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
    /// Its host name (option 12), if it is given one.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "host_name"
    )]
    pub host_name: Option<String>,
    /// Its IPv6 address, on a dual-stack pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<Ipv6Addr>,
    /// Its NIC's own DHCP options, in the shape of KubeVirt's `dhcpOptions` and under its
    /// rules (refused, naming the field, otherwise). Boxed: a file lists every lease, and most
    /// have none.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "dhcp_options"
    )]
    pub dhcp_options: Option<Box<DhcpOptions>>,
}

/// A lease's `dhcp_options`: refused, naming the field, unless KubeVirt's rules and our bounds
/// admit them.
fn dhcp_options<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Box<DhcpOptions>>, D::Error> {
    let options = Option::<Box<DhcpOptions>>::deserialize(d)?;
    if let Some(o) = &options
        && let Err(e) = NicOptions::parse(o)
    {
        let field = e.path("dhcp_options");
        return Err(serde::de::Error::custom(format!(
            "{field} {:?}: {e}",
            e.value()
        )));
    }
    Ok(options)
}

/// A lease's `host_name`: refused, naming the value, unless it is one we would hand out.
fn host_name<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let name = Option::<String>::deserialize(d)?;
    match name {
        Some(n) if !vmdhcp_core::names::is_host_name(&n) => Err(serde::de::Error::custom(format!(
            "host_name {n:?} is not a host name (dot-separated DNS-1123 labels, at most 63 bytes)"
        ))),
        other => Ok(other),
    }
}

/// What the status file holds.
#[derive(Debug, Serialize)]
struct Status<'a> {
    interfaces: &'a BTreeMap<String, InterfaceStatus>,
    reloads: u64,
    conflicts: BTreeMap<String, BTreeMap<Ipv4Addr, Conflict>>,
}

/// Reads the file into a whole snapshot.
pub fn load(path: &Path) -> Result<Vec<PoolLeases>, FileError> {
    let text = std::fs::read_to_string(path).map_err(|source| FileError::Read {
        path: path.to_owned(),
        source,
    })?;
    let config: StaticConfig = serde_json::from_str(&text).map_err(|source| FileError::Parse {
        path: path.to_owned(),
        source,
    })?;
    // A MAC listed twice under one pool keeps its last entry, as the table kept it when it read
    // the list itself.
    Ok(config
        .pools
        .into_iter()
        .map(|p| PoolLeases {
            leases: p
                .leases
                .into_iter()
                .map(|l| {
                    // Checked as the file was read.
                    let options = l.dhcp_options.as_deref().map(NicOptions::parse);
                    let binding = Binding {
                        options: options.and_then(Result::ok).flatten().map(Box::new),
                        ip: l.ip,
                        host_name: l.host_name,
                        ipv6: l.ipv6,
                    };
                    (l.mac, binding)
                })
                .collect(),
            config: p.config,
        })
        .collect())
}

fn write_status(
    path: &Path,
    interfaces: &BTreeMap<String, InterfaceStatus>,
    reloads: u64,
    table: &LeaseTable,
) -> Result<(), FileError> {
    let status = Status {
        interfaces,
        reloads,
        conflicts: table
            .conflicts()
            .into_iter()
            .map(|(pool, c)| (pool.to_string(), c))
            .collect(),
    };
    let err = |source| FileError::WriteStatus {
        path: path.to_owned(),
        source,
    };
    let text = serde_json::to_string_pretty(&status).map_err(|e| err(e.into()))?;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

/// Where the file source reads and reports.
#[derive(Clone, Debug)]
pub struct FileSettings {
    /// The file: `{"pools":[{"config":PoolConfig,"leases":[{"mac","ip"}]}]}`.
    pub path: PathBuf,
    /// Where to write interface statuses, reload count and declined addresses, as JSON.
    pub status_file: Option<PathBuf>,
}

/// How often declined addresses are looked at for the status file (the servers record them in
/// the table, which signals nothing).
const CONFLICT_POLL: Duration = Duration::from_millis(200);

/// The file, loaded into [`Sources`] and listening for SIGHUP; [`FileSource::follow`] then
/// reloads it and keeps the status file current.
pub struct FileSource {
    settings: FileSettings,
    sources: Arc<Sources>,
    table: Arc<LeaseTable>,
    hangup: Signal,
}

impl FileSource {
    /// Reads the file into `sources` (and so into `table`), and installs the SIGHUP handler at
    /// once, so that a reload asked for before [`FileSource::follow`] runs is not the default
    /// action (termination).
    pub fn open(
        settings: FileSettings,
        sources: Arc<Sources>,
        table: Arc<LeaseTable>,
    ) -> Result<Self, FileError> {
        let pools = load(&settings.path)?;
        let hangup = signal(SignalKind::hangup()).map_err(FileError::Signal)?;
        sources.file(pools);
        Ok(FileSource {
            settings,
            sources,
            table,
            hangup,
        })
    }

    /// Re-reads the file on SIGHUP and writes the status file whenever the interface
    /// `statuses`, the reload count or the declined addresses change, until `shutdown` turns
    /// true.
    pub async fn follow(
        mut self,
        mut statuses: watch::Receiver<BTreeMap<String, InterfaceStatus>>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut reloads = 0u64;
        let mut conflicts = self.table.conflicts();
        let mut tick = tokio::time::interval(CONFLICT_POLL);
        let mut dirty = true;
        loop {
            if dirty && let Some(status_path) = &self.settings.status_file {
                let current = statuses.borrow_and_update().clone();
                if let Err(error) = write_status(status_path, &current, reloads, &self.table) {
                    warn!(%error, "status not written");
                }
            }
            dirty = true;
            tokio::select! {
                changed = statuses.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                _ = self.hangup.recv() => match load(&self.settings.path) {
                    Ok(pools) => {
                        self.sources.file(pools);
                        reloads += 1;
                        info!(reloads, "config reloaded");
                    }
                    Err(error) => warn!(%error, "reload failed; keeping the current config"),
                },
                _ = tick.tick() => {
                    let now = self.table.conflicts();
                    dirty = now != conflicts;
                    conflicts = now;
                }
                changed = shutdown.changed() => {
                    if changed.is_err() || *shutdown.borrow() {
                        return;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_read_with_each_lease_in_its_pool() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pools.json");
        let config = serde_json::json!({"pools": [{
            "config": {
                "pool": "default/a", "network": "default/a", "interface_name": "srv0",
                "server_ip": "192.0.2.1", "subnet": "192.0.2.0/24", "router": null, "dns": [],
                "domain_name": null, "domain_search": [], "ntp": [], "lease_seconds": 60,
            },
            "leases": [{"mac": "02:00:00:00:00:01", "ip": "192.0.2.10"}],
        }]});
        std::fs::write(&path, config.to_string()).unwrap();
        let mac: MacAddr = "02:00:00:00:00:01".parse().unwrap();
        let pools = load(&path).unwrap();
        assert_eq!(pools.len(), 1);
        // The lease is held under the pool it is listed under.
        assert_eq!(pools[0].config.pool.to_string(), "default/a");
        assert_eq!(pools[0].leases[&mac].ip, Ipv4Addr::new(192, 0, 2, 10));

        assert_eq!(pools[0].leases[&mac].host_name, None);

        let mut named = config.clone();
        named["pools"][0]["leases"][0]["host_name"] = "vm-1".into();
        std::fs::write(&path, named.to_string()).unwrap();
        assert_eq!(
            load(&path).unwrap()[0].leases[&mac].host_name.as_deref(),
            Some("vm-1")
        );
        named["pools"][0]["leases"][0]["host_name"] = "not a name".into();
        std::fs::write(&path, named.to_string()).unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(
            e.contains("host_name \"not a name\" is not a host name"),
            "{e}"
        );

        let mut options = config.clone();
        options["pools"][0]["leases"][0]["dhcp_options"] = serde_json::json!({"bootFileName": "nic.efi", "privateOptions": [{"option": 240, "value": "x"}]});
        std::fs::write(&path, options.to_string()).unwrap();
        let read = load(&path).unwrap()[0].leases[&mac]
            .options
            .clone()
            .unwrap();
        assert_eq!(read.boot_file_name.as_deref(), Some("nic.efi"));
        assert_eq!(read.private, [(240, "x".to_owned())]);
        options["pools"][0]["leases"][0]["dhcp_options"]["privateOptions"][0]["option"] = 7.into();
        std::fs::write(&path, options.to_string()).unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(
            e.contains("dhcp_options.privateOptions[0].option \"7\": provided DHCPPrivateOptions are out of range"),
            "{e}"
        );

        std::fs::write(&path, "{").unwrap();
        assert!(matches!(load(&path), Err(FileError::Parse { .. })));
        assert!(matches!(
            load(&dir.path().join("missing.json")),
            Err(FileError::Read { .. })
        ));
    }
}
