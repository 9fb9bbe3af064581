//! Operations: the status page `/`, `/v1/status`, `/livez`, `/readyz`, `/metrics`.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use crate::AppState;
use crate::group_json::{GroupJson, group_json};
use crate::problem::{Problem, kind};
use crate::request_stats::RequestStatsJson;
use crate::routes_cluster::{MemberJson, members};
use crate::routes_plugins::{PluginJson, ServedPluginJson, plugin_json};
use crate::routes_sessions::query;
use crate::status_groups::{GROUP_LIMIT_MAX, GroupSummaryJson, needing_attention_first, summarize};

/// `GET /v1/status?group_limit=`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusQuery {
    /// List at most this many groups, 0..=65536; absent: every group.
    pub group_limit: Option<String>,
}

/// `GET /v1/status`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StatusJson {
    /// This node's id.
    pub node_id: u64,
    /// Seconds since the server started.
    pub uptime_secs: u64,
    /// The same in milliseconds: the status page measures rates against it, so that they
    /// are right whatever the browser's clock does.
    pub uptime_ms: u64,
    /// Storage backend.
    pub backend: String,
    /// `raft` or `solo`.
    pub consensus: String,
    /// Every group and whether it is ready.
    pub ready: bool,
    /// How long the oldest log write in progress has been running, in milliseconds; absent
    /// while none is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_write_in_progress_ms: Option<u64>,
    /// This node's log writes stall: one has run longer than a second, now or less than five
    /// seconds ago. The node is not ready meanwhile.
    #[serde(default)]
    pub log_write_stalled: bool,
    /// Every member of the cluster (this node alone when it runs alone).
    pub members: Vec<MemberJson>,
    /// Snapshots this node is sending to peers now.
    pub snapshots_sending: usize,
    /// Counts over every group, listed or not. Read a moment before the groups listed, so a
    /// group that changed in between is counted as it was.
    pub group_summary: GroupSummaryJson,
    /// One entry per group, in group order; with `group_limit`, at most that many, those that
    /// most need looking at chosen first (stopped, without a leader, installing a snapshot,
    /// catching up, changing membership, then the furthest behind).
    pub groups: Vec<GroupJson>,
    /// Session requests so far, for rates and percentiles.
    pub http: RequestStatsJson,
    /// The wasm plugin the main groups run; absent when they run the native session logic.
    pub plugin: Option<PluginJson>,
    /// The plugins served beside it (`--plugin`), each over its own groups.
    pub served_plugins: Vec<ServedPluginJson>,
}

/// `GET /v1/status`.
#[utoipa::path(get, path = "/v1/status", tag = "operations", summary = "The node and its groups",
    params(
        ("group_limit" = Option<u32>, Query, minimum = 0, maximum = 65536,
            description = "list at most this many groups, those that most need looking at first; absent: every group")
    ),
    responses(
        (status = 200, description = "the node", body = StatusJson),
        (status = 400, description = "invalid query", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn status(
    State(state): State<AppState>,
    status_query: Result<Query<StatusQuery>, QueryRejection>,
) -> Result<axum::Json<StatusJson>, Problem> {
    let group_limit = match query(status_query)?.group_limit.as_deref() {
        None => GROUP_LIMIT_MAX,
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|limit| *limit <= GROUP_LIMIT_MAX)
            .ok_or_else(|| {
                Problem::invalid_field("group_limit", format!("must be 0..={GROUP_LIMIT_MAX}"))
            })?,
    };
    let engine = &state.engine;
    // Ranked and counted from each group's health; only the groups listed are read in full.
    let health = engine.health();
    let groups: Vec<GroupJson> = needing_attention_first(&health.groups, group_limit)
        .into_iter()
        .filter_map(|group| engine.group_status(group).ok())
        .map(group_json)
        .collect();
    let group_summary = summarize(&health.groups, groups.len());
    Ok(axum::Json(StatusJson {
        node_id: engine.node_id(),
        uptime_secs: state.started_at.elapsed().as_secs(),
        uptime_ms: state.started_at.elapsed().as_millis() as u64,
        backend: engine.backend().name().into(),
        consensus: engine.config().consensus.name().into(),
        ready: health.ready,
        log_write_in_progress_ms: engine
            .log_write_in_progress_for()
            .map(|running| running.as_millis() as u64),
        log_write_stalled: engine.log_write_stalled(),
        members: members(&state),
        snapshots_sending: engine.snapshots_sending(),
        group_summary,
        groups,
        http: state.request_stats.read(),
        plugin: engine.plugin().as_ref().map(plugin_json),
        served_plugins: crate::routes_plugins::served_plugins(engine),
    }))
}

/// `GET /`: the status page, live charts of `/v1/status` drawn by the page itself (no
/// external scripts).
pub async fn status_page() -> axum::response::Html<&'static str> {
    axum::response::Html(include_str!("status_page.html"))
}

/// `GET /livez`: the process answers.
#[utoipa::path(get, path = "/livez", tag = "operations", summary = "The process answers",
    responses((status = 200, description = "alive", body = String, content_type = "text/plain")))]
pub async fn livez() -> &'static str {
    "ok\n"
}

/// `GET /readyz`: every group has a leader, runs, and is caught up, and no log write has
/// stalled (`Engine::is_ready`).
#[utoipa::path(get, path = "/readyz", tag = "operations",
    summary = "Every group has a leader, runs and is caught up",
    responses(
        (status = 200, description = "ready", body = String, content_type = "text/plain"),
        (status = 503, description = "not ready", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn readyz(State(state): State<AppState>) -> Result<&'static str, Problem> {
    if state.engine.is_ready() {
        Ok("ready\n")
    } else {
        Err(Problem {
            retry_after_secs: Some(1),
            ..Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                kind::UNAVAILABLE,
                "not ready: a group has no leader, is stopped, is still applying or awaits a snapshot, or a log write has stalled (see /v1/status)",
            )
        })
    }
}

/// `GET /metrics`: Prometheus text format.
#[utoipa::path(get, path = "/metrics", tag = "operations", summary = "Prometheus metrics",
    responses((status = 200, description = "text format 0.0.4", body = String, content_type = "text/plain")))]
pub async fn metrics(State(state): State<AppState>) -> Response {
    // Read at the scrape: the worker inside a stalled write cannot publish anything.
    let in_progress = state.engine.log_write_in_progress_for();
    metrics::gauge!("concord_log_write_in_progress_seconds")
        .set(in_progress.map_or(0.0, |running| running.as_secs_f64()));
    let body = state
        .metrics
        .as_ref()
        .map_or_else(String::new, |handle| handle.render());
    let mut response = body.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    response
}
