//! Who may read the config stream: callers present a ServiceAccount token (`authorization:
//! Bearer …`), which the API server verifies (TokenReview) for our audience; only the agent
//! ServiceAccount is served. Anyone else learns nothing about pools, MACs or addresses.
//!
//! Verdicts are cached briefly per token, so a reconnecting fleet costs one TokenReview per agent
//! per minute at most, and an API server outage does not cut agents that were already verified.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::PostParams;
use kube::{Api, Client};
use tonic::Status;
use tonic::metadata::MetadataMap;
use tracing::{debug, warn};

/// How long a positive verdict is trusted.
const ALLOW_TTL: Duration = Duration::from_secs(60);
/// How long a refusal is remembered (bounds the TokenReviews a hostile caller can cause).
const DENY_TTL: Duration = Duration::from_secs(10);
/// Cached verdicts at most; the cache is cleared when full.
const CACHE_MAX: usize = 4096;

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

/// A cached decision and until when it holds.
type Verdict = (Instant, Result<(), AuthError>);

/// Verifies callers' tokens through the API server.
pub struct TokenAuth {
    client: Client,
    audience: String,
    /// `system:serviceaccount:<namespace>:<name>` of the agents.
    allowed: String,
    cache: Mutex<HashMap<String, Verdict>>,
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
            cache: Mutex::default(),
        }
    }

    /// Checks the caller behind `metadata`.
    pub async fn check(&self, metadata: &MetadataMap) -> Result<(), AuthError> {
        let token = bearer(metadata).ok_or(AuthError::Missing)?;
        if let Some(verdict) = self.cached(token) {
            return verdict;
        }
        let verdict = self.review(token).await;
        if !matches!(verdict, Err(AuthError::Unavailable(_))) {
            let ttl = if verdict.is_ok() { ALLOW_TTL } else { DENY_TTL };
            let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            if cache.len() >= CACHE_MAX {
                cache.clear();
            }
            cache.insert(token.to_owned(), (Instant::now() + ttl, verdict.clone()));
        }
        if let Err(e) = &verdict {
            warn!(error = %e, "config stream caller refused");
        }
        verdict
    }

    fn cached(&self, token: &str) -> Option<Result<(), AuthError>> {
        let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        cache
            .get(token)
            .filter(|(until, _)| *until > Instant::now())
            .map(|(_, v)| v.clone())
    }

    async fn review(&self, token: &str) -> Result<(), AuthError> {
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
        let user = status.user.and_then(|u| u.username).unwrap_or_default();
        if user != self.allowed {
            return Err(AuthError::Forbidden {
                user,
                allowed: self.allowed.clone(),
            });
        }
        debug!(%user, "config stream caller verified");
        Ok(())
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
}
