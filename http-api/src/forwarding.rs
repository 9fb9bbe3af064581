//! `Concord-Forward`: whether a request may be forwarded to the leader of its key's group.
//!
//! By default any member takes any request: a follower forwards writes and linearizable reads
//! to the leader and answers with the result. A client that routes by itself (to save the
//! extra hop) sends `Concord-Forward: false`; a member that does not lead the key's group
//! then answers 421 naming the leader and its URL instead.

use std::num::NonZeroU64;

use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::request::Parts;

use crate::AppState;
use crate::problem::{Problem, kind};

/// The request header, `true` (the default) or `false`.
pub const HEADER: &str = "concord-forward";

/// What the request's `Concord-Forward` header allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forwarding {
    /// Any member answers; a follower forwards to the leader.
    Allowed,
    /// Only the leader of the key's group answers; others say 421.
    LeaderOnly,
}

impl Forwarding {
    /// `Ok` if this member may answer a request for `key`: forwarding is allowed, or this
    /// member leads the key's group. The 421 problem naming the leader otherwise.
    pub fn check(self, state: &AppState, key: &[u8]) -> Result<(), Problem> {
        if self == Forwarding::Allowed {
            return Ok(());
        }
        self.check_group(state, state.engine.group_of(key))
    }

    /// `Ok` if this member may answer a request for `group` (see [`Forwarding::check`]).
    pub fn check_group(self, state: &AppState, group: u64) -> Result<(), Problem> {
        if self == Forwarding::Allowed {
            return Ok(());
        }
        let status = state.engine.group_status(group)?;
        if status.is_leader {
            return Ok(());
        }
        Err(misdirected(state, group, status.leader))
    }
}

/// 421 for a request about `group` sent to a member that does not lead it, naming the leader
/// (`leader`, 0 if none is known) and its URL when the leader told it.
pub fn misdirected(state: &AppState, group: u64, leader: u64) -> Problem {
    let leader = NonZeroU64::new(leader);
    let leader_url = leader.and_then(|id| state.engine.client_urls().remove(&id.get()));
    let detail = match (leader, &leader_url) {
        (Some(id), Some(url)) => format!("node {id} leads group {group}, at {url}"),
        (Some(id), None) => format!("node {id} leads group {group}"),
        (None, _) => format!("group {group} has no leader now"),
    };
    Problem {
        leader,
        leader_url: leader_url.map(Box::from),
        retry_after_secs: leader.is_none().then_some(1),
        ..Problem::new(StatusCode::MISDIRECTED_REQUEST, kind::NOT_LEADER, detail)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Forwarding {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Problem> {
        let Some(value) = parts.headers.get(HEADER) else {
            return Ok(Forwarding::Allowed);
        };
        match value
            .to_str()
            .map(|v| v.trim().to_ascii_lowercase())
            .as_deref()
        {
            Ok("true") => Ok(Forwarding::Allowed),
            Ok("false") => Ok(Forwarding::LeaderOnly),
            _ => Err(Problem::invalid_field(
                "Concord-Forward",
                "must be true (any member answers) or false (only the leader answers)",
            )),
        }
    }
}
