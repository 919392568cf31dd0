//! The pure half of the stream: wire messages in, [`AppliedState`] out.
//!
//! [`Applier`] owns the applied state and is the only place that decides whether a message is
//! acceptable. Every field of a message is converted and every ordering rule (epoch, base
//! revision, snapshot parts, leases on served pools) checked before anything changes, so a
//! rejected message leaves the state exactly as it was; the client (`super::client`) then asks
//! for a fresh snapshot. No I/O here, so every rule is unit-tested below.

use std::collections::BTreeMap;

use vmdhcp_core::NamespacedName;
use vmdhcp_core::pool::{Lease, PoolConfig};
use vmdhcp_proto::agent::v1 as pb;
use vmdhcp_proto::convert::{ConvertError, lease_from_entry, lease_key, removed_pool};

use super::StreamError;
use crate::pools::{PoolDelta, PoolLeases};

/// Everything applied from the stream, at one epoch and revision: what the agent serves while
/// the stream is live, and what it resumes from after a disconnect.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AppliedState {
    /// The controller epoch; empty before the first snapshot.
    pub epoch: String,
    /// The last revision applied completely.
    pub revision: u64,
    /// The pools served, with their leases, in the agent's one vocabulary for pool state, so
    /// that a sink takes them as they are.
    pub pools: BTreeMap<NamespacedName, PoolLeases>,
}

impl AppliedState {
    /// Number of leases over all pools, for the apply span and the logs.
    pub fn lease_count(&self) -> usize {
        self.pools.values().map(|p| p.leases.len()).sum()
    }
}

/// What applying one message did, so the client knows what to hand its sink.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    /// A complete snapshot replaced the state.
    Snapshot,
    /// Part of a snapshot was buffered; the state is unchanged until the last part.
    SnapshotPart,
    /// A delta was applied.
    Delta(PoolDelta),
    /// A heartbeat confirmed the state.
    Heartbeat,
}

/// Applies wire messages to an [`AppliedState`], validating everything first: the one judge of
/// what the controller sends, kept free of I/O so each rule is tested without a connection.
#[derive(Debug, Default)]
pub struct Applier {
    state: AppliedState,
    /// A snapshot being received in parts; the state changes only with its last part.
    partial: Option<PartialSnapshot>,
}

/// The parts of a snapshot received so far.
#[derive(Debug)]
struct PartialSnapshot {
    /// The epoch every later part must carry.
    epoch: String,
    /// The revision every later part must carry.
    revision: u64,
    /// The pools so far; a pool may continue in the next part.
    pools: BTreeMap<NamespacedName, PoolLeases>,
}

impl Applier {
    /// An applier starting from `state` (e.g. restored after a restart).
    pub fn new(state: AppliedState) -> Self {
        Applier {
            state,
            partial: None,
        }
    }

    /// The applied state.
    pub fn state(&self) -> &AppliedState {
        &self.state
    }

    /// Drops a half-received snapshot (the stream broke in the middle of it).
    pub fn abandon_partial(&mut self) {
        self.partial = None;
    }

    /// Applies one message, or rejects it and changes nothing.
    pub fn apply(&mut self, msg: &pb::WatchResponse) -> Result<Applied, StreamError> {
        let out_of_order = |what: String| Err(StreamError::OutOfOrder(what));
        let Some(event) = &msg.event else {
            return Err(StreamError::Empty(msg.revision));
        };
        if let Some(partial) = &self.partial
            && (!matches!(event, pb::watch_response::Event::Snapshot(_))
                || partial.epoch != msg.epoch
                || partial.revision != msg.revision)
        {
            let what = format!(
                "snapshot {}@{} was interrupted by a message for {}@{}",
                partial.epoch, partial.revision, msg.epoch, msg.revision
            );
            self.partial = None;
            return out_of_order(what);
        }
        match event {
            pb::watch_response::Event::Snapshot(snap) => self.apply_snapshot(msg, snap),
            pb::watch_response::Event::Delta(d) => self.apply_delta(msg, d),
            pb::watch_response::Event::Heartbeat(_) => {
                if msg.epoch != self.state.epoch || msg.revision != self.state.revision {
                    return out_of_order(format!(
                        "heartbeat at {}@{} but the state is at {}@{}",
                        msg.epoch, msg.revision, self.state.epoch, self.state.revision
                    ));
                }
                Ok(Applied::Heartbeat)
            }
        }
    }

    /// A snapshot part: accumulated until the last part, which replaces the state.
    fn apply_snapshot(
        &mut self,
        msg: &pb::WatchResponse,
        snap: &pb::Snapshot,
    ) -> Result<Applied, StreamError> {
        let mut pools = match self.partial.take() {
            Some(partial) => partial.pools,
            None => BTreeMap::new(),
        };
        for part in &snap.pools {
            let config = part.config.as_ref().ok_or_else(|| {
                StreamError::Invalid(ConvertError {
                    message: "PoolSnapshot",
                    field: "config",
                    value: String::new(),
                    reason: "is required".into(),
                })
            })?;
            let config = PoolConfig::try_from(config)?;
            let leases = part
                .leases
                .iter()
                .map(|e| lease_from_entry(&config.pool, e).map(|l| (l.mac, l.binding())))
                .collect::<Result<Vec<_>, _>>()?;
            let entry = pools
                .entry(config.pool.clone())
                .or_insert_with(|| PoolLeases::new(config.clone()));
            entry.config = config;
            entry.leases.extend(leases);
        }
        if snap.more {
            self.partial = Some(PartialSnapshot {
                epoch: msg.epoch.clone(),
                revision: msg.revision,
                pools,
            });
            return Ok(Applied::SnapshotPart);
        }
        self.state = AppliedState {
            epoch: msg.epoch.clone(),
            revision: msg.revision,
            pools,
        };
        Ok(Applied::Snapshot)
    }

    /// A delta, checked whole against the state (epoch, revisions, leases on served pools)
    /// before any of it is applied.
    fn apply_delta(
        &mut self,
        msg: &pb::WatchResponse,
        d: &pb::Delta,
    ) -> Result<Applied, StreamError> {
        let out_of_order = |what: String| Err(StreamError::OutOfOrder(what));
        if self.state.epoch.is_empty() {
            return out_of_order(format!(
                "delta to revision {} before any snapshot",
                msg.revision
            ));
        }
        if msg.epoch != self.state.epoch {
            return out_of_order(format!(
                "delta of epoch {} on state of epoch {}",
                msg.epoch, self.state.epoch
            ));
        }
        if d.base_revision != self.state.revision || msg.revision <= d.base_revision {
            return out_of_order(format!(
                "delta {}→{} on state at revision {}",
                d.base_revision, msg.revision, self.state.revision
            ));
        }
        let delta = decode_delta(msg, d)?;
        for lease in &delta.upserted_leases {
            let known = self.state.pools.contains_key(&lease.pool)
                || delta.upserted_pools.iter().any(|p| p.pool == lease.pool);
            if !known || delta.removed_pools.contains(&lease.pool) {
                return out_of_order(format!(
                    "lease {} {} on pool {} that is not served",
                    lease.mac, lease.ip, lease.pool
                ));
            }
        }
        // Everything is valid: apply.
        let st = &mut self.state;
        for pool in &delta.removed_pools {
            st.pools.remove(pool);
        }
        for config in &delta.upserted_pools {
            st.pools
                .entry(config.pool.clone())
                .and_modify(|p| p.config = config.clone())
                .or_insert_with(|| PoolLeases::new(config.clone()));
        }
        for lease in &delta.upserted_leases {
            if let Some(p) = st.pools.get_mut(&lease.pool) {
                p.leases.insert(lease.mac, lease.binding());
            }
        }
        for (pool, mac) in &delta.removed_leases {
            if let Some(p) = st.pools.get_mut(pool) {
                p.leases.remove(mac);
            }
        }
        st.revision = delta.revision;
        Ok(Applied::Delta(delta))
    }
}

/// The domain form of a delta message; any unreadable entry refuses the whole delta.
fn decode_delta(msg: &pb::WatchResponse, d: &pb::Delta) -> Result<PoolDelta, StreamError> {
    Ok(PoolDelta {
        base_revision: d.base_revision,
        revision: msg.revision,
        upserted_pools: d
            .upserted_pools
            .iter()
            .map(PoolConfig::try_from)
            .collect::<Result<_, _>>()?,
        removed_pools: d
            .removed_pools
            .iter()
            .map(|p| removed_pool(p))
            .collect::<Result<_, _>>()?,
        upserted_leases: d
            .upserted_leases
            .iter()
            .map(Lease::try_from)
            .collect::<Result<_, _>>()?,
        removed_leases: d
            .removed_leases
            .iter()
            .map(lease_key)
            .collect::<Result<_, _>>()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmdhcp_core::MacAddr;

    fn cfg(name: &str) -> pb::PoolConfig {
        pb::PoolConfig {
            pool_ref: format!("ns/{name}"),
            network_name: format!("ns/{name}"),
            interface_name: "eth1".into(),
            server_ip: "192.0.2.1".into(),
            cidr: "192.0.2.0/24".into(),
            lease_time_seconds: 60,
            ..Default::default()
        }
    }

    fn msg(epoch: &str, revision: u64, event: pb::watch_response::Event) -> pb::WatchResponse {
        pb::WatchResponse {
            epoch: epoch.into(),
            revision,
            event: Some(event),
            trace_context: Default::default(),
        }
    }

    fn snapshot(
        epoch: &str,
        revision: u64,
        more: bool,
        pools: Vec<(pb::PoolConfig, Vec<(&str, &str)>)>,
    ) -> pb::WatchResponse {
        let pools = pools
            .into_iter()
            .map(|(c, l)| pb::PoolSnapshot {
                config: Some(c),
                leases: l
                    .into_iter()
                    .map(|(m, i)| pb::LeaseEntry {
                        options: None,
                        ipv6_address: String::new(),
                        mac_address: m.into(),
                        ip_address: i.into(),
                        host_name: String::new(),
                    })
                    .collect(),
            })
            .collect();
        msg(
            epoch,
            revision,
            pb::watch_response::Event::Snapshot(pb::Snapshot { pools, more }),
        )
    }

    fn delta(
        epoch: &str,
        base: u64,
        revision: u64,
        leases: Vec<(&str, &str, &str)>,
    ) -> pb::WatchResponse {
        let upserted_leases = leases
            .into_iter()
            .map(|(p, m, i)| pb::Lease {
                options: None,
                ipv6_address: String::new(),
                pool_ref: p.into(),
                mac_address: m.into(),
                ip_address: i.into(),
                host_name: String::new(),
            })
            .collect();
        msg(
            epoch,
            revision,
            pb::watch_response::Event::Delta(pb::Delta {
                base_revision: base,
                upserted_leases,
                ..Default::default()
            }),
        )
    }

    fn heartbeat(epoch: &str, revision: u64) -> pb::WatchResponse {
        msg(
            epoch,
            revision,
            pb::watch_response::Event::Heartbeat(pb::Heartbeat { sent_unix_ms: 1 }),
        )
    }

    fn applied() -> Applier {
        let mut a = Applier::default();
        a.apply(&snapshot(
            "e1",
            5,
            false,
            vec![(cfg("a"), vec![("02:00:00:00:00:01", "192.0.2.10")])],
        ))
        .unwrap();
        a
    }

    #[test]
    fn snapshot_then_deltas_in_order() {
        let mut a = applied();
        assert_eq!(a.state().revision, 5);
        assert_eq!(a.state().lease_count(), 1);
        let d = a
            .apply(&delta(
                "e1",
                5,
                7,
                vec![
                    ("ns/a", "02:00:00:00:00:01", "192.0.2.11"),
                    ("ns/a", "02:00:00:00:00:02", "192.0.2.12"),
                ],
            ))
            .unwrap();
        assert!(matches!(d, Applied::Delta(ref d) if d.upserted_leases.len() == 2));
        let pool = &a.state().pools[&"ns/a".parse::<NamespacedName>().unwrap()];
        assert_eq!(
            pool.leases[&"02:00:00:00:00:01".parse::<MacAddr>().unwrap()].ip,
            std::net::Ipv4Addr::new(192, 0, 2, 11)
        );
        assert_eq!(a.apply(&heartbeat("e1", 7)).unwrap(), Applied::Heartbeat);
        let removal = msg(
            "e1",
            8,
            pb::watch_response::Event::Delta(pb::Delta {
                base_revision: 7,
                removed_pools: vec!["ns/a".into()],
                ..Default::default()
            }),
        );
        a.apply(&removal).unwrap();
        assert!(a.state().pools.is_empty());
    }

    #[test]
    fn rejected_messages_change_nothing() {
        let cases = [
            delta("e1", 4, 6, vec![]), // gap behind
            delta("e1", 6, 7, vec![]), // gap ahead
            delta("e1", 5, 5, vec![]), // no progress
            delta("e2", 5, 6, vec![]), // other epoch
            delta("e1", 5, 6, vec![("ns/a", "02:00:00:00:00:09", "999.0.2.1")]), // bad address
            delta("e1", 5, 6, vec![("ns/a", "not-a-mac", "192.0.2.1")]), // bad MAC
            delta(
                "e1",
                5,
                6,
                vec![("ns/zz", "02:00:00:00:00:09", "192.0.2.9")],
            ), // unknown pool
            heartbeat("e1", 4),
            pb::WatchResponse {
                epoch: "e1".into(),
                revision: 6,
                event: None,
                trace_context: Default::default(),
            },
            snapshot(
                "e1",
                9,
                false,
                vec![(
                    pb::PoolConfig {
                        server_ip: "10.9.9.9".into(),
                        ..cfg("b")
                    },
                    vec![],
                )],
            ),
            snapshot(
                "e1",
                9,
                false,
                vec![(cfg("b"), vec![("02:00:00:00:00:01", "192.0.2")])],
            ),
        ];
        for bad in cases {
            let mut a = applied();
            let before = a.state().clone();
            assert!(a.apply(&bad).is_err(), "accepted {bad:?}");
            assert_eq!(a.state(), &before, "state changed by {bad:?}");
        }
        // A valid delta after a rejection still applies.
        let mut a = applied();
        assert!(
            a.apply(&delta("e1", 5, 6, vec![("ns/a", "bad", "192.0.2.1")]))
                .is_err()
        );
        a.apply(&delta(
            "e1",
            5,
            6,
            vec![("ns/a", "02:00:00:00:00:03", "192.0.2.13")],
        ))
        .unwrap();
        assert_eq!(a.state().lease_count(), 2);
    }

    #[test]
    fn snapshot_parts_replace_the_state_only_when_complete() {
        let mut a = applied();
        let before = a.state().clone();
        assert_eq!(
            a.apply(&snapshot(
                "e2",
                3,
                true,
                vec![(cfg("b"), vec![("02:00:00:00:00:05", "192.0.2.5")])]
            ))
            .unwrap(),
            Applied::SnapshotPart
        );
        assert_eq!(a.state(), &before);
        // The same pool continues in the next part.
        a.apply(&snapshot(
            "e2",
            3,
            false,
            vec![(cfg("b"), vec![("02:00:00:00:00:06", "192.0.2.6")])],
        ))
        .unwrap();
        assert_eq!(a.state().epoch, "e2");
        assert_eq!(a.state().pools.len(), 1);
        assert_eq!(a.state().lease_count(), 2);

        // A part interrupted by anything else is dropped, the state kept.
        let mut a = applied();
        a.apply(&snapshot("e2", 3, true, vec![(cfg("b"), vec![])]))
            .unwrap();
        assert!(a.apply(&heartbeat("e1", 5)).is_err());
        assert_eq!(a.state(), &before);
        a.apply(&snapshot("e3", 1, false, vec![])).unwrap();
        assert!(a.state().pools.is_empty());
    }
}
