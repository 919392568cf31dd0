//! A pool's leases as its status records them, read again by changed entries only.
//!
//! Every allocation rewrites its pool's status, so the controller's index sees one new version
//! of a pool per allocation. Reading each version whole ([`leases_from_status`]) costs what the
//! pool holds — every entry parsed and compared to record one — a cost per allocation that
//! grows with the pools' fill (docs/tuning.md). [`RecordedLeases::update`] compares
//! the two versions' maps entry by entry (strings, without parsing) and parses only what
//! differs; its answer is the full read's, which a property test checks on random histories.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::crd::{IPPool, IPv4Status, IPv6Status};
use crate::mac::MacAddr;
use crate::names::NamespacedName;

use super::{
    Binding, Holder, Lease, PoolError, in_ipv6_status, leases_from_status, parse_allocated_v6,
    parse_entry, pool_ref, recorded_host_name, recorded_options,
};

/// A lease to publish: the MAC's binding now, or `None` when it holds nothing any more.
pub type LeaseChange = (MacAddr, Option<Binding>);

/// Which addresses each MAC holds in one pool's status, kept between its versions.
///
/// A MAC holds one address per pool unless someone wrote the status by hand; then, as the full
/// read (whose later entries win), the highest is served, and the others come back into play
/// when it goes.
#[derive(Debug, Default, Clone)]
pub struct RecordedLeases {
    held: BTreeSet<(MacAddr, Ipv4Addr)>,
    /// The same for `status.ipv6.allocated`, on a dual-stack pool.
    held6: BTreeSet<(MacAddr, Ipv6Addr)>,
}

impl RecordedLeases {
    /// Reads `pool` whole: its leases (as [`leases_from_status`]), the errors of its bad entries,
    /// and what [`RecordedLeases::update`] continues from.
    pub fn read(pool: &IPPool) -> Result<(Self, Vec<Lease>, Vec<PoolError>), PoolError> {
        let (leases, errors) = leases_from_status(pool)?;
        let held = leases.iter().map(|l| (l.mac, l.ip)).collect();
        let held6 = match (v6_books(pool), pool_ref(pool)) {
            (Some(v6), Ok(p)) => {
                let (entries, _) = parse_allocated_v6(&p, &v6.allocated);
                entries
                    .into_iter()
                    .filter_map(|(ip, h)| match h {
                        Holder::Mac(mac) => Some((mac, ip)),
                        _ => None,
                    })
                    .collect()
            }
            _ => BTreeSet::new(),
        };
        Ok((RecordedLeases { held, held6 }, leases, errors))
    }

    /// The leases that changed from `before` to `after` (two versions of one pool with the same
    /// spec), each at most once, and the errors of the changed entries that are bad.
    pub fn update(
        &mut self,
        before: &IPPool,
        after: &IPPool,
    ) -> Result<(Vec<LeaseChange>, Vec<PoolError>), PoolError> {
        let pool = pool_ref(after)?;
        let empty = IPv4Status::default();
        let (old, new) = (books(before, &empty), books(after, &empty));
        let names = after.spec.ipv4_config.send_host_name == Some(true);
        let mut errors = Vec::new();
        let mut touched = BTreeSet::new();
        for key in differing(&old.allocated, &new.allocated) {
            if let Some((ip, mac)) = holder(&pool, key, old) {
                self.held.remove(&(mac, ip));
                touched.insert(mac);
            }
            match new.allocated.get(key).map(|v| parse_entry(&pool, key, v)) {
                Some(Ok((ip, Holder::Mac(mac)))) => {
                    self.held.insert((mac, ip));
                    touched.insert(mac);
                }
                Some(Err(e)) => errors.push(e),
                Some(Ok(_)) | None => {}
            }
        }
        let empty6 = IPv6Status::default();
        let (old6, new6) = (
            v6_books(before).unwrap_or(&empty6),
            v6_books(after).unwrap_or(&empty6),
        );
        for key in differing(&old6.allocated, &new6.allocated) {
            if let Some(Ok((ip, Holder::Mac(mac)))) =
                old6.allocated.get(key).map(|v| parse_entry(&pool, key, v))
            {
                self.held6.remove(&(mac, ip));
                touched.insert(mac);
            }
            match new6.allocated.get(key).map(|v| parse_entry(&pool, key, v)) {
                Some(Ok((ip, Holder::Mac(mac)))) => {
                    self.held6.insert((mac, ip));
                    touched.insert(mac);
                }
                Some(Err(e)) => errors.push(in_ipv6_status(e)),
                Some(Ok(_)) | None => {}
            }
        }
        for key in differing(&old.dhcp_options, &new.dhcp_options) {
            if let Some((_, mac)) = holder(&pool, key, new) {
                touched.insert(mac);
            }
        }
        if names {
            for key in differing(&old.host_names, &new.host_names) {
                if let Some((_, mac)) = holder(&pool, key, new) {
                    touched.insert(mac);
                }
            }
        }
        let changes = touched
            .into_iter()
            .map(|mac| {
                let ip = self
                    .held
                    .range((mac, Ipv4Addr::UNSPECIFIED)..=(mac, Ipv4Addr::BROADCAST))
                    .next_back()
                    .map(|(_, ip)| *ip);
                let ipv6 = self
                    .held6
                    .range((mac, Ipv6Addr::UNSPECIFIED)..=(mac, Ipv6Addr::from(u128::MAX)))
                    .next_back()
                    .map(|(_, ip)| *ip);
                let binding = ip.map(|ip| Binding {
                    ip,
                    host_name: recorded_host_name(&pool, new, names, ip, &mut errors),
                    ipv6,
                    options: recorded_options(&pool, new, ip, &mut errors),
                });
                (mac, binding)
            })
            .collect();
        Ok((changes, errors))
    }
}

/// `pool`'s IPv6 books, when it has an `ipv6Config` and its status records them.
fn v6_books(pool: &IPPool) -> Option<&IPv6Status> {
    pool.status
        .as_ref()
        .and_then(|s| s.ipv6.as_ref())
        .filter(|_| pool.spec.ipv6_config.is_some())
}

/// `pool`'s books, or `empty` when its status has none.
fn books<'a>(pool: &'a IPPool, empty: &'a IPv4Status) -> &'a IPv4Status {
    pool.status
        .as_ref()
        .and_then(|s| s.ipv4.as_ref())
        .unwrap_or(empty)
}

/// The MAC `v4` records under `key`, with its address (none for markers and bad entries).
fn holder(pool: &NamespacedName, key: &str, v4: &IPv4Status) -> Option<(Ipv4Addr, MacAddr)> {
    match parse_entry(pool, key, v4.allocated.get(key)?) {
        Ok((ip, Holder::Mac(mac))) => Some((ip, mac)),
        _ => None,
    }
}

/// The keys whose values differ between `a` and `b` (present in one only, or different), in
/// one ordered walk of both.
fn differing<'a, V: PartialEq>(
    a: &'a BTreeMap<String, V>,
    b: &'a BTreeMap<String, V>,
) -> Vec<&'a str> {
    let mut out = Vec::new();
    let (mut a, mut b) = (a.iter().peekable(), b.iter().peekable());
    loop {
        match (a.peek(), b.peek()) {
            (None, None) => return out,
            (Some((ka, _)), None) => {
                out.push(ka.as_str());
                a.next();
            }
            (None, Some((kb, _))) => {
                out.push(kb.as_str());
                b.next();
            }
            (Some((ka, va)), Some((kb, vb))) => match ka.cmp(kb) {
                std::cmp::Ordering::Less => {
                    out.push(ka.as_str());
                    a.next();
                }
                std::cmp::Ordering::Greater => {
                    out.push(kb.as_str());
                    b.next();
                }
                std::cmp::Ordering::Equal => {
                    if va != vb {
                        out.push(ka.as_str());
                    }
                    a.next();
                    b.next();
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::IPPoolStatus;
    use crate::fixtures::readme_pool;
    use proptest::prelude::*;

    /// The README pool with these books.
    fn version(
        names: bool,
        allocated: &[(String, String)],
        host_names: &[(String, String)],
    ) -> IPPool {
        let mut p = readme_pool();
        p.spec.ipv4_config.send_host_name = Some(names);
        p.status = Some(IPPoolStatus {
            ipv4: Some(IPv4Status {
                allocated: allocated.iter().cloned().collect(),
                host_names: host_names.iter().cloned().collect(),
                ..Default::default()
            }),
            ..Default::default()
        });
        p
    }

    /// What the full read serves: MAC → binding (later entries win, as the index collects them).
    fn served(pool: &IPPool) -> BTreeMap<MacAddr, Binding> {
        let (leases, _) = leases_from_status(pool).unwrap();
        leases.into_iter().map(|l| (l.mac, l.binding())).collect()
    }

    #[test]
    fn differing_keys_are_found_in_one_walk() {
        let m = |kv: &[(&str, u8)]| -> BTreeMap<String, u8> {
            kv.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
        };
        let a = m(&[("a", 1), ("b", 2), ("d", 4)]);
        let b = m(&[("b", 2), ("c", 3), ("d", 5), ("e", 6)]);
        assert_eq!(differing(&a, &b), ["a", "c", "d", "e"]);
        assert!(differing(&a, &a).is_empty());
    }

    #[test]
    fn one_recorded_allocation_is_one_change() {
        let e = |ip: &str, v: &str| (ip.to_owned(), v.to_owned());
        let before = version(
            false,
            &[
                e("192.168.48.81", "EXCLUDED"),
                e("192.168.48.82", "02:00:00:00:00:01"),
            ],
            &[],
        );
        let after = version(
            false,
            &[
                e("192.168.48.81", "EXCLUDED"),
                e("192.168.48.82", "02:00:00:00:00:01"),
                e("192.168.48.83", "02:00:00:00:00:02"),
            ],
            &[],
        );
        let (mut recorded, _, _) = RecordedLeases::read(&before).unwrap();
        let (changes, errors) = recorded.update(&before, &after).unwrap();
        assert!(errors.is_empty());
        let mac: MacAddr = "02:00:00:00:00:02".parse().unwrap();
        assert_eq!(
            changes,
            [(mac, Some(Binding::ip("192.168.48.83".parse().unwrap())))]
        );
    }

    /// Map entries, key and value.
    type Entries = Vec<(String, String)>;

    /// `p` as a dual-stack pool whose `status.ipv6.allocated` is `v6`.
    fn with_v6(mut p: IPPool, v6: &[(String, String)]) -> IPPool {
        p.spec.ipv6_config = crate::fixtures::dual_stack_pool().spec.ipv6_config;
        if let Some(status) = p.status.as_mut() {
            status.ipv6 = Some(crate::crd::IPv6Status {
                allocated: v6.iter().cloned().collect(),
                ..Default::default()
            });
        }
        p
    }

    /// IPv6 `allocated` maps drawn like [`books`]'s IPv4 ones, spelled in several ways.
    fn v6_books() -> impl Strategy<Value = Entries> {
        let key = prop_oneof![
            (0x80u8..0x88).prop_map(|o| format!("fd00::{o:x}")),
            Just("not-an-ip".to_owned()),
            Just("192.168.48.80".to_owned()),
        ];
        let value = prop_oneof![
            (1u8..5).prop_map(|m| format!("02:00:00:00:00:0{m}")),
            Just("RESERVED".to_owned()),
            Just("garbage".to_owned()),
        ];
        proptest::collection::vec((key, value), 0..8)
    }

    /// Statuses drawn from a few addresses (some not addresses), a few MACs (so that one MAC
    /// often holds two addresses), markers, garbage and host names good and bad.
    fn books() -> impl Strategy<Value = (Entries, Entries)> {
        let key = prop_oneof![
            (80u8..88).prop_map(|o| format!("192.168.48.{o}")),
            Just("not-an-ip".to_owned()),
        ];
        let value = prop_oneof![
            (1u8..5).prop_map(|m| format!("02:00:00:00:00:0{m}")),
            Just("RESERVED".to_owned()),
            Just("EXCLUDED".to_owned()),
            Just("garbage".to_owned()),
        ];
        let name = prop_oneof![
            (0u8..3).prop_map(|n| format!("vm-{n}")),
            Just("Not A Name".to_owned()),
        ];
        (
            proptest::collection::vec((key.clone(), value), 0..8),
            proptest::collection::vec((key, name), 0..4),
        )
    }

    proptest! {
        /// Following a pool's versions by [`RecordedLeases::update`] serves, after every version,
        /// exactly what reading that version whole serves.
        /// On a dual-stack pool too, whose IPv6 map changes beside the IPv4 one.
        #[test]
        fn updates_serve_what_a_full_read_serves(
            names in any::<bool>(),
            dual in any::<bool>(),
            history in proptest::collection::vec((books(), v6_books()), 1..12),
        ) {
            let versions: Vec<IPPool> = history
                .iter()
                .map(|((a, h), v6)| {
                    let p = version(names, a, h);
                    if dual { with_v6(p, v6) } else { p }
                })
                .collect();
            let (mut recorded, leases, _) = RecordedLeases::read(&versions[0]).unwrap();
            let mut table: BTreeMap<MacAddr, Binding> =
                leases.into_iter().map(|l| (l.mac, l.binding())).collect();
            for pair in versions.windows(2) {
                let (changes, _) = recorded.update(&pair[0], &pair[1]).unwrap();
                let macs: BTreeSet<MacAddr> = changes.iter().map(|(m, _)| *m).collect();
                prop_assert_eq!(macs.len(), changes.len(), "a MAC changed twice");
                for (mac, binding) in changes {
                    match binding {
                        Some(b) => table.insert(mac, b),
                        None => table.remove(&mac),
                    };
                }
                prop_assert_eq!(&table, &served(&pair[1]));
            }
        }
    }
}
