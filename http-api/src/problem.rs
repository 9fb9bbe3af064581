//! Errors as `application/problem+json` (RFC 9457), each with a stable `type`.

use std::num::NonZeroU64;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use concord_engine::{EngineError, ProposeError, session_code};
use serde::Serialize;

/// The `type` URIs clients match on. Stable: changing one breaks clients.
pub mod kind {
    /// The body is not valid JSON of the expected shape.
    pub const INVALID_BODY: &str = "urn:concord:problem:invalid-body";
    /// A field (body, path, query or header) is out of its bounds; `field` names it.
    pub const INVALID_FIELD: &str = "urn:concord:problem:invalid-field";
    /// No such session.
    pub const NOT_FOUND: &str = "urn:concord:problem:not-found";
    /// The session exists already.
    pub const ALREADY_EXISTS: &str = "urn:concord:problem:already-exists";
    /// `If-Match` named another version.
    pub const VERSION_MISMATCH: &str = "urn:concord:problem:version-mismatch";
    /// The body is larger than the server accepts.
    pub const BODY_TOO_LARGE: &str = "urn:concord:problem:body-too-large";
    /// The request's body did not arrive within the request timeout: nothing was applied (408).
    pub const BODY_TIMEOUT: &str = "urn:concord:problem:body-timeout";
    /// The body is not `application/json`, or has a `Content-Encoding`.
    pub const UNSUPPORTED_MEDIA_TYPE: &str = "urn:concord:problem:unsupported-media-type";
    /// The group's proposal queue is full: retry after `Retry-After` seconds.
    pub const OVERLOADED: &str = "urn:concord:problem:overloaded";
    /// No result: past the timeout (a write may or may not have applied), or a write applied
    /// within a snapshot this member installed, its result unknown here.
    pub const TIMEOUT: &str = "urn:concord:problem:timeout";
    /// The key's group has no leader to take the request now (503, retry after
    /// `Retry-After`), or the client sent `Concord-Forward: false` and this member does not
    /// lead the group (421; `leader` and `leader_url` name the leader when known).
    pub const NOT_LEADER: &str = "urn:concord:problem:not-leader";
    /// A leadership change dropped the write before it applied: safe to retry.
    pub const RETRY: &str = "urn:concord:problem:retry";
    /// The group stopped (storage failure, shutdown), or this member was removed from it.
    pub const UNAVAILABLE: &str = "urn:concord:problem:unavailable";
    /// No such route.
    pub const NO_ROUTE: &str = "urn:concord:problem:no-route";
    /// The route exists, the method does not.
    pub const METHOD_NOT_ALLOWED: &str = "urn:concord:problem:method-not-allowed";
    /// A membership change was refused (it would lose quorum, names no member, ...): 409.
    pub const MEMBERSHIP_REFUSED: &str = "urn:concord:problem:membership-refused";
    /// A membership change did not reach every group in time; ask again to finish it: 504.
    pub const MEMBERSHIP_UNFINISHED: &str = "urn:concord:problem:membership-unfinished";
    /// A route that changes the cluster was asked without the admin token (401).
    pub const UNAUTHORIZED: &str = "urn:concord:problem:unauthorized";
    /// A route that changes the cluster was asked with a token that is not the admin token
    /// (403).
    pub const FORBIDDEN: &str = "urn:concord:problem:forbidden";
    /// A plugin applied the command and answered with an error: `code` is the plugin's (1000
    /// and up: the host's fault codes); the command's writes were discarded (422).
    pub const COMMAND_FAILED: &str = "urn:concord:problem:command-failed";
    /// An upgrade's module was refused before anything was proposed: it does not load (ABI
    /// version, imports, exports, limits), or is larger than a command may be (422).
    pub const UPGRADE_REFUSED: &str = "urn:concord:problem:upgrade-refused";
    /// A failure of the server itself (storage, plugin fault).
    pub const INTERNAL: &str = "urn:concord:problem:internal";
}

/// One problem answer.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// A stable URI from [`kind`].
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// A short summary of the kind.
    pub title: &'static str,
    /// The HTTP status.
    pub status: u16,
    /// What happened this time.
    pub detail: String,
    /// The invalid field, for `invalid-field`; for `invalid-body`, the field at fault when
    /// the body's shape names one (absent when the body is cut off before any).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<Box<str>>,
    /// The leader's node id, for `not-leader`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>)]
    pub leader: Option<NonZeroU64>,
    /// The leader's URL, for `not-leader`, when the leader told it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader_url: Option<Box<str>>,
    /// Seconds to wait before retrying (also sent as `Retry-After`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_secs: Option<u32>,
    /// The plugin's error code, for `command-failed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<u32>,
}

impl Problem {
    /// A problem of `kind` with `status` and `detail`.
    pub fn new(status: StatusCode, kind: &'static str, detail: impl Into<String>) -> Problem {
        Problem {
            kind,
            title: status.canonical_reason().unwrap_or("Error"),
            status: status.as_u16(),
            detail: detail.into(),
            field: None,
            leader: None,
            leader_url: None,
            retry_after_secs: None,
            code: None,
        }
    }

    /// 400: `field` is invalid.
    pub fn invalid_field(field: impl Into<String>, detail: impl Into<String>) -> Problem {
        Problem {
            field: Some(field.into().into()),
            ..Problem::new(StatusCode::BAD_REQUEST, kind::INVALID_FIELD, detail)
        }
    }

    /// 404 for a session.
    pub fn session_not_found(client_id: &str) -> Problem {
        Problem::new(
            StatusCode::NOT_FOUND,
            kind::NOT_FOUND,
            format!("no session has client_id {client_id:?}"),
        )
    }

    /// 500: a failure of the server itself. Its cause goes to the server's log, at error, under
    /// a reference the answer carries: a client learns what failed (`what`: "storage", ...)
    /// and where an operator finds why, not the server's files and paths, which a storage
    /// error names.
    pub fn internal(what: &str, cause: impl std::fmt::Display) -> Problem {
        let reference = internal_error_reference();
        tracing::error!(%reference, %cause, "internal error ({what})");
        Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            kind::INTERNAL,
            format!(
                "the server failed ({what}); its log has the cause under reference {reference}"
            ),
        )
    }

    /// The HTTP status.
    pub fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = self.status_code();
        let retry_after = self.retry_after_secs;
        let body = serde_json::to_vec(&self).unwrap_or_else(|_| b"{}".to_vec());
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(seconds) = retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

impl From<EngineError> for Problem {
    fn from(error: EngineError) -> Problem {
        let detail = error.to_string();
        match error {
            EngineError::Session(error) => match error.code {
                session_code::NOT_FOUND => {
                    Problem::new(StatusCode::NOT_FOUND, kind::NOT_FOUND, error.message)
                }
                session_code::ALREADY_EXISTS => {
                    Problem::new(StatusCode::CONFLICT, kind::ALREADY_EXISTS, error.message)
                }
                session_code::VERSION_MISMATCH => Problem::new(
                    StatusCode::PRECONDITION_FAILED,
                    kind::VERSION_MISMATCH,
                    error.message,
                ),
                session_code::INVALID_FIELD => {
                    let field = error.invalid_field().unwrap_or_default().to_string();
                    Problem::invalid_field(&field, error.message)
                }
                _ => Problem::new(StatusCode::BAD_REQUEST, kind::INVALID_BODY, error.message),
            },
            EngineError::Propose(error) => from_propose(error, detail),
            EngineError::UnknownNode { .. } => Problem::invalid_field("node_id", detail),
            EngineError::MembershipRefused { .. } => {
                Problem::new(StatusCode::CONFLICT, kind::MEMBERSHIP_REFUSED, detail)
            }
            EngineError::MembershipUnfinished { .. } => Problem::new(
                StatusCode::GATEWAY_TIMEOUT,
                kind::MEMBERSHIP_UNFINISHED,
                detail,
            ),
            EngineError::Command { code, message } => Problem {
                code: Some(code),
                ..Problem::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    kind::COMMAND_FAILED,
                    message,
                )
            },
            EngineError::UnknownPlugin { .. } => {
                Problem::new(StatusCode::NOT_FOUND, kind::NOT_FOUND, detail)
            }
            EngineError::UpgradeRefused { .. } => Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                kind::UPGRADE_REFUSED,
                detail,
            ),
            EngineError::Storage(_) => Problem::internal("storage", detail),
            EngineError::Plugin(_)
            | EngineError::BadResult(_)
            | EngineError::PluginMismatch { .. }
            | EngineError::PluginRecord(_) => Problem::internal("plugin", detail),
            // Config, Layout, Start, NotSessions, and what comes later.
            _ => Problem::internal("engine", detail),
        }
    }
}

/// A reference unique to one internal error: this process's own prefix (from the clock at
/// its first internal error, so that a restarted server's references differ from the last
/// one's in the same log) and a count.
fn internal_error_reference() -> String {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static PREFIX: OnceLock<u32> = OnceLock::new();
    static COUNT: AtomicU64 = AtomicU64::new(1);
    let prefix = *PREFIX.get_or_init(|| {
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        (since_epoch.as_secs() as u32) ^ since_epoch.subsec_nanos()
    });
    format!("{prefix:08x}-{}", COUNT.fetch_add(1, Ordering::Relaxed))
}

fn from_propose(error: ProposeError, detail: String) -> Problem {
    match error {
        // A member forwards to a leader it knows: this is an election, or a hand-over.
        ProposeError::NotLeader { leader, .. } => Problem {
            leader: leader.and_then(NonZeroU64::new),
            retry_after_secs: Some(1),
            ..Problem::new(StatusCode::SERVICE_UNAVAILABLE, kind::NOT_LEADER, detail)
        },
        ProposeError::Overloaded { .. } => Problem {
            retry_after_secs: Some(1),
            ..Problem::new(StatusCode::SERVICE_UNAVAILABLE, kind::OVERLOADED, detail)
        },
        ProposeError::Timeout { .. } | ProposeError::ResultUnknown { .. } => {
            Problem::new(StatusCode::GATEWAY_TIMEOUT, kind::TIMEOUT, detail)
        }
        ProposeError::Dropped { .. } => Problem {
            retry_after_secs: Some(1),
            ..Problem::new(StatusCode::SERVICE_UNAVAILABLE, kind::RETRY, detail)
        },
        ProposeError::Stopped { .. } => Problem {
            retry_after_secs: Some(5),
            ..Problem::new(StatusCode::SERVICE_UNAVAILABLE, kind::UNAVAILABLE, detail)
        },
        // A member removed from the group: another member serves it.
        ProposeError::Refused { .. } => {
            Problem::new(StatusCode::SERVICE_UNAVAILABLE, kind::UNAVAILABLE, detail)
        }
        ProposeError::TooLarge { .. } => {
            Problem::new(StatusCode::PAYLOAD_TOO_LARGE, kind::BODY_TOO_LARGE, detail)
        }
        _ => Problem::internal("consensus", detail),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(error: ProposeError) -> Response {
        Problem::from(EngineError::Propose(error)).into_response()
    }

    #[test]
    fn consensus_refusals_map_to_retryable_statuses() {
        let overloaded = answer(ProposeError::Overloaded { group: 3 });
        assert_eq!(overloaded.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(overloaded.headers()[header::RETRY_AFTER], "1");
        assert_eq!(
            overloaded.headers()[header::CONTENT_TYPE],
            "application/problem+json"
        );

        let timeout = answer(ProposeError::Timeout {
            group: 3,
            timeout_ms: 10,
        });
        assert_eq!(timeout.status(), StatusCode::GATEWAY_TIMEOUT);

        let not_leader = Problem::from(EngineError::Propose(ProposeError::NotLeader {
            group: 3,
            leader: Some(2),
        }));
        // A member forwards to the leader it knows: a refusal is an election, to retry.
        assert_eq!(not_leader.status, 503);
        assert_eq!(not_leader.retry_after_secs, Some(1));
        assert_eq!(not_leader.kind, kind::NOT_LEADER);
        assert_eq!(not_leader.leader, NonZeroU64::new(2));
        let json = serde_json::to_value(&not_leader).unwrap();
        assert_eq!(json["leader"], 2);

        let too_large = answer(ProposeError::TooLarge {
            bytes: 10,
            limit_bytes: 5,
        });
        assert_eq!(too_large.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let dropped = answer(ProposeError::Dropped { group: 1 });
        assert_eq!(dropped.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(dropped.headers()[header::RETRY_AFTER], "1");
    }

    #[test]
    fn a_storage_failure_answers_a_reference_to_the_log_not_the_servers_paths() {
        let error = EngineError::Storage(concord_engine::storage::StorageError::Io {
            path: "/srv/concord/data/state.redb".into(),
            source: std::io::Error::from_raw_os_error(5),
        });
        let first = Problem::from(error);
        assert_eq!(first.status, 500);
        assert_eq!(first.kind, kind::INTERNAL);
        assert!(!first.detail.contains("/srv/concord"), "{}", first.detail);
        assert!(!first.detail.contains("os error"), "{}", first.detail);
        assert!(first.detail.contains("(storage)"), "{}", first.detail);
        let reference = |problem: &Problem| {
            let at = problem.detail.find("reference ").expect("a reference") + 10;
            problem.detail[at..].to_string()
        };
        let second = Problem::internal("storage", "again");
        assert_ne!(
            reference(&first),
            reference(&second),
            "each error has its own"
        );
    }
}
