//! The HTTP listener's bounds against its own clients, over raw sockets to the real binary: a
//! deadline for every request head (half requests, idle keep-alive connections), a connection
//! limit, and a shutdown that a client cannot hold open.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::Server;

/// Reads until the server closes the connection (or 10 s pass): what it sent.
fn read_until_closed(stream: &mut TcpStream) -> (String, Duration) {
    let started = Instant::now();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buffer[..n]),
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(error) => panic!("the server kept the connection open: {error}"),
        }
    }
    (
        String::from_utf8_lossy(&answer).into_owned(),
        started.elapsed(),
    )
}

#[test]
fn half_requests_and_idle_connections_are_closed_after_the_header_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        dir.path(),
        &["--backend", "mem", "--http-header-timeout-ms", "500"],
    );
    let mut half = TcpStream::connect(&server.address).unwrap();
    half.write_all(b"GET /livez HT").unwrap();
    let mut idle = TcpStream::connect(&server.address).unwrap();
    idle.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut silent = TcpStream::connect(&server.address).unwrap();

    let (answer, _) = read_until_closed(&mut half);
    assert_eq!(answer, "", "a half request gets no answer");
    let (answer, _) = read_until_closed(&mut idle);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let (answer, waited) = read_until_closed(&mut silent);
    assert_eq!(answer, "");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    server.stop();
}

/// A connection's read buffer is capped at 64 KiB (a thousand connections streaming large
/// bodies each buffered hundreds of kilobytes before): a small head is served, and a 200 KiB
/// one — taken before the cap — is answered 431. (hyper checks the cap only while a head is
/// incomplete, so a head a little over it may still fit in one read.)
#[test]
fn a_connection_buffers_a_bounded_part_of_a_request() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--backend", "mem"]);
    let head = |header_bytes: usize| {
        let mut stream = TcpStream::connect(&server.address).unwrap();
        let request = format!(
            "GET /livez HTTP/1.1\r\nHost: x\r\nX-Filler: {}\r\nConnection: close\r\n\r\n",
            "a".repeat(header_bytes)
        );
        // The server may answer and close before it read everything: a failed write is fine.
        let _ = stream.write_all(request.as_bytes());
        read_until_closed(&mut stream).0
    };
    let answer = head(8 * 1024);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let answer = head(200 * 1024);
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    server.stop();
}

#[test]
fn connections_over_the_limit_are_answered_503_and_closed() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        dir.path(),
        &["--backend", "mem", "--http-max-connections", "4"],
    );
    let held: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(&server.address).unwrap())
        .collect();
    // The held connections are accepted in order; give the listener a moment to take them.
    std::thread::sleep(Duration::from_millis(200));
    let mut over = TcpStream::connect(&server.address).unwrap();
    let (answer, _) = read_until_closed(&mut over);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("retry-after: 1"), "{answer}");
    assert!(
        answer.contains("urn:concord:problem:overloaded"),
        "{answer}"
    );

    drop(held);
    // Until the server has seen the held ones close, a new connection may still be refused
    // (503, or reset when it closes with the request unread).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Ok((200, _)) = common::try_request(&server.address, "GET", "/livez", &[], None) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "closed connections free their places"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    server.stop();
}

#[test]
fn shutdown_answers_in_flight_requests_with_connection_close_and_no_client_holds_it() {
    let dir = tempfile::tempdir().unwrap();
    // A long head deadline, so that only the drain deadline (the request timeout) ends the
    // half request below.
    let server = Server::start(
        dir.path(),
        &[
            "--backend",
            "mem",
            "--http-header-timeout-ms",
            "60000",
            "--request-timeout-ms",
            "2000",
        ],
    );
    let mut half = TcpStream::connect(&server.address).unwrap();
    half.write_all(b"GET /liv").unwrap();
    let body = r#"{"client_id": "draining"}"#;
    let mut in_flight = TcpStream::connect(&server.address).unwrap();
    write!(
        in_flight,
        "POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{}",
        body.len(),
        &body[..10]
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(200));

    let started = Instant::now();
    let mut server = server;
    let terminated = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(terminated.success());
    std::thread::sleep(Duration::from_millis(200));
    in_flight.write_all(&body.as_bytes()[10..]).unwrap();
    let (answer, _) = read_until_closed(&mut in_flight);
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
    let status = server.child.wait().unwrap();
    assert!(status.success(), "concord exited with {status}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the half request held the shutdown for {:?}",
        started.elapsed()
    );
    drop(half);
}

/// Idle sockets from anyone must not exhaust the process's descriptors: under a limit of 320,
/// 400 idle connections are held, and the node still writes to its log and answers once the
/// head deadline has closed them (the connection limit fits the descriptor limit).
#[test]
fn idle_sockets_cannot_exhaust_the_descriptors() {
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new("bash")
        .arg("-c")
        .arg("ulimit -n 320 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_concord"))
        .arg("serve")
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--backend", "wal", "--http-addr", "127.0.0.1:0"])
        .args(["--http-header-timeout-ms", "1000", "--log-level", "error"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let server = Server::listening(child);
    let held: Vec<TcpStream> = (0..400)
        .filter_map(|_| TcpStream::connect(&server.address).ok())
        .collect();
    assert!(held.len() > 320, "the test could not open its sockets");
    // The head deadline closes the held ones; until then a new connection may be refused.
    let deadline = Instant::now() + Duration::from_secs(10);
    let first = r#"{"client_id": "after-the-flood"}"#;
    while !matches!(
        common::try_request(&server.address, "POST", "/v1/sessions", &[], Some(first)),
        Ok((201, _))
    ) {
        assert!(Instant::now() < deadline, "the node never answered again");
        std::thread::sleep(Duration::from_millis(100));
    }
    for n in 0..50 {
        let body = format!(r#"{{"client_id": "after-{n}"}}"#);
        let (status, answer) = server.request("POST", "/v1/sessions", Some(&body));
        assert_eq!(status, 201, "{answer}");
    }
    let (status, _) = server.request("GET", "/readyz", None);
    assert_eq!(status, 200);
    drop(held);
    server.stop();
}
