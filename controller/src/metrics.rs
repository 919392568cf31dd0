//! The controller's Prometheus metrics: upstream's names and labels, removed together with their
//! object (upstream leaked pool series by deleting them under the wrong label), plus reconcile
//! counts, errors and durations, agent-bootstrap checks, the hosts found acting where they
//! should not on each pool's network, the config stream's token checks (reviews sent, callers
//! refused before one), the admission webhook's answers, the served certificates' expiry, and
//! gauges of live state read at scrape time (open config streams, index revision, leadership and
//! the leader Lease's transitions).

use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use vmdhcp_core::NamespacedName;
use vmdhcp_core::crd::ClaimQuota;

/// Labels of the address-claim gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct ClaimLabels {
    /// The pool, `namespace/name` (empty while no pool serves the claim's network).
    pub ippool: String,
    /// The claim's namespace (not `namespace`: the scrape sets that to the controller pod's).
    pub claim_namespace: String,
    /// `Reserved`, `Bound` or `Refused`.
    pub phase: String,
}

/// Labels of the claim quota gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct QuotaLabels {
    /// The pool, `namespace/name`.
    pub ippool: String,
    /// The namespace the quota applies to.
    pub claim_namespace: String,
    /// `ipv4` or `ipv6`.
    pub family: String,
}

/// Labels of the pool gauges (upstream: `ippool` is `ns/name`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct PoolLabels {
    /// The pool, `namespace/name`.
    pub ippool: String,
    /// Its subnet.
    pub cidr: String,
    /// Its network, `namespace/name`.
    pub network: String,
}

/// Labels of `vmdhcpcontroller_vmnetcfg_status`. Shared strings: the series is kept twice (in
/// the family, and per config to remove it when the config changes), and a copy is then
/// pointers rather than five more strings, for each of tens of thousands of configs.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct VmnetcfgLabels {
    /// The config, `namespace/name`.
    pub vmnetcfg: Arc<str>,
    /// The network.
    pub network: Arc<str>,
    /// The NIC.
    pub mac: Arc<str>,
    /// Its address (empty while pending).
    pub ip: Arc<str>,
    /// Allocated, Pending or Stale.
    pub state: Arc<str>,
}

/// Labels of `vmdhcpcontroller_network_suspects`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct SuspectLabels {
    ippool: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileLabels {
    controller: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AllocationLabels {
    ippool: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: String,
}

/// The counters of the Kubernetes events a term publishes, by outcome: events are best-effort
/// (a bounded queue, dropped when full), and how many never reached the API is what an operator
/// reading `kubectl describe` needs to know.
#[derive(Clone, Debug, Default)]
pub struct EventCounts {
    /// Created, or continued as a series.
    pub published: Counter,
    /// Not queued: the queue was full (the API server slower than the events came).
    pub dropped: Counter,
    /// Refused by the API server, or the request failed.
    pub failed: Counter,
    /// Warnings not sent: the object was told the same for the same reason lately, or spent
    /// its budget for the reason.
    pub repeated: Counter,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabel {
    controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CertificateLabel {
    certificate: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WebhookLabels {
    webhook: String,
    kind: String,
    result: String,
}

/// `vmdhcpcontroller_leader_transitions`: the leader Lease's `leaseTransitions` as this replica
/// last saw it. Absent until the Lease has been seen held: a process that has not read it yet
/// must not export 0, or a restart would look like leadership changing hands.
#[derive(Debug)]
struct LeaseTransitions(Arc<AtomicI64>);

impl Collector for LeaseTransitions {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let seen = self.0.load(Ordering::Relaxed);
        if seen < 0 {
            return Ok(());
        }
        let family = encoder.encode_descriptor(
            "vmdhcpcontroller_leader_transitions",
            "leaseTransitions of the controllers' leader Lease as this replica last saw it: how \
             many times leadership changed hands",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(seen).encode(family)
    }
}

/// The counters of the config stream's token checks: every TokenReview is a write to the API
/// server under the controller's own ServiceAccount, so what reached it (by result) is counted
/// apart from what was refused before one was sent (by reason). A flood of bogus tokens shows
/// as refusals climbing while reviews stay within the rate limit.
#[derive(Clone, Debug, Default)]
pub struct TokenCounts {
    reviews: Family<ResultLabel, Counter>,
    refused: Family<ReasonLabel, Counter>,
    issuer_keys: Gauge,
}

impl TokenCounts {
    /// Counts one TokenReview sent, by `result`: `allowed`, `rejected` (not authenticated for
    /// our audience), `forbidden` (another ServiceAccount) or `failed` (no answer).
    pub fn reviewed(&self, result: &str) {
        self.reviews
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
    }

    /// Says how many of the cluster's signing keys token signatures are checked against (0:
    /// none can be read, every token goes to a TokenReview).
    pub fn issuer_keys(&self, keys: usize) {
        self.issuer_keys
            .set(i64::try_from(keys).unwrap_or(i64::MAX));
    }

    /// Counts one caller refused without a TokenReview, by `reason`: `missing`, `malformed`,
    /// `signature`, `audience`, `expired`, `forbidden` (another ServiceAccount's genuine token)
    /// or `rate_limited`.
    pub fn refused(&self, reason: &str) {
        self.refused
            .get_or_create(&ReasonLabel {
                reason: reason.into(),
            })
            .inc();
    }
}

/// All controller metrics and the registry that exposes them.
pub struct Metrics {
    registry: Registry,
    ippool_used: Family<PoolLabels, Gauge>,
    ippool_available: Family<PoolLabels, Gauge>,
    vmnetcfg_status: Family<VmnetcfgLabels, Gauge>,
    network_suspects: Family<SuspectLabels, Gauge>,
    reconciles: Family<ReconcileLabels, Counter>,
    durations: Family<ControllerLabel, Histogram>,
    bootstrap_checks: Family<ResultLabel, Counter>,
    allocations: Family<AllocationLabels, Counter>,
    foreign: Family<AllocationLabels, Counter>,
    events: Family<ResultLabel, Counter>,
    tokens: TokenCounts,
    stream_clients: Gauge,
    index_revision: Gauge,
    index_pools_examined: Counter,
    leader: Gauge,
    leader_transitions: Arc<AtomicI64>,
    certificate_expiry: Family<CertificateLabel, Gauge>,
    webhook_requests: Family<WebhookLabels, Counter>,
    pool_series: Mutex<HashMap<String, PoolLabels>>,
    vmnetcfg_series: Mutex<HashMap<String, Box<[VmnetcfgLabels]>>>,
    suspect_series: Mutex<BTreeSet<SuspectLabels>>,
    claims: Family<ClaimLabels, Gauge>,
    claim_quota: Family<QuotaLabels, Gauge>,
    claim_series: Mutex<HashMap<String, ClaimLabels>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let ippool_used = Family::<PoolLabels, Gauge>::default();
        let ippool_available = Family::<PoolLabels, Gauge>::default();
        let vmnetcfg_status = Family::<VmnetcfgLabels, Gauge>::default();
        let network_suspects = Family::<SuspectLabels, Gauge>::default();
        let claims = Family::<ClaimLabels, Gauge>::default();
        let claim_quota = Family::<QuotaLabels, Gauge>::default();
        registry.register(
            "vmdhcpcontroller_address_claims",
            "AddressClaims by IPPool, namespace and phase (Reserved, Bound, Refused)",
            claims.clone(),
        );
        registry.register(
            "vmdhcpcontroller_address_claim_quota",
            "Addresses of a family one namespace may claim from an IPPool \
             (spec.claims.perNamespace), for the namespaces that claim there",
            claim_quota.clone(),
        );
        registry.register(
            "vmdhcpcontroller_network_suspects",
            "Hosts the serving agent reports acting where they should not on an IPPool's network, \
             by kind (foreign_dhcp_server, proxy_arp_responder)",
            network_suspects.clone(),
        );
        let reconciles = Family::<ReconcileLabels, Counter>::default();
        let durations = Family::<ControllerLabel, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.001, 2.0, 14))) as fn() -> Histogram,
        );
        registry.register(
            "vmdhcpcontroller_ippool_used",
            "Amount of IP addresses which are in use in an IPPool",
            ippool_used.clone(),
        );
        registry.register(
            "vmdhcpcontroller_ippool_available",
            "Amount of IP addresses which are available in an IPPool",
            ippool_available.clone(),
        );
        registry.register(
            "vmdhcpcontroller_vmnetcfg_status",
            "Information and status of the VirtualMachineNetworkConfig objects",
            vmnetcfg_status.clone(),
        );
        registry.register(
            "vmdhcpcontroller_reconciles",
            "Reconciles by controller and result (ok, error, not_leader)",
            reconciles.clone(),
        );
        let allocations = Family::<AllocationLabels, Counter>::default();
        registry.register(
            "vmdhcpcontroller_allocations",
            "Address allocations by pool and result (allocated, released, refused)",
            allocations.clone(),
        );
        let foreign = Family::<AllocationLabels, Counter>::default();
        registry.register(
            "vmdhcpcontroller_foreign_allocations",
            "Entries of an IPPool's recorded allocations written by another writer, by what the \
             leader's status write did with them (adopted, kept_ours, withdrew_ours: two MACs \
             were recorded for one address; verbatim: no address of the range)",
            foreign.clone(),
        );
        let events = Family::<ResultLabel, Counter>::default();
        registry.register(
            "vmdhcpcontroller_events",
            "Kubernetes events by result (published, dropped: the bounded queue was full, failed, \
             repeated: a Warning the object was told lately, not sent again)",
            events.clone(),
        );
        registry.register(
            "vmdhcpcontroller_build",
            "The running version",
            prometheus_client::metrics::info::Info::new(vec![(
                "version".to_owned(),
                env!("CARGO_PKG_VERSION").to_owned(),
            )]),
        );
        registry.register(
            "vmdhcpcontroller_reconcile_duration_seconds",
            "Reconcile duration by controller",
            durations.clone(),
        );
        let bootstrap_checks = Family::<ResultLabel, Counter>::default();
        registry.register(
            "vmdhcpcontroller_agent_bootstrap_checks",
            "Checks of the agent Deployment's bootstrap against the served pools, by result \
             (unchanged, written, missing, error)",
            bootstrap_checks.clone(),
        );
        let tokens = TokenCounts::default();
        registry.register(
            "vmdhcpcontroller_token_reviews",
            "TokenReviews sent to verify config stream callers, by result (allowed, rejected, \
             forbidden, failed)",
            tokens.reviews.clone(),
        );
        registry.register(
            "vmdhcpcontroller_token_checks_refused",
            "Config stream callers refused without a TokenReview, by reason (missing, malformed, \
             signature, audience, expired, forbidden, rate_limited)",
            tokens.refused.clone(),
        );
        registry.register(
            "vmdhcpcontroller_token_issuer_keys",
            "The cluster's ServiceAccount signing keys config stream tokens are checked against \
             (0: none readable, every new token costs a TokenReview)",
            tokens.issuer_keys.clone(),
        );
        let stream_clients = Gauge::default();
        registry.register(
            "vmdhcpcontroller_stream_clients",
            "Agents with a config stream open to this replica",
            stream_clients.clone(),
        );
        let index_revision = Gauge::default();
        registry.register(
            "vmdhcpcontroller_index_revision",
            "Latest revision of the index the config stream serves",
            index_revision.clone(),
        );
        let index_pools_examined = Counter::default();
        registry.register(
            "vmdhcpcontroller_index_pools_examined",
            "IPPools the index sync looked at: one per pool change, every pool after a relist or \
             when the set of served pools changes",
            index_pools_examined.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "vmdhcpcontroller_leader",
            "1 while this replica leads (reconciles and writes), else 0",
            leader.clone(),
        );
        let leader_transitions = Arc::new(AtomicI64::new(-1));
        registry.register_collector(Box::new(LeaseTransitions(leader_transitions.clone())));
        let certificate_expiry = Family::<CertificateLabel, Gauge>::default();
        registry.register(
            "vmdhcpcontroller_certificate_expiry_timestamp_seconds",
            "When the certificate this replica serves (serving) and the newest CA of its trusted \
             bundle (ca) expire, in seconds since the epoch",
            certificate_expiry.clone(),
        );
        let webhook_requests = Family::<WebhookLabels, Counter>::default();
        registry.register(
            "vmdhcpcontroller_webhook_requests",
            "Admission requests answered, by webhook (mutate, validate), kind and result \
             (allowed, denied, error: the webhook could not judge the request and refused it)",
            webhook_requests.clone(),
        );
        Metrics {
            registry,
            leader_transitions,
            certificate_expiry,
            webhook_requests,
            bootstrap_checks,
            allocations,
            foreign,
            events,
            tokens,
            stream_clients,
            index_revision,
            index_pools_examined,
            leader,
            ippool_used,
            ippool_available,
            vmnetcfg_status,
            network_suspects,
            reconciles,
            durations,
            pool_series: Mutex::default(),
            vmnetcfg_series: Mutex::default(),
            suspect_series: Mutex::default(),
            claims,
            claim_quota,
            claim_series: Mutex::default(),
        }
    }
}

impl Metrics {
    /// Sets a pool's gauges, replacing its previous series if its labels changed.
    pub fn set_pool(&self, labels: PoolLabels, used: u64, available: u64) {
        let mut series = self.pool_series.lock();
        if let Some(old) = series.insert(labels.ippool.clone(), labels.clone())
            && old != labels
        {
            self.ippool_used.remove(&old);
            self.ippool_available.remove(&old);
        }
        self.set_counts(&labels, used, available);
    }

    fn set_counts(&self, labels: &PoolLabels, used: u64, available: u64) {
        self.ippool_used
            .get_or_create(labels)
            .set(i64::try_from(used).unwrap_or(i64::MAX));
        self.ippool_available
            .get_or_create(labels)
            .set(i64::try_from(available).unwrap_or(i64::MAX));
    }

    /// Updates the gauges of a pool the reconcile has labelled ([`Metrics::set_pool`]); nothing
    /// for one it has not (paused, refused, or not reconciled yet). The status writer calls this
    /// with each write's counts, so the gauges follow allocations without waking the reconcile.
    pub fn set_pool_counts(&self, ippool: &str, used: u64, available: u64) {
        let series = self.pool_series.lock();
        if let Some(labels) = series.get(ippool) {
            self.set_counts(labels, used, available);
        }
    }

    /// Removes a pool's gauges (pause, deletion).
    pub fn remove_pool(&self, ippool: &str) {
        if let Some(old) = self.pool_series.lock().remove(ippool) {
            self.ippool_used.remove(&old);
            self.ippool_available.remove(&old);
        }
        self.suspect_series.lock().retain(|labels| {
            let keep = labels.ippool != ippool;
            if !keep {
                self.network_suspects.remove(labels);
            }
            keep
        });
    }

    /// Sets how many hosts of `kind` the serving agent reports acting where they should not on
    /// `ippool`'s network (removed with the pool's other series).
    pub fn set_network_suspects(&self, ippool: &str, kind: &str, n: usize) {
        let labels = SuspectLabels {
            ippool: ippool.into(),
            kind: kind.into(),
        };
        self.network_suspects
            .get_or_create(&labels)
            .set(i64::try_from(n).unwrap_or(i64::MAX));
        self.suspect_series.lock().insert(labels);
    }

    /// Makes a config's status series exactly `series` (kept as a sorted slice: a config has one
    /// series per NIC, and a set per config would cost a tree node, over a kilobyte, each).
    pub fn set_vmnetcfg(&self, vmnetcfg: &str, mut series: Vec<VmnetcfgLabels>) {
        series.sort();
        series.dedup();
        let mut all = self.vmnetcfg_series.lock();
        for old in all.get(vmnetcfg).map_or(&[][..], |b| &b[..]) {
            if !series.contains(old) {
                self.vmnetcfg_status.remove(old);
            }
        }
        for s in &series {
            self.vmnetcfg_status.get_or_create(s).set(1);
        }
        all.insert(vmnetcfg.to_owned(), series.into_boxed_slice());
    }

    /// Removes every series of a config (deletion).
    pub fn remove_vmnetcfg(&self, vmnetcfg: &str) {
        self.set_vmnetcfg(vmnetcfg, Vec::new());
        self.vmnetcfg_series.lock().remove(vmnetcfg);
    }

    /// Counts claim `claim` (`namespace/name`) under its pool, namespace and phase (moving it
    /// from where it was counted before), and shows the pool's quota for its namespace.
    pub fn set_claim(
        &self,
        claim: &NamespacedName,
        ippool: Option<&NamespacedName>,
        phase: &str,
        quota: ClaimQuota,
    ) {
        let ippool = ippool.map(ToString::to_string).unwrap_or_default();
        let labels = ClaimLabels {
            ippool: ippool.clone(),
            claim_namespace: claim.namespace.clone(),
            phase: phase.to_owned(),
        };
        let mut series = self.claim_series.lock();
        if let Some(old) = series.insert(claim.to_string(), labels.clone()) {
            self.claims.get_or_create(&old).dec();
        }
        self.claims.get_or_create(&labels).inc();
        if ippool.is_empty() {
            return;
        }
        for (family, q) in [("ipv4", quota.ipv4), ("ipv6", quota.ipv6)] {
            let labels = QuotaLabels {
                ippool: ippool.clone(),
                claim_namespace: claim.namespace.clone(),
                family: family.to_owned(),
            };
            match q {
                Some(q) => {
                    self.claim_quota.get_or_create(&labels).set(i64::from(q));
                }
                None => {
                    self.claim_quota.remove(&labels);
                }
            }
        }
    }

    /// Stops counting claim `claim` (deleted).
    pub fn forget_claim(&self, claim: &NamespacedName) {
        if let Some(old) = self.claim_series.lock().remove(&claim.to_string()) {
            self.claims.get_or_create(&old).dec();
        }
    }

    /// Removes every per-object series (pools and configs): called when a leadership term ends,
    /// so that only the leader exports them and sums across replicas do not double-count.
    pub fn clear_objects(&self) {
        let pools = std::mem::take(&mut *self.pool_series.lock());
        for labels in pools.values() {
            self.ippool_used.remove(labels);
            self.ippool_available.remove(labels);
        }
        let configs = std::mem::take(&mut *self.vmnetcfg_series.lock());
        for labels in configs.values().flatten() {
            self.vmnetcfg_status.remove(labels);
        }
        self.claim_series.lock().clear();
        self.claims.clear();
        self.claim_quota.clear();
        let suspects = std::mem::take(&mut *self.suspect_series.lock());
        for labels in &suspects {
            self.network_suspects.remove(labels);
        }
    }

    /// Counts `n` IPPools the index sync looked at.
    pub fn index_pools_examined(&self, n: u64) {
        self.index_pools_examined.inc_by(n);
    }

    /// Counts one reconcile, by `result` (`ok`, `error`, `not_leader`: leadership was lost
    /// under it), and its duration.
    pub fn reconciled(&self, controller: &str, result: &str, took: Duration) {
        self.reconciles
            .get_or_create(&ReconcileLabels {
                controller: controller.into(),
                result: result.into(),
            })
            .inc();
        self.durations
            .get_or_create(&ControllerLabel {
                controller: controller.into(),
            })
            .observe(took.as_secs_f64());
    }

    /// Counts one allocation outcome on `ippool`: `allocated` (a NIC got a new address),
    /// `released` (an address went back to the pool) or `refused`.
    pub fn allocation(&self, ippool: &str, result: &str) {
        self.allocations
            .get_or_create(&AllocationLabels {
                ippool: ippool.into(),
                result: result.into(),
            })
            .inc();
    }

    /// Counts one entry of another writer that a status write of `ippool` kept, by `outcome`
    /// ([`crate::ipam::Foreign::outcome`]).
    pub fn foreign_entry(&self, ippool: &str, outcome: &str) {
        self.foreign
            .get_or_create(&AllocationLabels {
                ippool: ippool.into(),
                result: outcome.into(),
            })
            .inc();
    }

    /// The counters the event queue and its publisher count into (one series per result).
    pub fn event_counts(&self) -> EventCounts {
        let counter = |result: &str| {
            self.events
                .get_or_create(&ResultLabel {
                    result: result.into(),
                })
                .clone()
        };
        EventCounts {
            published: counter("published"),
            dropped: counter("dropped"),
            failed: counter("failed"),
            repeated: counter("repeated"),
        }
    }

    /// The counters the config stream's token checks count into.
    pub fn token_counts(&self) -> TokenCounts {
        self.tokens.clone()
    }

    /// Counts one check of the agent Deployment's bootstrap: `unchanged` (nothing written),
    /// `written`, `missing` (no such Deployment) or `error`.
    pub fn bootstrap_checked(&self, result: &str) {
        self.bootstrap_checks
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
    }

    /// Sets the gauges read from live state at scrape time.
    pub fn set_live(&self, stream_clients: usize, index_revision: u64, leader: bool) {
        self.stream_clients
            .set(i64::try_from(stream_clients).unwrap_or(i64::MAX));
        self.index_revision
            .set(i64::try_from(index_revision).unwrap_or(i64::MAX));
        self.leader.set(i64::from(leader));
    }

    /// Records the leader Lease's `leaseTransitions` as last seen (exported from then on).
    pub fn set_leader_transitions(&self, transitions: i32) {
        self.leader_transitions
            .store(i64::from(transitions.max(0)), Ordering::Relaxed);
    }

    /// Records when `certificate` (`serving` or `ca`) expires, in seconds since the epoch.
    pub fn set_certificate_expiry(&self, certificate: &str, not_after_unix: i64) {
        self.certificate_expiry
            .get_or_create(&CertificateLabel {
                certificate: certificate.into(),
            })
            .set(not_after_unix);
    }

    /// Counts one admission request answered by `webhook` (`mutate`, `validate`) for `kind`, by
    /// `result`: `allowed`, `denied` (a rule refused it) or `error` (it could not be judged).
    pub fn webhook_request(&self, webhook: &str, kind: &str, result: &str) {
        self.webhook_requests
            .get_or_create(&WebhookLabels {
                webhook: webhook.into(),
                kind: kind.into(),
                result: result.into(),
            })
            .inc();
    }

    /// The exposition text for `/metrics`.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leader_transitions_certificates_and_webhook_answers_are_exported() {
        let m = Metrics::default();
        let text = m.encode();
        assert!(
            !text.contains("vmdhcpcontroller_leader_transitions"),
            "absent until the Lease was seen: {text}"
        );
        m.set_leader_transitions(3);
        m.set_certificate_expiry("serving", 1_900_000_000);
        m.webhook_request("validate", "IPPool", "denied");
        m.webhook_request("validate", "IPPool", "error");
        m.webhook_request("validate", "IPPool", "error");
        let text = m.encode();
        assert!(
            text.contains("vmdhcpcontroller_leader_transitions 3\n"),
            "{text}"
        );
        assert!(
            text.contains(r#"vmdhcpcontroller_certificate_expiry_timestamp_seconds{certificate="serving"} 1900000000"#),
            "{text}"
        );
        assert!(
            text.contains(r#"vmdhcpcontroller_webhook_requests_total{webhook="validate",kind="IPPool",result="error"} 2"#)
                && text.contains(r#"vmdhcpcontroller_webhook_requests_total{webhook="validate",kind="IPPool",result="denied"} 1"#),
            "{text}"
        );
    }

    #[test]
    fn series_are_removed_with_their_object() {
        let m = Metrics::default();
        let labels = PoolLabels {
            ippool: "default/net-48".into(),
            cidr: "192.168.48.0/24".into(),
            network: "default/net-48".into(),
        };
        m.set_pool_counts("default/net-48", 1, 7);
        assert!(
            !m.encode().contains("default/net-48"),
            "no labels yet: no series"
        );
        m.set_pool(labels.clone(), 2, 6);
        let text = m.encode();
        assert!(text.contains(r#"vmdhcpcontroller_ippool_used{ippool="default/net-48",cidr="192.168.48.0/24",network="default/net-48"} 2"#), "{text}");
        m.set_pool_counts("default/net-48", 3, 5);
        let text = m.encode();
        assert!(text.contains(r#"vmdhcpcontroller_ippool_available{ippool="default/net-48",cidr="192.168.48.0/24",network="default/net-48"} 5"#), "{text}");
        m.set_network_suspects("default/net-48", "foreign_dhcp_server", 2);
        m.set_network_suspects("default/net-48", "proxy_arp_responder", 0);
        let text = m.encode();
        assert!(text.contains(r#"vmdhcpcontroller_network_suspects{ippool="default/net-48",kind="foreign_dhcp_server"} 2"#), "{text}");
        m.remove_pool("default/net-48");
        assert!(!m.encode().contains("default/net-48"));
        m.set_network_suspects("default/other", "foreign_dhcp_server", 1);
        m.clear_objects();
        assert!(
            !m.encode().contains("default/other"),
            "a term's end drops them"
        );

        let s = |state: &str| VmnetcfgLabels {
            vmnetcfg: "default/vm".into(),
            network: "default/net-48".into(),
            mac: "aa:bb:cc:dd:ee:ff".into(),
            ip: "192.168.48.86".into(),
            state: state.into(),
        };
        m.set_vmnetcfg("default/vm", vec![s("Allocated")]);
        m.set_vmnetcfg("default/vm", vec![s("Pending")]);
        let text = m.encode();
        assert!(
            text.contains(r#"state="Pending""#) && !text.contains(r#"state="Allocated""#),
            "{text}"
        );
        m.remove_vmnetcfg("default/vm");
        assert!(!m.encode().contains("default/vm"));
        m.reconciled("ippool", "ok", Duration::from_millis(3));
        assert!(
            m.encode().contains(
                r#"vmdhcpcontroller_reconciles_total{controller="ippool",result="ok"} 1"#
            )
        );
        m.allocation("default/net-48", "allocated");
        m.allocation("default/net-48", "allocated");
        let text = m.encode();
        assert!(
            text.contains(
                r#"vmdhcpcontroller_allocations_total{ippool="default/net-48",result="allocated"} 2"#
            ),
            "{text}"
        );
        // Each term's queue counts into the same series.
        let (first, second) = (m.event_counts(), m.event_counts());
        first.dropped.inc();
        second.dropped.inc();
        second.published.inc();
        let text = m.encode();
        assert!(
            text.contains(r#"vmdhcpcontroller_events_total{result="dropped"} 2"#)
                && text.contains(r#"vmdhcpcontroller_events_total{result="published"} 1"#)
                && text.contains(r#"vmdhcpcontroller_events_total{result="failed"} 0"#),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                r#"vmdhcpcontroller_build_info{{version="{}"}} 1"#,
                env!("CARGO_PKG_VERSION")
            )),
            "{text}"
        );
    }

    #[test]
    fn token_checks_count_reviews_and_refusals_apart() {
        let m = Metrics::default();
        let counts = m.token_counts();
        counts.reviewed("rejected");
        m.token_counts().reviewed("rejected");
        counts.refused("rate_limited");
        let text = m.encode();
        assert!(
            text.contains(r#"vmdhcpcontroller_token_reviews_total{result="rejected"} 2"#)
                && text.contains(
                    r#"vmdhcpcontroller_token_checks_refused_total{reason="rate_limited"} 1"#
                ),
            "{text}"
        );
    }

    #[test]
    fn a_term_end_clears_every_per_object_series_and_keeps_the_counters() {
        let m = Metrics::default();
        let pool = PoolLabels {
            ippool: "default/net-48".into(),
            cidr: "192.168.48.0/24".into(),
            network: "default/net-48".into(),
        };
        m.set_pool(pool.clone(), 2, 6);
        let cfg = VmnetcfgLabels {
            vmnetcfg: "default/vm".into(),
            network: "default/net-48".into(),
            mac: "aa:bb:cc:dd:ee:ff".into(),
            ip: "192.168.48.86".into(),
            state: "Allocated".into(),
        };
        m.set_vmnetcfg("default/vm", vec![cfg]);
        m.allocation("default/net-48", "allocated");
        m.clear_objects();
        let text = m.encode();
        assert!(!text.contains("vmdhcpcontroller_ippool_used{"), "{text}");
        assert!(
            !text.contains("vmdhcpcontroller_ippool_available{"),
            "{text}"
        );
        assert!(
            !text.contains("vmdhcpcontroller_vmnetcfg_status{"),
            "{text}"
        );
        assert!(
            text.contains("vmdhcpcontroller_allocations_total{"),
            "{text}"
        );
        // The next term exports them again from scratch.
        m.set_pool(pool, 3, 5);
        assert!(m.encode().contains("vmdhcpcontroller_ippool_used{"));
    }
}
