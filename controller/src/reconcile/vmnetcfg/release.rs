//! Giving addresses back: a config's NICs by spec or status, and every MAC it claimed in this
//! term, never a MAC another config claims or records.

use super::*;

/// Releases `mac` on the pool serving `network` for `owner`; returns the pool if something was
/// released. Not when another config claims the MAC there in this term, nor, when no config
/// does, while another config's status holds it: a NIC listed in the spec or status of a config
/// that never got the MAC (refused as `MacInUse`) must not free its holder's address.
pub(super) fn release(
    ctx: &Context,
    network: &NamespacedName,
    mac: MacAddr,
    owner: &NamespacedName,
) -> Option<NamespacedName> {
    let pool = object_ref(ctx.pool_for_network(network)?.as_ref())?;
    let theirs = match ctx.books.mac_owners.owner(&pool, mac) {
        Some(claimant) => claimant != *owner,
        None => ctx
            .stores
            .config_index
            .claimed_elsewhere(network, mac, owner)
            .is_some(),
    };
    (!theirs && release_claimed(ctx, &pool, mac, owner)).then_some(pool)
}

/// Releases `mac` on `pool`, with `owner`'s claim on it; whether the books held it. An
/// AddressClaim's address the MAC holds stays: the claim's reconcile moves it back to the
/// claim's placeholder when the NIC goes (or frees it with the claim).
pub(super) fn release_claimed(
    ctx: &Context,
    pool: &NamespacedName,
    mac: MacAddr,
    owner: &NamespacedName,
) -> bool {
    ctx.books.mac_owners.release(pool, mac, owner);
    if let Some(claim) = crate::reconcile::claim::claim_holding(ctx, pool, mac) {
        debug!(pool = %pool, %mac, claim = %claim, "address kept for its AddressClaim");
        return false;
    }
    let released = ctx
        .books
        .ipam
        .with_books(pool, |b| {
            let v6 = b.v6.as_mut().and_then(|a| a.release_mac(&mac));
            b.v4.release_mac(&mac).is_some() || v6.is_some()
        })
        .unwrap_or(false);
    if released {
        ctx.signals
            .metrics
            .allocation(&pool.to_string(), "released");
    }
    released
}

/// Releases every MAC `owner` claimed in this term on a pool other than those `kept` (the pools
/// serving the NICs it still has): what its status may not record, because the write that would
/// have recorded them failed. Returns the pools whose books changed.
pub(super) fn release_claims(
    ctx: &Context,
    owner: &NamespacedName,
    kept: &BTreeSet<(NamespacedName, MacAddr)>,
) -> BTreeSet<NamespacedName> {
    ctx.books
        .mac_owners
        .claims_of(owner)
        .into_iter()
        .filter(|claim| !kept.contains(claim))
        .filter(|(pool, mac)| release_claimed(ctx, pool, *mac, owner))
        .map(|(pool, _)| pool)
        .collect()
}
