//! Free loopback ports for the processes the tests start (etcd, kube-apiserver, controllers).
//!
//! A port found by binding port 0 and closing the socket is a race twice over: the kernel may
//! hand the same ephemeral port to the next `bind(0)` (two processes of one control plane can
//! be given the same port), and any outgoing connection may take it before the process we start
//! binds it. So ports come from *below* the kernel's ephemeral range, where neither happens,
//! each is handed out at most once per test process, and each is checked to be free on
//! 127.0.0.1 when handed out.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

/// The lowest port handed out: above the well-known and most registered service ports.
const LOWEST: u32 = 10_000;
/// The kernel's ephemeral range starts here unless it says otherwise.
const DEFAULT_EPHEMERAL_START: u32 = 32_768;

/// How many ports have been handed out by this process (the next one's offset).
static HANDED_OUT: AtomicU32 = AtomicU32::new(0);

/// The first port of the kernel's ephemeral range, which `bind(0)` and outgoing connections use.
fn ephemeral_start() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .filter(|start| *start > LOWEST + 1_000)
        .unwrap_or(DEFAULT_EPHEMERAL_START)
}

/// The `n`th candidate port of a process: test binaries that run at the same time start at
/// different points of the range (by process id) and walk it in order, wrapping.
fn candidate(n: u32, pid: u32, span: u32) -> u16 {
    let start = pid.wrapping_mul(7_919) % span;
    // `LOWEST + span` is at most 65 535, so the sum fits a u16.
    u16::try_from(LOWEST + (start + n) % span).unwrap_or(u16::MAX)
}

/// A loopback TCP port that nothing listens on, outside the kernel's ephemeral range, never
/// handed out before by this process.
///
/// # Panics
/// When every port of the range is taken (test set-up, not input).
pub fn free_port() -> u16 {
    let span = ephemeral_start().min(65_536) - LOWEST;
    let pid = std::process::id();
    for _ in 0..span {
        let port = candidate(HANDED_OUT.fetch_add(1, Ordering::Relaxed), pid, span);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {LOWEST}..{}", LOWEST + span);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn candidates_stay_below_the_ephemeral_range_and_do_not_repeat_within_a_lap() {
        let span = DEFAULT_EPHEMERAL_START - LOWEST;
        let ports: HashSet<u16> = (0..span).map(|n| candidate(n, 4_242, span)).collect();
        assert_eq!(ports.len() as u32, span);
        assert!(
            ports
                .iter()
                .all(|p| u32::from(*p) >= LOWEST && u32::from(*p) < DEFAULT_EPHEMERAL_START)
        );
    }

    #[test]
    fn ports_handed_out_are_distinct_and_bindable() {
        let ports: Vec<u16> = (0..64).map(|_| free_port()).collect();
        assert_eq!(ports.iter().collect::<HashSet<_>>().len(), ports.len());
        for port in ports {
            assert!(u32::from(port) < ephemeral_start());
            TcpListener::bind(("127.0.0.1", port)).unwrap();
        }
    }

    #[test]
    fn a_port_in_use_is_skipped() {
        let next = candidate(
            HANDED_OUT.load(Ordering::Relaxed),
            std::process::id(),
            ephemeral_start() - LOWEST,
        );
        let _held = TcpListener::bind(("127.0.0.1", next));
        assert_ne!(free_port(), next);
    }
}
