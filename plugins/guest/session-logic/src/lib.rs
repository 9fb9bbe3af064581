//! The MQTT-style session state machine of Concord, as plain Rust.
//!
//! The same code runs in two places: compiled to wasm inside the `session` plugin (see
//! `plugins/guest/session`), and natively in `concord_plugins::NativeSessionMachine`. Both feed
//! it the group's state through [`SessionStore`], so the native twin and the plugin reach
//! byte-identical state from the same commands.
//!
//! ```
//! use concord_session::{MapStore, Session, SessionCommand, SessionFields, apply_command};
//!
//! let mut store = MapStore::default();
//! let create = SessionCommand::Create {
//!     client_id: "sensor-17".into(),
//!     fields: SessionFields { session_expiry_interval_secs: 3600, ..Default::default() },
//!     now_ms: 1_700_000_000_000,
//! };
//! let created = Session::decode(&apply_command(&mut store, &create.encode()).unwrap()).unwrap();
//! assert_eq!(created.version, 1);
//! // Creating it again is refused with a stable code.
//! let again = apply_command(&mut store, &create.encode()).unwrap_err();
//! assert_eq!(again.code, concord_session::code::ALREADY_EXISTS);
//! ```

#![warn(missing_docs)]

pub mod codec;
mod command;
mod error;
mod logic;
mod model;
mod store;

pub use command::{ExpireOutcome, ListPage, PAGE_LIMIT_MAX, SessionCommand};
pub use error::{SessionError, code};
pub use logic::{apply_command, session_key};
pub use model::{
    BROKER_ID_BYTES_MAX, CLIENT_ID_BYTES_MAX, LastWill, NEVER_EXPIRES, Session, SessionFields,
    SessionPatch, WILL_PAYLOAD_BYTES_MAX, WILL_TOPIC_BYTES_MAX, validate_client_id,
};
#[cfg(not(target_arch = "wasm32"))]
pub use model::{SessionExpiry, expiry_of_record};
pub use store::{KeyValue, MapStore, SessionStore, StoreRejected};

#[cfg(test)]
mod tests;
