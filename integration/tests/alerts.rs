//! The chart's alert rules and Grafana dashboard against a real Prometheus (Debian's
//! `prometheus`) scraping the `fleet` system: two electing controller replicas and two agents as
//! processes ([`vmdhcp_integration::fleet`]). The rules are the chart's own, rendered by
//! `helm template` with [`TEST_VALUES`]: every for-duration 0s, the leader-flapping window 20 s
//! with no transition allowed, rate windows 30 s (thresholds otherwise the defaults), so each
//! condition shows within seconds. Prometheus scrapes and evaluates every second.
//!
//! The test makes each condition happen and reads the alerts through Prometheus's own API:
//! a healthy fleet fires nothing; the leading agent killed fires `VmdhcpAgentNoLeader` and
//! `VmdhcpPoolNotServed` until the standby takes over, and `VmdhcpAgentLeaderFlapping` for the
//! window after; a host squatting on a VM's address fires `VmdhcpAddressConflict` until it
//! leaves; a pool filled fires `VmdhcpPoolNearlyExhausted`, then `VmdhcpPoolExhausted` and
//! `VmdhcpAllocationPending` for the VM that cannot get an address, all clearing once VMs are
//! deleted; a namespace's claim at its quota fires `VmdhcpClaimQuotaReached`, one past it
//! `VmdhcpClaimRefused`, both clearing with the claims. Then every dashboard query, evaluated
//! over the run, must return data.
//!
//! `VMDHCP_DASHBOARD_DATA=FILE` writes every panel's query results (and the run's events) to
//! FILE, from which `scripts/dashboard-picture.py` draws `docs/dashboard.png`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use vmdhcp_integration::dhcp_client::{start_dhclient, wait_event, wait_for};
use vmdhcp_integration::fleet::{NS, Options, VM1_MAC, setup_with, vm_manifest};
use vmdhcp_integration::prometheus::{NetnsRelay, Prometheus, Target, render_rules};

/// The values the rules are rendered with: the chart's thresholds, conditions shown at once.
const TEST_VALUES: &str = r#"
prometheusRule:
  enabled: true
  thresholds:
    rateWindow: 30s
    leaderTransitions: 0
    leaderTransitionsWindow: 20s
  for:
    VmdhcpControllerNoLeader: 0s
    VmdhcpAgentNoLeader: 0s
    VmdhcpControllerLeaderFlapping: 0s
    VmdhcpAgentLeaderFlapping: 0s
    VmdhcpPoolNotServed: 0s
    VmdhcpPoolNearlyExhausted: 0s
    VmdhcpPoolExhausted: 0s
    VmdhcpAllocationPending: 0s
    VmdhcpClaimQuotaReached: 0s
    VmdhcpClaimRefused: 0s
    VmdhcpAddressConflict: 0s
    VmdhcpProxyARPResponder: 0s
    VmdhcpForeignDHCPServer: 0s
    VmdhcpAgentStreamDown: 0s
    VmdhcpDHCPSendErrors: 0s
    VmdhcpDHCPDropsHigh: 0s
    VmdhcpCertificateExpiringSoon: 0s
    VmdhcpCertificateExpiryImminent: 0s
    VmdhcpWebhookErrors: 0s
"#;

/// The namespace the rules are rendered for (`render_rules`), which a ServiceMonitor's scrape
/// gives every series as its `namespace` label: the alerts keep it for Alertmanager's routes.
const RELEASE_NAMESPACE: &str = "vmdhcp-system";

/// What `$__rate_interval` stands for when the test evaluates a dashboard query (Grafana sets
/// it to at least four scrape intervals).
const RATE_INTERVAL: &str = "30s";

/// Series only a controller with TLS exports (the fleet's stream is plaintext, no webhook):
/// their alerts are covered by promtool's unit tests and the controller's metrics tests.
const TLS_ONLY: [&str; 2] = [
    "vmdhcpcontroller_certificate_expiry_timestamp_seconds",
    "vmdhcpcontroller_webhook_requests_total",
];

const POOL: &str = "fleet/pool-a";

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Polls Prometheus until every alert of `expected` has been seen firing (not necessarily at
/// once: one may clear before the next fires); returns each one's first firing instance.
fn until_fired(
    prometheus: &Prometheus,
    expected: &[&str],
    limit: Duration,
) -> BTreeMap<String, vmdhcp_integration::prometheus::Alert> {
    let deadline = Instant::now() + limit;
    let mut seen = BTreeMap::new();
    loop {
        for alert in prometheus.alerts() {
            if alert.state == "firing" && expected.contains(&alert.name.as_str()) {
                seen.entry(alert.name.clone()).or_insert(alert);
            }
        }
        if expected.iter().all(|e| seen.contains_key(*e)) {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "within {limit:?}, {expected:?} did not all fire; seen {:?}, firing now {:?}",
            seen.keys().collect::<Vec<_>>(),
            prometheus.firing()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Polls until none of `alerts` is pending or firing.
fn until_clear(prometheus: &Prometheus, alerts: &[&str], limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let active: Vec<String> = prometheus
            .alerts()
            .into_iter()
            .filter(|a| alerts.contains(&a.name.as_str()))
            .map(|a| format!("{} ({})", a.name, a.state))
            .collect();
        if active.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "within {limit:?}, still active: {active:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The first sample's value of an instant query, if any.
fn value(prometheus: &Prometheus, promql: &str) -> Option<f64> {
    prometheus.query(promql)[0]["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
}

/// `count` VirtualMachines labelled as this test's fillers, MACs from `first` on.
fn fillers(first: u32, count: u32) -> Value {
    let items: Vec<Value> = (first..first + count)
        .map(|i| {
            let mac = format!("02:12:34:01:{:02x}:{:02x}", i >> 8, i & 0xff);
            let mut vm = vm_manifest(NS, &format!("filler-{i}"), &mac, &format!("{NS}/net-a"));
            vm["metadata"]["labels"] = json!({"alerts-test": "filler"});
            vm
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "List", "items": items})
}

#[test]
fn each_alert_fires_on_its_condition_and_clears_and_every_dashboard_query_has_data() {
    let start = now();
    let mut events: Vec<(String, f64)> = Vec::new();
    let mut fleet = setup_with(Options {
        controller_replicas: 2,
        ..Options::default()
    });
    let ns0 = fleet.agent_netns(0);
    let ns1 = fleet.agent_netns(1);
    let a0 = fleet.start_agent(&ns0, "agent-0");
    let a1 = fleet.start_agent(&ns1, "agent-1");
    let r0 = NetnsRelay::start(&ns0, 8080, &fleet.dir.path().join("relay-metrics-a0.log"));
    let r1 = NetnsRelay::start(&ns1, 8080, &fleet.dir.path().join("relay-metrics-a1.log"));
    let mut targets: Vec<Target> = fleet
        .replicas
        .iter()
        .map(|r| Target {
            job: "vmdhcp-controller".into(),
            address: format!("127.0.0.1:{}", r.http),
            labels: BTreeMap::from([
                ("pod".into(), r.identity.clone()),
                ("namespace".into(), RELEASE_NAMESPACE.into()),
            ]),
        })
        .collect();
    for (relay, agent) in [(&r0, &a0), (&r1, &a1)] {
        targets.push(Target {
            job: "vmdhcp-agent".into(),
            address: format!("127.0.0.1:{}", relay.port),
            labels: BTreeMap::from([
                ("pod".into(), agent.identity.clone()),
                ("namespace".into(), RELEASE_NAMESPACE.into()),
            ]),
        });
    }
    let values = fleet.dir.path().join("alerts-values.yaml");
    fs::write(&values, TEST_VALUES).unwrap();
    let rules = render_rules(&values);
    let prometheus = Prometheus::start(&targets, &rules);

    // A healthy fleet: every target up, every rule evaluates without error, nothing fires.
    let leader = fleet.leader(&[&a0, &a1]).identity.clone();
    wait_for("every target up", Duration::from_secs(60), || {
        let (up, n) = prometheus.targets_up();
        (up && n == 4).then_some(())
    });
    let health = wait_for("every rule evaluated", Duration::from_secs(30), || {
        let health = prometheus.rule_health();
        (health.len() == 19 && health.values().all(|(h, _)| h != "unknown")).then_some(health)
    });
    let broken: Vec<_> = health.iter().filter(|(_, (h, _))| h != "ok").collect();
    assert!(broken.is_empty(), "rules failing to evaluate: {broken:?}");
    wait_for(
        "a healthy fleet firing nothing",
        Duration::from_secs(60),
        || prometheus.firing().is_empty().then_some(()),
    );
    events.push(("healthy".into(), now()));
    eprintln!("healthy fleet: 4 targets up, 17 rules, no alert firing");

    // The leading agent killed: no leader and the pool unserved until the standby takes over;
    // then one leadership change within the flapping window.
    let (killed, survivor) = if leader == a0.identity {
        (&a0, &a1)
    } else {
        (&a1, &a0)
    };
    events.push((format!("kill -9 {}", killed.identity), now()));
    let killed_at = Instant::now();
    assert!(killed.process.signal("KILL"));
    let fired = until_fired(
        &prometheus,
        &[
            "VmdhcpAgentNoLeader",
            "VmdhcpPoolNotServed",
            "VmdhcpAgentLeaderFlapping",
        ],
        Duration::from_secs(60),
    );
    let not_served = &fired["VmdhcpPoolNotServed"];
    assert_eq!(
        not_served.labels.get("ippool").map(String::as_str),
        Some(POOL)
    );
    assert_eq!(
        not_served.labels.get("severity").map(String::as_str),
        Some("critical")
    );
    assert!(
        not_served.annotations["description"].contains(POOL)
            && not_served.annotations["runbook_url"].ends_with("#vmdhcppoolnotserved"),
        "{not_served:?}"
    );
    fleet.leader(&[survivor]);
    until_clear(
        &prometheus,
        &["VmdhcpAgentNoLeader", "VmdhcpPoolNotServed"],
        Duration::from_secs(30),
    );
    eprintln!(
        "leading agent killed: VmdhcpAgentNoLeader and VmdhcpPoolNotServed fired and cleared, \
         {:.1} s after the kill",
        killed_at.elapsed().as_secs_f64()
    );
    until_clear(
        &prometheus,
        &["VmdhcpAgentLeaderFlapping"],
        Duration::from_secs(60),
    );
    events.push(("standby took over".into(), now()));
    eprintln!("VmdhcpAgentLeaderFlapping fired and cleared once the window passed");

    // A host squatting on vm1's address when vm1 boots: the conflict is recorded and alerted
    // on until the host leaves.
    let ip1 = fleet.allocated()[VM1_MAC].clone();
    let squatter = fleet.vm("squat", "02:12:34:00:00:99");
    fleet
        .lab
        .exec(
            &squatter,
            "ip",
            &["addr", "add", &format!("{ip1}/24"), "dev", "eth0"],
        )
        .unwrap();
    fleet
        .lab
        .exec(&squatter, "ip", &["link", "set", "eth0", "up"])
        .unwrap();
    let vm1 = fleet.vm("vm1", VM1_MAC);
    let dir1 = fleet.dir.path().join("vm1");
    fs::create_dir_all(&dir1).unwrap();
    events.push(("squatter on vm1's address".into(), now()));
    start_dhclient(&mut fleet.lab, &vm1, &dir1);
    let bound = wait_event(&dir1, "BOUND", 0, Duration::from_secs(90));
    assert_ne!(
        bound["new_ip_address"], ip1,
        "the squatted address is not offered"
    );
    let fired = until_fired(
        &prometheus,
        &["VmdhcpAddressConflict"],
        Duration::from_secs(60),
    );
    let conflict = &fired["VmdhcpAddressConflict"];
    assert_eq!(conflict.labels.get("pool").map(String::as_str), Some(POOL));
    assert!(
        conflict.annotations["description"].contains(POOL),
        "{conflict:?}"
    );
    fleet
        .lab
        .exec(
            &squatter,
            "ip",
            &["addr", "del", &format!("{ip1}/24"), "dev", "eth0"],
        )
        .unwrap();
    let left = Instant::now();
    events.push(("squatter gone".into(), now()));
    until_clear(
        &prometheus,
        &["VmdhcpAddressConflict"],
        Duration::from_secs(150),
    );
    eprintln!(
        "VmdhcpAddressConflict fired for {ip1} and cleared {:.1} s after the squatter left",
        left.elapsed().as_secs_f64()
    );

    // The pool filled: first nearly (at most 4 addresses left of 50: under 10 %), then
    // completely, with one VM more than fits; deleting the fillers clears everything. Fillers
    // are added until the leader's gauges, once every filler so far is allocated, show it.
    let free_q = format!(r#"max(vmdhcpcontroller_ippool_available{{ippool="{POOL}"}})"#);
    let fillers_q =
        r#"count(vmdhcpcontroller_vmnetcfg_status{vmnetcfg=~"fleet/filler-.+",state="Allocated"})"#;
    let mut added = 0;
    let free = loop {
        let free = wait_for("every filler allocated", Duration::from_secs(120), || {
            let allocated = value(&prometheus, fillers_q).unwrap_or(0.0) as u32;
            let free = value(&prometheus, &free_q)? as u32;
            (allocated == added).then_some(free)
        });
        if (1..=4).contains(&free) {
            break free;
        }
        assert!(free > 4, "pool-a filled past the point: {free} free");
        fleet.apply(&fillers(added, free - 3));
        added += free - 3;
    };
    events.push((format!("{added} VMs added: {free} addresses free"), now()));
    let fired = until_fired(
        &prometheus,
        &["VmdhcpPoolNearlyExhausted"],
        Duration::from_secs(30),
    );
    let nearly = &fired["VmdhcpPoolNearlyExhausted"];
    assert_eq!(nearly.labels.get("ippool").map(String::as_str), Some(POOL));
    assert_eq!(
        nearly.labels.get("network").map(String::as_str),
        Some("fleet/net-a")
    );
    fleet.apply(&fillers(added, free + 1));
    events.push((format!("{} VMs more: one cannot fit", free + 1), now()));
    let fired = until_fired(
        &prometheus,
        &["VmdhcpPoolExhausted", "VmdhcpAllocationPending"],
        Duration::from_secs(120),
    );
    let pending = &fired["VmdhcpAllocationPending"];
    assert!(
        pending
            .labels
            .get("vmnetcfg")
            .is_some_and(|c| c.starts_with("fleet/filler-")),
        "{pending:?}"
    );
    assert!(
        pending.annotations["description"].contains(&pending.labels["mac"]),
        "{pending:?}"
    );
    until_clear(
        &prometheus,
        &["VmdhcpPoolNearlyExhausted"],
        Duration::from_secs(30),
    );
    eprintln!(
        "pool filled: VmdhcpPoolNearlyExhausted, then VmdhcpPoolExhausted and \
         VmdhcpAllocationPending ({}) fired",
        pending.labels["vmnetcfg"]
    );
    let out = fleet
        .cp
        .kubectl()
        .args([
            "-n",
            NS,
            "delete",
            "virtualmachines.kubevirt.io",
            "-l",
            "alerts-test=filler",
            "--wait=false",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    events.push(("fillers deleted".into(), now()));
    until_clear(
        &prometheus,
        &[
            "VmdhcpPoolExhausted",
            "VmdhcpAllocationPending",
            "VmdhcpPoolNearlyExhausted",
        ],
        Duration::from_secs(120),
    );
    eprintln!("fillers deleted: the pool alerts cleared");

    // Address claims: the pool admits the namespace, one IPv4 address each. The first claim
    // holds it (the namespace at its quota), the second is refused; each alert clears with the
    // claim that raised it.
    let rule = json!({"spec": {"claims": {"namespaces": [NS], "perNamespace": {"ipv4": 1}}}});
    let out = fleet
        .cp
        .kubectl()
        .args([
            "-n", NS, "patch", "ippool", "pool-a", "--type", "merge", "-p",
        ])
        .arg(rule.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let claim = |name: &str| {
        json!({"apiVersion": "ipam.vmdhcp.io/v1alpha1", "kind": "AddressClaim",
               "metadata": {"name": name, "namespace": NS},
               "spec": {"network": format!("{NS}/net-a")}})
    };
    fleet.apply(&claim("vip-1"));
    events.push(("a claim: the namespace at its quota".into(), now()));
    let fired = until_fired(
        &prometheus,
        &["VmdhcpClaimQuotaReached"],
        Duration::from_secs(60),
    );
    let quota = &fired["VmdhcpClaimQuotaReached"];
    assert_eq!(quota.labels.get("ippool").map(String::as_str), Some(POOL));
    assert_eq!(
        quota.labels.get("claim_namespace").map(String::as_str),
        Some(NS)
    );
    fleet.apply(&claim("vip-2"));
    events.push(("a claim past the quota".into(), now()));
    let fired = until_fired(
        &prometheus,
        &["VmdhcpClaimRefused"],
        Duration::from_secs(60),
    );
    let refused = &fired["VmdhcpClaimRefused"];
    assert_eq!(
        refused.labels.get("claim_namespace").map(String::as_str),
        Some(NS)
    );
    for name in ["vip-2", "vip-1"] {
        let out = fleet
            .cp
            .kubectl()
            .args(["-n", NS, "delete", "addressclaims.ipam.vmdhcp.io", name])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    events.push(("claims deleted".into(), now()));
    until_clear(
        &prometheus,
        &["VmdhcpClaimRefused", "VmdhcpClaimQuotaReached"],
        Duration::from_secs(60),
    );
    eprintln!("claims: VmdhcpClaimQuotaReached and VmdhcpClaimRefused fired and cleared");

    // Nothing fires any more, and every rule still evaluates.
    wait_for("nothing firing at the end", Duration::from_secs(60), || {
        prometheus.firing().is_empty().then_some(())
    });
    let broken: Vec<_> = prometheus
        .rule_health()
        .into_iter()
        .filter(|(_, (h, _))| h != "ok")
        .collect();
    assert!(broken.is_empty(), "rules failing to evaluate: {broken:?}");

    // Every series the rules read exists in this Prometheus (but what only TLS exports).
    let names: BTreeSet<String> = prometheus_names(&prometheus);
    let missing: Vec<String> = rule_series(&rules)
        .into_iter()
        .filter(|m| !names.contains(m) && !TLS_ONLY.contains(&m.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "the rules read series nobody exports: {missing:?}"
    );

    // Every dashboard query has data over the run.
    let end = now();
    let dashboard: Value = serde_json::from_str(
        &fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../chart/files/dashboard.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let mut panels = Vec::new();
    let mut empty = Vec::new();
    let mut queries = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        let Some(targets) = panel["targets"].as_array() else {
            continue;
        };
        let mut results = Vec::new();
        for target in targets {
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", RATE_INTERVAL);
            let result = prometheus.query_range(&expr, start, end, 2.0);
            queries += 1;
            let points: usize = result
                .as_array()
                .map(|series| {
                    series
                        .iter()
                        .map(|s| s["values"].as_array().map_or(0, Vec::len))
                        .sum()
                })
                .unwrap_or(0);
            if points == 0 {
                empty.push(format!("{}: {expr}", panel["title"]));
            }
            results.push(json!({"expr": expr, "legend": target["legendFormat"], "result": result}));
        }
        panels.push(json!({
            "title": panel["title"], "unit": panel["fieldConfig"]["defaults"]["unit"],
            "targets": results,
        }));
    }
    assert!(
        empty.is_empty(),
        "dashboard queries without data: {empty:#?}"
    );
    eprintln!(
        "{queries} dashboard queries in {} panels all returned data",
        panels.len()
    );
    if let Some(path) = std::env::var_os("VMDHCP_DASHBOARD_DATA") {
        let data = json!({"start": start, "end": end, "events": events, "panels": panels});
        fs::write(&path, serde_json::to_string(&data).unwrap()).unwrap();
        eprintln!("dashboard data written to {}", path.to_string_lossy());
    }
}

/// Every metric name Prometheus holds.
fn prometheus_names(prometheus: &Prometheus) -> BTreeSet<String> {
    let names = prometheus.query(r#"count by (__name__) ({__name__=~"vmdhcp.+"})"#);
    names
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["metric"]["__name__"].as_str().map(str::to_owned))
        .collect()
}

/// The series names the rules' expressions read.
fn rule_series(rules: &str) -> BTreeSet<String> {
    let rules: serde_yaml_ng::Value = serde_yaml_ng::from_str(rules).unwrap();
    let words: BTreeSet<String> = rules["groups"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_sequence().unwrap().iter())
        .filter_map(|r| r["expr"].as_str())
        .flat_map(|expr| {
            // Label values in quotes (the release's namespace) name no series.
            let outside_quotes: String = expr.split('"').step_by(2).collect::<Vec<_>>().join(" ");
            outside_quotes
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("vmdhcp"))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(words.len() > 10, "no series in the rules: {rules:?}");
    words
}
