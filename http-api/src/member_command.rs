//! `concord member list|add|promote|remove --endpoint URL`: membership changes through any
//! member's HTTP API (see `admin_client.rs`).

use clap::{Arg, ArgMatches, Command};

use crate::admin_client::{Body, Endpoint, endpoint_args};
use crate::routes_cluster::MemberJson;

/// The `member` subcommand and its own subcommands.
pub fn command() -> Command {
    let node = || {
        Arg::new("node")
            .required(true)
            .value_parser(clap::value_parser!(u64))
            .help("The member's node id")
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
                ),
        )
        .subcommand(
            Command::new("promote")
                .about("Make a learner a voter of every group")
                .arg(node()),
        )
        .subcommand(
            Command::new("remove")
                .about("Remove a member from every group")
                .arg(node()),
        )
}

/// Runs `concord member ...`: what to print, or why it failed.
pub fn run(matches: &ArgMatches) -> Result<String, String> {
    let endpoint = Endpoint::from_matches(matches)?;
    let node = |m: &ArgMatches| *m.get_one::<u64>("node").expect("required");
    let (method, path, body) = match matches.subcommand() {
        Some(("list", _)) => ("GET", "/v1/cluster/members".to_string(), None),
        Some(("add", m)) => {
            let raft_addr = m.get_one::<String>("raft_addr").expect("required");
            let body = serde_json::json!({ "node_id": node(m), "raft_addr": raft_addr });
            ("POST", "/v1/cluster/members".into(), Some(body.to_string()))
        }
        Some(("promote", m)) => (
            "POST",
            format!("/v1/cluster/members/{}/promote", node(m)),
            None,
        ),
        Some(("remove", m)) => ("DELETE", format!("/v1/cluster/members/{}", node(m)), None),
        _ => unreachable!("clap requires a subcommand"),
    };
    let body = body.as_deref().map(|json| Body {
        content_type: "application/json",
        bytes: json.as_bytes(),
    });
    let answer = endpoint.call_ok(method, &path, body)?;
    let members: Vec<MemberJson> = serde_json::from_str(&answer).map_err(|error| {
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
