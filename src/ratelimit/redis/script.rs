//! The limiter's Redis script and what one call of it carries: a batch's decisions, in
//! runs of alike ones, packed into two arguments ([`script_cmd`]), and the reply, read back
//! into one answer per decision ([`parse`]).

use std::collections::HashMap;

use ::redis::{Cmd, ErrorKind, RedisError, RedisResult, Value};
use tokio::sync::oneshot;

use super::super::credits::Credited;
use super::super::gcra::{Gcra, Op, MAX_BURST_NANOS};
use super::super::LimiterError;

/// KEYS: the batch's distinct buckets, each once. ARGV: two strings. The first holds the
/// batch's distinct parameter pairs, emission interval T (ns) then burst c*T (ns), each a
/// little-endian double (both are below 2^53, so exact). The second holds the decisions in
/// order, grouped in runs (see [`Run`]): per run six bytes, its length (a big-endian u16,
/// its top bit set when each decision of the run has a second one), then its decision's
/// key index in KEYS (from 0) and its code, each a big-endian u16, the code being 8 * its
/// pair's index (from 0) + its op (0 check, 1 peek, 2 consume, 3 refund); then, if paired, four more
/// bytes, the second decision's key index and code, made only if the first is allowed (else
/// skipped: no write, and -1 in place of its debt). A batch holds a few policies and, under
/// load, a few hot keys, so a decision costs four bytes at most, not a key and three numbers,
/// and a hot key's run costs the script one step, not one per request. Returns now's
/// seconds, now's microseconds, then for each run the debt its first decision saw before
/// its op (ns), and the second decision's, packed as little-endian doubles in one string:
/// the numbers the script computes, exactly, with no RESP integer to write or parse for
/// each. The gateway works out each decision of a run from these ([`parse`]).
///
/// Every key is read with one MGET; a key's debt is kept in `debts` as a re-read would give
/// it (`tat - now`, unclamped), and written once at the end if it changed (`written`): the
/// same result as one call per decision in this order, with one TIME and one MGET per call
/// and one SET per changed key. A run of `n` takes, at once, the tokens that `n` decisions
/// one after the other would take, `k = min(n, floor((burst - debt) / T))`, exact in
/// doubles because a run is only formed where `burst + T < 2^53` ([`Run::repeats`]).
///
/// A run header's bit 14 marks a run whose decisions each spend credits (alike in them
/// too): after its decisions come four more bytes, its count's key index in KEYS and the
/// index of its eight numbers in ARGV[3] (little-endian doubles, as
/// [`super::super::credits::SCRIPT`] takes them: generation, creation, refill interval
/// and amount, the cached period and count, the cost, the count's TTL in ms). Each
/// allowed decision of the run spends the cost while the count lasts; the reply holds the
/// count before the run (or -1 when none was allowed), from which [`parse`] gives each
/// decision its own. A count is parsed once a call and written once at its end.
pub(super) const SCRIPT: &str = r#"
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now_s = tonumber(t[1])
local now_ns = tonumber(t[2]) * 1000
local out = { now_s, tonumber(t[2]) }
local o = 2
local params = { struct.unpack('<' .. string.rep('d', #ARGV[1] / 8), ARGV[1]) }
local ops = ARGV[2]
local cparams = {}
if #ARGV[3] > 0 then
  cparams = { struct.unpack('<' .. string.rep('d', #ARGV[3] / 8), ARGV[3]) }
end
local counts = {}
local stored = redis.call('MGET', unpack(KEYS))
local debts = {}
local written = {}
local i = 1
while i < #ops do
  local n1, n2, k1, k2, c1, c2 = string.byte(ops, i, i + 5)
  local n = n1 * 256 + n2
  local last = i + 2
  if n >= 32768 then
    n = n - 32768
    last = i + 6
  end
  local credit = n >= 16384
  if credit then n = n - 16384 end
  local allowed = true
  local taken = 0
  for j = i + 2, last, 4 do
    o = o + 1
    if not allowed then
      out[o] = -1
      taken = 0
    else
      if j > i + 2 then k1, k2, c1, c2 = string.byte(ops, j, j + 3) end
      local key = k1 * 256 + k2 + 1
      local code = c1 * 256 + c2
      local op = code % 8
      local p = (code - op) / 4 + 1
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
      allowed = debt + interval <= burst
      local after = debt
      taken = 0
      if op == 1 then
        if allowed then taken = n end
      elseif op == 3 then
        after = debt - n * interval
        if after < 0 then after = 0 end
      else
        local k = 0
        if allowed then
          k = 1
          if n > 1 then
            k = math.floor((burst - debt) / interval)
            if k > n then k = n end
          end
        end
        after = debt + k * interval
        if op == 2 and k < n then after = burst end
        taken = k
      end
      if after ~= debt then
        written[key] = after
        debts[key] = after
      end
      out[o] = debt
    end
  end
  i = last + 4
  if credit then
    local ck1, ck2, q1, q2 = string.byte(ops, i, i + 3)
    i = i + 4
    o = o + 1
    if taken == 0 then
      out[o] = -1
    else
      local key = ck1 * 256 + ck2 + 1
      local q = (q1 * 256 + q2) * 8 + 1
      local gen = cparams[q]
      local c = counts[key]
      if c == nil then
        c = { -1, 0, 0, 0 }
        local v = stored[key]
        if v then
          local sg, sp, sr = string.match(v, '^(%d+):(%d+):(%d+)$')
          if sg then c = { tonumber(sg), tonumber(sp), tonumber(sr), 0 } end
        end
        counts[key] = c
      end
      if c[1] < gen then
        c[1] = gen; c[2] = cparams[q + 4]; c[3] = cparams[q + 5]
      end
      if cparams[q + 2] > 0 then
        local np = math.floor(math.max(now_s - cparams[q + 1], 0) / cparams[q + 2])
        if np > c[2] then c[2] = np; c[3] = cparams[q + 3] end
      end
      -- The run's first `taken` decisions were allowed: each spends the cost
      -- while the count lasts. The reply is the count before them.
      out[o] = c[3]
      local m = math.floor(c[3] / cparams[q + 6])
      if m > taken then m = taken end
      c[3] = c[3] - m * cparams[q + 6]
      c[4] = cparams[q + 7]
    end
  end
end
for key, c in pairs(counts) do
  redis.call('SET', KEYS[key], string.format('%d:%d:%d', c[1], c[2], c[3]), 'PX', c[4])
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
    if after > 0 then
      redis.call('SET', KEYS[key], tat, 'PX', math.ceil(after / 1000000))
    else
      redis.call('DEL', KEYS[key])
    end
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
    /// The credit spend's outcome; `None` when it was skipped (the decision refused) or
    /// there was none.
    pub(super) credit: Option<Credited>,
}

/// A key's credit spend, made in the same call right after its decision (and the second
/// one, if any) only if that is allowed: the Redis key of its count, and the numbers
/// [`super::super::credits::SCRIPT`] takes as ARGV, in its order.
pub(crate) struct CreditStep {
    pub(crate) key: String,
    pub(crate) args: [f64; 8],
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
    /// A credit spend made after the decisions, only if they are allowed (on a cluster,
    /// its key is in the same slot).
    pub(super) credit: Option<CreditStep>,
    pub(super) reply: oneshot::Sender<Result<Answer, LimiterError>>,
}

/// The second decision of a [`Pending`].
pub(super) struct Step {
    pub(super) key: String,
    pub(super) gcra: Gcra,
    pub(super) op: Op,
}

/// Decisions in a row that the script applies as one step: alike in key, parameters and
/// op, and alike in their second decision if they have one.
#[derive(Debug, Clone, Copy)]
pub(super) struct Run {
    len: usize,
    first: (Gcra, Op),
    then: Option<(Gcra, Op)>,
    /// Each decision spends this many credits, if allowed.
    credit: Option<u64>,
}

impl Run {
    /// Longest run: its length, the paired bit and the credit bit share a u16.
    const MAX: usize = 0x3fff;

    /// A run of `p` alone.
    fn of(p: &Pending) -> Self {
        Self {
            len: 1,
            first: (p.gcra, p.op),
            then: p.then.as_ref().map(|t| (t.gcra, t.op)),
            credit: p.credit.as_ref().map(|c| c.args[6] as u64),
        }
    }

    /// Whether a decision alike to `p` may join its run: where the script's step for a run
    /// stays exact in doubles (`burst + T < 2^53`), and, for a pair, where every first
    /// decision of the run sees the same bucket (a peek, at another key than the second's),
    /// so that every second decision is made, or none.
    fn repeats(p: &Pending) -> bool {
        let exact = |g: &Gcra| g.burst() + g.interval() <= MAX_BURST_NANOS;
        exact(&p.gcra)
            && p.then
                .as_ref()
                .is_none_or(|t| p.op == Op::Peek && t.key != p.key && exact(&t.gcra))
    }
}

/// Whether two decisions are alike: the same key, parameters and op, the same second
/// decision or none, and the same credit spend or none.
fn alike(a: &Pending, b: &Pending) -> bool {
    let same_step = match (&a.then, &b.then) {
        (Some(s), Some(t)) => s.key == t.key && s.gcra == t.gcra && s.op == t.op,
        (None, None) => true,
        _ => false,
    };
    let same_credit = match (&a.credit, &b.credit) {
        (Some(x), Some(y)) => x.key == y.key && x.args == y.args,
        (None, None) => true,
        _ => false,
    };
    a.key == b.key && a.gcra == b.gcra && a.op == b.op && same_step && same_credit
}

/// `batch` in runs, in order: under load most of a batch is a few hot keys' requests.
pub(super) fn runs(batch: &[Pending]) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for (i, p) in batch.iter().enumerate() {
        match runs.last_mut() {
            Some(run) if run.len < Run::MAX && alike(&batch[i - 1], p) && Run::repeats(p) => {
                run.len += 1
            }
            _ => runs.push(Run::of(p)),
        }
    }
    runs
}

/// `EVALSHA hash` or `EVAL script`, then the batch's distinct keys, its distinct parameter
/// pairs and its runs packed (a second decision's right after its first's).
pub(super) fn script_cmd(verb: &str, script: &str, batch: &[Pending], runs: &[Run]) -> Cmd {
    let mut pairs = Distinct::default();
    let mut keys = Distinct::default();
    let mut ops = Vec::with_capacity(runs.len() * 10);
    let mut credits: Vec<u8> = Vec::new();
    let mut at = 0;
    for run in runs {
        let p = &batch[at];
        at += run.len;
        let paired = if p.then.is_some() { 0x8000 } else { 0 };
        let credit = if p.credit.is_some() { 0x4000 } else { 0 };
        ops.extend_from_slice(&(run.len as u16 | paired | credit).to_be_bytes());
        let first = (p.key.as_str(), &p.gcra, p.op);
        let then = p.then.as_ref().map(|t| (t.key.as_str(), &t.gcra, t.op));
        for (key, gcra, op) in std::iter::once(first).chain(then) {
            let key = keys.index(key);
            let code = pairs.index((gcra.interval(), gcra.burst())) * 8 + op.code() as usize;
            // At most 2 * MAX_BATCH keys and pairs, so both fit in a u16.
            ops.extend_from_slice(&(key as u16).to_be_bytes());
            ops.extend_from_slice(&(code as u16).to_be_bytes());
        }
        if let Some(c) = &p.credit {
            let key = keys.index(c.key.as_str());
            // One spend per decision of a batch, at most MAX_BATCH: a u16.
            let index = credits.len() / 64;
            ops.extend_from_slice(&(key as u16).to_be_bytes());
            ops.extend_from_slice(&(index as u16).to_be_bytes());
            credits.extend(c.args.iter().flat_map(|a| a.to_le_bytes()));
        }
    }
    let key_bytes: usize = keys.items.iter().map(|k| k.len()).sum();
    // Sized once (the key count has at most 20 digits), so no argument regrows it.
    let mut cmd = Cmd::with_capacity(
        6 + keys.items.len(),
        verb.len()
            + script.len()
            + 60
            + key_bytes
            + pairs.items.len() * 16
            + ops.len()
            + credits.len(),
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
    cmd.arg(credits);
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

/// The script's reply to `runs`: seconds, microseconds, then per run the debt its first
/// decision saw and, if paired, the second's (or -1: skipped), each a little-endian double.
/// Each later decision of a run saw what the one before it left, as [`Gcra::apply`] gives
/// it: the rule the script applies.
pub(super) fn parse(value: Value, runs: &[Run]) -> RedisResult<Vec<Answer>> {
    let bad = || {
        RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "unexpected rate-limit script reply",
        ))
    };
    let Value::BulkString(bytes) = value else {
        return Err(bad());
    };
    let n = runs.len()
        + runs.iter().filter(|run| run.then.is_some()).count()
        + runs.iter().filter(|run| run.credit.is_some()).count();
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
    let int = |v: Option<f64>| match v {
        Some(v) if (0.0..18_446_744_073_709_551_616.0).contains(&v) && v.fract() == 0.0 => {
            Ok(Some(v as u64))
        }
        Some(-1.0) => Ok(None),
        _ => Err(bad()),
    };
    let now_s = int(numbers.next())?.ok_or_else(bad)?;
    let now_us = int(numbers.next())?.ok_or_else(bad)?;
    let now = now_s
        .saturating_mul(1_000_000_000)
        .saturating_add(now_us.saturating_mul(1_000));
    let mut answers = Vec::with_capacity(runs.iter().map(|run| run.len).sum());
    for run in runs {
        let mut debt = int(numbers.next())?.ok_or_else(bad)?;
        let mut then = match run.then {
            Some(_) => int(numbers.next())?,
            None => None,
        };
        // The credit count before the run (a whole number), or -1: none allowed.
        let mut count = match run.credit {
            None => None,
            Some(_) => match numbers.next() {
                Some(-1.0) => None,
                Some(v) if v >= 0.0 && v.fract() == 0.0 && v < 9.0e15 => Some(v as u64),
                _ => return Err(bad()),
            },
        };
        let (gcra, op) = run.first;
        for _ in 0..run.len {
            // Each allowed decision spends the cost while the count lasts, as the script did.
            let allowed = match (run.then, then) {
                (Some((g, o)), Some(d)) => g.apply(o, d).allowed,
                (Some(_), None) => false,
                (None, _) => gcra.apply(op, debt).allowed,
            };
            let credit = match (count.as_mut(), run.credit) {
                (Some(left), Some(cost)) if allowed && *left >= cost => {
                    *left -= cost;
                    Some(Credited::Spent(*left))
                }
                (Some(left), Some(_)) if allowed => Some(Credited::Short(*left)),
                _ => None,
            };
            answers.push(Answer {
                now,
                debt,
                then,
                credit,
            });
            debt = gcra.apply(op, debt).debt_after;
            if let (Some(d), Some((gcra, op))) = (then, run.then) {
                then = Some(gcra.apply(op, d).debt_after);
            }
        }
    }
    Ok(answers)
}

#[cfg(test)]
mod tests;
