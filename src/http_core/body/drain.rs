//! Reading past what a handler left unread of a request body: the bounds
//! both servers keep to after the answer, and on HTTP/2 the read before the
//! answer and the drain after it (an HTTP/1.1 connection drains its own, in
//! [`crate::h1`]).
use http_body_util::BodyExt;

/// After an answer sent before the request body ended (a refusal, or a
/// target that answered early), what is left of the body is read and thrown
/// away, so that the client's upload ends normally: HTTP/2 without a
/// `RST_STREAM` (older nghttp2-based clients, curl 7.88 among them, fail a
/// request whose stream is reset while they are still sending, even after
/// its whole response), HTTP/1.1 with the connection kept (or closed only
/// once the client has stopped sending). At most this many bytes are read;
/// past it the stream is reset, or the connection closed. Several times the
/// default `max_body_bytes`, tens of milliseconds of reading on a LAN: an
/// upload somewhat over the limit finishes cleanly, a huge one is cut.
pub(crate) const DRAIN_MAX_BYTES: u64 = 8 * 1024 * 1024;
/// The longest the rest of a body is read for, from when the answer is
/// ready (nginx's `lingering_time`).
pub(crate) const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(30);
/// The longest the drain waits for the client's next bytes (nginx's
/// `lingering_timeout`): a client that stopped sending without ending its
/// body has its stream reset (or its connection closed) this soon.
pub(crate) const DRAIN_IDLE: std::time::Duration = std::time::Duration::from_secs(5);

/// The longest an HTTP/2 answer waits for the rest of a request body that
/// keeps coming ([`read_before_answer`]).
const BEFORE_ANSWER_TIME: std::time::Duration = std::time::Duration::from_secs(1);
/// The longest gap between that body's frames before the answer goes
/// anyway: a client that waits for the answer before sending more gets it
/// this late.
const BEFORE_ANSWER_IDLE: std::time::Duration = std::time::Duration::from_millis(250);

/// An HTTP/2 request body that its handler left unread, carried by the
/// answer's body until that has gone: then what is left is drained
/// ([`drain_h2`]), or, past the byte bound, dropped, which resets the stream
/// (`NO_ERROR`, as the answer has ended).
pub(crate) struct Unread {
    body: Option<hyper::body::Incoming>,
    /// Bytes that may still be read past.
    left: u64,
}

impl Drop for Unread {
    fn drop(&mut self) {
        if let Some(body) = self.body.take() {
            if self.left > 0 {
                drain_h2(body, self.left);
            }
        }
    }
}

/// How a read past an unread HTTP/2 body ([`read_past`]) ended.
enum Past {
    /// The body ended, or the client reset the stream.
    Ended,
    /// The next frame would pass the byte bound.
    Cut,
    /// No frame came within the idle bound, or the time bound passed.
    TimedOut,
}

/// Reads `body` and throws it away (reading gives the client its
/// flow-control window back) until it ends, `left` bytes would be passed,
/// `deadline` passes, or no frame comes for `idle`.
async fn read_past(
    body: &mut hyper::body::Incoming,
    left: &mut u64,
    deadline: tokio::time::Instant,
    idle: std::time::Duration,
) -> Past {
    use tokio::time::{timeout_at, Instant};
    loop {
        let by = deadline.min(Instant::now() + idle);
        match timeout_at(by, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                let n = frame.data_ref().map_or(0, |d| d.len() as u64);
                if n > *left {
                    return Past::Cut;
                }
                *left -= n;
            }
            Ok(None | Some(Err(_))) => return Past::Ended,
            Err(_) => return Past::TimedOut,
        }
    }
}

/// Reads the rest of an HTTP/2 request body before its (early) answer goes,
/// while the client keeps sending: at most [`BEFORE_ANSWER_TIME`], with no
/// gap over [`BEFORE_ANSWER_IDLE`], within [`DRAIN_MAX_BYTES`]. An answer
/// that comes while the client is still sending makes curl 7.88 end its
/// upload short (`END_STREAM` before the declared length); h2 resets such a
/// stream with `PROTOCOL_ERROR`, and when the answer's head has gone out
/// without its body, which the connection task may do, curl loses the
/// answer. Returns what is still unread when a bound ends the wait.
pub(crate) async fn read_before_answer(mut body: hyper::body::Incoming) -> Option<Unread> {
    let deadline = tokio::time::Instant::now() + BEFORE_ANSWER_TIME;
    let mut left = DRAIN_MAX_BYTES;
    let left = match read_past(&mut body, &mut left, deadline, BEFORE_ANSWER_IDLE).await {
        Past::Ended => return None,
        Past::Cut => 0,
        Past::TimedOut => left,
    };
    Some(Unread {
        body: Some(body),
        left,
    })
}

/// Spawns a task that reads what is left of an HTTP/2 request body and
/// throws it away, within the drain bounds and `left` bytes. The stream
/// stays open meanwhile: h2 resets it (`NO_ERROR`, RFC 9113 §8.1) only when
/// the last handle on it goes, which is there, after the client's
/// `END_STREAM` or once a bound is passed. Outside a runtime (the process
/// ending), the body is dropped at once.
pub(super) fn drain_h2(mut body: hyper::body::Incoming, mut left: u64) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let deadline = tokio::time::Instant::now() + DRAIN_TIME;
        match read_past(&mut body, &mut left, deadline, DRAIN_IDLE).await {
            Past::Ended => {}
            Past::Cut => {
                tracing::debug!("request body left unread past the drain limit: stream reset");
            }
            Past::TimedOut => {
                tracing::debug!("request body not ended within the drain time: stream reset");
            }
        }
    });
}
