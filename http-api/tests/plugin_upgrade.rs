//! A served plugin upgraded through the log (`PUT /v1/plugins/{name}`), from the committed
//! fixtures kv.wasm (v1) and kv-v2.wasm (v2: a put stores `v2:` before the value, and its
//! migration records the module it replaced): entries before the upgrade run v1, entries after
//! it v2, across a SIGKILL and a restart with v1 configured; a bad module is refused before
//! anything is proposed; data opened with another plugin is refused naming both hashes — on
//! one node and on three processes.

mod common;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{
    Server, fixture, free_ports, get_kv, initial_cluster, put_kv, request, request_bytes,
    spawn_member_with,
};
use serde_json::Value;

/// Upgrades the kv plugin through `address` to `module`: (status, answer).
fn upgrade(address: &str, content_type: &str, module: &[u8]) -> (u16, Value) {
    let (status, body) = request_bytes(address, "PUT", "/v1/plugins/kv", content_type, module);
    let answer = serde_json::from_slice(&body).unwrap_or(Value::Null);
    (status, answer)
}

/// The identity of the module the kv plugin runs, as `/v1/plugins` shows it.
fn running_identity(address: &str) -> String {
    let (status, body) = request(address, "GET", "/v1/plugins", None);
    assert_eq!(status, 200, "{body}");
    let listed: Value = serde_json::from_str(&body).unwrap();
    format!(
        "sha256:{}",
        listed["plugins"][0]["module"]["sha256"].as_str().unwrap()
    )
}

fn kill(mut server: Server) {
    server.child.kill().unwrap();
    server.child.wait().unwrap();
}

#[test]
fn an_upgrade_through_the_log_switches_at_its_entry_and_survives_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let v1_flag = format!("kv={}", fixture("kv.wasm").display());
    let flags = ["--plugin", v1_flag.as_str(), "--plugin-groups", "2"];
    let server = Server::start(dir.path(), &flags);
    let address = server.address.clone();
    let v1 = running_identity(&address);
    for k in 0..10 {
        put_kv(&address, &format!("before{k}"), "one");
    }

    // Refused before anything is proposed: not a module, another media type, no such plugin.
    let (status, answer) = upgrade(&address, "application/wasm", b"\0asm not really");
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["type"], "urn:concord:problem:upgrade-refused");
    let (status, _) = upgrade(&address, "text/plain", b"x");
    assert_eq!(status, 415);
    let (status, _) = request_bytes(&address, "PUT", "/v1/plugins/nope", "application/wasm", b"");
    assert_eq!(status, 404);
    assert_eq!(running_identity(&address), v1);

    let v2_module = std::fs::read(fixture("kv-v2.wasm")).unwrap();
    let (status, answer) = upgrade(&address, "application/wasm", &v2_module);
    assert_eq!(status, 200, "{answer}");
    let v2 = answer["identity"].as_str().unwrap().to_string();
    assert_ne!(v2, v1);
    assert_eq!(answer["groups"], 2);
    assert_eq!(running_identity(&address), v2);
    for k in 0..10 {
        put_kv(&address, &format!("after{k}"), "two");
    }
    // Asking again is a no-op.
    let (status, again) = upgrade(&address, "application/octet-stream", &v2_module);
    assert_eq!((status, &again["identity"]), (200, &answer["identity"]));
    // Both groups run v2, none v1.
    let (_, metrics) = request(&address, "GET", "/metrics", None);
    let groups_running = |identity: &str| {
        let hash = identity.trim_start_matches("sha256:");
        let series = format!("concord_plugin_groups{{plugin=\"kv\",sha256=\"{hash}\"}} ");
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(&series))
            .unwrap_or_else(|| panic!("no {series} in /metrics"))
            .to_string()
    };
    assert_eq!(
        (groups_running(&v2), groups_running(&v1)),
        ("2".into(), "0".into())
    );

    // Killed without a flush, restarted with v1 still configured: the log replays through the
    // upgrade entry, and the groups run what their data records.
    kill(server);
    let server = Server::start(dir.path(), &flags);
    let address = server.address.clone();
    for k in 0..10 {
        assert_eq!(get_kv(&address, &format!("before{k}")), "one");
        assert_eq!(get_kv(&address, &format!("after{k}")), "v2:two");
    }
    put_kv(&address, "later", "three");
    assert_eq!(get_kv(&address, "later"), "v2:three");
    // v2's migration ran at the switch (in the group of this key, as in every other), told
    // which module it replaced.
    assert_eq!(get_kv(&address, "migrated-from"), v1);
    assert_eq!(running_identity(&address), v2);
    server.stop();

    // Another module over this data is refused, naming what the data records and what was given.
    let counter_flag = format!("kv={}", fixture("counter.wasm").display());
    let refused = Command::new(env!("CARGO_BIN_EXE_concord"))
        .arg("serve")
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--http-addr", "127.0.0.1:0", "--log-level", "warn"])
        .args(["--plugin", &counter_flag, "--plugin-groups", "2"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains(&v2) && stderr.contains(&v1) && stderr.contains("was started with sha256:"),
        "{stderr}"
    );

    // Rolling back is another upgrade, here with `concord plugin upgrade`.
    let server = Server::start(dir.path(), &flags);
    let rollback = Command::new(env!("CARGO_BIN_EXE_concord"))
        .args(["plugin", "upgrade", "kv"])
        .arg(fixture("kv.wasm"))
        .args(["--endpoint", &format!("http://{}", server.address)])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&rollback.stdout);
    assert!(
        rollback.status.success(),
        "{said} {}",
        String::from_utf8_lossy(&rollback.stderr)
    );
    assert_eq!(said, format!("plugin kv runs {v1} in its 2 groups\n"));
    put_kv(&server.address, "rolled-back", "four");
    assert_eq!(get_kv(&server.address, "rolled-back"), "four");
    assert_eq!(get_kv(&server.address, "later"), "v2:three");
    let refused = Command::new(env!("CARGO_BIN_EXE_concord"))
        .args(["plugin", "upgrade", "kv"])
        .arg(fixture("../build-plugins.sh"))
        .args(["--endpoint", &format!("http://{}", server.address)])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && said.contains("HTTP 422"),
        "{said}"
    );
    server.stop();
}

#[test]
fn three_processes_switch_at_the_same_entry() {
    let ports = free_ports(3);
    let members = initial_cluster(&ports);
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let v1_flag = format!("kv={}", fixture("kv.wasm").display());
    let flags = ["--plugin", v1_flag.as_str(), "--plugin-groups", "2"];
    let spawn = |i: usize| {
        Server::listening(spawn_member_with(
            dirs[i].path(),
            &members,
            i as u64 + 1,
            &flags,
        ))
    };
    let mut servers: Vec<Server> = (0..3).map(spawn).collect();
    let addresses: Vec<String> = servers.iter().map(|s| s.address.clone()).collect();
    for k in 0..10 {
        put_kv(&addresses[k % 3], &format!("before{k}"), "one");
    }
    // Through any member (a follower's upgrade entries go to each group's leader), while a
    // writer puts keys one after another: in each group, every key written after the first
    // one v2 wrote is v2's too — the switch is one point in each group's log.
    let v2_module = std::fs::read(fixture("kv-v2.wasm")).unwrap();
    let upgraded = Arc::new(AtomicBool::new(false));
    // The writer goes on until it has written 30 keys after the upgrade answered, however
    // long the upgrade takes on a busy machine (and gives up at 5000).
    let writer = {
        let address = addresses[2].clone();
        let upgraded = Arc::clone(&upgraded);
        std::thread::spawn(move || {
            let mut after_upgrade = 0;
            let mut written = 0;
            while after_upgrade < 30 && written < 5000 {
                let upgraded_before_this_put = upgraded.load(Ordering::SeqCst);
                put_kv(&address, &format!("seq{written:04}"), "x");
                written += 1;
                if upgraded_before_this_put {
                    after_upgrade += 1;
                }
            }
            written
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    let (status, answer) = upgrade(&addresses[1], "application/wasm", &v2_module);
    assert_eq!(status, 200, "{answer}");
    upgraded.store(true, Ordering::SeqCst);
    let written = writer.join().unwrap();
    let mut seen_v2 = std::collections::BTreeMap::new();
    for n in 0..written {
        let key = format!("seq{n:04}");
        // The kv plugin's own 2 groups: which one the key routes to.
        let group = concord_engine::group_of(key.as_bytes(), 2);
        let by_v2 = get_kv(&addresses[0], &key) == "v2:x";
        let earlier_v2 = seen_v2.entry(group).or_insert(false);
        assert!(by_v2 || !*earlier_v2, "{key} in group {group}: v1 after v2");
        *earlier_v2 |= by_v2;
    }
    assert!(
        seen_v2.values().any(|&v2| v2),
        "no key written after the upgrade answered was v2's"
    );
    for k in 0..10 {
        put_kv(&addresses[k % 3], &format!("after{k}"), "two");
    }
    for address in &addresses {
        for k in 0..10 {
            assert_eq!(get_kv(address, &format!("before{k}")), "one");
            assert_eq!(get_kv(address, &format!("after{k}")), "v2:two");
        }
    }

    // A member killed and restarted with v1 configured runs v2 from its data.
    kill(servers.remove(0));
    servers.insert(0, spawn(0));
    let restarted = servers[0].address.clone();
    put_kv(&restarted, "later", "three");
    for address in [&restarted, &addresses[1], &addresses[2]] {
        assert_eq!(get_kv(address, "later"), "v2:three");
        assert_eq!(get_kv(address, "before3"), "one");
    }

    // A member that lost its data comes back through snapshots, which carry the record and the
    // module: with v1 configured, it runs v2 from the snapshot.
    kill(servers.pop().unwrap());
    std::fs::remove_dir_all(dirs[2].path()).unwrap();
    std::fs::create_dir(dirs[2].path()).unwrap();
    let mut rejoin = flags.to_vec();
    rejoin.extend(["--initial-cluster-state", "existing"]);
    servers.push(Server::listening(spawn_member_with(
        dirs[2].path(),
        &members,
        3,
        &rejoin,
    )));
    let rejoined = servers[2].address.clone();
    // Every replica of every group holds the same state, the plugin records included.
    let converged: Vec<&str> = vec![&restarted, &addresses[1], &rejoined];
    common::wait_converged(&converged, 6, Duration::from_secs(30));
    let stale = |key: &str| {
        let path = format!("/v1/plugins/kv/keys/{key}?consistency=stale");
        request(&rejoined, "GET", &path, None)
    };
    assert_eq!(stale("after4"), (200, "v2:two".into()));
    assert_eq!(stale("before4"), (200, "one".into()));
    assert_eq!(running_identity(&rejoined), running_identity(&restarted));
    put_kv(&rejoined, "from-rejoined", "four");
    assert_eq!(get_kv(&addresses[1], "from-rejoined"), "v2:four");
    for server in servers {
        server.stop();
    }
}
