//! One HTTP/1.1 connection to a target: its stream, the bytes read and not
//! yet consumed, and the timer that bounds each exchange on it.
use bytes::BytesMut;
use std::future::Future;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Instant;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::time::Sleep;

use super::error::ClientError;
use super::socket::Io;

/// One HTTP/1.1 connection to a target. Boxed inside, so that moving it in
/// and out of the pool and through the request's future copies a pointer
/// (a TLS session is over a kilobyte).
pub(crate) struct Conn {
    pub(super) inner: Box<Inner>,
}

pub(super) struct Inner {
    pub(super) io: Io,
    /// Bytes read and not yet consumed (empty between exchanges).
    pub(super) buf: BytesMut,
    /// The request head being written; kept for its capacity.
    pub(super) out: Vec<u8>,
    /// The timer of the exchange's deadline, made once per connection (see
    /// [`poll_expired`]).
    pub(super) timer: Option<Pin<Box<Sleep>>>,
}

impl Conn {
    /// A connection over a connected (and, for TLS, handshaken) stream.
    pub(crate) fn new(io: Io) -> Conn {
        Conn {
            inner: Box::new(Inner {
                io,
                buf: BytesMut::new(),
                out: Vec::new(),
                timer: None,
            }),
        }
    }

    /// Whether an idle connection can carry a request: the target has not
    /// closed it and sent nothing unasked. Costs no system call unless the
    /// socket has become readable.
    pub(crate) fn is_usable(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        let mut one = [MaybeUninit::<u8>::uninit(); 1];
        let mut rb = ReadBuf::uninit(&mut one);
        // Ready means end of stream, an error, or bytes nobody asked for.
        Pin::new(&mut self.inner.io)
            .poll_read(&mut cx, &mut rb)
            .is_pending()
    }
}

/// `Ready(Err(TimedOut))` once `deadline` has passed; until then `Pending`,
/// with the task woken when it passes (for a wait that is pending itself).
///
/// Per connection, not per request: `timer` is made once and is armed no
/// later than the current deadline. A later deadline (the next request's)
/// leaves it alone, and when it fires early it is re-armed, so a busy
/// connection touches the timer wheel once per deadline's length instead
/// of twice per request (tokio's `timeout` registers and removes a timer
/// each time). An early firing wakes the task that polled last, at worst a
/// finished one: a spurious wake-up, once per deadline's length.
pub(super) fn poll_expired<T>(
    timer: &mut Option<Pin<Box<Sleep>>>,
    deadline: Instant,
    cx: &mut Context<'_>,
) -> Poll<Result<T, ClientError>> {
    let at = tokio::time::Instant::from_std(deadline);
    let timer = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
    if timer.deadline() > at {
        timer.as_mut().reset(at);
    }
    while timer.as_mut().poll(cx).is_ready() {
        if Instant::now() >= deadline {
            return Poll::Ready(Err(ClientError::TimedOut));
        }
        timer.as_mut().reset(at);
    }
    Poll::Pending
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;
    use std::time::Duration;

    #[tokio::test]
    async fn the_connection_timer_ends_each_exchange_at_its_own_deadline() {
        let mut timer = None;
        let expired = |timer: &mut Option<Pin<Box<Sleep>>>, deadline| {
            let mut cx = Context::from_waker(Waker::noop());
            poll_expired::<()>(timer, deadline, &mut cx).is_ready()
        };
        // The first exchange arms the timer for its deadline.
        let first = Instant::now() + Duration::from_millis(40);
        assert!(!expired(&mut timer, first));
        tokio::time::sleep(Duration::from_millis(80)).await;
        // The timer fired for the first exchange; the next one, due later,
        // is not expired by it, and the timer is re-armed for it.
        let second = Instant::now() + Duration::from_millis(120);
        assert!(!expired(&mut timer, second));
        assert_eq!(
            timer.as_ref().unwrap().deadline(),
            tokio::time::Instant::from_std(second)
        );
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert!(!expired(&mut timer, second));
        // An earlier deadline moves the timer forward.
        let third = Instant::now() + Duration::from_millis(20);
        assert!(!expired(&mut timer, third));
        let ended = poll_fn(|cx| poll_expired::<()>(&mut timer, third, cx)).await;
        assert!(matches!(ended, Err(ClientError::TimedOut)));
        assert!(Instant::now() >= third);
        // A deadline already past is expired at once.
        assert!(expired(&mut timer, Instant::now()));
    }
}
