//! The controller's TLS in the cluster: its CA and serving certificate live in one Secret, the CA
//! bundle is published in a ConfigMap (mounted by agents) and injected into the webhook
//! configurations, and every replica serves the current certificate from memory.
//!
//! Every replica watches the Secret and serves what it holds; only the leader creates, renews
//! (see [`crate::security::certs`]) and publishes. All writes are optimistic (create, or replace at the read
//! `resourceVersion`), so two replicas racing at a leadership change converge on one Secret.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use futures_util::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watcher};
use kube::{Api, Client};
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use time::OffsetDateTime;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::security::certs::{self, Material, Policy};

/// Why TLS material could not be loaded, stored or published.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Generating or reading certificates failed.
    #[error(transparent)]
    Cert(#[from] certs::CertError),
    /// The Secret lacks a key or holds something rustls cannot use.
    #[error("Secret {secret}: {reason}")]
    Invalid {
        /// `namespace/name` of the Secret.
        secret: String,
        /// What is wrong.
        reason: String,
    },
    /// A key's PEM does not decode.
    #[error("{key}: {source}")]
    Pem {
        /// The key (`tls.crt`, `tls.key`).
        key: &'static str,
        /// What the PEM decoder said.
        source: rustls::pki_types::pem::Error,
    },
    /// rustls cannot sign with the private key.
    #[error("{key}: {source}")]
    Signing {
        /// The key (`tls.key`).
        key: &'static str,
        /// What rustls said.
        source: rustls::Error,
    },
    /// An API call failed.
    #[error("{action}: {source}")]
    Api {
        /// What was attempted.
        action: String,
        /// The API error.
        source: kube::Error,
    },
}

/// Where the material lives and what it must cover.
#[derive(Clone, Debug)]
pub struct TlsSettings {
    /// Namespace of the Secret and ConfigMap (the controller's own).
    pub namespace: String,
    /// The Secret holding CA and serving certificate.
    pub secret: String,
    /// ConfigMap to publish the CA bundle in (`ca.crt`), for agents.
    pub ca_configmap: Option<String>,
    /// Mutating and Validating webhook configurations (same name) to inject the CA bundle into.
    pub webhook: Option<String>,
    /// Lifetimes and names of the certificates.
    pub policy: Policy,
}

/// Secret keys. `tls.crt`/`tls.key` follow `kubernetes.io/tls`; `ca.crt` is the whole trusted
/// bundle (newest CA first), `ca.key` the newest CA's key.
const KEY_CERT: &str = "tls.crt";
const KEY_KEY: &str = "tls.key";
const KEY_CA: &str = "ca.crt";
const KEY_CA_KEY: &str = "ca.key";

/// How often the leader re-checks what it published (a `helm upgrade` may reset a caBundle).
const RESYNC: Duration = Duration::from_secs(30);

/// The certificate this replica serves, swapped atomically when the Secret changes; rustls asks
/// for it on every handshake, so a renewal takes effect without a restart.
#[derive(Default)]
pub struct ServingCerts {
    current: ArcSwapOption<CertifiedKey>,
    bundle: ArcSwapOption<String>,
    expiries: ArcSwapOption<Vec<(&'static str, i64)>>,
    loaded: Option<watch::Sender<u64>>,
}

impl std::fmt::Debug for ServingCerts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingCerts")
            .field("loaded", &self.current.load().is_some())
            .finish()
    }
}

impl ServingCerts {
    /// An empty holder: handshakes fail until the first [`ServingCerts::load`].
    pub fn new() -> Self {
        Self {
            loaded: Some(watch::channel(0).0),
            ..Self::default()
        }
    }

    /// Serves `material` from now on.
    pub fn load(&self, material: &Material) -> Result<(), TlsError> {
        let invalid = |reason: String| TlsError::Invalid {
            secret: "in memory".into(),
            reason,
        };
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(material.cert.as_bytes())
                .collect::<Result<_, _>>()
                .map_err(|source| TlsError::Pem {
                    key: KEY_CERT,
                    source,
                })?;
        if chain.is_empty() {
            return Err(invalid(format!("{KEY_CERT}: no certificate")));
        }
        let key = PrivateKeyDer::from_pem_slice(material.key.as_bytes()).map_err(|source| {
            TlsError::Pem {
                key: KEY_KEY,
                source,
            }
        })?;
        let signing = rustls::crypto::ring::sign::any_supported_type(&key).map_err(|source| {
            TlsError::Signing {
                key: KEY_KEY,
                source,
            }
        })?;
        let unchanged = self
            .current
            .load()
            .as_ref()
            .is_some_and(|c| c.cert == chain);
        if !unchanged {
            self.current
                .store(Some(Arc::new(CertifiedKey::new(chain, signing))));
            self.bundle
                .store(Some(Arc::new(material.ca_bundle.clone())));
            // The bundle's first CA is the newest: the one that signs from now on.
            let expiries = [("serving", &material.cert), ("ca", &material.ca_bundle)]
                .into_iter()
                .filter_map(|(which, pem)| {
                    let info = certs::inspect(pem).ok()?;
                    Some((which, info.not_after.unix_timestamp()))
                })
                .collect();
            self.expiries.store(Some(Arc::new(expiries)));
            if let Some(tx) = &self.loaded {
                tx.send_modify(|n| *n += 1);
            }
        }
        Ok(())
    }

    /// Whether a certificate is loaded (readiness of the TLS listeners).
    pub fn is_loaded(&self) -> bool {
        self.current.load().is_some()
    }

    /// The trusted CA bundle (PEM) of the loaded material.
    pub fn ca_bundle(&self) -> Option<Arc<String>> {
        self.bundle.load_full()
    }

    /// When the loaded serving certificate (`serving`) and the newest CA of its bundle (`ca`)
    /// expire, in seconds since the epoch; empty before the first load.
    pub fn expiries(&self) -> Vec<(&'static str, i64)> {
        self.expiries.load().as_deref().cloned().unwrap_or_default()
    }

    /// Counts loads; a receiver sees each new certificate.
    pub fn subscribe(&self) -> Option<watch::Receiver<u64>> {
        self.loaded.as_ref().map(watch::Sender::subscribe)
    }

    /// A rustls server configuration that always presents the current certificate.
    pub fn server_config(self: &Arc<Self>, alpn: &[&[u8]]) -> Arc<ServerConfig> {
        let mut config =
            ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap_or_else(|_| ServerConfig::builder())
                .with_no_client_auth()
                .with_cert_resolver(self.clone());
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }
}

impl ResolvesServerCert for ServingCerts {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.load_full()
    }
}

/// Whether a Secret holds material at all: the chart creates it empty (so that `helm uninstall`
/// removes it), and an empty Secret means "not issued yet", not "unusable".
pub fn issued(secret: &Secret) -> bool {
    secret.data.as_ref().is_some_and(|d| !d.is_empty())
}

/// Reads the material out of a Secret.
pub fn material_of(secret: &Secret) -> Result<Material, TlsError> {
    let name = format!(
        "{}/{}",
        secret.metadata.namespace.as_deref().unwrap_or_default(),
        secret.metadata.name.as_deref().unwrap_or_default()
    );
    let data = secret.data.clone().unwrap_or_default();
    let get = |key: &str| -> Result<String, TlsError> {
        let bytes = data.get(key).ok_or_else(|| TlsError::Invalid {
            secret: name.clone(),
            reason: format!("no key {key}"),
        })?;
        String::from_utf8(bytes.0.clone()).map_err(|_| TlsError::Invalid {
            secret: name.clone(),
            reason: format!("{key} is not UTF-8 PEM"),
        })
    };
    Ok(Material {
        ca_bundle: get(KEY_CA)?,
        ca_key: get(KEY_CA_KEY)?,
        cert: get(KEY_CERT)?,
        key: get(KEY_KEY)?,
    })
}

fn secret_data(m: &Material) -> BTreeMap<String, ByteString> {
    [
        (KEY_CA, &m.ca_bundle),
        (KEY_CA_KEY, &m.ca_key),
        (KEY_CERT, &m.cert),
        (KEY_KEY, &m.key),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), ByteString(v.as_bytes().to_vec())))
    .collect()
}

/// Keeps `certs` loaded from the Secret on every replica and, while leading, the Secret, the CA
/// ConfigMap and the webhook caBundles up to date. Ends on shutdown.
pub async fn run(
    client: Client,
    settings: TlsSettings,
    certs: Arc<ServingCerts>,
    mut leader: watch::Receiver<bool>,
    mut shutdown: watch::Receiver<bool>,
) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &settings.namespace);
    let mut changes = std::pin::pin!(
        watcher(
            secrets.clone(),
            watcher::Config::default().fields(&format!("metadata.name={}", settings.secret)),
        )
        .default_backoff()
        .applied_objects()
    );
    let mut next_check = tokio::time::Instant::now();
    loop {
        tokio::select! {
            event = changes.next() => match event {
                Some(Ok(secret)) if !issued(&secret) => {
                    debug!(secret = %settings.secret, "no certificate issued yet");
                }
                Some(Ok(secret)) => match material_of(&secret).and_then(|m| certs.load(&m)) {
                    Ok(()) => debug!(secret = %settings.secret, "serving certificate loaded"),
                    Err(e) => warn!(secret = %settings.secret, error = %e, "cannot serve the stored certificate"),
                },
                Some(Err(e)) => debug!(error = %e, "Secret watch interrupted; retrying"),
                None => return,
            },
            _ = leader.changed() => {}
            () = tokio::time::sleep_until(next_check) => {}
            _ = shutdown.changed() => {}
        }
        if *shutdown.borrow() {
            return;
        }
        if !*leader.borrow() {
            next_check = tokio::time::Instant::now() + RESYNC;
            continue;
        }
        let wait = match ensure(&client, &settings, &certs).await {
            Ok(due) => due.min(RESYNC),
            Err(e) => {
                warn!(secret = %settings.secret, error = %e, "TLS upkeep failed; retrying");
                Duration::from_secs(2)
            }
        };
        next_check = tokio::time::Instant::now() + wait;
    }
}

/// One leader pass: renew what is due, store it, serve it, publish the CA. Returns the time
/// until the next renewal falls due.
pub async fn ensure(
    client: &Client,
    settings: &TlsSettings,
    certs: &ServingCerts,
) -> Result<Duration, TlsError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &settings.namespace);
    let api_err = |action: String| move |source| TlsError::Api { action, source };
    let existing = secrets
        .get_opt(&settings.secret)
        .await
        .map_err(api_err(format!("reading Secret {}", settings.secret)))?;
    let current = existing.as_ref().filter(|s| issued(s)).map(material_of);
    if let Some(Err(e)) = &current {
        warn!(error = %e, "stored TLS material unusable; replacing it");
    }
    let now = OffsetDateTime::now_utc();
    let outcome = certs::reconcile(
        current.as_ref().and_then(|c| c.as_ref().ok()),
        &settings.policy,
        now,
    )?;
    if !outcome.changes.is_empty() {
        let serial = certs::inspect(&outcome.material.cert)
            .map(|i| i.serial)
            .unwrap_or_default();
        let mut secret = existing.unwrap_or_else(|| Secret {
            metadata: ObjectMeta {
                name: Some(settings.secret.clone()),
                namespace: Some(settings.namespace.clone()),
                labels: Some(
                    [(
                        "app.kubernetes.io/managed-by".to_owned(),
                        "vm-dhcp-controller".to_owned(),
                    )]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            type_: Some("kubernetes.io/tls".into()),
            ..Secret::default()
        });
        secret.data = Some(secret_data(&outcome.material));
        let stored = if secret.metadata.resource_version.is_some() {
            secrets
                .replace(&settings.secret, &PostParams::default(), &secret)
                .await
        } else {
            secrets.create(&PostParams::default(), &secret).await
        }
        .map_err(api_err(format!("writing Secret {}", settings.secret)))?;
        info!(secret = %settings.secret, %serial, changes = ?outcome.changes, resource_version = ?stored.metadata.resource_version, "TLS material renewed");
    }
    certs.load(&outcome.material)?;
    publish(client, settings, &outcome.material.ca_bundle).await?;
    let due = outcome.next_check - now;
    Ok(Duration::from_secs(
        u64::try_from(due.whole_seconds()).unwrap_or(0).max(1),
    ))
}

/// Writes the CA bundle where clients read it, when it differs.
async fn publish(client: &Client, settings: &TlsSettings, bundle: &str) -> Result<(), TlsError> {
    let api_err = |action: String| move |source| TlsError::Api { action, source };
    if let Some(name) = &settings.ca_configmap {
        let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &settings.namespace);
        let data: BTreeMap<String, String> = [(KEY_CA.to_owned(), bundle.to_owned())].into();
        match maps
            .get_opt(name)
            .await
            .map_err(api_err(format!("reading ConfigMap {name}")))?
        {
            Some(cm) if cm.data.as_ref() == Some(&data) => {}
            Some(mut cm) => {
                cm.data = Some(data);
                maps.replace(name, &PostParams::default(), &cm)
                    .await
                    .map_err(api_err(format!("updating ConfigMap {name}")))?;
                info!(configmap = %name, "CA bundle published");
            }
            None => {
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        namespace: Some(settings.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    data: Some(data),
                    ..ConfigMap::default()
                };
                maps.create(&PostParams::default(), &cm)
                    .await
                    .map_err(api_err(format!("creating ConfigMap {name}")))?;
                info!(configmap = %name, "CA bundle published");
            }
        }
    }
    if let Some(name) = &settings.webhook {
        let want = ByteString(bundle.as_bytes().to_vec());
        inject_into(client, name, mutating_bundles, &want).await?;
        inject_into(client, name, validating_bundles, &want).await?;
    }
    Ok(())
}

fn mutating_bundles(c: &mut MutatingWebhookConfiguration) -> Vec<&mut Option<ByteString>> {
    let hooks = c.webhooks.iter_mut().flatten();
    hooks.map(|h| &mut h.client_config.ca_bundle).collect()
}

fn validating_bundles(c: &mut ValidatingWebhookConfiguration) -> Vec<&mut Option<ByteString>> {
    let hooks = c.webhooks.iter_mut().flatten();
    hooks.map(|h| &mut h.client_config.ca_bundle).collect()
}

/// Writes `want` into every caBundle of the webhook configuration `name` (kind `K`), if it exists
/// and any differs.
async fn inject_into<K>(
    client: &Client,
    name: &str,
    bundles: fn(&mut K) -> Vec<&mut Option<ByteString>>,
    want: &ByteString,
) -> Result<(), TlsError>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned,
{
    let kind = K::kind(&());
    let api: Api<K> = Api::all(client.clone());
    let api_err = |action: String| move |source| TlsError::Api { action, source };
    let Some(mut cfg) = api
        .get_opt(name)
        .await
        .map_err(api_err(format!("reading {kind} {name}")))?
    else {
        return Ok(());
    };
    if inject(bundles(&mut cfg).into_iter(), want) {
        api.replace(name, &PostParams::default(), &cfg)
            .await
            .map_err(api_err(format!("updating {kind} {name}")))?;
        info!(webhook = %name, %kind, "CA bundle injected");
    }
    Ok(())
}

/// Sets every slot to `want`; true when any changed.
fn inject<'a>(slots: impl Iterator<Item = &'a mut Option<ByteString>>, want: &ByteString) -> bool {
    let mut changed = false;
    for slot in slots {
        if slot.as_ref() != Some(want) {
            *slot = Some(want.clone());
            changed = true;
        }
    }
    changed
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn secret_round_trips_the_material() {
        let out = certs::reconcile(None, &Policy::default(), OffsetDateTime::now_utc()).unwrap();
        let secret = Secret {
            data: Some(secret_data(&out.material)),
            ..Secret::default()
        };
        assert_eq!(material_of(&secret).unwrap(), out.material);
    }

    #[test]
    fn the_charts_empty_secret_is_not_issued_yet() {
        let mut secret = Secret::default();
        assert!(!issued(&secret));
        secret.data = Some(BTreeMap::new());
        assert!(!issued(&secret));
        secret.data = Some([(KEY_CERT.to_owned(), ByteString(b"x".to_vec()))].into());
        assert!(issued(&secret));
    }

    #[test]
    fn a_secret_missing_a_key_names_it() {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some("s".into()),
                namespace: Some("ns".into()),
                ..ObjectMeta::default()
            },
            data: Some([(KEY_CERT.to_owned(), ByteString(b"x".to_vec()))].into()),
            ..Secret::default()
        };
        let err = material_of(&secret).unwrap_err().to_string();
        assert!(err.contains("ns/s") && err.contains("no key"), "{err}");
    }

    #[test]
    fn loaded_material_is_what_handshakes_get() {
        let out = certs::reconcile(None, &Policy::default(), OffsetDateTime::now_utc()).unwrap();
        let certs = ServingCerts::new();
        assert!(!certs.is_loaded());
        certs.load(&out.material).unwrap();
        assert!(certs.is_loaded());
        assert_eq!(certs.ca_bundle().as_deref(), Some(&out.material.ca_bundle));
        let bad = Material {
            key: "not a key".into(),
            ..out.material
        };
        assert!(certs.load(&bad).is_err());
    }

    #[test]
    fn inject_reports_a_change_only_when_a_bundle_differs() {
        let want = ByteString(b"ca".to_vec());
        let mut slots = [None, Some(want.clone())];
        assert!(inject(slots.iter_mut(), &want));
        assert!(!inject(slots.iter_mut(), &want));
    }
}
