//! A private containerd + runc for tests that run our container images.
//!
//! [`Containerd::start`] runs `containerd` with its own config, root, state, runc root and socket
//! in one temporary directory (the CRI plugin off), so it shares nothing with a containerd the
//! machine may run. Images are imported from OCI archives with `ctr`; containers run with
//! `ctr run` under a [`SecurityContext`] that reproduces a Kubernetes container's (user from the
//! image, read-only root filesystem, exactly the listed capabilities, no new privileges, the
//! runtime's default seccomp profile), on the host network or in a given network namespace.
//!
//! Cleanup: a [`Container`] kills and deletes its task, container and snapshot when dropped. The
//! daemon runs under a supervisor script that, when the test process goes away (its stdin
//! closes: drop, panic, or the test process killed), kills and deletes every task, container and
//! image of its namespace, stops containerd, kills the shims it started (found by our socket on
//! their command line), unmounts what is left under the directory and removes it, with the
//! namespace's parent cgroups and, when this harness created it and it is empty, the shims'
//! socket directory `/run/containerd/s` (fixed in containerd 1.6).

use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Why containerd or a container could not be started or used.
#[derive(Debug, thiserror::Error)]
pub enum ContainerdError {
    /// A tool is not installed.
    #[error("{tool} not found: {install}")]
    MissingTool {
        /// The tool.
        tool: &'static str,
        /// How to install it.
        install: &'static str,
    },
    /// A filesystem operation or a spawn failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A `ctr` command failed.
    #[error("`{command}` failed: {output}")]
    Ctr {
        /// The command line.
        command: String,
        /// Its stderr and stdout.
        output: String,
    },
    /// containerd did not answer in time.
    #[error("containerd not ready within {seconds} s:\n{log}")]
    NotReady {
        /// The deadline.
        seconds: u64,
        /// The tail of its log.
        log: String,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ContainerdError {
    let what = what.into();
    move |source| ContainerdError::Io { what, source }
}

/// The namespace (containerd's, not Linux's) everything of this harness lives in; also the
/// parent of its containers' cgroups, hence one per test process.
fn namespace() -> String {
    format!("vmdhcp-test-{}", std::process::id())
}

/// Every capability Linux knows (5.x/6.x), with the `CAP_` prefix `ctr` wants: dropping all but
/// the wanted ones does not depend on which set the runtime starts from.
const ALL_CAPABILITIES: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

/// The bit of a capability (`CAP_NET_ADMIN` or `NET_ADMIN`) in the kernel's sets.
pub fn capability_bit(name: &str) -> Option<u32> {
    let name = if name.starts_with("CAP_") {
        name.to_owned()
    } else {
        format!("CAP_{name}")
    };
    ALL_CAPABILITIES
        .iter()
        .position(|c| *c == name)
        .and_then(|i| u32::try_from(i).ok())
}

/// Where containerd 1.6's shims put their sockets, whatever the daemon's state directory.
const SHIM_SOCKETS: &str = "/run/containerd/s";

/// The supervisor: starts containerd, waits for its stdin to close, then removes everything.
const SUPERVISOR: &str = r#"
dir="$1"; ns="$2"; ours_run_dir="$3"; sock="$dir/containerd.sock"
containerd --config "$dir/config.toml" >"$dir/containerd.log" 2>&1 </dev/null &
daemon=$!
while read -r _; do :; done
ctr=(ctr --address "$sock" --namespace "$ns" --timeout 10s)
for t in $("${ctr[@]}" tasks ls -q 2>/dev/null); do "${ctr[@]}" tasks kill -s KILL "$t" >/dev/null 2>&1; done
for t in $("${ctr[@]}" tasks ls -q 2>/dev/null); do "${ctr[@]}" tasks rm -f "$t" >/dev/null 2>&1; done
for c in $("${ctr[@]}" containers ls -q 2>/dev/null); do "${ctr[@]}" containers rm "$c" >/dev/null 2>&1; done
for i in $("${ctr[@]}" images ls -q 2>/dev/null); do "${ctr[@]}" images rm "$i" >/dev/null 2>&1; done
kill -TERM "$daemon" 2>/dev/null
for _ in $(seq 100); do kill -0 "$daemon" 2>/dev/null || break; sleep 0.1; done
kill -KILL "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null
for p in /proc/[0-9]*; do
  if tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -qF -- "-address $sock "; then kill -KILL "${p#/proc/}" 2>/dev/null; fi
done
grep -o " $dir/[^ ]*" /proc/self/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
for cg in /sys/fs/cgroup/"$ns" /sys/fs/cgroup/*/"$ns"; do [ -d "$cg" ] && rmdir "$cg" 2>/dev/null; done
# The shims' socket directory is fixed in containerd 1.6; removed only if we made it and it is empty.
[ "$ours_run_dir" = 1 ] && rmdir /run/containerd/s /run/containerd 2>/dev/null
rm -rf -- "$dir" 2>/dev/null || rm -rf -- "$dir"
exit 0
"#;

/// A running private containerd; everything it holds is removed on drop.
pub struct Containerd {
    supervisor: Child,
    stdin: Option<ChildStdin>,
    dir: PathBuf,
}

/// How a container runs: the parts of a Kubernetes `securityContext` `ctr run` can express.
/// The user is the image's (`ctr run` 1.6 has no `--user`): a test checks it is the one the
/// chart asks for.
#[derive(Clone, Debug, Default)]
pub struct SecurityContext {
    /// `readOnlyRootFilesystem`.
    pub read_only_root: bool,
    /// The capabilities kept (`drop: [ALL]` plus `add: these`), as `NET_ADMIN` or
    /// `CAP_NET_ADMIN`.
    pub capabilities: Vec<String>,
}

/// The container's network.
#[derive(Clone, Debug)]
pub enum Network {
    /// The host's (`hostNetwork: true`), for a container that talks to the test's API server.
    Host,
    /// An existing network namespace, by path (`/var/run/netns/NAME`).
    Namespace(PathBuf),
}

/// One container to run.
#[derive(Clone, Debug)]
pub struct Run {
    /// The image reference (as imported).
    pub image: String,
    /// The container ID (unique within the harness).
    pub id: String,
    /// The whole command line, entrypoint first (`ctr run` replaces entrypoint and command).
    pub args: Vec<String>,
    /// Environment variables.
    pub env: Vec<(String, String)>,
    /// Bind mounts: host path, container path, read-only.
    pub mounts: Vec<(PathBuf, String, bool)>,
    /// The security context.
    pub security: SecurityContext,
    /// The network.
    pub network: Network,
}

/// A container started by [`Containerd::start_container`]; killed and deleted on drop.
pub struct Container {
    id: String,
    ctr: Vec<String>,
    client: Child,
    log: PathBuf,
}

fn which(tool: &'static str, install: &'static str) -> Result<(), ContainerdError> {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false);
    if found {
        Ok(())
    } else {
        Err(ContainerdError::MissingTool { tool, install })
    }
}

fn run(cmd: &mut Command) -> Result<Output, ContainerdError> {
    let command = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(io(format!("running {command}")))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(ContainerdError::Ctr {
            command,
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&out.stdout)
            ),
        })
    }
}

impl Containerd {
    /// Starts containerd in a fresh temporary directory and waits until it answers.
    pub fn start() -> Result<Self, ContainerdError> {
        const INSTALL: &str = "apt-get install containerd runc (or run scripts/install-deps.sh)";
        which("containerd", INSTALL)?;
        which("ctr", INSTALL)?;
        which("runc", INSTALL)?;
        let dir = tempfile::Builder::new()
            .prefix("vmdhcp-ctrd-")
            .tempdir()
            .map_err(io("creating the containerd directory"))?
            .keep();
        let d = |name: &str| dir.join(name).display().to_string();
        let config = format!(
            "version = 2\n\
             root = \"{root}\"\n\
             state = \"{state}\"\n\
             disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
             [grpc]\n  address = \"{sock}\"\n\
             [ttrpc]\n  address = \"{sock}.ttrpc\"\n\
             [debug]\n  address = \"\"\n\
             [metrics]\n  address = \"\"\n\
             [plugins.\"io.containerd.internal.v1.opt\"]\n  path = \"{opt}\"\n",
            root = d("root"),
            state = d("state"),
            sock = d("containerd.sock"),
            opt = d("opt"),
        );
        std::fs::write(dir.join("config.toml"), config)
            .map_err(io("writing containerd's config"))?;
        let mut supervisor = Command::new("bash")
            .arg("-c")
            .arg(SUPERVISOR)
            .arg("supervise-containerd")
            .arg(&dir)
            .arg(namespace())
            .arg(if Path::new(SHIM_SOCKETS).exists() {
                "0"
            } else {
                "1"
            })
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(io("starting containerd's supervisor"))?;
        let stdin = supervisor.stdin.take();
        let containerd = Containerd {
            supervisor,
            stdin,
            dir,
        };
        containerd.wait_ready()?;
        Ok(containerd)
    }

    fn wait_ready(&self) -> Result<(), ContainerdError> {
        const LIMIT: Duration = Duration::from_secs(30);
        let deadline = Instant::now() + LIMIT;
        loop {
            if self
                .ctr()
                .arg("version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(ContainerdError::NotReady {
                    seconds: LIMIT.as_secs(),
                    log: self.log_tail(30),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn ctr_args(&self) -> Vec<String> {
        vec![
            "--address".into(),
            self.dir.join("containerd.sock").display().to_string(),
            "--namespace".into(),
            namespace(),
        ]
    }

    /// A `ctr` command pointed at this containerd and namespace.
    pub fn ctr(&self) -> Command {
        let mut cmd = Command::new("ctr");
        cmd.args(self.ctr_args());
        cmd
    }

    /// The directory holding containerd's files (config, root, state, log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The last `lines` lines of containerd's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Imports an OCI (or docker) archive; returns `ctr images ls` afterwards.
    pub fn import(&self, archive: &Path) -> Result<String, ContainerdError> {
        run(self.ctr().args(["images", "import"]).arg(archive))?;
        let out = run(self.ctr().args(["images", "ls"]))?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn run_args(&self, spec: &Run, remove: bool) -> Vec<String> {
        let mut args = vec!["run".to_owned()];
        if remove {
            args.push("--rm".into());
        }
        // runc's state and the I/O fifos in our directory too, not under /run/containerd.
        args.push(format!("--runc-root={}", self.dir.join("runc").display()));
        args.push(format!("--fifo-dir={}", self.dir.join("fifo").display()));
        // RuntimeDefault seccomp; no new privileges is ctr's default (allowPrivilegeEscalation
        // false).
        args.push("--seccomp".into());
        if spec.security.read_only_root {
            args.push("--read-only".into());
        }
        let keep: Vec<String> = spec
            .security
            .capabilities
            .iter()
            .map(|c| {
                if c.starts_with("CAP_") {
                    c.clone()
                } else {
                    format!("CAP_{c}")
                }
            })
            .collect();
        for cap in &keep {
            args.push(format!("--cap-add={cap}"));
        }
        for cap in ALL_CAPABILITIES {
            if !keep.iter().any(|k| k == cap) {
                args.push(format!("--cap-drop={cap}"));
            }
        }
        match &spec.network {
            Network::Host => args.push("--net-host".into()),
            Network::Namespace(path) => {
                args.push(format!("--with-ns=network:{}", path.display()));
            }
        }
        for (k, v) in &spec.env {
            args.push(format!("--env={k}={v}"));
        }
        for (src, dst, ro) in &spec.mounts {
            let options = if *ro { "rbind:ro" } else { "rbind:rw" };
            args.push(format!(
                "--mount=type=bind,src={},dst={dst},options={options}",
                src.display()
            ));
        }
        args.push(spec.image.clone());
        args.push(spec.id.clone());
        args.extend(spec.args.iter().cloned());
        args
    }

    /// Runs a container to completion (`ctr run --rm`), returning its output whatever its exit.
    pub fn run_to_end(&self, spec: &Run) -> Result<Output, ContainerdError> {
        let args = self.run_args(spec, true);
        self.ctr()
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .map_err(io(format!("running ctr {}", args.join(" "))))
    }

    /// Starts a container in the background; its output goes to `log`.
    pub fn start_container(&self, spec: &Run, log: &Path) -> Result<Container, ContainerdError> {
        let args = self.run_args(spec, false);
        let file = std::fs::File::create(log).map_err(io(format!("creating {}", log.display())))?;
        let err = file
            .try_clone()
            .map_err(io(format!("opening {}", log.display())))?;
        let client = self
            .ctr()
            .args(&args)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .spawn()
            .map_err(io(format!("running ctr {}", args.join(" "))))?;
        Ok(Container {
            id: spec.id.clone(),
            ctr: self.ctr_args(),
            client,
            log: log.to_owned(),
        })
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.supervisor.wait();
    }
}

impl Container {
    fn ctr(&self) -> Command {
        let mut cmd = Command::new("ctr");
        cmd.args(&self.ctr);
        cmd
    }

    /// The container's ID.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Everything the container wrote so far (stdout and stderr, with `ctr`'s own errors).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The host PID of the container's first process, once its task runs.
    pub fn pid(&self) -> Option<u32> {
        let out = run(self.ctr().args(["tasks", "ls"])).ok()?;
        String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
            let mut fields = l.split_whitespace();
            (fields.next() == Some(self.id.as_str()))
                .then(|| fields.next().and_then(|p| p.parse().ok()))
                .flatten()
                .filter(|pid| *pid > 0)
        })
    }

    /// The task's state as `ctr tasks ls` shows it (`RUNNING`, `STOPPED`), if it exists.
    pub fn status(&self) -> Option<String> {
        let out = run(self.ctr().args(["tasks", "ls"])).ok()?;
        String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            (fields.first() == Some(&self.id.as_str()))
                .then(|| fields.get(2).map(|s| (*s).to_owned()))
                .flatten()
        })
    }

    /// Sends `signal` (e.g. `SIGTERM`) to the container's first process.
    pub fn signal(&self, signal: &str) -> Result<(), ContainerdError> {
        run(self.ctr().args(["tasks", "kill", "-s", signal, &self.id]))?;
        Ok(())
    }

    /// Waits up to `limit` for the `ctr run` client to return (the task exited); its status.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.client.try_wait() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let quiet = |cmd: &mut Command| {
            let _ = cmd
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        };
        quiet(
            self.ctr()
                .args(["tasks", "kill", "-s", "SIGKILL", &self.id]),
        );
        let _ = self.wait_exit(Duration::from_secs(10));
        let _ = self.client.kill();
        let _ = self.client.wait();
        quiet(self.ctr().args(["tasks", "rm", "-f", &self.id]));
        quiet(self.ctr().args(["containers", "rm", &self.id]));
    }
}
