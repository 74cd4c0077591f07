//! sqlx's errors as [`StoreError`]s: which mean the store is unreachable,
//! which that it timed out, which that it answered with an error.
use super::StoreError;
use std::sync::Arc;

/// Any driver/database failure: the store is unusable for this request.
/// A connection that could not be made or was lost is
/// [`StoreError::Unreachable`] (the cache's circuit breaker opens at once),
/// no pooled connection within the deadline is [`StoreError::Timeout`], and
/// an error the server answered with is [`StoreError::Unavailable`].
pub(super) fn unavailable(e: sqlx::Error) -> StoreError {
    use sqlx::Error as E;
    let lost = match &e {
        E::Io(_) | E::Tls(_) | E::Protocol(_) | E::PoolClosed | E::WorkerCrashed => true,
        // Class 08: connection exception; 57P0x: the server shutting down
        // or not yet accepting connections.
        E::Database(db) => db
            .code()
            .is_some_and(|c| c.starts_with("08") || c.starts_with("57P")),
        E::PoolTimedOut => return StoreError::Timeout,
        _ => false,
    };
    if lost {
        StoreError::Unreachable(Arc::new(e))
    } else {
        StoreError::Unavailable(Arc::new(e))
    }
}

/// `map_err(unavailable)` with less noise.
pub(super) trait Db<T> {
    /// Maps a sqlx error to [`StoreError::Unavailable`].
    fn db(self) -> Result<T, StoreError>;
}

impl<T> Db<T> for Result<T, sqlx::Error> {
    fn db(self) -> Result<T, StoreError> {
        self.map_err(unavailable)
    }
}
