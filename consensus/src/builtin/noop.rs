//! A state machine that applies nothing: the shape of in-memory raft benchmarks, where only
//! replication and the applied index are measured.

use bytes::Bytes;
use concord_storage::StateTransaction;

use crate::{ApplyError, CommandResult, StateMachine};

/// Accepts every command and returns an empty result; only the applied index is stored.
#[derive(Debug, Default)]
pub struct NoopStateMachine;

impl StateMachine for NoopStateMachine {
    fn apply(
        &mut self,
        _txn: &mut StateTransaction<'_>,
        commands: &[Bytes],
    ) -> Result<Vec<CommandResult>, ApplyError> {
        Ok(vec![Ok(Bytes::new()); commands.len()])
    }

    fn applies_quickly(&self) -> bool {
        true
    }
}
