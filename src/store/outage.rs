//! A key store that cannot answer, as the answer a request gets.
use super::StoreError;
use crate::error::GatewayError;
use crate::metrics::names;

/// The key store's failures, as requests refused for them.
static STORE_INCIDENT: crate::logging::Incident = crate::logging::Incident::new();

/// A store that cannot answer is never a 401: the client's key may be fine.
/// Logged as one incident: a line when it begins, then a count per summary
/// interval. No recovery line: watching the store's answers would cost
/// every lookup, cached ones included; a failure after a quiet interval
/// begins a new incident.
pub fn unavailable(e: StoreError) -> GatewayError {
    metrics::counter!(names::STORE_ERRORS).increment(1);
    if let Some(line) = STORE_INCIDENT.failed(crate::logging::now_ms()) {
        let cause = crate::logging::Chain(&e);
        line.log(
            tracing::Level::WARN,
            &"key store",
            "requests refused",
            &cause,
        );
    }
    GatewayError::ServiceUnavailable {
        what: "the key store".into(),
        retry_after: 1,
    }
}
