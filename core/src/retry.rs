//! How everything that fails retries: one exponential policy with jitter ([`exponential`], from
//! the `backon` crate) for the agents' stream reconnects, the DHCP servers' rebinds and the
//! controller's per-object reconcile retries, and the standby's jittered retry period of the
//! Lease elector ([`between`], client-go's `wait.Jitter`). Jitter matters here: agents
//! reconnecting to the controller and replicas retrying a Lease would otherwise, having failed
//! together, retry together.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use rand::Rng;

/// An endless series of retry delays ([`exponential`]); `next()` is the wait before the next
/// attempt.
pub type Delays = backon::ExponentialBackoff;

/// Retry delays that double from `min` on each failure, each with a random part: a delay `d`
/// of the doubling series (capped at `max / 2`) is waited as a draw from `[d, 2d)`, so every
/// delay lies within `[min, max]` (when `max ≥ 2·min`) and a fleet that failed at once spreads
/// out. Endless: callers stop on their own terms and start a new series after a success.
pub fn exponential(min: Duration, max: Duration) -> Delays {
    ExponentialBuilder::default()
        .with_min_delay(min)
        .with_max_delay((max / 2).max(min))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}

/// A duration drawn uniformly from `[min, max]`; `min` when the range is empty (`max <= min`),
/// so a caller whose ceiling has not grown past its floor waits the floor.
pub fn between(min: Duration, max: Duration) -> Duration {
    if max <= min {
        return min;
    }
    rand::rng().random_range(min..=max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_delays_double_within_bounds_with_jitter() {
        let (min, max) = (Duration::from_millis(200), Duration::from_secs(30));
        let runs: Vec<Vec<Duration>> = (0..50)
            .map(|_| exponential(min, max).take(16).collect())
            .collect();
        for run in &runs {
            assert!(run.iter().all(|d| (min..=max).contains(d)), "{run:?}");
            // Attempt n waits at least min·2^n, until the cap.
            for (n, d) in run.iter().enumerate().take(6) {
                assert!(*d >= min * (1 << n), "attempt {n}: {d:?}");
            }
            // Late attempts sit at the top half of the range.
            assert!(run[15] >= max / 2, "{run:?}");
        }
        // Two fleets members do not wait the same.
        let lates: Vec<Duration> = runs.iter().map(|r| r[15]).collect();
        assert!(lates.iter().any(|d| *d != lates[0]), "no jitter: {lates:?}");
    }

    #[test]
    fn draws_stay_within_the_bounds_and_spread() {
        let (min, max) = (Duration::from_millis(500), Duration::from_secs(8));
        let draws: Vec<Duration> = (0..1000).map(|_| between(min, max)).collect();
        assert!(draws.iter().all(|d| (min..=max).contains(d)), "{draws:?}");
        // Spread over the range, not stuck at one end: both halves are hit.
        let middle = (min + max) / 2;
        assert!(draws.iter().any(|d| *d < middle) && draws.iter().any(|d| *d > middle));
    }

    #[test]
    fn an_empty_range_is_its_floor() {
        let s = Duration::from_secs(2);
        assert_eq!(between(s, s), s);
        assert_eq!(between(s, Duration::from_secs(1)), s);
        assert_eq!(between(Duration::ZERO, Duration::ZERO), Duration::ZERO);
    }
}
