//! A value alone on its cache lines.

use std::ops::Deref;

/// Keeps `T` on 128 bytes of its own (two 64-byte lines: x86 prefetches lines in adjacent
/// pairs), so that a thread writing it does not invalidate the line other threads read
/// something else from. Used where one thread writes an atomic every round while callers on
/// other cores read its neighbours on every proposal.
#[repr(align(128))]
pub(crate) struct CachePadded<T>(T);

impl<T> CachePadded<T> {
    pub(crate) const fn new(value: T) -> Self {
        CachePadded(value)
    }
}

impl<T> Deref for CachePadded<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use super::*;

    #[test]
    fn two_padded_values_never_share_a_line() {
        let pair = [
            CachePadded::new(AtomicU64::new(1)),
            CachePadded::new(AtomicU64::new(2)),
        ];
        let first = &*pair[0] as *const AtomicU64 as usize;
        let second = &*pair[1] as *const AtomicU64 as usize;
        assert!(second - first >= 128);
        assert_eq!(first % 128, 0);
    }
}
