//! Listeners: accept loop, connection cap, TLS handshake, HTTP/1.1 and h2
//! through hyper-util's auto builder, idle-connection closing, and a
//! graceful drain on shutdown.
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use crate::admin::names;
use crate::body::Body;
use crate::config::Limits;

/// What the pipeline knows about the connection a request came on.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The client's address.
    pub peer: SocketAddr,
    /// Whether the connection is TLS.
    pub tls: bool,
}

/// Turns a request into a response; never fails (errors are responses).
pub trait Handler: Send + Sync + 'static {
    /// Called once per request.
    fn handle(
        &self,
        req: Request<Incoming>,
        conn: Arc<ConnInfo>,
    ) -> impl Future<Output = Response<Body>> + Send;
}

/// Connection-level limits of one listener.
#[derive(Debug, Clone)]
pub struct ListenerLimits {
    /// `gateway` or `admin`, for metrics.
    pub name: &'static str,
    /// Open connections at most; more are closed at once.
    pub max_connections: usize,
    /// TLS handshake and request headers must complete within this.
    pub header_read_timeout: Duration,
    /// A connection with no request in flight for this long is closed.
    pub idle_timeout: Duration,
    /// hyper's read buffer for a request head (bounds header bytes).
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

fn builder(limits: &ListenerLimits) -> auto::Builder<TokioExecutor> {
    let mut b = auto::Builder::new(TokioExecutor::new());
    // hyper's own head limit is a backstop well above max_header_bytes so
    // the pipeline can answer 431 as JSON; hyper answers bare 431 past it.
    let head_buffer = (limits.max_header_bytes * 2).max(16 * 1024);
    // No hyper `header_read_timeout`: hyper starts it as soon as a keep-alive
    // connection goes idle, which made it an idle timeout (10 s, whatever
    // `idle_timeout` said) and cost a timer per request. `serve_connection`
    // times request heads itself, from their first byte.
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        .max_buf_size(head_buffer)
        .keep_alive(true);
    // h2 abuse limits: concurrent streams, header list size (also bounds
    // CONTINUATION floods), and rapid-reset / error-reset floods.
    b.http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(256)
        .max_header_list_size(head_buffer as u32)
        .max_pending_accept_reset_streams(50)
        .max_local_error_reset_streams(Some(256))
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(10));
    b
}

/// What a connection is doing, for its two timeouts: requests in flight
/// (until their response body has gone), when the last one finished, and
/// since when a request head has been arriving without completing.
struct Activity {
    started: Instant,
    in_flight: AtomicUsize,
    last_done_ms: AtomicU64,
    /// Milliseconds since `started` (plus one) when the first byte of a
    /// request head arrived on an idle connection; 0 = no head pending.
    head_since_ms: AtomicU64,
    /// The connection speaks HTTP/2: heads are framed, no head timing.
    h2: AtomicBool,
}

impl Activity {
    fn new() -> Self {
        Activity {
            started: Instant::now(),
            in_flight: AtomicUsize::new(0),
            last_done_ms: AtomicU64::new(0),
            // The first request's head is timed from the accept.
            head_since_ms: AtomicU64::new(1),
            h2: AtomicBool::new(false),
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Bytes arrived: on an idle HTTP/1 connection, a request head begins.
    fn bytes_in(&self) {
        if self.in_flight.load(Ordering::Acquire) == 0
            && self.head_since_ms.load(Ordering::Relaxed) == 0
            && !self.h2.load(Ordering::Relaxed)
        {
            self.head_since_ms
                .store(self.now_ms() + 1, Ordering::Release);
        }
    }

    /// A request head is complete (the handler is called).
    fn request_started(&self, h2: bool) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.head_since_ms.store(0, Ordering::Release);
        if h2 {
            self.h2.store(true, Ordering::Relaxed);
        }
    }

    /// A request's response (body included) is done or dropped.
    fn request_done(&self) {
        self.last_done_ms.store(self.now_ms(), Ordering::Release);
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    /// How long a request head has been arriving, if one is.
    fn head_pending_for(&self) -> Option<Duration> {
        match self.head_since_ms.load(Ordering::Acquire) {
            0 => None,
            since => Some(Duration::from_millis(
                (self.now_ms() + 1).saturating_sub(since),
            )),
        }
    }

    /// How long the connection has had nothing to do (no request in flight,
    /// no head arriving).
    fn idle_for(&self) -> Option<Duration> {
        if self.in_flight.load(Ordering::Acquire) > 0
            || self.head_since_ms.load(Ordering::Acquire) != 0
        {
            return None;
        }
        Some(Duration::from_millis(
            self.now_ms()
                .saturating_sub(self.last_done_ms.load(Ordering::Acquire)),
        ))
    }
}

/// The connection's stream, noting in [`Activity`] when bytes arrive.
struct Watched<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.bytes_in();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
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
    fn start(activity: Arc<Activity>, h2: bool) -> Self {
        activity.request_started(h2);
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
    type Error = crate::body::BoxError;

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
    let builder = Arc::new(builder(&limits));
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        while connections.try_join_next().is_some() {}
        let (stream, peer) = tokio::select! {
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
        metrics::gauge!(names::CONNECTIONS, "listener" => limits.name).increment(1.0);
        let open = OpenConnection(limits.name);
        let conn = Arc::new(ConnInfo {
            peer,
            tls: tls.is_some(),
        });
        let (handler, builder, tls, limits, stop) = (
            handler.clone(),
            builder.clone(),
            tls.clone(),
            limits.clone(),
            stop_rx.clone(),
        );
        // Each branch boxes its whole future, so that the task of a plain
        // connection reserves no room for a TLS one's state (the rustls
        // session alone is over a kilobyte): every idle keep-alive
        // connection pays for the size of its task.
        connections.spawn(async move {
            let _permit = permit;
            let _open = open;
            match tls {
                Some(acceptor) => {
                    Box::pin(serve_tls(
                        acceptor, stream, &builder, conn, handler, &limits, stop,
                    ))
                    .await
                }
                None => {
                    Box::pin(serve_connection(
                        &builder, stream, conn, handler, &limits, stop,
                    ))
                    .await
                }
            }
        });
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

/// The TLS handshake (within `header_read_timeout`), then the connection.
async fn serve_tls<H: Handler>(
    acceptor: TlsAcceptor,
    stream: tokio::net::TcpStream,
    builder: &auto::Builder<TokioExecutor>,
    conn: Arc<ConnInfo>,
    handler: Arc<H>,
    limits: &ListenerLimits,
    stop: watch::Receiver<bool>,
) {
    let peer = conn.peer;
    match tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => {
            metrics::counter!(names::TLS_HANDSHAKES, "result" => "ok").increment(1);
            serve_connection(builder, stream, conn, handler, limits, stop).await
        }
        Ok(Err(e)) => {
            metrics::counter!(names::TLS_HANDSHAKES, "result" => "error").increment(1);
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
        }
        Err(_) => {
            metrics::counter!(names::TLS_HANDSHAKES, "result" => "timeout").increment(1);
            tracing::debug!(%peer, "TLS handshake timed out");
        }
    }
}

/// Serves one connection until it ends. Closes it gracefully once it has
/// been idle for `idle_timeout` or when the listener stops; drops it when a
/// request head (HTTP/1) has been arriving for `header_read_timeout` — timed
/// from its first byte, or for the first request from the accept.
async fn serve_connection<S, H>(
    builder: &auto::Builder<TokioExecutor>,
    stream: S,
    conn: Arc<ConnInfo>,
    handler: Arc<H>,
    limits: &ListenerLimits,
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
        let in_flight = InFlight::start(track.clone(), req.version() == http::Version::HTTP_2);
        async move {
            // Boxed per request: hyper keeps a slot for this future in every
            // connection, idle or not, and the whole pipeline's state machine
            // inline would make each idle keep-alive connection that much bigger.
            let res = Box::pin(handler.handle(req, conn)).await;
            // hyper takes any body type: wrapped, not boxed again.
            Ok::<_, Infallible>(res.map(|inner| Tracked {
                inner,
                _in_flight: in_flight,
            }))
        }
    });
    let io = Watched {
        inner: stream,
        activity: activity.clone(),
    };
    let connection = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    let (idle_timeout, head_timeout) = (limits.idle_timeout, limits.header_read_timeout);
    let every = (idle_timeout.min(head_timeout) / 4)
        .clamp(Duration::from_millis(50), Duration::from_secs(1));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut closing = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            _ = stop.changed(), if !closing => {
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
            _ = tick.tick() => {
                if activity.head_pending_for().is_some_and(|t| t >= head_timeout) {
                    tracing::debug!(%peer, "request head not complete within header_read_timeout; closing");
                    return;
                }
                if !closing && activity.idle_for().is_some_and(|idle| idle >= idle_timeout) {
                    tracing::debug!(%peer, "closing idle connection");
                    connection.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
        }
    }
}
