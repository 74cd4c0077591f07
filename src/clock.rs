//! The monotonic clock of the request path, read once per poll of a
//! connection's task: nginx (`ngx_time_update`) and HAProxy (`now_ms`) read
//! theirs once per turn of the event loop for the same reason: connection
//! deadlines, the limiter, the upstream pool and the upstream's deadline
//! would otherwise each make a `clock_gettime` call per request.
//!
//! Inside [`reading_once_per_poll`], the first [`now`] of a poll reads the
//! clock and the rest of that poll gets the same instant. A poll runs for
//! microseconds (nothing on the request path blocks), so a reading is never
//! older than that; the next poll reads afresh. Outside it (tests, other
//! tasks, HTTP/2 streams that hyper spawns) [`now`] is a fresh reading.
//!
//! A duration ended with [`now`] (a request's latency, say) is exact to
//! within the poll that ends it: microseconds.
//!
//! The wall clock ([`unix_now`], whole seconds, for key expiry and the
//! store's timestamps) is this monotonic reading plus an anchor read off the
//! system clock at most a second earlier, so a request reads no second
//! clock; a step of the system clock is followed within a second.
use std::cell::Cell;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

thread_local! {
    /// `Some(reading)` once this poll has read the clock, `None` before.
    static READING: Cell<Option<Instant>> = const { Cell::new(None) };
    /// Whether a poll of a [`reading_once_per_poll`] future is running.
    static IN_POLL: Cell<bool> = const { Cell::new(false) };
    /// A monotonic reading and the system clock's time since the epoch at
    /// it: what [`unix_now`] counts from.
    static ANCHOR: Cell<Option<(Instant, Duration)>> = const { Cell::new(None) };
}

/// How long an [`ANCHOR`] is used before the system clock is read again.
const ANCHOR_FOR: Duration = Duration::from_secs(1);

/// Seconds since the Unix epoch (0 for a clock set before it), from [`now`]
/// and an anchor at most [`ANCHOR_FOR`] old.
pub(crate) fn unix_now() -> i64 {
    let at = now();
    let since_epoch = match ANCHOR.get() {
        Some((anchored, epoch)) if at >= anchored && at - anchored < ANCHOR_FOR => {
            epoch + (at - anchored)
        }
        _ => {
            let epoch = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or(Duration::ZERO);
            ANCHOR.set(Some((at, epoch)));
            epoch
        }
    };
    i64::try_from(since_epoch.as_secs()).unwrap_or(i64::MAX)
}

/// Now: this poll's reading inside [`reading_once_per_poll`], else the clock.
pub(crate) fn now() -> Instant {
    if !IN_POLL.get() {
        return read();
    }
    match READING.get() {
        Some(reading) => reading,
        None => {
            let reading = read();
            READING.set(Some(reading));
            reading
        }
    }
}

/// The monotonic clock, through tokio's: the same `Instant::now()` in the
/// gateway, and the paused, advanced clock of the tests that pause time.
fn read() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// Runs `fut` with [`now`] read once per poll of it.
pub(crate) async fn reading_once_per_poll<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    poll_fn(|cx| {
        let _poll = Poll::enter();
        fut.as_mut().poll(cx)
    })
    .await
}

/// One poll: forgets the reading on entry and on exit (a panic included),
/// and restores whether an enclosing poll was running.
struct Poll {
    enclosing: bool,
}

impl Poll {
    fn enter() -> Poll {
        READING.set(None);
        Poll {
            enclosing: IN_POLL.replace(true),
        }
    }
}

impl Drop for Poll {
    fn drop(&mut self) {
        READING.set(None);
        IN_POLL.set(self.enclosing);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn system_secs() -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    }

    #[test]
    fn unix_now_follows_the_system_clock() {
        for _ in 0..3 {
            let (before, ours, after) = (system_secs(), unix_now(), system_secs());
            assert!(before <= ours && ours <= after, "{before} {ours} {after}");
            std::thread::sleep(Duration::from_millis(400));
        }
        // An anchor a second old is replaced: the system clock is read again.
        let stale = Instant::now() - ANCHOR_FOR - Duration::from_millis(1);
        ANCHOR.set(Some((stale, Duration::from_secs(7))));
        assert!(unix_now() >= system_secs() - 1);
        // And one from a reading later than now (another poll's) is too.
        ANCHOR.set(Some((Instant::now() + ANCHOR_FOR, Duration::from_secs(7))));
        assert!(unix_now() >= system_secs() - 1);
    }

    #[test]
    fn outside_a_poll_every_reading_is_fresh() {
        let a = now();
        std::thread::sleep(Duration::from_millis(2));
        assert!(now() >= a + Duration::from_millis(2));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn one_reading_per_poll_and_a_fresh_one_on_the_next() {
        let (first, same, next) = reading_once_per_poll(async {
            let first = now();
            std::thread::sleep(Duration::from_millis(2));
            let same = now();
            tokio::task::yield_now().await; // the next poll
            (first, same, now())
        })
        .await;
        assert_eq!(first, same);
        assert!(next >= first + Duration::from_millis(2));
        // Back outside: fresh readings again.
        let outside = now();
        std::thread::sleep(Duration::from_millis(1));
        assert!(now() > outside);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_nested_poll_reads_afresh_and_leaves_the_outer_one_running() {
        reading_once_per_poll(async {
            let outer = now();
            std::thread::sleep(Duration::from_millis(2));
            let inner = reading_once_per_poll(async { now() }).await;
            assert!(inner >= outer + Duration::from_millis(2));
            assert!(IN_POLL.get(), "still inside the outer poll");
        })
        .await;
        assert!(!IN_POLL.get());
    }
}
