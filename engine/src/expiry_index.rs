//! Which sessions of each main group can expire, and when: this node's own index, kept from the
//! writes its apply commits (`expiry_tracking_store.rs`), so that a session expiry scan takes
//! the sessions that are due instead of reading every session of the group.
//!
//! The index is a hint, never the authority. Its entries name the version of the session they
//! were taken from, and a session is removed by a `Delete` through the log that expects that
//! version: if the session changed or went since, the delete is refused on every replica alike
//! and the entry is dropped. So an entry that is stale (taken by a walk from a page read just
//! before a write) costs one refused proposal when it comes due, and nothing is lost or removed
//! wrongly.
//!
//! A group's index is *complete* once every session stored before the index started recording
//! was read into it; the writes applied since are in it already. At a node's start a thread
//! reads each main group from one consistent view of its state (`expiry_index_builder.rs`).
//! Until a group is complete — while that thread has not reached it, or after a snapshot
//! replaced the group's data — a scan walks the group's sessions page by page (the scan as it
//! was before the index, `Sessions::expire_page`), and a walk that went from the first page to
//! the last completes it too. The index holds at most [`MAX_INDEXED_SESSIONS`] entries
//! on a node; a group that would take it past that is no longer indexed, and its scans walk it.

use std::collections::{BTreeSet, HashMap};
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

use concord_session::SessionExpiry;
use concord_storage::GroupId;

/// Sessions the index of one node holds at most (each costs about 150 bytes).
pub const MAX_INDEXED_SESSIONS: usize = 1 << 20;

/// Where a session's key starts in its group's key space (`concord_session::session_key`).
const SESSION_KEY_PREFIX: &[u8] = b"s/";

/// A session the index found due, and the version it saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DueSession {
    /// The client id.
    pub client_id: Arc<str>,
    /// When it expires and the version it expires at.
    pub expiry: SessionExpiry,
}

/// The index of every main group of a node.
#[derive(Debug)]
pub(crate) struct ExpiryIndex {
    main_groups: Range<GroupId>,
    max_entries: usize,
    groups: Mutex<IndexedGroups>,
}

#[derive(Debug, Default)]
struct IndexedGroups {
    by_group: HashMap<GroupId, GroupExpiries>,
    /// Entries over every group.
    entries: usize,
}

#[derive(Debug, Default)]
struct GroupExpiries {
    by_deadline: BTreeSet<(u64, Arc<str>)>,
    of_session: HashMap<Arc<str>, SessionExpiry>,
    /// A walk saw every session since the node started or the group's data was replaced.
    complete: bool,
    /// The last client id of the last page of a walk that started at the first session and
    /// has missed no page since.
    walked_through: Option<Box<str>>,
    /// The node's cap was reached: the group is walked, not indexed, until the node restarts.
    overflowed: bool,
    /// Counts the times the group's data was replaced: a build that read the data before a
    /// replacement completes nothing.
    epoch: u64,
}

impl GroupExpiries {
    fn remove(&mut self, client_id: &str) -> bool {
        match self.of_session.remove_entry(client_id) {
            Some((id, expiry)) => {
                self.by_deadline.remove(&(expiry.expires_at_ms, id));
                true
            }
            None => false,
        }
    }
}

/// What a committed write means for a session's place in the index.
pub(crate) enum SessionWrite<'a> {
    /// The session may expire (at the time it gives).
    Expires(&'a str, SessionExpiry),
    /// The session cannot expire as it stands, or is gone.
    Stays(&'a str),
}

impl<'a> SessionWrite<'a> {
    /// What a write of `key` (`None`: deleted) means, or `None` for a key that is not a
    /// session's. A value that does not decode as a session is one that cannot expire.
    pub(crate) fn of(key: &'a [u8], value: Option<&[u8]>) -> Option<SessionWrite<'a>> {
        let client_id = std::str::from_utf8(key.strip_prefix(SESSION_KEY_PREFIX)?).ok()?;
        let expiry = value.and_then(|record| concord_session::expiry_of_record(record).ok()?);
        Some(match expiry {
            Some(expiry) => SessionWrite::Expires(client_id, expiry),
            None => SessionWrite::Stays(client_id),
        })
    }
}

impl ExpiryIndex {
    /// An index of the groups in `main_groups`, none of them complete.
    pub(crate) fn new(main_groups: Range<GroupId>) -> Self {
        Self::with_cap(main_groups, MAX_INDEXED_SESSIONS)
    }

    /// The same, holding at most `max_entries`.
    fn with_cap(main_groups: Range<GroupId>, max_entries: usize) -> Self {
        ExpiryIndex {
            main_groups,
            max_entries,
            groups: Mutex::new(IndexedGroups::default()),
        }
    }

    /// Whether `group` runs the session logic here.
    pub(crate) fn covers(&self, group: GroupId) -> bool {
        self.main_groups.contains(&group)
    }

    fn lock(&self) -> MutexGuard<'_, IndexedGroups> {
        // The index holds no invariant a panic elsewhere could break halfway that a later
        // walk would not mend: a poisoned lock is taken as it is.
        self.groups
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records the writes one commit of `group` applied.
    pub(crate) fn record<'a>(
        &self,
        group: GroupId,
        writes: impl Iterator<Item = SessionWrite<'a>>,
    ) {
        // A commit without a session write (a group's plugin record) takes no lock.
        let mut writes = writes.peekable();
        if writes.peek().is_none() {
            return;
        }
        let mut groups = self.lock();
        let IndexedGroups { by_group, entries } = &mut *groups;
        let index = by_group.entry(group).or_default();
        if index.overflowed {
            return;
        }
        for write in writes {
            match write {
                SessionWrite::Stays(client_id) => {
                    if !index.of_session.is_empty() && index.remove(client_id) {
                        *entries -= 1;
                    }
                }
                SessionWrite::Expires(client_id, expiry) => {
                    if index.remove(client_id) {
                        *entries -= 1;
                    }
                    if !self.add(index, entries, group, client_id, expiry) {
                        return;
                    }
                }
            }
        }
    }

    /// Records what a walk read of `client_id` (which may be older than what apply recorded
    /// since: the apply's record stays).
    pub(crate) fn learn(&self, group: GroupId, client_id: &str, expiry: SessionExpiry) {
        let mut groups = self.lock();
        let IndexedGroups { by_group, entries } = &mut *groups;
        let index = by_group.entry(group).or_default();
        if index.overflowed || index.of_session.contains_key(client_id) {
            return;
        }
        self.add(index, entries, group, client_id, expiry);
    }

    /// Adds an entry for a session `index` holds none for; past the node's cap, stops indexing
    /// the group instead and returns `false`.
    fn add(
        &self,
        index: &mut GroupExpiries,
        entries: &mut usize,
        group: GroupId,
        client_id: &str,
        expiry: SessionExpiry,
    ) -> bool {
        if *entries >= self.max_entries {
            overflow(index, entries, group);
            return false;
        }
        let id: Arc<str> = Arc::from(client_id);
        index.by_deadline.insert((expiry.expires_at_ms, id.clone()));
        index.of_session.insert(id, expiry);
        *entries += 1;
        true
    }

    /// A walk read the page of `group`'s sessions after `start_after` (`None`: from the first),
    /// which ended at `next_start_after` (`None`: the last session). A walk that went from the
    /// first session to the last without missing a page completes the group's index.
    pub(crate) fn walked_page(
        &self,
        group: GroupId,
        start_after: Option<&str>,
        next_start_after: Option<&str>,
    ) {
        let mut groups = self.lock();
        let index = groups.by_group.entry(group).or_default();
        let continues = match start_after {
            None => true,
            Some(after) => index.walked_through.as_deref() == Some(after),
        };
        index.walked_through = None;
        if !continues {
            return;
        }
        match next_start_after {
            Some(next) => index.walked_through = Some(next.into()),
            None => index.complete = !index.overflowed,
        }
    }

    /// The main groups.
    pub(crate) fn main_groups(&self) -> Range<GroupId> {
        self.main_groups.clone()
    }

    /// A build of `group` starts reading its data: the epoch to give [`ExpiryIndex::built`].
    pub(crate) fn build_started(&self, group: GroupId) -> u64 {
        self.lock().by_group.entry(group).or_default().epoch
    }

    /// A build that started at `epoch` read every session of `group`.
    pub(crate) fn built(&self, group: GroupId, epoch: u64) {
        let mut groups = self.lock();
        let index = groups.by_group.entry(group).or_default();
        if index.epoch == epoch {
            index.complete = !index.overflowed;
        }
    }

    /// `group`'s data was replaced (a snapshot installed): forget it until a walk.
    pub(crate) fn replaced(&self, group: GroupId) {
        let mut groups = self.lock();
        let IndexedGroups { by_group, entries } = &mut *groups;
        let index = by_group.entry(group).or_default();
        *entries -= index.of_session.len();
        *index = GroupExpiries {
            overflowed: index.overflowed,
            epoch: index.epoch + 1,
            ..GroupExpiries::default()
        };
    }

    /// Up to `limit` sessions of `group` due at `now_ms`, earliest first; `None` while the
    /// index of the group is not complete (the scan must walk it).
    pub(crate) fn due(&self, group: GroupId, now_ms: u64, limit: usize) -> Option<Vec<DueSession>> {
        let groups = self.lock();
        let index = groups.by_group.get(&group)?;
        if !index.complete {
            return None;
        }
        Some(
            index
                .by_deadline
                .iter()
                .take_while(|(at, _)| *at <= now_ms)
                .take(limit)
                .filter_map(|(_, id)| {
                    Some(DueSession {
                        client_id: id.clone(),
                        expiry: *index.of_session.get(id)?,
                    })
                })
                .collect(),
        )
    }

    /// Drops `due` if the index still holds it as it was (a removal that did not take place:
    /// the session changed or went since).
    pub(crate) fn forget(&self, group: GroupId, due: &DueSession) {
        let mut groups = self.lock();
        let IndexedGroups { by_group, entries } = &mut *groups;
        let Some(index) = by_group.get_mut(&group) else {
            return;
        };
        if index.of_session.get(&*due.client_id) == Some(&due.expiry) {
            index.remove(&due.client_id);
            *entries -= 1;
        }
    }

    /// Sessions indexed on this node.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().entries
    }
}

fn overflow(index: &mut GroupExpiries, entries: &mut usize, group: GroupId) {
    *entries -= index.of_session.len();
    *index = GroupExpiries {
        overflowed: true,
        epoch: index.epoch,
        ..GroupExpiries::default()
    };
    tracing::warn!(
        group,
        "the node's index of expiring sessions is full: this group's expiry scans read every session"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expiry(expires_at_ms: u64, version: u64) -> SessionExpiry {
        SessionExpiry {
            expires_at_ms,
            version,
        }
    }

    fn ids(due: Option<Vec<DueSession>>) -> Option<Vec<String>> {
        due.map(|due| due.iter().map(|d| d.client_id.to_string()).collect())
    }

    #[test]
    fn a_group_answers_only_once_walked_and_then_earliest_first() {
        let index = ExpiryIndex::new(0..4);
        index.record(
            1,
            [
                SessionWrite::Expires("late", expiry(300, 1)),
                SessionWrite::Expires("early", expiry(100, 1)),
                SessionWrite::Expires("gone", expiry(50, 1)),
            ]
            .into_iter(),
        );
        assert_eq!(index.due(1, 1000, 10), None, "not walked yet");
        index.learn(1, "walked", expiry(200, 4));
        // A walk's older read does not replace what apply recorded.
        index.learn(1, "late", expiry(10, 0));
        index.walked_page(1, None, Some("m"));
        assert_eq!(index.due(1, 1000, 10), None, "halfway");
        index.walked_page(1, Some("m"), None);
        index.record(1, [SessionWrite::Stays("gone")].into_iter());
        assert_eq!(
            ids(index.due(1, 250, 10)),
            Some(vec!["early".into(), "walked".into()])
        );
        assert_eq!(ids(index.due(1, 1000, 1)), Some(vec!["early".into()]));
        // A session rewritten with a later deadline moves.
        index.record(
            1,
            [SessionWrite::Expires("early", expiry(900, 2))].into_iter(),
        );
        assert_eq!(
            ids(index.due(1, 899, 10)),
            Some(vec!["walked".into(), "late".into()])
        );
        assert_eq!(index.len(), 3);
    }

    #[test]
    fn forgetting_drops_an_entry_only_as_it_was_seen() {
        let index = ExpiryIndex::new(0..1);
        index.record(0, [SessionWrite::Expires("a", expiry(10, 1))].into_iter());
        index.walked_page(0, None, None);
        let seen = index.due(0, 10, 10).unwrap().remove(0);
        // Rewritten meanwhile: the newer entry stays.
        index.record(0, [SessionWrite::Expires("a", expiry(20, 2))].into_iter());
        index.forget(0, &seen);
        assert_eq!(index.len(), 1);
        let newer = index.due(0, 20, 10).unwrap().remove(0);
        index.forget(0, &newer);
        assert_eq!(index.len(), 0);
        assert_eq!(index.due(0, u64::MAX, 10), Some(Vec::new()));
    }

    #[test]
    fn a_walk_that_missed_a_page_completes_nothing() {
        let index = ExpiryIndex::new(0..1);
        index.walked_page(0, None, Some("c"));
        index.walked_page(0, Some("f"), None);
        assert_eq!(index.due(0, 10, 10), None);
        // Nor does one that did not start at the first session.
        index.walked_page(0, Some("c"), None);
        assert_eq!(index.due(0, 10, 10), None);
        index.walked_page(0, None, Some("c"));
        index.replaced(0);
        index.walked_page(0, Some("c"), None);
        assert_eq!(
            index.due(0, 10, 10),
            None,
            "the data changed under the walk"
        );
        index.walked_page(0, None, None);
        assert_eq!(index.due(0, 10, 10), Some(Vec::new()));
    }

    #[test]
    fn replaced_data_is_walked_again() {
        let index = ExpiryIndex::new(0..2);
        index.record(0, [SessionWrite::Expires("a", expiry(10, 1))].into_iter());
        index.record(1, [SessionWrite::Expires("b", expiry(10, 1))].into_iter());
        index.walked_page(0, None, None);
        index.walked_page(1, None, None);
        index.replaced(0);
        assert_eq!(index.due(0, 10, 10), None);
        assert_eq!(ids(index.due(1, 10, 10)), Some(vec!["b".into()]));
        assert_eq!(index.len(), 1);
    }

    #[test]
    fn a_group_past_the_cap_is_walked_from_then_on() {
        let index = ExpiryIndex::with_cap(0..2, 3);
        index.record(0, [SessionWrite::Expires("a", expiry(10, 1))].into_iter());
        index.walked_page(0, None, None);
        index.record(
            1,
            (0..3).map(|n| SessionWrite::Expires(["x", "y", "z"][n], expiry(10, 1))),
        );
        index.walked_page(1, None, None);
        assert_eq!(index.due(1, 10, 10), None, "over the cap: walked");
        assert_eq!(index.len(), 1, "its entries were let go");
        index.learn(1, "w", expiry(10, 1));
        assert_eq!(index.len(), 1);
        assert_eq!(ids(index.due(0, 10, 10)), Some(vec!["a".into()]));
    }

    #[test]
    fn a_build_completes_a_group_unless_its_data_was_replaced_meanwhile() {
        let index = ExpiryIndex::new(0..2);
        let epoch = index.build_started(0);
        index.replaced(0);
        index.built(0, epoch);
        assert_eq!(index.due(0, 10, 10), None);
        let epoch = index.build_started(1);
        index.built(1, epoch);
        assert_eq!(index.due(1, 10, 10), Some(Vec::new()));
    }

    #[test]
    fn only_session_keys_are_writes_of_sessions() {
        assert!(SessionWrite::of(b"plugin", Some(b"x")).is_none());
        assert!(SessionWrite::of(b"s/\xff", None).is_none());
        assert!(matches!(
            SessionWrite::of(b"s/a", Some(b"not a session")),
            Some(SessionWrite::Stays("a"))
        ));
        assert!(matches!(
            SessionWrite::of(b"s/a", None),
            Some(SessionWrite::Stays("a"))
        ));
    }
}
