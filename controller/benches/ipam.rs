//! IPAM benchmark: allocate / release cost against pool size.
//!
//! Fills and drains a /24, a /16 and a /12 pool with the same operations and prints ns per
//! operation and the ratio of each pool to the /24 (the reference run, same process): the
//! allocator is O(log n), so the ratios stay near 1 while the pools grow 65 536×.
//!
//! `cargo bench -p vmdhcp-controller --bench ipam`
#![allow(clippy::print_stdout, clippy::unwrap_used, missing_docs)]
// A benchmark measures the real clock, never a paused one (controller/clippy.toml bans the type
// in the controller's code for that reason).
#![allow(clippy::disallowed_types)]

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::Instant;

use vmdhcp_controller::ipam::PoolAllocator;
use vmdhcp_core::MacAddr;
use vmdhcp_core::pool::PoolRange;

fn mac(i: u32) -> MacAddr {
    let b = i.to_be_bytes();
    MacAddr([0x02, 0, b[0], b[1], b[2], b[3]])
}

fn range(cidr: &str) -> PoolRange {
    let subnet: ipnet::Ipv4Net = cidr.parse().unwrap();
    let first = Ipv4Addr::from(u32::from(subnet.network()) + 1);
    let start = Ipv4Addr::from(u32::from(subnet.network()) + 2);
    let end = Ipv4Addr::from(u32::from(subnet.broadcast()) - 1);
    PoolRange::new(
        "bench/pool".parse().unwrap(),
        subnet,
        (start, end),
        first,
        Some(first),
        vec![],
    )
    .unwrap()
}

/// Allocates `ops` addresses, releases every other one, re-allocates them, then a batch of
/// requested addresses; returns ns per operation.
fn run(cidr: &str, ops: u32) -> f64 {
    let mut a = PoolAllocator::new(range(cidr));
    // Pre-fill: pools in service are mostly full, with holes.
    let size = a.available() as u32;
    for i in 0..size / 2 {
        a.allocate(mac(1_000_000 + i)).unwrap();
    }
    let t = Instant::now();
    let mut got = Vec::with_capacity(ops as usize);
    for i in 0..ops {
        got.push(a.allocate(mac(i)).unwrap());
    }
    for ip in got.iter().step_by(2) {
        a.release(*ip).unwrap();
    }
    for i in 0..ops / 2 {
        black_box(a.allocate(mac(ops + i)).unwrap());
    }
    for ip in got.iter().step_by(2) {
        let holder = a.release(*ip).unwrap();
        black_box(a.allocate_requested(holder.unwrap_or(mac(0)), *ip).ok());
    }
    let total_ops = ops + ops / 2 + ops / 2 + ops;
    t.elapsed().as_nanos() as f64 / f64::from(total_ops)
}

fn main() {
    let ops = 100;
    // Warm up, then take the best of several rounds per size.
    let best = |cidr: &str| (0..7).map(|_| run(cidr, ops)).fold(f64::INFINITY, f64::min);
    run("10.0.0.0/24", ops);
    let sizes = [
        ("10.0.0.0/24", "/24"),
        ("10.0.0.0/16", "/16"),
        ("10.0.0.0/12", "/12"),
    ];
    let rows: Vec<(&str, usize, f64)> = sizes
        .into_iter()
        .map(|(cidr, label)| (label, range(cidr).subnet().hosts().count(), best(cidr)))
        .collect();
    let reference = rows[0].2;
    println!(
        "{:<8} {:>10} {:>12} {:>8}",
        "pool", "addresses", "ns/op", "vs /24"
    );
    for (label, size, ns) in rows {
        println!("{label:<8} {size:>10} {ns:>12.1} {:>7.2}x", ns / reference);
    }
}
