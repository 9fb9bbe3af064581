//! The server's settings: defaults < TOML file < environment < flags.
//!
//! Every setting has a default, so `concord serve` with no configuration serves a working
//! single node. The file uses the same names as the flags (with `_` for `-`); unknown keys are
//! errors, so a misspelt setting is never silently ignored.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use concord_engine::{BackendKind, ConsensusKind, EngineConfig, StateMachineSource, SyncMode};
use serde::Deserialize;

/// Everything `concord serve` needs, after the layers are merged.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// Where the stores live.
    pub data_dir: PathBuf,
    /// Where the HTTP API listens.
    pub http_addr: SocketAddr,
    /// Threads of the HTTP runtime.
    pub http_workers: usize,
    /// Raft worker threads (each syncs once per round for all its groups).
    pub raft_workers: usize,
    /// Storage backend.
    pub backend: BackendKind,
    /// Raft or solo.
    pub consensus: ConsensusKind,
    /// Groups the key space is split into (fixed for a data directory).
    pub groups: u32,
    /// Run the session logic natively instead of the bundled wasm plugin.
    pub native_sessions: bool,
    /// Sync each log write before acknowledging it.
    pub log_sync: bool,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// A request that takes longer is answered 504.
    pub request_timeout: Duration,
    /// A proposal that waits longer for its result is answered 504.
    pub proposal_timeout: Duration,
    /// Commands queued per group before requests are answered 503.
    pub proposal_queue_capacity: usize,
    /// Applied entries each group's log keeps behind its compaction point.
    pub log_keep_entries: u64,
    /// Payload bytes of applied entries all groups' logs keep together.
    pub log_keep_bytes: u64,
    /// Operations per batch request.
    pub batch_max_operations: usize,
    /// Log level: error, warn, info, debug, trace.
    pub log_level: String,
}

impl Default for Settings {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Settings {
            data_dir: PathBuf::from("data"),
            http_addr: SocketAddr::from(([127, 0, 0, 1], 7070)),
            http_workers: cores,
            raft_workers: 1,
            backend: BackendKind::Redb,
            consensus: ConsensusKind::Raft,
            groups: 8,
            native_sessions: false,
            log_sync: true,
            max_body_bytes: 1024 * 1024,
            request_timeout: Duration::from_secs(15),
            proposal_timeout: Duration::from_secs(10),
            proposal_queue_capacity: 65_536,
            log_keep_entries: 1024,
            log_keep_bytes: 64 * 1024 * 1024,
            batch_max_operations: 1000,
            log_level: "info".into(),
        }
    }
}

/// The TOML file's shape: every key optional, unknown keys refused.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSettings {
    /// See [`Settings::data_dir`].
    pub data_dir: Option<PathBuf>,
    /// See [`Settings::http_addr`].
    pub http_addr: Option<SocketAddr>,
    /// See [`Settings::http_workers`].
    pub http_workers: Option<usize>,
    /// See [`Settings::raft_workers`].
    pub raft_workers: Option<usize>,
    /// `mem`, `sled`, `redb` or `wal`.
    pub backend: Option<String>,
    /// `raft` or `solo`.
    pub consensus: Option<String>,
    /// See [`Settings::groups`].
    pub groups: Option<u32>,
    /// See [`Settings::native_sessions`].
    pub native_sessions: Option<bool>,
    /// See [`Settings::log_sync`].
    pub log_sync: Option<bool>,
    /// See [`Settings::max_body_bytes`].
    pub max_body_bytes: Option<usize>,
    /// Milliseconds.
    pub request_timeout_ms: Option<u64>,
    /// Milliseconds.
    pub proposal_timeout_ms: Option<u64>,
    /// See [`Settings::proposal_queue_capacity`].
    pub proposal_queue_capacity: Option<usize>,
    /// See [`Settings::log_keep_entries`].
    pub log_keep_entries: Option<u64>,
    /// See [`Settings::log_keep_bytes`].
    pub log_keep_bytes: Option<u64>,
    /// See [`Settings::batch_max_operations`].
    pub batch_max_operations: Option<usize>,
    /// See [`Settings::log_level`].
    pub log_level: Option<String>,
}

impl FileSettings {
    /// Reads and parses `path`; the error names the file and the problem.
    pub fn read(path: &Path) -> Result<FileSettings, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    }
}

impl Settings {
    /// `self` with every setting `layer` gives replaced. Flags and environment come in as a
    /// layer of the same shape (clap resolves flag-over-environment), applied after the file.
    pub fn overlay(mut self, layer: FileSettings) -> Result<Settings, String> {
        macro_rules! take {
            ($field:ident) => {
                if let Some(value) = layer.$field {
                    self.$field = value;
                }
            };
        }
        take!(data_dir);
        take!(http_addr);
        take!(http_workers);
        take!(raft_workers);
        take!(groups);
        take!(native_sessions);
        take!(log_sync);
        take!(max_body_bytes);
        take!(proposal_queue_capacity);
        take!(log_keep_entries);
        take!(log_keep_bytes);
        take!(batch_max_operations);
        take!(log_level);
        if let Some(word) = layer.backend {
            self.backend = word.parse().map_err(|e| format!("backend: {e}"))?;
        }
        if let Some(word) = layer.consensus {
            self.consensus = word.parse().map_err(|e| format!("consensus: {e}"))?;
        }
        if let Some(ms) = layer.request_timeout_ms {
            self.request_timeout = Duration::from_millis(ms);
        }
        if let Some(ms) = layer.proposal_timeout_ms {
            self.proposal_timeout = Duration::from_millis(ms);
        }
        Ok(self)
    }

    /// Checks what the types cannot, naming the setting. The engine's own settings are
    /// checked once, by `EngineConfig::validate` at the end.
    pub fn validate(&self) -> Result<(), String> {
        let checks: [(bool, &str); 7] = [
            (
                self.http_workers == 0 || self.http_workers > 256,
                "http_workers must be 1..=256",
            ),
            (
                self.max_body_bytes < 1024,
                "max_body_bytes must be at least 1024",
            ),
            (
                self.request_timeout.is_zero(),
                "request_timeout_ms must be above 0",
            ),
            (
                self.proposal_timeout.is_zero(),
                "proposal_timeout_ms must be above 0",
            ),
            (
                self.proposal_queue_capacity == 0,
                "proposal_queue_capacity must be above 0",
            ),
            (
                self.batch_max_operations == 0 || self.batch_max_operations > 10_000,
                "batch_max_operations must be 1..=10000",
            ),
            (
                !["error", "warn", "info", "debug", "trace"].contains(&self.log_level.as_str()),
                "log_level must be error, warn, info, debug or trace",
            ),
        ];
        match checks.iter().find(|(wrong, _)| *wrong) {
            Some((_, message)) => Err((*message).into()),
            None => self.engine_config().validate(),
        }
    }

    /// The engine's configuration.
    pub fn engine_config(&self) -> EngineConfig {
        let mut config = EngineConfig::new(&self.data_dir);
        config.backend = self.backend;
        config.consensus = self.consensus;
        config.groups = self.groups;
        config.raft_workers = self.raft_workers;
        config.log_sync = if self.log_sync {
            SyncMode::Sync
        } else {
            SyncMode::NoSync
        };
        config.state_machine = if self.native_sessions {
            StateMachineSource::NativeSession
        } else {
            StateMachineSource::SessionPlugin
        };
        config.proposal_timeout = self.proposal_timeout;
        config.proposal_queue_capacity = self.proposal_queue_capacity;
        config.log_keep_entries = self.log_keep_entries;
        config.log_keep_bytes = self.log_keep_bytes;
        config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_layers_win_and_unknown_keys_are_refused() {
        let file: FileSettings = toml::from_str(
            "groups = 4\nbackend = \"sled\"\nrequest_timeout_ms = 500\nlog_keep_entries = 64\n\
             log_keep_bytes = 4096\n",
        )
        .unwrap();
        let flags = FileSettings {
            groups: Some(16),
            ..FileSettings::default()
        };
        let settings = Settings::default()
            .overlay(file)
            .unwrap()
            .overlay(flags)
            .unwrap();
        assert_eq!(settings.groups, 16);
        assert_eq!(settings.backend, BackendKind::Sled);
        assert_eq!(settings.request_timeout, Duration::from_millis(500));
        assert_eq!(settings.http_addr, Settings::default().http_addr);
        assert_eq!(settings.engine_config().log_keep_entries, 64);
        assert_eq!(settings.engine_config().log_keep_bytes, 4096);

        let error = toml::from_str::<FileSettings>("grups = 4").unwrap_err();
        assert!(
            error.to_string().contains("unknown field `grups`"),
            "{error}"
        );
        let bad = FileSettings {
            backend: Some("tape".into()),
            ..FileSettings::default()
        };
        assert!(
            Settings::default()
                .overlay(bad)
                .unwrap_err()
                .contains("backend")
        );
        let zero = Settings {
            groups: 0,
            ..Settings::default()
        };
        assert!(zero.validate().unwrap_err().contains("groups"));
        let keep_nothing = Settings {
            log_keep_entries: 0,
            ..Settings::default()
        };
        assert!(
            keep_nothing
                .validate()
                .unwrap_err()
                .contains("log_keep_entries")
        );
    }
}
