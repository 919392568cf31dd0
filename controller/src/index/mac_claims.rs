//! Which VirtualMachineNetworkConfig's status holds each MAC on each network, kept up to date
//! from the configs' watch events.
//!
//! Before it hands a NIC an address, the config reconciler must know whether another config
//! already holds that MAC on that network (upstream gave both the same address). Scanning every
//! cached config for every NIC made one reconcile cost O(configs) and a resync O(configs²); this
//! index answers in O(log n) and is updated per event with the cost of that one config.
//!
//! It is fed by [`MacClaims::observe`] with every event of the config watch, before the cache
//! and the controller see it: a relist (`Init` … `InitDone`) builds a fresh copy that replaces
//! the old one only when complete, as kube's own store does.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, PoisonError};

use kube::ResourceExt;
use kube::runtime::watcher;
use vmdhcp_core::crd::{NetworkConfigState, VirtualMachineNetworkConfig};
use vmdhcp_core::{MacAddr, NamespacedName};

/// A NIC as the index keys it: (network, MAC).
pub type Nic = (NamespacedName, MacAddr);

/// Claims of every config, both ways.
#[derive(Debug, Default, Clone, PartialEq)]
struct Claims {
    /// (network, MAC) → the configs whose status holds it.
    owners: BTreeMap<Nic, BTreeSet<NamespacedName>>,
    /// Config → the NICs it holds (what to withdraw when it changes).
    by_config: HashMap<NamespacedName, Vec<Nic>>,
}

impl Claims {
    fn set(&mut self, config: NamespacedName, nics: Vec<Nic>) {
        self.remove(&config);
        if nics.is_empty() {
            return;
        }
        for nic in &nics {
            self.owners
                .entry(nic.clone())
                .or_default()
                .insert(config.clone());
        }
        self.by_config.insert(config, nics);
    }

    fn remove(&mut self, config: &NamespacedName) {
        for nic in self.by_config.remove(config).unwrap_or_default() {
            if let Some(owners) = self.owners.get_mut(&nic) {
                owners.remove(config);
                if owners.is_empty() {
                    self.owners.remove(&nic);
                }
            }
        }
    }
}

/// The index; shared by the watch that feeds it and the reconcilers that ask it.
#[derive(Debug, Default)]
pub struct MacClaims {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    live: Claims,
    /// A relist in progress.
    relist: Option<Claims>,
}

/// The NICs `cfg`'s status records as `Allocated`; none while it is being deleted (its
/// addresses are on their way back).
pub fn claims_of(cfg: &VirtualMachineNetworkConfig) -> Vec<Nic> {
    if cfg.metadata.deletion_timestamp.is_some() {
        return Vec::new();
    }
    let mut nics: Vec<Nic> = cfg
        .recorded_nics()
        .into_iter()
        .filter(|(_, _, _, state)| *state == Some(NetworkConfigState::Allocated))
        .map(|(network, mac, _, _)| (network, mac))
        .collect();
    nics.sort();
    nics.dedup();
    nics
}

fn key(cfg: &VirtualMachineNetworkConfig) -> Option<NamespacedName> {
    NamespacedName::new(&cfg.namespace()?, &cfg.name_any()).ok()
}

impl MacClaims {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Whole values replaced under the lock: a panic elsewhere cannot leave one torn.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes one event of the configs' watch into account.
    pub fn observe(&self, event: &watcher::Event<VirtualMachineNetworkConfig>) {
        let mut inner = self.lock();
        match event {
            watcher::Event::Apply(cfg) => {
                if let Some(k) = key(cfg) {
                    inner.live.set(k, claims_of(cfg));
                }
            }
            watcher::Event::Delete(cfg) => {
                if let Some(k) = key(cfg) {
                    inner.live.remove(&k);
                }
            }
            watcher::Event::Init => inner.relist = Some(Claims::default()),
            watcher::Event::InitApply(cfg) => {
                if let (Some(k), Some(relist)) = (key(cfg), inner.relist.as_mut()) {
                    relist.set(k, claims_of(cfg));
                }
            }
            watcher::Event::InitDone => {
                if let Some(relist) = inner.relist.take() {
                    inner.live = relist;
                }
            }
        }
    }

    /// A config other than `me` whose status holds `mac` on `network` (the first by name when
    /// several do).
    pub fn claimed_elsewhere(
        &self,
        network: &NamespacedName,
        mac: MacAddr,
        me: &NamespacedName,
    ) -> Option<NamespacedName> {
        self.lock()
            .live
            .owners
            .get(&(network.clone(), mac))?
            .iter()
            .find(|owner| *owner != me)
            .cloned()
    }

    /// How many NICs are claimed (for tests and metrics).
    pub fn len(&self) -> usize {
        self.lock().live.owners.len()
    }

    /// Whether no NIC is claimed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use vmdhcp_core::crd::{
        NetworkConfigStatus, VirtualMachineNetworkConfigSpec, VirtualMachineNetworkConfigStatus,
    };

    const NETWORKS: [&str; 2] = ["ns/net-a", "other/net-b"];

    fn mac(i: u8) -> MacAddr {
        MacAddr([2, 0, 0, 0, 0, i])
    }

    /// A config `ns/vm{n}` whose status holds `entries` (network index, MAC index, state).
    fn config(n: u8, entries: &[(usize, u8, bool)], deleting: bool) -> VirtualMachineNetworkConfig {
        let mut cfg = VirtualMachineNetworkConfig::new(
            &format!("vm{n}"),
            VirtualMachineNetworkConfigSpec::default(),
        );
        cfg.metadata.namespace = Some("ns".into());
        if deleting {
            cfg.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                ));
        }
        cfg.status = Some(VirtualMachineNetworkConfigStatus {
            network_configs: entries
                .iter()
                .map(|(net, m, allocated)| NetworkConfigStatus {
                    allocated_ip_address: Some("10.0.0.1".into()),
                    mac_address: Some(mac(*m).to_string()),
                    network_name: Some(NETWORKS[*net % NETWORKS.len()].into()),
                    state: Some(if *allocated {
                        NetworkConfigState::Allocated
                    } else {
                        NetworkConfigState::Pending
                    }),
                })
                .collect(),
            ..Default::default()
        });
        cfg
    }

    /// What the reconciler did before this index: scan every config.
    fn naive(
        configs: &BTreeMap<NamespacedName, VirtualMachineNetworkConfig>,
        network: &NamespacedName,
        mac: MacAddr,
        me: &NamespacedName,
    ) -> BTreeSet<NamespacedName> {
        configs
            .iter()
            .filter(|(k, c)| *k != me && claims_of(c).contains(&(network.clone(), mac)))
            .map(|(k, _)| k.clone())
            .collect()
    }

    #[test]
    fn a_config_claims_its_allocated_nics_and_lets_go_when_it_changes_or_goes() {
        let index = MacClaims::default();
        let me: NamespacedName = "ns/vm9".parse().unwrap();
        let net: NamespacedName = NETWORKS[0].parse().unwrap();
        let a = config(1, &[(0, 1, true), (1, 2, false)], false);
        index.observe(&watcher::Event::Apply(a.clone()));
        assert_eq!(
            index.claimed_elsewhere(&net, mac(1), &me),
            Some("ns/vm1".parse().unwrap())
        );
        assert_eq!(
            index.claimed_elsewhere(&net, mac(1), &"ns/vm1".parse().unwrap()),
            None
        );
        assert_eq!(index.len(), 1, "a Pending entry claims nothing");
        // Being deleted, or deleted: the claim goes.
        index.observe(&watcher::Event::Apply(config(1, &[(0, 1, true)], true)));
        assert!(index.is_empty());
        index.observe(&watcher::Event::Apply(a.clone()));
        index.observe(&watcher::Event::Delete(a));
        assert!(index.is_empty());
        // A relist replaces everything only when it is complete.
        index.observe(&watcher::Event::Apply(config(3, &[(0, 3, true)], false)));
        index.observe(&watcher::Event::Init);
        index.observe(&watcher::Event::InitApply(config(
            4,
            &[(0, 4, true)],
            false,
        )));
        assert!(index.claimed_elsewhere(&net, mac(3), &me).is_some());
        index.observe(&watcher::Event::InitDone);
        assert!(index.claimed_elsewhere(&net, mac(3), &me).is_none());
        assert!(index.claimed_elsewhere(&net, mac(4), &me).is_some());
    }

    /// Status entries of a test config: (network index, MAC index, allocated).
    type Entries = Vec<(usize, u8, bool)>;

    #[derive(Debug, Clone)]
    enum Step {
        Apply(u8, Entries, bool),
        Delete(u8),
        Relist(Vec<(u8, Entries)>),
    }

    fn entries() -> impl Strategy<Value = Entries> {
        prop::collection::vec((0..2usize, 0..4u8, any::<bool>()), 0..3)
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            6 => (0..6u8, entries(), prop::bool::weighted(0.1)).prop_map(|(n, e, d)| Step::Apply(n, e, d)),
            2 => (0..6u8).prop_map(Step::Delete),
            1 => prop::collection::vec((0..6u8, entries()), 0..5).prop_map(Step::Relist),
        ]
    }

    proptest! {
        #[test]
        fn answers_as_a_scan_of_every_config_would(history in prop::collection::vec(step(), 1..40)) {
            let index = MacClaims::default();
            let mut configs: BTreeMap<NamespacedName, VirtualMachineNetworkConfig> = BTreeMap::new();
            for step in history {
                match step {
                    Step::Apply(n, e, deleting) => {
                        let cfg = config(n, &e, deleting);
                        configs.insert(key(&cfg).unwrap(), cfg.clone());
                        index.observe(&watcher::Event::Apply(cfg));
                    }
                    Step::Delete(n) => {
                        let k: NamespacedName = format!("ns/vm{n}").parse().unwrap();
                        if let Some(cfg) = configs.remove(&k) {
                            index.observe(&watcher::Event::Delete(cfg));
                        }
                    }
                    Step::Relist(all) => {
                        configs.clear();
                        index.observe(&watcher::Event::Init);
                        for (n, e) in all {
                            let cfg = config(n, &e, false);
                            configs.insert(key(&cfg).unwrap(), cfg.clone());
                            index.observe(&watcher::Event::InitApply(cfg));
                        }
                        index.observe(&watcher::Event::InitDone);
                    }
                }
                for net in NETWORKS {
                    let net: NamespacedName = net.parse().unwrap();
                    for m in 0..4 {
                        for me in 0..7u8 {
                            let me: NamespacedName = format!("ns/vm{me}").parse().unwrap();
                            let want = naive(&configs, &net, mac(m), &me);
                            let got = index.claimed_elsewhere(&net, mac(m), &me);
                            prop_assert_eq!(got.is_some(), !want.is_empty());
                            if let Some(got) = got {
                                prop_assert!(want.contains(&got));
                            }
                        }
                    }
                }
            }
        }
    }
}
