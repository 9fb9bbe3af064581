//! `/v1/plugins`: the plugins served beside the sessions (`--plugin name=path.wasm`), called
//! with commands routed by key, and their stored keys read at any consistency.
//!
//! A command is the plugin's own bytes: sent raw (`application/octet-stream`, the key in
//! `?key=`) the answer is the result's raw bytes; sent as JSON the bytes travel in base64.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{FromRequest, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use concord_engine::PluginClient;
use serde::{Deserialize, Serialize};

use crate::AppState;
use crate::forwarding::Forwarding;
use crate::json_body::{JsonBody, objects};
use crate::no_query::NoQuery;
use crate::openapi_shared::{AdminProblems, ForwardHeader, KeyedProblems};
use crate::problem::{Problem, kind};
use crate::routes_batch::{json_with_retry_after, longest_retry_after};
use crate::routes_sessions::{self, ReadQuery, parse_consistency};

/// Longest key, in bytes (the state store's bound).
const KEY_BYTES_MAX: usize = 16 * 1024;

/// `GET /v1/plugins`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PluginsJson {
    /// In the order they are served (and their groups numbered).
    pub plugins: Vec<ServedPluginJson>,
}

/// One served plugin.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ServedPluginJson {
    /// The name it is called by.
    pub name: String,
    /// Its first group.
    pub first_group: u64,
    /// How many groups its keys are spread over.
    pub groups: u64,
    /// The module and its counts; absent when it runs the native session logic.
    pub module: Option<PluginJson>,
}

/// The plugin the groups run and what it did since the server started.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PluginJson {
    /// The plugin's name.
    pub name: String,
    /// The hex SHA-256 of its module.
    pub sha256: String,
    /// Batches (log entries) applied, each in a fresh instance.
    pub batches: u64,
    /// Commands applied, whatever their outcome.
    pub commands: u64,
    /// Commands that failed with an error the plugin chose.
    pub command_errors: u64,
    /// Commands that faulted, by kind.
    pub faults: PluginFaultsJson,
    /// Fuel the commands burned.
    pub fuel_used: u64,
    /// Seconds spent applying batches.
    pub apply_seconds: f64,
}

/// Faulted commands by kind.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PluginFaultsJson {
    /// Out of fuel (1000).
    pub out_of_fuel: u64,
    /// Trapped (1001).
    pub trap: u64,
    /// Past the memory cap (1002).
    pub memory_limit: u64,
    /// Stack overflow (1003).
    pub stack_overflow: u64,
    /// Broke the ABI (1004).
    pub abi_violation: u64,
}

/// The JSON of `plugin` and its counts.
pub(crate) fn plugin_json(plugin: &concord_engine::Plugin) -> PluginJson {
    let stats = plugin.stats();
    PluginJson {
        name: plugin.name().into(),
        sha256: plugin.sha256().into(),
        batches: stats.batches,
        commands: stats.commands,
        command_errors: stats.command_errors,
        faults: PluginFaultsJson {
            out_of_fuel: stats.faults.out_of_fuel,
            trap: stats.faults.trap,
            memory_limit: stats.faults.memory_limit,
            stack_overflow: stats.faults.stack_overflow,
            abi_violation: stats.faults.abi_violation,
        },
        fuel_used: stats.fuel_used,
        apply_seconds: stats.apply_time.as_secs_f64(),
    }
}

/// One command, as JSON.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CommandBody {
    /// The key that routes the command to its group (UTF-8); or give `key_base64`.
    #[serde(default)]
    pub key: Option<String>,
    /// The routing key's bytes in base64, for keys that are not UTF-8.
    #[serde(default)]
    pub key_base64: Option<String>,
    /// The command's bytes in base64 (standard alphabet, padded).
    pub command_base64: String,
}

/// What a command answered.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CommandResultJson {
    /// The plugin's result bytes in base64.
    pub result_base64: String,
}

/// Many commands in one request.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CommandBatchBody {
    /// At most `batch_max_operations` of them. The commands of one group go to raft as one
    /// batch and apply in their order; the groups' batches proceed together.
    #[serde(deserialize_with = "objects")]
    pub commands: Vec<CommandBody>,
}

/// One result per command, in order.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CommandBatchJson {
    /// In the order of the commands.
    pub results: Vec<CommandOutcomeJson>,
}

/// What one command of a batch answered.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CommandOutcomeJson {
    /// The status the command would have had on its own.
    pub status: u16,
    /// The result in base64, on success.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub result_base64: Option<String>,
    /// The problem, on failure (`command-failed` carries the plugin's `code`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    #[schema(value_type = Option<Problem>)]
    pub problem: Option<serde_json::Value>,
}

/// `?key=` of a raw command.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCommandQuery {
    /// The routing key (UTF-8).
    pub key: Option<String>,
}

fn client<'s>(state: &'s AppState, name: &str) -> Result<PluginClient<'s>, Problem> {
    state.engine.plugin_client(name).map_err(|_| {
        Problem::new(
            StatusCode::NOT_FOUND,
            kind::NOT_FOUND,
            format!("no plugin is served as {name:?} (see GET /v1/plugins)"),
        )
    })
}

fn path_name(path: Result<Path<String>, PathRejection>) -> Result<String, Problem> {
    path.map(|Path(name)| name)
        .map_err(|rejection| Problem::invalid_field("name", rejection.body_text()))
}

fn checked_key(key: Vec<u8>, field: &str) -> Result<Vec<u8>, Problem> {
    if key.is_empty() || key.len() > KEY_BYTES_MAX {
        return Err(Problem::invalid_field(
            field,
            format!("a key is 1 to {KEY_BYTES_MAX} bytes, not {}", key.len()),
        ));
    }
    Ok(key)
}

fn decode_base64(field: &str, text: &str) -> Result<Vec<u8>, Problem> {
    STANDARD
        .decode(text)
        .map_err(|error| Problem::invalid_field(field, format!("not base64: {error}")))
}

impl CommandBody {
    /// The routing key and the command's bytes.
    fn into_parts(self) -> Result<(Vec<u8>, Bytes), Problem> {
        let key = match (self.key, self.key_base64) {
            (Some(key), None) => checked_key(key.into_bytes(), "key")?,
            (None, Some(encoded)) => {
                checked_key(decode_base64("key_base64", &encoded)?, "key_base64")?
            }
            _ => {
                return Err(Problem::invalid_field(
                    "key",
                    "give exactly one of key and key_base64",
                ));
            }
        };
        let command = decode_base64("command_base64", &self.command_base64)?;
        Ok((key, Bytes::from(command)))
    }
}

/// Whether the body's `Content-Type` is `media` (parameters aside).
fn has_media_type(headers: &HeaderMap, media: &str) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|given| given.trim().eq_ignore_ascii_case(media))
}

fn octets(bytes: impl Into<axum::body::Body>) -> Response {
    let mut response = (StatusCode::OK, bytes.into()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    response
}

/// `GET /v1/plugins`.
#[utoipa::path(get, path = "/v1/plugins", tag = "plugins", summary = "The plugins this node serves",
    responses((status = 200, description = "every served plugin, with its module hash and counts", body = PluginsJson)))]
pub async fn list(State(state): State<AppState>) -> axum::Json<PluginsJson> {
    axum::Json(PluginsJson {
        plugins: served_plugins(&state.engine),
    })
}

/// Every plugin `engine` serves beside its main state machine.
pub(crate) fn served_plugins(engine: &concord_engine::Engine) -> Vec<ServedPluginJson> {
    engine
        .plugin_clients()
        .map(|client| {
            let groups = client.group_ids();
            ServedPluginJson {
                name: client.name().into(),
                first_group: groups.start,
                groups: groups.end - groups.start,
                module: client.plugin().as_ref().map(plugin_json),
            }
        })
        .collect()
}

/// What an upgrade answered.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UpgradeJson {
    /// The plugin.
    pub name: String,
    /// The identity every group of the plugin runs now: `sha256:<hex>` of the module.
    pub identity: String,
    /// How many groups switched (or already ran it).
    pub groups: u64,
}

/// `PUT /v1/plugins/{name}`.
#[utoipa::path(
    put,
    path = "/v1/plugins/{name}",
    tag = "plugins",
    summary = "Upgrade a served plugin through the log (admin)",
    description = "The body is the new wasm module. It is checked on this node first (ABI version, imports, exports, that it starts), then an upgrade entry goes through the log of every group of the plugin: each replica runs the old module for the entries before it and the new one from it on, the module's optional concord_migrate export runs once per group at the switch, and the data records the module (a restart with the old module configured runs the new one). Upgrading to the module running is a no-op; rolling back is another upgrade; asking again after a timeout is safe. Needs the admin token when the server has one.",
    params(("name" = String, Path, description = "the served plugin")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "the module, at most max_command_bytes (sent as application/octet-stream or application/wasm)"),
    responses(
        (status = 200, description = "every group of the plugin runs the module", body = UpgradeJson),
        (status = 400, description = "a query parameter (this route reads none)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "no plugin is served under this name", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "body over max_body_bytes", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "neither application/wasm nor application/octet-stream", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "upgrade-refused: the module does not load or is too large; command-failed: a group refused it (its concord_migrate failed), that group runs the old module", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "overloaded, retry or unavailable (groups that switched keep the new module: ask again)", body = Problem, content_type = "application/problem+json"),
        (status = 504, description = "not every group answered in time (ask again)", body = Problem, content_type = "application/problem+json"),
        AdminProblems
    )
)]
pub async fn upgrade(
    State(state): State<AppState>,
    _no_query: NoQuery,
    name: Result<Path<String>, PathRejection>,
    request: axum::extract::Request,
) -> Result<axum::Json<UpgradeJson>, Problem> {
    let name = path_name(name)?;
    let client = client(&state, &name)?;
    let headers = request.headers();
    if !has_media_type(headers, "application/wasm")
        && !has_media_type(headers, "application/octet-stream")
    {
        return Err(Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            kind::UNSUPPORTED_MEDIA_TYPE,
            "a module is application/wasm or application/octet-stream",
        ));
    }
    let module = crate::json_body::read_body(request).await?;
    let identity = client.upgrade(&module).await?;
    let groups = client.group_ids();
    tracing::info!(plugin = %name, %identity, "plugin upgraded through the log");
    Ok(axum::Json(UpgradeJson {
        name,
        identity,
        groups: groups.end - groups.start,
    }))
}

/// `POST /v1/plugins/{name}/commands`.
#[utoipa::path(
    post,
    path = "/v1/plugins/{name}/commands",
    tag = "plugins",
    summary = "Apply one command through the log of its key's group",
    params(
        ("name" = String, Path, description = "the served plugin"),
        ("key" = Option<String>, Query, description = "the routing key, for an application/octet-stream body"),
        ForwardHeader
    ),
    request_body(content = CommandBody, description = "JSON with base64 bytes, or the command's raw bytes as application/octet-stream with ?key="),
    responses(
        (status = 200, description = "the plugin's result: raw bytes for a raw command, JSON otherwise", body = CommandResultJson),
        (status = 400, description = "invalid body, key or query", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "no plugin is served under this name", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "body over max_body_bytes", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "neither application/json nor application/octet-stream", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "the plugin answered with an error (code, 1000 and up: a fault); its writes were discarded", body = Problem, content_type = "application/problem+json"),
        KeyedProblems
    )
)]
pub async fn command(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    query: Result<Query<RawCommandQuery>, QueryRejection>,
    forwarding: Forwarding,
    request: axum::extract::Request,
) -> Result<Response, Problem> {
    let name = path_name(name)?;
    let client = client(&state, &name)?;
    let raw = has_media_type(request.headers(), "application/octet-stream");
    if !raw && !has_media_type(request.headers(), "application/json") {
        return Err(Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            kind::UNSUPPORTED_MEDIA_TYPE,
            "a command is application/octet-stream (its raw bytes, with ?key=) or \
             application/json",
        ));
    }
    let query = routes_sessions::query(query)?;
    let (key, command) = if raw {
        let key = query.key.ok_or_else(|| {
            Problem::invalid_field("key", "a raw command needs its routing key in ?key=")
        })?;
        let body = crate::json_body::read_body(request).await?;
        (checked_key(key.into_bytes(), "key")?, body)
    } else {
        if query.key.is_some() {
            return Err(Problem::invalid_field(
                "key",
                "?key= is for raw commands; a JSON command carries its key",
            ));
        }
        let JsonBody(body) = JsonBody::<CommandBody>::from_request(request, &()).await?;
        body.into_parts()?
    };
    forwarding.check_group(&state, client.group_of(&key))?;
    let result = client.propose(&key, command).await?;
    Ok(if raw {
        octets(result)
    } else {
        axum::Json(CommandResultJson {
            result_base64: STANDARD.encode(&result),
        })
        .into_response()
    })
}

/// `POST /v1/plugins/{name}/commands/batch`.
#[utoipa::path(
    post,
    path = "/v1/plugins/{name}/commands/batch",
    tag = "plugins",
    summary = "Apply up to batch_max_operations commands, one result each: the commands of one group go to raft as one batch, in their order",
    params(("name" = String, Path, description = "the served plugin")),
    request_body = CommandBatchBody,
    responses(
        (status = 200, description = "one result per command, in order; Retry-After when one was refused for overload or an election", body = CommandBatchJson),
        (status = 400, description = "invalid body, more than batch_max_operations commands, or a query parameter (this route reads none)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "no plugin is served under this name", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "body over max_body_bytes", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "not application/json", body = Problem, content_type = "application/problem+json")
    )
)]
pub async fn command_batch(
    State(state): State<AppState>,
    _no_query: NoQuery,
    name: Result<Path<String>, PathRejection>,
    JsonBody(body): JsonBody<CommandBatchBody>,
) -> Result<Response, Problem> {
    let name = path_name(name)?;
    let client = client(&state, &name)?;
    let max = state.batch_max_operations;
    if body.commands.len() > max {
        return Err(Problem::invalid_field(
            "commands",
            format!("{} commands; at most {max} per batch", body.commands.len()),
        ));
    }
    let _places = state.admit(body.commands.len())?;
    // Per command: `Ok` if it is proposed (its answer is the next of `propose_many`'s, which
    // answers in order), or why it is invalid.
    let mut parsed = Vec::with_capacity(body.commands.len());
    let mut valid = Vec::with_capacity(body.commands.len());
    for command in body.commands {
        match command.into_parts() {
            Ok(parts) => {
                valid.push(parts);
                parsed.push(Ok(()));
            }
            Err(problem) => parsed.push(Err(problem)),
        }
    }
    // The commands of one group go as one raft batch, in their order.
    let mut answers = client.propose_many(valid).await.into_iter();
    let outcomes: Vec<Result<Bytes, Problem>> = parsed
        .into_iter()
        .map(|parsed| {
            parsed?;
            let answer = answers.next().ok_or_else(|| {
                Problem::internal("batch", "a batch command went unanswered".to_string())
            })?;
            Ok(answer?)
        })
        .collect();
    let retry_after_secs = longest_retry_after(&outcomes);
    let results = outcomes
        .into_iter()
        .map(|outcome| match outcome {
            Ok(result) => CommandOutcomeJson {
                status: StatusCode::OK.as_u16(),
                result_base64: Some(STANDARD.encode(&result)),
                problem: None,
            },
            Err(problem) => CommandOutcomeJson {
                status: problem.status,
                result_base64: None,
                problem: serde_json::to_value(&problem).ok(),
            },
        })
        .collect();
    Ok(json_with_retry_after(
        CommandBatchJson { results },
        retry_after_secs,
    ))
}

/// `GET /v1/plugins/{name}/keys/{key}`.
#[utoipa::path(
    get,
    path = "/v1/plugins/{name}/keys/{key}",
    tag = "plugins",
    summary = "The value the plugin stored under a key (UTF-8), read in the key's group",
    params(
        ("name" = String, Path, description = "the served plugin"),
        ("key" = String, Path, description = "the key, percent-encoded"),
        ("consistency" = Option<String>, Query, description = "linearizable (default), lease or stale")
    ),
    responses(
        (status = 200, description = "the value's raw bytes", content_type = "application/octet-stream"),
        (status = 400, description = "invalid key or query", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "no such plugin, or nothing stored under the key", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "the key's group has no leader now, or stopped", body = Problem, content_type = "application/problem+json"),
        (status = 504, description = "no answer in time", body = Problem, content_type = "application/problem+json")
    )
)]
pub async fn read_key(
    State(state): State<AppState>,
    path: Result<Path<(String, String)>, PathRejection>,
    query: Result<Query<ReadQuery>, QueryRejection>,
) -> Result<Response, Problem> {
    let (name, key) = path
        .map(|Path(parts)| parts)
        .map_err(|rejection| Problem::invalid_field("key", rejection.body_text()))?;
    let consistency = parse_consistency(routes_sessions::query(query)?.consistency.as_deref())?;
    let client = client(&state, &name)?;
    let key = checked_key(key.into_bytes(), "key")?;
    match client.read(&key, consistency).await? {
        Some(value) => Ok(octets(value)),
        None => Err(Problem::new(
            StatusCode::NOT_FOUND,
            kind::NOT_FOUND,
            format!(
                "plugin {name:?} stores nothing under {:?}",
                String::from_utf8_lossy(&key)
            ),
        )),
    }
}
