//! What a group applies its committed commands to.

use bytes::Bytes;
use concord_storage::{GroupId, StateTransaction, StorageError};

/// A deterministic failure of one command: the same on every replica, recorded as that
/// command's result. The command's writes are discarded; the rest of the batch applies.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message} (code {code})")]
pub struct CommandError {
    /// A stable, machine-readable code chosen by the state machine.
    pub code: u32,
    /// A human-readable explanation.
    pub message: String,
}

impl CommandError {
    /// A command error with `code` and `message`.
    pub fn new(code: u32, message: impl Into<String>) -> Self {
        CommandError {
            code,
            message: message.into(),
        }
    }
}

/// The result of one command.
pub type CommandResult = Result<Bytes, CommandError>;

/// A failure that must never become a recorded outcome (an I/O error, a watchdog): the batch
/// is not committed and the group stops applying, reporting the reason.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The state store failed.
    #[error("state store: {0}")]
    Storage(#[from] StorageError),
    /// The state machine failed in a way that is not a property of the command.
    #[error("state machine: {0}")]
    Fatal(String),
}

/// The logic a group applies its commands with.
///
/// `apply` gets a whole batch of committed commands, in log order, and a transaction on the
/// group's state; it returns one result per command. Implementations must be deterministic:
/// replicas applying the same commands to the same state must reach the same state and results.
pub trait StateMachine: Send + 'static {
    /// Applies `commands` in order within `txn`; exactly one result per command.
    fn apply(
        &mut self,
        txn: &mut StateTransaction<'_>,
        commands: &[Bytes],
    ) -> Result<Vec<CommandResult>, ApplyError>;

    /// Applies an operator's command (see [`crate::Consensus::propose_admin`]) within `txn`,
    /// alone in its entry. A machine that takes none answers each with
    /// [`ADMIN_COMMAND_UNSUPPORTED`].
    fn apply_admin(
        &mut self,
        _txn: &mut StateTransaction<'_>,
        _command: &Bytes,
    ) -> Result<CommandResult, ApplyError> {
        Ok(Err(CommandError::new(
            ADMIN_COMMAND_UNSUPPORTED,
            "this state machine takes no admin commands",
        )))
    }

    /// Whether every apply is short: bounded work per command, in code built into the node (no
    /// plugin, nothing that waits on another thread or the network). The raft worker may then
    /// apply a round of a few commands itself when the apply thread has nothing to do,
    /// sparing the callers a hand-off between threads. An apply on the worker holds every
    /// group of that worker until it returns, so a machine that may run long keeps the
    /// default, `false`.
    fn applies_quickly(&self) -> bool {
        false
    }
}

/// The code of an admin command's error when the state machine takes none.
pub const ADMIN_COMMAND_UNSUPPORTED: u32 = 0xad00;

/// Creates the state machine of each group a node hosts.
pub trait StateMachineFactory: Send + Sync + 'static {
    /// The state machine for `group`.
    fn create(&self, group: GroupId) -> Result<Box<dyn StateMachine>, ApplyError>;
}

impl<F> StateMachineFactory for F
where
    F: Fn(GroupId) -> Box<dyn StateMachine> + Send + Sync + 'static,
{
    fn create(&self, group: GroupId) -> Result<Box<dyn StateMachine>, ApplyError> {
        Ok(self(group))
    }
}
