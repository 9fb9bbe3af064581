//! `concord group show|transfer --endpoint URL`: one group as a member knows it, and moving
//! its leadership to another voter, through any member's HTTP API (see `admin_client.rs`).

use std::time::{Duration, Instant};

use clap::{Arg, ArgMatches, Command};

use crate::admin_client::{Body, Endpoint, endpoint_args, failure};
use crate::group_json::GroupJson;

/// How often `transfer` asks whether the voter leads yet.
const WAIT_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// The longest `--wait-secs`: an hour.
const WAIT_SECS_MAX: u64 = 3600;

/// The `group` subcommand and its own subcommands.
pub fn command() -> Command {
    let group = || {
        Arg::new("group")
            .required(true)
            .value_parser(clap::value_parser!(u64))
            .help("The group id")
    };
    Command::new("group")
        .about("Show a group as a member knows it, or move its leadership to another voter")
        .subcommand_required(true)
        .args(endpoint_args())
        .subcommand(
            Command::new("show")
                .about("The group's leader, term, indexes and members, as the endpoint knows them")
                .arg(group()),
        )
        .subcommand(
            Command::new("transfer")
                .about(
                    "Hand the group's leadership to a voter (the request goes on to the \
                     leader when the endpoint does not lead it), then wait until the voter leads",
                )
                .arg(group())
                .arg(
                    Arg::new("node")
                        .required(true)
                        .value_parser(clap::value_parser!(u64))
                        .help("The voter to lead the group"),
                )
                .arg(
                    Arg::new("wait_secs")
                        .long("wait-secs")
                        .value_parser(clap::value_parser!(u64).range(0..=WAIT_SECS_MAX))
                        .default_value("10")
                        .help(
                            "How long to wait for the voter to lead; until then the request \
                             is asked again while the group has no leader (503) or the member \
                             cannot be reached or breaks off its answer (0: ask once, do not \
                             wait)",
                        ),
                ),
        )
}

/// Runs `concord group ...`: what to print, or why it failed.
pub fn run(matches: &ArgMatches) -> Result<String, String> {
    let endpoint = Endpoint::from_matches(matches)?;
    let group = |m: &ArgMatches| *m.get_one::<u64>("group").expect("required");
    match matches.subcommand() {
        Some(("show", m)) => Ok(describe(&show(&endpoint, group(m))?)),
        Some(("transfer", m)) => {
            let node = *m.get_one::<u64>("node").expect("required");
            let wait_secs = *m.get_one::<u64>("wait_secs").expect("has a default");
            transfer(&endpoint, group(m), node, Duration::from_secs(wait_secs))
        }
        _ => unreachable!("clap requires a subcommand"),
    }
}

/// `GET /v1/cluster/groups/{group}` on `endpoint`.
fn show(endpoint: &Endpoint, group: u64) -> Result<GroupJson, String> {
    let answer = endpoint.call_ok("GET", &format!("/v1/cluster/groups/{group}"), None)?;
    serde_json::from_str(&answer)
        .map_err(|error| format!("{} answered what is not a group: {error}", endpoint.url()))
}

/// Asks the group's leader to hand the leadership to `node`: the endpoint, or the leader a
/// 421 from it names; within `wait`, each is asked again while it answers 503 (the group has no
/// leader now) or gives no answer (asking twice for the same move is harmless). Then, unless
/// `wait` is zero, asks the endpoint until it names `node` the leader: raft-rs gives a
/// transfer up after an election timeout (a voter behind the leader's log, or one that went
/// down), and the caller should know.
fn transfer(endpoint: &Endpoint, group: u64, node: u64, wait: Duration) -> Result<String, String> {
    let deadline = Instant::now() + wait;
    let path = format!("/v1/cluster/groups/{group}/leader");
    let json = serde_json::json!({ "node_id": node }).to_string();
    let body = Some(Body {
        content_type: "application/json",
        bytes: json.as_bytes(),
    });
    let ask = |endpoint: &Endpoint| {
        let left = deadline.saturating_duration_since(Instant::now());
        endpoint.call_asking_again("POST", &path, body, &[503], left)
    };
    let mut answer = ask(endpoint)?;
    if answer.status == 421 {
        let leader_url = serde_json::from_str::<serde_json::Value>(&answer.body)
            .ok()
            .and_then(|problem| problem["leader_url"].as_str().map(str::to_string));
        let Some(leader_url) = leader_url else {
            return Err(failure("POST", &path, answer.status, &answer.body));
        };
        answer = ask(&endpoint.at(&leader_url))?;
    }
    if answer.status != 202 {
        return Err(failure("POST", &path, answer.status, &answer.body));
    }
    if wait.is_zero() {
        return Ok(format!(
            "group {group}: its leadership is being handed to node {node}\n"
        ));
    }
    loop {
        let shown = show(endpoint, group)?;
        if shown.leader == node {
            return Ok(format!(
                "group {group}: node {node} leads it (term {})\n",
                shown.term
            ));
        }
        if Instant::now() >= deadline {
            let leader = match shown.leader {
                0 => "none known".to_string(),
                leader => format!("node {leader}"),
            };
            return Err(format!(
                "group {group}: node {node} did not take the leadership within {} s (the \
                 leader now: {leader}); a transfer is given up after an election timeout when \
                 the voter lacks the leader's log or is down",
                wait.as_secs()
            ));
        }
        std::thread::sleep(WAIT_POLL_INTERVAL);
    }
}

/// The group as lines of text.
fn describe(group: &GroupJson) -> String {
    let leader = match group.leader {
        0 => "none known".to_string(),
        leader if group.is_leader => format!("node {leader} (the endpoint)"),
        leader => format!("node {leader}"),
    };
    let mut out = format!(
        "group {}: leader {leader}, term {}\n\
         indexes: commit {}, applied {}, last {}\n\
         voters {:?}, learners {:?}{}\n",
        group.group,
        group.term,
        group.commit_index,
        group.applied_index,
        group.last_log_index,
        group.voter_ids,
        group.learner_ids,
        if group.changing_membership {
            " (changing)"
        } else {
            ""
        },
    );
    for voter in &group.voters {
        out.push_str(&format!(
            "voter {}: matched {}, {} behind\n",
            voter.node_id, voter.matched_index, voter.lag
        ));
    }
    if group.asleep {
        out.push_str("asleep: idle, not ticked\n");
    }
    if group.installing_snapshot {
        out.push_str("installing a snapshot\n");
    }
    if group.catching_up {
        out.push_str("catching up: started without its data, it votes for no one yet\n");
    }
    if let Some(reason) = &group.stopped {
        out.push_str(&format!("stopped: {reason}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin_client::{answering_in_turn, http_answer};

    fn group(url: &str, args: &[&str]) -> Result<String, String> {
        let mut all = vec!["group", "--endpoint", url];
        all.extend(args);
        run(&command().get_matches_from(all))
    }

    #[test]
    fn a_transfer_is_asked_again_while_the_group_has_no_leader_and_follows_a_421() {
        let no_leader = || http_answer("503 Service Unavailable", r#"{"detail":"no leader"}"#);
        let leader = answering_in_turn(vec![
            no_leader(),
            http_answer("202 Accepted", r#"{"group":7,"node_id":2}"#),
        ]);
        let moved = serde_json::json!({
            "group": 7, "leader": 2, "is_leader": false, "term": 5, "commit_index": 9,
            "applied_index": 9, "last_log_index": 9, "apply_lag": 0, "stopped": null,
            "voters": [], "voter_ids": [1, 2, 3], "learner_ids": [],
            "changing_membership": false, "installing_snapshot": false, "catching_up": false,
            "asleep": false
        });
        let not_leader = serde_json::json!({ "detail": "not the leader", "leader_url": leader });
        let endpoint = answering_in_turn(vec![
            no_leader(),
            http_answer("421 Misdirected Request", &not_leader.to_string()),
            http_answer("200 OK", &moved.to_string()),
        ]);
        let out = group(&endpoint, &["transfer", "7", "2"]).unwrap();
        assert_eq!(out, "group 7: node 2 leads it (term 5)\n");

        // With no wait, a 503 is the answer.
        let endpoint = answering_in_turn(vec![no_leader()]);
        let error = group(&endpoint, &["transfer", "7", "2", "--wait-secs", "0"]).unwrap_err();
        assert_eq!(
            error,
            "POST /v1/cluster/groups/7/leader: HTTP 503: no leader"
        );
    }
}
