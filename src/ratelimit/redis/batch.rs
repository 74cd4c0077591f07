//! Batching of Redis decisions: the decisions waiting at the same moment go to Redis in
//! one script call, so that a round trip and a script run serve many requests.
//!
//! Callers queue a [`Pending`] decision (its Redis key, its GCRA parameters and its op) and
//! wait on a oneshot for the answer. One task per connection drains the queue: woken by a
//! decision, it first lets the tasks ready to run queue theirs (one turn of the event
//! loop, no timer), then sends all that has accumulated; the decisions that arrive while
//! that call is on its way go in the next one, which goes out without waiting for the
//! first one's answer (up to [`MAX_CALLS`] calls at once on a single server: each call is
//! atomic, so their order does not change what is admitted). The script applies the
//! decisions in queue order with the same arithmetic as one call per decision, reading
//! and writing each key once per call, and returns Redis's time and the debts they saw.
//!
//! A decision may carry a second one made only if it is allowed (the guard's peek, then the
//! route's policy or the failure it records): both go in the same call, adjacent and in
//! order, so a request's two decisions cost one round trip and one script run.
//!
//! Alike decisions in a row (a hot key's requests) go as one run, which the script applies
//! in one step with the arithmetic of as many steps, and whose answers the gateway works
//! out from the first one's: the script's work per call grows with the batch's runs, not
//! with its requests.
//!
//! A Redis Cluster runs a script only on keys of one slot, so there a batch is split by
//! slot and the calls for the slots run concurrently; a decision and its second one are
//! queued together only when their keys share a slot.

use std::time::Duration;

use tokio::time::Instant;

use ::redis::{ErrorKind, ServerErrorKind, Value};
use futures_util::future::Either;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::mpsc;

use super::super::nodes::slot as key_slot;
use super::super::redis_target::RedisConn;
use super::super::LimiterError;
use super::script::{parse, runs, script_cmd, Answer, Pending, SCRIPT};

/// Most queued decisions in one script call (a pair counts once, so at most twice as many
/// keys): a script blocks Redis while it runs, so a call is kept to tens of microseconds
/// there; the rest of a longer queue goes in the next call.
const MAX_BATCH: usize = 256;

/// Script calls on their way at once on a single server. Decisions stay exact whatever the
/// order the calls run in: each call is atomic, and a request's decisions share one.
pub(super) const MAX_CALLS: usize = 4;
/// The same on a cluster, where a batch splits into a call per slot: a call to a node
/// that does not answer holds its place until the timeout, and must not hold up the
/// calls to the nodes that do.
const MAX_CLUSTER_CALLS: usize = 256;

/// The queue into the batching task; the task ends when the last clone is dropped.
#[derive(Clone)]
pub(super) struct Batcher {
    queue: mpsc::UnboundedSender<Pending>,
    /// Script calls made (tests check that decisions share them).
    #[cfg(test)]
    calls: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

// === impl Batcher ===

impl Batcher {
    /// Spawns the task that sends the queued decisions over `conn`. Each decision is
    /// answered, or failed with [`LimiterError::Timeout`], at most `timeout` after it was
    /// queued: callers need no timer of their own.
    ///
    /// Unbounded: every queued decision has a request waiting for it (at most `timeout`),
    /// so the queue is bounded by the requests in flight.
    pub(super) fn spawn(conn: RedisConn, hash: String, cluster: bool, timeout: Duration) -> Self {
        let (queue, rx) = mpsc::unbounded_channel();
        let task = Task {
            conn,
            hash,
            cluster,
            timeout,
            #[cfg(test)]
            calls: Default::default(),
        };
        #[cfg(test)]
        let calls = task.calls.clone();
        tokio::spawn(task.run(rx, Instant::now()));
        Self {
            queue,
            #[cfg(test)]
            calls,
        }
    }

    /// Script calls made so far.
    #[cfg(test)]
    pub(super) fn calls(&self) -> u64 {
        self.calls.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Queues `pending`; `false` if the task is gone (its runtime shut down).
    pub(super) fn send(&self, pending: Pending) -> bool {
        self.queue.send(pending).is_ok()
    }
}

struct Task {
    conn: RedisConn,
    /// SHA1 of [`SCRIPT`] for EVALSHA.
    hash: String,
    cluster: bool,
    timeout: Duration,
    #[cfg(test)]
    calls: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

// === impl Task ===

impl Task {
    /// Script calls on their way at once, at most.
    #[inline]
    fn max_calls(&self) -> usize {
        if self.cluster {
            MAX_CLUSTER_CALLS
        } else {
            MAX_CALLS
        }
    }

    /// One slot's call on a cluster, for `group`'s decisions, which it
    /// answers. Boxed: a cluster's calls are many and short-lived; a single
    /// server's keep their own (unboxed) type.
    fn slot_call(
        &self,
        mut group: Vec<Pending>,
        deadline: Instant,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        let mut conn = self.conn.clone();
        let hash = self.hash.clone();
        Box::pin(async move {
            let result = call(&mut conn, &hash, deadline, &group).await;
            answer(&mut group, result);
        })
    }

    /// `since`: no decision was queued before it.
    async fn run(self, mut rx: mpsc::UnboundedReceiver<Pending>, mut since: Instant) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        // Calls on their way (single server): the next batch goes out while the last
        // one's answer is still coming, so the gateway does not idle for a round trip.
        let mut in_flight = FuturesUnordered::new();
        let max_calls = self.max_calls();
        loop {
            while in_flight.len() >= max_calls {
                in_flight.next().await;
            }
            let waited = rx.is_empty();
            let got = if in_flight.is_empty() {
                rx.recv_many(&mut batch, MAX_BATCH).await
            } else {
                // recv_many is cancel safe: a call that ends first loses nothing.
                tokio::select! {
                    biased;
                    _ = in_flight.next() => continue,
                    got = rx.recv_many(&mut batch, MAX_BATCH) => got,
                }
            };
            if got == 0 {
                while in_flight.next().await.is_some() {}
                return;
            }
            let taken = Instant::now();
            if batch.len() < MAX_BATCH {
                // The requests that are ready to run, or whose bytes have arrived, queue
                // their decisions before this call goes: one call carries them all, so a
                // burst pays Redis's fixed cost per call once, not once per few requests.
                tokio::task::yield_now().await;
                take_queued(&mut rx, &mut batch);
            }
            let (queued, next_since) = queued_at(waited, taken, since, batch.len() == MAX_BATCH);
            since = next_since;
            let deadline = queued + self.timeout;
            // A caller that gave up (its request ended) takes no token.
            batch.retain(|p: &Pending| !p.reply.is_closed());
            if batch.is_empty() {
                continue;
            }
            #[cfg(test)]
            self.calls
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if self.cluster {
                // Each slot's call on its own: the next batch goes out while they run.
                for group in by_slot(&mut batch) {
                    in_flight.push(Either::Right(self.slot_call(group, deadline)));
                }
            } else {
                let mut sent = std::mem::replace(&mut batch, Vec::with_capacity(MAX_BATCH));
                let mut conn = self.conn.clone();
                let hash = &self.hash;
                in_flight.push(Either::Left(async move {
                    let result = call(&mut conn, hash, deadline, &sent).await;
                    answer(&mut sent, result);
                }));
            }
        }
    }
}

/// Moves into `batch` the decisions already queued, up to [`MAX_BATCH`].
#[inline]
fn take_queued(rx: &mut mpsc::UnboundedReceiver<Pending>, batch: &mut Vec<Pending>) {
    while batch.len() < MAX_BATCH {
        let Ok(pending) = rx.try_recv() else { break };
        batch.push(pending);
    }
}

/// When a batch taken at `taken` was queued, and the `since` of the next one.
/// A batch found waiting (`waited`) was queued after the last one was taken
/// (with it, if that one was `full`); one waited for was queued just now. Its
/// callers' time runs from then, so none waits past the timeout for its answer.
#[inline]
fn queued_at(waited: bool, taken: Instant, since: Instant, full: bool) -> (Instant, Instant) {
    let queued = if waited { taken } else { since };
    (queued, if full { queued } else { taken })
}

/// `batch` split by slot, emptying it; a key's decisions keep their order (the sort is
/// stable).
fn by_slot(batch: &mut Vec<Pending>) -> Vec<Vec<Pending>> {
    batch.sort_by_cached_key(|p| key_slot(p.key.as_bytes()));
    let mut groups = Vec::new();
    let mut rest = std::mem::take(batch);
    while !rest.is_empty() {
        let slot = key_slot(rest[0].key.as_bytes());
        let n = rest
            .iter()
            .take_while(|p| key_slot(p.key.as_bytes()) == slot)
            .count();
        let tail = rest.split_off(n);
        groups.push(rest);
        rest = tail;
    }
    groups
}

/// Hands each decision of `batch` its answer, or the call's failure.
fn answer(batch: &mut Vec<Pending>, result: Result<Vec<Answer>, LimiterError>) {
    match result {
        Ok(answers) => {
            for (pending, answer) in batch.drain(..).zip(answers) {
                let _ = pending.reply.send(Ok(answer));
            }
        }
        Err(err) => {
            for pending in batch.drain(..) {
                let _ = pending.reply.send(Err(err.clone()));
            }
        }
    }
}

/// Runs the script on `batch` by `deadline` (at once a timeout if it is past: the callers
/// have had their time). After NOSCRIPT (a Redis restart, `SCRIPT
/// FLUSH`, a new cluster node) the batch goes again as EVAL with the script's text, which
/// also caches it: a NOSCRIPT call ran nothing, so each decision still counts once, and
/// unlike a SCRIPT LOAD followed by EVALSHA no flush in between can fail it again.
async fn call(
    conn: &mut RedisConn,
    hash: &str,
    deadline: Instant,
    batch: &[Pending],
) -> Result<Vec<Answer>, LimiterError> {
    if Instant::now() >= deadline {
        return Err(LimiterError::Timeout);
    }
    let runs = runs(batch);
    let run = async {
        match script_cmd("EVALSHA", hash, batch, &runs)
            .query_async::<Value>(conn)
            .await
        {
            Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                script_cmd("EVAL", SCRIPT, batch, &runs)
                    .query_async::<Value>(conn)
                    .await
            }
            other => other,
        }
    };
    let value = tokio::time::timeout_at(deadline, run)
        .await
        .map_err(|_| LimiterError::Timeout)??;
    Ok(parse(value, &runs)?)
}
