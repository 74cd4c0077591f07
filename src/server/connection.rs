//! One connection, once accepted (and past TLS): HTTP/1.1 by [`crate::h1`],
//! handed to HTTP/2 when the client opens with the h2 preface.
use bytes::{Buf, Bytes};
use hyper::server::conn::http2;
use hyper_util::rt::TokioExecutor;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;

use super::h2::serve_h2;
use super::limits::{head_backstop, ListenerLimits};
use crate::h1;
use crate::http_core::service::{ConnInfo, Handler};

/// What serving one accepted connection takes besides its stream: the
/// listener's HTTP/2 settings and limits, who the connection is, the handler,
/// the first request's deadline (counted from the accept) and the drain signal.
pub(super) struct Accepted<'a, H> {
    pub(super) h2: &'a http2::Builder<TokioExecutor>,
    pub(super) conn: Arc<ConnInfo>,
    pub(super) handler: Arc<H>,
    pub(super) limits: &'a ListenerLimits,
    pub(super) first_request_by: Instant,
    pub(super) stop: watch::Receiver<bool>,
}

/// Serves one connection until it ends: HTTP/1.1 by [`h1::serve`], or
/// HTTP/2 by hyper when the client opens with the h2 preface (TLS with ALPN
/// `h2`, or prior knowledge on plain TCP). Its first request must have come
/// by `first_request_by`.
pub(super) async fn serve_connection<S, H>(mut stream: S, accepted: Accepted<'_, H>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Handler,
{
    let Accepted {
        h2,
        conn,
        handler,
        limits,
        first_request_by,
        stop,
    } = accepted;
    let h1_limits = h1::ConnectionLimits {
        header_read_timeout: limits.header_read_timeout,
        idle_timeout: limits.idle_timeout,
        max_head_bytes: head_backstop(limits),
        max_header_bytes: limits.max_header_bytes,
    };
    match h1::serve(
        &mut stream,
        &handler,
        &conn,
        h1_limits,
        first_request_by,
        &stop,
    )
    .await
    {
        Ok(h1::Ended::Closed) => {}
        Ok(h1::Ended::H2(read)) => {
            let io = Rewind {
                read,
                inner: stream,
            };
            // Boxed: an HTTP/1.1 connection's task reserves no room for it.
            Box::pin(serve_h2(
                io,
                h2,
                conn,
                handler,
                limits,
                first_request_by,
                stop,
            ))
            .await
        }
        Err(e) => tracing::debug!(peer = %conn.peer, error = %e, "connection ended with an error"),
    }
}

/// A stream with bytes already read off its front, given back first.
struct Rewind<S> {
    read: Bytes,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.read.is_empty() {
            let n = self.read.len().min(buf.remaining());
            buf.put_slice(&self.read[..n]);
            self.read.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
