//! Accepting TLS connections for the config stream and the webhook, bounded whatever the
//! network sends:
//! - at most [`Limits::per_peer`] connections (handshaking or established) from one source
//!   address; a peer's excess connection is closed as soon as it is accepted, so a peer at its
//!   cap neither queues nor stalls the accept loop for anyone else;
//! - at most [`Limits::handshakes`] handshakes at once, each within
//!   [`Limits::handshake_timeout`], and [`Limits::connections`] open connections in all; at these
//!   limits the loop stops accepting, so the kernel's backlog, not this process, holds the excess;
//! - optionally, a connection that moves no byte either way for [`Limits::idle`] is ended.
//!
//! A failing `accept` is retried after a pause, never in a busy loop. What the HTTP servers on
//! top bound themselves (header, request and idle-request timeouts, HTTP/2 keepalive) is theirs;
//! [`Activity`] is the per-connection request clock they use for it.
//!
//! Figures and the reasons for them are in `docs/operations.md` ("Listener limits").

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use parking_lot::Mutex;
use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::{Instant, Sleep};
use tokio_rustls::server::TlsStream;
use tracing::{debug, warn};

/// How many connections and handshakes a listener admits, and for how long.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Handshakes in progress at most. Above [`Limits::per_peer`], so that one peer's slow
    /// handshakes never take every place.
    pub handshakes: usize,
    /// Established connections at most (a stream per agent, a few for the API server).
    pub connections: usize,
    /// Connections from one source address at most, handshakes included. 32 by default: the
    /// API server is one peer per instance and multiplexes every admission call over HTTP/2
    /// (Go opens another connection only when one carries the server's stream limit), and an
    /// agent holds one connection, so a legitimate peer needs a handful; 32 leaves room for a
    /// node whose agents are source-NATed to one address and for reconnects while old
    /// connections drain, while a hostile pod holds at most that many places.
    pub per_peer: usize,
    /// How long a client may take to complete its handshake.
    pub handshake_timeout: Duration,
    /// A connection that moves no byte either way for this long is ended (`None`: never).
    /// Only for protocols that keep live connections talking (HTTP/2 keepalive PINGs, the
    /// stream's heartbeats); an HTTP server bounds idle requests with [`Activity`] instead.
    pub idle: Option<Duration>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            handshakes: 128,
            connections: 4096,
            per_peer: 32,
            handshake_timeout: Duration::from_secs(10),
            idle: None,
        }
    }
}

/// The pause after a failed `accept` (e.g. out of file descriptors).
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// How many connections each source address holds; a place is given back when its
/// [`PeerPlace`] drops.
struct Peers {
    counts: Mutex<HashMap<IpAddr, usize>>,
    cap: usize,
}

impl Peers {
    /// A place for `ip`, or `None` if it holds its cap already.
    fn take(self: &Arc<Self>, ip: IpAddr) -> Option<PeerPlace> {
        let mut counts = self.counts.lock();
        let count = counts.entry(ip).or_insert(0);
        if *count >= self.cap {
            return None;
        }
        *count += 1;
        Some(PeerPlace {
            peers: self.clone(),
            ip,
        })
    }

    fn count(&self, ip: IpAddr) -> usize {
        self.counts.lock().get(&ip).copied().unwrap_or(0)
    }
}

/// One connection's place under [`Limits::per_peer`].
struct PeerPlace {
    peers: Arc<Peers>,
    ip: IpAddr,
}

impl Drop for PeerPlace {
    fn drop(&mut self) {
        let mut counts = self.peers.counts.lock();
        if let Some(count) = counts.get_mut(&self.ip) {
            *count = count.saturating_sub(1);
            // Peers come and go (pods are rescheduled): forget those that hold nothing.
            if *count == 0 {
                counts.remove(&self.ip);
            }
        }
    }
}

/// The byte clock behind [`Limits::idle`]: the last time a byte moved, and a timer that is
/// re-armed lazily (only when it fires early), so a busy connection costs no timer update.
struct IdleClock {
    after: Duration,
    last: Instant,
    timer: Pin<Box<Sleep>>,
}

impl IdleClock {
    fn new(after: Duration) -> Self {
        let now = Instant::now();
        IdleClock {
            after,
            last: now,
            timer: Box::pin(tokio::time::sleep_until(now + after)),
        }
    }

    fn touch(&mut self) {
        self.last = Instant::now();
    }

    /// Whether no byte moved for `after`; otherwise the timer wakes `cx` when it might have.
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            if self.timer.as_mut().poll(cx).is_pending() {
                return false;
            }
            let deadline = self.last + self.after;
            if Instant::now() >= deadline {
                return true;
            }
            self.timer.as_mut().reset(deadline);
        }
    }
}

/// A connection that holds its places under [`Limits::connections`] and [`Limits::per_peer`]
/// until dropped, and ends itself after [`Limits::idle`] without a byte.
pub struct Limited<S> {
    inner: S,
    idle: Option<IdleClock>,
    _permit: OwnedSemaphorePermit,
    _peer: PeerPlace,
}

impl<S> Limited<S> {
    /// The idle bound elapsed: the caller (hyper) gets an error and ends the connection.
    fn check_idle(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        let clock = self.idle.as_mut()?;
        clock.expired(cx).then(|| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no byte either way for {:?}", clock.after),
            )
        })
    }

    fn touch(&mut self, moved: bool) {
        if let (true, Some(clock)) = (moved, self.idle.as_mut()) {
            clock.touch();
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Limited<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                this.touch(buf.filled().len() > before);
                Poll::Ready(Ok(()))
            }
            Poll::Pending => match this.check_idle(cx) {
                Some(e) => Poll::Ready(Err(e)),
                None => Poll::Pending,
            },
            failed => failed,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Limited<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let result = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.after_write(cx, result)
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
        let this = &mut *self;
        let result = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.after_write(cx, result)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<S> Limited<S> {
    /// A write that moved bytes is activity; one the peer blocks (it reads nothing) counts
    /// toward the idle bound like silence does.
    fn after_write(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match result {
            Poll::Ready(Ok(n)) => {
                self.touch(n > 0);
                Poll::Ready(Ok(n))
            }
            Poll::Pending => match self.check_idle(cx) {
                Some(e) => Poll::Ready(Err(e)),
                None => Poll::Pending,
            },
            failed => failed,
        }
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
    peers: Arc<Peers>,
    refused: Arc<AtomicU64>,
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

    /// Connections established or being handshaken from `peer`.
    pub fn from_peer(&self, peer: IpAddr) -> usize {
        self.peers.count(peer)
    }

    /// Connections closed at once because their peer held [`Limits::per_peer`] already.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
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
    let limits = Limits {
        handshakes: limits.handshakes.max(1),
        connections: limits.connections.max(1),
        per_peer: limits.per_peer.max(1),
        ..limits
    };
    let usage = Usage {
        handshakes: Arc::new(Semaphore::new(limits.handshakes)),
        connections: Arc::new(Semaphore::new(limits.connections)),
        peers: Arc::new(Peers {
            counts: Mutex::new(HashMap::new()),
            cap: limits.per_peer,
        }),
        refused: Arc::new(AtomicU64::new(0)),
        limits,
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
            // A peer at its cap is refused before anything waits, so it cannot hold the loop.
            let Some(place) = state.peers.take(peer.ip()) else {
                let refused = state.refused.fetch_add(1, Ordering::Relaxed) + 1;
                debug!(%peer, cap = state.limits.per_peer, refused, "peer at its connection cap; closed");
                drop(tcp);
                continue;
            };
            // At a total limit, this connection waits for a place and the loop accepts no
            // other: the kernel's backlog, not this process, holds the rest.
            let (Ok(connection), Ok(handshake)) = (
                state.connections.clone().acquire_owned().await,
                state.handshakes.clone().acquire_owned().await,
            ) else {
                return;
            };
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            let timeout = state.limits.handshake_timeout;
            let idle = state.limits.idle;
            tokio::spawn(async move {
                let result = tokio::time::timeout(timeout, acceptor.accept(tcp)).await;
                drop(handshake);
                match result {
                    Ok(Ok(tls)) => {
                        let stream = Limited {
                            inner: tls,
                            idle: idle.map(IdleClock::new),
                            _permit: connection,
                            _peer: place,
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

/// The requests in flight on one HTTP connection, for closing connections that carry none for
/// a while: hyper has an HTTP/1 header timeout and HTTP/2 keepalive, but no idle-connection
/// bound for either, and a byte clock cannot serve since keepalive PINGs are bytes.
#[derive(Clone, Debug)]
pub struct Activity {
    in_flight: Arc<watch::Sender<usize>>,
}

impl Default for Activity {
    fn default() -> Self {
        Activity {
            in_flight: Arc::new(watch::Sender::new(0)),
        }
    }
}

/// A request in flight on an [`Activity`]'s connection, until dropped.
#[derive(Debug)]
pub struct Busy {
    in_flight: Arc<watch::Sender<usize>>,
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.in_flight.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Activity {
    /// Marks a request in flight until the returned guard drops.
    pub fn begin(&self) -> Busy {
        self.in_flight.send_modify(|n| *n += 1);
        Busy {
            in_flight: self.in_flight.clone(),
        }
    }

    /// Resolves once no request has been in flight for `after` (counted from the connection's
    /// start or its last request's end).
    pub async fn idle(&self, after: Duration) {
        let mut in_flight = self.in_flight.subscribe();
        loop {
            // The sender lives as long as `self`, so these waits end only by a change.
            if in_flight.wait_for(|n| *n == 0).await.is_err() {
                return;
            }
            if tokio::time::timeout(after, in_flight.changed())
                .await
                .is_err()
            {
                return;
            }
        }
    }
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

    type Accepted = std::pin::Pin<
        Box<dyn futures_util::Stream<Item = io::Result<Limited<TlsStream<TcpStream>>>> + Send>,
    >;

    /// An accept loop on a loopback port under `limits`: its address, connections and usage.
    async fn listening(limits: Limits) -> (std::net::SocketAddr, Accepted, Usage) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stream, usage) = accept(listener, server_config(), limits);
        (addr, Box::pin(stream), usage)
    }

    /// A TCP connection to `addr` from 127.0.0.`host`: each host is another peer.
    async fn connect_from(host: u8, addr: std::net::SocketAddr) -> TcpStream {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(std::net::SocketAddr::from(([127, 0, 0, host], 0)))
            .unwrap();
        socket.connect(addr).await.unwrap()
    }

    /// Completes a client handshake on `tcp` and takes the server's side off `stream`.
    async fn handshake(
        stream: &mut Accepted,
        tcp: TcpStream,
    ) -> (
        tokio_rustls::client::TlsStream<TcpStream>,
        Limited<TlsStream<TcpStream>>,
    ) {
        let client_config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny))
        .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config));
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let client = tokio::spawn(async move { connector.connect(name, tcp).await });
        let server_side = stream.next().await.unwrap().unwrap();
        (client.await.unwrap().unwrap(), server_side)
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
        let (addr, _stream, usage) = listening(Limits {
            handshakes: 4,
            connections: 6,
            per_peer: 50,
            handshake_timeout: Duration::from_secs(30),
            idle: None,
        })
        .await;
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
        let (addr, mut stream, usage) = listening(Limits {
            handshakes: 2,
            connections: 2,
            per_peer: 2,
            handshake_timeout: Duration::from_millis(200),
            idle: None,
        })
        .await;
        // Two silent clients time out and give their places back.
        let _a = TcpStream::connect(addr).await.unwrap();
        let _b = TcpStream::connect(addr).await.unwrap();
        until("both handshakes started", || usage.handshakes() == 2).await;
        until("both timed out", || usage.connections() == 0).await;
        // A real client gets through and holds a connection place while open.
        let (_client_side, server_side) = handshake(&mut stream, connect_from(1, addr).await).await;
        assert_eq!(usage.connections(), 1);
        drop(server_side);
        until("the connection place freed", || usage.connections() == 0).await;
    }

    #[tokio::test]
    async fn a_peer_at_its_cap_is_closed_at_once_and_blocks_no_other_peer() {
        let (addr, mut stream, usage) = listening(Limits {
            handshakes: 8,
            connections: 16,
            per_peer: 3,
            handshake_timeout: Duration::from_secs(30),
            idle: None,
        })
        .await;
        let hostile: IpAddr = [127, 0, 0, 2].into();
        // 20 silent connections from one peer: 3 are held (handshaking), the rest closed.
        let mut silent = Vec::new();
        for _ in 0..20 {
            silent.push(connect_from(2, addr).await);
        }
        until("the excess refused", || usage.refused() == 17).await;
        assert_eq!(usage.from_peer(hostile), 3);
        assert_eq!(usage.handshakes(), 3);
        // A refused client reads the end of its connection, not a wait.
        let mut refused = 0;
        for tcp in &mut silent {
            let mut byte = [0u8; 1];
            let ended = tokio::time::timeout(
                Duration::from_millis(50),
                tokio::io::AsyncReadExt::read(tcp, &mut byte),
            )
            .await;
            if matches!(ended, Ok(Ok(0) | Err(_))) {
                refused += 1;
            }
        }
        assert_eq!(refused, 17);
        // Other peers get through meanwhile, with their own caps.
        let (_a, _a_server) = handshake(&mut stream, connect_from(3, addr).await).await;
        let (_b, b_server) = handshake(&mut stream, connect_from(1, addr).await).await;
        assert_eq!(usage.from_peer([127, 0, 0, 3].into()), 1);
        assert_eq!(usage.from_peer([127, 0, 0, 1].into()), 1);
        assert_eq!(usage.from_peer(hostile), 3, "still at its cap");
        // Places are given back with the connection: closed, the peer may connect again.
        drop(b_server);
        until("the place freed", || {
            usage.from_peer([127, 0, 0, 1].into()) == 0
        })
        .await;
        drop(silent);
        until("the hostile places freed", || usage.from_peer(hostile) == 0).await;
        let (_c, _c_server) = handshake(&mut stream, connect_from(2, addr).await).await;
        assert_eq!(usage.from_peer(hostile), 1);
        assert_eq!(usage.refused(), 17);
    }

    #[tokio::test]
    async fn a_connection_without_a_byte_for_the_idle_bound_ends_and_traffic_keeps_it() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let idle = Duration::from_millis(300);
        let (addr, mut stream, usage) = listening(Limits {
            idle: Some(idle),
            ..Limits::default()
        })
        .await;
        let (mut client, mut server) = handshake(&mut stream, connect_from(1, addr).await).await;
        // A byte every 100 ms, for three idle bounds: the server keeps reading.
        let started = tokio::time::Instant::now();
        let mut buf = [0u8; 16];
        while started.elapsed() < idle * 3 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            client.write_all(b"x").await.unwrap();
            client.flush().await.unwrap();
            assert_eq!(server.read(&mut buf).await.unwrap(), 1);
        }
        // Silence: the read ends with a timeout after the bound, not before.
        let quiet = tokio::time::Instant::now();
        let err = server.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(quiet.elapsed() >= idle, "ended after {:?}", quiet.elapsed());
        drop(server);
        until("the connection place freed", || usage.connections() == 0).await;
        // Writes count too: a server that writes (heartbeats) is not idle.
        let (mut client, mut server) = handshake(&mut stream, connect_from(1, addr).await).await;
        let started = tokio::time::Instant::now();
        while started.elapsed() < idle * 3 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            server.write_all(b"heartbeat").await.unwrap();
            server.flush().await.unwrap();
            let mut got = [0u8; 9];
            client.read_exact(&mut got).await.unwrap();
        }
        // Its read ends only an idle bound after the writes stopped.
        let quiet = tokio::time::Instant::now();
        let err = server.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(
            quiet.elapsed() >= idle / 2,
            "ended after {:?}",
            quiet.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_idle_only_after_its_last_request_ended() {
        let activity = Activity::default();
        let after = Duration::from_secs(90);
        let idle = {
            let activity = activity.clone();
            tokio::spawn(async move { activity.idle(after).await })
        };
        tokio::time::sleep(Duration::from_secs(60)).await;
        // A request of 200 s: never idle while it is in flight.
        let busy = activity.begin();
        tokio::time::sleep(Duration::from_secs(200)).await;
        assert!(!idle.is_finished());
        drop(busy);
        let ended = tokio::time::Instant::now();
        idle.await.unwrap();
        assert_eq!(ended.elapsed(), after);
        // Nothing at all: idle after the bound from the start.
        let fresh = Activity::default();
        let start = tokio::time::Instant::now();
        fresh.idle(after).await;
        assert_eq!(start.elapsed(), after);
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
