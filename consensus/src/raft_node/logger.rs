//! raft-rs logs through slog; this drain forwards its records to `tracing` (target `raft`),
//! shaped for a node of thousands of groups. raft-rs writes a line per group for every step of
//! an election, so its informational records go out at debug: at info, a node of 10,000 groups
//! would write tens of thousands of lines at every start and every failover. What they tell an
//! operator comes from the node instead, one line per interval (`event_lines.rs`). Its
//! warnings and errors stay at their level but are limited per place in raft-rs's code: a
//! partition makes every group a node leads warn at once.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use slog::{Drain, KV, Level, OwnedKVList, Record, Serializer};

/// Warnings and errors logged from one place in raft-rs's code per window; the rest of the
/// window's are counted (`concord_raft_log_records_suppressed_total`), not written.
const RECORDS_PER_PLACE: u32 = 3;

/// The window of [`RECORDS_PER_PLACE`].
const PLACE_WINDOW: Duration = Duration::from_secs(10);

/// A slog drain that emits each record as a `tracing` event (target `raft`).
pub(crate) struct TracingDrain {
    limits: PlaceLimits,
}

impl Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &Record<'_>, values: &OwnedKVList) -> Result<(), slog::Never> {
        // raft-rs logs often below warning: skip the formatting when nobody listens.
        let enabled = match record.level() {
            Level::Critical | Level::Error => {
                tracing::enabled!(target: "raft", tracing::Level::ERROR)
            }
            Level::Warning => tracing::enabled!(target: "raft", tracing::Level::WARN),
            Level::Info | Level::Debug => {
                tracing::enabled!(target: "raft", tracing::Level::DEBUG)
            }
            Level::Trace => tracing::enabled!(target: "raft", tracing::Level::TRACE),
        };
        if !enabled {
            return Ok(());
        }
        let mut ending = String::new();
        if record.level().is_at_least(Level::Warning) {
            match self
                .limits
                .admit((record.file(), record.line()), Instant::now())
            {
                Admission::Log => {}
                Admission::LogLast => {
                    ending = format!(
                        " (more records from this place in raft-rs within {} s are counted, not \
                         logged)",
                        PLACE_WINDOW.as_secs()
                    );
                }
                Admission::Suppress => {
                    metrics::counter!("concord_raft_log_records_suppressed_total").increment(1);
                    return Ok(());
                }
            }
        }
        let mut fields = FieldCollector(String::new());
        let _ = record.kv().serialize(record, &mut fields);
        let _ = values.serialize(record, &mut fields);
        let message = record.msg();
        let fields = fields.0;
        match record.level() {
            Level::Critical | Level::Error => {
                tracing::error!(target: "raft", "{message}{fields}{ending}")
            }
            Level::Warning => tracing::warn!(target: "raft", "{message}{fields}{ending}"),
            Level::Info | Level::Debug => tracing::debug!(target: "raft", "{message}{fields}"),
            Level::Trace => tracing::trace!(target: "raft", "{message}{fields}"),
        }
        Ok(())
    }
}

/// What [`PlaceLimits::admit`] decides for one record.
#[derive(Debug, PartialEq, Eq)]
enum Admission {
    Log,
    /// Log it, saying that the place is quiet for the rest of the window.
    LogLast,
    Suppress,
}

/// How many records each place in raft-rs's code (file and line) logged in its window.
#[derive(Default)]
struct PlaceLimits {
    places: Mutex<HashMap<(&'static str, u32), PlaceWindow>>,
}

struct PlaceWindow {
    started: Instant,
    logged: u32,
}

impl PlaceLimits {
    fn admit(&self, place: (&'static str, u32), now: Instant) -> Admission {
        let mut places = self
            .places
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let window = places.entry(place).or_insert(PlaceWindow {
            started: now,
            logged: 0,
        });
        if now.saturating_duration_since(window.started) >= PLACE_WINDOW {
            window.started = now;
            window.logged = 0;
        }
        if window.logged >= RECORDS_PER_PLACE {
            return Admission::Suppress;
        }
        window.logged += 1;
        if window.logged == RECORDS_PER_PLACE {
            Admission::LogLast
        } else {
            Admission::Log
        }
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

/// The logger raft-rs groups of a node use: one per node, so that its limits are the node's.
pub(crate) fn raft_logger(node: u64) -> slog::Logger {
    let drain = TracingDrain {
        limits: PlaceLimits::default(),
    };
    slog::Logger::root(drain.fuse(), slog::o!("node" => node))
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
        RaftReplica::open(&config, 7, log, 0, Default::default(), &logger).unwrap();
        let lines = lines.lock().unwrap();
        assert!(!lines.is_empty(), "raft-rs logs as a group opens");
        for line in lines.iter() {
            assert!(
                line.contains(" group=7") && line.contains(" node=2"),
                "{line}"
            );
        }
    }

    #[test]
    fn a_place_logs_a_few_records_per_window_and_says_when_it_goes_quiet() {
        let limits = PlaceLimits::default();
        let start = Instant::now();
        let place = ("raft.rs", 2015);
        let answers: Vec<_> = (0..5).map(|_| limits.admit(place, start)).collect();
        assert_eq!(
            answers,
            [
                Admission::Log,
                Admission::Log,
                Admission::LogLast,
                Admission::Suppress,
                Admission::Suppress
            ]
        );
        // Another place has a window of its own.
        assert_eq!(limits.admit(("raft.rs", 1555), start), Admission::Log);
        // The next window logs again.
        let later = start + PLACE_WINDOW;
        assert_eq!(limits.admit(place, later), Admission::Log);
    }
}
