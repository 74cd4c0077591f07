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
//! and writing each key once per call, and returns Redis's time and each decision's debt.
//!
//! A decision may carry a second one made only if it is allowed (the guard's peek, then the
//! route's policy or the failure it records): both go in the same call, adjacent and in
//! order, so a request's two decisions cost one round trip and one script run.
//!
//! A Redis Cluster runs a script only on keys of one slot, so there a batch is split by
//! slot and the calls for the slots run concurrently; a decision and its second one are
//! queued together only when their keys share a slot.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use ::redis::{cluster_routing::get_slot, Cmd, ErrorKind, RedisError, RedisResult, Value};
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, oneshot};

use super::super::gcra::{Gcra, Op};
use super::super::redis_target::RedisConn;
use super::super::LimiterError;

/// Most queued decisions in one script call (a pair counts once, so at most twice as many
/// keys): a script blocks Redis while it runs, so a call is kept to tens of microseconds
/// there; the rest of a longer queue goes in the next call.
const MAX_BATCH: usize = 256;

/// Script calls on their way at once on a single server. Decisions stay exact whatever the
/// order the calls run in: each call is atomic, and a request's decisions share one.
pub(super) const MAX_CALLS: usize = 4;

/// KEYS: the batch's distinct buckets, each once. ARGV: two strings. The first holds the
/// batch's distinct parameter pairs, emission interval T (ns) then burst c*T (ns), each a
/// little-endian double (both are below 2^53, so exact). The second holds four bytes per
/// decision, in order: its key's index in KEYS (from 0) and its code, each a big-endian
/// u16. The code is 8 * its pair's index (from 0) + its op (0 check, 1 peek, 2 consume; 3,
/// 4, 5 the same made only if the decision just before was allowed, else skipped: no write,
/// and -1 in place of its debt). A batch holds a few policies and, under load, a few hot
/// keys, so a decision costs four bytes, not a key and three numbers. Returns now's
/// seconds, now's microseconds, then each decision's debt before its op (ns), packed as
/// little-endian doubles in one string: the numbers the script computes, exactly, with no
/// RESP integer to write or parse for each.
///
/// Every key is read with one MGET; a key's debt is kept in `debts` as a re-read would give
/// it (`tat - now`, unclamped), and written once at the end if it changed (`written`): the
/// same result as one call per decision in this order, with one TIME and one MGET per call
/// and one SET per changed key.
pub(super) const SCRIPT: &str = r#"
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now_s = tonumber(t[1])
local now_ns = tonumber(t[2]) * 1000
local out = { now_s, tonumber(t[2]) }
local params = { struct.unpack('<' .. string.rep('d', #ARGV[1] / 8), ARGV[1]) }
local ops = ARGV[2]
local stored = redis.call('MGET', unpack(KEYS))
local debts = {}
local written = {}
local allowed = false
for i = 1, #ops / 4 do
  local k1, k2, c1, c2 = string.byte(ops, i * 4 - 3, i * 4)
  local key = k1 * 256 + k2 + 1
  local code = c1 * 256 + c2
  local op = code % 8
  local p = (code - op) / 4 + 1
  if op > 2 and not allowed then
    out[i + 2] = -1
  else
    if op > 2 then op = op - 3 end
    local interval = params[p]
    local burst = params[p + 1]
    local debt = debts[key]
    if debt == nil then
      debt = 0
      local tat = stored[key]
      if tat then
        local tat_s = tonumber(string.sub(tat, 1, -10))
        local tat_ns = tonumber(string.sub(tat, -9))
        if tat_s and tat_ns then
          debt = (tat_s - now_s) * 1000000000 + (tat_ns - now_ns)
        end
      end
      debts[key] = debt
    end
    if debt < 0 then debt = 0 elseif debt > burst then debt = burst end
    local needed = debt + interval
    local after = debt
    allowed = needed <= burst
    if op == 0 then
      if allowed then after = needed end
    elseif op == 2 then
      if allowed then after = needed else after = burst end
    end
    if after ~= debt and after > 0 then
      written[key] = after
      debts[key] = after
    end
    out[i + 2] = debt
  end
end
for key = 1, #KEYS do
  local after = written[key]
  if after then
    local total = now_ns + after
    local carry = math.floor(total / 1000000000)
    local rem = total - carry * 1000000000
    if rem < 0 then carry = carry - 1; rem = rem + 1000000000
    elseif rem >= 1000000000 then carry = carry + 1; rem = rem - 1000000000 end
    local tat = string.format('%d%09d', now_s + carry, rem)
    redis.call('SET', KEYS[key], tat, 'PX', math.ceil(after / 1000000))
  end
end
return struct.pack('<' .. string.rep('d', #out), unpack(out))
"#;

/// Redis's answer to one decision (and to the one made after it, if any).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Answer {
    /// Redis's time at the call, Unix ns.
    pub(super) now: u64,
    /// The key's debt before the op (ns).
    pub(super) debt: u64,
    /// The debt before the second decision's op; `None` when it was skipped (or absent).
    pub(super) then: Option<u64>,
}

/// One decision waiting for its batch.
pub(super) struct Pending {
    /// The full Redis key of the bucket.
    pub(super) key: String,
    /// The bucket's parameters (a per-request quota travels here too).
    pub(super) gcra: Gcra,
    pub(super) op: Op,
    /// A decision made right after this one, in the same call, only if this one is
    /// allowed (on a cluster, its key is in the same slot).
    pub(super) then: Option<Step>,
    pub(super) reply: oneshot::Sender<Result<Answer, LimiterError>>,
}

/// The second decision of a [`Pending`].
pub(super) struct Step {
    pub(super) key: String,
    pub(super) gcra: Gcra,
    pub(super) op: Op,
}

/// The queue into the batching task; the task ends when the last clone is dropped.
#[derive(Clone)]
pub(super) struct Batcher {
    queue: mpsc::UnboundedSender<Pending>,
    /// Script calls made (tests check that decisions share them).
    #[cfg(test)]
    calls: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

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

impl Task {
    /// `since`: no decision was queued before it.
    async fn run(self, mut rx: mpsc::UnboundedReceiver<Pending>, mut since: Instant) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        // Calls on their way (single server): the next batch goes out while the last
        // one's answer is still coming, so the gateway does not idle for a round trip.
        let mut in_flight = FuturesUnordered::new();
        loop {
            while in_flight.len() >= MAX_CALLS {
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
                while batch.len() < MAX_BATCH {
                    let Ok(pending) = rx.try_recv() else { break };
                    batch.push(pending);
                }
            }
            // A batch found waiting was queued after the last one was taken (with it, if
            // that one was full); one waited for was queued just now. Its callers' time
            // runs from then, so none waits past the timeout for its answer.
            let queued = if waited { taken } else { since };
            since = if batch.len() == MAX_BATCH {
                queued
            } else {
                taken
            };
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
                self.send_by_slot(&mut batch, deadline).await;
                batch.clear();
            } else {
                let mut sent = std::mem::replace(&mut batch, Vec::with_capacity(MAX_BATCH));
                let mut conn = self.conn.clone();
                let hash = &self.hash;
                in_flight.push(async move {
                    let result = call(&mut conn, hash, deadline, &sent).await;
                    answer(&mut sent, result);
                });
            }
        }
    }

    /// One call per slot, all at once; a key's decisions keep their order (the sort is stable).
    async fn send_by_slot(&self, batch: &mut Vec<Pending>, deadline: Instant) {
        batch.sort_by_cached_key(|p| get_slot(p.key.as_bytes()));
        let mut groups = Vec::new();
        let mut rest = std::mem::take(batch);
        while !rest.is_empty() {
            let slot = get_slot(rest[0].key.as_bytes());
            let n = rest
                .iter()
                .take_while(|p| get_slot(p.key.as_bytes()) == slot)
                .count();
            let tail = rest.split_off(n);
            groups.push(rest);
            rest = tail;
        }
        let calls = groups.into_iter().map(|mut group| {
            let mut conn = self.conn.clone();
            async move {
                let result = call(&mut conn, &self.hash, deadline, &group).await;
                answer(&mut group, result);
            }
        });
        futures_util::future::join_all(calls).await;
    }
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
    let run = async {
        match script_cmd("EVALSHA", hash, batch)
            .query_async::<Value>(conn)
            .await
        {
            Err(err) if err.kind() == ErrorKind::NoScriptError => {
                script_cmd("EVAL", SCRIPT, batch)
                    .query_async::<Value>(conn)
                    .await
            }
            other => other,
        }
    };
    let value = tokio::time::timeout_at(deadline, run)
        .await
        .map_err(|_| LimiterError::Timeout)??;
    let shape: Vec<bool> = batch.iter().map(|p| p.then.is_some()).collect();
    Ok(parse(value, &shape)?)
}

/// `EVALSHA hash` or `EVAL script`, then the batch's distinct keys, its distinct parameter
/// pairs and its decisions packed (a second decision's right after its first's).
fn script_cmd(verb: &str, script: &str, batch: &[Pending]) -> Cmd {
    let mut pairs = Distinct::default();
    let mut keys = Distinct::default();
    let mut ops = Vec::with_capacity(batch.len() * 8);
    // Every decision in order, a second one right after its first.
    let decisions = batch.iter().flat_map(|p| {
        let first = (p.key.as_str(), &p.gcra, p.op.code());
        let then = p.then.as_ref();
        std::iter::once(first)
            .chain(then.map(|t| (t.key.as_str(), &t.gcra, t.op.code_if_allowed())))
    });
    for (key, gcra, op) in decisions {
        let key = keys.index(key);
        let code = pairs.index((gcra.interval(), gcra.burst())) * 8 + op as usize;
        // At most 2 * MAX_BATCH keys and pairs, so both fit in a u16.
        ops.extend_from_slice(&(key as u16).to_be_bytes());
        ops.extend_from_slice(&(code as u16).to_be_bytes());
    }
    let key_bytes: usize = keys.items.iter().map(|k| k.len()).sum();
    // Sized once (the key count has at most 20 digits), so no argument regrows it.
    let mut cmd = Cmd::with_capacity(
        5 + keys.items.len(),
        verb.len() + script.len() + 60 + key_bytes + pairs.items.len() * 16 + ops.len(),
    );
    cmd.arg(verb).arg(script).arg(keys.items.len());
    for key in &keys.items {
        cmd.arg(*key);
    }
    let params: Vec<u8> = (pairs.items.iter())
        .flat_map(|&(interval, burst)| [interval as f64, burst as f64])
        .flat_map(f64::to_le_bytes)
        .collect();
    cmd.arg(params);
    cmd.arg(ops);
    cmd
}

/// The distinct items of a batch in first use, each with its index. A batch usually holds
/// a few policies and a few hot keys, found by a linear search; past those (every request
/// a client and a key of its own) a map keeps the search short.
struct Distinct<T> {
    items: Vec<T>,
    more: HashMap<T, usize, foldhash::fast::RandomState>,
}

impl<T> Default for Distinct<T> {
    fn default() -> Self {
        Self {
            items: Vec::new(),
            more: HashMap::default(),
        }
    }
}

impl<T: Copy + Eq + std::hash::Hash> Distinct<T> {
    /// Searched linearly before the map.
    const LINEAR: usize = 8;

    fn index(&mut self, item: T) -> usize {
        let found = self
            .items
            .iter()
            .take(Self::LINEAR)
            .position(|&i| i == item);
        if let Some(index) = found.or_else(|| self.more.get(&item).copied()) {
            return index;
        }
        self.items.push(item);
        if self.items.len() > Self::LINEAR {
            self.more.insert(item, self.items.len() - 1);
        }
        self.items.len() - 1
    }
}

/// The script's reply: seconds, microseconds, then one debt per decision, each a
/// little-endian double; `pairs` says, per queued decision, whether a second one follows
/// it (its debt may be -1: skipped).
fn parse(value: Value, pairs: &[bool]) -> RedisResult<Vec<Answer>> {
    let bad = || RedisError::from((ErrorKind::TypeError, "unexpected rate-limit script reply"));
    let Value::BulkString(bytes) = value else {
        return Err(bad());
    };
    let n = pairs.len() + pairs.iter().filter(|&&pair| pair).count();
    if bytes.len() != (n + 2) * 8 {
        return Err(bad());
    }
    let mut numbers = bytes.chunks_exact(8).map(|b| {
        let mut le = [0; 8];
        le.copy_from_slice(b);
        f64::from_le_bytes(le)
    });
    // Every number is a whole one in [0, 2^64), or -1 for a skipped decision (past 2^53
    // the script's doubles are whole already, and as exact as its arithmetic was).
    let mut int = || match numbers.next() {
        Some(v) if (0.0..18_446_744_073_709_551_616.0).contains(&v) && v.fract() == 0.0 => {
            Ok(Some(v as u64))
        }
        Some(-1.0) => Ok(None),
        _ => Err(bad()),
    };
    let now_s = int()?.ok_or_else(bad)?;
    let now_us = int()?.ok_or_else(bad)?;
    let now = now_s
        .saturating_mul(1_000_000_000)
        .saturating_add(now_us.saturating_mul(1_000));
    pairs
        .iter()
        .map(|&pair| {
            let debt = int()?.ok_or_else(bad)?;
            let then = if pair { int()? } else { None };
            Ok(Answer { now, debt, then })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply as the script packs it.
    fn packed(numbers: &[f64]) -> Value {
        Value::BulkString(numbers.iter().flat_map(|n| n.to_le_bytes()).collect())
    }

    #[test]
    fn replies_are_checked_for_shape() {
        let answers = parse(packed(&[2.0, 5.0, 7.0]), &[false]).unwrap();
        assert_eq!(
            answers,
            [Answer {
                now: 2_000_005_000,
                debt: 7,
                then: None,
            }]
        );
        assert!(parse(packed(&[2.0, 5.0]), &[false]).is_err());
        assert!(parse(packed(&[2.0, 5.0, -1.0]), &[false]).is_err());
        assert!(parse(packed(&[2.0, 5.0, 7.5]), &[false]).is_err());
        assert!(parse(packed(&[2.0, 5.0, f64::NAN]), &[false]).is_err());
        let ragged = Value::BulkString(vec![0; 23]);
        assert!(parse(ragged, &[false]).is_err());
        assert!(parse(Value::Array(vec![Value::Int(2), Value::Int(5)]), &[]).is_err());
        assert!(parse(Value::Nil, &[]).is_err());
    }

    #[test]
    fn a_second_decision_is_read_with_its_first_and_may_be_skipped() {
        let reply = packed(&[2.0, 5.0, 7.0, 9.0, 1.0, 3.0, -1.0]);
        let answers = parse(reply, &[true, false, true]).unwrap();
        let debts: Vec<_> = answers.iter().map(|a| (a.debt, a.then)).collect();
        assert_eq!(debts, [(7, Some(9)), (1, None), (3, None)]);
        // A skip only stands for a second decision; a pair needs its second debt.
        assert!(parse(packed(&[2.0, 5.0, -1.0, 9.0]), &[true]).is_err());
        assert!(parse(packed(&[2.0, 5.0, 7.0]), &[true]).is_err());
    }

    fn pending(key: &str, gcra: Gcra, op: Op, then: Option<Step>) -> Pending {
        Pending {
            key: key.into(),
            gcra,
            op,
            then,
            reply: oneshot::channel().0,
        }
    }

    #[test]
    fn a_call_names_each_key_and_pair_once_and_packs_the_decisions() {
        // Ten tokens per 100 and per 200 ns: intervals 10 and 20, bursts 100 and 200.
        let gcra = |ns| {
            let ten = std::num::NonZeroU32::new(10).unwrap_or(std::num::NonZeroU32::MIN);
            Gcra::new(&crate::ratelimit::Quota::new(ten, Duration::from_nanos(ns)))
        };
        let (a, b) = (gcra(100), gcra(200));
        let guard = |key: &str| Step {
            key: key.into(),
            gcra: b,
            op: Op::Check,
        };
        let batch = [
            pending("ip1", a, Op::Peek, Some(guard("k1"))),
            pending("ip1", a, Op::Peek, Some(guard("k2"))),
            pending("k1", b, Op::Consume, None),
        ];
        let cmd = script_cmd("EVALSHA", "sha", &batch);
        let args: Vec<Vec<u8>> = cmd
            .args_iter()
            .map(|arg| match arg {
                ::redis::Arg::Simple(bytes) => bytes.to_vec(),
                ::redis::Arg::Cursor => Vec::new(),
            })
            .collect();
        let params: Vec<u8> = [10.0_f64, 100.0, 20.0, 200.0]
            .iter()
            .flat_map(|n| n.to_le_bytes())
            .collect();
        let text: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        assert_eq!(
            text,
            [
                &b"EVALSHA"[..],
                b"sha",
                b"3",
                b"ip1",
                b"k1",
                b"k2",
                // The two pairs, interval then burst, as doubles.
                &params,
                // Five decisions, four bytes each: key index, then pair * 8 + op.
                &[0, 0, 0, 1, 0, 1, 0, 11, 0, 0, 0, 1, 0, 2, 0, 11, 0, 1, 0, 10],
            ]
        );
    }

    #[test]
    fn distinct_items_keep_their_first_index_past_the_linear_search() {
        let mut keys = Distinct::default();
        let names: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
        for (i, name) in names.iter().enumerate() {
            assert_eq!(keys.index(name.as_str()), i);
        }
        for (i, name) in names.iter().enumerate().rev() {
            assert_eq!(keys.index(name.as_str()), i);
        }
        assert_eq!(keys.items.len(), 20);
    }

    #[test]
    fn large_debts_survive_the_packing() {
        // A thousand requests a day: a burst of 8.64e16 ns, past 2^53, read as the script
        // holds it.
        let day = 86_400_000_000_000_u64 * 1_000;
        let answers = parse(packed(&[2.0, 5.0, day as f64]), &[false]).unwrap();
        assert_eq!(answers[0].debt, day);
    }
}
