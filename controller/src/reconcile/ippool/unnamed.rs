//! The pool reconcile's sweep of entries no live config names ([`crate::reconcile::orphans`]):
//! who names each MAC the books hold, and the release of those unnamed for the grace period.

use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

use kube::runtime::events::EventType;
use tokio::time::Instant;
use tracing::warn;
use vmdhcp_core::crd::IPPool;
use vmdhcp_core::{MacAddr, NamespacedName};

use crate::ipam::IpamError;
use crate::kinds::store_key;
use crate::reconcile::context::Context;

/// Sweeps `pool`'s books (it serves `network`): releases the entries unnamed for the grace period
/// (the caller's status write records it) and returns how soon to look again.
pub fn release_unnamed(
    ctx: &Context,
    pool: &IPPool,
    pool_ref: &NamespacedName,
    network: &NamespacedName,
) -> Result<Option<Duration>, IpamError> {
    let held: Vec<MacAddr> = ctx.books.ipam.with_books(pool_ref, |b| {
        let v6 = b.v6.iter().flat_map(|a| a.leases().map(|(_, mac)| mac));
        b.v4.leases().map(|(_, mac)| mac).chain(v6).collect()
    })?;
    let index = &ctx.stores.config_index;
    let mut unnamed: BTreeSet<MacAddr> = held
        .into_iter()
        .filter(|mac| {
            ctx.books.mac_owners.owner(pool_ref, *mac).is_none()
                && !index.claimed_by_any(network, *mac)
                && crate::reconcile::claim::claim_holding(ctx, pool_ref, *mac).is_none()
        })
        .collect();
    if !unnamed.is_empty() {
        // Rare: looked up in the configs on the network only when some entry is unnamed so far.
        let named = spec_macs(ctx, network);
        unnamed.retain(|mac| !named.contains(mac));
    }
    let sweep = ctx.books.orphans.sweep(pool_ref, &unnamed, Instant::now());
    for mac in &sweep.due {
        let released = ctx.books.ipam.with_books(pool_ref, |b| {
            let v6 = b.v6.as_mut().and_then(|a| a.release_mac(mac));
            (b.v4.release_mac(mac), v6)
        })?;
        let addresses: Vec<String> = released
            .0
            .map(|ip| ip.to_string())
            .into_iter()
            .chain(released.1.map(|ip| ip.to_string()))
            .collect();
        let pool_key = pool_ref.to_string();
        ctx.signals.metrics.allocation(&pool_key, "released");
        let message = format!(
            "{} released from {mac}: no VirtualMachineNetworkConfig named it for {} s",
            addresses.join(", "),
            ctx.books.orphans.grace().as_secs()
        );
        warn!(pool = %pool_ref, %mac, addresses = %addresses.join(","), "address no config names released");
        ctx.event(
            pool,
            EventType::Warning,
            "UnnamedReleased",
            "Release",
            message,
        );
    }
    Ok(sweep.next)
}

/// The MACs the specs of the configs on `network` name there.
fn spec_macs(ctx: &Context, network: &NamespacedName) -> HashSet<MacAddr> {
    let mut macs = HashSet::new();
    for key in ctx.stores.config_index.on_network(network) {
        let Some(cfg) = ctx.stores.vmnetcfgs.get(&store_key(&key)) else {
            continue;
        };
        macs.extend(
            crate::index::configs::spec_nics(&cfg)
                .into_iter()
                .filter(|(on, _)| on == network)
                .map(|(_, mac)| mac),
        );
    }
    macs
}
