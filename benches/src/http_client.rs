//! The load tool's HTTP/1.1 client: one request written, one answer read, on a keep-alive
//! tokio socket. Minimal on purpose: on a shared 2-core machine the client should take as
//! little CPU from the server it measures as it can.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Room made for each read of an answer's head.
const READ_CHUNK_BYTES: usize = 16 * 1024;

/// A keep-alive connection to `address` with Nagle off (one request in flight at a time).
pub(crate) async fn connect(address: &str) -> std::io::Result<TcpStream> {
    let stream = TcpStream::connect(address).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Writes one request and reads one answer (headers and a `Content-Length` body) into
/// `buffer`; returns the status code.
pub(crate) async fn exchange(
    stream: &mut TcpStream,
    request: &[u8],
    buffer: &mut Vec<u8>,
) -> std::io::Result<u16> {
    stream.write_all(request).await?;
    buffer.clear();
    let header_end = loop {
        if let Some(end) = find(buffer, b"\r\n\r\n") {
            break end + 4;
        }
        if buffer.len() > 64 * 1024 {
            return Err(std::io::Error::other("answer headers over 64 KiB"));
        }
        buffer.reserve(READ_CHUNK_BYTES);
        if stream.read_buf(buffer).await? == 0 {
            return Err(std::io::Error::other("the server closed the connection"));
        }
    };
    let head = String::from_utf8_lossy(&buffer[..header_end]).to_string();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other("not an HTTP answer"))?;
    let content_length: usize = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);
    // A large answer (a batch's) is read straight into its room, not a small chunk at a time
    // (but a declared length is not trusted with more than a megabyte of room at once).
    while buffer.len() < header_end + content_length {
        let missing = header_end + content_length - buffer.len();
        buffer.reserve(missing.min(1 << 20));
        if stream.read_buf(buffer).await? == 0 {
            return Err(std::io::Error::other("the server closed the connection"));
        }
    }
    buffer.drain(..header_end);
    Ok(status)
}

/// Where `needle` first starts in `haystack`.
pub(crate) fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}
