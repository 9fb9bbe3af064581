//! Every route and every error of the HTTP API, without sockets (`Router::oneshot`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use concord_engine::{BackendKind, Engine, EngineConfig};
use concord_http::{AdminToken, AppState, AppStateFields, router};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tower::ServiceExt;

struct Api {
    app: Router,
    _engine: Arc<Engine>,
    _dir: tempfile::TempDir,
}

fn api_with(max_body_bytes: usize, request_timeout: Duration) -> Api {
    api_with_token(max_body_bytes, request_timeout, None)
}

fn api_with_token(
    max_body_bytes: usize,
    request_timeout: Duration,
    admin_token: Option<AdminToken>,
) -> Api {
    api_with_all(max_body_bytes, request_timeout, admin_token, 1024)
}

fn api_with_all(
    max_body_bytes: usize,
    request_timeout: Duration,
    admin_token: Option<AdminToken>,
    in_flight_operations: usize,
) -> Api {
    let dir = tempfile::tempdir().unwrap();
    let mut config = EngineConfig::new(dir.path());
    config.backend = Some(BackendKind::Memory);
    config.groups = 4;
    let engine = Arc::new(Engine::open(config).unwrap());
    let state = AppState::from(AppStateFields {
        engine: engine.clone(),
        metrics: None,
        started_at: Instant::now(),
        batch_max_operations: 5,
        request_timeout,
        request_stats: Default::default(),
        request_durations: Default::default(),
        admin_token,
        in_flight: Arc::new(tokio::sync::Semaphore::new(in_flight_operations)),
    });
    Api {
        app: router(state, max_body_bytes),
        _engine: engine,
        _dir: dir,
    }
}

fn api() -> Api {
    api_with(64 * 1024, Duration::from_secs(10))
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    json: Value,
}

impl Answer {
    fn problem_type(&self) -> &str {
        assert_eq!(
            self.headers[header::CONTENT_TYPE],
            "application/problem+json",
            "{:?}",
            self.json
        );
        self.json["type"].as_str().unwrap()
    }
}

async fn call(
    api: &Api,
    method: Method,
    uri: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Answer {
    let mut request = Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    if body.is_some()
        && !headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("content-type"))
    {
        request = request.header("content-type", "application/json");
    }
    let request = request
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
        .unwrap();
    let response = api.app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&bytes)
        .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into()));
    Answer {
        status,
        headers,
        json,
    }
}

fn session_body(client_id: &str) -> String {
    json!({
        "client_id": client_id,
        "session_expiry_interval_secs": 3600,
        "broker_id": "broker-1",
        "last_will": {"topic": "status/offline", "payload_base64": "Ynll", "qos": 1, "retain": true}
    })
    .to_string()
}

/// Creates the session `client_id` (see [`session_body`]) and checks it was.
async fn create_session(api: &Api, client_id: &str) -> Answer {
    let created = call(
        api,
        Method::POST,
        "/v1/sessions",
        &[],
        Some(&session_body(client_id)),
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED, "{:?}", created.json);
    created
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_lifecycle_with_versions() {
    let api = api();
    let created = create_session(&api, "dev/1").await;
    assert_eq!(created.headers[header::ETAG], "\"1\"");
    assert_eq!(created.headers[header::LOCATION], "/v1/sessions/dev%2F1");
    assert_eq!(created.json["last_will"]["payload_base64"], "Ynll");

    for consistency in [
        "",
        "?consistency=linearizable",
        "?consistency=lease",
        "?consistency=stale",
    ] {
        let read = call(
            &api,
            Method::GET,
            &format!("/v1/sessions/dev%2F1{consistency}"),
            &[],
            None,
        )
        .await;
        assert_eq!(read.status, StatusCode::OK);
        assert_eq!(read.json, created.json, "{consistency}");
    }

    let replaced = call(
        &api,
        Method::PUT,
        "/v1/sessions/dev%2F1",
        &[("if-match", "\"1\"")],
        Some(r#"{"broker_id": "broker-2", "connection_id": 4}"#),
    )
    .await;
    assert_eq!(replaced.status, StatusCode::OK, "{:?}", replaced.json);
    assert_eq!(replaced.json["version"], 2);
    assert_eq!(
        replaced.json["last_will"],
        Value::Null,
        "PUT replaces every field"
    );

    let patched = call(
        &api,
        Method::PATCH,
        "/v1/sessions/dev%2F1",
        &[("if-match", "\"2\"")],
        Some(r#"{"connection_id": 5}"#),
    )
    .await;
    assert_eq!(patched.status, StatusCode::OK);
    assert_eq!(patched.headers[header::ETAG], "\"3\"");
    assert_eq!(
        patched.json["broker_id"], "broker-2",
        "PATCH keeps other fields"
    );
    assert_eq!(patched.json["connection_id"], 5);

    let deleted = call(
        &api,
        Method::DELETE,
        "/v1/sessions/dev%2F1",
        &[("if-match", "\"3\"")],
        None,
    )
    .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    let gone = call(&api, Method::GET, "/v1/sessions/dev%2F1", &[], None).await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    assert_eq!(gone.problem_type(), "urn:concord:problem:not-found");
}

/// Method, URI, headers, body; then the expected status, problem kind and field.
type ErrorCase = (
    Method,
    String,
    Vec<(&'static str, &'static str)>,
    Option<String>,
    StatusCode,
    &'static str,
    Option<&'static str>,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_session_error_is_a_problem_with_a_stable_type() {
    let api = api();
    create_session(&api, "a").await;

    let cases: Vec<ErrorCase> = vec![
        (
            Method::GET,
            "/v1/sessions/%FF%FE".into(),
            vec![],
            None,
            StatusCode::BAD_REQUEST,
            "invalid-field",
            Some("client_id"),
        ),
        (
            Method::GET,
            format!("/v1/sessions/{}", "x".repeat(300)),
            vec![],
            None,
            StatusCode::BAD_REQUEST,
            "invalid-field",
            Some("client_id"),
        ),
        (
            Method::POST,
            "/v1/sessions".into(),
            vec![],
            Some(session_body("a")),
            StatusCode::CONFLICT,
            "already-exists",
            None,
        ),
        (
            Method::PUT,
            "/v1/sessions/a".into(),
            vec![("if-match", "\"7\"")],
            Some("{}".into()),
            StatusCode::PRECONDITION_FAILED,
            "version-mismatch",
            None,
        ),
        (
            Method::PATCH,
            "/v1/sessions/a".into(),
            vec![("if-match", "\"7\"")],
            Some("{}".into()),
            StatusCode::PRECONDITION_FAILED,
            "version-mismatch",
            None,
        ),
        (
            Method::DELETE,
            "/v1/sessions/a".into(),
            vec![("if-match", "\"7\"")],
            None,
            StatusCode::PRECONDITION_FAILED,
            "version-mismatch",
            None,
        ),
        (
            Method::PUT,
            "/v1/sessions/a".into(),
            vec![("if-match", "soon")],
            Some("{}".into()),
            StatusCode::BAD_REQUEST,
            "invalid-field",
            Some("If-Match"),
        ),
        (
            Method::PUT,
            "/v1/sessions/zzz".into(),
            vec![],
            Some("{}".into()),
            StatusCode::NOT_FOUND,
            "not-found",
            None,
        ),
        (
            Method::PATCH,
            "/v1/sessions/zzz".into(),
            vec![],
            Some("{}".into()),
            StatusCode::NOT_FOUND,
            "not-found",
            None,
        ),
        (
            Method::DELETE,
            "/v1/sessions/zzz".into(),
            vec![],
            None,
            StatusCode::NOT_FOUND,
            "not-found",
            None,
        ),
        (
            Method::POST,
            "/v1/sessions".into(),
            vec![],
            Some(json!({"client_id": "b", "last_will": {"topic": "t", "qos": 3}}).to_string()),
            StatusCode::BAD_REQUEST,
            "invalid-field",
            Some("last_will.qos"),
        ),
        (
            Method::POST,
            "/v1/sessions".into(),
            vec![],
            Some(json!({"client_id": "b", "last_will": {"topic": "t", "qos": 300}}).to_string()),
            StatusCode::BAD_REQUEST,
            "invalid-body",
            Some("last_will.qos"),
        ),
        (
            Method::POST,
            "/v1/sessions".into(),
            vec![],
            Some(json!({"client_id": "x".repeat(257)}).to_string()),
            StatusCode::BAD_REQUEST,
            "invalid-field",
            Some("client_id"),
        ),
        (
            Method::POST,
            "/v1/sessions".into(),
            vec![],
            Some(json!({"client_id": ""}).to_string()),
            StatusCode::BAD_REQUEST,
            "invalid-field",
            Some("client_id"),
        ),
        (
            Method::POST,
            "/v1/sessions".into(),
            vec![],
            Some(json!({"client_id": "b", "broker_id": "y".repeat(300)}).to_string()),
            StatusCode::BAD_REQUEST,
            "invalid-field",
            Some("broker_id"),
        ),
        (
            Method::POST,
            "/v1/sessions".into(),
            vec![],
            Some(r#"{"client_id": "b", "colour": "red"}"#.into()),
            StatusCode::BAD_REQUEST,
            "invalid-body",
            Some("colour"),
        ),
        (
            Method::POST,
            "/v1/sessions".into(),
            vec![],
            Some(r#"{"client_id": "b""#.into()),
            StatusCode::BAD_REQUEST,
            "invalid-body",
            None,
        ),
        (
            Method::POST,
            "/v1/sessions".into(),
            vec![],
            Some(r#"[1, 2]"#.into()),
            StatusCode::BAD_REQUEST,
            "invalid-body",
            None,
        ),
        (
            Method::POST,
            "/v1/sessions".into(),
            vec![],
            Some(r#"["arr2", 77, true, null, "brokerX", 5]"#.into()),
            StatusCode::BAD_REQUEST,
            "invalid-body",
            None,
        ),
        (
            Method::POST,
            "/v1/sessions".into(),
            vec![],
            Some(r#"{"client_id": "b", "last_will": ["t", "", 0, false, 0]}"#.into()),
            StatusCode::BAD_REQUEST,
            "invalid-body",
            Some("last_will"),
        ),
        (
            Method::PATCH,
            "/v1/sessions/a".into(),
            vec![],
            Some("[3600]".into()),
            StatusCode::BAD_REQUEST,
            "invalid-body",
            None,
        ),
        (
            Method::PATCH,
            "/v1/sessions/a".into(),
            vec![],
            Some(r#"{"connection_id": null}"#.into()),
            StatusCode::BAD_REQUEST,
            "invalid-body",
            Some("connection_id"),
        ),
        (
            Method::PATCH,
            "/v1/sessions/a".into(),
            vec![("if-match", "1")],
            Some(r#"{"connection_id": 2}"#.into()),
            StatusCode::BAD_REQUEST,
            "invalid-field",
            Some("If-Match"),
        ),
        (
            Method::POST,
            "/v1/sessions".into(),
            vec![],
            Some(json!({"client_id": "nul\u{0}"}).to_string()),
            StatusCode::BAD_REQUEST,
            "invalid-field",
            Some("client_id"),
        ),
        (
            Method::POST,
            "/v1/sessions".into(),
            vec![],
            Some(json!({"client_id": "b", "last_will": {"topic": "a\u{0}b"}}).to_string()),
            StatusCode::BAD_REQUEST,
            "invalid-field",
            Some("last_will.topic"),
        ),
        (
            Method::PATCH,
            "/v1/sessions/a".into(),
            vec![],
            Some(json!({"broker_id": "\u{0}"}).to_string()),
            StatusCode::BAD_REQUEST,
            "invalid-field",
            Some("broker_id"),
        ),
        (
            Method::POST,
            "/v1/sessions/batch".into(),
            vec![],
            Some(r#"{"operations": [["get", "a"]]}"#.into()),
            StatusCode::BAD_REQUEST,
            "invalid-body",
            Some("operations[0]"),
        ),
        (
            Method::POST,
            "/v1/sessions/batch".into(),
            vec![],
            Some(r#"{"operations": [{"op": "update", "client_id": "a", "patch": [7]}]}"#.into()),
            StatusCode::BAD_REQUEST,
            "invalid-body",
            None,
        ),
        (
            Method::POST,
            "/v1/sessions/batch".into(),
            vec![],
            Some(r#"[[{"op": "get", "client_id": "a"}]]"#.into()),
            StatusCode::BAD_REQUEST,
            "invalid-body",
            None,
        ),
        (
            Method::POST,
            "/v1/sessions".into(),
            vec![("content-encoding", "gzip")],
            Some(session_body("c")),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported-media-type",
            None,
        ),
        (
            Method::GET,
            "/v1/sessions?prefix=%FF".into(),
            vec![],
            None,
            StatusCode::BAD_REQUEST,
            "invalid-field",
            Some("query"),
        ),
        (
            Method::POST,
            "/v1/sessions".into(),
            vec![("content-type", "text/plain")],
            Some(session_body("c")),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported-media-type",
            None,
        ),
        (
            Method::POST,
            "/v1/sessions".into(),
            vec![],
            Some(
                json!({"client_id": "b", "last_will": {"topic": "t", "payload_base64": "%%%"}})
                    .to_string(),
            ),
            StatusCode::BAD_REQUEST,
            "invalid-field",
            Some("last_will.payload_base64"),
        ),
        (
            Method::GET,
            "/v1/sessions/a?consistency=eventual".into(),
            vec![],
            None,
            StatusCode::BAD_REQUEST,
            "invalid-field",
            Some("consistency"),
        ),
        (
            Method::GET,
            "/v1/sessions/a?colour=red".into(),
            vec![],
            None,
            StatusCode::BAD_REQUEST,
            "invalid-field",
            Some("query"),
        ),
        (
            Method::GET,
            "/v1/sessions?limit=0".into(),
            vec![],
            None,
            StatusCode::BAD_REQUEST,
            "invalid-field",
            Some("limit"),
        ),
        (
            Method::GET,
            "/v1/sessions?limit=1001".into(),
            vec![],
            None,
            StatusCode::BAD_REQUEST,
            "invalid-field",
            Some("limit"),
        ),
        (
            Method::GET,
            "/v1/sessions?limit=ten".into(),
            vec![],
            None,
            StatusCode::BAD_REQUEST,
            "invalid-field",
            Some("limit"),
        ),
        (
            Method::GET,
            "/v1/sessions?page_token=!!".into(),
            vec![],
            None,
            StatusCode::BAD_REQUEST,
            "invalid-field",
            Some("page_token"),
        ),
        (
            Method::POST,
            "/v1/sessions/batch".into(),
            vec![],
            Some(
                json!({"operations": vec![json!({"op": "get", "client_id": "a"}); 6]}).to_string(),
            ),
            StatusCode::BAD_REQUEST,
            "invalid-field",
            Some("operations"),
        ),
        (
            Method::POST,
            "/v1/sessions/batch".into(),
            vec![],
            Some(json!({"operations": [{"op": "fly", "client_id": "a"}]}).to_string()),
            StatusCode::BAD_REQUEST,
            "invalid-body",
            None,
        ),
        (
            Method::DELETE,
            "/v1/sessions".into(),
            vec![],
            None,
            StatusCode::METHOD_NOT_ALLOWED,
            "method-not-allowed",
            None,
        ),
        (
            Method::GET,
            "/v2/everything".into(),
            vec![],
            None,
            StatusCode::NOT_FOUND,
            "no-route",
            None,
        ),
    ];
    for (method, uri, headers, body, status, kind, field) in cases {
        let answer = call(&api, method.clone(), &uri, &headers, body.as_deref()).await;
        assert_eq!(answer.status, status, "{method} {uri}: {:?}", answer.json);
        assert_eq!(
            answer.problem_type(),
            format!("urn:concord:problem:{kind}"),
            "{method} {uri}"
        );
        assert_eq!(answer.json["status"], status.as_u16());
        assert!(!answer.json["detail"].as_str().unwrap().is_empty());
        if let Some(field) = field {
            assert_eq!(
                answer.json["field"], field,
                "{method} {uri}: {:?}",
                answer.json
            );
        }
    }
    // Nothing above changed the session, and neither does an empty patch.
    let read = call(&api, Method::GET, "/v1/sessions/a", &[], None).await;
    assert_eq!(read.json["version"], 1);
    let empty = call(&api, Method::PATCH, "/v1/sessions/a", &[], Some("{}")).await;
    assert_eq!(empty.status, StatusCode::OK);
    assert_eq!(empty.json, read.json);
    assert_eq!(empty.headers[header::ETAG], "\"1\"");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_over_the_limit_are_refused_with_413() {
    let api = api_with(2048, Duration::from_secs(10));
    let big = json!({"client_id": "big", "broker_id": "b".repeat(4000)}).to_string();
    let answer = call(&api, Method::POST, "/v1/sessions", &[], Some(&big)).await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(answer.problem_type(), "urn:concord:problem:body-too-large");
}

/// A body that starts and never ends.
fn stalled_body() -> Body {
    let first_half = futures_util::stream::once(async {
        Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"{\"client_id\": "))
    });
    let stalled = futures_util::stream::pending::<Result<bytes::Bytes, std::io::Error>>();
    Body::from_stream(futures_util::StreamExt::chain(first_half, stalled))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_length_over_the_limit_is_refused_before_the_body() {
    let api = api_with(2048, Duration::from_secs(30));
    let request = Request::post("/v1/sessions")
        .header("content-type", "application/json")
        .header("content-length", "1000000")
        .body(stalled_body())
        .unwrap();
    let started = Instant::now();
    let response = api.app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert!(started.elapsed() < Duration::from_secs(10));
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let problem: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(problem["type"], "urn:concord:problem:body-too-large");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stalls_past_the_timeout_gets_408() {
    // A client that sends half a body and stalls: the timeout covers reading the body too,
    // and nothing was proposed, so the answer says so.
    let api = api_with(64 * 1024, Duration::from_millis(50));
    let request = Request::post("/v1/sessions")
        .header("content-type", "application/json")
        .body(stalled_body())
        .unwrap();
    let response = api.app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::REQUEST_TIMEOUT);
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let problem: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(problem["type"], "urn:concord:problem:body-timeout");
}

/// A route that changes something reads no query: a parameter there is a mistake of the
/// client's (a version meant for If-Match), refused before anything runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_with_a_query_parameter_is_refused_and_changes_nothing() {
    let api = api();
    create_session(&api, "a").await;
    let cases: Vec<(Method, &str, Option<String>)> = vec![
        (Method::DELETE, "/v1/sessions/a?expected_version=7", None),
        (
            Method::PATCH,
            "/v1/sessions/a?x=1",
            Some(json!({"broker_id": "b"}).to_string()),
        ),
        (Method::PUT, "/v1/sessions/a?x", Some("{}".into())),
        (
            Method::POST,
            "/v1/sessions?dry_run=true",
            Some(session_body("b")),
        ),
        (
            Method::POST,
            "/v1/sessions/batch?atomic=true",
            Some(json!({"operations": [{"op": "delete", "client_id": "a"}]}).to_string()),
        ),
    ];
    for (method, uri, body) in cases {
        let answer = call(&api, method.clone(), uri, &[], body.as_deref()).await;
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{method} {uri}: {:?}",
            answer.json
        );
        assert_eq!(answer.problem_type(), "urn:concord:problem:invalid-field");
        assert_eq!(answer.json["field"], "query", "{method} {uri}");
    }
    let a = call(&api, Method::GET, "/v1/sessions/a", &[], None).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json["version"], 1, "a refused write changed the session");
    let b = call(&api, Method::GET, "/v1/sessions/b", &[], None).await;
    assert_eq!(b.status, StatusCode::NOT_FOUND);
    // `?` alone is no query.
    let deleted = call(&api, Method::DELETE, "/v1/sessions/a?", &[], None).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_pages_with_tokens_in_client_id_order() {
    let api = api();
    let mut expected = Vec::new();
    for n in 0..23 {
        let id = format!("room/{n:02}");
        create_session(&api, &id).await;
        expected.push(id);
        create_session(&api, &format!("other/{n}")).await;
    }
    let mut listed = Vec::new();
    let mut uri = "/v1/sessions?prefix=room%2F&limit=10".to_string();
    for _page in 0..5 {
        let page = call(&api, Method::GET, &uri, &[], None).await;
        assert_eq!(page.status, StatusCode::OK, "{:?}", page.json);
        for session in page.json["sessions"].as_array().unwrap() {
            listed.push(session["client_id"].as_str().unwrap().to_string());
        }
        match page.json["next_page_token"].as_str() {
            Some(token) => {
                uri = format!(
                    "/v1/sessions?prefix=room%2F&limit=10&page_token={token}&consistency=stale"
                )
            }
            None => break,
        }
    }
    assert_eq!(listed, expected);
    let everything = call(&api, Method::GET, "/v1/sessions?limit=1000", &[], None).await;
    assert_eq!(everything.json["sessions"].as_array().unwrap().len(), 46);
    assert_eq!(everything.json["next_page_token"], Value::Null);
}

/// `POST /v1/sessions/batch` with `body`, which must answer 200: each operation's status and
/// its whole result.
async fn batch_results(api: &Api, body: &str) -> (Vec<u64>, Vec<Value>) {
    let answer = call(api, Method::POST, "/v1/sessions/batch", &[], Some(body)).await;
    assert_eq!(answer.status, StatusCode::OK, "{:?}", answer.json);
    let results = answer.json["results"].as_array().unwrap().clone();
    let statuses = results
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    (statuses, results)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_answers_each_operation_like_its_own_request() {
    let api = api();
    create_session(&api, "old").await;
    let body = json!({"operations": [
        {"op": "create", "client_id": "new", "session": {"broker_id": "b"}},
        {"op": "create", "client_id": "old"},
        {"op": "get", "client_id": "old", "consistency": "stale"},
        {"op": "update", "client_id": "old", "patch": {"connection_id": 9}, "if_match": 1},
        {"op": "delete", "client_id": "missing"},
    ]})
    .to_string();
    let (statuses, results) = batch_results(&api, &body).await;
    assert_eq!(statuses[0], 201);
    assert_eq!(statuses[1], 409);
    assert_eq!(
        results[1]["problem"]["type"],
        "urn:concord:problem:already-exists"
    );
    assert_eq!(statuses[2], 200);
    // The update and the read ran concurrently: the read saw version 1 or 2.
    assert!([1, 2].contains(&results[2]["session"]["version"].as_u64().unwrap()));
    assert_eq!(statuses[3], 200);
    assert_eq!(results[3]["session"]["connection_id"], 9);
    assert_eq!(statuses[4], 404);
    let created = call(&api, Method::GET, "/v1/sessions/new", &[], None).await;
    assert_eq!(created.json["broker_id"], "b");

    // The creates of one batch apply in their order (the first "twice" is created), and one
    // with an invalid field fails alone.
    let body = json!({"operations": [
        {"op": "create", "client_id": "twice"},
        {"op": "create", "client_id": "will", "session": {"last_will": {"topic": "t", "payload_base64": "not base64!"}}},
        {"op": "create", "client_id": "twice"},
        {"op": "create", "client_id": "another"},
    ]})
    .to_string();
    let (statuses, results) = batch_results(&api, &body).await;
    assert_eq!(statuses, [201, 400, 409, 201]);
    assert_eq!(
        results[1]["problem"]["type"],
        "urn:concord:problem:invalid-field"
    );
    assert_eq!(results[3]["session"]["client_id"], "another");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_routes_report_the_node() {
    let api = api();
    let status = call(&api, Method::GET, "/v1/status", &[], None).await;
    assert_eq!(status.status, StatusCode::OK);
    assert_eq!(status.json["backend"], "mem");
    assert_eq!(status.json["consensus"], "raft");
    assert_eq!(status.json["ready"], true);
    let groups = status.json["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 4);
    assert!(
        groups
            .iter()
            .all(|g| g["is_leader"] == true && g["apply_lag"] == 0)
    );

    assert!(status.json["http"]["latency_counts"].is_array());
    // The bundled session plugin, by the hash of the committed module, and its commands.
    let plugin = &status.json["plugin"];
    assert_eq!(plugin["name"], "session");
    let fixture = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/plugins/session.wasm"),
    )
    .unwrap();
    let expected_sha256: String = Sha256::digest(&fixture)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    assert_eq!(plugin["sha256"], expected_sha256.as_str());
    let commands_before = plugin["commands"].as_u64().unwrap();
    create_session(&api, "p").await;
    let status = call(&api, Method::GET, "/v1/status", &[], None).await;
    let plugin = &status.json["plugin"];
    assert_eq!(plugin["commands"].as_u64().unwrap(), commands_before + 1);
    assert_eq!(plugin["faults"]["trap"], 0);
    assert!(plugin["apply_seconds"].as_f64().unwrap() > 0.0);
    let page = call(&api, Method::GET, "/", &[], None).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        page.headers[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    let html = page.json.as_str().unwrap();
    assert!(html.contains("/v1/status") && !html.contains("http://") && !html.contains("https://"));

    let live = call(&api, Method::GET, "/livez", &[], None).await;
    assert_eq!(live.status, StatusCode::OK);
    let ready = call(&api, Method::GET, "/readyz", &[], None).await;
    assert_eq!(ready.status, StatusCode::OK);
    let metrics = call(&api, Method::GET, "/metrics", &[], None).await;
    assert_eq!(metrics.status, StatusCode::OK);
    assert!(
        metrics.headers[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );

    // A stopped engine is not ready, and says why in problem+json.
    api._engine.shutdown().expect("the engine stops");
    let not_ready = call(&api, Method::GET, "/readyz", &[], None).await;
    assert_eq!(not_ready.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(not_ready.problem_type(), "urn:concord:problem:unavailable");
    assert_eq!(not_ready.headers[header::RETRY_AFTER], "1");
    let write = call(
        &api,
        Method::POST,
        "/v1/sessions",
        &[],
        Some(&session_body("late")),
    )
    .await;
    assert_eq!(
        write.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{:?}",
        write.json
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_lists_at_most_the_groups_asked_for_and_counts_them_all() {
    let api = api();
    let listed = |json: &Value| -> Vec<u64> {
        json["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["group"].as_u64().unwrap())
            .collect()
    };
    let all = call(&api, Method::GET, "/v1/status", &[], None).await;
    assert_eq!(all.status, StatusCode::OK);
    assert_eq!(listed(&all.json).len(), 4);
    assert_eq!(all.json["group_summary"]["count"], 4);
    assert_eq!(all.json["group_summary"]["listed"], 4);
    assert_eq!(all.json["group_summary"]["led_here"], 4);
    assert_eq!(all.json["group_summary"]["without_leader"], 0);

    // Every group is healthy and caught up: the lowest ids are listed, in order.
    let two = call(&api, Method::GET, "/v1/status?group_limit=2", &[], None).await;
    assert_eq!(two.status, StatusCode::OK, "{:?}", two.json);
    let first_two: Vec<u64> = listed(&all.json)[..2].to_vec();
    assert_eq!(listed(&two.json), first_two);
    assert_eq!(two.json["group_summary"]["count"], 4);
    assert_eq!(two.json["group_summary"]["listed"], 2);
    assert_eq!(two.json["group_summary"]["led_here"], 4);

    let none = call(&api, Method::GET, "/v1/status?group_limit=0", &[], None).await;
    assert_eq!(none.status, StatusCode::OK);
    assert!(listed(&none.json).is_empty());
    assert_eq!(none.json["group_summary"]["count"], 4);
    let many = call(&api, Method::GET, "/v1/status?group_limit=65536", &[], None).await;
    assert_eq!(listed(&many.json).len(), 4);

    for query in [
        "group_limit=65537",
        "group_limit=-1",
        "group_limit=two",
        "limit=2",
    ] {
        let refused = call(&api, Method::GET, &format!("/v1/status?{query}"), &[], None).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{query}");
        assert_eq!(
            refused.problem_type(),
            "urn:concord:problem:invalid-field",
            "{query}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_routes_on_a_node_alone() {
    let api = api();
    let members = call(&api, Method::GET, "/v1/cluster/members", &[], None).await;
    assert_eq!(members.status, StatusCode::OK);
    assert_eq!(
        members.json,
        json!([{"node_id": 1, "role": "voter", "raft_addr": null, "client_url": null,
            "reachable": true, "last_heard_ms": null, "wire_version": 5, "vote_quiet_ms": 900,
            "leads": 4}])
    );
    // A node alone is no cluster: membership changes are refused, bad input is 400.
    let add = call(
        &api,
        Method::POST,
        "/v1/cluster/members",
        &[],
        Some(r#"{"node_id": 2, "raft_addr": "127.0.0.1:7171"}"#),
    )
    .await;
    assert_eq!(add.status, StatusCode::CONFLICT, "{:?}", add.json);
    assert_eq!(add.json["type"], "urn:concord:problem:membership-refused");
    let bad = call(
        &api,
        Method::POST,
        "/v1/cluster/members",
        &[],
        Some(r#"{"node_id": "two"}"#),
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{:?}", bad.json);
    let bad_node = call(&api, Method::DELETE, "/v1/cluster/members/x", &[], None).await;
    assert_eq!(
        bad_node.status,
        StatusCode::BAD_REQUEST,
        "{:?}",
        bad_node.json
    );
    let status = call(&api, Method::GET, "/v1/status", &[], None).await;
    assert_eq!(status.json["node_id"], 1);
    assert_eq!(status.json["members"], members.json);

    let to_self = call(
        &api,
        Method::POST,
        "/v1/cluster/groups/2/leader",
        &[],
        Some(r#"{"node_id": 1}"#),
    )
    .await;
    assert_eq!(to_self.status, StatusCode::ACCEPTED);
    assert_eq!(to_self.json, json!({"group": 2, "node_id": 1}));
    let stranger = call(
        &api,
        Method::POST,
        "/v1/cluster/groups/2/leader",
        &[],
        Some(r#"{"node_id": 7}"#),
    )
    .await;
    assert_eq!(stranger.status, StatusCode::BAD_REQUEST);
    assert_eq!(stranger.problem_type(), "urn:concord:problem:invalid-field");
    assert_eq!(stranger.json["field"], "node_id");
    let no_group = call(
        &api,
        Method::POST,
        "/v1/cluster/groups/99/leader",
        &[],
        Some(r#"{"node_id": 1}"#),
    )
    .await;
    assert_eq!(no_group.status, StatusCode::NOT_FOUND);
    assert_eq!(no_group.problem_type(), "urn:concord:problem:not-found");
    let bad_group = call(
        &api,
        Method::POST,
        "/v1/cluster/groups/x/leader",
        &[],
        Some(r#"{"node_id": 1}"#),
    )
    .await;
    assert_eq!(bad_group.status, StatusCode::BAD_REQUEST);
    let bad_body = call(
        &api,
        Method::POST,
        "/v1/cluster/groups/2/leader",
        &[],
        Some(r#"{"node": 1}"#),
    )
    .await;
    assert_eq!(bad_body.status, StatusCode::BAD_REQUEST);

    // Alone, this node leads every group: a client that asks not to be forwarded is served.
    let create = call(
        &api,
        Method::POST,
        "/v1/sessions",
        &[("concord-forward", "false")],
        Some(&session_body("solo")),
    )
    .await;
    assert_eq!(create.status, StatusCode::CREATED, "{:?}", create.json);
    let read = call(
        &api,
        Method::GET,
        "/v1/sessions/solo",
        &[("Concord-Forward", "FALSE")],
        None,
    )
    .await;
    assert_eq!(read.status, StatusCode::OK);
    let digest = call(&api, Method::GET, "/v1/cluster/groups/0/digest", &[], None).await;
    assert_eq!(digest.status, StatusCode::OK);
    assert_eq!(digest.json["sha256"].as_str().unwrap().len(), 64);
    let no_digest = call(&api, Method::GET, "/v1/cluster/groups/4/digest", &[], None).await;
    assert_eq!(no_digest.status, StatusCode::NOT_FOUND);
    let group = call(&api, Method::GET, "/v1/cluster/groups/0", &[], None).await;
    assert_eq!(group.status, StatusCode::OK, "{:?}", group.json);
    assert_eq!(group.json["group"], 0);
    assert_eq!(group.json["is_leader"], true);
    assert_eq!(group.json["voter_ids"], serde_json::json!([1]));
    for (path, status) in [
        ("/v1/cluster/groups/4", StatusCode::NOT_FOUND),
        ("/v1/cluster/groups/x", StatusCode::BAD_REQUEST),
        ("/v1/cluster/groups/0?detail=1", StatusCode::BAD_REQUEST),
    ] {
        let refused = call(&api, Method::GET, path, &[], None).await;
        assert_eq!(refused.status, status, "{path}: {:?}", refused.json);
    }
    let unclear = call(
        &api,
        Method::GET,
        "/v1/sessions/solo",
        &[("concord-forward", "sometimes")],
        None,
    )
    .await;
    assert_eq!(unclear.status, StatusCode::BAD_REQUEST);
    assert_eq!(unclear.json["field"], "Concord-Forward");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_describes_every_route_and_error_shape() {
    let api = api();
    let doc = call(&api, Method::GET, "/openapi.json", &[], None).await;
    assert_eq!(doc.status, StatusCode::OK);
    assert!(doc.json["openapi"].as_str().unwrap().starts_with("3."));
    let paths = doc.json["paths"].as_object().unwrap();
    for (path, methods) in [
        ("/v1/sessions", &["post", "get"][..]),
        (
            "/v1/sessions/{client_id}",
            &["get", "put", "patch", "delete"][..],
        ),
        ("/v1/sessions/batch", &["post"][..]),
        ("/v1/status", &["get"][..]),
        ("/livez", &["get"][..]),
        ("/readyz", &["get"][..]),
        ("/metrics", &["get"][..]),
        ("/v1/cluster/members", &["get"][..]),
        ("/v1/cluster/groups/{group}", &["get"][..]),
        ("/v1/cluster/groups/{group}/leader", &["post"][..]),
        ("/v1/cluster/groups/{group}/digest", &["get"][..]),
        ("/v1/plugins", &["get"][..]),
        ("/v1/plugins/{name}/commands", &["post"][..]),
        ("/v1/plugins/{name}/commands/batch", &["post"][..]),
        ("/v1/plugins/{name}/keys/{key}", &["get"][..]),
    ] {
        for method in methods {
            assert!(
                paths[path][method].is_object(),
                "{method} {path} undocumented"
            );
        }
    }
    let schemas = doc.json["components"]["schemas"].as_object().unwrap();
    for name in [
        "SessionJson",
        "CreateBody",
        "PatchBody",
        "Problem",
        "BatchBody",
        "StatusJson",
        "CommandBody",
        "CommandBatchBody",
        "PluginsJson",
    ] {
        assert!(schemas.contains_key(name), "schema {name} missing");
    }
    // The documented request shape matches the server's: unknown fields are refused.
    assert_eq!(schemas["CreateBody"]["additionalProperties"], false);
    let created = &paths["/v1/sessions"]["post"]["responses"]["409"]["content"];
    assert!(created["application/problem+json"].is_object());
    // Every error answer of every route is documented as a problem.
    for (path, methods) in paths {
        for (method, operation) in methods.as_object().unwrap() {
            for (status, response) in operation["responses"].as_object().unwrap() {
                if status.parse::<u16>().unwrap() < 400 {
                    continue;
                }
                assert!(
                    !response["description"].as_str().unwrap().is_empty(),
                    "{method} {path} {status}"
                );
                assert_eq!(
                    response["content"]["application/problem+json"]["schema"]["$ref"],
                    "#/components/schemas/Problem",
                    "{method} {path} {status}"
                );
            }
        }
    }

    let docs = call(&api, Method::GET, "/docs", &[], None).await;
    assert_eq!(docs.status, StatusCode::OK);
    assert!(docs.json.as_str().unwrap().contains("/openapi.json"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_that_change_the_cluster_or_a_plugin_require_the_admin_token() {
    let token = "s3cret-token-0123456789";
    let api = api_with_token(
        64 * 1024,
        Duration::from_secs(10),
        Some(AdminToken::new(token).unwrap()),
    );
    let bearer = format!("Bearer {token}");
    let changes = [
        (
            Method::POST,
            "/v1/cluster/members",
            Some(r#"{"node_id": 2, "raft_addr": "127.0.0.1:7999"}"#),
        ),
        (Method::POST, "/v1/cluster/members/2/promote", None),
        (Method::DELETE, "/v1/cluster/members/2", None),
        (
            Method::POST,
            "/v1/cluster/groups/0/leader",
            Some(r#"{"node_id": 1}"#),
        ),
        (Method::PUT, "/v1/plugins/kv", Some("not a module")),
    ];
    for (method, uri, body) in changes {
        let none = call(&api, method.clone(), uri, &[], body).await;
        assert_eq!(none.status, StatusCode::UNAUTHORIZED, "{method} {uri}");
        assert_eq!(none.problem_type(), "urn:concord:problem:unauthorized");
        assert_eq!(none.headers[header::WWW_AUTHENTICATE], "Bearer");
        let wrong = call(
            &api,
            method.clone(),
            uri,
            &[("authorization", "Bearer s3cret-token-0123456780")],
            body,
        )
        .await;
        assert_eq!(wrong.status, StatusCode::FORBIDDEN, "{method} {uri}");
        assert_eq!(wrong.problem_type(), "urn:concord:problem:forbidden");
        assert!(
            !wrong.json.to_string().contains(token),
            "the token is never echoed"
        );
        let right = call(
            &api,
            method.clone(),
            uri,
            &[("authorization", &bearer)],
            body,
        )
        .await;
        assert!(
            right.status != StatusCode::UNAUTHORIZED && right.status != StatusCode::FORBIDDEN,
            "{method} {uri}: {:?}",
            right.json
        );
    }
    // Reading stays open.
    let members = call(&api, Method::GET, "/v1/cluster/members", &[], None).await;
    assert_eq!(members.status, StatusCode::OK);
    let status = call(&api, Method::GET, "/v1/status", &[], None).await;
    assert_eq!(status.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_operations_in_progress_requests_are_refused_at_once() {
    // Room for 8 operations, batches of at most 5: a batch takes its own place and one per
    // operation.
    let api = api_with_all(64 * 1024, Duration::from_secs(10), None, 8);
    let batch = |n: usize| {
        json!({"operations": vec![json!({"op": "create", "client_id": "x", "session": {}}); n]})
            .to_string()
    };
    let taken = call(
        &api,
        Method::POST,
        "/v1/sessions/batch",
        &[],
        Some(&batch(3)),
    )
    .await;
    assert_eq!(taken.status, StatusCode::OK, "{:?}", taken.json);

    // Requests whose bodies never end hold places.
    let hold = |count: usize| {
        (0..count)
            .map(|_| {
                let request = Request::post("/v1/sessions")
                    .header("content-type", "application/json")
                    .body(stalled_body())
                    .unwrap();
                let app = api.app.clone();
                tokio::spawn(async move { app.oneshot(request).await })
            })
            .collect::<Vec<_>>()
    };
    let mut held = hold(4);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Four places left: a batch is let in only while one of the largest size would fit, so it
    // is refused at the door, before its body is read; a single read still fits.
    let refused = call(
        &api,
        Method::POST,
        "/v1/sessions/batch",
        &[],
        Some(&batch(1)),
    )
    .await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.problem_type(), "urn:concord:problem:overloaded");
    assert_eq!(refused.headers[header::RETRY_AFTER], "1");
    let read = call(&api, Method::GET, "/v1/sessions/x", &[], None).await;
    assert_eq!(read.status, StatusCode::OK, "{:?}", read.json);

    // No place at all: refused at once.
    held.extend(hold(4));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let refused = call(&api, Method::GET, "/v1/sessions/x", &[], None).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(started.elapsed() < Duration::from_secs(2));
    // Other routes are not counted.
    let status = call(&api, Method::GET, "/v1/status", &[], None).await;
    assert_eq!(status.status, StatusCode::OK);
    for request in held {
        request.abort();
    }
    // The places come back when those requests go.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let read = call(&api, Method::GET, "/v1/sessions/x", &[], None).await;
    assert_eq!(read.status, StatusCode::OK, "{:?}", read.json);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_take_their_places_before_their_bodies_are_read() {
    // Room for 14 operations, batches of at most 5. A batch whose body stalls holds its own
    // place and one for every operation its body could hold, so only two of them read bodies
    // at once (2 x 6 places) and the third is refused at the door.
    let api = api_with_all(64 * 1024, Duration::from_secs(10), None, 14);
    let stalled_batch = |declared_length: Option<usize>| {
        let mut request =
            Request::post("/v1/sessions/batch").header("content-type", "application/json");
        if let Some(length) = declared_length {
            request = request.header("content-length", length);
        }
        let request = request.body(stalled_body()).unwrap();
        let app = api.app.clone();
        tokio::spawn(async move { app.oneshot(request).await })
    };
    let held = vec![stalled_batch(None), stalled_batch(Some(4096))];
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let refused = call(
        &api,
        Method::POST,
        "/v1/sessions/batch",
        &[],
        Some(r#"{"operations":[]}"#),
    )
    .await;
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{:?}",
        refused.json
    );
    assert_eq!(refused.problem_type(), "urn:concord:problem:overloaded");
    assert!(started.elapsed() < Duration::from_secs(2));

    // A batch that declares a short body takes places only for what it can hold: 17 bytes
    // hold at most one operation, so it takes 2 places, which are left.
    let short = r#"{"operations":[]}"#;
    let request = Request::post("/v1/sessions/batch")
        .header("content-type", "application/json")
        .header("content-length", short.len())
        .body(Body::from(short))
        .unwrap();
    let answer = api.app.clone().oneshot(request).await.unwrap();
    assert_eq!(answer.status(), StatusCode::OK);

    // The places come back when the stalled batches go.
    for request in held {
        request.abort();
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let one = call(
        &api,
        Method::POST,
        "/v1/sessions/batch",
        &[],
        Some(
            &json!({"operations": [{"op": "create", "client_id": "y", "session": {}}]}).to_string(),
        ),
    )
    .await;
    assert_eq!(one.status, StatusCode::OK, "{:?}", one.json);
}
