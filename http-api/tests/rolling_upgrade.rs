//! A rolling upgrade from an earlier build: three members started with a `concord` binary of
//! an earlier peer protocol version are restarted one by one with this build while clients
//! write through every member, and every write is read back through every member. From
//! version 2 (before admin entries), while the versions are mixed, a plugin upgrade (an admin
//! entry the old build would misread) is refused naming the old member; once all run this
//! build it goes through; afterwards the old build refuses to start on a member's data. From
//! version 3 the plugin upgrade goes through once all run this build, and going back is not
//! checked (nothing refuses it).
//!
//! Opt-in: it needs the previous build's binary, named by `CONCORD_PREVIOUS_BINARY` (see the
//! README); without it the test says so and passes.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    Server, exit_within, fixture, free_ports, get_kv, initial_cluster, put_kv, request,
    request_bytes, spawn_member_of, wait_converged,
};

fn previous_binary() -> Option<PathBuf> {
    match std::env::var_os("CONCORD_PREVIOUS_BINARY") {
        Some(path) => Some(PathBuf::from(path)),
        None => {
            eprintln!(
                "skipped: set CONCORD_PREVIOUS_BINARY to a concord binary of the previous version"
            );
            None
        }
    }
}

/// SIGTERM, and the member must exit cleanly (leaderships handed over, stores flushed).
fn stop(server: Server) {
    server.stop();
}

/// Upgrades the kv plugin through `address` to `module`, asking again (for up to 20 s) while
/// the answer is a 503 without `until` in it — a member not yet reconnected after a restart:
/// (status, answer).
fn upgrade(address: &str, module: &[u8], until: &str) -> (u16, String) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) =
            request_bytes(address, "PUT", "/v1/plugins/kv", "application/wasm", module);
        let body = String::from_utf8_lossy(&body).into_owned();
        if status != 503 || body.contains(until) || Instant::now() > deadline {
            return (status, body);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The peer protocol version the member at `address` speaks, as it lists itself.
fn own_wire_version(address: &str) -> u64 {
    let (status, body) = request(address, "GET", "/v1/cluster/members", None);
    assert_eq!(status, 200, "{body}");
    let members: serde_json::Value = serde_json::from_str(&body).unwrap();
    let status: serde_json::Value =
        serde_json::from_str(&request(address, "GET", "/v1/status", None).1).unwrap();
    let own = (members.as_array().unwrap().iter())
        .find(|member| member["node_id"] == status["node_id"])
        .expect("the member lists itself");
    own["wire_version"].as_u64().unwrap()
}

#[test]
fn members_of_the_previous_version_are_replaced_one_by_one_under_writes() {
    let Some(previous) = previous_binary() else {
        return;
    };
    let current = PathBuf::from(env!("CARGO_BIN_EXE_concord"));
    let ports = free_ports(3);
    let members = initial_cluster(&ports);
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let kv_flag = format!("kv={}", fixture("kv.wasm").display());
    let flags = ["--plugin", kv_flag.as_str(), "--plugin-groups", "2"];
    let spawn = |binary: &Path, i: usize| {
        let child = spawn_member_of(binary, dirs[i].path(), &members, i as u64 + 1, &flags);
        Server::listening(child)
    };
    let mut servers: Vec<Option<Server>> = (0..3).map(|i| Some(spawn(&previous, i))).collect();
    let address =
        |servers: &[Option<Server>], i: usize| servers[i].as_ref().unwrap().address.clone();
    let mut written = Vec::new();
    let mut write_through_each = |servers: &[Option<Server>], round: &str| {
        for i in 0..3 {
            let key = format!("{round}-via{i}");
            put_kv(&address(servers, i), &key, round);
            written.push((key, round.to_string()));
        }
    };
    write_through_each(&servers, "old");
    let v2_module = std::fs::read(fixture("kv-v2.wasm")).unwrap();
    let previous_version = own_wire_version(&address(&servers, 0));
    // Version 2 predates admin entries: a member of it would misread one.
    let admin_entries_refused_while_mixed = previous_version < 3;
    println!("upgrading from peer protocol version {previous_version}");

    for upgrading in 0..3 {
        stop(servers[upgrading].take().unwrap());
        servers[upgrading] = Some(spawn(&current, upgrading));
        let round = format!("mixed{upgrading}");
        write_through_each(&servers, &round);
        if upgrading < 2 && admin_entries_refused_while_mixed {
            // An old member is still there: the upgrade entry would be misread by it.
            let through = address(&servers, upgrading);
            let old_member = "speaks peer protocol version 2";
            let (status, body) = upgrade(&through, &v2_module, old_member);
            assert_eq!(status, 503, "{body}");
            assert!(body.contains(old_member), "{body}");
        }
    }
    let addresses: Vec<String> = (0..3).map(|i| address(&servers, i)).collect();
    for address in &addresses {
        for (key, value) in &written {
            assert_eq!(&get_kv(address, key), value, "{key} through {address}");
        }
    }

    // Every member runs this build: the plugin upgrade goes through, and applies everywhere.
    let (status, body) = upgrade(&addresses[0], &v2_module, "(no 503 is expected)");
    assert_eq!(status, 200, "{body}");
    put_kv(&addresses[1], "after", "new");
    for address in &addresses {
        assert_eq!(get_kv(address, "after"), "v2:new");
    }
    wait_converged(
        &addresses.iter().map(String::as_str).collect::<Vec<_>>(),
        6,
        Duration::from_secs(20),
    );

    if !admin_entries_refused_while_mixed {
        for server in servers.into_iter().flatten() {
            stop(server);
        }
        return;
    }
    // Going back to the previous build on a member's data is refused at start.
    stop(servers[2].take().unwrap());
    let mut old_again = Command::new(&previous)
        .arg("serve")
        .arg("--data-dir")
        .arg(dirs[2].path())
        .args([
            "--http-addr",
            "127.0.0.1:0",
            "--groups",
            "4",
            "--node-id",
            "3",
        ])
        .args(["--initial-cluster", members.as_str()])
        .args(flags)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = exit_within(&mut old_again, Duration::from_secs(20));
    if status.is_none() {
        let _ = old_again.kill();
    }
    let mut said = String::new();
    old_again
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut said)
        .unwrap();
    // It is refused for the first of two reasons it checks: the data directory's format
    // (this build moved it to a version the previous one does not read) or the peers file
    // (this node committed entries the previous build would misread).
    assert!(
        status.is_some_and(|status| !status.success())
            && (said.contains("format version 3") || said.contains("wire-version=3")),
        "the previous build started on data it cannot read: {status:?} {said}"
    );
    for server in servers.into_iter().flatten() {
        stop(server);
    }
}
