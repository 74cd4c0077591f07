//! An adversarial suite: the real binary attacked the way real exploits of
//! proxies did — path confusion, parameter pollution, request smuggling,
//! header tricks, spoofed identity, credential mishandling and HTTP/2 abuse.
//! Each case asserts the exact status and that nothing reached the upstream
//! when nothing should.
mod common;

use common::scale::{metric_sum, metrics};
use common::*;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CLUSTERS: &str = "/api/v1/clusters?organization_id=acme";

fn auth(w: &World) -> String {
    format!("Authorization: Bearer {}\r\n", w.seed.key)
}

/// Sends each `(target, status)` with a valid key; nothing may reach the upstream.
async fn refused_targets(w: &World, cases: &[(&str, u16)]) {
    for (target, want) in cases {
        let res = raw_get(w.gw.addr, target, &auth(w)).await;
        assert_eq!(res.status, *want, "{target}: {}", res.body);
        assert!(res.json()["error"].is_string(), "{target}: {}", res.body);
    }
    assert_eq!(w.up.count(), 0, "a hostile target reached the upstream");
}

#[tokio::test]
async fn path_traversal_and_route_confusion_never_reach_the_upstream() {
    let w = world().await;
    refused_targets(
        &w,
        &[
            // Dot segments, plain and percent-encoded in every case and mix.
            ("/api/v1/../v1/clusters?organization_id=acme", 400),
            ("/api/v1/./clusters?organization_id=acme", 400),
            ("/api/v1/clusters/..?organization_id=acme", 400),
            ("/api/v1/%2e%2e/v1/clusters?organization_id=acme", 400),
            ("/api/v1/%2E%2E/v1/clusters?organization_id=acme", 400),
            ("/api/v1/.%2e/v1/clusters?organization_id=acme", 400),
            ("/api/v1/%2e./v1/clusters?organization_id=acme", 400),
            ("/api/v1/%2e/clusters?organization_id=acme", 400),
            // Encoded slashes and backslashes.
            ("/api%2fv1%2fclusters?organization_id=acme", 400),
            ("/api%2Fv1/clusters?organization_id=acme", 400),
            ("/api/v1%5cclusters?organization_id=acme", 400),
            ("/api/v1%5Cclusters?organization_id=acme", 400),
            ("/api/v1/%252e%252e/clusters?organization_id=acme", 404),
            // Double and trailing slashes.
            ("//api/v1/clusters?organization_id=acme", 400),
            ("/api//v1/clusters?organization_id=acme", 400),
            ("/api/v1/clusters/?organization_id=acme", 400),
            ("/api/v1/clusters//?organization_id=acme", 400),
            // `;` parameters just do not match.
            ("/api/v1/clusters;x=1?organization_id=acme", 404),
            ("/api/v1;/clusters?organization_id=acme", 404),
            ("/api/v1/clusters;/..?organization_id=acme", 400),
            // `..;` and `.;`: Tomcat, Jetty and Spring drop the `;` part, then the dots.
            ("/api/v1/clusters/..;?organization_id=acme", 400),
            ("/api/v1/clusters/.;?organization_id=acme", 400),
            ("/api/v1/clusters/..;x=1?organization_id=acme", 400),
            ("/api/v1/..;/v1/clusters?organization_id=acme", 400),
            ("/api/v1/clusters/..%3B?organization_id=acme", 400),
            (
                "/api/v1/clusters/..%3bjsessionid=1?organization_id=acme",
                400,
            ),
            // Encoded control bytes and NUL.
            ("/api/v1/clusters%00?organization_id=acme", 400),
            ("/api/v1/clusters%0d%0aX-Evil:1?organization_id=acme", 400),
            ("/api/v1/clusters%09?organization_id=acme", 400),
            ("/api/v1/clusters%7f?organization_id=acme", 400),
            // Case changes and encoded unreserved characters are other paths.
            ("/API/v1/clusters?organization_id=acme", 404),
            ("/api/v1/Clusters?organization_id=acme", 404),
            ("/api/v1/clust%65rs?organization_id=acme", 404),
            ("/api/v1/%63lusters?organization_id=acme", 404),
            // Overlong and other non-ASCII UTF-8, encoded.
            ("/api/v1/%c0%ae%c0%ae/clusters?organization_id=acme", 400),
            ("/api/v1/%c0%afclusters?organization_id=acme", 400),
            ("/api/v1/%e0%80%ae/clusters?organization_id=acme", 400),
            ("/api/v1/%ef%bc%8fclusters?organization_id=acme", 400),
            // Malformed escapes.
            ("/api/v1/clusters%?organization_id=acme", 400),
            ("/api/v1/clusters%2?organization_id=acme", 400),
            ("/api/v1/clusters%zz?organization_id=acme", 400),
            // Not origin-form.
            ("*", 400),
            ("clusters?organization_id=acme", 400),
        ],
    )
    .await;
}

#[tokio::test]
async fn raw_control_bytes_backslashes_and_utf8_in_the_request_line_are_refused() {
    let w = world().await;
    let key = auth(&w);
    for target in [
        &b"/api\\v1\\clusters?organization_id=acme"[..],
        b"/api/v1/clusters\x00?organization_id=acme",
        b"/api/v1/clusters\x7f?organization_id=acme",
        b"/api/v1/clust\xc3\xa9rs?organization_id=acme",
        b"/api/v1/\xc0\xae\xc0\xae/clusters?organization_id=acme",
        b"/api/v1/clusters?organization_id=acme\x01",
        b"/api/v1/clusters\x0b?organization_id=acme",
    ] {
        let mut req = b"GET ".to_vec();
        req.extend_from_slice(target);
        req.extend_from_slice(b" HTTP/1.1\r\nHost: a\r\n");
        req.extend_from_slice(key.as_bytes());
        req.extend_from_slice(b"Connection: close\r\n\r\n");
        let res = raw(w.gw.addr, &req).await;
        assert_eq!(res.status, 400, "{}", String::from_utf8_lossy(target));
    }
    assert_eq!(w.up.count(), 0);
}

#[tokio::test]
async fn query_parameter_pollution_is_refused_never_first_wins() {
    let w = world().await;
    for (query, want, field) in [
        (
            "organization_id=acme&organization_id=evil",
            400,
            Some("organization_id"),
        ),
        (
            "organization_id=evil&organization_id=acme",
            400,
            Some("organization_id"),
        ),
        (
            "organization_id=acme&organization%5Fid=evil",
            400,
            Some("organization_id"),
        ),
        (
            "organization_id=acme&%6frganization_id=evil",
            400,
            Some("organization_id"),
        ),
        (
            "organization_id=acme&organization_id",
            400,
            Some("organization_id"),
        ),
        ("organization_id=acme&x=1&x=2", 400, Some("x")),
        // Names an upstream framework reads as the parameter: PHP (`.`, space
        // and `+` as `_`, a trailing `[]`), ASP.NET (any case), Rack 2 and
        // Bottle (`;` a separator).
        (
            "organization_id=acme&organization.id=evil",
            400,
            Some("organization.id"),
        ),
        (
            "organization_id=acme&organization+id=evil",
            400,
            Some("organization id"),
        ),
        (
            "organization_id=acme&organization%20id=evil",
            400,
            Some("organization id"),
        ),
        (
            "organization_id=acme&ORGANIZATION_ID=evil",
            400,
            Some("ORGANIZATION_ID"),
        ),
        (
            "organization_id=acme&organization_id[]=evil",
            400,
            Some("organization_id[]"),
        ),
        (
            "organization_id=acme&x=1;organization_id=evil",
            400,
            Some("organization_id"),
        ),
        (
            "organization.id=evil&organization_id=acme",
            400,
            Some("organization.id"),
        ),
        ("organization_id=", 400, Some("organization_id")),
        // A name that some framework reads as the parameter is refused by name.
        ("Organization_id=acme", 400, Some("Organization_id")),
        ("organization_id=acme%00", 400, None),
        ("organization_id=acme%ff", 400, Some("organization_id")),
        // `;` is a separator to Rack 2 and Bottle.
        (
            "organization_id=acme;organization_id=evil",
            400,
            Some("organization_id"),
        ),
        ("organization_id=ACME", 404, None),
        ("organization_id=acme%20", 404, None),
        ("organization_id=evil", 404, None),
    ] {
        let res = raw_get(w.gw.addr, &format!("/api/v1/clusters?{query}"), &auth(&w)).await;
        assert_eq!(res.status, want, "{query}: {}", res.body);
        let field = field.map_or(serde_json::Value::Null, serde_json::Value::from);
        assert_eq!(
            res.json()["details"]["field"],
            field,
            "{query}: {}",
            res.body
        );
    }
    assert_eq!(w.up.count(), 0);
    // Control: the clean request passes.
    let res = raw_get(w.gw.addr, CLUSTERS, &auth(&w)).await;
    assert_eq!(res.status, 200, "{}", res.body);
}

/// A POST whose framing is ambiguous or malformed; `smuggled` must never be seen.
async fn smuggle(w: &World, framing: &str, body: &str) -> RawResponse {
    let req = format!(
        "POST {CLUSTERS} HTTP/1.1\r\nHost: a\r\n{}{framing}\r\n{body}",
        auth(w)
    );
    raw(w.gw.addr, req.as_bytes()).await
}

#[tokio::test]
async fn request_smuggling_framings_are_refused_or_read_one_way_only() {
    let w = world().await;
    let smuggled = "GET /public/ping?smuggled=1 HTTP/1.1\r\nHost: a\r\n\r\n";
    let chunked_then_request = format!("0\r\n\r\n{smuggled}");
    // CL.TE and TE.CL: both framings on one request. hyper follows RFC 9112
    // §6.1: Transfer-Encoding wins, Content-Length is dropped, and the
    // connection closes after the answer, so what follows the last chunk is
    // never read as a request. The upstream sees one POST with an empty body.
    for framing in [
        "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
        "Transfer-Encoding: chunked\r\nContent-Length: 60\r\n",
        "Transfer-Encoding:\tchunked\r\nContent-Length: 3\r\n",
    ] {
        let before = w.up.count();
        let res = smuggle(&w, framing, &chunked_then_request).await;
        assert_eq!(res.status, 200, "{framing:?}: {}", res.body);
        assert_eq!(w.up.count(), before + 1);
        let seen = w.up.last();
        assert_eq!((seen.method.as_str(), seen.body.len()), ("POST", 0));
        assert!(!seen.headers.contains_key("content-length"));
    }
    let seen = w.up.seen.lock().unwrap().clone();
    assert!(seen.iter().all(|s| !s.uri.contains("smuggled")), "{seen:?}");
    let forwarded = w.up.count();
    for (framing, body, want) in [
        // Duplicate and malformed Content-Length.
        ("Content-Length: 5\r\nContent-Length: 6\r\n", "hello!", 400),
        ("Content-Length: 5, 6\r\n", "hello!", 400),
        ("Content-Length: +5\r\n", "hello", 400),
        ("Content-Length: -1\r\n", "hello", 400),
        ("Content-Length: 0x5\r\n", "hello", 400),
        ("Content-Length: 5 5\r\n", "hello", 400),
        ("Content-Length: 99999999999999999999999\r\n", "hello", 400),
        // Obfuscated Transfer-Encoding.
        (
            "Transfer-Encoding: xchunked\r\n",
            "5\r\nhello\r\n0\r\n\r\n",
            400,
        ),
        (
            "Transfer-Encoding: chunked, identity\r\n",
            "5\r\nhello\r\n0\r\n\r\n",
            400,
        ),
        (
            "Transfer-Encoding : chunked\r\n",
            "5\r\nhello\r\n0\r\n\r\n",
            400,
        ),
        // Obs-fold continues a header onto the next line.
        ("X-Folded: a\r\n Transfer-Encoding: chunked\r\n", "", 400),
        ("Content-Length: 0\r\nX-Folded: a\r\n\tb\r\n", "", 400),
        // Bare CR inside a header line.
        ("X-A: a\rContent-Length: 99\r\n", "", 400),
    ] {
        let res = smuggle(&w, framing, body).await;
        assert_eq!(res.status, want, "{framing:?}: {}", res.body);
    }
    assert_eq!(
        w.up.count(),
        forwarded,
        "a smuggling attempt reached the upstream"
    );
}

#[tokio::test]
async fn bare_lf_line_ends_cannot_hide_a_second_request() {
    let w = world().await;
    // A bare LF ends a header line for hyper (RFC 9112 §2.2 allows it), so the
    // "hidden" request is only a malformed header line: 400, nothing forwarded.
    let req = format!(
        "GET {CLUSTERS} HTTP/1.1\r\nHost: a\r\n{}X-A: a\nGET /public/ping HTTP/1.1\r\nConnection: close\r\n\r\n",
        auth(&w)
    );
    let res = raw(w.gw.addr, req.as_bytes()).await;
    assert_eq!(res.status, 400, "{}", res.body);
    assert_eq!(w.up.count(), 0);
    // A chunk extension ended by a bare LF is a framing error, found while
    // the body streams to the upstream, before any response has begun: 400
    // with the JSON error body, and the connection closed after it, so the
    // request behind the body is never read.
    let req = format!(
        "POST {CLUSTERS} HTTP/1.1\r\nHost: a\r\n{}Transfer-Encoding: chunked\r\n\r\n5;x\nhello\r\n0\r\n\r\nGET /public/ping HTTP/1.1\r\nHost: a\r\n\r\n",
        auth(&w)
    );
    let (res, closed) = raw_exchange(w.gw.addr, req.as_bytes()).await;
    assert_eq!(res.status, 400, "{res:?}");
    assert_eq!(res.json()["error"], "BadRequest", "{res:?}");
    // The body is exactly the one JSON error: no second response follows.
    assert_eq!(
        res.header("content-length"),
        Some(res.body.len().to_string().as_str())
    );
    assert_eq!(res.header("connection"), Some("close"));
    assert!(closed, "the connection was left open after a framing error");
    let seen = w.up.seen.lock().unwrap().clone();
    assert!(seen.iter().all(|s| !s.uri.contains("ping")), "{seen:?}");
}

/// Reads from `s` until a whole response (head and `Content-Length` body)
/// is in, or 5 s pass: the bytes.
async fn read_one_response(s: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let whole = |got: &[u8]| {
        let res = RawResponse::parse(got);
        let length: usize = res
            .header("content-length")
            .and_then(|l| l.parse().ok())
            .unwrap_or(usize::MAX);
        res.status != 0 && res.body.len() >= length
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while !whole(&got) {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    got
}

#[tokio::test]
async fn a_malformed_chunk_after_the_answer_began_ends_the_connection_without_a_second_answer() {
    // A target that answers as soon as it has the head (a 413 half-way
    // through an upload), and counts the request heads it got.
    let target = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target_addr = target.local_addr().unwrap();
    let heads = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = target.accept().await {
            let counted = counted.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let answer = b"HTTP/1.1 413 Payload Too Large\r\ncontent-type: application/json\r\ncontent-length: 22\r\nconnection: close\r\n\r\n{\"error\":\"UpstreamNo\"}";
                let _ = s.write_all(answer).await;
                let _ = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await;
            });
        }
    });
    let w = world_with(|cfg| {
        cfg.set(
            "upstreams.clusters.targets",
            vec![format!("http://{target_addr}")],
        );
    })
    .await;
    let mut s = TcpStream::connect(w.gw.addr).await.unwrap();
    let head = format!(
        "POST {CLUSTERS} HTTP/1.1\r\nHost: a\r\n{}Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
        auth(&w)
    );
    s.write_all(head.as_bytes()).await.unwrap();
    // The target's answer is relayed while the body is still open; the
    // gateway then reads past the rest of the body to keep the connection
    // (docs/http.md, early answers).
    let got = read_one_response(&mut s).await;
    let res = RawResponse::parse(&got);
    assert_eq!(res.status, 413, "{res:?}");
    assert_eq!(res.json()["error"], "UpstreamNo", "{res:?}");
    // The rest of the body is malformed and a request follows it: the
    // answer has been sent, so there is no 400, and the connection ends with
    // not one byte more (no answer to the request behind the body).
    let _ = s
        .write_all(b"5;x\nhello\r\n0\r\n\r\nGET /public/ping HTTP/1.1\r\nHost: a\r\n\r\n")
        .await;
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => rest.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .is_ok();
    assert!(closed, "the connection was left open");
    assert_eq!(String::from_utf8_lossy(&rest), "", "a second answer");
    assert_eq!(heads.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test]
async fn absolute_form_and_host_confusion_are_refused() {
    let w = world().await;
    let key = auth(&w);
    for req in [
        format!("GET http://127.0.0.1{CLUSTERS} HTTP/1.1\r\nHost: 127.0.0.1\r\n{key}Connection: close\r\n\r\n"),
        format!("GET http://evil.example{CLUSTERS} HTTP/1.1\r\nHost: good.example\r\n{key}Connection: close\r\n\r\n"),
        format!("GET https://good.example{CLUSTERS} HTTP/1.1\r\nHost: good.example\r\n{key}Connection: close\r\n\r\n"),
        format!("CONNECT good.example:443 HTTP/1.1\r\nHost: good.example:443\r\n{key}Connection: close\r\n\r\n"),
        format!("OPTIONS * HTTP/1.1\r\nHost: good.example\r\n{key}Connection: close\r\n\r\n"),
        // HTTP/1.1 without Host, or with two of them (RFC 9112 §3.2: 400).
        format!("GET {CLUSTERS} HTTP/1.1\r\n{key}Connection: close\r\n\r\n"),
        format!("GET {CLUSTERS} HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n{key}Connection: close\r\n\r\n"),
        format!("GET {CLUSTERS} HTTP/1.1\r\nHost: a.example, b.example\r\n{key}Connection: close\r\n\r\n"),
        format!("GET {CLUSTERS} HTTP/1.1\r\nHost: evil.example/x?\r\n{key}Connection: close\r\n\r\n"),
        format!("GET {CLUSTERS} HTTP/1.1\r\nHost: user@evil.example\r\n{key}Connection: close\r\n\r\n"),
        // Not `host[:port]`: a second colon, a port that is not digits, an
        // escape, a literal after a name.
        format!("GET {CLUSTERS} HTTP/1.1\r\nHost: good.example:1:2\r\n{key}Connection: close\r\n\r\n"),
        format!("GET {CLUSTERS} HTTP/1.1\r\nHost: good.example:http\r\n{key}Connection: close\r\n\r\n"),
        format!("GET {CLUSTERS} HTTP/1.1\r\nHost: good%2eexample\r\n{key}Connection: close\r\n\r\n"),
        format!("GET {CLUSTERS} HTTP/1.1\r\nHost: good[::1]\r\n{key}Connection: close\r\n\r\n"),
    ] {
        let res = raw(w.gw.addr, req.as_bytes()).await;
        assert_eq!(res.status, 400, "{req:?}: {}", res.body);
    }
    assert_eq!(w.up.count(), 0);
    // A plain Host with a port is fine and is what the upstream is told.
    let res = raw(
        w.gw.addr,
        format!(
            "GET {CLUSTERS} HTTP/1.1\r\nHost: api.example:8443\r\n{key}Connection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.body);
    assert_eq!(w.up.last().headers["x-forwarded-host"], "api.example:8443");
}

#[tokio::test]
async fn oversized_and_numerous_headers_are_refused_before_any_work() {
    let w = world().await;
    let cases = [
        // Past max_header_bytes: the pipeline's 431.
        format!("X-Big: {}\r\n", "a".repeat(20_000)),
        // Past what a connection buffers for a head: the HTTP/1.1 reader's
        // 431, before the head is complete, and the connection closed.
        format!("X-Big: {}\r\n", "a".repeat(200_000)),
        (0..150).map(|i| format!("X-H{i}: v\r\n")).collect(),
        format!("X-{}: v\r\n", "n".repeat(20_000)),
    ];
    for extra in &cases {
        let req = format!(
            "GET {CLUSTERS} HTTP/1.1\r\nHost: a\r\n{}{extra}Connection: close\r\n\r\n",
            auth(&w)
        );
        let (res, closed) = raw_exchange(w.gw.addr, req.as_bytes()).await;
        let what = &extra[..extra.len().min(40)];
        assert_eq!(res.status, 431, "{what}: {res:?}");
        assert_eq!(res.json()["error"], "RequestHeaderFieldsTooLarge", "{what}");
        assert!(closed, "{what}: the connection was left open");
    }
    assert_eq!(w.up.count(), 0);
}

#[tokio::test]
async fn connection_header_tricks_cannot_remove_what_the_gateway_adds() {
    let w = world().await;
    let res = raw_get(
        w.gw.addr,
        CLUSTERS,
        &format!(
            "{}Connection: X-Mpg-User-Id, x-mpg-organization-id, X-MPG-SCOPES, x-forwarded-for, x-request-id, authorization\r\nConnection: X-Mpg-Auth,X-Mpg-Role , x-mpg-key-id,x-forwarded-proto, x-forwarded-host, content-length\r\nX-Keep: yes\r\n",
            auth(&w)
        ),
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.body);
    let seen = w.up.last();
    for (name, value) in [
        ("x-mpg-organization-id", "acme"),
        ("x-mpg-user-id", "alice"),
        ("x-mpg-role", "owner"),
        ("x-mpg-auth", "api_key"),
        ("x-mpg-key-id", w.seed.key_id.as_str()),
        ("x-forwarded-for", "127.0.0.1"),
        ("x-forwarded-proto", "http"),
    ] {
        assert_eq!(seen.headers[name], value, "{name}");
    }
    assert!(seen.headers.contains_key("x-mpg-scopes"));
    assert!(seen.headers.contains_key("x-request-id"));
    assert!(!seen.headers.contains_key("authorization"));
    assert!(!seen.headers.contains_key("connection"));
    assert_eq!(seen.headers["x-keep"], "yes");
}

#[tokio::test]
async fn spoofed_identity_headers_never_reach_the_upstream() {
    let w = world().await;
    let spoofs = "X-Mpg-User-Id: mallory\r\nx-mpg-organization-id: evil\r\nX-MPG-ROLE: owner\r\nX-Mpg-Scopes: *\r\nX-Mpg-Auth: session\r\nX-Mpg-Key-Id: key_evil\r\nX-Mpg-Anything: x\r\nX_Mpg_User_Id: mallory\r\nx_mpg_role: owner\r\nX-Mpg_Scopes: *\r\nX-Forwarded-For: 6.6.6.6\r\nX_Forwarded_For: 6.6.6.6\r\nX-Forwarded-Host: evil.example\r\nX-Forwarded-Proto: https\r\nForwarded: for=6.6.6.6;host=evil.example\r\nX-Real-Ip: 6.6.6.6\r\nX_Real_IP: 6.6.6.6\r\n";
    // On a route with no authentication as well as one with.
    for target in ["/public/ping", CLUSTERS] {
        let res = raw_get(w.gw.addr, target, &format!("{}{spoofs}", auth(&w))).await;
        assert_eq!(res.status, 200, "{target}: {}", res.body);
        let seen = w.up.last();
        for (name, value) in seen.headers.iter() {
            let v = value.to_str().unwrap_or("");
            assert!(
                !v.contains("mallory") && !v.contains("evil") && !v.contains("6.6.6.6") && v != "*",
                "{target}: spoofed {name}: {v}"
            );
            let normalized = name.as_str().replace('_', "-");
            assert!(
                !name.as_str().contains('_')
                    || !(normalized.starts_with("x-mpg-")
                        || normalized.starts_with("x-forwarded-")
                        || normalized == "x-real-ip"),
                "{target}: underscore variant {name} forwarded"
            );
        }
        assert_eq!(seen.headers["x-forwarded-for"], "127.0.0.1");
    }
    assert!(!w.up.last().headers.contains_key("forwarded"));
}

/// Client-sent headers that frameworks route on or take the client's
/// address or user from, in the spellings a client may use (any case, `_`
/// for `-`).
const ROUTING_AND_CLIENT_IP: [(&str, &str); 26] = [
    ("X-Forwarded", "for=6.6.6.6"),
    ("Forwarded-For", "6.6.6.6"),
    ("Fastly-Client-IP", "6.6.6.6"),
    ("X-Original-Forwarded-For", "6.6.6.6"),
    ("X-Envoy-External-Address", "6.6.6.6"),
    ("X-Original-URI", "/admin"),
    ("X-Original-Host", "/admin.example"),
    ("X-Original-Method", "/admin DELETE"),
    ("X-Middleware-Subrequest", "/admin:middleware"),
    ("x_middleware_subrequest", "/admin:middleware"),
    ("X-Remote-User", "/admin-user"),
    ("Remote-User", "/admin-user"),
    ("remote_user", "/admin-user"),
    ("X-Auth-Request-User", "/admin-user"),
    ("X-Original-URL", "/admin"),
    ("x-rewrite-url", "/admin"),
    ("X_Original_Url", "/admin"),
    ("True-Client-IP", "6.6.6.6"),
    ("X-CLIENT-IP", "6.6.6.6"),
    ("Client-Ip", "6.6.6.6"),
    ("client_ip", "6.6.6.6"),
    ("CF-Connecting-IP", "6.6.6.6"),
    ("X-Cluster-Client-IP", "6.6.6.6"),
    ("x_cluster_client_ip", "6.6.6.6"),
    ("X-Real-IP", "6.6.6.6"),
    ("X-REAL-IP", "6.6.6.6"),
];

/// Asserts that none of [`ROUTING_AND_CLIENT_IP`] reached the upstream.
fn assert_no_routing_or_client_ip_header(seen: &Seen, what: &str) {
    for (name, value) in seen.headers.iter() {
        let folded = name.as_str().replace('_', "-");
        assert!(
            !ROUTING_AND_CLIENT_IP
                .iter()
                .any(|(n, _)| n.replace('_', "-").eq_ignore_ascii_case(&folded)),
            "{what}: {name} forwarded"
        );
        let v = value.to_str().unwrap_or("");
        assert!(
            !v.contains("/admin") && !v.contains("6.6.6.6"),
            "{what}: {name}: {v}"
        );
    }
    assert_eq!(seen.headers["x-forwarded-for"], "127.0.0.1", "{what}");
}

#[tokio::test]
async fn routing_and_client_ip_headers_never_reach_the_upstream_over_h1_or_h2() {
    let w = world().await;
    let lines: String = ROUTING_AND_CLIENT_IP
        .iter()
        .map(|(n, v)| format!("{n}: {v}\r\n"))
        .collect();
    let mut h2 = h2c::connect(w.gw.addr).await;
    let addr = w.gw.addr.to_string();
    for target in ["/public/ping", CLUSTERS] {
        let res = raw_get(w.gw.addr, target, &format!("{}{lines}", auth(&w))).await;
        assert_eq!(res.status, 200, "{target}: {}", res.body);
        assert_no_routing_or_client_ip_header(&w.up.last(), &format!("HTTP/1.1 {target}"));
        // HTTP/2 names are lower case on the wire.
        let mut req = h2_get(&w, &addr, target);
        for (name, value) in ROUTING_AND_CLIENT_IP {
            req.headers_mut().append(
                http::HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        let res = h2.send(req).await.unwrap();
        assert_eq!(res.status, 200, "{target}: {res:?}");
        assert_no_routing_or_client_ip_header(&w.up.last(), &format!("HTTP/2 {target}"));
    }
    assert_eq!(w.up.count(), 4);
}

#[tokio::test]
async fn method_override_headers_are_stripped_before_forwarding() {
    let w = world().await;
    let res = raw_get(
        w.gw.addr,
        CLUSTERS,
        &format!(
            "{}X-HTTP-Method-Override: DELETE\r\nX-Method-Override: DELETE\r\nX-HTTP-Method: DELETE\r\nX_HTTP_Method_Override: DELETE\r\n",
            auth(&w)
        ),
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.body);
    let seen = w.up.last();
    assert_eq!(seen.method, "GET");
    for (name, value) in seen.headers.iter() {
        assert_ne!(value, "DELETE", "{name} forwarded");
    }
}

#[tokio::test]
async fn credentials_in_the_query_string_are_refused_and_never_forwarded() {
    let w = world().await;
    let key = w.seed.key.clone();
    let session = w.seed.session.clone();
    let encoded = format!("%6dpg_{}", &key[4..]);
    for (query, field, with_auth) in [
        (
            format!("organization_id=acme&api_key={key}"),
            "api_key",
            true,
        ),
        (
            format!("organization_id=acme&api_key={key}"),
            "api_key",
            false,
        ),
        (
            format!("organization_id=acme&token={session}"),
            "token",
            false,
        ),
        (format!("organization_id=acme&k={encoded}"), "k", false),
        (
            format!("organization_id=acme&auth=Bearer%20{key}"),
            "auth",
            false,
        ),
        (format!("organization_id=acme&{key}"), "query", false),
        (format!("organization_id=acme&{key}=1"), "query", false),
    ] {
        let headers = if with_auth { auth(&w) } else { String::new() };
        let res = raw_get(w.gw.addr, &format!("/api/v1/clusters?{query}"), &headers).await;
        assert_eq!(res.status, 400, "{query}: {}", res.body);
        assert_eq!(res.json()["details"]["field"], field, "{query}");
        assert!(!res.body.contains(&key[4..]) && !res.body.contains(&session[4..]));
    }
    // Even on a route that needs no credential.
    let res = raw_get(w.gw.addr, &format!("/public/ping?api_key={key}"), "").await;
    assert_eq!(res.status, 400, "{}", res.body);
    assert_eq!(w.up.count(), 0);
    // Short prefix-alikes are ordinary values.
    let res = raw_get(w.gw.addr, "/public/ping?name=mpg_prod", "").await;
    assert_eq!(res.status, 200, "{}", res.body);
}

#[tokio::test]
async fn tokens_with_odd_whitespace_or_duplicated_authorization_are_refused() {
    let w = world().await;
    let key = w.seed.key.clone();
    for header in [
        format!("Authorization: Bearer  {key}\r\n"),
        format!("Authorization: Bearer\t{key}\r\n"),
        format!("Authorization: Bearer {key} x\r\n"),
        format!("Authorization: Bearer{key}\r\n"),
        format!("Authorization: Bearer {key}, Bearer {key}\r\n"),
        format!("Authorization: Bearer {key}\r\nAuthorization: Bearer {key}\r\n"),
        format!("Authorization: Bearer {key}\r\nAuthorization: \r\n"),
        format!("Authorization: Basic {key}\r\n"),
        format!("Authorization: Bearer \"{key}\"\r\n"),
        format!("Authorization: Bearer {}\r\n", key.to_uppercase()),
        format!("Authorization: Bearer {}\r\n", &key[..41]),
        format!("Authorization: Bearer {key}0\r\n"),
        "Authorization: Bearer mpg_\r\n".to_string(),
        "Authorization: Bearer \r\n".to_string(),
    ] {
        let res = raw_get(w.gw.addr, CLUSTERS, &header).await;
        assert_eq!(res.status, 401, "{header:?}: {}", res.body);
        assert_eq!(res.json()["details"]["reason"], "malformed", "{header:?}");
    }
    // Vertical tab and form feed are not even legal in a field value: hyper refuses the head.
    for header in [
        format!("Authorization: Bearer {key}\x0b\r\n"),
        format!("Authorization: Bearer\x0c{key}\r\n"),
    ] {
        let res = raw_get(w.gw.addr, CLUSTERS, &header).await;
        assert_eq!(res.status, 400, "{header:?}: {}", res.body);
    }
    let res = raw_get(w.gw.addr, CLUSTERS, "Authorization:\r\n").await;
    assert_eq!(res.status, 401);
    let res = raw_get(w.gw.addr, CLUSTERS, "X-Authorization: Bearer x\r\n").await;
    assert_eq!(res.json()["details"]["reason"], "missing");
    assert_eq!(w.up.count(), 0);
    // Optional whitespace around the field value is not part of it (RFC 9110 §5.5).
    let res = raw_get(
        w.gw.addr,
        CLUSTERS,
        &format!("Authorization:   Bearer {key} \r\n"),
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.body);
}

// === Secret hygiene ===

#[tokio::test]
async fn secrets_never_appear_in_logs_metrics_error_bodies_or_upstream_requests() {
    let mut w = world_with(|cfg| {
        cfg.set("admin.enabled", true);
        cfg.set("admin.listen", "127.0.0.1:0");
    })
    .await;
    let config = w.cfg.dir.path().join("gateway.toml");
    let revoked = cli_ok(
        &config,
        &[
            "keys",
            "create",
            "--org",
            "acme",
            "--user",
            "alice",
            "--name",
            "old",
            "--scopes",
            "clusters:read",
        ],
    );
    let revoked_key = revoked["key"].as_str().unwrap().to_string();
    cli_ok(
        &config,
        &["keys", "revoke", revoked["id"].as_str().unwrap()],
    );
    let key = w.seed.key.clone();
    let session = w.seed.session.clone();
    let bad_checksum = format!(
        "{}{}",
        &key[..41],
        if key.ends_with('0') { '1' } else { '0' }
    );
    let secrets = [
        key.clone(),
        session.clone(),
        revoked_key.clone(),
        bad_checksum.clone(),
    ];

    let mut bodies = Vec::new();
    let keys_list = "/api/v1/api-keys?organization_id=acme";
    for (target, header, status) in [
        (
            CLUSTERS.to_string(),
            format!("Authorization: Bearer {key}\r\n"),
            200,
        ),
        (
            CLUSTERS.to_string(),
            format!("Authorization: Bearer {session}\r\n"),
            401,
        ),
        (
            CLUSTERS.to_string(),
            format!("Authorization: Bearer {revoked_key}\r\n"),
            401,
        ),
        (
            CLUSTERS.to_string(),
            format!("Authorization: Bearer {bad_checksum}\r\n"),
            401,
        ),
        (
            CLUSTERS.to_string(),
            format!("Authorization: Basic {key}\r\n"),
            401,
        ),
        (
            CLUSTERS.to_string(),
            format!("Authorization: Bearer {key}\r\nAuthorization: Bearer {session}\r\n"),
            401,
        ),
        (
            "/api/v1/clusters?organization_id=evil".to_string(),
            format!("Authorization: Bearer {key}\r\n"),
            404,
        ),
        (format!("{CLUSTERS}&api_key={key}"), String::new(), 400),
        (format!("{CLUSTERS}&{session}"), String::new(), 400),
        (
            format!("/api/v1/{key}"),
            format!("Authorization: Bearer {key}\r\n"),
            400,
        ),
        (format!("/api/v1/clusters/%2e%2e/{key}"), String::new(), 400),
        (
            keys_list.to_string(),
            format!("Authorization: Bearer {session}\r\n"),
            200,
        ),
        (
            keys_list.to_string(),
            format!("Authorization: Bearer {key}\r\n"),
            401,
        ),
        (
            format!("/api/v1/api-keys/{key}"),
            format!("Authorization: Bearer {session}\r\n"),
            400,
        ),
        (
            CLUSTERS.to_string(),
            format!("Authorization: Bearer {key}\r\nX-Request-Id: {key}\r\n"),
            200,
        ),
        (
            CLUSTERS.to_string(),
            format!("Authorization: Bearer {key}\r\nConnection: authorization\r\n"),
            200,
        ),
    ] {
        let res = raw_get(w.gw.addr, &target, &header).await;
        assert_eq!(res.status, status, "{target} {header:?}: {}", res.body);
        // What the gateway wrote back (the target is ours, so it is not included).
        bodies.push(format!("{} {:?} {}", res.status, res.headers, res.body));
    }
    let admin = w.gw.admin.expect("admin listener address logged");
    let metrics = client()
        .get(format!("http://{admin}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("mpg_requests_total"), "{metrics}");
    assert!(w.gw.terminate().success());
    let log = w.gw.log_text();
    assert!(log.contains("request"), "the access log is empty");
    let upstream: Vec<String> =
        w.up.seen
            .lock()
            .unwrap()
            .iter()
            .map(|s| {
                format!(
                    "{} {} {:?} {}",
                    s.method,
                    s.uri,
                    s.headers,
                    String::from_utf8_lossy(&s.body)
                )
            })
            .collect();
    assert!(!upstream.is_empty(), "nothing was forwarded at all");
    let everything = [
        ("log", log),
        ("metrics", metrics),
        ("responses", bodies.join("\n")),
        ("upstream", upstream.join("\n")),
    ];
    for (what, text) in &everything {
        for secret in &secrets {
            // The random part alone, so a re-encoded or re-prefixed copy is caught too.
            let body = &secret[4..];
            assert!(
                !text.contains(body),
                "a secret appears in the {what}:\n{text}"
            );
        }
    }
}

/// The access-log line of the request whose id is `id` (waits for it).
async fn access_line(w: &World, id: &str) -> serde_json::Value {
    for _ in 0..250 {
        let found = w.gw.log.lock().unwrap().iter().find_map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).ok()?;
            (v["message"] == "request" && v["request_id"] == id).then_some(v)
        });
        if let Some(v) = found {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no access-log line for request {id}:\n{}", w.gw.log_text());
}

#[tokio::test]
async fn extension_methods_reach_the_access_log_only_as_a_bounded_label() {
    let w = world().await;
    // A long extension method that could be a secret a client misplaced.
    let token: String = (0..200)
        .map(|i| char::from(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"[(i * 7 + 3) % 36]))
        .collect();
    let method = format!("MPG_SECRETLIKE{token}");
    for (i, (target, status)) in [(CLUSTERS, 405), ("/public/ping", 405), ("/nowhere", 404)]
        .into_iter()
        .enumerate()
    {
        let id = format!("extension-method-h1-{i}");
        let req = format!(
            "{method} {target} HTTP/1.1\r\nHost: a\r\nX-Request-Id: {id}\r\n{}Connection: close\r\n\r\n",
            auth(&w)
        );
        let res = raw(w.gw.addr, req.as_bytes()).await;
        assert_eq!(res.status, status, "{target}: {}", res.body);
        assert_eq!(access_line(&w, &id).await["method"], "OTHER");
    }
    let mut h2 = h2c::connect(w.gw.addr).await;
    let mut req = h2c::request(w.gw.addr, &method, CLUSTERS);
    req.headers_mut()
        .insert("x-request-id", "extension-method-h2".parse().unwrap());
    let res = h2.send(req).await.unwrap();
    assert_eq!(res.status, 405, "{res:?}");
    assert_eq!(
        access_line(&w, "extension-method-h2").await["method"],
        "OTHER"
    );
    let log = w.gw.log_text();
    assert!(
        !log.contains(&token[..40]),
        "the method reached the log:\n{log}"
    );
    assert_eq!(w.up.count(), 0);
}

// === HTTP/2 ===

/// An authenticated h2 request for `path` whose `:authority` is `authority`.
fn h2_get(w: &World, authority: &str, path: &str) -> http::Request<()> {
    http::Request::builder()
        .uri(format!("http://{authority}{path}"))
        .header("authorization", format!("Bearer {}", w.seed.key))
        .body(())
        .unwrap()
}

#[tokio::test]
async fn h2_authority_and_host_that_disagree_are_refused() {
    let w = world().await;
    let mut h2 = h2c::connect(w.gw.addr).await;
    let addr = w.gw.addr.to_string();
    let res = h2.send(h2_get(&w, &addr, CLUSTERS)).await.unwrap();
    assert_eq!(res.status, 200);
    let mut req = h2_get(&w, &addr, CLUSTERS);
    req.headers_mut()
        .insert("host", "evil.example".parse().unwrap());
    let res = h2.send(req).await.unwrap();
    assert_eq!(res.status, 400);
    assert_eq!(res.json()["error"], "BadRequest");
    let res = h2
        .send(h2_get(
            &w,
            &addr,
            "/api/v1/../v1/clusters?organization_id=acme",
        ))
        .await
        .unwrap();
    assert_eq!(res.status, 400);
    assert_eq!(res.json()["error"], "BadRequest");
    assert_eq!(w.up.count(), 1);
}

#[tokio::test]
async fn h2_authority_gets_the_host_check_of_http1_and_a_secret_in_it_goes_nowhere() {
    let w = world().await;
    let key = w.seed.key.clone();
    let secret_at = format!("{key}@127.0.0.1");
    let mut h2 = h2c::connect(w.gw.addr).await;
    let mut answers = Vec::new();
    // Userinfo (a credential put before the host), and values that are no
    // plain host[:port] but that HTTP/2's own parser lets through.
    for bad in [
        secret_at.as_str(),
        "user:pass@127.0.0.1",
        "a,b",
        "a:x",
        "a:123456",
        "[::1]x",
    ] {
        let res = h2.send(h2_get(&w, bad, CLUSTERS)).await.unwrap();
        assert_eq!(res.status, 400, "{bad}: {res:?}");
        assert_eq!(res.json()["error"], "BadRequest", "{bad}");
        // The same value as Host over HTTP/1.1: the same answer.
        let req = format!(
            "GET {CLUSTERS} HTTP/1.1\r\nHost: {bad}\r\n{}Connection: close\r\n\r\n",
            auth(&w)
        );
        let res1 = raw(w.gw.addr, req.as_bytes()).await;
        assert_eq!(res1.status, 400, "{bad}: {}", res1.body);
        assert_eq!(res1.json(), res.json(), "{bad}");
        answers.push(format!("{res:?} {res1:?}"));
    }
    assert_eq!(w.up.count(), 0);
    // `:authority` and `host` naming the same authority after scheme-based
    // normalization (case, the default port) pass; the upstream is told
    // the `:authority`.
    let mut req = h2_get(&w, "localhost", CLUSTERS);
    req.headers_mut()
        .insert("host", "LOCALHOST:80".parse().unwrap());
    let res = h2.send(req).await.unwrap();
    assert_eq!(res.status, 200, "{res:?}");
    assert_eq!(w.up.last().headers["x-forwarded-host"], "localhost");
    let res = h2
        .send(h2_get(&w, "api.example:8443", CLUSTERS))
        .await
        .unwrap();
    assert_eq!(res.status, 200, "{res:?}");
    assert_eq!(w.up.last().headers["x-forwarded-host"], "api.example:8443");
    // The secret reached no upstream, log line or answer.
    let upstream = format!("{:?}", w.up.seen.lock().unwrap());
    let log = w.gw.log_text();
    for (what, text) in [
        ("upstream", upstream),
        ("log", log),
        ("answers", answers.join("\n")),
    ] {
        assert!(!text.contains(&key[4..]), "the secret reached the {what}");
    }
}

#[tokio::test]
async fn h2_rapid_reset_flood_is_cut_off_and_the_gateway_keeps_serving() {
    let w = world().await;
    // Requests each reset at once (CVE-2023-44487), unauthenticated to an
    // authenticated route, sent in one burst: HEADERS (:method GET,
    // :scheme http, :path, :authority) then RST_STREAM (CANCEL).
    let addr = w.gw.addr.to_string();
    let mut block = vec![0x82, 0x86, 0x04, CLUSTERS.len() as u8];
    block.extend_from_slice(CLUSTERS.as_bytes());
    block.extend_from_slice(&[0x01, addr.len() as u8]);
    block.extend_from_slice(addr.as_bytes());
    let mut flood = Vec::new();
    for i in 0..200u32 {
        let stream = 2 * i + 1;
        flood.extend(frame(0x1, 0x4, stream, &block));
        flood.extend(frame(0x3, 0, stream, &8u32.to_be_bytes()));
    }
    let (got, closed) = h2_raw_exchange(&w, &flood).await;
    // The gateway answered with GOAWAY ENHANCE_YOUR_CALM and closed.
    assert_eq!(
        goaway_code(&got),
        Some(0xb),
        "frames {:?}",
        frame_types(&got)
    );
    assert!(closed, "the flooding connection was left open");
    // A fresh connection is served normally.
    let mut fresh = h2c::connect(w.gw.addr).await;
    let res = fresh.send(h2_get(&w, &addr, CLUSTERS)).await.unwrap();
    assert_eq!(res.status, 200);
    assert_eq!(w.up.count(), 1, "a reset request reached the upstream");
}

#[tokio::test]
async fn h2_huge_header_lists_are_refused() {
    let w = world().await;
    let mut h2 = h2c::connect(w.gw.addr).await;
    let addr = w.gw.addr.to_string();
    let with_headers = |n: usize| {
        let mut req = h2_get(&w, &addr, CLUSTERS);
        for i in 0..n {
            req.headers_mut().insert(
                http::HeaderName::from_bytes(format!("x-big-{i}").as_bytes()).unwrap(),
                "a".repeat(1_000).parse().unwrap(),
            );
        }
        req
    };
    // 20 kB: past max_header_bytes (16 kB), within what a connection
    // buffers. The pipeline answers, with its JSON body.
    let res = h2.send(with_headers(20)).await.unwrap();
    assert_eq!(res.status, 431, "{res:?}");
    assert_eq!(res.json()["error"], "RequestHeaderFieldsTooLarge");
    assert!(res.headers.contains_key("x-request-id"));
    // 40 kB: past the header-list limit the connection advertises (twice
    // max_header_bytes). The h2 library answers the stream itself, before
    // the gateway sees a request: 431 in a HEADERS frame that ends the
    // stream, no field and no body (RFC 9113 §10.5.1), and the connection
    // goes on.
    let res = h2.send(with_headers(40)).await.unwrap();
    assert_eq!(res.status, 431, "{res:?}");
    assert!(res.ended_with_headers && res.body.is_empty(), "{res:?}");
    assert!(res.headers.is_empty(), "{res:?}");
    let res = h2.send(h2_get(&w, &addr, CLUSTERS)).await.unwrap();
    assert_eq!(res.status, 200);
    assert_eq!(w.up.count(), 1);
}

/// One raw HTTP/2 frame.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// The complete frames in `bytes` (what the server sent): type and payload.
fn frames(bytes: &[u8]) -> Vec<(u8, &[u8])> {
    let mut frames = Vec::new();
    let mut rest = bytes;
    while rest.len() >= 9 {
        let len = (usize::from(rest[0]) << 16) | (usize::from(rest[1]) << 8) | usize::from(rest[2]);
        if rest.len() < 9 + len {
            break;
        }
        frames.push((rest[3], &rest[9..9 + len]));
        rest = &rest[9 + len..];
    }
    frames
}

fn frame_types(bytes: &[u8]) -> Vec<u8> {
    frames(bytes).iter().map(|(kind, _)| *kind).collect()
}

/// The error code of the first GOAWAY frame in `bytes`.
fn goaway_code(bytes: &[u8]) -> Option<u32> {
    frames(bytes)
        .into_iter()
        .find(|(kind, payload)| *kind == 0x7 && payload.len() >= 8)
        .map(|(_, p)| u32::from_be_bytes([p[4], p[5], p[6], p[7]]))
}

/// Opens an HTTP/2 connection, writes the preface, an empty SETTINGS and
/// `frames` in one write, then reads what the gateway sends until it closes
/// the connection (at most 5 s): the bytes, and whether it closed.
async fn h2_raw_exchange(w: &World, frames: &[u8]) -> (Vec<u8>, bool) {
    let mut tcp = TcpStream::connect(w.gw.addr).await.unwrap();
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend(frame(0x4, 0, 0, &[]));
    hello.extend_from_slice(frames);
    // The gateway may close before it has read all: what it sent is read anyway.
    let _ = tcp.write_all(&hello).await;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .is_ok();
    (got, closed)
}

#[tokio::test]
async fn h2_continuation_flood_is_cut_off() {
    let w = world().await;
    // HEADERS without END_HEADERS (:method GET, :scheme http, :path /),
    // then CONTINUATION frames, each one literal header
    // `x-flood: 0123456789`, none ending the block.
    let mut flood = frame(0x1, 0x1, 1, &[0x82, 0x86, 0x84]);
    let mut block = vec![0x00, 7];
    block.extend_from_slice(b"x-flood");
    block.push(10);
    block.extend_from_slice(b"0123456789");
    for _ in 0..100 {
        flood.extend(frame(0x9, 0, 1, &block));
    }
    let (got, closed) = h2_raw_exchange(&w, &flood).await;
    // GOAWAY ENHANCE_YOUR_CALM after a few of them, and the connection closed.
    assert_eq!(
        goaway_code(&got),
        Some(0xb),
        "frames {:?}",
        frame_types(&got)
    );
    assert!(closed, "the flooding connection was left open");
    assert_eq!(w.up.count(), 0);
}

// === The config loader ===

mod config_loader {
    use super::SHIPPED_CONFIG;
    use mpg_gateway::config::Settings;
    use proptest::prelude::*;

    /// Values that have broken config loaders: overflow, empty, wrong type, odd text.
    const ODD_VALUES: [&str; 20] = [
        "\"\"",
        "-1",
        "0",
        "1e400",
        "18446744073709551616",
        "-9223372036854775809",
        "\"0s\"",
        "\"99999999999999999999d\"",
        "\"1.5.5s\"",
        "\"-5m\"",
        "[]",
        "{}",
        "[[]]",
        "true",
        "\"\\u0000\"",
        "\"::::\"",
        "\"http://\"",
        "\"{\"",
        "\"/a/{b}/{b}\"",
        "nan",
    ];

    /// The shipped config as plain HTTP (it names TLS files that tests do
    /// not have), which parses.
    fn base() -> String {
        let mut table: toml::Table = SHIPPED_CONFIG.parse().unwrap();
        let server = table["server"].as_table_mut().unwrap();
        server.insert("insecure_http".into(), true.into());
        server.remove("tls");
        let text = toml::to_string(&table).unwrap();
        assert!(Settings::parse(&text).is_ok(), "{text}");
        text
    }

    /// Every variant of [`base`] with one line changed: each `key = value`
    /// line with each odd value, and each line removed or doubled.
    fn mutations() -> Vec<String> {
        let base = base();
        let lines: Vec<&str> = base.lines().collect();
        let with = |at: usize, replacement: &[String]| {
            let mut out = String::new();
            for (i, line) in lines.iter().enumerate() {
                if i != at {
                    out.push_str(line);
                    out.push('\n');
                    continue;
                }
                for l in replacement {
                    out.push_str(l);
                    out.push('\n');
                }
            }
            out
        };
        let mut all = Vec::new();
        for (at, line) in lines.iter().enumerate() {
            if let Some((key, _)) = line.split_once('=') {
                for value in ODD_VALUES {
                    all.push(with(at, &[format!("{key}= {value}")]));
                }
            }
            all.push(with(at, &[]));
            all.push(with(at, &[line.to_string(), line.to_string()]));
        }
        all
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn settings_parse_never_panics_on_toml_ish_text(text in "[\\[\\]a-z_.=\" 0-9\n{},#:/-]{0,200}") {
            let _ = Settings::parse(&text);
        }
    }

    #[test]
    fn every_one_line_change_to_the_shipped_config_is_parsed_or_refused_by_name() {
        let (mut refused, mut accepted) = (0, 0);
        for text in mutations() {
            match Settings::parse(&text) {
                Ok(_) => accepted += 1,
                // Every refusal names something a person can act on.
                Err(problems) => {
                    refused += 1;
                    assert!(!problems.is_empty(), "{text}");
                    for p in &problems {
                        assert!(!p.message.is_empty(), "{p:?}");
                    }
                }
            }
        }
        // Both outcomes happened: most changes break the file, removing an
        // optional key does not.
        assert!(
            refused > 500 && accepted > 0,
            "{refused} refused, {accepted} accepted"
        );
    }
}

#[tokio::test]
async fn credentials_in_the_path_are_refused_and_never_forwarded() {
    // A client that put its key in a path segment (a REST-ish habit): the
    // path reaches the upstream, its logs and every proxy between, so it is
    // refused like a key in the query, however it is escaped.
    let w = world_with(|cfg| {
        cfg.route("method = \"GET\"\npath = \"/public/echo/{x}\"\nauth = \"none\"\nupstream = \"clusters\"\nrate_limit = \"none\"");
    })
    .await;
    let key = w.seed.key.clone();
    let session = w.seed.session.clone();
    for path in [
        format!("/public/echo/{key}"),
        format!("/public/echo/%6Dpg_{}", &key[4..]),
        format!("/public/echo/{session}"),
        format!("/api/v1/clusters/{key}"),
    ] {
        let res = raw_get(w.gw.addr, &path, "").await;
        assert_eq!(res.status, 400, "{path}: {}", res.body);
        assert_eq!(res.json()["details"]["field"], "path", "{path}");
        assert!(!res.body.contains(&key[4..]) && !res.body.contains(&session[4..]));
    }
    assert_eq!(w.up.count(), 0);
    // Short prefix-alikes are ordinary segments.
    let res = raw_get(w.gw.addr, "/public/echo/mpg_prod", "").await;
    assert_eq!(res.status, 200, "{}", res.body);
}

#[tokio::test]
async fn a_route_may_keep_one_field_some_stacks_trust_and_only_that_one() {
    let w = world_with(|c| {
        c.route("method = \"GET\"\npath = \"/public/keep\"\nauth = \"none\"\nupstream = \"clusters\"\nrate_limit = \"none\"\nkeep_client_headers = [\"X-Original-URI\"]");
    })
    .await;
    let lines = "X-Original-URI: /kept\r\nX-Remote-User: mallory\r\nX-Middleware-Subrequest: middleware\r\n";
    let res = raw_get(w.gw.addr, "/public/keep", lines).await;
    assert_eq!(res.status, 200, "{}", res.body);
    let seen = w.up.last();
    assert_eq!(seen.headers["x-original-uri"], "/kept");
    assert!(!seen.headers.contains_key("x-remote-user"));
    assert!(!seen.headers.contains_key("x-middleware-subrequest"));
    // Every other route still removes it.
    let res = raw_get(w.gw.addr, "/public/ping", lines).await;
    assert_eq!(res.status, 200, "{}", res.body);
    assert!(!w.up.last().headers.contains_key("x-original-uri"));
}

#[tokio::test]
async fn http2_cookie_crumbs_reach_an_http1_upstream_as_one_line() {
    let w = world().await;
    let mut h2 = h2c::connect(w.gw.addr).await;
    let mut req = h2c::request(w.gw.addr, "GET", "/public/ping");
    for crumb in ["a=1", "b=2", "c=3"] {
        req.headers_mut().append("cookie", crumb.parse().unwrap());
    }
    let res = h2.send(req).await.unwrap();
    assert_eq!(res.status, 200, "{res:?}");
    let seen = w.up.last();
    let cookies: Vec<_> = seen.headers.get_all("cookie").iter().collect();
    assert_eq!(cookies, ["a=1; b=2; c=3"], "{:?}", seen.headers);
}

/// `n` concurrent HTTP/2 requests from one address, each with a different
/// well-formed key the store does not know, against a guard of 5 failures:
/// only 5 reach the store (401), the rest are refused before it (429).
async fn concurrent_guesses_take_only_the_budget(w: &World, n: usize) {
    let h2 = h2c::connect(w.gw.addr).await;
    let guesses = (0..n).map(|_| {
        let sender = h2.sender.clone();
        let (guess, _) = mpg_gateway::secret::generate_api_key();
        let mut req = h2c::request(w.gw.addr, "GET", CLUSTERS);
        req.headers_mut()
            .insert("authorization", format!("Bearer {guess}").parse().unwrap());
        async move {
            let mut sender = sender.ready().await.unwrap();
            let (res, _) = sender.send_request(req, true).unwrap();
            res.await.unwrap().status().as_u16()
        }
    });
    let statuses = futures_util::future::join_all(guesses).await;
    let count = |s: u16| statuses.iter().filter(|x| **x == s).count();
    assert_eq!(count(401), 5, "{statuses:?}");
    assert_eq!(count(429), n - 5, "{statuses:?}");
    // A good key from the same address is refused too: the budget is spent.
    let res = raw_get(w.gw.addr, CLUSTERS, &auth(w)).await;
    assert_eq!(res.status, 429, "{}", res.body);
    assert_eq!(w.up.count(), 0);
}

fn five_failures(c: &mut TestConfig) {
    c.set("rate_limit.auth_failures.requests", 5);
    c.set("rate_limit.auth_failures.per", "1m");
}

#[tokio::test]
async fn concurrent_guesses_cannot_widen_the_auth_failure_budget() {
    let w = world_with(five_failures).await;
    concurrent_guesses_take_only_the_budget(&w, 256).await;
}

#[tokio::test]
async fn concurrent_guesses_cannot_widen_the_auth_failure_budget_on_redis() {
    let prefix = common::scale::RedisPrefix::new();
    let w = world_with(|c| {
        five_failures(c);
        c.redis(&common::scale::redis_url(), &prefix.0);
        // A Redis call that timed out under a loaded machine would count in
        // the in-process fallback's bucket instead, a budget of its own.
        c.set("rate_limit.redis_timeout", "10s");
    })
    .await;
    concurrent_guesses_take_only_the_budget(&w, 256).await;
}

/// The status of the clusters route with `key`.
async fn clusters_with(w: &World, key: &str) -> u16 {
    let header = format!("Authorization: Bearer {key}\r\n");
    raw_get(w.gw.addr, CLUSTERS, &header).await.status
}

#[tokio::test]
async fn a_good_key_looked_up_gives_its_failure_token_back() {
    let w = world_with(five_failures).await;
    let config = w.cfg.dir.path().join("gateway.toml");
    // Each request is a cache miss (a new key each time), so each takes a
    // failure token ahead of its lookup; the good ones give it back.
    for i in 0..8 {
        let (key, _) = create_key(&config, "acme", "alice", "clusters:read");
        assert_eq!(clusters_with(&w, &key).await, 200, "key {i}");
    }
    // So the whole budget is left for failures, and then spent.
    let guesses: Vec<String> = (0..6)
        .map(|_| mpg_gateway::secret::generate_api_key().0)
        .collect();
    for guess in &guesses[..5] {
        assert_eq!(clusters_with(&w, guess).await, 401);
    }
    assert_eq!(clusters_with(&w, &guesses[5]).await, 429);
}

/// The status of `GET /api/v1/clusters` with `key`.
async fn status_with(w: &World, key: &str) -> u16 {
    let header = format!("Authorization: Bearer {key}\r\n");
    raw_get(w.gw.addr, CLUSTERS, &header).await.status
}

/// The key cache's lookups by `result` (`hit`, `miss`).
async fn lookups(w: &World, result: &str) -> f64 {
    let text = metrics(w.gw.admin.expect("admin listener")).await;
    metric_sum(
        &text,
        "mpg_key_cache_lookups_total",
        &[&format!("result=\"{result}\"")],
    )
}

#[tokio::test]
async fn a_flood_of_unknown_keys_stays_within_the_negative_cache_bound_and_evicts_no_valid_key() {
    const CAPACITY: usize = 50;
    const FLOOD: usize = 300;
    let w = world_with(|c| {
        c.set("store.negative_cache_capacity", CAPACITY as i64);
        c.set("store.negative_cache_ttl", "1h");
        c.set("store.cache_ttl", "1h");
        c.admin_on();
    })
    .await;
    // The valid key is cached; an unknown one is remembered as unknown.
    assert_eq!(status_with(&w, &w.seed.key).await, 200);
    let (unknown, _) = mpg_gateway::secret::generate_api_key();
    assert_eq!(status_with(&w, &unknown).await, 401);
    let hits = lookups(&w, "hit").await;
    assert_eq!(status_with(&w, &unknown).await, 401);
    assert_eq!(
        lookups(&w, "hit").await,
        hits + 1.0,
        "an unknown key not remembered"
    );

    // Well-formed keys (right length, alphabet and checksum) never issued.
    let flood: Vec<String> = (0..FLOOD)
        .map(|_| mpg_gateway::secret::generate_api_key().0)
        .collect();
    for key in &flood {
        assert_eq!(status_with(&w, key).await, 401);
    }
    let text = metrics(w.gw.admin.expect("admin listener")).await;
    let negative = metric_sum(&text, "mpg_key_cache_negative_entries", &[]);
    assert!(
        (1.0..=CAPACITY as f64).contains(&negative),
        "{negative} negative entries; the bound is {CAPACITY}"
    );
    // The valid key was not evicted: still a hit.
    let hits = lookups(&w, "hit").await;
    assert_eq!(status_with(&w, &w.seed.key).await, 200);
    assert_eq!(
        lookups(&w, "hit").await,
        hits + 1.0,
        "the valid key was evicted"
    );
    // The flood again: at most the bound's worth is answered from the cache,
    // the rest goes to the store once more.
    let misses = lookups(&w, "miss").await;
    for key in &flood {
        assert_eq!(status_with(&w, key).await, 401);
    }
    let again = lookups(&w, "miss").await - misses;
    assert!(
        again >= (FLOOD - CAPACITY) as f64,
        "only {again} of {FLOOD} unknown keys went to the store again; at most {CAPACITY} fit"
    );
    // Only the valid key's two requests were forwarded.
    assert_eq!(w.up.count(), 2, "an unknown key reached the upstream");
}
