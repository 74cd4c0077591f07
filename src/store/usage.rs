//! [`UsageRecorder`]: batched `last_used_at` stamps. The hot path only notes
//! a key in memory ([`UsageRecorder::touch`], no await, no I/O); a background
//! task writes each noted key at most once per flush interval.
use super::SqlStore;
use crate::clock::unix_now;
use foldhash::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

/// Keys written per transaction when flushing.
const FLUSH_CHUNK: usize = 500;

/// The pause between two transactions of a background flush: 100 000 keys
/// (200 transactions) then take about 2 s of a 10 s interval.
const FLUSH_PACE: Duration = Duration::from_millis(10);

/// A stamp is written again only once it is this much newer than the one
/// this process last wrote for the key: `last_used_at` is accurate to a
/// minute (plus the flush interval). Stamping every busy key at every flush
/// would keep the store writing most of the time for no reader's gain.
pub const STAMP_GRANULARITY_SECS: i64 = 60;

/// Pending stamps: key id → latest use (unix seconds).
struct Pending {
    store: SqlStore,
    used: Mutex<HashMap<String, i64>>,
    /// Key id → the stamp this process last wrote (kept for a granule).
    written: Mutex<HashMap<String, i64>>,
}

impl Pending {
    fn used(&self) -> MutexGuard<'_, HashMap<String, i64>> {
        // Every critical section is one map operation: poison is harmless.
        self.used.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn written(&self) -> MutexGuard<'_, HashMap<String, i64>> {
        self.written.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drops the stamps less than a granule newer than the last written one,
    /// and forgets written stamps a granule old (they can filter nothing).
    fn coarsen(&self, batch: &mut Vec<(String, i64)>) {
        let mut written = self.written();
        batch.retain(|(id, at)| {
            written
                .get(id)
                .is_none_or(|w| at - w >= STAMP_GRANULARITY_SECS)
        });
        let now = unix_now();
        written.retain(|_, w| now - *w < STAMP_GRANULARITY_SECS);
    }

    /// Writes the pending stamps; with `pace`, waits that long between
    /// transactions.
    async fn flush(&self, pace: Option<Duration>) {
        let mut batch: Vec<(String, i64)> = std::mem::take(&mut *self.used()).into_iter().collect();
        self.coarsen(&mut batch);
        // In transactions of FLUSH_CHUNK keys: one transaction of every pending
        // key can outlive the store's query timeout, fail, and be retried whole
        // at every flush, holding the runtime each time.
        for (i, chunk) in batch.chunks(FLUSH_CHUNK).enumerate() {
            // The store shares the machine with the requests: back to back, a
            // large flush takes the core from them and shows in their tail
            // latency, so the transactions are paced.
            if let (Some(pace), true) = (pace, i > 0) {
                tokio::time::sleep(pace).await;
            }
            match self.store.record_key_usage(chunk).await {
                Ok(()) => self.written().extend(chunk.iter().cloned()),
                Err(e) => {
                    tracing::warn!(error = %e, keys = chunk.len(), "recording key usage failed; will retry");
                    // Put the stamps back (keeping any newer one) for the next flush.
                    let mut used = self.used();
                    for (id, at) in chunk.iter().cloned() {
                        let slot = used.entry(id).or_insert(at);
                        *slot = (*slot).max(at);
                    }
                }
            }
        }
    }
}

/// Records API key use in batches (cheap to clone; the flush task stops
/// once every clone is dropped).
#[derive(Clone)]
pub struct UsageRecorder {
    pending: Arc<Pending>,
}

impl UsageRecorder {
    /// Spawns the task that flushes every `flush_every` (needs a tokio runtime).
    pub fn new(store: SqlStore, flush_every: Duration) -> Self {
        let pending = Arc::new(Pending {
            store,
            used: Mutex::new(HashMap::default()),
            written: Mutex::new(HashMap::default()),
        });
        let weak: Weak<Pending> = Arc::downgrade(&pending);
        tokio::spawn(async move {
            let start = tokio::time::Instant::now() + flush_every;
            let mut ticker = tokio::time::interval_at(start, flush_every);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                let Some(pending) = weak.upgrade() else { break };
                pending.flush(Some(FLUSH_PACE)).await;
            }
        });
        UsageRecorder { pending }
    }

    /// Notes that `key_id` was used at `now` (unix seconds). No await, no I/O;
    /// allocates only the first time a key is seen in an interval.
    pub fn touch(&self, key_id: &str, now: i64) {
        let mut used = self.pending.used();
        match used.get_mut(key_id) {
            Some(at) => *at = (*at).max(now),
            None => {
                used.insert(key_id.to_owned(), now);
            }
        }
    }

    /// Writes every pending stamp now (tests and shutdown).
    pub async fn flush(&self) {
        self.pending.flush(None).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing::TestDb;
    use crate::store::NewApiKey;

    async fn store_with_key(db: &TestDb) -> (SqlStore, String) {
        let store = db.store().await;
        assert!(store.create_organization("acme", None).await.is_ok());
        assert!(store.create_user("alice", None).await.is_ok());
        let new = NewApiKey {
            organization_id: "acme".into(),
            user_id: "alice".into(),
            name: "ci".into(),
            scopes: vec![],
            expires_at: None,
            rate_limit: None,
            controls: Default::default(),
        };
        let Ok((_, rec)) = store.create_api_key(new).await else {
            panic!("create failed")
        };
        (store, rec.id)
    }

    async fn last_used(store: &SqlStore, id: &str) -> Option<i64> {
        store
            .get_api_key(id)
            .await
            .ok()
            .flatten()
            .and_then(|r| r.last_used_at)
    }

    #[tokio::test]
    async fn touches_coalesce_into_one_stamp_per_key() {
        let db = TestDb::sqlite();
        let (store, id) = store_with_key(&db).await;
        let rec = UsageRecorder::new(store.clone(), Duration::from_secs(3600));
        for t in [100, 300, 200] {
            rec.touch(&id, t);
        }
        assert_eq!(rec.pending.used().len(), 1);
        assert_eq!(
            last_used(&store, &id).await,
            None,
            "nothing written before a flush"
        );
        rec.flush().await;
        assert!(rec.pending.used().is_empty());
        assert_eq!(last_used(&store, &id).await, Some(300));
    }

    #[tokio::test]
    async fn a_stamp_is_rewritten_only_a_granule_later() {
        let db = TestDb::sqlite();
        let (store, id) = store_with_key(&db).await;
        let rec = UsageRecorder::new(store.clone(), Duration::from_secs(3600));
        let t0 = unix_now();
        rec.touch(&id, t0);
        rec.flush().await;
        assert_eq!(last_used(&store, &id).await, Some(t0));
        rec.touch(&id, t0 + STAMP_GRANULARITY_SECS - 1);
        rec.flush().await;
        assert_eq!(last_used(&store, &id).await, Some(t0), "within the granule");
        rec.touch(&id, t0 + STAMP_GRANULARITY_SECS);
        rec.flush().await;
        assert_eq!(
            last_used(&store, &id).await,
            Some(t0 + STAMP_GRANULARITY_SECS)
        );
    }

    #[tokio::test]
    async fn background_task_flushes_on_its_interval() {
        let db = TestDb::sqlite();
        let (store, id) = store_with_key(&db).await;
        let rec = UsageRecorder::new(store.clone(), Duration::from_millis(20));
        rec.touch(&id, 42);
        let mut written = None;
        for _ in 0..250 {
            written = last_used(&store, &id).await;
            if written.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(written, Some(42));
    }

    #[tokio::test]
    async fn failed_flush_keeps_stamps_for_the_next_one() {
        let db = TestDb::sqlite();
        let (store, id) = store_with_key(&db).await;
        let rec = UsageRecorder::new(store.clone(), Duration::from_secs(3600));
        rec.touch(&id, 7);
        store.pool.close().await;
        rec.flush().await;
        assert_eq!(rec.pending.used().get(&id), Some(&7));
    }
}
