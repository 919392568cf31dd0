//! The cluster's ServiceAccount token signing keys, as the API server publishes them
//! (`/openid/v1/jwks`, ServiceAccount issuer discovery), and the local check of a token's
//! signature against them.
//!
//! Only the API server holds the signing key, so a token whose signature fails here is a
//! forgery, refused without a TokenReview: a flood of them costs a signature check each (tens of
//! microseconds) and nothing the agents need. A token that passes still goes to a TokenReview
//! (its pod or ServiceAccount may be gone), but only the agents' own tokens get that far.
//!
//! Where the keys cannot be read (issuer discovery off, as a 1.20 API server may be configured,
//! or the endpoint refused), nothing is judged here and every token goes to review as before,
//! behind the review budget; the keys are asked for again at most every [`REFRESH_EVERY`]. An
//! unknown key id also asks again (the keys rotate), at the same bounded rate.

use std::time::Duration;

use kube::Client;
use parking_lot::RwLock;
use ring::signature::{
    ECDSA_P256_SHA256_FIXED, ECDSA_P384_SHA384_FIXED, RSA_PKCS1_2048_8192_SHA256,
    RSA_PKCS1_2048_8192_SHA384, RSA_PKCS1_2048_8192_SHA512, RsaPublicKeyComponents,
    UnparsedPublicKey,
};
use serde::Deserialize;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::metrics::TokenCounts;

/// The API server's path for the issuer's public keys.
pub const JWKS_PATH: &str = "/openid/v1/jwks";
/// How often the keys are asked for at most (an unknown key id, or no keys yet).
pub const REFRESH_EVERY: Duration = Duration::from_secs(30);
/// How long one request for the keys may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest key set read (a cluster has a handful of keys of under 1 KiB each).
const JWKS_MAX_BYTES: usize = 256 * 1024;
/// The most keys kept.
const KEYS_MAX: usize = 64;

/// Why a token's signature is refused, or the keys could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeysError {
    /// The signature does not verify under the key it names (or any key of its algorithm).
    #[error("the signature does not verify with the cluster's {alg} key {kid:?}")]
    BadSignature {
        /// The token's `alg`.
        alg: String,
        /// The key tried (`None`: the token names none and no key verified it).
        kid: Option<String>,
    },
    /// The token names a key the cluster does not publish.
    #[error("signed with key {kid:?}, which the cluster does not publish")]
    UnknownKey {
        /// The token's `kid`.
        kid: String,
    },
    /// The token's algorithm cannot be that of a ServiceAccount token, or not with its key.
    #[error("algorithm {alg:?} does not fit the cluster's key {kid:?}")]
    Algorithm {
        /// The token's `alg`.
        alg: String,
        /// The key named.
        kid: Option<String>,
    },
    /// The key set could not be read.
    #[error("cannot read the issuer's keys at {JWKS_PATH}: {0}")]
    Fetch(String),
    /// The key set is not a JWK Set.
    #[error("the issuer's keys at {JWKS_PATH} are not a JWK Set: {0}")]
    Parse(String),
}

/// What the local check says of a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judgement {
    /// Signed by one of the cluster's keys.
    Signed,
    /// Not judged here: no keys are known, or the key it names is of a kind this check cannot
    /// use (the TokenReview decides).
    Unjudged,
}

/// One published key, as the local check uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Key {
    /// RSA (`n`, `e`, big-endian): RS256, RS384, RS512.
    Rsa { n: Vec<u8>, e: Vec<u8> },
    /// An uncompressed P-256 point: ES256.
    P256(Vec<u8>),
    /// An uncompressed P-384 point: ES384.
    P384(Vec<u8>),
    /// A key of a kind not checked here (P-521, say): its tokens go to review.
    Unusable,
}

impl Key {
    /// Verifies `signature` over `message` made with `alg`; `None` when this key is not of
    /// `alg`'s kind.
    fn verify(&self, alg: &str, message: &[u8], signature: &[u8]) -> Option<bool> {
        let ok = match (self, alg) {
            (Key::Rsa { n, e }, "RS256" | "RS384" | "RS512") => {
                let params = match alg {
                    "RS256" => &RSA_PKCS1_2048_8192_SHA256,
                    "RS384" => &RSA_PKCS1_2048_8192_SHA384,
                    _ => &RSA_PKCS1_2048_8192_SHA512,
                };
                RsaPublicKeyComponents { n, e }
                    .verify(params, message, signature)
                    .is_ok()
            }
            (Key::P256(point), "ES256") => UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, point)
                .verify(message, signature)
                .is_ok(),
            (Key::P384(point), "ES384") => UnparsedPublicKey::new(&ECDSA_P384_SHA384_FIXED, point)
                .verify(message, signature)
                .is_ok(),
            _ => return None,
        };
        Some(ok)
    }
}

/// A JWK Set (RFC 7517 §5), the fields read.
#[derive(Deserialize)]
struct JwkSet {
    keys: Vec<Jwk>,
}

/// One JWK (RFC 7517 §4, RFC 7518 §6), the fields read.
#[derive(Deserialize)]
struct Jwk {
    kty: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default, rename = "use")]
    usage: Option<String>,
    #[serde(default)]
    n: Option<String>,
    #[serde(default)]
    e: Option<String>,
    #[serde(default)]
    crv: Option<String>,
    #[serde(default)]
    x: Option<String>,
    #[serde(default)]
    y: Option<String>,
}

/// The published keys, by id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeySet {
    keys: Vec<(Option<String>, Key)>,
}

impl KeySet {
    /// Reads a JWK Set; keys not for signatures are skipped, keys of kinds not checked here are
    /// kept as unusable (their tokens go to review), malformed ones refuse the whole set.
    pub fn parse(body: &[u8]) -> Result<KeySet, KeysError> {
        if body.len() > JWKS_MAX_BYTES {
            return Err(KeysError::Parse(format!(
                "{} bytes, more than {JWKS_MAX_BYTES}",
                body.len()
            )));
        }
        let set: JwkSet =
            serde_json::from_slice(body).map_err(|e| KeysError::Parse(e.to_string()))?;
        if set.keys.len() > KEYS_MAX {
            return Err(KeysError::Parse(format!(
                "{} keys, more than {KEYS_MAX}",
                set.keys.len()
            )));
        }
        let mut keys = Vec::with_capacity(set.keys.len());
        for jwk in set.keys {
            if jwk.usage.as_deref().is_some_and(|u| u != "sig") {
                continue;
            }
            let field = |value: &Option<String>, name: &str| {
                value
                    .as_deref()
                    .and_then(super::jwt::base64url)
                    .filter(|v| !v.is_empty())
                    .ok_or_else(|| {
                        KeysError::Parse(format!(
                            "key {:?} ({}): {name} missing or not base64url",
                            jwk.kid, jwk.kty
                        ))
                    })
            };
            let key = match (jwk.kty.as_str(), jwk.crv.as_deref()) {
                ("RSA", _) => Key::Rsa {
                    n: field(&jwk.n, "n")?,
                    e: field(&jwk.e, "e")?,
                },
                ("EC", Some(crv @ ("P-256" | "P-384"))) => {
                    let (x, y) = (field(&jwk.x, "x")?, field(&jwk.y, "y")?);
                    let mut point = Vec::with_capacity(1 + x.len() + y.len());
                    point.push(0x04);
                    point.extend(x);
                    point.extend(y);
                    if crv == "P-256" {
                        Key::P256(point)
                    } else {
                        Key::P384(point)
                    }
                }
                _ => Key::Unusable,
            };
            keys.push((jwk.kid, key));
        }
        Ok(KeySet { keys })
    }

    /// How many keys are published (the metric's value).
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no key is published.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Judges the signature of a token signed with `alg` (by key `kid`, when named) over
    /// `message` (the header and payload segments as sent).
    pub fn judge(
        &self,
        alg: &str,
        kid: Option<&str>,
        message: &[u8],
        signature: &[u8],
    ) -> Result<Judgement, KeysError> {
        let bad = || KeysError::BadSignature {
            alg: alg.to_owned(),
            kid: kid.map(str::to_owned),
        };
        let unfit = || KeysError::Algorithm {
            alg: alg.to_owned(),
            kid: kid.map(str::to_owned),
        };
        if let Some(kid) = kid {
            let Some((_, key)) = self.keys.iter().find(|(k, _)| k.as_deref() == Some(kid)) else {
                return Err(KeysError::UnknownKey {
                    kid: kid.to_owned(),
                });
            };
            if *key == Key::Unusable {
                return Ok(Judgement::Unjudged);
            }
            return match key.verify(alg, message, signature) {
                Some(true) => Ok(Judgement::Signed),
                Some(false) => Err(bad()),
                None => Err(unfit()),
            };
        }
        // No key named: any key of the algorithm's kind may have signed it.
        let mut tried = false;
        for (_, key) in &self.keys {
            match key.verify(alg, message, signature) {
                Some(true) => return Ok(Judgement::Signed),
                Some(false) => tried = true,
                None => {}
            }
        }
        if self.keys.iter().any(|(_, k)| *k == Key::Unusable) {
            Ok(Judgement::Unjudged)
        } else if tried {
            Err(bad())
        } else {
            Err(unfit())
        }
    }
}

/// What is known of the keys now.
#[derive(Debug, Default)]
struct Known {
    keys: Option<KeySet>,
    asked: Option<Instant>,
}

/// The cluster's signing keys, read through the API server and asked for again when a token
/// names one not seen (at most every [`REFRESH_EVERY`]).
pub struct IssuerKeys {
    client: Option<Client>,
    known: RwLock<Known>,
    asking: tokio::sync::Mutex<()>,
    /// Where the number of keys known is shown, each time they are read.
    counts: Option<TokenCounts>,
}

impl std::fmt::Debug for IssuerKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuerKeys")
            .field("keys", &self.known.read().keys.as_ref().map(KeySet::len))
            .finish_non_exhaustive()
    }
}

impl IssuerKeys {
    /// Keys read through `client` (`None`: never asked for, every token goes to review).
    pub fn new(client: Option<Client>) -> Self {
        IssuerKeys {
            client,
            known: RwLock::new(Known::default()),
            asking: tokio::sync::Mutex::new(()),
            counts: None,
        }
    }

    /// Keys given outright (tests).
    pub fn fixed(keys: KeySet) -> Self {
        IssuerKeys {
            client: None,
            known: RwLock::new(Known {
                keys: Some(keys),
                asked: None,
            }),
            asking: tokio::sync::Mutex::new(()),
            counts: None,
        }
    }

    /// Shows in `counts` how many keys are known, now and each time they are read.
    pub fn counted(mut self, counts: TokenCounts) -> Self {
        counts.issuer_keys(self.count());
        self.counts = Some(counts);
        self
    }

    /// How many keys are known now (0: tokens are not judged here).
    pub fn count(&self) -> usize {
        self.known.read().keys.as_ref().map_or(0, KeySet::len)
    }

    /// Judges a token's signature; asks for the keys again first when none are known or the
    /// token names an unknown one, if the last ask is [`REFRESH_EVERY`] old (one ask at a time;
    /// others meanwhile are judged with what is known).
    pub async fn judge(
        &self,
        alg: &str,
        kid: Option<&str>,
        message: &[u8],
        signature: &[u8],
    ) -> Result<Judgement, KeysError> {
        let first = self.judge_known(alg, kid, message, signature);
        match &first {
            Ok(Judgement::Unjudged) if self.known.read().keys.is_none() => {}
            Err(KeysError::UnknownKey { .. }) => {}
            _ => return first,
        }
        if !self.refresh().await {
            return first;
        }
        self.judge_known(alg, kid, message, signature)
    }

    fn judge_known(
        &self,
        alg: &str,
        kid: Option<&str>,
        message: &[u8],
        signature: &[u8],
    ) -> Result<Judgement, KeysError> {
        match &self.known.read().keys {
            Some(keys) => keys.judge(alg, kid, message, signature),
            None => Ok(Judgement::Unjudged),
        }
    }

    /// Asks the API server for the keys if it is time to; `true` when they were read anew.
    pub async fn refresh(&self) -> bool {
        let Some(client) = &self.client else {
            return false;
        };
        let due = |known: &Known| known.asked.is_none_or(|at| at.elapsed() >= REFRESH_EVERY);
        if !due(&self.known.read()) {
            return false;
        }
        let Ok(_asking) = self.asking.try_lock() else {
            return false;
        };
        if !due(&self.known.read()) {
            return false;
        }
        self.known.write().asked = Some(Instant::now());
        match fetch(client).await {
            Ok(keys) => {
                let mut known = self.known.write();
                if known.keys.as_ref() != Some(&keys) {
                    info!(
                        keys = keys.len(),
                        "ServiceAccount issuer keys read: forged tokens are refused without a TokenReview"
                    );
                }
                if let Some(counts) = &self.counts {
                    counts.issuer_keys(keys.len());
                }
                known.keys = Some(keys);
                true
            }
            Err(e) => {
                warn!(error = %e, "ServiceAccount issuer keys unavailable: every token goes to a TokenReview");
                false
            }
        }
    }
}

/// Reads the key set through the API server.
async fn fetch(client: &Client) -> Result<KeySet, KeysError> {
    let request = http::Request::get(JWKS_PATH)
        .body(Vec::new())
        .map_err(|e| KeysError::Fetch(e.to_string()))?;
    let body = tokio::time::timeout(FETCH_TIMEOUT, client.request_text(request))
        .await
        .map_err(|_| KeysError::Fetch(format!("no answer in {FETCH_TIMEOUT:?}")))?
        .map_err(|e| KeysError::Fetch(e.to_string()))?;
    KeySet::parse(body.as_bytes())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use ring::rand::SystemRandom;
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};

    fn b64(bytes: &[u8]) -> String {
        crate::stream::jwt::tests::b64(bytes)
    }

    fn p256() -> (EcdsaKeyPair, String) {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        let point = pair.public_key().as_ref().to_vec();
        let (x, y) = point[1..].split_at(32);
        let jwk = format!(
            r#"{{"use":"sig","kty":"EC","kid":"k1","crv":"P-256","alg":"ES256","x":"{}","y":"{}"}}"#,
            b64(x),
            b64(y)
        );
        (pair, jwk)
    }

    #[test]
    fn a_p256_signature_is_judged_by_the_key_it_names() {
        let (pair, jwk) = p256();
        let keys = KeySet::parse(format!(r#"{{"keys":[{jwk}]}}"#).as_bytes()).unwrap();
        assert_eq!(keys.len(), 1);
        let message = b"header.payload";
        let signature = pair
            .sign(&SystemRandom::new(), message)
            .unwrap()
            .as_ref()
            .to_vec();
        assert_eq!(
            keys.judge("ES256", Some("k1"), message, &signature),
            Ok(Judgement::Signed)
        );
        assert_eq!(
            keys.judge("ES256", None, message, &signature),
            Ok(Judgement::Signed)
        );
        let mut forged = signature.clone();
        forged[10] ^= 1;
        assert!(matches!(
            keys.judge("ES256", Some("k1"), message, &forged),
            Err(KeysError::BadSignature { .. })
        ));
        assert!(matches!(
            keys.judge("ES256", Some("k1"), b"header.other", &signature),
            Err(KeysError::BadSignature { .. })
        ));
        assert!(matches!(
            keys.judge("ES256", Some("k2"), message, &signature),
            Err(KeysError::UnknownKey { .. })
        ));
        // An RSA algorithm with an EC key, or HMAC with a public key as the secret: refused.
        for alg in ["RS256", "HS256"] {
            assert!(matches!(
                keys.judge(alg, Some("k1"), message, &signature),
                Err(KeysError::Algorithm { .. })
            ));
            assert!(matches!(
                keys.judge(alg, None, message, &signature),
                Err(KeysError::Algorithm { .. })
            ));
        }
    }

    #[test]
    fn keys_of_other_kinds_leave_their_tokens_to_review_and_bad_sets_are_refused() {
        let set = br#"{"keys":[{"kty":"EC","kid":"big","crv":"P-521","x":"AA","y":"AA"},
                               {"kty":"RSA","kid":"enc","use":"enc","n":"AQAB","e":"AQAB"}]}"#;
        let keys = KeySet::parse(set).unwrap();
        assert_eq!(keys.len(), 1, "the encryption key is skipped");
        assert_eq!(
            keys.judge("ES512", Some("big"), b"m", b"s"),
            Ok(Judgement::Unjudged)
        );
        assert_eq!(
            keys.judge("ES512", None, b"m", b"s"),
            Ok(Judgement::Unjudged)
        );
        assert!(matches!(
            keys.judge("ES512", Some("enc"), b"m", b"s"),
            Err(KeysError::UnknownKey { .. })
        ));
        for bad in [
            &b"not json"[..],
            br#"{"keys":[{"kty":"RSA","kid":"k","e":"AQAB"}]}"#,
            br#"{"keys":[{"kty":"EC","crv":"P-256","x":"!!","y":"AA"}]}"#,
            br#"{"nokeys":[]}"#,
        ] {
            assert!(
                matches!(KeySet::parse(bad), Err(KeysError::Parse(_))),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let many = format!(
            r#"{{"keys":[{}]}}"#,
            vec![r#"{"kty":"oct"}"#; KEYS_MAX + 1].join(",")
        );
        assert!(matches!(
            KeySet::parse(many.as_bytes()),
            Err(KeysError::Parse(m)) if m.contains("keys, more than")
        ));
    }

    /// A throwaway RSA key made for this test (PKCS#1 DER), as a cluster's `sa.key` may be.
    const RSA_KEY: &[u8] = include_bytes!("testdata/throwaway-rsa-2048.der");

    #[test]
    fn an_rsa_signature_is_judged_for_each_hash() {
        use ring::signature::{
            RSA_PKCS1_SHA256, RSA_PKCS1_SHA384, RSA_PKCS1_SHA512, RsaEncoding, RsaKeyPair,
        };
        let pair = RsaKeyPair::from_der(RSA_KEY).unwrap();
        let public: RsaPublicKeyComponents<Vec<u8>> = pair.public().into();
        let jwk = format!(
            r#"{{"keys":[{{"use":"sig","kty":"RSA","kid":"r","alg":"RS256","n":"{}","e":"{}"}}]}}"#,
            b64(&public.n),
            b64(&public.e)
        );
        let keys = KeySet::parse(jwk.as_bytes()).unwrap();
        let message = b"header.payload";
        let algorithms: [(&str, &'static dyn RsaEncoding); 3] = [
            ("RS256", &RSA_PKCS1_SHA256),
            ("RS384", &RSA_PKCS1_SHA384),
            ("RS512", &RSA_PKCS1_SHA512),
        ];
        for (alg, encoding) in algorithms {
            let mut signature = vec![0; pair.public().modulus_len()];
            pair.sign(encoding, &SystemRandom::new(), message, &mut signature)
                .unwrap();
            assert_eq!(
                keys.judge(alg, Some("r"), message, &signature),
                Ok(Judgement::Signed),
                "{alg}"
            );
            signature[0] ^= 1;
            assert!(
                matches!(
                    keys.judge(alg, Some("r"), message, &signature),
                    Err(KeysError::BadSignature { .. })
                ),
                "{alg}"
            );
        }
        assert!(matches!(
            keys.judge("ES256", Some("r"), message, &[0; 64]),
            Err(KeysError::Algorithm { .. })
        ));
    }

    #[tokio::test]
    async fn without_keys_nothing_is_judged() {
        let none = IssuerKeys::new(None);
        assert_eq!(
            none.judge("RS256", Some("k"), b"m", b"s").await,
            Ok(Judgement::Unjudged)
        );
        assert_eq!(none.count(), 0);
    }
}
