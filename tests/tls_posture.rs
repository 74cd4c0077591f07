//! TLS posture: only TLS 1.2/1.3 with strong (AEAD, forward-secret) suites.
//! Hand-built ClientHellos offering only TLS 1.0/1.1, or only weak suites,
//! get a fatal alert and no ServerHello; real clients on 1.2 and 1.3 get in;
//! `run` refuses a key that does not match its certificate.
mod common;

use common::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A gateway on TLS with a PEM pair written to its temp dir.
async fn tls_gateway() -> (MockUpstream, TestConfig, Gateway) {
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    cfg.tls_files();
    let gw = Gateway::start(&cfg.write());
    (up, cfg, gw)
}

fn u16be(v: usize) -> [u8; 2] {
    [(v >> 8) as u8, v as u8]
}

/// A ClientHello record: `version` in the record and the hello, the given
/// cipher suites, and the extensions a modern client sends (SNI, groups,
/// point formats, signature algorithms) — but no `supported_versions`, so
/// `version` is the highest the client claims to speak.
fn client_hello(version: [u8; 2], suites: &[u16]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&version);
    body.extend_from_slice(&[0x42; 32]); // random
    body.push(0); // session id
    body.extend_from_slice(&u16be(suites.len() * 2));
    for s in suites {
        body.extend_from_slice(&s.to_be_bytes());
    }
    body.extend_from_slice(&[1, 0]); // compression: null
    let mut ext = Vec::new();
    // server_name: localhost
    let name = b"localhost";
    ext.extend_from_slice(&[0x00, 0x00]);
    ext.extend_from_slice(&u16be(name.len() + 5));
    ext.extend_from_slice(&u16be(name.len() + 3));
    ext.push(0);
    ext.extend_from_slice(&u16be(name.len()));
    ext.extend_from_slice(name);
    // supported_groups: x25519, secp256r1
    ext.extend_from_slice(&[0x00, 0x0a, 0x00, 0x06, 0x00, 0x04, 0x00, 0x1d, 0x00, 0x17]);
    // ec_point_formats: uncompressed
    ext.extend_from_slice(&[0x00, 0x0b, 0x00, 0x02, 0x01, 0x00]);
    // signature_algorithms: ecdsa_secp256r1_sha256, rsa_pss_rsae_sha256, rsa_pkcs1_sha256, rsa_pkcs1_sha1
    ext.extend_from_slice(&[
        0x00, 0x0d, 0x00, 0x0a, 0x00, 0x08, 0x04, 0x03, 0x08, 0x04, 0x04, 0x01, 0x02, 0x01,
    ]);
    body.extend_from_slice(&u16be(ext.len()));
    body.extend_from_slice(&ext);
    let mut hs = vec![0x01, 0];
    hs.extend_from_slice(&u16be(body.len()));
    hs.extend_from_slice(&body);
    let mut record = vec![0x16, version[0], version[1]];
    record.extend_from_slice(&u16be(hs.len()));
    record.extend_from_slice(&hs);
    record
}

/// Sends `hello` and returns every byte the server wrote until it closed (5 s at most).
async fn answer_to(addr: std::net::SocketAddr, hello: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(hello).await.unwrap();
    let mut got = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got)).await;
    assert!(closed.is_ok(), "the server kept the connection open");
    got
}

/// The first `n` bytes the server answers `hello` with (5 s at most).
async fn first_bytes(addr: std::net::SocketAddr, hello: &[u8], n: usize) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(hello).await.unwrap();
    let mut got = vec![0u8; n];
    let read = tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut got)).await;
    assert!(matches!(read, Ok(Ok(_))), "short answer: {got:02x?}");
    got
}

/// The answer is exactly one fatal alert record, and no ServerHello.
fn assert_fatal_alert(got: &[u8], what: &str) -> u8 {
    assert!(got.len() >= 7, "{what}: answer {got:02x?}");
    assert_eq!(got[0], 0x15, "{what}: not an alert record: {got:02x?}");
    assert_eq!(got[5], 2, "{what}: alert is not fatal: {got:02x?}");
    assert_eq!(
        got.len(),
        7,
        "{what}: more than one alert came back: {got:02x?}"
    );
    got[6]
}

/// TLS 1.0 and 1.1 suites a 2010s client offered.
const LEGACY_SUITES: [u16; 6] = [0xc013, 0xc014, 0xc009, 0xc00a, 0x002f, 0x0035];

#[tokio::test]
async fn tls_1_0_and_1_1_clients_get_a_protocol_version_alert() {
    let (up, _cfg, gw) = tls_gateway().await;
    for (version, name) in [([3, 1], "TLS 1.0"), ([3, 2], "TLS 1.1"), ([3, 0], "SSL 3")] {
        let got = answer_to(gw.addr, &client_hello(version, &LEGACY_SUITES)).await;
        let alert = assert_fatal_alert(&got, name);
        assert_eq!(
            alert, 70,
            "{name}: expected protocol_version, got alert {alert}"
        );
    }
    assert_eq!(up.count(), 0);
}

#[tokio::test]
async fn tls_1_2_clients_offering_only_weak_suites_get_a_handshake_failure() {
    let (up, _cfg, gw) = tls_gateway().await;
    // RC4, 3DES, NULL, export, anonymous, static-RSA and CBC suites: no AEAD with forward secrecy.
    let weak: [u16; 12] = [
        0x0005, 0x0004, 0x000a, 0x0002, 0x0001, 0x0003, 0x0018, 0x002f, 0x0035, 0x009c, 0xc013,
        0xc027,
    ];
    for suite in weak {
        let got = answer_to(gw.addr, &client_hello([3, 3], &[suite])).await;
        let alert = assert_fatal_alert(&got, &format!("suite {suite:04x}"));
        assert_eq!(alert, 40, "suite {suite:04x}: expected handshake_failure");
    }
    let got = answer_to(gw.addr, &client_hello([3, 3], &weak)).await;
    assert_eq!(assert_fatal_alert(&got, "all weak suites"), 40);
    // Control: the same hello with one strong suite (the certificate is
    // ECDSA P-256: ECDHE_ECDSA_WITH_AES_128_GCM_SHA256) gets a ServerHello.
    let got = first_bytes(gw.addr, &client_hello([3, 3], &[0x0005, 0xc02b]), 80).await;
    assert_eq!(got.first(), Some(&0x16), "no ServerHello: {got:02x?}");
    assert_eq!(got.get(5), Some(&0x02), "not a ServerHello: {got:02x?}");
    // Record header 5, handshake header 4, version 2, random 32, session id 1+32.
    let suite_at = 5 + 4 + 2 + 32 + 1 + usize::from(got[5 + 4 + 2 + 32]);
    assert_eq!(
        &got[suite_at..suite_at + 2],
        &[0xc0, 0x2b],
        "negotiated another suite"
    );
    assert_eq!(up.count(), 0);
}

#[tokio::test]
async fn the_server_picks_aes_128_gcm_over_a_client_that_lists_aes_256_gcm_first() {
    use rustls::crypto::aws_lc_rs::default_provider;
    use rustls::CipherSuite as S;
    let (_up, _cfg, gw) = tls_gateway().await;
    let suite = |stream: &tokio_rustls::client::TlsStream<TcpStream>| {
        stream
            .get_ref()
            .1
            .negotiated_cipher_suite()
            .map(|s| s.suite())
    };
    // TLS 1.3, with ring's client order (OpenSSL's is the same): AES-256-GCM
    // first; its SHA-384 key schedule is the slow one.
    let client = default_provider();
    assert_eq!(client.cipher_suites[0].suite(), S::TLS13_AES_256_GCM_SHA384);
    let (stream, _) = tls_connect(gw.addr, client).await;
    assert_eq!(suite(&stream), Some(S::TLS13_AES_128_GCM_SHA256));
    // A client that offers only ChaCha20 (no AES hardware) still gets it.
    let mut chacha = default_provider();
    chacha
        .cipher_suites
        .retain(|s| s.suite() == S::TLS13_CHACHA20_POLY1305_SHA256);
    let (stream, _) = tls_connect(gw.addr, chacha).await;
    assert_eq!(suite(&stream), Some(S::TLS13_CHACHA20_POLY1305_SHA256));
    // TLS 1.2: ECDHE_ECDSA_WITH_AES_256_GCM_SHA384 offered before _AES_128_.
    let got = first_bytes(gw.addr, &client_hello([3, 3], &[0xc02c, 0xc02b]), 80).await;
    assert_eq!(got.get(5), Some(&0x02), "not a ServerHello: {got:02x?}");
    let suite_at = 5 + 4 + 2 + 32 + 1 + usize::from(got[5 + 4 + 2 + 32]);
    assert_eq!(&got[suite_at..suite_at + 2], &[0xc0, 0x2b]);
}

#[tokio::test]
async fn real_clients_get_in_on_tls_1_2_and_1_3() {
    let (_up, _cfg, gw) = tls_gateway().await;
    for version in [
        reqwest::tls::Version::TLS_1_2,
        reqwest::tls::Version::TLS_1_3,
    ] {
        let client = reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .min_tls_version(version)
            .max_tls_version(version)
            .build()
            .unwrap();
        let res = client
            .get(format!(
                "https://localhost:{}/api/v1/clusters",
                gw.addr.port()
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 401, "{version:?}");
    }
}

#[test]
fn run_refuses_a_key_that_does_not_match_its_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = TestConfig::new("127.0.0.1:9".parse().unwrap());
    let (cert, _) = mpg_gateway::tls::self_signed_pem().unwrap();
    let (_, other_key) = mpg_gateway::tls::self_signed_pem().unwrap();
    let c = dir.path().join("cert.pem");
    let k = dir.path().join("key.pem");
    std::fs::write(&c, cert).unwrap();
    std::fs::write(&k, other_key).unwrap();
    cfg.set("server.insecure_http", false);
    cfg.set("server.tls.cert", c.to_str().unwrap());
    cfg.set("server.tls.key", k.to_str().unwrap());
    let mut child = Command::new(BIN)
        .arg("run")
        .arg("--config")
        .arg(cfg.write())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("run kept going with a mismatched key");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "{err}");
    assert!(err.contains("does not match"), "{err}");
    assert!(
        err.contains("server.tls"),
        "the message names no TOML path: {err}"
    );
    assert!(!err.contains("listening"), "{err}");
}
