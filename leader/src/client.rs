//! The API client every electing process builds: from a kubeconfig file when one is given, else
//! from the in-cluster configuration (or `$KUBECONFIG`), naming the binary in its User-Agent so
//! the API server's audit log and request metrics tell the controller's calls from the agent's
//! (kube-rs sends none of its own). One definition, so the two binaries cannot drift apart.

use std::path::{Path, PathBuf};

use kube::config::{InferConfigError, KubeConfigOptions, Kubeconfig, KubeconfigError};

/// Why no API client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig file could not be read or does not hold a usable context.
    #[error("loading kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What kube-rs said.
        source: KubeconfigError,
    },
    /// Neither in-cluster configuration nor `$KUBECONFIG` could be used.
    #[error("inferring the API server's configuration: {0}")]
    Infer(#[from] InferConfigError),
    /// The configuration holds something the client cannot use (e.g. a bad certificate).
    #[error("building the API client: {0}")]
    Build(#[from] kube::Error),
}

/// Builds the client from `kubeconfig`, or from the environment when `None`; `user_agent` is
/// sent with every request, e.g. `vm-dhcp-agent/0.1.0`.
pub async fn connect(
    kubeconfig: Option<&Path>,
    user_agent: &'static str,
) -> Result<kube::Client, ClientError> {
    let loading = |source| ClientError::Kubeconfig {
        path: kubeconfig.map(Path::to_path_buf).unwrap_or_default(),
        source,
    };
    let mut config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).map_err(loading)?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(loading)?
        }
        None => kube::Config::infer().await?,
    };
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(user_agent),
    ));
    Ok(kube::Client::try_from(config)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_missing_kubeconfig_is_named_in_the_error() {
        let path = Path::new("/nonexistent/vmdhcp/kubeconfig");
        let Err(err) = connect(Some(path), "test/0").await else {
            panic!("a client from a kubeconfig that does not exist");
        };
        assert!(matches!(err, ClientError::Kubeconfig { .. }), "{err}");
        assert!(
            err.to_string().contains("/nonexistent/vmdhcp/kubeconfig"),
            "{err}"
        );
    }
}
