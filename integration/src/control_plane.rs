//! A real Kubernetes control plane for tests: etcd and kube-apiserver as local processes.
//!
//! [`ControlPlane::start`] brings up etcd and kube-apiserver (v1.20, built from Debian's source
//! package by `scripts/install-deps.sh`) on free loopback ports, with a throwaway CA, token
//! authentication for one `system:masters` user, RBAC, and a service-account signing key; writes
//! a kubeconfig; and installs our CRDs (from `chart/crds`) plus minimal KubeVirt and Multus CRDs.
//! Everything lives in one temporary directory and dies with the handle (see [`crate::process`]).
//!
//! Tests in one binary share one control plane through [`ControlPlane::shared`] and isolate
//! themselves by namespace ([`ControlPlane::namespace`]).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::ports::free_port;
use crate::process::{ProcessError, Supervised};

/// Why the control plane could not be started or used.
#[derive(Debug, thiserror::Error)]
pub enum ControlPlaneError {
    /// A binary the harness needs is not installed.
    #[error("{name} not found at {path}: run scripts/install-deps.sh (or set VMDHCP_BIN_DIR)")]
    MissingBinary {
        /// The binary.
        name: &'static str,
        /// Where it was looked for.
        path: PathBuf,
    },
    /// A filesystem operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A helper command (openssl, kubectl) failed.
    #[error("`{command}` failed: {output}")]
    Command {
        /// The command line.
        command: String,
        /// Its stderr and stdout.
        output: String,
    },
    /// A process could not be started.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// A component did not become ready in time.
    #[error("{what} not ready within {seconds} s\n{log}")]
    NotReady {
        /// The component.
        what: &'static str,
        /// The deadline.
        seconds: u64,
        /// The tail of its log.
        log: String,
    },
    /// The kubeconfig could not be turned into a client.
    #[error("kube client: {0}")]
    Client(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ControlPlaneError {
    let what = what.into();
    move |source| ControlPlaneError::Io { what, source }
}

/// Directory holding `etcd`, `kube-apiserver` and `kubectl`: `$VMDHCP_BIN_DIR`, else the cache
/// `scripts/install-deps.sh` fills.
pub fn bin_dir() -> PathBuf {
    std::env::var_os("VMDHCP_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let cache = std::env::var_os("VMDHCP_CACHE")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                        .join(".cache/vmdhcp")
                });
            cache.join("bin")
        })
}

/// Path of a required tool in [`bin_dir`].
pub fn tool(name: &'static str) -> Result<PathBuf, ControlPlaneError> {
    let path = bin_dir().join(name);
    if path.exists() {
        Ok(path)
    } else {
        Err(ControlPlaneError::MissingBinary { name, path })
    }
}

/// The repository root (for `chart/crds` and manifests).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs a command to completion; its output becomes the error on failure.
pub fn run(cmd: &mut Command) -> Result<String, ControlPlaneError> {
    let command = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(io(format!("running {command}")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(ControlPlaneError::Command {
            command,
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&out.stdout)
            ),
        })
    }
}

/// A running etcd + kube-apiserver pair with our CRDs installed.
pub struct ControlPlane {
    // Field order is drop order: the API server stops before etcd, and the directory goes last
    // (with the janitor, which removes it even when the test process is killed).
    apiserver: Supervised,
    etcd: Supervised,
    _janitor: Supervised,
    etcd_command: (PathBuf, Vec<String>),
    apiserver_command: (PathBuf, Vec<String>),
    restarts: usize,
    kubeconfig: PathBuf,
    server: String,
    dir: PathBuf,
}

/// Set to a file's path to have the API server append the metadata of every request to it, as
/// JSON lines (who asked for what: the API server's metrics do not name clients).
pub const AUDIT_ENV: &str = "VMDHCP_APISERVER_AUDIT";

/// Requests' metadata only, once each (when the response is complete).
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived, ResponseStarted]\nrules:\n- level: Metadata\n";

impl ControlPlane {
    /// Starts a control plane in a fresh temporary directory (about 5 s), with an audit log
    /// when [`AUDIT_ENV`] names one.
    pub fn start() -> Result<Self, ControlPlaneError> {
        Self::start_with_audit(std::env::var_os(AUDIT_ENV).map(PathBuf::from))
    }

    /// [`ControlPlane::start`], with the API server appending every request's metadata to
    /// `audit` as JSON lines when given: for tests that assert who asked for what, in which order.
    pub fn start_with_audit(audit: Option<PathBuf>) -> Result<Self, ControlPlaneError> {
        let (etcd_bin, apiserver_bin, kubectl) =
            (tool("etcd")?, tool("kube-apiserver")?, tool("kubectl")?);
        let dir = tempfile::Builder::new()
            .prefix("vmdhcp-cp-")
            .tempdir()
            .map_err(io("creating the control plane directory"))?
            .keep();
        let p = |name: &str| dir.join(name).display().to_string();
        write_pki(&dir)?;
        let token = format!("vmdhcp-test-{}", std::process::id());
        std::fs::write(
            dir.join("tokens.csv"),
            format!("{token},admin,admin,system:masters\n"),
        )
        .map_err(io("writing tokens.csv"))?;

        let (etcd_client, etcd_peer, secure_port) = (free_port(), free_port(), free_port());
        let etcd_args: Vec<String> = vec![
            "--name=test".into(),
            format!("--data-dir={}", p("etcd")),
            format!("--listen-client-urls=http://127.0.0.1:{etcd_client}"),
            format!("--advertise-client-urls=http://127.0.0.1:{etcd_client}"),
            format!("--listen-peer-urls=http://127.0.0.1:{etcd_peer}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}"),
            format!("--initial-cluster=test=http://127.0.0.1:{etcd_peer}"),
            "--unsafe-no-fsync".into(),
        ];
        // Removes the directory once the control plane is dropped or the test process dies;
        // etcd and the API server can then stop and start again on the same data (restart()).
        let janitor = Supervised::spawn(
            Path::new("sleep"),
            &["infinity".into()],
            &dir.join("janitor.log"),
            Some(&dir),
        )?;
        let etcd = Supervised::spawn(&etcd_bin, &etcd_args, &dir.join("etcd.log"), None)?;
        let mut apiserver_args: Vec<String> = vec![
            format!("--etcd-servers=http://127.0.0.1:{etcd_client}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={secure_port}"),
            "--insecure-port=0".into(),
            format!("--cert-dir={}", p("certs")),
            format!("--tls-cert-file={}", p("server.crt")),
            format!("--tls-private-key-file={}", p("server.key")),
            format!("--client-ca-file={}", p("ca.crt")),
            format!("--token-auth-file={}", p("tokens.csv")),
            "--authorization-mode=RBAC".into(),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            "--api-audiences=https://kubernetes.default.svc".into(),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            "--disable-admission-plugins=ServiceAccount".into(),
            "--allow-privileged=true".into(),
            "--profiling=false".into(),
        ];
        // Who made which request (user agent, verb, resource, namespace), when a bench asks:
        // the API server's own metrics count requests but do not name their client.
        if let Some(log) = audit {
            std::fs::write(dir.join("audit-policy.yaml"), AUDIT_POLICY)
                .map_err(io("writing the audit policy"))?;
            apiserver_args.extend([
                format!("--audit-policy-file={}", p("audit-policy.yaml")),
                format!("--audit-log-path={}", log.display()),
                "--audit-log-format=json".into(),
            ]);
        }
        let apiserver = Supervised::spawn(
            &apiserver_bin,
            &apiserver_args,
            &dir.join("apiserver.log"),
            None,
        )?;
        let server = format!("https://127.0.0.1:{secure_port}");
        let kubeconfig = dir.join("kubeconfig");
        write_kubeconfig(&kubeconfig, &server, &dir.join("ca.crt"), &token)?;

        let cp = ControlPlane {
            apiserver,
            etcd,
            _janitor: janitor,
            etcd_command: (etcd_bin, etcd_args),
            apiserver_command: (apiserver_bin, apiserver_args),
            restarts: 0,
            kubeconfig,
            server,
            dir,
        };
        cp.wait_ready(&kubectl)?;
        cp.install_crds()?;
        Ok(cp)
    }

    /// The control plane shared by all tests of this test binary, started on first use.
    ///
    /// # Panics
    /// When it cannot start: every test that needs it would fail anyway, and the message says why.
    #[allow(clippy::panic)]
    pub fn shared() -> &'static ControlPlane {
        static SHARED: OnceLock<ControlPlane> = OnceLock::new();
        SHARED.get_or_init(|| match ControlPlane::start() {
            Ok(cp) => cp,
            Err(e) => panic!("cannot start the test control plane: {e}"),
        })
    }

    /// Stops the API server and etcd (SIGKILL, as a crashed node would), starts both again on
    /// the same ports and data, and returns once the API server is ready again. Every object
    /// written before is still there (etcd runs without fsync, but the page cache survives a
    /// process kill).
    pub fn restart(&mut self) -> Result<(), ControlPlaneError> {
        self.apiserver.stop();
        self.etcd.stop();
        self.restarts += 1;
        let log = |name: &str| self.dir.join(format!("{name}-{}.log", self.restarts));
        let (bin, args) = &self.etcd_command;
        self.etcd = Supervised::spawn(bin, args, &log("etcd"), None)?;
        let (bin, args) = &self.apiserver_command;
        self.apiserver = Supervised::spawn(bin, args, &log("apiserver"), None)?;
        self.wait_ready(&tool("kubectl")?)
    }

    fn wait_ready(&self, kubectl: &Path) -> Result<(), ControlPlaneError> {
        const LIMIT: Duration = Duration::from_secs(90);
        let deadline = Instant::now() + LIMIT;
        loop {
            let ok = Command::new(kubectl)
                .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
                .args(["get", "--raw=/readyz", "--request-timeout=2s"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(ControlPlaneError::NotReady {
                    what: "kube-apiserver",
                    seconds: LIMIT.as_secs(),
                    log: format!(
                        "{}\n{}",
                        self.apiserver.log_tail(30),
                        self.etcd.log_tail(10)
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn install_crds(&self) -> Result<(), ControlPlaneError> {
        let root = repo_root();
        run(self
            .kubectl()
            .args(["apply", "-f"])
            .arg(root.join("chart/crds")))?;
        run(self
            .kubectl()
            .args(["apply", "-f"])
            .arg(root.join("integration/manifests")))?;
        run(self.kubectl().args([
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd",
            "--all",
        ]))?;
        Ok(())
    }

    /// How many `verb` requests on `resource` the API server counted so far ([`Self::requests`]).
    pub fn requests_of(&self, verb: &str, resource: &str) -> Result<f64, ControlPlaneError> {
        Ok(self
            .requests()?
            .get(&(verb.to_owned(), resource.to_owned()))
            .copied()
            .unwrap_or(0.0))
    }

    /// The API server's `apiserver_request_total`, summed by (verb, resource), watches left out:
    /// what clients asked of it so far, for counting a component's calls. A LIST across all
    /// namespaces has ` (all namespaces)` after its resource.
    pub fn requests(&self) -> Result<BTreeMap<(String, String), f64>, ControlPlaneError> {
        let text = run(self.kubectl().args(["get", "--raw", "/metrics"]))?;
        let mut out = BTreeMap::new();
        for line in text
            .lines()
            .filter(|l| l.starts_with("apiserver_request_total{"))
        {
            let label = |name: &str| {
                line.split(&format!("{name}=\""))
                    .nth(1)
                    .and_then(|r| r.split('"').next())
                    .unwrap_or_default()
                    .to_owned()
            };
            let (mut verb, mut resource) = (label("verb"), label("resource"));
            if verb == "WATCH" {
                continue;
            }
            // v1.20 files a GET of one object's subresource (`ippools/status`) under LIST; its
            // scope says it is one object.
            if verb == "LIST" && label("scope") == "resource" {
                verb = "GET".into();
            }
            let subresource = label("subresource");
            if !subresource.is_empty() {
                resource = format!("{resource}/{subresource}");
            }
            // A cluster-wide LIST is a controller's (its caches watch every namespace); agents
            // and the tests list within a namespace. Told apart, a relist is attributable.
            if verb == "LIST" && label("scope") == "cluster" {
                resource.push_str(" (all namespaces)");
            }
            let value: f64 = line
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0);
            *out.entry((verb, resource)).or_insert(0.0) += value;
        }
        Ok(out)
    }

    /// A `kubectl` command already pointed at this control plane.
    ///
    /// # Panics
    /// Never once the control plane is running (kubectl was found at start).
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new(bin_dir().join("kubectl"));
        cmd.arg(format!("--kubeconfig={}", self.kubeconfig.display()));
        cmd
    }

    /// Runs `kubectl ARGS` with `stdin` piped in; returns stdout, or the error with stderr.
    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> Result<String, ControlPlaneError> {
        let mut cmd = self.kubectl();
        cmd.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let command = format!("{cmd:?}");
        let mut child = cmd.spawn().map_err(io(format!("running {command}")))?;
        if let Some(mut pipe) = child.stdin.take() {
            pipe.write_all(stdin.as_bytes())
                .map_err(io("writing to kubectl"))?;
        }
        let out = child
            .wait_with_output()
            .map_err(io(format!("waiting for {command}")))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(ControlPlaneError::Command {
                command,
                output: String::from_utf8_lossy(&out.stderr).into_owned(),
            })
        }
    }

    /// The kubeconfig file (admin token, our CA).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// A kubeconfig acting as ServiceAccount `namespace/name` (a token the API server issues,
    /// valid for an hour), for a process whose permissions a test restricts with RBAC.
    pub fn kubeconfig_as(&self, namespace: &str, name: &str) -> Result<PathBuf, ControlPlaneError> {
        let token =
            run(self
                .kubectl()
                .args(["create", "token", name, "-n", namespace, "--duration=1h"]))?;
        let path = self.dir.join(format!("kubeconfig-{namespace}-{name}"));
        write_kubeconfig(&path, &self.server, &self.dir.join("ca.crt"), token.trim())?;
        Ok(path)
    }

    /// The API server's URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The process ids of the API server and etcd, as running now (benchmarks read their CPU
    /// time).
    pub fn pids(&self) -> (Option<u32>, Option<u32>) {
        (self.apiserver.pid(), self.etcd.pid())
    }

    /// The directory holding the control plane's files and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A kube client for this control plane, bound to the calling tokio runtime.
    pub async fn client(&self) -> Result<Client, ControlPlaneError> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)
            .map_err(|e| ControlPlaneError::Client(e.to_string()))?;
        let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| ControlPlaneError::Client(e.to_string()))?;
        // The tests' own requests, told apart from the binaries' in the audit log.
        config.headers.push((
            http::header::USER_AGENT,
            http::HeaderValue::from_static("vmdhcp-tests"),
        ));
        Client::try_from(config).map_err(|e| ControlPlaneError::Client(e.to_string()))
    }

    /// Creates a namespace unique to this control plane, named `prefix-N`, for one test.
    pub async fn namespace(
        &self,
        client: &Client,
        prefix: &str,
    ) -> Result<String, ControlPlaneError> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!("{prefix}-{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .map_err(|e| ControlPlaneError::Client(format!("creating namespace {name}: {e}")))?;
        Ok(name)
    }
}

fn write_pki(dir: &Path) -> Result<(), ControlPlaneError> {
    let openssl = || {
        let mut c = Command::new("openssl");
        c.current_dir(dir);
        c
    };
    std::fs::write(
        dir.join("san.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .map_err(io("writing san.cnf"))?;
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    run(openssl().args(["req", "-x509"]).args(ec).args([
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=vmdhcp-test-ca",
    ]))?;
    run(openssl().arg("req").args(ec).args([
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]))?;
    run(openssl().args([
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "san.cnf",
    ]))?;
    run(openssl().args([
        "ecparam",
        "-name",
        "prime256v1",
        "-genkey",
        "-noout",
        "-out",
        "sa.key",
    ]))?;
    run(openssl().args(["ec", "-in", "sa.key", "-pubout", "-out", "sa.pub"]))?;
    Ok(())
}

/// Writes a kubeconfig for `server` (trusting `ca`) that authenticates with `token`.
fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca: &Path,
    token: &str,
) -> Result<(), ControlPlaneError> {
    std::fs::write(
        path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {server}\n    certificate-authority: {}\nusers:\n- name: user\n  user:\n    token: {token}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: user\ncurrent-context: test\n",
            ca.display()
        ),
    )
    .map_err(io("writing kubeconfig"))
}

/// The writes (anything but GET and LIST) between two readings of [`ControlPlane::requests`],
/// by (verb, resource), leaving out the resources in `except` (e.g. `endpoints`, which the API
/// server rewrites for itself now and then, or the `leases` of electing replicas).
pub fn writes_between(
    before: &BTreeMap<(String, String), f64>,
    after: &BTreeMap<(String, String), f64>,
    except: &[&str],
) -> BTreeMap<(String, String), f64> {
    after
        .iter()
        .filter(|((verb, resource), _)| {
            verb != "GET" && verb != "LIST" && !except.contains(&resource.as_str())
        })
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect()
}
