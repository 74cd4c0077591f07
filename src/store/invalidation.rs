//! Keeps a [`CachedKeyStore`] honest across processes: a task follows the
//! store's change log (written in the same transaction as every revoke,
//! delete, role change and session removal) and invalidates what each change
//! touches. It polls every `poll`; on PostgreSQL it also `LISTEN`s, so a
//! change lands at once and the poll is the safety net. Store errors are
//! logged and retried; nothing is missed because the follower resumes from
//! the last sequence number it applied. On PostgreSQL sequence numbers can
//! commit out of order, and the follower only re-reads [`PG_LOOKBACK_SECS`]
//! back; so after a gap of [`GAP_CLEAR`] without a successful read (the store
//! was unreachable) it also clears the whole cache, since a late commit may
//! have slipped past.
//!
//! The same task keeps the log bounded: every [`PRUNE_EVERY`] it deletes
//! records older than [`CHANGE_RETENTION`] (on a task of its own, so a slow
//! prune never delays an invalidation). A follower whose cursor is below the
//! pruning horizon (it was stopped, paused or cut off for longer than the
//! retention) cannot know what the pruned records touched, and clears its
//! whole cache.
use super::sql::changes::ChangeRead;
use super::sql::schema::NOTIFY_CHANNEL;
use super::{CachedKeyStore, Change, SqlStore, StoreError, CHANGE_RETENTION};
use crate::clock::unix_now;
use crate::logging::{now_ms, Chain, Incident};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::task::AbortOnDropHandle;
use tracing::Level;

/// PostgreSQL may commit sequence numbers out of order; changes this recent
/// (seconds) are re-read and applied if not seen yet.
const PG_LOOKBACK_SECS: i64 = 10;
/// A gap this long between successful reads clears the cache (PostgreSQL).
const GAP_CLEAR: Duration = Duration::from_secs(5);
/// Pause before reconnecting a lost `LISTEN` connection.
const LISTEN_RETRY: Duration = Duration::from_secs(1);
/// How often each gateway prunes the change log (the first run at start).
/// With several gateways on one PostgreSQL one of them prunes per run.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// Where the follower reads changes from (the store; a fake in tests).
#[async_trait::async_trait]
trait ChangeSource: Send + Sync {
    /// The highest sequence number logged so far.
    async fn latest(&self) -> Result<i64, StoreError>;
    /// Changes after `seq` or logged at/after `recent_at`, with their seq,
    /// then the pruning horizon (read after them).
    async fn after(&self, seq: i64, recent_at: i64) -> Result<ChangeRead, StoreError>;
    /// How far back (seconds) to re-read; None: sequence order is commit order.
    fn lookback(&self) -> Option<i64>;
}

#[async_trait::async_trait]
impl ChangeSource for SqlStore {
    async fn latest(&self) -> Result<i64, StoreError> {
        self.latest_change_seq().await
    }

    async fn after(&self, seq: i64, recent_at: i64) -> Result<ChangeRead, StoreError> {
        self.changes_after(seq, recent_at).await
    }

    fn lookback(&self) -> Option<i64> {
        (self.backend() == "postgres").then_some(PG_LOOKBACK_SECS)
    }
}

/// Follows the change log: remembers the highest applied seq and, inside
/// the lookback window, which seqs were applied.
#[derive(Default)]
struct Follower {
    high: Option<i64>,
    /// Applied seq → unix time it was applied (pruned after the window).
    seen: HashMap<i64, i64>,
    /// When the change log was last read successfully.
    last_ok: Option<std::time::Instant>,
}

/// Where the change log stood before anything was cached: its highest seq
/// and the changes recent enough to be re-read (PostgreSQL's lookback).
/// Anything loaded afterwards already reflects them, so a follower starting
/// here neither clears the cache nor applies them again.
pub struct LogStart {
    high: i64,
    recent: Vec<i64>,
}

/// Reads where `store`'s change log stands (see [`LogStart`]); at start,
/// before the gateway serves.
pub async fn log_start(store: &SqlStore) -> Result<LogStart, StoreError> {
    read_start(store).await
}

async fn read_start(src: &dyn ChangeSource) -> Result<LogStart, StoreError> {
    let high = src.latest().await?;
    let Some(secs) = src.lookback() else {
        return Ok(LogStart {
            high,
            recent: Vec::new(),
        });
    };
    let read = src.after(high, unix_now() - secs).await?;
    let recent: Vec<i64> = read.changes.iter().map(|(seq, _)| *seq).collect();
    Ok(LogStart {
        high: recent.iter().copied().fold(high, i64::max),
        recent,
    })
}

impl Follower {
    /// A follower that applies what is logged after `start`; `None`: see
    /// [`Self::poll`].
    fn starting_at(start: Option<LogStart>) -> Self {
        let Some(start) = start else {
            return Self::default();
        };
        let now = unix_now();
        Self {
            high: Some(start.high),
            seen: start.recent.into_iter().map(|seq| (seq, now)).collect(),
            last_ok: Some(std::time::Instant::now()),
        }
    }

    /// Reads new changes and invalidates what they touch.
    async fn poll(
        &mut self,
        src: &dyn ChangeSource,
        cache: &CachedKeyStore,
    ) -> Result<(), StoreError> {
        let Some(high) = self.high else {
            let latest = src.latest().await?;
            // Entries cached before we knew where the log stood may predate
            // a change we will never read: start clean.
            cache.invalidate(&Change::All);
            self.high = Some(latest);
            self.last_ok = Some(std::time::Instant::now());
            return Ok(());
        };
        let now = unix_now();
        let recent_at = src.lookback().map_or(i64::MAX, |secs| now - secs);
        let mut new_high = high;
        let read = src.after(high, recent_at).await?;
        let gap = self.last_ok.map(|at| at.elapsed());
        self.last_ok = Some(std::time::Instant::now());
        if src.lookback().is_some() && gap.is_some_and(|gap| gap >= GAP_CLEAR) {
            // Changes that committed late during the gap may be out of reach.
            cache.invalidate(&Change::All);
            metrics::counter!(crate::metrics::names::CACHE_CLEARS, "reason" => "store_gap")
                .increment(1);
            tracing::info!(
                gap_ms = gap.map_or(0, |g| g.as_millis() as u64),
                "change log unread for a while; cache cleared"
            );
        }
        if read.pruned_through > high {
            // Records this follower never read were pruned: what they
            // touched is unknown, so nothing cached may be trusted.
            cache.invalidate(&Change::All);
            metrics::counter!(crate::metrics::names::CACHE_CLEARS, "reason" => "change_log_pruned")
                .increment(1);
            new_high = read.pruned_through;
            tracing::info!(
                cursor = high,
                pruned_through = read.pruned_through,
                "change log pruned past this gateway's position; cache cleared"
            );
        }
        for (seq, change) in read.changes {
            if self.seen.contains_key(&seq) || (seq <= high && src.lookback().is_none()) {
                continue;
            }
            cache.invalidate(&change);
            tracing::debug!(seq, ?change, "cache invalidated");
            if src.lookback().is_some() {
                self.seen.insert(seq, now);
            }
            new_high = new_high.max(seq);
        }
        self.high = Some(new_high);
        if let Some(secs) = src.lookback() {
            self.seen.retain(|_, at| *at >= now - 2 * secs);
        }
        Ok(())
    }
}

/// Spawns the task that applies the store's change log to `cache` every
/// `poll` (and, on PostgreSQL, whenever a `NOTIFY` arrives) and prunes the
/// log every [`PRUNE_EVERY`]. Runs until aborted.
///
/// `start` is where the log stood before anything was cached ([`log_start`]):
/// the follower applies what comes after it and keeps what is cached.
/// Without it the first poll reads the position and clears the cache, since
/// an entry cached before may predate a change it will never read.
pub fn spawn_invalidation(
    store: SqlStore,
    cache: CachedKeyStore,
    poll: Duration,
    start: Option<LogStart>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let wake = Arc::new(Notify::new());
        let _listener = (store.backend() == "postgres").then(|| {
            AbortOnDropHandle::new(tokio::spawn(listen(
                store.url().to_owned(),
                Arc::clone(&wake),
            )))
        });
        let _pruner = AbortOnDropHandle::new(tokio::spawn(prune(store.clone())));
        let mut ticker = tokio::time::interval(poll);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut follower = Follower::starting_at(start);
        // A store outage fails every poll: one line when reads begin to
        // fail, a count per summary interval, one when they succeed again.
        let failing = Incident::new();
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = wake.notified() => {}
            }
            match follower.poll(&store, &cache).await {
                Ok(()) => {
                    if let Some(end) = failing.recovered(now_ms()) {
                        end.log(Level::INFO, &"change log", "reads failed");
                    }
                }
                Err(e) => {
                    if let Some(line) = failing.failed(now_ms()) {
                        line.log(Level::WARN, &"change log", "reads failed", &Chain(&e));
                    }
                }
            }
        }
    })
}

/// Deletes change records older than [`CHANGE_RETENTION`] every
/// [`PRUNE_EVERY`], starting at once. Errors are logged and retried next run.
async fn prune(store: SqlStore) {
    let retention = i64::try_from(CHANGE_RETENTION.as_secs()).unwrap_or(i64::MAX);
    let mut ticker = tokio::time::interval(PRUNE_EVERY);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        match store
            .prune_changes(unix_now().saturating_sub(retention))
            .await
        {
            Ok(0) => {}
            Ok(records) => {
                metrics::counter!(crate::metrics::names::CHANGES_PRUNED).increment(records);
                tracing::debug!(records, "change log pruned");
            }
            Err(e) => tracing::warn!(error = %e, "pruning the change log failed; retrying later"),
        }
    }
}

/// `LISTEN`s on the change channel and wakes the poller on every
/// notification. When the connection drops (notifications sent meanwhile are
/// lost) it reconnects, subscribes again and wakes the poller to catch up.
async fn listen(url: String, wake: Arc<Notify>) {
    loop {
        match sqlx::postgres::PgListener::connect(&url).await {
            Ok(mut listener) => match listener.listen(NOTIFY_CHANNEL).await {
                Ok(()) => {
                    // Catch up on anything sent while we were not listening.
                    wake.notify_one();
                    loop {
                        // `try_recv` reports a lost connection as `None`
                        // instead of reconnecting silently.
                        match listener.try_recv().await {
                            Ok(Some(_)) => wake.notify_one(),
                            Ok(None) => {
                                tracing::warn!("change listener lost; reconnecting");
                                break;
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "change listener lost; reconnecting");
                                break;
                            }
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "LISTEN failed; retrying"),
            },
            Err(e) => tracing::warn!(error = %e, "change listener cannot connect; retrying"),
        }
        wake.notify_one();
        tokio::time::sleep(LISTEN_RETRY).await;
    }
}

#[cfg(test)]
mod tests;
