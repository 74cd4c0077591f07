//! Listeners: accept loop, connection cap, TLS handshake, HTTP/1.1 (our
//! [`crate::h1`]) and HTTP/2 (hyper), idle-connection closing, and a
//! graceful drain on shutdown.
use bytes::{Buf, Bytes};
use http::Request;
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use crate::config::Limits;
use crate::h1;
use crate::http::body::{Body, RequestBody};
use crate::http::service::{ConnInfo, Handler};
use crate::metrics::names;

/// Connection-level limits of one listener.
#[derive(Debug, Clone)]
pub struct ListenerLimits {
    /// `gateway` or `admin`, for metrics.
    pub name: &'static str,
    /// Open connections at most; more are closed at once.
    pub max_connections: usize,
    /// TLS handshake and request headers must complete within this: the
    /// first request's from the accept, a later one's from its first byte.
    pub header_read_timeout: Duration,
    /// A connection with no request in flight for this long is closed.
    pub idle_timeout: Duration,
    /// Request header bytes the pipeline accepts (a head past twice this is
    /// refused before it is buffered).
    pub max_header_bytes: usize,
    /// In-flight requests get this long after shutdown starts.
    pub shutdown_grace: Duration,
}

impl ListenerLimits {
    /// The gateway listener's limits from `[server.limits]`.
    pub fn gateway(l: &Limits) -> Self {
        ListenerLimits {
            name: "gateway",
            max_connections: l.max_connections,
            header_read_timeout: l.header_read_timeout,
            idle_timeout: l.idle_timeout,
            max_header_bytes: l.max_header_bytes,
            shutdown_grace: l.shutdown_grace,
        }
    }
}

/// hyper's HTTP/2 server (HTTP/1.1 is [`crate::h1`]'s).
fn h2_builder(limits: &ListenerLimits) -> http2::Builder<TokioExecutor> {
    let mut b = http2::Builder::new(TokioExecutor::new());
    // h2 abuse limits: concurrent streams, header list size (also bounds
    // CONTINUATION floods), and rapid-reset / error-reset floods.
    b.timer(TokioTimer::new())
        .max_concurrent_streams(256)
        .max_header_list_size(head_backstop(limits) as u32)
        .max_pending_accept_reset_streams(50)
        .max_local_error_reset_streams(Some(256))
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(10));
    b
}

/// The most head bytes a connection buffers: well above `max_header_bytes`,
/// so that the pipeline answers a too-large head with its own 431.
fn head_backstop(limits: &ListenerLimits) -> usize {
    (limits.max_header_bytes * 2).max(16 * 1024)
}

/// What an HTTP/2 connection is doing, for its idle timeout: streams in
/// flight (until their response body has gone) and when the last one ended.
struct Activity {
    started: Instant,
    in_flight: AtomicUsize,
    /// When the last request ended, in ms since `started` (at least 1): 0
    /// until one has.
    last_done_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Activity {
            started: Instant::now(),
            in_flight: AtomicUsize::new(0),
            last_done_ms: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        crate::clock::now()
            .saturating_duration_since(self.started)
            .as_millis() as u64
    }

    fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
    }

    /// A request's response (body included) is done or dropped.
    fn request_done(&self) {
        self.last_done_ms
            .store(self.now_ms().max(1), Ordering::Release);
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    /// Whether a request has ever been in flight.
    fn had_a_request(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0 || self.last_done_ms.load(Ordering::Acquire) > 0
    }

    /// How long the connection has had no stream in flight.
    fn idle_for(&self) -> Option<Duration> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        Some(Duration::from_millis(
            self.now_ms()
                .saturating_sub(self.last_done_ms.load(Ordering::Acquire)),
        ))
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

/// One request in flight on a connection, from its complete head until its
/// response body has gone (or the request was dropped half-way).
struct InFlight(Arc<Activity>);

impl InFlight {
    fn start(activity: Arc<Activity>) -> Self {
        activity.request_started();
        InFlight(activity)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.request_done();
    }
}

/// A response body that keeps its request in flight until it has gone.
struct Tracked {
    inner: Body,
    _in_flight: InFlight,
}

impl http_body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = crate::http::body::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Decrements the open-connections gauge when the connection task ends.
struct OpenConnection(&'static str);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        metrics::gauge!(names::CONNECTIONS, "listener" => self.0).decrement(1.0);
    }
}

/// Serves `listener` until `shutdown` resolves, then drains for the grace period.
pub async fn serve<H: Handler>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    limits: ListenerLimits,
    handler: Arc<H>,
    shutdown: impl Future<Output = ()>,
) {
    let h2 = Arc::new(h2_builder(&limits));
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            // A connection's task is freed only once reaped here, at once:
            // reaped only when the next connection came, a spike of ten
            // thousand kept that many tasks' memory after they had closed.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok(x) => x,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "max_connections reached; closing new connection");
            continue;
        };
        let _ = stream.set_nodelay(true);
        // The TLS handshake and the first request's head share one
        // allowance, counted from here (Envoy's: from the accept).
        let first_request_by = crate::clock::now() + limits.header_read_timeout;
        metrics::gauge!(names::CONNECTIONS, "listener" => limits.name).increment(1.0);
        let open = OpenConnection(limits.name);
        let conn = Arc::new(ConnInfo::new(peer, tls.is_some()));
        let (handler, h2, tls, limits, stop) = (
            handler.clone(),
            h2.clone(),
            tls.clone(),
            limits.clone(),
            stop_rx.clone(),
        );
        // Each branch boxes its whole future, so that the task of a plain
        // connection reserves no room for a TLS one's state (the rustls
        // session alone is over a kilobyte): every idle keep-alive
        // connection pays for the size of its task.
        connections.spawn(crate::clock::reading_once_per_poll(async move {
            let _permit = permit;
            let _open = open;
            match tls {
                Some(acceptor) => {
                    Box::pin(serve_tls(
                        acceptor,
                        stream,
                        &h2,
                        conn,
                        handler,
                        &limits,
                        first_request_by,
                        stop,
                    ))
                    .await
                }
                None => {
                    Box::pin(serve_connection(
                        stream,
                        &h2,
                        conn,
                        handler,
                        &limits,
                        first_request_by,
                        stop,
                    ))
                    .await
                }
            }
        }));
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Every connection holds a slot: all slots back means all drained.
    let all = limits.max_connections.min(u32::MAX as usize) as u32;
    match tokio::time::timeout(limits.shutdown_grace, slots.clone().acquire_many_owned(all)).await {
        Ok(_) => tracing::info!(listener = limits.name, "all connections drained"),
        Err(_) => {
            tracing::warn!(
                listener = limits.name,
                open = connections.len(),
                "shutdown grace period over; closing remaining connections"
            );
            connections.abort_all();
        }
    }
}

/// The TLS handshake (by `first_request_by`, the first request's deadline
/// too), then the connection. A drain abandons a handshake at once: no
/// request can be in flight on it.
#[allow(clippy::too_many_arguments)]
async fn serve_tls<H: Handler>(
    acceptor: TlsAcceptor,
    stream: tokio::net::TcpStream,
    h2: &http2::Builder<TokioExecutor>,
    conn: Arc<ConnInfo>,
    handler: Arc<H>,
    limits: &ListenerLimits,
    first_request_by: Instant,
    stop: watch::Receiver<bool>,
) {
    let peer = conn.peer;
    let handshake = tokio::time::timeout_at(first_request_by.into(), acceptor.accept(stream));
    let handshaken = tokio::select! {
        biased;
        handshaken = handshake => handshaken,
        () = crate::http::service::stopped(stop.clone()) => {
            tracing::debug!(%peer, "TLS handshake abandoned: shutting down");
            return;
        }
    };
    match handshaken {
        Ok(Ok(stream)) => {
            metrics::counter!(names::TLS_HANDSHAKES, "result" => "ok").increment(1);
            serve_connection(stream, h2, conn, handler, limits, first_request_by, stop).await
        }
        Ok(Err(e)) => {
            metrics::counter!(names::TLS_HANDSHAKES, "result" => "error").increment(1);
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            handshake_failed(&crate::logging::Chain(&e));
        }
        Err(_) => {
            metrics::counter!(names::TLS_HANDSHAKES, "result" => "timeout").increment(1);
            tracing::debug!(%peer, "TLS handshake timed out");
            handshake_failed(&"timed out (header_read_timeout)");
        }
    }
}

/// Failed TLS handshakes, in the log: at INFO, as nginx logs the ones
/// clients cause (scanners, old clients, dropped connections), which is
/// nearly all of them. A success is not watched (it would cost every
/// handshake an atomic load for a recovery line): a failure after a quiet
/// interval begins a new incident.
static TLS_HANDSHAKES_FAILING: crate::logging::Incident = crate::logging::Incident::new();

fn handshake_failed(cause: &dyn std::fmt::Display) {
    if let Some(line) = TLS_HANDSHAKES_FAILING.failed(crate::logging::now_ms()) {
        line.log(tracing::Level::INFO, &"TLS handshakes", "failed", cause);
    }
}

/// Serves one connection until it ends: HTTP/1.1 by [`h1::serve`], or
/// HTTP/2 by hyper when the client opens with the h2 preface (TLS with ALPN
/// `h2`, or prior knowledge on plain TCP). Its first request must have come
/// by `first_request_by`.
async fn serve_connection<S, H>(
    mut stream: S,
    h2: &http2::Builder<TokioExecutor>,
    conn: Arc<ConnInfo>,
    handler: Arc<H>,
    limits: &ListenerLimits,
    first_request_by: Instant,
    stop: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Handler,
{
    let h1_limits = h1::Limits {
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

/// Serves an HTTP/2 connection until it ends; closes it gracefully once it
/// has had no stream for `idle_timeout`, when its first request has not come
/// by `first_request_by`, or when the listener stops. (hyper gives no hook
/// for when a later stream's headers begin: those are bounded by the header
/// list limit and `idle_timeout`, not `header_read_timeout`.)
async fn serve_h2<S, H>(
    io: S,
    h2: &http2::Builder<TokioExecutor>,
    conn: Arc<ConnInfo>,
    handler: Arc<H>,
    limits: &ListenerLimits,
    first_request_by: Instant,
    mut stop: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Handler,
{
    let activity = Arc::new(Activity::new());
    let track = activity.clone();
    let peer = conn.peer;
    let service = service_fn(move |req: Request<Incoming>| {
        let (handler, conn) = (handler.clone(), conn.clone());
        let in_flight = InFlight::start(track.clone());
        async move {
            // Boxed per request: hyper keeps a slot for this future in every
            // stream, and the whole pipeline's state machine inline would make
            // each one that much bigger.
            let reply = Box::pin(handler.handle(req.map(RequestBody::from), conn)).await;
            // hyper writes the header map only: the stamped fields and a
            // target's relayed fields go in.
            let res = reply.into_response();
            // hyper takes any body type: wrapped, not boxed again.
            Ok::<_, Infallible>(res.map(|inner| Tracked {
                inner,
                _in_flight: in_flight,
            }))
        }
    });
    let connection = h2.serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    let idle_timeout = limits.idle_timeout;
    let every = (idle_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A graceful close (GOAWAY) ends only once the client acknowledges its
    // PING; one that never does (or acknowledges only the keep-alive pings)
    // would hold the connection past `idle_timeout`, and a drain until
    // `shutdown_grace`. Once closing, a connection with no stream in flight
    // for this long is dropped (Envoy's `drain_timeout` is 5 s).
    let goaway_grace = idle_timeout.min(GOAWAY_GRACE);
    let mut closing: Option<Instant> = None;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            _ = stop.changed(), if closing.is_none() => {
                connection.as_mut().graceful_shutdown();
                closing = Some(crate::clock::now());
            }
            _ = tick.tick() => match closing {
                None => {
                    let now = crate::clock::now();
                    if activity.idle_for().is_some_and(|idle| idle >= idle_timeout) {
                        tracing::debug!(%peer, "closing idle connection");
                        connection.as_mut().graceful_shutdown();
                        closing = Some(now);
                    } else if now >= first_request_by && !activity.had_a_request() {
                        // Checked on this tick: at most a second late.
                        tracing::debug!(%peer, "closing HTTP/2 connection with no request within header_read_timeout");
                        connection.as_mut().graceful_shutdown();
                        closing = Some(now);
                    }
                }
                Some(since) => {
                    let now = crate::clock::now();
                    if now.saturating_duration_since(since) >= goaway_grace
                        && activity.idle_for().is_some_and(|idle| idle >= goaway_grace)
                    {
                        tracing::debug!(%peer, "closing connection that did not finish its GOAWAY");
                        return;
                    }
                }
            },
        }
    }
}

/// The longest a closing HTTP/2 connection with no stream in flight is left
/// to finish its GOAWAY exchange.
const GOAWAY_GRACE: Duration = Duration::from_secs(5);
