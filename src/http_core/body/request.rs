//! The request body handlers receive, the same type from either server.
use bytes::Bytes;
use std::sync::atomic::{AtomicBool, Ordering};

use super::drain::drain_h2;
use super::{BoxError, DRAIN_MAX_BYTES};

/// A request's body as handlers receive it, from either server: hyper's
/// (HTTP/2) or ours (HTTP/1.1, see [`crate::h1`]). An HTTP/2 body dropped
/// before its end goes back to its server, or is drained
/// ([`super::DRAIN_MAX_BYTES`]); an HTTP/1.1 one is drained by its
/// connection.
pub struct RequestBody {
    kind: Kind,
}

enum Kind {
    Empty,
    /// Received whole with its head: given out at once.
    Full(Option<Bytes>),
    Hyper {
        body: hyper::body::Incoming,
        /// Seen to have ended, so that dropping it need not ask h2 again
        /// (each ask takes the connection's lock).
        ended: AtomicBool,
        /// Where the body goes if dropped before its end: to the server,
        /// which reads the rest before the answer goes.
        give_back: Option<tokio::sync::oneshot::Sender<hyper::body::Incoming>>,
    },
    Streamed(Streamed),
}

/// An HTTP/1.1 body that the connection reads from the socket and decodes
/// as the handler asks for it.
struct Streamed {
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, BoxError>>,
    /// Told once, on the first poll: the connection starts reading (and
    /// sends `100 Continue` if the client waits for one).
    want: Option<std::sync::Arc<tokio::sync::Notify>>,
    hint: http_body::SizeHint,
    ended: bool,
}

impl RequestBody {
    /// No body.
    pub fn empty() -> Self {
        RequestBody { kind: Kind::Empty }
    }

    /// A body already received whole.
    pub(crate) fn full(data: Bytes) -> Self {
        RequestBody {
            kind: Kind::Full(Some(data)),
        }
    }

    /// A body fed through `rx` once `want` has been notified; `length` when
    /// the request declared one.
    pub(crate) fn streamed(
        rx: tokio::sync::mpsc::Receiver<Result<Bytes, BoxError>>,
        want: std::sync::Arc<tokio::sync::Notify>,
        length: Option<u64>,
    ) -> Self {
        let hint = match length {
            Some(n) => http_body::SizeHint::with_exact(n),
            None => http_body::SizeHint::default(),
        };
        RequestBody {
            kind: Kind::Streamed(Streamed {
                rx,
                want: Some(want),
                hint,
                ended: false,
            }),
        }
    }

    /// An HTTP/2 body from hyper; if dropped before its end, sent on
    /// `give_back` when given (and still listened to), else drained.
    pub(crate) fn h2(
        body: hyper::body::Incoming,
        give_back: Option<tokio::sync::oneshot::Sender<hyper::body::Incoming>>,
    ) -> Self {
        RequestBody {
            kind: Kind::Hyper {
                body,
                ended: AtomicBool::new(false),
                give_back,
            },
        }
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        // Only a body the handler left unread costs more than this test.
        let unread = match &mut self.kind {
            Kind::Hyper { body, ended, .. } => {
                !*ended.get_mut() && !http_body::Body::is_end_stream(body)
            }
            _ => false,
        };
        if unread {
            if let Kind::Hyper {
                body, give_back, ..
            } = std::mem::replace(&mut self.kind, Kind::Empty)
            {
                let body = match give_back {
                    Some(tx) => match tx.send(body) {
                        Ok(()) => return,
                        Err(body) => body,
                    },
                    None => body,
                };
                drain_h2(body, DRAIN_MAX_BYTES);
            }
        }
    }
}

impl http_body::Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        use std::task::Poll;
        match &mut self.get_mut().kind {
            Kind::Empty => Poll::Ready(None),
            Kind::Full(data) => Poll::Ready(data.take().map(|d| Ok(http_body::Frame::data(d)))),
            Kind::Hyper { body, ended, .. } => {
                let frame = std::pin::Pin::new(body).poll_frame(cx);
                if let Poll::Ready(None) = frame {
                    ended.store(true, Ordering::Relaxed);
                }
                frame.map_err(|e| Box::new(e) as BoxError)
            }
            Kind::Streamed(s) => {
                if s.ended {
                    return Poll::Ready(None);
                }
                if let Some(want) = s.want.take() {
                    want.notify_one();
                }
                match s.rx.poll_recv(cx) {
                    Poll::Ready(Some(Ok(data))) => {
                        let n = data.len() as u64;
                        if let Some(exact) = s.hint.exact() {
                            s.hint.set_exact(exact.saturating_sub(n));
                        }
                        Poll::Ready(Some(Ok(http_body::Frame::data(data))))
                    }
                    Poll::Ready(Some(Err(e))) => {
                        s.ended = true;
                        Poll::Ready(Some(Err(e)))
                    }
                    Poll::Ready(None) => {
                        s.ended = true;
                        Poll::Ready(None)
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Empty => true,
            Kind::Full(data) => data.is_none(),
            Kind::Hyper { body, ended, .. } => {
                let end = body.is_end_stream();
                if end {
                    ended.store(true, Ordering::Relaxed);
                }
                end
            }
            Kind::Streamed(s) => s.ended || s.hint.exact() == Some(0),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match &self.kind {
            Kind::Empty => http_body::SizeHint::with_exact(0),
            Kind::Full(data) => {
                http_body::SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Hyper { body, .. } => body.size_hint(),
            Kind::Streamed(s) => s.hint,
        }
    }
}
