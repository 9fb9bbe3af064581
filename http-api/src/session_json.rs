//! The JSON shapes of sessions: request bodies (unknown fields refused) and answers.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use concord_engine::{LastWill, Session, SessionFields, SessionPatch};
use serde::{Deserialize, Deserializer, Serialize};

use crate::json_body::optional_object;
use crate::problem::Problem;

/// A session as the API returns it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SessionJson {
    /// The MQTT client id (1–256 bytes of UTF-8): the key.
    pub client_id: String,
    /// Seconds the session outlives a disconnect; 4294967295 = never expires.
    pub session_expiry_interval_secs: u32,
    /// The client asked for a clean start.
    pub clean_start: bool,
    /// The will message, if any.
    pub last_will: Option<LastWillJson>,
    /// The broker holding the connection.
    pub broker_id: String,
    /// The broker's connection id.
    pub connection_id: u64,
    /// When the session was created (proposer's clock, ms since the Unix epoch).
    pub created_at_ms: u64,
    /// When it last changed.
    pub updated_at_ms: u64,
    /// Starts at 1, +1 per change; `If-Match` compares against it.
    pub version: u64,
}

/// An MQTT will message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LastWillJson {
    /// The topic (1–1024 bytes, no U+0000).
    #[schema(min_length = 1, max_length = 1024)]
    pub topic: String,
    /// The payload (up to 64 KiB), base64.
    #[serde(default)]
    pub payload_base64: String,
    /// 0, 1 or 2.
    #[serde(default)]
    #[schema(maximum = 2)]
    pub qos: u8,
    /// Retain flag.
    #[serde(default)]
    pub retain: bool,
    /// Seconds to wait before publishing the will.
    #[serde(default)]
    pub delay_interval_secs: u32,
}

/// `POST /v1/sessions`.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateBody {
    /// The client id (1–256 bytes of UTF-8, no U+0000).
    #[schema(min_length = 1, max_length = 256)]
    pub client_id: String,
    /// See [`SessionJson`].
    #[serde(default)]
    pub session_expiry_interval_secs: u32,
    /// See [`SessionJson`].
    #[serde(default)]
    pub clean_start: bool,
    /// See [`SessionJson`].
    #[serde(default, deserialize_with = "optional_object")]
    pub last_will: Option<LastWillJson>,
    /// See [`SessionJson`].
    #[serde(default)]
    pub broker_id: String,
    /// See [`SessionJson`].
    #[serde(default)]
    pub connection_id: u64,
}

/// `PUT /v1/sessions/{client_id}`: every field (absent ones take their defaults).
#[derive(Clone, Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplaceBody {
    /// See [`SessionJson`].
    #[serde(default)]
    pub session_expiry_interval_secs: u32,
    /// See [`SessionJson`].
    #[serde(default)]
    pub clean_start: bool,
    /// See [`SessionJson`].
    #[serde(default, deserialize_with = "optional_object")]
    pub last_will: Option<LastWillJson>,
    /// See [`SessionJson`].
    #[serde(default)]
    pub broker_id: String,
    /// See [`SessionJson`].
    #[serde(default)]
    pub connection_id: u64,
}

/// `PATCH /v1/sessions/{client_id}`: only the fields present change; `"last_will": null`
/// removes the will.
#[derive(Clone, Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PatchBody {
    /// See [`SessionJson`].
    #[serde(default, deserialize_with = "not_null")]
    #[schema(nullable = false)]
    pub session_expiry_interval_secs: Option<u32>,
    /// See [`SessionJson`].
    #[serde(default, deserialize_with = "not_null")]
    #[schema(nullable = false)]
    pub clean_start: Option<bool>,
    /// Absent: unchanged; `null`: removed; an object: replaced.
    #[serde(default, deserialize_with = "present")]
    pub last_will: Option<Option<LastWillJson>>,
    /// See [`SessionJson`].
    #[serde(default, deserialize_with = "not_null")]
    #[schema(nullable = false)]
    pub broker_id: Option<String>,
    /// See [`SessionJson`].
    #[serde(default, deserialize_with = "not_null")]
    #[schema(nullable = false)]
    pub connection_id: Option<u64>,
}

/// A field that, when present, holds a value: `null` is refused rather than read as absent.
fn not_null<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
}

/// A field that is present (even as `null`) becomes `Some`.
fn present<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    optional_object(deserializer).map(Some)
}

impl From<Session> for SessionJson {
    fn from(session: Session) -> Self {
        SessionJson {
            client_id: session.client_id,
            session_expiry_interval_secs: session.fields.session_expiry_interval_secs,
            clean_start: session.fields.clean_start,
            last_will: session.fields.last_will.map(|will| LastWillJson {
                topic: will.topic,
                payload_base64: BASE64.encode(will.payload),
                qos: will.qos,
                retain: will.retain,
                delay_interval_secs: will.delay_interval_secs,
            }),
            broker_id: session.fields.broker_id,
            connection_id: session.fields.connection_id,
            created_at_ms: session.created_at_ms,
            updated_at_ms: session.updated_at_ms,
            version: session.version,
        }
    }
}

impl SessionJson {
    /// The bytes of this session's JSON unless its strings need escapes: the field names,
    /// punctuation and the longest numbers, and its strings.
    pub fn encoded_len_estimate(&self) -> usize {
        const FIXED_BYTES: usize = 352;
        let will_bytes = self
            .last_will
            .as_ref()
            .map_or(0, |will| will.topic.len() + will.payload_base64.len());
        FIXED_BYTES + self.client_id.len() + self.broker_id.len() + will_bytes
    }
}

impl LastWillJson {
    fn into_will(self, field: &str) -> Result<LastWill, Problem> {
        let payload = BASE64
            .decode(self.payload_base64.as_bytes())
            .map_err(|error| {
                Problem::invalid_field(
                    format!("{field}.payload_base64"),
                    format!("not base64: {error}"),
                )
            })?;
        Ok(LastWill {
            topic: self.topic,
            payload,
            qos: self.qos,
            retain: self.retain,
            delay_interval_secs: self.delay_interval_secs,
        })
    }
}

impl CreateBody {
    /// The client id and the fields, or the field at fault.
    pub fn into_parts(self) -> Result<(String, SessionFields), Problem> {
        let replace = ReplaceBody {
            session_expiry_interval_secs: self.session_expiry_interval_secs,
            clean_start: self.clean_start,
            last_will: self.last_will,
            broker_id: self.broker_id,
            connection_id: self.connection_id,
        };
        Ok((self.client_id, replace.into_fields()?))
    }
}

impl ReplaceBody {
    /// The fields, or the field at fault.
    pub fn into_fields(self) -> Result<SessionFields, Problem> {
        Ok(SessionFields {
            session_expiry_interval_secs: self.session_expiry_interval_secs,
            clean_start: self.clean_start,
            last_will: self
                .last_will
                .map(|will| will.into_will("last_will"))
                .transpose()?,
            broker_id: self.broker_id,
            connection_id: self.connection_id,
        })
    }
}

impl PatchBody {
    /// The patch, or the field at fault.
    pub fn into_patch(self) -> Result<SessionPatch, Problem> {
        let last_will = match self.last_will {
            None => None,
            Some(None) => Some(None),
            Some(Some(will)) => Some(Some(will.into_will("last_will")?)),
        };
        Ok(SessionPatch {
            session_expiry_interval_secs: self.session_expiry_interval_secs,
            clean_start: self.clean_start,
            last_will,
            broker_id: self.broker_id,
            connection_id: self.connection_id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json_body::decode;

    #[test]
    fn patch_tells_absent_from_null() {
        let absent: PatchBody = decode(br#"{"connection_id": 3}"#).unwrap();
        assert_eq!(absent.into_patch().unwrap().last_will, None);
        let null: PatchBody = decode(br#"{"last_will": null}"#).unwrap();
        assert_eq!(null.into_patch().unwrap().last_will, Some(None));
    }

    #[test]
    fn shape_errors_name_the_field() {
        let error =
            decode::<CreateBody>(br#"{"client_id": "a", "last_will": {"topic": "t", "qos": 300}}"#)
                .unwrap_err();
        assert_eq!(error.field.as_deref(), Some("last_will.qos"));
        let error = decode::<CreateBody>(br#"{"client_id": "a", "colour": 1}"#).unwrap_err();
        assert!(
            error.detail.contains("unknown field `colour`"),
            "{}",
            error.detail
        );
        let error = decode::<CreateBody>(br#"{"client_id": "a"} x"#).unwrap_err();
        assert!(error.detail.contains("trailing"), "{}", error.detail);
        let body: CreateBody =
            decode(br#"{"client_id": "a", "last_will": {"topic": "t", "payload_base64": "!!"}}"#)
                .unwrap();
        let error = body.into_parts().unwrap_err();
        assert_eq!(error.field.as_deref(), Some("last_will.payload_base64"));
    }
}
