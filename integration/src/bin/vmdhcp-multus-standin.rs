//! TEST DOUBLE for Multus: a CNI meta-plugin for the single-node cluster of the `cluster` suite
//! (`integration/node/node.sh`), which has no Multus.
//!
//! It does what Multus does for our pods, and nothing more: chained after the node's primary
//! network (the Debian `bridge` plugin), on `ADD` it reads the pod's
//! `k8s.v1.cni.cncf.io/networks` annotation (`[ns/]name[@ifname]` list or its JSON form), fetches
//! each NetworkAttachmentDefinition's CNI config, and runs that config's plugin (e.g. `bridge`)
//! for the pod's network namespace under the interface name the annotation gives (`net1`,
//! `net2`… when it gives none). What it attached is remembered in its state directory, keyed by
//! container ID, so `DEL` detaches it even when the pod is already gone from the API. The primary
//! network's result passes through unchanged.
//!
//! The plugin talks to the API server with `kubectl` and the kubeconfig named in its own CNI
//! config (`"kubeconfig"`, `"kubectl"`, `"stateDir"`). Errors go to stdout as CNI error objects,
//! which containerd shows in the pod's events.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The annotation Multus reads.
const NETWORKS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/networks";

/// Why a CNI command failed.
#[derive(Debug, thiserror::Error)]
enum StandinError {
    #[error("missing environment variable {0}")]
    Env(&'static str),
    #[error("invalid CNI config on stdin: {0}")]
    Config(serde_json::Error),
    #[error("invalid {annotation} annotation {value:?}: {reason}")]
    Annotation {
        annotation: &'static str,
        value: String,
        reason: String,
    },
    #[error("`{command}` failed: {output}")]
    Command { command: String, output: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("NetworkAttachmentDefinition {0} has no valid spec.config: {1}")]
    Nad(String, String),
    #[error("CNI plugin {0:?} not found in CNI_PATH")]
    Plugin(String),
}

/// One network the annotation asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Attachment {
    namespace: String,
    name: String,
    interface: String,
}

/// What ADD attached, for DEL.
#[derive(Debug, Serialize, Deserialize)]
struct Attached {
    interface: String,
    config: Value,
}

#[derive(Debug, Deserialize)]
struct OwnConfig {
    #[serde(rename = "cniVersion", default)]
    cni_version: Option<String>,
    kubeconfig: PathBuf,
    kubectl: PathBuf,
    #[serde(rename = "stateDir")]
    state_dir: PathBuf,
    #[serde(rename = "prevResult", default)]
    prev_result: Option<Value>,
}

/// Parses the annotation: `a, ns/b@eth2` or `[{"name":"a","namespace":"ns","interface":"eth2"}]`.
/// Interfaces not named become `net1`, `net2`, … by position, as in Multus.
fn parse_networks(value: &str, pod_namespace: &str) -> Result<Vec<Attachment>, StandinError> {
    let bad = |reason: String| StandinError::Annotation {
        annotation: NETWORKS_ANNOTATION,
        value: value.to_owned(),
        reason,
    };
    let trimmed = value.trim();
    let mut out = Vec::new();
    if trimmed.starts_with('[') {
        #[derive(Deserialize)]
        struct Element {
            name: String,
            #[serde(default)]
            namespace: Option<String>,
            #[serde(default)]
            interface: Option<String>,
        }
        let items: Vec<Element> = serde_json::from_str(trimmed).map_err(|e| bad(e.to_string()))?;
        for (i, item) in items.into_iter().enumerate() {
            out.push(Attachment {
                namespace: item.namespace.unwrap_or_else(|| pod_namespace.to_owned()),
                name: item.name,
                interface: item.interface.unwrap_or_else(|| format!("net{}", i + 1)),
            });
        }
    } else {
        for (i, item) in trimmed
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .enumerate()
        {
            let (reference, interface) = match item.split_once('@') {
                Some((r, ifname)) => (r, ifname.to_owned()),
                None => (item, format!("net{}", i + 1)),
            };
            let (namespace, name) = match reference.split_once('/') {
                Some((ns, name)) => (ns.to_owned(), name.to_owned()),
                None => (pod_namespace.to_owned(), reference.to_owned()),
            };
            out.push(Attachment {
                namespace,
                name,
                interface,
            });
        }
    }
    for a in &out {
        if a.name.is_empty() || a.interface.is_empty() || a.interface.len() > 15 {
            return Err(bad(format!(
                "network {:?} interface {:?}: empty name or interface name not 1-15 bytes",
                a.name, a.interface
            )));
        }
    }
    Ok(out)
}

/// `K8S_POD_NAMESPACE` and `K8S_POD_NAME` from `CNI_ARGS` (`K=V;K=V`).
fn pod_of(cni_args: &str) -> Option<(String, String)> {
    let args: BTreeMap<&str, &str> = cni_args
        .split(';')
        .filter_map(|kv| kv.split_once('='))
        .collect();
    Some((
        (*args.get("K8S_POD_NAMESPACE")?).to_owned(),
        (*args.get("K8S_POD_NAME")?).to_owned(),
    ))
}

fn env(name: &'static str) -> Result<String, StandinError> {
    std::env::var(name).map_err(|_| StandinError::Env(name))
}

fn kubectl_json(own: &OwnConfig, args: &[&str]) -> Result<Value, StandinError> {
    let mut cmd = Command::new(&own.kubectl);
    cmd.arg(format!("--kubeconfig={}", own.kubeconfig.display()))
        .args(args)
        .args(["-o", "json", "--request-timeout=10s"]);
    let command = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| StandinError::Io {
            what: format!("running {command}"),
            source,
        })?;
    if !out.status.success() {
        return Err(StandinError::Command {
            command,
            output: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    serde_json::from_slice(&out.stdout).map_err(|e| StandinError::Command {
        command,
        output: format!("not JSON: {e}"),
    })
}

fn find_plugin(kind: &str) -> Result<PathBuf, StandinError> {
    let path = std::env::var("CNI_PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(kind))
        .find(|p| p.is_file())
        .ok_or_else(|| StandinError::Plugin(kind.to_owned()))
}

/// Runs a delegate plugin with `command` for `ifname`; its stdout.
fn delegate(command: &str, config: &Value, ifname: &str) -> Result<String, StandinError> {
    let kind = config["type"].as_str().unwrap_or_default().to_owned();
    let plugin = find_plugin(&kind)?;
    let mut child = Command::new(&plugin)
        .env("CNI_COMMAND", command)
        .env("CNI_IFNAME", ifname)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| StandinError::Io {
            what: format!("running {}", plugin.display()),
            source,
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(config.to_string().as_bytes())
            .map_err(|source| StandinError::Io {
                what: format!("writing to {}", plugin.display()),
                source,
            })?;
    }
    let out = child
        .wait_with_output()
        .map_err(|source| StandinError::Io {
            what: format!("waiting for {}", plugin.display()),
            source,
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(StandinError::Command {
            command: format!("{kind} {command} {ifname}"),
            output: format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)),
        })
    }
}

fn state_file(own: &OwnConfig, container: &str) -> PathBuf {
    // Container IDs are hex; anything else is replaced so the name stays inside the directory.
    let safe: String = container
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    own.state_dir.join(format!("{safe}.json"))
}

fn add(own: &OwnConfig) -> Result<Value, StandinError> {
    let container = env("CNI_CONTAINERID")?;
    let (namespace, pod) = pod_of(&env("CNI_ARGS")?).ok_or(StandinError::Env(
        "CNI_ARGS with K8S_POD_NAMESPACE and K8S_POD_NAME",
    ))?;
    let pod_json = kubectl_json(own, &["get", "pod", "-n", &namespace, &pod])?;
    let annotation = pod_json["metadata"]["annotations"][NETWORKS_ANNOTATION]
        .as_str()
        .unwrap_or_default();
    let mut attached = Vec::new();
    for a in parse_networks(annotation, &namespace)? {
        let nad = kubectl_json(
            own,
            &[
                "get",
                "network-attachment-definitions.k8s.cni.cncf.io",
                "-n",
                &a.namespace,
                &a.name,
            ],
        )?;
        let reference = format!("{}/{}", a.namespace, a.name);
        let text = nad["spec"]["config"].as_str().unwrap_or("{}");
        let mut config: Value = serde_json::from_str(text)
            .map_err(|e| StandinError::Nad(reference.clone(), e.to_string()))?;
        let Some(object) = config.as_object_mut() else {
            return Err(StandinError::Nad(reference, "not a JSON object".into()));
        };
        if !object.contains_key("type") {
            return Err(StandinError::Nad(reference, "no \"type\"".into()));
        }
        object
            .entry("name")
            .or_insert_with(|| Value::String(a.name.clone()));
        object
            .entry("cniVersion")
            .or_insert_with(|| Value::String("0.3.1".into()));
        delegate("ADD", &config, &a.interface)?;
        attached.push(Attached {
            interface: a.interface,
            config,
        });
        // Written after every attachment: a failure halfway still lets DEL undo what was done.
        write_state(own, &container, &attached)?;
    }
    Ok(own.prev_result.clone().unwrap_or_else(
        || json!({"cniVersion": own.cni_version.clone().unwrap_or_else(|| "0.4.0".into())}),
    ))
}

fn write_state(
    own: &OwnConfig,
    container: &str,
    attached: &[Attached],
) -> Result<(), StandinError> {
    let io = |what: &str| {
        let what = what.to_owned();
        move |source| StandinError::Io { what, source }
    };
    std::fs::create_dir_all(&own.state_dir).map_err(io("creating the state directory"))?;
    let text = serde_json::to_string(attached).map_err(StandinError::Config)?;
    std::fs::write(state_file(own, container), text).map_err(io("writing the state file"))
}

fn del(own: &OwnConfig) -> Result<(), StandinError> {
    let container = env("CNI_CONTAINERID")?;
    let file = state_file(own, &container);
    let Ok(text) = std::fs::read_to_string(&file) else {
        return Ok(()); // nothing attached (or already detached): DEL is idempotent
    };
    let attached: Vec<Attached> = serde_json::from_str(&text).unwrap_or_default();
    let mut first_error = None;
    for a in attached.iter().rev() {
        if let Err(e) = delegate("DEL", &a.config, &a.interface) {
            first_error.get_or_insert(e);
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => {
            let _ = std::fs::remove_file(&file);
            Ok(())
        }
    }
}

fn run(command: &str, stdin: &str) -> Result<Option<Value>, StandinError> {
    if command == "VERSION" {
        return Ok(Some(json!({
            "cniVersion": "0.4.0",
            "supportedVersions": ["0.3.0", "0.3.1", "0.4.0"]
        })));
    }
    let own: OwnConfig = serde_json::from_str(stdin).map_err(StandinError::Config)?;
    match command {
        "ADD" => add(&own).map(Some),
        "DEL" => del(&own).map(|()| None),
        _ => Ok(None), // CHECK: the delegates' state is not re-verified by this stand-in
    }
}

fn main() -> std::process::ExitCode {
    let command = std::env::var("CNI_COMMAND").unwrap_or_default();
    let mut stdin = String::new();
    let _ = std::io::stdin().read_to_string(&mut stdin);
    let result = run(&command, &stdin);
    let mut out = std::io::stdout();
    match result {
        Ok(Some(value)) => {
            let _ = writeln!(out, "{value}");
            std::process::ExitCode::SUCCESS
        }
        Ok(None) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(
                out,
                "{}",
                json!({"cniVersion": "0.4.0", "code": 999, "msg": "vmdhcp-multus-standin", "details": e.to_string()})
            );
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ns: &str, name: &str, ifname: &str) -> Attachment {
        Attachment {
            namespace: ns.into(),
            name: name.into(),
            interface: ifname.into(),
        }
    }

    #[test]
    fn text_form_as_the_controller_writes_it() {
        assert_eq!(
            parse_networks("default/net-a@vmd1, net-b", "pods").ok(),
            Some(vec![
                at("default", "net-a", "vmd1"),
                at("pods", "net-b", "net2")
            ])
        );
        assert_eq!(parse_networks("", "pods").ok(), Some(vec![]));
    }

    #[test]
    fn json_form() {
        assert_eq!(
            parse_networks(
                r#"[{"name":"a","namespace":"x","interface":"eth9"},{"name":"b"}]"#,
                "pods"
            )
            .ok(),
            Some(vec![at("x", "a", "eth9"), at("pods", "b", "net2")])
        );
    }

    #[test]
    fn bad_annotations_are_named() {
        for bad in ["[{\"namespace\":\"x\"}]", "a@", "a@sixteen-bytes-xx", "[1"] {
            let err = parse_networks(bad, "p").err().map(|e| e.to_string());
            assert!(
                err.as_deref()
                    .is_some_and(|e| e.contains(NETWORKS_ANNOTATION)),
                "{bad}: {err:?}"
            );
        }
    }

    #[test]
    fn pod_from_cni_args() {
        assert_eq!(
            pod_of("IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_UID=u"),
            Some(("ns".into(), "p".into()))
        );
        assert_eq!(pod_of("IgnoreUnknown=1"), None);
    }
}
