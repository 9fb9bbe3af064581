//! The HTTP listener over TLS and the admin token, with the real binary and `concord member`
//! as a user runs them.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Kills the server when the test ends, however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn concord_member(args: &[&str]) -> (bool, String) {
    concord("member", args)
}

/// `concord SUBCOMMAND ARGS`, with no admin token from the environment.
fn concord(subcommand: &str, args: &[&str]) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_concord"))
        .arg(subcommand)
        .args(args)
        .env_remove("CONCORD_ADMIN_TOKEN_FILE")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

#[test]
fn tls_listener_and_admin_token() {
    let pki = common::test_pki::TestPki::new();
    let ca_file = pki.ca();
    let (cert_file, key_file) = pki.issue("server");
    let token_file = pki.file("token", "admin-token-for-the-test-0001\n");
    let wrong_token_file = pki.file("wrong", "admin-token-for-the-test-0002\n");

    let data = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_concord"))
        .arg("serve")
        .arg("--data-dir")
        .arg(data.path())
        .args(["--http-addr", "127.0.0.1:0", "--log-level", "warn"])
        .args(["--http-tls-cert", &cert_file, "--http-tls-key", &key_file])
        .args(["--admin-token-file", &token_file])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let server = Running(child);
    let address = line
        .trim()
        .strip_prefix("concord listening on https://")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    let endpoint = format!("https://{address}");

    // Over TLS, trusting the CA: reading the members needs no token.
    let (ok, out) = concord_member(&["list", "--endpoint", &endpoint, "--ca-file", &ca_file]);
    assert!(ok, "{out}");
    assert!(out.contains("NODE"), "{out}");
    // Without the CA, https is refused by the client; plain HTTP gets no HTTP answer.
    let (ok, out) = concord_member(&["list", "--endpoint", &endpoint]);
    assert!(!ok && out.contains("--ca-file"), "{out}");
    let mut plain = TcpStream::connect(&address).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    plain
        .write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer);
    assert!(
        !answer.starts_with(b"HTTP/1.1 200"),
        "plain HTTP was served"
    );

    // A change without the token is 401, with a wrong one 403; with the right one it reaches
    // the membership logic (this node runs alone: refused, 409).
    let change = [
        "remove",
        "5",
        "--endpoint",
        &endpoint,
        "--ca-file",
        &ca_file,
    ];
    let (ok, out) = concord_member(&change);
    assert!(!ok && out.contains("HTTP 401"), "{out}");
    let with = |token: &str| {
        let mut args = change.to_vec();
        args.extend(["--admin-token-file", token]);
        concord_member(&args)
    };
    let (ok, out) = with(&wrong_token_file);
    assert!(!ok && out.contains("HTTP 403"), "{out}");
    let (ok, out) = with(&token_file);
    assert!(!ok && out.contains("HTTP 409"), "{out}");
    assert!(!out.contains("admin-token-for-the-test"), "{out}");

    // A backup reads all the data: the same token guards it, and over TLS it arrives whole.
    let backup = std::path::Path::new(&token_file).with_file_name("node.backup");
    let backup = backup.to_str().unwrap();
    let args = [
        "--endpoint",
        &endpoint,
        "--ca-file",
        &ca_file,
        "--output",
        backup,
    ];
    let (ok, out) = concord("backup", &args);
    assert!(!ok && out.contains("HTTP 401"), "{out}");
    assert!(!std::path::Path::new(backup).exists());
    let mut with_token = args.to_vec();
    with_token.extend(["--admin-token-file", &token_file]);
    let (ok, out) = concord("backup", &with_token);
    assert!(ok && out.contains("groups"), "{out}");
    drop(server);
}
