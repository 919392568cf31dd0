//! Data-plane benchmark: lease-table updates and lookups at 250 000 leases, and the cost of
//! building a reply.
//!
//! Prints, best of several rounds: a whole 250k-lease snapshot applied; one lease delta and a
//! batch of 1 000 deltas into that pool (each copies the pool once); a packet-path lookup alone
//! and while another thread applies snapshots back to back (readers never wait, so the two stay
//! close); and DISCOVER→OFFER and REQUEST→ACK through the full handler (parse, decide, encode),
//! then again with the MTU and four classless routes asked for and sent (ratio printed).
//!
//! `cargo bench -p vmdhcp-agent --bench data_plane`; `VMDHCP_DATA_PLANE_ROUNDS`,
//! `VMDHCP_DATA_PLANE_LOOKUPS` and `VMDHCP_DATA_PLANE_REPLIES` set the rounds, the lookups timed
//! per round and the handler calls per round (defaults [`ROUNDS`], [`LOOKUPS`], [`REPLIES`]), so
//! that a small run (`scripts/bench-smoke.sh`, an unoptimised build) reaches the end quickly.
#![allow(clippy::print_stdout, clippy::unwrap_used, missing_docs)]

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dhcproto::Encodable;
use dhcproto::v4::{DhcpOption, Message, MessageType, OptionCode};
use vmdhcp_agent::dhcp::handler::{Action, handle};
use vmdhcp_agent::lease_table::LeaseTable;
use vmdhcp_agent::pools::{PoolDelta, PoolLeases};
use vmdhcp_core::fixtures::pool_config;
use vmdhcp_core::pool::{Binding, Lease, PoolConfig};
use vmdhcp_core::{MacAddr, NamespacedName};

const LEASES: u32 = 250_000;
const ROUNDS: usize = 5;
/// Lookups timed per round.
const LOOKUPS: u32 = 2_000_000;
/// Handler calls timed per round of each exchange.
const REPLIES: u32 = 200_000;

/// `name`'s value, or `default` when it is unset or not a number.
fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn name() -> NamespacedName {
    NamespacedName::new("bench", "pool").unwrap()
}

fn mac(i: u32) -> MacAddr {
    let b = i.to_be_bytes();
    MacAddr([0x02, 0, b[0], b[1], b[2], b[3]])
}

fn ip(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 0, 0, 0)) + 2 + i)
}

fn config() -> PoolConfig {
    PoolConfig {
        router: Some(Ipv4Addr::new(10, 0, 0, 1)),
        dns: vec![Ipv4Addr::new(10, 0, 0, 53)],
        domain_name: Some("example.test".into()),
        domain_search: vec!["example.test".into()],
        ntp: vec!["10.0.0.123".into()],
        lease_seconds: 3600,
        ..pool_config(&name().to_string()).with_subnet("10.0.0.0/14")
    }
}

fn snapshot() -> Vec<PoolLeases> {
    vec![PoolLeases {
        config: config(),
        leases: (0..LEASES).map(|i| (mac(i), Binding::ip(ip(i)))).collect(),
    }]
}

fn best<F: FnMut() -> Duration>(mut f: F) -> Duration {
    (0..env_or("VMDHCP_DATA_PLANE_ROUNDS", ROUNDS).max(1))
        .map(|_| f())
        .min()
        .unwrap()
}

fn lookups(table: &LeaseTable, n: u32) -> Duration {
    let pool_name = name();
    let start = Instant::now();
    for i in 0..n {
        let pool = table.pool(&pool_name).unwrap();
        black_box(pool.address_of(&mac(i.wrapping_mul(2_654_435_761) % LEASES)));
    }
    start.elapsed()
}

fn main() {
    let table = LeaseTable::new();
    let full = best(|| {
        let s = snapshot();
        let start = Instant::now();
        assert!(table.apply_snapshot(&s).is_empty());
        start.elapsed()
    });
    println!(
        "apply snapshot, {LEASES} leases:        {:>9.1} ms",
        full.as_secs_f64() * 1e3
    );

    let one = best(|| {
        let start = Instant::now();
        let delta = PoolDelta {
            upserted_leases: vec![Lease {
                options: None,
                ipv6: None,
                pool: name(),
                mac: mac(LEASES + 1),
                ip: ip(LEASES + 1),
                host_name: None,
            }],
            ..PoolDelta::default()
        };
        table.apply(&delta);
        start.elapsed()
    });
    println!(
        "one lease delta into {LEASES}:          {:>9.1} ms",
        one.as_secs_f64() * 1e3
    );
    let batch = best(|| {
        let delta = PoolDelta {
            upserted_leases: (0..1000)
                .map(|i| Lease {
                    options: None,
                    ipv6: None,
                    pool: name(),
                    mac: mac(LEASES + 10 + i),
                    ip: ip(LEASES + 10 + i),
                    host_name: None,
                })
                .collect(),
            ..PoolDelta::default()
        };
        let start = Instant::now();
        table.apply(&delta);
        start.elapsed()
    });
    println!(
        "1 000 deltas (one batch) into {LEASES}: {:>9.1} ms",
        batch.as_secs_f64() * 1e3
    );

    let n = env_or("VMDHCP_DATA_PLANE_LOOKUPS", LOOKUPS).max(1);
    let idle = best(|| lookups(&table, n));
    println!(
        "lookup, no writer:                     {:>9.1} ns",
        idle.as_nanos() as f64 / f64::from(n)
    );
    let table = Arc::new(table);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (table, stop) = (Arc::clone(&table), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut applied = 0u32;
            while !stop.load(Ordering::Relaxed) {
                table.apply_snapshot(&snapshot());
                applied += 1;
            }
            applied
        })
    };
    let busy = best(|| lookups(&table, n));
    stop.store(true, Ordering::Relaxed);
    let applied = writer.join().unwrap();
    println!(
        "lookup, snapshots applied meanwhile:   {:>9.1} ns   ({applied} snapshots applied)",
        busy.as_nanos() as f64 / f64::from(n)
    );

    let pool = table.pool(&name()).unwrap();
    let u = Ipv4Addr::UNSPECIFIED;
    let mut discover = Message::new_with_id(7, u, u, u, u, &mac(42).octets());
    discover
        .opts_mut()
        .insert(DhcpOption::MessageType(MessageType::Discover));
    discover
        .opts_mut()
        .insert(DhcpOption::ClientIdentifier(vec![1, 2, 0, 0, 0, 0, 42]));
    discover
        .opts_mut()
        .insert(DhcpOption::ParameterRequestList(vec![
            OptionCode::SubnetMask,
            OptionCode::Router,
            OptionCode::DomainNameServer,
            OptionCode::DomainName,
        ]));
    let mut request = discover.clone();
    request
        .opts_mut()
        .insert(DhcpOption::MessageType(MessageType::Request));
    request
        .opts_mut()
        .insert(DhcpOption::ServerIdentifier(Ipv4Addr::new(10, 0, 0, 1)));
    request
        .opts_mut()
        .insert(DhcpOption::RequestedIpAddress(ip(42)));
    let mut plain = Vec::new();
    for (label, msg) in [
        ("DISCOVER -> OFFER", &discover),
        ("REQUEST -> ACK", &request),
    ] {
        let ns = handler_ns(msg, &pool);
        plain.push(ns);
        println!("handler {label:<18}            {ns:>9.0} ns");
    }

    // The same exchanges on a pool that also sends an MTU and four classless routes (26, 121),
    // to a client that asks for them: the cost of the options beyond upstream's.
    let mut routed = config();
    routed.mtu = Some(1450);
    routed.routes = [
        "10.96.0.0/12",
        "172.16.0.0/16",
        "192.168.10.0/24",
        "10.200.1.0/25",
    ]
    .iter()
    .map(|d| vmdhcp_core::pool::Route {
        destination: d.parse().unwrap(),
        gateway: Ipv4Addr::new(10, 0, 0, 1),
    })
    .collect();
    table.apply(&PoolDelta {
        upserted_pools: vec![routed],
        ..PoolDelta::default()
    });
    let pool = table.pool(&name()).unwrap();
    let asking = |mut msg: Message| {
        msg.opts_mut().insert(DhcpOption::ParameterRequestList(vec![
            OptionCode::SubnetMask,
            OptionCode::Router,
            OptionCode::DomainNameServer,
            OptionCode::DomainName,
            OptionCode::InterfaceMtu,
            OptionCode::ClasslessStaticRoute,
        ]));
        msg
    };
    let exchanges = [
        ("DISCOVER -> OFFER", asking(discover)),
        ("REQUEST -> ACK", asking(request)),
    ];
    for ((label, msg), before) in exchanges.iter().zip(plain) {
        let ns = handler_ns(msg, &pool);
        println!(
            "handler {label:<18} +26 +121  {ns:>9.0} ns  ({:.2}x of the exchange without them)",
            ns / before
        );
    }
}

/// ns per `handle()` of `msg` on `pool`, best of [`ROUNDS`].
fn handler_ns(msg: &Message, pool: &vmdhcp_agent::lease_table::PoolSnapshot) -> f64 {
    let bytes = msg.to_vec().unwrap();
    let m = env_or("VMDHCP_DATA_PLANE_REPLIES", REPLIES).max(1);
    let t = best(|| {
        let start = Instant::now();
        for _ in 0..m {
            let out = handle(black_box(&bytes), pool, |_| false);
            assert!(matches!(out.action, Action::Reply(_)));
        }
        start.elapsed()
    });
    t.as_nanos() as f64 / f64::from(m)
}
