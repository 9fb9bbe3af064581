//! The write-back state store: reads always see every commit, whether it is held in memory,
//! being written beneath, or beneath; a flush does not stop commits; a failed flush refuses
//! writes but loses nothing from reads.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};

use concord_storage::testing::{HookedState, SeededRng, StateCall};
use concord_storage::{
    DEFAULT_PENDING_LIMIT_BYTES, GroupCommit, GroupId, KeyRange, KeyValue, MemStateStore,
    StateSnapshot, StateStore, StorageError, WriteBackStateStore, WriteSet,
};
use parking_lot::Mutex;

const GROUPS: u64 = 3;
const KEYS: u64 = 40;

fn key(n: u64) -> Vec<u8> {
    format!("key-{n:03}").into_bytes()
}

/// A random commit of `group`: a few puts and deletes over a small key space, so that writes
/// replace and delete keys held in memory and keys beneath alike.
fn random_commit(rng: &mut SeededRng, group: GroupId, applied_index: u64) -> GroupCommit {
    let mut writes = WriteSet::new();
    for _ in 0..1 + rng.below(6) {
        let k = key(rng.below(KEYS));
        if rng.below(4) == 0 {
            writes.delete(&k).unwrap();
        } else {
            let value =
                format!("v{applied_index}-{}", rng.below(1000)).repeat(1 + rng.below(20) as usize);
            writes.put(&k, value.as_bytes()).unwrap();
        }
    }
    GroupCommit {
        group,
        writes,
        applied_index,
    }
}

fn random_range(rng: &mut SeededRng) -> KeyRange {
    let a = rng.below(KEYS + 2);
    let b = rng.below(KEYS + 2);
    match rng.below(4) {
        0 => KeyRange::all(),
        1 => KeyRange::from(&key(a)),
        _ => KeyRange::between(&key(a.min(b)), &key(a.max(b))),
    }
}

fn snapshot_pairs(snapshot: StateSnapshot<'_>) -> (u64, Vec<KeyValue>) {
    let index = snapshot.applied_index;
    (index, snapshot.records.map(Result::unwrap).collect())
}

/// Everything a reader can see of `store`, compared with the model.
fn assert_same(store: &dyn StateStore, model: &MemStateStore, rng: &mut SeededRng, step: u64) {
    for group in 0..GROUPS {
        assert_eq!(
            store.applied_index(group).unwrap(),
            model.applied_index(group).unwrap(),
            "step {step}: applied index of group {group}"
        );
        for n in 0..KEYS {
            assert_eq!(
                store.get(group, &key(n)).unwrap(),
                model.get(group, &key(n)).unwrap(),
                "step {step}: group {group} key {n}"
            );
        }
        for _ in 0..3 {
            let range = random_range(rng);
            let limit = 1 + rng.below(KEYS) as usize;
            assert_eq!(
                store.scan(group, &range, limit).unwrap(),
                model.scan(group, &range, limit).unwrap(),
                "step {step}: scan of group {group} {range:?} limit {limit}"
            );
        }
        assert_eq!(
            snapshot_pairs(store.snapshot(group).unwrap()),
            snapshot_pairs(model.snapshot(group).unwrap()),
            "step {step}: snapshot of group {group}"
        );
    }
}

#[test]
fn reads_match_a_plain_store_through_commits_flushes_and_restores() {
    let seed = std::env::var("CONCORD_WRITE_BACK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_0001);
    println!("CONCORD_WRITE_BACK_SEED={seed}");
    let mut rng = SeededRng::new(seed);
    // A small pending limit: some commits flush within themselves.
    let store = WriteBackStateStore::with_pending_limit(MemStateStore::new(), 4 * 1024);
    let model = MemStateStore::new();
    let mut applied = [0u64; GROUPS as usize];
    for step in 0..400 {
        match rng.below(20) {
            0..=14 => {
                let groups: Vec<u64> = (0..GROUPS).filter(|_| rng.below(2) == 0).collect();
                let commits: Vec<GroupCommit> = groups
                    .iter()
                    .map(|&g| {
                        applied[g as usize] += 1 + rng.below(3);
                        random_commit(&mut rng, g, applied[g as usize])
                    })
                    .collect();
                store.commit_groups(commits.clone()).unwrap();
                model.commit_groups(commits).unwrap();
            }
            15..=17 => {
                store.flush().unwrap();
                // Beneath now holds everything.
                assert_same(store.base(), &model, &mut rng, step);
            }
            _ => {
                let group = rng.below(GROUPS);
                applied[group as usize] += 1;
                let records: Vec<KeyValue> = (0..rng.below(8))
                    .map(|n| (key(n * 5), format!("restored {step}").into_bytes()))
                    .collect();
                let index = applied[group as usize];
                store
                    .restore(group, index, &mut records.clone().into_iter().map(Ok))
                    .unwrap();
                model
                    .restore(group, index, &mut records.into_iter().map(Ok))
                    .unwrap();
            }
        }
        assert_same(&store, &model, &mut rng, step);
    }
    // An applied index that does not advance is refused, and nothing of the commit lands.
    let stale = random_commit(&mut rng, 0, applied[0]);
    assert!(matches!(
        store.commit_groups(vec![stale]),
        Err(StorageError::InvalidRequest { .. })
    ));
    assert_same(&store, &model, &mut rng, u64::MAX);
}

/// What a test does to the disk beneath a write-back store: hold its next commit at a gate,
/// or fail its commits.
#[derive(Default)]
struct Disk {
    /// While set, the next commit reports arriving and waits to be let go.
    gate: Mutex<Option<(Sender<()>, Receiver<()>)>>,
    fail: AtomicBool,
}

/// A write-back store over a store in memory whose commits go through `disk`.
fn write_back_over(
    disk: &Arc<Disk>,
    pending_limit_bytes: usize,
) -> WriteBackStateStore<HookedState> {
    let disk = Arc::clone(disk);
    let beneath = HookedState::new(Box::new(move |call| {
        if call != StateCall::Commit {
            return Ok(());
        }
        if let Some((arrived, go)) = disk.gate.lock().take() {
            arrived.send(()).unwrap();
            go.recv().unwrap();
        }
        if disk.fail.load(Ordering::SeqCst) {
            return Err(StorageError::Io {
                path: "state".into(),
                source: std::io::Error::other("the test's disk is full"),
            });
        }
        Ok(())
    }));
    WriteBackStateStore::with_pending_limit(beneath, pending_limit_bytes)
}

/// Starts a flush of `store` on a thread of its own and returns once its commit beneath waits
/// at `disk`'s gate: the sender that lets it go on, and the flush's thread.
fn flush_held_at_the_gate<S: StateStore + 'static>(
    disk: &Disk,
    store: &Arc<S>,
) -> (
    Sender<()>,
    std::thread::JoinHandle<Result<(), StorageError>>,
) {
    let (arrived_tx, arrived) = channel();
    let (go, go_rx) = channel();
    *disk.gate.lock() = Some((arrived_tx, go_rx));
    let flushing = {
        let store = Arc::clone(store);
        std::thread::spawn(move || store.flush())
    };
    arrived.recv().unwrap();
    (go, flushing)
}

fn put(store: &dyn StateStore, group: GroupId, key: &[u8], value: &[u8], index: u64) {
    let mut writes = WriteSet::new();
    writes.put(key, value).unwrap();
    store.commit(group, writes, index).unwrap();
}

#[test]
fn commits_and_reads_go_on_while_a_flush_writes_beneath() {
    let disk = Arc::new(Disk::default());
    let store = Arc::new(write_back_over(&disk, DEFAULT_PENDING_LIMIT_BYTES));
    put(store.as_ref(), 1, b"a", b"first", 1);
    put(store.as_ref(), 1, b"c", b"frozen", 2);
    put(store.as_ref(), 1, b"d", b"deleted later", 3);
    // Once this returns, the flush holds `a = first` on its way beneath.
    let (go, flushing) = flush_held_at_the_gate(&disk, &store);

    // Commits land and are read while the flush waits on the disk.
    put(store.as_ref(), 1, b"a", b"second", 4);
    let mut writes = WriteSet::new();
    writes.put(b"b", b"new").unwrap();
    writes.delete(b"d").unwrap();
    store.commit(1, writes, 5).unwrap();
    assert_eq!(store.get(1, b"a").unwrap().as_deref(), Some(&b"second"[..]));
    assert_eq!(store.get(1, b"c").unwrap().as_deref(), Some(&b"frozen"[..]));
    assert_eq!(store.get(1, b"d").unwrap(), None);
    let expected = vec![
        (b"a".to_vec(), b"second".to_vec()),
        (b"b".to_vec(), b"new".to_vec()),
        (b"c".to_vec(), b"frozen".to_vec()),
    ];
    assert_eq!(store.scan(1, &KeyRange::all(), 10).unwrap(), expected);
    assert_eq!(snapshot_pairs(store.snapshot(1).unwrap()), (5, expected));
    assert_eq!(store.applied_index(1).unwrap(), 5);
    assert_eq!(store.base().get(1, b"a").unwrap(), None);

    go.send(()).unwrap();
    flushing.join().unwrap().unwrap();
    // Beneath holds what was frozen, not what came after; reads still see the newest.
    let beneath = |key: &[u8]| store.base().get(1, key).unwrap();
    assert_eq!(beneath(b"a").as_deref(), Some(&b"first"[..]));
    assert_eq!(beneath(b"d").as_deref(), Some(&b"deleted later"[..]));
    assert_eq!(store.base().applied_index(1).unwrap(), 3);
    assert_eq!(store.get(1, b"a").unwrap().as_deref(), Some(&b"second"[..]));
    assert_eq!(store.get(1, b"d").unwrap(), None);
    store.flush().unwrap();
    assert_eq!(beneath(b"b").as_deref(), Some(&b"new"[..]));
    assert_eq!(beneath(b"d"), None);
    assert_eq!(store.base().applied_index(1).unwrap(), 5);
}

/// Scans for every page size while a flush holds one layer on its way beneath and another
/// takes commits: the newer layer's deletes hide the older's puts, its puts replace them, and
/// a page still holds as many pairs as asked.
#[test]
fn scans_across_both_layers_match_a_plain_store_at_every_page_size() {
    let mut rng = SeededRng::new(0x5eed_0002);
    for round in 0..20 {
        let disk = Arc::new(Disk::default());
        let store = Arc::new(write_back_over(&disk, DEFAULT_PENDING_LIMIT_BYTES));
        let model = MemStateStore::new();
        let mut applied = 0;
        let mut commit_both = |rng: &mut SeededRng, store: &dyn StateStore| {
            for _ in 0..5 + rng.below(20) {
                applied += 1;
                let commit = random_commit(rng, 0, applied);
                store.commit_groups(vec![commit.clone()]).unwrap();
                model.commit_groups(vec![commit]).unwrap();
            }
        };
        commit_both(&mut rng, store.as_ref());
        let (go, flushing) = flush_held_at_the_gate(&disk, &store);
        commit_both(&mut rng, store.as_ref());
        for limit in 1..=KEYS as usize + 1 {
            let range = random_range(&mut rng);
            for range in [KeyRange::all(), range] {
                assert_eq!(
                    store.scan(0, &range, limit).unwrap(),
                    model.scan(0, &range, limit).unwrap(),
                    "round {round}: scan {range:?} limit {limit}"
                );
            }
        }
        go.send(()).unwrap();
        flushing.join().unwrap().unwrap();
    }
}

#[test]
fn a_failed_flush_refuses_writes_and_keeps_every_commit_readable() {
    let disk = Arc::new(Disk::default());
    let store = write_back_over(&disk, DEFAULT_PENDING_LIMIT_BYTES);
    put(&store, 1, b"a", b"kept", 1);
    disk.fail.store(true, Ordering::SeqCst);
    assert!(store.flush().is_err());
    assert_eq!(store.get(1, b"a").unwrap().as_deref(), Some(&b"kept"[..]));
    assert_eq!(store.applied_index(1).unwrap(), 1);

    let mut writes = WriteSet::new();
    writes.put(b"b", b"refused").unwrap();
    let refused = store.commit(1, writes, 2);
    assert!(
        matches!(refused, Err(StorageError::FlushFailed { ref detail }) if detail.contains("disk is full")),
        "{refused:?}"
    );
    assert!(matches!(
        store.flush(),
        Err(StorageError::FlushFailed { .. })
    ));
    assert_eq!(store.get(1, b"b").unwrap(), None);
}

#[test]
fn a_commit_over_the_pending_limit_flushes_before_it_returns() {
    let store = WriteBackStateStore::with_pending_limit(MemStateStore::new(), 1024);
    put(&store, 1, b"small", b"x", 1);
    assert_eq!(store.base().applied_index(1).unwrap(), 0);
    put(&store, 1, b"large", &[7u8; 2048], 2);
    assert_eq!(store.base().applied_index(1).unwrap(), 2);
    assert_eq!(
        store.base().get(1, b"small").unwrap().as_deref(),
        Some(&b"x"[..])
    );
}

#[test]
fn a_commit_whose_own_flush_fails_lands_and_the_next_write_is_refused() {
    let disk = Arc::new(Disk::default());
    let store = write_back_over(&disk, 1024);
    disk.fail.store(true, Ordering::SeqCst);
    // Over the limit: the commit flushes within itself, and that flush fails.
    put(&store, 1, b"large", &[7u8; 2048], 1);
    assert_eq!(store.get(1, b"large").unwrap().map(|v| v.len()), Some(2048));
    let mut writes = WriteSet::new();
    writes.put(b"next", b"refused").unwrap();
    assert!(matches!(
        store.commit(1, writes, 2),
        Err(StorageError::FlushFailed { .. })
    ));
}

/// Once a flush has written a group, a read of a key the group never had does not search the
/// store beneath (the key filter answers); every key it has, including one committed while
/// that flush was writing and written beneath by the next, is still found.
#[test]
fn a_key_never_written_is_answered_without_reading_beneath() {
    let reads_beneath = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let disk = Arc::new(Disk::default());
    let store = {
        let disk = Arc::clone(&disk);
        let reads = Arc::clone(&reads_beneath);
        let beneath = HookedState::new(Box::new(move |call| {
            if call == StateCall::Read {
                reads.fetch_add(1, Ordering::SeqCst);
            }
            if call == StateCall::Commit
                && let Some((arrived, go)) = disk.gate.lock().take()
            {
                arrived.send(()).unwrap();
                go.recv().unwrap();
            }
            Ok(())
        }));
        Arc::new(WriteBackStateStore::new(beneath))
    };
    for n in 0..50 {
        put(store.as_ref(), 1, &key(n), b"value", n + 1);
    }
    let (go, flushing) = flush_held_at_the_gate(&disk, &store);
    // Committed while the flush writes: in no layer the flush wrote, in the new one.
    put(store.as_ref(), 1, b"during the flush", b"value", 51);
    go.send(()).unwrap();
    flushing.join().unwrap().unwrap();
    store.flush().unwrap(); // Now beneath too, and in no layer.

    let before = reads_beneath.load(Ordering::SeqCst);
    let absent = (1000..1200).filter(|&n| store.get(1, &key(n)).unwrap().is_none());
    assert_eq!(absent.count(), 200);
    let searched = reads_beneath.load(Ordering::SeqCst) - before;
    // The filter is sized for about one absent key in a hundred to be searched all the same.
    assert!(searched <= 20, "{searched} of 200 absent keys read beneath");
    for n in 0..50 {
        assert_eq!(
            store.get(1, &key(n)).unwrap().as_deref(),
            Some(&b"value"[..])
        );
    }
    assert_eq!(
        store.get(1, b"during the flush").unwrap().as_deref(),
        Some(&b"value"[..])
    );
}

/// A write-back store over a store in memory, with counts of the walks of a group's keys and
/// of the reads beneath it: `(store, walks, reads)`.
fn counting_store() -> (
    WriteBackStateStore<HookedState>,
    Arc<AtomicUsize>,
    Arc<AtomicUsize>,
) {
    let key_walks = Arc::new(AtomicUsize::new(0));
    let reads_beneath = Arc::new(AtomicUsize::new(0));
    let (walks, reads) = (Arc::clone(&key_walks), Arc::clone(&reads_beneath));
    let store = WriteBackStateStore::new(HookedState::new(Box::new(move |call| {
        match call {
            StateCall::Keys => walks.fetch_add(1, Ordering::SeqCst),
            StateCall::Read => reads.fetch_add(1, Ordering::SeqCst),
            StateCall::Commit | StateCall::Flush | StateCall::Restore { .. } => 0,
        };
        Ok(())
    })));
    (store, key_walks, reads_beneath)
}

/// A group whose keys grow many times over is not read back from the store beneath at every
/// doubling: its key filter grows by layers, and only once those are full is it built again
/// from the keys there are. Every key stays found, and a key never written stays answered
/// without a read beneath.
#[test]
fn a_growing_group_keeps_its_key_filter_without_reading_its_keys_back_at_every_doubling() {
    let (store, key_walks, reads_beneath) = counting_store();
    let grown_key = |n: u64| format!("grown-{n:06}").into_bytes();
    // 1000 keys a flush, 64 flushes: the group doubles six times after its first flush.
    let mut walks_after_flush = Vec::new();
    for flush in 0..64u64 {
        for n in flush * 1000..(flush + 1) * 1000 {
            put(&store, 1, &grown_key(n), b"v", n + 1);
        }
        store.flush().unwrap();
        walks_after_flush.push(key_walks.load(Ordering::SeqCst));
    }
    // Built by the first flush for 2k keys, grown by layers of 4k and 12k, built again at
    // ~18k keys for twice as many, grown by a layer after that: two walks, where building
    // again at every doubling made six.
    assert_eq!(walks_after_flush[0], 1);
    let walks = key_walks.load(Ordering::SeqCst);
    assert!(
        walks <= 3,
        "{walks} walks of the group's keys for 64 flushes: {walks_after_flush:?}"
    );

    let before = reads_beneath.load(Ordering::SeqCst);
    let absent = (1_000_000..1_000_200).filter(|&n| store.get(1, &grown_key(n)).unwrap().is_none());
    assert_eq!(absent.count(), 200);
    let searched = reads_beneath.load(Ordering::SeqCst) - before;
    assert!(searched <= 20, "{searched} of 200 absent keys read beneath");
    assert!((0..64_000).all(|n| store.get(1, &grown_key(n)).unwrap().is_some()));
}

/// A restored group's key filter is built from the restored keys as they go by: right after
/// the restore a key the group never had is answered without a read beneath, and no later
/// flush reads the group's keys back to build it.
#[test]
fn a_restore_builds_the_groups_key_filter_without_reading_its_keys_back() {
    let (store, key_walks, reads_beneath) = counting_store();
    // The group had keys before: the restore replaces them all.
    put(&store, 1, b"old key", b"v", 1);
    store.flush().unwrap();
    let walks_before = key_walks.load(Ordering::SeqCst);
    let mut records = (0..500u64).map(|n| Ok((key(n), b"restored".to_vec())));
    store.restore(1, 700, &mut records).unwrap();

    let before = reads_beneath.load(Ordering::SeqCst);
    let absent = (1000..1200).filter(|&n| store.get(1, &key(n)).unwrap().is_none());
    assert_eq!(absent.count(), 200);
    let searched = reads_beneath.load(Ordering::SeqCst) - before;
    assert!(searched <= 20, "{searched} of 200 absent keys read beneath");
    assert!(store.get(1, b"old key").unwrap().is_none());
    assert!((0..500).all(|n| store.get(1, &key(n)).unwrap().as_deref() == Some(&b"restored"[..])));

    // The group's next writes are flushed without a walk of its keys.
    put(&store, 1, b"after the restore", b"v", 701);
    store.flush().unwrap();
    assert_eq!(key_walks.load(Ordering::SeqCst), walks_before);
    assert!(store.get(1, b"after the restore").unwrap().is_some());
}

/// A store asks for a flush once its new layer holds half the pending limit, and no longer
/// once a flush took that layer.
#[test]
fn a_store_wants_a_flush_at_half_its_pending_limit() {
    let store = WriteBackStateStore::with_pending_limit(MemStateStore::new(), 10_000);
    assert!(!store.wants_flush());
    let mut index = 0;
    while !store.wants_flush() {
        index += 1;
        put(&store, 1, &key(index), &[b'v'; 100], index);
        assert!(
            index < 50,
            "no flush wanted after {index} puts of 100 bytes"
        );
    }
    // Each put counts its key, its value and its share of the tree: about 170 bytes.
    assert!(
        index >= 25,
        "a flush wanted after {index} puts, before half the limit"
    );
    store.flush().unwrap();
    assert!(!store.wants_flush());
}
