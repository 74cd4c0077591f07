//! Reading past what a handler left unread of a request body, after its
//! answer: the bounds both servers keep to, and the HTTP/2 drain (an
//! HTTP/1.1 connection drains its own, in [`crate::h1`]).
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

/// Reads what is left of an HTTP/2 request body and throws it away (reading
/// gives the client its flow-control window back), within the drain bounds.
/// The stream stays open meanwhile: h2 resets it (`NO_ERROR`, RFC 9113
/// §8.1) only when the last handle on it goes, which is here, after the
/// client's `END_STREAM` or once a bound is passed.
pub(super) async fn drain_h2(mut body: hyper::body::Incoming) {
    use tokio::time::{timeout_at, Instant};
    let deadline = Instant::now() + DRAIN_TIME;
    let mut left = DRAIN_MAX_BYTES;
    loop {
        let by = deadline.min(Instant::now() + DRAIN_IDLE);
        match timeout_at(by, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                let n = frame.data_ref().map_or(0, |d| d.len() as u64);
                if n > left {
                    tracing::debug!("request body left unread past the drain limit: stream reset");
                    return;
                }
                left -= n;
            }
            // The body ended, or the client reset the stream.
            Ok(None | Some(Err(_))) => return,
            Err(_) => {
                tracing::debug!("request body not ended within the drain time: stream reset");
                return;
            }
        }
    }
}
