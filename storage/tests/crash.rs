//! Crash tests: a child process writes synced log batches and state commits and reports each
//! acknowledged one on stdout; the parent kills it with SIGKILL at a random point, reopens the
//! data directory and checks that
//!
//! - every acknowledged log batch is there, and the log is exactly the log after the last
//!   acknowledged batch or the one after it (batches are atomic: nothing half-written, no hole);
//! - the state's applied index is at least the last flushed one, and the state is exactly the
//!   state of that applied index.
//!
//! The expected logs and states come from replaying the same deterministic schedule into the
//! memory backend. The default run kills a handful of times per backend; set
//! `CONCORD_CRASH_ITERATIONS=200` for many more, and `CONCORD_CRASH_SEED` to replay a run.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use concord_storage::raft::prelude::HardState;
use concord_storage::testing::make_entries;
use concord_storage::{
    BackendKind, KeyRange, LogBatch, LogStore, MemLogStore, MemStateStore, StateStore, StoreConfig,
    Stores, WriteSet,
};
use rand::{Rng, SeedableRng};

const CHILD_BACKEND_ENV: &str = "CONCORD_CRASH_CHILD_BACKEND";
const CHILD_DIR_ENV: &str = "CONCORD_CRASH_CHILD_DIR";
const GROUPS: u64 = 4;
const STATE_GROUP: u64 = 0;
/// The state is flushed (and acknowledged) every this many commits.
const FLUSH_EVERY: u64 = 4;
/// The child stops by itself after this many batches if nobody kills it.
const MAX_BATCHES: u64 = 100_000;

/// The deterministic workload both the child and the parent's model follow.
struct Schedule {
    batch_number: u64,
    last_index: [u64; GROUPS as usize],
    term: [u64; GROUPS as usize],
}

impl Schedule {
    fn new() -> Self {
        Schedule {
            batch_number: 0,
            last_index: [0; GROUPS as usize],
            term: [1; GROUPS as usize],
        }
    }

    /// The next log batch (appends in every group, sometimes a replaced suffix or a
    /// compaction) and the state writes applied with it.
    fn next(&mut self) -> (u64, LogBatch, WriteSet) {
        self.batch_number += 1;
        let n = self.batch_number;
        let mut batch = LogBatch::new();
        for group in 0..GROUPS {
            let g = group as usize;
            let count = 1 + (n * 7 + group) % 5;
            let mut first = self.last_index[g] + 1;
            if n % 13 == group && self.last_index[g] > 30 {
                // A new leader overwrites the last two entries with a higher term.
                self.term[g] += 1;
                first -= 2;
            }
            let last = first + count - 1;
            batch.append(group, make_entries(group, first..=last, self.term[g]));
            self.last_index[g] = last;
            let mut hard_state = HardState::default();
            hard_state.term = self.term[g];
            hard_state.commit = last.saturating_sub(3);
            batch.set_hard_state(group, hard_state);
            if n.is_multiple_of(10) && last > 40 {
                batch.compact(group, last - 20);
            }
        }
        let mut writes = WriteSet::new();
        writes
            .put(format!("k{n:08}").as_bytes(), &n.to_le_bytes())
            .unwrap();
        if n > 5 {
            writes.delete(format!("k{:08}", n - 5).as_bytes()).unwrap();
        }
        (n, batch, writes)
    }
}

/// The child process: writes until killed (or `MAX_BATCHES`), acknowledging on stdout.
#[test]
#[ignore = "entry point of the crash tests' child process, started by the crash tests"]
fn crash_writer_child() {
    let backend: BackendKind = std::env::var(CHILD_BACKEND_ENV).unwrap().parse().unwrap();
    let dir = std::env::var(CHILD_DIR_ENV).unwrap();
    let stores = Stores::open(&StoreConfig::new(backend, &dir)).unwrap();
    let mut schedule = Schedule::new();
    for _ in 0..MAX_BATCHES {
        let (n, batch, writes) = schedule.next();
        stores.log.write(batch).unwrap();
        println!("LOG {n}");
        stores.state.commit(STATE_GROUP, writes, n).unwrap();
        if n.is_multiple_of(FLUSH_EVERY) {
            stores.state.flush().unwrap();
            println!("STATE {n}");
        }
    }
}

/// What the child acknowledged before it died.
#[derive(Debug, Default)]
struct Acknowledged {
    log: u64,
    state: u64,
}

/// Starts the child on `dir`, kills it after it acknowledged `kill_after` log batches plus
/// `delay_us` microseconds, and returns everything it acknowledged.
fn run_and_kill(backend: BackendKind, dir: &Path, kill_after: u64, delay_us: u64) -> Acknowledged {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["crash_writer_child", "--exact", "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(CHILD_BACKEND_ENV, backend.name())
        .env(CHILD_DIR_ENV, dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (lines_tx, lines) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut acked = Acknowledged::default();
    let record = |line: &str, acked: &mut Acknowledged| {
        if let Some(n) = line.strip_prefix("LOG ") {
            acked.log = n.parse().unwrap();
        } else if let Some(n) = line.strip_prefix("STATE ") {
            acked.state = n.parse().unwrap();
        }
    };
    while acked.log < kill_after {
        match lines.recv_timeout(Duration::from_secs(30)) {
            Ok(line) => record(&line, &mut acked),
            Err(_) => panic!("the child stopped acknowledging (at {acked:?})"),
        }
    }
    std::thread::sleep(Duration::from_micros(delay_us));
    child.kill().unwrap(); // SIGKILL on Unix.
    child.wait().unwrap();
    reader.join().unwrap();
    // Lines printed before the kill were acknowledged too.
    while let Ok(line) = lines.try_recv() {
        record(&line, &mut acked);
    }
    acked
}

/// Replays the schedule into the memory backend: the logs after each of the first `batches`
/// batches, and the state after `applied` commits.
fn model_log(batches: u64) -> MemLogStore {
    let log = MemLogStore::new();
    let mut schedule = Schedule::new();
    for _ in 0..batches {
        log.write(schedule.next().1).unwrap();
    }
    log
}

fn model_state(applied: u64) -> MemStateStore {
    let state = MemStateStore::new();
    let mut schedule = Schedule::new();
    for _ in 0..applied {
        let (n, _, writes) = schedule.next();
        state.commit(STATE_GROUP, writes, n).unwrap();
    }
    state
}

fn same_log(found: &dyn LogStore, model: &dyn LogStore) -> Result<(), String> {
    for group in 0..GROUPS {
        let expected = model.group_state(group).unwrap();
        let actual = found.group_state(group).map_err(|e| e.to_string())?;
        if actual != expected {
            return Err(format!(
                "group {group}: metadata {actual:?}, expected {expected:?}"
            ));
        }
        let (low, high) = (expected.first_index(), expected.last_index + 1);
        let entries = found
            .entries(group, low, high, None)
            .map_err(|e| e.to_string())?;
        if entries != model.entries(group, low, high, None).unwrap() {
            return Err(format!("group {group}: entries differ"));
        }
        if found
            .term(group, expected.truncated_index)
            .map_err(|e| e.to_string())?
            != expected.truncated_term
        {
            return Err(format!("group {group}: truncated term differs"));
        }
    }
    Ok(())
}

fn check_recovery(backend: BackendKind, dir: &Path, acked: &Acknowledged) {
    let stores = Stores::open(&StoreConfig::new(backend, dir))
        .unwrap_or_else(|e| panic!("reopen after the crash failed: {e}"));
    // Batches are atomic: the log is the one after the last acknowledged batch, or after the
    // batch that was in flight when the child died.
    let after_acked = same_log(stores.log.as_ref(), &model_log(acked.log));
    let after_next = same_log(stores.log.as_ref(), &model_log(acked.log + 1));
    if let (Err(acked_diff), Err(next_diff)) = (&after_acked, &after_next) {
        panic!(
            "{backend}: the log after the crash is neither the acknowledged one ({acked_diff}) \
             nor the next ({next_diff}); acknowledged {acked:?}"
        );
    }
    let applied = stores.state.applied_index(STATE_GROUP).unwrap();
    assert!(
        applied >= acked.state,
        "{backend}: applied index {applied} is below the flushed {}",
        acked.state
    );
    assert!(
        applied <= acked.log + 1,
        "{backend}: applied {applied} was never written"
    );
    let found = stores
        .state
        .scan(STATE_GROUP, &KeyRange::all(), usize::MAX)
        .unwrap();
    let expected = model_state(applied)
        .scan(STATE_GROUP, &KeyRange::all(), usize::MAX)
        .unwrap();
    assert_eq!(
        found, expected,
        "{backend}: the state is not the state of index {applied}"
    );
}

fn crash_iterations(backend: BackendKind, default_iterations: u64) {
    let iterations = std::env::var("CONCORD_CRASH_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_iterations);
    let seed = std::env::var("CONCORD_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| rand::rng().random::<u64>());
    eprintln!("{backend} crash test: {iterations} kills, CONCORD_CRASH_SEED={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for iteration in 0..iterations {
        let dir = tempfile::tempdir().unwrap();
        let kill_after = rng.random_range(1..600);
        let delay_us = rng.random_range(0..3000);
        let acked = run_and_kill(backend, dir.path(), kill_after, delay_us);
        eprintln!("  kill {iteration}: after {acked:?}");
        check_recovery(backend, dir.path(), &acked);
    }
}

#[test]
fn redb_keeps_every_acknowledged_write_across_sigkill() {
    crash_iterations(BackendKind::Redb, 4);
}

#[test]
fn wal_keeps_every_acknowledged_write_across_sigkill() {
    crash_iterations(BackendKind::Wal, 4);
}

#[test]
fn sled_keeps_every_acknowledged_write_across_sigkill() {
    crash_iterations(BackendKind::Sled, 4);
}
