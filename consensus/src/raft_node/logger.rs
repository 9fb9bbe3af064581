//! raft-rs logs through slog; this drain forwards its records to `tracing`.

use slog::{Drain, KV, Level, OwnedKVList, Record, Serializer};

/// A slog drain that emits each record as a `tracing` event (target `raft`).
pub(crate) struct TracingDrain;

impl Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &Record<'_>, values: &OwnedKVList) -> Result<(), slog::Never> {
        // raft-rs logs often at debug level: skip the formatting when nobody listens.
        let enabled = match record.level() {
            Level::Critical | Level::Error => {
                tracing::enabled!(target: "raft", tracing::Level::ERROR)
            }
            Level::Warning => tracing::enabled!(target: "raft", tracing::Level::WARN),
            Level::Info => tracing::enabled!(target: "raft", tracing::Level::INFO),
            Level::Debug => tracing::enabled!(target: "raft", tracing::Level::DEBUG),
            Level::Trace => tracing::enabled!(target: "raft", tracing::Level::TRACE),
        };
        if !enabled {
            return Ok(());
        }
        let mut fields = FieldCollector(String::new());
        let _ = record.kv().serialize(record, &mut fields);
        let _ = values.serialize(record, &mut fields);
        let message = record.msg();
        let fields = fields.0;
        match record.level() {
            Level::Critical | Level::Error => tracing::error!(target: "raft", "{message}{fields}"),
            Level::Warning => tracing::warn!(target: "raft", "{message}{fields}"),
            Level::Info => tracing::info!(target: "raft", "{message}{fields}"),
            Level::Debug => tracing::debug!(target: "raft", "{message}{fields}"),
            Level::Trace => tracing::trace!(target: "raft", "{message}{fields}"),
        }
        Ok(())
    }
}

struct FieldCollector(String);

impl Serializer for FieldCollector {
    fn emit_arguments(&mut self, key: slog::Key, value: &std::fmt::Arguments<'_>) -> slog::Result {
        use std::fmt::Write;
        let _ = write!(self.0, " {key}={value}");
        Ok(())
    }
}

/// The logger raft-rs groups of a node use.
pub(crate) fn raft_logger(node: u64) -> slog::Logger {
    slog::Logger::root(TracingDrain.fuse(), slog::o!("node" => node))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use concord_storage::{LogStore, MemLogStore};

    use super::*;
    use crate::NodeConfig;
    use crate::raft_node::RaftReplica;

    /// Keeps each record's message and fields, as `TracingDrain` writes them.
    struct Collecting(Arc<Mutex<Vec<String>>>);

    impl Drain for Collecting {
        type Ok = ();
        type Err = slog::Never;

        fn log(&self, record: &Record<'_>, values: &OwnedKVList) -> Result<(), slog::Never> {
            let mut line = FieldCollector(record.msg().to_string());
            let _ = record.kv().serialize(record, &mut line);
            let _ = values.serialize(record, &mut line);
            self.0.lock().unwrap().push(line.0);
            Ok(())
        }
    }

    #[test]
    fn a_groups_raft_lines_name_the_group_and_the_node() {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let logger = slog::Logger::root(Collecting(lines.clone()).fuse(), slog::o!("node" => 2));
        let config = NodeConfig::new(2, vec![1, 2, 3], vec![7]);
        let log: Arc<dyn LogStore> = Arc::new(MemLogStore::new());
        RaftReplica::open(&config, 7, log, 0, &logger).unwrap();
        let lines = lines.lock().unwrap();
        assert!(!lines.is_empty(), "raft-rs logs as a group opens");
        for line in lines.iter() {
            assert!(
                line.contains(" group=7") && line.contains(" node=2"),
                "{line}"
            );
        }
    }
}
