//! Which Linux capability a refused operation lacked.
//!
//! The agent runs as UID 0 with every capability dropped except the few the chart grants
//! (`agent.capabilities`: NET_ADMIN, NET_BIND_SERVICE, NET_RAW), so when the kernel refuses one of its
//! privileged operations with EPERM or EACCES, the likely cause is a container started without
//! the capability that operation needs. A bare "Permission denied" does not say which one; this
//! module owns that mapping and the sentence that names the capability and where to grant it.
//! The operations themselves (sockets, rtnetlink) stay with their modules, which attach a
//! [`Missing`] to their errors.

use std::fmt;
use std::io;

/// A capability one of the agent's operations needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capability {
    /// Changing addresses and link state of the pool interfaces (rtnetlink writes).
    NetAdmin,
    /// Binding UDP port 67, below `net.ipv4.ip_unprivileged_port_start`.
    NetBindService,
    /// Packet sockets, for the ARP announcements after a takeover (see [`crate::arp`]); also
    /// `SO_BINDTODEVICE`, on kernels older than 5.7.
    NetRaw,
}

const EPERM: i32 = 1;
const EACCES: i32 = 13;

impl Capability {
    /// Its number in the kernel's capability sets (`linux/capability.h`).
    pub fn bit(self) -> u32 {
        match self {
            Capability::NetBindService => 10,
            Capability::NetAdmin => 12,
            Capability::NetRaw => 13,
        }
    }

    /// Its name as the kernel and container runtimes spell it.
    pub fn name(self) -> &'static str {
        match self {
            Capability::NetAdmin => "CAP_NET_ADMIN",
            Capability::NetBindService => "CAP_NET_BIND_SERVICE",
            Capability::NetRaw => "CAP_NET_RAW",
        }
    }

    /// Its name in a Kubernetes `securityContext.capabilities` list (no `CAP_` prefix).
    pub fn kubernetes_name(self) -> &'static str {
        self.name().trim_start_matches("CAP_")
    }

    /// What an operation needing this capability lacked, given the error it failed with: the
    /// capability when the kernel refused for want of privilege (EPERM, EACCES) and this process
    /// does not hold it in its effective set; nothing otherwise (another error, or a refusal
    /// that came from elsewhere, such as a security module, which naming the capability would
    /// only hide).
    pub fn lacking(self, error: &io::Error) -> Missing {
        self.lacking_errno(error.raw_os_error())
    }

    /// [`Capability::lacking`] for an error number (positive, as `errno`).
    pub fn lacking_errno(self, errno: Option<i32>) -> Missing {
        judge(self, errno, effective_capabilities())
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The capability an operation lacked, if its error says so. Displays as nothing, or as a clause
/// to append to the error: " — the agent lacks CAP_X: grant X in …".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Missing(pub Option<Capability>);

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            None => Ok(()),
            Some(cap) => write!(
                f,
                " — the agent lacks {cap}: grant {} in the container's \
                 securityContext.capabilities.add (chart value agent.capabilities)",
                cap.kubernetes_name()
            ),
        }
    }
}

/// The decision, without I/O: `effective` is the process's effective capability set, `None`
/// when it cannot be read (then a privilege error is blamed on the capability).
fn judge(cap: Capability, errno: Option<i32>, effective: Option<u64>) -> Missing {
    let refused = matches!(errno, Some(EPERM | EACCES));
    let held = effective.is_some_and(|set| set & (1u64 << cap.bit()) != 0);
    Missing((refused && !held).then_some(cap))
}

/// This process's effective capabilities, from `/proc/self/status`.
fn effective_capabilities() -> Option<u64> {
    parse_cap_eff(&std::fs::read_to_string("/proc/self/status").ok()?)
}

/// The `CapEff:` line of a `/proc/<pid>/status` text, as a bit set.
fn parse_cap_eff(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE: Option<u64> = Some(0);
    /// What the chart grants: NET_ADMIN, NET_BIND_SERVICE and NET_RAW.
    const CHART: Option<u64> = Some(0x3400);

    #[test]
    fn a_privilege_error_names_the_capability_the_process_lacks() {
        for errno in [EPERM, EACCES] {
            assert_eq!(
                judge(Capability::NetBindService, Some(errno), NONE),
                Missing(Some(Capability::NetBindService))
            );
        }
        assert_eq!(
            judge(Capability::NetAdmin, Some(EPERM), Some(0x400)),
            Missing(Some(Capability::NetAdmin)),
            "NET_BIND_SERVICE alone does not cover NET_ADMIN"
        );
        assert_eq!(
            judge(Capability::NetRaw, Some(EPERM), Some(0x1400)),
            Missing(Some(Capability::NetRaw)),
            "NET_ADMIN and NET_BIND_SERVICE do not cover packet sockets"
        );
        // An unreadable capability set: the refusal is still blamed on the capability.
        assert_eq!(
            judge(Capability::NetAdmin, Some(EPERM), None),
            Missing(Some(Capability::NetAdmin))
        );
    }

    #[test]
    fn other_errors_and_held_capabilities_name_nothing() {
        const EADDRINUSE: i32 = 98;
        const ENODEV: i32 = 19;
        for errno in [None, Some(EADDRINUSE), Some(ENODEV)] {
            assert_eq!(
                judge(Capability::NetBindService, errno, NONE),
                Missing(None)
            );
        }
        // Held, yet refused: a security module or seccomp said no, not the capability set.
        assert_eq!(
            judge(Capability::NetBindService, Some(EACCES), CHART),
            Missing(None)
        );
        assert_eq!(
            judge(Capability::NetAdmin, Some(EPERM), CHART),
            Missing(None)
        );
    }

    #[test]
    fn the_clause_names_the_capability_and_where_to_grant_it() {
        assert_eq!(Missing(None).to_string(), "");
        let text = Missing(Some(Capability::NetBindService)).to_string();
        assert_eq!(
            text,
            " — the agent lacks CAP_NET_BIND_SERVICE: grant NET_BIND_SERVICE in the container's \
             securityContext.capabilities.add (chart value agent.capabilities)"
        );
        assert_eq!(Capability::NetAdmin.kubernetes_name(), "NET_ADMIN");
        assert_eq!(Capability::NetRaw.to_string(), "CAP_NET_RAW");
    }

    #[test]
    fn cap_eff_is_read_from_proc_status() {
        let status = "Name:\tvm-dhcp-agent\nCapInh:\t0000000000000000\nCapPrm:\t0000000000001400\n\
                      CapEff:\t0000000000001400\nCapBnd:\t0000000000001400\n";
        assert_eq!(parse_cap_eff(status), Some(0x1400));
        assert_eq!(parse_cap_eff("Name:\tx\n"), None);
        assert_eq!(parse_cap_eff("CapEff:\tnot-hex\n"), None);
        // This process's own set is readable on Linux.
        assert!(effective_capabilities().is_some());
    }
}
