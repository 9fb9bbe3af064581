//! Plugins served by the binary beside the sessions (`--plugin name=path.wasm`): commands by
//! key (raw bytes and JSON, one and batched), stored keys read at every consistency, errors,
//! a restart, a layout change refused, and three processes answering for each other.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use common::{
    Server, fixture, free_ports, initial_cluster, kv_put, request, retrying, spawn_member_with,
};
use serde_json::{Value, json};

/// The kv plugin's get: op 3.
fn kv_get(key: &str) -> Vec<u8> {
    let mut command = vec![3];
    command.extend_from_slice(&(key.len() as u16).to_le_bytes());
    command.extend_from_slice(key.as_bytes());
    command
}

/// A request with an `application/octet-stream` body: (status, body bytes).
fn raw_post(address: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
    post(address, path, "application/octet-stream", body)
}

/// A POST with a body of `content_type`: (status, body bytes).
fn post(address: &str, path: &str, content_type: &str, body: &[u8]) -> (u16, Vec<u8>) {
    common::request_bytes(address, "POST", path, content_type, body)
}

fn json_command(address: &str, plugin: &str, key: &str, command: &[u8]) -> (u16, Value) {
    let body = json!({"key": key, "command_base64": STANDARD.encode(command)}).to_string();
    let path = format!("/v1/plugins/{plugin}/commands");
    let (status, answer) = request(address, "POST", &path, Some(&body));
    (status, serde_json::from_str(&answer).unwrap())
}

fn decoded(answer: &Value) -> Vec<u8> {
    STANDARD
        .decode(answer["result_base64"].as_str().unwrap())
        .unwrap()
}

#[test]
fn plugins_are_served_beside_the_sessions_and_keep_their_data() {
    let dir = tempfile::tempdir().unwrap();
    // Served under the name given, whatever the file is called.
    let modules = tempfile::tempdir().unwrap();
    let kv_file = modules.path().join("concord_plugin_kv.wasm");
    std::fs::copy(fixture("kv.wasm"), &kv_file).unwrap();
    let (kv, counter) = (
        kv_file.display().to_string(),
        fixture("counter.wasm").display().to_string(),
    );
    let flags = [
        "--plugin",
        &format!("kv={kv}"),
        "--plugin",
        &format!("counter={counter}"),
        "--plugin-groups",
        "2",
    ];
    let server = Server::start(dir.path(), &flags);
    let address = server.address.clone();

    let (status, answer) = request(&address, "GET", "/v1/plugins", None);
    assert_eq!(status, 200, "{answer}");
    let listed: Value = serde_json::from_str(&answer).unwrap();
    let plugins = listed["plugins"].as_array().unwrap();
    assert_eq!(plugins.len(), 2);
    assert_eq!(
        (&plugins[0]["name"], &plugins[0]["first_group"]),
        (&json!("kv"), &json!(8))
    );
    assert_eq!(
        (&plugins[1]["name"], &plugins[1]["first_group"]),
        (&json!("counter"), &json!(10))
    );
    assert_eq!(plugins[0]["module"]["sha256"].as_str().unwrap().len(), 64);
    assert_eq!(plugins[0]["module"]["name"], "kv");

    // A raw command: the bytes in, the result's bytes out.
    let (status, body) = raw_post(
        &address,
        "/v1/plugins/kv/commands?key=user/1",
        &kv_put("user/1", "Ada"),
    );
    assert_eq!((status, body.as_slice()), (200, &b""[..]));
    for consistency in ["linearizable", "lease", "stale"] {
        let path = format!("/v1/plugins/kv/keys/user%2F1?consistency={consistency}");
        assert_eq!(request(&address, "GET", &path, None), (200, "Ada".into()));
    }
    // The same through JSON.
    let (status, answer) = json_command(&address, "kv", "user/1", &kv_get("user/1"));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(decoded(&answer), b"Ada");

    // The plugin's own error: 422 with its code, nothing written.
    let (status, answer) = json_command(&address, "counter", "c", &5i64.to_le_bytes());
    assert_eq!(
        (status, decoded(&answer)),
        (200, 5i64.to_le_bytes().to_vec())
    );
    let (status, answer) = json_command(&address, "counter", "c", b"xy");
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["type"], "urn:concord:problem:command-failed");
    assert_eq!(answer["code"], 1);

    // A batch: one result per command, each as it would have been alone.
    let batch = json!({"commands": [
        {"key": "c", "command_base64": STANDARD.encode(2i64.to_le_bytes())},
        {"key_base64": STANDARD.encode(b"\xff\x00"), "command_base64": ""},
        {"key": "c", "command_base64": "not base64!"},
        {"key": "c", "command_base64": STANDARD.encode(3i64.to_le_bytes())},
        {"key": "c", "command_base64": STANDARD.encode(b"xy")},
        {"key": "c", "command_base64": STANDARD.encode(1i64.to_le_bytes())},
    ]})
    .to_string();
    let (status, answer) = request(
        &address,
        "POST",
        "/v1/plugins/counter/commands/batch",
        Some(&batch),
    );
    assert_eq!(status, 200, "{answer}");
    let results: Value = serde_json::from_str(&answer).unwrap();
    let statuses: Vec<u64> = results["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [200, 200, 400, 200, 422, 200]);
    assert_eq!(
        results["results"][2]["problem"]["field"], "command_base64",
        "{answer}"
    );
    // The commands of one group applied in the batch's order (the counter is the group's, and
    // both keys route to one group): 5 + 2, + 1 (an empty command), + 3, + 1.
    let totals: Vec<Vec<u8>> = [0, 1, 3, 5]
        .iter()
        .map(|&i| decoded(&results["results"][i]))
        .collect();
    assert_eq!(
        totals,
        [7i64, 8, 11, 12].map(|total| total.to_le_bytes().to_vec()),
        "{answer}"
    );

    // What is refused, and how.
    let refusals = [
        ("GET", "/v1/plugins/nope/keys/x", None, 404, "not-found"),
        ("GET", "/v1/plugins/kv/keys/absent", None, 404, "not-found"),
        (
            "GET",
            "/v1/plugins/kv/keys/x?consistency=eventual",
            None,
            400,
            "invalid-field",
        ),
        (
            "POST",
            "/v1/plugins/kv/commands",
            Some(r#"{"command_base64": ""}"#.to_string()),
            400,
            "invalid-field",
        ),
        (
            "POST",
            "/v1/plugins/kv/commands",
            Some(json!({"key": "k".repeat(16 * 1024 + 1), "command_base64": ""}).to_string()),
            400,
            "invalid-field",
        ),
        (
            "POST",
            "/v1/plugins/kv/commands",
            Some(r#"{"key": "k", "command_base64": "", "extra": 1}"#.to_string()),
            400,
            "invalid-body",
        ),
    ];
    for (method, path, body, expected, kind) in refusals {
        let (status, answer) = request(&address, method, path, body.as_deref());
        assert_eq!(status, expected, "{method} {path}: {answer}");
        assert!(
            answer.contains(&format!("urn:concord:problem:{kind}")),
            "{answer}"
        );
    }
    let (status, _) = raw_post(&address, "/v1/plugins/kv/commands", b"\x03\x01\x00k");
    assert_eq!(status, 400, "a raw command without ?key=");
    let (status, answer) = post(
        &address,
        "/v1/plugins/kv/commands?key=k",
        "text/plain",
        b"x",
    );
    assert_eq!(status, 415);
    assert!(
        String::from_utf8_lossy(&answer).contains("application/octet-stream"),
        "{answer:?}"
    );

    // The sessions are where they were.
    let (status, answer) = request(
        &address,
        "POST",
        "/v1/sessions",
        Some(r#"{"client_id": "dev/1", "broker_id": "b"}"#),
    );
    assert_eq!(status, 201, "{answer}");
    server.stop();

    // A restart with the same plugins finds their data.
    let server = Server::start(dir.path(), &flags);
    assert_eq!(
        server.request("GET", "/v1/plugins/kv/keys/user%2F1", None),
        (200, "Ada".into())
    );
    server.stop();

    // Reordered, the keys would route to other groups: refused, naming both layouts.
    let refused = Command::new(env!("CARGO_BIN_EXE_concord"))
        .arg("serve")
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--http-addr", "127.0.0.1:0", "--log-level", "warn"])
        .args(["--plugin", &format!("counter={counter}")])
        .args(["--plugin", &format!("kv={kv}"), "--plugin-groups", "2"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("a plugin may only be added after the others")
            && stderr.contains("kv (2 groups), counter (2 groups)"),
        "{stderr}"
    );
}

#[test]
fn every_member_of_a_cluster_answers_for_a_served_plugin() {
    let ports = free_ports(3);
    let members = initial_cluster(&ports);
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let kv = format!("kv={}", fixture("kv.wasm").display());
    let flags = ["--plugin", kv.as_str(), "--plugin-groups", "2"];
    let children: Vec<_> = (0..3)
        .map(|i| spawn_member_with(dirs[i].path(), &members, i as u64 + 1, &flags))
        .collect();
    let servers: Vec<Server> = children.into_iter().map(Server::listening).collect();
    let addresses: Vec<&str> = servers.iter().map(|s| s.address.as_str()).collect();

    // Each member takes writes for keys whichever member leads their group.
    for (n, address) in addresses.iter().enumerate() {
        for k in 0..10 {
            let key = format!("k{n}-{k}");
            let body = json!({"key": key, "command_base64": STANDARD.encode(kv_put(&key, "v"))})
                .to_string();
            let (status, answer) =
                retrying(address, "POST", "/v1/plugins/kv/commands", Some(&body));
            assert_eq!(status, 200, "{answer}");
        }
    }
    // Every member reads every write, linearizably.
    for address in &addresses {
        for n in 0..3 {
            for k in 0..10 {
                let path = format!("/v1/plugins/kv/keys/k{n}-{k}");
                assert_eq!(retrying(address, "GET", &path, None), (200, "v".into()));
            }
        }
    }
    // The plugin's groups (4 and 5, after the 4 session groups) converge like the others.
    common::wait_converged(&addresses, 6, Duration::from_secs(20));
    for server in servers {
        server.stop();
    }
}
