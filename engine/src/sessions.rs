//! The typed session API over an engine running the session state machine.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use concord_session::{
    ExpireOutcome, KeyValue, ListPage, PAGE_LIMIT_MAX, Session, SessionCommand, SessionError,
    SessionFields, SessionPatch, SessionStore, StoreRejected, apply_command, code,
};
use concord_storage::{GroupId, KeyRange, StateStore};

use crate::{Consistency, Engine, EngineError, ProposeError};

/// Sessions one [`Sessions::expire_page`] examines at most (one proposal each, when any of them
/// has expired).
pub const EXPIRE_PAGE_SESSIONS: u32 = 1000;

/// Removals of due sessions proposed at once: enough to share log entries, few enough to
/// leave room in the proposal queue for the clients.
const REMOVALS_IN_FLIGHT: usize = 64;

/// Session CRUD on an [`Engine`] whose groups run the session logic (the bundled plugin or
/// the native twin). A session lives in the group of its client id. Writes go through the log;
/// reads run the same logic on the local state after the consistency check. Timestamps are
/// taken here, on the proposer, and travel in the command.
#[derive(Clone, Copy, Debug)]
pub struct Sessions<'e> {
    engine: &'e Engine,
}

impl<'e> Sessions<'e> {
    pub(crate) fn new(engine: &'e Engine) -> Self {
        Sessions { engine }
    }

    /// Creates a session; fails with [`crate::session_code::ALREADY_EXISTS`] if the client id has one.
    pub async fn create(
        &self,
        client_id: &str,
        fields: SessionFields,
    ) -> Result<Session, EngineError> {
        refuse_nul("client_id", client_id)?;
        refuse_nul_in_fields(&fields)?;
        let command = SessionCommand::Create {
            client_id: client_id.into(),
            fields,
            now_ms: now_ms(),
        };
        decode_session(self.write(client_id, command).await?)
    }

    /// Creates many sessions, one result per `(client_id, fields)` in the order given, each
    /// as [`Sessions::create`] would have answered it alone. The creates of one group go as
    /// one batch ([`Engine::propose_batch_to`]) and the batches of all groups at once: much
    /// cheaper per session than as many `create` calls awaited one by one. A group's batch is
    /// queued whole or refused whole: more creates for one group than its proposal queue
    /// holds are all refused ([`crate::ProposeError::Refused`]); split such inputs.
    ///
    /// ```
    /// use concord_engine::{Engine, EngineConfig, SessionFields, is_session_error, session_code};
    ///
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let dir = tempfile::tempdir()?;
    /// let engine = Engine::open(EngineConfig::new(dir.path()))?;
    /// let sessions = engine.sessions()?;
    /// sessions.create("dev/2", SessionFields::default()).await?;
    ///
    /// let created = sessions
    ///     .create_many(
    ///         ["dev/1", "dev/2", "dev/3"]
    ///             .map(|id| (id.to_string(), SessionFields::default()))
    ///             .into(),
    ///     )
    ///     .await;
    /// assert_eq!(created.len(), 3);
    /// assert!(matches!(&created[0], Ok(session) if session.version == 1));
    /// let error = created[1].as_ref().unwrap_err();
    /// assert!(is_session_error(error, session_code::ALREADY_EXISTS));
    /// assert!(created[2].is_ok());
    /// engine.shutdown()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn create_many(
        &self,
        sessions: Vec<(String, SessionFields)>,
    ) -> Vec<Result<Session, EngineError>> {
        let now_ms = now_ms();
        // Per input: its group, or why it is invalid.
        let mut inputs: Vec<Result<GroupId, EngineError>> = Vec::with_capacity(sessions.len());
        let mut commands = Vec::with_capacity(sessions.len());
        for (client_id, fields) in sessions {
            let valid =
                refuse_nul("client_id", &client_id).and_then(|()| refuse_nul_in_fields(&fields));
            if let Err(error) = valid {
                inputs.push(Err(error));
                continue;
            }
            let group = self.engine.group_of(client_id.as_bytes());
            inputs.push(Ok(group));
            let command = SessionCommand::Create {
                client_id,
                fields,
                now_ms,
            };
            commands.push((group, Bytes::from(command.encode())));
        }
        // One answer per command, in the commands' order.
        let mut answers = self.engine.propose_in_batches(commands).await.into_iter();
        inputs
            .into_iter()
            .map(|input| {
                let group = input?;
                answers
                    .next()
                    .unwrap_or(Err(EngineError::Propose(ProposeError::ResultUnknown {
                        group,
                    })))
                    .map_err(into_session_error)
                    .and_then(decode_session)
            })
            .collect()
    }

    /// The session of `client_id`; [`crate::session_code::NOT_FOUND`] if there is none.
    pub async fn get(
        &self,
        client_id: &str,
        consistency: Consistency,
    ) -> Result<Session, EngineError> {
        let group = self.engine.group_of(client_id.as_bytes());
        let command = SessionCommand::Get {
            client_id: client_id.into(),
        };
        decode_session(self.read(group, &command, consistency).await?)
    }

    /// Replaces every field; with `expected_version`, only if the session is at that version
    /// ([`crate::session_code::VERSION_MISMATCH`] otherwise).
    pub async fn replace(
        &self,
        client_id: &str,
        fields: SessionFields,
        expected_version: Option<u64>,
    ) -> Result<Session, EngineError> {
        refuse_nul_in_fields(&fields)?;
        let command = SessionCommand::Replace {
            client_id: client_id.into(),
            fields,
            expected_version,
            now_ms: now_ms(),
        };
        decode_session(self.write(client_id, command).await?)
    }

    /// Changes the fields `patch` sets.
    pub async fn update(
        &self,
        client_id: &str,
        patch: SessionPatch,
        expected_version: Option<u64>,
    ) -> Result<Session, EngineError> {
        if is_empty_patch(&patch) {
            // Nothing to change: no write, no new version; the session as it is, if it is at
            // the version expected.
            let session = self.get(client_id, Consistency::Linearizable).await?;
            if let Some(expected) = expected_version
                && expected != session.version
            {
                return Err(EngineError::Session(SessionError::new(
                    crate::session_code::VERSION_MISMATCH,
                    format!(
                        "session {:?} is at version {}, not {expected}",
                        session.client_id, session.version
                    ),
                )));
            }
            return Ok(session);
        }
        if let Some(broker_id) = &patch.broker_id {
            refuse_nul("broker_id", broker_id)?;
        }
        if let Some(Some(will)) = &patch.last_will {
            refuse_nul("last_will.topic", &will.topic)?;
        }
        let command = SessionCommand::Update {
            client_id: client_id.into(),
            patch,
            expected_version,
            now_ms: now_ms(),
        };
        decode_session(self.write(client_id, command).await?)
    }

    /// Deletes the session and returns it as it was.
    pub async fn delete(
        &self,
        client_id: &str,
        expected_version: Option<u64>,
    ) -> Result<Session, EngineError> {
        let command = SessionCommand::Delete {
            client_id: client_id.into(),
            expected_version,
        };
        decode_session(self.write(client_id, command).await?)
    }

    /// Up to `limit` sessions whose client id starts with `prefix`, after `start_after`, in
    /// client-id order across all groups. `next_start_after` continues the listing.
    pub async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: u32,
        consistency: Consistency,
    ) -> Result<ListPage, EngineError> {
        if limit > PAGE_LIMIT_MAX {
            return Err(EngineError::Session(SessionError::invalid(
                "limit",
                &format!("at most {PAGE_LIMIT_MAX}"),
            )));
        }
        let command = SessionCommand::List {
            prefix: prefix.into(),
            start_after: start_after.map(Into::into),
            limit,
        };
        // Each group answers its own first `limit`; the first `limit` of their union are the
        // first `limit` overall (a group's session that is missing would have `limit` smaller
        // ones before it in the same group).
        let mut sessions = Vec::new();
        let mut any_more = false;
        for &group in self.engine.main_group_ids() {
            let page = ListPage::decode(&self.read(group, &command, consistency).await?)
                .map_err(EngineError::BadResult)?;
            any_more |= page.next_start_after.is_some();
            sessions.extend(page.sessions);
        }
        sessions.sort_by(|a, b| a.client_id.cmp(&b.client_id));
        let more = any_more || sessions.len() > limit as usize;
        sessions.truncate(limit as usize);
        let next_start_after = if more {
            sessions.last().map(|s| s.client_id.clone())
        } else {
            None
        };
        Ok(ListPage {
            sessions,
            next_start_after,
        })
    }

    /// Deletes every session expired at `now_ms`, group by group (see [`Sessions::expire_group`]).
    /// Returns the client ids removed.
    pub async fn expire(&self, now_ms: u64) -> Result<Vec<String>, EngineError> {
        let mut expired = Vec::new();
        for &group in self.engine.main_group_ids() {
            expired.extend(self.expire_group(group, now_ms).await?);
        }
        Ok(expired)
    }

    /// Deletes the sessions of `group` expired at `now_ms` — a finite expiry interval (not 0,
    /// not never), no connection holding them (`connection_id` 0), and the interval passed
    /// since their last update — through the log, a page of at most [`EXPIRE_PAGE_SESSIONS`]
    /// sessions examined per proposal, so that every replica removes the same ones. Returns the
    /// client ids removed.
    pub async fn expire_group(
        &self,
        group: GroupId,
        now_ms: u64,
    ) -> Result<Vec<String>, EngineError> {
        let mut expired = Vec::new();
        // Each step removes or forgets every session it took: the index shrinks.
        while let Some(step) = self.expire_due(group, now_ms).await? {
            expired.extend(step.expired);
            if step.next_start_after.is_none() {
                return Ok(expired);
            }
        }
        let mut start_after: Option<String> = None;
        // Each page moves `start_after` forward through a finite key space.
        loop {
            let page = self.expire_page(group, start_after, now_ms).await?;
            expired.extend(page.expired);
            match page.next_start_after {
                Some(next) => start_after = Some(next),
                None => break,
            }
            // A page is read from the local state without waiting on anything: without a
            // yield, a scan of millions of sessions would hold its runtime thread for seconds,
            // and the requests queued behind it would wait as long.
            tokio::task::yield_now().await;
        }
        Ok(expired)
    }

    /// One page of [`Sessions::expire_group`]: examines the next (at most
    /// [`EXPIRE_PAGE_SESSIONS`]) sessions of `group` after `start_after` (from the first with `None`) and deletes, through the log,
    /// those expired at `now_ms`. Returns the client ids removed and where the next page starts
    /// (`None` once the group's last session was examined), for a scan that paces itself.
    ///
    /// ```
    /// # use concord_engine::{BackendKind, Engine, EngineConfig, SessionFields};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let mut config = EngineConfig::new(dir.path());
    /// # config.backend = Some(BackendKind::Memory);
    /// # config.groups = 1;
    /// let engine = Engine::open(config).unwrap();
    /// let sessions = engine.sessions().unwrap();
    /// let runtime = tokio::runtime::Runtime::new().unwrap();
    /// runtime.block_on(async {
    ///     let fields = SessionFields {
    ///         session_expiry_interval_secs: 1,
    ///         ..SessionFields::default()
    ///     };
    ///     sessions.create("dev/1", fields).await.unwrap();
    ///     let group = engine.group_of(b"dev/1");
    ///     // An hour later by the scan's clock, the session has expired.
    ///     let an_hour_later_ms = 3_600_000 + std::time::SystemTime::now()
    ///         .duration_since(std::time::UNIX_EPOCH)
    ///         .unwrap()
    ///         .as_millis() as u64;
    ///     let page = sessions.expire_page(group, None, an_hour_later_ms).await.unwrap();
    ///     assert_eq!(page.expired, vec!["dev/1".to_string()]);
    ///     assert_eq!(page.next_start_after, None);
    /// });
    /// ```
    pub async fn expire_page(
        &self,
        group: GroupId,
        start_after: Option<String>,
        now_ms: u64,
    ) -> Result<ExpireOutcome, EngineError> {
        // The page is looked at locally first: only a page with something to remove costs a
        // log entry, so a scan of sessions that all live writes nothing.
        let list = SessionCommand::List {
            prefix: String::new(),
            start_after: start_after.clone(),
            limit: EXPIRE_PAGE_SESSIONS,
        };
        let page = ListPage::decode(&self.read(group, &list, Consistency::Stale).await?)
            .map_err(EngineError::BadResult)?;
        if let Some(index) = self.engine.expiry_index() {
            for session in &page.sessions {
                if let Some(expiry) = session.expiry() {
                    index.learn(group, &session.client_id, expiry);
                }
            }
            index.walked_page(
                group,
                start_after.as_deref(),
                page.next_start_after.as_deref(),
            );
        }
        if !page.sessions.iter().any(|s| s.is_expired(now_ms)) {
            return Ok(ExpireOutcome {
                expired: Vec::new(),
                next_start_after: page.next_start_after,
            });
        }
        let command = SessionCommand::Expire {
            now_ms,
            start_after,
            scan_limit: EXPIRE_PAGE_SESSIONS,
        };
        let bytes = self
            .engine
            .propose_to(group, Bytes::from(command.encode()))
            .await
            .map_err(into_session_error)?;
        ExpireOutcome::decode(&bytes).map_err(EngineError::BadResult)
    }

    /// Deletes, through the log, the sessions of `group` that this node's index of expiring
    /// sessions finds due at `now_ms` — at most [`EXPIRE_PAGE_SESSIONS`] of them, earliest
    /// first — each by a delete that expects the version the index saw, so that a session
    /// written since stays. Returns the client ids removed, with `next_start_after` set (to the
    /// last one) when more may be due; or `None` while the index does not know the whole group
    /// (until a node's start has read the sessions stored before it, or since a snapshot
    /// replaced the group's data): then [`Sessions::expire_page`] walks the group's sessions,
    /// and a walk from the first page to the last makes the index whole too. A removal that
    /// fails otherwise (leadership moved, a timeout) ends the step with its error; the
    /// removals that succeeded beside it stay done.
    ///
    /// ```
    /// # use concord_engine::{BackendKind, Engine, EngineConfig, SessionFields};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let mut config = EngineConfig::new(dir.path());
    /// # config.backend = Some(BackendKind::Memory);
    /// # config.groups = 1;
    /// let engine = Engine::open(config).unwrap();
    /// let sessions = engine.sessions().unwrap();
    /// let runtime = tokio::runtime::Runtime::new().unwrap();
    /// runtime.block_on(async {
    ///     let group = engine.group_of(b"dev/1");
    ///     let now_ms = std::time::SystemTime::now()
    ///         .duration_since(std::time::UNIX_EPOCH)
    ///         .unwrap()
    ///         .as_millis() as u64;
    ///     let fields = SessionFields {
    ///         session_expiry_interval_secs: 1,
    ///         ..SessionFields::default()
    ///     };
    ///     sessions.create("dev/1", fields).await.unwrap();
    ///     // An hour later by the scan's clock, once the index knows the group (soon after the
    ///     // start: a new node has no stored sessions to read), the session is due.
    ///     let an_hour_later_ms = now_ms + 3_600_000;
    ///     let due = loop {
    ///         match sessions.expire_due(group, an_hour_later_ms).await.unwrap() {
    ///             Some(due) => break due,
    ///             None => tokio::time::sleep(std::time::Duration::from_millis(1)).await,
    ///         }
    ///     };
    ///     assert_eq!(due.expired, vec!["dev/1".to_string()]);
    /// });
    /// ```
    pub async fn expire_due(
        &self,
        group: GroupId,
        now_ms: u64,
    ) -> Result<Option<ExpireOutcome>, EngineError> {
        let Some(index) = self.engine.expiry_index() else {
            return Ok(None);
        };
        let Some(due) = index.due(group, now_ms, EXPIRE_PAGE_SESSIONS as usize) else {
            return Ok(None);
        };
        let mut outcome = ExpireOutcome::default();
        let mut failure = None;
        for chunk in due.chunks(REMOVALS_IN_FLIGHT) {
            let removals = chunk.iter().map(|session| {
                let command = SessionCommand::Delete {
                    client_id: session.client_id.to_string(),
                    expected_version: Some(session.expiry.version),
                };
                self.write(&session.client_id, command)
            });
            for (session, removed) in chunk.iter().zip(all(removals.collect()).await) {
                match removed {
                    Ok(_) => outcome.expired.push(session.client_id.to_string()),
                    // Written or removed since the index saw it: the entry was stale.
                    Err(error)
                        if is_session_error(&error, code::NOT_FOUND)
                            || is_session_error(&error, code::VERSION_MISMATCH) =>
                    {
                        index.forget(group, session);
                    }
                    Err(error) => {
                        failure.get_or_insert(error);
                    }
                }
            }
            // Leadership moved, a proposal timed out: the rest is left to the next scan.
            if let Some(error) = failure {
                return Err(error);
            }
        }
        if due.len() == EXPIRE_PAGE_SESSIONS as usize {
            outcome.next_start_after = due.last().map(|session| session.client_id.to_string());
        }
        Ok(Some(outcome))
    }

    async fn write(&self, client_id: &str, command: SessionCommand) -> Result<Bytes, EngineError> {
        self.engine
            .propose(client_id.as_bytes(), Bytes::from(command.encode()))
            .await
            .map_err(into_session_error)
    }

    /// Runs a read-only command on the group's local state once `consistency` allows.
    async fn read(
        &self,
        group: GroupId,
        command: &SessionCommand,
        consistency: Consistency,
    ) -> Result<Vec<u8>, EngineError> {
        self.engine.ready_to_read(group, consistency).await?;
        let mut store = ReadOnlyStore {
            state: self.engine.state_store(),
            group,
            failure: None,
        };
        let outcome = apply_command(&mut store, &command.encode());
        if let Some(error) = store.failure {
            return Err(EngineError::Storage(error));
        }
        outcome.map_err(EngineError::Session)
    }
}

/// MQTT forbids U+0000 in its strings (client ids, topics); a broker id follows the same rule.
/// Checked here, where commands are made, and not in the state machine, whose rules must not
/// change under entries already in logs.
fn refuse_nul(field: &str, value: &str) -> Result<(), EngineError> {
    if value.contains('\0') {
        return Err(EngineError::Session(SessionError::invalid(
            field,
            "must not contain U+0000",
        )));
    }
    Ok(())
}

fn refuse_nul_in_fields(fields: &SessionFields) -> Result<(), EngineError> {
    refuse_nul("broker_id", &fields.broker_id)?;
    if let Some(will) = &fields.last_will {
        refuse_nul("last_will.topic", &will.topic)?;
    }
    Ok(())
}

fn is_empty_patch(patch: &SessionPatch) -> bool {
    let SessionPatch {
        session_expiry_interval_secs,
        clean_start,
        last_will,
        broker_id,
        connection_id,
    } = patch;
    session_expiry_interval_secs.is_none()
        && clean_start.is_none()
        && last_will.is_none()
        && broker_id.is_none()
        && connection_id.is_none()
}

/// A session command's failure reads as a [`SessionError`]; the wasm host's fault codes stay
/// command errors.
fn into_session_error(error: EngineError) -> EngineError {
    match error {
        EngineError::Command { code, message } if code < concord_plugins::FAULT_CODE_BASE => {
            EngineError::Session(SessionError::new(code, message))
        }
        other => other,
    }
}

fn decode_session(bytes: impl AsRef<[u8]>) -> Result<Session, EngineError> {
    Session::decode(bytes.as_ref()).map_err(EngineError::BadResult)
}

/// Milliseconds since the Unix epoch on this (the proposing) node.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The group's applied state, for commands that only read.
struct ReadOnlyStore<'s> {
    state: &'s dyn StateStore,
    group: GroupId,
    failure: Option<concord_storage::StorageError>,
}

impl ReadOnlyStore<'_> {
    fn failed(&mut self, error: concord_storage::StorageError) -> StoreRejected {
        self.failure = Some(error);
        StoreRejected("the state store failed".into())
    }
}

impl SessionStore for ReadOnlyStore<'_> {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreRejected> {
        self.state.get(self.group, key).map_err(|e| self.failed(e))
    }

    fn put(&mut self, _key: &[u8], _value: &[u8]) -> Result<(), StoreRejected> {
        Err(StoreRejected("a read does not write".into()))
    }

    fn delete(&mut self, _key: &[u8]) -> Result<(), StoreRejected> {
        Err(StoreRejected("a read does not write".into()))
    }

    fn scan(
        &mut self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: u32,
    ) -> Result<Vec<KeyValue>, StoreRejected> {
        let range = KeyRange::from_until(start, end);
        self.state
            .scan(self.group, &range, limit as usize)
            .map_err(|e| self.failed(e))
    }
}

/// Runs `futures` together; their outputs in order.
async fn all<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut pending: Vec<std::pin::Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|context| {
        let mut finished = true;
        for (future, output) in pending.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(context) {
                    std::task::Poll::Ready(value) => *output = Some(value),
                    std::task::Poll::Pending => finished = false,
                }
            }
        }
        if finished {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

/// Whether `error` is the session error `code` (see [`crate::session_code`]).
pub fn is_session_error(error: &EngineError, session_code: u32) -> bool {
    matches!(error, EngineError::Session(e) if e.code == session_code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use concord_session::code;

    #[test]
    fn host_faults_stay_command_errors() {
        let fault = into_session_error(EngineError::Command {
            code: 1000,
            message: "fuel".into(),
        });
        assert!(matches!(fault, EngineError::Command { code: 1000, .. }));
        let session = into_session_error(EngineError::Command {
            code: code::NOT_FOUND,
            message: "no".into(),
        });
        assert!(is_session_error(&session, code::NOT_FOUND));
    }

    fn one_group(dir: &std::path::Path, backend: crate::BackendKind) -> Engine {
        let mut config = crate::EngineConfig::new(dir);
        config.backend = Some(backend);
        config.groups = 1;
        Engine::open(config).unwrap()
    }

    fn expiring(connection_id: u64) -> SessionFields {
        SessionFields {
            session_expiry_interval_secs: 60,
            connection_id,
            ..SessionFields::default()
        }
    }

    const HOUR_MS: u64 = 3_600_000;

    /// Waits until the index knows `group` whole, and removes what is due at `now_ms`.
    async fn due_once_known(sessions: &Sessions<'_>, group: GroupId, now_ms: u64) -> Vec<String> {
        let started = std::time::Instant::now();
        loop {
            if let Some(step) = sessions.expire_due(group, now_ms).await.unwrap() {
                let mut expired = step.expired;
                expired.sort();
                return expired;
            }
            assert!(
                started.elapsed() < std::time::Duration::from_secs(20),
                "never complete"
            );
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_due_sessions_go_and_a_restart_reads_the_stored_ones_back() {
        let dir = tempfile::tempdir().unwrap();
        let engine = one_group(dir.path(), crate::BackendKind::Wal);
        let sessions = engine.sessions().unwrap();
        let now = now_ms();
        assert!(due_once_known(&sessions, 0, now).await.is_empty());
        sessions.create("expires", expiring(0)).await.unwrap();
        sessions.create("connected", expiring(7)).await.unwrap();
        let never = SessionFields {
            session_expiry_interval_secs: concord_session::NEVER_EXPIRES,
            ..SessionFields::default()
        };
        sessions.create("never", never).await.unwrap();
        sessions.create("reconnects", expiring(0)).await.unwrap();
        let patch = SessionPatch {
            connection_id: Some(9),
            ..SessionPatch::default()
        };
        sessions.update("reconnects", patch, None).await.unwrap();
        let disconnect = SessionPatch {
            connection_id: Some(0),
            ..SessionPatch::default()
        };
        sessions
            .update("connected", disconnect, None)
            .await
            .unwrap();
        assert!(due_once_known(&sessions, 0, now).await.is_empty());
        assert_eq!(
            due_once_known(&sessions, 0, now + HOUR_MS).await,
            ["connected", "expires"]
        );
        for gone in ["connected", "expires"] {
            let error = sessions.get(gone, Consistency::Stale).await.unwrap_err();
            assert!(is_session_error(&error, code::NOT_FOUND), "{gone}");
        }
        sessions
            .get("reconnects", Consistency::Stale)
            .await
            .unwrap();
        sessions.get("never", Consistency::Stale).await.unwrap();
        sessions.create("stored", expiring(0)).await.unwrap();
        // A clean stop flushes the state: the next start replays no entry, and only reading
        // the stored sessions finds this one.
        engine.shutdown().expect("the engine stops");
        drop(engine);

        let engine = one_group(dir.path(), crate::BackendKind::Wal);
        let sessions = engine.sessions().unwrap();
        let later = now_ms() + HOUR_MS;
        assert_eq!(due_once_known(&sessions, 0, later).await, ["stored"]);
        assert!(due_once_known(&sessions, 0, later).await.is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_group_whose_data_was_replaced_is_walked_back_into_the_index() {
        let dir = tempfile::tempdir().unwrap();
        let engine = one_group(dir.path(), crate::BackendKind::Memory);
        let sessions = engine.sessions().unwrap();
        let now = now_ms();
        due_once_known(&sessions, 0, now).await;
        sessions.create("a", expiring(0)).await.unwrap();
        // As a snapshot's install does.
        engine.expiry_index().unwrap().replaced(0);
        assert!(
            sessions
                .expire_due(0, now + HOUR_MS)
                .await
                .unwrap()
                .is_none()
        );
        let walked = sessions.expire_page(0, None, now).await.unwrap();
        assert!(walked.expired.is_empty() && walked.next_start_after.is_none());
        assert_eq!(due_once_known(&sessions, 0, now + HOUR_MS).await, ["a"]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stale_entry_removes_nothing_and_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let engine = one_group(dir.path(), crate::BackendKind::Memory);
        let sessions = engine.sessions().unwrap();
        let now = now_ms();
        due_once_known(&sessions, 0, now).await;
        let created = sessions.create("dev", expiring(0)).await.unwrap();
        let seen = created.expiry().unwrap();
        let patch = SessionPatch {
            connection_id: Some(3),
            ..SessionPatch::default()
        };
        sessions.update("dev", patch, None).await.unwrap();
        // As a walk that read the page before the update would have it.
        let index = engine.expiry_index().unwrap();
        index.learn(0, "dev", seen);
        let step = sessions
            .expire_due(0, now + HOUR_MS)
            .await
            .unwrap()
            .unwrap();
        assert!(step.expired.is_empty());
        assert_eq!(
            sessions
                .get("dev", Consistency::Stale)
                .await
                .unwrap()
                .version,
            2
        );
        assert_eq!(index.due(0, u64::MAX, 10), Some(Vec::new()), "dropped");
    }
}
