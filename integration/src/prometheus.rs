//! A real Prometheus (Debian's `prometheus`) as a process, for the tests of the chart's alert
//! rules and dashboard: it scrapes the components a test started, evaluates the rules the chart
//! renders, and is read back through its own HTTP API (`/api/v1/alerts`, `/api/v1/query`,
//! `/api/v1/query_range`), as Alertmanager and Grafana read it.
//!
//! The rules come from the chart itself: [`render_rules`] runs `helm template` of
//! `templates/prometheusrule.yaml` with the test's values (short for-durations and windows) and
//! keeps the PrometheusRule's `spec`, which is a Prometheus rules file.
//!
//! Agents listen on the loopback of their network namespace; [`NetnsRelay`] forwards a host
//! loopback port into one (`socat`), so Prometheus scrapes them without leaving the host.
//!
//! Helpers fail the caller on any error: this is test code, not product code.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::control_plane::bin_dir;
use crate::dhcp_client::wait_for;
use crate::netns::Netns;
use crate::ports::free_port;
use crate::process::Supervised;

/// One scrape target: a `job` of `host:port` addresses with extra labels per target (as a
/// ServiceMonitor adds `pod`).
#[derive(Clone, Debug)]
pub struct Target {
    /// The job label.
    pub job: String,
    /// `127.0.0.1:port`.
    pub address: String,
    /// Extra labels on every series of the target.
    pub labels: BTreeMap<String, String>,
}

/// One alert as `/api/v1/alerts` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Alert {
    /// `alertname`.
    pub name: String,
    /// `pending` or `firing`.
    pub state: String,
    /// Every label, `alertname` and `severity` included.
    pub labels: BTreeMap<String, String>,
    /// `summary`, `description`, `runbook_url`, as Prometheus expanded them.
    pub annotations: BTreeMap<String, String>,
}

/// A running Prometheus; killed, with its data, on drop.
pub struct Prometheus {
    /// Its HTTP port on the host loopback.
    pub port: u16,
    /// Its configuration, rules and data.
    pub dir: tempfile::TempDir,
    process: Supervised,
}

/// The `prometheus` binary: `$PROMETHEUS`, else the one on PATH (scripts/install-deps.sh
/// installs Debian's package).
pub fn prometheus_binary() -> PathBuf {
    std::env::var_os("PROMETHEUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("prometheus"))
}

/// The chart's alert rules rendered with `values` (a values file, whose `prometheusRule` section
/// the test sets), as a Prometheus rules file.
pub fn render_rules(values: &Path) -> String {
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../chart");
    let helm = std::env::var_os("HELM")
        .map(PathBuf::from)
        .unwrap_or_else(|| bin_dir().join("helm"));
    let out = Command::new(&helm)
        .args(["template", "vmdhcp"])
        .arg(&chart)
        .args([
            "--namespace",
            "vmdhcp-system",
            "-s",
            "templates/prometheusrule.yaml",
        ])
        .arg("-f")
        .arg(values)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e} (scripts/install-deps.sh installs helm)",
                helm.display()
            )
        });
    assert!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rule: serde_yaml_ng::Value = serde_yaml_ng::from_slice(&out.stdout).unwrap();
    assert_eq!(rule["kind"].as_str(), Some("PrometheusRule"), "{rule:?}");
    serde_yaml_ng::to_string(&rule["spec"]).unwrap()
}

impl Prometheus {
    /// Starts Prometheus scraping `targets` every second and evaluating `rules` (a rules file's
    /// text) every second; returns once it is ready.
    pub fn start(targets: &[Target], rules: &str) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("rules.yaml"), rules).unwrap();
        let mut jobs: BTreeMap<&str, Vec<&Target>> = BTreeMap::new();
        for t in targets {
            jobs.entry(&t.job).or_default().push(t);
        }
        let scrape_configs: Vec<Value> = jobs
            .into_iter()
            .map(|(job, ts)| {
                serde_json::json!({
                    "job_name": job,
                    "static_configs": ts.iter().map(|t| serde_json::json!({
                        "targets": [t.address],
                        "labels": t.labels,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        // JSON is YAML: no YAML writer needed for the configuration.
        let config = serde_json::json!({
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
            "rule_files": [dir.path().join("rules.yaml")],
            "scrape_configs": scrape_configs,
        });
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config.to_string()).unwrap();
        let port = free_port();
        let args = vec![
            format!("--config.file={}", config_path.display()),
            format!("--storage.tsdb.path={}", dir.path().join("data").display()),
            format!("--web.listen-address=127.0.0.1:{port}"),
            "--log.level=warn".into(),
        ];
        let log = dir.path().join("prometheus.log");
        let process = Supervised::spawn(&prometheus_binary(), &args, &log, None).unwrap();
        let prometheus = Prometheus { port, dir, process };
        wait_for("Prometheus ready", Duration::from_secs(60), || {
            assert!(
                !prometheus.process.exited(),
                "prometheus exited: {}",
                prometheus.process.log_tail(20)
            );
            prometheus
                .get("/-/ready")
                .filter(|(status, _)| *status == 200)
        });
        prometheus
    }

    /// GETs `path` (with its query); the status code and body, `None` while it does not answer.
    fn get(&self, path: &str) -> Option<(u16, String)> {
        let response = crate::http::get(&format!("127.0.0.1:{}", self.port), path).ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        let status = head.split_whitespace().nth(1)?.parse().ok()?;
        Some((status, body.to_owned()))
    }

    /// `data` of an API answer, failing the caller on an error answer.
    fn api(&self, path: &str) -> Value {
        let (status, body) = self
            .get(path)
            .unwrap_or_else(|| panic!("Prometheus does not answer {path}"));
        let v: Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
        assert!(
            status == 200 && v["status"] == "success",
            "{path}: {status} {body}"
        );
        v["data"].clone()
    }

    /// The result of an instant query (`/api/v1/query`): a vector's samples, or a scalar.
    pub fn query(&self, promql: &str) -> Value {
        self.api(&format!("/api/v1/query?query={}", encode(promql)))["result"].clone()
    }

    /// The series of a range query (`/api/v1/query_range`) between `start` and `end` (seconds
    /// since the epoch), one point per `step` seconds.
    pub fn query_range(&self, promql: &str, start: f64, end: f64, step: f64) -> Value {
        self.api(&format!(
            "/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step={step}",
            encode(promql)
        ))["result"]
            .clone()
    }

    /// The alerts pending or firing now (`/api/v1/alerts`).
    pub fn alerts(&self) -> Vec<Alert> {
        let strings = |v: &Value| -> BTreeMap<String, String> {
            v.as_object()
                .map(|o| {
                    o.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                        .collect()
                })
                .unwrap_or_default()
        };
        self.api("/api/v1/alerts")["alerts"]
            .as_array()
            .map(|alerts| {
                alerts
                    .iter()
                    .map(|a| {
                        let labels = strings(&a["labels"]);
                        Alert {
                            name: labels.get("alertname").cloned().unwrap_or_default(),
                            state: a["state"].as_str().unwrap_or_default().to_owned(),
                            labels,
                            annotations: strings(&a["annotations"]),
                        }
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The names of the alerts firing now.
    pub fn firing(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .alerts()
            .into_iter()
            .filter(|a| a.state == "firing")
            .map(|a| a.name)
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// The rules Prometheus loaded (`/api/v1/rules`): alert name → its last evaluation's health
    /// (`ok`, `err`, `unknown`) and error, if any.
    pub fn rule_health(&self) -> BTreeMap<String, (String, String)> {
        let mut out = BTreeMap::new();
        for group in self.api("/api/v1/rules")["groups"]
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            for rule in group["rules"].as_array().cloned().unwrap_or_default() {
                out.insert(
                    rule["name"].as_str().unwrap_or_default().to_owned(),
                    (
                        rule["health"].as_str().unwrap_or_default().to_owned(),
                        rule["lastError"].as_str().unwrap_or_default().to_owned(),
                    ),
                );
            }
        }
        out
    }

    /// Whether every target answered its last scrape (`up == 1`), and how many there are.
    pub fn targets_up(&self) -> (bool, usize) {
        let targets = self.api("/api/v1/targets")["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        (
            !targets.is_empty() && targets.iter().all(|t| t["health"] == "up"),
            targets.len(),
        )
    }

    /// The last lines of Prometheus's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }
}

/// Percent-encodes a query parameter.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A host loopback port forwarded to `127.0.0.1:<port>` inside a network namespace (`socat`),
/// for what listens only on a namespace's loopback, as each agent's HTTP endpoints do.
pub struct NetnsRelay {
    /// The host loopback port.
    pub port: u16,
    _process: Supervised,
}

impl NetnsRelay {
    /// Forwards a free host port to `port` on `ns`'s loopback; `log` keeps socat's complaints.
    pub fn start(ns: &Netns, port: u16, log: &Path) -> NetnsRelay {
        let host = free_port();
        let args = vec![
            format!("TCP-LISTEN:{host},bind=127.0.0.1,fork,reuseaddr"),
            format!(
                "EXEC:ip netns exec {} socat STDIO TCP\\:127.0.0.1\\:{port}",
                ns.name()
            ),
        ];
        let process = Supervised::spawn(Path::new("socat"), &args, log, None).unwrap();
        NetnsRelay {
            port: host,
            _process: process,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_percent_encoded() {
        assert_eq!(
            encode(r#"sum by (a) (x{b="c d"}[5m]) > 0"#),
            "sum%20by%20%28a%29%20%28x%7Bb%3D%22c%20d%22%7D%5B5m%5D%29%20%3E%200"
        );
    }
}
