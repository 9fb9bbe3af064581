//! The one layer around every route: refuses what cannot be read (`request_gate.rs`), admits
//! session and plugin requests (503 when too many operations are in progress), answers 504
//! past the request timeout (408 if the body had not arrived) and records each request's
//! duration (`concord_http_request_duration_seconds{route,method,status}`, and the status
//! page's counts of the session routes).
//!
//! A tower layer of its own rather than `axum::middleware::from_fn`: that one clones the
//! route's service and boxes it into a `Next` on every request, and clones its state twice.
//! Here what can be decided before the handler runs is decided in `call`, the handler's
//! future is made there, and one boxed future awaits it.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tokio::sync::OwnedSemaphorePermit;
use tower_layer::Layer;
use tower_service::Service;

use crate::AppState;
use crate::batch_places::{self, BATCH_ROUTE, BatchPlaces};
use crate::problem::{Problem, kind};
use crate::request_gate::{self, BodyWait};

/// The layer: what every request's bounds need.
#[derive(Clone)]
pub(crate) struct RequestLayer {
    state: AppState,
    max_body_bytes: usize,
}

impl RequestLayer {
    pub(crate) fn new(state: AppState, max_body_bytes: usize) -> Self {
        RequestLayer {
            state,
            max_body_bytes,
        }
    }
}

impl<S> Layer<S> for RequestLayer {
    type Service = Bounded<S>;

    fn layer(&self, inner: S) -> Bounded<S> {
        Bounded {
            inner,
            layer: self.clone(),
        }
    }
}

/// A route's service inside the layer.
#[derive(Clone)]
pub(crate) struct Bounded<S> {
    inner: S,
    layer: RequestLayer,
}

/// The places a request holds among the operations in progress, until its answer is made
/// (held, never read: dropping them gives them back).
enum Places {
    /// Not a session or plugin request.
    None,
    /// A session or plugin request's one place.
    One { _held: OwnedSemaphorePermit },
    /// A batch's places, which its handler fits to its operations once its body is parsed.
    Batch { _held: BatchPlaces },
}

impl<S> Service<Request> for Bounded<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request) -> Self::Future {
        let start = Instant::now();
        let state = self.layer.state.clone();
        let matched = request.extensions().get::<MatchedPath>().cloned();
        let route = matched.as_ref().map_or("unmatched", MatchedPath::as_str);
        let method = request.method().clone();
        let is_session_route = route.starts_with("/v1/sessions");
        // Session and plugin requests take places among the operations in progress, held until
        // the answer is made, or are refused at once.
        let is_operation_route = is_session_route || route.starts_with("/v1/plugins/");
        let body_wait = BodyWait::default();
        let admitted = if let Some(problem) =
            request_gate::unreadable(&request, self.layer.max_body_bytes)
        {
            Err(problem)
        } else if !is_operation_route {
            Ok(Places::None)
        } else if route == BATCH_ROUTE {
            // A batch takes, before its body is read, a place for every operation its
            // body could hold (`batch_places.rs`), so that no more batches read their
            // bodies at once than the node has places for; its handler gives back what
            // its operations do not need.
            let places = 1 + batch_places::most_operations(&request, state.batch_max_operations);
            state.admit(places).map(|places| {
                let places = BatchPlaces::new(places);
                request.extensions_mut().insert(places.clone());
                Places::Batch { _held: places }
            })
        } else {
            state.admit(1).map(|place| Places::One { _held: place })
        };
        let handling = match admitted {
            Ok(places) => {
                request.extensions_mut().insert(body_wait.clone());
                Ok((places, self.inner.call(request)))
            }
            Err(problem) => Err(problem),
        };
        Box::pin(async move {
            let response = match handling {
                Ok((places, handling)) => {
                    let response = timed(&state, &body_wait, start, handling).await;
                    drop(places);
                    response
                }
                Err(problem) => problem.into_response(),
            };
            let elapsed = start.elapsed();
            let route = matched.as_ref().map_or("unmatched", MatchedPath::as_str);
            if is_session_route {
                state
                    .request_stats
                    .record(elapsed, response.status().is_server_error());
            }
            state
                .request_durations
                .record(route, &method, response.status(), elapsed);
            Ok(response)
        })
    }
}

/// `handling`'s answer, or 504 past the request timeout counted from `started` (408 if the
/// body had not arrived then).
async fn timed(
    state: &AppState,
    body_wait: &BodyWait,
    started: Instant,
    handling: impl Future<Output = Result<Response, Infallible>>,
) -> Response {
    let deadlines = state.deadlines();
    let deadline = deadlines.start(started);
    tokio::select! {
        biased;
        response = handling => match response {
            Ok(response) => response,
            Err(never) => match never {},
        },
        () = deadline.passed() => timed_out(deadlines.timeout(), body_wait),
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::Router;
    use axum::body::Body;
    use axum::routing::post;
    use tokio::sync::Semaphore;
    use tower::ServiceExt;

    use super::*;
    use crate::AppStateFields;
    use crate::test_engine::one_group_in_memory;

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
            .route_layer(RequestLayer::new(state.clone(), 1024))
            .with_state(state);
        let request = Request::post("/slow").body(Body::from("{}")).unwrap();
        let response = slow.oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    }
}
