//! Operating the gateway: hot reload (SIGHUP and POST /reload), renewed
//! certificates, graceful shutdown, and connection hygiene — over real sockets.
mod common;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One HTTP/1.1 connection that stays open across requests.
struct OneConnection {
    sender: hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
}

impl OneConnection {
    async fn open<S>(stream: S) -> OneConnection
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        OneConnection { sender }
    }

    async fn get(&mut self, target: &str, key: &str) -> (u16, http::HeaderMap) {
        let req = http::Request::get(target)
            .header("host", "localhost")
            .header("authorization", format!("Bearer {key}"))
            .body(Empty::new())
            .unwrap();
        let res = self.sender.send_request(req).await.unwrap();
        let status = res.status().as_u16();
        let headers = res.headers().clone();
        let _ = res.into_body().collect().await;
        (status, headers)
    }
}

fn hup(gw: &Gateway) {
    signal(gw.child.id(), "HUP");
}

fn limited_world(up: &MockUpstream, requests: i64) -> TestConfig {
    let mut cfg = TestConfig::new(up.addr);
    cfg.set("rate_limit.policies.default.requests", requests);
    cfg.set("rate_limit.policies.default.per", "1m");
    cfg
}

#[tokio::test]
async fn sighup_swaps_a_policy_while_a_connection_stays_open() {
    let up = MockUpstream::start().await;
    let mut cfg = limited_world(&up, 3);
    let path = cfg.write();
    let seed = seed(&path, "acme", "alice", "owner", "clusters:read");
    let gw = Gateway::start(&path);
    let mut conn = OneConnection::open(TcpStream::connect(gw.addr).await.unwrap()).await;
    let (status, h) = conn
        .get("/api/v1/clusters?organization_id=acme", &seed.key)
        .await;
    assert_eq!(
        (status, h["x-ratelimit-limit"].to_str().unwrap()),
        (200, "3")
    );

    cfg.set("rate_limit.policies.default.requests", 50);
    cfg.write();
    hup(&gw);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (status, h) = conn
            .get("/api/v1/clusters?organization_id=acme", &seed.key)
            .await;
        if h["x-ratelimit-limit"] == "50" {
            assert_eq!(status, 200, "the new policy starts with a full bucket");
            break;
        }
        // Until the reload lands the old 3-token bucket applies (and may run out).
        assert!(status == 200 || status == 429, "status {status}");
        assert!(Instant::now() < deadline, "the new policy never applied");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Logged just after the swap: a request can see the new policy first.
    while !gw.log_text().contains("configuration reloaded") {
        assert!(Instant::now() < deadline, "the reload was never logged");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_bad_reload_changes_nothing_and_names_the_problem() {
    let up = MockUpstream::start().await;
    let mut cfg = limited_world(&up, 3);
    cfg.set("admin.enabled", true);
    cfg.set("admin.listen", "127.0.0.1:0");
    let path = cfg.write();
    let seed = seed(&path, "acme", "alice", "owner", "clusters:read");
    let gw = Gateway::start(&path);
    let admin = gw.admin.unwrap();

    cfg.set("rate_limit.policies.default.requests", 50);
    cfg.set("rate_limit.policies.default.burst", 7);
    cfg.write();
    let res = client()
        .post(format!("http://{admin}/reload"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    let body: serde_json::Value = res.json().await.unwrap();
    let problems = body["details"]["problems"].to_string();
    assert!(
        problems.contains("rate_limit.policies.default.burst"),
        "{body}"
    );

    let res = client()
        .get(gw.url("/api/v1/clusters?organization_id=acme"))
        .bearer_auth(&seed.key)
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.headers()["x-ratelimit-limit"],
        "3",
        "the running config changed"
    );
    let metrics = client()
        .get(format!("http://{admin}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("mpg_config_reloads_total{result=\"error\"} 1"),
        "{metrics}"
    );
    assert!(gw.log_text().contains("rate_limit.policies.default.burst"));

    // A good file afterwards applies, over the same endpoint; restart-only changes are reported.
    cfg.remove("rate_limit.policies.default.burst");
    cfg.set("server.listen", "127.0.0.1:1");
    cfg.write();
    let res = client()
        .post(format!("http://{admin}/reload"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["restart_needed"], serde_json::json!(["server.listen"]));
    // The log line names them too, as one comma-separated string (not a Debug list).
    let line = gw
        .log_text()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|l| l["message"] == "configuration reloaded")
        .expect("a reload log line");
    assert_eq!(line["restart_needed"], "server.listen", "{line}");
    let res = client()
        .get(gw.url("/api/v1/clusters?organization_id=acme"))
        .bearer_auth(&seed.key)
        .send()
        .await
        .unwrap();
    assert_eq!(res.headers()["x-ratelimit-limit"], "50");
}

#[tokio::test]
async fn a_renewed_certificate_is_served_to_new_connections_without_dropping_old_ones() {
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    let (c, k) = cfg.tls_files();
    let path = cfg.write();
    let seed = seed(&path, "acme", "alice", "owner", "clusters:read");
    let gw = Gateway::start(&path);

    let (stream, first_cert) =
        tls_connect(gw.addr, rustls::crypto::aws_lc_rs::default_provider()).await;
    let mut old = OneConnection::open(stream).await;
    assert_eq!(
        old.get("/api/v1/clusters?organization_id=acme", &seed.key)
            .await
            .0,
        200
    );

    let (cert, key) = mpg_gateway::tls::self_signed_pem().unwrap();
    std::fs::write(&c, cert).unwrap();
    std::fs::write(&k, key).unwrap();
    hup(&gw);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, cert) = tls_connect(gw.addr, rustls::crypto::aws_lc_rs::default_provider()).await;
        if cert != first_cert {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the renewed certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        old.get("/api/v1/clusters?organization_id=acme", &seed.key)
            .await
            .0,
        200,
        "the old connection broke"
    );
}

#[tokio::test]
async fn sigterm_lets_the_request_in_flight_finish_and_exits_zero() {
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    cfg.route("method = \"GET\"\npath = \"/api/v1/slow\"\nauth = \"api_key\"\nscope = \"clusters:read\"\norganization = \"query:organization_id\"\nupstream = \"clusters\"");
    cfg.set("upstreams.clusters.request_timeout", "10s");
    let path = cfg.write();
    let seed = seed(&path, "acme", "alice", "owner", "clusters:read");
    let mut gw = Gateway::start(&path);
    let url = gw.url("/api/v1/slow?organization_id=acme");
    let key = seed.key.clone();
    let in_flight = tokio::spawn(async move {
        client()
            .get(url)
            .bearer_auth(key)
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    // In flight: the upstream has it (and answers 3 s later).
    up.until_count(1).await;
    let addr = gw.addr;
    let status = tokio::task::spawn_blocking(move || gw.terminate())
        .await
        .unwrap();
    assert_eq!(
        in_flight.await.unwrap().unwrap(),
        200,
        "the in-flight request did not complete"
    );
    assert_eq!(status.code(), Some(0));
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "still accepting after exit"
    );
}

/// Reads one response head (and its small body) off a raw connection.
async fn read_response(s: &mut TcpStream) -> String {
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf))
        .await
        .expect("no response")
        .unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// Waits for the peer to close `s`; how long that took.
async fn closed_after(s: &mut TcpStream, limit: Duration) -> Duration {
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    let n = tokio::time::timeout(limit, s.read(&mut buf))
        .await
        .expect("connection left open");
    assert!(matches!(n, Ok(0) | Err(_)), "unexpected bytes");
    started.elapsed()
}

#[tokio::test]
async fn an_idle_keep_alive_connection_lives_for_idle_timeout_not_header_read_timeout() {
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    cfg.set("server.limits.header_read_timeout", "1s");
    cfg.set("server.limits.idle_timeout", "3s");
    let gw = Gateway::start(&cfg.write());
    let req = b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n";

    // Idle for longer than header_read_timeout between two requests: still open.
    let mut kept = TcpStream::connect(gw.addr).await.unwrap();
    kept.write_all(req).await.unwrap();
    assert!(read_response(&mut kept).await.starts_with("HTTP/1.1 404"));
    tokio::time::sleep(Duration::from_millis(1800)).await;
    kept.write_all(req).await.unwrap();
    assert!(read_response(&mut kept).await.starts_with("HTTP/1.1 404"));
    // Then closed once idle_timeout has passed, not before.
    let idle = closed_after(&mut kept, Duration::from_secs(6)).await;
    assert!(idle >= Duration::from_millis(2500), "closed after {idle:?}");

    // A second request head that starts and stalls is cut at header_read_timeout.
    let mut stalled = TcpStream::connect(gw.addr).await.unwrap();
    stalled.write_all(req).await.unwrap();
    assert!(read_response(&mut stalled)
        .await
        .starts_with("HTTP/1.1 404"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    stalled
        .write_all(b"GET /nope HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let cut = closed_after(&mut stalled, Duration::from_secs(6)).await;
    assert!(
        cut >= Duration::from_millis(800) && cut < Duration::from_millis(2500),
        "stalled head closed after {cut:?}"
    );
}

#[tokio::test]
async fn slow_header_and_idle_clients_are_cut_off() {
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    cfg.set("server.limits.header_read_timeout", "1s");
    cfg.set("server.limits.idle_timeout", "1s");
    cfg.set("server.limits.max_connections", 3);
    let gw = Gateway::start(&cfg.write());

    // A client trickling its headers is disconnected within the timeout.
    let mut slow = TcpStream::connect(gw.addr).await.unwrap();
    slow.write_all(b"GET /api/v1/clusters HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let mut closed = false;
    for _ in 0..20 {
        if slow.write_all(b"X-Trickle: 1\r\n").await.is_err() {
            closed = true;
            break;
        }
        let mut buf = [0u8; 1024];
        match tokio::time::timeout(Duration::from_millis(200), slow.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                closed = true;
                break;
            }
            _ => {}
        }
    }
    assert!(closed, "a slow-header client was never disconnected");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );

    // An idle keep-alive connection is closed after idle_timeout.
    let mut idle = TcpStream::connect(gw.addr).await.unwrap();
    idle.write_all(b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert!(read_response(&mut idle).await.starts_with("HTTP/1.1 404"));
    let after = closed_after(&mut idle, Duration::from_secs(4)).await;
    assert!(
        after >= Duration::from_millis(800),
        "closed too early: {after:?}"
    );

    // max_connections: the fourth concurrent connection is closed at once.
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        read_response(&mut s).await;
        held.push(s);
    }
    let mut extra = TcpStream::connect(gw.addr).await.unwrap();
    let _ = extra
        .write_all(b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n")
        .await;
    // Closed at once, never served: a connection over max_connections.
    closed_after(&mut extra, Duration::from_secs(2)).await;
}

/// Reads from `s` until the peer closes it; how long that took (`None` if it
/// was still open after `limit`).
async fn open_for(s: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at((started + limit).into(), s.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(started.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test]
async fn an_idle_http2_client_that_never_answers_is_closed_after_idle_timeout() {
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    cfg.set("server.limits.header_read_timeout", "1s");
    cfg.set("server.limits.idle_timeout", "1s");
    let gw = Gateway::start(&cfg.write());
    // Prior knowledge: the preface and an empty SETTINGS frame, then nothing
    // at all: no SETTINGS ack, no PING ack, no stream.
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    let closed = open_for(&mut s, Duration::from_secs(8)).await;
    assert!(
        closed.is_some_and(|t| t < Duration::from_secs(4)),
        "an idle HTTP/2 connection was left open: {closed:?}"
    );
}

#[tokio::test]
async fn sigterm_does_not_wait_for_an_http2_client_that_never_answers_goaway() {
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    cfg.set("server.limits.shutdown_grace", "30s");
    let mut gw = Gateway::start(&cfg.write());
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let status = tokio::task::spawn_blocking(move || gw.terminate())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the drain waited {:?} for an idle HTTP/2 connection",
        started.elapsed()
    );
    drop(s);
}

#[tokio::test]
async fn sigterm_lets_an_http2_stream_in_flight_finish() {
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    cfg.route("method = \"GET\"\npath = \"/api/v1/slow\"\nauth = \"api_key\"\nscope = \"clusters:read\"\norganization = \"query:organization_id\"\nupstream = \"clusters\"");
    cfg.set("upstreams.clusters.request_timeout", "10s");
    cfg.set("server.limits.idle_timeout", "1s");
    let path = cfg.write();
    let seed = seed(&path, "acme", "alice", "owner", "clusters:read");
    let mut gw = Gateway::start(&path);
    let url = gw.url("/api/v1/slow?organization_id=acme");
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let in_flight = tokio::spawn(async move {
        h2.get(url)
            .bearer_auth(seed.key)
            .send()
            .await
            .map(|r| (r.status().as_u16(), r.version()))
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let status = tokio::task::spawn_blocking(move || gw.terminate())
        .await
        .unwrap();
    assert_eq!(
        in_flight.await.unwrap().unwrap(),
        (200, reqwest::Version::HTTP_2),
        "the in-flight stream did not complete"
    );
    assert_eq!(status.code(), Some(0));
}

/// Starts a gateway on a "PostgreSQL" that accepts and never answers (its
/// start waits on it for `query_timeout`, as on a slow store or long
/// migrations), sends it signal `name` 700 ms in, and waits for it to exit:
/// its exit status, and how long after the signal it came.
async fn signal_while_starting(
    query_timeout: &str,
    name: &str,
) -> (std::process::ExitStatus, Duration) {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let store = silent.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            conns.push(s);
        }
    });
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    cfg.remove("store.path");
    cfg.set("store.kind", "postgres");
    cfg.set("store.url", format!("postgres://postgres@{store}/test"));
    cfg.set("store.query_timeout", query_timeout);
    // A store that never answers then ends the start (instead of a wait for it).
    cfg.set("store.wait_at_start", false);
    let mut child = std::process::Command::new(BIN)
        .arg("run")
        .arg("--config")
        .arg(cfg.write())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let sent = Instant::now();
    signal(child.id(), name);
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    let took = sent.elapsed();
    held.abort();
    (status, took)
}

#[tokio::test]
async fn a_sighup_while_the_gateway_is_starting_does_not_kill_it() {
    use std::os::unix::process::ExitStatusExt;
    // `systemctl reload` right after `systemctl start` (the unit is Type=exec).
    let (status, _) = signal_while_starting("3s", "HUP").await;
    // The store never answered, so the start fails; but by its own hand.
    assert_eq!(
        (status.signal(), status.code()),
        (None, Some(1)),
        "{status:?}"
    );
}

#[tokio::test]
async fn a_sigterm_while_the_gateway_is_starting_stops_it_at_once() {
    use std::os::unix::process::ExitStatusExt;
    let (status, took) = signal_while_starting("20s", "TERM").await;
    // Not the signal's default (killed), nor a wait for the store's 20 s.
    assert_eq!(
        (status.signal(), status.code()),
        (None, Some(0)),
        "{status:?}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[tokio::test]
async fn a_reload_does_not_half_apply_a_larger_max_header_bytes() {
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    cfg.set("admin.enabled", true);
    cfg.set("admin.listen", "127.0.0.1:0");
    cfg.set("server.limits.max_header_bytes", 16384);
    let path = cfg.write();
    let gw = Gateway::start(&path);
    let admin = gw.admin.unwrap();

    cfg.set("server.limits.max_header_bytes", 65536);
    cfg.write();
    let res = client()
        .post(format!("http://{admin}/reload"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let body: serde_json::Value = res.json().await.unwrap();
    // 40 kB of headers: within the new limit, past what the listener was
    // built for at start (HTTP/2's SETTINGS_MAX_HEADER_LIST_SIZE, the
    // HTTP/1.1 head buffer). One limit must apply to both protocols.
    let url = gw.url("/api/v1/clusters?organization_id=acme");
    let big = "a".repeat(40_000);
    let h1 = client()
        .get(&url)
        .header("x-big", &big)
        .send()
        .await
        .unwrap();
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap()
        .get(&url)
        .header("x-big", &big)
        .send()
        .await
        .unwrap();
    assert_eq!(
        (h1.status().as_u16(), h2.status().as_u16()),
        (431, 431),
        "HTTP/1.1 and HTTP/2 disagree after the reload"
    );
    assert_eq!(
        body["restart_needed"],
        serde_json::json!(["server.limits.max_header_bytes"])
    );
    let h1: serde_json::Value = h1.json().await.unwrap();
    assert_eq!(h1["details"]["limit"], 16384, "{h1}");
}

#[tokio::test]
async fn a_pooled_connection_the_target_closed_is_not_reused() {
    // A target that answers one request per connection and then closes it
    // without saying so (no `Connection: close`), 100 ms later.
    let target = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = target.local_addr().unwrap();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    let server = tokio::spawn(async move {
        while let Ok((mut s, _)) = target.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    .await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            });
        }
    });
    let mut cfg = TestConfig::new(addr);
    cfg.set("upstreams.clusters.max_fails", 0);
    let path = cfg.write();
    let seed = seed(&path, "acme", "alice", "owner", "clusters:read");
    let gw = Gateway::start(&path);
    for _ in 0..3 {
        let res = client()
            .get(gw.url("/api/v1/clusters?organization_id=acme"))
            .bearer_auth(&seed.key)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 3);
    server.abort();
}

// === Upstream state across a reload ===

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// `clusters` on `targets`, an open `/public/ping` route to it, the admin listener on.
fn upstream_world(targets: &[std::net::SocketAddr]) -> TestConfig {
    let mut cfg = TestConfig::new(targets[0]);
    let urls: Vec<String> = targets.iter().map(|a| format!("http://{a}")).collect();
    cfg.set("upstreams.clusters.targets", urls);
    cfg.set("admin.enabled", true);
    cfg.set("admin.listen", "127.0.0.1:0");
    cfg.route("method = \"GET\"\npath = \"/public/ping\"\nauth = \"none\"\nupstream = \"clusters\"\nrate_limit = \"none\"");
    cfg
}

/// `POST /reload`, which must succeed; its JSON answer.
async fn reload(gw: &Gateway) -> serde_json::Value {
    let res = client()
        .post(format!("http://{}/reload", gw.admin.unwrap()))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    res.json().await.unwrap()
}

/// `mpg_upstream_target_up` of `target`.
async fn target_up(gw: &Gateway, target: std::net::SocketAddr) -> Option<f64> {
    let text = client()
        .get(format!("http://{}/metrics", gw.admin.unwrap()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let label = format!("target=\"http://{target}\"");
    text.lines()
        .filter(|l| l.starts_with("mpg_upstream_target_up{") && l.contains(&label))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Sends pings until the target at `bad` has answered once (it is then
/// ejected: `max_fails = 1`).
async fn eject(gw: &Gateway, bad: std::net::SocketAddr, seen: &AtomicUsize) {
    for _ in 0..4 {
        if seen.load(Ordering::SeqCst) > 0 {
            break;
        }
        ping(gw).await;
    }
    assert_eq!(seen.load(Ordering::SeqCst), 1);
    assert_eq!(target_up(gw, bad).await, Some(0.0));
}

#[tokio::test]
async fn an_ejected_target_stays_ejected_across_a_reload_that_changed_only_a_policy() {
    let (good, _, _) = counting_target(OK, Duration::ZERO).await;
    let (bad, _, bad_seen) = counting_target(FAIL, Duration::ZERO).await;
    let mut cfg = upstream_world(&[good, bad]);
    cfg.set("upstreams.clusters.max_fails", 1);
    cfg.set("upstreams.clusters.fail_timeout", "60s");
    let gw = Gateway::start(&cfg.write());
    eject(&gw, bad, &bad_seen).await;

    cfg.set("rate_limit.policies.default.requests", 7);
    cfg.route(
        "method = \"GET\"\npath = \"/public/other\"\nauth = \"none\"\nupstream = \"clusters\"",
    );
    cfg.write();
    let answer = reload(&gw).await;
    assert_eq!(
        answer["upstreams_rebuilt"],
        serde_json::json!([]),
        "{answer}"
    );
    assert_eq!(target_up(&gw, bad).await, Some(0.0));
    // Rebuilt, the upstream would forget the ejection and send every second
    // ping to the bad target: 3 of 6. Kept, the bad target sees only its
    // half-open probes, the first 250 ms after the ejection, the next 500 ms
    // after that: at most 2 while the pings take under 1.75 s.
    let started = Instant::now();
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(ping(&gw).await);
    }
    let took = started.elapsed();
    let probes = bad_seen.load(Ordering::SeqCst) - 1;
    assert!(
        took < Duration::from_millis(1750),
        "the pings took {took:?}"
    );
    assert!(
        probes <= 2,
        "the ejected target took {probes} of 6 requests after the reload: {statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        6 - probes,
        "{statuses:?}"
    );
}

#[tokio::test]
async fn an_idle_pooled_upstream_connection_is_reused_after_a_reload() {
    let (target, accepts, seen) = counting_target(OK, Duration::ZERO).await;
    let mut cfg = upstream_world(&[target]);
    let gw = Gateway::start(&cfg.write());
    assert_eq!(ping(&gw).await, 200);
    assert_eq!(accepts.load(Ordering::SeqCst), 1);

    cfg.set("rate_limit.policies.default.requests", 7);
    cfg.write();
    reload(&gw).await;
    assert_eq!(ping(&gw).await, 200);
    assert_eq!(seen.load(Ordering::SeqCst), 2);
    assert_eq!(
        accepts.load(Ordering::SeqCst),
        1,
        "the reload dropped the idle upstream connection"
    );
}

#[tokio::test]
async fn an_upstream_whose_settings_changed_is_rebuilt() {
    let (good, good_accepts, _) = counting_target(OK, Duration::ZERO).await;
    let (bad, _, bad_seen) = counting_target(FAIL, Duration::ZERO).await;
    let mut cfg = upstream_world(&[good, bad]);
    cfg.set("upstreams.clusters.max_fails", 1);
    cfg.set("upstreams.clusters.fail_timeout", "60s");
    let gw = Gateway::start(&cfg.write());
    eject(&gw, bad, &bad_seen).await;
    assert_eq!(good_accepts.load(Ordering::SeqCst), 1);

    // Another target: a new upstream, whose targets all start in rotation.
    let (third, _, third_seen) = counting_target(OK, Duration::ZERO).await;
    cfg.set(
        "upstreams.clusters.targets",
        vec![
            format!("http://{good}"),
            format!("http://{bad}"),
            format!("http://{third}"),
        ],
    );
    cfg.write();
    let answer = reload(&gw).await;
    assert_eq!(
        answer["upstreams_rebuilt"],
        serde_json::json!(["clusters"]),
        "{answer}"
    );
    assert_eq!(target_up(&gw, bad).await, Some(1.0));
    for _ in 0..3 {
        ping(&gw).await;
    }
    assert_eq!(bad_seen.load(Ordering::SeqCst), 2);
    assert_eq!(third_seen.load(Ordering::SeqCst), 1);
    assert_eq!(good_accepts.load(Ordering::SeqCst), 2, "a new pool");
    assert_eq!(target_up(&gw, bad).await, Some(0.0));
}

#[tokio::test]
async fn a_failure_in_flight_on_a_replaced_upstream_leaves_the_new_ones_gauge_alone() {
    // Answers 500 a second after each request.
    let (slow, _, seen) = counting_target(FAIL, Duration::from_secs(1)).await;
    let mut cfg = upstream_world(&[slow]);
    cfg.set("upstreams.clusters.max_fails", 1);
    cfg.set("upstreams.clusters.fail_timeout", "60s");
    let gw = Arc::new(Gateway::start(&cfg.write()));
    let in_flight = tokio::spawn({
        let gw = gw.clone();
        async move { ping(&gw).await }
    });
    let until = Instant::now() + Duration::from_secs(5);
    while seen.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < until,
            "the request never reached the target"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cfg.set("upstreams.clusters.request_timeout", "20s");
    cfg.write();
    reload(&gw).await;
    // The old upstream ejects its target; the new one has it in rotation.
    assert_eq!(in_flight.await.unwrap(), 500);
    assert_eq!(target_up(&gw, slow).await, Some(1.0));
    assert_eq!(ping(&gw).await, 500);
    assert_eq!(seen.load(Ordering::SeqCst), 2);
    assert_eq!(target_up(&gw, slow).await, Some(0.0));
}

#[tokio::test]
async fn shutdown_delay_keeps_serving_while_readyz_says_503_then_drains() {
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    cfg.set("server.shutdown_delay", "2s");
    cfg.set("admin.enabled", true);
    cfg.set("admin.listen", "127.0.0.1:0");
    let path = cfg.write();
    let seed = seed(&path, "acme", "alice", "owner", "clusters:read");
    let mut gw = Gateway::start(&path);
    let admin = gw.admin.unwrap();
    let ready = || async move {
        let res = client()
            .get(format!("http://{admin}/readyz"))
            .send()
            .await
            .unwrap();
        let status = res.status().as_u16();
        let body: serde_json::Value = res.json().await.unwrap();
        (
            status,
            body["status"].as_str().unwrap_or_default().to_string(),
        )
    };
    assert_eq!(ready().await, (200, "ready".to_string()));
    let pid = gw.child.id();
    let stopped = Instant::now();
    signal(pid, "TERM");
    // Not ready at once, yet a new connection is still served.
    let deadline = Instant::now() + Duration::from_millis(500);
    while ready().await.0 != 503 {
        assert!(Instant::now() < deadline, "/readyz still says ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(ready().await.1, "stopping");
    let fresh = reqwest::Client::new();
    let res = fresh
        .get(gw.url("/api/v1/clusters?organization_id=acme"))
        .bearer_auth(&seed.key)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    // Then the drain, and the exit, after the delay.
    let status = tokio::task::spawn_blocking(move || gw.child.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0));
    let took = stopped.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(10),
        "stopped after {took:?}"
    );
}
