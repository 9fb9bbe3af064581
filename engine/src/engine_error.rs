//! Errors of the engine's API.

use concord_consensus::{ProposeError, StartError};
use concord_plugins::LoadError;
use concord_session::SessionError;
use concord_storage::StorageError;

/// Why an engine call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// A setting is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The data directory's group layout does not fit the configuration.
    #[error("{path}: {problem}")]
    Layout {
        /// The layout file.
        path: String,
        /// What is wrong.
        problem: String,
    },
    /// The data directory's record of the vote quiet this member said to its peers cannot be
    /// read or written (a lease read's safety across a restart depends on it).
    #[error("{path}: {problem}")]
    VoteQuiet {
        /// The record's file.
        path: String,
        /// What is wrong.
        problem: String,
    },
    /// The data directory's record that this member of a cluster ran on the memory backend
    /// before cannot be read or written (whether it starts as a member that lost its data
    /// depends on it).
    #[error("{path}: {problem}")]
    MemberRecord {
        /// The record's file.
        path: String,
        /// What is wrong.
        problem: String,
    },
    /// The raft address of a cluster member could not be listened on.
    #[error("cannot listen for peers on {address}: {source}")]
    Listen {
        /// The address.
        address: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The stores could not be opened or read.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A store's last flush failed as the engine stopped (see [`crate::Engine::shutdown`]).
    #[error("the engine stopped, but flushing its {store} store failed: {source}")]
    StopFlush {
        /// `"log"` or `"state"`.
        store: &'static str,
        /// Why.
        #[source]
        source: StorageError,
    },
    /// The plugin could not be loaded.
    #[error(transparent)]
    Plugin(#[from] LoadError),
    /// Consensus could not start.
    #[error(transparent)]
    Start(#[from] StartError),
    /// The proposal or read did not produce a result (not the leader, overloaded, timeout,
    /// stopped, ...). `ProposeError::Command` never appears here: see `Command` and `Session`.
    #[error(transparent)]
    Propose(ProposeError),
    /// The state machine applied the command and answered with an error (the same on every
    /// replica); its writes were discarded.
    #[error("command failed: {message} (code {code})")]
    Command {
        /// The state machine's code (1000 and up: the wasm host's fault codes).
        code: u32,
        /// Its explanation.
        message: String,
    },
    /// A session command failed: not found, exists, version mismatch, invalid field.
    #[error("{0}")]
    Session(SessionError),
    /// The state machine's answer could not be decoded (a state machine that is not the
    /// session logic it claims to be).
    #[error("undecodable result: {0}")]
    BadResult(#[source] SessionError),
    /// No voter of the cluster has this id.
    #[error("node {node} is not a voter of this cluster")]
    UnknownNode {
        /// The id asked for.
        node: u64,
    },
    /// A membership change was refused before anything was proposed: it would lose quorum,
    /// names a node that is not a member, or is not valid in this cluster.
    #[error("membership change refused: {reason}")]
    MembershipRefused {
        /// Why.
        reason: String,
    },
    /// A membership change did not reach every group in time; the groups that took it keep
    /// it, and asking again finishes the rest.
    #[error(
        "membership change unfinished after {waited_ms} ms: {groups_waiting} group(s) have not taken it (group {group}: {detail})"
    )]
    MembershipUnfinished {
        /// How long the change was waited for.
        waited_ms: u64,
        /// Groups that have not taken it.
        groups_waiting: usize,
        /// One of them.
        group: u64,
        /// What that group said last, if anything.
        detail: String,
    },
    /// The call needs the session state machine and the engine runs another.
    #[error("the engine does not run the session state machine")]
    NotSessions,
    /// The data of a group was written by another plugin than the one configured for it (and
    /// not one it was upgraded from through the log).
    #[error(
        "group {group} ({plugin}): its data was written by plugin {recorded} (first served as {recorded_base}), but this node was started with {configured}; start it with the module the data records, or change plugins through an upgrade (PUT /v1/plugins/{plugin})"
    )]
    PluginMismatch {
        /// The group.
        group: u64,
        /// The plugin's name (`session` for the main groups).
        plugin: String,
        /// The identity the data records as running (`sha256:<hex>` or `bundled:session`).
        recorded: String,
        /// The identity it records as first served.
        recorded_base: String,
        /// The identity of the module configured.
        configured: String,
    },
    /// A group's record of its plugin could not be read or is damaged.
    #[error("{0}")]
    PluginRecord(String),
    /// An upgrade was refused before anything was proposed: the module does not load, is too
    /// large for a command, or the plugin cannot be upgraded.
    #[error("upgrade refused: {reason}")]
    UpgradeRefused {
        /// Why.
        reason: String,
    },
    /// A backup could not be written, or is not one that can be restored (damaged, cut short,
    /// of another version), or a restore was refused (its data directory is not empty).
    #[error("backup: {0}")]
    Backup(String),
    /// No plugin is served under this name.
    #[error("no plugin is served as {name:?}")]
    UnknownPlugin {
        /// The name asked for.
        name: String,
    },
}

impl From<ProposeError> for EngineError {
    fn from(error: ProposeError) -> Self {
        match error {
            ProposeError::Command(error) => EngineError::Command {
                code: error.code,
                message: error.message,
            },
            other => EngineError::Propose(other),
        }
    }
}
