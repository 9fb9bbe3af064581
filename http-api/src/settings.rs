//! The server's settings, declared once: [`Settings`] is at the same time the TOML file's
//! shape (serde), the flags and their `CONCORD_*` environment variables (clap), and the
//! defaults (`Default`). Layers: defaults < TOML file < environment < flags.
//!
//! Every setting has a default, so `concord serve` with no configuration serves a working
//! single node. The file uses the flags' names (with `_` for `-`); unknown keys are errors, so a
//! misspelt setting is never silently ignored.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::AdminToken;
use clap::{ArgAction, ArgMatches, Args, FromArgMatches};
use concord_engine::{
    BackendKind, ClusterConfig, ConsensusKind, EngineConfig, PeerTlsFiles, ServedPlugin,
    StateMachineSource, SyncMode,
};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The most `http_max_in_flight_operations` may be (a semaphore holds fewer than 2^29 permits).
const MAX_IN_FLIGHT_OPERATIONS: usize = 1_000_000;

/// The most `state_cache_mib` may be (1 TiB).
const MAX_STATE_CACHE_MIB: u64 = 1024 * 1024;

/// Everything `concord serve` needs. Flags and environment variables carry no default of
/// their own (clap leaves a setting it was not given alone), so a flag overrides the file
/// only when it is given.
#[derive(Clone, Debug, PartialEq, Args, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Where the data lives.
    #[arg(long, env = "CONCORD_DATA_DIR", required = false)]
    pub data_dir: PathBuf,
    /// Address the HTTP API listens on; port 0 picks a free one.
    #[arg(long, env = "CONCORD_HTTP_ADDR", required = false)]
    pub http_addr: SocketAddr,
    /// HTTP threads, each a runtime of its own serving the connections dealt to it (1–256;
    /// the default is the number of cores).
    #[arg(long, env = "CONCORD_HTTP_WORKERS", required = false)]
    pub http_workers: usize,
    /// Raft worker threads; each syncs once per round for all its groups. Two help a node of
    /// hundreds of busy groups on the mem backend use both of two cores; on wal they were no
    /// faster, and on redb, whose one file takes the workers' writes in turn, one does better.
    #[arg(long, env = "CONCORD_RAFT_WORKERS", required = false)]
    pub raft_workers: usize,
    /// Storage backend: mem, sled, redb or wal (log in Concord's WAL, state in redb). Unset:
    /// the one the data directory was made with, or wal for a new directory.
    #[arg(long, env = "CONCORD_BACKEND", required = false)]
    #[serde(
        deserialize_with = "optional_from_text",
        serialize_with = "optional_as_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub backend: Option<BackendKind>,
    /// raft, or solo (no replication, for measuring raft's cost).
    #[arg(long, env = "CONCORD_CONSENSUS", required = false)]
    #[serde(deserialize_with = "from_text", serialize_with = "as_text")]
    pub consensus: ConsensusKind,
    /// Raft groups the keys are spread over; fixed once the data directory exists.
    #[arg(long, env = "CONCORD_GROUPS", required = false)]
    pub groups: u32,
    /// A plugin to serve beside the sessions, `name=path.wasm` (repeatable; the environment
    /// variable and the file take a list): called at `/v1/plugins/{name}`. Served in the order
    /// given, each over `plugin_groups` groups; one may be added at the end later, not removed
    /// or reordered.
    #[arg(long, env = "CONCORD_PLUGIN", value_delimiter = ',', required = false)]
    pub plugin: Vec<String>,
    /// Groups each served plugin's keys are spread over; fixed once the data directory exists.
    #[arg(long, env = "CONCORD_PLUGIN_GROUPS", required = false)]
    pub plugin_groups: u32,
    /// Run the session logic natively instead of the bundled wasm plugin.
    #[arg(long, env = "CONCORD_NATIVE_SESSIONS", required = false, action = ArgAction::Set)]
    pub native_sessions: bool,
    /// Sync every log write before acknowledging it; false loses acknowledged writes on a
    /// crash (benchmarks only).
    #[arg(long, env = "CONCORD_LOG_SYNC", required = false, action = ArgAction::Set)]
    pub log_sync: bool,
    /// Largest request body in bytes (at least 1024); larger ones get 413.
    #[arg(long, env = "CONCORD_MAX_BODY_BYTES", required = false)]
    pub max_body_bytes: usize,
    /// A request taking longer is answered 504 (408 while its body has not arrived), at most a
    /// tenth of the timeout (and 100 ms) after it; on shutdown, requests in flight get this
    /// long to finish.
    #[arg(long, env = "CONCORD_REQUEST_TIMEOUT_MS", required = false)]
    pub request_timeout_ms: u64,
    /// Open HTTP connections at most; one more is answered 503 and closed. Lowered at start to
    /// fit the process's descriptor limit.
    #[arg(long, env = "CONCORD_HTTP_MAX_CONNECTIONS", required = false)]
    pub http_max_connections: usize,
    /// Session operations in progress at most (a request takes one place, a batch one more per
    /// operation, counted from its declared length until its body is parsed); past it a request
    /// is answered 503 with Retry-After at once, so that what is admitted is answered in bounded
    /// time and memory: under overload, admitted requests wait about this many over the rate.
    #[arg(long, env = "CONCORD_HTTP_MAX_IN_FLIGHT_OPERATIONS", required = false)]
    pub http_max_in_flight_operations: usize,
    /// A connection that has not sent a whole request head this long after it opened, or after
    /// its last answer, is closed: bounds idle keep-alive connections and slow senders.
    #[arg(long, env = "CONCORD_HTTP_HEADER_TIMEOUT_MS", required = false)]
    pub http_header_timeout_ms: u64,
    /// A write waiting longer for its result is answered 504.
    #[arg(long, env = "CONCORD_PROPOSAL_TIMEOUT_MS", required = false)]
    pub proposal_timeout_ms: u64,
    /// Writes queued per group before requests are answered 503 with Retry-After.
    #[arg(long, env = "CONCORD_PROPOSAL_QUEUE_CAPACITY", required = false)]
    pub proposal_queue_capacity: usize,
    /// Applied entries each group's raft log keeps behind its compaction point.
    #[arg(long, env = "CONCORD_LOG_KEEP_ENTRIES", required = false)]
    pub log_keep_entries: u64,
    /// A member this many entries behind its leader is sent a snapshot of the group's state
    /// instead of the log (the log no longer waits for it).
    #[arg(long, env = "CONCORD_SNAPSHOT_LAG_ENTRIES", required = false)]
    pub snapshot_lag_entries: u64,
    /// Payload bytes of applied entries all groups' raft logs keep together (an equal share
    /// each); the logs are held in memory, so this bounds their memory.
    #[arg(long, env = "CONCORD_LOG_KEEP_BYTES", required = false)]
    pub log_keep_bytes: u64,
    /// Page cache of the state file (redb and wal backends), in MiB (1–1048576). A larger one
    /// reads fewer pages back from the file (none once the state fits) and lets a flush keep
    /// more of the pages it changes in memory until it commits; memory grows by as much.
    #[arg(long, env = "CONCORD_STATE_CACHE_MIB", required = false)]
    pub state_cache_mib: u64,
    /// How long a raft tick lasts, in milliseconds (20–1000): leaders send heartbeats every
    /// tick, a follower that hears nothing for 10–20 ticks starts an election, a leader's
    /// lease lasts nine tenths of 9 ticks (the shortest member's: each says its own when it
    /// connects). Longer for members far apart; the same on every member.
    #[arg(long, env = "CONCORD_RAFT_TICK_MS", required = false)]
    pub raft_tick_ms: u64,
    /// Raft ticks (`raft_tick_ms` each) a group must stay idle before it sleeps (no ticks, no
    /// heartbeats between members until something wakes it); 0 never.
    #[arg(long, env = "CONCORD_SLEEP_AFTER_TICKS", required = false)]
    pub sleep_after_ticks: usize,
    /// A raft log write (with its sync) slower than this many milliseconds makes the member
    /// hand the groups it leads to other members, so that a stalling disk does not hold the
    /// cluster's writes to its pace; 0 never.
    #[arg(long, env = "CONCORD_SLOW_LOG_WRITE_MS", required = false)]
    pub slow_log_write_ms: u64,
    /// The longest, in microseconds, an idle raft or apply thread yields the CPU watching for
    /// work before it parks. Each thread watches only as long as work has lately come back
    /// within this bound, and stops as soon as another thread wants its CPU, so a saturated or
    /// a quiet server spends nothing on it; a server answering one client's requests back to
    /// back keeps the threads awake between them (lower latency for more CPU). 0 parks at once.
    #[arg(long, env = "CONCORD_IDLE_SPIN_US", required = false)]
    pub idle_spin_us: u64,
    /// How often this node removes the expired sessions of the groups it leads, through the
    /// log; 0 never.
    #[arg(long, env = "CONCORD_SESSION_EXPIRY_SCAN_MS", required = false)]
    pub session_expiry_scan_ms: u64,
    /// Operations per POST /v1/sessions/batch (1–10000).
    #[arg(long, env = "CONCORD_BATCH_MAX_OPERATIONS", required = false)]
    pub batch_max_operations: usize,
    /// error, warn, info, debug or trace. raft-rs's own debug records are in a release build
    /// only with the `raft-debug-log` feature.
    #[arg(long, env = "CONCORD_LOG_LEVEL", required = false)]
    pub log_level: String,
    /// Every member of the cluster and its raft address, `1=host:port,2=host:port,...`, the
    /// same on every member; empty runs this node alone.
    #[arg(long, env = "CONCORD_INITIAL_CLUSTER", required = false)]
    pub initial_cluster: String,
    /// `new` when every member starts a new cluster together; `existing` for a member that
    /// joins a cluster with data (it lost its own): it votes only once it has caught up.
    #[arg(long, env = "CONCORD_INITIAL_CLUSTER_STATE", required = false)]
    pub initial_cluster_state: String,
    /// This node's id among the members of --initial-cluster.
    #[arg(long, env = "CONCORD_NODE_ID", required = false)]
    pub node_id: u64,
    /// Names the cluster; a peer of another cluster is refused.
    #[arg(long, env = "CONCORD_CLUSTER_ID", required = false)]
    pub cluster_id: u64,
    /// Where to listen for peers, if not this node's address in --initial-cluster (behind a
    /// NAT, say).
    #[arg(long, env = "CONCORD_RAFT_ADDR", required = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raft_addr: Option<SocketAddr>,
    /// The URL clients reach this node's HTTP API at, told to the other members so that a
    /// 421 answer can name the leader's URL; `http://` (`https://` with TLS) and the HTTP address bound if not
    /// given (with this member's raft host when bound to all interfaces).
    #[arg(long, env = "CONCORD_ADVERTISE_URL", required = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advertise_url: Option<String>,
    /// Mutual TLS between the members: the PEM file of the cluster's CA (with
    /// --peer-tls-cert and --peer-tls-key; every member uses TLS, or none).
    #[arg(long, env = "CONCORD_PEER_TLS_CA", required = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_tls_ca: Option<PathBuf>,
    /// This member's certificate (PEM), signed by the CA and naming its raft IP address.
    #[arg(long, env = "CONCORD_PEER_TLS_CERT", required = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_tls_cert: Option<PathBuf>,
    /// This member's private key (PEM).
    #[arg(long, env = "CONCORD_PEER_TLS_KEY", required = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_tls_key: Option<PathBuf>,
    /// A file holding the admin token (16 or more visible ASCII characters): the routes that
    /// change the cluster (membership, leadership) then require `Authorization: Bearer
    /// <token>`. Without it they are open to anyone who reaches the HTTP address.
    #[arg(long, env = "CONCORD_ADMIN_TOKEN_FILE", required = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_token_file: Option<PathBuf>,
    /// The HTTP listener speaks TLS with this certificate chain (PEM, leaf first; with
    /// --http-tls-key).
    #[arg(long, env = "CONCORD_HTTP_TLS_CERT", required = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_tls_cert: Option<PathBuf>,
    /// The private key of --http-tls-cert (PEM).
    #[arg(long, env = "CONCORD_HTTP_TLS_KEY", required = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_tls_key: Option<PathBuf>,
}

impl Default for Settings {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Settings {
            data_dir: PathBuf::from("data"),
            http_addr: SocketAddr::from(([127, 0, 0, 1], 7070)),
            http_workers: cores,
            raft_workers: 1,
            backend: None,
            consensus: ConsensusKind::Raft,
            groups: 8,
            plugin: Vec::new(),
            plugin_groups: 4,
            native_sessions: false,
            log_sync: true,
            max_body_bytes: 1024 * 1024,
            request_timeout_ms: 15_000,
            http_max_connections: 10_000,
            http_max_in_flight_operations: 16_384,
            http_header_timeout_ms: 30_000,
            proposal_timeout_ms: 10_000,
            proposal_queue_capacity: 65_536,
            log_keep_entries: 1024,
            snapshot_lag_entries: 10_000,
            log_keep_bytes: 64 * 1024 * 1024,
            state_cache_mib: (concord_engine::DEFAULT_STATE_CACHE_BYTES >> 20) as u64,
            raft_tick_ms: 100,
            sleep_after_ticks: 20,
            slow_log_write_ms: 250,
            idle_spin_us: 500,
            batch_max_operations: 1000,
            session_expiry_scan_ms: 10_000,
            log_level: "info".into(),
            initial_cluster: String::new(),
            initial_cluster_state: "new".into(),
            node_id: 1,
            cluster_id: 1,
            raft_addr: None,
            advertise_url: None,
            peer_tls_ca: None,
            peer_tls_cert: None,
            peer_tls_key: None,
            admin_token_file: None,
            http_tls_cert: None,
            http_tls_key: None,
        }
    }
}

/// Why the settings could not be taken.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SettingsError {
    /// The settings file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The settings file is not valid TOML of the settings' shape (an unknown key, a wrong
    /// type).
    #[error("{path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the line.
        message: String,
    },
    /// A flag or environment variable has a value of the wrong form.
    #[error("{0}")]
    Flag(String),
    /// A setting is out of its range.
    #[error("{setting} {problem}")]
    Invalid {
        /// The setting's name, as in the file.
        setting: &'static str,
        /// What is wrong.
        problem: &'static str,
    },
    /// The cluster settings are not valid: `initial_cluster` is not `id=host:port,...`, or
    /// the peer TLS files are not all three given, or given to a node alone.
    #[error("cluster settings: {0}")]
    Cluster(String),
    /// The HTTP listener's certificate or key cannot be used.
    #[error("HTTP TLS: {0}")]
    HttpTls(String),
    /// The admin token file cannot be read or holds no usable token.
    #[error("{0}")]
    AdminToken(String),
    /// The engine refused the configuration the settings make.
    #[error("{0}")]
    Engine(String),
}

impl Settings {
    /// The settings of `matches` (the `serve` command's arguments, of [`Settings::command`]):
    /// the defaults, then the file of `--config` if given, then what flags and environment
    /// variables set; validated.
    pub fn from_layers(matches: &ArgMatches) -> Result<Settings, SettingsError> {
        let mut settings = match matches.get_one::<PathBuf>("config") {
            Some(path) => Settings::read_file(path)?,
            None => Settings::default(),
        };
        settings
            .update_from_arg_matches(matches)
            .map_err(|error| SettingsError::Flag(error.to_string()))?;
        settings.validate()?;
        Ok(settings)
    }

    /// The settings of a TOML file over the defaults.
    pub fn read_file(path: &Path) -> Result<Settings, SettingsError> {
        let text = std::fs::read_to_string(path).map_err(|source| SettingsError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        toml::from_str(&text).map_err(|error| SettingsError::File {
            path: path.to_path_buf(),
            message: error.to_string(),
        })
    }

    /// `command` with a `--config FILE` argument and every setting as a flag, each flag's
    /// help ending with its default.
    pub fn command(command: clap::Command) -> clap::Command {
        let command = command.arg(
            clap::Arg::new("config")
                .long("config")
                .env("CONCORD_CONFIG")
                .value_name("FILE")
                .value_parser(clap::value_parser!(PathBuf))
                .help("A TOML file of settings"),
        );
        let mut command = Settings::augment_args(command);
        let defaults = match serde_json::to_value(Settings::default()) {
            Ok(serde_json::Value::Object(fields)) => fields,
            _ => serde_json::Map::new(),
        };
        for (name, value) in defaults {
            let shown = match value {
                serde_json::Value::String(text) => text,
                other => other.to_string(),
            };
            command = command.mut_arg(name.as_str(), |arg| {
                let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
                arg.help(format!("{help} [default: {shown}]"))
            });
        }
        command
    }

    /// Checks what the types cannot, naming the setting. The engine's own settings are
    /// checked once, by `EngineConfig::validate` at the end.
    pub fn validate(&self) -> Result<(), SettingsError> {
        let checks: [(bool, &'static str, &'static str); 13] = [
            (
                self.http_workers == 0 || self.http_workers > 256,
                "http_workers",
                "must be 1..=256",
            ),
            (
                self.max_body_bytes < 1024,
                "max_body_bytes",
                "must be at least 1024",
            ),
            (
                self.request_timeout_ms == 0,
                "request_timeout_ms",
                "must be above 0",
            ),
            (
                self.http_max_connections == 0,
                "http_max_connections",
                "must be above 0",
            ),
            (
                self.http_max_in_flight_operations == 0
                    || self.http_max_in_flight_operations > MAX_IN_FLIGHT_OPERATIONS,
                "http_max_in_flight_operations",
                "must be 1..=1000000",
            ),
            (
                self.http_header_timeout_ms == 0,
                "http_header_timeout_ms",
                "must be above 0",
            ),
            (
                self.proposal_timeout_ms == 0,
                "proposal_timeout_ms",
                "must be above 0",
            ),
            (
                self.proposal_queue_capacity == 0,
                "proposal_queue_capacity",
                "must be above 0",
            ),
            (
                self.batch_max_operations == 0 || self.batch_max_operations > 10_000,
                "batch_max_operations",
                "must be 1..=10000",
            ),
            (
                !["new", "existing"].contains(&self.initial_cluster_state.as_str()),
                "initial_cluster_state",
                "must be new or existing",
            ),
            (
                !(concord_engine::MIN_RAFT_TICK.as_millis()
                    ..=concord_engine::MAX_RAFT_TICK.as_millis())
                    .contains(&u128::from(self.raft_tick_ms)),
                "raft_tick_ms",
                "must be 20..=1000",
            ),
            (
                self.state_cache_mib == 0 || self.state_cache_mib > MAX_STATE_CACHE_MIB,
                "state_cache_mib",
                "must be 1..=1048576",
            ),
            (
                !["error", "warn", "info", "debug", "trace"].contains(&self.log_level.as_str()),
                "log_level",
                "must be error, warn, info, debug or trace",
            ),
        ];
        if let Some(&(_, setting, problem)) = checks.iter().find(|(wrong, _, _)| *wrong) {
            return Err(SettingsError::Invalid { setting, problem });
        }
        if self.http_max_in_flight_operations <= self.batch_max_operations {
            return Err(SettingsError::Invalid {
                setting: "http_max_in_flight_operations",
                problem: "must be more than batch_max_operations, or no whole batch is admitted",
            });
        }
        self.engine_config()?
            .validate()
            .map_err(SettingsError::Engine)
    }

    /// A request taking longer is answered 504.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }

    /// The admin token, read from `admin_token_file`.
    pub fn admin_token(&self) -> Result<Option<AdminToken>, SettingsError> {
        self.admin_token_file
            .as_deref()
            .map(AdminToken::from_file)
            .transpose()
            .map_err(SettingsError::AdminToken)
    }

    /// The HTTP listener's TLS settings, if `http_tls_cert` and `http_tls_key` are given.
    pub fn http_tls(&self) -> Result<Option<Arc<rustls::ServerConfig>>, SettingsError> {
        match (&self.http_tls_cert, &self.http_tls_key) {
            (None, None) => Ok(None),
            (Some(cert), Some(key)) => crate::http_tls::server_config(cert, key)
                .map(Some)
                .map_err(SettingsError::HttpTls),
            _ => Err(SettingsError::HttpTls(
                "http_tls_cert and http_tls_key go together".into(),
            )),
        }
    }

    /// See `http_header_timeout_ms`.
    pub fn http_header_timeout(&self) -> Duration {
        Duration::from_millis(self.http_header_timeout_ms)
    }

    /// The engine's configuration.
    pub fn engine_config(&self) -> Result<EngineConfig, SettingsError> {
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
        for served in &self.plugin {
            let (name, path) = served.split_once('=').ok_or_else(|| {
                SettingsError::Engine(format!(
                    "--plugin {served:?}: expected name=path.wasm, e.g. kv=plugins/kv.wasm"
                ))
            })?;
            config.plugins.push(ServedPlugin {
                name: name.trim().to_string(),
                source: StateMachineSource::PluginFile(PathBuf::from(path.trim())),
                groups: self.plugin_groups,
            });
        }
        config.proposal_timeout = Duration::from_millis(self.proposal_timeout_ms);
        config.proposal_queue_capacity = self.proposal_queue_capacity;
        config.log_keep_entries = self.log_keep_entries;
        config.snapshot_lag_entries = self.snapshot_lag_entries;
        config.log_keep_bytes = self.log_keep_bytes;
        config.state_cache_bytes = usize::try_from(self.state_cache_mib)
            .ok()
            .and_then(|mib| mib.checked_mul(1024 * 1024))
            .ok_or_else(|| {
                SettingsError::Engine(format!(
                    "state_cache_mib {} is more than this machine can address",
                    self.state_cache_mib
                ))
            })?;
        config.raft_tick = Duration::from_millis(self.raft_tick_ms);
        config.sleep_after_ticks = self.sleep_after_ticks;
        config.slow_log_write =
            (self.slow_log_write_ms > 0).then(|| Duration::from_millis(self.slow_log_write_ms));
        config.idle_spin = Duration::from_micros(self.idle_spin_us);
        let tls = match (&self.peer_tls_ca, &self.peer_tls_cert, &self.peer_tls_key) {
            (None, None, None) => None,
            (Some(ca), Some(cert), Some(key)) => Some(PeerTlsFiles {
                ca: ca.clone(),
                cert: cert.clone(),
                key: key.clone(),
            }),
            _ => {
                return Err(SettingsError::Cluster(
                    "--peer-tls-ca, --peer-tls-cert and --peer-tls-key go together".into(),
                ));
            }
        };
        if tls.is_some() && self.initial_cluster.trim().is_empty() {
            return Err(SettingsError::Cluster(
                "--peer-tls-* needs --initial-cluster: a node alone has no peers".into(),
            ));
        }
        if !self.initial_cluster.trim().is_empty() {
            let members = ClusterConfig::parse_members(&self.initial_cluster)
                .map_err(SettingsError::Cluster)?;
            config.cluster = Some(ClusterConfig {
                cluster_id: self.cluster_id,
                node_id: self.node_id,
                members,
                listen_addr: self.raft_addr,
                client_url: self.advertise_url.clone(),
                joins_existing: self.initial_cluster_state == "existing",
                tls,
            });
        }
        Ok(config)
    }
}

/// Reads a setting written as its name (`backend = "wal"`).
fn from_text<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: std::str::FromStr<Err = String>,
{
    let text = String::deserialize(deserializer)?;
    text.parse().map_err(serde::de::Error::custom)
}

/// Reads an optional setting written as its name.
fn optional_from_text<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: std::str::FromStr<Err = String>,
{
    from_text(deserializer).map(Some)
}

/// Writes an optional setting, when set, as its name.
fn optional_as_text<S, T>(value: &Option<T>, serializer: S) -> Result<S::Ok, S::Error>
where
    S: Serializer,
    T: std::fmt::Display,
{
    match value {
        Some(value) => as_text(value, serializer),
        None => serializer.serialize_none(),
    }
}

/// Writes a setting as its name.
fn as_text<S, T>(value: &T, serializer: S) -> Result<S::Ok, S::Error>
where
    S: Serializer,
    T: std::fmt::Display,
{
    serializer.collect_str(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Settings, SettingsError> {
        let command = Settings::command(clap::Command::new("serve").no_binary_name(true));
        let matches = command
            .try_get_matches_from(args)
            .map_err(|e| SettingsError::Flag(e.to_string()))?;
        Settings::from_layers(&matches)
    }

    #[test]
    fn served_plugins_come_from_flags_or_the_file_in_order() {
        let settings = parse(&[
            "--plugin",
            "kv=plugins/kv.wasm",
            "--plugin",
            "counter = c.wasm",
            "--plugin-groups",
            "3",
        ])
        .unwrap();
        let config = settings.engine_config().unwrap();
        let served: Vec<(&str, u32)> = config
            .plugins
            .iter()
            .map(|p| (p.name.as_str(), p.groups))
            .collect();
        assert_eq!(served, [("kv", 3), ("counter", 3)]);
        assert_eq!(
            config.plugins[1].source,
            StateMachineSource::PluginFile("c.wasm".into())
        );

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("concord.toml");
        std::fs::write(&file, "plugin = [\"kv=kv.wasm\"]\n").unwrap();
        let settings = parse(&["--config", file.to_str().unwrap()]).unwrap();
        assert_eq!(settings.engine_config().unwrap().plugins[0].name, "kv");

        let error = parse(&["--plugin", "kv.wasm"]).unwrap_err();
        assert!(
            error.to_string().contains("expected name=path.wasm"),
            "{error}"
        );
        let error = parse(&["--plugin", "Bad Name=x.wasm"]).unwrap_err();
        assert!(error.to_string().contains("plugin name"), "{error}");
        let error = parse(&["--plugin", "kv=a.wasm", "--plugin", "kv=b.wasm"]).unwrap_err();
        assert!(error.to_string().contains("served twice"), "{error}");
        let error = parse(&["--plugin", "session=s.wasm"]).unwrap_err();
        assert!(error.to_string().contains("cannot be named"), "{error}");
    }

    #[test]
    fn later_layers_win_and_unknown_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("concord.toml");
        std::fs::write(
            &file,
            "groups = 4\nbackend = \"sled\"\nrequest_timeout_ms = 500\nlog_keep_entries = 64\n\
             log_keep_bytes = 4096\nlog_sync = false\nstate_cache_mib = 256\n",
        )
        .unwrap();
        let settings = parse(&["--config", file.to_str().unwrap(), "--groups", "16"]).unwrap();
        assert_eq!(settings.groups, 16, "the flag wins over the file");
        assert_eq!(
            settings.backend,
            Some(BackendKind::Sled),
            "the file wins over the default"
        );
        assert!(!settings.log_sync);
        assert_eq!(settings.request_timeout(), Duration::from_millis(500));
        assert_eq!(settings.http_addr, Settings::default().http_addr);
        assert_eq!(settings.engine_config().unwrap().log_keep_entries, 64);
        assert_eq!(settings.engine_config().unwrap().log_keep_bytes, 4096);
        assert_eq!(
            settings.engine_config().unwrap().state_cache_bytes,
            256 * 1024 * 1024
        );
        assert_eq!(
            settings.engine_config().unwrap().idle_spin,
            Duration::from_micros(500)
        );
        let parking = parse(&["--idle-spin-us", "0"]).unwrap();
        assert_eq!(parking.engine_config().unwrap().idle_spin, Duration::ZERO);
        // A flag given with the default's value still overrides the file.
        let settings = parse(&["--config", file.to_str().unwrap(), "--log-sync", "true"]).unwrap();
        assert!(settings.log_sync);

        std::fs::write(&file, "grups = 4").unwrap();
        let error = parse(&["--config", file.to_str().unwrap()]).unwrap_err();
        assert!(
            error.to_string().contains("unknown field `grups`"),
            "{error}"
        );
        let error = parse(&["--backend", "tape"]).unwrap_err();
        assert!(error.to_string().contains("tape"), "{error}");
        std::fs::write(&file, "consensus = \"paxos\"").unwrap();
        let error = parse(&["--config", file.to_str().unwrap()]).unwrap_err();
        assert!(error.to_string().contains("paxos"), "{error}");
        assert!(matches!(
            parse(&["--groups", "0"]).unwrap_err(),
            SettingsError::Engine(message) if message.contains("groups")
        ));
        assert!(matches!(
            parse(&["--log-keep-entries", "0"]).unwrap_err(),
            SettingsError::Engine(message) if message.contains("log_keep_entries")
        ));
        let clustered = parse(&[
            "--initial-cluster",
            "1=127.0.0.1:7170, 2=127.0.0.1:7171,3=127.0.0.1:7172",
            "--node-id",
            "2",
        ])
        .unwrap();
        let cluster = clustered.engine_config().unwrap().cluster.unwrap();
        assert_eq!((cluster.node_id, cluster.members.len()), (2, 3));
        assert!(matches!(
            parse(&["--initial-cluster", "1=127.0.0.1:7170,2=nowhere"]).unwrap_err(),
            SettingsError::Cluster(message) if message.contains("nowhere")
        ));
        assert!(matches!(
            parse(&["--initial-cluster", "1=127.0.0.1:7170", "--node-id", "4"]).unwrap_err(),
            SettingsError::Engine(message) if message.contains("node_id 4")
        ));
        assert!(matches!(
            parse(&["--http-workers", "0"]).unwrap_err(),
            SettingsError::Invalid {
                setting: "http_workers",
                ..
            }
        ));
        assert_eq!(
            parse(&["--raft-tick-ms", "250"])
                .unwrap()
                .engine_config()
                .unwrap()
                .raft_tick,
            Duration::from_millis(250)
        );
        for tick_ms in ["19", "1001"] {
            assert!(matches!(
                parse(&["--raft-tick-ms", tick_ms]).unwrap_err(),
                SettingsError::Invalid {
                    setting: "raft_tick_ms",
                    ..
                }
            ));
        }
        for cache_mib in ["0", "1048577"] {
            assert!(matches!(
                parse(&["--state-cache-mib", cache_mib]).unwrap_err(),
                SettingsError::Invalid {
                    setting: "state_cache_mib",
                    ..
                }
            ));
        }
        let joining = parse(&[
            "--initial-cluster",
            "1=127.0.0.1:7170,2=127.0.0.1:7171",
            "--initial-cluster-state",
            "existing",
        ])
        .unwrap();
        assert!(
            joining
                .engine_config()
                .unwrap()
                .cluster
                .unwrap()
                .joins_existing
        );
        assert!(
            !clustered
                .engine_config()
                .unwrap()
                .cluster
                .unwrap()
                .joins_existing
        );
        let tls_flags = [
            "--peer-tls-ca",
            "ca.pem",
            "--peer-tls-cert",
            "n1.pem",
            "--peer-tls-key",
            "n1.key",
        ];
        let with_tls =
            parse(&[&["--initial-cluster", "1=127.0.0.1:7170"], &tls_flags[..]].concat()).unwrap();
        let tls = with_tls
            .engine_config()
            .unwrap()
            .cluster
            .unwrap()
            .tls
            .unwrap();
        assert_eq!(tls.key, PathBuf::from("n1.key"));
        assert!(matches!(
            parse(&["--initial-cluster", "1=127.0.0.1:7170", "--peer-tls-ca", "ca.pem"])
                .unwrap_err(),
            SettingsError::Cluster(message) if message.contains("together")
        ));
        assert!(matches!(
            parse(&tls_flags).unwrap_err(),
            SettingsError::Cluster(message) if message.contains("alone")
        ));
        assert!(matches!(
            parse(&["--initial-cluster-state", "old"]).unwrap_err(),
            SettingsError::Invalid {
                setting: "initial_cluster_state",
                ..
            }
        ));
    }

    #[test]
    fn every_flag_shows_its_default() {
        let help = Settings::command(clap::Command::new("serve"))
            .render_help()
            .to_string();
        assert!(help.contains("wal for a new directory"), "{help}");
        assert!(help.contains("[default: 127.0.0.1:7070]"), "{help}");
        assert!(help.contains("[default: 15000]"), "{help}");
        assert!(help.contains("CONCORD_LOG_KEEP_BYTES"), "{help}");
    }
}
