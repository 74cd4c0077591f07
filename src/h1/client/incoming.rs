//! A response body from a target: arrived whole with its head, read off the
//! connection as the client polls it (which it gives back once the body has
//! ended), or from hyper-util's client for `http2 = true` targets.
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};

use super::conn::Conn;
use super::error::ClientError;
use crate::h1::codec::{poll_read_more, Decoder, Framing};
use crate::http_core::body::BoxError;
use crate::http_core::relayed::RelayedFields;

/// How a response body ends.
pub(crate) enum BodyFraming {
    /// No body by rule: the answer to a `HEAD`, a 1xx, 204 or 304. Unlike
    /// `Known(Framing::Empty)` (a length of 0), its empty body says nothing
    /// of the length of the representation.
    None,
    Known(Framing),
    UntilClose,
}

/// A response body from a target, with the response's relayed fields
/// (HTTP/1.1 targets), which go on to the gateway's own response body.
pub(crate) struct Incoming {
    pub(super) kind: Kind,
    pub(super) relayed: Option<RelayedFields>,
}

/// Where a response body comes from.
pub(crate) enum Kind {
    /// None: a zero length (or a body cut off, or given up with its
    /// connection).
    Empty,
    /// None by rule (a `HEAD` answer, 1xx, 204, 304): its size is not the
    /// `Content-Length` to send, which only the target's own field gives
    /// (a 304 or `HEAD` answer saying 0 for a non-empty representation
    /// would have a cache store it as empty, RFC 9110 §8.6).
    Bodyless,
    /// Arrived whole with the head (taken by the first poll).
    Full(Option<Bytes>),
    /// Read off the connection as it is polled.
    Reading(Box<Reader>),
    /// From an `http2 = true` target (hyper-util's client).
    H2(hyper::body::Incoming),
}

/// A response body still arriving on its connection.
pub(crate) struct Reader {
    conn: Conn,
    /// `None`: the body ends with the connection.
    decoder: Option<Decoder>,
    /// Bytes left of a `Content-Length` body.
    remaining: Option<u64>,
    /// The connection may carry another request once the body has ended.
    reusable: bool,
    done: bool,
}

impl Reader {
    /// The body of `framing` (not `Empty`), read off `conn`.
    pub(super) fn new(conn: Conn, framing: BodyFraming, reusable: bool) -> Self {
        let (decoder, remaining) = match framing {
            BodyFraming::None => (Some(Decoder::new(Framing::Empty)), Some(0)),
            BodyFraming::Known(f @ Framing::Length(n)) => (Some(Decoder::new(f)), Some(n)),
            BodyFraming::Known(f) => (Some(Decoder::new(f)), None),
            BodyFraming::UntilClose => (None, None),
        };
        // A body that ends with the connection leaves none to reuse.
        let reusable = reusable && decoder.is_some();
        Reader {
            conn,
            decoder,
            remaining,
            reusable,
            done: false,
        }
    }

    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, ClientError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        let inner = &mut *self.conn.inner;
        loop {
            match &mut self.decoder {
                Some(d) => match d.decode(&mut inner.buf) {
                    Ok(Some(data)) => {
                        if let Some(r) = self.remaining.as_mut() {
                            *r -= data.len() as u64;
                        }
                        self.done = d.is_done();
                        return Poll::Ready(Some(Ok(data)));
                    }
                    Ok(None) if d.is_done() => {
                        self.done = true;
                        return Poll::Ready(None);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        self.reusable = false;
                        return Poll::Ready(Some(Err(ClientError::Invalid(e))));
                    }
                },
                None if !inner.buf.is_empty() => {
                    return Poll::Ready(Some(Ok(inner.buf.split().freeze())));
                }
                None => {}
            }
            match poll_read_more(&mut inner.io, cx, &mut inner.buf) {
                Poll::Ready(Ok(0)) if self.decoder.is_none() => {
                    self.done = true;
                    return Poll::Ready(None);
                }
                Poll::Ready(Ok(0)) => {
                    self.reusable = false;
                    return Poll::Ready(Some(Err(ClientError::Closed)));
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => {
                    self.reusable = false;
                    return Poll::Ready(Some(Err(e.into())));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl Incoming {
    /// An `http2 = true` target's body (its fields are in the header map).
    pub(crate) fn h2(body: hyper::body::Incoming) -> Self {
        Incoming {
            kind: Kind::H2(body),
            relayed: None,
        }
    }

    /// The response's relayed fields, taken.
    pub(crate) fn take_relayed(&mut self) -> Option<RelayedFields> {
        self.relayed.take()
    }

    /// Stops reading: the body ends here (its connection is dropped).
    pub(crate) fn cut_off(&mut self) {
        self.kind = Kind::Empty;
    }

    /// The connection the body came on, once the body has ended and when
    /// the connection can carry another request.
    pub(crate) fn take_conn(&mut self) -> Option<Conn> {
        match std::mem::replace(&mut self.kind, Kind::Empty) {
            Kind::Reading(r) if r.done && r.reusable && r.conn.inner.buf.is_empty() => Some(r.conn),
            other => {
                self.kind = other;
                None
            }
        }
    }
}

impl HttpBody for Incoming {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.get_mut().kind {
            Kind::Empty | Kind::Bodyless => Poll::Ready(None),
            Kind::Full(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            Kind::Reading(r) => r
                .poll_data(cx)
                .map(|d| d.map(|d| d.map(Frame::data).map_err(Into::into))),
            Kind::H2(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Empty | Kind::Bodyless => true,
            Kind::Full(data) => data.is_none(),
            Kind::Reading(r) => r.done,
            Kind::H2(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Empty => SizeHint::with_exact(0),
            Kind::Bodyless => SizeHint::default(),
            Kind::Full(data) => SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64)),
            Kind::Reading(r) => match r.remaining {
                Some(n) => SizeHint::with_exact(n),
                None => SizeHint::default(),
            },
            Kind::H2(b) => b.size_hint(),
        }
    }
}
