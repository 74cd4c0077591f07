use super::*;
use crate::http_core::body::{Body, Limited};
use bytes::Bytes;
use http::{Request, Response};
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
    Request::get(path)
        .body(crate::http_core::body::empty())
        .unwrap()
}

/// `req` through `up`, as the pipeline sends it (no added fields).
async fn send(up: &Upstream, req: Request<Body>) -> Result<Response<Body>, UpstreamError> {
    let (mut parts, body) = req.into_parts();
    up.forward(&mut parts, body, None).await
}

/// A one-shot raw server: reads the request head, then runs `reply`.
async fn raw_server(reply: &'static [u8], close_early: bool, stall: bool) -> std::net::SocketAddr {
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
    let res = crate::http_core::service::Reply::<()>::from(res).into_response();
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
    let chunks =
        futures_util::stream::iter((0..64).map(|_| {
            Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(vec![b'x'; 1024])))
        }));
    let body = Body::new(Limited::new(StreamBody::new(chunks), 4096));
    let req = Request::post("/").body(body).unwrap();
    assert!(matches!(
        send(&up, req).await,
        Err(UpstreamError::BodyTooLarge)
    ));
}
