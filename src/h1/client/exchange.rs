//! One exchange on a connection: the request written (with a body piece
//! that is ready in the same write), the response head read (interim heads
//! skipped), and its body framed; the connection comes back at once when
//! the response arrived whole.
use bytes::{Buf, Bytes};
use http::header::HeaderValue;
use http::{Method, Response};
use http_body::Body as HttpBody;
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use super::conn::{poll_expired, Conn};
use super::error::{ClientError, SendError};
use super::incoming::{BodyFraming, Incoming, Kind, Reader};
use super::request::{encode_head, stream_body, write_some, BodyWriter, Streamed};
use super::response::take_response;
use crate::h1::codec::{after_queued_tasks, poll_read_more, Decoder, Framing};
use crate::http_core::body::Body;
use crate::http_core::fields::FieldLines;

/// A response head (status line and header fields) longer than this is refused.
const MAX_HEAD: usize = 256 * 1024;
/// A first request-body piece up to this size is copied behind the head,
/// so that both go out in one write.
const COALESCE: usize = 16 * 1024;

impl Conn {
    /// Sends the request `parts` (its path and query, and its fields with
    /// `host` for `Host`) with `body`, and reads the response head, failing
    /// with [`ClientError::TimedOut`] if that is not done by `deadline`.
    /// The head is borrowed: a caller that may send it again keeps it, and
    /// the request's future holds it once, not once per layer. The
    /// connection comes back with the response when the response is already
    /// whole and the connection can carry another request; otherwise the
    /// response body owns it until it ends.
    pub(crate) async fn send<A: FieldLines + Sync + ?Sized>(
        mut self,
        parts: &http::request::Parts,
        host: &HeaderValue,
        mut body: Body,
        added: Option<&A>,
        deadline: Instant,
    ) -> Result<(Response<Incoming>, Option<Conn>), SendError> {
        let head_request = parts.method == Method::HEAD;
        let length = if body.is_end_stream() {
            Some(0)
        } else {
            body.size_hint().exact()
        };
        let inner = &mut *self.inner;
        inner.out.clear();
        encode_head(&mut inner.out, parts, host, length, added);

        // A body piece that is ready now goes out with the head.
        let mut first = Bytes::new();
        let mut polled = false;
        let mut body_done = length == Some(0);
        if !body_done {
            polled = true;
            let cx = &mut Context::from_waker(Waker::noop());
            match Pin::new(&mut body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        first = data;
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    return Err(SendError::Failed(ClientError::Body(e)));
                }
                Poll::Ready(None) => body_done = true,
                Poll::Pending => {}
            }
            body_done |= body.is_end_stream();
        }
        let mut writer = BodyWriter::new(length);
        if let Err(e) = writer.check(first.len(), body_done) {
            return Err(SendError::Failed(e));
        }
        if !first.is_empty() && first.len() <= COALESCE && length.is_some() {
            inner.out.extend_from_slice(&first);
            first = Bytes::new();
        } else if !first.is_empty() {
            writer.frame(&mut inner.out, first.len());
        }
        let tail = writer.tail(first.is_empty(), body_done);

        // Written after the other ready requests: see `after_queued_tasks`.
        after_queued_tasks().await;
        let mut out = (&inner.out[..]).chain(first).chain(tail);
        let mut written = 0;
        while out.has_remaining() {
            match write_some(&mut inner.io, &mut inner.timer, &mut out, deadline).await {
                Ok(n) => written += n,
                Err(ClientError::Io(e))
                    if written == 0 && !polled && e.kind() != io::ErrorKind::WriteZero =>
                {
                    return Err(SendError::Unsent(body));
                }
                Err(e) => return Err(SendError::Failed(e)),
            }
        }
        let mut reusable = true;
        if !body_done {
            // Boxed: the usual request's future carries no room for this.
            match Box::pin(stream_body(inner, &mut body, writer, deadline)).await {
                Ok(Streamed::Whole) => {}
                Ok(Streamed::AnsweredEarly) => reusable = false,
                Err(e) => return Err(SendError::Failed(e)),
            }
        }
        drop(body);
        self.read_response(head_request, reusable, deadline)
            .await
            .map_err(SendError::Failed)
    }

    /// Reads the response head, skipping interim responses; frames its body.
    async fn read_response(
        mut self,
        head_request: bool,
        reusable: bool,
        deadline: Instant,
    ) -> Result<(Response<Incoming>, Option<Conn>), ClientError> {
        let inner = &mut *self.inner;
        let (mut res, framing, keep_alive) = loop {
            if let Some(taken) = take_response(&mut inner.buf, head_request)? {
                break taken;
            }
            if inner.buf.len() > MAX_HEAD {
                return Err(ClientError::Invalid("response head too large"));
            }
            let read = poll_fn(
                |cx| match poll_read_more(&mut inner.io, cx, &mut inner.buf) {
                    Poll::Pending => poll_expired(&mut inner.timer, deadline, cx),
                    done => done.map_err(ClientError::from),
                },
            );
            if read.await? == 0 {
                return Err(ClientError::Closed);
            }
        };
        let reusable = reusable && keep_alive;
        res.body_mut().kind = match framing {
            BodyFraming::None => Kind::Bodyless,
            BodyFraming::Known(Framing::Empty) => Kind::Empty,
            BodyFraming::Known(Framing::Length(n)) if inner.buf.len() as u64 >= n => {
                Kind::Full(Some(inner.buf.split_to(n as usize).freeze()))
            }
            framing => {
                if let BodyFraming::Known(chunked @ Framing::Chunked) = framing {
                    // Framing that is already here and broken is a 502, not
                    // a 200 whose body breaks off after its head has gone.
                    Decoder::new(chunked)
                        .check(&inner.buf)
                        .map_err(ClientError::Invalid)?;
                }
                let reader = Reader::new(self, framing, reusable);
                res.body_mut().kind = Kind::Reading(Box::new(reader));
                return Ok((res, None));
            }
        };
        // Bytes past the response: the target is out of step; not reused.
        let back = (reusable && inner.buf.is_empty()).then_some(self);
        Ok((res, back))
    }
}
