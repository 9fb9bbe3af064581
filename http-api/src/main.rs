//! `concord`: the Concord server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use concord_http::{FileSettings, Settings};

#[derive(Parser)]
#[command(
    name = "concord",
    version,
    about = "Concord: a replicated storage engine serving MQTT-style sessions over HTTP",
    after_help = "Settings are layered: built-in defaults < the TOML file of --config < \
                  CONCORD_* environment variables < flags. The file's keys are the flags' names \
                  with '_' for '-'; unknown keys are errors."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API (with no settings: redb under ./data, the session plugin,
    /// http://127.0.0.1:7070).
    Serve(ServeArgs),
}

#[derive(Args)]
struct ServeArgs {
    /// A TOML file of settings.
    #[arg(long, env = "CONCORD_CONFIG")]
    config: Option<PathBuf>,
    /// Where the data lives [default: data].
    #[arg(long, env = "CONCORD_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Address the HTTP API listens on; port 0 picks a free one [default: 127.0.0.1:7070].
    #[arg(long, env = "CONCORD_HTTP_ADDR")]
    http_addr: Option<SocketAddr>,
    /// Threads of the HTTP runtime [default: the number of cores].
    #[arg(long, env = "CONCORD_HTTP_WORKERS")]
    http_workers: Option<usize>,
    /// Raft worker threads; each syncs once per round for all its groups [default: 1].
    #[arg(long, env = "CONCORD_RAFT_WORKERS")]
    raft_workers: Option<usize>,
    /// Storage backend: mem, sled, redb or wal (log in Concord's WAL, state in redb)
    /// [default: redb].
    #[arg(long, env = "CONCORD_BACKEND")]
    backend: Option<String>,
    /// raft, or solo (no replication, for measuring raft's cost) [default: raft].
    #[arg(long, env = "CONCORD_CONSENSUS")]
    consensus: Option<String>,
    /// Raft groups the keys are spread over; fixed once the data directory exists
    /// [default: 8].
    #[arg(long, env = "CONCORD_GROUPS")]
    groups: Option<u32>,
    /// Run the session logic natively instead of the bundled wasm plugin [default: false].
    #[arg(long, env = "CONCORD_NATIVE_SESSIONS")]
    native_sessions: Option<bool>,
    /// Sync every log write before acknowledging it; false loses acknowledged writes on a
    /// crash (benchmarks only) [default: true].
    #[arg(long, env = "CONCORD_LOG_SYNC")]
    log_sync: Option<bool>,
    /// Largest request body in bytes; larger ones get 413 [default: 1048576].
    #[arg(long, env = "CONCORD_MAX_BODY_BYTES")]
    max_body_bytes: Option<usize>,
    /// A request taking longer is answered 504 [default: 15000].
    #[arg(long, env = "CONCORD_REQUEST_TIMEOUT_MS")]
    request_timeout_ms: Option<u64>,
    /// A write waiting longer for its result is answered 504 [default: 10000].
    #[arg(long, env = "CONCORD_PROPOSAL_TIMEOUT_MS")]
    proposal_timeout_ms: Option<u64>,
    /// Writes queued per group before requests are answered 503 with Retry-After
    /// [default: 65536].
    #[arg(long, env = "CONCORD_PROPOSAL_QUEUE_CAPACITY")]
    proposal_queue_capacity: Option<usize>,
    /// Applied entries each group's raft log keeps behind its compaction point [default: 1024].
    #[arg(long, env = "CONCORD_LOG_KEEP_ENTRIES")]
    log_keep_entries: Option<u64>,
    /// Payload bytes of applied entries all groups' raft logs keep together (an equal share
    /// each); the logs are held in memory, so this bounds their memory [default: 67108864].
    #[arg(long, env = "CONCORD_LOG_KEEP_BYTES")]
    log_keep_bytes: Option<u64>,
    /// Operations per POST /v1/sessions/batch [default: 1000].
    #[arg(long, env = "CONCORD_BATCH_MAX_OPERATIONS")]
    batch_max_operations: Option<usize>,
    /// error, warn, info, debug or trace [default: info].
    #[arg(long, env = "CONCORD_LOG_LEVEL")]
    log_level: Option<String>,
}

impl ServeArgs {
    fn settings(self) -> Result<Settings, String> {
        let file = match &self.config {
            Some(path) => FileSettings::read(path)?,
            None => FileSettings::default(),
        };
        let flags = FileSettings {
            data_dir: self.data_dir,
            http_addr: self.http_addr,
            http_workers: self.http_workers,
            raft_workers: self.raft_workers,
            backend: self.backend,
            consensus: self.consensus,
            groups: self.groups,
            native_sessions: self.native_sessions,
            log_sync: self.log_sync,
            max_body_bytes: self.max_body_bytes,
            request_timeout_ms: self.request_timeout_ms,
            proposal_timeout_ms: self.proposal_timeout_ms,
            proposal_queue_capacity: self.proposal_queue_capacity,
            log_keep_entries: self.log_keep_entries,
            log_keep_bytes: self.log_keep_bytes,
            batch_max_operations: self.batch_max_operations,
            log_level: self.log_level,
        };
        Settings::default().overlay(file)?.overlay(flags)
    }
}

fn main() -> ExitCode {
    let Command::Serve(args) = Cli::parse().command;
    let result = args.settings().and_then(|settings| {
        init_logging(&settings.log_level);
        concord_http::serve(settings)
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("concord: {error}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(level: &str) {
    let level = level.parse().unwrap_or(tracing::Level::INFO);
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
}
