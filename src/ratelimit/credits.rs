//! Usage credits: a key's count, spent by each request that passes
//! authorization and set back to the refill's amount at each boundary.
//!
//! On the local backend the count lives here ([`CreditBook`]), exact for
//! this instance, and is written to the store every second and on drain
//! ([`CreditBook::take_written`]); a crash gives back at most the spends of
//! that second. On Redis the count lives in one Redis key per API key,
//! spent by one script ([`SCRIPT`]) that reads Redis's own clock for the
//! refill, so two instances crossing a boundary together refill once; the
//! book then keeps the last count each instance saw, for the response
//! header of a request that spends nothing and for the store's copy.
//! While Redis fails, `on_backend_error = "local"` spends from this
//! instance's share of that count ([`CreditBook::spend_share`]): the count
//! divided by the instances that share the limiter (`ratelimit::instances`).
use std::sync::{Arc, Mutex, MutexGuard};

use foldhash::HashMap;

use crate::store::sql::SqlStore;
use crate::store::Credits;

/// What a key's credits are spent against: its id, its creation time (the
/// refill periods count from it), its credits as the store had them, and
/// what the request costs.
#[derive(Debug, Clone, Copy)]
pub struct CreditSpend<'a> {
    /// The key id.
    pub key_id: &'a str,
    /// The key's creation, unix seconds.
    pub created_at: i64,
    /// The key's credits as cached.
    pub credits: Credits,
    /// Credits this request spends (the route's `cost`).
    pub cost: u64,
}

/// The outcome of a spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spent {
    /// Spent; this many are left.
    Spent(u64),
    /// Too few left (this many): nothing spent. `retry_after`: seconds to
    /// the next refill, if there is one.
    Exhausted {
        /// The count left.
        remaining: u64,
        /// Whole seconds to the next refill.
        retry_after: Option<u64>,
    },
    /// The backend could not answer and `on_backend_error = "deny"`.
    Unavailable,
}

/// What a credit step in a decision's Redis call made of a key's count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Credited {
    /// Spent: this many are left.
    Spent(u64),
    /// Too few for the cost (this many): nothing spent.
    Short(u64),
}

/// One key's count as this instance knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Count {
    pub(super) generation: i64,
    pub(super) period: i64,
    pub(super) remaining: u64,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    count: Count,
    /// Changed since the store's copy was last written.
    dirty: bool,
    /// While Redis fails: what this instance may still spend of `count`.
    share: Option<Share>,
}

/// An instance's part of a count it last saw in Redis, taken when Redis
/// first fails for the key, and again at a refill or a new setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Share {
    generation: i64,
    period: i64,
    left: u64,
}

/// Counts by key id: the local backend's own, or the last Redis answered.
#[derive(Debug, Default)]
pub struct CreditBook {
    entries: Mutex<HashMap<Box<str>, Entry>>,
}

// === impl Entry ===

impl Entry {
    /// The share taken of this very count (not of an older setting or
    /// period), if one was taken.
    fn live_share(&self) -> Option<Share> {
        let c = self.count;
        self.share
            .filter(|s| (s.generation, s.period) == (c.generation, c.period))
    }
}

// === impl Count ===

impl Count {
    /// The count `spend`'s cached credits give at `now`.
    fn of(spend: &CreditSpend<'_>, now: i64) -> Count {
        let c = &spend.credits;
        Count {
            generation: c.generation,
            period: c.period_at(spend.created_at, now),
            remaining: c.remaining_at(spend.created_at, now),
        }
    }

    /// This count at `now`, refilled if a boundary has passed.
    fn refilled(self, spend: &CreditSpend<'_>, now: i64) -> Count {
        let period = spend.credits.period_at(spend.created_at, now);
        match spend.credits.refill {
            Some(r) if period > self.period => Count {
                period,
                remaining: r.amount,
                ..self
            },
            _ => self,
        }
    }
}

// === impl CreditBook ===

impl CreditBook {
    fn entries(&self) -> MutexGuard<'_, HashMap<Box<str>, Entry>> {
        // Every critical section is a few field updates: poison is harmless.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The local backend's spend: exact within this instance.
    pub fn spend(&self, spend: &CreditSpend<'_>, now: i64) -> Spent {
        let mut entries = self.entries();
        let entry = self.current(&mut entries, spend, now);
        if entry.count.remaining < spend.cost {
            return exhausted(spend, entry.count.remaining, now);
        }
        entry.count.remaining -= spend.cost;
        entry.dirty = true;
        Spent::Spent(entry.count.remaining)
    }

    /// The spend while Redis fails (`on_backend_error = "local"`), from this
    /// instance's share of the count it last saw: the count divided by the
    /// `instances` sharing the limiter, so that together they spend no more
    /// than that count. The share is taken once per count: a refill or a new
    /// setting takes a new one, a Redis answer ([`Self::note`]) ends it.
    pub fn spend_share(&self, spend: &CreditSpend<'_>, now: i64, instances: u64) -> Spent {
        let mut entries = self.entries();
        let entry = self.current(&mut entries, spend, now);
        let c = entry.count;
        let share = entry.live_share().unwrap_or(Share {
            generation: c.generation,
            period: c.period,
            left: c.remaining / instances.max(1),
        });
        if share.left < spend.cost {
            entry.share = Some(share);
            return exhausted(spend, share.left, now);
        }
        entry.share = Some(Share {
            left: share.left - spend.cost,
            ..share
        });
        entry.count.remaining = c.remaining.saturating_sub(spend.cost);
        entry.dirty = true;
        Spent::Spent(share.left - spend.cost)
    }

    /// Gives back what `spend` spent, to the count it came from (a count set
    /// again or refilled since keeps its new value).
    pub fn refund(&self, spend: &CreditSpend<'_>, now: i64) {
        let mut entries = self.entries();
        let period = spend.credits.period_at(spend.created_at, now);
        if let Some(e) = entries.get_mut(spend.key_id) {
            if e.count.generation == spend.credits.generation && e.count.period == period {
                e.count.remaining += spend.cost;
                e.dirty = true;
                if let Some(share) = e.live_share() {
                    e.share = Some(Share {
                        left: share.left + spend.cost,
                        ..share
                    });
                }
            }
        }
    }

    /// The count left now, spending nothing: what this instance last knew,
    /// or while Redis fails, what is left of its share.
    pub fn peek(&self, spend: &CreditSpend<'_>, now: i64) -> u64 {
        let mut entries = self.entries();
        let entry = self.current(&mut entries, spend, now);
        entry.live_share().map_or(entry.count.remaining, |s| s.left)
    }

    /// Notes a count Redis answered with, for [`Self::peek`] and the store.
    pub(super) fn note(&self, key_id: &str, count: Count) {
        let mut entries = self.entries();
        let entry = Entry {
            count,
            dirty: true,
            share: None,
        };
        match entries.get_mut(key_id) {
            Some(e) => *e = entry,
            None => {
                entries.insert(key_id.into(), entry);
            }
        }
    }

    /// The entry of `spend`'s key at `now`: made from the cached credits the
    /// first time, replaced when they are of a newer generation (set since),
    /// refilled when a boundary has passed.
    fn current<'e>(
        &self,
        entries: &'e mut HashMap<Box<str>, Entry>,
        spend: &CreditSpend<'_>,
        now: i64,
    ) -> &'e mut Entry {
        let fresh = || Entry {
            count: Count::of(spend, now),
            dirty: false,
            share: None,
        };
        let entry = entries.entry(spend.key_id.into()).or_insert_with(fresh);
        if entry.count.generation < spend.credits.generation {
            *entry = fresh();
        }
        let refilled = entry.count.refilled(spend, now);
        if refilled != entry.count {
            entry.count = refilled;
            entry.dirty = true;
        }
        entry
    }

    /// The counts changed since the last call, as (key id, generation,
    /// period, remaining), marked written. Ones the store could not take
    /// go back with [`Self::unwritten`].
    pub fn take_written(&self) -> Vec<(String, i64, i64, u64)> {
        let mut entries = self.entries();
        let mut out = Vec::new();
        for (id, entry) in entries.iter_mut().filter(|(_, e)| e.dirty) {
            entry.dirty = false;
            let c = entry.count;
            out.push((id.to_string(), c.generation, c.period, c.remaining));
        }
        out
    }

    /// Marks `counts` (from [`Self::take_written`]) to be written again,
    /// unless they changed meanwhile.
    pub fn unwritten(&self, counts: &[(String, i64, i64, u64)]) {
        let mut entries = self.entries();
        for (id, ..) in counts {
            if let Some(e) = entries.get_mut(id.as_str()) {
                e.dirty = true;
            }
        }
    }
}

/// How often counts are written to the store.
pub const WRITE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Writes `book`'s changed counts to `store` every [`WRITE_EVERY`] until
/// the book is dropped; [`write_credits`] writes the last at a stop.
pub fn spawn_credit_writer(store: SqlStore, book: &Arc<CreditBook>) {
    let weak = Arc::downgrade(book);
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(WRITE_EVERY);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let Some(book) = weak.upgrade() else { break };
            write_credits(&store, &book).await;
        }
    });
}

/// Writes `book`'s changed counts to `store` now; a failure keeps them for
/// the next write.
pub async fn write_credits(store: &SqlStore, book: &CreditBook) {
    let counts = book.take_written();
    if counts.is_empty() {
        return;
    }
    if let Err(e) = store.write_back_credits(&counts).await {
        tracing::warn!(error = %e, keys = counts.len(), "writing credit counts failed; will retry");
        book.unwritten(&counts);
    }
}

/// The refusal of a spend with `remaining` left at `now`.
fn exhausted(spend: &CreditSpend<'_>, remaining: u64, now: i64) -> Spent {
    let next = spend.credits.next_refill(spend.created_at, now);
    Spent::Exhausted {
        remaining,
        retry_after: next.map(|at| (at - now).max(1) as u64),
    }
}

/// A credit step's outcome in a decision's call ([`Credited`]), noted in
/// `book` (the period it was counted in is the one at `now`).
pub(super) fn credited(
    book: &CreditBook,
    spend: &CreditSpend<'_>,
    credited: Credited,
    now: i64,
) -> Spent {
    let remaining = match credited {
        Credited::Spent(n) | Credited::Short(n) => n,
    };
    let count = Count {
        generation: spend.credits.generation,
        period: spend.credits.period_at(spend.created_at, now),
        remaining,
    };
    book.note(spend.key_id, count);
    match credited {
        Credited::Spent(n) => Spent::Spent(n),
        Credited::Short(n) => exhausted(spend, n, now),
    }
}

/// The outcome of Redis's answer to [`SCRIPT`], noted in `book`.
pub(super) fn answered(book: &CreditBook, spend: &CreditSpend<'_>, reply: [i64; 5]) -> Spent {
    let [ok, remaining, generation, period, now] = reply;
    let count = Count {
        generation,
        period,
        remaining: remaining.max(0) as u64,
    };
    book.note(spend.key_id, count);
    if ok == 1 {
        Spent::Spent(count.remaining)
    } else {
        exhausted(spend, count.remaining, now)
    }
}

/// The spend on Redis. KEYS[1]: the key's count, `generation:period:remaining`.
/// ARGV: the cached credits' generation, the key's creation (unix s), the
/// refill interval (s, 0: none), its amount, the cached period and count,
/// the cost, and the count's time to live (ms). A stored count of an older
/// generation than the cached one (the credits were set since) is replaced
/// by the cached one; a newer one (this instance's cache is behind) is
/// kept. The period is counted on Redis's clock, so every instance agrees
/// on when a refill happens, and it happens once. Returns spent (1 or 0),
/// the count left, its generation and period, and Redis's time (unix s).
pub(super) const SCRIPT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1])
local gen = tonumber(ARGV[1])
local created = tonumber(ARGV[2])
local interval = tonumber(ARGV[3])
local amount = tonumber(ARGV[4])
local g, p, r = gen, tonumber(ARGV[5]), tonumber(ARGV[6])
local cost = tonumber(ARGV[7])
local v = redis.call('GET', KEYS[1])
if v then
  local sg, sp, sr = string.match(v, '^(%d+):(%d+):(%d+)$')
  if sg and tonumber(sg) >= gen then
    g = tonumber(sg); p = tonumber(sp); r = tonumber(sr)
  end
end
if interval > 0 then
  local np = math.floor(math.max(now - created, 0) / interval)
  if np > p then p = np; r = amount end
end
local ok = 0
if r >= cost then r = r - cost; ok = 1 end
redis.call('SET', KEYS[1], string.format('%d:%d:%d', g, p, r), 'PX', ARGV[8])
return { ok, r, g, p, now }
"#;

/// How long Redis keeps a count nobody spends from: a month, or two refill
/// intervals if longer. Once it is gone, the store's copy starts it again.
pub(super) fn ttl_ms(credits: &Credits) -> u64 {
    let month = 30 * 86_400_000;
    credits
        .refill
        .map_or(month, |r| (2 * r.interval.as_millis() as u64).max(month))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Refill;
    use std::time::Duration;

    fn spend(credits: Credits, cost: u64) -> CreditSpend<'static> {
        CreditSpend {
            key_id: "key_1",
            created_at: 1000,
            credits,
            cost,
        }
    }

    #[test]
    fn a_count_is_spent_exactly_and_refused_at_zero() {
        let book = CreditBook::default();
        let c = Credits::new(3, None, 1000, 1000);
        let s = spend(c, 1);
        assert_eq!(book.spend(&s, 1001), Spent::Spent(2));
        assert_eq!(book.spend(&spend(c, 2), 1001), Spent::Spent(0));
        assert_eq!(
            book.spend(&s, 1002),
            Spent::Exhausted {
                remaining: 0,
                retry_after: None
            }
        );
        assert_eq!(book.peek(&s, 1003), 0);
        assert_eq!(book.take_written(), vec![("key_1".into(), 0, 0, 0)]);
        assert!(book.take_written().is_empty());
    }

    #[test]
    fn a_boundary_refills_once_and_a_new_generation_replaces_the_count() {
        let book = CreditBook::default();
        let refill = Refill {
            amount: 5,
            interval: Duration::from_secs(60),
        };
        let mut c = Credits::new(1, Some(refill), 1000, 1000);
        assert_eq!(book.spend(&spend(c, 1), 1010), Spent::Spent(0));
        assert_eq!(
            book.spend(&spend(c, 1), 1059),
            Spent::Exhausted {
                remaining: 0,
                retry_after: Some(1)
            }
        );
        assert_eq!(book.spend(&spend(c, 1), 1060), Spent::Spent(4));
        assert_eq!(book.spend(&spend(c, 1), 1061), Spent::Spent(3));
        // Set again (a newer generation): the count starts from the new setting.
        c.generation = 1;
        c.remaining = 50;
        c.period = 1;
        assert_eq!(book.spend(&spend(c, 10), 1062), Spent::Spent(40));
        // A stale cached copy (older generation) does not reset it.
        c.generation = 0;
        assert_eq!(book.spend(&spend(c, 10), 1063), Spent::Spent(30));
    }

    #[test]
    fn while_redis_fails_each_instance_spends_its_share_of_the_last_count() {
        let book = CreditBook::default();
        let refill = Refill {
            amount: 10,
            interval: Duration::from_secs(60),
        };
        let c = Credits::new(10, Some(refill), 1000, 1000);
        let count = |remaining| Count {
            generation: 0,
            period: 0,
            remaining,
        };
        book.note("key_1", count(9));
        // Two instances: this one may spend 4 of the 9 it saw, the other 4.
        for left in [3, 2, 1, 0] {
            assert_eq!(book.spend_share(&spend(c, 1), 1010, 2), Spent::Spent(left));
        }
        let refused = book.spend_share(&spend(c, 1), 1011, 2);
        assert_eq!(
            refused,
            Spent::Exhausted {
                remaining: 0,
                retry_after: Some(49)
            }
        );
        // The header shows the share; the store gets the count less what
        // this instance spent.
        assert_eq!(book.peek(&spend(c, 1), 1011), 0);
        assert_eq!(book.take_written(), vec![("key_1".into(), 0, 0, 5)]);
        // A refund goes back to the share; a refill takes a new share.
        book.refund(&spend(c, 1), 1012);
        assert_eq!(book.spend_share(&spend(c, 1), 1012, 2), Spent::Spent(0));
        assert_eq!(book.spend_share(&spend(c, 1), 1060, 2), Spent::Spent(4));
        // Redis answers again: its count, and a new share after it.
        book.note(
            "key_1",
            Count {
                period: 1,
                ..count(7)
            },
        );
        assert_eq!(book.spend_share(&spend(c, 1), 1061, 3), Spent::Spent(1));
    }
}
