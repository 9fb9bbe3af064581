//! A member of a cluster on the memory backend keeps nothing across a restart, and an empty
//! log cannot tell its first start from a later one. Started again with its first start's
//! flags, it would take part at once: two such members restarted together could elect one of
//! them on their empty logs, beside a third member that holds the data, and acknowledge writes
//! that member's log later overwrites. So the member records in its data directory that it
//! has run (`MEMORY_MEMBER`: the cluster and its id), just before its groups start; a later
//! start that finds the record joins as a member that lost its data, as
//! `--initial-cluster-state existing` would have it: it asks the others where each group
//! stands before it takes any part, and waits for a snapshot from each group's leader.

use std::path::{Path, PathBuf};

use crate::EngineError;
use crate::durable_file;

const MEMORY_MEMBER_FILE: &str = "MEMORY_MEMBER";

/// Whether member `node_id` of cluster `cluster_id` ran on the memory backend with `data_dir`
/// before (its record is there). A record of another cluster or member is not this one's: its
/// start is a first one (the record is written over at [`record`]).
pub(crate) fn started_before(
    data_dir: &Path,
    cluster_id: u64,
    node_id: u64,
) -> Result<bool, EngineError> {
    let path = path_in(data_dir);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(error) => return Err(problem(&path, format!("cannot read: {error}"))),
    };
    let recorded = parse(&text).ok_or_else(|| {
        problem(
            &path,
            format!(
                "expected `cluster_id = <n>` and `node_id = <n>`, found {:?}; the file is \
                 damaged: remove it to start this member as at its first start, or start it \
                 with `--initial-cluster-state existing`",
                text.chars().take(64).collect::<String>()
            ),
        )
    })?;
    Ok(recorded == (cluster_id, node_id))
}

/// Records, durably, that member `node_id` of cluster `cluster_id` runs on the memory backend
/// with `data_dir` (made if missing).
pub(crate) fn record(data_dir: &Path, cluster_id: u64, node_id: u64) -> Result<(), EngineError> {
    let path = path_in(data_dir);
    std::fs::create_dir_all(data_dir)
        .and_then(|()| {
            durable_file::replace(
                &path,
                &format!("cluster_id = {cluster_id}\nnode_id = {node_id}\n"),
            )
        })
        .map_err(|error| problem(&path, format!("cannot write: {error}")))
}

/// The path of the record in `data_dir`.
pub(crate) fn path_in(data_dir: &Path) -> PathBuf {
    data_dir.join(MEMORY_MEMBER_FILE)
}

fn problem(path: &Path, problem: String) -> EngineError {
    EngineError::MemberRecord {
        path: path.display().to_string(),
        problem,
    }
}

/// `(cluster_id, node_id)` of a record: both keys, once each, and nothing else.
fn parse(text: &str) -> Option<(u64, u64)> {
    let (mut cluster_id, mut node_id) = (None, None);
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        let (key, value) = line.split_once('=')?;
        let value: u64 = value.trim().parse().ok()?;
        let slot = match key.trim() {
            "cluster_id" => &mut cluster_id,
            "node_id" => &mut node_id,
            _ => return None,
        };
        if slot.replace(value).is_some() {
            return None;
        }
    }
    Some((cluster_id?, node_id?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_this_members_only_and_a_damaged_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path().join("not-yet-made");
        assert!(!started_before(&data_dir, 7, 2).unwrap());
        record(&data_dir, 7, 2).unwrap();
        assert!(started_before(&data_dir, 7, 2).unwrap());
        assert!(!started_before(&data_dir, 7, 3).unwrap(), "another member");
        assert!(!started_before(&data_dir, 8, 2).unwrap(), "another cluster");
        record(&data_dir, 8, 2).unwrap();
        assert!(started_before(&data_dir, 8, 2).unwrap());

        for damaged in [
            "",
            "cluster_id = 8\n",
            "cluster_id = x\nnode_id = 2\n",
            "hello",
        ] {
            std::fs::write(path_in(&data_dir), damaged).unwrap();
            let error = started_before(&data_dir, 8, 2).unwrap_err();
            assert!(
                error.to_string().contains("damaged"),
                "{damaged:?}: {error}"
            );
        }
        std::fs::write(
            path_in(&data_dir),
            "cluster_id = 8\nnode_id = 2\nnode_id = 3\n",
        )
        .unwrap();
        assert!(started_before(&data_dir, 8, 2).is_err(), "a key twice");
    }

    #[test]
    fn hostile_records_are_refused_never_a_panic() {
        let valid = vec![b"cluster_id = 7\nnode_id = 2\n".to_vec()];
        for input in concord_storage::testing::hostile_inputs(&valid, 14, 2_000) {
            let _ = parse(&String::from_utf8_lossy(&input));
        }
    }
}
