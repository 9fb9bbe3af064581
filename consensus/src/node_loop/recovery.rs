//! What a node repairs in its logs before its groups open, and what it refuses to open.

use concord_storage::raft::prelude::SnapshotMetadata;
use concord_storage::{GroupId, LogBatch, Stores};

use super::install_marks::InstallMarks;
use crate::{NodeConfig, NodeId, StartError};

/// Checks each group's log against its state before the groups open.
///
/// The log is compacted only below what the state has flushed, so a state behind the
/// compaction point is one that was lost or replaced by an older copy. Raft-rs would take the
/// compaction point as applied and apply what follows onto that state, silently leaving out
/// the entries between: the node refuses to start instead ([`StartError::StateBehindLog`]).
///
/// A state ahead of the log's end happens after a crash between installing a snapshot's state
/// and recording the snapshot in the log, or when the log was not synced and lost its tail
/// while the state had been flushed. Raft cannot start from a commit index beyond its log, and
/// the entries between are gone, so the log restarts after the state's applied index `a`, with
/// term 0 recorded at `a`: no leader's log matches that term, so the node never wins an
/// election on this log, and it asks its leader for a snapshot when the leader's append
/// reaches back to `a` (`RaftReplica::ask_for_snapshot_past_restart`). Unless the log lost its
/// term and vote too (its files were lost) on a node that is not alone (its group names other
/// voters, or its network knows other nodes) and does not join as a new member: a member that
/// forgot whom it voted for and what it acknowledged could help elect a leader that lacks
/// committed writes, and one that forgot its configuration could elect itself alone, so the
/// node refuses to start ([`StartError::LogLost`]); emptied, its data directory lets it join
/// again through a snapshot, voting only once caught up. And unless the node is alone and
/// `log_synced_before` (its log synced every write since it last matched the state,
/// `log_sync_record.rs`): nothing then explains the missing entries but a log that lost
/// acknowledged writes, which nobody else holds, and the node refuses to start
/// ([`StartError::SyncedLogLost`]) rather than serve its state without them.
///
/// A state that a snapshot's install brought to or past the snapshot's index, with a log that
/// never recorded the snapshot (a mark in the snapshot directory says so,
/// `install_marks.rs`), restarts the log after the state too, wherever the log ends: its
/// entries up to the state's applied index may be an old term's, which raft would take for
/// committed.
pub(crate) fn check_logs_against_state(
    stores: &Stores,
    config: &NodeConfig,
    known_peers: &[NodeId],
    log_synced_before: bool,
) -> Result<(), StartError> {
    let node = config.node_id;
    let marks = match &config.snapshot_dir {
        Some(dir) => InstallMarks::read_all(dir)?,
        None => Vec::new(),
    };
    let install_mark = |group: GroupId| {
        marks
            .binary_search_by_key(&group, |&(marked, _)| marked)
            .ok()
            .map(|at| marks[at].1)
    };
    // The network's peers too: a member that started alone and was joined by others later has
    // its configuration in the log, and its settings name it alone.
    let peers_known = known_peers.iter().any(|&peer| peer != node);
    let mut batch = LogBatch::new();
    // (group, applied index, the log's last index) of each log that restarts: one line says
    // how many, not one per group (an unsynced log loses its tail in every group at once).
    let mut restarted = Vec::new();
    // The same for each log that lost writes it had synced: one error names the first.
    let mut lost_synced = Vec::new();
    for &group in &config.groups {
        let applied = stores.state.applied_index(group)?;
        let log = stores.log.group_state(group)?;
        if applied < log.truncated_index {
            return Err(StartError::StateBehindLog {
                group,
                applied_index: applied,
                log_compacted_index: log.truncated_index,
            });
        }
        // An install whose state went in while the log never recorded its snapshot; a log
        // without a term is not one that took a snapshot (it was lost since, and is checked
        // as such below).
        let install_unrecorded = install_mark(group).is_some_and(|index| {
            applied >= index && log.truncated_index < index && log.hard_state.term > 0
        });
        if applied <= log.last_index && !install_unrecorded {
            continue;
        }
        let other_voters = log
            .conf_state
            .voters
            .iter()
            .chain(&log.conf_state.voters_outgoing)
            .any(|&voter| voter != node);
        let alone = !other_voters && !peers_known;
        // A member joining a running cluster votes only once caught up (`RaftReplica::open`),
        // and its state is ahead of its log after a crash in a snapshot's install.
        if !config.catch_up_before_voting && !install_unrecorded {
            if log.hard_state.term == 0 && !alone {
                return Err(StartError::LogLost {
                    group,
                    applied_index: applied,
                });
            }
            if alone && log_synced_before {
                lost_synced.push((group, applied, log.last_index));
                continue;
            }
        }
        tracing::debug!(
            group,
            applied_index = applied,
            log_last_index = log.last_index,
            "the state has applied past the end of the log; the log restarts after it"
        );
        restarted.push((group, applied, log.last_index));
        let mut metadata = SnapshotMetadata::default();
        metadata.index = applied;
        metadata.term = 0;
        metadata.set_conf_state(log.conf_state.clone());
        let mut hard_state = log.hard_state.clone();
        hard_state.commit = applied;
        batch.apply_snapshot(group, metadata);
        batch.set_hard_state(group, hard_state);
    }
    if let Some(&(group, applied_index, log_last_index)) = lost_synced.first() {
        return Err(StartError::SyncedLogLost {
            group,
            applied_index,
            log_last_index,
            groups: lost_synced.len(),
            record: config
                .log_sync_record
                .clone()
                .unwrap_or_else(|| crate::LOG_SYNC_FILE.into()),
        });
    }
    if !batch.is_empty() {
        stores.log.write(batch)?;
        stores.log.flush()?;
    }
    if let Some(dir) = &config.snapshot_dir {
        InstallMarks::remove_all(dir);
    }
    if let Some(&(first_group, applied_index, log_last_index)) = restarted.first() {
        tracing::warn!(
            groups = restarted.len(),
            first_group,
            applied_index,
            log_last_index,
            "the state has applied past the end of the log in some groups; their logs restart \
             after it (on the first start after a restore from a backup, every group's does)"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use concord_storage::raft::prelude::ConfState;
    use concord_storage::{LogStore, MemLogStore, MemStateStore, StateStore, WriteSet};

    use super::*;

    /// A lone voter's group whose log lost everything (term, vote and configuration) while its
    /// state applied through 44.
    fn lone_voter_without_its_log() -> Stores {
        let log = MemLogStore::new();
        let mut batch = LogBatch::new();
        batch.set_conf_state(7, ConfState::from((vec![1], Vec::<u64>::new())), 0);
        log.write(batch).unwrap();
        let state = MemStateStore::new();
        state.commit(7, WriteSet::default(), 44).unwrap();
        Stores {
            log: Arc::new(log),
            state: Arc::new(state),
        }
    }

    #[test]
    fn a_node_that_lost_its_log_is_refused_if_its_network_knows_other_nodes() {
        let config = NodeConfig::new(1, vec![1], vec![7]);
        let stores = lone_voter_without_its_log();
        let refused = check_logs_against_state(&stores, &config, &[2, 3], false);
        assert!(
            matches!(
                refused,
                Err(StartError::LogLost {
                    group: 7,
                    applied_index: 44
                })
            ),
            "{refused:?}"
        );
        assert_eq!(stores.log.last_index(7).unwrap(), 0, "nothing written");

        // Joining as a new member, it votes only once caught up: the log restarts.
        let mut joining = config.clone();
        joining.catch_up_before_voting = true;
        check_logs_against_state(&stores, &joining, &[2, 3], false).unwrap();
        assert_eq!(stores.log.last_index(7).unwrap(), 44);

        // Alone, with nobody else known, the log restarts after the state.
        let stores = lone_voter_without_its_log();
        check_logs_against_state(&stores, &config, &[1], false).unwrap();
        assert_eq!(stores.log.last_index(7).unwrap(), 44);
    }

    /// A follower of a three-voter group whose log holds 1–12, entries 9–12 of an old term
    /// it never saw committed (commit 8), and whose state a snapshot's install brought to 10.
    fn follower_with_an_old_terms_tail_under_an_installed_state() -> Stores {
        let log = MemLogStore::new();
        let mut batch = LogBatch::new();
        batch.set_conf_state(7, ConfState::from((vec![1, 2, 3], Vec::<u64>::new())), 0);
        let mut hard_state = concord_storage::raft::prelude::HardState::default();
        hard_state.term = 4;
        hard_state.vote = 2;
        hard_state.commit = 8;
        batch.set_hard_state(7, hard_state);
        batch.append(7, concord_storage::testing::make_entries(7, 1..=8, 2));
        batch.append(7, concord_storage::testing::make_entries(7, 9..=12, 3));
        log.write(batch).unwrap();
        let state = MemStateStore::new();
        state.commit(7, WriteSet::default(), 10).unwrap();
        Stores {
            log: Arc::new(log),
            state: Arc::new(state),
        }
    }

    #[test]
    fn a_log_that_never_recorded_an_installed_snapshot_restarts_after_the_state() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = NodeConfig::new(1, vec![1, 2, 3], vec![7]);
        config.snapshot_dir = Some(dir.path().to_path_buf());
        let marks = InstallMarks::new(Some(dir.path()));

        // No mark: the log is taken as it is (after a crash the state may run ahead of the
        // commit index the log wrote, over entries the log holds).
        let stores = follower_with_an_old_terms_tail_under_an_installed_state();
        check_logs_against_state(&stores, &config, &[2, 3], false).unwrap();
        assert_eq!(stores.log.last_index(7).unwrap(), 12);

        // A mark of an install at 9, the state at 10: the log's entries up to the state may
        // be the old term's, so it restarts after the state, term unknown; the vote is kept.
        marks.mark(7, 9).unwrap();
        check_logs_against_state(&stores, &config, &[2, 3], false).unwrap();
        let log = stores.log.group_state(7).unwrap();
        assert_eq!((log.truncated_index, log.truncated_term), (10, 0));
        assert_eq!(log.last_index, 10);
        assert_eq!(
            (
                log.hard_state.term,
                log.hard_state.vote,
                log.hard_state.commit
            ),
            (4, 2, 10)
        );
        assert!(
            InstallMarks::read_all(dir.path()).unwrap().is_empty(),
            "the marks are removed once read"
        );

        // A mark whose install never reached the state (a crash before it), or whose
        // snapshot the log recorded, changes nothing.
        let stores = follower_with_an_old_terms_tail_under_an_installed_state();
        marks.mark(7, 11).unwrap();
        check_logs_against_state(&stores, &config, &[2, 3], false).unwrap();
        assert_eq!(stores.log.last_index(7).unwrap(), 12);
        let mut batch = LogBatch::new();
        batch.compact(7, 10);
        stores.log.write(batch).unwrap();
        marks.mark(7, 9).unwrap();
        check_logs_against_state(&stores, &config, &[2, 3], false).unwrap();
        assert_eq!(stores.log.last_index(7).unwrap(), 12);

        // A mark beside a log that lost its term is no install's: the lost log is refused.
        let stores = lone_voter_without_its_log();
        marks.mark(7, 40).unwrap();
        let refused = check_logs_against_state(&stores, &config, &[2, 3], false);
        assert!(
            matches!(refused, Err(StartError::LogLost { group: 7, .. })),
            "{refused:?}"
        );

        // A damaged mark refuses the start, naming it.
        std::fs::write(dir.path().join("installing-7"), b"").unwrap();
        let stores = follower_with_an_old_terms_tail_under_an_installed_state();
        let refused = check_logs_against_state(&stores, &config, &[2, 3], false);
        assert!(
            refused
                .as_ref()
                .is_err_and(|error| error.to_string().contains("installing-7")),
            "{refused:?}"
        );
    }

    #[test]
    fn a_node_alone_whose_synced_log_lost_writes_is_refused() {
        let mut config = NodeConfig::new(1, vec![1], vec![7, 8]);
        config.log_sync_record = Some("/data/LOG_SYNC".into());
        let stores = lone_voter_without_its_log();
        // Group 8 lost its log's tail: term and configuration kept, the state further on.
        let mut batch = LogBatch::new();
        batch.set_conf_state(8, ConfState::from((vec![1], Vec::<u64>::new())), 0);
        let mut hard_state = concord_storage::raft::prelude::HardState::default();
        hard_state.term = 2;
        hard_state.vote = 1;
        batch.set_hard_state(8, hard_state);
        batch.append(8, concord_storage::testing::make_entries(8, 1..=5, 2));
        stores.log.write(batch).unwrap();
        stores.state.commit(8, WriteSet::default(), 9).unwrap();

        let refused = check_logs_against_state(&stores, &config, &[1], true);
        match refused {
            Err(StartError::SyncedLogLost {
                group: 7,
                applied_index: 44,
                log_last_index: 0,
                groups: 2,
                ref record,
            }) => assert_eq!(record, std::path::Path::new("/data/LOG_SYNC")),
            other => panic!("{other:?}"),
        }
        assert_eq!(stores.log.last_index(7).unwrap(), 0, "nothing written");
        assert_eq!(stores.log.last_index(8).unwrap(), 5, "nothing written");

        // Some run did not sync (or nothing is known): both restart after their states.
        check_logs_against_state(&stores, &config, &[1], false).unwrap();
        assert_eq!(stores.log.last_index(7).unwrap(), 44);
        assert_eq!(stores.log.last_index(8).unwrap(), 9);
    }
}
