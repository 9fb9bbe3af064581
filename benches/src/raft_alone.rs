//! The `raft-alone` subcommand: what raft-rs itself costs per entry when a node's commands are
//! spread over many groups — the floor under the engine's rounds.
//!
//! One thread drives `groups` single-voter `RawNode`s over raft-rs's own `MemStorage`, in
//! rounds shaped like the engine's under closed-loop load: each round spreads
//! `commands_per_round` commands of `payload_bytes` over the groups (one entry per group
//! holding its share), then takes every group through `ready`, append, `advance` and apply.
//! Apply is a put of each command into its group's hash map (keys reused round after round,
//! as the proposers of `concord-bench consensus` reuse theirs). Nothing else runs: no queues,
//! no threads to hand over to, no answers. The CPU per command at one group against many says
//! how much of a many-group slowdown raft-rs alone accounts for.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use raft::prelude::{ConfState, Entry};
use raft::storage::MemStorage;
use raft::{Config, RawNode};
use serde::Serialize;

use crate::process_cpu::process_cpu_time;
use crate::report::{human_rate, print_json};

/// Rounds between two compactions of every group's log: keeps memory flat over a long case.
const ROUNDS_PER_COMPACTION: u64 = 64;

/// One case of the `raft-alone` subcommand.
#[derive(Debug, Clone)]
pub struct RaftAloneCase {
    /// Single-voter groups driven by the one thread.
    pub groups: usize,
    /// Commands each round deals out over the groups.
    pub commands_per_round: usize,
    /// Bytes of each command.
    pub payload_bytes: usize,
    /// Measured time (the warm-up before it is a tenth of it).
    pub duration: Duration,
}

/// What one case measured.
#[derive(Debug, Serialize)]
pub struct RaftAloneResult {
    /// Always `raft-alone`: tells these JSON lines from other subcommands'.
    pub bench: &'static str,
    /// The case's groups.
    pub groups: usize,
    /// The case's commands per round.
    pub commands_per_round: usize,
    /// The case's command bytes.
    pub payload_bytes: usize,
    /// Commands in each group's entry (the round's commands over the groups).
    pub commands_per_entry: f64,
    /// Measured rounds.
    pub rounds: u64,
    /// Commands applied per second of wall time.
    pub commands_per_sec: f64,
    /// CPU time of the process per command (one thread does all the work).
    pub cpu_ns_per_command: f64,
    /// CPU time of the process per entry (per group per round).
    pub cpu_ns_per_entry: f64,
}

/// A group: its raft node and its applied state.
struct Group {
    node: RawNode<MemStorage>,
    state: HashMap<u32, Vec<u8>>,
}

/// Runs one case: a warm-up of a tenth of the duration, then the measured rounds.
pub fn run_case(case: &RaftAloneCase) -> Result<RaftAloneResult, String> {
    if case.groups == 0 || case.commands_per_round == 0 {
        return Err("raft-alone needs at least one group and one command per round".into());
    }
    let logger = slog::Logger::root(slog::Discard, slog::o!());
    let mut groups = (0..case.groups)
        .map(|_| elected_group(&logger))
        .collect::<Result<Vec<_>, _>>()?;
    let payload = vec![0x5a_u8; case.payload_bytes];
    let mut round_number = 0_u64;
    run_rounds(
        &mut groups,
        case,
        &payload,
        case.duration / 10,
        &mut round_number,
    )?;
    let cpu_before = process_cpu_time();
    let started = Instant::now();
    let rounds = run_rounds(
        &mut groups,
        case,
        &payload,
        case.duration,
        &mut round_number,
    )?;
    let elapsed = started.elapsed();
    let cpu = process_cpu_time()
        .zip(cpu_before)
        .map(|(after, before)| after.saturating_sub(before))
        .ok_or("the process's CPU time cannot be read here (/proc/self/stat)")?;
    let commands = rounds * case.commands_per_round as u64;
    let entries = rounds * case.groups.min(case.commands_per_round) as u64;
    Ok(RaftAloneResult {
        bench: "raft-alone",
        groups: case.groups,
        commands_per_round: case.commands_per_round,
        payload_bytes: case.payload_bytes,
        commands_per_entry: commands as f64 / entries as f64,
        rounds,
        commands_per_sec: commands as f64 / elapsed.as_secs_f64(),
        cpu_ns_per_command: cpu.as_nanos() as f64 / commands as f64,
        cpu_ns_per_entry: cpu.as_nanos() as f64 / entries as f64,
    })
}

/// A single-voter group that has elected itself and applied its first (empty) entry.
fn elected_group(logger: &slog::Logger) -> Result<Group, String> {
    let storage = MemStorage::new_with_conf_state(ConfState::from((vec![1], vec![])));
    let config = Config {
        id: 1,
        ..Default::default()
    };
    let mut node = RawNode::new(&config, storage, logger).map_err(|e| e.to_string())?;
    node.campaign().map_err(|e| e.to_string())?;
    let mut group = Group {
        node,
        state: HashMap::new(),
    };
    drive(&mut group, 1)?;
    Ok(group)
}

/// Runs rounds for `duration`; returns how many.
fn run_rounds(
    groups: &mut [Group],
    case: &RaftAloneCase,
    payload: &[u8],
    duration: Duration,
    round_number: &mut u64,
) -> Result<u64, String> {
    let started = Instant::now();
    let mut rounds = 0;
    while rounds == 0 || started.elapsed() < duration {
        for (index, group) in groups.iter_mut().enumerate() {
            let share = commands_of_group(case, index);
            if share == 0 {
                continue;
            }
            let mut data = Vec::with_capacity(share * payload.len());
            for _ in 0..share {
                data.extend_from_slice(payload);
            }
            group
                .node
                .propose(Vec::new(), data)
                .map_err(|e| e.to_string())?;
        }
        for group in groups.iter_mut() {
            drive(group, payload.len())?;
        }
        *round_number += 1;
        if round_number.is_multiple_of(ROUNDS_PER_COMPACTION) {
            for group in groups.iter_mut() {
                let applied = group.node.raft.raft_log.applied;
                group
                    .node
                    .mut_store()
                    .wl()
                    .compact(applied)
                    .map_err(|e| e.to_string())?;
            }
        }
        rounds += 1;
    }
    Ok(rounds)
}

/// The commands group `index` gets each round: the round's commands dealt out evenly.
fn commands_of_group(case: &RaftAloneCase, index: usize) -> usize {
    case.commands_per_round / case.groups
        + usize::from(index < case.commands_per_round % case.groups)
}

/// Takes a group through one `Ready`: persist what it appended, advance, apply what committed.
fn drive(group: &mut Group, command_bytes: usize) -> Result<(), String> {
    if !group.node.has_ready() {
        return Ok(());
    }
    let mut ready = group.node.ready();
    apply(
        &mut group.state,
        ready.take_committed_entries(),
        command_bytes,
    );
    {
        let store = group.node.mut_store();
        let mut core = store.wl();
        if !ready.entries().is_empty() {
            core.append(ready.entries()).map_err(|e| e.to_string())?;
        }
        if let Some(hard_state) = ready.hs() {
            core.set_hardstate(hard_state.clone());
        }
    }
    let mut light = group.node.advance(ready);
    if let Some(commit) = light.commit_index() {
        group
            .node
            .mut_store()
            .wl()
            .mut_hard_state()
            .set_commit(commit);
    }
    apply(
        &mut group.state,
        light.take_committed_entries(),
        command_bytes,
    );
    group.node.advance_apply();
    Ok(())
}

/// Puts each command of each entry into the group's state, under the command's position.
fn apply(state: &mut HashMap<u32, Vec<u8>>, entries: Vec<Entry>, command_bytes: usize) {
    for entry in entries {
        for (position, command) in entry.data.chunks(command_bytes.max(1)).enumerate() {
            state.insert(position as u32, command.to_vec());
        }
    }
}

/// Prints the header of the readable table.
pub fn print_header() {
    println!(
        "{:>7} {:>10} {:>8} {:>10} {:>8} {:>12} {:>14} {:>12}",
        "groups",
        "cmds/round",
        "payload",
        "cmds/entry",
        "rounds",
        "commands/s",
        "cpu_ns/command",
        "cpu_ns/entry"
    );
}

/// Prints `result` as a table line and a JSON line.
pub fn print_result(result: &RaftAloneResult) {
    println!(
        "{:>7} {:>10} {:>8} {:>10.2} {:>8} {:>12} {:>14.0} {:>12.0}",
        result.groups,
        result.commands_per_round,
        result.payload_bytes,
        result.commands_per_entry,
        result.rounds,
        human_rate(result.commands_per_sec),
        result.cpu_ns_per_command,
        result.cpu_ns_per_entry
    );
    print_json(result);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_dealt_out_evenly_and_all_of_them() {
        let case = |groups| RaftAloneCase {
            groups,
            commands_per_round: 10,
            payload_bytes: 1,
            duration: Duration::ZERO,
        };
        let shares = |groups| {
            (0..groups)
                .map(|i| commands_of_group(&case(groups), i))
                .collect::<Vec<_>>()
        };
        assert_eq!(shares(1), vec![10]);
        assert_eq!(shares(4), vec![3, 3, 2, 2]);
        assert_eq!(shares(12).iter().sum::<usize>(), 10);
        assert_eq!(shares(12)[10..], [0, 0]);
    }

    #[test]
    fn a_short_case_commits_and_applies_every_command() {
        let case = RaftAloneCase {
            groups: 3,
            commands_per_round: 7,
            payload_bytes: 16,
            duration: Duration::ZERO,
        };
        let result = run_case(&case).unwrap();
        assert!(result.rounds >= 1);
        assert!((result.commands_per_entry - 7.0 / 3.0).abs() < 1e-9);

        // Driven directly: every proposed entry ends up applied, none left behind.
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let mut groups: Vec<Group> = (0..3).map(|_| elected_group(&logger).unwrap()).collect();
        let mut round_number = 0;
        run_rounds(
            &mut groups,
            &case,
            &[1; 16],
            Duration::ZERO,
            &mut round_number,
        )
        .unwrap();
        for (index, group) in groups.iter().enumerate() {
            assert_eq!(group.state.len(), commands_of_group(&case, index));
            assert_eq!(
                group.node.raft.raft_log.applied,
                group.node.raft.raft_log.committed
            );
        }
    }

    #[test]
    fn an_empty_case_is_refused() {
        let case = RaftAloneCase {
            groups: 0,
            commands_per_round: 7,
            payload_bytes: 16,
            duration: Duration::ZERO,
        };
        assert!(run_case(&case).is_err());
    }
}
