//! TLS termination: PEM files and self-signed, HTTP/1.1 and h2 via ALPN.
mod common;

use common::*;

#[tokio::test]
async fn serves_http1_and_h2_over_tls_from_pem_files() {
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    let (cert, key) = mpg_gateway::tls::self_signed_pem().unwrap();
    let c = cfg.dir.path().join("cert.pem");
    let k = cfg.dir.path().join("key.pem");
    std::fs::write(&c, cert).unwrap();
    std::fs::write(&k, key).unwrap();
    cfg.set("server.insecure_http", false);
    cfg.set("server.tls.cert", c.to_str().unwrap());
    cfg.set("server.tls.key", k.to_str().unwrap());
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
