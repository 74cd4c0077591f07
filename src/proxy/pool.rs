//! HTTP/1.1 connections to one target: hyper's low-level client, each
//! connection driven by a task of its own, idle ones kept newest-first per
//! target and closed after `idle_timeout`. Compared with hyper-util's pooled
//! client this skips its pool checkout and the ~7 KB request future it boxes
//! per request. (Driving the connection from the requesting task instead, with
//! no task of its own, measured 8-10% slower in the load suite's pinned
//! layout: the writes to the upstream were no longer batched per scheduler
//! tick, and every one woke the other core.)
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_rustls::MaybeHttpsStream;
use hyper_util::rt::TokioIo;
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

use crate::body::Body;

/// The stream to a target: TCP, or TLS over TCP for `https://` targets.
pub(crate) type Io = MaybeHttpsStream<TokioIo<TcpStream>>;

/// One connection: the sender of its requests (its task drives the I/O and
/// ends when the connection closes or the sender is dropped).
pub(crate) struct Conn {
    send: http1::SendRequest<Body>,
}

/// Why a request on a connection failed.
pub(crate) enum SendError {
    /// The connection was closed before any of the request was written: the
    /// request comes back, to go out on another connection.
    Unsent(Box<Request<Body>>),
    /// The exchange failed after (part of) the request was written.
    Failed(hyper::Error),
}

impl Conn {
    /// The HTTP/1.1 handshake over a connected stream; spawns the task that
    /// drives the connection.
    pub(crate) async fn handshake(io: Io) -> Result<Conn, hyper::Error> {
        let (send, conn) = http1::Builder::new().handshake(io).await?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
        });
        Ok(Conn { send })
    }

    /// Waits until the connection can take a request; `false` when it closed
    /// instead (e.g. the target closed it while it was idle).
    pub(crate) async fn ready(&mut self) -> bool {
        self.send.ready().await.is_ok()
    }

    /// Sends `req` (origin-form URI, `Host` set); the response head.
    pub(crate) async fn send(
        &mut self,
        req: Request<Body>,
    ) -> Result<Response<Incoming>, SendError> {
        self.send
            .try_send_request(req)
            .await
            .map_err(|mut e| match e.take_message() {
                Some(req) => SendError::Unsent(Box::new(req)),
                None => SendError::Failed(e.into_error()),
            })
    }

    fn closed(&self) -> bool {
        self.send.is_closed()
    }
}

/// The idle connections of one target.
pub(crate) struct Pool {
    idle: Mutex<VecDeque<(Instant, Conn)>>,
    max_idle: usize,
    idle_timeout: Duration,
}

impl Pool {
    /// A pool keeping at most `max_idle` connections, each for `idle_timeout`.
    pub(crate) fn new(max_idle: usize, idle_timeout: Duration) -> Self {
        Pool {
            idle: Mutex::new(VecDeque::new()),
            max_idle,
            idle_timeout,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(Instant, Conn)>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The most recently used idle connection that has not timed out.
    pub(crate) fn take(&self) -> Option<Conn> {
        let now = Instant::now();
        let mut idle = self.lock();
        Self::expire(&mut idle, now, self.idle_timeout);
        idle.pop_back().map(|(_, c)| c)
    }

    /// Keeps `conn` for the next request, unless the pool is full or the
    /// connection is closed.
    pub(crate) fn put(&self, conn: Conn) {
        if conn.closed() || self.max_idle == 0 {
            return;
        }
        let now = Instant::now();
        let mut idle = self.lock();
        Self::expire(&mut idle, now, self.idle_timeout);
        if idle.len() >= self.max_idle {
            idle.pop_front();
        }
        idle.push_back((now, conn));
    }

    /// Closes connections idle for longer than `idle_timeout`.
    pub(crate) fn prune(&self) {
        Self::expire(&mut self.lock(), Instant::now(), self.idle_timeout);
    }

    /// How many connections are idle.
    #[cfg(test)]
    pub(crate) fn idle(&self) -> usize {
        self.lock().len()
    }

    fn expire(idle: &mut VecDeque<(Instant, Conn)>, now: Instant, timeout: Duration) {
        // Oldest first: stop at the first one still fresh.
        while idle
            .front()
            .is_some_and(|(since, _)| now.saturating_duration_since(*since) >= timeout)
        {
            idle.pop_front();
        }
    }
}
