//! `concord-bench`: Concord's load generator and benchmark runner.
//!
//! Prints a readable table and, for each case, one JSON line (the lines starting with `{`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use concord_bench::consensus_bench::{self, ConsensusCase, ConsensusKind};
use concord_bench::http_load::{self, HttpBenchConfig};
use concord_bench::http_report;
use concord_bench::http_workload::{ClientIds, Workload};
use concord_bench::idle_bench::{self, IdleCase};
use concord_bench::plugins_bench::{self, PluginsBenchConfig, StateMachineKind};
use concord_bench::raft_alone::{self, RaftAloneCase};
use concord_bench::storage::{self, StorageBenchConfig};
use concord_storage::{BackendKind, SyncMode};

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
        #[arg(long, value_delimiter = ',', default_value = "mem,sled,redb,wal")]
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
        /// State commits put a key never written before every time (the state grows for the
        /// whole case, as with new sessions) instead of rewriting 100,000 keys.
        #[arg(long)]
        fresh_keys: bool,
    },
    /// Closed-loop proposers against raft or solo nodes: every combination of the lists given
    /// runs in turn, side by side in one run.
    Consensus {
        /// raft, solo (comma-separated for several).
        #[arg(long, value_delimiter = ',', default_value = "raft")]
        consensus: Vec<ConsensusKind>,
        /// mem, sled, redb.
        #[arg(long, value_delimiter = ',', default_value = "mem")]
        backend: Vec<BackendKind>,
        /// Nodes (all in this process).
        #[arg(long, value_delimiter = ',', default_value = "1")]
        nodes: Vec<u64>,
        /// How the nodes talk: inproc (function calls, nothing encoded), tcp (loopback
        /// sockets, every message encoded and decoded), tls (tcp with mutual TLS) or grpc
        /// (the same frames carried by tonic, to compare); comma-separated to compare.
        #[arg(long, value_delimiter = ',', default_value = "inproc")]
        transport: Vec<String>,
        /// Groups, all led by node 1.
        #[arg(long, value_delimiter = ',', default_value = "1")]
        groups: Vec<u64>,
        /// Concurrent closed-loop proposers.
        #[arg(long, value_delimiter = ',', default_value = "256")]
        proposers: Vec<u64>,
        /// Commands each proposer proposes at once: 1 proposes one at a time; more proposes a
        /// batch of that many (`Consensus::propose_batch`), answered with one future.
        #[arg(long, default_value_t = 1)]
        batch: usize,
        /// Value bytes of each put.
        #[arg(long, default_value_t = 150)]
        payload_bytes: usize,
        /// Measured seconds per case (after a warm-up).
        #[arg(long, default_value_t = 5.0)]
        duration_secs: f64,
        /// Raft worker threads per node.
        #[arg(long, default_value_t = 1)]
        workers: usize,
        /// Threads of the proposers' tokio runtime.
        #[arg(long, default_value_t = 1)]
        client_threads: usize,
        /// Sync each log write on disk backends: on, off.
        #[arg(long, default_value = "on")]
        sync: String,
        /// State machine: kv (each command is a put of the payload) or noop (replication only,
        /// the shape of in-memory raft benchmarks).
        #[arg(long, default_value = "kv")]
        state_machine: String,
        /// Microseconds an idle raft or apply thread yields before parking (latency at low
        /// load vs throughput at saturation); comma-separated to compare.
        #[arg(long, value_delimiter = ',', default_value = "50")]
        idle_spin_us: Vec<u64>,
        /// With several raft nodes, group `g` is led by node `1 + g % nodes` (and proposed to
        /// there), as leader balance spreads them in a cluster, instead of every group by node 1.
        #[arg(long)]
        spread_leaders: bool,
        /// Each put writes a key never written before, scattered over the key space (as new
        /// sessions' ids are), instead of each proposer rewriting its own key: the state
        /// store's cost for inserts rather than overwrites.
        #[arg(long)]
        fresh_keys: bool,
        /// Also measure raw fdatasync latency on the scratch disk, in the same run.
        #[arg(long)]
        fsync_probe: bool,
        /// Print where the time went: the median and p99 of every write-path segment the
        /// engine records (queue wait, log append, sync, commit wait, apply, end to end). Costs
        /// some throughput: segments recorded per command then take a lookup.
        #[arg(long)]
        breakdown: bool,
        /// Directory for scratch data (put it on the disk you want to measure).
        #[arg(long, default_value = "bench-scratch")]
        scratch_dir: PathBuf,
    },
    /// raft-rs alone, on one thread: single-voter groups over raft-rs's MemStorage, each round
    /// spreading the commands over the groups, every group taken through ready, append,
    /// advance and a hash-map apply. The CPU per command at one group against many is the
    /// part of a many-group slowdown that raft-rs itself accounts for.
    RaftAlone {
        /// Groups (comma-separated for several cases).
        #[arg(long, value_delimiter = ',', default_value = "1,1024,4096")]
        groups: Vec<usize>,
        /// Commands each round spreads over the groups (the closed-loop proposers of
        /// `consensus`).
        #[arg(long, default_value_t = 5000)]
        commands_per_round: usize,
        /// Bytes of each command.
        #[arg(long, default_value_t = 150)]
        payload_bytes: usize,
        /// Measured seconds per case (after a warm-up of a tenth of it).
        #[arg(long, default_value_t = 3.0)]
        duration_secs: f64,
    },
    /// What raft nodes cost with nothing to do: a quiet window's CPU, messages between nodes
    /// and memory, then the latency of single writes to random idle groups, and (disk
    /// backends) the time to reopen a node over that many groups.
    Idle {
        /// Nodes (all in this process).
        #[arg(long, default_value_t = 3)]
        nodes: u64,
        /// Group counts to run in turn.
        #[arg(long, value_delimiter = ',', default_value = "1000")]
        groups: Vec<u64>,
        /// mem, sled, redb, wal.
        #[arg(long, default_value = "mem")]
        backend: BackendKind,
        /// inproc (function calls) or tcp (loopback sockets).
        #[arg(long, default_value = "inproc")]
        transport: String,
        /// Raft worker threads per node.
        #[arg(long, default_value_t = 1)]
        workers: usize,
        /// Seconds to let the groups settle once led, before measuring.
        #[arg(long, default_value_t = 3.0)]
        settle_secs: f64,
        /// Seconds of the quiet window.
        #[arg(long, default_value_t = 5.0)]
        duration_secs: f64,
        /// Single writes to random groups after the quiet window.
        #[arg(long, default_value_t = 100)]
        wake_writes: u64,
        /// Milliseconds between two of those writes.
        #[arg(long, default_value_t = 50)]
        wake_interval_ms: u64,
        /// Write to every group once as soon as it is led, before the settle: the memory
        /// then counts what a group keeps after use (buffers sized by its writes), not only
        /// what an unused group holds.
        #[arg(long)]
        written_first: bool,
        /// Directory for scratch data.
        #[arg(long, default_value = "bench-scratch")]
        scratch_dir: PathBuf,
    },
    /// Session apply throughput: the wasm session plugin against its native twin, by batch
    /// size and state store, in rounds (medians and wasm/native ratios at the end).
    Plugins {
        /// native, wasm.
        #[arg(long, value_delimiter = ',', default_value = "native,wasm")]
        state_machines: Vec<StateMachineKind>,
        /// State stores: mem, sled, redb, wal (wal keeps state in redb).
        #[arg(long, value_delimiter = ',', default_value = "mem,redb")]
        stores: Vec<BackendKind>,
        /// Commands per apply call (and per state commit).
        #[arg(long, value_delimiter = ',', default_value = "1,64,1024")]
        batch_sizes: Vec<u64>,
        /// Sessions created before measuring.
        #[arg(long, default_value_t = 10_000)]
        sessions: u64,
        /// Rounds over all cases.
        #[arg(long, default_value_t = 3)]
        rounds: u32,
        /// Seconds each case runs per round.
        #[arg(long, default_value_t = 1.0)]
        duration_secs: f64,
        /// Directory for scratch data.
        #[arg(long, default_value = "bench-scratch")]
        scratch_dir: PathBuf,
        /// Write a perf map so `perf report` names the plugin's functions.
        #[arg(long)]
        perf_map: bool,
        /// A session plugin file instead of the bundled one.
        #[arg(long)]
        session_plugin: Option<PathBuf>,
    },
    /// Session operations over HTTP against a running `concord serve`, one case per
    /// connection count (keep-alive connections, one request in flight each): closed loop, or
    /// open loop at a fixed rate with `--rate`. A line per second while each case runs, a JSON
    /// line per case, a summary table, and with `--report` an HTML page of charts.
    Http {
        /// The server's host:port.
        #[arg(long, default_value = "127.0.0.1:7070")]
        address: String,
        /// Connection counts to run in turn.
        #[arg(long, value_delimiter = ',', default_value = "1,256,5000")]
        connections: Vec<u64>,
        /// create, get[:linearizable|lease|stale], patch, mixed (5 reads, 3 patches, 2
        /// creates in 10), batch:<n> (n creates per request), livez (the HTTP stack alone),
        /// soak (reads, patches, creates, expiring creates and deletes), kv-put:<name> (puts
        /// of 150 bytes through the kv plugin served as <name>) or kv-batch:<name>:<n> (n such
        /// puts per request to the plugin's batch route).
        #[arg(long, default_value = "create")]
        workload: Workload,
        /// How the ids of created sessions follow one another on a connection: counter
        /// (`<prefix>/1`, `/2`, ... in decimal: in a sorted store each lands among the
        /// connection's earlier ones, near the last) or random (16 hex digits: device-like ids
        /// that land anywhere). Applies to create and mixed.
        #[arg(long, default_value = "counter")]
        client_ids: ClientIds,
        /// Open loop: this many requests per second in total, spread over the connections;
        /// latency counts from when each request was due. Without it: closed loop.
        #[arg(long)]
        rate: Option<f64>,
        /// The server's process id, for its CPU per operation and its memory before and after
        /// each case. Without it, the process listening on the address's port is used when it
        /// runs on this machine.
        #[arg(long)]
        server_pid: Option<u32>,
        /// Measured seconds per case.
        #[arg(long, default_value_t = 10.0)]
        duration_secs: f64,
        /// Threads of the load generator's runtime.
        #[arg(long, default_value_t = 1)]
        client_threads: usize,
        /// Names this run in reports (recorded in its JSON lines).
        #[arg(long, default_value = "")]
        label: String,
        /// Writes a self-contained HTML report (SVG charts) to this file.
        #[arg(long)]
        report: Option<PathBuf>,
        /// Earlier runs' output (the JSON lines, or everything they printed) to set beside
        /// this run in the report; repeatable.
        #[arg(long)]
        compare: Vec<PathBuf>,
        /// No per-second lines (the summary and JSON lines remain).
        #[arg(long)]
        quiet: bool,
    },
    /// An HTML report (SVG charts, side by side) of earlier `concord-bench http` runs, from
    /// their output files.
    Report {
        /// Where to write the page.
        #[arg(long)]
        out: PathBuf,
        /// The page's title.
        #[arg(long, default_value = "concord-bench http")]
        title: String,
        /// The runs' output files (JSON lines, or everything a run printed).
        #[arg(required = true)]
        runs: Vec<PathBuf>,
    },
}

/// Runs the idle cases in turn, printing each as it finishes.
fn run_idle(
    cases: impl Iterator<Item = IdleCase>,
    scratch_dir: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(scratch_dir)?;
    idle_bench::print_header();
    for case in cases {
        idle_bench::print_result(&idle_bench::run_case(&case, scratch_dir)?);
    }
    Ok(())
}

fn run_raft_alone(
    cases: impl Iterator<Item = RaftAloneCase>,
) -> Result<(), Box<dyn std::error::Error>> {
    raft_alone::print_header();
    for case in cases {
        raft_alone::print_result(&raft_alone::run_case(&case)?);
    }
    Ok(())
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
    let mut cli_consensus = None;
    let result: Result<(), Box<dyn std::error::Error>> = match cli.command {
        Command::Storage {
            backends,
            batch_sizes,
            groups,
            sync,
            duration_secs,
            payload_bytes,
            scratch_dir,
            fresh_keys,
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
                    fresh_keys,
                })
            }),
        Command::Plugins {
            state_machines,
            stores,
            batch_sizes,
            sessions,
            rounds,
            duration_secs,
            scratch_dir,
            perf_map,
            session_plugin,
        } => plugins_bench::run(&PluginsBenchConfig {
            state_machines,
            stores,
            batch_sizes,
            sessions,
            rounds,
            duration: Duration::from_secs_f64(duration_secs),
            scratch_dir,
            perf_map,
            session_plugin,
        }),
        Command::Http {
            address,
            connections,
            workload,
            client_ids,
            rate,
            server_pid,
            duration_secs,
            client_threads,
            label,
            report,
            compare,
            quiet,
        } => match rate {
            Some(rate) if !(rate > 0.0 && rate.is_finite()) => Err(format!(
                "--rate must be a positive number of requests per second, not {rate}"
            )
            .into()),
            _ => http_load::run(&HttpBenchConfig {
                address,
                connections,
                workload,
                client_ids,
                rate_per_sec: rate,
                server_pid,
                duration: Duration::from_secs_f64(duration_secs),
                client_threads,
                run_id: format!(
                    "{}",
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis())
                ),
                label,
                report,
                compare,
                live: !quiet,
            })
            .map(|_| ()),
        },
        Command::Report { out, title, runs } => http_report::read_runs(&runs)
            .map_err(Into::into)
            .and_then(|runs| {
                http_report::write_report(&out, &title, &runs)?;
                println!("report: {}", out.display());
                Ok(())
            }),
        Command::Idle {
            nodes,
            groups,
            backend,
            transport,
            workers,
            settle_secs,
            duration_secs,
            wake_writes,
            wake_interval_ms,
            written_first,
            scratch_dir,
        } => run_idle(
            groups.iter().map(|&group_count| IdleCase {
                nodes,
                groups: group_count,
                backend,
                transport: transport.clone(),
                workers,
                settle: Duration::from_secs_f64(settle_secs),
                duration: Duration::from_secs_f64(duration_secs),
                wake_writes,
                wake_interval: Duration::from_millis(wake_interval_ms),
                written_first,
            }),
            &scratch_dir,
        ),
        Command::RaftAlone {
            groups,
            commands_per_round,
            payload_bytes,
            duration_secs,
        } => match Duration::try_from_secs_f64(duration_secs) {
            Ok(duration) => run_raft_alone(groups.iter().map(|&group_count| RaftAloneCase {
                groups: group_count,
                commands_per_round,
                payload_bytes,
                duration,
            })),
            Err(_) => {
                Err(format!("--duration-secs takes seconds >= 0, not {duration_secs}").into())
            }
        },
        consensus @ Command::Consensus { .. } => {
            cli_consensus = Some(consensus);
            Ok(())
        }
    };
    let result = result.and_then(|()| match cli_consensus {
        Some(args) => run_consensus(args),
        None => Ok(()),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("concord-bench: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run_consensus(command: Command) -> Result<(), Box<dyn std::error::Error>> {
    let Command::Consensus {
        consensus,
        backend,
        nodes,
        transport,
        groups,
        proposers,
        batch,
        payload_bytes,
        duration_secs,
        workers,
        client_threads,
        sync,
        state_machine,
        idle_spin_us,
        spread_leaders,
        fresh_keys,
        fsync_probe,
        breakdown,
        scratch_dir,
    } = command
    else {
        return Ok(());
    };
    if batch == 0 {
        return Err("--batch must be at least 1".into());
    }
    let sync = parse_sync(&sync)?.is_sync();
    std::fs::create_dir_all(&scratch_dir)?;
    let recorder = if breakdown {
        Some(concord_bench::segment_recorder::SegmentRecorder::install()?)
    } else {
        None
    };
    if fsync_probe {
        let probe = concord_bench::fsync_probe::probe(&scratch_dir, Duration::from_secs(2), 4096)?;
        println!(
            "fsync probe: {:.0} syncs/s, p50 {} us, p99 {} us",
            probe.syncs_per_sec, probe.p50_us, probe.p99_us
        );
        concord_bench::report::print_json(&probe);
    }
    consensus_bench::print_header();
    for &kind in &consensus {
        for &backend in &backend {
            for &node_count in &nodes {
                if kind == ConsensusKind::Solo && node_count != 1 {
                    continue;
                }
                for (group_count, transport) in groups
                    .iter()
                    .flat_map(|&g| transport.iter().map(move |t| (g, t.clone())))
                {
                    for (&proposer_count, &spin_us) in proposers
                        .iter()
                        .flat_map(|p| idle_spin_us.iter().map(move |s| (p, s)))
                    {
                        let case = ConsensusCase {
                            consensus: kind,
                            backend,
                            nodes: node_count,
                            groups: group_count,
                            proposers: proposer_count,
                            batch,
                            payload_bytes,
                            duration: Duration::from_secs_f64(duration_secs),
                            workers,
                            client_threads,
                            sync,
                            state_machine: state_machine.clone(),
                            idle_spin: Duration::from_micros(spin_us),
                            transport: transport.clone(),
                            spread_leaders,
                            fresh_keys,
                        };
                        let result = consensus_bench::run_case(&case, &scratch_dir, recorder)?;
                        consensus_bench::print_result(&result);
                    }
                }
            }
        }
    }
    Ok(())
}

/// The allocator the `concord` binary ships with, so that the engine is measured as the server
/// runs it.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
