//! Session commands and the results they return, with their byte encodings.

use crate::codec::{Reader, Writer};
use crate::{Session, SessionError, SessionFields, SessionPatch};

/// Most sessions one list or expire command visits.
pub const PAGE_LIMIT_MAX: u32 = 1000;

const COMMAND_FORMAT: u8 = 1;

/// A command of the session state machine. Timestamps are the proposer's: replicas never read
/// a clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionCommand {
    /// Creates a session; fails with `ALREADY_EXISTS` if the client id is taken.
    Create {
        /// The key.
        client_id: String,
        /// The client's fields.
        fields: SessionFields,
        /// The proposer's time.
        now_ms: u64,
    },
    /// Reads a session.
    Get {
        /// The key.
        client_id: String,
    },
    /// Replaces a session's fields; keeps `created_at_ms`, bumps the version.
    Replace {
        /// The key.
        client_id: String,
        /// The new fields.
        fields: SessionFields,
        /// Fails with `VERSION_MISMATCH` unless the stored version is this one.
        expected_version: Option<u64>,
        /// The proposer's time.
        now_ms: u64,
    },
    /// Changes some fields; bumps the version.
    Update {
        /// The key.
        client_id: String,
        /// The fields to change.
        patch: SessionPatch,
        /// Fails with `VERSION_MISMATCH` unless the stored version is this one.
        expected_version: Option<u64>,
        /// The proposer's time.
        now_ms: u64,
    },
    /// Removes a session; the result is the removed session.
    Delete {
        /// The key.
        client_id: String,
        /// Fails with `VERSION_MISMATCH` unless the stored version is this one.
        expected_version: Option<u64>,
    },
    /// Sessions whose client id starts with `prefix`, in client-id order.
    List {
        /// The prefix (empty for all).
        prefix: String,
        /// Continue after this client id (the previous page's `next_start_after`).
        start_after: Option<String>,
        /// At most this many (1 to [`PAGE_LIMIT_MAX`]).
        limit: u32,
    },
    /// Removes sessions expired at `now_ms`, visiting at most `scan_limit` sessions after
    /// `start_after`.
    Expire {
        /// The proposer's time.
        now_ms: u64,
        /// Continue after this client id.
        start_after: Option<String>,
        /// At most this many sessions are examined (1 to [`PAGE_LIMIT_MAX`]).
        scan_limit: u32,
    },
}

/// The result of [`SessionCommand::List`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListPage {
    /// The sessions, in client-id order.
    pub sessions: Vec<Session>,
    /// Where the next page starts, if there may be more.
    pub next_start_after: Option<String>,
}

/// The result of [`SessionCommand::Expire`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExpireOutcome {
    /// The client ids removed.
    pub expired: Vec<String>,
    /// Where to continue, if sessions remain unexamined.
    pub next_start_after: Option<String>,
}

const OP_CREATE: u8 = 1;
const OP_GET: u8 = 2;
const OP_REPLACE: u8 = 3;
const OP_UPDATE: u8 = 4;
const OP_DELETE: u8 = 5;
const OP_LIST: u8 = 6;
const OP_EXPIRE: u8 = 7;

impl SessionCommand {
    /// The command's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u8(COMMAND_FORMAT);
        match self {
            SessionCommand::Create {
                client_id,
                fields,
                now_ms,
            } => {
                w.u8(OP_CREATE);
                w.str(client_id);
                fields.write(&mut w);
                w.u64(*now_ms);
            }
            SessionCommand::Get { client_id } => {
                w.u8(OP_GET);
                w.str(client_id);
            }
            SessionCommand::Replace {
                client_id,
                fields,
                expected_version,
                now_ms,
            } => {
                w.u8(OP_REPLACE);
                w.str(client_id);
                fields.write(&mut w);
                w.option(expected_version.as_ref(), |w, v| w.u64(*v));
                w.u64(*now_ms);
            }
            SessionCommand::Update {
                client_id,
                patch,
                expected_version,
                now_ms,
            } => {
                w.u8(OP_UPDATE);
                w.str(client_id);
                patch.write(&mut w);
                w.option(expected_version.as_ref(), |w, v| w.u64(*v));
                w.u64(*now_ms);
            }
            SessionCommand::Delete {
                client_id,
                expected_version,
            } => {
                w.u8(OP_DELETE);
                w.str(client_id);
                w.option(expected_version.as_ref(), |w, v| w.u64(*v));
            }
            SessionCommand::List {
                prefix,
                start_after,
                limit,
            } => {
                w.u8(OP_LIST);
                w.str(prefix);
                w.option(start_after.as_ref(), |w, v| w.str(v));
                w.u32(*limit);
            }
            SessionCommand::Expire {
                now_ms,
                start_after,
                scan_limit,
            } => {
                w.u8(OP_EXPIRE);
                w.u64(*now_ms);
                w.option(start_after.as_ref(), |w, v| w.str(v));
                w.u32(*scan_limit);
            }
        }
        w.finish()
    }

    /// Decodes a command, or says why it is malformed.
    pub fn decode(bytes: &[u8]) -> Result<SessionCommand, SessionError> {
        let mut r = Reader::new(bytes);
        let format = r.u8("command format")?;
        if format != COMMAND_FORMAT {
            return Err(SessionError::malformed(format!(
                "unknown command format {format}"
            )));
        }
        let command = match r.u8("operation")? {
            OP_CREATE => SessionCommand::Create {
                client_id: r.string("client_id")?,
                fields: SessionFields::read(&mut r)?,
                now_ms: r.u64("now_ms")?,
            },
            OP_GET => SessionCommand::Get {
                client_id: r.string("client_id")?,
            },
            OP_REPLACE => SessionCommand::Replace {
                client_id: r.string("client_id")?,
                fields: SessionFields::read(&mut r)?,
                expected_version: r.option("expected_version", |r| r.u64("expected_version"))?,
                now_ms: r.u64("now_ms")?,
            },
            OP_UPDATE => SessionCommand::Update {
                client_id: r.string("client_id")?,
                patch: SessionPatch::read(&mut r)?,
                expected_version: r.option("expected_version", |r| r.u64("expected_version"))?,
                now_ms: r.u64("now_ms")?,
            },
            OP_DELETE => SessionCommand::Delete {
                client_id: r.string("client_id")?,
                expected_version: r.option("expected_version", |r| r.u64("expected_version"))?,
            },
            OP_LIST => SessionCommand::List {
                prefix: r.string("prefix")?,
                start_after: r.option("start_after", |r| r.string("start_after"))?,
                limit: r.u32("limit")?,
            },
            OP_EXPIRE => SessionCommand::Expire {
                now_ms: r.u64("now_ms")?,
                start_after: r.option("start_after", |r| r.string("start_after"))?,
                scan_limit: r.u32("scan_limit")?,
            },
            op => return Err(SessionError::malformed(format!("unknown operation {op}"))),
        };
        r.finish("command")?;
        Ok(command)
    }
}

impl ListPage {
    /// The result's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u32(self.sessions.len() as u32);
        for session in &self.sessions {
            session.write(&mut w);
        }
        w.option(self.next_start_after.as_ref(), |w, v| w.str(v));
        w.finish()
    }

    /// Decodes a result.
    pub fn decode(bytes: &[u8]) -> Result<ListPage, SessionError> {
        let mut r = Reader::new(bytes);
        let count = r.u32("session count")?.min(PAGE_LIMIT_MAX);
        let mut sessions = Vec::with_capacity(count as usize);
        for _ in 0..count {
            sessions.push(Session::read(&mut r)?);
        }
        let next_start_after = r.option("next_start_after", |r| r.string("next_start_after"))?;
        r.finish("page")?;
        Ok(ListPage {
            sessions,
            next_start_after,
        })
    }
}

impl ExpireOutcome {
    /// The result's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u32(self.expired.len() as u32);
        for client_id in &self.expired {
            w.str(client_id);
        }
        w.option(self.next_start_after.as_ref(), |w, v| w.str(v));
        w.finish()
    }

    /// Decodes a result.
    pub fn decode(bytes: &[u8]) -> Result<ExpireOutcome, SessionError> {
        let mut r = Reader::new(bytes);
        let count = r.u32("expired count")?.min(PAGE_LIMIT_MAX);
        let mut expired = Vec::with_capacity(count as usize);
        for _ in 0..count {
            expired.push(r.string("client_id")?);
        }
        let next_start_after = r.option("next_start_after", |r| r.string("next_start_after"))?;
        r.finish("expire outcome")?;
        Ok(ExpireOutcome {
            expired,
            next_start_after,
        })
    }
}
