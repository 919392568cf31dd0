//! Child processes that cannot outlive the test process.
//!
//! Each process runs under a small `bash` supervisor that reads its stdin until end of file and
//! then kills the child. Stdin is a pipe held by the test process, so the child is killed when we
//! drop the handle, when the test panics, and also when the test process is killed or exits with
//! the handle still in a `static` — cases `Drop` alone cannot cover.

use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

/// Why a supervised process could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// Spawning the supervisor failed.
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The OS error.
        source: std::io::Error,
    },
}

const SUPERVISOR: &str = r#"
log="$1"; cleanup="$2"; shift 2
"$@" >"$log" 2>&1 </dev/null &
child=$!
echo "$child" >"$log.pid"
while read -r _; do :; done
kill -KILL "$child" 2>/dev/null
wait "$child" 2>/dev/null
if [ -n "$cleanup" ]; then rm -rf -- "$cleanup" 2>/dev/null || rm -rf -- "$cleanup" 2>/dev/null; fi
exit 0
"#;

/// A running child under supervision; killed (and its cleanup path removed) on drop.
pub struct Supervised {
    name: String,
    log: PathBuf,
    supervisor: Child,
    stdin: Option<ChildStdin>,
}

impl Supervised {
    /// Starts `program args…` with stdout and stderr going to `log`. When the process is stopped,
    /// `cleanup` (if given) is removed recursively.
    pub fn spawn(
        program: &Path,
        args: &[String],
        log: &Path,
        cleanup: Option<&Path>,
    ) -> Result<Self, ProcessError> {
        let name = program.file_name().map_or_else(
            || program.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        let mut cmd = Command::new("bash");
        cmd.arg("-c")
            .arg(SUPERVISOR)
            .arg("supervise")
            .arg(log)
            .arg(cleanup.map(Path::as_os_str).unwrap_or_default())
            .arg(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut supervisor = cmd.spawn().map_err(|source| ProcessError::Spawn {
            program: name.clone(),
            source,
        })?;
        let stdin = supervisor.stdin.take();
        Ok(Supervised {
            name,
            log: log.to_owned(),
            supervisor,
            stdin,
        })
    }

    /// The last `lines` lines of the process's output, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        format!(
            "--- last {} lines of {} ({}) ---\n{}",
            lines.min(all.len()),
            self.name,
            self.log.display(),
            all[all.len().saturating_sub(lines)..].join("\n")
        )
    }

    /// The child's process id (as written by the supervisor once it started the child).
    pub fn pid(&self) -> Option<u32> {
        let path = format!("{}.pid", self.log.display());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            if let Some(pid) = std::fs::read_to_string(&path)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                return Some(pid);
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Sends `signal` (`TERM`, `KILL`, ...) to the child; whether it was delivered.
    pub fn signal(&self, signal: &str) -> bool {
        self.pid().is_some_and(|pid| {
            Command::new("kill")
                .args(["-s", signal, &pid.to_string()])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
    }

    /// Whether the child has exited (its pid no longer exists).
    pub fn exited(&self) -> bool {
        // A child that died stays a zombie until the supervisor reaps it: that counts as exited.
        self.pid().is_none_or(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
                stat.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z'))
            })
        })
    }

    /// Stops the child and waits for the supervisor to finish its cleanup.
    pub fn stop(&mut self) {
        drop(self.stdin.take());
        let _ = self.supervisor.wait();
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A binary of this workspace, built on first use with the profile of the running test (the
/// integration crate cannot depend on another package's binaries). Panics with cargo's status if
/// the build fails: every test that needs the binary would fail anyway.
#[allow(clippy::panic)]
pub fn workspace_binary(package: &str, bin: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    // Tests and benches run from target/<profile>/deps, binaries (the demo) from target/<profile>.
    let parent = exe.parent().unwrap_or(Path::new("."));
    let profile_dir = if parent.file_name().is_some_and(|n| n == "deps") {
        parent.parent().unwrap_or(parent).to_owned()
    } else {
        parent.to_owned()
    };
    let mut cmd = Command::new(option_env!("CARGO").unwrap_or("cargo"));
    cmd.args(["build", "--quiet", "-p", package, "--bin", bin])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    // Not the variables cargo set for this test or bench: build scripts read some of them
    // (ring's reruns when CARGO_MANIFEST_DIR changes), and a build seeing them would differ from
    // the outer `cargo` one and recompile the dependency tree each time the two alternate.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name.starts_with("CARGO_PKG_")
            || [
                "CARGO_MANIFEST_DIR",
                "CARGO_MANIFEST_PATH",
                "CARGO_CRATE_NAME",
                "CARGO_BIN_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "CARGO_RUSTC_CURRENT_DIR",
            ]
            .contains(&name.as_ref())
        {
            cmd.env_remove(name.as_ref());
        }
    }
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    match cmd.status() {
        Ok(status) if status.success() => {}
        other => panic!("building {bin} failed: {other:?}"),
    }
    let path = profile_dir.join(bin);
    if !path.exists() {
        panic!("{} missing after the build", path.display());
    }
    path
}

/// User + system CPU seconds of a process (`"self"`: this one), 0 if it is gone: what the
/// benchmarks divide by their work to tell what each process spent on it.
pub fn cpu_seconds(pid: impl std::fmt::Display) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    // After the command: state is field 3, utime 14 and stime 15 (1-based, whole line), in
    // clock ticks (USER_HZ, 100 on Linux).
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i)?.parse::<f64>().ok())
        .sum();
    ticks / 100.0
}

/// Resident set size of a process (`"self"`: this one) in MiB, 0 if it is gone: what the
/// benchmarks report as a process's memory.
pub fn rss_mb(pid: impl std::fmt::Display) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

/// The TCP connections process `pid` holds on its local `port` with `peer` at the other end, in
/// any state but LISTEN, read from `/proc`: what a server really keeps open (its sockets), not
/// what its clients believe (a connection waiting in the kernel's backlog is no one's yet).
pub fn tcp_connections(pid: u32, port: u16, peer: std::net::Ipv4Addr) -> usize {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|link| {
            let link = link.to_str()?;
            Some(link.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    // `sl local rem st … inode`: addresses are `HEX_IP:HEX_PORT`, the IP as the kernel's
    // network-order word printed in host order; state 0A is LISTEN. The table is read in pages
    // while sockets come and go, so one can be listed twice: count inodes, not lines.
    let address = |field: &str| -> Option<(std::net::Ipv4Addr, u16)> {
        let (ip, port) = field.split_once(':')?;
        let ip = u32::from_str_radix(ip, 16).ok()?.to_ne_bytes();
        Some((ip.into(), u16::from_str_radix(port, 16).ok()?))
    };
    let held: std::collections::HashSet<&str> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            (f.len() > 9
                && f[3] != "0A"
                && inodes.contains(f[9])
                && address(f[1]).is_some_and(|(_, p)| p == port)
                && address(f[2]).is_some_and(|(ip, _)| ip == peer))
            .then_some(f[9])
        })
        .collect();
    held.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_is_this_process_memory_and_zero_for_a_process_that_is_gone() {
        let before = rss_mb("self");
        assert!(before > 0.0, "{before}");
        // 64 MiB touched page by page is resident.
        let held = vec![1u8; 64 << 20];
        let after = rss_mb("self");
        assert!(after >= before + 32.0, "{before} → {after}");
        drop(held);
        assert_eq!(rss_mb(u32::MAX), 0.0);
    }

    #[test]
    fn cpu_seconds_grow_with_work_and_are_zero_for_a_process_that_is_gone() {
        let before = cpu_seconds("self");
        let started = std::time::Instant::now();
        let mut x = 0u64;
        // Work until the kernel's tick-based accounting moves, whatever share of the CPU this
        // thread gets on a loaded machine; the deadline only bounds a failure.
        while cpu_seconds("self") <= before
            && started.elapsed() < std::time::Duration::from_secs(30)
        {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
        }
        assert!(
            cpu_seconds("self") > before,
            "no CPU counted after 30 s of work ({x})"
        );
        // Above the kernel's largest pid (2^22): never a live process.
        assert_eq!(cpu_seconds(4_194_305u32), 0.0);
    }
}
