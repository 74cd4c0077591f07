//! Loading for a [`Tier`]: single flight per hash, and the queue of misses
//! sent to the store in batches, at most [`MAX_QUERIES`] queries at a time.
use super::{Answer, Slot, Tier, MAX_BATCH, MAX_LOAD_ATTEMPTS, MAX_QUERIES};
use crate::secret::SecretHash;
use crate::store::cache::changes::{lock, Cached};
use crate::store::StoreError;
use futures_util::future::{BoxFuture, FutureExt, Shared};
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// A shared in-flight load every concurrent caller awaits.
type Flight<T> = Shared<BoxFuture<'static, Answer<T>>>;

/// A map keyed by secret hash: the key is a digest already, so a seeded
/// foldhash spreads it as well as SipHash would, for less per miss.
type ByHash<V> = HashMap<SecretHash, V, foldhash::fast::RandomState>;

/// The loads of one tier: one shared answer per hash being loaded, and the
/// hashes not yet sent to the store.
pub(super) struct InFlight<T> {
    flights: ByHash<Flight<T>>,
    queue: Vec<Waiter<T>>,
    /// Tasks sending the queue to the store (each stops once it is empty).
    running: usize,
}

/// A hash to ask the store for, and where its answer goes.
struct Waiter<T> {
    hash: SecretHash,
    answer: oneshot::Sender<Answer<T>>,
    /// Answers already discarded because an invalidation raced them.
    raced: u8,
}

impl<T> Default for InFlight<T> {
    fn default() -> Self {
        InFlight {
            flights: ByHash::default(),
            queue: Vec::new(),
            running: 0,
        }
    }
}

impl<T: Cached> Tier<T> {
    /// Joins the in-flight load of `hash`, or queues it for the next batch.
    /// Batches run on their own task, so a load completes (and leaves the
    /// in-flight map) even if every caller gives up.
    pub(super) async fn load(self: &Arc<Self>, hash: SecretHash) -> Answer<T> {
        let flight = {
            let mut inflight = lock(&self.inflight);
            match inflight.flights.get(&hash) {
                Some(flight) => flight.clone(),
                None => {
                    let (answer, answered) = oneshot::channel();
                    let flight = async move {
                        answered
                            .await
                            .unwrap_or_else(|e| Err(StoreError::Unavailable(Arc::new(e))))
                    }
                    .boxed()
                    .shared();
                    inflight.flights.insert(hash, flight.clone());
                    inflight.queue.push(Waiter {
                        hash,
                        answer,
                        raced: 0,
                    });
                    if inflight.running < MAX_QUERIES {
                        inflight.running += 1;
                        tokio::spawn(Arc::clone(self).run_batches());
                    }
                    flight
                }
            }
        };
        flight.await
    }

    /// Sends the queue to the store, [`MAX_BATCH`] hashes a query, until it
    /// is empty (one of at most [`MAX_QUERIES`] such tasks).
    async fn run_batches(self: Arc<Self>) {
        loop {
            let batch = {
                let mut inflight = lock(&self.inflight);
                if inflight.queue.is_empty() {
                    inflight.running -= 1;
                    return;
                }
                if inflight.queue.len() <= MAX_BATCH {
                    std::mem::take(&mut inflight.queue)
                } else {
                    inflight.queue.drain(..MAX_BATCH).collect()
                }
            };
            let hashes: Vec<SecretHash> = batch.iter().map(|w| w.hash).collect();
            if AssertUnwindSafe(self.fetch(batch, hashes.clone()))
                .catch_unwind()
                .await
                .is_err()
            {
                // Its waiters were dropped (their callers get an error): the
                // next lookup of these hashes asks again.
                let mut inflight = lock(&self.inflight);
                for hash in &hashes {
                    inflight.flights.remove(hash);
                }
            }
        }
    }

    /// Queries the store for `batch` (whose hashes are `hashes`) and caches
    /// each answer, unless an invalidation that touches it arrived meanwhile
    /// (then that hash goes back in the queue).
    async fn fetch(&self, batch: Vec<Waiter<T>>, hashes: Vec<SecretHash>) {
        let start_epoch = self.log.epoch();
        let breaker_epoch = self.breaker.epoch();
        let started = Instant::now();
        let mut found: ByHash<T> = match (self.loader)(Arc::clone(&self.store), hashes).await {
            Ok(found) => found.into_iter().collect(),
            Err(e) => {
                self.breaker.failed(&e, breaker_epoch);
                let answers = batch.into_iter().map(|w| (w, Err(e.clone())));
                self.answer(answers.collect());
                return;
            }
        };
        self.breaker.succeeded();
        let mut answers = Vec::with_capacity(batch.len());
        let mut again = Vec::new();
        for mut waiter in batch {
            let Some(value) = found.remove(&waiter.hash).map(Arc::new) else {
                // Gone (deleted since it was cached) or never there.
                if self.entries.contains_key(&waiter.hash) {
                    self.entries.remove(&waiter.hash);
                }
                self.negatives.insert(waiter.hash, started);
                answers.push((waiter, Ok(None)));
                continue;
            };
            if self.cache(waiter.hash, &value, started, start_epoch) {
                answers.push((waiter, Ok(Some(value))));
                continue;
            }
            waiter.raced += 1;
            if waiter.raced >= MAX_LOAD_ATTEMPTS {
                // Invalidations keep racing it: answer, uncached.
                answers.push((waiter, Ok(Some(value))));
            } else {
                again.push(waiter);
            }
        }
        self.answer(answers);
        if !again.is_empty() {
            lock(&self.inflight).queue.extend(again);
        }
    }

    /// Caches `value` for `hash` unless an invalidation since `start_epoch`
    /// touches it; false if one did (nothing is left cached then).
    pub(super) fn cache(
        &self,
        hash: SecretHash,
        value: &Arc<T>,
        started: Instant,
        start_epoch: u64,
    ) -> bool {
        let raced = || {
            self.log
                .changed_since(start_epoch, |c| value.affected_by(c))
        };
        if raced() {
            return false;
        }
        self.negatives.remove(&hash);
        let slot = Slot {
            loaded_at: started,
            value: Arc::clone(value),
        };
        self.entries.insert(hash, slot);
        // An invalidation between the check and the insert would miss
        // the new entry: look once more now that it is visible.
        if raced() {
            self.entries.remove(&hash);
            return false;
        }
        true
    }

    /// Ends the loads of `answers`' hashes and hands each its answer.
    fn answer(&self, answers: Vec<(Waiter<T>, Answer<T>)>) {
        {
            let mut inflight = lock(&self.inflight);
            for (waiter, _) in &answers {
                inflight.flights.remove(&waiter.hash);
            }
        }
        for (waiter, answer) in answers {
            // The receiver is gone only if every caller gave up.
            let _ = waiter.answer.send(answer);
        }
    }
}
