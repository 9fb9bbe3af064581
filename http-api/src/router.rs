//! The routes, their shared state and the layers around them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use concord_engine::{Engine, Sessions};
use metrics_exporter_prometheus::PrometheusHandle;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::admin_token::{self, AdminToken};
use crate::batch_places::{self, BatchPlaces};
use crate::problem::{Problem, kind};
use crate::request_deadlines::RequestDeadlines;
use crate::request_durations::RequestDurations;
use crate::request_gate::{self, BodyWait};
use crate::request_stats::RequestStats;
use crate::{openapi, routes_batch, routes_cluster, routes_ops, routes_plugins, routes_sessions};

/// The batch route: its operations take places of their own.
const BATCH_ROUTE: &str = "/v1/sessions/batch";

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

    /// A session request's own place, taken before its body is read; a batch takes one more
    /// for every operation its body could hold (`batch_places.rs`), so that no more batches
    /// read their bodies at once than the node has places for.
    fn admit_at_the_door(
        &self,
        is_batch: bool,
        request: &Request,
    ) -> Result<OwnedSemaphorePermit, Problem> {
        if is_batch {
            self.admit(1 + batch_places::most_operations(request, self.batch_max_operations))
        } else {
            self.admit(1)
        }
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
        .route(
            "/v1/cluster/groups/{group}/digest",
            get(routes_cluster::digest),
        )
        .route("/livez", get(routes_ops::livez))
        .route("/readyz", get(routes_ops::readyz))
        .route("/metrics", get(routes_ops::metrics))
        .route_layer(middleware::from_fn_with_state(
            Bounds {
                state: state.clone(),
                max_body_bytes,
            },
            measure_and_bound,
        ))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(no_route)
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(state)
}

/// What the one layer around every route needs.
#[derive(Clone)]
struct Bounds {
    state: AppState,
    max_body_bytes: usize,
}

/// The one layer around every route: refuses what cannot be read (`request_gate.rs`), admits
/// session requests (503 when too many operations are in progress), answers 504 past
/// the request timeout (408 if the body had not arrived) and records
/// `concord_http_request_duration_seconds{route,status}`.
async fn measure_and_bound(
    State(Bounds {
        state,
        max_body_bytes,
    }): State<Bounds>,
    matched: Option<MatchedPath>,
    mut request: Request,
    next: Next,
) -> Response {
    let body_wait = BodyWait::default();
    request.extensions_mut().insert(body_wait.clone());
    let route = matched.as_ref().map_or("unmatched", MatchedPath::as_str);
    let method = request.method().clone();
    let start = Instant::now();
    let is_session_route = route.starts_with("/v1/sessions");
    // Session and plugin requests take places among the operations in progress.
    let is_operation_route = is_session_route || route.starts_with("/v1/plugins/");
    let response = if let Some(problem) = request_gate::unreadable(&request, max_body_bytes) {
        problem.into_response()
    } else if is_operation_route {
        // Every session or plugin request takes a place among the operations in progress (a batch
        // one more per operation, fitted by its handler once its body is parsed), held until its
        // answer is made, or is refused at once.
        let is_batch = route == BATCH_ROUTE;
        match state.admit_at_the_door(is_batch, &request) {
            Ok(places) if is_batch => {
                let places = BatchPlaces::new(places);
                request.extensions_mut().insert(places.clone());
                let response = timed(&state, &body_wait, start, next.run(request)).await;
                drop(places);
                response
            }
            Ok(_place) => timed(&state, &body_wait, start, next.run(request)).await,
            Err(problem) => problem.into_response(),
        }
    } else {
        timed(&state, &body_wait, start, next.run(request)).await
    };
    let elapsed = start.elapsed();
    if is_session_route {
        state
            .request_stats
            .record(elapsed, response.status().is_server_error());
    }
    state
        .request_durations
        .record(route, &method, response.status(), elapsed);
    response
}

/// `handling`, or 504 past the request timeout counted from `started` (408 if the body had
/// not arrived then).
async fn timed(
    state: &AppState,
    body_wait: &BodyWait,
    started: Instant,
    handling: impl std::future::Future<Output = Response>,
) -> Response {
    let deadline = state.0.deadlines.start(started);
    tokio::select! {
        biased;
        response = handling => response,
        () = deadline.passed() => timed_out(state.0.deadlines.timeout(), body_wait),
    }
}

/// The answer to a request past the request `timeout`: 408 if its body had not arrived, 504
/// otherwise.
fn timed_out(timeout: Duration, body_wait: &BodyWait) -> Response {
    let timeout_ms = timeout.as_millis();
    if body_wait.waiting() {
        Problem::new(
            StatusCode::REQUEST_TIMEOUT,
            kind::BODY_TIMEOUT,
            format!(
                "the body did not arrive within the request timeout of {timeout_ms} ms; \
                 nothing was applied"
            ),
        )
        .into_response()
    } else {
        Problem::new(
            StatusCode::GATEWAY_TIMEOUT,
            kind::TIMEOUT,
            format!(
                "no answer within the request timeout of {timeout_ms} ms; a write may still \
                 apply"
            ),
        )
        .into_response()
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_engine::one_group_in_memory;
    use axum::body::Body;
    use tower::ServiceExt;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_handler_past_the_timeout_is_answered_504() {
        let dir = tempfile::tempdir().unwrap();
        let state = AppState::from(AppStateFields {
            engine: Arc::new(one_group_in_memory(dir.path())),
            metrics: None,
            started_at: Instant::now(),
            batch_max_operations: 1,
            request_timeout: Duration::from_millis(50),
            request_stats: Arc::default(),
            request_durations: Arc::default(),
            admin_token: None,
            in_flight: Arc::new(Semaphore::new(16)),
        });
        // A handler that takes its time after its body arrived (a write waiting for raft).
        let slow = Router::new()
            .route(
                "/slow",
                post(|| async {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    StatusCode::OK
                }),
            )
            .route_layer(middleware::from_fn_with_state(
                Bounds {
                    state: state.clone(),
                    max_body_bytes: 1024,
                },
                measure_and_bound,
            ))
            .with_state(state);
        let request = Request::post("/slow").body(Body::from("{}")).unwrap();
        let response = slow.oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    }
}
