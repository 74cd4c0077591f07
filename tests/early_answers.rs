//! Answers sent before the request body has ended (refusals, a dead target):
//! the client gets them whole, and its upload ends normally. HTTP/2: no
//! `RST_STREAM` until the client's `END_STREAM`, unless the drain bounds are
//! passed; HTTP/1.1: the rest of the body is read past and the connection
//! kept, or closed only after the client has stopped sending. (The same
//! against real clients: `tests/interop.rs`.)
mod common;

use bytes::Bytes;
use common::*;
use serde_json::Value;
use std::future::poll_fn;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CLUSTERS: &str = "/api/v1/clusters?organization_id=acme";
const MIB: usize = 1024 * 1024;
/// `server.limits.max_body_bytes` here: a 2 MiB body passes stage 1.
const MAX_BODY: usize = 4 * MIB;
/// The gateway's drain bounds (`crate::body::DRAIN_*`).
const DRAIN_MAX_BYTES: usize = 8 * MIB;
const DRAIN_IDLE: Duration = Duration::from_secs(5);

async fn gateway() -> World {
    world_with(|c| {
        c.set("server.limits.max_body_bytes", MAX_BODY as i64);
    })
    .await
}

// === HTTP/2 ===

async fn h2_connect(w: &World) -> h2::client::SendRequest<Bytes> {
    let tcp = TcpStream::connect(w.gw.addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client.ready().await.unwrap()
}

/// Sends `n` bytes on `stream` as the flow-control window allows.
async fn h2_send(stream: &mut h2::SendStream<Bytes>, n: usize) -> Result<(), h2::Error> {
    let piece = Bytes::from(vec![b'x'; 16 * 1024]);
    let mut left = n;
    while left > 0 {
        stream.reserve_capacity(left.min(piece.len()));
        let room = match poll_fn(|cx| stream.poll_capacity(cx)).await {
            Some(room) => room?,
            None => return Err(h2::Error::from(h2::Reason::STREAM_CLOSED)),
        };
        let take = room.min(left).min(piece.len());
        stream.send_data(piece.slice(..take), false)?;
        left -= take;
    }
    Ok(())
}

/// Starts a POST of `length` bytes to `path`, sends the first 64 KiB, and
/// reads the whole answer: the send half, the status and the body as JSON.
async fn h2_early_answer(
    client: &mut h2::client::SendRequest<Bytes>,
    w: &World,
    path: &str,
    auth: &str,
    length: usize,
) -> (h2::SendStream<Bytes>, u16, Value) {
    let req = http::Request::post(format!("http://{}{path}", w.gw.addr))
        .header("authorization", auth)
        .header("content-length", length)
        .body(())
        .unwrap();
    *client = client.clone().ready().await.unwrap();
    let (res, mut stream) = client.send_request(req, false).unwrap();
    h2_send(&mut stream, 64 * 1024).await.unwrap();
    let res = tokio::time::timeout(Duration::from_secs(5), res)
        .await
        .expect("no answer while the body was being sent")
        .unwrap();
    let (status, json) = h2_read_answer(res).await;
    (stream, status, json)
}

/// An answer's status and its whole body, as JSON.
async fn h2_read_answer(res: http::Response<h2::RecvStream>) -> (u16, Value) {
    let status = res.status().as_u16();
    let mut body = res.into_body();
    let mut bytes = Vec::new();
    while let Some(piece) = body.data().await {
        let piece = piece.expect("the answer's body was cut off");
        let _ = body.flow_control().release_capacity(piece.len());
        bytes.extend_from_slice(&piece);
    }
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn h2_early_answers_leave_the_stream_open_until_the_upload_ends() {
    let w = gateway().await;
    let mut client = h2_connect(&w).await;
    let bad_key = "Bearer mpg_notakey";
    let good_key = format!("Bearer {}", w.seed.key);
    for (path, auth, length, status, error) in [
        (CLUSTERS, bad_key, 2 * MIB, 401, "Unauthorized"),
        (
            CLUSTERS,
            good_key.as_str(),
            MAX_BODY + MIB,
            413,
            "PayloadTooLarge",
        ),
        ("/api/v1/nowhere", bad_key, 2 * MIB, 404, "NotFound"),
    ] {
        let (mut stream, got, json) = h2_early_answer(&mut client, &w, path, auth, length).await;
        assert_eq!(
            (got, json["error"].as_str()),
            (status, Some(error)),
            "{json}"
        );
        // The answer has ended; the client goes on with its upload. A
        // RST_STREAM here is what older nghttp2-based clients fail on.
        let sent = h2_send(&mut stream, length - 64 * 1024).await;
        assert!(
            sent.is_ok(),
            "{status}: the stream was reset before the upload ended: {sent:?}"
        );
        stream.send_data(Bytes::new(), true).unwrap();
    }
    // The connection serves on.
    let req = http::Request::get(format!("http://{}{CLUSTERS}", w.gw.addr))
        .header("authorization", &good_key)
        .body(())
        .unwrap();
    client = client.ready().await.unwrap();
    let (res, _) = client.send_request(req, true).unwrap();
    assert_eq!(res.await.unwrap().status(), 200);
    assert_eq!(w.up.count(), 1, "a refused request reached the upstream");
}

/// The gateway's wait for the rest of an HTTP/2 body before an early answer
/// (`crate::body::BEFORE_ANSWER_*`).
const BEFORE_ANSWER_TIME: Duration = Duration::from_secs(1);
const BEFORE_ANSWER_IDLE: Duration = Duration::from_millis(250);

/// Sends a `length`-byte `method` to `path` as curl 7.88 does: in pieces as
/// the window allows, `pause` after each of the first `pauses` pieces of
/// 64 KiB, and, if the answer comes first, the upload ended there
/// (`END_STREAM` short of the declared length).
async fn h2_upload_like_curl(
    client: &mut h2::client::SendRequest<Bytes>,
    w: &World,
    (method, path, auth): (&str, &str, &str),
    length: usize,
    (pauses, pause): (usize, Duration),
) -> Upload {
    let req = http::Request::builder()
        .method(method)
        .uri(format!("http://{}{path}", w.gw.addr))
        .header("authorization", auth)
        .header("content-length", length)
        .body(())
        .unwrap();
    *client = client.clone().ready().await.unwrap();
    let started = Instant::now();
    let (res, mut stream) = client.send_request(req, false).unwrap();
    tokio::pin!(res);
    let piece = 64 * 1024;
    let (mut sent, mut early) = (0, false);
    let res = loop {
        if sent == length {
            stream.send_data(Bytes::new(), true).unwrap();
            break res.await;
        }
        // One piece, then its pause (if any), while watching for the answer.
        let take = piece.min(length - sent);
        let wait = if sent / piece < pauses {
            pause
        } else {
            Duration::ZERO
        };
        let step = async {
            h2_send(&mut stream, take).await.unwrap();
            tokio::time::sleep(wait).await;
        };
        tokio::select! {
            biased;
            res = &mut res => {
                early = true;
                let _ = stream.send_data(Bytes::new(), true);
                break res;
            }
            _ = step => sent += take,
        }
    };
    let took = started.elapsed();
    let (status, json) = h2_read_answer(res.expect("no answer")).await;
    Upload {
        early,
        took,
        sent,
        status,
        json,
    }
}

/// What [`h2_upload_like_curl`] saw.
struct Upload {
    /// The answer came before the upload's end.
    early: bool,
    /// From the request's start to the answer's head.
    took: Duration,
    /// Body bytes sent by then.
    sent: usize,
    status: u16,
    json: Value,
}

/// curl 7.88 ends its upload short as soon as it reads an error status, and
/// h2 resets such a stream with `PROTOCOL_ERROR`: if the answer's head has
/// gone out without its body, curl loses the answer. An upload that keeps
/// coming is therefore read to its end before the answer goes; one that
/// stalls, trickles past the time bound, or declares more than the drain
/// reads is answered mid-upload, as before.
#[tokio::test]
async fn h2_an_upload_that_keeps_coming_is_answered_after_its_end() {
    let w = gateway().await;
    let mut client = h2_connect(&w).await;
    let bad_key = "Bearer mpg_notakey";
    let good_key = format!("Bearer {}", w.seed.key);
    let short = Duration::from_millis(50);
    for (request, status, error) in [
        (("POST", CLUSTERS, bad_key), 401, "Unauthorized"),
        (
            ("PUT", CLUSTERS, good_key.as_str()),
            405,
            "MethodNotAllowed",
        ),
        (("POST", "/api/v1/nowhere", bad_key), 404, "NotFound"),
    ] {
        // Pauses well under the idle bound, over HTTP/2's window.
        let up = h2_upload_like_curl(&mut client, &w, request, 2 * MIB, (4, short)).await;
        assert_eq!(
            (up.status, up.json["error"].as_str()),
            (status, Some(error)),
            "{}",
            up.json
        );
        assert!(!up.early, "{status}: answered while the upload kept coming");
    }
    // Answered mid-upload past a bound: a client that waits for the answer,
    // once the idle bound passes; a trickle, once the time bound passes.
    for (what, pauses, bound) in [
        ("a stalled upload", (1, DRAIN_IDLE), BEFORE_ANSWER_IDLE),
        (
            "a trickle",
            (32, BEFORE_ANSWER_IDLE / 5),
            BEFORE_ANSWER_TIME,
        ),
    ] {
        let request = ("POST", CLUSTERS, bad_key);
        let up = h2_upload_like_curl(&mut client, &w, request, 2 * MIB, pauses).await;
        assert_eq!(up.status, 401, "{what}");
        assert!(
            up.early && up.took >= bound,
            "{what} answered after {:?}",
            up.took
        );
    }
    // More than the drain would read (and than `max_body_bytes`), sent
    // without a pause: answered at once, not after the drain's bytes.
    let request = ("POST", CLUSTERS, bad_key);
    let up = h2_upload_like_curl(&mut client, &w, request, 2 * DRAIN_MAX_BYTES, (0, short)).await;
    assert_eq!(up.status, 413);
    assert!(
        up.early && up.sent < DRAIN_MAX_BYTES,
        "answered after {} bytes",
        up.sent
    );
    assert_eq!(w.up.count(), 0, "a refused request reached the upstream");
}

#[tokio::test]
async fn h2_a_drain_past_its_bounds_resets_the_stream_with_no_error() {
    let w = gateway().await;
    let mut client = h2_connect(&w).await;
    let bad_key = "Bearer mpg_notakey";

    // Past the byte bound: reset (NO_ERROR) once the gateway has read it.
    let (mut stream, status, _) =
        h2_early_answer(&mut client, &w, CLUSTERS, bad_key, 4 * DRAIN_MAX_BYTES).await;
    assert_eq!(status, 413);
    let sent = h2_send(&mut stream, 4 * DRAIN_MAX_BYTES - 64 * 1024).await;
    assert!(
        sent.is_err(),
        "a body past the drain bound was read to its end"
    );
    let reset = poll_fn(|cx| stream.poll_reset(cx)).await;
    assert_eq!(reset.unwrap(), h2::Reason::NO_ERROR);

    // A client that stops sending without ending its body: reset (NO_ERROR)
    // once it has sent nothing for the drain's idle bound.
    let (mut stream, status, _) =
        h2_early_answer(&mut client, &w, CLUSTERS, bad_key, 2 * MIB).await;
    assert_eq!(status, 401);
    let started = Instant::now();
    let reset = tokio::time::timeout(DRAIN_IDLE * 2, poll_fn(|cx| stream.poll_reset(cx)))
        .await
        .expect("a stalled drain was never ended");
    assert_eq!(reset.unwrap(), h2::Reason::NO_ERROR);
    let took = started.elapsed();
    assert!(
        took >= DRAIN_IDLE - Duration::from_millis(500),
        "reset after {took:?}"
    );
}

// === HTTP/1.1 ===

/// Writes `head` and a `length`-byte body (in 64 KiB chunks when `chunked`)
/// on a fresh connection, then `after` (the next request), while reading
/// everything the gateway sends until it closes: (what was read, what
/// writing gave).
async fn h1_upload(
    w: &World,
    head: &str,
    length: usize,
    chunked: bool,
    after: &str,
) -> (String, std::io::Result<()>) {
    let tcp = TcpStream::connect(w.gw.addr).await.unwrap();
    let (mut rd, mut wr) = tcp.into_split();
    let (head, after) = (head.to_string(), after.to_string());
    let writer = tokio::spawn(async move {
        wr.write_all(head.as_bytes()).await?;
        let piece = vec![b'x'; 64 * 1024];
        let mut left = length;
        while left > 0 {
            let n = left.min(piece.len());
            if chunked {
                wr.write_all(format!("{n:x}\r\n").as_bytes()).await?;
            }
            wr.write_all(&piece[..n]).await?;
            if chunked {
                wr.write_all(b"\r\n").await?;
            }
            left -= n;
        }
        if chunked {
            wr.write_all(b"0\r\n\r\n").await?;
        }
        wr.write_all(after.as_bytes()).await
    });
    let mut read = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(15), rd.read_to_end(&mut read)).await;
    let wrote = tokio::time::timeout(Duration::from_secs(10), writer)
        .await
        .expect("the upload neither ended nor failed")
        .unwrap();
    (String::from_utf8_lossy(&read).into_owned(), wrote)
}

#[tokio::test]
async fn http1_early_answers_read_past_the_body_and_keep_the_connection() {
    let w = gateway().await;
    let ping = "GET /public/ping HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    let key = format!("Bearer {}", w.seed.key);
    for (auth, length, chunked, status, error) in [
        ("Bearer mpg_notakey", 2 * MIB, false, 401, "Unauthorized"),
        ("Bearer mpg_notakey", 2 * MIB, true, 401, "Unauthorized"),
        // Refused for its declared length, before a byte of it is read.
        (&key, MAX_BODY + MIB, false, 413, "PayloadTooLarge"),
        // Refused once max_body_bytes of it have gone to the upstream.
        (&key, MAX_BODY + MIB, true, 413, "PayloadTooLarge"),
    ] {
        // No `Expect: 100-continue`: the whole body comes at once, as a
        // client that reads nothing until it has sent everything sends it.
        let framing = if chunked {
            "Transfer-Encoding: chunked".to_string()
        } else {
            format!("Content-Length: {length}")
        };
        let head = format!(
            "POST {CLUSTERS} HTTP/1.1\r\nHost: a\r\nAuthorization: {auth}\r\n{framing}\r\n\r\n"
        );
        let (read, wrote) = h1_upload(&w, &head, length, chunked, ping).await;
        assert!(
            wrote.is_ok(),
            "{status} {framing}: the upload was cut off: {wrote:?}\n{read}"
        );
        let (first, second) = read.split_once("\r\n\r\n").unwrap_or((&read, ""));
        assert!(first.starts_with(&format!("HTTP/1.1 {status} ")), "{read}");
        assert!(
            !first.to_ascii_lowercase().contains("connection: close"),
            "{status} {framing}: the connection was not kept:\n{read}"
        );
        assert!(second.contains(&format!("\"error\":\"{error}\"")), "{read}");
        assert!(
            second.contains("HTTP/1.1 200 OK"),
            "{status} {framing}: the next request was not served:\n{read}"
        );
    }
}

#[tokio::test]
async fn http1_a_body_past_the_drain_bound_is_answered_then_cut() {
    let w = gateway().await;
    let length = 8 * DRAIN_MAX_BYTES;
    let head = format!(
        "POST {CLUSTERS} HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer mpg_notakey\r\nContent-Length: {length}\r\n\r\n"
    );
    let started = Instant::now();
    let (read, wrote) = h1_upload(&w, &head, length, false, "").await;
    assert!(read.starts_with("HTTP/1.1 413 "), "{read}");
    assert!(
        read.to_ascii_lowercase().contains("connection: close"),
        "{read}"
    );
    assert!(read.contains("\"error\":\"PayloadTooLarge\""), "{read}");
    assert!(
        wrote.is_err(),
        "{length} bytes were read past, beyond the bound"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}
