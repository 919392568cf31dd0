//! Random spreads for retry delays: agents reconnecting to the controller and replicas retrying
//! a Lease would otherwise, having failed together, retry together. The delay policies stay with
//! their callers (each documents its own); this module only draws the random part, from the
//! thread-local generator of the `rand` crate.

use std::time::Duration;

use rand::Rng;

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
