//! `concord member list|add|promote|remove --endpoint URL`: membership changes through any
//! member's HTTP API (see `admin_client.rs`).

use std::time::Duration;

use clap::{Arg, ArgMatches, Command};

use crate::admin_client::{Body, Endpoint, endpoint_args, failure};
use crate::routes_cluster::MemberJson;

/// The longest `--wait-secs`: an hour.
const WAIT_SECS_MAX: u64 = 3600;

/// The statuses a change is asked again on: 503 (a group has no leader to bring this member's
/// view of the membership up to date) and 504 (some groups have not taken the change yet, or a
/// learner is still catching up). A change already made is not made twice, so asking again
/// finishes one.
const ASK_AGAIN_ON: [u16; 2] = [503, 504];

/// The `member` subcommand and its own subcommands.
pub fn command() -> Command {
    let node = || {
        Arg::new("node")
            .required(true)
            .value_parser(clap::value_parser!(u64))
            .help("The member's node id")
    };
    let wait_secs = || {
        Arg::new("wait_secs")
            .long("wait-secs")
            .default_value("30")
            .value_parser(clap::value_parser!(u64).range(..=WAIT_SECS_MAX))
            .help(
                "How long to keep asking again while the member answers 503 or 504 (a group \
                 between leaders, a learner still catching up), cannot be reached, or breaks \
                 off its answer; 0: ask once",
            )
    };
    Command::new("member")
        .about("List the cluster's members, or add, promote or remove one")
        .subcommand_required(true)
        .args(endpoint_args())
        .subcommand(Command::new("list").about("The members, their roles and addresses"))
        .subcommand(
            Command::new("add")
                .about(
                    "Add a node as a learner of every group (start it first with \
                     --initial-cluster-state existing)",
                )
                .arg(node())
                .arg(
                    Arg::new("raft_addr")
                        .required(true)
                        .help("Where its peers reach it: ip:port"),
                )
                .arg(wait_secs()),
        )
        .subcommand(
            Command::new("promote")
                .about("Make a learner a voter of every group, once it has caught up")
                .arg(node())
                .arg(wait_secs()),
        )
        .subcommand(
            Command::new("remove")
                .about("Remove a member from every group")
                .arg(node())
                .arg(wait_secs()),
        )
}

/// Runs `concord member ...`: what to print, or why it failed.
pub fn run(matches: &ArgMatches) -> Result<String, String> {
    let endpoint = Endpoint::from_matches(matches)?;
    let node = |m: &ArgMatches| *m.get_one::<u64>("node").expect("required");
    let wait = |m: &ArgMatches| {
        Duration::from_secs(*m.get_one::<u64>("wait_secs").expect("has a default"))
    };
    let (method, path, body, wait) = match matches.subcommand() {
        Some(("list", _)) => ("GET", "/v1/cluster/members".into(), None, Duration::ZERO),
        Some(("add", m)) => {
            let raft_addr = m.get_one::<String>("raft_addr").expect("required");
            let body = serde_json::json!({ "node_id": node(m), "raft_addr": raft_addr });
            let path = "/v1/cluster/members".into();
            ("POST", path, Some(body.to_string()), wait(m))
        }
        Some(("promote", m)) => {
            let path = format!("/v1/cluster/members/{}/promote", node(m));
            ("POST", path, None, wait(m))
        }
        Some(("remove", m)) => {
            let path = format!("/v1/cluster/members/{}", node(m));
            ("DELETE", path, None, wait(m))
        }
        _ => unreachable!("clap requires a subcommand"),
    };
    let body = body.as_deref().map(|json| Body {
        content_type: "application/json",
        bytes: json.as_bytes(),
    });
    let answer = endpoint.call_asking_again(method, &path, body, &ASK_AGAIN_ON, wait)?;
    if answer.status != 200 {
        let mut message = failure(method, &path, answer.status, &answer.body);
        if answer.earlier_cut_off {
            message.push_str(
                " (an earlier ask went out and was cut off, and may have made the change: \
                 `concord member list` shows the members)",
            );
        }
        return Err(message);
    }
    let members: Vec<MemberJson> = serde_json::from_str(&answer.body).map_err(|error| {
        format!(
            "{} answered what is not a member list: {error}",
            endpoint.url()
        )
    })?;
    Ok(table(&members))
}

/// The members as a table, and the `--initial-cluster` a new node starts with.
fn table(members: &[MemberJson]) -> String {
    let mut out = format!(
        "{:<8} {:<8} {:<22} {:<28} {:<10} {:<8} {:<8} {}\n",
        "NODE", "ROLE", "RAFT ADDRESS", "CLIENT URL", "REACHABLE", "PROTOCOL", "QUIET MS", "LEADS"
    );
    for m in members {
        out.push_str(&format!(
            "{:<8} {:<8} {:<22} {:<28} {:<10} {:<8} {:<8} {}\n",
            m.node_id,
            m.role,
            m.raft_addr.as_deref().unwrap_or("-"),
            m.client_url.as_deref().unwrap_or("-"),
            if m.reachable { "yes" } else { "no" },
            m.wire_version.map_or("-".to_string(), |v| v.to_string()),
            m.vote_quiet_ms.map_or("-".to_string(), |v| v.to_string()),
            m.leads
        ));
    }
    let initial: Vec<String> = members
        .iter()
        .filter_map(|m| Some(format!("{}={}", m.node_id, m.raft_addr.as_deref()?)))
        .collect();
    out.push_str(&format!(
        "initial cluster for a node joining: --initial-cluster {} --initial-cluster-state existing\n",
        initial.join(",")
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin_client::{answering_in_turn, http_answer as answer};

    fn unavailable() -> &'static [u8] {
        answer("503 Service Unavailable", r#"{"detail":"no leader"}"#)
    }

    fn members() -> &'static [u8] {
        answer(
            "200 OK",
            r#"[{"node_id":4,"role":"voter","reachable":true,"leads":0}]"#,
        )
    }

    fn not_a_member() -> &'static [u8] {
        answer("409 Conflict", r#"{"detail":"node 4 is not a member"}"#)
    }

    fn member(url: &str, args: &[&str]) -> Result<String, String> {
        let mut all = vec!["member", "--endpoint", url];
        all.extend(args);
        run(&command().get_matches_from(all))
    }

    #[test]
    fn a_change_is_asked_again_while_the_member_answers_503_or_504() {
        let url = answering_in_turn(vec![
            unavailable(),
            answer("504 Gateway Timeout", r#"{"detail":"catching up"}"#),
            members(),
        ]);
        let table = member(&url, &["promote", "4", "--wait-secs", "10"]).unwrap();
        assert!(table.starts_with("NODE"), "{table}");
        assert!(table.contains("voter"), "{table}");

        // With no wait, the first answer is the result.
        let url = answering_in_turn(vec![unavailable(), members()]);
        let error = member(&url, &["promote", "4", "--wait-secs", "0"]).unwrap_err();
        assert_eq!(
            error,
            "POST /v1/cluster/members/4/promote: HTTP 503: no leader"
        );
    }

    #[test]
    fn a_refusal_is_final_and_one_after_a_cut_off_ask_says_the_change_may_be_made() {
        // The 409 ends the command at once: asked again, the gone server would leave it
        // waiting out the 30 s and ending on a connect error.
        let url = answering_in_turn(vec![not_a_member()]);
        let error = member(&url, &["remove", "4"]).unwrap_err();
        assert_eq!(
            error,
            "DELETE /v1/cluster/members/4: HTTP 409: node 4 is not a member"
        );

        let url = answering_in_turn(vec![
            b"HTTP/1.1 200 OK\r\ncontent-length: 59\r\n\r\n[{\"node_id\"",
            not_a_member(),
        ]);
        let error = member(&url, &["remove", "4", "--wait-secs", "10"]).unwrap_err();
        assert!(
            error.contains("HTTP 409: node 4 is not a member"),
            "{error}"
        );
        assert!(error.contains("may have made the change"), "{error}");
    }

    #[test]
    fn a_member_that_cannot_be_reached_is_asked_no_longer_than_told() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let started = std::time::Instant::now();
        let error = member(&url, &["add", "4", "127.0.0.1:7173", "--wait-secs", "1"]).unwrap_err();
        let took = started.elapsed();
        assert!(error.contains(&url), "{error}");
        assert!(took >= Duration::from_millis(600), "{took:?}");
        assert!(took < Duration::from_secs(5), "{took:?}");
        // A list is asked once.
        let error = member(&url, &["list"]).unwrap_err();
        assert!(error.contains(&url), "{error}");
    }
}
