//! `concord member list|add|promote|remove --endpoint URL`: membership changes through any
//! member's HTTP API, over an HTTP/1.1 connection of its own (no client library), in TLS
//! (rustls) for an `https://` endpoint.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::{Arg, ArgMatches, Command};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

use crate::AdminToken;
use crate::routes_cluster::MemberJson;

/// How long a call may take: a change waits for every group (the server gives up after 10 s,
/// or its request timeout).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// The `member` subcommand and its own subcommands.
pub fn command() -> Command {
    let endpoint = Arg::new("endpoint")
        .long("endpoint")
        .env("CONCORD_ENDPOINT")
        .default_value("http://127.0.0.1:7070")
        .global(true)
        .help("The HTTP URL of any member (http://host:port or https://host:port)");
    let node = || {
        Arg::new("node")
            .required(true)
            .value_parser(clap::value_parser!(u64))
            .help("The member's node id")
    };
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
    Command::new("member")
        .about("List the cluster's members, or add, promote or remove one")
        .subcommand_required(true)
        .arg(endpoint)
        .arg(token_file)
        .arg(ca_file)
        .subcommand(Command::new("list").about("The members, their roles and addresses"))
        .subcommand(
            Command::new("add")
                .about(
                    "Add a node as a learner of every group (start it first with \
                     --initial-cluster-state existing)",
                )
                .arg(node())
                .arg(
                    Arg::new("raft_addr")
                        .required(true)
                        .help("Where its peers reach it: ip:port"),
                ),
        )
        .subcommand(
            Command::new("promote")
                .about("Make a learner a voter of every group")
                .arg(node()),
        )
        .subcommand(
            Command::new("remove")
                .about("Remove a member from every group")
                .arg(node()),
        )
}

/// Runs `concord member ...`: what to print, or why it failed.
pub fn run(matches: &ArgMatches) -> Result<String, String> {
    let endpoint = matches
        .get_one::<String>("endpoint")
        .expect("the endpoint has a default");
    let token = matches
        .get_one::<PathBuf>("admin_token_file")
        .map(|path| AdminToken::from_file(path))
        .transpose()?;
    let node = |m: &ArgMatches| *m.get_one::<u64>("node").expect("required");
    let (method, path, body) = match matches.subcommand() {
        Some(("list", _)) => ("GET", "/v1/cluster/members".to_string(), None),
        Some(("add", m)) => {
            let raft_addr = m.get_one::<String>("raft_addr").expect("required");
            let body = serde_json::json!({ "node_id": node(m), "raft_addr": raft_addr });
            ("POST", "/v1/cluster/members".into(), Some(body.to_string()))
        }
        Some(("promote", m)) => (
            "POST",
            format!("/v1/cluster/members/{}/promote", node(m)),
            None,
        ),
        Some(("remove", m)) => ("DELETE", format!("/v1/cluster/members/{}", node(m)), None),
        _ => unreachable!("clap requires a subcommand"),
    };
    let ca_file = matches.get_one::<PathBuf>("ca_file").map(PathBuf::as_path);
    let (status, answer) = call(
        endpoint,
        method,
        &path,
        body.as_deref(),
        token.as_ref(),
        ca_file,
    )?;
    if status != 200 {
        let detail = serde_json::from_str::<serde_json::Value>(&answer)
            .ok()
            .and_then(|problem| problem["detail"].as_str().map(str::to_string))
            .unwrap_or(answer);
        return Err(format!("{method} {path}: HTTP {status}: {detail}"));
    }
    let members: Vec<MemberJson> = serde_json::from_str(&answer)
        .map_err(|error| format!("{endpoint} answered what is not a member list: {error}"))?;
    Ok(table(&members))
}

/// The members as a table, and the `--initial-cluster` a new node starts with.
fn table(members: &[MemberJson]) -> String {
    let mut out = format!(
        "{:<8} {:<8} {:<22} {:<28} {:<10} {}\n",
        "NODE", "ROLE", "RAFT ADDRESS", "CLIENT URL", "REACHABLE", "LEADS"
    );
    for m in members {
        out.push_str(&format!(
            "{:<8} {:<8} {:<22} {:<28} {:<10} {}\n",
            m.node_id,
            m.role,
            m.raft_addr.as_deref().unwrap_or("-"),
            m.client_url.as_deref().unwrap_or("-"),
            if m.reachable { "yes" } else { "no" },
            m.leads
        ));
    }
    let initial: Vec<String> = members
        .iter()
        .filter_map(|m| Some(format!("{}={}", m.node_id, m.raft_addr.as_deref()?)))
        .collect();
    out.push_str(&format!(
        "initial cluster for a node joining: --initial-cluster {} --initial-cluster-state existing\n",
        initial.join(",")
    ));
    out
}

/// One HTTP/1.1 request to `endpoint` (`http://host:port` or `https://host:port`, an optional
/// trailing `/`): the status and the body.
fn call(
    endpoint: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    token: Option<&AdminToken>,
    ca_file: Option<&Path>,
) -> Result<(u16, String), String> {
    let (https, authority) = match (
        endpoint.strip_prefix("https://"),
        endpoint.strip_prefix("http://"),
    ) {
        (Some(rest), _) => (true, rest),
        (None, Some(rest)) => (false, rest),
        (None, None) => {
            return Err(format!(
                "the endpoint `{endpoint}` must start with http:// or https://"
            ));
        }
    };
    let authority = authority.trim_end_matches('/');
    let failed = |error: std::io::Error| format!("{endpoint}: {error}");
    let address = authority
        .to_socket_addrs()
        .map_err(failed)?
        .next()
        .ok_or_else(|| format!("{endpoint}: no address"))?;
    let mut stream =
        TcpStream::connect_timeout(&address, Duration::from_secs(5)).map_err(failed)?;
    stream
        .set_read_timeout(Some(CALL_TIMEOUT))
        .map_err(failed)?;
    let body = body.unwrap_or("");
    let authorization = token
        .map(|token| format!("Authorization: Bearer {}\r\n", token.expose()))
        .unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n\
         {authorization}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut answer = Vec::new();
    if https {
        let ca_file = ca_file.ok_or_else(|| {
            format!(
                "{endpoint}: https needs --ca-file, the CA that signed the server's certificate"
            )
        })?;
        let host = authority
            .rsplit_once(':')
            .map_or(authority, |(host, _)| host)
            .trim_start_matches('[')
            .trim_end_matches(']');
        let name = ServerName::try_from(host.to_string())
            .map_err(|error| format!("{endpoint}: {error}"))?;
        let connection = rustls::ClientConnection::new(tls_client(ca_file)?, name)
            .map_err(|error| format!("{endpoint}: {error}"))?;
        let mut tls = rustls::StreamOwned::new(connection, stream);
        tls.write_all(request.as_bytes()).map_err(failed)?;
        match tls.read_to_end(&mut answer) {
            Ok(_) => {}
            // A server that closes after its answer without a TLS close_notify: the answer is
            // whole when it parses.
            Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => {}
            Err(error) => return Err(failed(error)),
        }
    } else {
        stream.write_all(request.as_bytes()).map_err(failed)?;
        stream.read_to_end(&mut answer).map_err(failed)?;
    }
    parse_response(&answer).ok_or_else(|| format!("{endpoint} answered what is not HTTP"))
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

/// The status and body of a whole HTTP/1.1 response (a chunked body is joined).
fn parse_response(bytes: &[u8]) -> Option<(u16, String)> {
    let text = String::from_utf8_lossy(bytes);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let chunked = head.lines().any(|line| {
        let line = line.to_ascii_lowercase();
        line.starts_with("transfer-encoding:") && line.contains("chunked")
    });
    if !chunked {
        return Some((status, body.to_string()));
    }
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
}
