//! Time sources for the limiters: Unix time in integer nanoseconds.
//!
//! The real clock is monotonic (an `Instant` offset) mapped to Unix time once at start, so
//! a wall-clock step never refills or drains buckets. Tests inject [`ManualClock`] and move
//! time by hand instead of sleeping.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of "now" as Unix time in nanoseconds.
pub trait Clock: Send + Sync + 'static {
    /// Current Unix time in nanoseconds. Must never go backwards.
    fn now_nanos(&self) -> u64;
}

/// The production clock: monotonic time since construction plus the Unix time read once then.
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    start: Instant,
    start_unix_nanos: u64,
}

impl SystemClock {
    /// Reads the wall clock once; every later reading is that plus monotonic elapsed time.
    pub fn new() -> Self {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Self {
            start: Instant::now(),
            start_unix_nanos: saturating_nanos(since_epoch),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now_nanos(&self) -> u64 {
        self.start_unix_nanos.saturating_add(saturating_nanos(
            crate::clock::now().saturating_duration_since(self.start),
        ))
    }
}

/// A clock that only moves when told to (tests and simulations).
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
}

impl ManualClock {
    /// A clock standing at `unix_nanos`.
    pub fn new(unix_nanos: u64) -> Self {
        Self {
            now: AtomicU64::new(unix_nanos),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(saturating_nanos(by), Ordering::SeqCst);
    }

    /// Sets the clock to `unix_nanos` (callers keep it monotonic).
    pub fn set(&self, unix_nanos: u64) {
        self.now.store(unix_nanos, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_nanos(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}

/// `d` in nanoseconds, saturating at `u64::MAX` (year 2554).
pub(crate) fn saturating_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_is_close_to_wall_clock_and_monotonic() {
        let clock = SystemClock::new();
        let wall = saturating_nanos(SystemTime::now().duration_since(UNIX_EPOCH).unwrap());
        let a = clock.now_nanos();
        let b = clock.now_nanos();
        assert!(b >= a);
        assert!(a.abs_diff(wall) < 1_000_000_000, "{a} vs {wall}");
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(5);
        assert_eq!(clock.now_nanos(), 5);
        clock.advance(Duration::from_nanos(7));
        assert_eq!(clock.now_nanos(), 12);
        clock.set(100);
        assert_eq!(clock.now_nanos(), 100);
    }
}
