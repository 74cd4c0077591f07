//! Telling "the server refuses connections" from "the pool is busy".
//!
//! sqlx's pool takes a refused connect for a server that is still starting
//! and retries it, with backoff, until the acquire deadline
//! (`store.query_timeout`). A PostgreSQL that refuses connects in a
//! millisecond would so hold every query that needs a new connection for the
//! whole timeout. An acquire still pending after [`CHECK_AFTER`] (a pooled
//! connection takes microseconds, a new one a few milliseconds) is therefore
//! raced against one direct connection attempt, which the pool does not
//! retry: if the server refuses it, the acquire fails at once, and if the
//! server does not complete it within half the query timeout (packets
//! dropped, a server that accepts and never answers) it fails then, as
//! unreachable rather than slow. Every waiting acquire shares one attempt and
//! its outcome for [`REUSE`], so a busy pool costs the server at most one
//! extra connection per [`REUSE`]. A failed attempt fails only the acquires
//! that were already waiting when it ended: one that begins later (the store
//! may be back by then) makes an attempt of its own.
use crate::store::StoreError;
use sqlx::any::AnyConnectOptions;
use sqlx::{AnyConnection, Connection};
use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// An acquire this slow may be stuck retrying a refused connect.
pub(super) const CHECK_AFTER: Duration = Duration::from_millis(20);
/// A direct attempt's outcome is shared this long by every waiting acquire.
pub(super) const REUSE: Duration = Duration::from_millis(100);

/// The shared direct connection attempt (one per pool).
#[derive(Default)]
pub(super) struct ConnectCheck {
    /// The last attempt's outcome and when it finished.
    last: Mutex<Option<(Instant, Result<(), StoreError>)>>,
    /// Held while an attempt runs: concurrent acquires wait for its outcome.
    running: tokio::sync::Mutex<()>,
}

impl ConnectCheck {
    /// Waits for `acquire` (a pool acquire, or anything that starts with
    /// one), failing early with [`StoreError::Unreachable`] when a direct
    /// connection fails meanwhile. `deadline` is the query timeout; an
    /// attempt gets half of it.
    pub(super) async fn acquire<T>(
        &self,
        opts: &AnyConnectOptions,
        deadline: Duration,
        acquire: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, StoreError> {
        let began = Instant::now();
        let mut acquire = pin!(acquire);
        if let Ok(done) = tokio::time::timeout(CHECK_AFTER, &mut acquire).await {
            return done.map_err(super::error::from_sqlx);
        }
        tokio::select! {
            done = &mut acquire => done.map_err(super::error::from_sqlx),
            refused = self.refused(opts, deadline, began) => Err(refused),
        }
    }

    /// Resolves only once a direct attempt that ended after `began` fails;
    /// while the server accepts, tries again every [`REUSE`].
    async fn refused(
        &self,
        opts: &AnyConnectOptions,
        deadline: Duration,
        began: Instant,
    ) -> StoreError {
        loop {
            if let Err(e) = self.attempt(opts, deadline, began).await {
                return e;
            }
            tokio::time::sleep(REUSE).await;
        }
    }

    /// One direct connection (opened and closed), or the outcome of one
    /// that finished less than [`REUSE`] ago (a failure: after `began`).
    async fn attempt(
        &self,
        opts: &AnyConnectOptions,
        deadline: Duration,
        began: Instant,
    ) -> Result<(), StoreError> {
        if let Some(outcome) = self.recent(began) {
            return outcome;
        }
        let _one = self.running.lock().await;
        if let Some(outcome) = self.recent(began) {
            return outcome;
        }
        let connect = async { AnyConnection::connect_with(opts).await?.close().await };
        let outcome = match tokio::time::timeout(deadline / 2, connect).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(StoreError::Unreachable(Arc::new(e))),
            Err(_) => Err(StoreError::Unreachable(Arc::new(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "connect not completed within half the query timeout",
            )))),
        };
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((Instant::now(), outcome.clone()));
        outcome
    }

    /// The last outcome, if it is less than [`REUSE`] old and, for a
    /// failure, ended after `began`: an acquire that began after a refusal
    /// may be meeting a server that is back.
    fn recent(&self, began: Instant) -> Option<Result<(), StoreError>> {
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.as_ref()
            .filter(|(at, outcome)| at.elapsed() < REUSE && (outcome.is_ok() || *at >= began))
            .map(|(_, outcome)| outcome.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_with(outcome: Result<(), StoreError>) -> ConnectCheck {
        let check = ConnectCheck::default();
        *check.last.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), outcome));
        check
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_fails_only_the_acquires_already_waiting_for_it() {
        let refused = StoreError::Unreachable(Arc::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        let waiting = Instant::now();
        tokio::time::advance(Duration::from_millis(1)).await;
        let check = check_with(Err(refused));
        assert!(matches!(check.recent(waiting), Some(Err(_))));
        // An acquire begun after the refusal (the store may be back) tries itself.
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(check.recent(Instant::now()).is_none());
        // Past REUSE, no one shares it.
        tokio::time::advance(REUSE).await;
        assert!(check.recent(waiting).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_success_is_shared_by_every_acquire_for_reuse() {
        let check = check_with(Ok(()));
        tokio::time::advance(Duration::from_millis(50)).await;
        assert!(matches!(check.recent(Instant::now()), Some(Ok(()))));
        tokio::time::advance(REUSE).await;
        assert!(check.recent(Instant::now()).is_none());
    }
}
