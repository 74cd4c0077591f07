//! Behind a balancer, over real sockets: which address is the client's
//! (`[server.client_ip]`, the PROXY protocol), and where it is used: the
//! `X-Forwarded-For` the upstream gets, `client_ip` rate-limit policies,
//! the authentication-failure guard and the access log.
mod common;

use common::*;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// The shipped routes plus `/public/ping` (unlimited) and `/public/limited`
/// (one request per client per hour), both open; one 401 per client per
/// hour before the guard answers 429.
async fn behind(tune: impl FnOnce(&mut TestConfig)) -> World {
    world_with(|c| {
        c.set("rate_limit.policies.per_ip.requests", 1);
        c.set("rate_limit.policies.per_ip.per", "1h");
        c.set("rate_limit.policies.per_ip.key", "client_ip");
        c.set("rate_limit.auth_failures.requests", 1);
        c.set("rate_limit.auth_failures.per", "1h");
        c.route("method = \"GET\"\npath = \"/public/limited\"\nauth = \"none\"\nupstream = \"clusters\"\nrate_limit = \"per_ip\"");
        tune(c);
    })
    .await
}

fn trust(c: &mut TestConfig, networks: &[&str]) {
    let list: Vec<String> = networks.iter().map(|n| n.to_string()).collect();
    c.set("server.client_ip.trusted_proxies", list);
}

/// `GET path` on a new connection with the extra header lines given: the status.
async fn get(addr: SocketAddr, path: &str, headers: &str) -> u16 {
    raw_get(addr, path, headers).await.status
}

/// What the upstream saw as `X-Forwarded-For` last.
fn forwarded_for(w: &World) -> String {
    w.up.last().headers["x-forwarded-for"]
        .to_str()
        .unwrap()
        .to_owned()
}

/// The access-log line of the request whose id is `id` (waits for it).
async fn access_line(gw: &Gateway, id: &str) -> serde_json::Value {
    for _ in 0..250 {
        let found = gw.log.lock().unwrap().iter().find_map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).ok()?;
            (v["message"] == "request" && v["request_id"] == id).then_some(v)
        });
        if let Some(v) = found {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no access-log line for request {id}:\n{}", gw.log_text());
}

#[tokio::test]
async fn a_trusted_proxys_forwarded_for_names_the_client_and_only_the_trusted_chain_goes_on() {
    let w = behind(|c| trust(c, &["127.0.0.1", "10.0.0.0/8"])).await;
    let addr = w.gw.addr;
    // Right to left: the gateway's peer and 10.1.1.1 are trusted, so
    // 198.51.100.7 is the client; 6.6.6.6 was written by the client.
    let status = get(
        addr,
        "/public/ping",
        "X-Request-Id: behind-1\r\nX-Forwarded-For: 6.6.6.6, 198.51.100.7\r\nX-Forwarded-For: 10.1.1.1\r\n",
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(forwarded_for(&w), "198.51.100.7, 10.1.1.1, 127.0.0.1");
    let line = access_line(&w.gw, "behind-1").await;
    assert_eq!(line["client"], "198.51.100.7", "{line}");
    assert_eq!(line["peer"], "127.0.0.1", "{line}");
    // All trusted: the leftmost.
    assert_eq!(
        get(
            addr,
            "/public/ping",
            "X-Forwarded-For: 10.2.2.2, 10.1.1.1\r\n"
        )
        .await,
        200
    );
    assert_eq!(forwarded_for(&w), "10.2.2.2, 10.1.1.1, 127.0.0.1");
    // Absent, or not a list of addresses: the peer.
    for header in ["", "X-Forwarded-For: 198.51.100.7, unknown\r\n"] {
        assert_eq!(get(addr, "/public/ping", header).await, 200);
        assert_eq!(forwarded_for(&w), "127.0.0.1", "{header:?}");
    }

    // From a peer that is not trusted, the header is not read at all.
    let w = behind(|c| trust(c, &["10.0.0.0/8"])).await;
    let status = get(
        w.gw.addr,
        "/public/ping",
        "X-Request-Id: behind-2\r\nX-Forwarded-For: 198.51.100.7\r\n",
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(forwarded_for(&w), "127.0.0.1");
    assert_eq!(access_line(&w.gw, "behind-2").await["client"], "127.0.0.1");
}

#[tokio::test]
async fn client_ip_policies_and_the_auth_guard_count_the_client_named_and_ipv6_per_64() {
    let w = behind(|c| trust(c, &["127.0.0.1"])).await;
    let addr = w.gw.addr;
    let from = |ip: &str| format!("X-Forwarded-For: {ip}\r\n");
    let limited = |ip: &'static str| async move { get(addr, "/public/limited", &from(ip)).await };
    assert_eq!(limited("198.51.100.1").await, 200);
    assert_eq!(limited("198.51.100.1").await, 429);
    assert_eq!(limited("198.51.100.2").await, 200);
    // Two hosts of one /64 share a bucket; the next /64 has its own.
    assert_eq!(limited("2001:db8:1:2::1").await, 200);
    assert_eq!(limited("2001:db8:1:2:ffff:ffff:ffff:ffff").await, 429);
    assert_eq!(limited("2001:db8:1:3::1").await, 200);

    // One 401 per client, then 429 before any lookup: for that client only.
    let clusters = "/api/v1/clusters?organization_id=acme";
    assert_eq!(get(addr, clusters, &from("198.51.100.1")).await, 401);
    assert_eq!(get(addr, clusters, &from("198.51.100.1")).await, 429);
    assert_eq!(get(addr, clusters, &from("198.51.100.2")).await, 401);
    assert_eq!(get(addr, clusters, &from("2001:db8:9:9::1")).await, 401);
    assert_eq!(get(addr, clusters, &from("2001:db8:9:9::2")).await, 429);
}

#[tokio::test]
async fn a_field_of_the_operators_choosing_is_read_from_trusted_proxies_and_never_passed_on() {
    let w = behind(|c| {
        trust(c, &["127.0.0.1"]);
        c.set("server.client_ip.header", "X-Client-Address");
    })
    .await;
    let status = get(
        w.gw.addr,
        "/public/ping",
        "X-Client-Address: 198.51.100.7\r\nX-Forwarded-For: 6.6.6.6\r\n",
    )
    .await;
    assert_eq!(status, 200);
    let seen = w.up.last();
    assert_eq!(seen.headers["x-forwarded-for"], "198.51.100.7, 127.0.0.1");
    assert!(
        !seen.headers.contains_key("x-client-address"),
        "{:?}",
        seen.headers
    );
}

#[tokio::test]
async fn over_ipv6_a_client_is_counted_by_its_64() {
    let w = behind(|c| {
        c.set("server.listen", "[::1]:0");
        trust(c, &["::1"]);
    })
    .await;
    assert!(w.gw.addr.is_ipv6());
    // ::1 itself (its header absent) spends the bucket of ::/64 ...
    assert_eq!(get(w.gw.addr, "/public/limited", "").await, 200);
    assert_eq!(forwarded_for(&w), "::1");
    // ... which ::2, named by the trusted ::1, shares; 2001:db8::1 does not.
    let again = get(w.gw.addr, "/public/limited", "X-Forwarded-For: ::2\r\n").await;
    assert_eq!(again, 429);
    let other = get(
        w.gw.addr,
        "/public/limited",
        "X-Forwarded-For: 2001:db8::1\r\n",
    )
    .await;
    assert_eq!(other, 200);
    assert_eq!(forwarded_for(&w), "2001:db8::1, ::1");
}

// === the PROXY protocol ===

fn v1(client: &str) -> Vec<u8> {
    let family = if client.contains(':') { "TCP6" } else { "TCP4" };
    let server = if client.contains(':') {
        "::1"
    } else {
        "127.0.0.1"
    };
    format!("PROXY {family} {client} {server} 4711 8443\r\n").into_bytes()
}

/// A v2 header: `PROXY` with `client`'s address, or `LOCAL` when `None`.
fn v2(client: Option<std::net::IpAddr>) -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    let (command, family, addresses) = match client {
        None => (0x20, 0x00, Vec::new()),
        Some(std::net::IpAddr::V4(ip)) => {
            let mut a = ip.octets().to_vec();
            a.extend([127, 0, 0, 1, 0x12, 0x67, 0x20, 0xfb]);
            (0x21, 0x11, a)
        }
        Some(std::net::IpAddr::V6(ip)) => {
            let mut a = ip.octets().to_vec();
            a.extend(std::net::Ipv6Addr::LOCALHOST.octets());
            a.extend([0x12, 0x67, 0x20, 0xfb]);
            (0x21, 0x21, a)
        }
    };
    h.extend([command, family]);
    h.extend((addresses.len() as u16).to_be_bytes());
    h.extend(addresses);
    h
}

const PING: &[u8] = b"GET /public/ping HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n";

/// Writes `bytes` and reads until the gateway closes (at most 5 s): what
/// it sent back.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, bytes: &[u8]) -> Vec<u8> {
    let _ = s.write_all(bytes).await;
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got)).await;
    got
}

/// Sends `bytes` and reads until the gateway ends the connection (EOF or
/// reset), which must happen within `limit`: a connection left open fails,
/// where [`exchange`] would read nothing and pass. What was read.
async fn closed_within(mut s: TcpStream, bytes: &[u8], limit: Duration) -> Vec<u8> {
    let _ = s.write_all(bytes).await;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let read_all = async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    let ended = tokio::time::timeout(limit, read_all).await;
    assert!(
        ended.is_ok(),
        "the connection was still open after {limit:?}"
    );
    got
}

/// A gateway whose every connection starts with a PROXY header from 127.0.0.1, and
/// that waits at most a second for it.
async fn behind_a_local_proxy() -> World {
    behind(|c| {
        c.set("server.proxy_protocol", true);
        c.set("server.limits.header_read_timeout", "1s");
        trust(c, &["127.0.0.1"]);
    })
    .await
}

async fn proxied(addr: SocketAddr, header: &[u8], request: &[u8]) -> RawResponse {
    let s = TcpStream::connect(addr).await.unwrap();
    RawResponse::parse(&exchange(s, &[header, request].concat()).await)
}

#[tokio::test]
async fn behind_the_proxy_protocol_the_header_names_the_client_over_h1_and_h2c() {
    let w = behind_a_local_proxy().await;
    let addr = w.gw.addr;
    for (header, client) in [
        (v1("198.51.100.7"), "198.51.100.7"),
        (v1("2001:db8::7"), "2001:db8::7"),
        (v2(Some("198.51.100.8".parse().unwrap())), "198.51.100.8"),
        (v2(Some("2001:db8::8".parse().unwrap())), "2001:db8::8"),
        // LOCAL (a balancer's health check): the peer.
        (v2(None), "127.0.0.1"),
        (b"PROXY UNKNOWN\r\n".to_vec(), "127.0.0.1"),
    ] {
        let res = proxied(addr, &header, PING).await;
        assert_eq!(res.status, 200, "{header:?}");
        assert_eq!(forwarded_for(&w), client, "{header:?}");
    }
    // The client named is what a client_ip policy counts.
    let limited = b"GET /public/limited HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n";
    assert_eq!(
        proxied(addr, &v1("198.51.100.9"), limited).await.status,
        200
    );
    assert_eq!(
        proxied(addr, &v1("198.51.100.9"), limited).await.status,
        429
    );
    assert_eq!(
        proxied(addr, &v1("198.51.100.10"), limited).await.status,
        200
    );
    // A client that is itself a trusted proxy may name another in its header;
    // an untrusted one may not.
    let with_xff = b"GET /public/ping HTTP/1.1\r\nHost: gw\r\nX-Forwarded-For: 203.0.113.5\r\nConnection: close\r\n\r\n";
    assert_eq!(proxied(addr, &v1("127.0.0.1"), with_xff).await.status, 200);
    assert_eq!(forwarded_for(&w), "203.0.113.5, 127.0.0.1");
    assert_eq!(
        proxied(addr, &v1("198.51.100.7"), with_xff).await.status,
        200
    );
    assert_eq!(forwarded_for(&w), "198.51.100.7");

    // HTTP/2 with prior knowledge, after the header.
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(&v2(Some("198.51.100.11".parse().unwrap())))
        .await
        .unwrap();
    let (sender, conn) = h2::client::handshake(tcp).await.unwrap();
    let mut c = h2c::H2 {
        sender,
        conn: tokio::spawn(conn),
    };
    let res = c
        .send(h2c::request(addr, "GET", "/public/ping"))
        .await
        .unwrap();
    assert_eq!(res.status, 200);
    assert_eq!(forwarded_for(&w), "198.51.100.11");
}

#[tokio::test]
async fn behind_the_proxy_protocol_anything_but_a_header_is_closed_without_an_answer() {
    let w = behind_a_local_proxy().await;
    let addr = w.gw.addr;
    let before = w.up.count();
    // No header: a plain request is not answered.
    // Closed within header_read_timeout (1 s) and a margin for a busy machine.
    let limit = Duration::from_secs(4);
    let got = closed_within(TcpStream::connect(addr).await.unwrap(), PING, limit).await;
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    // A broken header.
    let got = closed_within(
        TcpStream::connect(addr).await.unwrap(),
        &[b"PROXY TCP4 198.51.100.7 127.0.0.1 1\r\n".as_slice(), PING].concat(),
        limit,
    )
    .await;
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    // A header sent slowly is cut at header_read_timeout, counted from the accept.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    s.write_all(b"PROXY TCP4 198.5").await.unwrap();
    let mut buf = [0u8; 64];
    let mut trickle = tokio::time::interval(Duration::from_millis(300));
    let closed_after = loop {
        tokio::select! {
            read = s.read(&mut buf) => {
                assert!(matches!(read, Ok(0) | Err(_)), "the gateway answered a partial header");
                break started.elapsed();
            }
            _ = trickle.tick() => {
                // One byte at a time, never finishing the header.
                if s.write_all(b"1").await.is_err() {
                    break started.elapsed();
                }
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "a slow header was never cut"
        );
    };
    assert!(
        closed_after >= Duration::from_millis(800) && closed_after < Duration::from_secs(3),
        "closed after {closed_after:?}"
    );
    assert_eq!(w.up.count(), before, "nothing reached the upstream");

    // From a peer that is not a trusted proxy, even a valid header is refused.
    let w = behind(|c| {
        c.set("server.proxy_protocol", true);
        trust(c, &["10.0.0.0/8"]);
    })
    .await;
    let got = closed_within(
        TcpStream::connect(w.gw.addr).await.unwrap(),
        &[v1("198.51.100.7").as_slice(), PING].concat(),
        Duration::from_secs(4),
    )
    .await;
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    assert_eq!(w.up.count(), 0);
    // Logged (the log is read from the process's stderr: give it a moment).
    let logged = Instant::now();
    while !w.gw.log_text().contains("PROXY protocol headers") {
        assert!(
            logged.elapsed() < Duration::from_secs(5),
            "the refusal was not logged:\n{}",
            w.gw.log_text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn behind_the_proxy_protocol_tls_follows_the_header() {
    let w = behind(|c| {
        c.set("server.insecure_http", false);
        c.set("server.tls.self_signed", true);
        c.set("server.proxy_protocol", true);
        trust(c, &["127.0.0.1"]);
    })
    .await;
    let mut tcp = TcpStream::connect(w.gw.addr).await.unwrap();
    tcp.write_all(&v2(Some("198.51.100.12".parse().unwrap())))
        .await
        .unwrap();
    let connector = tls_connector(
        rustls::crypto::aws_lc_rs::default_provider(),
        b"http/1.1",
        Default::default(),
    );
    let tls = connector
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .unwrap();
    let res = RawResponse::parse(&exchange(tls, PING).await);
    assert_eq!(res.status, 200);
    let seen = w.up.last();
    assert_eq!(seen.headers["x-forwarded-for"], "198.51.100.12");
    assert_eq!(seen.headers["x-forwarded-proto"], "https");
}

#[tokio::test]
async fn a_proxy_header_that_names_no_client_leaves_the_forwarded_for_untrusted() {
    let w = behind_a_local_proxy().await;
    let with_xff = b"GET /public/ping HTTP/1.1\r\nHost: gw\r\nX-Forwarded-For: 6.6.6.6\r\nConnection: close\r\n\r\n";
    // v2 UNSPEC and UNIX families, with the PROXY command.
    let mut unspec = v2(None);
    unspec[12] = 0x21;
    let mut unix = b"\r\n\r\n\0\r\nQUIT\n\x21\x31".to_vec();
    unix.extend(216u16.to_be_bytes());
    unix.extend([0u8; 216]);
    for (header, what) in [
        (v2(None), "v2 LOCAL"),
        (b"PROXY UNKNOWN\r\n".to_vec(), "v1 UNKNOWN"),
        (
            b"PROXY UNKNOWN 198.51.100.7 127.0.0.1 1 2\r\n".to_vec(),
            "v1 UNKNOWN with addresses",
        ),
        (unspec, "v2 UNSPEC"),
        (unix, "v2 UNIX"),
    ] {
        let res = proxied(w.gw.addr, &header, with_xff).await;
        assert_eq!(res.status, 200, "{what}: {}", res.body);
        // The balancer's own connection: its address, and the client's
        // field not believed.
        assert_eq!(forwarded_for(&w), "127.0.0.1", "{what}");
    }
}

/// Malformed and truncated PROXY v2 headers end to end: each connection is
/// closed without an answer within a bound, and nothing reaches the upstream.
#[tokio::test]
async fn a_malformed_or_truncated_proxy_v2_header_is_closed_without_an_answer() {
    let w = behind_a_local_proxy().await;
    let good = v2(Some("198.51.100.9".parse().unwrap()));
    // Version 3 in the version/command byte.
    let mut bad_version = good.clone();
    bad_version[12] = 0x31;
    // TCP over IPv4 whose address block is shorter than two addresses and ports.
    let mut short_block = good[..14].to_vec();
    short_block.extend(4u16.to_be_bytes());
    short_block.extend([198, 51, 100, 9]);
    // The fixed part only: the declared 12 address bytes never come.
    let truncated = good[..16].to_vec();
    let limit = Duration::from_secs(4);
    for (what, bytes) in [
        ("a bad version", [bad_version.as_slice(), PING].concat()),
        (
            "a short address block",
            [short_block.as_slice(), PING].concat(),
        ),
        ("a truncated header", truncated),
    ] {
        let got = closed_within(TcpStream::connect(w.gw.addr).await.unwrap(), &bytes, limit).await;
        assert!(got.is_empty(), "{what}: {}", String::from_utf8_lossy(&got));
    }
    assert_eq!(w.up.count(), 0, "a request reached the upstream");
    // A good header on the same listener still works.
    let res = proxied(w.gw.addr, &good, PING).await;
    assert_eq!(res.status, 200);
}
