//! What a node repairs in its logs before its groups open, and what it refuses to open.

use concord_storage::raft::prelude::SnapshotMetadata;
use concord_storage::{GroupId, LogBatch, Stores};

use crate::{NodeId, StartError};

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
/// term and vote too (its files were lost) in a group with other voters: a member that forgot
/// whom it voted for and what it acknowledged could help elect a leader that lacks committed
/// writes, so the node refuses to start ([`StartError::LogLost`]); emptied, its data directory
/// lets it join again through a snapshot, voting only once caught up.
pub(crate) fn check_logs_against_state(
    stores: &Stores,
    groups: &[GroupId],
    node: NodeId,
) -> Result<(), StartError> {
    let mut batch = LogBatch::new();
    for &group in groups {
        let applied = stores.state.applied_index(group)?;
        let log = stores.log.group_state(group)?;
        if applied < log.truncated_index {
            return Err(StartError::StateBehindLog {
                group,
                applied_index: applied,
                log_compacted_index: log.truncated_index,
            });
        }
        if applied <= log.last_index {
            continue;
        }
        let other_voters = log
            .conf_state
            .voters
            .iter()
            .chain(&log.conf_state.voters_outgoing)
            .any(|&voter| voter != node);
        if log.hard_state.term == 0 && other_voters {
            return Err(StartError::LogLost {
                group,
                applied_index: applied,
            });
        }
        tracing::warn!(
            group,
            applied_index = applied,
            log_last_index = log.last_index,
            "the state has applied past the end of the log; the log restarts after it"
        );
        let mut metadata = SnapshotMetadata::default();
        metadata.index = applied;
        metadata.term = 0;
        metadata.set_conf_state(log.conf_state.clone());
        let mut hard_state = log.hard_state.clone();
        hard_state.commit = applied;
        batch.apply_snapshot(group, metadata);
        batch.set_hard_state(group, hard_state);
    }
    if !batch.is_empty() {
        stores.log.write(batch)?;
        stores.log.flush()?;
    }
    Ok(())
}
