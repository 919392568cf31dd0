//! The pace at which a server thread reads its socket: the first datagram after a quiet spell
//! is read the moment it arrives; while more keep coming, the socket is read in batches, one
//! short pause ([`Pacer::window`]) before each, and back to waiting once a batch finds nothing.
//!
//! Why: under load, most of a server's CPU per exchange is not its own work but the kernel's
//! wake-ups: its own thread woken for every datagram, and every reply waking the client that
//! waits for it. Read in batches, a burst costs one wake-up of ours per batch, and the replies
//! of a batch go out back to back, so a client woken by the first is still awake for the next.
//! The price is latency under load, at most one window, which no DHCP client notices (their
//! first retransmission waits a second); a lone datagram pays none.

use std::io::{self, Read};
use std::net::UdpSocket;
use std::time::Duration;

use socket2::Socket;

/// How long the DHCP servers pause before each batch: long enough to gather several
/// datagrams at the rates where wake-ups dominate (thousands per second), short against any
/// client's retransmission timer, and within what a receive buffer holds at the highest rate
/// served (docs/tuning.md).
pub const WINDOW: Duration = Duration::from_millis(1);

/// Where the reading is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Nothing came lately: the next read waits for a datagram (or the socket's timeout).
    Quiet,
    /// A datagram was just read: the next read first pauses one window.
    Pause,
    /// Reading what the window gathered without waiting; `found` once it returned any.
    Drain { found: bool },
}

/// Reads one socket at the pace above. The socket is blocking (with its own read timeout) while
/// quiet and non-blocking while draining; the pacer switches it only when its mode changes.
/// A reply sent on the same socket while it is non-blocking fails rather than waits when the
/// send buffer is full, and is counted as a send error: under such load a late reply is worth
/// no more than a lost one, which the client retransmits.
#[derive(Debug)]
pub struct Pacer {
    window: Duration,
    mode: Mode,
    nonblocking: bool,
}

impl Pacer {
    /// A pacer whose batches gather for `window`; a zero window reads every datagram the moment
    /// it arrives, as a plain blocking read does.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            mode: Mode::Quiet,
            nonblocking: false,
        }
    }

    /// The next datagram, as `read` returns it from the socket: what it read, or its error
    /// (`WouldBlock`/`TimedOut` when the socket's read timeout passed with nothing to read).
    pub fn receive<S: Blocking, T>(
        &mut self,
        socket: &S,
        mut read: impl FnMut(&S) -> io::Result<T>,
    ) -> io::Result<T> {
        loop {
            match self.mode {
                Mode::Quiet => {
                    self.blocking(socket, true)?;
                    let read = read(socket)?;
                    if !self.window.is_zero() {
                        self.mode = Mode::Pause;
                    }
                    return Ok(read);
                }
                Mode::Pause => {
                    std::thread::sleep(self.window);
                    self.blocking(socket, false)?;
                    self.mode = Mode::Drain { found: false };
                }
                Mode::Drain { found } => match read(socket) {
                    Ok(read) => {
                        self.mode = Mode::Drain { found: true };
                        return Ok(read);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        self.mode = if found { Mode::Pause } else { Mode::Quiet };
                    }
                    Err(e) => return Err(e),
                },
            }
        }
    }

    /// Puts the socket in blocking (`true`) or non-blocking mode, unless it is already.
    fn blocking<S: Blocking>(&mut self, socket: &S, blocking: bool) -> io::Result<()> {
        if self.nonblocking == blocking {
            socket.set_nonblocking(!blocking)?;
            self.nonblocking = !blocking;
        }
        Ok(())
    }
}

/// A socket whose reads can be made to wait or not.
pub trait Blocking {
    /// As the socket's own `set_nonblocking`.
    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()>;
}

impl Blocking for Socket {
    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        Socket::set_nonblocking(self, nonblocking)
    }
}

impl Blocking for UdpSocket {
    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        UdpSocket::set_nonblocking(self, nonblocking)
    }
}

/// Reads one datagram from a socket2 socket into `buf`.
pub fn read_into(buf: &mut [u8]) -> impl FnMut(&Socket) -> io::Result<usize> + '_ {
    |mut socket: &Socket| socket.read(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use socket2::{Domain, Type};

    /// A connected pair of datagram sockets, the receiving one blocking with a short timeout.
    fn pair() -> (Socket, Socket) {
        let (tx, rx) = Socket::pair(Domain::UNIX, Type::DGRAM, None).unwrap();
        rx.set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        (tx, rx)
    }

    fn times_out(result: io::Result<usize>) -> bool {
        matches!(result, Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut))
    }

    #[test]
    fn a_burst_is_read_whole_in_order_then_the_socket_waits_again() {
        let (tx, rx) = pair();
        let mut pacer = Pacer::new(WINDOW);
        let mut buf = [0u8; 16];
        tx.send(b"a").unwrap();
        assert_eq!(pacer.receive(&rx, read_into(&mut buf)).unwrap(), 1);
        assert_eq!(&buf[..1], b"a");
        // Sent during the pause: read in one batch, without waiting in between.
        for datagram in [b"b", b"c", b"d"] {
            tx.send(datagram).unwrap();
        }
        for want in [b"b", b"c", b"d"] {
            assert_eq!(pacer.receive(&rx, read_into(&mut buf)).unwrap(), 1);
            assert_eq!(&buf[..1], want);
            assert!(rx.nonblocking().unwrap(), "a batch is read without waiting");
        }
        // The batch after it finds nothing: the socket blocks again, with its timeout.
        assert!(times_out(pacer.receive(&rx, read_into(&mut buf))));
        assert_eq!(pacer.mode, Mode::Quiet);
        assert!(!rx.nonblocking().unwrap());
        tx.send(b"e").unwrap();
        assert_eq!(pacer.receive(&rx, read_into(&mut buf)).unwrap(), 1);
        assert_eq!(&buf[..1], b"e");
    }

    #[test]
    fn a_lone_datagram_leaves_the_pacer_quiet_after_one_empty_batch() {
        let (tx, rx) = pair();
        let mut pacer = Pacer::new(WINDOW);
        let mut buf = [0u8; 16];
        tx.send(b"x").unwrap();
        assert_eq!(pacer.receive(&rx, read_into(&mut buf)).unwrap(), 1);
        assert_eq!(pacer.mode, Mode::Pause);
        assert!(times_out(pacer.receive(&rx, read_into(&mut buf))));
        assert_eq!(pacer.mode, Mode::Quiet);
    }

    #[test]
    fn a_zero_window_reads_every_datagram_blocking() {
        let (tx, rx) = pair();
        let mut pacer = Pacer::new(Duration::ZERO);
        let mut buf = [0u8; 16];
        for datagram in [b"1", b"2"] {
            tx.send(datagram).unwrap();
            assert_eq!(pacer.receive(&rx, read_into(&mut buf)).unwrap(), 1);
            assert_eq!(pacer.mode, Mode::Quiet);
            assert!(!rx.nonblocking().unwrap());
        }
        assert!(times_out(pacer.receive(&rx, read_into(&mut buf))));
    }

    #[test]
    fn a_socket_error_is_returned_not_taken_for_silence() {
        let unconnected = Socket::new(Domain::UNIX, Type::STREAM, None).unwrap();
        let mut pacer = Pacer::new(WINDOW);
        // An unconnected stream socket cannot be read: the kernel's error, not an empty socket.
        let result = pacer.receive(&unconnected, read_into(&mut [0u8; 4]));
        assert!(result.as_ref().is_err_and(|e| e.raw_os_error().is_some()));
        assert!(!times_out(result));
        assert_eq!(pacer.mode, Mode::Quiet);
    }
}
