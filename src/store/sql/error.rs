//! sqlx's errors as [`StoreError`]s: which mean the store is unreachable,
//! which that it timed out, which that it answered with an error; and
//! [`StoreError::explain`], the cause in an operator's words.
use crate::store::StoreError;
use std::sync::Arc;

/// A sqlx error as a [`StoreError`]: the store is unusable for this request.
/// A connection that could not be made or was lost is
/// [`StoreError::Unreachable`] (the cache's circuit breaker opens at once),
/// no pooled connection within the deadline is [`StoreError::Timeout`], and
/// an error the server answered with is [`StoreError::Unavailable`].
pub(super) fn from_sqlx(e: sqlx::Error) -> StoreError {
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

/// `map_err(from_sqlx)` with less noise.
pub(super) trait Db<T> {
    /// Maps a sqlx error to [`StoreError::Unavailable`].
    fn db(self) -> Result<T, StoreError>;
}

impl<T> Db<T> for Result<T, sqlx::Error> {
    fn db(self) -> Result<T, StoreError> {
        self.map_err(from_sqlx)
    }
}

impl StoreError {
    /// Whether waiting could cure it: the server refused, dropped or did not
    /// answer connections, or is starting up. Not a refusal by the server
    /// (a wrong password, a missing database) or by TLS (a certificate
    /// that does not verify): those need an operator.
    pub fn store_is_down(&self) -> bool {
        let source = match self {
            StoreError::Timeout => return true,
            StoreError::Unreachable(e) | StoreError::Unavailable(e) => e,
            _ => return false,
        };
        match source.downcast_ref::<sqlx::Error>() {
            Some(sqlx::Error::Io(io)) => io_is_down(io),
            Some(sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed) => true,
            Some(sqlx::Error::Database(db)) => db
                .code()
                .is_some_and(|c| c.starts_with("08") || c.starts_with("57P")),
            Some(_) => false,
            // Our own connect check's timeout, or the pool's.
            None => source
                .downcast_ref::<std::io::Error>()
                .is_some_and(io_is_down),
        }
    }

    /// What went wrong, cause first, for an operator reading a start-up or
    /// admin command failure: a database that does not exist, a refused
    /// login, a refused connection, rather than "unavailable". The source
    /// holds the server's own words (never a password: PostgreSQL's messages
    /// name the role and database, not the secret).
    pub fn explain(&self) -> String {
        let source = match self {
            StoreError::Unreachable(e) | StoreError::Unavailable(e) => e,
            StoreError::Timeout => {
                return "no answer from the store within store.query_timeout".to_owned()
            }
            StoreError::NotFound(_) | StoreError::Conflict(_) | StoreError::Invalid(_) => {
                return self.to_string()
            }
        };
        if let Some(e) = source.downcast_ref::<sqlx::Error>() {
            if let Some(text) = explain_sqlx(e) {
                return text;
            }
        } else if let Some(e) = source.downcast_ref::<std::io::Error>() {
            return explain_io(e);
        }
        crate::logging::Chain(self).to_string()
    }
}

/// An I/O error of a connection that a later attempt may not meet: not a
/// TLS refusal (sqlx reports a certificate that does not verify as I/O).
fn io_is_down(e: &std::io::Error) -> bool {
    use std::io::ErrorKind as K;
    let tls = e
        .get_ref()
        .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some());
    !tls && !matches!(
        e.kind(),
        K::InvalidData | K::PermissionDenied | K::InvalidInput
    )
}

/// The cause of a sqlx error in an operator's words, when it is one they
/// can act on.
fn explain_sqlx(e: &sqlx::Error) -> Option<String> {
    use sqlx::Error as E;
    Some(match e {
        E::Database(db) => {
            let code = db.code().unwrap_or_default();
            let message = db.message();
            match &*code {
                // invalid_catalog_name
                "3D000" => format!(
                    "PostgreSQL refused the connection: {message} \
                     (create the database, or fix the database name in store.url)"
                ),
                // invalid_authorization_specification, invalid_password
                "28000" | "28P01" => format!(
                    "PostgreSQL refused the login: {message} \
                     (check the user and password in store.url)"
                ),
                // insufficient_privilege
                "42501" => format!("PostgreSQL refused: {message} (grant the store's role access)"),
                "" => format!("the store answered with an error: {message}"),
                _ => format!("the store answered with an error: {message} (code {code})"),
            }
        }
        E::Io(io) => explain_io(io),
        E::Tls(tls) => format!("TLS with the store failed: {tls}"),
        E::Configuration(c) => format!("store.url: {c}"),
        E::PoolTimedOut => StoreError::Timeout.explain(),
        _ => return None,
    })
}

/// A failed connect in an operator's words.
fn explain_io(e: &std::io::Error) -> String {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::ConnectionRefused => {
            "connection refused: nothing listens at the store's address (is PostgreSQL \
             running, and are the host and port in store.url right?)"
                .to_owned()
        }
        K::TimedOut => format!("no answer from the store's address: {e}"),
        K::NotFound => format!("cannot connect to the store: {e} (is the host name right?)"),
        _ => format!("cannot connect to the store: {e}"),
    }
}
