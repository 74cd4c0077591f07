//! A failure that repeats on every request (an upstream refusing
//! connections, the key store down, the Redis limiter timing out, TLS
//! handshakes failing) logged as one incident: its first failure at once,
//! with its cause; then, while failures go on, their count at most once per
//! summary interval (`[log] summary_interval`, 10 s by default); and one
//! line when its source answers again. The access log and the metrics count
//! every request; the diagnostic log says what changed.
//!
//! A failure costs a few atomic operations on the incident's own counters
//! (no lock, no allocation); the caller that wins a compare-and-swap writes
//! the line. A source with no success signal cheap enough to watch (TLS
//! handshakes) gets no recovery line: a failure after a quiet interval
//! begins a new incident, with its cause.
//!
//! Times are milliseconds on the caller's clock ([`now_ms`], or a limiter's
//! injected one), so the rules are tested without sleeping.
use std::fmt::Display;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tracing::Level;

/// `[log] summary_interval`, in milliseconds.
static SUMMARY_INTERVAL_MS: AtomicU64 = AtomicU64::new(10_000);

/// Sets how often an ongoing incident is summarized (`[log]
/// summary_interval`; at least a millisecond), for the whole process.
pub fn set_summary_interval(every: Duration) {
    let ms = u64::try_from(every.as_millis()).unwrap_or(u64::MAX).max(1);
    SUMMARY_INTERVAL_MS.store(ms, Ordering::Relaxed);
}

/// Milliseconds on the request path's clock since the first call (never 0).
pub fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(crate::clock::now);
    crate::clock::now()
        .saturating_duration_since(epoch)
        .as_millis() as u64
        + 1
}

/// One failing source's incident state.
#[derive(Debug, Default)]
pub struct Incident {
    /// When the last failure line was written; 0: never.
    last_line: AtomicU64,
    /// When the last failure was counted; 0: never.
    last_failure: AtomicU64,
    /// Failures counted that no line has reported yet.
    unreported: AtomicU64,
    /// When the incident under way began (its first line); 0: none is.
    down_since: AtomicU64,
    /// Failures its lines have reported. Written only by the caller that
    /// writes a line, so a failure touches no counter but `unreported`.
    reported: AtomicU64,
}

/// A line a failure calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line {
    /// An incident begins: log this failure with its cause. `unreported`
    /// failures came before it that no line reported (a previous
    /// incident's tail, or failures between a recovery and this line).
    Down {
        /// Earlier failures not reported yet.
        unreported: u64,
    },
    /// Failures go on: `failures` since the last line, which was `over` ago.
    Ongoing {
        /// Failures since the last line, this one included.
        failures: u64,
        /// How long ago the last line was written.
        over: Duration,
    },
}

/// The source answers again: the line that ends its incident.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recovery {
    /// Failures of the incident (with any its first line reported as
    /// earlier ones).
    pub failures: u64,
    /// How long it lasted.
    pub down_for: Duration,
}

impl Incident {
    /// No incident.
    pub const fn new() -> Self {
        Incident {
            last_line: AtomicU64::new(0),
            last_failure: AtomicU64::new(0),
            unreported: AtomicU64::new(0),
            down_since: AtomicU64::new(0),
            reported: AtomicU64::new(0),
        }
    }

    /// Counts a failure at `now` (ms); the line to write, if one is due.
    pub fn failed(&self, now: u64) -> Option<Line> {
        self.failed_every(now, SUMMARY_INTERVAL_MS.load(Ordering::Relaxed))
    }

    fn failed_every(&self, now: u64, every: u64) -> Option<Line> {
        let now = now.max(1);
        let previous = self.last_failure.swap(now, Ordering::Relaxed);
        self.unreported.fetch_add(1, Ordering::Relaxed);
        // At most one line per interval, whatever the kind.
        let last = self.last_line.load(Ordering::Acquire);
        if last != 0 && now.saturating_sub(last) < every {
            return None;
        }
        if self
            .last_line
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return None;
        }
        let reporting = self.unreported.swap(0, Ordering::Relaxed);
        let down = self.down_since.load(Ordering::Acquire);
        // A quiet spell as long as the interval ended the last incident.
        let quiet = previous == 0 || now.saturating_sub(previous) >= every;
        if down == 0 || quiet {
            self.down_since.store(now, Ordering::Release);
            self.reported.store(reporting, Ordering::Relaxed);
            Some(Line::Down {
                unreported: reporting.saturating_sub(1),
            })
        } else {
            self.reported.fetch_add(reporting, Ordering::Relaxed);
            Some(Line::Ongoing {
                failures: reporting,
                over: Duration::from_millis(now - last),
            })
        }
    }

    /// The source answered at `now` (ms): the line that ends the incident
    /// under way, if one is. One atomic load when none is.
    pub fn recovered(&self, now: u64) -> Option<Recovery> {
        if self.down_since.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let since = self.down_since.swap(0, Ordering::AcqRel);
        if since == 0 {
            return None;
        }
        let failures =
            self.reported.swap(0, Ordering::Relaxed) + self.unreported.swap(0, Ordering::Relaxed);
        Some(Recovery {
            failures,
            down_for: Duration::from_millis(now.saturating_sub(since)),
        })
    }

    /// Whether an incident is under way (a line said it began and none
    /// that it ended).
    pub fn is_down(&self) -> bool {
        self.down_since.load(Ordering::Relaxed) != 0
    }
}

/// An error and its sources, as `error: source: source`; a source whose
/// message the text already holds is not repeated. For lines about a
/// failure, whose cause is often only in a source (a refused connection).
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut text = self.0.to_string();
        let mut source = self.0.source();
        while let Some(e) = source {
            let s = e.to_string();
            if !text.contains(&s) {
                text.push_str(": ");
                text.push_str(&s);
            }
            source = e.source();
        }
        f.write_str(&text)
    }
}

/// Writes at `level`: WARN for a dependency of the gateway, INFO for what
/// clients cause.
macro_rules! event_at {
    ($level:expr, $($rest:tt)+) => {
        if $level == Level::WARN {
            tracing::warn!($($rest)+)
        } else {
            tracing::info!($($rest)+)
        }
    };
}

impl Line {
    /// Writes this line about `subject` (`upstream clusters`), whose
    /// failures are `counted` (`requests refused`), the latest from `cause`.
    pub fn log(&self, level: Level, subject: &dyn Display, counted: &str, cause: &dyn Display) {
        match *self {
            Line::Down { unreported } => event_at!(
                level,
                incident = "down",
                subject = %subject,
                error = %cause,
                unreported,
                "{subject} failing: {cause}"
            ),
            Line::Ongoing { failures, over } => event_at!(
                level,
                incident = "ongoing",
                subject = %subject,
                error = %cause,
                failures,
                seconds = over.as_secs_f64(),
                "{subject} still failing: {failures} {counted} in the last {:.1} s",
                over.as_secs_f64()
            ),
        }
    }
}

impl Recovery {
    /// Writes the line that ends the incident of `subject`.
    pub fn log(&self, level: Level, subject: &dyn Display, counted: &str) {
        let (failures, seconds) = (self.failures, self.down_for.as_secs_f64());
        event_at!(
            level,
            incident = "recovered",
            subject = %subject,
            failures,
            seconds,
            "{subject} answering again after {seconds:.1} s; {failures} {counted} in all"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVERY: u64 = 10_000;

    #[test]
    fn the_first_failure_is_a_line_then_one_count_per_interval() {
        let i = Incident::new();
        assert_eq!(
            i.failed_every(100, EVERY),
            Some(Line::Down { unreported: 0 })
        );
        for t in 101..10_100 {
            assert_eq!(i.failed_every(t, EVERY), None, "at {t}");
        }
        assert_eq!(
            i.failed_every(10_100, EVERY),
            Some(Line::Ongoing {
                failures: 10_000,
                over: Duration::from_secs(10)
            })
        );
        assert_eq!(i.failed_every(10_101, EVERY), None);
        assert!(i.is_down());
        // Every failure is in the recovery line.
        assert_eq!(
            i.recovered(12_100),
            Some(Recovery {
                failures: 10_002,
                down_for: Duration::from_millis(12_000)
            })
        );
        assert!(!i.is_down());
        assert_eq!(i.recovered(12_200), None, "one recovery line");
    }

    #[test]
    fn a_source_that_flaps_writes_at_most_a_failure_line_per_interval() {
        let i = Incident::new();
        assert!(matches!(i.failed_every(1, EVERY), Some(Line::Down { .. })));
        assert!(i.recovered(2).is_some());
        // Failing again at once: counted, not logged, and no recovery owed.
        for t in 3..100 {
            assert_eq!(i.failed_every(t, EVERY), None);
            assert_eq!(i.recovered(t), None);
        }
        // The next line is due an interval after the last: a new incident,
        // with the failures in between.
        assert_eq!(
            i.failed_every(10_001, EVERY),
            Some(Line::Down { unreported: 97 })
        );
        assert_eq!(i.recovered(10_002).unwrap().failures, 98);
    }

    #[test]
    fn a_failure_after_a_quiet_interval_begins_a_new_incident() {
        // No recovery signal (TLS handshakes): silence ends the incident.
        let i = Incident::new();
        assert!(matches!(i.failed_every(1, EVERY), Some(Line::Down { .. })));
        assert_eq!(i.failed_every(5, EVERY), None);
        assert_eq!(
            i.failed_every(3_600_000, EVERY),
            Some(Line::Down { unreported: 1 }),
            "not a count over an hour"
        );
        // Whereas failures that go on are counted over the interval.
        assert_eq!(i.failed_every(3_605_000, EVERY), None);
        assert_eq!(
            i.failed_every(3_610_000, EVERY),
            Some(Line::Ongoing {
                failures: 2,
                over: Duration::from_secs(10)
            })
        );
    }

    #[test]
    fn a_chain_names_each_cause_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("cannot connect: {0}")]
        struct Outer(#[source] Inner);
        #[derive(Debug, thiserror::Error)]
        #[error("tcp connect error")]
        struct Inner(#[source] std::io::Error);
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let e = Outer(Inner(refused));
        assert_eq!(
            Chain(&e).to_string(),
            "cannot connect: tcp connect error: connection refused"
        );
    }

    #[test]
    fn many_threads_failing_at_once_write_one_line() {
        let i = std::sync::Arc::new(Incident::new());
        let lines: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    let i = i.clone();
                    s.spawn(move || {
                        (0..10_000)
                            .filter(|_| i.failed_every(500, EVERY).is_some())
                            .count()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(lines, 1);
        assert_eq!(i.recovered(600).unwrap().failures, 80_000);
    }
}
