//! Who may read the config stream: callers present a ServiceAccount token (`authorization:
//! Bearer …`), which the API server verifies (TokenReview) for our audience; only the agent
//! ServiceAccount is served. Anyone else learns nothing about pools, MACs or addresses.
//!
//! Verdicts are cached per token (by its SHA-256, never the token itself), so a reconnecting
//! fleet costs one TokenReview per agent per minute at most, and an API server outage does not
//! cut agents that were already verified. The cache is bounded and cannot be flooded away:
//! verified tokens live in a cache of their own that only the agents' tokens enter, refusals in
//! another (bounded, short-lived), and concurrent checks of one token share one TokenReview.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::PostParams;
use kube::{Api, Client};
use moka::future::Cache;
use tonic::Status;
use tonic::metadata::MetadataMap;
use tracing::{debug, warn};

/// How long a positive verdict is trusted.
const ALLOW_TTL: Duration = Duration::from_secs(60);
/// How long a refusal is remembered (bounds the TokenReviews a hostile caller can cause).
const DENY_TTL: Duration = Duration::from_secs(10);
/// Verified tokens kept at most (agents' tokens only: a few per agent pod per hour).
const VERIFIED_MAX: u64 = 4096;
/// Refusals kept at most.
const REFUSED_MAX: u64 = 16_384;
/// The TokenReview extra naming the pod a bound token belongs to.
const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";

/// Why a caller is refused; each maps to a gRPC status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `authorization: Bearer` metadata.
    #[error("missing bearer token (metadata \"authorization: Bearer <ServiceAccount token>\")")]
    Missing,
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
    },
    /// TokenReview failed; the caller may retry.
    #[error("cannot verify the token now: {0}")]
    Unavailable(String),
}

impl From<AuthError> for Status {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::Missing | AuthError::Rejected { .. } => {
                Status::unauthenticated(e.to_string())
            }
            AuthError::Forbidden { .. } => Status::permission_denied(e.to_string()),
            AuthError::Unavailable(_) => Status::unavailable(e.to_string()),
        }
    }
}

/// Who a verified token belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Verified {
    /// The pod the token is bound to (`namespace`-less name), when the token says so: the
    /// identity reports are keyed by, whatever name the caller claims.
    pub pod: Option<String>,
}

/// SHA-256 of a token: the cache key (tokens themselves are not kept).
type TokenHash = [u8; 32];

fn token_hash(token: &str) -> TokenHash {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

/// The verdict cache: verified tokens apart from refusals, one review in flight per token.
struct Verdicts {
    verified: Cache<TokenHash, Verified>,
    reviews: Cache<TokenHash, Result<Verified, AuthError>>,
}

impl Verdicts {
    fn new() -> Self {
        Verdicts {
            verified: Cache::builder()
                .max_capacity(VERIFIED_MAX)
                .time_to_live(ALLOW_TTL)
                .build(),
            reviews: Cache::builder()
                .max_capacity(REFUSED_MAX)
                .time_to_live(DENY_TTL)
                .build(),
        }
    }

    /// The verdict on `token`, from the cache or from `review` (called at most once at a time
    /// per token; an `Unavailable` answer is not cached).
    async fn check<F>(&self, token: &str, review: F) -> Result<Verified, AuthError>
    where
        F: Future<Output = Result<Verified, AuthError>>,
    {
        let key = token_hash(token);
        if let Some(who) = self.verified.get(&key).await {
            return Ok(who);
        }
        let outcome = self
            .reviews
            .try_get_with(key, async {
                match review.await {
                    Err(e @ AuthError::Unavailable(_)) => Err(e),
                    verdict => Ok(verdict),
                }
            })
            .await;
        let verdict = match outcome {
            Ok(verdict) => verdict,
            Err(unavailable) => Err(AuthError::clone(&unavailable)),
        };
        if let Ok(who) = &verdict {
            self.verified.insert(key, who.clone()).await;
            self.reviews.invalidate(&key).await;
        }
        verdict
    }
}

/// Verifies callers' tokens through the API server.
pub struct TokenAuth {
    client: Client,
    audience: String,
    /// `system:serviceaccount:<namespace>:<name>` of the agents.
    allowed: String,
    verdicts: Verdicts,
}

impl std::fmt::Debug for TokenAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenAuth")
            .field("audience", &self.audience)
            .field("allowed", &self.allowed)
            .finish_non_exhaustive()
    }
}

impl TokenAuth {
    /// Accepts tokens of `service_account` (`namespace:name`) issued for `audience`.
    pub fn new(client: Client, audience: String, service_account: &str) -> Self {
        Self {
            client,
            audience,
            allowed: format!("system:serviceaccount:{service_account}"),
            verdicts: Verdicts::new(),
        }
    }

    /// Checks the caller behind `metadata`; on success, says who it is.
    pub async fn check(&self, metadata: &MetadataMap) -> Result<Verified, AuthError> {
        let token = bearer(metadata).ok_or(AuthError::Missing)?;
        let verdict = self.verdicts.check(token, self.review(token)).await;
        if let Err(e) = &verdict {
            warn!(error = %e, "config stream caller refused");
        }
        verdict
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
            });
        }
        let pod = user
            .extra
            .as_ref()
            .and_then(|e| e.get(POD_NAME_EXTRA))
            .and_then(|v| v.first())
            .cloned();
        debug!(user = %name, ?pod, "config stream caller verified");
        Ok(Verified { pod })
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
    use super::*;
    use std::sync::Arc;

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
        use std::sync::atomic::{AtomicUsize, Ordering};
        let verdicts = Verdicts::new();
        let reviews = AtomicUsize::new(0);
        let review = |ok: bool| {
            let reviews = &reviews;
            async move {
                reviews.fetch_add(1, Ordering::SeqCst);
                if ok {
                    Ok(Verified {
                        pod: Some("agent-0".into()),
                    })
                } else {
                    Err(AuthError::Rejected {
                        audience: "a".into(),
                        reason: "no".into(),
                    })
                }
            }
        };
        let good = "agent-token";
        assert_eq!(
            verdicts
                .check(good, review(true))
                .await
                .unwrap()
                .pod
                .as_deref(),
            Some("agent-0")
        );
        // A refused token asked again within its time is answered from the cache.
        assert!(verdicts.check("forged", review(false)).await.is_err());
        assert!(verdicts.check("forged", review(false)).await.is_err());
        assert_eq!(reviews.load(Ordering::SeqCst), 2);
        // Far more distinct bad tokens than either cache holds.
        let flood = usize::try_from(REFUSED_MAX + VERIFIED_MAX).unwrap() + 1000;
        for i in 0..flood {
            let token = format!("forged-{i}");
            assert!(verdicts.check(&token, review(false)).await.is_err());
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
        let pod = verdicts.check(good, review(true)).await.unwrap().pod;
        assert_eq!(pod.as_deref(), Some("agent-0"));
        assert_eq!(reviews.load(Ordering::SeqCst), before);
    }

    #[tokio::test]
    async fn concurrent_checks_of_one_token_share_one_review_and_outages_are_not_cached() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let verdicts = Arc::new(Verdicts::new());
        let reviews = Arc::new(AtomicUsize::new(0));
        let (release, released) = tokio::sync::watch::channel(false);
        let mut checks = Vec::new();
        for _ in 0..50 {
            let (verdicts, reviews, mut released) =
                (verdicts.clone(), reviews.clone(), released.clone());
            checks.push(tokio::spawn(async move {
                verdicts
                    .check("new-token", async move {
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
            verdicts.check("other", down()).await,
            Err(AuthError::Unavailable(_))
        ));
        let asked = AtomicUsize::new(0);
        let up = async {
            asked.fetch_add(1, Ordering::SeqCst);
            Ok(Verified::default())
        };
        assert!(verdicts.check("other", up).await.is_ok());
        assert_eq!(asked.load(Ordering::SeqCst), 1);
    }
}
