//! Accepting TLS connections for the config stream and the webhook, bounded whatever the
//! network sends: at most [`Limits::handshakes`] handshakes at once (each within
//! [`Limits::handshake_timeout`]) and [`Limits::connections`] open connections. At a limit the
//! loop stops accepting, so the kernel's backlog, not this process, holds the excess; a failing
//! `accept` is retried after a pause, never in a busy loop.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::server::TlsStream;
use tracing::{debug, warn};

/// How many connections and handshakes a listener admits.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Handshakes in progress at most.
    pub handshakes: usize,
    /// Established connections at most (a stream per agent, a few for the API server).
    pub connections: usize,
    /// How long a client may take to complete its handshake.
    pub handshake_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            handshakes: 128,
            connections: 4096,
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

/// The pause after a failed `accept` (e.g. out of file descriptors).
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// A connection that holds its place under [`Limits::connections`] until dropped.
pub struct Limited<S> {
    inner: S,
    _permit: OwnedSemaphorePermit,
}

impl<S: AsyncRead + Unpin> AsyncRead for Limited<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Limited<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for Limited<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// What an accept loop holds, for tests and `/metrics`-style checks.
#[derive(Clone)]
pub struct Usage {
    handshakes: Arc<Semaphore>,
    connections: Arc<Semaphore>,
    limits: Limits,
}

impl Usage {
    /// Handshakes in progress.
    pub fn handshakes(&self) -> usize {
        self.limits.handshakes - self.handshakes.available_permits()
    }

    /// Connections established or being handshaken.
    pub fn connections(&self) -> usize {
        self.limits.connections - self.connections.available_permits()
    }
}

/// TLS connections accepted on `listener` under `limits`: handshakes run concurrently, so a slow
/// or broken client delays no one, and a failed handshake is logged and skipped, never fatal to
/// the server. The loop ends when the returned stream is dropped.
pub fn accept(
    listener: TcpListener,
    config: Arc<ServerConfig>,
    limits: Limits,
) -> (
    impl futures_util::Stream<Item = io::Result<Limited<TlsStream<TcpStream>>>>,
    Usage,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let usage = Usage {
        handshakes: Arc::new(Semaphore::new(limits.handshakes.max(1))),
        connections: Arc::new(Semaphore::new(limits.connections.max(1))),
        limits: Limits {
            handshakes: limits.handshakes.max(1),
            connections: limits.connections.max(1),
            ..limits
        },
    };
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let state = usage.clone();
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(c) => c,
                    Err(e) => {
                        warn!(error = %e, "accept failed; retrying");
                        tokio::time::sleep(ACCEPT_RETRY).await;
                        continue;
                    }
                },
                () = tx.closed() => return,
            };
            // At a limit, this connection waits for a place and the loop accepts no other: the
            // kernel's backlog, not this process, holds the rest.
            let (Ok(connection), Ok(handshake)) = (
                state.connections.clone().acquire_owned().await,
                state.handshakes.clone().acquire_owned().await,
            ) else {
                return;
            };
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            let timeout = state.limits.handshake_timeout;
            tokio::spawn(async move {
                let result = tokio::time::timeout(timeout, acceptor.accept(tcp)).await;
                drop(handshake);
                match result {
                    Ok(Ok(tls)) => {
                        let stream = Limited {
                            inner: tls,
                            _permit: connection,
                        };
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => debug!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    (tokio_stream::wrappers::ReceiverStream::new(rx), usage)
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    fn server_config() -> Arc<ServerConfig> {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
        let config =
            ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(vec![cert.cert.der().clone()], key)
                .unwrap();
        Arc::new(config)
    }

    async fn until(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(tokio::time::Instant::now() < deadline, "never: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_flood_of_silent_connections_holds_at_most_the_limits() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = Limits {
            handshakes: 4,
            connections: 6,
            handshake_timeout: Duration::from_secs(30),
        };
        let (stream, usage) = accept(listener, server_config(), limits);
        let _stream = std::pin::pin!(stream);
        // 50 clients that connect and never say a word (an unbounded loop spawns a task for each).
        let mut silent = Vec::new();
        for _ in 0..50 {
            silent.push(TcpStream::connect(addr).await.unwrap());
        }
        until("the handshake limit reached", || usage.handshakes() == 4).await;
        assert!(usage.connections() <= 6);
        // It stays there: the loop accepts no more while the places are taken.
        for _ in 0..20 {
            tokio::task::yield_now().await;
            assert_eq!(usage.handshakes(), 4);
        }
        // Closing them frees the places (a failed handshake gives its place back).
        drop(silent);
        until("the places freed", || usage.handshakes() == 0).await;
    }

    #[tokio::test]
    async fn established_connections_count_until_dropped_and_timeouts_free_handshakes() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = Limits {
            handshakes: 2,
            connections: 2,
            handshake_timeout: Duration::from_millis(200),
        };
        let (stream, usage) = accept(listener, server_config(), limits);
        let mut stream = std::pin::pin!(stream);
        // Two silent clients time out and give their places back.
        let _a = TcpStream::connect(addr).await.unwrap();
        let _b = TcpStream::connect(addr).await.unwrap();
        until("both handshakes started", || usage.handshakes() == 2).await;
        until("both timed out", || usage.connections() == 0).await;
        // A real client gets through and holds a connection place while open.
        let client_config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny))
        .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config));
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let client = tokio::spawn(async move { connector.connect(name, tcp).await });
        let server_side = stream.next().await.unwrap().unwrap();
        let _client_side = client.await.unwrap().unwrap();
        assert_eq!(usage.connections(), 1);
        drop(server_side);
        until("the connection place freed", || usage.connections() == 0).await;
    }

    /// Test-only verifier: the server's self-signed certificate is not what is under test.
    #[derive(Debug)]
    struct AcceptAny;

    impl rustls::client::danger::ServerCertVerifier for AcceptAny {
        fn verify_server_cert(
            &self,
            _: &rustls::pki_types::CertificateDer<'_>,
            _: &[rustls::pki_types::CertificateDer<'_>],
            _: &rustls::pki_types::ServerName<'_>,
            _: &[u8],
            _: rustls::pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            _: &[u8],
            _: &rustls::pki_types::CertificateDer<'_>,
            _: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
        }

        fn verify_tls13_signature(
            &self,
            _: &[u8],
            _: &rustls::pki_types::CertificateDer<'_>,
            _: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
        }

        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            rustls::crypto::ring::default_provider()
                .signature_verification_algorithms
                .supported_schemes()
        }
    }
}
