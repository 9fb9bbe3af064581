//! A JSON body extractor whose every failure is a problem answer naming what is wrong.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{StatusCode, header};
use serde::de::value::MapAccessDeserializer;
use serde::de::{DeserializeOwned, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use std::fmt;
use std::marker::PhantomData;

use crate::problem::{Problem, kind};
use crate::request_gate::BodyWait;

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

    async fn from_request(request: Request, _state: &S) -> Result<Self, Self::Rejection> {
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
        let bytes = read_body(request).await?;
        decode(&bytes).map(JsonBody)
    }
}

/// The whole body of `request`, within the body limit; its wait counts as waiting for the body
/// (a 408 rather than a 504 past the request timeout).
pub(crate) async fn read_body(request: Request) -> Result<Bytes, Problem> {
    let body_wait = request.extensions().get::<BodyWait>().cloned();
    if let Some(wait) = &body_wait {
        wait.begin();
    }
    let read = Bytes::from_request(request, &()).await;
    if let Some(wait) = &body_wait {
        wait.end();
    }
    read.map_err(|rejection| {
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
    })
}

/// Decodes `bytes`, a JSON object, naming the field at fault.
///
/// A body is decoded once as it is; only a body that fails is decoded again to name the field
/// (tracking the path costs an allocation per key, which every good request would pay).
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Problem> {
    match serde_json::from_slice::<Object<T>>(bytes) {
        Ok(value) => Ok(value.0),
        Err(_) => decode_naming_the_fault(bytes),
    }
}

fn decode_naming_the_fault<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Problem> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value: Object<T> =
        serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
            let path = error.path().to_string();
            let mut problem = Problem::new(
                StatusCode::BAD_REQUEST,
                kind::INVALID_BODY,
                format!("{}", error.inner()),
            );
            problem.field = known_path(&path).map(Into::into);
            problem
        })?;
    deserializer.end().map_err(|error| {
        Problem::new(
            StatusCode::BAD_REQUEST,
            kind::INVALID_BODY,
            format!("trailing characters after the JSON value: {error}"),
        )
    })?;
    Ok(value.0)
}

/// The field path the decoder named, without its trailing segments it could not tell ("?":
/// a body cut off inside an object, say), or `None` when nothing of it is known.
fn known_path(path: &str) -> Option<&str> {
    let mut known = path;
    while let Some(rest) = known.strip_suffix('?') {
        known = rest.strip_suffix('.').unwrap_or(rest);
    }
    (!known.is_empty() && known != ".").then_some(known)
}

/// A `T` read from a JSON object only.
///
/// serde's derived structs (and internally tagged enums) also accept a JSON array of the
/// field values in order, which would let a body skip the refusal of unknown fields and
/// contradict the API's schema; every request shape goes through this instead.
pub struct Object<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(ObjectVisitor(PhantomData))
    }
}

struct ObjectVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
    type Value = Object<T>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        T::deserialize(MapAccessDeserializer::new(map)).map(Object)
    }
}

/// `deserialize_with` for a field holding an object.
pub fn object<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Object::deserialize(deserializer).map(|object| object.0)
}

/// `deserialize_with` for a field holding an object or `null`.
pub fn optional_object<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<Object<T>>::deserialize(deserializer).map(|value| value.map(|object| object.0))
}

/// `deserialize_with` for a field holding an array of objects.
pub fn objects<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Vec::<Object<T>>::deserialize(deserializer)
        .map(|values| values.into_iter().map(|object| object.0).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        name: String,
        inner: Option<Inner>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        size: u32,
    }

    fn field_of(body: &str) -> Option<String> {
        let problem = decode::<Body>(body.as_bytes()).expect_err(body);
        assert_eq!(problem.status, 400, "{body}");
        problem.field.map(|field| field.to_string())
    }

    #[test]
    fn a_wrong_value_names_its_field() {
        assert_eq!(field_of(r#"{"name": 5}"#).as_deref(), Some("name"));
        assert_eq!(
            field_of(r#"{"name": "a", "inner": {"size": "big"}}"#).as_deref(),
            Some("inner.size")
        );
    }

    #[test]
    fn a_body_cut_off_names_no_field_it_cannot_tell() {
        assert_eq!(field_of(r#"{"name": "a""#), None);
        assert_eq!(
            field_of(r#"{"name": "a", "inner": {"size": 1"#).as_deref(),
            Some("inner")
        );
        assert_eq!(field_of("[1, 2]"), None);
        assert_eq!(field_of("not json"), None);
    }

    #[test]
    fn known_path_drops_only_the_unknown_tail() {
        assert_eq!(known_path("?"), None);
        assert_eq!(known_path("."), None);
        assert_eq!(known_path("a.?"), Some("a"));
        assert_eq!(known_path("a.b"), Some("a.b"));
        assert_eq!(known_path("a[0].?"), Some("a[0]"));
    }
}
