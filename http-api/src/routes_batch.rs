//! `POST /v1/sessions/batch`: many operations in one request, one result each.
//!
//! The creates go to raft together, one batch per group (`Sessions::create_many`): one future
//! and one wake for each group's creates. The other operations run concurrently, so writes to
//! the same group ride the same raft entry. Batches are the lever that matters most when
//! clients can use them.

use axum::Extension;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use concord_engine::{Session, SessionFields};
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;

use crate::AppState;
use crate::batch_places::BatchPlaces;
use crate::json_body::{JsonBody, object, objects};
use crate::no_query::NoQuery;
use crate::openapi_shared::JsonBodyProblems;
use crate::problem::Problem;
use crate::routes_sessions::parse_consistency;
use crate::session_json::{PatchBody, ReplaceBody, SessionJson};

/// The request.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchBody {
    /// At most `batch_max_operations` of them.
    #[serde(deserialize_with = "objects")]
    pub operations: Vec<Operation>,
}

/// One operation, tagged by `op`.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum Operation {
    /// Like `POST /v1/sessions`.
    Create {
        /// The client id.
        client_id: String,
        /// The fields.
        #[serde(default, deserialize_with = "object")]
        session: ReplaceBody,
    },
    /// Like `GET /v1/sessions/{client_id}`.
    Get {
        /// The client id.
        client_id: String,
        /// `linearizable`, `lease` or `stale`.
        #[serde(default)]
        consistency: Option<String>,
    },
    /// Like `PUT`.
    Replace {
        /// The client id.
        client_id: String,
        /// The fields.
        #[serde(default, deserialize_with = "object")]
        session: ReplaceBody,
        /// Like `If-Match`.
        #[serde(default)]
        if_match: Option<u64>,
    },
    /// Like `PATCH`.
    Update {
        /// The client id.
        client_id: String,
        /// The fields to change.
        #[serde(default, deserialize_with = "object")]
        patch: PatchBody,
        /// Like `If-Match`.
        #[serde(default)]
        if_match: Option<u64>,
    },
    /// Like `DELETE`.
    Delete {
        /// The client id.
        client_id: String,
        /// Like `If-Match`.
        #[serde(default)]
        if_match: Option<u64>,
    },
}

/// The answer: one result per operation, in order.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BatchJson {
    /// In the order of the operations.
    pub results: Vec<OperationResult>,
}

/// What one operation would have answered on its own.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OperationResult {
    /// The status the single request would have had.
    pub status: u16,
    /// The session, on success (absent for a delete).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub session: Option<SessionJson>,
    /// The problem, on failure.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    #[schema(value_type = Option<Problem>)]
    pub problem: Option<serde_json::Value>,
}

/// `POST /v1/sessions/batch`.
#[utoipa::path(
    post,
    path = "/v1/sessions/batch",
    tag = "sessions",
    summary = "Run up to batch_max_operations operations, one result each: the creates go to raft together (one batch per group, in their order), the others run concurrently",
    request_body = BatchBody,
    responses(
        (status = 200, description = "one result per operation, in order; Retry-After when one was refused for overload or an election", body = BatchJson),
        (status = 400, description = "invalid body, field, query or If-Match, or more than batch_max_operations operations", body = Problem, content_type = "application/problem+json"),
        JsonBodyProblems
    )
)]
pub async fn batch(
    State(state): State<AppState>,
    _no_query: NoQuery,
    places: Option<Extension<BatchPlaces>>,
    JsonBody(body): JsonBody<BatchBody>,
) -> Result<Response, Problem> {
    let max = state.batch_max_operations;
    if body.operations.len() > max {
        return Err(Problem::invalid_field(
            "operations",
            format!(
                "{} operations; at most {max} per batch",
                body.operations.len()
            ),
        ));
    }
    let sessions = state.sessions()?;
    let count = body.operations.len();
    // The places taken at the door are fitted to the operations found; without them (the
    // handler called outside the router's layer) they are taken here.
    let _places = match places {
        Some(Extension(places)) => {
            places.fit(count, &state)?;
            None
        }
        None => Some(state.admit(count)?),
    };
    // The creates go together, one raft batch per group (`Sessions::create_many`); every
    // other operation runs in a task of its own, concurrently with them.
    let mut outcomes: Vec<Option<Outcome>> = (0..count).map(|_| None).collect();
    let mut creates = Vec::new();
    let mut tasks = JoinSet::new();
    for (index, operation) in body.operations.into_iter().enumerate() {
        match operation {
            Operation::Create { client_id, session } => match session.into_fields() {
                Ok(fields) => creates.push((index, client_id, fields)),
                Err(problem) => outcomes[index] = Some(Err(problem)),
            },
            other => {
                let state = state.clone();
                tasks.spawn(async move { (index, run(&state, other).await) });
            }
        }
    }
    if !creates.is_empty() {
        let (places, inputs): (Vec<usize>, Vec<(String, SessionFields)>) = creates
            .into_iter()
            .map(|(index, client_id, fields)| (index, (client_id, fields)))
            .unzip();
        for (index, created) in places.into_iter().zip(sessions.create_many(inputs).await) {
            outcomes[index] = Some(
                created
                    .map(|session| (StatusCode::CREATED, Some(session)))
                    .map_err(Problem::from),
            );
        }
    }
    let outcomes = join_into(tasks, outcomes, "operation").await?;
    let retry_after_secs = longest_retry_after(&outcomes);
    let results: Vec<OperationResult> = outcomes
        .into_iter()
        .map(|outcome| match outcome {
            Ok((status, session)) => OperationResult {
                status: status.as_u16(),
                session: session.map(SessionJson::from),
                problem: None,
            },
            Err(problem) => OperationResult {
                status: problem.status,
                session: None,
                problem: serde_json::to_value(&problem).ok(),
            },
        })
        .collect();
    Ok(json_with_retry_after(
        BatchJson { results },
        retry_after_secs,
    ))
}

/// The longest wait among the operations of a batch refused for overload or an election:
/// the batch's `Retry-After` says it for all of them.
pub(crate) fn longest_retry_after<T>(outcomes: &[Result<T, Problem>]) -> Option<u32> {
    outcomes
        .iter()
        .filter_map(|outcome| outcome.as_ref().err())
        .filter_map(|problem| problem.retry_after_secs)
        .max()
}

/// `body` as JSON, with `Retry-After: retry_after_secs` when given.
pub(crate) fn json_with_retry_after<B: serde::Serialize>(
    body: B,
    retry_after_secs: Option<u32>,
) -> Response {
    let mut response = axum::Json(body).into_response();
    if let Some(seconds) = retry_after_secs {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

/// `known` with the outcomes of `tasks` (each returns its index) put in their places, once
/// every place holds one; 500 if a task panicked or a place was left empty (`what` names the
/// kind of operation in the problem).
async fn join_into<T: 'static>(
    mut tasks: JoinSet<(usize, T)>,
    mut known: Vec<Option<T>>,
    what: &str,
) -> Result<Vec<T>, Problem> {
    while let Some(joined) = tasks.join_next().await {
        let (index, outcome) = joined
            .map_err(|error| Problem::internal("batch", format!("a batch {what}: {error}")))?;
        if let Some(place) = known.get_mut(index) {
            *place = Some(outcome);
        }
    }
    known
        .into_iter()
        .map(|outcome| {
            outcome.ok_or_else(|| {
                Problem::internal("batch", format!("a batch {what} went unanswered"))
            })
        })
        .collect()
}

/// What one operation of a batch answered.
type Outcome = Result<(StatusCode, Option<Session>), Problem>;

/// Runs `operation` alone, as its own request would. The handler sends a batch's creates
/// through `Sessions::create_many` instead, to batch them.
async fn run(state: &AppState, operation: Operation) -> Outcome {
    let sessions = state.sessions()?;
    Ok(match operation {
        Operation::Create { client_id, session } => {
            let fields = session.into_fields()?;
            let created = sessions.create(&client_id, fields).await?;
            (StatusCode::CREATED, Some(created))
        }
        Operation::Get {
            client_id,
            consistency,
        } => {
            let consistency = parse_consistency(consistency.as_deref())?;
            (
                StatusCode::OK,
                Some(sessions.get(&client_id, consistency).await?),
            )
        }
        Operation::Replace {
            client_id,
            session,
            if_match,
        } => {
            let fields = session.into_fields()?;
            let replaced = sessions.replace(&client_id, fields, if_match).await?;
            (StatusCode::OK, Some(replaced))
        }
        Operation::Update {
            client_id,
            patch,
            if_match,
        } => {
            let patch = patch.into_patch()?;
            let updated = sessions.update(&client_id, patch, if_match).await?;
            (StatusCode::OK, Some(updated))
        }
        Operation::Delete {
            client_id,
            if_match,
        } => {
            sessions.delete(&client_id, if_match).await?;
            (StatusCode::NO_CONTENT, None)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::kind;

    fn refused(retry_after_secs: Option<u32>) -> Result<(), Problem> {
        Err(Problem {
            retry_after_secs,
            ..Problem::new(StatusCode::SERVICE_UNAVAILABLE, kind::OVERLOADED, "full")
        })
    }

    #[test]
    fn a_batch_says_the_longest_wait_of_its_refused_operations() {
        let outcomes = [Ok(()), refused(Some(1)), refused(None), refused(Some(2))];
        assert_eq!(longest_retry_after(&outcomes), Some(2));
        let response = json_with_retry_after(serde_json::json!({}), Some(2));
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
        assert_eq!(longest_retry_after(&[Ok(()), refused(None)]), None);
        let response = json_with_retry_after(serde_json::json!({}), None);
        assert!(response.headers().get(header::RETRY_AFTER).is_none());
    }
}
