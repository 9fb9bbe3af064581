//! `concord-bench`: Concord's load generator and benchmark runner.
//!
//! Prints a readable table and, for each case, one JSON line (the lines starting with `{`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use concord_bench::storage::{self, StorageBenchConfig};
use concord_engine::{BackendKind, SyncMode};

#[derive(Parser)]
#[command(
    name = "concord-bench",
    about = "Benchmarks of Concord's layers, side by side"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// LogStore appends (backend x batch x groups x sync) and StateStore commits (backend x
    /// batch), after a raw fdatasync probe of the same disk.
    Storage {
        /// Backends to compare: mem, sled, redb.
        #[arg(long, value_delimiter = ',', default_value = "mem,sled,redb")]
        backends: Vec<BackendKind>,
        /// Entries per group per log write, and puts per state commit.
        #[arg(long, value_delimiter = ',', default_value = "1,64,1024")]
        batch_sizes: Vec<u64>,
        /// Groups per log write.
        #[arg(long, value_delimiter = ',', default_value = "1,16")]
        groups: Vec<u64>,
        /// Sync modes of the disk backends: on, off.
        #[arg(long, value_delimiter = ',', default_value = "on,off")]
        sync: Vec<String>,
        /// Seconds each case runs.
        #[arg(long, default_value_t = 2.0)]
        duration_secs: f64,
        /// Payload bytes per entry and per state value.
        #[arg(long, default_value_t = 150)]
        payload_bytes: usize,
        /// Directory for scratch data (put it on the disk you want to measure).
        #[arg(long, default_value = "bench-scratch")]
        scratch_dir: PathBuf,
    },
}

fn parse_sync(word: &str) -> Result<SyncMode, String> {
    match word {
        "on" => Ok(SyncMode::Sync),
        "off" => Ok(SyncMode::NoSync),
        other => Err(format!("--sync takes on or off, not {other:?}")),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Storage {
            backends,
            batch_sizes,
            groups,
            sync,
            duration_secs,
            payload_bytes,
            scratch_dir,
        } => sync
            .iter()
            .map(|word| parse_sync(word))
            .collect::<Result<Vec<_>, _>>()
            .map_err(Into::into)
            .and_then(|sync_modes| {
                storage::run(&StorageBenchConfig {
                    backends,
                    batch_sizes,
                    groups,
                    sync_modes,
                    duration: Duration::from_secs_f64(duration_secs),
                    payload_bytes,
                    scratch_dir,
                })
            }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("concord-bench: {error}");
            ExitCode::FAILURE
        }
    }
}
