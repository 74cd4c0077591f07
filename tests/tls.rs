//! TLS termination: PEM files and self-signed, HTTP/1.1 and h2 via ALPN.
mod common;

use common::*;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[tokio::test]
async fn serves_http1_and_h2_over_tls_from_pem_files() {
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    cfg.tls_files();
    let path = cfg.write();
    let seed = seed(&path, "acme", "alice", "owner", "clusters:read");
    let gw = Gateway::start(&path);
    let url = format!(
        "https://localhost:{}/api/v1/clusters?organization_id=acme",
        gw.addr.port()
    );

    let h1 = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .http1_only()
        .build()
        .unwrap();
    let res = h1.get(&url).bearer_auth(&seed.key).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.version(), reqwest::Version::HTTP_11);

    let h2 = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    let res = h2.get(&url).bearer_auth(&seed.key).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.version(), reqwest::Version::HTTP_2);
    assert_eq!(up.last().headers["x-forwarded-proto"], "https");
    assert_eq!(
        up.last().headers["x-forwarded-host"],
        format!("localhost:{}", gw.addr.port()).as_str()
    );
}

#[tokio::test]
async fn self_signed_mode_starts_without_files() {
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    cfg.set("server.insecure_http", false);
    cfg.set("server.tls.self_signed", true);
    let gw = Gateway::start(&cfg.write());
    let client = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    let res = client
        .get(format!(
            "https://127.0.0.1:{}/api/v1/clusters",
            gw.addr.port()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);
    assert!(
        gw.log_text().contains("self-signed"),
        "no development warning in the log"
    );
}

// === header_read_timeout from the accept, and the drain ===

/// A TLS connector offering ALPN `alpn`, trusting any certificate (the
/// gateway's is self-signed).
fn connector(alpn: &[u8]) -> tokio_rustls::TlsConnector {
    tls_connector(
        rustls::crypto::aws_lc_rs::default_provider(),
        alpn,
        Arc::default(),
    )
}

/// A self-signed TLS gateway with `header_read_timeout` of `hrt`.
async fn tls_gateway(hrt: &str) -> (MockUpstream, TestConfig, Gateway) {
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    cfg.set("server.insecure_http", false);
    cfg.set("server.tls.self_signed", true);
    cfg.set("server.limits.header_read_timeout", hrt);
    cfg.set("server.limits.idle_timeout", "60s");
    cfg.set("server.limits.shutdown_grace", "30s");
    let gw = Gateway::start(&cfg.write());
    (up, cfg, gw)
}

/// Reads from `s` until the peer closes it; false if still open at `by`.
async fn closed_by<S: AsyncRead + Unpin>(s: &mut S, by: Instant) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(by.into(), s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test]
async fn the_tls_handshake_and_the_first_head_share_one_header_read_timeout() {
    let (_up, _cfg, gw) = tls_gateway("3s").await;
    let tcp = TcpStream::connect(gw.addr).await.unwrap();
    let accepted = Instant::now();
    // A slow handshake: most of the 3 s go before the ClientHello.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut tls = connector(b"http/1.1")
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .unwrap();
    // Then a head that begins and stalls.
    tls.write_all(b"GET /nope HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    assert!(
        closed_by(&mut tls, accepted + Duration::from_secs(8)).await,
        "never closed"
    );
    let closed = accepted.elapsed();
    // One timeout shared: 3 s after the accept. A timeout each would close
    // it 3 s after the handshake, 5.5 s after the accept.
    assert!(
        closed >= Duration::from_millis(2900) && closed < Duration::from_millis(4500),
        "closed {closed:?} after the accept; header_read_timeout is 3s"
    );
}

#[tokio::test]
async fn an_http2_connection_without_a_request_is_closed_after_header_read_timeout() {
    let (_up, _cfg, gw) = tls_gateway("1s").await;
    let tcp = TcpStream::connect(gw.addr).await.unwrap();
    let accepted = Instant::now();
    let tls = connector(b"h2")
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    // A well-behaved HTTP/2 client (it answers PING and GOAWAY) that never
    // opens a stream: its connection ends once the server closes it.
    let (_sender, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .handshake::<_, http_body_util::Empty<bytes::Bytes>>(hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(10), conn).await;
    assert!(ended.is_ok(), "still open after 10 s; idle_timeout is 60s");
    let closed = accepted.elapsed();
    assert!(
        closed >= Duration::from_millis(900) && closed < Duration::from_secs(4),
        "closed {closed:?} after the accept; header_read_timeout is 1s"
    );
}

#[tokio::test]
async fn sigterm_closes_tls_connections_that_have_not_sent_a_request() {
    let (_up, _cfg, mut gw) = tls_gateway("30s").await;
    // One mid-handshake (no ClientHello yet), one handshaken with no request.
    let mut silent = TcpStream::connect(gw.addr).await.unwrap();
    let mut fresh = connector(b"http/1.1")
        .connect(
            "localhost".try_into().unwrap(),
            TcpStream::connect(gw.addr).await.unwrap(),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let status = tokio::task::spawn_blocking(move || gw.terminate())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the drain waited {:?} for connections with no request",
        started.elapsed()
    );
    let by = Instant::now() + Duration::from_secs(1);
    assert!(closed_by(&mut silent, by).await);
    assert!(closed_by(&mut fresh, by).await);
}

#[tokio::test]
async fn failed_handshakes_are_one_incident_in_the_log_not_a_line_each() {
    let (_up, _cfg, gw) = tls_gateway("10s").await;
    // Plain HTTP to the TLS port, 50 times: each handshake fails.
    for _ in 0..50 {
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
            .await
            .unwrap();
        let by = Instant::now() + Duration::from_secs(5);
        assert!(closed_by(&mut s, by).await, "a failed handshake left open");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let lines: Vec<serde_json::Value> = gw
        .log
        .lock()
        .unwrap()
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["subject"] == "TLS handshakes")
        .collect();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert_eq!(lines[0]["incident"], "down");
    assert_eq!(lines[0]["level"], "INFO");
    assert!(
        lines[0]["message"]
            .as_str()
            .unwrap()
            .starts_with("TLS handshakes failing: "),
        "{}",
        lines[0]
    );
}

// === session resumption ===

/// How resuming clients come back: TLS 1.3 (tickets), TLS 1.2 with tickets,
/// and TLS 1.2 by session id (the server's session cache).
fn resumption_modes() -> [(&'static str, rustls::client::Tls12Resumption, bool); 3] {
    use rustls::client::Tls12Resumption as R;
    [
        ("TLS 1.3", R::SessionIdOrTickets, true),
        ("TLS 1.2, tickets", R::SessionIdOrTickets, false),
        ("TLS 1.2, session id", R::SessionIdOnly, false),
    ]
}

/// A client config for one mode of [`resumption_modes`], with its own
/// session store: connections made with it resume each other's sessions.
fn resuming_client(
    tls12: rustls::client::Tls12Resumption,
    tls13: bool,
) -> Arc<rustls::ClientConfig> {
    let version = match tls13 {
        true => &rustls::version::TLS13,
        false => &rustls::version::TLS12,
    };
    let mut config = tls_client_config(
        rustls::crypto::aws_lc_rs::default_provider(),
        &[version],
        b"http/1.1",
        Arc::default(),
    );
    config.resumption = rustls::client::Resumption::in_memory_sessions(8).tls12_resumption(tls12);
    Arc::new(config)
}

/// One request on a new connection made with `config`, read to its end (a
/// TLS 1.3 ticket comes after the handshake); whether the handshake resumed.
async fn resumed(addr: std::net::SocketAddr, config: &Arc<rustls::ClientConfig>) -> bool {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(config.clone())
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .unwrap();
    let kind = tls.get_ref().1.handshake_kind();
    tls.write_all(b"GET /nope HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer).await;
    assert!(
        answer.starts_with(b"HTTP/1.1 404"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    kind == Some(rustls::HandshakeKind::Resumed)
}

#[tokio::test]
async fn a_client_resumes_its_session_on_tls_1_3_and_1_2() {
    let (_up, _cfg, gw) = tls_gateway("10s").await;
    for (mode, tls12, tls13) in resumption_modes() {
        let client = resuming_client(tls12, tls13);
        assert!(
            !resumed(gw.addr, &client).await,
            "{mode}: the first handshake resumed"
        );
        assert!(
            resumed(gw.addr, &client).await,
            "{mode}: the second handshake did not resume"
        );
        assert!(
            resumed(gw.addr, &client).await,
            "{mode}: the third handshake did not resume"
        );
    }
}

#[tokio::test]
async fn sessions_resume_after_hundreds_of_other_clients() {
    // More clients than rustls's default session cache (256 sessions)
    // holds: tickets hold no server memory, and the session cache for
    // TLS 1.2 clients without tickets is larger.
    let (_up, _cfg, gw) = tls_gateway("10s").await;
    for (mode, tls12, tls13) in resumption_modes() {
        let first = resuming_client(tls12, tls13);
        assert!(!resumed(gw.addr, &first).await, "{mode}");
        for _ in 0..300 {
            resumed(gw.addr, &resuming_client(tls12, tls13)).await;
        }
        assert!(
            resumed(gw.addr, &first).await,
            "{mode}: the first client's session is gone"
        );
    }
}
