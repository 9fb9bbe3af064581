//! `/v1/sessions`: create, read, replace, patch, delete and list sessions.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use concord_engine::{Consistency, PAGE_LIMIT_MAX, Session};
use serde::{Deserialize, Serialize};

use crate::AppState;
use crate::forwarding::Forwarding;
use crate::json_body::JsonBody;
use crate::no_query::NoQuery;
use crate::openapi_shared::{
    ForwardHeader, IfMatchHeader, JsonBodyProblems, KeyedProblems, SessionVersionProblems,
};
use crate::problem::Problem;
use crate::session_json::{CreateBody, PatchBody, ReplaceBody, SessionJson};

/// Where a session's URL starts; its percent-encoded client id follows.
const SESSIONS_PATH: &str = "/v1/sessions/";

/// Sessions per list page when `limit` is not given.
pub const DEFAULT_PAGE_LIMIT: u32 = 100;

/// `?consistency=` of reads.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadQuery {
    /// `linearizable` (default), `lease` or `stale`.
    pub consistency: Option<String>,
}

/// `GET /v1/sessions?prefix=&limit=&page_token=&consistency=`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only client ids starting with this.
    pub prefix: Option<String>,
    /// Sessions per page, 1..=1000 (default 100).
    pub limit: Option<String>,
    /// `next_page_token` of the previous page.
    pub page_token: Option<String>,
    /// See [`ReadQuery`].
    pub consistency: Option<String>,
}

/// One page of a listing.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ListJson {
    /// In client-id order.
    pub sessions: Vec<SessionJson>,
    /// Pass as `page_token` for the next page; absent on the last page.
    pub next_page_token: Option<String>,
}

/// Parses `?consistency=`.
pub fn parse_consistency(word: Option<&str>) -> Result<Consistency, Problem> {
    match word {
        None => Ok(Consistency::default()),
        Some(word) => word
            .parse()
            .map_err(|e: String| Problem::invalid_field("consistency", e)),
    }
}

/// The client id of the path, or a problem (for example, percent-encoded bytes that are not
/// UTF-8).
pub fn path_client_id(path: Result<Path<String>, PathRejection>) -> Result<String, Problem> {
    path.map(|Path(client_id)| client_id)
        .map_err(|rejection| Problem::invalid_field("client_id", rejection.body_text()))
}

/// The query's value, or a 400 naming `query`.
pub(crate) fn query<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, Problem> {
    query
        .map(|Query(value)| value)
        .map_err(|rejection| Problem::invalid_field("query", rejection.body_text()))
}

/// The session with its version as the `ETag`.
fn session_response(status: StatusCode, session: Session) -> Response {
    let etag = HeaderValue::try_from(format!("\"{}\"", session.version));
    let json = SessionJson::from(session);
    // Sized for the session at once: `axum::Json` starts from a small buffer and grows it
    // twice for a session with a will, on every answer.
    let mut body = Vec::with_capacity(json.encoded_len_estimate());
    let mut response = match serde_json::to_writer(&mut body, &json) {
        Ok(()) => (
            status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body,
        )
            .into_response(),
        Err(error) => {
            let cause = format!("cannot encode the session: {error}");
            return Problem::internal("encoding", cause).into_response();
        }
    };
    if let Ok(etag) = etag {
        response.headers_mut().insert(header::ETAG, etag);
    }
    response
}

/// `If-Match: "<version>"` (or `*`): the version a write expects. An entity tag is quoted
/// (RFC 9110); a bare number is refused rather than guessed at.
pub fn expected_version(headers: &HeaderMap) -> Result<Option<u64>, Problem> {
    let Some(value) = headers.get(header::IF_MATCH) else {
        return Ok(None);
    };
    let invalid = || {
        Problem::invalid_field(
            "If-Match",
            "expected one session version as an entity tag, e.g. \"3\", or *",
        )
    };
    let text = value.to_str().map_err(|_| invalid())?.trim();
    if text == "*" {
        return Ok(None);
    }
    let digits = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .ok_or_else(invalid)?;
    digits.parse::<u64>().map(Some).map_err(|_| invalid())
}

/// `POST /v1/sessions`.
#[utoipa::path(
    post,
    path = "/v1/sessions",
    tag = "sessions",
    summary = "Create a session",
    params(
        ForwardHeader
    ),
    request_body = CreateBody,
    responses(
        (status = 201, description = "created; ETag is the version, Location the session", body = SessionJson),
        (status = 400, description = "invalid body, field, query or If-Match", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "the client id has a session", body = Problem, content_type = "application/problem+json"),
        JsonBodyProblems,
        KeyedProblems
    )
)]
pub async fn create(
    State(state): State<AppState>,
    _no_query: NoQuery,
    forwarding: Forwarding,
    JsonBody(body): JsonBody<CreateBody>,
) -> Result<Response, Problem> {
    let (client_id, fields) = body.into_parts()?;
    forwarding.check(&state, client_id.as_bytes())?;
    let session = state.sessions()?.create(&client_id, fields).await?;
    let mut response = session_response(StatusCode::CREATED, session);
    let mut location = String::with_capacity(SESSIONS_PATH.len() + 3 * client_id.len());
    location.push_str(SESSIONS_PATH);
    percent_encode_into(&mut location, &client_id);
    if let Ok(location) = HeaderValue::try_from(location) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    Ok(response)
}

/// `GET /v1/sessions/{client_id}`.
#[utoipa::path(
    get,
    path = "/v1/sessions/{client_id}",
    tag = "sessions",
    summary = "Read a session",
    params(
        ("client_id" = String, Path, description = "percent-encoded client id"),
        ForwardHeader,
        ("consistency" = Option<String>, Query, pattern = "^(linearizable|lease|stale)$", description = "linearizable (default), lease or stale")
    ),
    responses(
        (status = 200, description = "the session; ETag is its version", body = SessionJson),
        (status = 400, description = "invalid body, field, query or If-Match", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "no such session", body = Problem, content_type = "application/problem+json"),
        KeyedProblems
    )
)]
pub async fn get(
    State(state): State<AppState>,
    forwarding: Forwarding,
    path: Result<Path<String>, PathRejection>,
    read: Result<Query<ReadQuery>, QueryRejection>,
) -> Result<Response, Problem> {
    let client_id = path_client_id(path)?;
    let consistency = parse_consistency(query(read)?.consistency.as_deref())?;
    if consistency != Consistency::Stale {
        forwarding.check(&state, client_id.as_bytes())?;
    }
    let session = state.sessions()?.get(&client_id, consistency).await?;
    Ok(session_response(StatusCode::OK, session))
}

/// `PUT /v1/sessions/{client_id}`.
#[utoipa::path(
    put,
    path = "/v1/sessions/{client_id}",
    tag = "sessions",
    summary = "Replace every field of a session",
    params(
        ("client_id" = String, Path, description = "percent-encoded client id"),
        ForwardHeader,
        IfMatchHeader
    ),
    request_body = ReplaceBody,
    responses(
        (status = 200, description = "the new session", body = SessionJson),
        (status = 400, description = "invalid body, field, query or If-Match", body = Problem, content_type = "application/problem+json"),
        JsonBodyProblems,
        KeyedProblems,
        SessionVersionProblems
    )
)]
pub async fn replace(
    State(state): State<AppState>,
    _no_query: NoQuery,
    forwarding: Forwarding,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<ReplaceBody>,
) -> Result<Response, Problem> {
    let client_id = path_client_id(path)?;
    forwarding.check(&state, client_id.as_bytes())?;
    let expected = expected_version(&headers)?;
    let fields = body.into_fields()?;
    let session = state
        .sessions()?
        .replace(&client_id, fields, expected)
        .await?;
    Ok(session_response(StatusCode::OK, session))
}

/// `PATCH /v1/sessions/{client_id}`.
#[utoipa::path(
    patch,
    path = "/v1/sessions/{client_id}",
    tag = "sessions",
    summary = "Change the fields present in the body",
    params(
        ("client_id" = String, Path, description = "percent-encoded client id"),
        ForwardHeader,
        IfMatchHeader
    ),
    request_body = PatchBody,
    responses(
        (status = 200, description = "the new session", body = SessionJson),
        (status = 400, description = "invalid body, field, query or If-Match", body = Problem, content_type = "application/problem+json"),
        JsonBodyProblems,
        KeyedProblems,
        SessionVersionProblems
    )
)]
pub async fn patch(
    State(state): State<AppState>,
    _no_query: NoQuery,
    forwarding: Forwarding,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<PatchBody>,
) -> Result<Response, Problem> {
    let client_id = path_client_id(path)?;
    forwarding.check(&state, client_id.as_bytes())?;
    let expected = expected_version(&headers)?;
    let patch = body.into_patch()?;
    let session = state
        .sessions()?
        .update(&client_id, patch, expected)
        .await?;
    Ok(session_response(StatusCode::OK, session))
}

/// `DELETE /v1/sessions/{client_id}`.
#[utoipa::path(
    delete,
    path = "/v1/sessions/{client_id}",
    tag = "sessions",
    summary = "Delete a session",
    params(
        ("client_id" = String, Path, description = "percent-encoded client id"),
        ForwardHeader,
        IfMatchHeader
    ),
    responses(
        (status = 204, description = "deleted"),
        (status = 400, description = "invalid body, field, query or If-Match", body = Problem, content_type = "application/problem+json"),
        KeyedProblems,
        SessionVersionProblems
    )
)]
pub async fn delete(
    State(state): State<AppState>,
    _no_query: NoQuery,
    forwarding: Forwarding,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Result<StatusCode, Problem> {
    let client_id = path_client_id(path)?;
    forwarding.check(&state, client_id.as_bytes())?;
    let expected = expected_version(&headers)?;
    state.sessions()?.delete(&client_id, expected).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/sessions`.
#[utoipa::path(
    get,
    path = "/v1/sessions",
    tag = "sessions",
    summary = "List sessions by prefix, in client-id order across all groups",
    params(
        ("prefix" = Option<String>, Query, description = "only client ids starting with this"),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "1..=1000, default 100"),
        ("page_token" = Option<String>, Query, description = "next_page_token of the previous page"),
        ("consistency" = Option<String>, Query, pattern = "^(linearizable|lease|stale)$", description = "linearizable (default), lease or stale")
    ),
    responses(
        (status = 200, description = "one page", body = ListJson),
        (status = 400, description = "invalid body, field, query or If-Match", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "overloaded (Retry-After), retry or unavailable", body = Problem, content_type = "application/problem+json"),
        (status = 504, description = "no answer in time", body = Problem, content_type = "application/problem+json")
    )
)]
pub async fn list(
    State(state): State<AppState>,
    list: Result<Query<ListQuery>, QueryRejection>,
) -> Result<axum::Json<ListJson>, Problem> {
    let list = query(list)?;
    let consistency = parse_consistency(list.consistency.as_deref())?;
    let limit = match list.limit.as_deref() {
        None => DEFAULT_PAGE_LIMIT,
        Some(text) => text
            .parse::<u32>()
            .ok()
            .filter(|limit| (1..=PAGE_LIMIT_MAX).contains(limit))
            .ok_or_else(|| {
                Problem::invalid_field("limit", format!("must be 1..={PAGE_LIMIT_MAX}"))
            })?,
    };
    let start_after = list
        .page_token
        .as_deref()
        .map(|token| {
            URL_SAFE_NO_PAD
                .decode(token)
                .ok()
                .and_then(|bytes| String::from_utf8(bytes).ok())
                .ok_or_else(|| {
                    Problem::invalid_field("page_token", "not a token this server issued")
                })
        })
        .transpose()?;
    let page = state
        .sessions()?
        .list(
            list.prefix.as_deref().unwrap_or(""),
            start_after.as_deref(),
            limit,
            consistency,
        )
        .await?;
    Ok(axum::Json(ListJson {
        sessions: page.sessions.into_iter().map(SessionJson::from).collect(),
        next_page_token: page
            .next_start_after
            .map(|id| URL_SAFE_NO_PAD.encode(id.as_bytes())),
    }))
}

/// Percent-encodes everything but unreserved characters, for the `Location` header.
/// Appends `text` to `out`, every byte but the unreserved ones (RFC 3986) as `%XX`.
fn percent_encode_into(out: &mut String, text: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0xF)]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session answer: its JSON in a buffer sized for it at once, its version as the ETag.
    #[tokio::test]
    async fn a_session_answer_is_its_json_with_its_version_as_etag() {
        use concord_engine::{LastWill, SessionFields};
        let session = Session {
            client_id: "dev/1 é".into(),
            fields: SessionFields {
                session_expiry_interval_secs: u32::MAX,
                clean_start: true,
                last_will: Some(LastWill {
                    topic: "t/".repeat(40),
                    payload: vec![0xFF; 150],
                    qos: 2,
                    retain: true,
                    delay_interval_secs: u32::MAX,
                }),
                broker_id: "broker-".repeat(9),
                connection_id: u64::MAX,
            },
            created_at_ms: u64::MAX,
            updated_at_ms: u64::MAX,
            version: u64::MAX,
        };
        let json = SessionJson::from(session.clone());
        let encoded = serde_json::to_vec(&json).unwrap();
        assert!(
            encoded.len() <= json.encoded_len_estimate(),
            "{} bytes against an estimate of {}",
            encoded.len(),
            json.encoded_len_estimate()
        );
        let response = session_response(StatusCode::CREATED, session);
        assert_eq!(response.status(), StatusCode::CREATED);
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
        assert_eq!(
            response.headers()[header::ETAG],
            format!("\"{}\"", u64::MAX).as_str()
        );
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        assert_eq!(serde_json::from_slice::<SessionJson>(&body).unwrap(), json);
    }

    #[test]
    fn if_match_forms() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::IF_MATCH, HeaderValue::from_str(value).unwrap());
            expected_version(&headers)
        };
        assert_eq!(with("\"3\"").unwrap(), Some(3));
        assert!(with("7").is_err());
        assert_eq!(with("*").unwrap(), None);
        assert!(with("W/\"3\"").is_err());
        assert!(with("\"x\"").is_err());
        assert_eq!(expected_version(&HeaderMap::new()).unwrap(), None);
        let mut encoded = String::from("x");
        percent_encode_into(&mut encoded, "dev/1 é");
        assert_eq!(encoded, "xdev%2F1%20%C3%A9");
    }
}
