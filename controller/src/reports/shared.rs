//! Reports shared between the replicas: each agent's report as one key of a ConfigMap, written
//! by the replica that received it, followed by every replica.

use super::*;

/// One report as stored in the ConfigMap (short keys: one entry per agent, one line per pool).
#[derive(Serialize, Deserialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(super) struct Stored {
    pod: String,
    namespace: String,
    #[serde(default)]
    node: String,
    #[serde(default)]
    epoch: String,
    #[serde(default)]
    revision: u64,
    #[serde(default)]
    leader: bool,
    /// Milliseconds since the Unix epoch.
    received_ms: u64,
    #[serde(default)]
    interfaces: Vec<StoredInterface>,
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(super) struct StoredInterface {
    pool: String,
    name: String,
    state: i32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    error: String,
    #[serde(default)]
    leases: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    probes: Vec<StoredProbe>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    suspects: Vec<StoredSuspect>,
}

/// One suspect as stored: an empty string for no address or detail.
#[derive(Serialize, Deserialize, Debug, PartialEq)]
pub(super) struct StoredSuspect {
    kind: i32,
    mac: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    ip: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    detail: String,
}

impl StoredSuspect {
    fn of(s: &NetworkSuspect) -> Self {
        StoredSuspect {
            kind: s.kind as i32,
            mac: s.mac.to_string(),
            ip: s.ip.map(|ip| ip.to_string()).unwrap_or_default(),
            detail: s.detail.clone(),
        }
    }

    /// Back into a suspect; `None` for one this controller cannot read (a newer replica's).
    fn read(&self) -> Option<NetworkSuspect> {
        Some(NetworkSuspect {
            kind: SuspectKind::from_number(self.kind)?,
            mac: self.mac.parse().ok()?,
            ip: match self.ip.as_str() {
                "" => None,
                ip => Some(ip.parse().ok()?),
            },
            detail: truncate_detail(&self.detail, MAX_SUSPECT_DETAIL).to_owned(),
        })
    }
}

/// One probe verdict as stored: empty strings for no MAC.
#[derive(Serialize, Deserialize, Debug, PartialEq)]
pub(super) struct StoredProbe {
    ip: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    mac: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    by: String,
    reason: i32,
}

impl StoredProbe {
    fn of(p: &AddressProbe) -> Self {
        StoredProbe {
            ip: p.ip.to_string(),
            mac: MacAddr::text_or_empty(p.mac),
            by: MacAddr::text_or_empty(p.answered_by),
            reason: p.reason as i32,
        }
    }

    /// Back into a verdict; `None` for one this controller cannot read (it was checked on
    /// receipt, so only a newer replica's could be).
    fn read(&self) -> Option<AddressProbe> {
        Some(AddressProbe {
            ip: self.ip.parse().ok()?,
            mac: MacAddr::parse_or_empty(&self.mac).ok()?,
            answered_by: MacAddr::parse_or_empty(&self.by).ok()?,
            reason: ProbeReason::from_number(self.reason)?,
        })
    }
}

/// The ConfigMap key of an agent: `namespace.pod` (a namespace has no dots, so it splits back).
pub(super) fn data_key(agent: &NamespacedName) -> String {
    format!("{}.{}", agent.namespace, agent.name)
}

/// A report as the ConfigMap value stored under its agent's key.
pub(super) fn encode(report: &AgentReport) -> String {
    let millis = report
        .received_at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let stored = Stored {
        pod: report.agent.pod_name.clone(),
        namespace: report.agent.namespace.clone(),
        node: report.agent.node_name.clone(),
        epoch: report.epoch.clone(),
        revision: report.applied_revision,
        leader: report.leader,
        received_ms: millis,
        interfaces: report
            .interfaces
            .iter()
            .map(|i| StoredInterface {
                pool: i.pool_ref.clone(),
                name: i.interface_name.clone(),
                state: i.state as i32,
                error: i.error.clone(),
                leases: i.lease_count,
                probes: i.probes.iter().map(StoredProbe::of).collect(),
                suspects: i.suspects.iter().map(StoredSuspect::of).collect(),
            })
            .collect(),
    };
    // Strings, numbers and booleans only: serialisation cannot fail; "{}" would decode as an
    // error on the reading side rather than as a wrong report.
    serde_json::to_string(&stored).unwrap_or_else(|_| "{}".to_owned())
}

/// A ConfigMap value back into a report.
pub(super) fn decode(key: &str, value: &str) -> Result<AgentReport, ReportError> {
    let stored: Stored = serde_json::from_str(value).map_err(|source| ReportError::Decode {
        key: key.to_owned(),
        source,
    })?;
    Ok(AgentReport {
        agent: AgentIdentity {
            pod_name: stored.pod,
            namespace: stored.namespace,
            node_name: stored.node,
        },
        epoch: stored.epoch,
        applied_revision: stored.revision,
        leader: stored.leader,
        interfaces: stored
            .interfaces
            .into_iter()
            .map(|i| InterfaceReport {
                pool_ref: i.pool,
                interface_name: i.name,
                // A number this controller does not know (a newer replica wrote it) counts as
                // not reported.
                state: InterfaceState::from_number(i.state).unwrap_or_default(),
                error: i.error,
                lease_count: i.leases,
                probes: i.probes.iter().filter_map(StoredProbe::read).collect(),
                suspects: i.suspects.iter().filter_map(StoredSuspect::read).collect(),
            })
            .collect(),
        received_at: UNIX_EPOCH + Duration::from_millis(stored.received_ms),
    })
}

/// Follows the agents' election Lease `lease` into `reports` ([`Reports::lead_by`]) until
/// `stop`: who holds it is who leads, whatever reports claim. Until the first read, nobody
/// leads (no `AgentReady`, no conflicts recorded) rather than anyone who says so.
pub async fn follow_agent_lease(
    client: kube::Client,
    lease: NamespacedName,
    reports: Arc<Reports>,
    mut stop: watch::Receiver<bool>,
) {
    use k8s_openapi::api::coordination::v1::Lease;
    reports.lead_by(lease.clone());
    let api: Api<Lease> = Api::namespaced(client, &lease.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={}", lease.name));
    let mut events = std::pin::pin!(watcher(api, config).default_backoff());
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(watcher::Event::Apply(l) | watcher::Event::InitApply(l))) => {
                    reports.set_holder(l.spec.and_then(|s| s.holder_identity).filter(|h| !h.is_empty()));
                }
                Some(Ok(watcher::Event::Delete(_))) => reports.set_holder(None),
                Some(Ok(_)) => {}
                Some(Err(error)) => warn!(%error, %lease, "agent Lease watch failed; retrying"),
                None => return,
            },
            () = stop_requested(&mut stop) => return,
        }
    }
}

/// Where reports are published: the ConfigMap `name` in `namespace`.
#[derive(Clone, Debug)]
pub struct ReportsObject {
    /// The controller's namespace.
    pub namespace: String,
    /// `<controller Lease name>-agent-reports`.
    pub name: String,
}

impl ReportsObject {
    /// The object next to the controllers' Lease `lease` in `namespace`.
    pub fn beside_lease(namespace: &str, lease: &str) -> Self {
        ReportsObject {
            namespace: namespace.to_owned(),
            name: format!("{lease}-agent-reports"),
        }
    }
}

/// Field manager of the reports ConfigMap.
pub(super) const FIELD_MANAGER: &str = "vm-dhcp-controller-reports";

/// Writes one agent's entry (creating the ConfigMap the first time).
pub(super) async fn put(
    api: &Api<ConfigMap>,
    object: &ReportsObject,
    key: &str,
    value: Option<String>,
) -> Result<(), ReportError> {
    let kube_err = |action: &str| {
        let action = format!(
            "{action} {key} in ConfigMap {}/{}",
            object.namespace, object.name
        );
        move |source| ReportError::Kube { action, source }
    };
    let patch = serde_json::json!({"data": {key: value}});
    match api
        .patch(&object.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => return Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() && value.is_some() => {}
        Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(()),
        Err(e) => return Err(kube_err("writing")(e)),
    }
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(object.name.clone()),
            namespace: Some(object.namespace.clone()),
            labels: Some(
                [(
                    "app.kubernetes.io/managed-by".to_owned(),
                    "vm-dhcp-controller".to_owned(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        data: value.map(|v| [(key.to_owned(), v)].into()),
        ..Default::default()
    };
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..Default::default()
    };
    match api.create(&params, &cm).await {
        Ok(_) => Ok(()),
        // Another replica created it in between: our key goes in by patch after all.
        Err(kube::Error::Api(s)) if s.is_already_exists() => api
            .patch(&object.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(kube_err("writing")),
        Err(e) => Err(kube_err("creating")(e)),
    }
}

/// Publishes the reports this replica receives until `stop`: a changed report at once, one
/// that is the same to publish ([`AgentReport::same_to_publish`]) at most every [`REFRESH`].
pub async fn publish(
    client: kube::Client,
    object: ReportsObject,
    reports: Arc<Reports>,
    mut stop: watch::Receiver<bool>,
) {
    let api: Api<ConfigMap> = Api::namespaced(client, &object.namespace);
    let (tx, mut rx) = mpsc::channel(OUTBOX);
    reports.attach_outbox(tx);
    let mut written: HashMap<NamespacedName, (AgentReport, tokio::time::Instant)> = HashMap::new();
    loop {
        let report = tokio::select! {
            r = rx.recv() => match r { Some(r) => r, None => return },
            () = stop_requested(&mut stop) => return,
        };
        let Ok(agent) = report.key() else { continue };
        let (news, due) = match written.get(&agent) {
            None => (true, true),
            Some((last, at)) => {
                let news = !last.same_to_publish(&report);
                (news, news || at.elapsed() >= REFRESH)
            }
        };
        if !due {
            continue;
        }
        match put(&api, &object, &data_key(&agent), Some(encode(&report))).await {
            Ok(()) => {
                if news {
                    let serving = report
                        .interfaces
                        .iter()
                        .filter(|i| i.state == InterfaceState::Serving)
                        .count();
                    info!(%agent, leader = report.leader, epoch = %report.epoch, interfaces = report.interfaces.len(), serving, "agent report changed; published");
                } else {
                    debug!(%agent, "agent report refreshed");
                }
                written.insert(agent, (report, tokio::time::Instant::now()));
            }
            Err(error) => warn!(%error, "agent report not published; the agent reports again"),
        }
        written.retain(|_, (_, at)| at.elapsed() < STALE_AFTER);
    }
}

/// Feeds `reports` from the ConfigMap until `stop`; while this replica leads, also deletes
/// entries older than [`STALE_AFTER`].
pub async fn follow(
    client: kube::Client,
    object: ReportsObject,
    reports: Arc<Reports>,
    leader: watch::Receiver<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let api: Api<ConfigMap> = Api::namespaced(client, &object.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={}", object.name));
    let mut events = std::pin::pin!(watcher(api.clone(), config).default_backoff());
    let mut sweep = tokio::time::interval(SWEEP);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // When each entry of the ConfigMap was received, as last seen.
    let mut entries: BTreeMap<String, SystemTime> = BTreeMap::new();
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm))) => {
                    entries = absorb(&cm, &reports);
                }
                Some(Ok(_)) => {}
                Some(Err(error)) => warn!(%error, "agent reports watch failed; retrying"),
                None => return,
            },
            _ = sweep.tick() => {
                let now = SystemTime::now();
                let dropped = reports.retain_fresh(now);
                if dropped > 0 {
                    info!(dropped, "stale agent reports dropped");
                }
                let leading = *leader.borrow();
                if leading {
                    for (key, _) in entries.iter().filter(|(_, at)| is_stale(**at, now)) {
                        match put(&api, &object, key, None).await {
                            Ok(()) => info!(entry = %key, "stale agent report removed"),
                            Err(error) => warn!(%error, "stale agent report not removed"),
                        }
                    }
                }
            }
            () = stop_requested(&mut stop) => return,
        }
    }
}

/// Resolves once `stop` turns true or its sender is gone (holds no borrow of the channel).
pub(super) async fn stop_requested(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Records every entry of the ConfigMap; returns when each was received. An entry that does
/// not decode is skipped with a warning (the others still count).
pub(super) fn absorb(cm: &ConfigMap, reports: &Reports) -> BTreeMap<String, SystemTime> {
    let mut seen = BTreeMap::new();
    for (key, value) in cm.data.iter().flatten() {
        let report = match decode(key, value) {
            Ok(r) => r,
            Err(error) => {
                warn!(%error, "agent report skipped");
                continue;
            }
        };
        seen.insert(key.clone(), report.received_at);
        if let Err(error) = reports.observe(report) {
            warn!(%error, "agent report from the API not kept");
        }
    }
    seen
}
