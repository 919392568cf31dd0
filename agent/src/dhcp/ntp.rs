//! Resolving the NTP servers pools name by host (option 42 carries IPv4 addresses only), off the
//! packet path: a pass looks up every distinct host name of every pool once and records the
//! result in the [`LeaseTable`], which the next reply uses.
//!
//! Upstream resolved once, when a lease was created, so a changed DNS record never reached
//! clients; here a pass runs periodically. A name that does not resolve keeps what it resolved
//! to last, so a DNS outage does not take NTP servers out of replies.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::lease_table::LeaseTable;

/// How long one name may take to resolve.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);
/// How often names are resolved again.
pub const REFRESH: Duration = Duration::from_secs(30);

/// The IPv4 addresses of `host`, in the resolver's order, or `None` if it does not resolve.
async fn lookup(host: &str) -> Option<Vec<Ipv4Addr>> {
    let found = tokio::time::timeout(LOOKUP_TIMEOUT, tokio::net::lookup_host((host, 123))).await;
    match found {
        Ok(Ok(addrs)) => {
            let mut out = Vec::new();
            for addr in addrs {
                if let IpAddr::V4(ip) = addr.ip()
                    && !out.contains(&ip)
                {
                    out.push(ip);
                }
            }
            (!out.is_empty()).then_some(out)
        }
        Ok(Err(error)) => {
            warn!(%host, %error, "NTP server name does not resolve");
            None
        }
        Err(_) => {
            warn!(%host, "NTP server name lookup timed out");
            None
        }
    }
}

/// Resolves every pool's NTP host names and records the results. `known` carries each name's
/// last good answer from one pass to the next; with `only_new`, names already known are not
/// looked up again (a table change: new pools get their addresses at once, without a DNS
/// query per lease delta).
pub async fn resolve_once(
    table: &LeaseTable,
    known: &mut BTreeMap<String, Vec<Ipv4Addr>>,
    only_new: bool,
) {
    let pools = table.pools();
    let names: BTreeSet<&str> = pools
        .values()
        .flat_map(|p| p.config().ntp.iter())
        .map(String::as_str)
        .filter(|n| n.parse::<Ipv4Addr>().is_err())
        .filter(|n| !only_new || !known.contains_key(*n))
        .collect();
    for name in names {
        if let Some(addrs) = lookup(name).await {
            debug!(host = %name, ?addrs, "NTP server name resolved");
            known.insert(name.to_owned(), addrs);
        }
    }
    for (pool, snap) in &pools {
        let ntp = &snap.config().ntp;
        let mut addrs: Vec<Ipv4Addr> = Vec::new();
        for entry in ntp {
            let resolved = match entry.parse::<Ipv4Addr>() {
                Ok(ip) => vec![ip],
                Err(_) => known.get(entry).cloned().unwrap_or_default(),
            };
            for ip in resolved {
                if !addrs.contains(&ip) {
                    addrs.push(ip);
                }
            }
        }
        if table.set_ntp_addresses(pool, ntp, addrs) {
            info!(%pool, ntp = ?snap.config().ntp, "NTP servers for option 42 updated");
        }
    }
}

/// Resolves every [`REFRESH`], and on each change `changes` signals (the lease table was
/// written: a pool may name a new host), until `shutdown` turns true (or its sender goes away).
pub async fn run<T>(
    table: Arc<LeaseTable>,
    mut changes: watch::Receiver<T>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut known = BTreeMap::new();
    let mut refresh = tokio::time::interval(REFRESH);
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut changes_open = true;
    loop {
        tokio::select! {
            _ = refresh.tick() => resolve_once(&table, &mut known, false).await,
            changed = changes.changed(), if changes_open => {
                if changed.is_ok() {
                    resolve_once(&table, &mut known, true).await;
                } else {
                    changes_open = false;
                }
            }
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pools::PoolLeases;
    use vmdhcp_core::NamespacedName;
    use vmdhcp_core::fixtures::pool_config;
    use vmdhcp_core::pool::PoolConfig;

    #[tokio::test]
    async fn host_names_resolve_literals_stay_and_failures_keep_the_last_answer() {
        let name = NamespacedName::new("default", "a").unwrap();
        let table = LeaseTable::new();
        let config = PoolConfig {
            // localhost resolves from /etc/hosts, without any network; the .invalid TLD never
            // resolves (RFC 6761).
            ntp: vec![
                "192.0.2.123".into(),
                "localhost".into(),
                "ntp.invalid".into(),
            ],
            ..pool_config("default/a")
        };
        table.apply_snapshot(&[PoolLeases::new(config)]);
        let mut known = BTreeMap::new();
        resolve_once(&table, &mut known, false).await;
        let want: [Ipv4Addr; 2] = ["192.0.2.123".parse().unwrap(), Ipv4Addr::LOCALHOST];
        assert_eq!(table.pool(&name).unwrap().ntp_addresses(), want);
        // A later failure keeps the last answer.
        known.insert("ntp.invalid".into(), vec!["192.0.2.9".parse().unwrap()]);
        resolve_once(&table, &mut known, false).await;
        assert_eq!(
            table.pool(&name).unwrap().ntp_addresses(),
            [want[0], want[1], "192.0.2.9".parse().unwrap()]
        );
    }
}
