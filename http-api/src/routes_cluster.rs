//! `/v1/cluster`: the members as this node knows them, and moving a group's leadership.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use crate::AppState;
use crate::forwarding::misdirected;
use crate::json_body::JsonBody;
use crate::problem::{Problem, kind};

/// One member of the cluster.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MemberJson {
    /// Its node id.
    pub node_id: u64,
    /// Where its peers reach it (absent for a node alone).
    pub raft_addr: Option<String>,
    /// Where its clients reach it, as it told this node when it connected (absent until then).
    pub client_url: Option<String>,
    /// The groups it leads, as this node knows.
    pub leads: usize,
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

/// Every member: ids, addresses, and how many groups each leads.
pub fn members(state: &AppState) -> Vec<MemberJson> {
    let engine = &state.engine;
    let statuses = engine.status();
    let urls = engine.client_urls();
    let raft_addrs = engine
        .config()
        .cluster
        .as_ref()
        .map(|cluster| cluster.members.clone())
        .unwrap_or_default();
    let mut ids: Vec<u64> = raft_addrs.keys().copied().collect();
    if ids.is_empty() {
        ids.push(engine.node_id());
    }
    ids.into_iter()
        .map(|node_id| MemberJson {
            node_id,
            raft_addr: raft_addrs.get(&node_id).map(|a| a.to_string()),
            client_url: urls.get(&node_id).cloned(),
            leads: statuses.iter().filter(|s| s.leader == node_id).count(),
        })
        .collect()
}

/// `GET /v1/cluster/members`.
#[utoipa::path(get, path = "/v1/cluster/members", tag = "cluster",
    summary = "The members: ids, addresses, groups led",
    responses((status = 200, description = "every member", body = Vec<MemberJson>)))]
pub async fn list_members(State(state): State<AppState>) -> axum::Json<Vec<MemberJson>> {
    axum::Json(members(&state))
}

/// `POST /v1/cluster/groups/{group}/leader`: sent to the group's leader, which hands the
/// leadership to the voter named (202: under way; `GET /v1/status` shows when it moved).
#[utoipa::path(post, path = "/v1/cluster/groups/{group}/leader", tag = "cluster",
    summary = "Move a group's leadership to another voter",
    params(("group" = u64, Path, description = "the group id")),
    request_body = TransferBody,
    responses(
        (status = 202, description = "the move is under way", body = TransferJson),
        (status = 400, description = "invalid body, or node_id names no voter", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "no such group", body = Problem, content_type = "application/problem+json"),
        (status = 421, description = "this member does not lead the group; leader and leader_url name the leader", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "the group has no leader now, or stopped", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn transfer_leader(
    State(state): State<AppState>,
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
        .map_err(|error| {
            Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                kind::INTERNAL,
                error.to_string(),
            )
        })??;
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
