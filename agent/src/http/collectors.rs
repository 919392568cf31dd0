//! The collectors `/metrics` reads at scrape time: the stream, ARP and IPv6 host guards, DHCPv6,
//! suspects, the agent's role, and the data plane (counters, leases, statuses).

use super::*;

/// `vmdhcp_agent_stream_*`: where the config stream stands.
#[derive(Debug)]
pub(super) struct StreamMetrics(pub(super) watch::Receiver<ConnectionStatus>);

impl Collector for StreamMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self.0.borrow().clone();
        let gauges: [(&str, &str, i64); 3] = [
            (
                "vmdhcp_agent_stream_connected",
                "1 while a config stream to the controller is open.",
                i64::from(s.connected),
            ),
            (
                "vmdhcp_agent_stream_synced",
                "1 once a snapshot has been applied (the state is served through disconnects).",
                i64::from(s.synced),
            ),
            (
                "vmdhcp_agent_stream_revision",
                "Index revision last applied completely.",
                i64::try_from(s.revision).unwrap_or(i64::MAX),
            ),
        ];
        for (name, help, value) in gauges {
            let family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(value).encode(family)?;
        }
        let counters: [(&str, &str, u64); 2] = [
            (
                "vmdhcp_agent_stream_connects",
                "Config streams opened.",
                s.connects,
            ),
            (
                "vmdhcp_agent_stream_rejected_messages",
                "Stream messages rejected (invalid or out of order) and answered by asking for a snapshot.",
                s.rejected,
            ),
        ];
        for (name, help, value) in counters {
            let family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(value).encode(family)?;
        }
        Ok(())
    }
}

/// Encodes a counter of frames sent and refused per interface and pool: the ARP announcements
/// and the foreign-DHCP probes have this one shape.
pub(super) fn encode_sent_failed(
    family: &mut prometheus_client::encoding::MetricEncoder<'_>,
    readings: &[SendReading],
) -> Result<(), std::fmt::Error> {
    for r in readings {
        for (result, value) in [("sent", r.sent), ("failed", r.failed)] {
            let labels = [
                ("interface", r.interface.as_str()),
                ("pool", r.pool.as_str()),
                ("result", result),
            ];
            ConstCounter::new(value).encode(family.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

/// `vmdhcp_agent_arp_announcements*`: gratuitous ARP sent for the server addresses taken over.
#[derive(Debug)]
pub(super) struct ArpMetrics(pub(super) ArpCounters);

impl Collector for ArpMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let family = encoder.encode_descriptor(
            "vmdhcp_agent_arp_announcements_enabled",
            "1 when the agent can send ARP announcements (0: it lacks CAP_NET_RAW, or does not \
             configure interfaces).",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(i64::from(self.0.enabled())).encode(family)?;
        let mut family = encoder.encode_descriptor(
            "vmdhcp_agent_arp_announcements",
            "ARP announcements of server addresses on taking an interface over, by result \
             (sent, failed).",
            None,
            MetricType::Counter,
        )?;
        encode_sent_failed(&mut family, &self.0.read())
    }
}

/// `vmdhcp_agent_ipv6_*`: whether each pool interface ignores tenants' routing by its settings,
/// and what the sweep removed that a tenant's RA or redirect taught it anyway.
#[derive(Debug)]
pub(super) struct Host6Metrics(pub(super) Host6Counters);

impl Collector for Host6Metrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let all = self.0.read();
        let mut family = encoder.encode_descriptor(
            "vmdhcp_agent_ipv6_host_settings",
            "1 when the pool interface has accept_ra, autoconf, accept_redirects and proxy_ndp \
             off; 0 when /proc/sys was not writable and only the sweep removes what tenants' \
             Router Advertisements and redirects teach it.",
            None,
            MetricType::Gauge,
        )?;
        for r in &all {
            let labels = [
                ("interface", r.interface.as_str()),
                ("pool", r.pool.as_str()),
            ];
            ConstGauge::new(i64::from(r.settings)).encode(family.encode_family(&labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "vmdhcp_agent_ipv6_learned_removed",
            "Routes and addresses a pool interface learned from a tenant's Router Advertisement \
             or redirect, removed by the agent, by kind (route, address).",
            None,
            MetricType::Counter,
        )?;
        for r in &all {
            for (kind, value) in [
                ("route", r.routes_removed),
                ("address", r.addresses_removed),
            ] {
                let labels = [
                    ("interface", r.interface.as_str()),
                    ("pool", r.pool.as_str()),
                    ("kind", kind),
                ];
                ConstCounter::new(value).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// `vmdhcp_agent_dhcp6_*`: what each interface's DHCPv6 server received, answered and dropped.
#[derive(Debug)]
pub(super) struct Dhcp6Metrics(pub(super) watch::Receiver<Vec<(Interface6, Arc<Counters6>)>>);

impl Collector for Dhcp6Metrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use std::sync::atomic::Ordering::Relaxed;
        let all = self.0.borrow().clone();
        type Read = fn(&Counters6) -> Vec<(&'static str, u64)>;
        let series: [(&str, &str, &str, Read); 7] = [
            (
                "vmdhcp_agent_dhcp6_requests",
                "DHCPv6 datagrams received on port 547.",
                "",
                |c| vec![("", c.received.load(Relaxed))],
            ),
            (
                "vmdhcp_agent_dhcp6_replies",
                "DHCPv6 answers sent, by type (advertise, reply).",
                "type",
                |c| {
                    vec![
                        ("advertise", c.advertised.load(Relaxed)),
                        ("reply", c.replied.load(Relaxed)),
                    ]
                },
            ),
            (
                "vmdhcp_agent_dhcp6_dropped",
                "DHCPv6 datagrams dropped as unusable, by reason.",
                "reason",
                |c| {
                    DropReason6::ALL
                        .iter()
                        .zip(&c.dropped)
                        .map(|(r, n)| (r.as_str(), n.load(Relaxed)))
                        .collect()
                },
            ),
            (
                "vmdhcp_agent_dhcp6_unanswered",
                "DHCPv6 messages not answered on purpose (unknown clients, another server's renewals).",
                "",
                |c| vec![("", c.silent.load(Relaxed))],
            ),
            (
                "vmdhcp_agent_dhcp6_declines",
                "DHCPv6 DECLINEs of a reserved address, by what a Neighbor Solicitation found: \
                 confirmed (another host answers; withheld), unconfirmed (still served), not_probed.",
                "result",
                |c| {
                    vec![
                        ("confirmed", c.declines.confirmed.load(Relaxed)),
                        ("unconfirmed", c.declines.unconfirmed.load(Relaxed)),
                        ("not_probed", c.declines.not_probed.load(Relaxed)),
                    ]
                },
            ),
            (
                "vmdhcp_agent_dhcp6_reconfigures",
                "RECONFIGUREs sent to clients holding a reconfigure key whose answer changed.",
                "",
                |c| vec![("", c.reconfigures.load(Relaxed))],
            ),
            (
                "vmdhcp_agent_dhcp6_send_errors",
                "DHCPv6 answers the kernel refused to send.",
                "",
                |c| vec![("", c.send_failed.load(Relaxed))],
            ),
        ];
        for (name, help, label, read) in series {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (interface, counters) in &all {
                let pool = interface.pool.to_string();
                for (value_label, value) in read(counters) {
                    let mut labels = vec![
                        ("interface", interface.name.as_str()),
                        ("pool", pool.as_str()),
                    ];
                    if !label.is_empty() {
                        labels.push((label, value_label));
                    }
                    ConstCounter::new(value).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        Ok(())
    }
}

/// `vmdhcp_agent_network_suspects`, `vmdhcp_agent_foreign_dhcp_probes` and
/// `vmdhcp_agent_dhcp_peer_replies`: what the serving agent found on the pools' networks, how
/// often it asked, and what it heard from the servers named as peers.
#[derive(Debug)]
pub(super) struct SuspectMetrics {
    pub(super) table: Arc<LeaseTable>,
    pub(super) suspects: Arc<Suspects>,
    pub(super) probes: SendCounters,
}

impl Collector for SuspectMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // Every served pool shows every kind, so that a cleared suspect reads 0 rather than
        // vanishing.
        let mut counts: BTreeMap<(String, SuspectKind), usize> = BTreeMap::new();
        for pool in self.table.pools().keys() {
            for kind in SuspectKind::ALL {
                counts.insert((pool.to_string(), kind), 0);
            }
        }
        for (pool, kind, n) in self.suspects.counts() {
            counts.insert((pool.to_string(), kind), n);
        }
        let mut family = encoder.encode_descriptor(
            "vmdhcp_agent_network_suspects",
            "Hosts found acting where they should not on a pool's network and seen recently, by \
             kind (foreign_dhcp_server, proxy_arp_responder); only the serving agent looks.",
            None,
            MetricType::Gauge,
        )?;
        for ((pool, kind), n) in &counts {
            let labels = [("pool", pool.as_str()), ("kind", kind.as_str())];
            ConstGauge::new(i64::try_from(*n).unwrap_or(i64::MAX))
                .encode(family.encode_family(&labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "vmdhcp_agent_foreign_dhcp_probes",
            "DHCPDISCOVERs sent from a served interface's own MAC to find other DHCP servers, by \
             result (sent, failed).",
            None,
            MetricType::Counter,
        )?;
        encode_sent_failed(&mut family, &self.probes.read())?;
        let mut family = encoder.encode_descriptor(
            "vmdhcp_agent_dhcp_peer_replies",
            "Answers heard from the DHCP servers named as peers (KNOWN_DHCP_SERVERS) on a \
             pool's network, of either family; peers are never reported as foreign servers.",
            None,
            MetricType::Counter,
        )?;
        for (pool, n) in self.suspects.peer_replies() {
            let pool = pool.to_string();
            ConstCounter::new(n).encode(family.encode_family(&[("pool", pool.as_str())])?)?;
        }
        Ok(())
    }
}

/// `vmdhcp_agent_leader`: whether this replica answers DHCP; `vmdhcp_agent_leader_transitions`:
/// how many times the Lease changed hands, absent until the Lease was seen held (a new replica
/// must not export 0, or its start would look like leadership changing hands).
#[derive(Debug)]
pub(super) struct RoleMetrics(pub(super) watch::Receiver<AgentStatus>);

impl Collector for RoleMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (leader, transitions) = {
            let status = self.0.borrow();
            (status.leader, status.lease_transitions)
        };
        let family = encoder.encode_descriptor(
            "vmdhcp_agent_leader",
            "1 while this agent replica holds the leader Lease and answers DHCP.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(i64::from(leader)).encode(family)?;
        if let Some(transitions) = transitions {
            let family = encoder.encode_descriptor(
                "vmdhcp_agent_leader_transitions",
                "leaseTransitions of the agents' leader Lease as this replica last saw it: how \
                 many times leadership changed hands.",
                None,
                MetricType::Gauge,
            )?;
            ConstGauge::new(i64::from(transitions)).encode(family)?;
        }
        Ok(())
    }
}

/// Reads counters, leases and statuses at scrape time, so a removed pool's series disappear
/// with it and the packet path never touches a metrics structure.
#[derive(Debug)]
pub(super) struct DataPlaneMetrics {
    pub(super) table: Arc<LeaseTable>,
    pub(super) statuses: watch::Receiver<BTreeMap<String, InterfaceStatus>>,
    pub(super) counters: watch::Receiver<Vec<InterfaceCounters>>,
}

pub(super) type Pick = fn(&Reading) -> &[(&'static str, u64)];

impl Collector for DataPlaneMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let counters = self.counters.borrow().clone();
        let readings: Vec<(&str, String, Reading)> = counters
            .iter()
            .map(|(i, c)| (i.name.as_str(), i.pool.to_string(), c.read()))
            .collect();
        let families: [(&str, &str, &str, Pick); 6] = [
            (
                "vmdhcp_agent_dhcp_requests",
                "DHCP requests received, by message type.",
                "type",
                |r| &r.received,
            ),
            (
                "vmdhcp_agent_dhcp_replies",
                "DHCP replies sent, by message type (offer, ack, nak).",
                "type",
                |r| &r.replies,
            ),
            (
                "vmdhcp_agent_dhcp_unanswered",
                "Requests deliberately left unanswered, by reason (unknown_mac, other_server, ...).",
                "reason",
                |r| &r.unanswered,
            ),
            (
                "vmdhcp_agent_dhcp_dropped",
                "Datagrams dropped as unusable, by reason.",
                "reason",
                |r| &r.dropped,
            ),
            (
                "vmdhcp_agent_declines",
                "DHCPDECLINEs checked with an ARP probe, by verdict (conflict, holder_answers, \
                 no_answer, unverifiable, busy); only conflict and unverifiable withhold the address.",
                "verdict",
                |r| &r.declines,
            ),
            (
                "vmdhcp_agent_offer_probes",
                "Addresses ARP-probed before their first OFFER to a MAC, by verdict (clean, conflict: \
                 not offered, unverifiable and busy: offered unprobed).",
                "verdict",
                |r| &r.offer_probes,
            ),
        ];
        for (name, help, key, pick) in families {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (interface, pool, reading) in &readings {
                for (label, value) in pick(reading) {
                    let labels = [
                        ("interface", *interface),
                        ("pool", pool.as_str()),
                        (key, label),
                    ];
                    ConstCounter::new(*value).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        let mut family = encoder.encode_descriptor(
            "vmdhcp_agent_dhcp_send_errors",
            "Replies the socket refused to send.",
            None,
            MetricType::Counter,
        )?;
        for (interface, pool, reading) in &readings {
            let labels = [("interface", *interface), ("pool", pool.as_str())];
            ConstCounter::new(reading.send_errors).encode(family.encode_family(&labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "vmdhcp_agent_dhcp_forcerenews",
            "FORCERENEWs sent to clients holding a reconfigure key whose answer changed.",
            None,
            MetricType::Counter,
        )?;
        for (interface, pool, reading) in &readings {
            let labels = [("interface", *interface), ("pool", pool.as_str())];
            ConstCounter::new(reading.forcerenews).encode(family.encode_family(&labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "vmdhcp_agent_dhcp_reply_latency_seconds",
            "Time from a request's arrival to its reply being handed to the kernel.",
            None,
            MetricType::Histogram,
        )?;
        for (interface, pool, reading) in &readings {
            let labels = [("interface", *interface), ("pool", pool.as_str())];
            family
                .encode_family(&labels)?
                .encode_histogram::<NoLabelSet>(
                    reading.latency_sum_seconds,
                    reading.latency_count,
                    &reading.latency_buckets,
                    None,
                )?;
        }
        self.encode_tables(encoder, &counters)
    }
}

impl DataPlaneMetrics {
    /// The per-interface serving state and the per-pool lease and conflict gauges.
    fn encode_tables(
        &self,
        mut encoder: DescriptorEncoder,
        counters: &[InterfaceCounters],
    ) -> Result<(), std::fmt::Error> {
        let statuses = self.statuses.borrow().clone();
        let mut family = encoder.encode_descriptor(
            "vmdhcp_agent_interface_serving",
            "1 while the interface's DHCP server is bound and answering, else 0.",
            None,
            MetricType::Gauge,
        )?;
        for (interface, pool) in counters.iter().map(|(i, _)| (&i.name, &i.pool)) {
            let up = matches!(statuses.get(interface), Some(InterfaceStatus::Serving));
            let pool = pool.to_string();
            let labels = [("interface", interface.as_str()), ("pool", pool.as_str())];
            ConstGauge::new(i64::from(up)).encode(family.encode_family(&labels)?)?;
        }
        let pools = self.table.pools();
        let conflicts = self.table.conflicts();
        let mut family = encoder.encode_descriptor(
            "vmdhcp_agent_leases",
            "Leases held in the table, per pool.",
            None,
            MetricType::Gauge,
        )?;
        for (pool, snap) in &pools {
            let pool = pool.to_string();
            let n = i64::try_from(snap.len()).unwrap_or(i64::MAX);
            ConstGauge::new(n).encode(family.encode_family(&[("pool", pool.as_str())])?)?;
        }
        let mut family = encoder.encode_descriptor(
            "vmdhcp_agent_conflicted_addresses",
            "Addresses withheld now after an ARP probe found another host using them, per pool.",
            None,
            MetricType::Gauge,
        )?;
        for pool in pools.keys() {
            let n = conflicts.get(pool).map_or(0, |c| c.len());
            let pool = pool.to_string();
            ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX))
                .encode(family.encode_family(&[("pool", pool.as_str())])?)?;
        }
        let mut family = encoder.encode_descriptor(
            "vmdhcp_agent_recorded_conflicts",
            "Addresses the pool's status records as used by another host (status.ipv4.conflicts), \
             as served to this agent, per pool.",
            None,
            MetricType::Gauge,
        )?;
        for (pool, snap) in &pools {
            let n = snap.config().conflicted.len();
            let pool = pool.to_string();
            ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX))
                .encode(family.encode_family(&[("pool", pool.as_str())])?)?;
        }
        Ok(())
    }
}
