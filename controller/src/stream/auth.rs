//! Who may read the config stream: callers present a ServiceAccount token (`authorization:
//! Bearer …`), which the API server verifies (TokenReview) for our audience; only the agent
//! ServiceAccount is served. Anyone else learns nothing about pools, MACs or addresses.
//!
//! Every TokenReview is a write to the API server under the controller's own ServiceAccount, so
//! a caller must not be able to make us send many. Gates stand before one:
//! - a local look at the token ([`precheck`]): a JWT of bounded size, not `alg: none`, issued
//!   for our audience and not expired;
//! - its signature, checked against the cluster's published signing keys
//!   ([`super::keys::IssuerKeys`]): a forgery is refused here, and a genuine token of any
//!   ServiceAccount but the agents' is refused from its own claims, so only the agents' tokens
//!   ever reach a review (where the keys cannot be read, every token goes on, behind the
//!   budgets below);
//! - the verdict cache, per token (by its SHA-256, never the token itself): a verified token is
//!   trusted until it expires (at most [`VERIFIED_TTL_MAX`]), so a fleet costs one review per
//!   agent token, and an API server outage does not cut agents already verified. It cannot be
//!   flooded away: verified tokens live in a cache of their own that only the agents' tokens
//!   enter, refusals in another (bounded, short-lived), and concurrent checks of one token share
//!   one review. A Report on the connection of a verified Watch, with its token, needs no check;
//! - per-peer fairness ([`PEER_RATE`]) in front of a global budget of reviews ([`ReviewRate`]):
//!   past either, a new token is refused as retryable, so one flooding address cannot take the
//!   reviews another agent needs, and all of them together cost at most the budget.
//!
//! Refusals before a review are counted by reason and logged at debug only (a flood must not
//! flood the logs); the reviews sent are counted by result.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::PostParams;
use kube::{Api, Client};
use moka::future::Cache;
use parking_lot::Mutex;
use tokio::time::Instant;
use tonic::Status;
use tonic::metadata::MetadataMap;
use tracing::{debug, warn};

use super::jwt::Jwt;
use super::keys::{IssuerKeys, Judgement, KeysError};
use crate::metrics::TokenCounts;

/// How long a positive verdict is trusted at most, whatever the token's expiry: a token whose
/// pod or ServiceAccount is deleted is refused again within this.
pub const VERIFIED_TTL_MAX: Duration = Duration::from_secs(3600);
/// What one address may spend of the review budget: a few agent pods (each needs one review
/// per token, once an hour or so) share a node's address at most.
pub const PEER_RATE: ReviewRate = ReviewRate {
    per_second: 1,
    burst: 4,
};
/// Addresses whose review budgets are kept at most (an idle one is forgotten after
/// [`PEER_IDLE`]).
const PEERS_MAX: u64 = 16_384;
/// How long an address's budget is kept after its last use.
const PEER_IDLE: Duration = Duration::from_secs(600);
/// How long a refusal is remembered (bounds the TokenReviews a hostile caller can cause).
const DENY_TTL: Duration = Duration::from_secs(10);
/// Verified tokens kept at most (agents' tokens only: a few per agent pod per hour).
const VERIFIED_MAX: u64 = 4096;
/// Refusals kept at most.
const REFUSED_MAX: u64 = 16_384;
/// The TokenReview extra naming the pod a bound token belongs to.
const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";
/// How far past its `exp` a token is still sent for review: clock skew between the controller
/// and the API server, which has the last word.
const EXPIRY_LEEWAY: Duration = Duration::from_secs(60);
/// The prefix of a ServiceAccount's user name, `system:serviceaccount:<namespace>:<name>`.
const SERVICE_ACCOUNT_USER: &str = "system:serviceaccount:";

/// Why a caller is refused; each maps to a gRPC status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `authorization: Bearer` metadata.
    #[error("missing bearer token (metadata \"authorization: Bearer <ServiceAccount token>\")")]
    Missing,
    /// Not a JWT a ServiceAccount could hold; refused without a TokenReview.
    #[error("not a ServiceAccount token: {0}")]
    Malformed(String),
    /// Not signed by the cluster; refused without a TokenReview.
    #[error("not a token of this cluster: {0}")]
    Signature(KeysError),
    /// A JWT issued for other audiences; refused without a TokenReview.
    #[error("token issued for audiences {found:?}, not for audience {audience:?}")]
    Audience {
        /// The audience required.
        audience: String,
        /// The token's `aud`.
        found: Vec<String>,
    },
    /// A JWT past its `exp` (and the leeway); refused without a TokenReview.
    #[error("token expired at {expired} (seconds since the epoch)")]
    Expired {
        /// The token's `exp`.
        expired: i64,
    },
    /// The API server did not authenticate the token for our audience.
    #[error("token rejected for audience {audience:?}: {reason}")]
    Rejected {
        /// The audience required.
        audience: String,
        /// The API server's reason.
        reason: String,
    },
    /// A valid token of someone other than the agents.
    #[error("{user} may not read the config stream (only {allowed})")]
    Forbidden {
        /// The authenticated user.
        user: String,
        /// The user allowed.
        allowed: String,
        /// Decided from the token's own (verified) claims, without a TokenReview.
        locally: bool,
    },
    /// TokenReview failed; the caller may retry.
    #[error("cannot verify the token now: {0}")]
    Unavailable(String),
    /// The TokenReview budget is spent (many new tokens at once); the caller may retry.
    #[error(
        "too many new tokens to verify{} (budget {per_second} TokenReviews a second), retry later",
        if *.from_peer { " from this address" } else { "" }
    )]
    RateLimited {
        /// The budget's sustained rate.
        per_second: u32,
        /// The caller's address's share was spent, not the budget of all.
        from_peer: bool,
    },
}

impl AuthError {
    /// Why the caller was refused without a TokenReview (the metric's `reason`); `None` when a
    /// review decided (or failed).
    fn refused_before_review(&self) -> Option<&'static str> {
        match self {
            AuthError::Missing => Some("missing"),
            AuthError::Malformed(_) => Some("malformed"),
            AuthError::Signature(_) => Some("signature"),
            AuthError::Audience { .. } => Some("audience"),
            AuthError::Expired { .. } => Some("expired"),
            AuthError::Forbidden { locally: true, .. } => Some("forbidden"),
            AuthError::RateLimited { .. } => Some("rate_limited"),
            AuthError::Rejected { .. }
            | AuthError::Forbidden { locally: false, .. }
            | AuthError::Unavailable(_) => None,
        }
    }

    /// Says nothing about the token, only about now: never cached.
    fn is_transient(&self) -> bool {
        matches!(
            self,
            AuthError::Unavailable(_) | AuthError::RateLimited { .. }
        )
    }
}

impl From<AuthError> for Status {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::Missing
            | AuthError::Malformed(_)
            | AuthError::Signature(_)
            | AuthError::Audience { .. }
            | AuthError::Expired { .. }
            | AuthError::Rejected { .. } => Status::unauthenticated(e.to_string()),
            AuthError::Forbidden { .. } => Status::permission_denied(e.to_string()),
            // Agents reconnect with backoff after UNAVAILABLE.
            AuthError::Unavailable(_) | AuthError::RateLimited { .. } => {
                Status::unavailable(e.to_string())
            }
        }
    }
}

/// Who a verified token belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Verified {
    /// The pod the token is bound to (`namespace`-less name), when the token says so: the
    /// identity reports are keyed by, whatever name the caller claims.
    pub pod: Option<String>,
    /// The namespace of the authenticated ServiceAccount (from its user name
    /// `system:serviceaccount:<namespace>:<name>`): the namespace the caller really runs in,
    /// whatever namespace it claims.
    pub namespace: Option<String>,
}

/// The namespace in a ServiceAccount's user name, `system:serviceaccount:<namespace>:<name>`.
fn service_account_namespace(user: &str) -> Option<String> {
    let (namespace, name) = user.strip_prefix(SERVICE_ACCOUNT_USER)?.split_once(':')?;
    (!namespace.is_empty() && !name.is_empty()).then(|| namespace.to_owned())
}

/// How many TokenReviews may be sent, all callers together: a sustained rate and a burst.
///
/// The agents need few: a verified token is trusted for a minute, so a connected fleet of N
/// agent pods costs N/60 reviews a second; the default (5 a second, bursts of 20) serves 300
/// agent pods steadily and 20 connecting at once, and agents beyond that retry with backoff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReviewRate {
    /// Reviews a second, sustained (at least 1).
    pub per_second: u32,
    /// Reviews at once after a quiet spell (at least 1).
    pub burst: u32,
}

impl Default for ReviewRate {
    fn default() -> Self {
        ReviewRate {
            per_second: 5,
            burst: 20,
        }
    }
}

/// A token bucket over TokenReviews: full at `burst`, refilled at `per_second`.
struct ReviewBudget {
    rate: ReviewRate,
    bucket: Mutex<Bucket>,
}

struct Bucket {
    available: f64,
    at: Instant,
}

impl ReviewBudget {
    fn new(rate: ReviewRate, now: Instant) -> Self {
        ReviewBudget {
            rate,
            bucket: Mutex::new(Bucket {
                available: f64::from(rate.burst),
                at: now,
            }),
        }
    }

    /// Takes one review from the budget at `now`; `false` when none is left.
    fn take(&self, now: Instant) -> bool {
        self.refilled(now, |available| {
            let granted = *available >= 1.0;
            if granted {
                *available -= 1.0;
            }
            granted
        })
    }

    /// What a caller past the budget is told (`from_peer`: the budget is one address's).
    fn refusal(&self, from_peer: bool) -> AuthError {
        AuthError::RateLimited {
            per_second: self.rate.per_second,
            from_peer,
        }
    }

    /// Whether a review is left at `now` (none is taken).
    fn any_left(&self, now: Instant) -> bool {
        self.refilled(now, |available| *available >= 1.0)
    }

    /// Refills the bucket for the time since it was last looked at, then lets `decide` read or
    /// spend what it holds, in one lock scope.
    fn refilled<T>(&self, now: Instant, decide: impl FnOnce(&mut f64) -> T) -> T {
        let mut bucket = self.bucket.lock();
        let refill = now.saturating_duration_since(bucket.at).as_secs_f64()
            * f64::from(self.rate.per_second);
        bucket.available = (bucket.available + refill).min(f64::from(self.rate.burst));
        bucket.at = bucket.at.max(now);
        decide(&mut bucket.available)
    }
}

/// How long a verdict on a token expiring at `exp` may be trusted at `now`: until it expires,
/// at most [`VERIFIED_TTL_MAX`].
fn trusted_for(exp: f64, now: SystemTime) -> Duration {
    let now = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    Duration::try_from_secs_f64(exp - now.as_secs_f64())
        .unwrap_or_default()
        .min(VERIFIED_TTL_MAX)
}

/// Refuses, without asking the API server, a token that cannot be a ServiceAccount token for
/// `audience` at `now`: not a JWT ([`Jwt::read`]: three base64url segments, at most
/// [`super::jwt::TOKEN_MAX`] bytes, not `alg: none`), another audience, no `exp` or one past
/// (beyond [`EXPIRY_LEEWAY`]). The signature is not checked here: this only spares the API
/// server and the signature check obvious garbage.
pub fn precheck<'a>(token: &'a str, audience: &str, now: SystemTime) -> Result<Jwt<'a>, AuthError> {
    let jwt = Jwt::read(token).map_err(|e| AuthError::Malformed(e.to_string()))?;
    if !jwt.aud.iter().any(|a| a == audience) {
        return Err(AuthError::Audience {
            audience: audience.to_owned(),
            found: jwt.aud,
        });
    }
    let exp = jwt
        .exp
        .ok_or_else(|| AuthError::Malformed("no exp claim".into()))?;
    let now = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    if exp + EXPIRY_LEEWAY.as_secs_f64() <= now.as_secs_f64() {
        // `as` saturates: any float is a valid (if absurd) answer for the message.
        return Err(AuthError::Expired {
            expired: exp as i64,
        });
    }
    Ok(jwt)
}

/// SHA-256 of a token: the cache key (tokens themselves are not kept).
type TokenHash = [u8; 32];

fn token_hash(token: &str) -> TokenHash {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

/// A positive verdict and how long it is trusted.
#[derive(Clone)]
struct Allowed {
    who: Verified,
    ttl: Duration,
}

/// Each verified token is trusted for its own time ([`Allowed::ttl`]).
struct UntilExpiry;

impl moka::Expiry<TokenHash, Allowed> for UntilExpiry {
    // The trait's signature names moka's clock, which is std's; it is not read here.
    #[allow(clippy::disallowed_types)]
    fn expire_after_create(
        &self,
        _token: &TokenHash,
        allowed: &Allowed,
        _at: std::time::Instant,
    ) -> Option<Duration> {
        Some(allowed.ttl)
    }
}

/// The verdict cache: verified tokens apart from refusals, one review in flight per token, and
/// reviews only within the caller's address's share and the global budget.
struct Verdicts {
    verified: Cache<TokenHash, Allowed>,
    reviews: Cache<TokenHash, Result<Verified, AuthError>>,
    budget: ReviewBudget,
    peer_rate: ReviewRate,
    peers: Cache<IpAddr, Arc<ReviewBudget>>,
}

impl Verdicts {
    fn new(rate: ReviewRate) -> Self {
        Verdicts {
            verified: Cache::builder()
                .max_capacity(VERIFIED_MAX)
                .expire_after(UntilExpiry)
                .build(),
            reviews: Cache::builder()
                .max_capacity(REFUSED_MAX)
                .time_to_live(DENY_TTL)
                .build(),
            budget: ReviewBudget::new(rate, Instant::now()),
            peer_rate: ReviewRate {
                per_second: PEER_RATE.per_second.min(rate.per_second),
                burst: PEER_RATE.burst.min(rate.burst),
            },
            peers: Cache::builder()
                .max_capacity(PEERS_MAX)
                .time_to_idle(PEER_IDLE)
                .build(),
        }
    }

    /// The verdict on the token `key` from `peer`, from the cache or from `review` (called at
    /// most once at a time per token, and only within the peer's share and the budget;
    /// `Unavailable` and `RateLimited` are not cached); a positive one is kept for `ttl`.
    async fn check<F>(
        &self,
        key: TokenHash,
        peer: Option<IpAddr>,
        ttl: Duration,
        review: F,
    ) -> Result<Verified, AuthError>
    where
        F: Future<Output = Result<Verified, AuthError>>,
    {
        if let Some(allowed) = self.verified.get(&key).await {
            return Ok(allowed.who);
        }
        // Past the budget a token without a verdict is refused before the cache's (costlier)
        // insertion machinery: a flood then costs two lookups a token.
        if let Some(verdict) = self.reviews.get(&key).await {
            return verdict;
        }
        let share = match peer {
            Some(ip) => Some(
                self.peers
                    .get_with(ip, async {
                        Arc::new(ReviewBudget::new(self.peer_rate, Instant::now()))
                    })
                    .await,
            ),
            None => None,
        };
        if let Some(share) = &share
            && !share.any_left(Instant::now())
        {
            return Err(share.refusal(true));
        }
        if !self.budget.any_left(Instant::now()) {
            return Err(self.budget.refusal(false));
        }
        let outcome = self
            .reviews
            .try_get_with(key, async {
                if let Some(share) = &share
                    && !share.take(Instant::now())
                {
                    return Err(share.refusal(true));
                }
                if !self.budget.take(Instant::now()) {
                    return Err(self.budget.refusal(false));
                }
                match review.await {
                    Err(e) if e.is_transient() => Err(e),
                    verdict => Ok(verdict),
                }
            })
            .await;
        let verdict = match outcome {
            Ok(verdict) => verdict,
            Err(transient) => Err(AuthError::clone(&transient)),
        };
        if let Ok(who) = &verdict {
            let allowed = Allowed {
                who: who.clone(),
                ttl,
            };
            self.verified.insert(key, allowed).await;
            self.reviews.invalidate(&key).await;
        }
        verdict
    }
}

/// The verdicts of open Watch streams, by connection: a Report on the connection of a verified
/// Watch, with the same token, is that agent, and needs no check. Bounded by the streams the
/// listener admits.
#[derive(Default)]
struct Watching {
    open: parking_lot::Mutex<HashMap<SocketAddr, (u64, TokenHash, Verified)>>,
    next: AtomicU64,
}

/// Held by an open Watch stream; forgets its verdict when the stream ends.
pub struct WatchGuard {
    watching: Arc<Watching>,
    peer: SocketAddr,
    id: u64,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        let mut open = self.watching.open.lock();
        if open.get(&self.peer).is_some_and(|(id, ..)| *id == self.id) {
            open.remove(&self.peer);
        }
    }
}

/// Verifies callers' tokens: their signature against the cluster's keys, then the API server.
pub struct TokenAuth {
    client: Client,
    audience: String,
    /// `system:serviceaccount:<namespace>:<name>` of the agents.
    allowed: String,
    keys: IssuerKeys,
    verdicts: Verdicts,
    watching: Arc<Watching>,
    counts: TokenCounts,
}

impl std::fmt::Debug for TokenAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenAuth")
            .field("audience", &self.audience)
            .field("allowed", &self.allowed)
            .field("rate", &self.verdicts.budget.rate)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl TokenAuth {
    /// Accepts tokens of `service_account` (`namespace:name`) issued for `audience`, checking
    /// signatures against `keys`, sending at most `rate` TokenReviews and counting checks into
    /// `counts`.
    pub fn new(
        client: Client,
        audience: String,
        service_account: &str,
        rate: ReviewRate,
        keys: IssuerKeys,
        counts: TokenCounts,
    ) -> Self {
        Self {
            client,
            audience,
            allowed: format!("{SERVICE_ACCOUNT_USER}{service_account}"),
            keys: keys.counted(counts.clone()),
            verdicts: Verdicts::new(rate),
            watching: Arc::default(),
            counts,
        }
    }

    /// Checks the caller behind `metadata`, connected from `peer`; on success, says who it is.
    pub async fn check(
        &self,
        metadata: &MetadataMap,
        peer: Option<SocketAddr>,
    ) -> Result<Verified, AuthError> {
        let verdict = self.verdict(metadata, peer).await;
        if let Err(e) = &verdict {
            match e.refused_before_review() {
                Some(reason) => {
                    self.counts.refused(reason);
                    debug!(error = %e, reason, ?peer, "config stream caller refused before review");
                }
                None => warn!(error = %e, ?peer, "config stream caller refused"),
            }
        }
        verdict
    }

    /// Reads the cluster's signing keys now (they are otherwise read when a token needs them).
    pub async fn load_keys(&self) {
        self.keys.refresh().await;
    }

    /// Remembers that `who`, behind `metadata`, watches from `peer`, for as long as the guard
    /// lives: its Reports on that connection, with that token, need no check.
    pub fn watching(
        &self,
        metadata: &MetadataMap,
        peer: Option<SocketAddr>,
        who: &Verified,
    ) -> Option<WatchGuard> {
        let (peer, token) = (peer?, bearer(metadata)?);
        let id = self.watching.next.fetch_add(1, Ordering::Relaxed);
        self.watching
            .open
            .lock()
            .insert(peer, (id, token_hash(token), who.clone()));
        Some(WatchGuard {
            watching: self.watching.clone(),
            peer,
            id,
        })
    }

    async fn verdict(
        &self,
        metadata: &MetadataMap,
        peer: Option<SocketAddr>,
    ) -> Result<Verified, AuthError> {
        let token = bearer(metadata).ok_or(AuthError::Missing)?;
        let now = SystemTime::now();
        let jwt = precheck(token, &self.audience, now)?;
        let key = token_hash(token);
        if let Some(peer) = peer
            && let Some((_, watched, who)) = self.watching.open.lock().get(&peer)
            && *watched == key
        {
            return Ok(who.clone());
        }
        let signed = self
            .keys
            .judge(
                &jwt.alg,
                jwt.kid.as_deref(),
                jwt.signed.as_bytes(),
                &jwt.signature,
            )
            .await
            .map_err(AuthError::Signature)?;
        // A genuine token speaks for itself: another ServiceAccount's needs no review.
        if signed == Judgement::Signed && jwt.sub.as_deref() != Some(self.allowed.as_str()) {
            return Err(AuthError::Forbidden {
                user: jwt.sub.unwrap_or_default(),
                allowed: self.allowed.clone(),
                locally: true,
            });
        }
        let review = async {
            let verdict = self.review(token).await;
            self.counts.reviewed(match &verdict {
                Ok(_) => "allowed",
                Err(AuthError::Forbidden { .. }) => "forbidden",
                Err(AuthError::Unavailable(_)) => "failed",
                Err(_) => "rejected",
            });
            verdict
        };
        let mut who = self
            .verdicts
            .check(
                key,
                peer.map(|p| p.ip()),
                trusted_for(jwt.exp.unwrap_or_default(), now),
                review,
            )
            .await?;
        // The pod a verified token is bound to, from its claims when the review does not say.
        if who.pod.is_none() && signed == Judgement::Signed {
            who.pod = jwt.pod;
        }
        Ok(who)
    }
    async fn review(&self, token: &str) -> Result<Verified, AuthError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: Some(vec![self.audience.clone()]),
            },
            ..TokenReview::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let result = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| AuthError::Unavailable(e.to_string()))?;
        let status = result.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return Err(AuthError::Rejected {
                audience: self.audience.clone(),
                reason: status
                    .error
                    .unwrap_or_else(|| "not authenticated".to_owned()),
            });
        }
        if !status
            .audiences
            .as_ref()
            .is_some_and(|a| a.contains(&self.audience))
        {
            return Err(AuthError::Rejected {
                audience: self.audience.clone(),
                reason: format!("token audiences are {:?}", status.audiences),
            });
        }
        let user = status.user.unwrap_or_default();
        let name = user.username.unwrap_or_default();
        if name != self.allowed {
            return Err(AuthError::Forbidden {
                user: name,
                allowed: self.allowed.clone(),
                locally: false,
            });
        }
        let pod = user
            .extra
            .as_ref()
            .and_then(|e| e.get(POD_NAME_EXTRA))
            .and_then(|v| v.first())
            .cloned();
        let namespace = service_account_namespace(&name);
        debug!(user = %name, ?pod, "config stream caller verified");
        Ok(Verified { pod, namespace })
    }
}

/// The token of an `authorization: Bearer <token>` entry.
fn bearer(metadata: &MetadataMap) -> Option<&str> {
    let value = metadata.get("authorization")?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::super::jwt::tests::b64;
    use super::super::jwt::{TOKEN_MAX, base64url};
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A budget no test reaches.
    const UNLIMITED: ReviewRate = ReviewRate {
        per_second: u32::MAX,
        burst: u32::MAX,
    };
    const AUDIENCE: &str = "vm-dhcp-controller";
    const MINUTE: Duration = Duration::from_secs(60);

    fn jwt(header: serde_json::Value, claims: serde_json::Value) -> String {
        format!(
            "{}.{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes()),
            b64(b"not really a signature")
        )
    }

    fn unix(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(seconds)
    }

    /// A review that counts itself in `reviews`: `who` is verified, `None` is rejected.
    async fn counted(reviews: &AtomicUsize, who: Option<Verified>) -> Result<Verified, AuthError> {
        reviews.fetch_add(1, Ordering::SeqCst);
        who.ok_or_else(|| AuthError::Rejected {
            audience: "a".into(),
            reason: "no".into(),
        })
    }

    #[test]
    fn the_precheck_refuses_garbage_and_passes_what_only_a_review_can_judge() {
        let now = unix(1_000_000);
        let rs256 = serde_json::json!({"alg": "RS256", "kid": "k"});
        let claims = |aud: serde_json::Value, exp: u64| serde_json::json!({"aud": aud, "exp": exp, "sub": "system:serviceaccount:ns:agent"});
        let good = jwt(
            rs256.clone(),
            claims(serde_json::json!([AUDIENCE]), 1_000_600),
        );
        assert_eq!(precheck(&good, AUDIENCE, now).map(|_| ()), Ok(()));
        // One audience as a string; an expiry within the leeway.
        let single = jwt(rs256.clone(), claims(serde_json::json!(AUDIENCE), 999_990));
        assert_eq!(precheck(&single, AUDIENCE, now).map(|_| ()), Ok(()));

        let malformed = |token: &str| {
            let e = precheck(token, AUDIENCE, now).unwrap_err();
            assert!(matches!(e, AuthError::Malformed(_)), "{token:.40}: {e}");
            assert_eq!(e.refused_before_review(), Some("malformed"));
            e.to_string()
        };
        for garbage in [
            "garbage",
            "a.b",
            "a.b.c.d",
            "!!.!!.!!",
            "e30.e30.",
            "e30.e30.c2ln",
        ] {
            malformed(garbage);
        }
        let (header, payload, signature) = {
            let mut parts = good.split('.');
            (
                parts.next().unwrap(),
                parts.next().unwrap(),
                parts.next().unwrap(),
            )
        };
        assert!(malformed(&format!("{header}.{payload}.{signature}=")).contains("signature"));
        assert!(malformed(&format!("{header}.{}.{signature}", b64(b"[1]"))).contains("payload"));
        let unsigned = jwt(
            serde_json::json!({"alg": "none"}),
            claims(serde_json::json!([AUDIENCE]), 1_000_600),
        );
        assert!(malformed(&unsigned).contains("alg"));
        let no_exp = jwt(rs256.clone(), serde_json::json!({"aud": [AUDIENCE]}));
        assert!(malformed(&no_exp).contains("exp"));
        let padding = "A".repeat(TOKEN_MAX);
        let oversize = jwt(
            rs256.clone(),
            serde_json::json!({"aud": [AUDIENCE], "exp": 1_000_600, "pad": padding}),
        );
        assert!(malformed(&oversize).contains("bytes"));

        let other = jwt(
            rs256.clone(),
            claims(
                serde_json::json!(["https://kubernetes.default.svc"]),
                1_000_600,
            ),
        );
        let e = precheck(&other, AUDIENCE, now).unwrap_err();
        assert_eq!(e.refused_before_review(), Some("audience"));
        assert!(e.to_string().contains(AUDIENCE), "{e}");
        let expired = jwt(rs256, claims(serde_json::json!([AUDIENCE]), 999_000));
        assert_eq!(
            precheck(&expired, AUDIENCE, now).map(|_| ()),
            Err(AuthError::Expired { expired: 999_000 })
        );
        for e in [
            AuthError::Malformed("x".into()),
            e,
            AuthError::Expired { expired: 1 },
        ] {
            assert_eq!(Status::from(e).code(), tonic::Code::Unauthenticated);
        }
    }

    #[test]
    fn the_budget_grants_a_burst_then_the_rate() {
        let start = Instant::now();
        let budget = ReviewBudget::new(
            ReviewRate {
                per_second: 5,
                burst: 3,
            },
            start,
        );
        let granted =
            |at: Duration, tries: usize| (0..tries).filter(|_| budget.take(start + at)).count();
        assert!(
            budget.any_left(start) && budget.any_left(start),
            "looking takes nothing"
        );
        assert_eq!(granted(Duration::ZERO, 10), 3, "the burst");
        assert!(!budget.any_left(start));
        assert_eq!(
            granted(Duration::from_millis(100), 10),
            0,
            "half a review refilled"
        );
        assert_eq!(granted(Duration::from_millis(200), 10), 1);
        assert_eq!(
            granted(Duration::from_millis(1200), 10),
            3,
            "refilled to the burst only"
        );
        // A caller that read the clock before the last one neither refills nor unrefills.
        assert_eq!(granted(Duration::from_millis(1000), 10), 0);
        assert_eq!(granted(Duration::from_millis(1400), 10), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_new_tokens_costs_at_most_the_budget_and_verified_agents_are_served() {
        let verdicts = Verdicts::new(ReviewRate {
            per_second: 2,
            burst: 4,
        });
        let reviews = AtomicUsize::new(0);
        let review = |ok: bool| counted(&reviews, ok.then(Verified::default));
        assert!(
            verdicts
                .check(token_hash("agent"), None, MINUTE, review(true))
                .await
                .is_ok()
        );
        let mut limited = 0;
        for i in 0..20_000 {
            match verdicts
                .check(
                    token_hash(&format!("forged-{i}")),
                    None,
                    MINUTE,
                    review(false),
                )
                .await
            {
                Err(AuthError::RateLimited {
                    per_second: 2,
                    from_peer: false,
                }) => limited += 1,
                Err(AuthError::Rejected { .. }) => {}
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(reviews.load(Ordering::SeqCst), 4, "the burst, no more");
        assert_eq!(limited, 20_000 - 3);
        // The verified agent costs nothing; a refusal already known neither.
        assert!(
            verdicts
                .check(token_hash("agent"), None, MINUTE, review(true))
                .await
                .is_ok()
        );
        assert!(matches!(
            verdicts
                .check(token_hash("forged-0"), None, MINUTE, review(false))
                .await,
            Err(AuthError::Rejected { .. })
        ));
        assert_eq!(reviews.load(Ordering::SeqCst), 4);
        // A rate-limited token was not cached: once the budget refills, it is reviewed.
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(
            verdicts
                .check(token_hash("forged-19999"), None, MINUTE, review(true))
                .await
                .is_ok()
        );
        assert_eq!(reviews.load(Ordering::SeqCst), 5);
        assert_eq!(
            Status::from(AuthError::RateLimited {
                per_second: 2,
                from_peer: false
            })
            .code(),
            tonic::Code::Unavailable
        );
    }

    #[test]
    fn the_namespace_is_read_from_the_service_account_user_name() {
        let ns = service_account_namespace;
        assert_eq!(
            ns("system:serviceaccount:vmdhcp-system:agent").as_deref(),
            Some("vmdhcp-system")
        );
        assert_eq!(ns("system:serviceaccount:ns:a:b").as_deref(), Some("ns"));
        for other in [
            "system:serviceaccount::agent",
            "system:serviceaccount:ns:",
            "system:serviceaccount:ns",
            "alice",
            "system:node:ns:x",
        ] {
            assert_eq!(ns(other), None, "{other}");
        }
    }

    fn md(value: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert("authorization", value.parse().unwrap());
        m
    }

    #[test]
    fn bearer_tokens_are_read_and_other_schemes_ignored() {
        assert_eq!(bearer(&md("Bearer abc")), Some("abc"));
        assert_eq!(bearer(&md("bearer  abc ")), Some("abc"));
        assert_eq!(bearer(&md("Basic abc")), None);
        assert_eq!(bearer(&md("Bearer ")), None);
        assert_eq!(bearer(&MetadataMap::new()), None);
    }

    #[test]
    fn refusals_map_to_distinct_grpc_codes() {
        assert_eq!(
            Status::from(AuthError::Missing).code(),
            tonic::Code::Unauthenticated
        );
        let forbidden = AuthError::Forbidden {
            user: "system:serviceaccount:x:y".into(),
            allowed: "system:serviceaccount:a:b".into(),
            locally: false,
        };
        assert_eq!(
            Status::from(forbidden).code(),
            tonic::Code::PermissionDenied
        );
        assert_eq!(
            Status::from(AuthError::Unavailable("x".into())).code(),
            tonic::Code::Unavailable
        );
    }

    #[tokio::test]
    async fn a_flood_of_bad_tokens_neither_evicts_verdicts_nor_repeats_reviews() {
        let verdicts = Verdicts::new(UNLIMITED);
        let reviews = AtomicUsize::new(0);
        let agent = Verified {
            pod: Some("agent-0".into()),
            ..Verified::default()
        };
        let review = |ok: bool| counted(&reviews, ok.then(|| agent.clone()));
        let good = "agent-token";
        assert_eq!(
            verdicts
                .check(token_hash(good), None, MINUTE, review(true))
                .await
                .unwrap()
                .pod
                .as_deref(),
            Some("agent-0")
        );
        // A refused token asked again within its time is answered from the cache.
        assert!(
            verdicts
                .check(token_hash("forged"), None, MINUTE, review(false))
                .await
                .is_err()
        );
        assert!(
            verdicts
                .check(token_hash("forged"), None, MINUTE, review(false))
                .await
                .is_err()
        );
        assert_eq!(reviews.load(Ordering::SeqCst), 2);
        // Far more distinct bad tokens than either cache holds.
        let flood = usize::try_from(REFUSED_MAX + VERIFIED_MAX).unwrap() + 1000;
        for i in 0..flood {
            let token = format!("forged-{i}");
            assert!(
                verdicts
                    .check(token_hash(&token), None, MINUTE, review(false))
                    .await
                    .is_err()
            );
        }
        verdicts.reviews.run_pending_tasks().await;
        verdicts.verified.run_pending_tasks().await;
        assert_eq!(
            reviews.load(Ordering::SeqCst),
            flood + 2,
            "one review per token"
        );
        assert!(verdicts.reviews.entry_count() <= REFUSED_MAX);
        // The agent's verdict survived: no new review for it.
        let before = reviews.load(Ordering::SeqCst);
        let pod = verdicts
            .check(token_hash(good), None, MINUTE, review(true))
            .await
            .unwrap()
            .pod;
        assert_eq!(pod.as_deref(), Some("agent-0"));
        assert_eq!(reviews.load(Ordering::SeqCst), before);
    }

    /// A P-256 key pair and its JWK Set, as a cluster publishes it.
    fn cluster_key() -> (ring::signature::EcdsaKeyPair, super::super::keys::KeySet) {
        use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        let (x, y) = pair.public_key().as_ref()[1..].split_at(32);
        let set = format!(
            r#"{{"keys":[{{"use":"sig","kty":"EC","kid":"cluster","crv":"P-256","x":"{}","y":"{}"}}]}}"#,
            b64(x),
            b64(y)
        );
        (
            pair,
            super::super::keys::KeySet::parse(set.as_bytes()).unwrap(),
        )
    }

    /// A token for our audience, valid for ten minutes, signed by `pair`.
    fn signed(pair: &ring::signature::EcdsaKeyPair, sub: &str, pod: Option<&str>) -> String {
        let exp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 600;
        let mut claims = serde_json::json!({"aud": [AUDIENCE], "exp": exp, "sub": sub});
        if let Some(pod) = pod {
            claims["kubernetes.io"] = serde_json::json!({"pod": {"name": pod, "uid": "u"}});
        }
        let header = serde_json::json!({"alg": "ES256", "kid": "cluster"});
        let message = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let signature = pair
            .sign(&ring::rand::SystemRandom::new(), message.as_bytes())
            .unwrap();
        format!("{message}.{}", b64(signature.as_ref()))
    }

    /// A client of an API server that is not there: every review fails as `Unavailable`.
    fn nowhere() -> Client {
        Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap()
    }

    #[tokio::test]
    async fn forgeries_and_other_accounts_tokens_are_refused_without_a_review() {
        let (pair, keys) = cluster_key();
        let (other, _) = cluster_key();
        let metrics = crate::metrics::Metrics::default();
        let auth = TokenAuth::new(
            nowhere(),
            AUDIENCE.into(),
            "vmdhcp:agent",
            UNLIMITED,
            IssuerKeys::fixed(keys),
            metrics.token_counts(),
        );
        let peer: Option<SocketAddr> = Some("10.0.0.9:4000".parse().unwrap());
        let agent = "system:serviceaccount:vmdhcp:agent";
        // The agent's token signed by another key, or with its signature altered: forgeries.
        let forged = signed(&other, agent, Some("agent-0"));
        let e = auth.check(&md(&format!("Bearer {forged}")), peer).await;
        assert!(
            matches!(
                &e,
                Err(AuthError::Signature(KeysError::BadSignature { .. }))
            ),
            "{e:?}"
        );
        let genuine = signed(&pair, agent, Some("agent-0"));
        let (message, signature) = genuine.rsplit_once('.').unwrap();
        let mut bytes = base64url(signature).unwrap();
        bytes[3] ^= 1;
        let altered = format!("{message}.{}", b64(&bytes));
        let e = auth.check(&md(&format!("Bearer {altered}")), peer).await;
        assert!(matches!(&e, Err(AuthError::Signature(_))), "{e:?}");
        // Another ServiceAccount's genuine token: refused from its own claims.
        let tenant = signed(&pair, "system:serviceaccount:tenant:default", Some("web-0"));
        let e = auth.check(&md(&format!("Bearer {tenant}")), peer).await;
        assert!(
            matches!(&e, Err(AuthError::Forbidden { locally: true, user, .. }) if user.contains("tenant")),
            "{e:?}"
        );
        assert_eq!(
            Status::from(e.unwrap_err()).code(),
            tonic::Code::PermissionDenied
        );
        // Only the agent's genuine token goes on to a review (which fails here: no API server).
        let e = auth.check(&md(&format!("Bearer {genuine}")), peer).await;
        assert!(matches!(&e, Err(AuthError::Unavailable(_))), "{e:?}");
        let text = metrics.encode();
        for line in [
            r#"vmdhcpcontroller_token_checks_refused_total{reason="signature"} 2"#,
            r#"vmdhcpcontroller_token_checks_refused_total{reason="forbidden"} 1"#,
            r#"vmdhcpcontroller_token_reviews_total{result="failed"} 1"#,
            "vmdhcpcontroller_token_issuer_keys 1",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn one_flooding_address_leaves_the_budget_to_the_others() {
        let verdicts = Verdicts::new(ReviewRate {
            per_second: 5,
            burst: 20,
        });
        let reviews = AtomicUsize::new(0);
        let review = |ok: bool| counted(&reviews, ok.then(Verified::default));
        let flooder: Option<IpAddr> = Some("10.0.0.66".parse().unwrap());
        let mut from_peer = 0;
        for i in 0..10_000 {
            let key = token_hash(&format!("forged-{i}"));
            match verdicts.check(key, flooder, MINUTE, review(false)).await {
                Err(AuthError::RateLimited {
                    from_peer: true, ..
                }) => from_peer += 1,
                Err(AuthError::Rejected { .. }) => {}
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(reviews.load(Ordering::SeqCst), 4, "the address's burst");
        assert_eq!(from_peer, 10_000 - 4);
        // Agents on other addresses are reviewed at once, from the budget left.
        for n in 0..10 {
            let agent: Option<IpAddr> = Some(format!("10.0.1.{n}").parse().unwrap());
            let key = token_hash(&format!("agent-{n}"));
            assert!(
                verdicts
                    .check(key, agent, MINUTE, review(true))
                    .await
                    .is_ok()
            );
        }
        assert_eq!(reviews.load(Ordering::SeqCst), 14);
        // A second later the flooder has one more review, no more.
        tokio::time::advance(Duration::from_secs(1)).await;
        let more = (0..100)
            .filter(|i| {
                futures_util::FutureExt::now_or_never(verdicts.check(
                    token_hash(&format!("again-{i}")),
                    flooder,
                    MINUTE,
                    review(false),
                ))
                .is_some_and(|v| matches!(v, Err(AuthError::Rejected { .. })))
            })
            .count();
        assert_eq!(more, 1);
    }

    #[test]
    fn a_verdict_is_trusted_until_the_token_expires_and_an_hour_at_most() {
        let now = unix(1_000_000);
        let token = |exp: u64| {
            jwt(
                serde_json::json!({"alg": "RS256"}),
                serde_json::json!({"aud": [AUDIENCE], "exp": exp}),
            )
        };
        let trusted = |exp: u64| {
            let t = token(exp);
            trusted_for(precheck(&t, AUDIENCE, now).unwrap().exp.unwrap(), now)
        };
        assert_eq!(trusted(1_000_600), Duration::from_secs(600));
        assert_eq!(trusted(1_000_000 + 365 * 86_400), VERIFIED_TTL_MAX);
        assert_eq!(trusted(999_990), Duration::ZERO, "within the leeway");
    }

    #[tokio::test]
    async fn a_report_on_a_watching_connection_with_its_token_needs_no_check() {
        let auth = TokenAuth::new(
            nowhere(),
            AUDIENCE.into(),
            "vmdhcp:agent",
            UNLIMITED,
            IssuerKeys::new(None),
            TokenCounts::default(),
        );
        let exp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 600;
        let token = jwt(
            serde_json::json!({"alg": "RS256"}),
            serde_json::json!({"aud": [AUDIENCE], "exp": exp}),
        );
        let metadata = md(&format!("Bearer {token}"));
        let here: Option<SocketAddr> = Some("10.0.0.5:5000".parse().unwrap());
        let elsewhere: Option<SocketAddr> = Some("10.0.0.5:5001".parse().unwrap());
        let who = Verified {
            pod: Some("agent-0".into()),
            namespace: Some("vmdhcp".into()),
        };
        let guard = auth.watching(&metadata, here, &who).unwrap();
        assert_eq!(auth.check(&metadata, here).await, Ok(who));
        // Another connection, or another token on this one, is checked (and fails here: the
        // API server is not there).
        assert!(auth.check(&metadata, elsewhere).await.is_err());
        let other = md(&format!("Bearer {token}x"));
        assert!(auth.check(&other, here).await.is_err());
        drop(guard);
        assert!(
            auth.check(&metadata, here).await.is_err(),
            "the Watch ended"
        );
        // Expired tokens are refused even on a watching connection.
        let old = jwt(
            serde_json::json!({"alg": "RS256"}),
            serde_json::json!({"aud": [AUDIENCE], "exp": 1}),
        );
        let old = md(&format!("Bearer {old}"));
        let _guard = auth.watching(&old, here, &Verified::default()).unwrap();
        assert!(matches!(
            auth.check(&old, here).await,
            Err(AuthError::Expired { .. })
        ));
    }

    #[tokio::test]
    async fn concurrent_checks_of_one_token_share_one_review_and_outages_are_not_cached() {
        let verdicts = Arc::new(Verdicts::new(UNLIMITED));
        let reviews = Arc::new(AtomicUsize::new(0));
        let (release, released) = tokio::sync::watch::channel(false);
        let mut checks = Vec::new();
        for _ in 0..50 {
            let (verdicts, reviews, mut released) =
                (verdicts.clone(), reviews.clone(), released.clone());
            checks.push(tokio::spawn(async move {
                verdicts
                    .check(token_hash("new-token"), None, MINUTE, async move {
                        reviews.fetch_add(1, Ordering::SeqCst);
                        let _ = released.wait_for(|r| *r).await;
                        Ok(Verified::default())
                    })
                    .await
            }));
        }
        tokio::task::yield_now().await;
        release.send_replace(true);
        for c in checks {
            assert!(c.await.unwrap().is_ok());
        }
        assert_eq!(reviews.load(Ordering::SeqCst), 1);
        // The API server is down: the error reaches the caller and the next check asks again.
        let down = || async { Err(AuthError::Unavailable("connection refused".into())) };
        assert!(matches!(
            verdicts
                .check(token_hash("other"), None, MINUTE, down())
                .await,
            Err(AuthError::Unavailable(_))
        ));
        let asked = AtomicUsize::new(0);
        let up = async {
            asked.fetch_add(1, Ordering::SeqCst);
            Ok(Verified::default())
        };
        assert!(
            verdicts
                .check(token_hash("other"), None, MINUTE, up)
                .await
                .is_ok()
        );
        assert_eq!(asked.load(Ordering::SeqCst), 1);
    }
}
