//! Span cost under each kind of log filter: how much a span enter and exit costs with the
//! static filter (`info`, a `Targets`) against the same levels through `EnvFilter` (forced by a
//! span directive that matches nothing), which tracks every span on every enter and exit.
//! Both run in this process, one after the other, with a span entered and left the way an
//! instrumented future is on every poll; the `EnvFilter` run is the reference.
//!
//! `cargo bench -p vmdhcp-telemetry --bench spans`
#![allow(clippy::print_stdout, clippy::unwrap_used, missing_docs)]

use std::hint::black_box;
use std::time::Instant;

use vmdhcp_telemetry::{LogArgs, dispatch};

const SPANS: u32 = 2_000;
const ENTERS: u32 = 500;

/// ns per enter + exit of an info span (with a field) under the filter `level`.
fn enter_exit_ns(level: &str) -> f64 {
    let args = LogArgs {
        log_level: Some(level.into()),
        ..Default::default()
    };
    let sub = dispatch(&args, std::io::sink, false, None).unwrap();
    tracing::dispatcher::with_default(&sub, || {
        let spans: Vec<tracing::Span> = (0..SPANS)
            .map(|i| tracing::info_span!("reconcile", object = i))
            .collect();
        let started = Instant::now();
        for _ in 0..ENTERS {
            for span in &spans {
                let _in = black_box(span.enter());
            }
        }
        started.elapsed().as_nanos() as f64 / f64::from(SPANS * ENTERS)
    })
}

fn main() {
    // Once each to warm up, then measured.
    enter_exit_ns("info,[none]=debug");
    enter_exit_ns("info");
    let reference = enter_exit_ns("info,[none]=debug");
    let static_ = enter_exit_ns("info");
    println!("span enter + exit, {SPANS} live spans, {} each:", ENTERS);
    println!("  EnvFilter (span directives possible): {reference:.1} ns (reference)");
    println!(
        "  Targets (target=level only):          {static_:.1} ns ({:.2}x)",
        static_ / reference
    );
}
