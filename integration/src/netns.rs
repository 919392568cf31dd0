//! A network lab made of Linux network namespaces, for tests that put real DHCP traffic on a wire.
//!
//! A [`Lab`] creates namespaces, veth pairs and bridges with the real `ip` tool, runs commands
//! inside namespaces, and on drop kills what it started and deletes every namespace it made (which
//! removes their interfaces). Names carry the test process's PID, so a later run can sweep what a
//! killed run left behind ([`Lab::new`] does). Nothing is ever created in the root namespace:
//! veth pairs are made inside their namespaces (`ip link add … netns …`).

use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// Why a lab operation failed.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// A command could not be run.
    #[error("cannot run {command}: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A command ran and failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// Its stderr.
        stderr: String,
    },
    /// A name too long for Linux (15 bytes for interfaces).
    #[error("interface name {0:?} is longer than 15 bytes")]
    NameTooLong(String),
}

const PREFIX: &str = "vmdt";

/// A namespace created by a [`Lab`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// A namespace made by someone else (e.g. the single node's), so a [`Lab`] can plug its
    /// namespaces into it; the lab does not delete it.
    pub fn adopt(name: &str) -> Self {
        Netns {
            name: name.to_owned(),
        }
    }

    /// The namespace's name, as `ip netns` knows it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A command that runs `program` inside this namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name, program]);
        cmd
    }
}

/// Namespaces, links and processes of one test; all removed on drop.
pub struct Lab {
    id: String,
    namespaces: Vec<Netns>,
    children: Vec<Child>,
}

fn run(cmd: &mut Command) -> Result<Output, NetnsError> {
    let command = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| NetnsError::Spawn {
            command: command.clone(),
            source,
        })?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(NetnsError::Failed {
            command,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

fn ip(args: &[&str]) -> Result<Output, NetnsError> {
    run(Command::new("ip").args(args))
}

impl Lab {
    /// A new, empty lab. Also deletes namespaces left by lab processes that no longer exist.
    pub fn new() -> Result<Self, NetnsError> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        sweep_stale()?;
        let id = format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        Ok(Lab {
            id,
            namespaces: Vec::new(),
            children: Vec::new(),
        })
    }

    /// Creates a namespace (`<lab id>-<name>`) with its loopback up.
    pub fn netns(&mut self, name: &str) -> Result<Netns, NetnsError> {
        let ns = Netns {
            name: format!("{}-{name}", self.id),
        };
        ip(&["netns", "add", &ns.name])?;
        self.namespaces.push(ns.clone());
        ip(&["-n", &ns.name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Creates a veth pair with `a_if` in `a` and `b_if` in `b`, both up.
    pub fn veth(&mut self, a: &Netns, a_if: &str, b: &Netns, b_if: &str) -> Result<(), NetnsError> {
        for name in [a_if, b_if] {
            if name.len() > 15 {
                return Err(NetnsError::NameTooLong(name.to_owned()));
            }
        }
        ip(&[
            "-n", &a.name, "link", "add", a_if, "type", "veth", "peer", "name", b_if, "netns",
            &b.name,
        ])?;
        ip(&["-n", &a.name, "link", "set", a_if, "up"])?;
        ip(&["-n", &b.name, "link", "set", b_if, "up"])?;
        Ok(())
    }

    /// Creates a bridge in `ns`, up; it stands for a VM network.
    pub fn bridge(&mut self, ns: &Netns, name: &str) -> Result<(), NetnsError> {
        if name.len() > 15 {
            return Err(NetnsError::NameTooLong(name.to_owned()));
        }
        ip(&["-n", &ns.name, "link", "add", name, "type", "bridge"])?;
        ip(&["-n", &ns.name, "link", "set", name, "up"])?;
        Ok(())
    }

    /// Plugs `ns` into `bridge` (in `bridge_ns`) with a veth whose inner end is `ifname`; the
    /// bridge-side end is named `port`.
    pub fn plug(
        &mut self,
        bridge_ns: &Netns,
        bridge: &str,
        port: &str,
        ns: &Netns,
        ifname: &str,
    ) -> Result<(), NetnsError> {
        self.veth(bridge_ns, port, ns, ifname)?;
        ip(&["-n", &bridge_ns.name, "link", "set", port, "master", bridge])?;
        Ok(())
    }

    /// Adds an address (`a.b.c.d/len`) to an interface of `ns`.
    pub fn address(&self, ns: &Netns, ifname: &str, cidr: &str) -> Result<(), NetnsError> {
        ip(&["-n", &ns.name, "addr", "add", cidr, "dev", ifname])?;
        Ok(())
    }

    /// Gives `ns` its own `/etc/hosts` (`ip netns exec` bind-mounts `/etc/netns/<ns>/hosts`
    /// over it for programs started in `ns`), so names resolve there and nowhere else; removed
    /// with the namespace.
    pub fn hosts_file(&self, ns: &Netns, content: &str) -> Result<(), NetnsError> {
        let dir = netns_etc(&ns.name);
        let write =
            std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(dir.join("hosts"), content));
        write.map_err(|source| NetnsError::Spawn {
            command: format!("writing {}/hosts", dir.display()),
            source,
        })
    }

    /// Runs `program args…` inside `ns` to completion; fails with its stderr if it fails.
    pub fn exec(&self, ns: &Netns, program: &str, args: &[&str]) -> Result<String, NetnsError> {
        let out = run(ns.command(program).args(args))?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Starts `cmd` (built with [`Netns::command`]); it is killed when the lab drops.
    pub fn spawn(&mut self, mut cmd: Command) -> Result<&mut Child, NetnsError> {
        let command = format!("{cmd:?}");
        let child = cmd
            .spawn()
            .map_err(|source| NetnsError::Spawn { command, source })?;
        self.children.push(child);
        let last = self.children.len() - 1;
        Ok(&mut self.children[last])
    }

    /// Starts `argv` inside `ns` as a daemon a guest runs: no stdin, no stdout, stderr (where
    /// such clients log) to the file `log`; it is killed when the lab drops.
    pub fn spawn_logged(
        &mut self,
        ns: &Netns,
        argv: &[&str],
        log: &std::path::Path,
    ) -> Result<&mut Child, NetnsError> {
        let (program, args) = argv.split_first().unwrap_or((&"true", &[]));
        let file = std::fs::File::create(log).map_err(|source| NetnsError::Spawn {
            command: format!("{argv:?} (its log {})", log.display()),
            source,
        })?;
        let mut cmd = ns.command(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file);
        self.spawn(cmd)
    }

    /// Names of the namespaces this lab holds.
    pub fn namespaces(&self) -> Vec<String> {
        self.namespaces.iter().map(|n| n.name.clone()).collect()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        for ns in self.namespaces.drain(..).rev() {
            kill_namespace_processes(&ns.name);
            let _ = ip(&["netns", "del", &ns.name]);
            let _ = std::fs::remove_dir_all(netns_etc(&ns.name));
        }
    }
}

/// Where `ip netns exec` finds per-namespace files for `/etc`.
fn netns_etc(name: &str) -> std::path::PathBuf {
    std::path::Path::new("/etc/netns").join(name)
}

/// Kills anything still running inside a namespace (daemons a test started with `exec`).
fn kill_namespace_processes(name: &str) {
    if let Ok(out) = ip(&["netns", "pids", name]) {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = Command::new("kill")
                .args(["-KILL", pid])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Deletes `vmdt<pid>-…` namespaces whose process is gone.
fn sweep_stale() -> Result<(), NetnsError> {
    let out = ip(&["netns", "list"])?;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
        else {
            continue;
        };
        if !pid.is_empty()
            && pid.bytes().all(|b| b.is_ascii_digit())
            && !std::path::Path::new(&format!("/proc/{pid}")).exists()
        {
            kill_namespace_processes(name);
            let _ = ip(&["netns", "del", name]);
            let _ = std::fs::remove_dir_all(netns_etc(name));
        }
    }
    Ok(())
}
