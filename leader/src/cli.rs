//! The election flags both binaries take, with client-go's defaults, so controller and agent
//! replicas are tuned the same way (`--lease-duration-seconds` etc.).

use std::time::Duration;

use crate::ElectionConfig;

/// `--no-leader-election` and the three timings, in whole seconds.
#[derive(clap::Args, Clone, Debug)]
pub struct ElectionArgs {
    /// Act as leader without election (a single replica, local runs).
    #[arg(long)]
    pub no_leader_election: bool,
    /// Seconds a Lease stays valid without renewal.
    #[arg(long, default_value_t = 15)]
    pub lease_duration_seconds: u64,
    /// Seconds a leader keeps trying to renew before it stops acting.
    #[arg(long, default_value_t = 10)]
    pub renew_deadline_seconds: u64,
    /// Seconds between election attempts.
    #[arg(long, default_value_t = 2)]
    pub retry_period_seconds: u64,
}

impl ElectionArgs {
    /// The election config for the Lease `namespace/name` and this replica's `identity`, or
    /// `None` with `--no-leader-election`. Validation happens when the elector is built.
    pub fn config(&self, namespace: &str, name: &str, identity: &str) -> Option<ElectionConfig> {
        if self.no_leader_election {
            return None;
        }
        let mut config = ElectionConfig::new(namespace, name, identity);
        config.lease_duration = Duration::from_secs(self.lease_duration_seconds);
        config.renew_deadline = Duration::from_secs(self.renew_deadline_seconds);
        config.retry_period = Duration::from_secs(self.retry_period_seconds);
        Some(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        election: ElectionArgs,
    }

    #[test]
    fn defaults_are_client_go_s_and_flags_override_them() {
        let cli = Cli::parse_from(["x"]);
        let config = cli.election.config("ns", "lease", "me").unwrap();
        assert_eq!(config, ElectionConfig::new("ns", "lease", "me"));
        let cli = Cli::parse_from([
            "x",
            "--lease-duration-seconds=6",
            "--retry-period-seconds=1",
        ]);
        let config = cli.election.config("ns", "lease", "me").unwrap();
        assert_eq!(config.lease_duration, Duration::from_secs(6));
        assert_eq!(config.retry_period, Duration::from_secs(1));
        assert!(
            Cli::parse_from(["x", "--no-leader-election"])
                .election
                .config("ns", "lease", "me")
                .is_none()
        );
    }
}
