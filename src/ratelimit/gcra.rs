//! The pure GCRA arithmetic, in integer nanoseconds, shared by both backends.
//!
//! State is one number per key, the theoretical arrival time `tat`. Everything here works on
//! the key's *debt* `d = max(tat - now, 0)` (how far the bucket is from full, clamped to the
//! burst tolerance), because that is what the Redis script can compute exactly with Lua's
//! doubles: the script finds `d`, applies the same rule as [`Gcra::apply`] and hands `d` back,
//! and the Decision is built here from it. So both backends agree to the nanosecond.

use super::clock::saturating_nanos;
use super::{Decision, Quota};

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// Largest burst tolerance, in ns, that a Lua double still holds exactly (2^53 - 1).
pub(crate) const MAX_BURST_NANOS: u64 = (1 << 53) - 1;

/// What a request does to its bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// Take one token if there is one (a refused request costs nothing).
    Check,
    /// Report whether a token is there, without taking it.
    Peek,
    /// Record one unit of cost even when no whole token is left: the bucket drains to empty,
    /// never beyond (used for authentication failures, which have already happened).
    Consume,
    /// Give back one token taken before (an authentication-failure token taken ahead
    /// of a lookup that then succeeded): the bucket fills by one, never past full.
    Refund,
}

impl Op {
    /// The operation's name in a trace.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::Check => "check",
            Op::Peek => "peek",
            Op::Consume => "consume",
            Op::Refund => "refund",
        }
    }

    /// The op's code in the Redis script's arguments.
    pub(crate) fn code(self) -> u64 {
        match self {
            Op::Check => 0,
            Op::Peek => 1,
            Op::Consume => 2,
            Op::Refund => 3,
        }
    }
}

/// The result of applying an [`Op`] to a key's debt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// Whether a whole token was there (for `Check`, whether it was taken).
    pub(crate) allowed: bool,
    /// The debt before the op (clamped to the burst tolerance).
    pub(crate) debt_before: u64,
    /// The debt after the op: the new `tat` is `now + debt_after`.
    pub(crate) debt_after: u64,
}

/// One policy's GCRA parameters, precomputed from its [`Quota`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Gcra {
    capacity: u32,
    /// Emission interval `T`, ns (at least 1).
    interval: u64,
    /// Burst tolerance `capacity * T`, ns.
    burst: u64,
    window_secs: u64,
}

impl Gcra {
    /// Precomputes `T = period / capacity` (rounded down, at least 1 ns) and `c * T`.
    pub(crate) fn new(quota: &Quota) -> Self {
        let capacity = quota.capacity.get();
        let period = saturating_nanos(quota.period).min(MAX_BURST_NANOS);
        let interval = (period / u64::from(capacity)).max(1);
        // interval <= period / capacity unless period < capacity, where it is 1 and the
        // product is capacity <= u32::MAX: either way no overflow and <= 2^53 - 1.
        let burst = interval * u64::from(capacity);
        Self {
            capacity,
            interval,
            burst,
            window_secs: div_ceil(period, NANOS_PER_SEC).max(1),
        }
    }

    /// Emission interval `T` in ns.
    pub(crate) fn interval(&self) -> u64 {
        self.interval
    }

    /// Burst tolerance `c * T` in ns.
    pub(crate) fn burst(&self) -> u64 {
        self.burst
    }

    /// Debt of a key whose stored `tat` is `tat` at time `now`.
    pub(crate) fn debt(&self, tat: u64, now: u64) -> u64 {
        tat.saturating_sub(now).min(self.burst)
    }

    /// Applies `op` to a key with debt `debt` (the same rule as the Redis script).
    pub(crate) fn apply(&self, op: Op, debt: u64) -> Outcome {
        let debt = debt.min(self.burst);
        let needed = debt + self.interval;
        let allowed = needed <= self.burst;
        let debt_after = match op {
            Op::Check if allowed => needed,
            Op::Check | Op::Peek => debt,
            Op::Consume => needed.min(self.burst),
            Op::Refund => debt.saturating_sub(self.interval),
        };
        Outcome {
            allowed,
            debt_before: debt,
            debt_after,
        }
    }

    /// The Decision (and so the headers) for `outcome` at Unix time `now` (ns).
    pub(crate) fn decision(&self, now: u64, outcome: &Outcome) -> Decision {
        let remaining = (self.burst - outcome.debt_after) / self.interval;
        let retry_after_secs = if outcome.allowed {
            None
        } else {
            let wait = outcome.debt_before + self.interval - self.burst;
            Some(div_ceil(wait, NANOS_PER_SEC).max(1))
        };
        Decision {
            allowed: outcome.allowed,
            limit: self.capacity,
            remaining: u32::try_from(remaining).unwrap_or(self.capacity),
            reset_unix: div_ceil(now.saturating_add(outcome.debt_after), NANOS_PER_SEC),
            retry_after_secs,
            reset_after_secs: div_ceil(outcome.debt_after, NANOS_PER_SEC),
            window_secs: self.window_secs,
        }
    }

    /// A refusal not based on any bucket (backend down with `deny`): retry in one second.
    pub(crate) fn deny_decision(&self, now: u64) -> Decision {
        Decision {
            allowed: false,
            limit: self.capacity,
            remaining: 0,
            reset_unix: div_ceil(now, NANOS_PER_SEC) + 1,
            retry_after_secs: Some(1),
            reset_after_secs: 1,
            window_secs: self.window_secs,
        }
    }

    /// An admission not based on any bucket (backend down with `allow`): a full bucket.
    pub(crate) fn allow_decision(&self, now: u64) -> Decision {
        self.decision(now, &self.apply(Op::Peek, 0))
    }
}

/// The refusal given for a [`super::PolicyId`] that was never registered (fail closed).
pub(crate) fn unknown_policy_decision(now: u64) -> Decision {
    Decision {
        allowed: false,
        limit: 0,
        remaining: 0,
        reset_unix: div_ceil(now, NANOS_PER_SEC) + 1,
        retry_after_secs: Some(1),
        reset_after_secs: 1,
        window_secs: 1,
    }
}

fn div_ceil(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroU32;
    use std::time::Duration;

    fn gcra(capacity: u32, period: Duration) -> Gcra {
        Gcra::new(&Quota::new(NonZeroU32::new(capacity).unwrap(), period))
    }

    const NOW: u64 = 1_700_000_000 * NANOS_PER_SEC + 250_000_000; // x.25 s

    #[test]
    fn parameters_are_integer_nanoseconds() {
        let g = gcra(3, Duration::from_secs(1));
        assert_eq!(g.interval(), 333_333_333);
        assert_eq!(g.burst(), 999_999_999);
        assert_eq!(g.window_secs, 1);
        let tiny = gcra(10, Duration::from_nanos(5));
        assert_eq!((tiny.interval(), tiny.burst()), (1, 10));
        let huge = gcra(1, Duration::from_secs(400 * 86_400));
        assert_eq!(huge.burst(), MAX_BURST_NANOS);
        assert_eq!(gcra(2, Duration::from_millis(500)).window_secs, 1);
        assert_eq!(gcra(2, Duration::from_millis(1500)).window_secs, 2);
    }

    #[test]
    fn check_counts_down_and_refusal_costs_nothing() {
        let g = gcra(5, Duration::from_secs(60)); // T = 12 s
        let mut debt = 0;
        for expected in [4, 3, 2, 1, 0] {
            let out = g.apply(Op::Check, debt);
            assert!(out.allowed);
            debt = out.debt_after;
            let d = g.decision(NOW, &out);
            assert_eq!(d.remaining, expected);
            assert_eq!(d.limit, 5);
            assert_eq!(d.retry_after_secs, None);
        }
        assert_eq!(debt, 60 * NANOS_PER_SEC);
        let refused = g.apply(Op::Check, debt);
        assert!(!refused.allowed);
        assert_eq!(refused.debt_after, debt, "a refused request costs nothing");
        let d = g.decision(NOW, &refused);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.retry_after_secs, Some(12));
        // Full again 60 s after now (x.25 s), rounded up.
        assert_eq!(d.reset_unix, 1_700_000_061);
        assert_eq!(d.reset_after_secs, 60);
        assert_eq!(d.window_secs, 60);
    }

    #[test]
    fn first_request_headers_are_exact() {
        let g = gcra(100, Duration::from_secs(60)); // T = 600 ms
        let out = g.apply(Op::Check, g.debt(0, NOW));
        assert_eq!(out.debt_after, 600_000_000);
        let d = g.decision(NOW, &out);
        assert_eq!(d.remaining, 99);
        // NOW + 0.6 s = x.85 s -> rounds up to x+1.
        assert_eq!(d.reset_unix, 1_700_000_001);
        assert_eq!(d.reset_after_secs, 1);
    }

    #[test]
    fn retry_after_rounds_up_and_is_at_least_one() {
        let g = gcra(2, Duration::from_secs(3)); // T = 1.5 s, burst 3 s

        // Empty bucket: the next token is T away: 1.5 s -> 2.
        let d = g.decision(NOW, &g.apply(Op::Check, 3 * NANOS_PER_SEC));
        assert_eq!(d.retry_after_secs, Some(2));
        // 1 ns short of a token: rounds up to 1, never 0.
        let d = g.decision(NOW, &g.apply(Op::Check, 1_500_000_001));
        assert!(!d.allowed);
        assert_eq!(d.retry_after_secs, Some(1));
        // Exactly one token: allowed.
        assert!(g.apply(Op::Check, 1_500_000_000).allowed);
    }

    #[test]
    fn refill_after_one_interval() {
        let g = gcra(2, Duration::from_secs(2)); // T = 1 s
        let tat = NOW + 2 * NANOS_PER_SEC; // empty
        assert!(!g.apply(Op::Check, g.debt(tat, NOW)).allowed);
        assert!(
            !g.apply(Op::Check, g.debt(tat, NOW + NANOS_PER_SEC - 1))
                .allowed
        );
        let later = NOW + NANOS_PER_SEC;
        let out = g.apply(Op::Check, g.debt(tat, later));
        assert!(out.allowed);
        assert_eq!(g.decision(later, &out).remaining, 0);
        // Long idle: debt is zero, bucket full.
        assert_eq!(g.debt(tat, NOW + 100 * NANOS_PER_SEC), 0);
    }

    #[test]
    fn remaining_uses_floor_of_partial_tokens() {
        let g = gcra(10, Duration::from_secs(10)); // T = 1 s

        // Debt 2.5 s after the op: 7.5 tokens left -> 7.
        let out = g.apply(Op::Check, 1_500_000_000);
        assert_eq!(out.debt_after, 2_500_000_000);
        assert_eq!(g.decision(NOW, &out).remaining, 7);
    }

    #[test]
    fn peek_never_changes_state() {
        let g = gcra(2, Duration::from_secs(2));
        let full = g.apply(Op::Peek, 0);
        assert_eq!((full.allowed, full.debt_after), (true, 0));
        let d = g.decision(NOW, &full);
        assert_eq!(d.remaining, 2);
        assert_eq!(d.reset_unix, 1_700_000_001);
        let empty = g.apply(Op::Peek, 2 * NANOS_PER_SEC);
        assert_eq!(
            (empty.allowed, empty.debt_after),
            (false, 2 * NANOS_PER_SEC)
        );
    }

    #[test]
    fn consume_drains_to_empty_but_never_beyond() {
        let g = gcra(2, Duration::from_secs(2)); // T = 1 s, burst 2 s
        let out = g.apply(Op::Consume, 1_500_000_000);
        assert!(!out.allowed);
        assert_eq!(out.debt_after, 2 * NANOS_PER_SEC);
        let out = g.apply(Op::Consume, 2 * NANOS_PER_SEC);
        assert_eq!(out.debt_after, 2 * NANOS_PER_SEC);
        assert!(g.apply(Op::Consume, 0).allowed);
    }

    #[test]
    fn debt_is_clamped_to_the_burst() {
        let g = gcra(2, Duration::from_secs(2));
        assert_eq!(g.debt(NOW + 50 * NANOS_PER_SEC, NOW), 2 * NANOS_PER_SEC);
        let out = g.apply(Op::Check, u64::MAX);
        assert_eq!(out.debt_before, 2 * NANOS_PER_SEC);
        assert_eq!(g.decision(NOW, &out).retry_after_secs, Some(1));
    }

    #[test]
    fn fallback_decisions() {
        let g = gcra(7, Duration::from_secs(7));
        let deny = g.deny_decision(NOW);
        assert!(!deny.allowed);
        assert_eq!(
            (deny.limit, deny.remaining, deny.retry_after_secs),
            (7, 0, Some(1))
        );
        assert_eq!(deny.reset_unix, 1_700_000_002);
        let allow = g.allow_decision(NOW);
        assert!(allow.allowed);
        assert_eq!((allow.remaining, allow.retry_after_secs), (7, None));
        assert!(!unknown_policy_decision(NOW).allowed);
    }
}
