//! Telling the controller what this agent applied and how its interfaces fare (the `Report`
//! RPC), which becomes each IPPool's `AgentReady` condition.
//!
//! Each interface's entry also carries the latest probe verdicts on the pool's addresses, ARP for
//! IPv4 and Neighbor Solicitation for a dual-stack pool's IPv6 ([`crate::findings`]), how
//! conflicts of both families reach the controller, and the hosts found acting where
//! they should not on the pool's network ([`crate::suspects`]), how foreign DHCP servers reach
//! the pool's conditions.
//!
//! A report is sent when something it carries changes (debounced) and at least every
//! `interval`, so the controller can tell a silent agent from a healthy one. A failed send is
//! logged and retried at the next occasion; reporting never blocks serving.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::credentials::{Credentials, CredentialsError};
use tokio::sync::watch;
use tracing::{debug, warn};
use vmdhcp_core::{MacAddr, NamespacedName};
use vmdhcp_proto::agent::v1 as pb;
use vmdhcp_proto::agent::v1::config_service_client::ConfigServiceClient;

use crate::dhcp::server::InterfaceStatus;
use crate::findings::Reason;
use crate::http::AgentStatus;
use crate::lease_table::LeaseTable;
use crate::stream::ConnectionStatus;
use crate::suspects::{SuspectKind, Suspects};

/// What a report is built from.
pub struct ReportInputs {
    /// Who we are.
    pub agent: pb::AgentIdentity,
    /// The stream's state (epoch, applied revision).
    pub stream: watch::Receiver<ConnectionStatus>,
    /// Leadership.
    pub role: watch::Receiver<AgentStatus>,
    /// Interface statuses.
    pub statuses: watch::Receiver<BTreeMap<String, InterfaceStatus>>,
    /// The served pools and their leases.
    pub table: Arc<LeaseTable>,
    /// The hosts found acting where they should not, per pool.
    pub suspects: Arc<Suspects>,
}

/// Builds the report of the current state: one entry per pool in the table.
pub fn build(inputs: &ReportInputs) -> pb::ReportRequest {
    let stream = inputs.stream.borrow().clone();
    let leader = inputs.role.borrow().leader;
    let statuses = inputs.statuses.borrow().clone();
    let interfaces = inputs
        .table
        .pools()
        .into_values()
        .map(|p| {
            let c = p.config();
            let (state, error) = match statuses.get(&c.interface_name) {
                Some(InterfaceStatus::Serving) => (pb::InterfaceState::Serving, String::new()),
                Some(InterfaceStatus::Standby) => (pb::InterfaceState::Standby, String::new()),
                Some(InterfaceStatus::Failed { error }) => {
                    (pb::InterfaceState::Error, error.clone())
                }
                Some(InterfaceStatus::Starting) | None => {
                    (pb::InterfaceState::Unspecified, String::new())
                }
            };
            pb::InterfaceReport {
                pool_ref: c.pool.to_string(),
                interface_name: c.interface_name.clone(),
                state: state.into(),
                error,
                lease_count: u32::try_from(p.len()).unwrap_or(u32::MAX),
                probes: probes(&inputs.table, &c.pool),
                suspects: suspects(&inputs.suspects, &c.pool),
            }
        })
        .collect();
    pb::ReportRequest {
        agent: Some(inputs.agent.clone()),
        epoch: stream.epoch,
        applied_revision: stream.revision,
        leader,
        interfaces,
    }
}

/// The latest probe verdicts on `pool`'s addresses ([`crate::findings`]), as reported: an IPv6
/// address as RFC 5952 text, which is what the controller keys `status.ipv6.conflicts` by.
fn probes(table: &LeaseTable, pool: &NamespacedName) -> Vec<pb::AddressProbe> {
    table
        .findings()
        .of(pool)
        .into_iter()
        .map(|(ip, f)| pb::AddressProbe {
            ip_address: ip.to_string(),
            mac_address: MacAddr::text_or_empty(f.mac),
            answered_by: MacAddr::text_or_empty(f.answered_by),
            reason: match f.reason {
                Reason::Offer => pb::ProbeReason::Offer,
                Reason::Decline => pb::ProbeReason::Decline,
                Reason::Recheck => pb::ProbeReason::Recheck,
            }
            .into(),
        })
        .collect()
}

/// The hosts found acting where they should not on `pool`'s network ([`crate::suspects`], at
/// most as many as the contract allows), as reported.
fn suspects(suspects: &Suspects, pool: &NamespacedName) -> Vec<pb::NetworkSuspect> {
    suspects
        .current(pool)
        .into_iter()
        .take(crate::suspects::MAX_PER_POOL)
        .map(|s| pb::NetworkSuspect {
            kind: match s.kind {
                SuspectKind::ForeignDhcpServer => pb::SuspectKind::ForeignDhcpServer,
                SuspectKind::ProxyArpResponder => pb::SuspectKind::ProxyArpResponder,
                SuspectKind::ProxyNdpResponder => pb::SuspectKind::ProxyNdpResponder,
            }
            .into(),
            mac_address: s.mac.to_string(),
            ip_address: match s.ip {
                Some(IpAddr::V4(ip)) => ip.to_string(),
                _ => String::new(),
            },
            ipv6_address: match s.ip {
                Some(IpAddr::V6(ip)) => ip.to_string(),
                _ => String::new(),
            },
            detail: s.detail,
        })
        .collect()
}

/// How long changes are collected before a report goes out.
const DEBOUNCE: Duration = Duration::from_millis(500);

/// A lazily connecting client; the CA file is read here, so a failed report rebuilds it.
fn connect(
    endpoint: &str,
    credentials: &Credentials,
) -> Result<ConfigServiceClient<tonic::transport::Channel>, CredentialsError> {
    let channel = credentials
        .endpoint(endpoint)?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect_lazy();
    Ok(ConfigServiceClient::new(channel))
}

/// Sends reports to `endpoint` until `shutdown` turns true.
pub async fn run(
    endpoint: String,
    credentials: Credentials,
    mut inputs: ReportInputs,
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut client = None;
    let mut last: Option<pb::ReportRequest> = None;
    let mut findings = inputs.table.findings().subscribe();
    let mut suspects = inputs.suspects.subscribe();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let forced = tokio::select! {
            _ = tick.tick() => true,
            _ = inputs.stream.changed() => false,
            _ = inputs.role.changed() => false,
            _ = inputs.statuses.changed() => false,
            _ = findings.changed() => false,
            _ = suspects.changed() => false,
            _ = shutdown.changed() => return,
        };
        if !forced {
            tokio::select! {
                () = tokio::time::sleep(DEBOUNCE) => {}
                _ = shutdown.changed() => return,
            }
        }
        let report = build(&inputs);
        if !forced && last.as_ref() == Some(&report) {
            continue;
        }
        let mut request = tonic::Request::new(report.clone());
        let sent = match credentials
            .authorize(&mut request)
            .and_then(|()| match client.take() {
                Some(c) => Ok(c),
                None => connect(&endpoint, &credentials),
            }) {
            Ok(mut c) => {
                let result = c.report(request).await;
                client = Some(c);
                result
            }
            Err(e) => Err(tonic::Status::unavailable(e.to_string())),
        };
        match sent {
            Ok(_) => {
                debug!(
                    revision = report.applied_revision,
                    leader = report.leader,
                    pools = report.interfaces.len(),
                    "reported"
                );
                last = Some(report);
            }
            Err(status) => {
                warn!(%endpoint, error = %status, "report not delivered; retrying later");
                last = None;
                client = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pools::PoolLeases;
    use vmdhcp_core::fixtures::pool_config;

    #[test]
    fn one_entry_per_pool_with_its_interface_state() {
        let table = Arc::new(LeaseTable::new());
        let pool = |name: &str, ifname: &str, octet: u8| {
            PoolLeases::new(
                pool_config(&format!("ns/{name}"))
                    .with_interface(ifname)
                    .with_subnet(&format!("192.0.{octet}.0/24"))
                    .with_lease_seconds(60),
            )
        };
        table.apply_snapshot(&[pool("a", "vmda", 2), pool("b", "vmdb", 3)]);
        let squatter: MacAddr = "02:00:00:00:00:09".parse().unwrap();
        table.findings().record(
            &"ns/a".parse().unwrap(),
            "192.0.2.10".parse::<std::net::Ipv4Addr>().unwrap(),
            crate::findings::Finding::conflict(None, squatter, Reason::Offer),
        );
        let suspects = Arc::new(Suspects::default());
        suspects.record(
            &"ns/b".parse().unwrap(),
            SuspectKind::ForeignDhcpServer,
            "02:00:00:00:0e:0e".parse().unwrap(),
            Some("192.0.3.7".parse().unwrap()),
            "offered 192.0.3.50 to 02:00:00:00:01:0a",
        );
        suspects.record(
            &"ns/b".parse().unwrap(),
            SuspectKind::ForeignDhcpServer,
            "02:00:00:00:0e:0f".parse().unwrap(),
            Some("fe80::66".parse().unwrap()),
            "ADVERTISE from fe80::66",
        );
        suspects.record(
            &"ns/b".parse().unwrap(),
            SuspectKind::ProxyNdpResponder,
            "02:00:00:00:0e:0e".parse().unwrap(),
            None,
            "answers Neighbor Solicitations",
        );
        let (_s, stream) = watch::channel(ConnectionStatus {
            epoch: "e1".into(),
            revision: 9,
            ..ConnectionStatus::default()
        });
        let (_r, role) = watch::channel(AgentStatus {
            leader: true,
            ..AgentStatus::default()
        });
        let (_t, statuses) = watch::channel(BTreeMap::from([
            ("vmda".to_owned(), InterfaceStatus::Serving),
            (
                "vmdb".to_owned(),
                InterfaceStatus::Failed {
                    error: "no such interface".into(),
                },
            ),
        ]));
        let report = build(&ReportInputs {
            agent: pb::AgentIdentity {
                pod_name: "agent-0".into(),
                namespace: "ns".into(),
                node_name: "n".into(),
            },
            stream,
            role,
            statuses,
            table,
            suspects,
        });
        assert_eq!((report.epoch.as_str(), report.applied_revision), ("e1", 9));
        assert!(report.leader);
        let states: Vec<_> = report
            .interfaces
            .iter()
            .map(|i| (i.pool_ref.as_str(), i.state, i.error.as_str()))
            .collect();
        assert_eq!(
            states,
            [
                ("ns/a", pb::InterfaceState::Serving as i32, ""),
                (
                    "ns/b",
                    pb::InterfaceState::Error as i32,
                    "no such interface"
                ),
            ]
        );
        // The probe verdict travels with its pool's entry only.
        assert_eq!(
            report.interfaces[0].probes,
            [pb::AddressProbe {
                ip_address: "192.0.2.10".into(),
                mac_address: String::new(),
                answered_by: "02:00:00:00:00:09".into(),
                reason: pb::ProbeReason::Offer.into(),
            }]
        );
        assert!(report.interfaces[1].probes.is_empty());
        // So do the suspects, each address in its family's field.
        assert!(report.interfaces[0].suspects.is_empty());
        assert_eq!(
            report.interfaces[1].suspects,
            [
                pb::NetworkSuspect {
                    kind: pb::SuspectKind::ForeignDhcpServer.into(),
                    mac_address: "02:00:00:00:0e:0e".into(),
                    ip_address: "192.0.3.7".into(),
                    ipv6_address: String::new(),
                    detail: "offered 192.0.3.50 to 02:00:00:00:01:0a".into(),
                },
                pb::NetworkSuspect {
                    kind: pb::SuspectKind::ForeignDhcpServer.into(),
                    mac_address: "02:00:00:00:0e:0f".into(),
                    ip_address: String::new(),
                    ipv6_address: "fe80::66".into(),
                    detail: "ADVERTISE from fe80::66".into(),
                },
                pb::NetworkSuspect {
                    kind: pb::SuspectKind::ProxyNdpResponder.into(),
                    mac_address: "02:00:00:00:0e:0e".into(),
                    ip_address: String::new(),
                    ipv6_address: String::new(),
                    detail: "answers Neighbor Solicitations".into(),
                },
            ]
        );
    }

    #[test]
    fn an_ipv6_verdict_is_reported_as_rfc_5952_text_after_the_ipv4_ones() {
        let table = LeaseTable::new();
        table.apply_snapshot(&[PoolLeases::new(pool_config("ns/a"))]);
        let pool: NamespacedName = "ns/a".parse().unwrap();
        let (vm, squatter): (MacAddr, MacAddr) = (
            "02:00:00:00:00:01".parse().unwrap(),
            "02:00:00:00:00:09".parse().unwrap(),
        );
        let v6: std::net::Ipv6Addr = "fd00:0:0:0:0:0:0:10".parse().unwrap();
        table.findings().record(
            &pool,
            v6,
            crate::findings::Finding::conflict(Some(vm), squatter, Reason::Decline),
        );
        table.findings().record(
            &pool,
            "192.0.2.10".parse::<std::net::Ipv4Addr>().unwrap(),
            crate::findings::Finding::free(None),
        );
        assert_eq!(
            probes(&table, &pool),
            [
                pb::AddressProbe {
                    ip_address: "192.0.2.10".into(),
                    mac_address: String::new(),
                    answered_by: String::new(),
                    reason: pb::ProbeReason::Recheck.into(),
                },
                pb::AddressProbe {
                    ip_address: "fd00::10".into(),
                    mac_address: "02:00:00:00:00:01".into(),
                    answered_by: "02:00:00:00:00:09".into(),
                    reason: pb::ProbeReason::Decline.into(),
                },
            ]
        );
    }
}
