//! Leader election settings and the invariants between them.
//!
//! Owns only validation; the meaning of each duration is enforced by [`crate::elector`].

use std::time::Duration;

use crate::ElectionError;

/// client-go's default lease duration: how long a standby waits after it last saw the Lease
/// change before it may take it over.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
/// client-go's default renew deadline: how long a leader keeps acting without a successful renewal.
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// client-go's default retry period: the interval between attempts to acquire or renew.
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);

/// Where the Lease lives, who we are, and the three client-go timings.
///
/// Invariant (checked by [`ElectionConfig::validate`]):
/// `lease_duration > renew_deadline > retry_period > 0`. The gap between `lease_duration` and
/// `renew_deadline` is the safety margin between "the old leader stopped acting" and "a standby
/// may take over"; `renew_deadline > retry_period` gives a leader more than one renewal attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElectionConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease; all replicas that compete must use the same one.
    pub name: String,
    /// This replica's identity (the pod name), written as `holderIdentity`. Must be unique among
    /// the replicas: two processes with one identity would both believe they hold the Lease.
    pub identity: String,
    /// Written as `leaseDurationSeconds`, so it must be a whole number of seconds.
    pub lease_duration: Duration,
    /// A leader that has not renewed successfully for this long stops being leader.
    pub renew_deadline: Duration,
    /// Interval between attempts; a released Lease is picked up within about one period.
    pub retry_period: Duration,
}

impl ElectionConfig {
    /// A config with client-go's default timings (15 s / 10 s / 2 s).
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_deadline: DEFAULT_RENEW_DEADLINE,
            retry_period: DEFAULT_RETRY_PERIOD,
        }
    }

    /// Checks the invariants the fencing guarantee depends on; the error says which one broke.
    pub fn validate(&self) -> Result<(), ElectionError> {
        let invalid = |reason: String| Err(ElectionError::InvalidConfig { reason });
        for (field, value) in [
            ("namespace", &self.namespace),
            ("name", &self.name),
            ("identity", &self.identity),
        ] {
            if value.is_empty() {
                return invalid(format!("{field} must not be empty"));
            }
        }
        if self.retry_period.is_zero() {
            return invalid("retry_period must be greater than zero".into());
        }
        if self.renew_deadline <= self.retry_period {
            return invalid(format!(
                "renew_deadline ({:?}) must be greater than retry_period ({:?})",
                self.renew_deadline, self.retry_period
            ));
        }
        if self.lease_duration <= self.renew_deadline {
            return invalid(format!(
                "lease_duration ({:?}) must be greater than renew_deadline ({:?})",
                self.lease_duration, self.renew_deadline
            ));
        }
        if self.lease_duration.subsec_nanos() != 0 {
            return invalid(format!(
                "lease_duration ({:?}) must be whole seconds: it is written as leaseDurationSeconds",
                self.lease_duration
            ));
        }
        if self.lease_duration_seconds().is_none() {
            return invalid(format!(
                "lease_duration ({:?}) does not fit leaseDurationSeconds (i32)",
                self.lease_duration
            ));
        }
        Ok(())
    }

    /// `lease_duration` as the Lease field, if it fits.
    pub(crate) fn lease_duration_seconds(&self) -> Option<i32> {
        i32::try_from(self.lease_duration.as_secs()).ok()
    }

    /// `namespace/name`, for logs and errors.
    pub fn lease_ref(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(ld: u64, rd: u64, rp: u64) -> ElectionConfig {
        ElectionConfig {
            lease_duration: Duration::from_millis(ld),
            renew_deadline: Duration::from_millis(rd),
            retry_period: Duration::from_millis(rp),
            ..ElectionConfig::new("ns", "lease", "me")
        }
    }

    fn reason(c: &ElectionConfig) -> String {
        match c.validate() {
            Err(ElectionError::InvalidConfig { reason }) => reason,
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_client_gos_and_valid() {
        let c = ElectionConfig::new("ns", "lease", "me");
        assert_eq!(
            (c.lease_duration, c.renew_deadline, c.retry_period),
            (
                Duration::from_secs(15),
                Duration::from_secs(10),
                Duration::from_secs(2)
            )
        );
        c.validate().unwrap();
        cfg(3000, 2000, 500).validate().unwrap();
    }

    #[test]
    fn order_of_durations_is_enforced() {
        assert!(reason(&cfg(3000, 2000, 0)).contains("retry_period must be greater than zero"));
        assert!(reason(&cfg(3000, 500, 500)).contains("renew_deadline"));
        assert!(reason(&cfg(2000, 2000, 500)).contains("lease_duration"));
        assert!(reason(&cfg(1000, 2000, 500)).contains("greater than renew_deadline"));
    }

    #[test]
    fn lease_duration_must_be_whole_seconds_that_fit_the_field() {
        assert!(reason(&cfg(3500, 2000, 500)).contains("whole seconds"));
        let mut c = cfg(3000, 2000, 500);
        c.lease_duration = Duration::from_secs(u64::from(u32::MAX));
        assert!(reason(&c).contains("does not fit"));
    }

    #[test]
    fn names_must_not_be_empty() {
        let mut c = cfg(3000, 2000, 500);
        c.identity.clear();
        assert_eq!(reason(&c), "identity must not be empty");
        let mut c = cfg(3000, 2000, 500);
        c.namespace.clear();
        assert_eq!(reason(&c), "namespace must not be empty");
    }
}
