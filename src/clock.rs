//! The monotonic clock of the request path, read once per poll of a
//! connection's task: nginx (`ngx_time_update`) and HAProxy (`now_ms`) read
//! theirs once per turn of the event loop for the same reason. A proxied
//! request used to read the clock a dozen times (connection deadlines, the
//! limiter, the upstream pool, the upstream's deadline); each read is a
//! `clock_gettime`, about 2% of the gateway's CPU together.
//!
//! Inside [`reading_once_per_poll`], the first [`now`] of a poll reads the
//! clock and the rest of that poll gets the same instant. A poll runs for
//! microseconds (nothing on the request path blocks), so a reading is never
//! older than that; the next poll reads afresh. Outside it (tests, other
//! tasks, HTTP/2 streams that hyper spawns) [`now`] is `Instant::now()`.
//!
//! Durations that must be exact, such as a request's latency, end with
//! `Instant::elapsed`, which always reads the clock.
use std::cell::Cell;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::time::Instant;

thread_local! {
    /// `Some(reading)` once this poll has read the clock, `None` before.
    static READING: Cell<Option<Instant>> = const { Cell::new(None) };
    /// Whether a poll of a [`reading_once_per_poll`] future is running.
    static IN_POLL: Cell<bool> = const { Cell::new(false) };
}

/// Now: this poll's reading inside [`reading_once_per_poll`], else the clock.
pub(crate) fn now() -> Instant {
    if !IN_POLL.get() {
        return Instant::now();
    }
    match READING.get() {
        Some(reading) => reading,
        None => {
            let reading = Instant::now();
            READING.set(Some(reading));
            reading
        }
    }
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
