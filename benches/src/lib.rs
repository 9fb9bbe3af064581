//! Concord's benchmark library: the workloads and reports behind the `concord-bench` binary
//! and the criterion benches in `benches/`.
//!
//! # Layout
//!
//! - `workload.rs`: deterministic log batches and state write sets, shared by criterion and the
//!   binary so both measure the same thing.
//! - `latency.rs`: latency samples and percentiles.
//! - `report.rs`: one result row, printed as a table line and as a JSON line.
//! - `storage.rs`: the `storage` subcommand: log appends and state commits per backend.
//! - `consensus_bench.rs`: the `consensus` subcommand: closed-loop proposers against raft or
//!   solo nodes.
//! - `plugins_bench.rs`: the `plugins` subcommand: session apply, wasm plugin vs native twin.
//! - `http_load.rs`: the `http` subcommand: closed- or open-loop session operations against
//!   `concord serve`, with live per-second lines; `http_result.rs` is a case's JSON line,
//!   `http_workload.rs` says what each request
//!   is, `http_client.rs` sends it, `http_intervals.rs` keeps the latencies (HDR histograms)
//!   second by second, `http_report.rs` writes the HTML report with `svg_chart.rs`'s charts,
//!   `server_latency.rs` reads the server's own latency from its `/metrics`.
//! - `raft_alone.rs`: the `raft-alone` subcommand: raft-rs's own cost per entry over many
//!   groups, on one thread, without the engine.
//! - `fsync_probe.rs`: raw `fdatasync` latency of the disk under a directory, for comparison.
//! - `process_cpu.rs`: the CPU time the process used, for CPU-per-operation figures.

pub mod consensus_bench;
pub mod core_round_trip;
pub mod fsync_probe;
pub mod grpc_network;
mod http_client;
mod http_intervals;
pub mod http_load;
pub mod http_report;
pub mod http_result;
pub mod http_workload;
pub mod idle_bench;
pub mod latency;
pub mod plugins_bench;
pub mod process_cpu;
pub mod raft_alone;
pub mod report;
pub mod segment_recorder;
mod server_latency;
pub mod storage;
mod svg_chart;
pub mod workload;
