//! A bearer token read as a JWT (RFC 7519) without trusting it: its JOSE header, the claims the
//! config stream's gate looks at, and the bytes its signature covers. What they are worth is
//! decided elsewhere: the signature against the cluster's keys ([`super::keys`]), the audience,
//! expiry and verdict by the gate ([`super::auth`]).

use serde::Deserialize;
use serde::de::DeserializeOwned;

/// The longest token looked at: a projected ServiceAccount token is about 1 KiB, and a bigger
/// one would only cost decoding (and the API server a larger review).
pub const TOKEN_MAX: usize = 8 * 1024;

/// Why a token is not a JWT a ServiceAccount could hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwtError {
    /// Larger than [`TOKEN_MAX`].
    #[error("{0} bytes, more than {TOKEN_MAX}")]
    TooLarge(usize),
    /// Not three dot-separated segments.
    #[error("not a JWT (three dot-separated segments)")]
    Segments,
    /// No signature, or one not in base64url.
    #[error("the signature is empty or not base64url")]
    Signature,
    /// The header or payload is not base64url.
    #[error("the {0} is not base64url")]
    Encoding(&'static str),
    /// The header or payload is not the JSON object expected.
    #[error("the {what} is not the JSON expected: {error}")]
    Json {
        /// `header` or `payload`.
        what: &'static str,
        /// serde's account.
        error: String,
    },
    /// `alg: none`.
    #[error("unsigned (alg \"none\")")]
    Unsigned,
}

/// The JOSE header fields looked at.
#[derive(Deserialize)]
struct Header {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
}

/// The claims looked at.
#[derive(Deserialize)]
struct Claims {
    #[serde(default)]
    aud: Audiences,
    exp: Option<f64>,
    #[serde(default)]
    sub: Option<String>,
    #[serde(default, rename = "kubernetes.io")]
    kubernetes: Option<KubernetesClaims>,
}

/// The `kubernetes.io` claims of a ServiceAccount token: what it is bound to.
#[derive(Deserialize)]
struct KubernetesClaims {
    #[serde(default)]
    pod: Option<BoundObject>,
}

/// An object a token is bound to.
#[derive(Deserialize)]
struct BoundObject {
    name: String,
}

/// `aud`: one string or a list (RFC 7519 §4.1.3).
#[derive(Deserialize)]
#[serde(untagged)]
enum Audiences {
    One(String),
    Many(Vec<String>),
}

impl Default for Audiences {
    fn default() -> Self {
        Audiences::Many(Vec::new())
    }
}

impl Audiences {
    fn into_vec(self) -> Vec<String> {
        match self {
            Audiences::One(a) => vec![a],
            Audiences::Many(a) => a,
        }
    }
}

/// A token read as a JWT; its claims are trusted only once the signature is checked (or a
/// TokenReview verified them).
#[cfg_attr(test, derive(Debug, PartialEq))]
pub struct Jwt<'a> {
    /// The signing algorithm the header names.
    pub alg: String,
    /// The signing key the header names.
    pub kid: Option<String>,
    /// The header and payload segments, as signed.
    pub signed: &'a str,
    /// The signature, decoded.
    pub signature: Vec<u8>,
    /// `aud`, as a list.
    pub aud: Vec<String>,
    /// `exp`, seconds since the epoch.
    pub exp: Option<f64>,
    /// `sub`: for a ServiceAccount, `system:serviceaccount:<namespace>:<name>`.
    pub sub: Option<String>,
    /// The pod the token is bound to (`kubernetes.io.pod.name`).
    pub pod: Option<String>,
}

impl<'a> Jwt<'a> {
    /// Reads `token`: at most [`TOKEN_MAX`] bytes, three base64url segments, a header naming an
    /// algorithm other than `none`, a JSON payload, a non-empty signature.
    pub fn read(token: &'a str) -> Result<Self, JwtError> {
        if token.len() > TOKEN_MAX {
            return Err(JwtError::TooLarge(token.len()));
        }
        let mut segments = token.split('.');
        let (Some(header), Some(payload), Some(signature), None) = (
            segments.next(),
            segments.next(),
            segments.next(),
            segments.next(),
        ) else {
            return Err(JwtError::Segments);
        };
        let signature = base64url(signature)
            .filter(|s| !s.is_empty())
            .ok_or(JwtError::Signature)?;
        let signed = &token[..header.len() + 1 + payload.len()];
        let header: Header = segment(header, "header")?;
        if header.alg.eq_ignore_ascii_case("none") {
            return Err(JwtError::Unsigned);
        }
        let claims: Claims = segment(payload, "payload")?;
        Ok(Jwt {
            alg: header.alg,
            kid: header.kid,
            signed,
            signature,
            aud: claims.aud.into_vec(),
            exp: claims.exp,
            sub: claims.sub,
            pod: claims.kubernetes.and_then(|k| k.pod).map(|p| p.name),
        })
    }
}

/// One JWT segment, base64url-decoded and parsed as JSON.
fn segment<T: DeserializeOwned>(segment: &str, what: &'static str) -> Result<T, JwtError> {
    let bytes = base64url(segment).ok_or(JwtError::Encoding(what))?;
    serde_json::from_slice(&bytes).map_err(|e| JwtError::Json {
        what,
        error: e.to_string(),
    })
}

/// Decodes unpadded base64url (RFC 7515 §2: how JWT segments and JWK members are written);
/// `None` on any other character or an impossible length.
pub fn base64url(text: &str) -> Option<Vec<u8>> {
    if text.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() / 4 * 3 + 2);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes() {
        let sextet = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => return None,
        };
        // Only the bits not yet written are kept (fewer than 14).
        acc = ((acc << 6) | u32::from(sextet)) & 0x3fff;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(((acc >> bits) & 0xff) as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests {
    use super::*;

    /// Unpadded base64url, to forge tokens.
    pub(crate) fn b64(bytes: &[u8]) -> String {
        const ALPHABET: &[u8; 64] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
            for i in 0..=chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            }
        }
        out
    }

    #[test]
    fn base64url_decodes_every_length_and_refuses_other_alphabets() {
        for text in [
            "",
            "f",
            "fo",
            "foo",
            "foob",
            "fooba",
            "foobar",
            "\u{ff}\u{fe}?>",
        ] {
            assert_eq!(base64url(&b64(text.as_bytes())).unwrap(), text.as_bytes());
        }
        assert_eq!(
            base64url("eyJhbGciOiJSUzI1NiJ9").unwrap(),
            br#"{"alg":"RS256"}"#
        );
        assert_eq!(base64url("-_8").unwrap(), [0xfb, 0xff]);
        assert_eq!(base64url("a+/="), None, "standard alphabet and padding");
        assert_eq!(base64url("abcde"), None, "no length leaves one sextet over");
    }

    #[test]
    fn a_token_is_read_into_what_the_checks_need_and_nothing_is_trusted() {
        let header = b64(br#"{"alg":"ES256","kid":"k1","typ":"JWT"}"#);
        let payload = b64(serde_json::json!({
            "aud": "only-one", "exp": 1_000_600, "sub": "system:serviceaccount:ns:agent",
            "kubernetes.io": {"namespace": "ns", "pod": {"name": "agent-0", "uid": "u"}}
        })
        .to_string()
        .as_bytes());
        let token = format!("{header}.{payload}.{}", b64(b"sig"));
        let jwt = Jwt::read(&token).unwrap();
        assert_eq!(jwt.alg, "ES256");
        assert_eq!(jwt.kid.as_deref(), Some("k1"));
        assert_eq!(jwt.signed, format!("{header}.{payload}"));
        assert_eq!(jwt.signature, b"sig");
        assert_eq!(jwt.aud, ["only-one"]);
        assert_eq!(jwt.exp, Some(1_000_600.0));
        assert_eq!(jwt.sub.as_deref(), Some("system:serviceaccount:ns:agent"));
        assert_eq!(jwt.pod.as_deref(), Some("agent-0"));

        // Claims missing are absent, not refused: what they mean is for the gate to say.
        let bare = format!("{header}.{}.{}", b64(b"{}"), b64(b"sig"));
        let jwt = Jwt::read(&bare).unwrap();
        assert!(jwt.aud.is_empty() && jwt.exp.is_none() && jwt.sub.is_none());

        for (token, want) in [
            ("a.b".to_owned(), JwtError::Segments),
            (format!("{header}.{payload}."), JwtError::Signature),
            (format!("!.{payload}.c2ln"), JwtError::Encoding("header")),
            (
                format!("{}.{payload}.c2ln", b64(br#"{"alg":"none"}"#)),
                JwtError::Unsigned,
            ),
            ("A".repeat(TOKEN_MAX + 1), JwtError::TooLarge(TOKEN_MAX + 1)),
        ] {
            assert_eq!(Jwt::read(&token).err(), Some(want), "{token:.40}");
        }
        assert!(matches!(
            Jwt::read(&format!("{header}.{}.c2ln", b64(b"[1]"))),
            Err(JwtError::Json {
                what: "payload",
                ..
            })
        ));
    }
}
