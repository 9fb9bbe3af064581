//! What several routes' OpenAPI descriptions share: the problems a route gives for reading a
//! JSON body, for needing the admin token or for taking a key's group through its leader, and
//! the headers that steer forwarding and conditional writes. Each is written once, so every
//! route that gives an answer describes it in the same words. Routes name these types in
//! `#[utoipa::path]` (`responses(...)`, `params(...)`) beside their own answers.

use std::collections::BTreeMap;

use utoipa::openapi::path::{Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, Required, Response, ResponseBuilder};
use utoipa::{IntoParams, IntoResponses};

/// 408, 413 and 415: the answers of a route that reads a JSON body (`JsonBody`).
pub struct JsonBodyProblems;

impl IntoResponses for JsonBodyProblems {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        problems(&[
            (
                408,
                "the body did not arrive within the request timeout; nothing was applied",
            ),
            (413, "body over max_body_bytes"),
            (415, "not application/json, or a Content-Encoding"),
        ])
    }
}

/// 401 and 403: the answers of a route that needs the admin token when the server has one.
pub struct AdminProblems;

impl IntoResponses for AdminProblems {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        problems(&[
            (
                401,
                "the server has an admin token and the request carries none (Authorization: Bearer)",
            ),
            (403, "the bearer token is not the admin token"),
        ])
    }
}

/// 421, 503 and 504: the answers of a route that takes a key's group through its leader
/// (`Forwarding`) and waits for raft.
pub struct KeyedProblems;

impl IntoResponses for KeyedProblems {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        problems(&[
            (
                421,
                "Concord-Forward: false and this member does not lead the key's group; leader and leader_url name the leader",
            ),
            (503, "overloaded (Retry-After), retry or unavailable"),
            (504, "no answer in time"),
        ])
    }
}

/// 404 and 412: the answers of a write to an existing session that may carry `If-Match`.
pub struct SessionVersionProblems;

impl IntoResponses for SessionVersionProblems {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        problems(&[
            (404, "no such session"),
            (412, "If-Match names another version"),
        ])
    }
}

/// The `Concord-Forward` header (`Forwarding`).
pub struct ForwardHeader;

impl IntoParams for ForwardHeader {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![optional_header(
            "Concord-Forward",
            "^(true|false)$",
            "false: only the leader of the key's group answers (421 elsewhere); default true: any member answers",
        )]
    }
}

/// The `If-Match` header of a session write.
pub struct IfMatchHeader;

impl IntoParams for IfMatchHeader {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![optional_header(
            "If-Match",
            r#"^(\*|"[0-9]{1,19}")$"#,
            "the version the session must be at, e.g. \"3\", or *",
        )]
    }
}

/// Each `(status, description)` as an `application/problem+json` answer with the `Problem`
/// schema.
fn problems(answers: &[(u16, &str)]) -> BTreeMap<String, RefOr<Response>> {
    answers
        .iter()
        .map(|&(status, description)| {
            let content = ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("Problem")))
                .build();
            let response = ResponseBuilder::new()
                .description(description)
                .content("application/problem+json", content)
                .build();
            (status.to_string(), RefOr::T(response))
        })
        .collect()
}

/// A header a request may leave out, a string matching `pattern`.
fn optional_header(name: &str, pattern: &str, description: &str) -> Parameter {
    let schema = ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
        .pattern(Some(pattern))
        .build();
    ParameterBuilder::new()
        .name(name)
        .parameter_in(ParameterIn::Header)
        .required(Required::False)
        .description(Some(description))
        .schema(Some(schema))
        .build()
}
