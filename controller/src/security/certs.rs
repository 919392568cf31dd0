//! The controller's certificate authority and serving certificate, as data: generating them,
//! reading them back, and deciding when to renew. No I/O: [`crate::security::tls`] keeps the result in a
//! Secret, publishes the CA and serves the certificate.
//!
//! Renewal is staged so that no client ever sees a certificate it cannot verify:
//! - the serving certificate is reissued when a third of its lifetime is left, or when the names
//!   it must carry change, or when it no longer chains to a trusted CA;
//! - the CA is replaced when a third of its lifetime is left, but the old one stays in the trusted
//!   bundle until it expires, and the new one only signs from the next serving certificate on, so
//!   clients pick up the new CA (ConfigMap, caBundle) long before it is needed.

use std::collections::BTreeSet;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use time::OffsetDateTime;
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

/// Why certificate material could not be made or read.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// Key or certificate generation failed.
    #[error("generating {what}: {source}")]
    Generate {
        /// What was being generated.
        what: &'static str,
        /// The generator's error.
        source: rcgen::Error,
    },
    /// Stored material is not valid PEM / X.509.
    #[error("reading {what}: {reason}")]
    Parse {
        /// Which item.
        what: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Stored material does not decode (PEM, X.509 or key).
    #[error("reading {what}: {source}")]
    Decode {
        /// Which item.
        what: &'static str,
        /// The decoder's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Certificates and keys, PEM-encoded, as stored in the Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Material {
    /// Every CA clients must trust, newest first; the first one signs new serving certificates.
    pub ca_bundle: String,
    /// The private key of the first CA in `ca_bundle`.
    pub ca_key: String,
    /// The serving certificate.
    pub cert: String,
    /// The serving certificate's private key.
    pub key: String,
}

/// Lifetimes and names: what the material must satisfy.
#[derive(Clone, Debug)]
pub struct Policy {
    /// Lifetime of a new CA.
    pub ca_validity: Duration,
    /// Lifetime of a new serving certificate.
    pub cert_validity: Duration,
    /// DNS names and IP addresses the serving certificate must carry.
    pub names: Vec<String>,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            ca_validity: Duration::from_secs(10 * 365 * 86_400),
            cert_validity: Duration::from_secs(365 * 86_400),
            names: Vec::new(),
        }
    }
}

/// The result of [`reconcile`]: the material to use and what changed.
#[derive(Debug)]
pub struct Outcome {
    /// The material to store and serve.
    pub material: Material,
    /// Why it differs from the input (empty: unchanged).
    pub changes: Vec<String>,
    /// When the next renewal falls due; check again then.
    pub next_check: OffsetDateTime,
}

/// What a parsed certificate says about itself.
#[derive(Debug, Clone)]
pub struct CertInfo {
    /// Start of validity.
    pub not_before: OffsetDateTime,
    /// End of validity.
    pub not_after: OffsetDateTime,
    /// DNS and IP subject alternative names, as strings.
    pub names: BTreeSet<String>,
    /// Serial number, hex.
    pub serial: String,
}

/// Reads the validity, names and serial of a PEM certificate (the first one in `pem`).
pub fn inspect(pem: &str) -> Result<CertInfo, CertError> {
    let ders = pem_certs(pem, "certificate")?;
    let der = ders.first().ok_or_else(|| CertError::Parse {
        what: "certificate",
        reason: "no CERTIFICATE block",
    })?;
    info_of(der)
}

fn info_of(der: &[u8]) -> Result<CertInfo, CertError> {
    let (_, cert) = X509Certificate::from_der(der).map_err(|e| CertError::Decode {
        what: "certificate",
        source: e.into(),
    })?;
    let mut names = BTreeSet::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(d) => {
                    names.insert((*d).to_owned());
                }
                GeneralName::IPAddress(ip) => {
                    if let Ok(v4) = <[u8; 4]>::try_from(*ip) {
                        names.insert(std::net::Ipv4Addr::from(v4).to_string());
                    } else if let Ok(v6) = <[u8; 16]>::try_from(*ip) {
                        names.insert(std::net::Ipv6Addr::from(v6).to_string());
                    }
                }
                _ => {}
            }
        }
    }
    Ok(CertInfo {
        not_before: cert.validity().not_before.to_datetime(),
        not_after: cert.validity().not_after.to_datetime(),
        names,
        serial: cert.raw_serial_as_string(),
    })
}

/// The DER certificates in a PEM text, in order.
fn pem_certs(pem: &str, what: &'static str) -> Result<Vec<Vec<u8>>, CertError> {
    let mut out = Vec::new();
    for block in x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes()) {
        let block = block.map_err(|e| CertError::Decode {
            what,
            source: e.into(),
        })?;
        if block.label == "CERTIFICATE" {
            out.push(block.contents);
        }
    }
    Ok(out)
}

/// The `CERTIFICATE` blocks of a PEM text, each as its own PEM text.
fn pem_blocks(text: &str) -> Vec<String> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(BEGIN) {
        let Some(len) = rest[start..].find(END) else {
            break;
        };
        let stop = start + len + END.len();
        out.push(format!("{}\n", &rest[start..stop]));
        rest = &rest[stop..];
    }
    out
}

fn generate(what: &'static str) -> impl FnOnce(rcgen::Error) -> CertError {
    move |source| CertError::Generate { what, source }
}

/// Brings `current` in line with `policy` at time `now`: creates what is missing, renews what is
/// due, and prunes expired CAs from the bundle. Unreadable material is replaced, with the reason
/// in [`Outcome::changes`].
pub fn reconcile(
    current: Option<&Material>,
    policy: &Policy,
    now: OffsetDateTime,
) -> Result<Outcome, CertError> {
    let mut changes = Vec::new();
    let parsed = match current.map(parse) {
        None => {
            changes.push("no certificate authority yet".to_owned());
            None
        }
        Some(Err(e)) => {
            changes.push(format!("stored material unreadable ({e}); starting over"));
            None
        }
        Some(Ok(p)) => Some(p),
    };
    let third = |d: Duration| time::Duration::seconds(i64::try_from(d.as_secs() / 3).unwrap_or(0));

    // The CA bundle: keep the CAs that are still valid; add a new one when the newest is due.
    let (mut bundle, mut signer) = match parsed {
        Some(p) => (p.bundle, Some((p.signer_key, p.signer_pem))),
        None => (Vec::new(), None),
    };
    let before = bundle.len();
    bundle.retain(|(_, info)| info.not_after > now);
    if bundle.len() != before {
        changes.push(format!("dropped {} expired CA(s)", before - bundle.len()));
    }
    let newest_due = bundle
        .first()
        .is_none_or(|(_, info)| info.not_after - third(policy.ca_validity) <= now);
    if newest_due || signer.is_none() {
        let (pem, key, info) = new_ca(policy, now)?;
        if !bundle.is_empty() {
            changes.push("certificate authority renewed".to_owned());
        }
        bundle.insert(0, (pem.clone(), info));
        signer = Some((key, pem));
    }
    let (ca_key, ca_pem) = signer.ok_or_else(|| CertError::Parse {
        what: "CA",
        reason: "no signing CA",
    })?;

    // The serving certificate.
    let wanted: BTreeSet<String> = policy.names.iter().cloned().collect();
    let serving = current.and_then(|m| {
        let info = inspect(&m.cert).ok()?;
        let chains = chains_to_any(&m.cert, &bundle);
        Some((m.cert.clone(), m.key.clone(), info, chains))
    });
    let renew_reason = match &serving {
        None => Some("no serving certificate yet".to_owned()),
        Some((_, _, info, _)) if info.names != wanted => Some(format!(
            "serving certificate names {:?} differ from {:?}",
            info.names, wanted
        )),
        Some((_, _, _, false)) => Some("serving certificate not signed by a trusted CA".to_owned()),
        Some((_, _, info, _)) if info.not_after - third(policy.cert_validity) <= now => {
            Some("serving certificate due for renewal".to_owned())
        }
        Some(_) => None,
    };
    let (cert, key, cert_info) = match (renew_reason, serving) {
        (None, Some((cert, key, info, _))) => (cert, key, info),
        (reason, _) => {
            changes.extend(reason);
            let ca_info = &bundle
                .iter()
                .find(|(pem, _)| *pem == ca_pem)
                .map(|(_, i)| i.clone())
                .ok_or_else(|| CertError::Parse {
                    what: "CA",
                    reason: "signing CA missing from bundle",
                })?;
            issue(policy, &ca_pem, &ca_key, ca_info, now)?
        }
    };

    let ca_bundle: String = bundle.iter().map(|(pem, _)| pem.as_str()).collect();
    let newest = bundle.first().map(|(_, i)| i.not_after);
    let mut next_check = cert_info.not_after - third(policy.cert_validity);
    if let Some(ca_end) = newest {
        next_check = next_check.min(ca_end - third(policy.ca_validity));
    }
    Ok(Outcome {
        material: Material {
            ca_bundle,
            ca_key,
            cert,
            key,
        },
        changes,
        next_check,
    })
}

struct Parsed {
    /// (PEM, info) per CA, newest first.
    bundle: Vec<(String, CertInfo)>,
    signer_key: String,
    signer_pem: String,
}

fn parse(m: &Material) -> Result<Parsed, CertError> {
    let mut bundle = Vec::new();
    for pem in pem_blocks(&m.ca_bundle) {
        let info = inspect(&pem)?;
        bundle.push((pem, info));
    }
    if bundle.is_empty() {
        return Err(CertError::Parse {
            what: "CA bundle",
            reason: "no CERTIFICATE block",
        });
    }
    KeyPair::from_pem(&m.ca_key).map_err(|e| CertError::Decode {
        what: "CA key",
        source: e.into(),
    })?;
    let signer_pem = bundle.first().map(|(p, _)| p.clone()).unwrap_or_default();
    Ok(Parsed {
        bundle,
        signer_key: m.ca_key.clone(),
        signer_pem,
    })
}

fn chains_to_any(cert_pem: &str, bundle: &[(String, CertInfo)]) -> bool {
    let Ok(ders) = pem_certs(cert_pem, "certificate") else {
        return false;
    };
    let Some(der) = ders.first() else {
        return false;
    };
    let Ok((_, cert)) = X509Certificate::from_der(der) else {
        return false;
    };
    bundle.iter().any(|(pem, _)| {
        pem_certs(pem, "CA")
            .ok()
            .and_then(|d| d.into_iter().next())
            .is_some_and(|ca_der| {
                X509Certificate::from_der(&ca_der).is_ok_and(|(_, ca)| {
                    cert.issuer() == ca.subject()
                        && cert.verify_signature(Some(ca.public_key())).is_ok()
                })
            })
    })
}

fn lifetime(d: Duration) -> time::Duration {
    time::Duration::seconds(i64::try_from(d.as_secs()).unwrap_or(i64::MAX / 2))
}

/// Clock skew allowance: certificates start a little in the past.
const BACKDATE: time::Duration = time::Duration::minutes(5);

fn new_ca(policy: &Policy, now: OffsetDateTime) -> Result<(String, String, CertInfo), CertError> {
    let key = KeyPair::generate().map_err(generate("CA key"))?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(generate("CA"))?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "vmdhcp");
    dn.push(
        DnType::CommonName,
        format!("vmdhcp-ca@{}", now.unix_timestamp()),
    );
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = now - BACKDATE;
    params.not_after = now + lifetime(policy.ca_validity);
    let cert = params.self_signed(&key).map_err(generate("CA"))?;
    let pem = cert.pem();
    let info = info_of(cert.der())?;
    Ok((pem, key.serialize_pem(), info))
}

fn issue(
    policy: &Policy,
    ca_pem: &str,
    ca_key: &str,
    ca_info: &CertInfo,
    now: OffsetDateTime,
) -> Result<(String, String, CertInfo), CertError> {
    let signing_key = KeyPair::from_pem(ca_key).map_err(|e| CertError::Decode {
        what: "CA key",
        source: e.into(),
    })?;
    let issuer = Issuer::from_ca_cert_pem(ca_pem, signing_key).map_err(|e| CertError::Decode {
        what: "CA",
        source: e.into(),
    })?;
    let key = KeyPair::generate().map_err(generate("serving key"))?;
    let mut params =
        CertificateParams::new(policy.names.clone()).map_err(generate("serving certificate"))?;
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        policy
            .names
            .first()
            .cloned()
            .unwrap_or_else(|| "vmdhcp".to_owned()),
    );
    params.distinguished_name = dn;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = now - BACKDATE;
    // Never outlive the issuer.
    params.not_after = (now + lifetime(policy.cert_validity)).min(ca_info.not_after);
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(generate("serving certificate"))?;
    let info = info_of(cert.der())?;
    Ok((cert.pem(), key.serialize_pem(), info))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            ca_validity: Duration::from_secs(3000),
            cert_validity: Duration::from_secs(300),
            names: vec!["svc.ns.svc".into(), "127.0.0.1".into()],
        }
    }

    fn t(secs: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000 + secs).unwrap()
    }

    #[test]
    fn first_run_creates_a_ca_and_a_certificate_for_the_names() {
        let out = reconcile(None, &policy(), t(0)).unwrap();
        assert!(!out.changes.is_empty());
        let info = inspect(&out.material.cert).unwrap();
        assert_eq!(
            info.names,
            ["127.0.0.1", "svc.ns.svc"].map(String::from).into()
        );
        assert_eq!(info.not_after, t(300));
        assert!(chains_to_any(
            &out.material.cert,
            &parse(&out.material).unwrap().bundle
        ));
        // Due at two thirds of the serving certificate's life.
        assert_eq!(out.next_check, t(200));
    }

    #[test]
    fn valid_material_is_kept_unchanged() {
        let first = reconcile(None, &policy(), t(0)).unwrap().material;
        let again = reconcile(Some(&first), &policy(), t(199)).unwrap();
        assert!(again.changes.is_empty(), "{:?}", again.changes);
        assert_eq!(again.material, first);
    }

    #[test]
    fn the_certificate_is_renewed_at_two_thirds_under_the_same_ca() {
        let first = reconcile(None, &policy(), t(0)).unwrap().material;
        let renewed = reconcile(Some(&first), &policy(), t(200)).unwrap();
        assert_eq!(renewed.changes, ["serving certificate due for renewal"]);
        assert_eq!(renewed.material.ca_bundle, first.ca_bundle);
        assert_ne!(renewed.material.cert, first.cert);
        assert_eq!(inspect(&renewed.material.cert).unwrap().not_after, t(500));
    }

    #[test]
    fn changed_names_reissue_the_certificate() {
        let first = reconcile(None, &policy(), t(0)).unwrap().material;
        let mut p = policy();
        p.names.push("other.ns.svc".into());
        let out = reconcile(Some(&first), &p, t(1)).unwrap();
        assert!(out.changes[0].contains("differ"), "{:?}", out.changes);
        assert!(
            inspect(&out.material.cert)
                .unwrap()
                .names
                .contains("other.ns.svc")
        );
    }

    #[test]
    fn a_renewed_ca_joins_the_bundle_and_the_old_one_stays_until_it_expires() {
        let first = reconcile(None, &policy(), t(0)).unwrap().material;
        // CA due at 2000 s (two thirds of 3000).
        let out = reconcile(Some(&first), &policy(), t(2000)).unwrap();
        assert!(
            out.changes
                .contains(&"certificate authority renewed".to_owned())
        );
        let bundle = parse(&out.material).unwrap().bundle;
        assert_eq!(bundle.len(), 2);
        assert!(out.material.ca_bundle.ends_with(&first.ca_bundle));
        // The new certificate chains to the new CA (first in the bundle).
        assert!(chains_to_any(&out.material.cert, &bundle[..1]));
        // After the old CA expires it is dropped.
        let later = reconcile(Some(&out.material), &policy(), t(3001)).unwrap();
        assert_eq!(parse(&later.material).unwrap().bundle.len(), 1);
    }

    #[test]
    fn a_certificate_never_outlives_its_ca() {
        let p = Policy {
            ca_validity: Duration::from_secs(600),
            cert_validity: Duration::from_secs(6000),
            names: vec!["a".into()],
        };
        let out = reconcile(None, &p, t(0)).unwrap();
        assert_eq!(inspect(&out.material.cert).unwrap().not_after, t(600));
    }

    #[test]
    fn unreadable_material_is_replaced_with_the_reason() {
        let bad = Material {
            ca_bundle: "garbage".into(),
            ca_key: "garbage".into(),
            cert: "garbage".into(),
            key: "garbage".into(),
        };
        let out = reconcile(Some(&bad), &policy(), t(0)).unwrap();
        assert!(out.changes[0].contains("unreadable"), "{:?}", out.changes);
        inspect(&out.material.cert).unwrap();
    }

    #[test]
    fn a_certificate_from_a_foreign_ca_is_replaced() {
        let ours = reconcile(None, &policy(), t(0)).unwrap().material;
        let theirs = reconcile(None, &policy(), t(0)).unwrap().material;
        let mixed = Material {
            cert: theirs.cert,
            key: theirs.key,
            ..ours
        };
        let out = reconcile(Some(&mixed), &policy(), t(1)).unwrap();
        assert_eq!(
            out.changes,
            ["serving certificate not signed by a trusted CA"]
        );
    }
}
