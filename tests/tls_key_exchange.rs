//! The key exchange of the gateway's TLS: the hybrid post-quantum
//! `X25519MLKEM768` negotiated with a client that offers it (rustls on
//! aws-lc-rs here, and headless Chromium), in one round trip; classical
//! clients (curl 7.88 and Node on OpenSSL 3.0, a rustls client offering
//! X25519 only) still served in one round trip; the group counted in
//! `mpg_tls_handshakes_total{version,group}` and written in the access log;
//! `[server.tls] key_exchange` narrowing the list, and `check-config`
//! naming an unknown group.
mod common;

use common::scale::metrics;
use common::*;
use rustls::crypto::aws_lc_rs::{default_provider, kx_group};
use rustls::crypto::SupportedKxGroup;
use rustls::HandshakeKind;
use rustls::NamedGroup;
use std::process::Command;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A TLS gateway (PEM files in its temp dir) with the admin listener, and
/// `key_exchange` if given.
async fn tls_gateway(key_exchange: Option<&[&str]>) -> (MockUpstream, TestConfig, Gateway) {
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    cfg.tls_files();
    if let Some(groups) = key_exchange {
        let groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
        cfg.set("server.tls.key_exchange", groups);
    }
    cfg.set("admin.enabled", true);
    cfg.set("admin.listen", "127.0.0.1:0");
    let gw = Gateway::start(&cfg.write());
    (up, cfg, gw)
}

/// A client offering `groups` in that order (a key share for the first).
fn offering(groups: &[&'static dyn SupportedKxGroup]) -> rustls::crypto::CryptoProvider {
    rustls::crypto::CryptoProvider {
        kx_groups: groups.to_vec(),
        ..default_provider()
    }
}

/// One handshake and one request to `/nowhere` (404) over it: the
/// negotiated group and how the handshake went, or the handshake's error.
async fn handshake(
    addr: std::net::SocketAddr,
    provider: rustls::crypto::CryptoProvider,
) -> Result<(NamedGroup, HandshakeKind), std::io::Error> {
    let connector = tls_connector(provider, b"http/1.1", Arc::default());
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut tls = connector
        .connect("localhost".try_into().unwrap(), tcp)
        .await?;
    let (_, session) = tls.get_ref();
    let group = session.negotiated_key_exchange_group().unwrap().name();
    let kind = session.handshake_kind().unwrap();
    tls.write_all(b"GET /nowhere HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await?;
    let mut answer = Vec::new();
    tls.read_to_end(&mut answer).await?;
    assert!(answer.starts_with(b"HTTP/1.1 "), "{answer:?}");
    Ok((group, kind))
}

/// The handshakes counted for `group` (TLS 1.3) on `gw`'s `/metrics`.
async fn counted(gw: &Gateway, group: &str) -> u64 {
    let page = metrics(gw.admin.unwrap()).await;
    let series =
        format!("mpg_tls_handshakes_total{{result=\"ok\",version=\"TLSv1.3\",group=\"{group}\"}} ");
    (page.lines())
        .find_map(|l| l.strip_prefix(series.as_str()))
        .map_or(0, |n| n.trim().parse().unwrap())
}

#[tokio::test]
async fn the_hybrid_group_is_negotiated_when_offered_and_classical_clients_still_connect() {
    let (_up, _cfg, gw) = tls_gateway(None).await;
    // A client that offers the hybrid group first gets it, in one flight.
    let pq = offering(&[kx_group::X25519MLKEM768, kx_group::X25519]);
    let (group, kind) = handshake(gw.addr, pq).await.unwrap();
    assert_eq!(group, NamedGroup::X25519MLKEM768);
    assert_eq!(kind, HandshakeKind::Full);
    // One offering X25519 only: X25519, with no HelloRetryRequest.
    let classical = offering(&[kx_group::X25519, kx_group::SECP256R1]);
    let (group, kind) = handshake(gw.addr, classical).await.unwrap();
    assert_eq!(group, NamedGroup::X25519);
    assert_eq!(kind, HandshakeKind::Full);
    // Offering the hybrid group second (a key share for P-256 first): the
    // server takes the share it was sent rather than ask for another.
    let p256_first = offering(&[kx_group::SECP256R1, kx_group::X25519MLKEM768]);
    let (group, kind) = handshake(gw.addr, p256_first).await.unwrap();
    assert_eq!((group, kind), (NamedGroup::secp256r1, HandshakeKind::Full));
    assert_eq!(counted(&gw, "X25519MLKEM768").await, 1);
    assert_eq!(counted(&gw, "X25519").await, 1);
    assert_eq!(counted(&gw, "secp256r1").await, 1);

    // curl 7.88 and Node (OpenSSL 3.0, no ML-KEM): classical, and served.
    let url = gw.url("/nowhere").replace("http://", "https://");
    let curl = Command::new("curl")
        .args(["-sk", "-o", "/dev/null", "-w", "%{http_code}", &url])
        .output()
        .expect("curl runs");
    assert_eq!(String::from_utf8_lossy(&curl.stdout), "404", "{curl:?}");
    let script = format!(
        "require('https').get('{url}', {{rejectUnauthorized: false}}, r => {{ console.log(r.statusCode); r.resume(); }})"
    );
    let node = Command::new("node")
        .args(["-e", &script])
        .output()
        .expect("node runs");
    assert_eq!(
        String::from_utf8_lossy(&node.stdout).trim(),
        "404",
        "{node:?}"
    );
    assert_eq!(counted(&gw, "X25519").await, 3);
    // The access log names the version and the group of each request's connection.
    let log = gw.log_text();
    let access = (log.lines())
        .filter(|l| l.contains("\"request\"") || l.contains(" request"))
        .filter(|l| l.contains("tls_group"))
        .collect::<Vec<_>>();
    assert!(
        access
            .iter()
            .any(|l| l.contains("X25519MLKEM768") && l.contains("TLSv1.3")),
        "{log}"
    );
    assert!(access.iter().any(|l| l.contains("secp256r1")), "{log}");
}

#[tokio::test]
async fn key_exchange_narrows_the_groups_offered() {
    let (_up, _cfg, gw) = tls_gateway(Some(&["X25519", "secp256r1"])).await;
    // rustls sends an X25519 share beside the hybrid one (the hybrid holds
    // an X25519 key): the server takes it at once.
    let pq = offering(&[kx_group::X25519MLKEM768, kx_group::X25519]);
    let (group, kind) = handshake(gw.addr, pq).await.unwrap();
    assert_eq!((group, kind), (NamedGroup::X25519, HandshakeKind::Full));
    // A client whose only classical group comes without a share is asked for it.
    let pq = offering(&[kx_group::X25519MLKEM768, kx_group::SECP256R1]);
    let (group, kind) = handshake(gw.addr, pq).await.unwrap();
    assert_eq!(group, NamedGroup::secp256r1);
    assert_eq!(kind, HandshakeKind::FullWithHelloRetryRequest);
    let only_pq = offering(&[kx_group::X25519MLKEM768]);
    assert!(handshake(gw.addr, only_pq).await.is_err());
}

#[tokio::test]
async fn check_config_names_an_unknown_or_repeated_group() {
    let up = MockUpstream::start().await;
    for (groups, path, says) in [
        (
            vec!["X25519", "X448"],
            "server.tls.key_exchange[1]",
            "unknown group \"X448\"; the groups: X25519MLKEM768, X25519, secp256r1, secp384r1",
        ),
        (
            vec!["X25519", "x25519"],
            "server.tls.key_exchange[1]",
            "listed twice",
        ),
        (vec![], "server.tls.key_exchange", "at least one"),
    ] {
        let mut cfg = TestConfig::new(up.addr);
        cfg.set("server.insecure_http", false);
        cfg.set("server.tls.self_signed", true);
        let list: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
        cfg.set("server.tls.key_exchange", list);
        let (code, _, err) = cli(&cfg.write(), &["check-config"]);
        assert_eq!(code, 2, "{groups:?}: {err}");
        assert!(err.contains(path), "{groups:?}: {err}");
        assert!(err.contains(says), "{groups:?}: {err}");
    }
}

#[tokio::test]
async fn chromium_negotiates_the_hybrid_group() {
    let (_up, cfg, gw) = tls_gateway(None).await;
    let url = gw.url("/nowhere").replace("http://", "https://");
    let profile = format!(
        "--user-data-dir={}",
        cfg.dir.path().join("chromium").display()
    );
    let before = counted(&gw, "X25519MLKEM768").await;
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--ignore-certificate-errors",
            &profile,
            "--dump-dom",
            &url,
        ])
        .output()
        .expect("chromium runs (apt-get install chromium)");
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("NotFound"),
        "{out:?}"
    );
    assert!(counted(&gw, "X25519MLKEM768").await > before);
}
