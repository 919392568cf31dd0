//! How the agent reaches the controller securely: the controller's CA (a file, mounted from the
//! ConfigMap the controller publishes) verifies the server, and a ServiceAccount token (a file the
//! kubelet rotates) proves who we are. Both files are read at every connection, so a renewed CA
//! or token is picked up without a restart.

use std::path::PathBuf;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

/// Why a connection to the controller cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// The endpoint and the CA file do not go together (a CA needs https://, https:// needs a
    /// CA).
    #[error("controller endpoint {endpoint:?}: {reason}")]
    Endpoint {
        /// The endpoint.
        endpoint: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// The endpoint is not a URI, or tonic refused its TLS settings.
    #[error("controller endpoint {endpoint:?}: {source}")]
    Transport {
        /// The endpoint.
        endpoint: String,
        /// tonic's error.
        source: tonic::transport::Error,
    },
    /// A file cannot be read (the projected volume may not have it yet).
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The token file holds something that cannot be sent as metadata.
    #[error("token in {0} is empty or not printable ASCII")]
    BadToken(String),
}

/// The agent's trust anchor and identity for the config stream; both unset means plaintext.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    /// PEM CA bundle that signs the controller's certificate; requires an `https://` endpoint.
    pub ca_file: Option<PathBuf>,
    /// File holding a ServiceAccount token sent as `authorization: Bearer`.
    pub token_file: Option<PathBuf>,
}

fn read(path: &PathBuf) -> Result<String, CredentialsError> {
    std::fs::read_to_string(path).map_err(|source| CredentialsError::Read {
        path: path.display().to_string(),
        source,
    })
}

impl Credentials {
    /// An endpoint for `uri`, with TLS verified against the CA file when one is configured.
    pub fn endpoint(&self, uri: &str) -> Result<Endpoint, CredentialsError> {
        let bad = |reason: &'static str| CredentialsError::Endpoint {
            endpoint: uri.to_owned(),
            reason,
        };
        let transport = |source| CredentialsError::Transport {
            endpoint: uri.to_owned(),
            source,
        };
        let endpoint = Endpoint::from_shared(uri.to_owned()).map_err(transport)?;
        let https = uri.starts_with("https://");
        match &self.ca_file {
            Some(path) => {
                if !https {
                    return Err(bad("a controller CA file needs an https:// endpoint"));
                }
                let pem = read(path)?;
                endpoint
                    .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)))
                    .map_err(transport)
            }
            None if https => Err(bad(
                "an https:// endpoint needs the controller's CA (--controller-ca-file)",
            )),
            None => Ok(endpoint),
        }
    }

    /// The `authorization` metadata value, read fresh from the token file; `None` without one.
    pub fn authorization(&self) -> Result<Option<MetadataValue<Ascii>>, CredentialsError> {
        let Some(path) = &self.token_file else {
            return Ok(None);
        };
        let token = read(path)?;
        let token = token.trim();
        if token.is_empty() {
            return Err(CredentialsError::BadToken(path.display().to_string()));
        }
        format!("Bearer {token}")
            .parse()
            .map(Some)
            .map_err(|_| CredentialsError::BadToken(path.display().to_string()))
    }

    /// Adds the token to a request.
    pub fn authorize<T>(&self, request: &mut tonic::Request<T>) -> Result<(), CredentialsError> {
        if let Some(value) = self.authorization()? {
            request.metadata_mut().insert("authorization", value);
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn plaintext_without_files() {
        let c = Credentials::default();
        c.endpoint("http://127.0.0.1:9090").unwrap();
        assert_eq!(c.authorization().unwrap(), None);
        let err = c.endpoint("https://ctl:9090").unwrap_err().to_string();
        assert!(err.contains("--controller-ca-file"), "{err}");
    }

    #[test]
    fn a_ca_file_requires_https_and_must_exist() {
        let dir = tempfile::tempdir().unwrap();
        let c = Credentials {
            ca_file: Some(dir.path().join("ca.crt")),
            token_file: None,
        };
        assert!(
            c.endpoint("http://ctl:9090")
                .unwrap_err()
                .to_string()
                .contains("https://")
        );
        assert!(matches!(
            c.endpoint("https://ctl:9090"),
            Err(CredentialsError::Read { .. })
        ));
    }

    #[test]
    fn the_token_is_read_fresh_and_sent_as_bearer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        let c = Credentials {
            ca_file: None,
            token_file: Some(path.clone()),
        };
        assert!(matches!(
            c.authorization(),
            Err(CredentialsError::Read { .. })
        ));
        std::fs::write(&path, "one\n").unwrap();
        assert_eq!(c.authorization().unwrap().unwrap(), "Bearer one");
        std::fs::write(&path, "two").unwrap();
        assert_eq!(c.authorization().unwrap().unwrap(), "Bearer two");
        std::fs::write(&path, "bad\u{7}token").unwrap();
        assert!(matches!(
            c.authorization(),
            Err(CredentialsError::BadToken(_))
        ));
        std::fs::write(&path, "  ").unwrap();
        assert!(matches!(
            c.authorization(),
            Err(CredentialsError::BadToken(_))
        ));
    }
}
