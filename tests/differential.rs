//! The gateway's own HTTP/1.1 code against a reference: the same bytes go
//! through our server loop (`src/h1`: head parser, body decoder,
//! keep-alive, pipelining, refusals) and through hyper's HTTP/1 server,
//! each over an in-memory stream with an application that records every
//! request it is handed (method, target, version, header fields, body bytes
//! or a failed body); and the same upstream answers go through our upstream
//! client (`src/proxy/client`) and through hyper's HTTP/1 client. Both must
//! agree on what was accepted and what was refused, and on everything
//! accepted, or the difference is one of [`EXCEPTIONS`], each explained.
//!
//! The inputs: a corpus of known-tricky cases (the framing cases of
//! tests/adversarial.rs and tests/http1.rs; the smuggler.py `Transfer-
//! Encoding` gadgets; the HTTP Garden's payloads; hyper's own chunk-size
//! cases; request-smuggling classics), then generated streams (proptest)
//! built from pieces of such requests, pipelined, cut short and mutated.
use bytes::Bytes;
use http::header::{HeaderMap, CONNECTION};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use mpg_gateway::http_core::body::RequestBody;
use mpg_gateway::http_core::service::{ConnInfo, Handler, Reply};
use mpg_gateway::wire;
use proptest::prelude::*;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The longest head hyper's HTTP/1 server buffers (its default
/// `max_buf_size`); ours is given the same bound here.
const MAX_HEAD: usize = 8192 + 4096 * 100;
/// Either side taking longer than this on one input is a failure.
const LIMIT: Duration = Duration::from_secs(10);

// === What a server made of a byte stream ===

/// One request as a server handed it to the application.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    method: String,
    target: String,
    version: String,
    headers: Vec<(String, Bytes)>,
    /// The body, or `None` when reading it failed.
    body: Option<Bytes>,
}

impl Seen {
    fn new(parts: &http::request::Parts, body: Option<Bytes>) -> Self {
        Seen {
            method: parts.method.to_string(),
            target: parts.uri.to_string(),
            version: format!("{:?}", parts.version),
            headers: fields(&parts.headers),
            body,
        }
    }
}

/// The fields of `headers` in order, as (name, value) pairs.
fn fields(headers: &HeaderMap) -> Vec<(String, Bytes)> {
    headers
        .iter()
        .map(|(n, v)| (n.to_string(), Bytes::copy_from_slice(v.as_bytes())))
        .collect()
}

/// What a server did with a byte stream.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Served {
    /// The requests handed to the application, in order.
    requests: Vec<Seen>,
    /// The server refused a request head with an error status of its own.
    refused: bool,
    /// The stream was handed to HTTP/2 (ours only: the h2 preface).
    h2: bool,
}

/// The application both servers run: it records each request with its
/// body read to the end, and answers 404 with no body.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Seen>>>);

impl Recorder {
    /// Records a request as it arrives (its body `None`), then its body
    /// once read: a request whose handling the server gave up before the
    /// body's end keeps `None`.
    async fn record<B>(&self, parts: &http::request::Parts, body: B)
    where
        B: http_body::Body<Data = Bytes>,
    {
        let at = {
            let mut seen = self.0.lock().unwrap();
            seen.push(Seen::new(parts, None));
            seen.len() - 1
        };
        let body = body.collect().await.ok().map(|c| c.to_bytes());
        self.0.lock().unwrap()[at].body = body;
    }

    fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

impl Handler for Recorder {
    type Stamp = ();

    fn handle(
        &self,
        req: Request<RequestBody>,
        _: Arc<ConnInfo>,
    ) -> impl Future<Output = Reply> + Send {
        let recorder = self.clone();
        async move {
            let (parts, body) = req.into_parts();
            recorder.record(&parts, body).await;
            let mut res = Response::new(mpg_gateway::http_core::body::empty());
            *res.status_mut() = StatusCode::NOT_FOUND;
            res.into()
        }
    }
}

/// Whether `out` (what a server wrote) holds a response other than the
/// application's 404 and interim 100s: a refusal by the server itself.
fn refused(out: &[u8]) -> bool {
    let mut at = 0;
    while at < out.len() {
        let mut fields = [httparse::EMPTY_HEADER; 64];
        let mut res = httparse::Response::new(&mut fields);
        let Ok(httparse::Status::Complete(len)) = res.parse(&out[at..]) else {
            return true;
        };
        if !matches!(res.code, Some(100 | 404)) {
            return true;
        }
        let length = res
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("content-length"))
            .and_then(|h| std::str::from_utf8(h.value).ok()?.parse::<usize>().ok())
            .unwrap_or(0);
        at += len + length;
    }
    false
}

/// Feeds `input` to a server on the other end of an in-memory stream
/// (then ends the stream): what the server wrote back, and what it
/// returned.
async fn exchange<F, Fut, T>(input: &[u8], server: F) -> (Vec<u8>, T)
where
    F: FnOnce(tokio::io::DuplexStream) -> Fut,
    Fut: Future<Output = T>,
{
    let (mut client, server_io) = tokio::io::duplex(input.len() + 64 * 1024);
    client.write_all(input).await.unwrap();
    client.shutdown().await.unwrap();
    let mut out = Vec::new();
    let read = async {
        let _ = client.read_to_end(&mut out).await;
    };
    let (returned, ()) =
        tokio::time::timeout(LIMIT, async { tokio::join!(server(server_io), read) })
            .await
            .unwrap_or_else(|_| panic!("a server hung on {:?}", show(input)));
    (out, returned)
}

/// What our server loop makes of `input`.
async fn ours(input: &[u8]) -> Served {
    let recorder = Recorder::default();
    let handler = Arc::new(recorder.clone());
    let (out, h2) = exchange(input, |mut io| async move {
        matches!(wire::serve(&mut io, handler, MAX_HEAD).await, Ok(true))
    })
    .await;
    Served {
        requests: recorder.take(),
        refused: refused(&out),
        h2,
    }
}

/// What hyper's HTTP/1 server makes of `input`.
async fn hypers(input: &[u8]) -> Served {
    let recorder = Recorder::default();
    let record = recorder.clone();
    let service = service_fn(move |req: Request<Incoming>| {
        let record = record.clone();
        async move {
            let (parts, body) = req.into_parts();
            record.record(&parts, body).await;
            let res = Response::builder()
                .status(StatusCode::NOT_FOUND)
                .body(Empty::<Bytes>::new())
                .unwrap();
            Ok::<_, std::convert::Infallible>(res)
        }
    });
    let (out, ()) = exchange(input, |io| async move {
        // The input ends with the client's half of the stream: hyper must
        // not take that for the connection's end while it still answers.
        let _ = hyper::server::conn::http1::Builder::new()
            .half_close(true)
            .serve_connection(TokioIo::new(io), service)
            .await;
    })
    .await;
    Served {
        requests: recorder.take(),
        refused: refused(&out),
        h2: false,
    }
}

/// `Err` describing the difference when our server and hyper's disagree
/// on `input`.
/// With `excuse`, a difference that is the first of the deliberate ones
/// ([`server_exceptions`]) is no failure.
async fn servers_agree(input: &[u8], excuse: bool) -> Result<(), String> {
    let (ours, reference) = (ours(input).await, hypers(input).await);
    if ours == reference || (excuse && refused_a_bare_lf_trailer(input, &ours, &reference)) {
        return Ok(());
    }
    Err(format!(
        "input: {}\n  ours:  {ours:?}\n  hyper: {reference:?}",
        show(input)
    ))
}

// === What a client made of an upstream's answer ===

/// An exchange as a client saw it: `None` when it failed anywhere (the
/// head, or the body before its end).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    status: u16,
    /// The end-to-end fields, without `Content-Length` (the body's length
    /// is compared as the body).
    headers: Vec<(String, Bytes)>,
    body: Bytes,
}

/// The hop-by-hop fields a proxy never passes on (RFC 9110 §7.6.1).
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
];

/// hyper's fields as a proxy passes them on: without the hop-by-hop ones,
/// those `Connection` names, and `Content-Length`.
fn end_to_end(headers: &HeaderMap) -> Vec<(String, Bytes)> {
    let named: Vec<String> = headers
        .get_all(CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(|t| String::from_utf8_lossy(t.trim_ascii()).to_ascii_lowercase())
        .filter(|t| !t.is_empty() && t != "keep-alive" && t != "close")
        .collect();
    fields(headers)
        .into_iter()
        .filter(|(n, _)| {
            !HOP_BY_HOP.contains(&n.as_str()) && n != "content-length" && !named.contains(n)
        })
        .collect()
}

/// An upstream on `io`: reads the request head, writes `answer`, ends its
/// side, and reads on until the client goes (so nothing is reset).
async fn upstream<S: AsyncRead + AsyncWrite + Unpin>(mut io: S, answer: Vec<u8>) {
    let mut head = Vec::new();
    let mut chunk = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match io.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&chunk[..n]),
        }
    }
    let _ = io.write_all(&answer).await;
    let _ = io.shutdown().await;
    let _ = tokio::io::copy(&mut io, &mut tokio::io::sink()).await;
}

/// What our upstream client makes of `answer` to a GET (or a HEAD).
async fn our_answer(answer: &[u8], head: bool) -> Option<Answer> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let answer = answer.to_vec();
    let up = tokio::spawn(async move {
        if let Ok((s, _)) = listener.accept().await {
            upstream(s, answer).await;
        }
    });
    let stream = TcpStream::connect(addr).await.unwrap();
    let req = Request::builder()
        .method(if head { "HEAD" } else { "GET" })
        .uri("/")
        .body(())
        .unwrap();
    let got = wire::fetch(stream, req).await;
    up.abort();
    let (res, body) = got.ok()?;
    let mut headers = fields(res.headers());
    headers.retain(|(n, _)| n != "content-length");
    Some(Answer {
        status: res.status().as_u16(),
        headers,
        body: body.ok()?,
    })
}

/// What hyper's HTTP/1 client makes of `answer` to a GET (or a HEAD).
async fn hyper_answer(answer: &[u8], head: bool) -> Option<Answer> {
    let (client, server) = tokio::io::duplex(answer.len() + 64 * 1024);
    let up = tokio::spawn(upstream(server, answer.to_vec()));
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(client))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let req = Request::builder()
        .method(if head { "HEAD" } else { "GET" })
        .uri("/")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let got = async {
        let res = sender.send_request(req).await.ok()?;
        let (parts, body) = res.into_parts();
        let body = body.collect().await.ok()?.to_bytes();
        Some(Answer {
            status: parts.status.as_u16(),
            headers: end_to_end(&parts.headers),
            body,
        })
    }
    .await;
    up.abort();
    conn.abort();
    got
}

/// `Err` describing the difference when our client and hyper's disagree
/// on `answer`.
/// With `excuse`, a difference that is one of the deliberate ones
/// ([`client_exceptions`]: a bare LF in the trailers, a 101) is no failure.
async fn clients_agree(answer: &[u8], head: bool, excuse: bool) -> Result<(), String> {
    let run = async {
        (
            our_answer(answer, head).await,
            hyper_answer(answer, head).await,
        )
    };
    let (ours, reference) = tokio::time::timeout(LIMIT, run)
        .await
        .unwrap_or_else(|_| panic!("a client hung on {:?}", show(answer)));
    let excused = excuse
        && ours.is_none()
        && (bare_lf_in_a_trailer_section(answer)
            || reference.as_ref().is_some_and(|a| a.status == 101));
    if ours == reference || excused {
        return Ok(());
    }
    Err(format!(
        "answer to {}: {}\n  ours:  {ours:?}\n  hyper: {reference:?}",
        if head { "HEAD" } else { "GET" },
        show(answer)
    ))
}

/// `bytes` as a Rust byte-string literal's contents (a long one cut).
fn show(bytes: &[u8]) -> String {
    let text = bytes.escape_ascii().to_string();
    match text.char_indices().nth(400) {
        Some((at, _)) => format!("{}… ({} bytes)", &text[..at], bytes.len()),
        None => text,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

// === The corpus ===

/// A POST with `framing` (header lines, each ending in CRLF) and `body`.
fn post(framing: &str, body: &str) -> Vec<u8> {
    format!("POST /p HTTP/1.1\r\nHost: a\r\n{framing}\r\n{body}").into_bytes()
}

/// A chunked POST whose body is `body` (the chunked bytes).
fn chunked(body: &[u8]) -> Vec<u8> {
    let mut req = post("Transfer-Encoding: chunked\r\n", "");
    req.extend_from_slice(body);
    req
}

/// A request a pipelined stream ends with: what must never be taken out
/// of another request's body.
const SMUGGLED: &str = "GET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n";

/// Known-tricky request streams.
fn request_corpus() -> Vec<Vec<u8>> {
    let mut corpus: Vec<Vec<u8>> = Vec::new();
    let mut add = |bytes: &[u8]| corpus.push(bytes.to_vec());

    // tests/adversarial.rs: CL.TE and TE.CL, then the smuggled request.
    let chunked_then_request = format!("0\r\n\r\n{SMUGGLED}");
    for framing in [
        "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
        "Transfer-Encoding: chunked\r\nContent-Length: 60\r\n",
        "Transfer-Encoding:\tchunked\r\nContent-Length: 3\r\n",
    ] {
        add(&post(framing, &chunked_then_request));
    }
    // tests/adversarial.rs: duplicate and malformed lengths, obfuscated
    // codings, obs-fold, bare CR.
    for (framing, body) in [
        ("Content-Length: 5\r\nContent-Length: 6\r\n", "hello!"),
        ("Content-Length: 5, 6\r\n", "hello!"),
        ("Content-Length: +5\r\n", "hello"),
        ("Content-Length: -1\r\n", "hello"),
        ("Content-Length: 0x5\r\n", "hello"),
        ("Content-Length: 5 5\r\n", "hello"),
        ("Content-Length: 99999999999999999999999\r\n", "hello"),
        ("Transfer-Encoding: xchunked\r\n", "5\r\nhello\r\n0\r\n\r\n"),
        (
            "Transfer-Encoding: chunked, identity\r\n",
            "5\r\nhello\r\n0\r\n\r\n",
        ),
        ("Transfer-Encoding : chunked\r\n", "5\r\nhello\r\n0\r\n\r\n"),
        ("X-Folded: a\r\n Transfer-Encoding: chunked\r\n", ""),
        ("Content-Length: 0\r\nX-Folded: a\r\n\tb\r\n", ""),
        ("X-A: a\rContent-Length: 99\r\n", ""),
    ] {
        add(&post(framing, body));
    }
    // tests/adversarial.rs: bare LF hiding a request, and in a chunk line.
    add(b"GET /p HTTP/1.1\r\nHost: a\r\nX-A: a\nGET /public/ping HTTP/1.1\r\nConnection: close\r\n\r\n");
    add(&chunked(b"5;x\nhello\r\n0\r\n\r\n"));
    // tests/adversarial.rs: the request line's bytes, the target's form,
    // and Host.
    for target in [
        &b"/api\\v1\\clusters?organization_id=acme"[..],
        b"/api/v1/clusters\x00?organization_id=acme",
        b"/api/v1/clusters\x7f?organization_id=acme",
        b"/api/v1/clust\xc3\xa9rs?organization_id=acme",
        b"/api/v1/\xc0\xae\xc0\xae/clusters?organization_id=acme",
        b"/api/v1/clusters?organization_id=acme\x01",
        b"/api/v1/clusters\x0b?organization_id=acme",
        b"http://127.0.0.1/p",
        b"https://good.example/p",
        b"*",
    ] {
        let mut req = b"GET ".to_vec();
        req.extend_from_slice(target);
        req.extend_from_slice(b" HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
        add(&req);
    }
    add(
        b"CONNECT good.example:443 HTTP/1.1\r\nHost: good.example:443\r\nConnection: close\r\n\r\n",
    );
    add(b"OPTIONS * HTTP/1.1\r\nHost: good.example\r\n\r\n");
    add(b"GET /p HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n");
    add(b"GET /p HTTP/1.1\r\nHost: user@evil.example\r\n\r\n");
    // tests/adversarial.rs: large and many fields.
    add(format!(
        "GET /p HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\n\r\n",
        "a".repeat(20_000)
    )
    .as_bytes());
    add(format!(
        "GET /p HTTP/1.1\r\nHost: a\r\nX-{}: v\r\n\r\n",
        "n".repeat(20_000)
    )
    .as_bytes());
    let many: String = (0..150).map(|i| format!("X-H{i}: v\r\n")).collect();
    add(format!("GET /p HTTP/1.1\r\nHost: a\r\n{many}\r\n").as_bytes());
    let ninety_nine: String = (0..99).map(|i| format!("X-H{i}: v\r\n")).collect();
    add(format!("GET /p HTTP/1.1\r\nHost: a\r\n{ninety_nine}\r\n").as_bytes());
    // tests/adversarial.rs: odd whitespace and control bytes in a value.
    add(b"GET /p HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer  x\r\nAuthorization: Bearer\tx\r\n\r\n");
    add(b"GET /p HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer x\x0b\r\n\r\n");
    add(b"GET /p HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer\x0cx\r\n\r\n");
    add(b"GET /p HTTP/1.1\r\nHost: a\r\nAuthorization:   Bearer x \r\n\r\n");
    add(b"GET /p HTTP/1.1\r\nHost: a\r\nConnection: X-Mpg-User-Id, authorization\r\nConnection: x-forwarded-for, content-length\r\nX-Keep: yes\r\n\r\n");

    // tests/http1.rs: keep-alive, pipelining, close, HTTP/1.0.
    add(b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\nGET /3 HTTP/1.1\r\nHost: a\r\n\r\n");
    add(b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\nPOST /2 HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: 20\r\n\r\n{\"name\":\"pipelined\"}GET /3 HTTP/1.1\r\nHost: a\r\n\r\n");
    add(b"GET /1 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n");
    add(b"GET /public/ping?v=10 HTTP/1.0\r\n\r\nGET /2 HTTP/1.0\r\n\r\n");
    add(b"GET /1 HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\nGET /2 HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\n");
    add(b"GET /1 HTTP/1.0\r\nConnection: close\r\nConnection: keep-alive\r\n\r\nGET /2 HTTP/1.0\r\n\r\n");
    add(b"POST /p HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n");
    // tests/http1.rs: bodies.
    let mut framing_like = post(
        "Content-Type: application/octet-stream\r\nContent-Length: 52\r\n",
        "",
    );
    framing_like
        .extend_from_slice(b"{\"a\":1}\r\n\r\n0\r\n\r\nGET /public/ping HTTP/1.1\r\n\r\n\x00\xff");
    framing_like.extend_from_slice(SMUGGLED.as_bytes());
    add(&framing_like);
    add(&chunked(b"4;ext=1\r\nWiki\r\n5\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\na\r\n0123456789\r\n0\r\n\r\nGET /after HTTP/1.1\r\nHost: a\r\n\r\n"));
    add(b"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\nhello");
    add(b"POST /p HTTP/1.0\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\nhello");
    add(b"HEAD /public/ping?h=1 HTTP/1.1\r\nHost: a\r\n\r\nGET /public/ping?h=2 HTTP/1.1\r\nHost: a\r\n\r\n");
    for bad in ["zz\r\nabc\r\n", "ffffffffffffffffffff\r\n", "3\r\nabcXY"] {
        add(&chunked(bad.as_bytes()));
    }
    add(&post("Content-Length: 1000\r\n", "{\"name\":"));
    // tests/http1.rs: malformed request lines.
    for line in [
        "GARBAGE\r\n\r\n",
        "GET /public/ping HTTP/9.9\r\nHost: a\r\n\r\n",
        "GET /public/ping HTTP/1.1 extra\r\nHost: a\r\n\r\n",
        "GET  /public/ping HTTP/1.1\r\nHost: a\r\n\r\n",
        "G(T /public/ping HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET /public/ping FTP/1.1\r\nHost: a\r\n\r\n",
    ] {
        add(line.as_bytes());
    }
    // tests/http1.rs: a size line with no hex digit; list-form lengths.
    add(&chunked(
        format!("1\r\nA\r\n\r\n2\r\nBB\r\n0\r\n\r\n{SMUGGLED}").as_bytes(),
    ));
    for framing in [
        "Content-Length: 5, 5\r\n",
        "Content-Length: 5,5\r\n",
        "Content-Length: 70000, 70000\r\n",
        "Content-Length: 5\r\nContent-Length: 5\r\n",
    ] {
        add(&post(framing, &format!("hello{SMUGGLED}")));
    }

    // smuggler.py (configs/exhaustive.py): `Transfer-Encoding` gadgets
    // beside a Content-Length that frames only the last chunk.
    let mut gadgets: Vec<Vec<u8>> = [
        " Transfer-Encoding: chunked",
        "Transfer-Encoding:\tchunked",
        "Transfer-Encoding\t:\tchunked",
        "Transfer Encoding: chunked",
        "Transfer_Encoding: chunked",
        "Transfer Encoding:chunked",
        "Transfer-Encoding : chunked",
        "Transfer-Encoding:  chunked",
        "Transfer-Encoding:\u{b}chunked",
        "Transfer-Encoding: chunked, cow",
        "Transfer-Encoding: cow, chunked",
        "Content-Encoding: chunked",
        "Transfer-Encoding:\n chunked",
        "Transfer-Encoding: \"chunked\"",
        "Transfer-Encoding: 'chunked'",
        "Transfer-Encoding: chunk",
        "TrAnSFer-EnCODinG: cHuNkeD",
        "TRANSFER-ENCODING: CHUNKED",
        "Transfer-Encoding: chunked\r",
        "Transfer-Encoding: chunked\t",
        "Transfer-Encoding: cow\r\nTransfer-Encoding: chunked",
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: cow",
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked",
        "Transfer\r-Encoding: chunked",
        "Transfer-Encoding: cow chunked bar",
        "X:X\rTransfer-Encoding: chunked",
        "X:X\nTransfer-Encoding: chunked",
        "Transfer-Encoding: ,chunked",
        "Transfer-Encoding: chunked,",
        "Transfer-Encoding: identity, chunked",
    ]
    .iter()
    .map(|g| g.as_bytes().to_vec())
    .collect();
    for b in [0xff_u8, 0x96, 0x82] {
        gadgets.push([&b"Transfer-Encoding:"[..], &[b], b"chunked"].concat());
    }
    for b in (0x01..0x20).chain(0x7f..=0xff) {
        gadgets.push([&b"Transfer-Encoding:"[..], &[b], b"chunked"].concat());
        gadgets.push([&b"Transfer-Encoding"[..], &[b], b": chunked"].concat());
        gadgets.push([&[b][..], b"Transfer-Encoding: chunked"].concat());
        gadgets.push([&b"Transfer-Encoding: chunked"[..], &[b]].concat());
    }
    for gadget in gadgets {
        let mut req = b"POST /p HTTP/1.1\r\n".to_vec();
        req.extend_from_slice(&gadget);
        req.extend_from_slice(b"\r\nHost: a\r\nContent-Length: 5\r\n\r\n0\r\n\r\n");
        req.extend_from_slice(SMUGGLED.as_bytes());
        add(&req);
    }

    // The HTTP Garden's payloads (TROPHIES.md).
    for payload in [
        &b"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0_2e\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n0\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nHost: a\r\nHeader: v\x00\ralue\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: whatever\r\nContent-Length : 34\r\n\r\nGET / HTTP/1.1\r\nHost: whatever\r\n\r\n",
        b"GET / HTTP/1.1\r\n\tContent-Length: 1\r\n\r\nX",
        b"GET /test HTTP/1.32\r\n\r\n",
        b"G=\":<>(e),[T];?\" /get HTTP/1.1\r\n\r\n",
        b"GET ! HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\r\n\xefoo: bar\r\n\r\n",
        b"GET /\nHTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: +1_0\r\n\r\n0123456789",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nZ\r\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: whatever\r\nTransfer-Encoding: \xa0chunked\xa0\r\n\r\n0\r\n\r\n",
        b"GET / HTTP/1.1\r\nVisible: :/\rSmuggled: :)\r\n\r\n",
        b"GET / HTTP/1.1\r\n\x00\x01\x02\x03\x04\x05\x06\x07\x08\t\x0b\x0c\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f \"(),/;<=>?@[/]{}: whatever\r\n\r\n",
        b"GET / HTTP/\r\r1.1\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: whatever\r\nContent-Length: \r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: whatever\r\nTransfer-Encoding: chunked\r\n\r\n\r\n\r\n",
        b"GET / HTTP/1.1\r\n: ignored\r\nHost: whatever\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nUseless:\n\nGET / HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length\x85: 10\r\n\r\n0123456789",
        b"GET / HTTP/1.1\r\nHost: whatever\r\nTransfer-Encoding: ,chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 0\r\n\r\nZ",
        b"GET / HTTP/4294967295.255\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: -48\r\n\r\n",
        b"GET / HTTP/1.1\r\n:\r\nI: am chopped off\r\n\r\n",
        b"GET / HTTP/1.1\r\nContent-Length 10\r\n\r\n0123456789",
        b"GET / HTTP/1.1\r\nContent-Length: 1Z\r\n\r\nZ",
        b"GET / HTTP/1.1\r\nHost: a\r\n\r\n\rZGET /evil: HTTP/1.1\r\nHost: a\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\r;ABCD\r\n34\r\nE\r\n0\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: whatever\r\nContent-Length: 010\r\n\r\n01234567",
        b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nContent-Length: 1\r\n\r\nZ",
        b"GET / HTTP/1.1\r\nHost: whatever\r\nHeader: va\rlue\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: whatever\r\nTest: test\x00THESE BYTES GET DROPPED\r\nConnection: close\r\n\r\n",
        b"POST /abc HTTP/1.1\r\nTransfer-Encoding: chunked\r\nHost: h\r\n\r\n41;a=b\r\rXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX\r\n0\r\n\r\nGET /bad_path/pwned HTTP/1.1\r\nHost: a\r\nContent-Length: 412\r\n\r\n0\r\n\r\nGET /def HTTP/1.1\r\nHost: h\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: whatever\r\nTransfer-\r\nEncoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: localhost\r\nContent-Length: \r\n\r\nGET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
        b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX:POST / HTTP/1.1\r\n\r\n",
        b"\x00 / HTTP/............0596.7407.\r\n\r\n",
        b"GET /login HTTP/1.1\r\nHost: a\r\nUser: \x85admin\xa0\r\n\r\n",
    ] {
        add(payload);
    }

    // hyper's chunk-size cases (src/proto/h1/decode.rs), as bodies.
    for (line, size) in [
        ("1", 1),
        ("01", 1),
        ("A", 10),
        ("a", 10),
        ("Ff", 255),
        ("Ff   ", 255),
        ("1;extension", 1),
        ("a;ext name=value", 10),
        ("1;extension;extension2", 1),
        ("1;;;  ;", 1),
        ("2; extension...", 2),
        ("3   ; extension=123", 3),
        ("3   ;", 3),
        ("3   ;   ", 3),
    ] {
        let mut body = format!("{line}\r\n").into_bytes();
        body.extend(std::iter::repeat_n(b'x', size));
        body.extend_from_slice(b"\r\n0\r\n\r\n");
        add(&chunked(&body));
    }
    for bad in [
        "F\rF",
        "F",
        "\r\n\r\n",
        "\r\n",
        "X\r\n",
        "1X\r\n",
        "-\r\n",
        "-1\r\n",
        "1 invalid extension\r\n",
        "1 A\r\n",
        "1;no CRLF",
        "1;reject\nnewlines\r\n",
    ] {
        add(&chunked(format!("{bad}x\r\n0\r\n\r\n").as_bytes()));
    }
    // Chunked framing: zero sizes, trailers, overflow, NUL, lengths at
    // the bounds.
    for body in [
        &b"0\r\n\r\n"[..],
        b"000\r\n\r\n",
        b"0;ext\r\n\r\n",
        b"0\r\nX-T: 1\r\nY-T: 2\r\n\r\n",
        b"0\r\nX-T: 1\r\n",
        b"0\r\nbad trailer\r\n\r\n",
        b"0\r\nX-T: a\x00b\r\n\r\n",
        b"0\r\nX-T: a\nY: b\r\n\r\n",
        b"0\r\n X-T: folded\r\n\r\n",
        b"0\r\n\n",
        b"0\r\n\r",
        b"1\r\nA\r\n0\r\n\r\n",
        b"1\r\nA\n0\r\n\r\n",
        b"1\r\nAB\r\n0\r\n\r\n",
        b"1;a=\x00\r\nA\r\n0\r\n\r\n",
        b"ffffffffffffffff\r\n",
        b"10000000000000000\r\n",
        b"0000000000000000000000001\r\nA\r\n0\r\n\r\n",
        b"0x1\r\nA\r\n0\r\n\r\n",
        b"+1\r\nA\r\n0\r\n\r\n",
        b" 1\r\nA\r\n0\r\n\r\n",
        b"1\x00\r\nA\r\n0\r\n\r\n",
    ] {
        add(&chunked(body));
    }
    let ext = |len: usize| format!("1;{}\r\nA\r\n", "e".repeat(len));
    add(&chunked(
        format!("{}0\r\n\r\n", ext(4000).repeat(4)).as_bytes(),
    ));
    add(&chunked(
        format!("{}0\r\n\r\n", ext(4000).repeat(5)).as_bytes(),
    ));
    let trailers = |n: usize| -> String { (0..n).map(|i| format!("X-{i}: v\r\n")).collect() };
    add(&chunked(format!("0\r\n{}\r\n", trailers(100)).as_bytes()));
    add(&chunked(format!("0\r\n{}\r\n", trailers(101)).as_bytes()));
    // Lengths: leading zeros, the largest, past it; a body cut short.
    for framing in [
        "Content-Length: 0005\r\n",
        "Content-Length: 18446744073709551613\r\n",
        "Content-Length: 18446744073709551614\r\n",
        "Content-Length: 18446744073709551616\r\n",
        "Content-Length: 5\r\nTransfer-Encoding: chunked\r\nContent-Length: 6\r\n",
        "Content-Length: 10\r\n",
    ] {
        add(&post(framing, "hello"));
    }
    // Whitespace and line ends around the request line and fields.
    for req in [
        &b"\r\nGET /p HTTP/1.1\r\nHost: a\r\n\r\n"[..],
        b"\nGET /p HTTP/1.1\nHost: a\n\n",
        b"GET /p HTTP/1.1\r\nHost: a\n\r\n",
        b"GET /p HTTP/1.1\r\nHost:a\r\n\r\n",
        b"GET /p HTTP/1.1\r\nHost: a \t \r\n\r\n",
        b"GET\t/p HTTP/1.1\r\nHost: a\r\n\r\n",
        b"GET /p\tHTTP/1.1\r\nHost: a\r\n\r\n",
        b"GET /p HTTP/1.1\r\nHost: a\r\n\r\n\r\n",
        b"GET /p HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\n\r\n",
        b"GET /p HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
        b"GET /p HTTP/1.1\r\nHost: a\r\nConnection: close, \x80\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n",
        b"GET /p HTTP/1.1\r\nHost: a\r\nContent-Type: text/\x80plain\r\n\r\n",
        b"GET /p HTTP/1.1\r\nHost: a\r\nX: \x7f\r\n\r\n",
        b"GET /p HTTP/1.1\r\n",
        b"GET /p HTT",
        b"",
    ] {
        add(req);
    }
    corpus
}

/// Known-tricky upstream answers (to a GET unless said).
fn response_corpus() -> Vec<(Vec<u8>, bool)> {
    let mut corpus: Vec<(Vec<u8>, bool)> = Vec::new();
    let mut add = |bytes: &[u8], head: bool| corpus.push((bytes.to_vec(), head));
    // tests/http1.rs: bodiless answers, chunked, sized, cut short, until
    // the close; the chunk-size line without a hex digit.
    for head in [false, true] {
        add(
            b"HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\nContent-Length: 5\r\n\r\n",
            head,
        );
        add(b"HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\n\r\n", head);
        add(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            head,
        );
        add(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", head);
    }
    add(
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial",
        false,
    );
    add(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n6;note=first\r\nhello \r\n7\r\nchunked\r\n1B\r\n world, in three pieces!!\r\n\r\n0\r\n\r\n", false);
    add(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nuntil the close",
        false,
    );
    add(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nA\r\n\r\n2\r\nBB\r\n0\r\n\r\n", false);
    // src/proxy/client/response.rs's framing cases.
    for raw in [
        &b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"[..],
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 3\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nraw bytes",
        b"HTTP/1.1 200 OK\r\n\r\nto the end",
        b"HTTP/1.1 204 No Content\r\nContent-Length: 7\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
        b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5x\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nContent-Length: 0005\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551614\r\n\r\nhello",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 201 Created\r\nX-A: b\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: y\r\n",
        b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.0 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n\r\nraw",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: \xe9, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nConnection: x-hop, close\r\nX-Hop: gone\r\nX-Kept: yes\r\nKeep-Alive: timeout=5\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nX-Folded: a\r\n b\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nX-Space : a\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok",
        b"HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 \r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 \x80\xff\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 099 Low\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 999 High\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 20 Short\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/2 200 OK\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nbad trailer\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 100\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA",
    ] {
        add(raw, false);
    }
    for raw in [
        &b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"[..],
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5x\r\n\r\n",
    ] {
        add(raw, true);
    }
    corpus
}

// === The deliberate differences ===

/// A request stream on which our server differs from hyper's on purpose.
struct ServerException {
    what: &'static str,
    /// Why, with the RFC where one says.
    why: &'static str,
    input: Vec<u8>,
    /// How the two differ: true when they differ as intended.
    differ: fn(ours: &Served, hyper: &Served) -> bool,
}

/// An upstream answer on which our client differs from hyper's on purpose.
struct ClientException {
    what: &'static str,
    why: &'static str,
    answer: Vec<u8>,
    differ: fn(ours: &Option<Answer>, hyper: &Option<Answer>) -> bool,
}

/// Whether `seen` is one request whose body failed.
fn body_refused(seen: &[Seen]) -> bool {
    matches!(seen, [Seen { body: None, .. }])
}

/// Whether `seen` is one request whose body was read whole.
fn body_read(seen: &[Seen]) -> bool {
    matches!(seen, [Seen { body: Some(_), .. }])
}

fn server_exceptions() -> Vec<ServerException> {
    let long_line = format!("1;{}\r\nA\r\n0\r\n\r\n", "e".repeat(5000));
    vec![
        ServerException {
            what: "a bare LF in the trailer section ends the body with an error",
            why: "RFC 9112 §7.1.2 makes trailer fields field lines ending in CRLF; hyper takes \
                  a bare LF there as a byte of the line, so what follows it (up to a CRLF) \
                  is swallowed as part of a trailer. Two readers that split lines \
                  differently must not share a connection's framing, so ours refuses a \
                  bare LF anywhere in chunked framing, as hyper does in size lines.",
            input: chunked(b"1\r\nA\r\n0\r\nX-T: t\n\r\nGET /x HTTP/1.1\r\n\r\n"),
            // hyper reads the body, and the request after it as a trailer.
            differ: |ours, hyper| body_refused(&ours.requests) && body_read(&hyper.requests),
        },
        ServerException {
            what: "a chunk-size line longer than 4 KiB is refused",
            why: "The decoder buffers a size line whole before reading it; 4 KiB bounds that \
                  buffer. hyper reads size lines byte by byte and bounds only the extension \
                  bytes of a whole body (16 KiB), which ours bounds the same way.",
            input: chunked(long_line.as_bytes()),
            differ: |ours, hyper| body_refused(&ours.requests) && body_read(&hyper.requests),
        },
        ServerException {
            what: "a connection opening with the HTTP/2 preface is HTTP/2",
            why: "The gateway serves HTTP/2 with prior knowledge on its HTTP/1.1 port \
                  (RFC 9113 §3.3); hyper's HTTP/1 server alone ends the connection.",
            input: b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec(),
            differ: |ours, hyper| ours.h2 && !hyper.h2 && hyper.requests.is_empty(),
        },
    ]
}

fn client_exceptions() -> Vec<ClientException> {
    let fields: String = (0..110).map(|i| format!("X-F{i}: v\r\n")).collect();
    vec![
        ClientException {
            what: "a bare LF in the trailer section fails the body",
            why: "As for requests: RFC 9112 §7.1.2; hyper reads past it.",
            answer:
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nA\r\n0\r\n\n0\r\n\r\n"
                    .to_vec(),
            differ: |ours, hyper| ours.is_none() && hyper.is_some(),
        },
        ClientException {
            what: "101 Switching Protocols is refused",
            why: "The gateway does not tunnel upgrades: a 101 to a request that asked for \
                  none is an invalid answer (RFC 9110 §15.2.2), a 502.",
            answer:
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n"
                    .to_vec(),
            differ: |ours, hyper| ours.is_none() && hyper.as_ref().is_some_and(|a| a.status == 101),
        },
        ClientException {
            what: "up to 128 response header fields are taken",
            why: "hyper's client takes 100; ours 128 (what the relayed-field bitmap holds). \
                  A target is configured, and a longer head is still bounded (256 KiB).",
            answer: format!("HTTP/1.1 200 OK\r\n{fields}Content-Length: 2\r\n\r\nok").into_bytes(),
            differ: |ours, hyper| ours.is_some() && hyper.is_none(),
        },
    ]
}

#[test]
fn each_deliberate_difference_from_hyper_is_as_explained() {
    let rt = runtime();
    for e in server_exceptions() {
        let (ours, hyper) = rt.block_on(async { (ours(&e.input).await, hypers(&e.input).await) });
        assert!(
            (e.differ)(&ours, &hyper),
            "{}: {}\n  ours:  {ours:?}\n  hyper: {hyper:?}",
            e.what,
            e.why
        );
    }
    for e in client_exceptions() {
        let (ours, hyper) = rt.block_on(async {
            (
                our_answer(&e.answer, false).await,
                hyper_answer(&e.answer, false).await,
            )
        });
        assert!(
            (e.differ)(&ours, &hyper),
            "{}: {}\n  ours:  {ours:?}\n  hyper: {hyper:?}",
            e.what,
            e.why
        );
    }
}

/// Whether a bare LF may fall in a chunked body's trailer section (after
/// a line starting `0`, before the next CRLF CRLF): the first exceptions.
fn bare_lf_in_a_trailer_section(input: &[u8]) -> bool {
    (1..input.len()).any(|i| {
        input[i] == b'\n' && input[i - 1] != b'\r' && {
            let before = &input[..i];
            let last_chunk = before.windows(2).rposition(|w| w == b"\n0" || w == b"\r0");
            let section_end = before.windows(4).rposition(|w| w == b"\r\n\r\n");
            last_chunk.is_some_and(|at| section_end.is_none_or(|end| end < at))
        }
    })
}

/// Whether `ours` differs from `hyper` on `input` only as the first
/// server exception does: the same requests up to the last of ours, whose
/// body ours refused and hyper read, with a bare LF after a last chunk.
fn refused_a_bare_lf_trailer(input: &[u8], ours: &Served, hyper: &Served) -> bool {
    let Some((last, before)) = ours.requests.split_last() else {
        return false;
    };
    let k = before.len();
    bare_lf_in_a_trailer_section(input)
        && last.body.is_none()
        && hyper.requests.get(..k) == Some(before)
        && hyper.requests.get(k).is_some_and(|h| {
            h.body.is_some()
                && Seen {
                    body: None,
                    ..h.clone()
                } == *last
        })
}

#[test]
fn the_corpus_of_requests_is_read_as_hyper_reads_it() {
    let rt = runtime();
    let (mut failures, mut served, mut bodies, mut refusals) = (Vec::new(), 0, 0, 0);
    for input in &request_corpus() {
        if let Err(e) = rt.block_on(servers_agree(input, false)) {
            failures.push(e);
            continue;
        }
        let ours = rt.block_on(ours(input));
        served += ours.requests.len();
        bodies += ours
            .requests
            .iter()
            .filter(|r| r.body.as_ref().is_some_and(|b| !b.is_empty()))
            .count();
        refusals += usize::from(ours.refused);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    eprintln!("{served} requests served ({bodies} with a body), {refusals} streams refused");
    // The corpus reaches both sides of every decision.
    assert!(
        served > 100 && bodies > 20 && refusals > 500,
        "{served} {bodies} {refusals}"
    );
}

#[test]
fn the_corpus_of_upstream_answers_is_read_as_hyper_reads_it() {
    let rt = runtime();
    let failures: Vec<String> = response_corpus()
        .iter()
        .filter_map(|(answer, head)| rt.block_on(clients_agree(answer, *head, false)).err())
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// === Generated streams ===

/// Request lines, mostly valid.
const REQUEST_LINES: &[&str] = &[
    "GET / HTTP/1.1",
    "GET /a?b=1 HTTP/1.1",
    "POST /p HTTP/1.1",
    "POST /p HTTP/1.1",
    "PUT /p HTTP/1.1",
    "PATCH /p HTTP/1.1",
    "HEAD / HTTP/1.1",
    "DELETE /p HTTP/1.1",
    "OPTIONS * HTTP/1.1",
    "POST /p HTTP/1.0",
    "GET / HTTP/1.0",
    "GET http://x.example/y HTTP/1.1",
    "get / HTTP/1.1",
    "G(T / HTTP/1.1",
    "GET /a b HTTP/1.1",
    "GET / HTTP/1.2",
    "GET / HTTP/2.0",
    "GET / http/1.1",
    "GET /%zz HTTP/1.1",
    "GET  / HTTP/1.1",
    "GET / HTTP/1.1 ",
];

/// Header lines (without their line end).
const FIELDS: &[&str] = &[
    "Host: x",
    "Host: x",
    "Accept: */*",
    "Content-Length: 0",
    "Content-Length: 5",
    "Content-Length: 5",
    "Content-Length: 05",
    "Content-Length:5",
    "Content-Length:   5   ",
    "Content-Length: 5, 5",
    "Content-Length: 5,5",
    "Content-Length: 5, 6",
    "Content-Length: +5",
    "Content-Length: -5",
    "Content-Length: 0x5",
    "Content-Length: 5 5",
    "Content-Length: ",
    "Content-Length: 4",
    "Content-Length: 6",
    "Content-Length: 99999999999999999999",
    "Content-Length : 5",
    "Transfer-Encoding: chunked",
    "Transfer-Encoding: chunked",
    "Transfer-Encoding: Chunked",
    "Transfer-Encoding: gzip, chunked",
    "Transfer-Encoding: chunked, gzip",
    "Transfer-Encoding: xchunked",
    "Transfer-Encoding: chunked ",
    "Transfer-Encoding:\tchunked",
    "Transfer-Encoding: identity",
    "Transfer-Encoding: ",
    "Transfer-Encoding: ,chunked",
    "Transfer-Encoding : chunked",
    " Transfer-Encoding: chunked",
    "Transfer_Encoding: chunked",
    "Connection: close",
    "Connection: keep-alive",
    "Connection: Keep-Alive, x-a",
    "Connection: te, close",
    "Expect: 100-continue",
    "Upgrade: websocket",
    "X-A: a\x00b",
    "X-A: \u{80}",
    "X-A:",
    ": empty",
    "X-A b",
    "\tX-Fold: b",
    "X-A: a\rb",
];

/// Line ends, mostly CRLF.
const LINE_ENDS: &[&str] = &[
    "\r\n", "\r\n", "\r\n", "\r\n", "\r\n", "\r\n", "\n", "\r", "",
];

/// How a chunk's size line is written, for a chunk of `n` bytes.
const SIZES: &[&str] = &[
    "{x}",
    "{x}",
    "{x}",
    "{X}",
    "0{x}",
    "{x};e",
    "{x}; a=b",
    "{x} ",
    "{x}\t;e",
    "{x};e\x00",
    "",
    "{y}",
    "0x{x}",
    "+{x}",
    " {x}",
    "{x} {x}",
    "{x}z",
];

/// What follows a chunk's data.
const CHUNK_ENDS: &[&str] = &["\r\n", "\r\n", "\r\n", "\r\n", "\n", "", "XY"];

/// The last chunk and what follows it.
const LAST_CHUNKS: &[&str] = &[
    "0\r\n\r\n",
    "0\r\n\r\n",
    "0\r\n\r\n",
    "00\r\n\r\n",
    "0;e\r\n\r\n",
    "0\r\nX-T: t\r\n\r\n",
    "0\r\nX-T t\r\n\r\n",
    "0\r\nX-T: t\n\r\n",
    "0\r\n\n",
    "0\r\n",
    "\r\n",
    "",
];

/// A body of `n` bytes.
fn data(n: usize) -> Vec<u8> {
    (0..n).map(|i| b"abcdefgh\r\n0;"[i % 12]).collect()
}

/// A chunk of `n` bytes, its size written as `size` says and ended with
/// `end`.
fn chunk(n: usize, size: &str, end: &str) -> Vec<u8> {
    let mut out = size
        .replace("{x}", &format!("{n:x}"))
        .replace("{X}", &format!("{n:X}"))
        .replace("{y}", &format!("{:x}", n + 1))
        .into_bytes();
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&data(n));
    out.extend_from_slice(end.as_bytes());
    out
}

/// One request: a request line, fields, and a body (raw or chunked).
fn request() -> impl Strategy<Value = Vec<u8>> {
    let fields = prop::collection::vec(
        (
            prop::sample::select(FIELDS),
            prop::sample::select(LINE_ENDS),
        ),
        0..6,
    );
    let chunks = prop::collection::vec(
        (
            0usize..20,
            prop::sample::select(SIZES),
            prop::sample::select(CHUNK_ENDS),
        ),
        0..4,
    );
    let body = prop_oneof![
        (0usize..8).prop_map(data),
        (chunks, prop::sample::select(LAST_CHUNKS)).prop_map(|(chunks, last)| {
            let mut body: Vec<u8> = chunks
                .into_iter()
                .flat_map(|(n, size, end)| chunk(n, size, end))
                .collect();
            body.extend_from_slice(last.as_bytes());
            body
        }),
    ];
    (
        prop::sample::select(REQUEST_LINES),
        prop::sample::select(LINE_ENDS),
        fields,
        prop::sample::select(LINE_ENDS),
        body,
    )
        .prop_map(|(line, end, fields, blank, body)| {
            let mut req = format!("{line}{end}").into_bytes();
            for (field, end) in fields {
                req.extend_from_slice(field.as_bytes());
                req.extend_from_slice(end.as_bytes());
            }
            req.extend_from_slice(blank.as_bytes());
            req.extend_from_slice(&body);
            req
        })
}

/// A change to one byte of a stream: replaced, inserted or removed.
#[derive(Debug, Clone)]
enum Mutation {
    None,
    Replace(prop::sample::Index, u8),
    Insert(prop::sample::Index, u8),
    Remove(prop::sample::Index),
    /// The stream ends early.
    Cut(prop::sample::Index),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        6 => Just(Mutation::None),
        1 => (any::<prop::sample::Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::Replace(i, b)),
        1 => (any::<prop::sample::Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        1 => any::<prop::sample::Index>().prop_map(Mutation::Remove),
        1 => any::<prop::sample::Index>().prop_map(Mutation::Cut),
    ]
}

impl Mutation {
    fn apply(&self, mut bytes: Vec<u8>) -> Vec<u8> {
        if bytes.is_empty() {
            return bytes;
        }
        match self {
            Mutation::None => {}
            Mutation::Replace(i, b) => {
                let i = i.index(bytes.len());
                bytes[i] = *b;
            }
            Mutation::Insert(i, b) => bytes.insert(i.index(bytes.len() + 1), *b),
            Mutation::Remove(i) => {
                bytes.remove(i.index(bytes.len()));
            }
            Mutation::Cut(i) => bytes.truncate(i.index(bytes.len())),
        }
        bytes
    }
}

/// One to three requests on a connection, then maybe a mutation.
fn request_stream() -> impl Strategy<Value = Vec<u8>> {
    (prop::collection::vec(request(), 1..4), mutation())
        .prop_map(|(requests, mutation)| mutation.apply(requests.concat()))
}

/// Status lines, mostly valid.
const STATUS_LINES: &[&str] = &[
    "HTTP/1.1 200 OK",
    "HTTP/1.1 200 OK",
    "HTTP/1.1 200 OK",
    "HTTP/1.1 201 Created",
    "HTTP/1.1 404 Not Found",
    "HTTP/1.1 500 Internal Server Error",
    "HTTP/1.0 200 OK",
    "HTTP/1.1 204 No Content",
    "HTTP/1.1 304 Not Modified",
    "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK",
    "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK",
    "HTTP/1.1 200",
    "HTTP/1.1 200 ",
    "HTTP/1.1 999 Odd",
    "HTTP/1.1 20 Short",
    "HTTP/2 200 OK",
    "HTTP/1.1 200 \u{80}",
];

/// Response header lines: the request fields, and the hop-by-hop ones a
/// proxy drops.
const RESPONSE_FIELDS: &[&str] = &[
    "Content-Type: text/plain",
    "Set-Cookie: a=1",
    "Set-Cookie: b=2",
    "Keep-Alive: timeout=5",
    "Connection: x-hop",
    "X-Hop: gone",
    "Trailer: X-T",
    "Proxy-Connection: keep-alive",
];

/// One upstream answer, and whether it answers a HEAD.
fn answer() -> impl Strategy<Value = (Vec<u8>, bool)> {
    let fields = prop::collection::vec(
        (
            prop_oneof![
                prop::sample::select(FIELDS),
                prop::sample::select(RESPONSE_FIELDS)
            ],
            prop::sample::select(LINE_ENDS),
        ),
        0..6,
    );
    let chunks = prop::collection::vec(
        (
            0usize..20,
            prop::sample::select(SIZES),
            prop::sample::select(CHUNK_ENDS),
        ),
        0..4,
    );
    let body = prop_oneof![
        (0usize..8).prop_map(data),
        (chunks, prop::sample::select(LAST_CHUNKS)).prop_map(|(chunks, last)| {
            let mut body: Vec<u8> = chunks
                .into_iter()
                .flat_map(|(n, size, end)| chunk(n, size, end))
                .collect();
            body.extend_from_slice(last.as_bytes());
            body
        }),
    ];
    (
        prop::sample::select(STATUS_LINES),
        fields,
        prop::sample::select(LINE_ENDS),
        body,
        mutation(),
        prop::bool::weighted(0.15),
    )
        .prop_map(|(line, fields, blank, body, mutation, head)| {
            let mut res = format!("{line}\r\n").into_bytes();
            for (field, end) in fields {
                res.extend_from_slice(field.as_bytes());
                res.extend_from_slice(end.as_bytes());
            }
            res.extend_from_slice(blank.as_bytes());
            res.extend_from_slice(&body);
            (mutation.apply(res), head)
        })
}

/// Generated cases per test: 1000 (two seconds or so in a debug build), or
/// `PROPTEST_CASES` for a longer hunt.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn generated_request_streams_are_read_as_hyper_reads_them(input in request_stream()) {
        let agreed = runtime().block_on(servers_agree(&input, true));
        prop_assert!(agreed.is_ok(), "{}", agreed.unwrap_err());
    }

    #[test]
    fn generated_upstream_answers_are_read_as_hyper_reads_them((answer, head) in answer()) {
        let agreed = runtime().block_on(clients_agree(&answer, head, true));
        prop_assert!(agreed.is_ok(), "{}", agreed.unwrap_err());
    }
}
