//! Under faults, over real sockets: a drain tells keep-alive clients that
//! their connection is closing; an upstream outage writes a few log lines,
//! not one per refused request; an ejected target that comes back is used
//! again at once.
mod common;

use common::*;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const PING: &str = "method = \"GET\"\npath = \"/public/ping\"\nauth = \"none\"\nupstream = \"clusters\"\nrate_limit = \"none\"";

/// Reads one response (its head, and a body of `Content-Length` bytes)
/// off `s`: the head's text.
async fn read_one(s: &mut TcpStream) -> String {
    read_rest(s, Vec::new()).await
}

/// Reads off `s` until a whole response head has come: every byte read.
async fn read_head(s: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        read_more(s, &mut got).await;
    }
    got
}

/// Reads the rest of the response whose first bytes are `got`: its head's text.
async fn read_rest(s: &mut TcpStream, mut got: Vec<u8>) -> String {
    loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).into_owned();
            let length: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            if got.len() >= end + 4 + length {
                return head;
            }
        }
        read_more(s, &mut got).await;
    }
}

/// Appends what `s` has next to `got`; panics on its end or after 10 s.
async fn read_more(s: &mut TcpStream, got: &mut Vec<u8>) {
    let mut buf = [0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
        .await
        .expect("no response")
        .expect("read failed");
    assert!(n > 0, "closed before a whole response: {got:?}");
    got.extend_from_slice(&buf[..n]);
}

/// Whether the server closes `s` within `limit` (end of stream or reset,
/// with no byte before it).
async fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(limit, s.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

// === Draining ===

const GET_PING: &[u8] = b"GET /public/ping HTTP/1.1\r\nHost: localhost\r\n\r\n";
const GET_STREAM: &[u8] = b"GET /public/stream HTTP/1.1\r\nHost: localhost\r\n\r\n";

#[tokio::test]
async fn a_drain_ends_keep_alive_connections_with_connection_close_and_sends_goaway() {
    // `/public/ping`: the head comes 1.5 s after the request. `/public/stream`:
    // the head at once, the body 1.5 s later.
    let slow_head = Target::start(OK, Duration::from_millis(1500)).await;
    let slow_body = Target::slow_body(OK, Duration::from_millis(1500)).await;
    let mut cfg = TestConfig::new(slow_head.addr);
    cfg.route(PING);
    cfg.set(
        "upstreams.stream.targets",
        vec![format!("http://{}", slow_body.addr)],
    );
    cfg.route("method = \"GET\"\npath = \"/public/stream\"\nauth = \"none\"\nupstream = \"stream\"\nrate_limit = \"none\"");
    let mut gw = Gateway::start(&cfg.write());

    // Keep-alive connections, each with a request in flight.
    let mut heads_later = Vec::new();
    let mut bodies_later = Vec::new();
    for _ in 0..8 {
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(GET_PING).await.unwrap();
        heads_later.push(s);
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(GET_STREAM).await.unwrap();
        bodies_later.push(s);
    }
    // An HTTP/2 connection with a stream in flight too.
    let tcp = TcpStream::connect(gw.addr).await.unwrap();
    let (mut h2, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let req = || {
        http::Request::get("http://localhost/public/ping")
            .body(())
            .unwrap()
    };
    let (in_flight, _) = h2.send_request(req(), true).unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    while slow_head.requests() < 9 || slow_body.requests() < 8 {
        assert!(
            Instant::now() < until,
            "the requests never reached the targets"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The streams' heads went out before the drain: read them first, so
    // that none could have announced the close.
    let mut streamed = Vec::new();
    for (i, s) in bodies_later.iter_mut().enumerate() {
        let got = read_head(s).await;
        let head = String::from_utf8_lossy(&got).to_ascii_lowercase();
        assert!(
            head.starts_with("http/1.1 200") && !head.contains("\r\nconnection: close"),
            "connection {i}: {head}"
        );
        streamed.push(got);
    }

    signal(gw.child.id(), "TERM");
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Heads written after the drain began announce the close, and the
    // connection closes after the response.
    for (i, s) in heads_later.iter_mut().enumerate() {
        let head = read_one(s).await;
        assert!(head.starts_with("HTTP/1.1 200"), "connection {i}: {head}");
        assert!(
            head.to_ascii_lowercase().contains("\r\nconnection: close"),
            "connection {i}: a response written during the drain lacks Connection: close:\n{head}"
        );
        assert!(
            closed_within(s, Duration::from_secs(2)).await,
            "connection {i} was left open after its Connection: close response"
        );
    }
    // A head that went out before the drain could not say so: each client's
    // next request, sent as soon as its response is whole, is answered
    // (with the close), not reset.
    let clients: Vec<_> = bodies_later
        .into_iter()
        .zip(streamed)
        .enumerate()
        .map(|(i, (mut s, got))| {
            tokio::spawn(async move {
                read_rest(&mut s, got).await;
                s.write_all(GET_STREAM).await.unwrap();
                let next = read_one(&mut s).await.to_ascii_lowercase();
                assert!(
                    next.starts_with("http/1.1 200") && next.contains("\r\nconnection: close"),
                    "connection {i}: the next request got {next:?}"
                );
                assert!(
                    closed_within(&mut s, Duration::from_secs(5)).await,
                    "connection {i} was left open after its Connection: close response"
                );
            })
        })
        .collect();
    for c in clients {
        c.await.unwrap();
    }
    // HTTP/2: GOAWAY came (no new stream may open), and the stream in flight finished.
    let refused = h2.send_request(req(), true).err();
    assert!(
        refused
            .as_ref()
            .is_some_and(|e| e.is_go_away() && e.is_remote()),
        "no GOAWAY on the HTTP/2 connection: {refused:?}"
    );
    let res = tokio::time::timeout(Duration::from_secs(5), in_flight)
        .await
        .expect("the HTTP/2 stream in flight did not finish")
        .unwrap();
    assert_eq!(res.status(), 200);

    let status = tokio::task::spawn_blocking(move || gw.child.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0));
}

/// Many keep-alive clients, each sending its next request as soon as a
/// response without `Connection: close` has come, through a drain: every
/// one of them ends on a response that announced the close, none on a
/// closed or reset connection.
#[tokio::test]
async fn no_keep_alive_client_loses_a_request_to_a_drain_under_load() {
    let target = Target::start(OK, Duration::from_millis(5)).await;
    let mut cfg = TestConfig::new(target.addr);
    cfg.route(PING);
    let mut gw = Gateway::start(&cfg.write());
    let addr = gw.addr;
    let mut clients = Vec::new();
    for _ in 0..50 {
        clients.push(tokio::spawn(async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(20) {
                if s.write_all(GET_PING).await.is_err() {
                    return "the next request could not be written";
                }
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                while !(got.windows(4).any(|w| w == b"\r\n\r\n") && got.ends_with(b"ok")) {
                    match s.read(&mut buf).await {
                        Ok(0) => return "the next request found the connection closed",
                        Err(_) => return "the next request found the connection reset",
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                if String::from_utf8_lossy(&got)
                    .to_ascii_lowercase()
                    .contains("\r\nconnection: close")
                {
                    return "ended on a Connection: close response";
                }
            }
            "still going after 20 s"
        }));
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    signal(gw.child.id(), "TERM");
    let mut ends = std::collections::BTreeMap::new();
    for c in clients {
        *ends.entry(c.await.unwrap()).or_insert(0) += 1;
    }
    assert_eq!(
        ends,
        [("ended on a Connection: close response", 50)].into(),
        "how the 50 clients' connections ended"
    );
    let status = tokio::task::spawn_blocking(move || gw.child.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0));
}

// === Upstream outages ===

/// The gateway's WARN lines so far, parsed.
fn warnings(gw: &Gateway) -> Vec<serde_json::Value> {
    gw.log
        .lock()
        .unwrap()
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["level"] == "WARN")
        .collect()
}

/// Sends `GET /public/ping` from `clients` keep-alive clients at once until
/// `n` have been answered and `at_least` has passed: the statuses.
async fn flood(gw: &Gateway, clients: usize, n: usize, at_least: Duration) -> Vec<u16> {
    let http = client();
    let url = gw.url("/public/ping");
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (http, url, sent) = (http.clone(), url.clone(), sent.clone());
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                while sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < n
                    || started.elapsed() < at_least
                {
                    let res = http.get(&url).send().await.unwrap();
                    statuses.push(res.status().as_u16());
                    let _ = res.bytes().await;
                    assert!(
                        started.elapsed() < Duration::from_secs(60),
                        "flood ran over"
                    );
                }
                statuses
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

#[tokio::test]
async fn an_upstream_outage_is_logged_once_then_counted_then_its_end() {
    let mut target = Target::start(OK, Duration::ZERO).await;
    let mut cfg = TestConfig::new(target.addr);
    cfg.route(PING);
    cfg.set("log.summary_interval", "1s");
    let gw = Gateway::start(&cfg.write());
    assert_eq!(ping(&gw).await, 200);

    // Refused connections: 502 until the target is ejected, then 503.
    target.stop();
    let statuses = flood(&gw, 20, 2_000, Duration::from_millis(2_500)).await;
    assert!(statuses.len() >= 2_000);
    assert!(
        statuses.iter().all(|&s| s == 502 || s == 503),
        "{:?}",
        statuses
            .iter()
            .filter(|&&s| s != 502 && s != 503)
            .collect::<Vec<_>>()
    );

    // Back: a probe finds it, and it is used again.
    target.restart().await;
    let until = Instant::now() + Duration::from_secs(15);
    while ping(&gw).await != 200 {
        assert!(Instant::now() < until, "the target was not used again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    let warns = warnings(&gw);
    let kind = |k: &str| -> Vec<&serde_json::Value> {
        warns.iter().filter(|w| w["incident"] == k).collect()
    };
    let text: Vec<String> = warns.iter().map(|w| w.to_string()).collect();
    let (down, ongoing, recovered) = (kind("down"), kind("ongoing"), kind("recovered"));
    assert_eq!(down.len(), 1, "{text:#?}");
    let line = down[0]["message"].as_str().unwrap();
    // The first failure is a refused connect, or, when a request was on a
    // pooled connection as the target stopped, that connection's close.
    assert!(
        line.starts_with("upstream clusters failing: ")
            && line.contains(&target.addr.to_string())
            && (line.contains("cannot connect") && line.contains("refused")
                || line.contains("closed the connection")),
        "the first line names the upstream, the target and the cause: {line}"
    );
    // One summary per interval (1 s) at most, over the flood's 2.5 s or more.
    assert!(
        (1..=4).contains(&ongoing.len()),
        "{} summaries: {text:#?}",
        ongoing.len()
    );
    let summary = ongoing[0]["message"].as_str().unwrap();
    assert!(
        summary.starts_with("upstream clusters still failing: ")
            && summary.contains(" requests refused in the last "),
        "{summary}"
    );
    assert!(ongoing.iter().all(|o| o["failures"].as_u64() > Some(0)));
    assert_eq!(recovered.len(), 1, "{text:#?}");
    assert!(
        recovered[0]["failures"].as_u64() >= Some(2_000),
        "the recovery line counts every refusal: {}",
        recovered[0]
    );
    let ejected = warns
        .iter()
        .filter(|w| w["message"] == "target ejected")
        .count();
    assert_eq!(ejected, 1, "{text:#?}");
    assert_eq!(
        warns.len(),
        down.len() + ongoing.len() + recovered.len() + ejected,
        "other warnings: {text:#?}"
    );
}

#[tokio::test]
async fn a_target_that_comes_back_is_used_again_at_once() {
    let mut target = Target::start(OK, Duration::ZERO).await;
    let mut cfg = TestConfig::new(target.addr);
    cfg.route(PING);
    cfg.set("upstreams.clusters.max_fails", 1);
    cfg.set("upstreams.clusters.fail_timeout", "10s");
    let gw = Gateway::start(&cfg.write());
    assert_eq!(ping(&gw).await, 200);
    target.stop();
    assert_eq!(ping(&gw).await, 502);
    assert_eq!(ping(&gw).await, 503, "not ejected");
    tokio::time::sleep(Duration::from_millis(400)).await;
    target.restart().await;
    let back = Instant::now();
    while ping(&gw).await != 200 {
        assert!(
            back.elapsed() < Duration::from_secs(3),
            "not used again within 3 s of coming back (fail_timeout is 10 s)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        back.elapsed() < Duration::from_secs(1),
        "used again {:?} after it came back",
        back.elapsed()
    );
}

#[tokio::test]
async fn an_ejected_target_that_still_fails_gets_one_probe_per_back_off() {
    let target = Target::start(FAIL, Duration::ZERO).await;
    let mut cfg = TestConfig::new(target.addr);
    cfg.route(PING);
    cfg.set("upstreams.clusters.max_fails", 1);
    cfg.set("upstreams.clusters.fail_timeout", "10s");
    let gw = Gateway::start(&cfg.write());
    assert_eq!(ping(&gw).await, 500);
    let ejected = Instant::now();
    // 40 clients at once for two seconds: the back-offs are 250 ms, then
    // 500 ms, 1 s, 2 s, so three probes come in that time.
    let statuses = flood(&gw, 40, 0, Duration::from_secs(2)).await;
    let probes = target.requests() - 1;
    let within = ejected.elapsed();
    assert!(
        (2..=4).contains(&probes),
        "{probes} requests reached the failing target in {within:?}, of {}",
        statuses.len()
    );
    assert_eq!(
        statuses.iter().filter(|&&s| s == 500).count(),
        probes,
        "the probes' answers are relayed; the rest are 503"
    );
    assert!(statuses.iter().all(|&s| s == 500 || s == 503));
}
