//! HTTP/1.1 on the wire, as clients rely on it, over raw TCP sockets so the
//! framing is ours: keep-alive and pipelining, `Connection: close` and
//! HTTP/1.0 persistence, Content-Length and chunked request bodies (chunk
//! extensions included), `Expect: 100-continue` (sent only when the body is
//! wanted), HEAD answered without body bytes, malformed request lines (400),
//! a head arriving in pieces, chunked and close-delimited upstream responses
//! re-framed for a keep-alive client, a chunked body past `max_body_bytes`,
//! and framing the reference parser refuses (a chunk-size line with no hex
//! digit, either way; a list-form `Content-Length`). These pin the server
//! side's behaviour whatever HTTP/1 implementation sits under
//! `src/server/`; tests/differential.rs holds the parsers to hyper's.
mod common;

use common::*;
use serde_json::Value;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const CLUSTERS: &str = "/api/v1/clusters?organization_id=acme";

/// Every read on a test connection gives up after this.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The shared world (tests/common) plus `HEAD /public/ping`.
async fn world() -> World {
    world_with(|_| {}).await
}

async fn world_with(tune: impl FnOnce(&mut TestConfig)) -> World {
    common::world_with(|cfg| {
        cfg.route("method = \"HEAD\"\npath = \"/public/ping\"\nauth = \"none\"\nupstream = \"clusters\"\nrate_limit = \"none\"");
        tune(cfg);
    })
    .await
}

fn auth(w: &World) -> String {
    format!("Authorization: Bearer {}\r\n", w.seed.key)
}

/// An authenticated `GET` of the clusters list, `extra` appended to the query.
fn get_clusters(w: &World, extra: &str) -> String {
    format!(
        "GET {CLUSTERS}{extra} HTTP/1.1\r\nHost: a\r\n{}\r\n",
        auth(w)
    )
}

/// The URIs the upstream saw, in order.
fn seen_uris(up: &MockUpstream) -> Vec<String> {
    up.seen
        .lock()
        .unwrap()
        .iter()
        .map(|s| s.uri.clone())
        .collect()
}

// === A raw HTTP/1.1 client connection ===

/// One response as it came off the wire, body decoded from its framing.
#[derive(Debug)]
struct Reply {
    version: String,
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// The body came chunked.
    chunked: bool,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// Whether a `Connection` header carries `token`.
    fn connection_has(&self, token: &str) -> bool {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case("connection"))
            .flat_map(|(_, v)| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    }
}

/// A client socket that reads any number of responses off one connection:
/// Content-Length, chunked, no body (HEAD, 1xx, 204, 304) or, lacking all
/// of these, a body delimited by the close.
struct Client {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Client {
        Client {
            s: TcpStream::connect(addr).await.unwrap(),
            buf: Vec::new(),
        }
    }

    async fn send(&mut self, bytes: impl AsRef<[u8]>) {
        self.s.write_all(bytes.as_ref()).await.unwrap();
    }

    /// Reads more bytes into the buffer; false at end of stream.
    async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 8192];
        match tokio::time::timeout(READ_TIMEOUT, self.s.read(&mut chunk)).await {
            Err(_) => panic!(
                "no bytes within {READ_TIMEOUT:?}; buffered: {:?}",
                String::from_utf8_lossy(&self.buf)
            ),
            Ok(Ok(0)) | Ok(Err(_)) => false,
            Ok(Ok(n)) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    /// One CRLF-terminated line (bare LF accepted), without its end.
    async fn line(&mut self) -> String {
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                let line = line.strip_suffix(b"\n").unwrap();
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                return String::from_utf8_lossy(line).into_owned();
            }
            assert!(
                self.fill().await,
                "connection closed mid-line: {:?}",
                String::from_utf8_lossy(&self.buf)
            );
        }
    }

    async fn exactly(&mut self, n: usize) -> Vec<u8> {
        while self.buf.len() < n {
            assert!(
                self.fill().await,
                "connection closed with {} of {n} body bytes",
                self.buf.len()
            );
        }
        self.buf.drain(..n).collect()
    }

    /// The next response (an interim 1xx too) to a request of `method`.
    async fn response_to(&mut self, method: &str) -> Reply {
        let status_line = self.line().await;
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or_default().to_string();
        let status: u16 = parts
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("not a status line: {status_line:?}"));
        assert!(version.starts_with("HTTP/1."), "{status_line:?}");
        let mut headers = Vec::new();
        loop {
            let line = self.line().await;
            if line.is_empty() {
                break;
            }
            let (k, v) = line
                .split_once(':')
                .unwrap_or_else(|| panic!("not a header line: {line:?}"));
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
        let mut reply = Reply {
            version,
            status,
            headers,
            body: Vec::new(),
            chunked: false,
        };
        if method == "HEAD" || status < 200 || status == 204 || status == 304 {
            return reply;
        }
        let te = reply
            .header("transfer-encoding")
            .map(str::to_ascii_lowercase);
        if te.is_some_and(|te| te.trim_end().ends_with("chunked")) {
            reply.chunked = true;
            loop {
                let size_line = self.line().await;
                let size = size_line.split(';').next().unwrap().trim();
                let size = usize::from_str_radix(size, 16)
                    .unwrap_or_else(|_| panic!("bad chunk size line {size_line:?}"));
                if size == 0 {
                    // Trailer fields, if any, up to the empty line.
                    while !self.line().await.is_empty() {}
                    break;
                }
                let data = self.exactly(size).await;
                reply.body.extend_from_slice(&data);
                assert_eq!(self.line().await, "", "chunk data not followed by CRLF");
            }
        } else if let Some(len) = reply.header("content-length") {
            let len: usize = len.parse().expect("numeric Content-Length");
            reply.body = self.exactly(len).await;
        } else {
            while self.fill().await {}
            reply.body = std::mem::take(&mut self.buf);
        }
        reply
    }

    /// The next response to a GET (or any method whose answer has a body).
    async fn response(&mut self) -> Reply {
        self.response_to("GET").await
    }

    /// Whether the server closes the connection within `within`, having
    /// sent nothing more.
    async fn closed_within(&mut self, within: Duration) -> bool {
        assert!(
            self.buf.is_empty(),
            "unread bytes: {:?}",
            String::from_utf8_lossy(&self.buf)
        );
        let mut chunk = [0u8; 1024];
        match tokio::time::timeout(within, self.s.read(&mut chunk)).await {
            Err(_) => false,
            Ok(Ok(0)) | Ok(Err(_)) => true,
            Ok(Ok(n)) => panic!(
                "unexpected bytes after the response: {:?}",
                String::from_utf8_lossy(&chunk[..n])
            ),
        }
    }

    /// Asserts nothing arrives (and no close) for a short while.
    async fn quiet_for(&mut self, period: Duration) {
        assert!(
            self.buf.is_empty(),
            "unread bytes: {:?}",
            String::from_utf8_lossy(&self.buf)
        );
        let mut chunk = [0u8; 1024];
        match tokio::time::timeout(period, self.s.read(&mut chunk)).await {
            Err(_) => {}
            Ok(Ok(0)) | Ok(Err(_)) => panic!("the connection was closed"),
            Ok(Ok(n)) => panic!(
                "unexpected bytes: {:?}",
                String::from_utf8_lossy(&chunk[..n])
            ),
        }
    }
}

// === Persistence ===

#[tokio::test]
async fn keep_alive_serves_sequential_requests_on_one_connection() {
    let w = world().await;
    let mut c = Client::connect(w.gw.addr).await;
    for n in 1..=3 {
        c.send(get_clusters(&w, &format!("&n={n}"))).await;
        let res = c.response().await;
        assert_eq!(res.status, 200, "request {n}: {}", res.text());
        assert_eq!(res.version, "HTTP/1.1");
        assert!(!res.connection_has("close"), "request {n}: {res:?}");
        assert!(
            res.json()["uri"]
                .as_str()
                .unwrap()
                .ends_with(&format!("&n={n}")),
            "request {n}: {}",
            res.text()
        );
    }
    c.quiet_for(Duration::from_millis(200)).await;
    assert_eq!(w.up.count(), 3);
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_on_one_connection() {
    let w = world().await;
    let mut c = Client::connect(w.gw.addr).await;
    // Three requests in one write; the middle one has a body, so its end
    // must be found by Content-Length alone.
    let body = "{\"name\":\"pipelined\"}";
    let pipeline = format!(
        "{}POST {CLUSTERS}&n=2 HTTP/1.1\r\nHost: a\r\n{}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}{}",
        get_clusters(&w, "&n=1"),
        auth(&w),
        body.len(),
        get_clusters(&w, "&n=3"),
    );
    c.send(pipeline).await;
    for (n, method) in [(1, "GET"), (2, "POST"), (3, "GET")] {
        let res = c.response().await;
        assert_eq!(res.status, 200, "response {n}: {}", res.text());
        let echoed = res.json();
        assert_eq!(echoed["method"], method, "response {n}: {echoed}");
        assert!(
            echoed["uri"]
                .as_str()
                .unwrap()
                .ends_with(&format!("&n={n}")),
            "response {n} out of order: {echoed}"
        );
    }
    c.quiet_for(Duration::from_millis(200)).await;
    let uris = seen_uris(&w.up);
    assert_eq!(
        uris,
        (1..=3)
            .map(|n| format!("{CLUSTERS}&n={n}"))
            .collect::<Vec<_>>()
    );
    let seen = w.up.seen.lock().unwrap().clone();
    assert_eq!(seen[1].body, body.as_bytes());
    assert!(seen[0].body.is_empty() && seen[2].body.is_empty());
}

#[tokio::test]
async fn connection_close_is_answered_then_closed() {
    let w = world().await;
    let mut c = Client::connect(w.gw.addr).await;
    c.send(format!(
        "GET {CLUSTERS} HTTP/1.1\r\nHost: a\r\n{}Connection: close\r\n\r\n",
        auth(&w)
    ))
    .await;
    let res = c.response().await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert!(
        c.closed_within(Duration::from_secs(2)).await,
        "left open after Connection: close"
    );
    assert_eq!(w.up.count(), 1);

    // A request pipelined behind one with `Connection: close` is never served.
    let mut c = Client::connect(w.gw.addr).await;
    c.send(format!(
        "GET {CLUSTERS}&n=1 HTTP/1.1\r\nHost: a\r\n{key}Connection: close\r\n\r\n{}",
        get_clusters(&w, "&n=2"),
        key = auth(&w),
    ))
    .await;
    let res = c.response().await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert!(
        c.closed_within(Duration::from_secs(2)).await,
        "a request after Connection: close was answered"
    );
    assert_eq!(
        seen_uris(&w.up),
        vec![CLUSTERS.to_string(), format!("{CLUSTERS}&n=1")]
    );
}

#[tokio::test]
async fn http_1_0_closes_unless_keep_alive_is_asked_for() {
    let w = world().await;
    // No keep-alive: answered, then closed (HTTP/1.0 needs no Host).
    let mut c = Client::connect(w.gw.addr).await;
    c.send("GET /public/ping?v=10 HTTP/1.0\r\n\r\n").await;
    let res = c.response().await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert!(!res.chunked, "chunked sent to an HTTP/1.0 client: {res:?}");
    assert_eq!(res.json()["uri"], "/public/ping?v=10");
    assert!(
        c.closed_within(Duration::from_secs(2)).await,
        "an HTTP/1.0 connection without keep-alive was left open"
    );

    // `Connection: keep-alive`: answered saying so, and a second request works.
    let mut c = Client::connect(w.gw.addr).await;
    for n in 1..=2 {
        c.send(format!(
            "GET /public/ping?ka={n} HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\n"
        ))
        .await;
        let res = c.response().await;
        assert_eq!(res.status, 200, "request {n}: {}", res.text());
        assert!(!res.chunked, "chunked sent to an HTTP/1.0 client: {res:?}");
        assert!(
            res.connection_has("keep-alive"),
            "request {n}: an HTTP/1.0 client is not told the connection persists: {res:?}"
        );
        assert_eq!(res.json()["uri"], format!("/public/ping?ka={n}"));
    }
    c.quiet_for(Duration::from_millis(200)).await;
    assert_eq!(w.up.count(), 3);
}

// === Request bodies ===

#[tokio::test]
async fn a_content_length_body_reaches_the_upstream_exactly() {
    let w = world().await;
    let mut c = Client::connect(w.gw.addr).await;
    // Bytes that look like framing must stay body bytes.
    let body: &[u8] = b"{\"a\":1}\r\n\r\n0\r\n\r\nGET /public/ping HTTP/1.1\r\n\r\n\x00\xff";
    let mut req = format!(
        "POST {CLUSTERS} HTTP/1.1\r\nHost: a\r\n{}Content-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
        auth(&w),
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    c.send(req).await;
    let res = c.response().await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["body_len"], body.len());
    let seen = w.up.last();
    assert_eq!(seen.method, "POST");
    assert_eq!(seen.body, body);
    // The body ended where Content-Length said: the next request is parsed
    // from the following byte, and nothing in the body was taken for one.
    c.send(get_clusters(&w, "&after=1")).await;
    let res = c.response().await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(
        seen_uris(&w.up),
        vec![CLUSTERS.to_string(), format!("{CLUSTERS}&after=1")]
    );
}

#[tokio::test]
async fn a_chunked_body_reaches_the_upstream_decoded() {
    let w = world().await;
    let mut c = Client::connect(w.gw.addr).await;
    c.send(format!(
        "POST {CLUSTERS} HTTP/1.1\r\nHost: a\r\n{}Content-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n",
        auth(&w)
    ))
    .await;
    // Several writes: a chunk extension, upper- and lower-case hex sizes, a
    // chunk holding CRLFs, and the last chunk with no trailer.
    for piece in [
        "4;ext=1\r\nWiki\r\n",
        "5\r\npedia\r\n",
        "E\r\n in\r\n\r\nchunks.\r\n",
        "a\r\n0123456789\r\n",
        "0\r\n\r\n",
    ] {
        c.send(piece).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let res = c.response().await;
    assert_eq!(res.status, 200, "{}", res.text());
    let want = b"Wikipedia in\r\n\r\nchunks.0123456789";
    assert_eq!(res.json()["body_len"], want.len());
    let seen = w.up.last();
    assert_eq!(seen.method, "POST");
    assert_eq!(
        String::from_utf8_lossy(&seen.body),
        String::from_utf8_lossy(want)
    );
    // The chunked framing ended at `0\r\n\r\n`: the connection goes on.
    c.send(get_clusters(&w, "&after=1")).await;
    let res = c.response().await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(w.up.count(), 2);
}

#[tokio::test]
async fn expect_100_continue_is_answered_before_the_body_is_sent() {
    let w = world().await;
    let body = "{\"name\":\"after-continue\"}";
    let mut c = Client::connect(w.gw.addr).await;
    c.send(format!(
        "POST {CLUSTERS} HTTP/1.1\r\nHost: a\r\n{}Content-Type: application/json\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        auth(&w),
        body.len()
    ))
    .await;
    let interim = tokio::time::timeout(Duration::from_secs(2), c.response_to("POST"))
        .await
        .expect("no 100 Continue within 2 s of a head with Expect: 100-continue");
    assert_eq!(interim.status, 100, "{interim:?}");
    assert_eq!(interim.version, "HTTP/1.1");
    c.send(body).await;
    let res = c.response_to("POST").await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["body_len"], body.len());
    assert_eq!(w.up.last().body, body.as_bytes());
    assert_eq!(w.up.count(), 1);

    // HTTP/1.0 knows no 1xx: the expectation is ignored (RFC 9110 §10.1.1),
    // so the first thing the client reads is the final answer.
    let mut c = Client::connect(w.gw.addr).await;
    c.send(format!(
        "POST {CLUSTERS} HTTP/1.0\r\n{}Content-Type: application/json\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        auth(&w),
        body.len()
    ))
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    c.send(body).await;
    let res = c.response_to("POST").await;
    assert_eq!(res.status, 200, "a 1xx sent to an HTTP/1.0 client? {res:?}");
    assert_eq!(res.json()["body_len"], body.len());
    assert_eq!(w.up.count(), 2);
}

#[tokio::test]
async fn expect_100_continue_refused_before_the_body_gets_no_100() {
    let w = world_with(|cfg| {
        cfg.set("server.limits.max_body_bytes", 1024);
    })
    .await;
    for (credential, length, want) in [
        (String::new(), 1000, 401),
        (
            "Authorization: Bearer mpg_not_a_key\r\n".to_string(),
            1000,
            401,
        ),
        (auth(&w), 5000, 413),
    ] {
        let mut c = Client::connect(w.gw.addr).await;
        // The head only: the body is never sent, the answer must not wait for it.
        c.send(format!(
            "POST {CLUSTERS} HTTP/1.1\r\nHost: a\r\n{credential}Content-Type: application/json\r\nContent-Length: {length}\r\nExpect: 100-continue\r\n\r\n"
        ))
        .await;
        let res = c.response_to("POST").await;
        assert_eq!(
            res.status, want,
            "{credential:?} {length}: a 100 Continue (or another answer) before the refusal: {res:?}"
        );
        assert!(res.json()["error"].is_string(), "{}", res.text());
        // The body the client still holds is never read as a request: the
        // connection ends.
        assert!(
            c.closed_within(Duration::from_secs(2)).await,
            "{credential:?} {length}: left open with an unread body announced"
        );
    }
    assert_eq!(w.up.count(), 0);
}

// === HEAD ===

#[tokio::test]
async fn head_is_answered_without_body_bytes_and_the_connection_goes_on() {
    let w = world().await;
    let mut c = Client::connect(w.gw.addr).await;
    c.send("HEAD /public/ping?h=1 HTTP/1.1\r\nHost: a\r\n\r\n")
        .await;
    let res = c.response_to("HEAD").await;
    assert_eq!(res.status, 200, "{res:?}");
    assert!(res.body.is_empty());
    // Not a single body byte follows the head.
    c.quiet_for(Duration::from_millis(300)).await;
    let seen = w.up.last();
    assert_eq!(
        (seen.method.as_str(), seen.uri.as_str()),
        ("HEAD", "/public/ping?h=1")
    );
    // The same connection serves a GET next, whose body is all there.
    c.send("GET /public/ping?h=2 HTTP/1.1\r\nHost: a\r\n\r\n")
        .await;
    let res = c.response().await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["method"], "GET");
    assert_eq!(res.json()["uri"], "/public/ping?h=2");
    // HEAD on a GET route (RFC 9110 §9.3.2): forwarded as HEAD, the
    // upstream's Content-Length and no body, and the connection goes on.
    c.send(format!(
        "HEAD {CLUSTERS}&h=3 HTTP/1.1\r\nHost: a\r\n{}\r\n",
        auth(&w)
    ))
    .await;
    let res = c.response_to("HEAD").await;
    assert_eq!(res.status, 200, "{res:?}");
    let length: usize = res.header("content-length").unwrap().parse().unwrap();
    assert!(length > 0, "{res:?}");
    assert!(res.header("x-ratelimit-remaining").is_some(), "{res:?}");
    c.quiet_for(Duration::from_millis(300)).await;
    assert_eq!(w.up.last().method, "HEAD");
    // HEAD on a path with no GET or HEAD route: 405 naming what is allowed,
    // also without a body, and the connection still goes on.
    c.send("HEAD /api/v1/api-keys/key_x/revoke HTTP/1.1\r\nHost: a\r\n\r\n")
        .await;
    let res = c.response_to("HEAD").await;
    assert_eq!(res.status, 405, "{res:?}");
    assert_eq!(res.header("allow"), Some("POST"), "{res:?}");
    c.quiet_for(Duration::from_millis(300)).await;
    c.send(get_clusters(&w, "&h=4")).await;
    let res = c.response().await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["method"], "GET");
    assert_eq!(w.up.count(), 4);
}

// === Malformed and slow heads ===

#[tokio::test]
async fn malformed_request_lines_get_400_and_a_close() {
    let w = world().await;
    for req in [
        "GARBAGE\r\n\r\n",
        "GET /public/ping HTTP/9.9\r\nHost: a\r\n\r\n",
        "GET /public/ping HTTP/1.1 extra\r\nHost: a\r\n\r\n",
        "GET  /public/ping HTTP/1.1\r\nHost: a\r\n\r\n",
        "G(T /public/ping HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET /public/ping FTP/1.1\r\nHost: a\r\n\r\n",
    ] {
        let mut c = Client::connect(w.gw.addr).await;
        c.send(req).await;
        let res = c.response().await;
        assert_eq!(res.status, 400, "{req:?}: {res:?}");
        // Nothing after an unparseable head can be trusted as a request.
        assert!(
            c.closed_within(Duration::from_secs(2)).await,
            "{req:?}: left open after a malformed head"
        );
    }
    assert_eq!(w.up.count(), 0);
}

#[tokio::test]
async fn a_head_arriving_in_pieces_is_served() {
    let w = world().await;
    let mut c = Client::connect(w.gw.addr).await;
    let req = get_clusters(&w, "&slow=1");
    // Cut inside the request line, inside a header line, and inside the
    // final CRLF CRLF.
    let (a, rest) = req.split_at(10);
    let (b, rest) = rest.split_at(rest.find("Bearer").unwrap() + 3);
    let (c2, d) = rest.split_at(rest.len() - 3);
    for piece in [a, b, c2, d] {
        c.send(piece).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let res = c.response().await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(seen_uris(&w.up), vec![format!("{CLUSTERS}&slow=1")]);
}

// === Responses without Content-Length from the upstream ===

/// Reads one request head off `s` (the gateway sends these raw upstreams
/// none with a body), keeping what follows in `buf`: its target, or `None`
/// once the connection ends or stays silent for 10 s.
async fn next_target(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout(Duration::from_secs(10), s.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => return None,
        }
    };
    let head: Vec<u8> = buf.drain(..end).collect();
    let head = String::from_utf8_lossy(&head);
    Some(head.split(' ').nth(1).unwrap_or("/").to_string())
}

/// A raw HTTP/1.1 upstream: `GET …/chunked` is answered chunked in several
/// writes (one chunk with an extension); any other path with no framing at
/// all, the body ending at the close. Returns its address and its task.
async fn raw_upstream() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let Some(target) = next_target(&mut s, &mut buf).await else {
                        return;
                    };
                    if target.contains("/chunked") {
                        let pieces: [&[u8]; 4] = [
                            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n",
                            b"6;note=first\r\nhello \r\n",
                            b"7\r\nchunked\r\n1B\r\n world, in three pieces!!\r\n\r\n",
                            b"0\r\n\r\n",
                        ];
                        for piece in pieces {
                            if s.write_all(piece).await.is_err() {
                                return;
                            }
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    } else {
                        let _ = s
                            .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nuntil ")
                            .await;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        let _ = s.write_all(b"the close").await;
                        let _ = s.shutdown().await;
                        return;
                    }
                }
            });
        }
    });
    (addr, task)
}

#[tokio::test]
async fn chunked_and_close_delimited_upstream_bodies_reach_a_keep_alive_client_whole() {
    let (raw_addr, raw_task) = raw_upstream().await;
    let w = world_with(|cfg| {
        cfg.set("upstreams.raw.targets", vec![format!("http://{raw_addr}")]);
        for path in ["/public/chunked", "/public/eof"] {
            cfg.route(&format!("method = \"GET\"\npath = \"{path}\"\nauth = \"none\"\nupstream = \"raw\"\nrate_limit = \"none\""));
        }
    })
    .await;
    let mut c = Client::connect(w.gw.addr).await;
    for round in 0..2 {
        c.send("GET /public/chunked HTTP/1.1\r\nHost: a\r\n\r\n")
            .await;
        let res = c.response().await;
        assert_eq!(res.status, 200, "round {round}: {res:?}");
        assert_eq!(
            res.text(),
            "hello chunked world, in three pieces!!\r\n",
            "round {round}: {res:?}"
        );
        // The gateway may re-frame, but the client must be able to find the end.
        assert!(
            res.chunked || res.header("content-length").is_some(),
            "round {round}: an unframed body on a keep-alive connection: {res:?}"
        );
        c.send("GET /public/eof HTTP/1.1\r\nHost: a\r\n\r\n").await;
        let res = c.response().await;
        assert_eq!(res.status, 200, "round {round}: {res:?}");
        assert_eq!(res.text(), "until the close", "round {round}: {res:?}");
        assert!(
            res.chunked || res.header("content-length").is_some(),
            "round {round}: an unframed body on a keep-alive connection: {res:?}"
        );
    }
    c.quiet_for(Duration::from_millis(200)).await;

    // An HTTP/1.0 client cannot take chunked: the body ends at the close.
    let mut c = Client::connect(w.gw.addr).await;
    c.send("GET /public/chunked HTTP/1.0\r\n\r\n").await;
    let res = c.response().await;
    assert_eq!(res.status, 200, "{res:?}");
    assert!(!res.chunked, "chunked sent to an HTTP/1.0 client: {res:?}");
    assert_eq!(res.text(), "hello chunked world, in three pieces!!\r\n");
    raw_task.abort();
}

// === Body limit ===

#[tokio::test]
async fn a_chunked_body_past_max_body_bytes_never_reaches_the_upstream_whole() {
    // A declared Content-Length over the limit (413) is in tests/pipeline.rs;
    // this is the chunked one, over a raw socket, which can only be caught
    // while it streams.
    let w = world_with(|cfg| {
        cfg.set("server.limits.max_body_bytes", 1024);
    })
    .await;
    let mut c = Client::connect(w.gw.addr).await;
    c.send(format!(
        "POST {CLUSTERS} HTTP/1.1\r\nHost: a\r\n{}Transfer-Encoding: chunked\r\n\r\n",
        auth(&w)
    ))
    .await;
    let chunk = format!("200\r\n{}\r\n", "y".repeat(512));
    for _ in 0..8 {
        c.s.write_all(chunk.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    c.s.write_all(b"0\r\n\r\n").await.unwrap();
    // The gateway answers 413 once the body passes the limit, then reads
    // past the rest of the body (well within its drain bound, docs/http.md)
    // and keeps the connection: the next request on it is served.
    let res = c.response_to("POST").await;
    assert_eq!(res.status, 413, "{res:?}");
    assert_eq!(res.json()["error"], "PayloadTooLarge", "{}", res.text());
    assert!(!res.connection_has("close"), "{res:?}");
    c.send("HEAD /public/ping HTTP/1.1\r\nHost: a\r\n\r\n")
        .await;
    let next = c.response_to("HEAD").await;
    assert_eq!(next.status, 200, "{next:?}");
    // The upstream got the head and part of the body, then its connection
    // was cut: its read of the body failed (the mock records that as an
    // empty body), so it never had a body over the limit.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seen: Vec<_> = (w.up.seen.lock().unwrap().iter())
        .filter(|s| s.method == "POST")
        .cloned()
        .collect();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(
        seen[0].body.is_empty(),
        "the upstream read {} bytes of a body over the 1024-byte limit",
        seen[0].body.len()
    );
}

// === Upstream answers without a body ===

/// A raw HTTP/1.1 upstream answering each request head with the bytes of
/// the first entry whose key its target ends with (no entry: the connection
/// is closed). Returns its address.
async fn canned_upstream(answers: &'static [(&'static str, &'static [u8])]) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let Some(target) = next_target(&mut s, &mut buf).await else {
                        return;
                    };
                    let Some((_, answer)) = answers.iter().find(|(k, _)| target.ends_with(*k))
                    else {
                        return;
                    };
                    if s.write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_304_or_head_answer_gets_no_content_length_the_target_did_not_send() {
    // RFC 9110 §8.6: a 304 or HEAD answer may carry a Content-Length only
    // if it is the size the GET's body would have; a cache that reads 0 there
    // would store the representation as empty.
    static ANSWERS: &[(&str, &[u8])] = &[
        (
            "/not-modified-sized",
            b"HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\nContent-Length: 5\r\n\r\n",
        ),
        (
            "/not-modified",
            b"HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\n\r\n",
        ),
        (
            "/chunked",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        ),
        (
            "/sized",
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        ),
    ];
    let addr = canned_upstream(ANSWERS).await;
    let w = world_with(|cfg| {
        cfg.set("upstreams.raw.targets", vec![format!("http://{addr}")]);
        for method in ["GET", "HEAD"] {
            cfg.route(&format!("method = \"{method}\"\npath = \"/public/raw/{{case}}\"\nauth = \"none\"\nupstream = \"raw\"\nrate_limit = \"none\""));
        }
    })
    .await;
    let mut c = Client::connect(w.gw.addr).await;
    // (method, case, status, the Content-Length the client must see)
    let cases = [
        ("GET", "not-modified", 304, None),
        ("GET", "not-modified-sized", 304, Some("5")),
        ("HEAD", "chunked", 200, None),
        ("HEAD", "sized", 200, Some("5")),
        ("GET", "chunked", 200, None),
    ];
    for (method, case, status, length) in cases {
        c.send(format!(
            "{method} /public/raw/{case} HTTP/1.1\r\nHost: a\r\n\r\n"
        ))
        .await;
        let res = c.response_to(method).await;
        assert_eq!(res.status, status, "{method} {case}: {res:?}");
        assert_eq!(
            res.header("content-length"),
            length,
            "{method} {case}: {res:?}"
        );
        assert!(!res.connection_has("close"), "{method} {case}: {res:?}");
    }
    // The last GET's body came whole (chunked), and nothing followed.
    c.quiet_for(Duration::from_millis(200)).await;
}

#[tokio::test]
async fn an_upstream_body_that_stalls_is_cut_off_after_request_timeout() {
    // A target that sends its head and part of its body, then nothing,
    // must not hold the client's connection (and its own) for ever: each
    // wait for more body is bounded by request_timeout (nginx's
    // proxy_read_timeout); the client sees the body cut off and a close.
    static ANSWERS: &[(&str, &[u8])] = &[(
        "/stall",
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial",
    )];
    let addr = canned_upstream(ANSWERS).await;
    let w = world_with(|cfg| {
        cfg.set("upstreams.raw.targets", vec![format!("http://{addr}")]);
        cfg.set("upstreams.raw.request_timeout", "500ms");
        cfg.route("method = \"GET\"\npath = \"/public/raw/{case}\"\nauth = \"none\"\nupstream = \"raw\"\nrate_limit = \"none\"");
    })
    .await;
    let mut c = Client::connect(w.gw.addr).await;
    let started = std::time::Instant::now();
    c.send("GET /public/raw/stall HTTP/1.1\r\nHost: a\r\n\r\n")
        .await;
    while c.fill().await {}
    let took = started.elapsed();
    let got = String::from_utf8_lossy(&c.buf).to_string();
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(got.ends_with("\r\n\r\npartial"), "{got}");
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

// === Framing the reference parser (hyper) refuses ===

/// A chunked body whose second size line is empty, then what looks like
/// two more chunks: read as the last chunk, the empty line would end the
/// body after one byte and leave the rest to be read as the next message.
const EMPTY_SIZE_LINE: &str = "1\r\nA\r\n\r\n2\r\nBB\r\n0\r\n\r\n";

#[tokio::test]
async fn a_chunk_size_line_without_a_hex_digit_is_a_400_not_the_last_chunk() {
    let w = world().await;
    let mut c = Client::connect(w.gw.addr).await;
    c.send(format!(
        "POST {CLUSTERS} HTTP/1.1\r\nHost: a\r\n{}Content-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n{EMPTY_SIZE_LINE}",
        auth(&w)
    ))
    .await;
    let res = c.response_to("POST").await;
    assert_eq!(res.status, 400, "{res:?}");
    assert_eq!(res.json()["error"], "BadRequest", "{}", res.text());
    assert!(res.connection_has("close"), "{res:?}");
    // Nothing after the bad size line was read as a request.
    assert!(c.closed_within(Duration::from_secs(2)).await);
    // Bodies stream: the head went on before the bad size line was read, and
    // the upstream's copy of the body broke off there (the mock records a
    // body that did not end as empty), never ending as one.
    w.up.until_count(1).await;
    let seen = w.up.seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(
        seen[0].body.is_empty(),
        "the upstream got a body: {:?}",
        seen[0]
    );
}

/// An upstream that answers every request with `head` at once, then, after
/// a pause, `rest` (none: nothing more), then closes.
async fn two_part_upstream(head: &'static [u8], rest: Option<&'static [u8]>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let mut buf = Vec::new();
                if next_target(&mut s, &mut buf).await.is_none() {
                    return;
                }
                let _ = s.write_all(head).await;
                if let Some(rest) = rest {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    let _ = s.write_all(rest).await;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn an_upstream_chunk_size_line_without_a_hex_digit_is_never_passed_on_as_an_end() {
    // Arriving with the head, the bad framing is a 502; arriving after the
    // head has gone to the client, the body breaks off (no last chunk), so
    // the client cannot take the one byte before it for the whole body.
    static WHOLE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nA\r\n\r\n2\r\nBB\r\n0\r\n\r\n";
    static HEAD: &[u8] =
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nA\r\n";
    static LATER: &[u8] = b"\r\n2\r\nBB\r\n0\r\n\r\n";
    let at_once = two_part_upstream(WHOLE, None).await;
    let later = two_part_upstream(HEAD, Some(LATER)).await;
    let w = world_with(|cfg| {
        cfg.set("upstreams.once.targets", vec![format!("http://{at_once}")]);
        cfg.set("upstreams.later.targets", vec![format!("http://{later}")]);
        cfg.route("method = \"GET\"\npath = \"/public/once\"\nauth = \"none\"\nupstream = \"once\"\nrate_limit = \"none\"");
        cfg.route("method = \"GET\"\npath = \"/public/later\"\nauth = \"none\"\nupstream = \"later\"\nrate_limit = \"none\"");
    })
    .await;
    let mut c = Client::connect(w.gw.addr).await;
    c.send("GET /public/once HTTP/1.1\r\nHost: a\r\n\r\n").await;
    let res = c.response().await;
    assert_eq!(res.status, 502, "{res:?}");
    assert_eq!(res.json()["error"], "BadGateway", "{}", res.text());

    let mut c = Client::connect(w.gw.addr).await;
    c.send("GET /public/later HTTP/1.1\r\nHost: a\r\n\r\n")
        .await;
    while c.fill().await {}
    let got = String::from_utf8_lossy(&c.buf).to_string();
    assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{got}");
    assert!(got.contains("\r\ntransfer-encoding: chunked\r\n"), "{got}");
    assert!(got.ends_with("\r\n\r\n1\r\nA\r\n"), "{got}");
}

#[tokio::test]
async fn a_list_form_content_length_is_refused_and_a_repeated_one_is_checked_against_the_limit() {
    // `70000, 70000` is one length to a lenient reader: hyper and nginx
    // refuse it (400). On separate lines it is one length (hyper's rule),
    // over the limit: 413. Neither reaches the upstream, cut to the limit.
    let w = world_with(|cfg| {
        cfg.set("server.limits.max_body_bytes", 65536);
    })
    .await;
    let body = "x".repeat(70000);
    for (framing, want) in [
        ("Content-Length: 70000, 70000\r\n", 400),
        ("Content-Length: 70000,70000\r\n", 400),
        ("Content-Length: 70000\r\nContent-Length: 70000\r\n", 413),
    ] {
        let mut c = Client::connect(w.gw.addr).await;
        c.send(format!(
            "POST {CLUSTERS} HTTP/1.1\r\nHost: a\r\n{}Content-Type: text/plain\r\n{framing}\r\n",
            auth(&w)
        ))
        .await;
        // The body may be refused before all of it has gone.
        let _ = c.s.write_all(body.as_bytes()).await;
        let res = c.response_to("POST").await;
        assert_eq!(res.status, want, "{framing:?}: {res:?}");
        // A framing the gateway cannot read ends the connection; a body over
        // the limit is read past (within the drain bound, docs/http.md).
        assert_eq!(
            res.connection_has("close"),
            want == 400,
            "{framing:?}: {res:?}"
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(w.up.count(), 0, "{:?}", w.up.seen.lock().unwrap());
}

// === Request bodies the client fails to deliver ===

#[tokio::test]
async fn uploads_the_client_aborts_or_stalls_never_eject_the_target() {
    // One target, ejected after max_fails = 3 failures in a row. Failures of
    // the client's own body are not the target's: were they counted, any
    // client could take every target out of rotation (503 for everyone)
    // by starting three uploads and dropping them.
    let w = world_with(|cfg| {
        cfg.set("upstreams.clusters.request_timeout", "300ms");
    })
    .await;
    let upload = |n: usize| {
        format!(
            "POST {CLUSTERS}&n={n} HTTP/1.1\r\nHost: a\r\n{}Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"name\":",
            auth(&w)
        )
    };
    // Cut off half-way.
    for n in 0..3 {
        let mut c = Client::connect(w.gw.addr).await;
        c.send(upload(n)).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(c);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut c = Client::connect(w.gw.addr).await;
    c.send(get_clusters(&w, "&after=aborts")).await;
    let res = c.response().await;
    assert_eq!(res.status, 200, "after aborted uploads: {}", res.text());
    // Stalled past request_timeout: the client's fault (400 naming the
    // body, not a 5xx blaming the upstream), and the target stays in.
    for n in 3..6 {
        let mut c = Client::connect(w.gw.addr).await;
        c.send(upload(n)).await;
        let res = c.response_to("POST").await;
        assert_eq!(res.status, 400, "stalled upload: {res:?}");
        assert_eq!(res.json()["error"], "BadRequest", "{}", res.text());
        let message = res.json()["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(message.starts_with("request body: "), "{message}");
    }
    let mut c = Client::connect(w.gw.addr).await;
    c.send(get_clusters(&w, "&after=stalls")).await;
    let res = c.response().await;
    assert_eq!(res.status, 200, "after stalled uploads: {}", res.text());
}

#[tokio::test]
async fn a_malformed_chunked_body_is_the_clients_400_not_a_502() {
    // The head is fine, so the request is on its way upstream when a chunk
    // size turns out to be garbage: the answer names the body (400), never
    // "upstream could not be reached" (502), and the connection closes
    // (what follows the bad chunk cannot be framed).
    let w = world().await;
    for bad in ["zz\r\nabc\r\n", "ffffffffffffffffffff\r\n", "3\r\nabcXY"] {
        let mut c = Client::connect(w.gw.addr).await;
        c.send(format!(
            "POST {CLUSTERS} HTTP/1.1\r\nHost: a\r\n{}Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n{bad}",
            auth(&w)
        ))
        .await;
        let res = c.response_to("POST").await;
        assert_eq!(res.status, 400, "{bad:?}: {res:?}");
        assert_eq!(res.json()["error"], "BadRequest", "{}", res.text());
        assert!(res.connection_has("close"), "{bad:?}: {res:?}");
    }
    // The target was not blamed.
    let mut c = Client::connect(w.gw.addr).await;
    c.send(get_clusters(&w, "&after=bad-chunks")).await;
    assert_eq!(c.response().await.status, 200);
}

#[tokio::test]
async fn a_request_body_that_stalls_is_cut_off_after_idle_timeout() {
    // The built-in key service waits for the whole body with no upstream
    // deadline of its own: only the connection's idle_timeout can end a
    // client that stops sending half-way (nginx's client_body_timeout).
    let w = world_with(|cfg| {
        cfg.set("server.limits.idle_timeout", "1s");
    })
    .await;
    let mut c = Client::connect(w.gw.addr).await;
    c.send(format!(
        "POST /api/v1/api-keys?organization_id=acme HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"name\":",
        w.seed.session
    ))
    .await;
    let started = std::time::Instant::now();
    let res = c.response_to("POST").await;
    assert_eq!(res.status, 400, "{res:?}");
    assert_eq!(res.json()["error"], "BadRequest", "{}", res.text());
    assert!(res.connection_has("close"), "{res:?}");
    assert!(c.closed_within(Duration::from_secs(2)).await);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(4),
        "{took:?}"
    );
}

// === Request header hygiene ===

#[tokio::test]
async fn proxy_headers_never_reach_the_upstream() {
    // The gateway removes every `Proxy-*` header, not only the three
    // standard ones; and `Proxy` itself is httpoxy (CVE-2016-5385): a CGI,
    // PHP or Go net/http/cgi upstream turns it into HTTP_PROXY and sends its
    // own outbound requests through the client's proxy.
    let w = world().await;
    let mut c = Client::connect(w.gw.addr).await;
    c.send(format!(
        "GET {CLUSTERS} HTTP/1.1\r\nHost: a\r\n{}Proxy: http://evil.example:8080\r\nProxy-Foo: 1\r\nproxy_bar: 2\r\nProxy-Authorization: Basic eDp5\r\nProxy-Connection: keep-alive\r\nX-Proxy: kept\r\nProxyish: kept\r\n\r\n",
        auth(&w)
    ))
    .await;
    let res = c.response().await;
    assert_eq!(res.status, 200, "{}", res.text());
    let seen = w.up.last();
    for gone in [
        "proxy",
        "proxy-foo",
        "proxy_bar",
        "proxy-authorization",
        "proxy-connection",
    ] {
        assert!(
            !seen.headers.contains_key(gone),
            "{gone} reached the upstream: {:?}",
            seen.headers
        );
    }
    assert_eq!(seen.headers["x-proxy"], "kept");
    assert_eq!(seen.headers["proxyish"], "kept");
}

// === Drain ===

#[tokio::test]
async fn sigterm_closes_a_connection_that_sent_nothing_and_lets_the_request_in_flight_finish() {
    let w = world_with(|cfg| {
        cfg.route("method = \"GET\"\npath = \"/api/v1/slow\"\nauth = \"api_key\"\nscope = \"clusters:read\"\norganization = \"query:organization_id\"\nupstream = \"clusters\"");
        cfg.set("upstreams.clusters.request_timeout", "10s");
        cfg.set("server.limits.header_read_timeout", "30s");
        cfg.set("server.limits.shutdown_grace", "30s");
    })
    .await;
    let slow = format!(
        "GET /api/v1/slow?organization_id=acme HTTP/1.1\r\nHost: a\r\n{}\r\n",
        auth(&w)
    );
    let mut gw = w.gw;
    let mut busy = Client::connect(gw.addr).await;
    busy.send(slow).await;
    let mut fresh = Client::connect(gw.addr).await;
    // In flight: the upstream has it (and answers 3 s later).
    w.up.until_count(1).await;
    let started = std::time::Instant::now();
    signal(gw.child.id(), "TERM");
    // No request on it: closed at once, not after header_read_timeout.
    assert!(
        fresh.closed_within(Duration::from_secs(1)).await,
        "a connection that sent nothing was left open by the drain"
    );
    // The request in flight still gets its answer, and a close.
    let reply = busy.response().await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(reply.connection_has("close"));
    let status = tokio::task::spawn_blocking(move || gw.child.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "exit took {:?}",
        started.elapsed()
    );
}
