//! `concord plugin new`, as its README says: write the project, build it, serve it, call it.
//! Needs the wasm32-unknown-unknown target (`.ci/run` installs it; elsewhere the test says it
//! skipped).

mod common;

use std::path::Path;
use std::process::Command;

use common::Server;

/// The repository's toolchain, so the project builds with the same compiler whatever the
/// machine's default is.
fn toolchain() -> String {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../rust-toolchain.toml");
    let text = std::fs::read_to_string(file).unwrap();
    text.lines()
        .find_map(|line| line.trim().strip_prefix("channel = "))
        .map(|channel| channel.trim_matches('"').to_string())
        .expect("a channel in rust-toolchain.toml")
}

fn wasm_target_installed(toolchain: &str) -> bool {
    let Ok(output) = Command::new("rustc")
        .env("RUSTUP_TOOLCHAIN", toolchain)
        .args(["--print", "sysroot"])
        .output()
    else {
        return false;
    };
    let sysroot = String::from_utf8_lossy(&output.stdout).trim().to_string();
    Path::new(&sysroot)
        .join("lib/rustlib/wasm32-unknown-unknown")
        .is_dir()
}

fn raw_command(address: &str, plugin: &str, key: &str, command: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    let request = format!(
        "POST /v1/plugins/{plugin}/commands?key={key} HTTP/1.1\r\nHost: {address}\r\n\
         Content-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{command}",
        command.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer.split(' ').nth(1).unwrap().parse().unwrap();
    let body = answer.split_once("\r\n\r\n").unwrap().1.to_string();
    (status, body)
}

#[test]
fn a_new_plugin_project_builds_serves_and_answers() {
    let toolchain = toolchain();
    if !wasm_target_installed(&toolchain) {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but the wasm32-unknown-unknown target is not installed (.ci/run adds it)"
        );
        eprintln!("skipped: the wasm32-unknown-unknown target is not installed");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let project = work.path().join("notes");
    let made = Command::new(env!("CARGO_BIN_EXE_concord"))
        .args(["plugin", "new"])
        .arg(&project)
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );

    // The README's build: in the project (its .cargo/config.toml picks the target and stack).
    let built = Command::new("cargo")
        .current_dir(&project)
        .env("RUSTUP_TOOLCHAIN", &toolchain)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .args(["build", "--release", "--offline"])
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let wasm = project.join("target/wasm32-unknown-unknown/release/notes.wasm");
    assert!(wasm.is_file(), "no {}", wasm.display());

    // The README's serve and calls.
    let data = tempfile::tempdir().unwrap();
    let served = format!("notes={}", wasm.display());
    let server = Server::start(data.path(), &["--plugin", &served]);
    assert_eq!(
        raw_command(&server.address, "notes", "greeting", "put greeting hello"),
        (200, "hello".into())
    );
    assert_eq!(
        server.request("GET", "/v1/plugins/notes/keys/greeting", None),
        (200, "hello".into())
    );
    let (status, answer) = raw_command(&server.address, "notes", "nothing", "get nothing");
    assert_eq!(status, 422, "{answer}");
    assert!(answer.contains(r#""code":2"#), "{answer}");
    server.stop();
}
