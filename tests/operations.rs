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
    std::process::Command::new("kill")
        .arg("-HUP")
        .arg(gw.child.id().to_string())
        .status()
        .unwrap();
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
    let (c, k) = (
        cfg.dir.path().join("cert.pem"),
        cfg.dir.path().join("key.pem"),
    );
    let (cert, key) = mpg_gateway::tls::self_signed_pem().unwrap();
    std::fs::write(&c, cert).unwrap();
    std::fs::write(&k, key).unwrap();
    cfg.set("server.insecure_http", false);
    cfg.set("server.tls.cert", c.to_str().unwrap());
    cfg.set("server.tls.key", k.to_str().unwrap());
    let path = cfg.write();
    let seed = seed(&path, "acme", "alice", "owner", "clusters:read");
    let gw = Gateway::start(&path);

    let (stream, first_cert) = tls_connect(gw.addr, rustls::crypto::ring::default_provider()).await;
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
        let (_, cert) = tls_connect(gw.addr, rustls::crypto::ring::default_provider()).await;
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
    tokio::time::sleep(Duration::from_millis(500)).await;
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
