//! Randomness where nothing depends on its quality: the standard library's per-process
//! random hash keys, mixed with the clock, so that the crate needs no generator of its own.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// A value that differs from process to process and from call to call.
pub(crate) fn random_u64() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_nanos()),
    );
    hasher.finish()
}

/// A duration drawn evenly from `(0, span]` (microsecond steps; `span` itself when it is
/// shorter than a microsecond).
pub(crate) fn random_fraction_of(span: Duration) -> Duration {
    let span_us = span.as_micros().min(u128::from(u64::MAX)) as u64;
    if span_us == 0 {
        return span;
    }
    Duration::from_micros(1 + random_u64() % span_us)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fraction_stays_within_its_span_and_is_not_always_the_same() {
        let span = Duration::from_millis(100);
        let drawn: Vec<Duration> = (0..64).map(|_| random_fraction_of(span)).collect();
        assert!(drawn.iter().all(|d| *d > Duration::ZERO && *d <= span));
        assert!(drawn.iter().any(|d| *d != drawn[0]), "{drawn:?}");
        assert_eq!(
            random_fraction_of(Duration::from_nanos(300)),
            Duration::from_nanos(300)
        );
    }
}
