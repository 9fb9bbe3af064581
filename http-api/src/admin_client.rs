//! The HTTP/1.1 client of the one-shot subcommands that call a running node (`concord member`,
//! `concord group`, `concord plugin upgrade`, `concord backup`): a connection of its own per
//! call (no client library), in TLS (rustls) for an `https://` endpoint, with the admin token
//! as a bearer token; asking again, paced, while a member is unavailable; and the arguments
//! they share.

use std::io::{BufRead, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Arg, ArgMatches};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

use crate::AdminToken;

/// How long a call may take: a change waits for every group (the server gives up after 10 s,
/// or its request timeout).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// `--endpoint`, `--admin-token-file` and `--ca-file`, for a subcommand and its own.
pub(crate) fn endpoint_args() -> [Arg; 3] {
    let endpoint = Arg::new("endpoint")
        .long("endpoint")
        .env("CONCORD_ENDPOINT")
        .default_value("http://127.0.0.1:7070")
        .global(true)
        .help("The HTTP URL of any member (http://host:port or https://host:port)");
    let token_file = Arg::new("admin_token_file")
        .long("admin-token-file")
        .env("CONCORD_ADMIN_TOKEN_FILE")
        .global(true)
        .value_parser(clap::value_parser!(PathBuf))
        .help("A file holding the cluster's admin token, sent as a bearer token");
    let ca_file = Arg::new("ca_file")
        .long("ca-file")
        .env("CONCORD_CA_FILE")
        .global(true)
        .value_parser(clap::value_parser!(PathBuf))
        .help("For an https:// endpoint: the CA certificate (PEM) that signed the server's");
    [endpoint, token_file, ca_file]
}

/// Where and how a subcommand calls, from [`endpoint_args`].
pub(crate) struct Endpoint {
    url: String,
    token: Option<AdminToken>,
    ca_file: Option<PathBuf>,
}

/// A request's body and its media type.
#[derive(Clone, Copy)]
pub(crate) struct Body<'a> {
    pub(crate) content_type: &'a str,
    pub(crate) bytes: &'a [u8],
}

impl Endpoint {
    pub(crate) fn from_matches(matches: &ArgMatches) -> Result<Endpoint, String> {
        let url = matches
            .get_one::<String>("endpoint")
            .expect("the endpoint has a default")
            .clone();
        let token = matches
            .get_one::<PathBuf>("admin_token_file")
            .map(|path| AdminToken::from_file(path))
            .transpose()?;
        let ca_file = matches.get_one::<PathBuf>("ca_file").cloned();
        Ok(Endpoint {
            url,
            token,
            ca_file,
        })
    }

    /// `method path` with `body`: the status and the answer's body, or why no answer came.
    pub(crate) fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Body<'_>>,
    ) -> Result<(u16, String), CallError> {
        call(
            &self.url,
            method,
            path,
            body,
            self.token.as_ref(),
            self.ca_file.as_deref(),
        )
    }

    /// Like [`Endpoint::call`], but anything but `200` is an error naming the problem's detail.
    pub(crate) fn call_ok(
        &self,
        method: &str,
        path: &str,
        body: Option<Body<'_>>,
    ) -> Result<String, String> {
        let (status, answer) = self.call(method, path, body)?;
        if status != 200 {
            return Err(failure(method, path, status, &answer));
        }
        Ok(answer)
    }

    /// Like [`Endpoint::call`], but asked again, within `wait`, while the answer's status is
    /// one of `ask_again_on` or no answer comes (nothing at the address, or an answer cut
    /// off): for calls that are safe to send twice. The last answer, whatever its status, or
    /// why none came.
    pub(crate) fn call_asking_again(
        &self,
        method: &str,
        path: &str,
        body: Option<Body<'_>>,
        ask_again_on: &[u16],
        wait: Duration,
    ) -> Result<Answer, String> {
        let mut again = AskingAgain::within(wait);
        let mut earlier_cut_off = false;
        loop {
            let why = match self.call(method, path, body) {
                Ok((status, body)) => {
                    let answer = Answer {
                        status,
                        body,
                        earlier_cut_off,
                    };
                    if !ask_again_on.contains(&status) {
                        return Ok(answer);
                    }
                    let why = failure(method, path, status, &answer.body);
                    if !again.pause(&why) {
                        return Ok(answer);
                    }
                    continue;
                }
                Err(CallError::Unreachable(message)) => message,
                Err(CallError::CutOff(message)) => {
                    earlier_cut_off = true;
                    message
                }
                Err(CallError::Broken(message)) => return Err(message),
            };
            if !again.pause(&why) {
                return Err(why);
            }
        }
    }

    /// The same client (token, CA) at another member's `url`: one a problem named.
    pub(crate) fn at(&self, url: &str) -> Endpoint {
        Endpoint {
            url: url.to_string(),
            token: self.token.clone(),
            ca_file: self.ca_file.clone(),
        }
    }

    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// `GET path`, the body streamed into `out`: its length, or why it did not arrive whole.
    pub(crate) fn download(&self, path: &str, out: &mut dyn Write) -> Result<u64, DownloadError> {
        download(
            &self.url,
            path,
            self.token.as_ref(),
            self.ca_file.as_deref(),
            out,
        )
    }
}

/// Why a download did not arrive whole.
#[derive(Debug, PartialEq)]
pub(crate) enum DownloadError {
    /// The server answered `status` (not 200) before any byte of the body; `message` names it.
    Refused { status: u16, message: String },
    /// Nothing answered at the endpoint's address, or the answer broke off (the connection
    /// closed, reset or went silent): what a node going down or restarting does, so asking
    /// again later may find it whole.
    Interrupted(String),
    /// An answer that is not HTTP or whose framing is wrong, an endpoint or CA file that cannot
    /// work, or a write of the body where it goes that failed: asking again changes nothing.
    Broken(String),
}

impl std::fmt::Display for DownloadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DownloadError::Refused { message, .. }
            | DownloadError::Interrupted(message)
            | DownloadError::Broken(message) => f.write_str(message),
        }
    }
}

/// What a call asked again got.
#[derive(Debug, PartialEq)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) body: String,
    /// An earlier ask went out and was cut off: it may have been acted on.
    pub(crate) earlier_cut_off: bool,
}

/// Why a call got no answer.
#[derive(Debug, PartialEq)]
pub(crate) enum CallError {
    /// Nothing answered at the endpoint's address: the request was not sent.
    Unreachable(String),
    /// The request went out, but its answer broke off or never came (the node went down,
    /// restarted or went silent): it may have been acted on.
    CutOff(String),
    /// An answer that is not HTTP, or an endpoint or CA file that cannot work: asking again
    /// changes nothing.
    Broken(String),
}

impl From<CallError> for String {
    fn from(error: CallError) -> String {
        match error {
            CallError::Unreachable(message)
            | CallError::CutOff(message)
            | CallError::Broken(message) => message,
        }
    }
}

/// The pauses of a subcommand that asks again while a member is unavailable: from 200 ms,
/// doubling up to 2 s, for as long as its `--wait-secs` allows.
pub(crate) struct AskingAgain {
    deadline: Instant,
    pause: Duration,
}

impl AskingAgain {
    /// Pauses that end by `wait` from now (none if it is zero).
    pub(crate) fn within(wait: Duration) -> AskingAgain {
        AskingAgain {
            deadline: Instant::now() + wait,
            pause: Duration::from_millis(200),
        }
    }

    /// Says `why` on stderr and sleeps before the next ask; `false` (and no sleep) if that ask
    /// would come after the deadline.
    pub(crate) fn pause(&mut self, why: &str) -> bool {
        if Instant::now() + self.pause > self.deadline {
            return false;
        }
        eprintln!("{why}; asking again in {} ms", self.pause.as_millis());
        std::thread::sleep(self.pause);
        self.pause = (self.pause * 2).min(Duration::from_secs(2));
        true
    }
}

/// What a call that failed with `status` says: the problem's detail, or the whole answer
/// where it is not a problem.
pub(crate) fn failure(method: &str, path: &str, status: u16, answer: &str) -> String {
    let detail = serde_json::from_str::<serde_json::Value>(answer)
        .ok()
        .and_then(|problem| problem["detail"].as_str().map(str::to_string))
        .unwrap_or_else(|| answer.to_string());
    format!("{method} {path}: HTTP {status}: {detail}")
}

/// Why no connection to an endpoint was made.
#[derive(Debug)]
enum ConnectError {
    /// Nothing answered at its address (refused, or no answer within the connect timeout).
    Unreachable(String),
    /// The endpoint, its address or the CA file cannot work, however often tried.
    Unusable(String),
}

impl From<ConnectError> for CallError {
    fn from(error: ConnectError) -> CallError {
        match error {
            ConnectError::Unreachable(message) => CallError::Unreachable(message),
            ConnectError::Unusable(message) => CallError::Broken(message),
        }
    }
}

impl From<ConnectError> for DownloadError {
    fn from(error: ConnectError) -> DownloadError {
        match error {
            ConnectError::Unreachable(message) => DownloadError::Interrupted(message),
            ConnectError::Unusable(message) => DownloadError::Broken(message),
        }
    }
}

/// A connection to `endpoint` (`http://host:port` or `https://host:port`, an optional trailing
/// `/`) and the `host:port` it names.
fn connect(
    endpoint: &str,
    ca_file: Option<&Path>,
) -> Result<(Box<dyn ReadWrite>, String), ConnectError> {
    let unusable = ConnectError::Unusable;
    let (https, authority) = match (
        endpoint.strip_prefix("https://"),
        endpoint.strip_prefix("http://"),
    ) {
        (Some(rest), _) => (true, rest),
        (None, Some(rest)) => (false, rest),
        (None, None) => {
            return Err(unusable(format!(
                "the endpoint `{endpoint}` must start with http:// or https://"
            )));
        }
    };
    let authority = authority.trim_end_matches('/').to_string();
    let failed = |error: std::io::Error| format!("{endpoint}: {error}");
    let address = authority
        .to_socket_addrs()
        .map_err(|error| unusable(failed(error)))?
        .next()
        .ok_or_else(|| unusable(format!("{endpoint}: no address")))?;
    let stream = TcpStream::connect_timeout(&address, Duration::from_secs(5))
        .map_err(|error| ConnectError::Unreachable(failed(error)))?;
    stream
        .set_read_timeout(Some(CALL_TIMEOUT))
        .map_err(|error| unusable(failed(error)))?;
    if !https {
        return Ok((Box::new(stream), authority));
    }
    let ca_file = ca_file.ok_or_else(|| {
        unusable(format!(
            "{endpoint}: https needs --ca-file, the CA that signed the server's certificate"
        ))
    })?;
    let host = authority
        .rsplit_once(':')
        .map_or(authority.as_str(), |(host, _)| host)
        .trim_start_matches('[')
        .trim_end_matches(']');
    let name = ServerName::try_from(host.to_string())
        .map_err(|error| unusable(format!("{endpoint}: {error}")))?;
    let connection = rustls::ClientConnection::new(tls_client(ca_file).map_err(unusable)?, name)
        .map_err(|error| unusable(format!("{endpoint}: {error}")))?;
    Ok((
        Box::new(rustls::StreamOwned::new(connection, stream)),
        authority,
    ))
}

/// A connection, plain or in TLS.
trait ReadWrite: Read + Write {}

impl<T: Read + Write> ReadWrite for T {}

/// The request's head and body.
fn request(
    method: &str,
    path: &str,
    authority: &str,
    body: Option<Body<'_>>,
    token: Option<&AdminToken>,
) -> Vec<u8> {
    let (content_type, body) = body.map_or(("application/json", &[][..]), |body| {
        (body.content_type, body.bytes)
    });
    let authorization = token
        .map(|token| format!("Authorization: Bearer {}\r\n", token.expose()))
        .unwrap_or_default();
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: {content_type}\r\n\
         {authorization}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    request
}

/// One HTTP/1.1 request to `endpoint`: the status and the body.
fn call(
    endpoint: &str,
    method: &str,
    path: &str,
    body: Option<Body<'_>>,
    token: Option<&AdminToken>,
    ca_file: Option<&Path>,
) -> Result<(u16, String), CallError> {
    // Once a byte of the request may have gone out, a failure leaves it perhaps acted on.
    let failed = |error| classify(endpoint, error, CallError::CutOff, CallError::Broken);
    let (mut connection, authority) = connect(endpoint, ca_file)?;
    connection
        .write_all(&request(method, path, &authority, body, token))
        .map_err(failed)?;
    let mut answer = Vec::new();
    match connection.read_to_end(&mut answer) {
        Ok(_) => {}
        // A TLS server that closes after its answer without a close_notify: the answer is
        // whole when it parses (and cut off when it does not).
        Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => {}
        Err(error) => return Err(failed(error)),
    }
    if let Some(response) = parse_response(&answer) {
        return Ok(response);
    }
    let began_as_http = answer.starts_with(b"HTTP/") || b"HTTP/".starts_with(&answer);
    if began_as_http {
        Err(CallError::CutOff(format!(
            "{endpoint}: the connection closed after {} bytes of an answer",
            answer.len()
        )))
    } else {
        Err(CallError::Broken(format!(
            "{endpoint} answered what is not HTTP"
        )))
    }
}

/// `GET path` with the body streamed into `out` as it arrives: the body's length in bytes,
/// or why it did not arrive whole (a status other than 200, a body cut short).
fn download(
    endpoint: &str,
    path: &str,
    token: Option<&AdminToken>,
    ca_file: Option<&Path>,
    out: &mut dyn Write,
) -> Result<u64, DownloadError> {
    let failed = |error| {
        classify(
            endpoint,
            error,
            DownloadError::Interrupted,
            DownloadError::Broken,
        )
    };
    let (mut connection, authority) = connect(endpoint, ca_file)?;
    connection
        .write_all(&request("GET", path, &authority, None, token))
        .map_err(failed)?;
    let mut answer = std::io::BufReader::new(connection);
    let status_line = read_line(&mut answer).map_err(failed)?;
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|status| status.parse().ok())
        .ok_or_else(|| DownloadError::Broken(format!("{endpoint} answered what is not HTTP")))?;
    let mut chunked = false;
    let mut length = None;
    loop {
        let line = read_line(&mut answer).map_err(failed)?;
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').unwrap_or((&line, ""));
        let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
        if name == "transfer-encoding" && value.to_ascii_lowercase().contains("chunked") {
            chunked = true;
        } else if name == "content-length" {
            length = value.parse::<u64>().ok();
        }
    }
    if status != 200 {
        let mut problem = Vec::new();
        let _ = answer.take(1 << 20).read_to_end(&mut problem);
        return Err(DownloadError::Refused {
            status,
            message: failure("GET", path, status, &String::from_utf8_lossy(&problem)),
        });
    }
    let cut = |copied: u64| {
        DownloadError::Interrupted(format!(
            "{endpoint}: the answer was cut short after {copied} bytes"
        ))
    };
    let mut out = BodySink { out, failed: false };
    // A failed copy is this side's when the write failed, the server's when the read did.
    let copy_failed = |error: std::io::Error, out: &BodySink| {
        if out.failed {
            DownloadError::Broken(format!("writing what {endpoint} sent: {error}"))
        } else {
            failed(error)
        }
    };
    let mut copied = 0u64;
    if !chunked {
        copied = std::io::copy(&mut answer, &mut out).map_err(|error| copy_failed(error, &out))?;
        return match length {
            Some(length) if length != copied => Err(cut(copied)),
            _ => Ok(copied),
        };
    }
    loop {
        let size_line = read_line(&mut answer).map_err(|_| cut(copied))?;
        let size = size_line.split(';').next().unwrap_or_default().trim();
        let size = u64::from_str_radix(size, 16).map_err(|_| {
            DownloadError::Broken(format!(
                "{endpoint}: a chunk size that is not one: {size_line:?}"
            ))
        })?;
        if size == 0 {
            return Ok(copied);
        }
        let chunk = std::io::copy(&mut (&mut answer).take(size), &mut out)
            .map_err(|error| copy_failed(error, &out))?;
        copied += chunk;
        if chunk != size || !read_line(&mut answer).map_err(|_| cut(copied))?.is_empty() {
            return Err(cut(copied));
        }
    }
}

/// `error`, met on the connection to `endpoint`, as `broke_off_as` (a server that went away:
/// asking again may mend it) or `broken` (a TLS or protocol error: it would not).
fn classify<E>(
    endpoint: &str,
    error: std::io::Error,
    broke_off_as: fn(String) -> E,
    broken: fn(String) -> E,
) -> E {
    let message = format!("{endpoint}: {error}");
    if broke_off(&error) {
        broke_off_as(message)
    } else {
        broken(message)
    }
}

/// Whether `error`, met on a connection, is what a server that went away leaves: asking again
/// may mend it (a TLS or protocol error would not).
fn broke_off(error: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        error.kind(),
        ConnectionRefused
            | ConnectionReset
            | ConnectionAborted
            | BrokenPipe
            | NotConnected
            | UnexpectedEof
            | TimedOut
            | WouldBlock
    )
}

/// Where a download's body goes, remembering whether a write to it failed.
struct BodySink<'a> {
    out: &'a mut dyn Write,
    failed: bool,
}

impl Write for BodySink<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let written = self.out.write(bytes);
        self.failed |= written.is_err();
        written
    }

    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        let written = self.out.write_all(bytes);
        self.failed |= written.is_err();
        written
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let flushed = self.out.flush();
        self.failed |= flushed.is_err();
        flushed
    }
}

/// One line of an answer's head or of its chunks' framing, without its `\r\n`; an error if
/// the answer ends first. Bounded: a line is never longer than a few kilobytes here.
fn read_line(answer: &mut impl BufRead) -> std::io::Result<String> {
    let mut line = Vec::new();
    Read::take(&mut *answer, 16 * 1024).read_until(b'\n', &mut line)?;
    if line.last() != Some(&b'\n') {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the answer ended inside a line",
        ));
    }
    line.pop();
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    Ok(String::from_utf8_lossy(&line).into_owned())
}

/// A TLS client that trusts the CA certificates in `ca_file` (PEM).
fn tls_client(ca_file: &Path) -> Result<Arc<rustls::ClientConfig>, String> {
    let named = |detail: String| format!("{}: {detail}", ca_file.display());
    let mut roots = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_file_iter(ca_file).map_err(|e| named(e.to_string()))? {
        let certificate = certificate.map_err(|e| named(e.to_string()))?;
        roots.add(certificate).map_err(|e| named(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(named("no certificate in it".into()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| error.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The status and body of a whole HTTP/1.1 response (a chunked body is joined); `None` for
/// one cut short (a body shorter than its length) or not HTTP.
fn parse_response(bytes: &[u8]) -> Option<(u16, String)> {
    let split = bytes.windows(4).position(|window| window == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&bytes[..split]);
    let body_bytes = &bytes[split + 4..];
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let header = |name: &str| {
        head.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.trim()
                .eq_ignore_ascii_case(name)
                .then(|| value.trim().to_ascii_lowercase())
        })
    };
    let chunked = header("transfer-encoding").is_some_and(|value| value.contains("chunked"));
    if !chunked {
        if let Some(length) = header("content-length") {
            let length: usize = length.parse().ok()?;
            return Some((
                status,
                String::from_utf8_lossy(body_bytes.get(..length)?).into(),
            ));
        }
        return Some((status, String::from_utf8_lossy(body_bytes).into_owned()));
    }
    let text = String::from_utf8_lossy(body_bytes);
    let body: &str = &text;
    let mut joined = String::new();
    let mut rest = body;
    loop {
        let (size, after) = rest.split_once("\r\n")?;
        let size = usize::from_str_radix(size.trim(), 16).ok()?;
        if size == 0 {
            return Some((status, joined));
        }
        joined.push_str(after.get(..size)?);
        rest = after.get(size..)?.strip_prefix("\r\n")?;
    }
}

/// A loopback server answering its connections with `answers`, one each and in order (the
/// request read first), then gone: its URL.
#[cfg(test)]
pub(crate) fn answering_in_turn(answers: Vec<&'static [u8]>) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for answer in answers {
            let (mut connection, _) = listener.accept().unwrap();
            let _ = connection.read(&mut [0u8; 1024]);
            let _ = connection.write_all(answer);
        }
    });
    url
}

/// An HTTP answer with `status` (`"200 OK"`) and a JSON `body`, for [`answering_in_turn`].
#[cfg(test)]
pub(crate) fn http_answer(status: &str, body: &str) -> &'static [u8] {
    let text = format!(
        "HTTP/1.1 {status}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    Box::leak(text.into_bytes().into_boxed_slice())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_parse_with_and_without_chunks() {
        let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n[]";
        assert_eq!(parse_response(plain), Some((200, "[]".into())));
        let chunked =
            b"HTTP/1.1 409 Conflict\r\ntransfer-encoding: chunked\r\n\r\n3\r\n{\"a\r\n2\r\n\"}\r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked), Some((409, "{\"a\"}".into())));
        assert_eq!(parse_response(b"garbage"), None);
    }

    fn answering(answer: &'static [u8]) -> String {
        answering_in_turn(vec![answer])
    }

    #[test]
    fn a_call_without_an_answer_says_whether_the_request_went_out() {
        let ask = |url: &str| call(url, "POST", "/c", None, None, None);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let closed = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        assert!(matches!(ask(&closed), Err(CallError::Unreachable(_))));
        for cut_off in [
            &b""[..],
            b"HTTP/1.1 200 OK\r\ncontent-le",
            b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n[1,",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\n[1,\r\n",
        ] {
            let answer = ask(&answering(cut_off));
            assert!(matches!(answer, Err(CallError::CutOff(_))), "{answer:?}");
        }
        let answer = ask(&answering(b"SSH-2.0-OpenSSH\r\n"));
        assert!(matches!(answer, Err(CallError::Broken(_))), "{answer:?}");
        let answer = ask(&answering(
            b"HTTP/1.1 409 Conflict\r\ncontent-length: 2\r\n\r\n{}",
        ));
        assert_eq!(answer, Ok((409, "{}".to_string())));
        let answer = call("ftp://x", "GET", "/", None, None, None);
        assert!(matches!(answer, Err(CallError::Broken(_))), "{answer:?}");
    }

    #[test]
    fn a_download_is_whole_or_named_as_cut_short() {
        let whole = answering(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n");
        let mut body = Vec::new();
        assert_eq!(download(&whole, "/b", None, None, &mut body), Ok(5));
        assert_eq!(body, b"abcde");

        let cut =
            answering(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n9\r\nde");
        let error = download(&cut, "/b", None, None, &mut Vec::new()).unwrap_err();
        assert!(
            error.to_string().contains("cut short after 5 bytes"),
            "{error}"
        );

        let short = answering(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc");
        let error = download(&short, "/b", None, None, &mut Vec::new()).unwrap_err();
        assert!(
            matches!(&error, DownloadError::Interrupted(message) if message.contains("cut short after 3 bytes")),
            "{error}"
        );

        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let closed = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let error = download(&closed, "/b", None, None, &mut Vec::new()).unwrap_err();
        assert!(matches!(error, DownloadError::Interrupted(_)), "{error}");

        let not_http = answering(b"SSH-2.0-OpenSSH\r\n");
        let error = download(&not_http, "/b", None, None, &mut Vec::new()).unwrap_err();
        assert!(matches!(error, DownloadError::Broken(_)), "{error}");

        // A write where the body goes that fails is this side's failure, not the server's.
        struct DiskFull;
        impl Write for DiskFull {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::Error::from(std::io::ErrorKind::StorageFull))
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let whole = answering(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nabc");
        let error = download(&whole, "/b", None, None, &mut DiskFull).unwrap_err();
        assert!(
            matches!(&error, DownloadError::Broken(message) if message.starts_with("writing what")),
            "{error}"
        );

        let refused = answering(
            b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 19\r\n\r\n{\"detail\":\"no key\"}",
        );
        let error = download(&refused, "/b", None, None, &mut Vec::new()).unwrap_err();
        let message = "GET /b: HTTP 401: no key".to_string();
        assert_eq!(
            error,
            DownloadError::Refused {
                status: 401,
                message
            }
        );
    }
}
