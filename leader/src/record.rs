//! The pure part of leader election: reading a Lease spec and computing the next one.
//!
//! Owns the decisions client-go's `tryAcquireOrRenew` and `release` make, on plain data: who holds
//! the Lease, whether it has expired *as observed by this process*, and which fields a renewal, a
//! takeover or a release writes. Never touches the API server or a clock; callers pass `now`.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use tokio::time::Instant;

/// What this process should do with a Lease it has just read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// We hold it: renew, keeping `acquireTime` and `leaseTransitions`.
    Renew,
    /// It is vacant (no holder, e.g. released) or expired: take it, one more transition.
    Take,
    /// Someone else holds it and it has not expired for us yet.
    HeldByOther {
        /// The current holder.
        holder: String,
        /// When we may take it over if nothing changes before.
        expires_at: Instant,
    },
}

/// The holder, treating an absent and an empty `holderIdentity` alike (client-go writes `""`
/// on release, we clear the field).
pub fn holder(spec: &LeaseSpec) -> Option<&str> {
    spec.holder_identity.as_deref().filter(|h| !h.is_empty())
}

/// How long the Lease is valid after it was observed to change.
///
/// The holder's own `leaseDurationSeconds` wins, as in client-go, so a released Lease (1 s) is
/// free almost at once. A missing or non-positive value falls back to our configured duration
/// instead of client-go's zero: a malformed record must not let us take a live Lease.
pub fn validity(spec: &LeaseSpec, fallback: Duration) -> Duration {
    match spec.lease_duration_seconds {
        Some(secs) if secs > 0 => Duration::from_secs(secs.unsigned_abs().into()),
        _ => fallback,
    }
}

/// client-go's decision: expiry is judged by *our* clock from when *we* first saw this version of
/// the record (`observed_at`), never from `renewTime`, so clock skew between nodes cannot make a
/// standby take a live Lease.
pub fn verdict(
    spec: &LeaseSpec,
    observed_at: Instant,
    identity: &str,
    now: Instant,
    fallback: Duration,
) -> Verdict {
    match holder(spec) {
        None => Verdict::Take,
        Some(h) if h == identity => Verdict::Renew,
        Some(h) => {
            let expires_at = observed_at + validity(spec, fallback);
            if now < expires_at {
                Verdict::HeldByOther {
                    holder: h.to_owned(),
                    expires_at,
                }
            } else {
                Verdict::Take
            }
        }
    }
}

/// The spec a renewal writes: a new `renewTime`, everything else as it was.
pub fn renewed(old: &LeaseSpec, identity: &str, lease_seconds: i32, now: MicroTime) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(identity.to_owned()),
        lease_duration_seconds: Some(lease_seconds),
        renew_time: Some(now.clone()),
        acquire_time: old.acquire_time.clone().or(Some(now)),
        lease_transitions: old.lease_transitions.or(Some(0)),
        ..old.clone()
    }
}

/// The spec a takeover writes; `old` is `None` when the Lease does not exist yet (the first
/// holder starts at zero transitions, as in client-go).
pub fn taken(
    old: Option<&LeaseSpec>,
    identity: &str,
    lease_seconds: i32,
    now: MicroTime,
) -> LeaseSpec {
    let transitions = old.map_or(0, |o| o.lease_transitions.unwrap_or(0).saturating_add(1));
    LeaseSpec {
        holder_identity: Some(identity.to_owned()),
        lease_duration_seconds: Some(lease_seconds),
        acquire_time: Some(now.clone()),
        renew_time: Some(now),
        lease_transitions: Some(transitions),
        ..old.cloned().unwrap_or_default()
    }
}

/// The spec a release writes (client-go's ReleaseOnCancel): no holder and a 1 s duration, so a
/// standby takes over at its next attempt instead of waiting out the full lease duration.
pub fn released(old: &LeaseSpec, now: MicroTime) -> LeaseSpec {
    LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        acquire_time: Some(now.clone()),
        renew_time: Some(now),
        lease_transitions: old.lease_transitions,
        ..old.clone()
    }
}

/// Until when a process may act as leader after a successful write that it *started* at
/// `write_started`.
///
/// Counting from the start of the request (not its answer) keeps the bound safe: the API server
/// stored the write after it was sent, other replicas saw it even later, and they wait
/// `lease_duration > renew_deadline` from then.
pub fn leading_until(write_started: Instant, renew_deadline: Duration) -> Instant {
    write_started + renew_deadline
}

/// The deadline of one attempt that starts at `now`: never past the end of our leadership, so a
/// hanging request cannot keep us acting as leader; otherwise `renew_deadline`, as client-go
/// bounds each attempt.
pub fn attempt_deadline(
    now: Instant,
    leading_until: Option<Instant>,
    renew_deadline: Duration,
) -> Instant {
    let own = now + renew_deadline;
    leading_until.map_or(own, |until| until.min(own))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    const LD: Duration = Duration::from_secs(15);

    fn at(secs: i64) -> MicroTime {
        MicroTime(Timestamp::from_second(1_700_000_000 + secs).unwrap())
    }

    fn held_by(who: &str, secs: i32, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(who.into()),
            lease_duration_seconds: Some(secs),
            acquire_time: Some(at(0)),
            renew_time: Some(at(5)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_live_lease_of_another_holder_expires_from_our_observation() {
        let seen = Instant::now();
        let spec = held_by("other", 15, 2);
        let v = verdict(&spec, seen, "me", seen + Duration::from_secs(14), LD);
        assert_eq!(
            v,
            Verdict::HeldByOther {
                holder: "other".into(),
                expires_at: seen + Duration::from_secs(15)
            }
        );
        assert_eq!(
            verdict(&spec, seen, "me", seen + Duration::from_secs(15), LD),
            Verdict::Take
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_holders_duration_wins_so_a_released_lease_is_free_at_once() {
        let seen = Instant::now();
        let short = held_by("other", 1, 0);
        assert_eq!(
            verdict(&short, seen, "me", seen + Duration::from_secs(1), LD),
            Verdict::Take
        );
        let released = released(&held_by("other", 15, 4), at(9));
        assert_eq!(verdict(&released, seen, "me", seen, LD), Verdict::Take);
    }

    #[tokio::test(start_paused = true)]
    async fn a_malformed_duration_falls_back_to_ours_instead_of_expiring_at_once() {
        let seen = Instant::now();
        for secs in [None, Some(0), Some(-3)] {
            let spec = LeaseSpec {
                lease_duration_seconds: secs,
                ..held_by("other", 1, 0)
            };
            assert!(matches!(
                verdict(&spec, seen, "me", seen + Duration::from_secs(14), LD),
                Verdict::HeldByOther { .. }
            ));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn our_own_lease_is_renewed_even_if_it_looks_expired() {
        let seen = Instant::now();
        let spec = held_by("me", 15, 1);
        assert_eq!(
            verdict(&spec, seen, "me", seen + Duration::from_secs(60), LD),
            Verdict::Renew
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_empty_holder_is_vacant() {
        let now = Instant::now();
        let spec = LeaseSpec {
            holder_identity: Some(String::new()),
            ..held_by("x", 15, 0)
        };
        assert_eq!(holder(&spec), None);
        assert_eq!(verdict(&spec, now, "me", now, LD), Verdict::Take);
    }

    #[test]
    fn renewal_keeps_acquire_time_and_transitions() {
        let old = held_by("me", 15, 3);
        let new = renewed(&old, "me", 15, at(20));
        assert_eq!(new.holder_identity.as_deref(), Some("me"));
        assert_eq!(new.acquire_time, Some(at(0)));
        assert_eq!(new.renew_time, Some(at(20)));
        assert_eq!(new.lease_transitions, Some(3));
        assert_eq!(new.lease_duration_seconds, Some(15));
    }

    #[test]
    fn takeover_counts_a_transition_and_restarts_acquire_time() {
        let new = taken(Some(&held_by("other", 15, 3)), "me", 3, at(30));
        assert_eq!(new.holder_identity.as_deref(), Some("me"));
        assert_eq!(new.acquire_time, Some(at(30)));
        assert_eq!(new.renew_time, Some(at(30)));
        assert_eq!(new.lease_transitions, Some(4));
        assert_eq!(new.lease_duration_seconds, Some(3));
        let first = taken(None, "me", 15, at(1));
        assert_eq!(first.lease_transitions, Some(0));
        assert_eq!(first.acquire_time, Some(at(1)));
    }

    #[test]
    fn release_clears_the_holder_and_shortens_the_lease_keeping_transitions() {
        let new = released(&held_by("me", 15, 7), at(40));
        assert_eq!(holder(&new), None);
        assert_eq!(new.lease_duration_seconds, Some(1));
        assert_eq!(new.lease_transitions, Some(7));
        assert_eq!(new.renew_time, Some(at(40)));
    }

    #[tokio::test(start_paused = true)]
    async fn leadership_ends_before_the_lease_can_expire_for_others() {
        let started = Instant::now();
        let rd = Duration::from_secs(10);
        let until = leading_until(started, rd);
        assert_eq!(until, started + rd);
        // Others count LD from when they saw the write, which is after it started.
        assert!(until < started + LD);
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_never_outlives_our_leadership() {
        let now = Instant::now();
        let rd = Duration::from_secs(10);
        assert_eq!(attempt_deadline(now, None, rd), now + rd);
        let soon = now + Duration::from_secs(3);
        assert_eq!(attempt_deadline(now, Some(soon), rd), soon);
        let late = now + Duration::from_secs(30);
        assert_eq!(attempt_deadline(now, Some(late), rd), now + rd);
    }
}
