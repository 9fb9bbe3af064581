//! The `plugins` benchmark: session apply throughput of the wasm plugin against its native twin,
//! by batch size, over the memory and redb state stores.
//!
//! Both state machines run the same logic (`concord-session`) on the same pre-generated command
//! stream, one `StateMachine::apply` per batch and one state commit per batch — what a group's
//! apply stage does with each committed batch. Cases run in rounds, every case once per round,
//! so that the machine's noise falls on all of them alike; the summary quotes medians.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use concord_consensus::StateMachine;
use concord_plugins::{NativeSessionMachine, PluginEngine, PluginEngineConfig, bundled};
use concord_session::{LastWill, SessionCommand, SessionFields, SessionPatch};
use concord_storage::{BackendKind, StateTransaction, StoreConfig, Stores};
use serde::Serialize;

use crate::latency::Latencies;
use crate::report::{human_rate, print_json};

/// What to run.
#[derive(Clone, Debug)]
pub struct PluginsBenchConfig {
    /// `native`, `wasm` or both.
    pub state_machines: Vec<StateMachineKind>,
    /// State stores (the log plays no part here).
    pub stores: Vec<BackendKind>,
    /// Commands per `apply` call and per state commit.
    pub batch_sizes: Vec<u64>,
    /// Sessions created before measuring; the commands address them.
    pub sessions: u64,
    /// Every case runs once per round; the summary takes the median over rounds.
    pub rounds: u32,
    /// How long each case runs per round.
    pub duration: Duration,
    /// Where redb's files go.
    pub scratch_dir: PathBuf,
    /// A session plugin file to run instead of the bundled `session.wasm` (an unstripped
    /// build names its functions in profiles).
    pub session_plugin: Option<PathBuf>,
    /// Name the plugin's functions for `perf` (see `PluginEngineConfig::perf_map`).
    pub perf_map: bool,
}

/// Which implementation of the session logic applies the commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateMachineKind {
    /// `concord_plugins::NativeSessionMachine`: the logic compiled into the engine.
    Native,
    /// The bundled `session.wasm` in the wasmtime host.
    Wasm,
}

impl StateMachineKind {
    /// The name used on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            StateMachineKind::Native => "native",
            StateMachineKind::Wasm => "wasm",
        }
    }
}

impl std::str::FromStr for StateMachineKind {
    type Err = String;

    fn from_str(word: &str) -> Result<Self, Self::Err> {
        match word {
            "native" => Ok(StateMachineKind::Native),
            "wasm" => Ok(StateMachineKind::Wasm),
            other => Err(format!("state machine is native or wasm, not {other:?}")),
        }
    }
}

/// One case of one round.
#[derive(Clone, Debug, Serialize)]
pub struct PluginsResult {
    /// Always `"plugins_apply"`.
    pub case: &'static str,
    /// `native` or `wasm`.
    pub state_machine: &'static str,
    /// The state store's backend.
    pub store: &'static str,
    /// Commands per apply call.
    pub batch: u64,
    /// Which round (from 1).
    pub round: u32,
    /// Commands applied (and committed).
    pub commands: u64,
    /// Commands whose result was an error (should be 0: the stream is all valid).
    pub command_errors: u64,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// Commands applied and committed per second.
    pub commands_per_sec: f64,
    /// Median time of one batch: apply plus commit.
    pub batch_p50_us: u64,
    /// 99th percentile of the same.
    pub batch_p99_us: u64,
}

/// The median over rounds of one case, and its ratio to native on the same store and batch.
#[derive(Debug, Serialize)]
pub struct PluginsSummary {
    /// Always `"plugins_apply_summary"`.
    pub case: &'static str,
    /// `native` or `wasm`.
    pub state_machine: &'static str,
    /// The state store's backend.
    pub store: &'static str,
    /// Commands per apply call.
    pub batch: u64,
    /// Rounds the median is over.
    pub rounds: u32,
    /// Median commands per second.
    pub commands_per_sec: f64,
    /// Median over rounds of this case's rate divided by native's rate in the same round.
    pub ratio_to_native: Option<f64>,
}

/// Runs every case, prints a table and JSON lines.
pub fn run(config: &PluginsBenchConfig) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(&config.scratch_dir)?;
    let engine = PluginEngine::new(PluginEngineConfig {
        perf_map: config.perf_map,
        ..PluginEngineConfig::default()
    })?;
    let plugin = match &config.session_plugin {
        Some(path) => engine.load_file(path)?,
        None => engine.load("session", bundled::SESSION)?,
    };
    let population = population_commands(config.sessions);
    let stream = command_stream(config.sessions, 1 << 16);

    println!(
        "{:<8} {:<6} {:>6} {:>6} {:>12} {:>10} {:>10}",
        "machine", "store", "batch", "round", "commands/s", "p50_us", "p99_us"
    );
    let mut results = Vec::new();
    for round in 1..=config.rounds {
        for &store in &config.stores {
            for &batch in &config.batch_sizes {
                for &kind in &config.state_machines {
                    let mut machine: Box<dyn StateMachine> = match kind {
                        StateMachineKind::Native => Box::new(NativeSessionMachine),
                        StateMachineKind::Wasm => Box::new(plugin.state_machine()),
                    };
                    let result = run_case(
                        config,
                        machine.as_mut(),
                        kind,
                        store,
                        batch,
                        round,
                        &population,
                        &stream,
                    )?;
                    println!(
                        "{:<8} {:<6} {:>6} {:>6} {:>12} {:>10} {:>10}",
                        result.state_machine,
                        result.store,
                        result.batch,
                        result.round,
                        human_rate(result.commands_per_sec),
                        result.batch_p50_us,
                        result.batch_p99_us
                    );
                    print_json(&result);
                    results.push(result);
                }
            }
        }
    }
    print_summary(config, &results);
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn run_case(
    config: &PluginsBenchConfig,
    machine: &mut dyn StateMachine,
    kind: StateMachineKind,
    backend: BackendKind,
    batch: u64,
    round: u32,
    population: &[Bytes],
    stream: &[Bytes],
) -> Result<PluginsResult, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir_in(&config.scratch_dir)?;
    let stores = Stores::open(&StoreConfig::new(backend, dir.path()))?;
    let group = 1;
    let mut applied_index = 0;

    // Create the sessions the stream addresses, with the machine under test.
    for chunk in population.chunks(1024) {
        let mut txn = StateTransaction::new(stores.state.as_ref(), group);
        let results = machine.apply(&mut txn, chunk)?;
        if let Some(error) = results.iter().find_map(|r| r.as_ref().err()) {
            return Err(format!("creating the sessions failed: {error:?}").into());
        }
        applied_index += 1;
        txn.commit(applied_index)?;
    }

    let batch = batch.max(1) as usize;
    let mut latencies = Latencies::new();
    let mut commands = 0u64;
    let mut command_errors = 0u64;
    let mut cursor = 0usize;
    let start = Instant::now();
    while start.elapsed() < config.duration {
        if cursor + batch > stream.len() {
            cursor = 0;
        }
        let commands_in_batch = &stream[cursor..cursor + batch];
        cursor += batch;
        let batch_start = Instant::now();
        let mut txn = StateTransaction::new(stores.state.as_ref(), group);
        let results = machine.apply(&mut txn, commands_in_batch)?;
        applied_index += 1;
        txn.commit(applied_index)?;
        latencies.record(batch_start.elapsed());
        commands += results.len() as u64;
        command_errors += results.iter().filter(|r| r.is_err()).count() as u64;
    }
    let seconds = start.elapsed().as_secs_f64();
    stores.state.flush()?;
    Ok(PluginsResult {
        case: "plugins_apply",
        state_machine: kind.name(),
        store: backend.name(),
        batch: batch as u64,
        round,
        commands,
        command_errors,
        seconds,
        commands_per_sec: commands as f64 / seconds,
        batch_p50_us: latencies.quantile_us(0.5),
        batch_p99_us: latencies.quantile_us(0.99),
    })
}

fn print_summary(config: &PluginsBenchConfig, results: &[PluginsResult]) {
    println!();
    println!(
        "median over {} round(s): {:<8} {:<6} {:>6} {:>12} {:>10}",
        config.rounds, "machine", "store", "batch", "commands/s", "x native"
    );
    for &store in &config.stores {
        for &batch in &config.batch_sizes {
            for &kind in &config.state_machines {
                let of_case = |kind: StateMachineKind| {
                    results
                        .iter()
                        .filter(move |r| {
                            r.state_machine == kind.name()
                                && r.store == store.name()
                                && r.batch == batch
                        })
                        .collect::<Vec<_>>()
                };
                let rows = of_case(kind);
                let natives = of_case(StateMachineKind::Native);
                let rates: Vec<f64> = rows.iter().map(|r| r.commands_per_sec).collect();
                let ratios: Vec<f64> = rows
                    .iter()
                    .filter_map(|row| {
                        let native = natives.iter().find(|n| n.round == row.round)?;
                        Some(row.commands_per_sec / native.commands_per_sec)
                    })
                    .collect();
                let summary = PluginsSummary {
                    case: "plugins_apply_summary",
                    state_machine: kind.name(),
                    store: store.name(),
                    batch,
                    rounds: rows.len() as u32,
                    commands_per_sec: median(rates),
                    ratio_to_native: (!ratios.is_empty()).then(|| median(ratios)),
                };
                println!(
                    "{:>24} {:<8} {:<6} {:>6} {:>12} {:>10}",
                    "",
                    summary.state_machine,
                    summary.store,
                    summary.batch,
                    human_rate(summary.commands_per_sec),
                    summary
                        .ratio_to_native
                        .map_or("-".to_string(), |r| format!("{r:.2}x"))
                );
                print_json(&summary);
            }
        }
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The client id of session `n`: MQTT-style, shaped like device ids.
fn client_id(n: u64) -> String {
    format!("dev/{n:08}")
}

fn fields(n: u64, connection_id: u64) -> SessionFields {
    SessionFields {
        session_expiry_interval_secs: 3600,
        clean_start: false,
        last_will: Some(LastWill {
            topic: format!("status/{}", client_id(n)),
            payload: b"offline".to_vec(),
            qos: 1,
            retain: true,
            delay_interval_secs: 5,
        }),
        broker_id: format!("broker-{}", n % 3),
        connection_id,
    }
}

fn population_commands(sessions: u64) -> Vec<Bytes> {
    (0..sessions)
        .map(|n| {
            Bytes::from(
                SessionCommand::Create {
                    client_id: client_id(n),
                    fields: fields(n, 1),
                    now_ms: 1_000,
                }
                .encode(),
            )
        })
        .collect()
}

/// A session-service mix over existing sessions: half reconnects (a partial update of the
/// connection), three in ten reads, two in ten full replaces. Every command succeeds, so the
/// rate measures the work of a real write path, not an early error exit.
fn command_stream(sessions: u64, length: usize) -> Vec<Bytes> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        // xorshift64*: a fixed, dependency-free stream, the same in every run.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    (0..length as u64)
        .map(|i| {
            let n = next() % sessions.max(1);
            let now_ms = 2_000 + i;
            let command = match next() % 10 {
                0..5 => SessionCommand::Update {
                    client_id: client_id(n),
                    patch: SessionPatch {
                        connection_id: Some(i + 2),
                        ..SessionPatch::default()
                    },
                    expected_version: None,
                    now_ms,
                },
                5..8 => SessionCommand::Get {
                    client_id: client_id(n),
                },
                _ => SessionCommand::Replace {
                    client_id: client_id(n),
                    fields: fields(n, i + 2),
                    expected_version: None,
                    now_ms,
                },
            };
            Bytes::from(command.encode())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_of_the_stream_succeeds_natively() {
        let store = concord_storage::MemStateStore::new();
        let mut machine = NativeSessionMachine;
        let mut txn = StateTransaction::new(&store, 1);
        let created = machine.apply(&mut txn, &population_commands(50)).unwrap();
        assert!(created.iter().all(Result::is_ok));
        let results = machine.apply(&mut txn, &command_stream(50, 500)).unwrap();
        assert_eq!(results.len(), 500);
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        txn.commit(1).unwrap();
    }
}
