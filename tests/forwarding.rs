//! Forwarding against real sockets and misbehaving targets: refused
//! connections, resets before and mid-response, stalls past each timeout,
//! ejection and return, active checks, connection limits, retries of
//! idempotent vs non-idempotent requests, large streamed bodies in bounded
//! gateway memory, pass-through fidelity (statuses, headers, h2 both ways),
//! and HTTPS targets with a CA file and a client certificate.
mod common;

use bytes::Bytes;
use common::{client, Gateway, TestConfig};
use http::{Request, Response};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

type BoxBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

// === A well-behaved backend with a few misbehaving paths ===

/// A hyper backend (HTTP/1.1 and h2c) that counts what reaches it.
///
/// By the path's last segment: `source?bytes=N` streams N bytes;
/// `too-many` is 429 with `Retry-After: 5`; `fail` is 500; `slow-body`
/// sends headers and 1 byte then stalls; `trickle-body` sends a byte every
/// 100 ms for 5 s; `health` follows `healthy`;
/// anything else counts the request body as it streams and answers with
/// method, version and body length as JSON.
struct Backend {
    addr: SocketAddr,
    hits: Arc<AtomicUsize>,
    /// Connections accepted.
    accepted: Arc<AtomicUsize>,
    methods: Arc<Mutex<Vec<String>>>,
    healthy: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Backend {
    async fn start() -> Backend {
        Self::start_at("127.0.0.1:0".parse().unwrap()).await
    }

    async fn start_at(addr: SocketAddr) -> Backend {
        let listener = TcpListener::bind(addr).await.unwrap();
        Self::serve(listener, None)
    }

    fn serve(listener: TcpListener, tls: Option<tokio_rustls::TlsAcceptor>) -> Backend {
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        let methods: Arc<Mutex<Vec<String>>> = Arc::default();
        let healthy = Arc::new(AtomicBool::new(true));
        let accepted = Arc::new(AtomicUsize::new(0));
        let (h, m, ok, a) = (
            hits.clone(),
            methods.clone(),
            healthy.clone(),
            accepted.clone(),
        );
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                a.fetch_add(1, Ordering::SeqCst);
                let (h, m, ok, tls) = (h.clone(), m.clone(), ok.clone(), tls.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let (h, m, ok) = (h.clone(), m.clone(), ok.clone());
                        async move { Ok::<_, std::convert::Infallible>(backend(req, h, m, ok).await) }
                    });
                    let builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    match tls {
                        Some(acceptor) => {
                            if let Ok(s) = acceptor.accept(stream).await {
                                let _ = builder.serve_connection(TokioIo::new(s), svc).await;
                            }
                        }
                        None => {
                            let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
                        }
                    }
                });
            }
        });
        Backend {
            addr,
            hits,
            accepted,
            methods,
            healthy,
            task,
        }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

fn full(status: u16, body: impl Into<Bytes>) -> Response<BoxBody> {
    Response::builder()
        .status(status)
        .body(
            Full::new(body.into())
                .map_err(|never| match never {})
                .boxed(),
        )
        .unwrap()
}

async fn backend(
    req: Request<Incoming>,
    hits: Arc<AtomicUsize>,
    methods: Arc<Mutex<Vec<String>>>,
    healthy: Arc<AtomicBool>,
) -> Response<BoxBody> {
    // Only the last segment counts, so any route prefix reaches the same behaviour.
    let op = req
        .uri()
        .path()
        .rsplit('/')
        .next()
        .unwrap_or("")
        .to_string();
    if op == "health" {
        let ok = healthy.load(Ordering::SeqCst);
        return full(if ok { 200 } else { 503 }, "");
    }
    hits.fetch_add(1, Ordering::SeqCst);
    methods.lock().unwrap().push(req.method().to_string());
    let version = format!("{:?}", req.version());
    let method = req.method().to_string();
    match op.as_str() {
        "source" => {
            let n: usize = req
                .uri()
                .query()
                .and_then(|q| q.strip_prefix("bytes="))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let chunk = Bytes::from(vec![b'z'; 64 * 1024]);
            let frames = futures_util::stream::iter((0..n.div_ceil(chunk.len())).map(move |i| {
                let len = chunk.len().min(n - i * chunk.len());
                Ok::<_, std::io::Error>(Frame::data(chunk.slice(..len)))
            }));
            Response::new(BodyExt::boxed(StreamBody::new(frames)))
        }
        "too-many" => {
            let mut res = full(429, "{\"error\":\"slow down\"}");
            let h = res.headers_mut();
            h.insert("retry-after", "5".parse().unwrap());
            h.insert("x-backend-note", "kept".parse().unwrap());
            h.insert("connection", "x-hop".parse().unwrap());
            h.insert("x-hop", "must go".parse().unwrap());
            // The gateway's own request id replaces the target's; a repeated
            // field is relayed whole.
            h.insert("x-request-id", "the-targets".parse().unwrap());
            h.append("set-cookie", "a=1".parse().unwrap());
            h.append("set-cookie", "b=2".parse().unwrap());
            res
        }
        "fail" => full(500, "backend exploded"),
        "slow-head" => {
            tokio::time::sleep(Duration::from_millis(300)).await;
            full(200, "late")
        }
        "slow-body" => {
            let frames = futures_util::stream::unfold(0u8, |state| async move {
                match state {
                    0 => Some((
                        Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(b"x"))),
                        1,
                    )),
                    _ => {
                        tokio::time::sleep(Duration::from_secs(5)).await;
                        None
                    }
                }
            });
            Response::new(BodyExt::boxed(StreamBody::new(frames)))
        }
        "trickle-body" => {
            let frames = futures_util::stream::unfold(0u8, |n| async move {
                if n == 50 {
                    return None;
                }
                if n > 0 {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                let byte = Frame::data(Bytes::from_static(b"x"));
                Some((Ok::<_, std::io::Error>(byte), n + 1))
            });
            Response::new(BodyExt::boxed(StreamBody::new(frames)))
        }
        _ => {
            // Count the body as it streams, never holding it.
            let mut body = req.into_body();
            let mut len = 0usize;
            while let Some(frame) = body.frame().await {
                match frame {
                    Ok(f) => len += f.data_ref().map_or(0, |d| d.len()),
                    Err(_) => return full(400, "body failed"),
                }
            }
            let v = json!({ "method": method, "version": version, "body_len": len });
            full(200, v.to_string())
        }
    }
}

// === Raw misbehaving targets ===

/// An address nothing listens on (bound, then closed).
async fn refusing() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap()
}

/// What a raw target does after reading the request head.
#[derive(Clone, Copy)]
enum Misbehave {
    /// Sends TCP RST without answering.
    ResetAfterRequest,
    /// Promises 100 000 bytes, sends 1 000, then RST.
    ResetMidResponse,
    /// Accepts and never says anything.
    Silent,
}

/// A raw TCP target; returns its address and a count of accepted connections.
async fn misbehaving(how: Misbehave) -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let conns = Arc::new(AtomicUsize::new(0));
    let counter = conns.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                if let Misbehave::Silent = how {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    return;
                }
                let mut buf = vec![0u8; 65536];
                let _ = s.read(&mut buf).await;
                if let Misbehave::ResetMidResponse = how {
                    let head = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n";
                    let _ = s.write_all(head).await;
                    let _ = s.write_all(&[b'a'; 1000]).await;
                    let _ = s.flush().await;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let _ = s.set_zero_linger();
                drop(s);
            });
        }
    });
    (addr, conns)
}

// === Gateway set-up ===

/// Routes with no authentication onto `clusters` (and any extra upstream).
fn config(targets: &[String]) -> TestConfig {
    let mut c = TestConfig::new("127.0.0.1:9".parse().unwrap());
    c.set("upstreams.clusters.targets", targets.to_vec());
    c.set("admin.enabled", true);
    c.set("admin.listen", "127.0.0.1:0");
    for method in ["GET", "POST", "PUT", "DELETE"] {
        route(&mut c, method, "/fwd/{op}", "clusters");
    }
    c
}

fn route(c: &mut TestConfig, method: &str, path: &str, upstream: &str) {
    c.route(&format!(
        "method = \"{method}\"\npath = \"{path}\"\nauth = \"none\"\nupstream = \"{upstream}\"\nrate_limit = \"none\""
    ));
}

fn start(c: &TestConfig) -> Gateway {
    Gateway::start(&c.write())
}

async fn metrics(gw: &Gateway) -> String {
    let url = format!("http://{}/metrics", gw.admin.expect("admin listener"));
    client()
        .get(url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The value of the first metric line starting with `prefix` (labels included).
fn metric(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|x| l.contains(x)))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

async fn send(gw: &Gateway, method: &str, path: &str) -> (u16, http::HeaderMap, String) {
    let res = client()
        .request(method.parse().unwrap(), gw.url(path))
        .body("payload")
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    (status, headers, res.text().await.unwrap_or_default())
}

/// Polls `f` until it holds, for at most `secs` seconds.
async fn eventually<F, Fut>(secs: u64, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < until {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

// === Refused connections, retries and ejection ===

#[tokio::test]
async fn a_refused_target_is_retried_around_for_idempotent_requests_then_ejected() {
    let good = Backend::start().await;
    let refused = format!("http://{}", refusing().await);
    let mut c = config(&[refused.clone(), good.url()]);
    c.set("upstreams.clusters.max_fails", 2);
    c.set("upstreams.clusters.fail_timeout", "30s");
    let gw = start(&c);
    for i in 0..6 {
        let (status, _, body) = send(&gw, "GET", &format!("/fwd/get{i}")).await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(good.hits(), 6);
    let m = metrics(&gw).await;
    let t = format!("target=\"{refused}\"");
    assert_eq!(
        metric(&m, "mpg_upstream_target_ejections_total", &[&t]),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        metric(&m, "mpg_upstream_target_up", &[&t]),
        Some(0.0),
        "{m}"
    );
    let retries = metric(&m, "mpg_upstream_retries_total", &["upstream=\"clusters\""]);
    assert!(retries.is_some_and(|r| r >= 1.0), "{m}");
}

#[tokio::test]
async fn a_post_is_never_retried_but_put_and_delete_are() {
    let good = Backend::start().await;
    let refused = format!("http://{}", refusing().await);
    let mut c = config(&[refused, good.url()]);
    c.set("upstreams.clusters.max_fails", 0); // never eject: every request meets the refusal
    let gw = start(&c);
    let mut ok = 0;
    let mut bad_gateway = 0;
    for i in 0..6 {
        let (status, headers, body) = send(&gw, "POST", &format!("/fwd/post{i}")).await;
        match status {
            200 => ok += 1,
            502 => {
                bad_gateway += 1;
                assert_eq!(
                    serde_json::from_str::<Value>(&body).unwrap()["error"],
                    "BadGateway"
                );
                assert!(headers.contains_key("x-request-id"));
            }
            other => panic!("POST answered {other}: {body}"),
        }
    }
    assert!(
        bad_gateway >= 2,
        "round robin sends some POSTs to the refusing target"
    );
    assert_eq!(good.hits(), ok, "every 200 is one POST at the good target");
    for method in ["PUT", "DELETE", "GET"] {
        for i in 0..4 {
            let (status, _, body) = send(&gw, method, &format!("/fwd/idem{i}")).await;
            assert_eq!(status, 200, "{method}: {body}");
            // A retried request still carries its whole body.
            let v: Value = serde_json::from_str(&body).unwrap();
            assert_eq!(v["body_len"], "payload".len(), "{method}");
        }
    }
    let methods = good.methods.lock().unwrap().clone();
    assert_eq!(methods.iter().filter(|m| *m == "POST").count(), ok);
    assert_eq!(methods.iter().filter(|m| *m == "PUT").count(), 4);
}

#[tokio::test]
async fn a_request_that_reached_a_target_is_never_retried_even_a_get() {
    let good = Backend::start().await;
    let (reset, conns) = misbehaving(Misbehave::ResetAfterRequest).await;
    let mut c = config(&[format!("http://{reset}"), good.url()]);
    c.set("upstreams.clusters.max_fails", 0);
    let gw = start(&c);
    let mut failed = 0;
    for (i, method) in ["GET", "POST", "GET", "POST", "GET", "POST"]
        .iter()
        .enumerate()
    {
        let (status, _, body) = send(&gw, method, &format!("/fwd/r{i}")).await;
        match status {
            200 => {}
            502 => failed += 1,
            other => panic!("{method} answered {other}: {body}"),
        }
    }
    assert!(failed >= 2, "some requests met the resetting target");
    assert_eq!(
        good.hits(),
        6 - failed,
        "nothing that reached the resetting target was sent again"
    );
    assert_eq!(conns.load(Ordering::SeqCst), failed);
}

// === Resets mid-response, ejection, 503 at once, and coming back ===

#[tokio::test]
async fn a_target_that_resets_mid_response_is_ejected_then_503_comes_at_once() {
    let (addr, conns) = misbehaving(Misbehave::ResetMidResponse).await;
    let mut c = config(&[format!("http://{addr}")]);
    c.set("upstreams.clusters.max_fails", 2);
    c.set("upstreams.clusters.fail_timeout", "20s");
    let gw = start(&c);
    for i in 0..2 {
        let res = client()
            .get(gw.url(&format!("/fwd/cut{i}")))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200, "headers arrived before the reset");
        assert_eq!(res.headers()["content-length"], "100000");
        // The gateway closes the connection short of the length it relayed:
        // the client sees the truncation as an error, never as a whole body.
        let body = res.bytes().await;
        assert!(body.is_err(), "a cut-off body read as whole: {body:?}");
    }
    let started = Instant::now();
    let (status, headers, body) = send(&gw, "GET", "/fwd/after").await;
    assert_eq!(status, 503, "{body}");
    assert!(started.elapsed() < Duration::from_millis(1500));
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"], "ServiceUnavailable");
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=20).contains(&retry), "{retry}");
    assert!(headers.contains_key("x-request-id"));
    assert_eq!(
        conns.load(Ordering::SeqCst),
        2,
        "an ejected target is not tried"
    );
    let m = metrics(&gw).await;
    assert!(
        metric(
            &m,
            "mpg_upstream_requests_total",
            &["outcome=\"unavailable\""]
        ) == Some(1.0),
        "{m}"
    );
}

#[tokio::test]
async fn upstream_time_is_measured_per_upstream_for_answers_only() {
    let back = Backend::start().await;
    let down = refusing().await;
    let mut c = config(&[back.url()]);
    c.set("upstreams.down.targets", vec![format!("http://{down}")]);
    route(&mut c, "GET", "/down/{op}", "down");
    let gw = start(&c);
    assert_eq!(send(&gw, "GET", "/fwd/slow-head").await.0, 200);
    assert_eq!(send(&gw, "GET", "/fwd/quick").await.0, 200);
    assert_eq!(send(&gw, "GET", "/down/x").await.0, 502);
    let m = metrics(&gw).await;
    let up = "upstream=\"clusters\"";
    let count = metric(&m, "mpg_upstream_duration_seconds_count", &[up]);
    assert_eq!(count, Some(2.0), "both answers are counted: {m}");
    let fast = metric(
        &m,
        "mpg_upstream_duration_seconds_bucket",
        &[up, "le=\"0.25\""],
    );
    assert_eq!(
        fast,
        Some(1.0),
        "only the quick answer is under 250 ms: {m}"
    );
    let sum = metric(&m, "mpg_upstream_duration_seconds_sum", &[up]).unwrap();
    let route = "route=\"/fwd/{op}\"";
    let whole = metric(&m, "mpg_request_duration_seconds_sum", &[route]).unwrap();
    assert!(
        (0.3..=whole).contains(&sum),
        "the upstream's 300 ms are in it, and it is within the requests' time ({sum} of {whole})"
    );
    assert_eq!(
        metric(
            &m,
            "mpg_upstream_duration_seconds_count",
            &["upstream=\"down\""]
        )
        .unwrap_or(0.0),
        0.0,
        "a target that never answered adds no upstream time: {m}"
    );
    assert_eq!(
        metric(
            &m,
            "mpg_upstream_requests_total",
            &["upstream=\"down\"", "outcome=\"connect_error\""]
        ),
        Some(1.0),
        "{m}"
    );
}

#[tokio::test]
async fn a_target_that_comes_back_takes_requests_after_its_cool_down() {
    let addr = refusing().await;
    let mut c = config(&[format!("http://{addr}")]);
    c.set("upstreams.clusters.max_fails", 1);
    c.set("upstreams.clusters.fail_timeout", "1s");
    let gw = start(&c);
    let (status, _, _) = send(&gw, "GET", "/fwd/a").await;
    assert_eq!(status, 502);
    let (status, headers, _) = send(&gw, "GET", "/fwd/b").await;
    assert_eq!(status, 503);
    assert_eq!(headers["retry-after"], "1");
    let back = Backend::start_at(addr).await;
    let recovered = eventually(8, || async { send(&gw, "GET", "/fwd/c").await.0 == 200 }).await;
    assert!(
        recovered,
        "the target took requests again after the cool-down"
    );
    assert!(back.hits() >= 1);
    let m = metrics(&gw).await;
    let t = format!("target=\"http://{addr}\"");
    assert_eq!(
        metric(&m, "mpg_upstream_target_up", &[&t]),
        Some(1.0),
        "{m}"
    );
}

#[tokio::test]
async fn active_checks_eject_and_restore_a_target_without_failing_client_requests() {
    let a = Backend::start().await;
    let b = Backend::start().await;
    let mut c = config(&[a.url(), b.url()]);
    c.set("upstreams.clusters.health_path", "/health");
    c.set("upstreams.clusters.health_interval", "100ms");
    c.set("upstreams.clusters.fail_timeout", "30s");
    let gw = start(&c);
    let label = format!("target=\"{}\"", a.url());
    a.healthy.store(false, Ordering::SeqCst);
    let ejected = eventually(5, || async {
        metric(&metrics(&gw).await, "mpg_upstream_target_up", &[&label]) == Some(0.0)
    })
    .await;
    assert!(ejected, "a failing health check ejects the target");
    let before = a.hits();
    for i in 0..6 {
        assert_eq!(send(&gw, "GET", &format!("/fwd/h{i}")).await.0, 200);
    }
    assert_eq!(a.hits(), before, "an ejected target gets no traffic");
    a.healthy.store(true, Ordering::SeqCst);
    let restored = eventually(5, || async {
        metric(&metrics(&gw).await, "mpg_upstream_target_up", &[&label]) == Some(1.0)
    })
    .await;
    assert!(
        restored,
        "a passing check restores it long before fail_timeout"
    );
    for i in 0..6 {
        assert_eq!(send(&gw, "GET", &format!("/fwd/r{i}")).await.0, 200);
    }
    assert!(a.hits() > before);
}

// === Stalls past each timeout ===

#[tokio::test]
async fn stalls_past_the_connect_header_and_whole_request_timeouts() {
    let good = Backend::start().await;
    let (silent, _) = misbehaving(Misbehave::Silent).await;
    // A TLS handshake that never completes is a connect stall.
    let mut c = config(&[format!("https://{silent}"), good.url()]);
    c.set("upstreams.clusters.connect_timeout", "300ms");
    c.set("upstreams.clusters.max_fails", 0);
    c.set("upstreams.stall.targets", vec![format!("http://{silent}")]);
    c.set("upstreams.stall.request_timeout", "400ms");
    c.set("upstreams.body.targets", vec![good.url()]);
    c.set("upstreams.body.request_timeout", "500ms");
    c.set("upstreams.body.timeout", "800ms");
    c.set(
        "upstreams.connect.targets",
        vec![format!("https://{silent}")],
    );
    c.set("upstreams.connect.connect_timeout", "300ms");
    route(&mut c, "GET", "/stall/{x}", "stall");
    route(&mut c, "GET", "/body/{x}", "body");
    route(&mut c, "GET", "/connect/{x}", "connect");
    let gw = start(&c);

    // Connect stall: a GET goes to the other target after connect_timeout.
    for i in 0..2 {
        let started = Instant::now();
        assert_eq!(send(&gw, "GET", &format!("/fwd/c{i}")).await.0, 200);
        assert!(started.elapsed() < Duration::from_secs(3));
    }
    let started = Instant::now();
    let (status, _, body) = send(&gw, "GET", "/connect/x").await;
    assert_eq!(status, 502, "{body}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(3),
        "{took:?}"
    );

    // Header stall: 504 after request_timeout.
    let started = Instant::now();
    let (status, headers, body) = send(&gw, "GET", "/stall/x").await;
    assert_eq!(status, 504, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"],
        "GatewayTimeout"
    );
    assert!(headers.contains_key("x-request-id"));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(350) && took < Duration::from_secs(3),
        "{took:?}"
    );

    // Body stall: the headers come, the body is cut once it has sent
    // nothing for request_timeout; a body that keeps coming is cut at the
    // whole-request timeout.
    for (op, at_least) in [("slow-body", 450), ("trickle-body", 750)] {
        let started = Instant::now();
        let res = client()
            .get(gw.url(&format!("/body/{op}")))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        assert!(
            res.bytes().await.is_err(),
            "{op}: the body ends in an error"
        );
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(at_least)
                && took < Duration::from_millis(at_least + 1500),
            "{op}: {took:?}"
        );
    }
}

#[tokio::test]
async fn a_target_at_its_connection_limit_gets_503_after_a_short_wait() {
    let good = Backend::start().await;
    let mut c = config(&[good.url()]);
    c.set("upstreams.clusters.max_connections_per_target", 1);
    c.set("upstreams.clusters.connect_timeout", "300ms");
    let gw = start(&c);
    let holding = client().get(gw.url("/fwd/slow-body")).send().await.unwrap();
    assert_eq!(holding.status(), 200);
    let started = Instant::now();
    let (status, headers, _) = send(&gw, "GET", "/fwd/x").await;
    assert_eq!(status, 503);
    assert_eq!(headers["retry-after"], "1");
    assert!(started.elapsed() >= Duration::from_millis(250));
    drop(holding);
    let freed = eventually(5, || async { send(&gw, "GET", "/fwd/y").await.0 == 200 }).await;
    assert!(freed, "the slot is released when the client goes away");
}

// === Pass-through fidelity ===

#[tokio::test]
async fn statuses_bodies_and_headers_pass_through_over_h1_and_h2() {
    let good = Backend::start().await;
    let mut c = config(&[good.url()]);
    c.set("upstreams.h2.targets", vec![good.url()]);
    c.set("upstreams.h2.http2", true);
    route(&mut c, "GET", "/h2/{x}", "h2");
    let gw = start(&c);

    let (status, headers, body) = send(&gw, "GET", "/fwd/too-many").await;
    assert_eq!(status, 429);
    assert_eq!(headers["retry-after"], "5");
    assert_eq!(headers["x-backend-note"], "kept");
    assert!(
        !headers.contains_key("x-hop"),
        "hop-by-hop headers are removed"
    );
    assert!(headers.contains_key("x-request-id"));
    let relayed = |headers: &http::HeaderMap| {
        let ids: Vec<_> = headers.get_all("x-request-id").iter().collect();
        assert_eq!(ids.len(), 1, "one request id: {ids:?}");
        assert_ne!(ids[0], "the-targets", "the gateway's request id wins");
        let cookies: Vec<_> = headers.get_all("set-cookie").iter().collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
        assert!(!headers.contains_key("x-hop"));
        assert_eq!(headers["x-backend-note"], "kept");
    };
    relayed(&headers);
    assert_eq!(body, "{\"error\":\"slow down\"}");
    let (status, _, body) = send(&gw, "GET", "/fwd/fail").await;
    assert_eq!((status, body.as_str()), (500, "backend exploded"));

    // An HTTP/2 client in front; HTTP/1.1 behind, or h2 where configured.
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .no_proxy()
        .build()
        .unwrap();
    let res = h2.get(gw.url("/fwd/echo")).send().await.unwrap();
    assert_eq!(res.version(), reqwest::Version::HTTP_2);
    let v: Value = res.json().await.unwrap();
    assert_eq!(v["version"], "HTTP/1.1");
    let res = h2.get(gw.url("/h2/echo")).send().await.unwrap();
    let v: Value = res.json().await.unwrap();
    assert_eq!(v["version"], "HTTP/2.0");
    let res = h2.get(gw.url("/fwd/too-many")).send().await.unwrap();
    assert_eq!(res.status(), 429);
    assert_eq!(res.headers()["retry-after"], "5");
    relayed(res.headers());
}

#[tokio::test]
async fn upstream_connections_are_kept_alive_across_requests_and_statuses() {
    let good = Backend::start().await;
    let gw = start(&config(&[good.url()]));
    // One request at a time: each must find the previous one's connection
    // back in the pool, whatever the status, body or method was.
    for (method, path, want) in [
        ("GET", "/fwd/echo", 200),
        ("GET", "/fwd/too-many", 429),
        ("GET", "/fwd/fail", 500),
        ("POST", "/fwd/echo", 200),
        ("GET", "/fwd/source?bytes=200000", 200),
        ("DELETE", "/fwd/echo", 200),
        ("GET", "/fwd/echo", 200),
    ] {
        let (status, _, _) = send(&gw, method, path).await;
        assert_eq!(status, want, "{method} {path}");
    }
    assert_eq!(good.hits(), 7);
    assert_eq!(
        good.accepted.load(Ordering::SeqCst),
        1,
        "one upstream connection for seven sequential requests"
    );
}

// === Large bodies, both ways, in bounded memory ===

fn vm_hwm_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test]
async fn large_bodies_stream_both_ways_in_bounded_gateway_memory() {
    const SIZE: usize = 128 * 1024 * 1024;
    let good = Backend::start().await;
    let mut c = config(&[good.url()]);
    c.set("server.limits.max_body_bytes", (SIZE * 2) as i64);
    let gw = start(&c);
    assert_eq!(send(&gw, "GET", "/fwd/warm").await.0, 200);
    let before = vm_hwm_kib(gw.child.id());

    let chunk = Bytes::from(vec![b'u'; 256 * 1024]);
    let upload = futures_util::stream::iter(
        (0..SIZE / chunk.len()).map(move |_| Ok::<_, std::io::Error>(chunk.clone())),
    );
    let res = client()
        .post(gw.url("/fwd/sink"))
        .timeout(Duration::from_secs(60))
        .body(reqwest::Body::wrap_stream(upload))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let v: Value = res.json().await.unwrap();
    assert_eq!(v["body_len"], SIZE);

    let mut res = client()
        .get(gw.url(&format!("/fwd/source?bytes={SIZE}")))
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let mut got = 0usize;
    while let Some(c) = res.chunk().await.unwrap() {
        got += c.len();
    }
    assert_eq!(got, SIZE);

    let grew_mib = (vm_hwm_kib(gw.child.id()).saturating_sub(before)) / 1024;
    eprintln!("gateway peak RSS {before} KiB before, grew {grew_mib} MiB");
    assert!(
        grew_mib < 32,
        "gateway peak memory grew by {grew_mib} MiB moving 2 x {} MiB",
        SIZE >> 20
    );
}

#[tokio::test]
async fn a_client_that_stops_reading_is_cut_off_after_idle_timeout() {
    let good = Backend::start().await;
    let mut c = config(&[good.url()]);
    c.set("server.limits.idle_timeout", "1s");
    let gw = start(&c);
    // Far more than the socket buffers between the gateway and the client hold.
    const SIZE: usize = 512 << 20;
    let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let req = format!("GET /fwd/source?bytes={SIZE} HTTP/1.1\r\nHost: a\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    // Read nothing for well over idle_timeout, then drain what was sent.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    let drained = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(n @ 1..) = s.read(&mut buf).await {
            got += n;
        }
    })
    .await;
    assert!(drained.is_ok(), "the stalled connection was not closed");
    assert!(got > 0 && got < SIZE / 4, "{got} of {SIZE} bytes arrived");
    // The gateway itself is fine.
    let res = client().get(gw.url("/fwd/echo")).send().await.unwrap();
    assert_eq!(res.status(), 200);
}

// === HTTPS targets: a CA file and a client certificate ===

struct Pki {
    dir: tempfile::TempDir,
    server: Arc<rustls::ServerConfig>,
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, all
/// written as PEM; the server config requires a client certificate from the CA.
fn pki() -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf = |name: &str| {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        (cert, key)
    };
    let (server_cert, server_key) = leaf("127.0.0.1");
    let (client_cert, client_key) = leaf("client.test");
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: String| std::fs::write(dir.path().join(name), text).unwrap();
    write("ca.pem", ca.pem());
    write("client.pem", client_cert.pem());
    write("client.key", client_key.serialize_pem());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::try_from(server_key.serialize_der()).unwrap();
    let mut server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![server_cert.der().clone()], key)
        .unwrap();
    server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Pki {
        dir,
        server: Arc::new(server),
    }
}

#[tokio::test]
async fn https_targets_use_the_ca_file_and_present_the_client_certificate() {
    let pki = pki();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tls = Backend::serve(
        listener,
        Some(tokio_rustls::TlsAcceptor::from(pki.server.clone())),
    );
    let target = vec![format!("https://{}", tls.addr)];
    let file = |name: &str| pki.dir.path().join(name).to_str().unwrap().to_string();
    let mut c = config(&target);
    c.set("upstreams.clusters.ca_file", file("ca.pem"));
    c.set("upstreams.clusters.client_cert", file("client.pem"));
    c.set("upstreams.clusters.client_key", file("client.key"));
    c.set("upstreams.nocert.targets", target.clone());
    c.set("upstreams.nocert.ca_file", file("ca.pem"));
    c.set("upstreams.noca.targets", target.clone());
    c.set("upstreams.h2tls.targets", target.clone());
    c.set("upstreams.h2tls.http2", true);
    c.set("upstreams.h2tls.ca_file", file("ca.pem"));
    c.set("upstreams.h2tls.client_cert", file("client.pem"));
    c.set("upstreams.h2tls.client_key", file("client.key"));
    route(&mut c, "GET", "/nocert/{x}", "nocert");
    route(&mut c, "GET", "/noca/{x}", "noca");
    route(&mut c, "GET", "/h2tls/{x}", "h2tls");
    let gw = start(&c);

    let (status, _, body) = send(&gw, "GET", "/fwd/echo").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["version"],
        "HTTP/1.1"
    );
    let (status, _, body) = send(&gw, "GET", "/h2tls/echo").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["version"],
        "HTTP/2.0"
    );
    let hits = tls.hits();
    // The server wants a client certificate; without one the handshake fails.
    assert_eq!(send(&gw, "GET", "/nocert/x").await.0, 502);
    // Without the CA file the system roots do not trust the test CA.
    assert_eq!(send(&gw, "GET", "/noca/x").await.0, 502);
    assert_eq!(
        tls.hits(),
        hits,
        "no request passed an unverified handshake"
    );
}

// === check-config ===

#[test]
fn check_config_names_every_bad_forwarding_key() {
    let mut c = config(&["http://127.0.0.1:9".to_string()]);
    c.set("upstreams.clusters.balance", "fastest");
    c.set(
        "upstreams.bad.targets",
        vec!["http://127.0.0.1:9".to_string()],
    );
    c.set("upstreams.bad.ca_file", "/nonexistent/ca.pem");
    c.set("upstreams.bad.health_interval", "1s");
    c.set("upstreams.bad.max_connections_per_target", 0);
    c.set(
        "upstreams.tls.targets",
        vec!["https://127.0.0.1:9".to_string()],
    );
    c.set("upstreams.tls.ca_file", "/nonexistent/ca.pem");
    c.set("upstreams.tls.client_cert", "/nonexistent/c.pem");
    let (code, _, err) = common::cli(&c.write(), &["check-config"]);
    assert_eq!(code, 2, "{err}");
    for needle in [
        "upstreams.clusters.balance",
        "upstreams.bad.ca_file: applies only to https:// targets",
        "upstreams.bad.health_interval: needs health_path",
        "upstreams.bad.max_connections_per_target: must be at least 1",
        "upstreams.tls.ca_file: cannot read /nonexistent/ca.pem",
        "upstreams.tls.client_key: required with client_cert",
    ] {
        assert!(err.contains(needle), "missing {needle:?} in:\n{err}");
    }
}
