//! The places a batch takes among the operations in progress before its body is read.
//!
//! A batch's body is the costly part of it: read and parsed, then refused for want of places,
//! it would have cost the node the most for nothing. So at the door a batch takes a place for
//! every operation its body could hold (its declared length over the smallest operation's, at
//! most `batch_max_operations`), and only as many batches read their bodies at once as the
//! node could run. Once parsed, the handler gives back what its operations do not need.

use std::sync::{Arc, Mutex};

use axum::extract::Request;
use axum::http::header;
use tokio::sync::OwnedSemaphorePermit;

use crate::AppState;
use crate::problem::Problem;

/// The batch route: its operations take places of their own.
pub(crate) const BATCH_ROUTE: &str = "/v1/sessions/batch";

/// The fewest bytes an operation takes in a batch's JSON: `{"op":"get","client_id":""}`.
pub const SMALLEST_OPERATION_BYTES: u64 = 27;

/// The most operations `request`'s body can hold: its declared `Content-Length` over the
/// smallest operation's bytes, at most `batch_max_operations` (all of them when the length is
/// not declared).
pub fn most_operations(request: &Request, batch_max_operations: usize) -> usize {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|length| length.to_str().ok())
        .and_then(|length| length.parse::<u64>().ok());
    match declared {
        Some(length) => {
            let fits = length.div_ceil(SMALLEST_OPERATION_BYTES);
            usize::try_from(fits)
                .map_or(batch_max_operations, |fits| fits.min(batch_max_operations))
        }
        None => batch_max_operations,
    }
}

/// The places a batch request holds: its own and one per operation its body could hold,
/// shared between the layer that took them (and holds them until the answer is made) and the
/// handler that fits them to the operations it found.
#[derive(Clone)]
pub struct BatchPlaces(Arc<Mutex<OwnedSemaphorePermit>>);

impl BatchPlaces {
    /// Places `permit` took: the request's own and its operations'.
    pub fn new(permit: OwnedSemaphorePermit) -> Self {
        Self(Arc::new(Mutex::new(permit)))
    }

    /// Keeps one place per operation of `operations` (besides the request's own): gives back
    /// the surplus, or takes what is missing (503 with `Retry-After` when there is none).
    pub fn fit(&self, operations: usize, state: &AppState) -> Result<(), Problem> {
        let mut permit = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let reserved = permit.num_permits().saturating_sub(1);
        if operations < reserved {
            drop(permit.split(reserved - operations));
        } else if operations > reserved {
            permit.merge(state.admit(operations - reserved)?);
        }
        Ok(())
    }

    /// Places held, the request's own included.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .num_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AppStateFields;
    use crate::routes_batch::BatchBody;
    use axum::body::Body;
    use std::time::{Duration, Instant};
    use tokio::sync::Semaphore;

    #[test]
    fn the_smallest_operation_takes_the_bytes_counted_for_it() {
        let smallest = r#"{"op":"get","client_id":""}"#;
        assert_eq!(smallest.len() as u64, SMALLEST_OPERATION_BYTES);
        let body = format!(r#"{{"operations":[{smallest},{smallest},{smallest}]}}"#);
        let parsed: BatchBody = serde_json::from_str(&body).unwrap();
        assert_eq!(parsed.operations.len(), 3);
        let request = Request::post("/v1/sessions/batch")
            .header(header::CONTENT_LENGTH, body.len())
            .body(Body::empty())
            .unwrap();
        assert!(most_operations(&request, 1000) >= 3);
    }

    #[test]
    fn the_declared_length_bounds_the_operations_up_to_the_batch_limit() {
        let with_length = |length: &str| {
            Request::post("/v1/sessions/batch")
                .header(header::CONTENT_LENGTH, length)
                .body(Body::empty())
                .unwrap()
        };
        assert_eq!(most_operations(&with_length("0"), 1000), 0);
        assert_eq!(most_operations(&with_length("27"), 1000), 1);
        assert_eq!(most_operations(&with_length("28"), 1000), 2);
        assert_eq!(most_operations(&with_length("270"), 1000), 10);
        assert_eq!(most_operations(&with_length("200000"), 1000), 1000);
        assert_eq!(most_operations(&with_length("18446744073709551615"), 7), 7);
        // Not a number, or not declared: the largest batch.
        assert_eq!(most_operations(&with_length("many"), 1000), 1000);
        let chunked = Request::post("/v1/sessions/batch")
            .body(Body::empty())
            .unwrap();
        assert_eq!(most_operations(&chunked, 1000), 1000);
    }

    #[tokio::test]
    async fn fitting_gives_back_the_surplus_and_takes_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let in_flight = Arc::new(Semaphore::new(10));
        let state = AppState::from(AppStateFields {
            engine: Arc::new(crate::test_engine::one_group_in_memory(dir.path())),
            metrics: None,
            started_at: Instant::now(),
            batch_max_operations: 5,
            request_timeout: Duration::from_secs(1),
            request_stats: Arc::default(),
            request_durations: Arc::default(),
            admin_token: None,
            in_flight: in_flight.clone(),
        });
        let places = BatchPlaces::new(in_flight.clone().try_acquire_many_owned(6).unwrap());
        places.fit(2, &state).unwrap();
        assert_eq!(places.held(), 3);
        assert_eq!(in_flight.available_permits(), 7);
        places.fit(7, &state).unwrap();
        assert_eq!(places.held(), 8);
        assert_eq!(in_flight.available_permits(), 2);
        let refused = places.fit(11, &state).unwrap_err();
        assert_eq!(refused.status, 503);
        assert_eq!(places.held(), 8, "a refusal takes nothing");
        drop(places);
        assert_eq!(in_flight.available_permits(), 10);
    }
}
