//! HTTP/2, served by hyper: its abuse limits, the streams in flight on a
//! connection, and the connection's closing (idle, no first request in
//! time, a drain, a GOAWAY the client never finishes).
use http::Request;
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

use super::limits::{head_backstop, ListenerLimits};
use crate::http_core::body::{read_before_answer, Body, RequestBody, Unread, DRAIN_MAX_BYTES};
use crate::http_core::service::{ConnInfo, Handler, Reply};

/// hyper's HTTP/2 server (HTTP/1.1 is [`crate::h1`]'s).
pub(super) fn h2_builder(limits: &ListenerLimits) -> http2::Builder<TokioExecutor> {
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

/// What an HTTP/2 connection is doing, for its idle timeout: streams in
/// flight (until their response body has gone) and when the last one ended.
struct Activity {
    started: Instant,
    in_flight: AtomicUsize,
    /// When the last request ended, in ms since `started` (at least 1): 0
    /// until one has.
    last_done_ms: AtomicU64,
}

// === impl Activity ===

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

/// One stream counted in flight in its connection's [`Activity`], from its
/// complete head until its response body has gone (or the request was
/// dropped half-way).
struct ActiveStream(Arc<Activity>);

// === impl ActiveStream ===

impl ActiveStream {
    fn start(activity: Arc<Activity>) -> Self {
        activity.request_started();
        ActiveStream(activity)
    }
}

impl Drop for ActiveStream {
    fn drop(&mut self) {
        self.0.request_done();
    }
}

/// A response body that keeps its request in flight until it has gone, and
/// with it what is left unread of the request body, drained after it.
struct Tracked {
    inner: Body,
    _active: ActiveStream,
    _unread: Option<Box<Unread>>,
}

// === impl Tracked ===

impl http_body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = crate::http_core::body::BoxError;

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

/// Handles a request whose body may still be coming. A body the handler
/// leaves unread comes back, and its rest is read before the answer goes
/// ([`read_before_answer`]); what is still unread then goes with the answer's
/// body, to be drained after it.
async fn handle_with_body<H: Handler>(
    handler: &H,
    req: Request<Incoming>,
    conn: Arc<ConnInfo>,
) -> (Reply<H::Stamp>, Option<Box<Unread>>) {
    let (give_back, mut given_back) = tokio::sync::oneshot::channel();
    let req = req.map(|body| RequestBody::h2(body, Some(give_back)));
    let reply = handler.handle(req, conn).await;
    let unread = match given_back.try_recv() {
        Ok(body) => read_before_answer(body).await.map(Box::new),
        Err(_) => None,
    };
    (reply, unread)
}

/// Serves an HTTP/2 connection until it ends; closes it gracefully once it
/// has had no stream for `idle_timeout`, when its first request has not come
/// by `first_request_by`, or when the listener stops. (hyper gives no hook
/// for when a later stream's headers begin: those are bounded by the header
/// list limit and `idle_timeout`, not `header_read_timeout`.)
pub(super) async fn serve_h2<S, H>(
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
        let active = ActiveStream::start(track.clone());
        serve_stream(handler, req, conn, active)
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
    let deadlines = Deadlines {
        idle_timeout,
        goaway_grace: idle_timeout.min(GOAWAY_GRACE),
        first_request_by,
    };
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
            _ = tick.tick() => match deadlines.on_tick(&activity, closing, peer) {
                OnTick::Wait => {}
                OnTick::Close(now) => {
                    connection.as_mut().graceful_shutdown();
                    closing = Some(now);
                }
                OnTick::Drop => return,
            },
        }
    }
}

/// One stream's answer, from the handler, with the stream kept in flight
/// until its response body has gone.
fn serve_stream<H: Handler>(
    handler: Arc<H>,
    req: Request<Incoming>,
    conn: Arc<ConnInfo>,
    active: ActiveStream,
) -> impl std::future::Future<Output = Result<http::Response<Tracked>, Infallible>> {
    // Each stream is a task of its own (hyper's), outside the
    // connection task's clock reading: the pipeline's clock reads share
    // one reading per poll here too.
    crate::clock::reading_once_per_poll(async move {
        // Boxed per request: hyper keeps a slot for this future in every
        // stream, and the whole pipeline's state machine inline would make
        // each one that much bigger. A body that may still be coming,
        // within the drain's byte bound, takes the longer way
        // (`handle_with_body`); hyper gives a body that ended with its
        // head a length of 0.
        let hint = http_body::Body::size_hint(req.body());
        let (reply, unread) = if hint.exact() == Some(0) || hint.lower() > DRAIN_MAX_BYTES {
            let req = req.map(|body| RequestBody::h2(body, None));
            (Box::pin(handler.handle(req, conn)).await, None)
        } else {
            Box::pin(handle_with_body(&*handler, req, conn)).await
        };
        // hyper writes the header map only: the stamped fields and a
        // target's relayed fields go in.
        let res = reply.into_response();
        // hyper takes any body type: wrapped, not boxed again.
        Ok::<_, Infallible>(res.map(|inner| Tracked {
            inner,
            _active: active,
            _unread: unread,
        }))
    })
}

/// The longest a closing HTTP/2 connection with no stream in flight is left
/// to finish its GOAWAY exchange.
const GOAWAY_GRACE: Duration = Duration::from_secs(5);

/// When an HTTP/2 connection is closed, checked on each tick.
struct Deadlines {
    /// Closed gracefully after this long with no stream in flight.
    idle_timeout: Duration,
    /// Dropped after this long closing with no stream in flight.
    goaway_grace: Duration,
    /// Closed gracefully if no request has come by then.
    first_request_by: Instant,
}

/// What a tick does to the connection.
enum OnTick {
    /// Nothing yet.
    Wait,
    /// Closes it gracefully (GOAWAY), from this instant.
    Close(Instant),
    /// Drops it: its GOAWAY was never finished.
    Drop,
}

// === impl Deadlines ===

impl Deadlines {
    /// What this tick does, given since when the connection has been
    /// closing, if it has.
    #[inline]
    fn on_tick(
        &self,
        activity: &Activity,
        closing: Option<Instant>,
        peer: std::net::SocketAddr,
    ) -> OnTick {
        let now = crate::clock::now();
        match closing {
            None => {
                if activity
                    .idle_for()
                    .is_some_and(|idle| idle >= self.idle_timeout)
                {
                    tracing::debug!(%peer, "closing idle connection");
                    OnTick::Close(now)
                } else if now >= self.first_request_by && !activity.had_a_request() {
                    // Checked on this tick: at most a second late.
                    tracing::debug!(%peer, "closing HTTP/2 connection with no request within header_read_timeout");
                    OnTick::Close(now)
                } else {
                    OnTick::Wait
                }
            }
            Some(since) => {
                if now.saturating_duration_since(since) >= self.goaway_grace
                    && activity
                        .idle_for()
                        .is_some_and(|idle| idle >= self.goaway_grace)
                {
                    tracing::debug!(%peer, "closing connection that did not finish its GOAWAY");
                    OnTick::Drop
                } else {
                    OnTick::Wait
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Response, StatusCode};

    /// Answers 200 when two clock readings, 2 ms apart within one poll,
    /// are the same reading.
    struct TwoReadings;

    impl Handler for TwoReadings {
        type Stamp = ();

        async fn handle(&self, _: Request<RequestBody>, _: Arc<ConnInfo>) -> Reply {
            let first = crate::clock::now();
            std::thread::sleep(Duration::from_millis(2));
            let mut res = Response::new(crate::http_core::body::empty());
            if crate::clock::now() != first {
                *res.status_mut() = StatusCode::CONFLICT;
            }
            res.into()
        }
    }

    #[tokio::test]
    async fn a_streams_clock_reads_share_one_reading_per_poll() {
        let limits = ListenerLimits {
            name: "test",
            max_connections: 16,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(10),
            max_header_bytes: 16 * 1024,
            shutdown_grace: Duration::from_secs(1),
        };
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        let (_stop, stop) = watch::channel(false);
        let conn = Arc::new(ConnInfo::new(([127, 0, 0, 1], 1).into(), false));
        tokio::spawn(async move {
            let h2 = h2_builder(&limits);
            let by = Instant::now() + limits.header_read_timeout;
            serve_h2(
                server_io,
                &h2,
                conn,
                Arc::new(TwoReadings),
                &limits,
                by,
                stop,
            )
            .await;
        });
        let (client, connection) = h2::client::handshake(client_io).await.unwrap();
        tokio::spawn(connection);
        let mut client = client.ready().await.unwrap();
        let req = http::Request::get("http://gateway/").body(()).unwrap();
        let (res, _) = client.send_request(req, true).unwrap();
        assert_eq!(res.await.unwrap().status(), StatusCode::OK);
    }
}
