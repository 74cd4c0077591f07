//! What a cache invalidation touches: which cached values a [`Change`] makes
//! wrong ([`Cached`]), and the numbered log of recent invalidations that a
//! load racing one checks before it caches its answer ([`ChangeLog`]).
use crate::store::{CachedApiKey, Change, SessionAuth};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Invalidations remembered for racing loads; older ones count as "changed".
pub(super) const RECENT_CHANGES: usize = 1024;

/// Locks `m`, recovering from poisoning (the guarded data stays consistent:
/// every critical section is a single map or queue operation).
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What a cached value needs to know to be invalidated.
pub(super) trait Cached: Send + Sync + 'static {
    /// True when `change` may make this value wrong.
    fn affected_by(&self, change: &Change) -> bool;
}

impl Cached for CachedApiKey {
    fn affected_by(&self, change: &Change) -> bool {
        CachedApiKey::affected_by(self, change)
    }
}

impl Cached for SessionAuth {
    fn affected_by(&self, change: &Change) -> bool {
        match change {
            Change::Session { id } => self.session.id == *id,
            Change::Member { user_id, .. } => self.session.user_id == *user_id,
            Change::OrgLimits { organization_id } => self.role_in(organization_id).is_some(),
            Change::ApiKey { .. } => false,
            Change::All => true,
        }
    }
}

/// Recent invalidations, numbered, so a load can ask "did anything that
/// touches my answer happen since I started?".
#[derive(Default)]
pub(super) struct ChangeLog {
    epoch: AtomicU64,
    recent: Mutex<VecDeque<(u64, Change)>>,
}

impl ChangeLog {
    /// The number of the latest invalidation.
    pub(super) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Remembers `change` (called before the entries are dropped).
    pub(super) fn record(&self, change: &Change) {
        let mut recent = lock(&self.recent);
        let epoch = self.epoch.fetch_add(1, Ordering::AcqRel) + 1;
        recent.push_back((epoch, change.clone()));
        if recent.len() > RECENT_CHANGES {
            recent.pop_front();
        }
    }

    /// True if an invalidation after `start` matches `affects`, or if too
    /// many happened to tell.
    pub(super) fn changed_since(&self, start: u64, affects: impl Fn(&Change) -> bool) -> bool {
        if self.epoch() == start {
            return false;
        }
        let recent = lock(&self.recent);
        match recent.front() {
            Some((oldest, _)) if *oldest > start + 1 => true,
            _ => recent
                .iter()
                .any(|(epoch, change)| *epoch > start && affects(change)),
        }
    }
}
