//! A range of keys for state-store scans.

use std::ops::Bound;

/// A key and its value, as returned by scans.
pub type KeyValue = (Vec<u8>, Vec<u8>);

/// A range of keys: `start` and `end` bounds in byte-wise order.
///
/// ```
/// use concord_storage::KeyRange;
///
/// let range = KeyRange::prefix(b"session/");
/// assert!(range.contains(b"session/alice"));
/// assert!(!range.contains(b"sessions"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRange {
    /// Lower bound.
    pub start: Bound<Vec<u8>>,
    /// Upper bound.
    pub end: Bound<Vec<u8>>,
}

impl KeyRange {
    /// Every key.
    pub fn all() -> Self {
        KeyRange {
            start: Bound::Unbounded,
            end: Bound::Unbounded,
        }
    }

    /// Keys in `[start, end)`.
    pub fn between(start: &[u8], end: &[u8]) -> Self {
        KeyRange {
            start: Bound::Included(start.to_vec()),
            end: Bound::Excluded(end.to_vec()),
        }
    }

    /// Keys at or after `start`.
    pub fn from(start: &[u8]) -> Self {
        KeyRange {
            start: Bound::Included(start.to_vec()),
            end: Bound::Unbounded,
        }
    }

    /// Keys in `[start, end)`, or at or after `start` when there is no `end`.
    pub fn from_until(start: &[u8], end: Option<&[u8]>) -> Self {
        match end {
            Some(end) => Self::between(start, end),
            None => Self::from(start),
        }
    }

    /// Keys that begin with `prefix`.
    pub fn prefix(prefix: &[u8]) -> Self {
        let end = match prefix_successor(prefix) {
            Some(next) => Bound::Excluded(next),
            None => Bound::Unbounded,
        };
        KeyRange {
            start: Bound::Included(prefix.to_vec()),
            end,
        }
    }

    /// The same range with its lower bound moved to just after `key` (for paging).
    pub fn after(&self, key: &[u8]) -> Self {
        KeyRange {
            start: Bound::Excluded(key.to_vec()),
            end: self.end.clone(),
        }
    }

    /// `true` when `key` lies in the range.
    pub fn contains(&self, key: &[u8]) -> bool {
        let above_start = match &self.start {
            Bound::Included(start) => key >= start.as_slice(),
            Bound::Excluded(start) => key > start.as_slice(),
            Bound::Unbounded => true,
        };
        let below_end = match &self.end {
            Bound::Included(end) => key <= end.as_slice(),
            Bound::Excluded(end) => key < end.as_slice(),
            Bound::Unbounded => true,
        };
        above_start && below_end
    }

    /// The bounds as borrowed slices, the shape `BTreeMap::range` takes.
    pub fn as_slices(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        (as_slice(&self.start), as_slice(&self.end))
    }

    /// `true` when no key can lie in the range.
    pub fn is_empty(&self) -> bool {
        match (&self.start, &self.end) {
            (Bound::Included(s), Bound::Included(e)) => s > e,
            (Bound::Included(s), Bound::Excluded(e))
            | (Bound::Excluded(s), Bound::Included(e))
            | (Bound::Excluded(s), Bound::Excluded(e)) => s >= e,
            _ => false,
        }
    }
}

fn as_slice(bound: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match bound {
        Bound::Included(key) => Bound::Included(key.as_slice()),
        Bound::Excluded(key) => Bound::Excluded(key.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// The smallest key greater than every key that starts with `prefix`, or `None` if there is
/// none (the prefix is empty or all `0xff`).
pub(crate) fn prefix_successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut next = prefix.to_vec();
    while let Some(last) = next.pop() {
        if last < u8::MAX {
            next.push(last + 1);
            return Some(next);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ranges_handle_0xff() {
        assert_eq!(prefix_successor(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_successor(&[1, 0xff]), Some(vec![2]));
        assert_eq!(prefix_successor(&[0xff, 0xff]), None);
        let range = KeyRange::prefix(&[0xff]);
        assert!(range.contains(&[0xff, 0xff, 0xff]));
        assert!(!range.contains(&[0xfe]));
    }

    #[test]
    fn emptiness() {
        assert!(KeyRange::between(b"b", b"a").is_empty());
        assert!(KeyRange::between(b"a", b"a").is_empty());
        assert!(!KeyRange::between(b"a", b"b").is_empty());
        assert!(!KeyRange::all().is_empty());
    }
}
