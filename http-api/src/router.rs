//! The routes, their shared state and the layers around them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::middleware;
use axum::routing::{delete, get, post, put};
use concord_engine::{Engine, Sessions};
use metrics_exporter_prometheus::PrometheusHandle;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::admin_token::{self, AdminToken};
use crate::batch_places::BATCH_ROUTE;
use crate::problem::{Problem, kind};
use crate::request_deadlines::RequestDeadlines;
use crate::request_durations::RequestDurations;
use crate::request_layer::RequestLayer;
use crate::request_stats::RequestStats;
use crate::{
    openapi, routes_backup, routes_batch, routes_cluster, routes_ops, routes_plugins,
    routes_sessions,
};

/// What every handler can reach. Every request clones it (the layer and the handler each take
/// one), so it is one shared allocation: a clone is one count, not one per field.
#[derive(Clone)]
pub struct AppState(Arc<SharedState>);

struct SharedState {
    fields: AppStateFields,
    /// The deadlines of the requests in progress (`request_timeout`).
    deadlines: Arc<RequestDeadlines>,
}

impl From<AppStateFields> for AppState {
    fn from(fields: AppStateFields) -> Self {
        let deadlines = Arc::new(RequestDeadlines::new(fields.request_timeout));
        AppState(Arc::new(SharedState { fields, deadlines }))
    }
}

impl std::ops::Deref for AppState {
    type Target = AppStateFields;

    fn deref(&self) -> &AppStateFields {
        &self.0.fields
    }
}

/// The parts of an [`AppState`].
pub struct AppStateFields {
    /// The engine.
    pub engine: Arc<Engine>,
    /// Renders `/metrics`; `None` serves an empty page (tests without a recorder).
    pub metrics: Option<PrometheusHandle>,
    /// When the server started.
    pub started_at: Instant,
    /// Operations per batch request.
    pub batch_max_operations: usize,
    /// Past this, a request is answered 504.
    pub request_timeout: Duration,
    /// Counts and latencies of the session routes, for the status page.
    pub request_stats: Arc<RequestStats>,
    /// Every route's latencies, for `/metrics`.
    pub request_durations: Arc<RequestDurations>,
    /// The routes that change the cluster require it, when set.
    pub admin_token: Option<AdminToken>,
    /// Session operations in progress at most (a batch counts each of its operations): past
    /// it, a request is answered 503 at once instead of queueing behind the others.
    pub in_flight: Arc<Semaphore>,
}

impl AppState {
    /// Places for `operations` more session operations, held until dropped; 503 with
    /// `Retry-After` if the node has that many in progress already.
    pub fn admit(&self, operations: usize) -> Result<OwnedSemaphorePermit, Problem> {
        let count = u32::try_from(operations).unwrap_or(u32::MAX);
        self.in_flight
            .clone()
            .try_acquire_many_owned(count)
            .map_err(|_| overloaded())
    }

    /// The deadlines of the requests in progress.
    pub(crate) fn deadlines(&self) -> &Arc<RequestDeadlines> {
        &self.0.deadlines
    }

    /// The session API, or a problem if the engine runs another state machine.
    pub fn sessions(&self) -> Result<Sessions<'_>, Problem> {
        Ok(self.engine.sessions()?)
    }
}

/// 503 with `Retry-After`: no place among the operations in progress.
fn overloaded() -> Problem {
    Problem {
        retry_after_secs: Some(1),
        ..Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            kind::OVERLOADED,
            "the node has as many operations in progress as it takes \
             (http_max_in_flight_operations)",
        )
    }
}

/// The HTTP API over `state`, with a body limit of `max_body_bytes`.
pub fn router(state: AppState, max_body_bytes: usize) -> Router {
    // The routes that change the cluster, behind the admin token.
    let admin = Router::new()
        .route("/v1/cluster/members", post(routes_cluster::add_member))
        .route(
            "/v1/cluster/members/{node}",
            delete(routes_cluster::remove_member),
        )
        .route(
            "/v1/cluster/members/{node}/promote",
            post(routes_cluster::promote_member),
        )
        .route(
            "/v1/cluster/groups/{group}/leader",
            post(routes_cluster::transfer_leader),
        )
        .route("/v1/plugins/{name}", put(routes_plugins::upgrade))
        .route("/v1/backup", get(routes_backup::backup))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            admin_token::require_admin,
        ));
    Router::new()
        .merge(admin)
        .route(
            "/v1/sessions",
            post(routes_sessions::create).get(routes_sessions::list),
        )
        .route(BATCH_ROUTE, post(routes_batch::batch))
        .route(
            "/v1/sessions/{client_id}",
            get(routes_sessions::get)
                .put(routes_sessions::replace)
                .patch(routes_sessions::patch)
                .delete(routes_sessions::delete),
        )
        .route("/v1/plugins", get(routes_plugins::list))
        .route("/v1/plugins/{name}/commands", post(routes_plugins::command))
        .route(
            "/v1/plugins/{name}/commands/batch",
            post(routes_plugins::command_batch),
        )
        .route(
            "/v1/plugins/{name}/keys/{key}",
            get(routes_plugins::read_key),
        )
        .route("/", get(routes_ops::status_page))
        .route("/openapi.json", get(openapi::openapi_json))
        .route("/docs", get(openapi::docs_page))
        .route("/v1/status", get(routes_ops::status))
        .route("/v1/cluster/members", get(routes_cluster::list_members))
        .route("/v1/cluster/groups/{group}", get(routes_cluster::group))
        .route(
            "/v1/cluster/groups/{group}/digest",
            get(routes_cluster::digest),
        )
        .route("/livez", get(routes_ops::livez))
        .route("/readyz", get(routes_ops::readyz))
        .route("/metrics", get(routes_ops::metrics))
        .route_layer(RequestLayer::new(state.clone(), max_body_bytes))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(no_route)
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(state)
}

async fn no_route() -> Problem {
    Problem::new(StatusCode::NOT_FOUND, kind::NO_ROUTE, "no such route")
}

async fn method_not_allowed() -> Problem {
    Problem::new(
        StatusCode::METHOD_NOT_ALLOWED,
        kind::METHOD_NOT_ALLOWED,
        "the route does not take this method",
    )
}
