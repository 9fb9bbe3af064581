//! A cluster's log follows what happens, not its group count: three `concord` processes of 64
//! groups at `--log-level info` start, lose a member to SIGKILL, elect new leaders, and bring
//! the member back without its data through a snapshot per group, in a few lines each —
//! raft-rs's line per group for each step of an election is at debug, and each node says, at
//! most once a second, how many leaderships it gained and lost and how many snapshots it
//! installed or sent.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Server, free_ports, initial_cluster, leaders, retrying, wait_converged};

const GROUPS: u64 = 64;

/// At most this many lines in a member's log, start to stop: a run writes 10–20 here, and
/// one slowed by a loaded machine writes a line a second more while leaderships move. raft-rs
/// alone wrote five lines per group as a group opened, at info (930 in all before).
const LINES_MAX: usize = 60;

/// Starts member `node`, its log appended to `log`; `state` is `new` or `existing`. A log that
/// keeps 4 entries is compacted past what a member that lost its data has: it catches up
/// through snapshots.
fn spawn_logging(data_dir: &Path, members: &str, node: u64, state: &str, log: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    Command::new(env!("CARGO_BIN_EXE_concord"))
        .arg("serve")
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--http-addr", "127.0.0.1:0", "--log-level", "info"])
        .args(["--groups", &GROUPS.to_string(), "--log-keep-entries", "4"])
        .args(["--initial-cluster", members, "--node-id", &node.to_string()])
        .args(["--initial-cluster-state", state])
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("the concord binary starts")
}

/// Waits until every member at `addresses` sees the same leader for every group, none of them
/// `not`; returns those leaders.
fn settled_leaders(addresses: &[&str], not: u64) -> Vec<u64> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let views: Vec<Vec<u64>> = addresses.iter().map(|a| leaders(a)).collect();
        let settled = views
            .iter()
            .all(|view| view.len() == GROUPS as usize && view.iter().all(|&l| l != 0 && l != not))
            && views.iter().all(|view| *view == views[0]);
        if settled {
            return views[0].clone();
        }
        assert!(Instant::now() < deadline, "no settled leaders: {views:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Writes sessions through `address` in batches, enough for every group's log to be compacted
/// past its start.
fn write_sessions(address: &str) {
    for batch in 0..8 {
        let operations: Vec<String> = (0..500)
            .map(|n| {
                format!(
                    r#"{{"op": "create", "client_id": "s-{batch}-{n}", "session": {{"broker_id": "b", "connection_id": {n}}}}}"#
                )
            })
            .collect();
        let body = format!(r#"{{"operations": [{}]}}"#, operations.join(","));
        let (status, answer) = retrying(address, "POST", "/v1/sessions/batch", Some(&body));
        assert_eq!(status, 200, "{answer}");
    }
}

/// The number after ` name=` in `line`.
fn field(line: &str, name: &str) -> u64 {
    let start = line.find(&format!(" {name}=")).expect(name) + name.len() + 2;
    let digits: String = (line[start..].chars())
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap()
}

/// `(gained, lost, leads)` of each "leaderships changed" line in `lines`.
fn leadership_lines(lines: &[String]) -> Vec<(u64, u64, u64)> {
    (lines.iter())
        .filter(|line| line.contains("leaderships changed"))
        .map(|line| {
            (
                field(line, "gained"),
                field(line, "lost"),
                field(line, "leads"),
            )
        })
        .collect()
}

/// The sum of field `name` over the lines of `lines` that say `message`.
fn total(lines: &[String], message: &str, name: &str) -> u64 {
    (lines.iter())
        .filter(|line| line.contains(message))
        .map(|line| field(line, name))
        .sum()
}

fn read_lines(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines().map(str::to_string).collect()
}

/// Checks the lines of member `node` written since the member started on its data.
fn check_lines(node: usize, lines: &[String]) {
    let text = lines.join("\n");
    assert!(
        lines.len() <= LINES_MAX,
        "member {node} wrote {} lines:\n{text}",
        lines.len()
    );
    assert!(
        !lines.iter().any(|line| line.contains(" INFO raft:")),
        "raft-rs's steps are at debug:\n{text}"
    );
    // Each line's count of groups led follows from the changes it and the earlier lines
    // report.
    let mut leads = 0i64;
    for (gained, lost, reported) in leadership_lines(lines) {
        leads += gained as i64 - lost as i64;
        assert_eq!(leads, reported as i64, "member {node}:\n{text}");
    }
}

#[test]
fn a_cluster_of_many_groups_fails_over_and_catches_up_in_a_few_lines_of_log() {
    let root = tempfile::tempdir().unwrap();
    let members = initial_cluster(&free_ports(3));
    let logs: Vec<_> = (1..=3)
        .map(|n| root.path().join(format!("{n}.log")))
        .collect();
    let dirs: Vec<_> = (1..=3)
        .map(|n| root.path().join(format!("data-{n}")))
        .collect();
    let children: Vec<Child> = (1..=3)
        .map(|n| spawn_logging(&dirs[n - 1], &members, n as u64, "new", &logs[n - 1]))
        .collect();
    let mut cluster: Vec<Option<Server>> = children
        .into_iter()
        .map(|child| Some(Server::listening(child)))
        .collect();
    let mut addresses: Vec<String> = (cluster.iter())
        .map(|s| s.as_ref().unwrap().address.clone())
        .collect();
    let all: Vec<&str> = addresses.iter().map(String::as_str).collect();
    let before = settled_leaders(&all, 0);
    write_sessions(all[0]);

    // The member leading group 0 leads something: its loss moves leaderships.
    let victim = before[0] as usize;
    let victim_led = before.iter().filter(|&&l| l == victim as u64).count();
    assert!(victim_led > 0);
    let lines_at_kill: Vec<usize> = logs.iter().map(|log| read_lines(log).len()).collect();
    let mut killed = cluster[victim - 1].take().unwrap();
    killed.child.kill().unwrap();
    killed.child.wait().unwrap();
    let survivors: Vec<usize> = (1..=3).filter(|&n| n != victim).collect();
    let survivor_addresses: Vec<&str> = survivors.iter().map(|&n| all[n - 1]).collect();
    settled_leaders(&survivor_addresses, victim as u64);

    // It comes back without its data: every group's log is compacted past its start.
    std::fs::remove_dir_all(&dirs[victim - 1]).unwrap();
    let returned = spawn_logging(
        &dirs[victim - 1],
        &members,
        victim as u64,
        "existing",
        &logs[victim - 1],
    );
    cluster[victim - 1] = Some(Server::listening(returned));
    addresses[victim - 1] = cluster[victim - 1].as_ref().unwrap().address.clone();
    let all: Vec<&str> = addresses.iter().map(String::as_str).collect();
    wait_converged(&all, GROUPS, Duration::from_secs(60));
    // The lines for the last changes and snapshots are written within a second of the ones
    // before them.
    std::thread::sleep(Duration::from_millis(1_500));
    for server in &mut cluster {
        server.take().unwrap().stop();
    }

    let mut gained_after_kill = 0;
    for &n in &survivors {
        let lines = read_lines(&logs[n - 1]);
        check_lines(n, &lines);
        let after_kill = leadership_lines(&lines[lines_at_kill[n - 1]..]);
        gained_after_kill += after_kill.iter().map(|(g, _, _)| g).sum::<u64>();
    }
    assert!(
        gained_after_kill >= victim_led as u64,
        "the survivors took the {victim_led} groups member {victim} led, and said so \
         ({gained_after_kill})"
    );
    let returned_lines = read_lines(&logs[victim - 1])[lines_at_kill[victim - 1]..].to_vec();
    check_lines(victim, &returned_lines);
    let installed = total(&returned_lines, "snapshots installed", "installed");
    assert!(
        installed > 0,
        "member {victim} said it installed no snapshot:\n{}",
        returned_lines.join("\n")
    );
    let sent: u64 = (survivors.iter())
        .map(|&n| total(&read_lines(&logs[n - 1]), "snapshots sent", "sent"))
        .sum();
    assert!(
        sent >= installed,
        "the survivors said they sent {sent} snapshots, member {victim} installed {installed}"
    );
}
