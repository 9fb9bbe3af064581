//! What each session command does to the store.

use crate::command::PAGE_LIMIT_MAX;
use crate::model::validate_client_id;
use crate::{
    ExpireOutcome, ListPage, Session, SessionCommand, SessionError, SessionStore, StoreRejected,
    code,
};

/// Where sessions live in the group's key space: `s/<client_id>`.
const KEY_PREFIX: &[u8] = b"s/";

/// The store key of a session.
pub fn session_key(client_id: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(KEY_PREFIX.len() + client_id.len());
    key.extend_from_slice(KEY_PREFIX);
    key.extend_from_slice(client_id.as_bytes());
    key
}

/// Applies one encoded command and returns its encoded result: a [`Session`] for create, get,
/// replace, update and delete; a [`ListPage`] for list; an [`ExpireOutcome`] for expire.
///
/// On an error the command may have written nothing yet, or a part: the caller discards the
/// command's writes (the wasm host and the native twin both do).
pub fn apply_command(
    store: &mut impl SessionStore,
    command: &[u8],
) -> Result<Vec<u8>, SessionError> {
    match SessionCommand::decode(command)? {
        SessionCommand::Create {
            client_id,
            fields,
            now_ms,
        } => {
            validate_client_id(&client_id)?;
            fields.validate()?;
            let key = session_key(&client_id);
            if store.get(&key).map_err(rejected)?.is_some() {
                return Err(SessionError::new(
                    code::ALREADY_EXISTS,
                    format!("session {client_id:?} exists"),
                ));
            }
            let session = Session {
                client_id,
                fields,
                created_at_ms: now_ms,
                updated_at_ms: now_ms,
                version: 1,
            };
            let bytes = session.encode();
            store.put(&key, &bytes).map_err(rejected)?;
            Ok(bytes)
        }
        SessionCommand::Get { client_id } => {
            validate_client_id(&client_id)?;
            // The stored bytes are the answer: whoever reads them decodes them.
            load_bytes(store, &client_id)
        }
        SessionCommand::Replace {
            client_id,
            fields,
            expected_version,
            now_ms,
        } => {
            validate_client_id(&client_id)?;
            fields.validate()?;
            let mut session = load(store, &client_id)?;
            check_version(&session, expected_version)?;
            session.fields = fields;
            store_changed(store, session, now_ms)
        }
        SessionCommand::Update {
            client_id,
            patch,
            expected_version,
            now_ms,
        } => {
            validate_client_id(&client_id)?;
            let mut session = load(store, &client_id)?;
            check_version(&session, expected_version)?;
            session.fields.patch(patch);
            session.fields.validate()?;
            store_changed(store, session, now_ms)
        }
        SessionCommand::Delete {
            client_id,
            expected_version,
        } => {
            validate_client_id(&client_id)?;
            let bytes = load_bytes(store, &client_id)?;
            check_version(&Session::decode(&bytes)?, expected_version)?;
            store.delete(&session_key(&client_id)).map_err(rejected)?;
            Ok(bytes)
        }
        SessionCommand::List {
            prefix,
            start_after,
            limit,
        } => {
            check_page_limit("limit", limit)?;
            let (start, end) = page_bounds(&prefix, start_after.as_deref());
            // One more than asked says whether another page exists.
            let pairs = store
                .scan(&start, end.as_deref(), limit + 1)
                .map_err(rejected)?;
            let more = pairs.len() > limit as usize;
            let mut sessions = Vec::with_capacity(pairs.len().min(limit as usize));
            for (_, value) in pairs.into_iter().take(limit as usize) {
                sessions.push(Session::decode(&value)?);
            }
            let next_start_after = if more {
                sessions.last().map(|s| s.client_id.clone())
            } else {
                None
            };
            Ok(ListPage {
                sessions,
                next_start_after,
            }
            .encode())
        }
        SessionCommand::Expire {
            now_ms,
            start_after,
            scan_limit,
        } => {
            check_page_limit("scan_limit", scan_limit)?;
            let (start, end) = page_bounds("", start_after.as_deref());
            let pairs = store
                .scan(&start, end.as_deref(), scan_limit + 1)
                .map_err(rejected)?;
            let more = pairs.len() > scan_limit as usize;
            let mut outcome = ExpireOutcome::default();
            let mut last_seen = None;
            for (key, value) in pairs.into_iter().take(scan_limit as usize) {
                let session = Session::decode(&value)?;
                if session.is_expired(now_ms) {
                    store.delete(&key).map_err(rejected)?;
                    outcome.expired.push(session.client_id.clone());
                }
                last_seen = Some(session.client_id);
            }
            if more {
                outcome.next_start_after = last_seen;
            }
            Ok(outcome.encode())
        }
    }
}

fn rejected(error: StoreRejected) -> SessionError {
    SessionError::new(code::STORE_REJECTED, error.0)
}

/// The stored record of `client_id`, or NOT_FOUND.
fn load_bytes(store: &mut impl SessionStore, client_id: &str) -> Result<Vec<u8>, SessionError> {
    store
        .get(&session_key(client_id))
        .map_err(rejected)?
        .ok_or_else(|| SessionError::new(code::NOT_FOUND, format!("no session {client_id:?}")))
}

/// The stored session of `client_id`, decoded, or NOT_FOUND.
fn load(store: &mut impl SessionStore, client_id: &str) -> Result<Session, SessionError> {
    Session::decode(&load_bytes(store, client_id)?)
}

fn check_version(session: &Session, expected: Option<u64>) -> Result<(), SessionError> {
    match expected {
        Some(expected) if expected != session.version => Err(SessionError::new(
            code::VERSION_MISMATCH,
            format!(
                "session {:?} is at version {}, not {expected}",
                session.client_id, session.version
            ),
        )),
        _ => Ok(()),
    }
}

/// Stores `session` (its fields already changed) as its next version.
fn store_changed(
    store: &mut impl SessionStore,
    mut session: Session,
    now_ms: u64,
) -> Result<Vec<u8>, SessionError> {
    session.updated_at_ms = now_ms;
    session.version += 1;
    let bytes = session.encode();
    store
        .put(&session_key(&session.client_id), &bytes)
        .map_err(rejected)?;
    Ok(bytes)
}

fn check_page_limit(field: &str, limit: u32) -> Result<(), SessionError> {
    if limit == 0 || limit > PAGE_LIMIT_MAX {
        return Err(SessionError::invalid(field, "must be 1 to 1000"));
    }
    Ok(())
}

/// The key range `[start, end)` of sessions starting with `prefix`, after `start_after`.
fn page_bounds(prefix: &str, start_after: Option<&str>) -> (Vec<u8>, Option<Vec<u8>>) {
    let prefix_key = session_key(prefix);
    let start = match start_after {
        // The smallest key greater than `start_after`'s is that key followed by a zero byte.
        Some(after) if after.as_bytes() >= prefix.as_bytes() => {
            let mut key = session_key(after);
            key.push(0);
            key
        }
        _ => prefix_key.clone(),
    };
    (start, key_successor(&prefix_key))
}

/// The smallest key greater than every key starting with `prefix`, if any.
fn key_successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}
