//! The node's part in ending sessions: on every scan, it removes the expired sessions of the
//! groups it leads, through the log (each replica removes the same ones, by the leader's
//! clock). Followers leave their groups to their leaders, so a session is not examined once per
//! member.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use concord_engine::Engine;
use tokio::time::MissedTickBehavior;

/// Runs a scan every `every` until the task is dropped (with the HTTP runtime).
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
            let leads = engine
                .group_status(group)
                .is_ok_and(|status| status.is_leader && status.stopped.is_none());
            if !leads {
                continue;
            }
            match sessions.expire_group(group, now_ms()).await {
                Ok(expired) => removed.increment(expired.len() as u64),
                // Leadership moved, the node stops, a proposal timed out: the next scan
                // (here or on the new leader) finds what this one left.
                Err(error) => tracing::debug!(group, %error, "a session expiry scan stopped"),
            }
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64)
}
