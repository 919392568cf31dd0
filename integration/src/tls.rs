//! TLS clients for the tests: a handshake with one of our servers on the host loopback,
//! verified against the CA bundle the controller publishes.
//!
//! Helpers fail the caller on any error: this is test code, not product code.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// A client configuration that trusts only the certificates of `ca_pem`.
pub fn client_config(ca_pem: &str) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    Arc::new(config)
}

/// Connects to `127.0.0.1:port` and completes a TLS handshake for `server_name`, trusting only
/// the certificates of `ca_pem`.
pub async fn connect(port: u16, ca_pem: &str, server_name: &str) -> TlsStream<TcpStream> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let name = ServerName::try_from(server_name.to_owned()).unwrap();
    tokio_rustls::TlsConnector::from(client_config(ca_pem))
        .connect(name, tcp)
        .await
        .unwrap_or_else(|e| panic!("TLS handshake with port {port} as {server_name}: {e}"))
}
