//! Plain HTTP/1.0 GETs to local endpoints with std only, for tests that read `/metrics` or
//! `/readyz` of a component they started (no HTTP client dependency needed for that).

use std::io::{Read, Write};
use std::net::TcpStream;

/// GETs `path` from `host` (`ip:port`); returns the whole response, status line and headers
/// included.
pub fn get(host: &str, path: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(host)?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n")?;
    let mut out = String::new();
    stream.read_to_string(&mut out)?;
    Ok(out)
}
