//! `concord backup` and `concord restore` with the real binary: a backup taken through a
//! follower of a cluster of three processes holds every acknowledged write (written over what a
//! killed run left behind, never beside a run still going); once the cluster lost its majority,
//! the member left gives a backup without a quorum, a node made from it serves every write, and
//! a member added to it takes them over by snapshots.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{
    Server, concord_command, free_ports, initial_cluster, request, retrying, spawn_member,
    spawn_member_with, wait_converged,
};

/// `concord restore --input BACKUP --data-dir DIR`: its exit success and its output.
fn restore(backup: &Path, data_dir: &Path) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_concord"))
        .arg("restore")
        .arg("--input")
        .arg(backup)
        .arg("--data-dir")
        .arg(data_dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.success(), text)
}

#[test]
fn a_cluster_that_lost_its_majority_comes_back_from_the_backup_of_the_member_left() {
    let ports = free_ports(3);
    let members = initial_cluster(&ports);
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let children: Vec<_> = (0..3)
        .map(|i| spawn_member(dirs[i].path(), &members, i as u64 + 1))
        .collect();
    let servers: Vec<Server> = children.into_iter().map(Server::listening).collect();
    for n in 0..40 {
        let body = format!(r#"{{"client_id": "dev/{n}", "broker_id": "b"}}"#);
        let (status, answer) = retrying(&servers[0].address, "POST", "/v1/sessions", Some(&body));
        assert_eq!(status, 201, "{answer}");
    }
    let patch = Some(r#"{"connection_id": 700}"#);
    let (status, answer) = retrying(&servers[0].address, "PATCH", "/v1/sessions/dev%2F7", patch);
    assert_eq!(status, 200, "{answer}");

    // Through node 3, linearizable (the default): every write acknowledged above is in it,
    // whether node 3 leads its group or not.
    // A `.partial` file locked by a run still going is refused; one left by a run killed
    // midway (nothing holds its lock) is taken over.
    let work = tempfile::tempdir().unwrap();
    let backup = work.path().join("cluster.backup");
    let partial = work.path().join("cluster.backup.partial");
    let output = ["--output", backup.to_str().unwrap()];
    let running = std::fs::File::create(&partial).unwrap();
    running.lock().unwrap();
    let (ok, out) = concord_command("backup", &servers[2].address, &output);
    assert!(!ok && out.contains("another `concord backup`"), "{out}");
    drop(running);
    std::fs::write(&partial, vec![0xab; 100_000]).unwrap();
    let (ok, out) = concord_command("backup", &servers[2].address, &output);
    assert!(ok && out.contains("4 groups"), "{out}");
    assert!(!partial.exists());
    let (ok, out) = concord_command("backup", &servers[2].address, &output);
    assert!(!ok && out.contains("exists"), "{out}");

    // The cluster loses its majority for good: members 1 and 2 killed, their data gone. The
    // member left gives what it has applied (it had applied every write: its linearizable
    // backup above held them), needing no quorum.
    let mut servers = servers;
    let survivor = servers.pop().unwrap();
    drop(servers);
    let stale_backup = work.path().join("survivor.backup");
    let stale = [
        "--output",
        stale_backup.to_str().unwrap(),
        "--consistency",
        "stale",
    ];
    let (ok, out) = concord_command("backup", &survivor.address, &stale);
    assert!(ok && out.contains("4 groups"), "{out}");
    drop(survivor);
    drop(dirs);

    // A damaged copy is named and leaves no directory behind.
    let mut damaged = std::fs::read(&backup).unwrap();
    let middle = damaged.len() / 2;
    damaged[middle] ^= 0x01;
    let damaged_backup = work.path().join("damaged.backup");
    std::fs::write(&damaged_backup, &damaged).unwrap();
    let refused_dir = work.path().join("refused");
    let (ok, out) = restore(&damaged_backup, &refused_dir);
    assert!(!ok && out.contains("backup:"), "{out}");
    assert!(!refused_dir.exists());

    // Restored, it serves as the first member of a new cluster, with every session.
    let restored = work.path().join("restored");
    let (ok, out) = restore(&stale_backup, &restored);
    assert!(ok && out.contains("--groups 4"), "{out}");
    let new_ports = free_ports(2);
    let first = Server::listening(spawn_member(
        &restored,
        &initial_cluster(&new_ports[..1]),
        1,
    ));
    for n in 0..40 {
        let (status, answer) = retrying(
            &first.address,
            "GET",
            &format!("/v1/sessions/dev%2F{n}"),
            None,
        );
        assert_eq!(status, 200, "{answer}");
    }
    let (_, answer) = request(&first.address, "GET", "/v1/sessions/dev%2F7", None);
    assert!(answer.contains(r#""connection_id":700"#), "{answer}");
    assert!(answer.contains(r#""version":2"#), "{answer}");
    let body = r#"{"client_id": "after-restore"}"#;
    let (status, answer) = retrying(&first.address, "POST", "/v1/sessions", Some(body));
    assert_eq!(status, 201, "{answer}");

    // A member added to it takes every group's state by snapshot.
    let second_dir = work.path().join("second");
    let second = Server::listening(spawn_member_with(
        &second_dir,
        &initial_cluster(&new_ports),
        2,
        &["--initial-cluster-state", "existing"],
    ));
    let raft_addr = format!("127.0.0.1:{}", new_ports[1]);
    let (ok, out) = concord_command("member", &first.address, &["add", "2", &raft_addr]);
    assert!(ok, "{out}");
    wait_converged(
        &[&first.address, &second.address],
        4,
        Duration::from_secs(20),
    );
    let (status, answer) = request(
        &second.address,
        "GET",
        "/v1/sessions/dev%2F13?consistency=stale",
        None,
    );
    assert_eq!(status, 200, "{answer}");
}
