//! Which config claimed each MAC on each pool in this term, and every claim of each config.

use std::collections::{BTreeSet, HashMap};

use parking_lot::Mutex;
use vmdhcp_core::{MacAddr, NamespacedName};

/// Which config owns each MAC on each pool, so a MAC is never shared between two configs; and,
/// the other way, which MACs each config claimed, so a config that goes (or drops a NIC)
/// releases every address it was given even when its own status never recorded them (its status
/// write failed after the pool's succeeded).
#[derive(Default)]
pub struct MacOwners(Mutex<Claims>);

#[derive(Default)]
struct Claims {
    owner: HashMap<(NamespacedName, MacAddr), NamespacedName>,
    held: HashMap<NamespacedName, BTreeSet<(NamespacedName, MacAddr)>>,
}

impl Claims {
    fn remove(&mut self, key: &(NamespacedName, MacAddr)) {
        let Some(owner) = self.owner.remove(key) else {
            return;
        };
        if let Some(held) = self.held.get_mut(&owner) {
            held.remove(key);
            if held.is_empty() {
                self.held.remove(&owner);
            }
        }
    }
}

impl MacOwners {
    /// Claims `mac` on `pool` for `owner`; returns the other owner if someone else has it.
    pub fn claim(
        &self,
        pool: &NamespacedName,
        mac: MacAddr,
        owner: &NamespacedName,
    ) -> Result<(), NamespacedName> {
        let mut claims = self.0.lock();
        let key = (pool.clone(), mac);
        match claims.owner.get(&key) {
            Some(other) if other != owner => Err(other.clone()),
            Some(_) => Ok(()),
            None => {
                claims.owner.insert(key.clone(), owner.clone());
                claims.held.entry(owner.clone()).or_default().insert(key);
                Ok(())
            }
        }
    }

    /// Who claimed `mac` on `pool` in this term, if anyone did.
    pub fn owner(&self, pool: &NamespacedName, mac: MacAddr) -> Option<NamespacedName> {
        self.0.lock().owner.get(&(pool.clone(), mac)).cloned()
    }

    /// Every (pool, MAC) `owner` claims.
    pub fn claims_of(&self, owner: &NamespacedName) -> Vec<(NamespacedName, MacAddr)> {
        self.0
            .lock()
            .held
            .get(owner)
            .map(|held| held.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Gives up `owner`'s claim on `mac` (another owner's claim stays).
    pub fn release(&self, pool: &NamespacedName, mac: MacAddr, owner: &NamespacedName) {
        let mut claims = self.0.lock();
        let key = (pool.clone(), mac);
        if claims.owner.get(&key) == Some(owner) {
            claims.remove(&key);
        }
    }

    /// Forgets every claim on a pool (its IPAM was dropped or rebuilt).
    pub fn forget_pool(&self, pool: &NamespacedName) {
        let mut claims = self.0.lock();
        let keys: Vec<_> = claims
            .owner
            .keys()
            .filter(|(p, _)| p == pool)
            .cloned()
            .collect();
        for key in keys {
            claims.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const B: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);

    fn nn(s: &str) -> NamespacedName {
        s.parse().unwrap()
    }

    #[test]
    fn mac_owners_refuse_a_second_config() {
        let owners = MacOwners::default();
        let (pool, one, two) = (nn("ns/p"), nn("ns/vm1"), nn("ns/vm2"));
        owners.claim(&pool, A, &one).unwrap();
        owners.claim(&pool, A, &one).unwrap();
        assert_eq!(owners.claim(&pool, A, &two), Err(one.clone()));
        owners.release(&pool, A, &two);
        assert_eq!(
            owners.claim(&pool, A, &two),
            Err(one.clone()),
            "only the owner releases"
        );
        owners.release(&pool, A, &one);
        owners.claim(&pool, A, &two).unwrap();
        assert_eq!(owners.owner(&pool, A), Some(two));
    }

    #[test]
    fn each_owner_knows_its_claims_until_released_or_the_pool_is_forgotten() {
        let owners = MacOwners::default();
        let (p, q, one, two) = (nn("ns/p"), nn("ns/q"), nn("ns/vm1"), nn("ns/vm2"));
        owners.claim(&p, A, &one).unwrap();
        owners.claim(&q, A, &one).unwrap();
        owners.claim(&p, B, &two).unwrap();
        assert_eq!(owners.claims_of(&one), [(p.clone(), A), (q.clone(), A)]);
        assert_eq!(owners.claims_of(&two), [(p.clone(), B)]);
        owners.release(&q, A, &one);
        assert_eq!(owners.claims_of(&one), [(p.clone(), A)]);
        owners.forget_pool(&p);
        assert!(owners.claims_of(&one).is_empty());
        assert!(owners.claims_of(&two).is_empty());
        assert_eq!(owners.owner(&p, B), None);
        assert!(owners.0.lock().held.is_empty(), "no empty sets kept");
    }
}
