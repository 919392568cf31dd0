//! AddressClaims in the books: which claim's address each MAC holds in this term
//! ([`ClaimHolders`]), and the one decision that puts a claim's address on its holder
//! ([`hold_claim`]), a NIC's MAC when bound, the claim's placeholder otherwise.

use std::collections::HashMap;
use std::net::IpAddr;

use parking_lot::Mutex;
use vmdhcp_core::pool::Family;
use vmdhcp_core::{MacAddr, NamespacedName};

use super::{IpamError, PoolAllocator};

/// Which claim's address each (pool, MAC) holds, as this term's claim reconciles put it there.
/// A config giving back a NIC's address asks here first: a claim's address stays with the
/// claim, whose reconcile moves it back to its placeholder when the NIC goes. Bounded by the
/// claims (one entry each).
#[derive(Default)]
pub struct ClaimHolders(Mutex<HashMap<(NamespacedName, MacAddr), NamespacedName>>);

impl ClaimHolders {
    /// Records that `mac` holds `claim`'s addresses on `pool`, forgetting the claim's other
    /// holders there.
    pub fn set(&self, pool: &NamespacedName, mac: MacAddr, claim: &NamespacedName) {
        let mut holders = self.0.lock();
        holders.retain(|(p, _), c| !(p == pool && c == claim));
        holders.insert((pool.clone(), mac), claim.clone());
    }

    /// Forgets `claim` (deleted, or refused).
    pub fn forget(&self, claim: &NamespacedName) {
        self.0.lock().retain(|_, c| c != claim);
    }

    /// The claims of namespace `ns` holding addresses on `pool`.
    pub fn in_namespace(&self, pool: &NamespacedName, ns: &str) -> Vec<NamespacedName> {
        self.0
            .lock()
            .iter()
            .filter(|((p, _), c)| p == pool && c.namespace == ns)
            .map(|(_, c)| c.clone())
            .collect()
    }

    /// The claim whose addresses `mac` holds on `pool`, if any.
    pub fn claim_of(&self, pool: &NamespacedName, mac: MacAddr) -> Option<NamespacedName> {
        self.0.lock().get(&(pool.clone(), mac)).cloned()
    }
}

/// Puts a claim's address of one family on `holder`, and returns it.
///
/// The claim's address now is `recorded` (its status) when the books give it to the holder or
/// to one of the claim's `previous` holders (its placeholder first, then the NIC it was bound
/// to), else whatever its placeholder holds. `want` (the spec's address) wins over it; else the address
/// is kept, or restored from `recorded` when free (refused when another MAC took it), or the
/// lowest free one not `avoid`ed. A
/// `holder` that holds another address (a NIC given a dynamic one before it was bound) gives it
/// back: the NIC moves to the claim's. Nothing changes when the address cannot be had.
pub fn hold_claim<A: Family>(
    alloc: &mut PoolAllocator<A>,
    holder: MacAddr,
    previous: &[MacAddr],
    (want, recorded): (Option<A>, Option<A>),
    avoid: &dyn Fn(IpAddr) -> bool,
) -> Result<A, IpamError> {
    let ours = |alloc: &PoolAllocator<A>, ip: A| {
        alloc
            .holder(ip)
            .is_some_and(|m| m == holder || previous.contains(&m))
    };
    let current = recorded
        .filter(|ip| ours(alloc, *ip))
        .or_else(|| previous.first().and_then(|p| alloc.lookup(p)));
    if let (Some(cur), Some(w)) = (current, want)
        && cur != w
    {
        // The spec asks for another address (the webhook keeps it immutable once held; a
        // claim edited around it moves).
        alloc.release(cur)?;
        return take(alloc, holder, Some(w), avoid).inspect_err(|_| {
            // Put the old one back for its holder: nothing changes on a refusal.
            let _ = alloc.allocate_requested(holder, cur);
        });
    }
    match current {
        Some(cur) if alloc.holder(cur) == Some(holder) => Ok(cur),
        Some(cur) => {
            alloc.release(cur)?;
            take(alloc, holder, Some(cur), avoid)
        }
        // A recorded address is taken again, never replaced: a VIP moved silently would break
        // whatever was configured with it; if another MAC holds it now, the claim is refused.
        None => take(alloc, holder, want.or(recorded), avoid),
    }
}

/// Gives `holder` `ip` (or the lowest free address), first giving back any other address it
/// holds, which it gets back if that fails.
fn take<A: Family>(
    alloc: &mut PoolAllocator<A>,
    holder: MacAddr,
    ip: Option<A>,
    avoid: &dyn Fn(IpAddr) -> bool,
) -> Result<A, IpamError> {
    let other = alloc.lookup(&holder).filter(|held| Some(*held) != ip);
    if let Some(o) = other {
        alloc.release(o)?;
    }
    let got = match ip {
        Some(ip) => alloc.allocate_requested(holder, ip),
        None => alloc.allocate_avoiding(holder, &|a: A| avoid(a.into())),
    };
    if got.is_err()
        && let Some(o) = other
    {
        let _ = alloc.allocate_requested(holder, o);
    }
    got
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use vmdhcp_core::pool::PoolRange;

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    fn mac(i: u8) -> MacAddr {
        MacAddr([0x02, 0, 0, 0, 0, i])
    }

    fn books() -> PoolAllocator {
        PoolAllocator::new(
            PoolRange::new(
                "default/pool".parse().unwrap(),
                "10.0.0.0/24".parse().unwrap(),
                (ip("10.0.0.10"), ip("10.0.0.20")),
                ip("10.0.0.1"),
                None,
                vec![],
            )
            .unwrap(),
        )
    }

    const NONE: &dyn Fn(IpAddr) -> bool = &|_| false;

    #[test]
    fn a_vip_takes_the_lowest_free_or_the_address_asked_and_keeps_it() {
        let (mut a, place) = (books(), mac(0xc1));
        assert_eq!(
            hold_claim(&mut a, place, &[place], (None, None), NONE),
            Ok(ip("10.0.0.10"))
        );
        assert_eq!(
            hold_claim(&mut a, place, &[place], (None, Some(ip("10.0.0.10"))), NONE),
            Ok(ip("10.0.0.10"))
        );
        let (mut b, other) = (books(), mac(0xc2));
        assert_eq!(
            hold_claim(&mut b, other, &[other], (Some(ip("10.0.0.15")), None), NONE),
            Ok(ip("10.0.0.15"))
        );
        assert_eq!(b.holder(ip("10.0.0.15")), Some(other));
    }

    #[test]
    fn binding_moves_the_address_to_the_nic_which_gives_back_its_dynamic_one() {
        let (mut a, place, nic) = (books(), mac(0xc1), mac(1));
        let claimed = hold_claim(&mut a, place, &[place], (None, None), NONE).unwrap();
        let dynamic = a.allocate(nic).unwrap();
        assert_ne!(claimed, dynamic);
        assert_eq!(
            hold_claim(&mut a, nic, &[place], (None, Some(claimed)), NONE),
            Ok(claimed)
        );
        assert_eq!(a.holder(claimed), Some(nic));
        assert_eq!(a.holder(dynamic), None, "the NIC's dynamic address is free");
        assert_eq!(a.lookup(&place), None);
        // The VM goes (Retain): back to the placeholder, the NIC's MAC a previous holder.
        assert_eq!(
            hold_claim(&mut a, place, &[place, nic], (None, Some(claimed)), NONE),
            Ok(claimed)
        );
        assert_eq!(a.holder(claimed), Some(place));
        // A new VM with a new MAC gets it.
        let again = mac(2);
        assert_eq!(
            hold_claim(&mut a, again, &[place], (None, Some(claimed)), NONE),
            Ok(claimed)
        );
    }

    #[test]
    fn an_address_another_mac_holds_is_refused_and_nothing_changes() {
        let (mut a, place, nic) = (books(), mac(0xc1), mac(1));
        a.allocate_requested(mac(9), ip("10.0.0.12")).unwrap();
        let dynamic = a.allocate(nic).unwrap();
        let before = a.clone();
        assert!(matches!(
            hold_claim(&mut a, nic, &[place], (Some(ip("10.0.0.12")), None), NONE),
            Err(IpamError::AlreadyAllocated { .. })
        ));
        assert_eq!(a, before);
        assert_eq!(a.lookup(&nic), Some(dynamic));
    }

    #[test]
    fn a_recorded_address_another_mac_took_is_refused_not_replaced() {
        let (mut a, place) = (books(), mac(0xc1));
        a.allocate_requested(mac(9), ip("10.0.0.10")).unwrap();
        assert!(matches!(
            hold_claim(&mut a, place, &[place], (None, Some(ip("10.0.0.10"))), NONE),
            Err(IpamError::AlreadyAllocated { .. })
        ));
        assert_eq!(a.lookup(&place), None);
    }
}
