//! The Upstream: pick a healthy target (balance) → take one of its
//! connection permits → send to it (`transport`: a pooled HTTP/1.1
//! connection, or hyper-util's client for h2 targets; HTTPS through rustls)
//! → count the outcome for the target's health and answer the client →
//! retry a connect failure on another target when that is safe. Bodies
//! stream both ways (see `stream`).
//!
//! An upstream is built once per configuration: a reload that leaves its
//! `[upstreams.NAME]` table and TLS files as they were keeps it running
//! ([`Upstream::serves`]), with its targets' health, pools and checker.
use http::uri::PathAndQuery;
use http::{request, Method, Response};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::task::AbortOnDropHandle;

use super::balance::Balancer;
use super::client::{ClientError, Conn, Incoming};
use super::headers::sanitize_response;
use super::headers::Added;
use super::health::{active_check, Targets};
use super::stream::{InFlight, ResponseBody, Slot, TakeOnPoll};
use super::tls_client::{connector, files_digest};
use super::transport::Transport;
use crate::config::HttpUpstreamSettings;
use crate::http::body::{Body, BoxError};
use crate::metrics::names;

/// Why forwarding failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The target could not be reached, or the connect timed out (→ 502).
    #[error("cannot connect to the upstream: {0}")]
    Connect(#[source] BoxError),
    /// No response headers within `request_timeout` (or `timeout`) (→ 504).
    #[error("the upstream did not answer in time")]
    Timeout,
    /// The connection failed mid-request (→ 502).
    #[error("the upstream connection failed: {0}")]
    Reset(#[source] BoxError),
    /// The client's request body went over `max_body_bytes` while streaming (→ 413).
    #[error("the request body is too large")]
    BodyTooLarge,
    /// Every target is ejected (→ 503 with `Retry-After`).
    #[error("every target of the upstream is down")]
    Unavailable {
        /// Whole seconds until the first target's cool-down ends (at least 1).
        retry_after: u64,
    },
    /// Every healthy target is at `max_connections_per_target` (→ 503).
    #[error("every target of the upstream is at its connection limit")]
    Saturated,
    /// The upstream configuration is unusable.
    #[error("invalid upstream: {0}")]
    Config(String),
}

impl UpstreamError {
    /// Whether the client caused it, through its request body: never held
    /// against the target's health.
    pub(crate) fn is_client_side(&self) -> bool {
        matches!(self, UpstreamError::BodyTooLarge) || self.client_body_error().is_some()
    }

    /// The client's request body failing (cut off, malformed, stalled) as
    /// the cause of a `Reset`.
    pub(crate) fn client_body_error(&self) -> Option<&ClientError> {
        match self {
            UpstreamError::Reset(e) => e
                .downcast_ref::<ClientError>()
                .filter(|e| matches!(e, ClientError::Body(_))),
            _ => None,
        }
    }
}

/// A named upstream: its targets, their health, and the connection pool.
pub struct Upstream {
    name: String,
    /// What it was built from, to tell whether a reload changed it.
    settings: HttpUpstreamSettings,
    /// The contents of its TLS files when it was built (see [`files_digest`]).
    tls_files: Option<[u8; 32]>,
    targets: Arc<Targets>,
    balancer: Balancer,
    transport: Arc<Transport>,
    connect_timeout: Duration,
    request_timeout: Duration,
    timeout: Option<Duration>,
    retries: u32,
    retry_counter: metrics::Counter,
    /// The active checker and the idle-connection reaper.
    _tasks: Vec<AbortOnDropHandle<()>>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let labels: Vec<&str> = self.targets.list.iter().map(|t| t.label.as_str()).collect();
        f.debug_struct("Upstream")
            .field("name", &self.name)
            .field("targets", &labels)
            .finish()
    }
}

/// RFC 9110 §9.2.2: methods whose repetition has the same effect as one request.
fn idempotent(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE | Method::TRACE
    )
}

impl Upstream {
    /// Builds the pool for `cfg` (and starts its active checker, if any).
    pub fn new(name: &str, cfg: &HttpUpstreamSettings) -> Result<Self, UpstreamError> {
        let mut targets = Vec::with_capacity(cfg.targets.len());
        for t in &cfg.targets {
            let parts = t.clone().into_parts();
            match (parts.scheme, parts.authority) {
                (Some(s), Some(a)) => {
                    targets.push((s, a, t.to_string().trim_end_matches('/').to_string()))
                }
                _ => {
                    return Err(UpstreamError::Config(format!(
                        "target {t} needs a scheme and host"
                    )))
                }
            }
        }
        if targets.is_empty() {
            return Err(UpstreamError::Config("no targets".into()));
        }
        // Before the connector reads them: a file replaced in between makes
        // the next reload rebuild, never keep a stale connector.
        let tls_files = files_digest(cfg);
        let targets = Arc::new(Targets::new(
            name,
            targets,
            cfg.max_connections_per_target,
            cfg.max_fails,
            cfg.fail_timeout,
            cfg.idle_timeout,
        ));
        let connector = connector(cfg).map_err(UpstreamError::Config)?;
        let transport = Arc::new(if cfg.http2 {
            Transport::Http2(Box::new(
                Client::builder(TokioExecutor::new())
                    .pool_timer(TokioTimer::new())
                    .timer(TokioTimer::new())
                    .pool_idle_timeout(cfg.idle_timeout)
                    .pool_max_idle_per_host(cfg.max_connections_per_target)
                    .http2_only(true)
                    .build(connector),
            ))
        } else {
            Transport::Http1(connector)
        });
        let mut tasks = Vec::new();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            if let Some(path) = &cfg.health_path {
                let path = PathAndQuery::try_from(path.as_str())
                    .map_err(|e| UpstreamError::Config(format!("health_path: {e}")))?;
                let timeout = cfg.request_timeout.min(cfg.health_interval);
                tasks.push(AbortOnDropHandle::new(rt.spawn(active_check(
                    Arc::downgrade(&targets),
                    transport.clone(),
                    path,
                    cfg.health_interval,
                    timeout,
                ))));
            }
            // Idle connections past `idle_timeout` are closed even when no
            // request comes to take them.
            let weak = Arc::downgrade(&targets);
            let every = (cfg.idle_timeout / 2).max(Duration::from_millis(100));
            tasks.push(AbortOnDropHandle::new(rt.spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let Some(t) = weak.upgrade() else { return };
                    t.list.iter().for_each(|t| t.pool.prune());
                }
            })));
        }
        Ok(Upstream {
            name: name.to_string(),
            settings: cfg.clone(),
            tls_files,
            retry_counter: metrics::counter!(names::UPSTREAM_RETRIES, "upstream" => name.to_string()),
            targets,
            balancer: Balancer::new(cfg.balance),
            transport,
            connect_timeout: cfg.connect_timeout,
            request_timeout: cfg.request_timeout,
            timeout: cfg.timeout,
            retries: cfg.retries,
            _tasks: tasks,
        })
    }

    /// The upstream's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether this upstream is what `cfg` would build: the same settings,
    /// and the same contents in its CA and client certificate files (which
    /// a build reads). A reload keeps such an upstream running, its health
    /// state, pooled connections and active checker with it.
    pub(crate) fn serves(&self, cfg: &HttpUpstreamSettings) -> bool {
        self.settings == *cfg && self.tls_files.is_some() && files_digest(cfg) == self.tls_files
    }

    /// Makes its targets' `mpg_upstream_target_up` show their state: it is
    /// the upstream serving. Idempotent.
    pub(crate) fn publish(&self) {
        self.targets.publish();
    }

    /// A reload replaced or removed it: its active checker stops, and the
    /// requests still in flight on it no longer move the target gauges
    /// (its replacement's do). Call before publishing the replacement.
    pub(crate) fn retire(&self) {
        self.targets.retire();
    }

    /// A healthy target not in `tried`, with one of its connection permits.
    /// `None` when no untried target is up.
    async fn acquire(
        &self,
        tried: &[usize],
        now: Instant,
    ) -> Result<Option<InFlight>, UpstreamError> {
        let now = self.targets.at(now);
        let mut full: Vec<usize> = Vec::new();
        loop {
            // The common case (no target full) allocates nothing.
            let skip: std::borrow::Cow<'_, [usize]> = if full.is_empty() {
                tried.into()
            } else {
                tried
                    .iter()
                    .chain(&full)
                    .copied()
                    .collect::<Vec<_>>()
                    .into()
            };
            let Some(i) = self.balancer.pick(&self.targets, &skip, now) else {
                break;
            };
            match self.targets.list[i].permits.clone().try_acquire_owned() {
                Ok(p) => return Ok(Some(InFlight::new(self.targets.clone(), i, p))),
                Err(_) => full.push(i),
            }
        }
        let Some(&first) = full.first() else {
            return Ok(None);
        };
        // Every healthy target is at its limit: wait a little for a slot, then
        // 503. Boxed: the usual request's future carries no room for the wait.
        let permits = self.targets.list[first].permits.clone();
        let wait = tokio::time::timeout(self.connect_timeout, permits.acquire_owned());
        match Box::pin(wait).await {
            Ok(Ok(p)) => Ok(Some(InFlight::new(self.targets.clone(), first, p))),
            _ => Err(UpstreamError::Saturated),
        }
    }

    /// Sends the request `parts` (headers already sanitized; only the path
    /// and query of its URI are used) with `body` to a healthy target,
    /// streaming the body both ways. The head is borrowed, so that a retry
    /// sends it again without a copy made in advance. A connect failure is
    /// retried on another target only for an idempotent method whose body
    /// was never polled: nothing of it can have reached a target.
    pub async fn forward(
        &self,
        parts: &mut request::Parts,
        body: Body,
        added: Option<&Added<'_>>,
    ) -> Result<Response<Body>, UpstreamError> {
        let started = crate::clock::now();
        let deadline = self.timeout.map(|t| started + t);
        let may_retry =
            self.retries > 0 && self.targets.list.len() > 1 && idempotent(&parts.method);
        // Only a request that may be retried pays for the reclaimable body.
        let (slot, mut body): (Option<Slot>, Option<Body>) = if may_retry {
            let (slot, b) = TakeOnPoll::slot(body);
            (Some(slot), Some(b))
        } else {
            (None, Some(body))
        };
        // Targets already tried, kept only when a retry may follow (so the usual
        // request allocates nothing here).
        let mut tried: Vec<usize> = Vec::new();
        let mut attempts: usize = 0;
        loop {
            // One clock read per attempt (the first attempt's is `started`).
            let now = match attempts {
                0 => started,
                _ => crate::clock::now(),
            };
            let hold = match self.acquire(&tried, now).await {
                Ok(Some(h)) => h,
                Ok(None) => {
                    let err = UpstreamError::Unavailable {
                        retry_after: self.targets.retry_after(self.targets.now()),
                    };
                    return Err(self.refuse(None, err));
                }
                Err(err) => return Err(self.refuse(None, err)),
            };
            let i = hold.index;
            attempts += 1;
            if may_retry {
                tried.push(i);
            }
            let target = &self.targets.list[i];
            let attempts_left = may_retry && attempts <= self.retries as usize;
            let this_body = match (body.take(), &slot) {
                (Some(b), _) => b,
                (None, Some(slot)) => TakeOnPoll::from_slot(slot),
                (None, None) => crate::http::body::empty(),
            };
            // The response head is due within `request_timeout` of this
            // attempt, and never after the request's own deadline.
            let head_by = now + self.request_timeout;
            let head_by = deadline.map_or(head_by, |d| d.min(head_by));
            let sent = self.transport.send(
                &self.targets,
                i,
                parts,
                this_body,
                !attempts_left,
                added,
                head_by,
            );
            let err = match sent.await {
                Ok((res, conn)) => return Ok(self.relay(res, conn, hold, deadline)),
                Err(e) => e,
            };
            match &err {
                // The client's request body failed (too large, cut off,
                // malformed, stalled): the target is not to blame, or any
                // client could eject every target by aborting uploads.
                _ if err.is_client_side() => return Err(err),
                UpstreamError::Connect(_) => hold.failed(),
                _ => {
                    hold.failed();
                    return Err(self.refuse(Some(i), err));
                }
            }
            drop(hold);
            let untouched = slot.as_ref().is_some_and(TakeOnPoll::untouched);
            if !(attempts_left && untouched) {
                return Err(self.refuse(Some(i), err));
            }
            if !(0..self.targets.list.len())
                .any(|j| !tried.contains(&j) && self.targets.is_up(j, self.targets.now()))
            {
                return Err(self.refuse(Some(i), err));
            }
            self.retry_counter.increment(1);
            tracing::debug!(upstream = %self.name, target = %target.label, error = %err, "connect failed; retrying on another target");
        }
    }

    /// `err` is what the client gets for this request (from target `i`, if
    /// one was tried): counted in the upstream's incident, logged when a
    /// line is due. The failure path only: an answered request pays nothing.
    fn refuse(&self, i: Option<usize>, err: UpstreamError) -> UpstreamError {
        self.targets.refused(i, &err);
        err
    }

    /// The response as the client gets it: hop-by-hop headers removed, the
    /// body relayed as it arrives. A 5xx counts against the target at once;
    /// anything else counts for it once the body has ended.
    fn relay(
        &self,
        res: Response<Incoming>,
        conn: Option<Conn>,
        hold: InFlight,
        deadline: Option<Instant>,
    ) -> Response<Body> {
        let server_error = res.status().is_server_error();
        if server_error {
            hold.failed();
        } else if http_body::Body::is_end_stream(res.body()) {
            self.targets.succeeded(hold.index);
        }
        // The response came whole: its connection serves the next request now.
        if let Some(c) = conn {
            self.targets.list[hold.index].pool.put(c);
        }
        let (mut parts, mut inner) = res.into_parts();
        sanitize_response(&mut parts.headers);
        let relayed = inner.take_relayed();
        let body = ResponseBody {
            inner,
            succeed_at_end: !server_error,
            hold: Some(hold),
            deadline: deadline.map(|d| Box::pin(tokio::time::sleep_until(d.into()))),
            stall_after: self.request_timeout,
            stall: None,
            stall_armed: false,
        };
        Response::from_parts(parts, Body::new(body).relaying(relayed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::body::Limited;
    use bytes::Bytes;
    use http::Request;
    use http_body_util::{BodyExt, StreamBody};
    use hyper::body::Frame;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    fn cfg(addr: std::net::SocketAddr, timeout_ms: u64) -> HttpUpstreamSettings {
        let text = format!(
            "[server]\ninsecure_http = true\n[upstreams.t]\ntargets = [\"http://{addr}\"]\nconnect_timeout = \"500ms\"\nrequest_timeout = \"{timeout_ms}ms\"\n[[routes]]\nmethod = \"GET\"\npath = \"/\"\nauth = \"none\"\nupstream = \"t\"\n"
        );
        match &crate::config::Settings::parse(&text).unwrap().upstreams["t"] {
            crate::config::UpstreamSettings::Http(h) => (**h).clone(),
            _ => unreachable!(),
        }
    }

    fn get(path: &str) -> Request<Body> {
        Request::get(path).body(crate::http::body::empty()).unwrap()
    }

    /// `req` through `up`, as the pipeline sends it (no added fields).
    async fn send(up: &Upstream, req: Request<Body>) -> Result<Response<Body>, UpstreamError> {
        let (mut parts, body) = req.into_parts();
        up.forward(&mut parts, body, None).await
    }

    /// A one-shot raw server: reads the request head, then runs `reply`.
    async fn raw_server(
        reply: &'static [u8],
        close_early: bool,
        stall: bool,
    ) -> std::net::SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = vec![0u8; 65536];
                let _ = s.read(&mut buf).await;
                if stall {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
                let _ = s.write_all(reply).await;
                if close_early {
                    drop(s);
                }
            }
        });
        addr
    }

    #[test]
    fn an_upstream_serves_its_settings_until_they_or_its_tls_files_change() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        let pem = |name: &str| {
            rcgen::generate_simple_self_signed(vec![name.to_string()])
                .unwrap()
                .cert
                .pem()
        };
        std::fs::write(&ca, pem("a.test")).unwrap();
        let mut c = cfg("127.0.0.1:9".parse().unwrap(), 1000);
        c.targets = vec!["https://127.0.0.1:9".parse().unwrap()];
        c.ca_file = Some(ca.clone());
        let up = Upstream::new("t", &c).unwrap();
        assert!(up.serves(&c));
        let mut other = c.clone();
        other.retries += 1;
        assert!(!up.serves(&other));
        std::fs::write(&ca, pem("b.test")).unwrap();
        assert!(!up.serves(&c), "a renewed CA file is a change");
        assert!(Upstream::new("t", &c).unwrap().serves(&c));
    }

    #[tokio::test]
    async fn forwards_and_strips_hop_headers_from_the_response() {
        let addr = raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close, x-hop\r\nx-hop: 1\r\nRetry-After: 3\r\n\r\nok", false, false).await;
        let up = Upstream::new("t", &cfg(addr, 2000)).unwrap();
        let res = send(&up, get("/a?b=c")).await.unwrap();
        assert_eq!(res.status(), 200);
        // The length is the body's size (both servers write it from there).
        assert_eq!(http_body::Body::size_hint(res.body()).exact(), Some(2));
        let res = crate::http::service::into_header_map(res);
        assert!(!res.headers().contains_key("x-hop"));
        assert!(!res.headers().contains_key("connection"));
        assert_eq!(res.headers()["retry-after"], "3");
        assert_eq!(res.into_body().collect().await.unwrap().to_bytes(), "ok");
    }

    /// A keep-alive server that counts connections and closes each one 5 ms
    /// after its second response.
    async fn counting_server() -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    for _ in 0..2 {
                        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                            match s.read(&mut chunk).await {
                                Ok(n @ 1..) => buf.extend_from_slice(&chunk[..n]),
                                _ => return,
                            }
                        }
                        buf.clear();
                        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                        if s.write_all(ok).await.is_err() {
                            return;
                        }
                    }
                    // Closed while the gateway keeps it idle in its pool.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                });
            }
        });
        (addr, accepted)
    }

    #[tokio::test]
    async fn connections_are_reused_and_one_closed_while_idle_is_replaced() {
        let (addr, accepted) = counting_server().await;
        let up = Upstream::new("t", &cfg(addr, 2000)).unwrap();
        let seq = std::sync::atomic::Ordering::SeqCst;
        for round in 1..=5 {
            let res = send(&up, get("/")).await.unwrap();
            assert_eq!(res.status(), 200, "request {round}");
            assert_eq!(res.into_body().collect().await.unwrap().to_bytes(), "ok");
            assert_eq!(up.targets.list[0].pool.idle(), 1, "request {round}");
            // Let the server's close reach the idle connection before the next request.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Two requests per connection: 1+2, 3+4, 5.
        assert_eq!(accepted.load(seq), 3);
    }

    #[tokio::test]
    async fn refused_reset_and_stalled_targets_are_told_apart() {
        let refused = {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            l.local_addr().unwrap()
        };
        let up = Upstream::new("t", &cfg(refused, 2000)).unwrap();
        assert!(matches!(
            send(&up, get("/")).await,
            Err(UpstreamError::Connect(_))
        ));

        let addr = raw_server(
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial",
            true,
            false,
        )
        .await;
        let up = Upstream::new("t", &cfg(addr, 2000)).unwrap();
        match send(&up, get("/")).await {
            // Headers arrived; the body then fails mid-stream.
            Ok(res) => assert!(res.into_body().collect().await.is_err()),
            Err(e) => assert!(matches!(e, UpstreamError::Reset(_)), "{e}"),
        }
        let addr = raw_server(b"", true, false).await;
        let up = Upstream::new("t", &cfg(addr, 2000)).unwrap();
        assert!(matches!(
            send(&up, get("/")).await,
            Err(UpstreamError::Reset(_))
        ));

        let addr = raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", false, true).await;
        let up = Upstream::new("t", &cfg(addr, 200)).unwrap();
        let started = std::time::Instant::now();
        assert!(matches!(
            send(&up, get("/")).await,
            Err(UpstreamError::Timeout)
        ));
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[tokio::test]
    async fn the_active_checker_stops_when_the_upstream_is_dropped_or_retired() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let checks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = checks.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    while let Ok(n @ 1..) = s.read(&mut buf).await {
                        if buf[..n].starts_with(b"GET /hc ") {
                            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
                        if s.write_all(ok).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let mut c = cfg(addr, 1000);
        c.health_path = Some("/hc".into());
        c.health_interval = Duration::from_millis(50);
        for retire in [false, true] {
            let up = Upstream::new("t", &c).unwrap();
            let start = checks.load(std::sync::atomic::Ordering::SeqCst);
            let until = std::time::Instant::now() + Duration::from_secs(5);
            while checks.load(std::sync::atomic::Ordering::SeqCst) < start + 2 {
                assert!(std::time::Instant::now() < until, "no health checks ran");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            // Retired (a reload replaced it), it may live on while requests
            // finish on it, but checks no more.
            let _kept = if retire {
                up.retire();
                Some(up)
            } else {
                drop(up);
                None
            };
            tokio::time::sleep(Duration::from_millis(100)).await;
            let stopped = checks.load(std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert_eq!(
                checks.load(std::sync::atomic::Ordering::SeqCst),
                stopped,
                "retired: {retire}"
            );
        }
    }

    #[tokio::test]
    async fn an_early_answer_to_a_streaming_upload_is_relayed() {
        // The target reads a little of a 16 MiB upload, answers 413 and closes.
        let addr = raw_server(
            b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbig!",
            true,
            false,
        )
        .await;
        let up = Upstream::new("t", &cfg(addr, 3000)).unwrap();
        let chunks = futures_util::stream::iter((0..256).map(|_| {
            Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(vec![b'x'; 64 * 1024])))
        }));
        let body = Body::new(StreamBody::new(chunks).map_err(|never| match never {}));
        let res = send(&up, Request::post("/upload").body(body).unwrap())
            .await
            .unwrap();
        assert_eq!(res.status(), 413);
        assert_eq!(res.into_body().collect().await.unwrap().to_bytes(), "big!");
        // Not kept: the upload was cut short.
        assert_eq!(up.targets.list[0].pool.idle(), 0);
    }

    #[tokio::test]
    async fn an_oversized_streamed_body_is_body_too_large() {
        let addr = raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", false, true).await;
        let up = Upstream::new("t", &cfg(addr, 3000)).unwrap();
        let chunks = futures_util::stream::iter((0..64).map(|_| {
            Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(vec![b'x'; 1024])))
        }));
        let body = Body::new(Limited::new(StreamBody::new(chunks), 4096));
        let req = Request::post("/").body(body).unwrap();
        assert!(matches!(
            send(&up, req).await,
            Err(UpstreamError::BodyTooLarge)
        ));
    }
}
