//! A disk that fails under the real `concord` binary. `benches/scripts/faulty_disk.c`, built
//! with the C compiler the Rust toolchain links with and loaded with `LD_PRELOAD`, answers EIO
//! to the node's syncs or reads on the files of its data directory. A node whose sync failed
//! must stop by itself with exit status 1 and the error named, acknowledge no write after the
//! failure, and start again on a healthy disk holding every write it acknowledged; a node
//! whose reads fail must refuse to start, the same way; a node asked to stop while its syncs
//! fail must exit with status 1 too, naming the flush that failed. Each backend that keeps
//! files.

mod common;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{Server, exit_within, try_request};

/// The bits of the control file's first byte that `faulty_disk.c` reads.
const FAIL_SYNCS: u8 = 2;
const FAIL_READS: u8 = 4;

/// The library and its control file, for one node.
struct FaultyDisk {
    library: PathBuf,
    control: File,
    control_path: PathBuf,
}

impl FaultyDisk {
    fn build(dir: &Path) -> FaultyDisk {
        let source = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join("benches/scripts/faulty_disk.c");
        let library = dir.join("faulty_disk.so");
        let built = Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&library)
            .arg(&source)
            .arg("-ldl")
            .status()
            .expect("cc runs (the Rust toolchain links with it)");
        assert!(built.success(), "cc failed to build {}", source.display());
        let control_path = dir.join("control");
        let control = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&control_path)
            .unwrap();
        control.write_all_at(&[0; 16], 0).unwrap();
        FaultyDisk {
            library,
            control,
            control_path,
        }
    }

    /// From now on the calls of the kinds in `bits` fail (0: none).
    fn fail(&self, bits: u8) {
        self.control.write_all_at(&[bits], 0).unwrap();
    }

    /// `concord serve` on `data_dir` with the library loaded, its log to `log`.
    fn spawn(&self, data_dir: &Path, backend: &str, log: &Path) -> Child {
        Command::new(env!("CARGO_BIN_EXE_concord"))
            .arg("serve")
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--http-addr", "127.0.0.1:0", "--log-level", "warn"])
            .args(["--backend", backend])
            .env("LD_PRELOAD", &self.library)
            .env("CONCORD_FAULTY_DIR", data_dir)
            .env("CONCORD_FAULTY_CONTROL", &self.control_path)
            .stdout(Stdio::piped())
            .stderr(File::create(log).unwrap())
            .spawn()
            .expect("the concord binary starts")
    }
}

fn create(address: &str, client_id: &str) -> std::io::Result<u16> {
    let body = format!(r#"{{"client_id":"{client_id}","broker_id":"b"}}"#);
    try_request(address, "POST", "/v1/sessions", &[], Some(&body)).map(|(status, _)| status)
}

/// A node's files in a temporary directory, on a disk that fails when told to.
struct FaultyNode {
    _dir: tempfile::TempDir,
    data_dir: PathBuf,
    log: PathBuf,
    disk: FaultyDisk,
    backend: &'static str,
}

impl FaultyNode {
    /// Starts a node on `backend` and has it acknowledge `creates` creates, named
    /// `before-{i}`.
    fn start(backend: &'static str, creates: usize) -> (FaultyNode, Server, Vec<String>) {
        let dir = tempfile::tempdir().unwrap();
        let node = FaultyNode {
            data_dir: dir.path().join("data"),
            log: dir.path().join("concord.log"),
            disk: FaultyDisk::build(dir.path()),
            _dir: dir,
            backend,
        };
        let server = Server::listening(node.spawn());
        let acknowledged: Vec<String> = (0..creates).map(|i| format!("before-{i}")).collect();
        for client_id in &acknowledged {
            assert_eq!(create(&server.address, client_id).unwrap(), 201);
        }
        (node, server, acknowledged)
    }

    fn spawn(&self) -> Child {
        self.disk.spawn(&self.data_dir, self.backend, &self.log)
    }

    /// Heals the disk and starts the node again: it must hold every create it acknowledged.
    fn healthy_again_holds(&self, acknowledged: &[String]) -> Server {
        self.disk.fail(0);
        let server = Server::listening(self.spawn());
        for client_id in acknowledged {
            let (status, _) = server.request("GET", &format!("/v1/sessions/{client_id}"), None);
            assert_eq!(
                status, 200,
                "{client_id} was acknowledged before the failure"
            );
        }
        server
    }
}

/// Waits for a node to stop by itself: exit status 1, the failed I/O named in its log, no
/// panic.
fn stops_naming_the_error(child: &mut Child, log: &Path, when: &str) {
    let status = exit_within(child, Duration::from_secs(30));
    let text = std::fs::read_to_string(log).unwrap();
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(1),
        "{when}: the node must stop by itself with status 1; its log:\n{text}"
    );
    assert!(
        text.contains("Input/output error (os error 5)"),
        "{when}: the log names the failed I/O:\n{text}"
    );
    assert!(!text.contains("panicked"), "{when}: a panic:\n{text}");
}

fn a_failing_disk_stops_the_node_and_loses_nothing_acknowledged(backend: &'static str) {
    let (node, mut server, acknowledged) = FaultyNode::start(backend, 20);

    // Every sync fails from here on: no write may be acknowledged, and the node must stop.
    node.disk.fail(FAIL_SYNCS);
    let mut answers = Vec::new();
    for i in 0..50 {
        match create(&server.address, &format!("after-{i}")) {
            Ok(status) => answers.push(status),
            Err(_) => break, // The node stopped.
        }
    }
    assert!(
        !answers.contains(&201),
        "a create was acknowledged while every sync failed: {answers:?}"
    );
    stops_naming_the_error(&mut server.child, &node.log, "syncs failing");

    // Started while its reads fail, it refuses to start (never listening: killed on drop if
    // it does not stop).
    node.disk.fail(FAIL_READS);
    let mut refused = Server {
        child: node.spawn(),
        address: String::new(),
    };
    stops_naming_the_error(&mut refused.child, &node.log, "reads failing at start");

    // Healthy again: it starts with every acknowledged create.
    let server = node.healthy_again_holds(&acknowledged);
    assert_eq!(create(&server.address, "healed").unwrap(), 201);
    server.stop();
}

#[test]
fn a_failing_disk_stops_a_wal_node_and_loses_nothing_acknowledged() {
    a_failing_disk_stops_the_node_and_loses_nothing_acknowledged("wal");
}

#[test]
fn a_failing_disk_stops_a_redb_node_and_loses_nothing_acknowledged() {
    a_failing_disk_stops_the_node_and_loses_nothing_acknowledged("redb");
}

#[test]
fn a_failing_disk_stops_a_sled_node_and_loses_nothing_acknowledged() {
    a_failing_disk_stops_the_node_and_loses_nothing_acknowledged("sled");
}

/// A node asked to stop while its syncs fail stops with exit status 1 and the failed flush
/// named, so that whatever supervises it sees the stop was not clean, and without a panic
/// (sled's own close unwraps a sync of its file, so the sled stores close their databases
/// themselves first: `sled_backend/database.rs`). Its data then opens on a healthy disk with
/// every create it acknowledged.
fn a_node_stopped_while_its_syncs_fail_exits_naming_the_flush(backend: &'static str) {
    let (node, mut server, acknowledged) = FaultyNode::start(backend, 10);
    node.disk.fail(FAIL_SYNCS);
    let terminated = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(terminated.success());
    let status = exit_within(&mut server.child, Duration::from_secs(30));
    let text = std::fs::read_to_string(&node.log).unwrap();
    assert!(status.is_some(), "the node did not stop; its log:\n{text}");
    assert!(!text.contains("panicked"), "a panic:\n{text}");
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{text}");
    assert!(
        text.contains("the engine stopped, but flushing its"),
        "the failed flush is named:\n{text}"
    );

    node.healthy_again_holds(&acknowledged).stop();
}

#[test]
fn a_wal_node_stopped_while_its_syncs_fail_exits_naming_the_flush() {
    a_node_stopped_while_its_syncs_fail_exits_naming_the_flush("wal");
}

#[test]
fn a_redb_node_stopped_while_its_syncs_fail_exits_naming_the_flush() {
    a_node_stopped_while_its_syncs_fail_exits_naming_the_flush("redb");
}

#[test]
fn a_sled_node_stopped_while_its_syncs_fail_exits_naming_the_flush() {
    a_node_stopped_while_its_syncs_fail_exits_naming_the_flush("sled");
}
