//! `/openapi.json`, generated from the handlers' and types' annotations, and `/docs`, a page
//! that renders it (served by the binary itself, no external assets).

use utoipa::OpenApi;

use crate::group_json::{GroupJson, VoterJson};
use crate::problem::Problem;
use crate::request_stats::RequestStatsJson;
use crate::routes_batch::{BatchBody, BatchJson, Operation, OperationResult};
use crate::routes_cluster::{AddMemberBody, DigestJson, MemberJson, TransferBody, TransferJson};
use crate::routes_ops::StatusJson;
use crate::routes_plugins::{
    CommandBatchBody, CommandBatchJson, CommandBody, CommandOutcomeJson, CommandResultJson,
    PluginFaultsJson, PluginJson, PluginsJson, ServedPluginJson, UpgradeJson,
};
use crate::routes_sessions::ListJson;
use crate::session_json::{CreateBody, LastWillJson, PatchBody, ReplaceBody, SessionJson};
use crate::status_groups::GroupSummaryJson;
use crate::{
    routes_backup, routes_batch, routes_cluster, routes_ops, routes_plugins, routes_sessions,
};

/// The API's description.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Concord",
        description = "MQTT-style session CRUD, and commands to served plugins, over Concord's \
                       replicated engine. Every error \
                       is application/problem+json with a stable `type` \
                       (urn:concord:problem:*)."
    ),
    paths(
        routes_sessions::create,
        routes_sessions::get,
        routes_sessions::replace,
        routes_sessions::patch,
        routes_sessions::delete,
        routes_sessions::list,
        routes_batch::batch,
        routes_plugins::list,
        routes_plugins::command,
        routes_plugins::command_batch,
        routes_plugins::read_key,
        routes_plugins::upgrade,
        routes_ops::status,
        routes_cluster::list_members,
        routes_cluster::add_member,
        routes_cluster::promote_member,
        routes_cluster::remove_member,
        routes_cluster::group,
        routes_cluster::transfer_leader,
        routes_cluster::digest,
        routes_backup::backup,
        routes_ops::livez,
        routes_ops::readyz,
        routes_ops::metrics,
    ),
    components(schemas(
        SessionJson,
        LastWillJson,
        CreateBody,
        ReplaceBody,
        PatchBody,
        ListJson,
        BatchBody,
        Operation,
        BatchJson,
        OperationResult,
        StatusJson,
        GroupJson,
        GroupSummaryJson,
        PluginJson,
        PluginFaultsJson,
        VoterJson,
        MemberJson,
        AddMemberBody,
        TransferBody,
        TransferJson,
        DigestJson,
        RequestStatsJson,
        PluginsJson,
        ServedPluginJson,
        CommandBody,
        CommandResultJson,
        CommandBatchBody,
        CommandBatchJson,
        CommandOutcomeJson,
        UpgradeJson,
        Problem,
    )),
    tags(
        (name = "sessions", description = "MQTT-style client sessions"),
        (name = "plugins", description = "the plugins served beside the sessions: commands by key, stored keys"),
        (name = "operations", description = "health, status and metrics"),
        (name = "cluster", description = "the members, and where groups are led")
    )
)]
pub struct ApiDoc;

/// `GET /openapi.json`.
pub async fn openapi_json() -> axum::Json<utoipa::openapi::OpenApi> {
    axum::Json(ApiDoc::openapi())
}

/// `GET /docs`: the API reference, rendered from `/openapi.json` in the browser.
pub async fn docs_page() -> axum::response::Html<&'static str> {
    axum::response::Html(include_str!("docs_page.html"))
}
