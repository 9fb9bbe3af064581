//! `/v1/cluster`: the members as this node knows them, membership changes, a group as this
//! node knows it, and moving a group's leadership.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use concord_engine::{MemberChange, MemberRole};

use crate::AppState;
use crate::forwarding::misdirected;
use crate::group_json::{GroupJson, group_json};
use crate::json_body::JsonBody;
use crate::no_query::NoQuery;
use crate::openapi_shared::{AdminProblems, JsonBodyProblems};
use crate::problem::{Problem, kind};

/// One member of the cluster.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MemberJson {
    /// Its node id.
    pub node_id: u64,
    /// `voter` or `learner` (a learner receives every group's log and votes in none).
    pub role: String,
    /// Where its peers reach it (absent for a node alone).
    pub raft_addr: Option<String>,
    /// Where its clients reach it, as it told this node when it connected (absent until then).
    pub client_url: Option<String>,
    /// `true` for this node and for a member connected to it and heard from within the last
    /// second.
    pub reachable: bool,
    /// Milliseconds since this node last heard from it (absent: never, or this node).
    pub last_heard_ms: Option<u64>,
    /// The peer protocol version it speaks (absent until it connected to this node). During a
    /// rolling upgrade this build works with members of the two versions before its own;
    /// plugin upgrades wait until every member speaks one that applies them (3 or newer).
    pub wire_version: Option<u16>,
    /// How long, having heard from a leader, it refuses to vote for another, in
    /// milliseconds, as it said when it connected (absent until then, or for a member of an
    /// older version). Members configured with different raft ticks differ here; a leader's
    /// lease lasts nine tenths of the shortest.
    pub vote_quiet_ms: Option<u64>,
    /// The groups it leads, as this node knows.
    pub leads: usize,
}

/// `POST /v1/cluster/members`: a node to add as a learner.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddMemberBody {
    /// The new member's id (not a member's yet).
    pub node_id: u64,
    /// Where its peers reach it: `ip:port`.
    pub raft_addr: String,
}

/// `POST /v1/cluster/groups/{group}/leader`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TransferBody {
    /// The voter to lead the group.
    pub node_id: u64,
}

/// The answer to a transfer: the move is under way.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TransferJson {
    /// The group.
    pub group: u64,
    /// The voter asked to take it.
    pub node_id: u64,
}

/// `GET /v1/cluster/groups/{group}/digest`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DigestJson {
    /// The group.
    pub group: u64,
    /// The applied index the state reflects.
    pub applied_index: u64,
    /// Key-value pairs in the state.
    pub pairs: u64,
    /// SHA-256 over the pairs in key order, hex.
    pub sha256: String,
}

/// Every member: ids, roles, addresses, reachability, and how many groups each leads.
pub fn members(state: &AppState) -> Vec<MemberJson> {
    let engine = &state.engine;
    let urls = engine.client_urls();
    engine
        .members()
        .into_iter()
        .map(|member| MemberJson {
            node_id: member.node,
            role: match member.role {
                MemberRole::Voter => "voter",
                MemberRole::Learner => "learner",
            }
            .to_string(),
            raft_addr: member.raft_addr.map(|a| a.to_string()),
            client_url: urls.get(&member.node).cloned(),
            reachable: member.reachable,
            last_heard_ms: member.last_heard_ms,
            wire_version: member.wire_version,
            vote_quiet_ms: member.vote_quiet_ms,
            leads: member.leads,
        })
        .collect()
}

/// `GET /v1/cluster/members`.
#[utoipa::path(get, path = "/v1/cluster/members", tag = "cluster",
    summary = "The members: ids, roles, addresses, reachability, groups led",
    responses((status = 200, description = "every member", body = Vec<MemberJson>)))]
pub async fn list_members(State(state): State<AppState>) -> axum::Json<Vec<MemberJson>> {
    axum::Json(members(&state))
}

/// `POST /v1/cluster/members`: adds a node as a learner of every group. Start the node first
/// with `--initial-cluster-state existing` and an `--initial-cluster` naming every member and
/// itself; it receives each group's state from a snapshot. Answers once every group took the
/// change, with the members.
#[utoipa::path(post, path = "/v1/cluster/members", tag = "cluster",
    summary = "Add a node as a learner of every group",
    request_body = AddMemberBody,
    responses(
        (status = 200, description = "every group took the change; the members", body = Vec<MemberJson>),
        (status = 400, description = "invalid body, or a query parameter (this route reads none)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "refused: the node is a voter already, the address is not ip:port, or this node is not a cluster member", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "this member's view refuses the change for who is a member, and a group has no leader now to bring that view up to date; ask again", body = Problem, content_type = "application/problem+json"),
        (status = 504, description = "some groups have not taken the change in time; ask again to finish it (or: this member could not bring its view of the membership up to date within 2 s)", body = Problem, content_type = "application/problem+json"),
        JsonBodyProblems,
        AdminProblems
    ))]
pub async fn add_member(
    State(state): State<AppState>,
    _no_query: NoQuery,
    JsonBody(body): JsonBody<AddMemberBody>,
) -> Result<axum::Json<Vec<MemberJson>>, Problem> {
    let change = MemberChange::AddLearner {
        node: body.node_id,
        address: body.raft_addr,
    };
    change_and_list(&state, change).await
}

/// `POST /v1/cluster/members/{node}/promote`: makes a learner a voter of every group, once it
/// has caught up with each group's leader.
#[utoipa::path(post, path = "/v1/cluster/members/{node}/promote", tag = "cluster",
    summary = "Promote a learner to voter in every group",
    params(("node" = u64, Path, description = "the learner's node id")),
    responses(
        (status = 200, description = "every group took the change; the members", body = Vec<MemberJson>),
        (status = 400, description = "the node id is not a number, or a query parameter (this route reads none)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "refused: not a member, or the voters after it would lose quorum", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "this member's view refuses the change for who is a member, and a group has no leader now to bring that view up to date; ask again", body = Problem, content_type = "application/problem+json"),
        (status = 504, description = "some groups have not taken the change in time (a learner still catching up, say); ask again to finish it (or: this member could not bring its view of the membership up to date within 2 s)", body = Problem, content_type = "application/problem+json"),
        AdminProblems
    ))]
pub async fn promote_member(
    State(state): State<AppState>,
    _no_query: NoQuery,
    node: Result<Path<u64>, PathRejection>,
) -> Result<axum::Json<Vec<MemberJson>>, Problem> {
    change_and_list(
        &state,
        MemberChange::Promote {
            node: node_of(node)?,
        },
    )
    .await
}

/// `DELETE /v1/cluster/members/{node}`: removes a voter or learner from every group; a leader
/// removed hands its leaderships over. Refused if the voters left would lose quorum.
#[utoipa::path(delete, path = "/v1/cluster/members/{node}", tag = "cluster",
    summary = "Remove a member from every group",
    params(("node" = u64, Path, description = "the member's node id")),
    responses(
        (status = 200, description = "every group took the change; the members left", body = Vec<MemberJson>),
        (status = 400, description = "the node id is not a number, or a query parameter (this route reads none)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "refused: not a member, this node itself, or the voters left would lose quorum", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "this member's view refuses the change for who is a member, and a group has no leader now to bring that view up to date; ask again", body = Problem, content_type = "application/problem+json"),
        (status = 504, description = "some groups have not taken the change in time; ask again to finish it (or: this member could not bring its view of the membership up to date within 2 s)", body = Problem, content_type = "application/problem+json"),
        AdminProblems
    ))]
pub async fn remove_member(
    State(state): State<AppState>,
    _no_query: NoQuery,
    node: Result<Path<u64>, PathRejection>,
) -> Result<axum::Json<Vec<MemberJson>>, Problem> {
    change_and_list(
        &state,
        MemberChange::Remove {
            node: node_of(node)?,
        },
    )
    .await
}

/// Makes `change` in every group; the members once it is made.
async fn change_and_list(
    state: &AppState,
    change: MemberChange,
) -> Result<axum::Json<Vec<MemberJson>>, Problem> {
    state.engine.change_membership(change).await?;
    Ok(axum::Json(members(state)))
}

fn node_of(node: Result<Path<u64>, PathRejection>) -> Result<u64, Problem> {
    let Path(node) =
        node.map_err(|rejection| Problem::invalid_field("node", rejection.body_text()))?;
    Ok(node)
}

/// `GET /v1/cluster/groups/{group}`: the group as this member knows it (as `/v1/status` lists
/// it): its leader and term, its indexes, its members, and on its leader each voter's progress.
#[utoipa::path(get, path = "/v1/cluster/groups/{group}", tag = "cluster",
    summary = "A group as this member knows it",
    params(("group" = u64, Path, description = "the group id")),
    responses(
        (status = 200, description = "the group on this member", body = GroupJson),
        (status = 400, description = "the group is not a number, or a query parameter (this route reads none)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "no such group", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn group(
    State(state): State<AppState>,
    _no_query: NoQuery,
    group: Result<Path<u64>, PathRejection>,
) -> Result<axum::Json<GroupJson>, Problem> {
    let group = known_group(&state, group)?;
    let status = state.engine.group_status(group)?;
    Ok(axum::Json(group_json(status)))
}

/// `POST /v1/cluster/groups/{group}/leader`: sent to the group's leader, which hands the
/// leadership to the voter named (202: under way; `GET /v1/cluster/groups/{group}` shows when it
/// moved).
#[utoipa::path(post, path = "/v1/cluster/groups/{group}/leader", tag = "cluster",
    summary = "Move a group's leadership to another voter",
    params(("group" = u64, Path, description = "the group id")),
    request_body = TransferBody,
    responses(
        (status = 202, description = "the move is under way", body = TransferJson),
        (status = 400, description = "invalid body, node_id names no voter, or a query parameter (this route reads none)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "no such group", body = Problem, content_type = "application/problem+json"),
        (status = 421, description = "this member does not lead the group; leader and leader_url name the leader", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "the group has no leader now, or stopped", body = Problem, content_type = "application/problem+json"),
        JsonBodyProblems,
        AdminProblems
    ))]
pub async fn transfer_leader(
    State(state): State<AppState>,
    _no_query: NoQuery,
    group: Result<Path<u64>, PathRejection>,
    JsonBody(body): JsonBody<TransferBody>,
) -> Result<(StatusCode, axum::Json<TransferJson>), Problem> {
    let group = known_group(&state, group)?;
    let engine = &state.engine;
    let status = engine.group_status(group)?;
    if !status.is_leader {
        return Err(misdirected(&state, group, status.leader));
    }
    engine.transfer_leader(group, body.node_id)?;
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(TransferJson {
            group,
            node_id: body.node_id,
        }),
    ))
}

/// `GET /v1/cluster/groups/{group}/digest`: a digest of the group's state on this member, to
/// compare replicas (equal at equal applied indexes). Reads the whole group.
#[utoipa::path(get, path = "/v1/cluster/groups/{group}/digest", tag = "cluster",
    summary = "A digest of a group's state on this member",
    params(("group" = u64, Path, description = "the group id")),
    responses(
        (status = 200, description = "the digest and the applied index it reflects", body = DigestJson),
        (status = 400, description = "the group is not a number", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "no such group", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn digest(
    State(state): State<AppState>,
    group: Result<Path<u64>, PathRejection>,
) -> Result<axum::Json<DigestJson>, Problem> {
    let group = known_group(&state, group)?;
    let engine = state.engine.clone();
    // Reading a whole group is not for an async worker thread.
    let digest = tokio::task::spawn_blocking(move || engine.state_digest(group))
        .await
        .map_err(|error| Problem::internal("digest", error))??;
    Ok(axum::Json(DigestJson {
        group,
        applied_index: digest.applied_index,
        pairs: digest.pairs,
        sha256: digest.sha256,
    }))
}

/// The group of the path, if it is one of the engine's.
fn known_group(state: &AppState, group: Result<Path<u64>, PathRejection>) -> Result<u64, Problem> {
    let Path(group) =
        group.map_err(|rejection| Problem::invalid_field("group", rejection.body_text()))?;
    if !state.engine.group_ids().contains(&group) {
        return Err(Problem::new(
            StatusCode::NOT_FOUND,
            kind::NOT_FOUND,
            format!("no group {group}"),
        ));
    }
    Ok(group)
}
