//! [`Breaker`]: the circuit breaker in front of the store, shared by both
//! cache tiers (it is one store). Closed, lookups that are not fresh hits go
//! to the store. Open, none does: a stale entry inside `stale_if_error` is
//! served at once and anything else is refused at once (503), while one
//! background probe ([`KeyStore::ping`]) asks the store every
//! [`PROBE_EVERY`] (half-open while it runs); the first probe that succeeds
//! closes it.
//!
//! It opens on the first failure that says the store cannot be reached
//! ([`StoreError::Unreachable`]: a connect refused or failed, a connection
//! lost), or after [`OPEN_AFTER_FAILURES`] timeouts or server errors in a row
//! with no success between them: one slow query never opens it. A breaker
//! that opens again within [`FLAP_WINDOW`] of closing waits twice as long
//! before its first probe (up to [`MAX_HOLD`]), so a store that answers
//! pings but fails lookups does not flap it, and its log, many times a
//! second. One line is logged when it opens and one when it closes.
//!
//! A failure counts only if its lookup began after the breaker last closed
//! ([`Breaker::epoch`]): a lookup still waiting on a connect from the outage
//! that ends in an error once a probe has found the store again says
//! nothing of the store now, and must not open it again.
//!
//! The per-request cost is one atomic load, and only for lookups that are
//! not fresh hits.
use crate::metrics::names;
use crate::store::{KeyStore, StoreError};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Timeouts or server errors in a row (no success between) that open it.
pub(crate) const OPEN_AFTER_FAILURES: u32 = 3;
/// Open, the store is probed this often.
pub(crate) const PROBE_EVERY: Duration = Duration::from_millis(50);
/// Reopening this soon after closing doubles the wait before the first probe.
const FLAP_WINDOW: Duration = Duration::from_secs(1);
/// The longest wait before the first probe of a flapping breaker.
const MAX_HOLD: Duration = Duration::from_secs(5);

const CLOSED: u8 = 0;
const OPEN: u8 = 1;
const HALF_OPEN: u8 = 2;

/// Why a lookup was refused without asking the store.
#[derive(Debug, thiserror::Error)]
#[error("circuit open after a store failure; probing")]
pub(crate) struct CircuitOpen;

/// The store's circuit breaker.
pub(super) struct Breaker {
    /// [`CLOSED`], [`OPEN`] or [`HALF_OPEN`].
    state: AtomicU8,
    /// Timeouts and server errors since the last success.
    failures: AtomicU32,
    /// How many times it has closed: a lookup's failure counts only if none
    /// happened since the lookup began.
    closings: AtomicU64,
    /// `true` while open or half-open; loads waiting on the store watch it.
    open_tx: watch::Sender<bool>,
    /// What the probe pings.
    store: Arc<dyn KeyStore>,
    /// When it last closed, and the wait before the first probe of the next
    /// opening.
    history: Mutex<History>,
}

struct History {
    closed_at: Option<Instant>,
    hold: Duration,
}

impl Breaker {
    /// A closed breaker that probes `store` while open.
    pub(super) fn new(store: Arc<dyn KeyStore>) -> Arc<Self> {
        metrics::gauge!(names::STORE_BREAKER_OPEN).set(0.0);
        Arc::new(Breaker {
            state: AtomicU8::new(CLOSED),
            failures: AtomicU32::new(0),
            closings: AtomicU64::new(0),
            open_tx: watch::Sender::new(false),
            store,
            history: Mutex::new(History {
                closed_at: None,
                hold: PROBE_EVERY,
            }),
        })
    }

    /// True while open or half-open: lookups must not wait on the store.
    pub(super) fn is_open(&self) -> bool {
        self.state.load(Ordering::Acquire) != CLOSED
    }

    /// Resolves once the breaker is open (at once if it is).
    pub(super) async fn opened(&self) {
        let mut open = self.open_tx.subscribe();
        // The sender lives as long as `self`: the wait cannot fail.
        let _ = open.wait_for(|open| *open).await;
    }

    /// A lookup got an answer from the store.
    pub(super) fn succeeded(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
    }

    /// Taken when a lookup begins, and given back with its failure.
    pub(super) fn epoch(&self) -> u64 {
        self.closings.load(Ordering::Acquire)
    }

    /// A lookup begun at `epoch` failed with `e` (only store-down errors
    /// count, and only if the breaker has not closed since it began).
    pub(super) fn failed(self: &Arc<Self>, e: &StoreError, epoch: u64) {
        if self.closings.load(Ordering::Acquire) != epoch {
            return;
        }
        let open_now = match e {
            StoreError::Unreachable(_) => true,
            StoreError::Timeout | StoreError::Unavailable(_) => {
                self.failures.fetch_add(1, Ordering::Relaxed) + 1 >= OPEN_AFTER_FAILURES
            }
            StoreError::NotFound(_) | StoreError::Conflict(_) | StoreError::Invalid(_) => false,
        };
        if open_now {
            self.open(e);
        }
    }

    /// Closed → open, logged once, and the probe started.
    fn open(self: &Arc<Self>, cause: &StoreError) {
        if self
            .state
            .compare_exchange(CLOSED, OPEN, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        let hold = {
            let mut h = self.history.lock().unwrap_or_else(|e| e.into_inner());
            let flapping = h.closed_at.is_some_and(|at| at.elapsed() < FLAP_WINDOW);
            h.hold = if flapping {
                (h.hold * 2).min(MAX_HOLD)
            } else {
                PROBE_EVERY
            };
            h.hold
        };
        self.open_tx.send_replace(true);
        metrics::gauge!(names::STORE_BREAKER_OPEN).set(1.0);
        metrics::counter!(names::STORE_BREAKER_TRANSITIONS, "to" => "open").increment(1);
        tracing::warn!(
            error = %cause,
            cause = %source_of(cause),
            probe_ms = PROBE_EVERY.as_millis() as u64,
            first_probe_ms = hold.as_millis() as u64,
            "key store circuit open: cached entries served, other lookups refused, store probed in the background"
        );
        let breaker = Arc::clone(self);
        tokio::spawn(async move { breaker.probe(hold).await });
    }

    /// Pings the store every [`PROBE_EVERY`] (the first after `hold`) until
    /// a ping succeeds, then closes.
    async fn probe(self: Arc<Self>, hold: Duration) {
        let opened_at = Instant::now();
        let mut wait = hold;
        let mut probes: u64 = 0;
        loop {
            tokio::time::sleep(wait).await;
            wait = PROBE_EVERY;
            self.state.store(HALF_OPEN, Ordering::Release);
            probes += 1;
            let ok = self.store.ping().await.is_ok();
            metrics::counter!(names::STORE_BREAKER_PROBES, "result" => if ok { "ok" } else { "failed" })
                .increment(1);
            if ok {
                break;
            }
            self.state.store(OPEN, Ordering::Release);
        }
        self.failures.store(0, Ordering::Relaxed);
        self.history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .closed_at = Some(Instant::now());
        self.closings.fetch_add(1, Ordering::AcqRel);
        self.open_tx.send_replace(false);
        self.state.store(CLOSED, Ordering::Release);
        metrics::gauge!(names::STORE_BREAKER_OPEN).set(0.0);
        metrics::counter!(names::STORE_BREAKER_TRANSITIONS, "to" => "closed").increment(1);
        tracing::info!(
            open_ms = opened_at.elapsed().as_millis() as u64,
            probes,
            "key store reachable again: circuit closed"
        );
    }
}

/// The first cause under a store error, for the one log line of an opening.
fn source_of(e: &StoreError) -> String {
    std::error::Error::source(e).map_or_else(String::new, |s| s.to_string())
}
