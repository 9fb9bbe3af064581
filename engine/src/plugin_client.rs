//! Plugins served beside the main state machine, each over a range of groups of its own, and
//! the client that calls one: commands routed by key, reads of a key at any consistency.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use concord_consensus::{ApplyError, StateMachine, StateMachineFactory};
use concord_plugins::{Plugin, PluginVersions};
use concord_storage::GroupId;

use crate::{Consistency, Engine, EngineError, group_of};

/// One served plugin's place among the node's groups.
pub(crate) struct ServedGroups {
    pub(crate) name: String,
    pub(crate) first_group: GroupId,
    pub(crate) groups: u32,
    /// The module it was configured with and those it was upgraded to.
    pub(crate) versions: PluginVersions,
}

impl ServedGroups {
    fn group_of(&self, key: &[u8]) -> GroupId {
        self.first_group + group_of(key, self.groups)
    }

    fn group_range(&self) -> Range<GroupId> {
        self.first_group..self.first_group + u64::from(self.groups)
    }
}

/// Makes each group's state machine with the factory of the range it falls in.
pub(crate) struct GroupRangeFactory {
    pub(crate) ranges: Vec<(Range<GroupId>, Arc<dyn StateMachineFactory>)>,
}

impl StateMachineFactory for GroupRangeFactory {
    fn create(&self, group: GroupId) -> Result<Box<dyn StateMachine>, ApplyError> {
        match self.ranges.iter().find(|(range, _)| range.contains(&group)) {
            Some((_, factory)) => factory.create(group),
            None => Err(ApplyError::Fatal(format!(
                "group {group} belongs to no state machine of this engine"
            ))),
        }
    }
}

/// Calls one served plugin (see [`crate::EngineConfig::plugins`]): a command goes to the group
/// its key routes to and answers with the plugin's result; a read returns the value the
/// plugin stored under a key, in that key's group.
///
/// ```
/// use bytes::Bytes;
/// use concord_engine::{Consistency, Engine, EngineConfig, ServedPlugin, StateMachineSource};
///
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// let dir = tempfile::tempdir()?;
/// let mut config = EngineConfig::new(dir.path());
/// config.plugins.push(ServedPlugin {
///     name: "kv".into(),
///     source: StateMachineSource::PluginBytes {
///         name: "kv".into(),
///         wasm: concord_plugins::bundled::KV.to_vec(),
///     },
///     groups: 2,
/// });
/// let engine = Engine::open(config)?;
/// let kv = engine.plugin_client("kv")?;
/// // The kv plugin's put: op 1, the key's length (u16, little-endian), the key, the value.
/// let mut put = vec![1, 6, 0];
/// put.extend_from_slice(b"user/1");
/// put.extend_from_slice(b"Ada");
/// kv.propose(b"user/1", Bytes::from(put)).await?;
/// let value = kv.read(b"user/1", Consistency::Linearizable).await?;
/// assert_eq!(value.as_deref(), Some(&b"Ada"[..]));
/// engine.shutdown()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct PluginClient<'e> {
    engine: &'e Engine,
    served: &'e ServedGroups,
}

impl<'e> PluginClient<'e> {
    pub(crate) fn new(engine: &'e Engine, served: &'e ServedGroups) -> Self {
        PluginClient { engine, served }
    }

    /// The name it is served under.
    pub fn name(&self) -> &str {
        &self.served.name
    }

    /// The module its groups run (its hash and [`Plugin::stats`]), as the data of its first
    /// group records it: the one it was last upgraded to through the log, else the configured
    /// one; `None` for the native session logic.
    pub fn plugin(&self) -> Option<Plugin> {
        let first_group = self.served.first_group;
        self.engine
            .recorded_plugin(&self.served.versions, first_group)
    }

    /// Switches every group of the plugin to `module` through the log (see
    /// [`Engine::upgrade_plugin`]); returns the new module's identity (`sha256:<hex>`).
    pub async fn upgrade(&self, module: &[u8]) -> Result<String, EngineError> {
        self.engine
            .upgrade_groups(&self.served.versions, self.group_ids(), module)
            .await
    }

    /// The groups its keys are spread over.
    pub fn group_ids(&self) -> Range<GroupId> {
        self.served.group_range()
    }

    /// The group `key` routes to.
    pub fn group_of(&self, key: &[u8]) -> GroupId {
        self.served.group_of(key)
    }

    /// Proposes `command` to the group of `key`; resolves to the plugin's result once the
    /// command has applied ([`EngineError::Command`] carries the plugin's error code).
    pub async fn propose(&self, key: &[u8], command: Bytes) -> Result<Bytes, EngineError> {
        self.engine.propose_to(self.group_of(key), command).await
    }

    /// Proposes each `(key, command)` to the group of its key: the commands of one group as
    /// one batch, in the order given ([`Engine::propose_batch_to`]), and the batches of all
    /// groups at once. One result per command, in the order given, each as
    /// [`PluginClient::propose`] would have answered it alone.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use concord_engine::{Engine, EngineConfig, ServedPlugin, StateMachineSource};
    ///
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let dir = tempfile::tempdir()?;
    /// let mut config = EngineConfig::new(dir.path());
    /// // A counter per group: each command adds its 8 bytes (an i64) to its group's total.
    /// config.plugins.push(ServedPlugin {
    ///     name: "counter".into(),
    ///     source: StateMachineSource::PluginBytes {
    ///         name: "counter".into(),
    ///         wasm: concord_plugins::bundled::COUNTER.to_vec(),
    ///     },
    ///     groups: 2,
    /// });
    /// let engine = Engine::open(config)?;
    /// let counter = engine.plugin_client("counter")?;
    /// let add = |n: i64| Bytes::from(n.to_le_bytes().to_vec());
    /// let answers = counter
    ///     .propose_many(vec![(b"a".to_vec(), add(1)), (b"b".to_vec(), add(2)), (b"a".to_vec(), add(3))])
    ///     .await;
    /// let totals: Vec<i64> = answers
    ///     .into_iter()
    ///     .map(|answer| Ok(i64::from_le_bytes(answer?.as_ref().try_into()?)))
    ///     .collect::<Result<_, Box<dyn std::error::Error>>>()?;
    /// // "a"'s two commands went to one group, in their order.
    /// assert_eq!(totals[2], totals[0] + 3);
    /// engine.shutdown()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn propose_many(
        &self,
        commands: Vec<(Vec<u8>, Bytes)>,
    ) -> Vec<Result<Bytes, EngineError>> {
        let commands = commands
            .into_iter()
            .map(|(key, command)| (self.group_of(&key), command))
            .collect();
        self.engine.propose_in_batches(commands).await
    }

    /// The value stored under `key` in `key`'s group, read with `consistency`; `None` if there
    /// is none.
    pub async fn read(
        &self,
        key: &[u8],
        consistency: Consistency,
    ) -> Result<Option<Vec<u8>>, EngineError> {
        if concord_plugins::is_reserved_key(key) {
            return Ok(None);
        }
        let group = self.group_of(key);
        self.engine.ready_to_read(group, consistency).await?;
        Ok(self.engine.state_store().get(group, key)?)
    }
}
