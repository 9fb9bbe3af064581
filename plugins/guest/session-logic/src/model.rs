//! The session record and its bounded fields.

use crate::SessionError;
use crate::codec::{Reader, Writer};

/// Longest client id, in bytes of UTF-8.
pub const CLIENT_ID_BYTES_MAX: usize = 256;
/// Longest broker id, in bytes of UTF-8.
pub const BROKER_ID_BYTES_MAX: usize = 256;
/// Longest last-will topic, in bytes of UTF-8.
pub const WILL_TOPIC_BYTES_MAX: usize = 1024;
/// Largest last-will payload, in bytes.
pub const WILL_PAYLOAD_BYTES_MAX: usize = 64 * 1024;
/// `session_expiry_interval_secs` of a session that never expires (as in MQTT 5).
pub const NEVER_EXPIRES: u32 = u32::MAX;

const RECORD_FORMAT: u8 = 1;

/// The message a broker publishes when a client goes away without saying goodbye.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LastWill {
    /// The topic (1 to [`WILL_TOPIC_BYTES_MAX`] bytes).
    pub topic: String,
    /// The payload (at most [`WILL_PAYLOAD_BYTES_MAX`] bytes).
    pub payload: Vec<u8>,
    /// Quality of service: 0, 1 or 2.
    pub qos: u8,
    /// Whether the broker retains the message.
    pub retain: bool,
    /// How long the broker waits before publishing it.
    pub delay_interval_secs: u32,
}

/// What a client sets on a session; the rest ([`Session`]'s id, timestamps, version) the state
/// machine keeps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionFields {
    /// How long the session outlives its connection; [`NEVER_EXPIRES`] for ever.
    pub session_expiry_interval_secs: u32,
    /// Whether the client asked for a clean start.
    pub clean_start: bool,
    /// The client's last will, if any.
    pub last_will: Option<LastWill>,
    /// The broker holding the connection (at most [`BROKER_ID_BYTES_MAX`] bytes).
    pub broker_id: String,
    /// The connection on that broker.
    pub connection_id: u64,
}

/// A partial update: `None` leaves a field as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionPatch {
    /// New expiry interval.
    pub session_expiry_interval_secs: Option<u32>,
    /// New clean-start flag.
    pub clean_start: Option<bool>,
    /// `Some(None)` removes the last will, `Some(Some(w))` sets it.
    pub last_will: Option<Option<LastWill>>,
    /// New broker.
    pub broker_id: Option<String>,
    /// New connection.
    pub connection_id: Option<u64>,
}

/// An MQTT-style client session as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    /// The key (1 to [`CLIENT_ID_BYTES_MAX`] bytes of UTF-8).
    pub client_id: String,
    /// The client's fields.
    pub fields: SessionFields,
    /// When it was created, in milliseconds since the Unix epoch (the proposer's clock).
    pub created_at_ms: u64,
    /// When it last changed, likewise.
    pub updated_at_ms: u64,
    /// 1 on creation, +1 on every change: the `If-Match` of optimistic concurrency.
    pub version: u64,
}

impl Session {
    /// Whether the store ends the session at `now_ms`: the client asked for a finite lifetime
    /// (an interval that is neither 0 — MQTT ends such a session with its connection, and the
    /// broker, which sees the connection close, deletes it — nor [`NEVER_EXPIRES`]), no
    /// connection holds it (`connection_id` 0: the broker clears it at the disconnect), and
    /// the interval has passed since its last change.
    pub fn is_expired(&self, now_ms: u64) -> bool {
        let interval = self.fields.session_expiry_interval_secs;
        interval != 0
            && interval != NEVER_EXPIRES
            && self.fields.connection_id == 0
            && now_ms
                >= self
                    .updated_at_ms
                    .saturating_add(u64::from(interval) * 1000)
    }

    /// The stored bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut writer = Writer::with_capacity(self.encoded_len_estimate());
        self.write(&mut writer);
        writer.finish()
    }

    /// About the encoded size: the variable parts plus a bound on the fixed ones.
    fn encoded_len_estimate(&self) -> usize {
        const FIXED_BYTES: usize = 96;
        let will = self
            .fields
            .last_will
            .as_ref()
            .map_or(0, |w| w.topic.len() + w.payload.len());
        FIXED_BYTES + self.client_id.len() + self.fields.broker_id.len() + will
    }

    /// Writes the record into `writer`.
    pub fn write(&self, writer: &mut Writer) {
        writer.u8(RECORD_FORMAT);
        writer.str(&self.client_id);
        self.fields.write(writer);
        writer.u64(self.created_at_ms);
        writer.u64(self.updated_at_ms);
        writer.u64(self.version);
    }

    /// Decodes stored bytes.
    pub fn decode(bytes: &[u8]) -> Result<Session, SessionError> {
        let mut reader = Reader::new(bytes);
        let session = Session::read(&mut reader)?;
        reader.finish("session")?;
        Ok(session)
    }

    /// Reads a record from `reader`.
    pub fn read(reader: &mut Reader<'_>) -> Result<Session, SessionError> {
        let format = reader.u8("session format")?;
        if format != RECORD_FORMAT {
            return Err(SessionError::malformed(format!(
                "unknown session format {format}"
            )));
        }
        Ok(Session {
            client_id: reader.string("client_id")?,
            fields: SessionFields::read(reader)?,
            created_at_ms: reader.u64("created_at_ms")?,
            updated_at_ms: reader.u64("updated_at_ms")?,
            version: reader.u64("version")?,
        })
    }
}

impl SessionFields {
    /// Checks every bound; the error names the field.
    pub fn validate(&self) -> Result<(), SessionError> {
        if self.broker_id.len() > BROKER_ID_BYTES_MAX {
            return Err(SessionError::invalid("broker_id", "longer than 256 bytes"));
        }
        if let Some(will) = &self.last_will {
            will.validate()?;
        }
        Ok(())
    }

    pub(crate) fn write(&self, writer: &mut Writer) {
        writer.u32(self.session_expiry_interval_secs);
        writer.bool(self.clean_start);
        writer.option(self.last_will.as_ref(), |w, will| will.write(w));
        writer.str(&self.broker_id);
        writer.u64(self.connection_id);
    }

    pub(crate) fn read(reader: &mut Reader<'_>) -> Result<SessionFields, SessionError> {
        Ok(SessionFields {
            session_expiry_interval_secs: reader.u32("session_expiry_interval_secs")?,
            clean_start: reader.bool("clean_start")?,
            last_will: reader.option("last_will", LastWill::read)?,
            broker_id: reader.string("broker_id")?,
            connection_id: reader.u64("connection_id")?,
        })
    }

    /// Applies `patch` in place: the fields it leaves out stay as they are (and are not
    /// copied: a reconnect changes one number of a record that holds several strings).
    pub fn patch(&mut self, patch: SessionPatch) {
        if let Some(interval) = patch.session_expiry_interval_secs {
            self.session_expiry_interval_secs = interval;
        }
        if let Some(clean_start) = patch.clean_start {
            self.clean_start = clean_start;
        }
        if let Some(last_will) = patch.last_will {
            self.last_will = last_will;
        }
        if let Some(broker_id) = patch.broker_id {
            self.broker_id = broker_id;
        }
        if let Some(connection_id) = patch.connection_id {
            self.connection_id = connection_id;
        }
    }
}

impl SessionPatch {
    pub(crate) fn write(&self, writer: &mut Writer) {
        writer.option(self.session_expiry_interval_secs.as_ref(), |w, v| w.u32(*v));
        writer.option(self.clean_start.as_ref(), |w, v| w.bool(*v));
        writer.option(self.last_will.as_ref(), |w, will| {
            w.option(will.as_ref(), |w, will| will.write(w))
        });
        writer.option(self.broker_id.as_ref(), |w, v| w.str(v));
        writer.option(self.connection_id.as_ref(), |w, v| w.u64(*v));
    }

    pub(crate) fn read(reader: &mut Reader<'_>) -> Result<SessionPatch, SessionError> {
        Ok(SessionPatch {
            session_expiry_interval_secs: reader.option("session_expiry_interval_secs", |r| {
                r.u32("session_expiry_interval_secs")
            })?,
            clean_start: reader.option("clean_start", |r| r.bool("clean_start"))?,
            last_will: reader.option("last_will", |r| r.option("last_will", LastWill::read))?,
            broker_id: reader.option("broker_id", |r| r.string("broker_id"))?,
            connection_id: reader.option("connection_id", |r| r.u64("connection_id"))?,
        })
    }
}

impl LastWill {
    /// Checks every bound; the error names the field.
    pub fn validate(&self) -> Result<(), SessionError> {
        if self.topic.is_empty() || self.topic.len() > WILL_TOPIC_BYTES_MAX {
            return Err(SessionError::invalid(
                "last_will.topic",
                "must be 1 to 1024 bytes",
            ));
        }
        if self.payload.len() > WILL_PAYLOAD_BYTES_MAX {
            return Err(SessionError::invalid(
                "last_will.payload",
                "longer than 65536 bytes",
            ));
        }
        if self.qos > 2 {
            return Err(SessionError::invalid("last_will.qos", "must be 0, 1 or 2"));
        }
        Ok(())
    }

    fn write(&self, writer: &mut Writer) {
        writer.str(&self.topic);
        writer.bytes(&self.payload);
        writer.u8(self.qos);
        writer.bool(self.retain);
        writer.u32(self.delay_interval_secs);
    }

    fn read(reader: &mut Reader<'_>) -> Result<LastWill, SessionError> {
        Ok(LastWill {
            topic: reader.string("last_will.topic")?,
            payload: reader.bytes("last_will.payload")?.to_vec(),
            qos: reader.u8("last_will.qos")?,
            retain: reader.bool("last_will.retain")?,
            delay_interval_secs: reader.u32("last_will.delay_interval_secs")?,
        })
    }
}

/// When a stored session ends by expiry, and the version it holds then. For the host's index
/// of expiring sessions: not built into the plugin, whose bytes stay as they were.
#[cfg(not(target_arch = "wasm32"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionExpiry {
    /// The first clock reading at which [`Session::is_expired`] holds, in milliseconds since
    /// the Unix epoch.
    pub expires_at_ms: u64,
    /// The session's version: a removal that names it removes this session as it stands,
    /// and nothing written after it.
    pub version: u64,
}

/// When the stored session `record` expires, read from its bytes without building the
/// session: `None` for one that cannot expire as it stands (no finite interval, or a
/// connection holds it), by the same rule as [`Session::is_expired`].
#[cfg(not(target_arch = "wasm32"))]
pub fn expiry_of_record(record: &[u8]) -> Result<Option<SessionExpiry>, SessionError> {
    let mut reader = Reader::new(record);
    let format = reader.u8("session format")?;
    if format != RECORD_FORMAT {
        return Err(SessionError::malformed(format!(
            "unknown session format {format}"
        )));
    }
    reader.bytes("client_id")?;
    let interval = reader.u32("session_expiry_interval_secs")?;
    reader.bool("clean_start")?;
    if reader.bool("last_will")? {
        reader.bytes("last_will.topic")?;
        reader.bytes("last_will.payload")?;
        reader.u8("last_will.qos")?;
        reader.bool("last_will.retain")?;
        reader.u32("last_will.delay_interval_secs")?;
    }
    reader.bytes("broker_id")?;
    let connection_id = reader.u64("connection_id")?;
    reader.u64("created_at_ms")?;
    let updated_at_ms = reader.u64("updated_at_ms")?;
    let version = reader.u64("version")?;
    reader.finish("session")?;
    Ok(expiry_from(interval, connection_id, updated_at_ms, version))
}

/// When a session with these fields expires: the rule of [`Session::is_expired`].
#[cfg(not(target_arch = "wasm32"))]
fn expiry_from(
    interval_secs: u32,
    connection_id: u64,
    updated_at_ms: u64,
    version: u64,
) -> Option<SessionExpiry> {
    let expires = interval_secs != 0 && interval_secs != NEVER_EXPIRES && connection_id == 0;
    expires.then(|| SessionExpiry {
        expires_at_ms: updated_at_ms.saturating_add(u64::from(interval_secs) * 1000),
        version,
    })
}

#[cfg(not(target_arch = "wasm32"))]
impl Session {
    /// When this session expires as it stands, or `None` if it cannot (see
    /// [`Session::is_expired`]).
    pub fn expiry(&self) -> Option<SessionExpiry> {
        expiry_from(
            self.fields.session_expiry_interval_secs,
            self.fields.connection_id,
            self.updated_at_ms,
            self.version,
        )
    }
}

/// Checks a client id: 1 to [`CLIENT_ID_BYTES_MAX`] bytes (UTF-8 is guaranteed by `str`).
pub fn validate_client_id(client_id: &str) -> Result<(), SessionError> {
    if client_id.is_empty() || client_id.len() > CLIENT_ID_BYTES_MAX {
        return Err(SessionError::invalid(
            "client_id",
            "must be 1 to 256 bytes of UTF-8",
        ));
    }
    Ok(())
}
