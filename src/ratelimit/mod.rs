//! Rate limiting: token buckets as GCRA, in process or shared through Redis.
//!
//! This module owns the limiter types the pipeline sees ([`RateLimiter`], [`Decision`],
//! [`Quota`], [`PolicyId`]), the rate-limit response headers, and both backends: the
//! in-process [`LocalLimiter`] and the shared [`RedisLimiter`] (on one Redis server or a
//! Redis Cluster, plain or TLS: [`RedisTarget`]). Both run the same integer
//! arithmetic (`gcra.rs`) so a client gets identical headers whichever answers.
//!
//! Policies are registered once, at build time, as a `Vec<Quota>`; the hot path refers to
//! them by index ([`PolicyId`]) and never looks a name up.

mod clock;
pub mod credits;
mod decision;
mod gcra;
mod instances;
mod limiter;
mod local;
mod nodes;
mod redis;
mod redis_target;

pub use self::clock::{Clock, ManualClock, SystemClock};
pub use self::credits::{CreditSpend, Spent};
#[cfg(test)]
pub(crate) use self::decision::tests::decision as decision_for_tests;
pub use self::decision::Decision;
pub use self::limiter::RateLimiter;
pub use self::local::LocalLimiter;
pub use self::redis::RedisLimiter;
pub use self::redis_target::RedisTarget;

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

/// One rate-limit policy: a bucket of `capacity` requests that refills completely in `period`.
///
/// GCRA terms: emission interval `T = period / capacity` (one token back every `T`), burst
/// tolerance `capacity * T`. Arithmetic is in whole nanoseconds; `T` is rounded down (at least
/// 1 ns) and the period is capped at 2^53 - 1 ns (about 104 days) so that the Redis script,
/// whose Lua numbers are doubles, computes exactly what the local limiter computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// Bucket capacity: the `X-RateLimit-Limit` value and the largest burst.
    pub capacity: NonZeroU32,
    /// Time to refill the whole bucket.
    pub period: Duration,
}

impl Quota {
    /// `capacity` requests per `period`.
    pub fn new(capacity: NonZeroU32, period: Duration) -> Self {
        Self { capacity, period }
    }
}

/// Why a shared (Redis) limiter could not answer. Cheap to clone: every decision of a
/// failed batch gets the same error.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LimiterError {
    /// The backend refused, failed or sent something unexpected.
    #[error("rate-limit backend unavailable: {0}")]
    Unavailable(#[source] Arc<::redis::RedisError>),
    /// The backend did not answer within the configured timeout.
    #[error("rate-limit backend timed out")]
    Timeout,
    /// The task sending decisions to the backend has stopped (its runtime is shutting down).
    #[error("rate-limit backend connection stopped")]
    Stopped,
    /// A [`PolicyId`] that was never registered (a programming error; treated as refusal).
    #[error("unknown rate-limit policy index {0}")]
    UnknownPolicy(usize),
    /// The Redis url or CA file cannot be used ([`RedisTarget::new`]).
    #[error("invalid Redis settings: {0}")]
    Config(#[source] Arc<::redis::RedisError>),
}

impl From<::redis::RedisError> for LimiterError {
    fn from(err: ::redis::RedisError) -> Self {
        Self::Unavailable(Arc::new(err))
    }
}

/// What the Redis-backed limiter does while Redis cannot answer (`rate_limit.on_backend_error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnBackendError {
    /// Fall back to an in-process limiter with the same policies (per instance).
    #[default]
    Local,
    /// Refuse every request (429, `Retry-After: 1`).
    Deny,
    /// Let every request through.
    Allow,
}

/// Index of a policy in the `Vec<Quota>` the limiter was built with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PolicyId(pub usize);
