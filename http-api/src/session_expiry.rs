//! The node's part in ending sessions: on every scan, it removes the expired sessions of the
//! groups it leads, through the log (each replica removes the same ones, by the leader's
//! clock). Followers leave their groups to their leaders, so a session is not examined once per
//! member.
//!
//! A scan takes the sessions due from the node's index of expiring sessions
//! (`Sessions::expire_due`), so an idle node, or one whose sessions are all connected, reads
//! nothing. Until the index knows a group whole (after a start, or a snapshot installed), the
//! scan walks every session of the group instead, which makes it whole; a walk is paced rather
//! than run flat out, at most `SESSIONS_EXAMINED_PER_SEC` a second: a node with more sessions
//! than that rate times the interval takes longer than one interval to go round (a session
//! expires that much later), but a walk never takes more than a small, fixed share of the HTTP
//! thread it runs on from the requests.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use concord_engine::{EXPIRE_PAGE_SESSIONS, Engine};
use tokio::time::MissedTickBehavior;

/// Sessions a scan examines per second at most.
const SESSIONS_EXAMINED_PER_SEC: u64 = 50_000;
/// Sessions one step of a scan examines at most (`Sessions::expire_page`).
const SESSIONS_PER_PAGE: u64 = EXPIRE_PAGE_SESSIONS as u64;

/// The pause after each page of a scan that has more to examine.
fn pause_between_pages() -> Duration {
    Duration::from_secs(1) * SESSIONS_PER_PAGE as u32 / SESSIONS_EXAMINED_PER_SEC as u32
}

/// Runs a scan every `every` (or right after the last one, when a scan takes longer) until
/// the task is dropped (with the HTTP threads).
pub(crate) async fn run_scans(engine: Arc<Engine>, every: Duration) {
    let removed = metrics::counter!("concord_sessions_expired_total");
    let mut interval = tokio::time::interval(every);
    interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
    interval.tick().await;
    loop {
        interval.tick().await;
        let Ok(sessions) = engine.sessions() else {
            return;
        };
        for &group in engine.main_group_ids() {
            // The sessions due, while this node's index knows the group whole; else a walk over
            // every session (from where the last page ended), until the index knows it.
            let mut walked_to: Option<String> = None;
            loop {
                let leads = engine
                    .group_status(group)
                    .is_ok_and(|status| status.is_leader && status.stopped.is_none());
                if !leads {
                    break;
                }
                // One clock reading per page: a session that expires during a long scan is
                // found by this page or the next scan.
                let now = now_ms();
                let (step, walking) = match sessions.expire_due(group, now).await {
                    Ok(Some(due)) => (Ok(due), false),
                    Ok(None) => (
                        sessions.expire_page(group, walked_to.take(), now).await,
                        true,
                    ),
                    Err(error) => (Err(error), false),
                };
                let more = match step {
                    Ok(step) => {
                        removed.increment(step.expired.len() as u64);
                        if walking {
                            walked_to = step.next_start_after.clone();
                        }
                        step.next_start_after.is_some()
                    }
                    // Leadership moved, the node stops, a proposal timed out: the next scan
                    // (here or on the new leader) finds what this one left.
                    Err(error) => {
                        tracing::debug!(group, %error, "a session expiry scan stopped");
                        false
                    }
                };
                if !more {
                    break;
                }
                tokio::time::sleep(pause_between_pages()).await;
            }
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use concord_engine::SessionFields;

    use crate::test_engine::one_group_in_memory;

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_scan_goes_through_its_pages_no_faster_than_its_rate() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Arc::new(one_group_in_memory(dir.path()));
        let sessions = engine.sessions().unwrap();
        // Five pages of sessions that expire a second after they are made.
        let count = 5 * SESSIONS_PER_PAGE as usize;
        let fields = SessionFields {
            session_expiry_interval_secs: 1,
            ..SessionFields::default()
        };
        for n in 0..count {
            sessions
                .create(&format!("s/{n:05}"), fields.clone())
                .await
                .unwrap();
        }
        let last = format!("s/{:05}", count - 1);
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let started = Instant::now();
        let scans = tokio::spawn(run_scans(engine.clone(), Duration::from_millis(1)));
        while sessions
            .get(&last, concord_engine::Consistency::Stale)
            .await
            .is_ok()
        {
            assert!(started.elapsed() < Duration::from_secs(20), "never expired");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let took = started.elapsed();
        scans.abort();
        // Four pauses at least between the five pages.
        assert!(
            took >= 4 * pause_between_pages(),
            "{count} sessions examined in {took:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_scan_takes_the_sessions_due_and_leaves_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Arc::new(one_group_in_memory(dir.path()));
        let sessions = engine.sessions().unwrap();
        let connected = SessionFields {
            session_expiry_interval_secs: 1,
            connection_id: 1,
            ..SessionFields::default()
        };
        sessions.create("connected", connected).await.unwrap();
        let scans = tokio::spawn(run_scans(engine.clone(), Duration::from_millis(1)));
        let started = Instant::now();
        while sessions.expire_due(0, now_ms()).await.unwrap().is_none() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "never known whole"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let fields = SessionFields {
            session_expiry_interval_secs: 1,
            ..SessionFields::default()
        };
        sessions.create("leaves", fields).await.unwrap();
        while sessions
            .get("leaves", concord_engine::Consistency::Stale)
            .await
            .is_ok()
        {
            assert!(started.elapsed() < Duration::from_secs(20), "never expired");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        scans.abort();
        sessions
            .get("connected", concord_engine::Consistency::Stale)
            .await
            .unwrap();
    }
}
