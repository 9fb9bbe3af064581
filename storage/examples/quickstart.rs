//! Opens a node's stores in a data directory, writes a raft log batch spanning several groups
//! with one sync, applies it to the state store, and reads everything back.
//!
//! ```text
//! cargo run --release -p concord-storage --example quickstart -- [DATA_DIR] [BACKEND]
//! ```
//!
//! Run it twice: the second run finds the first run's data and continues after it.

use std::time::Instant;

use concord_storage::raft::prelude::{Entry, HardState};
use concord_storage::{BackendKind, KeyRange, LogBatch, StateTransaction, StoreConfig, Stores};

const GROUPS: u64 = 4;
const ENTRIES_PER_GROUP: u64 = 256;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let data_dir = args.next().unwrap_or_else(|| "data/quickstart".to_string());
    let backend: BackendKind = args.next().as_deref().unwrap_or("redb").parse()?;
    let stores = Stores::open(&StoreConfig::new(backend, &data_dir))?;
    println!("opened {backend} stores in {data_dir}");

    // One batch for all groups: appended entries plus each group's hard state.
    let mut batch = LogBatch::new();
    let mut first_indexes = Vec::new();
    for group in 0..GROUPS {
        let first = stores.log.last_index(group)? + 1;
        first_indexes.push(first);
        let entries: Vec<Entry> = (first..first + ENTRIES_PER_GROUP)
            .map(|index| {
                let mut entry = Entry::default();
                entry.index = index;
                entry.term = 1;
                entry.data = format!("session-{group}-{index}").into_bytes().into();
                entry
            })
            .collect();
        batch.append(group, entries);
        let mut hard_state = HardState::default();
        hard_state.term = 1;
        hard_state.commit = first + ENTRIES_PER_GROUP - 1;
        batch.set_hard_state(group, hard_state);
    }
    let syncs_before = stores.log.sync_count();
    let started = Instant::now();
    stores.log.write(batch)?;
    let syncs = stores.log.sync_count() - syncs_before;
    // redb syncs once more when it has to grow its file, which a new file does often.
    let growth_note = if syncs > 1 && backend == BackendKind::Redb {
        " (one for the batch, the others for redb growing its file)"
    } else {
        ""
    };
    println!(
        "appended {} entries over {GROUPS} groups in {:?} with {syncs} sync(s){growth_note}",
        GROUPS * ENTRIES_PER_GROUP,
        started.elapsed(),
    );

    // Apply each group's new entries in one state transaction with its applied index.
    for (group, first) in (0..GROUPS).zip(first_indexes) {
        let last = first + ENTRIES_PER_GROUP - 1;
        let mut txn = StateTransaction::new(stores.state.as_ref(), group);
        for entry in stores.log.entries(group, first, last + 1, None)? {
            txn.put(&entry.data, &entry.index.to_le_bytes())?;
        }
        txn.commit(last)?;
    }
    stores.state.flush()?;

    for group in 0..GROUPS {
        let state = stores.log.group_state(group)?;
        let sample = stores
            .state
            .scan(group, &KeyRange::prefix(b"session-"), 2)?;
        println!(
            "group {group}: log {}..={} (commit {}), applied {}, first keys {:?}",
            state.first_index(),
            state.last_index,
            state.hard_state.commit,
            stores.state.applied_index(group)?,
            sample
                .iter()
                .map(|(key, _)| String::from_utf8_lossy(key).into_owned())
                .collect::<Vec<_>>()
        );
    }
    Ok(())
}
