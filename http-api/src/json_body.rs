//! A JSON body extractor whose every failure is a problem answer naming what is wrong.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{StatusCode, header};
use serde::de::DeserializeOwned;

use crate::problem::{Problem, kind};

/// A request body decoded from JSON. Refuses a missing or other content type (415), a body
/// over the limit (413), and malformed JSON or a wrong shape (400, with the path of the field).
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

impl<S, T> FromRequest<S> for JsonBody<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = Problem;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let is_json = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.split(';').next())
            .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"));
        if !is_json {
            return Err(Problem::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                kind::UNSUPPORTED_MEDIA_TYPE,
                "the body must be application/json",
            ));
        }
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(|rejection| {
                if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    Problem::new(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        kind::BODY_TOO_LARGE,
                        "the body is larger than the server accepts (max_body_bytes)",
                    )
                } else {
                    Problem::new(
                        StatusCode::BAD_REQUEST,
                        kind::INVALID_BODY,
                        format!("cannot read the body: {rejection}"),
                    )
                }
            })?;
        decode(&bytes).map(JsonBody)
    }
}

/// Decodes `bytes`, naming the field at fault.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Problem> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let path = error.path().to_string();
        let mut problem = Problem::new(
            StatusCode::BAD_REQUEST,
            kind::INVALID_BODY,
            format!("{}", error.inner()),
        );
        if path != "." {
            problem.field = Some(path.into());
        }
        problem
    })?;
    deserializer.end().map_err(|error| {
        Problem::new(
            StatusCode::BAD_REQUEST,
            kind::INVALID_BODY,
            format!("trailing characters after the JSON value: {error}"),
        )
    })?;
    Ok(value)
}
