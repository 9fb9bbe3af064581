//! What every request is checked for before a handler sees it: a declared body over the
//! limit, a content coding the server does not decode, a query that is not UTF-8; and whether
//! a request that ran out of time was still waiting for its body.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::Request;
use axum::http::{StatusCode, header};

use crate::problem::{Problem, kind};

/// Why `request` is refused before any body byte is read, if it is:
/// - a `Content-Length` over `max_body_bytes` (413: waiting for a body that will be refused
///   would hold the connection until the request timeout);
/// - a `Content-Encoding` other than `identity` (415: the server reads bodies as they come, so
///   a compressed one would be misread);
/// - a query whose percent-encoded bytes are not UTF-8 (400: decoding it lossily would run the
///   request with another value than the client sent).
pub fn unreadable(request: &Request, max_body_bytes: usize) -> Option<Problem> {
    let headers = request.headers();
    if let Some(length) = headers.get(header::CONTENT_LENGTH)
        && let Some(length) = length.to_str().ok().and_then(|t| t.parse::<u64>().ok())
        && length > max_body_bytes as u64
    {
        return Some(Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            kind::BODY_TOO_LARGE,
            format!(
                "the body declares {length} bytes; the server accepts {max_body_bytes} (max_body_bytes)"
            ),
        ));
    }
    for coding in headers.get_all(header::CONTENT_ENCODING) {
        let identity = coding
            .to_str()
            .is_ok_and(|text| text.trim().eq_ignore_ascii_case("identity"));
        if !identity {
            return Some(Problem::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                kind::UNSUPPORTED_MEDIA_TYPE,
                "the server does not decode a Content-Encoding; send the body as it is",
            ));
        }
    }
    if let Some(query) = request.uri().query()
        && !percent_decodes_to_utf8(query)
    {
        return Some(Problem::invalid_field(
            "query",
            "percent-encoded bytes that are not UTF-8",
        ));
    }
    None
}

/// Whether every `%XX` escape of `text` decodes, and the decoded bytes are UTF-8.
fn percent_decodes_to_utf8(text: &str) -> bool {
    if !text.contains('%') {
        return true;
    }
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%' {
            let hex = bytes
                .get(at + 1..at + 3)
                .and_then(|pair| std::str::from_utf8(pair).ok())
                .and_then(|pair| u8::from_str_radix(pair, 16).ok());
            match hex {
                Some(byte) => {
                    decoded.push(byte);
                    at += 3;
                    continue;
                }
                None => return false,
            }
        }
        decoded.push(bytes[at]);
        at += 1;
    }
    std::str::from_utf8(&decoded).is_ok()
}

/// Set by the JSON extractor while it waits for the body, so that a request that runs out of
/// time then is answered 408 (nothing was applied) rather than 504 (a write may have been).
#[derive(Clone, Default)]
pub struct BodyWait(Arc<AtomicBool>);

impl BodyWait {
    /// The body is being read.
    pub fn begin(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// The body was read (or refused).
    pub fn end(&self) {
        self.0.store(false, Ordering::Relaxed);
    }

    /// Whether the request is waiting for its body.
    pub fn waiting(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_decode_to_utf8_or_are_refused() {
        assert!(percent_decodes_to_utf8("prefix=abc&limit=3"));
        assert!(percent_decodes_to_utf8("prefix=%C3%A9"));
        assert!(!percent_decodes_to_utf8("prefix=%FF"));
        assert!(!percent_decodes_to_utf8("prefix=%C3"));
        assert!(!percent_decodes_to_utf8("prefix=%G1"));
        assert!(!percent_decodes_to_utf8("prefix=%4"));
    }
}
