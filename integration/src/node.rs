//! A real single-node Kubernetes cluster for tests that install the Helm chart and run our images
//! as pods: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy,
//! containerd and kubelet (v1.20, built from Debian's source by `scripts/install-deps.sh`).
//!
//! [`Node::start`] runs `integration/node/node.sh`, which does the work and holds the node in
//! one network namespace and one directory; this handle waits until the node is Ready, reports a
//! component that dies (its name and the tail of its log), and gives kubectl and helm that reach
//! the API server through 127.0.0.1. Dropping the handle (also on panic, or when the test process
//! dies: the script watches its stdin) removes every process, pod, mount, network namespace,
//! cgroup and file of the node.
//!
//! The node has no Multus, CoreDNS or KubeVirt: the script stands in for the first two (see its
//! header), and VMs are network namespaces plugged into a NAD's bridge in [`Node::netns`].

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::control_plane::{bin_dir, repo_root};
use crate::netns::Netns;

/// Why the node could not be started or used.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The script could not be started or a file not written.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A component failed (during start-up or later).
    #[error("node component {component} failed:\n{detail}")]
    Component {
        /// The component (kubelet, containerd, …).
        component: String,
        /// What the script said: usually the tail of the component's log.
        detail: String,
    },
    /// The node did not become Ready in time.
    #[error("node not Ready within {seconds} s; its script said:\n{said}")]
    NotReady {
        /// The deadline.
        seconds: u64,
        /// Everything the script printed.
        said: String,
    },
    /// No images to run: `scripts/build-images.sh` was not run.
    #[error("no container images in {0}: run scripts/build-images.sh (scripts/test.sh does)")]
    NoImages(PathBuf),
}

/// A running single-node cluster; removed on drop.
pub struct Node {
    script: Child,
    stdin: Option<ChildStdin>,
    said: Arc<Mutex<String>>,
    dir: PathBuf,
    netns: String,
}

/// The image archives `scripts/build-images.sh` wrote (its `images.tsv`), in `dir`.
pub fn image_archives(dir: &Path) -> Result<Vec<PathBuf>, NodeError> {
    let tsv = std::fs::read_to_string(dir.join("images.tsv"))
        .map_err(|_| NodeError::NoImages(dir.to_owned()))?;
    let archives: Vec<PathBuf> = tsv
        .lines()
        .filter_map(|l| l.split('\t').nth(6))
        .map(PathBuf::from)
        .collect();
    if archives.is_empty() {
        Err(NodeError::NoImages(dir.to_owned()))
    } else {
        Ok(archives)
    }
}

/// Where `scripts/build-images.sh` put the images: `$VMDHCP_IMAGES_DIR`, else `target/images`.
pub fn images_dir() -> PathBuf {
    std::env::var_os("VMDHCP_IMAGES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/images"))
}

impl Node {
    /// Starts the node with the images of `images` imported, the Multus stand-in at `standin`,
    /// and waits until it is Ready (about a minute).
    pub fn start(images: &Path, standin: &Path) -> Result<Self, NodeError> {
        Self::start_with(images, standin, None)
    }

    /// As [`Node::start`], with the API server writing the requests `policy` (an audit
    /// `Policy` in YAML) selects to [`Node::audit_log`]: who called what, and whether RBAC let
    /// them, which neither the components' logs nor the API server's metrics say.
    pub fn start_audited(images: &Path, standin: &Path, policy: &str) -> Result<Self, NodeError> {
        Self::start_with(images, standin, Some(policy))
    }

    fn start_with(images: &Path, standin: &Path, audit: Option<&str>) -> Result<Self, NodeError> {
        let archives = image_archives(images)?;
        let io = |what: &str| {
            let what = what.to_owned();
            move |source| NodeError::Io { what, source }
        };
        let dir = tempfile::Builder::new()
            .prefix("vmdhcp-node-")
            .tempdir()
            .map_err(io("creating the node directory"))?
            .keep();
        let api_port = crate::ports::free_port();
        let mut command = Command::new("bash");
        if let Some(policy) = audit {
            let file = dir.join("audit-policy.yaml");
            std::fs::write(&file, policy).map_err(io("writing the audit policy"))?;
            command.env("VMDHCP_NODE_AUDIT_POLICY", file);
        }
        let mut script = command
            .arg(repo_root().join("integration/node/node.sh"))
            .arg(&dir)
            .arg(api_port.to_string())
            .arg(images)
            .arg(standin)
            .args(&archives)
            .env("VMDHCP_BIN_DIR", bin_dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(io("starting integration/node/node.sh"))?;
        let stdin = script.stdin.take();
        let said = Arc::new(Mutex::new(String::new()));
        if let Some(out) = script.stdout.take() {
            let said = Arc::clone(&said);
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if let Ok(mut s) = said.lock() {
                        s.push_str(&line);
                        s.push('\n');
                    }
                }
            });
        }
        let mut node = Node {
            script,
            stdin,
            said,
            dir,
            netns: String::new(),
        };
        const LIMIT: Duration = Duration::from_secs(300);
        let deadline = Instant::now() + LIMIT;
        loop {
            node.check()?;
            let said = node.said();
            if let Some(ns) = said.lines().find_map(|l| l.strip_prefix("READY ")) {
                node.netns = ns.trim().to_owned();
                return Ok(node);
            }
            if Instant::now() > deadline || node.script.try_wait().ok().flatten().is_some() {
                return Err(NodeError::NotReady {
                    seconds: LIMIT.as_secs(),
                    said,
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn said(&self) -> String {
        self.said.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Fails with the component's name and log tail if a component of the node has died.
    pub fn check(&self) -> Result<(), NodeError> {
        let said = self.said();
        let Some(start) = said.find("FAILED ") else {
            return Ok(());
        };
        let rest = &said[start + "FAILED ".len()..];
        // The reader thread takes the script's report a line at a time: until its `END` line is
        // in, the detail is still arriving, and the next check will see all of it.
        let Some((component, detail)) = complete_report(rest) else {
            return Ok(());
        };
        Err(NodeError::Component {
            component: component.to_owned(),
            detail: detail.to_owned(),
        })
    }

    /// The admin kubeconfig (API server at 127.0.0.1).
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig/admin")
    }

    /// The API server's audit log (JSON lines), written when the node was started with
    /// [`Node::start_audited`].
    pub fn audit_log(&self) -> PathBuf {
        self.dir.join("logs/audit.log")
    }

    /// The directory of the node (logs under `logs/`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A `kubectl` command pointed at the node.
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new(bin_dir().join("kubectl"));
        cmd.arg(format!("--kubeconfig={}", self.kubeconfig().display()));
        cmd
    }

    /// A `helm` command pointed at the node.
    pub fn helm(&self) -> Command {
        let mut cmd = Command::new(bin_dir().join("helm"));
        cmd.env("KUBECONFIG", self.kubeconfig())
            .env("HELM_CACHE_HOME", self.dir.join("helm/cache"))
            .env("HELM_CONFIG_HOME", self.dir.join("helm/config"))
            .env("HELM_DATA_HOME", self.dir.join("helm/data"));
        cmd
    }

    /// The node's network namespace, where pod bridges and NAD bridges live (not owned by a
    /// [`crate::netns::Lab`]: the node removes it).
    pub fn netns(&self) -> Netns {
        Netns::adopt(&self.netns)
    }

    /// `ip -n <node netns> ARGS`: for creating a NAD's bridge before the pods attach to it.
    pub fn ip(&self, args: &[&str]) -> Result<String, NodeError> {
        let out = Command::new("ip")
            .arg("-n")
            .arg(&self.netns)
            .args(args)
            .output()
            .map_err(|source| NodeError::Io {
                what: "running ip".into(),
                source,
            })?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(NodeError::Component {
                component: format!("ip -n {} {}", self.netns, args.join(" ")),
                detail: String::from_utf8_lossy(&out.stderr).into_owned(),
            })
        }
    }

    /// The processes of the pod with `uid`, other than its sandbox's `pause`: they live in the
    /// cgroup `…/pod<uid>/…` the kubelet made for the pod.
    pub fn pod_processes(uid: &str) -> Vec<u32> {
        let needle = format!("pod{uid}");
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                let read = |f: &str| std::fs::read_to_string(format!("/proc/{pid}/{f}"));
                read("cgroup").is_ok_and(|c| c.contains(&needle))
                    && read("comm").is_ok_and(|c| c.trim() != "pause")
            })
            .collect()
    }

    /// The last `lines` lines of a component's log (`kubelet`, `containerd`, `kube-apiserver`…).
    pub fn log_tail(&self, component: &str, lines: usize) -> String {
        let text = std::fs::read_to_string(self.dir.join(format!("logs/{component}.log")))
            .unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.script.wait();
    }
}

/// `<component>\n<detail>\nEND\n` (what follows `FAILED `) split in two, once the whole report
/// has been read.
fn complete_report(rest: &str) -> Option<(&str, &str)> {
    let (component, tail) = rest.split_once('\n')?;
    if tail.starts_with("END\n") {
        return Some((component, ""));
    }
    let end = tail.find("\nEND\n")?;
    Some((component, &tail[..end]))
}

#[cfg(test)]
mod tests {
    use super::complete_report;

    #[test]
    fn a_report_counts_only_once_its_end_line_is_read() {
        assert_eq!(complete_report("kube-proxy\n"), None);
        assert_eq!(complete_report("kube-proxy\nexited: I1129 start\n"), None);
        assert_eq!(complete_report("kube-proxy\nexited: a\nEN"), None);
        assert_eq!(
            complete_report("kube-proxy\nexited: a\nb\nEND\n"),
            Some(("kube-proxy", "exited: a\nb"))
        );
        assert_eq!(complete_report("kubelet\nEND\n"), Some(("kubelet", "")));
    }
}
